/* kernels/dsv41.h - the DeepSeek-V4.1 ops of the CUDA engine that DeepSeek-V4's kernels
 * (kernels/dsv4.h) do not have, written first so they can be checked on their own
 * (tests/gpu/test_dsv41_kernels.c) before the engine (docs/deepseek_v41.md "CUDA"):
 *
 * - act_quant QDQ: the reference's act_quant(x, 32, "ue8m0", inplace=True) on fp32 rows: per 32
 *   values, s = 2^ceil(log2(max(amax, 1e-4) * fp32(1/448))) from the product's bits, x =
 *   e4m3(clamp(x / s, +-448)) * s, e4m3 round-to-nearest-even.
 * - fp4_act_quant QDQ: block 32 with s = 2^ceil(log2(max(amax, 6 * 2^-126) * fp32(1/6))) (the
 *   indexer's keys and queries), or block 16 with s = e4m3(max(amax, 6 * 2^-9) / 6) (the compressed
 *   KV); x = e2m1(clamp(x / s, +-6)) * s, e2m1 round-to-nearest-even.
 * - the Engram gate: for token t and hyper-connection stream c, with key = kv[t][c*D .. c*D+D),
 *   value = kv[t][N*D .. N*D+D), w = q_weight * k_weight [N][D] (fp32 products):
 *   dot = sum_d h*w*key / sqrt(mean(h^2)+eps) / sqrt(mean(key^2)+eps) / sqrt(D),
 *   gate = sigmoid(sign(dot) * sqrt(max(|dot|, 1e-6))), h += gate * value (sums in double).
 *
 * The same operations as the CPU engine (runner/engine/cpu/dsv41.c), in the same fp32 order for the
 * quantizers (bit-identical results expected) and double sums for the gate. All buffers are
 * device fp32; launchers never allocate; n 0 launches nothing. */
#ifndef TM_KERNELS_DSV41_H
#define TM_KERNELS_DSV41_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "base/err.h" /* C declarations: C linkage also from .cu files */

/* act_quant QDQ in place on n values (n % 32 == 0; rows of a width that is a multiple of 32). */
tm_rc tm_k_dsv41_act_quant(float *x, size_t n, cudaStream_t s, tm_err *err);

/* fp4_act_quant QDQ in place on n values (n % block == 0): block 32 with ue8m0 scales
 * (e4m3_scale 0) or block 16 with e4m3 scales (e4m3_scale 1). */
tm_rc tm_k_dsv41_fp4_act_quant(float *x, size_t n, uint32_t block, int e4m3_scale, cudaStream_t s,
                               tm_err *err);

/* The fast path's linear inputs (runner/engine/cuda/dsv41.c): n_tok rows of n fp32 values (row
 * stride ldx) into y [n_tok][n] bf16 (contiguous). aq 1: the act_quant QDQ values, computed by
 * exactly tm_k_dsv41_act_quant's operations (n % 32 == 0); each is e4m3 * 2^k, which bf16 holds
 * exactly, so y is the reference's quantized input bit for bit (lo must be NULL). aq 0 (the inputs
 * of linears whose weights are not quantized): the fp32 value x split in two bf16 values, hi =
 * bf16_rn(x) into y and lo = bf16_rn(x - hi) into lo [n_tok][n] (x - hi is exact in fp32), so
 * hi + lo is x to ~2^-17 relative; W.hi + W.lo in fp32 is then the fp32-input product up to
 * ~1e-5 relative and summation order. x is not changed. */
typedef struct tm_k_dsv41_to_bf16_args {
    uint16_t *y, *lo;
    const float *x;
    uint32_t ldx, n, n_tok;
    int aq;
} tm_k_dsv41_to_bf16_args;
tm_rc tm_k_dsv41_to_bf16(const tm_k_dsv41_to_bf16_args *a, cudaStream_t s, tm_err *err);

/* The fast path's split-K sums for the hi / lo halves of its non-quantized inputs: for t < n_tok,
 * j < n_col, y[t * ld_y + j] = (add ? y[t * ld_y + j] : 0) + S(t) + (lo ? S(n_tok + t) : 0), where
 * S(r) = the sum over p < n_part (in order) of part[p * stride + r * n_col + j]: lo 1 when one GEMM
 * ran the hi rows and then the lo rows (2 x n_tok rows per split), add 1 for the lo pass of two
 * (y holds the hi pass's sum). One kernel; n_part >= 1. */
typedef struct tm_k_dsv41_sum_split_args {
    float *y;
    uint32_t ld_y;
    const float *part;
    size_t stride;
    uint32_t n_part, n_tok, n_col;
    int lo, add;
} tm_k_dsv41_sum_split_args;
tm_rc tm_k_dsv41_sum_split(const tm_k_dsv41_sum_split_args *a, cudaStream_t s, tm_err *err);

