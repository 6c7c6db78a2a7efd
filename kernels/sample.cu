/* kernels/sample.cu - argmax per row (see sample.h). One block per row; each thread keeps its
 * best (value, index) and whether it saw a non-finite value, then a shared-memory tree keeps the
 * larger value, the lower index on ties. */
#include "kernels/common.cuh"
#include "kernels/sample.h"

template <int BLOCK>
static __global__ void argmax_f32_kernel(uint32_t *ids, const float *logits, uint32_t n_col,
                                         uint32_t n_limit) {
    __shared__ float sv[BLOCK];
    __shared__ uint32_t si[BLOCK];
    const float *row = logits + (size_t)blockIdx.x * n_col;
    float best = -INFINITY;
    uint32_t bi = UINT32_MAX;
    int bad = 0;
    for (uint32_t c = threadIdx.x; c < n_limit; c += BLOCK) { // hot loop: the vocabulary
        const float v = row[c];
        bad |= !isfinite(v);
        if (v > best || bi == UINT32_MAX) {
            best = v;
            bi = c;
        }
    }
    bad = __syncthreads_or(bad);
    sv[threadIdx.x] = best;
    si[threadIdx.x] = bi;
    __syncthreads();
    for (int w = BLOCK / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) {
            const float ov = sv[threadIdx.x + w];
            const uint32_t oi = si[threadIdx.x + w];
            const float mv = sv[threadIdx.x];
            const uint32_t mi = si[threadIdx.x];
            if (oi != UINT32_MAX && (mi == UINT32_MAX || ov > mv || (ov == mv && oi < mi))) {
                sv[threadIdx.x] = ov;
                si[threadIdx.x] = oi;
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0)
        ids[blockIdx.x] = bad ? UINT32_MAX : si[0];
}

extern "C" tm_rc tm_k_argmax_f32(const tm_k_argmax_f32_args *a, cudaStream_t s, tm_err *err) {
    if (a->n_row == 0)
        return TM_OK;
    TM_ASSERT(a->n_col > 0 && a->ids && a->logits);
    const uint32_t n_limit = a->n_limit && a->n_limit < a->n_col ? a->n_limit : a->n_col;
    argmax_f32_kernel<1024><<<a->n_row, 1024, 0, s>>>(a->ids, a->logits, a->n_col, n_limit);
    return tm_cuda_launched(err, s, "argmax_f32");
}
