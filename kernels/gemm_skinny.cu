/* kernels/gemm_skinny.cu - decode-step projections on tensor cores (see gemm_skinny.h; the
 * scheme and the shared device code in kernels/gemm_skinny.cuh). */
#include "kernels/gemm_skinny.cuh"

#define WARPS 4 /* warps per block */
#define TM_SKINNY_DEPTH 4 /* chunks in flight per warp (default; 8 measured slower) */

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
        xp[j] = reinterpret_cast<const uint4 *>(a.x + (size_t)(xok[j] ? tok : 0) * a.n_in + k0 +
                                                8 * c);
    }
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++)
        acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;

    // One commit group per chunk (empty past the end), so that after the prologue's D groups and
    // i more, waiting until at most D - 1 are pending means chunk i has landed.
    uint4(*my)[2][32] = ring[wib];
    const uint32_t n_chunk = (k1 - k0) / 32; // a chunk is 4 uint4 of a row
    const uint32_t rot = a.stagger ? tm_skinny_rot(tile, split, n_chunk) : 0;
#pragma unroll
    for (int p = 0; p < D; p++) {
        if ((uint32_t)p < n_chunk) {
            const uint32_t at = tm_skinny_chunk_at(p, rot, n_chunk);
            tm_skinny_cp_async16(&my[p][0][lane], wl + 4 * at);
            tm_skinny_cp_async16(&my[p][1][lane], wh + 4 * at);
        }
        tm_cp_async_commit();
    }
    const uint4 zero = make_uint4(0, 0, 0, 0);
    for (uint32_t i = 0; i < n_chunk; i++) {
        const uint32_t slot = i % D;
        uint4 xv[NT];
        const uint32_t at = tm_skinny_chunk_at(i, rot, n_chunk);
#pragma unroll
        for (int j = 0; j < NT; j++)
            xv[j] = xok[j] ? __ldg(xp[j] + 4 * at) : zero;
        tm_cp_async_wait<D - 1>();
        const uint4 lo = my[slot][0][lane], hi = my[slot][1][lane];
        tm_skinny_chunk_mma<NT>(acc, lo, hi, xv);
        // The slot's values are consumed (the mma read the registers), so it can be refilled.
        if (i + D < n_chunk) {
            const uint32_t nx = tm_skinny_chunk_at(i + D, rot, n_chunk);
            tm_skinny_cp_async16(&my[slot][0][lane], wl + 4 * nx);
            tm_skinny_cp_async16(&my[slot][1][lane], wh + 4 * nx);
        }
        tm_cp_async_commit();
    }
    tm_cp_async_wait<0>();

    tm_skinny_store<NT>(acc, a, split, row_lo, c);
}

extern "C" int tm_k_gemm_skinny_fits(uint32_t n_tok, uint32_t n_in, uint32_t n_out) {
    return n_tok >= 1 && n_tok <= TM_SKINNY_MAX_TOK && n_in >= 32 && n_in % 32 == 0 &&
           n_out >= 1;
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
