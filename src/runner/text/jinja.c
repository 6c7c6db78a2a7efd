/* runner/text/jinja.c - a Jinja subset for chat templates (see jinja.h). Three stages: the template
 * is cut into text and tags (whitespace control, trim_blocks and lstrip_blocks applied to the
 * text), each tag's content is lexed into tokens, and a recursive-descent parser builds a tree of
 * nodes and expressions in the template's arena. Rendering walks the tree with values allocated
 * from a per-render arena that is freed as a whole at the end, so no value has an owner to track.
 * Limits, each a TM_E_INVAL "template: ..." error (a template_error record, never the end of a
 * job): MAX_DEPTH nesting (parse, eval, and the printing and comparing of nested values),
 * MAX_STEPS evaluation steps (every loop iteration is one), MAX_OUT output bytes, MAX_ARENA bytes
 * of values (every string, list and dict a template makes, so it also bounds their count and the
 * parse tree), MAX_STR bytes for one string built outside the arena (printing a value, replace,
 * tojson), MAX_RANGE items from range(). So one render holds at most about MAX_ARENA + MAX_OUT +
 * MAX_DEPTH * MAX_STR bytes, whatever the template; TM_E_NOMEM means the heap itself failed. */
#include "runner/text/jinja.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"

enum {
    MAX_DEPTH = 64,
    MAX_STEPS = 4000000,
    MAX_OUT = 16u << 20,
    MAX_ARENA = 64u << 20,
    MAX_STR = 16u << 20,
    MAX_RANGE = 100000,
    MAX_WORK = 1u << 30, /* bytes compared, searched or copied by string operations */
    BLK_BYTES = 16u << 10,
};

// ---- arena ----

typedef struct blk {
    struct blk *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
} blk;

typedef struct arena {
    blk *head;
    size_t total;
    int over; /* an allocation was refused for MAX_ARENA (not for want of heap) */
} arena;

static void *aalloc(arena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (!a->head || a->head->cap - a->head->used < n) {
        size_t cap = n > BLK_BYTES ? n : BLK_BYTES;
        if (cap > MAX_ARENA || a->total + cap > MAX_ARENA) {
            a->over = 1;
            return NULL;
        }
        blk *b = tm_malloc(sizeof(blk) + cap);
        if (!b)
            return NULL;
        b->next = a->head;
        b->used = 0;
        b->cap = cap;
        a->head = b;
        a->total += cap;
    }
    void *p = a->head->data + a->head->used;
    a->head->used += n;
    memset(p, 0, n);
    return p;
}

static void arena_free(arena *a) {
    while (a->head) {
        blk *b = a->head;
        a->head = b->next;
        tm_free(b);
    }
    a->total = 0;
}

// ---- tokens ----

typedef enum tk {
    TK_END = 0, /* end of a tag's content */
    TK_NAME,
    TK_STR,
    TK_INT,
    TK_OP, /* punctuation / operator, text in s */
} tk;

typedef struct token {
    tk kind;
    const char *s; /* NAME/OP: text; STR: decoded string (arena) */
    size_t n;
    long long i;
    uint32_t line;
} token;

// ---- tree ----

typedef enum ek {
    E_STR,
    E_INT,
    E_BOOL,
    E_NONE,
    E_NAME,
    E_ATTR,
    E_INDEX,
    E_SLICE,
    E_CALL,
    E_FILTER,
    E_TEST,
    E_NOT,
    E_NEG,
    E_BIN,
    E_COND,
    E_LIST,
    E_DICT,
} ek;

typedef struct expr expr;
struct expr {
    ek kind;
    const char *s; /* STR value, NAME / ATTR / FILTER / TEST name, BIN operator */
    size_t n;
    long long i; /* INT, BOOL; TEST: negated */
    expr *a, *b, *c;
    expr **args; /* CALL / FILTER / TEST args, LIST items, DICT values */
    expr **keys; /* DICT keys; CALL: keyword names as E_STR (NULL = positional) */
    uint32_t n_args;
    uint32_t line;
};

typedef enum nk { N_TEXT, N_OUT, N_IF, N_FOR, N_SET } nk;

typedef struct node node;
struct node {
    nk kind;
    node *next;
    const char *s; /* TEXT; SET: name; FOR: first target */
    size_t n;
    const char *s2; /* SET: attribute (ns.attr) or NULL; FOR: second target or NULL */
    expr *e;        /* OUT / SET value; IF: condition; FOR: iterable */
    node *body;     /* IF: then; FOR: body */
    node *alt;      /* IF: else branch (an IF node for elif, or a list); FOR: else */
    uint32_t line;
};

struct tm_jinja {
    arena ar;
    node *root;
    uint64_t parse_steps; /* bytes the parser visited (split and lex); tm_jinja_parse_steps */
};

// ---- parser ----

typedef struct item {
    int kind; /* 0 text, 1 {{ }}, 2 {% %} */
    const char *s;
    size_t n;
    uint32_t line;
} item;

typedef struct parser {
    arena *ar;
    const char *src;
    size_t len;
    item *items;
    size_t n_items, cap_items, at; /* at: current item */
    token *toks;                   /* the current tag's tokens, TK_END-terminated */
    size_t n_toks, cap_toks, pos;
    tm_err *err;
    int depth;       /* expressions being parsed, one inside the other */
    int block_depth; /* blocks (if, for) open */
    int failed;
    const char *line_ptr; /* split's line count is of src[0, line_ptr): it only moves forward */
    uint32_t line_no;     /* 1 + the newlines before line_ptr */
    uint64_t steps;       /* bytes visited: each byte of src once by split, once by lex */
} parser;

