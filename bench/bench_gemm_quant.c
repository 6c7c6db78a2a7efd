/* bench/bench_gemm_quant.c - weight-stream rate of the quantized decode GEMMs
 * (kernels/gemm_quant.h) and of the bf16 gemm_skinny on the same shapes, against a device-to-device
 * copy measured in the same run. Needs a GPU; prints one parseable line per case.
 *
 * Method: each case's weights (values + scales) are laid out in C copies, C chosen so that the
 * copies together are >= 512 MB (more than 10x the H200's 50 MB L2), and rep r reads copy r % C, so
 * that the L2 does not serve the weights. Each launch is timed alone with CUDA events on one
 * stream; the median of --reps (default 30) launches after 5 warm-ups is reported. GB/s counts the
 * weight bytes the kernel must read (values + scales; x and the fp32 partials are ignored, and so
 * is the consumer's sum of split partials). The copy figure is cudaMemcpyAsync of a 2 GiB buffer,
 * counting bytes read + written (as bench_engine), median of 20: pct = GB/s / copy GB/s, i.e. the
 * bytes floor over the measured time.
 *
 * The MoE case (DeepSeek-V4-Flash experts: hidden 4096, width 2048, 256 experts, 8 tokens top-6,
 * gate|up fused as [4096][4096] and down [4096][2048]): 16 seeded routings rotate over the reps;
 * each rep's bytes floor is its distinct experts' bytes; the median of the per-rep GB/s is
 * printed with the mean distinct count.
 *
 * Weight values are a constant byte pattern (valid in every format; the kernels' time does not
 * depend on the values).
 *
 * Output lines:
 *   copy gbs=<copy GB/s>
 *   case fmt=<bf16|fp8-block-f32|fp8-block-e8m0|fp8-channel|mxfp4|fp8-block32-e8m0|
 *            moe-mxfp4-gateup|moe-mxfp4-down>
 *        var=<mma|mma-cvt|fma|skinny> depth=<4|8> tok=<n> n_in=<k> n_out=<n> split=<s> bytes=<B>
 *        us=<median us> gbs=<GB/s> pct=<% of copy> [experts=<mean distinct>]
 * Usage: bench_gemm_quant [--reps R] [--quick] (quick: W8 only, default variants)
 *        bench_gemm_quant --block32 [--reps R] (DeepSeek-V4.1-Flash dense shapes, tokens 1 / 8 /
 *          16: bf16 skinny, FP8 128x128 e8m0, FP8 32x32 e8m0 mma depth 4 / 8, mma-cvt, fma)
 *        bench_gemm_quant --only CASE[/CASE...] [--reps R]
 *   runs just those cases, CASE = FMT,N_IN,N_OUT,TOK[,DEPTH[,SPLIT[,VAR]]] (FMT as printed, or
 *   moe-gateup / moe-down with N_IN, N_OUT of one expert; DEPTH 0 = default; SPLIT > 0 forces
 *   that many splits instead of the planner's; VAR mma | mma-cvt | fma); R may be as low as 1
 *   there (e.g. under Nsight Compute: 5 warm-ups, then R timed launches per case). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "kernels/gemm_quant.h"
#include "kernels/gemm_skinny.h"

#define POOL_BYTES ((size_t)1 << 30)
#define MIN_SPAN ((size_t)512 << 20)
#define WARM 5
#define MAX_REPS 1000

static int g_reps = 30;
static int g_n_sm;
static cudaStream_t g_s;
static uint8_t *g_pool; /* POOL_BYTES of weights, a valid pattern in every format */
static double g_copy_gbs;
static uint32_t g_force_split; /* --only SPLIT: 0 = the planner's */

/* k_per_split for a forced split count (a multiple of unit) */
static uint32_t forced_split(uint32_t n_in, uint32_t unit, uint32_t *kps) {
    uint32_t k = (n_in + g_force_split - 1) / g_force_split;
    k = (k + unit - 1) / unit * unit;
    *kps = k;
    return (n_in + k - 1) / k;
}

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof(double), cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* One launch of a case for rep r (r < 0: warm-up); returns 0 on success. */
typedef int (*launch_fn)(void *ctx, int r);

