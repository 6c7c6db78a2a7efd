/* kernels/dsv41.cu - the DeepSeek-V4.1 quantize-dequantize ops and the Engram gate (see
 * dsv41.h). The quantizers take one thread per scale group and do exactly the CPU engine's fp32
 * operations (IEEE division __fdiv_rn, so a fast-math build cannot change them); the gate takes
 * one block per (token, stream) with double block sums. */
#include <cuda_fp8.h>

#include "kernels/common.cuh"
#include "kernels/dsv41.h"

/* 2^ceil(log2(amax * max_inv)) from the fp32 product's bits (the kernels' fast_round_scale). */
static __device__ float round_scale(float amax, float max_inv) {
    const uint32_t bits = __float_as_uint(__fmul_rn(amax, max_inv));
    const int32_t lg = (int32_t)((bits >> 23) & 0xffu) - 127 + ((bits & 0x7fffffu) != 0);
    return __uint_as_float((uint32_t)(lg + 127) << 23);
}

/* e4m3fn round-to-nearest-even of v clamped to +-448, back to fp32. */
static __device__ float e4m3_sat(float v) {
    const float c = fminf(fmaxf(v, -448.0f), 448.0f);
    const __nv_fp8_e4m3 q(c); /* RNE, satfinite */
    return (float)q;
}

/* e2m1 round-to-nearest-even of v in [-6, 6] (ties to the even code), sign kept. */
static __device__ float e2m1_round(float v) {
    const float mids[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    const int tie_up[7] = {0, 1, 0, 1, 0, 1, 0};
    const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    const float a = fabsf(v);
    int code = 0;
#pragma unroll
    for (int i = 0; i < 7; i++)
        code += (a > mids[i]) || (a == mids[i] && tie_up[i]);
    return signbit(v) ? -mag[code] : mag[code];
}

static __global__ void act_quant_kernel(float *x, size_t n_grp) {
    for (size_t g = (size_t)blockIdx.x * blockDim.x + threadIdx.x; g < n_grp;
         g += (size_t)gridDim.x * blockDim.x) {
        float *p = x + g * 32;
        float amax = 0.0f;
        for (int i = 0; i < 32; i++)
            amax = fmaxf(amax, fabsf(p[i]));
        const float s = round_scale(fmaxf(amax, 1e-4f), (float)(1.0 / 448.0));
        for (int i = 0; i < 32; i++)
            p[i] = __fmul_rn(e4m3_sat(__fdiv_rn(p[i], s)), s);
    }
}

static __global__ void fp4_act_quant_kernel(float *x, size_t n_grp, uint32_t block,
                                            int e4m3_scale) {
    for (size_t g = (size_t)blockIdx.x * blockDim.x + threadIdx.x; g < n_grp;
         g += (size_t)gridDim.x * blockDim.x) {
        float *p = x + g * block;
        float amax = 0.0f, s;
        for (uint32_t i = 0; i < block; i++)
            amax = fmaxf(amax, fabsf(p[i]));
        if (e4m3_scale)
            s = e4m3_sat(__fdiv_rn(fmaxf(amax, 6.0f * 0x1p-9f), 6.0f));
        else
            s = round_scale(fmaxf(amax, 6.0f * 0x1p-126f), (float)(1.0 / 6.0));
        for (uint32_t i = 0; i < block; i++)
            p[i] = __fmul_rn(e2m1_round(fminf(fmaxf(__fdiv_rn(p[i], s), -6.0f), 6.0f)), s);
    }
}

static unsigned grid_for(size_t n_grp) {
    return (unsigned)TM_MIN(TM_CEIL_DIV(n_grp, (size_t)128), (size_t)132 * 16);
}

extern "C" tm_rc tm_k_dsv41_act_quant(float *x, size_t n, cudaStream_t s, tm_err *err) {
    if (n == 0)
        return TM_OK;
    TM_ASSERT(x && n % 32 == 0);
    act_quant_kernel<<<grid_for(n / 32), 128, 0, s>>>(x, n / 32);
    return tm_cuda_launched(err, s, "dsv41_act_quant");
}

extern "C" tm_rc tm_k_dsv41_fp4_act_quant(float *x, size_t n, uint32_t block, int e4m3_scale,
                                          cudaStream_t s, tm_err *err) {
    if (n == 0)
        return TM_OK;
    TM_ASSERT(x && (block == 16 || block == 32) && n % block == 0);
    fp4_act_quant_kernel<<<grid_for(n / block), 128, 0, s>>>(x, n / block, block, e4m3_scale);
    return tm_cuda_launched(err, s, "dsv41_fp4_act_quant");
}

/* One thread per 32-group of a row (aq: act_quant_kernel's operations) or per value (aq 0: the
 * hi / lo split). */
static __global__ void to_bf16_kernel(uint16_t *y, uint16_t *lo, const float *x, uint32_t ldx,
                                      uint32_t n, uint32_t n_tok, int aq) {
    const size_t per = aq ? n / 32 : n, total = per * n_tok;
    for (size_t g = (size_t)blockIdx.x * blockDim.x + threadIdx.x; g < total;
         g += (size_t)gridDim.x * blockDim.x) {
        const size_t t = g / per, j = g % per;
        const float *xr = x + t * ldx;
        uint16_t *yr = y + t * n;
        if (!aq) {
            const __nv_bfloat16 hi = __float2bfloat16_rn(xr[j]);
            yr[j] = __bfloat16_as_ushort(hi);
            lo[t * n + j] = __bfloat16_as_ushort(
                __float2bfloat16_rn(__fsub_rn(xr[j], __bfloat162float(hi)))); // exact difference
            continue;
        }
        const float *p = xr + j * 32;
        float amax = 0.0f;
        for (int i = 0; i < 32; i++)
            amax = fmaxf(amax, fabsf(p[i]));
        const float s = round_scale(fmaxf(amax, 1e-4f), (float)(1.0 / 448.0));
        for (int i = 0; i < 32; i++) // e4m3 * 2^k: exact in bf16, so _rn changes nothing
            yr[j * 32 + i] = __bfloat16_as_ushort(
                __float2bfloat16_rn(__fmul_rn(e4m3_sat(__fdiv_rn(p[i], s)), s)));
    }
}

extern "C" tm_rc tm_k_dsv41_to_bf16(const tm_k_dsv41_to_bf16_args *a, cudaStream_t s, tm_err *err) {
    if (a->n_tok == 0 || a->n == 0)
        return TM_OK;
    TM_ASSERT(a->y && a->x && a->ldx >= a->n && (a->aq ? a->n % 32 == 0 && !a->lo : a->lo != NULL));
    const size_t total = (size_t)a->n_tok * (a->aq ? a->n / 32 : a->n);
    to_bf16_kernel<<<grid_for(total), 128, 0, s>>>(a->y, a->lo, a->x, a->ldx, a->n, a->n_tok,
                                                   a->aq);
    return tm_cuda_launched(err, s, "dsv41_to_bf16");
}

/* One thread per output value. */
static __global__ void sum_split_kernel(tm_k_dsv41_sum_split_args a) {
    const size_t total = (size_t)a.n_tok * a.n_col;
    for (size_t g = (size_t)blockIdx.x * blockDim.x + threadIdx.x; g < total;
         g += (size_t)gridDim.x * blockDim.x) {
        const size_t t = g / a.n_col, j = g % a.n_col;
        float hi = 0.0f, lo = 0.0f;
        for (uint32_t p = 0; p < a.n_part; p++)
            hi += a.part[p * a.stride + t * a.n_col + j];
        if (a.lo)
            for (uint32_t p = 0; p < a.n_part; p++)
                lo += a.part[p * a.stride + (a.n_tok + t) * a.n_col + j];
        float *y = a.y + t * a.ld_y + j;
        *y = (a.add ? *y : 0.0f) + hi + lo;
    }
}

extern "C" tm_rc tm_k_dsv41_sum_split(const tm_k_dsv41_sum_split_args *a, cudaStream_t s,
                                      tm_err *err) {
    if (a->n_tok == 0 || a->n_col == 0)
        return TM_OK;
    TM_ASSERT(a->y && a->part && a->n_part >= 1 && a->ld_y >= a->n_col);
    sum_split_kernel<<<grid_for((size_t)a->n_tok * a->n_col), 128, 0, s>>>(*a);
    return tm_cuda_launched(err, s, "dsv41_sum_split");
}

static __global__ void dequant_fp8_32_kernel(uint16_t *y, const uint8_t *w, const uint8_t *scale,
                                             uint32_t n_out, uint32_t n_in) {
    const size_t n = (size_t)n_out * n_in;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t o = i / n_in, c = i % n_in;
        __nv_fp8_e4m3 q;
        q.__x = w[i];
        const float v = ldexpf((float)q, (int)scale[(o / 32) * (n_in / 32) + c / 32] - 127);
        y[i] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
    }
}

