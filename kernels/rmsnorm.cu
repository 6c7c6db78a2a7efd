/* kernels/rmsnorm.cu - RMSNorm fp32 -> bf16, optionally after the residual add of split-K
 * partials (see rmsnorm.h). One block per row (kernels/rmsnorm.cuh). */
#include "kernels/rmsnorm.cuh"

template <int BLOCK> static __global__ void rmsnorm_bf16_kernel(tm_k_rmsnorm_bf16_args a) {
    tm_rmsnorm_row<BLOCK>(a, blockIdx.x);
}

extern "C" tm_rc tm_k_rmsnorm_bf16(const tm_k_rmsnorm_bf16_args *a, cudaStream_t s, tm_err *err) {
    if (a->n_row == 0)
        return TM_OK;
    TM_ASSERT(a->n_col > 0 && a->out && a->x && a->w);
    // the vector path needs 16-byte aligned rows (cudaMalloc'd buffers, n_col % 4 == 0)
    TM_ASSERT(a->n_col % 4 || ((uintptr_t)a->x % 16 == 0 && (uintptr_t)a->w % 16 == 0 &&
                               (uintptr_t)a->out % 8 == 0));
    TM_ASSERT(!a->add || (a->n_add >= 1 && (a->n_col % 4 || ((uintptr_t)a->add % 16 == 0 &&
                                                             a->add_stride % 4 == 0))));
    // With partials to add (decode: a few rows, each reading n_add partial rows) the row's
    // loads are spread over 1024 threads so that they are all in flight at once.
    if (a->add)
        rmsnorm_bf16_kernel<1024><<<a->n_row, 1024, 0, s>>>(*a);
    else
        rmsnorm_bf16_kernel<256><<<a->n_row, 256, 0, s>>>(*a);
    return tm_cuda_launched(err, s, "rmsnorm_bf16");
}
