/* tests/unit/test_jsonl.c - the JSONL source: every kind of bad line in
 * tests/fixtures/jsonl/mixed.jsonl gives the right error code, line and id; good records carry the
 * right fields; the same bytes as .jsonl.lz4 (several frames, split mid-line) and .jsonl.gz (two
 * members) give identical records; corrupt streams fail cleanly; the line limit is exact (CRLF
 * included); a 50 MB file streams in bounded memory; every allocation failing in turn leaks
 * nothing. */
#include <jansson.h>
#include <lz4frame.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "base/alloc.h"
#include "ingest/job_spec.h"
#include "ingest/source.h"
#include "tm_test.h"

static char g_tmp[256];
static char g_fixture[512];     /* tests/fixtures/jsonl/mixed.jsonl */
static char g_fixture_job[512]; /* tests/fixtures/jsonl/job.json */

typedef struct expect {
    uint64_t line;
    tm_errcode code;
    const char *id;  /* id_json, or NULL */
    const char *msg; /* substring of err_msg (errors only) */
} expect;

static const expect expected[] = {
    {1, TM_ERRCODE_NONE, "\"a1\"", NULL},
    {2, TM_ERRCODE_NONE, "2", NULL},
    {5, TM_ERRCODE_INVALID_UTF8, NULL, "invalid UTF-8 at column"},
    {6, TM_ERRCODE_INVALID_JSON, NULL, "control character 0x0"},
    {7, TM_ERRCODE_INVALID_JSON, NULL, "\\u0000 (NUL) is not allowed in strings"},
    {8, TM_ERRCODE_INVALID_JSON, NULL, "byte order mark"},
    {9, TM_ERRCODE_INVALID_JSON, NULL, "invalid JSON at column"},
    {10, TM_ERRCODE_DUPLICATE_ID, "\"a1\"", "field 'id': \"a1\" was already used"},
    {11, TM_ERRCODE_DUPLICATE_ID, "2", "field 'id': 2 was already used"},
    {12, TM_ERRCODE_NONE, "\"2\"", NULL},
    {13, TM_ERRCODE_WRONG_TYPE, NULL, "field 'id': expected a string or an integer, got 1.5"},
    {14, TM_ERRCODE_MISSING_FIELD, NULL, "field 'id' is required"},
    {15, TM_ERRCODE_MISSING_FIELD, "\"np\"", "field 'prompt' or 'messages' is required"},
    {16, TM_ERRCODE_INVALID_VALUE, "\"both\"", "give exactly one of them"},
    {17, TM_ERRCODE_WRONG_TYPE, "\"t1\"",
     "field 'temperature': expected a number >= 0, got \"hot\""},
    {18, TM_ERRCODE_INVALID_VALUE, "\"t2\"",
     "field 'temperature': expected a number >= 0 and <= 2, got -1"},
    {19, TM_ERRCODE_INVALID_VALUE, "\"p1\"",
     "field 'top_p': expected a number > 0 and <= 1, got 0"},
    {20, TM_ERRCODE_INVALID_VALUE, "\"k1\"",
     "field 'top_k': expected an integer from -1 to 2147483647"},
    {21, TM_ERRCODE_INVALID_VALUE, "\"m1\"",
     "field 'max_tokens': expected an integer from 0 to 2147483647 (0: nothing generated), got -1"},
    {22, TM_ERRCODE_WRONG_TYPE, "\"m2\"",
     "field 'max_tokens': expected an integer from 1 to 2147483647, got \"5\""},
    {23, TM_ERRCODE_WRONG_TYPE, "\"s1\"", "field 'stop': expected a non-empty string or an array"},
    {24, TM_ERRCODE_MISSING_FIELD, "\"msg1\"", "field 'messages[0].content' is required"},
    {25, TM_ERRCODE_WRONG_TYPE, "\"msg2\"", "field 'messages': expected an array"},
    {26, TM_ERRCODE_INVALID_VALUE, "\"msg3\"", "field 'messages': expected a non-empty array"},
    {27, TM_ERRCODE_WRONG_TYPE, "\"p2\"", "field 'prompt': expected a string, got 42"},
    {28, TM_ERRCODE_WRONG_TYPE, NULL, "record: expected a JSON object, got [1,2,3]"},
    {29, TM_ERRCODE_INVALID_JSON, NULL, "duplicate object key"},
    {30, TM_ERRCODE_LINE_TOO_LONG, NULL,
     "line is 325 bytes, longer than limits.max_line_bytes (256)"},
    {31, TM_ERRCODE_INVALID_VALUE, "\"seed\"",
     "field 'seed': expected an integer from 0 to 9223372036854775807, got -1"},
    {32, TM_ERRCODE_INVALID_VALUE, "\"minp\"", "field 'min_p': expected a number >= 0 and <= 1"},
    {33, TM_ERRCODE_NONE, "\"last\"", NULL},
};
enum { N_EXPECTED = sizeof(expected) / sizeof(expected[0]) };

