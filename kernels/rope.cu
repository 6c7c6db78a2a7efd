/* kernels/rope.cu - bias + RoPE + KV cache write (see rope.h). The angle is
 * (float)pos * inv_freq[i], rounded once as on the host; sincosf is CUDA's full-range version
 * (no fast math), within 2 ulp of the host's cosf/sinf. */
#include "kernels/common.cuh"
#include "kernels/kv_fp8.cuh"
#include "kernels/rope.h"

/* grid (n_tok, ceil(items / BLOCK)): items of a token are its rotation pairs (q and k heads),
 * then its v elements; one item per thread. */
/* One K/V element into the cache: bf16, or with F8 an e4m3 byte. */
template <bool F8>
static __device__ __forceinline__ void kv_put(uint16_t *cache, size_t i, float x) {
    if constexpr (F8)
        reinterpret_cast<uint8_t *>(cache)[i] = tm_kv_f2e4m3(x);
    else
        cache[i] = tm_f2bf(x);
}

template <int BLOCK, bool F8> static __global__ void rope_kv_bf16_kernel(tm_k_rope_kv_bf16_args a) {
    const size_t t = blockIdx.x;
    const uint32_t hd = a.head_dim, half = hd / 2;
    const uint32_t qd = a.n_head * hd, kvd = a.n_kv_head * hd, ld = qd + 2 * kvd;
    const float *row = a.qkv + t * ld;
    const size_t slot = a.slot[t];
    const uint32_t n_pair = (a.n_head + a.n_kv_head) * half;
    const uint32_t j = blockIdx.y * BLOCK + threadIdx.x;
    if (j < n_pair) {
        const uint32_t head = j / half, i = j % half;
        const uint32_t c0 = head * hd + i, c1 = c0 + half; // columns in the qkv row
        float x0 = row[c0], x1 = row[c1];
        for (uint32_t p = 1; p < a.n_part; p++) { // split-K partials, in order
            x0 += row[p * a.part_stride + c0];
            x1 += row[p * a.part_stride + c1];
        }
        if (a.bias) {
            x0 += a.bias[c0];
            x1 += a.bias[c1];
        }
        float sn, cs;
        sincosf((float)a.pos[t] * a.inv_freq[i], &sn, &cs);
        const float y0 = x0 * cs - x1 * sn, y1 = x1 * cs + x0 * sn;
        if (head < a.n_head) {
            a.q[t * qd + c0] = tm_f2bf(y0);
            a.q[t * qd + c1] = tm_f2bf(y1);
        } else {
            kv_put<F8>(a.k_cache, slot * kvd + (c0 - qd), y0);
            kv_put<F8>(a.k_cache, slot * kvd + (c1 - qd), y1);
        }
    } else if (j < n_pair + kvd) {
        const uint32_t c = j - n_pair;
        float v = row[qd + kvd + c];
        for (uint32_t p = 1; p < a.n_part; p++)
            v += row[p * a.part_stride + qd + kvd + c];
        if (a.bias)
            v += a.bias[qd + kvd + c];
        kv_put<F8>(a.v_cache, slot * kvd + c, v);
    }
}

extern "C" tm_rc tm_k_rope_kv_bf16(const tm_k_rope_kv_bf16_args *a, cudaStream_t s, tm_err *err) {
    if (a->n_tok == 0)
        return TM_OK;
    TM_ASSERT(a->head_dim > 0 && a->head_dim % 2 == 0 && a->n_head > 0 && a->n_kv_head > 0);
    TM_ASSERT(a->q && a->k_cache && a->v_cache && a->qkv && a->pos && a->slot && a->inv_freq);
    const uint32_t items = (a->n_head + a->n_kv_head) * (a->head_dim / 2) +
                           a->n_kv_head * a->head_dim;
    const dim3 grid(a->n_tok, TM_CEIL_DIV(items, 128u));
    if (a->kv_fp8)
        rope_kv_bf16_kernel<128, true><<<grid, 128, 0, s>>>(*a);
    else
        rope_kv_bf16_kernel<128, false><<<grid, 128, 0, s>>>(*a);
    return tm_cuda_launched(err, s, "rope_kv_bf16");
}
