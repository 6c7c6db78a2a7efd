/* kernels/sample.cu - argmax per row (see sample.h): one block per row (tm_block_argmax: the
 * larger value, the lower index on ties); and the full sampler of docs/sampling.md, one thread
 * block cluster per row (below). */
#include <cooperative_groups.h>

#include "kernels/common.cuh"
#include "kernels/sample.h"

namespace cg = cooperative_groups;

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

/* ---- the full sampler (docs/sampling.md): one cluster of CS blocks of SB threads per row ----
 *
 * Block `rank` of a row's cluster holds ids [rank * C, rank * C + len) of the row (C = ceil(n /
 * CS)) in shared memory, so every pass after the first reads shared memory on CS SMs at once.
 * Cluster-wide results go through distributed shared memory: each block writes its partial, the
 * cluster barrier, then every block combines all CS partials in rank order (so every block gets
 * the same result). Cuts in the order (top-k, top-p, the logprobs' top-n) are radix selects on
 * the order key of the logits (four passes of 8-bit digits, histograms of counts or of weights),
 * not sorts; the ties at a cut and the draw's walk in id order are one pass of per-warp sums and
 * one warp's scan. Weights are summed as fixed point (w * 2^44 rounded to an integer, uint64
 * sums: exact, hence independent of the order, so shared-memory atomics stay deterministic). */

#define SB 512       /* threads per block */
#define NW (SB / 32) /* warps per block */
#define CS 8         /* blocks per row: one cluster (the portable maximum) */
#define NBIN 256     /* radix digit: 8 bits */
#define NCOPY 8      /* copies of every histogram bin (by lane): fewer same-address atomics */
#define WFX 0x1p44f  /* fixed-point scale of weights in [0, 1] */
#define SAMPLE_MAX_N (1u << 19) /* ids per row: weight sums stay below 2^63 */

typedef unsigned long long u64;

