/* runner/engine/cuda/arch.h - private to runner/engine/cuda/: the per-architecture seam of the
 * CUDA engine. The runtime (engine_cuda.c: stream, cuBLAS, step metadata, CUDA graphs, the KV
 * pool, the logits head, tensor parallel through tp_driver.c) knows nothing of a model's layers;
 * everything that does is one tm_cuda_arch table and the file behind it. The runtime picks the
 * table by tm_model_cfg.arch (Llama, Qwen2, Mistral: tm_cuda_arch_llama, llama.c); a new
 * architecture is one new file with its table, its kernels, and one line in the runtime's
 * cuda_archs.
 *
 * Contract with the runtime (in call order during create):
 *   check_cfg, check_weights (single GPU, from a checkpoint only), shard_cfg (tp > 1),
 *   kv_dim and prefill_tiles (pure), init (its host state; impl->cfg, opts, tp_rank/tp_size and
 *   kv_dim are set; init may raise kv_dim, which nothing reads before it), skinny_floats,
 *   carve_weights and carve_acts (twice each: with a NULL base to size the arenas, then for real,
 *   the same sequence of carves both times), then upload or
 *   fill_random (the cuBLAS handle and the KV cache exist), forward for every step, fini at
 *   destroy (also after a failed init; its state may be NULL). The runtime's device buffers the
 *   arch reads or writes: the K/V caches ([n_layer][max_pos][kv_dim] bf16 each), logits
 *   ([n_want][cfg.n_vocab] fp32, rows compact, written by forward: with TP the rank's n_vocab,
 *   which on the last rank may be below v_stride, the rows the buffer holds), the step metadata
 *   (tm_cuda_step). Everything
 *   runs on the engine's thread and stream; nothing here allocates after init. */
#ifndef TM_RUNNER_ENGINE_CUDA_ARCH_H
#define TM_RUNNER_ENGINE_CUDA_ARCH_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "runner/model/model.h"

typedef struct tm_cuda_engine tm_cuda_engine; /* the runtime's engine (engine_cuda_int.h) */
typedef struct tm_cuda_carver tm_cuda_carver; /* carves one device arena (engine_cuda_int.h) */
typedef struct tm_cuda_step tm_cuda_step;     /* one packed step (engine_cuda_int.h) */

typedef struct tm_cuda_arch {
    const char *name; /* "llama" */
    int eager;        /* 1: never captured into CUDA graphs (host work inside every step) */
    /* 1: the runtime never captures forward; it passes tm_cuda_step.graph = 1 on the pure decode
     * steps it would have captured (graphs on, eager 0), and forward replays graphs of its own
     * between its host work (dsv41: one graph per stretch between Engram layers). */
    int own_graphs;
    /* The shapes the kernels support (model cfg, before any sharding). TM_E_INVAL with a message
     * starting "cuda engine: ". */
    tm_rc (*check_cfg)(const tm_model_cfg *c, tm_err *err);
    /* The host weights of a checkpoint, before the single-GPU upload (TP checks its shard in
     * upload). TM_E_INVAL naming the tensor. */
    tm_rc (*check_weights)(const tm_model *m, tm_err *err);
    /* Rank's shard of the full cfg c, tp ways: *shard, its first vocabulary row and the rows
     * per rank. TM_E_INVAL when the model does not split tp ways. */
    tm_rc (*shard_cfg)(const tm_model_cfg *c, uint32_t rank, uint32_t tp, tm_model_cfg *shard,
                       uint32_t *vocab0, uint32_t *v_per, tm_err *err);
    /* KV cache row: bf16 elements of one token's K row (and of its V row) in one layer; a
     * token's KV bytes are 2 * n_layer * kv_dim * 2. c is the shard's cfg. */
    uint32_t (*kv_dim)(const tm_model_cfg *c);
    /* 1 when steps other than pure decodes carry prefill attention tiles in their metadata
     * (tm_cuda_step.tiles); the runtime may still turn them off (TM_CUDA_FA=0, too many). */
    int (*prefill_tiles)(const tm_model_cfg *c);
    /* Create impl->arch_state for impl->cfg. TM_E_NOMEM. */
    tm_rc (*init)(tm_cuda_engine *impl, tm_err *err);
    void (*fini)(tm_cuda_engine *impl); /* frees impl->arch_state; NULL state is a no-op */
    /* Floats of split-K partials (impl->sk_part) its skinny projections need at up to n_tok
     * tokens with impl->n_sm multiprocessors. */
    size_t (*skinny_floats)(const tm_cuda_engine *impl, uint32_t n_tok);
    /* Its weights and activations out of the runtime's weight and activation arenas. */
    void (*carve_weights)(tm_cuda_engine *impl, tm_cuda_carver *cv);
    void (*carve_acts)(tm_cuda_engine *impl, tm_cuda_carver *cv);
    /* Weights from m (the full model; with tp > 1 this rank's shard is cut from it) or random
     * ones from seed (benchmarks: only the cfg is known). Ends with the stream idle. */
    tm_rc (*upload)(tm_cuda_engine *impl, const tm_model *m, tm_err *err);
    tm_rc (*fill_random)(tm_cuda_engine *impl, uint64_t seed, tm_err *err);
    /* Launch the whole model for a step whose metadata is on the device: the K/V of its tokens
     * into the cache, the logits of its n_want wanted rows into impl->logits. Enqueues only
     * (no sync); may be captured into a CUDA graph (pure decodes), so it launches the same
     * kernels with the same arguments for the same (n_tok, n_seq). With tp > 1 every rank
     * launches the same collectives in the same order (impl->comm). With own_graphs it is never
     * captured and may do host work (and sync) before its launches; st->graph says whether it
     * may replay its own graphs. */
    tm_rc (*forward)(tm_cuda_engine *impl, const tm_cuda_step *st, tm_err *err);
} tm_cuda_arch;

/* The Llama family: Llama, Qwen2 (q/k/v bias), Mistral (sliding window); llama.c. */
extern const tm_cuda_arch tm_cuda_arch_llama;
/* DeepSeek-V4 (single GPU); dsv4.c. Its init raises impl->kv_dim to the width of its per-token
 * state (laid out inside the K and V rows), before the runtime sizes the KV pool. */
extern const tm_cuda_arch tm_cuda_arch_dsv4;
/* DeepSeek-V4.1 (single GPU); dsv41.c. Engram rows are hashed and read on the host every step,
 * so it captures its own decode graphs (own_graphs: one per stretch between Engram layers, the
 * host reads and copies in between). Its init raises impl->kv_dim like dsv4's. */
extern const tm_cuda_arch tm_cuda_arch_dsv41;

#endif /* TM_RUNNER_ENGINE_CUDA_ARCH_H */
