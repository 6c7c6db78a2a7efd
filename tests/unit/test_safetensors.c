/* tests/unit/test_safetensors.c - the safetensors reader and writer (RELIABILITY.md row 12): a
 * round trip through tm_st_file_write, every truncation of a small valid file, handcrafted corrupt
 * headers (each must be a clean TM_E_PARSE naming the rule), shard sets with an index, and an
 * allocation-failure sweep. Files live in a fresh temp dir that is removed at the end. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "runner/model/safetensors.h"
#include "tm_test.h"

static char g_dir[64];

static void path_of(char *out, size_t cap, const char *name) {
    snprintf(out, cap, "%s/%s", g_dir, name);
}

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *fp = fopen(path, "wb");
    TM_ASSERT(fp);
    if (n)
        TM_ASSERT(fwrite(p, 1, n, fp) == n);
    TM_ASSERT(fclose(fp) == 0);
}

static unsigned char *read_bytes(const char *path, size_t *n) {
    FILE *fp = fopen(path, "rb");
    TM_ASSERT(fp);
    fseek(fp, 0, SEEK_END);
    long len = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    unsigned char *p = malloc((size_t)len + 1);
    TM_ASSERT(p && fread(p, 1, (size_t)len, fp) == (size_t)len);
    fclose(fp);
    *n = (size_t)len;
    return p;
}

/* Test data: three small tensors of each dtype, a scalar and an empty one. */
static float g_a[6] = {1, -2, 3.5f, 0, 1e-3f, -7};
static uint16_t g_b[4] = {0x3f80, 0xbf80, 0x4000, 0x0000}; /* bf16 1, -1, 2, 0 */
static uint16_t g_c[3] = {0x3c00, 0x0001, 0x7c00};         /* f16 1, 2^-24, inf */
static float g_s[1] = {42};

static size_t make_valid(const char *name) {
    tm_st_wtensor t[] = {
        {.name = "b", .dtype = TM_DTYPE_BF16, .n_dim = 1, .shape = {4}, .data = g_b},
        {.name = "a", .dtype = TM_DTYPE_F32, .n_dim = 2, .shape = {2, 3}, .data = g_a},
        {.name = "c.f16", .dtype = TM_DTYPE_F16, .n_dim = 1, .shape = {3}, .data = g_c},
        {.name = "empty", .dtype = TM_DTYPE_F32, .n_dim = 2, .shape = {0, 5}, .data = g_a},
        {.name = "scalar", .dtype = TM_DTYPE_F32, .n_dim = 0, .data = g_s},
    };
    static const char *const meta[] = {"format", "pt", "note", "quote\" and \\ ok"};
    char path[128];
    path_of(path, sizeof(path), name);
    tm_err err = {0};
    TM_CHECK_OK(tm_st_file_write(path, t, 5, meta, 2, &err), &err);
    size_t n = 0;
    free(read_bytes(path, &n));
    return n;
}

