/* sink/kafka_out.h - the Kafka sink: completions produced to a topic, keyed by record id, with
 * librdkafka's idempotent producer (enable.idempotence=true, acks=all: retries never duplicate or
 * reorder within a run), optionally transactional. The only sink file that includes librdkafka;
 * without librdkafka the build has a stub whose open fails with TM_E_KAFKA.
 *
 * Commit rule (sink/manifest.h): a record is committed when the broker acknowledged it (delivery
 * report without error) and the manifest that lists it is durable. tm_kafka_out_commit waits for
 * the acknowledgement of everything sent so far (and, in transactional mode, commits the open
 * transaction and begins the next), then the job publishes the manifest. A crash between the two
 * re-sends that commit's records on resume: at-least-once for the idempotent producer (consumers
 * dedupe on the key); with transactions the re-sent records are in a new transaction, and the one
 * before was committed, so a read_committed consumer can see them twice as well unless the input
 * offsets travel in the transaction (send_offsets_to_transaction: Kafka input, where the group
 * offsets are the source of truth; that is the Kafka-to-Kafka exactly-once path).
 *
 * Threading: one thread at a time (the sink thread; delivery reports are served inside send,
 * poll and commit, never on another thread). */
#ifndef TM_SINK_KAFKA_OUT_H
#define TM_SINK_KAFKA_OUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "sink/out.h"

typedef struct tm_kafka_out tm_kafka_out;

typedef struct tm_kafka_out_cfg {
    const char *brokers; /* bootstrap.servers */
    const char *topic;
    char *const *config; /* [2 * n_config] extra librdkafka settings, key then value */
    size_t n_config;
    const char *transactional_id; /* NULL: no transactions */
    double timeout_s;             /* most seconds one commit may wait for acks; 0 = 60 */
    double startup_timeout_s;     /* most seconds open waits for the brokers to answer; 0 = 30 */
    bool by_input_partition;      /* output.kafka.partitioning "input": the input's partition
                                   * number; false ("key"): the partitioner over the key */
    const char *error_topic;      /* output.kafka.error_topic: error records go there; NULL */
} tm_kafka_out_cfg;

/* An input position to commit inside the transaction (Kafka input). */
typedef struct tm_kafka_offset {
    const char *topic;
    int32_t partition;
    int64_t offset; /* the next offset to consume (last processed + 1) */
} tm_kafka_offset;

/* Create the producer, wait up to startup_timeout_s for the brokers to answer (the topic's
 * metadata; while waiting only the first librdkafka log line is shown) and with a transactional
 * id, init_transactions + begin the first transaction. Borrows cfg for the call. On success *out
 * owns it (tm_kafka_out_close). TM_E_KAFKA with librdkafka's message (bad setting, brokers not
 * answering: named, init failure, fenced), TM_E_NOMEM. */
tm_rc tm_kafka_out_open(const tm_kafka_out_cfg *cfg, tm_kafka_out **out, tm_err *err);

/* Produce one message (key = the record id's JSON text, value = the output line without its
 * "\n"); librdkafka copies both. Blocks, serving delivery reports, while the local queue is full.
 * A failed delivery report seen so far is returned here as TM_E_KAFKA (the job stops: records
 * are never skipped). */
tm_rc tm_kafka_out_send(tm_kafka_out *ko, const char *key, size_t n_key, const char *value,
                        size_t n_value, tm_err *err);

/* Serve delivery reports without blocking. TM_E_KAFKA when one failed or the producer is fatal. */
tm_rc tm_kafka_out_poll(tm_kafka_out *ko, tm_err *err);

/* Make everything sent so far durable in Kafka: wait for every delivery report; in transactional
 * mode also send offs[0..n_offs) for group_id (when group_id is not NULL) with
 * send_offsets_to_transaction, commit the transaction and begin the next one. TM_E_KAFKA
 * (timeout, failed delivery, abortable or fatal transaction error: the job stops and the next run
 * resends what the manifest does not list). */
tm_rc tm_kafka_out_commit(tm_kafka_out *ko, const tm_kafka_offset *offs, size_t n_offs,
                          const char *group_id, tm_err *err);

/* Like tm_kafka_out_commit, with the consumer's own group metadata (generation and member id, so
 * the group coordinator fences a consumer that lost its partitions) serialized by the Kafka source
 * (tm_source_group_md) as group_md[0..n_md) instead of a bare group id. */
tm_rc tm_kafka_out_commit_md(tm_kafka_out *ko, const tm_kafka_offset *offs, size_t n_offs,
                             const void *group_md, size_t n_md, tm_err *err);

/* The producer as an output of the writer (sink/out.h): write sends an ok record (key: its id's
 * JSON text, value: its output line, tm_sink_format_ok), commit is tm_kafka_out_commit_md with
 * the input's offsets when they travel in the transaction (tm_sink_commit.txn_offsets), else
 * tm_kafka_out_commit without offsets; poll is tm_kafka_out_poll, close tm_kafka_out_close. The
 * output holds ko; its close frees it. */
tm_sink_out tm_kafka_out_as_out(tm_kafka_out *ko);

/* Messages acknowledged by the broker so far. */
uint64_t tm_kafka_out_n_acked(const tm_kafka_out *ko);

/* Abort an open transaction (its records are not committed), flush briefly and free. NULL is a
 * no-op. Call tm_kafka_out_commit first to keep what was sent. */
void tm_kafka_out_close(tm_kafka_out *ko);

#endif /* TM_SINK_KAFKA_OUT_H */
