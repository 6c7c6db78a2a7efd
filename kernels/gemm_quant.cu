/* kernels/gemm_quant.cu - decode-step projections over FP8 / MXFP4 weights (see gemm_quant.h).
 *
 * The layout of gemm_skinny.cu: a warp owns 16 output rows (r = lane / 4: rows r and r + 8) and
 * one split of the inner dimension, and streams it as chunks: per chunk each lane (c = lane % 4)
 * copies 16 bytes of row r and 16 of row r + 8 into its slot of a per-warp cp.async ring of D
 * chunks (D KB in flight per warp). An FP8 chunk is 64 inputs (lane c: inputs [16c, 16c + 16)),
 * an MXFP4 chunk 128 (lane c: [32c, 32c + 32), exactly one scale group). The lane turns its bytes
 * into bf16 pairs in registers and feeds them to mma.sync m16n8k16 as the A fragment directly,
 * with the inner index permuted: every k slot of an mma takes one of the lane's own inputs, and
 * the B fragment (the tokens' x, loaded by the same lane) is permuted the same way, so the dot
 * products are unchanged and no shuffle or shared-memory transpose is needed. The FP8 kernel
 * also copies the lane's x of each chunk into the ring (cp.async through the L1, one commit group
 * with the weights), so x waits with the weights D chunks ahead: loaded next to its use, x was
 * the FP8 kernel's top stall in Nsight Compute (half the warp stall samples on an H200); the same
 * change made no measurable difference to MXFP4 and is not used there.
 *
 * Dequantization (exact; the constants are powers of two):
 *   e4m3, integer path: a byte b placed as bf16 bits sign << 15 | (b & 0x7f) << 4 is the value
 *     times 2^-120 (subnormal e4m3 becomes subnormal bf16 with the same scaling), and one
 *     fma.rn.bf16x2 by 2^120 restores it. Bytes 1 and 3 of a word convert together, so a 32-bit
 *     word of inputs (v0, v1, v2, v3) gives the pairs (v0, v2) and (v1, v3); x is paired the same
 *     way with one byte-permute per pair.
 *   e4m3, cvt path: cvt.rn.f16x2.e4m3x2 (exact), then f16 -> bf16 by moving the bits (the f16 of
 *     an e4m3 value is normal with 3 mantissa bits) = value * 2^-112, then * 2^112. Natural pairs.
 *   e2m1: nibbles j and j + 4 of a word (16 bits apart) become one bf16 pair with the sign moved to
 *     bit 15 and the 3 magnitude bits to bits 6-8 (= value * 2^-126; e2m1_pairs_raw makes the four
 *     pairs of a word in 11 integer operations), then one bf16x2 multiply by 2^126 * the e8m0 scale
 *     = 2^(e-1) (exact; where a warp meets a scale above 2 = e 128, which 2^(e-1) cannot hold in
 *     bf16, the two multiplies by 2^126 and the scale). x is paired (x_j, x_j+4) by
 *     byte-permutes.
 * Scales are loaded D chunks ahead into registers (the main loop is unrolled by D so that the
 * slot and its scale register are compile-time), with volatile loads that the compiler keeps in
 * place: a scale that missed to DRAM would otherwise stall every chunk that starts a new sector. */
#include "kernels/common.cuh"
#include "kernels/gemm_quant.h"

#define WARPS 4 /* warps per block */
#define DEPTH_DEFAULT 4

/* ---- device helpers ---- */

/* cp.async of 16 bytes (n_src 0: nothing read, zeros written) with the L2 fetching the 256 bytes
 * around the request (the next chunks of the same row). */
static __device__ __forceinline__ void cp16_l2pf(void *smem, const void *gmem, uint32_t n_src) {
    const uint32_t sa = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(sa), "l"(gmem),
                 "r"(n_src)
                 : "memory");
}

/* cp.async of 16 bytes through the L1 (n_src 0: zeros written): the x rows, which every warp of
 * a split re-reads. */
static __device__ __forceinline__ void cp16_ca(void *smem, const void *gmem, uint32_t n_src) {
    const uint32_t sa = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;\n" ::"r"(sa), "l"(gmem), "r"(n_src)
                 : "memory");
}

/* ---- the weight stream (the pipeline all three kernels share) ----
 * A warp streams its chunks through a ring of D shared-memory slots filled by cp.async, one
 * commit group per chunk (an empty one past the end, so the count holds): the prologue issues
 * chunks 0 .. D-1; then chunk i, in slot i % D, is consumed once at most D - 1 groups are pending
 * (it has landed), and its slot is refilled with chunk i + D as soon as its values are in
 * registers. The slot loop is unrolled with the slot as a compile-time constant, so that per-slot
 * registers (the scales loaded with a chunk) stay registers. */

template <int P> struct ring_slot { static constexpr int p = P; };

/* f(ring_slot<P>{}), f(ring_slot<P + 1>{}), ... up to N - 1, while f returns true. */
template <int P, int N, class F> static __device__ __forceinline__ void each_slot(F &f) {
    if constexpr (P < N) {
        if (f(ring_slot<P>{}))
            each_slot<P + 1, N>(f);
    }
}

/* The stream of n_chunk chunks. issue(i, slot) starts chunk i's copies into slot (a ring_slot;
 * its p is the slot index) and loads its per-slot registers. body(i, slot, landed, refill)
 * consumes chunk i: landed() before it reads the slot, refill() once the slot's values are in
 * registers (it issues chunk i + D there and commits); it returns nothing. Ends with no copy
 * pending. */
template <int D, class Issue, class Body>
static __device__ __forceinline__ void ring_stream(uint32_t n_chunk, Issue &issue, Body &body) {
    auto prologue = [&](auto slot) {
        constexpr int p = decltype(slot)::p;
        if ((uint32_t)p < n_chunk)
            issue((uint32_t)p, slot);
        tm_cp_async_commit();
        return true;
    };
    each_slot<0, D>(prologue);
    for (uint32_t base = 0; base < n_chunk; base += D) { // hot loop: the weight stream
        auto step = [&](auto slot) {
            const uint32_t i = base + decltype(slot)::p;
            if (i >= n_chunk)
                return false;
            auto landed = [] { tm_cp_async_wait<D - 1>(); };
            auto refill = [&] {
                if (i + D < n_chunk)
                    issue(i + D, slot);
                tm_cp_async_commit();
            };
            body(i, slot, landed, refill);
            return true;
        };
        each_slot<0, D>(step);
    }
    tm_cp_async_wait<0>();
}

