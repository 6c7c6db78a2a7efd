/* base/seqset.h - a set of record sequence numbers (seq_no) kept as a watermark plus the members
 * above it: every seq_no < watermark is in the set, and `above` lists the members > watermark in
 * ascending order. Records finish almost in input order (the runner reorders within its look-ahead
 * window), so `above` stays small: memory is O(out-of-order records), not O(records). Used for the
 * job's done records (sink/manifest.h) and the sources' durable acknowledgements. Not thread-safe:
 * the owner serialises access. */
#ifndef TM_BASE_SEQSET_H
#define TM_BASE_SEQSET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"

typedef struct tm_seqset {
    uint64_t watermark; /* every seq_no below it is a member */
    uint64_t *above;    /* [n_above] ascending members > watermark; owned */
    size_t n_above, cap_above;
} tm_seqset;

/* Storage is caller-provided; an all-zero tm_seqset is an empty set. */
void tm_seqset_fini(tm_seqset *s);
/* Add seq_no (a member already: no-op). TM_E_NOMEM. */
tm_rc tm_seqset_add(tm_seqset *s, uint64_t seq_no, tm_err *err);
bool tm_seqset_has(const tm_seqset *s, uint64_t seq_no);
/* Members in total: watermark + n_above. */
uint64_t tm_seqset_count(const tm_seqset *s);
/* Replace dst with a copy of src. TM_E_NOMEM (dst unchanged). */
tm_rc tm_seqset_copy(tm_seqset *dst, const tm_seqset *src, tm_err *err);

#endif /* TM_BASE_SEQSET_H */
