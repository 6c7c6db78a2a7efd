/* tests/kafka/test_kafka_in.c - the Kafka source's held record across a rebalance, on librdkafka's
 * in-process mock cluster (test.mock.num.brokers; loopback only): consumer A takes its first
 * record and then waits to push it, as the source thread does while the runner's queue is full
 * (tm_source_wait); consumer B joins the group meanwhile. The eager revoke that follows takes
 * the held record's partition from A, so tm_source_wait must report the record dropped, and the
 * drop must leave A's bookkeeping as if the record had never been handed out: its offset is not
 * done, its seq_no goes to the next record (seq_nos stay dense, so the durable watermark keeps
 * moving), and every record is handed out again after the drop, by B or (if the partition comes
 * back to A) by A, once per consumer. Second, closing a consumer whose broker has stopped
 * answering (mock round-trip time of 10 minutes) returns within its bounded wait (issue 24: the
 * synchronous commit on close used to wait without limit), and a consumer that resumes from the
 * first one's done offsets, as the next run does from the manifest, hands out exactly the records
 * that were not durable, whatever became of the unanswered commit. Third, a process that gave up
 * on such a close does not exit while librdkafka is still shutting that consumer down (exit()
 * beside librdkafka's threads is undefined; issue 32, the teardown crash this test once had).
 * Skips (77) in a build without librdkafka. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/record.h"
#include "ingest/job_spec.h"
#include "ingest/source.h"
#include "tm_test.h"

#if defined(__has_include)
#if __has_include(<librdkafka/rdkafka_mock.h>)
#define HAVE_MOCK 1
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>
#endif
#endif

#ifndef HAVE_MOCK
int main(void) {
    tm_test_skip("no librdkafka headers");
    return 77;
}
#else

#define N_PART 2
#define N_PER_PART 12

static char g_tmp[256];

typedef struct seen {
    pthread_mutex_t mu;
    int n[N_PART][N_PER_PART]; /* times each (partition, offset) was handed out */
} seen;

// Partition and offset of a Kafka record: file "kafka:TOPIC/P", line offset + 1.
static void where(const tm_job *job, int *part, int *off) {
    const char *slash = strrchr(job->file, '/');
    *part = slash ? atoi(slash + 1) : -1;
    *off = (int)job->line - 1;
}

static void note(seen *s, const tm_job *job) {
    int p, o;
    where(job, &p, &o);
    TM_CHECK(p >= 0 && p < N_PART && o >= 0 && o < N_PER_PART);
    if (p < 0 || p >= N_PART || o < 0 || o >= N_PER_PART)
        return;
    pthread_mutex_lock(&s->mu);
    s->n[p][o]++;
    pthread_mutex_unlock(&s->mu);
}

// conf: the "key": "value" pairs of input.kafka.config besides heartbeat.interval.ms.
static tm_job_spec *load_spec_conf(const char *bs, const char *topic, const char *group,
                                   const char *name, const char *conf) {
    char job[2048], path[512];
    snprintf(job, sizeof(job),
             "{\"model\": \"m\", \"output\": {\"dir\": \"o\"}, \"input\": {\"kafka\": "
             "{\"brokers\": \"%s\", \"topics\": [\"%s\"], \"group\": \"%s\", \"config\": "
             "{\"heartbeat.interval.ms\": \"300\", %s}}}}",
             bs, topic, group, conf);
    snprintf(path, sizeof(path), "%s/%s.json", g_tmp, name);
    FILE *f = fopen(path, "w");
    TM_CHECK(f != NULL);
    if (!f)
        return NULL;
    fputs(job, f);
    fclose(f);
    tm_job_spec *spec = NULL;
    tm_err err = {0};
    TM_CHECK_OK(tm_job_spec_load(path, &spec, &err), &err);
    return spec;
}

