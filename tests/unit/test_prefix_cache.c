/* tests/unit/test_prefix_cache.c - the prefix cache: chained keys, take/insert/evict semantics, and
 * a long random operation replay against a naive model (arrays and linear scans) compared after
 * every step. */
#include <string.h>

#include "base/alloc.h"
#include "runner/sched/prefix_cache.h"
#include "tm_test.h"

static void test_keys_chain(void) {
    uint32_t a[4] = {1, 2, 3, 4}, b[4] = {1, 2, 3, 5};
    tm_bhash k1 = tm_pcache_key(NULL, 0, a, 4);
    tm_bhash k1b = tm_pcache_key(NULL, 0, a, 4);
    tm_bhash k2 = tm_pcache_key(NULL, 0, b, 4);
    tm_bhash k1s = tm_pcache_key(NULL, 9, a, 4);
    tm_bhash c1 = tm_pcache_key(&k1, 0, a, 4);
    tm_bhash c2 = tm_pcache_key(&k2, 0, a, 4);
    TM_CHECK(k1.lo == k1b.lo && k1.hi == k1b.hi);
    TM_CHECK(k1.lo != k2.lo);
    TM_CHECK(k1.lo != k1s.lo); // the salt isolates tenants
    TM_CHECK(c1.lo != c2.lo);  // same tokens, different prefix
}

static void test_take_insert_evict(void) {
    tm_err err = {0};
    tm_kv_pool *pool = NULL;
    tm_pcache *pc = NULL;
    uint32_t blk[2], got;
    TM_CHECK_OK(tm_kv_pool_create(&(tm_kv_cfg){.n_block = 2, .block_tok = 4}, &pool, &err), &err);
    TM_CHECK_OK(tm_pcache_create(pool, &pc, &err), &err);
    TM_CHECK_OK(tm_kv_block_try_alloc(pool, 2, blk, &err), &err);
    tm_bhash k = tm_pcache_key(NULL, 0, (uint32_t[]){7, 7, 7, 7}, 4);
    TM_CHECK(tm_pcache_insert(pc, k, blk[0]) == 1);
    TM_CHECK(tm_pcache_insert(pc, k, blk[1]) == 0); // key already cached
    TM_CHECK(tm_kv_block_refcount(pool, blk[0]) == 2);
    TM_CHECK(tm_pcache_evict_one(pc) == 0); // the sequence still holds it
    tm_kv_block_unref(pool, blk[0]);
    tm_kv_block_unref(pool, blk[1]);
    TM_CHECK(tm_kv_pool_n_free(pool) == 1); // blk[0] stays, cached
    TM_CHECK(tm_pcache_take(pc, k, &got) == 1 && got == blk[0]);
    tm_kv_block_unref(pool, got);
    TM_CHECK(tm_pcache_evict_one(pc) == 1);
    TM_CHECK(tm_kv_pool_n_free(pool) == 2);
    TM_CHECK(tm_pcache_contains(pc, k) == 0);
    tm_pcache_destroy(pc);
    tm_kv_pool_destroy(pool);
}

// The naive model: per block, its refcount, whether cached, its key index and last use tick.
enum { NB = 48, NKEY = 24 };
typedef struct model {
    uint32_t refs[NB];
    int cached[NB];
    int key_of[NB];
    uint64_t used[NB];
    int seq_refs[NB]; /* references the test's "sequences" hold */
} model;

static int model_block_of_key(const model *m, int k) {
    for (int b = 0; b < NB; b++)
        if (m->cached[b] && m->key_of[b] == k)
            return b;
    return -1;
}

