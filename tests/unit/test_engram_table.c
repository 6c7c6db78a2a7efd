/* tests/unit/test_engram_table.c - runner/model/engram_table.c: Engram table rows read from disk.
 * Values against the definition written out here on its own (e4m3 x 2^(e8m0 - 127) in fp32,
 * rounded to bf16 as ParallelEngramEmbedding.forward does), row shards of ceil(rows / world) with
 * zeros elsewhere, the open-time refusals (truncated or padded files, FIFOs and devices, wrong
 * dtypes and shapes, missing tensors, a bad index), the cache with a tiny capacity against direct
 * reads over a fixed pseudo-random access sequence, prefetch then get, and every allocation of
 * open failing in turn. The peak-RSS check is tests/unit/test_engram_rss.c. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "runner/model/engram_table.h"
#include "runner/model/safetensors.h"
#include "tm_test.h"

static char g_dir[64];

/* ---- the definition, independent of the library's converters -------------------------------- */

static float def_e4m3(uint8_t b) {
    int sign = b >> 7, e = (b >> 3) & 15, m = b & 7;
    if ((b & 0x7f) == 0x7f)
        return NAN;
    float mag = e == 0 ? ldexpf((float)m, -9) : ldexpf(1.0f + (float)m / 8.0f, e - 7);
    return sign ? -mag : mag;
}

static float def_bf16_round(float f) {
    if (isnan(f))
        return f;
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t lower = u & 0xffffu, keep = u >> 16;
    if (lower > 0x8000u || (lower == 0x8000u && (keep & 1u)))
        keep++;
    u = keep << 16;
    memcpy(&f, &u, 4);
    return f;
}

static float def_value(uint8_t v, uint8_t s) {
    float scale = s == 0xff ? NAN : ldexpf(1.0f, (int)s - 127);
    return def_bf16_round(def_e4m3(v) * scale);
}

static int same_float(float a, float b) {
    if (isnan(a) || isnan(b))
        return isnan(a) && isnan(b);
    return memcmp(&a, &b, 4) == 0; // bit-exact, so -0 and +0 differ
}

/* ---- tables --------------------------------------------------------------------------------- */

static uint64_t g_rng;
static uint32_t rng_next(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 11);
}

typedef struct table {
    uint64_t rows;
    uint32_t dim;
    uint8_t *vals;   /* [rows][dim] */
    uint8_t *scales; /* [rows][dim / 32] */
} table;

/* A table with a fixed seed: every e4m3 byte value and scales over the whole e8m0 range
 * (0 = 2^-127, 0xff = NaN, large ones overflowing to inf) appear. */
static table table_make(uint64_t rows, uint32_t dim, uint64_t seed) {
    table t = {rows, dim, malloc(rows * dim), malloc(rows * (dim / 32))};
    g_rng = seed * 0x9e3779b97f4a7c15ull + 1;
    for (uint64_t i = 0; i < rows * dim; i++)
        t.vals[i] = (uint8_t)rng_next();
    for (uint64_t i = 0; i < rows * (dim / 32); i++) {
        uint32_t r = rng_next() % 16;
        t.scales[i] = r == 0 ? 0 : r == 1 ? 0xff : r == 2 ? 254 : (uint8_t)(110 + rng_next() % 30);
    }
    return t;
}

static void table_free(table *t) {
    free(t->vals);
    free(t->scales);
}

static const char *W = "layers.1.engram.embed.weight";
static const char *S = "layers.1.engram.embed.scale";

/* Write t into path with an extra small tensor (so the table is not the whole file). */
static void table_write(const table *t, const char *path, tm_dtype scale_dtype) {
    static const float other[3] = {1, 2, 3};
    tm_st_wtensor wt[3] = {
        {W, TM_DTYPE_F8_E4M3, 2, {t->rows, t->dim}, t->vals},
        {S, scale_dtype, 2, {t->rows, t->dim / 32}, t->scales},
        {"layers.1.engram.q_weight", TM_DTYPE_F32, 1, {3}, other},
    };
    tm_err err = {0};
    TM_CHECK_OK(tm_st_file_write(path, wt, 3, NULL, 0, &err), &err);
}

static void path_in(char *out, size_t n, const char *name) {
    snprintf(out, n, "%s/%s", g_dir, name);
}

static tm_engram_table_cfg cfg_of(const char *path, uint32_t rank, uint32_t world,
                                  uint64_t cache_bytes) {
    tm_engram_table_cfg c = {path, W, S, rank, world, cache_bytes, 2};
    return c;
}