/* Warps per block of the FP8 MMA kernel: 4, or fewer where the per-warp ring (D slots of the
 * chunk's weights and x, (2 + 2 NT) x 512 bytes) would pass 48 KB of static shared memory. */
template <int NT, int D> struct fp8_cfg {
    static constexpr int SLOT = 2 + 2 * NT; // uint4 per lane in a slot: w lo, w hi, x halves
    static constexpr int WARP_BYTES = D * SLOT * 512;
    static constexpr int WPB = WARP_BYTES * 4 <= 48 * 1024   ? 4
                               : WARP_BYTES * 2 <= 48 * 1024 ? 2
                                                             : 1;
};

/* Read-only loads that stay where they are written (issued D chunks before their use). */
static __device__ __forceinline__ uint32_t ld_u8(const uint8_t *p) {
    uint32_t v;
    asm volatile("ld.global.nc.u8 %0, [%1];\n" : "=r"(v) : "l"(p));
    return v;
}
static __device__ __forceinline__ float ld_f32(const float *p) {
    float v;
    asm volatile("ld.global.nc.f32 %0, [%1];\n" : "=f"(v) : "l"(p));
    return v;
}

/* a * b on bf16 pairs (fma with -0, so that signed zeros survive); exact for the power-of-two
 * factors used here, subnormals included. */
static __device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
    uint32_t d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
    return d;
}

/* e8m0 byte -> 2^(e-127): as fp32, and as a pair of bf16 (both halves). 255 is NaN; 0 is the
 * subnormal 2^-127 in both. */
static __device__ __forceinline__ float e8m0_f32(uint32_t e) {
    return __uint_as_float(e == 0 ? 0x00400000u : e == 255 ? 0x7fc00000u : e << 23);
}
static __device__ __forceinline__ uint32_t e8m0_bf16x2(uint32_t e) {
    const uint32_t h = e == 0 ? 0x0040u : e == 255 ? 0x7fc0u : e << 7;
    return h | h << 16;
}

/* The e4m3 bytes 1 and 3 of t -> bf16 pair (byte 1 in the low half), exact. */
static __device__ __forceinline__ uint32_t e4m3_b13_bf16x2(uint32_t t) {
    const uint32_t raw = ((t & 0x7f007f00u) >> 4) | (t & 0x80008000u); // value * 2^-120
    return bf16x2_mul(raw, 0x7b807b80u);                               // * 2^120
}

/* e4m3_b13_bf16x2 with the final multiply by 2^120 replaced by one by f (the caller's 2^120 *
 * scale, or 2^120 alone): exact where value * f / 2^120 is a bf16. */
static __device__ __forceinline__ uint32_t e4m3_b13_bf16x2_by(uint32_t t, uint32_t f) {
    return bf16x2_mul(((t & 0x7f007f00u) >> 4) | (t & 0x80008000u), f);
}

/* Two e4m3 (low byte -> low half) -> bf16 pair through the hardware f16 conversion (exact: the
 * f16 moved to bf16 bits is value * 2^-112), times f / 2^112 (f = 2^112 gives the values). */
static __device__ __forceinline__ uint32_t e4m3x2_cvt_bf16x2_by(uint32_t w16, uint32_t f) {
    uint32_t h;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(h) : "h"((unsigned short)w16));
    return bf16x2_mul(((h >> 3) & 0x0fff0fffu) | (h & 0x80008000u), f);
}

/* 2^126 * 2^(e-127) = 2^(e-1) as a pair of bf16, for e <= 128 (e = 0: 2^-1) or 255 (NaN). */
static __device__ __forceinline__ uint32_t e8m0_fold_bf16x2(uint32_t e) {
    const uint32_t h = e == 255 ? 0x7fc0u : (e + 126) << 7;
    return h | h << 16;
}

/* Pair J (J = 0..3) of q: nibbles J (low half) and J + 4 (high half) -> bf16 pair times 2^-126
 * (sign to bit 15, magnitude bits e1 e0 m to bits 8 7 6), i.e. (q << (12 - 4J)) & 0x80008000 |
 * (q shifted by 6 - 4J) & 0x01c001c0, all four in 11 operations instead of 16-20: the words
 *   yA = q's bits, with bits 9, 13, 25, 29 taken from q << 6 (the signs of nibbles 0, 1, 4, 5
 *        moved 6 bits up: 9 bits above their magnitudes, as in a bf16 whose magnitude bits are
 *        8..6 and sign bit 15),
 *   yB = (q >> 6)'s bits, with bits 11, 15, 27, 31 taken from q (nibbles 2, 3, 6, 7: the
 *        magnitudes moved 6 bits down),
 * hold every nibble's sign 9 bits above its magnitude and no two nibbles of one group overlap;
 * pair J is then one shift of yA or yB and one mask (checked against the formula above on 5e7
 * random words). */
static __device__ __forceinline__ void e2m1_pairs_raw(uint32_t q, uint32_t (&pr)[4]) {
    const uint32_t m = 0x81c081c0u;
    const uint32_t ya = ((q << 6) & 0x22002200u) | (q & ~0x22002200u);
    const uint32_t yb = (q & 0x88008800u) | ((q >> 6) & ~0x88008800u);
    pr[0] = (ya << 6) & m;
    pr[1] = (ya << 2) & m;
    pr[2] = (yb << 4) & m;
    pr[3] = yb & m;
}

/* bf16 pair (lo, hi halves) -> two floats */
static __device__ __forceinline__ float bf_lo(uint32_t v) { return __uint_as_float(v << 16); }
static __device__ __forceinline__ float bf_hi(uint32_t v) {
    return __uint_as_float(v & 0xffff0000u);
}

/* ---- FP8 on tensor cores ---- */

/* How the FP8 MMA kernel scales: per channel (the final sums), per 128x128 block (each chunk's
 * fp32 partial), per 32x32 e8m0 block (the bf16 weights before the mma). */
enum fp8_mode { FP8_CHANNEL, FP8_BLOCK128, FP8_BLOCK32 };

/* NT token tiles, D chunks in flight, MODE: an fp8_mode, CVT: the hardware e4m3 conversion.
 * FP8_BLOCK32: lane c's 16 inputs of a chunk, [16c, 16c + 16) past its start (a multiple of 64),
 * lie in the 32-block (chunk start + 16c) / 32, and the tile's 16 rows in the 32-row block
 * tile / 2, so a lane needs one e8m0 byte per chunk; it folds 2^B * 2^(e-127) = 2^(e+B-127) into
 * the one multiply that ends the e4m3 conversion (one bf16 factor while e + B <= 254; where some
 * lane of the warp has a larger e, the two multiplies: by 2^B, then by the scale). */
