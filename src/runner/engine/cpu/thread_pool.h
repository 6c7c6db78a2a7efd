/* runner/engine/cpu/thread_pool.h - a persistent pthread pool with one operation: run fn over
 * items [0, n_item) and wait. Items are handed out dynamically (an atomic counter), the calling
 * thread works too (as worker 0), and a run returns only when every item is done. One thread
 * drives a pool (tm_cpu_pool_run is not reentrant); nothing is allocated after create. */
#ifndef TM_RUNNER_ENGINE_CPU_THREAD_POOL_H
#define TM_RUNNER_ENGINE_CPU_THREAD_POOL_H

#include <stdint.h>

#include "base/err.h"

typedef struct tm_cpu_pool tm_cpu_pool;

/* Work function: process item `item` as worker `tid` (< n_thread; use it to pick scratch). */
typedef void (*tm_cpu_pool_fn)(void *ctx, uint32_t item, uint32_t tid);

/* Start n_thread - 1 worker threads (n_thread >= 1; the caller is the n_thread-th). On success
 * *out owns the pool. TM_E_NOMEM, TM_E_IO (pthread_create failed). */
tm_rc tm_cpu_pool_create(uint32_t n_thread, tm_cpu_pool **out, tm_err *err);
/* Stop and join the workers. NULL is a no-op. */
void tm_cpu_pool_destroy(tm_cpu_pool *pool);
/* Run fn(ctx, i, tid) for every i < n_item across the pool; returns when all are done. ctx is
 * borrowed for the call. */
void tm_cpu_pool_run(tm_cpu_pool *pool, tm_cpu_pool_fn fn, void *ctx, uint32_t n_item);
uint32_t tm_cpu_pool_n_thread(const tm_cpu_pool *pool);

#endif /* TM_RUNNER_ENGINE_CPU_THREAD_POOL_H */
