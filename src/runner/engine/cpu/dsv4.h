/* runner/engine/cpu/dsv4.h - the DeepSeek-V4 forward pass of the CPU engine,
 * behind the same tm_engine vtable as the Llama family (tm_engine_cpu_create
 * dispatches here when the model's arch is TM_ARCH_DEEPSEEK_V4). fp32 math over
 * f32/f16/bf16 (and FP8 / MXFP4) weights; see docs/deepseek_v4.md for the
 * per-layer math, how the per-sequence state lives in the paged KV blocks, the
 * tensor-parallel split and the MTP layer. Besides the vtable: the MTP layer as
 * a separate forward (tm_dsv4_mtp_forward) and the final hidden streams it
 * takes (tm_dsv4_hidden), for speculative decoding. */
#ifndef TM_RUNNER_ENGINE_CPU_DSV4_H
#define TM_RUNNER_ENGINE_CPU_DSV4_H

#include "base/err.h"
#include "runner/engine/engine.h"
#include "runner/model/model.h"

/* Create the DeepSeek-V4 CPU engine for m (borrowed; must outlive the engine).
 * All state is allocated here: per layer (the MTP layer included, when the
 * model has one) and KV block, the raw KV rows, the compressor (and indexer)
 * inputs of every token and the compressed rows. opts->block_size must be a
 * multiple of every compression ratio the model uses (4 and 128 for the released
 * configs). opts->kv_dtype: auto (fp32 state) or fp8 (the attention's rows rounded as DeepSeek's
 * fp8 cache stores them; docs/deepseek_v4.md "fp8 KV cache"). With opts->tp_size > 1 the engine is
 * rank opts->tp_rank's shard (runner/tp/shard.h tm_shard_dsv4_split; opts->allreduce sums the
 * partial results) and its logits rows hold its vocabulary slice only, as the Llama family's
 * (tm_engine_cpu_tp_create runs the ranks). Errors: TM_E_INVAL (bad options, another kv_dtype, a
 * shape that does not split tp_size ways, block size not a multiple of a ratio), TM_E_NOMEM,
 * TM_E_IO (thread pool). On success *out owns the engine. */
tm_rc tm_dsv4_engine_create(const tm_model *m, const tm_engine_opts *opts, tm_engine **out,
                            tm_err *err);

/* ---- fp8 KV (docs/deepseek_v4.md "fp8 KV cache") ---- */

/* The rule of the fp8 cache, in place, as the engine applies it when it writes a row with
 * kv_dtype fp8 (the host reference a device writer must match). A tile of values is stored as
 * e4m3 codes and one power-of-two scale 2^k: each value rounded to bf16, k the least integer with
 * max(amax, 1e-4) <= 448 * 2^k (amax over the tile's bf16 values; DeepSeek's ue8m0 act_quant),
 * each value / 2^k rounded to nearest-even e4m3 (tm_kv_fp8_round); the row gets the products back
 * (exact). A tile holding an infinity uses k = 0 (saturating to +-448); NaN stays NaN.
 * tm_dsv4_fp8_kv_row: a rotated KV or compressed row of hd values, its leading hd - rd (non-rope)
 * values in tiles of 64 (the last one shorter when hd - rd is not a multiple of 64), its trailing
 * rd (the rope slice) rounded to bf16. tm_dsv4_fp8_index_row: an indexer compressed row of di
 * values, all in tiles of 128. */
void tm_dsv4_fp8_kv_row(float *row, uint32_t hd, uint32_t rd);
void tm_dsv4_fp8_index_row(float *row, uint32_t di);

/* ---- the paged state, read back (tests; docs/deepseek_v4.md "fp8 KV cache") ---- */

/* The parts of a layer's per-block state (dl_state in dsv4.c). */
typedef enum tm_dsv4_part {
    TM_DSV4_PART_KV,    /* rotated KV rows: block_size rows of head_dim */
    TM_DSV4_PART_CIN,   /* compressor inputs (CSA, HCA): block_size rows of 2 * cw (kv | gate) */
    TM_DSV4_PART_COMP,  /* compressed rows (CSA, HCA): block_size / ratio rows of head_dim */
    TM_DSV4_PART_IIN,   /* indexer inputs (CSA): block_size rows of 4 * di (index_head_dim) */
    TM_DSV4_PART_ICOMP, /* indexer compressed rows (CSA): block_size / ratio rows of di */
} tm_dsv4_part;

