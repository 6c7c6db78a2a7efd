/* kernels/dsv4.h - the DeepSeek-V4 ops of the CUDA engine (runner/engine/cuda/dsv4.c) that are
 * not plain projections: the hyper-connections (mHC with Sinkhorn), the per-head norm + RoPE of
 * q / kv / the indexer query, the compressors (CSA overlapping windows, HCA), the lightning
 * indexer with its top-k, the sliding-window + compressed sparse attention with sinks and the
 * de-rotation of its output, the MoE routing (sqrt-softplus top-k with correction bias, or the
 * tid2eid hash), the bf16 expert GEMV over (token, expert) pairs, the clamped SwiGLU, the
 * expert combine and the final hyper-connection head. The math is docs/deepseek_v4.md's, as the
 * CPU engine (runner/engine/cpu/dsv4.c) computes it; everything here is fp32 (bf16 only where a
 * row feeds a GEMM).
 *
 * Per-sequence state: every stored value lives in the runtime's paged KV cache, as fp32 rows of
 * ld floats per token slot (slot = block * block_size + offset). A layer's state is a set of
 * fields, each a pointer to its column in slot 0's row (the row of slot s at p + s * ld): the
 * rotated KV row (hd), the compressor inputs (kv part cw, gate part cw), the indexer inputs
 * (kv 2di, gate 2di) and the compressed rows. A compressed row w (ratio r, dim floats) is spread
 * over the r slots of its window: element e at slot of position w*r + e / cps, column e % cps,
 * cps = ceil(dim / r). So a block's first n slots hold exactly the compressed rows of the
 * windows closed within them, and a plain copy of slots (kv_copy) copies them.
 *
 * Addressing a sequence position q of token t: block_tables[seq_bt[tok_seq[t]] + q / bs] * bs +
 * q % bs. Every kernel reads its counts from device metadata (positions), so a step launches
 * the same kernels with the same arguments for the same (n_tok, n_seq): CUDA graphs stay valid.
 * Launchers never allocate; n_tok 0 launches nothing. */
#ifndef TM_KERNELS_DSV4_H
#define TM_KERNELS_DSV4_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "base/err.h" /* C declarations: C linkage also from .cu files */

#define TM_DSV4_K_MAX_DIM 1024 /* head_dim, index_head_dim, compressed row width */
#define TM_DSV4_K_MAX_HC 8
#define TM_DSV4_K_HC_SPLIT 8      /* hc pre-mix dots: slices of the streams for small steps */
#define TM_DSV4_K_HC_SPLIT_TOK 16 /* ... in steps of at most this many tokens */
#define TM_DSV4_K_MAX_TOPK 64     /* experts per token */

/* The step's sequence addressing (device arrays of tm_cuda_step). */
typedef struct tm_k_dsv4_seqs {
    const uint32_t *pos, *tok_seq, *seq_bt, *block_tables;
    uint32_t block_size;
} tm_k_dsv4_seqs;

/* streams[t][i][:] = embd[tokens[t]] for i < n_hc (fp32 from bf16). Vocabulary-parallel
 * (n_vocab > 0): embd holds rows [vocab0, vocab0 + n_vocab) only; a token outside them gives
 * zeros (another rank holds its row; the ranks' streams are then summed). */
typedef struct tm_k_dsv4_embed_args {
    float *streams;         /* [T][n_hc * D] */
    const uint16_t *embd;   /* [V][D] bf16, or [n_vocab][D] */
    const uint32_t *tokens; /* [T] */
    uint32_t n_tok, n_hc, D;
    uint32_t vocab0, n_vocab; /* the slice; n_vocab 0: the whole table (single GPU) */
    uint32_t sliced;          /* 1: vocab0 / n_vocab apply (n_vocab may then be 0: no rows) */
} tm_k_dsv4_embed_args;
tm_rc tm_k_dsv4_embed(const tm_k_dsv4_embed_args *a, cudaStream_t s, tm_err *err);

/* Hyper-connection pre-mix: m = fn . rms(flatten(s)); pre, post, Sinkhorn comb; x = sum pre_i
 * s_i; h = bf16(norm_w * rms(x)). */
typedef struct tm_k_dsv4_hc_pre_args {
    uint16_t *h;          /* [T][D] bf16 */
    float *post;          /* [T][N] */
    float *comb;          /* [T][N][N] */
    const float *streams; /* [T][N * D] */
    const float *fn;      /* [(2+N)N][N * D] fp32 */
    const float *base;    /* [(2+N)N] */
    const float *scale;   /* [3] */
    const float *norm_w;  /* [D] */
    float *mixes;         /* [T][(2+N)N] scratch */
    /* NULL, or scratch for steps of at most TM_DSV4_K_HC_SPLIT_TOK tokens: [T][(2+N)N][split]
     * and [T][split] floats (split = TM_DSV4_K_HC_SPLIT) */
    float *dot_part, *ss_part;
    uint32_t n_tok, N, D, iters;
    uint32_t n_split; /* set by the launcher */
    float eps, hc_eps;
} tm_k_dsv4_hc_pre_args;
tm_rc tm_k_dsv4_hc_pre(const tm_k_dsv4_hc_pre_args *a, cudaStream_t s, tm_err *err);

