/* kernels/act.cu - SwiGLU (see act.h). Grid-stride over n_tok * n_ff elements. */
#include "kernels/act.h"
#include "kernels/common.cuh"

static __global__ void silu_mul_bf16_kernel(uint16_t *out, const float *gu, uint32_t n_ff, size_t n,
                                            uint32_t n_part, size_t part_stride) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t t = i / n_ff, c = i % n_ff;
        float g = gu[t * 2 * n_ff + c], u = gu[t * 2 * n_ff + n_ff + c];
        for (uint32_t p = 1; p < n_part; p++) { // split-K partials, in order
            g += gu[p * part_stride + t * 2 * n_ff + c];
            u += gu[p * part_stride + t * 2 * n_ff + n_ff + c];
        }
        out[i] = tm_f2bf(g / (1.0f + expf(-g)) * u);
    }
}

extern "C" tm_rc tm_k_silu_mul_bf16(const tm_k_silu_mul_bf16_args *a, cudaStream_t s, tm_err *err) {
    if (a->n_tok == 0)
        return TM_OK;
    TM_ASSERT(a->n_ff > 0 && a->out && a->gu);
    const size_t n = (size_t)a->n_tok * a->n_ff;
    const size_t want = TM_CEIL_DIV(n, (size_t)256);
    const unsigned grid = (unsigned)TM_MIN(want, (size_t)132 * 16);
    silu_mul_bf16_kernel<<<grid, 256, 0, s>>>(a->out, a->gu, a->n_ff, n, a->n_part, a->part_stride);
    return tm_cuda_launched(err, s, "silu_mul_bf16");
}
