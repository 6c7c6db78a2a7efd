/* tests/unit/test_tp_host.c - the host shared-memory all-reduce of tensor parallel
 * (runner/tp/tp_host.h), the transport of ranks that share one GPU. Each test forks world - 1
 * children; every process joins the communicator of one random id as its rank, and each child
 * reports through its exit status (0: every check passed). Checks: all-reduce sums of f32, bf16
 * and u32 buffers of sizes 0, 1, a chunk less one, a chunk and a bit, and three chunks equal the
 * rank-order sum computed here (exactly: same bits on every rank), for 2, 3 and 4 ranks;
 * all-gather; a rank that never arrives makes the others fail with the barrier's message (not
 * hang), and an abort makes the others' collectives fail; the segment's name is gone from
 * /dev/shm once all ranks joined. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/alloc.h"
#include "runner/tp/tp_host.h"
#include "tm_test.h"

#define CHUNK_F32 (TM_TP_HOST_CHUNK_BYTES / 4)

static void make_id(uint8_t id[TM_TP_HOST_ID_BYTES], uint32_t salt) {
    uint64_t x = 0x1234567ull * (uint64_t)getpid() + salt * 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < TM_TP_HOST_ID_BYTES; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        id[i] = (uint8_t)(x >> 56);
    }
}

/* Rank r's value at element i: varied exponents, so the summation order shows in the bits. */
static float val(uint32_t r, size_t i) {
    const uint32_t h = (uint32_t)(i * 2654435761u) ^ (r * 40503u);
    return (float)((int)(h % 2001) - 1000) * (r % 2 ? 1e-3f : 7.0f) + (float)r * 0.1f;
}

static uint16_t to_bf16(float f) { // truncation is enough to make inputs
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

static float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* One rank's whole run; returns the number of failed checks. */
static int rank_run(const uint8_t *id, uint32_t rank, uint32_t world) {
    tm_err err = {0};
    tm_tp_host *c = NULL;
    if (tm_tp_host_create(id, rank, world, 20000, &c, &err)) {
        fprintf(stderr, "rank %u: %s\n", rank, err.msg);
        return 1;
    }
    int bad = 0;
    const size_t sizes[] = {0, 1, CHUNK_F32 - 1, CHUNK_F32 + 7, 3 * CHUNK_F32};
    for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
        const size_t n = sizes[si];
        float *b = tm_malloc((n + 1) * 4);
        uint32_t *u = tm_malloc((n + 1) * 4);
        uint16_t *h = tm_malloc((n + 1) * 2);
        for (size_t i = 0; i < n; i++) {
            b[i] = val(rank, i);
            u[i] = (uint32_t)(i * 7 + rank * 1000003u);
            h[i] = to_bf16(val(rank, i));
        }
        bad += tm_tp_host_allreduce_sum(c, b, n, TM_TP_HOST_F32, &err) != TM_OK;
        bad += tm_tp_host_allreduce_sum(c, u, n, TM_TP_HOST_U32, &err) != TM_OK;
        bad += tm_tp_host_allreduce_sum(c, h, n, TM_TP_HOST_BF16, &err) != TM_OK;
        for (size_t i = 0; i < n && !bad; i++) {
            float want = val(0, i), wh = from_bf16(to_bf16(val(0, i)));
            uint32_t wu = 0;
            for (uint32_t r = 1; r < world; r++) {
                want += val(r, i);
                wh += from_bf16(to_bf16(val(r, i)));
            }
            for (uint32_t r = 0; r < world; r++)
                wu += (uint32_t)(i * 7 + r * 1000003u);
            if (memcmp(&b[i], &want, 4) || u[i] != wu ||
                fabsf(from_bf16(h[i]) - wh) > fabsf(wh) / 128) {
                fprintf(stderr, "rank %u n %zu i %zu: %g vs %g, %u vs %u, %g vs %g\n", rank, n, i,
                        b[i], want, u[i], wu, from_bf16(h[i]), wh);
                bad++;
            }
        }
        tm_free(b), tm_free(u), tm_free(h);
    }
    // all-gather of 3 chunks and a bit
    const size_t n = 3 * CHUNK_F32 + 3;
    float *s = tm_malloc(n * 4), *all = tm_malloc(n * world * 4);
    for (size_t i = 0; i < n; i++)
        s[i] = val(rank, i);
    bad += tm_tp_host_allgather(c, s, all, n, TM_TP_HOST_F32, &err) != TM_OK;
    for (uint32_t r = 0; r < world && !bad; r++)
        for (size_t i = 0; i < n && !bad; i++)
            bad += all[(size_t)r * n + i] != val(r, i);
    tm_free(s), tm_free(all);
    if (bad)
        fprintf(stderr, "rank %u: %d bad (%s)\n", rank, bad, err.msg);
    tm_tp_host_destroy(c);
    return bad;
}

static void run_world(uint32_t world, uint32_t salt) {
    uint8_t id[TM_TP_HOST_ID_BYTES];
    make_id(id, salt);
    pid_t kids[TM_TP_HOST_MAX_RANKS];
    for (uint32_t r = 1; r < world; r++) {
        kids[r] = fork();
        if (kids[r] == 0)
            _exit(rank_run(id, r, world) ? 1 : 0);
    }
    TM_CHECK(rank_run(id, 0, world) == 0);
    for (uint32_t r = 1; r < world; r++) {
        int st = 0;
        TM_CHECK(waitpid(kids[r], &st, 0) == kids[r]);
        TM_CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "world %u rank %u failed", world, r);
    }
}

