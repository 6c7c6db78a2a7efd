/* tests/gpu/test_dsv41_kernels.c - the DeepSeek-V4.1 kernels of kernels/dsv41.h against host
 * references written here from the definitions (not from the CPU engine's code): e4m3 and e2m1
 * rounding by nearest search over the formats' values (ties to the even code), power-of-two scales
 * as 2^ceil(log2(p)) from frexp, the Engram gate in double.
 *
 * Data: groups of uniform values over scales 1e-6 .. 1e3, all-zero groups, groups on a
 * 2^-6 grid (so x / s often lands exactly between two codes: the ties), and huge values (the
 * clamp). Quantizers: bit-identical to the reference (the same fp32 operations), and the CPU
 * engine's own (tm_dsv_act_quant / tm_dsv_fp4_act_quant, dsv_common.h) to the same reference. Gate:
 * |gpu - ref| <= 1e-6 * (|h| + |value|) per element (double sums in another order). Also: n 0
 * launches nothing. The indexer's selection (plain top-k, candidate source, consumer) against qsort
 * with the CPU engine's order (higher score, then the lower position), on scores with many ties
 * and -inf entries, lens 0 .. 70000: identical picks and candidate blocks. The fast path's input
 * conversion (tm_k_dsv41_to_bf16: act_quant'ed values as bf16, or the bf16 hi = bf16(x), lo =
 * bf16(x - hi) split, strided rows) and its split-K + hi / lo sums (tm_k_dsv41_sum_split, strided
 * output, with and without lo rows, adding): bit-identical to host references (the same fp32
 * operations in the same order), hi + lo within 2^-16 of x. The plain linear on both of its
 * launches (a warp or a block per output) against a host double sum, also at the released shapes
 * and with more rows than grid y's 65535. The indexer's scores (32 heads x 128, rows of 70000
 * positions in a paged state: more than the capped grid covers in one pass) against a host double
 * sum; the selection at the released shapes (blocks of 8, 2048 kept, top 512); the MoE pairs in
 * expert order against a host stable counting sort. Skipped (77) without
 * a GPU or in a build without CUDA. Never run yet: no GPU was lent when it was written
 * (docs/deepseek_v41.md "CUDA"). */
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
#include "runner/engine/cpu/dsv_common.h"
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

