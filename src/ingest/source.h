/* ingest/source.h - streaming reader of a job's JSONL inputs (schemas/record.schema.json is the
 * record contract). Files are read in the spec's order, one at a time, line by line with bounded
 * memory: a 64 KiB read buffer plus one line of at most limits.max_line_bytes. Formats by file
 * name: "*.lz4" is a stream of LZ4 frames (decoded incrementally, any number of frames), "*.gz"
 * is gzip (zlib inflate; concatenated members are fine, anything after the last member is an
 * error), anything else is plain text. A compressed file is checked by its bytes, not trusted by
 * its name: a "*.gz" that does not start with the gzip magic (1f 8b) or a "*.lz4" that is not an
 * LZ4 frame is an error naming the file, never read as text. Standard input ("-") is plain text.
 * The kind of source is picked by the job's input: files and standard input (file_in.c) or a
 * Kafka topic (kafka_in.c); source_int.h is the table a kind implements.
 *
 * Inputs that change while the job runs: after tm_source_set_input_sizes, a regular file is read
 * up to the size it had when the job started (the size the manifest records); bytes appended
 * later are not read (a line being written at that moment is read as far as it had been written),
 * and a file that shrinks below that size is an error. A file rewritten in place with the same
 * size cannot be told apart here; the manifest's mtime catches it on the next run.
 *
 * Standard input on resume: the source fingerprints the stdin bytes of the lines it has returned
 * (length, records, XXH3-128; tm_source_stdin_fingerprint, kept in the manifest). On a resumed
 * run (tm_source_stdin_resume) it first reads that many bytes of the new stream, holding back the
 * records there that the earlier run did not commit, and only if the stream starts with exactly
 * those bytes (and the line there ends where it ended) does it return anything; otherwise
 * tm_source_next fails with TM_E_INVAL before returning any record of the stream.
 *
 * Lines: "\n" ends a line and a "\r" before it is dropped (CRLF files work); the last line may
 * lack its "\n"; lines holding only spaces/tabs are skipped (they get no seq_no); a UTF-8 byte
 * order mark is skipped at the start of a file only. Every other line yields exactly one tm_job,
 * in input order with seq_no 0, 1, 2, ...: a valid record, or an error record (err_code set) for a
 * line that is too long, not JSON, not UTF-8, or breaks the record schema. Unknown record fields
 * are ignored (users carry metadata through). Ids must be unique across the whole job: a later
 * record whose id was already seen (valid or not) is a duplicate_id error; the first one wins.
 *
 * Memory: the id set keeps a 128-bit hash per distinct id (about 32 bytes per record); everything
 * else is bounded (the records held back while a resumed stdin prefix is checked are the ones the
 * earlier run had in flight at its last commit). One thread at a time (the source thread), except
 * where a function says it is thread-safe. */
#ifndef TM_INGEST_SOURCE_H
#define TM_INGEST_SOURCE_H

#include <stdbool.h>
#include <stdint.h>

#include "base/buf.h"

#include "base/err.h"
#include "base/hash.h"
#include "base/record.h"
#include "base/seqset.h"
#include "ingest/job_spec.h"
#include "ingest/kpos.h"

typedef struct tm_source tm_source;

/* Open a source over spec->inputs, or over spec->kafka_in (ingest/kafka_in.h: the consumer joins
 * its group here; errors then also TM_E_KAFKA). Borrows spec; it must outlive the source. Files are
 * opened lazily by tm_source_next. On success *out owns the source (free with tm_source_destroy).
 * Errors: TM_E_NOMEM. */
tm_rc tm_source_open(const tm_job_spec *spec, tm_source **out, tm_err *err);
void tm_source_destroy(tm_source *src); /* NULL is a no-op; closes the open file */

/* Next record. TM_OK: *out owns a new tm_job (free with tm_job_destroy) that is either a valid
 * record or an error record (err_code != TM_ERRCODE_NONE). TM_E_EOF after the last record of the
 * last file. A bad line is never an error return. Error returns (the source cannot go on; the
 * message names the file): TM_E_IO (open/read failed, a file shrank), TM_E_PARSE (corrupt or
 * truncated .lz4 or .gz stream, or a file whose name says .gz or .lz4 but whose bytes are not),
 * TM_E_INVAL (standard input does not start with the fingerprinted prefix of
 * tm_source_stdin_resume), TM_E_NOMEM. TM_E_AGAIN: a stop was requested (base/stop.h) while
 * standard input had no data; the source is done (the next run reads the stream again). Lines of
 * a corrupt LZ4 or gzip stream before the point of corruption may already have been returned. */