/* y [n_out][n_in] bf16 = e4m3 w [n_out][n_in] * 2^(scale[o / 32][i / 32] - 127) (the 32 x 32
 * ue8m0 block-scaled FP8 of the dense linears; n_in % 32 == 0): exact (an e4m3 value times a power
 * of two) unless it leaves bf16's range. The bf16 copy of random FP8 weights (benchmarks). */
tm_rc tm_k_dsv41_dequant_fp8_32(uint16_t *y, const uint8_t *w, const uint8_t *scale, uint32_t n_out,
                                uint32_t n_in, cudaStream_t s, tm_err *err);

typedef struct tm_k_dsv41_engram_gate_args {
    float *h;        /* [n_tok][n_hc][dim]: the residual streams, updated in place */
    const float *kv; /* [n_tok][(n_hc + 1) * dim]: wkv's output, n_hc keys then the value */
    const float *w;  /* [n_hc][dim]: q_weight * k_weight */
    uint32_t n_tok, n_hc, dim;
    float eps; /* norm_eps */
} tm_k_dsv41_engram_gate_args;

/* One block per (token, stream); dim <= 8192. */
tm_rc tm_k_dsv41_engram_gate(const tm_k_dsv41_engram_gate_args *a, cudaStream_t s, tm_err *err);

/* The indexer's selection for one index source layer, one block per token, in place on the
 * token's scores over its lens[t] reachable compressed positions (row t of score, ld floats):
 * - mode TM_DSV41_SEL_SOURCE (the candidate source): blocks of cb positions scored by their best
 *   entry, the newest (last, partly filled) block pinned in, the top min(n_blocks, ctop) blocks
 *   kept: cand[t][0..n_cand[t]) in ascending block order (bsc: [n_tok][ld] scratch);
 * - mode TM_DSV41_SEL_CONSUMER (an index source after it): positions outside the token's
 *   candidate blocks (cand[t][0..n_cand[t]), ascending, as mode SOURCE writes them) set to -inf
 *   (their picks stay valid, as the reference's);
 * - every mode: the top min(topk, lens[t]) positions, higher score first and the lower position
 *   on ties (the CPU engine's order), written in position order to pick[t][..], n_pick[t].
 * Selection by an 8-pass radix select over (score, position) keys, O(lens) per token. */
enum { TM_DSV41_SEL_PLAIN = 0, TM_DSV41_SEL_SOURCE = 1, TM_DSV41_SEL_CONSUMER = 2 };

typedef struct tm_k_dsv41_select_args {
    float *score;         /* [n_tok][ld] */
    float *bsc;           /* [n_tok][ld] scratch (mode SOURCE) */
    const uint32_t *lens; /* [n_tok] reachable positions, <= ld */
    uint32_t *cand;       /* [n_tok][ctop] */
    uint32_t *n_cand;     /* [n_tok] */
    int32_t *pick;        /* [n_tok][topk] */
    uint32_t *n_pick;     /* [n_tok] */
    size_t ld;
    uint32_t n_tok, mode, cb, ctop, topk;
} tm_k_dsv41_select_args;

tm_rc tm_k_dsv41_select(const tm_k_dsv41_select_args *a, cudaStream_t s, tm_err *err);

/* ---- the forward pass's ops (the CUDA engine's tm_cuda_arch_dsv41, runner/engine/cuda/dsv41.c):
 * the CPU engine's arithmetic (fp32 values, double sums, exp / cos / sin in double, elementwise
 * fp32 operations rounded as on the host), plain kernels: a first version checked against the CPU
 * engine (tests/gpu/test_dsv41_cuda.c), not tuned. ---- */

#define TM_DSV41_K_MAX_HC 8 /* hyper-connection streams */
enum { TM_DSV41_K_SCORE_SQRTSOFTPLUS = 0, TM_DSV41_K_SCORE_SIGMOID, TM_DSV41_K_SCORE_SOFTMAX };

/* Where a step's tokens live in the paged state (device arrays of the runtime's step metadata):
 * the slot of position p of token t's sequence is
 * block_tables[seq_bt[tok_seq[t]] + p / bs] * bs + p % bs. */
typedef struct tm_k_dsv41_seqs {
    const uint32_t *pos, *tok_seq, *seq_bt, *block_tables; /* [T], [T], [S], concatenated */
    uint32_t bs;                                           /* block_size */
} tm_k_dsv41_seqs;

/* out[t][o] = x[t / x_div] . w[row0 + o] (+ sel[t] * w_expert elements when sel is given), a
 * double sum rounded to fp32; w fp32 or bf16 rows of n_in; any n_tok (the rows past grid y's
 * 65535 in further passes). A warp per (output, row), or a block per (output, row) when there are
 * fewer than 1024 of them over rows of >= 2048 inputs (the hyper-connection projections at decode).
 */
