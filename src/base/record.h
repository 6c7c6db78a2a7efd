/* base/record.h - the records that flow between stages: tm_job (one input line, parsed and
 * validated by ingest, or an ingest error) and tm_completion (one output or error record, made by
 * the runner, written by the sink). Plain data with owned heap strings; a record has exactly one
 * owner at a time (the queue hand-off transfers it). */
#ifndef TM_BASE_RECORD_H
#define TM_BASE_RECORD_H

#include <stddef.h>
#include <stdint.h>

/* Which tm_sampling fields a record or job set explicitly (others inherit the job defaults). */
enum {
    TM_SP_MAX_TOKENS = 1u << 0,
    TM_SP_TEMPERATURE = 1u << 1,
    TM_SP_TOP_P = 1u << 2,
    TM_SP_TOP_K = 1u << 3,
    TM_SP_MIN_P = 1u << 4,
    TM_SP_SEED = 1u << 5,
    TM_SP_STOP = 1u << 6,
};

typedef struct tm_sampling {
    uint32_t set;        /* TM_SP_* bits of the fields given explicitly */
    int32_t max_tokens;  /* >= 1 */
    float temperature;   /* 0 = greedy */
    float top_p;         /* (0, 1] */
    int32_t top_k;       /* 0 or -1 = off */
    float min_p;         /* [0, 1] */
    uint64_t seed;       /* per-record RNG seed */
    char **stop;         /* n_stop owned UTF-8 strings */
    uint32_t n_stop;
} tm_sampling;

typedef struct tm_message {
    char *role;    /* owned */
    char *content; /* owned */
} tm_message;

/* Machine codes of per-record errors (stable strings in output: see tm_errcode_name). */
typedef enum tm_errcode {
    TM_ERRCODE_NONE = 0,
    TM_ERRCODE_INVALID_JSON,
    TM_ERRCODE_INVALID_UTF8,
    TM_ERRCODE_MISSING_FIELD,
    TM_ERRCODE_WRONG_TYPE,
    TM_ERRCODE_INVALID_VALUE,
    TM_ERRCODE_DUPLICATE_ID,
    TM_ERRCODE_LINE_TOO_LONG,
    TM_ERRCODE_CONTEXT_LENGTH_EXCEEDED,
    TM_ERRCODE_TEMPLATE_ERROR,
    TM_ERRCODE_ENGINE_ERROR,
    TM_ERRCODE_NESTING_TOO_DEEP, /* arrays/objects nested deeper than limits.max_depth */
    TM_ERRCODE_FIELD_TOO_LARGE,  /* a string field or array over limits.max_field_bytes/_items */
    TM_ERRCODE_UNSUPPORTED,      /* a valid request tokenmill cannot serve (n > 1, stream, ...) */
    TM_ERRCODE_COUNT,            /* number of codes (size arrays indexed by code with it) */
} tm_errcode;

const char *tm_errcode_name(tm_errcode code);

/* Which input format a record came in; its output and error records use the same format. */
typedef enum tm_rec_format {
    TM_REC_FORMAT_NATIVE = 0,        /* {"id", "prompt"|"messages", ...}: schemas/output.schema.json */
    TM_REC_FORMAT_OPENAI_CHAT,       /* OpenAI Batch line for /v1/chat/completions */
    TM_REC_FORMAT_OPENAI_COMPLETION, /* OpenAI Batch line for /v1/completions */
    TM_REC_FORMAT_OPENAI,            /* OpenAI Batch line with another/unreadable url (errors only) */
} tm_rec_format;

typedef struct tm_job {
    uint64_t seq_no;       /* 0-based order of the record in the job's input */
    char *file;            /* owned; input path as given (for error records) */
    uint64_t line;         /* 1-based line in file */
    char *id_json;         /* owned JSON text of the id ("\"a1\"" or "42"); NULL if unreadable */
    char *prompt;          /* owned; NULL when messages are used */
    tm_message *messages;  /* owned array of n_messages; NULL when prompt is used */
    uint32_t n_messages;
    tm_sampling sp;        /* record's own fields; runner merges job defaults */
    tm_errcode err_code;   /* != NONE: ingest rejected the line; only file/line/id are valid */
    char *err_msg;         /* owned; set with err_code */
    tm_rec_format format;  /* input format; the answer uses the same one */
    char *model;           /* owned; OpenAI body.model (echoed in the answer), else NULL */
    char *src_meta_json;   /* owned JSON object text about the record's origin (Kafka topic,
                            * partition, offset, key, headers), written to its output; or NULL */
    /* Benchmarks (src/bench.c) only; ingest never sets these. */
    uint32_t *prompt_ids;  /* owned; [n_prompt_ids] token ids used as the prompt as they are (no
                            * BOS added, no tokenizer); wins over prompt/messages when set */
    uint32_t n_prompt_ids;
    int ignore_eos;        /* 1: EOS does not end the record (max_tokens does), as vLLM's bench */
} tm_job;

typedef enum tm_finish {
    TM_FINISH_STOP = 0, /* EOS token or a stop string */
    TM_FINISH_LENGTH,   /* max_tokens or the context limit */
} tm_finish;

typedef struct tm_completion {
    uint64_t seq_no;
    char *file;           /* owned; for error records */
    uint64_t line;
    char *id_json;        /* owned JSON text of the id, or NULL */
    char *text;           /* owned UTF-8 completion text (ok records) */
    tm_finish finish;
    uint32_t n_tok_prompt;
    uint32_t n_tok_gen;
    uint32_t n_tok_cached;
    double ttft_ms;       /* from the record's admission to its first generated token */
    double total_ms;      /* from admission to finish */
    float *itl_ms;        /* owned; [n_itl] inter-token latencies: time between consecutive
                           * generated tokens (ms), n_tok_gen - 1 of them; NULL for errors */
    uint32_t n_itl;
    tm_errcode err_code;  /* != NONE: an error record */
    char *err_msg;        /* owned */
    tm_rec_format format; /* from the job */
    char *model;          /* owned; from the job */
    char *src_meta_json;  /* owned; from the job */
} tm_completion;

/* Free everything a record owns, and the record itself. NULL is a no-op. */
void tm_job_destroy(tm_job *job);
void tm_completion_destroy(tm_completion *c);
/* Move the job's format, model and src_meta_json into c (the job's pointers become NULL). The
 * runner calls it wherever it builds a completion from a job, next to moving file and id_json. */
void tm_completion_take_job_info(tm_completion *c, tm_job *job);
/* Free the strings of a tm_sampling (not the struct). */
void tm_sampling_fini(tm_sampling *sp);

#endif /* TM_BASE_RECORD_H */
