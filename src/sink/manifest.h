/* sink/manifest.h - the job's manifest (output.dir/manifest.json, schemas/manifest.schema.json):
 * what job made the output folder (spec hash, model and tokenizer fingerprints, input files), how
 * many bytes of each output file are committed, which input records are done (a watermark plus
 * the done seq_nos above it) and the cumulative counts for metrics.json. It is the single source
 * of truth for resume: bytes past a committed length are garbage from a crash and are cut off;
 * records not in the done set are run again.
 *
 * Commit protocol (cmd/job_run.c drives it; the sink thread commits every output.commit_every_s or
 * commit_every_records): (1) close the LZ4 frame and write out both data files, (2) fsync them,
 * (3) write manifest.json.tmp, fsync it, (4) rename it over manifest.json, (5) fsync the folder.
 * A crash before (4) leaves the old manifest, which names only older, fsynced bytes; after (4) the
 * new one, whose bytes were fsynced in (2). Fault points (base/fault_io.h):
 * after_write_before_fsync (sink.c, between 1 and 2), after_fsync_before_rename (between 3 and 4),
 * after_rename_before_dirsync (between 4 and 5), after_commit. A failed fsync is never retried: the
 * job stops and the next run starts from the last manifest.
 *
 * One process per output folder: tm_manifest_lock takes an flock(2) on the output folder itself
 * and one on output.dir/tokenmill.lock for the life of the process (the kernel drops them when the
 * process dies, also on kill -9). The folder's lock is what deleting tokenmill.lock cannot defeat;
 * the file's keeps out tokenmill versions that lock only the file, and marks the folder as one
 * tokenmill made. Every file of the folder is opened with tm_fs_open_out (base/fsutil.h): links,
 * FIFOs and other non-regular files are refused, never followed or waited on.
 * Not thread-safe: one owner at a time (the job thread, then the sink thread, then the job thread
 * again after joining it). */
#ifndef TM_SINK_MANIFEST_H
#define TM_SINK_MANIFEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "base/hash.h"
#include "base/record.h"
#include "base/seqset.h"

#define TM_MANIFEST_FILE "manifest.json"
#define TM_MANIFEST_LOCK_FILE "tokenmill.lock"
#define TM_MANIFEST_VERSION 1

/* A file the job depends on. Inputs and model files are compared on resume. */
typedef struct tm_manifest_file {
    char *name;       /* owned; input: resolved path; model file: name inside the model folder */
    int64_t size;     /* bytes; -1 when unknown (standard input) */
    int64_t mtime_ns; /* modification time, ns since the epoch; 0 when unknown */
    char xxh3[17];    /* xxh3-64 of the content in hex (config and tokenizer files); "" otherwise */
    /* Inputs (issue 35): what tells a replacement that kept size and mtime. 0 / "" when unknown
     * (standard input, or a manifest written before these fields) and then not compared. */
    uint64_t inode;   /* st_ino */
    int64_t ctime_ns; /* status change time, ns since the epoch: set by every write, rename,
                       * utime (touch -r, cp -p) or chmod, and by no user-settable call */
    char sample[17];  /* xxh3-64 in hex of the size and a sample of the content: the whole file
                       * up to TM_MANIFEST_SAMPLE_WHOLE bytes; else its first and last MiB and
                       * TM_MANIFEST_SAMPLE_N blocks of 64 KiB evenly spaced in between */
} tm_manifest_file;

#define TM_MANIFEST_SAMPLE_WHOLE (8u << 20)
#define TM_MANIFEST_SAMPLE_N 96

/* Totals over every run of the job, so metrics.json after a resume covers the whole job. */
typedef struct tm_manifest_counts {
    uint64_t n_ok, n_failed;
    uint64_t n_err_by_code[TM_ERRCODE_COUNT];
    uint64_t n_tok_prompt, n_tok_cached, n_tok_gen;
} tm_manifest_counts;

/* Kafka input: the done offsets of one partition (ingest/kafka_in.h). Records of a Kafka input
 * are numbered in consumption order, which changes from run to run, so for them the done set
 * (`done` below) covers the last run only and these offsets are the resume state. */
