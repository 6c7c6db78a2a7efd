/* kernels/rope.h - the step between the fused QKV projection and attention: add the q/k/v bias
 * (Qwen2), rotate q and k (rotate-half RoPE as HF Llama: for i < d/2, angle = pos * inv_freq[i],
 * y[i] = x[i]*cos - x[i+d/2]*sin, y[i+d/2] = x[i+d/2]*cos + x[i]*sin), write q as bf16 for the
 * attention kernel and k, v as bf16 into the paged KV cache at each token's slot
 * (block_table[pos / block_size] * block_size + pos % block_size, computed by the caller), or
 * with kv_fp8 as e4m3 bytes rounded from the fp32 values (tm_kv_fp8_round on the host).
 * inv_freq comes from the host (tm_model_rope_inv_freq, llama3 scaling included). Host reference:
 * tm_cpu_rope_table + tm_cpu_rope (runner/engine/cpu/ops.h) and the cache row copy of the CPU
 * engine, then rounding to bf16. */
#ifndef TM_KERNELS_ROPE_H
#define TM_KERNELS_ROPE_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "base/err.h" /* C declarations: C linkage also from .cu files */

typedef struct tm_k_rope_kv_bf16_args {
    uint16_t *q;           /* [n_tok][n_head*head_dim] bf16, written rotated */
    uint16_t *k_cache;     /* one layer: [slot][n_kv_head*head_dim] bf16; with kv_fp8 the
                            * same layout of e4m3 bytes (cast to uint8_t) */
    uint16_t *v_cache;     /* same shape */
    const float *qkv;      /* [n_tok][(n_head + 2*n_kv_head)*head_dim] fp32: q | k | v */
    const float *bias;     /* [(n_head + 2*n_kv_head)*head_dim] fp32, or NULL */
    const uint32_t *pos;   /* [n_tok] position of each token */
    const uint32_t *slot;  /* [n_tok] KV cache row of each token; distinct within a call */
    const float *inv_freq; /* [head_dim/2] */
    uint32_t n_tok, n_head, n_kv_head, head_dim; /* head_dim even */
    /* qkv as n_part split-K partials (kernels/gemm_skinny.h) part_stride floats apart, summed
     * in order before the bias; 0 or 1: qkv is the whole projection. */
    uint32_t n_part;
    size_t part_stride;
    uint32_t kv_fp8; /* 1: write K and V as e4m3 (scale 1.0, saturating; kernels/kv_fp8.cuh) */
} tm_k_rope_kv_bf16_args;

/* Launches on s; n_tok 0 launches nothing. */
tm_rc tm_k_rope_kv_bf16(const tm_k_rope_kv_bf16_args *a, cudaStream_t s, tm_err *err);

#ifdef __cplusplus
}
#endif

#endif /* TM_KERNELS_ROPE_H */
