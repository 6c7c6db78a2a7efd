/* runner/engine/engine.h - the engine vtable: one forward pass over a step plan (prefill chunks and
 * decodes of up to max_seqs sequences) against a paged KV cache, giving logits for the sequences
 * that ask for them. The engine owns the KV memory (n_kv_block blocks of block_size tokens); the
 * runner owns block allocation (which block ids a sequence uses). Backends: "cpu" (the reference,
 * the oracle for every other one) and "cuda" (later). One thread drives an engine. */
#ifndef TM_RUNNER_ENGINE_ENGINE_H
#define TM_RUNNER_ENGINE_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "runner/model/model.h"
#include "runner/sched/sample.h"

/* forward_greedy's id for a row with a NaN or infinite logit (tm_sample_token fails such a row). */
#define TM_ENGINE_ID_NONFINITE UINT32_MAX

/* Sum buf[0..n) element-wise across the tensor-parallel ranks, in place, on every rank (an
 * all-reduce); every rank calls it the same number of times with the same n. */
typedef void (*tm_allreduce_fn)(void *ctx, float *buf, size_t n);

/* What the KV cache stores (engine.kv_cache_dtype). */
typedef enum tm_kv_dtype {
    TM_KV_DTYPE_AUTO = 0, /* the engine's own: fp32 (CPU), bf16 (CUDA) */
    TM_KV_DTYPE_FP8,      /* e4m3fn. Llama family: scale 1.0 (vLLM's default for uncalibrated
                           * fp8 KV), each K/V element rounded to nearest even from fp32 and
                           * saturated to +-448 when written (tm_kv_fp8_round), read back exactly.
                           * DeepSeek-V4 (CPU engine): tiles with power-of-two scales, the rope
                           * slice in bf16 (tm_dsv4_fp8_kv_row, docs/deepseek_v4.md) */
    TM_KV_DTYPE_BF16,     /* CPU engine only: round to bf16 when written, as the CUDA engine's
                           * auto (for comparisons) */
    TM_KV_DTYPE_FP8_HEAD, /* CPU engine only, for the scale study (bench/kv_fp8_quality.c): e4m3
                           * with a dynamic fp32 scale per (token, KV head), absmax / 448 */
} tm_kv_dtype;

typedef struct tm_engine_opts {
    uint32_t n_threads;  /* CPU worker threads; 0 = number of online CPUs */
    uint32_t block_size; /* tokens per KV block */
    uint32_t n_kv_block; /* KV blocks to allocate; 0 (CUDA engine only): size the pool from free
                          * device memory (gpu_mem_util); the engine then records its count in
                          * eng->opts.n_kv_block */
    uint32_t max_seqs;   /* sequences per step */
    uint32_t max_batched_tokens; /* tokens per step */
    uint32_t tp_rank, tp_size;   /* this engine is shard tp_rank of tp_size (0/1: whole model) */
    float gpu_mem_util;          /* with n_kv_block 0: the fraction of the GPU's memory that
                                  * device use may reach, KV pool included, in (0, 1]; 0 = 0.90 */
    tm_kv_dtype kv_dtype;        /* KV cache entries; AUTO (0) by default */
    uint32_t max_rows;           /* logits rows per step (n_logits of tm_batch_seq); 0 = max_seqs */
    tm_allreduce_fn allreduce;   /* required when tp_size > 1 */
    void *allreduce_ctx;         /* borrowed; passed to allreduce */
    const int32_t *token_map;    /* DeepSeek-V4.1 Engram: [n_token_map] the compressed id of every
                                  * token id (runner/model/engram_hash.h tm_engram_token_map_build
                                  * over the model's tokenizer); borrowed, must outlive the engine;
                                  * NULL for other models */
    uint32_t n_token_map;
    uint32_t engram_cache_mb; /* DeepSeek-V4.1: the row cache of each Engram table, MiB (the
                               * tables are read by rows from disk, runner/model/engram_table.h);
                               * 0 = TM_ENGRAM_DEFAULT_CACHE_MB */
} tm_engine_opts;