// Order-preserving key of a non-NaN float (-0 and +0 get the same key, as they compare equal).
static __device__ __forceinline__ uint32_t ord_of(float f) {
    const uint32_t b = __float_as_uint(f == 0.0f ? 0.0f : f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
static __device__ __forceinline__ float from_ord(uint32_t o) {
    return __uint_as_float((o & 0x80000000u) ? (o & 0x7fffffffu) : ~o);
}
// Argmax key: larger is better (the larger value, then the lower id); 0 = none.
static __device__ __forceinline__ u64 am_key(float v, uint32_t i) {
    return ((u64)ord_of(v) << 32) | (u64)(~i);
}
static __device__ __forceinline__ u64 wfx_of(float w) { return __float2ull_rn(w * WFX); }
static __device__ __forceinline__ double d_of(u64 b) { return __longlong_as_double((long long)b); }
static __device__ __forceinline__ u64 b_of(double d) { return (u64)__double_as_longlong(d); }

struct op_max {
    __device__ u64 operator()(u64 a, u64 b) const { return a > b ? a : b; }
};
struct op_add {
    __device__ u64 operator()(u64 a, u64 b) const { return a + b; }
};
struct op_dadd { // doubles as bits; a fixed order everywhere, so deterministic
    __device__ u64 operator()(u64 a, u64 b) const { return b_of(d_of(a) + d_of(b)); }
};

struct samp_smem {
    uint32_t hlo[NBIN * NCOPY], hhi[NBIN * NCOPY]; // this block's histogram, NCOPY copies/bin
    u64 hblk[2][NBIN]; // this block's histogram, read by the cluster (by parity)
    u64 hall[NBIN];    // the cluster's histogram
    u64 slot[2][2];    // cluster reduction partials (by parity)
    u64 sel[2];        // id_select's result, read by the cluster (by parity)
    u64 wred[NW][2];   // warp partials of a reduction
    u64 wtot[NW];      // id_select's warp sums
    u64 res[4];        // radix search result
    float top_v[TM_K_SAMPLE_MAX_TOP];
    uint32_t top_i[TM_K_SAMPLE_MAX_TOP];
    uint32_t n_top_found, sel_id;
};

struct samp_ctx {
    cg::cluster_group cl;
    samp_smem *sh;
    float *l; // [len] this block's ids of the row: raw, then processed logits
    uint32_t rank, base, len, t, lane, w;
    int par; // parity of the double-buffered cluster-read arrays (one flip per cluster barrier)
};

template <class Op> static __device__ __forceinline__ u64 warp_red(u64 v, Op op) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// (v0, v1) combined with op over the whole cluster (warps in order, then blocks in rank order),
// returned to every thread of every block. Every thread of the cluster calls it.
template <class Op> static __device__ void cl_reduce(samp_ctx &c, u64 *v0, u64 *v1, Op op) {
    u64 a = warp_red(*v0, op), b = warp_red(*v1, op);
    __syncthreads(); // wred: an earlier call's reads are done
    if (c.lane == 0)
        c.sh->wred[c.w][0] = a, c.sh->wred[c.w][1] = b;
    __syncthreads();
    if (c.t == 0) {
        a = c.sh->wred[0][0], b = c.sh->wred[0][1];
        for (int k = 1; k < NW; k++)
            a = op(a, c.sh->wred[k][0]), b = op(b, c.sh->wred[k][1]);
        c.sh->slot[c.par][0] = a, c.sh->slot[c.par][1] = b;
    }
    c.cl.sync();
    const u64 *s0 = c.cl.map_shared_rank(&c.sh->slot[c.par][0], 0);
    a = s0[0], b = s0[1];
    for (int k = 1; k < CS; k++) {
        const u64 *s = c.cl.map_shared_rank(&c.sh->slot[c.par][0], k);
        a = op(a, s[0]), b = op(b, s[1]);
    }
    c.par ^= 1;
    *v0 = a, *v1 = b;
}

struct rsel {
    uint32_t key; // the cut's order key
    u64 above;    // count / weight of the keys above it
    u64 at;       // count / weight at it
    double need;
};

// The key K over the cluster with sum(val, keys > K) < need <= sum(val, keys >= K): the element
// where the running sum in the order (key descending) first reaches need. frac > 0: need = frac *
// the total of val. key(j): the order key of element j; val(j): its count or weight (0: not
// counted; only called for elements still in range). Four passes of 8-bit digits, MSB first.
template <class KF, class VF>
static __device__ rsel radix_select(samp_ctx &c, double need, double frac, KF key, VF val) {
    samp_smem *sh = c.sh;
    uint32_t prefix = 0;
    u64 above = 0, at = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (uint32_t b = c.t; b < NBIN * NCOPY; b += SB)
            sh->hlo[b] = 0, sh->hhi[b] = 0;
        __syncthreads();
        const uint32_t hi = shift == 24 ? 0u : ~0u << (shift + 8);
        const uint32_t cp = c.lane & (NCOPY - 1);
        for (uint32_t j = c.t; j < c.len; j += SB) { // hot loop: this block's ids
            const uint32_t k = key(j);
            if ((k & hi) != (prefix & hi))
                continue;
            const u64 v = val(j);
            if (v) { // a 64-bit add as two 32-bit shared atomics (the low word's carry)
                const uint32_t b = ((k >> shift) & 255u) * NCOPY + cp, vl = (uint32_t)v;
                const uint32_t old = atomicAdd(&sh->hlo[b], vl);
                const uint32_t vh = (uint32_t)(v >> 32) + (uint32_t)(old + vl < old);
                if (vh)
                    atomicAdd(&sh->hhi[b], vh);
            }
        }
        __syncthreads();
        u64 *hb = sh->hblk[c.par];
        if (c.t < NBIN) {
            u64 s = 0;
#pragma unroll
            for (int q = 0; q < NCOPY; q++)
                s += ((u64)sh->hhi[c.t * NCOPY + q] << 32) + sh->hlo[c.t * NCOPY + q];
            hb[c.t] = s;
        }
        c.cl.sync();
        if (c.t < NBIN) {
            u64 s = 0;
            for (int r = 0; r < CS; r++)
                s += c.cl.map_shared_rank(hb, r)[c.t];
            sh->hall[c.t] = s;
        }
        c.par ^= 1;
        __syncthreads();
        if (c.w == 0) { // lane l: digits 255 - 8 l - q, q = 0..7 (descending)
            u64 hv[8], s = 0;
#pragma unroll
            for (int q = 0; q < 8; q++)
                hv[q] = sh->hall[255 - 8 * c.lane - q], s += hv[q];
            u64 inc = s;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const u64 y = __shfl_up_sync(0xffffffffu, inc, o);
                if ((int)c.lane >= o)
                    inc += y;
            }
            const u64 total = __shfl_sync(0xffffffffu, inc, 31);
            if (frac > 0.0)
                need = frac * (double)(above + total);
            const unsigned bal = __ballot_sync(0xffffffffu, (double)(above + inc) >= need);
            const uint32_t f = bal ? __ffs(bal) - 1 : 31;
            if (c.lane == f) {
                u64 cum = above + inc - s;
                uint32_t d = 255 - 8 * f - 7;
                u64 a_new = cum + s - hv[7], a_at = hv[7];
#pragma unroll
                for (int q = 0; q < 8; q++) {
                    if ((double)(cum + hv[q]) >= need) {
                        d = 255 - 8 * f - q, a_new = cum, a_at = hv[q];
                        break;
                    }
                    cum += hv[q];
                }
                sh->res[0] = d, sh->res[1] = a_new, sh->res[2] = a_at, sh->res[3] = b_of(need);
            }
        }
        __syncthreads();
        prefix |= (uint32_t)sh->res[0] << shift;
        above = sh->res[1], at = sh->res[2], need = d_of(sh->res[3]);
        frac = 0.0;
    }
    return rsel{prefix, above, at, need};
}

