/* tests/gpu/test_dsv41_ops.c - three DeepSeek-V4.1 forward kernels of kernels/dsv41.h whose work
 * is split across a block's threads (the router, the hyper-connection split, the sparse
 * attention) against host references, at the released V4.1-Flash shapes and at small ones:
 * - tm_k_dsv41_route: 384 experts top 6 (sqrtsoftplus + bias), 256 top 8 (softmax), 64 top 1
 *   (sigmoid), 4096 (the most a block takes) and 4097 (refused with TM_E_INVAL); logits with
 *   exact duplicates, so that ties are decided by the lower id. Host reference from the
 *   definition (scores in double rounded to fp32, the softmax's denominator summed in id order,
 *   a stable sort of score + bias): the same experts in the same order, scores and weights equal
 *   bit for bit.
 * - tm_k_dsv41_hc_split: hc 4 and 8 over rows of 5120 and 64 values; the streams hold multiples
 *   of 2^-6 below 4, so the sum of squares is exact in any order and the kernel's rms equals the
 *   host's; then pre / post / comb against dsv41_ref_hc_split (dsv41_ref.h: the split's fp32
 * operations in the CPU engine's order, each exp as exp in double rounded to fp32) bit for bit, and
 * against the CPU engine's tm_dsv_hc_split (dsv_common.h, expf: one ulp apart now and then) to
 * 1e-5.
 * - tm_k_dsv41_attn: 64 heads x 512 (rope 64), window 128, top 512 compressed rows of ratio 1 and
 *   2, tokens at positions below and beyond the window, paged rows in shuffled blocks; and a
 *   window-only case (r 0). Host reference in double in the kernel's order: |gpu - ref| <= 1e-6 x
 *   (the row's max |ref| + 1e-6).
 * The harness and references were checked on the host by linking this file against the
 * emulator's host kernels (bench/dsv41_emu/emu_kernels.c; all pass but the 4097-expert refusal,
 * which the emulator does not make).
 * Skipped (77) without a GPU or in a build without CUDA. Written when no GPU was lent: not run
 * yet (docs/deepseek_v41.md "CUDA"). */
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
#include "dsv41_ref.h"
#include "tm_gpu_test.h"

/* ---- the router ---- */

static const float *g_sort_v;
static int by_value_then_id(const void *a, const void *b) {
    const uint32_t i = *(const uint32_t *)a, j = *(const uint32_t *)b;
    if (g_sort_v[i] != g_sort_v[j])
        return g_sort_v[i] > g_sort_v[j] ? -1 : 1;
    return i < j ? -1 : 1;
}

