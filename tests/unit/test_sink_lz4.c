/* tests/unit/test_sink_lz4.c - the completions/errors sink: LZ4 round trip through the frame API
 * with frame boundaries where the options put them, `lz4 -t` / `lz4 -dc` on the result, every line
 * parses as JSON with the right fields, escaping of quotes, newlines, controls, unicode and invalid
 * UTF-8, huge lines, flush durability points, append mode, error lines. With TM_SAMPLE_DIR set the
 * sample output is left there (e2e_schemas.sh validates it against the schemas). */
#include <jansson.h>
#include <lz4frame.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/alloc.h"
#include "sink/sink.h"
#include "tm_test.h"

static char g_tmp[256];

typedef struct decoded {
    char *data; /* malloc'd */
    size_t len;
    int n_frames;
} decoded;

// Decode a whole .lz4 file with the frame API; counts frames (LZ4F_decompress returning 0).
static int decode_file(const char *path, decoded *d) {
    memset(d, 0, sizeof(*d));
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    LZ4F_dctx *dctx = NULL;
    LZ4F_createDecompressionContext(&dctx, LZ4F_VERSION);
    size_t cap = 1 << 16;
    d->data = malloc(cap);
    unsigned char in[4096];
    size_t n, r = 0;
    int bad = 0;
    while (!bad) {
        n = fread(in, 1, sizeof(in), f);
        if (n == 0)
            break;
        size_t pos = 0;
        while (pos < n) {
            if (cap - d->len < (1 << 16)) {
                cap *= 2;
                d->data = realloc(d->data, cap);
            }
            size_t dst_n = cap - d->len, src_n = n - pos;
            r = LZ4F_decompress(dctx, d->data + d->len, &dst_n, in + pos, &src_n, NULL);
            if (LZ4F_isError(r)) {
                fprintf(stderr, "decode %s: %s\n", path, LZ4F_getErrorName(r));
                bad = 1;
                break;
            }
            d->len += dst_n;
            pos += src_n;
            if (r == 0)
                d->n_frames++;
        }
    }
    fclose(f);
    LZ4F_freeDecompressionContext(dctx);
    d->data = realloc(d->data, d->len + 1);
    d->data[d->len] = '\0';
    return bad || r != 0 ? -1 : 0;
}

static tm_completion make_ok(uint64_t i, const char *id_json, const char *text) {
    tm_completion c = {0};
    c.seq_no = i;
    c.id_json = (char *)id_json;
    c.text = (char *)text;
    c.finish = i % 2 ? TM_FINISH_LENGTH : TM_FINISH_STOP;
    c.n_tok_prompt = 10 + (uint32_t)i;
    c.n_tok_gen = 3;
    c.n_tok_cached = (uint32_t)i % 5;
    c.ttft_ms = 1.5 + (double)i;
    c.total_ms = 2.25 + (double)i;
    return c;
}

// Parse every line of d; check count and the i-th record's fields.
static void check_lines(const decoded *d, size_t want_n, int check_fields) {
    size_t n = 0;
    const char *p = d->data, *end = d->data + d->len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        TM_CHECK(nl != NULL);
        if (!nl)
            break;
        json_error_t jerr;
        json_t *j = json_loadb(p, (size_t)(nl - p), JSON_REJECT_DUPLICATES, &jerr);
        TM_CHECK_MSG(j != NULL, "line %zu: %s", n + 1, jerr.text);
        if (j && check_fields) {
            TM_CHECK(json_integer_value(json_object_get(j, "id")) == (json_int_t)n);
            TM_CHECK(json_is_string(json_object_get(j, "text")));
            const char *fr = json_string_value(json_object_get(j, "finish_reason"));
            TM_CHECK(fr && strcmp(fr, n % 2 ? "length" : "stop") == 0);
            json_t *u = json_object_get(j, "usage");
            TM_CHECK(json_integer_value(json_object_get(u, "prompt_tokens")) == 10 + (json_int_t)n);
            TM_CHECK(json_integer_value(json_object_get(u, "completion_tokens")) == 3);
            TM_CHECK(json_integer_value(json_object_get(u, "cached_tokens")) == (json_int_t)n % 5);
            json_t *t = json_object_get(j, "timing");
            TM_CHECK_NEAR(json_number_value(json_object_get(t, "ttft_ms")), 1.5 + (double)n, 1e-9);
            TM_CHECK_NEAR(json_number_value(json_object_get(t, "total_ms")), 2.25 + (double)n,
                          1e-9);
            TM_CHECK(json_object_size(j) == 5);
        }
        json_decref(j);
        n++;
        p = nl + 1;
    }
    TM_CHECK_MSG(n == want_n, "%zu lines, want %zu", n, want_n);
}