tm_rc tm_source_next(tm_source *src, tm_job **out, tm_err *err);

/* Read input i (spec->inputs order) only up to sizes[i] bytes, the size it had when the job
 * started; sizes[i] < 0 (standard input, unknown) reads to the end. Applies to regular files only.
 * Call before the first tm_source_next; copies sizes. TM_E_NOMEM. */
tm_rc tm_source_set_input_sizes(tm_source *src, const int64_t *sizes, size_t n, tm_err *err);

/* The committed-prefix fingerprint of standard input: the first n_bytes bytes of the stream
 * (every line the source returned, blank ones included, with their "\n"), which held n_records
 * records (seq_nos below it, counted over the whole job), and their XXH3-128. */
typedef struct tm_source_stdin_fp {
    uint64_t n_bytes;
    uint64_t n_records;
    tm_h128 xxh3;
} tm_source_stdin_fp;
/* The fingerprint now; at a commit it covers every record the commit made durable. Before
 * standard input is reached (or, on a resumed run, until its prefix was checked) it is the one
 * tm_source_stdin_resume gave (zero bytes otherwise). Thread-safe. */
void tm_source_stdin_fingerprint(tm_source *src, tm_source_stdin_fp *out);
/* Resume: the stream must start with fp's bytes; the records there whose seq_no is in skip
 * (borrowed; must outlive the source) are acked and dropped, the others returned once the prefix
 * checked out. Call before the first tm_source_next. */
void tm_source_stdin_resume(tm_source *src, const tm_seqset *skip, const tm_source_stdin_fp *fp);
/* When standard input is the first input and a prefix is to be checked, read and check it now
 * (so a wrong stream is refused before anything runs); otherwise nothing. Errors as
 * tm_source_next. */
tm_rc tm_source_stdin_check(tm_source *src, tm_err *err);
/* Records tm_source_stdin_resume's skip set made the source drop (acked, never returned). */
uint64_t tm_source_n_skipped(const tm_source *src);

/* Durability acknowledgements, sink -> source (ARCHITECTURE.md's ack path). After a commit is
 * durable (sink/manifest.h: data fsynced and the manifest published, or the Kafka sink's broker
 * acks), the job calls tm_source_ack with the seq_nos that commit made durable, in any order, each
 * once; records skipped on resume because an earlier run committed them are acked too, as the job
 * skips them. Only acknowledged records may be given up by the source: a Kafka source commits a
 * partition's offset only up to its first record that is not acked yet (offset + 1 of the last
 * acked record of the contiguous run), so a crash replays exactly the records that were not
 * durable, and the manifest wins where it and the group's offsets disagree. The file source just
 * keeps the set (watermark + the few acked seq_nos above it). Thread-safe: any thread, also while
 * another thread is in tm_source_next. TM_E_NOMEM. */
tm_rc tm_source_ack(tm_source *src, const uint64_t *seq_nos, size_t n, tm_err *err);
/* Every seq_no below the returned value has been acked. Thread-safe. */
uint64_t tm_source_durable_watermark(tm_source *src);

/* Partition offsets (a Kafka input; source_int.h's offsets capability): the rest of this block
 * does nothing for a source without them (files, standard input). Such a source numbers its
 * records in consumption order, so a resume skips by partition offsets, not by seq_no, and the
 * input has no end known in advance. */
/* A live source (a consumer, which must keep being served: Kafka) waits with tm_source_wait while
 * the next stage is full and ends by itself at a stop signal (base/stop.h); a finite one (files,
 * standard input) does neither: the caller blocks on the full stage and stops reading itself. */
bool tm_source_is_live(const tm_source *src);
/* Backpressure while the next stage is full: the caller holds held (borrowed), the last record
 * tm_source_next returned, and waits to push it. Kafka: pause the partitions and keep the
 * consumer alive (heartbeats, rebalances) for up to ms; files: return at once. *drop is set when
 * the held record's partition was revoked or lost during the wait (kafka_in.h, Rebalance): the
 * source has taken the record back, and the caller must destroy it without pushing it and not
 * count it as read. The partition's new owner answers it; here it is never done, acknowledged or
 * committed, and its seq_no goes to the next record (seq_nos stay dense, so acknowledgement and
 * done sets keep their watermarks moving). TM_E_KAFKA (*drop is valid even then). */
