/* kernels/rmsnorm.cu - RMSNorm fp32 -> bf16, optionally after the residual add of split-K
 * partials (see rmsnorm.h). One block per row; each thread adds the partials into its own
 * columns of x and reads them back for the norm (no barrier needed between the two); the sum of
 * squares is a block reduction, so its rounding order differs from the host's (fp32 either
 * way). */
#include "kernels/common.cuh"
#include "kernels/rmsnorm.h"

template <int BLOCK> static __global__ void rmsnorm_bf16_kernel(tm_k_rmsnorm_bf16_args a) {
    const size_t r = blockIdx.x;
    const uint32_t n_col = a.n_col;
    const float *w = a.w;
    const float eps = a.eps;
    const size_t xr = a.rows ? a.rows[r] : r;
    float *row = a.x + xr * n_col;
    uint16_t *o = a.out + r * n_col;
    float ss = 0.0f;
    if (n_col % 4 == 0) {
        // 16-byte loads, unrolled so that a thread's loads are in flight together
        float4 *row4 = reinterpret_cast<float4 *>(row);
        if (a.add) { // the residual add first: x += partials, in split order, written back
            const float4 *p4 = reinterpret_cast<const float4 *>(a.add + xr * n_col);
            const size_t st4 = a.add_stride / 4;
            for (uint32_t c = threadIdx.x; c < n_col / 4; c += BLOCK) {
                float4 v = row4[c];
#pragma unroll 8
                for (uint32_t p = 0; p < a.n_add; p++) {
                    const float4 d = p4[p * st4 + c];
                    v.x += d.x;
                    v.y += d.y;
                    v.z += d.z;
                    v.w += d.w;
                }
                row4[c] = v;
            }
        }
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
            const uint32_t lo = tm_f2bf(g.x * (v.x * scale)) |
                                (uint32_t)tm_f2bf(g.y * (v.y * scale)) << 16;
            const uint32_t hi = tm_f2bf(g.z * (v.z * scale)) |
                                (uint32_t)tm_f2bf(g.w * (v.w * scale)) << 16;
            reinterpret_cast<uint2 *>(o)[c] = make_uint2(lo, hi);
        }
        return;
    }
    if (a.add) {
        for (uint32_t c = threadIdx.x; c < n_col; c += BLOCK) {
            float v = row[c];
            for (uint32_t p = 0; p < a.n_add; p++)
                v += a.add[p * a.add_stride + xr * n_col + c];
            row[c] = v;
        }
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
