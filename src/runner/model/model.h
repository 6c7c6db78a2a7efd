/* runner/model/model.h - a loaded Hugging Face model folder: the parsed config.json and the weights,
 * memory-mapped from *.safetensors (one file or shards listed in model.safetensors.index.json).
 * Tensors point into the mappings; nothing is copied. Immutable after load, so any number of
 * threads may read it. Supports the Llama family (LlamaForCausalLM, Qwen2ForCausalLM,
 * MistralForCausalLM) and DeepseekV4ForCausalLM (its config and weights: runner/model/model_dsv4.h). */
#ifndef TM_RUNNER_MODEL_MODEL_H
#define TM_RUNNER_MODEL_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "runner/model/quant.h"
#include "runner/model/tensor.h"

typedef enum tm_arch {
    TM_ARCH_LLAMA = 0,
    TM_ARCH_QWEN2,
    TM_ARCH_MISTRAL,
    TM_ARCH_DEEPSEEK_V4, /* DeepseekV4ForCausalLM: config and weights in runner/model/model_dsv4.h */
} tm_arch;

typedef enum tm_rope_type {
    TM_ROPE_DEFAULT = 0,
    TM_ROPE_LLAMA3, /* rope_scaling.rope_type == "llama3" */
} tm_rope_type;

#define TM_MODEL_MAX_EOS 8

typedef struct tm_model_cfg {
    tm_arch arch;
    uint32_t n_layer;      /* num_hidden_layers */
    uint32_t n_embd;       /* hidden_size */
    uint32_t n_ff;         /* intermediate_size */
    uint32_t n_head;       /* num_attention_heads */
    uint32_t n_kv_head;    /* num_key_value_heads (n_head divides by it) */
    uint32_t head_dim;     /* head_dim, default n_embd / n_head */
    uint32_t n_vocab;      /* vocab_size */
    uint32_t n_ctx;        /* max_position_embeddings */
    float rms_eps;         /* rms_norm_eps */
    float rope_theta;
    tm_rope_type rope_type;
    float rope_factor;             /* llama3: factor */
    float rope_low_freq_factor;    /* llama3 */
    float rope_high_freq_factor;   /* llama3 */
    uint32_t rope_orig_ctx;        /* llama3: original_max_position_embeddings */
    int tie_embd;          /* tie_word_embeddings: lm_head is embed_tokens */
    int qkv_bias;          /* Qwen2: q/k/v projections carry a bias */
    int32_t bos_id;        /* -1 if none */
    int32_t eos_ids[TM_MODEL_MAX_EOS]; /* from config.json and generation_config.json */
    uint32_t n_eos;
    uint32_t sliding_window; /* 0: full attention; else each token attends to at most this many
                              * (Mistral v0.1 sliding_window, when below n_ctx). Engines without it
                              * must keep sequences within it */
    tm_quant_cfg quant;    /* quantization_config (runner/model/quant.h); all zero for bf16 models */
} tm_model_cfg;

/* The seven linears (q/k/v/o/gate/up/down) are plain or quantized views (tensor.h); the rest is
 * always plain. */
typedef struct tm_layer_w {
    tm_tensor attn_norm;   /* [n_embd] input_layernorm */
    tm_tensor wq;          /* [n_head*head_dim][n_embd] */
    tm_tensor wk;          /* [n_kv_head*head_dim][n_embd] */
    tm_tensor wv;          /* [n_kv_head*head_dim][n_embd] */
    tm_tensor bq, bk, bv;  /* biases (Qwen2), data NULL otherwise */
    tm_tensor wo;          /* [n_embd][n_head*head_dim] */
    tm_tensor ffn_norm;    /* [n_embd] post_attention_layernorm */
    tm_tensor w_gate;      /* [n_ff][n_embd] */
    tm_tensor w_up;        /* [n_ff][n_embd] */
    tm_tensor w_down;      /* [n_embd][n_ff] */
} tm_layer_w;

typedef struct tm_model {
    char *dir;             /* owned; the model folder */
    tm_model_cfg cfg;
    tm_tensor embd;        /* [n_vocab][n_embd] model.embed_tokens.weight */
    tm_tensor out_norm;    /* [n_embd] model.norm.weight */
    tm_tensor lm_head;     /* [n_vocab][n_embd]; equals embd when tied */
    tm_layer_w *layers;    /* owned array of n_layer (unused for DeepSeek-V4) */
    void *impl;            /* owned mappings */
    void *arch_w;          /* owned arch-specific config + weights: tm_dsv4 (runner/model/model_dsv4.h)
                            * for TM_ARCH_DEEPSEEK_V4, NULL otherwise */
} tm_model;

/* Load dir/config.json (+ generation_config.json if present) and map the safetensors. Every
 * header field is validated before use; a truncated or inconsistent file gives TM_E_PARSE with a
 * message naming the file and the rule. On success *out owns the model. Config: architectures[0]
 * (model_type if absent); rope_scaling or rope_parameters of type default or llama3; eos ids of
 * both files merged without repeats; every tensor's shape checked against the config (extra
 * tensors are ignored, except layers beyond num_hidden_layers). Errors: TM_E_PARSE (malformed or
 * inconsistent files, missing fields, values out of range, wrong shapes), TM_E_INVAL (valid but
 * unsupported: other architectures or rope types, attention_bias/mlp_bias on Llama, Qwen2
 * sliding windows, hidden_act other than silu), TM_E_IO, TM_E_NOMEM. Messages start with
 * "loading model <dir>: ". impl is the tm_st_set (runner/model/safetensors.h) holding the mappings. */
tm_rc tm_model_load(const char *dir, tm_model **out, tm_err *err);
void tm_model_destroy(tm_model *m); /* NULL is a no-op */
/* "llama", "qwen2", "mistral" or "deepseek_v4". */
const char *tm_model_arch_name(const tm_model *m);

/* Check that every Llama-family weight of m is present, of a float dtype (f32, f16, bf16) and of
 * the shape its cfg implies (for models built in memory too, which skip tm_model_load's checks).
 * Quantized weights are refused: this is the check of engines that read weights as plain
 * arrays. who starts the message ("cpu engine"). TM_E_INVAL naming the layer and tensor. */
tm_rc tm_model_check_weights(const tm_model *m, const char *who, tm_err *err);
/* The same, but the seven linears of each layer may also be quantized views (their scales
 * present, their scheme known): the check of engines that read weight rows through
 * tm_tensor_row_f32. */
tm_rc tm_model_check_weights_quant(const tm_model *m, const char *who, tm_err *err);
/* 1 if any weight of m is quantized (Llama family and DeepSeek-V4), else 0. */
int tm_model_is_quantized(const tm_model *m);

/* The RoPE inverse frequencies of a Llama-family cfg, which both engines use:
 * inv_freq[i] = 1/theta^(2i/d) for i < d/2 (d = cfg->head_dim), with the llama3 rescaling when
 * cfg->rope_type says so. fp32 math in the order HF uses. inv_freq holds head_dim / 2 floats.
 * Pure; any thread. */
void tm_model_rope_inv_freq(const tm_model_cfg *cfg, float *inv_freq);

#endif /* TM_RUNNER_MODEL_MODEL_H */
