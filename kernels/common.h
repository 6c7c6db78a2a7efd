/* kernels/common.h - CUDA status codes into tm_err, for the kernel launchers and the CUDA
 * engine, runner/engine/cuda/ (the only runner directory that includes kernels/ headers). A CUDA
 * runtime error is turned into TM_E_CUDA straight away, with cudaGetErrorString's text in err->msg.
 * Plain C; safe to include from .cu files. No state. */
#ifndef TM_KERNELS_COMMON_H
#define TM_KERNELS_COMMON_H

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "base/err.h" /* C declarations: C linkage also from .cu files */

/* TM_OK if e is cudaSuccess; otherwise fills err with TM_E_CUDA, "<what>: <cuda text>" and the
 * caller's file:line, and returns TM_E_CUDA. */
tm_rc tm_cuda_check(cudaError_t e, const char *what, const char *file, int line, tm_err *err);
#define TM_CUDA_CHECK(call, err) tm_cuda_check((call), #call, __FILE__, __LINE__, (err))

/* Ends every launcher: checks cudaGetLastError() (bad launch configuration, a sticky earlier
 * fault) and names the kernel in the message. Built with -DTM_CUDA_SYNC=1 it also synchronizes
 * stream s, so that an asynchronous fault is reported by the launcher that caused it. */
tm_rc tm_cuda_launched(tm_err *err, cudaStream_t s, const char *name);

#ifdef __cplusplus
}
#endif

#endif /* TM_KERNELS_COMMON_H */
