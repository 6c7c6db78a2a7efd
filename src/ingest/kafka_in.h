/* ingest/kafka_in.h - the Kafka source (input.kafka): a consumer-group member whose messages are
 * record lines. kafka_in.c implements the source table over these calls (tm_kafka_in_ops,
 * source_int.h: the tm_source calls of source.h reach them through it); nothing else calls them,
 * and kafka_in.c calls nothing of source.c (it borrows the source's record parser,
 * rec_parser_int.h). The only ingest file that includes
 * librdkafka.
 *
 * Records: one message value = one line (tm_rec_parser_line; blank values give no record, a
 * leading UTF-8 BOM is dropped, a value over limits.max_line_bytes is a line_too_long error
 * record). seq_no in consumption order; file "kafka:TOPIC/PARTITION", line offset + 1;
 * src_meta_json = {"topic", "partition", "offset", "timestamp" (ms, when the broker gives one),
 * "key": text or null, "headers": [{"name", "value": text or null}]}; a key or header value that is
 * not UTF-8 is given as {"base64": "..."} instead of text. Duplicate ids are not checked
 * (redelivery is normal in Kafka).
 *
 * Positions. Per partition the source keeps (a) the done set, the manifest's view: offsets whose
 * record was written in a commit being made durable (tm_kafka_in_mark_written) or acknowledged,
 * plus offsets that hold no record or were handled before this consumer got the partition;
 * earlier runs' done sets come in through tm_kafka_in_resume_add, and a message whose offset is
 * done (or was already handed out in this run) is skipped; (b) the records handed out and not
 * yet acknowledged, in offset order: the committable offset is the first of them (or the
 * position when there is none), so a group offset never passes a record that is not durable.
 *
 * Commits: without transactions the consumer thread commits (asynchronously, at most every
 * 200 ms, synchronously on revoke and close) the committable offsets of the partitions it owns.
 * A synchronous commit waits for the broker's answer at most TM_KAFKA_IN_COMMIT_WAIT_MS (a quarter
 * of session.timeout.ms when that is less), never without limit (issue 24); one not answered in
 * time is retried by the next commit, and its outcome is unknown: it may be applied late or never.
 * Either way the group's offset never passes a record that is not durable, and a group offset
 * that lags behind only makes the next run read records again that the manifest's done set
 * skips (exactly once within an output folder; another folder may answer them again, as after a
 * refused revoke commit).
 * With tm_kafka_in_set_txn the consumer never commits: job_run hands the positions and the group
 * metadata to the transactional producer (send_offsets_to_transaction).
 *
 * Rebalance (eager or cooperative, whichever the assignor asks for): on revoke the consumer waits
 * up to TM_KAFKA_IN_REVOKE_WAIT_MS (at most half of session.timeout.ms) for the handed-out records
 * of the revoked partitions to become durable, commits them and gives the partitions up. Records
 * still in flight after that are finished and written by this run, but their offsets are not
 * committed by it: the new owner reads them again (at-least-once across output folders; exactly
 * once within one folder, since the manifest lists them). Lost partitions (session timeout) are
 * given up without a commit. The one record the source thread holds while it waits to push it
 * (tm_kafka_in_wait) is not waited for: if its partition is revoked or lost during the wait it is
 * dropped instead (tm_kafka_in_wait says so; never pushed, done, acknowledged or committed here),
 * so only its new owner answers it. Messages read ahead (paused) for given-up partitions are
 * discarded; should a partition come back, reading restarts at its committed offset.
 * With tm_kafka_in_set_release, records of the revoked (or lost) partitions handed out and not
 * started by the runner yet (queued for it: tm_kafka_in_start) are released first: not waited
 * for, never answered, done or committed here (the revoke commit stops before the first of them),
 * logged with their offsets; should the partition come back, they are read again and the records
 * of it that had started are not handed out twice. Not while lingering (the runner's input is
 * closed: those records are finished here as before).
 *
 * Backpressure: tm_kafka_in_wait pauses every assigned partition and keeps serving the consumer
 * (heartbeats, rebalances) while the runner's queue is full; the next tm_kafka_in_next resumes
 * them (fetching restarts at the next unread offset, so nothing is lost or repeated).
 *
 * Threading: tm_kafka_in_next/_wait/_close and the rebalance callback run on the source thread;
 * _ack, _mark_written, _positions and _group_md may come from any thread (a mutex). */
