/* kernels/act.cuh - SwiGLU of one element (kernels/act.h), device code shared by its own kernel
 * and the decode chain (kernels/chain.h). */
#ifndef TM_KERNELS_ACT_CUH
#define TM_KERNELS_ACT_CUH

#include "kernels/act.h"
#include "kernels/common.cuh"

/* Element i of out ([n_tok][n_ff]). */
static __device__ __forceinline__ void tm_silu_mul_item(const tm_k_silu_mul_bf16_args &a,
                                                        size_t i) {
    const size_t n_ff = a.n_ff, t = i / n_ff, c = i % n_ff;
    float g = a.gu[t * 2 * n_ff + c], u = a.gu[t * 2 * n_ff + n_ff + c];
    for (uint32_t p = 1; p < a.n_part; p++) { // split-K partials, in order
        g += a.gu[p * a.part_stride + t * 2 * n_ff + c];
        u += a.gu[p * a.part_stride + t * 2 * n_ff + n_ff + c];
    }
    a.out[i] = tm_f2bf(g / (1.0f + expf(-g)) * u);
}

#endif /* TM_KERNELS_ACT_CUH */