struct isel {
    uint32_t id; // the cluster's pick (bcast, or in the block that holds it), else UINT32_MAX
    bool mine;   // this block holds it
    bool any;    // the total exceeds the target (some id was picked)
};

// The lowest id of the cluster at which the running sum of val over ids in id order exceeds
// target (u >= 0: target = floor(u * the total)). bcast: every block gets the id (one more
// barrier); else only the block holding it. Every thread of the cluster calls it.
template <class VF>
static __device__ isel id_select(samp_ctx &c, u64 target, double u, bool bcast, VF val) {
    samp_smem *sh = c.sh;
    __syncthreads(); // sel_id and wtot: an earlier call's readers are done
    const uint32_t seg = (c.len + SB - 1) / SB * 32; // ids per warp, contiguous
    const uint32_t s0 = min(c.len, c.w * seg), s1 = min(c.len, s0 + seg);
    u64 s = 0;
    for (uint32_t j = s0 + c.lane; j < s1; j += 32)
        s += val(j);
    s = warp_red(s, op_add());
    if (c.lane == 0)
        sh->wtot[c.w] = s;
    if (c.t == 0)
        sh->sel_id = UINT32_MAX;
    __syncthreads();
    if (c.t == 0) {
        u64 b = 0;
        for (int k = 0; k < NW; k++)
            b += sh->wtot[k];
        sh->slot[c.par][0] = b;
    }
    c.cl.sync();
    u64 tots[CS], total = 0;
#pragma unroll
    for (int r = 0; r < CS; r++)
        tots[r] = c.cl.map_shared_rank(&sh->slot[c.par][0], r)[0], total += tots[r];
    c.par ^= 1;
    if (u >= 0.0)
        target = __double2ull_rd(u * (double)total);
    isel out = {UINT32_MAX, false, target < total};
    if (!out.any)
        return out;
    // the block holding it (rank hr: before <= target < before + its total); every block finds
    // the same one
    int hr = CS - 1;
    u64 before = 0;
#pragma unroll
    for (int r = 0; r < CS; r++) {
        if (target - before < tots[r]) {
            hr = r;
            break;
        }
        before += tots[r];
    }
    const bool here = hr == (int)c.rank;
    if (here) {
        u64 tl = target - before;
        uint32_t ws = 0;
        while (ws < NW - 1 && tl >= sh->wtot[ws])
            tl -= sh->wtot[ws++];
        if (c.w == ws) {
            const uint32_t w0 = min(c.len, ws * seg), w1 = min(c.len, w0 + seg);
            u64 carry = 0;
            for (uint32_t j0 = w0; j0 < w1; j0 += 32) {
                const uint32_t j = j0 + c.lane;
                const u64 v = j < w1 ? val(j) : 0;
                u64 inc = v;
#pragma unroll
                for (int o = 1; o < 32; o <<= 1) {
                    const u64 y = __shfl_up_sync(0xffffffffu, inc, o);
                    if ((int)c.lane >= o)
                        inc += y;
                }
                const u64 tot = __shfl_sync(0xffffffffu, inc, 31);
                if (carry + tot > tl) {
                    const unsigned bal = __ballot_sync(0xffffffffu, carry + inc > tl);
                    if (c.lane == (uint32_t)(__ffs(bal) - 1))
                        sh->sel_id = c.base + j;
                    break;
                }
                carry += tot;
            }
        }
    }
    __syncthreads();
    if (here)
        out.id = sh->sel_id, out.mine = true;
    if (bcast) {
        if (c.t == 0 && here)
            sh->sel[c.par] = out.id;
        c.cl.sync();
        out.id = (uint32_t)c.cl.map_shared_rank(&sh->sel[c.par], hr)[0];
        c.par ^= 1;
    }
    return out;
}

