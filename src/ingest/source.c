/* ingest/source.c - JSONL reader: byte layer (plain, LZ4 frames, gzip) -> bounded line splitter ->
 * record parser (jansson) -> duplicate-id set. The only module file that calls LZ4F and zlib on
 * the input side. */
#include "ingest/source.h"

#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <lz4frame.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "base/alloc.h"
#include "base/buf.h"
#include "base/hash.h"
#include "base/seqset.h"
#include "ingest/fields_int.h"
#include "ingest/kafka_in.h"
#include "ingest/source_int.h"

enum { CHUNK_BYTES = 64 * 1024 };

typedef enum in_fmt { FMT_PLAIN, FMT_LZ4, FMT_GZ } in_fmt;

/* Set of ids seen so far: XXH3-128 hashes of the id's compact JSON text in an open-addressing
 * table (linear probing, load <= 3/4). A false "duplicate" needs a 128-bit collision. In memory
 * only (a resumed run rebuilds it as it reads), so the hash may change between versions. */
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
    tm_rec_format file_fmt;  /* format of the open file's first JSON object line */
    bool file_fmt_known;
    bool no_id_check;        /* duplicate ids are not checked (Kafka: redelivery is normal) */
    pthread_mutex_t ack_mu;  /* guards acked (tm_source_ack comes from the sink thread) */
    tm_seqset acked;         /* seq_nos acknowledged as durable */
    tm_kafka_in *kafka;      /* input.kafka: the consumer, owned; NULL for files */
};

// ---- id set ----

