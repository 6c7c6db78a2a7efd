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
    TM_SP_PRESENCE_PENALTY = 1u << 7, /* logits processing (issue 22; docs/sampling.md) */
    TM_SP_FREQUENCY_PENALTY = 1u << 8,
    TM_SP_REPETITION_PENALTY = 1u << 9,
    TM_SP_LOGIT_BIAS = 1u << 10,
    TM_SP_MIN_TOKENS = 1u << 11,
    TM_SP_STOP_TOKEN_IDS = 1u << 12,
    TM_SP_IGNORE_EOS = 1u << 13,
};

typedef struct tm_sampling {
    uint32_t set;       /* TM_SP_* bits of the fields given explicitly */
    int32_t max_tokens; /* >= 1 */
    float temperature;  /* 0 = greedy */
    float top_p;        /* (0, 1] */
    int32_t top_k;      /* 0 or -1 = off */
    float min_p;        /* [0, 1] */
    uint64_t seed;      /* per-record RNG seed */
    char **stop;        /* n_stop owned UTF-8 strings */
    uint32_t n_stop;
    float presence_penalty;   /* [-2, 2]; 0 = off */
    float frequency_penalty;  /* [-2, 2]; 0 = off */
    float repetition_penalty; /* (0, 100]; 1 (or 0: not given) = off */
    uint32_t *bias_ids;       /* owned; [n_bias] distinct token ids, ascending */
    float *bias;              /* owned; [n_bias] in [-100, 100] */
    uint32_t n_bias;
    int32_t min_tokens; /* >= 0: EOS and stop_token_ids cannot end the record before */
    uint32_t *stop_ids; /* owned; [n_stop_ids] token ids that end the record (not output) */
    uint32_t n_stop_ids;
    int ignore_eos; /* 1: EOS does not end the record */
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
    TM_REC_FORMAT_NATIVE = 0,  /* {"id", "prompt"|"messages", ...}: schemas/output.schema.json */
    TM_REC_FORMAT_OPENAI_CHAT, /* OpenAI Batch line for /v1/chat/completions */
    TM_REC_FORMAT_OPENAI_COMPLETION, /* OpenAI Batch line for /v1/completions */
    TM_REC_FORMAT_OPENAI, /* OpenAI Batch line with another/unreadable url (errors only) */
} tm_rec_format;

/* Structured output (issue 26): what constrains a record's answer (tm_job.guided_kind); the
 * values are runner/guided/guided.h's tm_guide_kind. */
enum {
    TM_GUIDED_NONE = 0,
    TM_GUIDED_JSON_SCHEMA = 1, /* guided: the schema's JSON text */
    TM_GUIDED_JSON_OBJECT = 2, /* any JSON object; guided unused (NULL) */
    TM_GUIDED_REGEX = 3,       /* guided: the pattern (the whole answer must match) */
    TM_GUIDED_CHOICE = 4,      /* guided: a JSON array of strings (the answer is one of them) */
};

#define TM_MAX_TOP_LOGPROBS 20 /* alternatives per token, as vLLM and OpenAI allow */
#define TM_MAX_N 128           /* samples per record (n) */

typedef struct tm_job {
    uint64_t seq_no;      /* 0-based order of the record in the job's input */
    char *file;           /* owned; input path as given (for error records) */
    uint64_t line;        /* 1-based line in file */
    char *id_json;        /* owned JSON text of the id ("\"a1\"" or "42"); NULL if unreadable */
    char *prompt;         /* owned; NULL when messages are used */
    tm_message *messages; /* owned array of n_messages; NULL when prompt is used */
    uint32_t n_messages;
    tm_sampling sp;       /* record's own fields; runner merges job defaults */
    uint64_t cache_salt;  /* 0: none; else records share prefix-cache blocks only with the
                           * same salt (hash of the record's "cache_salt" string) */
    tm_errcode err_code;  /* != NONE: ingest rejected the line; only file/line/id are valid */
    char *err_msg;        /* owned; set with err_code */
    tm_rec_format format; /* input format; the answer uses the same one */
    char *model;          /* owned; OpenAI body.model (echoed in the answer), else NULL */
    char *src_meta_json;  /* owned JSON object text about the record's origin (Kafka topic,
                           * partition, offset, key, headers), written to its output; or NULL */
    /* Benchmarks (src/cmd/bench.c) only; ingest never sets these. */
    uint32_t *prompt_ids; /* owned; [n_prompt_ids] token ids used as the prompt as they are (no
                           * BOS added, no tokenizer); wins over prompt/messages when set */
    uint32_t n_prompt_ids;
    int ignore_eos; /* 1: EOS does not end the record (max_tokens does), as vLLM's bench */
    /* Evaluation fields (issue 5). A zeroed job asks for none of them. */
    uint32_t n;                   /* samples of this record; 0 or 1 = one */
    int logprobs;                 /* 1: logprob of each generated (or scored) token */
    uint32_t top_logprobs;        /* alternatives listed per token, <= TM_MAX_TOP_LOGPROBS */
    int prompt_logprobs;          /* 1: logprobs of the prompt tokens too */
    uint32_t prompt_top_logprobs; /* alternatives per prompt token, <= TM_MAX_TOP_LOGPROBS */
    char **continuations; /* owned; [n_continuations] texts to score after the prompt (a scoring
                           * record: nothing is generated); NULL otherwise */
    uint32_t n_continuations;
    uint32_t guided_kind; /* TM_GUIDED_*: structured output (issue 26); 0: none */
    char *guided;         /* owned; the constraint's text (see TM_GUIDED_*), or NULL */
} tm_job;

