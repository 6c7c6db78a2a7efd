/* tests/gpu/test_gemm_quant.c - the quantized decode GEMMs of kernels/gemm_quant.h (FP8 with
 * 128x128 block, 32x32 e8m0 block and channel scales, MXFP4 dense, the grouped MXFP4 MoE GEMM)
 * against host references written here from the formats' definitions: every weight dequantized
 * exactly (e4m3, e2m1 and e8m0 decoded by their bit layouts), products and sums in double. Skipped
 * (77) without a GPU or in a build without CUDA.
 *
 * Data: e4m3 weights quantized from uniform values with amax 448 (round to nearest, from 2^16
 * buckets of the uniform variable), plus 1 in 64
 * drawn uniformly from all 254 non-NaN codes (zeros, -0, subnormals, +-448); e2m1 nibbles
 * uniform over all 16 codes; fp32 block scales ~1e-3, e8m0 scales 2^-9 .. 2^-2 (block32 also
 * 2^1 .. 2^16, through the kernel's two-multiply path; neighbouring 32-blocks always differ),
 * channel scales ~1e-3; x uniform bf16 in [-2, 2). No NaN or inf anywhere.
 *
 * Allowed shapes (what the edge cases exercise): FP8 n_in a multiple of 16 (rows are read in
 * 16-byte pieces; block32 of 32), MXFP4 n_in a multiple of 32 (one scale group), any n_out >= 1,
 * n_tok 1..16.
 *
 * Host only, before the GPU check (so it runs without a GPU too): the block32 reference against a
 * closed form, and the block32 data's power to fail a kernel that ignores the scales, reads them
 * per 128-block or per 64-input chunk (also checked on every block32 GPU case).
 *
 * Tolerance, the same for every format and variant (the dequantized values are exact, so only
 * fp32 arithmetic differs from the reference): |gpu - ref| <= 2e-5 * sum_k |w_k x_k| + 1e-30 per
 * output, where w is the dequantized weight. Also checked: every output row is written (outputs
 * are poisoned with NaN; a skipped MoE pair's row must stay poisoned), runs that differ only in
 * depth (4 / 8) or token tiles (one / two) give identical bits, and so does a repeated launch.
 * Large shapes compare a sample of rows (every row_step-th and the last 16) with the reference; all
 * rows are checked for being written.
 *
 * TM_GQ_SMALL=1 runs only the small and edge shapes (fast enough under compute-sanitizer).
 *
 * A failure prints the case (format, shape, variant, depth, split), the first bad output (token,
 * row, gpu, reference, tolerance) and the number of bad outputs. */
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

#include "kernels/gemm_quant.h"
#include "tm_gpu_test.h"

#define TOL_REL 2e-5

static int g_n_sm;
static int g_small; /* TM_GQ_SMALL=1: only the small and edge shapes (for compute-sanitizer) */

/* ---- format definitions (host) ---- */

/* e4m3 (fn): s eeee mmm, bias 7, no inf; S.1111.111 is NaN. */
static double e4m3_val(uint8_t b) {
    const int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
    if (e == 15 && m == 7)
        return NAN;
    const double v = e == 0 ? ldexp((double)m, -9) : ldexp(1.0 + m / 8.0, e - 7);
    return s ? -v : v;
}
/* Nearest e4m3 to v (ties away from zero), saturating at 448. */
static uint8_t e4m3_enc(float v) {
    const uint8_t s = v < 0 ? 0x80 : 0;
    double a = fabs((double)v);
    uint32_t code;
    if (a < ldexp(1.0, -6)) {
        code = (uint32_t)floor(a / ldexp(1.0, -9) + 0.5); // 8 = the smallest normal, e 1 m 0
    } else {
        int ex = 0;
        (void)frexp(a, &ex);      // a = f * 2^ex, f in [0.5, 1)
        const int e = ex - 1 + 7; // biased exponent of a
        const double mant = a / ldexp(1.0, ex - 1) - 1.0;
        code = (uint32_t)((e << 3) + (int)floor(mant * 8.0 + 0.5)); // a carry bumps e
    }
    if (code > 0x7e)
        code = 0x7e;
    return (uint8_t)(s | code);
}
static double e8m0_val(uint8_t e) { return e == 255 ? NAN : ldexp(1.0, (int)e - 127); }
/* e2m1: s e e m; {0, 0.5, 1, 1.5, 2, 3, 4, 6} */
static double e2m1_val(uint32_t n) {
    static const double mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
    return (n & 8) ? -mag[n & 7] : mag[n & 7];
}
/* Input k of a packed MXFP4 row. */
static uint32_t fp4_nib(const uint8_t *row, uint32_t k) {
    const uint8_t b = row[k / 2];
    const int hi = TM_MXFP4_EVEN_LOW ? (k & 1) : !(k & 1);
    return hi ? (uint32_t)(b >> 4) : (uint32_t)(b & 15);
}

static double g_e4m3_tab[256], g_e2m1_tab[16];
/* e4m3_enc(448 u) for u at the centres of 2^16 buckets of [0, 1): fast data generation */
static uint8_t g_enc_tab[1 << 16];

static void init_tables(void) {
    for (int i = 0; i < 256; i++)
        g_e4m3_tab[i] = e4m3_val((uint8_t)i);
    for (int i = 0; i < 16; i++)
        g_e2m1_tab[i] = e2m1_val((uint32_t)i);
    // the encoder's round trip on every non-NaN code (the data below depend on it)
    int bad = 0;
    for (int i = 0; i < 256; i++)
        if ((i & 0x7f) != 0x7f && e4m3_enc((float)g_e4m3_tab[i]) != i && i != 0x80)
            bad++;
    TM_CHECK_MSG(bad == 0, "e4m3 encoder: %d codes do not round-trip", bad);
    for (int i = 0; i < (1 << 16); i++)
        g_enc_tab[i] = e4m3_enc(448.0f * ((float)i + 0.5f) / 65536.0f);
}

