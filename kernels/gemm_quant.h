/* kernels/gemm_quant.h - decode-step projections over quantized weights: y = x @ W^T for a few
 * rows of bf16 x (n_tok <= TM_QUANT_MAX_TOK), fp32 accumulate, with W streamed in its stored
 * format and dequantized in registers. The kernels follow gemm_skinny (kernels/gemm_skinny.h):
 * each warp owns 16 output rows and a range of the inner dimension (split-K), its weight loads
 * are 16-byte cp.async copies (L2 256-byte prefetch hint) into a per-warp ring of `depth` chunks
 * in flight, and the products run on tensor cores (mma.sync m16n8k16, bf16 in, fp32 out).
 *
 * Formats (W_real is what the host reference computes; every dequantization below is exact):
 *   FP8 block:   w [n_out][n_in] e4m3, scale [ceil(n_out/128)][ceil(n_in/128)] as fp32
 *                (`weight_scale_inv`) or e8m0 bytes (2^(e-127)); W_real[o][i] = w[o][i] *
 *                scale[o/128][i/128] (DeepSeek / transformers "fp8" with weight_block_size
 *                [128, 128]).
 *   FP8 block32: w as above, scale [ceil(n_out/32)][n_in/32] e8m0 bytes, n_in a multiple of 32;
 *                W_real[o][i] = w[o][i] * 2^(scale[o/32][i/32] - 127) (DeepSeek-V4.1 dense
 *                linears, ue8m0 scales on 32x32 blocks; TM_K_FP8_BLOCK32_E8M0).
 *   FP8 channel: w as above, scale [n_out] fp32: W_real[o][i] = w[o][i] * scale[o]
 *                (compressed-tensors per-channel; per-tensor = the one value repeated).
 *   MXFP4:       w [n_out][n_in/2] bytes of two e2m1 values (TM_MXFP4_EVEN_LOW says which nibble
 *                holds the even input index), scale [n_out][n_in/32] e8m0;
 *                W_real[o][i] = e2m1(w) * 2^(scale[o][i/32] - 127), e2m1 = {0, 0.5, 1, 1.5, 2, 3,
 *                4, 6}, sign bit 3.
 * e8m0 byte 255 is NaN, byte 0 is 2^-127. e4m3 NaN codes (S.1111.111) are not kept: the kernels
 * read them as +-480 (checkpoints hold none; the test does not feed them).
 *
 * Numerics: e4m3 and e2m1 values are exact in bf16, so the mma inputs are the stored values.
 * FP8: the 16 x 64 weight tile of a chunk goes through the mma unscaled; the block scale
 * multiplies the chunk's fp32 partial (one scale per chunk: a chunk never straddles a 128-block),
 * the channel scale the final fp32 sum. MXFP4 and FP8 block32: the e8m0 scale is a power of two,
 * so it is applied to the bf16 weights before the mma (a 64-input FP8 chunk spans two 32-blocks:
 * each lane's 16 inputs lie in one, and a 16-row tile lies in one 32-row block, so each lane has
 * one scale per chunk). Exact unless the product leaves bf16's range: |W_real| must lie in
 * [2^-133, 3e38] (with no bits below 2^-133), true of any real checkpoint. x enters the mma as its
 * bf16 bits. Accumulation is fp32 (the mma's), summation order fixed: results are deterministic.
 *
 * Output: like gemm_skinny, split s writes its partial to part[s][rows][n_out] (fp32) and the
 * consumer adds the n_split partials in split order (or tm_k_sum_parts); with n_split == 1 part
 * is simply y. The MoE decode GEMM needs no split at DeepSeek-V4's shape (enough warps without
 * one), so its consumer usually reads y directly.
 *
 * sm_121 (GB10) compiles the same dequantize + bf16 mma path: its native FP4/FP8 mma would need
 * quantized activations (a different numeric contract) and a separate kernel; not done here.
 *
 * Host references: tests/gpu/test_gemm_quant.c (dequantize by the definitions above, double
 * accumulation). Launchers never allocate; they run on the given stream. */
#ifndef TM_KERNELS_GEMM_QUANT_H
#define TM_KERNELS_GEMM_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "base/err.h" /* C declarations: C linkage also from .cu files */

