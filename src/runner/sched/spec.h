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

/* The step gate (batch of >= 2 records): a step drafts only when the drafts it would verify are
 * expected to pay for what a step with drafts costs more than one without: with gain G = the sum
 * over the drafting records of their expected accepted drafts (tm_spec_gain), B records running
 * and t_spec / t_plain the measured step times with and without drafts (decode-only steps), when
 * G >= B * (t_spec / t_plain - 1). Until both times are measured the gate is open. A record
 * starts at TM_SPEC_GAIN0; each verification moves its estimate by TM_SPEC_GAIN_ALPHA towards the
 * drafts it got accepted; each step it was gated moves it by TM_SPEC_GAIN_DRIFT back towards
 * TM_SPEC_GAIN0 (so a record is tried again). */
#define TM_SPEC_GAIN0 2.0f
#define TM_SPEC_GAIN_ALPHA 0.3f
#define TM_SPEC_GAIN_DRIFT 0.05f

/* Per record drafting state; zeroed at admission. */
typedef struct tm_spec_state {
    uint32_t miss;  /* verifications in a row that accepted nothing */
    uint32_t pause; /* decode steps left without drafts */
    uint32_t next;  /* the next pause (0 = TM_SPEC_PAUSE0) */
    int has_gain;   /* gain below is set (else TM_SPEC_GAIN0) */
    float gain;     /* estimate of the drafts accepted per verification */
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

/* The record's expected accepted drafts per verification (the step gate's estimate). */
float tm_spec_gain(const tm_spec_state *st);

/* The record had drafts but the step gate dropped them. */
void tm_spec_gated(tm_spec_state *st);

/* The step gate: 1 when a step with drafts of expected gain `gain` among n_running records should
 * run, given the step times t_spec_s / t_plain_s measured so far (<= 0: not measured). */
int tm_spec_gate_open(double gain, uint32_t n_running, double t_spec_s, double t_plain_s);

#endif /* TM_RUNNER_SCHED_SPEC_H */