/* Per-launch times in us (median written to *us_med) of reps launches after WARM warm-ups; t[]
 * gets each rep's time. */
static void time_case(launch_fn fn, void *ctx, double *t, double *us_med) {
    static cudaEvent_t e0[MAX_REPS], e1[MAX_REPS];
    static int made;
    if (!made) {
        for (int i = 0; i < MAX_REPS; i++) {
            CK(cudaEventCreate(&e0[i]));
            CK(cudaEventCreate(&e1[i]));
        }
        made = 1;
    }
    for (int r = -WARM; r < 0; r++)
        if (fn(ctx, r))
            exit(1);
    CK(cudaStreamSynchronize(g_s));
    for (int r = 0; r < g_reps; r++) {
        CK(cudaEventRecord(e0[r], g_s));
        if (fn(ctx, r))
            exit(1);
        CK(cudaEventRecord(e1[r], g_s));
    }
    CK(cudaStreamSynchronize(g_s));
    double *tmp = malloc((size_t)g_reps * sizeof(double));
    for (int r = 0; r < g_reps; r++) {
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0[r], e1[r]));
        t[r] = tmp[r] = ms * 1e3;
    }
    *us_med = median(tmp, g_reps);
    free(tmp);
}

static double copy_gbs(void) {
    const size_t n = (size_t)2 << 30;
    void *a = NULL, *b = NULL;
    CK(cudaMalloc(&a, n));
    CK(cudaMalloc(&b, n));
    CK(cudaMemset(a, 1, n));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    double t[23];
    for (int i = -3; i < 20; i++) {
        CK(cudaEventRecord(e0, g_s));
        CK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, g_s));
        CK(cudaEventRecord(e1, g_s));
        CK(cudaEventSynchronize(e1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (i >= 0)
            t[i] = ms;
    }
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    cudaFree(a), cudaFree(b);
    return 2.0 * (double)n / (median(t, 20) * 1e-3) / 1e9;
}

/* ---- dense cases ---- */

typedef enum fmt { F_BF16, F_FP8_BF32, F_FP8_BE8, F_FP8_CH, F_MXFP4, F_FP8_B32, F_COUNT } fmt;
static const char *fmt_name[] = {"bf16",        "fp8-block-f32", "fp8-block-e8m0",
                                 "fp8-channel", "mxfp4",         "fp8-block32-e8m0"};

typedef struct dense {
    fmt f;
    tm_k_quant_variant var;
    uint32_t depth, n_tok, n_in, n_out, n_split, kps;
    size_t w_bytes, s_bytes, stride; /* one copy: values, then scales; copies stride apart */
    uint32_t n_copy;
    float *part;
    const uint16_t *x;
} dense;