/* Compare out[0..dim) with the definition of row r of t (zeros when !in), bit for bit; with
 * any_zero, -0 and +0 count as equal (a sum over ranks turns -0 + 0 into +0, as all_reduce does).
 */
static int row_matches_z(const table *t, uint64_t r, int in, const float *out, int any_zero) {
    for (uint32_t c = 0; c < t->dim; c++) {
        float want = in ? def_value(t->vals[r * t->dim + c], t->scales[r * (t->dim / 32) + c / 32])
                        : 0.0f;
        if (any_zero && want == 0.0f && out[c] == 0.0f)
            continue;
        if (!same_float(out[c], want)) {
            fprintf(stderr, "row %llu col %u: got %a want %a\n", (unsigned long long)r, c,
                    (double)out[c], (double)want);
            return 0;
        }
    }
    return 1;
}

static int row_matches(const table *t, uint64_t r, int in, const float *out) {
    return row_matches_z(t, r, in, out, 0);
}

/* ---- tests ---------------------------------------------------------------------------------- */

static void test_values(void) {
    table t = table_make(300, 64, 1);
    char path[128];
    path_in(path, sizeof(path), "values.safetensors");
    table_write(&t, path, TM_DTYPE_F8_E8M0);
    tm_err err = {0};
    tm_engram_table *et = NULL;
    tm_engram_table_cfg cfg = cfg_of(path, 0, 1, 1 << 20);
    TM_CHECK_OK(tm_engram_table_open(&cfg, &et, &err), &err);
    if (!et)
        goto out;
    const tm_engram_table_info *info = tm_engram_table_info_get(et);
    TM_CHECK(info->rows == 300 && info->dim == 64 && info->row0 == 0 && info->n_rows == 300);
    TM_CHECK(info->cache_bytes <= (1 << 20) && info->n_slots == 300);
    uint64_t rows[300];
    for (uint64_t i = 0; i < 300; i++)
        rows[i] = (i * 7) % 300;
    float *out = malloc(300 * 64 * sizeof(float));
    TM_CHECK_OK(tm_engram_table_get(et, rows, 300, out, &err), &err);
    int bad = 0;
    for (uint64_t i = 0; i < 300; i++)
        bad += !row_matches(&t, rows[i], 1, out + i * 64);
    TM_CHECK(bad == 0);
    // The special values really occur in the table: NaN, inf (254 overflows), 2^-127 scales.
    int n_nan = 0, n_inf = 0, n_tiny = 0;
    for (int i = 0; i < 300 * 64; i++) {
        n_nan += isnan(out[i]);
        n_inf += isinf(out[i]);
        n_tiny += out[i] != 0 && fabsf(out[i]) < 0x1p-120f;
    }
    TM_CHECK(n_nan > 0 && n_inf > 0 && n_tiny > 0);
    // The library's own definition agrees with the test's, row by row.
    float one[64];
    uint8_t v[64], s[2];
    TM_CHECK_OK(tm_engram_table_read_raw(et, 123, v, s, &err), &err);
    TM_CHECK(memcmp(v, t.vals + 123 * 64, 64) == 0 && memcmp(s, t.scales + 123 * 2, 2) == 0);
    tm_engram_row_dequant(v, s, 64, one);
    TM_CHECK(row_matches(&t, 123, 1, one));
    TM_CHECK(tm_engram_table_read_raw(et, 300, v, s, &err) == TM_E_INVAL);
    // Second pass: all hits, no new reads.
    tm_engram_table_stats st0, st1;
    tm_engram_table_stats_get(et, &st0);
    TM_CHECK(st0.misses == 300 && st0.reads == 300 && st0.bytes_read == 300 * (64 + 2));
    TM_CHECK_OK(tm_engram_table_get(et, rows, 300, out, &err), &err);
    tm_engram_table_stats_get(et, &st1);
    TM_CHECK(st1.hits == st0.hits + 300 && st1.reads == st0.reads && st1.rows_get == 600);
    free(out);
out:
    tm_engram_table_close(et);
    // U8 scales are accepted as the same bytes.
    table_write(&t, path, TM_DTYPE_U8);
    et = NULL;
    TM_CHECK_OK(tm_engram_table_open(&cfg, &et, &err), &err);
    if (et) {
        float o[64];
        uint64_t r = 17;
        TM_CHECK_OK(tm_engram_table_get(et, &r, 1, o, &err), &err);
        TM_CHECK(row_matches(&t, 17, 1, o));
    }
    tm_engram_table_close(et);
    table_free(&t);
}

/* Every (e4m3 byte, e8m0 byte) pair through get (the fast path for ordinary scales and the
 * rounding path for tiny and NaN ones): row r holds the 256 value bytes, every block scaled by r.
 */
