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
 *   candidate blocks set to -inf (their picks stay valid, as the reference's);
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

#ifdef __cplusplus
}
#endif

#endif /* TM_KERNELS_DSV41_H */
