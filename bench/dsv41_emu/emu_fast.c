/* bench/dsv41_emu/emu_fast.c - what the DeepSeek-V4.1 CUDA engine's fast path calls besides
 * kernels/dsv41.h, done on the host: the runtime's projection launcher (tm_cuda_project with the
 * skinny split-K contract: partials in sk_part or straight into dst, the consumer sums them) and
 * cuBLAS GEMM (tm_cuda_gemm), the skinny / FP8 / MXFP4 MoE kernels of kernels/gemm_skinny.h and
 * kernels/gemm_quant.h by their definitions (fp32 sums per split; the split planners are simple
 * ones with the real contracts, so that partial sums are exercised), tm_k_sum_parts_cols, and
 * the fast path's kernels of kernels/dsv41.h (act_quant to bf16 through the CPU engine's
 * quantizer, the hi / lo bf16 split of the other inputs, the split-K + hi / lo sums, the FP8
 * 32x32 dequantization). With them the engine's fast-path host
 * code (formats, carving, upload of the packed forms, pair rows, partial sums, strided outputs)
 * runs on a machine without a GPU. What it cannot check: the kernels themselves (their own GPU
 * tests: test_gemm_quant, test_kernels). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/dequant.h"
#include "kernels/dsv41.h"
#include "kernels/fill.h"
#include "kernels/gemm_quant.h"
#include "kernels/gemm_skinny.h"
#include "runner/engine/cpu/dsv_common.h"
#include "runner/engine/cuda/engine_cuda_int.h"
#include "runner/model/tensor.h"

static float bf(uint16_t h) { return tm_bf16_to_f32(h); }

/* CUDA graphs (emu_cuda.c): while a graph is captured, a launcher records its arguments and
 * returns; the replay calls it again (not capturing then), which runs it. */
int emu_capturing(void);
void emu_record(void (*run)(const void *args), const void *args, size_t n);
#define EMU_RECORD(run, args, n)                                                                   \
    do {                                                                                           \
        if (emu_capturing()) {                                                                     \
            emu_record((run), (args), (n));                                                        \
            return TM_OK;                                                                          \
        }                                                                                          \
    } while (0)
static void run_to_bf16(const void *p) { (void)tm_k_dsv41_to_bf16(p, NULL, NULL); }
static void run_gemm_fp8(const void *p) { (void)tm_k_gemm_fp8(p, NULL, NULL); }
static void run_moe_mxfp4(const void *p) { (void)tm_k_moe_mxfp4(p, NULL, NULL); }
static void run_sum_parts_cols(const void *p) { (void)tm_k_sum_parts_cols(p, NULL, NULL); }
static void run_sum_split(const void *p) { (void)tm_k_dsv41_sum_split(p, NULL, NULL); }

/* Calls per path, printed at exit (EMU_COUNT=1): which of the fast path's branches a run took. */
static unsigned long n_fp8, n_skinny, n_gemm, n_moe, n_sum, n_aq, n_split, n_sum_lo, n_sum_add;
static void __attribute__((destructor)) counts(void) {
    const char *e = getenv("EMU_COUNT");
    if (e && !strcmp(e, "1"))
        fprintf(stderr,
                "emu_fast: calls: fp8 %lu, skinny %lu, gemm %lu, moe %lu, sum_parts_cols %lu, "
                "to_bf16 act_quant %lu / hi-lo split %lu, sum_split with lo rows %lu / adding "
                "(lo pass) %lu\n",
                n_fp8, n_skinny, n_gemm, n_moe, n_sum, n_aq, n_split, n_sum_lo, n_sum_add);
}

tm_rc tm_k_dsv41_to_bf16(const tm_k_dsv41_to_bf16_args *a, cudaStream_t s, tm_err *err) {
    (void)s, (void)err;
    EMU_RECORD(run_to_bf16, a, sizeof(*a));
    TM_ASSERT(a->ldx >= a->n && (a->aq ? a->n % 32 == 0 && !a->lo : a->lo != NULL));
    *(a->aq ? &n_aq : &n_split) += 1;
    float *row = malloc((size_t)a->n * sizeof(float));
    TM_ASSERT(row);
    for (uint32_t t = 0; t < a->n_tok; t++) {
        memcpy(row, a->x + (size_t)t * a->ldx, (size_t)a->n * sizeof(float));
        if (a->aq)
            tm_dsv_act_quant(row, a->n);
        for (uint32_t j = 0; j < a->n; j++) {
            const uint16_t h = tm_f32_to_bf16(row[j]);
            TM_ASSERT(!a->aq || bf(h) == row[j]); // act_quant values are exact in bf16
            a->y[(size_t)t * a->n + j] = h;
            if (!a->aq) { // lo = bf16(x - hi); x - hi is exact in fp32
                const float d = row[j] - bf(h);
                TM_ASSERT(isinf(row[j]) || isnan(row[j]) || (double)d == (double)row[j] - bf(h));
                a->lo[(size_t)t * a->n + j] = tm_f32_to_bf16(d);
            }
        }
    }
    free(row);
    return TM_OK;
}

