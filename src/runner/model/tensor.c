/* runner/model/tensor.c - dtypes, conversions and tensor views (see tensor.h). The bf16 widening
 * loop uses GCC/Clang vector extensions on 16-byte vectors: portable C with no intrinsics,
 * vectorised the same way at -O2 and -O3 on every target. */
#include "runner/model/tensor.h"

#include <math.h>

#include "base/err.h"

typedef uint16_t u16x4 __attribute__((vector_size(8)));
typedef uint32_t u32x4 __attribute__((vector_size(16)));

size_t tm_dtype_size(tm_dtype dt) {
    switch (dt) {
    case TM_DTYPE_F32: return 4;
    case TM_DTYPE_F16: return 2;
    case TM_DTYPE_BF16: return 2;
    }
    TM_ASSERT(0 && "bad dtype");
    return 0;
}

const char *tm_dtype_name(tm_dtype dt) {
    switch (dt) {
    case TM_DTYPE_F32: return "f32";
    case TM_DTYPE_F16: return "f16";
    case TM_DTYPE_BF16: return "bf16";
    }
    return "?";
}

static float f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

uint16_t tm_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof(x));
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    x &= 0x7fffffffu;
    if (x > 0x7f800000u)
        return sign | 0x7e00; // NaN
    if (x >= 0x477ff000u)     // >= 65520 rounds to infinity
        return sign | 0x7c00;
    if (x < 0x38800000u) {
        // Below 2^-14: a subnormal (or zero) step of 2^-24. The scaled value is exact in f32 and
        // nearbyintf rounds half to even in the default mode; 1024 lands on the smallest normal.
        float v = f32_from_bits(x) * 16777216.0f;
        return sign | (uint16_t)nearbyintf(v);
    }
    x += 0xfffu + ((x >> 13) & 1); // round to nearest even on the 13 dropped bits
    return sign | (uint16_t)((x - (112u << 23)) >> 13);
}

void tm_dtype_to_f32(const void *src, tm_dtype dt, size_t off, size_t n, float *out) {
    switch (dt) {
    case TM_DTYPE_F32:
        memcpy(out, (const float *)src + off, n * sizeof(float));
        return;
    case TM_DTYPE_BF16: {
        const uint16_t *s = (const uint16_t *)src + off;
        size_t i = 0;
        // hot loop: bf16 widening, one shift per element, four at a time
        for (; i + 4 <= n; i += 4) {
            u16x4 h;
            memcpy(&h, s + i, sizeof(h));
            u32x4 u = __builtin_convertvector(h, u32x4) << 16;
            memcpy(out + i, &u, sizeof(u));
        }
        for (; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + i, sizeof(h)); // src need not be aligned
            out[i] = tm_bf16_to_f32(h);
        }
        return;
    }
    case TM_DTYPE_F16: {
        const uint16_t *s = (const uint16_t *)src + off;
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + i, sizeof(h));
            out[i] = tm_f16_to_f32(h);
        }
        return;
    }
    }
    TM_ASSERT(0 && "unknown dtype");
}

uint64_t tm_tensor_n_elem(const tm_tensor *t) {
    uint64_t n = 1;
    for (uint32_t d = 0; d < t->n_dim; d++)
        n *= t->shape[d];
    return n;
}

float tm_tensor_get_f32(const tm_tensor *t, size_t i) {
    TM_ASSERT(t->data != NULL);
    TM_ASSERT(i < tm_tensor_n_elem(t));
    float f;
    tm_dtype_to_f32(t->data, t->dtype, i, 1, &f);
    return f;
}

void tm_tensor_row_f32(const tm_tensor *t, size_t row, float *out) {
    TM_ASSERT(t->data != NULL);
    uint64_t n_col = t->n_dim ? t->shape[t->n_dim - 1] : 1;
    uint64_t n_row = n_col ? tm_tensor_n_elem(t) / n_col : 0;
    TM_ASSERT(row < n_row);
    tm_dtype_to_f32(t->data, t->dtype, row * n_col, n_col, out);
}