/* Block `block`'s rows of part `part` of layer il (il == n_layer: the MTP layer) as the engine
 * stores them (fp32; with kv_dtype fp8 the rounded values): *n_row rows of *width floats,
 * borrowed from eng until its next forward, kv_copy or destroy. NULL (and 0, 0) when eng is not a
 * DeepSeek-V4 CPU engine, il or block is out of range, or the layer has no such part. eng may be
 * a tm_engine_cpu_tp_create engine (rank 0's state; every rank holds the same). */
const float *tm_dsv4_state(const tm_engine *eng, uint32_t il, tm_dsv4_part part, uint32_t block,
                           uint32_t *n_row, uint32_t *width);

/* ---- MTP (multi-token prediction; docs/deepseek_v4.md "MTP") ---- */

/* One sequence's rows of an MTP step: tm_engine_draft_seq (runner/engine/engine.h), hidden
 * being the main model's final hyper-connection streams ([n_tok][hc_mult * n_embd]). The engine's
 * draft ops (draft_info, hidden, draft) are these functions. */
typedef tm_engine_draft_seq tm_dsv4_mtp_seq;

/* 1 when m is a DeepSeek-V4 model with an MTP layer, else 0. */
int tm_dsv4_has_mtp(const tm_model *m);

/* hc_mult * n_embd (a row of tm_dsv4_hidden and of streams_out) when eng is a DeepSeek-V4 CPU
 * engine (tm_engine_cpu_tp_create's included) whose model has an MTP layer; else 0. */
uint32_t tm_dsv4_mtp_width(const tm_engine *eng);

/* The final hyper-connection streams (before the head) of every token of the
 * last tm_engine_forward on eng, [*n_tok][hc_mult * n_embd], the tokens of the
 * step's sequences stacked in batch order; what tm_dsv4_mtp_seq.hidden takes.
 * Valid until the next forward on eng (MTP forwards leave it). eng may be a
 * tm_engine_cpu_tp_create engine (rank 0's streams: every rank holds the same).
 * NULL (and *n_tok 0) when eng is not a DeepSeek-V4 CPU engine or has run no
 * step. */
const float *tm_dsv4_hidden(const tm_engine *eng, uint32_t *n_tok);

/* Run the MTP layer over the rows of n_seq sequences (at most max_seqs, at most
 * max_batched_tokens rows in all): the embedding of next, enorm, e_proj; the
 * hidden streams, hnorm (each stream), h_proj; their sum into every stream as
 * the block's input; the MTP block (attention and MoE with their
 * hyper-connections, its state at each row's position); its own hyper-
 * connection head and norm, then the shared LM head. logits: [n_want][n_vocab],
 * one row per sequence with want_logits, in order. streams_out: NULL, or
 * [rows][hc_mult * n_embd] the block's output streams of every row (the hidden a
 * second draft step would take). eng: a DeepSeek-V4 CPU engine, or one made
 * by tm_engine_cpu_tp_create (the MTP block split like a main layer, each rank
 * writing its vocabulary slice of the logits). Errors: TM_E_INVAL (no MTP
 * layer, another engine, bad rows as a forward's checks), nothing run then. */
tm_rc tm_dsv4_mtp_forward(tm_engine *eng, const tm_dsv4_mtp_seq *seqs, uint32_t n_seq,
                          float *logits, float *streams_out, tm_err *err);

/* ---- hooks of the CPU tensor-parallel engine (runner/engine/cpu/engine_tp.c) ---- */

/* A job for every rank: rank_eng is rank's shard engine, err that rank's. */
typedef tm_rc (*tm_cpu_tp_job)(tm_engine *rank_eng, uint32_t rank, void *ctx, tm_err *err);

/* Rank's shard engine of an engine made by tm_engine_cpu_tp_create with tp_size > 1; NULL for any
 * other engine or rank >= tp_size. Borrowed from eng. */
tm_engine *tm_engine_cpu_tp_rank(tm_engine *eng, uint32_t rank);

/* Run job on every rank's engine at once, each on its rank thread (so the ranks' all-reduces
 * meet), and wait for all; ordered with forward calls. Returns the lowest failing rank's error. A
 * job must fail on every rank alike before its first all-reduce, as forward does. TM_E_INVAL for
 * an engine not made by tm_engine_cpu_tp_create with tp_size > 1. */
tm_rc tm_engine_cpu_tp_run(tm_engine *eng, tm_cpu_tp_job job, void *ctx, tm_err *err);

#endif /* TM_RUNNER_ENGINE_CPU_DSV4_H */