tm_rc tm_k_dsv41_sum_split(const tm_k_dsv41_sum_split_args *a, cudaStream_t s, tm_err *err) {
    (void)s, (void)err;
    EMU_RECORD(run_sum_split, a, sizeof(*a));
    TM_ASSERT(a->n_part >= 1 && a->ld_y >= a->n_col);
    n_sum_lo += a->lo != 0, n_sum_add += a->add != 0;
    for (uint32_t t = 0; t < a->n_tok; t++)
        for (uint32_t j = 0; j < a->n_col; j++) {
            float hi = 0.0f, lo = 0.0f;
            for (uint32_t p = 0; p < a->n_part; p++)
                hi += a->part[p * a->stride + (size_t)t * a->n_col + j];
            for (uint32_t p = 0; a->lo && p < a->n_part; p++)
                lo += a->part[p * a->stride + (size_t)(a->n_tok + t) * a->n_col + j];
            float *y = a->y + (size_t)t * a->ld_y + j;
            *y = (a->add ? *y : 0.0f) + hi + lo;
        }
    return TM_OK;
}

tm_rc tm_k_dsv41_dequant_fp8_32(uint16_t *y, const uint8_t *w, const uint8_t *scale, uint32_t n_out,
                                uint32_t n_in, cudaStream_t s, tm_err *err) {
    (void)s, (void)err;
    for (size_t o = 0; o < n_out; o++)
        for (size_t i = 0; i < n_in; i++)
            y[o * n_in + i] = tm_f32_to_bf16(ldexpf(
                tm_e4m3_to_f32(w[o * n_in + i]), (int)scale[o / 32 * (n_in / 32) + i / 32] - 127));
    return TM_OK;
}

tm_rc tm_k_fill_e4m3(const tm_k_fill_e4m3_args *a, cudaStream_t s, tm_err *err) {
    (void)a, (void)s;
    return TM_ERR(err, TM_E_INTERNAL, "emu: no random fill");
}

/* ---- split planners: at most 4 splits of multiples of `mult` (the real ones plan by SM) ---- */

static uint32_t plan(uint32_t n_in, uint32_t mult, uint32_t *kps) {
    uint32_t ns = TM_MIN(4u, TM_MAX(1u, n_in / mult));
    *kps = TM_CEIL_DIV(TM_CEIL_DIV(n_in, ns), mult) * mult;
    return TM_CEIL_DIV(n_in, *kps);
}

int tm_k_gemm_skinny_fits(uint32_t n_tok, uint32_t n_in, uint32_t n_out) {
    return n_tok >= 1 && n_tok <= TM_SKINNY_MAX_TOK && n_in % 32 == 0 && n_in && n_out >= 1;
}
uint32_t tm_k_gemm_skinny_splits(uint32_t n_in, uint32_t n_out, uint32_t n_sm,
                                 uint32_t *k_per_split) {
    (void)n_out, (void)n_sm;
    return plan(n_in, 32, k_per_split);
}
int tm_k_gemm_fp8_fits(uint32_t n_tok, uint32_t n_in, uint32_t n_out) {
    return n_tok >= 1 && n_tok <= TM_QUANT_MAX_TOK && n_in >= 16 && n_in % 16 == 0 && n_out >= 1;
}
int tm_k_gemm_fp8_kind_fits(tm_k_fp8_scale kind, uint32_t n_tok, uint32_t n_in, uint32_t n_out) {
    return tm_k_gemm_fp8_fits(n_tok, n_in, n_out) &&
           (kind != TM_K_FP8_BLOCK32_E8M0 || n_in % 32 == 0);
}
uint32_t tm_k_gemm_fp8_splits(uint32_t n_in, uint32_t n_rows, uint32_t n_sm,
                              uint32_t *k_per_split) {
    (void)n_rows, (void)n_sm;
    return plan(n_in, 64, k_per_split);
}

/* EMU_DOUBLE=1: the GEMMs sum in double (rounded to fp32 once): a diagnostic that tells a
 * difference from the CPU engine caused by the fp32 sums (discrete choices flipped at near ties)
 * from a logic error, which stays. */
static int dbl_sums(void) {
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("EMU_DOUBLE");
        v = e && !strcmp(e, "1");
    }
    return v;
}

