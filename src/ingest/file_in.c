/* ingest/file_in.c - the source of files and standard input (source_int.h's table): byte layer
 * (plain, LZ4 frames, gzip; each file cut at the size it had at start) -> bounded line splitter
 * (standard input fingerprinted as it goes) -> the shared record parser (rec_parser.c: jansson,
 * duplicate-id set). The only module file that calls LZ4F and zlib on the input side. source.h
 * describes the behaviour (formats, lines, growing inputs, standard input on resume). */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <lz4frame.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "base/alloc.h"
#include "base/buf.h"
#include "base/fsutil.h"
#include "base/hash.h"
#include "base/seqset.h"
#include "base/stop.h"
#include "ingest/source_int.h"

enum { CHUNK_BYTES = 64 * 1024, STDIN_POLL_MS = 200 };

typedef enum in_fmt { FMT_PLAIN, FMT_LZ4, FMT_GZ } in_fmt;

typedef struct file_in {
    const tm_job_spec *spec; /* borrowed */
    size_t i_file;           /* index of the open file, or of the next one to open */
    bool open;               /* a file is open */
    in_fmt fmt;
    FILE *fp;       /* a file (any format); NULL for standard input, read from fd 0 */
    bool is_stdin;  /* the open input is standard input */
    int64_t *sizes; /* [n_inputs] bytes to read of each regular file (-1: all); NULL: all */
    int64_t limit;  /* of the open file, or -1 */
    uint64_t n_raw; /* bytes read from the open file */
    z_stream zs;    /* gzip: inflate state, valid while zs_init */
    bool zs_init, gz_started, gz_in_member;
    LZ4F_dctx *dctx;
    unsigned char *zin; /* [CHUNK_BYTES] compressed bytes (lz4, gzip) */
    size_t zin_pos, zin_len;
    bool lz4_in_frame; /* the last LZ4F_decompress call did not end a frame */
    char *chunk;       /* [CHUNK_BYTES] decoded bytes */
    size_t chunk_pos, chunk_len;
    tm_buf line;       /* current line, at most max_line_bytes + 1 bytes */
    uint64_t line_no;  /* 1-based number of the last line read in the open file */
    tm_source_env env; /* the shared part's parser and acks (source_int.h) */

    // Standard input's fingerprint (source.h): hs[0] is fed every stdin byte the line splitter
    // consumes; at each line end it is copied to hs[1], the published state, under fp_mu.
    void *hs_mem;            /* owned allocation holding hs */
    tm_hash_stream *hs;      /* [2], 64-byte aligned inside hs_mem */
    uint64_t stdin_off;      /* stdin bytes consumed */
    pthread_mutex_t fp_mu;   /* guards pub and hs[1] */
    tm_source_stdin_fp pub;  /* published fingerprint */
    bool pub_live;           /* pub follows hs[1] (false until a resume prefix checked) */
    bool want_pending;       /* a resumed stdin prefix is to be checked when it opens */
    bool checking;           /* a resumed stdin prefix is being checked */
    tm_source_stdin_fp want; /* that prefix */
    bool want_hash_ok;       /* the first want.n_bytes bytes hashed to want.xxh3 */
    bool line_nl;            /* the last line ended with "\n" */
    char line_last;          /* its last byte before the "\n" */
    const tm_seqset *skip;   /* borrowed: records of the prefix committed earlier */
    tm_job **held;           /* [cap_held] FIFO of prefix records to run, owned */
    size_t n_held, i_held, cap_held;
    uint64_t n_skipped;
} file_in;

// ---- byte layer ----

static int has_suffix(const char *s, const char *suf) {
    size_t n = strlen(s), k = strlen(suf);
    return n >= k && memcmp(s + n - k, suf, k) == 0;
}

static void close_file(file_in *src) {
    if (src->fp) // standard input (fd 0) stays open: it is read once, see job_spec.h
        fclose(src->fp);
    if (src->zs_init)
        inflateEnd(&src->zs);
    src->zs_init = false;
    src->fp = NULL;
    src->is_stdin = false;
    src->open = false;
}