static void test_all_pairs(void) {
    table t = {256, 256, malloc(256 * 256), malloc(256 * 8)};
    for (int r = 0; r < 256; r++) {
        for (int c = 0; c < 256; c++)
            t.vals[r * 256 + c] = (uint8_t)c;
        for (int b = 0; b < 8; b++)
            t.scales[r * 8 + b] = (uint8_t)r;
    }
    char path[128];
    path_in(path, sizeof(path), "pairs.safetensors");
    table_write(&t, path, TM_DTYPE_F8_E8M0);
    tm_err err = {0};
    tm_engram_table *et = NULL;
    tm_engram_table_cfg cfg = cfg_of(path, 0, 1, 1 << 20);
    TM_CHECK_OK(tm_engram_table_open(&cfg, &et, &err), &err);
    if (et) {
        uint64_t rows[256];
        for (int r = 0; r < 256; r++)
            rows[r] = (uint64_t)r;
        float *out = malloc(256 * 256 * sizeof(float));
        TM_CHECK_OK(tm_engram_table_get(et, rows, 256, out, &err), &err);
        int bad = 0;
        for (int r = 0; r < 256; r++)
            bad += !row_matches(&t, (uint64_t)r, 1, out + r * 256);
        TM_CHECK(bad == 0);
        free(out);
    }
    tm_engram_table_close(et);
    table_free(&t);
}

static void test_shards(void) {
    table t = table_make(10, 32, 2);
    char path[128];
    path_in(path, sizeof(path), "shards.safetensors");
    table_write(&t, path, TM_DTYPE_F8_E8M0);
    tm_err err = {0};
    uint64_t rows[14];
    for (uint64_t i = 0; i < 14; i++)
        rows[i] = i; // 10..13 are past the table
    float out[14 * 32], sum[14 * 32] = {0};
    // world 3: part = ceil(10 / 3) = 4: rank 0 [0, 4), rank 1 [4, 8), rank 2 [8, 12) of which
    // 10 and 11 are padding (zeros)
    for (uint32_t rank = 0; rank < 3; rank++) {
        tm_engram_table *et = NULL;
        tm_engram_table_cfg cfg = cfg_of(path, rank, 3, 1 << 16);
        TM_CHECK_OK(tm_engram_table_open(&cfg, &et, &err), &err);
        if (!et)
            continue;
        const tm_engram_table_info *info = tm_engram_table_info_get(et);
        TM_CHECK(info->n_rows == 4 && info->row0 == 4u * rank);
        TM_CHECK_OK(tm_engram_table_get(et, rows, 14, out, &err), &err);
        for (uint64_t r = 0; r < 14; r++) {
            int in = r >= 4u * rank && r < 4u * rank + 4 && r < 10;
            TM_CHECK_MSG(row_matches(&t, r < 10 ? r : 0, in, out + r * 32), "rank %u row %llu",
                         rank, (unsigned long long)r);
            for (int c = 0; c < 32; c++)
                sum[r * 32 + c] += out[r * 32 + c];
        }
        tm_engram_table_stats st;
        tm_engram_table_stats_get(et, &st);
        TM_CHECK(st.rows_zero == 14 - (rank == 2 ? 2 : 4));
        TM_CHECK(st.reads == (rank == 2 ? 2 : 4));
        tm_engram_table_close(et);
    }
    // The all_reduce of the ranks' outputs gives every row exactly once.
    for (uint64_t r = 0; r < 14; r++)
        TM_CHECK(row_matches_z(&t, r < 10 ? r : 0, r < 10, sum + r * 32, 1));
    // world 1 vs 4 on a table that divides evenly / not; rank >= world refused
    tm_engram_table *et = NULL;
    tm_engram_table_cfg bad = cfg_of(path, 3, 3, 1 << 16);
    TM_CHECK(tm_engram_table_open(&bad, &et, &err) == TM_E_INVAL && !et);
    bad = cfg_of(path, 0, 0, 1 << 16);
    TM_CHECK(tm_engram_table_open(&bad, &et, &err) == TM_E_INVAL && !et);
    // a rank whose shard lies wholly past the table (10 rows, world 12: part 1, rank 11)
    tm_engram_table_cfg far = cfg_of(path, 11, 12, 1 << 16);
    TM_CHECK_OK(tm_engram_table_open(&far, &et, &err), &err);
    if (et) {
        TM_CHECK_OK(tm_engram_table_get(et, rows, 14, out, &err), &err);
        for (int i = 0; i < 14 * 32; i++)
            TM_CHECK(out[i] == 0.0f);
    }
    tm_engram_table_close(et);
    table_free(&t);
}