static void test_round_trip(void) {
    make_valid("ok.safetensors");
    char path[128];
    path_of(path, sizeof(path), "ok.safetensors");
    tm_err err = {0};
    tm_st_file *f = NULL;
    TM_CHECK_OK(tm_st_file_open(path, &f, &err), &err);
    if (!f)
        return;
    TM_CHECK(tm_st_file_n_tensor(f) == 5);
    TM_CHECK(!strcmp(tm_st_file_tensor(f, 0)->name, "a")); // sorted
    const tm_st_tensor *a = tm_st_file_find(f, "a");
    TM_CHECK(a && a->dtype == TM_DTYPE_F32 && a->n_dim == 2 && a->shape[0] == 2 &&
             a->shape[1] == 3 && a->n_bytes == 24 && !memcmp(a->data, g_a, 24));
    TM_CHECK(a && ((uintptr_t)a->data % 8) == 0); // header padded to 8
    TM_CHECK(a && !strcmp(a->file, "ok.safetensors"));
    const tm_st_tensor *b = tm_st_file_find(f, "b");
    TM_CHECK(b && b->dtype == TM_DTYPE_BF16 && !memcmp(b->data, g_b, 8));
    const tm_st_tensor *c = tm_st_file_find(f, "c.f16");
    TM_CHECK(c && c->dtype == TM_DTYPE_F16 && c->n_elem == 3 && !memcmp(c->data, g_c, 6));
    const tm_st_tensor *e = tm_st_file_find(f, "empty");
    TM_CHECK(e && e->n_elem == 0 && e->n_bytes == 0);
    const tm_st_tensor *s = tm_st_file_find(f, "scalar");
    TM_CHECK(s && s->n_dim == 0 && s->n_elem == 1 && !memcmp(s->data, g_s, 4));
    TM_CHECK(tm_st_file_find(f, "nope") == NULL);
    TM_CHECK(tm_st_file_find(f, "") == NULL);

    // The element readers of model.h over the same data.
    tm_tensor tt = {.data = c->data, .dtype = TM_DTYPE_F16, .n_dim = 1, .shape = {3}};
    TM_CHECK(tm_tensor_get_f32(&tt, 0) == 1.0f);
    TM_CHECK(tm_tensor_get_f32(&tt, 1) == 0x1p-24f);
    TM_CHECK(isinf(tm_tensor_get_f32(&tt, 2)));
    tm_tensor ta = {.data = a->data, .dtype = TM_DTYPE_F32, .n_dim = 2, .shape = {2, 3}};
    float row[3];
    tm_tensor_row_f32(&ta, 1, row);
    TM_CHECK(row[0] == 0 && row[1] == 1e-3f && row[2] == -7);
    tm_tensor tb = {.data = b->data, .dtype = TM_DTYPE_BF16, .n_dim = 1, .shape = {4}};
    float rb[4];
    tm_tensor_row_f32(&tb, 0, rb);
    TM_CHECK(rb[0] == 1 && rb[1] == -1 && rb[2] == 2 && rb[3] == 0);
    tm_st_file_close(f);
    tm_st_file_close(NULL);

    // Same image from memory.
    size_t n = 0;
    unsigned char *img = read_bytes(path, &n);
    TM_CHECK_OK(tm_st_file_open_mem(img, n, "mem", &f, &err), &err);
    if (f) {
        TM_CHECK(tm_st_file_n_tensor(f) == 5);
        // The header alone (tm_st_header_parse) gives the same entries, offsets and section,
        // without data pointers.
        uint64_t n_hdr = 0;
        for (int i = 7; i >= 0; i--)
            n_hdr = n_hdr << 8 | img[i];
        tm_st_file *h = NULL;
        TM_CHECK_OK(tm_st_header_parse(img, (size_t)(8 + n_hdr), "hdr", &h, &err), &err);
        if (h) {
            TM_CHECK(tm_st_file_n_tensor(h) == 5);
            TM_CHECK(tm_st_file_data_start(h) == 8 + n_hdr &&
                     tm_st_file_data_start(f) == 8 + n_hdr);
            TM_CHECK(tm_st_file_data_bytes(h) == n - 8 - n_hdr &&
                     tm_st_file_data_bytes(f) == n - 8 - n_hdr);
            for (size_t i = 0; i < 5; i++) {
                const tm_st_tensor *x = tm_st_file_tensor(f, i), *y = tm_st_file_tensor(h, i);
                TM_CHECK(!strcmp(x->name, y->name) && x->offset == y->offset &&
                         x->n_bytes == y->n_bytes && x->dtype == y->dtype && y->data == NULL &&
                         !strcmp(y->file, "hdr"));
            }
            tm_st_file_close(h);
        }
        // The data bytes may follow or not; a header cut short is refused.
        TM_CHECK_OK(tm_st_header_parse(img, n, "hdr", &h, &err), &err);
        tm_st_file_close(h);
        h = NULL;
        TM_CHECK(tm_st_header_parse(img, (size_t)(8 + n_hdr - 1), "hdr", &h, &err) == TM_E_PARSE &&
                 h == NULL && strstr(err.msg, "runs past"));
        TM_CHECK(tm_st_header_parse(img, 7, "hdr", &h, &err) == TM_E_PARSE && h == NULL);
        tm_st_file_close(f);
    }
    free(img);
}

