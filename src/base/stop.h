/* base/stop.h - graceful stop on SIGINT/SIGTERM for long-running sources (Kafka "follow" and
 * "drain" modes): the first signal sets a flag the source polls (it stops consuming, the job
 * finishes what is in flight, commits and exits 0); the handler is one-shot, so a second signal
 * has the default effect (the process ends; the next run resumes from the last commit). The flag
 * is process-wide state, which is why it lives in base/. Async-signal-safe: the handler only
 * stores to a sig_atomic_t. */
#ifndef TM_BASE_STOP_H
#define TM_BASE_STOP_H

#include <stdbool.h>

/* Install the SIGINT and SIGTERM handlers (idempotent; any thread). */
void tm_stop_install(void);
/* Has a stop signal arrived since tm_stop_install? Any thread. */
bool tm_stop_requested(void);

#endif /* TM_BASE_STOP_H */
