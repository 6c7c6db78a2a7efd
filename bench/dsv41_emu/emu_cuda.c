/* bench/dsv41_emu/emu_cuda.c - the CUDA runtime calls of runner/engine/cuda/dsv41.c,
 * dsv41_engram.c and weights.c done on the host (device memory is host memory, streams and
 * events are no-ops, copies are memcpy), so that the DeepSeek-V4.1 CUDA engine's host code can
 * run against host transliterations of its kernels (emu_kernels.c) on a machine without a GPU.
 * CUDA graphs: between cudaStreamBeginCapture and cudaStreamEndCapture the kernel launchers
 * (emu_kernels.c) and the device-to-device copies record their arguments instead of running;
 * cudaGraphLaunch replays the records in order. Inside a capture every call a graph must not hold
 * (host copies, syncs, events) fails, so that dsv41.c's segments are checked to be pure device
 * work. A checking tool, not part of any build (bench/dsv41_emu/run.sh). */
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "base/err.h"
#include "kernels/fill.h"

/* ---- graphs ---- */

typedef struct emu_call {
    void (*run)(const void *args);
    unsigned char args[512];
} emu_call;
struct CUgraph_st {
    emu_call *c;
    size_t n, cap;
};
struct CUgraphExec_st {
    emu_call *c;
    size_t n;
};
static struct CUgraph_st *g_cap; /* the graph being captured, or NULL */

int emu_capturing(void) { return g_cap != NULL; }

void emu_record(void (*run)(const void *args), const void *args, size_t n) {
    TM_ASSERT(g_cap && n <= sizeof(g_cap->c[0].args));
    if (g_cap->n == g_cap->cap) {
        g_cap->cap = g_cap->cap ? 2 * g_cap->cap : 64;
        g_cap->c = realloc(g_cap->c, g_cap->cap * sizeof(emu_call));
        TM_ASSERT(g_cap->c);
    }
    emu_call *c = &g_cap->c[g_cap->n++];
    c->run = run;
    memcpy(c->args, args, n);
}

cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode m) {
    (void)s, (void)m;
    if (g_cap)
        return cudaErrorIllegalState;
    g_cap = calloc(1, sizeof(*g_cap));
    return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g) {
    (void)s;
    if (!g_cap)
        return cudaErrorIllegalState;
    *g = g_cap;
    g_cap = NULL;
    return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *x, cudaGraph_t g, unsigned long long f) {
    (void)f;
    *x = calloc(1, sizeof(**x));
    (*x)->n = g->n;
    (*x)->c = malloc((g->n ? g->n : 1) * sizeof(emu_call));
    if (g->n)
        memcpy((*x)->c, g->c, g->n * sizeof(emu_call));
    return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t x, cudaStream_t s) {
    (void)s;
    if (g_cap)
        return cudaErrorIllegalState;
    for (size_t i = 0; i < x->n; i++)
        x->c[i].run(x->c[i].args);
    return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t g) {
    free(g->c);
    free(g);
    return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t x) {
    free(x->c);
    free(x);
    return cudaSuccess;
}

typedef struct copy_a {
    void *dst;
    size_t dp;
    const void *src;
    size_t sp, w, h;
} copy_a;
static void run_copy(const void *p) {
    const copy_a *a = p;
    for (size_t r = 0; r < a->h; r++)
        memmove((char *)a->dst + r * a->dp, (const char *)a->src + r * a->sp, a->w);
}
/* A copy inside a capture: device to device only (recorded); others fail. 1: recorded. */
static int capture_copy(void *dst, size_t dp, const void *src, size_t sp, size_t w, size_t h,
                        enum cudaMemcpyKind k, cudaError_t *e) {
    if (!g_cap)
        return 0;
    *e = cudaSuccess;
    if (k != cudaMemcpyDeviceToDevice) {
        *e = cudaErrorStreamCaptureUnsupported;
        return 1;
    }
    const copy_a a = {dst, dp, src, sp, w, h};
    emu_record(run_copy, &a, sizeof(a));
    return 1;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind k,
                            cudaStream_t s) {
    (void)s;
    cudaError_t e;
    if (capture_copy(dst, n, src, n, n, 1, k, &e))
        return e;
    memmove(dst, src, n);
    return cudaSuccess;
}
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind k) {
    (void)k;
    if (g_cap)
        return cudaErrorStreamCaptureUnsupported;
    memmove(dst, src, n);
    return cudaSuccess;
}
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dp, const void *src, size_t sp, size_t w, size_t h,
                              enum cudaMemcpyKind k, cudaStream_t s) {
    (void)s;
    cudaError_t e;
    if (capture_copy(dst, dp, src, sp, w, h, k, &e))
        return e;
    for (size_t r = 0; r < h; r++)
        memmove((char *)dst + r * dp, (const char *)src + r * sp, w);
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    (void)s;
    if (g_cap) // not in a segment's graph
        return cudaErrorStreamCaptureUnsupported;
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    (void)e;
    if (g_cap) // not in a segment's graph
        return cudaErrorStreamCaptureUnsupported;
    return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int f) {
    (void)s, (void)e, (void)f;
    if (g_cap) // not in a segment's graph
        return cudaErrorStreamCaptureUnsupported;
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    (void)e, (void)s;
    if (g_cap) // not in a segment's graph
        return cudaErrorStreamCaptureUnsupported;
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
cudaError_t cudaMemset(void *p, int v, size_t n) {
    if (g_cap)
        return cudaErrorStreamCaptureUnsupported;
    memset(p, v, n);
    return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) {
    return g_cap ? cudaErrorStreamCaptureUnsupported : cudaSuccess;
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
