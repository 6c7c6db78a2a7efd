/* runner/guided/schema.c - JSON Schema (OpenAI's strict subset), guided_choice and json_object
 * into expression trees (guided_int.h), and tm_dfa_compile / tm_dfa_regex. The output language
 * is a subset of what the schema accepts, written one way: properties in the schema's order,
 * compact JSON but for at most one space after ':' and ',' (docs/structured_output.md), strings
 * with the shortest escapes, integers without fraction or exponent. Keywords outside the subset
 * are refused by name rather than ignored, so an answer never fails its schema silently. */
#include <ctype.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "runner/guided/guided_int.h"

#define MAX_SCHEMA_DEPTH 64 /* schema objects nested (through refs too) */

#define DJ_DEPTH 32          /* schemas nested in one oneOf disjointness check */
#define DJ_BUDGET (1u << 18) /* steps of all oneOf disjointness checks of one schema */

typedef struct sc {
    rx_ctx *c;
    const json_t *root;
    const char *ref_name[MAX_SCHEMA_DEPTH]; /* the $refs being expanded (a stack) */
    uint32_t n_ref;
    uint32_t depth;
    rx_node *ws;      /* after ':' and ',': "" or " " */
    uint32_t dj_left; /* steps left to the oneOf disjointness checks */
} sc;

static rx_node *value(sc *s, const json_t *schema);
static rx_node *generic_object(rx_ctx *c, rx_node *ws, uint32_t depth);

static rx_node *lit(sc *s, const char *t) { return rx_str(s->c, t); }

// A JSON string of characters from the tree of one character, repeated min..max times.
static rx_node *json_chars(rx_ctx *c, uint32_t min, uint32_t max) {
    // any code point, JSON-escaped ('"', '\\', controls by their escapes; others as they are),
    // or any \uXXXX escape of a non-surrogate (so each alternative is one code point)
    static const uint32_t any[] = {0, 0xD7FF, 0xE000, RX_MAX_CP};
    static const uint32_t hex[] = {'0', '9', 'A', 'F', 'a', 'f'};
    static const uint32_t hex_ns[] = {'0', '9', 'A', 'C', 'E', 'F', 'a', 'c', 'e', 'f'};
    static const uint32_t d07[] = {'0', '7'};
    static const uint32_t dD[] = {'D', 'D', 'd', 'd'};
    rx_node *h = rx_set(c, hex, 3, 0);
    rx_node *h2[] = {rx_set(c, hex_ns, 5, 0), h, h, h};
    rx_node *h3[] = {rx_set(c, dD, 2, 0), rx_set(c, d07, 1, 0), h, h};
    rx_node *u_alt[] = {rx_cat(c, h2, 4), rx_cat(c, h3, 4)};
    rx_node *uesc = rx_cat2(c, rx_str(c, "\\u"), rx_alt(c, u_alt, 2));
    rx_node *one[] = {rx_set(c, any, 2, 1), uesc};
    return rx_rep(c, rx_alt(c, one, 2), min, max);
}

static rx_node *str_schema(sc *s, uint32_t min, uint32_t max) {
    rx_node *k[] = {lit(s, "\""), json_chars(s->c, min, max), lit(s, "\"")};
    return rx_cat(s->c, k, 3);
}

// Integers of at most TM_GUIDE_MAX_DIGITS digits (beyond, doubles lose integers anyway), no
// leading zeros ("-0" is allowed, as JSON allows it).
static rx_node *rx_int(rx_ctx *c) {
    static const uint32_t d19[] = {'1', '9'}, d09[] = {'0', '9'};
    rx_node *nz[] = {rx_set(c, d19, 1, 0),
                     rx_rep(c, rx_set(c, d09, 1, 0), 0, TM_GUIDE_MAX_DIGITS - 1)};
    rx_node *mag[] = {rx_str(c, "0"), rx_cat(c, nz, 2)};
    return rx_cat2(c, rx_rep(c, rx_str(c, "-"), 0, 1), rx_alt(c, mag, 2));
}

// Numbers: the integer part as above, at most TM_GUIDE_MAX_DIGITS fraction digits and 3 exponent
// digits.
static rx_node *json_number(rx_ctx *c) {
    static const uint32_t d09[] = {'0', '9'}, eE[] = {'E', 'E', 'e', 'e'},
                          pm[] = {'+', '+', '-', '-'};
    rx_node *fd = rx_rep(c, rx_set(c, d09, 1, 0), 1, TM_GUIDE_MAX_DIGITS);
    rx_node *frac = rx_rep(c, rx_cat2(c, rx_str(c, "."), fd), 0, 1);
    rx_node *e[] = {rx_set(c, eE, 2, 0), rx_rep(c, rx_set(c, pm, 2, 0), 0, 1),
                    rx_rep(c, rx_set(c, d09, 1, 0), 1, 3)};
    rx_node *k[] = {rx_int(c), frac, rx_rep(c, rx_cat(c, e, 3), 0, 1)};
    return rx_cat(c, k, 3);
}

// The JSON text of v (compact, UTF-8 as is) as a literal.
static rx_node *json_lit(sc *s, const json_t *v) {
    char *t = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    if (!t)
        return rx_fail(s->c, TM_GUIDE_WHY_NONE, "guided: out of memory");
    rx_node *x = rx_str(s->c, t);
    free(t); // jansson's allocation
    return x;
}

static int is_annotation(const char *k) {
    static const char *const ann[] = {
        "title",      "description", "$schema",   "$id",   "$comment",    "default", "examples",
        "deprecated", "readOnly",    "writeOnly", "$defs", "definitions", "strict",  NULL};
    for (int i = 0; ann[i]; i++)
        if (strcmp(k, ann[i]) == 0)
            return 1;
    return 0;
}

// true, or an object of annotations only (it constrains nothing: an allOf member to skip)
static int annotation_only(const json_t *m) {
    const char *k;
    const json_t *v;
    if (!json_is_object(m))
        return json_is_true(m);
    json_object_foreach((json_t *)m, k, v) {
        if (!is_annotation(k))
            return 0;
    }
    return 1;
}

