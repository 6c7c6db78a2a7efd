/* ingest/source_int.h - the record parser of source.c on its own, for the other ingest sources
 * (kafka_in.c: one message value is one line) and for tests/fuzz/fuzz_record.c. Private to
 * src/ingest and its tests. Same threading rule as tm_source: one thread at a time. */
#ifndef TM_INGEST_SOURCE_INT_H
#define TM_INGEST_SOURCE_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "base/record.h"
#include "ingest/source.h"

/* Parse one line s[0..n) (no line ending; need not be NUL-terminated; blank and BOM handling
 * are the caller's) into *out, a new tm_job (valid or an error record) with the next seq_no,
 * file (copied) and line_no. Uses and updates the source's id set and per-file format guess.
 * Errors: TM_E_NOMEM only. */
tm_rc tm_source_parse_line(tm_source *src, const char *file, uint64_t line_no, const char *s,
                           size_t n, tm_job **out, tm_err *err);
/* A line_too_long error record for a line of n_bytes bytes, with the next seq_no. TM_E_NOMEM. */
tm_rc tm_source_line_too_long(tm_source *src, const char *file, uint64_t line_no,
                              uint64_t n_bytes, tm_job **out, tm_err *err);
/* limits.max_line_bytes of the job. */
uint64_t tm_source_max_line_bytes(const tm_source *src);
/* Check ids for duplicates (default on). Off for Kafka, where a redelivered message is normal. */
void tm_source_set_check_ids(tm_source *src, bool on);
/* Forget the format guess for unparsable lines (a new file or partition starts). */
void tm_source_reset_format(tm_source *src);

#endif /* TM_INGEST_SOURCE_INT_H */
