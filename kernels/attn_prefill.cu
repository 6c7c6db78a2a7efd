/* kernels/attn_prefill.cu - tensor-core paged attention for prefill tiles (see attn_prefill.h).
 *
 * Block = (query head h, tile), 4 warps; warp w owns the tile's query rows [16w, 16w + 16). The
 * tile's key range [lo, pos0 + n) is walked in key tiles of BN = 64 positions. Each key tile's K
 * and V rows are gathered through the block table into shared memory with cp.async (16-byte
 * pieces; rows past the sequence's end are zero-filled), double-buffered: tile j + 1 is in
 * flight while tile j is computed. Per key tile and warp:
 *   S = Q K^T   mma.sync m16n8k16 (bf16 in, fp32 accumulate); Q's A fragments stay in registers
 *               for the whole block, K's B fragments come from ldmatrix;
 *   softmax     scores scaled into the log2 domain, masked (causal, window) with -inf where the
 *               tile touches the diagonal or the window's edge, running row max and per-thread
 *               partial row sums in fp32, accumulators rescaled;
 *   O += P V    the S accumulators, rounded to bf16, are the A fragments; V's B fragments come
 *               from ldmatrix.trans.
 * A warp skips the math of key tiles that lie wholly after its last row or before its first
 * row's window (it still takes part in the loads and barriers). At the end each warp normalises
 * its rows, stages them as bf16 in shared memory and writes them with 16-byte stores.
 *
 * Shared memory rows are padded by 8 elements (16 bytes), so the 8 row addresses of an ldmatrix
 * land in 8 different 16-byte bank groups. Q is staged once in the second buffer before the
 * first key tile is loaded there.
 *
 * Speed: each K or V fragment read from shared memory feeds one mma (16 rows per warp), so the
 * kernel is bound by ldmatrix bandwidth at about a quarter of the H200's bf16 peak. More rows
 * per warp (or two query heads of one KV head per warp) would halve that traffic but needs
 * twice the accumulator registers; wgmma (sm_90 only) is the other way up. */
#include "kernels/attn_prefill.h"
#include "kernels/common.cuh"
#include "kernels/kv_fp8.cuh"

#include <stdlib.h>

#define BM TM_ATTN_PREFILL_TILE_M
#define BN 64
#define NWARP (BM / 16)
#define NTHR (NWARP * 32)