#ifndef TM_INGEST_KAFKA_IN_H
#define TM_INGEST_KAFKA_IN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"
#include "base/err.h"
#include "base/record.h"
#include "ingest/job_spec.h"
#include "ingest/rec_parser_int.h"
#include "ingest/kpos.h"

#define TM_KAFKA_IN_REVOKE_WAIT_MS 10000
#define TM_KAFKA_IN_COMMIT_WAIT_MS                                                                 \
    5000                                /* a synchronous commit (at most session.timeout.ms / 4)   \
                                         */
#define TM_KAFKA_IN_CLOSE_WAIT_MS 10000 /* tm_kafka_in_close (at most session.timeout.ms / 2) */

typedef struct tm_kafka_in tm_kafka_in;

/* Create the consumer and subscribe (drain mode: read the high watermarks first). Borrows cfg and
 * parser (the tm_source's: records are numbered and parsed with it); both must outlive it.
 * Installs the SIGINT/SIGTERM stop handler (base/stop.h). TM_E_KAFKA (bad setting, no cluster,
 * unknown topic metadata), TM_E_NOMEM. */
tm_rc tm_kafka_in_open(const tm_job_kafka_in *cfg, tm_rec_parser *parser, tm_kafka_in **out,
                       tm_err *err);
/* Commit the durable offsets (without transactions), leave the group and free. NULL: no-op.
 * Bounded: the commit and the leave together wait at most TM_KAFKA_IN_CLOSE_WAIT_MS (half of
 * session.timeout.ms when that is less); past it the consumer is given up without leaving the
 * group (logged; librdkafka's threads end by themselves, and the process's exit waits for them,
 * at most 10 s), and the group drops the member when its session times out. */
void tm_kafka_in_close(tm_kafka_in *ki);

/* Positions of an earlier run (the manifest): offsets < next and those in the inclusive
 * [first, last] pairs ranges[0..2 * n_ranges) are done and are skipped. Call before the first
 * tm_kafka_in_next. TM_E_NOMEM. */
tm_rc tm_kafka_in_resume_add(tm_kafka_in *ki, const char *topic, int32_t partition, int64_t next,
                             const uint64_t *ranges, size_t n_ranges, tm_err *err);
/* The fingerprint an earlier run kept of topic/partition (tm_source_kpos.fp_offset, fp_ts), after
 * tm_kafka_in_resume_add; checked by tm_kafka_in_check_resume and carried on. TM_E_NOMEM. */
tm_rc tm_kafka_in_resume_fp(tm_kafka_in *ki, const char *topic, int32_t partition, int64_t offset,
                            int64_t ts, tm_err *err);
/* The identity check of a resumed job (tm_source_check_resume), after the resume positions and
 * before the first tm_kafka_in_next: the cluster id, every resumed partition's presence and high
 * watermark, and each fingerprint's record, read again with a short-lived consumer that joins no
 * group. TM_E_INVAL naming the topic and what changed; TM_E_KAFKA (brokers not answering within
 * input.kafka.startup_timeout_s). */
tm_rc tm_kafka_in_check_resume(tm_kafka_in *ki, const char *cluster_before, tm_err *err);
/* After TM_E_EOF (drain mode at the high watermarks, or a stop signal), until the job's outputs
 * are final: pause every assigned partition (and any assigned later: this consumer reads no
 * more), poll for about ms (heartbeats, rebalances: a revoke waits for the revoked partitions'
 * records in flight as ever, then commits and hands them over) and commit the durable offsets
 * every 200 ms. A message fetched before the pause is dropped, not read (the partition's next
 * reader gets it). A partition assigned while lingering is never committed by this consumer.
 * ms 0 (once the job's last commit is made, on the job's thread after the source thread ended):
 * commit the durable offsets now and wait for the answer (bounded as on revoke). TM_E_KAFKA on a
 * fatal consumer error. */