// ---- helpers ----

static char *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = malloc((size_t)len + 1);
    *n = fread(p, 1, (size_t)len, f);
    fclose(f);
    return p;
}

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    TM_CHECK(f != NULL);
    if (!f)
        return;
    TM_CHECK(fwrite(p, 1, n, f) == n);
    fclose(f);
}

// Write a job file in g_tmp over the given inputs and load it.
static tm_job_spec *make_spec(const char *const *files, size_t n_files, uint64_t max_line) {
    char job[4096];
    int k = snprintf(job, sizeof(job),
                     "{\"model\": \"m\", \"output\": {\"dir\": \"o\"}, "
                     "\"limits\": {\"max_line_bytes\": %llu}, \"input\": "
                     "{\"files\": [",
                     (unsigned long long)max_line);
    for (size_t i = 0; i < n_files; i++)
        k += snprintf(job + k, sizeof(job) - (size_t)k, "%s\"%s\"", i ? ", " : "", files[i]);
    snprintf(job + k, sizeof(job) - (size_t)k, "]}}");
    char path[512];
    snprintf(path, sizeof(path), "%s/job.json", g_tmp);
    write_bytes(path, job, strlen(job));
    tm_job_spec *spec = NULL;
    tm_err err = {0};
    TM_CHECK_OK(tm_job_spec_load(path, &spec, &err), &err);
    return spec;
}

// Everything a record says except its file name, as one string (to compare formats).
static void job_sig(const tm_job *j, char *out, size_t n) {
    int k = snprintf(out, n, "%llu|%llu|%d|%s|%s|%s|%u|", (unsigned long long)j->seq_no,
                     (unsigned long long)j->line, (int)j->err_code, j->id_json ? j->id_json : "-",
                     j->err_msg ? j->err_msg : "-", j->prompt ? j->prompt : "-", j->n_messages);
    for (uint32_t i = 0; i < j->n_messages && k < (int)n; i++)
        k += snprintf(out + k, n - (size_t)k, "%s:%s|", j->messages[i].role,
                      j->messages[i].content);
    if (k < (int)n)
        k += snprintf(out + k, n - (size_t)k, "%x|%d|%g|%g|%d|%g|%llu|%u", j->sp.set,
                      j->sp.max_tokens, j->sp.temperature, j->sp.top_p, j->sp.top_k, j->sp.min_p,
                      (unsigned long long)j->sp.seed, j->sp.n_stop);
    for (uint32_t i = 0; i < j->sp.n_stop && k < (int)n; i++)
        k += snprintf(out + k, n - (size_t)k, "|%s", j->sp.stop[i]);
}

// Read every record of spec; signatures into sigs[] (up to max). Returns the final rc.
static tm_rc read_sigs(const tm_job_spec *spec, char sigs[][1024], size_t max, size_t *n,
                       tm_err *err) {
    tm_source *src = NULL;
    tm_rc rc = tm_source_open(spec, &src, err);
    *n = 0;
    while (!rc) {
        tm_job *job = NULL;
        rc = tm_source_next(src, &job, err);
        if (rc)
            break;
        if (*n < max)
            job_sig(job, sigs[*n], sizeof(sigs[0]));
        (*n)++;
        tm_job_destroy(job);
    }
    tm_source_destroy(src);
    return rc;
}

