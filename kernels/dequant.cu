/* kernels/dequant.cu - FP8 -> bf16 weight dequantization and the column-range partial sum (see
 * dequant.h). Grid-stride loops over elements; no shared memory. */
#include "kernels/common.cuh"
#include "kernels/dequant.h"

/* e4m3fn -> f32, exact (the host's tm_e4m3_to_f32): bias 7, subnormals m * 2^-9, S.1111.111 NaN. */
static __device__ __forceinline__ float e4m3_to_f32(uint32_t b) {
    const uint32_t e = (b >> 3) & 0xfu, m = b & 7u;
    uint32_t u;
    if ((b & 0x7fu) == 0x7fu)
        u = 0x7fc00000u;
    else if (e == 0)
        u = __float_as_uint((float)m * 0x1p-9f);
    else
        u = ((e + 120u) << 23) | (m << 20);
    return __uint_as_float(u | ((b & 0x80u) << 24));
}

/* e8m0 -> f32, exact: 2^(e - 127); 0 gives 2^-127, 0xff NaN. */
static __device__ __forceinline__ float e8m0_to_f32(uint32_t b) {
    return __uint_as_float(b == 0xffu ? 0x7fc00000u : b == 0 ? 0x00400000u : b << 23);
}

static __global__ void dequant_fp8_kernel(uint16_t *out, const uint8_t *w, const void *scale,
                                          uint32_t n_out, uint32_t n_in, int kind) {
    const size_t n = (size_t)n_out * n_in;
    const uint32_t nb_in = (n_in + 127) / 128;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const uint32_t o = (uint32_t)(i / n_in), c = (uint32_t)(i % n_in);
        float s;
        if (kind == TM_K_FP8_CHANNEL)
            s = ((const float *)scale)[o];
        else if (kind == TM_K_FP8_BLOCK_F32)
            s = ((const float *)scale)[(size_t)(o / 128) * nb_in + c / 128];
        else
            s = e8m0_to_f32(((const uint8_t *)scale)[(size_t)(o / 128) * nb_in + c / 128]);
        out[i] = tm_f2bf(__fmul_rn(e4m3_to_f32(w[i]), s));
    }
}

/* n_in % 16 == 0 and 16-byte aligned w / out: 16 elements a thread (one 16-byte load, two
 * 16-byte stores; one scale, as 16 divides 128). */
static __global__ void dequant_fp8_vec16_kernel(uint16_t *out, const uint8_t *w, const void *scale,
                                                uint32_t n_out, uint32_t n_in, int kind) {
    const size_t n_vec = (size_t)n_out * (n_in / 16);
    const uint32_t nb_in = (n_in + 127) / 128, v_row = n_in / 16;
    for (size_t v = (size_t)blockIdx.x * blockDim.x + threadIdx.x; v < n_vec;
         v += (size_t)gridDim.x * blockDim.x) {
        const uint32_t o = (uint32_t)(v / v_row), c = (uint32_t)(v % v_row) * 16;
        float s;
        if (kind == TM_K_FP8_CHANNEL)
            s = ((const float *)scale)[o];
        else if (kind == TM_K_FP8_BLOCK_F32)
            s = ((const float *)scale)[(size_t)(o / 128) * nb_in + c / 128];
        else
            s = e8m0_to_f32(((const uint8_t *)scale)[(size_t)(o / 128) * nb_in + c / 128]);
        const uint4 q = *reinterpret_cast<const uint4 *>(w + v * 16);
        const uint32_t in[4] = {q.x, q.y, q.z, q.w};
        uint32_t res[8];
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const uint32_t word = in[k / 2] >> (16 * (k % 2));
            const uint32_t lo = tm_f2bf(__fmul_rn(e4m3_to_f32(word & 0xffu), s));
            const uint32_t hi = tm_f2bf(__fmul_rn(e4m3_to_f32((word >> 8) & 0xffu), s));
            res[k] = lo | (hi << 16);
        }
        uint4 *dst = reinterpret_cast<uint4 *>(out + v * 16);
        dst[0] = make_uint4(res[0], res[1], res[2], res[3]);
        dst[1] = make_uint4(res[4], res[5], res[6], res[7]);
    }
}

