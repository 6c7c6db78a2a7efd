/* runner/sched/sched.h - the plan of one engine step, made from the scheduler's state alone (no
 * engine call): which running sequences compute which tokens (decodes first, then prefill chunks,
 * both oldest first, within max_seqs and max_batched_tokens), which of them want a logits row,
 * which KV blocks they take (from the free list, then by evicting cached blocks nobody uses, then
 * by preempting the youngest sequence that is not in the step), which cached blocks they reuse
 * (prefix cache) and which partly filled blocks of other sequences are copied into theirs.
 *
 * Planning changes the state it reads: block tables and n_done of the planned sequences (cached
 * and copied tokens count as done at once), the pool, the prefix cache, and preempted sequences
 * (blocks freed, n_done 0). The caller then carries the plan out: the copies in plan order, then
 * one forward of the entries, then tm_sched_computed for each entry whose sequence still runs.
 * Copies must run in plan order and before the forward: a copy's source block may have been freed
 * and taken by a later entry of the same plan, and its copy reads it before anything writes it.
 *
 * The runner (runner/runner.c) embeds a tm_sched_seq in each of its sequences; tests drive the
 * plan directly (tests/unit/test_sched_plan.c). Scheduler thread only. Does not: call the engine,
 * sample, admit or finish sequences, or own any sequence memory. */
#ifndef TM_RUNNER_SCHED_SCHED_H
#define TM_RUNNER_SCHED_SCHED_H

#include <stdint.h>

#include "base/err.h"
#include "runner/sched/kv_block.h"
#include "runner/sched/prefix_cache.h"
#include "runner/text/tokenizer.h"

/* What the scheduler knows of one sequence. The caller fills it at admission and clears it when
 * the sequence ends (all zero but blocks and keys is an empty slot). */
typedef struct tm_sched_seq {
    int active;           /* the slot holds a running sequence */
    uint64_t admit_order; /* admission counter; the youngest is preempted first */
    tm_ids ids;           /* prompt then generated tokens; the caller owns and grows it */
    uint32_t n_prompt;    /* prompt tokens (a scoring record's continuation included) */
    uint32_t n_done;      /* tokens of ids whose K/V are in the cache */
    uint32_t *blocks;     /* [max blocks per sequence] block table; the caller's storage */
    uint32_t n_block;     /* blocks held: each holds a reference */
    tm_bhash *keys;       /* [max blocks per sequence] prefix-cache keys of full blocks; the
                           * caller's storage */
    uint32_t n_keys;      /* keys[0, n_keys) are computed */
    uint32_t n_offered;   /* full blocks [0, n_offered) were offered to the cache */
    uint32_t n_cached;    /* prompt tokens served from the cache or copied (before any
                           * preemption) */
    uint64_t salt;        /* the record's cache_salt: blocks are shared only within a salt */
    int preempted;        /* was preempted once (later cache hits are recomputes, not savings) */
    int gen;              /* samples tokens (max_tokens > 0, not a scoring record): wants the
                           * row of its last token */
    uint32_t score_next;  /* rows of positions [score_next, score_end) are wanted (scoring, */
    uint32_t score_end;   /* prompt logprobs); the row of position p scores token p + 1 */
    uint32_t chunk;       /* tokens planned in the current step; 0 = not in the step */
    uint32_t n_draft;     /* speculative drafts the caller wrote after ids (ids.ids[len, len +
                           * n_draft), capacity its own; never read here): a decode plans them
                           * with its last token and wants a row for each position */
} tm_sched_seq;

typedef struct tm_sched_cfg {
    uint32_t max_seqs;           /* slots, >= 1 */
    uint32_t max_batched_tokens; /* tokens per step, >= 1 */
    uint32_t block_size;         /* tokens per KV block, >= 1 */
    int can_copy;                /* the engine copies K/V between blocks (tm_engine_ops.kv_copy) */
} tm_sched_cfg;