static tm_rc open_file(file_in *src, tm_err *err) {
    const char *path = src->spec->inputs[src->i_file];
    src->fmt = has_suffix(path, ".lz4") ? FMT_LZ4 : has_suffix(path, ".gz") ? FMT_GZ : FMT_PLAIN;
    src->limit = -1;
    src->n_raw = 0;
    if (strcmp(path, TM_JOB_STDIN) == 0) {
        src->fmt = FMT_PLAIN;
        src->is_stdin = true;
        src->checking = src->want_pending;
        src->want_pending = false;
    } else {
        tm_rc orc = tm_fs_fopen_in(path, "input", &src->fp, err); // FIFOs refused (issue 35)
        if (orc)
            return orc;
        struct stat st;
        if (src->sizes && src->sizes[src->i_file] >= 0 && fstat(fileno(src->fp), &st) == 0 &&
            S_ISREG(st.st_mode))
            src->limit = src->sizes[src->i_file];
    }
    if (src->fmt == FMT_GZ) {
        memset(&src->zs, 0, sizeof(src->zs));
        int z = inflateInit2(&src->zs, 16 + MAX_WBITS); // gzip wrapper only
        if (z != Z_OK)
            return TM_ERR(err, z == Z_MEM_ERROR ? TM_E_NOMEM : TM_E_INTERNAL, "%s: gzip: %s", path,
                          src->zs.msg ? src->zs.msg : "inflateInit2 failed");
        src->zs_init = true;
        src->gz_started = src->gz_in_member = false;
        src->zin_pos = src->zin_len = 0;
    }
    if (src->fmt == FMT_LZ4) {
        LZ4F_resetDecompressionContext(src->dctx);
        src->zin_pos = src->zin_len = 0;
        src->lz4_in_frame = false;
    }
    src->chunk_pos = src->chunk_len = 0;
    src->line_no = 0;
    tm_rec_parser_reset_format(src->env.parser);
    src->open = true;
    return TM_OK;
}