/* One sequence's part of a step. */
typedef struct tm_batch_seq {
    const uint32_t *tokens;      /* n_tok token ids to process, borrowed for the call */
    uint32_t n_tok;              /* >= 1 */
    uint32_t pos;                /* position of tokens[0] = tokens of this sequence already in KV */
    const uint32_t *block_table; /* block ids covering positions [0, pos + n_tok) */
    uint32_t n_block;
    int want_logits;   /* 1: produce logits for the last token of this chunk */
    uint32_t n_logits; /* with want_logits: rows for the last n_logits tokens of the chunk, in
                        * position order (speculative verification); 0 and 1: the last only */
} tm_batch_seq;

typedef struct tm_batch {
    const tm_batch_seq *seqs; /* n_seq entries, borrowed for the call */
    uint32_t n_seq;
} tm_batch;

/* Logits rows of s in a step: 0 without want_logits, else max(n_logits, 1). */
static inline uint32_t tm_batch_seq_rows(const tm_batch_seq *s) {
    return !s->want_logits ? 0 : s->n_logits > 1 ? s->n_logits : 1;
}

/* Logits rows an engine made with o holds per step: max(max_rows, max_seqs). */
static inline uint32_t tm_engine_max_rows(const tm_engine_opts *o) {
    return o->max_rows > o->max_seqs ? o->max_rows : o->max_seqs;
}

/* What every backend checks before a step (runner/engine/engine.c): at most o->max_seqs sequences;
 * each with tokens, ids below n_vocab, positions [pos, pos + n_tok) below max_pos and covered by
 * its block table, whose used entries are below o->n_kv_block, n_logits <= n_tok; at most
 * o->max_batched_tokens tokens and tm_engine_max_rows(o) logits rows in all. who starts the
 * messages ("cpu forward"). Writes the step's token count and the block-table entries its sequences
 * use. */
tm_rc tm_batch_check(const tm_batch *b, const tm_engine_opts *o, uint64_t max_pos, uint32_t n_vocab,
                     const char *who, uint32_t *n_tok, uint64_t *n_bt, tm_err *err);

/* forward_sample's id for a row whose every id is masked (tm_sample_token fails such a row). */
#define TM_ENGINE_ID_MASKED (UINT32_MAX - 1)
#define TM_ENGINE_MAX_TOP 20 /* logprobs alternatives forward_sample returns per row */

/* One wanted row of forward_sample. */
typedef struct tm_engine_sample_row {
    tm_sample_params p; /* as for tm_sample_token; its arrays borrowed for the call */
    uint64_t step;      /* tm_sample_token's step */
    uint32_t want_lp;   /* 1: the raw row's logprob of the pick and n_top alternatives */
    uint32_t n_top;     /* <= TM_ENGINE_MAX_TOP */
    uint32_t score;     /* 1: a scoring row (prompt logprobs, continuations): not sampled, p and
                         * step ignored, want_lp implied; out.id gets the raw row's argmax (or
                         * TM_ENGINE_ID_NONFINITE), out.lp the logprob of score_id, and the top
                         * n_top: tm_sample_logprobs(row, n_vocab_limit, score_id, n_top) */
    uint32_t score_id;  /* with score: the scored token, < n_vocab_limit */
} tm_engine_sample_row;

typedef struct tm_engine_sample_out {
    uint32_t id; /* tm_sample_token's pick, TM_ENGINE_ID_NONFINITE or TM_ENGINE_ID_MASKED (with
                  * score: the raw argmax) */
    float lp;    /* with want_lp: tm_sample_logprobs' lp_id of id (with score: of score_id) */
    uint32_t top_ids[TM_ENGINE_MAX_TOP]; /* with want_lp: its top_ids/top_lp, n_top of them */
    float top_lp[TM_ENGINE_MAX_TOP];
} tm_engine_sample_out;

typedef struct tm_engine tm_engine;

/* "auto", "fp8", "bf16", "fp8-head" ("?" outside the enum). */
const char *tm_kv_dtype_name(tm_kv_dtype d);

/* What eng's KV cache stores, as metrics.json names it: tm_kv_dtype_name of its kv_dtype, or for
 * AUTO its own (ops->kv_auto: "f32" on the CPU engine, "bf16" on the CUDA engine). */
const char *tm_engine_kv_dtype_name(const tm_engine *eng);

