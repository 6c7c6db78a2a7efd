/* ingest/source.c - JSONL reader: byte layer (plain, LZ4 frames, gzip) -> bounded line splitter ->
 * record parser (jansson) -> duplicate-id set. The only module file that calls LZ4F and zlib on
 * the input side. */
#include "ingest/source.h"

#include <errno.h>
#include <jansson.h>
#include <lz4frame.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "base/alloc.h"
#include "base/buf.h"
#include "ingest/fields_int.h"

enum { CHUNK_BYTES = 64 * 1024 };

typedef enum in_fmt { FMT_PLAIN, FMT_LZ4, FMT_GZ } in_fmt;

/* Set of ids seen so far: 128-bit hashes of the id's compact JSON text in an open-addressing
 * table (linear probing, load <= 3/4). A false "duplicate" needs a 128-bit collision. */
typedef struct id_set {
    uint64_t *slots; /* [cap][2]; {0, 0} marks an empty slot */
    size_t cap;      /* power of two, or 0 */
    size_t n;
} id_set;

struct tm_source {
    const tm_job_spec *spec; /* borrowed */
    size_t i_file;           /* index of the open file, or of the next one to open */
    bool open;               /* a file is open */
    in_fmt fmt;
    FILE *fp;                /* plain and lz4 */
    gzFile gz;
    LZ4F_dctx *dctx;
    unsigned char *zin;      /* [CHUNK_BYTES] compressed bytes (lz4) */
    size_t zin_pos, zin_len;
    bool lz4_in_frame;       /* the last LZ4F_decompress call did not end a frame */
    char *chunk;             /* [CHUNK_BYTES] decoded bytes */
    size_t chunk_pos, chunk_len;
    tm_buf line;             /* current line, at most max_line_bytes + 1 bytes */
    uint64_t line_no;        /* 1-based number of the last line read in the open file */
    uint64_t seq_no;         /* records returned */
    id_set ids;
};

// ---- id set ----

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

// Two lanes with different chaining (xor vs add-multiply), so one colliding lane does not imply
// the other; the length is folded into both seeds.
static void hash128(const char *s, size_t n, uint64_t h[2]) {
    uint64_t a = 0x9e3779b97f4a7c15ULL ^ (uint64_t)n;
    uint64_t b = 0x2545f4914f6cdd1dULL + (uint64_t)n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        a = mix64(a ^ w);
        b = mix64((b + w) * 0x9fb21c651e98df25ULL);
        s += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, s, n);
    a = mix64(a ^ w ^ 0x5555555555555555ULL);
    b = mix64((b + w) * 0x9fb21c651e98df25ULL);
    h[0] = a;
    h[1] = b;
    if (!a && !b)
        h[0] = 1; // {0, 0} marks empty slots
}

static void idset_put(uint64_t *slots, size_t cap, const uint64_t h[2]) {
    size_t i = (size_t)h[0] & (cap - 1);
    while (slots[2 * i] || slots[2 * i + 1])
        i = (i + 1) & (cap - 1);
    slots[2 * i] = h[0];
    slots[2 * i + 1] = h[1];
}

// 1 if the id was new (and is now in the set), 0 if it was already there.
static tm_rc idset_add(id_set *set, const char *id, size_t n, int *added, tm_err *err) {
    uint64_t h[2];
    hash128(id, n, h);
    if (set->cap) {
        for (size_t i = (size_t)h[0] & (set->cap - 1);; i = (i + 1) & (set->cap - 1)) {
            uint64_t *s = &set->slots[2 * i];
            if (!s[0] && !s[1])
                break;
            if (s[0] == h[0] && s[1] == h[1]) {
                *added = 0;
                return TM_OK;
            }
        }
    }
    if ((set->n + 1) * 4 > set->cap * 3) {
        size_t cap = set->cap ? set->cap * 2 : 1024;
        uint64_t *slots = tm_calloc(cap * 2, sizeof(*slots));
        if (!slots)
            return TM_ERR(err, TM_E_NOMEM, "id set of %zu ids", set->n);
        for (size_t i = 0; i < set->cap; i++)
            if (set->slots[2 * i] || set->slots[2 * i + 1])
                idset_put(slots, cap, &set->slots[2 * i]);
        tm_free(set->slots);
        set->slots = slots;
        set->cap = cap;
    }
    idset_put(set->slots, set->cap, h);
    set->n++;
    *added = 1;
    return TM_OK;
}

// ---- byte layer ----