/* part[s][t][o] = fp32 sum over split s's inputs of x[t][i] * W(o, i). */
typedef float (*wfn)(const void *ctx, size_t o, size_t i);
static void split_gemm(float *part, const uint16_t *x, uint32_t n_tok, uint32_t n_in,
                       uint32_t n_out, uint32_t n_split, uint32_t kps, wfn w, const void *ctx) {
    TM_ASSERT((size_t)n_split * kps >= n_in && (size_t)(n_split - 1) * kps < n_in);
    for (uint32_t s = 0; s < n_split; s++)
        for (uint32_t t = 0; t < n_tok; t++)
            for (uint32_t o = 0; o < n_out; o++) {
                float acc = 0.0f;
                double dacc = 0.0;
                for (uint32_t i = s * kps; i < TM_MIN(n_in, (s + 1) * kps); i++) {
                    acc += bf(x[(size_t)t * n_in + i]) * w(ctx, o, i);
                    dacc += (double)bf(x[(size_t)t * n_in + i]) * w(ctx, o, i);
                }
                part[((size_t)s * n_tok + t) * n_out + o] = dbl_sums() ? (float)dacc : acc;
            }
}

typedef struct wctx {
    const void *w, *scale;
    uint32_t n_in;
} wctx;
static float w_bf16(const void *c, size_t o, size_t i) {
    const wctx *x = c;
    return bf(((const uint16_t *)x->w)[o * x->n_in + i]);
}
static float w_fp8_32(const void *c, size_t o, size_t i) {
    const wctx *x = c;
    const uint8_t *s = x->scale;
    return ldexpf(tm_e4m3_to_f32(((const uint8_t *)x->w)[o * x->n_in + i]),
                  (int)s[o / 32 * (x->n_in / 32) + i / 32] - 127);
}
static float w_mxfp4(const void *c, size_t o, size_t i) {
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    const wctx *x = c;
    const uint8_t b = ((const uint8_t *)x->w)[(o * x->n_in + i) / 2];
    const uint8_t nib = (uint8_t)(i % 2 == (TM_MXFP4_EVEN_LOW ? 0u : 1u) ? b & 0xf : b >> 4);
    const float v = (nib & 8 ? -1.0f : 1.0f) * mag[nib & 7];
    return ldexpf(v, (int)((const uint8_t *)x->scale)[o * (x->n_in / 32) + i / 32] - 127);
}

tm_rc tm_k_gemm_fp8(const tm_k_gemm_fp8_args *a, cudaStream_t s, tm_err *err) {
    (void)s, (void)err;
    EMU_RECORD(run_gemm_fp8, a, sizeof(*a));
    TM_ASSERT(a->scale_kind == TM_K_FP8_BLOCK32_E8M0 && a->k_per_split % 64 == 0 &&
              tm_k_gemm_fp8_kind_fits(a->scale_kind, a->n_tok, a->n_in, a->n_out));
    n_fp8++;
    const wctx c = {a->w, a->scale, a->n_in};
    split_gemm(a->part, a->x, a->n_tok, a->n_in, a->n_out, a->n_split, a->k_per_split, w_fp8_32,
               &c);
    return TM_OK;
}

tm_rc tm_k_moe_mxfp4(const tm_k_moe_mxfp4_args *a, cudaStream_t s, tm_err *err) {
    (void)s, (void)err;
    EMU_RECORD(run_moe_mxfp4, a, sizeof(*a));
    TM_ASSERT(a->n_pair <= TM_MOE_MAX_PAIRS && a->n_in % 32 == 0 && a->k_per_split % 128 == 0);
    n_moe++;
    for (uint32_t p = 0; p < a->n_pair; p++) {
        const int32_t e = a->pair_expert[p];
        if (e < 0 || (uint32_t)e >= a->n_expert)
            continue;
        const size_t per = (size_t)a->n_out * a->n_in;
        const wctx c = {a->w + (size_t)e * per / 2, a->scale + (size_t)e * per / 32, a->n_in};
        float *row = malloc((size_t)a->n_split * a->n_out * sizeof(float));
        TM_ASSERT(row);
        split_gemm(row, a->x + (size_t)a->pair_row[p] * a->n_in, 1, a->n_in, a->n_out, a->n_split,
                   a->k_per_split, w_mxfp4, &c);
        for (uint32_t k = 0; k < a->n_split; k++)
            memcpy(a->part + ((size_t)k * a->n_pair + p) * a->n_out, row + (size_t)k * a->n_out,
                   (size_t)a->n_out * sizeof(float));
        free(row);
    }
    return TM_OK;
}

