/* cmd/job_run.h - a whole job: spec, model, tokenizer, engine, and the three stages (source thread,
 * runner on the calling thread, sink thread) joined by bounded queues. Used by cmd/main.c. */
#ifndef TM_CMD_JOB_RUN_H
#define TM_CMD_JOB_RUN_H

#include <stdbool.h>
#include <stdint.h>

#include "base/err.h"

/* Run the job file at path to completion; logs what it does and prints a summary. Errors are
 * logged here (the job is named); the return code says whether the job succeeded. */
tm_rc tm_job_run(const char *path);
/* What a run (or validate) found, for the exit status (cmd/main.c): the records of the whole job
 * (earlier runs included) that ended ok / in an error record (validate: would). */
typedef struct tm_job_run_result {
    uint64_t n_ok, n_failed;
    bool fail_on_error; /* the job sets limits.fail_on_error_records */
} tm_job_run_result;

/* The name a job built in memory (tm_job_run_opts.spec_json) goes by in messages and metrics. */
#define TM_JOB_CLI_NAME "(command-line job)"

/* A sharded job's shard folder holds this file: its index and count, the canonical spec and the
 * folder its relative paths resolve against (read by `tokenmill merge`, cmd/merge.h). */
#define TM_SHARD_FILE "shard.json"

/* Options of tm_job_run_with; all-zero is tm_job_run's behaviour. */
typedef struct tm_job_run_opts {
    int restart; /* discard the output folder's manifest and outputs, even of another job */
    const struct tm_tp_launch *tp; /* tensor-parallel launch options (cmd/tp_run.h), borrowed for
                                      the call; NULL: one node, defaults */
    const char *spec_json;         /* the job as JSON text (one-command mode; relative paths against
                                    * the current folder) instead of the file at path; borrowed */
    const char *restart_cmd;       /* the shell command that starts this job over (a one-command
                                    * job: its own command line plus --restart), for messages;
                                    * NULL: `tokenmill run --restart PATH`; borrowed */
    tm_job_run_result *result;     /* filled when not NULL (also on failure: what is known) */
    int *stop_signal;  /* out, or NULL: the signal (SIGINT, SIGTERM) that stopped a file job
                        * gracefully (base/stop.h), 0 if none; main exits 128 + it */
    const char *shard; /* --shard K/N, auto/N or auto (ingest/shard.h), or NULL; borrowed */
} tm_job_run_opts;
/* tm_job_run with options. Over an output folder whose manifest names the same job it resumes
 * (or, when that job finished, prints so and returns TM_OK without running; a job reading
 * standard input is never finished: its stream must start with the committed prefix, and lines
 * after it are answered); a different job is
 * refused unless opts->restart; a second process on the same folder is refused (lock file). */
tm_rc tm_job_run_with(const char *path, const tm_job_run_opts *opts);
/* Check the job file, model, tokenizer, engine availability and every input record as run
 * would (fields, chat template, context length) without running the model. */
tm_rc tm_job_validate(const char *path);
/* tm_job_validate with opts (spec_json and result are used). */
tm_rc tm_job_validate_with(const char *path, const tm_job_run_opts *opts);
/* A model folder's obvious mistakes, with what to do: a missing path (a Hugging Face id such as
 * org/name is not downloaded), a file (a .gguf), a folder without config.json. TM_E_IO. */
tm_rc tm_job_check_model_dir(const char *dir, tm_err *err);

#endif /* TM_CMD_JOB_RUN_H */
