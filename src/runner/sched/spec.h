/* runner/sched/spec.h - n-gram (prompt lookup) drafting for speculative decoding, and the rule
 * that stops drafting for a record whose drafts keep failing. A draft is the continuation, in the
 * record's own prompt + output, of the most recent earlier occurrence of the longest suffix of
 * lookup_min..lookup_max tokens (vLLM's prompt_lookup_min/max). The runner verifies the drafts in
 * one engine step and keeps the longest prefix the target model itself picks (runner/runner.c).
 * Pure functions over caller-provided arrays; no allocation; thread-safe. Does not: call the
 * engine, sample, or know about KV blocks. */
#ifndef TM_RUNNER_SCHED_SPEC_H
#define TM_RUNNER_SCHED_SPEC_H

#include <stddef.h>
#include <stdint.h>

#define TM_SPEC_MAX_K 16 /* num_speculative_tokens at most */

/* The adaptive rule: after TM_SPEC_MISS_LIMIT verifications in a row that accepted no draft, a
 * record drafts nothing for a pause of TM_SPEC_PAUSE0 of its decode steps, doubled after each
 * further such streak up to TM_SPEC_PAUSE_MAX; any accepted draft resets streak and pause. */
#define TM_SPEC_MISS_LIMIT 2
#define TM_SPEC_PAUSE0 8
#define TM_SPEC_PAUSE_MAX 256

/* Per record drafting state; zeroed at admission. */
typedef struct tm_spec_state {
    uint32_t miss;  /* verifications in a row that accepted nothing */
    uint32_t pause; /* decode steps left without drafts */
    uint32_t next;  /* the next pause (0 = TM_SPEC_PAUSE0) */
} tm_spec_state;

/* Up to k drafts (k <= TM_SPEC_MAX_K) for what follows toks[0, n) into out: find the longest n-gram
 * of lookup_min..lookup_max tokens (1 <= lookup_min <= lookup_max) that ends toks and also ends
 * earlier in toks, take its most recent earlier occurrence, and copy the tokens that follow it
 * (at most k, never past n). Returns how many (0: no match). O(n * lookup_max). */
uint32_t tm_spec_ngram_propose(const uint32_t *toks, size_t n, uint32_t lookup_min,
                               uint32_t lookup_max, uint32_t k, uint32_t *out);

/* One decode step of a record: 1 when it may draft now, 0 while paused (counting the pause down).
 */
int tm_spec_may_draft(tm_spec_state *st);

/* A verification of n_draft >= 1 drafts of the record accepted n_acc of them. */
void tm_spec_verified(tm_spec_state *st, uint32_t n_draft, uint32_t n_acc);

#endif /* TM_RUNNER_SCHED_SPEC_H */
