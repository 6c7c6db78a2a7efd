/* bench/dsv41_emu/emu_cuda.c - the CUDA runtime calls of runner/engine/cuda/dsv41.c,
 * dsv41_engram.c and weights.c done on the host (device memory is host memory, streams and
 * events are no-ops, copies are memcpy), so that the DeepSeek-V4.1 CUDA engine's host code can
 * run against host transliterations of its kernels (emu_kernels.c) on a machine without a GPU.
 * A checking tool, not part of any build (bench/dsv41_emu/run.sh). */
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "base/err.h"
#include "kernels/fill.h"

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind k,
                            cudaStream_t s) {
    (void)k, (void)s;
    memmove(dst, src, n);
    return cudaSuccess;
}
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind k) {
    (void)k;
    memmove(dst, src, n);
    return cudaSuccess;
}
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dp, const void *src, size_t sp, size_t w, size_t h,
                              enum cudaMemcpyKind k, cudaStream_t s) {
    (void)k, (void)s;
    for (size_t r = 0; r < h; r++)
        memmove((char *)dst + r * dp, (const char *)src + r * sp, w);
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    (void)s;
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    (void)e;
    return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int f) {
    (void)s, (void)e, (void)f;
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    (void)e, (void)s;
    return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int f) {
    (void)f;
    *e = (cudaEvent_t)malloc(8);
    return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    free((void *)e);
    return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int f) {
    (void)f;
    *s = (cudaStream_t)malloc(8);
    return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    free((void *)s);
    return cudaSuccess;
}
cudaError_t cudaMalloc(void **p, size_t n) {
    *p = calloc(1, n ? n : 1);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned int f) {
    (void)f;
    return cudaMalloc(p, n);
}
cudaError_t cudaMallocHost(void **p, size_t n) { return cudaMalloc(p, n); }
cudaError_t cudaFree(void *p) {
    free(p);
    return cudaSuccess;
}
cudaError_t cudaFreeHost(void *p) {
    free(p);
    return cudaSuccess;
}
const char *cudaGetErrorString(cudaError_t e) {
    (void)e;
    return "emulated CUDA error";
}

tm_rc tm_cuda_check(cudaError_t e, const char *what, const char *file, int line, tm_err *err) {
    if (e == cudaSuccess)
        return TM_OK;
    return tm_err_set(err, TM_E_CUDA, file, line, "%s failed", what);
}
tm_rc tm_cuda_launched(tm_err *err, cudaStream_t s, const char *name) {
    (void)err, (void)s, (void)name;
    return TM_OK;
}
tm_rc tm_k_fill_bf16(const tm_k_fill_bf16_args *a, cudaStream_t s, tm_err *err) {
    (void)a, (void)s;
    return TM_ERR(err, TM_E_INTERNAL, "emu: no random fill");
}
