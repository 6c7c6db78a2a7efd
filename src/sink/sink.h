/* sink/sink.h - writes finished records into the job's output folder (schemas/output.schema.json
 * and schemas/error.schema.json are the contracts):
 *   completions.jsonl.lz4  ok records, one JSON line each, as concatenated LZ4 frames (content
 *                          checksum on, linked 256 KiB blocks); `lz4 -dc` reads the file;
 *   errors.jsonl           error records, one JSON line each, plain text.
 * (With opts.plain: completions.jsonl, plain JSON lines, instead of the LZ4 file.)
 * A frame is closed every frame_records records or frame_bytes uncompressed bytes (whichever comes
 * first, always on a line boundary), at tm_sink_flush and at tm_sink_close, so after a successful
 * flush every record written before it is durable (fsync) and decodable; only the frame after the
 * last flush can be lost in a crash. Lines are built with tm_buf, not jansson objects. One thread
 * at a time (the sink thread). The sink never reads the files back and does not write metrics. */
#ifndef TM_SINK_SINK_H
#define TM_SINK_SINK_H

#include <stdbool.h>
#include <stdint.h>

#include "base/buf.h"
#include "base/err.h"
#include "base/record.h"
#include "sink/out.h"

#define TM_SINK_COMPLETIONS_FILE "completions.jsonl.lz4"
#define TM_SINK_COMPLETIONS_PLAIN_FILE "completions.jsonl" /* opts.plain */
#define TM_SINK_ERRORS_FILE "errors.jsonl"
#define TM_SINK_DEFAULT_FRAME_BYTES (1u << 20)

typedef struct tm_sink tm_sink;

typedef struct tm_sink_opts {
    uint64_t frame_records; /* close the frame after this many records; 0 = no record limit */
    uint64_t frame_bytes;   /* ... or after this many uncompressed bytes; 0 = 1 MiB */
    bool append;            /* append to existing files (resume) instead of truncating them */
    bool no_fsync;          /* flush without fsync (tests, benchmarks); durability is lost */
    bool plain; /* ok records go to completions.jsonl as plain lines, not LZ4 frames (the job's
                 * output.compression "none"); a flush then ends on a line boundary as well */
} tm_sink_opts;

typedef struct tm_sink_stats {
    uint64_t n_ok;      /* ok records written */
    uint64_t n_err;     /* error records written */
    uint64_t n_frames;  /* LZ4 frames closed */
    uint64_t bytes_raw; /* uncompressed JSONL bytes of ok records */
    uint64_t bytes_lz4; /* bytes written to completions.jsonl.lz4 (or .jsonl with opts.plain) */
    uint64_t size_lz4;  /* length of completions.jsonl.lz4 (appended-to length included, */
    uint64_t size_err;  /* ... and of errors.jsonl), buffered bytes included: right after a
                         * successful tm_sink_flush, the durable lengths (the manifest's) */
} tm_sink_stats;

/* Create out_dir (and its parents) if missing and open both files. opts may be NULL (defaults).
 * On success *out owns the sink; end it with tm_sink_close. Errors: TM_E_IO (naming the path),
 * TM_E_NOMEM. */
tm_rc tm_sink_open(const char *out_dir, const tm_sink_opts *opts, tm_sink **out, tm_err *err);

/* Write one record: ok records (err_code == NONE, id_json required) go to the completions file,
 * error records to the errors file. Borrows c. TM_E_INVAL for an ok record without an id, TM_E_IO,
 * TM_E_NOMEM, TM_E_INTERNAL (LZ4 failure). After an error return the sink is unusable except for
 * tm_sink_close. */
tm_rc tm_sink_write(tm_sink *sink, const tm_completion *c, tm_err *err);

/* Close the current LZ4 frame (if any), write out buffered bytes of both files and fsync them
 * (steps 1-2 of the commit protocol in sink/manifest.h; fault point after_write_before_fsync sits
 * between the write-out and the fsyncs). When it returns TM_OK, everything written so far
 * survives a crash. TM_E_IO naming the file; after an error the sink is unusable (a failed fsync
 * is never retried: the data may be lost whatever a retry says). */
tm_rc tm_sink_flush(tm_sink *sink, tm_err *err);

/* Flush, close the files and free the sink. sink may be NULL (returns TM_OK). The sink is freed
 * even when an error is returned. */
tm_rc tm_sink_close(tm_sink *sink, tm_err *err);

void tm_sink_get_stats(const tm_sink *sink, tm_sink_stats *out);

/* Append the JSON line (with "\n") of an ok / error record to b. Exposed for tests and for other
 * sinks (Kafka) that send the same lines. TM_E_NOMEM; TM_E_INVAL for an ok record without id. */
/* The file sink as an output of the writer (sink/out.h): write is tm_sink_write, commit is
 * tm_sink_flush and gives back the files' durable lengths (the manifest's bytes_completions and
 * bytes_errors), close is tm_sink_close. The output holds sink; its close frees it. */
tm_sink_out tm_sink_as_out(tm_sink *sink);

tm_rc tm_sink_format_ok(tm_buf *b, const tm_completion *c, tm_err *err);
tm_rc tm_sink_format_error(tm_buf *b, const tm_completion *c, tm_err *err);

#endif /* TM_SINK_SINK_H */
