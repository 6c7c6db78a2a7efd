/* kernels/attn_paged.cu - paged causal attention (see attn_paged.h).
 *
 * Block = (token t, query head h, split sp), TM_ATTN_TILE threads. The split's position range is
 * walked in tiles of TM_ATTN_TILE positions:
 *   scores: thread i takes position tile0 + i and dots q (fp32, shared) with its K row, read as
 *           16-byte vectors;
 *   softmax: block max, rescale of the running sum and accumulators, p = exp(s - max) in shared;
 *   V:       the block is cut into row groups of head_dim/8 threads; thread (r, c) accumulates
 *           dims [8c, 8c+8) over the tile's positions r, r + n_rowgrp, ... (16-byte loads, a row
 *           group reads one contiguous V row).
 * At the end the row groups' accumulators are summed in shared memory. With one split the result
 * is normalised and stored as bf16; otherwise (acc, max, sum) go to the partial buffers and
 * attn_merge_kernel, a second launch, combines the splits with the usual rescaling
 * (merge_splits). An empty split writes max = -inf, sum = 0. */
#include "kernels/attn_paged.h"
#include "kernels/common.cuh"

#define NT TM_ATTN_TILE
#define ATTN_UNROLLED_MAX_BLOCKS 8192

/* sum of q[e] * bf16 vector v[e], e < 8 */
static __device__ __forceinline__ float dot8(const float *q, uint4 v) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        s += q[2 * i] * __uint_as_float(w[i] << 16);
        s += q[2 * i + 1] * __uint_as_float(w[i] & 0xffff0000u);
    }
    return s;
}

/* acc[e] += p * bf16 vector v[e], e < 8 */
static __device__ __forceinline__ void axpy8(float *acc, float p, uint4 v) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        acc[2 * i] += p * __uint_as_float(w[i] << 16);
        acc[2 * i + 1] += p * __uint_as_float(w[i] & 0xffff0000u);
    }
}

/* Most query heads one merge_splits call merges (the GQA kernel's largest group). */
#define MERGE_MAX_HEADS 8
/* Splits whose partials a merging thread loads at once (float4 each). */
#define MERGE_CHUNK 8

/* Merge the n_split (<= TM_ATTN_MAX_SPLIT) partials of token t's heads [h0, h0 + n_h) into out
 * (bf16, row stride ld_q). Every thread of the block calls it (it has a barrier). Per head, in
 * split order over the splits that saw positions (sum > 0; an empty split has max = -inf):
 * mx = max of the splits' maxima, f = exp(max - mx), l = sum of sum * f; then per output
 * o = sum of acc * f and out = o * (1 / l). It sits between the attention and o_proj of every
 * decode layer, so it is built for latency (round trips, not bandwidth):
 *   a warp per head: lane sp reads split sp's (max, sum), f goes to shared memory (-1 marks an
 *     empty split), and every lane sums l in split order from the lanes' values (shuffles);
 *   a thread per 4 output dims: float4 loads of MERGE_CHUNK splits at once, then the in-order
 *     sums (explicit fmaf, as the compiler contracted the former l += sum * f, o += acc * f).
 * The arguments are scalars because a reference to the kernel's parameter struct would copy it
 * to the stack. (Merging in the attention kernel itself, by the last split block to finish, was
 * measured on H200s: no faster in a decode step, up to 3 us slower per launch at group 8.) */