static tm_job_spec *load_spec_on(const char *bs, const char *topic, const char *group,
                                 const char *name) {
    return load_spec_conf(bs, topic, group, name, "\"session.timeout.ms\": \"6000\"");
}

static tm_job_spec *load_spec(const char *bs, const char *name) {
    return load_spec_on(bs, "held", "gh", name);
}

typedef struct consumer_b {
    const tm_job_spec *spec;
    seen *seen;
    tm_rc rc;
} consumer_b;

// B: the second member. Drains what it is given, acknowledging every record at once.
static void *b_main(void *arg) {
    consumer_b *b = arg;
    tm_err err = {0};
    tm_source *src = NULL;
    b->rc = tm_source_open(b->spec, &src, &err);
    for (;;) {
        tm_job *job = NULL;
        if (b->rc || (b->rc = tm_source_next(src, &job, &err)) != TM_OK)
            break;
        note(b->seen, job);
        b->rc = tm_source_ack(src, &job->seq_no, 1, &err);
        tm_job_destroy(job);
    }
    if (b->rc == TM_E_EOF)
        b->rc = TM_OK;
    if (b->rc)
        fprintf(stderr, "consumer B: %s\n", err.msg);
    tm_source_destroy(src);
    return NULL;
}

typedef struct pos_check {
    int part, off;
    bool done; /* the offset is in the partition's done set */
} pos_check;

static tm_rc check_pos(void *ctx, const tm_source_kpos *pos, tm_err *err) {
    (void)err;
    pos_check *c = ctx;
    if (pos->partition != c->part)
        return TM_OK;
    if (c->off < pos->next)
        c->done = true;
    for (size_t i = 0; i < pos->n_ranges; i++)
        if ((uint64_t)c->off >= pos->ranges[2 * i] && (uint64_t)c->off <= pos->ranges[2 * i + 1])
            c->done = true;
    return TM_OK;
}

