/* runner/text/tokenizer_int.h - tokenizer internals shared with tests: the hand-written matchers
 * that stand in for the pre-tokenizer Split regexes of tokenizer.json (C has no Unicode regex
 * engine). Each matcher reproduces one known pattern exactly under Oniguruma/JS backtracking
 * semantics (leftmost-first alternation, greedy quantifiers, the (?!\S) lookahead). Pure functions.
 */
#ifndef TM_RUNNER_TEXT_TOKENIZER_INT_H
#define TM_RUNNER_TEXT_TOKENIZER_INT_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "runner/text/tokenizer.h"

/* The Split regexes we recognise (by their exact pattern string). */
typedef enum tm_pat {
    TM_PAT_DS_DIGITS = 0, /* DeepSeek V3: \p{N}{1,3} */
    TM_PAT_DS_CJK,        /* DeepSeek V3: [一-龥぀-ゟ゠-ヿ]+ */
    TM_PAT_DS_MAIN,       /* DeepSeek V3: the punctuation/letters/whitespace pattern (7.3) */
    TM_PAT_GPT2,          /* GPT-2 / ByteLevel use_regex: 's|'t|...| ?\p{L}+| ?\p{N}+|... */
    TM_PAT_LLAMA3,        /* Llama 3 / cl100k: (?i:'s|...)|...|\p{N}{1,3}|... */
    TM_PAT_QWEN2,         /* Qwen2: like Llama 3 with single-digit \p{N} */
    TM_PAT_COUNT
} tm_pat;

/* Which pattern a tokenizer.json regex string is (literal CR/LF characters and the escapes
 * \r, \n are treated alike); -1 if it is not one we know. */
int tm_pat_lookup(const char *regex);
/* Canonical (escaped) pattern string of pat, for messages and tests. */
const char *tm_pat_source(tm_pat pat);

/* Length in code points of the match of pat anchored at cp[i] when the subject string is
 * cp[0..end) (so end is end-of-input for the (?!\S) lookahead); 0 if none. i < end. */
size_t tm_pat_match(tm_pat pat, const uint32_t *cp, size_t i, size_t end);

/* Split text[0..n) (valid UTF-8) with pat as a Split{behavior: Isolated} pre-tokenizer would:
 * matches and the gaps between them, in order. Appends each piece's byte length to out.
 * TM_E_INVAL on invalid UTF-8; TM_E_NOMEM. For tests. */
tm_rc tm_pat_split(tm_pat pat, const char *text, size_t n, tm_ids *out, tm_err *err);

#endif /* TM_RUNNER_TEXT_TOKENIZER_INT_H */
