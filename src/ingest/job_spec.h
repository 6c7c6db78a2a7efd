/* ingest/job_spec.h - load and validate a job file (JSON; the contract is schemas/job.schema.json).
 * Every field the loader reads is declared in the schema with its default; unknown keys are errors
 * so typos are caught. Relative paths (model, input.files, output.dir) resolve against the folder
 * of the job file. Input entries (files, folders, glob patterns) are expanded at load time into
 * the list of files the source will read. Errors name the job file and the JSON path of the bad
 * field. The entry "-" means standard input (plain JSONL; at most once). A loaded spec is
 * immutable plain data; any thread may read it. The loader does not check
 * the model folder's contents or create the output folder. */
#ifndef TM_INGEST_JOB_SPEC_H
#define TM_INGEST_JOB_SPEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "base/record.h"
#include "ingest/shard.h"

/* Defaults (also written in schemas/job.schema.json; test_job_spec checks they agree). */
#define TM_JOB_DEFAULT_MAX_SEQS 8
#define TM_JOB_DEFAULT_MAX_BATCHED_TOKENS 16384
#define TM_JOB_DEFAULT_BLOCK_SIZE 128
#define TM_JOB_DEFAULT_MAX_TOKENS 256
/* engine.speculative: num_speculative_tokens at most this many (runner/sched/spec.h's
 * TM_SPEC_MAX_K); prompt_lookup_min/max default to 5 (vLLM's). */
#define TM_JOB_MAX_SPEC_TOKENS 16
#define TM_JOB_DEFAULT_PROMPT_LOOKUP 5

/* engine.threads: at most this many, and at most 4 x the online CPU cores (job_spec.c). */
#define TM_JOB_MAX_THREADS 1024
#define TM_JOB_DEFAULT_LOOKAHEAD 1024
/* engine.engram_cache_mb: 1 GiB of rows (about 4 M rows of 264 bytes) per Engram table; the tables
 * themselves are ~90 GiB each and are read from disk (runner/model/engram_table.h). */
#define TM_JOB_DEFAULT_ENGRAM_CACHE_MB 1024
#define TM_JOB_MAX_ENGRAM_CACHE_MB (1u << 20)
#define TM_JOB_DEFAULT_MAX_LINE_BYTES (16u << 20)
#define TM_JOB_DEFAULT_MAX_DEPTH 64
#define TM_JOB_DEFAULT_MAX_FIELD_BYTES (8u << 20)
#define TM_JOB_DEFAULT_MAX_MESSAGES 4096
#define TM_JOB_MAX_DEPTH_LIMIT 2048 /* jansson's own parser depth limit */
#define TM_JOB_DEFAULT_COMMIT_EVERY_S 2.0
#define TM_JOB_DEFAULT_GPU_MEMORY_UTILIZATION 0.90
#define TM_JOB_DEFAULT_COMMIT_EVERY_RECORDS 1000
#define TM_JOB_DEFAULT_KAFKA_STARTUP_TIMEOUT_S 30.0 /* input/output.kafka.startup_timeout_s */
#define TM_JOB_DEFAULT_KAFKA_MAX_READ_AHEAD 1024    /* input.kafka.max_read_ahead */
/* input.files entry that means standard input (read as plain JSONL, once). */
#define TM_JOB_STDIN "-"

typedef enum tm_backend {
    TM_BACKEND_AUTO = 0, /* cuda when built with CUDA and a GPU is visible, else cpu */
    TM_BACKEND_CPU,
    TM_BACKEND_CUDA,
} tm_backend;

/* engine.quantization: what the loader does to the checkpoint's weights. */
typedef enum tm_job_quant {
    TM_JOB_QUANT_NONE = 0, /* "none": run the checkpoint as stored (quantized or not) */
    TM_JOB_QUANT_FP8,      /* "fp8": quantize a float checkpoint's linears to FP8 e4m3 with one
                            * scale per output channel at load (vLLM's quantization="fp8") */
} tm_job_quant;