static void test_held_record_dropped(void) {
    tm_err err = {0};
    char es[512];
    // The mock cluster lives in this producer; the consumers reach it over loopback.
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    TM_CHECK(rd_kafka_conf_set(conf, "test.mock.num.brokers", "1", es, sizeof(es)) ==
             RD_KAFKA_CONF_OK);
    rd_kafka_t *prod = rd_kafka_new(RD_KAFKA_PRODUCER, conf, es, sizeof(es));
    TM_CHECK(prod != NULL);
    if (!prod)
        return;
    rd_kafka_mock_cluster_t *mc = rd_kafka_handle_mock_cluster(prod);
    TM_CHECK(rd_kafka_mock_topic_create(mc, "held", N_PART, 1) == RD_KAFKA_RESP_ERR_NO_ERROR);
    for (int p = 0; p < N_PART; p++)
        for (int o = 0; o < N_PER_PART; o++) {
            char v[128];
            int n = snprintf(v, sizeof(v), "{\"id\": \"p%d-%d\", \"prompt\": \"x\"}", p, o);
            TM_CHECK(rd_kafka_producev(prod, RD_KAFKA_V_TOPIC("held"), RD_KAFKA_V_PARTITION(p),
                                       RD_KAFKA_V_VALUE(v, (size_t)n),
                                       RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                                       RD_KAFKA_V_END) == RD_KAFKA_RESP_ERR_NO_ERROR);
        }
    TM_CHECK(rd_kafka_flush(prod, 10000) == RD_KAFKA_RESP_ERR_NO_ERROR);
    const char *bs = rd_kafka_mock_cluster_bootstraps(mc);
    tm_job_spec *spec_a = load_spec(bs, "a"), *spec_b = load_spec(bs, "b");
    seen seen_a = {.mu = PTHREAD_MUTEX_INITIALIZER}, seen_b = {.mu = PTHREAD_MUTEX_INITIALIZER};
    tm_source *a = NULL;
    if (!spec_a || !spec_b)
        goto done;
    tm_rc orc = tm_source_open(spec_a, &a, &err);
    if (orc && strstr(err.msg, "without librdkafka"))
        tm_test_skip(err.msg); // the stub source: headers installed, library not built in
    TM_CHECK_OK(orc, &err);
    if (!a)
        goto done;

    // A's first record, held as if the runner's queue were full.
    tm_job *held = NULL;
    TM_CHECK_OK(tm_source_next(a, &held, &err), &err);
    if (!held)
        goto done;
    TM_CHECK(held->seq_no == 0);
    int held_part, held_off;
    where(held, &held_part, &held_off);

    // B joins; A keeps serving its consumer from tm_source_wait until the revoke takes the
    // held record back (eager: every partition is revoked).
    consumer_b b = {.spec = spec_b, .seen = &seen_b};
    pthread_t bt;
    TM_CHECK(pthread_create(&bt, NULL, b_main, &b) == 0);
    bool drop = false;
    double t0 = tm_now_ms();
    while (!drop && tm_now_ms() - t0 < 30000.0)
        TM_CHECK_OK(tm_source_wait(a, held, 100, &drop, &err), &err);
    TM_CHECK_MSG(drop, "the held record was not dropped within 30 s");
    tm_job_destroy(held);
    if (drop) {
        TM_CHECK(tm_source_n_records(a) == 0); // its seq_no is taken back
        pos_check pc = {.part = held_part, .off = held_off};
        TM_CHECK_OK(tm_source_positions(a, check_pos, &pc, &err), &err);
        TM_CHECK_MSG(!pc.done, "the dropped offset %d/%d is in A's done set", held_part, held_off);
    }

    // A drains what it owns now, acknowledging as it goes: seq_nos stay dense from 0.
    uint64_t want_seq = 0;
    for (;;) {
        tm_job *job = NULL;
        tm_rc rc = tm_source_next(a, &job, &err);
        if (rc == TM_E_EOF)
            break;
        TM_CHECK_OK(rc, &err);
        if (rc)
            break;
        TM_CHECK_MSG(job->seq_no == want_seq, "seq_no %llu, want %llu",
                     (unsigned long long)job->seq_no, (unsigned long long)want_seq);
        want_seq = job->seq_no + 1;
        note(&seen_a, job);
        TM_CHECK_OK(tm_source_ack(a, &job->seq_no, 1, &err), &err);
        tm_job_destroy(job);
    }
    TM_CHECK(tm_source_durable_watermark(a) == want_seq);
    TM_CHECK(pthread_join(bt, NULL) == 0);
    TM_CHECK_OK(b.rc, &err);

    // After the drop every record is handed out again, at most once per consumer (a partition
    // that moves from B back to A restarts at B's committed offset). The held one is answered
    // by whoever owns its partition now, never by A's held copy.
    for (int p = 0; p < N_PART; p++)
        for (int o = 0; o < N_PER_PART; o++) {
            TM_CHECK_MSG(seen_a.n[p][o] <= 1 && seen_b.n[p][o] <= 1, "%d/%d: A %d, B %d", p, o,
                         seen_a.n[p][o], seen_b.n[p][o]);
            TM_CHECK_MSG(seen_a.n[p][o] + seen_b.n[p][o] >= 1, "%d/%d handed out by nobody", p, o);
        }
    fprintf(stderr, "held %d/%d dropped; afterwards A took %llu records\n", held_part, held_off,
            (unsigned long long)want_seq);
done:
    tm_source_destroy(a);
    tm_job_spec_destroy(spec_a);
    tm_job_spec_destroy(spec_b);
    rd_kafka_destroy(prod);
}

