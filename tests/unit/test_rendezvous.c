/* tests/unit/test_rendezvous.c - the tensor-parallel rendezvous and control channel
 * (runner/tp/rendezvous.h) with ranks as forked processes on loopback, no GPU: rank 0 hands out a
 * fake NCCL id and world info and broadcasts fake step plans (small, empty and 1 MiB ones, with
 * checksums) that every rank must receive intact and in order; then the failure cases: a rank
 * that never joins (rank 0 times out naming it), a rank that dies after joining (rank 0's
 * liveness check names it), a rank that reports a failure (its message reaches rank 0), rank 0
 * dying (the others get EOF, with a message), nobody listening (join times out), and a rank
 * with the wrong world size (refused on both sides). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/clock.h"
#include "runner/tp/rendezvous.h"
#include "tm_test.h"

#define FAKE_ID_BYTES 128
#define PLAN_TYPE (TM_RDZV_MSG_USER + 1)
#define STOP_TYPE (TM_RDZV_MSG_USER + 2)
#define N_PLAN 40
#define BIG (1u << 20)

typedef struct welcome {
    uint8_t id[FAKE_ID_BYTES];
    uint32_t world, n_plan;
} welcome;

static void fake_id(uint8_t *id) {
    for (int i = 0; i < FAKE_ID_BYTES; i++)
        id[i] = (uint8_t)(i * 7 + 3);
}

static uint32_t plan_len(uint32_t k) { return k % 10 == 9 ? BIG : k % 7 == 3 ? 0 : 16 + k * 13; }

static uint32_t checksum(const uint8_t *p, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 16777619u;
    return h;
}

static tm_rdzv_cfg cfg_of(uint16_t port, uint32_t rank, uint32_t world, uint32_t timeout_ms) {
    return (tm_rdzv_cfg){
        .addr = "127.0.0.1", .port = port, .rank = rank, .world = world, .timeout_ms = timeout_ms};
}

/* ---- child bodies: return the exit code (0 = the child's checks passed) ---- */

static int child_exchange(uint16_t port, uint32_t rank, uint32_t world) {
    tm_err err = {0};
    tm_rdzv *r = NULL;
    welcome w;
    size_t len = 0;
    tm_rdzv_cfg c = cfg_of(port, rank, world, 5000);
    if (tm_rdzv_join(&c, &r, &w, sizeof(w), &len, &err)) {
        fprintf(stderr, "rank %u join: %s\n", rank, err.msg);
        return 10;
    }
    uint8_t want[FAKE_ID_BYTES];
    fake_id(want);
    if (len != sizeof(w) || memcmp(w.id, want, sizeof(want)) || w.world != world)
        return 11;
    uint8_t *buf = malloc(BIG + 8);
    int bad = 0;
    for (uint32_t k = 0;; k++) {
        uint32_t type = 0;
        size_t n = 0;
        if (tm_rdzv_recv(r, 5000, &type, buf, BIG + 8, &n, &err)) {
            fprintf(stderr, "rank %u recv %u: %s\n", rank, k, err.msg);
            bad = 12;
            break;
        }
        if (type == STOP_TYPE) {
            bad = k == w.n_plan ? bad : 13;
            break;
        }
        uint32_t seq = 0, sum = 0;
        memcpy(&seq, buf, 4);
        memcpy(&sum, buf + 4, 4);
        if (type != PLAN_TYPE || seq != k || n != 8 + plan_len(k) ||
            sum != checksum(buf + 8, plan_len(k)))
            bad = 14;
        if (tm_rdzv_check(r, &err)) // rank 0 alive: nothing to report
            bad = 15;
    }
    free(buf);
    tm_rdzv_close(r);
    return bad;
}

static pid_t spawn(int (*fn)(uint16_t, uint32_t, uint32_t), uint16_t port, uint32_t rank,
                   uint32_t world) {
    fflush(NULL);
    pid_t pid = fork();
    TM_ASSERT(pid >= 0);
    if (pid == 0)
        _exit(fn(port, rank, world));
    return pid;
}