static uint8_t rand_e4m3(void) {
    if (urand(64) == 0) { // any non-NaN code
        uint8_t b;
        do
            b = (uint8_t)urand(256);
        while ((b & 0x7f) == 0x7f);
        return b;
    }
    const uint64_t u = rnd();
    return (uint8_t)((u & 1 ? 0x80 : 0) | g_enc_tab[(u >> 1) & 0xffff]);
}

static void rand_x(size_t n, uint16_t **bits) {
    *bits = xmalloc(n * 2);
    for (size_t i = 0; i < n; i++)
        (*bits)[i] = to_bf(2.0f * frand());
}

/* Waits for g_stream. A kernel fault is sticky (every later CUDA call fails), so it ends the
 * test here, naming the case. */
static void stream_sync(const char *fmt_case, uint32_t n_tok, uint32_t n_in, uint32_t n_out,
                        const char *var, uint32_t depth) {
    const cudaError_t e = cudaStreamSynchronize(g_stream);
    if (e == cudaSuccess)
        return;
    fprintf(stderr, "FAIL: %s %s depth %u, %u tok x %u -> %u: the kernel faulted: %s (%s)\n",
            fmt_case, var, depth, n_tok, n_in, n_out, cudaGetErrorString(e), cudaGetErrorName(e));
    tm_test_failures++;
    exit(tm_test_report());
}

/* ---- comparison ---- */

typedef struct cmp_state {
    int bad, unwritten;
    double worst; /* max |err| / mag */
    char first[256];
} cmp_state;

static void cmp_one(cmp_state *st, uint32_t t, uint32_t o, float got, double ref, double mag) {
    const double e = fabs((double)got - ref), tol = TOL_REL * mag + 1e-30;
    if (mag > 0 && e / mag > st->worst)
        st->worst = e / mag;
    if (!(e <= tol)) {
        if (!st->bad)
            snprintf(st->first, sizeof(st->first),
                     "first bad: token %u row %u: gpu %.9g ref %.9g |err| %.3g tol %.3g", t, o, got,
                     ref, e, tol);
        st->bad++;
    }
}

static int sampled(uint32_t o, uint32_t n_out, uint32_t row_step) {
    return row_step <= 1 || o % row_step == 0 || o + 16 >= n_out;
}

/* y = sum of the n_split partials in split order (what a consumer computes). */
static void sum_parts_host(float *y, const float *part, uint32_t n_split, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float v = part[i];
        for (uint32_t s = 1; s < n_split; s++)
            v += part[(size_t)s * n + i];
        y[i] = v;
    }
}

static void plan(int mxfp4, uint32_t n_in, uint32_t n_rows, uint32_t force_split, uint32_t *n_split,
                 uint32_t *kps) {
    const uint32_t ck = mxfp4 ? 128 : 64;
    if (force_split) {
        *kps = (TM_CEIL_DIV(n_in, force_split) + ck - 1) / ck * ck;
        *n_split = TM_CEIL_DIV(n_in, *kps);
    } else {
        *n_split = mxfp4 ? tm_k_gemm_mxfp4_splits(n_in, n_rows, (uint32_t)g_n_sm, kps)
                         : tm_k_gemm_fp8_splits(n_in, n_rows, (uint32_t)g_n_sm, kps);
    }
    TM_CHECK_MSG(*kps % ck == 0 && (*n_split - 1) * *kps < n_in && *n_split * *kps >= n_in &&
                     *n_split <= TM_QUANT_MAX_SPLIT,
                 "plan %s %u x %u: %u splits of %u", mxfp4 ? "mxfp4" : "fp8", n_in, n_rows,
                 *n_split, *kps);
}

/* ---- FP8 ---- */

static const char *kind_name(tm_k_fp8_scale k) {
    return k == TM_K_FP8_BLOCK_F32      ? "block-f32"
           : k == TM_K_FP8_BLOCK_E8M0   ? "block-e8m0"
           : k == TM_K_FP8_BLOCK32_E8M0 ? "block32-e8m0"
                                        : "channel";
}

/* Scale entries of a kind at a shape. */
static size_t fp8_n_scale(tm_k_fp8_scale kind, uint32_t n_in, uint32_t n_out) {
    if (kind == TM_K_FP8_CHANNEL)
        return n_out;
    if (kind == TM_K_FP8_BLOCK32_E8M0)
        return (size_t)TM_CEIL_DIV(n_out, 32) * TM_CEIL_DIV(n_in, 32);
    return (size_t)TM_CEIL_DIV(n_out, 128) * TM_CEIL_DIV(n_in, 128);
}

/* The index into the scales of weight (o, k), by the definitions in gemm_quant.h. */
static size_t fp8_scale_idx(tm_k_fp8_scale kind, uint32_t n_in, uint32_t o, uint32_t k) {
    if (kind == TM_K_FP8_CHANNEL)
        return o;
    if (kind == TM_K_FP8_BLOCK32_E8M0)
        return (size_t)(o / 32) * TM_CEIL_DIV(n_in, 32) + k / 32;
    return (size_t)(o / 128) * TM_CEIL_DIV(n_in, 128) + k / 128;
}

/* Reference of output (t, o): *ref = sum_k w_real(o, k) x(t, k) in double, *mag the sum of the
 * products' magnitudes; sv holds the scales' exact values. */
static void fp8_ref(tm_k_fp8_scale kind, const uint8_t *w, const double *sv, const uint16_t *x,
                    uint32_t n_in, uint32_t t, uint32_t o, double *ref, double *mag) {
    double acc = 0, m = 0;
    for (uint32_t k = 0; k < n_in; k++) {
        const double p = g_e4m3_tab[w[(size_t)o * n_in + k]] * sv[fp8_scale_idx(kind, n_in, o, k)] *
                         (double)bf(x[(size_t)t * n_in + k]);
        acc += p, m += fabs(p);
    }
    *ref = acc, *mag = m;
}