extern "C" tm_rc tm_k_dequant_fp8_bf16(const tm_k_dequant_fp8_args *a, cudaStream_t s,
                                       tm_err *err) {
    const size_t n = (size_t)a->n_out * a->n_in;
    if (n == 0)
        return TM_OK;
    TM_ASSERT(a->out && a->w && a->scale);
    if (a->n_in % 16 == 0 && (uintptr_t)a->w % 16 == 0 && (uintptr_t)a->out % 16 == 0) {
        const unsigned grid = (unsigned)TM_MIN(TM_CEIL_DIV(n / 16, (size_t)256), (size_t)132 * 16);
        dequant_fp8_vec16_kernel<<<grid, 256, 0, s>>>(a->out, a->w, a->scale, a->n_out, a->n_in,
                                                      (int)a->scale_kind);
        return tm_cuda_launched(err, s, "dequant_fp8_bf16");
    }
    const unsigned grid = (unsigned)TM_MIN(TM_CEIL_DIV(n, (size_t)256), (size_t)132 * 16);
    dequant_fp8_kernel<<<grid, 256, 0, s>>>(a->out, a->w, a->scale, a->n_out, a->n_in,
                                            (int)a->scale_kind);
    return tm_cuda_launched(err, s, "dequant_fp8_bf16");
}

static __global__ void sum_parts_cols_kernel(float *y, uint32_t ld_y, const float *part,
                                             size_t stride, uint32_t n_part, uint32_t n_tok,
                                             uint32_t n_col) {
    const size_t n = (size_t)n_tok * n_col;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float acc = part[i];
        for (uint32_t p = 1; p < n_part; p++)
            acc += part[p * stride + i];
        y[(i / n_col) * ld_y + i % n_col] = acc;
    }
}

extern "C" tm_rc tm_k_sum_parts_cols(const tm_k_sum_parts_cols_args *a, cudaStream_t s,
                                     tm_err *err) {
    const size_t n = (size_t)a->n_tok * a->n_col;
    if (n == 0)
        return TM_OK;
    TM_ASSERT(a->y && a->part && a->n_part >= 1 && a->ld_y >= a->n_col);
    const unsigned grid = (unsigned)TM_MIN(TM_CEIL_DIV(n, (size_t)256), (size_t)132 * 8);
    sum_parts_cols_kernel<<<grid, 256, 0, s>>>(a->y, a->ld_y, a->part, a->stride, a->n_part,
                                               a->n_tok, a->n_col);
    return tm_cuda_launched(err, s, "sum_parts_cols");
}

/* f32 -> e4m3fn as the host's tm_f32_to_e4m3 (runner/model/tensor.c): round to nearest even,
 * subnormals included; [448, 480) saturates to 448 where the host gives NaN above 464; NaN, inf
 * and |f| >= 480 give 0x7f (NaN) with the sign. */
static __device__ __forceinline__ uint32_t f32_to_e4m3(float f) {
    uint32_t x = __float_as_uint(f);
    const uint32_t sign = (x >> 24) & 0x80u;
    x &= 0x7fffffffu;
    if (x >= 0x43f00000u) // NaN, inf, |f| >= 480
        return sign | 0x7fu;
    if (x >= 0x43e00000u) // [448, 480): 448, the largest finite code
        return sign | 0x7eu;
    if (x < 0x3c800000u) // below 2^-6: a subnormal step of 2^-9
        return sign | (uint32_t)__float2int_rn(__uint_as_float(x) * 512.0f);
    x += 0x7ffffu + ((x >> 20) & 1u);
    return sign | ((x - (120u << 23)) >> 20);
}