tm_rc tm_source_wait(tm_source *src, const tm_job *held, int ms, bool *drop, tm_err *err);
/* The records are in the commit being prepared (before its manifest is published); see
 * tm_kafka_in_mark_written. Thread-safe. TM_E_NOMEM. */
tm_rc tm_source_mark_written(tm_source *src, const uint64_t *seq_nos, size_t n, tm_err *err);
/* Per-partition done offsets, for the manifest and for a transaction's offsets. Thread-safe. */
tm_rc tm_source_positions(tm_source *src, tm_source_kpos_fn fn, void *ctx, tm_err *err);
/* Done offsets of an earlier run (from the manifest), before the first tm_source_next. */
tm_rc tm_source_resume_positions(tm_source *src, const tm_source_kpos *pos, tm_err *err);
/* After the resume positions: refuse offsets that no longer mean the records they meant when
 * they were recorded (the identity check of a resumed Kafka job): cluster_before (the manifest's
 * cluster id, or NULL) differs from the brokers' cluster id; a partition with done offsets is gone
 * (the partition count shrank) or its high watermark is below them; or the record a partition's
 * fingerprint names has another timestamp now (the topic was deleted and recreated). TM_E_INVAL
 * naming the topic and what changed; TM_E_KAFKA. A no-op for other sources. */
tm_rc tm_source_check_resume(tm_source *src, const char *cluster_before, tm_err *err);
/* After tm_source_next said TM_E_EOF, while the records in flight are finished: keep the
 * source's side of the input alive for about ms (Kafka: the consumer stays in its group, paused:
 * it polls, commits offsets as records become durable and takes part in rebalances). Called on
 * the source thread until the job's outputs are final; ms 0 once more after the job's last commit
 * (Kafka: commit its offsets now, waiting for the broker). TM_E_EOF: nothing to keep alive (files);
 * TM_E_KAFKA on a fatal consumer error. */
tm_rc tm_source_linger(tm_source *src, int ms, tm_err *err);
/* Up to cap assigned partitions' figures into out (tm_source_klag); the number of partitions
 * assigned (may exceed cap). 0 for other sources. Thread-safe. */
size_t tm_source_kafka_lag(tm_source *src, tm_source_klag *out, size_t cap);
/* Messages that made no record so far (zeros for other sources). Thread-safe. */
void tm_source_kafka_skips(tm_source *src, tm_source_kskips *out);
/* The Kafka cluster's id as the brokers gave it at open, or NULL (unknown, another source). */
const char *tm_source_cluster_id(const tm_source *src);
/* Offsets are committed inside the Kafka sink's transactions, not by the consumer. */
void tm_source_set_txn(tm_source *src, bool on);
/* Records queued for the runner and not started yet may be released by the source (Kafka: those
 * of partitions revoked in a rebalance, which their next owner answers; kafka_in.h): the runner
 * then asks tm_source_start before it starts each record. Call before the first tm_source_next;
 * a no-op for a source that never releases records (files, standard input). */
void tm_source_set_release(tm_source *src, bool on);
/* Before the runner starts record seq_no (admits it, or answers it with an error record): true,
 * run it (the source can no longer release it); false: the source released it: do not answer it,
 * only acknowledge its seq_no (an empty completion through the sink keeps seq_nos dense). Always
 * true without tm_source_set_release. Thread-safe. */
bool tm_source_start(tm_source *src, uint64_t seq_no);
/* The consumer group's metadata, serialized, for send_offsets_to_transaction. Thread-safe.
 * TM_E_INVAL for a source without a consumer group, TM_E_KAFKA, TM_E_NOMEM. */
tm_rc tm_source_group_md(tm_source *src, tm_buf *out, tm_err *err);

/* Records returned so far, less those taken back by tm_source_wait (= the next seq_no). */
uint64_t tm_source_n_records(const tm_source *src);
/* Capacity in bytes of the line buffer (tests check the memory bound); 0 without files. */
size_t tm_source_line_cap(const tm_source *src);

#endif /* TM_INGEST_SOURCE_H */
