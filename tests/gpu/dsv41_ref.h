/* tests/gpu/dsv41_ref.h - host references of DeepSeek-V4.1 CUDA kernels' arithmetic that both
 * tests/gpu/test_dsv41_ops.c and the engine's host emulation (bench/dsv41_emu/emu_kernels.c) use:
 * the hyper-connection split as kernels/dsv41.cu computes it (the CPU engine's fp32 operations in
 * its order, tm_dsv_hc_split in runner/engine/cpu/dsv_common.c, but each exp as exp in double
 * rounded to fp32 where the CPU engine calls expf: the two are one ulp apart now and then). */
#ifndef TM_TESTS_GPU_DSV41_REF_H
#define TM_TESTS_GPU_DSV41_REF_H

#include <math.h>
#include <stdint.h>

static inline float dsv41_ref_sigmoid(float v) { return 1.0f / (1.0f + (float)exp(-(double)v)); }

/* The split of one token's mixes m (already scaled by 1 / rms): tm_dsv_hc_split's operations in
 * its order, with exp in double rounded to fp32 where it calls expf. */
static inline void dsv41_ref_hc_split(const float *m, const float *sc, const float *bs, uint32_t N,
                                      uint32_t iters, float eps, float *pre, float *post,
                                      float *cb) {
    for (uint32_t i = 0; i < N; i++) {
        pre[i] = dsv41_ref_sigmoid(m[i] * sc[0] + bs[i]) + eps;
        post[i] = 2.0f * dsv41_ref_sigmoid(m[N + i] * sc[1] + bs[N + i]);
    }
    for (uint32_t j = 0; j < N; j++) {
        float *row = cb + j * N, mx = -INFINITY, sum = 0.0f;
        for (uint32_t k = 0; k < N; k++) {
            row[k] = m[2 * N + j * N + k] * sc[2] + bs[2 * N + j * N + k];
            mx = fmaxf(mx, row[k]);
        }
        for (uint32_t k = 0; k < N; k++) {
            row[k] = (float)exp((double)(row[k] - mx));
            sum += row[k];
        }
        for (uint32_t k = 0; k < N; k++)
            row[k] = row[k] / sum + eps;
    }
    for (uint32_t it = 0; it < iters; it++) {
        for (uint32_t j = 0; it > 0 && j < N; j++) {
            float sum = 0.0f;
            for (uint32_t k = 0; k < N; k++)
                sum += cb[j * N + k];
            for (uint32_t k = 0; k < N; k++)
                cb[j * N + k] /= sum + eps;
        }
        for (uint32_t k = 0; k < N; k++) {
            float sum = 0.0f;
            for (uint32_t j = 0; j < N; j++)
                sum += cb[j * N + k];
            for (uint32_t j = 0; j < N; j++)
                cb[j * N + k] /= sum + eps;
        }
    }
}

#endif /* TM_TESTS_GPU_DSV41_REF_H */
