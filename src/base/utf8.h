/* base/utf8.h - small UTF-8 helpers (validation per RFC 3629: no overlongs, no surrogates,
 * max U+10FFFF). Pure functions. */
#ifndef TM_BASE_UTF8_H
#define TM_BASE_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* Length of the sequence that lead byte c starts (1..4), or 0 if c cannot start one. */
size_t tm_utf8_seq_len(unsigned char c);
/* Byte length of the longest prefix of s[0..n) made of whole valid code points. */
size_t tm_utf8_valid_prefix(const char *s, size_t n);
/* Decode one code point at s (n bytes available). Returns its byte length and sets *cp, or 0 if
 * s does not start with a complete valid sequence. */
size_t tm_utf8_decode(const char *s, size_t n, uint32_t *cp);
/* Encode cp (<= 0x10FFFF, not a surrogate) into out[4]; returns the byte length. */
size_t tm_utf8_encode(uint32_t cp, char *out);

/* File paths in JSON (issue 35). A path is a byte string (any bytes but NUL); JSON strings are
 * UTF-8. tm_path_escape writes p so that JSON can carry it losslessly: the valid UTF-8 in it as
 * it is, each byte that is not part of valid UTF-8 as the four characters \xHH (two lowercase hex
 * digits), and each backslash as \x5c, so a name that is valid UTF-8 and has no backslash is
 * unchanged. tm_path_unescape undoes it: \xHH (any two hex digits, HH != 00) becomes that byte;
 * every other character, a lone backslash included, stays. Both return a new NUL-terminated
 * string the caller frees with tm_free(), or NULL when out of memory. */
char *tm_path_escape(const char *p);
char *tm_path_unescape(const char *s);

#endif /* TM_BASE_UTF8_H */
