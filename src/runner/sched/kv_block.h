/* runner/sched/kv_block.h - paged KV cache block pool: the ids of n_block blocks of block_tok
 * tokens whose storage the engine owns. Blocks are refcounted (sequences and, later, the prefix
 * cache share them); a block is on the free list iff its refcount is 0. Scheduler thread only. */
#ifndef TM_RUNNER_SCHED_KV_BLOCK_H
#define TM_RUNNER_SCHED_KV_BLOCK_H

#include <stdint.h>

#include "base/err.h"

typedef struct tm_kv_pool tm_kv_pool; /* opaque */

typedef struct tm_kv_cfg {
    uint32_t n_block;   /* blocks in the pool, > 0 */
    uint32_t block_tok; /* tokens per block, > 0 */
} tm_kv_cfg;

/* On success *out owns a new pool; free it with tm_kv_pool_destroy(). */
tm_rc tm_kv_pool_create(const tm_kv_cfg *cfg, tm_kv_pool **out, tm_err *err);
void tm_kv_pool_destroy(tm_kv_pool *pool); /* NULL is a no-op */

/* Take n free blocks (refcount 1) into ids[]. TM_E_AGAIN, taking none, if fewer are free. */
tm_rc tm_kv_block_try_alloc(tm_kv_pool *pool, uint32_t n, uint32_t *ids, tm_err *err);
void tm_kv_block_ref(tm_kv_pool *pool, uint32_t id);   /* another holder shares the block */
void tm_kv_block_unref(tm_kv_pool *pool, uint32_t id); /* the last unref frees it */

uint32_t tm_kv_pool_n_free(const tm_kv_pool *pool);
uint32_t tm_kv_pool_n_block(const tm_kv_pool *pool);
uint32_t tm_kv_pool_block_tok(const tm_kv_pool *pool);
uint32_t tm_kv_block_refcount(const tm_kv_pool *pool, uint32_t id);

#endif /* TM_RUNNER_SCHED_KV_BLOCK_H */