static __device__ __forceinline__ void merge_splits(uint16_t *out, const float *part_acc,
                                                 const float *part_ml, uint32_t ld_q,
                                                 uint32_t n_head, uint32_t hd, uint32_t n_split,
                                                 uint32_t t, uint32_t h0, uint32_t n_h) {
    __shared__ float f_s[MERGE_MAX_HEADS][TM_ATTN_MAX_SPLIT];
    __shared__ float inv_s[MERGE_MAX_HEADS];
    const uint32_t w = threadIdx.x / 32, lane = threadIdx.x % 32, n_warp = blockDim.x / 32;
    const size_t th0 = (size_t)t * n_head + h0;
    for (uint32_t j = w; j < n_h; j += n_warp) {
        const float *ml = part_ml + (th0 + j) * n_split * 2;
        const bool live = lane < n_split;
        const float m = live ? __ldcg(ml + lane * 2) : -INFINITY;
        const float ls = live ? __ldcg(ml + lane * 2 + 1) : 0.0f;
        const float mx = tm_warp_max(m); // finite: split 0 always has positions
        const float f = ls > 0.0f ? expf(m - mx) : -1.0f;
        float l = 0.0f;
#pragma unroll
        for (uint32_t sp = 0; sp < TM_ATTN_MAX_SPLIT; sp++) {
            const float l_sp = __shfl_sync(0xffffffffu, ls, sp);
            const float f_sp = __shfl_sync(0xffffffffu, f, sp);
            if (sp < n_split && f_sp >= 0.0f)
                l = fmaf(l_sp, f_sp, l);
        }
        if (live)
            f_s[j][lane] = f;
        if (lane == 0)
            inv_s[j] = 1.0f / l;
    }
    __syncthreads();
    // Thread (head j, dims [i, i + 4)): float4 loads, MERGE_CHUNK splits in flight at once.
    const uint32_t hd4 = hd / 4;
    for (uint32_t idx = threadIdx.x; idx < n_h * hd4; idx += blockDim.x) {
        const uint32_t j = idx / hd4, i = idx % hd4 * 4;
        const float4 *acc =
            reinterpret_cast<const float4 *>(part_acc + (th0 + j) * n_split * hd + i);
        float o[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (uint32_t sp0 = 0; sp0 < n_split; sp0 += MERGE_CHUNK) {
            float4 v[MERGE_CHUNK];
#pragma unroll
            for (uint32_t k = 0; k < MERGE_CHUNK; k++)
                if (sp0 + k < n_split)
                    v[k] = __ldcg(acc + (size_t)(sp0 + k) * hd4);
#pragma unroll
            for (uint32_t k = 0; k < MERGE_CHUNK; k++) {
                const float f = sp0 + k < n_split ? f_s[j][sp0 + k] : -1.0f;
                if (f >= 0.0f) {
                    o[0] = fmaf(v[k].x, f, o[0]);
                    o[1] = fmaf(v[k].y, f, o[1]);
                    o[2] = fmaf(v[k].z, f, o[2]);
                    o[3] = fmaf(v[k].w, f, o[3]);
                }
            }
        }
        uint16_t *dst = out + (size_t)t * ld_q + (size_t)(h0 + j) * hd + i;
#pragma unroll
        for (int e = 0; e < 4; e++)
            dst[e] = tm_f2bf(o[e] * inv_s[j]);
    }
}

/* HD: head_dim known at compile time (64, 128, 256: loops fully unrolled, so every thread has
 * all its K and V loads in flight at once), or 0 for any other multiple of 8 (runtime loops). */
template <int HD>
static __global__ void __launch_bounds__(NT) attn_paged_bf16_kernel(tm_k_attn_paged_bf16_args a) {
    __shared__ float q_s[TM_ATTN_MAX_HEAD_DIM];
    __shared__ float p_s[NT];
    __shared__ float acc_s[NT * 8];
    const uint32_t t = blockIdx.x, h = blockIdx.y, sp = blockIdx.z, tid = threadIdx.x;
    const uint32_t hd = HD ? HD : a.head_dim, kvd = a.n_kv_head * hd, bs = a.block_size;
    const uint32_t kvh = h / (a.n_head / a.n_kv_head);
    const uint32_t n_pos = a.pos[t] + 1;
    const uint32_t lo = a.window && n_pos > a.window ? n_pos - a.window : 0;
    const uint32_t n_tile = (n_pos - lo + NT - 1) / NT;
    const uint32_t tiles_per_split = (n_tile + a.n_split - 1) / a.n_split;
    const uint32_t start = lo + sp * tiles_per_split * NT;
    const uint32_t end = min(n_pos, start + tiles_per_split * NT);
    const uint32_t *bt = a.block_tables + a.seq_bt[a.tok_seq[t]];
    const uint16_t *kc = a.k_cache + (size_t)kvh * hd;
    const uint16_t *vc = a.v_cache + (size_t)kvh * hd;

    const uint16_t *qrow = a.q + (size_t)t * a.ld_q + (size_t)h * hd;
    for (uint32_t i = tid; i < hd; i += NT)
        q_s[i] = tm_bf2f(qrow[i]);
    __syncthreads();

    const uint32_t lpr = hd / 8;        // threads per V row
    const uint32_t n_rg = NT / lpr;     // row groups
    const uint32_t rg = tid / lpr, c8 = (tid % lpr) * 8;
    const bool v_thread = rg < n_rg;    // NT % lpr may leave threads idle
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    float m = -INFINITY, l = 0.0f;

    for (uint32_t tile0 = start; tile0 < end; tile0 += NT) {
        const uint32_t p = tile0 + tid;
        float s = -INFINITY;
        if (p < end) {
            const uint16_t *k = kc + ((size_t)bt[p / bs] * bs + p % bs) * kvd;
            float dot = 0.0f;
            if (HD) {
                // the whole row's raw 16-byte vectors first, then the math
                uint4 kr[HD ? HD / 8 : 1];
#pragma unroll
                for (int i = 0; i < HD / 8; i++)
                    kr[i] = reinterpret_cast<const uint4 *>(k)[i];
#pragma unroll
                for (int i = 0; i < HD / 8; i++)
                    dot += dot8(q_s + 8 * i, kr[i]);
            } else {
                for (uint32_t i = 0; i < hd; i += 8) {
                    float kf[8];
                    tm_load8_bf16(k + i, kf);
#pragma unroll
                    for (int e = 0; e < 8; e++)
                        dot += q_s[i + e] * kf[e];
                }
            }
            s = dot * a.scale;
        }
        const float m_new = fmaxf(m, tm_block_max<NT>(s)); // finite: the tile has a position
        const float corr = expf(m - m_new);
        const float pe = p < end ? expf(s - m_new) : 0.0f;
        p_s[tid] = pe;
        l = l * corr + tm_block_sum<NT>(pe); // the sum's barriers also publish p_s
#pragma unroll
        for (int e = 0; e < 8; e++)
            acc[e] *= corr;
        m = m_new;
        if (v_thread) {
            const uint32_t n_in_tile = min((uint32_t)NT, end - tile0);
            if (HD) {
                constexpr int RG = HD ? NT / (HD / 8) : 1; // row groups, compile time
                uint4 vr[NT / RG];
#pragma unroll
                for (int jj = 0; jj < NT / RG; jj++) {
                    const uint32_t j = rg + jj * RG;
                    if (j < n_in_tile) {
                        const uint32_t pp = tile0 + j;
                        vr[jj] = *reinterpret_cast<const uint4 *>(
                            vc + ((size_t)bt[pp / bs] * bs + pp % bs) * kvd + c8);
                    }
                }
#pragma unroll
                for (int jj = 0; jj < NT / RG; jj++) {
                    const uint32_t j = rg + jj * RG;
                    if (j < n_in_tile)
                        axpy8(acc, p_s[j], vr[jj]);
                }
            } else {
                for (uint32_t j = rg; j < n_in_tile; j += n_rg) {
                    const uint32_t pp = tile0 + j;
                    const uint16_t *v = vc + ((size_t)bt[pp / bs] * bs + pp % bs) * kvd + c8;
                    float vf[8];
                    tm_load8_bf16(v, vf);
                    const float w = p_s[j];
#pragma unroll
                    for (int e = 0; e < 8; e++)
                        acc[e] += w * vf[e];
                }
            }
        }
        __syncthreads(); // p_s is rewritten by the next tile
    }

    // Sum the row groups: acc_s[rg][hd]
    if (v_thread) {
#pragma unroll
        for (int e = 0; e < 8; e++)
            acc_s[rg * hd + c8 + e] = acc[e];
    }
    __syncthreads();
    const size_t th = (size_t)t * a.n_head + h;
    for (uint32_t i = tid; i < hd; i += NT) {
        float o = 0.0f;
        for (uint32_t r = 0; r < n_rg; r++)
            o += acc_s[r * hd + i];
        if (a.n_split == 1) {
            a.out[(size_t)t * a.ld_q + (size_t)h * hd + i] = tm_f2bf(o / l);
        } else {
            a.part_acc[(th * a.n_split + sp) * hd + i] = o;
        }
    }
    if (a.n_split > 1 && tid == 0) {
        a.part_ml[(th * a.n_split + sp) * 2] = m;
        a.part_ml[(th * a.n_split + sp) * 2 + 1] = l;
    }
}

/* ---- GQA kernel: a block per (token, KV head, split) serves the KV head's G query heads ----
 *
 * Each K/V row is read once for the G heads that share it (the kernel above reads it once per
 * query head). 4 warps; a warp takes 32-position tiles of the split in turn. For a tile, lane i
 * starts copying the V row of position tile0 + i into the warp's shared memory (cp.async),
 * loads the whole K row (HD/8 16-byte loads in flight) and dots it with the G query vectors
 * (fp32, pre-scaled, in shared memory, read as broadcasts); the online softmax per head is a
 * warp max and sum; then the warp walks the tile's V rows in shared memory, lane i holding dims
 * [i * HD/32, (i+1) * HD/32) for every head (p read from shared memory). K and V of a tile thus
 * take one memory round trip: decode attention is bound by latency, not bandwidth. At the end the
 * warps' (max, sum, acc) are merged in shared memory, and the block writes the output (one
 * split) or the partials for attn_merge_kernel, in the same layout as the kernel above. */
#define GQA_WARPS 4

template <int HD, int G>
static __global__ void __launch_bounds__(GQA_WARPS * 32)
    attn_gqa_bf16_kernel(tm_k_attn_paged_bf16_args a) {
    constexpr int DPL = HD / 32; // dims per lane in the V pass
    __shared__ float q_s[G][HD];
    __shared__ float p_s[GQA_WARPS][G][32];
    __shared__ float m_s[GQA_WARPS][G], l_s[GQA_WARPS][G];
    // The tile loop stages each warp's 32 V rows here (v_s); the final merge of the warps reuses
    // the space for their accumulators (acc_s).
    constexpr size_t V_BYTES = (size_t)GQA_WARPS * 32 * HD * 2;
    constexpr size_t ACC_BYTES = (size_t)GQA_WARPS * G * HD * 4;
    __shared__ __align__(16) unsigned char stage_s[V_BYTES > ACC_BYTES ? V_BYTES : ACC_BYTES];
    uint16_t(*v_s)[32][HD] = reinterpret_cast<uint16_t(*)[32][HD]>(stage_s);
    float(*acc_s)[G][HD] = reinterpret_cast<float(*)[G][HD]>(stage_s);
    const uint32_t t = blockIdx.x, g = blockIdx.y, sp = blockIdx.z;
    const uint32_t w = threadIdx.x / 32, lane = threadIdx.x & 31;
    const uint32_t kvd = a.n_kv_head * HD, bs = a.block_size;
    const uint32_t n_pos = a.pos[t] + 1;
    const uint32_t lo = a.window && n_pos > a.window ? n_pos - a.window : 0;
    const uint32_t n_tile = (n_pos - lo + 31) / 32;
    const uint32_t tiles_per_split = (n_tile + a.n_split - 1) / a.n_split;
    const uint32_t tile_lo = sp * tiles_per_split;
    const uint32_t tile_hi = min(n_tile, tile_lo + tiles_per_split);
    const uint32_t *bt = a.block_tables + a.seq_bt[a.tok_seq[t]];
    const uint16_t *kc = a.k_cache + (size_t)g * HD;
    const uint16_t *vc = a.v_cache + (size_t)g * HD;

    const uint16_t *qrow = a.q + (size_t)t * a.ld_q + (size_t)g * G * HD;
    for (uint32_t i = threadIdx.x; i < G * HD; i += GQA_WARPS * 32)
        q_s[i / HD][i % HD] = tm_bf2f(qrow[i]) * a.scale;
    __syncthreads();

    float m[G], l[G], acc[G][DPL];
#pragma unroll
    for (int i = 0; i < G; i++) {
        m[i] = -INFINITY;
        l[i] = 0.0f;
#pragma unroll
        for (int e = 0; e < DPL; e++)
            acc[i][e] = 0.0f;
    }
    for (uint32_t tile = tile_lo + w; tile < tile_hi; tile += GQA_WARPS) {
        const uint32_t tile0 = lo + tile * 32, p = tile0 + lane;
        const uint32_t n_in = min(32u, n_pos - tile0);
        const bool live = lane < n_in;
        const uint32_t row = live ? bt[p / bs] * bs + p % bs : 0;
        // The V row of this lane's position into shared memory, in flight with the K loads
        // below: one memory round trip for the tile instead of one per few V rows.
        if (live) {
            const uint16_t *v = vc + (size_t)row * kvd;
#pragma unroll
            for (int j = 0; j < HD / 8; j++)
                tm_cp_async16(&v_s[w][lane][8 * j], v + 8 * j);
        }
        tm_cp_async_commit();
        float sc[G];
#pragma unroll
        for (int i = 0; i < G; i++)
            sc[i] = 0.0f;
        if (live) {
            const uint4 *k = reinterpret_cast<const uint4 *>(kc + (size_t)row * kvd);
            uint4 kr[HD / 8];
#pragma unroll
            for (int j = 0; j < HD / 8; j++)
                kr[j] = k[j];
#pragma unroll
            for (int j = 0; j < HD / 8; j++) {
                const uint32_t wv[4] = {kr[j].x, kr[j].y, kr[j].z, kr[j].w};
#pragma unroll
                for (int h = 0; h < 4; h++) {
                    const float k0 = __uint_as_float(wv[h] << 16);
                    const float k1 = __uint_as_float(wv[h] & 0xffff0000u);
#pragma unroll
                    for (int i = 0; i < G; i++)
                        sc[i] += q_s[i][8 * j + 2 * h] * k0 + q_s[i][8 * j + 2 * h + 1] * k1;
                }
            }
        }
#pragma unroll
        for (int i = 0; i < G; i++) {
            const float s = live ? sc[i] : -INFINITY;
            const float m_new = fmaxf(m[i], tm_warp_max(s)); // finite: lane 0 is live
            const float corr = expf(m[i] - m_new);
            const float pe = live ? expf(s - m_new) : 0.0f;
            l[i] = l[i] * corr + tm_warp_sum(pe);
            m[i] = m_new;
            p_s[w][i][lane] = pe;
#pragma unroll
            for (int e = 0; e < DPL; e++)
                acc[i][e] *= corr;
        }
        tm_cp_async_wait<0>();
        __syncwarp(); // p_s and the warp's V rows are in shared memory
#pragma unroll 4
        for (uint32_t j = 0; j < n_in; j++) {
            const uint16_t *v = &v_s[w][j][lane * DPL];
            float vf[DPL];
            if (DPL == 4) {
                const uint2 u = *reinterpret_cast<const uint2 *>(v);
                vf[0] = __uint_as_float(u.x << 16);
                vf[1] = __uint_as_float(u.x & 0xffff0000u);
                vf[2] = __uint_as_float(u.y << 16);
                vf[3] = __uint_as_float(u.y & 0xffff0000u);
            } else {
                const uint32_t u = *reinterpret_cast<const uint32_t *>(v);
                vf[0] = __uint_as_float(u << 16);
                vf[1] = __uint_as_float(u & 0xffff0000u);
            }
#pragma unroll
            for (int i = 0; i < G; i++) {
                const float pj = p_s[w][i][j];
#pragma unroll
                for (int e = 0; e < DPL; e++)
                    acc[i][e] += pj * vf[e];
            }
        }
        __syncwarp(); // p_s and v_s are rewritten by the warp's next tile
    }

    // Merge the warps: every warp publishes (m, l, acc); then thread (head i, dim d) combines.
    // acc_s shares its space with v_s: no warp may still be reading its V rows.
    __syncthreads();
#pragma unroll
    for (int i = 0; i < G; i++) {
        if (lane == 0) {
            m_s[w][i] = m[i];
            l_s[w][i] = l[i];
        }
#pragma unroll
        for (int e = 0; e < DPL; e++)
            acc_s[w][i][lane * DPL + e] = acc[i][e];
    }
    __syncthreads();
    for (uint32_t idx = threadIdx.x; idx < G * HD; idx += GQA_WARPS * 32) {
        const uint32_t i = idx / HD, d = idx % HD;
        float mx = -INFINITY;
#pragma unroll
        for (int ww = 0; ww < GQA_WARPS; ww++)
            mx = fmaxf(mx, m_s[ww][i]);
        float lsum = 0.0f, o = 0.0f;
#pragma unroll
        for (int ww = 0; ww < GQA_WARPS; ww++) {
            if (l_s[ww][i] > 0.0f) { // a warp without positions has m = -inf
                const float f = expf(m_s[ww][i] - mx);
                lsum += l_s[ww][i] * f;
                o += acc_s[ww][i][d] * f;
            }
        }
        const uint32_t h = g * G + i;
        const size_t th = (size_t)t * a.n_head + h;
        if (a.n_split == 1) {
            a.out[(size_t)t * a.ld_q + (size_t)h * HD + d] = tm_f2bf(o / lsum);
        } else {
            a.part_acc[(th * a.n_split + sp) * HD + d] = o;
            if (d == 0) {
                a.part_ml[(th * a.n_split + sp) * 2] = lsum > 0.0f ? mx : -INFINITY;
                a.part_ml[(th * a.n_split + sp) * 2 + 1] = lsum;
            }
        }
    }
}

/* 1 if the GQA kernel serves (head_dim, group size). */
static int gqa_ok(uint32_t head_dim, uint32_t group) {
    return (head_dim == 64 || head_dim == 128) &&
           (group == 1 || group == 2 || group == 4 || group == 8);
}

extern "C" uint32_t tm_k_attn_paged_splits(uint32_t n_tok, uint32_t n_head, uint32_t n_kv_head,
                                           uint32_t head_dim, uint32_t n_sm,
                                           size_t part_floats_cap) {
    if (n_tok == 0 || n_kv_head == 0)
        return 1;
    // blocks: about 4 per SM of the GQA kernel (4 warps each), 8 of the other one
    const int gqa = gqa_ok(head_dim, n_head / n_kv_head);
    const uint32_t target = (gqa ? 4 : 8) * TM_MAX(n_sm, 1u);
    const uint32_t per = gqa ? n_tok * n_kv_head : n_tok * n_head;
    uint32_t n = TM_MIN((target + per - 1) / per, (uint32_t)TM_ATTN_MAX_SPLIT);
    while (n > 1 && tm_k_attn_part_floats(n_tok, n_head, n, head_dim) > part_floats_cap)
        n--;
    return TM_MAX(n, 1u);
}

/* One block per (token, head): merge the n_split partial results. */
static __global__ void __launch_bounds__(NT) attn_merge_kernel(tm_k_attn_paged_bf16_args a) {
    merge_splits(a.out, a.part_acc, a.part_ml, a.ld_q, a.n_head, a.head_dim, a.n_split,
                 blockIdx.x, blockIdx.y, 1);
}

extern "C" size_t tm_k_attn_part_floats(uint32_t n_tok, uint32_t n_head, uint32_t n_split,
                                        uint32_t head_dim) {
    return (size_t)n_tok * n_head * n_split * (head_dim + 2);
}

extern "C" tm_rc tm_k_attn_paged_bf16(const tm_k_attn_paged_bf16_args *a, cudaStream_t s,
                                      tm_err *err) {
    if (a->n_tok == 0)
        return TM_OK;
    TM_ASSERT(a->head_dim % 8 == 0 && a->head_dim > 0 && a->head_dim <= TM_ATTN_MAX_HEAD_DIM);
    TM_ASSERT(a->n_kv_head > 0 && a->n_head % a->n_kv_head == 0 && a->block_size > 0);
    TM_ASSERT(a->ld_q >= a->n_head * a->head_dim);
    TM_ASSERT(a->n_split >= 1 && a->n_split <= TM_ATTN_MAX_SPLIT);
    TM_ASSERT(a->n_split == 1 || (a->part_acc && a->part_ml));
    TM_ASSERT(((uintptr_t)a->part_acc % 16) == 0); // the merge reads float4
    TM_ASSERT(((uintptr_t)a->k_cache % 16) == 0 && ((uintptr_t)a->v_cache % 16) == 0);
    const uint32_t group = a->n_head / a->n_kv_head;
    if (gqa_ok(a->head_dim, group)) {
        dim3 g3(a->n_tok, a->n_kv_head, a->n_split);
#define TM_GQA_CASE(HDV, GV)                                                                     \
    if (a->head_dim == HDV && group == GV)                                                        \
        attn_gqa_bf16_kernel<HDV, GV><<<g3, GQA_WARPS * 32, 0, s>>>(*a);
        TM_GQA_CASE(64, 1)
        TM_GQA_CASE(64, 2)
        TM_GQA_CASE(64, 4)
        TM_GQA_CASE(64, 8)
        TM_GQA_CASE(128, 1)
        TM_GQA_CASE(128, 2)
        TM_GQA_CASE(128, 4)
        TM_GQA_CASE(128, 8)
#undef TM_GQA_CASE
        tm_rc rc = tm_cuda_launched(err, s, "attn_gqa_bf16");
        if (rc || a->n_split == 1)
            return rc;
        attn_merge_kernel<<<dim3(a->n_tok, a->n_head), NT, 0, s>>>(*a);
        return tm_cuda_launched(err, s, "attn_merge");
    }
    dim3 grid(a->n_tok, a->n_head, a->n_split);
    // The unrolled kernels (136 registers at head_dim 128) win when few blocks run (decode:
    // latency-bound, all loads in flight); with many blocks (prefill) occupancy matters more and
    // the runtime-loop kernel (40 registers) was faster on an H200 (W8 prefill 189 vs 269 ms).
    const size_t n_blocks = (size_t)a->n_tok * a->n_head * a->n_split;
    switch (n_blocks <= ATTN_UNROLLED_MAX_BLOCKS ? a->head_dim : 0) {
    case 64:
        attn_paged_bf16_kernel<64><<<grid, NT, 0, s>>>(*a);
        break;
    case 128:
        attn_paged_bf16_kernel<128><<<grid, NT, 0, s>>>(*a);
        break;
    case 256:
        attn_paged_bf16_kernel<256><<<grid, NT, 0, s>>>(*a);
        break;
    default:
        attn_paged_bf16_kernel<0><<<grid, NT, 0, s>>>(*a);
    }
    tm_rc rc = tm_cuda_launched(err, s, "attn_paged_bf16");
    if (rc || a->n_split == 1)
        return rc;
    attn_merge_kernel<<<dim3(a->n_tok, a->n_head), NT, 0, s>>>(*a);
    return tm_cuda_launched(err, s, "attn_merge");
}
