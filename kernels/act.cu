/* kernels/act.cu - SwiGLU (see act.h; the element's code in kernels/act.cuh). Grid-stride over
 * n_tok * n_ff elements. */
#include "kernels/act.cuh"

static __global__ void silu_mul_bf16_kernel(tm_k_silu_mul_bf16_args a) {
    const size_t n = (size_t)a.n_tok * a.n_ff;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        tm_silu_mul_item(a, i);
}

extern "C" tm_rc tm_k_silu_mul_bf16(const tm_k_silu_mul_bf16_args *a, cudaStream_t s,
                                    tm_err *err) {
    if (a->n_tok == 0)
        return TM_OK;
    TM_ASSERT(a->n_ff > 0 && a->out && a->gu);
    const size_t n = (size_t)a->n_tok * a->n_ff;
    const size_t want = TM_CEIL_DIV(n, (size_t)256);
    const unsigned grid = (unsigned)TM_MIN(want, (size_t)132 * 16);
    silu_mul_bf16_kernel<<<grid, 256, 0, s>>>(*a);
    return tm_cuda_launched(err, s, "silu_mul_bf16");
}
