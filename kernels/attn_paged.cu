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
 * attn_merge_kernel, a second launch, combines the splits with the usual rescaling. An empty
 * split writes max = -inf, sum = 0. */
#include "kernels/attn_paged.h"
#include "kernels/common.cuh"
#include "kernels/kv_fp8.cuh"

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

/* Splits whose partials a merging thread loads at once (float4 each). */
#define MERGE_CHUNK 8

/* sum of q[e] * e4m3 vector v[e], e < 8 (the F8 twin of dot8) */
static __device__ __forceinline__ float dot8_f8(const float *q, uint2 v) {
    float f[8];
    tm_kv_e4m3x8_f32(v, f);
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        s += q[2 * i] * f[2 * i];
        s += q[2 * i + 1] * f[2 * i + 1];
    }
    return s;
}

/* acc[e] += p * e4m3 vector v[e], e < 8 */
static __device__ __forceinline__ void axpy8_f8(float *acc, float p, uint2 v) {
    float f[8];
    tm_kv_e4m3x8_f32(v, f);
#pragma unroll
    for (int e = 0; e < 8; e++)
        acc[e] += p * f[e];
}

/* HD: head_dim known at compile time (64, 128, 256: loops fully unrolled, so every thread has
 * all its K and V loads in flight at once), or 0 for any other multiple of 8 (runtime loops).
 * F8: the cache holds e4m3 bytes (offsets in elements = bytes), else bf16. */
