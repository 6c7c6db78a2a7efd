/* kernels/fill.h - deterministic pseudo-random bf16 (and e4m3) fill for benchmark weights made on
 * the device (no multi-GB files): p[i] = bf16(offset + scale * u), u uniform in [-1, 1) from a hash
 * of (seed, i), so the result does not depend on the launch shape. Host reference: the same
 * hash in tests/gpu/test_kernels.c. */
#ifndef TM_KERNELS_FILL_H
#define TM_KERNELS_FILL_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "base/err.h" /* C declarations: C linkage also from .cu files */

typedef struct tm_k_fill_bf16_args {
    uint16_t *p; /* [n] bf16 */
    size_t n;
    uint64_t seed;
    float scale, offset;
} tm_k_fill_bf16_args;

/* Launches on s; n 0 launches nothing. */
tm_rc tm_k_fill_bf16(const tm_k_fill_bf16_args *a, cudaStream_t s, tm_err *err);

/* FP8 benchmark weights: p[i] = e4m3(amax * u) (round to nearest even, saturating at 448; never
 * a NaN code), u from the same hash as tm_k_fill_bf16; amax in (0, 448]. */
typedef struct tm_k_fill_e4m3_args {
    uint8_t *p; /* [n] e4m3 */
    size_t n;
    uint64_t seed;
    float amax;
} tm_k_fill_e4m3_args;

tm_rc tm_k_fill_e4m3(const tm_k_fill_e4m3_args *a, cudaStream_t s, tm_err *err);

/* Read-only stream for the bandwidth ceiling (bench_engine, as the anchors' x.sum() over 4 GiB
 * of bf16): every 16-byte word of p[0, n_bytes) read once (n_bytes a multiple of 16, p 16-byte
 * aligned), its bf16 values summed in fp32 per block into out[block] (the sums keep the loads
 * live; their values are not meaningful). out holds TM_K_READ_BLOCKS floats. */
#define TM_K_READ_BLOCKS 4224
tm_rc tm_k_read_stream(const void *p, size_t n_bytes, float *out, cudaStream_t s, tm_err *err);

#ifdef __cplusplus
}
#endif

#endif /* TM_KERNELS_FILL_H */