template <int NT, int D, int MODE, bool CVT>
static __global__ void __launch_bounds__(fp8_cfg<NT, D>::WPB * 32)
    gemm_fp8_kernel(tm_k_gemm_fp8_args a) {
    constexpr bool BLOCK = MODE == FP8_BLOCK128, B32 = MODE == FP8_BLOCK32;
    constexpr uint32_t BIAS = CVT ? 112 : 120; // the e4m3 conversion's raw bf16 is value * 2^-B
    constexpr int WPB = fp8_cfg<NT, D>::WPB, SLOT = fp8_cfg<NT, D>::SLOT;
    // [warp][slot][w lo, w hi, x tile 0 halves, x tile 1 halves][lane]: conflict-free reads
    __shared__ uint4 ring[WPB][D][SLOT][32];
    const uint32_t lane = threadIdx.x & 31, wib = threadIdx.x / 32;
    const uint32_t gw = blockIdx.x * WPB + wib;
    const uint32_t n_tiles = (a.n_out + 15) / 16;
    const uint32_t tile = gw % n_tiles, split = gw / n_tiles;
    if (split >= a.n_split)
        return; // a whole warp: the grid is rounded up to whole blocks
    const uint32_t r = lane >> 2, c = lane & 3;
    const uint32_t row_lo = tile * 16 + r, row_hi = row_lo + 8;
    const uint32_t k0 = split * a.k_per_split, k1 = min(a.n_in, k0 + a.k_per_split);
    // Rows past n_out (the last tile of a ragged n_out) read a valid row; never stored.
    const uint8_t *wl = a.w + (size_t)min(row_lo, a.n_out - 1) * a.n_in;
    const uint8_t *wh = a.w + (size_t)min(row_hi, a.n_out - 1) * a.n_in;
    const uint16_t *xp[NT];
    uint32_t xn[NT]; // 16 where the lane's token exists, else 0 (zeros copied)
#pragma unroll
    for (int j = 0; j < NT; j++) {
        const uint32_t tok = r + 8 * j;
        xn[j] = tok < a.n_tok ? 16 : 0;
        xp[j] = a.x + (size_t)(tok < a.n_tok ? tok : 0) * a.n_in;
    }
    // The 16 rows of a tile lie in one 128-row block: one scale per chunk for the whole warp.
    const uint32_t n_kb = (a.n_in + 127) / 128;
    const size_t sb = (size_t)(tile * 16 / 128) * n_kb;
    const bool e8m0 = a.scale_kind == TM_K_FP8_BLOCK_E8M0;
    // Block32: the tile's row of 32-blocks (n_in is a multiple of 32).
    const uint8_t *s32 = (const uint8_t *)a.scale + (size_t)(tile / 2) * (a.n_in / 32);
    const uint32_t n_chunk = (k1 - k0 + 63) / 64;
    uint4(*my)[SLOT][32] = ring[wib];
    float sreg[D];    // the block scale of the chunk in each slot
    uint32_t ereg[D]; // block32: the lane's e8m0 byte of the chunk in each slot
    // Chunk i into slot p: the weights, the lane's 16 inputs of x for each token tile (through
    // the L1: x is read by every warp of the split), and the chunk's scale into sreg[p]; lanes
    // past k1 copy zeros.
    auto issue = [&](uint32_t i, auto slot) {
        constexpr int p = decltype(slot)::p;
        const uint32_t kq = k0 + 64 * i + 16 * c;
        const bool v = kq < k1;
        const uint32_t ko = v ? kq : 0;
        cp16_l2pf(&my[p][0][lane], wl + ko, v ? 16 : 0);
        cp16_l2pf(&my[p][1][lane], wh + ko, v ? 16 : 0);
#pragma unroll
        for (int j = 0; j < NT; j++) {
            cp16_ca(&my[p][2 + 2 * j][lane], xp[j] + ko, v ? xn[j] : 0);
            cp16_ca(&my[p][3 + 2 * j][lane], xp[j] + ko + 8, v ? xn[j] : 0);
        }
        if (BLOCK) {
            const size_t si = sb + ((k0 + 64 * i) >> 7);
            sreg[p] = e8m0 ? e8m0_f32(ld_u8((const uint8_t *)a.scale + si))
                           : ld_f32((const float *)a.scale + si);
        }
        if (B32)
            ereg[p] = v ? ld_u8(s32 + kq / 32) : 127; // past k1: zeros times 1
    };
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++)
        acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    auto body = [&](uint32_t i, auto slot, auto &landed, auto &refill) {
        constexpr int p = decltype(slot)::p;
        (void)i;
        landed();
        const uint4 lo = my[p][0][lane], hi = my[p][1][lane];
        uint32_t xw[NT][8];
#pragma unroll
        for (int j = 0; j < NT; j++) {
            const uint4 u0 = my[p][2 + 2 * j][lane], u1 = my[p][3 + 2 * j][lane];
            xw[j][0] = u0.x, xw[j][1] = u0.y, xw[j][2] = u0.z, xw[j][3] = u0.w;
            xw[j][4] = u1.x, xw[j][5] = u1.y, xw[j][6] = u1.z, xw[j][7] = u1.w;
        }
        const float s = BLOCK ? sreg[p] : 1.0f;
        // The factor ending the e4m3 conversion: 2^B, or for block32 2^B * the lane's scale
        // (two = the warp takes the two multiplies; f2 then is the scale alone).
        uint32_t f = CVT ? 0x77807780u : 0x7b807b80u, f2 = 0;
        bool two = false;
        if constexpr (B32) {
            const uint32_t e = ereg[p];
            two = __any_sync(0xffffffffu, e + BIAS > 254 && e != 255);
            const uint32_t h = e == 255 ? 0x7fc0u : (e + BIAS) << 7;
            if (two)
                f2 = e8m0_bf16x2(e);
            else
                f = h | h << 16;
        }
        refill(); // the slot's values are in registers
        const uint32_t wlo[4] = {lo.x, lo.y, lo.z, lo.w}, whi[4] = {hi.x, hi.y, hi.z, hi.w};
        float part[NT][4];
#pragma unroll
        for (int j = 0; j < NT; j++)
            part[j][0] = part[j][1] = part[j][2] = part[j][3] = 0.0f;
#pragma unroll
        for (int m = 0; m < 4; m++) { // mma m: the lane's inputs 4m .. 4m + 3
            uint32_t af[4];
            if (CVT) {
                af[0] = e4m3x2_cvt_bf16x2_by(wlo[m] & 0xffffu, f);
                af[1] = e4m3x2_cvt_bf16x2_by(whi[m] & 0xffffu, f);
                af[2] = e4m3x2_cvt_bf16x2_by(wlo[m] >> 16, f);
                af[3] = e4m3x2_cvt_bf16x2_by(whi[m] >> 16, f);
            } else {
                af[0] = e4m3_b13_bf16x2_by(wlo[m] << 8, f); // (v4m, v4m+2)
                af[1] = e4m3_b13_bf16x2_by(whi[m] << 8, f);
                af[2] = e4m3_b13_bf16x2_by(wlo[m], f); // (v4m+1, v4m+3)
                af[3] = e4m3_b13_bf16x2_by(whi[m], f);
            }
            if (B32 && two) {
#pragma unroll
                for (int q = 0; q < 4; q++)
                    af[q] = bf16x2_mul(af[q], f2);
            }
#pragma unroll
            for (int j = 0; j < NT; j++) {
                const uint32_t x0 = xw[j][2 * m], x1 = xw[j][2 * m + 1];
                // CVT: natural pairs; else (x4m, x4m+2) and (x4m+1, x4m+3)
                const uint32_t b0 = CVT ? x0 : __byte_perm(x0, x1, 0x5410);
                const uint32_t b1 = CVT ? x1 : __byte_perm(x0, x1, 0x7632);
                if constexpr (BLOCK)
                    tm_mma_bf16(part[j], af, b0, b1);
                else
                    tm_mma_bf16(acc[j], af, b0, b1);
            }
        }
        if (BLOCK) {
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    acc[j][e] = fmaf(s, part[j][e], acc[j][e]);
        }
    };
    ring_stream<D>(n_chunk, issue, body);

    // Accumulator fragment: (row r, tokens 2c, 2c+1) and (row r + 8, the same tokens).
    float s_lo = 1.0f, s_hi = 1.0f;
    if (MODE == FP8_CHANNEL) {
        s_lo = __ldg((const float *)a.scale + min(row_lo, a.n_out - 1));
        s_hi = __ldg((const float *)a.scale + min(row_hi, a.n_out - 1));
    }
    float *out = a.part + (size_t)split * a.n_tok * a.n_out;
