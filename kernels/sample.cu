/* kernels/sample.cu - argmax per row (see sample.h): one block per row (tm_block_argmax: the
 * larger value, the lower index on ties). */
#include "kernels/common.cuh"
#include "kernels/sample.h"

template <int BLOCK>
static __global__ void argmax_f32_kernel(uint32_t *ids, const float *logits, uint32_t n_col,
                                         uint32_t n_limit) {
    float v;
    uint32_t i;
    const bool bad = tm_block_argmax<BLOCK>(logits + (size_t)blockIdx.x * n_col, n_limit, &v, &i);
    if (threadIdx.x == 0)
        ids[blockIdx.x] = bad ? UINT32_MAX : i;
}

extern "C" tm_rc tm_k_argmax_f32(const tm_k_argmax_f32_args *a, cudaStream_t s, tm_err *err) {
    if (a->n_row == 0)
        return TM_OK;
    TM_ASSERT(a->n_col > 0 && a->ids && a->logits);
    const uint32_t n_limit = a->n_limit && a->n_limit < a->n_col ? a->n_limit : a->n_col;
    argmax_f32_kernel<1024><<<a->n_row, 1024, 0, s>>>(a->ids, a->logits, a->n_col, n_limit);
    return tm_cuda_launched(err, s, "argmax_f32");
}