static int has_suffix(const char *s, const char *suf) {
    size_t n = strlen(s), k = strlen(suf);
    return n >= k && memcmp(s + n - k, suf, k) == 0;
}

static void close_file(tm_source *src) {
    if (src->fp)
        fclose(src->fp);
    if (src->gz)
        gzclose(src->gz);
    src->fp = NULL;
    src->gz = NULL;
    src->open = false;
}

static tm_rc open_file(tm_source *src, tm_err *err) {
    const char *path = src->spec->inputs[src->i_file];
    src->fmt = has_suffix(path, ".lz4") ? FMT_LZ4 : has_suffix(path, ".gz") ? FMT_GZ : FMT_PLAIN;
    if (src->fmt == FMT_GZ) {
        src->gz = gzopen(path, "rb");
        if (!src->gz)
            return TM_ERR(err, TM_E_IO, "%s: %s", path, errno ? strerror(errno) : "gzopen failed");
        gzbuffer(src->gz, 128 * 1024);
    } else {
        src->fp = fopen(path, "rb");
        if (!src->fp)
            return TM_ERR(err, TM_E_IO, "%s: %s", path, strerror(errno));
    }
    if (src->fmt == FMT_LZ4) {
        LZ4F_resetDecompressionContext(src->dctx);
        src->zin_pos = src->zin_len = 0;
        src->lz4_in_frame = false;
    }
    src->chunk_pos = src->chunk_len = 0;
    src->line_no = 0;
    src->open = true;
    return TM_OK;
}

static tm_rc refill_lz4(tm_source *src, tm_err *err) {
    const char *path = src->spec->inputs[src->i_file];
    for (;;) {
        if (src->zin_pos == src->zin_len) {
            size_t n = fread(src->zin, 1, CHUNK_BYTES, src->fp);
            if (n == 0) {
                if (ferror(src->fp))
                    return TM_ERR(err, TM_E_IO, "%s: read failed: %s", path, strerror(errno));
                if (src->lz4_in_frame)
                    return TM_ERR(err, TM_E_PARSE, "%s: truncated LZ4 stream (last frame has no end)",
                                  path);
                return TM_OK; // chunk_len == 0: end of file
            }
            src->zin_pos = 0;
            src->zin_len = n;
        }
        size_t dst_n = CHUNK_BYTES, src_n = src->zin_len - src->zin_pos;
        size_t r = LZ4F_decompress(src->dctx, src->chunk, &dst_n, src->zin + src->zin_pos, &src_n,
                                   NULL);
        if (LZ4F_isError(r))
            return TM_ERR(err, TM_E_PARSE, "%s: corrupt LZ4 stream: %s", path,
                          LZ4F_getErrorName(r));
        src->zin_pos += src_n;
        src->lz4_in_frame = r != 0;
        if (dst_n > 0) {
            src->chunk_len = dst_n;
            return TM_OK;
        }
    }
}

// Read the next decoded bytes into chunk; chunk_len == 0 afterwards means end of file.
static tm_rc refill(tm_source *src, tm_err *err) {
    const char *path = src->spec->inputs[src->i_file];
    src->chunk_pos = src->chunk_len = 0;
    if (src->fmt == FMT_LZ4)
        return refill_lz4(src, err);
    if (src->fmt == FMT_GZ) {
        int n = gzread(src->gz, src->chunk, CHUNK_BYTES);
        int zerr = Z_OK;
        const char *msg = gzerror(src->gz, &zerr);
        if (n < 0 || (n == 0 && zerr != Z_OK))
            return TM_ERR(err, zerr == Z_ERRNO ? TM_E_IO : TM_E_PARSE, "%s: gzip: %s", path,
                          zerr == Z_ERRNO ? strerror(errno) : msg);
        src->chunk_len = (size_t)n;
        return TM_OK;
    }
    size_t n = fread(src->chunk, 1, CHUNK_BYTES, src->fp);
    if (n == 0 && ferror(src->fp))
        return TM_ERR(err, TM_E_IO, "%s: read failed: %s", path, strerror(errno));
    src->chunk_len = n;
    return TM_OK;
}

// ---- line splitter ----

/* Next line of the open file into src->line (without "\n" and a "\r" before it). *n_bytes is the
 * line's length; *too_long is set when it exceeds max_line_bytes, in which case the line was
 * consumed without being kept. TM_E_EOF at the end of the file. */