// Standard input: wait for data with poll(2) so that a stop request (base/stop.h) is seen
// while the writer of a pipe is silent. TM_E_AGAIN when a stop came first.
static tm_rc read_stdin(void *buf, size_t cap, size_t *n, tm_err *err) {
    for (;;) {
        struct pollfd pfd = {.fd = STDIN_FILENO, .events = POLLIN};
        int pr = poll(&pfd, 1, STDIN_POLL_MS);
        if (pr < 0 && errno != EINTR)
            return TM_ERR(err, TM_E_IO, "standard input: poll: %s", strerror(errno));
        if (pr <= 0) {
            if (tm_stop_requested())
                return TM_ERR(err, TM_E_AGAIN, "standard input: stopped by a signal");
            continue;
        }
        ssize_t k = read(STDIN_FILENO, buf, cap);
        if (k < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (k < 0)
            return TM_ERR(err, TM_E_IO, "standard input: read failed: %s", strerror(errno));
        *n = (size_t)k;
        return TM_OK;
    }
}

// The open input's next raw bytes, at most cap; *n == 0 at its end. A regular file ends at the
// size it had when the job started (src->limit); one that ends before it shrank: TM_E_IO.
static tm_rc read_raw(file_in *src, void *buf, size_t cap, size_t *n, tm_err *err) {
    const char *path = src->spec->inputs[src->i_file];
    *n = 0;
    if (src->is_stdin)
        return read_stdin(buf, cap, n, err);
    if (src->limit >= 0 && (uint64_t)src->limit - src->n_raw < cap)
        cap = (size_t)((uint64_t)src->limit - src->n_raw);
    if (cap == 0)
        return TM_OK;
    *n = fread(buf, 1, cap, src->fp);
    if (*n == 0 && ferror(src->fp))
        return TM_ERR(err, TM_E_IO, "%s: read failed: %s", path, strerror(errno));
    src->n_raw += *n;
    if (*n == 0 && src->limit >= 0 && src->n_raw < (uint64_t)src->limit)
        return TM_ERR(err, TM_E_IO,
                      "%s: the file shrank while the job read it (it ended after %llu of the %lld "
                      "bytes it had when the job started)",
                      path, (unsigned long long)src->n_raw, (long long)src->limit);
    return TM_OK;
}

// Read the next raw bytes of a compressed file into zin once the last ones are used. *n is 0 only
// at the end of the file, which is an error naming the cut unit (cut) while one is open.
static tm_rc zin_refill(file_in *src, bool in_unit, const char *cut, size_t *n, tm_err *err) {
    *n = 1;
    if (src->zin_pos < src->zin_len)
        return TM_OK;
    tm_rc rc = read_raw(src, src->zin, CHUNK_BYTES, n, err);
    if (rc)
        return rc;
    if (*n == 0)
        return in_unit ? TM_ERR(err, TM_E_PARSE, "%s: %s", src->spec->inputs[src->i_file], cut)
                       : TM_OK;
    src->zin_pos = 0;
    src->zin_len = *n;
    return TM_OK;
}

static tm_rc refill_lz4(file_in *src, tm_err *err) {
    const char *path = src->spec->inputs[src->i_file];
    for (;;) {
        size_t n;
        tm_rc rc = zin_refill(src, src->lz4_in_frame,
                              "truncated LZ4 stream (last frame has no end)", &n, err);
        if (rc || n == 0)
            return rc; // chunk_len == 0: end of file
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

// gzip: inflate the raw bytes member after member. The file must start with the gzip magic;
// a member cut short, or bytes after the last member that are not one, are TM_E_PARSE.
static tm_rc refill_gz(file_in *src, tm_err *err) {
    const char *path = src->spec->inputs[src->i_file];
    for (;;) {
        size_t n;
        tm_rc rc = zin_refill(src, src->gz_in_member,
                              "gzip: truncated stream (the last member has no end)", &n, err);
        if (rc || n == 0)
            return rc; // chunk_len == 0: end of file (an empty file holds no records)
        if (!src->gz_started && (src->zin_len < 2 || src->zin[0] != 0x1f || src->zin[1] != 0x8b))
            return TM_ERR(err, TM_E_PARSE,
                          "%s: not a gzip file (it does not start with the gzip magic bytes "
                          "1f 8b); a plain JSONL file must not be named .gz",
                          path);
        src->gz_started = true;
        src->zs.next_in = src->zin + src->zin_pos;
        src->zs.avail_in = (uInt)(src->zin_len - src->zin_pos);
        src->zs.next_out = (Bytef *)src->chunk;
        src->zs.avail_out = CHUNK_BYTES;
        src->gz_in_member = true;
        int z = inflate(&src->zs, Z_NO_FLUSH);
        src->zin_pos = src->zin_len - src->zs.avail_in;
        size_t n_out = CHUNK_BYTES - src->zs.avail_out;
        if (z == Z_STREAM_END) {
            inflateReset(&src->zs); // another member may follow
            src->gz_in_member = false;
        } else if (z != Z_OK && z != Z_BUF_ERROR) { // Z_BUF_ERROR: it needs more input
            return TM_ERR(err, z == Z_MEM_ERROR ? TM_E_NOMEM : TM_E_PARSE, "%s: gzip: %s", path,
                          src->zs.msg ? src->zs.msg : "corrupt stream");
        }
        if (n_out > 0) {
            src->chunk_len = n_out;
            return TM_OK;
        }
    }
}

// Read the next decoded bytes into chunk; chunk_len == 0 afterwards means end of file.
static tm_rc refill(file_in *src, tm_err *err) {
    src->chunk_pos = src->chunk_len = 0;
    if (src->fmt == FMT_LZ4)
        return refill_lz4(src, err);
    if (src->fmt == FMT_GZ)
        return refill_gz(src, err);
    size_t n = 0;
    tm_rc rc = read_raw(src, src->chunk, CHUNK_BYTES, &n, err);
    src->chunk_len = n;
    return rc;
}

// ---- standard input's fingerprint ----

// Feed n consumed stdin bytes to the working hash. While a resumed prefix is checked, the state
// at exactly want.n_bytes is compared with the prefix's hash.
static void stdin_hash(file_in *src, const char *p, size_t n) {
    if (src->checking && src->stdin_off < src->want.n_bytes &&
        src->want.n_bytes - src->stdin_off <= n) {
        size_t k = (size_t)(src->want.n_bytes - src->stdin_off);
        tm_hash_stream_update(&src->hs[0], p, k);
        tm_h128 h = tm_hash_stream_digest128(&src->hs[0]);
        src->want_hash_ok = h.lo == src->want.xxh3.lo && h.hi == src->want.xxh3.hi;
        p += k;
        n -= k;
        src->stdin_off += k;
    }
    tm_hash_stream_update(&src->hs[0], p, n);
    src->stdin_off += n;
}

// After each stdin line (and its record, if any, is numbered): publish the fingerprint.
static void stdin_publish(file_in *src) {
    if (!src->pub_live)
        return;
    pthread_mutex_lock(&src->fp_mu);
    memcpy(&src->hs[1], &src->hs[0], sizeof(src->hs[1]));
    src->pub.n_bytes = src->stdin_off;
    src->pub.n_records = tm_rec_parser_n_records(src->env.parser);
    src->pub.xxh3 = tm_hash_stream_digest128(&src->hs[1]);
    pthread_mutex_unlock(&src->fp_mu);
}

// ---- line splitter ----

/* Next line of the open file into src->line (without "\n" and a "\r" before it). *n_bytes is the
 * line's length; *too_long is set when it exceeds max_line_bytes, in which case the line was
 * consumed without being kept. TM_E_EOF at the end of the file. */
static tm_rc next_line(file_in *src, bool *too_long, uint64_t *n_bytes, tm_err *err) {
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
        if (src->is_stdin)
            stdin_hash(src, p, seg + (nl ? 1 : 0));
        src->chunk_pos += seg + (nl ? 1 : 0);
        if (nl)
            break;
    }
    src->line_nl = src->chunk_pos > 0 && src->chunk[src->chunk_pos - 1] == '\n';
    src->line_last = last;
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

// Resume check of standard input: rc and the line just read decide whether the stream started
// with the prefix. TM_OK while undecided or when it did (then checking ends); TM_E_INVAL if not.
static tm_rc check_prefix(file_in *src, tm_rc rc, tm_err *err) {
    const tm_source_stdin_fp *w = &src->want;
    if (rc == TM_OK && src->stdin_off < w->n_bytes)
        return TM_OK; // not there yet
    bool ok;
    if (rc == TM_E_EOF) {
        ok = src->stdin_off == w->n_bytes && src->want_hash_ok;
        if (src->stdin_off < w->n_bytes)
            return TM_ERR(err, TM_E_INVAL,
                          "standard input ended after %llu bytes, but this job's output folder "
                          "already answers records from the first %llu bytes of its stream (%llu "
                          "records): a rerun of a stdin job must be given the same stream again "
                          "(new lines may follow it); use another output.dir for another stream, "
                          "or tokenmill run --restart to start over",
                          (unsigned long long)src->stdin_off, (unsigned long long)w->n_bytes,
                          (unsigned long long)w->n_records);
    } else {
        // The line that reaches the prefix's end must end there too: past it at most its "\n"
        // or "\r\n" (the earlier stream's last line may have had none).
        uint64_t tail = src->stdin_off - w->n_bytes;
        ok = src->want_hash_ok && (tail == 0 || (tail == 1 && src->line_nl) ||
                                   (tail == 2 && src->line_nl && src->line_last == '\r'));
    }
    if (!ok)
        return TM_ERR(err, TM_E_INVAL,
                      "standard input is not the stream this job's output folder was made from: "
                      "its first %llu bytes (%llu records, xxh3 %016llx%016llx) differ; a rerun of "
                      "a stdin job must be given the same stream again (new lines may follow it); "
                      "use another output.dir for another stream, or tokenmill run --restart to "
                      "start over",
                      (unsigned long long)w->n_bytes, (unsigned long long)w->n_records,
                      (unsigned long long)w->xxh3.hi, (unsigned long long)w->xxh3.lo);
    src->checking = false;
    src->pub_live = true;
    return TM_OK;
}

// A record of the resumed prefix (takes job): committed earlier, so dropped here as the job
// would skip it (acked, counted), or held until the whole prefix checked out.
static tm_rc prefix_record(file_in *src, tm_job *job, tm_err *err) {
    if (src->skip && tm_seqset_has(src->skip, job->seq_no)) {
        tm_rc rc = src->env.ack(src->env.ack_ctx, &job->seq_no, 1, err);
        tm_job_destroy(job);
        src->n_skipped++;
        return rc;
    }
    if (src->n_held == src->cap_held) {
        size_t cap = src->cap_held ? 2 * src->cap_held : 64;
        tm_job **h = tm_realloc(src->held, cap * sizeof(*h));
        if (!h) {
            tm_job_destroy(job);
            return TM_ERR(err, TM_E_NOMEM,
                          "standard input: records held while its prefix is "
                          "checked");
        }
        src->held = h;
        src->cap_held = cap;
    }
    src->held[src->n_held++] = job;
    return TM_OK;
}

// The next record from the files (no held records); *out is NULL on TM_E_EOF.
// *in_prefix: its line was read while a resumed stdin prefix was being checked.
static tm_rc next_line_record(file_in *src, tm_job **out, bool *in_prefix, tm_err *err) {
    *out = NULL;
    *in_prefix = false;
    for (;;) {
        if (!src->open) {
            if (src->i_file >= src->spec->n_inputs)
                return TM_E_EOF;
            tm_rc rc = open_file(src, err);
            if (rc)
                return rc;
        }
        bool too_long = false, was_checking = src->checking;
        uint64_t n_bytes = 0;
        tm_rc rc = next_line(src, &too_long, &n_bytes, err);
        if (src->checking &&
            (rc == TM_E_EOF || (rc == TM_OK && src->stdin_off >= src->want.n_bytes))) {
            tm_rc crc = check_prefix(src, rc, err);
            if (crc)
                return crc;
        }
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
        if (!too_long && is_blank(s, n)) {
            if (src->is_stdin)
                stdin_publish(src);
            continue;
        }
        *in_prefix = was_checking;
        if (too_long)
            rc = tm_rec_parser_too_long(src->env.parser, src->spec->inputs[src->i_file],
                                        src->line_no, n_bytes, out, err);
        else
            rc = tm_rec_parser_line(src->env.parser, src->spec->inputs[src->i_file], src->line_no,
                                    s, n, out, err);
        if (src->is_stdin)
            stdin_publish(src);
        return rc;
    }
}

static tm_rc files_next(void *self, tm_job **out, tm_err *err) {
    file_in *src = self;
    for (;;) {
        if (!src->checking && src->i_held < src->n_held) { // a checked prefix's, in order
            *out = src->held[src->i_held++];
            if (src->i_held == src->n_held)
                src->i_held = src->n_held = 0;
            return TM_OK;
        }
        tm_job *job = NULL;
        bool in_prefix = false;
        tm_rc rc = next_line_record(src, &job, &in_prefix, err);
        if (rc || !in_prefix) {
            *out = job;
            return rc;
        }
        rc = prefix_record(src, job, err);
        if (rc)
            return rc;
    }
}

static tm_rc files_set_input_sizes(void *self, const int64_t *sizes, size_t n, tm_err *err) {
    file_in *src = self;
    TM_ASSERT(n == src->spec->n_inputs);
    int64_t *c = tm_malloc((n ? n : 1) * sizeof(*c));
    if (!c)
        return TM_ERR(err, TM_E_NOMEM, "input sizes");
    if (n)
        memcpy(c, sizes, n * sizeof(*c));
    tm_free(src->sizes);
    src->sizes = c;
    return TM_OK;
}

static void files_stdin_fingerprint(void *self, tm_source_stdin_fp *out) {
    file_in *src = self;
    pthread_mutex_lock(&src->fp_mu);
    *out = src->pub;
    pthread_mutex_unlock(&src->fp_mu);
}

static void files_stdin_resume(void *self, const tm_seqset *skip, const tm_source_stdin_fp *fp) {
    file_in *src = self;
    pthread_mutex_lock(&src->fp_mu);
    src->pub = *fp;
    pthread_mutex_unlock(&src->fp_mu);
    src->want = *fp;
    src->skip = skip;
    src->want_pending = fp->n_bytes > 0;
    src->pub_live = !src->want_pending;
}

static tm_rc files_stdin_check(void *self, tm_err *err) {
    file_in *src = self;
    if (!src->want_pending || src->open || src->i_file != 0 || src->spec->n_inputs == 0 ||
        strcmp(src->spec->inputs[0], TM_JOB_STDIN) != 0)
        return TM_OK;
    // Read the prefix now: the records to run wait in the held list.
    tm_rc rc = open_file(src, err);
    while (!rc && src->checking) {
        tm_job *job = NULL;
        bool in_prefix = false;
        rc = next_line_record(src, &job, &in_prefix, err);
        if (rc == TM_E_EOF) {
            rc = TM_OK;
            break;
        }
        if (rc)
            break;
        rc = prefix_record(src, job, err);
    }
    return rc;
}

static uint64_t files_n_skipped(const void *self) { return ((const file_in *)self)->n_skipped; }

static size_t files_line_cap(const void *self) { return ((const file_in *)self)->line.cap; }

static bool files_claims(const tm_job_spec *spec) {
    (void)spec; // every input that no other kind claims: files and standard input
    return true;
}

static void files_close(void *self) {
    file_in *src = self;
    if (!src)
        return;
    close_file(src);
    if (src->dctx)
        LZ4F_freeDecompressionContext(src->dctx);
    tm_free(src->chunk);
    tm_free(src->zin);
    tm_free(src->hs_mem);
    tm_free(src->sizes);
    for (size_t i = src->i_held; i < src->n_held; i++)
        tm_job_destroy(src->held[i]);
    tm_free(src->held);
    tm_buf_fini(&src->line);
    pthread_mutex_destroy(&src->fp_mu);
    tm_free(src);
}

static tm_rc files_open(const tm_job_spec *spec, const tm_source_env *env, void **self,
                        tm_err *err) {
    *self = NULL;
    file_in *src = tm_calloc(1, sizeof(*src));
    if (!src)
        return TM_ERR(err, TM_E_NOMEM, "source");
    pthread_mutex_init(&src->fp_mu, NULL);
    src->spec = spec;
    src->env = *env;
    src->pub_live = true;
    src->chunk = tm_malloc(CHUNK_BYTES);
    src->zin = tm_malloc(CHUNK_BYTES);
    src->hs_mem = tm_malloc(2 * sizeof(tm_hash_stream) + 64);
    if (!src->chunk || !src->zin || !src->hs_mem) {
        TM_ERR(err, TM_E_NOMEM, "source buffers");
        goto fail;
    }
    src->hs = (tm_hash_stream *)(((uintptr_t)src->hs_mem + 63) & ~(uintptr_t)63);
    tm_hash_stream_init(&src->hs[0]);
    tm_hash_stream_init(&src->hs[1]);
    src->pub.xxh3 = tm_hash_stream_digest128(&src->hs[1]);
    LZ4F_errorCode_t lrc = LZ4F_createDecompressionContext(&src->dctx, LZ4F_VERSION);
    if (LZ4F_isError(lrc)) {
        src->dctx = NULL;
        TM_ERR(err, TM_E_NOMEM, "LZ4 decompression context: %s", LZ4F_getErrorName(lrc));
        goto fail;
    }
    *self = src;
    return TM_OK;
fail:
    files_close(src);
    return err->rc;
}

const tm_source_ops tm_file_in_ops = {
    .name = "files",
    .claims = files_claims,
    .open = files_open,
    .close = files_close,
    .next = files_next,
    .set_input_sizes = files_set_input_sizes,
    .stdin_fingerprint = files_stdin_fingerprint,
    .stdin_resume = files_stdin_resume,
    .stdin_check = files_stdin_check,
    .n_skipped = files_n_skipped,
    .line_cap = files_line_cap,
};