static void hash128(const char *s, size_t n, uint64_t h[2]) {
    tm_h128 x = tm_hash128(s, n);
    h[0] = x.lo;
    h[1] = x.hi;
    if (!h[0] && !h[1])
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
    if (src->fp && src->fp != stdin) // stdin stays open (it is read once, see job_spec.h)
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
    if (strcmp(path, TM_JOB_STDIN) == 0) {
        src->fmt = FMT_PLAIN;
        src->fp = stdin;
    } else if (src->fmt == FMT_GZ) {
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
    src->file_fmt = TM_REC_FORMAT_NATIVE;
    src->file_fmt_known = false;
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

// 1-based column of the first array/object opened deeper than max_depth, or 0. Strings are
// skipped (escapes included); the rest of the syntax is left to jansson. Linear, no allocation.
static size_t too_deep_at(const char *s, size_t n, uint32_t max_depth) {
    uint32_t depth = 0;
    bool in_str = false;
    for (size_t i = 0; i < n; i++) { // hot loop: every byte of every line
        char ch = s[i];
        if (in_str) {
            if (ch == '\\')
                i++;
            else if (ch == '"')
                in_str = false;
        } else if (ch == '"') {
            in_str = true;
        } else if (ch == '[' || ch == '{') {
            if (++depth > max_depth)
                return i + 1;
        } else if ((ch == ']' || ch == '}') && depth) {
            depth--;
        }
    }
    return 0;
}

// Check a string field's size against limits.max_field_bytes. 1 when the job was failed.
static int too_large(tm_source *src, tm_job *job, const char *field, const json_t *v, tm_rc *rc,
                     tm_err *err) {
    size_t n = json_string_length(v);
    if (n <= src->spec->max_field_bytes)
        return 0;
    *rc = job_fail(job, TM_ERRCODE_FIELD_TOO_LARGE, err,
                   "field '%s' is %zu bytes, more than limits.max_field_bytes (%llu)", field, n,
                   (unsigned long long)src->spec->max_field_bytes);
    return 1;
}

// A non-empty string field (id, custom_id, prompt, model, role).
static int need_str(tm_source *src, tm_job *job, const char *field, const json_t *v, bool nonempty,
                    tm_rc *rc, tm_err *err) {
    tm_field_fail ff;
    if (!json_is_string(v)) {
        tm_ingest_fail_set(&ff, TM_ERRCODE_WRONG_TYPE, "a string", v);
        *rc = field_fail(job, field, &ff, err);
        return 1;
    }
    if (nonempty && json_string_length(v) == 0) {
        tm_ingest_fail_set(&ff, TM_ERRCODE_INVALID_VALUE, "a non-empty string", v);
        *rc = field_fail(job, field, &ff, err);
        return 1;
    }
    return too_large(src, job, field, v, rc, err);
}

// OpenAI content parts: [{"type": "text", "text": "..."}, ...] joined without separator. Other
// part types (images, audio) are unsupported. *out is an owned string, or NULL after job_fail.
static tm_rc join_parts(tm_source *src, tm_job *job, const char *field, const json_t *parts,
                        char **out, tm_err *err) {
    tm_field_fail ff;
    tm_buf b = {0};
    tm_rc rc = TM_OK;
    *out = NULL;
    size_t i;
    const json_t *part;
    json_array_foreach(parts, i, part) {
        char f[160];
        snprintf(f, sizeof(f), "%s[%zu]", field, i);
        const json_t *type = json_object_get(part, "type");
        const json_t *text = json_object_get(part, "text");
        if (!json_is_object(part) || !json_is_string(type)) {
            tm_ingest_fail_set(&ff, TM_ERRCODE_WRONG_TYPE, "a content part {\"type\", ...}", part);
            rc = field_fail(job, f, &ff, err);
            goto done;
        }
        if (strcmp(json_string_value(type), "text") != 0) {
            rc = job_fail(job, TM_ERRCODE_UNSUPPORTED, err,
                          "field '%s.type': content parts of type \"%.40s\" are not supported "
                          "(only \"text\")",
                          f, json_string_value(type));
            goto done;
        }
        snprintf(f, sizeof(f), "%s[%zu].text", field, i);
        if (!text) {
            rc = job_fail(job, TM_ERRCODE_MISSING_FIELD, err, "field '%s' is required", f);
            goto done;
        }
        if (need_str(src, job, f, text, false, &rc, err))
            goto done;
        if (b.len + json_string_length(text) > src->spec->max_field_bytes) {
            rc = job_fail(job, TM_ERRCODE_FIELD_TOO_LARGE, err,
                          "field '%s': the text parts add up to more than "
                          "limits.max_field_bytes (%llu)",
                          field, (unsigned long long)src->spec->max_field_bytes);
            goto done;
        }
        rc = tm_buf_append(&b, json_string_value(text), json_string_length(text), err);
        if (rc)
            goto done;
    }
    *out = tm_strndup(b.data ? b.data : "", b.len);
    if (!*out)
        rc = TM_ERR(err, TM_E_NOMEM, "message content");
done:
    tm_buf_fini(&b);
    return rc;
}

// messages: an array of {"role", "content"}. prefix names the field in messages ("" or "body.").
// OpenAI lines (parts) may give content as an array of text parts.
static tm_rc parse_messages(tm_source *src, tm_job *job, const json_t *msgs, const char *prefix,
                            bool parts, tm_err *err) {
    tm_field_fail ff;
    char field[96];
    snprintf(field, sizeof(field), "%smessages", prefix);
    if (!json_is_array(msgs)) {
        tm_ingest_fail_set(&ff, TM_ERRCODE_WRONG_TYPE, "an array of {\"role\", \"content\"} objects",
                           msgs);
        return field_fail(job, field, &ff, err);
    }
    size_t n = json_array_size(msgs);
    if (n == 0) {
        tm_ingest_fail_set(&ff, TM_ERRCODE_INVALID_VALUE, "a non-empty array", msgs);
        return field_fail(job, field, &ff, err);
    }
    if (n > src->spec->max_messages)
        return job_fail(job, TM_ERRCODE_FIELD_TOO_LARGE, err,
                        "field '%s' has %zu messages, more than limits.max_messages (%u)", field,
                        n, src->spec->max_messages);
    job->messages = tm_calloc(n, sizeof(*job->messages));
    if (!job->messages)
        return TM_ERR(err, TM_E_NOMEM, "messages");
    for (size_t i = 0; i < n; i++) {
        const json_t *m = json_array_get(msgs, i);
        snprintf(field, sizeof(field), "%smessages[%zu]", prefix, i);
        if (!json_is_object(m)) {
            tm_ingest_fail_set(&ff, TM_ERRCODE_WRONG_TYPE, "an object", m);
            return field_fail(job, field, &ff, err);
        }
        tm_rc rc = TM_OK;
        const json_t *role = json_object_get(m, "role");
        const json_t *content = json_object_get(m, "content");
        snprintf(field, sizeof(field), "%smessages[%zu].role", prefix, i);
        if (!role)
            return job_fail(job, TM_ERRCODE_MISSING_FIELD, err, "field '%s' is required", field);
        if (need_str(src, job, field, role, true, &rc, err))
            return rc;
        snprintf(field, sizeof(field), "%smessages[%zu].content", prefix, i);
        if (!content)
            return job_fail(job, TM_ERRCODE_MISSING_FIELD, err, "field '%s' is required", field);
        char *text = NULL;
        if (parts && json_is_array(content)) {
            rc = join_parts(src, job, field, content, &text, err);
            if (rc || job->err_code)
                return rc;
        } else if (need_str(src, job, field, content, false, &rc, err)) {
            return rc;
        }
        job->n_messages = (uint32_t)i + 1; // job_fail frees what is counted
        job->messages[i].role = dup_json_str(role);
        job->messages[i].content = text ? text : dup_json_str(content);
        if (!job->messages[i].role || !job->messages[i].content)
            return TM_ERR(err, TM_E_NOMEM, "messages");
    }
    return TM_OK;
}

// The record's identity: its compact JSON text, checked against the ids seen so far.
static tm_rc take_id(tm_source *src, tm_job *job, const json_t *id, const char *field,
                     tm_err *err) {
    char *id_text = json_dumps(id, JSON_ENCODE_ANY | JSON_COMPACT);
    job->id_json = id_text ? tm_strdup(id_text) : NULL;
    free(id_text); // jansson's allocation
    if (!job->id_json)
        return TM_ERR(err, TM_E_NOMEM, "record id");
    int added = 1;
    tm_rc rc = src->no_id_check ? TM_OK
                                : idset_add(&src->ids, job->id_json, strlen(job->id_json), &added,
                                            err);
    if (rc)
        return rc;
    if (!added)
        return job_fail(job, TM_ERRCODE_DUPLICATE_ID, err,
                        "field '%s': %s was already used by an earlier record", field,
                        job->id_json);
    return TM_OK;
}

// One sampling field (name as written in the line: field) into job->sp.
static tm_rc sp_field(tm_source *src, tm_job *job, const char *key, const char *field,
                      const json_t *v, tm_err *err) {
    tm_field_fail ff;
    if (strcmp(key, "stop") == 0 && json_is_array(v) && json_array_size(v) > src->spec->max_messages)
        return job_fail(job, TM_ERRCODE_FIELD_TOO_LARGE, err,
                        "field '%s' has %zu strings, more than limits.max_messages (%u)", field,
                        json_array_size(v), src->spec->max_messages);
    tm_rc rc = tm_ingest_sp_field(key, v, &job->sp, &ff, err);
    if (rc)
        return rc;
    if (ff.code != TM_ERRCODE_NONE)
        return field_fail(job, field, &ff, err);
    return TM_OK;
}

// cache_salt (optional string): records with different salts never share prefix-cache blocks
// (tenant isolation); kept as a 64-bit hash of the string.
static tm_rc parse_cache_salt(tm_source *src, tm_job *job, const json_t *v, tm_err *err) {
    tm_rc rc = TM_OK;
    if (!v || json_is_null(v))
        return TM_OK;
    if (need_str(src, job, "cache_salt", v, true, &rc, err))
        return rc;
    uint64_t h = tm_hash64(json_string_value(v), json_string_length(v));
    job->cache_salt = h ? h : 1; // 0 means "no salt"
    return TM_OK;
}

// An optional integer field in [lo, hi] (null = absent): 1 and *out set when given, 0 when
// absent, -1 when the job was failed (*rc set).
static int opt_int(tm_job *job, const json_t *obj, const char *key, const char *field,
                   long long lo, long long hi, const char *what, long long *out, tm_rc *rc,
                   tm_err *err) {
    const json_t *v = json_object_get(obj, key);
    tm_field_fail ff;
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi) {
        tm_ingest_fail_set(&ff, json_is_integer(v) ? TM_ERRCODE_INVALID_VALUE
                                                   : TM_ERRCODE_WRONG_TYPE, what, v);
        *rc = field_fail(job, field, &ff, err);
        return -1;
    }
    *out = json_integer_value(v);
    return 1;
}

// An optional boolean field (null = absent): 1/0 into *out when given; -1 when the job failed.
static int opt_bool(tm_job *job, const json_t *obj, const char *key, const char *field, int *out,
                    tm_rc *rc, tm_err *err) {
    const json_t *v = json_object_get(obj, key);
    tm_field_fail ff;
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_boolean(v)) {
        tm_ingest_fail_set(&ff, TM_ERRCODE_WRONG_TYPE, "true or false", v);
        *rc = field_fail(job, field, &ff, err);
        return -1;
    }
    *out = json_is_true(v);
    return 1;
}