static void route_case(uint32_t T, uint32_t E, uint32_t K, uint32_t func, int bias_on, int norm,
                       float temp, float rs) {
    const size_t n = (size_t)T * E;
    float *lg = xmalloc(n * 4), *bias = xmalloc((size_t)E * 4), *sc = xmalloc(n * 4);
    for (size_t i = 0; i < n; i++) // every fifth logit repeats an earlier one of its row: ties
        lg[i] = (i % E) > 8 && urand(5) == 0 ? lg[i - 1 - urand(8)] : 4.0f * frand();
    for (uint32_t e = 0; e < E; e++)
        bias[e] = e > 0 && urand(4) == 0 ? bias[e - 1] : 0.05f * frand();
    uint32_t *rsel = xmalloc((size_t)T * K * 4), *ids = xmalloc((size_t)E * 4);
    float *rw = xmalloc((size_t)T * K * 4), *v = xmalloc((size_t)E * 4);
    for (uint32_t t = 0; t < T; t++) {
        const float *l = lg + (size_t)t * E;
        float *s = sc + (size_t)t * E;
        if (func == TM_DSV41_K_SCORE_SOFTMAX) {
            double mx = -INFINITY, den = 0.0;
            for (uint32_t e = 0; e < E; e++)
                mx = fmax(mx, (double)l[e] / temp);
            for (uint32_t e = 0; e < E; e++)
                den += exp((double)l[e] / temp - mx);
            for (uint32_t e = 0; e < E; e++)
                s[e] = (float)(exp((double)l[e] / temp - mx) / den);
        } else
            for (uint32_t e = 0; e < E; e++) {
                const double z = (double)l[e] / temp;
                s[e] = func == TM_DSV41_K_SCORE_SIGMOID ? (float)(1.0 / (1.0 + exp(-z)))
                                                        : (float)sqrt(z > 20.0 ? z : log1p(exp(z)));
            }
        for (uint32_t e = 0; e < E; e++) {
            v[e] = s[e] + (bias_on ? bias[e] : 0.0f);
            ids[e] = e;
        }
        g_sort_v = v;
        qsort(ids, E, 4, by_value_then_id);
        double sum = 0.0;
        for (uint32_t k = 0; k < K; k++) {
            rsel[t * K + k] = ids[k];
            sum += (double)s[ids[k]];
        }
        for (uint32_t k = 0; k < K; k++) {
            double wv = s[ids[k]];
            if (norm && K > 1)
                wv = wv / (sum + 1e-20);
            rw[t * K + k] = (float)(wv * rs);
        }
    }
    float *dl = dup_to_dev(lg, n * 4), *db = dup_to_dev(bias, (size_t)E * 4);
    uint32_t *dsel = dalloc((size_t)T * K * 4, 0xff);
    float *dw = dalloc((size_t)T * K * 4, 0xff);
    const tm_k_dsv41_route_args a = {.logits = dl,
                                     .bias = bias_on ? db : NULL,
                                     .sel = dsel,
                                     .weight = dw,
                                     .n_tok = T,
                                     .E = E,
                                     .K = K,
                                     .score_func = func,
                                     .norm_topk = (uint32_t)norm,
                                     .gate_temp = temp,
                                     .route_scale = rs};
    tm_err err = {0};
    const tm_rc rc = tm_k_dsv41_route(&a, g_stream, &err);
    TM_CHECK_MSG(rc == TM_OK, "route E %u: %s", E, err.msg);
    if (rc == TM_OK) {
        uint32_t *gsel = xmalloc((size_t)T * K * 4);
        float *gw = xmalloc((size_t)T * K * 4), *gs = xmalloc(n * 4);
        to_host(gsel, dsel, (size_t)T * K * 4);
        to_host(gw, dw, (size_t)T * K * 4);
        to_host(gs, dl, n * 4);
        size_t bad = 0, first = 0;
        for (size_t i = 0; i < (size_t)T * K; i++)
            if (gsel[i] != rsel[i] && !bad++)
                first = i;
        TM_CHECK_MSG(!bad,
                     "route T %u E %u K %u func %u: %zu picks differ, first token %zu slot %zu: "
                     "gpu %u ref %u",
                     T, E, K, func, bad, first / K, first % K, gsel[first], rsel[first]);
        char what[96];
        snprintf(what, sizeof(what), "route T %u E %u K %u func %u: scores", T, E, K, func);
        check_bits(what, gs, sc, n);
        snprintf(what, sizeof(what), "route T %u E %u K %u func %u: weights", T, E, K, func);
        check_bits(what, gw, rw, (size_t)T * K);
        free(gsel), free(gw), free(gs);
    }
    cudaFree(dl), cudaFree(db), cudaFree(dsel), cudaFree(dw);
    free(lg), free(bias), free(sc), free(rsel), free(ids), free(rw), free(v);
}