typedef struct tm_k_dsv41_linear_args {
    float *out;
    const float *x;
    const void *w;
    const uint32_t *sel; /* [n_tok] expert of each row, or NULL */
    size_t w_expert;     /* elements per expert */
    uint64_t row0;
    uint32_t ldo, ldx, n_tok, n_in, n_out, x_div;
    int w_bf16;
} tm_k_dsv41_linear_args;
tm_rc tm_k_dsv41_linear(const tm_k_dsv41_linear_args *a, cudaStream_t s, tm_err *err);

/* RMSNorm in place of n_row rows of n (stride ld), weight w (NULL: none), double sums. */
tm_rc tm_k_dsv41_rmsnorm(float *x, uint32_t ld, const float *w, uint32_t n_row, uint32_t n,
                         float eps, cudaStream_t s, tm_err *err);

/* Interleaved RoPE on each head's trailing rd values: x[t * tok_stride + h * head_stride ..]; the
 * position is pos[t], or with lat_r > 0 the first position of the group of lat_r that pos[t]
 * closes; angle = fp32(pos * inv_freq[i]); sign -1 rotates back. */
typedef struct tm_k_dsv41_rope_args {
    float *x;
    const uint32_t *pos;
    const float *inv_freq; /* [rd / 2] */
    uint32_t n_tok, n_head, tok_stride, head_stride, hd, rd, lat_r;
    float sign;
} tm_k_dsv41_rope_args;
tm_rc tm_k_dsv41_rope(const tm_k_dsv41_rope_args *a, cudaStream_t s, tm_err *err);

/* x[t] = emb[tokens[t]] (fp32 or bf16 rows of D), every one of the N streams = x[t], pre[t] =
 * (1, 0, ..). */
tm_rc tm_k_dsv41_embed(float *x, float *streams, float *pre, const void *emb, int bf16,
                       const uint32_t *tokens, uint32_t n_tok, uint32_t D, uint32_t N,
                       cudaStream_t s, tm_err *err);

/* The hyper-connection split of every token: mixes (the fn projection of the flattened streams)
 * scaled by 1 / rms(streams) (norm_eps), then pre / post / comb with Sinkhorn. */
typedef struct tm_k_dsv41_hc_split_args {
    const float *mixes;   /* [n_tok][(2 + N) * N] */
    const float *streams; /* [n_tok][N][D] */
    const float *scale;   /* [3] */
    const float *base;    /* [(2 + N) * N] */
    float *pre, *post, *comb;
    uint32_t n_tok, N, D, iters;
    float norm_eps, hc_eps;
} tm_k_dsv41_hc_split_args;
tm_rc tm_k_dsv41_hc_split(const tm_k_dsv41_hc_split_args *a, cudaStream_t s, tm_err *err);

/* x[r] = rmsnorm(sum_i pre[t][i] * streams[t][i]) * w with t = rows[r] (rows NULL: t = r). */
tm_rc tm_k_dsv41_collapse_norm(float *x, const float *streams, const float *pre,
                               const uint32_t *rows, uint32_t n_row, uint32_t N, uint32_t D,
                               const float *w, float eps, cudaStream_t s, tm_err *err);

/* streams[t][c] = post[t][c] * y[t] + sum_j comb[t][j][c] * streams[t][j] (double sums). */
tm_rc tm_k_dsv41_hc_expand(float *streams, const float *y, const float *post, const float *comb,
                           uint32_t n_tok, uint32_t N, uint32_t D, cudaStream_t s, tm_err *err);

/* field[slot * fld + j] = src[t * lds + j] for j < n: r 0 at the token's own slot; r >= 1 only
 * for tokens closing a group of r (at the slot of the group's first position). */
typedef struct tm_k_dsv41_store_args {
    float *field;
    const float *src;
    uint32_t fld, lds, n, n_tok, r;
} tm_k_dsv41_store_args;
tm_rc tm_k_dsv41_store(const tm_k_dsv41_store_args *a, const tm_k_dsv41_seqs *q, cudaStream_t s,
                       tm_err *err);

/* The compressor's latent of every token: r 1 ckv[t]; r > 1, for a token closing a group, the
 * per-channel softmax of the group's gates weighting its kv (tail field: kv | gate of hd each,
 * stride tld), else 0. */
tm_rc tm_k_dsv41_latent(float *lat, const float *ckv, const float *tail, uint32_t tld, uint32_t hd,
                        uint32_t r, uint32_t n_tok, const tm_k_dsv41_seqs *q, cudaStream_t s,
                        tm_err *err);

/* field[slot[t] * fld] = the bits of tmap[tokens[t]] (Engram's compressed ids in the state). */
tm_rc tm_k_dsv41_cid_store(float *field, uint32_t fld, const uint32_t *tokens, const int32_t *tmap,
                           const uint32_t *slot, uint32_t n_tok, cudaStream_t s, tm_err *err);