/* Most rows of x per launch (two 8-column mma tiles); also the most tokens one expert takes in
 * one pass of the MoE kernel (more are done in further passes over its weights). */
#define TM_QUANT_MAX_TOK 16
/* Largest split-K factor the planners pick. */
#define TM_QUANT_MAX_SPLIT 32
/* MXFP4 nibble order: 1 = the low nibble (bits 0-3) of byte j holds input 2j and the high nibble
 * input 2j + 1 (DeepSeek-V4 / OCP MX packing as read by transformers); 0 = the other way round.
 * The kernels and the test's reference both follow it. */
#define TM_MXFP4_EVEN_LOW 1
/* MoE kernel limits: pairs per launch and experts per layer. */
#define TM_MOE_MAX_PAIRS 1024
#define TM_MOE_MAX_EXPERT 2048

typedef enum tm_k_fp8_scale {
    TM_K_FP8_BLOCK_F32 = 0, /* scale: [ceil(n_out/128)][ceil(n_in/128)] fp32 */
    TM_K_FP8_BLOCK_E8M0,    /* the same shape, e8m0 bytes */
    TM_K_FP8_CHANNEL,       /* scale: [n_out] fp32 */
    TM_K_FP8_BLOCK32_E8M0,  /* scale: [ceil(n_out/32)][n_in/32] e8m0 bytes; n_in % 32 == 0 */
} tm_k_fp8_scale;

/* How the FP8 kernel computes (benchmarks compare them; all agree within fp32 rounding: the mma
 * paths place the inputs in different mma slots, the FMA path sums in another order). */
typedef enum tm_k_quant_variant {
    TM_K_QUANT_DEFAULT = 0, /* TM_K_QUANT_MMA */
    TM_K_QUANT_MMA,         /* mma.sync bf16; e4m3 -> bf16 by integer bit moves */
    TM_K_QUANT_MMA_CVT,     /* mma.sync bf16; e4m3 -> f16 by cvt.rn.f16x2.e4m3x2, then bits */
    TM_K_QUANT_FMA,         /* fp32 FMA on CUDA cores (no tensor cores); FP8 only */
} tm_k_quant_variant;

typedef struct tm_k_gemm_fp8_args {
    float *part;          /* [n_split][n_tok][n_out] fp32 */
    const uint8_t *w;     /* [n_out][n_in] e4m3, 16-byte aligned */
    const void *scale;    /* see scale_kind; fp32 scales 4-byte aligned */
    const uint16_t *x;    /* [n_tok][n_in] bf16, 16-byte aligned */
    uint32_t n_tok;       /* 1..TM_QUANT_MAX_TOK */
    uint32_t n_in;        /* a multiple of 16 (block32: of 32), >= 16 */
    uint32_t n_out;       /* >= 1 */
    uint32_t n_split;     /* from tm_k_gemm_fp8_splits */
    uint32_t k_per_split; /* from tm_k_gemm_fp8_splits: a multiple of 64 */
    tm_k_fp8_scale scale_kind;
    tm_k_quant_variant variant;
    uint32_t depth; /* 0: the default (4); 4 or 8: chunks in flight per warp */
} tm_k_gemm_fp8_args;

typedef struct tm_k_gemm_mxfp4_args {
    float *part;          /* [n_split][n_tok][n_out] fp32 */
    const uint8_t *w;     /* [n_out][n_in / 2] packed e2m1, 16-byte aligned */
    const uint8_t *scale; /* [n_out][n_in / 32] e8m0 */
    const uint16_t *x;    /* [n_tok][n_in] bf16, 16-byte aligned */
    uint32_t n_tok;       /* 1..TM_QUANT_MAX_TOK */
    uint32_t n_in;        /* a multiple of 32, >= 32 */
    uint32_t n_out;       /* >= 1 */
    uint32_t n_split;     /* from tm_k_gemm_mxfp4_splits */
    uint32_t k_per_split; /* from tm_k_gemm_mxfp4_splits: a multiple of 128 */
    uint32_t depth;       /* 0: the default (4); 4 or 8 */
} tm_k_gemm_mxfp4_args;