static void test_random_replay(void) {
    tm_err err = {0};
    tm_kv_pool *pool = NULL;
    tm_pcache *pc = NULL;
    tm_bhash keys[NKEY];
    for (int k = 0; k < NKEY; k++)
        keys[k] = tm_pcache_key(NULL, 0, (uint32_t[]){(uint32_t)k}, 1);
    TM_CHECK_OK(tm_kv_pool_create(&(tm_kv_cfg){.n_block = NB, .block_tok = 4}, &pool, &err), &err);
    TM_CHECK_OK(tm_pcache_create(pool, &pc, &err), &err);
    model m;
    memset(&m, 0, sizeof(m));
    uint64_t rng = 99, tick = 0;
    int ok = 1;
    for (int step = 0; step < 50000 && ok; step++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t r = (uint32_t)(rng >> 33);
        int b = (int)((r >> 4) % NB), k = (int)((r >> 12) % NKEY);
        tick++;
        switch (r % 5) {
        case 0: { // a sequence takes a fresh block
            uint32_t id;
            int n_free = 0;
            for (int i = 0; i < NB; i++)
                n_free += m.refs[i] == 0;
            tm_rc rc = tm_kv_block_try_alloc(pool, 1, &id, &err);
            ok &= (rc == TM_OK) == (n_free > 0);
            if (rc == TM_OK) {
                ok &= m.refs[id] == 0;
                m.refs[id] = 1;
                m.seq_refs[id]++;
            }
            break;
        }
        case 1: { // a sequence finished computing block b and offers it under key k
            if (m.seq_refs[b] == 0)
                break;
            int want = model_block_of_key(&m, k) < 0 && !m.cached[b];
            ok &= tm_pcache_insert(pc, keys[k], (uint32_t)b) == want;
            if (want) {
                m.cached[b] = 1, m.key_of[b] = k, m.used[b] = tick;
                m.refs[b]++;
            }
            break;
        }
        case 2: { // a new sequence looks key k up
            int mb = model_block_of_key(&m, k);
            uint32_t got = NB;
            int hit = tm_pcache_take(pc, keys[k], &got);
            ok &= hit == (mb >= 0);
            if (hit) {
                ok &= (int)got == mb;
                m.refs[mb]++, m.seq_refs[mb]++, m.used[mb] = tick;
            }
            break;
        }
        case 3: // a sequence drops its reference on block b
            if (m.seq_refs[b] > 0) {
                tm_kv_block_unref(pool, (uint32_t)b);
                m.seq_refs[b]--, m.refs[b]--;
            }
            break;
        case 4: { // the pool needs a block: evict the least recently used unreferenced one
            int victim = -1;
            for (int i = 0; i < NB; i++)
                if (m.cached[i] && m.refs[i] == 1 && (victim < 0 || m.used[i] < m.used[victim]))
                    victim = i;
            ok &= tm_pcache_evict_one(pc) == (victim >= 0);
            if (victim >= 0)
                m.cached[victim] = 0, m.refs[victim] = 0;
            break;
        }
        }
        // Compare everything after every step.
        uint32_t n_cached = 0, n_evictable = 0;
        for (int i = 0; i < NB; i++) {
            ok &= tm_kv_block_refcount(pool, (uint32_t)i) == m.refs[i];
            n_cached += (uint32_t)m.cached[i];
            n_evictable += m.cached[i] && m.refs[i] == 1;
        }
        for (int j = 0; j < NKEY; j++)
            ok &= tm_pcache_contains(pc, keys[j]) == (model_block_of_key(&m, j) >= 0);
        ok &= tm_pcache_n_cached(pc) == n_cached;
        ok &= tm_pcache_n_evictable(pc) == n_evictable;
        if (!ok)
            fprintf(stderr, "diverged from the model at step %d (op %u)\n", step, r % 5);
    }
    TM_CHECK(ok);
    for (int i = 0; i < NB; i++)
        while (m.seq_refs[i]-- > 0)
            tm_kv_block_unref(pool, (uint32_t)i);
    tm_pcache_destroy(pc);
    TM_CHECK(tm_kv_pool_n_free(pool) == NB); // destroy returned every cached block
    tm_kv_pool_destroy(pool);
}

static void test_alloc_failures(void) {
    tm_err err = {0};
    tm_kv_pool *pool = NULL;
    TM_CHECK_OK(tm_kv_pool_create(&(tm_kv_cfg){.n_block = 8, .block_tok = 4}, &pool, &err), &err);
    for (long n = 1; n <= 6; n++) {
        tm_pcache *pc = NULL;
        long live = tm_alloc_live();
        tm_fault_set(TM_FAULT_ALLOC, n);
        tm_rc rc = tm_pcache_create(pool, &pc, &err);
        tm_fault_set(TM_FAULT_ALLOC, 0);
        TM_CHECK(rc == TM_E_NOMEM);
        TM_CHECK(tm_alloc_live() == live);
    }
    tm_kv_pool_destroy(pool);
}

int main(void) {
    TM_RUN(test_keys_chain);
    TM_RUN(test_take_insert_evict);
    TM_RUN(test_random_replay);
    TM_RUN(test_alloc_failures);
    return tm_test_report();
}
