/* ingest/source_int.h - the table a kind of source implements (tm_source_ops) behind the
 * tm_source API (source.h). source.c owns what every kind shares: the record parser (numbering,
 * duplicate ids, unknown keys), the set of acknowledged seq_nos and the pick of a kind
 * (tm_source_kinds, source_kinds.c); a kind reads its input and hands out records through the
 * parser. Kinds: files and standard input (file_in.c), a Kafka topic (kafka_in.c, or
 * kafka_in_stub.c without librdkafka). A kind never calls source.c; what it needs of the shared
 * part comes in tm_source_env. Private to src/ingest.
 *
 * Every operation but name, claims, open, close and next is optional (NULL): a NULL capability
 * makes the tm_source call do nothing (source.h says what it returns then). Two capabilities:
 * input files (sizes at start, standard input's fingerprint; file_in.c) and partition offsets
 * (backpressure that keeps a consumer alive, the positions the manifest keeps, transactions;
 * kafka_in.c). */
#ifndef TM_INGEST_SOURCE_INT_H
#define TM_INGEST_SOURCE_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"
#include "base/err.h"
#include "base/record.h"
#include "base/seqset.h"
#include "ingest/job_spec.h"
#include "ingest/kpos.h"
#include "ingest/rec_parser_int.h"
#include "ingest/source.h"

/* What the shared part lends a kind at open; everything borrowed, valid until close. */
typedef struct tm_source_env {
    tm_rec_parser *parser; /* numbers and parses the records; the source thread's */
    /* Acknowledge records the kind drops itself because an earlier run committed them (a resumed
     * standard input prefix): as tm_source_ack. */
    tm_rc (*ack)(void *ctx, const uint64_t *seq_nos, size_t n, tm_err *err);
    void *ack_ctx;
} tm_source_env;

typedef struct tm_source_ops {
    const char *name; /* "files", "kafka" */
    /* Whether this kind reads spec's input (tm_source_kinds is asked in order). */
    bool (*claims)(const tm_job_spec *spec);
    /* Open over spec (borrowed) and env (copied; what it points to is borrowed). *self owns the
     * kind's state (free with close, NULL on failure). Errors as tm_source_open. */
    tm_rc (*open)(const tm_job_spec *spec, const tm_source_env *env, void **self, tm_err *err);
    void (*close)(void *self);                            /* NULL is a no-op */
    tm_rc (*next)(void *self, tm_job **out, tm_err *err); /* as tm_source_next */
    /* The records are durable (after the shared set took them). Thread-safe. */
    tm_rc (*ack)(void *self, const uint64_t *seq_nos, size_t n, tm_err *err);
    bool live; /* tm_source_is_live */

    // Input files capability (source.h): each as the tm_source call of the same name.
    tm_rc (*set_input_sizes)(void *self, const int64_t *sizes, size_t n, tm_err *err);
    void (*stdin_fingerprint)(void *self, tm_source_stdin_fp *out);
    void (*stdin_resume)(void *self, const tm_seqset *skip, const tm_source_stdin_fp *fp);
    tm_rc (*stdin_check)(void *self, tm_err *err);
    uint64_t (*n_skipped)(const void *self);
    size_t (*line_cap)(const void *self);

    // Partition offsets capability (source.h): each as the tm_source call of the same name;
    // wait's held_seq is the held record's seq_no (source.c takes its number back on a drop).
    tm_rc (*wait)(void *self, uint64_t held_seq, int ms, bool *drop, tm_err *err);
    tm_rc (*mark_written)(void *self, const uint64_t *seq_nos, size_t n, tm_err *err);
    tm_rc (*positions)(void *self, tm_source_kpos_fn fn, void *ctx, tm_err *err);
    tm_rc (*resume_positions)(void *self, const tm_source_kpos *pos, tm_err *err);
    void (*set_txn)(void *self, bool on);
    tm_rc (*group_md)(void *self, tm_buf *out, tm_err *err);
    tm_rc (*check_resume)(void *self, const char *cluster_before, tm_err *err);
    tm_rc (*linger)(void *self, int ms, tm_err *err);
    size_t (*kafka_lag)(void *self, tm_source_klag *out, size_t cap);
    void (*kafka_skips)(void *self, tm_source_kskips *out);
    const char *(*cluster_id)(const void *self);
    void (*set_release)(void *self, bool on);
    bool (*start)(void *self, uint64_t seq_no);
} tm_source_ops;

/* The kinds: files and standard input, a Kafka topic. */
extern const tm_source_ops tm_file_in_ops;
extern const tm_source_ops tm_kafka_in_ops;
/* The kinds tm_source_open asks in order (the first that claims the spec reads it); NULL-ended. */
extern const tm_source_ops *const tm_source_kinds[];

#endif /* TM_INGEST_SOURCE_INT_H */