/* x rounded to e4m3fn and back, as an fp8 KV cache stores it: NaN stays NaN, |x| >= 448 (inf
 * included) saturates to +-448, everything else rounds to nearest even (subnormals m * 2^-9).
 * The CUDA engine's KV write (kernels/rope.cu, __NV_SATFINITE) gives the same bytes. */
float tm_kv_fp8_round(float x);

/* ---- drafting for speculative decoding (optional ops; docs/speculative.md) ----
 * A drafter is a small network of the model that guesses the tokens after a position from the
 * target model's hidden states there: DeepSeek-V4's MTP layer (one token per call, chained on its
 * own output rows for more) or a block drafter such as DSpark (several tokens per call, reading
 * the hidden states of several target layers). The runner reads the target's hidden rows after a
 * forward (hidden), and runs the drafter over rows of sequences (draft), whose KV state lives in
 * the same blocks as the target's. */

typedef enum tm_draft_kind {
    TM_DRAFT_NONE = 0, /* the engine (or its model) has no drafter */
    TM_DRAFT_MTP,      /* one token per row, chained on its own output rows (DeepSeek-V4 MTP) */
    TM_DRAFT_BLOCK,    /* n_out tokens per wanted sequence from one call (DSpark-like) */
} tm_draft_kind;

typedef struct tm_engine_draft_info {
    tm_draft_kind kind;
    uint32_t width;       /* floats of one hidden row: a row of hidden(), of tm_engine_draft_seq
                           * .hidden and of draft's hidden_out */
    uint32_t n_src_layer; /* target layers whose states make up a hidden row, concatenated in
                           * layer order (MTP: 1, the final hyper-connection streams) */
    uint32_t n_out;       /* logits rows draft writes per sequence with want_logits (MTP: 1) */
} tm_engine_draft_info;

/* One sequence's rows of a draft call. Row i is position pos + i: the target's hidden row there
 * (what produced the target's logits of that position) and next[i], the token at position
 * pos + i + 1 (the target's pick there, or the prompt's next token). For MTP the row's logits guess
 * the token at pos + i + 2. A drafter with KV state keeps it in the same blocks, so a sequence's
 * rows come in position order from 0 without gaps (prefill rows included) and may be chunked. */
typedef struct tm_engine_draft_seq {
    const float *hidden;         /* [n_tok][width] hidden rows, borrowed for the call */
    const float *block_in;       /* NULL; or (tests) [n_tok][width] the drafter block's input rows
                                  * themselves, skipping its input projections (hidden and next
                                  * then only feed hash routing: next must still be valid) */
    const uint32_t *next;        /* [n_tok] token ids, borrowed for the call */
    uint32_t n_tok;              /* >= 1 */
    uint32_t pos;                /* position of row 0 */
    const uint32_t *block_table; /* block ids covering positions [0, pos + n_tok) */
    uint32_t n_block;
    int want_logits; /* 1: draft logits (n_out rows) for the last row */
} tm_engine_draft_seq;

