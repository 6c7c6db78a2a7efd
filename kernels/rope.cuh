/* kernels/rope.cuh - bias + RoPE + KV cache write of one item (kernels/rope.h), device code
 * shared by its own kernel and the decode chain (kernels/chain.h). The angle is
 * (float)pos * inv_freq[i], rounded once as on the host; sincosf is CUDA's full-range version
 * (no fast math), within 2 ulp of the host's cosf/sinf. */
#ifndef TM_KERNELS_ROPE_CUH
#define TM_KERNELS_ROPE_CUH

#include "kernels/common.cuh"
#include "kernels/rope.h"

/* Items of a token: (n_head + n_kv_head) * head_dim / 2 pairs, then n_kv_head * head_dim v. */
static __host__ __device__ __forceinline__ uint32_t tm_rope_kv_items(uint32_t n_head,
                                                                     uint32_t n_kv_head,
                                                                     uint32_t head_dim) {
    return (n_head + n_kv_head) * (head_dim / 2) + n_kv_head * head_dim;
}

/* Item j of token t: its rotation pairs (q and k heads), then its v elements. */
static __device__ __forceinline__ void tm_rope_kv_item(const tm_k_rope_kv_bf16_args &a, size_t t,
                                                       uint32_t j) {
    const uint32_t hd = a.head_dim, half = hd / 2;
    const uint32_t qd = a.n_head * hd, kvd = a.n_kv_head * hd, ld = qd + 2 * kvd;
    const float *row = a.qkv + t * ld;
    const size_t slot = a.slot[t];
    const uint32_t n_pair = (a.n_head + a.n_kv_head) * half;
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
            a.k_cache[slot * kvd + (c0 - qd)] = tm_f2bf(y0);
            a.k_cache[slot * kvd + (c1 - qd)] = tm_f2bf(y1);
        }
    } else if (j < n_pair + kvd) {
        const uint32_t c = j - n_pair;
        float v = row[qd + kvd + c];
        for (uint32_t p = 1; p < a.n_part; p++)
            v += row[p * a.part_stride + qd + kvd + c];
        if (a.bias)
            v += a.bias[qd + kvd + c];
        a.v_cache[slot * kvd + c] = tm_f2bf(v);
    }
}

#endif /* TM_KERNELS_ROPE_CUH */
