/* runner/runner.h - continuous batching: takes tm_job records from an input queue, tokenizes
 * them (chat records through the model's chat format), schedules engine steps of at most
 * max_seqs sequences and max_batched_tokens tokens (decodes first, then chunked prefill), samples,
 * detokenizes, checks stop conditions and pushes one tm_completion per record to the output queue,
 * in completion order. Records that ingest rejected pass straight through as error completions.
 * When KV blocks run out, cached blocks nobody uses are evicted (least recently used first), then
 * the most recently admitted sequence is preempted (its blocks freed, its tokens recomputed later):
 * nothing deadlocks and no record is lost.
 *
 * Prefix cache: every full block (prompt or generated) is offered to the cache under a chained
 * key; a sequence starts from the longest chain of cached blocks of its prompt (always computing at
 * least its last prompt token) and keeps matching at each block boundary, so a block finished by
 * one sequence serves the next. A sequence whose next block another, older running sequence is
 * about to compute waits for it instead of computing it twice. With the PREFIX policy the runner
 * reads up to `lookahead` records ahead, tokenizes them and admits them in token-trie
 * (lexicographic) order, longest max_tokens first within a group sharing a first block; the window
 * is refilled when it is empty. Runs on the calling thread; the queues connect it to the source and
 * sink threads. */
#ifndef TM_RUNNER_RUNNER_H
#define TM_RUNNER_RUNNER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/err.h"
#include "base/queue.h"
#include "base/record.h"
#include "runner/engine/engine.h"
#include "runner/sched/spec.h"
#include "runner/guided/cache.h"
#include "runner/text/chat.h"
#include "runner/text/tokenizer.h"

typedef enum tm_sched_policy {
    TM_SCHED_PREFIX = 0, /* order the look-ahead window so shared prefixes run back to back */
    TM_SCHED_FCFS,       /* admit records in input order */
} tm_sched_policy;

typedef struct tm_runner_cfg {
    uint32_t max_seqs;           /* sequences per step, >= 1 */
    uint32_t max_batched_tokens; /* tokens per step, >= 1 */
    uint32_t block_size;         /* KV block tokens; must equal the engine's */
    uint32_t n_kv_block;         /* blocks the engine holds */
    uint32_t n_ctx;              /* context limit (prompt + generated) */
    tm_sampling defaults;        /* job defaults; borrowed (stop strings must outlive the run) */
    int prefix_cache;            /* reuse cached KV blocks of shared prefixes */
    tm_sched_policy policy;
    uint32_t lookahead;             /* records tokenized and ordered ahead of admission (PREFIX) */
    const char *chat_template;      /* Jinja chat template overriding the tokenizer's, or NULL;
                                     * borrowed (must outlive the run) */
    const tm_chat_tpl *chat_tpl;    /* that template compiled (runner/text/chat.h), or NULL:
                                     * tm_runner_run compiles it once, check_record per record;
                                     * borrowed */
    _Atomic uint64_t *live_tok_gen; /* when not NULL: += every token generated, as it is */
    _Atomic uint64_t *live_tok_prompt; /* ... += prompt tokens computed (sink/progress.h) */
    bool admit_early; /* a stream (stdin, Kafka): admit the records that have arrived instead of
                       * waiting for a full look-ahead window (the schedule then depends on
                       * when records arrive). false: the window is filled to lookahead
                       * records or the input's end before its records are admitted, so the
                       * schedule is a function of the input and the job alone */
    /* A source that can take queued records back (Kafka: a revoked partition's records, which
     * its next owner answers; ingest/source.h tm_source_start): when not NULL, called once per
     * record just before it starts (its first admission, or its error record). false: released:
     * the runner answers nothing for it and pushes a completion with only seq_no and released
     * set. */
    bool (*start)(void *ctx, uint64_t seq_no);
    void *start_ctx;
    bool stop_on_signal; /* at a stop signal (base/stop.h) return at once, dropping the records
                          * in flight (a file job: the next run answers them) */
    /* Speculative decoding, n-gram drafts (runner/sched/spec.h): spec_k drafts at most per
     * record and step (0: off, <= TM_SPEC_MAX_K), from n-grams of spec_lookup_min..max tokens.
     * The engine must hold max_seqs * (spec_k + 1) logits rows (tm_engine_opts.max_rows). */
    uint32_t spec_k, spec_lookup_min, spec_lookup_max;
    bool spec_no_gate; /* tests: draft whenever a record may (no step gate, spec.h) */
    bool spec_mtp;     /* drafts from the DeepSeek-V4 MTP layer (CPU engine; docs/speculative.md
                        * "MTP") instead of n-grams; spec_lookup_* unused then */
    bool spec_dspark;  /* drafts from the DeepSeek-V4.1 DSpark stages (CPU engine, tp 1;
                        * docs/speculative.md "DSpark"); spec_k <= dspark_block_size */
    float spec_conf_threshold; /* DSpark: cut a block's drafts before the first whose confidence
                                * (sigmoid of the confidence head) is below this; 0: none */
} tm_runner_cfg;