/* e8m0 scales are g_e8m0_base + 0..7 (2^-9 .. 2^-2 by default; the block32 cases also use
 * 128 and 136, whose exponents reach the kernel's two-multiply path). Block32 scales differ from
 * their left and upper neighbours, so a kernel reading the scale per 128-block (or
 * per 64-input chunk, or not at all) gives other results (checked on the host, fp8_case). */
static uint32_t g_e8m0_base = 118;

static void fill_e8m0(tm_k_fp8_scale kind, uint32_t n_in, size_t n_sc, uint8_t *se) {
    const uint32_t n_kb32 = TM_CEIL_DIV(n_in, 32);
    for (size_t i = 0; i < n_sc; i++) {
        uint32_t d = (uint32_t)urand(8);
        if (kind == TM_K_FP8_BLOCK32_E8M0) { // differ from the left and the upper neighbour
            const int left = i % n_kb32 != 0 ? se[i - 1] : -1;
            const int up = i >= n_kb32 ? se[i - n_kb32] : -1;
            while ((int)(g_e8m0_base + d) == left || (int)(g_e8m0_base + d) == up)
                d = (d + 1) % 8;
        }
        se[i] = (uint8_t)(g_e8m0_base + d);
    }
}
static const char *var_name(tm_k_quant_variant v) {
    return v == TM_K_QUANT_MMA_CVT ? "mma-cvt" : v == TM_K_QUANT_FMA ? "fma" : "mma";
}

/* The block32 cases must be able to fail: with the same data, a kernel that ignored the scales,
 * took them per 128x128 block (the same bytes read with the 128-block layout) or took one scale
 * per 64-input chunk (its first 32-block's) would miss the tolerance on some sampled output.
 * (With one 32-block, n_in == 32 and n_out <= 32, only "ignored" is distinguishable.) */
static void block32_power(const uint8_t *w, const double *sv, const uint16_t *x, uint32_t n_tok,
                          uint32_t n_in, uint32_t n_out, uint32_t row_step, const double *ref,
                          const double *mag) {
    const uint32_t n_kb32 = n_in / 32;
    const size_t n_sc = fp8_n_scale(TM_K_FP8_BLOCK32_E8M0, n_in, n_out);
    double *alt = xmalloc(n_sc * sizeof(double));
    int caught[3] = {0, 0, 0};
    for (int kind = 0; kind < 3; kind++) {
        for (size_t i = 0; i < n_sc; i++)
            alt[i] = kind == 0 ? 1.0 : sv[i]; // 0: ignored
        for (uint32_t o = 0; o < n_out && !caught[kind]; o++) {
            if (!sampled(o, n_out, row_step))
                continue;
            for (uint32_t t = 0; t < n_tok && !caught[kind]; t++) {
                double a = 0;
                for (uint32_t k = 0; k < n_in; k++) {
                    size_t si = 0;
                    if (kind == 0)
                        si = 0;
                    else if (kind == 1) // 128-block layout over the same bytes (in range)
                        si = (size_t)(o / 128) * TM_CEIL_DIV(n_in, 128) + k / 128;
                    else // per 64-input chunk
                        si = (size_t)(o / 32) * n_kb32 + (k / 64) * 2;
                    a += g_e4m3_tab[w[(size_t)o * n_in + k]] * alt[si] *
                         (double)bf(x[(size_t)t * n_in + k]);
                }
                const size_t i = (size_t)t * n_out + o;
                caught[kind] = fabs(a - ref[i]) > TOL_REL * mag[i] + 1e-30;
            }
        }
    }
    const int multi = n_in > 32 || n_out > 32;
    TM_CHECK_MSG(caught[0] && (!multi || caught[1]) && (n_in <= 32 || caught[2]),
                 "block32 %u tok x %u -> %u: the data cannot tell a kernel that %s from a correct "
                 "one",
                 n_tok, n_in, n_out,
                 !caught[0]   ? "ignores the scales"
                 : !caught[1] ? "reads them per 128-block"
                              : "takes one per 64-input chunk");
    free(alt);
}