static tm_rc next_line(tm_source *src, bool *too_long, uint64_t *n_bytes, tm_err *err) {
    const uint64_t max = src->spec->max_line_bytes;
    tm_buf_clear(&src->line);
    bool any = false, skip = false;
    uint64_t n = 0;
    char last = 0;
    for (;;) {
        if (src->chunk_pos == src->chunk_len) {
            tm_rc rc = refill(src, err);
            if (rc)
                return rc;
            if (src->chunk_len == 0) {
                if (!any)
                    return TM_E_EOF;
                break; // a last line without "\n"
            }
        }
        const char *p = src->chunk + src->chunk_pos;
        size_t avail = src->chunk_len - src->chunk_pos;
        const char *nl = memchr(p, '\n', avail);
        size_t seg = nl ? (size_t)(nl - p) : avail;
        any = true;
        // Keep up to max + 1 bytes: the extra one may be the "\r" of a CRLF.
        if (!skip && n + seg > max + 1) {
            skip = true;
            tm_buf_clear(&src->line);
        }
        if (!skip && seg) {
            tm_rc rc = tm_buf_append(&src->line, p, seg, err);
            if (rc)
                return rc;
        }
        if (seg)
            last = p[seg - 1];
        n += seg;
        src->chunk_pos += seg + (nl ? 1 : 0);
        if (nl)
            break;
    }
    src->line_no++;
    if (last == '\r') {
        n--;
        if (!skip)
            src->line.data[--src->line.len] = '\0';
    }
    *too_long = skip || n > max;
    *n_bytes = n;
    return TM_OK;
}

// ---- record parser ----

