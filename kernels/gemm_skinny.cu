/* kernels/gemm_skinny.cu - decode-step projections on tensor cores (see gemm_skinny.h).
 *
 * A warp computes a 16 (output rows) x 8*NT (tokens) tile over its split of the inner
 * dimension with mma.sync m16n8k16 (A = 16 rows of w, B = the tokens' x, both bf16; fp32
 * accumulators). Lane l = 4r + c loads, for each chunk of 32 inner elements, the 16 bytes
 * [8c, 8c + 8) of w rows r and r + 8 and of x row (token) r (and r + 8 for the second tile).
 * Those registers are used as the mma fragments directly, with the inner index permuted: the
 * fragment's k = 2c, 2c+1 | 2c+8, 2c+9 of the first mma are the loaded elements 8c, 8c+1 |
 * 8c+2, 8c+3, and the second mma takes 8c+4 .. 8c+7. A and B are permuted the same way, so the
 * dot products are unchanged, and no shuffle or shared memory is needed: the kernel is a stream
 * of coalesced 16-byte loads feeding mma instructions. The weight loads are cp.async copies
 * into a per-warp ring of D shared-memory slots (D chunks = D KB per warp in flight; a register
 * version let the compiler sink the loads next to their use, leaving one or two in flight), with
 * the L2 fetching 256 bytes around each request (the next chunks of the same rows). x is small
 * and read through the read-only path. */
#include "kernels/common.cuh"
#include "kernels/gemm_skinny.h"

#define WARPS 4           /* warps per block */
#define TM_SKINNY_DEPTH 4 /* chunks in flight per warp (default; 8 measured slower) */

/* One chunk of 32 inner elements: rows r (lo) and r + 8 (hi) of w against NT token tiles. */
template <int NT>
static __device__ __forceinline__ void chunk_mma(float (&acc)[NT][4], const uint4 &lo,
                                                 const uint4 &hi, const uint4 (&xv)[NT]) {
    const uint32_t a0[4] = {lo.x, hi.x, lo.y, hi.y}, a1[4] = {lo.z, hi.z, lo.w, hi.w};
#pragma unroll
    for (int j = 0; j < NT; j++) {
        tm_mma_bf16(acc[j], a0, xv[j].x, xv[j].y);
        tm_mma_bf16(acc[j], a1, xv[j].z, xv[j].w);
    }
}

/* tm_cp_async16 with the L2 fetching the 256 bytes around the request (the next chunks of the
 * same rows); always 16 bytes. */
static __device__ __forceinline__ void cp_async16_l2pf(void *smem, const void *gmem) {
    const uint32_t sa = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;\n" ::"r"(sa), "l"(gmem)
                 : "memory");
}

/* D: chunks in flight per warp (the depth of its ring of shared-memory slots). */
template <int NT, int D>
static __global__ void __launch_bounds__(WARPS * 32) gemm_skinny_kernel(tm_k_gemm_skinny_args a) {
    // Per warp: D slots of one chunk (w rows r and r + 8 for every lane), [half][lane] so that a
    // lane's 16-byte reads of a slot are conflict-free.
    __shared__ uint4 ring[WARPS][D][2][32];
    const uint32_t lane = threadIdx.x & 31, wib = threadIdx.x / 32;
    const uint32_t gw = blockIdx.x * WARPS + wib;
    const uint32_t n_tiles = (a.n_out + 15) / 16;
    const uint32_t tile = gw % n_tiles, split = gw / n_tiles;
    if (split >= a.n_split)
        return; // a whole warp: the grid is rounded up to whole blocks
    const uint32_t r = lane >> 2, c = lane & 3;
    const uint32_t row_lo = tile * 16 + r, row_hi = row_lo + 8;
    const uint32_t k0 = split * a.k_per_split, k1 = min(a.n_in, k0 + a.k_per_split);
    // Rows past n_out (the last tile of a ragged n_out) read a valid row; never stored.
    const uint4 *wl = reinterpret_cast<const uint4 *>(
        a.w + (size_t)min(row_lo, a.n_out - 1) * a.n_in + k0 + 8 * c);
    const uint4 *wh = reinterpret_cast<const uint4 *>(
        a.w + (size_t)min(row_hi, a.n_out - 1) * a.n_in + k0 + 8 * c);
    const uint4 *xp[NT];
    bool xok[NT];
#pragma unroll
    for (int j = 0; j < NT; j++) {
        const uint32_t tok = r + 8 * j;
        xok[j] = tok < a.n_tok;
        xp[j] =
            reinterpret_cast<const uint4 *>(a.x + (size_t)(xok[j] ? tok : 0) * a.n_in + k0 + 8 * c);
    }
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++)
        acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;

    // One commit group per chunk (empty past the end), so that after the prologue's D groups and
    // i more, waiting until at most D - 1 are pending means chunk i has landed.
    uint4(*my)[2][32] = ring[wib];
    const uint32_t n_chunk = (k1 - k0) / 32; // a chunk is 4 uint4 of a row
