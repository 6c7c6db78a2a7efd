/* ingest/shard.h - one job split over N shards (input.shard, `tokenmill run --shard K/N`): which
 * shard answers an input record, decided from the record alone, and where a shard's index and
 * count come from (the command line, the job file, the scheduler's environment). Every shard
 * reads and parses every input line (so duplicate ids and malformed lines are judged exactly as
 * the unsharded job judges them) and keeps the records whose shard is its own; a record's shard is
 * a hash of its key modulo N, so each record lands on exactly one shard on any host, whatever the
 * timing. docs/sharding.md compares this partition with byte ranges and ids.
 *
 * Keys (tm_shard_by):
 *   prefix (default): the record's leading text, so records that share a prompt prefix (a system
 *     prompt) land on one shard and its prefix cache: a prompt's first prefix_bytes bytes; chat
 *     messages: every message but the last (role and content; the conversation's context), cut
 *     to prefix_bytes, or the first prefix_bytes of a single message.
 *   id: the record's id (its JSON text).
 * An error record (a malformed line, a duplicate id, ...) and a record without the text its key
 * needs are keyed by its position: the input file's base name and the line number. Plain data;
 * thread-safe. */
#ifndef TM_INGEST_SHARD_H
#define TM_INGEST_SHARD_H

#include <stdbool.h>
#include <stdint.h>

#include "base/err.h"
#include "base/record.h"

#define TM_SHARD_DEFAULT_PREFIX_BYTES 256
#define TM_SHARD_MAX_COUNT 100000

typedef enum tm_shard_by {
    TM_SHARD_BY_PREFIX = 0, /* "prefix" */
    TM_SHARD_BY_ID,         /* "id" */
} tm_shard_by;

/* input.shard of a job. */
typedef struct tm_job_shard {
    bool on;               /* the job is sharded (input.shard given or --shard) */
    bool active;           /* index and count resolved (tm_shard_resolve): the source keeps only
                            * this shard's records; false: every record is read (merge) */
    int64_t index;         /* 0-based shard of this process; -1 until known */
    int64_t count;         /* shards, >= 1; 0 until known */
    tm_shard_by by;        /* input.shard.by */
    uint32_t prefix_bytes; /* input.shard.prefix_bytes, >= 1 */
} tm_job_shard;

/* The stable name of a partition ("prefix", "id"). */
const char *tm_shard_by_name(tm_shard_by by);

/* The shard (0 .. sh->count - 1) that answers job (borrowed); sh->count must be >= 1. */
uint32_t tm_shard_of(const tm_job *job, const tm_job_shard *sh);

/* Parse a --shard argument: "K/N" (0 <= K < N), "auto/N" (the index from the environment, the
 * count N) or "auto" (both from the environment). *index / *count get -1 / 0 for "auto".
 * TM_E_INVAL with a message naming the text. */
tm_rc tm_shard_parse_arg(const char *arg, int64_t *index, int64_t *count, tm_err *err);

/* Fill in what sh lacks from the scheduler's environment (read through getenv_fn; NULL means
 * getenv(3), tests pass their own), check what is given against it, and mark sh active.
 * Precedence: the command line (cli_index / cli_count, -1 / 0 when not given) over the job file
 * (sh->index / sh->count as loaded, -1 / 0 when absent) over the environment. The environment:
 * Slurm job arrays (SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN is the index,
 * SLURM_ARRAY_TASK_COUNT the count; a SLURM_ARRAY_TASK_STEP other than 1 is refused), else
 * Kubernetes Indexed Jobs (JOB_COMPLETION_INDEX is the index; the count must be given once). The
 * environment is read only for a sharded job (input.shard or --shard): an array task that does
 * not ask for a shard runs the whole job. Errors (TM_E_INVAL, naming the variables): a given
 * value the environment contradicts (index or count), Slurm and Kubernetes disagreeing, an index
 * or count nowhere to be found, an index >= count, a variable that is not a number. */
tm_rc tm_shard_resolve(tm_job_shard *sh, int64_t cli_index, int64_t cli_count,
                       const char *(*getenv_fn)(const char *name), tm_err *err);

#endif /* TM_INGEST_SHARD_H */