// One row; returns early on a decided row (the kernel's cluster barrier follows).
static __device__ void sample_row(samp_ctx &c, const tm_k_sample_f32_args &a) {
    samp_smem *sh = c.sh;
    float *l = c.l;
    const uint32_t r = blockIdx.x / CS, t = c.t, base = c.base, len = c.len;
    const tm_k_sample_row p = a.rows[r];
    const float *x = a.logits + (size_t)r * a.n_col;
    const uint32_t n = a.n_limit;
    const bool out0 = c.rank == 0 && t == 0; // writes the row's outputs that all blocks know
    if (t == 0)
        sh->n_top_found = 0;
    // raw row: into shared memory, finite check, argmax
    u64 best = 0, bad = 0;
    for (uint32_t j = t; j < len; j += SB) { // hot loop: this block's ids
        const float v = x[base + j];
        l[j] = v;
        bad |= !isfinite(v);
        best = max(best, am_key(v, base + j));
    }
    cl_reduce(c, &best, &bad, op_max());
    if (bad) {
        if (out0)
            a.ids[r] = TM_K_SAMPLE_NONFINITE;
        return;
    }
    float bv = from_ord((uint32_t)(best >> 32));
    uint32_t bi = ~(uint32_t)best;
    // logprobs of the raw row: lse in double, then the n_top best (value desc, id asc)
    double lse = 0.0;
    if (p.want_lp) {
        u64 s = b_of(0.0), z = b_of(0.0);
        {
            double ds = 0.0;
            for (uint32_t j = t; j < len; j += SB)
                ds += exp((double)l[j] - (double)bv);
            s = b_of(ds);
        }
        cl_reduce(c, &s, &z, op_dadd());
        lse = (double)bv + log(d_of(s));
        const uint32_t nt = min(p.n_top, min(n, (uint32_t)TM_K_SAMPLE_MAX_TOP));
        if (nt) {
            const rsel q = radix_select(
                c, (double)nt, 0.0, [&](uint32_t j) { return ord_of(l[j]); },
                [&](uint32_t) { return (u64)1; });
            const float kv = from_ord(q.key);
            const isel ks = id_select(c, nt - q.above - 1, -1.0, true,
                                      [&](uint32_t j) { return (u64)(l[j] == kv); });
            for (uint32_t j = t; j < len; j += SB) {
                const float v = l[j];
                const uint32_t id = base + j;
                if (v > kv || (v == kv && id <= ks.id)) {
                    const uint32_t k = atomicAdd(&sh->n_top_found, 1u);
                    if (k < TM_K_SAMPLE_MAX_TOP)
                        sh->top_v[k] = v, sh->top_i[k] = id;
                }
            }
            c.cl.sync(); // every block's list is complete (rank 0 reads them; not reused)
            if (out0) {
                float tv[TM_K_SAMPLE_MAX_TOP];
                uint32_t ti[TM_K_SAMPLE_MAX_TOP], m = 0;
                for (int rk = 0; rk < CS; rk++) {
                    const samp_smem *o = c.cl.map_shared_rank(sh, rk);
                    const uint32_t cnt = min(o->n_top_found, (uint32_t)TM_K_SAMPLE_MAX_TOP);
                    for (uint32_t e = 0; e < cnt && m < TM_K_SAMPLE_MAX_TOP; e++) {
                        const float v = o->top_v[e];
                        const uint32_t id = o->top_i[e];
                        uint32_t k = m++;
                        for (; k > 0 && (v > tv[k - 1] || (v == tv[k - 1] && id < ti[k - 1])); k--)
                            tv[k] = tv[k - 1], ti[k] = ti[k - 1];
                        tv[k] = v, ti[k] = id;
                    }
                }
                for (uint32_t k = 0; k < nt; k++) {
                    a.top_ids[(size_t)r * TM_K_SAMPLE_MAX_TOP + k] = k < m ? ti[k] : 0;
                    a.top_lp[(size_t)r * TM_K_SAMPLE_MAX_TOP + k] =
                        k < m ? (float)((double)tv[k] - lse) : -INFINITY;
                }
            }
        }
    }
    // processing: bias, penalties (once per distinct id), mask, allow; this block's ids only;
    // fp32 ops never fused
    const uint32_t *pk = a.pk;
    const bool rep = p.rep > 0.0f && p.rep != 1.0f;
    const bool pen = (rep || p.freq != 0.0f || p.pres != 0.0f) && p.n_hist > 0;
    const bool proc = pen || p.n_bias || p.n_mask || p.has_allow;
    if (proc) {
        uint32_t *cnt = a.cnt + (size_t)r * a.n_col;
        __syncthreads(); // the raw values' readers are done
        for (uint32_t j = t; j < p.n_bias; j += SB) {
            const uint32_t id = pk[p.bias0 + j];
            if (id >= base && id - base < len)
                l[id - base] = __fadd_rn(l[id - base], __uint_as_float(pk[p.bias0 + p.n_bias + j]));
        }
        __syncthreads();
        if (pen) {
            for (uint32_t j = t; j < p.n_hist; j += SB) {
                const uint32_t id = pk[p.hist0 + j];
                if (id >= base && id - base < len) {
                    atomicOr(&cnt[id], 0x80000000u);
                    if (j >= p.n_hist_prompt)
                        atomicAdd(&cnt[id], 1u);
                }
            }
            __syncthreads();
            for (uint32_t j = t; j < p.n_hist; j += SB) {
                const uint32_t id = pk[p.hist0 + j];
                if (!(id >= base && id - base < len))
                    continue;
                const uint32_t cn = atomicExch(&cnt[id], 0u);
                if (!cn)
                    continue; // another thread has this id
                float v = l[id - base];
                if (rep)
                    v = v > 0.0f ? __fdiv_rn(v, p.rep) : __fmul_rn(v, p.rep);
                const uint32_t n_out = cn & 0x7fffffffu;
                if (n_out) {
                    v = __fsub_rn(v, __fmul_rn(p.freq, (float)n_out));
                    v = __fsub_rn(v, p.pres);
                }
                l[id - base] = v;
            }
            __syncthreads();
        }
        for (uint32_t j = t; j < p.n_mask; j += SB) {
            const uint32_t id = pk[p.mask0 + j];
            if (id >= base && id - base < len)
                l[id - base] = -INFINITY;
        }
        if (p.has_allow) {
            const uint32_t *al = pk + p.allow0;
            for (uint32_t j = t; j < len; j += SB) {
                const uint32_t id = base + j;
                if (!((al[id >> 5] >> (id & 31)) & 1u))
                    l[j] = -INFINITY;
            }
        }
        __syncthreads();
        best = 0, bad = 0;
        for (uint32_t j = t; j < len; j += SB) {
            const float v = l[j];
            bad |= isnan(v) || v == INFINITY;
            best = max(best, am_key(v, base + j));
        }
        cl_reduce(c, &best, &bad, op_max());
        bv = from_ord((uint32_t)(best >> 32)), bi = ~(uint32_t)best;
        if (bad || bv == -INFINITY) {
            if (out0)
                a.ids[r] = bad ? TM_K_SAMPLE_NONFINITE : TM_K_SAMPLE_MASKED;
            return;
        }
    }
    if (!(p.inv_t > 0.0f) || p.top_k == 1 || n <= 1) { // greedy
        if (out0) {
            a.ids[r] = bi;
            if (p.want_lp)
                a.lp[r] = (float)((double)x[p.has_lp_id ? p.lp_id : bi] - lse);
        }
        return;
    }
    const float m = bv, it = p.inv_t;
    auto wt = [&](float v) { return expf(__fmul_rn(__fsub_rn(v, m), it)); };
    auto okey = [&](uint32_t j) { return ord_of(l[j]); };
    // the cut: id i is kept iff !hc, or l > cl, or l == cl and i <= ci
    bool hc = false;
    float cl = 0.0f;
    uint32_t ci = 0;
    if (p.top_k > 0 && (uint32_t)p.top_k < n) { // the k-th in the order
        const uint32_t k = (uint32_t)p.top_k;
        const rsel q = radix_select(c, (double)k, 0.0, okey, [&](uint32_t) { return (u64)1; });
        const float kl = from_ord(q.key);
        const isel ks = id_select(c, k - q.above - 1, -1.0, true,
                                  [&](uint32_t j) { return (u64)(l[j] == kl); });
        hc = true, cl = kl, ci = ks.id;
    }
    if (p.top_p > 0.0f && p.top_p < 1.0f) {
        // the level L: mass(K, l > L) < need <= mass(K, l >= L), need = top_p * mass(K)
        const bool hk = hc;
        const float kl = cl;
        const uint32_t ki = ci;
        auto in_k = [&](float v, uint32_t id) { return !hk || v > kl || (v == kl && id <= ki); };
        const rsel q = radix_select(c, 0.0, (double)p.top_p, okey, [&](uint32_t j) {
            const float v = l[j];
            return in_k(v, base + j) ? wfx_of(wt(v)) : (u64)0;
        });
        const float Lf = from_ord(q.key);
        const u64 wL = wfx_of(wt(Lf));
        const u64 n_lvl = wL ? q.at / wL : 1;
        // of the level's ids (id ascending, r = 0, 1, ...) those with g + r * wL < need
        const double need = q.need;
        u64 keep = 1;
        if (n_lvl > 1 && wL) {
            const double r0 = ceil((need - (double)q.above) / (double)wL);
            keep = r0 < 1.0 ? 1 : (r0 > (double)n_lvl ? n_lvl : (u64)r0);
            while (keep > 1 && (double)(q.above + (keep - 1) * wL) >= need)
                keep--;
            while (keep < n_lvl && (double)(q.above + keep * wL) < need)
                keep++;
        }
        const isel ls = id_select(c, keep - 1, -1.0, true, [&](uint32_t j) {
            const float v = l[j];
            return (u64)(v == Lf && in_k(v, base + j));
        });
        hc = true, cl = Lf, ci = ls.id;
    }
    // the draw: the kept set in id order
    const float mp = p.min_p > 0.0f ? p.min_p : 0.0f;
    auto kw = [&](uint32_t j) -> u64 {
        const float v = l[j];
        if (hc && !(v > cl || (v == cl && base + j <= ci)))
            return 0;
        const float w = wt(v);
        return w > 0.0f && w >= mp ? wfx_of(w) : 0;
    };
    const isel ds = id_select(c, 0, p.u, false, kw);
    uint32_t tok = ds.id;
    bool write = ds.mine && t == 0;
    if (!ds.any) { // rounding (or nothing kept): the last kept id, else the argmax
        u64 last = 0, z = 0;
        for (uint32_t j = t; j < len; j += SB)
            if (kw(j))
                last = max(last, (u64)(base + j) + 1);
        cl_reduce(c, &last, &z, op_max());
        tok = last ? (uint32_t)(last - 1) : bi;
        write = out0;
    }
    if (write) {
        a.ids[r] = tok;
        if (p.want_lp)
            a.lp[r] = (float)((double)x[tok] - lse);
    }
}

