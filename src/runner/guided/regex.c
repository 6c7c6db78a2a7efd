/* runner/guided/regex.c - the expression tree (arena and builders), the regex parser, and the
 * compilation tree -> Thompson NFA over bytes -> DFA by subset construction (guided_int.h).
 * Code point sets become UTF-8 byte sequences (surrogates excluded); a DFA state is the sorted
 * set of NFA byte/match states reached after epsilon closure. After construction, states that
 * cannot reach acceptance are cut (their incoming transitions lead to the dead state 0), so a
 * live state always has a way to finish. No minimization: the schema and regex DFAs stay small.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "runner/guided/guided_int.h"

// ---- arena ----

struct rx_block {
    rx_block *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
};

#define RX_BLOCK_BYTES (64u * 1024u)

static void *arena_alloc(rx_ctx *c, size_t n) {
    n = (n + 15) & ~(size_t)15;
    rx_block *b = c->blocks;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > RX_BLOCK_BYTES ? n : RX_BLOCK_BYTES;
        b = tm_malloc(sizeof(*b) + cap);
        if (!b)
            return rx_fail(c, TM_GUIDE_WHY_NONE, "guided: out of memory (%zu bytes)", cap);
        b->next = c->blocks, b->used = 0, b->cap = cap;
        c->blocks = b;
    }
    void *p = b->data + b->used;
    b->used += n;
    memset(p, 0, n);
    return p;
}

void rx_ctx_fini(rx_ctx *c) {
    while (c->blocks) {
        rx_block *n = c->blocks->next;
        tm_free(c->blocks);
        c->blocks = n;
    }
}

void *rx_fail(rx_ctx *c, tm_guide_why why, const char *fmt, ...) {
    if (c->err->rc != TM_OK)
        return NULL; // the first failure is the one reported
    char msg[sizeof(c->err->msg)];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    c->why = why;
    TM_ERR(c->err, why == TM_GUIDE_WHY_NONE ? TM_E_NOMEM : TM_E_INVAL, "%s", msg);
    return NULL;
}

static rx_node *node(rx_ctx *c, rx_kind kind) {
    if (c->err->rc != TM_OK)
        return NULL;
    if (++c->n_nodes > RX_MAX_NODES)
        return rx_fail(c, TM_GUIDE_WHY_UNSUPPORTED,
                       "guided: the constraint is too large (over %u expression nodes)",
                       RX_MAX_NODES);
    rx_node *x = arena_alloc(c, sizeof(*x));
    if (x)
        x->kind = kind;
    return x;
}

rx_node *rx_set(rx_ctx *c, const uint32_t *rng, uint32_t n, int json) {
    rx_node *x = node(c, RX_SET);
    if (!x)
        return NULL;
    x->rng = arena_alloc(c, (size_t)2 * (n ? n : 1) * sizeof(uint32_t));
    if (!x->rng)
        return NULL;
    memcpy(x->rng, rng, (size_t)2 * n * sizeof(uint32_t));
    x->n = n, x->json = json;
    return x;
}

rx_node *rx_bytes(rx_ctx *c, const void *p, size_t n) {
    if (n > UINT32_MAX)
        return rx_fail(c, TM_GUIDE_WHY_UNSUPPORTED, "guided: literal too long");
    rx_node *x = node(c, RX_BYTES);
    if (!x)
        return NULL;
    x->bytes = arena_alloc(c, n ? n : 1);
    if (!x->bytes)
        return NULL;
    memcpy(x->bytes, p, n);
    x->n = (uint32_t)n;
    return x;
}

rx_node *rx_str(rx_ctx *c, const char *s) { return rx_bytes(c, s, strlen(s)); }

static rx_node *list(rx_ctx *c, rx_kind kind, rx_node *const *kids, uint32_t n) {
    for (uint32_t i = 0; i < n; i++)
        if (!kids[i])
            return NULL;
    rx_node *x = node(c, kind);
    if (!x)
        return NULL;
    x->kid = arena_alloc(c, (n ? n : 1) * sizeof(*x->kid));
    if (!x->kid)
        return NULL;
    memcpy(x->kid, kids, n * sizeof(*kids));
    x->n = n;
    return x;
}

rx_node *rx_cat(rx_ctx *c, rx_node *const *kids, uint32_t n) { return list(c, RX_CAT, kids, n); }
rx_node *rx_alt(rx_ctx *c, rx_node *const *kids, uint32_t n) { return list(c, RX_ALT, kids, n); }
rx_node *rx_cat2(rx_ctx *c, rx_node *a, rx_node *b) {
    rx_node *k[2] = {a, b};
    return rx_cat(c, k, 2);
}

rx_node *rx_rep(rx_ctx *c, rx_node *kid, uint32_t min, uint32_t max) {
    if (!kid)
        return NULL;
    // A repetition of an unbounded one that may take a single copy, (X{a,b}){c,inf} or
    // (X{a,inf}){c,d} with a <= 1, is X{a*c,inf}; (X{a,inf}){0,d} with a <= 1 is X*. Folding
    // them keeps X+++... (possessive pairs) or (((X*)*)*) from doubling the NFA per level.
    if (kid->kind == RX_REP && kid->min <= 1 && kid->max >= 1 && max >= 1 &&
        (kid->max == RX_INF || max == RX_INF)) {
        uint32_t m = kid->min * min;
        if (m <= RX_MAX_REPEAT)
            return rx_rep(c, kid->kid[0], m, RX_INF);
    }
    // Both finite, (X{a,b}){c,d} with a <= 1 is X{a*c,b*d} (every count in between is a sum of
    // c..d counts in a..b). Unfolded, (a{0,300}){0,300} made every DFA state a set of ~10^5 NFA
    // states (seconds to reach the work bound); folded, its states are small sets.
    if (kid->kind == RX_REP && kid->min <= 1 && kid->max != RX_INF && max != RX_INF &&
        (uint64_t)kid->max * max <= RX_MAX_NFA)
        return rx_rep(c, kid->kid[0], kid->min * min, kid->max * max);
    rx_node *x = list(c, RX_REP, &kid, 1);
    if (x)
        x->min = min, x->max = max;
    return x;
}

rx_node *rx_empty(rx_ctx *c) { return node(c, RX_EMPTY); }
rx_node *rx_none(rx_ctx *c) { return node(c, RX_NONE); }

// ---- code point sets: sorted disjoint inclusive ranges ----

typedef struct cpset {
    uint32_t r[2 * 64]; /* small sets inline */
    uint32_t *p;        /* r or a heap copy */
    uint32_t n, cap;
} cpset;

