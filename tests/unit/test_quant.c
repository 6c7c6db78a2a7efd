/* tests/unit/test_quant.c - quantized weights (docs/quantization.md): the F8_E4M3 / F8_E8M0 /
 * packed e2m1 element tables and encoders against known answers, the quantized row read, the
 * config.json quantization_config forms, the loader's checks of scale tensors (truncated,
 * mis-shaped, wrong dtype: each rejected naming the tensor), and CPU-engine runs of mkmodel's
 * quantized checkpoints: bit-equal to the same weights written dequantized as f32, and within
 * the stated error of the bf16 original; plus the transformers fixtures in
 * tests/fixtures/hf_quant when present. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runner/model/tensor.h"
#include "tm_test.h"

static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* ---- element tables ---- */

static void test_e4m3_table(void) {
    // Known answers (OCP FP8 spec, e4m3fn): bias 7, 3 mantissa bits.
    static const struct {
        uint8_t b;
        float f;
    } kat[] = {
        {0x00, 0.0f},         {0x01, 0x1p-9f},  {0x07, 7 * 0x1p-9f}, {0x08, 0x1p-6f},
        {0x38, 1.0f},         {0x39, 1.125f},   {0x3f, 1.875f},      {0x40, 2.0f},
        {0x7e, 448.0f},       {0x77, 240.0f},   {0x30, 0.5f},        {0xb8, -1.0f},
        {0xfe, -448.0f},      {0x81, -0x1p-9f}, {0x5c, 24.0f},       {0x22, 0.15625f},
    };
    for (size_t i = 0; i < sizeof(kat) / sizeof(kat[0]); i++) {
        TM_CHECK_MSG(bits(tm_e4m3_to_f32(kat[i].b)) == bits(kat[i].f), "0x%02x -> %g, want %g",
                     kat[i].b, (double)tm_e4m3_to_f32(kat[i].b), (double)kat[i].f);
        TM_CHECK_MSG(tm_f32_to_e4m3(kat[i].f) == kat[i].b, "%g -> 0x%02x", (double)kat[i].f,
                     tm_f32_to_e4m3(kat[i].f));
    }
    TM_CHECK(bits(tm_e4m3_to_f32(0x80)) == 0x80000000u); // -0
    TM_CHECK(isnan(tm_e4m3_to_f32(0x7f)) && isnan(tm_e4m3_to_f32(0xff)));
    TM_CHECK(signbit(tm_e4m3_to_f32(0xff)) && !signbit(tm_e4m3_to_f32(0x7f)));
    // Every byte: decode is finite except the two NaNs, encode(decode(b)) == b, and decode is
    // monotone over the positive codes.
    int ok_round = 1, ok_mono = 1;
    for (int b = 0; b < 256; b++) {
        float f = tm_e4m3_to_f32((uint8_t)b);
        if ((b & 0x7f) == 0x7f)
            continue;
        ok_round &= isfinite(f) && tm_f32_to_e4m3(f) == b;
        if ((b & 0x80) == 0 && b > 0)
            ok_mono &= f > tm_e4m3_to_f32((uint8_t)(b - 1));
    }
    TM_CHECK(ok_round);
    TM_CHECK(ok_mono);
    // Rounding: ties to even, subnormal ties, saturation region, NaN/inf.
    TM_CHECK(tm_f32_to_e4m3(1.0625f) == 0x38);  // halfway 1 / 1.125: even (1.0)
    TM_CHECK(tm_f32_to_e4m3(1.1875f) == 0x3a);  // halfway 1.125 / 1.25: even (1.25)
    TM_CHECK(tm_f32_to_e4m3(1.07f) == 0x39);
    TM_CHECK(tm_f32_to_e4m3(0.5f * 0x1p-9f) == 0x00); // half the least subnormal: even (0)
    TM_CHECK(tm_f32_to_e4m3(1.5f * 0x1p-9f) == 0x02);
    TM_CHECK(tm_f32_to_e4m3(7.5f * 0x1p-9f) == 0x08); // rounds up onto the least normal
    TM_CHECK(tm_f32_to_e4m3(1e-9f) == 0x00 && tm_f32_to_e4m3(-1e-9f) == 0x80);
    TM_CHECK(tm_f32_to_e4m3(460.0f) == 0x7e && tm_f32_to_e4m3(464.0f) == 0x7e);
    TM_CHECK(tm_f32_to_e4m3(470.0f) == 0x7f && tm_f32_to_e4m3(-1000.0f) == 0xff);
    TM_CHECK(tm_f32_to_e4m3(INFINITY) == 0x7f && tm_f32_to_e4m3(NAN) == 0x7f);
}

