/* sink/out.h - the table an output implements (tm_sink_out_ops): where the sink thread's writer
 * (sink/writer.h) sends finished records and what its commits make durable. Implemented by the
 * file sink (sink.c, tm_sink_as_out: completions.jsonl[.lz4] and errors.jsonl) and the Kafka
 * producer (kafka_out.c, tm_kafka_out_as_out). A new output is a file implementing the table and
 * one tm_sink_writer_add in cmd/job_run.c (ARCHITECTURE.md, "A new sink").
 *
 * Contract: write takes one record (the writer routes ok and error records, tm_sink_writer_add);
 * commit makes everything written so far durable (fsynced, or acknowledged by a broker) and
 * gives back what the manifest about to be published keeps of it (tm_sink_commit); only then is the
 * manifest published and the records acknowledged to the source, so resume and acks stay exact.
 * poll serves the output between records (delivery reports); close ends it. All run on the sink
 * thread (close and the last commit on the job's thread after it ended). */
#ifndef TM_SINK_OUT_H
#define TM_SINK_OUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "base/record.h"

struct tm_kafka_offset; /* sink/kafka_out.h */

/* What one commit hands every output, and what an output tells the manifest back. */
typedef struct tm_sink_commit {
    /* The input's positions travel inside the outputs' transaction (a Kafka input and a
     * transactional Kafka output): offs[0..n_offs) and the consumer's group metadata. */
    bool txn_offsets;
    const struct tm_kafka_offset *offs; /* borrowed for the call */
    size_t n_offs;
    const void *group_md; /* [n_md], borrowed for the call */
    size_t n_md;
    /* Out: the data files' durable lengths (the file sink sets them; the manifest keeps them). */
    bool files_set;
    uint64_t bytes_completions, bytes_errors;
} tm_sink_commit;

typedef struct tm_sink_out_ops {
    const char *name; /* "files", "kafka" */
    /* Write one finished record. Errors stop the job (what was committed stays valid). */
    tm_rc (*write)(void *self, const tm_completion *c, tm_err *err);
    /* Make everything written durable (see above). */
    tm_rc (*commit)(void *self, tm_sink_commit *ci, tm_err *err);
    /* Serve the output without blocking; NULL when it has nothing to serve. */
    tm_rc (*poll)(void *self, tm_err *err);
    /* Flush what it can and free self. */
    tm_rc (*close)(void *self, tm_err *err);
} tm_sink_out_ops;

/* One output: its table and its state (owned by whoever holds the tm_sink_out). */
typedef struct tm_sink_out {
    const tm_sink_out_ops *ops;
    void *self;
} tm_sink_out;

#endif /* TM_SINK_OUT_H */
