/* runner/engine/cuda/dsv41_engram.h - Engram rows for the CUDA engine (DeepSeek-V4.1,
 * docs/deepseek_v41.md "CUDA"): the tables stay on the host's disk, read by the CPU engine's
 * reader (runner/model/engram_table.h: pread into its bounded row cache, reads issued ahead on its
 * threads); only the rows a step hashes to are dequantized into pinned host memory and copied to
 * the GPU on a copy stream of their own, so the copy overlaps the kernels of the layers before
 * the Engram layer, which waits for it with an event.
 *
 * One slot per Engram layer of the model (slot i: table tabs[i]), each with a pinned host buffer
 * and a device buffer of max_rows rows of dim fp32 (dim = the tables' dim, equal for all). A step:
 *   prefetch(slot, rows) for every slot as soon as the step's hash ids are known (returns at once);
 *   upload(slot, rows) per slot (blocks for rows not read yet, then queues the copy; returns
 *   before the copy ends), in the order the layers need them;
 *   wait(slot, compute_stream) before the Engram layer's kernels: the stream waits on the copy.
 * upload first waits for the slot's previous copy (the pinned buffer is reused), so a slot may
 * be uploaded once per step. Rows outside the rank's shard read as zeros (engram_table.h).
 *
 * Threading: one thread drives a stage (the engine's step thread). The stage borrows the tables
 * (they must outlive it). Never run on a GPU yet (tests/gpu/test_dsv41_engram_stage.c). */
#ifndef TM_RUNNER_ENGINE_CUDA_DSV41_ENGRAM_H
#define TM_RUNNER_ENGINE_CUDA_DSV41_ENGRAM_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "base/err.h"
#include "runner/model/engram_table.h"

typedef struct tm_dsv41_engram_stage tm_dsv41_engram_stage; /* opaque */

/* n_tab >= 1 tables of the same dim; max_rows >= 1 rows per slot per step. Allocates the pinned
 * and device buffers, the copy stream and the events. Errors: TM_E_INVAL (n_tab 0, max_rows 0,
 * tables of different dims, naming both), TM_E_CUDA, TM_E_NOMEM. On success *out owns them. */
tm_rc tm_dsv41_engram_stage_create(tm_engram_table *const *tabs, uint32_t n_tab, size_t max_rows,
                                   tm_dsv41_engram_stage **out, tm_err *err);
void tm_dsv41_engram_stage_destroy(tm_dsv41_engram_stage *st); /* NULL is a no-op; syncs */

/* Issue the reads of slot's rows ahead (engram_table's prefetch: a hint, never waits). */
void tm_dsv41_engram_stage_prefetch(tm_dsv41_engram_stage *st, uint32_t slot, const uint64_t *rows,
                                    size_t n);

/* The n <= max_rows rows of slot, dequantized into its pinned buffer, then copied to its device
 * buffer on the copy stream (queued: returns before the copy ends). Errors: TM_E_INVAL (slot or
 * n out of range), TM_E_IO (engram_table_get), TM_E_CUDA. */
tm_rc tm_dsv41_engram_stage_upload(tm_dsv41_engram_stage *st, uint32_t slot, const uint64_t *rows,
                                   size_t n, tm_err *err);

/* Makes stream s wait for slot's last copy; *dev_rows (optional) = the device rows [n][dim]. */
tm_rc tm_dsv41_engram_stage_wait(tm_dsv41_engram_stage *st, uint32_t slot, cudaStream_t s,
                                 const float **dev_rows, tm_err *err);

/* Every slot's device rows set to zeros (synchronous; no copy may be in flight after it). For
 * benchmarks that skip the reads (TM_DSV41_ENGRAM_SKIP, dsv41.c): wait then hands out zero rows.
 * Errors: TM_E_CUDA. */
tm_rc tm_dsv41_engram_stage_zero(tm_dsv41_engram_stage *st, tm_err *err);

/* The tables' dim (floats per row). */
uint32_t tm_dsv41_engram_stage_dim(const tm_dsv41_engram_stage *st);

#endif /* TM_RUNNER_ENGINE_CUDA_DSV41_ENGRAM_H */
