/* tests/unit/test_quant.c - quantized weights (docs/quantization.md): the F8_E4M3 / F8_E8M0 /
 * packed e2m1 element tables and encoders against known answers, the quantized row read, the
 * config.json quantization_config forms, the loader's checks of scale tensors (truncated,
 * mis-shaped, wrong dtype: each rejected naming the tensor), and CPU-engine runs of mkmodel's
 * quantized checkpoints: bit-equal to the same weights written dequantized as f32, and within
 * the stated error of the bf16 original; quantization at load (engine.quantization "fp8"): the
 * same bytes as mkmodel's fp8-channel checkpoint and bit-equal CPU-engine logits, errors leaving
 * the model unchanged; plus the transformers fixtures in tests/fixtures/hf_quant when present. */
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "runner/engine/engine.h"
#include "runner/model/model.h"
#include "runner/model/model_dsv4.h"
#include "runner/model/quant.h"
#include "runner/model/safetensors.h"
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
        {0x00, 0.0f},    {0x01, 0x1p-9f},  {0x07, 7 * 0x1p-9f}, {0x08, 0x1p-6f},
        {0x38, 1.0f},    {0x39, 1.125f},   {0x3f, 1.875f},      {0x40, 2.0f},
        {0x7e, 448.0f},  {0x77, 240.0f},   {0x30, 0.5f},        {0xb8, -1.0f},
        {0xfe, -448.0f}, {0x81, -0x1p-9f}, {0x5c, 24.0f},       {0x22, 0.15625f},
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
    TM_CHECK(tm_f32_to_e4m3(1.0625f) == 0x38); // halfway 1 / 1.125: even (1.0)
    TM_CHECK(tm_f32_to_e4m3(1.1875f) == 0x3a); // halfway 1.125 / 1.25: even (1.25)
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
    static const float want[16] = {0,     0.5f,  1,  1.5f,  2,  3,  4,  6,
                                   -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
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
    TM_CHECK(tm_dtype_bytes(TM_DTYPE_F4_E2M1, 64) == 32 &&
             tm_dtype_bytes(TM_DTYPE_F8_E4M3, 3) == 3);
}

/* ---- quantized row reads ---- */

