/* kernels/common.cuh - device helpers shared by the kernels: bf16 <-> fp32, warp and block
 * reductions, 16-byte bf16 vector loads, cp.async. Device code only (plus kernels/common.h for the
 * launchers' error glue). Reductions assume blockDim.x == BLOCK, a multiple of 32, <= 1024. */
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

#endif /* TM_KERNELS_COMMON_CUH */