extern "C" tm_rc tm_k_dsv41_dequant_fp8_32(uint16_t *y, const uint8_t *w, const uint8_t *scale,
                                           uint32_t n_out, uint32_t n_in, cudaStream_t s,
                                           tm_err *err) {
    const size_t n = (size_t)n_out * n_in;
    if (n == 0)
        return TM_OK;
    TM_ASSERT(y && w && scale && n_in % 32 == 0);
    dequant_fp8_32_kernel<<<grid_for(n), 128, 0, s>>>(y, w, scale, n_out, n_in);
    return tm_cuda_launched(err, s, "dsv41_dequant_fp8_32");
}

#define GATE_THREADS 256

/* Block sum of three doubles (every thread gets the totals). */
static __device__ void block_sum3(double *a, double *b, double *c) {
    __shared__ double sh[3][GATE_THREADS / 32];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1) {
        *a += __shfl_xor_sync(0xffffffffu, *a, o);
        *b += __shfl_xor_sync(0xffffffffu, *b, o);
        *c += __shfl_xor_sync(0xffffffffu, *c, o);
    }
    if (lane == 0) {
        sh[0][wid] = *a;
        sh[1][wid] = *b;
        sh[2][wid] = *c;
    }
    __syncthreads();
    double s0 = 0.0, s1 = 0.0, s2 = 0.0;
    for (int w = 0; w < GATE_THREADS / 32; w++) { // the same order in every thread
        s0 += sh[0][w];
        s1 += sh[1][w];
        s2 += sh[2][w];
    }
    *a = s0;
    *b = s1;
    *c = s2;
}

static __global__ void engram_gate_kernel(float *h, const float *kv, const float *w, uint32_t N,
                                          uint32_t D, float eps) {
    const uint32_t t = blockIdx.x / N, c = blockIdx.x % N;
    float *hr = h + ((size_t)t * N + c) * D;
    const float *key = kv + (size_t)t * (N + 1) * D + (size_t)c * D;
    const float *value = kv + (size_t)t * (N + 1) * D + (size_t)N * D;
    const float *wr = w + (size_t)c * D;
    double hh = 0.0, kk = 0.0, dot = 0.0;
    for (uint32_t d = threadIdx.x; d < D; d += blockDim.x) {
        hh += (double)hr[d] * hr[d];
        kk += (double)key[d] * key[d];
        dot += (double)hr[d] * wr[d] * key[d];
    }
    block_sum3(&hh, &kk, &dot);
    const double rstd = 1.0 / sqrt(hh / D + (double)eps) / sqrt(kk / D + (double)eps);
    const double x = dot * rstd * pow((double)D, -0.5);
    const double sq = copysign(sqrt(fmax(fabs(x), 1e-6)), x);
    const double gate = 1.0 / (1.0 + exp(-sq));
    for (uint32_t d = threadIdx.x; d < D; d += blockDim.x)
        hr[d] = (float)((double)hr[d] + gate * value[d]);
}

extern "C" tm_rc tm_k_dsv41_engram_gate(const tm_k_dsv41_engram_gate_args *a, cudaStream_t s,
                                        tm_err *err) {
    if (a->n_tok == 0)
        return TM_OK;
    TM_ASSERT(a->h && a->kv && a->w && a->n_hc > 0 && a->dim > 0 && a->dim <= 8192);
    engram_gate_kernel<<<a->n_tok * a->n_hc, GATE_THREADS, 0, s>>>(a->h, a->kv, a->w, a->n_hc,
                                                                   a->dim, a->eps);
    return tm_cuda_launched(err, s, "dsv41_engram_gate");
}

/* ---- the indexer's selection ---- */

#define SEL_THREADS 256

/* Order-preserving key of (score, position): higher score first, then the lower position. */
static __device__ uint64_t sel_key(float v, uint32_t k) {
    const uint32_t u = __float_as_uint(v);
    const uint32_t o = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((uint64_t)o << 32) | (uint64_t)(0xffffffffu - k);
}

/* The n-th largest key (1 <= n <= m) of v[0..m): radix select, 8 bits a pass from the top. */
static __device__ uint64_t radix_select(const float *v, uint32_t m, uint32_t n) {
    __shared__ uint32_t hist[256];
    __shared__ uint64_t sh_prefix;
    __shared__ uint32_t sh_rem;
    uint64_t prefix = 0, mask = 0;
    uint32_t rem = n;
    for (int shift = 56; shift >= 0; shift -= 8) {
        for (uint32_t b = threadIdx.x; b < 256; b += blockDim.x)
            hist[b] = 0;
        __syncthreads();
        for (uint32_t k = threadIdx.x; k < m; k += blockDim.x) {
            const uint64_t key = sel_key(v[k], k);
            if ((key & mask) == prefix)
                atomicAdd(&hist[(key >> shift) & 0xffu], 1u);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            uint32_t cum = 0;
            int b = 255;
            for (; b > 0; b--) {
                if (cum + hist[b] >= rem)
                    break;
                cum += hist[b];
            }
            sh_rem = rem - cum;
            sh_prefix = prefix | ((uint64_t)b << shift);
        }
        __syncthreads();
        prefix = sh_prefix;
        rem = sh_rem;
        mask |= (uint64_t)0xffu << shift;
        __syncthreads();
    }
    return prefix;
}

/* Writes, in ascending k, every k < m with sel_key(v[k], k) >= thr to out (as T); returns the
 * count (the same in every thread). */