static int is_supported(const char *k) {
    static const char *const kw[] = {"type",
                                     "properties",
                                     "required",
                                     "additionalProperties",
                                     "items",
                                     "minItems",
                                     "maxItems",
                                     "enum",
                                     "const",
                                     "anyOf",
                                     "$ref",
                                     "minLength",
                                     "maxLength",
                                     "pattern",
                                     "format",
                                     "minimum",
                                     "maximum",
                                     "exclusiveMinimum",
                                     "exclusiveMaximum",
                                     "oneOf",
                                     "allOf",
                                     "prefixItems",
                                     "additionalItems",
                                     NULL};
    for (int i = 0; kw[i]; i++)
        if (strcmp(k, kw[i]) == 0)
            return 1;
    return is_annotation(k);
}

// A count keyword (minLength, maxItems, ...): *out set when present; -1 on a bad value.
static int count_kw(sc *s, const json_t *schema, const char *k, uint32_t *out) {
    const json_t *v = json_object_get(schema, k);
    if (!v)
        return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0) {
        rx_fail(s->c, TM_GUIDE_WHY_INVALID, "schema: '%s' must be an integer >= 0", k);
        return -1;
    }
    if (json_integer_value(v) > RX_MAX_REPEAT) {
        rx_fail(s->c, TM_GUIDE_WHY_UNSUPPORTED, "schema: '%s' over %u is not supported", k,
                RX_MAX_REPEAT);
        return -1;
    }
    *out = (uint32_t)json_integer_value(v);
    return 0;
}

static rx_node *string_schema(sc *s, const json_t *schema) {
    uint32_t min = 0, max = RX_INF;
    if (count_kw(s, schema, "minLength", &min) || count_kw(s, schema, "maxLength", &max))
        return NULL;
    if (max != RX_INF && max < min)
        return rx_fail(s->c, TM_GUIDE_WHY_INVALID, "schema: maxLength is below minLength");
    const json_t *fmt = json_object_get(schema, "format");
    if (fmt) {
        if (!json_is_string(fmt))
            return rx_fail(s->c, TM_GUIDE_WHY_INVALID, "schema: 'format' must be a string");
        const char *re = rx_format_regex(json_string_value(fmt));
        if (!re)
            return rx_fail(s->c, TM_GUIDE_WHY_UNSUPPORTED,
                           "schema: keyword 'format' with value '%.40s' is not supported "
                           "(date-time, date, time, duration, email, hostname, ipv4, ipv6, uuid "
                           "are)",
                           json_string_value(fmt));
        if (json_object_get(schema, "pattern") || json_object_get(schema, "minLength") ||
            json_object_get(schema, "maxLength"))
            return rx_fail(s->c, TM_GUIDE_WHY_UNSUPPORTED,
                           "schema: 'format' together with 'pattern', 'minLength' or "
                           "'maxLength' is not supported");
        rx_node *k[] = {lit(s, "\""), rx_parse(s->c, re, strlen(re), 1), lit(s, "\"")};
        return rx_cat(s->c, k, 3);
    }
    const json_t *pat = json_object_get(schema, "pattern");
    if (pat) {
        if (!json_is_string(pat))
            return rx_fail(s->c, TM_GUIDE_WHY_INVALID, "schema: 'pattern' must be a string");
        if (json_object_get(schema, "minLength") || json_object_get(schema, "maxLength"))
            return rx_fail(s->c, TM_GUIDE_WHY_UNSUPPORTED,
                           "schema: 'pattern' together with 'minLength'/'maxLength' is not "
                           "supported");
        rx_node *in = rx_parse(s->c, json_string_value(pat), json_string_length(pat), 1);
        rx_node *k[] = {lit(s, "\""), in, lit(s, "\"")};
        return rx_cat(s->c, k, 3);
    }
    return str_schema(s, min, max);
}

static rx_node *tuple_schema(sc *s, const json_t *schema, uint32_t lo, uint32_t hi);

static rx_node *array_schema(sc *s, const json_t *schema) {
    uint32_t min = 0, max = RX_INF;
    if (count_kw(s, schema, "minItems", &min) || count_kw(s, schema, "maxItems", &max))
        return NULL;
    if (max != RX_INF && max < min)
        return rx_fail(s->c, TM_GUIDE_WHY_INVALID, "schema: maxItems is below minItems");
    const json_t *items = json_object_get(schema, "items");
    if (json_object_get(schema, "prefixItems") || json_is_array(items) || json_is_false(items))
        return tuple_schema(s, schema, min, max);
    if (json_object_get(schema, "additionalItems"))
        return rx_fail(s->c, TM_GUIDE_WHY_UNSUPPORTED,
                       "schema: 'additionalItems' is only supported after 'items' as a list "
                       "(draft 7 tuples; in draft 2020-12 write 'prefixItems' and 'items')");
    if (items && !json_is_object(items) && !json_is_true(items))
        return rx_fail(s->c, TM_GUIDE_WHY_UNSUPPORTED,
                       "schema: 'items' must be a schema object, a list of them (a tuple) or "
                       "false");
    rx_node *item = items && json_is_object(items) ? value(s, items) : value(s, NULL);
    if (!item)
        return NULL;
    rx_node *sep_item = rx_cat2(s->c, rx_cat2(s->c, lit(s, ","), s->ws), item);
    rx_node *body;
    if (max == 0) {
        body = rx_empty(s->c);
    } else {
        rx_node *rest = rx_rep(s->c, sep_item, min ? min - 1 : 0, max == RX_INF ? RX_INF : max - 1);
        body = rx_cat2(s->c, item, rest);
        if (min == 0)
            body = rx_rep(s->c, body, 0, 1);
    }
    rx_node *k[] = {lit(s, "["), body, lit(s, "]")};
    return rx_cat(s->c, k, 3);
}