/* Every proper prefix of a valid file is rejected with TM_E_PARSE, from a file and from an
 * exactly-sized heap copy (so ASan sees any read past the end). */
static void test_truncation_sweep(void) {
    char path[128], cut[128];
    path_of(path, sizeof(path), "ok.safetensors");
    path_of(cut, sizeof(cut), "cut.safetensors");
    size_t n = 0;
    unsigned char *img = read_bytes(path, &n);
    TM_CHECK(n > 100);
    long live = tm_alloc_live();
    for (size_t len = 0; len < n; len++) {
        write_bytes(cut, img, len);
        tm_err err = {0};
        tm_st_file *f = NULL;
        tm_rc rc = tm_st_file_open(cut, &f, &err);
        TM_CHECK_MSG(rc == TM_E_PARSE && f == NULL, "len %zu: rc %s", len, tm_rc_name(rc));
        TM_CHECK_MSG(strstr(err.msg, "cut.safetensors") != NULL, "len %zu: %s", len, err.msg);
        unsigned char *copy = malloc(len ? len : 1);
        memcpy(copy, img, len);
        rc = tm_st_file_open_mem(copy, len, "cut", &f, &err);
        TM_CHECK_MSG(rc == TM_E_PARSE, "mem len %zu: rc %s", len, tm_rc_name(rc));
        free(copy);
        if (len == 3)
            TM_CHECK(strstr(err.msg, "too short") != NULL);
        if (len == 20)
            TM_CHECK(strstr(err.msg, "runs past the end") != NULL);
        if (len == n - 1)
            TM_CHECK_MSG(strstr(err.msg, "past the data section") != NULL, "%s", err.msg);
    }
    TM_CHECK(tm_alloc_live() == live);
    free(img);
}

/* Build an image: 8-byte length (hdr_len_override if nonzero, else strlen(hdr)), hdr, then
 * n_data zero bytes; returns a malloc'd exactly-sized buffer. */
static unsigned char *image(const char *hdr, size_t n_hdr, uint64_t len_field, size_t n_data,
                            size_t *n_out) {
    size_t n = 8 + n_hdr + n_data;
    unsigned char *p = calloc(1, n);
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(len_field >> (8 * i));
    memcpy(p + 8, hdr, n_hdr);
    *n_out = n;
    return p;
}

/* Expect TM_E_PARSE whose message contains phrase, from memory and from a file. */
static void expect_bad_raw(const char *hdr, size_t n_hdr, uint64_t len_field, size_t n_data,
                           const char *phrase) {
    size_t n = 0;
    unsigned char *img = image(hdr, n_hdr, len_field, n_data, &n);
    tm_err err = {0};
    tm_st_file *f = NULL;
    tm_rc rc = tm_st_file_open_mem(img, n, "bad.safetensors", &f, &err);
    TM_CHECK_MSG(rc == TM_E_PARSE && f == NULL, "%s: rc %s (%s)", hdr, tm_rc_name(rc), err.msg);
    TM_CHECK_MSG(strstr(err.msg, phrase) && strstr(err.msg, "bad.safetensors"),
                 "header %.60s: want '%s' in: %s", hdr, phrase, err.msg);
    char path[128];
    path_of(path, sizeof(path), "bad.safetensors");
    write_bytes(path, img, n);
    rc = tm_st_file_open(path, &f, &err);
    TM_CHECK_MSG(rc == TM_E_PARSE && strstr(err.msg, phrase), "file: %s", err.msg);
    if (rc == TM_OK)
        tm_st_file_close(f);
    free(img);
}

