/* runner/model/model_dsv4.h - the DeepSeek-V4 part of a loaded model
 * (DeepseekV4ForCausalLM, as Hugging Face transformers 5.17 defines it): the
 * architecture-specific config fields and the weight views. tm_model_load
 * (runner/model/model.h) calls these when config.json names the architecture; the
 * result hangs off tm_model.arch_w. Tensors point into the model's mappings
 * (f32, f16 or bf16; tid2eid also f32/bf16/f16 holding small integers), nothing
 * is copied, and the struct is immutable after load, so any number of threads
 * may read it.
 *
 * Weight names are the transformers ones
 * (model.layers.<i>.self_attn.q_a_proj.weight, ...), as save_pretrained writes
 * them and tools/mkmodel makes them. Not handled: the original DeepSeek
 * checkpoint names (layers.<i>.attn.wq_a.weight, ...) that transformers renames
 * on load,
 * int64 tid2eid tensors (the safetensors reader takes float dtypes only), and
 * more than one MTP layer.
 *
 * The MTP (multi-token prediction) layer, when the checkpoint has one: DeepSeek's
 * MTPBlock (its inference/model.py; vLLM's deepseek_v4_mtp.py loads it the same
 * way): a decoder block like the main ones plus enorm, hnorm, e_proj, h_proj,
 * its own final norm and hyper-connection head, sharing the embedding and the
 * LM head. Its tensors are read under the prefix model.layers.<n_layer>. (where
 * vLLM remaps DeepSeek's mtp.0.) or mtp.0., the block with the transformers
 * names of a main layer (self_attn.q_a_proj.weight, mlp.experts.gate_up_proj,
 * attn_hc.fn, ...) and the extras with DeepSeek's: enorm.weight, hnorm.weight,
 * e_proj.weight, h_proj.weight, norm.weight (or shared_head.norm.weight),
 * hc_head_fn, hc_head_base, hc_head_scale. Its layer kinds: entry n_layer of
 * layer_types (or of compress_ratios, as DeepSeek's config lists it) and of
 * mlp_layer_types when given, else sliding-window attention and top-k MoE (the
 * released checkpoints' compress_ratios end with 0 for it). A checkpoint
 * without the tensors loads without MTP (transformers' save_pretrained drops
 * them). */
#ifndef TM_RUNNER_MODEL_MODEL_DSV4_H
#define TM_RUNNER_MODEL_MODEL_DSV4_H

#include <stdint.h>

#include "base/err.h"
#include "runner/model/model_types.h"

#define TM_DSV4_MAX_LAYER 256
#define TM_DSV4_MAX_HC 8

typedef enum tm_dsv4_attn {
    TM_DSV4_ATTN_SLIDING = 0, /* "sliding_attention": the sliding window only */
    TM_DSV4_ATTN_CSA,         /* "compressed_sparse_attention": + ratio-4 entries, top-k
                                 indexer */
    TM_DSV4_ATTN_HCA,         /* "heavily_compressed_attention": + ratio-128 entries, all
                                 seen */
} tm_dsv4_attn;

typedef enum tm_dsv4_score {
    TM_DSV4_SCORE_SQRTSOFTPLUS = 0, /* sqrt(softplus(logit)) */
    TM_DSV4_SCORE_SIGMOID,
    TM_DSV4_SCORE_SOFTMAX,
} tm_dsv4_score;

/* The RoPE of one of the two settings ("main": sliding layers; "compress":
 * CSA/HCA layers, their compressors and the indexer). inv_freq is computed once
 * at load. */
typedef struct tm_dsv4_rope {
    float theta;
    int yarn;     /* rope_type "yarn" */
    float factor; /* yarn factor */
    float beta_fast, beta_slow;
    uint32_t orig_ctx;   /* yarn original_max_position_embeddings */
    float attn_factor;   /* cos/sin multiplier: 1.0, or yarn attention_factor if
                            given */
    float inv_freq[512]; /* [rope_dim / 2] */
} tm_dsv4_rope;

typedef struct tm_dsv4_cfg {
    uint32_t q_lora_rank; /* q_a_proj width */
    uint32_t rope_dim;    /* qk_rope_head_dim = head_dim * partial_rotary_factor; the
                           * trailing rope_dim channels of each head are rotated
                           * (interleaved pairs) */
    uint32_t o_groups, o_lora_rank;
    uint32_t n_expert, n_expert_used; /* n_routed_experts, num_experts_per_tok */
    uint32_t n_ff_expert;             /* moe_intermediate_size (routed and the shared expert) */
    tm_dsv4_score scoring;
    float routed_scale;            /* routed_scaling_factor */
    float swiglu_limit;            /* gate <= limit, |up| <= limit before silu(gate)*up */
    uint32_t window;               /* sliding_window: a token sees itself and window-1 before it */
    uint32_t ratio_csa, ratio_hca; /* compress_rates */
    uint32_t index_n_heads, index_head_dim, index_topk;
    uint32_t hc_mult, hc_iters; /* hyper-connection streams, Sinkhorn iterations */
    float hc_eps;
    tm_dsv4_rope rope_main, rope_compress;
    uint8_t attn[TM_DSV4_MAX_LAYER + 1]; /* tm_dsv4_attn per layer (layer_types); [n_layer]: the
                                            MTP layer's */
    uint8_t hash[TM_DSV4_MAX_LAYER + 1]; /* 1: hash_moe, 0: moe (mlp_layer_types); [n_layer]:
                                            the MTP layer's */
} tm_dsv4_cfg;

