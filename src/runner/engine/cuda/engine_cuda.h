/* runner/engine/cuda/engine_cuda.h - the CUDA backend of runner/engine/engine.h for the Llama
 * family (Llama, Qwen2 with q/k/v bias, Mistral; tied or untied lm_head) on one GPU (device 0).
 *
 * Numerics: weights live on the GPU as bf16 (f32/f16 checkpoints are rounded to bf16 once, at
 * create), FP8 checkpoints' linears as their e4m3 bytes and scales (below); norm weights, biases
 * and the residual stream are fp32; projections are cuBLAS GEMMs with bf16 inputs and fp32
 * accumulation (the residual add is the GEMM's beta = 1 epilogue, in fp32); the inputs of each GEMM
 * (normed rows, attention output, SwiGLU output) and the KV cache are bf16; softmax and everything
 * element-wise run in fp32. Logits are fp32.
 *
 * Memory: everything (weights, the paged KV cache of opts->n_kv_block blocks of
 * opts->block_size tokens, activations for opts->max_batched_tokens tokens and opts->max_seqs
 * sequences, pinned host staging) is allocated at create; forward allocates nothing. With
 * opts->n_kv_block 0 the pool is sized from free memory after the rest is allocated: device use
 * stays within opts->gpu_mem_util (default 0.90) of the GPU's total memory, at most what max_seqs
 * full contexts need, at least max_seqs blocks; with TP every rank takes the smallest count of
 * all ranks (an NCCL all-gather during create). The count is in eng->opts.n_kv_block. One CUDA
 * stream; steps that are pure decodes (every sequence n_tok 1 and wanting logits) replay a CUDA
 * graph captured the first time that batch size occurs. One thread drives an engine. A CUDA error
 * during forward marks the engine dead: that call and every later one return TM_E_CUDA.
 *
 * FP8 checkpoints (runner/model/quant.h: 128 x 128 block scales in fp32 or e8m0, per-channel or
 * per-tensor fp32 scales; single GPU only, tensor parallel refuses them): the q/k/v/o/gate/up/down
 * weights stay e4m3 on the device with their scales (a per-tensor scale becomes a per-channel
 * one). Decode-sized steps (at most 16 tokens) run kernels/gemm_quant.h, which dequantizes in
 * registers exactly (the products equal the CPU reference's weights); longer steps dequantize
 * each projection's weight into a bf16 scratch (kernels/dequant.h; one rounding to bf16, exact
 * for e8m0 scales) and run the cuBLAS GEMM. Activations stay bf16 as for bf16 weights: the math
 * is weight-only, static input scales of compressed-tensors checkpoints are not applied (as in
 * the CPU reference). Other block sizes and MXFP4 linears are refused.
 *
 * Tensor parallel (tm_engine_cuda_tp_create): one process per GPU, each holding its rank's shard
 * (the split of runner/tp/shard.h), NCCL all-reduces after the embedding, o_proj and
 * down_proj, a vocab-parallel LM head. Rank 0 is driven like any engine (forward, greedy,
 * kv_copy) and sends each step's plan to the other ranks over the rendezvous connection; the
 * other ranks sit in tm_engine_cuda_tp_serve. A rank that exits, fails or hangs fails the step on
 * every rank with a message naming it (after at most the timeout), and the engines are dead.
 *
 * Inside (private to the directory): the runtime (engine_cuda.c, engine_cuda_int.h), one file per
 * architecture behind the table of arch.h (the Llama family: llama.c), and tensor parallel as a
 * driver around the per-rank engines (tp_driver.c, tp_driver_int.h).
 *
 * Built with -DTM_CUDA=OFF, every function here exists and returns TM_E_INVAL ("built without
 * CUDA"). */
#ifndef TM_RUNNER_ENGINE_CUDA_ENGINE_CUDA_H
#define TM_RUNNER_ENGINE_CUDA_ENGINE_CUDA_H

#include <stdbool.h>
#include <stdint.h>

#include "base/err.h"
#include "runner/engine/engine.h"
#include "runner/model/model.h"
#include "runner/tp/rendezvous.h"

/* How this process takes part in tensor parallel (opts->tp_rank of opts->tp_size > 1). */
typedef struct tm_engine_cuda_tp {
    int device;             /* CUDA device ordinal of this rank (cudaSetDevice) */
    tm_rdzv *rdzv;          /* borrowed, must outlive the engine: rank 0 sends plans, the others
                               receive them (its rank and world must equal tp_rank / tp_size) */
    const uint8_t *nccl_id; /* TM_NCCL_ID_BYTES (runner/tp/tp_nccl.h), the same on every rank;
                               read during create only */
    uint32_t timeout_ms;    /* a step running longer fails (a hung rank); 0: 300 s */
    int host_comm;          /* 1: all-reduce over host shared memory instead of NCCL, so that
                               several ranks may share one device (a correctness check of the
                               sharding, not fast: no CUDA graphs, each collective synchronizes;
                               every rank must say the same); 0: NCCL */
    int random;             /* 1: random weights as tm_engine_cuda_create_random (benchmarks) */
    uint64_t seed;          /* for random */
} tm_engine_cuda_tp;