typedef struct tm_job_engine {
    tm_backend backend;
    uint32_t max_seqs;             /* sequences in flight per step, >= 1 */
    uint32_t max_batched_tokens;   /* tokens per step (prefill chunks + decodes), >= 1 */
    uint32_t block_size;           /* tokens per KV block, a power of two */
    bool prefix_cache;             /* reuse KV blocks of shared prompt prefixes */
    uint32_t tp;                   /* tensor-parallel ranks, >= 1 */
    uint32_t threads;              /* CPU threads; 0 = all cores */
    uint32_t kv_blocks;            /* KV blocks in the pool; 0 = size from free memory */
    double gpu_memory_utilization; /* kv_blocks 0 on a GPU: fraction of its memory that device
                                    * use may reach, KV pool included, in (0, 1] */
    bool schedule_fcfs;            /* "fcfs": admit in input order; default "prefix" ordering */
    uint32_t lookahead;            /* records read, tokenized and ordered ahead of admission */
    uint32_t max_model_len;        /* engine.max_model_len: caps the context length (prompt +
                                    * completion) below the model's; 0: the model's */
    tm_job_quant quantization;     /* engine.quantization; FP8 needs tp 1 */
    bool kv_cache_fp8;             /* engine.kv_cache_dtype "fp8" (e4m3, scale 1.0); false:
                                    * "auto", the model's dtype */
    uint32_t spec_k;               /* engine.speculative.num_speculative_tokens (method "ngram");
                                    * 0: no speculative decoding */
    uint32_t spec_lookup_min, spec_lookup_max; /* its prompt_lookup_min / max */
    bool spec_mtp;    /* engine.speculative.method "mtp" (DeepSeek-V4's MTP layer; else "ngram") */
    bool spec_dspark; /* engine.speculative.method "dspark" (DeepSeek-V4.1's DSpark stages) */
    double spec_conf_threshold; /* engine.speculative.confidence_threshold (dspark), [0, 1] */
    uint32_t engram_cache_mb;   /* engine.engram_cache_mb: row cache of each Engram table of a
                                 * DeepSeek-V4.1 model, MiB per table and rank (engram_table.h's
                                 * cache_bytes = this << 20); memory sizing, not identity */
} tm_job_engine;

/* output.kafka: completions go to a Kafka topic (sink/kafka_out.h) instead of the LZ4 file. */
typedef struct tm_job_kafka_out {
    char *brokers; /* bootstrap.servers; owned */
    char *topic;   /* owned */
    char **config; /* [2 * n_config] owned key, value pairs of librdkafka settings */
    size_t n_config;
    char *transactional_id;   /* owned; NULL: idempotent producer without transactions */
    double startup_timeout_s; /* the most start-up waits for the brokers (topic metadata) */
    bool by_input_partition;  /* partitioning "input" (else "key") */
    char *error_topic;        /* owned; error records go there (not errors.jsonl); NULL */
} tm_job_kafka_out;

/* input.kafka: records come from Kafka topics as a consumer-group member (ingest/kafka_in.h)
 * instead of input.files. */
typedef struct tm_job_kafka_in {
    char *brokers;   /* bootstrap.servers; owned */
    char **topics;   /* [n_topics] owned topic names */
    size_t n_topics; /* >= 1 */
    char *group;     /* group.id; owned */
    bool follow;     /* mode "follow": run until SIGINT/SIGTERM; false: "drain" */
    char **config;   /* [2 * n_config] owned key, value pairs of librdkafka settings */
    size_t n_config;
    double startup_timeout_s; /* the most start-up waits for the brokers (topic metadata) */
    uint32_t max_read_ahead;  /* records per partition read and not yet durable, at most */
} tm_job_kafka_in;

/* output.compression: how completions are written. */
typedef enum tm_job_compression {
    TM_JOB_COMPRESSION_LZ4 = 0, /* "lz4" (default): completions.jsonl.lz4, concatenated frames */
    TM_JOB_COMPRESSION_NONE,    /* "none": completions.jsonl, plain JSON lines */
} tm_job_compression;

