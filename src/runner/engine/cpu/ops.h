/* runner/engine/cpu/ops.h - the host reference ops of the Llama-family forward pass:
 * matmul against [out][in] weights (any dtype of runner/model/tensor.h), RMSNorm, rotate-half RoPE,
 * paged causal attention, SiLU(gate)*up. Each op takes an args struct; the CUDA kernels take the
 * same structs (they move to kernels/<family>.h when those land) and tests/gpu/test_kernels.c
 * checks each kernel against the function here.
 *
 * Numerics: all math is fp32. Every dot product goes through tm_cpu_dot(), whose reduction order
 * depends only on the length n, so a given (token, output row) gives the same bits whatever the
 * batch composition, the chunking of a prompt, the thread count or the row range a thread takes.
 *
 * Threading: every function is pure over its arguments (writes only its outputs and the scratch
 * it is given); callers split the work (the *_rows / per-head variants) across threads.
 * Nothing here allocates. */
#ifndef TM_RUNNER_ENGINE_CPU_OPS_H
#define TM_RUNNER_ENGINE_CPU_OPS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "runner/model/model.h"

/* Sum of a[i]*b[i], i < n, in a fixed order that depends only on n: 8 lane-wise partial sums
 * (lane j takes elements i % 8 == j; 4-wide vector arithmetic, no -ffast-math), folded in a fixed
 * tree. The CUDA kernels need not match these bits; they are compared with a tolerance. */
float tm_cpu_dot(const float *a, const float *b, size_t n);

/* ---- matmul: out[t][o] = sum_i x[t][i] * w[o][i] (+ bias[o]) (+ res[t][o]) ---- */

typedef struct tm_k_matmul_args {
    float *out;     /* [n_tok][ld_out] */
    const float *x; /* [n_tok][n_in] */
    const void *w;  /* [n_out][n_in], dtype w_dtype; unused when wq is set */
    tm_dtype w_dtype;
    const tm_tensor *wq; /* a quantized weight (runner/model/tensor.h), or NULL: output row o is
                          * row wq_row0 + o of wq, read dequantized with tm_tensor_row_f32 */
    uint64_t wq_row0;
    const void *bias; /* [n_out], dtype bias_dtype, or NULL */
    tm_dtype bias_dtype;
    const float *res; /* [n_tok][ld_out] residual added after the bias, or NULL; may == out */
    uint32_t n_tok, n_in, n_out;
    uint32_t ld_out; /* row stride of out/res in floats, >= n_out */
} tm_k_matmul_args;

/* Floats of scratch tm_cpu_matmul_rows needs: TM_CPU_MM_ROWS * n_in. */
#define TM_CPU_MM_ROWS 4
/* Output rows [o0, o1) for all tokens. Each weight row is converted to f32 (dequantized when wq
 * is set) once into wbuf (TM_CPU_MM_ROWS * n_in floats) and used for every token; the dot
 * products are the same whatever the weight's format, so a quantized weight gives the bits of
 * its dequantized f32 copy. */
void tm_cpu_matmul_rows(const tm_k_matmul_args *a, uint32_t o0, uint32_t o1, float *wbuf);
/* All rows, single-threaded. */
void tm_cpu_matmul(const tm_k_matmul_args *a, float *wbuf);

/* ---- RMSNorm: out[r] = x[r] * 1/sqrt(mean(x[r]^2) + eps) * w, in fp32 ---- */

typedef struct tm_k_rmsnorm_args {
    float *out;     /* [n_row][n_col]; may == x */
    const float *x; /* [n_row][n_col] */
    const void *w;  /* [n_col], dtype w_dtype */
    tm_dtype w_dtype;
    uint32_t n_row, n_col;
    float eps;
} tm_k_rmsnorm_args;

void tm_cpu_rmsnorm(const tm_k_rmsnorm_args *a);

/* ---- RoPE (rotate-half, as HF Llama/Qwen2): for i < d/2, with c = cos[t][i], s = sin[t][i]:
 *      y[i] = x[i]*c - x[i+d/2]*s;  y[i+d/2] = x[i+d/2]*c + x[i]*s ---- */

typedef struct tm_k_rope_args {
    float *x;         /* [n_tok][ld_x]: heads at x[t][h*head_dim], rotated in place */
    const float *cos; /* [n_tok][head_dim/2] */
    const float *sin; /* [n_tok][head_dim/2] */
    uint32_t n_tok, n_head, head_dim; /* head_dim even */
    uint32_t ld_x;                    /* row stride in floats, >= n_head*head_dim */
} tm_k_rope_args;

void tm_cpu_rope(const tm_k_rope_args *a);

/* cos/sin tables [n_tok][d/2] for positions pos[t]: angle = (float)pos * inv_freq[i] (inv_freq from
 * tm_model_rope_inv_freq, runner/model/model.h). */
void tm_cpu_rope_table(const uint32_t *pos, uint32_t n_tok, const float *inv_freq,
                       uint32_t head_dim, float *cos_out, float *sin_out);

/* ---- paged causal attention, one sequence ----
 * Token t of the chunk sits at position pos0 + t and attends to positions [0, pos0 + t]. Position
 * p's K/V row is cache[block_table[p / block_size]][p % block_size][kv_head*head_dim ...].
 * softmax(q.k * scale) in fp32, then the weighted sum of V. Query head h reads KV head
 * h / (n_head / n_kv_head) (GQA). With window > 0 (Mistral / Qwen2 sliding window) a token at
 * position p attends only to positions (p - window, p], as HF's sliding mask does. */
typedef struct tm_k_attn_args {
    float *out;           /* [n_tok][n_head*head_dim] (row stride ld_q) */
    const float *q;       /* [n_tok][ld_q], rotated */
    const float *k_cache; /* one layer: [n_block][block_size][n_kv_head*head_dim] */
    const float *v_cache; /* same shape */
    const uint32_t *block_table;
    uint32_t pos0, n_tok;
    uint32_t n_head, n_kv_head, head_dim, block_size;
    uint32_t ld_q;   /* row stride of q and out in floats */
    uint32_t window; /* sliding window in tokens; 0 = full causal attention */
    float scale;     /* 1/sqrt(head_dim) */
} tm_k_attn_args;

/* Query head h for every token of the chunk. scores: pos0 + n_tok floats of scratch (indexed by
 * position). */
void tm_cpu_attn_head(const tm_k_attn_args *a, uint32_t h, float *scores);
/* All heads, single-threaded. */
void tm_cpu_attn(const tm_k_attn_args *a, float *scores);

/* ---- out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)) ---- */

typedef struct tm_k_silu_mul_args {
    float *out;        /* [n]; may == gate or up */
    const float *gate; /* [n] */
    const float *up;   /* [n] */
    size_t n;
} tm_k_silu_mul_args;

void tm_cpu_silu_mul(const tm_k_silu_mul_args *a);

#endif /* TM_RUNNER_ENGINE_CPU_OPS_H */