#pragma unroll
    for (int p = 0; p < D; p++) {
        if ((uint32_t)p < n_chunk) {
            cp_async16_l2pf(&my[p][0][lane], wl + 4 * p);
            cp_async16_l2pf(&my[p][1][lane], wh + 4 * p);
        }
        tm_cp_async_commit();
    }
    const uint4 zero = make_uint4(0, 0, 0, 0);
    for (uint32_t i = 0; i < n_chunk; i++) {
        const uint32_t slot = i % D;
        uint4 xv[NT];
#pragma unroll
        for (int j = 0; j < NT; j++)
            xv[j] = xok[j] ? __ldg(xp[j] + 4 * i) : zero;
        tm_cp_async_wait<D - 1>();
        const uint4 lo = my[slot][0][lane], hi = my[slot][1][lane];
        chunk_mma<NT>(acc, lo, hi, xv);
        // The slot's values are consumed (the mma read the registers), so it can be refilled.
        if (i + D < n_chunk) {
            cp_async16_l2pf(&my[slot][0][lane], wl + 4 * (i + D));
            cp_async16_l2pf(&my[slot][1][lane], wh + 4 * (i + D));
        }
        tm_cp_async_commit();
    }
    tm_cp_async_wait<0>();

    // Accumulator fragment: (row r, tokens 2c, 2c+1) and (row r + 8, the same tokens).
    float *out = a.part + (size_t)split * a.n_tok * a.n_out;
#pragma unroll
    for (int j = 0; j < NT; j++) {
        const uint32_t t0 = 8 * j + 2 * c;
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const uint32_t t = t0 + e;
            if (t >= a.n_tok)
                continue;
            if (row_lo < a.n_out)
                out[(size_t)t * a.n_out + row_lo] = acc[j][e];
            if (row_hi < a.n_out)
                out[(size_t)t * a.n_out + row_hi] = acc[j][2 + e];
        }
    }
}

extern "C" int tm_k_gemm_skinny_fits(uint32_t n_tok, uint32_t n_in, uint32_t n_out) {
    return n_tok >= 1 && n_tok <= TM_SKINNY_MAX_TOK && n_in >= 32 && n_in % 32 == 0 && n_out >= 1;
}

extern "C" uint32_t tm_k_gemm_skinny_splits(uint32_t n_in, uint32_t n_out, uint32_t n_sm,
                                            uint32_t *k_per_split) {
    const uint64_t n_tiles = (n_out + 15) / 16;
    // 16 warps per SM (4 KB in flight each): on an H200 fewer, longer splits beat 32 or 64
    // warps per SM on every llama8b decode shape (the partials cost traffic too).
    const uint64_t want_warps = (uint64_t)TM_MAX(n_sm, 1u) * 16;
    uint64_t n_split = (want_warps + n_tiles - 1) / n_tiles;
    n_split = TM_MIN(n_split, (uint64_t)TM_MAX(n_in / 256, 1u));
    n_split = TM_MIN(n_split, (uint64_t)TM_SKINNY_MAX_SPLIT);
    n_split = TM_MAX(n_split, (uint64_t)1);
    uint32_t kps = (uint32_t)((n_in + n_split - 1) / n_split);
    kps = (kps + 31) / 32 * 32;
    *k_per_split = kps;
    return (n_in + kps - 1) / kps; // no empty split
}

extern "C" tm_rc tm_k_gemm_skinny(const tm_k_gemm_skinny_args *a, cudaStream_t s, tm_err *err) {
    if (a->n_tok == 0)
        return TM_OK;
    TM_ASSERT(tm_k_gemm_skinny_fits(a->n_tok, a->n_in, a->n_out));
    TM_ASSERT(a->n_split >= 1 && a->k_per_split % 32 == 0 && a->k_per_split > 0);
    TM_ASSERT((uint64_t)(a->n_split - 1) * a->k_per_split < a->n_in);
    TM_ASSERT((uint64_t)a->n_split * a->k_per_split >= a->n_in);
    TM_ASSERT(((uintptr_t)a->w % 16) == 0 && ((uintptr_t)a->x % 16) == 0 && a->part);
    const uint64_t n_warps = (uint64_t)((a->n_out + 15) / 16) * a->n_split;
    const unsigned grid = (unsigned)((n_warps + WARPS - 1) / WARPS);
    const uint32_t depth = a->unroll ? a->unroll : TM_SKINNY_DEPTH;
    if (a->n_tok <= 8 && depth >= 8)
        gemm_skinny_kernel<1, 8><<<grid, WARPS * 32, 0, s>>>(*a);
    else if (a->n_tok <= 8)
        gemm_skinny_kernel<1, 4><<<grid, WARPS * 32, 0, s>>>(*a);
    else if (depth >= 8)
        gemm_skinny_kernel<2, 8><<<grid, WARPS * 32, 0, s>>>(*a);
    else
        gemm_skinny_kernel<2, 4><<<grid, WARPS * 32, 0, s>>>(*a);
    return tm_cuda_launched(err, s, "gemm_skinny");
}

static __global__ void sum_parts_kernel(tm_k_sum_parts_args a) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < a.n;
         i += (size_t)gridDim.x * blockDim.x) {
        float v = a.beta != 0.0f ? a.y[i] : 0.0f;
        for (uint32_t p = 0; p < a.n_part; p++)
            v += a.part[p * a.stride + i];
        a.y[i] = v;
    }
}

extern "C" tm_rc tm_k_sum_parts(const tm_k_sum_parts_args *a, cudaStream_t s, tm_err *err) {
    if (a->n == 0)
        return TM_OK;
    TM_ASSERT(a->y && a->part && a->n_part >= 1 && (a->n_part == 1 || a->stride >= a->n));
    const size_t want = (a->n + 255) / 256;
    const unsigned grid = (unsigned)TM_MIN(want, (size_t)132 * 8);
    sum_parts_kernel<<<grid, 256, 0, s>>>(*a);
    return tm_cuda_launched(err, s, "sum_parts");
}
