/* sink/kafka_out.c - librdkafka producer for the Kafka sink (see kafka_out.h). Delivery reports
 * are counted in a callback that runs inside rd_kafka_poll/flush on the calling thread. */
#include "sink/kafka_out.h"

#define _POSIX_C_SOURCE 200809L
#include <jansson.h>
#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/kafka_stats.h"
#include "base/log.h"
#include "sink/sink.h"

struct tm_kafka_out {
    rd_kafka_t *rk;
    rd_kafka_topic_t *rkt;
    rd_kafka_topic_t *rkt_err; /* output.kafka.error_topic, or NULL */
    bool by_input;             /* partitioning "input" */
    bool txn;                  /* transactional mode */
    bool in_txn;               /* a transaction is open */
    int timeout_ms;
    bool started;             /* the brokers answered at open: librdkafka's log lines are shown */
    uint64_t n_quiet;         /* librdkafka log lines not shown while waiting for the brokers */
    uint64_t n_sent, n_acked; /* messages produced / acknowledged */
    uint64_t n_failed;        /* failed delivery reports */
    char first_error[256];    /* the first failed delivery report */
    tm_buf line;              /* the output line being sent (tm_kafka_out_as_out) */
    char *brokers_down;       /* owned; on_stats: the brokers not up at the last report, or NULL */
    char last_error[256];     /* the last broker error (transport, resolve), for the summary */
    double last_report_ms;    /* when on_stats last logged a change (rate limit) */
    double last_warn_ms;      /* on_error's other errors (rate limit) */
    uint64_t n_detail;        /* librdkafka lines and broker errors shown only at -v */
};

#define REPORT_EVERY_MS 5000.0 /* broker state lines, at most one per this */

static void on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *msg, void *opaque) {
    (void)rk;
    tm_kafka_out *ko = opaque;
    if (msg->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
        ko->n_acked++;
        return;
    }
    if (ko->n_failed++ == 0)
        snprintf(ko->first_error, sizeof(ko->first_error), "%s", rd_kafka_err2str(msg->err));
}

/* librdkafka's log lines (log.queue: served in our polls, on the sink thread). While open waits
 * for the brokers only the first is shown (an address nothing listens on would print a retry
 * line every second or so); after that the broker state lines come from on_stats and librdkafka's
 * own lines are shown at -v only (counted otherwise, the count logged at close). */
static void on_log(const rd_kafka_t *rk, int level, const char *fac, const char *buf) {
    tm_kafka_out *ko = rd_kafka_opaque(rk);
    if (ko->started) {
        if (tm_log_get_level() >= TM_LOG_LEVEL_DEBUG)
            rd_kafka_log_print(rk, level, fac, buf);
        else
            ko->n_detail++;
        return;
    }
    if (ko->n_quiet++ == 0)
        TM_LOG_WARN("kafka_out",
                    "librdkafka: %s: %s (more such lines are not shown until the "
                    "brokers answer)",
                    fac, buf);
}

/* librdkafka's errors (served in our polls): a broker's transport, resolve or all-brokers-down
 * error is kept for on_stats' summary and shown at -v only; anything else is a warning, at most
 * one a second. */
static void on_error(rd_kafka_t *rk, int e, const char *reason, void *opaque) {
    (void)rk;
    tm_kafka_out *ko = opaque;
    if (!ko->started) { // the start-up wait: on_log has shown the first such line
        ko->n_quiet++;
        return;
    }
    if (e == RD_KAFKA_RESP_ERR__TRANSPORT || e == RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN ||
        e == RD_KAFKA_RESP_ERR__RESOLVE) {
        ko->n_detail++;
        if (e != RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN)
            snprintf(ko->last_error, sizeof(ko->last_error), "%s", reason);
        TM_LOG_DEBUG("kafka_out", "producer: %s", reason);
        return;
    }
    double now = tm_now_ms();
    if (now - ko->last_warn_ms < 1000.0) {
        ko->n_detail++;
        return;
    }
    ko->last_warn_ms = now;
    TM_LOG_WARN("kafka_out", "producer: %s", reason);
}

/* librdkafka's statistics (statistics.interval.ms, served in our polls): one line when the set of
 * brokers that are not up changes, naming them and the last broker error, at most one every
 * REPORT_EVERY_MS (a change within it is reported at the first statistics after it). A broker
 * counts as down in state DOWN, TRY_CONNECT or CONNECT (bootstrap entries and brokers never
 * needed, state INIT, are left out). */
