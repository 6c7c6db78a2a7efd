/* kernels/attn_prefill.h - causal attention for prefill chunks over a paged bf16 KV cache, on
 * tensor cores (mma.sync m16n8k16 bf16 -> fp32, FlashAttention-2 style). Same cache layout,
 * masking and numerics contract as attn_paged.h, for head_dim 64 and 128 only (the engine keeps
 * attn_paged for the other head dims and for decode tokens).
 *
 * The work is a host-built list of query tiles. A tile is up to TM_ATTN_PREFILL_TILE_M
 * consecutive stacked tokens [t0, t0 + n) of one sequence, at consecutive positions
 * [pos0, pos0 + n). Every tile's sequence must already have K/V for all positions < pos0 + n in
 * the cache (the chunk's own rows included: they are written before the attention launch).
 * Row r (position p = pos0 + r) attends to positions [lo, p] of its sequence, lo = 0 or, with
 * window > 0, max(0, p + 1 - window). Position p's K/V row is
 * cache[block_tables[seq_bt[seq] + p / block_size] * block_size + p % block_size]
 * [kv_head*head_dim ...]; query head h reads KV head h / (n_head / n_kv_head) (GQA).
 *
 * Numerics: scores q.k in fp32 (exact bf16 products, fp32 sums), scaled by scale, softmax in
 * fp32 with a running max; the probabilities are rounded to bf16 for the P.V product (as
 * FlashAttention does; this costs up to 2^-9 * max|V| per output), the row sums stay fp32, and
 * the result is written as bf16. Host reference: tm_cpu_attn (runner/engine/cpu/ops.h).
 *
 * The tile helpers are plain host code with no CUDA calls and no state; thread-safe. */
#ifndef TM_KERNELS_ATTN_PREFILL_H
#define TM_KERNELS_ATTN_PREFILL_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "base/err.h" /* C declarations: C linkage also from .cu files */

/* Query rows per tile (one thread block of TILE_M / 16 warps). */
#define TM_ATTN_PREFILL_TILE_M 64

/* One query tile; the device array of these is read by the kernel. */
typedef struct tm_k_attn_prefill_tile {
    uint32_t seq;  /* sequence index into seq_bt */
    uint32_t t0;   /* stacked-token index of row 0 (row of q and out) */
    uint32_t n;    /* rows, 1..TM_ATTN_PREFILL_TILE_M */
    uint32_t pos0; /* position of row 0 */
} tm_k_attn_prefill_tile;

/* One sequence's prefill chunk, for the tile builder: tokens [t0, t0 + n_tok) at positions
 * [pos0, pos0 + n_tok). n_tok 0 = the sequence has no prefill rows in this step. */
typedef struct tm_k_attn_prefill_chunk {
    uint32_t t0, n_tok, pos0;
} tm_k_attn_prefill_chunk;

typedef struct tm_k_attn_prefill_bf16_args {
    uint16_t *out;                /* [n_tok][ld_q] bf16: head h at column h*head_dim; 16-B
                                     aligned. Only the tiles' rows and the heads' columns are
                                     written. */
    const uint16_t *q;            /* [n_tok][ld_q] bf16, rotated; 16-B aligned */
    const uint16_t *k_cache;      /* one layer: [slot][n_kv_head*head_dim] bf16, 16-B aligned */
    const uint16_t *v_cache;      /* same shape */
    const uint32_t *seq_bt;       /* [n_seq] offset of each sequence's table in block_tables */
    const uint32_t *block_tables; /* flat block ids */
    const tm_k_attn_prefill_tile *tiles; /* device [n_tile], from tm_k_attn_prefill_tiles */
    uint32_t n_tile;                     /* <= 65535 */
    uint32_t n_head, n_kv_head;          /* n_head % n_kv_head == 0 */
    uint32_t head_dim;                   /* 64 or 128 */
    uint32_t block_size;                 /* tokens per KV block, >= 1 */
    uint32_t ld_q;                       /* row stride of q and out in elements, >= n_head*head_dim,
                                            a multiple of 8 */
    uint32_t window;                     /* 0 = full causal attention */
    float scale;                         /* usually 1/sqrt(head_dim) */
    uint32_t kv_fp8; /* 1: the caches hold e4m3 bytes (cast to uint8_t, same layout), widened
                      * exactly to bf16 in shared memory (kernels/kv_fp8.cuh) */
} tm_k_attn_prefill_bf16_args;

/* 1 if the kernel handles this head_dim (64, 128), else 0. */
int tm_k_attn_prefill_supported(uint32_t head_dim);

/* Tiles that tm_k_attn_prefill_tiles makes for these chunks: sum of ceil(n_tok / TILE_M). */
uint32_t tm_k_attn_prefill_n_tiles(const tm_k_attn_prefill_chunk *chunks, uint32_t n_seq);

/* An upper bound on the tile count for any step of at most n_tok prefill tokens in at most
 * n_seq sequences, for sizing the tile arrays once at startup. */
uint32_t tm_k_attn_prefill_max_tiles(uint32_t n_tok, uint32_t n_seq);

/* Cut chunk i (= sequence i, i < n_seq) into tiles of TILE_M rows (the last one shorter) and
 * write them to tiles[], which must hold tm_k_attn_prefill_n_tiles(chunks, n_seq) entries.
 * The tiles are ordered by decreasing end position (pos0 + n; ties by sequence, then t0) so the
 * longest ones start first. Returns the number written. Borrows both arrays for the call. */
uint32_t tm_k_attn_prefill_tiles(const tm_k_attn_prefill_chunk *chunks, uint32_t n_seq,
                                 tm_k_attn_prefill_tile *tiles);

/* Launches one kernel on s: grid (n_head, n_tile). n_tile 0 launches nothing. The device arrays
 * are borrowed until the kernel has run. */
tm_rc tm_k_attn_prefill_bf16(const tm_k_attn_prefill_bf16_args *a, cudaStream_t s, tm_err *err);

#ifdef __cplusplus
}
#endif

#endif /* TM_KERNELS_ATTN_PREFILL_H */