#pragma unroll
    for (int j = 0; j < NT; j++) {
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const uint32_t t = 8 * j + 2 * c + e;
            if (t >= a.n_tok)
                continue;
            if (row_lo < a.n_out)
                out[(size_t)t * a.n_out + row_lo] = acc[j][e] * s_lo;
            if (row_hi < a.n_out)
                out[(size_t)t * a.n_out + row_hi] = acc[j][2 + e] * s_hi;
        }
    }
}

/* ---- FP8 on CUDA cores (fp32 FMA): the same weight stream; each lane keeps the partial dot
 * products of its 16 inputs of rows r and r + 8 for every token, and the 4 lanes of a row add
 * theirs at the end (fixed order). ---- */
template <int D, bool BLOCK>
static __global__ void __launch_bounds__(WARPS * 32) gemm_fp8_fma_kernel(tm_k_gemm_fp8_args a) {
    __shared__ uint4 ring[WARPS][D][2][32];
    const uint32_t lane = threadIdx.x & 31, wib = threadIdx.x / 32;
    const uint32_t gw = blockIdx.x * WARPS + wib;
    const uint32_t n_tiles = (a.n_out + 15) / 16;
    const uint32_t tile = gw % n_tiles, split = gw / n_tiles;
    if (split >= a.n_split)
        return;
    const uint32_t r = lane >> 2, c = lane & 3;
    const uint32_t row_lo = tile * 16 + r, row_hi = row_lo + 8;
    const uint32_t k0 = split * a.k_per_split, k1 = min(a.n_in, k0 + a.k_per_split);
    const uint8_t *wl = a.w + (size_t)min(row_lo, a.n_out - 1) * a.n_in;
    const uint8_t *wh = a.w + (size_t)min(row_hi, a.n_out - 1) * a.n_in;
    const uint32_t n_kb = (a.n_in + 127) / 128;
    const size_t sb = (size_t)(tile * 16 / 128) * n_kb;
    const bool e8m0 = a.scale_kind == TM_K_FP8_BLOCK_E8M0;
    // Block32 (BLOCK too): the lane's 16 inputs lie in one 32-block, its rows in block tile / 2;
    // the lane's partial dot products take its own scale.
    const bool b32 = a.scale_kind == TM_K_FP8_BLOCK32_E8M0;
    const uint8_t *s32 = (const uint8_t *)a.scale + (size_t)(tile / 2) * (a.n_in / 32);
    const uint32_t n_chunk = (k1 - k0 + 63) / 64;
    uint4(*my)[2][32] = ring[wib];
    float sreg[D];
    auto issue = [&](uint32_t i, auto slot) {
        constexpr int p = decltype(slot)::p;
        const uint32_t kq = k0 + 64 * i + 16 * c;
        const bool v = kq < k1;
        cp16_l2pf(&my[p][0][lane], wl + (v ? kq : 0), v ? 16 : 0);
        cp16_l2pf(&my[p][1][lane], wh + (v ? kq : 0), v ? 16 : 0);
        if (BLOCK && b32) {
            sreg[p] = v ? e8m0_f32(ld_u8(s32 + kq / 32)) : 0.0f;
        } else if (BLOCK) {
            const size_t si = sb + ((k0 + 64 * i) >> 7);
            sreg[p] = e8m0 ? e8m0_f32(ld_u8((const uint8_t *)a.scale + si))
                           : ld_f32((const float *)a.scale + si);
        }
    };
    float acc_lo[TM_QUANT_MAX_TOK], acc_hi[TM_QUANT_MAX_TOK];
#pragma unroll
    for (int t = 0; t < TM_QUANT_MAX_TOK; t++)
        acc_lo[t] = acc_hi[t] = 0.0f;
    auto body = [&](uint32_t i, auto slot, auto &landed, auto &refill) {
        constexpr int p = decltype(slot)::p;
        const uint32_t kq = k0 + 64 * i + 16 * c;
        const bool lv = kq < k1;
        landed();
        const uint4 lo = my[p][0][lane], hi = my[p][1][lane];
        const float s = BLOCK ? sreg[p] : 1.0f;
        refill();
        if (!lv)
            return; // zeros
        const uint32_t wlo[4] = {lo.x, lo.y, lo.z, lo.w}, whi[4] = {hi.x, hi.y, hi.z, hi.w};
        float fl[16], fh[16];
#pragma unroll
        for (int m = 0; m < 4; m++) {
            const uint32_t l02 = e4m3_b13_bf16x2(wlo[m] << 8), l13 = e4m3_b13_bf16x2(wlo[m]);
            const uint32_t h02 = e4m3_b13_bf16x2(whi[m] << 8), h13 = e4m3_b13_bf16x2(whi[m]);
            fl[4 * m] = bf_lo(l02), fl[4 * m + 2] = bf_hi(l02);
            fl[4 * m + 1] = bf_lo(l13), fl[4 * m + 3] = bf_hi(l13);
            fh[4 * m] = bf_lo(h02), fh[4 * m + 2] = bf_hi(h02);
            fh[4 * m + 1] = bf_lo(h13), fh[4 * m + 3] = bf_hi(h13);
        }
#pragma unroll
        for (int t = 0; t < TM_QUANT_MAX_TOK; t++) {
            if ((uint32_t)t >= a.n_tok)
                break;
            const uint4 *xq = reinterpret_cast<const uint4 *>(a.x + (size_t)t * a.n_in + kq);
            const uint4 u0 = __ldg(xq), u1 = __ldg(xq + 1);
            const uint32_t xw[8] = {u0.x, u0.y, u0.z, u0.w, u1.x, u1.y, u1.z, u1.w};
            float dl = 0.0f, dh = 0.0f;
#pragma unroll
            for (int q = 0; q < 8; q++) {
                const float xa = bf_lo(xw[q]), xb = bf_hi(xw[q]);
                dl = fmaf(fl[2 * q], xa, dl);
                dl = fmaf(fl[2 * q + 1], xb, dl);
                dh = fmaf(fh[2 * q], xa, dh);
                dh = fmaf(fh[2 * q + 1], xb, dh);
            }
            acc_lo[t] = fmaf(s, dl, acc_lo[t]);
            acc_hi[t] = fmaf(s, dh, acc_hi[t]);
        }
    };
    ring_stream<D>(n_chunk, issue, body);
    float s_lo = 1.0f, s_hi = 1.0f;
    if (!BLOCK) {
        s_lo = __ldg((const float *)a.scale + min(row_lo, a.n_out - 1));
        s_hi = __ldg((const float *)a.scale + min(row_hi, a.n_out - 1));
    }
    float *out = a.part + (size_t)split * a.n_tok * a.n_out;
#pragma unroll
    for (int t = 0; t < TM_QUANT_MAX_TOK; t++) {
        // (lane c's sum + c^1's) + (the other pair's): the same order in all 4 lanes
        float vl = acc_lo[t], vh = acc_hi[t];
        vl += __shfl_xor_sync(0xffffffffu, vl, 1);
        vh += __shfl_xor_sync(0xffffffffu, vh, 1);
        vl += __shfl_xor_sync(0xffffffffu, vl, 2);
        vh += __shfl_xor_sync(0xffffffffu, vh, 2);
        if ((uint32_t)t >= a.n_tok || (uint32_t)(t & 3) != c)
            continue;
        if (row_lo < a.n_out)
            out[(size_t)t * a.n_out + row_lo] = vl * s_lo;
        if (row_hi < a.n_out)
            out[(size_t)t * a.n_out + row_hi] = vh * s_hi;
    }
}

