/* runner/engine/cpu/dsv41_dspark.h - the DeepSeek-V4.1 DSpark drafter on the CPU engine (the
 * reference's Transformer.forward_spec over its DSparkBlock stages; docs/speculative.md
 * "DSpark"). The V4.1 engine (dsv41.c) owns one and calls it through a few hooks: it captures the
 * attention inputs of the target layers during every forward (tm_dsv41_drafter_capture: the mean
 * over the hyper-connection copies), and serves the engine's optional drafter ops
 * (engine.h: draft_info, hidden, draft) from it.
 *
 * State: per stage, the window KV of the main model's positions (act_quant(rope(kv_norm(wkv(
 * main_norm(main_proj(hidden)))))), the rows the draft block attends to) at each token's slot of
 * the KV blocks, so the prefix cache, kv_copy and preemption treat it like the backbone's KV.
 * Numerics as dsv41.c: fp32 activations, double accumulation in a fixed order, the reference's
 * act_quant on the input of every FP8 linear and on the window KV. One thread drives it. */
#ifndef TM_RUNNER_ENGINE_CPU_DSV41_DSPARK_H
#define TM_RUNNER_ENGINE_CPU_DSV41_DSPARK_H

#include <stdint.h>

#include "base/err.h"
#include "runner/engine/engine.h"

typedef struct tm_dsv41_drafter tm_dsv41_drafter;

/* A drafter for m (which has DSpark stages) with the engine's opts (block_size, n_kv_block,
 * max_seqs, max_batched_tokens) and n_thread workers. *out owned by the caller. */
tm_rc tm_dsv41_drafter_create(const tm_model *m, const tm_engine_opts *opts, uint32_t n_thread,
                              tm_dsv41_drafter **out, tm_err *err);
void tm_dsv41_drafter_destroy(tm_dsv41_drafter *d); /* NULL is a no-op */

/* Hooks for the V4.1 forward: begin(T) before the layers of a T-token step; capture(il, T, s)
 * with the streams s [T][hc][dim] that enter layer il (after its Engram), for every layer. */
void tm_dsv41_drafter_begin(tm_dsv41_drafter *d, uint32_t T);
void tm_dsv41_drafter_capture(tm_dsv41_drafter *d, uint32_t il, uint32_t T, const float *s);
/* kv_copy's part: the stages' window rows of slots [0, n_tok) of block src into dst. */
void tm_dsv41_drafter_kv_copy(tm_dsv41_drafter *d, uint32_t src, uint32_t dst, uint32_t n_tok);

/* The drafter ops (engine.h): kind TM_DRAFT_BLOCK, width dim * n_target, n_out block_size. */
void tm_dsv41_drafter_info(const tm_dsv41_drafter *d, tm_engine_draft_info *info);
const float *tm_dsv41_drafter_hidden(const tm_dsv41_drafter *d, uint32_t *n_tok);
/* Rows: every row writes its position's window KV in each stage; a sequence with want_logits
 * then runs the draft block after its last row (start_pos = its position, anchor = its next
 * token): block_size logits rows, row i with the Markov bias of the token picked at row i - 1
 * (the anchor for row 0) added, the picks greedy (argmax, lowest id on ties, over the whole
 * vocabulary) as the reference's forward_head at temperature 0. max_pos: the engine's. */
tm_rc tm_dsv41_drafter_draft(tm_dsv41_drafter *d, const tm_engine_opts *o, uint32_t max_pos,
                             const tm_engine_draft_seq *seqs, uint32_t n_seq, float *logits,
                             tm_err *err);
/* The confidence head's scores of the last draft call's blocks, [n_want][block_size] (the
 * reference computes them and uses them for nothing; neither does tokenmill). */
const float *tm_dsv41_drafter_confidence(const tm_dsv41_drafter *d);

#endif /* TM_RUNNER_ENGINE_CPU_DSV41_DSPARK_H */