template <typename T>
static __device__ uint32_t compact_ge(const float *v, uint32_t m, uint64_t thr, T *out) {
    __shared__ uint32_t warp_n[SEL_THREADS / 32];
    __shared__ uint32_t base;
    if (threadIdx.x == 0)
        base = 0;
    __syncthreads();
    const uint32_t lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    for (uint32_t k0 = 0; k0 < m; k0 += blockDim.x) {
        const uint32_t k = k0 + threadIdx.x;
        const int f = k < m && sel_key(v[k], k) >= thr;
        const uint32_t bal = __ballot_sync(0xffffffffu, f);
        if (lane == 0)
            warp_n[wid] = __popc(bal);
        __syncthreads();
        uint32_t off = base;
        for (uint32_t w = 0; w < wid; w++)
            off += warp_n[w];
        if (f)
            out[off + __popc(bal & ((1u << lane) - 1u))] = (T)k;
        __syncthreads();
        if (threadIdx.x == 0)
            for (uint32_t w = 0; w < blockDim.x / 32; w++)
                base += warp_n[w];
        __syncthreads();
    }
    return base;
}

static __global__ void select_kernel(tm_k_dsv41_select_args a) {
    const uint32_t t = blockIdx.x, lens = a.lens[t];
    float *sc = a.score + (size_t)t * a.ld;
    if (lens == 0) {
        if (threadIdx.x == 0) {
            a.n_pick[t] = 0;
            if (a.mode == TM_DSV41_SEL_SOURCE)
                a.n_cand[t] = 0;
        }
        return;
    }
    if (a.mode == TM_DSV41_SEL_SOURCE) {
        const uint32_t nb = (lens + a.cb - 1) / a.cb;
        float *bsc = a.bsc + (size_t)t * a.ld;
        for (uint32_t bk = threadIdx.x; bk < nb; bk += blockDim.x) {
            float mx = -INFINITY;
            for (uint32_t k = bk * a.cb; k < min(lens, (bk + 1) * a.cb); k++)
                mx = fmaxf(mx, sc[k]);
            bsc[bk] = bk == nb - 1 ? INFINITY : mx;
        }
        __syncthreads();
        const uint32_t keep = min(nb, a.ctop);
        const uint64_t thr = radix_select(bsc, nb, keep);
        const uint32_t got = compact_ge(bsc, nb, thr, a.cand + (size_t)t * a.ctop);
        if (threadIdx.x == 0)
            a.n_cand[t] = got;
    } else if (a.mode == TM_DSV41_SEL_CONSUMER) {
        // the candidate blocks are in ascending order (the source's compact_ge): a binary
        // search per position (a scan of up to ctop = 2048 blocks per position was O(lens x ctop))
        const uint32_t *cd = a.cand + (size_t)t * a.ctop, nc = a.n_cand[t];
        for (uint32_t k = threadIdx.x; k < lens; k += blockDim.x) {
            const uint32_t bk = k / a.cb;
            uint32_t lo = 0, hi = nc; // the first i with cd[i] >= bk
            while (lo < hi) {
                const uint32_t mid = (lo + hi) / 2;
                if (cd[mid] < bk)
                    lo = mid + 1;
                else
                    hi = mid;
            }
            if (lo == nc || cd[lo] != bk)
                sc[k] = -INFINITY;
        }
    }
    __syncthreads();
    const uint32_t n = min(a.topk, lens);
    const uint64_t thr = radix_select(sc, lens, n);
    const uint32_t got = compact_ge(sc, lens, thr, a.pick + (size_t)t * a.topk);
    if (threadIdx.x == 0)
        a.n_pick[t] = got;
}

extern "C" tm_rc tm_k_dsv41_select(const tm_k_dsv41_select_args *a, cudaStream_t s, tm_err *err) {
    if (a->n_tok == 0)
        return TM_OK;
    TM_ASSERT(a->score && a->lens && a->pick && a->n_pick && a->topk > 0);
    TM_ASSERT(a->mode == TM_DSV41_SEL_PLAIN || (a->cand && a->n_cand && a->cb > 0 && a->ctop > 0 &&
                                                (a->mode != TM_DSV41_SEL_SOURCE || a->bsc)));
    select_kernel<<<a->n_tok, SEL_THREADS, 0, s>>>(*a);
    return tm_cuda_launched(err, s, "dsv41_select");
}

/* ---- the forward pass's ops (tm_cuda_arch_dsv41, runner/engine/cuda/dsv41.c) ----
 * Plain kernels that do the CPU engine's arithmetic: fp32 values, double sums, exp / cos / sin in
 * double, the elementwise fp32 products and sums with explicit IEEE rounding (no contraction). */

/* Warp sum of a double (every lane gets it). */
static __device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

#define ROW_THREADS 256

/* Block sum of a double over ROW_THREADS threads, the same order in every thread. */
static __device__ double block_sum_d(double v) {
    __shared__ double sh[ROW_THREADS / 32];
    v = warp_sum_d(v);
    __syncthreads();
    if ((threadIdx.x & 31) == 0)
        sh[threadIdx.x >> 5] = v;
    __syncthreads();
    double s = 0.0;
    for (int w = 0; w < ROW_THREADS / 32; w++)
        s += sh[w];
    return s;
}

static __device__ __forceinline__ double max_of(double a, double b) { return fmax(a, b); }
static __device__ __forceinline__ uint64_t max_of(uint64_t a, uint64_t b) { return a > b ? a : b; }

/* Block max (max_of) of a double or a 64-bit key over blockDim.x (a multiple of 32, at most 1024)
 * threads; every thread gets it. */
