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

static __global__ void __launch_bounds__(512)
    read_stream_kernel(const uint4 *p, size_t n, float *out) {
    float acc = 0.0f;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const uint4 v = __ldcs(p + i); // streaming: no reuse
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int k = 0; k < 4; k++)
            acc += __uint_as_float(w[k] << 16) + __uint_as_float(w[k] & 0xffff0000u);
    }
    __shared__ float red[32];
    for (int o = 16; o > 0; o >>= 1)
        acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if ((threadIdx.x & 31) == 0)
        red[threadIdx.x >> 5] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = 0.0f;
        for (unsigned w = 0; w < blockDim.x / 32; w++)
            t += red[w];
        out[blockIdx.x] = t;
    }
}

extern "C" tm_rc tm_k_read_stream(const void *p, size_t n_bytes, float *out, cudaStream_t s,
                                  tm_err *err) {
    TM_ASSERT(p && out && n_bytes % 16 == 0 && ((uintptr_t)p & 15) == 0);
    const size_t n = n_bytes / 16;
    if (n == 0)
        return TM_OK;
    const unsigned grid = (unsigned)TM_MIN(TM_CEIL_DIV(n, (size_t)512), (size_t)TM_K_READ_BLOCKS);
    read_stream_kernel<<<grid, 512, 0, s>>>((const uint4 *)p, n, out);
    return tm_cuda_launched(err, s, "read_stream");
}
