/* kernels/common.cuh - device helpers shared by the kernels: bf16 <-> fp32, warp and block
 * reductions, a block argmax, 16-byte bf16 vector loads, cp.async, ldmatrix and mma.sync.
 * Device code only
 * (plus kernels/common.h for the launchers' error glue). Reductions assume blockDim.x == BLOCK,
 * a multiple of 32, <= 1024. */
#ifndef TM_KERNELS_COMMON_CUH
#define TM_KERNELS_COMMON_CUH

#include <stdint.h>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/common.h"

/* bf16 bits <-> float. The float -> bf16 rounding is round-to-nearest-even (NaN kept), the same
 * as tm_f32_to_bf16 on the host. */
static __device__ __forceinline__ float tm_bf2f(uint16_t h) {
    return __uint_as_float((uint32_t)h << 16);
}
static __device__ __forceinline__ uint16_t tm_f2bf(float f) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}

/* Eight bf16 at p (16-byte aligned) as floats. */
static __device__ __forceinline__ void tm_load8_bf16(const uint16_t *p, float *out) {
    uint4 u = *reinterpret_cast<const uint4 *>(p);
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        out[2 * i] = __uint_as_float(w[i] << 16);
        out[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}

static __device__ __forceinline__ float tm_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
static __device__ __forceinline__ float tm_warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum (or max) of v over the block, returned to every thread. Contains __syncthreads(); every
 * thread of the block must call it. */
template <int BLOCK> static __device__ __forceinline__ float tm_block_sum(float v) {
    __shared__ float red[BLOCK / 32];
    v = tm_warp_sum(v);
    __syncthreads(); // red may still be read by a previous call
    if ((threadIdx.x & 31) == 0)
        red[threadIdx.x >> 5] = v;
    __syncthreads();
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < BLOCK / 32; i++)
        s += red[i];
    return s;
}
template <int BLOCK> static __device__ __forceinline__ float tm_block_max(float v) {
    __shared__ float red[BLOCK / 32];
    v = tm_warp_max(v);
    __syncthreads();
    if ((threadIdx.x & 31) == 0)
        red[threadIdx.x >> 5] = v;
    __syncthreads();
    float s = red[0];
#pragma unroll
    for (int i = 1; i < BLOCK / 32; i++)
        s = fmaxf(s, red[i]);
    return s;
}

/* (v, i) beats (bv, bi) in an argmax: a larger value, or an equal value and a lower index;
 * anything beats index UINT32_MAX ("none"), which beats nothing. */
static __device__ __forceinline__ bool tm_argmax_better(float v, uint32_t i, float bv,
                                                        uint32_t bi) {
    if (i == UINT32_MAX)
        return false;
    if (bi == UINT32_MAX)
        return true;
    return v > bv || (v == bv && i < bi);
}

/* Argmax of row[0, n) by the block (blockDim.x == BLOCK, every thread calls it): the largest
 * value and, among equal ones, the lowest index (UINT32_MAX when n == 0; NaN never wins over a
 * number but is reported). Returns in every thread whether a value was NaN or infinite. */
template <int BLOCK>
static __device__ __forceinline__ bool tm_block_argmax(const float *row, uint32_t n, float *v_out,
                                                       uint32_t *i_out) {
    __shared__ float sv[BLOCK];
    __shared__ uint32_t si[BLOCK];
    float best = -INFINITY;
    uint32_t bi = UINT32_MAX;
    int bad = 0;
    for (uint32_t c = threadIdx.x; c < n; c += BLOCK) { // hot loop: the vocabulary
        const float v = row[c];
        bad |= !isfinite(v);
        if (tm_argmax_better(v, c, best, bi))
            best = v, bi = c;
    }
    bad = __syncthreads_or(bad);
    sv[threadIdx.x] = best;
    si[threadIdx.x] = bi;
    __syncthreads();
    for (int w = BLOCK / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w && tm_argmax_better(sv[threadIdx.x + w], si[threadIdx.x + w],
                                                     sv[threadIdx.x], si[threadIdx.x])) {
            sv[threadIdx.x] = sv[threadIdx.x + w];
            si[threadIdx.x] = si[threadIdx.x + w];
        }
        __syncthreads();
    }
    *v_out = sv[0];
    *i_out = si[0];
    return bad != 0;
}

/* cp.async (sm_80+): 16 bytes global -> shared, bypassing L1; n_src < 16 reads only n_src
 * bytes and zero-fills the rest (0: nothing is read). One commit group per batch of copies;
 * tm_cp_async_wait<N> waits until at most N groups are pending. */
static __device__ __forceinline__ void tm_cp_async16(void *dst, const void *src,
                                                     uint32_t n_src = 16) {
    const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(n_src)
                 : "memory");
}
static __device__ __forceinline__ void tm_cp_async_commit(void) {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N> static __device__ __forceinline__ void tm_cp_async_wait(void) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* ldmatrix: four 8x8 b16 matrices from shared memory (lane l gives the address of row l % 8 of
 * matrix l / 8); _trans delivers them transposed. */
static __device__ __forceinline__ void tm_ldsm_x4(uint32_t *r, const uint16_t *p) {
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
static __device__ __forceinline__ void tm_ldsm_x4_trans(uint32_t *r, const uint16_t *p) {
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

/* d += a (16x16, row) * b (16x8, col), bf16 in, fp32 accumulate (mma.sync m16n8k16). Fragments,
 * lane = 4g + c: a = {A[g][2c..2c+1], A[g+8][2c..], A[g][2c+8..], A[g+8][2c+8..]},
 * b = {B[2c..2c+1][g], B[2c+8..2c+9][g]}, d = {D[g][2c], D[g][2c+1], D[g+8][2c], D[g+8][2c+1]}. */
static __device__ __forceinline__ void tm_mma_bf16(float *d, const uint32_t *a, uint32_t b0,
                                                   uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* (lo, hi) rounded to bf16 in one 32-bit register, lo in the low half */
static __device__ __forceinline__ uint32_t tm_pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

#endif /* TM_KERNELS_COMMON_CUH */