static void test_act_quant(void) {
    const size_t sizes[] = {32, 64 * 32, 1000 * 32};
    for (size_t k = 0; k < 3; k++) {
        const size_t n = sizes[k];
        float *x = make_data(n, 32), *ref = xmalloc(n * 4), *got = xmalloc(n * 4);
        memcpy(ref, x, n * 4);
        ref_act_quant(ref, n);
        float *cpu = xmalloc(n * 4); /* the CPU engine's own (dsv_common.h) */
        memcpy(cpu, x, n * 4);
        tm_dsv_act_quant(cpu, (uint32_t)n);
        check_bits("act_quant: CPU engine vs reference", cpu, ref, n);
        free(cpu);
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
        float *cpu = xmalloc(n * 4);
        memcpy(cpu, x, n * 4);
        tm_dsv_fp4_act_quant(cpu, (uint32_t)n, block, e4);
        check_bits("fp4_act_quant: CPU engine vs reference", cpu, ref, n);
        free(cpu);
        float *d = dup_to_dev(x, n * 4);
        tm_err err = {0};
        TM_CHECK(tm_k_dsv41_fp4_act_quant(d, n, block, e4, g_stream, &err) == TM_OK);
        to_host(got, d, n * 4);
        check_bits(e4 ? "fp4_act_quant block 16 e4m3" : "fp4_act_quant block 32 ue8m0", got, ref,
                   n);
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
                const double x = dot / sqrt(hh / D + eps) / sqrt(kk / D + eps) / sqrt((double)D);
                const double g = 1.0 / (1.0 + exp(-copysign(sqrt(fmax(fabs(x), 1e-6)), x)));
                for (uint32_t d = 0; d < D; d++)
                    hr[d] = (float)(hr[d] + g * val[d]);
            }
        float *dh = dup_to_dev(h, nh * 4), *dkv = dup_to_dev(kv, nkv * 4),
              *dw = dup_to_dev(w, nw * 4);
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

/* ---- the indexer's selection ---- */

static const float *g_cmp_s;
static int cmp_desc(const void *pa, const void *pb) { /* higher score, then the lower index */
    const uint32_t i = *(const uint32_t *)pa, j = *(const uint32_t *)pb;
    const float a = g_cmp_s[i], b = g_cmp_s[j];
    if (a != b)
        return a > b ? -1 : 1;
    return i < j ? -1 : i > j;
}
static int cmp_u32(const void *pa, const void *pb) {
    const uint32_t a = *(const uint32_t *)pa, b = *(const uint32_t *)pb;
    return a < b ? -1 : a > b;
}
/* The top n of s[0..m) by cmp_desc, ascending, into out; returns n. */
static uint32_t ref_top(const float *s, uint32_t m, uint32_t n, uint32_t *out) {
    uint32_t *ord = xmalloc((m ? m : 1) * 4);
    for (uint32_t k = 0; k < m; k++)
        ord[k] = k;
    g_cmp_s = s;
    qsort(ord, m, 4, cmp_desc);
    n = n < m ? n : m;
    memcpy(out, ord, n * 4);
    qsort(out, n, 4, cmp_u32);
    free(ord);
    return n;
}

/* One case: n_tok tokens of random scores (ties: values on a 0.5 grid; -inf entries) over lens
 * drawn in [0, ld]; mode as kernels/dsv41.h; the consumer's candidates random block subsets. */
static void sel_case(uint32_t n_tok, uint32_t ld, uint32_t mode, uint32_t cb, uint32_t ctop,
                     uint32_t topk) {
    const size_t ns = (size_t)n_tok * ld;
    float *sc = xmalloc(ns * 4), *ref_sc = xmalloc(ns * 4);
    uint32_t *lens = xmalloc(n_tok * 4), *cand = xmalloc((size_t)n_tok * ctop * 4);
    uint32_t *n_cand = xmalloc(n_tok * 4);
    for (uint32_t t = 0; t < n_tok; t++) {
        lens[t] = t == 0 ? ld : t == 1 ? 1 : t == 2 ? 0 : urand(ld + 1);
        for (uint32_t k = 0; k < ld; k++) {
            const uint32_t u = urand(20);
            sc[(size_t)t * ld + k] = u == 0 ? -INFINITY : 0.5f * (float)((int)urand(13) - 4);
        }
        n_cand[t] = 0;
        if (mode == TM_DSV41_SEL_CONSUMER && lens[t]) { // ascending random subset of the blocks
            const uint32_t nb = (lens[t] + cb - 1) / cb;
            for (uint32_t bk = 0; bk < nb && n_cand[t] < ctop; bk++)
                if (urand(3) == 0 || bk == nb - 1)
                    cand[(size_t)t * ctop + n_cand[t]++] = bk;
        }
    }
    memcpy(ref_sc, sc, ns * 4);
    float *d_sc = dup_to_dev(sc, ns * 4), *d_bsc = dalloc(ns * 4, 0);
    uint32_t *d_lens = dup_to_dev(lens, n_tok * 4);
    uint32_t *d_cand = dup_to_dev(cand, (size_t)n_tok * ctop * 4);
    uint32_t *d_ncand = dup_to_dev(n_cand, n_tok * 4), *d_npick = dalloc(n_tok * 4, 0xff);
    int32_t *d_pick = dalloc((size_t)n_tok * topk * 4, 0xff);
    tm_k_dsv41_select_args a = {d_sc, d_bsc, d_lens, d_cand, d_ncand, d_pick, d_npick,
                                ld,   n_tok, mode,   cb,     ctop,    topk};
    tm_err err = {0};
    TM_CHECK(tm_k_dsv41_select(&a, g_stream, &err) == TM_OK);
    int32_t *pick = xmalloc((size_t)n_tok * topk * 4);
    uint32_t *n_pick = xmalloc(n_tok * 4), *gc = xmalloc((size_t)n_tok * ctop * 4);
    uint32_t *gnc = xmalloc(n_tok * 4), *want = xmalloc((ld + 1) * 4);
    to_host(pick, d_pick, (size_t)n_tok * topk * 4);
    to_host(n_pick, d_npick, n_tok * 4);
    to_host(gc, d_cand, (size_t)n_tok * ctop * 4);
    to_host(gnc, d_ncand, n_tok * 4);
    float *bs = xmalloc((ld + 1) * 4);
    uint32_t bad = 0;
    for (uint32_t t = 0; t < n_tok; t++) {
        float *s = ref_sc + (size_t)t * ld;
        const uint32_t L = lens[t];
        if (mode == TM_DSV41_SEL_SOURCE && L) {
            const uint32_t nb = (L + cb - 1) / cb;
            for (uint32_t bk = 0; bk < nb; bk++) {
                float mx = -INFINITY;
                for (uint32_t k = bk * cb; k < L && k < (bk + 1) * cb; k++)
                    mx = fmaxf(mx, s[k]);
                bs[bk] = bk == nb - 1 ? INFINITY : mx;
            }
            const uint32_t nc = ref_top(bs, nb, ctop, want);
            if (gnc[t] != nc || memcmp(gc + (size_t)t * ctop, want, nc * 4) != 0) {
                if (!bad)
                    printf("  mode %u token %u: candidate blocks differ (n %u vs %u)\n", mode, t,
                           gnc[t], nc);
                bad++;
            }
        } else if (mode == TM_DSV41_SEL_CONSUMER) {
            for (uint32_t k = 0; k < L; k++) {
                int in = 0;
                for (uint32_t i = 0; i < n_cand[t]; i++)
                    in |= cand[(size_t)t * ctop + i] == k / cb;
                if (!in)
                    s[k] = -INFINITY;
            }
        }
        const uint32_t n = ref_top(s, L, topk, want);
        int ok = n_pick[t] == n;
        for (uint32_t i = 0; ok && i < n; i++)
            ok = pick[(size_t)t * topk + i] == (int32_t)want[i];
        if (!ok) {
            if (!bad)
                printf("  mode %u token %u lens %u: picks differ (n %u vs %u)\n", mode, t, L,
                       n_pick[t], n);
            bad++;
        }
    }
    TM_CHECK_MSG(bad == 0, "select mode %u ld %u cb %u ctop %u topk %u: %u tokens differ", mode, ld,
                 cb, ctop, topk, bad);
    cudaFree(d_sc);
    cudaFree(d_bsc);
    cudaFree(d_lens);
    cudaFree(d_cand);
    cudaFree(d_ncand);
    cudaFree(d_npick);
    cudaFree(d_pick);
    free(sc);
    free(ref_sc);
    free(lens);
    free(cand);
    free(n_cand);
    free(pick);
    free(n_pick);
    free(gc);
    free(gnc);
    free(want);
    free(bs);
}

static void check_u16(const char *what, const uint16_t *gpu, const uint16_t *ref, size_t n) {
    size_t bad = 0, first = n;
    for (size_t i = 0; i < n; i++)
        if (gpu[i] != ref[i]) {
            if (first == n)
                first = i;
            bad++;
        }
    TM_CHECK_MSG(bad == 0, "%s: %zu of %zu differ, first at %zu: gpu 0x%04x ref 0x%04x", what, bad,
                 n, first, first < n ? gpu[first] : 0u, first < n ? ref[first] : 0u);
}

static void test_to_bf16(void) {
    const uint32_t n_tok = 5, n = 32 * 40, ldx = n + 96;
    float *x = make_data((size_t)n_tok * ldx, 32);
    uint16_t *ref = xmalloc((size_t)n_tok * n * 2), *ref_lo = xmalloc((size_t)n_tok * n * 2);
    uint16_t *got = xmalloc((size_t)n_tok * n * 2), *got_lo = xmalloc((size_t)n_tok * n * 2);
    float *dx = dup_to_dev(x, (size_t)n_tok * ldx * 4);
    uint16_t *dy = dalloc((size_t)2 * n_tok * n * 2, 0xff);
    tm_err err = {0};
    // aq 0: the split, hi rows at dy, lo rows after them (tm_f32_to_bf16: nearest-even, as _rn)
    size_t far = 0;
    for (uint32_t t = 0; t < n_tok; t++)
        for (uint32_t j = 0; j < n; j++) {
            const float v = x[(size_t)t * ldx + j];
            const uint16_t h = to_bf(v), l = to_bf(v - bf(h));
            ref[(size_t)t * n + j] = h, ref_lo[(size_t)t * n + j] = l;
            far += !(fabs((double)bf(h) + bf(l) - v) <= 0x1p-16 * fabs(v));
        }
    TM_CHECK_MSG(far == 0, "to_bf16 split: the reference's hi + lo is off x by > 2^-16 %zu times",
                 far);
    const tm_k_dsv41_to_bf16_args sa = {.y = dy,
                                        .lo = dy + (size_t)n_tok * n,
                                        .x = dx,
                                        .ldx = ldx,
                                        .n = n,
                                        .n_tok = n_tok,
                                        .aq = 0};
    TM_CHECK(tm_k_dsv41_to_bf16(&sa, g_stream, &err) == TM_OK);
    to_host(got, dy, (size_t)n_tok * n * 2);
    to_host(got_lo, dy + (size_t)n_tok * n, (size_t)n_tok * n * 2);
    check_u16("to_bf16 split: hi", got, ref, (size_t)n_tok * n);
    check_u16("to_bf16 split: lo", got_lo, ref_lo, (size_t)n_tok * n);
    // aq 1: act_quant's values, exact in bf16
    float *q = xmalloc((size_t)n * 4);
    for (uint32_t t = 0; t < n_tok; t++) {
        memcpy(q, x + (size_t)t * ldx, (size_t)n * 4);
        ref_act_quant(q, n);
        for (uint32_t j = 0; j < n; j++)
            ref[(size_t)t * n + j] = to_bf(q[j]);
    }
    const tm_k_dsv41_to_bf16_args qa = {
        .y = dy, .x = dx, .ldx = ldx, .n = n, .n_tok = n_tok, .aq = 1};
    TM_CHECK(tm_k_dsv41_to_bf16(&qa, g_stream, &err) == TM_OK);
    to_host(got, dy, (size_t)n_tok * n * 2);
    check_u16("to_bf16 act_quant", got, ref, (size_t)n_tok * n);
    cudaFree(dx), cudaFree(dy);
    free(x), free(ref), free(ref_lo), free(got), free(got_lo), free(q);
}

static void test_sum_split(void) {
    const uint32_t n_part = 3, n_tok = 4, n_col = 70, ld_y = 100;
    const size_t stride = (size_t)2 * n_tok * n_col + 16;
    float *part = xmalloc(n_part * stride * 4), *y0 = xmalloc((size_t)n_tok * ld_y * 4);
    float *ref = xmalloc((size_t)n_tok * ld_y * 4), *got = xmalloc((size_t)n_tok * ld_y * 4);
    for (size_t i = 0; i < n_part * stride; i++)
        part[i] = frand() * 10.0f;
    for (size_t i = 0; i < (size_t)n_tok * ld_y; i++)
        y0[i] = frand();
    float *dp = dup_to_dev(part, n_part * stride * 4);
    for (int lo = 0; lo <= 1; lo++)
        for (int add = 0; add <= 1; add++) {
            memcpy(ref, y0, (size_t)n_tok * ld_y * 4);
            for (uint32_t t = 0; t < n_tok; t++)
                for (uint32_t j = 0; j < n_col; j++) {
                    float h = 0.0f, l = 0.0f;
                    for (uint32_t p = 0; p < n_part; p++)
                        h += part[p * stride + (size_t)t * n_col + j];
                    for (uint32_t p = 0; lo && p < n_part; p++)
                        l += part[p * stride + (size_t)(n_tok + t) * n_col + j];
                    float *r = ref + (size_t)t * ld_y + j;
                    *r = (add ? *r : 0.0f) + h + l;
                }
            float *dy = dup_to_dev(y0, (size_t)n_tok * ld_y * 4);
            const tm_k_dsv41_sum_split_args a = {.y = dy,
                                                 .ld_y = ld_y,
                                                 .part = dp,
                                                 .stride = stride,
                                                 .n_part = n_part,
                                                 .n_tok = n_tok,
                                                 .n_col = n_col,
                                                 .lo = lo,
                                                 .add = add};
            tm_err err = {0};
            TM_CHECK(tm_k_dsv41_sum_split(&a, g_stream, &err) == TM_OK);
            to_host(got, dy, (size_t)n_tok * ld_y * 4);
            char what[64];
            snprintf(what, sizeof(what), "sum_split lo %d add %d", lo, add);
            check_bits(what, got, ref, (size_t)n_tok * ld_y); // the columns past n_col untouched
            cudaFree(dy);
        }
    cudaFree(dp);
    free(part), free(y0), free(ref), free(got);
}

/* tm_k_dsv41_linear: out[t][o] = x[t / x_div] . w[row0 + o] (+ the expert rows sel[t]) against a
 * double sum on the host, rounded to fp32 (the GPU sums in another order, so the two may differ by
 * one fp32 rounding: |d| <= 2^-22 |out| + 1e-30). Shapes on both launches: the warp per output
 * (many outputs) and the block per output (few outputs over rows of >= 2048: the hyper-connection
 * projections), fp32 and bf16 weights, strided rows, x_div, sel. */
static void linear_case(uint32_t n_tok, uint32_t n_in, uint32_t n_out, int bf16, uint32_t x_div,
                        int with_sel) {
    const uint32_t ldx = n_in + 3, ldo = n_out + 5, n_x = (n_tok + x_div - 1) / x_div, n_exp = 3;
    const uint64_t row0 = 2, n_rows = row0 + n_out;
    const size_t w_expert = with_sel ? (size_t)n_rows * n_in : 0;
    const size_t n_w = (size_t)n_rows * n_in * (with_sel ? n_exp : 1);
    float *x = xmalloc((size_t)n_x * ldx * 4), *wf = xmalloc(n_w * 4);
    uint16_t *wb = xmalloc(n_w * 2);
    uint32_t *sel = xmalloc((size_t)n_tok * 4);
    for (size_t i = 0; i < (size_t)n_x * ldx; i++)
        x[i] = frand();
    for (size_t i = 0; i < n_w; i++) {
        wf[i] = frand() / 32.0f;
        uint32_t u;
        memcpy(&u, &wf[i], 4);
        wb[i] = (uint16_t)(u >> 16); // truncated: an exact bf16
        if (bf16) {
            u &= 0xffff0000u;
            memcpy(&wf[i], &u, 4);
        }
    }
    for (uint32_t t = 0; t < n_tok; t++)
        sel[t] = (t * 7 + 1) % n_exp;
    float *ref = xmalloc((size_t)n_tok * ldo * 4), *got = xmalloc((size_t)n_tok * ldo * 4);
    for (size_t i = 0; i < (size_t)n_tok * ldo; i++)
        ref[i] = -7.0f; // untouched past n_out
    for (uint32_t t = 0; t < n_tok; t++)
        for (uint32_t o = 0; o < n_out; o++) {
            const float *xr = x + (size_t)(t / x_div) * ldx;
            const float *wr = wf + (size_t)(row0 + o) * n_in + (with_sel ? sel[t] * w_expert : 0);
            double acc = 0.0;
            for (uint32_t i = 0; i < n_in; i++)
                acc += (double)xr[i] * wr[i];
            ref[(size_t)t * ldo + o] = (float)acc;
        }
    for (size_t i = 0; i < (size_t)n_tok * ldo; i++) // NaN where the GPU must write
        got[i] = i % ldo < n_out ? NAN : ref[i];
    float *dx = dup_to_dev(x, (size_t)n_x * ldx * 4),
          *dout = dup_to_dev(got, (size_t)n_tok * ldo * 4);
    void *dw = bf16 ? (void *)dup_to_dev(wb, n_w * 2) : (void *)dup_to_dev(wf, n_w * 4);
    uint32_t *dsel = with_sel ? dup_to_dev(sel, (size_t)n_tok * 4) : NULL;
    const tm_k_dsv41_linear_args a = {.out = dout,
                                      .x = dx,
                                      .w = dw,
                                      .sel = dsel,
                                      .w_expert = w_expert,
                                      .row0 = row0,
                                      .ldo = ldo,
                                      .ldx = ldx,
                                      .n_tok = n_tok,
                                      .n_in = n_in,
                                      .n_out = n_out,
                                      .x_div = x_div,
                                      .w_bf16 = bf16};
    tm_err err = {0};
    TM_CHECK(tm_k_dsv41_linear(&a, g_stream, &err) == TM_OK);
    to_host(got, dout, (size_t)n_tok * ldo * 4);
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < (size_t)n_tok * ldo; i++) {
        const float d = fabsf(got[i] - ref[i]);
        if (!(d <= ldexpf(fabsf(ref[i]), -22) + 1e-30f) && bad++ == 0)
            first = i;
    }
    TM_CHECK_MSG(bad == 0,
                 "linear T %u in %u out %u bf16 %d x_div %u sel %d: %zu of %zu off, first at %zu: "
                 "gpu %.9g ref %.9g",
                 n_tok, n_in, n_out, bf16, x_div, with_sel, bad, (size_t)n_tok * ldo, first,
                 got[first], ref[first]);
    cudaFree(dx), cudaFree(dout), cudaFree(dw);
    if (dsel)
        cudaFree(dsel);
    free(x), free(wf), free(wb), free(sel), free(ref), free(got);
}