// Released records stay released until the runner asks (issue 39): consumer A (release on) takes
// four records and starts the first; B joins and the eager revoke releases A's queued second and
// third (the fourth is held, as in test_held_record_dropped). The started record becomes durable
// before the runner asks for the released ones (a busy runner, or a starved one under load): the
// ack must not let them leave A's ring unnoticed, for a record A cannot find starts, and A would
// answer it besides its next owner (or twice itself, were the partition assigned back). Then both
// drain, A answering only what tm_source_start lets run: no record is answered twice by one
// consumer, none by nobody.
static void test_released_until_asked(void) {
    tm_err err = {0};
    char es[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    TM_CHECK(rd_kafka_conf_set(conf, "test.mock.num.brokers", "1", es, sizeof(es)) ==
             RD_KAFKA_CONF_OK);
    rd_kafka_t *prod = rd_kafka_new(RD_KAFKA_PRODUCER, conf, es, sizeof(es));
    TM_CHECK(prod != NULL);
    if (!prod)
        return;
    rd_kafka_mock_cluster_t *mc = rd_kafka_handle_mock_cluster(prod);
    TM_CHECK(rd_kafka_mock_topic_create(mc, "rel", N_PART, 1) == RD_KAFKA_RESP_ERR_NO_ERROR);
    for (int p = 0; p < N_PART; p++)
        for (int o = 0; o < N_PER_PART; o++) {
            char v[128];
            int n = snprintf(v, sizeof(v), "{\"id\": \"p%d-%d\", \"prompt\": \"x\"}", p, o);
            TM_CHECK(rd_kafka_producev(prod, RD_KAFKA_V_TOPIC("rel"), RD_KAFKA_V_PARTITION(p),
                                       RD_KAFKA_V_VALUE(v, (size_t)n),
                                       RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                                       RD_KAFKA_V_END) == RD_KAFKA_RESP_ERR_NO_ERROR);
        }
    TM_CHECK(rd_kafka_flush(prod, 10000) == RD_KAFKA_RESP_ERR_NO_ERROR);
    const char *bs = rd_kafka_mock_cluster_bootstraps(mc);
    tm_job_spec *spec_a = load_spec_on(bs, "rel", "gr", "ra");
    tm_job_spec *spec_b = load_spec_on(bs, "rel", "gr", "rb");
    seen seen_a = {.mu = PTHREAD_MUTEX_INITIALIZER}, seen_b = {.mu = PTHREAD_MUTEX_INITIALIZER};
    tm_source *a = NULL;
    tm_job *jobs[4] = {0};
    if (!spec_a || !spec_b)
        goto done;
    tm_rc orc = tm_source_open(spec_a, &a, &err);
    if (orc && strstr(err.msg, "without librdkafka"))
        tm_test_skip(err.msg);
    TM_CHECK_OK(orc, &err);
    if (!a)
        goto done;
    tm_source_set_release(a, true);
    for (int i = 0; i < 4; i++) {
        TM_CHECK_OK(tm_source_next(a, &jobs[i], &err), &err);
        if (!jobs[i])
            goto done;
        TM_CHECK(jobs[i]->seq_no == (uint64_t)i);
    }
    TM_CHECK(tm_source_start(a, 0)); // the runner starts the first: A answers it
    note(&seen_a, jobs[0]);

    consumer_b b = {.spec = spec_b, .seen = &seen_b};
    pthread_t bt;
    TM_CHECK(pthread_create(&bt, NULL, b_main, &b) == 0);
    bool drop = false;
    double t0 = tm_now_ms();
    while (!drop && tm_now_ms() - t0 < 30000.0)
        TM_CHECK_OK(tm_source_wait(a, jobs[3], 100, &drop, &err), &err);
    TM_CHECK_MSG(drop, "the held record was not dropped within 30 s");
    tm_source_kskips k;
    tm_source_kafka_skips(a, &k);
    TM_CHECK_MSG(k.released == 2, "%llu released, want 2", (unsigned long long)k.released);

    // The started record becomes durable first; then the runner asks for the released two.
    uint64_t seq = 0;
    TM_CHECK_OK(tm_source_ack(a, &seq, 1, &err), &err);
    for (int i = 1; i <= 2; i++) {
        bool run = tm_source_start(a, (uint64_t)i);
        TM_CHECK_MSG(!run, "released seq_no %d starts after an earlier ack", i);
        if (run) // the runner would answer it
            note(&seen_a, jobs[i]);
    }
    uint64_t rel[2] = {1, 2}; // their released completions, acknowledged by the sink
    TM_CHECK_OK(tm_source_ack(a, rel, 2, &err), &err);

    for (;;) { // A drains, answering only what it may start
        tm_job *job = NULL;
        tm_rc rc = tm_source_next(a, &job, &err);
        if (rc == TM_E_EOF)
            break;
        TM_CHECK_OK(rc, &err);
        if (rc)
            break;
        if (tm_source_start(a, job->seq_no))
            note(&seen_a, job);
        TM_CHECK_OK(tm_source_ack(a, &job->seq_no, 1, &err), &err);
        tm_job_destroy(job);
    }
    TM_CHECK(pthread_join(bt, NULL) == 0);
    TM_CHECK_OK(b.rc, &err);
    for (int p = 0; p < N_PART; p++)
        for (int o = 0; o < N_PER_PART; o++) {
            TM_CHECK_MSG(seen_a.n[p][o] <= 1 && seen_b.n[p][o] <= 1, "%d/%d: A %d, B %d", p, o,
                         seen_a.n[p][o], seen_b.n[p][o]);
            TM_CHECK_MSG(seen_a.n[p][o] + seen_b.n[p][o] >= 1, "%d/%d answered by nobody", p, o);
        }
done:
    for (int i = 0; i < 4; i++)
        tm_job_destroy(jobs[i]);
    tm_source_destroy(a);
    tm_job_spec_destroy(spec_a);
    tm_job_spec_destroy(spec_b);
    rd_kafka_destroy(prod);
}

typedef struct saved_pos { /* one partition's done set, as a manifest keeps it */
    char topic[64];
    tm_source_kpos pos;
    uint64_t ranges[64];
    int n;
} saved_pos;

static tm_rc save_pos(void *ctx, const tm_source_kpos *pos, tm_err *err) {
    (void)err;
    saved_pos *c = ctx;
    TM_CHECK(c->n == 0 && pos->n_ranges <= 32);
    if (c->n++ > 0 || pos->n_ranges > 32)
        return TM_OK;
    snprintf(c->topic, sizeof(c->topic), "%s", pos->topic);
    c->pos = *pos;
    c->pos.topic = c->topic;
    memcpy(c->ranges, pos->ranges, 2 * pos->n_ranges * sizeof(*pos->ranges));
    c->pos.ranges = c->ranges;
    return TM_OK;
}

#define N_CLOSE 6
#define N_CLOSE_DURABLE 3

static void test_close_bounded(void) {
    tm_err err = {0};
    char es[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    TM_CHECK(rd_kafka_conf_set(conf, "test.mock.num.brokers", "1", es, sizeof(es)) ==
             RD_KAFKA_CONF_OK);
    rd_kafka_t *prod = rd_kafka_new(RD_KAFKA_PRODUCER, conf, es, sizeof(es));
    TM_CHECK(prod != NULL);
    if (!prod)
        return;
    rd_kafka_mock_cluster_t *mc = rd_kafka_handle_mock_cluster(prod);
    TM_CHECK(rd_kafka_mock_topic_create(mc, "closing", 1, 1) == RD_KAFKA_RESP_ERR_NO_ERROR);
    for (int o = 0; o < N_CLOSE; o++) {
        char v[128];
        int n = snprintf(v, sizeof(v), "{\"id\": \"c%d\", \"prompt\": \"x\"}", o);
        TM_CHECK(rd_kafka_producev(prod, RD_KAFKA_V_TOPIC("closing"), RD_KAFKA_V_PARTITION(0),
                                   RD_KAFKA_V_VALUE(v, (size_t)n),
                                   RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                                   RD_KAFKA_V_END) == RD_KAFKA_RESP_ERR_NO_ERROR);
    }
    TM_CHECK(rd_kafka_flush(prod, 10000) == RD_KAFKA_RESP_ERR_NO_ERROR);
    const char *bs = rd_kafka_mock_cluster_bootstraps(mc);
    tm_job_spec *spec = load_spec_on(bs, "closing", "gc", "c");
    tm_source *a = NULL, *c = NULL;
    if (!spec)
        goto done;
    TM_CHECK_OK(tm_source_open(spec, &a, &err), &err);
    if (!a)
        goto done;
    // A reads every record; only the first N_CLOSE_DURABLE become durable (acked).
    int n_a = 0;
    for (;;) {
        tm_job *job = NULL;
        tm_rc rc = tm_source_next(a, &job, &err);
        if (rc == TM_E_EOF)
            break;
        TM_CHECK_OK(rc, &err);
        if (rc)
            break;
        int p, o;
        where(job, &p, &o);
        if (o < N_CLOSE_DURABLE)
            TM_CHECK_OK(tm_source_ack(a, &job->seq_no, 1, &err), &err);
        n_a++;
        tm_job_destroy(job);
    }
    TM_CHECK(n_a == N_CLOSE);
    // What the manifest would keep: A's done offsets, read before the close.
    saved_pos saved = {.n = 0};
    TM_CHECK_OK(tm_source_positions(a, save_pos, &saved, &err), &err);
    TM_CHECK(saved.n == 1);
    // The broker stops answering: every request waits 10 minutes for its response.
    TM_CHECK(rd_kafka_mock_broker_set_rtt(mc, -1, 600000) == RD_KAFKA_RESP_ERR_NO_ERROR);
    double t0 = tm_now_ms();
    tm_source_destroy(a);
    a = NULL;
    double dt = tm_now_ms() - t0;
    fprintf(stderr, "close with an unanswering broker took %.0f ms\n", dt);
    TM_CHECK_MSG(dt < 10000.0, "close took %.0f ms with the broker not answering", dt);
    TM_CHECK(rd_kafka_mock_broker_set_rtt(mc, -1, 0) == RD_KAFKA_RESP_ERR_NO_ERROR);
    // The next run (C) resumes from those offsets. It connects once the broker answers again (a
    // connection made before would wait out the requests it sent meanwhile).
    TM_CHECK_OK(tm_source_open(spec, &c, &err), &err);
    if (!c || saved.n != 1)
        goto done;
    TM_CHECK_OK(tm_source_resume_positions(c, &saved.pos, &err), &err);
    // C hands out the records that were not durable, each once, and none of the durable ones,
    // whether A's last commit reached the broker or not.
    int seen_c[N_CLOSE] = {0};
    for (;;) {
        tm_job *job = NULL;
        tm_rc rc = tm_source_next(c, &job, &err);
        if (rc == TM_E_EOF)
            break;
        TM_CHECK_OK(rc, &err);
        if (rc)
            break;
        int p, o;
        where(job, &p, &o);
        TM_CHECK(p == 0 && o >= 0 && o < N_CLOSE);
        if (o >= 0 && o < N_CLOSE)
            seen_c[o]++;
        TM_CHECK_OK(tm_source_ack(c, &job->seq_no, 1, &err), &err);
        tm_job_destroy(job);
    }
    for (int o = 0; o < N_CLOSE; o++)
        TM_CHECK_MSG(seen_c[o] == (o < N_CLOSE_DURABLE ? 0 : 1), "offset %d handed out %d times", o,
                     seen_c[o]);
done:
    tm_source_destroy(a);
    tm_source_destroy(c);
    tm_job_spec_destroy(spec);
    rd_kafka_destroy(prod);
}

// ---- exit after a close that was given up on ----

static rd_kafka_t *g_exit_prod; /* the child's mock cluster */
static int g_exit_base;         /* librdkafka threads before the consumer (the mock's) */

// The child's first atexit handler, so the last to run: by now every consumer destroy that
// tm_kafka_in_close gave up on must be over (kafka_in's own exit handler waits for them); a
// librdkafka thread still running here would run beside exit()'s teardown.
static void exit_check(void) {
    int n = rd_kafka_thread_cnt();
    rd_kafka_destroy(g_exit_prod);
    if (n != g_exit_base) {
        fprintf(stderr, "exit with %d librdkafka threads running, %d before the consumer\n", n,
                g_exit_base);
        _exit(3);
    }
    _exit(0);
}

static int exit_child(void) {
    char es[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    if (rd_kafka_conf_set(conf, "test.mock.num.brokers", "1", es, sizeof(es)) != RD_KAFKA_CONF_OK)
        return 2;
    g_exit_prod = rd_kafka_new(RD_KAFKA_PRODUCER, conf, es, sizeof(es));
    if (!g_exit_prod)
        return 2;
    rd_kafka_mock_cluster_t *mc = rd_kafka_handle_mock_cluster(g_exit_prod);
    if (rd_kafka_mock_topic_create(mc, "exiting", 1, 1) != RD_KAFKA_RESP_ERR_NO_ERROR)
        return 2;
    const char v[] = "{\"id\": \"e0\", \"prompt\": \"x\"}";
    if (rd_kafka_producev(g_exit_prod, RD_KAFKA_V_TOPIC("exiting"), RD_KAFKA_V_PARTITION(0),
                          RD_KAFKA_V_VALUE((void *)v, sizeof(v) - 1),
                          RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END) ||
        rd_kafka_flush(g_exit_prod, 10000))
        return 2;
    tm_job_spec *spec = load_spec_conf(rd_kafka_mock_cluster_bootstraps(mc), "exiting", "ge", "e",
                                       "\"session.timeout.ms\": \"6000\"");
    tm_source *a = NULL;
    tm_err err = {0};
    g_exit_base = rd_kafka_thread_cnt();
    atexit(exit_check);
    if (!spec || tm_source_open(spec, &a, &err) != TM_OK) {
        fprintf(stderr, "exit child: %s\n", err.msg);
        return 2;
    }
    // In the group (its one record read), so closing means leaving it.
    tm_job *job = NULL;
    if (tm_source_next(a, &job, &err) != TM_OK) {
        fprintf(stderr, "exit child: no record: %s\n", err.msg);
        return 2;
    }
    tm_job_destroy(job);
    (void)rd_kafka_mock_broker_set_rtt(mc, -1, 600000);
    tm_source_destroy(a); // given up on: the broker does not answer the leave
    tm_job_spec_destroy(spec);
    // The broker answers again: librdkafka ends the consumer within milliseconds, while exit()
    // starts at once.
    (void)rd_kafka_mock_broker_set_rtt(mc, -1, 0);
    return 0;
}

static void test_exit_waits_for_abandoned_destroy(void) {
    fflush(NULL);
    pid_t pid = fork();
    TM_CHECK(pid >= 0);
    if (pid == 0)
        exit(exit_child());
    int st = 0;
    TM_CHECK(waitpid(pid, &st, 0) == pid);
    TM_CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child: %s %d",
                 WIFEXITED(st) ? "exit" : "signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
}

int main(void) {
    snprintf(g_tmp, sizeof(g_tmp), "/tmp/tm_test_kafka_in_XXXXXX");
    if (!mkdtemp(g_tmp))
        tm_test_skip("mkdtemp failed");
    // First: its child must not inherit the exit handler of an earlier test's given-up close.
    TM_RUN(test_exit_waits_for_abandoned_destroy);
    TM_RUN(test_held_record_dropped);
    TM_RUN(test_released_until_asked);
    TM_RUN(test_close_bounded);
    char cmd[320];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", g_tmp);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", g_tmp);
    return tm_test_report();
}
#endif