template <typename T> static __device__ T block_max(T v) {
    __shared__ T sh[32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = max_of(v, (T)__shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if ((threadIdx.x & 31) == 0)
        sh[threadIdx.x >> 5] = v;
    __syncthreads();
    T m = sh[0];
    for (uint32_t w = 1; w < blockDim.x / 32; w++)
        m = max_of(m, sh[w]);
    return m;
}

static __device__ __forceinline__ float wload(const void *w, int bf16, size_t i) {
    return bf16 ? tm_bf2f(((const uint16_t *)w)[i]) : ((const float *)w)[i];
}

/* The KV slot of position p of token t's sequence. */
static __device__ __forceinline__ size_t slot_of(const tm_k_dsv41_seqs *q, uint32_t t, uint32_t p) {
    const uint32_t b = q->block_tables[q->seq_bt[q->tok_seq[t]] + p / q->bs];
    return (size_t)b * q->bs + p % q->bs;
}

static unsigned n_blocks(size_t n, unsigned per) {
    return (unsigned)TM_MIN(TM_CEIL_DIV(n, (size_t)per), (size_t)65535 * 8);
}

/* ---- linear: a warp per (output, row), or a block per (output, row) for small grids ---- */

/* Rows t = blockIdx.y, blockIdx.y + gridDim.y, ...: grid y is at most 65535, the expert rows of a
 * step (T x top-k) can be more. */
static __global__ void linear_kernel(tm_k_dsv41_linear_args a) {
    const uint32_t o = blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
    const uint32_t lane = threadIdx.x & 31;
    if (o >= a.n_out)
        return;
    for (uint32_t t = blockIdx.y; t < a.n_tok; t += gridDim.y) {
        const float *x = a.x + (size_t)(t / a.x_div) * a.ldx;
        size_t wrow = (size_t)(a.row0 + o) * a.n_in;
        if (a.sel)
            wrow += (size_t)a.sel[t] * a.w_expert;
        double acc = 0.0;
        for (uint32_t i = lane; i < a.n_in; i += 32) // hot loop
            acc += (double)x[i] * (double)wload(a.w, a.w_bf16, wrow + i);
        acc = warp_sum_d(acc);
        if (lane == 0)
            a.out[(size_t)t * a.ldo + o] = (float)acc;
    }
}

/* A block of ROW_THREADS per (output, row): for few outputs over long rows (the hyper-connection
 * projections: 24 outputs of 4 x dim inputs), where a warp per output leaves the GPU idle and
 * each warp walks its row alone. The same double products, summed per thread, then per block. */
static __global__ void linear_block_kernel(tm_k_dsv41_linear_args a) {
    const uint32_t o = blockIdx.x, t = blockIdx.y; // n_tok < 1024: grid y holds every row
    const float *x = a.x + (size_t)(t / a.x_div) * a.ldx;
    size_t wrow = (size_t)(a.row0 + o) * a.n_in;
    if (a.sel)
        wrow += (size_t)a.sel[t] * a.w_expert;
    double acc = 0.0;
    for (uint32_t i = threadIdx.x; i < a.n_in; i += ROW_THREADS) // hot loop
        acc += (double)x[i] * (double)wload(a.w, a.w_bf16, wrow + i);
    acc = block_sum_d(acc);
    if (threadIdx.x == 0)
        a.out[(size_t)t * a.ldo + o] = (float)acc;
}

extern "C" tm_rc tm_k_dsv41_linear(const tm_k_dsv41_linear_args *a, cudaStream_t s, tm_err *err) {
    if (a->n_tok == 0 || a->n_out == 0)
        return TM_OK;
    TM_ASSERT(a->out && a->x && a->w && a->x_div >= 1);
    // a warp per output unless that gives fewer than ~1024 warps over rows of 2048+ inputs
    if ((uint64_t)a->n_out * a->n_tok < 1024 && a->n_in >= 2048) {
        linear_block_kernel<<<dim3(a->n_out, a->n_tok), ROW_THREADS, 0, s>>>(*a);
        return tm_cuda_launched(err, s, "dsv41_linear");
    }
    const dim3 grid(TM_CEIL_DIV(a->n_out, 8u), TM_MIN(a->n_tok, 65535u));
    linear_kernel<<<grid, 256, 0, s>>>(*a);
    return tm_cuda_launched(err, s, "dsv41_linear");
}

/* ---- rows: RMSNorm, embedding, hyper-connections ---- */

static __global__ void rmsnorm_kernel(float *x, uint32_t ld, const float *w, uint32_t n,
                                      float eps) {
    float *r = x + (size_t)blockIdx.x * ld;
    double ss = 0.0;
    for (uint32_t i = threadIdx.x; i < n; i += ROW_THREADS)
        ss += (double)r[i] * r[i];
    ss = block_sum_d(ss);
    const double rs = 1.0 / sqrt(ss / n + (double)eps);
    for (uint32_t i = threadIdx.x; i < n; i += ROW_THREADS)
        r[i] = (float)((double)r[i] * rs * (w ? (double)w[i] : 1.0));
}

extern "C" tm_rc tm_k_dsv41_rmsnorm(float *x, uint32_t ld, const float *w, uint32_t n_row,
                                    uint32_t n, float eps, cudaStream_t s, tm_err *err) {
    if (n_row == 0)
        return TM_OK;
    TM_ASSERT(x && n > 0 && ld >= n);
    rmsnorm_kernel<<<n_row, ROW_THREADS, 0, s>>>(x, ld, w, n, eps);
    return tm_cuda_launched(err, s, "dsv41_rmsnorm");
}

static __global__ void rope_kernel(tm_k_dsv41_rope_args a) {
    const uint32_t half = a.rd / 2;
    const size_t n = (size_t)a.n_tok * a.n_head * half;
    for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; k < n;
         k += (size_t)gridDim.x * blockDim.x) {
        const uint32_t i = (uint32_t)(k % half), h = (uint32_t)(k / half % a.n_head);
        const uint32_t t = (uint32_t)(k / half / a.n_head);
        uint32_t p = a.pos[t];
        if (a.lat_r)
            p = ((p + 1) / a.lat_r - (p + 1 >= a.lat_r ? 1 : 0)) * a.lat_r;
        const float ang = __fmul_rn((float)p, a.inv_freq[i]);
        const float c = (float)cos((double)ang), sn = __fmul_rn(a.sign, (float)sin((double)ang));
        float *r = a.x + (size_t)t * a.tok_stride + (size_t)h * a.head_stride + a.hd - a.rd;
        const float x0 = r[2 * i], x1 = r[2 * i + 1];
        r[2 * i] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, sn));
        r[2 * i + 1] = __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, sn));
    }
}

extern "C" tm_rc tm_k_dsv41_rope(const tm_k_dsv41_rope_args *a, cudaStream_t s, tm_err *err) {
    if (a->n_tok == 0 || a->rd == 0)
        return TM_OK;
    TM_ASSERT(a->x && a->pos && a->inv_freq && a->rd % 2 == 0 && a->rd <= a->hd);
    const size_t n = (size_t)a->n_tok * a->n_head * (a->rd / 2);
    rope_kernel<<<n_blocks(n, 256), 256, 0, s>>>(*a);
    return tm_cuda_launched(err, s, "dsv41_rope");
}

static __global__ void embed_kernel(float *x, float *st, float *pre, const void *emb, int bf16,
                                    const uint32_t *tokens, uint32_t n_tok, uint32_t D,
                                    uint32_t N) {
    const size_t n = (size_t)n_tok * D;
    for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; k < n;
         k += (size_t)gridDim.x * blockDim.x) {
        const uint32_t t = (uint32_t)(k / D), d = (uint32_t)(k % D);
        const float v = wload(emb, bf16, (size_t)tokens[t] * D + d);
        x[k] = v;
        for (uint32_t i = 0; i < N; i++)
            st[((size_t)t * N + i) * D + d] = v;
        if (d < N)
            pre[(size_t)t * N + d] = d == 0 ? 1.0f : 0.0f;
    }
}

extern "C" tm_rc tm_k_dsv41_embed(float *x, float *streams, float *pre, const void *emb, int bf16,
                                  const uint32_t *tokens, uint32_t n_tok, uint32_t D, uint32_t N,
                                  cudaStream_t s, tm_err *err) {
    if (n_tok == 0)
        return TM_OK;
    TM_ASSERT(x && streams && pre && emb && tokens && N >= 1 && N <= D);
    embed_kernel<<<n_blocks((size_t)n_tok * D, 256), 256, 0, s>>>(x, streams, pre, emb, bf16,
                                                                  tokens, n_tok, D, N);
    return tm_cuda_launched(err, s, "dsv41_embed");
}

/* 1 / (1 + e^-v) in the host's fp32 operations (expf as exp in double rounded once). */
static __device__ float sigmoid_f(float v) {
    return __fdiv_rn(1.0f, __fadd_rn(1.0f, (float)exp(-(double)v)));
}

/* A block per token: the squares' sum over the block, then the (2 + N) N mixes, pre, post and
 * the N x N Sinkhorn matrix with a thread per entry (the first N * N threads), each doing the
 * host's fp32 operations in the host's order (a row's or a column's sum walks it from index 0 in
 * every thread that needs it), so the result is the sequential one's bit for bit. */