tm_rc tm_kafka_in_linger(tm_kafka_in *ki, int ms, tm_err *err);
/* Figures of the assigned partitions (tm_source_kafka_lag; high watermarks as librdkafka last
 * fetched them, no broker round trip). Thread-safe. */
size_t tm_kafka_in_lag(tm_kafka_in *ki, tm_source_klag *out, size_t cap);
/* Messages that made no record (tm_source_kafka_skips). Thread-safe. */
void tm_kafka_in_skips(tm_kafka_in *ki, tm_source_kskips *out);
/* The cluster id from the brokers' metadata at open; NULL when they gave none. */
const char *tm_kafka_in_cluster_id(const tm_kafka_in *ki);
/* Offsets travel in the Kafka sink's transactions: the consumer commits nothing itself. */
void tm_kafka_in_set_txn(tm_kafka_in *ki, bool on);
/* Release on revoke (see Rebalance): the runner calls tm_kafka_in_start before it starts each
 * record, so a revoke may take back the records of the revoked partitions not started yet. Set
 * before the first tm_kafka_in_next; off by default (every record handed out is finished). */
void tm_kafka_in_set_release(tm_kafka_in *ki, bool on);
/* The runner starts record seq_no (admits it, or answers it with an error record): true, and a
 * revoke can no longer release it; false: a revoke released it (its partition's next owner
 * answers it): the runner must not answer it, and acknowledges its seq_no like any other once its
 * (empty) completion is committed. Thread-safe (the runner's thread). */
bool tm_kafka_in_start(tm_kafka_in *ki, uint64_t seq_no);

/* Next record (see tm_source_next). Blocks while nothing arrives. TM_E_EOF in drain mode once
 * every assigned partition reached its start high watermark (and at least one assignment came),
 * and in both modes after SIGINT/SIGTERM. TM_E_KAFKA on a fatal consumer error. */
tm_rc tm_kafka_in_next(tm_kafka_in *ki, tm_job **out, tm_err *err);
/* Backpressure: the source thread holds held_seq, the last record tm_kafka_in_next returned, and
 * waits to push it. Pause the assignment and serve the consumer (rebalances included) for up to
 * ms. *drop is set when held_seq's partition was revoked or lost meanwhile: the record has been
 * taken back (its ring entry removed, its offset neither done nor committed; a later delivery of
 * the offset is handed out again) and must not be pushed; the caller gives its seq_no to the next
 * record (source.c). TM_E_KAFKA (fatal; *drop is still valid). */
tm_rc tm_kafka_in_wait(tm_kafka_in *ki, uint64_t held_seq, int ms, bool *drop, tm_err *err);

/* The records seq_nos[0..n) are in the commit now being made durable (the manifest about to be
 * published lists them). Unknown seq_nos are ignored. TM_E_NOMEM. */
tm_rc tm_kafka_in_mark_written(tm_kafka_in *ki, const uint64_t *seq_nos, size_t n, tm_err *err);
/* The records are durable: their offsets may be committed. TM_E_NOMEM. */
tm_rc tm_kafka_in_ack(tm_kafka_in *ki, const uint64_t *seq_nos, size_t n, tm_err *err);
/* Call fn once per partition seen in this run or resumed, with its done set (see source.h). */
tm_rc tm_kafka_in_positions(tm_kafka_in *ki, tm_source_kpos_fn fn, void *ctx, tm_err *err);
/* The consumer's group metadata, serialized (rd_kafka_consumer_group_metadata_write), into out
 * (replaced). TM_E_KAFKA, TM_E_NOMEM. */
tm_rc tm_kafka_in_group_md(tm_kafka_in *ki, tm_buf *out, tm_err *err);

#endif /* TM_INGEST_KAFKA_IN_H */