static tm_rc perr(parser *p, uint32_t line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static tm_rc perr(parser *p, uint32_t line, const char *fmt, ...) {
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    p->failed = 1;
    return TM_ERR(p->err, TM_E_INVAL, "template: %s at line %u", msg, line);
}

// The line of q, counted on from the last call's position: split asks in source order, so the
// whole source is counted once (issue 35: counting from the start for every tag made a template
// of n tags cost n times its size).
static uint32_t line_at(parser *p, const char *q) {
    if (q < p->line_ptr) { // not in order (never from split): count from the start
        p->line_ptr = p->src;
        p->line_no = 1;
    }
    for (; p->line_ptr < q; p->line_ptr++, p->steps++)
        p->line_no += *p->line_ptr == '\n';
    return p->line_no;
}

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static tm_rc add_item(parser *p, int kind, const char *s, size_t n) {
    if (p->n_items == p->cap_items) {
        size_t cap = p->cap_items ? 2 * p->cap_items : 64;
        item *v = tm_realloc(p->items, cap * sizeof(*v));
        if (!v)
            return TM_ERR(p->err, TM_E_NOMEM, "template items");
        p->items = v;
        p->cap_items = cap;
    }
    p->items[p->n_items++] = (item){kind, s, n, line_at(p, s)};
    return TM_OK;
}

// Cut the source into text and tags, applying -, trim_blocks and lstrip_blocks to the text.
static tm_rc split(parser *p) {
    const char *s = p->src, *end = s + p->len, *text = s;
    int strip_next = 0; /* 1: previous tag had -%}: strip leading whitespace; 2: trim_blocks */
    while (text <= end) {
        const char *t = text;
        while (t + 1 < end && !(t[0] == '{' && (t[1] == '{' || t[1] == '%' || t[1] == '#')))
            t++;
        if (t + 1 >= end)
            t = end;
        p->steps += (size_t)(t - text);
        // the text [text, t)
        const char *a = text, *b = t;
        if (strip_next == 1)
            while (a < b && is_space(*a))
                a++;
        else if (strip_next == 2 && a < b && *a == '\n')
            a++;
        else if (strip_next == 2 && b - a >= 2 && a[0] == '\r' && a[1] == '\n')
            a += 2;
        if (t < end) {
            char kind = t[1];
            if (t + 2 < end && t[2] == '-') {
                while (b > a && is_space(b[-1]))
                    b--;
            } else if (kind != '{' && !(t + 2 < end && t[2] == '+')) { // lstrip_blocks
                const char *q = b;
                while (q > a && (q[-1] == ' ' || q[-1] == '\t'))
                    q--;
                if (q == p->src || (q > p->src && q[-1] == '\n'))
                    if (q >= a)
                        b = q;
            }
        }
        if (b > a) {
            tm_rc rc = add_item(p, 0, a, (size_t)(b - a));
            if (rc)
                return rc;
        }
        if (t >= end)
            break;
        char kind = t[1];
        const char *close = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
        const char *c = t + 2;
        while (c + 1 < end && !(c[0] == close[0] && c[1] == close[1]))
            c++;
        p->steps += (size_t)(c - t);
        if (c + 1 >= end)
            return perr(p, line_at(p, t), "unclosed tag");
        const char *in = t + 2, *in_end = c;
        if (in < in_end && (*in == '-' || *in == '+'))
            in++;
        int rstrip = in_end > in && in_end[-1] == '-';
        if (rstrip)
            in_end--;
        if (kind != '#') {
            tm_rc rc = add_item(p, kind == '{' ? 1 : 2, in, (size_t)(in_end - in));
            if (rc)
                return rc;
        }
        strip_next = rstrip ? 1 : (kind != '{' ? 2 : 0);
        text = c + 2;
    }
    return TM_OK;
}

static void *tree_alloc(parser *p, size_t n);

static tm_rc push_tok(parser *p, token t) {
    if (p->n_toks == p->cap_toks) {
        size_t cap = p->cap_toks ? 2 * p->cap_toks : 64;
        token *v = tm_realloc(p->toks, cap * sizeof(*v));
        if (!v)
            return TM_ERR(p->err, TM_E_NOMEM, "template tokens");
        p->toks = v;
        p->cap_toks = cap;
    }
    p->toks[p->n_toks++] = t;
    return TM_OK;
}

// Lex item it's content into p->toks.
static tm_rc lex(parser *p, const item *it) {
    const char *s = it->s, *e = it->s + it->n;
    uint32_t line = it->line;
    p->steps += it->n;
    p->n_toks = 0;
    p->pos = 0;
    tm_rc rc = TM_OK;
    while (s < e && rc == TM_OK) {
        char c = *s;
        if (is_space(c)) {
            line += c == '\n';
            s++;
        } else if (c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
            const char *b = s;
            while (s < e && (*s == '_' || (*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') ||
                             (*s >= '0' && *s <= '9')))
                s++;
            rc = push_tok(p, (token){TK_NAME, b, (size_t)(s - b), 0, line});
        } else if (c >= '0' && c <= '9') {
            long long v = 0;
            while (s < e && *s >= '0' && *s <= '9') {
                if (v > 100000000000000000LL)
                    return perr(p, line, "integer too large");
                v = v * 10 + (*s++ - '0');
            }
            if (s < e && *s == '.')
                return perr(p, line, "floats are not supported");
            rc = push_tok(p, (token){TK_INT, NULL, 0, v, line});
        } else if (c == '\'' || c == '"') {
            const char *b = ++s;
            size_t n = 0;
            while (s < e && *s != c) { // first pass: length
                if (*s == '\\' && s + 1 < e)
                    s++;
                s++;
                n++;
            }
            if (s >= e)
                return perr(p, line, "unterminated string");
            char *d = tree_alloc(p, n + 1);
            if (!d)
                return p->err->rc;
            size_t k = 0;
            for (const char *q = b; q < s; q++) {
                char ch = *q;
                if (ch == '\\' && q + 1 < s) {
                    ch = *++q;
                    ch = ch == 'n' ? '\n' : ch == 't' ? '\t' : ch == 'r' ? '\r' : ch;
                }
                line += ch == '\n';
                d[k++] = ch;
            }
            s++;
            rc = push_tok(p, (token){TK_STR, d, k, 0, line});
        } else {
            static const char *const ops2[] = {"==", "!=", "<=", ">=", "//", "**", NULL};
            size_t n = 1;
            for (int i = 0; ops2[i]; i++)
                if (s + 1 < e && s[0] == ops2[i][0] && s[1] == ops2[i][1])
                    n = 2;
            if (n == 1 && !strchr("()[]{},.:|~+-*/%<>=", c))
                return perr(p, line, "unexpected character '%c'", c);
            rc = push_tok(p, (token){TK_OP, s, n, 0, line});
            s += n;
        }
    }
    if (rc == TM_OK)
        rc = push_tok(p, (token){TK_END, "", 0, 0, line});
    return rc;
}

static token *peek(parser *p) { return &p->toks[p->pos]; }
static token *next_tok(parser *p) {
    token *t = &p->toks[p->pos];
    if (t->kind != TK_END)
        p->pos++;
    return t;
}
static int tok_is(const token *t, tk kind, const char *s) {
    return t->kind == kind && t->n == strlen(s) && memcmp(t->s, s, t->n) == 0;
}
static int accept(parser *p, tk kind, const char *s) {
    if (!tok_is(peek(p), kind, s))
        return 0;
    p->pos++;
    return 1;
}
static tm_rc expect(parser *p, tk kind, const char *s) {
    if (accept(p, kind, s))
        return TM_OK;
    token *t = peek(p);
    return perr(p, t->line, "expected '%s', got '%.*s'", s, (int)(t->kind == TK_END ? 3 : t->n),
                t->kind == TK_END ? "end"
                : t->s            ? t->s
                                  : "");
}

// n zeroed bytes of the parse tree; NULL (the parse failed) when out of memory.
static void *tree_alloc(parser *p, size_t n) {
    void *v = aalloc(p->ar, n);
    if (!v) {
        if (p->ar->over)
            TM_ERR(p->err, TM_E_INVAL, "template: parse tree over %u MiB", MAX_ARENA >> 20);
        else
            TM_ERR(p->err, TM_E_NOMEM, "template tree");
        p->failed = 1;
    }
    return v;
}

static expr *mk(parser *p, ek kind, uint32_t line) {
    expr *x = tree_alloc(p, sizeof(*x));
    if (!x)
        return NULL;
    x->kind = kind;
    x->line = line;
    return x;
}

static expr *parse_expr(parser *p);

// Comma-separated expressions up to the closing op (consumed). Keyword args (name=value) fill
// keys when kw is set.
static int parse_args(parser *p, const char *close, expr *x, int kw) {
    expr *tmp[64], *tk_[64];
    uint32_t n = 0;
    while (!accept(p, TK_OP, close)) {
        if (n && expect(p, TK_OP, ","))
            return -1;
        if (n == 64) {
            perr(p, peek(p)->line, "more than 64 arguments");
            return -1;
        }
        if (accept(p, TK_OP, close))
            break; // trailing comma
        tk_[n] = NULL;
        if (kw && peek(p)->kind == TK_NAME && tok_is(&p->toks[p->pos + 1], TK_OP, "=")) {
            token *t = next_tok(p);
            p->pos++;
            tk_[n] = mk(p, E_STR, t->line);
            if (!tk_[n])
                return -1;
            tk_[n]->s = t->s;
            tk_[n]->n = t->n;
        }
        tmp[n] = parse_expr(p);
        if (!tmp[n])
            return -1;
        n++;
    }
    x->args = tree_alloc(p, (n ? n : 1) * sizeof(expr *));
    x->keys = x->args ? tree_alloc(p, (n ? n : 1) * sizeof(expr *)) : NULL;
    if (!x->args || !x->keys)
        return -1;
    memcpy(x->args, tmp, n * sizeof(expr *));
    memcpy(x->keys, tk_, n * sizeof(expr *));
    x->n_args = n;
    return 0;
}

static expr *parse_primary(parser *p) {
    token *t = next_tok(p);
    expr *x = NULL;
    if (t->kind == TK_STR) {
        x = mk(p, E_STR, t->line);
        if (x)
            x->s = t->s, x->n = t->n;
        while (x && peek(p)->kind == TK_STR) { // adjacent literals concatenate
            token *u = next_tok(p);
            char *d = tree_alloc(p, x->n + u->n + 1);
            if (!d)
                return NULL;
            memcpy(d, x->s, x->n);
            memcpy(d + x->n, u->s, u->n);
            x->s = d;
            x->n += u->n;
        }
    } else if (t->kind == TK_INT) {
        x = mk(p, E_INT, t->line);
        if (x)
            x->i = t->i;
    } else if (t->kind == TK_NAME) {
        if (tok_is(t, TK_NAME, "true") || tok_is(t, TK_NAME, "True") ||
            tok_is(t, TK_NAME, "false") || tok_is(t, TK_NAME, "False")) {
            x = mk(p, E_BOOL, t->line);
            if (x)
                x->i = t->s[0] == 't' || t->s[0] == 'T';
        } else if (tok_is(t, TK_NAME, "none") || tok_is(t, TK_NAME, "None")) {
            x = mk(p, E_NONE, t->line);
        } else {
            x = mk(p, E_NAME, t->line);
            if (x)
                x->s = t->s, x->n = t->n;
        }
    } else if (tok_is(t, TK_OP, "(")) {
        x = parse_expr(p);
        if (x && expect(p, TK_OP, ")"))
            return NULL;
    } else if (tok_is(t, TK_OP, "[")) {
        x = mk(p, E_LIST, t->line);
        if (x && parse_args(p, "]", x, 0))
            return NULL;
    } else if (tok_is(t, TK_OP, "{")) {
        x = mk(p, E_DICT, t->line);
        expr *ks[64], *vs[64];
        uint32_t n = 0;
        while (x && !accept(p, TK_OP, "}")) {
            if (n && expect(p, TK_OP, ","))
                return NULL;
            if (accept(p, TK_OP, "}"))
                break;
            if (n == 64) {
                perr(p, t->line, "dict literal over 64 items");
                return NULL;
            }
            ks[n] = parse_expr(p);
            if (!ks[n] || expect(p, TK_OP, ":"))
                return NULL;
            vs[n] = parse_expr(p);
            if (!vs[n])
                return NULL;
            n++;
        }
        if (x) {
            x->keys = tree_alloc(p, (n + 1) * sizeof(expr *));
            x->args = x->keys ? tree_alloc(p, (n + 1) * sizeof(expr *)) : NULL;
            if (!x->keys || !x->args)
                return NULL;
            memcpy(x->keys, ks, n * sizeof(expr *));
            memcpy(x->args, vs, n * sizeof(expr *));
            x->n_args = n;
        }
    } else {
        perr(p, t->line, "unexpected '%.*s'", (int)(t->kind == TK_END ? 3 : t->n),
             t->kind == TK_END ? "end" : t->s);
        return NULL;
    }
    return x;
}

static expr *parse_postfix(parser *p) {
    expr *x = parse_primary(p);
    while (x) {
        token *t = peek(p);
        if (accept(p, TK_OP, ".")) {
            token *name = next_tok(p);
            if (name->kind != TK_NAME) {
                perr(p, t->line, "expected a name after '.'");
                return NULL;
            }
            expr *y = mk(p, E_ATTR, t->line);
            if (!y)
                return NULL;
            y->a = x, y->s = name->s, y->n = name->n;
            x = y;
        } else if (accept(p, TK_OP, "[")) {
            expr *lo = NULL, *hi = NULL;
            int slice = 0;
            if (!tok_is(peek(p), TK_OP, ":")) {
                lo = parse_expr(p);
                if (!lo)
                    return NULL;
            }
            if (accept(p, TK_OP, ":")) {
                slice = 1;
                if (!tok_is(peek(p), TK_OP, "]")) {
                    hi = parse_expr(p);
                    if (!hi)
                        return NULL;
                }
            }
            if (expect(p, TK_OP, "]"))
                return NULL;
            expr *y = mk(p, slice ? E_SLICE : E_INDEX, t->line);
            if (!y)
                return NULL;
            y->a = x, y->b = lo, y->c = hi;
            x = y;
        } else if (accept(p, TK_OP, "(")) {
            expr *y = mk(p, E_CALL, t->line);
            if (!y)
                return NULL;
            y->a = x;
            if (parse_args(p, ")", y, 1))
                return NULL;
            x = y;
        } else if (tok_is(t, TK_OP, "|") || tok_is(t, TK_NAME, "is")) {
            int is_test = t->kind == TK_NAME;
            p->pos++;
            int neg = is_test && accept(p, TK_NAME, "not");
            token *name = next_tok(p);
            if (name->kind != TK_NAME && !(is_test && tok_is(name, TK_NAME, "none"))) {
                perr(p, t->line, "expected a %s name", is_test ? "test" : "filter");
                return NULL;
            }
            expr *y = mk(p, is_test ? E_TEST : E_FILTER, t->line);
            if (!y)
                return NULL;
            y->a = x, y->s = name->s, y->n = name->n, y->i = neg;
            if (accept(p, TK_OP, "(")) {
                if (parse_args(p, ")", y, 1))
                    return NULL;
            }
            x = y;
        } else {
            break;
        }
    }
    return x;
}

static expr *parse_unary(parser *p) {
    token *t = peek(p);
    if (accept(p, TK_OP, "-")) {
        expr *x = mk(p, E_NEG, t->line);
        if (x && !(x->a = parse_unary(p)))
            return NULL;
        return x;
    }
    return parse_postfix(p);
}

static expr *bin(parser *p, const char *op, size_t n, expr *a, expr *b, uint32_t line) {
    if (!a || !b)
        return NULL;
    expr *x = mk(p, E_BIN, line);
    if (x)
        x->s = op, x->n = n, x->a = a, x->b = b;
    return x;
}

static expr *parse_math2(parser *p) {
    expr *x = parse_unary(p);
    for (;;) {
        token *t = peek(p);
        if (!x || t->kind != TK_OP ||
            !(tok_is(t, TK_OP, "*") || tok_is(t, TK_OP, "/") || tok_is(t, TK_OP, "//") ||
              tok_is(t, TK_OP, "%")))
            return x;
        p->pos++;
        x = bin(p, t->s, t->n, x, parse_unary(p), t->line);
    }
}

static expr *parse_concat(parser *p) {
    expr *x = parse_math2(p);
    for (;;) {
        token *t = peek(p);
        if (!x || !tok_is(t, TK_OP, "~"))
            return x;
        p->pos++;
        x = bin(p, t->s, t->n, x, parse_math2(p), t->line);
    }
}

static expr *parse_math1(parser *p) {
    expr *x = parse_concat(p);
    for (;;) {
        token *t = peek(p);
        if (!x || !(tok_is(t, TK_OP, "+") || tok_is(t, TK_OP, "-")))
            return x;
        p->pos++;
        x = bin(p, t->s, t->n, x, parse_concat(p), t->line);
    }
}

static expr *parse_compare(parser *p) {
    expr *x = parse_math1(p);
    for (;;) {
        token *t = peek(p);
        static const char *const ops[] = {"==", "!=", "<", ">", "<=", ">=", NULL};
        int hit = 0;
        for (int i = 0; ops[i] && !hit; i++)
            hit = tok_is(t, TK_OP, ops[i]);
        if (!x)
            return NULL;
        if (hit) {
            p->pos++;
            x = bin(p, t->s, t->n, x, parse_math1(p), t->line);
        } else if (tok_is(t, TK_NAME, "in")) {
            p->pos++;
            x = bin(p, "in", 2, x, parse_math1(p), t->line);
        } else if (tok_is(t, TK_NAME, "not") && tok_is(&p->toks[p->pos + 1], TK_NAME, "in")) {
            p->pos += 2;
            x = bin(p, "notin", 5, x, parse_math1(p), t->line);
        } else {
            return x;
        }
    }
}

static expr *parse_not(parser *p) {
    token *t = peek(p);
    if (accept(p, TK_NAME, "not")) {
        expr *x = mk(p, E_NOT, t->line);
        if (x && !(x->a = parse_not(p)))
            return NULL;
        return x;
    }
    return parse_compare(p);
}

static expr *parse_and(parser *p) {
    expr *x = parse_not(p);
    for (;;) {
        token *t = peek(p);
        if (!x || !accept(p, TK_NAME, "and"))
            return x;
        x = bin(p, "and", 3, x, parse_not(p), t->line);
    }
}

static expr *parse_or(parser *p) {
    expr *x = parse_and(p);
    for (;;) {
        token *t = peek(p);
        if (!x || !accept(p, TK_NAME, "or"))
            return x;
        x = bin(p, "or", 2, x, parse_and(p), t->line);
    }
}

static expr *parse_expr(parser *p) {
    if (++p->depth > MAX_DEPTH) {
        perr(p, peek(p)->line, "expression nested deeper than %d", MAX_DEPTH);
        return NULL;
    }
    expr *x = parse_or(p);
    token *t = peek(p);
    if (x && accept(p, TK_NAME, "if")) {
        expr *y = mk(p, E_COND, t->line);
        if (!y || !(y->a = parse_or(p)))
            return NULL;
        y->b = x;
        if (accept(p, TK_NAME, "else") && !(y->c = parse_expr(p)))
            return NULL;
        x = y;
    }
    p->depth--;
    return x;
}

static node *mknode(parser *p, nk kind, uint32_t line) {
    node *n = tree_alloc(p, sizeof(*n));
    if (!n)
        return NULL;
    n->kind = kind;
    n->line = line;
    return n;
}

// Parse items into a node list until a block tag whose first word is one of stop (space
// separated); that word is left in *stop_word (the tag's tokens stay lexed, pos after the word).
static node *parse_body(parser *p, const char *stop, char *stop_word, size_t cap);

static int end_expr(parser *p) {
    token *t = peek(p);
    if (t->kind == TK_END)
        return 0;
    perr(p, t->line, "unexpected '%.*s' at the end of a tag", (int)t->n, t->s ? t->s : "");
    return -1;
}

// The rest of an if or for block after its body, which stopped at word w: an optional
// {% else %} body into n->alt, up to the block's end tag (end, "endif" or "endfor"). n, or NULL.
static node *parse_else_end(parser *p, node *n, const char *w, const char *end) {
    if (strcmp(w, "else") == 0) {
        char w_end[16];
        if (end_expr(p))
            return NULL;
        n->alt = parse_body(p, end, w_end, sizeof(w_end));
        if (p->failed)
            return NULL;
    }
    return end_expr(p) ? NULL : n;
}

static node *parse_if(parser *p, uint32_t line) {
    node *n = mknode(p, N_IF, line);
    if (!n || !(n->e = parse_expr(p)) || end_expr(p))
        return NULL;
    char w[16];
    n->body = parse_body(p, "elif else endif", w, sizeof(w));
    if (p->failed)
        return NULL;
    if (strcmp(w, "elif") == 0) {
        n->alt = parse_if(p, p->items[p->at - 1].line);
        return p->failed ? NULL : n;
    }
    return parse_else_end(p, n, w, "endif");
}

// for's loop variables or set's target: a name into n->s, then, after the operator sep (for's
// ",", set's "."), an optional second name into n->s2 (NUL-terminated, in the arena). what1 and
// what2 say what each name is, for the errors. 0, or -1 (the parse failed).
static int parse_target(parser *p, node *n, uint32_t line, const char *sep, const char *what1,
                        const char *what2) {
    const char *stmt = n->kind == N_FOR ? "for" : "set";
    token *a = next_tok(p);
    if (a->kind != TK_NAME) {
        perr(p, line, "%s: expected %s", stmt, what1);
        return -1;
    }
    n->s = a->s, n->n = a->n;
    if (!accept(p, TK_OP, sep))
        return 0;
    token *b = next_tok(p);
    if (b->kind != TK_NAME) {
        perr(p, line, "%s: expected %s", stmt, what2);
        return -1;
    }
    char *s2 = tree_alloc(p, b->n + 1);
    if (!s2)
        return -1;
    memcpy(s2, b->s, b->n);
    n->s2 = s2;
    return 0;
}

static node *parse_stmt(parser *p, const token *kw, uint32_t line) {
    if (tok_is(kw, TK_NAME, "if"))
        return parse_if(p, line);
    if (tok_is(kw, TK_NAME, "for")) {
        node *n = mknode(p, N_FOR, line);
        if (!n || parse_target(p, n, line, ",", "a loop variable", "a second loop variable"))
            return NULL;
        if (expect(p, TK_NAME, "in") || !(n->e = parse_or(p)))
            return NULL;
        if (tok_is(peek(p), TK_NAME, "if")) {
            perr(p, line, "for ... if filters are not supported");
            return NULL;
        }
        if (end_expr(p))
            return NULL;
        char w[16];
        n->body = parse_body(p, "else endfor", w, sizeof(w));
        if (p->failed)
            return NULL;
        return parse_else_end(p, n, w, "endfor");
    }
    if (tok_is(kw, TK_NAME, "set")) {
        node *n = mknode(p, N_SET, line);
        if (!n || parse_target(p, n, line, ".", "a name", "an attribute name"))
            return NULL;
        if (!tok_is(peek(p), TK_OP, "=")) {
            perr(p, line, "set blocks ({%% set x %%}...{%% endset %%}) are not supported");
            return NULL;
        }
        p->pos++;
        if (!(n->e = parse_expr(p)) || end_expr(p))
            return NULL;
        return n;
    }
    perr(p, line, "'%.*s' statements are not supported", (int)(kw->n ? kw->n : 3),
         kw->n ? kw->s : "end");
    return NULL;
}

static node *parse_body(parser *p, const char *stop, char *stop_word, size_t cap) {
    node *head = NULL, **tail = &head;
    if (++p->block_depth > MAX_DEPTH + 1) { // the template itself is not a block
        perr(p, p->at ? p->items[p->at - 1].line : 1, "blocks nested deeper than %d", MAX_DEPTH);
        return NULL;
    }
    stop_word[0] = '\0';
    while (p->at < p->n_items) {
        const item *it = &p->items[p->at++];
        node *n = NULL;
        if (it->kind == 0) {
            n = mknode(p, N_TEXT, it->line);
            if (n)
                n->s = it->s, n->n = it->n;
        } else {
            if (lex(p, it)) {
                p->failed = 1;
                return NULL;
            }
            if (it->kind == 1) {
                n = mknode(p, N_OUT, it->line);
                if (n && (!(n->e = parse_expr(p)) || end_expr(p)))
                    return NULL;
            } else {
                token *kw = next_tok(p);
                if (kw->kind == TK_NAME && stop) {
                    // is it one of the stop words?
                    const char *s = stop;
                    while (*s) {
                        const char *e = strchr(s, ' ');
                        size_t len = e ? (size_t)(e - s) : strlen(s);
                        if (kw->n == len && memcmp(kw->s, s, len) == 0 && len < cap) {
                            memcpy(stop_word, s, len);
                            stop_word[len] = '\0';
                            p->block_depth--;
                            return head;
                        }
                        s += len + (e != NULL);
                    }
                }
                if (kw->kind == TK_NAME &&
                    (tok_is(kw, TK_NAME, "endif") || tok_is(kw, TK_NAME, "endfor") ||
                     tok_is(kw, TK_NAME, "else") || tok_is(kw, TK_NAME, "elif"))) {
                    perr(p, it->line, "unexpected '%.*s'", (int)kw->n, kw->s);
                    return NULL;
                }
                n = parse_stmt(p, kw, it->line);
            }
        }
        if (!n || p->failed) {
            p->failed = 1;
            return NULL;
        }
        *tail = n;
        tail = &n->next;
    }
    if (stop) {
        perr(p, p->n_items ? p->items[p->n_items - 1].line : 1, "missing {%% %s %%}", stop);
        return NULL;
    }
    p->block_depth--;
    return head;
}

tm_rc tm_jinja_parse(const char *src, size_t n, tm_jinja **out, tm_err *err) {
    tm_jinja *t = tm_calloc(1, sizeof(*t));
    if (!t)
        return TM_ERR(err, TM_E_NOMEM, "template");
    parser p = {.ar = &t->ar, .src = src, .len = n, .err = err, .line_ptr = src, .line_no = 1};
    tm_rc rc = split(&p);
    if (rc == TM_OK) {
        char w[4];
        t->root = parse_body(&p, NULL, w, sizeof(w));
        if (p.failed)
            rc = err->rc ? err->rc : TM_E_INVAL;
    }
    tm_free(p.items);
    tm_free(p.toks);
    t->parse_steps = p.steps;
    if (rc) {
        tm_jinja_destroy(t);
        return rc;
    }
    *out = t;
    return TM_OK;
}

uint64_t tm_jinja_parse_steps(const tm_jinja *t) { return t->parse_steps; }

void tm_jinja_destroy(tm_jinja *t) {
    if (!t)
        return;
    arena_free(&t->ar);
    tm_free(t);
}

// ---- values ----

typedef enum vk { V_UNDEF, V_NONE, V_BOOL, V_INT, V_STR, V_LIST, V_DICT, V_FUNC } vk;

typedef struct list list;
typedef struct dict dict;

typedef struct val {
    vk kind;
    long long i;   /* BOOL, INT */
    const char *s; /* STR (not NUL-terminated), FUNC name */
    size_t n;
    list *l;
    dict *d;
    struct val *self; /* FUNC: bound object of a method, or NULL for a global */
} val;

struct list {
    val *v;
    size_t n, cap;
};

struct dict {
    const char **k;
    size_t *kn;
    val *v;
    size_t n, cap;
    int is_ns; /* namespace(): attributes may be set */
};

typedef struct scope {
    dict vars;
    struct scope *up;
} scope;

typedef struct rnd {
    arena ar;
    tm_buf *out;
    size_t out0;
    tm_err *err;
    long steps;
    int depth;
    size_t work; /* bytes of string work so far (MAX_WORK) */
    scope *sc;
} rnd;

#define VAL(k) ((val){.kind = (k)})

static tm_rc rerr(rnd *r, uint32_t line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static tm_rc rerr(rnd *r, uint32_t line, const char *fmt, ...) {
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return TM_ERR(r->err, TM_E_INVAL, "template: %s at line %u", msg, line);
}

// Out of value memory: the arena limit (a template error: TM_E_INVAL) or the heap (TM_E_NOMEM).
static tm_rc nomem(rnd *r) {
    if (r->ar.over)
        return TM_ERR(r->err, TM_E_INVAL, "template: more than %u MiB of values", MAX_ARENA >> 20);
    return TM_ERR(r->err, TM_E_NOMEM, "template values");
}

// Count n bytes of string work (compare, search, copy) against MAX_WORK, so that a template
// cannot spend its steps on ever larger strings.
static tm_rc charge(rnd *r, size_t n) {
    r->work += n;
    if (r->work > MAX_WORK)
        return TM_ERR(r->err, TM_E_INVAL, "template: more than %u MiB of string work",
                      MAX_WORK >> 20);
    return TM_OK;
}

// b may grow by n more bytes (a string built outside the arena: MAX_STR).
static tm_rc room(rnd *r, const tm_buf *b, size_t n) {
    if (b->len + n > MAX_STR)
        return TM_ERR(r->err, TM_E_INVAL, "template: a string over %u MiB", MAX_STR >> 20);
    return charge(r, n);
}

// Entering one level of a nested value (printing or comparing it): a step, and a level of depth,
// so that deep or cyclic values (a namespace holding itself) end in an error, not a crash. The
// caller does r->depth-- when done.
static tm_rc enter(rnd *r) {
    ++r->depth;
    if (++r->steps > MAX_STEPS)
        return TM_ERR(r->err, TM_E_INVAL, "template: more than %d evaluation steps", MAX_STEPS);
    if (r->depth > MAX_DEPTH * 2)
        return TM_ERR(r->err, TM_E_INVAL, "template: values nested too deep");
    return TM_OK;
}

static val vstr(const char *s, size_t n) { return (val){.kind = V_STR, .s = s, .n = n}; }
static val vint(long long i) { return (val){.kind = V_INT, .i = i}; }
static val vbool(int b) { return (val){.kind = V_BOOL, .i = b != 0}; }

static tm_rc list_push(rnd *r, list *l, val v) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 8;
        val *nv = aalloc(&r->ar, cap * sizeof(*nv));
        if (!nv)
            return nomem(r);
        if (l->n)
            memcpy(nv, l->v, l->n * sizeof(*nv));
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = v;
    return TM_OK;
}

static val *dict_find(const dict *d, const char *k, size_t n) {
    for (size_t i = 0; i < d->n; i++)
        if (d->kn[i] == n && memcmp(d->k[i], k, n) == 0)
            return &d->v[i];
    return NULL;
}

static tm_rc dict_set(rnd *r, dict *d, const char *k, size_t n, val v) {
    val *old = dict_find(d, k, n);
    if (old) {
        *old = v;
        return TM_OK;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? 2 * d->cap : 8;
        const char **nkey = aalloc(&r->ar, cap * sizeof(*nkey));
        size_t *nn = aalloc(&r->ar, cap * sizeof(*nn));
        val *nv = aalloc(&r->ar, cap * sizeof(*nv));
        if (!nkey || !nn || !nv)
            return nomem(r);
        if (d->n) {
            memcpy(nkey, d->k, d->n * sizeof(*nkey));
            memcpy(nn, d->kn, d->n * sizeof(*nn));
            memcpy(nv, d->v, d->n * sizeof(*nv));
        }
        d->k = nkey, d->kn = nn, d->v = nv, d->cap = cap;
    }
    d->k[d->n] = k;
    d->kn[d->n] = n;
    d->v[d->n++] = v;
    return TM_OK;
}

static int truthy(val v) {
    switch (v.kind) {
    case V_BOOL:
    case V_INT:
        return v.i != 0;
    case V_STR:
        return v.n > 0;
    case V_LIST:
        return v.l->n > 0;
    case V_DICT:
        return v.d->n > 0;
    case V_FUNC:
        return 1;
    default:
        return 0;
    }
}

static const char *kind_name(vk k) {
    static const char *const names[] = {"undefined", "none", "boolean", "integer",
                                        "string",    "list", "dict",    "function"};
    return names[k];
}

// *eq = (a == b) as Python compares them.
static tm_rc veq(rnd *r, val a, val b, int *eq) {
    *eq = 0;
    if ((a.kind == V_INT || a.kind == V_BOOL) && (b.kind == V_INT || b.kind == V_BOOL)) {
        *eq = a.i == b.i;
        return TM_OK;
    }
    if (a.kind != b.kind)
        return TM_OK;
    tm_rc rc = enter(r);
    switch (a.kind) {
    case V_UNDEF:
    case V_NONE:
        *eq = 1;
        break;
    case V_STR:
        if (!rc && a.n == b.n)
            rc = charge(r, a.n);
        if (!rc)
            *eq = a.n == b.n && memcmp(a.s, b.s, a.n) == 0;
        break;
    case V_LIST:
        *eq = !rc && a.l->n == b.l->n;
        for (size_t i = 0; i < a.l->n && *eq && !rc; i++)
            rc = veq(r, a.l->v[i], b.l->v[i], eq);
        break;
    default:
        *eq = a.l == b.l && a.d == b.d;
    }
    r->depth--;
    return rc;
}

// Append the text of v (as {{ v }} prints it: python's str()) to b.
static tm_rc to_text(rnd *r, tm_buf *b, val v, int repr);

static tm_rc json_of_(rnd *r, tm_buf *b, val v);

static tm_rc json_of(rnd *r, tm_buf *b, val v) {
    tm_rc rc = enter(r);
    if (!rc)
        rc = room(r, b, v.kind == V_STR ? v.n : 0);
    if (!rc)
        rc = json_of_(r, b, v);
    if (!rc && b->len > MAX_STR) // escapes made it longer
        rc = room(r, b, 0);
    r->depth--;
    return rc;
}

static tm_rc json_of_(rnd *r, tm_buf *b, val v) {
    tm_err *e = r->err;
    switch (v.kind) {
    case V_STR:
        return tm_buf_append_json_str(b, v.s, v.n, e);
    case V_INT:
        return tm_buf_printf(b, e, "%lld", v.i);
    case V_BOOL:
        return tm_buf_append_str(b, v.i ? "true" : "false", e);
    case V_LIST: {
        tm_rc rc = tm_buf_append_str(b, "[", e);
        for (size_t i = 0; i < v.l->n && !rc; i++) {
            rc = i ? tm_buf_append_str(b, ", ", e) : TM_OK;
            if (!rc)
                rc = json_of(r, b, v.l->v[i]);
        }
        return rc ? rc : tm_buf_append_str(b, "]", e);
    }
    case V_DICT: {
        tm_rc rc = tm_buf_append_str(b, "{", e);
        for (size_t i = 0; i < v.d->n && !rc; i++) {
            rc = i ? tm_buf_append_str(b, ", ", e) : TM_OK;
            if (!rc)
                rc = room(r, b, v.d->kn[i]);
            if (!rc)
                rc = tm_buf_append_json_str(b, v.d->k[i], v.d->kn[i], e);
            if (!rc)
                rc = tm_buf_append_str(b, ": ", e);
            if (!rc)
                rc = json_of(r, b, v.d->v[i]);
        }
        return rc ? rc : tm_buf_append_str(b, "}", e);
    }
    default:
        return tm_buf_append_str(b, "null", e);
    }
}

static tm_rc to_text_(rnd *r, tm_buf *b, val v, int repr);

static tm_rc to_text(rnd *r, tm_buf *b, val v, int repr) {
    tm_rc rc = enter(r);
    if (!rc)
        rc = room(r, b, v.kind == V_STR ? v.n : 0);
    if (!rc)
        rc = to_text_(r, b, v, repr);
    r->depth--;
    return rc;
}

static tm_rc to_text_(rnd *r, tm_buf *b, val v, int repr) {
    tm_err *e = r->err;
    switch (v.kind) {
    case V_UNDEF:
        return TM_OK;
    case V_NONE:
        return tm_buf_append_str(b, "None", e);
    case V_BOOL:
        return tm_buf_append_str(b, v.i ? "True" : "False", e);
    case V_INT:
        return tm_buf_printf(b, e, "%lld", v.i);
    case V_STR:
        if (!repr)
            return tm_buf_append(b, v.s, v.n, e);
        {
            tm_rc rc = tm_buf_append_str(b, "'", e);
            if (!rc)
                rc = tm_buf_append(b, v.s, v.n, e);
            return rc ? rc : tm_buf_append_str(b, "'", e);
        }
    case V_LIST: {
        tm_rc rc = tm_buf_append_str(b, "[", e);
        for (size_t i = 0; i < v.l->n && !rc; i++) {
            rc = i ? tm_buf_append_str(b, ", ", e) : TM_OK;
            if (!rc)
                rc = to_text(r, b, v.l->v[i], 1);
        }
        return rc ? rc : tm_buf_append_str(b, "]", e);
    }
    case V_DICT: {
        tm_rc rc = tm_buf_append_str(b, "{", e);
        for (size_t i = 0; i < v.d->n && !rc; i++) {
            rc = room(r, b, v.d->kn[i]);
            if (!rc)
                rc = tm_buf_printf(b, e, "%s'%.*s': ", i ? ", " : "", (int)v.d->kn[i], v.d->k[i]);
            if (!rc)
                rc = to_text(r, b, v.d->v[i], 1);
        }
        return rc ? rc : tm_buf_append_str(b, "}", e);
    }
    case V_FUNC:
        return tm_buf_append_str(b, "<function>", e);
    }
    return TM_OK;
}

// The text in b as a string value in the arena (a copy: b stays the caller's).
static tm_rc str_from_buf(rnd *r, const tm_buf *b, val *out) {
    char *s = aalloc(&r->ar, b->len + 1);
    if (!s)
        return nomem(r);
    if (b->len)
        memcpy(s, b->data, b->len);
    *out = vstr(s, b->len);
    return TM_OK;
}

// The text of v as a string value in the arena.
static tm_rc str_of(rnd *r, val v, val *out) {
    if (v.kind == V_STR) {
        *out = v;
        return TM_OK;
    }
    tm_buf b = {0};
    tm_rc rc = to_text(r, &b, v, 0);
    if (rc == TM_OK)
        rc = str_from_buf(r, &b, out);
    tm_buf_fini(&b);
    return rc;
}

static tm_rc cat(rnd *r, val a, val b, val *out) {
    tm_rc rc = charge(r, a.n + b.n);
    if (rc)
        return rc;
    char *s = aalloc(&r->ar, a.n + b.n + 1);
    if (!s)
        return nomem(r);
    memcpy(s, a.s, a.n);
    memcpy(s + a.n, b.s, b.n);
    *out = vstr(s, a.n + b.n);
    return TM_OK;
}

static val lookup(rnd *r, const char *s, size_t n) {
    for (scope *sc = r->sc; sc; sc = sc->up) {
        val *v = dict_find(&sc->vars, s, n);
        if (v)
            return *v;
    }
    return VAL(V_UNDEF);
}

static int name_is(const char *s, size_t n, const char *w) {
    return n == strlen(w) && memcmp(s, w, n) == 0;
}

static tm_rc eval(rnd *r, const expr *x, val *out);

static tm_rc eval_args(rnd *r, const expr *x, val *v, uint32_t max) {
    if (x->n_args > max)
        return rerr(r, x->line, "too many arguments");
    for (uint32_t i = 0; i < x->n_args; i++) {
        tm_rc rc = eval(r, x->args[i], &v[i]);
        if (rc)
            return rc;
    }
    return TM_OK;
}

static int ws(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

static val strip(val s, int left, int right) {
    while (left && s.n && ws(s.s[0]))
        s.s++, s.n--;
    while (right && s.n && ws(s.s[s.n - 1]))
        s.n--;
    return s;
}

static tm_rc map_case(rnd *r, val s, int upper, int cap_first, val *out) {
    tm_rc rc = charge(r, s.n);
    if (rc)
        return rc;
    char *d = aalloc(&r->ar, s.n + 1);
    if (!d)
        return nomem(r);
    for (size_t i = 0; i < s.n; i++) {
        char c = s.s[i];
        int up = cap_first ? i == 0 : upper;
        if (up && c >= 'a' && c <= 'z')
            c = (char)(c - 32);
        else if (!up && c >= 'A' && c <= 'Z')
            c = (char)(c + 32);
        d[i] = c;
    }
    *out = vstr(d, s.n);
    return TM_OK;
}

static tm_rc items_of(rnd *r, val d, val *out) {
    list *l = aalloc(&r->ar, sizeof(*l));
    if (!l)
        return nomem(r);
    for (size_t i = 0; i < d.d->n; i++) {
        list *pair = aalloc(&r->ar, sizeof(*pair));
        if (!pair)
            return nomem(r);
        tm_rc rc = list_push(r, pair, vstr(d.d->k[i], d.d->kn[i]));
        if (!rc)
            rc = list_push(r, pair, d.d->v[i]);
        if (!rc)
            rc = list_push(r, l, (val){.kind = V_LIST, .l = pair});
        if (rc)
            return rc;
    }
    *out = (val){.kind = V_LIST, .l = l};
    return TM_OK;
}

// A method of a string or dict (name), called with args.
static tm_rc call_method(rnd *r, const expr *x, val self, const char *name, size_t nn, val *a,
                         uint32_t na, val *out) {
    if (self.kind == V_STR) {
        if (name_is(name, nn, "strip") || name_is(name, nn, "lstrip") ||
            name_is(name, nn, "rstrip")) {
            if (na)
                return rerr(r, x->line, "%.*s(chars) is not supported", (int)nn, name);
            *out = strip(self, name[0] != 'r', name[0] != 'l');
            return charge(r, self.n - out->n);
        }
        if ((name_is(name, nn, "startswith") || name_is(name, nn, "endswith")) && na == 1 &&
            a[0].kind == V_STR) {
            tm_rc rc = charge(r, a[0].n);
            if (rc)
                return rc;
            int ok = a[0].n <= self.n && memcmp(name[0] == 's' ? self.s : self.s + self.n - a[0].n,
                                                a[0].s, a[0].n) == 0;
            *out = vbool(ok);
            return TM_OK;
        }
        if (name_is(name, nn, "upper") || name_is(name, nn, "lower"))
            return map_case(r, self, name[0] == 'u', 0, out);
        if (name_is(name, nn, "split") && na == 1 && a[0].kind == V_STR && a[0].n) {
            list *l = aalloc(&r->ar, sizeof(*l));
            if (!l)
                return nomem(r);
            tm_rc rc = charge(r, self.n + a[0].n);
            const char *hit;
            size_t at = 0;
            while (!rc && (hit = memmem(self.s + at, self.n - at, a[0].s, a[0].n)) != NULL) {
                size_t i = (size_t)(hit - self.s);
                rc = list_push(r, l, vstr(self.s + at, i - at));
                at = i + a[0].n;
            }
            if (!rc)
                rc = list_push(r, l, vstr(self.s + at, self.n - at));
            *out = (val){.kind = V_LIST, .l = l};
            return rc;
        }
        if (name_is(name, nn, "replace") && na == 2 && a[0].kind == V_STR && a[1].kind == V_STR &&
            a[0].n) {
            tm_buf b = {0};
            tm_rc rc = charge(r, self.n + a[0].n);
            const char *hit;
            size_t at = 0;
            while (!rc && (hit = memmem(self.s + at, self.n - at, a[0].s, a[0].n)) != NULL) {
                size_t i = (size_t)(hit - self.s);
                rc = room(r, &b, i - at + a[1].n);
                if (!rc)
                    rc = tm_buf_append(&b, self.s + at, i - at, r->err);
                if (!rc)
                    rc = tm_buf_append(&b, a[1].s, a[1].n, r->err);
                at = i + a[0].n;
            }
            if (!rc)
                rc = room(r, &b, self.n - at);
            if (!rc)
                rc = tm_buf_append(&b, self.s + at, self.n - at, r->err);
            if (!rc)
                rc = str_from_buf(r, &b, out);
            tm_buf_fini(&b);
            return rc;
        }
    } else if (self.kind == V_DICT) {
        if (name_is(name, nn, "get") && (na == 1 || na == 2) && a[0].kind == V_STR) {
            tm_rc rc = charge(r, a[0].n * self.d->n);
            if (rc)
                return rc;
            val *v = dict_find(self.d, a[0].s, a[0].n);
            *out = v ? *v : na == 2 ? a[1] : VAL(V_NONE);
            return TM_OK;
        }
        if (name_is(name, nn, "items") && na == 0)
            return items_of(r, self, out);
        if ((name_is(name, nn, "keys") || name_is(name, nn, "values")) && na == 0) {
            list *l = aalloc(&r->ar, sizeof(*l));
            if (!l)
                return nomem(r);
            for (size_t i = 0; i < self.d->n; i++) {
                tm_rc rc = list_push(
                    r, l, name[0] == 'k' ? vstr(self.d->k[i], self.d->kn[i]) : self.d->v[i]);
                if (rc)
                    return rc;
            }
            *out = (val){.kind = V_LIST, .l = l};
            return TM_OK;
        }
    }
    return rerr(r, x->line, "%s has no method '%.*s' (with %u arguments)", kind_name(self.kind),
                (int)nn, name, na);
}

static tm_rc eval_call(rnd *r, const expr *x, val *out) {
    val f, a[64];
    tm_rc rc = eval(r, x->a, &f);
    if (rc)
        return rc;
    if (f.kind != V_FUNC)
        return rerr(r, x->line, "%s is not callable", kind_name(f.kind));
    if (f.self) {
        for (uint32_t i = 0; i < x->n_args; i++)
            if (x->keys[i])
                return rerr(r, x->line, "keyword arguments to methods are not supported");
        rc = eval_args(r, x, a, 64);
        return rc ? rc : call_method(r, x, *f.self, f.s, f.n, a, x->n_args, out);
    }
    rc = eval_args(r, x, a, 64);
    if (rc)
        return rc;
    if (name_is(f.s, f.n, "raise_exception")) {
        val m = x->n_args ? a[0] : vstr("", 0);
        rc = str_of(r, m, &m);
        if (rc)
            return rc;
        return TM_ERR(r->err, TM_E_INVAL, "template raised: %.*s", (int)TM_MIN(m.n, 200), m.s);
    }
    if (name_is(f.s, f.n, "namespace")) {
        dict *d = aalloc(&r->ar, sizeof(*d));
        if (!d)
            return nomem(r);
        d->is_ns = 1;
        for (uint32_t i = 0; i < x->n_args; i++) {
            if (!x->keys[i])
                return rerr(r, x->line, "namespace() takes keyword arguments");
            rc = dict_set(r, d, x->keys[i]->s, x->keys[i]->n, a[i]);
            if (rc)
                return rc;
        }
        *out = (val){.kind = V_DICT, .d = d};
        return TM_OK;
    }
    if (name_is(f.s, f.n, "range")) {
        long long lo = 0, hi = 0;
        if (x->n_args == 1 && a[0].kind == V_INT)
            hi = a[0].i;
        else if (x->n_args == 2 && a[0].kind == V_INT && a[1].kind == V_INT)
            lo = a[0].i, hi = a[1].i;
        else
            return rerr(r, x->line, "range() takes one or two integers");
        if (hi > lo && (unsigned long long)hi - (unsigned long long)lo > MAX_RANGE)
            return rerr(r, x->line, "range() over %d items", MAX_RANGE);
        list *l = aalloc(&r->ar, sizeof(*l));
        if (!l)
            return nomem(r);
        for (long long i = lo; i < hi; i++) {
            rc = list_push(r, l, vint(i));
            if (rc)
                return rc;
        }
        *out = (val){.kind = V_LIST, .l = l};
        return TM_OK;
    }
    return rerr(r, x->line, "unknown function '%.*s'", (int)f.n, f.s);
}

// What a filter or test (x) applies to, into *v, and its arguments, into a[0..max).
static tm_rc eval_operand(rnd *r, const expr *x, val *v, val *a, uint32_t max) {
    tm_rc rc = eval(r, x->a, v);
    if (!rc)
        rc = eval_args(r, x, a, max);
    return rc;
}

static tm_rc eval_filter(rnd *r, const expr *x, val *out) {
    val v, a[4];
    tm_rc rc = eval_operand(r, x, &v, a, 4);
    if (rc)
        return rc;
    const char *f = x->s;
    size_t fn = x->n;
    if (name_is(f, fn, "default") || name_is(f, fn, "d")) {
        *out = v.kind == V_UNDEF || (x->n_args > 1 && truthy(a[1]) && !truthy(v))
                   ? (x->n_args ? a[0] : vstr("", 0))
                   : v;
        return TM_OK;
    }
    if (name_is(f, fn, "string"))
        return str_of(r, v, out);
    if (name_is(f, fn, "tojson")) {
        tm_buf b = {0};
        rc = json_of(r, &b, v);
        if (!rc)
            rc = str_from_buf(r, &b, out);
        tm_buf_fini(&b);
        return rc;
    }
    if (name_is(f, fn, "length") || name_is(f, fn, "count")) {
        if (v.kind == V_STR)
            *out = vint((long long)v.n); // bytes; chat templates compare lengths with 0
        else if (v.kind == V_LIST)
            *out = vint((long long)v.l->n);
        else if (v.kind == V_DICT)
            *out = vint((long long)v.d->n);
        else
            return rerr(r, x->line, "length of %s", kind_name(v.kind));
        return TM_OK;
    }
    if (name_is(f, fn, "list")) {
        if (v.kind != V_LIST)
            return rerr(r, x->line, "list of %s", kind_name(v.kind));
        *out = v;
        return TM_OK;
    }
    if (name_is(f, fn, "items")) {
        if (v.kind != V_DICT)
            return rerr(r, x->line, "items of %s", kind_name(v.kind));
        return items_of(r, v, out);
    }
    if (name_is(f, fn, "first") || name_is(f, fn, "last")) {
        if (v.kind == V_LIST) {
            *out = v.l->n ? v.l->v[f[0] == 'f' ? 0 : v.l->n - 1] : VAL(V_UNDEF);
        } else if (v.kind == V_STR) {
            *out = v.n ? vstr(f[0] == 'f' ? v.s : v.s + v.n - 1, 1) : VAL(V_UNDEF);
        } else {
            return rerr(r, x->line, "%s of %s", f[0] == 'f' ? "first" : "last", kind_name(v.kind));
        }
        return TM_OK;
    }
    if (name_is(f, fn, "reverse")) {
        if (v.kind != V_LIST)
            return rerr(r, x->line, "reverse of %s", kind_name(v.kind));
        list *l = aalloc(&r->ar, sizeof(*l));
        if (!l)
            return nomem(r);
        for (size_t i = v.l->n; i > 0; i--) {
            rc = list_push(r, l, v.l->v[i - 1]);
            if (rc)
                return rc;
        }
        *out = (val){.kind = V_LIST, .l = l};
        return TM_OK;
    }
    if (name_is(f, fn, "join")) {
        if (v.kind != V_LIST)
            return rerr(r, x->line, "join of %s", kind_name(v.kind));
        val sep = x->n_args ? a[0] : vstr("", 0), acc = vstr("", 0);
        for (size_t i = 0; i < v.l->n && !rc; i++) {
            val s;
            rc = str_of(r, v.l->v[i], &s);
            if (!rc && i)
                rc = cat(r, acc, sep, &acc);
            if (!rc)
                rc = cat(r, acc, s, &acc);
        }
        *out = acc;
        return rc;
    }
    if (name_is(f, fn, "int")) {
        if (v.kind == V_INT || v.kind == V_BOOL) {
            *out = vint(v.i);
        } else if (v.kind == V_STR) {
            long long k = 0;
            for (size_t i = 0; i < v.n && v.s[i] >= '0' && v.s[i] <= '9' && k < 100000000000LL; i++)
                k = k * 10 + (v.s[i] - '0');
            *out = vint(k);
        } else {
            *out = vint(0);
        }
        return TM_OK;
    }
    if (v.kind != V_STR && (name_is(f, fn, "trim") || name_is(f, fn, "upper") ||
                            name_is(f, fn, "lower") || name_is(f, fn, "capitalize"))) {
        rc = str_of(r, v, &v);
        if (rc)
            return rc;
    }
    if (name_is(f, fn, "trim")) {
        *out = strip(v, 1, 1);
        return charge(r, v.n - out->n);
    }
    if (name_is(f, fn, "upper") || name_is(f, fn, "lower"))
        return map_case(r, v, f[0] == 'u', 0, out);
    if (name_is(f, fn, "capitalize"))
        return map_case(r, v, 0, 1, out);
    return rerr(r, x->line, "unknown filter '%.*s'", (int)fn, f);
}

static tm_rc eval_test(rnd *r, const expr *x, val *out) {
    val v, a[2];
    tm_rc rc = eval_operand(r, x, &v, a, 2);
    if (rc)
        return rc;
    const char *t = x->s;
    size_t tn = x->n;
    int res;
    if (name_is(t, tn, "defined"))
        res = v.kind != V_UNDEF;
    else if (name_is(t, tn, "undefined"))
        res = v.kind == V_UNDEF;
    else if (name_is(t, tn, "none"))
        res = v.kind == V_NONE;
    else if (name_is(t, tn, "string"))
        res = v.kind == V_STR;
    else if (name_is(t, tn, "number") || name_is(t, tn, "integer"))
        res = v.kind == V_INT;
    else if (name_is(t, tn, "boolean"))
        res = v.kind == V_BOOL;
    else if (name_is(t, tn, "true") || name_is(t, tn, "false"))
        res = v.kind == V_BOOL && v.i == (t[0] == 't');
    else if (name_is(t, tn, "mapping"))
        res = v.kind == V_DICT;
    else if (name_is(t, tn, "iterable") || name_is(t, tn, "sequence"))
        res = v.kind == V_LIST || v.kind == V_STR || (v.kind == V_DICT && t[0] == 'i');
    else if ((name_is(t, tn, "even") || name_is(t, tn, "odd")) && v.kind == V_INT)
        res = (v.i % 2 == 0) == (t[0] == 'e');
    else if ((name_is(t, tn, "equalto") || name_is(t, tn, "eq")) && x->n_args == 1)
        rc = veq(r, v, a[0], &res);
    else
        return rerr(r, x->line, "unknown test '%.*s'", (int)tn, t);
    *out = vbool(x->i ? !res : res);
    return rc;
}

static tm_rc eval_index(rnd *r, const expr *x, val obj, val key, val *out) {
    if (obj.kind == V_DICT && key.kind == V_STR) {
        tm_rc rc = charge(r, key.n * obj.d->n);
        if (rc)
            return rc;
        val *v = dict_find(obj.d, key.s, key.n);
        *out = v ? *v : VAL(V_UNDEF);
        return TM_OK;
    }
    if ((obj.kind == V_LIST || obj.kind == V_STR) && key.kind == V_INT) {
        long long n = obj.kind == V_LIST ? (long long)obj.l->n : (long long)obj.n, i = key.i;
        if (i < 0)
            i += n;
        if (i < 0 || i >= n) {
            *out = VAL(V_UNDEF);
            return TM_OK;
        }
        *out = obj.kind == V_LIST ? obj.l->v[i] : vstr(obj.s + i, 1);
        return TM_OK;
    }
    if (obj.kind == V_UNDEF)
        return rerr(r, x->line, "indexing an undefined value");
    *out = VAL(V_UNDEF);
    return TM_OK;
}

static tm_rc eval_bin(rnd *r, const expr *x, val *out) {
    const char *op = x->s;
    val a, b;
    tm_rc rc = eval(r, x->a, &a);
    if (rc)
        return rc;
    if (name_is(op, x->n, "and") || name_is(op, x->n, "or")) {
        int is_and = op[0] == 'a';
        if (truthy(a) != is_and) {
            *out = a;
            return TM_OK;
        }
        return eval(r, x->b, out);
    }
    rc = eval(r, x->b, &b);
    if (rc)
        return rc;
    if (name_is(op, x->n, "~")) {
        rc = str_of(r, a, &a);
        if (!rc)
            rc = str_of(r, b, &b);
        return rc ? rc : cat(r, a, b, out);
    }
    if (name_is(op, x->n, "==") || name_is(op, x->n, "!=")) {
        int eq;
        rc = veq(r, a, b, &eq);
        *out = vbool(eq == (op[0] == '='));
        return rc;
    }
    if (name_is(op, x->n, "in") || name_is(op, x->n, "notin")) {
        int res = 0;
        if (b.kind == V_STR && a.kind == V_STR) {
            rc = charge(r, a.n + b.n);
            res = !rc && (a.n == 0 || memmem(b.s, b.n, a.s, a.n) != NULL);
        } else if (b.kind == V_LIST) {
            for (size_t i = 0; i < b.l->n && !res && !rc; i++)
                rc = veq(r, a, b.l->v[i], &res);
        } else if (b.kind == V_DICT && a.kind == V_STR) {
            rc = charge(r, a.n * b.d->n);
            res = !rc && dict_find(b.d, a.s, a.n) != NULL;
        } else {
            return rerr(r, x->line, "'in' with %s and %s", kind_name(a.kind), kind_name(b.kind));
        }
        *out = vbool(op[0] == 'i' ? res : !res);
        return rc;
    }
    if (op[0] == '+' && a.kind == V_STR && b.kind == V_STR)
        return cat(r, a, b, out);
    if (op[0] == '+' && a.kind == V_LIST && b.kind == V_LIST) {
        list *l = aalloc(&r->ar, sizeof(*l));
        if (!l)
            return nomem(r);
        for (size_t i = 0; i < a.l->n + b.l->n && !rc; i++)
            rc = list_push(r, l, i < a.l->n ? a.l->v[i] : b.l->v[i - a.l->n]);
        *out = (val){.kind = V_LIST, .l = l};
        return rc;
    }
    if (a.kind == V_STR && b.kind == V_STR && strchr("<>", op[0])) {
        size_t n = TM_MIN(a.n, b.n);
        rc = charge(r, n);
        if (rc)
            return rc;
        int c = memcmp(a.s, b.s, n);
        if (c == 0)
            c = a.n < b.n ? -1 : a.n > b.n;
        *out = vbool(op[0] == '<' ? (x->n == 2 ? c <= 0 : c < 0) : (x->n == 2 ? c >= 0 : c > 0));
        return TM_OK;
    }
    if ((a.kind != V_INT && a.kind != V_BOOL) || (b.kind != V_INT && b.kind != V_BOOL))
        return rerr(r, x->line, "'%.*s' with %s and %s", (int)x->n, op, kind_name(a.kind),
                    kind_name(b.kind));
    long long p = a.i, q = b.i;
    if (op[0] == '<' || op[0] == '>') {
        *out = vbool(op[0] == '<' ? (x->n == 2 ? p <= q : p < q) : (x->n == 2 ? p >= q : p > q));
        return TM_OK;
    }
    if ((op[0] == '/' || op[0] == '%') && q == 0)
        return rerr(r, x->line, "division by zero");
    if (op[0] == '/' && x->n == 1)
        return rerr(r, x->line, "'/' gives a float; floats are not supported");
    switch (op[0]) {
    case '+':
        *out = vint((long long)((unsigned long long)p + (unsigned long long)q));
        break;
    case '-':
        *out = vint((long long)((unsigned long long)p - (unsigned long long)q));
        break;
    case '*':
        *out = vint((long long)((unsigned long long)p * (unsigned long long)q));
        break;
    case '/': // python floor division
        if (p == INT64_MIN && q == -1)
            return rerr(r, x->line, "integer overflow");
        *out = vint(p / q - ((p % q != 0) && ((p < 0) != (q < 0))));
        break;
    case '%': {
        if (p == INT64_MIN && q == -1) {
            *out = vint(0);
            break;
        }
        long long m = p % q;
        *out = vint(m != 0 && ((m < 0) != (q < 0)) ? m + q : m);
        break;
    }
    default:
        return rerr(r, x->line, "operator '%.*s'", (int)x->n, op);
    }
    return TM_OK;
}

// A slice bound as Python reads it: negative counts from the end; then clamped to [0, n].
static long long slice_bound(long long i, long long n) {
    if (i < 0)
        i += n;
    return i < 0 ? 0 : (i > n ? n : i);
}

static tm_rc eval(rnd *r, const expr *x, val *out) {
    if (++r->steps > MAX_STEPS)
        return rerr(r, x->line, "more than %d evaluation steps", MAX_STEPS);
    if (++r->depth > MAX_DEPTH * 2)
        return rerr(r, x->line, "evaluation nested too deep");
    tm_rc rc = TM_OK;
    val a, b;
    switch (x->kind) {
    case E_STR:
        *out = vstr(x->s, x->n);
        break;
    case E_INT:
        *out = vint(x->i);
        break;
    case E_BOOL:
        *out = vbool((int)x->i);
        break;
    case E_NONE:
        *out = VAL(V_NONE);
        break;
    case E_NAME:
        *out = lookup(r, x->s, x->n);
        if (out->kind == V_UNDEF &&
            (name_is(x->s, x->n, "raise_exception") || name_is(x->s, x->n, "namespace") ||
             name_is(x->s, x->n, "range")))
            *out = (val){.kind = V_FUNC, .s = x->s, .n = x->n};
        break;
    case E_ATTR:
        rc = eval(r, x->a, &a);
        if (rc)
            break;
        if (a.kind == V_DICT && dict_find(a.d, x->s, x->n)) {
            *out = *dict_find(a.d, x->s, x->n);
        } else if (a.kind == V_STR || a.kind == V_DICT) { // a method, bound when called
            val *self = aalloc(&r->ar, sizeof(*self));
            if (!self) {
                rc = nomem(r);
                break;
            }
            *self = a;
            *out = (val){.kind = V_FUNC, .s = x->s, .n = x->n, .self = self};
        } else if (a.kind == V_UNDEF) {
            rc = rerr(r, x->line, "'%.*s' of an undefined value", (int)x->n, x->s);
        } else {
            *out = VAL(V_UNDEF);
        }
        break;
    case E_INDEX:
        rc = eval(r, x->a, &a);
        if (!rc)
            rc = eval(r, x->b, &b);
        if (!rc)
            rc = eval_index(r, x, a, b, out);
        break;
    case E_SLICE: {
        rc = eval(r, x->a, &a);
        val lo = VAL(V_NONE), hi = VAL(V_NONE);
        if (!rc && x->b)
            rc = eval(r, x->b, &lo);
        if (!rc && x->c)
            rc = eval(r, x->c, &hi);
        if (rc)
            break;
        if ((a.kind != V_LIST && a.kind != V_STR) || (lo.kind != V_NONE && lo.kind != V_INT) ||
            (hi.kind != V_NONE && hi.kind != V_INT)) {
            rc = rerr(r, x->line, "slice of %s", kind_name(a.kind));
            break;
        }
        long long n = a.kind == V_LIST ? (long long)a.l->n : (long long)a.n;
        long long i = lo.kind == V_INT ? lo.i : 0, j = hi.kind == V_INT ? hi.i : n;
        i = slice_bound(i, n);
        j = slice_bound(j, n);
        if (j < i)
            j = i;
        if (a.kind == V_STR) {
            *out = vstr(a.s + i, (size_t)(j - i));
        } else {
            list *l = aalloc(&r->ar, sizeof(*l));
            if (!l) {
                rc = nomem(r);
                break;
            }
            l->v = a.l->v + i;
            l->n = l->cap = (size_t)(j - i); // a view: lists are never mutated in place
            *out = (val){.kind = V_LIST, .l = l};
        }
        break;
    }
    case E_CALL:
        rc = eval_call(r, x, out);
        break;
    case E_FILTER:
        rc = eval_filter(r, x, out);
        break;
    case E_TEST:
        rc = eval_test(r, x, out);
        break;
    case E_NOT:
        rc = eval(r, x->a, &a);
        if (!rc) // a is not set when its evaluation failed (found by fuzz_jinja)
            *out = vbool(!truthy(a));
        break;
    case E_NEG:
        rc = eval(r, x->a, &a);
        if (!rc && a.kind != V_INT)
            rc = rerr(r, x->line, "'-' of %s", kind_name(a.kind));
        if (!rc)
            *out = vint((long long)(0ull - (unsigned long long)a.i));
        break;
    case E_BIN:
        rc = eval_bin(r, x, out);
        break;
    case E_COND:
        rc = eval(r, x->a, &a);
        if (!rc)
            rc = truthy(a) ? eval(r, x->b, out) : x->c ? eval(r, x->c, out) : TM_OK;
        if (!rc && !truthy(a) && !x->c)
            *out = VAL(V_UNDEF);
        break;
    case E_LIST: {
        list *l = aalloc(&r->ar, sizeof(*l));
        if (!l) {
            rc = nomem(r);
            break;
        }
        for (uint32_t i = 0; i < x->n_args && !rc; i++) {
            rc = eval(r, x->args[i], &a);
            if (!rc)
                rc = list_push(r, l, a);
        }
        *out = (val){.kind = V_LIST, .l = l};
        break;
    }
    case E_DICT: {
        dict *d = aalloc(&r->ar, sizeof(*d));
        if (!d) {
            rc = nomem(r);
            break;
        }
        for (uint32_t i = 0; i < x->n_args && !rc; i++) {
            rc = eval(r, x->keys[i], &a);
            if (!rc && a.kind != V_STR)
                rc = rerr(r, x->line, "dict keys must be strings");
            if (!rc)
                rc = eval(r, x->args[i], &b);
            if (!rc)
                rc = dict_set(r, d, a.s, a.n, b);
        }
        *out = (val){.kind = V_DICT, .d = d};
        break;
    }
    }
    r->depth--;
    return rc;
}

static tm_rc emit(rnd *r, const char *s, size_t n) {
    if (r->out->len - r->out0 + n > MAX_OUT)
        return TM_ERR(r->err, TM_E_INVAL, "template: output over %u bytes", MAX_OUT);
    return tm_buf_append(r->out, s, n, r->err);
}

static tm_rc exec(rnd *r, const node *n);

static tm_rc exec_for(rnd *r, const node *n) {
    val it;
    tm_rc rc = eval(r, n->e, &it);
    if (rc)
        return rc;
    if (it.kind == V_DICT) { // iterating a dict gives its keys
        list *l = aalloc(&r->ar, sizeof(*l));
        if (!l)
            return nomem(r);
        for (size_t i = 0; i < it.d->n && !rc; i++)
            rc = list_push(r, l, vstr(it.d->k[i], it.d->kn[i]));
        if (rc)
            return rc;
        it = (val){.kind = V_LIST, .l = l};
    }
    if (it.kind == V_UNDEF || it.kind == V_NONE) {
        list *l = aalloc(&r->ar, sizeof(*l));
        if (!l)
            return nomem(r);
        it = (val){.kind = V_LIST, .l = l};
    }
    if (it.kind == V_STR) {
        list *l = aalloc(&r->ar, sizeof(*l));
        if (!l)
            return nomem(r);
        for (size_t i = 0; i < it.n && !rc; i++)
            rc = list_push(r, l, vstr(it.s + i, 1));
        if (rc)
            return rc;
        it = (val){.kind = V_LIST, .l = l};
    }
    if (it.kind != V_LIST)
        return rerr(r, n->line, "for over %s", kind_name(it.kind));
    size_t len = it.l->n;
    if (len == 0 && n->alt)
        return exec(r, n->alt);
    for (size_t i = 0; i < len && !rc; i++) {
        scope sc = {.up = r->sc};
        dict *loop = aalloc(&r->ar, sizeof(*loop));
        if (!loop)
            return nomem(r);
        rc = dict_set(r, loop, "index", 5, vint((long long)i + 1));
        if (!rc)
            rc = dict_set(r, loop, "index0", 6, vint((long long)i));
        if (!rc)
            rc = dict_set(r, loop, "revindex", 8, vint((long long)(len - i)));
        if (!rc)
            rc = dict_set(r, loop, "revindex0", 9, vint((long long)(len - i - 1)));
        if (!rc)
            rc = dict_set(r, loop, "first", 5, vbool(i == 0));
        if (!rc)
            rc = dict_set(r, loop, "last", 4, vbool(i + 1 == len));
        if (!rc)
            rc = dict_set(r, loop, "length", 6, vint((long long)len));
        if (!rc)
            rc = dict_set(r, &sc.vars, "loop", 4, (val){.kind = V_DICT, .d = loop});
        val v = it.l->v[i];
        if (!rc && n->s2) {
            if (v.kind != V_LIST || v.l->n != 2)
                return rerr(r, n->line, "cannot unpack %s into two loop variables",
                            kind_name(v.kind));
            rc = dict_set(r, &sc.vars, n->s, n->n, v.l->v[0]);
            if (!rc)
                rc = dict_set(r, &sc.vars, n->s2, strlen(n->s2), v.l->v[1]);
        } else if (!rc) {
            rc = dict_set(r, &sc.vars, n->s, n->n, v);
        }
        r->sc = &sc;
        if (!rc)
            rc = exec(r, n->body);
        r->sc = sc.up;
    }
    return rc;
}

static tm_rc exec(rnd *r, const node *n) {
    tm_rc rc = TM_OK;
    if (++r->depth > MAX_DEPTH * 2)
        return TM_ERR(r->err, TM_E_INVAL, "template: blocks nested too deep");
    for (; n && rc == TM_OK; n = n->next) {
        if (++r->steps > MAX_STEPS) {
            rc = rerr(r, n->line, "more than %d evaluation steps", MAX_STEPS);
            break;
        }
        val v;
        switch (n->kind) {
        case N_TEXT:
            rc = emit(r, n->s, n->n);
            break;
        case N_OUT: {
            rc = eval(r, n->e, &v);
            if (rc)
                break;
            if (v.kind == V_STR) {
                rc = emit(r, v.s, v.n);
            } else {
                tm_buf b = {0};
                rc = to_text(r, &b, v, 0);
                if (!rc && b.len)
                    rc = emit(r, b.data, b.len);
                tm_buf_fini(&b);
            }
            break;
        }
        case N_IF:
            rc = eval(r, n->e, &v);
            if (!rc)
                rc = exec(r, truthy(v) ? n->body : n->alt);
            break;
        case N_FOR:
            rc = exec_for(r, n);
            break;
        case N_SET:
            rc = eval(r, n->e, &v);
            if (rc)
                break;
            if (n->s2) {
                val ns = lookup(r, n->s, n->n);
                if (ns.kind != V_DICT || !ns.d->is_ns) {
                    rc = rerr(r, n->line, "set %.*s.%s: not a namespace", (int)n->n, n->s, n->s2);
                    break;
                }
                rc = dict_set(r, ns.d, n->s2, strlen(n->s2), v);
            } else {
                rc = dict_set(r, &r->sc->vars, n->s, n->n, v);
            }
            break;
        }
    }
    r->depth--;
    return rc;
}

tm_rc tm_jinja_render(const tm_jinja *t, const tm_jinja_vars *vars, tm_buf *out, tm_err *err) {
    rnd r = {.out = out, .out0 = out->len, .err = err};
    scope top = {0};
    r.sc = &top;
    list *msgs = aalloc(&r.ar, sizeof(*msgs));
    tm_rc rc = msgs ? TM_OK : nomem(&r);
    for (uint32_t i = 0; i < vars->n_msgs && !rc; i++) {
        dict *m = aalloc(&r.ar, sizeof(*m));
        if (!m) {
            rc = nomem(&r);
            break;
        }
        const tm_message *msg = &vars->msgs[i];
        rc = dict_set(&r, m, "role", 4, vstr(msg->role, strlen(msg->role)));
        if (!rc)
            rc = dict_set(&r, m, "content", 7,
                          msg->content ? vstr(msg->content, strlen(msg->content)) : VAL(V_NONE));
        if (!rc)
            rc = list_push(&r, msgs, (val){.kind = V_DICT, .d = m});
    }
    const char *bos = vars->bos_token ? vars->bos_token : "";
    const char *eos = vars->eos_token ? vars->eos_token : "";
    if (!rc)
        rc = dict_set(&r, &top.vars, "messages", 8, (val){.kind = V_LIST, .l = msgs});
    if (!rc)
        rc = dict_set(&r, &top.vars, "add_generation_prompt", 21,
                      vbool(vars->add_generation_prompt));
    if (!rc)
        rc = dict_set(&r, &top.vars, "bos_token", 9, vstr(bos, strlen(bos)));
    if (!rc)
        rc = dict_set(&r, &top.vars, "eos_token", 9, vstr(eos, strlen(eos)));
    if (!rc)
        rc = exec(&r, t->root);
    arena_free(&r.ar);
    return rc;
}