static __global__ void hc_split_kernel(tm_k_dsv41_hc_split_args a) {
    __shared__ float m[(2 + TM_DSV41_K_MAX_HC) * TM_DSV41_K_MAX_HC];
    __shared__ float cb[TM_DSV41_K_MAX_HC * TM_DSV41_K_MAX_HC];
    const uint32_t t = blockIdx.x, N = a.N, ND = a.N * a.D, mix = (2 + N) * N, tid = threadIdx.x;
    const float *st = a.streams + (size_t)t * ND;
    double ss = 0.0;
    for (uint32_t i = tid; i < ND; i += ROW_THREADS)
        ss += (double)st[i] * st[i];
    ss = block_sum_d(ss);
    const double r = 1.0 / sqrt(ss / ND + (double)a.norm_eps);
    for (uint32_t i = tid; i < mix; i += ROW_THREADS)
        m[i] = (float)((double)a.mixes[(size_t)t * mix + i] * r);
    __syncthreads();
    const float *sc = a.scale, *bs = a.base;
    if (tid < N)
        a.pre[(size_t)t * N + tid] =
            __fadd_rn(sigmoid_f(__fadd_rn(__fmul_rn(m[tid], sc[0]), bs[tid])), a.hc_eps);
    else if (tid < 2 * N)
        a.post[(size_t)t * N + tid - N] =
            __fmul_rn(2.0f, sigmoid_f(__fadd_rn(__fmul_rn(m[tid], sc[1]), bs[tid])));
    // entry (j, k) of comb is thread j * N + k; every thread reaches every barrier
    const int own = tid < N * N;
    const uint32_t j = own ? tid / N : 0, k = own ? tid % N : 0;
    if (own)
        cb[tid] = __fadd_rn(__fmul_rn(m[2 * N + tid], sc[2]), bs[2 * N + tid]);
    __syncthreads();
    float v = 0.0f, sum = 0.0f;
    if (own) { // the row's softmax: its max, then exp(x - max)
        float mx = -INFINITY;
        for (uint32_t c = 0; c < N; c++)
            mx = fmaxf(mx, cb[j * N + c]);
        v = (float)exp((double)__fsub_rn(cb[tid], mx));
    }
    __syncthreads();
    if (own)
        cb[tid] = v;
    __syncthreads();
    if (own) {
        for (uint32_t c = 0; c < N; c++)
            sum = __fadd_rn(sum, cb[j * N + c]);
        v = __fadd_rn(__fdiv_rn(v, sum), a.hc_eps);
    }
    __syncthreads();
    if (own)
        cb[tid] = v;
    __syncthreads();
    for (uint32_t it = 0; it < a.iters; it++)
        for (int col = it == 0; col < 2; col++) { // rows (after the first iteration), then columns
            sum = 0.0f;
            if (own)
                for (uint32_t c = 0; c < N; c++)
                    sum = __fadd_rn(sum, col ? cb[c * N + k] : cb[j * N + c]);
            __syncthreads();
            if (own)
                cb[tid] = __fdiv_rn(cb[tid], __fadd_rn(sum, a.hc_eps));
            __syncthreads();
        }
    if (own)
        a.comb[(size_t)t * N * N + tid] = cb[tid];
}

extern "C" tm_rc tm_k_dsv41_hc_split(const tm_k_dsv41_hc_split_args *a, cudaStream_t s,
                                     tm_err *err) {
    if (a->n_tok == 0)
        return TM_OK;
    TM_ASSERT(a->N >= 1 && a->N <= TM_DSV41_K_MAX_HC && a->mixes && a->streams);
    hc_split_kernel<<<a->n_tok, ROW_THREADS, 0, s>>>(*a);
    return tm_cuda_launched(err, s, "dsv41_hc_split");
}

static __global__ void collapse_norm_kernel(float *x, const float *st, const float *pre,
                                            const uint32_t *rows, uint32_t N, uint32_t D,
                                            const float *w, float eps) {
    const uint32_t r = blockIdx.x, t = rows ? rows[r] : r;
    const float *sr = st + (size_t)t * N * D, *p = pre + (size_t)t * N;
    float *xr = x + (size_t)r * D;
    double ss = 0.0;
    for (uint32_t d = threadIdx.x; d < D; d += ROW_THREADS) {
        double acc = 0.0;
        for (uint32_t i = 0; i < N; i++)
            acc += (double)p[i] * sr[(size_t)i * D + d];
        const float v = (float)acc;
        xr[d] = v;
        ss += (double)v * v;
    }
    ss = block_sum_d(ss);
    const double rs = 1.0 / sqrt(ss / D + (double)eps);
    for (uint32_t d = threadIdx.x; d < D; d += ROW_THREADS)
        xr[d] = (float)((double)xr[d] * rs * (double)w[d]);
}

extern "C" tm_rc tm_k_dsv41_collapse_norm(float *x, const float *streams, const float *pre,
                                          const uint32_t *rows, uint32_t n_row, uint32_t N,
                                          uint32_t D, const float *w, float eps, cudaStream_t s,
                                          tm_err *err) {
    if (n_row == 0)
        return TM_OK;
    TM_ASSERT(x && streams && pre && w);
    collapse_norm_kernel<<<n_row, ROW_THREADS, 0, s>>>(x, streams, pre, rows, N, D, w, eps);
    return tm_cuda_launched(err, s, "dsv41_collapse_norm");
}

static __global__ void hc_expand_kernel(float *st, const float *y, const float *post,
                                        const float *comb, uint32_t n_tok, uint32_t N, uint32_t D) {
    const size_t n = (size_t)n_tok * D;
    for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; k < n;
         k += (size_t)gridDim.x * blockDim.x) {
        const uint32_t t = (uint32_t)(k / D), d = (uint32_t)(k % D);
        float *sr = st + (size_t)t * N * D;
        const float *po = post + (size_t)t * N, *cb = comb + (size_t)t * N * N;
        double out[TM_DSV41_K_MAX_HC];
        for (uint32_t c = 0; c < N; c++) {
            double acc = 0.0;
            for (uint32_t j = 0; j < N; j++)
                acc += (double)cb[j * N + c] * sr[(size_t)j * D + d];
            out[c] = (double)po[c] * y[k] + acc;
        }
        for (uint32_t c = 0; c < N; c++)
            sr[(size_t)c * D + d] = (float)out[c];
    }
}

extern "C" tm_rc tm_k_dsv41_hc_expand(float *streams, const float *y, const float *post,
                                      const float *comb, uint32_t n_tok, uint32_t N, uint32_t D,
                                      cudaStream_t s, tm_err *err) {
    if (n_tok == 0)
        return TM_OK;
    TM_ASSERT(N >= 1 && N <= TM_DSV41_K_MAX_HC);
    hc_expand_kernel<<<n_blocks((size_t)n_tok * D, 256), 256, 0, s>>>(streams, y, post, comb, n_tok,
                                                                      N, D);
    return tm_cuda_launched(err, s, "dsv41_hc_expand");
}

/* ---- the paged state: stores, the compressor's latents, Engram ids ---- */

static __global__ void store_kernel(tm_k_dsv41_store_args a, tm_k_dsv41_seqs q) {
    const size_t n = (size_t)a.n_tok * a.n;
    for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; k < n;
         k += (size_t)gridDim.x * blockDim.x) {
        const uint32_t t = (uint32_t)(k / a.n), j = (uint32_t)(k % a.n), p = q.pos[t];
        size_t slot;
        if (a.r == 0) {
            slot = slot_of(&q, t, p);
        } else {
            if ((p + 1) % a.r)
                continue;
            slot = slot_of(&q, t, ((p + 1) / a.r - 1) * a.r); // the group's first position
        }
        a.field[slot * a.fld + j] = a.src[(size_t)t * a.lds + j];
    }
}

