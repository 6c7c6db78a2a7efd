/* base/utf8.c - UTF-8 decoding and validation. */
#include "base/utf8.h"

#include <string.h>

#include "base/alloc.h"

size_t tm_utf8_seq_len(unsigned char c) {
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        return 2;
    if (c >= 0xE0 && c <= 0xEF)
        return 3;
    if (c >= 0xF0 && c <= 0xF4)
        return 4;
    return 0;
}

size_t tm_utf8_decode(const char *s, size_t n, uint32_t *cp) {
    const unsigned char *u = (const unsigned char *)s;
    if (n == 0)
        return 0;
    size_t len = tm_utf8_seq_len(u[0]);
    if (len == 0 || len > n)
        return 0;
    if (len == 1) {
        *cp = u[0];
        return 1;
    }
    uint32_t v = u[0] & (0x7F >> len);
    for (size_t i = 1; i < len; i++) {
        if ((u[i] & 0xC0) != 0x80)
            return 0;
        v = (v << 6) | (u[i] & 0x3F);
    }
    // overlongs, surrogates and > U+10FFFF
    if ((len == 3 && v < 0x800) || (len == 4 && (v < 0x10000 || v > 0x10FFFF)) ||
        (v >= 0xD800 && v <= 0xDFFF))
        return 0;
    *cp = v;
    return len;
}

size_t tm_utf8_valid_prefix(const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        size_t k = tm_utf8_decode(s + i, n - i, &cp);
        if (k == 0)
            break;
        i += k;
    }
    return i;
}

size_t tm_utf8_encode(uint32_t cp, char *out) {
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

static const char HEX[] = "0123456789abcdef";

char *tm_path_escape(const char *p) {
    size_t n = strlen(p), o = 0;
    char *out = tm_malloc(4 * n + 1); // at most 4 characters per byte
    if (!out)
        return NULL;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = (unsigned char)p[i] == '\\' ? 0 : tm_utf8_decode(p + i, n - i, &cp);
        if (k == 0) { // a backslash, or a byte outside valid UTF-8
            unsigned char c = (unsigned char)p[i++];
            out[o++] = '\\', out[o++] = 'x', out[o++] = HEX[c >> 4], out[o++] = HEX[c & 15];
        } else {
            memcpy(out + o, p + i, k);
            o += k, i += k;
        }
    }
    out[o] = '\0';
    return out;
}

static int hex_val(char c) {
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

char *tm_path_unescape(const char *s) {
    size_t n = strlen(s), o = 0;
    char *out = tm_malloc(n + 1);
    if (!out)
        return NULL;
    for (size_t i = 0; i < n;) {
        int hi = i + 3 < n && s[i] == '\\' && s[i + 1] == 'x' ? hex_val(s[i + 2]) : -1;
        int lo = hi >= 0 ? hex_val(s[i + 3]) : -1;
        if (hi >= 0 && lo >= 0 && (hi | lo) != 0) {
            out[o++] = (char)(hi * 16 + lo);
            i += 4;
        } else {
            out[o++] = s[i++];
        }
    }
    out[o] = '\0';
    return out;
}
