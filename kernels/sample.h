/* kernels/sample.h - on-device sampling. tm_k_argmax_f32: ids[r] = argmax over
 * logits[r][0..n_limit), the lowest index among equal maxima, or UINT32_MAX when one of those
 * values is NaN or infinite (the runner's greedy sampler fails such a row). Host reference: a
 * linear scan (the runner's greedy sampler in runner/sched/sample.c picks the first maximum the
 * same way). tm_k_sample_f32: the whole sampler of docs/sampling.md per row (logits processing,
 * an allowed-ids bitmask, greedy or top-k / top-p / min-p and the draw of a given uniform, and
 * the raw row's logprobs), one thread block cluster (sm_90+) per row; host reference:
 * tm_sample_token and tm_sample_logprobs (runner/sched/sample.h). */
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

#define TM_K_SAMPLE_MAX_TOP 20              /* logprobs alternatives per row */
#define TM_K_SAMPLE_NONFINITE UINT32_MAX    /* id of a row with a NaN/inf logit */
#define TM_K_SAMPLE_MASKED (UINT32_MAX - 1) /* id of a row whose every id is masked */

/* One row's sampling parameters (tm_sample_params flattened; offsets index the packed arrays). */
typedef struct tm_k_sample_row {
    double u;              /* the draw's uniform in [0, 1): tm_sample_uniform(seed, step) */
    float inv_t;           /* 1.0f / temperature; 0: greedy */
    int32_t top_k;         /* <= 0: off */
    float top_p;           /* off unless in (0, 1) */
    float min_p;           /* <= 0: off */
    float rep, freq, pres; /* penalties; rep 0 or 1, freq 0, pres 0: off */
    uint32_t hist0, n_hist, n_hist_prompt; /* history: pk[hist0, hist0 + n_hist) */
    uint32_t bias0, n_bias; /* bias ids pk[bias0 + j], values pk[bias0 + n_bias + j] */
    uint32_t mask0, n_mask; /* masked ids pk[mask0 + j] */
    uint32_t allow0;        /* with has_allow: id i may be picked only when bit (i & 31) of
                             * pk[allow0 + (i >> 5)] is set (ceil(n_limit / 32) words) */
    uint32_t has_allow;
    uint32_t n_top;     /* logprobs alternatives, <= TM_K_SAMPLE_MAX_TOP */
    uint32_t want_lp;   /* 1: lp and the alternatives */
    uint32_t has_lp_id; /* 1 (a scoring row, with want_lp, greedy and no processing): lp is the
                         * logprob of lp_id, not of the pick (which is then the raw argmax) */
    uint32_t lp_id;     /* with has_lp_id: < n_limit */
} tm_k_sample_row;

typedef struct tm_k_sample_f32_args {
    uint32_t *ids;               /* [n_row] the picked ids (or the TM_K_SAMPLE_ codes) */
    float *lp;                   /* [n_row] logprob of the picked id (rows with want_lp) */
    uint32_t *top_ids;           /* [n_row][TM_K_SAMPLE_MAX_TOP] */
    float *top_lp;               /* [n_row][TM_K_SAMPLE_MAX_TOP] */
    const float *logits;         /* [n_row][n_col] fp32, read only */
    uint32_t *cnt;               /* [n_row][n_col] all 0 on entry, left all 0 */
    const tm_k_sample_row *rows; /* [n_row] */
    const uint32_t *pk;          /* packed history / bias / mask arrays (bias values as bits) */
    uint32_t n_row, n_col;
    uint32_t n_limit; /* only columns [0, n_limit) are candidates; 0 or >= n_col: all */
} tm_k_sample_f32_args;

/* 1 when tm_k_sample_f32 can run rows of n_col ids on device (compute capability 9.0+ for
 * thread block clusters; a row's ids fit the shared memory of one cluster; n_col <= 2^19). */
int tm_k_sample_f32_supported(uint32_t n_col, int device);

/* Loads the kernel and sets its shared-memory size for rows of n_col ids on the current device
 * (optional; keeps that one-time cost out of the first launch). */
tm_rc tm_k_sample_f32_prepare(uint32_t n_col, tm_err *err);

/* Launches on s (one cluster of 8 blocks per row); n_row 0 launches nothing. */
tm_rc tm_k_sample_f32(const tm_k_sample_f32_args *a, cudaStream_t s, tm_err *err);

#ifdef __cplusplus
}
#endif

#endif /* TM_KERNELS_SAMPLE_H */