// 3 blocks per SM caps head_dim 128 at 168 registers (no spills; 2 per SM gave 201): on an H200
// the 8 x 2048-token llama8b layer took 1.32 ms (208 TFLOP/s) against 1.55 ms with 2.
// F8: the caches hold e4m3 bytes; a key tile's rows are then loaded into registers and stored
// widened to bf16 (synchronous loads instead of cp.async: the rest is unchanged).
template <int HD, bool F8>
static __global__ void __launch_bounds__(NTHR, 3)
    attn_prefill_bf16_kernel(tm_k_attn_prefill_bf16_args a) {
    constexpr int LDS = HD + 8;     // padded shared row, elements
    constexpr int CPR = HD / 8;     // 16-byte pieces per row
    constexpr int RPP = NTHR / CPR; // rows per load pass
    constexpr int NPASS = BN / RPP; // load passes per key tile (BM == BN rows for Q too)
    static_assert(BM == BN, "Q is staged in a K/V buffer");
    extern __shared__ __align__(16) uint16_t smem[]; // [2 buffers][K, V][BN][LDS]

    const tm_k_attn_prefill_tile tile = a.tiles[blockIdx.y];
    const uint32_t h = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const uint32_t kvh = h / (a.n_head / a.n_kv_head), kvd = a.n_kv_head * HD;
    const uint32_t bs = a.block_size, win = a.window;
    const uint32_t *bt = a.block_tables + a.seq_bt[tile.seq];
    const uint16_t *kc = a.k_cache + (size_t)kvh * HD;
    const uint16_t *vc = a.v_cache + (size_t)kvh * HD;
    const uint32_t kv_hi = tile.pos0 + tile.n; // keys [kv_lo, kv_hi) are in the cache
    const uint32_t kv_lo = win && tile.pos0 + 1 > win ? tile.pos0 + 1 - win : 0;
    const uint32_t n_kt = (kv_hi - kv_lo + BN - 1) / BN;

    // this thread's piece of each load pass: column c8, rows lr + RPP * i
    const uint32_t c8 = (tid % CPR) * 8, lr = tid / CPR;
    const uint8_t *kc8 = reinterpret_cast<const uint8_t *>(a.k_cache) + (size_t)kvh * HD;
    const uint8_t *vc8 = reinterpret_cast<const uint8_t *>(a.v_cache) + (size_t)kvh * HD;
    auto load_kv = [&](int buf, uint32_t k0) {
        uint16_t *ks = smem + buf * 2 * BN * LDS, *vs = ks + BN * LDS;
        if constexpr (F8) {
            for (int c = 0; c < 2; c++) { // K, then V (fewer loads in flight: registers)
                const uint8_t *src = c ? vc8 : kc8;
                uint16_t *dst = c ? vs : ks;
                uint2 raw[NPASS];
#pragma unroll
                for (int i = 0; i < NPASS; i++) {
                    const uint32_t p = k0 + lr + RPP * i;
                    raw[i] = p < kv_hi ? *reinterpret_cast<const uint2 *>(
                                             src + ((size_t)bt[p / bs] * bs + p % bs) * kvd + c8)
                                       : make_uint2(0, 0);
                }
#pragma unroll
                for (int i = 0; i < NPASS; i++)
                    *reinterpret_cast<uint4 *>(dst + (lr + RPP * i) * LDS + c8) =
                        tm_kv_e4m3x8_bf16(raw[i]);
            }
        } else {
#pragma unroll
            for (int i = 0; i < NPASS; i++) {
                const uint32_t r = lr + RPP * i, p = k0 + r;
                const bool ok = p < kv_hi;
                const size_t slot = ok ? (size_t)bt[p / bs] * bs + p % bs : 0;
                tm_cp_async16(ks + r * LDS + c8, kc + slot * kvd + c8, ok ? 16 : 0);
                tm_cp_async16(vs + r * LDS + c8, vc + slot * kvd + c8, ok ? 16 : 0);
            }
        }
    };

    // Q tile into buffer 1's K rows, key tile 0 into buffer 0
    {
        uint16_t *qs = smem + 2 * BN * LDS;
#pragma unroll
        for (int i = 0; i < NPASS; i++) {
            const uint32_t r = lr + RPP * i;
            const bool ok = r < tile.n;
            const uint16_t *src = a.q + (size_t)(ok ? tile.t0 + r : tile.t0) * a.ld_q +
                                  (size_t)h * HD + c8;
            tm_cp_async16(qs + r * LDS + c8, src, ok ? 16 : 0);
        }
    }
    load_kv(0, kv_lo);
    tm_cp_async_commit();
    tm_cp_async_wait<0>();
    __syncthreads();

    const uint32_t r0 = warp * 16, g = lane >> 2, t4 = lane & 3;
    // Q's A fragments: k-step kk covers dims [16kk, 16kk + 16)
    uint32_t qa[HD / 16][4];
    {
        const uint16_t *qs = smem + 2 * BN * LDS;
        const uint32_t row = r0 + (lane & 7) + 8 * ((lane >> 3) & 1), col = 8 * (lane >> 4);
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++)
            tm_ldsm_x4(qa[kk], qs + row * LDS + 16 * kk + col);
    }
    __syncthreads(); // buffer 1 is overwritten by key tile 1

    float o[HD / 8][4];
