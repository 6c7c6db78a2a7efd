/* kernels/embed.h - embedding gather: x[t] = float(table[tokens[t]]). Host reference: the
 * per-token tm_dtype_to_f32 row copy in runner/engine/cpu/engine_cpu.c. */
#ifndef TM_KERNELS_EMBED_H
#define TM_KERNELS_EMBED_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "base/err.h" /* C declarations: C linkage also from .cu files */

typedef struct tm_k_embed_bf16_args {
    float *x;               /* [n_tok][n_embd] fp32, written */
    const uint16_t *table;  /* [n_vocab][n_embd] bf16 */
    const uint32_t *tokens; /* [n_tok] device; each < n_vocab (the caller checks) */
    uint32_t n_tok, n_embd;
} tm_k_embed_bf16_args;

/* Launches on s; n_tok 0 launches nothing. */
tm_rc tm_k_embed_bf16(const tm_k_embed_bf16_args *a, cudaStream_t s, tm_err *err);

#ifdef __cplusplus
}
#endif

#endif /* TM_KERNELS_EMBED_H */