static int run_dense(void *ctx, int r) {
    dense *d = ctx;
    const uint8_t *base = g_pool + (size_t)((r + WARM) % (int)d->n_copy) * d->stride;
    const void *sc = base + d->w_bytes;
    tm_err err = {0};
    tm_rc rc = TM_OK;
    if (d->f == F_BF16) {
        tm_k_gemm_skinny_args a = {.part = d->part,
                                   .w = (const uint16_t *)base,
                                   .x = d->x,
                                   .n_tok = d->n_tok,
                                   .n_in = d->n_in,
                                   .n_out = d->n_out,
                                   .n_split = d->n_split,
                                   .k_per_split = d->kps,
                                   .unroll = d->depth};
        rc = tm_k_gemm_skinny(&a, g_s, &err);
    } else if (d->f == F_MXFP4) {
        tm_k_gemm_mxfp4_args a = {.part = d->part,
                                  .w = base,
                                  .scale = sc,
                                  .x = d->x,
                                  .n_tok = d->n_tok,
                                  .n_in = d->n_in,
                                  .n_out = d->n_out,
                                  .n_split = d->n_split,
                                  .k_per_split = d->kps,
                                  .depth = d->depth};
        rc = tm_k_gemm_mxfp4(&a, g_s, &err);
    } else {
        const tm_k_fp8_scale k = d->f == F_FP8_BF32  ? TM_K_FP8_BLOCK_F32
                                 : d->f == F_FP8_BE8 ? TM_K_FP8_BLOCK_E8M0
                                 : d->f == F_FP8_B32 ? TM_K_FP8_BLOCK32_E8M0
                                                     : TM_K_FP8_CHANNEL;
        tm_k_gemm_fp8_args a = {.part = d->part,
                                .w = base,
                                .scale = sc,
                                .x = d->x,
                                .n_tok = d->n_tok,
                                .n_in = d->n_in,
                                .n_out = d->n_out,
                                .n_split = d->n_split,
                                .k_per_split = d->kps,
                                .scale_kind = k,
                                .variant = d->var,
                                .depth = d->depth};
        rc = tm_k_gemm_fp8(&a, g_s, &err);
    }
    if (rc != TM_OK)
        fprintf(stderr, "launch failed: %s\n", err.msg);
    return rc != TM_OK;
}

static float *g_part; /* fp32 partials, big enough for every case */
static uint16_t *g_x; /* bf16 x rows, big enough for every case */

static void dense_case(fmt f, tm_k_quant_variant var, uint32_t depth, uint32_t n_tok, uint32_t n_in,
                       uint32_t n_out) {
    dense d = {.f = f,
               .var = var,
               .depth = depth,
               .n_tok = n_tok,
               .n_in = n_in,
               .n_out = n_out,
               .part = g_part,
               .x = g_x};
    const size_t nw = (size_t)n_out * n_in;
    const size_t n_rb = (n_out + 127) / 128, n_kb = (n_in + 127) / 128;
    switch (f) {
    case F_BF16:
        d.w_bytes = nw * 2, d.s_bytes = 0;
        break;
    case F_FP8_BF32:
        d.w_bytes = nw, d.s_bytes = n_rb * n_kb * 4;
        break;
    case F_FP8_BE8:
        d.w_bytes = nw, d.s_bytes = n_rb * n_kb;
        break;
    case F_FP8_CH:
        d.w_bytes = nw, d.s_bytes = (size_t)n_out * 4;
        break;
    case F_MXFP4:
        d.w_bytes = nw / 2, d.s_bytes = nw / 32;
        break;
    case F_FP8_B32:
        d.w_bytes = nw, d.s_bytes = (size_t)((n_out + 31) / 32) * ((n_in + 31) / 32);
        break;
    case F_COUNT:
        break;
    }
    const size_t bytes = d.w_bytes + d.s_bytes;
    d.stride = (bytes + 255) / 256 * 256;
    size_t n_copy = (MIN_SPAN + bytes - 1) / bytes;
    n_copy = n_copy < 2 ? 2 : n_copy;
    if (n_copy * d.stride > POOL_BYTES)
        n_copy = POOL_BYTES / d.stride;
    if (n_copy < 1) {
        fprintf(stderr, "case too large for the pool: %zu bytes\n", bytes);
        exit(1);
    }
    d.n_copy = (uint32_t)n_copy;
    if (f == F_BF16)
        d.n_split = tm_k_gemm_skinny_splits(n_in, n_out, (uint32_t)g_n_sm, &d.kps);
    else if (f == F_MXFP4)
        d.n_split = tm_k_gemm_mxfp4_splits(n_in, n_out, (uint32_t)g_n_sm, &d.kps);
    else
        d.n_split = tm_k_gemm_fp8_splits(n_in, n_out, (uint32_t)g_n_sm, &d.kps);
    if (g_force_split)
        d.n_split = forced_split(n_in, f == F_BF16 ? 32 : f == F_MXFP4 ? 128 : 64, &d.kps);
    double t[MAX_REPS], us;
    time_case(run_dense, &d, t, &us);
    const double gbs = (double)bytes / (us * 1e3);
    const char *vn = f == F_BF16                 ? "skinny"
                     : var == TM_K_QUANT_MMA_CVT ? "mma-cvt"
                     : var == TM_K_QUANT_FMA     ? "fma"
                                                 : "mma";
    printf("case fmt=%s var=%s depth=%u tok=%u n_in=%u n_out=%u split=%u bytes=%zu us=%.2f "
           "gbs=%.1f pct=%.1f\n",
           fmt_name[f], vn, depth ? depth : 4, n_tok, n_in, n_out, d.n_split, bytes, us, gbs,
           100.0 * gbs / g_copy_gbs);
    fflush(stdout);
}