// Native evaluation fields (issue 5): n, logprobs, top_logprobs, prompt_logprobs, and the
// continuations of a scoring record.
static tm_rc parse_eval_native(tm_source *src, const json_t *root, tm_job *job, tm_err *err) {
    tm_rc rc = TM_OK;
    tm_field_fail ff;
    long long x = 0;
    int got;
    if ((got = opt_int(job, root, "n", "n", 1, TM_MAX_N, "an integer from 1 to 128", &x, &rc,
                       err)) < 0)
        return rc;
    job->n = got ? (uint32_t)x : 1;
    if (opt_bool(job, root, "logprobs", "logprobs", &job->logprobs, &rc, err) < 0)
        return rc;
    if ((got = opt_int(job, root, "top_logprobs", "top_logprobs", 0, TM_MAX_TOP_LOGPROBS,
                       "an integer from 0 to 20", &x, &rc, err)) < 0)
        return rc;
    if (got) {
        job->top_logprobs = (uint32_t)x;
        job->logprobs |= x > 0; // asking for alternatives asks for the logprobs
    }
    const json_t *v = json_object_get(root, "prompt_logprobs");
    if (v && json_is_integer(v)) {
        if (opt_int(job, root, "prompt_logprobs", "prompt_logprobs", 0, TM_MAX_TOP_LOGPROBS,
                    "true, false or an integer from 0 to 20", &x, &rc, err) < 0)
            return rc;
        job->prompt_logprobs = 1;
        job->prompt_top_logprobs = (uint32_t)x;
    } else if (v && !json_is_null(v)) {
        if (!json_is_boolean(v)) {
            tm_ingest_fail_set(&ff, TM_ERRCODE_WRONG_TYPE, "true, false or an integer from 0 to 20",
                               v);
            return field_fail(job, "prompt_logprobs", &ff, err);
        }
        job->prompt_logprobs = json_is_true(v);
    }
    const json_t *cs = json_object_get(root, "continuations");
    const json_t *c1 = json_object_get(root, "continuation");
    if (json_is_null(cs))
        cs = NULL;
    if (json_is_null(c1))
        c1 = NULL;
    if (!cs && !c1)
        return TM_OK;
    if (cs && c1)
        return job_fail(job, TM_ERRCODE_INVALID_VALUE, err,
                        "fields 'continuation' and 'continuations': give at most one of them");
    const char *field = cs ? "continuations" : "continuation";
    if (cs && (!json_is_array(cs) || json_array_size(cs) == 0)) {
        tm_ingest_fail_set(&ff, json_is_array(cs) ? TM_ERRCODE_INVALID_VALUE
                                                  : TM_ERRCODE_WRONG_TYPE,
                           "a non-empty array of non-empty strings", cs);
        return field_fail(job, field, &ff, err);
    }
    size_t n = cs ? json_array_size(cs) : 1;
    if (n > src->spec->max_messages)
        return job_fail(job, TM_ERRCODE_FIELD_TOO_LARGE, err,
                        "field '%s' has %zu strings, more than limits.max_messages (%u)", field, n,
                        src->spec->max_messages);
    if (job->n > 1)
        return job_fail(job, TM_ERRCODE_INVALID_VALUE, err,
                        "field 'n': a scoring record (with '%s') takes no samples", field);
    if ((job->sp.set & TM_SP_MAX_TOKENS) && job->sp.max_tokens > 0)
        return job_fail(job, TM_ERRCODE_INVALID_VALUE, err,
                        "field 'max_tokens': a scoring record (with '%s') generates nothing; "
                        "leave max_tokens out or give 0", field);
    for (size_t i = 0; i < n; i++) {
        const json_t *s = cs ? json_array_get(cs, i) : c1;
        char name[48];
        snprintf(name, sizeof(name), cs ? "continuations[%zu]" : "continuation", i);
        if (need_str(src, job, name, s, true, &rc, err))
            return rc;
    }
    job->continuations = tm_calloc(n, sizeof(char *));
    if (!job->continuations)
        return TM_ERR(err, TM_E_NOMEM, "continuations");
    job->n_continuations = (uint32_t)n;
    for (size_t i = 0; i < n; i++) {
        job->continuations[i] = dup_json_str(cs ? json_array_get(cs, i) : c1);
        if (!job->continuations[i])
            return TM_ERR(err, TM_E_NOMEM, "continuations");
    }
    return TM_OK;
}