static void test_route(void) {
    route_case(1, 384, 6, TM_DSV41_K_SCORE_SQRTSOFTPLUS, 1, 1, 1.0f, 1.5f); /* V4.1-Flash */
    route_case(8, 384, 6, TM_DSV41_K_SCORE_SQRTSOFTPLUS, 1, 1, 1.0f, 1.5f);
    route_case(300, 384, 6, TM_DSV41_K_SCORE_SQRTSOFTPLUS, 1, 1, 1.0f, 1.5f); /* a prefill */
    route_case(5, 256, 8, TM_DSV41_K_SCORE_SOFTMAX, 0, 1, 0.7f, 2.5f);
    route_case(3, 64, 1, TM_DSV41_K_SCORE_SIGMOID, 1, 1, 1.0f, 1.0f);
    route_case(2, 100, 7, TM_DSV41_K_SCORE_SQRTSOFTPLUS, 0, 0, 1.3f, 1.0f); /* not normalised */
    route_case(2, 4096, 6, TM_DSV41_K_SCORE_SOFTMAX, 1, 1, 1.0f, 1.0f);     /* the most */
    // one more expert than a block takes: refused, nothing launched
    tm_err err = {0};
    const tm_k_dsv41_route_args a = {.logits = (float *)8,
                                     .sel = (uint32_t *)8,
                                     .weight = (float *)8,
                                     .n_tok = 1,
                                     .E = 4097,
                                     .K = 6,
                                     .gate_temp = 1.0f,
                                     .route_scale = 1.0f};
    TM_CHECK(tm_k_dsv41_route(&a, g_stream, &err) == TM_E_INVAL);
    TM_CHECK_MSG(strstr(err.msg, "4097") != NULL, "route refusal names the count: %s", err.msg);
}

/* ---- the hyper-connection split ---- */

/* |a - b| <= tol * (|b| + 1e-6) everywhere. */
static void check_close(const char *what, const float *a, const float *b, size_t n, double tol) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (!(fabs((double)a[i] - b[i]) <= tol * (fabs(b[i]) + 1e-6)) && !bad++)
            first = i;
    TM_CHECK_MSG(!bad, "%s: %zu of %zu beyond %.1g, first at %zu: %.9g vs %.9g", what, bad, n, tol,
                 first, n ? a[first] : 0.0f, n ? b[first] : 0.0f);
}

static void hc_case(uint32_t T, uint32_t N, uint32_t D, uint32_t iters) {
    const uint32_t mix = (2 + N) * N;
    const size_t ns = (size_t)T * N * D;
    float *st = xmalloc(ns * 4), *mx = xmalloc((size_t)T * mix * 4), scale[3],
          *base = xmalloc(mix * 4);
    for (size_t i = 0; i < ns; i++) // multiples of 2^-6 in (-4, 4): squares and sums exact
        st[i] = (float)((int)urand(511) - 255) * 0x1p-6f;
    for (size_t i = 0; i < (size_t)T * mix; i++)
        mx[i] = 30.0f * frand();
    for (int i = 0; i < 3; i++)
        scale[i] = 0.5f + 0.5f * frand();
    for (uint32_t i = 0; i < mix; i++)
        base[i] = frand();
    const float norm_eps = 1e-6f, hc_eps = 1e-6f;
    float *rpre = xmalloc((size_t)T * N * 4), *rpost = xmalloc((size_t)T * N * 4),
          *rcomb = xmalloc((size_t)T * N * N * 4), m[(2 + TM_DSV41_K_MAX_HC) * TM_DSV41_K_MAX_HC];
    for (uint32_t t = 0; t < T; t++) {
        double ss = 0.0;
        for (size_t i = 0; i < (size_t)N * D; i++)
            ss += (double)st[t * N * D + i] * st[t * N * D + i];
        const double r = 1.0 / sqrt(ss / (N * D) + (double)norm_eps);
        for (uint32_t i = 0; i < mix; i++)
            m[i] = (float)((double)mx[(size_t)t * mix + i] * r);
        dsv41_ref_hc_split(m, scale, base, N, iters, hc_eps, rpre + t * N, rpost + t * N,
                           rcomb + (size_t)t * N * N);
        float cpre[TM_DSV41_K_MAX_HC], cpost[TM_DSV41_K_MAX_HC],
            ccomb[TM_DSV41_K_MAX_HC * TM_DSV41_K_MAX_HC]; // the CPU engine's
        tm_dsv_hc_split(m, scale, base, N, iters, hc_eps, cpre, cpost, ccomb);
        check_close("hc_split reference vs the CPU engine: pre", rpre + t * N, cpre, N, 1e-5);
        check_close("hc_split reference vs the CPU engine: post", rpost + t * N, cpost, N, 1e-5);
        check_close("hc_split reference vs the CPU engine: comb", rcomb + (size_t)t * N * N, ccomb,
                    (size_t)N * N, 1e-5);
    }
    float *dst = dup_to_dev(st, ns * 4), *dmx = dup_to_dev(mx, (size_t)T * mix * 4);
    float *dsc = dup_to_dev(scale, 12), *dbs = dup_to_dev(base, mix * 4);
    float *dpre = dalloc((size_t)T * N * 4, 0xff), *dpost = dalloc((size_t)T * N * 4, 0xff),
          *dcomb = dalloc((size_t)T * N * N * 4, 0xff);
    const tm_k_dsv41_hc_split_args a = {.mixes = dmx,
                                        .streams = dst,
                                        .scale = dsc,
                                        .base = dbs,
                                        .pre = dpre,
                                        .post = dpost,
                                        .comb = dcomb,
                                        .n_tok = T,
                                        .N = N,
                                        .D = D,
                                        .iters = iters,
                                        .norm_eps = norm_eps,
                                        .hc_eps = hc_eps};
    tm_err err = {0};
    TM_CHECK_MSG(tm_k_dsv41_hc_split(&a, g_stream, &err) == TM_OK, "hc_split: %s", err.msg);
    float *g = xmalloc((size_t)T * N * N * 4);
    char what[80];
    to_host(g, dpre, (size_t)T * N * 4);
    snprintf(what, sizeof(what), "hc_split T %u N %u D %u: pre", T, N, D);
    check_bits(what, g, rpre, (size_t)T * N);
    to_host(g, dpost, (size_t)T * N * 4);
    snprintf(what, sizeof(what), "hc_split T %u N %u D %u: post", T, N, D);
    check_bits(what, g, rpost, (size_t)T * N);
    to_host(g, dcomb, (size_t)T * N * N * 4);
    snprintf(what, sizeof(what), "hc_split T %u N %u D %u: comb", T, N, D);
    check_bits(what, g, rcomb, (size_t)T * N * N);
    cudaFree(dst), cudaFree(dmx), cudaFree(dsc), cudaFree(dbs), cudaFree(dpre), cudaFree(dpost),
        cudaFree(dcomb);
    free(st), free(mx), free(base), free(rpre), free(rpost), free(rcomb), free(g);
}

