/* ingest/kafka_in.c - librdkafka consumer for input.kafka (see kafka_in.h). State per partition
 * (done offsets, the highest offset handled) plus one ring of the records handed out, indexed by
 * seq_no, so acks find their partition and offset; both under one mutex (acks come from the sink
 * thread, everything else from the source thread). */
#define _POSIX_C_SOURCE 200809L
#include "ingest/kafka_in.h"

#include <errno.h>
#include <jansson.h>
#include <librdkafka/rdkafka.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/kafka_stats.h"
#include "base/log.h"
#include "base/stop.h"
#include "base/utf8.h"
#include "ingest/rec_parser_int.h"
#include "ingest/source_int.h"

#define POLL_MS 100
#define COMMIT_EVERY_MS 200.0
#define WATERMARK_TIMEOUT_MS 10000
#define WATERMARK_TRIES 6
#define DESTROY_WAIT_MS 1000 /* destroy_bounded */
#define EXIT_WAIT_MS 10000   /* wait_abandoned_at_exit */

/* A record handed out: queued for the runner (IN_FLIGHT), started by it (tm_kafka_in_start), in
 * the commit being made, durable; or RELEASED: taken back at a revoke before it started (never
 * answered here, never done; its completion only keeps seq_nos dense), then DROPPED once the
 * runner has asked to start it and was told no. A RELEASED entry stays in the ring until then
 * (ring_trim): the runner may ask long after the revoke, and a record missing from the ring
 * starts (tm_kafka_in_start), so trimming it earlier would answer a released record here too. */
enum { ST_IN_FLIGHT = 0, ST_STARTED, ST_WRITTEN, ST_ACKED, ST_RELEASED, ST_DROPPED };

typedef struct kpart {
    char *topic; /* owned */
    int32_t partition;
    bool owned;              /* in the current assignment */
    bool revoking;           /* being revoked: the rebalance callback waits for its records */
    int64_t hwm;             /* high watermark when the run started (drain target); 0 unknown */
    int64_t hi;              /* highest offset handled in this run (handed out, skipped, no record,
                              * or before this consumer's start); -1 none. A revoke that releases
                              * records steps it back below them (release_revoked) */
    int64_t hi_out;          /* highest offset ever handed out or skipped here; -1 none */
    int64_t committed;       /* offset this consumer last committed; -1 none */
    int64_t shown_committed; /* the last commit that succeeded (figures); -1 none */
    int64_t high_now;        /* high watermark as last fetched (figures); -1 unknown */
    int64_t scan_min;        /* scratch: lowest offset not yet acked (commit_offsets) */
    int64_t fp_off;          /* the highest done offset that held a message (-1 none) ... */
    int64_t fp_ts;           /* ... and its Kafka timestamp: the manifest's fingerprint */
    bool resumed;            /* done offsets came from the manifest (tm_kafka_in_resume_add) */
    bool idle;         /* assigned while lingering: never read here, so never committed here */
    uint32_t n_flight; /* records handed out and not yet durable (acked) */
    bool capped;       /* paused by input.kafka.max_read_ahead (source thread) */
    /* Messages polled while the partition was at max_read_ahead, in offset order, handled first
     * once it is below (source thread only): [dq_head, dq_n) of dq. */
    rd_kafka_message_t **dq;
    size_t dq_head, dq_n, dq_cap;
    uint64_t next; /* done set: every offset below is done */
    uint64_t *rng; /* [2 * n_rng] done ranges above next, inclusive, ascending, apart */
    size_t n_rng, cap_rng;
} kpart;

typedef struct ring_ent {
    int64_t offset;
    int64_t ts;    /* the message's Kafka timestamp (-1 none) */
    uint32_t part; /* index into parts */
    uint8_t state; /* ST_* */
} ring_ent;

struct tm_kafka_in {
    const tm_job_kafka_in *cfg; /* borrowed */
    tm_rec_parser *parser;      /* borrowed (the tm_source's): it numbers and makes the records */
    rd_kafka_t *rk;
    bool txn;      /* offsets go into the sink's transactions */
    bool paused;   /* backpressure: the assignment is paused */
    bool assigned; /* an assignment is in place (eager: false between revoke and
                    * assign) */
    bool closing;
    bool coop; /* the group's rebalance protocol is COOPERATIVE (read on the first
                * assignment: asking librdkafka during close can block, librdkafka#4041) */
    bool stop_logged;
    bool release;      /* tm_kafka_in_set_release: the runner asks before it starts a record
                        * (tm_kafka_in_start), so a revoke may take back the ones not started */
    bool lingering;    /* tm_kafka_in_linger: reads no more, stays in the group */
    bool started;      /* the brokers answered at start-up: librdkafka's log lines are shown */
    uint64_t n_quiet;  /* librdkafka log lines not shown while waiting for the brokers */
    bool holding;      /* in tm_kafka_in_wait: the source thread holds the last record
                        * handed out (it waits to push it), so it cannot become durable
                        * before the wait returns */
    bool held_revoked; /* the held record's partition was revoked or lost during this
                        * wait: the record is taken back (drop_held), not pushed */
    uint64_t last_seq; /* seq_no of the last record handed out */
    tm_rc fatal_rc;    /* a fatal consumer error seen in a callback */
    tm_err fatal_err;
    pthread_mutex_t mu; /* guards parts and the ring */
    pthread_cond_t cv;  /* signalled on acks */
    kpart *parts;
    size_t n_parts, cap_parts;
    ring_ent *ring; /* [ring_cap] circular: seq_no ring_base + i at (head + i) % cap */
    size_t ring_cap, ring_head, ring_n;
    uint64_t ring_base;
    rd_kafka_message_t **stash; /* messages polled while paused, served first (FIFO) */
    size_t n_stash, cap_stash, stash_head;
    double last_commit_ms;
    double last_warn_ms;
    int revoke_wait_ms;       /* TM_KAFKA_IN_REVOKE_WAIT_MS, at most half the session timeout */
    int commit_wait_ms;       /* TM_KAFKA_IN_COMMIT_WAIT_MS, at most a quarter of it */
    int close_wait_ms;        /* TM_KAFKA_IN_CLOSE_WAIT_MS, at most half of it */
    double close_deadline_ms; /* tm_kafka_in_close: when it stops waiting for the broker */
    char file[320];           /* "kafka:TOPIC/PARTITION" of the current record */
    char *cluster_id;         /* owned; from the metadata at open, or NULL */
    uint32_t max_ahead;       /* input.kafka.max_read_ahead (0 in cfg: no bound) */
    tm_source_kskips skips;   /* under mu */
    char *brokers_down;       /* owned; on_stats: the brokers not up at the last report, or NULL */
    uint64_t n_detail;        /* librdkafka lines and broker errors shown only at -v */
};

// ---- partitions and their done sets (mu held) ----

static kpart *part_find(tm_kafka_in *ki, const char *topic, int32_t partition) {
    for (size_t i = 0; i < ki->n_parts; i++)
        if (ki->parts[i].partition == partition && strcmp(ki->parts[i].topic, topic) == 0)
            return &ki->parts[i];
    return NULL;
}

static kpart *part_get(tm_kafka_in *ki, const char *topic, int32_t partition, tm_err *err) {
    kpart *p = part_find(ki, topic, partition);
    if (p)
        return p;
    if (ki->n_parts == ki->cap_parts) {
        size_t cap = ki->cap_parts ? ki->cap_parts * 2 : 16;
        kpart *np = tm_realloc(ki->parts, cap * sizeof(*np));
        if (!np) {
            TM_ERR(err, TM_E_NOMEM, "kafka partition table");
            return NULL;
        }
        ki->parts = np;
        ki->cap_parts = cap;
    }
    p = &ki->parts[ki->n_parts];
    memset(p, 0, sizeof(*p));
    p->topic = tm_strdup(topic);
    if (!p->topic) {
        TM_ERR(err, TM_E_NOMEM, "kafka partition table");
        return NULL;
    }
    p->partition = partition;
    p->hi = -1;
    p->hi_out = -1;
    p->committed = -1;
    p->shown_committed = -1;
    p->high_now = -1;
    p->fp_off = -1;
    ki->n_parts++;
    return p;
}

static bool done_has(const kpart *p, uint64_t o) {
    if (o < p->next)
        return true;
    for (size_t i = 0; i < p->n_rng; i++)
        if (o >= p->rng[2 * i] && o <= p->rng[2 * i + 1])
            return true;
    return false;
}

// Add [a, b] to the done set, merging ranges and moving next over a range that reaches it.
static tm_rc done_add(kpart *p, uint64_t a, uint64_t b, tm_err *err) {
    if (b < p->next)
        return TM_OK;
    if (a < p->next)
        a = p->next;
    if (p->n_rng == p->cap_rng) {
        size_t cap = p->cap_rng ? p->cap_rng * 2 : 8;
        uint64_t *r = tm_realloc(p->rng, 2 * cap * sizeof(*r));
        if (!r)
            return TM_ERR(err, TM_E_NOMEM, "kafka done offsets");
        p->rng = r;
        p->cap_rng = cap;
    }
    // Insert in order of the first offset, then merge neighbours that overlap or touch.
    size_t i = 0;
    while (i < p->n_rng && p->rng[2 * i] < a)
        i++;
    memmove(&p->rng[2 * i + 2], &p->rng[2 * i], (p->n_rng - i) * 2 * sizeof(*p->rng));
    p->rng[2 * i] = a;
    p->rng[2 * i + 1] = b;
    p->n_rng++;
    size_t w = 0;
    for (size_t r = 0; r < p->n_rng; r++) {
        uint64_t ra = p->rng[2 * r], rb = p->rng[2 * r + 1];
        if (w > 0 && ra <= p->rng[2 * (w - 1) + 1] + 1) {
            if (rb > p->rng[2 * (w - 1) + 1])
                p->rng[2 * (w - 1) + 1] = rb;
            continue;
        }
        p->rng[2 * w] = ra;
        p->rng[2 * w + 1] = rb;
        w++;
    }
    p->n_rng = w;
    if (p->n_rng > 0 && p->rng[0] <= p->next) {
        p->next = p->rng[1] + 1;
        p->n_rng--;
        memmove(&p->rng[0], &p->rng[2], p->n_rng * 2 * sizeof(*p->rng));
    }
    return TM_OK;
}

// Offsets up to o - 1 that this run has not handled hold no record for us (compaction, control
// records, or work done and committed before this consumer read the partition): done.
static tm_rc handled_up_to(kpart *p, int64_t o, tm_err *err) {
    if (o <= p->hi + 1)
        return TM_OK;
    tm_rc rc = done_add(p, (uint64_t)(p->hi + 1), (uint64_t)(o - 1), err);
    p->hi = o - 1;
    return rc;
}

// ---- the ring of records handed out (mu held) ----

static ring_ent *ring_at(tm_kafka_in *ki, uint64_t seq_no) {
    if (seq_no < ki->ring_base || seq_no - ki->ring_base >= ki->ring_n)
        return NULL;
    return &ki->ring[(ki->ring_head + (size_t)(seq_no - ki->ring_base)) % ki->ring_cap];
}

static void fp_note(kpart *p, int64_t offset, int64_t ts) {
    if (offset > p->fp_off && ts >= 0) {
        p->fp_off = offset;
        p->fp_ts = ts;
    }
}

