/* runner/sched/prefix_cache.h - the prefix cache: full KV blocks keyed by a chained hash (XXH3-128
 * of the parent block's hash, a salt and the block's token ids), so a block's key names its whole
 * prefix. The cache holds one reference on every cached block (tm_kv_block_ref); sequences using
 * it hold theirs. A cached block that only the cache references is evictable; eviction takes the
 * least recently used one. Each block id is cached at most once, under one key. Scheduler thread
 * only. Borrows the pool, which must outlive the cache. */
#ifndef TM_RUNNER_SCHED_PREFIX_CACHE_H
#define TM_RUNNER_SCHED_PREFIX_CACHE_H

#include <stdint.h>

#include "base/err.h"
#include "runner/sched/kv_block.h"

typedef struct tm_bhash {
    uint64_t lo, hi;
} tm_bhash;

typedef struct tm_pcache tm_pcache;

/* On success *out owns a cache sized for every block of pool. */
tm_rc tm_pcache_create(tm_kv_pool *pool, tm_pcache **out, tm_err *err);
/* Drops the cache's references (blocks only the cache held return to the pool). NULL: no-op. */
void tm_pcache_destroy(tm_pcache *pc);

/* Key of a block: parent is the previous block's key (NULL for the first block), salt isolates
 * tenants (0 = none), tokens are the block's n ids. */
tm_bhash tm_pcache_key(const tm_bhash *parent, uint64_t salt, const uint32_t *tokens, uint32_t n);

/* If key is cached: take a reference for the caller on its block (the caller unrefs it through
 * the pool like any block), mark it most recently used, set *block and return 1. Else 0. */
int tm_pcache_take(tm_pcache *pc, tm_bhash key, uint32_t *block);
/* Is key cached? (no reference taken, LRU untouched) */
int tm_pcache_contains(const tm_pcache *pc, tm_bhash key);
/* Offer a computed full block under key. If key is not cached and the block is not cached under
 * another key, the cache takes a reference and returns 1; else nothing changes and it returns 0. */
int tm_pcache_insert(tm_pcache *pc, tm_bhash key, uint32_t block);
/* Evict the least recently used block that only the cache references (it goes back to the free
 * list). Returns 1 if one was evicted, 0 if none is evictable. */
int tm_pcache_evict_one(tm_pcache *pc);

uint32_t tm_pcache_n_cached(const tm_pcache *pc);
/* Cached blocks that only the cache references (could be evicted now). */
uint32_t tm_pcache_n_evictable(const tm_pcache *pc);

#endif /* TM_RUNNER_SCHED_PREFIX_CACHE_H */