static void test_row_read(void) {
    // 3 x 5 fp8 block-scaled with 2 x 2 blocks: scale grid 2 x 3.
    uint8_t w[15];
    for (int i = 0; i < 15; i++)
        w[i] = tm_f32_to_e4m3((float)(i + 1));
    const float sc[6] = {1.0f, 0.5f, 2.0f, 4.0f, 0.25f, 8.0f};
    tm_tensor t = {.data = w,
                   .dtype = TM_DTYPE_F8_E4M3,
                   .n_dim = 2,
                   .shape = {3, 5},
                   .scale = sc,
                   .quant = TM_QUANT_FP8_BLOCK,
                   .scale_dtype = TM_DTYPE_F32,
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
    tm_tensor m = {.data = p,
                   .dtype = TM_DTYPE_F4_E2M1,
                   .n_dim = 3,
                   .shape = {2, 1, 64},
                   .scale = e,
                   .quant = TM_QUANT_MXFP4,
                   .scale_dtype = TM_DTYPE_F8_E8M0,
                   .qblock = {1, 32}};
    float r1[64];
    tm_tensor_row_f32(&m, 1, r1);
    TM_CHECK(r1[0] == 0.25f && r1[1] == -0.25f && r1[32] == 8.0f && r1[63] == -8.0f);
}

/* ---- quantization_config ---- */

static tm_rc parse_cfg(const char *js, int dsv4, tm_quant_cfg *q, tm_err *err) {
    json_error_t je;
    json_t *root = json_loads(js, 0, &je);
    TM_ASSERT(root);
    tm_rc rc = tm_quant_cfg_parse(root, dsv4, q, err);
    json_decref(root);
    return rc;
}

static void expect_cfg_err(const char *js, int dsv4, tm_rc want, const char *needle) {
    tm_quant_cfg q;
    tm_err err = {0};
    tm_rc rc = parse_cfg(js, dsv4, &q, &err);
    TM_CHECK_MSG(rc == want && strstr(err.msg, needle), "%s: rc %s, msg '%s', want '%s'", js,
                 tm_rc_name(rc), err.msg, needle);
}

static void test_config(void) {
    tm_quant_cfg q;
    tm_err err = {0};
    TM_CHECK_OK(parse_cfg("{}", 0, &q, &err), &err);
    TM_CHECK(q.method == TM_QMETHOD_NONE && q.weight == TM_QUANT_NONE);
    TM_CHECK_OK(parse_cfg("{\"quantization_config\":{\"quant_method\":\"fp8\",\"fmt\":\"e4m3\","
                          "\"activation_scheme\":\"dynamic\",\"weight_block_size\":[128,128]}}",
                          0, &q, &err),
                &err);
    TM_CHECK(q.method == TM_QMETHOD_FP8 && q.weight == TM_QUANT_FP8_BLOCK && q.block[0] == 128 &&
             q.block[1] == 128 && q.scale_dtype == TM_DTYPE_F32 && q.act == TM_QACT_DYNAMIC);
    TM_CHECK_OK(
        parse_cfg("{\"quantization_config\":{\"quant_method\":\"fp8\",\"weight_block_size\":"
                  "[64,32],\"scale_fmt\":\"ue8m0\"}}",
                  0, &q, &err),
        &err);
    TM_CHECK(q.block[0] == 64 && q.block[1] == 32 && q.scale_dtype == TM_DTYPE_F8_E8M0);
    const char *ct = "{\"quantization_config\":{\"quant_method\":\"compressed-tensors\",\"format\":"
                     "\"float-quantized\",\"ignore\":[\"lm_head\"],\"config_groups\":{\"group_0\":{"
                     "\"targets\":[\"Linear\"],\"weights\":{\"num_bits\":8,\"type\":\"float\","
                     "\"strategy\":\"%s\"%s},\"input_activations\":%s}}}}";
    char js[1024];
    snprintf(js, sizeof(js), ct, "channel", "",
             "{\"num_bits\":8,\"type\":\"float\",\"dynamic\":true,\"strategy\":\"token\"}");
    TM_CHECK_OK(parse_cfg(js, 0, &q, &err), &err);
    TM_CHECK(q.method == TM_QMETHOD_CT && q.weight == TM_QUANT_FP8_CHANNEL &&
             q.act == TM_QACT_DYNAMIC);
    snprintf(js, sizeof(js), ct, "tensor", "",
             "{\"num_bits\":8,\"type\":\"float\",\"dynamic\":false}");
    TM_CHECK_OK(parse_cfg(js, 0, &q, &err), &err);
    TM_CHECK(q.weight == TM_QUANT_FP8_TENSOR && q.act == TM_QACT_STATIC);
    snprintf(js, sizeof(js), ct, "block", ",\"block_structure\":[128,128]", "null");
    TM_CHECK_OK(parse_cfg(js, 0, &q, &err), &err);
    TM_CHECK(q.weight == TM_QUANT_FP8_BLOCK && q.block[0] == 128 && q.act == TM_QACT_NONE);
    // errors name the field
    snprintf(js, sizeof(js), ct, "group", "", "null");
    expect_cfg_err(js, 0, TM_E_INVAL, "strategy 'group'");
    snprintf(js, sizeof(js), ct, "block", "", "null");
    expect_cfg_err(js, 0, TM_E_PARSE, "block_structure");
    expect_cfg_err("{\"quantization_config\":{\"quant_method\":\"awq\"}}", 0, TM_E_INVAL,
                   "quant_method 'awq'");
    expect_cfg_err("{\"quantization_config\":{}}", 0, TM_E_PARSE, "quant_method is missing");
    expect_cfg_err("{\"quantization_config\":[1]}", 0, TM_E_PARSE, "not an object");
    expect_cfg_err("{\"quantization_config\":{\"quant_method\":\"fp8\",\"fmt\":\"e5m2\"}}", 0,
                   TM_E_INVAL, "fmt 'e5m2'");
    expect_cfg_err("{\"quantization_config\":{\"quant_method\":\"fp8\",\"scale_fmt\":\"fp32\"}}", 0,
                   TM_E_INVAL, "scale_fmt 'fp32'");
    expect_cfg_err("{\"quantization_config\":{\"quant_method\":\"fp8\",\"activation_scheme\":"
                   "\"static\"}}",
                   0, TM_E_INVAL, "activation_scheme 'static'");
    expect_cfg_err("{\"quantization_config\":{\"quant_method\":\"fp8\",\"weight_block_size\":"
                   "[128]}}",
                   0, TM_E_PARSE, "weight_block_size");
    expect_cfg_err("{\"quantization_config\":{\"quant_method\":\"fp8\",\"weight_block_size\":"
                   "[0,128]}}",
                   0, TM_E_PARSE, "weight_block_size[0]");
    expect_cfg_err("{\"quantization_config\":{\"quant_method\":\"compressed-tensors\","
                   "\"config_groups\":{\"a\":{\"weights\":{\"num_bits\":4,\"type\":\"int\"}}}}}",
                   0, TM_E_INVAL, "num_bits 4");
    expect_cfg_err("{\"quantization_config\":{\"quant_method\":\"compressed-tensors\","
                   "\"config_groups\":{\"a\":{\"weights\":{\"num_bits\":8,\"type\":\"int\"}}}}}",
                   0, TM_E_INVAL, "type 'int'");
    expect_cfg_err("{\"quantization_config\":{\"quant_method\":\"compressed-tensors\","
                   "\"config_groups\":{\"a\":{},\"b\":{}}}}",
                   0, TM_E_INVAL, "2 groups");
    expect_cfg_err("{\"quantization_config\":{\"quant_method\":\"compressed-tensors\","
                   "\"format\":\"pack-quantized\",\"config_groups\":{\"a\":{}}}}",
                   0, TM_E_INVAL, "format 'pack-quantized'");
    // DeepSeek-V4 expert_dtype
    TM_CHECK_OK(parse_cfg("{\"quantization_config\":{\"quant_method\":\"fp8\",\"scale_fmt\":"
                          "\"ue8m0\"},\"expert_dtype\":\"fp4\"}",
                          1, &q, &err),
                &err);
    TM_CHECK(q.expert == TM_QUANT_MXFP4 && q.weight == TM_QUANT_FP8_BLOCK);
    TM_CHECK_OK(parse_cfg("{\"quantization_config\":{\"quant_method\":\"fp8\"}}", 1, &q, &err),
                &err);
    TM_CHECK(q.expert == TM_QUANT_FP8_BLOCK);
    TM_CHECK_OK(parse_cfg("{\"quantization_config\":{\"quant_method\":\"fp8\",\"expert_dtype\":"
                          "\"fp4\"}}",
                          1, &q, &err),
                &err);
    TM_CHECK(q.expert == TM_QUANT_MXFP4);
    expect_cfg_err("{\"expert_dtype\":\"fp4\"}", 1, TM_E_INVAL, "expert_dtype fp4 needs");
    expect_cfg_err("{\"quantization_config\":{\"quant_method\":\"fp8\"},\"expert_dtype\":\"int4\"}",
                   1, TM_E_INVAL, "expert_dtype 'int4'");
    expect_cfg_err("{\"quantization_config\":{\"quant_method\":\"fp8\"},\"expert_dtype\":4}", 1,
                   TM_E_PARSE, "expert_dtype is not a string");
}

/* ---- models made with mkmodel ---- */

static int mkmodel(const char *out, const char *args) {
    const char *build = getenv("TM_BUILD");
    char cmd[4096];
    snprintf(cmd, sizeof(cmd), "'%s/mkmodel' --out '%s' %s >/dev/null", build ? build : ".", out,
             args);
    int st = system(cmd);
    TM_CHECK_MSG(st == 0, "mkmodel failed: %s", cmd);
    return st;
}

static char g_tmp[64];

static int have_mkmodel(void) {
    const char *build = getenv("TM_BUILD");
    char mk[4096];
    snprintf(mk, sizeof(mk), "%s/mkmodel", build ? build : ".");
    if (access(mk, X_OK) != 0) {
        fprintf(stderr, "  %s not built (build the mkmodel target): model tests skipped\n", mk);
        return 0;
    }
    return 1;
}

typedef enum mut_op { MUT_DROP, MUT_SHAPE, MUT_DTYPE, MUT_TRUNCATE } mut_op;

/* Rewrite dir/model.safetensors with tensor `name` changed by op: dropped, its first dim one
 * shorter (a truncated scale grid), its dtype changed (f32 <-> e8m0 <-> bf16 with the bytes
 * re-sized), or the file cut short inside its data. */
static void mutate(const char *dir, const char *name, mut_op op) {
    char path[4200];
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    if (op == MUT_TRUNCATE) {
        FILE *f = fopen(path, "r+b");
        TM_ASSERT(f && fseek(f, 0, SEEK_END) == 0);
        long n = ftell(f);
        fclose(f);
        TM_ASSERT(truncate(path, n - 3) == 0);
        return;
    }
    tm_st_file *f = NULL;
    tm_err err = {0};
    TM_ASSERT(tm_st_file_open(path, &f, &err) == TM_OK);
    size_t n = tm_st_file_n_tensor(f), k = 0;
    tm_st_wtensor *w = calloc(n, sizeof(*w));
    void *extra = NULL;
    for (size_t i = 0; i < n; i++) {
        const tm_st_tensor *t = tm_st_file_tensor(f, i);
        tm_st_wtensor x = {.name = t->name, .dtype = t->dtype, .n_dim = t->n_dim, .data = t->data};
        memcpy(x.shape, t->shape, sizeof(x.shape));
        if (!strcmp(t->name, name)) {
            if (op == MUT_DROP)
                continue;
            if (op == MUT_SHAPE)
                x.shape[0]--;
            if (op == MUT_DTYPE) {
                x.dtype = t->dtype == TM_DTYPE_F32 ? TM_DTYPE_BF16 : TM_DTYPE_F32;
                extra = calloc(t->n_elem, 4);
                x.data = extra;
                float one = 1.0f;
                uint16_t bf = tm_f32_to_bf16(1.0f);
                for (uint64_t e = 0; e < t->n_elem; e++) {
                    if (x.dtype == TM_DTYPE_F32)
                        memcpy((char *)extra + 4 * e, &one, 4);
                    else
                        memcpy((char *)extra + 2 * e, &bf, 2);
                }
            }
        }
        w[k++] = x;
    }
    TM_ASSERT(tm_st_file_write(path, w, k, NULL, 0, &err) == TM_OK);
    tm_st_file_close(f);
    free(extra);
    free(w);
}

static void expect_load_err(const char *dir, const char *needle, const char *what) {
    tm_model *m = NULL;
    tm_err err = {0};
    tm_rc rc = tm_model_load(dir, &m, &err);
    TM_CHECK_MSG(rc == TM_E_PARSE && strstr(err.msg, needle), "%s: rc %s: '%s', want '%s'", what,
                 tm_rc_name(rc), err.msg, needle);
    tm_model_destroy(m);
}

static void test_loader_rejects(void) {
    if (!have_mkmodel())
        return;
    char dir[256];
    struct {
        const char *args, *tensor, *needle;
        mut_op op;
    } cases[] = {
        // fp8 block-scaled: scale missing, truncated grid, wrong dtype, weight truncated
        {"--quant fp8-block --quant-block 32", "model.layers.0.self_attn.q_proj.weight_scale_inv",
         "'model.layers.0.self_attn.q_proj.weight_scale_inv' is missing", MUT_DROP},
        {"--quant fp8-block --quant-block 32", "model.layers.1.mlp.down_proj.weight_scale_inv",
         "'model.layers.1.mlp.down_proj.weight_scale_inv' (scale) has shape [1, 4], expected "
         "[2, 4]",
         MUT_SHAPE},
        {"--quant fp8-block --quant-block 32", "model.layers.1.mlp.up_proj.weight_scale_inv",
         "'model.layers.1.mlp.up_proj.weight_scale_inv' (scale) has dtype bf16, expected F32",
         MUT_DTYPE},
        {"--quant fp8-block", "model.layers.0.mlp.up_proj.weight",
         "'model.layers.0.mlp.up_proj.weight' has shape [127, 64], expected [128, 64]", MUT_SHAPE},
        {"--quant fp8-block", "", "past the data section", MUT_TRUNCATE},
        // ue8m0 scales must be F8_E8M0
        {"--quant fp8-block-ue8m0", "model.layers.0.self_attn.o_proj.weight_scale_inv",
         "'model.layers.0.self_attn.o_proj.weight_scale_inv' (scale) has dtype f32, expected "
         "F8_E8M0",
         MUT_DTYPE},
        // compressed-tensors
        {"--quant fp8-channel", "model.layers.0.self_attn.k_proj.weight_scale",
         "'model.layers.0.self_attn.k_proj.weight_scale' (scale) has shape [31, 1], expected "
         "[32, 1]",
         MUT_SHAPE},
        {"--quant fp8-tensor", "model.layers.0.self_attn.v_proj.weight_scale",
         "'model.layers.0.self_attn.v_proj.weight_scale' is missing", MUT_DROP},
        {"--quant fp8-channel --ct-static 1", "model.layers.1.mlp.gate_proj.input_scale",
         "'model.layers.1.mlp.gate_proj.input_scale' is missing", MUT_DROP},
        // DeepSeek-V4 MXFP4 experts
        {"--arch deepseek_v4 --quant fp8-block-ue8m0 --quant-block 32 --expert-dtype fp4",
         "model.layers.1.mlp.experts.down_proj_scale_inv",
         "'model.layers.1.mlp.experts.down_proj_scale_inv' (scale) has shape [3, 64, 4], "
         "expected [4, 64, 4]",
         MUT_SHAPE},
        {"--arch deepseek_v4 --quant fp8-block-ue8m0 --quant-block 32 --expert-dtype fp4",
         "model.layers.0.mlp.experts.gate_up_proj_scale_inv",
         "'model.layers.0.mlp.experts.gate_up_proj_scale_inv' (scale) has dtype f32, expected "
         "F8_E8M0",
         MUT_DTYPE},
        {"--arch deepseek_v4 --quant fp8-block-ue8m0 --quant-block 32 --expert-dtype fp4",
         "model.layers.0.mlp.experts.gate_up_proj",
         "'model.layers.0.mlp.experts.gate_up_proj' (packed FP4, two values a byte) has shape "
         "[3, 256, 32], expected [4, 256, 32]",
         MUT_SHAPE},
        {"--arch deepseek_v4 --quant fp8-block --quant-block 16",
         "model.layers.1.self_attn.q_b_proj.weight_scale_inv",
         "'model.layers.1.self_attn.q_b_proj.weight_scale_inv' is missing", MUT_DROP},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        snprintf(dir, sizeof(dir), "%s/rej%zu", g_tmp, i);
        if (mkmodel(dir, cases[i].args))
            continue;
        tm_model *m = NULL;
        tm_err err = {0};
        TM_CHECK_OK(tm_model_load(dir, &m, &err), &err); // the writer's output loads
        TM_CHECK(m && m->cfg.quant.method != TM_QMETHOD_NONE && tm_model_is_quantized(m));
        if (m)
            TM_CHECK_MSG(tm_model_check_weights(m, "plain engine", &err) == TM_E_INVAL ||
                             m->cfg.arch == TM_ARCH_DEEPSEEK_V4,
                         "an engine reading plain arrays must refuse quantized weights");
        tm_model_destroy(m);
        mutate(dir, cases[i].tensor, cases[i].op);
        expect_load_err(dir, cases[i].needle, cases[i].args);
    }
    // F8 weights with no quantization_config; a stray scale beside a bf16 weight
    snprintf(dir, sizeof(dir), "%s/rej_nocfg", g_tmp);
    if (mkmodel(dir, "--quant fp8-block") == 0) {
        char cmd[512];
        snprintf(cmd, sizeof(cmd),
                 "python3 -c \"import json;p='%s/config.json';c=json.load(open(p));"
                 "c.pop('quantization_config');json.dump(c,open(p,'w'))\"",
                 dir);
        if (system(cmd) == 0)
            expect_load_err(dir, "is F8_E4M3 but config.json has no quantization_config",
                            "no quantization_config");
    }
}

/* ---- CPU engine runs ---- */

#define N_GEN 16

/* Greedy-decode n_gen tokens after prompt on the CPU engine (teacher-forced with force[] when
 * given); logits[g * n_vocab ...] of each step, ids[g] the argmax. 0 on success. */
static int run_greedy_q(const char *dir, uint32_t qload_threads, const uint32_t *prompt,
                        uint32_t n_prompt, const uint32_t *force, uint32_t n_gen, float *logits,
                        uint32_t *ids, uint32_t *n_vocab) {
    tm_model *m = NULL;
    tm_engine *eng = NULL;
    tm_err err = {0};
    int bad = 1;
    TM_CHECK_OK(tm_model_load(dir, &m, &err), &err);
    if (!m)
        return 1;
    if (qload_threads) { // engine.quantization "fp8": quantize at load
        tm_rc rc = tm_model_quantize_fp8(m, qload_threads, &err);
        TM_CHECK_OK(rc, &err);
        if (rc) {
            tm_model_destroy(m);
            return 1;
        }
    }
    const uint32_t nv = m->cfg.n_vocab, total = n_prompt + n_gen;
    *n_vocab = nv;
    tm_engine_opts o = {.n_threads = 2,
                        .block_size = 16,
                        .n_kv_block = TM_CEIL_DIV(total, 16),
                        .max_seqs = 1,
                        .max_batched_tokens = n_prompt};
    TM_CHECK_OK(tm_engine_cpu_create(m, &o, &eng, &err), &err);
    if (eng) {
        uint32_t toks[512], table[64];
        TM_ASSERT(total <= 512 && o.n_kv_block <= 64);
        for (uint32_t i = 0; i < o.n_kv_block; i++)
            table[i] = o.n_kv_block - 1 - i;
        memcpy(toks, prompt, n_prompt * sizeof(uint32_t));
        bad = 0;
        for (uint32_t g = 0; g < n_gen && !bad; g++) {
            tm_batch_seq s = {.tokens = g == 0 ? toks : toks + n_prompt + g - 1,
                              .n_tok = g == 0 ? n_prompt : 1,
                              .pos = g == 0 ? 0 : n_prompt + g - 1,
                              .block_table = table,
                              .n_block = o.n_kv_block,
                              .want_logits = 1};
            tm_batch b = {.seqs = &s, .n_seq = 1};
            float *row = logits + (size_t)g * nv;
            tm_rc rc = tm_engine_forward(eng, &b, row, &err);
            TM_CHECK_OK(rc, &err);
            bad = rc != TM_OK;
            uint32_t arg = 0;
            for (uint32_t v = 1; v < nv; v++)
                if (row[v] > row[arg])
                    arg = v;
            ids[g] = arg;
            toks[n_prompt + g] = force ? force[g] : arg;
        }
    }
    tm_engine_destroy(eng);
    tm_model_destroy(m);
    return bad;
}

static int run_greedy(const char *dir, const uint32_t *prompt, uint32_t n_prompt,
                      const uint32_t *force, uint32_t n_gen, float *logits, uint32_t *ids,
                      uint32_t *n_vocab) {
    return run_greedy_q(dir, 0, prompt, n_prompt, force, n_gen, logits, ids, n_vocab);
}

typedef struct qcase {
    const char *name, *args;
    double w_fp8, w_fp4; /* bounds on the relative RMS weight error of FP8 / MXFP4 linears */
    double rel_rms;      /* bound on RMS(logit - bf16 logit) / RMS(bf16 logit), teacher-forced */
} qcase;

/* Relative RMS error of every quantized linear of q (dequantized rows) against the same tensor
 * of the bf16 model b; the worst FP8 and MXFP4 tensors in *w8, *w4. */
static void weight_error(const tm_model *q, const tm_model *b, double *w8, double *w4) {
    const tm_tensor *tq, *tb;
    size_t n_t;
    *w8 = *w4 = 0.0;
    const tm_dsv4 *dq = tm_model_dsv4(q), *db = tm_model_dsv4(b);
    for (uint32_t l = 0; l < q->cfg.n_layer; l++) {
        if (dq) {
            tq = (const tm_tensor *)&dq->layers[l];
            tb = (const tm_tensor *)&db->layers[l];
            n_t = sizeof(tm_dsv4_layer) / sizeof(tm_tensor);
        } else {
            tq = (const tm_tensor *)&q->layers[l];
            tb = (const tm_tensor *)&b->layers[l];
            n_t = sizeof(tm_layer_w) / sizeof(tm_tensor);
        }
        for (size_t i = 0; i < n_t; i++) {
            if (tq[i].quant == TM_QUANT_NONE || !tq[i].data)
                continue;
            const uint64_t C = tq[i].shape[tq[i].n_dim - 1], R = tm_tensor_n_elem(&tq[i]) / C;
            float *rq = malloc(C * sizeof(float)), *rb = malloc(C * sizeof(float));
            double num = 0.0, den = 0.0;
            for (uint64_t r = 0; r < R; r++) {
                tm_tensor_row_f32(&tq[i], (size_t)r, rq);
                tm_tensor_row_f32(&tb[i], (size_t)r, rb);
                for (uint64_t c = 0; c < C; c++) {
                    num += ((double)rq[c] - rb[c]) * ((double)rq[c] - rb[c]);
                    den += (double)rb[c] * rb[c];
                }
            }
            double e = sqrt(num / den);
            if (tq[i].quant == TM_QUANT_MXFP4)
                *w4 = fmax(*w4, e);
            else
                *w8 = fmax(*w8, e);
            free(rq);
            free(rb);
        }
    }
}

static void test_engine_quant(void) {
    if (!have_mkmodel())
        return;
    const char *llama = "--layers 3 --hidden 256 --heads 8 --kv-heads 4 --ff 512 --vocab 1024 "
                        "--seed 7";
    const char *ds = "--arch deepseek_v4 --layers 3 --dsv4-layers shc --dsv4-mlp hmm --hidden 128 "
                     "--heads 4 --head-dim 32 --ff 64 --vocab 512 --experts 8 --experts-used 2 "
                     "--q-lora 64 --o-lora 32 --o-groups 2 --index-heads 4 --index-dim 32 "
                     "--index-topk 4 --rope-dim 8 --window 8 --hca-ratio 8 --hc 2 --seed 9";
    // Bounds: e4m3 keeps 3 mantissa bits (about 2.7% RMS relative error on Gaussian weights),
    // e2m1 one bit with a power-of-two scale per 32 (about 10-12%); the logit bounds are about
    // twice what was measured (docs/quantization.md), far below what a wrong scale index or
    // nibble order gives (errors of order 1).
    const qcase cases[] = {
        {"llama fp8-block 128x128", "--quant fp8-block", 0.035, 0, 0.25},
        {"llama fp8-block ue8m0", "--quant fp8-block-ue8m0", 0.035, 0, 0.25},
        {"llama fp8-block 32x32", "--quant fp8-block --quant-block 32", 0.035, 0, 0.25},
        {"llama fp8-channel (compressed-tensors)", "--quant fp8-channel", 0.035, 0, 0.25},
        {"llama fp8-tensor (compressed-tensors, static)", "--quant fp8-tensor --ct-static 1", 0.035,
         0, 0.25},
        {"dsv4 fp8 dense + mxfp4 experts", "--quant fp8-block-ue8m0 --expert-dtype fp4", 0.035,
         0.13, 0.9},
        {"dsv4 fp8 dense + fp8 experts", "--quant fp8-block", 0.035, 0, 0.6},
    };
    uint32_t prompt[40];
    uint64_t x = 12345;
    for (int i = 0; i < 40; i++)
        prompt[i] = (uint32_t)((x = x * 6364136223846793005ull + 1442695040888963407ull) >> 33);
    float *lq = malloc((size_t)N_GEN * 1024 * sizeof(float));
    float *ld = malloc((size_t)N_GEN * 1024 * sizeof(float));
    float *lb = malloc((size_t)N_GEN * 1024 * sizeof(float));
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        const int is_ds = strstr(cases[c].name, "dsv4") != NULL;
        const char *base = is_ds ? ds : llama;
        const uint32_t nvv = is_ds ? 512 : 1024;
        uint32_t p[40];
        for (int i = 0; i < 40; i++)
            p[i] = prompt[i] % nvv;
        char dq[256], dd[256], db[256], args[1024];
        snprintf(dq, sizeof(dq), "%s/q%zu", g_tmp, c);
        snprintf(dd, sizeof(dd), "%s/q%zu_f32", g_tmp, c);
        snprintf(db, sizeof(db), "%s/q%zu_bf16", g_tmp, c);
        snprintf(args, sizeof(args), "%s %s --dequant-copy '%s'", base, cases[c].args, dd);
        if (mkmodel(dq, args))
            continue;
        if (mkmodel(db, base))
            continue;
        uint32_t iq[N_GEN], id[N_GEN], ib[N_GEN], ibf[N_GEN], nv = 0;
        if (run_greedy(dq, p, 40, NULL, N_GEN, lq, iq, &nv) ||
            run_greedy(dd, p, 40, NULL, N_GEN, ld, id, &nv))
            continue;
        // 1. bit for bit: the quantized checkpoint and its dequantized f32 copy
        TM_CHECK_MSG(!memcmp(lq, ld, (size_t)N_GEN * nv * sizeof(float)) &&
                         !memcmp(iq, id, sizeof(iq)),
                     "%s: quantized and dequantized-f32 logits differ", cases[c].name);
        // 2. the error against the bf16 original: weights; logits teacher-forced on the
        // quantized model's tokens; greedy agreement (free-running prefix, and per step with
        // the same context)
        tm_model *mq = NULL, *mb = NULL;
        tm_err err = {0};
        double w8 = 0, w4 = 0;
        if (tm_model_load(dq, &mq, &err) == TM_OK && tm_model_load(db, &mb, &err) == TM_OK)
            weight_error(mq, mb, &w8, &w4);
        tm_model_destroy(mq);
        tm_model_destroy(mb);
        if (run_greedy(db, p, 40, NULL, N_GEN, lb, ib, &nv) ||
            run_greedy(db, p, 40, iq, N_GEN, lb, ibf, &nv))
            continue;
        double mx = 0.0, se = 0.0, sr = 0.0;
        for (size_t i = 0; i < (size_t)N_GEN * nv; i++) {
            mx = fmax(mx, fabs((double)lq[i] - lb[i]));
            se += ((double)lq[i] - lb[i]) * ((double)lq[i] - lb[i]);
            sr += (double)lb[i] * lb[i];
        }
        const double rel = sqrt(se / sr);
        uint32_t agree = 0, same = 0;
        while (agree < N_GEN && iq[agree] == ib[agree])
            agree++;
        for (uint32_t g = 0; g < N_GEN; g++)
            same += iq[g] == ibf[g];
        fprintf(stderr,
                "  %-46s weights rel RMS err fp8 %.4f fp4 %.4f; logits max abs err %.3f, rel RMS "
                "%.4f; greedy prefix %u/%d, same-context top-1 %u/%d\n",
                cases[c].name, w8, w4, mx, rel, agree, N_GEN, same, N_GEN);
        TM_CHECK_MSG(w8 > 0.005 && w8 <= cases[c].w_fp8, "%s: fp8 weight error %g", cases[c].name,
                     w8);
        TM_CHECK_MSG(cases[c].w_fp4 == 0 || (w4 > 0.02 && w4 <= cases[c].w_fp4),
                     "%s: fp4 weight error %g", cases[c].name, w4);
        TM_CHECK_MSG(rel <= cases[c].rel_rms, "%s: relative logit error %g > %g", cases[c].name,
                     rel, cases[c].rel_rms);
    }
    free(lq);
    free(ld);
    free(lb);
}