static void expect_bad(const char *hdr, size_t n_data, const char *phrase) {
    expect_bad_raw(hdr, strlen(hdr), strlen(hdr), n_data, phrase);
}

static void expect_good(const char *hdr, size_t n_data, size_t n_tensor) {
    size_t n = 0;
    unsigned char *img = image(hdr, strlen(hdr), strlen(hdr), n_data, &n);
    tm_err err = {0};
    tm_st_file *f = NULL;
    TM_CHECK_OK(tm_st_file_open_mem(img, n, "good", &f, &err), &err);
    if (f) {
        TM_CHECK(tm_st_file_n_tensor(f) == n_tensor);
        tm_st_file_close(f);
    }
    free(img);
}

#define T4(name, off0, off1)                                                                       \
    "\"" name "\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[" #off0 "," #off1 "]}"

static void test_corrupt_headers(void) {
    // Length field.
    expect_bad_raw("{}", 2, 1000, 0, "runs past the end");
    expect_bad_raw("{}", 2, UINT64_MAX, 0, "exceeds");
    expect_bad_raw("{}", 2, 100000001ull, 0, "exceeds");
    expect_bad_raw("{}", 2, 0, 2, "does not start with '{'");
    // Header bytes.
    expect_bad("[]", 0, "does not start with '{'");
    expect_bad(" {}", 0, "does not start with '{'");
    expect_bad("{\"a\xff\":1}", 0, "not valid UTF-8");
    expect_bad("{\"a\xc0\x80\":1}", 0, "not valid UTF-8"); // overlong NUL
    expect_bad_raw("{\"a\0\":1}", 7, 7, 0, "NUL");
    expect_bad("{", 0, "not valid JSON");
    expect_bad("{} x", 0, "not valid JSON");
    expect_bad("{\"a\":}", 0, "not valid JSON");
    expect_bad("{" T4("a", 0, 4) "," T4("a", 4, 8) "}", 8, "duplicate");
    expect_bad("{\"a\\u0000b\":1}", 0, "not valid JSON"); // NUL inside a name
    // Entries.
    expect_bad("{\"a\":5}", 0, "'a': entry is not a JSON object");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}", 4,
               "unknown field 'x'");
    expect_bad("{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "dtype is missing");
    expect_bad("{\"a\":{\"dtype\":5,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "dtype is not");
    expect_bad("{\"w\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8,
               "tensor 'w': dtype I64 is not supported");
    expect_bad("{\"w\":{\"dtype\":\"Q4_K\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8,
               "tensor 'w': unknown dtype 'Q4_K'");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, "shape is missing");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":\"x\",\"data_offsets\":[0,4]}}", 4,
               "shape is not");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4,
               "shape[0] is not a non-negative integer");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4,
               "shape[0] is not");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}",
               4, "9 dimensions");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1099511627776,1099511627776],"
               "\"data_offsets\":[0,4]}}",
               4, "overflows");
    expect_bad("{\"a\":{\"dtype\":\"BF16\",\"shape\":[4611686018427387904,2],"
               "\"data_offsets\":[0,4]}}",
               4, "overflows");
    expect_bad(
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999],\"data_offsets\":[0,4]}}", 4,
        "not valid JSON"); // beyond json_int_t
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "data_offsets is not");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4,
               "data_offsets is not");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":\"0,4\"}}", 4,
               "data_offsets is not");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,-4]}}", 4,
               "non-negative");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,\"4\"]}}", 4,
               "non-negative");
    expect_bad("{" T4("a", 4, 0) "}", 4, "begin 4 is after end 0");
    expect_bad("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,1234]}}", 1000,
               "tensor 'x': data_offsets end 1234 past the data section (1000 bytes)");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4,
               "span 4 bytes but shape x dtype needs 8");
    // Layout of the data section.
    expect_bad(
        "{" T4("a", 0, 4) ",\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[2,10]}}", 10,
        "overlaps");
    expect_bad("{" T4("a", 0, 4) "," T4("b", 0, 4) "}", 4, "overlaps");
    expect_bad("{" T4("a", 0, 4) "," T4("b", 8, 12) "}", 12, "gap of 4 bytes");
    expect_bad("{" T4("a", 4, 8) "}", 8, "gap");
    expect_bad("{" T4("a", 0, 4) "}", 8, "4 trailing bytes");
    expect_bad("{}", 8, "no tensors but a data section of 8 bytes");
    // Metadata.
    expect_bad("{\"__metadata__\":5}", 0, "__metadata__ is not a JSON object");
    expect_bad("{\"__metadata__\":{\"k\":1}}", 0, "__metadata__ 'k' is not a string");
    // Valid corner cases.
    expect_good("{}", 0, 0);
    expect_good("{\"__metadata__\":{\"format\":\"pt\"}}", 0, 0);
    expect_good("{" T4("b", 4, 8) "," T4("a", 0, 4) "}     ", 8, 2); // any order, space padding
    expect_good(
        "{\"z\":{\"dtype\":\"F16\",\"shape\":[0],\"data_offsets\":[4,4]}," T4("a", 0, 4) "}", 4,
        2); // empty tensor at the end
}

