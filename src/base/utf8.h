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

#endif /* TM_BASE_UTF8_H */