static int have_lz4_cli(void) { return system("command -v lz4 >/dev/null 2>&1") == 0; }

// `lz4 -t` accepts the file and `lz4 -dc` gives exactly what the frame API gave.
static void check_cli(const char *path, const decoded *d) {
    if (!have_lz4_cli()) {
        fprintf(stderr, "note: lz4 CLI not found, CLI checks skipped\n");
        return;
    }
    char cmd[1200];
    snprintf(cmd, sizeof(cmd), "lz4 -q -t '%s'", path);
    TM_CHECK_MSG(system(cmd) == 0, "%s", cmd);
    snprintf(cmd, sizeof(cmd), "lz4 -q -dc '%s'", path);
    FILE *p = popen(cmd, "r");
    TM_CHECK(p != NULL);
    if (!p)
        return;
    size_t cap = d->len + 1024, n = 0, k;
    char *buf = malloc(cap);
    for (;;) {
        k = fread(buf + n, 1, cap - n, p);
        if (k == 0)
            break;
        n += k;
    }
    TM_CHECK(pclose(p) == 0);
    TM_CHECK_MSG(n == d->len && memcmp(buf, d->data, n) == 0, "lz4 -dc gave %zu bytes, want %zu", n,
                 d->len);
    free(buf);
}

static void test_round_trip_frames(void) {
    char dir[512], path[600];
    snprintf(dir, sizeof(dir), "%s/rt/a/b", g_tmp); // parents are created
    snprintf(path, sizeof(path), "%s/%s", dir, TM_SINK_COMPLETIONS_FILE);
    tm_sink *sink = NULL;
    tm_err err = {0};
    tm_sink_opts opts = {.frame_records = 100, .no_fsync = true};
    TM_CHECK_OK(tm_sink_open(dir, &opts, &sink, &err), &err);
    if (!sink)
        return;
    char id[32], text[64];
    for (int i = 0; i < 1000; i++) {
        snprintf(id, sizeof(id), "%d", i);
        snprintf(text, sizeof(text), "completion number %d", i);
        tm_completion c = make_ok((uint64_t)i, id, text);
        TM_CHECK_OK(tm_sink_write(sink, &c, &err), &err);
    }
    tm_sink_stats st;
    tm_sink_get_stats(sink, &st);
    TM_CHECK(st.n_ok == 1000 && st.n_err == 0 && st.n_frames == 10);
    // 5 more records, then close: one more (short) frame.
    for (int i = 1000; i < 1005; i++) {
        snprintf(id, sizeof(id), "%d", i);
        tm_completion c = make_ok((uint64_t)i, id, "tail");
        TM_CHECK_OK(tm_sink_write(sink, &c, &err), &err);
    }
    TM_CHECK_OK(tm_sink_close(sink, &err), &err);
    decoded d;
    TM_CHECK(decode_file(path, &d) == 0);
    TM_CHECK_MSG(d.n_frames == 11, "%d frames", d.n_frames);
    check_lines(&d, 1005, 1);
    static const char first[] =
        "{\"id\":0,\"text\":\"completion number 0\",\"finish_reason\":\"stop\","
        "\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":3,"
        "\"cached_tokens\":0},\"timing\":{\"ttft_ms\":1.500,"
        "\"total_ms\":2.250}}\n";
    TM_CHECK(strncmp(d.data, first, sizeof(first) - 1) == 0);
    check_cli(path, &d);
    free(d.data);

    // Byte cadence: frames close after >= 1000 uncompressed bytes.
    tm_sink_opts by_bytes = {.frame_bytes = 1000, .no_fsync = true};
    TM_CHECK_OK(tm_sink_open(dir, &by_bytes, &sink, &err), &err);
    size_t raw = 0;
    for (int i = 0; i < 200; i++) {
        snprintf(id, sizeof(id), "%d", i);
        tm_completion c = make_ok((uint64_t)i, id, "abc");
        TM_CHECK_OK(tm_sink_write(sink, &c, &err), &err);
    }
    tm_sink_get_stats(sink, &st);
    raw = st.bytes_raw;
    TM_CHECK_OK(tm_sink_close(sink, &err), &err);
    TM_CHECK(decode_file(path, &d) == 0);
    TM_CHECK(d.len == raw);
    size_t line_len = raw / 200; // all lines are about the same length
    int want_frames = (int)((raw + 999 + line_len) / (1000 + line_len));
    TM_CHECK_MSG(d.n_frames >= want_frames - 2 && d.n_frames <= want_frames + 2,
                 "%d frames for %zu bytes", d.n_frames, raw);
    check_lines(&d, 200, 1);
    free(d.data);
}