static void test_two(void) { run_world(2, 1); }
static void test_three(void) { run_world(3, 2); }
static void test_four(void) { run_world(4, 3); }

static void test_invalid(void) {
    uint8_t id[TM_TP_HOST_ID_BYTES];
    make_id(id, 4);
    tm_err err = {0};
    tm_tp_host *c = NULL;
    TM_CHECK(tm_tp_host_create(id, 2, 2, 100, &c, &err) == TM_E_INVAL);
    TM_CHECK(tm_tp_host_create(id, 0, 1, 100, &c, &err) == TM_E_INVAL);
    TM_CHECK(strstr(err.msg, "rank 0 of 1") != NULL);
    // alone in a world of 2: the join times out with a message, the name is removed
    TM_CHECK(tm_tp_host_create(id, 0, 2, 200, &c, &err) == TM_E_IO);
    TM_CHECK_MSG(strstr(err.msg, "1 of 2 ranks joined") != NULL, "%s", err.msg);
}

/* A rank joins, then exits without taking part: the other's all-reduce fails with the barrier
 * message; an abort by one rank fails the other's next collective. */
static void test_missing_rank_and_abort(void) {
    uint8_t id[TM_TP_HOST_ID_BYTES];
    make_id(id, 5);
    pid_t kid = fork();
    if (kid == 0) {
        tm_err e = {0};
        tm_tp_host *k = NULL;
        _exit(tm_tp_host_create(id, 1, 2, 20000, &k, &e) ? 1 : 0); // joins, never arrives
    }
    tm_err err = {0};
    tm_tp_host *c = NULL;
    TM_CHECK_OK(tm_tp_host_create(id, 0, 2, 300, &c, &err), &err);
    float x[4] = {1, 2, 3, 4};
    TM_CHECK(c && tm_tp_host_allreduce_sum(c, x, 4, TM_TP_HOST_F32, &err) == TM_E_IO);
    TM_CHECK_MSG(strstr(err.msg, "all-reduce barrier: a rank did not arrive") != NULL, "%s",
                 err.msg);
    TM_CHECK(c && tm_tp_host_check(c, &err) == TM_E_IO); // a timeout aborts for good
    int st = 0;
    waitpid(kid, &st, 0);
    tm_tp_host_destroy(c);

    // abort from rank 1 while rank 0 waits in a collective with no timeout
    make_id(id, 6);
    kid = fork();
    if (kid == 0) {
        tm_err e = {0};
        tm_tp_host *k = NULL;
        if (tm_tp_host_create(id, 1, 2, 0, &k, &e))
            _exit(1);
        usleep(100 * 1000);
        tm_tp_host_abort(k);
        tm_tp_host_destroy(k);
        _exit(0);
    }
    c = NULL;
    TM_CHECK_OK(tm_tp_host_create(id, 0, 2, 0, &c, &err), &err);
    TM_CHECK(c && tm_tp_host_allreduce_sum(c, x, 4, TM_TP_HOST_F32, &err) == TM_E_IO);
    TM_CHECK_MSG(strstr(err.msg, "aborted") != NULL, "%s", err.msg);
    waitpid(kid, &st, 0);
    TM_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    tm_tp_host_destroy(c);
}

/* Once every rank joined, nothing named after the id is left in /dev/shm. */
static void test_name_unlinked(void) {
    uint8_t id[TM_TP_HOST_ID_BYTES];
    make_id(id, 7);
    pid_t kid = fork();
    if (kid == 0) {
        tm_err e = {0};
        tm_tp_host *k = NULL;
        const int rc = tm_tp_host_create(id, 1, 2, 20000, &k, &e);
        float x = 1;
        const int rc2 = rc ? 1 : tm_tp_host_allreduce_sum(k, &x, 1, TM_TP_HOST_F32, &e);
        tm_tp_host_destroy(k);
        _exit(rc || rc2 || x != 3 ? 1 : 0);
    }
    tm_err err = {0};
    tm_tp_host *c = NULL;
    TM_CHECK_OK(tm_tp_host_create(id, 0, 2, 20000, &c, &err), &err);
    float x = 2;
    TM_CHECK_OK(tm_tp_host_allreduce_sum(c, &x, 1, TM_TP_HOST_F32, &err), &err);
    TM_CHECK(x == 3);
    int st = 0;
    waitpid(kid, &st, 0);
    TM_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    tm_tp_host_destroy(c);
    // the name: a fresh create with the same id finds a new, empty segment (joined 0), so it
    // times out alone instead of seeing two joined ranks
    c = NULL;
    TM_CHECK(tm_tp_host_create(id, 0, 2, 100, &c, &err) == TM_E_IO);
    TM_CHECK_MSG(strstr(err.msg, "1 of 2 ranks joined") != NULL, "%s", err.msg);
}

int main(void) {
    TM_RUN(test_two);
    TM_RUN(test_three);
    TM_RUN(test_four);
    TM_RUN(test_invalid);
    TM_RUN(test_missing_rank_and_abort);
    TM_RUN(test_name_unlinked);
    return tm_test_report();
}
