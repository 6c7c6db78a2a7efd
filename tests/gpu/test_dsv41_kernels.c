/* tests/gpu/test_dsv41_kernels.c - the DeepSeek-V4.1 kernels of kernels/dsv41.h against host
 * references written here from the definitions (not from the CPU engine's code): e4m3 and e2m1
 * rounding by nearest search over the formats' values (ties to the even code), power-of-two scales
 * as 2^ceil(log2(p)) from frexp, the Engram gate in double.
 *
 * Data: groups of uniform values over scales 1e-6 .. 1e3, all-zero groups, groups on a
 * 2^-6 grid (so x / s often lands exactly between two codes: the ties), and huge values (the
 * clamp). Quantizers: bit-identical to the reference (the same fp32 operations). Gate:
 * |gpu - ref| <= 1e-6 * (|h| + |value|) per element (double sums in another order). Also: n 0
 * launches nothing. Skipped (77) without a GPU or in a build without CUDA. Never run yet: no GPU
 * was lent when it was written (docs/deepseek_v41.md "CUDA"). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tm_test.h"

#ifndef TM_HAVE_CUDA
int main(void) { tm_test_skip("built without CUDA"); }
#else

#include <cuda_runtime_api.h>

#include "kernels/dsv41.h"
#include "tm_gpu_test.h"

/* ---- host references ---- */

static float g_e4m3[127]; /* the non-negative finite e4m3fn values, by code 0..126 */
static const float g_e2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

static void init_e4m3(void) {
    for (int c = 0; c < 127; c++) {
        const int e = c >> 3, m = c & 7;
        g_e4m3[c] = e == 0 ? ldexpf((float)m, -9) : ldexpf(1.0f + m / 8.0f, e - 7);
    }
}

/* Nearest of n ascending non-negative values to |v| (ties to the even index), sign kept. */
static float nearest(const float *tab, int n, float v) {
    const float a = fabsf(v);
    int best = 0;
    for (int i = 1; i < n; i++) {
        const double d = fabs((double)tab[i] - a), db = fabs((double)tab[best] - a);
        if (d < db || (d == db && (i % 2) == 0))
            best = i;
    }
    return signbit(v) ? -tab[best] : tab[best];
}

static float clampf_(float v, float lo, float hi) { return v < lo ? lo : v > hi ? hi : v; }

/* 2^ceil(log2(p)), p > 0 normal. */
static float pow2_ceil(float p) {
    int e;
    const float m = frexpf(p, &e); /* p = m * 2^e, m in [0.5, 1) */
    return m == 0.5f ? ldexpf(1.0f, e - 1) : ldexpf(1.0f, e);
}

static void ref_act_quant(float *x, size_t n) {
    for (size_t b = 0; b < n; b += 32) {
        float amax = 0.0f;
        for (int i = 0; i < 32; i++)
            amax = fmaxf(amax, fabsf(x[b + i]));
        const float s = pow2_ceil(fmaxf(amax, 1e-4f) * (float)(1.0 / 448.0));
        for (int i = 0; i < 32; i++)
            x[b + i] = nearest(g_e4m3, 127, clampf_(x[b + i] / s, -448.0f, 448.0f)) * s;
    }
}

static void ref_fp4_act_quant(float *x, size_t n, uint32_t block, int e4m3_scale) {
    for (size_t b = 0; b < n; b += block) {
        float amax = 0.0f, s;
        for (uint32_t i = 0; i < block; i++)
            amax = fmaxf(amax, fabsf(x[b + i]));
        if (e4m3_scale)
            s = nearest(g_e4m3, 127, clampf_(fmaxf(amax, 6.0f * 0x1p-9f) / 6.0f, -448.0f, 448.0f));
        else
            s = pow2_ceil(fmaxf(amax, 6.0f * 0x1p-126f) * (float)(1.0 / 6.0));
        for (uint32_t i = 0; i < block; i++)
            x[b + i] = nearest(g_e2m1, 8, clampf_(x[b + i] / s, -6.0f, 6.0f)) * s;
    }
}

/* n values in groups of g: each group one of the data kinds of the header. */
static float *make_data(size_t n, uint32_t g) {
    float *x = xmalloc(n * sizeof(float));
    for (size_t b = 0; b < n; b += g) {
        const uint32_t kind = urand(5);
        const float sc = powf(10.0f, -6.0f + 9.0f * (float)urand(1000) / 1000.0f);
        for (uint32_t i = 0; i < g; i++) {
            float v = sc * frand();
            if (kind == 1)
                v = 0.0f;
            else if (kind == 2)
                v = (float)((int)urand(8193) - 4096) * 0x1p-6f; /* ties */
            else if (kind == 3 && i == 0)
                v = 3e38f * (urand(2) ? 1.0f : -1.0f); /* the clamp */
            x[b + i] = v;
        }
    }
    return x;
}

