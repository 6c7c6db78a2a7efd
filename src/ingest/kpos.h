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

#endif /* TM_INGEST_KPOS_H */