static rx_node *object_schema(sc *s, const json_t *schema) {
    const json_t *props = json_object_get(schema, "properties");
    const json_t *req = json_object_get(schema, "required");
    const json_t *addl = json_object_get(schema, "additionalProperties");
    if (props && !json_is_object(props))
        return rx_fail(s->c, TM_GUIDE_WHY_INVALID, "schema: 'properties' must be an object");
    if (req && !json_is_array(req))
        return rx_fail(s->c, TM_GUIDE_WHY_INVALID, "schema: 'required' must be an array");
    if (addl && !json_is_boolean(addl))
        return rx_fail(s->c, TM_GUIDE_WHY_UNSUPPORTED,
                       "schema: 'additionalProperties' as a schema is not supported (use false)");
    size_t n = props ? json_object_size(props) : 0;
    for (size_t i = 0; req && i < json_array_size(req); i++) {
        const json_t *r = json_array_get(req, i);
        if (!json_is_string(r))
            return rx_fail(s->c, TM_GUIDE_WHY_INVALID, "schema: 'required' must list strings");
        if (!props || !json_object_get(props, json_string_value(r)))
            return rx_fail(s->c, TM_GUIDE_WHY_UNSUPPORTED,
                           "schema: 'required' names '%.60s', which is not in 'properties'",
                           json_string_value(r));
    }
    if (n == 0) {
        if (!props && !json_is_false(addl)) // {"type": "object"}: any object
            return generic_object(s->c, s->ws, 2);
        return lit(s, "{}");
    }
    // member i: "key": value; required or optional. In schema (insertion) order.
    rx_node **mem = tm_calloc(n, sizeof(*mem));
    int *opt = tm_calloc(n, sizeof(*opt));
    rx_node **tails = tm_calloc(n + 1, sizeof(*tails));
    rx_node *x = NULL;
    if (!mem || !opt || !tails) {
        rx_fail(s->c, TM_GUIDE_WHY_NONE, "guided: out of memory");
        goto out;
    }
    const char *key;
    const json_t *sub;
    size_t i = 0;
    json_object_foreach((json_t *)props, key, sub) {
        json_t *k = json_string(key);
        rx_node *kl = k ? json_lit(s, k) : rx_fail(s->c, TM_GUIDE_WHY_NONE, "out of memory");
        json_decref(k);
        rx_node *v = json_is_object(sub) || json_is_boolean(sub)
                         ? value(s, sub)
                         : rx_fail(s->c, TM_GUIDE_WHY_INVALID,
                                   "schema: property '%.60s' must be a schema object", key);
        rx_node *parts[] = {kl, lit(s, ":"), s->ws, v};
        mem[i] = rx_cat(s->c, parts, 4);
        if (!mem[i])
            goto out;
        opt[i] = 1;
        for (size_t j = 0; req && j < json_array_size(req); j++)
            if (strcmp(json_string_value(json_array_get(req, j)), key) == 0)
                opt[i] = 0;
        i++;
    }
    // tails[i]: members i.. after at least one was written (each with its comma)
    tails[n] = rx_empty(s->c);
    for (size_t j = n; j-- > 0;) {
        rx_node *one[] = {lit(s, ","), s->ws, mem[j]};
        rx_node *m = rx_cat(s->c, one, 3);
        if (opt[j])
            m = rx_rep(s->c, m, 0, 1);
        tails[j] = rx_cat2(s->c, m, tails[j + 1]);
    }
    // first[i]: members i.. when none was written yet
    rx_node *first = rx_empty(s->c);
    for (size_t j = n; j-- > 0;) {
        rx_node *here = rx_cat2(s->c, mem[j], tails[j + 1]);
        if (opt[j]) {
            rx_node *alt[] = {here, first};
            first = rx_alt(s->c, alt, 2);
        } else {
            first = here;
        }
    }
    rx_node *k[] = {lit(s, "{"), first, lit(s, "}")};
    x = rx_cat(s->c, k, 3);
out:
    tm_free(mem);
    tm_free(opt);
    tm_free(tails);
    return x;
}

static rx_node *type_schema(sc *s, const json_t *schema, const char *t) {
    if (strcmp(t, "string") == 0)
        return string_schema(s, schema);
    if (strcmp(t, "integer") == 0)
        return rx_has_number_bounds(schema) ? rx_number_range(s->c, schema, 1) : rx_int(s->c);
    if (strcmp(t, "number") == 0)
        return rx_has_number_bounds(schema) ? rx_number_range(s->c, schema, 0) : json_number(s->c);
    if (strcmp(t, "boolean") == 0) {
        rx_node *k[] = {lit(s, "true"), lit(s, "false")};
        return rx_alt(s->c, k, 2);
    }
    if (strcmp(t, "null") == 0)
        return lit(s, "null");
    if (strcmp(t, "object") == 0)
        return object_schema(s, schema);
    if (strcmp(t, "array") == 0)
        return array_schema(s, schema);
    return rx_fail(s->c, TM_GUIDE_WHY_INVALID, "schema: unknown type '%.40s'", t);
}

// A local $ref: "#" or a JSON pointer "#/a/b/0" (RFC 6901: "~1" is '/', "~0" is '~'; the URI
// fragment's %XX escapes decoded), e.g. "#/$defs/name" or zod's "#/properties/x": the schema it
// names, NULL when it names none (*known 1) or is not local (*known 0).
static const json_t *lookup(const sc *s, const char *ref, int *known) {
    *known = ref[0] == '#' && (ref[1] == '\0' || ref[1] == '/');
    if (!*known)
        return NULL;
    const json_t *at = s->root;
    for (const char *p = ref + 1; at && *p == '/';) {
        char tok[256];
        size_t n = 0;
        for (p++; *p && *p != '/'; p++) {
            int c = (unsigned char)*p;
            if (c == '%' && isxdigit((unsigned char)p[1]) && isxdigit((unsigned char)p[2])) {
                char hex[3] = {p[1], p[2], 0};
                c = (int)strtol(hex, NULL, 16), p += 2;
            } else if (c == '~' && (p[1] == '0' || p[1] == '1')) {
                c = p[1] == '0' ? '~' : '/', p++;
            }
            if (n + 1 >= sizeof(tok))
                return NULL; // a name this long names nothing we keep
            tok[n++] = (char)c;
        }
        tok[n] = '\0';
        if (json_is_object(at)) {
            at = json_object_get(at, tok);
        } else if (json_is_array(at) && n > 0 && n < 10 && strspn(tok, "0123456789") == n &&
                   (tok[0] != '0' || n == 1)) {
            at = json_array_get(at, (size_t)strtoul(tok, NULL, 10));
        } else {
            at = NULL;
        }
    }
    return at;
}

