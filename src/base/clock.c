/* base/clock.c - clocks. */
#define _POSIX_C_SOURCE 200809L
#include "base/clock.h"

#include <stdio.h>
#include <time.h>

uint64_t tm_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double tm_now_ms(void) { return (double)tm_now_ns() / 1e6; }

void tm_utc_now_str(char *out, size_t n) {
    time_t t = time(NULL);
    struct tm utc;
    gmtime_r(&t, &utc);
    strftime(out, n, "%Y-%m-%dT%H:%M:%SZ", &utc);
}

void tm_deadline_in_ms(struct timespec *at, long ms) {
    clock_gettime(CLOCK_REALTIME, at);
    at->tv_sec += ms / 1000;
    at->tv_nsec += (ms % 1000) * 1000000L;
    if (at->tv_nsec >= 1000000000L) {
        at->tv_sec++;
        at->tv_nsec -= 1000000000L;
    }
}
