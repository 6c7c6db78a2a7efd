/* tests/unit/test_kv_block.c - KV block pool: allocation, backpressure, refcounts, and a random
 * operation replay against a naive model (an array of refcounts). */
#include "base/alloc.h"
#include "runner/sched/kv_block.h"
#include "tm_test.h"

static void test_alloc_until_again(void) {
    tm_err err = {0};
    tm_kv_pool *pool = NULL;
    uint32_t ids[4];
    TM_CHECK_OK(tm_kv_pool_create(&(tm_kv_cfg){.n_block = 4, .block_tok = 16}, &pool, &err), &err);
    TM_CHECK_OK(tm_kv_block_try_alloc(pool, 3, ids, &err), &err);
    TM_CHECK(ids[0] == 0 && ids[1] == 1 && ids[2] == 2);
    TM_CHECK(tm_kv_block_try_alloc(pool, 2, ids, &err) == TM_E_AGAIN);
    TM_CHECK(tm_kv_pool_n_free(pool) == 1); // the failed call took nothing
    tm_kv_pool_destroy(pool);
}

static void test_refcount_frees_on_last_unref(void) {
    tm_err err = {0};
    tm_kv_pool *pool = NULL;
    uint32_t id;
    TM_CHECK_OK(tm_kv_pool_create(&(tm_kv_cfg){.n_block = 2, .block_tok = 8}, &pool, &err), &err);
    TM_CHECK_OK(tm_kv_block_try_alloc(pool, 1, &id, &err), &err);
    tm_kv_block_ref(pool, id);
    TM_CHECK(tm_kv_block_refcount(pool, id) == 2);
    tm_kv_block_unref(pool, id);
    TM_CHECK(tm_kv_pool_n_free(pool) == 1);
    tm_kv_block_unref(pool, id);
    TM_CHECK(tm_kv_pool_n_free(pool) == 2);
    tm_kv_pool_destroy(pool);
}

static void test_bad_config(void) {
    tm_err err = {0};
    tm_kv_pool *pool = NULL;
    TM_CHECK(tm_kv_pool_create(&(tm_kv_cfg){.n_block = 0, .block_tok = 8}, &pool, &err) ==
             TM_E_INVAL);
    TM_CHECK(tm_kv_pool_create(&(tm_kv_cfg){.n_block = 8, .block_tok = 0}, &pool, &err) ==
             TM_E_INVAL);
}

static void test_alloc_failures(void) {
    for (long n = 1; n <= 3; n++) {
        tm_err err = {0};
        tm_kv_pool *pool = NULL;
        long live = tm_alloc_live();
        tm_fault_set(TM_FAULT_ALLOC, n);
        tm_rc rc = tm_kv_pool_create(&(tm_kv_cfg){.n_block = 8, .block_tok = 8}, &pool, &err);
        tm_fault_set(TM_FAULT_ALLOC, 0);
        TM_CHECK(rc == TM_E_NOMEM);
        TM_CHECK(tm_alloc_live() == live);
    }
}

// Replays random alloc/ref/unref against an array of refcounts; compares after every step.
static void test_random_replay(void) {
    enum { N = 64 };
    tm_err err = {0};
    tm_kv_pool *pool = NULL;
    uint32_t model[N] = {0};
    uint64_t rng = 12345;
    TM_CHECK_OK(tm_kv_pool_create(&(tm_kv_cfg){.n_block = N, .block_tok = 4}, &pool, &err), &err);
    for (int step = 0; step < 20000; step++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t r = (uint32_t)(rng >> 33);
        uint32_t op = r % 3, id = (r / 3) % N;
        if (op == 0) {
            uint32_t want = 1 + (r / 7) % 5, ids[5];
            uint32_t n_free = 0;
            for (int i = 0; i < N; i++)
                n_free += model[i] == 0;
            tm_rc rc = tm_kv_block_try_alloc(pool, want, ids, &err);
            TM_CHECK(rc == (want <= n_free ? TM_OK : TM_E_AGAIN));
            for (uint32_t i = 0; rc == TM_OK && i < want; i++) {
                TM_CHECK(model[ids[i]] == 0);
                model[ids[i]] = 1;
            }
        } else if (op == 1 && model[id] > 0) {
            tm_kv_block_ref(pool, id);
            model[id]++;
        } else if (op == 2 && model[id] > 0) {
            tm_kv_block_unref(pool, id);
            model[id]--;
        }
        uint32_t n_free = 0;
        for (int i = 0; i < N; i++) {
            n_free += model[i] == 0;
            if (tm_kv_block_refcount(pool, (uint32_t)i) != model[i]) {
                TM_CHECK(!"refcount differs from the model");
                step = 1 << 30;
                break;
            }
        }
        TM_CHECK(tm_kv_pool_n_free(pool) == n_free);
    }
    tm_kv_pool_destroy(pool);
}

int main(void) {
    TM_RUN(test_alloc_until_again);
    TM_RUN(test_refcount_frees_on_last_unref);
    TM_RUN(test_bad_config);
    TM_RUN(test_alloc_failures);
    TM_RUN(test_random_replay);
    return tm_test_report();
}