// lookup, with an error for a $ref it cannot follow.
static const json_t *resolve(sc *s, const char *ref) {
    int known;
    const json_t *d = lookup(s, ref, &known);
    if (d)
        return d;
    if (known)
        return rx_fail(s->c, TM_GUIDE_WHY_INVALID, "schema: '$ref' %.80s names no schema", ref);
    return rx_fail(s->c, TM_GUIDE_WHY_UNSUPPORTED,
                   "schema: '$ref' %.80s is not supported (only local ones: # and JSON pointers "
                   "such as #/$defs/name)",
                   ref);
}

static rx_node *ref_schema(sc *s, const json_t *ref) {
    if (!json_is_string(ref))
        return rx_fail(s->c, TM_GUIDE_WHY_INVALID, "schema: '$ref' must be a string");
    const char *name = json_string_value(ref);
    uint32_t seen = 0;
    for (uint32_t i = 0; i < s->n_ref; i++)
        seen += strcmp(s->ref_name[i], name) == 0;
    if (seen >= TM_GUIDE_REF_DEPTH) // recursion: this branch gets no deeper
        return rx_none(s->c);
    const json_t *d = resolve(s, name);
    if (!d)
        return NULL;
    if (s->n_ref == MAX_SCHEMA_DEPTH)
        return rx_fail(s->c, TM_GUIDE_WHY_UNSUPPORTED, "schema: '$ref' nested too deeply");
    s->ref_name[s->n_ref++] = name;
    rx_node *x = value(s, d);
    s->n_ref--;
    return x;
}

// oneOf: its branches must exclude each other, so that an answer generated from one of them
// (as anyOf) matches no other (oneOf fails on two matches). disjoint() proves it conservatively
// from the schema objects: 1 only when no JSON value can satisfy both schemas, 0 when unsure.
// The JSON types a schema's type / const / enum allow, as bits (integer and number are one bit:
// 1.0 is an integer to a validator).
enum { TY_NULL = 1, TY_BOOL = 2, TY_OBJ = 4, TY_ARR = 8, TY_STR = 16, TY_NUM = 32, TY_ALL = 63 };

static unsigned value_type(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_NULL:
        return TY_NULL;
    case JSON_TRUE:
    case JSON_FALSE:
        return TY_BOOL;
    case JSON_OBJECT:
        return TY_OBJ;
    case JSON_ARRAY:
        return TY_ARR;
    case JSON_STRING:
        return TY_STR;
    default:
        return TY_NUM;
    }
}

static unsigned type_bits(const json_t *t) {
    static const char *const name[] = {"null",   "boolean", "object", "array",
                                       "string", "integer", "number"};
    static const unsigned bit[] = {TY_NULL, TY_BOOL, TY_OBJ, TY_ARR, TY_STR, TY_NUM, TY_NUM};
    if (json_is_array(t)) {
        unsigned u = 0;
        for (size_t i = 0; i < json_array_size(t); i++)
            u |= type_bits(json_array_get(t, i));
        return u;
    }
    for (int i = 0; json_is_string(t) && i < 7; i++)
        if (strcmp(json_string_value(t), name[i]) == 0)
            return bit[i];
    return TY_ALL; // not a type name: no claim
}

// The literal values a schema allows (const, else enum): *n of them, lit_at(s, i) the i-th; 0
// when it does not list them.
static int lits(const json_t *s, size_t *n) {
    const json_t *e = json_object_get(s, "enum");
    *n = json_object_get(s, "const") ? 1 : json_array_size(e);
    return json_object_get(s, "const") || json_is_array(e);
}

static const json_t *lit_at(const json_t *s, size_t i) {
    const json_t *c = json_object_get(s, "const");
    return c ? c : json_array_get(json_object_get(s, "enum"), i);
}

static unsigned local_types(const json_t *s) {
    unsigned t = TY_ALL;
    if (json_object_get(s, "type"))
        t &= type_bits(json_object_get(s, "type"));
    size_t n;
    if (lits(s, &n)) {
        unsigned u = 0;
        for (size_t i = 0; i < n; i++)
            u |= value_type(lit_at(s, i));
        t &= u;
    }
    return t;
}

// Whether two JSON values may be equal to a validator (deep equality, numbers compared as the
// doubles JSON.parse makes of them, so 1 and 1.0 are equal).
static int may_equal(const json_t *a, const json_t *b) {
    if (json_is_number(a) && json_is_number(b))
        return json_number_value(a) == json_number_value(b);
    if (json_typeof(a) != json_typeof(b))
        return 0;
    if (json_is_string(a))
        return json_string_length(a) == json_string_length(b) &&
               memcmp(json_string_value(a), json_string_value(b), json_string_length(a)) == 0;
    if (json_is_array(a)) {
        if (json_array_size(a) != json_array_size(b))
            return 0;
        for (size_t i = 0; i < json_array_size(a); i++)
            if (!may_equal(json_array_get(a, i), json_array_get(b, i)))
                return 0;
        return 1;
    }
    if (json_is_object(a)) {
        const char *k;
        const json_t *v;
        if (json_object_size(a) != json_object_size(b))
            return 0;
        json_object_foreach((json_t *)a, k, v) {
            const json_t *w = json_object_get(b, k);
            if (!w || !may_equal(v, w))
                return 0;
        }
    }
    return 1; // null, true, false, or equal objects
}

// a lists its literals and none of them satisfies b's type / const / enum.
static int lits_excluded(sc *s, const json_t *a, const json_t *b) {
    size_t na, nb;
    if (!lits(a, &na))
        return 0;
    int lb = lits(b, &nb);
    unsigned tb = local_types(b);
    for (size_t i = 0; i < na; i++) {
        const json_t *x = lit_at(a, i);
        if (!(value_type(x) & tb))
            continue;
        if (!lb)
            return 0;
        for (size_t j = 0; j < nb; j++) {
            if (s->dj_left == 0)
                return 0;
            s->dj_left--;
            if (may_equal(x, lit_at(b, j)))
                return 0;
        }
    }
    return 1;
}