static void test_sets(void) {
    char path[256];
    tm_err err = {0};
    // Two shards and an index.
    tm_st_wtensor s1[] = {
        {.name = "x", .dtype = TM_DTYPE_F32, .n_dim = 1, .shape = {2}, .data = g_a},
        {.name = "y", .dtype = TM_DTYPE_BF16, .n_dim = 1, .shape = {4}, .data = g_b}};
    tm_st_wtensor s2[] = {
        {.name = "z", .dtype = TM_DTYPE_F16, .n_dim = 1, .shape = {3}, .data = g_c}};
    char sub[128];
    path_of(sub, sizeof(sub), "set");
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "mkdir -p %s", sub);
    TM_ASSERT(system(cmd) == 0);
    snprintf(path, sizeof(path), "%s/s1.safetensors", sub);
    TM_CHECK_OK(tm_st_file_write(path, s1, 2, NULL, 0, &err), &err);
    snprintf(path, sizeof(path), "%s/s2.safetensors", sub);
    TM_CHECK_OK(tm_st_file_write(path, s2, 1, NULL, 0, &err), &err);
    snprintf(path, sizeof(path), "%s/model.safetensors.index.json", sub);
    const char *idx = "{\"metadata\":{\"total_size\":22},\"weight_map\":{\"x\":\"s1.safetensors\","
                      "\"y\":\"s1.safetensors\",\"z\":\"s2.safetensors\"}}";
    write_bytes(path, idx, strlen(idx));
    tm_st_set *s = NULL;
    TM_CHECK_OK(tm_st_set_open(sub, &s, &err), &err);
    if (s) {
        TM_CHECK(tm_st_set_n_file(s) == 2 && tm_st_set_n_tensor(s) == 3);
        const tm_st_tensor *z = tm_st_set_find(s, "z");
        TM_CHECK(z && !strcmp(z->file, "s2.safetensors") && !memcmp(z->data, g_c, 6));
        TM_CHECK(tm_st_set_find(s, "w") == NULL);
        TM_CHECK(!strcmp(tm_st_set_tensor(s, 1)->name, "y"));
        tm_st_set_close(s);
    }
    struct {
        const char *index, *phrase;
        tm_rc rc;
    } bad[] = {
        {"{\"weight_map\":{\"x\":\"s1.safetensors\",\"w\":\"s1.safetensors\"}}",
         "'w' is listed in s1.safetensors but not there", TM_E_PARSE},
        {"{\"weight_map\":{\"x\":\"s2.safetensors\",\"z\":\"s2.safetensors\"}}",
         "'x' is listed in s2.safetensors but not there", TM_E_PARSE},
        {"{\"weight_map\":{\"x\":\"s1.safetensors\",\"z\":\"s1.safetensors\",\"q\":\"s2."
         "safetensors\"}}",
         "'z' is listed in s1.safetensors but is in s2.safetensors", TM_E_PARSE},
        {"{\"weight_map\":{\"x\":\"../s1.safetensors\"}}", "not a plain file name", TM_E_PARSE},
        {"{\"weight_map\":{\"x\":\"/etc/passwd\"}}", "not a plain file name", TM_E_PARSE},
        {"{\"weight_map\":{\"x\":5}}", "is not a string", TM_E_PARSE},
        {"{\"weight_map\":{}}", "no weight_map", TM_E_PARSE},
        {"{\"weight_map\":[]}", "no weight_map", TM_E_PARSE},
        {"{\"metadata\":{}}", "no weight_map", TM_E_PARSE},
        {"{\"weight_map\":{\"x\":\"s1.safetensors\"", "not valid JSON", TM_E_PARSE},
        {"{\"weight_map\":{\"x\":\"s1.safetensors\",\"x\":\"s1.safetensors\"}}", "duplicate",
         TM_E_PARSE},
        {"{\"weight_map\":{\"x\":\"missing.safetensors\"}}", "missing.safetensors: open", TM_E_IO},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        write_bytes(path, bad[i].index, strlen(bad[i].index));
        s = NULL;
        tm_rc rc = tm_st_set_open(sub, &s, &err);
        TM_CHECK_MSG(rc == bad[i].rc && s == NULL && strstr(err.msg, bad[i].phrase),
                     "index %zu: rc %s: %s", i, tm_rc_name(rc), err.msg);
    }
    // A tensor in two shards.
    snprintf(path, sizeof(path), "%s/s2.safetensors", sub);
    TM_CHECK_OK(tm_st_file_write(path, s1, 1, NULL, 0, &err), &err);
    snprintf(path, sizeof(path), "%s/model.safetensors.index.json", sub);
    idx = "{\"weight_map\":{\"x\":\"s1.safetensors\",\"y\":\"s2.safetensors\"}}";
    write_bytes(path, idx, strlen(idx));
    TM_CHECK(tm_st_set_open(sub, &s, &err) == TM_E_PARSE && strstr(err.msg, "in two shards"));
    // No index, no model.safetensors.
    unlink(path);
    TM_CHECK(tm_st_set_open(sub, &s, &err) == TM_E_IO && strstr(err.msg, "model.safetensors"));
    // A single model.safetensors.
    snprintf(path, sizeof(path), "%s/model.safetensors", sub);
    TM_CHECK_OK(tm_st_file_write(path, s1, 2, NULL, 0, &err), &err);
    TM_CHECK_OK(tm_st_set_open(sub, &s, &err), &err);
    if (s) {
        TM_CHECK(tm_st_set_n_file(s) == 1 && tm_st_set_find(s, "y") != NULL);
        tm_st_set_close(s);
    }
}