/* The grouped expert GEMM of an MoE decode step: pair p (token row pair_row[p] routed to expert
 * pair_expert[p]) gets out row p = x[pair_row[p]] @ W[pair_expert[p]]^T. The kernel groups the
 * pairs by expert itself (device data: no host sync, graph friendly): the distinct experts, in
 * increasing id, are its slots, and each slot's weights are streamed once for all of its pairs
 * (in passes of at most 8 or 16 pairs; a slot with more pairs re-reads its weights). A pair whose
 * expert id is out of [0, n_expert) is skipped: its output row is not written. */
typedef struct tm_k_moe_mxfp4_args {
    float *part;                  /* [n_split][n_pair][n_out] fp32, row p for pair p */
    const uint8_t *w;             /* [n_expert][n_out][n_in / 2] packed e2m1, 16-byte aligned */
    const uint8_t *scale;         /* [n_expert][n_out][n_in / 32] e8m0 */
    const uint16_t *x;            /* [*][n_in] bf16 rows, 16-byte aligned */
    const int32_t *pair_expert;   /* [n_pair] device */
    const uint32_t *pair_row;     /* [n_pair] device: the row of x for each pair */
    uint32_t n_pair;              /* 1..TM_MOE_MAX_PAIRS (0 launches nothing) */
    uint32_t n_expert;            /* 1..TM_MOE_MAX_EXPERT */
    uint32_t max_pair_per_expert; /* a bound the caller knows (e.g. tokens in the step): <= 8
                                     picks the one-tile kernel; larger values the two-tile one */
    uint32_t n_in;                /* a multiple of 32 */
    uint32_t n_out;               /* >= 1 */
    uint32_t n_split;             /* from tm_k_gemm_mxfp4_splits */
    uint32_t k_per_split;         /* a multiple of 128 */
    uint32_t depth;               /* 0: the default (4); 4 or 8 */
} tm_k_moe_mxfp4_args;

/* 1 if the shape can run (n_tok in range, n_in a multiple of 16 / 32, n_out >= 1).
 * tm_k_gemm_fp8_fits is the rule of every FP8 kind but TM_K_FP8_BLOCK32_E8M0, which also needs
 * n_in % 32 == 0 (tm_k_gemm_fp8_kind_fits checks the rule of the given kind). */
int tm_k_gemm_fp8_fits(uint32_t n_tok, uint32_t n_in, uint32_t n_out);
int tm_k_gemm_fp8_kind_fits(tm_k_fp8_scale kind, uint32_t n_tok, uint32_t n_in, uint32_t n_out);
int tm_k_gemm_mxfp4_fits(uint32_t n_tok, uint32_t n_in, uint32_t n_out);

/* The split of the inner dimension for n_rows output rows (for the MoE kernel: n_out times the
 * expected number of distinct experts) on a GPU of n_sm multiprocessors: about 12 warps per SM
 * (FP8: where the tiles alone give that many, splits of about 1024 inputs instead), at least 512
 * weight bytes per row per split; tuned on an H200 (gemm_quant.cu says how). Depends only on the
 * arguments. Writes *k_per_split (a multiple of 64 for FP8, 128 for MXFP4); returns n_split (>= 1,
 * no empty split). The FP8 planner serves every scale kind (a split boundary, a multiple of 64, is
 * also one of the 32- and 128-blocks). */
uint32_t tm_k_gemm_fp8_splits(uint32_t n_in, uint32_t n_rows, uint32_t n_sm, uint32_t *k_per_split);
uint32_t tm_k_gemm_mxfp4_splits(uint32_t n_in, uint32_t n_rows, uint32_t n_sm,
                                uint32_t *k_per_split);

/* Each launches one kernel on s; n_tok (n_pair) 0 launches nothing. Shapes and alignment are
 * TM_ASSERTed; a launch error is TM_E_CUDA. */
tm_rc tm_k_gemm_fp8(const tm_k_gemm_fp8_args *a, cudaStream_t s, tm_err *err);
tm_rc tm_k_gemm_mxfp4(const tm_k_gemm_mxfp4_args *a, cudaStream_t s, tm_err *err);
tm_rc tm_k_moe_mxfp4(const tm_k_moe_mxfp4_args *a, cudaStream_t s, tm_err *err);

#ifdef __cplusplus
}
#endif

#endif /* TM_KERNELS_GEMM_QUANT_H */
