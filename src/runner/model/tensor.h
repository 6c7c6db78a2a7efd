/* runner/model/tensor.h - element types and tensor views: the dtypes a checkpoint stores, a tensor
 * as a borrowed view (data, dtype, shape, and for a quantized weight its scales), element
 * conversions and row reads. Every part of the runner that reads weights (the loader, both
 * engines, the TP shard split, the model maker) uses these and nothing engine-specific. Pure
 * functions; any thread. Does not own or map memory: a tensor's data (and scales) belong to
 * whoever made the view (the model's mappings, a shard's copies).
 *
 * Quantized weights (docs/quantization.md): the value of element (r, c) of a matrix is
 * decode(element) * scale[r / qblock[0]][c / qblock[1]], an fp32 product of two exact fp32
 * values. One layout covers every scheme: 128x128 blocks (fp8 block-scaled), 1 x in (per
 * channel), out x in (per tensor), 1 x 32 (MXFP4). A 3-D tensor [E][R][C] is E matrices with
 * E scale grids. tm_tensor_row_f32 and tm_tensor_get_f32 dequantize; tm_dtype_to_f32 decodes
 * the raw elements only. */
#ifndef TM_RUNNER_MODEL_TENSOR_H
#define TM_RUNNER_MODEL_TENSOR_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum tm_dtype {
    TM_DTYPE_F32 = 0,
    TM_DTYPE_F16,
    TM_DTYPE_BF16,
    TM_DTYPE_F8_E4M3, /* safetensors F8_E4M3 (torch float8_e4m3fn): no infinities, 0x7f/0xff NaN,
                       * max 448 */
    TM_DTYPE_F8_E8M0, /* safetensors F8_E8M0 (torch float8_e8m0fnu): 2^(e-127), 0xff NaN; scales */
    TM_DTYPE_I8,      /* safetensors I8 / U8: integers, and the storage of packed FP4 */
    TM_DTYPE_U8,
    TM_DTYPE_F4_E2M1, /* two e2m1 values a byte, element 2j in the low nibble, 2j+1 in the high
                       * one (DeepSeek's int8 storage, torch float4_e2m1fn_x2); never read from a
                       * safetensors header: the loader reinterprets I8/U8 [.., n/2] as [.., n] */
} tm_dtype;

#define TM_DTYPE_COUNT 8

/* Bytes per element of dt; asserts on TM_DTYPE_F4_E2M1 (half a byte: use tm_dtype_bytes) and on a
 * value outside the enum. */
size_t tm_dtype_size(tm_dtype dt);
/* Bytes that n consecutive elements of dt take (n must be even for F4_E2M1). */
uint64_t tm_dtype_bytes(tm_dtype dt, uint64_t n);
/* "f32", "f16", "bf16", "f8_e4m3", "f8_e8m0", "i8", "u8", "f4_e2m1"; "?" outside the enum. */
const char *tm_dtype_name(tm_dtype dt);

/* How a weight's elements are scaled (see the file comment). */
typedef enum tm_quant {
    TM_QUANT_NONE = 0,
    TM_QUANT_FP8_BLOCK,   /* F8_E4M3 values, weight_scale_inv per qblock[0] x qblock[1] block */
    TM_QUANT_FP8_CHANNEL, /* F8_E4M3 values, weight_scale per output row (qblock = 1 x in) */
    TM_QUANT_FP8_TENSOR,  /* F8_E4M3 values, one weight_scale (qblock = out x in) */
    TM_QUANT_MXFP4,       /* F4_E2M1 values, an F8_E8M0 scale per 32 inputs (qblock = 1 x 32) */
} tm_quant;

/* "none", "fp8-block", "fp8-channel", "fp8-tensor", "mxfp4"; "?" outside the enum. */
const char *tm_quant_name(tm_quant q);

typedef struct tm_tensor {
    const void *data; /* borrowed from the model's mapping; NULL if the tensor is absent */
    tm_dtype dtype;
    uint32_t n_dim;    /* 1 or 2 for the Llama family */
    uint64_t shape[4]; /* row-major, PyTorch order: a Linear weight is [out_features][in_features];
                        * logical elements (an F4_E2M1 row of n values takes n/2 bytes) */
    /* quantized weights only (quant != TM_QUANT_NONE); zero otherwise */
    const void *scale;   /* borrowed like data: [batch][ceil(R/qblock[0])][ceil(C/qblock[1])] of
                          * scale_dtype, R x C the last two dims */
    uint8_t quant;       /* tm_quant */
    uint8_t scale_dtype; /* tm_dtype: F32, BF16, F16 or F8_E8M0 */
    uint32_t qblock[2];  /* rows x columns each scale covers, >= 1 */
} tm_tensor;

