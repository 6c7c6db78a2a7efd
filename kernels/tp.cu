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

// (v, i) beats (bv, bi): larger value; equal value and lower id; anything beats "none".
static __device__ __forceinline__ bool better(float v, uint32_t i, float bv, uint32_t bi) {
    if (i == TM_K_ARGMAX_NONE)
        return false;
    if (bi == TM_K_ARGMAX_NONE)
        return true;
    return v > bv || (v == bv && i < bi);
}

// Columns [0, n_lim) of each row compete (n_lim may be 0: the slice lies past the limit).
template <int BLOCK>
static __global__ void argmax_part_f32_kernel(uint32_t *cand, const float *logits,
                                              uint32_t n_col, uint32_t n_lim, uint32_t id0) {
    __shared__ float sv[BLOCK];
    __shared__ uint32_t si[BLOCK];
    const float *row = logits + (size_t)blockIdx.x * n_col;
    float best = -INFINITY;
    uint32_t bi = TM_K_ARGMAX_NONE;
    int bad = 0;
    for (uint32_t c = threadIdx.x; c < n_lim; c += BLOCK) { // hot loop: the vocabulary slice
        const float v = row[c];
        bad |= !isfinite(v);
        if (better(v, c, best, bi)) {
            best = v;
            bi = c;
        }
    }
    bad = __syncthreads_or(bad);
    sv[threadIdx.x] = best;
    si[threadIdx.x] = bi;
    __syncthreads();
    for (int w = BLOCK / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w &&
            better(sv[threadIdx.x + w], si[threadIdx.x + w], sv[threadIdx.x], si[threadIdx.x])) {
            sv[threadIdx.x] = sv[threadIdx.x + w];
            si[threadIdx.x] = si[threadIdx.x + w];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        cand[2 * blockIdx.x] = __float_as_uint(sv[0]);
        cand[2 * blockIdx.x + 1] = bad                         ? TM_K_ARGMAX_NONFINITE
                                   : si[0] == TM_K_ARGMAX_NONE ? TM_K_ARGMAX_NONE
                                                               : si[0] + id0;
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
        if (better(v, c[1], best, bi)) {
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
    embed_part_bf16_kernel<256><<<a->n_tok, 256, 0, s>>>(a->x, a->table, a->tokens, a->n_embd,
                                                          a->vocab0, a->n_vocab);
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
    argmax_part_f32_kernel<1024><<<a->n_row, 1024, 0, s>>>(a->cand, a->logits, a->n_col, n_lim,
                                                            a->id0);
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