template <int HD, bool F8>
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
    const uint8_t *kc8 = reinterpret_cast<const uint8_t *>(a.k_cache) + (size_t)kvh * hd;
    const uint8_t *vc8 = reinterpret_cast<const uint8_t *>(a.v_cache) + (size_t)kvh * hd;

    const uint16_t *qrow = a.q + (size_t)t * a.ld_q + (size_t)h * hd;
    for (uint32_t i = tid; i < hd; i += NT)
        q_s[i] = tm_bf2f(qrow[i]);
    __syncthreads();

    const uint32_t lpr = hd / 8;    // threads per V row
    const uint32_t n_rg = NT / lpr; // row groups
    const uint32_t rg = tid / lpr, c8 = (tid % lpr) * 8;
    const bool v_thread = rg < n_rg; // NT % lpr may leave threads idle
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    float m = -INFINITY, l = 0.0f;

    for (uint32_t tile0 = start; tile0 < end; tile0 += NT) {
        const uint32_t p = tile0 + tid;
        float s = -INFINITY;
        if (p < end && F8) {
            const uint8_t *k = kc8 + ((size_t)bt[p / bs] * bs + p % bs) * kvd;
            float dot = 0.0f;
            if (HD) {
                uint2 kr[HD ? HD / 8 : 1];
#pragma unroll
                for (int i = 0; i < HD / 8; i++)
                    kr[i] = reinterpret_cast<const uint2 *>(k)[i];
#pragma unroll
                for (int i = 0; i < HD / 8; i++)
                    dot += dot8_f8(q_s + 8 * i, kr[i]);
            } else {
                for (uint32_t i = 0; i < hd; i += 8)
                    dot += dot8_f8(q_s + i, *reinterpret_cast<const uint2 *>(k + i));
            }
            s = dot * a.scale;
        } else if (p < end) {
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
        if (v_thread && F8) {
            const uint32_t n_in_tile = min((uint32_t)NT, end - tile0);
            if (HD) {
                constexpr int RG = HD ? NT / (HD / 8) : 1;
                uint2 vr[NT / RG];
#pragma unroll
                for (int jj = 0; jj < NT / RG; jj++) {
                    const uint32_t j = rg + jj * RG;
                    if (j < n_in_tile) {
                        const uint32_t pp = tile0 + j;
                        vr[jj] = *reinterpret_cast<const uint2 *>(
                            vc8 + ((size_t)bt[pp / bs] * bs + pp % bs) * kvd + c8);
                    }
                }
#pragma unroll
                for (int jj = 0; jj < NT / RG; jj++) {
                    const uint32_t j = rg + jj * RG;
                    if (j < n_in_tile)
                        axpy8_f8(acc, p_s[j], vr[jj]);
                }
            } else {
                for (uint32_t j = rg; j < n_in_tile; j += n_rg) {
                    const uint32_t pp = tile0 + j;
                    axpy8_f8(acc, p_s[j],
                             *reinterpret_cast<const uint2 *>(
                                 vc8 + ((size_t)bt[pp / bs] * bs + pp % bs) * kvd + c8));
                }
            }
        } else if (v_thread) {
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
 * Each K/V row is read once for the G heads that share it, and the products run on tensor cores
 * (mma.sync m16n8k16, bf16 in, fp32 accumulate) with the G heads as the rows of a 16-row tile
 * (rows G..15 are zero). 4 warps; a warp takes 16-position tiles of the split in turn. Per tile:
 *   V rows    lane pairs copy the tile's 16 V rows into the warp's shared memory (cp.async,
 *             rows past the context zero-filled), in flight with the K loads;
 *   S = Q K^T lane 4r + c loads, for key rows r and r + 8 of the tile, the 16 bytes of each
 *             32-dimension chunk at [8c, 8c + 8) and uses them as B fragments directly, with the
 *             inner index permuted; Q (loaded once, the same way, rows = heads) takes the same
 *             permutation (kernels/gemm_skinny.cu does the same), so no shared memory or
 *             shuffles are needed for K;
 *   softmax   scaled scores, keys past the context at -inf; running max per head (the 4 lanes
 *             of a quad share a head) and per-lane partial sums, in fp32;
 *   O += P V  P is split into bf16 high and low parts (two mma, so P keeps about 16 bits:
 *             as accurate as fp32 weights against bf16 V); V's B fragments come from
 *             ldmatrix.trans.
 * A tile's K and V take one memory round trip, and the arithmetic is a few dozen tensor-core
 * instructions per warp instead of thousands of FMAs: decode attention is bound by latency.
 * At the end the warps' (max, sum, acc) are merged in shared memory, and the block writes the
 * output (one split) or the partials for attn_merge_kernel, in the same layout as the kernel
 * above. */
#define GQA_WARPS 4

template <int HD, int G, bool F8>
static __global__ void __launch_bounds__(GQA_WARPS * 32)
    attn_gqa_bf16_kernel(tm_k_attn_paged_bf16_args a) {
    static_assert(G <= 8, "the heads are rows 0..7 of the tile");
    constexpr int NCH = HD / 32; // 32-dimension chunks of a row
    constexpr int LDV = HD + 8;  // padded V row: ldmatrix's 8 rows hit 8 bank groups
    __shared__ __align__(16) uint16_t v_s[GQA_WARPS][16][LDV];
    __shared__ float m_s[GQA_WARPS][G], l_s[GQA_WARPS][G];
    __shared__ float acc_s[GQA_WARPS][G][HD];
    const uint32_t t = blockIdx.x, g = blockIdx.y, sp = blockIdx.z;
    const uint32_t w = threadIdx.x / 32, lane = threadIdx.x & 31, r = lane >> 2, c = lane & 3;
    const uint32_t kvd = a.n_kv_head * HD, bs = a.block_size;
    const uint32_t n_pos = a.pos[t] + 1;
    const uint32_t lo = a.window && n_pos > a.window ? n_pos - a.window : 0;
    const uint32_t n_tile = (n_pos - lo + 15) / 16;
    const uint32_t tiles_per_split = (n_tile + a.n_split - 1) / a.n_split;
    const uint32_t tile_lo = sp * tiles_per_split;
    const uint32_t tile_hi = min(n_tile, tile_lo + tiles_per_split);
    const uint32_t *bt = a.block_tables + a.seq_bt[a.tok_seq[t]];
    const uint16_t *kc = a.k_cache + (size_t)g * HD;
    const uint16_t *vc = a.v_cache + (size_t)g * HD;
    const uint8_t *kc8 = reinterpret_cast<const uint8_t *>(a.k_cache) + (size_t)g * HD;
    const uint8_t *vc8 = reinterpret_cast<const uint8_t *>(a.v_cache) + (size_t)g * HD;
    const uint4 zero = make_uint4(0, 0, 0, 0);

    // Q as A fragments: head r of the group (lanes of rows >= G hold zeros), chunk m's 16 bytes
    uint4 qf[NCH];
    {
        const uint16_t *qrow = a.q + (size_t)t * a.ld_q + (size_t)(g * G + min(r, G - 1u)) * HD;
#pragma unroll
        for (int m = 0; m < NCH; m++)
            qf[m] = r < G ? *reinterpret_cast<const uint4 *>(qrow + 32 * m + 8 * c) : zero;
    }
    float o[HD / 8][4];
#pragma unroll
    for (int d = 0; d < HD / 8; d++)
        o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
    float m_run = -INFINITY, l_run = 0.0f; // head r: running max; this lane's partial sum

    for (uint32_t tile = tile_lo + w; tile < tile_hi; tile += GQA_WARPS) {
        const uint32_t k0 = lo + tile * 16;
        // F8: the V half row in registers (16 e4m3 per uint4), widened into v_s after the
        // softmax
        uint4 v8[F8 ? HD / 32 : 1];
        if constexpr (F8) {
            const uint32_t vr = lane >> 1, p = k0 + vr, half = (lane & 1) * (HD / 2);
            const bool ok = p < n_pos;
            const uint8_t *src = vc8 + (ok ? (size_t)bt[p / bs] * bs + p % bs : 0) * kvd + half;
#pragma unroll
            for (int i = 0; i < HD / 32; i++)
                v8[i] = ok ? *reinterpret_cast<const uint4 *>(src + 16 * i) : zero;
        } else { // V rows: lane 2i + j copies half j of row i
            const uint32_t vr = lane >> 1, p = k0 + vr, half = (lane & 1) * (HD / 2);
            const bool ok = p < n_pos;
            const uint16_t *src = vc + (ok ? (size_t)bt[p / bs] * bs + p % bs : 0) * kvd + half;
#pragma unroll
            for (int i = 0; i < HD / 16; i++)
                tm_cp_async16(&v_s[w][vr][half + 8 * i], src + 8 * i, ok ? 16 : 0);
            tm_cp_async_commit();
        }
        uint4 kf[2][NCH]; // key rows k0 + r and k0 + 8 + r
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const uint32_t p = k0 + 8 * j + r;
            const bool ok = p < n_pos;
            if constexpr (F8) {
                const uint8_t *krow = kc8 + (ok ? (size_t)bt[p / bs] * bs + p % bs : 0) * kvd;
                uint2 raw[NCH];
#pragma unroll
                for (int m = 0; m < NCH; m++)
                    raw[m] = ok ? *reinterpret_cast<const uint2 *>(krow + 32 * m + 8 * c)
                                : make_uint2(0, 0);
#pragma unroll
                for (int m = 0; m < NCH; m++)
                    kf[j][m] = tm_kv_e4m3x8_bf16(raw[m]);
            } else {
                const uint16_t *krow = kc + (ok ? (size_t)bt[p / bs] * bs + p % bs : 0) * kvd;
#pragma unroll
                for (int m = 0; m < NCH; m++)
                    kf[j][m] = ok ? *reinterpret_cast<const uint4 *>(krow + 32 * m + 8 * c) : zero;
            }
        }
        // S = Q K^T: s[j] = {S[r][k0 + 8j + 2c], S[r][.. + 1], rows r + 8 (zero)}
        float s[2][4];
#pragma unroll
        for (int j = 0; j < 2; j++) {
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
            for (int m = 0; m < NCH; m++) {
                const uint32_t qa0[4] = {qf[m].x, 0u, qf[m].y, 0u};
                const uint32_t qa1[4] = {qf[m].z, 0u, qf[m].w, 0u};
                tm_mma_bf16(s[j], qa0, kf[j][m].x, kf[j][m].y);
                tm_mma_bf16(s[j], qa1, kf[j][m].z, kf[j][m].w);
            }
        }
        // online softmax of head r over the tile's keys (the tile's first key is live)
        float mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const bool live = k0 + 8 * j + 2 * c + e < n_pos;
                s[j][e] = live ? s[j][e] * a.scale : -INFINITY;
                mx = fmaxf(mx, s[j][e]);
            }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m_run, mx), corr = expf(m_run - m_new);
        m_run = m_new;
        l_run *= corr;
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                s[j][e] = expf(s[j][e] - m_new);
                l_run += s[j][e];
            }
#pragma unroll
        for (int d = 0; d < HD / 8; d++)
            o[d][0] *= corr, o[d][1] *= corr;
        // P as A fragments (keys [k0, k0 + 16) = one k-step): high and low bf16 parts
        const uint32_t ph[4] = {tm_pack_bf16(s[0][0], s[0][1]), 0u, tm_pack_bf16(s[1][0], s[1][1]),
                                0u};
        const uint32_t pl[4] = {
            tm_pack_bf16(s[0][0] - tm_bf2f(ph[0] & 0xffffu), s[0][1] - tm_bf2f(ph[0] >> 16)), 0u,
            tm_pack_bf16(s[1][0] - tm_bf2f(ph[2] & 0xffffu), s[1][1] - tm_bf2f(ph[2] >> 16)), 0u};
        if constexpr (F8) { // widen the V half row: 16 e4m3 -> two 16-byte bf16 pieces each
            const uint32_t vr = lane >> 1, half = (lane & 1) * (HD / 2);
#pragma unroll
            for (int i = 0; i < HD / 32; i++) {
                *reinterpret_cast<uint4 *>(&v_s[w][vr][half + 16 * i]) =
                    tm_kv_e4m3x8_bf16(make_uint2(v8[i].x, v8[i].y));
                *reinterpret_cast<uint4 *>(&v_s[w][vr][half + 16 * i + 8]) =
                    tm_kv_e4m3x8_bf16(make_uint2(v8[i].z, v8[i].w));
            }
        } else {
            tm_cp_async_wait<0>();
        }
        __syncwarp(); // the warp's V rows are in shared memory
        // O += P V. ldmatrix x4 trans: keys [0, 16) x dims [8d, 8d + 16), as the B fragments of
        // dim groups d and d + 1
        const uint32_t vrow = (lane & 7) + 8 * ((lane >> 3) & 1), vcol = 8 * (lane >> 4);
#pragma unroll
        for (int d = 0; d < HD / 8; d += 2) {
            uint32_t b[4];
            tm_ldsm_x4_trans(b, &v_s[w][vrow][8 * d + vcol]);
            tm_mma_bf16(o[d], ph, b[0], b[1]);
            tm_mma_bf16(o[d], pl, b[0], b[1]);
            tm_mma_bf16(o[d + 1], ph, b[2], b[3]);
            tm_mma_bf16(o[d + 1], pl, b[2], b[3]);
        }
        __syncwarp(); // v_s is rewritten by the warp's next tile
    }
    l_run += __shfl_xor_sync(0xffffffffu, l_run, 1);
    l_run += __shfl_xor_sync(0xffffffffu, l_run, 2);

    // Merge the warps: every warp publishes (m, l, acc); then thread (head i, dim d) combines.
    if (r < G) {
        if (c == 0) {
            m_s[w][r] = m_run;
            l_s[w][r] = l_run;
        }
#pragma unroll
        for (int d = 0; d < HD / 8; d++) {
            acc_s[w][r][8 * d + 2 * c] = o[d][0];
            acc_s[w][r][8 * d + 2 * c + 1] = o[d][1];
        }
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
    // GQA kernel: one wave at 3 blocks per SM (its registers allow 3), rounded down, as a
    // split's tiles cost a memory round trip each and more splits cost merge work; the other
    // kernel: about 8 blocks per SM
    const int gqa = gqa_ok(head_dim, n_head / n_kv_head);
    const uint32_t per = gqa ? n_tok * n_kv_head : n_tok * n_head;
    const uint32_t n_blk = (gqa ? 3 : 8) * TM_MAX(n_sm, 1u);
    uint32_t n = gqa ? n_blk / per : (n_blk + per - 1) / per;
    n = TM_MIN(TM_MAX(n, 1u), (uint32_t)TM_ATTN_MAX_SPLIT);
    while (n > 1 && tm_k_attn_part_floats(n_tok, n_head, n, head_dim) > part_floats_cap)
        n--;
    return TM_MAX(n, 1u);
}

