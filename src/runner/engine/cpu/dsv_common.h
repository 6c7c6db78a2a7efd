/* runner/engine/cpu/dsv_common.h - math the DeepSeek-V4 (dsv4.c) and DeepSeek-V4.1 (dsv41.c)
 * CPU forwards share, written once: the hyper-connection split (pre / post / Sinkhorn-normalised
 * comb from one row of mixes, DeepSeek's hc_split_sinkhorn) and the interleaved RoPE rotation of a
 * head's trailing rope slice. Pure functions on caller memory; any thread. The order of every
 * float operation is part of the contract (both engines are compared bit for bit across
 * chunkings and thread counts). */
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

#endif /* TM_RUNNER_ENGINE_CPU_DSV_COMMON_H */