/* ---- MXFP4, dense (MOE false: one "expert", pairs = tokens 0..n_pair-1) and grouped ---- */

/* MoE: finds this block's expert (the blockIdx.y-th distinct id, in increasing id) and its pairs
 * in pair order into s_list; returns the expert id or -1 (no such slot). Every thread calls it. */
static __device__ int32_t moe_slot(const tm_k_moe_mxfp4_args &a, uint32_t *s_bm, int32_t *s_pe,
                                   uint32_t *s_list, int32_t *s_e, uint32_t *s_cnt) {
    const uint32_t tid = threadIdx.x, lane = tid & 31;
    const uint32_t nw = (a.n_expert + 31) / 32;
    for (uint32_t i = tid; i < nw; i += WARPS * 32)
        s_bm[i] = 0;
    __syncthreads();
    for (uint32_t p = tid; p < a.n_pair; p += WARPS * 32) {
        const int32_t e = a.pair_expert[p];
        s_pe[p] = e;
        if ((uint32_t)e < a.n_expert)
            atomicOr(&s_bm[(uint32_t)e >> 5], 1u << ((uint32_t)e & 31));
    }
    __syncthreads();
    if (tid < 32) {
        const uint32_t want = blockIdx.y;
        uint32_t before = 0;
        int32_t found = -1;
        for (uint32_t w0 = 0; w0 < nw; w0 += 32) {
            const uint32_t wi = w0 + lane;
            uint32_t bits = wi < nw ? s_bm[wi] : 0;
            const uint32_t n = __popc(bits);
            uint32_t inc = n; // inclusive prefix count over the lanes
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const uint32_t v = __shfl_up_sync(0xffffffffu, inc, o);
                if (lane >= (uint32_t)o)
                    inc += v;
            }
            const uint32_t excl = before + inc - n;
            const bool mine = want >= excl && want < excl + n;
            const uint32_t bal = __ballot_sync(0xffffffffu, mine);
            if (bal) {
                int32_t e = -1;
                if (mine) {
                    for (uint32_t k = want - excl; k > 0; k--)
                        bits &= bits - 1; // drop the lowest set bits
                    e = (int32_t)(wi * 32 + (uint32_t)(__ffs(bits) - 1));
                }
                found = __shfl_sync(0xffffffffu, e, __ffs(bal) - 1);
                break;
            }
            before += __shfl_sync(0xffffffffu, inc, 31);
        }
        uint32_t cnt = 0;
        if (found >= 0) // the pairs of expert found, in pair order
            for (uint32_t p0 = 0; p0 < a.n_pair; p0 += 32) {
                const uint32_t p = p0 + lane;
                const bool hit = p < a.n_pair && s_pe[p] == found;
                const uint32_t bal = __ballot_sync(0xffffffffu, hit);
                if (hit)
                    s_list[cnt + __popc(bal & ((1u << lane) - 1))] = p;
                cnt += __popc(bal);
            }
        if (lane == 0)
            *s_e = found, *s_cnt = cnt;
    }
    __syncthreads();
    return *s_e;
}

