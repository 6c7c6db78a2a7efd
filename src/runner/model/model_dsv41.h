/* runner/model/model_dsv41.h - the DeepSeek-V4.1 part of a loaded model (model_type
 * "deepseek_v41"): the config of DeepSeek's reference inference code (config.json keys are its
 * ModelArgs field names) and the weight views, bound by the reference's module names
 * (embed.weight, layers.<i>.attn.wq_a.weight with its ue8m0 scale layers.<i>.attn.wq_a.scale,
 * layers.<i>.ffn.experts.<e>.w1.weight, layers.<i>.hc_attn_fn, layers.<i>.engram.embed.weight,
 * norm.weight, head.weight, ...). docs/deepseek_v41.md has the math and what differs from V4.
 *
 * Formats (docs/quantization.md): with dtype "fp8" every default Linear is F8_E4M3 with F8_E8M0
 * scales per 32x32 block; with expert_dtype "fp4" the routed experts are packed e2m1 (I8/U8
 * [out][in/2], two values a byte, element 2j in the low nibble) with F8_E8M0 scales per 32 inputs;
 * wo_a, the indexer's weights_proj and wk, the compressor's wkv/wgate, the router, the norms
 * are float (bf16 in the released checkpoint, any float dtype read); the Engram tables are
 * F8_E4M3 rows with F8_E8M0 scales per 32 values. Tensors point into the model's mappings,
 * nothing is copied; the struct is immutable after load, so any number of threads may read it.
 *
 * The DSpark draft stages (mtp.*) are bound by runner/model/dsv41_dspark.c when
 * dspark_block_size > 0. Not bound: the vision tower and its aligner, image delimiters and the
 * routers' bias_vl (read never). */
#ifndef TM_RUNNER_MODEL_MODEL_DSV41_H
#define TM_RUNNER_MODEL_MODEL_DSV41_H

#include <stdint.h>

#include "base/err.h"
#include "runner/model/model_types.h"

#define TM_DSV41_MAX_LAYER 256
#define TM_DSV41_MAX_HC 8
#define TM_DSV41_MAX_ENGRAM 16
#define TM_DSV41_MAX_ROPE 512 /* rope_head_dim limit */

typedef enum tm_dsv41_score {
    TM_DSV41_SCORE_SQRTSOFTPLUS = 0, /* sqrt(softplus(logit)) */
    TM_DSV41_SCORE_SIGMOID,
    TM_DSV41_SCORE_SOFTMAX,
} tm_dsv41_score;