static tm_rc ring_push(tm_kafka_in *ki, uint64_t seq_no, uint32_t part, int64_t offset, int64_t ts,
                       tm_err *err) {
    if (ki->ring_n == 0)
        ki->ring_base = seq_no;
    TM_ASSERT(seq_no == ki->ring_base + ki->ring_n); // every record of the source comes from here
    if (ki->ring_n == ki->ring_cap) {
        size_t cap = ki->ring_cap ? ki->ring_cap * 2 : 1024;
        ring_ent *r = tm_malloc(cap * sizeof(*r));
        if (!r)
            return TM_ERR(err, TM_E_NOMEM, "kafka records in flight");
        for (size_t i = 0; i < ki->ring_n; i++)
            r[i] = ki->ring[(ki->ring_head + i) % ki->ring_cap];
        tm_free(ki->ring);
        ki->ring = r;
        ki->ring_cap = cap;
        ki->ring_head = 0;
    }
    ring_ent *e = &ki->ring[(ki->ring_head + ki->ring_n) % ki->ring_cap];
    e->offset = offset;
    e->ts = ts;
    e->part = part;
    e->state = ST_IN_FLIGHT;
    ki->parts[part].n_flight++;
    ki->ring_n++;
    return TM_OK;
}

// Durable records and released ones the runner has dropped leave the ring from its head; a
// RELEASED one stays until the runner asks for it (tm_kafka_in_start), as a record it has not yet
// taken off its queue must still be found released.
static void ring_trim(tm_kafka_in *ki) {
    while (ki->ring_n > 0 && (ki->ring[ki->ring_head].state == ST_ACKED ||
                              ki->ring[ki->ring_head].state == ST_DROPPED)) {
        ki->ring_head = (ki->ring_head + 1) % ki->ring_cap;
        ki->ring_base++;
        ki->ring_n--;
    }
}

// scan_min of every partition: its lowest offset handed out and not yet durable (released
// records included: they are not done).
static void scan_unacked(tm_kafka_in *ki) {
    for (size_t i = 0; i < ki->n_parts; i++)
        ki->parts[i].scan_min = INT64_MAX;
    for (size_t i = 0; i < ki->ring_n; i++) {
        const ring_ent *e = &ki->ring[(ki->ring_head + i) % ki->ring_cap];
        kpart *p = &ki->parts[e->part];
        if (e->state != ST_ACKED && e->offset < p->scan_min)
            p->scan_min = e->offset;
    }
}

// ---- commits through the consumer (no transactions) ----

// The figures' high watermarks, from what librdkafka last fetched (no round trip). Source thread.
static void refresh_high(tm_kafka_in *ki) {
    for (size_t i = 0; i < ki->n_parts; i++) {
        kpart *p = &ki->parts[i];
        int64_t lo = -1, hi = -1;
        if (p->owned &&
            rd_kafka_get_watermark_offsets(ki->rk, p->topic, p->partition, &lo, &hi) == 0 &&
            hi >= 0) {
            pthread_mutex_lock(&ki->mu);
            p->high_now = hi;
            pthread_mutex_unlock(&ki->mu);
        }
    }
}

static void warn_limited(tm_kafka_in *ki, const char *fmt, const char *a, const char *b) {
    double now = tm_now_ms();
    if (now - ki->last_warn_ms < 1000.0)
        return;
    ki->last_warn_ms = now;
    TM_LOG_WARN("kafka_in", fmt, a, b);
}

static void commit_answered(rd_kafka_t *rk, rd_kafka_resp_err_t e,
                            rd_kafka_topic_partition_list_t *offs, void *opaque) {
    (void)rk, (void)e, (void)offs, (void)opaque; // read as an event by commit_bounded
}

/* Commit l and wait at most ms for the broker's answer. rd_kafka_commit's synchronous form waits
 * without a limit: with a broker that stops answering it never returns (issue 24). The answer
 * comes as an event on a queue of our own; when the wait ends first the queue is destroyed, and a
 * late answer is dropped by librdkafka (the commit itself may still be applied). NO_ERROR, the
 * commit's error (the first per-partition one included), or RD_KAFKA_RESP_ERR__TIMED_OUT. */
static rd_kafka_resp_err_t commit_bounded(tm_kafka_in *ki, const rd_kafka_topic_partition_list_t *l,
                                          int ms) {
    rd_kafka_queue_t *q = rd_kafka_queue_new(ki->rk);
    if (!q)
        return RD_KAFKA_RESP_ERR__CRIT_SYS_RESOURCE;
    // A callback, though never called (the queue is read as events), keeps librdkafka from also
    // sending the answer to on_commit.
    rd_kafka_resp_err_t e = rd_kafka_commit_queue(ki->rk, l, q, commit_answered, NULL);
    double end = tm_now_ms() + (ms > 0 ? ms : 0);
    while (!e) {
        double left = end - tm_now_ms();
        rd_kafka_event_t *ev = rd_kafka_queue_poll(q, left > 0 ? (int)left + 1 : 0);
        if (!ev) {
            if (left <= 0) {
                e = RD_KAFKA_RESP_ERR__TIMED_OUT;
                break;
            }
            continue;
        }
        if (rd_kafka_event_type(ev) != RD_KAFKA_EVENT_OFFSET_COMMIT) {
            rd_kafka_event_destroy(ev);
            continue;
        }
        e = rd_kafka_event_error(ev);
        const rd_kafka_topic_partition_list_t *r = rd_kafka_event_topic_partition_list(ev);
        for (int i = 0; !e && r && i < r->cnt; i++)
            e = r->elems[i].err;
        rd_kafka_event_destroy(ev);
        if (!e || e == RD_KAFKA_RESP_ERR__NO_OFFSET)
            e = RD_KAFKA_RESP_ERR_NO_ERROR;
        break;
    }
    rd_kafka_queue_destroy(q);
    return e;
}

/* Commit the committable offset of every owned partition (only = true: just those marked
 * revoking) that moved since the last commit. sync: wait for the answer, at most
 * commit_wait_ms (and never past close_deadline_ms while closing); a commit that failed or was
 * not answered in time is retried by the next one (committed reset). Source thread only. */
static void commit_offsets(tm_kafka_in *ki, bool sync, bool only_revoking) {
    refresh_high(ki);
    if (ki->txn) {
        ki->last_commit_ms = tm_now_ms(); // the figures' pace
        return;
    }
    pthread_mutex_lock(&ki->mu);
    scan_unacked(ki);
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(4);
    for (size_t i = 0; i < ki->n_parts; i++) {
        kpart *p = &ki->parts[i];
        if (!p->owned || p->idle || p->hi < 0 || (only_revoking && !p->revoking))
            continue;
        // hi + 1 also bounds it: released records may have left the ring (release_revoked)
        int64_t c = p->scan_min < p->hi + 1 ? p->scan_min : p->hi + 1;
        if (c <= p->committed)
            continue;
        rd_kafka_topic_partition_list_add(l, p->topic, p->partition)->offset = c;
        p->committed = c; // optimistic; on_commit resets it when the commit fails
    }
    pthread_mutex_unlock(&ki->mu);
    if (l->cnt > 0) {
        int ms = ki->commit_wait_ms;
        if (ki->closing && ki->close_deadline_ms - tm_now_ms() < ms)
            ms = (int)(ki->close_deadline_ms - tm_now_ms());
        rd_kafka_resp_err_t e = sync ? commit_bounded(ki, l, ms) : rd_kafka_commit(ki->rk, l, 1);
        if (e == RD_KAFKA_RESP_ERR__TIMED_OUT)
            TM_LOG_WARN("kafka_in",
                        "offset commit not answered within %d ms (brokers %s): the group's "
                        "offsets may lag behind; the manifest's done offsets keep the output "
                        "exactly once",
                        ms > 0 ? ms : 0, ki->cfg->brokers);
        else if (e) {
            warn_limited(ki, "offset commit failed (retried later): %s%s", rd_kafka_err2str(e), "");
        }
        pthread_mutex_lock(&ki->mu);
        if (e)
            ki->skips.errors++;
        else if (sync)
            ki->skips.commits++; // async: on_commit counts the answer
        for (int i = 0; i < l->cnt; i++) {
            kpart *p = part_find(ki, l->elems[i].topic, l->elems[i].partition);
            if (p && e)
                p->committed = -1;
            else if (p && (sync || l->elems[i].offset > p->shown_committed))
                p->shown_committed = l->elems[i].offset; // async: on_commit resets on failure
        }
        pthread_mutex_unlock(&ki->mu);
    }
    rd_kafka_topic_partition_list_destroy(l);
    ki->last_commit_ms = tm_now_ms();
}

static void on_commit(rd_kafka_t *rk, rd_kafka_resp_err_t e, rd_kafka_topic_partition_list_t *offs,
                      void *opaque) {
    (void)rk;
    tm_kafka_in *ki = opaque;
    if (e == RD_KAFKA_RESP_ERR_NO_ERROR || e == RD_KAFKA_RESP_ERR__NO_OFFSET) {
        pthread_mutex_lock(&ki->mu);
        ki->skips.commits += e == RD_KAFKA_RESP_ERR_NO_ERROR;
        pthread_mutex_unlock(&ki->mu);
        return;
    }
    warn_limited(ki, "offset commit failed (retried later): %s%s", rd_kafka_err2str(e), "");
    pthread_mutex_lock(&ki->mu);
    ki->skips.errors++;
    for (int i = 0; offs && i < offs->cnt; i++) {
        kpart *p = part_find(ki, offs->elems[i].topic, offs->elems[i].partition);
        if (p)
            p->committed = -1;
    }
    pthread_mutex_unlock(&ki->mu);
}

// ---- rebalance ----

static void pause_one(tm_kafka_in *ki, const kpart *p, bool pause) {
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(l, p->topic, p->partition);
    if (pause)
        rd_kafka_pause_partitions(ki->rk, l);
    else
        rd_kafka_resume_partitions(ki->rk, l);
    rd_kafka_topic_partition_list_destroy(l);
}

static void dq_clear(kpart *p) {
    for (size_t i = p->dq_head; i < p->dq_n; i++)
        rd_kafka_message_destroy(p->dq[i]);
    p->dq_head = p->dq_n = 0;
    p->capped = false;
}

static void dq_purge(tm_kafka_in *ki, const rd_kafka_topic_partition_list_t *parts) {
    for (int i = 0; i < parts->cnt; i++) {
        kpart *p = part_find(ki, parts->elems[i].topic, parts->elems[i].partition);
        if (p)
            dq_clear(p);
    }
}

static bool revoked_in_flight(tm_kafka_in *ki) {
    for (size_t i = 0; i < ki->ring_n; i++) {
        const ring_ent *e = &ki->ring[(ki->ring_head + i) % ki->ring_cap];
        if (ki->holding && ki->ring_base + i == ki->last_seq)
            continue; // held by the waiting source thread: dropped after the wait (drop_held)
        if (e->state < ST_ACKED && ki->parts[e->part].revoking)
            return true; // released records are not waited for: nobody runs them here
    }
    return false;
}