static void test_escaping(void) {
    char dir[512], path[600];
    snprintf(dir, sizeof(dir), "%s/esc", g_tmp);
    snprintf(path, sizeof(path), "%s/%s", dir, TM_SINK_COMPLETIONS_FILE);
    const char *texts[] = {
        "say \"hi\" \\ bye",
        "line1\nline2\r\n\ttabbed",
        "ctl \x01\x1f\x7f end",
        "unicode h\xc3\xa9llo \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80",
        "bad \xff\xfe utf8 \xc3",
        "</script> & <b>",
        "",
    };
    const char *want[] = {
        "say \"hi\" \\ bye",
        "line1\nline2\r\n\ttabbed",
        "ctl \x01\x1f\x7f end",
        "unicode h\xc3\xa9llo \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80",
        "bad \xef\xbf\xbd\xef\xbf\xbd utf8 \xef\xbf\xbd",
        "</script> & <b>",
        "",
    };
    enum { N = sizeof(texts) / sizeof(texts[0]) };
    tm_sink *sink = NULL;
    tm_err err = {0};
    TM_CHECK_OK(tm_sink_open(dir, &(tm_sink_opts){.no_fsync = true}, &sink, &err), &err);
    if (!sink)
        return;
    const char *ids[N] = {"\"q\\\"1\"", "\"\\u00e9\"", "3", "\"x\"", "\"y\"", "\"z\"", "-7"};
    for (int i = 0; i < N; i++) {
        tm_completion c = make_ok((uint64_t)i, ids[i], texts[i]);
        TM_CHECK_OK(tm_sink_write(sink, &c, &err), &err);
    }
    // A 3 MB text goes through in slices.
    size_t big_n = 3u << 20;
    char *big = malloc(big_n + 1);
    for (size_t i = 0; i < big_n; i++)
        big[i] = (char)('a' + i % 26);
    big[big_n] = '\0';
    tm_completion c = make_ok(N, "\"big\"", big);
    TM_CHECK_OK(tm_sink_write(sink, &c, &err), &err);
    // An ok record needs an id.
    c = make_ok(0, NULL, "x");
    TM_CHECK(tm_sink_write(sink, &c, &err) == TM_E_INVAL);
    TM_CHECK_OK(tm_sink_close(sink, &err), &err);

    decoded d;
    TM_CHECK(decode_file(path, &d) == 0);
    check_lines(&d, N + 1, 0);
    const char *p = d.data;
    for (int i = 0; i < N + 1; i++) {
        const char *nl = strchr(p, '\n');
        if (!nl)
            break;
        json_error_t jerr;
        json_t *j = json_loadb(p, (size_t)(nl - p), 0, &jerr);
        const char *t = json_string_value(json_object_get(j, "text"));
        if (i < N) {
            TM_CHECK_MSG(t && strcmp(t, want[i]) == 0, "text %d: %s", i, t ? t : "NULL");
            char *id = json_dumps(json_object_get(j, "id"), JSON_ENCODE_ANY | JSON_COMPACT);
            json_t *want_id = json_loads(ids[i], JSON_DECODE_ANY, &jerr);
            TM_CHECK(json_equal(json_object_get(j, "id"), want_id));
            json_decref(want_id);
            free(id);
        } else {
            TM_CHECK(t && strlen(t) == big_n && memcmp(t, big, big_n) == 0);
        }
        json_decref(j);
        p = nl + 1;
    }
    // Raw escapes: a newline inside text never splits the line; controls use \u00XX.
    TM_CHECK(strstr(d.data, "\"line1\\nline2\\r\\n\\ttabbed\"") != NULL);
    TM_CHECK(strstr(d.data, "\"ctl \\u0001\\u001f\\u007f end\"") != NULL);
    check_cli(path, &d);
    free(d.data);
    free(big);
}