template <int NT, int D, bool MOE>
static __global__ void __launch_bounds__(WARPS * 32) gemm_mxfp4_kernel(tm_k_moe_mxfp4_args a) {
    __shared__ uint4 ring[WARPS][D][2][32];
    uint32_t cnt = a.n_pair, expert = 0;
    const uint32_t *list = nullptr;
    if constexpr (MOE) {
        __shared__ uint32_t s_bm[TM_MOE_MAX_EXPERT / 32];
        __shared__ int32_t s_pe[TM_MOE_MAX_PAIRS];
        __shared__ uint32_t s_list[TM_MOE_MAX_PAIRS];
        __shared__ int32_t s_e;
        __shared__ uint32_t s_cnt;
        const int32_t e = moe_slot(a, s_bm, s_pe, s_list, &s_e, &s_cnt);
        if (e < 0)
            return; // the whole block: fewer distinct experts than slots
        expert = (uint32_t)e, cnt = s_cnt, list = s_list;
    }
    const uint32_t lane = threadIdx.x & 31, wib = threadIdx.x / 32;
    const uint32_t gw = blockIdx.x * WARPS + wib;
    const uint32_t n_tiles = (a.n_out + 15) / 16;
    const uint32_t tile = gw % n_tiles, split = gw / n_tiles;
    if (split >= a.n_split)
        return;
    const uint32_t r = lane >> 2, c = lane & 3;
    const uint32_t row_lo = tile * 16 + r, row_hi = row_lo + 8;
    const uint32_t k0 = split * a.k_per_split, k1 = min(a.n_in, k0 + a.k_per_split);
    const size_t row_bytes = a.n_in / 2, n_grp = a.n_in / 32;
    const uint8_t *w_e = a.w + (size_t)expert * a.n_out * row_bytes;
    const uint8_t *sc_e = a.scale + (size_t)expert * a.n_out * n_grp;
    const uint32_t rl = min(row_lo, a.n_out - 1), rh = min(row_hi, a.n_out - 1);
    const uint8_t *wl = w_e + rl * row_bytes, *wh = w_e + rh * row_bytes;
    const uint8_t *sl = sc_e + rl * n_grp, *sh = sc_e + rh * n_grp;
    const uint32_t n_chunk = (k1 - k0 + 127) / 128;
    uint4(*my)[2][32] = ring[wib];
    constexpr int F = TM_MXFP4_EVEN_LOW ? 0 : 1; // nibble j holds input j ^ F
    float *out = a.part + (size_t)split * a.n_pair * a.n_out;
    const uint4 zero = make_uint4(0, 0, 0, 0);

    for (uint32_t g0 = 0; g0 < cnt; g0 += 8 * NT) { // passes of up to 8 NT pairs
        const uint16_t *xp[NT];
        bool xok[NT];
#pragma unroll
        for (int j = 0; j < NT; j++) {
            const uint32_t t = g0 + r + 8 * j;
            xok[j] = t < cnt;
            const uint32_t xrow = !xok[j] ? 0 : MOE ? __ldg(a.pair_row + list[t]) : t;
            xp[j] = a.x + (size_t)xrow * a.n_in;
        }
        uint32_t slo[D], shi[D]; // the e8m0 bytes of the chunk in each slot, rows lo and hi
        // Chunk i into slot p; lanes past k1 copy zeros (and get scale 0 at use).
        auto issue = [&](uint32_t i, auto slot) {
            constexpr int p = decltype(slot)::p;
            const uint32_t kq = k0 + 128 * i + 32 * c;
            const bool v = kq < k1;
            cp16_l2pf(&my[p][0][lane], wl + (v ? kq / 2 : 0), v ? 16 : 0);
            cp16_l2pf(&my[p][1][lane], wh + (v ? kq / 2 : 0), v ? 16 : 0);
            slo[p] = v ? ld_u8(sl + kq / 32) : 0;
            shi[p] = v ? ld_u8(sh + kq / 32) : 0;
        };
        float acc[NT][4];
#pragma unroll
        for (int j = 0; j < NT; j++)
            acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
        auto body = [&](uint32_t i, auto slot, auto &landed, auto &refill) {
            constexpr int p = decltype(slot)::p;
            const uint32_t kq = k0 + 128 * i + 32 * c;
            const bool lv = kq < k1;
            uint4 xv[NT][4]; // the lane's 32 inputs of each token tile
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int q = 0; q < 4; q++)
                    xv[j][q] = xok[j] && lv ? __ldg(reinterpret_cast<const uint4 *>(xp[j] + kq) + q)
                                            : zero;
            landed();
            const uint4 lo = my[p][0][lane], hi = my[p][1][lane];
            // One multiply per pair: the raw pair (value * 2^-126) times 2^126 * scale =
            // 2^(e-1), a bf16 for e <= 128 (and NaN for e = 255); where some lane of the warp
            // has a larger scale (e in 129..254), the two multiplies of the definition.
            const uint32_t elo = slo[p], ehi = shi[p];
            const bool big = (elo > 128 && elo < 255) || (ehi > 128 && ehi < 255);
            const bool two = __any_sync(0xffffffffu, big);
            const uint32_t flo = !lv ? 0u : two ? e8m0_bf16x2(elo) : e8m0_fold_bf16x2(elo);
            const uint32_t fhi = !lv ? 0u : two ? e8m0_bf16x2(ehi) : e8m0_fold_bf16x2(ehi);
            refill();
            const uint32_t wlo[4] = {lo.x, lo.y, lo.z, lo.w};
            const uint32_t whi[4] = {hi.x, hi.y, hi.z, hi.w};
#pragma unroll
            for (int q = 0; q < 4; q++) { // the lane's inputs 8q .. 8q + 7
                uint32_t pl[4], ph[4];
                e2m1_pairs_raw(wlo[q], pl);
                e2m1_pairs_raw(whi[q], ph);
                if (two) {
                    const uint32_t bias = 0x7e807e80u; // 2^126
#pragma unroll
                    for (int k = 0; k < 4; k++) {
                        pl[k] = bf16x2_mul(bf16x2_mul(pl[k], bias), flo);
                        ph[k] = bf16x2_mul(bf16x2_mul(ph[k], bias), fhi);
                    }
                } else {
#pragma unroll
                    for (int k = 0; k < 4; k++) {
                        pl[k] = bf16x2_mul(pl[k], flo);
                        ph[k] = bf16x2_mul(ph[k], fhi);
                    }
                }
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    // mma (q, h): inputs (2h, 2h+4) in k slots 2c, 2c+1 and (2h+1, 2h+5) in
                    // 2c+8, 2c+9
                    const uint32_t af[4] = {pl[(2 * h) ^ F], ph[(2 * h) ^ F], pl[(2 * h + 1) ^ F],
                                            ph[(2 * h + 1) ^ F]};
#pragma unroll
                    for (int j = 0; j < NT; j++) {
                        const uint32_t xa = h ? xv[j][q].y : xv[j][q].x; // (x2h, x2h+1)
                        const uint32_t xb = h ? xv[j][q].w : xv[j][q].z; // (x2h+4, x2h+5)
                        tm_mma_bf16(acc[j], af, __byte_perm(xa, xb, 0x5410),
                                    __byte_perm(xa, xb, 0x7632));
                    }
                }
            }
        };
        ring_stream<D>(n_chunk, issue, body);