static void test_linear(void) {
    linear_case(3, 256, 1500, 1, 1, 0);  /* a warp per output */
    linear_case(1, 16384, 24, 0, 1, 0);  /* a block per output: hc mixes at batch 1 */
    linear_case(8, 16384, 24, 0, 1, 0);  /* the same at batch 8 */
    linear_case(1, 4096, 384, 0, 1, 0);  /* the router at batch 1 */
    linear_case(6, 2048, 100, 1, 3, 1);  /* block, bf16, x_div, expert rows */
    linear_case(12, 2048, 200, 1, 2, 1); /* warp (2400 rows), the same */
    /* the released shapes: hc mixes (24 of 4 x 5120 fp32) at batch 8, the router (384 of 5120)
     * at batch 8, and expert rows of a step past grid y's 65535 (T x top-k: 11000 x 6) */
    linear_case(8, 20480, 24, 0, 1, 0);
    linear_case(8, 5120, 384, 1, 1, 0);
    linear_case(66000, 64, 3, 1, 6, 1);
}

/* The indexer's scores (tm_k_dsv41_index_scores) against a host double sum: tokens of one or two
 * sequences at positions up to pos_max in a paged state (blocks of bs, shuffled block table),
 * compression ratio r, keys in a field of stride kld; lens[t] = (pos + 1) / r; entries past lens
 * untouched. The kernel's grid is capped (a few thousand blocks over the step's tokens) and its
 * warps loop over the positions: the long rows here take several passes. */
