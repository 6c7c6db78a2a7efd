/* runner/engine/cuda/weights.c - host-to-device weight copies and random benchmark weights shared
 * by the CUDA architectures (runner/engine/cuda/weights.h). */
#include "runner/engine/cuda/weights.h"

#include <math.h>

#include "base/alloc.h"
#include "kernels/common.h"
#include "kernels/fill.h"
#include "runner/engine/cuda/engine_cuda_int.h"

tm_rc tm_cuda_h2d(void *dst, const void *src, size_t n, tm_err *err) {
    return TM_CUDA_CHECK(cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice), err);
}

tm_rc tm_cuda_upload_bf16(uint16_t *dst, const tm_tensor *t, uint16_t *stage, float *fb,
                          tm_err *err) {
    const size_t n = (size_t)tm_tensor_n_elem(t);
    if (!t->quant && t->dtype == TM_DTYPE_BF16)
        return tm_cuda_h2d(dst, t->data, n * 2, err);
    if (!t->quant) { // element chunks
        for (size_t i = 0; i < n; i += TM_CUDA_UPLOAD_CHUNK) {
            const size_t k = TM_MIN(TM_CUDA_UPLOAD_CHUNK, n - i);
            tm_dtype_to_f32(t->data, t->dtype, i, k, fb);
            for (size_t j = 0; j < k; j++)
                stage[j] = tm_f32_to_bf16(fb[j]);
            tm_rc rc = tm_cuda_h2d(dst + i, stage, k * 2, err);
            if (rc)
                return rc;
        }
        return TM_OK;
    }
    // quantized: whole rows, dequantized as the CPU engine reads them
    const size_t C = t->shape[t->n_dim - 1];
    const size_t rows_per = TM_MAX((size_t)1, TM_CUDA_UPLOAD_CHUNK / C);
    for (size_t r0 = 0; r0 < n / C; r0 += rows_per) {
        const size_t nr = TM_MIN(rows_per, n / C - r0);
        for (size_t r = 0; r < nr; r++)
            tm_tensor_row_f32(t, r0 + r, fb + r * C);
        for (size_t i = 0; i < nr * C; i++)
            stage[i] = tm_f32_to_bf16(fb[i]);
        tm_rc rc = tm_cuda_h2d(dst + r0 * C, stage, nr * C * 2, err);
        if (rc)
            return rc;
    }
    return TM_OK;
}

tm_rc tm_cuda_fill_bf16(tm_cuda_engine *impl, uint16_t *p, size_t n_out, size_t n_in, uint64_t seed,
                        tm_err *err) {
    // uniform [-a, a) has std a/sqrt(3); aim for std 1/sqrt(n_in)
    tm_k_fill_bf16_args fa = {.p = p,
                              .n = n_out * n_in,
                              .seed = seed,
                              .scale = sqrtf(3.0f / (float)n_in),
                              .offset = 0.0f};
    return tm_k_fill_bf16(&fa, impl->stream, err);
}

tm_rc tm_cuda_fill_f32(float *dst, size_t n, uint64_t seed, float scale, float offset, float *fb,
                       tm_err *err) {
    float *own = NULL;
    if (!fb) {
        own = fb = tm_malloc(TM_MIN(n, TM_CUDA_UPLOAD_CHUNK) * sizeof(float) + 1);
        if (!own)
            return TM_ERR(err, TM_E_NOMEM, "cuda engine: %zu floats", n);
    }
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    tm_rc rc = TM_OK;
    for (size_t i0 = 0; !rc && i0 < n; i0 += TM_CUDA_UPLOAD_CHUNK) {
        const size_t k = TM_MIN(TM_CUDA_UPLOAD_CHUNK, n - i0);
        for (size_t i = 0; i < k; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            fb[i] = offset + scale * (float)((double)(s >> 11) * 0x1p-52 - 1.0);
        }
        rc = tm_cuda_h2d(dst + i0, fb, k * sizeof(float), err);
    }
    tm_free(own);
    return rc;
}
