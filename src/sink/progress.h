/* sink/progress.h - live progress of a running job: a status line redrawn in place on stderr when
 * it is a terminal, one log line every interval_s seconds otherwise, and optionally a Prometheus
 * textfile (node_exporter's textfile-collector format) rewritten atomically about once a second.
 * It shows records done / total (the total is known once the source has read its last record),
 * output tokens/s, and an ETA measured in tokens: the tokens still to come (records not done, in
 * flight or not yet admitted, times the mean prompt + completion tokens of the records that
 * succeeded, the completion bounded by max_tokens, less what the records in flight computed
 * already) over the token rate so far; never 0 while records remain.
 *
 * Records are counted as they finish; tokens, with tm_progress_set_live, as the runner computes
 * them (unfinished records included), so a job of a few long records shows its token rate from
 * the start. The bar is clipped to the terminal's width (it never wraps, so a redraw never adds
 * a line). Threading: tm_progress_set_total may be called from any
 * thread (the source thread); everything else belongs to the sink thread. Display and textfile
 * problems never fail the job: the first textfile error is logged as a warning and the textfile
 * is then left alone. The live counters are plain atomics the job hands to both the runner and
 * this module (sink never sees the runner). */
#ifndef TM_SINK_PROGRESS_H
#define TM_SINK_PROGRESS_H

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>

#include "base/err.h"
#include "base/record.h"

typedef enum tm_progress_mode {
    TM_PROGRESS_AUTO = 0, /* BAR if out is a terminal, else LINES; OFF below log level info */
    TM_PROGRESS_BAR,      /* status line redrawn with \r */
    TM_PROGRESS_LINES,    /* a log line every interval_s */
    TM_PROGRESS_OFF,      /* nothing on out (the textfile is still written) */
} tm_progress_mode;

typedef struct tm_progress_cfg {
    const char *job_name; /* for lines and the textfile's job label; copied */
    const char *textfile; /* Prometheus textfile path, or NULL; copied */
    tm_progress_mode mode;
    double interval_s; /* LINES: seconds between lines; 0 = 10 */
    FILE *out;         /* where BAR/LINES go; NULL = stderr. Borrowed; must outlive it */
    int width;         /* BAR: columns; 0 = the terminal's (TIOCGWINSZ, else $COLUMNS, else 80) */
} tm_progress_cfg;

typedef struct tm_progress tm_progress;

/* Start the clock. On success *out owns a new tracker (tm_progress_destroy). TM_E_NOMEM. */
tm_rc tm_progress_create(const tm_progress_cfg *cfg, tm_progress **out, tm_err *err);
void tm_progress_destroy(tm_progress *p); /* NULL is a no-op; does not remove the textfile */

/* The job has n_records records in all. Any thread. */
void tm_progress_set_total(tm_progress *p, uint64_t n_records);
/* Count tokens as they are computed: *n_tok_gen generated, *n_tok_prompt prompt tokens computed,
 * finished records or not (the runner adds to them: runner/runner.h live_tok_*). Borrowed; they
 * must outlive p. With them the rates, "tok out" and the ETA use these counts; without, the
 * finished records' tokens. */
void tm_progress_set_live(tm_progress *p, const _Atomic uint64_t *n_tok_gen,
                          const _Atomic uint64_t *n_tok_prompt);
/* A resumed job: records earlier runs committed (n_ok ok, n_failed failed). The record counts
 * shown (and the total, which the caller gives for the whole job) include them, labelled "(N by
 * earlier runs)"; rates, tokens and the ETA's per-record estimate stay this run's. */
void tm_progress_set_earlier(tm_progress *p, uint64_t n_ok, uint64_t n_failed);
/* The job's max_tokens (defaults.max_tokens): the ETA's bound on a record's completion, and its
 * estimate before any record has succeeded. 0: not known (no ETA until a record succeeds). */
void tm_progress_set_max_tokens(tm_progress *p, uint32_t max_tokens);
/* Kafka input figures, one per assigned partition (ingest's tm_source_klag as job_run hands
 * them over): topic borrowed until the job's source closes; -1 = unknown. */
typedef struct tm_progress_kpart {
    const char *topic;
    int32_t partition;
    int64_t committed, lag;
    uint32_t read_ahead; /* records read, handed to the runner and not yet durable */
} tm_progress_kpart;
/* The consumer's counters so far. */
typedef struct tm_progress_ktotals {
    uint64_t commits;  /* offset commits accepted */
    uint64_t errors;   /* offset commits failed or unanswered, consumer and broker errors */
    uint64_t released; /* records released at revokes before they started */
} tm_progress_ktotals;
/* Fill up to cap partitions' figures and *tot; returns how many partitions there are. Called on
 * the progress's thread (the sink thread); must be thread-safe. */
typedef size_t (*tm_progress_kafka_fn)(void *ctx, tm_progress_kpart *out, size_t cap,
                                       tm_progress_ktotals *tot);
/* With fn, the line shows the consumer lag (the sum over the assigned partitions) and the
 * textfile, rewritten about once a second (the periodic snapshot of the job's figures),
 * tokenmill_kafka_lag, tokenmill_kafka_committed_offset and tokenmill_kafka_read_ahead per topic
 * and partition, and the counters tokenmill_kafka_offset_commits_total,
 * tokenmill_kafka_errors_total and tokenmill_kafka_released_total. */
void tm_progress_set_kafka(tm_progress *p, tm_progress_kafka_fn fn, void *ctx);
/* Count one finished record (ok or error). Borrows c. */
void tm_progress_add_record(tm_progress *p, const tm_completion *c);
/* Redraw / log / write the textfile if their time has come (BAR at most 5 times a second, LINES
 * every interval_s, textfile once a second). Cheap when nothing is due; call it often. */
void tm_progress_tick(tm_progress *p);
/* The job ended: a last status (the bar ends with a newline), textfile with finished 1. */
void tm_progress_finish(tm_progress *p);

/* The status text at time now_ms (tm_now_ms clock) into buf, e.g.
 * "37/51 records (72.5%), 2 failed | 412.3 tok/s out | ETA 12s (~4.9k tok left)"; with live
 * counters also "| 1.9k tok out" after the rates. Exposed for tests. Returns buf. */
const char *tm_progress_format(const tm_progress *p, double now_ms, char *buf, size_t n);
/* The bar line as drawn at now_ms into buf: "\r\033[K" + [###...] + status, clipped to width - 1
 * columns (the bar goes first when it does not fit), + "\n" when final. Exposed for tests. */
const char *tm_progress_bar_line(const tm_progress *p, double now_ms, int width, int final,
                                 char *buf, size_t n);
/* Write the Prometheus textfile now (atomically: path.tmp, then rename). TM_E_IO, TM_E_NOMEM.
 * Exposed for tests; tick/finish call it. */
tm_rc tm_progress_write_textfile(const tm_progress *p, double now_ms, int finished, tm_err *err);

#endif /* TM_SINK_PROGRESS_H */