static tm_rc parse_native(tm_source *src, const json_t *root, tm_job *job, tm_err *err) {
    tm_field_fail ff;
    tm_rc rc = TM_OK;
    // id: a string or an integer; its compact JSON text is the identity.
    const json_t *id = json_object_get(root, "id");
    if (!id)
        return job_fail(job, TM_ERRCODE_MISSING_FIELD, err, "field 'id' is required");
    if (!json_is_string(id) && !json_is_integer(id)) {
        tm_ingest_fail_set(&ff, TM_ERRCODE_WRONG_TYPE, "a string or an integer", id);
        return field_fail(job, "id", &ff, err);
    }
    if (json_is_string(id) && json_string_length(id) == 0) {
        tm_ingest_fail_set(&ff, TM_ERRCODE_INVALID_VALUE, "a non-empty string or an integer", id);
        return field_fail(job, "id", &ff, err);
    }
    if (json_is_string(id) && too_large(src, job, "id", id, &rc, err))
        return rc;
    rc = take_id(src, job, id, "id", err);
    if (rc || job->err_code)
        return rc;
    // Exactly one of prompt / messages.
    const json_t *prompt = json_object_get(root, "prompt");
    const json_t *msgs = json_object_get(root, "messages");
    if (prompt && msgs)
        return job_fail(job, TM_ERRCODE_INVALID_VALUE, err,
                        "fields 'prompt' and 'messages': give exactly one of them, not both");
    if (!prompt && !msgs)
        return job_fail(job, TM_ERRCODE_MISSING_FIELD, err,
                        "field 'prompt' or 'messages' is required");
    if (prompt) {
        if (need_str(src, job, "prompt", prompt, true, &rc, err))
            return rc;
        job->prompt = dup_json_str(prompt);
        if (!job->prompt)
            return TM_ERR(err, TM_E_NOMEM, "prompt");
    } else {
        rc = parse_messages(src, job, msgs, "", false, err);
        if (rc || job->err_code)
            return rc;
    }
    // Optional sampling fields, in schema order. A record may ask for max_tokens 0 (nothing
    // generated: prompt_logprobs or a scoring record).
    for (size_t i = 0; tm_ingest_sp_keys[i]; i++) {
        const json_t *v = json_object_get(root, tm_ingest_sp_keys[i]);
        if (!v)
            continue;
        if (strcmp(tm_ingest_sp_keys[i], "max_tokens") == 0 && json_is_integer(v) &&
            json_integer_value(v) == 0) {
            job->sp.max_tokens = 0;
            job->sp.set |= TM_SP_MAX_TOKENS;
            continue;
        }
        rc = sp_field(src, job, tm_ingest_sp_keys[i], tm_ingest_sp_keys[i], v, err);
        if (rc || job->err_code)
            return rc;
    }
    rc = parse_eval_native(src, root, job, err);
    if (rc || job->err_code)
        return rc;
    return parse_cache_salt(src, job, json_object_get(root, "cache_salt"), err);
}

