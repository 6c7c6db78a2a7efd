/* kernels/allreduce.h - a one-shot all-reduce (sum, fp32) of a few rows for tensor parallel
 * inside one node, over peer-to-peer memory (NVLink or PCIe), fused with what surrounds it in a
 * decode step: the sum of this rank's split-K partials before it, the RMSNorm after it. NCCL's
 * per-call latency dominates the small all-reduces of decode steps; the CUDA engine
 * (runner/engine/cuda/) keeps NCCL for larger steps.
 *
 * Every rank owns one region (tm_k_allreduce_region_bytes): two buffers of TM_AR_MAX_ROWS rows
 * per source rank, each row of d floats stored as 16-byte lines {value, epoch, value, epoch},
 * and its own epoch counters; zeroed once. The regions are shared with CUDA IPC (the caller
 * opens the peers' regions and passes all world pointers). One call, on every rank with the
 * same n_tok, in the same order as the other calls; block t handles row t:
 *   its epoch e is one more than the last call's for row t; it computes the row's value on this
 *   rank (beta * x + the partials in split order, or x) and writes it, tagged with e, into every
 *   peer's buffer e & 1 (one 16-byte store per line, so a line is seen whole or not at all: no
 *   flag, fence or read round trip over the link; NCCL's "LL" protocol); then it waits until
 *   every line of every peer's row in its own region carries e, sums the rows in rank order
 *   (the same order, so the same bits, on every rank) into x, and with w writes
 *   out = bf16(w * x * 1/sqrt(mean(x^2) + eps)) (kernels/rmsnorm.h's formula).
 * A peer can be at most one call ahead on a row (it needs this rank's value of that call before
 * it can start the next), so a buffer is rewritten only after its reader is done with it: two
 * buffers suffice. The wait gives up after TM_AR_TIMEOUT_S seconds with a trap (a dead peer; the
 * CUDA context is then unusable, as after any device fault). Works inside CUDA graphs (the
 * epochs live in device memory). Host reference: a plain
 * sum in rank order, then tm_cpu_rmsnorm. */
#ifndef TM_KERNELS_ALLREDUCE_H
#define TM_KERNELS_ALLREDUCE_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "base/err.h" /* C declarations: C linkage also from .cu files */

#define TM_AR_MAX_RANKS 8
#define TM_AR_MAX_ROWS 16
#define TM_AR_TIMEOUT_S 20
#define TM_AR_MAX_D 16384 /* longest row (floats) */

typedef struct tm_k_allreduce_args {
    float *x;                       /* [n_tok][d]: this rank's rows in (see parts), the sums
                                       out */
    void *regions[TM_AR_MAX_RANKS]; /* every rank's region ([rank]: this rank's own) */
    uint32_t n_tok;                 /* 1..TM_AR_MAX_ROWS */
    uint32_t d;                     /* floats per row, a multiple of 4, <= the regions' d */
    uint32_t d_cap;                 /* the d the regions were sized for */
    uint32_t rank, world;           /* world 2..TM_AR_MAX_RANKS */
    /* Optional: this rank's value is beta * x + sum over p < n_part of parts[p * part_stride +
     * row * d ...] (split-K partials, kernels/gemm_skinny.h); NULL: x as it is. */
    const float *parts;
    size_t part_stride; /* a multiple of 4 */
    uint32_t n_part;
    float beta; /* 0 or 1 */
    /* Optional RMSNorm of the summed rows: out[n_tok][d] bf16; w NULL: no norm. */
    uint16_t *out;
    const float *w; /* [d] */
    float eps;
} tm_k_allreduce_args;

/* Bytes of one rank's region for rows of d_cap <= TM_AR_MAX_D floats (allocate with cudaMalloc,
 * zero it). */
size_t tm_k_allreduce_region_bytes(uint32_t d_cap);

tm_rc tm_k_allreduce_sum_f32(const tm_k_allreduce_args *a, cudaStream_t s, tm_err *err);

#ifdef __cplusplus
}
#endif

#endif /* TM_KERNELS_ALLREDUCE_H */
