/* sink/metrics.h - per-job metrics: record counts, token counts, latency percentiles, engine step
 * timings, the settings the job ran with, the machine (host, GPUs and their power draw through
 * NVML when the driver is there) and, for `tokenmill bench`, the workload; written as metrics.json
 * (schemas/metrics.schema.json, "schema_version": 2). Latencies follow vLLM's benchmark
 * definitions (benchmarks/benchmark_serving.py), with the record's admission as its send time:
 *   TTFT      admission -> first generated token (tm_completion.ttft_ms);
 *   E2EL      admission -> finish (total_ms), written as "e2e";
 *   TPOT      per record, (total_ms - ttft_ms) / (completion_tokens - 1), records with >= 2 tokens;
 *   ITL       every gap between two consecutive generated tokens of a record, pooled over all
 *             records (tm_completion.itl_ms);
 *   prefill tok/s = prefill tokens / prefill seconds, decode tok/s = decode tokens / decode
 *   seconds (both summed over engine steps), output tok/s = completion tokens / wall seconds.
 * Percentiles interpolate linearly between the two nearest ranks (numpy's default). Memory: three
 * doubles are kept per ok record for TTFT/E2EL/TPOT (24 bytes each; a streaming sketch can replace
 * them when jobs reach 1e8 records); ITL, one sample per generated token, goes into a fixed
 * log-bucket histogram (1% wide buckets, 17 KB): its mean and max are exact, its percentiles
 * within 0.5%. Not thread-safe: the sink thread owns it (the job's thread after joining it). */
#ifndef TM_SINK_METRICS_H
#define TM_SINK_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "base/record.h"

#define TM_METRICS_SCHEMA_VERSION 2

/* What the job ran with. Strings are borrowed by tm_metrics_set_settings, which copies them; NULL
 * or "" means unknown (written as null). */
typedef struct tm_metrics_settings {
    const char *backend; /* "cpu", "cuda" (the resolved backend, not "auto") */
    uint32_t tp;         /* tensor-parallel ranks */
    uint32_t max_seqs;
    uint32_t max_batched_tokens;
    uint32_t block_size;      /* tokens per KV block */
    uint32_t kv_blocks;       /* KV blocks in the pool (0 = unknown) */
    const char *kv_dtype;     /* "bf16", "f32", ... */
    const char *quantization; /* engine.quantization: "none", or "fp8" (linears quantized at
                               * load); NULL: not a job setting (bench) */
    bool prefix_cache;
    uint32_t threads; /* CPU threads used */
    const char *model_path;
    const char *model_arch; /* config.json "architectures"[0] or model_type */
    uint64_t n_params;      /* 0 = unknown */
    const char *device;     /* accelerator, e.g. "NVIDIA H200 x4"; NULL for cpu */
} tm_metrics_settings;

/* The standard workload a `tokenmill bench` run measured (BENCHMARKS.md); absent for jobs. */
typedef struct tm_metrics_bench {
    const char *workload;          /* "W1", "W8", "P", "prefix" */
    const char *scale;             /* "full" or "small" */
    uint32_t n_seqs;               /* records (sequences), all submitted at once */
    uint32_t prompt_tokens;        /* per record, random token ids */
    uint32_t gen_tokens;           /* per record, greedy, EOS ignored */
    uint32_t shared_prefix_tokens; /* leading prompt tokens all records share */
    uint64_t seed;                 /* prompt generator seed */
} tm_metrics_bench;

typedef struct tm_metrics tm_metrics;

/* New metrics; the job's start time is now (UTC and monotonic). Host name and CPU model are read
 * here, NVML is opened (sink/nvml.h; no GPU or no driver is fine) and the GPUs' energy counters
 * read. On success *out owns it (free with tm_metrics_destroy). TM_E_NOMEM. */
tm_rc tm_metrics_create(tm_metrics **out, tm_err *err);
void tm_metrics_destroy(tm_metrics *m); /* NULL is a no-op */

/* Copy the settings (strings included). Replaces earlier settings. TM_E_NOMEM. */
tm_rc tm_metrics_set_settings(tm_metrics *m, const tm_metrics_settings *s, tm_err *err);
/* Where the run came from: the job file (tokenmill run) or NULL, and the bench workload or NULL.
 * Strings are copied. TM_E_NOMEM. */
tm_rc tm_metrics_set_job(tm_metrics *m, const char *job_path, tm_err *err);
tm_rc tm_metrics_set_bench(tm_metrics *m, const tm_metrics_bench *b, tm_err *err);
/* Count one finished record (ok or error), its ITL samples included. Borrows c. TM_E_NOMEM
 * (growing the sample arrays). */
tm_rc tm_metrics_add_record(tm_metrics *m, const tm_completion *c, tm_err *err);
/* Engine totals as the runner counts them. */
typedef struct tm_metrics_engine {
    uint64_t steps;         /* forward passes */
    uint64_t n_tok_prefill; /* prompt tokens computed (cached ones excluded) */
    double prefill_s;       /* step time attributed to them */
    uint64_t n_tok_decode;  /* generated tokens computed */
    double decode_s;
    uint64_t preemptions; /* sequences preempted for KV blocks (recomputed later) */
    double sum_step_fill; /* sum over steps of tokens / max_batched_tokens */
    double sum_running;   /* sum over steps of sequences in the step */
} tm_metrics_engine;

