/* runner/engine_cuda.h - the CUDA backend of runner/engine.h for the Llama family (Llama,
 * Qwen2 with q/k/v bias, Mistral; tied or untied lm_head) on one GPU (device 0).
 *
 * Numerics: weights live on the GPU as bf16 (f32/f16 checkpoints are rounded to bf16 once, at
 * create); norm weights, biases and the residual stream are fp32; projections are cuBLAS GEMMs
 * with bf16 inputs and fp32 accumulation (the residual add is the GEMM's beta = 1 epilogue, in
 * fp32); the inputs of each GEMM (normed rows, attention output, SwiGLU output) and the KV cache
 * are bf16; softmax and everything element-wise run in fp32. Logits are fp32.
 *
 * Memory: everything (weights, the paged KV cache of opts->n_kv_block blocks of
 * opts->block_size tokens, activations for opts->max_batched_tokens tokens and opts->max_seqs
 * sequences, pinned host staging) is allocated at create; forward allocates nothing. One CUDA
 * stream; steps that are pure decodes (every sequence n_tok 1 and wanting logits) replay a CUDA
 * graph captured the first time that batch size occurs. One thread drives an engine. A CUDA error
 * during forward marks the engine dead: that call and every later one return TM_E_CUDA.
 *
 * Built with -DTM_CUDA=OFF, every function here exists and returns TM_E_INVAL ("built without
 * CUDA"). */
#ifndef TM_RUNNER_ENGINE_CUDA_H
#define TM_RUNNER_ENGINE_CUDA_H

#include <stdint.h>

#include "base/err.h"
#include "runner/engine.h"
#include "runner/model.h"

/* Create the engine on device 0 and upload m's weights. m is borrowed and must outlive the
 * engine. opts: block_size, n_kv_block, max_seqs, max_batched_tokens > 0; n_threads is ignored;
 * tp_size must be 0 or 1. On success *out owns the engine (tm_engine_destroy frees it).
 * Errors: TM_E_CUDA (no GPU or no usable driver, out of device memory, any CUDA/cuBLAS failure;
 * the message names the call), TM_E_INVAL (unsupported model: head_dim not a multiple of 8 or
 * above 256, wrong tensor shapes; bad opts; or a build without CUDA), TM_E_NOMEM. */
tm_rc tm_engine_cuda_create(const tm_model *m, const tm_engine_opts *opts, tm_engine **out,
                            tm_err *err);

/* Like tm_engine_cuda_create, but only m->cfg is read: the weights are filled on the device with
 * hashed pseudo-random bf16 values from seed (matrices uniform with std 1/sqrt(n_in), norm
 * weights near 1). For benchmarks of large shapes without writing checkpoints. */
tm_rc tm_engine_cuda_create_random(const tm_model *m, const tm_engine_opts *opts, uint64_t seed,
                                   tm_engine **out, tm_err *err);

/* Forward pass with greedy sampling on the device: ids[i] = argmax of the logits row of the i-th
 * sequence with want_logits (lowest id on ties); only the ids cross to the host. Same errors as
 * forward; TM_E_INVAL if eng is not a CUDA engine. */
tm_rc tm_engine_cuda_forward_greedy(tm_engine *eng, const tm_batch *b, uint32_t *ids,
                                    tm_err *err);

/* Turn the decode CUDA graphs on (default) or off (every step launched eagerly). No-op for an
 * engine that is not a CUDA engine. */
void tm_engine_cuda_set_graphs(tm_engine *eng, int on);

#endif /* TM_RUNNER_ENGINE_CUDA_H */
