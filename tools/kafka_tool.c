/* tools/kafka_tool.c - put JSONL lines into a Kafka topic and read a topic back (for tests, demos
 * and users without kcat). Works against tools/kafka_mock and real brokers.
 *
 *   kafka_tool produce BOOTSTRAP TOPIC [FILE]   one message per non-empty line of FILE (or stdin),
 *                                               no key (spread over partitions), idempotent
 *                                               producer; waits for every delivery; exit 1 if any
 *                                               failed. Prints "produced N".
 *   kafka_tool produce BOOTSTRAP TOPIC FILE --keyed  the same, each message with key "k<line>"
 *                                               (line = its 1-based number among the messages)
 *                                               and a header "origin: kafka_tool".
 *   kafka_tool committed BOOTSTRAP GROUP TOPIC  the group's committed offset of every partition,
 *                                               "partition<TAB>offset" per line (-1: none).
 *   kafka_tool consume BOOTSTRAP TOPIC [--meta] every message from the start of every partition up
 *                                               to the high watermarks seen at start (no consumer
 *                                               group, nothing committed), one value per line;
 *                                               --meta prefixes "partition<TAB>offset<TAB>".
 */
#define _POSIX_C_SOURCE 200809L
#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static long g_failed;

static void on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque) {
    (void)rk;
    (void)opaque;
    if (m->err) {
        g_failed++;
        fprintf(stderr, "kafka_tool: delivery failed: %s\n", rd_kafka_err2str(m->err));
    }
}

static rd_kafka_t *make_client(rd_kafka_type_t type, const char *bootstrap, const char *group) {
    char errstr[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    if (rd_kafka_conf_set(conf, "bootstrap.servers", bootstrap, errstr, sizeof(errstr)) ||
        (type == RD_KAFKA_PRODUCER &&
         (rd_kafka_conf_set(conf, "enable.idempotence", "true", errstr, sizeof(errstr)) ||
          rd_kafka_conf_set(conf, "linger.ms", "5", errstr, sizeof(errstr)))) ||
        (type == RD_KAFKA_CONSUMER &&
         // assign() needs a group id but joins no group; nothing is committed.
         (rd_kafka_conf_set(conf, "enable.partition.eof", "true", errstr, sizeof(errstr)) ||
          rd_kafka_conf_set(conf, "group.id", group ? group : "tokenmill-kafka-tool", errstr,
                            sizeof(errstr)) ||
          rd_kafka_conf_set(conf, "enable.auto.commit", "false", errstr, sizeof(errstr))))) {
        fprintf(stderr, "kafka_tool: %s\n", errstr);
        rd_kafka_conf_destroy(conf);
        return NULL;
    }
    if (type == RD_KAFKA_PRODUCER)
        rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
    rd_kafka_t *rk = rd_kafka_new(type, conf, errstr, sizeof(errstr));
    if (!rk)
        fprintf(stderr, "kafka_tool: %s\n", errstr);
    return rk;
}

static int produce(const char *bootstrap, const char *topic, const char *path, int keyed) {
    FILE *f = path ? fopen(path, "rb") : stdin;
    if (!f) {
        perror(path);
        return 1;
    }
    rd_kafka_t *rk = make_client(RD_KAFKA_PRODUCER, bootstrap, NULL);
    if (!rk)
        return 1;
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    long count = 0;
    while ((n = getline(&line, &cap, f)) > 0) {
        if (line[n - 1] == '\n')
            n--;
        if (n == 0)
            continue;
        char key[32];
        snprintf(key, sizeof(key), "k%ld", count + 1);
        for (;;) {
            rd_kafka_resp_err_t e =
                keyed ? rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(topic),
                                          RD_KAFKA_V_VALUE(line, (size_t)n),
                                          RD_KAFKA_V_KEY(key, strlen(key)),
                                          RD_KAFKA_V_HEADER("origin", "kafka_tool", -1),
                                          RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END)
                      : rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(topic),
                                          RD_KAFKA_V_VALUE(line, (size_t)n),
                                          RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
            if (e == RD_KAFKA_RESP_ERR__QUEUE_FULL) {
                rd_kafka_poll(rk, 100); // backpressure: wait for deliveries
                continue;
            }
            if (e) {
                fprintf(stderr, "kafka_tool: produce: %s\n", rd_kafka_err2str(e));
                g_failed++;
            }
            break;
        }
        count++;
        rd_kafka_poll(rk, 0);
    }
    free(line);
    if (path)
        fclose(f);
    rd_kafka_resp_err_t e = rd_kafka_flush(rk, 60000);
    if (e) {
        fprintf(stderr, "kafka_tool: flush: %s\n", rd_kafka_err2str(e));
        g_failed++;
    }
    rd_kafka_destroy(rk);
    printf("produced %ld\n", count - g_failed);
    return g_failed ? 1 : 0;
}