static void fp8_case(uint32_t n_tok, uint32_t n_in, uint32_t n_out, tm_k_fp8_scale kind,
                     uint32_t force_split, uint32_t row_step) {
    tm_err err = {0};
    const int e8 = kind == TM_K_FP8_BLOCK_E8M0 || kind == TM_K_FP8_BLOCK32_E8M0;
    const size_t n_w = (size_t)n_out * n_in;
    uint8_t *w = xmalloc(n_w);
    for (size_t i = 0; i < n_w; i++)
        w[i] = rand_e4m3();
    const size_t n_sc = fp8_n_scale(kind, n_in, n_out);
    float *sf = xmalloc(n_sc * 4);
    uint8_t *se = xmalloc(n_sc);
    double *sv = xmalloc(n_sc * sizeof(double)); // the scales' exact values
    fill_e8m0(kind, n_in, n_sc, se);
    for (size_t i = 0; i < n_sc; i++) {
        sf[i] = 1e-3f * (1.0f + 0.9f * frand());
        sv[i] = e8 ? e8m0_val(se[i]) : (double)sf[i];
    }
    uint16_t *x;
    rand_x((size_t)n_tok * n_in, &x);
    uint32_t n_split = 0, kps = 0;
    plan(0, n_in, n_out, force_split, &n_split, &kps);
    uint8_t *d_w = dup_to_dev(w, n_w);
    void *d_s = e8 ? dup_to_dev(se, n_sc) : dup_to_dev(sf, n_sc * 4);
    uint16_t *d_x = dup_to_dev(x, (size_t)n_tok * n_in * 2);
    const size_t ny = (size_t)n_tok * n_out;
    float *d_part = dalloc((size_t)n_split * ny * 4, 0xff);
    float *part = xmalloc((size_t)n_split * ny * 4), *y = xmalloc(ny * 4);

    // reference for the sampled rows
    double *ref = xmalloc(ny * sizeof(double)), *mag = xmalloc(ny * sizeof(double));
    for (uint32_t o = 0; o < n_out; o++) {
        if (!sampled(o, n_out, row_step))
            continue;
        for (uint32_t t = 0; t < n_tok; t++)
            fp8_ref(kind, w, sv, x, n_in, t, o, &ref[(size_t)t * n_out + o],
                    &mag[(size_t)t * n_out + o]);
    }
    if (kind == TM_K_FP8_BLOCK32_E8M0)
        block32_power(w, sv, x, n_tok, n_in, n_out, row_step, ref, mag);

    // same: the run whose bits this one must repeat (the same products in the same order;
    // the integer and cvt paths place the inputs in other mma slots, so they may differ), or -1
    struct {
        tm_k_quant_variant v;
        uint32_t depth;
        int same;
    } runs[] = {{TM_K_QUANT_DEFAULT, 0, -1}, {TM_K_QUANT_MMA, 8, 0},  {TM_K_QUANT_MMA_CVT, 4, -1},
                {TM_K_QUANT_MMA_CVT, 8, 2},  {TM_K_QUANT_FMA, 0, -1}, {TM_K_QUANT_DEFAULT, 0, 0}};
    float *ys[6] = {0};
    const int n_runs = (int)(sizeof(runs) / sizeof(runs[0]));
    for (int ri = 0; ri < n_runs; ri++) {
        TM_ASSERT(cudaMemset(d_part, 0xff, (size_t)n_split * ny * 4) == cudaSuccess);
        TM_ASSERT(cudaDeviceSynchronize() == cudaSuccess);
        tm_k_gemm_fp8_args a = {.part = d_part,
                                .w = d_w,
                                .scale = d_s,
                                .x = d_x,
                                .n_tok = n_tok,
                                .n_in = n_in,
                                .n_out = n_out,
                                .n_split = n_split,
                                .k_per_split = kps,
                                .scale_kind = kind,
                                .variant = runs[ri].v,
                                .depth = runs[ri].depth};
        TM_CHECK_OK(tm_k_gemm_fp8(&a, g_stream, &err), &err);
        stream_sync(kind_name(kind), n_tok, n_in, n_out, var_name(runs[ri].v), runs[ri].depth);
        to_host(part, d_part, (size_t)n_split * ny * 4);
        sum_parts_host(y, part, n_split, ny);
        cmp_state st = {0};
        for (uint32_t t = 0; t < n_tok; t++)
            for (uint32_t o = 0; o < n_out; o++) {
                const size_t i = (size_t)t * n_out + o;
                if (!isfinite(y[i])) {
                    if (!st.unwritten && !st.bad)
                        snprintf(st.first, sizeof(st.first),
                                 "token %u row %u not written or not finite: %g", t, o, y[i]);
                    st.unwritten++;
                } else if (sampled(o, n_out, row_step)) {
                    cmp_one(&st, t, o, y[i], ref[i], mag[i]);
                }
            }
        TM_CHECK_MSG(st.bad == 0 && st.unwritten == 0,
                     "fp8 %s %s depth %u: %u tok x %u -> %u (%u splits of %u): %d bad, %d "
                     "unwritten, worst %.2g; %s",
                     kind_name(kind), var_name(runs[ri].v), runs[ri].depth, n_tok, n_in, n_out,
                     n_split, kps, st.bad, st.unwritten, st.worst, st.first);
        ys[ri] = xmalloc(ny * 4);
        memcpy(ys[ri], y, ny * 4);
        if (runs[ri].same >= 0) {
            const float *y0 = ys[runs[ri].same];
            size_t diff = 0;
            for (size_t i = 0; i < ny; i++)
                diff += memcmp(&y0[i], &y[i], 4) != 0;
            TM_CHECK_MSG(diff == 0,
                         "fp8 %s %s depth %u: %zu of %zu outputs differ in bits from run %d (%s "
                         "depth %u) (%u tok x %u -> %u)",
                         kind_name(kind), var_name(runs[ri].v), runs[ri].depth, diff, ny,
                         runs[ri].same, var_name(runs[runs[ri].same].v), runs[runs[ri].same].depth,
                         n_tok, n_in, n_out);
        }
    }
    for (int ri = 0; ri < n_runs; ri++)
        free(ys[ri]);
    cudaFree(d_w), cudaFree(d_s), cudaFree(d_x), cudaFree(d_part);
    free(w), free(sf), free(se), free(sv), free(x), free(part), free(y), free(ref);
    free(mag);
}

static void test_fp8(void) {
    const tm_k_fp8_scale kinds[3] = {TM_K_FP8_BLOCK_F32, TM_K_FP8_BLOCK_E8M0, TM_K_FP8_CHANNEL};
    for (int k = 0; k < 3; k++) {
        fp8_case(1, 16, 1, kinds[k], 0, 1);      // smallest: one 16-byte piece, one row
        fp8_case(3, 48, 17, kinds[k], 0, 1);     // a partial chunk, ragged rows
        fp8_case(8, 208, 130, kinds[k], 0, 1);   // n_in, n_out not multiples of 64 / 128
        fp8_case(16, 1040, 300, kinds[k], 3, 1); // 3 splits, the last shorter; two token tiles
        fp8_case(9, 4096 + 16, 257, kinds[k], 5, 1);
        fp8_case(5, 544, 33, kinds[k], 7, 1); // splits of one chunk
    }
    if (g_small)
        return;
    // llama8b decode shapes (qkv, gate|up, down), sampled rows
    for (int k = 0; k < 3; k++) {
        fp8_case(8, 4096, 6144, kinds[k], 0, 7);
        fp8_case(1, 4096, 6144, kinds[k], 0, 13);
    }
    fp8_case(8, 4096, 28672, TM_K_FP8_BLOCK_F32, 0, 29);
    fp8_case(16, 4096, 28672, TM_K_FP8_CHANNEL, 0, 31);
    fp8_case(8, 14336, 4096, TM_K_FP8_BLOCK_F32, 0, 11);
    fp8_case(3, 14336, 4096, TM_K_FP8_BLOCK_E8M0, 0, 11);
    fp8_case(8, 14336, 4096, TM_K_FP8_CHANNEL, 0, 11);
}