static int wait_code(pid_t pid) {
    int st = 0;
    if (waitpid(pid, &st, 0) != pid)
        return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 100 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

static tm_rdzv *listen_on(uint32_t world, uint32_t timeout_ms) {
    tm_err err = {0};
    tm_rdzv *r = NULL;
    tm_rdzv_cfg c = cfg_of(0, 0, world, timeout_ms);
    TM_CHECK_OK(tm_rdzv_listen(&c, &r, &err), &err);
    TM_ASSERT(r);
    TM_CHECK(tm_rdzv_port(r) != 0);
    return r;
}

static void test_exchange(void) {
    const uint32_t world = 4;
    tm_rdzv *r = listen_on(world, 5000);
    pid_t kids[4];
    for (uint32_t k = 1; k < world; k++) // ranks join in reverse order
        kids[k] = spawn(child_exchange, tm_rdzv_port(r), world - k, world);
    welcome w = {.world = world, .n_plan = N_PLAN};
    fake_id(w.id);
    tm_err err = {0};
    TM_CHECK_OK(tm_rdzv_accept(r, &w, sizeof(w), &err), &err);
    uint8_t *body = malloc(BIG);
    for (uint32_t k = 0; k < N_PLAN; k++) {
        const uint32_t n = plan_len(k);
        for (uint32_t i = 0; i < n; i++)
            body[i] = (uint8_t)(i * 31 + k);
        uint32_t head[2] = {k, checksum(body, n)};
        TM_CHECK_OK(tm_rdzv_bcast(r, PLAN_TYPE, head, sizeof(head), body, n, &err), &err);
    }
    TM_CHECK_OK(tm_rdzv_bcast(r, STOP_TYPE, NULL, 0, NULL, 0, &err), &err);
    free(body);
    for (uint32_t k = 1; k < world; k++)
        TM_CHECK_MSG(wait_code(kids[k]) == 0, "rank child %u failed", k);
    tm_rdzv_close(r);
}

/* Joins, then expects rank 0 to give up on the rendezvous (no welcome). */
static int child_expect_no_welcome(uint16_t port, uint32_t rank, uint32_t world) {
    tm_err err = {0};
    tm_rdzv *r = NULL;
    welcome w;
    size_t len = 0;
    tm_rdzv_cfg c = cfg_of(port, rank, world, 5000);
    tm_rc rc = tm_rdzv_join(&c, &r, &w, sizeof(w), &len, &err);
    if (rc != TM_E_IO || !strstr(err.msg, "got no answer from rank 0")) {
        fprintf(stderr, "rank %u: unexpected: %d %s\n", rank, rc, err.msg);
        return 20;
    }
    return 0;
}

static void test_missing_rank(void) {
    tm_rdzv *r = listen_on(3, 600);
    pid_t kid = spawn(child_expect_no_welcome, tm_rdzv_port(r), 1, 3);
    welcome w = {.world = 3};
    tm_err err = {0};
    double t0 = tm_now_ms();
    TM_CHECK(tm_rdzv_accept(r, &w, sizeof(w), &err) == TM_E_IO);
    double dt = tm_now_ms() - t0;
    fprintf(stderr, "  missing rank after %.0f ms: %s\n", dt, err.msg);
    TM_CHECK(strstr(err.msg, "only 2 of 3 ranks joined") != NULL);
    TM_CHECK(strstr(err.msg, "missing rank(s) 2") != NULL);
    TM_CHECK(dt >= 500 && dt < 3000);
    tm_rdzv_close(r);
    TM_CHECK(wait_code(kid) == 0);
}

/* Joins, then exits at once: a crashed rank. */
static int child_die(uint16_t port, uint32_t rank, uint32_t world) {
    tm_err err = {0};
    tm_rdzv *r = NULL;
    welcome w;
    size_t len = 0;
    tm_rdzv_cfg c = cfg_of(port, rank, world, 5000);
    if (tm_rdzv_join(&c, &r, &w, sizeof(w), &len, &err))
        return 30;
    _exit(0); // no close: the kernel closes the socket, as for a crash
}

static void test_dead_rank(void) {
    tm_rdzv *r = listen_on(2, 5000);
    pid_t kid = spawn(child_die, tm_rdzv_port(r), 1, 2);
    welcome w = {.world = 2};
    tm_err err = {0};
    TM_CHECK_OK(tm_rdzv_accept(r, &w, sizeof(w), &err), &err);
    TM_CHECK(wait_code(kid) == 0);
    tm_rc rc = tm_rdzv_check(r, &err);
    fprintf(stderr, "  dead rank: %s\n", err.msg);
    TM_CHECK(rc == TM_E_IO);
    TM_CHECK(strstr(err.msg, "rank 1") && strstr(err.msg, "closed its connection"));
    // sending to it fails too (the first send may still be accepted by the kernel)
    rc = TM_OK;
    for (int i = 0; i < 50 && rc == TM_OK; i++)
        rc = tm_rdzv_bcast(r, PLAN_TYPE, &i, sizeof(i), NULL, 0, &err);
    TM_CHECK(rc == TM_E_IO && strstr(err.msg, "rank 1"));
    tm_rdzv_close(r);
}

/* Joins, reports a failure, then waits for rank 0 to hang up. */
static int child_report(uint16_t port, uint32_t rank, uint32_t world) {
    tm_err err = {0};
    tm_rdzv *r = NULL;
    welcome w;
    size_t len = 0;
    tm_rdzv_cfg c = cfg_of(port, rank, world, 5000);
    if (tm_rdzv_join(&c, &r, &w, sizeof(w), &len, &err))
        return 40;
    tm_rdzv_report(r, "cuda engine: cudaMalloc: out of memory");
    uint32_t type;
    char buf[64];
    tm_rc rc = tm_rdzv_recv(r, 5000, &type, buf, sizeof(buf), &len, &err);
    // rank 0 closes after reading the report: EOF, with a message saying so
    int ok = rc == TM_E_IO && strstr(err.msg, "closed the control connection");
    if (!ok)
        fprintf(stderr, "rank %u: unexpected: %d %s\n", rank, rc, err.msg);
    tm_rdzv_close(r);
    return ok ? 0 : 41;
}

static void test_failure_report(void) {
    tm_rdzv *r = listen_on(2, 5000);
    pid_t kid = spawn(child_report, tm_rdzv_port(r), 1, 2);
    welcome w = {.world = 2};
    tm_err err = {0};
    TM_CHECK_OK(tm_rdzv_accept(r, &w, sizeof(w), &err), &err);
    tm_rc rc = TM_OK;
    for (double t0 = tm_now_ms(); rc == TM_OK && tm_now_ms() - t0 < 3000;) {
        rc = tm_rdzv_check(r, &err);
        usleep(1000);
    }
    fprintf(stderr, "  report: %s\n", err.msg);
    TM_CHECK(rc == TM_E_INTERNAL);
    TM_CHECK(strstr(err.msg, "rank 1") && strstr(err.msg, "out of memory"));
    tm_rdzv_close(r);
    TM_CHECK(wait_code(kid) == 0);
}

static void test_no_master(void) {
    // a port nobody listens on: listen, note the port, close
    tm_rdzv *r = listen_on(2, 1000);
    const uint16_t port = tm_rdzv_port(r);
    tm_rdzv_close(r);
    tm_err err = {0};
    tm_rdzv *j = NULL;
    welcome w;
    size_t len = 0;
    tm_rdzv_cfg c = cfg_of(port, 1, 2, 400);
    double t0 = tm_now_ms();
    TM_CHECK(tm_rdzv_join(&c, &j, &w, sizeof(w), &len, &err) == TM_E_IO && j == NULL);
    double dt = tm_now_ms() - t0;
    fprintf(stderr, "  no master after %.0f ms: %s\n", dt, err.msg);
    TM_CHECK(strstr(err.msg, "cannot reach rank 0") && strstr(err.msg, "refused"));
    TM_CHECK(dt >= 350 && dt < 3000);
}

/* Joins with a world size rank 0 does not have: refused. */
static int child_wrong_world(uint16_t port, uint32_t rank, uint32_t world) {
    tm_err err = {0};
    tm_rdzv *r = NULL;
    welcome w;
    size_t len = 0;
    tm_rdzv_cfg c = cfg_of(port, rank, world, 5000);
    tm_rc rc = tm_rdzv_join(&c, &r, &w, sizeof(w), &len, &err);
    return rc == TM_E_INVAL && strstr(err.msg, "refused") && strstr(err.msg, "world size") ? 0 : 50;
}

static void test_wrong_world(void) {
    tm_rdzv *r = listen_on(2, 5000);
    pid_t kid = spawn(child_wrong_world, tm_rdzv_port(r), 1, 3);
    welcome w = {.world = 2};
    tm_err err = {0};
    TM_CHECK(tm_rdzv_accept(r, &w, sizeof(w), &err) == TM_E_INVAL);
    fprintf(stderr, "  wrong world: %s\n", err.msg);
    TM_CHECK(strstr(err.msg, "says world size 3, rank 0 has 2") != NULL);
    tm_rdzv_close(r);
    TM_CHECK(wait_code(kid) == 0);
}

/* The other side of a dead rank 0: recv and check report EOF. */
static int child_rank0_dies(uint16_t port, uint32_t rank, uint32_t world) {
    tm_err err = {0};
    tm_rdzv *r = NULL;
    welcome w;
    size_t len = 0;
    tm_rdzv_cfg c = cfg_of(port, rank, world, 5000);
    if (tm_rdzv_join(&c, &r, &w, sizeof(w), &len, &err))
        return 60;
    uint32_t type;
    char buf[64];
    tm_rc rc = tm_rdzv_recv(r, -1, &type, buf, sizeof(buf), &len, &err);
    int ok = rc == TM_E_IO && strstr(err.msg, "closed the control connection");
    ok = ok && tm_rdzv_check(r, &err) == TM_E_IO && strstr(err.msg, "rank 0");
    tm_rdzv_close(r);
    return ok ? 0 : 61;
}

static void test_rank0_dies(void) {
    tm_rdzv *r = listen_on(3, 5000);
    pid_t k1 = spawn(child_rank0_dies, tm_rdzv_port(r), 1, 3);
    pid_t k2 = spawn(child_rank0_dies, tm_rdzv_port(r), 2, 3);
    welcome w = {.world = 3};
    tm_err err = {0};
    TM_CHECK_OK(tm_rdzv_accept(r, &w, sizeof(w), &err), &err);
    tm_rdzv_close(r); // as if rank 0 crashed
    TM_CHECK(wait_code(k1) == 0);
    TM_CHECK(wait_code(k2) == 0);
}

static void test_bad_cfg(void) {
    tm_err err = {0};
    tm_rdzv *r = NULL;
    tm_rdzv_cfg c = cfg_of(0, 1, 2, 100);
    TM_CHECK(tm_rdzv_listen(&c, &r, &err) == TM_E_INVAL); // only rank 0 listens
    c = cfg_of(0, 0, 1, 100);
    TM_CHECK(tm_rdzv_listen(&c, &r, &err) == TM_E_INVAL); // world < 2
    c = cfg_of(0, 0, 2, 100);
    c.addr = "no-such-host.invalid";
    TM_CHECK(tm_rdzv_listen(&c, &r, &err) == TM_E_IO && strstr(err.msg, "resolve"));
}

int main(void) {
    signal(SIGPIPE, SIG_IGN); // belt and braces: the module uses MSG_NOSIGNAL
    TM_RUN(test_exchange);
    TM_RUN(test_missing_rank);
    TM_RUN(test_dead_rank);
    TM_RUN(test_failure_report);
    TM_RUN(test_no_master);
    TM_RUN(test_wrong_world);
    TM_RUN(test_rank0_dies);
    TM_RUN(test_bad_cfg);
    return tm_test_report();
}