static int disjoint(sc *s, const json_t *a, const json_t *b, uint32_t depth);

// Objects only, on both sides: a property that b requires (so a common value has it) and whose
// schemas in a and b are disjoint (the discriminated union), or that a forbids
// (additionalProperties false).
static int objects_disjoint(sc *s, const json_t *a, const json_t *b, uint32_t depth) {
    const json_t *rb = json_object_get(b, "required");
    const json_t *pa = json_object_get(a, "properties"), *pb = json_object_get(b, "properties");
    for (size_t j = 0; json_is_array(rb) && j < json_array_size(rb); j++) {
        const char *k = json_string_value(json_array_get(rb, j));
        if (!k)
            continue;
        if (json_is_false(json_object_get(a, "additionalProperties")) &&
            !json_object_get(a, "patternProperties") && !json_object_get(pa, k))
            return 1;
        const json_t *xa = json_object_get(pa, k), *xb = json_object_get(pb, k);
        if (json_is_object(pa) && json_is_object(pb) && xa && xb && disjoint(s, xa, xb, depth + 1))
            return 1;
    }
    return 0;
}

static int disjoint(sc *s, const json_t *a, const json_t *b, uint32_t depth) {
    if (s->dj_left == 0 || depth > DJ_DEPTH)
        return 0;
    s->dj_left--;
    if (json_is_false(a) || json_is_false(b))
        return 1;
    if (!json_is_object(a) || !json_is_object(b))
        return 0;
    for (int side = 0; side < 2; side++) {
        const json_t *x = side ? b : a, *y = side ? a : b;
        // x accepts only what its $ref and each allOf schema accept, and only what one of its
        // anyOf / oneOf branches accepts
        const json_t *ref = json_object_get(x, "$ref");
        int known;
        const json_t *d = json_is_string(ref) ? lookup(s, json_string_value(ref), &known) : NULL;
        if (d && disjoint(s, d, y, depth + 1))
            return 1;
        const json_t *all = json_object_get(x, "allOf");
        for (size_t i = 0; json_is_array(all) && i < json_array_size(all); i++)
            if (disjoint(s, json_array_get(all, i), y, depth + 1))
                return 1;
        static const char *const alts[] = {"anyOf", "oneOf"};
        for (int k = 0; k < 2; k++) {
            const json_t *alt = json_object_get(x, alts[k]);
            size_t i = 0, n = json_is_array(alt) ? json_array_size(alt) : 0;
            while (i < n && disjoint(s, json_array_get(alt, i), y, depth + 1))
                i++;
            if (n && i == n)
                return 1;
        }
    }
    // the keywords beside a $ref: not relied on (draft 7 ignores them; schemas with ones that
    // constrain are refused anyway)
    if (json_object_get(a, "$ref") || json_object_get(b, "$ref"))
        return 0;
    unsigned t = local_types(a) & local_types(b);
    if (!t || lits_excluded(s, a, b) || lits_excluded(s, b, a))
        return 1;
    return t == TY_OBJ && (objects_disjoint(s, a, b, depth) || objects_disjoint(s, b, a, depth));
}

// Tuples: prefixItems (draft 2020-12) with items (more items of it, or false: no more), or
// items as a list (drafts 4-7) with additionalItems; within minItems..maxItems. Absent or true
// for the rest: only the listed positions, plus any JSON values where minItems asks for more
// (as additionalProperties true generates only the declared properties).
static rx_node *tuple_schema(sc *s, const json_t *schema, uint32_t lo, uint32_t hi) {
    const json_t *pre = json_object_get(schema, "prefixItems");
    const json_t *items = json_object_get(schema, "items");
    const json_t *list = pre, *rest = items;
    const char *rest_kw = "items";
    if (pre && (!json_is_array(pre) || json_array_size(pre) == 0))
        return rx_fail(s->c, TM_GUIDE_WHY_INVALID,
                       "schema: 'prefixItems' must be a non-empty list of schemas");
    if (pre && json_is_array(items))
        return rx_fail(s->c, TM_GUIDE_WHY_INVALID,
                       "schema: 'items' next to 'prefixItems' must be a schema or false (the "
                       "list form of 'items' is draft 7's tuple: use one form)");
    if (pre && json_object_get(schema, "additionalItems"))
        return rx_fail(s->c, TM_GUIDE_WHY_UNSUPPORTED,
                       "schema: 'additionalItems' next to 'prefixItems' is not supported (draft "
                       "2020-12 has none: give the schema of further items as 'items')");
    if (!pre && json_is_array(items)) {
        list = items;
        rest = json_object_get(schema, "additionalItems");
        rest_kw = "additionalItems";
    } else if (!pre) {
        list = NULL; // items false: the empty array
    }
    size_t n = list ? json_array_size(list) : 0;
    if (n > RX_MAX_REPEAT)
        return rx_fail(s->c, TM_GUIDE_WHY_UNSUPPORTED,
                       "schema: a tuple of more than %u positions is not supported", RX_MAX_REPEAT);
    if (rest && !json_is_boolean(rest) && !json_is_object(rest))
        return rx_fail(s->c, TM_GUIDE_WHY_INVALID, "schema: '%s' must be a schema", rest_kw);
    if (json_is_false(rest) && hi > n)
        hi = (uint32_t)n;
    else if (!json_is_object(rest) && hi > (lo > n ? lo : n))
        hi = lo > n ? lo : (uint32_t)n;
    if (hi < lo) // e.g. minItems past a closed tuple: nothing (this branch, if one of several)
        return rx_none(s->c);
    rx_node *extra = json_is_object(rest) ? value(s, rest)
                     : hi > n             ? value(s, NULL)
                                          : rx_empty(s->c); // never used
    rx_node **pos = tm_calloc(n + 1, sizeof(*pos));
    if (!pos)
        return rx_fail(s->c, TM_GUIDE_WHY_NONE, "guided: out of memory");
    int ok = extra != NULL;
    for (size_t i = 0; ok && i < n; i++)
        ok = (pos[i] = value(s, json_array_get(list, i))) != NULL;
    pos[n] = extra;
    rx_node *x = NULL;
    if (ok) {
        // tail: the items after the first k (each with its comma); positions k.. are extras
        uint32_t k = n ? (uint32_t)n : 1;
        if (hi < k)
            k = hi;
        rx_node *sep_extra = rx_cat2(s->c, rx_cat2(s->c, lit(s, ","), s->ws), extra);
        rx_node *tail = hi != RX_INF && hi <= k ? rx_empty(s->c)
                                                : rx_rep(s->c, sep_extra, lo > k ? lo - k : 0,
                                                         hi == RX_INF ? RX_INF : hi - k);
        for (uint32_t i = k; i-- > 1;) {
            rx_node *one[] = {lit(s, ","), s->ws, pos[i < n ? i : n], tail};
            tail = rx_cat(s->c, one, 4);
            if (i >= lo)
                tail = rx_rep(s->c, tail, 0, 1);
        }
        rx_node *body = hi == 0 ? rx_empty(s->c) : rx_cat2(s->c, pos[0], tail);
        if (lo == 0 && hi > 0)
            body = rx_rep(s->c, body, 0, 1);
        rx_node *kk[] = {lit(s, "["), body, lit(s, "]")};
        x = rx_cat(s->c, kk, 3);
    }
    tm_free(pos);
    return x;
}

