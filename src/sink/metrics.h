/* sink/metrics.h - per-job metrics: record counts, token counts, latency percentiles, engine step
 * timings and the settings the job ran with, written as metrics.json (schemas/metrics.schema.json,
 * "schema_version": 1). Definitions:
 *   TTFT      admission -> first generated token (tm_completion.ttft_ms);
 *   e2e       admission -> finish (total_ms);
 *   TPOT      (total_ms - ttft_ms) / (completion_tokens - 1), for records with >= 2 tokens;
 *   prefill tok/s = prefill tokens / prefill seconds, decode tok/s = decode tokens / decode
 *   seconds (both summed over engine steps), output tok/s = completion tokens / wall seconds.
 * Percentiles interpolate linearly between the two nearest ranks (numpy's default). Memory: three
 * doubles are kept per ok record for the percentiles (24 bytes each; a streaming sketch can replace
 * them when jobs reach 1e8 records). Not thread-safe: the sink thread owns it. */
#ifndef TM_SINK_METRICS_H
#define TM_SINK_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "base/record.h"

#define TM_METRICS_SCHEMA_VERSION 1

/* What the job ran with. Strings are borrowed by tm_metrics_set_settings, which copies them; NULL
 * or "" means unknown (written as null). */
typedef struct tm_metrics_settings {
    const char *backend;         /* "cpu", "cuda" (the resolved backend, not "auto") */
    uint32_t tp;                 /* tensor-parallel ranks */
    uint32_t max_seqs;
    uint32_t max_batched_tokens;
    uint32_t block_size;         /* tokens per KV block */
    uint32_t kv_blocks;          /* KV blocks in the pool (0 = unknown) */
    const char *kv_dtype;        /* "bf16", "f32", ... */
    bool prefix_cache;
    uint32_t threads;            /* CPU threads used */
    const char *model_path;
    const char *model_arch;      /* config.json "architectures"[0] or model_type */
    uint64_t n_params;           /* 0 = unknown */
    const char *device;          /* accelerator, e.g. "NVIDIA H200 x4"; NULL for cpu */
} tm_metrics_settings;

typedef struct tm_metrics tm_metrics;

/* New metrics; the job's start time is now (UTC and monotonic). Host name and CPU model are read
 * here. On success *out owns it (free with tm_metrics_destroy). TM_E_NOMEM. */
tm_rc tm_metrics_create(tm_metrics **out, tm_err *err);
void tm_metrics_destroy(tm_metrics *m); /* NULL is a no-op */

/* Copy the settings (strings included). Replaces earlier settings. TM_E_NOMEM. */
tm_rc tm_metrics_set_settings(tm_metrics *m, const tm_metrics_settings *s, tm_err *err);
/* Count one finished record (ok or error). Borrows c. TM_E_NOMEM (growing the sample arrays). */
tm_rc tm_metrics_add_record(tm_metrics *m, const tm_completion *c, tm_err *err);
/* Engine totals as the runner counts them. */
typedef struct tm_metrics_engine {
    uint64_t steps;           /* forward passes */
    uint64_t n_tok_prefill;   /* prompt tokens computed (cached ones excluded) */
    double prefill_s;         /* step time attributed to them */
    uint64_t n_tok_decode;    /* generated tokens computed */
    double decode_s;
    uint64_t preemptions;     /* sequences preempted for KV blocks (recomputed later) */
    double sum_step_fill;     /* sum over steps of tokens / max_batched_tokens */
    double sum_running;       /* sum over steps of sequences in the step */
} tm_metrics_engine;

/* Add engine totals (may be called once per step or once per job with sums). */
void tm_metrics_add_engine(tm_metrics *m, const tm_metrics_engine *e);
/* Speculative decoding: draft tokens proposed and accepted (omit the call when not used). */
void tm_metrics_add_spec(tm_metrics *m, uint64_t n_proposed, uint64_t n_accepted);
/* Mark the end of the job (end time, wall seconds). Until called, writes use "now". */
void tm_metrics_end(tm_metrics *m);

/* Write metrics.json to path atomically: path.tmp is written and fsynced, renamed over path, and
 * the folder is fsynced. May be called many times (progress snapshots). TM_E_IO, TM_E_NOMEM. */
tm_rc tm_metrics_write_json(const tm_metrics *m, const char *path, tm_err *err);

/* Percentile p (0..100) of the n values in sorted[] (ascending), linear interpolation; NaN when
 * n == 0. Exposed for tests. */
double tm_metrics_percentile(const double *sorted, size_t n, double p);

#endif /* TM_SINK_METRICS_H */
