/* base/err.c - tm_err helpers. */
#include "base/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

tm_rc tm_err_set(tm_err *err, tm_rc rc, const char *file, int line, const char *fmt, ...) {
    err->rc = rc;
    err->file = file;
    err->line = line;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
    va_end(ap);
    return rc;
}

tm_rc tm_err_wrap(tm_err *err, const char *fmt, ...) {
    char prefix[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof(prefix), fmt, ap);
    va_end(ap);
    char old[sizeof(err->msg)];
    memcpy(old, err->msg, sizeof(old));
    // Built piecewise: the joined text is cut at sizeof(msg), which is what we want.
    size_t n = strlen(prefix);
    if (n > sizeof(err->msg) - 3)
        n = sizeof(err->msg) - 3;
    memcpy(err->msg, prefix, n);
    memcpy(err->msg + n, ": ", 2);
    size_t room = sizeof(err->msg) - n - 3;
    size_t k = strnlen(old, room);
    memcpy(err->msg + n + 2, old, k);
    err->msg[n + 2 + k] = '\0';
    return err->rc;
}

const char *tm_rc_name(tm_rc rc) {
    switch (rc) {
    case TM_OK:
        return "ok";
    case TM_E_AGAIN:
        return "again";
    case TM_E_INVAL:
        return "inval";
    case TM_E_NOMEM:
        return "nomem";
    case TM_E_IO:
        return "io";
    case TM_E_PARSE:
        return "parse";
    case TM_E_CUDA:
        return "cuda";
    case TM_E_NCCL:
        return "nccl";
    case TM_E_KAFKA:
        return "kafka";
    case TM_E_EOF:
        return "eof";
    case TM_E_INTERNAL:
        return "internal";
    case TM_E_RECORD:
        return "record";
    }
    return "unknown";
}

void tm_assert_fail(const char *cond, const char *file, int line) {
    fprintf(stderr, "tokenmill: assertion failed: %s (%s:%d)\n", cond, file, line);
    abort();
}