static void iscore_case(uint32_t n_tok, uint32_t pos_max, uint32_t r, uint32_t Hi, uint32_t di) {
    const uint32_t bs = 64, kld = di + 5, n_blk = pos_max / bs + 1;
    const size_t ld = pos_max / r + 1;
    uint32_t *pos = xmalloc(n_tok * 4), *tseq = xmalloc(n_tok * 4), seq_bt[2] = {0, n_blk};
    uint32_t *bt = xmalloc((size_t)2 * n_blk * 4);
    for (uint32_t t = 0; t < n_tok; t++) {
        pos[t] = t == 0 ? pos_max : t == 1 ? 0 : urand(pos_max + 1);
        tseq[t] = t % 2;
    }
    uint32_t *perm = shuffled(2 * n_blk); /* both sequences' blocks, shuffled */
    memcpy(bt, perm, (size_t)2 * n_blk * 4);
    free(perm);
    const size_t n_slot = (size_t)2 * n_blk * bs;
    float *keys = xmalloc(n_slot * kld * 4), *q = xmalloc((size_t)n_tok * Hi * di * 4);
    float *w = xmalloc((size_t)n_tok * Hi * 4);
    for (size_t i = 0; i < n_slot * kld; i++)
        keys[i] = frand();
    for (size_t i = 0; i < (size_t)n_tok * Hi * di; i++)
        q[i] = frand();
    for (size_t i = 0; i < (size_t)n_tok * Hi; i++)
        w[i] = frand();
    const double iscale = 1.0 / sqrt((double)di * Hi);
    float *ref = xmalloc((size_t)n_tok * ld * 4), *got = xmalloc((size_t)n_tok * ld * 4);
    for (uint32_t t = 0; t < n_tok; t++) {
        const uint32_t lens = (pos[t] + 1) / r;
        for (size_t k = 0; k < ld; k++) {
            ref[t * ld + k] = -5.0f; /* untouched */
            if (k >= lens)
                continue;
            const uint32_t p = (uint32_t)k * r;
            const size_t slot = (size_t)bt[seq_bt[tseq[t]] + p / bs] * bs + p % bs;
            const float *key = keys + slot * kld;
            double acc = 0.0;
            for (uint32_t h = 0; h < Hi; h++) {
                double d = 0.0;
                for (uint32_t i = 0; i < di; i++)
                    d += (double)q[((size_t)t * Hi + h) * di + i] * key[i];
                acc += (d > 0.0 ? d : 0.0) * ((double)w[(size_t)t * Hi + h] * iscale);
            }
            ref[t * ld + k] = (float)acc;
        }
    }
    for (size_t i = 0; i < (size_t)n_tok * ld; i++)
        got[i] = -5.0f;
    float *d_sc = dup_to_dev(got, (size_t)n_tok * ld * 4),
          *d_keys = dup_to_dev(keys, n_slot * kld * 4);
    float *d_q = dup_to_dev(q, (size_t)n_tok * Hi * di * 4),
          *d_w = dup_to_dev(w, (size_t)n_tok * Hi * 4);
    uint32_t *d_pos = dup_to_dev(pos, n_tok * 4), *d_tseq = dup_to_dev(tseq, n_tok * 4);
    uint32_t *d_sbt = dup_to_dev(seq_bt, 8), *d_bt = dup_to_dev(bt, (size_t)2 * n_blk * 4);
    uint32_t *d_lens = dalloc(n_tok * 4, 0xff), *lens = xmalloc(n_tok * 4);
    const tm_k_dsv41_seqs sq = {
        .pos = d_pos, .tok_seq = d_tseq, .seq_bt = d_sbt, .block_tables = d_bt, .bs = bs};
    const tm_k_dsv41_iscore_args a = {.score = d_sc,
                                      .lens = d_lens,
                                      .q = d_q,
                                      .w = d_w,
                                      .key_field = d_keys,
                                      .ld = ld,
                                      .iscale = iscale,
                                      .kld = kld,
                                      .Hi = Hi,
                                      .di = di,
                                      .r = r,
                                      .n_tok = n_tok};
    tm_err err = {0};
    TM_CHECK(tm_k_dsv41_index_scores(&a, &sq, g_stream, &err) == TM_OK);
    to_host(got, d_sc, (size_t)n_tok * ld * 4);
    to_host(lens, d_lens, n_tok * 4);
    for (uint32_t t = 0; t < n_tok; t++)
        TM_CHECK_MSG(lens[t] == (pos[t] + 1) / r, "iscore token %u: lens %u, want %u", t, lens[t],
                     (pos[t] + 1) / r);
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < (size_t)n_tok * ld; i++) { // (1e-9: a sum that cancels to ~0)
        const float d = fabsf(got[i] - ref[i]);
        if (!(d <= ldexpf(fabsf(ref[i]), -22) + 1e-9f) && bad++ == 0)
            first = i;
    }
    TM_CHECK_MSG(bad == 0,
                 "iscore T %u pos_max %u r %u Hi %u di %u: %zu of %zu off, first token %zu "
                 "position %zu: gpu %.9g ref %.9g",
                 n_tok, pos_max, r, Hi, di, bad, (size_t)n_tok * ld, first / ld, first % ld,
                 got[first], ref[first]);
    cudaFree(d_sc), cudaFree(d_keys), cudaFree(d_q), cudaFree(d_w), cudaFree(d_pos);
    cudaFree(d_tseq), cudaFree(d_sbt), cudaFree(d_bt), cudaFree(d_lens);
    free(pos), free(tseq), free(bt), free(keys), free(q), free(w), free(ref), free(got), free(lens);
}