static __global__ void __cluster_dims__(CS, 1, 1) __launch_bounds__(SB, 1)
    sample_f32_kernel(tm_k_sample_f32_args a) {
    extern __shared__ __align__(16) float samp_dyn[];
    __shared__ samp_smem sh;
    const uint32_t C = (a.n_limit + CS - 1) / CS;
    samp_ctx c = {cg::this_cluster(), &sh, samp_dyn, 0, 0, 0, threadIdx.x, threadIdx.x & 31,
                  threadIdx.x >> 5,   0};
    c.rank = c.cl.block_rank();
    c.base = c.rank * C;
    c.len = c.base < a.n_limit ? min(C, a.n_limit - c.base) : 0;
    sample_row(c, a);
    c.cl.sync(); // no block leaves while its cluster may still read its shared memory
}

static size_t sample_dyn_bytes(uint32_t n) { return (size_t)((n + CS - 1) / CS) * sizeof(float); }

extern "C" int tm_k_sample_f32_supported(uint32_t n_col, int device) {
    int major = 0, optin = 0;
    if (n_col == 0 || n_col > SAMPLE_MAX_N ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
            cudaSuccess)
        return 0;
    return major >= 9 && sample_dyn_bytes(n_col) + sizeof(samp_smem) + 1024 <= (size_t)optin;
}