/* The indexer's scores: lens[t] = (pos + 1) / r, score[t][k] = sum_h relu(q[t][h] . key(k)) *
 * w[t][h] * iscale for k < lens[t] (key(k): key_field at the slot of position k * r). */
typedef struct tm_k_dsv41_iscore_args {
    float *score; /* [n_tok][ld] */
    uint32_t *lens;
    const float *q, *w, *key_field;
    size_t ld;
    double iscale;
    uint32_t kld, Hi, di, r, n_tok;
} tm_k_dsv41_iscore_args;
tm_rc tm_k_dsv41_index_scores(const tm_k_dsv41_iscore_args *a, const tm_k_dsv41_seqs *q,
                              cudaStream_t s, tm_err *err);

/* sparse_attn of every (token, head) over the window rows (win field) and, with r > 0, the picked
 * compressed rows (comp field, row k at the slot of position k * r), the sink in the denominator;
 * the output's rope slice rotated back with inv_freq. */
typedef struct tm_k_dsv41_attn_args {
    float *o;                /* [n_tok][H][hd] */
    const float *q;          /* [n_tok][H][hd] */
    const float *win, *comp; /* state fields */
    const int32_t *pick;     /* [n_tok][topk] */
    const uint32_t *n_pick;  /* [n_tok] */
    const float *sinks;      /* [H] */
    const float *inv_freq;   /* [rd / 2] */
    uint32_t wld, cld, H, hd, rd, r, window, topk, n_tok;
} tm_k_dsv41_attn_args;
size_t tm_k_dsv41_attn_smem(uint32_t window, uint32_t topk, uint32_t hd);
tm_rc tm_k_dsv41_attn(const tm_k_dsv41_attn_args *a, const tm_k_dsv41_seqs *q, cudaStream_t s,
                      tm_err *err);

/* The router: scores of logits [n_tok][E] in place (score function of gate_temp), top K of score
 * + bias (ties to the lower id) into sel, their weights (normalised with norm_topk when K > 1,
 * times route_scale). */
typedef struct tm_k_dsv41_route_args {
    float *logits;
    const float *bias; /* [E] or NULL */
    uint32_t *sel;     /* [n_tok][K] */
    float *weight;     /* [n_tok][K] */
    uint32_t n_tok, E, K, score_func, norm_topk;
    float gate_temp, route_scale;
} tm_k_dsv41_route_args;
tm_rc tm_k_dsv41_route(const tm_k_dsv41_route_args *a, cudaStream_t s, tm_err *err);

/* g = silu(min(g, lim)) * clamp(u, +-lim) (lim > 0; else unclamped) * wt[row] (wt NULL: 1). */
tm_rc tm_k_dsv41_swiglu(float *g, const float *u, uint32_t n_row, uint32_t I, float lim,
                        const float *wt, cudaStream_t s, tm_err *err);

/* y[t] = sum over the token's K experts in increasing id of eo row e(t * K + k) (double) + sh[t],
 * e(p) = eo_row[p] (the pairs' rows in expert order, tm_k_dsv41_pair_sort's inv), or p with
 * eo_row NULL. */
tm_rc tm_k_dsv41_moe_combine(float *y, const float *eo, const uint32_t *eo_row, const uint32_t *sel,
                             const float *sh, uint32_t n_tok, uint32_t K, uint32_t D,
                             cudaStream_t s, tm_err *err);

/* The step's (token, expert) pairs p = t * K + k (expert sel[p] < n_expert, routing weight w[p])
 * in expert order, for the MoE kernel's chunks of pairs (kernels/gemm_quant.h tm_k_moe_mxfp4): in
 * pair order every chunk of a prefill step meets nearly every expert and streams its weights, in
 * expert order a chunk meets a few. For sorted position q: perm[q] = its pair (experts ascending,
 * pairs ascending within an expert: a stable counting sort), sexp[q] = sel[perm[q]], prow[q] =
 * perm[q] / K (the pair's token row), wq[q] = w[perm[q]]; inv[perm[q]] = q. One block;
 * n_expert <= TM_DSV41_K_SORT_MAX_EXPERT. */
#define TM_DSV41_K_SORT_MAX_EXPERT 2048
typedef struct tm_k_dsv41_pair_sort_args {
    const uint32_t *sel; /* [n_pair] */
    const float *w;      /* [n_pair] */
    uint32_t *perm, *prow, *inv;
    int32_t *sexp;
    float *wq;
    uint32_t n_pair, n_expert, K;
} tm_k_dsv41_pair_sort_args;
tm_rc tm_k_dsv41_pair_sort(const tm_k_dsv41_pair_sort_args *a, cudaStream_t s, tm_err *err);

#ifdef __cplusplus
}
#endif

#endif /* TM_KERNELS_DSV41_H */