// Wait until the handed-out records of the revoking partitions are durable (acks), at most ms.
static void wait_revoked_durable(tm_kafka_in *ki, int ms) {
    struct timespec dl;
    tm_deadline_in_ms(&dl, ms);
    pthread_mutex_lock(&ki->mu);
    bool left = revoked_in_flight(ki);
    while (left) {
        if (pthread_cond_timedwait(&ki->cv, &ki->mu, &dl) == ETIMEDOUT) {
            left = revoked_in_flight(ki);
            break;
        }
        left = revoked_in_flight(ki);
    }
    pthread_mutex_unlock(&ki->mu);
    if (left)
        TM_LOG_WARN("kafka_in",
                    "rebalance: records of revoked partitions still in flight after "
                    "%d ms; they are finished here but not committed, so the new owner reads "
                    "them again",
                    ms);
}

static void set_revoking(tm_kafka_in *ki, const rd_kafka_topic_partition_list_t *parts, bool on,
                         bool disown) {
    pthread_mutex_lock(&ki->mu);
    for (int i = 0; i < parts->cnt; i++) {
        kpart *p = part_find(ki, parts->elems[i].topic, parts->elems[i].partition);
        if (!p)
            continue;
        p->revoking = on;
        if (on && !ki->closing)
            p->committed = -1; // commit again, synchronously: an async one may have failed
                               // (closing: tm_kafka_in_close has just made that commit)
        if (on && ki->holding) {
            const ring_ent *e = ring_at(ki, ki->last_seq);
            if (e && &ki->parts[e->part] == p)
                ki->held_revoked = true; // the new owner answers it: drop_held after the wait
        }
        if (disown) {
            p->owned = false;
            p->committed = -1;
        }
    }
    pthread_mutex_unlock(&ki->mu);
}

/* Add offset o to the text of a run of offsets ("3-7,9"): *run_a..*run_b is the open run. */
static void ranges_note(tm_buf *b, int64_t *run_a, int64_t *run_b, int64_t o, bool flush) {
    tm_err err = {0};
    if (!flush && *run_a >= 0 && o == *run_b + 1) {
        *run_b = o;
        return;
    }
    if (*run_a >= 0) {
        if (*run_a == *run_b)
            (void)tm_buf_printf(b, &err, "%s%lld", b->len ? "," : "", (long long)*run_a);
        else
            (void)tm_buf_printf(b, &err, "%s%lld-%lld", b->len ? "," : "", (long long)*run_a,
                                (long long)*run_b);
    }
    *run_a = *run_b = flush ? -1 : o;
}

/* At a revoke (or loss): the records of the partitions being given up that were handed out but
 * not started by the runner (still queued for it) are released: marked so that the runner drops
 * them unanswered (tm_kafka_in_start says no), never done, never committed. The partition's hi
 * steps back below the first of them, so that the commit that follows stops there (the next owner
 * reads them) and, should the partition come back here, they are read again; the records of it
 * that had started are then recognised and not handed out twice (handle_message). Not while
 * lingering: the runner's input is closed then, so a partition coming back could not be read
 * again; those records are finished here as before. One log line per partition, naming the
 * offsets. The held record (tm_kafka_in_wait) is left to drop_held. */
static void release_revoked(tm_kafka_in *ki) {
    if (!ki->release || ki->lingering || ki->closing)
        return;
    pthread_mutex_lock(&ki->mu);
    for (size_t pi = 0; pi < ki->n_parts; pi++) {
        kpart *p = &ki->parts[pi];
        if (!p->revoking)
            continue;
        tm_buf text = {0};
        int64_t run_a = -1, run_b = -1, first = INT64_MAX;
        uint64_t n = 0;
        for (size_t i = 0; i < ki->ring_n; i++) {
            ring_ent *e = &ki->ring[(ki->ring_head + i) % ki->ring_cap];
            if (e->part != pi || e->state != ST_IN_FLIGHT)
                continue;
            if (ki->holding && ki->ring_base + i == ki->last_seq)
                continue; // drop_held's
            e->state = ST_RELEASED;
            if (p->n_flight > 0)
                p->n_flight--;
            if (e->offset < first)
                first = e->offset;
            n++;
            ranges_note(&text, &run_a, &run_b, e->offset, false);
        }
        ranges_note(&text, &run_a, &run_b, 0, true);
        if (n > 0) {
            if (p->hi >= first)
                p->hi = first - 1;
            ki->skips.released += n;
            TM_LOG_INFO("kafka_in",
                        "rebalance: %s/%d: %llu queued record(s) not started are released "
                        "(offsets %s): not answered here; the partition's next owner answers them",
                        p->topic, (int)p->partition, (unsigned long long)n,
                        text.data ? text.data : "");
        }
        tm_buf_fini(&text);
    }
    pthread_mutex_unlock(&ki->mu);
}

// Messages stashed by tm_kafka_in_wait that belong to partitions being given up are stale: should
// a partition come back, fetching restarts at its committed offset, and a stale message handed
// out first would mark the offsets below it (a dropped held record among them) as done.
static void stash_purge(tm_kafka_in *ki, const rd_kafka_topic_partition_list_t *parts) {
    size_t w = 0;
    for (size_t i = 0; i < ki->n_stash; i++) {
        rd_kafka_message_t *m = ki->stash[(ki->stash_head + i) % ki->cap_stash];
        bool gone = m->rkt && rd_kafka_topic_partition_list_find(parts, rd_kafka_topic_name(m->rkt),
                                                                 m->partition) != NULL;
        if (gone)
            rd_kafka_message_destroy(m);
        else
            ki->stash[(ki->stash_head + w++) % ki->cap_stash] = m;
    }
    ki->n_stash = w;
}

static void on_rebalance(rd_kafka_t *rk, rd_kafka_resp_err_t e,
                         rd_kafka_topic_partition_list_t *parts, void *opaque) {
    tm_kafka_in *ki = opaque;
    if (e == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
        const char *proto = rd_kafka_rebalance_protocol(rk);
        ki->coop = proto && strcmp(proto, "COOPERATIVE") == 0;
    }
    bool coop = ki->coop; // a revoke always follows an assignment
    rd_kafka_error_t *aerr = NULL;
    rd_kafka_resp_err_t rerr = RD_KAFKA_RESP_ERR_NO_ERROR;
    if (e == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
        tm_err err = {0};
        pthread_mutex_lock(&ki->mu);
        for (int i = 0; i < parts->cnt; i++) {
            kpart *p = part_get(ki, parts->elems[i].topic, parts->elems[i].partition, &err);
            if (!p) {
                ki->fatal_rc = err.rc;
                ki->fatal_err = err;
                break;
            }
            p->owned = true;
            p->revoking = false;
            p->committed = -1;
            p->idle = ki->lingering;
        }
        pthread_mutex_unlock(&ki->mu);
        if (coop)
            aerr = rd_kafka_incremental_assign(rk, parts);
        else
            rerr = rd_kafka_assign(rk, parts);
        // A partition keeps its pause flag across an unassign: one paused by backpressure before
        // a revoke would stay paused when it comes back, so set the flag either way.
        if (parts->cnt > 0 && ki->paused)
            rd_kafka_pause_partitions(rk, parts);
        else if (parts->cnt > 0)
            rd_kafka_resume_partitions(rk, parts);
        ki->assigned = true;
        TM_LOG_INFO("kafka_in", "rebalance: %d partition(s) assigned%s", parts->cnt,
                    ki->lingering ? " (not read: this consumer has read to the end)" : "");
    } else {
        bool lost = rd_kafka_assignment_lost(rk);
        set_revoking(ki, parts, true, false);
        release_revoked(ki);
        if (!lost && !ki->closing)
            wait_revoked_durable(ki, ki->revoke_wait_ms);
        if (!lost)
            commit_offsets(ki, true, true); // still the owner until unassigned
        set_revoking(ki, parts, false, true);
        stash_purge(ki, parts);
        dq_purge(ki, parts);
        if (coop) {
            aerr = rd_kafka_incremental_unassign(rk, parts);
        } else {
            rerr = rd_kafka_assign(rk, NULL);
            ki->assigned = false;
        }
        TM_LOG_INFO("kafka_in", "rebalance: %d partition(s) %s", parts->cnt,
                    lost ? "lost (not committed)" : "revoked");
    }
    if (aerr) {
        TM_LOG_WARN("kafka_in", "rebalance: %s", rd_kafka_error_string(aerr));
        rd_kafka_error_destroy(aerr);
    }
    if (rerr)
        TM_LOG_WARN("kafka_in", "rebalance: %s", rd_kafka_err2str(rerr));
}

static void on_error(rd_kafka_t *rk, int e, const char *reason, void *opaque) {
    (void)rk;
    tm_kafka_in *ki = opaque;
    if (!ki->started) { // the start-up wait: on_log has shown the first such line
        ki->n_quiet++;
        return;
    }
    pthread_mutex_lock(&ki->mu);
    ki->skips.errors++;
    pthread_mutex_unlock(&ki->mu);
    if (e == RD_KAFKA_RESP_ERR__TRANSPORT || e == RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN ||
        e == RD_KAFKA_RESP_ERR__RESOLVE) { // on_stats sums these up, one line per change
        ki->n_detail++;
        TM_LOG_DEBUG("kafka_in", "consumer: %s", reason);
        return;
    }
    warn_limited(ki, "consumer: %s%s", reason, "");
}

/* librdkafka's statistics (statistics.interval.ms, served in our polls): one line each time the
 * set of brokers that are not up changes, naming them; librdkafka's own lines about it are shown
 * at -v only. A broker counts as down in state DOWN, TRY_CONNECT or CONNECT (the bootstrap
 * entries and brokers never needed, state INIT, are left out). */
static int on_stats(rd_kafka_t *rk, char *text, size_t n, void *opaque) {
    (void)rk;
    tm_kafka_in *ki = opaque;
    char *now = tm_kafka_stats_brokers_down(text, n); // owned
    const char *before = ki->brokers_down;
    if ((now == NULL) != (before == NULL) || (now && strcmp(now, before) != 0)) {
        if (now)
            TM_LOG_WARN("kafka_in",
                        "brokers not answering: %s (reconnecting; librdkafka's detail at -v)", now);
        else
            TM_LOG_INFO("kafka_in", "brokers: every broker in use is up again (were: %s)", before);
        tm_free(ki->brokers_down);
        ki->brokers_down = now;
        now = NULL;
    }
    tm_free(now);
    return 0; // the text is librdkafka's to free
}

// ---- set-up ----

static tm_rc set(rd_kafka_conf_t *conf, const char *k, const char *v, tm_err *err) {
    char es[512];
    if (rd_kafka_conf_set(conf, k, v, es, sizeof(es)) != RD_KAFKA_CONF_OK)
        return TM_ERR(err, TM_E_KAFKA, "input.kafka: %s: %s", k, es);
    return TM_OK;
}

/* librdkafka's log lines (log.queue: served on our thread, in our polls). Until the brokers have
 * answered at start-up only the first is shown: an address nothing listens on would otherwise
 * print a retry line every second or so until the start-up timeout. */
static void on_log(const rd_kafka_t *rk, int level, const char *fac, const char *buf) {
    tm_kafka_in *ki = rd_kafka_opaque(rk);
    if (ki->started) { // the broker state lines come from on_stats; the detail at -v
        if (tm_log_get_level() >= TM_LOG_LEVEL_DEBUG)
            rd_kafka_log_print(rk, level, fac, buf);
        else
            ki->n_detail++;
        return;
    }
    if (ki->n_quiet++ == 0)
        TM_LOG_WARN("kafka_in",
                    "librdkafka: %s: %s (more such lines are not shown until the "
                    "brokers answer)",
                    fac, buf);
}

