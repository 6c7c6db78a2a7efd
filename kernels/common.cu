/* kernels/common.cu - the launchers' error glue (see common.h). */
#include "kernels/common.h"

extern "C" tm_rc tm_cuda_check(cudaError_t e, const char *what, const char *file, int line,
                               tm_err *err) {
    if (e == cudaSuccess)
        return TM_OK;
    return tm_err_set(err, TM_E_CUDA, file, line, "%s: %s (%s)", what, cudaGetErrorString(e),
                      cudaGetErrorName(e));
}

extern "C" tm_rc tm_cuda_launched(tm_err *err, cudaStream_t s, const char *name) {
    cudaError_t e = cudaGetLastError();
#if defined(TM_CUDA_SYNC) && TM_CUDA_SYNC
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(s);
#else
    (void)s;
#endif
    if (e == cudaSuccess)
        return TM_OK;
    return TM_ERR(err, TM_E_CUDA, "kernel %s: %s (%s)", name, cudaGetErrorString(e),
                  cudaGetErrorName(e));
}
