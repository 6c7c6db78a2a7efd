/* base/buf.h - a growable byte buffer (always NUL-terminated) used to build JSON lines, file
 * contents and token strings. Not thread-safe; one owner. */
#ifndef TM_BASE_BUF_H
#define TM_BASE_BUF_H

#include <stddef.h>

#include "base/err.h"

typedef struct tm_buf {
    char *data; /* NUL-terminated; NULL until the first append */
    size_t len; /* bytes used, excluding the NUL */
    size_t cap; /* bytes allocated */
} tm_buf;

/* Release the storage; the buf may be reused afterwards (it is empty). */
void tm_buf_fini(tm_buf *b);
/* Make room for n more bytes. TM_E_NOMEM on failure (buf unchanged). */
tm_rc tm_buf_reserve(tm_buf *b, size_t n, tm_err *err);
tm_rc tm_buf_append(tm_buf *b, const void *p, size_t n, tm_err *err);
tm_rc tm_buf_append_str(tm_buf *b, const char *s, tm_err *err);
tm_rc tm_buf_printf(tm_buf *b, tm_err *err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Append s as a JSON string literal (quotes included, escapes for ", \, controls). s must be
 * valid UTF-8 (invalid bytes are replaced by U+FFFD). */
tm_rc tm_buf_append_json_str(tm_buf *b, const char *s, size_t n, tm_err *err);
static inline void tm_buf_clear(tm_buf *b) {
    b->len = 0;
    if (b->data)
        b->data[0] = '\0';
}

#endif /* TM_BASE_BUF_H */