static cudaError_t sample_set_smem(size_t dyn) {
    return cudaFuncSetAttribute(sample_f32_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)dyn);
}

extern "C" tm_rc tm_k_sample_f32_prepare(uint32_t n_col, tm_err *err) {
    const cudaError_t e = sample_set_smem(sample_dyn_bytes(n_col));
    if (e != cudaSuccess)
        return TM_ERR(err, TM_E_CUDA, "sample_f32: prepare for %u ids: %s", n_col,
                      cudaGetErrorString(e));
    return TM_OK;
}

extern "C" tm_rc tm_k_sample_f32(const tm_k_sample_f32_args *a, cudaStream_t s, tm_err *err) {
    if (a->n_row == 0)
        return TM_OK;
    TM_ASSERT(a->n_col > 0 && a->ids && a->logits && a->cnt && a->rows && a->pk);
    tm_k_sample_f32_args k = *a;
    k.n_limit = a->n_limit && a->n_limit < a->n_col ? a->n_limit : a->n_col;
    TM_ASSERT(k.n_limit <= SAMPLE_MAX_N);
    const size_t dyn = sample_dyn_bytes(k.n_limit);
    const cudaError_t e = sample_set_smem(dyn);
    if (e != cudaSuccess)
        return TM_ERR(err, TM_E_CUDA, "sample_f32: %zu bytes of shared memory: %s", dyn,
                      cudaGetErrorString(e));
    sample_f32_kernel<<<a->n_row * CS, SB, dyn, s>>>(k);
    return tm_cuda_launched(err, s, "sample_f32");
}