/* The released indexer: 32 heads x 128; rows of 70000 positions (ratio 1: 8750 blocks of 8
 * positions wanted, the grid holds fewer), ratio 2, and a prefill-sized step. */
static void test_index_scores(void) {
    iscore_case(3, 69999, 1, 32, 128);
    iscore_case(4, 9000, 2, 32, 128);
    iscore_case(600, 700, 1, 4, 64);
}

/* The MoE pairs in expert order (tm_k_dsv41_pair_sort) against a host stable counting sort: n_pair
 * pairs of K per token over n_exp experts (ids drawn at random, some experts unused), every output
 * equal. */
static void sort_case(uint32_t n_pair, uint32_t n_exp, uint32_t K) {
    uint32_t *sel = xmalloc(n_pair * 4), *perm = xmalloc(n_pair * 4), *prow = xmalloc(n_pair * 4);
    uint32_t *inv = xmalloc(n_pair * 4), *start = xmalloc((n_exp + 1) * 4);
    int32_t *sexp = xmalloc(n_pair * 4);
    float *w = xmalloc(n_pair * 4), *wq = xmalloc(n_pair * 4);
    for (uint32_t p = 0; p < n_pair; p++) {
        sel[p] = urand(n_exp > 3 ? n_exp - n_exp / 4 : n_exp); // the top quarter unused
        w[p] = frand();
    }
    memset(start, 0, (n_exp + 1) * 4);
    for (uint32_t p = 0; p < n_pair; p++)
        start[sel[p] + 1]++;
    for (uint32_t e = 0; e < n_exp; e++)
        start[e + 1] += start[e];
    uint32_t *d_sel = dup_to_dev(sel, n_pair * 4), *d_perm = dalloc(n_pair * 4, 0xff);
    uint32_t *d_prow = dalloc(n_pair * 4, 0xff), *d_inv = dalloc(n_pair * 4, 0xff);
    int32_t *d_sexp = dalloc(n_pair * 4, 0xff);
    float *d_w = dup_to_dev(w, n_pair * 4), *d_wq = dalloc(n_pair * 4, 0xff);
    const tm_k_dsv41_pair_sort_args a = {.sel = d_sel,
                                         .w = d_w,
                                         .perm = d_perm,
                                         .prow = d_prow,
                                         .inv = d_inv,
                                         .sexp = d_sexp,
                                         .wq = d_wq,
                                         .n_pair = n_pair,
                                         .n_expert = n_exp,
                                         .K = K};
    tm_err err = {0};
    TM_CHECK(tm_k_dsv41_pair_sort(&a, g_stream, &err) == TM_OK);
    to_host(perm, d_perm, n_pair * 4);
    to_host(prow, d_prow, n_pair * 4);
    to_host(inv, d_inv, n_pair * 4);
    to_host(sexp, d_sexp, n_pair * 4);
    to_host(wq, d_wq, n_pair * 4);
    uint32_t bad = 0, first = n_pair;
    for (uint32_t p = 0; p < n_pair; p++) { // stable: pair p at start[e] + its rank in e
        const uint32_t q = start[sel[p]]++;
        const int ok = perm[q] == p && sexp[q] == (int32_t)sel[p] && prow[q] == p / K &&
                       memcmp(&wq[q], &w[p], 4) == 0 && inv[p] == q;
        if (!ok && bad++ == 0)
            first = p;
    }
    TM_CHECK_MSG(bad == 0,
                 "pair sort %u pairs, %u experts, K %u: %u pairs wrong, first pair %u (expert "
                 "%u): perm/sexp/prow/inv at its place %u %d %u %u",
                 n_pair, n_exp, K, bad, first, first < n_pair ? sel[first] : 0,
                 first < n_pair ? perm[inv[first] % n_pair] : 0,
                 first < n_pair ? sexp[inv[first] % n_pair] : 0,
                 first < n_pair ? prow[inv[first] % n_pair] : 0, first < n_pair ? inv[first] : 0);
    cudaFree(d_sel), cudaFree(d_perm), cudaFree(d_prow), cudaFree(d_inv), cudaFree(d_sexp);
    cudaFree(d_w), cudaFree(d_wq);
    free(sel), free(perm), free(prow), free(inv), free(start), free(sexp), free(w), free(wq);
}

/* A prefill step of 4096 tokens x top 6 of the released 384 experts (6 tiles of sel), the most
 * experts, one expert, and a partial tile. */
static void test_pair_sort(void) {
    sort_case(4096 * 6, 384, 6);
    sort_case(5000, 2048, 4);
    sort_case(3, 1, 1);
    sort_case(4097, 7, 1);
}

static void test_select(void) {
    for (uint32_t mode = 0; mode <= 2; mode++) {
        sel_case(9, 300, mode, 8, 4, 16);
        sel_case(5, 37, mode, 4, 3, 64); /* topk above every lens */
        sel_case(3, 70000, mode, 64, 16, 2048);
        /* released shapes: blocks of 8, 2048 of them kept (2500 reachable), top 512 */
        sel_case(4, 20000, mode, 8, 2048, 512);
    }
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
    TM_RUN(test_select);
    TM_RUN(test_to_bf16);
    TM_RUN(test_sum_split);
    TM_RUN(test_linear);
    TM_RUN(test_index_scores);
    TM_RUN(test_pair_sort);
    cudaStreamDestroy(g_stream);
    return tm_test_report();
}

#endif /* TM_HAVE_CUDA */
