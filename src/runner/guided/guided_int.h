/* runner/guided/guided_int.h - private to src/runner/guided: the expression tree that every
 * constraint (regex, JSON Schema, choice, json_object) is built into, and its compilation to a
 * byte-level DFA. Trees live in an arena (rx_ctx) and may share subtrees (a DAG: a $ref used
 * twice, json_object's nesting levels); compilation expands every reference into its own NFA
 * states. Code point sets are matched as UTF-8; in "JSON string" mode a set matches the JSON
 * string encoding of its code points ('"', '\\' and controls by their escapes). Single thread. */
#ifndef TM_RUNNER_GUIDED_GUIDED_INT_H
#define TM_RUNNER_GUIDED_GUIDED_INT_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "base/err.h"
#include "runner/guided/guided.h"

#define RX_MAX_CP 0x10FFFFu
#define RX_MAX_WORK (1ull << 26) /* NFA steps of one DFA build (tm_dfa_opts.max_work) */
#define RX_MAX_REPEAT 1000u      /* largest {m,n} bound and maxLength / maxItems */
#define RX_MAX_NFA 4000000u      /* NFA states of one constraint */
#define RX_MAX_NODES 1000000u    /* tree nodes of one constraint */

typedef enum rx_kind {
    RX_SET,   /* one code point of rng (UTF-8; JSON-escaped when json) */
    RX_BYTES, /* the bytes, literally */
    RX_CAT,   /* kids in order */
    RX_ALT,   /* one of kids */
    RX_REP,   /* kid[0] repeated min..max times (max == RX_INF: unbounded) */
    RX_EMPTY, /* the empty string */
    RX_NONE,  /* matches nothing */
} rx_kind;

#define RX_INF UINT32_MAX

typedef struct rx_node {
    rx_kind kind;
    int json;          /* RX_SET: match the JSON string encoding of the code points */
    uint32_t min, max; /* RX_REP */
    uint32_t n;        /* RX_SET: ranges; RX_BYTES: bytes; RX_CAT/RX_ALT: kids */
    uint32_t *rng;     /* RX_SET: [2 * n] inclusive code point ranges, sorted, disjoint */
    uint8_t *bytes;    /* RX_BYTES: [n] */
    struct rx_node **kid;
} rx_node;

typedef struct rx_block rx_block;

/* The arena and the error state of one compilation. A failing builder sets why/err and returns
 * NULL; callers pass NULL on (every builder returns NULL for a NULL input). */
typedef struct rx_ctx {
    rx_block *blocks;
    uint32_t n_nodes;
    tm_guide_why why; /* set with err on the first failure */
    tm_err *err;
    uint64_t max_work; /* NFA steps one DFA build may take (tm_dfa_opts; 0: RX_MAX_WORK) */
} rx_ctx;

void rx_ctx_fini(rx_ctx *c);
/* Record a failure (the first one wins); returns NULL for convenience. */
void *rx_fail(rx_ctx *c, tm_guide_why why, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

rx_node *rx_set(rx_ctx *c, const uint32_t *rng, uint32_t n, int json); /* copies rng */
rx_node *rx_bytes(rx_ctx *c, const void *p, size_t n);                 /* copies p */
rx_node *rx_str(rx_ctx *c, const char *s);
rx_node *rx_cat(rx_ctx *c, rx_node *const *kids, uint32_t n); /* NULL if any kid is NULL */
rx_node *rx_alt(rx_ctx *c, rx_node *const *kids, uint32_t n);
rx_node *rx_cat2(rx_ctx *c, rx_node *a, rx_node *b);
rx_node *rx_rep(rx_ctx *c, rx_node *kid, uint32_t min, uint32_t max);
rx_node *rx_empty(rx_ctx *c);
rx_node *rx_none(rx_ctx *c);

/* Parse a regular expression (the subset in docs/structured_output.md) into a tree that matches
 * whole strings (a leading ^ and a trailing $ are dropped; anchors elsewhere are unsupported).
 * json: its sets match JSON-escaped text (a JSON Schema "pattern" inside a string). */
rx_node *rx_parse(rx_ctx *c, const char *re, size_t n, int json);

/* Compile a tree into a DFA with at most max_states states (TM_GUIDE_MAX_STATES when 0).
 * Failure: TM_E_INVAL with c->why set (too many states, too large), TM_E_NOMEM. */
tm_rc rx_compile(rx_ctx *c, const rx_node *root, uint32_t max_states, tm_dfa **out);

/* JSON Schema (text) / choice list (JSON array text) / generic JSON object into a tree. */
rx_node *rx_schema(rx_ctx *c, const char *json, size_t n);
rx_node *rx_choice(rx_ctx *c, const char *json, size_t n);
rx_node *rx_json_object(rx_ctx *c);

/* numbers.c: integers (integer != 0) or numbers within the schema's minimum / maximum /
 * exclusiveMinimum / exclusiveMaximum, as plain decimals; rx_has_number_bounds says whether the
 * schema has any of them. */
int rx_has_number_bounds(const json_t *schema);
rx_node *rx_number_range(rx_ctx *c, const json_t *schema, int integer);

/* formats.c: the regular expression (over a string's characters) of a string format, NULL for
 * a format outside the supported ones. */
const char *rx_format_regex(const char *name);

#endif /* TM_RUNNER_GUIDED_GUIDED_INT_H */