static int on_stats(rd_kafka_t *rk, char *text, size_t n, void *opaque) {
    (void)rk;
    tm_kafka_out *ko = opaque;
    char *now = tm_kafka_stats_brokers_down(text, n); // owned
    const char *before = ko->brokers_down;
    bool changed = (now == NULL) != (before == NULL) || (now && strcmp(now, before) != 0);
    double t = tm_now_ms();
    if (changed && t - ko->last_report_ms >= REPORT_EVERY_MS) {
        if (now)
            TM_LOG_WARN("kafka_out",
                        "brokers not answering: %s (%s; retrying, records wait in the "
                        "producer's queue; librdkafka's detail at -v)",
                        now, ko->last_error[0] ? ko->last_error : "no connection");
        else
            TM_LOG_INFO("kafka_out", "brokers: every broker in use is up again (were: %s)", before);
        tm_free(ko->brokers_down);
        ko->brokers_down = now;
        now = NULL;
        ko->last_report_ms = t;
    }
    tm_free(now);
    return 0; // the text is librdkafka's to free
}

/* Wait until the brokers answer (the metadata of the topic; it may not exist yet where the
 * cluster creates topics on first use) or startup_s pass. */
static tm_rc wait_brokers(tm_kafka_out *ko, const tm_kafka_out_cfg *cfg, tm_err *err) {
    double startup_s = cfg->startup_timeout_s > 0 ? cfg->startup_timeout_s : 30.0;
    double deadline = tm_now_ms() + startup_s * 1000.0;
    rd_kafka_resp_err_t e;
    bool waited = false;
    for (;;) {
        const rd_kafka_metadata_t *md = NULL;
        double left = deadline - tm_now_ms();
        e = rd_kafka_metadata(ko->rk, 0, ko->rkt, &md,
                              left < 1      ? 1
                              : left > 1000 ? 1000
                                            : (int)left);
        if (!e) {
            rd_kafka_metadata_destroy(md);
            break;
        }
        if (tm_now_ms() >= deadline)
            break;
        if (!waited) {
            rd_kafka_poll(ko->rk, 0); // shows librdkafka's first line: why they do not answer
            TM_LOG_WARN("kafka_out",
                        "no answer from brokers %s yet (%s); waiting up to %g s "
                        "(output.kafka.startup_timeout_s)",
                        cfg->brokers, rd_kafka_err2str(e), startup_s);
            waited = true;
        }
    }
    rd_kafka_poll(ko->rk, 0); // the lines of the wait, quietly
    ko->started = true;
    if (ko->n_quiet > 1)
        TM_LOG_INFO("kafka_out", "%llu librdkafka lines of the start-up wait not shown",
                    (unsigned long long)(ko->n_quiet - 1));
    if (e)
        return TM_ERR(err, TM_E_KAFKA,
                      "output.kafka: no metadata of topic %s from brokers %s within %g s "
                      "(output.kafka.startup_timeout_s): %s",
                      cfg->topic, cfg->brokers, startup_s, rd_kafka_err2str(e));
    return TM_OK;
}

static tm_rc check(tm_kafka_out *ko, tm_err *err) {
    char why[256];
    rd_kafka_resp_err_t fe = rd_kafka_fatal_error(ko->rk, why, sizeof(why));
    if (fe)
        return TM_ERR(err, TM_E_KAFKA, "kafka producer: fatal error: %s", why);
    if (ko->n_failed)
        return TM_ERR(err, TM_E_KAFKA, "kafka producer: %llu messages not delivered (first: %s)",
                      (unsigned long long)ko->n_failed, ko->first_error);
    return TM_OK;
}

// Turn an rd_kafka_error_t (transactions API) into err; frees it.
static tm_rc txn_fail(rd_kafka_error_t *e, const char *what, tm_err *err) {
    tm_rc rc = TM_ERR(err, TM_E_KAFKA, "kafka %s: %s%s", what, rd_kafka_error_string(e),
                      rd_kafka_error_is_fatal(e)             ? " (fatal: fenced or broken)"
                      : rd_kafka_error_txn_requires_abort(e) ? " (transaction aborted)"
                                                             : "");
    rd_kafka_error_destroy(e);
    return rc;
}

static tm_rc set(rd_kafka_conf_t *conf, const char *k, const char *v, tm_err *err) {
    char es[512];
    if (rd_kafka_conf_set(conf, k, v, es, sizeof(es)) != RD_KAFKA_CONF_OK)
        return TM_ERR(err, TM_E_KAFKA, "output.kafka: %s: %s", k, es);
    return TM_OK;
}

