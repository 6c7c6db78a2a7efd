/* kernels/attn_paged.h - causal attention over a paged bf16 KV cache, for any mix of prefill
 * chunks and decodes in one launch. Token t (of the step's stacked tokens) belongs to sequence
 * tok_seq[t], sits at position pos[t] and attends to positions [lo, pos[t]] of its sequence, lo =
 * 0 or, with window > 0, max(0, pos[t] + 1 - window). Position p's K/V row is
 * cache[block_tables[seq_bt[seq] + p / block_size] * block_size + p % block_size]
 * [kv_head*head_dim ...]; query head h reads KV head h / (n_head / n_kv_head) (GQA).
 * softmax(q.k * scale) in fp32 with an online (running max) softmax over tiles of positions,
 * then the weighted sum of V in fp32, written as bf16 (the GQA kernel computes both products on
 * tensor cores, fp32 accumulation, with the probabilities split into two bf16 parts: about 16
 * bits of each).
 *
 * Split-K: with n_split > 1 each (token, head) context is cut into n_split ranges handled by
 * separate blocks, which write partial results to part_acc / part_ml; a second kernel merges
 * them. The grid depends only on (n_tok, n_head, n_split), not on context lengths, so a launch
 * can be captured in a CUDA graph and replayed with other positions.
 *
 * Host reference: tm_cpu_attn (runner/engine/cpu/ops.h), one sequence at a time, on the same
 * bf16 (or e4m3, kv_fp8) values widened to fp32. */
#ifndef TM_KERNELS_ATTN_PAGED_H
#define TM_KERNELS_ATTN_PAGED_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "base/err.h" /* C declarations: C linkage also from .cu files */

/* Positions per tile (and threads per block) of the attention kernel. */
#define TM_ATTN_TILE 128
/* Most splits tm_k_attn_paged_splits picks. */
#define TM_ATTN_MAX_SPLIT 32
/* Largest head_dim supported; head_dim must also be a multiple of 8. */
#define TM_ATTN_MAX_HEAD_DIM 256

typedef struct tm_k_attn_paged_bf16_args {
    uint16_t *out;                /* [n_tok][ld_q] bf16: head h at column h*head_dim */
    const uint16_t *q;            /* [n_tok][ld_q] bf16, rotated, 16-B aligned */
    const uint16_t *k_cache;      /* one layer: [slot][n_kv_head*head_dim] bf16, 16-B aligned */
    const uint16_t *v_cache;      /* same shape */
    const uint32_t *pos;          /* [n_tok] */
    const uint32_t *tok_seq;      /* [n_tok] sequence index of each token */
    const uint32_t *seq_bt;       /* [n_seq] offset of each sequence's table in block_tables */
    const uint32_t *block_tables; /* flat block ids */
    float *part_acc;              /* [n_tok][n_head][n_split][head_dim] if n_split > 1, 16-B
                                   * aligned */
    float *part_ml;               /* [n_tok][n_head][n_split][2] (max, sum) if n_split > 1 */
    uint32_t n_tok, n_head, n_kv_head, head_dim, block_size;
    uint32_t ld_q;    /* row stride of q and out in elements, >= n_head*head_dim,
                       * a multiple of 8 */
    uint32_t window;  /* 0 = full causal attention */
    uint32_t n_split; /* 1 .. TM_ATTN_MAX_SPLIT */
    float scale;      /* 1/sqrt(head_dim) */
    uint32_t kv_fp8;  /* 1: k_cache / v_cache hold e4m3 bytes (cast to uint8_t; the same
                       * [slot][n_kv_head*head_dim] layout, 16-B aligned), widened exactly
                       * (kernels/kv_fp8.cuh); the math is the same as for bf16 */
} tm_k_attn_paged_bf16_args;

/* Floats of part_acc + part_ml needed for (n_tok, n_head, n_split, head_dim). */
size_t tm_k_attn_part_floats(uint32_t n_tok, uint32_t n_head, uint32_t n_split, uint32_t head_dim);

/* The split count for a launch of n_tok tokens on a GPU of n_sm multiprocessors: enough blocks to
 * fill the GPU once, as long as the partials fit in part_floats_cap floats. Depends only on its
 * arguments (a decode graph of T tokens keeps its split). */
uint32_t tm_k_attn_paged_splits(uint32_t n_tok, uint32_t n_head, uint32_t n_kv_head,
                                uint32_t head_dim, uint32_t n_sm, size_t part_floats_cap);

/* Launches one kernel or, with n_split > 1, two (split, then merge) on s; n_tok 0 launches
 * nothing. head_dim 64 or 128 with 1, 2, 4 or 8 query heads per KV head: a block per (token, KV
 * head, split) serves the group's query heads from one read of K/V; other shapes: a block per
 * (token, head, split). */
tm_rc tm_k_attn_paged_bf16(const tm_k_attn_paged_bf16_args *a, cudaStream_t s, tm_err *err);

#ifdef __cplusplus
}
#endif

#endif /* TM_KERNELS_ATTN_PAGED_H */