extern "C" tm_rc tm_k_dsv41_store(const tm_k_dsv41_store_args *a, const tm_k_dsv41_seqs *q,
                                  cudaStream_t s, tm_err *err) {
    if (a->n_tok == 0 || a->n == 0)
        return TM_OK;
    TM_ASSERT(a->field && a->src && q->pos && q->block_tables && q->bs > 0);
    store_kernel<<<n_blocks((size_t)a->n_tok * a->n, 256), 256, 0, s>>>(*a, *q);
    return tm_cuda_launched(err, s, "dsv41_store");
}

static __global__ void latent_kernel(float *lat, const float *ckv, const float *tail, uint32_t tld,
                                     uint32_t hd, uint32_t r, uint32_t n_tok, tm_k_dsv41_seqs q) {
    const size_t n = (size_t)n_tok * hd;
    for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; k < n;
         k += (size_t)gridDim.x * blockDim.x) {
        const uint32_t t = (uint32_t)(k / hd), c = (uint32_t)(k % hd), p = q.pos[t];
        if (r == 1) {
            lat[k] = ckv[k];
            continue;
        }
        if ((p + 1) % r) {
            lat[k] = 0.0f;
            continue;
        }
        const uint32_t p0 = ((p + 1) / r - 1) * r;
        double mx = -INFINITY, den = 0.0, acc = 0.0;
        for (uint32_t i = 0; i < r; i++)
            mx = fmax(mx, (double)tail[slot_of(&q, t, p0 + i) * tld + hd + c]);
        for (uint32_t i = 0; i < r; i++)
            den += exp((double)tail[slot_of(&q, t, p0 + i) * tld + hd + c] - mx);
        for (uint32_t i = 0; i < r; i++) {
            const float *tl = tail + slot_of(&q, t, p0 + i) * tld;
            acc += (double)tl[c] * (exp((double)tl[hd + c] - mx) / den);
        }
        lat[k] = (float)acc;
    }
}

extern "C" tm_rc tm_k_dsv41_latent(float *lat, const float *ckv, const float *tail, uint32_t tld,
                                   uint32_t hd, uint32_t r, uint32_t n_tok,
                                   const tm_k_dsv41_seqs *q, cudaStream_t s, tm_err *err) {
    if (n_tok == 0)
        return TM_OK;
    TM_ASSERT(lat && ckv && r >= 1 && (r == 1 || tail));
    latent_kernel<<<n_blocks((size_t)n_tok * hd, 256), 256, 0, s>>>(lat, ckv, tail, tld, hd, r,
                                                                    n_tok, *q);
    return tm_cuda_launched(err, s, "dsv41_latent");
}

static __global__ void cid_store_kernel(float *field, uint32_t fld, const uint32_t *tokens,
                                        const int32_t *tmap, const uint32_t *slot, uint32_t n_tok) {
    const uint32_t t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t < n_tok)
        field[(size_t)slot[t] * fld] = __int_as_float(tmap[tokens[t]]);
}

extern "C" tm_rc tm_k_dsv41_cid_store(float *field, uint32_t fld, const uint32_t *tokens,
                                      const int32_t *tmap, const uint32_t *slot, uint32_t n_tok,
                                      cudaStream_t s, tm_err *err) {
    if (n_tok == 0)
        return TM_OK;
    TM_ASSERT(field && tokens && tmap && slot);
    cid_store_kernel<<<TM_CEIL_DIV(n_tok, 128u), 128, 0, s>>>(field, fld, tokens, tmap, slot,
                                                              n_tok);
    return tm_cuda_launched(err, s, "dsv41_cid_store");
}

/* ---- the indexer's scores: a warp per (token, position) ---- */

/* Warp w of block x takes positions k = 8x + w, then k + 8 gridDim.x, ... below lens: the grid
 * is sized by ld (the most any token can reach), capped, so that a step whose tokens reach far
 * fewer positions (or a decode graph sized for the longest context) does not launch ld / 8
 * blocks per token that only exit. */
static __global__ void index_scores_kernel(tm_k_dsv41_iscore_args a, tm_k_dsv41_seqs q) {
    const uint32_t t = blockIdx.y, lane = threadIdx.x & 31;
    const uint32_t k0 = blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
    const uint32_t lens = (q.pos[t] + 1) / a.r;
    if (k0 == 0 && lane == 0)
        a.lens[t] = lens;
    const float *qt = a.q + (size_t)t * a.Hi * a.di, *w = a.w + (size_t)t * a.Hi;
    for (uint32_t k = k0; k < lens; k += gridDim.x * (blockDim.x / 32)) {
        const float *key = a.key_field + slot_of(&q, t, k * a.r) * a.kld;
        double acc = 0.0;
        for (uint32_t h = 0; h < a.Hi; h++) {
            double d = 0.0;
            for (uint32_t i = lane; i < a.di; i += 32)
                d += (double)qt[h * a.di + i] * key[i];
            d = warp_sum_d(d);
            acc += (d > 0.0 ? d : 0.0) * ((double)w[h] * a.iscale);
        }
        if (lane == 0)
            a.score[(size_t)t * a.ld + k] = (float)acc;
    }
}

/* Blocks per token of the scores (8 positions each at a time): ld / 8, at most about 8192 blocks
 * over the step's tokens (at least 4 per token). */
static uint32_t index_scores_blocks(size_t ld, uint32_t n_tok) {
    const size_t want = TM_CEIL_DIV(TM_MAX(ld, (size_t)1), (size_t)8);
    const size_t cap = TM_MAX(TM_CEIL_DIV((size_t)8192, (size_t)TM_MAX(n_tok, 1u)), (size_t)4);
    return (uint32_t)TM_MIN(want, cap);
}

extern "C" tm_rc tm_k_dsv41_index_scores(const tm_k_dsv41_iscore_args *a, const tm_k_dsv41_seqs *q,
                                         cudaStream_t s, tm_err *err) {
    if (a->n_tok == 0)
        return TM_OK;
    TM_ASSERT(a->score && a->lens && a->q && a->w && a->key_field && a->r >= 1 && a->ld >= 1 &&
              a->n_tok <= 65535);
    const dim3 grid(index_scores_blocks(a->ld, a->n_tok), a->n_tok);
    index_scores_kernel<<<grid, 256, 0, s>>>(*a, *q);
    return tm_cuda_launched(err, s, "dsv41_index_scores");
}

/* ---- sparse attention: a block per (token, head) ---- */

#define ATTN_THREADS 512

/* The rows' offsets first (a thread each), the scores a warp per row, the softmax's exps a thread
 * per row with the denominator summed by one thread in row order, the output a thread per
 * element: the host's double arithmetic in the host's order, so the result is bit for bit the
 * one-thread softmax's. Shared memory (tm_k_dsv41_attn_smem): scores, row offsets, the output. */