tm_rc tm_kafka_out_open(const tm_kafka_out_cfg *cfg, tm_kafka_out **out, tm_err *err) {
    tm_kafka_out *ko = tm_calloc(1, sizeof(*ko));
    if (!ko)
        return TM_ERR(err, TM_E_NOMEM, "kafka producer");
    ko->timeout_ms = (int)((cfg->timeout_s > 0 ? cfg->timeout_s : 60.0) * 1000);
    ko->txn = cfg->transactional_id != NULL;
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    tm_rc rc = TM_OK;
    for (size_t i = 0; i < cfg->n_config && !rc; i++)
        rc = set(conf, cfg->config[2 * i], cfg->config[2 * i + 1], err);
    // ours win over config (with a warning): they are what the commit rule relies on
    const char *const ours[][2] = {{"bootstrap.servers", cfg->brokers},
                                   {"enable.idempotence", "true"},
                                   {"acks", "all"},
                                   {"log.queue", "true"}};
    for (size_t i = 0; i < cfg->n_config; i++)
        for (size_t k = 0; k < sizeof(ours) / sizeof(ours[0]); k++)
            if (strcmp(cfg->config[2 * i], ours[k][0]) == 0 &&
                strcmp(cfg->config[2 * i + 1], ours[k][1]) != 0 &&
                !(k == 2 && strcmp(cfg->config[2 * i + 1], "-1") == 0)) // acks=-1 is all
                TM_LOG_WARN("kafka_out",
                            "output.kafka.config: %s=%s is overridden: tokenmill sets %s=%s "
                            "(a commit waits for every record's acknowledgement)",
                            ours[k][0], cfg->config[2 * i + 1], ours[k][0], ours[k][1]);
    if (!rc)
        rc = set(conf, "bootstrap.servers", cfg->brokers, err);
    if (!rc)
        rc = set(conf, "enable.idempotence", "true", err);
    if (!rc)
        rc = set(conf, "acks", "all", err);
    if (!rc && ko->txn)
        rc = set(conf, "transactional.id", cfg->transactional_id, err);
    if (!rc)
        rc = set(conf, "log.queue", "true", err); // on_log runs in our polls
    // The broker summary (on_stats) needs librdkafka's statistics; a config that sets their
    // interval itself keeps it, without the summary.
    bool own_stats = !rc;
    for (size_t i = 0; i < cfg->n_config && own_stats; i++)
        own_stats = strcmp(cfg->config[2 * i], "statistics.interval.ms") != 0;
    if (own_stats && set(conf, "statistics.interval.ms", "1000", err) == TM_OK)
        rd_kafka_conf_set_stats_cb(conf, on_stats);
    if (rc) {
        rd_kafka_conf_destroy(conf);
        tm_free(ko);
        return rc;
    }
    rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
    rd_kafka_conf_set_log_cb(conf, on_log);
    rd_kafka_conf_set_error_cb(conf, on_error);
    rd_kafka_conf_set_opaque(conf, ko);
    char es[512];
    ko->rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, es, sizeof(es)); // takes conf on success
    if (!ko->rk) {
        rd_kafka_conf_destroy(conf);
        tm_free(ko);
        return TM_ERR(err, TM_E_KAFKA, "output.kafka: creating the producer: %s", es);
    }
    rd_kafka_set_log_queue(ko->rk, NULL); // the main queue, served by rd_kafka_poll and flush
    ko->rkt = rd_kafka_topic_new(ko->rk, cfg->topic, NULL);
    if (!ko->rkt) {
        rc = TM_ERR(err, TM_E_KAFKA, "output.kafka: topic %s: %s", cfg->topic,
                    rd_kafka_err2str(rd_kafka_last_error()));
        goto fail;
    }
    ko->by_input = cfg->by_input_partition;
    if (cfg->error_topic && !(ko->rkt_err = rd_kafka_topic_new(ko->rk, cfg->error_topic, NULL))) {
        rc = TM_ERR(err, TM_E_KAFKA, "output.kafka.error_topic %s: %s", cfg->error_topic,
                    rd_kafka_err2str(rd_kafka_last_error()));
        goto fail;
    }
    rc = wait_brokers(ko, cfg, err);
    if (rc)
        goto fail;
    if (ko->txn) {
        rd_kafka_error_t *e = rd_kafka_init_transactions(ko->rk, ko->timeout_ms);
        if (!e)
            e = rd_kafka_begin_transaction(ko->rk);
        if (e) {
            rc = txn_fail(e, "init/begin transaction", err);
            goto fail;
        }
        ko->in_txn = true;
    }
    *out = ko;
    return TM_OK;
