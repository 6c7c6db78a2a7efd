/* runner/engine/cpu/dsv_common.h - math the DeepSeek-V4 (dsv4.c) and DeepSeek-V4.1 (dsv41.c)
 * CPU forwards share, written once: the hyper-connection split (pre / post / Sinkhorn-normalised
 * comb from one row of mixes, DeepSeek's hc_split_sinkhorn), the interleaved RoPE rotation of a
 * head's trailing rope slice, a row-parallel weight's column slice and the vocabulary-parallel
 * embedding. Pure functions on caller memory; any thread. The order of every float operation is
 * part of the contract (both engines are compared bit for bit across chunkings and thread
 * counts). Below those, the V4.1 reference's small kernels (act_quant, fp4_act_quant, RMSNorm in
 * double, the rope angles, hyper-connection collapse / expand, the clamped SwiGLU) that the V4.1
 * forward (dsv41.c) and its DSpark drafter (dsv41_dspark.c) both run. */
#ifndef TM_RUNNER_ENGINE_CPU_DSV_COMMON_H
#define TM_RUNNER_ENGINE_CPU_DSV_COMMON_H

#include <stdint.h>

/* From mixes m[(2+N)*N] (already scaled by the stream's rms): pre[i] = sigmoid(m[i] scale[0] +
 * base[i]) + eps; post[i] = 2 sigmoid(m[N+i] scale[1] + base[N+i]); comb[j*N+k] = softmax over k
 * of (m[2N+jN+k] scale[2] + base[..]) + eps, then columns divided by (their sum + eps), then
 * iters-1 times rows then columns. N <= 8. */
void tm_dsv_hc_split(const float *m, const float *scale, const float *base, uint32_t N,
                     uint32_t iters, float eps, float *pre, float *post, float *comb);

/* Rotate the trailing rd channels of a hd-wide head x as interleaved pairs (x[2i], x[2i+1]) by the
 * angles whose cosines / sines are cs[i], sn[i] (i < rd/2); sign -1 rotates back:
 * (a, b) -> (a c - b s, b c + a s) with s = sign * sn[i]. */
void tm_dsv_rope_head(float *x, uint32_t hd, uint32_t rd, const float *cs, const float *sn,
                      float sign);

/* Columns [c0, c0 + n) of every row of t (2-D, or 3-D: the rows of all its matrices) into *out,
 * an owned f32 tensor (tm_malloc'd data, the caller frees out->data with tm_free) of the same
 * shape with n columns, dequantized where t is quantized: a tensor-parallel rank's slice of a
 * row-parallel weight. Returns 1 on allocation failure (out->data NULL). */
struct tm_tensor;
int tm_dsv_col_slice(const struct tm_tensor *t, uint64_t c0, uint64_t n, struct tm_tensor *out);

/* The vocabulary-parallel embedding: for t < T, x[t] (D floats) = row tok[t] of embd ([vocab][D],
 * any float dtype) when it lies in this rank's slice [vocab0, vocab0 + n_vocab), else zeros (the
 * rank holding it gives it in the caller's all-reduce; at tp 1 the slice is the vocabulary). */
void tm_dsv_embed_slice(const struct tm_tensor *embd, const uint32_t *tok, uint32_t T,
                        uint32_t vocab0, uint32_t n_vocab, uint32_t D, float *x);

/* ---- the V4.1 reference's kernels (dsv41.c, dsv41_dspark.c): quantize-then-dequantize ---- */

static inline float tm_dsv_clampf(float v, float lo, float hi) {
    return v < lo ? lo : v > hi ? hi : v;
}

/* act_quant(x, 32, "ue8m0", inplace=True) on n values (n % 32 == 0): each block of 32 divided by
 * its power-of-two scale 2^ceil(log2(max(amax, 1e-4) / 448)), rounded to e4m3 (saturating at
 * 448, nearest-even) and multiplied back. */
void tm_dsv_act_quant(float *x, uint32_t n);
/* fp4_act_quant(x, block, inplace=True): block 32 with ue8m0 scales (the indexer) or block 16
 * with e4m3 scales amax / 6 (the compressed KV); values rounded to e2m1 (nearest-even) and
 * multiplied back. n % block == 0. */
void tm_dsv_fp4_act_quant(float *x, uint32_t n, uint32_t block, int e4m3_scale);
/* RMSNorm in place: x = x * 1/sqrt(mean(x^2) + eps) * w (w NULL: unweighted), in double. */
void tm_dsv_rmsnorm(float *x, const float *w, uint32_t n, float eps);
/* All of the 1-D tensor t (norm weights, biases; any float dtype) as floats into out. */
void tm_dsv_vec_f32(const struct tm_tensor *t, float *out);
/* cs[i], sn[i] = cos, sin of the fp32 angle pos * inv_freq[i] (computed in double, rounded to
 * fp32), i < rd / 2. */
void tm_dsv_cos_sin(const float *inv_freq, uint32_t rd, uint32_t pos, float *cs, float *sn);

/* Block.hc_mixes after its projection: each token's row of mixes ([T][(2+N)N], the streams s
 * ([T][N][D]) through hc_fn) scaled by 1/rms of its streams (norm_eps, in double), then
 * tm_dsv_hc_split with the scale (3) and base ((2+N)N) tensors, iters and hc_eps into pre / post
 * ([T][N]) and comb ([T][N][N]). N <= 8. */
void tm_dsv_hc_mix_split(const float *s, uint32_t N, uint32_t D, uint32_t T, float *mixes,
                         const struct tm_tensor *scale, const struct tm_tensor *base,
                         float norm_eps, uint32_t iters, float hc_eps, float *pre, float *post,
                         float *comb);
/* x[t] = sum_i pre[t][i] s[t][i] for t < T: the N streams s ([T][N][D]) collapsed with the pre
 * mixes pre ([T][N]) into x ([T][D]), accumulated in double. N <= 8. */
void tm_dsv_hc_collapse(const float *s, uint32_t N, uint32_t D, uint32_t T, const float *pre,
                        float *x);
/* s[t][k] = post[t][k] y[t] + sum_j comb[t][j][k] s[t][j] for t < T, in place, accumulated in
 * double: a sublayer's output y ([T][D]) expanded back into the streams. N <= 8. */
void tm_dsv_hc_expand(float *s, uint32_t N, uint32_t D, uint32_t T, const float *y,
                      const float *post, const float *comb);
/* A sublayer's (or the head's) input: x = tm_dsv_hc_collapse of the streams, then each row
 * tm_dsv_rmsnorm'ed with the weights of the 1-D tensor norm (read into nw, D floats) and eps. */
void tm_dsv_collapse_norm(const float *s, uint32_t N, uint32_t D, uint32_t T, const float *pre,
                          const struct tm_tensor *norm, float eps, float *nw, float *x);
/* The experts' activation in place over g ([n][I]): g = silu(g) * u, with g capped at lim and u
 * clamped to [-lim, lim] when lim > 0, times wt[t] when wt is given (the routing weight), in
 * double. */
void tm_dsv_swiglu(float *g, const float *u, uint32_t n, uint32_t I, float lim, const float *wt);

#endif /* TM_RUNNER_ENGINE_CPU_DSV_COMMON_H */
