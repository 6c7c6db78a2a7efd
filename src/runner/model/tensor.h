/* runner/model/tensor.h - element types and tensor views: the dtypes a checkpoint stores, a tensor
 * as a borrowed view (data, dtype, shape), element conversions and row reads. Every part of the
 * runner that reads weights (the loader, both engines, the TP shard split, the model maker) uses
 * these and nothing engine-specific. Pure functions; any thread. Does not own or map memory: a
 * tensor's data belongs to whoever made the view (the model's mappings, a shard's copies). */
#ifndef TM_RUNNER_MODEL_TENSOR_H
#define TM_RUNNER_MODEL_TENSOR_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum tm_dtype {
    TM_DTYPE_F32 = 0,
    TM_DTYPE_F16,
    TM_DTYPE_BF16,
} tm_dtype;

/* Bytes per element of dt (asserts on a value outside the enum). */
size_t tm_dtype_size(tm_dtype dt);
/* "f32", "f16", "bf16"; "?" for a value outside the enum. */
const char *tm_dtype_name(tm_dtype dt);

typedef struct tm_tensor {
    const void *data;   /* borrowed from the model's mapping; NULL if the tensor is absent */
    tm_dtype dtype;
    uint32_t n_dim;     /* 1 or 2 for the Llama family */
    uint64_t shape[4];  /* row-major, PyTorch order: a Linear weight is [out_features][in_features] */
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

/* out[0..n) = elements [off, off + n) of the array src of dtype dt, as f32. The bf16 case is the
 * CPU engine's hot weight-widening loop. */
void tm_dtype_to_f32(const void *src, tm_dtype dt, size_t off, size_t n, float *out);

/* ---- tensor views ---- */

/* Number of elements of t (product of its shape). */
uint64_t tm_tensor_n_elem(const tm_tensor *t);
/* Element i (row-major, i < tm_tensor_n_elem(t)) of t as float, whatever its dtype. Reads with
 * memcpy, so t->data need not be aligned. Asserts that data is non-NULL and i is in range. */
float tm_tensor_get_f32(const tm_tensor *t, size_t i);
/* Row `row` of t converted to float: out[0 .. shape[n_dim-1]) (a 1-D tensor has one row, 0).
 * out must hold shape[n_dim-1] floats. Asserts that row is in range. */
void tm_tensor_row_f32(const tm_tensor *t, size_t row, float *out);

#endif /* TM_RUNNER_MODEL_TENSOR_H */
