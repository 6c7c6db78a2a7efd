/* kernels/sample.cu - argmax per row (see sample.h): one block per row (tm_block_argmax: the
 * larger value, the lower index on ties). */
#include "kernels/common.cuh"
#include "kernels/sample.h"

template <int BLOCK>
static __global__ void argmax_f32_kernel(uint32_t *ids, const float *logits, uint32_t n_col,
                                         uint32_t n_limit) {
    float v;
    uint32_t i;
    const bool bad = tm_block_argmax<BLOCK>(logits + (size_t)blockIdx.x * n_col, n_limit, &v, &i);
    if (threadIdx.x == 0)
        ids[blockIdx.x] = bad ? UINT32_MAX : i;
}

extern "C" tm_rc tm_k_argmax_f32(const tm_k_argmax_f32_args *a, cudaStream_t s, tm_err *err) {
    if (a->n_row == 0)
        return TM_OK;
    TM_ASSERT(a->n_col > 0 && a->ids && a->logits);
    const uint32_t n_limit = a->n_limit && a->n_limit < a->n_col ? a->n_limit : a->n_col;
    argmax_f32_kernel<1024><<<a->n_row, 1024, 0, s>>>(a->ids, a->logits, a->n_col, n_limit);
    return tm_cuda_launched(err, s, "argmax_f32");
}

/* ---- the full sampler (docs/sampling.md): one block of SB threads per row ---- */

#define SB 1024

// Order-preserving key of a non-NaN float (-0 and +0 get the same key, as they compare equal).
static __device__ __forceinline__ uint32_t ord_of(float f) {
    const uint32_t b = __float_as_uint(f == 0.0f ? 0.0f : f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
static __device__ __forceinline__ float from_ord(uint32_t o) {
    return __uint_as_float((o & 0x80000000u) ? (o & 0x7fffffffu) : ~o);
}

// Block sums returned to every thread, in a fixed order (deterministic).
static __device__ double bsum_d(double v) {
    __shared__ double red[SB / 32];
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if ((threadIdx.x & 31) == 0)
        red[threadIdx.x >> 5] = v;
    __syncthreads();
    double s = 0.0;
    for (int i = 0; i < SB / 32; i++)
        s += red[i];
    return s;
}
static __device__ uint32_t bsum_u(uint32_t v) {
    __shared__ uint32_t red[SB / 32];
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if ((threadIdx.x & 31) == 0)
        red[threadIdx.x >> 5] = v;
    __syncthreads();
    uint32_t s = 0;
    for (int i = 0; i < SB / 32; i++)
        s += red[i];
    return s;
}
// Argmax of (v, i) over the block (tm_argmax_better), to every thread.
static __device__ void bargmax(float *v, uint32_t *i) {
    __shared__ float rv[SB / 32];
    __shared__ uint32_t ri[SB / 32];
    float bv = *v;
    uint32_t bi = *i;
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        uint32_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (tm_argmax_better(ov, oi, bv, bi))
            bv = ov, bi = oi;
    }
    __syncthreads();
    if ((threadIdx.x & 31) == 0)
        rv[threadIdx.x >> 5] = bv, ri[threadIdx.x >> 5] = bi;
    __syncthreads();
    bv = rv[0], bi = ri[0];
    for (int k = 1; k < SB / 32; k++)
        if (tm_argmax_better(rv[k], ri[k], bv, bi))
            bv = rv[k], bi = ri[k];
    *v = bv, *i = bi;
}
// Exclusive prefix sum of v over the threads in thread order; *total gets the sum.
template <typename T> static __device__ T bscan_excl(T v, T *total) {
    __shared__ T wsum[SB / 32];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    T x = v;
    for (int o = 1; o < 32; o <<= 1) {
        T y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o)
            x += y;
    }
    __syncthreads();
    if (lane == 31)
        wsum[w] = x;
    __syncthreads();
    T before = 0, all = 0;
    for (int k = 0; k < SB / 32; k++) {
        if (k < w)
            before += wsum[k];
        all += wsum[k];
    }
    *total = all;
    return before + x - v;
}
// The r-th (1-based) id in id order with pred(id), r >= 1; UINT32_MAX if there are fewer.
template <typename P> static __device__ uint32_t bselect(uint32_t n, uint32_t r, P pred) {
    __shared__ uint32_t found;
    const uint32_t C = (n + SB - 1) / SB, i0 = threadIdx.x * C, i1 = min(n, i0 + C);
    uint32_t c = 0;
    for (uint32_t i = i0; i < i1; i++)
        c += pred(i);
    if (threadIdx.x == 0)
        found = UINT32_MAX;
    uint32_t tot;
    uint32_t before = bscan_excl<uint32_t>(c, &tot);
    if (before < r && r <= before + c) {
        uint32_t k = before;
        for (uint32_t i = i0; i < i1; i++)
            if (pred(i) && ++k == r) {
                found = i;
                break;
            }
    }
    __syncthreads();
    const uint32_t got = found;
    __syncthreads(); // found is reused by the next call
    return got;
}