// ---- tests ----

static void test_fixture(void) {
    tm_job_spec *spec = NULL;
    tm_err err = {0};
    TM_CHECK_OK(tm_job_spec_load(g_fixture_job, &spec, &err), &err);
    if (!spec)
        return;
    TM_CHECK(spec->max_line_bytes == 256);
    tm_source *src = NULL;
    TM_CHECK_OK(tm_source_open(spec, &src, &err), &err);
    size_t i = 0;
    for (;; i++) {
        tm_job *job = NULL;
        tm_rc rc = tm_source_next(src, &job, &err);
        if (rc == TM_E_EOF)
            break;
        TM_CHECK_OK(rc, &err);
        if (rc)
            break;
        if (i >= N_EXPECTED) {
            TM_CHECK_MSG(0, "extra record at line %llu", (unsigned long long)job->line);
            tm_job_destroy(job);
            continue;
        }
        const expect *e = &expected[i];
        TM_CHECK(job->seq_no == i);
        TM_CHECK(strcmp(job->file, spec->inputs[0]) == 0);
        TM_CHECK_MSG(job->line == e->line, "record %zu: line %llu, want %llu", i,
                     (unsigned long long)job->line, (unsigned long long)e->line);
        TM_CHECK_MSG(job->err_code == e->code, "line %llu: code %s, want %s (%s)",
                     (unsigned long long)e->line, tm_errcode_name(job->err_code),
                     tm_errcode_name(e->code), job->err_msg ? job->err_msg : "");
        TM_CHECK_MSG((!e->id && !job->id_json) ||
                         (e->id && job->id_json && strcmp(e->id, job->id_json) == 0),
                     "line %llu: id %s", (unsigned long long)e->line,
                     job->id_json ? job->id_json : "NULL");
        if (e->msg)
            TM_CHECK_MSG(job->err_msg && strstr(job->err_msg, e->msg), "line %llu: message '%s'",
                         (unsigned long long)e->line, job->err_msg ? job->err_msg : "NULL");
        if (job->err_code) { // error records carry nothing else
            TM_CHECK(!job->prompt && !job->messages && job->sp.set == 0 && !job->sp.stop);
        } else {
            TM_CHECK(!job->err_msg);
        }
        if (e->line == 1) {
            TM_CHECK(job->prompt && strcmp(job->prompt, "Hello") == 0);
            TM_CHECK(job->n_messages == 0 && job->sp.set == 0);
        }
        if (e->line == 2) {
            TM_CHECK(!job->prompt && job->n_messages == 2);
            if (job->n_messages == 2) {
                TM_CHECK(strcmp(job->messages[0].role, "system") == 0);
                TM_CHECK(strcmp(job->messages[0].content, "Be brief.") == 0);
                TM_CHECK(strcmp(job->messages[1].role, "user") == 0);
                TM_CHECK(strcmp(job->messages[1].content, "Hi \"there\"\n\xc3\xa9") == 0);
            }
            TM_CHECK(job->sp.set == (TM_SP_MAX_TOKENS | TM_SP_TEMPERATURE | TM_SP_TOP_P |
                                     TM_SP_TOP_K | TM_SP_MIN_P | TM_SP_SEED | TM_SP_STOP));
            TM_CHECK(job->sp.max_tokens == 5 && job->sp.temperature == 0.0f);
            TM_CHECK(job->sp.top_p == 0.5f && job->sp.top_k == 40 && job->sp.seed == 7);
            TM_CHECK_NEAR(job->sp.min_p, 0.1, 1e-6);
            TM_CHECK(job->sp.n_stop == 2);
            if (job->sp.n_stop == 2)
                TM_CHECK(strcmp(job->sp.stop[0], "\n\n") == 0 &&
                         strcmp(job->sp.stop[1], "END") == 0);
        }
        if (e->line == 12) {
            TM_CHECK(job->sp.set == TM_SP_STOP && job->sp.n_stop == 1);
            if (job->sp.n_stop == 1)
                TM_CHECK(strcmp(job->sp.stop[0], "###") == 0);
        }
        if (e->line == 33)
            TM_CHECK(job->prompt && strcmp(job->prompt, "no newline at the end") == 0);
        tm_job_destroy(job);
    }
    TM_CHECK_MSG(i == N_EXPECTED, "%zu records, want %d", i, (int)N_EXPECTED);
    TM_CHECK(tm_source_n_records(src) == N_EXPECTED);
    // EOF is sticky.
    tm_job *job = NULL;
    TM_CHECK(tm_source_next(src, &job, &err) == TM_E_EOF);
    tm_source_destroy(src);
    tm_job_spec_destroy(spec);
}