#pragma unroll
    for (int d = 0; d < HD / 8; d++)
        o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}; // rows g and g + 8
    const float sc = a.scale * 1.4426950408889634f;           // scores in log2 units
    const bool warp_live = r0 < tile.n;
    const uint32_t wq_lo = tile.pos0 + r0;                       // first row's position
    const uint32_t wq_hi = tile.pos0 + min(r0 + 15, tile.n - 1); // last live row's position
    const uint32_t qp[2] = {wq_lo + g, wq_lo + g + 8};

    // hot loop: key tiles
    for (uint32_t j = 0; j < n_kt; j++) {
        const uint32_t k0 = kv_lo + j * BN;
        if (j + 1 < n_kt) {
            load_kv((j + 1) & 1, k0 + BN);
            tm_cp_async_commit();
            tm_cp_async_wait<1>();
        } else {
            tm_cp_async_wait<0>();
        }
        __syncthreads();
        const uint16_t *ks = smem + (j & 1) * 2 * BN * LDS, *vs = ks + BN * LDS;
        // the warp's rows see no key of this tile: wholly after the last row, or wholly before
        // the first row's window
        const bool skip = !warp_live || k0 > wq_hi || (win && k0 + BN + win <= wq_lo + 1);
        if (!skip) {
            float s[BN / 8][4];
#pragma unroll
            for (int n8 = 0; n8 < BN / 8; n8++)
                s[n8][0] = s[n8][1] = s[n8][2] = s[n8][3] = 0.0f;
            // S = Q K^T. ldmatrix x4: keys [8n8, 8n8 + 16) x dims [16kk, 16kk + 16), as the B
            // fragments of key groups n8 and n8 + 1
            const uint32_t krow = (lane & 7) + 8 * (lane >> 4), kcol = 8 * ((lane >> 3) & 1);
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
#pragma unroll
                for (int n8 = 0; n8 < BN / 8; n8 += 2) {
                    uint32_t b[4];
                    tm_ldsm_x4(b, ks + (8 * n8 + krow) * LDS + 16 * kk + kcol);
                    tm_mma_bf16(s[n8], qa[kk], b[0], b[1]);
                    tm_mma_bf16(s[n8 + 1], qa[kk], b[2], b[3]);
                }
            }
            // masks: causal where the tile reaches past the warp's first row, window where it
            // reaches below the last row's window start
            const bool need_mask = k0 + BN > wq_lo + 1 || (win && k0 + win <= wq_hi);
#pragma unroll
            for (int n8 = 0; n8 < BN / 8; n8++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float x = s[n8][e] * sc;
                    if (need_mask) {
                        const uint32_t kp = k0 + 8 * n8 + 2 * t4 + (e & 1), q = qp[e >> 1];
                        if (kp > q || (win && kp + win <= q))
                            x = -INFINITY;
                    }
                    s[n8][e] = x;
                }
            }
            // online softmax; the 4 threads of a quad share a row
            float mx[2] = {m[0], m[1]};
#pragma unroll
            for (int n8 = 0; n8 < BN / 8; n8++) {
                mx[0] = fmaxf(mx[0], fmaxf(s[n8][0], s[n8][1]));
                mx[1] = fmaxf(mx[1], fmaxf(s[n8][2], s[n8][3]));
            }
            float base[2], corr[2];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
                mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
                base[i] = mx[i] == -INFINITY ? 0.0f : mx[i]; // no key yet: keep p = 0, no NaN
                corr[i] = exp2f(m[i] - base[i]);
                m[i] = mx[i];
                l[i] *= corr[i];
            }
#pragma unroll
            for (int n8 = 0; n8 < BN / 8; n8++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float p = exp2f(s[n8][e] - base[e >> 1]);
                    s[n8][e] = p;
                    l[e >> 1] += p;
                }
            }
#pragma unroll
            for (int d = 0; d < HD / 8; d++) {
                o[d][0] *= corr[0], o[d][1] *= corr[0];
                o[d][2] *= corr[1], o[d][3] *= corr[1];
            }
            // O += P V. ldmatrix x4 trans: keys [16kk, 16kk + 16) x dims [8d, 8d + 16), as the B
            // fragments of dim groups d and d + 1
            const uint32_t vrow = (lane & 7) + 8 * ((lane >> 3) & 1), vcol = 8 * (lane >> 4);
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++) {
                const uint32_t pa[4] = {tm_pack_bf16(s[2 * kk][0], s[2 * kk][1]),
                                        tm_pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                                        tm_pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                        tm_pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
                for (int d = 0; d < HD / 8; d += 2) {
                    uint32_t b[4];
                    tm_ldsm_x4_trans(b, vs + (16 * kk + vrow) * LDS + 8 * d + vcol);
                    tm_mma_bf16(o[d], pa, b[0], b[1]);
                    tm_mma_bf16(o[d + 1], pa, b[2], b[3]);
                }
            }
        }
        __syncthreads(); // this buffer is refilled by the next iteration's load
    }

    if (!warp_live)
        return;
    float inv[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
        inv[i] = l[i] > 0.0f ? 1.0f / l[i] : 0.0f; // live rows always have their own key
    }
    // stage the warp's 16 rows in buffer 0 (no longer read: the loop ended with a barrier)
    uint16_t *os = smem + r0 * LDS;
#pragma unroll
    for (int d = 0; d < HD / 8; d++) {
        *reinterpret_cast<uint32_t *>(os + g * LDS + 8 * d + 2 * t4) =
            tm_pack_bf16(o[d][0] * inv[0], o[d][1] * inv[0]);
        *reinterpret_cast<uint32_t *>(os + (g + 8) * LDS + 8 * d + 2 * t4) =
            tm_pack_bf16(o[d][2] * inv[1], o[d][3] * inv[1]);
    }
    __syncwarp();
    for (uint32_t i = lane; i < 16 * CPR; i += 32) {
        const uint32_t r = i / CPR, c = (i % CPR) * 8;
        if (r0 + r < tile.n) {
            uint16_t *dst = a.out + (size_t)(tile.t0 + r0 + r) * a.ld_q + (size_t)h * HD + c;
            *reinterpret_cast<uint4 *>(dst) = *reinterpret_cast<const uint4 *>(os + r * LDS + c);
        }
    }
}

