/* ingest/source.c - JSONL reader: byte layer (plain, LZ4 frames, gzip) -> bounded line splitter ->
 * record parser (rec_parser.c: jansson, duplicate-id set). The only module file that calls LZ4F
 * and zlib on the input side. A Kafka input goes to kafka_in.c instead, which shares the parser:
 * source.c calls kafka_in.c, never the other way round. */
#include "ingest/source.h"

#include <errno.h>
#include <pthread.h>
#include <lz4frame.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "base/alloc.h"
#include "base/buf.h"
#include "base/seqset.h"
#include "ingest/kafka_in.h"
#include "ingest/rec_parser_int.h"

enum { CHUNK_BYTES = 64 * 1024 };

typedef enum in_fmt { FMT_PLAIN, FMT_LZ4, FMT_GZ } in_fmt;

struct tm_source {
    const tm_job_spec *spec; /* borrowed */
    size_t i_file;           /* index of the open file, or of the next one to open */
    bool open;               /* a file is open */
    in_fmt fmt;
    FILE *fp; /* plain and lz4 */
    gzFile gz;
    LZ4F_dctx *dctx;
    unsigned char *zin; /* [CHUNK_BYTES] compressed bytes (lz4) */
    size_t zin_pos, zin_len;
    bool lz4_in_frame; /* the last LZ4F_decompress call did not end a frame */
    char *chunk;       /* [CHUNK_BYTES] decoded bytes */
    size_t chunk_pos, chunk_len;
    tm_buf line;            /* current line, at most max_line_bytes + 1 bytes */
    uint64_t line_no;       /* 1-based number of the last line read in the open file */
    tm_rec_parser parser;   /* numbers and parses the records (files and Kafka) */
    pthread_mutex_t ack_mu; /* guards acked (tm_source_ack comes from the sink thread) */
    tm_seqset acked;        /* seq_nos acknowledged as durable */
    tm_kafka_in *kafka;     /* input.kafka: the consumer, owned; NULL for files */
};

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
    tm_rec_parser_reset_format(&src->parser);
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
                    return TM_ERR(err, TM_E_PARSE,
                                  "%s: truncated LZ4 stream (last frame has no end)", path);
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
    pthread_mutex_init(&src->ack_mu, NULL);
    src->spec = spec;
    tm_rec_parser_init(&src->parser, spec);
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
        tm_rec_parser_set_check_ids(&src->parser, false);
        if (tm_kafka_in_open(spec->kafka_in, &src->parser, &src->kafka, err))
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
    tm_rec_parser_fini(&src->parser);
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
            return tm_rec_parser_too_long(&src->parser, src->spec->inputs[src->i_file],
                                          src->line_no, n_bytes, out, err);
        return tm_rec_parser_line(&src->parser, src->spec->inputs[src->i_file], src->line_no, s, n,
                                  out, err);
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
        tm_rec_parser_take_back(&src->parser, held->seq_no);
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

uint64_t tm_source_n_records(const tm_source *src) { return tm_rec_parser_n_records(&src->parser); }

size_t tm_source_line_cap(const tm_source *src) { return src->line.cap; }