// Number of partitions of topic (metadata), or -1 with a message.
static int n_partitions(rd_kafka_t *rk, const char *topic) {
    const rd_kafka_metadata_t *md = NULL;
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, topic, NULL);
    rd_kafka_resp_err_t e = rd_kafka_metadata(rk, 0, rkt, &md, 10000);
    rd_kafka_topic_destroy(rkt);
    if (e || md->topic_cnt != 1 || md->topics[0].err) {
        fprintf(stderr, "kafka_tool: metadata of %s: %s\n", topic,
                rd_kafka_err2str(e               ? e
                                 : md->topic_cnt ? md->topics[0].err
                                                 : RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC));
        if (md)
            rd_kafka_metadata_destroy(md);
        return -1;
    }
    int n = md->topics[0].partition_cnt;
    rd_kafka_metadata_destroy(md);
    return n;
}

static int committed(const char *bootstrap, const char *group, const char *topic) {
    rd_kafka_t *rk = make_client(RD_KAFKA_CONSUMER, bootstrap, group);
    if (!rk)
        return 1;
    int n = n_partitions(rk, topic), rc = n < 0;
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(n > 0 ? n : 1);
    for (int p = 0; p < n; p++)
        rd_kafka_topic_partition_list_add(l, topic, p);
    rd_kafka_resp_err_t e = n > 0 ? rd_kafka_committed(rk, l, 10000) : RD_KAFKA_RESP_ERR_NO_ERROR;
    if (e) {
        fprintf(stderr, "kafka_tool: committed: %s\n", rd_kafka_err2str(e));
        rc = 1;
    }
    for (int i = 0; !rc && i < l->cnt; i++)
        printf("%d\t%lld\n", l->elems[i].partition,
               (long long)(l->elems[i].offset < 0 ? -1 : l->elems[i].offset));
    rd_kafka_topic_partition_list_destroy(l);
    rd_kafka_destroy(rk);
    return rc;
}

static int consume(const char *bootstrap, const char *topic, int meta) {
    rd_kafka_t *rk = make_client(RD_KAFKA_CONSUMER, bootstrap, NULL);
    if (!rk)
        return 1;
    const rd_kafka_metadata_t *md = NULL;
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, topic, NULL);
    rd_kafka_resp_err_t e = rd_kafka_metadata(rk, 0, rkt, &md, 10000);
    rd_kafka_topic_destroy(rkt);
    if (e || md->topic_cnt != 1 || md->topics[0].err) {
        fprintf(stderr, "kafka_tool: metadata of %s: %s\n", topic,
                rd_kafka_err2str(e               ? e
                                 : md->topic_cnt ? md->topics[0].err
                                                 : RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC));
        if (md)
            rd_kafka_metadata_destroy(md);
        rd_kafka_destroy(rk);
        return 1;
    }
    int n_part = md->topics[0].partition_cnt;
    rd_kafka_metadata_destroy(md);
    rd_kafka_topic_partition_list_t *parts = rd_kafka_topic_partition_list_new(n_part);
    long remaining = 0;
    int rc = 0;
    for (int p = 0; p < n_part; p++) {
        int64_t lo = 0, hi = 0;
        e = rd_kafka_query_watermark_offsets(rk, topic, p, &lo, &hi, 10000);
        if (e) {
            fprintf(stderr, "kafka_tool: watermarks of %s/%d: %s\n", topic, p, rd_kafka_err2str(e));
            rc = 1;
            break;
        }
        if (hi > lo) {
            rd_kafka_topic_partition_list_add(parts, topic, p)->offset = lo;
            remaining += hi - lo;
        }
    }
    if (!rc && remaining > 0) {
        rd_kafka_assign(rk, parts);
        long eofs = 0, idle_s = 0;
        while (eofs < parts->cnt) {
            rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 1000);
            if (!m) {
                if (++idle_s >= 60) { // nothing for a minute: give up rather than hang
                    fprintf(stderr, "kafka_tool: consume: no progress for 60 s\n");
                    rc = 1;
                    break;
                }
                continue;
            }
            idle_s = 0;
            if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
                eofs++; // watermarks were read before: every message up to them is in
            } else if (m->err) {
                fprintf(stderr, "kafka_tool: consume: %s\n", rd_kafka_message_errstr(m));
                if (m->err != RD_KAFKA_RESP_ERR__TRANSPORT &&
                    m->err != RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN)
                    rc = 1, eofs = parts->cnt; // not a transient error: stop
            } else {
                if (meta)
                    printf("%d\t%lld\t", m->partition, (long long)m->offset);
                fwrite(m->payload, 1, m->len, stdout);
                putchar('\n');
            }
            rd_kafka_message_destroy(m);
        }
    }
    rd_kafka_topic_partition_list_destroy(parts);
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);
    return rc;
}

int main(int argc, char **argv) {
    if (argc >= 4 && strcmp(argv[1], "produce") == 0)
        return produce(argv[2], argv[3], argc > 4 ? argv[4] : NULL,
                       argc > 5 && strcmp(argv[5], "--keyed") == 0);
    if (argc >= 5 && strcmp(argv[1], "committed") == 0)
        return committed(argv[2], argv[3], argv[4]);
    if (argc >= 4 && strcmp(argv[1], "consume") == 0)
        return consume(argv[2], argv[3], argc > 4 && strcmp(argv[4], "--meta") == 0);
    fprintf(stderr, "usage: kafka_tool produce BOOTSTRAP TOPIC [FILE [--keyed]]\n"
                    "       kafka_tool committed BOOTSTRAP GROUP TOPIC\n"
                    "       kafka_tool consume BOOTSTRAP TOPIC [--meta]\n");
    return 2;
}