/* DeepSeek-V4.1 32x32 ue8m0 blocks: n_in a multiple of 32 (not always of 64), ragged n_out. */
static void test_fp8_block32(void) {
    const tm_k_fp8_scale b32 = TM_K_FP8_BLOCK32_E8M0;
    fp8_case(1, 32, 1, b32, 0, 1);      // one 32-block, half a chunk, one row
    fp8_case(3, 96, 17, b32, 0, 1);     // n_in = 1.5 chunks, n_out < 32
    fp8_case(8, 160, 70, b32, 0, 1);    // 5 x 3 blocks, the last row block partial
    fp8_case(16, 1056, 300, b32, 3, 1); // 3 splits, two token tiles, 300 = 9.4 row blocks
    fp8_case(1, 544, 33, b32, 7, 1);    // splits of one chunk, the last a half chunk
    fp8_case(9, 4096 + 32, 257, b32, 5, 1);
    // large exponents: 128..135 (the integer path's fold holds e <= 134, so warps mix the one-
    // and two-multiply paths), 136..143 (the integer path always two, cvt up to 142 one)
    g_e8m0_base = 128;
    fp8_case(8, 2080, 96, b32, 0, 1);
    g_e8m0_base = 136;
    fp8_case(3, 1024, 48, b32, 2, 1);
    g_e8m0_base = 118;
    if (g_small)
        return;
    // the released DeepSeek-V4.1-Flash's dense shapes (hidden 5120: wq_a, wq_b, wo_b, the shared
    // expert's down, the Engram wkv), sampled rows; and V4-width ones (hidden 4096)
    fp8_case(8, 5120, 1280, b32, 0, 1);
    fp8_case(1, 1280, 32768, b32, 0, 13);
    fp8_case(16, 8192, 5120, b32, 0, 7);
    fp8_case(3, 2304, 5120, b32, 0, 5);
    fp8_case(8, 6144, 25600, b32, 0, 31);
    fp8_case(3, 4096, 1024, b32, 0, 3);
    fp8_case(16, 4096, 4096, b32, 0, 7);
}

/* Host only (runs without a GPU): the block32 reference itself, against a closed form. w = 1.0
 * everywhere, x = 1.0, 2 x 3 blocks with scales 2^(-7 + b): out(o) = 32 * sum over the block row
 * of o of its three scales; the scale generator's neighbours differ. */
static void test_block32_ref_host(void) {
    const uint32_t n_in = 96, n_out = 40, n_kb = 3;
    uint8_t w[40 * 96];
    uint16_t x[2 * 96];
    memset(w, 0x38, sizeof(w)); // e4m3 1.0: exponent 7 = bias, mantissa 0
    for (size_t i = 0; i < 2 * 96; i++)
        x[i] = 0x3f80; // bf16 1.0
    TM_CHECK(g_e4m3_tab[0x38] == 1.0 && bf(0x3f80) == 1.0f);
    double sv[6];
    for (int b = 0; b < 6; b++)
        sv[b] = e8m0_val((uint8_t)(120 + b));
    TM_CHECK(fp8_n_scale(TM_K_FP8_BLOCK32_E8M0, n_in, n_out) == 6);
    TM_CHECK(fp8_n_scale(TM_K_FP8_BLOCK32_E8M0, 80, 33) == 6); // ceil(80/32) = 3 columns
    for (uint32_t t = 0; t < 2; t++)
        for (uint32_t o = 0; o < n_out; o++) {
            const uint32_t rb = o / 32;
            const double want = 32.0 * (ldexp(1.0, 120 + (int)(rb * n_kb) - 127) +
                                        ldexp(1.0, 121 + (int)(rb * n_kb) - 127) +
                                        ldexp(1.0, 122 + (int)(rb * n_kb) - 127));
            double ref = 0, mag = 0;
            fp8_ref(TM_K_FP8_BLOCK32_E8M0, w, sv, x, n_in, t, o, &ref, &mag);
            TM_CHECK_MSG(ref == want && mag == want,
                         "block32 ref token %u row %u: %.17g, want %.17g", t, o, ref, want);
        }
    // the same weights under the 128-block layout take sv[0] only: 96 * 2^-7
    double ref = 0, mag = 0;
    fp8_ref(TM_K_FP8_BLOCK_E8M0, w, sv, x, n_in, 0, 39, &ref, &mag);
    TM_CHECK(ref == 96.0 * ldexp(1.0, -7));
    uint8_t se[5 * 7];
    const uint64_t rng = g_rng;
    fill_e8m0(TM_K_FP8_BLOCK32_E8M0, 7 * 32, 35, se);
    g_rng = rng;
    for (int i = 0; i < 35; i++) {
        TM_CHECK(se[i] >= g_e8m0_base && se[i] < g_e8m0_base + 8);
        TM_CHECK(i % 7 == 0 || se[i] != se[i - 1]);
        TM_CHECK(i < 7 || se[i] != se[i - 7]);
    }
    // the power check on random data of the first block32 GPU shapes (fails if it cannot tell)
    const uint32_t shp[3][3] = {{1, 32, 1}, {3, 96, 17}, {8, 160, 70}};
    for (int c = 0; c < 3; c++) {
        const uint32_t nt = shp[c][0], ni = shp[c][1], no = shp[c][2];
        uint8_t *rw = xmalloc((size_t)no * ni),
                *rs = xmalloc(fp8_n_scale(TM_K_FP8_BLOCK32_E8M0, ni, no));
        double *rv = xmalloc(fp8_n_scale(TM_K_FP8_BLOCK32_E8M0, ni, no) * sizeof(double));
        double *r = xmalloc((size_t)nt * no * sizeof(double)), *m = xmalloc((size_t)nt * no * 8);
        uint16_t *rx;
        for (size_t i = 0; i < (size_t)no * ni; i++)
            rw[i] = rand_e4m3();
        fill_e8m0(TM_K_FP8_BLOCK32_E8M0, ni, fp8_n_scale(TM_K_FP8_BLOCK32_E8M0, ni, no), rs);
        for (size_t i = 0; i < fp8_n_scale(TM_K_FP8_BLOCK32_E8M0, ni, no); i++)
            rv[i] = e8m0_val(rs[i]);
        rand_x((size_t)nt * ni, &rx);
        for (uint32_t t = 0; t < nt; t++)
            for (uint32_t o = 0; o < no; o++)
                fp8_ref(TM_K_FP8_BLOCK32_E8M0, rw, rv, rx, ni, t, o, &r[(size_t)t * no + o],
                        &m[(size_t)t * no + o]);
        block32_power(rw, rv, rx, nt, ni, no, 1, r, m);
        free(rw), free(rs), free(rv), free(r), free(m), free(rx);
    }
    g_rng = rng;
}