/* group 128: one warp per (token, group); lane l holds inputs 4l..4l+3 of the group. */
static __global__ void act_quant_g128_kernel(uint8_t *out, float *scale, const uint16_t *x,
                                             uint32_t n_tok, uint32_t n_tok_pad, uint32_t n_in) {
    const uint32_t n_grp = n_in / 128;
    const size_t w = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const uint32_t lane = threadIdx.x % 32;
    if (w >= (size_t)n_tok_pad * n_grp)
        return;
    const uint32_t t = (uint32_t)(w / n_grp), g = (uint32_t)(w % n_grp);
    const size_t off = (size_t)t * n_in + (size_t)g * 128 + lane * 4;
    if (t >= n_tok) { // padding row
        *reinterpret_cast<uint32_t *>(out + off) = 0;
        if (lane == 0)
            scale[(size_t)g * n_tok_pad + t] = 1.0f;
        return;
    }
    const uint2 raw = *reinterpret_cast<const uint2 *>(x + off);
    float v[4] = {tm_bf2f((uint16_t)(raw.x & 0xffffu)), tm_bf2f((uint16_t)(raw.x >> 16)),
                  tm_bf2f((uint16_t)(raw.y & 0xffffu)), tm_bf2f((uint16_t)(raw.y >> 16))};
    float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float s = amax > 0.0f ? __fdiv_rn(amax, 448.0f) : 1.0f;
    uint32_t q = 0;
#pragma unroll
    for (int k = 0; k < 4; k++)
        q |= f32_to_e4m3(__fdiv_rn(v[k], s)) << (8 * k);
    *reinterpret_cast<uint32_t *>(out + off) = q;
    if (lane == 0)
        scale[(size_t)g * n_tok_pad + t] = s;
}

/* group n_in: one block of 256 threads per token. */
static __global__ void act_quant_tok_kernel(uint8_t *out, float *scale, const uint16_t *x,
                                            uint32_t n_tok, uint32_t n_in) {
    const uint32_t t = blockIdx.x;
    if (t >= n_tok) { // padding row
        for (uint32_t i = threadIdx.x; i < n_in; i += blockDim.x)
            out[(size_t)t * n_in + i] = 0;
        if (threadIdx.x == 0)
            scale[t] = 1.0f;
        return;
    }
    const uint16_t *xr = x + (size_t)t * n_in;
    float amax = 0.0f;
    for (uint32_t i = threadIdx.x; i < n_in; i += blockDim.x)
        amax = fmaxf(amax, fabsf(tm_bf2f(xr[i])));
    __shared__ float red[32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    if (threadIdx.x % 32 == 0)
        red[threadIdx.x / 32] = amax;
    __syncthreads();
    if (threadIdx.x < 32) {
        amax = threadIdx.x < blockDim.x / 32 ? red[threadIdx.x] : 0.0f;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        if (threadIdx.x == 0)
            red[0] = amax;
    }
    __syncthreads();
    amax = red[0];
    const float s = amax > 0.0f ? __fdiv_rn(amax, 448.0f) : 1.0f;
    for (uint32_t i = threadIdx.x; i < n_in; i += blockDim.x)
        out[(size_t)t * n_in + i] = (uint8_t)f32_to_e4m3(__fdiv_rn(tm_bf2f(xr[i]), s));
    if (threadIdx.x == 0)
        scale[t] = s;
}

extern "C" tm_rc tm_k_act_quant_fp8(const tm_k_act_quant_fp8_args *a, cudaStream_t s, tm_err *err) {
    if (a->n_tok == 0 || a->n_in == 0)
        return TM_OK;
    TM_ASSERT(a->out && a->scale && a->x);
    const uint32_t n_pad = TM_MAX(a->n_tok_pad, a->n_tok);
    if (a->group == 128) {
        TM_ASSERT(a->n_in % 128 == 0 && (uintptr_t)a->x % 8 == 0 && (uintptr_t)a->out % 4 == 0);
        const size_t threads = (size_t)n_pad * (a->n_in / 128) * 32;
        act_quant_g128_kernel<<<(unsigned)TM_CEIL_DIV(threads, (size_t)256), 256, 0, s>>>(
            a->out, a->scale, a->x, a->n_tok, n_pad, a->n_in);
        return tm_cuda_launched(err, s, "act_quant_fp8 (group 128)");
    }
    TM_ASSERT(a->group == a->n_in);
    act_quant_tok_kernel<<<n_pad, 256, 0, s>>>(a->out, a->scale, a->x, a->n_tok, a->n_in);
    return tm_cuda_launched(err, s, "act_quant_fp8 (per token)");
}