template <int HD> static size_t smem_bytes(void) {
    return (size_t)2 * 2 * BN * (HD + 8) * sizeof(uint16_t);
}

extern "C" int tm_k_attn_prefill_supported(uint32_t head_dim) {
    return head_dim == 64 || head_dim == 128;
}

extern "C" uint32_t tm_k_attn_prefill_n_tiles(const tm_k_attn_prefill_chunk *chunks,
                                              uint32_t n_seq) {
    uint32_t n = 0;
    for (uint32_t i = 0; i < n_seq; i++)
        n += TM_CEIL_DIV(chunks[i].n_tok, BM);
    return n;
}

extern "C" uint32_t tm_k_attn_prefill_max_tiles(uint32_t n_tok, uint32_t n_seq) {
    // every sequence wastes at most one partial tile
    return n_tok / BM + n_seq;
}

static int tile_cmp(const void *pa, const void *pb) {
    const tm_k_attn_prefill_tile *x = (const tm_k_attn_prefill_tile *)pa;
    const tm_k_attn_prefill_tile *y = (const tm_k_attn_prefill_tile *)pb;
    const uint32_t ex = x->pos0 + x->n, ey = y->pos0 + y->n;
    if (ex != ey)
        return ex > ey ? -1 : 1; // longest key range first
    if (x->seq != y->seq)
        return x->seq < y->seq ? -1 : 1;
    return x->t0 < y->t0 ? -1 : x->t0 > y->t0;
}

extern "C" uint32_t tm_k_attn_prefill_tiles(const tm_k_attn_prefill_chunk *chunks, uint32_t n_seq,
                                            tm_k_attn_prefill_tile *tiles) {
    uint32_t n = 0;
    for (uint32_t i = 0; i < n_seq; i++)
        for (uint32_t r = 0; r < chunks[i].n_tok; r += BM, n++) {
            tiles[n].seq = i;
            tiles[n].t0 = chunks[i].t0 + r;
            tiles[n].n = chunks[i].n_tok - r < BM ? chunks[i].n_tok - r : BM;
            tiles[n].pos0 = chunks[i].pos0 + r;
        }
    qsort(tiles, n, sizeof(*tiles), tile_cmp);
    return n;
}

/* One launch for head_dim HD. More than 48 KiB of dynamic shared memory (head_dim 128) needs the
 * opt-in; it is cheap and not a stream operation, so it is set on every launch rather than kept
 * as state. */
template <int HD, bool F8>
static tm_rc launch(const tm_k_attn_prefill_bf16_args *a, dim3 grid, cudaStream_t s, tm_err *err) {
    const size_t sm = smem_bytes<HD>();
    tm_rc rc = TM_CUDA_CHECK(cudaFuncSetAttribute(attn_prefill_bf16_kernel<HD, F8>,
                                                  cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                  (int)sm),
                             err);
    if (rc)
        return rc;
    attn_prefill_bf16_kernel<HD, F8><<<grid, NTHR, sm, s>>>(*a);
    return tm_cuda_launched(err, s, "attn_prefill_bf16");
}

extern "C" tm_rc tm_k_attn_prefill_bf16(const tm_k_attn_prefill_bf16_args *a, cudaStream_t s,
                                        tm_err *err) {
    if (a->n_tile == 0)
        return TM_OK;
    TM_ASSERT(tm_k_attn_prefill_supported(a->head_dim) && a->n_tile <= 65535);
    TM_ASSERT(a->n_kv_head > 0 && a->n_head % a->n_kv_head == 0 && a->block_size > 0);
    TM_ASSERT(a->ld_q >= a->n_head * a->head_dim && a->ld_q % 8 == 0);
    TM_ASSERT(((uintptr_t)a->k_cache % 16) == 0 && ((uintptr_t)a->v_cache % 16) == 0);
    TM_ASSERT(((uintptr_t)a->q % 16) == 0 && ((uintptr_t)a->out % 16) == 0);
    const dim3 grid(a->n_head, a->n_tile);
    if (a->kv_fp8)
        return a->head_dim == 64 ? launch<64, true>(a, grid, s, err)
                                 : launch<128, true>(a, grid, s, err);
    return a->head_dim == 64 ? launch<64, false>(a, grid, s, err)
                             : launch<128, false>(a, grid, s, err);
}
