/* kernels/kv_fp8.cuh - the fp8 (e4m3fn, scale 1.0) KV cache entries as the attention and KV-write
 * kernels see them (engine.kv_cache_dtype "fp8"; docs/quantization.md, "KV cache"). Device code
 * only.
 *
 * Write: fp32 -> e4m3 with __NV_SATFINITE: round to nearest even (subnormals included), |x| past
 * 448 and +-inf saturate to +-448, NaN stays NaN; the host reference is tm_kv_fp8_round
 * (runner/engine/engine.h), which gives the same value.
 * Read: e4m3 -> fp32 (or bf16, which holds every e4m3 value) exactly: the byte's exponent and
 * mantissa are placed in an fp32 with the exponent bias 127 instead of 7, and one multiplication
 * by 2^120 rebiases it; an e4m3 subnormal (exponent 0) becomes an fp32 subnormal, which the
 * multiplication turns into m * 2^-9 exactly (IEEE fp32 multiply; the kernels are not built
 * with -ftz / --use_fast_math). The writer never stores NaN (0x7f / 0xff, only from a NaN input)
 * and the reader does not decode it (it reads as 480). */
#ifndef TM_KERNELS_KV_FP8_CUH
#define TM_KERNELS_KV_FP8_CUH

#include <stdint.h>

#include <cuda_fp8.h>
#include <cuda_runtime.h>

/* fp32 -> the e4m3 byte of the cache. */
static __device__ __forceinline__ uint8_t tm_kv_f2e4m3(float x) {
    return (uint8_t)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
}

/* The e4m3 byte in bits [8i, 8i + 8) of w as a float, exactly. */
template <int I> static __device__ __forceinline__ float tm_kv_e4m3_f(uint32_t w) {
    const uint32_t b = w >> (8 * I);
    const uint32_t u = ((b & 0x80u) << 24) | ((b & 0x7fu) << 20);
    return __uint_as_float(u) * 0x1p120f;
}

/* Eight e4m3 (element e in byte e % 4 of word e / 4) as floats. */
static __device__ __forceinline__ void tm_kv_e4m3x8_f32(uint2 v, float *out) {
    out[0] = tm_kv_e4m3_f<0>(v.x), out[1] = tm_kv_e4m3_f<1>(v.x);
    out[2] = tm_kv_e4m3_f<2>(v.x), out[3] = tm_kv_e4m3_f<3>(v.x);
    out[4] = tm_kv_e4m3_f<0>(v.y), out[5] = tm_kv_e4m3_f<1>(v.y);
    out[6] = tm_kv_e4m3_f<2>(v.y), out[7] = tm_kv_e4m3_f<3>(v.y);
}

/* Two floats that are e4m3 values (at most 4 significant bits) as a bf16 pair, exactly: the
 * upper halves of their bits, a in the low half. */
static __device__ __forceinline__ uint32_t tm_kv_pack_bf16(float a, float b) {
    return __byte_perm(__float_as_uint(a), __float_as_uint(b), 0x7632);
}

/* Eight e4m3 as eight bf16 in the same order (a uint4 as a bf16 row piece reads). */
static __device__ __forceinline__ uint4 tm_kv_e4m3x8_bf16(uint2 v) {
    float f[8];
    tm_kv_e4m3x8_f32(v, f);
    return make_uint4(tm_kv_pack_bf16(f[0], f[1]), tm_kv_pack_bf16(f[2], f[3]),
                      tm_kv_pack_bf16(f[4], f[5]), tm_kv_pack_bf16(f[6], f[7]));
}

#endif /* TM_KERNELS_KV_FP8_CUH */
