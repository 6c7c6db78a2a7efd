/* runner/sched/kv_block.c - refcounted block ids with a LIFO free list (recently freed blocks are
 * reused first, which keeps the touched KV memory warm in cache). */
#include "runner/sched/kv_block.h"

#include "base/alloc.h"

struct tm_kv_pool {
    uint32_t n_block;
    uint32_t block_tok;
    uint32_t *refs;     /* [n_block] refcount per block */
    uint32_t *free_ids; /* [n_block] stack of free ids; the top is free_ids[n_free - 1] */
    uint32_t n_free;
};

tm_rc tm_kv_pool_create(const tm_kv_cfg *cfg, tm_kv_pool **out, tm_err *err) {
    if (cfg->n_block == 0)
        return TM_ERR(err, TM_E_INVAL, "kv pool: n_block must be > 0");
    if (cfg->block_tok == 0)
        return TM_ERR(err, TM_E_INVAL, "kv pool: block_tok must be > 0");
    tm_kv_pool *pool = tm_calloc(1, sizeof(*pool));
    if (!pool)
        return TM_ERR(err, TM_E_NOMEM, "kv pool header");
    pool->refs = tm_calloc(cfg->n_block, sizeof(*pool->refs));
    pool->free_ids = tm_calloc(cfg->n_block, sizeof(*pool->free_ids));
    if (!pool->refs || !pool->free_ids) {
        TM_ERR(err, TM_E_NOMEM, "kv pool: %u blocks", cfg->n_block);
        goto fail;
    }
    pool->n_block = cfg->n_block;
    pool->block_tok = cfg->block_tok;
    for (uint32_t i = 0; i < cfg->n_block; i++)
        pool->free_ids[i] = cfg->n_block - 1 - i; // pop order: 0, 1, 2, ...
    pool->n_free = cfg->n_block;
    *out = pool;
    return TM_OK;
fail:
    tm_kv_pool_destroy(pool);
    return err->rc;
}

void tm_kv_pool_destroy(tm_kv_pool *pool) {
    if (!pool)
        return;
    tm_free(pool->refs);
    tm_free(pool->free_ids);
    tm_free(pool);
}

tm_rc tm_kv_block_try_alloc(tm_kv_pool *pool, uint32_t n, uint32_t *ids, tm_err *err) {
    if (n > pool->n_free)
        return TM_ERR(err, TM_E_AGAIN, "kv pool: %u blocks wanted, %u free", n, pool->n_free);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t id = pool->free_ids[--pool->n_free];
        TM_ASSERT(pool->refs[id] == 0);
        pool->refs[id] = 1;
        ids[i] = id;
    }
    return TM_OK;
}

void tm_kv_block_ref(tm_kv_pool *pool, uint32_t id) {
    TM_ASSERT(id < pool->n_block && pool->refs[id] > 0);
    pool->refs[id]++;
}

void tm_kv_block_unref(tm_kv_pool *pool, uint32_t id) {
    TM_ASSERT(id < pool->n_block && pool->refs[id] > 0);
    if (--pool->refs[id] == 0)
        pool->free_ids[pool->n_free++] = id;
}

uint32_t tm_kv_pool_n_free(const tm_kv_pool *pool) { return pool->n_free; }
uint32_t tm_kv_pool_n_block(const tm_kv_pool *pool) { return pool->n_block; }
uint32_t tm_kv_pool_block_tok(const tm_kv_pool *pool) { return pool->block_tok; }
uint32_t tm_kv_block_refcount(const tm_kv_pool *pool, uint32_t id) {
    TM_ASSERT(id < pool->n_block);
    return pool->refs[id];
}