// Body keys tokenmill does not implement: the request is refused unless the value is absent,
// null, or the neutral value given here (a JSON text compared after compact dumping).
static const struct {
    const char *key;
    const char *neutral[3];
} unsupported_body[] = {
    {"tools", {"[]"}},                 {"functions", {"[]"}},
    {"best_of", {"1"}},                {"echo", {"false"}},
    {"suffix", {"\"\""}},              {"logit_bias", {"{}"}},
    {"frequency_penalty", {"0", "0.0"}}, {"presence_penalty", {"0", "0.0"}},
    {"audio", {"{}"}},                 {"prediction", {"{}"}},
};

static int is_neutral(const json_t *v, const char *const *neutral) {
    if (json_is_null(v))
        return 1;
    if (json_is_number(v) && json_number_value(v) == 0 && neutral[0] && strcmp(neutral[0], "0") == 0)
        return 1;
    char *t = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    int ok = 0;
    for (int i = 0; t && i < 3 && neutral[i] && !ok; i++)
        ok = strcmp(t, neutral[i]) == 0;
    free(t); // jansson's allocation
    return ok;
}

// An OpenAI Batch API line: {"custom_id", "method": "POST", "url", "body": {...}}.
static tm_rc parse_openai(tm_source *src, const json_t *root, tm_job *job, tm_err *err) {
    tm_field_fail ff;
    tm_rc rc = TM_OK;
    job->format = TM_REC_FORMAT_OPENAI;
    const json_t *cid = json_object_get(root, "custom_id");
    if (!cid)
        return job_fail(job, TM_ERRCODE_MISSING_FIELD, err, "field 'custom_id' is required");
    if (need_str(src, job, "custom_id", cid, true, &rc, err))
        return rc;
    rc = take_id(src, job, cid, "custom_id", err);
    if (rc || job->err_code)
        return rc;
    const json_t *method = json_object_get(root, "method");
    const json_t *url = json_object_get(root, "url");
    const json_t *body = json_object_get(root, "body");
    if (!method)
        return job_fail(job, TM_ERRCODE_MISSING_FIELD, err, "field 'method' is required");
    if (!json_is_string(method) || strcmp(json_string_value(method), "POST") != 0) {
        tm_ingest_fail_set(&ff, json_is_string(method) ? TM_ERRCODE_INVALID_VALUE
                                                       : TM_ERRCODE_WRONG_TYPE,
                           "\"POST\"", method);
        return field_fail(job, "method", &ff, err);
    }
    if (!url)
        return job_fail(job, TM_ERRCODE_MISSING_FIELD, err, "field 'url' is required");
    if (need_str(src, job, "url", url, true, &rc, err))
        return rc;
    const char *u = json_string_value(url);
    if (strcmp(u, "/v1/chat/completions") == 0) {
        job->format = TM_REC_FORMAT_OPENAI_CHAT;
    } else if (strcmp(u, "/v1/completions") == 0) {
        job->format = TM_REC_FORMAT_OPENAI_COMPLETION;
    } else if (strncmp(u, "/v1/", 4) == 0) {
        tm_ingest_describe(url, ff.msg, 80);
        return job_fail(job, TM_ERRCODE_UNSUPPORTED, err,
                        "field 'url': %s is not supported; tokenmill serves "
                        "\"/v1/chat/completions\" and \"/v1/completions\"",
                        ff.msg);
    } else {
        tm_ingest_fail_set(&ff, TM_ERRCODE_INVALID_VALUE,
                           "\"/v1/chat/completions\" or \"/v1/completions\"", url);
        return field_fail(job, "url", &ff, err);
    }
    if (!body)
        return job_fail(job, TM_ERRCODE_MISSING_FIELD, err, "field 'body' is required");
    if (!json_is_object(body)) {
        tm_ingest_fail_set(&ff, TM_ERRCODE_WRONG_TYPE, "an object", body);
        return field_fail(job, "body", &ff, err);
    }
    const json_t *model = json_object_get(body, "model");
    if (!model)
        return job_fail(job, TM_ERRCODE_MISSING_FIELD, err, "field 'body.model' is required");
    if (need_str(src, job, "body.model", model, true, &rc, err))
        return rc;
    job->model = dup_json_str(model);
    if (!job->model)
        return TM_ERR(err, TM_E_NOMEM, "model name");
    // Features tokenmill does not have are refused, not silently ignored.
    const json_t *v = json_object_get(body, "stream");
    if (v && !json_is_null(v) && !json_is_boolean(v)) {
        tm_ingest_fail_set(&ff, TM_ERRCODE_WRONG_TYPE, "true or false", v);
        return field_fail(job, "body.stream", &ff, err);
    }
    if (json_is_true(v))
        return job_fail(job, TM_ERRCODE_UNSUPPORTED, err,
                        "field 'body.stream': streaming is not supported in batch requests");
    v = json_object_get(body, "n");
    if (v && !json_is_null(v)) {
        if (!json_is_integer(v) || json_integer_value(v) < 1) {
            tm_ingest_fail_set(&ff, json_is_integer(v) ? TM_ERRCODE_INVALID_VALUE
                                                       : TM_ERRCODE_WRONG_TYPE,
                               "an integer >= 1", v);
            return field_fail(job, "body.n", &ff, err);
        }
        if (json_integer_value(v) > TM_MAX_N)
            return job_fail(job, TM_ERRCODE_INVALID_VALUE, err,
                            "field 'body.n': n = %lld is more than tokenmill's limit of %d",
                            (long long)json_integer_value(v), TM_MAX_N);
        job->n = (uint32_t)json_integer_value(v);
    }
    // logprobs: chat takes a boolean and top_logprobs (0..20); completions take an integer
    // (alternatives per token, 0..20; OpenAI allows 5, vLLM 20).
    long long k = 0;
    int got;
    if (job->format == TM_REC_FORMAT_OPENAI_CHAT) {
        if (opt_bool(job, body, "logprobs", "body.logprobs", &job->logprobs, &rc, err) < 0)
            return rc;
        if ((got = opt_int(job, body, "top_logprobs", "body.top_logprobs", 0, TM_MAX_TOP_LOGPROBS,
                           "an integer from 0 to 20", &k, &rc, err)) < 0)
            return rc;
        if (got && k > 0 && !job->logprobs)
            return job_fail(job, TM_ERRCODE_INVALID_VALUE, err,
                            "field 'body.top_logprobs' needs 'body.logprobs': true");
        job->top_logprobs = (uint32_t)k;
    } else {
        if ((got = opt_int(job, body, "logprobs", "body.logprobs", 0, TM_MAX_TOP_LOGPROBS,
                           "an integer from 0 to 20", &k, &rc, err)) < 0)
            return rc;
        job->logprobs = got;
        job->top_logprobs = (uint32_t)k;
        v = json_object_get(body, "top_logprobs");
        if (v && !json_is_null(v))
            return job_fail(job, TM_ERRCODE_INVALID_VALUE, err,
                            "field 'body.top_logprobs' is for /v1/chat/completions; "
                            "/v1/completions takes an integer 'body.logprobs'");
    }
    for (size_t i = 0; i < sizeof(unsupported_body) / sizeof(unsupported_body[0]); i++) {
        v = json_object_get(body, unsupported_body[i].key);
        if (v && !is_neutral(v, unsupported_body[i].neutral)) {
            tm_ingest_describe(v, ff.msg, 80);
            return job_fail(job, TM_ERRCODE_UNSUPPORTED, err,
                            "field 'body.%s': %s is not supported by tokenmill",
                            unsupported_body[i].key, ff.msg);
        }
    }
    v = json_object_get(body, "response_format");
    if (v && !json_is_null(v)) {
        const json_t *t = json_is_object(v) ? json_object_get(v, "type") : NULL;
        if (!json_is_string(t) || strcmp(json_string_value(t), "text") != 0) {
            tm_ingest_describe(v, ff.msg, 80);
            return job_fail(job, TM_ERRCODE_UNSUPPORTED, err,
                            "field 'body.response_format': %s is not supported (only "
                            "{\"type\": \"text\"})",
                            ff.msg);
        }
    }
    // The prompt: messages for chat, prompt for completions.
    const json_t *prompt = json_object_get(body, "prompt");
    const json_t *msgs = json_object_get(body, "messages");
    if (job->format == TM_REC_FORMAT_OPENAI_CHAT) {
        if (prompt)
            return job_fail(job, TM_ERRCODE_INVALID_VALUE, err,
                            "field 'body.prompt' is for /v1/completions; /v1/chat/completions "
                            "takes 'body.messages'");
        if (!msgs)
            return job_fail(job, TM_ERRCODE_MISSING_FIELD, err, "field 'body.messages' is required");
        rc = parse_messages(src, job, msgs, "body.", true, err);
        if (rc || job->err_code)
            return rc;
    } else {
        if (msgs)
            return job_fail(job, TM_ERRCODE_INVALID_VALUE, err,
                            "field 'body.messages' is for /v1/chat/completions; /v1/completions "
                            "takes 'body.prompt'");
        if (!prompt)
            return job_fail(job, TM_ERRCODE_MISSING_FIELD, err, "field 'body.prompt' is required");
        if (json_is_array(prompt))
            return job_fail(job, TM_ERRCODE_UNSUPPORTED, err,
                            "field 'body.prompt': an array (several prompts or token ids) is not "
                            "supported; send one string per request");
        if (need_str(src, job, "body.prompt", prompt, true, &rc, err))
            return rc;
        job->prompt = dup_json_str(prompt);
        if (!job->prompt)
            return TM_ERR(err, TM_E_NOMEM, "prompt");
    }
    // Sampling: max_tokens or max_completion_tokens, and the other tokenmill fields (top_k and
    // min_p too, as vLLM accepts them). null means "not given".
    const json_t *mt = json_object_get(body, "max_tokens");
    const json_t *mct = json_object_get(body, "max_completion_tokens");
    if (json_is_null(mt))
        mt = NULL;
    if (json_is_null(mct))
        mct = NULL;
    if (mt && mct)
        return job_fail(job, TM_ERRCODE_INVALID_VALUE, err,
                        "fields 'body.max_tokens' and 'body.max_completion_tokens': give at most "
                        "one of them");
    if (mct) {
        rc = sp_field(src, job, "max_tokens", "body.max_completion_tokens", mct, err);
        if (rc || job->err_code)
            return rc;
    }
    for (size_t i = 0; tm_ingest_sp_keys[i]; i++) {
        v = json_object_get(body, tm_ingest_sp_keys[i]);
        if (!v || json_is_null(v))
            continue;
        char field[64];
        snprintf(field, sizeof(field), "body.%s", tm_ingest_sp_keys[i]);
        rc = sp_field(src, job, tm_ingest_sp_keys[i], field, v, err);
        if (rc || job->err_code)
            return rc;
    }
    return TM_OK;
}