// Compress data as LZ4 frames split at the given offsets (mid-line on purpose).
static void write_lz4(const char *path, const char *data, size_t n, const size_t *cuts,
                      size_t n_cuts) {
    FILE *f = fopen(path, "wb");
    TM_CHECK(f != NULL);
    size_t prev = 0;
    for (size_t c = 0; c <= n_cuts; c++) {
        size_t end = c < n_cuts ? cuts[c] : n;
        LZ4F_preferences_t prefs;
        memset(&prefs, 0, sizeof(prefs));
        prefs.frameInfo.contentChecksumFlag = LZ4F_contentChecksumEnabled;
        size_t cap = LZ4F_compressFrameBound(end - prev, &prefs);
        void *dst = malloc(cap);
        size_t r = LZ4F_compressFrame(dst, cap, data + prev, end - prev, &prefs);
        TM_CHECK(!LZ4F_isError(r));
        fwrite(dst, 1, r, f);
        free(dst);
        prev = end;
    }
    fclose(f);
}

static void test_compressed_same(void) {
    size_t n = 0;
    char *data = read_all(g_fixture, &n);
    TM_CHECK(data != NULL);
    if (!data)
        return;
    char p_plain[512], p_lz4[512], p_gz[512];
    snprintf(p_plain, sizeof(p_plain), "%s/mixed.jsonl", g_tmp);
    snprintf(p_lz4, sizeof(p_lz4), "%s/mixed.jsonl.lz4", g_tmp);
    snprintf(p_gz, sizeof(p_gz), "%s/mixed.jsonl.gz", g_tmp);
    write_bytes(p_plain, data, n);
    size_t cuts[] = {n / 3, 2 * n / 3};
    write_lz4(p_lz4, data, n, cuts, 2);
    gzFile gz = gzopen(p_gz, "wb");
    gzwrite(gz, data, (unsigned)(n / 2));
    gzclose(gz);
    gz = gzopen(p_gz, "ab"); // a second gzip member
    gzwrite(gz, data + n / 2, (unsigned)(n - n / 2));
    gzclose(gz);

    static char want[N_EXPECTED + 4][1024], got[N_EXPECTED + 4][1024];
    size_t n_want = 0, n_got = 0;
    tm_err err = {0};
    const char *names[] = {"mixed.jsonl", "mixed.jsonl.lz4", "mixed.jsonl.gz"};
    for (int k = 0; k < 3; k++) {
        tm_job_spec *spec = make_spec(&names[k], 1, 256);
        if (!spec)
            continue;
        tm_rc rc = read_sigs(spec, k == 0 ? want : got, N_EXPECTED + 4, k == 0 ? &n_want : &n_got,
                             &err);
        TM_CHECK_MSG(rc == TM_E_EOF, "%s: %s", names[k], err.msg);
        if (k > 0) {
            TM_CHECK_MSG(n_got == n_want, "%s: %zu records, want %zu", names[k], n_got, n_want);
            for (size_t i = 0; i < n_got && i < n_want; i++)
                TM_CHECK_MSG(strcmp(want[i], got[i]) == 0, "%s record %zu:\n %s\n %s", names[k], i,
                             got[i], want[i]);
        }
        tm_job_spec_destroy(spec);
    }
    TM_CHECK(n_want == N_EXPECTED);

    // All three in one job: ids repeat across files, so files 2 and 3 are duplicates except for
    // the lines that had no readable id; line numbers restart per file.
    tm_job_spec *spec = make_spec(names, 3, 256);
    if (spec) {
        tm_source *src = NULL;
        TM_CHECK_OK(tm_source_open(spec, &src, &err), &err);
        size_t i = 0, n_dup = 0;
        tm_job *job = NULL;
        while (tm_source_next(src, &job, &err) == TM_OK) {
            if (i >= N_EXPECTED) {
                const expect *e = &expected[i % N_EXPECTED];
                TM_CHECK(job->line == e->line);
                TM_CHECK(strcmp(job->file, spec->inputs[i / N_EXPECTED]) == 0);
                if (e->id) {
                    TM_CHECK_MSG(job->err_code == TM_ERRCODE_DUPLICATE_ID, "line %llu: %s",
                                 (unsigned long long)job->line, tm_errcode_name(job->err_code));
                    n_dup += job->err_code == TM_ERRCODE_DUPLICATE_ID;
                }
            }
            TM_CHECK(job->seq_no == i);
            i++;
            tm_job_destroy(job);
        }
        TM_CHECK(err.rc == TM_OK || i == 3 * N_EXPECTED);
        TM_CHECK(i == 3 * N_EXPECTED);
        TM_CHECK(n_dup > 40);
        tm_source_destroy(src);
        tm_job_spec_destroy(spec);
    }

    // Truncated LZ4 and gzip streams are errors of the source, not records.
    FILE *f = fopen(p_lz4, "rb");
    char buf[8192];
    size_t nz = fread(buf, 1, sizeof(buf), f);
    fclose(f);
    snprintf(p_lz4, sizeof(p_lz4), "%s/cut.jsonl.lz4", g_tmp);
    write_bytes(p_lz4, buf, nz - 10);
    f = fopen(p_gz, "rb");
    nz = fread(buf, 1, sizeof(buf), f);
    fclose(f);
    snprintf(p_gz, sizeof(p_gz), "%s/cut.jsonl.gz", g_tmp);
    write_bytes(p_gz, buf, nz - 10);
    snprintf(p_plain, sizeof(p_plain), "%s/bad.jsonl.lz4", g_tmp);
    write_bytes(p_plain, "this is not lz4\n", 16);
    const char *bad[] = {"cut.jsonl.lz4", "cut.jsonl.gz", "bad.jsonl.lz4"};
    const char *bad_msg[] = {"truncated LZ4 stream", "gzip: ", "corrupt LZ4 stream"};
    for (int k = 0; k < 3; k++) {
        spec = make_spec(&bad[k], 1, 256);
        if (!spec)
            continue;
        size_t n_rec = 0;
        tm_err e2 = {0};
        tm_rc rc = read_sigs(spec, got, N_EXPECTED + 4, &n_rec, &e2);
        TM_CHECK_MSG(rc == TM_E_PARSE, "%s: rc %s (%s)", bad[k], tm_rc_name(rc), e2.msg);
        TM_CHECK_MSG(strstr(e2.msg, bad_msg[k]) && strstr(e2.msg, bad[k]), "%s: %s", bad[k],
                     e2.msg);
        tm_job_spec_destroy(spec);
    }
    free(data);
}