/* streams[t][k] = post[t][k] * y[t] + sum_j comb[t][j][k] * streams[t][j]. y = sum of n_part
 * partials y + p * y_stride ([T][D] each). */
typedef struct tm_k_dsv4_hc_post_args {
    float *streams;
    const float *y;
    size_t y_stride;
    uint32_t n_part;
    const float *post, *comb;
    uint32_t n_tok, N, D;
} tm_k_dsv4_hc_post_args;
tm_rc tm_k_dsv4_hc_post(const tm_k_dsv4_hc_post_args *a, cudaStream_t s, tm_err *err);

/* Per (token, head): v = x[t * ld_x + h * dim ..] (dim floats); norm 1: unweighted RMS, 2:
 * weighted by w; then interleaved RoPE on the trailing rd channels at pos[t] (cos, sin of pos *
 * inv_freq[i], times attn_factor). Out: out[t * ld_out + h * dim] (fp32), or with state the
 * row of slot[t] in state (stride ld_state). */
typedef struct tm_k_dsv4_norm_rope_args {
    float *out;
    uint32_t ld_out;
    float *state; /* or NULL */
    uint32_t ld_state;
    const uint32_t *slot;
    const float *x;
    uint32_t ld_x;
    uint32_t n_part; /* 0 or 1: x; more: x summed over n_part partials x_stride apart */
    size_t x_stride;
    const float *w; /* norm 2 */
    const uint32_t *pos;
    const float *inv_freq; /* [rd / 2] */
    float attn_factor;
    uint32_t n_tok, n_head, dim, rd, norm;
    float eps;
} tm_k_dsv4_norm_rope_args;
tm_rc tm_k_dsv4_norm_rope(const tm_k_dsv4_norm_rope_args *a, cudaStream_t s, tm_err *err);

/* dst row of slot[t] (stride ld) [0, n) = src[t * ld_src + c0 ..]; with dst2, also dst2's row
 * [0, n) = src[t * ld_src + c0_2 ..] (one launch). */
typedef struct tm_k_dsv4_store_args {
    float *dst;
    uint32_t ld;
    const uint32_t *slot;
    const float *src;
    uint32_t ld_src, c0, n, n_tok;
    float *dst2; /* or NULL */
    uint32_t c0_2;
} tm_k_dsv4_store_args;
tm_rc tm_k_dsv4_store(const tm_k_dsv4_store_args *a, cudaStream_t s, tm_err *err);

/* For each token t whose position closes a window ((pos+1) % r == 0), compressed entry w =
 * (pos+1)/r - 1: softmax over the window's slots per channel of gate + bias, the weighted sum
 * of kv, RMSNorm (norm), RoPE at w * r, into the comp field (see the file comment). overlap
 * (CSA, indexer): cw = 2 dim, slots are window w-1's first halves (absent for w 0) and window
 * w's second halves; otherwise cw = dim, window w's tokens. */
typedef struct tm_k_dsv4_compress_args {
    float *comp;          /* field */
    const float *in_kv;   /* field, cw wide */
    const float *in_gate; /* field, cw wide */
    uint32_t ld;
    const float *bias; /* [r][cw] */
    const float *norm; /* [dim] */
    const float *inv_freq;
    float attn_factor;
    tm_k_dsv4_seqs sq;
    uint32_t n_tok, r, dim, cw, rd, overlap;
    float eps;
} tm_k_dsv4_compress_args;
tm_rc tm_k_dsv4_compress(const tm_k_dsv4_compress_args *a, cudaStream_t s, tm_err *err);

/* Lightning indexer: for token t, score(w) = sum_h relu(iq_h . K_w) / sqrt(di) * iw_h /
 * sqrt(n_head) over the closed entries w < (pos+1)/4; sel[t] = the top min(topk, n) (ties: lower
 * index), n_sel[t] their count; all entries when n <= topk. n is capped at max_entries. */
typedef struct tm_k_dsv4_index_args {
    uint32_t *sel;   /* [T][topk] */
    uint32_t *n_sel; /* [T] */
    float *score;    /* [T][max_entries] scratch */
    uint32_t max_entries;
    const float *icomp; /* field */
    uint32_t ld;
    const float *iq; /* [T][n_head * di] */
    const float *iw; /* [T][n_head] */
    tm_k_dsv4_seqs sq;
    uint32_t n_tok, n_head, di, r, topk;
} tm_k_dsv4_index_args;
tm_rc tm_k_dsv4_index(const tm_k_dsv4_index_args *a, cudaStream_t s, tm_err *err);

/* Attention of token t, head h: keys = the KV rows of positions (pos-window, pos] and the
 * compressed rows (kind 1 CSA: sel[t][0, n_sel[t]); kind 2 HCA: every w < (pos+1)/r); logits
 * q . k / sqrt(hd); a sink per head in the softmax denominator; out = sum p_j k_j with its
 * rope slice rotated back at pos; bf16 into out[t][h * hd]. */