// Start-up: serve what librdkafka queued for this thread (its log lines; nothing else comes
// before the subscription).
static void serve_startup(tm_kafka_in *ki) {
    rd_kafka_message_t *m;
    while ((m = rd_kafka_consumer_poll(ki->rk, 0)) != NULL)
        rd_kafka_message_destroy(m);
}

static double startup_s(const tm_kafka_in *ki) {
    return ki->cfg->startup_timeout_s > 0 ? ki->cfg->startup_timeout_s
                                          : TM_JOB_DEFAULT_KAFKA_STARTUP_TIMEOUT_S;
}

static int left_ms(double deadline_ms, int most) {
    double left = deadline_ms - tm_now_ms();
    return left < 1 ? 1 : left > most ? most : (int)left;
}

static tm_rc startup_fail(tm_kafka_in *ki, const char *what, const char *topic, int32_t part,
                          rd_kafka_resp_err_t e, tm_err *err) {
    char where[320];
    snprintf(where, sizeof(where), part >= 0 ? "%s/%d" : "%s", topic, (int)part);
    return TM_ERR(err, TM_E_KAFKA,
                  "input.kafka: no %s of topic %s from brokers %s within %g s "
                  "(input.kafka.startup_timeout_s): %s",
                  what, where, ki->cfg->brokers, startup_s(ki), rd_kafka_err2str(e));
}

/* The metadata of topic, asked again until deadline_ms while the brokers do not answer (need:
 * also while the topic is unknown, at most WATERMARK_TRIES answers). Drain mode needs its
 * partitions; follow mode only that the brokers answer. */
