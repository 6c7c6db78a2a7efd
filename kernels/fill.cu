/* kernels/fill.cu - hashed uniform bf16 fill (see fill.h). u = (splitmix64(seed ^ i*K) >> 40)
 * * 2^-23 - 1, exact in fp32. */
#include <cuda_fp8.h>

#include "kernels/common.cuh"
#include "kernels/fill.h"

static __device__ __forceinline__ uint64_t mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static __global__ void fill_bf16_kernel(uint16_t *p, size_t n, uint64_t seed, float scale,
                                        float offset) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const uint64_t h = mix64(seed ^ (i * 0xd1342543de82ef95ull));
        const float u = (float)(h >> 40) * 0x1p-23f - 1.0f;
        p[i] = tm_f2bf(__fadd_rn(offset, __fmul_rn(scale, u))); // no FMA: same bits as host
    }
}

extern "C" tm_rc tm_k_fill_bf16(const tm_k_fill_bf16_args *a, cudaStream_t s, tm_err *err) {
    if (a->n == 0)
        return TM_OK;
    TM_ASSERT(a->p);
    const size_t want = TM_CEIL_DIV(a->n, (size_t)256);
    const unsigned grid = (unsigned)TM_MIN(want, (size_t)132 * 32);
    fill_bf16_kernel<<<grid, 256, 0, s>>>(a->p, a->n, a->seed, a->scale, a->offset);
    return tm_cuda_launched(err, s, "fill_bf16");
}

static __global__ void fill_e4m3_kernel(uint8_t *p, size_t n, uint64_t seed, float amax) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const uint64_t h = mix64(seed ^ (i * 0xd1342543de82ef95ull));
        const float u = (float)(h >> 40) * 0x1p-23f - 1.0f;
        p[i] = (uint8_t)__nv_cvt_float_to_fp8(amax * u, __NV_SATFINITE, __NV_E4M3);
    }
}

extern "C" tm_rc tm_k_fill_e4m3(const tm_k_fill_e4m3_args *a, cudaStream_t s, tm_err *err) {
    if (a->n == 0)
        return TM_OK;
    TM_ASSERT(a->p && a->amax > 0.0f && a->amax <= 448.0f);
    const size_t want = TM_CEIL_DIV(a->n, (size_t)256);
    const unsigned grid = (unsigned)TM_MIN(want, (size_t)132 * 32);
    fill_e4m3_kernel<<<grid, 256, 0, s>>>(a->p, a->n, a->seed, a->amax);
    return tm_cuda_launched(err, s, "fill_e4m3");
}