typedef struct tm_k_dsv4_attn_args {
    uint16_t *out;     /* [T][H * hd] bf16 */
    const float *q;    /* [T][H * hd] */
    const float *kv;   /* field */
    const float *comp; /* field (kind != 0) */
    uint32_t ld;
    const float *sinks; /* [H] */
    const uint32_t *sel, *n_sel;
    uint32_t topk;
    const float *inv_freq;
    float attn_factor;
    tm_k_dsv4_seqs sq;
    uint32_t n_tok, H, hd, rd, window, r, kind;
} tm_k_dsv4_attn_args;
tm_rc tm_k_dsv4_attn(const tm_k_dsv4_attn_args *a, cudaStream_t s, tm_err *err);

/* Routing of token t: scores from logits (0 sqrt-softplus, 1 sigmoid, 2 softmax); experts from
 * tid2eid[tokens[t]] (hash) or the top k of score + bias (ties: lower id); weights score /
 * (sum + 1e-20) * scale. pair p = t * k + j. */
typedef struct tm_k_dsv4_route_args {
    int32_t *pair_e;
    uint32_t *pair_row;
    float *pair_w;
    const float *logits;    /* [T][E] */
    const float *bias;      /* [E] or NULL (hash) */
    const int32_t *tid2eid; /* [V][k] or NULL */
    const uint32_t *tokens;
    uint32_t n_tok, E, k, scoring;
    float scale;
} tm_k_dsv4_route_args;
tm_rc tm_k_dsv4_route(const tm_k_dsv4_route_args *a, cudaStream_t s, tm_err *err);

/* out[p][o] = sum_i W[pair_e[p]][o][i] * x[pair_row[p]][i] (bf16 weights and x, fp32 sum). */
typedef struct tm_k_dsv4_moe_bf16_args {
    float *out;        /* [n_pair][n_out] */
    const uint16_t *w; /* [E][n_out][n_in] */
    const uint16_t *x; /* [*][n_in] */
    const int32_t *pair_e;
    const uint32_t *pair_row;
    uint32_t n_pair, n_out, n_in;
} tm_k_dsv4_moe_bf16_args;
tm_rc tm_k_dsv4_moe_bf16(const tm_k_dsv4_moe_bf16_args *a, cudaStream_t s, tm_err *err);

/* act[r][i] = bf16(silu(min(g, lim)) * clamp(u, -lim, lim)), g = gu[r][i], u = gu[r][n + i]
 * (gu the sum of n_part partials gu + p * stride, rows of 2n). */
typedef struct tm_k_dsv4_swiglu_args {
    uint16_t *act; /* [n_row][n] */
    const float *gu;
    size_t stride;
    uint32_t n_part, n_row, n;
    float limit;
} tm_k_dsv4_swiglu_args;
tm_rc tm_k_dsv4_swiglu(const tm_k_dsv4_swiglu_args *a, cudaStream_t s, tm_err *err);

/* y[t] = sum over t's k pairs in increasing expert id of pair_w * dn[pair] (dn: n_part partials
 * of [n_pair][D]), then + sh[t] (shared expert, [T][D]). */
typedef struct tm_k_dsv4_combine_args {
    float *y;
    const float *dn;
    size_t dn_stride;
    uint32_t dn_part;
    const float *sh; /* sh_part partials sh_stride apart */
    size_t sh_stride;
    uint32_t sh_part;
    const int32_t *pair_e;
    const float *pair_w;
    uint32_t n_tok, k, D;
} tm_k_dsv4_combine_args;
tm_rc tm_k_dsv4_combine(const tm_k_dsv4_combine_args *a, cudaStream_t s, tm_err *err);

/* The final hyper-connection head of wanted row r (token rows[r]): pre = sigmoid(fn . rms(s) *
 * scale + base) + hc_eps, x = sum pre_i s_i, out = bf16(norm_w * rms(x)). */
typedef struct tm_k_dsv4_head_args {
    uint16_t *out;        /* [n_row][D] */
    const float *streams; /* [T][N * D] */
    const uint32_t *rows;
    const float *fn, *base, *scale, *norm_w;
    float *mixes; /* [n_row][N] scratch */
    uint32_t n_row, N, D;
    float eps, hc_eps;
} tm_k_dsv4_head_args;
tm_rc tm_k_dsv4_head(const tm_k_dsv4_head_args *a, cudaStream_t s, tm_err *err);

/* Sum of n_part partials (stride apart) of n floats into y (in order). */
typedef struct tm_k_dsv4_sum_args {
    float *y;
    const float *part;
    size_t stride, n;
    uint32_t n_part;
} tm_k_dsv4_sum_args;
tm_rc tm_k_dsv4_sum(const tm_k_dsv4_sum_args *a, cudaStream_t s, tm_err *err);

#ifdef __cplusplus
}
#endif

#endif /* TM_KERNELS_DSV4_H */