static tm_rc topic_metadata(tm_kafka_in *ki, const char *topic, double deadline_ms, bool need,
                            const rd_kafka_metadata_t **out, tm_err *err) {
    rd_kafka_resp_err_t e = RD_KAFKA_RESP_ERR_NO_ERROR;
    int answers = 0;
    bool waited = false;
    for (;;) {
        const rd_kafka_metadata_t *md = NULL;
        rd_kafka_topic_t *rkt = rd_kafka_topic_new(ki->rk, topic, NULL);
        e = rd_kafka_metadata(ki->rk, 0, rkt, &md, left_ms(deadline_ms, 1000));
        rd_kafka_topic_destroy(rkt);
        bool answered = !e;
        if (answered) {
            rd_kafka_resp_err_t te = md->topic_cnt == 1 ? md->topics[0].err
                                                        : RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC;
            if (!te || !need) {
                *out = md;
                return TM_OK;
            }
            rd_kafka_metadata_destroy(md);
            e = te;
            if (++answers >= WATERMARK_TRIES)
                break;
        }
        if (tm_now_ms() >= deadline_ms)
            break;
        if (!waited && !answered) {
            serve_startup(ki); // shows librdkafka's first line: why the brokers do not answer
            TM_LOG_WARN("kafka_in",
                        "no answer from brokers %s yet (%s); waiting up to %g s "
                        "(input.kafka.startup_timeout_s)",
                        ki->cfg->brokers, rd_kafka_err2str(e), startup_s(ki));
            waited = true;
        }
        if (answered) { // the topic is unknown (yet): ask again a little later
            struct timespec ts = {0, 100 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    return startup_fail(ki, "metadata", topic, -1, e, err);
}

/* Start-up, until deadline_ms: the brokers answer (metadata of every topic) and, in drain mode,
 * the high watermark of every partition of every topic, now. */
static tm_rc read_watermarks(tm_kafka_in *ki, double deadline_ms, tm_err *err) {
    for (size_t t = 0; t < ki->cfg->n_topics; t++) {
        const char *topic = ki->cfg->topics[t];
        const rd_kafka_metadata_t *md = NULL;
        tm_rc rc = topic_metadata(ki, topic, deadline_ms, !ki->cfg->follow, &md, err);
        if (rc)
            return rc;
        if (ki->cfg->follow) {
            rd_kafka_metadata_destroy(md);
            continue;
        }
        int n = md->topics[0].partition_cnt;
        int32_t *ids = tm_calloc((size_t)(n > 0 ? n : 1), sizeof(*ids));
        for (int i = 0; ids && i < n; i++)
            ids[i] = md->topics[0].partitions[i].id;
        rd_kafka_metadata_destroy(md);
        if (!ids)
            return TM_ERR(err, TM_E_NOMEM, "kafka partitions");
        for (int i = 0; i < n && !rc; i++) {
            int64_t lo = 0, hi = 0;
            rd_kafka_resp_err_t e;
            for (;;) {
                e = rd_kafka_query_watermark_offsets(ki->rk, topic, ids[i], &lo, &hi,
                                                     left_ms(deadline_ms, WATERMARK_TIMEOUT_MS));
                if (!e || tm_now_ms() >= deadline_ms)
                    break;
            }
            if (e) {
                rc = startup_fail(ki, "high watermark", topic, ids[i], e, err);
                break;
            }
            pthread_mutex_lock(&ki->mu);
            kpart *p = part_get(ki, topic, ids[i], err);
            if (p)
                p->hwm = hi;
            pthread_mutex_unlock(&ki->mu);
            if (!p)
                rc = err->rc;
        }
        tm_free(ids);
        if (rc)
            return rc;
    }
    return TM_OK;
}

tm_rc tm_kafka_in_open(const tm_job_kafka_in *cfg, tm_rec_parser *parser, tm_kafka_in **out,
                       tm_err *err) {
    tm_kafka_in *ki = tm_calloc(1, sizeof(*ki));
    if (!ki)
        return TM_ERR(err, TM_E_NOMEM, "kafka consumer");
    pthread_mutex_init(&ki->mu, NULL);
    pthread_cond_init(&ki->cv, NULL);
    ki->cfg = cfg;
    ki->parser = parser;
    ki->max_ahead = cfg->max_read_ahead ? cfg->max_read_ahead : UINT32_MAX;
    ki->last_warn_ms = -1e9;
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    // Defaults a batch job wants, before the user's settings (which may change them)...
    tm_rc rc = set(conf, "auto.offset.reset", "earliest", err);
    for (size_t i = 0; i < cfg->n_config && !rc; i++)
        rc = set(conf, cfg->config[2 * i], cfg->config[2 * i + 1], err);
    // ... and the settings the commit rule relies on, after them (ours win, with a warning).
    const char *const ours[][2] = {
        {"bootstrap.servers", cfg->brokers}, {"group.id", cfg->group},
        {"enable.auto.commit", "false"},     {"enable.auto.offset.store", "false"},
        {"enable.partition.eof", "true"},    {"log.queue", "true"}};
    for (size_t i = 0; i < cfg->n_config; i++)
        for (size_t k = 0; k < sizeof(ours) / sizeof(ours[0]); k++)
            if (strcmp(cfg->config[2 * i], ours[k][0]) == 0 &&
                strcmp(cfg->config[2 * i + 1], ours[k][1]) != 0)
                TM_LOG_WARN("kafka_in",
                            "input.kafka.config: %s=%s is overridden: tokenmill sets %s=%s "
                            "(offsets are committed only once records are durable)",
                            ours[k][0], cfg->config[2 * i + 1], ours[k][0], ours[k][1]);
    if (!rc)
        rc = set(conf, "bootstrap.servers", cfg->brokers, err);
    if (!rc)
        rc = set(conf, "group.id", cfg->group, err);
    if (!rc)
        rc = set(conf, "enable.auto.commit", "false", err);
    if (!rc)
        rc = set(conf, "enable.auto.offset.store", "false", err);
    if (!rc)
        rc = set(conf, "enable.partition.eof", "true", err);
    if (!rc)
        rc = set(conf, "log.queue", "true", err); // on_log runs in our polls, on this thread
    if (rc) {
        rd_kafka_conf_destroy(conf);
        goto fail;
    }
    // A member that stays in its revoke callback past its session timeout is dropped from the
    // group (its partitions then count as lost): wait at most half of it.
    char sess[32];
    size_t n_sess = sizeof(sess);
    long sess_ms = 45000;
    if (rd_kafka_conf_get(conf, "session.timeout.ms", sess, &n_sess) == RD_KAFKA_CONF_OK)
        sess_ms = strtol(sess, NULL, 10);
    ki->revoke_wait_ms = (int)TM_MIN((long)TM_KAFKA_IN_REVOKE_WAIT_MS, TM_MAX(sess_ms / 2, 100L));
    ki->commit_wait_ms = (int)TM_MIN((long)TM_KAFKA_IN_COMMIT_WAIT_MS, TM_MAX(sess_ms / 4, 100L));
    ki->close_wait_ms = (int)TM_MIN((long)TM_KAFKA_IN_CLOSE_WAIT_MS, TM_MAX(sess_ms / 2, 200L));
    bool own_stats = true; // the broker state summary, unless the user asked for statistics
    for (size_t i = 0; i < cfg->n_config; i++)
        own_stats = own_stats && strcmp(cfg->config[2 * i], "statistics.interval.ms") != 0;
    if (own_stats && set(conf, "statistics.interval.ms", "1000", err) == TM_OK)
        rd_kafka_conf_set_stats_cb(conf, on_stats);
    rd_kafka_conf_set_rebalance_cb(conf, on_rebalance);
    rd_kafka_conf_set_offset_commit_cb(conf, on_commit);
    rd_kafka_conf_set_error_cb(conf, on_error);
    rd_kafka_conf_set_log_cb(conf, on_log);
    rd_kafka_conf_set_opaque(conf, ki);
    char es[512];
    ki->rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, es, sizeof(es)); // takes conf on success
    if (!ki->rk) {
        rd_kafka_conf_destroy(conf);
        rc = TM_ERR(err, TM_E_KAFKA, "input.kafka: creating the consumer: %s", es);
        goto fail;
    }
    rd_kafka_poll_set_consumer(ki->rk);
    rd_kafka_set_log_queue(ki->rk, NULL); // the main queue, which now feeds the consumer's
    double start_deadline = tm_now_ms() + startup_s(ki) * 1000.0;
    rc = read_watermarks(ki, start_deadline, err);
    if (!rc) // the brokers answered: the id comes with the metadata (NULL from a cluster without)
        ki->cluster_id = rd_kafka_clusterid(ki->rk, left_ms(start_deadline, 5000));
    serve_startup(ki); // the lines of the wait, quietly
    ki->started = true;
    if (ki->n_quiet > 1)
        TM_LOG_INFO("kafka_in", "%llu librdkafka lines and errors of the start-up wait not shown",
                    (unsigned long long)(ki->n_quiet - 1));
    if (rc)
        goto fail;
    rd_kafka_topic_partition_list_t *subs = rd_kafka_topic_partition_list_new((int)cfg->n_topics);
    for (size_t i = 0; i < cfg->n_topics; i++)
        rd_kafka_topic_partition_list_add(subs, cfg->topics[i], RD_KAFKA_PARTITION_UA);
    rd_kafka_resp_err_t e = rd_kafka_subscribe(ki->rk, subs);
    rd_kafka_topic_partition_list_destroy(subs);
    if (e) {
        rc = TM_ERR(err, TM_E_KAFKA, "input.kafka: subscribe: %s", rd_kafka_err2str(e));
        goto fail;
    }
    tm_stop_install();
    TM_LOG_INFO("kafka_in", "consumer of group %s joined on %s (%s mode)", cfg->group, cfg->brokers,
                cfg->follow ? "follow" : "drain");
    *out = ki;
    return TM_OK;
fail:
    tm_kafka_in_close(ki);
    return rc;
}

/* Leave the group (rd_kafka_consumer_close_queue), serving the close queue here until the
 * consumer is closed or close_deadline_ms passes: rd_kafka_consumer_close waits without a limit.
 * The last revoke comes as an event and goes through on_rebalance (its commit is bounded by the
 * same deadline). true: closed. */
static bool close_bounded(tm_kafka_in *ki) {
    rd_kafka_queue_t *q = rd_kafka_queue_new(ki->rk);
    if (!q)
        return false;
    rd_kafka_error_t *e = rd_kafka_consumer_close_queue(ki->rk, q);
    if (e) {
        TM_LOG_WARN("kafka_in", "closing the consumer: %s", rd_kafka_error_string(e));
        rd_kafka_error_destroy(e);
        rd_kafka_queue_destroy(q);
        return rd_kafka_consumer_closed(ki->rk);
    }
    while (!rd_kafka_consumer_closed(ki->rk)) {
        double left = ki->close_deadline_ms - tm_now_ms();
        if (left <= 0)
            break;
        rd_kafka_event_t *ev = rd_kafka_queue_poll(q, (int)left + 1);
        if (!ev)
            continue;
        const char *fac, *str;
        int level;
        if (rd_kafka_event_type(ev) == RD_KAFKA_EVENT_LOG &&
            rd_kafka_event_log(ev, &fac, &str, &level) == 0)
            on_log(ki->rk, level, fac, str);
        else if (rd_kafka_event_type(ev) == RD_KAFKA_EVENT_REBALANCE)
            on_rebalance(ki->rk, rd_kafka_event_error(ev),
                         (rd_kafka_topic_partition_list_t *)rd_kafka_event_topic_partition_list(ev),
                         ki);
        rd_kafka_event_destroy(ev); // anything else (messages, errors) is of no use now
    }
    bool closed = rd_kafka_consumer_closed(ki->rk);
    rd_kafka_queue_destroy(q);
    return closed;
}

typedef struct destroyer {
    rd_kafka_t *rk;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done, abandoned; /* abandoned: the thread frees this */
} destroyer;

/* Destroys given up on by destroy_bounded and still running, process-wide. exit() must not run
 * beside them: it tears down what librdkafka's threads use (atexit handlers, library destructors,
 * the mock cluster of a test), so wait_abandoned_at_exit, an atexit handler registered with the
 * first one, waits for them (at most EXIT_WAIT_MS). */
static pthread_mutex_t g_abandoned_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_abandoned_cv = PTHREAD_COND_INITIALIZER;
static int g_abandoned;
static bool g_exit_hook;

static void wait_abandoned_at_exit(void) {
    struct timespec dl;
    tm_deadline_in_ms(&dl, EXIT_WAIT_MS);
    pthread_mutex_lock(&g_abandoned_mu);
    while (g_abandoned > 0 &&
           pthread_cond_timedwait(&g_abandoned_cv, &g_abandoned_mu, &dl) != ETIMEDOUT) {
    }
    int left = g_abandoned;
    pthread_mutex_unlock(&g_abandoned_mu);
    if (left > 0)
        TM_LOG_WARN("kafka_in",
                    "exiting while librdkafka still shuts %d consumer(s) down (waited %d ms)", left,
                    EXIT_WAIT_MS);
}

static void *destroyer_main(void *arg) {
    destroyer *d = arg;
    rd_kafka_destroy_flags(d->rk, RD_KAFKA_DESTROY_F_NO_CONSUMER_CLOSE);
    pthread_mutex_lock(&d->mu);
    d->done = true;
    bool abandoned = d->abandoned;
    pthread_cond_signal(&d->cv);
    pthread_mutex_unlock(&d->mu);
    if (abandoned) {
        pthread_cond_destroy(&d->cv);
        pthread_mutex_destroy(&d->mu);
        tm_free(d);
        pthread_mutex_lock(&g_abandoned_mu);
        g_abandoned--;
        pthread_cond_broadcast(&g_abandoned_cv);
        pthread_mutex_unlock(&g_abandoned_mu);
    }
    return NULL;
}

/* A consumer that did not close in time: librdkafka's destroy joins its main thread, which waits
 * for the requests in flight to time out (about session.timeout.ms more when the broker does not
 * answer). Destroy it on a detached thread and wait for that at most DESTROY_WAIT_MS; past it the
 * thread finishes by itself (no callback of ours runs there: librdkafka serves them only in our
 * polls, and NO_CONSUMER_CLOSE disables the rest), and the process's exit waits for it
 * (wait_abandoned_at_exit). Once abandoned, d belongs to the thread: nothing here reads it after
 * the unlock (it did: d->done read after the unlock raced the thread's free). */
static void destroy_bounded(rd_kafka_t *rk) {
    destroyer *d = tm_calloc(1, sizeof(*d));
    pthread_t t;
    if (!d) {
        rd_kafka_destroy_flags(rk, RD_KAFKA_DESTROY_F_NO_CONSUMER_CLOSE);
        return;
    }
    d->rk = rk;
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->cv, NULL);
    if (pthread_create(&t, NULL, destroyer_main, d) != 0) {
        destroyer_main(d); // not abandoned: frees nothing
    } else {
        pthread_detach(t);
        struct timespec dl;
        tm_deadline_in_ms(&dl, DESTROY_WAIT_MS);
        pthread_mutex_lock(&d->mu);
        while (!d->done && pthread_cond_timedwait(&d->cv, &d->mu, &dl) != ETIMEDOUT) {
        }
        bool abandoned = d->abandoned = !d->done;
        if (abandoned) { // counted before destroyer_main can see the flag
            pthread_mutex_lock(&g_abandoned_mu);
            g_abandoned++;
            if (!g_exit_hook && atexit(wait_abandoned_at_exit) == 0)
                g_exit_hook = true;
            pthread_mutex_unlock(&g_abandoned_mu);
        }
        pthread_mutex_unlock(&d->mu);
        if (abandoned) {
            TM_LOG_WARN("kafka_in",
                        "librdkafka is still shutting the consumer down after %d ms; "
                        "not waiting for it (the process's exit will, at most %d ms)",
                        DESTROY_WAIT_MS, EXIT_WAIT_MS);
            return; // destroyer_main frees d
        }
    }
    pthread_cond_destroy(&d->cv);
    pthread_mutex_destroy(&d->mu);
    tm_free(d);
}

void tm_kafka_in_close(tm_kafka_in *ki) {
    if (!ki)
        return;
    bool closed = true;
    if (ki->rk) {
        pthread_mutex_lock(&ki->mu);
        ki->closing = true;
        ki->close_deadline_ms = tm_now_ms() + ki->close_wait_ms;
        for (size_t i = 0; i < ki->n_parts; i++)
            ki->parts[i].committed = -1; // the last word is a synchronous (bounded) commit
        pthread_mutex_unlock(&ki->mu);
        commit_offsets(ki, true, false);
        closed = close_bounded(ki);
        if (!closed)
            TM_LOG_WARN(
                "kafka_in",
                "the consumer did not leave group %s within %d ms (brokers %s not "
                "answering?): given up without leaving (the group drops the member when its "
                "session times out); the group's offsets may lag behind the manifest, which "
                "keeps the output exactly once",
                ki->cfg->group, ki->close_wait_ms, ki->cfg->brokers);
    }
    for (size_t i = 0; i < ki->n_stash; i++)
        rd_kafka_message_destroy(ki->stash[(ki->stash_head + i) % ki->cap_stash]);
    tm_free(ki->stash);
    if (ki->n_detail)
        TM_LOG_INFO("kafka_in", "%llu librdkafka lines and broker errors were shown only at -v",
                    (unsigned long long)ki->n_detail);
    if (ki->rk && closed)
        rd_kafka_destroy(ki->rk);
    else if (ki->rk)
        destroy_bounded(ki->rk);
    for (size_t i = 0; i < ki->n_parts; i++) {
        dq_clear(&ki->parts[i]);
        tm_free(ki->parts[i].dq);
        tm_free(ki->parts[i].topic);
        tm_free(ki->parts[i].rng);
    }
    tm_free(ki->parts);
    tm_free(ki->ring);
    if (ki->cluster_id)
        rd_kafka_mem_free(NULL, ki->cluster_id);
    tm_free(ki->brokers_down);
    pthread_cond_destroy(&ki->cv);
    pthread_mutex_destroy(&ki->mu);
    tm_free(ki);
}

tm_rc tm_kafka_in_resume_add(tm_kafka_in *ki, const char *topic, int32_t partition, int64_t next,
                             const uint64_t *ranges, size_t n_ranges, tm_err *err) {
    tm_rc rc = TM_OK;
    pthread_mutex_lock(&ki->mu);
    kpart *p = part_get(ki, topic, partition, err);
    if (!p)
        rc = err->rc;
    if (p)
        p->resumed = true;
    if (!rc && next > 0)
        rc = done_add(p, 0, (uint64_t)next - 1, err);
    for (size_t i = 0; i < n_ranges && !rc; i++)
        rc = done_add(p, ranges[2 * i], ranges[2 * i + 1], err);
    pthread_mutex_unlock(&ki->mu);
    return rc;
}

void tm_kafka_in_set_txn(tm_kafka_in *ki, bool on) { ki->txn = on; }

// ---- the identity of a resumed job ----

#define RESTART_HINT                                                                               \
    "resuming would skip records never answered: use a new output.dir or `tokenmill run --restart`"

tm_rc tm_kafka_in_resume_fp(tm_kafka_in *ki, const char *topic, int32_t partition, int64_t offset,
                            int64_t ts, tm_err *err) {
    pthread_mutex_lock(&ki->mu);
    kpart *p = part_get(ki, topic, partition, err);
    if (p) {
        p->fp_off = offset;
        p->fp_ts = ts;
    }
    pthread_mutex_unlock(&ki->mu);
    return p ? TM_OK : err->rc;
}

const char *tm_kafka_in_cluster_id(const tm_kafka_in *ki) { return ki->cluster_id; }

// One past the highest offset p's done set holds (what the manifest says was read).
static int64_t done_end(const kpart *p) {
    return p->n_rng ? (int64_t)p->rng[2 * p->n_rng - 1] + 1 : (int64_t)p->next;
}

typedef struct fp_read {
    kpart *p;
    bool got;
    int64_t at, ts; /* the first message at or after fp_off (at -1: none, the partition's end) */
} fp_read;

/* Read the fingerprinted record of each of want[0..n) again with a consumer of our own that
 * joins no group (assign only, nothing committed), until deadline_ms. */
static tm_rc read_fingerprints(tm_kafka_in *ki, fp_read *want, size_t n, double deadline_ms,
                               tm_err *err) {
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    tm_rc rc = TM_OK;
    for (size_t i = 0; i < ki->cfg->n_config && !rc; i++)
        rc = set(conf, ki->cfg->config[2 * i], ki->cfg->config[2 * i + 1], err);
    if (!rc)
        rc = set(conf, "bootstrap.servers", ki->cfg->brokers, err);
    if (!rc) // assign() wants a group id; nothing joins or commits
        rc = set(conf, "group.id", ki->cfg->group, err);
    if (!rc)
        rc = set(conf, "enable.auto.commit", "false", err);
    if (!rc)
        rc = set(conf, "enable.partition.eof", "true", err);
    if (rc) {
        rd_kafka_conf_destroy(conf);
        return rc;
    }
    char es[512];
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, es, sizeof(es));
    if (!rk) {
        rd_kafka_conf_destroy(conf);
        return TM_ERR(err, TM_E_KAFKA, "input.kafka: creating the check consumer: %s", es);
    }
    rd_kafka_poll_set_consumer(rk);
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new((int)n);
    for (size_t i = 0; i < n; i++)
        rd_kafka_topic_partition_list_add(l, want[i].p->topic, want[i].p->partition)->offset =
            want[i].p->fp_off;
    rd_kafka_resp_err_t e = rd_kafka_assign(rk, l);
    rd_kafka_topic_partition_list_destroy(l);
    size_t left = n;
    while (!e && left > 0 && tm_now_ms() < deadline_ms) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
        if (!m)
            continue;
        for (size_t i = 0; m->rkt && i < n; i++) {
            if (want[i].got || want[i].p->partition != m->partition ||
                strcmp(want[i].p->topic, rd_kafka_topic_name(m->rkt)) != 0)
                continue;
            if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
                want[i].at = -1;
            } else if (!m->err) {
                want[i].at = m->offset;
                want[i].ts = rd_kafka_message_timestamp(m, NULL);
            } else {
                break; // a transient error: fetching goes on
            }
            want[i].got = true;
            left--;
        }
        rd_kafka_message_destroy(m);
    }
    rd_kafka_assign(rk, NULL);
    rd_kafka_destroy(rk);
    if (e)
        return TM_ERR(err, TM_E_KAFKA, "input.kafka: check consumer: %s", rd_kafka_err2str(e));
    for (size_t i = 0; i < n; i++)
        if (!want[i].got)
            return TM_ERR(err, TM_E_KAFKA,
                          "input.kafka: offset %lld of %s/%d (this output folder's check of the "
                          "topic's identity) not read from brokers %s within %g s "
                          "(input.kafka.startup_timeout_s)",
                          (long long)want[i].p->fp_off, want[i].p->topic, (int)want[i].p->partition,
                          ki->cfg->brokers, startup_s(ki));
    return TM_OK;
}