#pragma unroll
        for (int j = 0; j < NT; j++) {
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const uint32_t t = g0 + 8 * j + 2 * c + e;
                if (t >= cnt)
                    continue;
                const uint32_t orow = MOE ? list[t] : t;
                if (row_lo < a.n_out)
                    out[(size_t)orow * a.n_out + row_lo] = acc[j][e];
                if (row_hi < a.n_out)
                    out[(size_t)orow * a.n_out + row_hi] = acc[j][2 + e];
            }
        }
    }
}

/* ---- planners and launchers ---- */

/* About 12 warps per SM (the split count rounded to the nearest), at least min_k inputs per split,
 * a multiple of chunk_k; where the tiles alone give that many warps, n_in / long_k splits if
 * long_k (else one). Measured on an H200 (8 tokens, llama8b shapes, splits 1..16 tried): FP8 qkv
 * 4, o 6, down 6 splits were the fastest, and gate|up (1792 tiles) 3-4 (many short warps
 * balance the SMs over several waves; 1 or 2 splits were 7-10% slower); MXFP4 qkv / o 4, down
 * 4-8 (9 was 12% slower); the MoE GEMM (thousands of tiles) is fastest unsplit. The bf16 planner
 * (16 warps per SM) gave the quantized kernels too many splits on the narrow shapes. */
static uint32_t plan_splits(uint32_t n_in, uint32_t n_rows, uint32_t n_sm, uint32_t chunk_k,
                            uint32_t min_k, uint32_t long_k, uint32_t *k_per_split) {
    const uint64_t n_tiles = (TM_MAX(n_rows, 1u) + 15) / 16;
    const uint64_t want_warps = (uint64_t)TM_MAX(n_sm, 1u) * 12;
    uint64_t n_split = (want_warps + n_tiles / 2) / n_tiles;
    if (n_split <= 1)
        n_split = long_k ? n_in / long_k : 1;
    n_split = TM_MIN(n_split, (uint64_t)TM_MAX(n_in / min_k, 1u));
    n_split = TM_MIN(n_split, (uint64_t)TM_QUANT_MAX_SPLIT);
    n_split = TM_MAX(n_split, (uint64_t)1);
    uint32_t kps = (uint32_t)((n_in + n_split - 1) / n_split);
    kps = (kps + chunk_k - 1) / chunk_k * chunk_k;
    *k_per_split = kps;
    return (n_in + kps - 1) / kps; // no empty split
}

extern "C" int tm_k_gemm_fp8_fits(uint32_t n_tok, uint32_t n_in, uint32_t n_out) {
    return n_tok >= 1 && n_tok <= TM_QUANT_MAX_TOK && n_in >= 16 && n_in % 16 == 0 && n_out >= 1;
}

extern "C" int tm_k_gemm_fp8_kind_fits(tm_k_fp8_scale kind, uint32_t n_tok, uint32_t n_in,
                                       uint32_t n_out) {
    return tm_k_gemm_fp8_fits(n_tok, n_in, n_out) &&
           (kind != TM_K_FP8_BLOCK32_E8M0 || n_in % 32 == 0);
}

extern "C" int tm_k_gemm_mxfp4_fits(uint32_t n_tok, uint32_t n_in, uint32_t n_out) {
    return n_tok >= 1 && n_tok <= TM_QUANT_MAX_TOK && n_in >= 32 && n_in % 32 == 0 && n_out >= 1;
}

extern "C" uint32_t tm_k_gemm_fp8_splits(uint32_t n_in, uint32_t n_rows, uint32_t n_sm,
                                         uint32_t *k_per_split) {
    return plan_splits(n_in, n_rows, n_sm, 64, 512, 1024, k_per_split);
}

extern "C" uint32_t tm_k_gemm_mxfp4_splits(uint32_t n_in, uint32_t n_rows, uint32_t n_sm,
                                           uint32_t *k_per_split) {
    return plan_splits(n_in, n_rows, n_sm, 128, 1024, 0, k_per_split);
}

template <int NT, int D>
static void launch_fp8(const tm_k_gemm_fp8_args *a, uint64_t n_warps, cudaStream_t s) {
    constexpr int W = fp8_cfg<NT, D>::WPB;
    const unsigned grid = (unsigned)((n_warps + W - 1) / W);
    const bool cvt = a->variant == TM_K_QUANT_MMA_CVT;
    if (a->scale_kind == TM_K_FP8_CHANNEL) {
        if (cvt)
            gemm_fp8_kernel<NT, D, FP8_CHANNEL, true><<<grid, W * 32, 0, s>>>(*a);
        else
            gemm_fp8_kernel<NT, D, FP8_CHANNEL, false><<<grid, W * 32, 0, s>>>(*a);
    } else if (a->scale_kind == TM_K_FP8_BLOCK32_E8M0) {
        if (cvt)
            gemm_fp8_kernel<NT, D, FP8_BLOCK32, true><<<grid, W * 32, 0, s>>>(*a);
        else
            gemm_fp8_kernel<NT, D, FP8_BLOCK32, false><<<grid, W * 32, 0, s>>>(*a);
    } else if (cvt) {
        gemm_fp8_kernel<NT, D, FP8_BLOCK128, true><<<grid, W * 32, 0, s>>>(*a);
    } else {
        gemm_fp8_kernel<NT, D, FP8_BLOCK128, false><<<grid, W * 32, 0, s>>>(*a);
    }
}