// The limit counts the line without "\r\n": exactly max bytes pass, max + 1 do not.
static void test_line_limit(void) {
    const char *ok32 = "{\"id\":\"b\",\"prompt\":\"xxxxxxxxxx\"}"; // 32 bytes
    TM_CHECK(strlen(ok32) == 32);
    char data[512];
    snprintf(data, sizeof(data),
             "%s\r\n%s\n{\"id\":\"c\",\"prompt\":\"xxxxxxxxxxx\"}\r\n"
             "{\"id\":\"d\",\"prompt\":\"xxxxxxxxxxx\"}\n%s",
             ok32, "{\"id\":\"a\",\"prompt\":\"xxxxxxxxxx\"}",
             "{\"id\":\"e\",\"prompt\":\"yyyyyyyyy\"}");
    char p[512];
    snprintf(p, sizeof(p), "%s/limit.jsonl", g_tmp);
    write_bytes(p, data, strlen(data));
    const char *name = "limit.jsonl";
    tm_job_spec *spec = make_spec(&name, 1, 32);
    if (!spec)
        return;
    tm_source *src = NULL;
    tm_err err = {0};
    TM_CHECK_OK(tm_source_open(spec, &src, &err), &err);
    tm_errcode want[] = {TM_ERRCODE_NONE, TM_ERRCODE_NONE, TM_ERRCODE_LINE_TOO_LONG,
                         TM_ERRCODE_LINE_TOO_LONG, TM_ERRCODE_NONE};
    for (int i = 0; i < 5; i++) {
        tm_job *job = NULL;
        TM_CHECK_OK(tm_source_next(src, &job, &err), &err);
        if (!job)
            break;
        TM_CHECK_MSG(job->err_code == want[i], "line %d: %s %s", i + 1,
                     tm_errcode_name(job->err_code), job->err_msg ? job->err_msg : "");
        if (want[i] == TM_ERRCODE_LINE_TOO_LONG)
            TM_CHECK(strstr(job->err_msg, "line is 33 bytes") != NULL);
        TM_CHECK(job->line == (uint64_t)i + 1);
        tm_job_destroy(job);
    }
    tm_job *job = NULL;
    TM_CHECK(tm_source_next(src, &job, &err) == TM_E_EOF);
    tm_source_destroy(src);
    tm_job_spec_destroy(spec);

    // Empty files and files of blank lines give no records.
    snprintf(p, sizeof(p), "%s/empty.jsonl", g_tmp);
    write_bytes(p, "", 0);
    snprintf(p, sizeof(p), "%s/blank.jsonl", g_tmp);
    write_bytes(p, "\n\r\n  \n\t", 7);
    const char *names[] = {"empty.jsonl", "blank.jsonl"};
    spec = make_spec(names, 2, 32);
    if (spec) {
        TM_CHECK_OK(tm_source_open(spec, &src, &err), &err);
        TM_CHECK(tm_source_next(src, &job, &err) == TM_E_EOF);
        tm_source_destroy(src);
        tm_job_spec_destroy(spec);
    }
}

