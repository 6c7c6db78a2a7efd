/* runner/guided/guided.h - structured output (issue 26; docs/structured_output.md): a constraint
 * (a JSON Schema, a regular expression, a list of choices, or "any JSON object") compiled into a
 * byte-level DFA, and the token mask of a DFA state over a tokenizer's vocabulary: token id i is
 * allowed in state q iff the DFA, walking i's decoded bytes from q, stays in a state from which
 * an accepting state can still be reached; the end-of-sequence ids are allowed iff q accepts.
 * Masks are computed by walking a byte trie of the vocabulary from q (dead branches pruned) and
 * cached per state. A compiled tm_guide is immutable but for its mask cache: one thread at a time
 * (the runner's). No global state. */
#ifndef TM_RUNNER_GUIDED_GUIDED_H
#define TM_RUNNER_GUIDED_GUIDED_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"

#define TM_GUIDE_MAX_STATES 250000u /* DFA states of one constraint (4 bytes per byte class) */
#define TM_GUIDE_MASK_CACHE_BYTES (256u << 20) /* cached token masks of one guide */
#define TM_GUIDE_JSON_DEPTH 4  /* json_object: objects/arrays nested at most this deep */
#define TM_GUIDE_REF_DEPTH 3   /* a recursive $ref is expanded at most this many times */
#define TM_GUIDE_MAX_DIGITS 16 /* integer and fraction digits of a generated JSON number */

/* What a constraint is (the same values as base/record.h's TM_GUIDED_*). */
typedef enum tm_guide_kind {
    TM_GUIDE_KIND_NONE = 0,
    TM_GUIDE_KIND_JSON_SCHEMA = 1, /* spec: the schema's JSON text */
    TM_GUIDE_KIND_JSON_OBJECT = 2, /* spec: unused */
    TM_GUIDE_KIND_REGEX = 3,       /* spec: the pattern (whole-output match) */
    TM_GUIDE_KIND_CHOICE = 4,      /* spec: a JSON array of strings */
} tm_guide_kind;

/* Why a compilation failed (besides TM_E_NOMEM). */
typedef enum tm_guide_why {
    TM_GUIDE_WHY_NONE = 0,
    TM_GUIDE_WHY_INVALID,     /* malformed: bad regex syntax, a schema that is not a schema */
    TM_GUIDE_WHY_UNSUPPORTED, /* valid but outside the subset (the message names the keyword) */
} tm_guide_why;

typedef struct tm_dfa tm_dfa;
typedef struct tm_guide tm_guide;
typedef struct tm_guide_vocab tm_guide_vocab;

/* ---- the DFA: state 0 is dead, tm_dfa_start() the start; transitions never lead from a live
 * state to a state that cannot reach acceptance (those are 0) ---- */
void tm_dfa_destroy(tm_dfa *d); /* NULL is a no-op */
uint32_t tm_dfa_start(const tm_dfa *d);
uint32_t tm_dfa_n_states(const tm_dfa *d);
/* The transition table over byte classes: the bytes no range of the constraint tells apart share
 * a class (a JSON Schema has some 20-40), so a state's row is n_class entries, not 256. */
typedef struct tm_dfa_table_view {
    const uint32_t *next; /* [n_states][n_class] */
    const uint8_t *cls;   /* [256] byte -> class */
    uint32_t n_class;
} tm_dfa_table_view;
static inline uint32_t tm_dfa_next(const tm_dfa_table_view *t, uint32_t q, uint8_t b) {
    return t->next[(size_t)q * t->n_class + t->cls[b]];
}
tm_dfa_table_view tm_dfa_table(const tm_dfa *d); /* valid until destroy */
int tm_dfa_accepts(const tm_dfa *d, uint32_t q);
/* 1 when q accepts and no byte leads on: only the end of the output may follow. */
int tm_dfa_is_final(const tm_dfa *d, uint32_t q);
/* The state after bytes p[0, n) from q (0: dead). */
uint32_t tm_dfa_walk(const tm_dfa *d, uint32_t q, const void *p, size_t n);
/* 1 when the whole of p[0, n) is accepted from the start state. */
int tm_dfa_match(const tm_dfa *d, const void *p, size_t n);

/* Compile a regular expression (whole-string match) into a DFA. Syntax errors: TM_E_INVAL with
 * *why INVALID; constructs outside the subset, or a DFA over TM_GUIDE_MAX_STATES states:
 * TM_E_INVAL with *why UNSUPPORTED (err names the construct); TM_E_NOMEM. */
