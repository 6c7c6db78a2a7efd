/* runner/engine/cpu/thread_pool.c - persistent worker threads, each woken per run by bumping its
 * own sequence counter under a mutex (only as many as the run has items for); items are claimed
 * with an atomic fetch-add. Workers spin briefly before sleeping because a forward step issues a
 * few runs per layer back to back. */
#include "runner/engine/cpu/thread_pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "base/alloc.h"

#define SPIN_ITERS 20000

/* One per worker thread: the caller hands it a run by bumping seq. */
typedef struct worker {
    struct tm_cpu_pool *pool;
    uint32_t tid;
    pthread_t thread;
    int started;
    atomic_uint_fast64_t seq; /* bumped per run this worker takes part in; written under mu */
} worker;

struct tm_cpu_pool {
    uint32_t n_thread; /* workers + the caller */
    worker *workers;   /* [n_thread - 1], owned; worker i has tid i + 1 */
    pthread_mutex_t mu;
    pthread_cond_t cv_work; /* some worker's seq changed, or quit */
    pthread_cond_t cv_done; /* n_active reached 0 */
    int quit;               /* under mu */
    /* the current run: written by the caller before any seq is bumped */
    tm_cpu_pool_fn fn;
    void *ctx;
    uint32_t n_item;
    atomic_uint next;     /* next unclaimed item */
    atomic_uint n_active; /* workers that have not finished the current run */
};

static void drain(tm_cpu_pool *pool, uint32_t tid) {
    for (;;) {
        uint32_t i = atomic_fetch_add(&pool->next, 1);
        if (i >= pool->n_item)
            return;
        pool->fn(pool->ctx, i, tid);
    }
}

static void *worker_main(void *p) {
    worker *w = p;
    tm_cpu_pool *pool = w->pool;
    uint64_t seen = 0;
    for (;;) {
        // Spin a little: the next run usually follows within microseconds.
        for (int s = 0; s < SPIN_ITERS && atomic_load(&w->seq) == seen; s++)
            ;
        pthread_mutex_lock(&pool->mu);
        while (atomic_load(&w->seq) == seen && !pool->quit)
            pthread_cond_wait(&pool->cv_work, &pool->mu);
        if (pool->quit) {
            pthread_mutex_unlock(&pool->mu);
            return NULL;
        }
        seen = atomic_load(&w->seq);
        pthread_mutex_unlock(&pool->mu);
        drain(pool, w->tid);
        if (atomic_fetch_sub(&pool->n_active, 1) == 1) {
            pthread_mutex_lock(&pool->mu);
            pthread_cond_signal(&pool->cv_done);
            pthread_mutex_unlock(&pool->mu);
        }
    }
}

tm_rc tm_cpu_pool_create(uint32_t n_thread, tm_cpu_pool **out, tm_err *err) {
    if (n_thread == 0)
        return TM_ERR(err, TM_E_INVAL, "thread pool: n_thread must be > 0");
    tm_cpu_pool *pool = tm_calloc(1, sizeof(*pool));
    if (!pool)
        return TM_ERR(err, TM_E_NOMEM, "thread pool header");
    pool->n_thread = n_thread;
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->cv_work, NULL);
    pthread_cond_init(&pool->cv_done, NULL);
    atomic_init(&pool->next, 0);
    atomic_init(&pool->n_active, 0);
    if (n_thread > 1) {
        pool->workers = tm_calloc(n_thread - 1, sizeof(*pool->workers));
        if (!pool->workers) {
            TM_ERR(err, TM_E_NOMEM, "thread pool: %u threads", n_thread);
            goto fail;
        }
    }
    for (uint32_t i = 0; i + 1 < n_thread; i++) {
        worker *w = &pool->workers[i];
        w->pool = pool;
        w->tid = i + 1;
        atomic_init(&w->seq, 0);
        int e = pthread_create(&w->thread, NULL, worker_main, w);
        if (e) {
            TM_ERR(err, TM_E_IO, "thread pool: pthread_create: %s", strerror(e));
            goto fail;
        }
        w->started = 1;
    }
    *out = pool;
    return TM_OK;
fail:
    tm_cpu_pool_destroy(pool);
    return err->rc;
}

void tm_cpu_pool_destroy(tm_cpu_pool *pool) {
    if (!pool)
        return;
    pthread_mutex_lock(&pool->mu);
    pool->quit = 1;
    pthread_cond_broadcast(&pool->cv_work);
    pthread_mutex_unlock(&pool->mu);
    for (uint32_t i = 0; pool->workers && i + 1 < pool->n_thread; i++)
        if (pool->workers[i].started)
            pthread_join(pool->workers[i].thread, NULL);
    pthread_cond_destroy(&pool->cv_work);
    pthread_cond_destroy(&pool->cv_done);
    pthread_mutex_destroy(&pool->mu);
    tm_free(pool->workers);
    tm_free(pool);
}

void tm_cpu_pool_run(tm_cpu_pool *pool, tm_cpu_pool_fn fn, void *ctx, uint32_t n_item) {
    if (n_item == 0)
        return;
    // Wake only as many workers as there are items beyond the caller's first.
    const uint32_t n_help = TM_MIN(pool->n_thread, n_item) - 1;
    if (n_help == 0) {
        for (uint32_t i = 0; i < n_item; i++)
            fn(ctx, i, 0);
        return;
    }
    pool->fn = fn;
    pool->ctx = ctx;
    pool->n_item = n_item;
    atomic_store(&pool->next, 0);
    atomic_store(&pool->n_active, n_help);
    pthread_mutex_lock(&pool->mu);
    for (uint32_t i = 0; i < n_help; i++)
        atomic_fetch_add(&pool->workers[i].seq, 1);
    pthread_cond_broadcast(&pool->cv_work);
    pthread_mutex_unlock(&pool->mu);
    drain(pool, 0);
    // Wait for the workers: spin first, then sleep.
    for (int s = 0; s < SPIN_ITERS && atomic_load(&pool->n_active) != 0; s++)
        ;
    if (atomic_load(&pool->n_active) != 0) {
        pthread_mutex_lock(&pool->mu);
        while (atomic_load(&pool->n_active) != 0)
            pthread_cond_wait(&pool->cv_done, &pool->mu);
        pthread_mutex_unlock(&pool->mu);
    }
}

uint32_t tm_cpu_pool_n_thread(const tm_cpu_pool *pool) { return pool->n_thread; }
