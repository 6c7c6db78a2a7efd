/* runner/tp/tp_host.h - tokenmill's own all-reduce and all-gather over host shared memory, for
 * tensor-parallel ranks that are processes of one machine. It exists so that 2-4 ranks can share
 * ONE GPU to check a model's sharding (NCCL refuses two ranks on one device): it is a correctness
 * transport, not a fast one (every collective is a device-to-host copy, two barriers in shared
 * memory and a host-to-device copy; docs/multinode.md "One GPU, several ranks").
 *
 * The ranks map one POSIX shared-memory segment named from the job's 128-byte id (the bytes the
 * rendezvous already hands around as the NCCL id), so no extra exchange is needed. Each collective
 * works in chunks of TM_TP_HOST_CHUNK_BYTES: every rank copies its chunk into its slot, a barrier,
 * every rank reads the slots, a barrier. The sum is taken in rank order 0, 1, ..., so every rank
 * gets the same bits (bf16: summed in fp32, rounded once to nearest even).
 *
 * Failure: a rank that never arrives makes the others' barrier fail after the timeout (TM_E_IO
 * naming the barrier); tm_tp_host_abort (any thread, e.g. a watchdog) sets a flag in the segment
 * that makes every rank's current and later collective fail at once (TM_E_IO, "aborted"). A
 * communicator is used by one thread at a time besides abort. Plain C, no CUDA: the CUDA driver
 * copies device buffers through host staging and calls this. Does not: pick the id, or find its
 * peers (runner/tp/rendezvous.h). */
#ifndef TM_RUNNER_TP_TP_HOST_H
#define TM_RUNNER_TP_TP_HOST_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"

#define TM_TP_HOST_ID_BYTES 128           /* = TM_NCCL_ID_BYTES */
#define TM_TP_HOST_MAX_RANKS 8            /* ranks of one communicator at most */
#define TM_TP_HOST_CHUNK_BYTES (1u << 20) /* one rank's slot in the segment */

typedef struct tm_tp_host tm_tp_host; /* opaque: one rank's communicator */

typedef enum tm_tp_host_dtype {
    TM_TP_HOST_F32,
    TM_TP_HOST_BF16,
    TM_TP_HOST_U32,
} tm_tp_host_dtype;

/* Join the communicator of id as rank of world (2 .. TM_TP_HOST_MAX_RANKS): map the segment
 * (created by whichever rank comes first) and wait for every rank, at most timeout_ms (0: no
 * limit); the segment's name is unlinked once all have joined, so nothing stays in /dev/shm after
 * the job. timeout_ms also bounds every later barrier. On success *out owns the communicator.
 * Errors: TM_E_INVAL (world or rank out of range), TM_E_IO (shm_open/mmap failed, or a rank did
 * not join in time), TM_E_NOMEM. */
tm_rc tm_tp_host_create(const uint8_t id[TM_TP_HOST_ID_BYTES], uint32_t rank, uint32_t world,
                        uint32_t timeout_ms, tm_tp_host **out, tm_err *err);
/* Unmap the segment. NULL is a no-op. */
void tm_tp_host_destroy(tm_tp_host *c);
/* Make every rank's current and later collective fail (TM_E_IO). Idempotent; thread-safe against
 * the collectives. NULL: no-op. */
void tm_tp_host_abort(tm_tp_host *c);
/* TM_OK, or TM_E_IO if any rank aborted the communicator. */
tm_rc tm_tp_host_check(tm_tp_host *c, tm_err *err);

/* In-place sum of buf[0..n) (host memory) across all ranks, in rank order. */
tm_rc tm_tp_host_allreduce_sum(tm_tp_host *c, void *buf, size_t n, tm_tp_host_dtype dt,
                               tm_err *err);
/* recv[r * n + i] = send_of_rank_r[i] for i < n (host memory; recv holds world * n elements). */
tm_rc tm_tp_host_allgather(tm_tp_host *c, const void *send, void *recv, size_t n,
                           tm_tp_host_dtype dt, tm_err *err);

#endif /* TM_RUNNER_TP_TP_HOST_H */
