/* base/queue.c - bounded blocking ring buffer. */
#define _POSIX_C_SOURCE 200809L
#include "base/queue.h"

#include <errno.h>
#include <pthread.h>
#include <time.h>

#include "base/alloc.h"
#include "base/clock.h"

struct tm_queue {
    pthread_mutex_t mu;
    pthread_cond_t not_empty;
    pthread_cond_t not_full;
    void **items; /* ring of cap slots */
    size_t cap, head, len;
    int closed;
};

tm_rc tm_queue_create(size_t cap, tm_queue **out, tm_err *err) {
    if (cap == 0)
        return TM_ERR(err, TM_E_INVAL, "queue: capacity must be > 0");
    tm_queue *q = tm_calloc(1, sizeof(*q));
    if (!q)
        return TM_ERR(err, TM_E_NOMEM, "queue header");
    q->items = tm_calloc(cap, sizeof(*q->items));
    if (!q->items) {
        tm_free(q);
        return TM_ERR(err, TM_E_NOMEM, "queue of %zu items", cap);
    }
    q->cap = cap;
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->not_empty, NULL);
    pthread_cond_init(&q->not_full, NULL);
    *out = q;
    return TM_OK;
}

void tm_queue_destroy(tm_queue *q) {
    if (!q)
        return;
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->not_empty);
    pthread_cond_destroy(&q->not_full);
    tm_free(q->items);
    tm_free(q);
}

static tm_rc push_locked(tm_queue *q, void *item) {
    q->items[(q->head + q->len) % q->cap] = item;
    q->len++;
    pthread_cond_signal(&q->not_empty);
    return TM_OK;
}

tm_rc tm_queue_push(tm_queue *q, void *item) {
    pthread_mutex_lock(&q->mu);
    while (q->len == q->cap && !q->closed)
        pthread_cond_wait(&q->not_full, &q->mu);
    tm_rc rc = q->closed ? TM_E_EOF : push_locked(q, item);
    pthread_mutex_unlock(&q->mu);
    return rc;
}

tm_rc tm_queue_try_push(tm_queue *q, void *item) {
    pthread_mutex_lock(&q->mu);
    tm_rc rc = q->closed ? TM_E_EOF : q->len == q->cap ? TM_E_AGAIN : push_locked(q, item);
    pthread_mutex_unlock(&q->mu);
    return rc;
}

static void pop_locked(tm_queue *q, void **item) {
    *item = q->items[q->head];
    q->head = (q->head + 1) % q->cap;
    q->len--;
    pthread_cond_signal(&q->not_full);
}

tm_rc tm_queue_pop(tm_queue *q, void **item) {
    pthread_mutex_lock(&q->mu);
    while (q->len == 0 && !q->closed)
        pthread_cond_wait(&q->not_empty, &q->mu);
    tm_rc rc = TM_E_EOF;
    if (q->len > 0) {
        pop_locked(q, item);
        rc = TM_OK;
    }
    pthread_mutex_unlock(&q->mu);
    return rc;
}

tm_rc tm_queue_try_pop(tm_queue *q, void **item) {
    pthread_mutex_lock(&q->mu);
    tm_rc rc = q->closed ? TM_E_EOF : TM_E_AGAIN;
    if (q->len > 0) {
        pop_locked(q, item);
        rc = TM_OK;
    }
    pthread_mutex_unlock(&q->mu);
    return rc;
}

tm_rc tm_queue_pop_timed(tm_queue *q, void **item, long timeout_ms) {
    struct timespec until;
    tm_deadline_in_ms(&until, timeout_ms);
    pthread_mutex_lock(&q->mu);
    int wrc = 0;
    while (q->len == 0 && !q->closed && wrc != ETIMEDOUT)
        wrc = pthread_cond_timedwait(&q->not_empty, &q->mu, &until);
    tm_rc rc = q->closed ? TM_E_EOF : TM_E_AGAIN;
    if (q->len > 0) {
        pop_locked(q, item);
        rc = TM_OK;
    }
    pthread_mutex_unlock(&q->mu);
    return rc;
}

void tm_queue_close(tm_queue *q) {
    pthread_mutex_lock(&q->mu);
    q->closed = 1;
    pthread_cond_broadcast(&q->not_empty);
    pthread_cond_broadcast(&q->not_full);
    pthread_mutex_unlock(&q->mu);
}

size_t tm_queue_len(tm_queue *q) {
    pthread_mutex_lock(&q->mu);
    size_t n = q->len;
    pthread_mutex_unlock(&q->mu);
    return n;
}