static __global__ void __launch_bounds__(SB) sample_f32_kernel(tm_k_sample_f32_args a) {
    const uint32_t r = blockIdx.x, t = threadIdx.x;
    const tm_k_sample_row p = a.rows[r];
    const float *x = a.logits + (size_t)r * a.n_col;
    float *l = a.work + (size_t)r * a.n_col;
    uint32_t *cnt = a.cnt + (size_t)r * a.n_col;
    const uint32_t n = a.n_limit;
    __shared__ uint32_t s_u;
    __shared__ int s_bad;
    if (t == 0)
        s_bad = 0;
    // raw row: finite check, argmax, copy to the work row
    float bv = -INFINITY;
    uint32_t bi = UINT32_MAX;
    int bad = 0;
    for (uint32_t i = t; i < n; i += SB) { // hot loop: the whole vocabulary
        const float v = x[i];
        bad |= !isfinite(v);
        l[i] = v;
        if (tm_argmax_better(v, i, bv, bi))
            bv = v, bi = i;
    }
    __syncthreads();
    if (bad)
        s_bad = 1;
    bargmax(&bv, &bi); // contains __syncthreads
    if (s_bad) {
        if (t == 0)
            a.ids[r] = TM_K_SAMPLE_NONFINITE;
        return;
    }
    // logprobs of the raw row: lse in double, then the n_top best (value desc, id asc)
    double lse = 0.0;
    if (p.want_lp) {
        double s = 0.0;
        for (uint32_t i = t; i < n; i += SB)
            s += exp((double)x[i] - (double)bv);
        lse = (double)bv + log(bsum_d(s));
        float pv = INFINITY;
        uint32_t pi = 0;
        for (uint32_t j = 0; j < p.n_top; j++) {
            float cv = -INFINITY;
            uint32_t ci = UINT32_MAX;
            for (uint32_t i = t; i < n; i += SB) {
                const float v = x[i];
                if ((v < pv || (v == pv && i > pi)) && tm_argmax_better(v, i, cv, ci))
                    cv = v, ci = i;
            }
            bargmax(&cv, &ci);
            if (t == 0) {
                a.top_ids[(size_t)r * TM_K_SAMPLE_MAX_TOP + j] = ci;
                a.top_lp[(size_t)r * TM_K_SAMPLE_MAX_TOP + j] = (float)((double)cv - lse);
            }
            pv = cv, pi = ci;
        }
    }
    // processing: bias, penalties (once per distinct id), mask; fp32 ops never fused
    const uint32_t *pk = a.pk;
    const int rep = p.rep > 0.0f && p.rep != 1.0f;
    const int pen = (rep || p.freq != 0.0f || p.pres != 0.0f) && p.n_hist > 0;
    const int proc = pen || p.n_bias || p.n_mask;
    __syncthreads();
    for (uint32_t j = t; j < p.n_bias; j += SB) {
        const uint32_t id = pk[p.bias0 + j];
        if (id < n)
            l[id] = __fadd_rn(l[id], __uint_as_float(pk[p.bias0 + p.n_bias + j]));
    }
    __syncthreads();
    if (pen) {
        for (uint32_t j = t; j < p.n_hist; j += SB) {
            const uint32_t id = pk[p.hist0 + j];
            if (id < n) {
                atomicOr(&cnt[id], 0x80000000u);
                if (j >= p.n_hist_prompt)
                    atomicAdd(&cnt[id], 1u);
            }
        }
        __syncthreads();
        for (uint32_t j = t; j < p.n_hist; j += SB) {
            const uint32_t id = pk[p.hist0 + j];
            if (id >= n)
                continue;
            const uint32_t c = atomicExch(&cnt[id], 0u);
            if (!c)
                continue; // another thread has this id
            float v = l[id];
            if (rep)
                v = v > 0.0f ? __fdiv_rn(v, p.rep) : __fmul_rn(v, p.rep);
            const uint32_t n_out = c & 0x7fffffffu;
            if (n_out) {
                v = __fsub_rn(v, __fmul_rn(p.freq, (float)n_out));
                v = __fsub_rn(v, p.pres);
            }
            l[id] = v;
        }
        __syncthreads();
    }
    for (uint32_t j = t; j < p.n_mask; j += SB) {
        const uint32_t id = pk[p.mask0 + j];
        if (id < n)
            l[id] = -INFINITY;
    }
    __syncthreads();
    if (proc) {
        bv = -INFINITY, bi = UINT32_MAX, bad = 0;
        for (uint32_t i = t; i < n; i += SB) {
            const float v = l[i];
            bad |= isnan(v) || v == INFINITY;
            if (tm_argmax_better(v, i, bv, bi))
                bv = v, bi = i;
        }
        if (bad)
            s_bad = 1;
        bargmax(&bv, &bi);
        if (s_bad || bv == -INFINITY) {
            if (t == 0)
                a.ids[r] = s_bad ? TM_K_SAMPLE_NONFINITE : TM_K_SAMPLE_MASKED;
            return;
        }
    }
    uint32_t tok = bi;
    if (p.inv_t > 0.0f && p.top_k != 1 && n > 1) {
        const float m = bv, it = p.inv_t;
        const uint32_t om = ord_of(m);
        // top-k: the k-th in the order is (kl, ki)
        bool hk = false;
        float kl = 0.0f;
        uint32_t ki = 0;
        if (p.top_k > 0 && (uint32_t)p.top_k < n) {
            const uint32_t k = (uint32_t)p.top_k;
            uint64_t lo = 0, hi = (uint64_t)om + 1; // count(ord >= lo) >= k > count(ord >= hi)
            while (hi - lo > 1) {
                const uint64_t mid = (lo + hi) / 2;
                uint32_t c = 0;
                for (uint32_t i = t; i < n; i += SB)
                    c += ord_of(l[i]) >= mid;
                if (bsum_u(c) >= k)
                    lo = mid;
                else
                    hi = mid;
            }
            const uint32_t lv = (uint32_t)lo;
            uint32_t c = 0;
            for (uint32_t i = t; i < n; i += SB)
                c += ord_of(l[i]) > lv;
            const uint32_t c_gt = bsum_u(c);
            kl = from_ord(lv);
            ki = bselect(n, k - c_gt, [&](uint32_t i) { return l[i] == kl; });
            hk = true;
        }
        auto wt = [&](float v) { return expf(__fmul_rn(__fsub_rn(v, m), it)); };
        auto in_k = [&](float v, uint32_t i) { return !hk || v > kl || (v == kl && i <= ki); };
        bool hc = hk;
        float cl = kl;
        uint32_t ci = ki;
        if (p.top_p > 0.0f && p.top_p < 1.0f) {
            double s = 0.0;
            for (uint32_t i = t; i < n; i += SB) {
                const float v = l[i];
                if (in_k(v, i))
                    s += wt(v);
            }
            const double need = (double)p.top_p * bsum_d(s);
            // the level: the smallest key L with g(L) = mass of K above L < need
            uint64_t lo = 0, hi = om; // g(lo) >= need > g(hi) = 0
            while (hi - lo > 1) {
                const uint64_t mid = (lo + hi) / 2;
                double g = 0.0;
                for (uint32_t i = t; i < n; i += SB) {
                    const float v = l[i];
                    if (ord_of(v) > mid && in_k(v, i))
                        g += wt(v);
                }
                if (bsum_d(g) < need)
                    hi = mid;
                else
                    lo = mid;
            }
            const uint32_t L = (uint32_t)hi;
            const float Lf = from_ord(L);
            double g = 0.0;
            uint32_t c = 0;
            for (uint32_t i = t; i < n; i += SB) {
                const float v = l[i];
                if (!in_k(v, i))
                    continue;
                if (v > Lf)
                    g += wt(v);
                else if (v == Lf)
                    c++;
            }
            g = bsum_d(g);
            const uint32_t n_lvl = bsum_u(c);
            if (t == 0) {
                const double wL = (double)wt(Lf);
                uint32_t keep = 1;
                while (keep < n_lvl && g + (double)keep * wL < need)
                    keep++;
                s_u = keep;
            }
            __syncthreads();
            const uint32_t keep = s_u;
            ci = bselect(n, keep, [&](uint32_t i) { return l[i] == Lf && in_k(Lf, i); });
            cl = Lf, hc = true;
        }
        // the draw: the kept set in id order, one thread per contiguous chunk of ids
        const float mp = p.min_p > 0.0f ? p.min_p : 0.0f;
        auto kw = [&](uint32_t i) -> float {
            const float v = l[i];
            if (hc && !(v > cl || (v == cl && i <= ci)))
                return 0.0f;
            const float w = wt(v);
            return w > 0.0f && w >= mp ? w : 0.0f;
        };
        const uint32_t C = (n + SB - 1) / SB, i0 = t * C, i1 = min(n, i0 + C);
        double cs = 0.0;
        uint32_t last = UINT32_MAX;
        for (uint32_t i = i0; i < i1; i++) {
            const float w = kw(i);
            cs += w;
            if (w > 0.0f)
                last = i;
        }
        double total;
        const double before = bscan_excl<double>(cs, &total);
        const double target = p.u * total;
        if (t == 0)
            s_u = UINT32_MAX;
        __syncthreads();
        if (cs > 0.0 && target >= before && target < before + cs) {
            double cum = before;
            for (uint32_t i = i0; i < i1; i++) {
                cum += kw(i);
                if (target < cum) {
                    atomicMin(&s_u, i);
                    break;
                }
            }
        }
        __syncthreads();
        tok = s_u;
        if (tok == UINT32_MAX) { // rounding: the last kept id
            float lv = 0.0f;
            uint32_t li = last == UINT32_MAX ? UINT32_MAX : UINT32_MAX - 1 - last;
            bargmax(&lv, &li); // the lowest of UINT32_MAX - 1 - last: the highest last
            tok = li == UINT32_MAX ? bi : UINT32_MAX - 1 - li;
        }
    }
    if (t == 0) {
        a.ids[r] = tok;
        if (p.want_lp)
            a.lp[r] = (float)((double)x[tok] - lse);
    }
}

extern "C" tm_rc tm_k_sample_f32(const tm_k_sample_f32_args *a, cudaStream_t s, tm_err *err) {
    if (a->n_row == 0)
        return TM_OK;
    TM_ASSERT(a->n_col > 0 && a->ids && a->logits && a->work && a->cnt && a->rows && a->pk);
    tm_k_sample_f32_args k = *a;
    k.n_limit = a->n_limit && a->n_limit < a->n_col ? a->n_limit : a->n_col;
    sample_f32_kernel<<<a->n_row, SB, 0, s>>>(k);
    return tm_cuda_launched(err, s, "sample_f32");
}