static void test_errors_file(void) {
    char dir[512], path[600];
    snprintf(dir, sizeof(dir), "%s/err", g_tmp);
    snprintf(path, sizeof(path), "%s/%s", dir, TM_SINK_ERRORS_FILE);
    tm_sink *sink = NULL;
    tm_err err = {0};
    TM_CHECK_OK(tm_sink_open(dir, &(tm_sink_opts){.no_fsync = true}, &sink, &err), &err);
    if (!sink)
        return;
    tm_completion e1 = {.file = "data/in \"1\".jsonl",
                        .line = 7,
                        .id_json = "\"a7\"",
                        .err_code = TM_ERRCODE_WRONG_TYPE,
                        .err_msg = "field 'temperature': expected a number >= 0, got \"hot\""};
    tm_completion e2 = {.file = "data/in.jsonl",
                        .line = 9,
                        .err_code = TM_ERRCODE_INVALID_UTF8,
                        .err_msg = "invalid UTF-8 at column 3: near '\xff'"};
    tm_completion e3 = {.id_json = "12",
                        .err_code = TM_ERRCODE_CONTEXT_LENGTH_EXCEEDED,
                        .err_msg = "prompt is 9000 tokens\nlimit 4096"};
    TM_CHECK_OK(tm_sink_write(sink, &e1, &err), &err);
    TM_CHECK_OK(tm_sink_write(sink, &e2, &err), &err);
    TM_CHECK_OK(tm_sink_write(sink, &e3, &err), &err);
    tm_sink_stats st;
    tm_sink_get_stats(sink, &st);
    TM_CHECK(st.n_err == 3 && st.n_ok == 0);
    // Flushed: the file is complete on disk while the sink is still open.
    TM_CHECK_OK(tm_sink_flush(sink, &err), &err);
    FILE *f = fopen(path, "rb");
    char buf[2048];
    size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = '\0';
    const char *want =
        "{\"id\":\"a7\",\"file\":\"data/in \\\"1\\\".jsonl\",\"line\":7,\"error\":{\"code\":"
        "\"wrong_type\",\"message\":\"field 'temperature': expected a number >= 0, got "
        "\\\"hot\\\"\"}}\n"
        "{\"file\":\"data/in.jsonl\",\"line\":9,\"error\":{\"code\":\"invalid_utf8\",\"message\":"
        "\"invalid UTF-8 at column 3: near '\xef\xbf\xbd'\"}}\n"
        "{\"id\":12,\"error\":{\"code\":\"context_length_exceeded\",\"message\":\"prompt is 9000 "
        "tokens\\nlimit 4096\"}}\n";
    TM_CHECK_MSG(strcmp(buf, want) == 0, "errors.jsonl:\n%s", buf);
    TM_CHECK_OK(tm_sink_close(sink, &err), &err);
}

// After tm_sink_flush the completions file decodes completely; append mode adds frames.
static void test_flush_and_append(void) {
    char dir[512], path[600];
    snprintf(dir, sizeof(dir), "%s/flush", g_tmp);
    snprintf(path, sizeof(path), "%s/%s", dir, TM_SINK_COMPLETIONS_FILE);
    tm_sink *sink = NULL;
    tm_err err = {0};
    TM_CHECK_OK(tm_sink_open(dir, NULL, &sink, &err), &err); // default options, with fsync
    if (!sink)
        return;
    char id[16];
    for (int i = 0; i < 10; i++) {
        snprintf(id, sizeof(id), "%d", i);
        tm_completion c = make_ok((uint64_t)i, id, "x");
        TM_CHECK_OK(tm_sink_write(sink, &c, &err), &err);
    }
    TM_CHECK_OK(tm_sink_flush(sink, &err), &err);
    decoded d;
    TM_CHECK(decode_file(path, &d) == 0); // sink still open, frame closed
    TM_CHECK(d.n_frames == 1);
    check_lines(&d, 10, 1);
    free(d.data);
    TM_CHECK_OK(tm_sink_flush(sink, &err), &err); // nothing new: no empty frame
    TM_CHECK_OK(tm_sink_close(sink, &err), &err);
    TM_CHECK(decode_file(path, &d) == 0 && d.n_frames == 1);
    free(d.data);

    TM_CHECK_OK(tm_sink_open(dir, &(tm_sink_opts){.append = true}, &sink, &err), &err);
    for (int i = 10; i < 15; i++) {
        snprintf(id, sizeof(id), "%d", i);
        tm_completion c = make_ok((uint64_t)i, id, "x");
        TM_CHECK_OK(tm_sink_write(sink, &c, &err), &err);
    }
    TM_CHECK_OK(tm_sink_close(sink, &err), &err);
    TM_CHECK(decode_file(path, &d) == 0);
    TM_CHECK(d.n_frames == 2);
    check_lines(&d, 15, 1);
    check_cli(path, &d);
    free(d.data);

    // Not a folder.
    char file_path[600];
    snprintf(file_path, sizeof(file_path), "%s/plainfile", g_tmp);
    FILE *f = fopen(file_path, "w");
    if (f)
        fclose(f);
    TM_CHECK(tm_sink_open(file_path, NULL, &sink, &err) == TM_E_IO);
}