extern "C" tm_rc tm_k_gemm_fp8(const tm_k_gemm_fp8_args *a, cudaStream_t s, tm_err *err) {
    if (a->n_tok == 0)
        return TM_OK;
    TM_ASSERT(tm_k_gemm_fp8_kind_fits(a->scale_kind, a->n_tok, a->n_in, a->n_out));
    TM_ASSERT(a->n_split >= 1 && a->k_per_split % 64 == 0 && a->k_per_split > 0);
    TM_ASSERT((uint64_t)(a->n_split - 1) * a->k_per_split < a->n_in);
    TM_ASSERT((uint64_t)a->n_split * a->k_per_split >= a->n_in);
    TM_ASSERT(((uintptr_t)a->w % 16) == 0 && ((uintptr_t)a->x % 16) == 0 && a->part && a->scale);
    TM_ASSERT(a->scale_kind == TM_K_FP8_BLOCK_F32 || a->scale_kind == TM_K_FP8_BLOCK_E8M0 ||
              a->scale_kind == TM_K_FP8_CHANNEL || a->scale_kind == TM_K_FP8_BLOCK32_E8M0);
    TM_ASSERT(a->scale_kind == TM_K_FP8_BLOCK_E8M0 || a->scale_kind == TM_K_FP8_BLOCK32_E8M0 ||
              ((uintptr_t)a->scale % 4) == 0);
    TM_ASSERT(a->variant == TM_K_QUANT_DEFAULT || a->variant == TM_K_QUANT_MMA ||
              a->variant == TM_K_QUANT_MMA_CVT || a->variant == TM_K_QUANT_FMA);
    TM_ASSERT(a->depth == 0 || a->depth == 4 || a->depth == 8);
    const uint64_t n_warps = (uint64_t)((a->n_out + 15) / 16) * a->n_split;
    const unsigned grid = (unsigned)((n_warps + WARPS - 1) / WARPS);
    const uint32_t depth = a->depth ? a->depth : DEPTH_DEFAULT;
    if (a->variant == TM_K_QUANT_FMA) {
        if (a->scale_kind == TM_K_FP8_CHANNEL)
            gemm_fp8_fma_kernel<4, false><<<grid, WARPS * 32, 0, s>>>(*a);
        else
            gemm_fp8_fma_kernel<4, true><<<grid, WARPS * 32, 0, s>>>(*a);
    } else if (a->n_tok <= 8 && depth >= 8) {
        launch_fp8<1, 8>(a, n_warps, s);
    } else if (a->n_tok <= 8) {
        launch_fp8<1, 4>(a, n_warps, s);
    } else if (depth >= 8) {
        launch_fp8<2, 8>(a, n_warps, s);
    } else {
        launch_fp8<2, 4>(a, n_warps, s);
    }
    return tm_cuda_launched(err, s, "gemm_fp8");
}

template <bool MOE>
static void launch_mxfp4(const tm_k_moe_mxfp4_args *a, uint32_t nt, uint32_t depth, dim3 grid,
                         cudaStream_t s) {
    if (nt == 1 && depth >= 8)
        gemm_mxfp4_kernel<1, 8, MOE><<<grid, WARPS * 32, 0, s>>>(*a);
    else if (nt == 1)
        gemm_mxfp4_kernel<1, 4, MOE><<<grid, WARPS * 32, 0, s>>>(*a);
    else if (depth >= 8)
        gemm_mxfp4_kernel<2, 8, MOE><<<grid, WARPS * 32, 0, s>>>(*a);
    else
        gemm_mxfp4_kernel<2, 4, MOE><<<grid, WARPS * 32, 0, s>>>(*a);
}

static void check_mxfp4_split(uint32_t n_in, uint32_t n_split, uint32_t kps) {
    TM_ASSERT(n_split >= 1 && kps % 128 == 0 && kps > 0);
    TM_ASSERT((uint64_t)(n_split - 1) * kps < n_in);
    TM_ASSERT((uint64_t)n_split * kps >= n_in);
}

extern "C" tm_rc tm_k_gemm_mxfp4(const tm_k_gemm_mxfp4_args *a, cudaStream_t s, tm_err *err) {
    if (a->n_tok == 0)
        return TM_OK;
    TM_ASSERT(tm_k_gemm_mxfp4_fits(a->n_tok, a->n_in, a->n_out));
    check_mxfp4_split(a->n_in, a->n_split, a->k_per_split);
    TM_ASSERT(((uintptr_t)a->w % 16) == 0 && ((uintptr_t)a->x % 16) == 0 && a->part && a->scale);
    TM_ASSERT(a->depth == 0 || a->depth == 4 || a->depth == 8);
    tm_k_moe_mxfp4_args m = {}; // one expert whose pairs are the tokens
    m.part = a->part, m.w = a->w, m.scale = a->scale, m.x = a->x;
    m.n_pair = a->n_tok, m.n_expert = 1, m.max_pair_per_expert = a->n_tok;
    m.n_in = a->n_in, m.n_out = a->n_out, m.n_split = a->n_split, m.k_per_split = a->k_per_split;
    m.depth = a->depth;
    const uint64_t n_warps = (uint64_t)((a->n_out + 15) / 16) * a->n_split;
    const dim3 grid((unsigned)((n_warps + WARPS - 1) / WARPS), 1, 1);
    launch_mxfp4<false>(&m, a->n_tok <= 8 ? 1 : 2, a->depth ? a->depth : DEPTH_DEFAULT, grid, s);
    return tm_cuda_launched(err, s, "gemm_mxfp4");
}

extern "C" tm_rc tm_k_moe_mxfp4(const tm_k_moe_mxfp4_args *a, cudaStream_t s, tm_err *err) {
    if (a->n_pair == 0)
        return TM_OK;
    TM_ASSERT(a->n_pair <= TM_MOE_MAX_PAIRS && a->n_expert >= 1 &&
              a->n_expert <= TM_MOE_MAX_EXPERT);
    TM_ASSERT(a->n_in >= 32 && a->n_in % 32 == 0 && a->n_out >= 1);
    check_mxfp4_split(a->n_in, a->n_split, a->k_per_split);
    TM_ASSERT(((uintptr_t)a->w % 16) == 0 && ((uintptr_t)a->x % 16) == 0 && a->part && a->scale);
    TM_ASSERT(a->pair_expert && a->pair_row);
    TM_ASSERT(a->depth == 0 || a->depth == 4 || a->depth == 8);
    const uint64_t n_warps = (uint64_t)((a->n_out + 15) / 16) * a->n_split;
    const uint32_t n_slot = TM_MIN(a->n_pair, a->n_expert);
    const dim3 grid((unsigned)((n_warps + WARPS - 1) / WARPS), n_slot, 1);
    TM_ASSERT(n_warps <= (uint64_t)WARPS * 0x7fffffffu && n_slot <= 65535);
    launch_mxfp4<true>(a, a->max_pair_per_expert > 8 ? 2 : 1, a->depth ? a->depth : DEPTH_DEFAULT,
                       grid, s);
    return tm_cuda_launched(err, s, "moe_mxfp4");
}
