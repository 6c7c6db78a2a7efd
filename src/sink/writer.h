/* sink/writer.h - the sink thread: takes finished records off the runner's queue, sends each to
 * its output (sink/out.h: the file sink, the Kafka producer), counts it (metrics, progress line,
 * the manifest's done set and counts) and commits every commit_every_ms / commit_every_records:
 * the input's positions gathered (tm_sink_writer_input.prepare), every output durable (the last
 * added first, so the file sink, added first, commits last), the input's last word on the
 * manifest (seal), the manifest published (sink/manifest.h), and only then the records
 * acknowledged to the input (ack). The input side reaches the writer through
 * tm_sink_writer_input, which cmd/ wires to the source: sink/ never sees ingest/.
 *
 * Threading: create, add, start, then the writer thread alone touches the outputs, the manifest
 * and the stats until tm_sink_writer_join; after it the job's thread may commit, read the stats
 * and close. A failed write or commit stops writing (the records still coming are only counted
 * on the progress line and freed); the first error is kept (tm_sink_writer_status). */
#ifndef TM_SINK_WRITER_H
#define TM_SINK_WRITER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "base/queue.h"
#include "sink/manifest.h"
#include "sink/metrics.h"
#include "sink/out.h"
#include "sink/progress.h"

#define TM_SINK_WRITER_MAX_OUTS 4
/* Which records an output takes (tm_sink_writer_add). */
#define TM_SINK_ROUTE_OK 1u  /* completions */
#define TM_SINK_ROUTE_ERR 2u /* error records */

typedef struct tm_sink_writer tm_sink_writer;

/* The input side of a commit; ctx and the functions are cmd/'s (the source behind them). */
typedef struct tm_sink_writer_input {
    void *ctx;
    /* Before the outputs commit: seq_nos[0..n) are the records this commit makes durable. Put the
     * input's positions into man, and when they travel in the outputs' transaction into ci
     * (txn_offsets, offs, group_md: valid until the next call). NULL: nothing to do. */
    tm_rc (*prepare)(void *ctx, const uint64_t *seq_nos, size_t n, tm_manifest *man,
                     tm_sink_commit *ci, tm_err *err);
    /* The outputs are durable, the manifest is about to be published: what of the input it
     * covers (standard input's fingerprint). NULL: nothing. */
    void (*seal)(void *ctx, tm_manifest *man);
    /* The manifest is published: seq_nos[0..n) are durable (tm_source_ack). */
    tm_rc (*ack)(void *ctx, const uint64_t *seq_nos, size_t n, tm_err *err);
} tm_sink_writer_input;

typedef struct tm_sink_writer_cfg {
    tm_manifest *man; /* the job's manifest: lent to the writer thread while it runs */
    const char *dir;  /* output folder (the manifest's); borrowed */
    double commit_every_ms;
    uint64_t commit_every_records;
    tm_metrics *metrics;   /* borrowed */
    tm_progress *progress; /* borrowed */
    tm_sink_writer_input input;
} tm_sink_writer_cfg;

/* What the writer did, for metrics.json and the summary. */
typedef struct tm_sink_writer_stats {
    uint64_t n_commits; /* made so far in this run */
    double commit_ms_total, commit_ms_max;
    uint64_t n_ok, n_err, n_tok_prompt, n_tok_gen; /* records written and their tokens */
} tm_sink_writer_stats;

/* Copies cfg (what it points to is borrowed and must outlive the writer). TM_E_NOMEM. */
tm_rc tm_sink_writer_create(const tm_sink_writer_cfg *cfg, tm_sink_writer **out, tm_err *err);
/* Add an output, taking ownership of it (closed by tm_sink_writer_close). routes says which
 * records it takes (TM_SINK_ROUTE_*): each kind goes to the last added output that takes it. At
 * most TM_SINK_WRITER_MAX_OUTS; before tm_sink_writer_start. */
void tm_sink_writer_add(tm_sink_writer *w, tm_sink_out out, unsigned routes);
/* Start the writer thread on q (borrowed; it pops until q is closed and empty). TM_E_INTERNAL. */
tm_rc tm_sink_writer_start(tm_sink_writer *w, tm_queue *q, tm_err *err);
/* Wait for the thread to end (q closed and drained). Only after a successful start. */
void tm_sink_writer_join(tm_sink_writer *w);
/* The thread's first error (TM_OK: none), with *err filled. After join. */
tm_rc tm_sink_writer_status(const tm_sink_writer *w, tm_err *err);
/* One commit now, on the calling thread (the last one, after join). Errors as the commits. */
tm_rc tm_sink_writer_commit(tm_sink_writer *w, tm_err *err);
void tm_sink_writer_get_stats(const tm_sink_writer *w, tm_sink_writer_stats *out);
/* Close the outputs (the last added first); the first error is returned. NULL: TM_OK. */
tm_rc tm_sink_writer_close(tm_sink_writer *w, tm_err *err);
void tm_sink_writer_destroy(tm_sink_writer *w); /* NULL is a no-op; closes what is still open */

#endif /* TM_SINK_WRITER_H */
