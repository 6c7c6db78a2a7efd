/* sink/kafka_out_stub.c - the Kafka sink of a build without librdkafka: open fails, saying so
 * (so its output table, tm_kafka_out_as_out, is never reached). */
#include "sink/kafka_out.h"

tm_rc tm_kafka_out_open(const tm_kafka_out_cfg *cfg, tm_kafka_out **out, tm_err *err) {
    (void)cfg;
    *out = NULL;
    return TM_ERR(err, TM_E_KAFKA,
                  "output.kafka: this tokenmill was built without librdkafka "
                  "(install librdkafka-dev and rebuild)");
}

tm_rc tm_kafka_out_send(tm_kafka_out *ko, const char *key, size_t n_key, const char *value,
                        size_t n_value, tm_err *err) {
    (void)ko, (void)key, (void)n_key, (void)value, (void)n_value;
    return TM_ERR(err, TM_E_KAFKA, "no librdkafka");
}

tm_rc tm_kafka_out_poll(tm_kafka_out *ko, tm_err *err) {
    (void)ko, (void)err;
    return TM_OK;
}

tm_rc tm_kafka_out_commit(tm_kafka_out *ko, const tm_kafka_offset *offs, size_t n_offs,
                          const char *group_id, tm_err *err) {
    (void)ko, (void)offs, (void)n_offs, (void)group_id;
    return TM_ERR(err, TM_E_KAFKA, "no librdkafka");
}

tm_rc tm_kafka_out_commit_md(tm_kafka_out *ko, const tm_kafka_offset *offs, size_t n_offs,
                             const void *group_md, size_t n_md, tm_err *err) {
    (void)ko, (void)offs, (void)n_offs, (void)group_md, (void)n_md;
    return TM_ERR(err, TM_E_KAFKA, "no librdkafka");
}

uint64_t tm_kafka_out_n_acked(const tm_kafka_out *ko) {
    (void)ko;
    return 0;
}

void tm_kafka_out_close(tm_kafka_out *ko) { (void)ko; }

static tm_rc out_write(void *self, const tm_completion *c, tm_err *err) {
    (void)self, (void)c;
    return TM_ERR(err, TM_E_KAFKA, "no librdkafka");
}

static tm_rc out_commit(void *self, tm_sink_commit *ci, tm_err *err) {
    (void)self, (void)ci;
    return TM_ERR(err, TM_E_KAFKA, "no librdkafka");
}

static tm_rc out_close(void *self, tm_err *err) {
    (void)self, (void)err;
    return TM_OK;
}

static const tm_sink_out_ops out_ops = {
    .name = "kafka", .write = out_write, .commit = out_commit, .close = out_close};

tm_sink_out tm_kafka_out_as_out(tm_kafka_out *ko) {
    return (tm_sink_out){.ops = &out_ops, .self = ko};
}
