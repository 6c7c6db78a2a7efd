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
    case TM_DTYPE_F32:
        return 4;
    case TM_DTYPE_F16:
        return 2;
    case TM_DTYPE_BF16:
        return 2;
    case TM_DTYPE_F8_E4M3:
    case TM_DTYPE_F8_E8M0:
    case TM_DTYPE_I8:
    case TM_DTYPE_U8:
        return 1;
    case TM_DTYPE_F4_E2M1:
        break; // half a byte
    }
    TM_ASSERT(0 && "bad dtype");
    return 0;
}

uint64_t tm_dtype_bytes(tm_dtype dt, uint64_t n) {
    if (dt == TM_DTYPE_F4_E2M1) {
        TM_ASSERT(n % 2 == 0);
        return n / 2;
    }
    return n * tm_dtype_size(dt);
}

const char *tm_dtype_name(tm_dtype dt) {
    switch (dt) {
    case TM_DTYPE_F32:
        return "f32";
    case TM_DTYPE_F16:
        return "f16";
    case TM_DTYPE_BF16:
        return "bf16";
    case TM_DTYPE_F8_E4M3:
        return "f8_e4m3";
    case TM_DTYPE_F8_E8M0:
        return "f8_e8m0";
    case TM_DTYPE_I8:
        return "i8";
    case TM_DTYPE_U8:
        return "u8";
    case TM_DTYPE_F4_E2M1:
        return "f4_e2m1";
    }
    return "?";
}

const char *tm_quant_name(tm_quant q) {
    switch (q) {
    case TM_QUANT_NONE:
        return "none";
    case TM_QUANT_FP8_BLOCK:
        return "fp8-block";
    case TM_QUANT_FP8_CHANNEL:
        return "fp8-channel";
    case TM_QUANT_FP8_TENSOR:
        return "fp8-tensor";
    case TM_QUANT_MXFP4:
        return "mxfp4";
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

uint8_t tm_f32_to_e4m3(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof(x));
    uint8_t sign = (uint8_t)((x >> 24) & 0x80u);
    x &= 0x7fffffffu;
    if (x >= 0x43f00000u) // NaN, inf and |f| >= 480 (what rounds past 448 with a 4th mantissa bit)
        return sign | 0x7fu;
    if (x < 0x3c800000u) {
        // Below 2^-6: a subnormal step of 2^-9. The scaled value is exact in f32 and nearbyintf
        // rounds half to even in the default mode; 8 lands on the smallest normal.
        float v = f32_from_bits(x) * 512.0f;
        return sign | (uint8_t)nearbyintf(v);
    }
    x += 0x7ffffu + ((x >> 20) & 1u); // round to nearest even on the 20 dropped bits
    return sign | (uint8_t)((x - (120u << 23)) >> 20);
}

uint8_t tm_f32_to_e2m1(float f) {
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    if (f != f)
        return 0;
    uint8_t sign = signbit(f) ? 8u : 0u;
    float a = fabsf(f);
    uint8_t best = 7;
    for (uint8_t k = 0; k < 7; k++) {
        float mid = 0.5f * (mag[k] + mag[k + 1]);     // exact: all are short binary fractions
        if (a < mid || (a == mid && (k & 1u) == 0)) { // a tie goes to the even code
            best = k;
            break;
        }
    }
    return sign | best;
}

uint8_t tm_e8m0_ceil_scale(float amax, float qmax) {
    if (!(amax > 0.0f) || !isfinite(amax))
        return 127;
    int k = -127;
    // least k with qmax * 2^k >= amax; ldexpf is exact here (qmax and amax are normal floats)
    while (k < 127 && (double)qmax * ldexp(1.0, k) < (double)amax)
        k++;
    return (uint8_t)(k + 127);
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
    case TM_DTYPE_F8_E4M3: {
        const uint8_t *s = (const uint8_t *)src + off;
        for (size_t i = 0; i < n; i++)
            out[i] = tm_e4m3_to_f32(s[i]);
        return;
    }
    case TM_DTYPE_F8_E8M0: {
        const uint8_t *s = (const uint8_t *)src + off;
        for (size_t i = 0; i < n; i++)
            out[i] = tm_e8m0_to_f32(s[i]);
        return;
    }
    case TM_DTYPE_I8: {
        const int8_t *s = (const int8_t *)src + off;
        for (size_t i = 0; i < n; i++)
            out[i] = (float)s[i];
        return;
    }
    case TM_DTYPE_U8: {
        const uint8_t *s = (const uint8_t *)src + off;
        for (size_t i = 0; i < n; i++)
            out[i] = (float)s[i];
        return;
    }
    case TM_DTYPE_F4_E2M1: {
        const uint8_t *s = src;
        for (size_t i = 0; i < n; i++) {
            size_t e = off + i;
            out[i] = tm_e2m1_to_f32((uint8_t)(s[e / 2] >> (4 * (e % 2))));
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

float tm_tensor_scale_at(const tm_tensor *t, size_t row, size_t col) {
    TM_ASSERT(t->quant != TM_QUANT_NONE && t->scale && t->n_dim >= 2);
    const uint64_t R = t->shape[t->n_dim - 2], C = t->shape[t->n_dim - 1];
    const uint64_t bo = t->qblock[0], bi = t->qblock[1];
    const uint64_t nbo = TM_CEIL_DIV(R, bo), nbi = TM_CEIL_DIV(C, bi);
    const uint64_t b = row / R, r = row % R;
    float s;
    tm_dtype_to_f32(t->scale, (tm_dtype)t->scale_dtype,
                    (size_t)((b * nbo + r / bo) * nbi + col / bi), 1, &s);
    return s;
}

float tm_tensor_get_f32(const tm_tensor *t, size_t i) {
    TM_ASSERT(t->data != NULL);
    TM_ASSERT(i < tm_tensor_n_elem(t));
    float f;
    tm_dtype_to_f32(t->data, t->dtype, i, 1, &f);
    if (t->quant != TM_QUANT_NONE) {
        const uint64_t C = t->shape[t->n_dim - 1];
        f *= tm_tensor_scale_at(t, i / C, i % C);
    }
    return f;
}

void tm_tensor_row_f32(const tm_tensor *t, size_t row, float *out) {
    TM_ASSERT(t->data != NULL);
    uint64_t n_col = t->n_dim ? t->shape[t->n_dim - 1] : 1;
    uint64_t n_row = n_col ? tm_tensor_n_elem(t) / n_col : 0;
    TM_ASSERT(row < n_row);
    tm_dtype_to_f32(t->data, t->dtype, row * n_col, n_col, out);
    if (t->quant == TM_QUANT_NONE)
        return;
    // value * scale, one fp32 product per element, a scale per qblock[1] columns
    const uint64_t bi = t->qblock[1];
    for (uint64_t c0 = 0; c0 < n_col; c0 += bi) {
        const float s = tm_tensor_scale_at(t, row, c0);
        const uint64_t c1 = TM_MIN(c0 + bi, n_col);
        for (uint64_t c = c0; c < c1; c++)
            out[c] *= s;
    }
}
