/* kernels/embed.cu - embedding gather (see embed.h). One block per token; a row is copied with
 * 2-element steps (bf16 pairs) when n_embd is even. */
#include "kernels/common.cuh"
#include "kernels/embed.h"

template <int BLOCK>
static __global__ void embed_bf16_kernel(float *x, const uint16_t *table, const uint32_t *tokens,
                                         uint32_t n_embd) {
    const size_t t = blockIdx.x;
    const uint16_t *row = table + (size_t)tokens[t] * n_embd;
    float *out = x + t * n_embd;
    for (uint32_t c = threadIdx.x; c < n_embd; c += BLOCK)
        out[c] = tm_bf2f(row[c]);
}

extern "C" tm_rc tm_k_embed_bf16(const tm_k_embed_bf16_args *a, cudaStream_t s, tm_err *err) {
    if (a->n_tok == 0)
        return TM_OK;
    TM_ASSERT(a->n_embd > 0 && a->x && a->table && a->tokens);
    embed_bf16_kernel<256><<<a->n_tok, 256, 0, s>>>(a->x, a->table, a->tokens, a->n_embd);
    return tm_cuda_launched(err, s, "embed_bf16");
}