static bool is_openai_line(const json_t *root) {
    return json_object_get(root, "custom_id") || json_object_get(root, "body") ||
           json_object_get(root, "url");
}

// Fill job from one line. Only allocation failures are returned; everything else is recorded in
// job->err_code. Lines that are not JSON objects take the format of the file's first object
// line (so an OpenAI file gets OpenAI-shaped error lines).
static tm_rc parse_record(tm_source *src, const char *line, size_t len, tm_job *job,
                          tm_err *err) {
    tm_field_fail ff;
    job->format = src->file_fmt;
    if (len >= 3 && memcmp(line, "\xef\xbb\xbf", 3) == 0)
        return job_fail(job, TM_ERRCODE_INVALID_JSON, err,
                        "line starts with a UTF-8 byte order mark (allowed only at the start of a "
                        "file)");
    size_t col = too_deep_at(line, len, src->spec->max_depth);
    if (col)
        return job_fail(job, TM_ERRCODE_NESTING_TOO_DEEP, err,
                        "arrays/objects nested deeper than limits.max_depth (%u) at column %zu",
                        src->spec->max_depth, col);
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
    } else {
        bool oai = is_openai_line(root);
        if (!src->file_fmt_known) {
            src->file_fmt = oai ? TM_REC_FORMAT_OPENAI : TM_REC_FORMAT_NATIVE;
            src->file_fmt_known = true;
        }
        job->format = oai ? TM_REC_FORMAT_OPENAI : TM_REC_FORMAT_NATIVE;
        rc = oai ? parse_openai(src, root, job, err) : parse_native(src, root, job, err);
    }
    json_decref(root);
    return rc;
}