// Every resumed partition of topic exists and its high watermark is not below its done offsets.
static tm_rc check_topic(tm_kafka_in *ki, const char *topic, double deadline_ms, tm_err *err) {
    const rd_kafka_metadata_t *md = NULL;
    tm_rc rc = topic_metadata(ki, topic, deadline_ms, false, &md, err);
    if (rc)
        return rc;
    int n_part = md->topic_cnt == 1 && !md->topics[0].err ? md->topics[0].partition_cnt : 0;
    rd_kafka_metadata_destroy(md);
    for (size_t i = 0; i < ki->n_parts && !rc; i++) {
        const kpart *p = &ki->parts[i];
        if (!p->resumed || strcmp(p->topic, topic) != 0 || done_end(p) == 0)
            continue;
        if (p->partition >= n_part) {
            rc = TM_ERR(err, TM_E_INVAL,
                        "input.kafka: topic %s has %d partition(s) now, but this folder has done "
                        "offsets of its partition %d: the topic was recreated; %s",
                        topic, n_part, (int)p->partition, RESTART_HINT);
            break;
        }
        int64_t lo = 0, hi = 0;
        rd_kafka_resp_err_t e;
        do
            e = rd_kafka_query_watermark_offsets(ki->rk, topic, p->partition, &lo, &hi,
                                                 left_ms(deadline_ms, WATERMARK_TIMEOUT_MS));
        while (e && tm_now_ms() < deadline_ms);
        if (e)
            rc = startup_fail(ki, "high watermark", topic, p->partition, e, err);
        else if (hi < done_end(p))
            rc = TM_ERR(err, TM_E_INVAL,
                        "input.kafka: topic %s partition %d ends at offset %lld now, but this "
                        "folder has offsets up to %lld done: the topic was recreated; %s",
                        topic, (int)p->partition, (long long)hi, (long long)done_end(p) - 1,
                        RESTART_HINT);
    }
    return rc;
}

tm_rc tm_kafka_in_check_resume(tm_kafka_in *ki, const char *cluster_before, tm_err *err) {
    if (cluster_before && ki->cluster_id && strcmp(cluster_before, ki->cluster_id) != 0)
        return TM_ERR(err, TM_E_INVAL,
                      "input.kafka: the brokers are Kafka cluster %s, but this folder's offsets "
                      "were recorded on cluster %s; %s",
                      ki->cluster_id, cluster_before, RESTART_HINT);
    double deadline_ms = tm_now_ms() + startup_s(ki) * 1000.0;
    tm_rc rc = TM_OK;
    for (size_t t = 0; t < ki->cfg->n_topics && !rc; t++)
        rc = check_topic(ki, ki->cfg->topics[t], deadline_ms, err);
    if (rc)
        return rc;
    // The parts table is only grown by the source thread, which is this one: no lock needed to
    // keep the pointers below valid until the first tm_kafka_in_next.
    fp_read *want = tm_calloc(ki->n_parts ? ki->n_parts : 1, sizeof(*want));
    if (!want)
        return TM_ERR(err, TM_E_NOMEM, "kafka checks");
    size_t n = 0;
    for (size_t i = 0; i < ki->n_parts; i++)
        if (ki->parts[i].resumed && ki->parts[i].fp_off >= 0)
            want[n++] = (fp_read){.p = &ki->parts[i]};
    if (n > 0)
        rc = read_fingerprints(ki, want, n, deadline_ms, err);
    size_t n_gone = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        const kpart *p = want[i].p;
        if (want[i].at != p->fp_off) { // removed by retention or compaction: nothing to compare
            n_gone++;
            continue;
        }
        if (want[i].ts != p->fp_ts)
            rc = TM_ERR(err, TM_E_INVAL,
                        "input.kafka: topic %s partition %d: the message at offset %lld has "
                        "timestamp %lld now, %lld when this folder answered it: the topic was "
                        "recreated; %s",
                        p->topic, (int)p->partition, (long long)p->fp_off, (long long)want[i].ts,
                        (long long)p->fp_ts, RESTART_HINT);
    }
    tm_free(want);
    if (!rc && n > 0)
        TM_LOG_INFO("kafka_in",
                    "resume: cluster %s, %zu partition(s) checked against this folder's offsets "
                    "(high watermarks, one message each%s)",
                    ki->cluster_id ? ki->cluster_id : "(no id)", n,
                    n_gone ? "; some checked messages are gone (retention), not compared" : "");
    return rc;
}

// ---- records ----

static void b64(const unsigned char *s, size_t n, char *out) {
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)s[i] << 16;
        if (i + 1 < n)
            v |= (uint32_t)s[i + 1] << 8;
        if (i + 2 < n)
            v |= s[i + 2];
        out[o++] = tab[(v >> 18) & 63];
        out[o++] = tab[(v >> 12) & 63];
        out[o++] = i + 1 < n ? tab[(v >> 6) & 63] : '=';
        out[o++] = i + 2 < n ? tab[v & 63] : '=';
    }
    out[o] = '\0';
}

// Bytes as a JSON value: text when they are UTF-8, else {"base64": "..."}; null for NULL.
static json_t *bytes_json(const void *p, size_t n) {
    if (!p)
        return json_null();
    json_t *s = json_stringn(p, n);
    if (s)
        return s;
    char *enc = tm_malloc(4 * ((n + 2) / 3) + 1);
    if (!enc)
        return NULL;
    b64(p, n, enc);
    json_t *o = json_pack("{s:s}", "base64", enc);
    tm_free(enc);
    return o;
}

static char *meta_json(const rd_kafka_message_t *m) {
    json_t *o = json_object();
    rd_kafka_timestamp_type_t tt;
    int64_t ts = rd_kafka_message_timestamp(m, &tt);
    json_object_set_new(o, "topic", json_string(rd_kafka_topic_name(m->rkt)));
    json_object_set_new(o, "partition", json_integer(m->partition));
    json_object_set_new(o, "offset", json_integer(m->offset));
    if (tt != RD_KAFKA_TIMESTAMP_NOT_AVAILABLE)
        json_object_set_new(o, "timestamp", json_integer(ts));
    json_object_set_new(o, "key", bytes_json(m->key, m->key_len));
    json_t *hs = json_array();
    rd_kafka_headers_t *hdrs = NULL;
    if (rd_kafka_message_headers(m, &hdrs) == RD_KAFKA_RESP_ERR_NO_ERROR) {
        const char *name;
        const void *val;
        size_t size;
        for (size_t i = 0;
             rd_kafka_header_get_all(hdrs, i, &name, &val, &size) == RD_KAFKA_RESP_ERR_NO_ERROR;
             i++)
            json_array_append_new(hs, json_pack("{s:o?, s:o?}", "name", json_string(name), "value",
                                                bytes_json(val, size)));
    }
    json_object_set_new(o, "headers", hs);
    char *text = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    char *copy = text ? tm_strdup(text) : NULL;
    free(text); // jansson's allocation
    return copy;
}

static bool is_blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n')
            return false;
    return true;
}

// Whether offset o of parts[part] is handed out here and not released, not yet durable (mu held).
static bool running_here(const tm_kafka_in *ki, uint32_t part, int64_t o) {
    for (size_t i = 0; i < ki->ring_n; i++) {
        const ring_ent *e = &ki->ring[(ki->ring_head + i) % ki->ring_cap];
        if (e->part == part && e->offset == o && e->state < ST_ACKED)
            return true;
    }
    return false;
}

