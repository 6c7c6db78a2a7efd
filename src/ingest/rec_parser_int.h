/* ingest/rec_parser_int.h - the record parser: one JSONL line (or one Kafka message value) into a
 * tm_job, a valid record or an error record, numbered in the order lines come in. It keeps the
 * duplicate-id set and the per-file format guess (error records for lines that are not JSON
 * objects take the format of the file's first object line). Used by the file reader (source.c,
 * which owns the parser of a tm_source) and the Kafka source (kafka_in.c, which borrows it), so
 * neither calls the other's internals; and by tests/fuzz/fuzz_record.c. Private to src/ingest and
 * its tests. One thread at a time (the source thread). */
#ifndef TM_INGEST_REC_PARSER_INT_H
#define TM_INGEST_REC_PARSER_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "base/record.h"
#include "ingest/job_spec.h"

/* Set of ids seen so far: XXH3-128 hashes of the id's compact JSON text in an open-addressing
 * table (linear probing, load <= 3/4). A false "duplicate" needs a 128-bit collision. In memory
 * only (a resumed run rebuilds it as it reads), so the hash may change between versions. */
typedef struct tm_rec_parser_ids {
    uint64_t *slots; /* [cap][2], owned; {0, 0} marks an empty slot */
    size_t cap;      /* power of two, or 0 */
    size_t n;        /* ids in the set */
} tm_rec_parser_ids;

/* An unknown record or body key seen in this job (warned about once, counted). */
typedef struct tm_rec_parser_unknown {
    char key[64];  /* "max_token", "body.max_token" (cut) */
    char near[32]; /* the nearest known key, or "" */
    uint64_t n;    /* records that had it */
} tm_rec_parser_unknown;
#define TM_REC_PARSER_MAX_UNKNOWN 32 /* distinct keys tracked; more are counted together */

typedef struct tm_rec_parser {
    const tm_job_spec *spec; /* borrowed: limits.* */
    uint64_t seq_no;         /* seq_no of the next record */
    tm_rec_parser_ids ids;
    tm_rec_format file_fmt; /* format of the current file's first JSON object line */
    bool file_fmt_known;
    bool no_id_check; /* duplicate ids are not checked (Kafka: redelivery is normal) */
    /* Unknown keys (not in schemas/record.schema.json or openai_input.schema.json): each is
     * warned about once, with the nearest known key, at its first record; fini logs the counts.
     * With limits.strict_fields a record with one is an invalid_value error record. */
    tm_rec_parser_unknown unknown[TM_REC_PARSER_MAX_UNKNOWN];
    size_t n_unknown;
    uint64_t n_unknown_other; /* records with keys beyond the tracked ones */
} tm_rec_parser;

/* Caller-provided storage. Borrows spec, which must outlive the parser. Allocates nothing. */
void tm_rec_parser_init(tm_rec_parser *ps, const tm_job_spec *spec);
void tm_rec_parser_fini(tm_rec_parser *ps); /* frees the id set; logs the unknown-key counts */
/* The known key nearest to key (edit distance <= 2 and less than key's length), or NULL. */
const char *tm_rec_parser_nearest(const char *key, const char *const *known);

/* Parse one line s[0..n) (no line ending; need not be NUL-terminated; blank and BOM handling
 * are the caller's) into *out, a new tm_job (valid or an error record) with the next seq_no,
 * file (copied) and line_no. Uses and updates the id set and the format guess.
 * Errors: TM_E_NOMEM only. */
tm_rc tm_rec_parser_line(tm_rec_parser *ps, const char *file, uint64_t line_no, const char *s,
                         size_t n, tm_job **out, tm_err *err);
/* A line_too_long error record for a line of n_bytes bytes, with the next seq_no. TM_E_NOMEM. */
tm_rc tm_rec_parser_too_long(tm_rec_parser *ps, const char *file, uint64_t line_no,
                             uint64_t n_bytes, tm_job **out, tm_err *err);
/* limits.max_line_bytes of the job. */
uint64_t tm_rec_parser_max_line_bytes(const tm_rec_parser *ps);
/* Check ids for duplicates (default on). Off for Kafka, where a redelivered message is normal. */
void tm_rec_parser_set_check_ids(tm_rec_parser *ps, bool on);
/* Forget the format guess for unparsable lines (a new file or partition starts). */
void tm_rec_parser_reset_format(tm_rec_parser *ps);
/* Give seq_no, the last one handed out, to the next record instead (tm_source_wait's drop). */
void tm_rec_parser_take_back(tm_rec_parser *ps, uint64_t seq_no);
/* Records numbered so far, less those taken back (= the next seq_no). */
uint64_t tm_rec_parser_n_records(const tm_rec_parser *ps);

#endif /* TM_INGEST_REC_PARSER_INT_H */