fail:
    ko->in_txn = false;
    tm_kafka_out_close(ko);
    return rc;
}

tm_rc tm_kafka_out_send(tm_kafka_out *ko, const char *key, size_t n_key, const char *value,
                        size_t n_value, tm_err *err) {
    tm_rc rc = check(ko, err);
    if (rc)
        return rc;
    for (;;) {
        if (rd_kafka_produce(ko->rkt, RD_KAFKA_PARTITION_UA, RD_KAFKA_MSG_F_COPY, (void *)value,
                             n_value, key, n_key, NULL) == 0)
            break;
        rd_kafka_resp_err_t e = rd_kafka_last_error();
        if (e != RD_KAFKA_RESP_ERR__QUEUE_FULL)
            return TM_ERR(err, TM_E_KAFKA, "kafka produce: %s", rd_kafka_err2str(e));
        rd_kafka_poll(ko->rk, 100); // backpressure: wait for deliveries to make room
        rc = check(ko, err);
        if (rc)
            return rc;
    }
    ko->n_sent++;
    rd_kafka_poll(ko->rk, 0);
    return TM_OK;
}

tm_rc tm_kafka_out_poll(tm_kafka_out *ko, tm_err *err) {
    rd_kafka_poll(ko->rk, 0);
    return check(ko, err);
}

static tm_rc commit_txn(tm_kafka_out *ko, const tm_kafka_offset *offs, size_t n_offs,
                        rd_kafka_consumer_group_metadata_t *gm, tm_err *err);

tm_rc tm_kafka_out_commit(tm_kafka_out *ko, const tm_kafka_offset *offs, size_t n_offs,
                          const char *group_id, tm_err *err) {
    rd_kafka_consumer_group_metadata_t *gm = group_id && n_offs
                                                 ? rd_kafka_consumer_group_metadata_new(group_id)
                                                 : NULL;
    tm_rc rc = commit_txn(ko, offs, n_offs, gm, err);
    if (gm)
        rd_kafka_consumer_group_metadata_destroy(gm);
    return rc;
}

tm_rc tm_kafka_out_commit_md(tm_kafka_out *ko, const tm_kafka_offset *offs, size_t n_offs,
                             const void *group_md, size_t n_md, tm_err *err) {
    rd_kafka_consumer_group_metadata_t *gm = NULL;
    if (ko->txn && n_offs) {
        rd_kafka_error_t *e = rd_kafka_consumer_group_metadata_read(&gm, group_md, n_md);
        if (e)
            return txn_fail(e, "reading the consumer group metadata", err);
    }
    tm_rc rc = commit_txn(ko, offs, n_offs, gm, err);
    if (gm)
        rd_kafka_consumer_group_metadata_destroy(gm);
    return rc;
}

static tm_rc commit_txn(tm_kafka_out *ko, const tm_kafka_offset *offs, size_t n_offs,
                        rd_kafka_consumer_group_metadata_t *gm, tm_err *err) {
    rd_kafka_resp_err_t fe = rd_kafka_flush(ko->rk, ko->timeout_ms);
    tm_rc rc = check(ko, err);
    if (rc)
        return rc;
    if (fe || ko->n_acked != ko->n_sent)
        return TM_ERR(err, TM_E_KAFKA, "kafka: %llu of %llu messages unacknowledged after %d ms",
                      (unsigned long long)(ko->n_sent - ko->n_acked),
                      (unsigned long long)ko->n_sent, ko->timeout_ms);
    if (!ko->txn)
        return TM_OK;
    rd_kafka_error_t *e = NULL;
    if (gm && n_offs) {
        rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new((int)n_offs);
        for (size_t i = 0; i < n_offs; i++)
            rd_kafka_topic_partition_list_add(l, offs[i].topic, offs[i].partition)->offset =
                offs[i].offset;
        e = rd_kafka_send_offsets_to_transaction(ko->rk, l, gm, ko->timeout_ms);
        rd_kafka_topic_partition_list_destroy(l);
        if (e)
            return txn_fail(e, "send_offsets_to_transaction", err);
    }
    e = rd_kafka_commit_transaction(ko->rk, ko->timeout_ms);
    if (e) {
        ko->in_txn = false; // aborted (or fatal): the next run sends these records again
        return txn_fail(e, "commit_transaction", err);
    }
    ko->in_txn = false;
    e = rd_kafka_begin_transaction(ko->rk);
    if (e)
        return txn_fail(e, "begin_transaction", err);
    ko->in_txn = true;
    return TM_OK;
}

