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