static __global__ void attn_kernel(tm_k_dsv41_attn_args a, tm_k_dsv41_seqs q) {
    extern __shared__ double sm[];
    __shared__ double den_sh;
    const uint32_t t = blockIdx.x / a.H, h = blockIdx.x % a.H, hd = a.hd, tid = threadIdx.x;
    const uint32_t p = q.pos[t], p0 = p + 1 > a.window ? p + 1 - a.window : 0;
    const uint32_t n_w = p + 1 - p0, n_c = a.r ? a.n_pick[t] : 0, n = n_w + n_c;
    double *sc = sm;
    size_t *off = (size_t *)(sm + a.window + a.topk);
    float *ob = (float *)(off + a.window + a.topk);
    const float *qh = a.q + ((size_t)t * a.H + h) * hd;
    const int32_t *pk = a.pick + (size_t)t * a.topk;
    const uint32_t lane = tid & 31, wid = tid >> 5;
    for (uint32_t i = tid; i < n; i += ATTN_THREADS)
        off[i] = i < n_w ? slot_of(&q, t, p0 + i) * a.wld
                         : slot_of(&q, t, (uint32_t)pk[i - n_w] * a.r) * a.cld;
    __syncthreads();
    const double scale = pow((double)hd, -0.5);
    for (uint32_t i = wid; i < n; i += ATTN_THREADS / 32) {
        const float *row = (i < n_w ? a.win : a.comp) + off[i];
        double d = 0.0;
        for (uint32_t k = lane; k < hd; k += 32)
            d += (double)qh[k] * row[k];
        d = warp_sum_d(d);
        if (lane == 0)
            sc[i] = d * scale;
    }
    __syncthreads();
    const double sk = a.sinks[h];
    double mx = sk;
    for (uint32_t i = tid; i < n; i += ATTN_THREADS)
        mx = fmax(mx, sc[i]);
    mx = block_max(mx); // its barriers order the score reads above before the writes below
    for (uint32_t i = tid; i < n; i += ATTN_THREADS)
        sc[i] = exp(sc[i] - mx);
    __syncthreads();
    if (tid == 0) {
        double den = exp(sk - mx);
        for (uint32_t i = 0; i < n; i++)
            den += sc[i];
        den_sh = den;
    }
    __syncthreads();
    for (uint32_t k = tid; k < hd; k += ATTN_THREADS) {
        double acc = 0.0;
        for (uint32_t i = 0; i < n; i++)
            acc += sc[i] * (i < n_w ? a.win : a.comp)[off[i] + k];
        ob[k] = (float)(acc / den_sh);
    }
    __syncthreads();
    // the rope slice rotated back (sign -1) at the token's position
    float *o = a.o + ((size_t)t * a.H + h) * hd;
    const uint32_t half = a.rd / 2, ofs = hd - a.rd;
    for (uint32_t k = tid; k < hd; k += ATTN_THREADS) {
        if (k < ofs) {
            o[k] = ob[k];
            continue;
        }
        const uint32_t i = (k - ofs) / 2;
        if (i >= half)
            continue;
        const float ang = __fmul_rn((float)p, a.inv_freq[i]);
        const float c = (float)cos((double)ang), sn = __fmul_rn(-1.0f, (float)sin((double)ang));
        const float x0 = ob[ofs + 2 * i], x1 = ob[ofs + 2 * i + 1];
        if ((k - ofs) % 2 == 0)
            o[k] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, sn));
        else
            o[k] = __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, sn));
    }
}

extern "C" size_t tm_k_dsv41_attn_smem(uint32_t window, uint32_t topk, uint32_t hd) {
    return ((size_t)window + topk) * (sizeof(double) + sizeof(size_t)) + (size_t)hd * sizeof(float);
}

extern "C" tm_rc tm_k_dsv41_attn(const tm_k_dsv41_attn_args *a, const tm_k_dsv41_seqs *q,
                                 cudaStream_t s, tm_err *err) {
    if (a->n_tok == 0)
        return TM_OK;
    TM_ASSERT(a->o && a->q && a->win && a->sinks && a->inv_freq && a->hd % 2 == 0);
    TM_ASSERT(!a->r || (a->comp && a->pick && a->n_pick));
    const size_t smem = tm_k_dsv41_attn_smem(a->window, a->topk, a->hd);
    TM_ASSERT(smem <= 48 * 1024);
    attn_kernel<<<a->n_tok * a->H, ATTN_THREADS, smem, s>>>(*a, *q);
    return tm_cuda_launched(err, s, "dsv41_attn");
}

/* ---- MoE: routing, SwiGLU, the combine ---- */

#define ROUTE_THREADS 128
#define ROUTE_MAX_E (ROUTE_THREADS * 32) /* a thread's experts fit a 32-bit taken mask */

/* A block per token, expert i on thread i % ROUTE_THREADS: the scores in place, then K rounds
 * of a block argmax of score + bias over the experts not taken, keyed (value, lower id first):
 * the host's repeated argmax, ties to the lower id. The softmax's denominator is summed by one
 * thread in id order and the weights' sums likewise, so every value is the host's bit for bit
 * (a NaN score + bias, which the host's loop keeps only when it is the first untaken id, loses
 * every round here). */
static __global__ void route_kernel(tm_k_dsv41_route_args a) {
    extern __shared__ double ex[]; /* softmax: exp(z - max) per expert */
    __shared__ double den_sh;
    const uint32_t t = blockIdx.x, tid = threadIdx.x, E = a.E;
    float *sc = a.logits + (size_t)t * E;
    const double temp = a.gate_temp;
    if (a.score_func == TM_DSV41_K_SCORE_SOFTMAX) {
        double mx = -INFINITY;
        for (uint32_t i = tid; i < E; i += ROUTE_THREADS)
            mx = fmax(mx, (double)sc[i] / temp);
        mx = block_max(mx);
        for (uint32_t i = tid; i < E; i += ROUTE_THREADS)
            ex[i] = exp((double)sc[i] / temp - mx);
        __syncthreads();
        if (tid == 0) {
            double den = 0.0;
            for (uint32_t i = 0; i < E; i++)
                den += ex[i];
            den_sh = den;
        }
        __syncthreads();
        for (uint32_t i = tid; i < E; i += ROUTE_THREADS)
            sc[i] = (float)(ex[i] / den_sh);
    } else {
        for (uint32_t i = tid; i < E; i += ROUTE_THREADS) {
            const double z = (double)sc[i] / temp;
            sc[i] = a.score_func == TM_DSV41_K_SCORE_SIGMOID
                        ? (float)(1.0 / (1.0 + exp(-z)))
                        : (float)sqrt(z > 20.0 ? z : log1p(exp(z)));
        }
    }
    // top-k of score + bias (this thread's experts read back: it wrote them)
    uint32_t *sel = a.sel + (size_t)t * a.K, taken = 0;
    for (uint32_t k = 0; k < a.K; k++) {
        uint64_t best = 0;
        uint32_t n = 0;
        for (uint32_t i = tid; i < E; i += ROUTE_THREADS, n++) {
            if (taken >> n & 1u)
                continue;
            const float v = __fadd_rn(sc[i], a.bias ? a.bias[i] : 0.0f);
            const uint32_t u = v == 0.0f ? 0u : __float_as_uint(v); // -0 ties +0, as on the host
            const uint32_t o = v != v ? 0u : (u & 0x80000000u) ? ~u : (u | 0x80000000u);
            const uint64_t key = ((uint64_t)o << 32) | (uint64_t)(0xffffffffu - i);
            best = key > best ? key : best;
        }
        best = block_max(best);
        const uint32_t id = 0xffffffffu - (uint32_t)(best & 0xffffffffu);
        if (id % ROUTE_THREADS == tid)
            taken |= 1u << (id / ROUTE_THREADS);
        if (tid == 0)
            sel[k] = id;
    }
    __syncthreads(); // sel and every thread's scores, for thread 0
    if (tid != 0)
        return;
    double sum = 0.0;
    for (uint32_t k = 0; k < a.K; k++)
        sum += (double)sc[sel[k]];
    for (uint32_t k = 0; k < a.K; k++) {
        double wv = sc[sel[k]];
        if (a.norm_topk && a.K > 1)
            wv = wv / (sum + 1e-20);
        a.weight[(size_t)t * a.K + k] = (float)(wv * a.route_scale);
    }
}

