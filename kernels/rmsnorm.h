/* kernels/rmsnorm.h - RMSNorm of fp32 rows into bf16: out[r] = bf16(w * (x[row] * 1/sqrt(
 * mean(x[row]^2) + eps))), row = rows ? rows[r] : r. The optional row list gathers rows (the
 * final norm runs only on the tokens whose logits are wanted). With add, the residual add of a
 * projection's split-K partials is fused in front (x is updated in place). Host reference:
 * tm_cpu_rmsnorm (runner/engine/cpu/ops.h) in fp32, then rounding to bf16. */
#ifndef TM_KERNELS_RMSNORM_H
#define TM_KERNELS_RMSNORM_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "base/err.h" /* C declarations: C linkage also from .cu files */

typedef struct tm_k_rmsnorm_bf16_args {
    uint16_t *out;        /* [n_row][n_col] bf16 */
    float *x;             /* fp32 rows of n_col floats (row stride n_col); written only with
                             add */
    const uint32_t *rows; /* [n_row] device indices into x, or NULL for rows 0..n_row-1 */
    const float *w;       /* [n_col] fp32 */
    uint32_t n_row, n_col;
    float eps;
    /* Optional residual add before the norm (the split-K partials of kernels/gemm_skinny.h):
     * x[row] += add[p * add_stride + row * n_col ...] for p < n_add, in order, written back to
     * x. NULL: x is only read. */
    const float *add;
    size_t add_stride; /* floats between partials; a multiple of 4 when n_col is */
    uint32_t n_add;
} tm_k_rmsnorm_bf16_args;

/* Launches on s; n_row 0 launches nothing. */
tm_rc tm_k_rmsnorm_bf16(const tm_k_rmsnorm_bf16_args *a, cudaStream_t s, tm_err *err);

#ifdef __cplusplus
}
#endif

#endif /* TM_KERNELS_RMSNORM_H */