uint64_t tm_kafka_out_n_acked(const tm_kafka_out *ko) { return ko->n_acked; }

void tm_kafka_out_close(tm_kafka_out *ko) {
    if (!ko)
        return;
    if (ko->in_txn) {
        rd_kafka_error_t *e = rd_kafka_abort_transaction(ko->rk, 5000);
        if (e)
            rd_kafka_error_destroy(e);
    }
    if (ko->rkt)
        rd_kafka_topic_destroy(ko->rkt);
    if (ko->rkt_err)
        rd_kafka_topic_destroy(ko->rkt_err);
    rd_kafka_flush(ko->rk, 2000);
    if (ko->n_detail)
        TM_LOG_INFO("kafka_out", "%llu librdkafka lines and broker errors were shown only at -v",
                    (unsigned long long)ko->n_detail);
    rd_kafka_destroy(ko->rk);
    tm_buf_fini(&ko->line);
    tm_free(ko->brokers_down);
    tm_free(ko);
}

// ---- the producer as an output (sink/out.h) ----

// base64 text into bytes (RFC 4648 with padding, as ingest writes it); -1 when it is not that.
static long b64_decode(const char *in, unsigned char *out) {
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t n = strlen(in);
    long o = 0;
    if (n % 4)
        return -1;
    for (size_t i = 0; i < n; i += 4) {
        uint32_t v = 0;
        int pad = 0;
        for (int j = 0; j < 4; j++) {
            const char *c = in[i + j] == '=' ? NULL : strchr(tab, in[i + j]);
            if (in[i + j] == '=')
                pad++;
            else if (!c || !in[i + j] || pad)
                return -1;
            v = v << 6 | (uint32_t)(c ? c - tab : 0);
        }
        out[o++] = (unsigned char)(v >> 16);
        if (pad < 2)
            out[o++] = (unsigned char)(v >> 8);
        if (pad < 1)
            out[o++] = (unsigned char)v;
    }
    return o;
}

/* A source value as ingest wrote it (text, {"base64": ...} or null) into bytes: *p points into
 * v or into *tmp (owned by the caller, free with tm_free). false: null or not such a value. */
static bool meta_bytes(const json_t *v, const void **p, size_t *n, unsigned char **tmp) {
    if (json_is_string(v)) {
        *p = json_string_value(v);
        *n = json_string_length(v);
        return true;
    }
    const char *b = json_string_value(json_object_get(v, "base64"));
    if (!b || !(*tmp = tm_malloc(strlen(b) / 4 * 3 + 1)))
        return false;
    long k = b64_decode(b, *tmp);
    if (k < 0)
        return false;
    *p = *tmp;
    *n = (size_t)k;
    return true;
}

static void add_header(rd_kafka_headers_t *h, const char *name, const void *v, ssize_t n) {
    rd_kafka_header_add(h, name, -1, v, n);
}

/* One record to rkt: key = the input's key (raw bytes) or else the id's text (no JSON quotes);
 * headers = the input's, then tokenmill.id and tokenmill.source.{topic,partition,offset};
 * partition = the input's with partitioning "input" (answers only), else the partitioner's over
 * the key. */
