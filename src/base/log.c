/* base/log.c - the process-wide log level and sink (the only global mutable state besides the
 * allocator's fault hook). */
#define _POSIX_C_SOURCE 200809L
#include "base/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>

static atomic_int g_level = TM_LOG_LEVEL_INFO;
static tm_log_sink_fn g_sink;
static void *g_sink_ud;

void tm_log_set_level(tm_log_level level) { atomic_store(&g_level, (int)level); }
tm_log_level tm_log_get_level(void) { return (tm_log_level)atomic_load(&g_level); }

void tm_log_set_sink(tm_log_sink_fn fn, void *ud) {
    g_sink = fn;
    g_sink_ud = ud;
}

void tm_log_write(tm_log_level level, const char *mod, const char *fmt, ...) {
    static const char letters[] = "EWID";
    char line[1024];
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm utc;
    gmtime_r(&ts.tv_sec, &utc);
    int n = snprintf(line, sizeof(line),
                     "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %c %s: ", utc.tm_year + 1900,
                     utc.tm_mon + 1, utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec,
                     ts.tv_nsec / 1000000, letters[level & 3], mod);
    if (n < 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    if ((size_t)n < sizeof(line))
        vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
    va_end(ap);
    if (g_sink) {
        g_sink(level, line, g_sink_ud);
        return;
    }
    fprintf(stderr, "%s\n", line);
}
