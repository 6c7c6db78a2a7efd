/* job_run.h - a whole job: spec, model, tokenizer, engine, and the three stages (source thread,
 * runner on the calling thread, sink thread) joined by bounded queues. Used by main.c. */
#ifndef TM_JOB_RUN_H
#define TM_JOB_RUN_H

#include "base/err.h"

/* Run the job file at path to completion; logs what it does and prints a summary. Errors are
 * logged here (the job is named); the return code says whether the job succeeded. */
tm_rc tm_job_run(const char *path);
/* Check the job file, model, tokenizer and every input line without running the model. */
tm_rc tm_job_validate(const char *path);

#endif /* TM_JOB_RUN_H */