/* ---- quantization at load (engine.quantization "fp8") ---- */

static tm_tensor *lin_at(tm_model *m, uint32_t l, int i) {
    tm_layer_w *L = &m->layers[l];
    tm_tensor *lin[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
    return lin[i];
}

/* The linears of a (quantized at load) and b (mkmodel's fp8-channel checkpoint) are the same
 * views: scheme, shape, codes and scales byte for byte. Returns the number of differing ones. */
static int same_fp8_views(tm_model *a, tm_model *b, const char *what) {
    int n_bad = 0;
    for (uint32_t l = 0; l < a->cfg.n_layer; l++)
        for (int i = 0; i < 7; i++) {
            const tm_tensor *x = lin_at(a, l, i), *y = lin_at(b, l, i);
            const uint64_t R = x->shape[0], C = x->shape[1];
            int ok = x->quant == TM_QUANT_FP8_CHANNEL && y->quant == TM_QUANT_FP8_CHANNEL &&
                     x->dtype == TM_DTYPE_F8_E4M3 && y->dtype == x->dtype && x->n_dim == 2 &&
                     R == y->shape[0] && C == y->shape[1] && x->qblock[0] == 1 &&
                     x->qblock[1] == C && y->qblock[0] == 1 && y->qblock[1] == C &&
                     x->scale_dtype == TM_DTYPE_F32 && y->scale_dtype == TM_DTYPE_F32;
            ok = ok && !memcmp(x->data, y->data, (size_t)(R * C)) &&
                 !memcmp(x->scale, y->scale, (size_t)R * sizeof(float));
            TM_CHECK_MSG(ok, "%s: layer %u linear %d differs from mkmodel's fp8-channel", what, l,
                         i);
            n_bad += !ok;
        }
    return n_bad;
}

static void test_quantize_at_load(void) {
    if (!have_mkmodel())
        return;
    // Odd sizes (hidden 200, ff 328) so row chunks and threads do not divide evenly; an untied
    // lm_head and Qwen2 biases stay as stored.
    const char *base = "--arch qwen2 --layers 3 --hidden 200 --heads 5 --kv-heads 1 --head-dim 40 "
                       "--ff 328 --vocab 700 --seed 11 --tied 0";
    const char *dts[] = {"bf16", "f16", "f32"};
    uint32_t prompt[40];
    for (int i = 0; i < 40; i++)
        prompt[i] = (uint32_t)(i * 37 + 5) % 700;
    float *la = malloc((size_t)N_GEN * 700 * sizeof(float));
    float *lb = malloc((size_t)N_GEN * 700 * sizeof(float));
    for (size_t d = 0; d < sizeof(dts) / sizeof(dts[0]); d++) {
        char dp[256], dq[256], args[512];
        snprintf(dp, sizeof(dp), "%s/ql_%s", g_tmp, dts[d]);
        snprintf(dq, sizeof(dq), "%s/ql_%s_fp8", g_tmp, dts[d]);
        snprintf(args, sizeof(args), "%s --dtype %s", base, dts[d]);
        if (mkmodel(dp, args))
            continue;
        snprintf(args, sizeof(args), "%s --dtype %s --quant fp8-channel", base, dts[d]);
        if (mkmodel(dq, args))
            continue;
        // 1. the views: equal to mkmodel's checkpoint for 1 and 3 threads
        tm_model *a = NULL, *b = NULL;
        tm_err err = {0};
        TM_CHECK_OK(tm_model_load(dq, &b, &err), &err);
        for (uint32_t nt = 1; b && nt <= 3; nt += 2) {
            TM_CHECK_OK(tm_model_load(dp, &a, &err), &err);
            if (!a)
                break;
            const void *embd = a->embd.data, *head = a->lm_head.data, *norm = a->out_norm.data;
            TM_CHECK(!tm_model_is_quantized(a));
            TM_CHECK_OK(tm_model_quantize_fp8(a, nt, &err), &err);
            TM_CHECK(tm_model_is_quantized(a) && a->qbuf != NULL);
            same_fp8_views(a, b, dts[d]);
            TM_CHECK(a->cfg.quant.method == b->cfg.quant.method &&
                     a->cfg.quant.weight == b->cfg.quant.weight &&
                     a->cfg.quant.act == b->cfg.quant.act);
            TM_CHECK(a->embd.data == embd && a->lm_head.data == head && a->out_norm.data == norm &&
                     a->embd.quant == TM_QUANT_NONE && a->lm_head.quant == TM_QUANT_NONE);
            TM_CHECK_OK(tm_model_check_weights_quant(a, "test", &err), &err);
            // quantizing twice: already quantized
            TM_CHECK(tm_model_quantize_fp8(a, nt, &err) == TM_E_INVAL &&
                     strstr(err.msg, "already quantized"));
            tm_model_destroy(a);
            a = NULL;
        }
        // 2. an FP8 checkpoint with engine.quantization "fp8": refused, naming the scheme
        if (b) {
            TM_CHECK(tm_model_quantize_fp8_check(b, &err) == TM_E_INVAL);
            TM_CHECK_MSG(strstr(err.msg, "already quantized (quant_method compressed-tensors, "
                                         "fp8-channel weights)") != NULL,
                         "%s", err.msg);
        }
        tm_model_destroy(b);
        // 3. the CPU engine: logits bit for bit (bf16 only; the views are equal for all)
        if (d == 0) {
            uint32_t ia[N_GEN], ib[N_GEN], nv = 0;
            if (!run_greedy_q(dp, 2, prompt, 40, NULL, N_GEN, la, ia, &nv) &&
                !run_greedy(dq, prompt, 40, NULL, N_GEN, lb, ib, &nv))
                TM_CHECK_MSG(!memcmp(la, lb, (size_t)N_GEN * nv * sizeof(float)) &&
                                 !memcmp(ia, ib, sizeof(ia)),
                             "quantized at load and mkmodel fp8-channel: logits differ");
        }
    }
    free(la);
    free(lb);

    // 4. errors leave the model unchanged: every allocation failing in turn, and a row with an
    // infinity (a copy of layer 1's o_proj with one inf in row 3).
    char dp[256];
    snprintf(dp, sizeof(dp), "%s/ql_bf16", g_tmp);
    tm_model *a = NULL;
    tm_err err = {0};
    TM_CHECK_OK(tm_model_load(dp, &a, &err), &err);
    if (!a)
        return;
    for (long n = 1; n <= 8; n++) {
        tm_fault_set(TM_FAULT_ALLOC, n);
        tm_rc rc = tm_model_quantize_fp8(a, 2, &err);
        tm_fault_set(TM_FAULT_ALLOC, 0);
        TM_CHECK_MSG(rc == TM_OK || rc == TM_E_NOMEM, "alloc %ld: %s", n, tm_rc_name(rc));
        if (rc == TM_OK)
            break; // later allocations are worker buffers, which the others cover
        TM_CHECK(!a->qbuf && !tm_model_is_quantized(a) && a->cfg.quant.method == TM_QMETHOD_NONE);
    }
    tm_model_destroy(a);
    a = NULL;
    TM_CHECK_OK(tm_model_load(dp, &a, &err), &err);
    if (!a)
        return;
    tm_tensor *wo = &a->layers[1].wo, saved = *wo;
    const size_t n_wo = (size_t)tm_tensor_n_elem(wo);
    uint16_t *copy = malloc(n_wo * 2);
    memcpy(copy, wo->data, n_wo * 2);
    copy[3 * wo->shape[1] + 7] = 0x7f80; // +inf
    wo->data = copy;
    TM_CHECK(tm_model_quantize_fp8(a, 3, &err) == TM_E_INVAL);
    TM_CHECK_MSG(strstr(err.msg, "layer 1 o_proj") && strstr(err.msg, "infinite"), "%s", err.msg);
    TM_CHECK(!a->qbuf && a->layers[1].wo.data == copy && a->layers[0].wq.quant == TM_QUANT_NONE);
    *wo = saved;
    free(copy);
    tm_model_destroy(a);

    // 5. DeepSeek-V4: refused, saying why
    char ds[256];
    snprintf(ds, sizeof(ds), "%s/ql_dsv4", g_tmp);
    if (mkmodel(ds, "--arch deepseek_v4 --layers 3 --dsv4-layers shc --dsv4-mlp hmm --hidden 128 "
                    "--heads 4 --head-dim 32 --ff 64 --vocab 512 --experts 8 --experts-used 2 "
                    "--q-lora 64 --o-lora 32 --o-groups 2 --index-heads 4 --index-dim 32 "
                    "--index-topk 4 --rope-dim 8 --window 8 --hca-ratio 8 --hc 2 --seed 9"))
        return;
    a = NULL;
    TM_CHECK_OK(tm_model_load(ds, &a, &err), &err);
    if (a) {
        TM_CHECK(tm_model_quantize_fp8(a, 2, &err) == TM_E_INVAL);
        TM_CHECK_MSG(strstr(err.msg, "deepseek_v4") && strstr(err.msg, "block-scaled"), "%s",
                     err.msg);
    }
    tm_model_destroy(a);
}

/* ---- transformers / Python-dequant fixtures (tests/oracles/hf/make_quant_fixtures.py) ---- */

static void check_fixture(const char *path) {
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    TM_CHECK_MSG(root != NULL, "%s: %s", path, je.text);
    if (!root)
        return;
    json_t *args = json_object_get(root, "mkmodel_args"),
           *prompt = json_object_get(root, "prompt_ids");
    json_t *greedy = json_object_get(root, "greedy_ids"), *logits = json_object_get(root, "logits");
    TM_CHECK(json_is_array(args) && json_is_array(prompt) && json_is_array(greedy) &&
             json_is_array(logits) && json_array_size(logits) == json_array_size(greedy));
    if (!json_is_array(args) || !json_is_array(prompt) || !json_is_array(greedy) ||
        !json_is_array(logits) || json_array_size(prompt) > 256 || json_array_size(greedy) > 64) {
        json_decref(root);
        return;
    }
    char dir[256], a[2048] = "";
    static int k;
    snprintf(dir, sizeof(dir), "%s/fx%d", g_tmp, k++);
    size_t at = 0;
    for (size_t i = 0; i < json_array_size(args); i++)
        at += (size_t)snprintf(a + at, sizeof(a) - at, " '%s'",
                               json_string_value(json_array_get(args, i)));
    if (mkmodel(dir, a)) {
        json_decref(root);
        return;
    }
    uint32_t p[256], f[64], ids[64], nv = 0;
    const uint32_t n_p = (uint32_t)json_array_size(prompt), n_g = (uint32_t)json_array_size(greedy);
    for (uint32_t i = 0; i < n_p; i++)
        p[i] = (uint32_t)json_integer_value(json_array_get(prompt, i));
    for (uint32_t i = 0; i < n_g; i++)
        f[i] = (uint32_t)json_integer_value(json_array_get(greedy, i));
    float *out = malloc((size_t)n_g * 65536 * sizeof(float));
    if (run_greedy(dir, p, n_p, f, n_g, out, ids, &nv) == 0) {
        double worst = 0.0;
        int greedy_ok = 1;
        for (uint32_t g = 0; g < n_g; g++) {
            json_t *row = json_array_get(logits, g);
            TM_CHECK(json_array_size(row) == nv);
            if (json_array_size(row) != nv)
                break;
            double mx = 0.0, mb = 0.0;
            for (uint32_t v = 0; v < nv; v++) {
                double hf = json_number_value(json_array_get(row, v));
                mx = fmax(mx, fabs(out[(size_t)g * nv + v] - hf));
                mb = fmax(mb, fabs(hf));
            }
            worst = fmax(worst, mb > 0 ? mx / mb : mx);
            greedy_ok &= ids[g] == f[g];
        }
        // the same bound as the bf16 fixtures of test_engine (fp32 math on both sides)
        TM_CHECK_MSG(worst < 1e-4, "%s: max rel err %g", path, worst);
        TM_CHECK_MSG(greedy_ok, "%s: greedy tokens differ from the fixture", path);
        fprintf(stderr, "  %s: max rel err %.3g, greedy %s\n", path, worst,
                greedy_ok ? "equal" : "DIFFERENT");
    }
    free(out);
    json_decref(root);
}

static void test_fixtures(void) {
    if (!have_mkmodel())
        return;
    const char *src = getenv("TM_SRC");
    char dir[4096];
    snprintf(dir, sizeof(dir), "%s/tests/fixtures/hf_quant", src ? src : ".");
    DIR *d = opendir(dir);
    int n = 0;
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            size_t l = strlen(e->d_name);
            if (l > 5 && !strcmp(e->d_name + l - 5, ".json")) {
                char path[4400];
                snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
                check_fixture(path);
                n++;
            }
        }
        closedir(d);
    }
    if (n == 0)
        fprintf(stderr,
                "  no quantized fixtures in %s (tests/oracles/hf/make_quant_fixtures.py "
                "makes them): that part skipped\n",
                dir);
}

int main(void) {
    snprintf(g_tmp, sizeof(g_tmp), "/tmp/tm_test_quant_XXXXXX");
    TM_ASSERT(mkdtemp(g_tmp));
    TM_RUN(test_e4m3_table);
    TM_RUN(test_e8m0_table);
    TM_RUN(test_e2m1_table);
    TM_RUN(test_row_read);
    TM_RUN(test_config);
    TM_RUN(test_loader_rejects);
    TM_RUN(test_engine_quant);
    TM_RUN(test_quantize_at_load);
    TM_RUN(test_fixtures);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_tmp);
    if (system(cmd) != 0)
        fprintf(stderr, "  could not remove %s\n", g_tmp);
    return tm_test_report();
}