static void test_alloc_faults(void) {
    char dir[512];
    snprintf(dir, sizeof(dir), "%s/faults", g_tmp);
    long base = tm_alloc_live();
    int n_fail = 0;
    for (long k = 1; k < 1000; k++) {
        tm_sink *sink = NULL;
        tm_err err = {0};
        tm_fault_set(TM_FAULT_ALLOC, k);
        tm_rc rc = tm_sink_open(dir, &(tm_sink_opts){.no_fsync = true}, &sink, &err);
        for (int i = 0; !rc && i < 3; i++) {
            tm_completion c = make_ok((uint64_t)i, "1", "some text \xc3\xa9");
            rc = tm_sink_write(sink, &c, &err);
            tm_completion e = {
                .file = "f", .line = 1, .err_code = TM_ERRCODE_INVALID_JSON, .err_msg = "m"};
            if (!rc)
                rc = tm_sink_write(sink, &e, &err);
        }
        tm_rc rc2 = tm_sink_close(sink, &err);
        tm_fault_set(TM_FAULT_ALLOC, 0);
        TM_CHECK(tm_alloc_live() == base);
        if (!rc && !rc2)
            break;
        TM_CHECK_MSG(rc == TM_E_NOMEM, "alloc %ld: %s", k, err.msg);
        n_fail++;
    }
    TM_CHECK(n_fail >= 5);
}

// With TM_SAMPLE_DIR set, leave one realistic output folder there for schema validation.
static void write_sample(void) {
    const char *dir = getenv("TM_SAMPLE_DIR");
    if (!dir)
        return;
    tm_sink *sink = NULL;
    tm_err err = {0};
    TM_CHECK_OK(tm_sink_open(dir, &(tm_sink_opts){.frame_records = 2}, &sink, &err), &err);
    if (!sink)
        return;
    tm_completion ok[] = {make_ok(0, "\"q001\"", "The ocean is \"vast\".\n"),
                          make_ok(1, "42", "caf\xc3\xa9"), make_ok(2, "\"q003\"", "")};
    for (int i = 0; i < 3; i++)
        TM_CHECK_OK(tm_sink_write(sink, &ok[i], &err), &err);
    tm_completion errs[] = {
        {.file = "data/a.jsonl",
         .line = 4,
         .id_json = "\"q004\"",
         .err_code = TM_ERRCODE_WRONG_TYPE,
         .err_msg = "field 'top_p': expected a number"},
        {.file = "data/a.jsonl",
         .line = 5,
         .err_code = TM_ERRCODE_INVALID_JSON,
         .err_msg = "invalid JSON at column 3"},
        {.id_json = "7", .err_code = TM_ERRCODE_ENGINE_ERROR, .err_msg = "engine died"},
    };
    for (int i = 0; i < 3; i++)
        TM_CHECK_OK(tm_sink_write(sink, &errs[i], &err), &err);
    TM_CHECK_OK(tm_sink_close(sink, &err), &err);
}

int main(void) {
    snprintf(g_tmp, sizeof(g_tmp), "/tmp/tm_sink_XXXXXX");
    if (!mkdtemp(g_tmp))
        return 1;
    TM_RUN(test_round_trip_frames);
    TM_RUN(test_escaping);
    TM_RUN(test_errors_file);
    TM_RUN(test_flush_and_append);
    TM_RUN(test_alloc_faults);
    TM_RUN(write_sample);
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_tmp);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", g_tmp);
    return tm_test_report();
}