// A 50 MB file (with 1 MB lines over a 64 KiB limit) streams with a bounded number of live
// allocations and a line buffer bounded by the limit.
static void test_memory_bound(void) {
    char p[512];
    snprintf(p, sizeof(p), "%s/big.jsonl", g_tmp);
    FILE *f = fopen(p, "wb");
    TM_CHECK(f != NULL);
    if (!f)
        return;
    char pad[241];
    memset(pad, 'x', 240);
    pad[240] = '\0';
    size_t total = 0, n_lines = 0, n_long = 0;
    char *huge = malloc(1 << 20);
    memset(huge, 'y', 1 << 20);
    while (total < 50u * 1000 * 1000) {
        if (n_lines % 50000 == 49999) {
            fputs("{\"id\":\"huge\",\"prompt\":\"", f);
            fwrite(huge, 1, 1 << 20, f);
            fputs("\"}\n", f);
            total += (1 << 20) + 26;
            n_long++;
        } else {
            total += (size_t)fprintf(f, "{\"id\":%zu,\"prompt\":\"%s\"}\n", n_lines, pad);
        }
        n_lines++;
    }
    fclose(f);
    free(huge);
    const char *name = "big.jsonl";
    tm_job_spec *spec = make_spec(&name, 1, 64 * 1024);
    if (!spec)
        return;
    tm_source *src = NULL;
    tm_err err = {0};
    TM_CHECK_OK(tm_source_open(spec, &src, &err), &err);
    long base = tm_alloc_live();
    long max_live = 0;
    size_t max_cap = 0, n = 0, n_too_long = 0;
    for (;;) {
        tm_job *job = NULL;
        tm_rc rc = tm_source_next(src, &job, &err);
        if (rc) {
            TM_CHECK_MSG(rc == TM_E_EOF, "%s", err.msg);
            break;
        }
        n++;
        n_too_long += job->err_code == TM_ERRCODE_LINE_TOO_LONG;
        max_live = TM_MAX(max_live, tm_alloc_live() - base);
        max_cap = TM_MAX(max_cap, tm_source_line_cap(src));
        tm_job_destroy(job);
    }
    TM_CHECK(n == n_lines);
    TM_CHECK(n_too_long == n_long && n_long >= 3);
    TM_CHECK_MSG(max_live <= 8, "live allocations grew by %ld", max_live); // job + strings + id set
    TM_CHECK_MSG(max_cap <= 2 * (64 * 1024 + 2), "line buffer %zu bytes", max_cap);
    tm_source_destroy(src);
    tm_job_spec_destroy(spec);
    remove(p);
}

