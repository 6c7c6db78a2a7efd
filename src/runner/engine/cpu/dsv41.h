/* runner/engine/cpu/dsv41.h - the DeepSeek-V4.1 forward pass of the CPU engine, behind the same
 * tm_engine vtable as the other architectures (docs/deepseek_v41.md: the math as the reference
 * computes it, its activation quantization, how the per-sequence state lives in the paged KV
 * blocks). */
#ifndef TM_RUNNER_ENGINE_CPU_DSV41_H
#define TM_RUNNER_ENGINE_CPU_DSV41_H

#include "base/err.h"
#include "runner/engine/engine.h"
#include "runner/model/model.h"

/* Create the DeepSeek-V4.1 CPU engine for m (borrowed; must outlive the engine). All state is
 * allocated here: per layer and KV block the window KV rows; per kv source layer the compressor
 * inputs, the compressed rows and the index keys; per block the Engram context (compressed token
 * ids). opts->block_size must be a multiple of every compress ratio. A model with Engram layers
 * needs opts->token_map (the compressed token map of the model's tokenizer, engram_hash.h; its
 * largest id + 1 must equal engram_compressed_vocab_size, refused naming both numbers otherwise).
 * Errors: TM_E_INVAL (bad options, kv_dtype other than auto, tp_size > 1, a block size not a
 * multiple of a ratio, a missing or mismatched token map), TM_E_NOMEM, TM_E_IO (thread pool).
 * On success *out owns the engine. */
tm_rc tm_dsv41_engine_create(const tm_model *m, const tm_engine_opts *opts, tm_engine **out,
                             tm_err *err);

/* The DSpark confidence scores of eng's last draft call ([n_want][dspark_block_size], see
 * dsv41_dspark.h), or NULL when eng is not a V4.1 engine with a DSpark drafter. For tests. */
const float *tm_dsv41_engine_confidence(const tm_engine *eng);

#endif /* TM_RUNNER_ENGINE_CPU_DSV41_H */
