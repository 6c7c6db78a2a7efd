/* kernels/tp.cu - tensor-parallel helpers (see tp.h): vocab-parallel embedding gather, per-rank
 * argmax candidates and their merge. */
#include "kernels/common.cuh"
#include "kernels/tp.h"

template <int BLOCK>
static __global__ void embed_part_bf16_kernel(float *x, const uint16_t *table,
                                              const uint32_t *tokens, uint32_t n_embd,
                                              uint32_t vocab0, uint32_t n_vocab) {
    const size_t t = blockIdx.x;
    const uint32_t row = tokens[t] - vocab0; // wraps below the slice
    float *out = x + t * n_embd;
    if (row >= n_vocab) { // another rank's slice: contribute zeros to the sum
        for (uint32_t c = threadIdx.x; c < n_embd; c += BLOCK)
            out[c] = 0.0f;
        return;
    }
    const uint16_t *src = table + (size_t)row * n_embd;
    for (uint32_t c = threadIdx.x; c < n_embd; c += BLOCK)
        out[c] = tm_bf2f(src[c]);
}

// Columns [0, n_lim) of each row compete (n_lim may be 0: the slice lies past the limit).
template <int BLOCK>
static __global__ void argmax_part_f32_kernel(uint32_t *cand, const float *logits, uint32_t n_col,
                                              uint32_t n_lim, uint32_t id0) {
    float v;
    uint32_t i;
    const bool bad = tm_block_argmax<BLOCK>(logits + (size_t)blockIdx.x * n_col, n_lim, &v, &i);
    if (threadIdx.x == 0) {
        cand[2 * blockIdx.x] = __float_as_uint(v);
        cand[2 * blockIdx.x + 1] = bad                     ? TM_K_ARGMAX_NONFINITE
                                   : i == TM_K_ARGMAX_NONE ? TM_K_ARGMAX_NONE
                                                           : i + id0;
    }
}

static __global__ void argmax_merge_kernel(uint32_t *ids, const uint32_t *cand, uint32_t n_row,
                                           uint32_t n_rank) {
    const uint32_t r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= n_row)
        return;
    float best = -INFINITY;
    uint32_t bi = TM_K_ARGMAX_NONE;
    for (uint32_t k = 0; k < n_rank; k++) {
        const uint32_t *c = cand + ((size_t)k * n_row + r) * 2;
        const float v = __uint_as_float(c[0]);
        if (c[1] == TM_K_ARGMAX_NONFINITE) {
            ids[r] = UINT32_MAX;
            return;
        }
        if (tm_argmax_better(v, c[1], best, bi)) {
            best = v;
            bi = c[1];
        }
    }
    ids[r] = bi == TM_K_ARGMAX_NONE ? 0 : bi; // no rank had a column: cannot happen (limit >= 1)
}

extern "C" tm_rc tm_k_embed_part_bf16(const tm_k_embed_part_bf16_args *a, cudaStream_t s,
                                      tm_err *err) {
    if (a->n_tok == 0)
        return TM_OK;
    TM_ASSERT(a->n_embd > 0 && a->x && a->table && a->tokens);
    embed_part_bf16_kernel<256>
        <<<a->n_tok, 256, 0, s>>>(a->x, a->table, a->tokens, a->n_embd, a->vocab0, a->n_vocab);
    return tm_cuda_launched(err, s, "embed_part_bf16");
}

extern "C" tm_rc tm_k_argmax_part_f32(const tm_k_argmax_part_f32_args *a, cudaStream_t s,
                                      tm_err *err) {
    if (a->n_row == 0)
        return TM_OK;
    TM_ASSERT(a->n_col > 0 && a->cand && a->logits);
    uint32_t n_lim = a->n_col; // columns whose global id is below the limit
    if (a->id_limit)
        n_lim = a->id_limit <= a->id0 ? 0 : TM_MIN(a->n_col, a->id_limit - a->id0);
    argmax_part_f32_kernel<1024>
        <<<a->n_row, 1024, 0, s>>>(a->cand, a->logits, a->n_col, n_lim, a->id0);
    return tm_cuda_launched(err, s, "argmax_part_f32");
}

extern "C" tm_rc tm_k_argmax_merge(const tm_k_argmax_merge_args *a, cudaStream_t s, tm_err *err) {
    if (a->n_row == 0)
        return TM_OK;
    TM_ASSERT(a->n_rank > 0 && a->ids && a->cand);
    argmax_merge_kernel<<<TM_CEIL_DIV(a->n_row, 128u), 128, 0, s>>>(a->ids, a->cand, a->n_row,
                                                                    a->n_rank);
    return tm_cuda_launched(err, s, "argmax_merge");
}