static void cps_init(cpset *s) { s->p = s->r, s->n = 0, s->cap = 64; }
static void cps_fini(cpset *s) {
    if (s->p != s->r)
        tm_free(s->p);
}

static int cps_add(cpset *s, uint32_t lo, uint32_t hi) {
    if (s->n == s->cap) {
        uint32_t *q = tm_malloc((size_t)4 * s->cap * sizeof(uint32_t));
        if (!q)
            return -1;
        memcpy(q, s->p, (size_t)2 * s->n * sizeof(uint32_t));
        if (s->p != s->r)
            tm_free(s->p);
        s->p = q, s->cap *= 2;
    }
    s->p[2 * s->n] = lo, s->p[2 * s->n + 1] = hi;
    s->n++;
    return 0;
}

static int cmp_rng(const void *a, const void *b) {
    const uint32_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

static void cps_norm(cpset *s) {
    qsort(s->p, s->n, 2 * sizeof(uint32_t), cmp_rng);
    uint32_t k = 0;
    for (uint32_t i = 0; i < s->n; i++) {
        uint32_t lo = s->p[2 * i], hi = s->p[2 * i + 1];
        if (k && lo <= s->p[2 * k - 1] + 1) {
            if (hi > s->p[2 * k - 1])
                s->p[2 * k - 1] = hi;
        } else {
            s->p[2 * k] = lo, s->p[2 * k + 1] = hi;
            k++;
        }
    }
    s->n = k;
}

// Complement within [0, RX_MAX_CP] (s normalized).
static int cps_negate(cpset *s) {
    cpset t;
    cps_init(&t);
    uint32_t next = 0;
    int bad = 0;
    for (uint32_t i = 0; i < s->n && !bad; i++) {
        if (s->p[2 * i] > next)
            bad |= cps_add(&t, next, s->p[2 * i] - 1);
        next = s->p[2 * i + 1] + 1;
    }
    if (!bad && next <= RX_MAX_CP)
        bad |= cps_add(&t, next, RX_MAX_CP);
    if (bad) {
        cps_fini(&t);
        return -1;
    }
    cps_fini(s);
    cps_init(s);
    for (uint32_t i = 0; i < t.n && !bad; i++)
        bad |= cps_add(s, t.p[2 * i], t.p[2 * i + 1]);
    cps_fini(&t);
    return bad ? -1 : 0;
}

// ---- the parser ----

typedef struct parser {
    rx_ctx *c;
    const unsigned char *s;
    size_t n, i;
    int json;
    uint32_t depth;
} parser;

#define RX_MAX_PAREN 200

static rx_node *p_alt(parser *p);

static int at_end(const parser *p) { return p->i >= p->n; }
static int peek(const parser *p) { return at_end(p) ? -1 : p->s[p->i]; }

// One UTF-8 code point of the pattern; -1 on invalid UTF-8.
static int32_t p_cp(parser *p) {
    const unsigned char *s = p->s + p->i;
    size_t left = p->n - p->i;
    uint32_t b = s[0], cp, len;
    if (b < 0x80)
        cp = b, len = 1;
    else if ((b & 0xE0) == 0xC0)
        cp = b & 0x1F, len = 2;
    else if ((b & 0xF0) == 0xE0)
        cp = b & 0x0F, len = 3;
    else if ((b & 0xF8) == 0xF0)
        cp = b & 0x07, len = 4;
    else
        return -1;
    if (left < len)
        return -1;
    for (uint32_t k = 1; k < len; k++) {
        if ((s[k] & 0xC0) != 0x80)
            return -1;
        cp = cp << 6 | (s[k] & 0x3F);
    }
    static const uint32_t min_of[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_of[len] || cp > RX_MAX_CP || (cp >= 0xD800 && cp <= 0xDFFF))
        return -1;
    p->i += len;
    return (int32_t)cp;
}

static int hexval(int ch) {
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    return -1;
}

static int add_class(cpset *s, int ch) {
    static const uint32_t d[] = {'0', '9'};
    static const uint32_t w[] = {'0', '9', 'A', 'Z', '_', '_', 'a', 'z'};
    // ECMAScript's \s: WhiteSpace and LineTerminator
    static const uint32_t sp[] = {9,      13,     32,     32,     0xA0,   0xA0,   0x1680,
                                  0x1680, 0x2000, 0x200A, 0x2028, 0x2029, 0x202F, 0x202F,
                                  0x205F, 0x205F, 0x3000, 0x3000, 0xFEFF, 0xFEFF};
    const uint32_t *t = ch == 'd' ? d : ch == 'w' ? w : sp;
    size_t n = ch == 'd' ? 1 : ch == 'w' ? 4 : sizeof(sp) / sizeof(sp[0]) / 2;
    for (size_t k = 0; k < n; k++)
        if (cps_add(s, t[2 * k], t[2 * k + 1]))
            return -1;
    return 0;
}

// The escape after a backslash: a code point (*cp), or a class (\d \w \s and negations: *cls set
// to the letter). Returns 0, or -1 with the failure recorded.
static int p_escape(parser *p, int in_class, int32_t *cp, int *cls) {
    *cls = 0;
    if (at_end(p)) {
        rx_fail(p->c, TM_GUIDE_WHY_INVALID, "regex: '\\' at the end of the pattern");
        return -1;
    }
    int ch = p->s[p->i++];
    switch (ch) {
    case 'd':
    case 'w':
    case 's':
    case 'D':
    case 'W':
    case 'S':
        *cls = ch;
        return 0;
    case 'n':
        *cp = '\n';
        return 0;
    case 't':
        *cp = '\t';
        return 0;
    case 'r':
        *cp = '\r';
        return 0;
    case 'f':
        *cp = '\f';
        return 0;
    case 'v':
        *cp = '\v';
        return 0;
    case '0':
        *cp = 0;
        return 0;
    case 'x':
    case 'u': {
        uint32_t v = 0;
        if (ch == 'u' && peek(p) == '{') {
            p->i++;
            int k = 0;
            while (!at_end(p) && hexval(peek(p)) >= 0 && k < 7)
                v = v * 16 + (uint32_t)hexval(p->s[p->i++]), k++;
            if (k == 0 || peek(p) != '}' || v > RX_MAX_CP) {
                rx_fail(p->c, TM_GUIDE_WHY_INVALID, "regex: bad \\u{...} escape at offset %zu",
                        p->i);
                return -1;
            }
            p->i++;
        } else {
            int nd = ch == 'x' ? 2 : 4;
            for (int k = 0; k < nd; k++) {
                int h = hexval(peek(p));
                if (h < 0) {
                    rx_fail(p->c, TM_GUIDE_WHY_INVALID, "regex: bad \\%c escape at offset %zu", ch,
                            p->i);
                    return -1;
                }
                v = v * 16 + (uint32_t)h;
                p->i++;
            }
        }
        if (v >= 0xD800 && v <= 0xDFFF) {
            rx_fail(p->c, TM_GUIDE_WHY_UNSUPPORTED,
                    "regex: surrogate escapes (\\u%04X) are not supported; write the character", v);
            return -1;
        }
        *cp = (int32_t)v;
        return 0;
    }
    case 'b':
        if (in_class) {
            *cp = '\b';
            return 0;
        }
        break;
    default:
        if (ch < 0x80 &&
            !((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9'))) {
            *cp = ch; // an escaped punctuation character stands for itself
            return 0;
        }
        if (in_class && ch == '-') {
            *cp = '-';
            return 0;
        }
    }
    rx_fail(p->c, TM_GUIDE_WHY_UNSUPPORTED,
            "regex: the escape '\\%c' is not supported (backreferences, word boundaries, "
            "Unicode properties)",
            ch);
    return -1;
}

static rx_node *set_node(parser *p, cpset *s, int negate) {
    cps_norm(s);
    if (negate && cps_negate(s)) {
        cps_fini(s);
        return rx_fail(p->c, TM_GUIDE_WHY_NONE, "regex: out of memory");
    }
    // surrogates are not characters in UTF-8: cut them out
    cpset t;
    cps_init(&t);
    int bad = 0;
    for (uint32_t k = 0; k < s->n && !bad; k++) {
        uint32_t lo = s->p[2 * k], hi = s->p[2 * k + 1];
        if (lo < 0xD800 && hi >= 0xD800)
            bad |= cps_add(&t, lo, 0xD7FF), lo = 0xE000;
        else if (lo >= 0xD800 && lo <= 0xDFFF)
            lo = 0xE000;
        if (lo <= hi && !bad)
            bad |= cps_add(&t, lo, hi);
    }
    rx_node *x = bad ? rx_fail(p->c, TM_GUIDE_WHY_NONE, "regex: out of memory")
                     : rx_set(p->c, t.p, t.n, p->json);
    cps_fini(&t);
    cps_fini(s);
    return x;
}

static int add_escape_class(cpset *s, int cls) {
    int lower = cls | 0x20;
    if (cls == lower)
        return add_class(s, cls);
    cpset t;
    cps_init(&t);
    int bad = add_class(&t, lower);
    cps_norm(&t);
    bad = bad || cps_negate(&t);
    for (uint32_t k = 0; k < t.n && !bad; k++)
        bad |= cps_add(s, t.p[2 * k], t.p[2 * k + 1]);
    cps_fini(&t);
    return bad ? -1 : 0;
}

// A bracket expression; p->i is just past '['.
static rx_node *p_class(parser *p) {
    cpset s;
    cps_init(&s);
    int negate = 0;
    if (peek(p) == '^')
        negate = 1, p->i++;
    for (;;) {
        if (at_end(p)) {
            cps_fini(&s);
            return rx_fail(p->c, TM_GUIDE_WHY_INVALID, "regex: unterminated '['");
        }
        if (peek(p) == ']') {
            p->i++;
            break;
        }
        int32_t lo = 0;
        int cls = 0;
        if (peek(p) == '[' && p->i + 1 < p->n && p->s[p->i + 1] == ':') {
            cps_fini(&s);
            return rx_fail(p->c, TM_GUIDE_WHY_UNSUPPORTED,
                           "regex: POSIX classes ([:alpha:]) are not supported");
        }
        if (peek(p) == '\\') {
            p->i++;
            if (p_escape(p, 1, &lo, &cls)) {
                cps_fini(&s);
                return NULL;
            }
        } else if ((lo = p_cp(p)) < 0) {
            cps_fini(&s);
            return rx_fail(p->c, TM_GUIDE_WHY_INVALID, "regex: invalid UTF-8 at offset %zu", p->i);
        }
        if (cls) {
            if (add_escape_class(&s, cls)) {
                cps_fini(&s);
                return rx_fail(p->c, TM_GUIDE_WHY_NONE, "regex: out of memory");
            }
            continue;
        }
        int32_t hi = lo;
        if (peek(p) == '-' && p->i + 1 < p->n && p->s[p->i + 1] != ']') {
            p->i++;
            if (peek(p) == '\\') {
                p->i++;
                if (p_escape(p, 1, &hi, &cls)) {
                    cps_fini(&s);
                    return NULL;
                }
                if (cls) {
                    cps_fini(&s);
                    return rx_fail(p->c, TM_GUIDE_WHY_INVALID, "regex: a class in a range");
                }
            } else if ((hi = p_cp(p)) < 0) {
                cps_fini(&s);
                return rx_fail(p->c, TM_GUIDE_WHY_INVALID, "regex: invalid UTF-8 at offset %zu",
                               p->i);
            }
            if (hi < lo) {
                cps_fini(&s);
                return rx_fail(p->c, TM_GUIDE_WHY_INVALID,
                               "regex: range out of order in a class at offset %zu", p->i);
            }
        }
        if (cps_add(&s, (uint32_t)lo, (uint32_t)hi)) {
            cps_fini(&s);
            return rx_fail(p->c, TM_GUIDE_WHY_NONE, "regex: out of memory");
        }
    }
    return set_node(p, &s, negate);
}

static rx_node *single(parser *p, uint32_t lo, uint32_t hi) {
    uint32_t r[2] = {lo, hi};
    return rx_set(p->c, r, 1, p->json);
}

// An atom: a character, a class, '.', a group.
static rx_node *p_atom(parser *p) {
    int ch = peek(p);
    if (ch == '(') {
        p->i++;
        if (peek(p) == '?') {
            if (p->i + 1 < p->n && p->s[p->i + 1] == ':') {
                p->i += 2;
            } else {
                return rx_fail(p->c, TM_GUIDE_WHY_UNSUPPORTED,
                               "regex: '(?' groups other than (?:...) (lookaround, named groups, "
                               "flags) are not supported");
            }
        }
        if (++p->depth > RX_MAX_PAREN)
            return rx_fail(p->c, TM_GUIDE_WHY_UNSUPPORTED, "regex: groups nested deeper than %d",
                           RX_MAX_PAREN);
        rx_node *x = p_alt(p);
        p->depth--;
        if (!x)
            return NULL;
        if (peek(p) != ')')
            return rx_fail(p->c, TM_GUIDE_WHY_INVALID, "regex: missing ')' at offset %zu", p->i);
        p->i++;
        return x;
    }
    if (ch == '[') {
        p->i++;
        return p_class(p);
    }
    if (ch == '.') {
        p->i++;
        cpset s;
        cps_init(&s);
        // ECMAScript's '.': anything but a line terminator
        if (cps_add(&s, '\n', '\n') || cps_add(&s, '\r', '\r') || cps_add(&s, 0x2028, 0x2029)) {
            cps_fini(&s);
            return rx_fail(p->c, TM_GUIDE_WHY_NONE, "regex: out of memory");
        }
        return set_node(p, &s, 1);
    }
    if (ch == '^' || ch == '$')
        return rx_fail(p->c, TM_GUIDE_WHY_UNSUPPORTED,
                       "regex: anchors ('%c') are only supported at the start and end of the "
                       "pattern (the whole output is matched)",
                       ch);
    if (ch == '*' || ch == '+' || ch == '?' || ch == '{')
        return rx_fail(p->c, TM_GUIDE_WHY_INVALID, "regex: nothing to repeat at offset %zu", p->i);
    if (ch == '\\') {
        p->i++;
        int32_t cp = 0;
        int cls = 0;
        if (p_escape(p, 0, &cp, &cls))
            return NULL;
        if (!cls)
            return single(p, (uint32_t)cp, (uint32_t)cp);
        cpset s;
        cps_init(&s);
        if (add_escape_class(&s, cls)) {
            cps_fini(&s);
            return rx_fail(p->c, TM_GUIDE_WHY_NONE, "regex: out of memory");
        }
        return set_node(p, &s, 0);
    }
    int32_t cp = p_cp(p);
    if (cp < 0)
        return rx_fail(p->c, TM_GUIDE_WHY_INVALID, "regex: invalid UTF-8 at offset %zu", p->i);
    return single(p, (uint32_t)cp, (uint32_t)cp);
}

// A decimal number of a {m,n} bound; -1 when there is none.
static int64_t p_num(parser *p) {
    int64_t v = -1;
    while (!at_end(p) && peek(p) >= '0' && peek(p) <= '9') {
        v = (v < 0 ? 0 : v) * 10 + (p->s[p->i++] - '0');
        if (v > 1000000)
            v = 1000000;
    }
    return v;
}

static rx_node *p_repeat(parser *p) {
    rx_node *x = p_atom(p);
    while (x && !at_end(p)) {
        int ch = peek(p);
        uint32_t min, max;
        if (ch == '*')
            min = 0, max = RX_INF, p->i++;
        else if (ch == '+')
            min = 1, max = RX_INF, p->i++;
        else if (ch == '?')
            min = 0, max = 1, p->i++;
        else if (ch == '{') {
            size_t at = p->i++;
            int64_t a = p_num(p), b = a;
            if (peek(p) == ',') {
                p->i++;
                b = p_num(p);
                if (b < 0)
                    b = -2; // unbounded
            }
            if (a < 0 || peek(p) != '}')
                return rx_fail(p->c, TM_GUIDE_WHY_INVALID,
                               "regex: bad repetition at offset %zu (a literal '{' must be "
                               "escaped)",
                               at);
            p->i++;
            if (b >= 0 && b < a)
                return rx_fail(p->c, TM_GUIDE_WHY_INVALID,
                               "regex: {%lld,%lld}: the bounds are out of order", (long long)a,
                               (long long)b);
            if (a > RX_MAX_REPEAT || b > (int64_t)RX_MAX_REPEAT)
                return rx_fail(p->c, TM_GUIDE_WHY_UNSUPPORTED,
                               "regex: repetition bound over %u at offset %zu", RX_MAX_REPEAT, at);
            min = (uint32_t)a, max = b == -2 ? RX_INF : (uint32_t)b;
        } else {
            break;
        }
        if (peek(p) == '?' || peek(p) == '+') // lazy / possessive: the same language
            p->i++;
        x = rx_rep(p->c, x, min, max);
    }
    return x;
}

// The subtrees of a concatenation or an alternation being parsed: 64 inline, then the heap.
typedef struct kids {
    rx_node *inl[64], **all;
    uint32_t n, cap;
} kids;

static void kids_init(kids *k) { k->all = k->inl, k->n = 0, k->cap = 64; }
static void kids_fini(kids *k) {
    if (k->all != k->inl)
        tm_free(k->all);
}

// Append x (NULL: a failure already reported); 0 on success.
static int kids_push(parser *p, kids *k, rx_node *x) {
    if (!x)
        return -1;
    if (k->n == k->cap) {
        rx_node **q = tm_malloc(2 * k->cap * sizeof(*q));
        if (!q) {
            rx_fail(p->c, TM_GUIDE_WHY_NONE, "regex: out of memory");
            return -1;
        }
        memcpy(q, k->all, k->n * sizeof(*q));
        kids_fini(k);
        k->all = q, k->cap *= 2;
    }
    k->all[k->n++] = x;
    return 0;
}

static rx_node *p_cat(parser *p) {
    kids k;
    kids_init(&k);
    rx_node *x = NULL;
    while (!at_end(p) && peek(p) != '|' && peek(p) != ')')
        if (kids_push(p, &k, p_repeat(p)))
            goto out;
    x = k.n == 1 ? k.all[0] : k.n == 0 ? rx_empty(p->c) : rx_cat(p->c, k.all, k.n);
out:
    kids_fini(&k);
    return x;
}

static rx_node *p_alt(parser *p) {
    kids k;
    kids_init(&k);
    rx_node *x = NULL;
    for (;;) {
        if (kids_push(p, &k, p_cat(p)))
            goto out;
        if (peek(p) != '|')
            break;
        p->i++;
    }
    x = k.n == 1 ? k.all[0] : rx_alt(p->c, k.all, k.n);
out:
    kids_fini(&k);
    return x;
}

rx_node *rx_parse(rx_ctx *c, const char *re, size_t n, int json) {
    parser p = {.c = c, .s = (const unsigned char *)re, .n = n, .json = json};
    if (p.n && p.s[0] == '^')
        p.i++;
    if (p.n > p.i && p.s[p.n - 1] == '$') {
        size_t bs = 0; // "\$" is a literal dollar
        while (bs + 1 < p.n && p.s[p.n - 2 - bs] == '\\')
            bs++;
        if (bs % 2 == 0)
            p.n--;
    }
    rx_node *x = p_alt(&p);
    if (x && !at_end(&p))
        return rx_fail(c, TM_GUIDE_WHY_INVALID, "regex: unmatched ')' at offset %zu", p.i);
    return x;
}

// ---- NFA ----

enum { NFA_EPS, NFA_BYTE, NFA_MATCH };

typedef struct nstate {
    uint8_t type, lo, hi;
    uint32_t out, out2; /* NFA_EPS: out and out2 (UINT32_MAX: none); NFA_BYTE: out */
} nstate;

typedef struct nfa {
    nstate *st;
    uint32_t n, cap;
    rx_ctx *c;
} nfa;

#define NONE_ST UINT32_MAX

static uint32_t nfa_add(nfa *a, uint8_t type, uint8_t lo, uint8_t hi, uint32_t out, uint32_t out2) {
    if (a->n == a->cap) {
        if (a->cap >= RX_MAX_NFA) {
            rx_fail(a->c, TM_GUIDE_WHY_UNSUPPORTED,
                    "guided: the constraint is too large (over %u NFA states; lower maxLength, "
                    "maxItems or {m,n} bounds)",
                    RX_MAX_NFA);
            return NONE_ST;
        }
        uint32_t cap = a->cap ? 2 * a->cap : 1024;
        nstate *q = tm_realloc(a->st, (size_t)cap * sizeof(*q));
        if (!q) {
            rx_fail(a->c, TM_GUIDE_WHY_NONE, "guided: out of memory (NFA)");
            return NONE_ST;
        }
        a->st = q, a->cap = cap;
    }
    a->st[a->n] = (nstate){.type = type, .lo = lo, .hi = hi, .out = out, .out2 = out2};
    return a->n++;
}

static uint32_t eps2(nfa *a, uint32_t x, uint32_t y) { return nfa_add(a, NFA_EPS, 0, 0, x, y); }

// Join alternatives into one start: a chain of splits.
typedef struct alts {
    uint32_t start; /* NONE_ST: none yet */
    nfa *a;
} alts;

static int alts_add(alts *al, uint32_t s) {
    if (s == NONE_ST)
        return -1;
    if (al->start == NONE_ST) {
        al->start = s;
        return 0;
    }
    al->start = eps2(al->a, s, al->start);
    return al->start == NONE_ST ? -1 : 0;
}

static int utf8_enc(uint32_t cp, uint8_t *b) {
    if (cp < 0x80) {
        b[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        b[0] = (uint8_t)(0xC0 | cp >> 6), b[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        b[0] = (uint8_t)(0xE0 | cp >> 12), b[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        b[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    b[0] = (uint8_t)(0xF0 | cp >> 18), b[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    b[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F)), b[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

// The UTF-8 byte sequences of code points [lo, hi] (no surrogates inside), as chains of byte
// ranges to target, added to al. The classic split: equal lengths, then equal prefixes.
static int utf8_range(nfa *a, alts *al, uint32_t lo, uint32_t hi, uint32_t target) {
    static const uint32_t lim[] = {0x7F, 0x7FF, 0xFFFF};
    for (int k = 0; k < 3; k++)
        if (lo <= lim[k] && hi > lim[k])
            return utf8_range(a, al, lo, lim[k], target) ||
                   utf8_range(a, al, lim[k] + 1, hi, target);
    if (hi < 0x80) {
        return alts_add(al, nfa_add(a, NFA_BYTE, (uint8_t)lo, (uint8_t)hi, target, NONE_ST));
    }
    uint8_t bl[4], bh[4];
    int n = utf8_enc(lo, bl);
    utf8_enc(hi, bh);
    for (int i = 1; i < n; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0)
                return utf8_range(a, al, lo, lo | m, target) ||
                       utf8_range(a, al, (lo | m) + 1, hi, target);
            if ((hi & m) != m)
                return utf8_range(a, al, lo, (hi & ~m) - 1, target) ||
                       utf8_range(a, al, hi & ~m, hi, target);
        }
    }
    uint32_t next = target;
    for (int i = n - 1; i >= 0; i--) {
        next = nfa_add(a, NFA_BYTE, bl[i], bh[i], next, NONE_ST);
        if (next == NONE_ST)
            return -1;
    }
    return alts_add(al, next);
}

static uint32_t bytes_to(nfa *a, const uint8_t *b, size_t n, uint32_t target) {
    uint32_t next = target;
    for (size_t i = n; i-- > 0 && next != NONE_ST;)
        next = nfa_add(a, NFA_BYTE, b[i], b[i], next, NONE_ST);
    return next;
}

// The JSON string encoding of a special code point (", \ and controls).
static int json_escape(uint32_t cp, char *out) {
    switch (cp) {
    case '"':
        return snprintf(out, 8, "\\\"");
    case '\\':
        return snprintf(out, 8, "\\\\");
    case '\n':
        return snprintf(out, 8, "\\n");
    case '\t':
        return snprintf(out, 8, "\\t");
    case '\r':
        return snprintf(out, 8, "\\r");
    case '\b':
        return snprintf(out, 8, "\\b");
    case '\f':
        return snprintf(out, 8, "\\f");
    default:
        return snprintf(out, 8, "\\u%04x", cp);
    }
}

static int is_json_special(uint32_t cp) { return cp < 0x20 || cp == '"' || cp == '\\'; }

static uint32_t set_to(nfa *a, const rx_node *x, uint32_t target) {
    alts al = {.start = NONE_ST, .a = a};
    for (uint32_t k = 0; k < x->n; k++) {
        uint32_t lo = x->rng[2 * k], hi = x->rng[2 * k + 1];
        if (x->json) {
            for (uint32_t cp = lo; cp <= hi && cp < 0x5D; cp++) {
                if (!is_json_special(cp))
                    continue;
                char e[8];
                int n = json_escape(cp, e);
                if (alts_add(&al, bytes_to(a, (const uint8_t *)e, (size_t)n, target)))
                    return NONE_ST;
            }
            // the plain runs between specials
            uint32_t cur = lo;
            while (cur <= hi) {
                while (cur <= hi && cur < 0x5D && is_json_special(cur))
                    cur++;
                if (cur > hi)
                    break;
                uint32_t end = cur; // the specials all lie below 0x5D: no walk past it
                while (end < hi && end + 1 < 0x5D && !is_json_special(end + 1))
                    end++;
                if (end + 1 >= 0x5D)
                    end = hi;
                if (utf8_range(a, &al, cur, end, target))
                    return NONE_ST;
                cur = end + 1;
            }
        } else if (utf8_range(a, &al, lo, hi, target)) {
            return NONE_ST;
        }
    }
    if (al.start == NONE_ST) // the empty set: a state with no way on
        al.start = nfa_add(a, NFA_EPS, 0, 0, NONE_ST, NONE_ST);
    return al.start;
}

// Compile x so that its matches continue at target; returns the start state (NONE_ST on error).
static uint32_t to_nfa(nfa *a, const rx_node *x, uint32_t target, uint32_t depth) {
    if (depth > 10000) {
        rx_fail(a->c, TM_GUIDE_WHY_UNSUPPORTED, "guided: the constraint nests too deeply");
        return NONE_ST;
    }
    switch (x->kind) {
    case RX_SET:
        return set_to(a, x, target);
    case RX_BYTES:
        return bytes_to(a, x->bytes, x->n, target);
    case RX_EMPTY:
        return target;
    case RX_NONE:
        return nfa_add(a, NFA_EPS, 0, 0, NONE_ST, NONE_ST);
    case RX_CAT: {
        uint32_t next = target;
        for (uint32_t k = x->n; k-- > 0 && next != NONE_ST;)
            next = to_nfa(a, x->kid[k], next, depth + 1);
        return next;
    }
    case RX_ALT: {
        alts al = {.start = NONE_ST, .a = a};
        for (uint32_t k = x->n; k-- > 0;)
            if (alts_add(&al, to_nfa(a, x->kid[k], target, depth + 1)))
                return NONE_ST;
        return al.start == NONE_ST ? nfa_add(a, NFA_EPS, 0, 0, NONE_ST, NONE_ST) : al.start;
    }
    case RX_REP: {
        uint32_t next = target;
        if (x->max == RX_INF) {
            uint32_t loop = eps2(a, NONE_ST, target);
            if (loop == NONE_ST)
                return NONE_ST;
            uint32_t body = to_nfa(a, x->kid[0], loop, depth + 1);
            if (body == NONE_ST)
                return NONE_ST;
            a->st[loop].out = body;
            next = loop;
        } else {
            for (uint32_t k = x->min; k < x->max && next != NONE_ST; k++) {
                uint32_t body = to_nfa(a, x->kid[0], next, depth + 1);
                next = body == NONE_ST ? NONE_ST : eps2(a, body, target);
            }
        }
        for (uint32_t k = 0; k < x->min && next != NONE_ST; k++)
            next = to_nfa(a, x->kid[0], next, depth + 1);
        return next;
    }
    }
    return NONE_ST;
}

// ---- DFA ----

struct tm_dfa {
    uint32_t n_state; /* 0 dead, 1 start */
    uint32_t n_class; /* byte classes */
    uint8_t cls[256]; /* byte -> class */
    uint32_t *next;   /* [n_state][n_class] */
    uint8_t *accept;  /* [n_state] */
    uint8_t *final;   /* [n_state] accepting with no way on */
};

void tm_dfa_destroy(tm_dfa *d) {
    if (!d)
        return;
    tm_free(d->next);
    tm_free(d->accept);
    tm_free(d->final);
    tm_free(d);
}

uint32_t tm_dfa_start(const tm_dfa *d) { return d->n_state > 1 ? 1 : 0; }
uint32_t tm_dfa_n_states(const tm_dfa *d) { return d->n_state; }
tm_dfa_table_view tm_dfa_table(const tm_dfa *d) {
    return (tm_dfa_table_view){.next = d->next, .cls = d->cls, .n_class = d->n_class};
}
int tm_dfa_accepts(const tm_dfa *d, uint32_t q) { return q < d->n_state && d->accept[q]; }
int tm_dfa_is_final(const tm_dfa *d, uint32_t q) { return q < d->n_state && d->final[q]; }

uint32_t tm_dfa_walk(const tm_dfa *d, uint32_t q, const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n && q; i++)
        q = d->next[(size_t)q * d->n_class + d->cls[b[i]]];
    return q;
}

int tm_dfa_match(const tm_dfa *d, const void *p, size_t n) {
    return tm_dfa_accepts(d, tm_dfa_walk(d, tm_dfa_start(d), p, n));
}

typedef struct subset {
    uint32_t *set; /* NFA byte/match states (in no particular order) */
    uint32_t n;
} subset;

typedef struct builder {
    nfa *a;
    uint32_t *mark; /* [a->n] generation marks */
    uint32_t gen;
    uint32_t *stack, *tmp; /* [a->n] */
    subset *sets;          /* [n_dfa] */
    uint32_t n_dfa, cap_dfa;
    uint32_t *hash; /* open addressing: dfa id + 1, 0 empty */
    uint32_t n_hash;
    uint32_t *next; /* [cap_dfa][n_class] */
    uint32_t n_class;
    uint8_t cls[256]; /* byte -> class: the bytes no NFA range tells apart */
    uint8_t *accept;
    uint32_t match; /* the NFA's accept state */
    uint64_t work;  /* NFA states visited so far (bounded by RX_MAX_WORK) */
} builder;

// Epsilon closure of seeds[0, n) into b->tmp (its byte/match states, in visit order); returns its
// size. b->mark[s] == b->gen afterwards exactly for the states visited, which is how intern
// compares a stored set with this one without sorting either.
static uint32_t closure(builder *b, const uint32_t *seeds, uint32_t n) {
    nstate *st = b->a->st;
    b->gen++;
    uint32_t sp = 0, k = 0;
    for (uint32_t i = 0; i < n; i++)
        if (seeds[i] != NONE_ST && b->mark[seeds[i]] != b->gen)
            b->mark[seeds[i]] = b->gen, b->stack[sp++] = seeds[i];
    while (sp) {
        b->work++;
        uint32_t s = b->stack[--sp];
        if (st[s].type != NFA_EPS) {
            b->tmp[k++] = s;
            continue;
        }
        uint32_t o[2] = {st[s].out, st[s].out2};
        for (int j = 0; j < 2; j++)
            if (o[j] != NONE_ST && b->mark[o[j]] != b->gen)
                b->mark[o[j]] = b->gen, b->stack[sp++] = o[j];
    }
    return k;
}

// A hash of the set that does not depend on the order of its elements (a sum of mixed ids).
static uint64_t set_hash(const uint32_t *s, uint32_t n) {
    uint64_t h = 0x9e3779b97f4a7c15ull * (n + 1);
    for (uint32_t i = 0; i < n; i++) {
        uint64_t z = (s[i] + 1) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 31)) * 0x94d049bb133111ebull;
        h += z ^ (z >> 29);
    }
    return h ^ (h >> 32);
}

// 1 when the stored set s equals the closure just computed (b->tmp, n states): same size and
// every element visited by it (marked with the current generation).
static int same_as_closure(const builder *b, const subset *s, uint32_t n) {
    if (s->n != n)
        return 0;
    for (uint32_t i = 0; i < n; i++)
        if (b->mark[s->set[i]] != b->gen)
            return 0;
    return 1;
}

static int grow_hash(builder *b) {
    uint32_t nh = b->n_hash ? 2 * b->n_hash : 1024;
    uint32_t *h = tm_calloc(nh, sizeof(*h));
    if (!h)
        return -1;
    for (uint32_t i = 0; i < b->n_dfa; i++) {
        uint64_t k = set_hash(b->sets[i].set, b->sets[i].n) & (nh - 1);
        while (h[k])
            k = (k + 1) & (nh - 1);
        h[k] = i + 1;
    }
    tm_free(b->hash);
    b->hash = h, b->n_hash = nh;
    return 0;
}

// The DFA state of the set in b->tmp[0, n), created when new; NONE_ST on failure.
static uint32_t intern(builder *b, uint32_t n, uint32_t max_states) {
    if (n == 0)
        return 0;
    if (2 * (b->n_dfa + 1) > b->n_hash && grow_hash(b))
        goto nomem;
    uint64_t k = set_hash(b->tmp, n) & (b->n_hash - 1);
    while (b->hash[k]) {
        const subset *s = &b->sets[b->hash[k] - 1];
        if (same_as_closure(b, s, n))
            return b->hash[k] - 1;
        k = (k + 1) & (b->n_hash - 1);
    }
    if (b->n_dfa >= max_states) {
        rx_fail(b->a->c, TM_GUIDE_WHY_UNSUPPORTED,
                "guided: the constraint needs more than %u automaton states (lower maxLength, "
                "maxItems, {m,n} bounds or the number of alternatives)",
                max_states);
        return NONE_ST;
    }
    if (b->n_dfa == b->cap_dfa) {
        uint32_t cap = b->cap_dfa ? 2 * b->cap_dfa : 256;
        subset *ns = tm_realloc(b->sets, (size_t)cap * sizeof(*ns));
        if (ns)
            b->sets = ns;
        uint32_t *nx = ns ? tm_realloc(b->next, (size_t)cap * b->n_class * sizeof(*nx)) : NULL;
        if (nx)
            b->next = nx;
        uint8_t *na = nx ? tm_realloc(b->accept, cap) : NULL;
        if (!na)
            goto nomem;
        b->accept = na, b->cap_dfa = cap;
    }
    uint32_t *copy = tm_malloc((size_t)n * sizeof(uint32_t));
    if (!copy)
        goto nomem;
    memcpy(copy, b->tmp, n * sizeof(uint32_t));
    uint32_t id = b->n_dfa++;
    b->sets[id] = (subset){.set = copy, .n = n};
    b->hash[k] = id + 1;
    b->accept[id] = 0;
    for (uint32_t i = 0; i < n; i++)
        b->accept[id] |= copy[i] == b->match;
    memset(b->next + (size_t)id * b->n_class, 0, b->n_class * sizeof(uint32_t));
    return id;
nomem:
    rx_fail(b->a->c, TM_GUIDE_WHY_NONE, "guided: out of memory (DFA)");
    return NONE_ST;
}

static void builder_fini(builder *b) {
    for (uint32_t i = 0; i < b->n_dfa; i++)
        tm_free(b->sets[i].set);
    tm_free(b->sets);
    tm_free(b->hash);
    tm_free(b->next);
    tm_free(b->accept);
    tm_free(b->mark);
    tm_free(b->stack);
    tm_free(b->tmp);
}

// Cut the states that cannot reach acceptance and renumber: 0 dead, 1 start.
static tm_rc finish_dfa(builder *b, tm_dfa **out) {
    rx_ctx *c = b->a->c;
    const uint32_t n = b->n_dfa; // builder ids: 0 is the dead set, 1 the start
    uint8_t *live = tm_calloc(n ? n : 1, 1);
    uint32_t *map = tm_calloc(n ? n : 1, sizeof(*map));
    tm_dfa *d = tm_calloc(1, sizeof(*d));
    tm_rc rc = TM_OK;
    if (!live || !map || !d) {
        rx_fail(c, TM_GUIDE_WHY_NONE, "guided: out of memory (DFA)");
        rc = TM_E_NOMEM;
        goto out;
    }
    // backwards reachability from the accepting states: reverse edges in CSR form (runs of one
    // target in a row count once), then a worklist
    uint32_t *cnt = tm_calloc((size_t)n + 1, sizeof(uint32_t));
    uint32_t *stack = tm_malloc((size_t)(n ? n : 1) * sizeof(uint32_t));
    uint32_t *src = NULL;
    size_t n_edge = 0;
    const uint32_t nc = b->n_class;
    for (uint32_t i = 1; cnt && i < n; i++)
        for (uint32_t y = 0; y < nc; y++) {
            uint32_t t = b->next[(size_t)i * nc + y];
            if (t && (y == 0 || t != b->next[(size_t)i * nc + y - 1]))
                cnt[t + 1]++, n_edge++;
        }
    if (cnt)
        src = tm_malloc((n_edge ? n_edge : 1) * sizeof(uint32_t));
    if (!cnt || !stack || !src) {
        tm_free(cnt), tm_free(stack), tm_free(src);
        rx_fail(c, TM_GUIDE_WHY_NONE, "guided: out of memory (DFA)");
        rc = TM_E_NOMEM;
        goto out;
    }
    for (uint32_t i = 0; i < n; i++)
        cnt[i + 1] += cnt[i];
    for (uint32_t i = 1; i < n; i++)
        for (uint32_t y = 0; y < nc; y++) {
            uint32_t t = b->next[(size_t)i * nc + y];
            if (t && (y == 0 || t != b->next[(size_t)i * nc + y - 1]))
                src[cnt[t]++] = i; // cnt[t] ends at the start of t + 1's sources
        }
    uint32_t sp = 0;
    for (uint32_t i = 1; i < n; i++)
        if (b->accept[i])
            live[i] = 1, stack[sp++] = i;
    while (sp) {
        uint32_t t = stack[--sp];
        for (uint32_t k = t ? cnt[t - 1] : 0; k < cnt[t]; k++)
            if (!live[src[k]])
                live[src[k]] = 1, stack[sp++] = src[k];
    }
    tm_free(cnt), tm_free(stack), tm_free(src);
    if (n < 2 || !live[1]) {
        rx_fail(c, TM_GUIDE_WHY_INVALID,
                "guided: no output satisfies the constraint (an empty language; a recursive $ref "
                "with no way out within %d levels?)",
                TM_GUIDE_REF_DEPTH);
        rc = TM_E_INVAL;
        goto out;
    }
    uint32_t m = 1;
    for (uint32_t i = 1; i < n; i++)
        map[i] = live[i] ? m++ : 0;
    d->n_state = m;
    d->n_class = nc;
    memcpy(d->cls, b->cls, sizeof(d->cls));
    d->next = tm_calloc((size_t)m * nc, sizeof(uint32_t));
    d->accept = tm_calloc(m, 1);
    d->final = tm_calloc(m, 1);
    if (!d->next || !d->accept || !d->final) {
        rx_fail(c, TM_GUIDE_WHY_NONE, "guided: out of memory (DFA of %u states)", m);
        rc = TM_E_NOMEM;
        goto out;
    }
    for (uint32_t i = 1; i < n; i++) {
        if (!live[i])
            continue;
        uint32_t q = map[i];
        int any = 0;
        for (uint32_t y = 0; y < nc; y++) {
            uint32_t t = map[b->next[(size_t)i * nc + y]];
            d->next[(size_t)q * nc + y] = t;
            any |= t != 0;
        }
        d->accept[q] = b->accept[i];
        d->final[q] = b->accept[i] && !any;
    }
    *out = d, d = NULL;
out:
    tm_dfa_destroy(d);
    tm_free(live);
    tm_free(map);
    return rc;
}

tm_rc rx_compile(rx_ctx *c, const rx_node *root, uint32_t max_states, tm_dfa **out) {
    *out = NULL;
    if (c->err->rc)
        return c->err->rc;
    if (!max_states)
        max_states = TM_GUIDE_MAX_STATES;
    const uint64_t max_work = c->max_work ? c->max_work : RX_MAX_WORK;
    nfa a = {.c = c};
    builder b = {.a = &a};
    uint32_t match = nfa_add(&a, NFA_MATCH, 0, 0, NONE_ST, NONE_ST);
    uint32_t start = match == NONE_ST ? NONE_ST : to_nfa(&a, root, match, 0);
    if (start == NONE_ST)
        goto fail;
    b.match = match;
    b.mark = tm_calloc(a.n, sizeof(uint32_t));
    b.stack = tm_malloc((size_t)a.n * sizeof(uint32_t));
    b.tmp = tm_malloc((size_t)a.n * sizeof(uint32_t));
    uint32_t *seeds = tm_malloc((size_t)a.n * sizeof(uint32_t));
    uint32_t cuts[257];
    if (!b.mark || !b.stack || !b.tmp || !seeds) {
        tm_free(seeds);
        rx_fail(c, TM_GUIDE_WHY_NONE, "guided: out of memory (NFA of %u states)", a.n);
        goto fail;
    }
    // Byte classes: runs of bytes between the bounds of every byte range of the NFA lead to the
    // same states from every DFA state, so a row needs one entry per run.
    {
        uint8_t cut[257] = {0};
        for (uint32_t i = 0; i < a.n; i++)
            if (a.st[i].type == NFA_BYTE)
                cut[a.st[i].lo] = cut[(uint32_t)a.st[i].hi + 1] = 1;
        b.n_class = 0;
        for (uint32_t y = 0; y < 256; y++) {
            b.n_class += y > 0 && cut[y];
            b.cls[y] = (uint8_t)b.n_class;
        }
        b.n_class++;
    }
    // id 0: the dead (empty) set, 1: the start
    b.sets = tm_malloc(256 * sizeof(*b.sets));
    b.next = tm_malloc((size_t)256 * b.n_class * sizeof(uint32_t));
    b.accept = tm_malloc(256);
    int bad = !b.sets || !b.next || !b.accept;
    if (bad) {
        rx_fail(c, TM_GUIDE_WHY_NONE, "guided: out of memory (DFA)");
    } else {
        b.cap_dfa = 256;
        b.sets[0] = (subset){.set = NULL, .n = 0};
        b.accept[0] = 0;
        memset(b.next, 0, b.n_class * sizeof(uint32_t));
        b.n_dfa = 1;
    }
    if (!bad) {
        uint32_t k = closure(&b, &start, 1);
        bad = k == 0 ? (rx_fail(c, TM_GUIDE_WHY_INVALID,
                                "guided: no output satisfies the constraint (an empty language)"),
                        1)
                     : intern(&b, k, max_states) == NONE_ST;
    }
    // hot loop of compilation: every DFA state, every distinct byte interval of its ranges
    for (uint32_t q = 1; !bad && q < b.n_dfa; q++) {
        b.work += 64; // the fixed cost of a state: its cut table, row and hash entry
        uint8_t cut[257] = {0};
        cut[0] = cut[256] = 1;
        for (uint32_t i = 0; i < b.sets[q].n; i++) {
            const nstate *s = &a.st[b.sets[q].set[i]];
            if (s->type == NFA_BYTE)
                cut[s->lo] = cut[(uint32_t)s->hi + 1] = 1;
        }
        uint32_t nc = 0;
        for (uint32_t y = 0; y <= 256; y++)
            if (cut[y])
                cuts[nc++] = y;
        for (uint32_t j = 0; j + 1 < nc && !bad; j++) {
            uint32_t lo = cuts[j], hi = cuts[j + 1];
            uint32_t ns = 0;
            for (uint32_t i = 0; i < b.sets[q].n; i++) {
                const nstate *s = &a.st[b.sets[q].set[i]];
                if (s->type == NFA_BYTE && s->lo <= lo && s->hi >= lo)
                    seeds[ns++] = s->out;
            }
            if (!ns)
                continue;
            uint32_t k = closure(&b, seeds, ns);
            b.work += b.sets[q].n;
            if (b.work > max_work) {
                rx_fail(c, TM_GUIDE_WHY_UNSUPPORTED,
                        "guided: the constraint is too complex to compile (over %llu automaton "
                        "steps after %u states; simplify nested repetitions or alternatives)",
                        (unsigned long long)max_work, b.n_dfa);
                bad = 1;
                break;
            }
            uint32_t t = intern(&b, k, max_states);
            if (t == NONE_ST) {
                bad = 1;
                break;
            }
            for (uint32_t y = lo; y < hi; y++) // classes refine every state's cuts
                b.next[(size_t)q * b.n_class + b.cls[y]] = t;
        }
    }
    tm_free(seeds);
    if (bad)
        goto fail;
    tm_rc rc = finish_dfa(&b, out);
    builder_fini(&b);
    tm_free(a.st);
    return rc;
fail:
    builder_fini(&b);
    tm_free(a.st);
    if (!c->err->rc)
        rx_fail(c, TM_GUIDE_WHY_NONE, "guided: compilation failed");
    return c->err->rc;
}