/* One polled message: *out gets a record, or stays NULL (skipped, an event, no record). */
static tm_rc handle_message(tm_kafka_in *ki, rd_kafka_message_t *m, tm_job **out, tm_err *err) {
    *out = NULL;
    if (m->err && m->err != RD_KAFKA_RESP_ERR__PARTITION_EOF) {
        char why[256];
        if (rd_kafka_fatal_error(ki->rk, why, sizeof(why)))
            return TM_ERR(err, TM_E_KAFKA, "input.kafka: fatal consumer error: %s", why);
        pthread_mutex_lock(&ki->mu);
        ki->skips.errors++;
        pthread_mutex_unlock(&ki->mu);
        warn_limited(ki, "consumer: %s%s", rd_kafka_message_errstr(m), "");
        return TM_OK;
    }
    const char *topic = rd_kafka_topic_name(m->rkt);
    tm_rc rc = TM_OK;
    pthread_mutex_lock(&ki->mu);
    kpart *p = part_find(ki, topic, m->partition);
    if (!p || !p->owned) { // a leftover of a partition given up in a rebalance
        pthread_mutex_unlock(&ki->mu);
        return TM_OK;
    }
    if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
        rc = handled_up_to(p, m->offset, err);
        pthread_mutex_unlock(&ki->mu);
        return rc;
    }
    int64_t o = m->offset;
    if (o <= p->hi) { // handed out or skipped before (redelivery after a rebalance)
        pthread_mutex_unlock(&ki->mu);
        return TM_OK;
    }
    rc = handled_up_to(p, o, err);
    p->hi = o;
    uint32_t part = (uint32_t)(p - ki->parts);
    // Read again after a revoke released records of the partition and it came back: what this
    // run handed out there and did not release is done, or still running here.
    if (!rc && o <= p->hi_out && (done_has(p, (uint64_t)o) || running_here(ki, part, o))) {
        pthread_mutex_unlock(&ki->mu);
        return TM_OK;
    }
    if (o > p->hi_out)
        p->hi_out = o;
    const char *s = m->payload ? m->payload : "";
    size_t n = m->len;
    if (n >= 3 && memcmp(s, "\xef\xbb\xbf", 3) == 0) { // a BOM: each message is a whole file
        s += 3;
        n -= 3;
    }
    bool done = done_has(p, (uint64_t)o); // an earlier run wrote it (manifest)
    bool blank = !rc && !done && is_blank(s, n);
    if (done)
        ki->skips.done++;
    else if (blank && !m->payload)
        ki->skips.tombstones++;
    else if (blank)
        ki->skips.empty++;
    int64_t ts = rd_kafka_message_timestamp(m, NULL);
    if (blank) {
        rc = done_add(p, (uint64_t)o, (uint64_t)o, err);
        fp_note(p, o, ts);
    }
    pthread_mutex_unlock(&ki->mu);
    if (rc || done || blank)
        return rc;

    snprintf(ki->file, sizeof(ki->file), "kafka:%s/%d", topic, (int)m->partition);
    tm_job *job = NULL;
    if ((uint64_t)n > tm_rec_parser_max_line_bytes(ki->parser))
        rc = tm_rec_parser_too_long(ki->parser, ki->file, (uint64_t)o + 1, n, &job, err);
    else
        rc = tm_rec_parser_line(ki->parser, ki->file, (uint64_t)o + 1, s, n, &job, err);
    if (rc)
        return rc;
    job->src_meta_json = meta_json(m);
    if (!job->src_meta_json) {
        tm_job_destroy(job);
        return TM_ERR(err, TM_E_NOMEM, "kafka record source");
    }
    pthread_mutex_lock(&ki->mu);
    rc = ring_push(ki, job->seq_no, part, o, ts, err);
    ki->last_seq = job->seq_no;
    pthread_mutex_unlock(&ki->mu);
    if (rc) {
        tm_job_destroy(job);
        return rc;
    }
    *out = job;
    return TM_OK;
}

// Drain mode: every assigned partition reached its start high watermark.
static bool caught_up(tm_kafka_in *ki) {
    if (!ki->assigned || ki->n_stash > 0)
        return false;
    bool all = true;
    pthread_mutex_lock(&ki->mu);
    for (size_t i = 0; i < ki->n_parts && all; i++) {
        const kpart *p = &ki->parts[i];
        if (p->owned && (p->hi + 1 < p->hwm || p->dq_n > p->dq_head)) // hwm 0: no wait
            all = false;
    }
    pthread_mutex_unlock(&ki->mu);
    return all;
}

static void resume_flow(tm_kafka_in *ki) {
    if (!ki->paused)
        return;
    rd_kafka_topic_partition_list_t *a = NULL;
    if (rd_kafka_assignment(ki->rk, &a) == RD_KAFKA_RESP_ERR_NO_ERROR && a) {
        if (a->cnt > 0)
            rd_kafka_resume_partitions(ki->rk, a);
        rd_kafka_topic_partition_list_destroy(a);
    }
    ki->paused = false;
    for (size_t i = 0; i < ki->n_parts; i++) // still at max_read_ahead: stay paused
        if (ki->parts[i].capped && ki->parts[i].owned)
            pause_one(ki, &ki->parts[i], true);
}

static tm_rc stash_push(tm_kafka_in *ki, rd_kafka_message_t *m, tm_err *err) {
    if (ki->n_stash == ki->cap_stash) {
        size_t cap = ki->cap_stash ? ki->cap_stash * 2 : 16;
        rd_kafka_message_t **s = tm_malloc(cap * sizeof(*s));
        if (!s)
            return TM_ERR(err, TM_E_NOMEM, "kafka messages");
        for (size_t i = 0; i < ki->n_stash; i++)
            s[i] = ki->stash[(ki->stash_head + i) % ki->cap_stash];
        tm_free(ki->stash);
        ki->stash = s;
        ki->cap_stash = cap;
        ki->stash_head = 0;
    }
    ki->stash[(ki->stash_head + ki->n_stash) % ki->cap_stash] = m;
    ki->n_stash++;
    return TM_OK;
}

// ---- input.kafka.max_read_ahead (source thread) ----

/* m belongs to a partition at max_read_ahead, or behind messages deferred so (offset order):
 * keep it for later (true; the partition is paused) or false: handle it now. */
static bool defer_message(tm_kafka_in *ki, rd_kafka_message_t *m) {
    if (!m->rkt)
        return false;
    pthread_mutex_lock(&ki->mu);
    kpart *p = part_find(ki, rd_kafka_topic_name(m->rkt), m->partition);
    bool defer = p && p->owned && (p->dq_n > p->dq_head || p->n_flight >= ki->max_ahead);
    pthread_mutex_unlock(&ki->mu);
    if (!defer)
        return false;
    if (p->dq_n == p->dq_cap) {
        if (p->dq_head > 0) { // compact first
            memmove(p->dq, p->dq + p->dq_head, (p->dq_n - p->dq_head) * sizeof(*p->dq));
            p->dq_n -= p->dq_head;
            p->dq_head = 0;
        }
        if (p->dq_n == p->dq_cap) {
            size_t cap = p->dq_cap ? p->dq_cap * 2 : 16;
            rd_kafka_message_t **q = tm_realloc(p->dq, cap * sizeof(*q));
            if (!q)
                return false; // handled now instead: past the bound, never lost
            p->dq = q;
            p->dq_cap = cap;
        }
    }
    p->dq[p->dq_n++] = m;
    if (!p->capped) {
        p->capped = true;
        pause_one(ki, p, true);
    }
    return true;
}

/* A deferred message of a partition now below max_read_ahead (its partition is resumed once its
 * queue is empty), or NULL. */
static rd_kafka_message_t *undefer(tm_kafka_in *ki) {
    rd_kafka_message_t *m = NULL;
    pthread_mutex_lock(&ki->mu);
    for (size_t i = 0; i < ki->n_parts && !m; i++) {
        kpart *p = &ki->parts[i];
        if (!p->capped || p->n_flight >= ki->max_ahead)
            continue;
        if (p->dq_n > p->dq_head) {
            m = p->dq[p->dq_head++];
            continue;
        }
        p->dq_head = p->dq_n = 0;
        p->capped = false;
        if (!ki->paused && p->owned)
            pause_one(ki, p, false);
    }
    pthread_mutex_unlock(&ki->mu);
    return m;
}

tm_rc tm_kafka_in_next(tm_kafka_in *ki, tm_job **out, tm_err *err) {
    resume_flow(ki);
    for (;;) {
        if (ki->fatal_rc) {
            *err = ki->fatal_err;
            return ki->fatal_rc;
        }
        if (tm_stop_requested()) {
            if (!ki->stop_logged)
                TM_LOG_INFO("kafka_in", "stop signal: no more records are read; finishing the "
                                        "records in flight");
            ki->stop_logged = true;
            return TM_E_EOF;
        }
        if (!ki->cfg->follow && caught_up(ki)) {
            TM_LOG_INFO("kafka_in", "drain: every assigned partition reached its high watermark");
            return TM_E_EOF;
        }
        if (tm_now_ms() - ki->last_commit_ms >= COMMIT_EVERY_MS)
            commit_offsets(ki, false, false);
        rd_kafka_message_t *m = undefer(ki);
        if (m) {
        } else if (ki->n_stash > 0) {
            m = ki->stash[ki->stash_head];
            ki->stash_head = (ki->stash_head + 1) % ki->cap_stash;
            ki->n_stash--;
            if (defer_message(ki, m))
                continue;
        } else {
            m = rd_kafka_consumer_poll(ki->rk, POLL_MS);
            if (m && defer_message(ki, m))
                continue;
        }
        if (!m)
            continue;
        tm_job *job = NULL;
        tm_rc rc = handle_message(ki, m, &job, err);
        rd_kafka_message_destroy(m);
        if (rc)
            return rc;
        if (job) {
            *out = job;
            return TM_OK;
        }
    }
}

/* Take back the held record held_seq, whose partition was revoked (or lost) while the source
 * thread waited to push it: the group's next owner of the partition reads it again, so pushing it
 * would answer it twice. It is the newest ring entry (nothing is handed out during a wait) and
 * still in flight: it is removed, so it blocks neither ring_trim nor any commit, and its offset
 * never enters the done set. The partition's hi steps back below it, so the record is handed
 * out again should the partition come back to this consumer (stash_purge dropped the stale
 * messages that would otherwise skip over it). source.c gives its seq_no to the next record. */
static void drop_held(tm_kafka_in *ki, uint64_t held_seq) {
    pthread_mutex_lock(&ki->mu);
    ring_ent *e = ring_at(ki, held_seq);
    TM_ASSERT(e && held_seq == ki->ring_base + ki->ring_n - 1 && e->state == ST_IN_FLIGHT);
    kpart *p = &ki->parts[e->part];
    // no message of p was handled since it was handed out (release_revoked may have stepped hi
    // further back, below records released with it)
    TM_ASSERT(p->hi <= e->offset);
    if (p->hi == e->offset)
        p->hi = e->offset - 1;
    if (p->n_flight > 0)
        p->n_flight--;
    const char *topic = p->topic; // owned by the partition table, which is never shrunk
    int partition = (int)p->partition;
    long long offset = (long long)e->offset;
    ki->ring_n--;
    pthread_mutex_unlock(&ki->mu);
    TM_LOG_INFO("kafka_in",
                "rebalance: %s/%d offset %lld was revoked while waiting for the "
                "runner: dropped here (not answered, not done, not committed); the partition's "
                "new owner answers it",
                topic, partition, offset);
}

tm_rc tm_kafka_in_wait(tm_kafka_in *ki, uint64_t held_seq, int ms, bool *drop, tm_err *err) {
    *drop = false;
    if (!ki->paused) {
        rd_kafka_topic_partition_list_t *a = NULL;
        if (rd_kafka_assignment(ki->rk, &a) == RD_KAFKA_RESP_ERR_NO_ERROR && a) {
            if (a->cnt > 0)
                rd_kafka_pause_partitions(ki->rk, a);
            rd_kafka_topic_partition_list_destroy(a);
        }
        ki->paused = true;
    }
    if (tm_now_ms() - ki->last_commit_ms >= COMMIT_EVERY_MS)
        commit_offsets(ki, false, false);
    TM_ASSERT(held_seq == ki->last_seq && ki->ring_n > 0); // the last record handed out
    ki->holding = true;
    ki->held_revoked = false;
    rd_kafka_message_t *m = rd_kafka_consumer_poll(ki->rk, ms); // may run on_rebalance
    ki->holding = false;
    if (ki->held_revoked) {
        drop_held(ki, held_seq);
        *drop = true;
    }
    if (m)
        return stash_push(ki, m, err); // fetched before the pause took effect: kept, in order
    if (ki->fatal_rc) {
        *err = ki->fatal_err;
        return ki->fatal_rc;
    }
    return TM_OK;
}