// Any JSON value nested at most depth objects/arrays deep.
static rx_node *generic(rx_ctx *c, rx_node *ws, uint32_t depth) {
    rx_node *str = rx_cat2(c, rx_str(c, "\""),
                           rx_cat2(c, json_chars(c, 0, RX_INF), rx_str(c, "\"")));
    rx_node *sc5[] = {str, json_number(c), rx_str(c, "true"), rx_str(c, "false"),
                      rx_str(c, "null")};
    rx_node *scalar = rx_alt(c, sc5, 5);
    if (depth == 0)
        return scalar;
    rx_node *inner = generic(c, ws, depth - 1);
    rx_node *mem[] = {str, rx_str(c, ":"), ws, inner};
    rx_node *m = rx_cat(c, mem, 4);
    rx_node *sep = rx_cat2(c, rx_str(c, ","), ws);
    rx_node *ob[] = {rx_str(c, "{"),
                     rx_rep(c, rx_cat2(c, m, rx_rep(c, rx_cat2(c, sep, m), 0, RX_INF)), 0, 1),
                     rx_str(c, "}")};
    rx_node *ar[] = {
        rx_str(c, "["),
        rx_rep(c, rx_cat2(c, inner, rx_rep(c, rx_cat2(c, sep, inner), 0, RX_INF)), 0, 1),
        rx_str(c, "]")};
    rx_node *v3[] = {scalar, rx_cat(c, ob, 3), rx_cat(c, ar, 3)};
    return rx_alt(c, v3, 3);
}

// One JSON object nested at most depth deep (itself included), depth >= 1.
static rx_node *generic_object(rx_ctx *c, rx_node *ws, uint32_t depth) {
    rx_node *str = rx_cat2(c, rx_str(c, "\""),
                           rx_cat2(c, json_chars(c, 0, RX_INF), rx_str(c, "\"")));
    rx_node *inner = generic(c, ws, depth - 1);
    rx_node *mem[] = {str, rx_str(c, ":"), ws, inner};
    rx_node *m = rx_cat(c, mem, 4);
    rx_node *sep = rx_cat2(c, rx_str(c, ","), ws);
    rx_node *ob[] = {rx_str(c, "{"),
                     rx_rep(c, rx_cat2(c, m, rx_rep(c, rx_cat2(c, sep, m), 0, RX_INF)), 0, 1),
                     rx_str(c, "}")};
    return rx_cat(c, ob, 3);
}

// json_object: one JSON object, nested at most TM_GUIDE_JSON_DEPTH deep (itself included).
rx_node *rx_json_object(rx_ctx *c) {
    return generic_object(c, rx_rep(c, rx_str(c, " "), 0, 1), TM_GUIDE_JSON_DEPTH);
}

// The tree of a schema (NULL, true or {}: any JSON value, nested at most 2 deep).
// 1 when the literal v is of a type that `type` (absent, a name or a list of names) allows
// (an integer also being a number; a real with no fraction an integer, as validators count).
static int literal_fits(const json_t *v, const json_t *type) {
    if (!type)
        return 1;
    const size_t n = json_is_array(type) ? json_array_size(type) : 1;
    for (size_t i = 0; i < n; i++) {
        const json_t *t = json_is_array(type) ? json_array_get(type, i) : type;
        const char *name = json_is_string(t) ? json_string_value(t) : "";
        const double d = json_is_number(v) ? json_number_value(v) : 0.0;
        if ((strcmp(name, "string") == 0 && json_is_string(v)) ||
            (strcmp(name, "number") == 0 && json_is_number(v)) ||
            (strcmp(name, "integer") == 0 &&
             (json_is_integer(v) || (json_is_real(v) && isfinite(d) && d == floor(d)))) ||
            (strcmp(name, "boolean") == 0 && json_is_boolean(v)) ||
            (strcmp(name, "null") == 0 && json_is_null(v)) ||
            (strcmp(name, "object") == 0 && json_is_object(v)) ||
            (strcmp(name, "array") == 0 && json_is_array(v)))
            return 1;
    }
    return 0;
}