static void check_bits(const char *what, const float *gpu, const float *ref, size_t n) {
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

static void test_act_quant(void) {
    const size_t sizes[] = {32, 64 * 32, 1000 * 32};
    for (size_t k = 0; k < 3; k++) {
        const size_t n = sizes[k];
        float *x = make_data(n, 32), *ref = xmalloc(n * 4), *got = xmalloc(n * 4);
        memcpy(ref, x, n * 4);
        ref_act_quant(ref, n);
        float *d = dup_to_dev(x, n * 4);
        tm_err err = {0};
        TM_CHECK(tm_k_dsv41_act_quant(d, n, g_stream, &err) == TM_OK);
        to_host(got, d, n * 4);
        check_bits("act_quant", got, ref, n);
        cudaFree(d);
        free(x);
        free(ref);
        free(got);
    }
}

static void test_fp4_act_quant(void) {
    for (int e4 = 0; e4 <= 1; e4++) {
        const uint32_t block = e4 ? 16 : 32;
        const size_t n = (size_t)block * 3001;
        float *x = make_data(n, block), *ref = xmalloc(n * 4), *got = xmalloc(n * 4);
        memcpy(ref, x, n * 4);
        ref_fp4_act_quant(ref, n, block, e4);
        float *d = dup_to_dev(x, n * 4);
        tm_err err = {0};
        TM_CHECK(tm_k_dsv41_fp4_act_quant(d, n, block, e4, g_stream, &err) == TM_OK);
        to_host(got, d, n * 4);
        check_bits(e4 ? "fp4_act_quant block 16 e4m3" : "fp4_act_quant block 32 ue8m0", got, ref, n);
        cudaFree(d);
        free(x);
        free(ref);
        free(got);
    }
}

static void test_engram_gate(void) {
    const uint32_t shapes[][3] = {{1, 1, 32}, {3, 4, 64}, {7, 2, 1000}, {2, 4, 4096}};
    for (size_t k = 0; k < 4; k++) {
        const uint32_t T = shapes[k][0], N = shapes[k][1], D = shapes[k][2];
        const size_t nh = (size_t)T * N * D, nkv = (size_t)T * (N + 1) * D, nw = (size_t)N * D;
        float *h = xmalloc(nh * 4), *kv = xmalloc(nkv * 4), *w = xmalloc(nw * 4);
        float *ref = xmalloc(nh * 4), *got = xmalloc(nh * 4);
        for (size_t i = 0; i < nh; i++)
            h[i] = 2.0f * frand();
        for (size_t i = 0; i < nkv; i++)
            kv[i] = frand();
        for (size_t i = 0; i < nw; i++)
            w[i] = 1.0f + 0.5f * frand();
        if (k == 0)
            for (size_t i = 0; i < nh; i++) // h orthogonal-ish: |dot| below the 1e-6 clamp
                h[i] = 0.0f;
        const float eps = 1e-20f;
        memcpy(ref, h, nh * 4);
        for (uint32_t t = 0; t < T; t++)
            for (uint32_t c = 0; c < N; c++) {
                float *hr = ref + ((size_t)t * N + c) * D;
                const float *key = kv + (size_t)t * (N + 1) * D + (size_t)c * D;
                const float *val = kv + (size_t)t * (N + 1) * D + (size_t)N * D;
                double hh = 0, kk = 0, dot = 0;
                for (uint32_t d = 0; d < D; d++) {
                    hh += (double)hr[d] * hr[d];
                    kk += (double)key[d] * key[d];
                    dot += (double)hr[d] * w[(size_t)c * D + d] * key[d];
                }
                const double x =
                    dot / sqrt(hh / D + eps) / sqrt(kk / D + eps) / sqrt((double)D);
                const double g = 1.0 / (1.0 + exp(-copysign(sqrt(fmax(fabs(x), 1e-6)), x)));
                for (uint32_t d = 0; d < D; d++)
                    hr[d] = (float)(hr[d] + g * val[d]);
            }
        float *dh = dup_to_dev(h, nh * 4), *dkv = dup_to_dev(kv, nkv * 4), *dw = dup_to_dev(w, nw * 4);
        tm_k_dsv41_engram_gate_args a = {dh, dkv, dw, T, N, D, eps};
        tm_err err = {0};
        TM_CHECK(tm_k_dsv41_engram_gate(&a, g_stream, &err) == TM_OK);
        to_host(got, dh, nh * 4);
        size_t bad = 0;
        for (uint32_t t = 0; t < T; t++)
            for (uint32_t c = 0; c < N; c++)
                for (uint32_t d = 0; d < D; d++) {
                    const size_t i = ((size_t)t * N + c) * D + d;
                    const float val = kv[(size_t)t * (N + 1) * D + (size_t)N * D + d];
                    bad += !(fabsf(got[i] - ref[i]) <= 1e-6f * (fabsf(h[i]) + fabsf(val)));
                }
        TM_CHECK_MSG(bad == 0, "engram_gate T %u N %u D %u: %zu of %zu outside the bound", T, N, D,
                     bad, nh);
        cudaFree(dh);
        cudaFree(dkv);
        cudaFree(dw);
        free(h);
        free(kv);
        free(w);
        free(ref);
        free(got);
    }
    tm_k_dsv41_engram_gate_args z = {NULL, NULL, NULL, 0, 4, 64, 1e-20f};
    tm_err err = {0};
    TM_CHECK(tm_k_dsv41_engram_gate(&z, g_stream, &err) == TM_OK); /* n 0: nothing launched */
}

int main(void) {
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0)
        tm_test_skip("no CUDA device");
    TM_ASSERT(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking) == cudaSuccess);
    g_rng = 0x5eed0041ull;
    init_e4m3();
    TM_RUN(test_act_quant);
    TM_RUN(test_fp4_act_quant);
    TM_RUN(test_engram_gate);
    cudaStreamDestroy(g_stream);
    return tm_test_report();
}

#endif /* TM_HAVE_CUDA */