static bool is_blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r')
            return false;
    return true;
}

// A new record with its position filled in.
static tm_rc new_job(tm_source *src, const char *file, uint64_t line_no, tm_job **out, tm_err *err) {
    tm_job *job = tm_calloc(1, sizeof(*job));
    if (!job)
        return TM_ERR(err, TM_E_NOMEM, "record");
    job->seq_no = src->seq_no;
    job->line = line_no;
    job->format = src->file_fmt;
    job->file = tm_strdup(file);
    if (!job->file) {
        tm_free(job);
        return TM_ERR(err, TM_E_NOMEM, "record");
    }
    *out = job;
    return TM_OK;
}

// ---- public API ----

tm_rc tm_source_parse_line(tm_source *src, const char *file, uint64_t line_no, const char *s,
                           size_t n, tm_job **out, tm_err *err) {
    tm_job *job = NULL;
    tm_rc rc = new_job(src, file, line_no, &job, err);
    if (!rc)
        rc = parse_record(src, s, n, job, err);
    if (rc) {
        tm_job_destroy(job);
        return rc;
    }
    src->seq_no++;
    *out = job;
    return TM_OK;
}

tm_rc tm_source_line_too_long(tm_source *src, const char *file, uint64_t line_no,
                              uint64_t n_bytes, tm_job **out, tm_err *err) {
    tm_job *job = NULL;
    tm_rc rc = new_job(src, file, line_no, &job, err);
    if (!rc)
        rc = job_fail(job, TM_ERRCODE_LINE_TOO_LONG, err,
                      "line is %llu bytes, longer than limits.max_line_bytes (%llu)",
                      (unsigned long long)n_bytes, (unsigned long long)src->spec->max_line_bytes);
    if (rc) {
        tm_job_destroy(job);
        return rc;
    }
    src->seq_no++;
    *out = job;
    return TM_OK;
}

