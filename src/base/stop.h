/* base/stop.h - graceful stop on SIGINT/SIGTERM: the first signal sets a flag the job polls; the
 * handler is one-shot, so a second signal has the default effect (the process ends at once; the
 * next run resumes from the last commit). Kafka sources ("follow" and "drain" modes) stop
 * consuming, finish what is in flight, commit and exit 0; file jobs (cmd/job_run.c) stop reading,
 * drop the records in flight (the next run answers them), commit what was written, write
 * metrics.json and the manifest, and exit 128 + the signal (130 SIGINT, 143 SIGTERM). The flag is
 * process-wide state, which is why it lives in base/. Async-signal-safe: the handler only stores
 * to sig_atomic_t variables. */
#ifndef TM_BASE_STOP_H
#define TM_BASE_STOP_H

#include <stdbool.h>

/* Install the SIGINT and SIGTERM handlers (idempotent; any thread). */
void tm_stop_install(void);
/* Has a stop signal arrived since tm_stop_install? Any thread. */
bool tm_stop_requested(void);
/* The first stop signal's number (SIGINT or SIGTERM), 0 if none arrived. Any thread. */
int tm_stop_signal(void);

#endif /* TM_BASE_STOP_H */
