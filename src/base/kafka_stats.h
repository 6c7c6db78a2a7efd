/* base/kafka_stats.h - what the Kafka source (ingest/kafka_in.c) and sink (sink/kafka_out.c) both
 * read from librdkafka's statistics JSON (statistics.interval.ms). Plain text in, plain text out:
 * no librdkafka type crosses this header (librdkafka stays behind those two wrappers). */
#ifndef TM_BASE_KAFKA_STATS_H
#define TM_BASE_KAFKA_STATS_H

#include <stddef.h>

/* The brokers librdkafka's statistics (text, n bytes, not NUL-terminated) name as not up, as
 * "name, name, ..." in the order of the JSON; NULL when none is down or the text does not parse.
 * A broker counts as down in state DOWN, TRY_CONNECT or CONNECT; the bootstrap entries (nodeid
 * < 0) and brokers never needed (state INIT) are left out. Returns an owned string (tm_free);
 * on allocation failure the list may be cut short. */
char *tm_kafka_stats_brokers_down(const char *text, size_t n);

#endif /* TM_BASE_KAFKA_STATS_H */
