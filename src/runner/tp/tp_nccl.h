/* runner/tp/tp_nccl.h - the NCCL wrapper of tensor parallel (the only file that includes nccl.h):
 * unique id, one communicator per rank (one process per GPU), all-reduce (sum) and all-gather on
 * the caller's CUDA stream, abort after a peer died. ncclResult_t is turned into TM_E_NCCL here,
 * with ncclGetErrorString / ncclGetLastError's text in the message. Streams are passed as void *
 * (a cudaStream_t) so that this header needs no CUDA header.
 *
 * Collectives may be captured into CUDA graphs (NCCL supports stream capture); every rank must
 * issue the same collectives in the same order. A communicator is used by one thread at a time,
 * except that tm_nccl_abort and tm_nccl_check may come from a watchdog thread while another is
 * inside a collective (as PyTorch's watchdog does): after an abort every call fails fast.
 * Built without CUDA (-DTM_CUDA=OFF), every function fails with TM_E_INVAL ("built without
 * NCCL") and tm_nccl_version gives 0. Does not: pick devices (the caller calls cudaSetDevice
 * first), or find its peers (runner/tp/rendezvous.h hands the id around). */
#ifndef TM_RUNNER_TP_TP_NCCL_H
#define TM_RUNNER_TP_TP_NCCL_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"

#define TM_NCCL_ID_BYTES 128 /* NCCL_UNIQUE_ID_BYTES */

typedef struct tm_nccl tm_nccl; /* opaque: a communicator */

typedef enum tm_nccl_dtype {
    TM_NCCL_F32,
    TM_NCCL_BF16,
    TM_NCCL_U32,
} tm_nccl_dtype;

/* Rank 0: a new unique id (opens NCCL's bootstrap listener; call it once per job). */
tm_rc tm_nccl_get_id(uint8_t id[TM_NCCL_ID_BYTES], tm_err *err);

/* Join the communicator named by id as rank of world, on the current CUDA device. Blocks until
 * every rank has joined, at most timeout_ms (0: no limit). On success *out owns it. Errors:
 * TM_E_NCCL (NCCL's failure, or the timeout: a rank never joined; the init then goes on in the
 * background and its communicator is aborted if it ever completes). */
tm_rc tm_nccl_create(const uint8_t id[TM_NCCL_ID_BYTES], uint32_t rank, uint32_t world,
                     uint32_t timeout_ms, tm_nccl **out, tm_err *err);
/* Free the communicator (ncclCommDestroy unless it was aborted); NULL is a no-op. */
void tm_nccl_destroy(tm_nccl *c);
/* ncclCommAbort: kernels and host calls waiting on dead peers return, and every later call on c
 * fails with TM_E_NCCL. c itself stays valid until tm_nccl_destroy. Idempotent; thread-safe
 * against the other calls (see above). NULL: no-op. */
void tm_nccl_abort(tm_nccl *c);

/* In-place sum of buf[0..n) across all ranks, enqueued on stream. */
tm_rc tm_nccl_allreduce_sum(tm_nccl *c, void *buf, size_t n, tm_nccl_dtype dt, void *stream,
                            tm_err *err);
/* recv[r * n + i] = send_of_rank_r[i] for i < n, enqueued on stream. recv holds world * n. */
tm_rc tm_nccl_allgather(tm_nccl *c, const void *send, void *recv, size_t n, tm_nccl_dtype dt,
                        void *stream, tm_err *err);
/* TM_OK, or TM_E_NCCL with NCCL's text if an asynchronous error (a network failure) occurred. */
tm_rc tm_nccl_check(tm_nccl *c, tm_err *err);

/* Version of the NCCL library loaded at run time (e.g. 22803 for 2.28.3; 0 without NCCL) and the
 * one the headers had at build time. */
int tm_nccl_version(void);
int tm_nccl_header_version(void);

#endif /* TM_RUNNER_TP_TP_NCCL_H */