// const / enum: the listed values that the sibling `type` (and `enum`, beside a const) allows;
// any other constraining sibling is refused, since the values are written as they are.
static rx_node *literals(sc *s, const json_t *schema, const json_t *cst, const json_t *en) {
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)schema, key, v) {
        if (!is_annotation(key) && strcmp(key, "const") != 0 && strcmp(key, "enum") != 0 &&
            strcmp(key, "type") != 0)
            return rx_fail(s->c, TM_GUIDE_WHY_UNSUPPORTED,
                           "schema: '%s' together with '%.60s' is not supported (the listed "
                           "values are written as they are: drop the keyword or the values it "
                           "excludes)",
                           cst ? "const" : "enum", key);
    }
    if (en && (!json_is_array(en) || json_array_size(en) == 0))
        return rx_fail(s->c, TM_GUIDE_WHY_INVALID, "schema: 'enum' must be a non-empty array");
    const json_t *type = json_object_get(schema, "type");
    const size_t n = cst ? 1 : json_array_size(en);
    rx_node **k = tm_calloc(n, sizeof(*k));
    if (!k)
        return rx_fail(s->c, TM_GUIDE_WHY_NONE, "guided: out of memory");
    uint32_t m = 0;
    for (size_t i = 0; i < n; i++) {
        const json_t *lit = cst ? cst : json_array_get(en, i);
        int in_enum = !cst || !en;
        for (size_t j = 0; !in_enum && json_is_array(en) && j < json_array_size(en); j++)
            in_enum = json_equal((json_t *)lit, json_array_get(en, j));
        if (in_enum && literal_fits(lit, type))
            k[m++] = json_lit(s, lit);
    }
    rx_node *x = m ? rx_alt(s->c, k, m)
                   : rx_fail(s->c, TM_GUIDE_WHY_INVALID,
                             "schema: no output satisfies the constraint (no '%s' value is of "
                             "the schema's type%s)",
                             cst ? "const" : "enum", cst && en ? " and in its 'enum'" : "");
    tm_free(k);
    return x;
}

static rx_node *value(sc *s, const json_t *schema) {
    if (!schema || json_is_true(schema) || (json_is_object(schema) && !json_object_size(schema)))
        return generic(s->c, s->ws, 2);
    if (json_is_false(schema))
        return rx_none(s->c);
    if (!json_is_object(schema))
        return rx_fail(s->c, TM_GUIDE_WHY_INVALID, "schema: a schema must be an object");
    if (++s->depth > MAX_SCHEMA_DEPTH)
        return rx_fail(s->c, TM_GUIDE_WHY_UNSUPPORTED, "schema: nested deeper than %d",
                       MAX_SCHEMA_DEPTH);
    rx_node *x = NULL;
    const char *key;
    const json_t *v;
    int n_constraint = 0; // keywords besides annotations
    const json_t *any = json_object_get(schema, "anyOf");
    const json_t *one = json_object_get(schema, "oneOf");
    const json_t *all = json_object_get(schema, "allOf");
    json_object_foreach((json_t *)schema, key, v) {
        if (strcmp(key, "discriminator") == 0 && (any || one))
            continue; // OpenAPI's annotation of a union (pydantic's discriminated unions)
        if (!is_supported(key)) {
            x = rx_fail(s->c, TM_GUIDE_WHY_UNSUPPORTED,
                        strcmp(key, "discriminator") == 0
                            ? "schema: keyword '%.60s' is only supported next to 'oneOf' or "
                              "'anyOf' (as an annotation)"
                            : "schema: keyword '%.60s' is not supported "
                              "(docs/structured_output.md lists the subset)",
                        key);
            goto out;
        }
        n_constraint += !is_annotation(key);
    }
    const json_t *ref = json_object_get(schema, "$ref");
    const json_t *cst = json_object_get(schema, "const");
    const json_t *en = json_object_get(schema, "enum");
    const json_t *type = json_object_get(schema, "type");
    const char *alone = ref ? "$ref" : any ? "anyOf" : one ? "oneOf" : all ? "allOf" : NULL;
    if (alone && n_constraint > 1) {
        const char *sib = NULL; // the first keyword beside it that constrains
        json_object_foreach((json_t *)schema, key, v) {
            if (!sib && strcmp(key, alone) != 0 && !is_annotation(key) &&
                strcmp(key, "discriminator") != 0)
                sib = key;
        }
        x = rx_fail(s->c, TM_GUIDE_WHY_UNSUPPORTED,
                    "schema: '%s' with the sibling keyword '%.60s' is not supported: only "
                    "annotations (title, description, default, ...) may stand beside it (%s)",
                    alone, sib ? sib : "?",
                    ref   ? "move it into the referenced schema"
                    : all ? "move it into the one allOf schema that constrains"
                          : "move it into each branch");
        goto out;
    }
    if (ref) {
        x = ref_schema(s, ref);
    } else if (cst || en) {
        x = literals(s, schema, cst, en);
    } else if (any || one) {
        const json_t *alt = any ? any : one; // oneOf: generated as anyOf once proven disjoint
        if (!json_is_array(alt) || json_array_size(alt) == 0) {
            x = rx_fail(s->c, TM_GUIDE_WHY_INVALID, "schema: '%s' must be a non-empty array",
                        any ? "anyOf" : "oneOf");
            goto out;
        }
        size_t n = json_array_size(alt);
        rx_node **k = tm_calloc(n, sizeof(*k));
        if (!k) {
            x = rx_fail(s->c, TM_GUIDE_WHY_NONE, "guided: out of memory");
            goto out;
        }
        for (size_t i = 0; i < n; i++)
            k[i] = value(s, json_array_get(alt, i));
        x = rx_alt(s->c, k, (uint32_t)n);
        tm_free(k);
        for (size_t i = 0; x && !any && i < n; i++)
            for (size_t j = i + 1; x && j < n; j++)
                if (!disjoint(s, json_array_get(alt, i), json_array_get(alt, j), 0))
                    x = rx_fail(s->c, TM_GUIDE_WHY_UNSUPPORTED,
                                s->dj_left
                                    ? "schema: 'oneOf' branches %zu and %zu (counting from 1) "
                                      "may both match, and oneOf fails on two matches (give "
                                      "them different types, or a property required in both "
                                      "with different const/enum values; or use anyOf)"
                                    : "schema: 'oneOf' is too large to check that branches "
                                      "%zu and %zu exclude each other (use anyOf)",
                                i + 1, j + 1);
    } else if (all) {
        // one schema that constrains, the others annotations only: that one
        size_t n = json_is_array(all) ? json_array_size(all) : 0, n_c = 0;
        const json_t *only = NULL;
        for (size_t i = 0; i < n; i++)
            if (!annotation_only(json_array_get(all, i)) && n_c++ == 0)
                only = json_array_get(all, i);
        if (n == 0)
            x = rx_fail(s->c, TM_GUIDE_WHY_INVALID, "schema: 'allOf' must be a non-empty array");
        else if (n_c > 1)
            x = rx_fail(s->c, TM_GUIDE_WHY_UNSUPPORTED,
                        "schema: 'allOf' of %zu schemas that constrain is not supported (an "
                        "intersection: merge them into one schema, or keep one and leave the "
                        "others annotations only)",
                        n_c);
        else
            x = value(s, only); // NULL when all are annotations: any value
    } else if (json_is_string(type)) {
        x = type_schema(s, schema, json_string_value(type));
    } else if (json_is_array(type) && json_array_size(type) > 0 && json_array_size(type) <= 7) {
        rx_node *k[7];
        size_t n = json_array_size(type);
        for (size_t i = 0; i < n; i++) {
            const json_t *t = json_array_get(type, i);
            k[i] = json_is_string(t)
                       ? type_schema(s, schema, json_string_value(t))
                       : rx_fail(s->c, TM_GUIDE_WHY_INVALID, "schema: 'type' must list type names");
        }
        x = rx_alt(s->c, k, (uint32_t)n);
    } else if (type) {
        x = rx_fail(s->c, TM_GUIDE_WHY_INVALID,
                    "schema: 'type' must be a type name or a list of 1 to 7 of them");
    } else if (json_object_get(schema, "properties") || json_object_get(schema, "required")) {
        x = object_schema(s, schema);
    } else if (json_object_get(schema, "items") || json_object_get(schema, "minItems") ||
               json_object_get(schema, "maxItems") || json_object_get(schema, "prefixItems")) {
        x = array_schema(s, schema);
    } else if (json_object_get(schema, "minLength") || json_object_get(schema, "maxLength") ||
               json_object_get(schema, "pattern")) {
        x = string_schema(s, schema);
    } else if (rx_has_number_bounds(schema) || json_object_get(schema, "format")) {
        // they constrain one type and leave the others free: give the type
        x = rx_fail(s->c, TM_GUIDE_WHY_UNSUPPORTED,
                    "schema: '%s' without 'type' is not supported (give \"type\": \"%s\")",
                    json_object_get(schema, "format") ? "format" : "minimum/maximum",
                    json_object_get(schema, "format") ? "string" : "number");
    } else {
        x = generic(s->c, s->ws, 2);
    }
out:
    s->depth--;
    return x;
}