/* ---- MXFP4 (dense and grouped) ---- */

/* n_rows random MXFP4 rows of n_in inputs: packed values, e8m0 scales in [119, 126]. */
static void rand_fp4(size_t n_rows, uint32_t n_in, uint8_t *w, uint8_t *sc) {
    for (size_t i = 0; i < n_rows * (n_in / 2); i++)
        w[i] = (uint8_t)urand(256);
    for (size_t i = 0; i < n_rows * (n_in / 32); i++)
        sc[i] = (uint8_t)(119 + urand(8));
}

/* The reference row: x_row . W[o] for MXFP4 row o (packed w_row, scales s_row). */
static void fp4_dot(const uint8_t *w_row, const uint8_t *s_row, const uint16_t *x_row,
                    uint32_t n_in, double *ref, double *mag) {
    double acc = 0, m = 0;
    for (uint32_t k = 0; k < n_in; k++) {
        const double p = g_e2m1_tab[fp4_nib(w_row, k)] * e8m0_val(s_row[k / 32]) *
                         (double)bf(x_row[k]);
        acc += p, m += fabs(p);
    }
    *ref = acc, *mag = m;
}

static void mxfp4_case(uint32_t n_tok, uint32_t n_in, uint32_t n_out, uint32_t force_split,
                       uint32_t row_step) {
    tm_err err = {0};
    const size_t rb = n_in / 2, ng = n_in / 32;
    uint8_t *w = xmalloc((size_t)n_out * rb), *sc = xmalloc((size_t)n_out * ng);
    rand_fp4(n_out, n_in, w, sc);
    uint16_t *x;
    rand_x((size_t)n_tok * n_in, &x);
    uint32_t n_split = 0, kps = 0;
    plan(1, n_in, n_out, force_split, &n_split, &kps);
    uint8_t *d_w = dup_to_dev(w, (size_t)n_out * rb), *d_s = dup_to_dev(sc, (size_t)n_out * ng);
    uint16_t *d_x = dup_to_dev(x, (size_t)n_tok * n_in * 2);
    const size_t ny = (size_t)n_tok * n_out;
    float *d_part = dalloc((size_t)n_split * ny * 4, 0xff);
    float *part = xmalloc((size_t)n_split * ny * 4), *y0 = xmalloc(ny * 4), *y = xmalloc(ny * 4);
    const uint32_t depths[3] = {0, 8, 0};
    for (int ri = 0; ri < 3; ri++) {
        TM_ASSERT(cudaMemset(d_part, 0xff, (size_t)n_split * ny * 4) == cudaSuccess);
        TM_ASSERT(cudaDeviceSynchronize() == cudaSuccess);
        tm_k_gemm_mxfp4_args a = {.part = d_part,
                                  .w = d_w,
                                  .scale = d_s,
                                  .x = d_x,
                                  .n_tok = n_tok,
                                  .n_in = n_in,
                                  .n_out = n_out,
                                  .n_split = n_split,
                                  .k_per_split = kps,
                                  .depth = depths[ri]};
        TM_CHECK_OK(tm_k_gemm_mxfp4(&a, g_stream, &err), &err);
        stream_sync("mxfp4", n_tok, n_in, n_out, "mma", depths[ri]);
        to_host(part, d_part, (size_t)n_split * ny * 4);
        sum_parts_host(y, part, n_split, ny);
        if (ri > 0) {
            size_t diff = 0;
            for (size_t i = 0; i < ny; i++)
                diff += memcmp(&y0[i], &y[i], 4) != 0;
            TM_CHECK_MSG(diff == 0,
                         "mxfp4 depth %u: %zu of %zu outputs differ in bits from "
                         "the first run (%u tok x %u -> %u)",
                         depths[ri], diff, ny, n_tok, n_in, n_out);
            continue;
        }
        memcpy(y0, y, ny * 4);
        cmp_state st = {0};
        for (uint32_t o = 0; o < n_out; o++)
            for (uint32_t t = 0; t < n_tok; t++) {
                const size_t i = (size_t)t * n_out + o;
                if (!isfinite(y[i])) {
                    if (!st.unwritten && !st.bad)
                        snprintf(st.first, sizeof(st.first),
                                 "token %u row %u not written or not finite: %g", t, o, y[i]);
                    st.unwritten++;
                } else if (sampled(o, n_out, row_step)) {
                    double ref, mag;
                    fp4_dot(w + o * rb, sc + o * ng, x + (size_t)t * n_in, n_in, &ref, &mag);
                    cmp_one(&st, t, o, y[i], ref, mag);
                }
            }
        TM_CHECK_MSG(st.bad == 0 && st.unwritten == 0,
                     "mxfp4: %u tok x %u -> %u (%u splits of %u): %d bad, %d unwritten, worst "
                     "%.2g; %s",
                     n_tok, n_in, n_out, n_split, kps, st.bad, st.unwritten, st.worst, st.first);
    }
    cudaFree(d_w), cudaFree(d_s), cudaFree(d_x), cudaFree(d_part);
    free(w), free(sc), free(x), free(part), free(y0), free(y);
}