/* ---- the MoE case ---- */

#define N_ROUTE 16
#define MOE_E 256
#define MOE_TOK 8
#define MOE_TOPK 6

typedef struct moe {
    const uint8_t *w, *sc;
    uint32_t n_in, n_out, depth, n_split, kps, n_pair;
    int32_t *d_pe[N_ROUTE];
    uint32_t *d_pr[N_ROUTE];
    uint32_t max_pair[N_ROUTE], n_distinct[N_ROUTE];
    float *part;
} moe;

static int run_moe(void *ctx, int r) {
    moe *m = ctx;
    const int k = (r + WARM) % N_ROUTE;
    tm_k_moe_mxfp4_args a = {.part = m->part,
                             .w = m->w,
                             .scale = m->sc,
                             .x = g_x,
                             .pair_expert = m->d_pe[k],
                             .pair_row = m->d_pr[k],
                             .n_pair = m->n_pair,
                             .n_expert = MOE_E,
                             .max_pair_per_expert = m->max_pair[k],
                             .n_in = m->n_in,
                             .n_out = m->n_out,
                             .n_split = m->n_split,
                             .k_per_split = m->kps,
                             .depth = m->depth};
    tm_err err = {0};
    const tm_rc rc = tm_k_moe_mxfp4(&a, g_s, &err);
    if (rc != TM_OK)
        fprintf(stderr, "launch failed: %s\n", err.msg);
    return rc != TM_OK;
}

static uint64_t g_rng = 0x6d6f65ull;
static uint32_t urand(uint32_t n) {
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)((g_rng >> 11) % n);
}

