/* base/clock.h - monotonic time in milliseconds / nanoseconds, and a UTC timestamp string. */
#ifndef TM_BASE_CLOCK_H
#define TM_BASE_CLOCK_H

#include <stddef.h>
#include <stdint.h>

double tm_now_ms(void);   /* CLOCK_MONOTONIC, ms */
uint64_t tm_now_ns(void); /* CLOCK_MONOTONIC, ns */
/* "2026-11-30T07:45:00Z" into out (>= 24 bytes). */
void tm_utc_now_str(char *out, size_t n);

struct timespec;
/* *at = CLOCK_REALTIME now + ms: the deadline pthread_cond_timedwait takes. */
void tm_deadline_in_ms(struct timespec *at, long ms);

#endif /* TM_BASE_CLOCK_H */