static void test_mxfp4(void) {
    mxfp4_case(1, 32, 1, 0, 1);
    mxfp4_case(3, 96, 17, 0, 1); // a partial chunk (3 of 4 lanes), ragged rows
    mxfp4_case(8, 160, 130, 0, 1);
    mxfp4_case(16, 1056, 300, 3, 1); // 3 splits, the last shorter; two token tiles
    mxfp4_case(9, 2880, 2880, 2, 1); // gpt-oss width: 90 scale bytes a row (unaligned rows)
    if (g_small)
        return;
    mxfp4_case(8, 4096, 6144, 0, 7);
    mxfp4_case(1, 4096, 28672, 0, 29);
    mxfp4_case(8, 14336, 4096, 0, 11);
}

/* Routing of a decode step: n_tok tokens, each to top_k distinct experts of n_expert (hot >= 0:
 * every token also routes to expert `hot`), pairs shuffled. skip: one more pair with expert -1.
 * Returns n_pair; pe/prow get the pairs (pair_row = the token). */
static uint32_t make_routing(uint32_t n_tok, uint32_t top_k, uint32_t n_expert, int hot, int skip,
                             int32_t *pe, uint32_t *prow) {
    uint32_t n = 0;
    for (uint32_t t = 0; t < n_tok; t++) {
        uint32_t got = 0;
        int32_t mine[64];
        if (hot >= 0)
            mine[got++] = hot;
        while (got < top_k) {
            const int32_t e = (int32_t)urand(n_expert);
            int dup = 0;
            for (uint32_t i = 0; i < got; i++)
                dup |= mine[i] == e;
            if (!dup)
                mine[got++] = e;
        }
        for (uint32_t i = 0; i < got; i++)
            pe[n] = mine[i], prow[n] = t, n++;
    }
    if (skip)
        pe[n] = -1, prow[n] = 0, n++;
    for (uint32_t i = n - 1; i > 0; i--) { // shuffle the pairs
        const uint32_t j = urand(i + 1);
        const int32_t te = pe[i];
        const uint32_t tr = prow[i];
        pe[i] = pe[j], prow[i] = prow[j], pe[j] = te, prow[j] = tr;
    }
    return n;
}

/* The grouped MXFP4 GEMM: weights of all n_expert experts on the device, the inactive ones a
 * poison (every value 6.0, every scale NaN: reading a wrong expert shows as NaN); per_pair_x:
 * x has one row per pair (the down projection) instead of one per token. */
