/* ingest/kpos.h - Kafka partition positions as the source, the Kafka consumer and the manifest
 * exchange them: one partition's done offsets and the callback that receives them. Types only, so
 * that source.c (which drives kafka_in.c) and kafka_in.c share them without depending on each
 * other. */
#ifndef TM_INGEST_KPOS_H
#define TM_INGEST_KPOS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"

/* One Kafka partition's done offsets (the manifest's view; ingest/kafka_in.h). */
typedef struct tm_source_kpos {
    const char *topic; /* borrowed for the callback */
    int32_t partition;
    int64_t next;           /* every offset below it is done */
    const uint64_t *ranges; /* [2 * n_ranges] done offsets above next: inclusive [first, last]
                             * pairs, ascending, not touching next; borrowed for the callback */
    size_t n_ranges;
    bool owned; /* assigned to this consumer now: its offset may be committed */
    /* One done record that held a message: its offset (-1: none) and Kafka timestamp; a later
     * run reads it again to tell a recreated topic (tm_source_check_resume). */
    int64_t fp_offset, fp_ts;
} tm_source_kpos;
typedef tm_rc (*tm_source_kpos_fn)(void *ctx, const tm_source_kpos *pos, tm_err *err);

/* One assigned partition's figures now (tm_source_kafka_lag): what a lag monitor shows. */
typedef struct tm_source_klag {
    const char *topic; /* borrowed: valid until the source is closed */
    int32_t partition;
    int64_t committed;   /* the offset this consumer last committed (-1 none yet) */
    int64_t position;    /* the next offset this consumer reads (-1 none yet) */
    int64_t high;        /* the partition's high watermark as last fetched (-1 unknown) */
    int64_t lag;         /* high - the committed offset (or - position, or - 0): records not yet
                          * durable and committed; -1 unknown */
    uint32_t read_ahead; /* records read and handed to the runner, not yet durable (what
                          * input.kafka.max_read_ahead bounds) */
} tm_source_klag;

/* Counters of a Kafka input (tm_source_kafka_skips): messages that made no record, records taken
 * back, offset commits and errors. */
typedef struct tm_source_kskips {
    uint64_t tombstones; /* null values */
    uint64_t empty;      /* empty or blank values */
    uint64_t done;       /* done in the manifest already (an earlier run answered them) */
    uint64_t released;   /* records handed out, then released at a revoke before they started */
    uint64_t commits;    /* offset commits the brokers accepted (none with transactions) */
    uint64_t errors;     /* offset commits failed or not answered, and librdkafka's consumer
                          * errors (broker and transport errors included) */
} tm_source_kskips;

#endif /* TM_INGEST_KPOS_H */
