/* runner/engine/cpu/dsv4.h - the DeepSeek-V4 forward pass of the CPU engine,
 * behind the same tm_engine vtable as the Llama family (tm_engine_cpu_create
 * dispatches here when the model's arch is TM_ARCH_DEEPSEEK_V4). fp32 math over
 * f32/f16/bf16 weights; see docs/deepseek_v4.md for the per-layer math and how
 * the per-sequence state lives in the paged KV blocks. */
#ifndef TM_RUNNER_ENGINE_CPU_DSV4_H
#define TM_RUNNER_ENGINE_CPU_DSV4_H

#include "base/err.h"
#include "runner/engine/engine.h"
#include "runner/model/model.h"

/* Create the DeepSeek-V4 CPU engine for m (borrowed; must outlive the engine).
 * All state is allocated here: per layer and KV block, the raw KV rows, the
 * compressor (and indexer) inputs of every token and the compressed rows.
 * opts->block_size must be a multiple of every compression ratio the model uses
 * (4 and 128 for the released configs). Errors: TM_E_INVAL (bad options,
 * tp_size > 1, block size not a multiple of a ratio), TM_E_NOMEM, TM_E_IO
 * (thread pool). On success *out owns the engine. */
tm_rc tm_dsv4_engine_create(const tm_model *m, const tm_engine_opts *opts, tm_engine **out,
                            tm_err *err);

#endif /* TM_RUNNER_ENGINE_CPU_DSV4_H */