typedef struct tm_job_spec {
    char *path;                /* the job file, as given to tm_job_spec_load */
    char *model;               /* model folder, resolved */
    char **inputs;             /* [n_inputs] input files, resolved and expanded, in read order */
    size_t n_inputs;           /* >= 1 with input.files; 0 with input.kafka */
    tm_job_kafka_in *kafka_in; /* input.kafka, owned; NULL when the input is files */
    char *output_dir;          /* resolved */
    char *prometheus_textfile; /* output.prometheus_textfile, resolved; NULL when not set */
    char *chat_template;   /* owned Jinja text overriding the tokenizer's chat_template; or NULL */
    double commit_every_s; /* output.commit_every_s: commit at least this often, > 0 */
    uint32_t commit_every_records;  /* output.commit_every_records: ... or after this many, >= 1 */
    tm_job_kafka_out *kafka;        /* output.kafka, owned; NULL when not set */
    tm_job_compression compression; /* output.compression */
    char *results_file; /* output.results_file, resolved: every answer line (ok and error) in one
                         * plain JSONL file once the job finishes (vLLM run-batch's -o); or NULL */
    char *job_name; /* output.job_name, owned, or NULL: the job's name in metrics.json, the report
                     * (its series) and the textfile; NULL: the job file's path, or a one-command
                     * job's output folder */
    bool results_input_order; /* output.order "input": results_file's lines in input order (as
                               * run-batch writes them); false ("completion"): as they finished */
    tm_job_engine engine;
    tm_sampling defaults;       /* every field filled; .set has the bits the file gave explicitly */
    uint64_t max_line_bytes;    /* limits.max_line_bytes: longest accepted input line, >= 1 */
    uint32_t max_depth;         /* limits.max_depth: deepest array/object nesting in a line */
    uint64_t max_field_bytes;   /* limits.max_field_bytes: longest string field tokenmill reads */
    uint32_t max_messages;      /* limits.max_messages: most chat messages (and stop strings) */
    bool strict_fields;         /* limits.strict_fields: an unknown record / body key is an error */
    bool fail_on_error_records; /* limits.fail_on_error_records: exit 1 if any record failed */
    tm_job_shard shard; /* input.shard (ingest/shard.h); .active once tm_job_spec_set_shard ran */
    /* The spec as compact JSON with sorted keys and every default filled in; paths as written in
     * the file (not resolved, so moving the job folder keeps it). Equal specs give equal text:
     * hash it to recognise the same job (resume). */
    char *canonical_json;
} tm_job_spec;

/* Read and validate the job file at path. On success *out owns a new spec (free it with
 * tm_job_spec_destroy). Errors: TM_E_IO (cannot read the file), TM_E_PARSE (not JSON), TM_E_INVAL
 * (schema violation or an input entry that names nothing), TM_E_NOMEM; err->msg reads like
 * "job.json: engine.max_seqs: expected an integer >= 1, got \"8\"". */
tm_rc tm_job_spec_load(const char *path, tm_job_spec **out, tm_err *err);
/* The same from JSON text held in memory (the one-command mode of cmd/main.c builds its job this
 * way): name stands for the file in messages and spec->path; relative paths resolve against
 * base_dir ("" or NULL: the current folder). Same errors, TM_E_PARSE naming name. */
tm_rc tm_job_spec_load_text(const char *name, const char *base_dir, const char *json_text,
                            tm_job_spec **out, tm_err *err);
void tm_job_spec_destroy(tm_job_spec *spec); /* NULL is a no-op */

/* A shard's folder inside output.dir: printf format of index and count (long long). */
#define TM_SHARD_DIR_FMT "shard-%lld-of-%lld"
/* Make spec one shard of its job (tokenmill run, before anything reads spec): for a job with
 * input.shard or cli_given (--shard; cli_index / cli_count as tm_shard_parse_arg gives them),
 * resolve the index and count (tm_shard_resolve: the command line, then the job file, then the
 * scheduler's environment through getenv_fn, NULL for getenv(3)), put input.shard (by, count,
 * index, prefix_bytes) into canonical_json (the shard's identity) and make output_dir
 * output.dir/shard-K-of-N. Nothing for an unsharded job. TM_E_INVAL: a job that cannot be sharded
 * (Kafka input, standard input, output.results_file, output.kafka) or what tm_shard_resolve
 * refuses; TM_E_NOMEM. */
tm_rc tm_job_spec_set_shard(tm_job_spec *spec, bool cli_given, int64_t cli_index, int64_t cli_count,
                            const char *(*getenv_fn)(const char *name), tm_err *err);

/* Stable lowercase name of a backend ("auto", "cpu", "cuda"). */
const char *tm_backend_name(tm_backend b);
/* The job-file spelling of a quantization ("none", "fp8"). */
const char *tm_job_quant_name(tm_job_quant q);

#endif /* TM_INGEST_JOB_SPEC_H */