/* Add engine totals (may be called once per step or once per job with sums). */
void tm_metrics_add_engine(tm_metrics *m, const tm_metrics_engine *e);
#define TM_METRICS_SPEC_MAX_K 16 /* num_speculative_tokens at most */

/* Speculative decoding totals, vLLM's counters (omit the call when not used). */
typedef struct tm_metrics_spec {
    const char *method;           /* "ngram" or "mtp"; a static string (not copied) */
    uint32_t k;                   /* num_speculative_tokens, 1..TM_METRICS_SPEC_MAX_K */
    uint64_t n_drafts;            /* verifications of >= 1 draft token */
    uint64_t n_draft_tok;         /* draft tokens verified */
    uint64_t n_accepted;          /* draft tokens accepted */
    const uint64_t *accepted_pos; /* [k] verifications that accepted the draft at position i;
                                   * borrowed for the call */
} tm_metrics_spec;

/* Add speculative totals (the method and k of the last call stand). */
void tm_metrics_add_spec(tm_metrics *m, const tm_metrics_spec *s);
/* Structured output (issue 26): the runner's counters (omit the call when no record was
 * constrained; metrics.json then has no "guided" key). Adds to earlier calls. */
typedef struct tm_metrics_guided {
    uint64_t records;    /* sequences that ran constrained */
    uint64_t compiled;   /* distinct constraints compiled */
    uint64_t masks;      /* token masks looked up (one per constrained token) */
    uint64_t masks_cold; /* of them, computed rather than cached */
    double mask_s;       /* time in mask lookups and computation */
    double compile_s;    /* time compiling constraints and the vocabulary trie */
    uint64_t unfinished; /* records cut by max_tokens / the context before acceptance */
} tm_metrics_guided;
void tm_metrics_add_guided(tm_metrics *m, const tm_metrics_guided *g);
/* Records finished by earlier runs of the same job (a resumed job; sink/manifest.h carries the
 * totals): added to records and tokens, so metrics.json covers the whole job. Latencies,
 * throughput and engine figures stay this run's. n_err_by_code is [TM_ERRCODE_COUNT]. */
typedef struct tm_metrics_earlier {
    uint64_t n_ok, n_failed;
    const uint64_t *n_err_by_code;
    uint64_t n_tok_prompt, n_tok_cached, n_tok_gen;
} tm_metrics_earlier;
void tm_metrics_add_earlier(tm_metrics *m, const tm_metrics_earlier *e);
/* Commit figures of a tokenmill run job ("durability" in metrics.json; absent until set). */
typedef struct tm_metrics_durability {
    uint64_t commits;       /* this run */
    uint64_t commits_total; /* all runs */
    double commit_ms_total, commit_ms_max;
    uint32_t runs;            /* runs that committed, this one included */
    uint64_t resumed_records; /* records committed by earlier runs, skipped now */
    uint64_t cut_bytes;       /* torn bytes cut off the data files at start */
} tm_metrics_durability;
void tm_metrics_set_durability(tm_metrics *m, const tm_metrics_durability *d);
/* Kafka input figures ("kafka" in metrics.json; absent until set): per assigned partition the
 * offset this consumer committed, its read position, the high watermark and the lag; and the
 * messages that made no record. Copies everything. TM_E_NOMEM. */
typedef struct tm_metrics_kpart {
    const char *topic;
    int32_t partition;
    int64_t committed, position, high, lag; /* -1: unknown */
} tm_metrics_kpart;
typedef struct tm_metrics_kafka {
    const tm_metrics_kpart *parts;
    size_t n_parts;
    uint64_t tombstones, empty, done_before;
    uint64_t released; /* records released at revokes before they started (kafka_in.h) */
    uint64_t commits;  /* offset commits the brokers accepted */
    uint64_t errors;   /* offset commits failed or unanswered, consumer and broker errors */
} tm_metrics_kafka;
tm_rc tm_metrics_set_kafka(tm_metrics *m, const tm_metrics_kafka *k, tm_err *err);
/* Sample the GPUs' power draw (NVML), at most once a second whatever the call rate; a no-op
 * without NVML. The sink thread calls it as it goes; tm_metrics_end takes a last sample. */
void tm_metrics_poll_gpus(tm_metrics *m);
/* Mark the end of the job (end time, wall seconds). Until called, writes use "now". */
void tm_metrics_end(tm_metrics *m);

/* Write metrics.json to path atomically: path.tmp is written and fsynced, renamed over path, and
 * the folder is fsynced. May be called many times (progress snapshots). TM_E_IO, TM_E_NOMEM. */
tm_rc tm_metrics_write_json(const tm_metrics *m, const char *path, tm_err *err);

/* Percentile p (0..100) of the n values in sorted[] (ascending), linear interpolation; NaN when
 * n == 0. Exposed for tests. */
double tm_metrics_percentile(const double *sorted, size_t n, double p);

#endif /* TM_SINK_METRICS_H */