/* ---- element conversions ----
 * To f32: exact for every input (normals, subnormals, +-0, +-inf, NaN with its payload). From
 * f32: round to nearest even; NaN stays NaN (quiet, sign kept); overflow gives infinity. */

static inline float tm_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

static inline float tm_f16_to_f32(uint16_t h) {
    // Put exponent+mantissa where a float keeps them; scaling by 2^112 re-biases the exponent
    // (15 -> 127) and turns a half subnormal into the right float normal in one exact multiply.
    uint32_t u = (uint32_t)(h & 0x7fffu) << 13;
    float f;
    memcpy(&f, &u, sizeof(f));
    f *= 0x1p112f;
    memcpy(&u, &f, sizeof(u));
    if (f >= 65536.0f) // half exponent 31: inf or NaN
        u |= 0x7f800000u;
    u |= (uint32_t)(h & 0x8000u) << 16;
    memcpy(&f, &u, sizeof(f));
    return f;
}

static inline uint16_t tm_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u); // quiet NaN; keep the sign
    u += 0x7fffu + ((u >> 16) & 1u);          // round to nearest even
    return (uint16_t)(u >> 16);
}

uint16_t tm_f32_to_f16(float f);

/* e4m3fn -> f32, exact: bias 7, subnormals m * 2^-9, 0x7f / 0xff NaN (no infinities). */
static inline float tm_e4m3_to_f32(uint8_t b) {
    uint32_t e = (b >> 3) & 0xfu, m = b & 7u, u;
    float f;
    if ((b & 0x7fu) == 0x7fu) {
        u = 0x7fc00000u;
    } else if (e == 0) {
        f = (float)m * 0x1p-9f; // subnormal (or zero): exact
        memcpy(&u, &f, sizeof(u));
    } else {
        u = ((e + 120u) << 23) | (m << 20);
    }
    u |= (uint32_t)(b & 0x80u) << 24;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* e8m0 -> f32, exact: 2^(e - 127); e = 0 gives 2^-127 (an f32 subnormal), 0xff NaN. */
static inline float tm_e8m0_to_f32(uint8_t b) {
    uint32_t u = b == 0xffu ? 0x7fc00000u : b == 0 ? 0x00400000u : (uint32_t)b << 23;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* e2m1 nibble (low 4 bits of v) -> f32, exact: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives. */
static inline float tm_e2m1_to_f32(uint8_t v) {
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    return (v & 8u) ? -mag[v & 7u] : mag[v & 7u];
}

/* f32 -> e4m3fn as torch's cast: round to nearest even (subnormals included); |f| up to 464
 * rounds to at most 448, anything that rounds past 448 (|f| > 464), inf and NaN give NaN (0x7f
 * with the sign). Quantizers divide by absmax / 448 first, so they never get there. */
uint8_t tm_f32_to_e4m3(float f);
/* f32 -> e2m1 nibble: round to nearest even, saturating at +-6; NaN gives +0. */
uint8_t tm_f32_to_e2m1(float f);
/* The e8m0 byte of 2^k, k the least integer with 2^k * qmax >= amax (so amax / 2^k fits in
 * [-qmax, qmax]); k clamped to [-127, 127]; amax 0 (or not finite) gives 2^0. */
uint8_t tm_e8m0_ceil_scale(float amax, float qmax);

/* out[0..n) = elements [off, off + n) of the array src of dtype dt, as f32. The bf16 case is the
 * CPU engine's hot weight-widening loop. */
void tm_dtype_to_f32(const void *src, tm_dtype dt, size_t off, size_t n, float *out);

/* ---- tensor views ---- */

/* Number of elements of t (product of its shape). */
uint64_t tm_tensor_n_elem(const tm_tensor *t);
/* Element i (row-major, i < tm_tensor_n_elem(t)) of t as float, whatever its dtype, dequantized
 * if t is quantized. Reads with memcpy, so t->data need not be aligned. Asserts that data is
 * non-NULL and i is in range. */
float tm_tensor_get_f32(const tm_tensor *t, size_t i);
/* Row `row` of t converted to float and dequantized: out[0 .. shape[n_dim-1]) (a 1-D tensor has
 * one row, 0; rows of a 3-D tensor run over its first two dims). out must hold shape[n_dim-1]
 * floats. Asserts that row is in range. The weight-row read of the CPU matmul. */
void tm_tensor_row_f32(const tm_tensor *t, size_t row, float *out);
/* The scale of element (row, col) of a quantized t (row as in tm_tensor_row_f32), as f32. */
float tm_tensor_scale_at(const tm_tensor *t, size_t row, size_t col);

#endif /* TM_RUNNER_MODEL_TENSOR_H */