/* Create the engine on device 0 and upload m's weights. m is borrowed and must outlive the
 * engine. opts: block_size, max_seqs, max_batched_tokens > 0; n_kv_block 0 sizes the pool
 * (above); gpu_mem_util in (0, 1], 0 meaning 0.90; n_threads is ignored;
 * tp_size must be 0 or 1 (else see tm_engine_cuda_tp_create). On success *out owns the engine
 * (tm_engine_destroy frees it). Errors: TM_E_CUDA (no GPU or no usable driver, out of device
 * memory, any CUDA/cuBLAS failure; the message names the call), TM_E_INVAL (unsupported model: an
 * architecture other than the Llama family, head_dim not a multiple of 8 or above 256, wrong tensor
 * shapes; bad opts; or a build without CUDA), TM_E_NOMEM. */
tm_rc tm_engine_cuda_create(const tm_model *m, const tm_engine_opts *opts, tm_engine **out,
                            tm_err *err);

/* Like tm_engine_cuda_create, but only m->cfg is read: the weights are filled on the device with
 * hashed pseudo-random bf16 values from seed (matrices uniform with std 1/sqrt(n_in), norm
 * weights near 1). For benchmarks of large shapes without writing checkpoints. */
tm_rc tm_engine_cuda_create_random(const tm_model *m, const tm_engine_opts *opts, uint64_t seed,
                                   tm_engine **out, tm_err *err);

/* The format of the seven linears of each layer in random weights (benchmarks). */
typedef enum tm_cuda_wfmt {
    TM_CUDA_W_BF16 = 0,       /* as tm_engine_cuda_create_random */
    TM_CUDA_W_FP8_BLOCK,      /* e4m3 with fp32 scales per 128 x 128 block */
    TM_CUDA_W_FP8_BLOCK_E8M0, /* e4m3 with e8m0 (power of two) scales per 128 x 128 block */
    TM_CUDA_W_FP8_CHANNEL,    /* e4m3 with an fp32 scale per output row */
} tm_cuda_wfmt;

/* tm_engine_cuda_create_random with the linears in format fmt: e4m3 values uniform over
 * [-448, 448] (rounded), scales about sqrt(3 / n_in) / 448 with a +-10% hashed spread (a matrix
 * of std 1/sqrt(n_in), as a checkpoint quantized with absmax / 448 would hold); the embedding,
 * LM head and norms as there. FP8 formats need the shapes of a quantized checkpoint (see
 * tm_engine_cuda_create) and a single GPU. */
tm_rc tm_engine_cuda_create_random_fmt(const tm_model *m, const tm_engine_opts *opts, uint64_t seed,
                                       tm_cuda_wfmt fmt, tm_engine **out, tm_err *err);

/* Forward pass with greedy sampling on the device: ids[i] = argmax of the logits row of the i-th
 * sequence with want_logits (lowest id on ties), or TM_ENGINE_ID_NONFINITE when the row holds a
 * NaN or infinite logit; only the ids cross to the host. The engine's forward_greedy op does the
 * same over ids below a limit. Same errors as forward; TM_E_INVAL if eng is not a CUDA engine. */
tm_rc tm_engine_cuda_forward_greedy(tm_engine *eng, const tm_batch *b, uint32_t *ids, tm_err *err);

/* One tensor-parallel rank: like tm_engine_cuda_create, on device tp->device, with this rank's
 * shard of m (m is the full model, borrowed; with tp->random only m->cfg is read). Blocks until
 * every rank has joined the NCCL communicator, so all ranks call it at about the same time (after
 * the rendezvous). eng->model stays m: rank 0's logits rows have the full vocabulary. Errors: as
 * create, TM_E_INVAL when the model does not split tp ways, TM_E_NCCL. */
tm_rc tm_engine_cuda_tp_create(const tm_model *m, const tm_engine_opts *opts,
                               const tm_engine_cuda_tp *tp, tm_engine **out, tm_err *err);

/* Ranks > 0: run the plans rank 0 sends (steps, kv copies) until it says stop (TM_OK). Errors:
 * the step's error (the rank reports it to rank 0 first), TM_E_IO when rank 0 is gone (its
 * connection closed) or another rank failed; the engine is dead afterwards. */
tm_rc tm_engine_cuda_tp_serve(tm_engine *eng, tm_err *err);

/* Number of CUDA devices this process sees; 0 without a GPU, a driver, or CUDA in the build. */
int tm_engine_cuda_n_devices(void);
/* Whether this build has the CUDA engine (TM_CUDA=ON); false in the stub. */
bool tm_engine_cuda_built(void);

/* Turn the decode CUDA graphs on (default) or off (every step launched eagerly). No-op for an
 * engine that is not a CUDA engine. */
void tm_engine_cuda_set_graphs(tm_engine *eng, int on);

#endif /* TM_RUNNER_ENGINE_CUDA_ENGINE_CUDA_H */