static void moe_case(uint32_t n_tok, uint32_t top_k, uint32_t n_expert, uint32_t n_in,
                     uint32_t n_out, int hot, int skip, int per_pair_x, uint32_t force_split,
                     uint32_t row_step) {
    tm_err err = {0};
    int32_t pe[TM_MOE_MAX_PAIRS];
    uint32_t prow[TM_MOE_MAX_PAIRS];
    const uint32_t n_pair = make_routing(n_tok, top_k, n_expert, hot, skip, pe, prow);
    if (per_pair_x)
        for (uint32_t p = 0; p < n_pair; p++)
            prow[p] = p;
    const uint32_t n_x = per_pair_x ? n_pair : n_tok;
    const size_t rb = n_in / 2, ng = n_in / 32;
    const size_t ew = (size_t)n_out * rb, es = (size_t)n_out * ng; // bytes per expert
    uint8_t *d_w = dalloc(ew * n_expert, 0x77), *d_s = dalloc(es * n_expert, 0xff);
    // the active experts' weights (host copies for the reference)
    uint8_t **hw = calloc(n_expert, sizeof(*hw)), **hs = calloc(n_expert, sizeof(*hs));
    uint32_t n_active = 0, max_cnt = 0;
    for (uint32_t p = 0; p < n_pair; p++) {
        if (pe[p] < 0 || hw[pe[p]])
            continue;
        const uint32_t e = (uint32_t)pe[p];
        hw[e] = xmalloc(ew), hs[e] = xmalloc(es);
        rand_fp4(n_out, n_in, hw[e], hs[e]);
        TM_ASSERT(cudaMemcpy(d_w + e * ew, hw[e], ew, cudaMemcpyHostToDevice) == cudaSuccess);
        TM_ASSERT(cudaMemcpy(d_s + e * es, hs[e], es, cudaMemcpyHostToDevice) == cudaSuccess);
        n_active++;
        uint32_t cnt = 0;
        for (uint32_t q = 0; q < n_pair; q++)
            cnt += pe[q] == pe[p];
        max_cnt = TM_MAX(max_cnt, cnt);
    }
    TM_ASSERT(cudaDeviceSynchronize() == cudaSuccess);
    uint16_t *x;
    rand_x((size_t)n_x * n_in, &x);
    uint16_t *d_x = dup_to_dev(x, (size_t)n_x * n_in * 2);
    int32_t *d_pe = dup_to_dev(pe, n_pair * 4);
    uint32_t *d_pr = dup_to_dev(prow, n_pair * 4);
    uint32_t n_split = 0, kps = 0;
    plan(1, n_in, n_out * n_active, force_split, &n_split, &kps);
    const size_t ny = (size_t)n_pair * n_out;
    float *d_part = dalloc((size_t)n_split * ny * 4, 0xff);
    float *part = xmalloc((size_t)n_split * ny * 4), *y0 = xmalloc(ny * 4), *y = xmalloc(ny * 4);
    // one-tile kernel (max 8; more pairs of an expert take another pass) and the two-tile one
    const uint32_t maxp[3] = {TM_MIN(max_cnt, 8u), 16, TM_MIN(max_cnt, 8u)};
    const uint32_t depths[3] = {0, 8, 4};
    for (int ri = 0; ri < 3; ri++) {
        TM_ASSERT(cudaMemset(d_part, 0xff, (size_t)n_split * ny * 4) == cudaSuccess);
        TM_ASSERT(cudaDeviceSynchronize() == cudaSuccess);
        tm_k_moe_mxfp4_args a = {.part = d_part,
                                 .w = d_w,
                                 .scale = d_s,
                                 .x = d_x,
                                 .pair_expert = d_pe,
                                 .pair_row = d_pr,
                                 .n_pair = n_pair,
                                 .n_expert = n_expert,
                                 .max_pair_per_expert = maxp[ri],
                                 .n_in = n_in,
                                 .n_out = n_out,
                                 .n_split = n_split,
                                 .k_per_split = kps,
                                 .depth = depths[ri]};
        TM_CHECK_OK(tm_k_moe_mxfp4(&a, g_stream, &err), &err);
        stream_sync("moe-mxfp4", n_pair, n_in, n_out, maxp[ri] > 8 ? "two-tile" : "one-tile",
                    depths[ri]);
        to_host(part, d_part, (size_t)n_split * ny * 4);
        int skipped_written = 0;
        for (uint32_t p = 0; p < n_pair; p++) // a skipped pair's rows stay poisoned (NaN bits)
            if (pe[p] < 0)
                for (uint32_t s = 0; s < n_split; s++)
                    for (uint32_t o = 0; o < n_out; o++) {
                        uint32_t bits;
                        memcpy(&bits, &part[(size_t)s * ny + (size_t)p * n_out + o], 4);
                        skipped_written += bits != 0xffffffffu;
                    }
        TM_CHECK_MSG(skipped_written == 0, "moe: %d outputs of the skipped pair were written",
                     skipped_written);
        sum_parts_host(y, part, n_split, ny);
        if (ri > 0) {
            size_t diff = 0;
            for (size_t i = 0; i < ny; i++)
                diff += pe[i / n_out] >= 0 && memcmp(&y0[i], &y[i], 4) != 0;
            TM_CHECK_MSG(diff == 0,
                         "moe max_pair %u depth %u: %zu of %zu outputs differ in bits "
                         "from the first run",
                         maxp[ri], depths[ri], diff, ny);
            continue;
        }
        memcpy(y0, y, ny * 4);
        cmp_state st = {0};
        for (uint32_t p = 0; p < n_pair; p++) {
            if (pe[p] < 0)
                continue;
            const uint32_t e = (uint32_t)pe[p];
            for (uint32_t o = 0; o < n_out; o++) {
                const size_t i = (size_t)p * n_out + o;
                if (!isfinite(y[i])) {
                    if (!st.unwritten && !st.bad)
                        snprintf(st.first, sizeof(st.first),
                                 "pair %u (expert %u) row %u not written or not finite: %g", p, e,
                                 o, y[i]);
                    st.unwritten++;
                } else if (sampled(o, n_out, row_step)) {
                    double ref, mag;
                    fp4_dot(hw[e] + o * rb, hs[e] + o * ng, x + (size_t)prow[p] * n_in, n_in, &ref,
                            &mag);
                    cmp_one(&st, p, o, y[i], ref, mag);
                }
            }
        }
        TM_CHECK_MSG(st.bad == 0 && st.unwritten == 0,
                     "moe mxfp4: %u tok top-%u of %u experts (%u pairs, %u distinct, at most %u "
                     "a expert), %u -> %u, %s x, %u splits of %u: %d bad, %d unwritten, worst "
                     "%.2g; %s (token = pair index)",
                     n_tok, top_k, n_expert, n_pair, n_active, max_cnt, n_in, n_out,
                     per_pair_x ? "per-pair" : "per-token", n_split, kps, st.bad, st.unwritten,
                     st.worst, st.first);
    }
    for (uint32_t e = 0; e < n_expert; e++)
        free(hw[e]), free(hs[e]);
    free(hw), free(hs);
    cudaFree(d_w), cudaFree(d_s), cudaFree(d_x), cudaFree(d_pe), cudaFree(d_pr), cudaFree(d_part);
    free(x), free(part), free(y0), free(y);
}

static void test_moe(void) {
    moe_case(1, 1, 1, 32, 1, -1, 0, 0, 0, 1);     // one pair, one expert
    moe_case(3, 2, 5, 96, 17, -1, 1, 0, 0, 1);    // ragged, a skipped pair
    moe_case(12, 3, 40, 256, 40, 7, 0, 0, 0, 1);  // expert 7 has 12 pairs: two passes / tiles
    moe_case(16, 4, 64, 1088, 33, 2, 1, 1, 2, 1); // 16 pairs on one expert, splits, per-pair x
    if (g_small)
        return;
    // DeepSeek-V4-Flash experts: hidden 4096, width 2048, 256 experts, top-6, 8 tokens
    moe_case(8, 6, 256, 4096, 2 * 2048, -1, 0, 0, 0, 17); // gate|up fused
    moe_case(8, 6, 256, 2048, 4096, -1, 0, 1, 0, 17);     // down, one x row per pair
}

int main(void) {
    g_rng = 0x5eed0019ull;
    init_tables();
    TM_RUN(test_block32_ref_host);
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        if (tm_test_failures)
            return tm_test_report(); // the host check failed
        tm_test_skip("no CUDA device (the host-only block32 reference check passed)");
    }
    TM_ASSERT(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking) == cudaSuccess);
    cudaDeviceGetAttribute(&g_n_sm, cudaDevAttrMultiProcessorCount, 0);
    g_small = getenv("TM_GQ_SMALL") != NULL;
    TM_RUN(test_fp8);
    TM_RUN(test_fp8_block32);
    TM_RUN(test_mxfp4);
    TM_RUN(test_moe);
    cudaStreamDestroy(g_stream);
    return tm_test_report();
}

#endif /* TM_HAVE_CUDA */
