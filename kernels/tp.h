/* kernels/tp.h - the kernels tensor parallel adds (runner/engine/cuda/ with tp_size > 1):
 *  - embed_part: the vocab-parallel embedding gather. A rank holds rows [vocab0, vocab0 + n_vocab)
 *    of the table; a token outside that slice gives a zero row, so that the sum of all ranks'
 *    outputs (an all-reduce) is the full embedding. Host reference: the shard branch of the
 *    embedding loop in runner/engine/cpu/engine_cpu.c.
 *  - argmax_part: per logits row of this rank's vocabulary slice, the best (value, global id)
 *    pair among the global ids below id_limit, lowest id among equal maxima; a slice with a NaN
 *    or infinite value there gives id TM_K_ARGMAX_NONFINITE instead (as kernels/sample.h).
 *  - argmax_merge: from the pairs of all ranks ([n_rank][n_row], gathered), ids[r] = the best
 *    id; ranks hold increasing id ranges, so the lowest rank wins ties; UINT32_MAX when any rank
 *    saw a non-finite value. Host reference: a linear scan over the full row
 *    (tests/gpu/test_tp_cuda.c checks both against it). */
#ifndef TM_KERNELS_TP_H
#define TM_KERNELS_TP_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "base/err.h" /* C declarations: C linkage also from .cu files */

typedef struct tm_k_embed_part_bf16_args {
    float *x;               /* [n_tok][n_embd] fp32, written */
    const uint16_t *table;  /* [n_vocab][n_embd] bf16: rows vocab0 .. vocab0 + n_vocab - 1 */
    const uint32_t *tokens; /* [n_tok] device, global ids */
    uint32_t n_tok, n_embd, vocab0, n_vocab;
} tm_k_embed_part_bf16_args;

/* A candidate's id when the slice has no column below id_limit. */
#define TM_K_ARGMAX_NONE UINT32_MAX
/* A candidate's id when the slice has a NaN or infinite value below id_limit. */
#define TM_K_ARGMAX_NONFINITE (UINT32_MAX - 1)

/* A candidate: the row maximum's float bits and its global id (or one of the two above). */
typedef struct tm_k_argmax_part_f32_args {
    uint32_t *cand;             /* [n_row][2] {float bits of the max, global id} */
    const float *logits;        /* [n_row][n_col] */
    uint32_t n_row, n_col, id0; /* id0: global id of column 0 */
    uint32_t id_limit;          /* only global ids below it compete; 0: all */
} tm_k_argmax_part_f32_args;

typedef struct tm_k_argmax_merge_args {
    uint32_t *ids;        /* [n_row] */
    const uint32_t *cand; /* [n_rank][n_row][2], rank r's slice of ids below rank r+1's */
    uint32_t n_row, n_rank;
} tm_k_argmax_merge_args;

/* Each launches on s; n_tok / n_row 0 launch nothing. */
tm_rc tm_k_embed_part_bf16(const tm_k_embed_part_bf16_args *a, cudaStream_t s, tm_err *err);
tm_rc tm_k_argmax_part_f32(const tm_k_argmax_part_f32_args *a, cudaStream_t s, tm_err *err);
tm_rc tm_k_argmax_merge(const tm_k_argmax_merge_args *a, cudaStream_t s, tm_err *err);

#ifdef __cplusplus
}
#endif

#endif /* TM_KERNELS_TP_H */