typedef struct tm_dsv41_cfg {
    uint32_t dim, n_layers, n_heads, head_dim, rope_head_dim; /* rope: trailing rope_head_dim */
    uint32_t q_lora_rank, o_groups, o_lora_rank;
    uint32_t vocab_size, max_seq_len, window_size;
    uint32_t n_routed_experts, n_activated_experts, moe_inter_dim;
    uint8_t score_func; /* tm_dsv41_score */
    uint8_t norm_topk_prob;
    uint8_t fp8;        /* dtype "fp8": default Linears are FP8 (else bf16) */
    uint8_t expert_fp4; /* expert_dtype "fp4" (else the experts are stored as the default) */
    float gate_temp, route_scale, swiglu_limit, norm_eps;
    float rope_theta, compress_rope_theta, rope_factor, beta_fast, beta_slow;
    uint32_t original_seq_len; /* > 0: YaRN on the compressed layers' rope */
    uint32_t index_n_heads, index_head_dim, index_topk;
    int32_t candidate_source_layer; /* < 0: no candidate selection */
    uint32_t candidate_topk_blocks, candidate_block_size;
    uint32_t hc_mult, hc_sinkhorn_iters;
    float hc_eps;
    /* Engram */
    uint32_t n_engram; /* len(engram_layer_ids) */
    uint32_t engram_layer_ids[TM_DSV41_MAX_ENGRAM];
    uint64_t engram_num_embeddings[TM_DSV41_MAX_ENGRAM];
    uint32_t engram_max_ngram_size, engram_n_heads, engram_head_dim, engram_pad_id;
    uint64_t engram_vocab_size, engram_compressed_vocab_size;
    /* accepted, not run */
    uint32_t n_mtp_layers, dspark_block_size, vision_n_layers;
    /* DSpark drafter (dspark_block_size > 0: n_mtp_layers stages under mtp.*, bound by
     * runner/model/dsv41_dspark.c and run only by speculative decoding) */
    uint32_t dspark_noise_token_id, dspark_markov_rank;
    uint32_t dspark_n_routed_experts, dspark_n_activated_experts; /* 0: the backbone's */
    uint32_t n_dspark_target;
    uint32_t dspark_target_layer_ids[TM_DSV41_MAX_LAYER]; /* backbone layers, in order */
    /* per layer (derived) */
    uint8_t ratio[TM_DSV41_MAX_LAYER];        /* compress_ratios[i]: 0 sliding only, r compressed */
    uint8_t kv_source[TM_DSV41_MAX_LAYER];    /* in kv_source_layers: compresses its own KV */
    uint8_t index_source[TM_DSV41_MAX_LAYER]; /* in index_source_layers: runs an indexer */
    int16_t kv_from[TM_DSV41_MAX_LAYER];  /* compressed layers: the kv source whose cache it reads
                                             (the last at or before it), else -1 */
    int16_t idx_from[TM_DSV41_MAX_LAYER]; /* compressed layers: the index source whose picks it
                                             takes (the last at or before it), else -1 */
    int16_t
        key_from[TM_DSV41_MAX_LAYER];        /* index sources: the layer owning the index keys they
                                                read (the last kv+index source at or before), else -1 */
    int16_t engram_slot[TM_DSV41_MAX_LAYER]; /* index into engram_layer_ids, or -1 */
    float inv_freq_main[TM_DSV41_MAX_ROPE / 2]; /* rope_theta, no YaRN (ratio-0 layers) */
    float
        inv_freq_comp[TM_DSV41_MAX_ROPE / 2]; /* compress_rope_theta, YaRN when original_seq_len */
} tm_dsv41_cfg;

typedef struct tm_dsv41_layer {
    tm_tensor hc_attn_fn, hc_attn_base, hc_attn_scale; /* [(2+N)N][N*D], [(2+N)N], [3] */
    tm_tensor hc_ffn_fn, hc_ffn_base, hc_ffn_scale;
    tm_tensor attn_norm, ffn_norm; /* [D] */
    /* attention; H heads of hd, rd rope, g groups */
    tm_tensor attn_sink;       /* [H] */
    tm_tensor wq_a, q_norm;    /* [q_lora][D], [q_lora] */
    tm_tensor wq_b;            /* [H*hd][q_lora] */
    tm_tensor wkv, kv_norm;    /* [hd][D], [hd] */
    tm_tensor wo_a;            /* [g*o_lora][H*hd/g] */
    tm_tensor wo_b;            /* [D][g*o_lora] */
    tm_tensor c_wkv, c_wgate;  /* kv sources: compressor [hd][D] (wgate when ratio > 1) */
    tm_tensor c_norm;          /* [hd] */
    tm_tensor i_wq_b, i_wproj; /* index sources: [Hi*di][q_lora], [Hi][D] */
    tm_tensor i_wk, i_k_norm;  /* kv + index sources: [di][hd], [di] */
    /* MoE */
    tm_tensor gate_w, gate_bias;   /* [E][D], [E] */
    tm_tensor *experts;            /* owned: [E][3] w1 [I][D], w3 [I][D], w2 [D][I] */
    tm_tensor sh_w1, sh_w3, sh_w2; /* shared expert */
    /* Engram (engram layers) */
    tm_tensor e_table;  /* [rows][engram_head_dim] FP8 with [rows][hd/32] scales */
    tm_tensor e_wkv;    /* [(N+1)*D][n_cols*engram_head_dim] */
    tm_tensor e_q, e_k; /* [N][D] */
} tm_dsv41_layer;

struct tm_dsv41_dspark;

typedef struct tm_dsv41 {
    tm_dsv41_cfg cfg;
    tm_dsv41_layer *layers;         /* owned, n_layers */
    struct tm_dsv41_dspark *dspark; /* owned: the DSpark stages (below), or NULL */
} tm_dsv41;

