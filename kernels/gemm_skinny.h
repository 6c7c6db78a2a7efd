/* kernels/gemm_skinny.h - the projections of decode steps: y = x @ w^T for a few rows of x
 * (n_tok <= TM_SKINNY_MAX_TOK), bf16 in, fp32 accumulate, on tensor cores (mma.sync m16n8k16).
 * At these shapes the time is the weight stream, so the kernel is built around reading w once at
 * full bandwidth: each warp owns 16 output rows and a range of the inner dimension (split-K), and
 * keeps several 16-byte loads per thread in flight.
 *
 * Split-K results are NOT summed here: split s writes its partial product to
 * part[s][n_tok][n_out] (fp32), and the consumer adds the n_split partials in split order (the
 * kernels that read projections take a partial count: rmsnorm's residual add, rope_kv,
 * silu_mul, or tm_k_sum_parts). The sums are therefore deterministic: the same inputs give the
 * same bits on every run. With n_split == 1, part is simply y.
 *
 * Host reference: the CPU engine's matmul (tm_cpu_matmul in runner/engine/cpu/ops.h) on the
 * same bf16 values widened to fp32; only the summation order differs. */
#ifndef TM_KERNELS_GEMM_SKINNY_H
#define TM_KERNELS_GEMM_SKINNY_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "base/err.h" /* C declarations: C linkage also from .cu files */

/* Most rows of x per launch (two 8-column mma tiles). */
#define TM_SKINNY_MAX_TOK 16
/* Largest split-K factor the planner picks. */
#define TM_SKINNY_MAX_SPLIT 32

typedef struct tm_k_gemm_skinny_args {
    float *part;          /* [n_split][n_tok][n_out] fp32 */
    const uint16_t *w;    /* [n_out][n_in] bf16, 16-byte aligned */
    const uint16_t *x;    /* [n_tok][n_in] bf16, 16-byte aligned */
    uint32_t n_tok;       /* 1..TM_SKINNY_MAX_TOK */
    uint32_t n_in;        /* a multiple of 32 */
    uint32_t n_out;       /* >= 1 */
    uint32_t n_split;     /* from tm_k_gemm_skinny_splits */
    uint32_t k_per_split; /* from tm_k_gemm_skinny_splits: a multiple of 32 */
    uint32_t unroll;      /* 0: the default; 4 or 8: chunks in flight per warp (benchmarks) */
} tm_k_gemm_skinny_args;

/* 1 if the shape can run here (n_tok in range, n_in % 32 == 0). */
int tm_k_gemm_skinny_fits(uint32_t n_tok, uint32_t n_in, uint32_t n_out);

/* The split of the inner dimension for (n_in, n_out) on a GPU of n_sm multiprocessors: enough
 * warps to keep the memory system busy, at least 256 inner elements per split. Depends only on
 * the arguments. Writes *k_per_split; returns n_split (>= 1, every split non-empty). */
uint32_t tm_k_gemm_skinny_splits(uint32_t n_in, uint32_t n_out, uint32_t n_sm,
                                 uint32_t *k_per_split);

/* Launches one kernel on s; n_tok 0 launches nothing. */
tm_rc tm_k_gemm_skinny(const tm_k_gemm_skinny_args *a, cudaStream_t s, tm_err *err);

/* y[i] = beta * y[i] + sum over p < n_part of part[p * stride + i], i < n (beta 0: y is only
 * written). For a consumer that cannot add partials itself. */
typedef struct tm_k_sum_parts_args {
    float *y;
    const float *part;
    size_t stride; /* floats between partials */
    size_t n;
    uint32_t n_part; /* >= 1 */
    float beta;      /* 0 or 1 */
} tm_k_sum_parts_args;

tm_rc tm_k_sum_parts(const tm_k_sum_parts_args *a, cudaStream_t s, tm_err *err);

#ifdef __cplusplus
}
#endif

#endif /* TM_KERNELS_GEMM_SKINNY_H */
