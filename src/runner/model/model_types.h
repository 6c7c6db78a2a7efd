/* runner/model/model_types.h - the types of a loaded model: architecture, config, Llama-family
 * layer weights and the tm_model that holds them. Types only (the loader is runner/model/model.h),
 * so that per-architecture parts (runner/model/model_dsv4.c) can fill a tm_model without depending
 * on the loader that calls them. */
#ifndef TM_RUNNER_MODEL_MODEL_TYPES_H
#define TM_RUNNER_MODEL_MODEL_TYPES_H

#include <stddef.h>
#include <stdint.h>

#include "runner/model/quant.h"
#include "runner/model/tensor.h"

/* Every architecture, in enum order: X(enum suffix, model_type, its tm_arch_ops in
 * runner/model/arch.h). Adding one is a line here and its hooks (docs/ARCHITECTURE.md section 6);
 * the registry (runner/model/arch.c) and the enum below follow from this list. */
#define TM_ARCH_LIST(X)                                                                            \
    X(LLAMA, "llama", tm_arch_llama)                                                               \
    X(QWEN2, "qwen2", tm_arch_qwen2)                                                               \
    X(MISTRAL, "mistral", tm_arch_mistral)                                                         \
    X(DEEPSEEK_V4, "deepseek_v4", tm_arch_dsv4)                                                    \
    X(DEEPSEEK_V41, "deepseek_v41", tm_arch_dsv41)

typedef enum tm_arch {
#define TM_ARCH_ENUM(e, name, ops) TM_ARCH_##e,
    TM_ARCH_LIST(TM_ARCH_ENUM)
#undef TM_ARCH_ENUM
        TM_ARCH_COUNT /* not an architecture: the number of them */
} tm_arch;

typedef enum tm_rope_type {
    TM_ROPE_DEFAULT = 0,
    TM_ROPE_LLAMA3, /* rope_scaling.rope_type == "llama3" */
} tm_rope_type;

#define TM_MODEL_MAX_EOS 8

typedef struct tm_model_cfg {
    tm_arch arch;
    uint32_t n_layer;   /* num_hidden_layers */
    uint32_t n_embd;    /* hidden_size */
    uint32_t n_ff;      /* intermediate_size */
    uint32_t n_head;    /* num_attention_heads */
    uint32_t n_kv_head; /* num_key_value_heads (n_head divides by it) */
    uint32_t head_dim;  /* head_dim, default n_embd / n_head */
    uint32_t n_vocab;   /* vocab_size */
    uint32_t n_ctx;     /* max_position_embeddings */
    float rms_eps;      /* rms_norm_eps */
    float rope_theta;
    tm_rope_type rope_type;
    float rope_factor;                 /* llama3: factor */
    float rope_low_freq_factor;        /* llama3 */
    float rope_high_freq_factor;       /* llama3 */
    uint32_t rope_orig_ctx;            /* llama3: original_max_position_embeddings */
    int tie_embd;                      /* tie_word_embeddings: lm_head is embed_tokens */
    int qkv_bias;                      /* Qwen2: q/k/v projections carry a bias */
    int32_t bos_id;                    /* -1 if none */
    int32_t eos_ids[TM_MODEL_MAX_EOS]; /* from config.json and generation_config.json */
    uint32_t n_eos;
    uint32_t sliding_window; /* 0: full attention; else each token attends to at most this many
                              * (Mistral v0.1 sliding_window, when below n_ctx). Engines without it
                              * must keep sequences within it */
    tm_quant_cfg quant; /* quantization_config (runner/model/quant.h); all zero for bf16 models */
} tm_model_cfg;

/* The seven linears (q/k/v/o/gate/up/down) are plain or quantized views (tensor.h); the rest is
 * always plain. */
typedef struct tm_layer_w {
    tm_tensor attn_norm;  /* [n_embd] input_layernorm */
    tm_tensor wq;         /* [n_head*head_dim][n_embd] */
    tm_tensor wk;         /* [n_kv_head*head_dim][n_embd] */
    tm_tensor wv;         /* [n_kv_head*head_dim][n_embd] */
    tm_tensor bq, bk, bv; /* biases (Qwen2), data NULL otherwise */
    tm_tensor wo;         /* [n_embd][n_head*head_dim] */
    tm_tensor ffn_norm;   /* [n_embd] post_attention_layernorm */
    tm_tensor w_gate;     /* [n_ff][n_embd] */
    tm_tensor w_up;       /* [n_ff][n_embd] */
    tm_tensor w_down;     /* [n_embd][n_ff] */
} tm_layer_w;

typedef struct tm_model {
    char *dir; /* owned; the model folder */
    tm_model_cfg cfg;
    tm_tensor embd;     /* [n_vocab][n_embd] model.embed_tokens.weight */
    tm_tensor out_norm; /* [n_embd] model.norm.weight */
    tm_tensor lm_head;  /* [n_vocab][n_embd]; equals embd when tied */
    tm_layer_w *layers; /* owned array of n_layer (unused for DeepSeek-V4) */
    void *impl;         /* owned mappings */
    void *arch_w;       /* owned arch-specific config + weights, made by its tm_arch_ops
                         * (runner/model/arch.h) config_parse and freed by its destroy: tm_dsv4
                         * (runner/model/model_dsv4.h) for TM_ARCH_DEEPSEEK_V4, NULL for the
                         * Llama family */
    void *qbuf;         /* owned: the codes and scales of weights quantized at load
                         * (tm_model_quantize_fp8), which the linears' views point into; else NULL */
} tm_model;

#endif /* TM_RUNNER_MODEL_MODEL_TYPES_H */
