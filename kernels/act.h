/* kernels/act.h - SwiGLU activation: out[t][i] = bf16(silu(gu[t][i]) * gu[t][n_ff + i]), with
 * silu(g) = g / (1 + exp(-g)); gu is the fused gate|up projection output. Host reference:
 * tm_cpu_silu_mul (runner/engine/cpu/ops.h) on the two halves, then rounding to bf16. */
#ifndef TM_KERNELS_ACT_H
#define TM_KERNELS_ACT_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "base/err.h" /* C declarations: C linkage also from .cu files */

typedef struct tm_k_silu_mul_bf16_args {
    uint16_t *out;   /* [n_tok][n_ff] bf16 */
    const float *gu; /* [n_tok][2*n_ff] fp32: gate in [0, n_ff), up in [n_ff, 2*n_ff) */
    uint32_t n_tok, n_ff;
    /* gu as n_part split-K partials (kernels/gemm_skinny.h) part_stride floats apart, summed in
     * order; 0 or 1: gu is the whole projection. */
    uint32_t n_part;
    size_t part_stride;
} tm_k_silu_mul_bf16_args;

/* Launches on s; n_tok 0 launches nothing. */
tm_rc tm_k_silu_mul_bf16(const tm_k_silu_mul_bf16_args *a, cudaStream_t s, tm_err *err);

#ifdef __cplusplus
}
#endif

#endif /* TM_KERNELS_ACT_H */