extern "C" tm_rc tm_k_dsv41_route(const tm_k_dsv41_route_args *a, cudaStream_t s, tm_err *err) {
    if (a->n_tok == 0)
        return TM_OK;
    TM_ASSERT(a->logits && a->sel && a->weight && a->K >= 1 && a->K <= a->E);
    if (a->E > ROUTE_MAX_E)
        return TM_ERR(err, TM_E_INVAL, "dsv41_route: %u experts, at most %u", a->E,
                      (unsigned)ROUTE_MAX_E);
    const size_t smem = a->score_func == TM_DSV41_K_SCORE_SOFTMAX ? (size_t)a->E * 8 : 0;
    if (smem > 48 * 1024)
        return TM_ERR(err, TM_E_INVAL, "dsv41_route: softmax over %u experts, at most 6144", a->E);
    route_kernel<<<a->n_tok, ROUTE_THREADS, smem, s>>>(*a);
    return tm_cuda_launched(err, s, "dsv41_route");
}

static __global__ void swiglu_kernel(float *g, const float *u, uint32_t n_row, uint32_t I,
                                     float lim, const float *wt) {
    const size_t n = (size_t)n_row * I;
    for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; k < n;
         k += (size_t)gridDim.x * blockDim.x) {
        float gv = g[k], uv = u[k];
        if (lim > 0.0f) {
            uv = uv < -lim ? -lim : uv > lim ? lim : uv;
            gv = fminf(gv, lim);
        }
        double h = (double)gv / (1.0 + exp(-(double)gv)) * uv;
        if (wt)
            h *= (double)wt[k / I];
        g[k] = (float)h;
    }
}

extern "C" tm_rc tm_k_dsv41_swiglu(float *g, const float *u, uint32_t n_row, uint32_t I, float lim,
                                   const float *wt, cudaStream_t s, tm_err *err) {
    if (n_row == 0)
        return TM_OK;
    TM_ASSERT(g && u && I > 0);
    swiglu_kernel<<<n_blocks((size_t)n_row * I, 256), 256, 0, s>>>(g, u, n_row, I, lim, wt);
    return tm_cuda_launched(err, s, "dsv41_swiglu");
}

static __global__ void moe_combine_kernel(float *y, const float *eo, const uint32_t *eo_row,
                                          const uint32_t *sel, const float *sh, uint32_t n_tok,
                                          uint32_t K, uint32_t D) {
    const size_t n = (size_t)n_tok * D;
    for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; k < n;
         k += (size_t)gridDim.x * blockDim.x) {
        const uint32_t t = (uint32_t)(k / D), d = (uint32_t)(k % D);
        const uint32_t *st = sel + (size_t)t * K;
        double acc = 0.0;
        uint32_t last = 0;
        for (uint32_t j = 0; j < K; j++) { // the experts in increasing id (the CPU engine's order)
            uint32_t bk = UINT32_MAX;
            for (uint32_t i = 0; i < K; i++)
                if ((j == 0 || st[i] > st[last]) && (bk == UINT32_MAX || st[i] < st[bk]))
                    bk = i;
            if (bk == UINT32_MAX)
                break;
            const size_t p = (size_t)t * K + bk;
            acc += eo[(eo_row ? (size_t)eo_row[p] : p) * D + d];
            last = bk;
        }
        y[k] = (float)(acc + sh[k]);
    }
}

extern "C" tm_rc tm_k_dsv41_moe_combine(float *y, const float *eo, const uint32_t *eo_row,
                                        const uint32_t *sel, const float *sh, uint32_t n_tok,
                                        uint32_t K, uint32_t D, cudaStream_t s, tm_err *err) {
    if (n_tok == 0)
        return TM_OK;
    TM_ASSERT(y && eo && sel && sh && K >= 1);
    moe_combine_kernel<<<n_blocks((size_t)n_tok * D, 256), 256, 0, s>>>(y, eo, eo_row, sel, sh,
                                                                        n_tok, K, D);
    return tm_cuda_launched(err, s, "dsv41_moe_combine");
}

/* ---- the pairs in expert order: a counting sort in one block ----
 * Thread e (e, e + blockDim, ...) owns expert e: it counts the expert's pairs over tiles of sel
 * in shared memory, thread 0 turns the counts into starts, then thread e walks the tiles again
 * and writes its pairs in pair order from its start (stable, deterministic). */

#define SORT_THREADS 1024
#define SORT_TILE 4096

static __global__ void __launch_bounds__(SORT_THREADS)
    pair_sort_kernel(tm_k_dsv41_pair_sort_args a) {
    __shared__ uint32_t tile[SORT_TILE];
    __shared__ uint32_t start[TM_DSV41_K_SORT_MAX_EXPERT];
    const uint32_t tid = threadIdx.x, E = a.n_expert;
    for (uint32_t e = tid; e < E; e += SORT_THREADS)
        start[e] = 0;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) { // the counts into exclusive starts
            __syncthreads();
            if (tid == 0) {
                uint32_t acc = 0;
                for (uint32_t e = 0; e < E; e++) {
                    const uint32_t c = start[e];
                    start[e] = acc;
                    acc += c;
                }
            }
        }
        for (uint32_t p0 = 0; p0 < a.n_pair; p0 += SORT_TILE) {
            const uint32_t n = min((uint32_t)SORT_TILE, a.n_pair - p0);
            __syncthreads(); // the tile's previous contents (and the starts) read
            for (uint32_t i = tid; i < n; i += SORT_THREADS)
                tile[i] = a.sel[p0 + i];
            __syncthreads();
            for (uint32_t e = tid; e < E; e += SORT_THREADS) {
                uint32_t q = start[e];
                for (uint32_t i = 0; i < n; i++) {
                    if (tile[i] != e)
                        continue;
                    if (pass == 1) {
                        const uint32_t p = p0 + i;
                        a.perm[q] = p;
                        a.sexp[q] = (int32_t)e;
                        a.prow[q] = p / a.K;
                        a.wq[q] = a.w[p];
                        a.inv[p] = q;
                    }
                    q++;
                }
                start[e] = q;
            }
        }
    }
}

extern "C" tm_rc tm_k_dsv41_pair_sort(const tm_k_dsv41_pair_sort_args *a, cudaStream_t s,
                                      tm_err *err) {
    if (a->n_pair == 0)
        return TM_OK;
    TM_ASSERT(a->sel && a->w && a->perm && a->prow && a->inv && a->sexp && a->wq && a->K >= 1);
    TM_ASSERT(a->n_expert >= 1 && a->n_expert <= TM_DSV41_K_SORT_MAX_EXPERT);
    pair_sort_kernel<<<1, SORT_THREADS, 0, s>>>(*a);
    return tm_cuda_launched(err, s, "dsv41_pair_sort");
}