/* Caller-provided storage; every pointer is borrowed and must outlive the scheduler's use. */
typedef struct tm_sched {
    tm_sched_cfg cfg;
    tm_kv_pool *pool;     /* the KV block pool */
    tm_pcache *pcache;    /* the prefix cache, or NULL when it is off */
    tm_sched_seq **slots; /* [cfg.max_seqs] the sequence of each slot (active or not) */
} tm_sched;

/* One entry of a step: a sequence computes positions [pos, pos + n_tok). */
typedef struct tm_sched_run {
    uint32_t slot;    /* index into tm_sched.slots */
    uint32_t pos;     /* the sequence's n_done when planned */
    uint32_t n_tok;   /* >= 1 */
    uint32_t n_block; /* blocks of its table, enough for pos + n_tok */
    int want_logits;  /* the row of position pos + n_tok - 1 is wanted */
    int decode;       /* counted as decode (pos >= n_prompt: generated tokens, recomputes
                       * after preemption included), else as prefill */
    uint32_t n_draft; /* drafts in the chunk (n_tok = 1 + n_draft, fewer than q's n_draft when
                       * the budget or the pool is short): rows of all n_tok positions wanted */
} tm_sched_run;

/* Positions [0, n_tok) of block src copied into block dst, for the sequence of slot. */
typedef struct tm_sched_copy {
    uint32_t slot;
    uint32_t src, dst;
    uint32_t n_tok;
} tm_sched_copy;

typedef struct tm_sched_plan {
    tm_sched_run *run; /* [max_seqs] the entries: decodes, then prefill chunks */
    uint32_t n_run;
    tm_sched_copy *copy; /* [max_seqs] copies to make before the forward, in order */
    uint32_t n_copy;
    uint32_t *preempt; /* [max_seqs] slots preempted while planning, in order */
    uint32_t n_preempt;
    uint32_t n_tok_prefill; /* tokens of the prefill entries */
    uint32_t n_tok_decode;  /* tokens of the decode entries */
    uint32_t n_tok_copied;  /* tokens of the copies */
} tm_sched_plan;

/* Allocate plan's arrays for max_seqs slots. TM_E_NOMEM. Free with tm_sched_plan_fini. */
tm_rc tm_sched_plan_init(tm_sched_plan *plan, uint32_t max_seqs, tm_err *err);
void tm_sched_plan_fini(tm_sched_plan *plan); /* zeroed or fini'd plan: no-op */

/* Plan the next step into plan (its previous content is overwritten); no sequence may have a
 * chunk on entry. After the call each entry's sequence has chunk = n_tok and every other sequence
 * chunk 0. plan->n_run is 0 when nothing could be scheduled (the caller's error to report).
 * Allocates nothing and cannot fail: blocks come from the pool or are not taken. */
void tm_sched_plan_step(tm_sched *sc, tm_sched_plan *plan);

/* The step ran: q's chunk is computed (n_done += chunk, chunk = 0) and, with a prefix cache, its
 * newly full blocks are offered to it. */
void tm_sched_computed(tm_sched *sc, tm_sched_seq *q);

/* A speculative step ran for q (an entry with drafts): of its chunk, the first n_keep positions
 * (the decode token and the accepted drafts, whose tokens the caller has appended to ids) stay
 * computed; the K/V of the rest is rolled back: n_done += n_keep, chunk = 0, the blocks past
 * what positions [0, n_done + 1) need are released (they were taken for the drafts and never
 * offered to the cache), then full blocks are offered as tm_sched_computed does. */
void tm_sched_computed_keep(tm_sched *sc, tm_sched_seq *q, uint32_t n_keep);

/* Drop q's block references (n_block = 0); the blocks and keys arrays stay. */
void tm_sched_seq_release(tm_sched *sc, tm_sched_seq *q);

#endif /* TM_RUNNER_SCHED_SCHED_H */