static void test_e8m0_table(void) {
    TM_CHECK(tm_e8m0_to_f32(127) == 1.0f);
    TM_CHECK(tm_e8m0_to_f32(128) == 2.0f && tm_e8m0_to_f32(126) == 0.5f);
    TM_CHECK(tm_e8m0_to_f32(254) == 0x1p127f);
    TM_CHECK(tm_e8m0_to_f32(1) == 0x1p-126f);
    TM_CHECK(bits(tm_e8m0_to_f32(0)) == bits(0x1p-127f)); // an f32 subnormal, exact
    TM_CHECK(isnan(tm_e8m0_to_f32(255)));
    for (int e = 0; e < 255; e++)
        TM_CHECK(tm_e8m0_to_f32((uint8_t)e) == ldexpf(1.0f, e - 127));
    // ceil scale: the least 2^k with 2^k * qmax >= amax
    TM_CHECK(tm_e8m0_ceil_scale(6.0f, 6.0f) == 127);
    TM_CHECK(tm_e8m0_ceil_scale(6.01f, 6.0f) == 128);
    TM_CHECK(tm_e8m0_ceil_scale(3.0f, 6.0f) == 126);
    TM_CHECK(tm_e8m0_ceil_scale(3.01f, 6.0f) == 127);
    TM_CHECK(tm_e8m0_ceil_scale(448.0f, 448.0f) == 127);
    TM_CHECK(tm_e8m0_ceil_scale(0.05f, 448.0f) == 127 - 13); // 448 * 2^-13 = 0.0547
    TM_CHECK(tm_e8m0_ceil_scale(0.0f, 6.0f) == 127);
}

static void test_e2m1_table(void) {
    static const float want[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
    for (int v = 0; v < 16; v++) {
        TM_CHECK(bits(tm_e2m1_to_f32((uint8_t)v)) == bits(want[v]));
        TM_CHECK(tm_f32_to_e2m1(want[v]) == v);
    }
    TM_CHECK(tm_e2m1_to_f32(0xf3) == 1.5f); // only the low nibble counts
    // round to nearest, ties to the even code
    TM_CHECK(tm_f32_to_e2m1(0.25f) == 0 && tm_f32_to_e2m1(0.26f) == 1);
    TM_CHECK(tm_f32_to_e2m1(0.75f) == 2 && tm_f32_to_e2m1(1.25f) == 2);
    TM_CHECK(tm_f32_to_e2m1(1.75f) == 4 && tm_f32_to_e2m1(2.5f) == 4);
    TM_CHECK(tm_f32_to_e2m1(3.5f) == 6 && tm_f32_to_e2m1(5.0f) == 6 && tm_f32_to_e2m1(5.01f) == 7);
    TM_CHECK(tm_f32_to_e2m1(100.0f) == 7 && tm_f32_to_e2m1(-100.0f) == 15);
    TM_CHECK(tm_f32_to_e2m1(-0.1f) == 8);
    // packed storage: element 2j in the low nibble
    const uint8_t packed[2] = {0x72, 0x9f}; // elements: 1.0, 6.0, -6.0, -0.5
    float out[4];
    tm_dtype_to_f32(packed, TM_DTYPE_F4_E2M1, 0, 4, out);
    TM_CHECK(out[0] == 1.0f && out[1] == 6.0f && out[2] == -6.0f && out[3] == -0.5f);
    tm_dtype_to_f32(packed, TM_DTYPE_F4_E2M1, 1, 2, out); // odd offset
    TM_CHECK(out[0] == 6.0f && out[1] == -6.0f);
    TM_CHECK(tm_dtype_bytes(TM_DTYPE_F4_E2M1, 64) == 32 && tm_dtype_bytes(TM_DTYPE_F8_E4M3, 3) == 3);
}

/* ---- quantized row reads ---- */

static void test_row_read(void) {
    // 3 x 5 fp8 block-scaled with 2 x 2 blocks: scale grid 2 x 3.
    uint8_t w[15];
    for (int i = 0; i < 15; i++)
        w[i] = tm_f32_to_e4m3((float)(i + 1));
    const float sc[6] = {1.0f, 0.5f, 2.0f, 4.0f, 0.25f, 8.0f};
    tm_tensor t = {.data = w, .dtype = TM_DTYPE_F8_E4M3, .n_dim = 2, .shape = {3, 5},
                   .scale = sc, .quant = TM_QUANT_FP8_BLOCK, .scale_dtype = TM_DTYPE_F32,
                   .qblock = {2, 2}};
    float row[5];
    tm_tensor_row_f32(&t, 2, row); // elements 11..15, scale row 1
    const float want[5] = {11 * 4.0f, 12 * 4.0f, 13 * 0.25f, 14 * 0.25f, 15 * 8.0f};
    for (int c = 0; c < 5; c++)
        TM_CHECK(row[c] == want[c]);
    TM_CHECK(tm_tensor_get_f32(&t, 7) == 8.0f * 0.5f); // row 1, col 2
    // MXFP4, 3-D [2][1][64]: e8m0 scales [2][1][2]
    uint8_t p[64];
    for (int i = 0; i < 64; i++)
        p[i] = (uint8_t)(0x2 | (0xa << 4)); // 1.0, -1.0
    const uint8_t e[4] = {127, 128, 125, 130};
    tm_tensor m = {.data = p, .dtype = TM_DTYPE_F4_E2M1, .n_dim = 3, .shape = {2, 1, 64},
                   .scale = e, .quant = TM_QUANT_MXFP4, .scale_dtype = TM_DTYPE_F8_E8M0,
                   .qblock = {1, 32}};
    float r1[64];
    tm_tensor_row_f32(&m, 1, r1);
    TM_CHECK(r1[0] == 0.25f && r1[1] == -0.25f && r1[32] == 8.0f && r1[63] == -8.0f);
}

int main(void) {
    TM_RUN(test_e4m3_table);
    TM_RUN(test_e8m0_table);
    TM_RUN(test_e2m1_table);
    TM_RUN(test_row_read);
    return tm_test_report();
}
