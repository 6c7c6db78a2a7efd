/* runner/engine/cuda/lt_fp8.h - private to runner/engine/cuda/: W8A8 FP8 GEMMs on tensor cores
 * through cuBLASLt, for the prefill-sized steps of FP8 checkpoints (decode-sized steps stream the
 * weights through kernels/gemm_quant.h instead).
 *
 *   dst[t][o] = beta * dst[t][o] + sum_i (xq[t][i] * xs) * (w[o][i] * ws)    (fp32 out)
 *
 * Modes (the scales' layouts are cuBLASLt's, CUDA >= 12.9 on sm_90):
 *   TM_LT_FP8_BLOCK: weight scales fp32 [n_out/128][n_in/128] per 128 x 128 block (the
 *     checkpoint's weight_scale_inv, BLK128x128_32F), activation scales fp32 [n_in/128][T] per
 *     token and 128 inputs (VEC128_32F, kernels/dequant.h tm_k_act_quant_fp8 group 128);
 *     n_out and n_in multiples of 128 and n_in / 128 a multiple of 4.
 *   TM_LT_FP8_ROWWISE: weight scales fp32 [n_out] per row, activation scales fp32 [T] per token
 *     (OUTER_VEC_32F both; tm_k_act_quant_fp8 group n_in); n_in a multiple of 16.
 * Token counts: cuBLASLt wants them a multiple of 4 with these scales, so the GEMM runs on
 * TM_LT_FP8_TOK(n_tok) = n_tok rounded up to 4 tokens: xq rows, x_scale's token count and dst rows
 * up to that count must exist (tm_k_act_quant_fp8 with n_tok_pad writes the padding as zeros;
 * dst's padding rows get garbage).
 * A matmul plan (descriptors + the heuristic's algorithm) is made on the first use of a shape and
 * kept (host memory only; at most TM_LT_FP8_PLANS shapes, the oldest replaced). The workspace is
 * the caller's device buffer. Engine thread only. */
#ifndef TM_RUNNER_ENGINE_CUDA_LT_FP8_H
#define TM_RUNNER_ENGINE_CUDA_LT_FP8_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "base/err.h"

#define TM_LT_FP8_PLANS 64
#define TM_LT_FP8_TOK(n) (((n) + 3u) / 4u * 4u)

typedef enum tm_lt_fp8_mode { TM_LT_FP8_BLOCK = 0, TM_LT_FP8_ROWWISE = 1 } tm_lt_fp8_mode;

typedef struct tm_lt_fp8 tm_lt_fp8; /* owned by its creator: tm_lt_fp8_destroy */

/* A cuBLASLt handle for stream s with workspace ws (device, ws_bytes, not owned). TM_E_CUDA,
 * TM_E_NOMEM. */
tm_rc tm_lt_fp8_create(cudaStream_t s, void *ws, size_t ws_bytes, tm_lt_fp8 **out, tm_err *err);
void tm_lt_fp8_destroy(tm_lt_fp8 *lt); /* NULL is a no-op */

/* 1 when the shape fits the mode's rules above (no device call). */
int tm_lt_fp8_fits(tm_lt_fp8_mode mode, uint32_t n_in, uint32_t n_out);

/* One matmul on the handle's stream (see the file comment). TM_E_CUDA (with cuBLASLt's status)
 * also when the library has no algorithm for the shape: callers try it once at start-up
 * (tm_lt_fp8_probe) and fall back. */
tm_rc tm_lt_fp8_gemm(tm_lt_fp8 *lt, tm_lt_fp8_mode mode, const uint8_t *w, const float *w_scale,
                     const uint8_t *xq, const float *x_scale, uint32_t n_tok, uint32_t n_in,
                     uint32_t n_out, float *dst, float beta, tm_err *err);

/* 1 if cuBLASLt offers an algorithm for mode at (n_tok, n_in, n_out) with beta 0 and 1 (no
 * kernel runs); what fails is in err. */
int tm_lt_fp8_probe(tm_lt_fp8 *lt, tm_lt_fp8_mode mode, uint32_t n_tok, uint32_t n_in,
                    uint32_t n_out, tm_err *err);

#endif /* TM_RUNNER_ENGINE_CUDA_LT_FP8_H */