typedef enum tm_finish {
    TM_FINISH_STOP = 0, /* EOS token or a stop string */
    TM_FINISH_LENGTH,   /* max_tokens or the context limit */
} tm_finish;

/* Log-probabilities of a run of tokens (generated, scored or prompt tokens): log-softmax of the
 * model's raw logits (before temperature, top-k/top-p/min-p), over the ids the tokenizer can
 * decode. Entry e of the byte table: e = i * (1 + n_top) is token i, e = i * (1 + n_top) + 1 + j
 * is its j-th alternative; its bytes are text[off[e], off[e + 1]) (a token may end inside a UTF-8
 * character). */
typedef struct tm_logprobs {
    uint32_t n_tok;    /* tokens */
    uint32_t n_top;    /* alternatives per token, best first (lowest id first on ties) */
    uint32_t *ids;     /* [n_tok] */
    float *lp;         /* [n_tok]; NAN where there is none (the first token of a prompt) */
    uint32_t *top_ids; /* [n_tok * n_top] */
    float *top_lp;     /* [n_tok * n_top] */
    char *text;        /* token bytes (see above) */
    uint32_t *off;     /* [n_tok * (1 + n_top) + 1] */
} tm_logprobs;

/* One sample of a record with n > 1. */
typedef struct tm_choice {
    char *text; /* owned UTF-8 */
    tm_finish finish;
    uint32_t n_tok_gen;
    tm_logprobs *logprobs; /* owned; NULL unless the record asked for logprobs */
} tm_choice;

/* The score of one continuation of a scoring record. */
typedef struct tm_score {
    double logprob;        /* sum of the continuation's token logprobs */
    uint32_t n_tok;        /* continuation tokens */
    int is_greedy;         /* 1: greedy decoding would have produced every token */
    tm_logprobs *logprobs; /* owned; per token, NULL unless the record asked for logprobs */
} tm_score;

typedef struct tm_completion {
    uint64_t seq_no;
    char *file; /* owned; for error records */
    uint64_t line;
    char *id_json; /* owned JSON text of the id, or NULL */
    char *text;    /* owned UTF-8 completion text (ok records) */
    tm_finish finish;
    uint32_t n_tok_prompt;
    uint32_t n_tok_gen;
    uint32_t n_tok_cached;
    double ttft_ms;  /* from the record's admission to its first generated token */
    double total_ms; /* from admission to finish */
    float *itl_ms;   /* owned; [n_itl] inter-token latencies: time between consecutive
                      * generated tokens (ms), n_tok_gen - 1 of them; NULL for errors */
    uint32_t n_itl;
    tm_errcode err_code;          /* != NONE: an error record */
    char *err_msg;                /* owned */
    tm_rec_format format;         /* from the job */
    char *model;                  /* owned; from the job */
    char *src_meta_json;          /* owned; from the job */
    tm_logprobs *logprobs;        /* owned; the generated tokens' (one-sample records), or NULL */
    tm_logprobs *prompt_logprobs; /* owned; the prompt tokens' (prompt_logprobs), or NULL */
    tm_choice *choices; /* owned; [n_choices] the samples of an n > 1 record (text, finish,
                         * logprobs above are then unused; n_tok_gen is their sum); or NULL */
    uint32_t n_choices;
    tm_score *scores; /* owned; [n_scores] a scoring record's answer, one per continuation,
                       * in input order; or NULL */
    uint32_t n_scores;
    int spec;                  /* 1: the job drafts speculatively: usage gets the counts below */
    uint32_t n_spec_drafts;    /* verifications of >= 1 draft (all samples of the record) */
    uint32_t n_spec_draft_tok; /* draft tokens verified */
    uint32_t n_spec_accepted;  /* draft tokens accepted */
    int released; /* 1: the source took the record back before it started (a Kafka partition
                   * revoked while the record was queued; tm_runner_cfg.start): nothing but
                   * seq_no is set; no output, no counts, only its seq_no is committed and acked */
} tm_completion;

/* Free everything a record owns, and the record itself. NULL is a no-op. */
void tm_job_destroy(tm_job *job);
void tm_completion_destroy(tm_completion *c);
/* Move the job's format, model and src_meta_json into c (the job's pointers become NULL). The
 * runner calls it wherever it builds a completion from a job, next to moving file and id_json. */
void tm_completion_take_job_info(tm_completion *c, tm_job *job);
/* Free a tm_logprobs and its arrays. NULL is a no-op. */
void tm_logprobs_destroy(tm_logprobs *lp);
/* Free the strings of a tm_sampling (not the struct). */
void tm_sampling_fini(tm_sampling *sp);
/* The settings a record runs with, the one place a record's sampling fields meet the job's
 * defaults: each field from rec where rec set it (its TM_SP_* bit in rec->set), else from
 * defaults; out->set is rec->set. out borrows the lists (stop, bias, stop_ids) of rec or
 * defaults: valid while both are; never tm_sampling_fini it. A new sampling field adds its line
 * here (and its TM_SP_* bit above, its key in ingest/fields_int.h). */
void tm_sampling_resolve(const tm_sampling *defaults, const tm_sampling *rec, tm_sampling *out);

#endif /* TM_BASE_RECORD_H */