typedef struct tm_dsv4_layer {
    /* hyper-connections around attention (attn_hc) and the MoE (ffn_hc); N =
     * hc_mult, D = n_embd */
    tm_tensor attn_hc_fn, attn_hc_base, attn_hc_scale; /* [(2+N)*N][N*D], [(2+N)*N], [3] */
    tm_tensor ffn_hc_fn, ffn_hc_base, ffn_hc_scale;
    tm_tensor attn_norm, ffn_norm; /* [D] */
    /* attention; H = n_head, hd = head_dim */
    tm_tensor q_a, q_a_norm, q_b; /* [q_lora][D], [q_lora], [H*hd][q_lora] */
    tm_tensor kv, kv_norm;        /* [hd][D], [hd] */
    tm_tensor o_a;                /* [g*o_lora][H*hd/g] */
    tm_tensor o_b;                /* [D][g*o_lora] */
    tm_tensor sinks;              /* [H] */
    /* compressor (CSA: cw = 2*hd, HCA: cw = hd), data NULL for sliding layers */
    tm_tensor c_kv, c_gate; /* [cw][D] */
    tm_tensor c_bias;       /* [ratio][cw] position_bias */
    tm_tensor c_norm;       /* [hd] */
    /* indexer (CSA only); Hi = index_n_heads, di = index_head_dim */
    tm_tensor i_kv, i_gate; /* [2*di][D] */
    tm_tensor i_bias;       /* [ratio_csa][2*di] */
    tm_tensor i_norm;       /* [di] */
    tm_tensor i_qb;         /* [Hi*di][q_lora] */
    tm_tensor i_w;          /* [Hi][D] scorer.weights_proj */
    /* MoE; E = n_expert, I = n_ff_expert, k = n_expert_used */
    tm_tensor router;                  /* [E][D] mlp.gate.weight */
    tm_tensor router_bias;             /* [E] e_score_correction_bias (moe) */
    tm_tensor tid2eid;                 /* [n_vocab][k] (hash_moe) */
    tm_tensor gate_up;                 /* [E][2*I][D] */
    tm_tensor down;                    /* [E][D][I] */
    tm_tensor sh_gate, sh_up, sh_down; /* [I][D], [I][D], [D][I] */
} tm_dsv4_layer;

/* The MTP layer's own tensors besides its block (layers[n_layer]); D = n_embd, N = hc_mult. */
typedef struct tm_dsv4_mtp {
    tm_tensor enorm, hnorm;                            /* [D] */
    tm_tensor e_proj, h_proj;                          /* [D][D], plain or quantized */
    tm_tensor norm;                                    /* [D] before the shared LM head */
    tm_tensor hc_head_fn, hc_head_base, hc_head_scale; /* [N][N*D], [N], [1] */
} tm_dsv4_mtp;

typedef struct tm_dsv4 {
    tm_dsv4_cfg cfg;
    tm_dsv4_layer *layers; /* owned, n_layer + n_mtp: layers[n_layer] is the MTP block */
    uint32_t n_mtp;        /* 1 when the checkpoint has the MTP layer, else 0 */
    tm_dsv4_mtp mtp;       /* valid when n_mtp */
    tm_tensor hc_head_fn, hc_head_base, hc_head_scale; /* [N][N*D], [N], [1] */
} tm_dsv4;

/* Parse the DeepSeek-V4 fields of config.json (root) and generation_config.json
 * (gen, may be NULL) into c (the shared fields: n_layer, n_embd, n_ff =
 * moe_intermediate_size, n_head, n_kv_head = 1, head_dim, n_vocab, n_ctx,
 * rms_eps, rope_theta, tie_embd, bos/eos) and a new tm_dsv4 in *out (owned by
 * the caller; free with tm_dsv4_destroy). Accepts the transformers 5.17 field
 * names and the legacy ones it folds in (compress_ratios,
 * compress_rate_csa/hca, num_hash_layers, qk_rope_head_dim, rope_scaling).
 * Errors: TM_E_PARSE (missing or inconsistent fields), TM_E_INVAL (valid but
 * unsupported: num_key_value_heads != 1, hidden_act other than silu, rope types
 * other than default/yarn), TM_E_NOMEM. */
tm_rc tm_dsv4_config_parse(void *root, void *gen, tm_model_cfg *c, tm_dsv4 **out, tm_err *err);
/* Bind every weight of m (embd, out_norm, lm_head and m->arch_w's tensors) from
 * st, checking each shape against the config. The dense linears (attention,
 * compressor, indexer, shared expert) may be FP8 as quantization_config says,
 * the routed experts as expert_dtype says (MXFP4: packed e2m1 I8 [E][out][in/2]
 * with F8_E8M0 <name>_scale_inv [E][out][in/32]; docs/quantization.md). TM_E_PARSE
 * names the first missing or misshaped tensor or scale. */
struct tm_st_set;
tm_rc tm_dsv4_bind(tm_model *m, const struct tm_st_set *st, tm_err *err);
void tm_dsv4_destroy(tm_dsv4 *d); /* NULL is a no-op */

/* The model's DeepSeek-V4 part, or NULL for other architectures. */
static inline const tm_dsv4 *tm_model_dsv4(const tm_model *m) {
    return m->cfg.arch == TM_ARCH_DEEPSEEK_V4 ? (const tm_dsv4 *)m->arch_w : NULL;
}

#endif /* TM_RUNNER_MODEL_MODEL_DSV4_H */
