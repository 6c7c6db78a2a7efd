/* base/queue.h - bounded multi-producer multi-consumer queue of pointers (mutex + two condition
 * variables). Connects the source, runner and sink threads: a full queue blocks the producer, so a
 * slow stage slows the one before it and memory stays bounded. close() wakes everyone: pushes then
 * fail, pops drain what is left and then report TM_E_EOF. */
#ifndef TM_BASE_QUEUE_H
#define TM_BASE_QUEUE_H

#include <stddef.h>

#include "base/err.h"

typedef struct tm_queue tm_queue;

/* cap > 0 items. On success *out owns a new queue; free with tm_queue_destroy. */
tm_rc tm_queue_create(size_t cap, tm_queue **out, tm_err *err);
/* Frees the queue, not the items still in it. NULL is a no-op. No thread may be blocked in it. */
void tm_queue_destroy(tm_queue *q);

/* Blocks while full. The queue borrows item until it is popped. TM_E_EOF if closed. */
tm_rc tm_queue_push(tm_queue *q, void *item);
/* Like push but never blocks: TM_E_AGAIN when full. */
tm_rc tm_queue_try_push(tm_queue *q, void *item);
/* Blocks while empty and open. TM_E_EOF once closed and drained. */
tm_rc tm_queue_pop(tm_queue *q, void **item);
/* Never blocks: TM_E_AGAIN when empty and open, TM_E_EOF when closed and drained. */
tm_rc tm_queue_try_pop(tm_queue *q, void **item);
/* Wait at most timeout_ms for an item: TM_E_AGAIN on timeout. */
tm_rc tm_queue_pop_timed(tm_queue *q, void **item, long timeout_ms);
void tm_queue_close(tm_queue *q);
size_t tm_queue_len(tm_queue *q);

#endif /* TM_BASE_QUEUE_H */
