/* base/log.h - one-line logging to stderr: "<utc-ts> <E|W|I|D> <mod>: <msg>". The level is
 * checked before formatting. Thread-safe (one write per line). Tests may capture lines with
 * tm_log_set_sink. Never log in per-token loops; log where an error is handled. */
#ifndef TM_BASE_LOG_H
#define TM_BASE_LOG_H

typedef enum tm_log_level {
    TM_LOG_LEVEL_ERROR = 0,
    TM_LOG_LEVEL_WARN,
    TM_LOG_LEVEL_INFO,
    TM_LOG_LEVEL_DEBUG,
} tm_log_level;

/* Receives each formatted line (without the trailing newline). */
typedef void (*tm_log_sink_fn)(tm_log_level level, const char *line, void *ud);

void tm_log_set_level(tm_log_level level);
tm_log_level tm_log_get_level(void);
/* NULL restores the stderr sink. ud is borrowed; must outlive its use. */
void tm_log_set_sink(tm_log_sink_fn fn, void *ud);
void tm_log_write(tm_log_level level, const char *mod, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define TM_LOG_AT(lvl, mod, ...)                                                                   \
    do {                                                                                           \
        if ((lvl) <= tm_log_get_level())                                                           \
            tm_log_write((lvl), (mod), __VA_ARGS__);                                               \
    } while (0)
#define TM_LOG_ERROR(mod, ...) TM_LOG_AT(TM_LOG_LEVEL_ERROR, mod, __VA_ARGS__)
#define TM_LOG_WARN(mod, ...) TM_LOG_AT(TM_LOG_LEVEL_WARN, mod, __VA_ARGS__)
#define TM_LOG_INFO(mod, ...) TM_LOG_AT(TM_LOG_LEVEL_INFO, mod, __VA_ARGS__)
#define TM_LOG_DEBUG(mod, ...) TM_LOG_AT(TM_LOG_LEVEL_DEBUG, mod, __VA_ARGS__)

#endif /* TM_BASE_LOG_H */