// Every allocation made while reading the fixture fails in turn: NOMEM comes back, no leaks.
static void test_alloc_faults(void) {
    tm_job_spec *spec = NULL;
    tm_err err = {0};
    TM_CHECK_OK(tm_job_spec_load(g_fixture_job, &spec, &err), &err);
    if (!spec)
        return;
    long base = tm_alloc_live();
    int n_fail = 0;
    for (long k = 1; k < 100000; k++) {
        tm_source *src = NULL;
        tm_fault_set(TM_FAULT_ALLOC, k);
        tm_rc rc = tm_source_open(spec, &src, &err);
        while (!rc) {
            tm_job *job = NULL;
            rc = tm_source_next(src, &job, &err);
            tm_job_destroy(job);
        }
        tm_fault_set(TM_FAULT_ALLOC, 0);
        tm_source_destroy(src);
        TM_CHECK(tm_alloc_live() == base);
        if (rc == TM_E_EOF)
            break;
        TM_CHECK_MSG(rc == TM_E_NOMEM, "alloc %ld: %s %s", k, tm_rc_name(rc), err.msg);
        n_fail++;
    }
    TM_CHECK(n_fail > 50);
    tm_job_spec_destroy(spec);
}

// With TM_SAMPLE_DIR set, write "path<TAB>line<TAB>code" for every record of the fixture and of
// jobs/data/ to verdicts.tsv there: e2e_schemas.sh checks that record.schema.json agrees.
static void write_verdicts(void) {
    const char *dir = getenv("TM_SAMPLE_DIR");
    const char *src_dir = getenv("TM_SRC");
    if (!dir)
        return;
    char path[512], data_dir[512];
    snprintf(path, sizeof(path), "%s/verdicts.tsv", dir);
    snprintf(data_dir, sizeof(data_dir), "%s/jobs/data", src_dir ? src_dir : ".");
    FILE *out = fopen(path, "w");
    TM_CHECK(out != NULL);
    if (!out)
        return;
    tm_job_spec *specs[2] = {NULL, NULL};
    tm_err err = {0};
    TM_CHECK_OK(tm_job_spec_load(g_fixture_job, &specs[0], &err), &err);
    struct stat st;
    if (stat(data_dir, &st) == 0) {
        const char *entry = data_dir;
        specs[1] = make_spec(&entry, 1, 16u << 20);
    }
    for (int k = 0; k < 2; k++) {
        if (!specs[k])
            continue;
        tm_source *src = NULL;
        TM_CHECK_OK(tm_source_open(specs[k], &src, &err), &err);
        tm_job *job = NULL;
        while (src && tm_source_next(src, &job, &err) == TM_OK) {
            fprintf(out, "%s\t%llu\t%s\n", job->file, (unsigned long long)job->line,
                    tm_errcode_name(job->err_code));
            tm_job_destroy(job);
        }
        tm_source_destroy(src);
        tm_job_spec_destroy(specs[k]);
    }
    fclose(out);
}

int main(void) {
    const char *src = getenv("TM_SRC");
    snprintf(g_fixture, sizeof(g_fixture), "%s/tests/fixtures/jsonl/mixed.jsonl", src ? src : ".");
    snprintf(g_fixture_job, sizeof(g_fixture_job), "%s/tests/fixtures/jsonl/job.json",
             src ? src : ".");
    snprintf(g_tmp, sizeof(g_tmp), "/tmp/tm_jsonl_XXXXXX");
    if (!mkdtemp(g_tmp))
        return 1;
    TM_RUN(test_fixture);
    TM_RUN(test_compressed_same);
    TM_RUN(test_line_limit);
    TM_RUN(test_memory_bound);
    TM_RUN(test_alloc_faults);
    TM_RUN(write_verdicts);
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_tmp);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", g_tmp);
    return tm_test_report();
}
