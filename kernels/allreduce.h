/* kernels/allreduce.h - a one-shot all-reduce (sum, fp32) for tensor parallel inside one node,
 * over peer-to-peer memory (NVLink or PCIe), for the small all-reduces of decode steps where
 * NCCL's per-call latency dominates (runner/engine_cuda.c uses NCCL above `cap`).
 *
 * Every rank owns one region (tm_k_allreduce_region_bytes): two staging buffers of cap floats,
 * a flag matrix and its own epoch counters, zeroed once. The regions are shared with CUDA IPC
 * (the caller opens the peers' regions and passes all world pointers). One call, on every rank
 * with the same n, in the same order as the other calls:
 *   each block b stages its stripes of x (chunks of TM_AR_CHUNK floats c with c % blocks == b)
 *   in buffer e & 1 of its own region, where e is its epoch (one more than the last call's),
 *   then writes e into flag [b][rank] of every peer's region (release, system scope) and waits
 *   until every peer has written e into its own flag [b][peer] (acquire); then it sums the
 *   stripes of every rank's buffer in rank order (the same order, so the same bits, on every
 *   rank) into x.
 * A block's stripes do not depend on n, so a buffer is rewritten only after every peer has
 * signalled the next call for the same stripes, i.e. finished reading it (two buffers suffice).
 * The wait gives up after TM_AR_TIMEOUT_S seconds with a trap (a dead peer; the CUDA context is
 * then unusable, as after any device fault). Works inside CUDA graphs (the epochs live in device
 * memory). Host reference: a plain sum in rank order. */
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
#define TM_AR_BLOCKS 32      /* blocks per call, each with its own flags */
#define TM_AR_CHUNK 1024     /* floats per stripe chunk */
#define TM_AR_TIMEOUT_S 20

typedef struct tm_k_allreduce_args {
    float *x;                          /* [n] this rank's values in, the sum out */
    void *regions[TM_AR_MAX_RANKS];    /* every rank's region ([rank]: this rank's own) */
    size_t n;                          /* <= cap, a multiple of 4 */
    size_t cap;                        /* floats per staging buffer, a multiple of 4 */
    uint32_t rank, world;              /* world 2..TM_AR_MAX_RANKS */
} tm_k_allreduce_args;

/* Bytes of one rank's region for buffers of cap floats (allocate with cudaMalloc, zero it). */
size_t tm_k_allreduce_region_bytes(size_t cap);

tm_rc tm_k_allreduce_sum_f32(const tm_k_allreduce_args *a, cudaStream_t s, tm_err *err);

#ifdef __cplusplus
}
#endif

#endif /* TM_KERNELS_ALLREDUCE_H */