static void test_writer_errors(void) {
    char path[128];
    path_of(path, sizeof(path), "dup.safetensors");
    tm_st_wtensor t[] = {
        {.name = "x", .dtype = TM_DTYPE_F32, .n_dim = 1, .shape = {1}, .data = g_a},
        {.name = "x", .dtype = TM_DTYPE_F32, .n_dim = 1, .shape = {1}, .data = g_a}};
    tm_err err = {0};
    TM_CHECK(tm_st_file_write(path, t, 2, NULL, 0, &err) == TM_E_INVAL &&
             strstr(err.msg, "duplicate"));
    TM_CHECK(access(path, F_OK) != 0);
    char tmp[140];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    TM_CHECK(access(tmp, F_OK) != 0);
    TM_CHECK(tm_st_file_write("/nonexistent-dir/x.safetensors", t, 1, NULL, 0, &err) == TM_E_IO);
}

static void test_alloc_failures(void) {
    char path[128];
    path_of(path, sizeof(path), "ok.safetensors");
    long live = tm_alloc_live();
    int done = 0;
    for (long n = 1; n < 1000 && !done; n++) {
        tm_err err = {0};
        tm_st_file *f = NULL;
        tm_fault_set(TM_FAULT_ALLOC, n);
        tm_rc rc = tm_st_file_open(path, &f, &err);
        tm_fault_set(TM_FAULT_ALLOC, 0);
        if (rc == TM_OK) {
            done = 1;
            tm_st_file_close(f);
        } else {
            TM_CHECK_MSG(rc == TM_E_NOMEM, "n %ld: %s: %s", n, tm_rc_name(rc), err.msg);
        }
        TM_CHECK(tm_alloc_live() == live);
    }
    TM_CHECK(done);
}