/* Parse config.json (root, a json_t) and generation_config.json (gen, may be NULL) into c (the
 * shared fields: n_layer, n_embd, n_ff = moe_inter_dim, n_head, n_kv_head = 1, head_dim, n_vocab,
 * n_ctx = max_seq_len, rms_eps = norm_eps, rope_theta, bos/eos when given) and a new tm_dsv41 in
 * *out (owned by the caller; tm_dsv41_destroy). Every key must be a ModelArgs field (or
 * architectures, model_type, torch_dtype, transformers_version, bos/eos_token_id); unknown
 * keys and unsupported values are refused naming the field. Errors: TM_E_PARSE (missing,
 * malformed or inconsistent fields), TM_E_INVAL (well-formed but unsupported), TM_E_NOMEM. */
tm_rc tm_dsv41_config_parse(void *root, void *gen, tm_model_cfg *c, tm_dsv41 **out, tm_err *err);
/* Bind every weight of m (embd, out_norm, lm_head and the tm_dsv41 tensors) from st, each shape
 * and format checked. TM_E_PARSE names the first missing or misshaped tensor or scale. */
struct tm_st_set;
tm_rc tm_dsv41_bind(tm_model *m, const struct tm_st_set *st, tm_err *err);
void tm_dsv41_destroy(tm_dsv41 *d); /* NULL is a no-op */

/* The model's DeepSeek-V4.1 part, or NULL for other architectures. */
static inline const tm_dsv41 *tm_model_dsv41(const tm_model *m) {
    return m->cfg.arch == TM_ARCH_DEEPSEEK_V41 ? (const tm_dsv41 *)m->arch_w : NULL;
}

/* ---- DSpark stages (implemented in runner/model/dsv41_dspark.c) ----
 * the DeepSeek-V4.1 DSpark drafter's weights and config (the
 * reference's DSparkBlock stages, stored under mtp.<k>.*): n_mtp_layers Blocks (hyper-connections,
 * a sliding-window attention with compress ratio 0, an MoE with dspark_n_routed_experts /
 * dspark_n_activated_experts when set), stage 0's main_proj [dim][dim * n_target] + main_norm,
 * the last stage's norm, Markov head (embed [vocab][rank], head [vocab][rank]) and confidence
 * head (proj [1][dim + rank]); the token embedding and the LM head are the backbone's (the
 * reference ties them). docs/speculative.md "DSpark" has the math. Immutable after load. */
typedef struct tm_dsv41_dspark {
    uint32_t n_stage, block_size, n_target, rank, n_experts, n_active, noise_id;
    tm_dsv41_layer *stages; /* owned, [n_stage]: only the fields a ratio-0, non-Engram layer has */
    tm_tensor main_proj, main_norm;      /* [dim][dim * n_target] (FP8 when dtype fp8), [dim] */
    tm_tensor norm;                      /* [dim] */
    tm_tensor markov_embed, markov_head; /* [vocab][rank] each */
    tm_tensor conf_proj;                 /* [1][dim + rank] */
} tm_dsv41_dspark;

/* Read the DSpark fields of config.json (reference names: root is the ModelArgs object) into d
 * after the rest of it: dspark_target_layer_ids, and with dspark_block_size > 0 the checks that
 * the stages exist (n_mtp_layers >= 1), have compress_ratios entries of 0, name backbone target
 * layers and a rank >= 1, each refusal naming the field (TM_E_PARSE / TM_E_INVAL). */
tm_rc tm_dsv41_dspark_cfg(void *root, tm_dsv41_cfg *d, tm_err *err);
/* Bind the stages mtp.0 .. mtp.<n_mtp_layers - 1> from st (d->dspark_block_size > 0); *out owned
 * by the caller (tm_dsv41_dspark_destroy). TM_E_PARSE names a missing or misshaped tensor. */
struct tm_st_set;
tm_rc tm_dsv41_dspark_bind(const struct tm_st_set *st, const tm_dsv41_cfg *d, tm_dsv41_dspark **out,
                           tm_err *err);
void tm_dsv41_dspark_destroy(tm_dsv41_dspark *p); /* NULL is a no-op */

#endif /* TM_RUNNER_MODEL_MODEL_DSV41_H */