static void expect_open_fail(const char *path, tm_rc want, const char *const *needles) {
    tm_err err = {0};
    tm_engram_table *et = NULL;
    tm_engram_table_cfg cfg = cfg_of(path, 0, 1, 1 << 16);
    tm_rc rc = tm_engram_table_open(&cfg, &et, &err);
    TM_CHECK_MSG(rc == want && et == NULL, "%s: rc %d want %d: %s", path, (int)rc, (int)want,
                 err.msg);
    for (int i = 0; needles[i]; i++)
        TM_CHECK_MSG(strstr(err.msg, needles[i]) != NULL, "'%s' not in '%s'", needles[i], err.msg);
    tm_engram_table_close(et);
}

static void test_truncated(void) {
    table t = table_make(50, 32, 3);
    char path[128], sz[64], full[64];
    path_in(path, sizeof(path), "trunc.safetensors");
    table_write(&t, path, TM_DTYPE_F8_E8M0);
    struct stat st;
    TM_CHECK(stat(path, &st) == 0);
    snprintf(full, sizeof(full), "describes %lld", (long long)st.st_size);
    // one byte short, half, and everything but the header
    long long cut[3] = {(long long)st.st_size - 1, (long long)st.st_size / 2, 0};
    tm_st_file *f = NULL;
    tm_err err = {0};
    TM_CHECK_OK(tm_st_file_open(path, &f, &err), &err);
    cut[2] = (long long)tm_st_file_data_start(f) + 1;
    tm_st_file_close(f);
    for (int i = 0; i < 3; i++) {
        table_write(&t, path, TM_DTYPE_F8_E8M0);
        TM_CHECK(truncate(path, cut[i]) == 0);
        snprintf(sz, sizeof(sz), "file is %lld bytes", cut[i]);
        const char *needles[] = {"trunc.safetensors", sz, full, "truncated", "tensor '", NULL};
        expect_open_fail(path, TM_E_IO, needles);
    }
    // a header longer than the file
    table_write(&t, path, TM_DTYPE_F8_E8M0);
    TM_CHECK(truncate(path, 20) == 0);
    const char *n2[] = {"trunc.safetensors", "runs past the end of the file", NULL};
    expect_open_fail(path, TM_E_IO, n2);
    // trailing bytes after the last tensor
    table_write(&t, path, TM_DTYPE_F8_E8M0);
    TM_CHECK(truncate(path, st.st_size + 3) == 0);
    const char *n3[] = {"trunc.safetensors", "3 trailing bytes", NULL};
    expect_open_fail(path, TM_E_IO, n3);
    // the file shrinking after open: a TM_E_IO from get naming the row, never a SIGBUS
    table_write(&t, path, TM_DTYPE_F8_E8M0);
    tm_engram_table *et = NULL;
    tm_engram_table_cfg cfg = cfg_of(path, 0, 1, 1 << 16);
    TM_CHECK_OK(tm_engram_table_open(&cfg, &et, &err), &err);
    if (et) {
        TM_CHECK(truncate(path, 100) == 0);
        uint64_t r = 49;
        float o[32];
        tm_rc rc = tm_engram_table_get(et, &r, 1, o, &err);
        TM_CHECK(rc == TM_E_IO && strstr(err.msg, "row 49") && strstr(err.msg, "shrank"));
        // asked again: reported again (the failed slot was freed, not kept as data)
        TM_CHECK(tm_engram_table_get(et, &r, 1, o, &err) == TM_E_IO);
        tm_engram_table_prefetch(et, &r, 1);
        TM_CHECK(tm_engram_table_get(et, &r, 1, o, &err) == TM_E_IO);
    }
    tm_engram_table_close(et);
    table_free(&t);
}

static void test_not_regular(void) {
    char path[128];
    path_in(path, sizeof(path), "table.fifo");
    TM_CHECK(mkfifo(path, 0600) == 0);
    const char *n1[] = {"table.fifo", "a FIFO", "not a regular file", NULL};
    expect_open_fail(path, TM_E_IO, n1); // returns at once: no writer needed
    const char *n2[] = {"/dev/null", "a character device", NULL};
    expect_open_fail("/dev/null", TM_E_IO, n2);
    path_in(path, sizeof(path), "missing.safetensors");
    const char *n3[] = {"missing.safetensors", "No such file", NULL};
    expect_open_fail(path, TM_E_IO, n3);
}

