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
        const uint32_t *cd = a.cand + (size_t)t * a.ctop, nc = a.n_cand[t];
        for (uint32_t k = threadIdx.x; k < lens; k += blockDim.x) {
            const uint32_t bk = k / a.cb;
            int in = 0;
            for (uint32_t i = 0; i < nc; i++)
                in |= cd[i] == bk;
            if (!in)
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