static void test_f16_conversions(void) {
    // Every f16 value survives f16 -> f32 -> f16; NaNs stay NaN.
    int bad = 0;
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = tm_f16_to_f32((uint16_t)h);
        uint16_t back = tm_f32_to_f16(f);
        if (isnan(f))
            bad += !isnan(tm_f16_to_f32(back));
        else
            bad += back != h;
    }
    TM_CHECK(bad == 0);
    TM_CHECK(tm_f16_to_f32(0x0001) == 0x1p-24f);   // smallest subnormal
    TM_CHECK(tm_f16_to_f32(0x03ff) == 0x3ffp-24f); // largest subnormal
    TM_CHECK(tm_f16_to_f32(0x7bff) == 65504.0f);
    TM_CHECK(tm_f16_to_f32(0xfc00) == -INFINITY);
    TM_CHECK(tm_f32_to_f16(65520.0f) == 0x7c00); // rounds to infinity
    TM_CHECK(tm_f32_to_f16(65519.0f) == 0x7bff);
    TM_CHECK(tm_f32_to_f16(0x1p-25f) == 0x0000);   // half of the smallest subnormal: ties to even
    TM_CHECK(tm_f32_to_f16(0x1.8p-24f) == 0x0002); // 1.5 ulp: ties to even
    TM_CHECK(tm_f32_to_f16(1.0f + 0x1p-11f) == 0x3c00); // tie between 1 and next: even
    TM_CHECK(tm_f32_to_f16(1.0f + 0x1.8p-11f) == 0x3c01);
    TM_CHECK(tm_f32_to_f16(-0.0f) == 0x8000);
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = tm_bf16_to_f32((uint16_t)h);
        if (!isnan(f))
            bad += tm_f32_to_bf16(f) != h;
    }
    TM_CHECK(bad == 0);
    TM_CHECK(tm_f32_to_bf16(1.0f + 0x1p-8f) == 0x3f80); // tie: even
    TM_CHECK(tm_f32_to_bf16(1.0f + 0x1.8p-7f) == 0x3f82);
    TM_CHECK(isnan(tm_bf16_to_f32(tm_f32_to_bf16(NAN))));
}