static void write_raw(const char *path, const char *hdr, size_t n_data) {
    FILE *f = fopen(path, "wb");
    uint64_t n = strlen(hdr);
    uint8_t len[8];
    for (int i = 0; i < 8; i++)
        len[i] = (uint8_t)(n >> (8 * i));
    fwrite(len, 1, 8, f);
    fwrite(hdr, 1, n, f);
    for (size_t i = 0; i < n_data; i++)
        fputc(0x38, f);
    fclose(f);
}

static void test_bad_tensors(void) {
    char path[128];
    path_in(path, sizeof(path), "bad.safetensors");
    struct {
        const char *hdr;
        size_t n_data;
        const char *needle;
    } cases[] = {
        {"{\"layers.1.engram.embed.weight\":{\"dtype\":\"BF16\",\"shape\":[2,32],\"data_offsets\":"
         "[0,128]},\"layers.1.engram.embed.scale\":{\"dtype\":\"F8_E8M0\",\"shape\":[2,1],"
         "\"data_offsets\":[128,130]}}",
         130, "dtype bf16, want F8_E4M3"},
        {"{\"layers.1.engram.embed.weight\":{\"dtype\":\"F8_E4M3\",\"shape\":[2,33],"
         "\"data_offsets\":[0,66]},\"layers.1.engram.embed.scale\":{\"dtype\":\"F8_E8M0\","
         "\"shape\":[2,1],\"data_offsets\":[66,68]}}",
         68, "multiple of 32"},
        {"{\"layers.1.engram.embed.weight\":{\"dtype\":\"F8_E4M3\",\"shape\":[2,32],"
         "\"data_offsets\":[0,64]},\"layers.1.engram.embed.scale\":{\"dtype\":\"F8_E8M0\","
         "\"shape\":[2,2],\"data_offsets\":[64,68]}}",
         68, "want [2, 1]"},
        {"{\"layers.1.engram.embed.weight\":{\"dtype\":\"F8_E4M3\",\"shape\":[2,32],"
         "\"data_offsets\":[0,64]},\"layers.1.engram.embed.scale\":{\"dtype\":\"F8_E8M0\","
         "\"shape\":[3,1],\"data_offsets\":[64,67]}}",
         67, "want [2, 1]"},
        {"{\"layers.1.engram.embed.weight\":{\"dtype\":\"F8_E4M3\",\"shape\":[2,32],"
         "\"data_offsets\":[0,64]},\"layers.1.engram.embed.scale\":{\"dtype\":\"F32\","
         "\"shape\":[2,1],\"data_offsets\":[64,72]}}",
         72, "want F8_E8M0 or U8"},
        {"{\"layers.1.engram.embed.weight\":{\"dtype\":\"F8_E4M3\",\"shape\":[2,32],"
         "\"data_offsets\":[0,64]}}",
         64, "no tensor 'layers.1.engram.embed.scale'"},
        {"{\"layers.1.engram.embed.weight\":{\"dtype\":\"F8_E4M3\",\"shape\":[64],"
         "\"data_offsets\":[0,64]},\"layers.1.engram.embed.scale\":{\"dtype\":\"F8_E8M0\","
         "\"shape\":[2,1],\"data_offsets\":[64,66]}}",
         66, "1 dimensions, want 2"},
        {"{\"layers.1.engram.embed.weight\":{\"dtype\":\"F8_E4M3\",\"shape\":[2,32],"
         "\"data_offsets\":[0,60]}}",
         60, "data_offsets span 60 bytes"},
        {"[1,2]", 0, "does not start with '{'"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        write_raw(path, cases[i].hdr, cases[i].n_data);
        const char *needles[] = {"bad.safetensors", cases[i].needle, NULL};
        expect_open_fail(path, TM_E_PARSE, needles);
        // the pure check says the same
        FILE *f = fopen(path, "rb");
        uint8_t buf[1024];
        size_t n = fread(buf, 1, sizeof(buf), f);
        fclose(f);
        tm_err err = {0};
        tm_engram_table_info info;
        tm_rc rc = tm_engram_file_check(buf, n, n, "bad.safetensors", W, S, &info, &err);
        TM_CHECK_MSG(rc == TM_E_PARSE && strstr(err.msg, cases[i].needle), "case %zu: %s", i,
                     err.msg);
    }
    // A good one through the pure check.
    write_raw(path,
              "{\"layers.1.engram.embed.weight\":{\"dtype\":\"F8_E4M3\",\"shape\":[2,32],"
              "\"data_offsets\":[0,64]},\"layers.1.engram.embed.scale\":{\"dtype\":\"F8_E8M0\","
              "\"shape\":[2,1],\"data_offsets\":[64,66]}}",
              66);
    FILE *f = fopen(path, "rb");
    uint8_t buf[1024];
    size_t n = fread(buf, 1, sizeof(buf), f);
    fclose(f);
    tm_err err = {0};
    tm_engram_table_info info;
    TM_CHECK_OK(tm_engram_file_check(buf, n, n, "ok", W, S, &info, &err), &err);
    TM_CHECK(info.rows == 2 && info.dim == 32);
    // the header alone (no data bytes given) with the true file size is enough
    TM_CHECK_OK(tm_engram_file_check(buf, n - 66, n, "ok", W, S, &info, &err), &err);
    TM_CHECK(tm_engram_file_check(buf, n - 66, n - 1, "ok", W, S, &info, &err) == TM_E_IO);
    // cache too small for one row
    tm_engram_table *et = NULL;
    tm_engram_table_cfg cfg = cfg_of(path, 0, 1, 10);
    TM_CHECK(tm_engram_table_open(&cfg, &et, &err) == TM_E_INVAL && !et);
    TM_CHECK(strstr(err.msg, "holds no row") != NULL);
}

/* A model folder: weight and scale in two shards named by the index. */
static void test_folder(void) {
    table t = table_make(40, 32, 4);
    char dir[128], p[192];
    path_in(dir, sizeof(dir), "model");
    TM_CHECK(mkdir(dir, 0700) == 0);
    tm_err err = {0};
    tm_st_wtensor w = {W, TM_DTYPE_F8_E4M3, 2, {40, 32}, t.vals};
    tm_st_wtensor s = {S, TM_DTYPE_F8_E8M0, 2, {40, 1}, t.scales};
    snprintf(p, sizeof(p), "%s/model-00001-of-00002.safetensors", dir);
    TM_CHECK_OK(tm_st_file_write(p, &w, 1, NULL, 0, &err), &err);
    snprintf(p, sizeof(p), "%s/model-00002-of-00002.safetensors", dir);
    TM_CHECK_OK(tm_st_file_write(p, &s, 1, NULL, 0, &err), &err);
    snprintf(p, sizeof(p), "%s/model.safetensors.index.json", dir);
    FILE *f = fopen(p, "w");
    fprintf(f,
            "{\"metadata\":{},\"weight_map\":{\"%s\":\"model-00001-of-00002.safetensors\","
            "\"%s\":\"model-00002-of-00002.safetensors\"}}",
            W, S);
    fclose(f);
    tm_engram_table *et = NULL;
    tm_engram_table_cfg cfg = cfg_of(dir, 1, 2, 1 << 16);
    TM_CHECK_OK(tm_engram_table_open(&cfg, &et, &err), &err);
    if (et) {
        uint64_t rows[3] = {19, 20, 39};
        float o[3 * 32];
        TM_CHECK_OK(tm_engram_table_get(et, rows, 3, o, &err), &err);
        TM_CHECK(row_matches(&t, 19, 0, o) && row_matches(&t, 20, 1, o + 32) &&
                 row_matches(&t, 39, 1, o + 64));
    }
    tm_engram_table_close(et);
    // an index without the tensor, or pointing out of the folder
    f = fopen(p, "w");
    fprintf(f, "{\"weight_map\":{\"%s\":\"model-00001-of-00002.safetensors\"}}", W);
    fclose(f);
    const char *n1[] = {"model.safetensors.index.json", "no tensor 'layers.1.engram.embed.scale'",
                        NULL};
    expect_open_fail(dir, TM_E_PARSE, n1);
    f = fopen(p, "w");
    fprintf(f, "{\"weight_map\":{\"%s\":\"../x\",\"%s\":\"y\"}}", W, S);
    fclose(f);
    const char *n2[] = {"not a plain file name", NULL};
    expect_open_fail(dir, TM_E_PARSE, n2);
    table_free(&t);
}

/* A tiny cache (5 rows) under a fixed pseudo-random sequence of gets and prefetches, each get
 * compared with the rows read directly from the file and dequantized by the definition. */
static void test_eviction(void) {
    table t = table_make(97, 32, 5);
    char path[128];
    path_in(path, sizeof(path), "evict.safetensors");
    table_write(&t, path, TM_DTYPE_F8_E8M0);
    tm_err err = {0};
    tm_engram_table *et = NULL;
    // slot cost: 33 bytes of row + 36 of bookkeeping: 5 slots in 5 x 73 bytes
    tm_engram_table_cfg cfg = cfg_of(path, 0, 1, 5 * 73);
    TM_CHECK_OK(tm_engram_table_open(&cfg, &et, &err), &err);
    if (!et) {
        table_free(&t);
        return;
    }
    TM_CHECK(tm_engram_table_info_get(et)->n_slots == 5);
    g_rng = 12345;
    uint64_t rows[40];
    float out[40 * 32], ref[32];
    uint8_t v[32], s[1];
    int bad = 0;
    for (int step = 0; step < 3000; step++) {
        size_t n = 1 + rng_next() % 12;
        if (step % 50 == 0)
            n = 40;                    // more rows than the cache holds
        for (size_t i = 0; i < n; i++) // a hot set of 8 rows half the time, else any (or past)
            rows[i] = rng_next() % 2 ? rng_next() % 8 : rng_next() % 100;
        if (rng_next() % 3 == 0)
            tm_engram_table_prefetch(et, rows, n);
        if (tm_engram_table_get(et, rows, n, out, &err) != TM_OK) {
            bad++;
            break;
        }
        for (size_t i = 0; i < n; i++) {
            if (rows[i] >= 97) {
                bad += !row_matches(&t, 0, 0, out + i * 32);
                continue;
            }
            TM_CHECK_OK(tm_engram_table_read_raw(et, rows[i], v, s, &err), &err);
            tm_engram_row_dequant(v, s, 32, ref);
            for (int c = 0; c < 32; c++) // as a direct read (a NaN's sign may differ: NaN x NaN)
                bad += !same_float(ref[c], out[i * 32 + c]);
            bad += !row_matches(&t, rows[i], 1, out + i * 32);
        }
    }
    TM_CHECK(bad == 0);
    tm_engram_table_stats st;
    tm_engram_table_stats_get(et, &st);
    TM_CHECK(st.hits > 0 && st.misses > 0 && st.evictions > 0 && st.prefetch_reads > 0);
    TM_CHECK(st.hits + st.waits + st.misses + st.rows_zero == st.rows_get);
    fprintf(stderr, "eviction: %llu rows, %llu hits, %llu waits, %llu misses, %llu evictions\n",
            (unsigned long long)st.rows_get, (unsigned long long)st.hits,
            (unsigned long long)st.waits, (unsigned long long)st.misses,
            (unsigned long long)st.evictions);
    tm_engram_table_close(et);
    table_free(&t);
}

/* Four threads at once on one table with a 12-row cache: gets and prefetches of overlapping
 * fixed pseudo-random rows, each get compared with the definition. */
typedef struct worker_arg {
    tm_engram_table *et;
    const table *t;
    uint64_t seed;
    int bad;
} worker_arg;

static void *worker_main(void *p) {
    worker_arg *a = p;
    uint64_t x = a->seed, rows[24];
    float out[24 * 32];
    tm_err err = {0};
    for (int step = 0; step < 800; step++) {
        size_t n = 1 + step % 24;
        for (size_t i = 0; i < n; i++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            rows[i] = x % 40;
        }
        if (step % 3 == 0)
            tm_engram_table_prefetch(a->et, rows, n);
        if (tm_engram_table_get(a->et, rows, n, out, &err) != TM_OK) {
            a->bad++;
            continue;
        }
        for (size_t i = 0; i < n; i++)
            a->bad += !row_matches(a->t, rows[i], rows[i] < 37, out + i * 32);
    }
    return NULL;
}

static void test_threads(void) {
    table t = table_make(37, 32, 8);
    char path[128];
    path_in(path, sizeof(path), "threads.safetensors");
    table_write(&t, path, TM_DTYPE_F8_E8M0);
    tm_err err = {0};
    tm_engram_table *et = NULL;
    tm_engram_table_cfg cfg = cfg_of(path, 0, 1, 12 * 69);
    cfg.n_io_threads = 3;
    TM_CHECK_OK(tm_engram_table_open(&cfg, &et, &err), &err);
    if (et) {
        TM_CHECK(tm_engram_table_info_get(et)->n_slots == 12);
        pthread_t th[4];
        worker_arg args[4];
        for (int i = 0; i < 4; i++) {
            args[i] = (worker_arg){et, &t, 1000u + (uint64_t)i * 77, 0};
            TM_CHECK(pthread_create(&th[i], NULL, worker_main, &args[i]) == 0);
        }
        int bad = 0;
        for (int i = 0; i < 4; i++) {
            pthread_join(th[i], NULL);
            bad += args[i].bad;
        }
        TM_CHECK(bad == 0);
        tm_engram_table_stats st;
        tm_engram_table_stats_get(et, &st);
        TM_CHECK(st.hits + st.waits + st.misses + st.rows_zero == st.rows_get);
        TM_CHECK(st.evictions > 0);
    }
    tm_engram_table_close(et);
    table_free(&t);
}

static void test_prefetch_then_get(void) {
    table t = table_make(500, 256, 6);
    char path[128];
    path_in(path, sizeof(path), "prefetch.safetensors");
    table_write(&t, path, TM_DTYPE_F8_E8M0);
    tm_err err = {0};
    tm_engram_table *et = NULL;
    tm_engram_table_cfg cfg = cfg_of(path, 0, 1, 1 << 20);
    TM_CHECK_OK(tm_engram_table_open(&cfg, &et, &err), &err);
    if (!et) {
        table_free(&t);
        return;
    }
    uint64_t rows[48];
    for (int i = 0; i < 48; i++)
        rows[i] = (uint64_t)(i * 37 % 500);
    tm_engram_table_prefetch(et, rows, 48);
    tm_engram_table_prefetch(et, rows, 48); // again: already queued, nothing new
    tm_engram_table_stats st;
    tm_engram_table_stats_get(et, &st);
    TM_CHECK(st.prefetch_rows == 96 && st.prefetch_reads == 48 && st.prefetch_drops == 0);
    // Wait for the readers (not a timing check: the loop ends when the reads are done).
    for (int spin = 0; spin < 100000; spin++) {
        tm_engram_table_stats_get(et, &st);
        if (st.reads == 48)
            break;
        usleep(100);
    }
    TM_CHECK(st.reads == 48);
    float out[48 * 256];
    TM_CHECK_OK(tm_engram_table_get(et, rows, 48, out, &err), &err);
    tm_engram_table_stats_get(et, &st);
    TM_CHECK(st.hits == 48 && st.misses == 0 && st.waits == 0 && st.reads == 48);
    int bad = 0;
    for (int i = 0; i < 48; i++)
        bad += !row_matches(&t, rows[i], 1, out + i * 256);
    TM_CHECK(bad == 0);
    // Prefetch and get at once: whatever was in flight is waited for, never read twice.
    uint64_t more[48];
    uint64_t next = 0;
    for (int i = 0; i < 48; i++) { // the first 48 rows that are none of rows[]
        for (int taken = 1; taken; next++) {
            taken = 0;
            for (int j = 0; j < 48; j++)
                taken |= rows[j] == next;
            if (!taken)
                more[i] = next;
        }
    }
    tm_engram_table_prefetch(et, more, 48);
    TM_CHECK_OK(tm_engram_table_get(et, more, 48, out, &err), &err);
    tm_engram_table_stats_get(et, &st);
    TM_CHECK_MSG(st.reads == 96 && st.hits + st.waits == 96 && st.misses == 0,
                 "reads %llu hits %llu waits %llu misses %llu", (unsigned long long)st.reads,
                 (unsigned long long)st.hits, (unsigned long long)st.waits,
                 (unsigned long long)st.misses);
    bad = 0;
    for (int i = 0; i < 48; i++)
        bad += !row_matches(&t, more[i], 1, out + i * 256);
    TM_CHECK(bad == 0);
    tm_engram_table_close(et);
    table_free(&t);
}

static void test_alloc_failures(void) {
    table t = table_make(20, 32, 7);
    char path[128];
    path_in(path, sizeof(path), "alloc.safetensors");
    table_write(&t, path, TM_DTYPE_F8_E8M0);
    tm_engram_table_cfg cfg = cfg_of(path, 0, 1, 1 << 16);
    long live = tm_alloc_live();
    int opened = 0;
    for (long n = 1; n < 200 && !opened; n++) {
        tm_err err = {0};
        tm_engram_table *et = NULL;
        tm_fault_set(TM_FAULT_ALLOC, n);
        tm_rc rc = tm_engram_table_open(&cfg, &et, &err);
        tm_fault_set(TM_FAULT_ALLOC, 0);
        if (rc == TM_OK) {
            opened = 1;
            tm_engram_table_close(et);
        } else {
            TM_CHECK_MSG(rc == TM_E_NOMEM && et == NULL, "alloc %ld: rc %d %s", n, (int)rc,
                         err.msg);
        }
        TM_CHECK(tm_alloc_live() == live);
    }
    TM_CHECK(opened);
    table_free(&t);
}

int main(void) {
    snprintf(g_dir, sizeof(g_dir), "/tmp/tm_engram_XXXXXX");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    TM_RUN(test_values);
    TM_RUN(test_all_pairs);
    TM_RUN(test_shards);
    TM_RUN(test_truncated);
    TM_RUN(test_not_regular);
    TM_RUN(test_bad_tensors);
    TM_RUN(test_folder);
    TM_RUN(test_eviction);
    TM_RUN(test_prefetch_then_get);
    TM_RUN(test_threads);
    TM_RUN(test_alloc_failures);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", g_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", g_dir);
    return tm_test_report();
}
