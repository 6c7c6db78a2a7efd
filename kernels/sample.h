/* kernels/sample.h - on-device greedy sampling: ids[r] = argmax over logits[r][0..n_limit), the
 * lowest index among equal maxima, or UINT32_MAX when one of those values is NaN or infinite (the
 * runner's greedy sampler fails such a row). Host reference: a linear scan (the runner's greedy
 * sampler in runner/sched/sample.c picks the first maximum the same way). */
#ifndef TM_KERNELS_SAMPLE_H
#define TM_KERNELS_SAMPLE_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "base/err.h" /* C declarations: C linkage also from .cu files */

typedef struct tm_k_argmax_f32_args {
    uint32_t *ids;       /* [n_row] */
    const float *logits; /* [n_row][n_col] fp32 */
    uint32_t n_row, n_col;
    uint32_t n_limit; /* only columns [0, n_limit) compete; 0 or >= n_col: all */
} tm_k_argmax_f32_args;

/* Launches on s; n_row 0 launches nothing. */
tm_rc tm_k_argmax_f32(const tm_k_argmax_f32_args *a, cudaStream_t s, tm_err *err);

#ifdef __cplusplus
}
#endif

#endif /* TM_KERNELS_SAMPLE_H */
