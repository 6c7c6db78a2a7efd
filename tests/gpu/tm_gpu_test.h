/* tests/gpu/tm_gpu_test.h - what the kernel tests share (include after tm_test.h, in a build with
 * CUDA): the stream the kernels run on, a seeded generator, bf16 conversions, device buffers and
 * copies. Each test file sets g_rng's seed and creates g_stream in main().
 *
 * g_stream is a non-blocking stream: it does not wait for the legacy default stream, where
 * cudaMemset and cudaMemcpy run (and a pageable cudaMemcpy may return before its DMA ends). So
 * dalloc and dup_to_dev synchronize the device before they hand a buffer out; without it a
 * poisoning memset could land after a kernel's writes (seen: argmax outputs all 0xffffffff on one
 * machine). */
#ifndef TM_TESTS_TM_GPU_TEST_H
#define TM_TESTS_TM_GPU_TEST_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "runner/engine/cpu/ops.h"
#include "tm_test.h"

static cudaStream_t g_stream;
static uint64_t g_rng = 0x1234567ull;

static inline uint64_t rnd(void) {
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return g_rng >> 11;
}
/* uniform in [-1, 1) */
static inline float frand(void) { return (float)((double)rnd() * 0x1p-52 - 1.0); }
static inline uint32_t urand(uint32_t n) { return (uint32_t)(rnd() % n); }

static inline float bf(uint16_t h) { return tm_bf16_to_f32(h); }
static inline uint16_t to_bf(float f) { return tm_f32_to_bf16(f); }

static inline void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    TM_ASSERT(p);
    return p;
}
/* A seeded random permutation of [0, n) (malloc'd). */
/* n random bf16 values in scale * [-1, 1) into *bits and their exact float values into *vals
 * (both malloc'd). */
static inline void rand_bf16(size_t n, float scale, uint16_t **bits, float **vals) {
    *bits = xmalloc(n * 2);
    *vals = xmalloc(n * 4);
    for (size_t i = 0; i < n; i++) {
        (*bits)[i] = to_bf(scale * frand());
        (*vals)[i] = bf((*bits)[i]);
    }
}
static inline uint32_t *shuffled(uint32_t n) {
    uint32_t *perm = xmalloc((size_t)n * 4);
    for (uint32_t i = 0; i < n; i++)
        perm[i] = i;
    for (uint32_t i = n ? n - 1 : 0; i > 0; i--) {
        uint32_t j = urand(i + 1), tmp = perm[i];
        perm[i] = perm[j];
        perm[j] = tmp;
    }
    return perm;
}
/* Device buffer of n bytes (at least 1), filled with byte pattern fill. */
static inline void *dalloc(size_t n, int fill) {
    void *p = NULL;
    TM_ASSERT(cudaMalloc(&p, n ? n : 1) == cudaSuccess);
    TM_ASSERT(cudaMemset(p, fill, n ? n : 1) == cudaSuccess);
    TM_ASSERT(cudaDeviceSynchronize() == cudaSuccess);
    return p;
}
static inline void *dup_to_dev(const void *h, size_t n) {
    void *p = dalloc(n, 0);
    if (n)
        TM_ASSERT(cudaMemcpy(p, h, n, cudaMemcpyHostToDevice) == cudaSuccess);
    TM_ASSERT(cudaDeviceSynchronize() == cudaSuccess);
    return p;
}
/* After g_stream's work: n bytes of device d into host h. */
static inline void to_host(void *h, const void *d, size_t n) {
    TM_ASSERT(cudaStreamSynchronize(g_stream) == cudaSuccess);
    if (n)
        TM_ASSERT(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost) == cudaSuccess);
}

/* Checks that gpu[0..n) equals ref[0..n) bit for bit; the message names what, how many differ and
 * the first. */
static inline void check_bits(const char *what, const float *gpu, const float *ref, size_t n) {
    size_t bad = 0, first = n;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&gpu[i], &ref[i], sizeof(float)) != 0) {
            if (first == n)
                first = i;
            bad++;
        }
    TM_CHECK_MSG(bad == 0, "%s: %zu of %zu differ, first at %zu: gpu %.9g ref %.9g", what, bad, n,
                 first, first < n ? gpu[first] : 0.0f, first < n ? ref[first] : 0.0f);
}

#endif /* TM_TESTS_TM_GPU_TEST_H */