typedef struct tm_manifest_kpart {
    char *topic; /* owned */
    int32_t partition;
    uint64_t next;    /* every offset below it is done */
    uint64_t *ranges; /* [2 * n_ranges] owned; done offsets above next, inclusive [first, last]
                       * pairs, ascending, apart, not touching next */
    size_t n_ranges;
    /* One done record's fingerprint (JSON "check"; absent: fp_offset -1): its offset and its
     * Kafka timestamp. A later run reads that offset again and refuses a topic whose record
     * there differs (the topic was deleted and recreated under the same name). */
    int64_t fp_offset, fp_ts;
} tm_manifest_kpart;

/* Standard input's committed prefix (ingest/source.h's fingerprint) of a job that reads "-": a
 * resumed run's stream must start with these bytes (JSON "stdin"; absent for other jobs). */
typedef struct tm_manifest_stdin {
    bool set;           /* the job reads standard input */
    uint64_t n_bytes;   /* bytes of the stream read by this commit */
    uint64_t n_records; /* records numbered by then (over the whole job) */
    tm_h128 xxh3;       /* XXH3-128 of those bytes */
} tm_manifest_stdin;

typedef struct tm_manifest {
    char spec_hash[33]; /* xxh3-128 hex of the canonical job spec */
    char *job_path;     /* owned; informational (the job may move) */
    char *spec_json;    /* owned canonical job spec (what spec_hash hashes), or NULL (a manifest
                         * written before it was kept): messages say which fields changed */
    tm_manifest_file *model_files; /* [n_model_files] owned; sorted by name */
    size_t n_model_files;
    tm_manifest_file *inputs; /* [n_inputs] owned; in read order */
    size_t n_inputs;
    uint64_t bytes_completions; /* committed length of completions.jsonl.lz4 (or .jsonl) */
    bool completions_plain;     /* the completions file is plain completions.jsonl
                                 * (output.compression "none"), not completions.jsonl.lz4 */
    uint64_t bytes_errors;      /* committed length of errors.jsonl */
    tm_seqset done;             /* input records (seq_no) whose output is committed */
    uint64_t n_records;         /* records in the whole input; valid when total_known */
    bool total_known;           /* the source reached the end of the input */
    bool finished;              /* the job ended and every record is done */
    tm_manifest_counts counts;
    uint64_t n_commits;        /* commits over all runs */
    uint32_t n_runs;           /* runs that committed at least once (this one included) */
    char *kafka_topic;         /* owned; output.kafka.topic when the Kafka sink is on, or NULL */
    tm_manifest_kpart *kparts; /* [n_kparts] owned; input.kafka partitions (JSON input_kafka) */
    char *kafka_in_cluster;    /* owned; input.kafka's cluster id from the brokers' metadata
                                * (JSON input_kafka.cluster_id), or NULL */
    size_t n_kparts, cap_kparts;
    tm_manifest_stdin in_stdin; /* set for a job reading standard input */
} tm_manifest;

/* Free what m owns and zero it. */
void tm_manifest_fini(tm_manifest *m);

/* Set (add or replace) the done offsets of topic/partition in m; copies everything. TM_E_NOMEM. */
tm_rc tm_manifest_kpart_set(tm_manifest *m, const char *topic, int32_t partition, uint64_t next,
                            const uint64_t *ranges, size_t n_ranges, tm_err *err);
/* Set the fingerprint of topic/partition (added by tm_manifest_kpart_set before); no-op when
 * the partition is not there. */
void tm_manifest_kpart_set_fp(tm_manifest *m, const char *topic, int32_t partition,
                              int64_t fp_offset, int64_t fp_ts);

/* Fill the identity of m (spec hash, job path, model fingerprints, input files) from the job:
 * canonical_json (tm_job_spec.canonical_json), the model folder (config.json,
 * tokenizer.json and tokenizer_config.json are hashed, *.safetensors and their index are
 * listed with size and mtime) and the input paths ("-" is standard input: size -1). Borrows its
 * arguments. TM_E_IO (naming the file), TM_E_NOMEM. */
tm_rc tm_manifest_identify(tm_manifest *m, const char *canonical_json, const char *job_path,
                           const char *model_dir, char *const *inputs, size_t n_inputs,
                           tm_err *err);

/* Read dir/manifest.json into *m (zeroed first). *found is false (and m empty) when there is no
 * manifest. A manifest that is a symbolic link or not a regular file is TM_E_IO. TM_E_PARSE (not a
 * manifest this version understands: the message names the file and the field), TM_E_IO,
 * TM_E_NOMEM. */
