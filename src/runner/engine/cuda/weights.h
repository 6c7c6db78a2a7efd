/* runner/engine/cuda/weights.h - the weight helpers every CUDA architecture (arch.h: llama.c,
 * dsv4.c) uses at create: host tensors converted and copied to the device, and the random weights
 * of benchmark engines (tm_engine_cuda_create_random). Synchronous copies (the engine's stream is
 * idle at upload); the engine's thread. */
#ifndef TM_RUNNER_ENGINE_CUDA_WEIGHTS_H
#define TM_RUNNER_ENGINE_CUDA_WEIGHTS_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "runner/model/tensor.h"

typedef struct tm_cuda_engine tm_cuda_engine; /* the runtime's engine (engine_cuda_int.h) */

/* Elements converted per host staging pass: the size of the staging buffers below. */
#define TM_CUDA_UPLOAD_CHUNK ((size_t)1 << 22)

/* n bytes from host src to device dst. TM_E_CUDA. */
tm_rc tm_cuda_h2d(void *dst, const void *src, size_t n, tm_err *err);

/* t (any float dtype; quantized: dequantized row by row, tm_tensor_row_f32) as bf16 at dst (n_elem
 * of t), converted on the host through stage (TM_CUDA_UPLOAD_CHUNK bf16) and fb
 * (TM_CUDA_UPLOAD_CHUNK floats; a quantized t's rows must fit). A bf16 t is copied as it is.
 * TM_E_CUDA. */
tm_rc tm_cuda_upload_bf16(uint16_t *dst, const tm_tensor *t, uint16_t *stage, float *fb,
                          tm_err *err);

/* A random bf16 matrix [n_out][n_in] at p on impl's stream: uniform with the standard deviation
 * 1/sqrt(n_in) (tm_k_fill_bf16 of seed). */
tm_rc tm_cuda_fill_bf16(tm_cuda_engine *impl, uint16_t *p, size_t n_out, size_t n_in, uint64_t seed,
                        tm_err *err);

/* A random fp32 vector of n at dst: offset + scale * u, u uniform in [-1, 1) from a host LCG of
 * seed (the same values whatever the chunking). fb: TM_CUDA_UPLOAD_CHUNK floats of staging, or
 * NULL to allocate them. TM_E_NOMEM, TM_E_CUDA. */
tm_rc tm_cuda_fill_f32(float *dst, size_t n, uint64_t seed, float scale, float offset, float *fb,
                       tm_err *err);

#endif /* TM_RUNNER_ENGINE_CUDA_WEIGHTS_H */