static tm_rc job_fail(tm_job *job, tm_errcode code, tm_err *err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static tm_rc job_fail(tm_job *job, tm_errcode code, tm_err *err, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    // An error record carries file, line and id only.
    tm_free(job->prompt);
    job->prompt = NULL;
    for (uint32_t i = 0; i < job->n_messages; i++) {
        tm_free(job->messages[i].role);
        tm_free(job->messages[i].content);
    }
    tm_free(job->messages);
    job->messages = NULL;
    job->n_messages = 0;
    tm_sampling_fini(&job->sp);
    memset(&job->sp, 0, sizeof(job->sp));
    job->err_code = code;
    job->err_msg = tm_strdup(msg);
    if (!job->err_msg)
        return TM_ERR(err, TM_E_NOMEM, "error message");
    return TM_OK;
}

static tm_rc field_fail(tm_job *job, const char *field, const tm_field_fail *ff, tm_err *err) {
    return job_fail(job, ff->code, err, "field '%s': %s", field, ff->msg);
}

// A string member that must not hold NUL (jansson refuses \u0000 already; belt and braces).
static char *dup_json_str(const json_t *v) {
    return tm_strndup(json_string_value(v), json_string_length(v));
}

static tm_rc parse_messages(tm_job *job, const json_t *msgs, tm_err *err) {
    tm_field_fail ff;
    if (!json_is_array(msgs)) {
        tm_ingest_fail_set(&ff, TM_ERRCODE_WRONG_TYPE, "an array of {\"role\", \"content\"} objects",
                           msgs);
        return field_fail(job, "messages", &ff, err);
    }
    size_t n = json_array_size(msgs);
    if (n == 0 || n > UINT32_MAX) {
        tm_ingest_fail_set(&ff, TM_ERRCODE_INVALID_VALUE, "a non-empty array", msgs);
        return field_fail(job, "messages", &ff, err);
    }
    job->messages = tm_calloc(n, sizeof(*job->messages));
    if (!job->messages)
        return TM_ERR(err, TM_E_NOMEM, "messages");
    for (size_t i = 0; i < n; i++) {
        const json_t *m = json_array_get(msgs, i);
        char field[64];
        snprintf(field, sizeof(field), "messages[%zu]", i);
        if (!json_is_object(m)) {
            tm_ingest_fail_set(&ff, TM_ERRCODE_WRONG_TYPE, "an object", m);
            return field_fail(job, field, &ff, err);
        }
        static const char *const keys[] = {"role", "content"};
        for (int k = 0; k < 2; k++) {
            const json_t *v = json_object_get(m, keys[k]);
            snprintf(field, sizeof(field), "messages[%zu].%s", i, keys[k]);
            if (!v)
                return job_fail(job, TM_ERRCODE_MISSING_FIELD, err, "field '%s' is required",
                                field);
            if (!json_is_string(v)) {
                tm_ingest_fail_set(&ff, TM_ERRCODE_WRONG_TYPE, "a string", v);
                return field_fail(job, field, &ff, err);
            }
            if (k == 0 && json_string_length(v) == 0) {
                tm_ingest_fail_set(&ff, TM_ERRCODE_INVALID_VALUE, "a non-empty string", v);
                return field_fail(job, field, &ff, err);
            }
        }
        job->n_messages = (uint32_t)i + 1; // job_fail frees what is counted
        job->messages[i].role = dup_json_str(json_object_get(m, "role"));
        job->messages[i].content = dup_json_str(json_object_get(m, "content"));
        if (!job->messages[i].role || !job->messages[i].content)
            return TM_ERR(err, TM_E_NOMEM, "messages");
    }
    return TM_OK;
}

// Fill job from one line. Only allocation failures are returned; everything else is recorded in
// job->err_code.
static tm_rc parse_record(tm_source *src, const char *line, size_t len, tm_job *job,
                          tm_err *err) {
    tm_field_fail ff;
    if (len >= 3 && memcmp(line, "\xef\xbb\xbf", 3) == 0)
        return job_fail(job, TM_ERRCODE_INVALID_JSON, err,
                        "line starts with a UTF-8 byte order mark (allowed only at the start of a "
                        "file)");
    json_error_t jerr;
    json_t *root = json_loadb(line, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        if (json_error_code(&jerr) == json_error_invalid_utf8)
            return job_fail(job, TM_ERRCODE_INVALID_UTF8, err, "invalid UTF-8 at column %d: %s",
                            jerr.column, jerr.text);
        if (json_error_code(&jerr) == json_error_null_character) // jansson's text names a flag
            return job_fail(job, TM_ERRCODE_INVALID_JSON, err,
                            "invalid JSON at column %d: \\u0000 (NUL) is not allowed in strings",
                            jerr.column);
        return job_fail(job, TM_ERRCODE_INVALID_JSON, err, "invalid JSON at column %d: %s",
                        jerr.column, jerr.text);
    }
    tm_rc rc = TM_OK;
    if (!json_is_object(root)) {
        tm_ingest_fail_set(&ff, TM_ERRCODE_WRONG_TYPE, "a JSON object", root);
        rc = job_fail(job, TM_ERRCODE_WRONG_TYPE, err, "record: %s", ff.msg);
        goto done;
    }
    // id: a string or an integer; its compact JSON text is the identity.
    const json_t *id = json_object_get(root, "id");
    if (!id) {
        rc = job_fail(job, TM_ERRCODE_MISSING_FIELD, err, "field 'id' is required");
        goto done;
    }
    if (!json_is_string(id) && !json_is_integer(id)) {
        tm_ingest_fail_set(&ff, TM_ERRCODE_WRONG_TYPE, "a string or an integer", id);
        rc = field_fail(job, "id", &ff, err);
        goto done;
    }
    if (json_is_string(id) && json_string_length(id) == 0) {
        tm_ingest_fail_set(&ff, TM_ERRCODE_INVALID_VALUE, "a non-empty string or an integer", id);
        rc = field_fail(job, "id", &ff, err);
        goto done;
    }
    char *id_text = json_dumps(id, JSON_ENCODE_ANY | JSON_COMPACT);
    job->id_json = id_text ? tm_strdup(id_text) : NULL;
    free(id_text); // jansson's allocation
    if (!job->id_json) {
        rc = TM_ERR(err, TM_E_NOMEM, "record id");
        goto done;
    }
    int added = 0;
    rc = idset_add(&src->ids, job->id_json, strlen(job->id_json), &added, err);
    if (rc)
        goto done;
    if (!added) {
        rc = job_fail(job, TM_ERRCODE_DUPLICATE_ID, err,
                      "field 'id': %s was already used by an earlier record", job->id_json);
        goto done;
    }
    // Exactly one of prompt / messages.
    const json_t *prompt = json_object_get(root, "prompt");
    const json_t *msgs = json_object_get(root, "messages");
    if (prompt && msgs) {
        rc = job_fail(job, TM_ERRCODE_INVALID_VALUE, err,
                      "fields 'prompt' and 'messages': give exactly one of them, not both");
        goto done;
    }
    if (!prompt && !msgs) {
        rc = job_fail(job, TM_ERRCODE_MISSING_FIELD, err,
                      "field 'prompt' or 'messages' is required");
        goto done;
    }
    if (prompt) {
        if (!json_is_string(prompt)) {
            tm_ingest_fail_set(&ff, TM_ERRCODE_WRONG_TYPE, "a string", prompt);
            rc = field_fail(job, "prompt", &ff, err);
            goto done;
        }
        if (json_string_length(prompt) == 0) {
            tm_ingest_fail_set(&ff, TM_ERRCODE_INVALID_VALUE, "a non-empty string", prompt);
            rc = field_fail(job, "prompt", &ff, err);
            goto done;
        }
        job->prompt = dup_json_str(prompt);
        if (!job->prompt) {
            rc = TM_ERR(err, TM_E_NOMEM, "prompt");
            goto done;
        }
    } else {
        rc = parse_messages(job, msgs, err);
        if (rc || job->err_code)
            goto done;
    }
    // Optional sampling fields, in schema order.
    for (size_t i = 0; tm_ingest_sp_keys[i]; i++) {
        const json_t *v = json_object_get(root, tm_ingest_sp_keys[i]);
        if (!v)
            continue;
        rc = tm_ingest_sp_field(tm_ingest_sp_keys[i], v, &job->sp, &ff, err);
        if (rc)
            goto done;
        if (ff.code != TM_ERRCODE_NONE) {
            rc = field_fail(job, tm_ingest_sp_keys[i], &ff, err);
            goto done;
        }
    }
done:
    json_decref(root);
    return rc;
}

static bool is_blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r')
            return false;
    return true;
}