typedef struct tm_engine_ops {
    const char *name;
    const char *kv_auto; /* what its KV cache stores with kv_dtype AUTO: "f32", "bf16" */
    /* logits: [n_want][n_vocab] fp32: tm_batch_seq_rows rows per sequence, in batch order (a
     * sequence's rows in position order). Every "wanted row" below counts these rows. */
    tm_rc (*forward)(tm_engine *eng, const tm_batch *b, float *logits, tm_err *err);
    /* Optional (NULL: not supported). forward, but each wanted row becomes one id instead of a
     * logits row: ids[i] = the argmax of the i-th wanted row over ids [0, n_vocab_limit) (the
     * lowest id among equal maxima, as tm_sample_token's greedy pick), or TM_ENGINE_ID_NONFINITE
     * when one of those logits is NaN or infinite. 1 <= n_vocab_limit; a limit above the model's
     * n_vocab means n_vocab. ids: [n_want]. Lets a backend keep the logits where they are. */
    tm_rc (*forward_greedy)(tm_engine *eng, const tm_batch *b, uint32_t n_vocab_limit,
                            uint32_t *ids, tm_err *err);
    /* Optional (NULL: not supported). forward, but the i-th wanted row is sampled on the engine
     * as tm_sample_token(row, n_vocab_limit, &rows[i].p, rows[i].step) would (docs/sampling.md
     * says where float rounding may differ), with its logprobs when asked, into out[i]. Returns
     * TM_E_AGAIN, having run nothing, when it cannot take these rows (their histories exceed its
     * staging); the caller then runs forward. */
    tm_rc (*forward_sample)(tm_engine *eng, const tm_batch *b, uint32_t n_vocab_limit,
                            const tm_engine_sample_row *rows, tm_engine_sample_out *out,
                            tm_err *err);
    /* Optional (NULL: not supported). Copy the K/V of token slots [0, n_tok) of block src into
     * block dst, in every layer; the runner uses it to share the computed part of a partly
     * filled block between sequences with a common prefix. Ordered with forward calls. */
    tm_rc (*kv_copy)(tm_engine *eng, uint32_t src, uint32_t dst, uint32_t n_tok, tm_err *err);
    /* Optional, the three together (NULL: no drafter). What the engine's drafter is: kind
     * TM_DRAFT_NONE (and zeros) when its model has none. An engine that runs other engines (the
     * CPU tensor-parallel one) hands itself to its rank 0's ops, which accept it. */
    void (*draft_info)(const tm_engine *eng, tm_engine_draft_info *info);
    /* The target's hidden rows of every token of the last forward, [*n_tok][width], the tokens
     * of the step's sequences stacked in batch order: what tm_engine_draft_seq.hidden takes.
     * Valid until the next forward (draft calls leave it). NULL (and *n_tok 0) before the first
     * step or without a drafter. */
    const float *(*hidden)(const tm_engine *eng, uint32_t *n_tok);
    /* Run the drafter over the rows of n_seq sequences (at most max_seqs, at most
     * max_batched_tokens rows in all). logits: [n_want * n_out][n_vocab], n_out rows per sequence
     * with want_logits, in order. hidden_out: NULL, or [rows][width] the drafter's output row of
     * every row (what a chained MTP step takes as hidden); for a TM_DRAFT_BLOCK drafter instead
     * [n_want * n_out] a confidence logit per logits row (DSpark's confidence head; 0 when the
     * drafter has none). TM_E_INVAL (no drafter, bad rows as a
     * forward's checks), nothing run then. */
    tm_rc (*draft)(tm_engine *eng, const tm_engine_draft_seq *seqs, uint32_t n_seq, float *logits,
                   float *hidden_out, tm_err *err);
    void (*destroy)(tm_engine *eng);
} tm_engine_ops;

struct tm_engine {
    const tm_engine_ops *ops;
    const tm_model *model; /* borrowed; must outlive the engine */
    tm_engine_opts opts;
    void *impl; /* owned by the backend */
};

/* The CPU backend. On success *out owns the engine (KV memory allocated up front). With
 * tp_size > 1 it is one rank's shard (runner/tp/shard.h): its logits rows hold only its
 * vocabulary slice, and opts->allreduce sums partial results across ranks. */
tm_rc tm_engine_cpu_create(const tm_model *m, const tm_engine_opts *opts, tm_engine **out,
                           tm_err *err);
/* The CPU backend split tp_size ways in one process: one shard engine per rank, each on its own
 * thread, an in-process all-reduce (a deterministic sum in rank order) standing in for NCCL, and
 * the logits gathered from the vocabulary slices. Tests the sharding math without GPUs. */
tm_rc tm_engine_cpu_tp_create(const tm_model *m, const tm_engine_opts *opts, tm_engine **out,
                              tm_err *err);

static inline tm_rc tm_engine_forward(tm_engine *eng, const tm_batch *b, float *logits,
                                      tm_err *err) {
    return eng->ops->forward(eng, b, logits, err);
}
/* eng's drafter (tm_engine_ops.draft_info), all zero when it has none. */
static inline tm_engine_draft_info tm_engine_drafter(const tm_engine *eng) {
    tm_engine_draft_info info = {TM_DRAFT_NONE, 0, 0, 0};
    if (eng->ops->draft_info && eng->ops->hidden && eng->ops->draft)
        eng->ops->draft_info(eng, &info);
    return info;
}
static inline void tm_engine_destroy(tm_engine *eng) {
    if (eng)
        eng->ops->destroy(eng);
}

#endif /* TM_RUNNER_ENGINE_ENGINE_H */