rx_node *rx_schema(rx_ctx *c, const char *text, size_t n) {
    json_error_t jerr;
    json_t *root = json_loadb(text, n, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
    if (!root)
        return rx_fail(c, TM_GUIDE_WHY_INVALID, "schema: invalid JSON: %s", jerr.text);
    rx_node *x;
    if (!json_is_object(root) && !json_is_boolean(root)) {
        x = rx_fail(c, TM_GUIDE_WHY_INVALID, "schema: must be a JSON object");
    } else {
        sc s = {.c = c, .root = root, .dj_left = DJ_BUDGET};
        s.ws = rx_rep(c, rx_str(c, " "), 0, 1);
        x = value(&s, root);
    }
    json_decref(root);
    return x;
}

rx_node *rx_choice(rx_ctx *c, const char *text, size_t n) {
    json_error_t jerr;
    json_t *root = json_loadb(text, n, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return rx_fail(c, TM_GUIDE_WHY_INVALID, "guided_choice: invalid JSON: %s", jerr.text);
    rx_node *x = NULL;
    size_t k = json_is_array(root) ? json_array_size(root) : 0;
    rx_node **kids = k ? tm_calloc(k, sizeof(*kids)) : NULL;
    if (!k) {
        x = rx_fail(c, TM_GUIDE_WHY_INVALID, "guided_choice: must be a non-empty array of strings");
    } else if (!kids) {
        x = rx_fail(c, TM_GUIDE_WHY_NONE, "guided: out of memory");
    } else {
        for (size_t i = 0; i < k; i++) {
            const json_t *v = json_array_get(root, i);
            kids[i] = json_is_string(v)
                          ? rx_bytes(c, json_string_value(v), json_string_length(v))
                          : rx_fail(c, TM_GUIDE_WHY_INVALID,
                                    "guided_choice: must be a non-empty array of strings");
        }
        x = rx_alt(c, kids, (uint32_t)k);
    }
    tm_free(kids);
    json_decref(root);
    return x;
}

tm_rc tm_dfa_compile(tm_guide_kind kind, const char *spec, size_t n, tm_dfa **out,
                     tm_guide_why *why, tm_err *err) {
    return tm_dfa_compile_with(kind, spec, n, NULL, out, why, err);
}

tm_rc tm_dfa_compile_with(tm_guide_kind kind, const char *spec, size_t n, const tm_dfa_opts *opts,
                          tm_dfa **out, tm_guide_why *why, tm_err *err) {
    rx_ctx c = {.err = err, .max_work = opts ? opts->max_work : 0};
    rx_node *root = NULL;
    *out = NULL;
    switch (kind) {
    case TM_GUIDE_KIND_JSON_SCHEMA:
        root = rx_schema(&c, spec, n);
        break;
    case TM_GUIDE_KIND_JSON_OBJECT:
        root = rx_json_object(&c);
        break;
    case TM_GUIDE_KIND_REGEX:
        root = rx_parse(&c, spec, n, 0);
        break;
    case TM_GUIDE_KIND_CHOICE:
        root = rx_choice(&c, spec, n);
        break;
    default:
        rx_fail(&c, TM_GUIDE_WHY_INVALID, "guided: unknown constraint kind %d", (int)kind);
    }
    tm_rc rc = root ? rx_compile(&c, root, 0, out) : err->rc;
    if (!rc && !root)
        rc = TM_ERR(err, TM_E_INTERNAL, "guided: no tree and no error");
    *why = rc ? (c.why ? c.why : TM_GUIDE_WHY_NONE) : TM_GUIDE_WHY_NONE;
    rx_ctx_fini(&c);
    return rc;
}

tm_rc tm_dfa_regex(const char *re, size_t n, tm_dfa **out, tm_guide_why *why, tm_err *err) {
    return tm_dfa_compile(TM_GUIDE_KIND_REGEX, re, n, out, why, err);
}
