/* base/buf.c - growable byte buffer. */
#include "base/buf.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/utf8.h"

void tm_buf_fini(tm_buf *b) {
    tm_free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

tm_rc tm_buf_reserve(tm_buf *b, size_t n, tm_err *err) {
    if (b->len + n + 1 <= b->cap)
        return TM_OK;
    if (n > SIZE_MAX / 4 - b->len)
        return TM_ERR(err, TM_E_NOMEM, "buffer: %zu bytes is too large", n);
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + n + 1)
        cap *= 2;
    char *d = tm_realloc(b->data, cap);
    if (!d)
        return TM_ERR(err, TM_E_NOMEM, "buffer: growing to %zu bytes", cap);
    if (!b->data)
        d[0] = '\0';
    b->data = d;
    b->cap = cap;
    return TM_OK;
}

tm_rc tm_buf_append(tm_buf *b, const void *p, size_t n, tm_err *err) {
    tm_rc rc = tm_buf_reserve(b, n, err);
    if (rc)
        return rc;
    if (n)
        memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
    return TM_OK;
}

tm_rc tm_buf_append_str(tm_buf *b, const char *s, tm_err *err) {
    return tm_buf_append(b, s, strlen(s), err);
}

tm_rc tm_buf_printf(tm_buf *b, tm_err *err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        return TM_ERR(err, TM_E_INTERNAL, "buffer: bad format");
    tm_rc rc = tm_buf_reserve(b, (size_t)n, err);
    if (rc)
        return rc;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return TM_OK;
}

tm_rc tm_buf_append_json_str(tm_buf *b, const char *s, size_t n, tm_err *err) {
    tm_rc rc = tm_buf_reserve(b, n + 2, err);
    if (rc)
        return rc;
    b->data[b->len++] = '"';
    size_t i = 0;
    while (i < n) {
        unsigned char c = (unsigned char)s[i];
        char esc[8];
        const char *out = NULL;
        size_t out_n = 0;
        if (c == '"') {
            out = "\\\"", out_n = 2;
        } else if (c == '\\') {
            out = "\\\\", out_n = 2;
        } else if (c == '\n') {
            out = "\\n", out_n = 2;
        } else if (c == '\r') {
            out = "\\r", out_n = 2;
        } else if (c == '\t') {
            out = "\\t", out_n = 2;
        } else if (c < 0x20 || c == 0x7f) {
            snprintf(esc, sizeof(esc), "\\u%04x", c);
            out = esc, out_n = 6;
        }
        if (out) {
            rc = tm_buf_append(b, out, out_n, err);
            i++;
        } else if (c < 0x80) {
            rc = tm_buf_append(b, &s[i], 1, err);
            i++;
        } else {
            uint32_t cp;
            size_t k = tm_utf8_decode(s + i, n - i, &cp);
            if (k == 0) {
                rc = tm_buf_append(b, "\xef\xbf\xbd", 3, err); // U+FFFD for an invalid byte
                i++;
            } else {
                rc = tm_buf_append(b, s + i, k, err);
                i += k;
            }
        }
        if (rc)
            return rc;
    }
    return tm_buf_append(b, "\"", 1, err);
}
