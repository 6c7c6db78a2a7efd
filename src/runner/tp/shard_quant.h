/* runner/tp/shard_quant.h - one rank's slice of a quantized weight in its stored form, for engines
 * that keep the codes and scales (the CUDA DeepSeek-V4 engine's FP8 decode GEMMs and MXFP4 expert
 * kernels, docs/deepseek_v4.md "CUDA tensor parallel"): the codes and the scales of the blocks
 * that cover the slice, laid out as a tensor of their own, handed to a put function (a host to
 * device copy in the engine, memcpy in the tests) through caller-provided host staging. Slices
 * must start on a scale block (asserted; the engine refuses other splits first), so no value is
 * re-scaled and the slice dequantizes to exactly the full tensor's values. Pure functions of
 * their inputs apart from put; any thread. */
#ifndef TM_RUNNER_TP_SHARD_QUANT_H
#define TM_RUNNER_TP_SHARD_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "runner/model/tensor.h"

/* n bytes from host src to dst (dst is whatever the caller's put writes to: device memory for the
 * CUDA engine). Returns TM_OK or the put's error in err. */
typedef tm_rc (*tm_shard_put_fn)(void *dst, const void *src, size_t n, tm_err *err);

/* Rows [r0, r0 + nr) x columns [c0, c0 + nc) of t, an e4m3 matrix [R][C] with 128 x 128 block
 * scales (tm_tensor's layout), as a block-scaled matrix of nc columns: the codes to w from row
 * qrow ([qrow + nr][nc] bytes written from w + qrow * nc), the scales of the slice's blocks,
 * [ceil(nr / 128)][ceil(nc / 128)], to scale from block row qrow / 128: e8m0 bytes when e8 (t's
 * scales are e8m0), else fp32 (t's scales converted exactly). r0, c0 and qrow are multiples of 128
 * (asserted): the slice's blocks are then whole blocks of t's grid, a trailing part block inside
 * one of t's. hb (stage_bytes) and fb (stage_bytes floats) are host staging; stage_bytes must hold
 * a row of nc codes and the slice's scales. Errors: put's. */
tm_rc tm_shard_fp8_block_put(tm_shard_put_fn put, uint8_t *w, void *scale, int e8, size_t qrow,
                             const tm_tensor *t, size_t r0, size_t nr, size_t c0, size_t nc,
                             uint8_t *hb, float *fb, size_t stage_bytes, tm_err *err);

/* Channels [f0, f0 + n) of the width I of MXFP4 routed experts (e2m1 codes two a byte, one e8m0
 * scale per 32 values of a row): gate_up [E][2I][D] gives its gate rows [f0, f0 + n) and up rows
 * [I + f0, I + f0 + n) of every expert, whole, to gu_w ([E][2n][D / 2] bytes) and gu_s
 * ([E][2n][D / 32]); down [E][D][I] gives columns [f0, f0 + n) of every row to dn_w
 * ([E][D][n / 2]) and dn_s ([E][D][n / 32]). f0, n and D are multiples of 32 (asserted). hb:
 * stage_bytes of host staging, at least a row of n / 2 codes. Errors: put's. */
tm_rc tm_shard_mxfp4_experts_put(tm_shard_put_fn put, uint8_t *gu_w, uint8_t *gu_s, uint8_t *dn_w,
                                 uint8_t *dn_s, const tm_tensor *gate_up, const tm_tensor *down,
                                 size_t f0, size_t n, uint8_t *hb, size_t stage_bytes, tm_err *err);

#endif /* TM_RUNNER_TP_SHARD_QUANT_H */