// ---- public API ----

tm_rc tm_source_open(const tm_job_spec *spec, tm_source **out, tm_err *err) {
    tm_source *src = tm_calloc(1, sizeof(*src));
    if (!src)
        return TM_ERR(err, TM_E_NOMEM, "source");
    src->spec = spec;
    src->chunk = tm_malloc(CHUNK_BYTES);
    src->zin = tm_malloc(CHUNK_BYTES);
    if (!src->chunk || !src->zin) {
        TM_ERR(err, TM_E_NOMEM, "source buffers");
        goto fail;
    }
    LZ4F_errorCode_t lrc = LZ4F_createDecompressionContext(&src->dctx, LZ4F_VERSION);
    if (LZ4F_isError(lrc)) {
        src->dctx = NULL;
        TM_ERR(err, TM_E_NOMEM, "LZ4 decompression context: %s", LZ4F_getErrorName(lrc));
        goto fail;
    }
    *out = src;
    return TM_OK;
fail:
    tm_source_destroy(src);
    return err->rc;
}

void tm_source_destroy(tm_source *src) {
    if (!src)
        return;
    close_file(src);
    if (src->dctx)
        LZ4F_freeDecompressionContext(src->dctx);
    tm_free(src->chunk);
    tm_free(src->zin);
    tm_buf_fini(&src->line);
    tm_free(src->ids.slots);
    tm_free(src);
}

tm_rc tm_source_next(tm_source *src, tm_job **out, tm_err *err) {
    for (;;) {
        if (!src->open) {
            if (src->i_file >= src->spec->n_inputs)
                return TM_E_EOF;
            tm_rc rc = open_file(src, err);
            if (rc)
                return rc;
        }
        bool too_long = false;
        uint64_t n_bytes = 0;
        tm_rc rc = next_line(src, &too_long, &n_bytes, err);
        if (rc == TM_E_EOF) {
            close_file(src);
            src->i_file++;
            continue;
        }
        if (rc)
            return rc;
        const char *s = src->line.data ? src->line.data : "";
        size_t n = src->line.len;
        if (src->line_no == 1 && !too_long && n >= 3 && memcmp(s, "\xef\xbb\xbf", 3) == 0) {
            s += 3; // a byte order mark at the start of the file
            n -= 3;
        }
        if (!too_long && is_blank(s, n))
            continue;

        tm_job *job = tm_calloc(1, sizeof(*job));
        if (!job)
            return TM_ERR(err, TM_E_NOMEM, "record");
        job->seq_no = src->seq_no;
        job->line = src->line_no;
        job->file = tm_strdup(src->spec->inputs[src->i_file]);
        if (!job->file) {
            rc = TM_ERR(err, TM_E_NOMEM, "record");
        } else if (too_long) {
            rc = job_fail(job, TM_ERRCODE_LINE_TOO_LONG, err,
                          "line is %llu bytes, longer than limits.max_line_bytes (%llu)",
                          (unsigned long long)n_bytes,
                          (unsigned long long)src->spec->max_line_bytes);
        } else {
            rc = parse_record(src, s, n, job, err);
        }
        if (rc) {
            tm_job_destroy(job);
            return rc;
        }
        src->seq_no++;
        *out = job;
        return TM_OK;
    }
}

uint64_t tm_source_n_records(const tm_source *src) { return src->seq_no; }

size_t tm_source_line_cap(const tm_source *src) { return src->line.cap; }