static void test_hc_split(void) {
    hc_case(1, 4, 5120, 20); /* V4.1-Flash at batch 1 */
    hc_case(8, 4, 5120, 20);
    hc_case(5, 8, 64, 20); /* the most streams */
    hc_case(3, 2, 64, 1);  /* one Sinkhorn iteration: columns only */
    hc_case(2, 1, 64, 3);
}

/* ---- the sparse attention ---- */

/* T tokens, each its own sequence at position pos[t], rows paged in blocks of bs (shuffled); the
 * window field and the compressed field share the slot layout (row of position k r at its slot). */
static void attn_case(uint32_t T, const uint32_t *pos, uint32_t H, uint32_t hd, uint32_t rd,
                      uint32_t r, uint32_t window, uint32_t topk) {
    const uint32_t bs = 16, per_seq = (pos[0] + 1 + bs - 1) / bs; // pos[0] is the largest
    const uint32_t n_blk = T * per_seq, n_slot = n_blk * bs, wld = hd + 8, cld = hd + 4;
    float *win = xmalloc((size_t)n_slot * wld * 4), *comp = xmalloc((size_t)n_slot * cld * 4);
    for (size_t i = 0; i < (size_t)n_slot * wld; i++)
        win[i] = frand();
    for (size_t i = 0; i < (size_t)n_slot * cld; i++)
        comp[i] = frand();
    uint32_t *bt = shuffled(n_blk), *tok_seq = xmalloc(T * 4), *seq_bt = xmalloc(T * 4);
    for (uint32_t t = 0; t < T; t++)
        tok_seq[t] = t, seq_bt[t] = t * per_seq;
    float *qv = xmalloc((size_t)T * H * hd * 4), *sinks = xmalloc(H * 4), inv[64];
    for (size_t i = 0; i < (size_t)T * H * hd; i++)
        qv[i] = 3.0f * frand();
    for (uint32_t h = 0; h < H; h++)
        sinks[h] = frand();
    for (uint32_t i = 0; i < rd / 2; i++)
        inv[i] = powf(10000.0f, -2.0f * (float)i / (float)rd);
    int32_t *pick = xmalloc((size_t)T * topk * 4);
    uint32_t *n_pick = xmalloc(T * 4);
    for (uint32_t t = 0; t < T; t++) { // distinct compressed positions below (pos + 1) / r
        const uint32_t lens = r ? (pos[t] + 1) / r : 0, m = lens < topk ? lens : topk;
        uint32_t *perm = shuffled(lens ? lens : 1);
        for (uint32_t i = 0; i < m; i++)
            pick[(size_t)t * topk + i] = (int32_t)perm[i];
        n_pick[t] = m;
        free(perm);
    }
    // the host reference, in double in the kernel's order
    float *ref = xmalloc((size_t)T * H * hd * 4);
    double *sc = xmalloc((size_t)(window + topk) * 8), *ob = xmalloc((size_t)hd * 8);
    const float **rows = xmalloc((size_t)(window + topk) * sizeof(float *));
    for (uint32_t t = 0; t < T; t++) {
        const uint32_t p = pos[t], p0 = p + 1 > window ? p + 1 - window : 0, n_w = p + 1 - p0;
        const uint32_t n = n_w + (r ? n_pick[t] : 0);
        for (uint32_t i = 0; i < n; i++) {
            const uint32_t pp = i < n_w ? p0 + i : (uint32_t)pick[(size_t)t * topk + i - n_w] * r;
            const size_t slot = (size_t)bt[seq_bt[t] + pp / bs] * bs + pp % bs;
            rows[i] = i < n_w ? win + slot * wld : comp + slot * cld;
        }
        for (uint32_t h = 0; h < H; h++) {
            const float *qh = qv + ((size_t)t * H + h) * hd;
            double mx = sinks[h];
            for (uint32_t i = 0; i < n; i++) {
                double d = 0.0;
                for (uint32_t k = 0; k < hd; k++)
                    d += (double)qh[k] * rows[i][k];
                sc[i] = d * pow((double)hd, -0.5);
                mx = fmax(mx, sc[i]);
            }
            double den = exp((double)sinks[h] - mx);
            for (uint32_t i = 0; i < n; i++) {
                sc[i] = exp(sc[i] - mx);
                den += sc[i];
            }
            float *o = ref + ((size_t)t * H + h) * hd;
            for (uint32_t k = 0; k < hd; k++) {
                double acc = 0.0;
                for (uint32_t i = 0; i < n; i++)
                    acc += sc[i] * rows[i][k];
                o[k] = (float)(acc / den);
            }
            for (uint32_t i = 0; i < rd / 2; i++) { // the rope slice rotated back
                const double ang = (double)((float)p * inv[i]);
                const double c = (float)cos(ang), s = -(double)(float)sin(ang);
                const uint32_t a0 = hd - rd + 2 * i;
                const double x0 = o[a0], x1 = o[a0 + 1];
                o[a0] = (float)(x0 * c - x1 * s);
                o[a0 + 1] = (float)(x1 * c + x0 * s);
            }
        }
    }
    uint32_t *dpos = dup_to_dev(pos, T * 4), *dts = dup_to_dev(tok_seq, T * 4),
             *dsb = dup_to_dev(seq_bt, T * 4), *dbt = dup_to_dev(bt, n_blk * 4),
             *dnp = dup_to_dev(n_pick, T * 4);
    float *dwin = dup_to_dev(win, (size_t)n_slot * wld * 4),
          *dcomp = dup_to_dev(comp, (size_t)n_slot * cld * 4),
          *dq = dup_to_dev(qv, (size_t)T * H * hd * 4), *dsk = dup_to_dev(sinks, H * 4),
          *dinv = dup_to_dev(inv, sizeof(inv)), *dout = dalloc((size_t)T * H * hd * 4, 0xff);
    int32_t *dpk = dup_to_dev(pick, (size_t)T * topk * 4);
    const tm_k_dsv41_seqs q = {
        .pos = dpos, .tok_seq = dts, .seq_bt = dsb, .block_tables = dbt, .bs = bs};
    const tm_k_dsv41_attn_args a = {.o = dout,
                                    .q = dq,
                                    .win = dwin,
                                    .comp = r ? dcomp : NULL,
                                    .pick = r ? dpk : NULL,
                                    .n_pick = r ? dnp : NULL,
                                    .sinks = dsk,
                                    .inv_freq = dinv,
                                    .wld = wld,
                                    .cld = cld,
                                    .H = H,
                                    .hd = hd,
                                    .rd = rd,
                                    .r = r,
                                    .window = window,
                                    .topk = topk,
                                    .n_tok = T};
    tm_err err = {0};
    TM_CHECK_MSG(tm_k_dsv41_attn(&a, &q, g_stream, &err) == TM_OK, "attn: %s", err.msg);
    float *got = xmalloc((size_t)T * H * hd * 4);
    to_host(got, dout, (size_t)T * H * hd * 4);
    size_t bad = 0, first = 0;
    double worst = 0.0;
    for (size_t row = 0; row < (size_t)T * H; row++) {
        double amax = 0.0;
        for (uint32_t k = 0; k < hd; k++)
            amax = fmax(amax, fabs(ref[row * hd + k]));
        for (uint32_t k = 0; k < hd; k++) {
            const double e = fabs((double)got[row * hd + k] - ref[row * hd + k]) / (amax + 1e-6);
            worst = fmax(worst, e);
            if (!(e <= 1e-6) && !bad++)
                first = row * hd + k;
        }
    }
    TM_CHECK_MSG(!bad,
                 "attn T %u H %u hd %u r %u window %u topk %u: %zu values off (worst %.3g of the "
                 "row max), first token %zu head %zu dim %zu: gpu %.9g ref %.9g",
                 T, H, hd, r, window, topk, bad, worst, first / (H * hd), first / hd % H,
                 first % hd, got[first], ref[first]);
    printf("  attn T %u H %u hd %u r %u window %u topk %u: worst |gpu - ref| %.3g of the row max\n",
           T, H, hd, r, window, topk, worst);
    cudaFree(dpos), cudaFree(dts), cudaFree(dsb), cudaFree(dbt), cudaFree(dnp), cudaFree(dwin),
        cudaFree(dcomp), cudaFree(dq), cudaFree(dsk), cudaFree(dinv), cudaFree(dout), cudaFree(dpk);
    free(win), free(comp), free(bt), free(tok_seq), free(seq_bt), free(qv), free(sinks), free(pick),
        free(n_pick), free(ref), free(sc), free(ob), free(rows), free(got);
}

static void test_attn(void) {
    const uint32_t p8[8] = {1400, 700, 0, 127, 128, 513, 1023, 64};
    attn_case(8, p8, 64, 512, 64, 1, 128, 512); /* V4.1-Flash, ratio-1 layers */
    attn_case(8, p8, 64, 512, 64, 2, 128, 512); /* ratio 2 */
    attn_case(8, p8, 64, 512, 64, 0, 128, 512); /* window only */
    const uint32_t p1[1] = {2047};
    attn_case(1, p1, 64, 512, 64, 1, 128, 512); /* batch 1, more rows than the top k */
    const uint32_t p3[3] = {40, 5, 17};
    attn_case(3, p3, 4, 64, 16, 2, 8, 4); /* the test configs' widths */
}

int main(void) {
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0)
        tm_test_skip("no CUDA device");
    TM_ASSERT(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking) == cudaSuccess);
    g_rng = 0x5eed0411ull;
    TM_RUN(test_route);
    TM_RUN(test_hc_split);
    TM_RUN(test_attn);
    cudaStreamDestroy(g_stream);
    return tm_test_report();
}

#endif /* TM_HAVE_CUDA */
