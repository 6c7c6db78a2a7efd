/* kernels/rope.cu - bias + RoPE + KV cache write (see rope.h; the item's code in
 * kernels/rope.cuh). */
#include "kernels/rope.cuh"

/* grid (n_tok, ceil(items / BLOCK)): one item per thread. */
template <int BLOCK> static __global__ void rope_kv_bf16_kernel(tm_k_rope_kv_bf16_args a) {
    tm_rope_kv_item(a, blockIdx.x, blockIdx.y * BLOCK + threadIdx.x);
}

extern "C" tm_rc tm_k_rope_kv_bf16(const tm_k_rope_kv_bf16_args *a, cudaStream_t s,
                                   tm_err *err) {
    if (a->n_tok == 0)
        return TM_OK;
    TM_ASSERT(a->head_dim > 0 && a->head_dim % 2 == 0 && a->n_head > 0 && a->n_kv_head > 0);
    TM_ASSERT(a->q && a->k_cache && a->v_cache && a->qkv && a->pos && a->slot && a->inv_freq);
    const uint32_t items = tm_rope_kv_items(a->n_head, a->n_kv_head, a->head_dim);
    rope_kv_bf16_kernel<128><<<dim3(a->n_tok, TM_CEIL_DIV(items, 128u)), 128, 0, s>>>(*a);
    return tm_cuda_launched(err, s, "rope_kv_bf16");
}