static void moe_case(uint8_t *mpool, uint32_t n_in, uint32_t n_out, int per_pair_x,
                     uint32_t depth) {
    moe m = {.w = mpool, .n_in = n_in, .n_out = n_out, .depth = depth, .part = g_part};
    const size_t ew = (size_t)n_out * n_in / 2, es = (size_t)n_out * n_in / 32;
    m.sc = mpool + ew * MOE_E;
    m.n_pair = MOE_TOK * MOE_TOPK;
    double mean_distinct = 0;
    g_rng = 0x6d6f65ull; // the same routings for every MoE case
    for (int k = 0; k < N_ROUTE; k++) {
        int32_t pe[MOE_TOK * MOE_TOPK];
        uint32_t pr[MOE_TOK * MOE_TOPK], cnt[MOE_E] = {0};
        for (uint32_t t = 0; t < MOE_TOK; t++)
            for (uint32_t i = 0; i < MOE_TOPK; i++) {
                int32_t e;
                int dup;
                do {
                    e = (int32_t)urand(MOE_E);
                    dup = 0;
                    for (uint32_t j = 0; j < i; j++)
                        dup |= pe[t * MOE_TOPK + j] == e;
                } while (dup);
                pe[t * MOE_TOPK + i] = e;
                pr[t * MOE_TOPK + i] = per_pair_x ? t * MOE_TOPK + i : t;
                cnt[e]++;
            }
        m.max_pair[k] = 0, m.n_distinct[k] = 0;
        for (int e = 0; e < MOE_E; e++) {
            m.n_distinct[k] += cnt[e] > 0;
            m.max_pair[k] = cnt[e] > m.max_pair[k] ? cnt[e] : m.max_pair[k];
        }
        mean_distinct += m.n_distinct[k] / (double)N_ROUTE;
        CK(cudaMalloc((void **)&m.d_pe[k], sizeof(pe)));
        CK(cudaMalloc((void **)&m.d_pr[k], sizeof(pr)));
        CK(cudaMemcpy(m.d_pe[k], pe, sizeof(pe), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(m.d_pr[k], pr, sizeof(pr), cudaMemcpyHostToDevice));
    }
    m.n_split = tm_k_gemm_mxfp4_splits(n_in, (uint32_t)(n_out * mean_distinct), (uint32_t)g_n_sm,
                                       &m.kps);
    if (g_force_split)
        m.n_split = forced_split(n_in, 128, &m.kps);
    double t[MAX_REPS], us;
    time_case(run_moe, &m, t, &us);
    double g[MAX_REPS];
    for (int r = 0; r < g_reps; r++) {
        const int k = (r + WARM) % N_ROUTE;
        g[r] = (double)m.n_distinct[k] * (double)(ew + es) / (t[r] * 1e3);
    }
    const double gbs = median(g, g_reps);
    printf("case fmt=%s var=mma depth=%u tok=%u n_in=%u n_out=%u split=%u bytes=%.0f us=%.2f "
           "gbs=%.1f pct=%.1f experts=%.1f\n",
           per_pair_x ? "moe-mxfp4-down" : "moe-mxfp4-gateup", depth ? depth : 4, MOE_TOK, n_in,
           n_out, m.n_split, mean_distinct * (double)(ew + es), us, gbs, 100.0 * gbs / g_copy_gbs,
           mean_distinct);
    fflush(stdout);
    for (int k = 0; k < N_ROUTE; k++)
        cudaFree(m.d_pe[k]), cudaFree(m.d_pr[k]);
}

/* --only: cases separated by '/', each FMT,N_IN,N_OUT,TOK[,DEPTH[,SPLIT[,VAR]]]; 2 on a bad
 * spec. The MoE cases allocate their own pool (g_pool is freed first). */
static int run_only(const char *list) {
    char buf[8192];
    snprintf(buf, sizeof(buf), "%s", list);
    for (char *save = NULL, *spec = strtok_r(buf, "/", &save); spec;
         spec = strtok_r(NULL, "/", &save)) {
        char o_fmt[32] = "", o_var[16] = "mma";
        unsigned o_in = 0, o_out = 0, o_tok = 0, o_depth = 0, o_split = 0;
        if (sscanf(spec, "%31[^,],%u,%u,%u,%u,%u,%15s", o_fmt, &o_in, &o_out, &o_tok, &o_depth,
                   &o_split, o_var) < 4 ||
            o_split > TM_QUANT_MAX_SPLIT || o_tok < 1 || o_tok > TM_QUANT_MAX_TOK) {
            fprintf(stderr, "--only: bad case %s\n", spec);
            return 2;
        }
        g_force_split = o_split;
        const tm_k_quant_variant var = !strcmp(o_var, "mma-cvt") ? TM_K_QUANT_MMA_CVT
                                       : !strcmp(o_var, "fma")   ? TM_K_QUANT_FMA
                                                                 : TM_K_QUANT_MMA;
        int done = 0;
        for (int f = 0; f < F_COUNT && !done; f++)
            if (!strcmp(o_fmt, fmt_name[f])) {
                if (!g_pool) {
                    CK(cudaMalloc((void **)&g_pool, POOL_BYTES));
                    CK(cudaMemset(g_pool, 0x3c, POOL_BYTES));
                }
                dense_case((fmt)f, var, o_depth, o_tok, o_in, o_out);
                done = 1;
            }
        if (!done && (!strcmp(o_fmt, "moe-gateup") || !strcmp(o_fmt, "moe-down"))) {
            cudaFree(g_pool);
            g_pool = NULL;
            const size_t mb = (size_t)MOE_E * o_in * o_out / 2 + (size_t)MOE_E * o_in * o_out / 32;
            uint8_t *mpool = NULL;
            CK(cudaMalloc((void **)&mpool, mb));
            CK(cudaMemset(mpool, 0x3c, mb));
            CK(cudaDeviceSynchronize());
            moe_case(mpool, o_in, o_out, !strcmp(o_fmt, "moe-down"), o_depth ? o_depth : 4);
            cudaFree(mpool);
            done = 1;
        }
        if (!done) {
            fprintf(stderr, "--only: unknown format %s\n", o_fmt);
            return 2;
        }
    }
    g_force_split = 0;
    return 0;
}

/* --block32: the released DeepSeek-V4.1-Flash's dense shapes (hidden 5120): wq_a 5120 -> 1280,
 * wq_b 1280 -> 64 x 512, wo_b 8 x 1024 -> 5120 and the shared expert's down 2304 -> 5120: the
 * 32x32 ue8m0 FP8 kernel against the 128x128 e8m0 one (the same value bytes, 16x fewer scale
 * bytes) and the bf16 skinny kernel (twice the bytes). */
static void run_block32(void) {
    const uint32_t shapes[4][2] = {{5120, 1280}, {1280, 32768}, {8192, 5120}, {2304, 5120}};
    const uint32_t toks[3] = {1, 8, 16};
    for (int si = 0; si < 4; si++)
        for (int ti = 0; ti < 3; ti++) {
            const uint32_t n_in = shapes[si][0], n_out = shapes[si][1], tok = toks[ti];
            dense_case(F_BF16, TM_K_QUANT_DEFAULT, 0, tok, n_in, n_out);
            dense_case(F_FP8_BE8, TM_K_QUANT_MMA, 0, tok, n_in, n_out);
            dense_case(F_FP8_B32, TM_K_QUANT_MMA, 0, tok, n_in, n_out);
            dense_case(F_FP8_B32, TM_K_QUANT_MMA, 8, tok, n_in, n_out);
            dense_case(F_FP8_B32, TM_K_QUANT_MMA_CVT, 0, tok, n_in, n_out);
            dense_case(F_FP8_B32, TM_K_QUANT_FMA, 0, tok, n_in, n_out);
        }
}

int main(int argc, char **argv) {
    int quick = 0, block32 = 0;
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            g_reps = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--quick")) {
            quick = 1;
        } else if (!strcmp(argv[i], "--block32")) {
            block32 = 1;
        } else if (!strcmp(argv[i], "--only") && i + 1 < argc) {
            only = argv[++i];
        } else {
            fprintf(stderr,
                    "usage: bench_gemm_quant [--reps R (20..%d)] [--quick | --block32] | --only "
                    "FMT,N_IN,N_OUT,TOK[,DEPTH[,SPLIT[,VAR]]][/...] [--reps R (1..)]\n",
                    MAX_REPS);
            return 2;
        }
    }
    if (g_reps < (only ? 1 : 20) || g_reps > MAX_REPS) {
        fprintf(stderr, "--reps must be %d..%d\n", only ? 1 : 20, MAX_REPS);
        return 2;
    }
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        fprintf(stderr, "no CUDA device\n");
        return 77;
    }
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    CK(cudaDeviceGetAttribute(&g_n_sm, cudaDevAttrMultiProcessorCount, 0));
    CK(cudaStreamCreateWithFlags(&g_s, cudaStreamNonBlocking));
    printf("device %s sms=%d l2_mb=%.0f reps=%d\n", prop.name, g_n_sm, prop.l2CacheSize / 1048576.0,
           g_reps);
    g_copy_gbs = copy_gbs();
    printf("copy gbs=%.1f\n", g_copy_gbs);
    fflush(stdout);

    CK(cudaMalloc((void **)&g_pool, POOL_BYTES));
    CK(cudaMemset(g_pool, 0x3c, POOL_BYTES)); // e4m3 1.5, bf16 ~0.0115, e2m1 -2 / 1.5, e8m0 2^-67
    CK(cudaMalloc((void **)&g_part, (size_t)TM_QUANT_MAX_SPLIT * 64 * 28672 * 4));
    CK(cudaMalloc((void **)&g_x, (size_t)64 * 16384 * 2));
    CK(cudaMemset(g_x, 0x3c, (size_t)64 * 16384 * 2));
    CK(cudaDeviceSynchronize());

    if (block32) {
        run_block32();
        cudaFree(g_pool);
        cudaFree(g_part), cudaFree(g_x);
        cudaStreamDestroy(g_s);
        return 0;
    }
    if (only) {
        const int rc = run_only(only);
        cudaFree(g_pool);
        cudaFree(g_part), cudaFree(g_x);
        cudaStreamDestroy(g_s);
        return rc;
    }

    // llama8b decode projections: qkv, o, gate|up, down
    const uint32_t shapes[4][2] = {{4096, 6144}, {4096, 4096}, {4096, 28672}, {14336, 4096}};
    const uint32_t toks[3] = {1, 8, 16};
    for (int si = 0; si < 4; si++) {
        const uint32_t n_in = shapes[si][0], n_out = shapes[si][1];
        for (int ti = 0; ti < 3; ti++) {
            const uint32_t tok = toks[ti];
            if (quick && tok != 8)
                continue;
            dense_case(F_BF16, TM_K_QUANT_DEFAULT, 0, tok, n_in, n_out);
            dense_case(F_FP8_BF32, TM_K_QUANT_MMA, 0, tok, n_in, n_out);
            dense_case(F_FP8_CH, TM_K_QUANT_MMA, 0, tok, n_in, n_out);
            dense_case(F_MXFP4, TM_K_QUANT_DEFAULT, 0, tok, n_in, n_out);
            if (quick)
                continue;
            dense_case(F_BF16, TM_K_QUANT_DEFAULT, 8, tok, n_in, n_out);
            dense_case(F_FP8_BE8, TM_K_QUANT_MMA, 0, tok, n_in, n_out);
            dense_case(F_FP8_B32, TM_K_QUANT_MMA, 0, tok, n_in, n_out);
            dense_case(F_FP8_BF32, TM_K_QUANT_MMA, 8, tok, n_in, n_out);
            dense_case(F_FP8_BF32, TM_K_QUANT_MMA_CVT, 0, tok, n_in, n_out);
            dense_case(F_FP8_BF32, TM_K_QUANT_MMA_CVT, 8, tok, n_in, n_out);
            dense_case(F_FP8_CH, TM_K_QUANT_MMA_CVT, 0, tok, n_in, n_out);
            dense_case(F_FP8_BF32, TM_K_QUANT_FMA, 0, tok, n_in, n_out);
            dense_case(F_FP8_CH, TM_K_QUANT_FMA, 0, tok, n_in, n_out);
            dense_case(F_MXFP4, TM_K_QUANT_DEFAULT, 8, tok, n_in, n_out);
        }
    }
    cudaFree(g_pool);

    // DeepSeek-V4-Flash experts: all 256 experts' gate|up (the larger) fit one pool
    const size_t moe_bytes = (size_t)MOE_E * 4096 * 4096 / 2 + (size_t)MOE_E * 4096 * 4096 / 32;
    uint8_t *mpool = NULL;
    CK(cudaMalloc((void **)&mpool, moe_bytes));
    CK(cudaMemset(mpool, 0x3c, moe_bytes));
    CK(cudaDeviceSynchronize());
    const uint32_t depths[2] = {4, 8};
    for (int di = 0; di < (quick ? 1 : 2); di++) {
        moe_case(mpool, 4096, 2 * 2048, 0, depths[di]); // gate|up fused
        moe_case(mpool, 2048, 4096, 1, depths[di]);     // down, one x row per pair
    }
    cudaFree(mpool);
    cudaFree(g_part), cudaFree(g_x);
    cudaStreamDestroy(g_s);
    return 0;
}