tm_rc tm_k_sum_parts_cols(const tm_k_sum_parts_cols_args *a, cudaStream_t s, tm_err *err) {
    (void)s, (void)err;
    EMU_RECORD(run_sum_parts_cols, a, sizeof(*a));
    TM_ASSERT(a->n_part >= 1 && a->ld_y >= a->n_col);
    n_sum++;
    for (uint32_t t = 0; t < a->n_tok; t++)
        for (uint32_t j = 0; j < a->n_col; j++) {
            float acc = 0.0f;
            for (uint32_t p = 0; p < a->n_part; p++)
                acc += a->part[p * a->stride + (size_t)t * a->n_col + j];
            a->y[(size_t)t * a->ld_y + j] = acc;
        }
    return TM_OK;
}

/* ---- the runtime's launchers (engine_cuda.c) ---- */

typedef struct gemm_a {
    tm_cuda_engine *impl;
    const uint16_t *w, *x;
    uint32_t ldx;
    void *y;
    uint32_t ldy, n_tok, n_in, n_out;
    float beta;
} gemm_a;
static void run_gemm(const void *p) {
    const gemm_a *a = p;
    (void)tm_cuda_gemm(a->impl, "replay", a->w, a->x, a->ldx, a->y, 1, a->ldy, a->n_tok, a->n_in,
                       a->n_out, a->beta, NULL);
}
typedef struct skinny_a {
    float *part;
    const uint16_t *x, *w;
    uint32_t T, n_in, n_out, n_split, kps;
} skinny_a;
static void run_skinny(const void *p) {
    const skinny_a *a = p;
    const wctx c = {a->w, NULL, a->n_in};
    split_gemm(a->part, a->x, a->T, a->n_in, a->n_out, a->n_split, a->kps, w_bf16, &c);
}

tm_rc tm_cuda_gemm(tm_cuda_engine *impl, const char *what, const uint16_t *w, const uint16_t *x,
                   uint32_t ldx, void *y, int y_f32, uint32_t ldy, uint32_t n_tok, uint32_t n_in,
                   uint32_t n_out, float beta, tm_err *err) {
    (void)impl, (void)what, (void)err;
    TM_ASSERT(y_f32 && (beta == 0.0f || beta == 1.0f) && ldx >= n_in && ldy >= n_out);
    const gemm_a ga = {impl, w, x, ldx, y, ldy, n_tok, n_in, n_out, beta};
    EMU_RECORD(run_gemm, &ga, sizeof(ga));
    n_gemm++;
    for (uint32_t t = 0; t < n_tok; t++)
        for (uint32_t o = 0; o < n_out; o++) {
            float acc = 0.0f;
            double dacc = 0.0;
            for (uint32_t i = 0; i < n_in; i++) {
                acc += bf(x[(size_t)t * ldx + i]) * bf(w[(size_t)o * n_in + i]);
                dacc += (double)bf(x[(size_t)t * ldx + i]) * bf(w[(size_t)o * n_in + i]);
            }
            acc = dbl_sums() ? (float)dacc : acc;
            float *yo = (float *)y + (size_t)t * ldy + o;
            *yo = beta == 0.0f ? acc : acc + *yo;
        }
    return TM_OK;
}

tm_rc tm_cuda_project(tm_cuda_engine *impl, int abl, const char *what, const uint16_t *w,
                      const uint16_t *x, uint32_t T, uint32_t n_in, uint32_t n_out, float *dst,
                      float beta, tm_cuda_proj *out, tm_err *err) {
    (void)abl;
    if (T <= impl->sk_max_tok && tm_k_gemm_skinny_fits(T, n_in, n_out)) {
        uint32_t kps = 0;
        const uint32_t n_split = tm_k_gemm_skinny_splits(n_in, n_out, impl->n_sm, &kps);
        float *part = n_split == 1 && beta == 0.0f ? dst : impl->sk_part;
        TM_ASSERT((size_t)n_split * T * n_out <= impl->sk_part_floats);
        n_skinny++;
        *out = (tm_cuda_proj){.p = part, .n = n_split, .stride = (size_t)T * n_out};
        const skinny_a sa = {part, x, w, T, n_in, n_out, n_split, kps};
        EMU_RECORD(run_skinny, &sa, sizeof(sa));
        run_skinny(&sa);
        return TM_OK;
    }
    *out = (tm_cuda_proj){.p = dst, .n = 1, .stride = 0};
    return tm_cuda_gemm(impl, what, w, x, n_in, dst, 1, n_out, T, n_in, n_out, beta, err);
}

/* Random fills are not emulated (emu_cuda.c's tm_k_fill_bf16 refuses too). */
typedef struct memset_a {
    void *p;
    int v;
    size_t n;
} memset_a;
static void run_memset(const void *p) {
    const memset_a *a = p;
    memset(a->p, a->v, a->n);
}
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s) {
    (void)s;
    if (emu_capturing()) {
        const memset_a ma = {p, v, n};
        emu_record(run_memset, &ma, sizeof(ma));
        return cudaSuccess;
    }
    memset(p, v, n);
    return cudaSuccess;
}