tm_rc tm_kafka_in_linger(tm_kafka_in *ki, int ms, tm_err *err) {
    if (!ki->lingering) {
        ki->lingering = true;
        ki->paused = false; // pause whatever is assigned now, whatever the flag said
        rd_kafka_topic_partition_list_t *a = NULL;
        if (rd_kafka_assignment(ki->rk, &a) == RD_KAFKA_RESP_ERR_NO_ERROR && a) {
            if (a->cnt > 0)
                rd_kafka_pause_partitions(ki->rk, a);
            rd_kafka_topic_partition_list_destroy(a);
        }
        ki->paused = true;                       // on_rebalance pauses what is assigned from now on
        for (size_t i = 0; i < ki->n_stash; i++) // fetched, never handled: the next reader's
            rd_kafka_message_destroy(ki->stash[(ki->stash_head + i) % ki->cap_stash]);
        ki->n_stash = 0;
        for (size_t i = 0; i < ki->n_parts; i++)
            dq_clear(&ki->parts[i]);
        TM_LOG_INFO("kafka_in",
                    "read to the end: staying in group %s (offsets committed as records become "
                    "durable, rebalances served) until the records in flight are done",
                    ki->cfg->group);
    }
    if (ms == 0) { // the job's last commit is made: commit what it made durable, and wait
        commit_offsets(ki, true, false);
        return ki->fatal_rc ? (*err = ki->fatal_err, ki->fatal_rc) : TM_OK;
    }
    if (tm_now_ms() - ki->last_commit_ms >= COMMIT_EVERY_MS)
        commit_offsets(ki, false, false);
    else
        refresh_high(ki);
    rd_kafka_message_t *m = rd_kafka_consumer_poll(ki->rk, ms); // may run on_rebalance
    if (m)
        rd_kafka_message_destroy(m); // fetched before the pause: left to the next reader
    if (ki->fatal_rc) {
        *err = ki->fatal_err;
        return ki->fatal_rc;
    }
    return TM_OK;
}

size_t tm_kafka_in_lag(tm_kafka_in *ki, tm_source_klag *out, size_t cap) {
    size_t n = 0;
    pthread_mutex_lock(&ki->mu);
    for (size_t i = 0; i < ki->n_parts; i++) {
        const kpart *p = &ki->parts[i];
        if (!p->owned)
            continue;
        if (n < cap) {
            int64_t base = p->shown_committed >= 0 ? p->shown_committed
                           : p->hi >= 0            ? p->hi + 1
                                                   : 0;
            int64_t lag = p->high_now >= 0 ? p->high_now - base : -1;
            out[n] = (tm_source_klag){.topic = p->topic,
                                      .partition = p->partition,
                                      .committed = p->shown_committed,
                                      .position = p->hi >= 0 ? p->hi + 1 : -1,
                                      .high = p->high_now,
                                      .lag = lag < 0 && p->high_now >= 0 ? 0 : lag,
                                      .read_ahead = p->n_flight};
        }
        n++;
    }
    pthread_mutex_unlock(&ki->mu);
    return n;
}

void tm_kafka_in_set_release(tm_kafka_in *ki, bool on) { ki->release = on; }

bool tm_kafka_in_start(tm_kafka_in *ki, uint64_t seq_no) {
    pthread_mutex_lock(&ki->mu);
    ring_ent *e = ring_at(ki, seq_no);
    bool run = !e || e->state < ST_RELEASED;
    if (e && e->state == ST_IN_FLIGHT)
        e->state = ST_STARTED;
    if (e && e->state == ST_RELEASED) { // the runner drops it: it may leave the ring now
        e->state = ST_DROPPED;
        ring_trim(ki);
        pthread_cond_broadcast(&ki->cv);
    }
    pthread_mutex_unlock(&ki->mu);
    return run;
}

void tm_kafka_in_skips(tm_kafka_in *ki, tm_source_kskips *out) {
    pthread_mutex_lock(&ki->mu);
    *out = ki->skips;
    pthread_mutex_unlock(&ki->mu);
}

// ---- acks and positions (any thread) ----

static tm_rc set_state(tm_kafka_in *ki, const uint64_t *seq_nos, size_t n, uint8_t state,
                       tm_err *err) {
    tm_rc rc = TM_OK;
    pthread_mutex_lock(&ki->mu);
    for (size_t i = 0; i < n && !rc; i++) {
        ring_ent *e = ring_at(ki, seq_nos[i]);
        if (!e || e->state >= state)
            continue;
        if (state == ST_ACKED && ki->parts[e->part].n_flight > 0)
            ki->parts[e->part].n_flight--;
        e->state = state;
        rc = done_add(&ki->parts[e->part], (uint64_t)e->offset, (uint64_t)e->offset, err);
        fp_note(&ki->parts[e->part], e->offset, e->ts);
    }
    if (state == ST_ACKED) {
        ring_trim(ki);
        pthread_cond_broadcast(&ki->cv);
    }
    pthread_mutex_unlock(&ki->mu);
    return rc;
}

tm_rc tm_kafka_in_mark_written(tm_kafka_in *ki, const uint64_t *seq_nos, size_t n, tm_err *err) {
    return set_state(ki, seq_nos, n, ST_WRITTEN, err);
}

tm_rc tm_kafka_in_ack(tm_kafka_in *ki, const uint64_t *seq_nos, size_t n, tm_err *err) {
    return set_state(ki, seq_nos, n, ST_ACKED, err);
}

tm_rc tm_kafka_in_positions(tm_kafka_in *ki, tm_source_kpos_fn fn, void *ctx, tm_err *err) {
    tm_rc rc = TM_OK;
    pthread_mutex_lock(&ki->mu);
    for (size_t i = 0; i < ki->n_parts && !rc; i++) {
        const kpart *p = &ki->parts[i];
        if (p->next == 0 && p->n_rng == 0)
            continue; // nothing done: nothing to remember
        tm_source_kpos pos = {.topic = p->topic,
                              .partition = p->partition,
                              .next = (int64_t)p->next,
                              .ranges = p->rng,
                              .n_ranges = p->n_rng,
                              .owned = p->owned,
                              .fp_offset = p->fp_off,
                              .fp_ts = p->fp_ts};
        rc = fn(ctx, &pos, err);
    }
    pthread_mutex_unlock(&ki->mu);
    return rc;
}

tm_rc tm_kafka_in_group_md(tm_kafka_in *ki, tm_buf *out, tm_err *err) {
    rd_kafka_consumer_group_metadata_t *gm = rd_kafka_consumer_group_metadata(ki->rk);
    if (!gm)
        return TM_ERR(err, TM_E_KAFKA, "input.kafka: no consumer group metadata");
    void *buf = NULL;
    size_t n = 0;
    rd_kafka_error_t *e = rd_kafka_consumer_group_metadata_write(gm, &buf, &n);
    rd_kafka_consumer_group_metadata_destroy(gm);
    if (e) {
        tm_rc rc = TM_ERR(err, TM_E_KAFKA, "input.kafka: group metadata: %s",
                          rd_kafka_error_string(e));
        rd_kafka_error_destroy(e);
        return rc;
    }
    tm_buf_clear(out);
    tm_rc rc = tm_buf_append(out, buf, n, err);
    rd_kafka_mem_free(ki->rk, buf);
    return rc;
}

// ---- the source table (source_int.h) ----

static bool kafka_claims(const tm_job_spec *spec) { return spec->kafka_in != NULL; }

static tm_rc kafka_open(const tm_job_spec *spec, const tm_source_env *env, void **self,
                        tm_err *err) {
    tm_kafka_in *ki = NULL;
    tm_rec_parser_set_check_ids(env->parser, false); // redelivery is normal in Kafka
    tm_rc rc = tm_kafka_in_open(spec->kafka_in, env->parser, &ki, err);
    *self = ki;
    return rc;
}

static void kafka_close(void *self) { tm_kafka_in_close(self); }

static tm_rc kafka_next(void *self, tm_job **out, tm_err *err) {
    return tm_kafka_in_next(self, out, err);
}

static tm_rc kafka_ack(void *self, const uint64_t *seq_nos, size_t n, tm_err *err) {
    return tm_kafka_in_ack(self, seq_nos, n, err);
}

static tm_rc kafka_wait(void *self, uint64_t held_seq, int ms, bool *drop, tm_err *err) {
    return tm_kafka_in_wait(self, held_seq, ms, drop, err);
}

static tm_rc kafka_mark_written(void *self, const uint64_t *seq_nos, size_t n, tm_err *err) {
    return tm_kafka_in_mark_written(self, seq_nos, n, err);
}

static tm_rc kafka_positions(void *self, tm_source_kpos_fn fn, void *ctx, tm_err *err) {
    return tm_kafka_in_positions(self, fn, ctx, err);
}

static tm_rc kafka_resume_positions(void *self, const tm_source_kpos *pos, tm_err *err) {
    tm_rc rc = tm_kafka_in_resume_add(self, pos->topic, pos->partition, pos->next, pos->ranges,
                                      pos->n_ranges, err);
    if (!rc && pos->fp_offset >= 0)
        rc = tm_kafka_in_resume_fp(self, pos->topic, pos->partition, pos->fp_offset, pos->fp_ts,
                                   err);
    return rc;
}

static void kafka_set_txn(void *self, bool on) { tm_kafka_in_set_txn(self, on); }

static tm_rc kafka_check_resume(void *self, const char *cluster_before, tm_err *err) {
    return tm_kafka_in_check_resume(self, cluster_before, err);
}

static const char *kafka_cluster_id(const void *self) { return tm_kafka_in_cluster_id(self); }

static tm_rc kafka_linger(void *self, int ms, tm_err *err) {
    return tm_kafka_in_linger(self, ms, err);
}

static size_t kafka_lag(void *self, tm_source_klag *out, size_t cap) {
    return tm_kafka_in_lag(self, out, cap);
}

static void kafka_skips(void *self, tm_source_kskips *out) { tm_kafka_in_skips(self, out); }

static void kafka_set_release(void *self, bool on) { tm_kafka_in_set_release(self, on); }

static bool kafka_start(void *self, uint64_t seq_no) { return tm_kafka_in_start(self, seq_no); }

static uint64_t kafka_n_skipped(const void *self) {
    tm_source_kskips k;
    tm_kafka_in_skips((tm_kafka_in *)self, &k);
    return k.done;
}

static tm_rc kafka_group_md(void *self, tm_buf *out, tm_err *err) {
    return tm_kafka_in_group_md(self, out, err);
}

const tm_source_ops tm_kafka_in_ops = {
    .name = "kafka",
    .claims = kafka_claims,
    .open = kafka_open,
    .close = kafka_close,
    .next = kafka_next,
    .ack = kafka_ack,
    .live = true,
    .wait = kafka_wait,
    .mark_written = kafka_mark_written,
    .positions = kafka_positions,
    .resume_positions = kafka_resume_positions,
    .set_txn = kafka_set_txn,
    .group_md = kafka_group_md,
    .check_resume = kafka_check_resume,
    .cluster_id = kafka_cluster_id,
    .linger = kafka_linger,
    .kafka_lag = kafka_lag,
    .kafka_skips = kafka_skips,
    .set_release = kafka_set_release,
    .start = kafka_start,
    .n_skipped = kafka_n_skipped,
};