static tm_rc send_record(tm_kafka_out *ko, rd_kafka_topic_t *rkt, const tm_completion *c,
                         const char *value, size_t n_value, tm_err *err) {
    tm_rc rc = check(ko, err);
    if (rc)
        return rc;
    json_t *meta = c->src_meta_json ? json_loads(c->src_meta_json, 0, NULL) : NULL;
    json_t *id = c->id_json ? json_loads(c->id_json, JSON_DECODE_ANY, NULL) : NULL;
    const char *id_text = json_is_string(id) ? json_string_value(id) : c->id_json;
    size_t n_id = json_is_string(id) ? json_string_length(id) : id_text ? strlen(id_text) : 0;
    const void *key = id_text;
    size_t n_key = n_id;
    unsigned char *key_tmp = NULL;
    const json_t *mk = json_object_get(meta, "key");
    if (mk && !json_is_null(mk) && !meta_bytes(mk, &key, &n_key, &key_tmp)) {
        key = id_text; // not a value ingest writes: keep the id
        n_key = n_id;
    }
    rd_kafka_headers_t *h = rd_kafka_headers_new(8);
    const json_t *hs = json_object_get(meta, "headers");
    for (size_t i = 0; i < json_array_size(hs); i++) {
        const json_t *e = json_array_get(hs, i);
        const char *name = json_string_value(json_object_get(e, "name"));
        const void *v = NULL;
        size_t n = 0;
        unsigned char *tmp = NULL;
        if (!name)
            continue;
        if (meta_bytes(json_object_get(e, "value"), &v, &n, &tmp))
            add_header(h, name, v, (ssize_t)n);
        else
            add_header(h, name, NULL, 0);
        tm_free(tmp);
    }
    if (id_text)
        add_header(h, "tokenmill.id", id_text, (ssize_t)n_id);
    int32_t partition = RD_KAFKA_PARTITION_UA;
    const char *topic = json_string_value(json_object_get(meta, "topic"));
    const json_t *mp = json_object_get(meta, "partition"), *mo = json_object_get(meta, "offset");
    if (topic) {
        char num[32];
        add_header(h, "tokenmill.source.topic", topic, -1);
        snprintf(num, sizeof(num), "%lld", (long long)json_integer_value(mp));
        add_header(h, "tokenmill.source.partition", num, -1);
        snprintf(num, sizeof(num), "%lld", (long long)json_integer_value(mo));
        add_header(h, "tokenmill.source.offset", num, -1);
        if (ko->by_input && rkt == ko->rkt && json_is_integer(mp)) // answers only
            partition = (int32_t)json_integer_value(mp);
    }
    for (;;) {
        rd_kafka_resp_err_t e = rd_kafka_producev(
            ko->rk, RD_KAFKA_V_RKT(rkt), RD_KAFKA_V_PARTITION(partition),
            RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_VALUE((void *)value, n_value),
            RD_KAFKA_V_KEY(key, n_key), RD_KAFKA_V_HEADERS(h), RD_KAFKA_V_END);
        if (!e) {
            h = NULL; // librdkafka's now
            break;
        }
        if (e != RD_KAFKA_RESP_ERR__QUEUE_FULL) {
            rc = TM_ERR(err, TM_E_KAFKA, "kafka produce to %s: %s", rd_kafka_topic_name(rkt),
                        rd_kafka_err2str(e));
            break;
        }
        rd_kafka_poll(ko->rk, 100); // backpressure: wait for deliveries to make room
        rc = check(ko, err);
        if (rc)
            break;
    }
    if (h)
        rd_kafka_headers_destroy(h);
    tm_free(key_tmp);
    json_decref(id);
    json_decref(meta);
    if (rc)
        return rc;
    ko->n_sent++;
    rd_kafka_poll(ko->rk, 0);
    return TM_OK;
}

static tm_rc out_write(void *self, const tm_completion *c, tm_err *err) {
    tm_kafka_out *ko = self;
    bool is_err = c->err_code != TM_ERRCODE_NONE;
    if (is_err && !ko->rkt_err)
        return TM_OK; // routed here only with an error topic
    tm_buf_clear(&ko->line);
    tm_rc rc = is_err ? tm_sink_format_error(&ko->line, c, err)
                      : tm_sink_format_ok(&ko->line, c, err);
    if (!rc)
        rc = send_record(ko, is_err ? ko->rkt_err : ko->rkt, c, ko->line.data, ko->line.len - 1,
                         err);
    return rc;
}

static tm_rc out_commit(void *self, tm_sink_commit *ci, tm_err *err) {
    if (ci->txn_offsets)
        return tm_kafka_out_commit_md(self, ci->offs, ci->n_offs, ci->group_md, ci->n_md, err);
    return tm_kafka_out_commit(self, NULL, 0, NULL, err);
}

static tm_rc out_poll(void *self, tm_err *err) { return tm_kafka_out_poll(self, err); }

static tm_rc out_close(void *self, tm_err *err) {
    (void)err;
    tm_kafka_out_close(self);
    return TM_OK;
}

static const tm_sink_out_ops out_ops = {.name = "kafka",
                                        .write = out_write,
                                        .commit = out_commit,
                                        .poll = out_poll,
                                        .close = out_close};

tm_sink_out tm_kafka_out_as_out(tm_kafka_out *ko) {
    return (tm_sink_out){.ops = &out_ops, .self = ko};
}
