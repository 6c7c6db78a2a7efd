/* kernels/dequant.h - helpers of the CUDA engine's FP8 linears (runner/engine/cuda/llama.c):
 * dequantize an FP8 weight to bf16 for the cuBLAS prefill path, and add a projection's split-K
 * partials into a column range of a wider fp32 matrix (the q, k, v or gate, up projections that
 * cannot share one fused weight).
 *
 * Dequantization follows kernels/gemm_quant.h's definitions: out[o][i] = bf16(e4m3(w[o][i]) *
 * scale), the scale of a 128 x 128 block (fp32 or e8m0) or of the row (fp32); the product is
 * exact in fp32 and rounded to nearest even once (exact in bf16 for e8m0 scales, whose products
 * keep e4m3's 3 mantissa bits). e4m3 NaN codes read as NaN. Launchers never allocate; they run
 * on the given stream. */
#ifndef TM_KERNELS_DEQUANT_H
#define TM_KERNELS_DEQUANT_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "base/err.h" /* C declarations: C linkage also from .cu files */
#include "kernels/gemm_quant.h"

typedef struct tm_k_dequant_fp8_args {
    uint16_t *out;     /* [n_out][n_in] bf16 */
    const uint8_t *w;  /* [n_out][n_in] e4m3 */
    const void *scale; /* as tm_k_gemm_fp8_args.scale for scale_kind */
    uint32_t n_out, n_in;
    tm_k_fp8_scale scale_kind;
} tm_k_dequant_fp8_args;

/* One kernel on s; an empty matrix launches nothing. */
tm_rc tm_k_dequant_fp8_bf16(const tm_k_dequant_fp8_args *a, cudaStream_t s, tm_err *err);

/* y[t * ld_y + j] = sum over p < n_part (in order) of part[p * stride + t * n_col + j], for
 * t < n_tok, j < n_col (y points at the first column of the range). */
typedef struct tm_k_sum_parts_cols_args {
    float *y;
    uint32_t ld_y;
    const float *part;
    size_t stride;
    uint32_t n_part; /* >= 1 */
    uint32_t n_tok, n_col;
} tm_k_sum_parts_cols_args;

tm_rc tm_k_sum_parts_cols(const tm_k_sum_parts_cols_args *a, cudaStream_t s, tm_err *err);

/* Activations to FP8 for the W8A8 prefill GEMM (runner/engine/cuda/lt_fp8.h): x [n_tok][n_in]
 * bf16 -> out [n_tok][n_in] e4m3 with one fp32 scale per group of `group` inputs of a token:
 * s = amax / 448 over the group (1 for an all-zero group), out = e4m3(x / s), the quotient in
 * fp32 rounded to nearest even (the host's tm_f32_to_e4m3, except that |q| > 464 saturates to 448
 * instead of NaN: a quotient never exceeds 448 by more than rounding), as DeepSeek's
 * act_quant and vLLM's per-token-group quantization do. group 128 (n_in % 128 == 0): scale
 * [n_in / 128][n_tok], tokens fastest (cuBLASLt's VEC128_32F layout); group n_in: scale [n_tok]
 * (per token, OUTER_VEC_32F). Rows n_tok..n_tok_pad-1 (padding for cuBLASLt, which wants the
 * token count a multiple of 4 with these scales) are written as zeros with scale 1; the scale
 * layout then uses n_tok_pad as its token count. */
typedef struct tm_k_act_quant_fp8_args {
    uint8_t *out;      /* [n_tok][n_in] e4m3 */
    float *scale;      /* see above */
    const uint16_t *x; /* [n_tok][n_in] bf16 */
    uint32_t n_tok, n_in;
    uint32_t n_tok_pad; /* >= n_tok; 0 means n_tok */
    uint32_t group;     /* 128 or n_in */
} tm_k_act_quant_fp8_args;

tm_rc tm_k_act_quant_fp8(const tm_k_act_quant_fp8_args *a, cudaStream_t s, tm_err *err);

#ifdef __cplusplus
}
#endif

#endif /* TM_KERNELS_DEQUANT_H */