/* One block per (token, head): merge its n_split (<= TM_ATTN_MAX_SPLIT) partial results into out.
 * In split order over the splits that saw positions (sum > 0; an empty split has max = -inf):
 * mx = the largest maximum, f = exp(max - mx), l = sum of sum * f; then per output
 * o = sum of acc * f and out = o * (1 / l). It sits between the attention and o_proj of every
 * decode layer, so it is built for latency (round trips, not bandwidth):
 *   warp 0: lane sp reads split sp's (max, sum), f goes to shared memory (-1 marks an empty
 *     split), and each lane sums l in split order from the lanes' values (shuffles);
 *   a thread per 4 output dims: float4 loads of MERGE_CHUNK splits at once, then the in-order
 *     sums (explicit fmaf).
 * (Merging in the attention kernel itself, by the last split block to finish, was measured on
 * H200s: no faster in a decode step; bench/RESULTS.md.) */
static __global__ void __launch_bounds__(NT) attn_merge_kernel(tm_k_attn_paged_bf16_args a) {
    __shared__ float f_s[TM_ATTN_MAX_SPLIT];
    __shared__ float inv_s;
    const uint32_t t = blockIdx.x, h = blockIdx.y, n_split = a.n_split, hd = a.head_dim;
    const size_t th = (size_t)t * a.n_head + h;
    if (threadIdx.x < 32) {
        const uint32_t lane = threadIdx.x;
        const float *ml = a.part_ml + th * n_split * 2;
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
            f_s[lane] = f;
        if (lane == 0)
            inv_s = 1.0f / l;
    }
    __syncthreads();
    const uint32_t hd4 = hd / 4;
    for (uint32_t i4 = threadIdx.x; i4 < hd4; i4 += blockDim.x) {
        const float4 *acc = reinterpret_cast<const float4 *>(a.part_acc + th * n_split * hd) + i4;
        float o[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (uint32_t sp0 = 0; sp0 < n_split; sp0 += MERGE_CHUNK) {
            float4 v[MERGE_CHUNK];
#pragma unroll
            for (uint32_t k = 0; k < MERGE_CHUNK; k++)
                if (sp0 + k < n_split)
                    v[k] = __ldcg(acc + (size_t)(sp0 + k) * hd4);
#pragma unroll
            for (uint32_t k = 0; k < MERGE_CHUNK; k++) {
                const float f = sp0 + k < n_split ? f_s[sp0 + k] : -1.0f;
                if (f >= 0.0f) {
                    o[0] = fmaf(v[k].x, f, o[0]);
                    o[1] = fmaf(v[k].y, f, o[1]);
                    o[2] = fmaf(v[k].z, f, o[2]);
                    o[3] = fmaf(v[k].w, f, o[3]);
                }
            }
        }
        uint16_t *dst = a.out + (size_t)t * a.ld_q + (size_t)h * hd + 4 * i4;
#pragma unroll
        for (int e = 0; e < 4; e++)
            dst[e] = tm_f2bf(o[e] * inv_s);
    }
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
        TM_ASSERT(((uintptr_t)a->q % 16) == 0 && a->ld_q % 8 == 0); // Q rows in 16-byte pieces
        dim3 g3(a->n_tok, a->n_kv_head, a->n_split);
#define TM_GQA_CASE(HDV, GV)                                                                       \
    if (a->head_dim == HDV && group == GV && !a->kv_fp8)                                           \
        attn_gqa_bf16_kernel<HDV, GV, false><<<g3, GQA_WARPS * 32, 0, s>>>(*a);                    \
    if (a->head_dim == HDV && group == GV && a->kv_fp8)                                            \
        attn_gqa_bf16_kernel<HDV, GV, true><<<g3, GQA_WARPS * 32, 0, s>>>(*a);
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
    const uint32_t hd_case = n_blocks <= ATTN_UNROLLED_MAX_BLOCKS ? a->head_dim : 0;
    if (a->kv_fp8) {
        switch (hd_case) {
        case 64:
            attn_paged_bf16_kernel<64, true><<<grid, NT, 0, s>>>(*a);
            break;
        case 128:
            attn_paged_bf16_kernel<128, true><<<grid, NT, 0, s>>>(*a);
            break;
        case 256:
            attn_paged_bf16_kernel<256, true><<<grid, NT, 0, s>>>(*a);
            break;
        default:
            attn_paged_bf16_kernel<0, true><<<grid, NT, 0, s>>>(*a);
        }
    } else {
        switch (hd_case) {
        case 64:
            attn_paged_bf16_kernel<64, false><<<grid, NT, 0, s>>>(*a);
            break;
        case 128:
            attn_paged_bf16_kernel<128, false><<<grid, NT, 0, s>>>(*a);
            break;
        case 256:
            attn_paged_bf16_kernel<256, false><<<grid, NT, 0, s>>>(*a);
            break;
        default:
            attn_paged_bf16_kernel<0, false><<<grid, NT, 0, s>>>(*a);
        }
    }
    tm_rc rc = tm_cuda_launched(err, s, "attn_paged_bf16");
    if (rc || a->n_split == 1)
        return rc;
    attn_merge_kernel<<<dim3(a->n_tok, a->n_head), NT, 0, s>>>(*a);
    return tm_cuda_launched(err, s, "attn_merge");
}
