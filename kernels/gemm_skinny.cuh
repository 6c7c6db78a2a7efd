/* kernels/gemm_skinny.cuh - the skinny projection's device code (kernels/gemm_skinny.h), shared
 * by its own kernel and the decode chain (kernels/chain.h).
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
#ifndef TM_KERNELS_GEMM_SKINNY_CUH
#define TM_KERNELS_GEMM_SKINNY_CUH

#include "kernels/common.cuh"
#include "kernels/gemm_skinny.h"

static __device__ __forceinline__ void tm_skinny_mma(float (&d)[4], uint32_t a0, uint32_t a1,
                                                uint32_t a2, uint32_t a3, uint32_t b0,
                                                uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* One chunk of 32 inner elements: rows r (lo) and r + 8 (hi) of w against NT token tiles. */
template <int NT>
static __device__ __forceinline__ void tm_skinny_chunk_mma(float (&acc)[NT][4], const uint4 &lo,
                                                 const uint4 &hi, const uint4 (&xv)[NT]) {
#pragma unroll
    for (int j = 0; j < NT; j++) {
        tm_skinny_mma(acc[j], lo.x, hi.x, lo.y, hi.y, xv[j].x, xv[j].y);
        tm_skinny_mma(acc[j], lo.z, hi.z, lo.w, hi.w, xv[j].z, xv[j].w);
    }
}

/* cp.async of 16 bytes with the L2 fetching the 256 bytes around them (the next chunks of the
 * same weight row). */
static __device__ __forceinline__ void tm_skinny_cp_async16(void *smem, const void *gmem) {
    const uint32_t sa = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;\n" ::"r"(sa), "l"(gmem));
}

/* A staggered order for a (tile, split) task's n_chunk chunks: from chunk rot, wrapping around.
 * When all warps start together and run at the same pace (the decode chain's projections), they
 * would otherwise all read the same offset of rows 2 n_in bytes apart at the same time, which
 * an H200 served at ~2.1 instead of ~3.4 TB/s (bench/RESULTS.md). The plain kernel's launches
 * (staggered by the block scheduler) were slower with it. */
static __device__ __forceinline__ uint32_t tm_skinny_rot(uint32_t tile, uint32_t split,
                                                         uint32_t n_chunk) {
    return n_chunk ? (tile * 37u + split * 11u) % n_chunk : 0;
}
static __device__ __forceinline__ uint32_t tm_skinny_chunk_at(uint32_t i, uint32_t rot,
                                                              uint32_t n_chunk) {
    const uint32_t j = i + rot;
    return j >= n_chunk ? j - n_chunk : j;
}

/* The accumulators of a warp's tile (rows row_lo = 16 * tile + r and row_lo + 8, lane = 4r + c)
 * into split's partials: fragment (row r, tokens 2c, 2c+1) and (row r + 8, the same tokens). */
template <int NT>
static __device__ __forceinline__ void tm_skinny_store(const float (&acc)[NT][4],
                                                       const tm_k_gemm_skinny_args &a,
                                                       uint32_t split, uint32_t row_lo,
                                                       uint32_t c) {
    const uint32_t row_hi = row_lo + 8;
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

#endif /* TM_KERNELS_GEMM_SKINNY_CUH */