tm_rc tm_dfa_regex(const char *re, size_t n, tm_dfa **out, tm_guide_why *why, tm_err *err);

/* Settings of one compilation (tm_dfa_compile_with). */
typedef struct tm_dfa_opts {
    /* The subset construction's work bound (NFA steps; 0: the default, 2^26, about 0.3-1 s on
     * one core). The fuzzer lowers it: its instrumentation makes each step about 10x slower than
     * a release build. */
    uint64_t max_work;
} tm_dfa_opts;

/* Compile a constraint of any kind (spec[0, n) as tm_guide_kind says) into a DFA; errors as
 * tm_dfa_regex, and a constraint that no output satisfies (an empty language: a recursive $ref
 * with no way out within TM_GUIDE_REF_DEPTH) is INVALID. */
tm_rc tm_dfa_compile(tm_guide_kind kind, const char *spec, size_t n, tm_dfa **out,
                     tm_guide_why *why, tm_err *err);
/* tm_dfa_compile with settings (opts borrowed for the call; NULL: the defaults). Thread-safe as
 * tm_dfa_compile: the settings are the compilation's own, not process-wide. */
tm_rc tm_dfa_compile_with(tm_guide_kind kind, const char *spec, size_t n, const tm_dfa_opts *opts,
                          tm_dfa **out, tm_guide_why *why, tm_err *err);

/* ---- the vocabulary: a byte trie of the tokens' decoded bytes ---- */

/* Build from n_vocab tokens: piece[i] (len[i] bytes; len 0 or NULL: never allowed, e.g. special
 * tokens) and the end-of-sequence ids eos[0, n_eos) (ids >= n_vocab are ignored). Copies what it
 * needs. Masks have ceil(n_vocab / 32) words. */
tm_rc tm_guide_vocab_create(const char *const *piece, const size_t *len, uint32_t n_vocab,
                            const uint32_t *eos, uint32_t n_eos, tm_guide_vocab **out, tm_err *err);
void tm_guide_vocab_destroy(tm_guide_vocab *v); /* NULL is a no-op */
uint32_t tm_guide_vocab_n_words(const tm_guide_vocab *v);

/* ---- a guide: a DFA with its cached masks ---- */

/* Takes ownership of dfa (also on failure). v is borrowed and must outlive g. */
tm_rc tm_guide_create(tm_dfa *dfa, const tm_guide_vocab *v, tm_guide **out, tm_err *err);
void tm_guide_destroy(tm_guide *g); /* NULL is a no-op */
const tm_dfa *tm_guide_dfa(const tm_guide *g);
/* The mask of state q (q != 0): ceil(n_vocab / 32) words, bit (i & 31) of word i >> 5 set iff id
 * i is allowed. Computed on the first call for q, then cached (valid until g is destroyed) while
 * the guide's cached masks take less than TM_GUIDE_MASK_CACHE_BYTES; past that, a state not in
 * the cache is computed into spare (n_words words, the caller's; the result is spare) when spare
 * is given, and cached beyond the limit when not. *cold (may be NULL) is set to 1 when it was
 * computed now. NULL on TM_E_NOMEM (err filled). */
const uint32_t *tm_guide_mask(tm_guide *g, uint32_t q, uint32_t *spare, int *cold, tm_err *err);
/* 1 when a state not yet cached would go to spare (the cache is full). */
int tm_guide_cache_full(const tm_guide *g);
/* The limit in masks (tests): default TM_GUIDE_MASK_CACHE_BYTES / the mask size. */
void tm_guide_set_cache_cap(tm_guide *g, uint32_t n_masks);
/* Masks computed so far (cache entries), for tests and metrics. */
uint32_t tm_guide_n_cached(const tm_guide *g);
/* The classes of states that share a mask (guide.c: no token of the vocabulary tells their states
 * apart), and the class of state q; for tests and benches. */
uint32_t tm_guide_n_classes(const tm_guide *g);
uint32_t tm_guide_state_class(const tm_guide *g, uint32_t q);

/* Compute the mask of DFA state q into mask (n_words words) without caching: the trie walk. */
void tm_guide_vocab_mask(const tm_guide_vocab *v, const tm_dfa *d, uint32_t q, uint32_t *mask);

#endif /* TM_RUNNER_GUIDED_GUIDED_H */
