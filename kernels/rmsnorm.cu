/* kernels/rmsnorm.cu - RMSNorm fp32 -> bf16 (see rmsnorm.h). One block per row; the sum of
 * squares is a block reduction, so its rounding order differs from the host's (fp32 either
 * way). */
#include "kernels/common.cuh"
#include "kernels/rmsnorm.h"

template <int BLOCK>
static __global__ void rmsnorm_bf16_kernel(uint16_t *out, const float *x, const uint32_t *rows,
                                           const float *w, uint32_t n_col, float eps) {
    const size_t r = blockIdx.x;
    const float *row = x + (size_t)(rows ? rows[r] : r) * n_col;
    uint16_t *o = out + r * n_col;
    float ss = 0.0f;
    if (n_col % 4 == 0) {
        // 16-byte loads, unrolled so that a thread's loads are in flight together
        const float4 *row4 = reinterpret_cast<const float4 *>(row);
#pragma unroll 4
        for (uint32_t c = threadIdx.x; c < n_col / 4; c += BLOCK) {
            const float4 v = row4[c];
            ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        }
        const float scale = 1.0f / sqrtf(tm_block_sum<BLOCK>(ss) / (float)n_col + eps);
        const float4 *w4 = reinterpret_cast<const float4 *>(w);
#pragma unroll 4
        for (uint32_t c = threadIdx.x; c < n_col / 4; c += BLOCK) {
            const float4 v = row4[c], g = w4[c];
            const uint32_t lo =
                tm_f2bf(g.x * (v.x * scale)) | (uint32_t)tm_f2bf(g.y * (v.y * scale)) << 16;
            const uint32_t hi =
                tm_f2bf(g.z * (v.z * scale)) | (uint32_t)tm_f2bf(g.w * (v.w * scale)) << 16;
            reinterpret_cast<uint2 *>(o)[c] = make_uint2(lo, hi);
        }
        return;
    }
    for (uint32_t c = threadIdx.x; c < n_col; c += BLOCK)
        ss += row[c] * row[c];
    const float scale = 1.0f / sqrtf(tm_block_sum<BLOCK>(ss) / (float)n_col + eps);
    for (uint32_t c = threadIdx.x; c < n_col; c += BLOCK)
        o[c] = tm_f2bf(w[c] * (row[c] * scale));
}

extern "C" tm_rc tm_k_rmsnorm_bf16(const tm_k_rmsnorm_bf16_args *a, cudaStream_t s, tm_err *err) {
    if (a->n_row == 0)
        return TM_OK;
    TM_ASSERT(a->n_col > 0 && a->out && a->x && a->w);
    // the vector path needs 16-byte aligned rows (cudaMalloc'd buffers, n_col % 4 == 0)
    TM_ASSERT(a->n_col % 4 || ((uintptr_t)a->x % 16 == 0 && (uintptr_t)a->w % 16 == 0 &&
                               (uintptr_t)a->out % 8 == 0));
    rmsnorm_bf16_kernel<256>
        <<<a->n_row, 256, 0, s>>>(a->out, a->x, a->rows, a->w, a->n_col, a->eps);
    return tm_cuda_launched(err, s, "rmsnorm_bf16");
}
