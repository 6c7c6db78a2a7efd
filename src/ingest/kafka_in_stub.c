/* ingest/kafka_in_stub.c - the Kafka source of a build without librdkafka (and of the fuzz
 * targets): it claims a Kafka input (source_int.h) and its open fails, saying so; nothing else is
 * reachable. */
#include "ingest/kafka_in.h"
#include "ingest/source_int.h"

tm_rc tm_kafka_in_open(const tm_job_kafka_in *cfg, tm_rec_parser *parser, tm_kafka_in **out,
                       tm_err *err) {
    (void)cfg, (void)parser;
    *out = NULL;
    return TM_ERR(err, TM_E_KAFKA,
                  "input.kafka: this tokenmill was built without librdkafka "
                  "(install librdkafka-dev and rebuild)");
}

void tm_kafka_in_close(tm_kafka_in *ki) { (void)ki; }

static bool kafka_claims(const tm_job_spec *spec) { return spec->kafka_in != NULL; }

static tm_rc kafka_open(const tm_job_spec *spec, const tm_source_env *env, void **self,
                        tm_err *err) {
    tm_kafka_in *ki = NULL;
    tm_rc rc = tm_kafka_in_open(spec->kafka_in, env->parser, &ki, err);
    *self = ki;
    return rc;
}

static void kafka_close(void *self) { tm_kafka_in_close(self); }

static tm_rc kafka_next(void *self, tm_job **out, tm_err *err) {
    (void)self, (void)out, (void)err;
    return TM_E_EOF;
}

const tm_source_ops tm_kafka_in_ops = {
    .name = "kafka",
    .claims = kafka_claims,
    .open = kafka_open,
    .close = kafka_close,
    .next = kafka_next,
    .live = true,
};