// A big (several pages) file that is truncated, rewritten in place, replaced or removed while
// mapped (issue 35): reading every byte never raises SIGBUS (the lost pages read as zeros), and
// tm_st_file_check names the file and what happened; a FIFO under the name is refused at open
// without blocking.
static void test_changed_under_mapping(void) {
    enum { N = 1 << 16 }; // 256 KiB of f32
    float *v = malloc(N * sizeof(float));
    TM_ASSERT(v);
    for (int i = 0; i < N; i++)
        v[i] = (float)(i + 1);
    tm_st_wtensor t[] = {{.name = "w", .dtype = TM_DTYPE_F32, .n_dim = 1, .shape = {N}, .data = v}};
    char path[128], other[128];
    path_of(path, sizeof(path), "big.safetensors");
    path_of(other, sizeof(other), "big2.safetensors");
    tm_err err = {0};
    TM_CHECK_OK(tm_st_file_write(path, t, 1, NULL, 0, &err), &err);
    TM_CHECK_OK(tm_st_file_write(other, t, 1, NULL, 0, &err), &err);
    size_t n_file = 0;
    unsigned char *orig = read_bytes(path, &n_file);

    // 1. truncated to its header: the data pages are lost
    tm_st_file *f = NULL;
    TM_CHECK_OK(tm_st_file_open(path, &f, &err), &err);
    TM_CHECK_OK(tm_st_file_check(f, &err), &err);
    const tm_st_tensor *w = tm_st_file_find(f, "w");
    TM_ASSERT(w);
    TM_ASSERT(truncate(path, 64) == 0);
    double sum = 0;
    for (int i = 0; i < N; i++) // would be SIGBUS (exit 135) past the first page before
        sum += ((const float *)w->data)[i];
    TM_CHECK(sum < (double)N * (N + 1) / 2); // zeros, not the weights
    TM_CHECK(tm_st_file_check(f, &err) == TM_E_IO);
    TM_CHECK_MSG(strstr(err.msg, path) && strstr(err.msg, "lost bytes"), "%s", err.msg);
    tm_st_file_close(f);

    // 2. rewritten in place with zeros of the same size
    write_bytes(path, orig, n_file);
    TM_CHECK_OK(tm_st_file_open(path, &f, &err), &err);
    unsigned char *zeros = calloc(1, n_file);
    TM_ASSERT(zeros);
    memcpy(zeros, orig, 64); // same header
    usleep(10000);           // a later mtime on file systems with coarse clocks
    write_bytes(path, zeros, n_file);
    TM_CHECK(tm_st_file_check(f, &err) == TM_E_IO);
    TM_CHECK_MSG(strstr(err.msg, path) && strstr(err.msg, "changed while the job ran"), "%s",
                 err.msg);
    tm_st_file_close(f);

    // 3. replaced by rename (the mapping keeps the old file, intact), 4. removed
    write_bytes(path, orig, n_file);
    TM_CHECK_OK(tm_st_file_open(path, &f, &err), &err);
    TM_ASSERT(rename(other, path) == 0);
    TM_CHECK(tm_st_file_check(f, &err) == TM_E_IO);
    TM_CHECK_MSG(strstr(err.msg, path) && strstr(err.msg, "replaced by another file"), "%s",
                 err.msg);
    TM_ASSERT(unlink(path) == 0);
    TM_CHECK(tm_st_file_check(f, &err) == TM_E_IO);
    TM_CHECK_MSG(strstr(err.msg, path) && strstr(err.msg, "removed or renamed"), "%s", err.msg);
    tm_st_file_close(f);

    // a FIFO (no writer): refused by name at once, not a blocked open
    TM_ASSERT(mkfifo(path, 0600) == 0);
    TM_CHECK(tm_st_file_open(path, &f, &err) == TM_E_IO);
    TM_CHECK_MSG(strstr(err.msg, path) && strstr(err.msg, "is a FIFO"), "%s", err.msg);
    TM_ASSERT(unlink(path) == 0);
    free(zeros);
    free(orig);
    free(v);
}

int main(void) {
    snprintf(g_dir, sizeof(g_dir), "/tmp/tm_st_XXXXXX");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    TM_RUN(test_round_trip);
    TM_RUN(test_truncation_sweep);
    TM_RUN(test_corrupt_headers);
    TM_RUN(test_sets);
    TM_RUN(test_writer_errors);
    TM_RUN(test_alloc_failures);
    TM_RUN(test_f16_conversions);
    TM_RUN(test_changed_under_mapping);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", g_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", g_dir);
    return tm_test_report();
}