/* Counters for metrics, filled by tm_runner_run. */
typedef struct tm_runner_stats {
    uint64_t n_step;
    uint64_t n_step_greedy;  /* steps run with the engine's forward_greedy (only ids came back) */
    uint64_t n_step_sampled; /* steps run with the engine's forward_sample (ids, logprobs) */
    uint64_t n_tok_prefill;  /* prompt tokens computed (recomputes after preemption included) */
    uint64_t n_tok_decode;   /* tokens computed in decode position */
    double prefill_s;        /* step time attributed to prefill tokens (pro rata per step) */
    double decode_s;         /* step time attributed to decode tokens */
    double tokenize_s;       /* time spent tokenizing prompts */
    uint64_t n_preempt;
    uint64_t n_tok_cached; /* prompt tokens served from the prefix cache or copied */
    uint64_t n_tok_copied; /* tokens whose K/V were copied from a partly filled shared block */
    uint64_t n_tok_prompt; /* prompt tokens of admitted records */
    double sum_step_fill;  /* sum over steps of tokens / max_batched_tokens */
    double sum_running;    /* sum over steps of sequences in the step */
    /* Speculative decoding (vLLM's counters): verifications of >= 1 draft, their draft tokens,
     * the drafts accepted, and how many verifications accepted the draft at position i. Rejected
     * drafts are not counted in n_tok_decode. */
    uint64_t n_spec_drafts, n_spec_draft_tok, n_spec_accepted;
    uint64_t n_spec_gated; /* record-steps whose drafts the step gate dropped (spec.h) */
    bool spec_mtp;         /* the drafts were the MTP layer's (cfg spec_mtp), else n-grams */
    bool spec_dspark;      /* the drafts were the DSpark stages' (cfg spec_dspark) */
    uint64_t spec_accepted_pos[TM_SPEC_MAX_K];
    tm_guide_stats guided; /* structured output (issue 26) */
} tm_runner_stats;

/* Run until the input queue is closed and drained and every admitted record has finished. Pops
 * tm_job* from in (takes ownership of each), pushes tm_completion* to out (ownership passes to
 * the consumer). Does not close out. Errors returned are fatal for the job (engine failure,
 * allocation failure, TM_E_INVAL for a bad cfg); per-record problems (TM_E_RECORD inside: a prompt
 * too long, a template or text that fails, non-finite logits) become error completions. */
tm_rc tm_runner_run(const tm_runner_cfg *cfg, tm_engine *eng, const tm_tokenizer *tok, tm_queue *in,
                    tm_queue *out, tm_runner_stats *stats, tm_err *err);

/* The checks the runner makes of a record before admitting it, without an engine (validate):
 * tokenizing (chat records through the chat template), the prompt's length against n_ctx and the
 * KV pool (n_kv_block * block_size; n_kv_block 0: n_ctx alone), scoring continuations, n > 1
 * groups. Reads cfg->n_ctx, n_kv_block, block_size, chat_template and chat_tpl. Borrows job. TM_OK:
 * run would admit it; TM_E_RECORD: run would answer it with an error record, *code and err->msg say
 * which (also for a record ingest rejected); anything else is fatal. */
tm_rc tm_runner_check_record(const tm_runner_cfg *cfg, const tm_tokenizer *tok, tm_job *job,
                             tm_errcode *code, tm_err *err);

#endif /* TM_RUNNER_RUNNER_H */
