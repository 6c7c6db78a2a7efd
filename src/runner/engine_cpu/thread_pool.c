/* runner/engine_cpu/thread_pool.c - persistent worker threads woken per run by a generation
 * counter under a mutex; items are claimed with an atomic fetch-add. Workers spin briefly before
 * sleeping because a forward step issues a few runs per layer back to back. */
#include "runner/engine_cpu/thread_pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "base/alloc.h"

#define SPIN_ITERS 20000

struct tm_cpu_pool {
    uint32_t n_thread;         /* workers + the caller */
    pthread_t *threads;        /* [n_thread - 1], owned */
    uint32_t n_started;        /* threads successfully created */
    pthread_mutex_t mu;
    pthread_cond_t cv_work;    /* gen changed or quit */
    pthread_cond_t cv_done;    /* n_active reached 0 */
    atomic_uint_fast64_t gen;  /* bumped per run; written under mu */
    int quit;                  /* under mu */
    /* the current run: written by the caller before gen is bumped */
    tm_cpu_pool_fn fn;
    void *ctx;
    uint32_t n_item;
    atomic_uint next;          /* next unclaimed item */
    atomic_uint n_active;      /* workers that have not finished the current run */
};

typedef struct worker_arg {
    tm_cpu_pool *pool;
    uint32_t tid;
} worker_arg;

static void drain(tm_cpu_pool *pool, uint32_t tid) {
    for (;;) {
        uint32_t i = atomic_fetch_add(&pool->next, 1);
        if (i >= pool->n_item)
            return;
        pool->fn(pool->ctx, i, tid);
    }
}

static void *worker_main(void *p) {
    tm_cpu_pool *pool = ((worker_arg *)p)->pool;
    uint32_t tid = ((worker_arg *)p)->tid;
    tm_free(p);
    uint64_t seen = 0;
    for (;;) {
        // Spin a little: the next run usually follows within microseconds.
        for (int s = 0; s < SPIN_ITERS && atomic_load(&pool->gen) == seen; s++)
            ;
        pthread_mutex_lock(&pool->mu);
        while (atomic_load(&pool->gen) == seen && !pool->quit)
            pthread_cond_wait(&pool->cv_work, &pool->mu);
        if (pool->quit) {
            pthread_mutex_unlock(&pool->mu);
            return NULL;
        }
        seen = atomic_load(&pool->gen);
        pthread_mutex_unlock(&pool->mu);
        drain(pool, tid);
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
    atomic_init(&pool->gen, 0);
    atomic_init(&pool->next, 0);
    atomic_init(&pool->n_active, 0);
    if (n_thread > 1) {
        pool->threads = tm_calloc(n_thread - 1, sizeof(*pool->threads));
        if (!pool->threads) {
            TM_ERR(err, TM_E_NOMEM, "thread pool: %u threads", n_thread);
            goto fail;
        }
    }
    for (uint32_t i = 0; i + 1 < n_thread; i++) {
        worker_arg *wa = tm_malloc(sizeof(*wa));
        if (!wa) {
            TM_ERR(err, TM_E_NOMEM, "thread pool: worker arg");
            goto fail;
        }
        wa->pool = pool;
        wa->tid = i + 1;
        int e = pthread_create(&pool->threads[i], NULL, worker_main, wa);
        if (e) {
            tm_free(wa);
            TM_ERR(err, TM_E_IO, "thread pool: pthread_create: %s", strerror(e));
            goto fail;
        }
        pool->n_started++;
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
    for (uint32_t i = 0; i < pool->n_started; i++)
        pthread_join(pool->threads[i], NULL);
    pthread_cond_destroy(&pool->cv_work);
    pthread_cond_destroy(&pool->cv_done);
    pthread_mutex_destroy(&pool->mu);
    tm_free(pool->threads);
    tm_free(pool);
}

void tm_cpu_pool_run(tm_cpu_pool *pool, tm_cpu_pool_fn fn, void *ctx, uint32_t n_item) {
    if (n_item == 0)
        return;
    if (pool->n_thread == 1 || n_item == 1) {
        for (uint32_t i = 0; i < n_item; i++)
            fn(ctx, i, 0);
        return;
    }
    pool->fn = fn;
    pool->ctx = ctx;
    pool->n_item = n_item;
    atomic_store(&pool->next, 0);
    atomic_store(&pool->n_active, pool->n_thread - 1);
    pthread_mutex_lock(&pool->mu);
    atomic_fetch_add(&pool->gen, 1);
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
