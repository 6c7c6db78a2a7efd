/* runner/sched/prefix_cache.c - an open-addressing table (linear probing, backward-shift deletion)
 * from key to block id, and a doubly linked LRU list over the cached block ids. Per-block state
 * lives in arrays indexed by block id, so the cache allocates nothing after create. */
#include "runner/sched/prefix_cache.h"

#include <string.h>

#include "base/alloc.h"
#include "base/hash.h"

#define NIL UINT32_MAX

struct tm_pcache {
    tm_kv_pool *pool; /* borrowed */
    uint32_t n_block;
    uint32_t *slots; /* [n_slot] block id or NIL; n_slot is a power of two >= 2 * n_block */
    uint32_t n_slot;
    tm_bhash *key;   /* [n_block] key of each cached block */
    uint8_t *cached; /* [n_block] 1 if the block is in the cache */
    uint32_t *prev;  /* [n_block] LRU list: head = least recently used */
    uint32_t *next;
    uint32_t head, tail;
    uint32_t n_cached;
};

static uint32_t slot_of(const tm_pcache *pc, tm_bhash k) {
    return (uint32_t)(k.lo ^ (k.hi >> 7)) & (pc->n_slot - 1);
}

static int key_eq(tm_bhash a, tm_bhash b) { return a.lo == b.lo && a.hi == b.hi; }

tm_rc tm_pcache_create(tm_kv_pool *pool, tm_pcache **out, tm_err *err) {
    tm_pcache *pc = tm_calloc(1, sizeof(*pc));
    if (!pc)
        return TM_ERR(err, TM_E_NOMEM, "prefix cache header");
    pc->pool = pool;
    pc->head = pc->tail = NIL; // before any goto fail: destroy walks the list
    pc->n_block = tm_kv_pool_n_block(pool);
    pc->n_slot = 2;
    while (pc->n_slot < 2 * pc->n_block)
        pc->n_slot *= 2;
    pc->slots = tm_malloc((size_t)pc->n_slot * sizeof(*pc->slots));
    pc->key = tm_calloc(pc->n_block, sizeof(*pc->key));
    pc->cached = tm_calloc(pc->n_block, sizeof(*pc->cached));
    pc->prev = tm_calloc(pc->n_block, sizeof(*pc->prev));
    pc->next = tm_calloc(pc->n_block, sizeof(*pc->next));
    if (!pc->slots || !pc->key || !pc->cached || !pc->prev || !pc->next) {
        TM_ERR(err, TM_E_NOMEM, "prefix cache for %u blocks", pc->n_block);
        goto fail;
    }
    memset(pc->slots, 0xff, (size_t)pc->n_slot * sizeof(*pc->slots));
    *out = pc;
    return TM_OK;
fail:
    tm_pcache_destroy(pc);
    return err->rc;
}

void tm_pcache_destroy(tm_pcache *pc) {
    if (!pc)
        return;
    for (uint32_t b = pc->head; b != NIL;) {
        uint32_t nx = pc->next[b];
        tm_kv_block_unref(pc->pool, b);
        b = nx;
    }
    tm_free(pc->slots);
    tm_free(pc->key);
    tm_free(pc->cached);
    tm_free(pc->prev);
    tm_free(pc->next);
    tm_free(pc);
}

tm_bhash tm_pcache_key(const tm_bhash *parent, uint64_t salt, const uint32_t *tokens, uint32_t n) {
    tm_hash_stream st;
    tm_hash_stream_init(&st);
    tm_bhash p = parent ? *parent : (tm_bhash){0, 0};
    uint64_t head[3] = {p.lo, p.hi, salt};
    tm_hash_stream_update(&st, head, sizeof(head));
    tm_hash_stream_update(&st, tokens, (size_t)n * sizeof(*tokens));
    tm_h128 h = tm_hash_stream_digest128(&st);
    return (tm_bhash){h.lo, h.hi};
}

static uint32_t find_slot(const tm_pcache *pc, tm_bhash k) {
    for (uint32_t s = slot_of(pc, k);; s = (s + 1) & (pc->n_slot - 1)) {
        uint32_t b = pc->slots[s];
        if (b == NIL || key_eq(pc->key[b], k))
            return s;
    }
}

static void lru_unlink(tm_pcache *pc, uint32_t b) {
    if (pc->prev[b] != NIL)
        pc->next[pc->prev[b]] = pc->next[b];
    else
        pc->head = pc->next[b];
    if (pc->next[b] != NIL)
        pc->prev[pc->next[b]] = pc->prev[b];
    else
        pc->tail = pc->prev[b];
}

static void lru_push_tail(tm_pcache *pc, uint32_t b) {
    pc->prev[b] = pc->tail;
    pc->next[b] = NIL;
    if (pc->tail != NIL)
        pc->next[pc->tail] = b;
    else
        pc->head = b;
    pc->tail = b;
}

int tm_pcache_contains(const tm_pcache *pc, tm_bhash key) {
    return pc->slots[find_slot(pc, key)] != NIL;
}

int tm_pcache_take(tm_pcache *pc, tm_bhash key, uint32_t *block) {
    uint32_t b = pc->slots[find_slot(pc, key)];
    if (b == NIL)
        return 0;
    tm_kv_block_ref(pc->pool, b);
    lru_unlink(pc, b);
    lru_push_tail(pc, b);
    *block = b;
    return 1;
}

int tm_pcache_insert(tm_pcache *pc, tm_bhash key, uint32_t block) {
    TM_ASSERT(block < pc->n_block);
    uint32_t s = find_slot(pc, key);
    if (pc->slots[s] != NIL || pc->cached[block])
        return 0;
    pc->slots[s] = block;
    pc->key[block] = key;
    pc->cached[block] = 1;
    pc->n_cached++;
    tm_kv_block_ref(pc->pool, block);
    lru_push_tail(pc, block);
    return 1;
}

// Remove block b's slot, shifting later entries of its probe run back so lookups stay correct.
static void table_remove(tm_pcache *pc, uint32_t b) {
    const uint32_t mask = pc->n_slot - 1;
    uint32_t hole = find_slot(pc, pc->key[b]);
    TM_ASSERT(pc->slots[hole] == b);
    pc->slots[hole] = NIL;
    for (uint32_t s = (hole + 1) & mask; pc->slots[s] != NIL; s = (s + 1) & mask) {
        uint32_t home = slot_of(pc, pc->key[pc->slots[s]]);
        // The entry at s may move to the hole if its home is not in (hole, s] cyclically.
        int stays = hole <= s ? (home > hole && home <= s) : (home > hole || home <= s);
        if (!stays) {
            pc->slots[hole] = pc->slots[s];
            pc->slots[s] = NIL;
            hole = s;
        }
    }
}

int tm_pcache_evict_one(tm_pcache *pc) {
    for (uint32_t b = pc->head; b != NIL; b = pc->next[b]) {
        if (tm_kv_block_refcount(pc->pool, b) != 1)
            continue; // a sequence still uses it
        table_remove(pc, b);
        lru_unlink(pc, b);
        pc->cached[b] = 0;
        pc->n_cached--;
        tm_kv_block_unref(pc->pool, b);
        return 1;
    }
    return 0;
}

uint32_t tm_pcache_n_cached(const tm_pcache *pc) { return pc->n_cached; }

uint32_t tm_pcache_n_evictable(const tm_pcache *pc) {
    uint32_t n = 0;
    for (uint32_t b = pc->head; b != NIL; b = pc->next[b])
        n += tm_kv_block_refcount(pc->pool, b) == 1;
    return n;
}