uint64_t tm_source_max_line_bytes(const tm_source *src) { return src->spec->max_line_bytes; }

void tm_source_set_check_ids(tm_source *src, bool on) { src->no_id_check = !on; }

void tm_source_reset_format(tm_source *src) {
    src->file_fmt = TM_REC_FORMAT_NATIVE;
    src->file_fmt_known = false;
}

tm_rc tm_source_open(const tm_job_spec *spec, tm_source **out, tm_err *err) {
    tm_source *src = tm_calloc(1, sizeof(*src));
    if (!src)
        return TM_ERR(err, TM_E_NOMEM, "source");
    pthread_mutex_init(&src->ack_mu, NULL);
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
    if (spec->kafka_in) {
        tm_source_set_check_ids(src, false);
        if (tm_kafka_in_open(spec->kafka_in, src, &src->kafka, err))
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
    tm_kafka_in_close(src->kafka); // commits what is durable, leaves the group
    close_file(src);
    if (src->dctx)
        LZ4F_freeDecompressionContext(src->dctx);
    tm_free(src->chunk);
    tm_free(src->zin);
    tm_buf_fini(&src->line);
    tm_free(src->ids.slots);
    tm_seqset_fini(&src->acked);
    pthread_mutex_destroy(&src->ack_mu);
    tm_free(src);
}

tm_rc tm_source_next(tm_source *src, tm_job **out, tm_err *err) {
    if (src->kafka)
        return tm_kafka_in_next(src->kafka, out, err);
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

        if (too_long)
            return tm_source_line_too_long(src, src->spec->inputs[src->i_file], src->line_no,
                                           n_bytes, out, err);
        return tm_source_parse_line(src, src->spec->inputs[src->i_file], src->line_no, s, n, out,
                                    err);
    }
}

tm_rc tm_source_ack(tm_source *src, const uint64_t *seq_nos, size_t n, tm_err *err) {
    tm_rc rc = TM_OK;
    pthread_mutex_lock(&src->ack_mu);
    for (size_t i = 0; i < n && !rc; i++)
        rc = tm_seqset_add(&src->acked, seq_nos[i], err);
    pthread_mutex_unlock(&src->ack_mu);
    if (!rc && src->kafka)
        rc = tm_kafka_in_ack(src->kafka, seq_nos, n, err);
    return rc;
}

bool tm_source_is_kafka(const tm_source *src) { return src->kafka != NULL; }

tm_rc tm_source_wait(tm_source *src, const tm_job *held, int ms, bool *drop, tm_err *err) {
    *drop = false;
    if (!src->kafka)
        return TM_OK;
    tm_rc rc = tm_kafka_in_wait(src->kafka, held->seq_no, ms, drop, err);
    if (*drop) {
        // Nothing was numbered since the held record: the next record takes its seq_no.
        TM_ASSERT(held->seq_no + 1 == src->seq_no);
        src->seq_no--;
    }
    return rc;
}

tm_rc tm_source_mark_written(tm_source *src, const uint64_t *seq_nos, size_t n, tm_err *err) {
    return src->kafka ? tm_kafka_in_mark_written(src->kafka, seq_nos, n, err) : TM_OK;
}

tm_rc tm_source_kafka_positions(tm_source *src, tm_source_kpos_fn fn, void *ctx, tm_err *err) {
    return src->kafka ? tm_kafka_in_positions(src->kafka, fn, ctx, err) : TM_OK;
}

tm_rc tm_source_kafka_resume(tm_source *src, const tm_source_kpos *pos, tm_err *err) {
    if (!src->kafka)
        return TM_OK;
    return tm_kafka_in_resume_add(src->kafka, pos->topic, pos->partition, pos->next, pos->ranges,
                                  pos->n_ranges, err);
}

void tm_source_kafka_set_txn(tm_source *src, bool on) {
    if (src->kafka)
        tm_kafka_in_set_txn(src->kafka, on);
}

tm_rc tm_source_kafka_group_md(tm_source *src, tm_buf *out, tm_err *err) {
    if (!src->kafka)
        return TM_ERR(err, TM_E_INVAL, "the job's input is not Kafka");
    return tm_kafka_in_group_md(src->kafka, out, err);
}

uint64_t tm_source_durable_watermark(tm_source *src) {
    pthread_mutex_lock(&src->ack_mu);
    uint64_t w = src->acked.watermark;
    pthread_mutex_unlock(&src->ack_mu);
    return w;
}

uint64_t tm_source_n_records(const tm_source *src) { return src->seq_no; }

size_t tm_source_line_cap(const tm_source *src) { return src->line.cap; }
