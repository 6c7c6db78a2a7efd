/* ingest/kafka_in_stub.c - the Kafka source of a build without librdkafka (and of the fuzz
 * targets): open fails, saying so; nothing else is reachable. */
#include "ingest/kafka_in.h"

tm_rc tm_kafka_in_open(const tm_job_kafka_in *cfg, tm_rec_parser *parser, tm_kafka_in **out,
                       tm_err *err) {
    (void)cfg, (void)parser;
    *out = NULL;
    return TM_ERR(err, TM_E_KAFKA,
                  "input.kafka: this tokenmill was built without librdkafka "
                  "(install librdkafka-dev and rebuild)");
}

void tm_kafka_in_close(tm_kafka_in *ki) { (void)ki; }

tm_rc tm_kafka_in_resume_add(tm_kafka_in *ki, const char *topic, int32_t partition, int64_t next,
                             const uint64_t *ranges, size_t n_ranges, tm_err *err) {
    (void)ki, (void)topic, (void)partition, (void)next, (void)ranges, (void)n_ranges, (void)err;
    return TM_OK;
}

void tm_kafka_in_set_txn(tm_kafka_in *ki, bool on) { (void)ki, (void)on; }

tm_rc tm_kafka_in_next(tm_kafka_in *ki, tm_job **out, tm_err *err) {
    (void)ki, (void)out, (void)err;
    return TM_E_EOF;
}

tm_rc tm_kafka_in_wait(tm_kafka_in *ki, uint64_t held_seq, int ms, bool *drop, tm_err *err) {
    (void)ki, (void)held_seq, (void)ms, (void)err;
    *drop = false;
    return TM_OK;
}

tm_rc tm_kafka_in_mark_written(tm_kafka_in *ki, const uint64_t *seq_nos, size_t n, tm_err *err) {
    (void)ki, (void)seq_nos, (void)n, (void)err;
    return TM_OK;
}

tm_rc tm_kafka_in_ack(tm_kafka_in *ki, const uint64_t *seq_nos, size_t n, tm_err *err) {
    (void)ki, (void)seq_nos, (void)n, (void)err;
    return TM_OK;
}

tm_rc tm_kafka_in_positions(tm_kafka_in *ki, tm_source_kpos_fn fn, void *ctx, tm_err *err) {
    (void)ki, (void)fn, (void)ctx, (void)err;
    return TM_OK;
}

tm_rc tm_kafka_in_group_md(tm_kafka_in *ki, tm_buf *out, tm_err *err) {
    (void)ki, (void)out;
    return TM_ERR(err, TM_E_KAFKA, "no librdkafka");
}