tm_rc tm_manifest_load(const char *dir, tm_manifest *m, bool *found, tm_err *err);

/* Publish m as dir/manifest.json: steps 3-5 of the commit protocol (the data files must already
 * be fsynced). When it returns TM_OK the manifest survives a crash. TM_E_IO (naming the file),
 * TM_E_NOMEM; on error the old manifest is still in place (or the new one, if the failure was the
 * folder fsync; both only name fsynced bytes). */
tm_rc tm_manifest_save(const char *dir, const tm_manifest *m, tm_err *err);

/* Does the job described by cur (identity fields only) match the one that wrote old? true when
 * it does; otherwise false with a one-line reason in why ("the job spec changed", "input
 * data/a.jsonl changed (size 10 -> 12)", ...). */
bool tm_manifest_same_job(const tm_manifest *old, const tm_manifest *cur, char *why, size_t n);

/* Make dir's data files match m before a resume: cut completions.jsonl.lz4 and errors.jsonl to
 * their committed lengths (fsynced) and remove leftover *.tmp files. A data file shorter than its
 * committed length (or missing while its length is > 0) is damage tokenmill cannot repair:
 * TM_E_IO naming the file. *cut_bytes gets the bytes cut off (torn tails). */
tm_rc tm_manifest_recover(const char *dir, const tm_manifest *m, uint64_t *cut_bytes, tm_err *err);

/* Check a finished job's data files against m before anything is derived from them (issue 35):
 * each holds exactly its committed length; completions.jsonl.lz4 decodes to its end, every frame
 * whole and its content checksum right; a plain JSONL file ends with a newline. Reads the files
 * whole (at LZ4's decoding speed). TM_E_IO naming the file and what is wrong; TM_E_NOMEM. */
tm_rc tm_manifest_verify(const char *dir, const tm_manifest *m, tm_err *err);

/* The output folder's locks (tm_manifest_lock). */
typedef struct tm_manifest_lk {
    int dir_fd;   /* the output folder, flock'ed; -1 when not held */
    int file_fd;  /* dir/tokenmill.lock, flock'ed; -1 when not held */
    bool created; /* tokenmill.lock did not exist before: the folder was not tokenmill's */
} tm_manifest_lk;
#define TM_MANIFEST_LK_INIT                                                                        \
    { .dir_fd = -1, .file_fd = -1 }

/* Create dir (and parents) if missing, then lock the folder and dir/tokenmill.lock without
 * waiting. On success *lk holds both (release them with tm_manifest_unlock). A file system that
 * cannot flock a folder (NFS) keeps the file's lock only, with a warning. TM_E_AGAIN when another
 * process holds either (the message says so); TM_E_IO (tokenmill.lock a link or not a regular
 * file, named). */
tm_rc tm_manifest_lock(const char *dir, tm_manifest_lk *lk, tm_err *err);
void tm_manifest_unlock(tm_manifest_lk *lk); /* releases what lk holds; then lk holds nothing */
/* tm_manifest_unlock at a clean exit: first, while both locks are still held, removes
 * dir/tokenmill.lock when dir/manifest.json is there (which marks the folder as tokenmill's from
 * then on, as the lock file did before the first commit) and the folder itself was locked (on a
 * file system without folder locks the file stays: it is the only lock there). */
void tm_manifest_unlock_tidy(const char *dir, tm_manifest_lk *lk);

/* Check the names tokenmill writes in dir (manifest.json, completions.jsonl[.lz4], errors.jsonl,
 * metrics.json and their temporary files): each one that exists must be a regular file, not a
 * symbolic link, FIFO, folder or device (TM_E_IO naming it). With fresh (a run about to start with
 * no manifest and without --restart) such files must also be tokenmill's: when this run created
 * tokenmill.lock (lk->created), the folder was never tokenmill's and any of them is the user's,
 * which a fresh run would overwrite: TM_E_INVAL listing them; then the lock file this run created
 * is removed again, so that the next run refuses too. Opens nothing. */
tm_rc tm_manifest_check_folder(const char *dir, const tm_manifest_lk *lk, bool fresh, tm_err *err);

/* fsync the folder (EINVAL, folders that cannot be synced, is ignored). TM_E_IO. */
tm_rc tm_manifest_sync_dir(const char *dir, tm_err *err);

#endif /* TM_SINK_MANIFEST_H */
