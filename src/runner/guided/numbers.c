/* runner/guided/numbers.c - JSON integers and numbers within minimum / maximum /
 * exclusiveMinimum / exclusiveMaximum, as expression trees (guided_int.h).
 *
 * A bound is read exactly when it is a JSON integer and as the shortest decimal that gives back
 * its double otherwise (0.1 is "0.1", not 0.1000000000000000055...). The numbers written under
 * bounds are plain decimals: an optional '-', an integer part without leading zeros of at most
 * TM_GUIDE_MAX_DIGITS digits, and for "number" an optional fraction of 1 to TM_GUIDE_MAX_DIGITS
 * digits; no exponent and never "-0". The set of such strings between two bounds is built digit by
 * digit, the way a digit-DP counts numbers in a range: the integer part length by length (a longer
 * integer part is larger), then each digit either still equal to a bound's digit ("tight") or
 * strictly inside, where anything may follow; the fraction goes on comparing against the bounds'
 * fraction digits padded with zeros, and stopping is allowed where the padded comparison holds.
 * Negative values are "-" and a magnitude between the negated bounds. The trees are linear in
 * the digits of the bounds: untight subtrees are the shared "any digits" ones. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runner/guided/guided_int.h"

#define ND TM_GUIDE_MAX_DIGITS

/* A non-negative decimal: integer digits (no leading zeros, "0" for zero) and fraction digits (no
 * trailing zeros). huge: the integer part has more than ND digits. */
typedef struct dec {
    char i[ND + 1], f[ND + 1];
    uint32_t ni, nf;
    int huge;
} dec;

/* A bound: the value (neg, m), whether it is exclusive; has == 0: none. */
typedef struct bound {
    int has, excl, neg;
    dec m;
} bound;

static int dec_is_zero(const dec *d) { return !d->huge && d->ni == 1 && d->i[0] == '0' && !d->nf; }

// -1, 0, 1 as a < b, a == b, a > b (magnitudes)
static int dec_cmp(const dec *a, const dec *b) {
    if (a->huge || b->huge)
        return a->huge == b->huge ? 0 : a->huge ? 1 : -1;
    if (a->ni != b->ni)
        return a->ni < b->ni ? -1 : 1;
    int c = memcmp(a->i, b->i, a->ni);
    if (c)
        return c < 0 ? -1 : 1;
    for (uint32_t k = 0; k < ND; k++) {
        char x = k < a->nf ? a->f[k] : '0', y = k < b->nf ? b->f[k] : '0';
        if (x != y)
            return x < y ? -1 : 1;
    }
    return 0;
}

// Signed values: -1, 0, 1.
static int val_cmp(const bound *a, const bound *b) {
    int za = dec_is_zero(&a->m), zb = dec_is_zero(&b->m);
    int sa = za ? 0 : a->neg ? -1 : 1, sb = zb ? 0 : b->neg ? -1 : 1;
    if (sa != sb)
        return sa < sb ? -1 : 1;
    int c = dec_cmp(&a->m, &b->m);
    return sa < 0 ? -c : c;
}

// The digits d[0, n) of 0.d * 10^point (the decimal point after `point` digits; point may be <= 0
// or > n) into a dec.
static void dec_set(dec *out, const char *d, int n, int point) {
    *out = (dec){0};
    if (point < -ND) { // 0.000...: more fraction digits than any bound may have
        out->i[0] = '0', out->ni = 1, out->nf = ND + 1;
        return;
    }
    char ib[64], fb[64];
    int ni = 0, nf = 0;
    for (int k = 0; k < point && ni < 63; k++)
        ib[ni++] = k < n ? d[k] : '0';
    for (int k = point; k < 0 && nf < 63; k++)
        fb[nf++] = '0';
    for (int k = point > 0 ? point : 0; k < n && nf < 63; k++)
        fb[nf++] = d[k];
    int s = 0;
    while (s < ni && ib[s] == '0')
        s++;
    while (nf > 0 && fb[nf - 1] == '0')
        nf--;
    if (ni - s > ND) {
        out->huge = 1;
        return;
    }
    if (s == ni) {
        out->i[0] = '0', out->ni = 1;
    } else {
        memcpy(out->i, ib + s, (size_t)(ni - s));
        out->ni = (uint32_t)(ni - s);
    }
    if (nf > ND) { // more fraction digits than a bound may have: the caller refuses it
        out->nf = ND + 1;
        return;
    }
    memcpy(out->f, fb, (size_t)nf);
    out->nf = (uint32_t)nf;
}

// A JSON number into a bound; -1 (c failed) when it is not a finite number or too precise.
static int read_bound(rx_ctx *c, const json_t *v, const char *kw, int excl, bound *b) {
    char buf[64];
    if (json_is_integer(v)) {
        json_int_t x = json_integer_value(v);
        unsigned long long mag = x < 0 ? 0ull - (unsigned long long)x : (unsigned long long)x;
        int n = snprintf(buf, sizeof(buf), "%llu", mag);
        dec_set(&b->m, buf, n, n);
        b->neg = x < 0;
    } else if (json_is_real(v) && isfinite(json_real_value(v))) {
        double x = json_real_value(v);
        int p = 1;
        for (; p <= 17; p++) { // the shortest %e that reads back as x
            snprintf(buf, sizeof(buf), "%.*e", p - 1, x);
            if (strtod(buf, NULL) == x)
                break;
        }
        const char *s = buf + (buf[0] == '-');
        char d[24];
        int n = 0;
        for (; *s && *s != 'e'; s++)
            if (*s >= '0' && *s <= '9' && n < 23)
                d[n++] = *s;
        int e = *s == 'e' ? atoi(s + 1) : 0;
        dec_set(&b->m, d, n, e + 1);
        b->neg = x < 0;
    } else {
        rx_fail(c, TM_GUIDE_WHY_INVALID, "schema: '%s' must be a number", kw);
        return -1;
    }
    if (b->m.nf > ND) {
        rx_fail(c, TM_GUIDE_WHY_UNSUPPORTED,
                "schema: '%s' has more than %d fraction digits (not supported)", kw, ND);
        return -1;
    }
    b->has = 1, b->excl = excl;
    return 0;
}

// The tighter of the inclusive and the exclusive keyword of one side (lower: the larger value).
static int read_side(rx_ctx *c, const json_t *schema, const char *inc, const char *exc, int lower,
                     bound *out) {
    *out = (bound){0};
    const json_t *vi = json_object_get(schema, inc), *ve = json_object_get(schema, exc);
    if (ve && json_is_boolean(ve)) {
        rx_fail(c, TM_GUIDE_WHY_UNSUPPORTED,
                "schema: boolean '%s' (draft 4) is not supported; give the bound as its value",
                exc);
        return -1;
    }
    bound a = {0}, b = {0};
    if (vi && read_bound(c, vi, inc, 0, &a))
        return -1;
    if (ve && read_bound(c, ve, exc, 1, &b))
        return -1;
    if (a.has && b.has) {
        int cmp = val_cmp(&a, &b);
        *out = cmp == 0 ? b : (cmp > 0) == (lower != 0) ? a : b;
    } else {
        *out = a.has ? a : b;
    }
    return 0;
}

/* ---- trees ---- */

typedef struct mag {
    rx_ctx *c;
    int frac;      /* fraction digits may follow ("number") */
    const dec *lo; /* magnitude >= lo (> when lo_excl) */
    int lo_excl;
    const dec *hi; /* NULL: no upper bound */
    int hi_excl;
    rx_node *digit; /* [0-9] */
} mag;

static rx_node *digits(mag *m, uint32_t lo, uint32_t hi) {
    const uint32_t r[2] = {'0' + lo, '0' + hi};
    return lo == 0 && hi == 9 ? m->digit : rx_set(m->c, r, 1, 0);
}

static char dig(const char *s, uint32_t n, uint32_t k) { return k < n ? s[k] : '0'; }

// What may follow k fraction digits (k = 0: none yet, no '.') given the tight flags.
static rx_node *frac_dp(mag *m, uint32_t k, int tlo, int thi) {
    rx_ctx *c = m->c;
    if (!tlo && !thi) { // anything: (. d{1,ND})? or d{0, ND - k}
        if (!m->frac)
            return rx_empty(c);
        if (k == 0)
            return rx_rep(c, rx_cat2(c, rx_str(c, "."), rx_rep(c, m->digit, 1, ND)), 0, 1);
        return rx_rep(c, m->digit, 0, ND - k);
    }
    rx_node *alt[12];
    uint32_t n = 0;
    // stop here: the rest reads as zeros
    int lo_ok = !tlo || (k >= m->lo->nf && !m->lo_excl);
    int hi_ok = !thi || k < m->hi->nf || !m->hi_excl;
    if (lo_ok && hi_ok)
        alt[n++] = rx_empty(c);
    if (m->frac && k < ND) {
        uint32_t a = tlo ? (uint32_t)(dig(m->lo->f, m->lo->nf, k) - '0') : 0;
        uint32_t b = thi ? (uint32_t)(dig(m->hi->f, m->hi->nf, k) - '0') : 9;
        uint32_t la = (uint32_t)(dig(m->lo->f, m->lo->nf, k) - '0');
        uint32_t hb = thi ? (uint32_t)(dig(m->hi->f, m->hi->nf, k) - '0') : 10;
        for (uint32_t d = a; d <= b && a <= b;) { // runs of digits with the same next flags
            int nlo = tlo && d == la, nhi = thi && d == hb;
            uint32_t e = d;
            while (e + 1 <= b && (tlo && e + 1 == la) == nlo && (thi && e + 1 == hb) == nhi)
                e++;
            rx_node *next = frac_dp(m, k + 1, nlo, nhi);
            rx_node *step = rx_cat2(c, digits(m, d, e), next);
            alt[n++] = k == 0 ? rx_cat2(c, rx_str(c, "."), step) : step;
            d = e + 1;
        }
    }
    return n ? rx_alt(c, alt, n) : rx_none(c);
}

// Integer digits from position p of a part of exactly len digits, given the tight flags.
static rx_node *int_dp(mag *m, uint32_t len, uint32_t p, int tlo, int thi) {
    rx_ctx *c = m->c;
    if (p == len)
        return frac_dp(m, 0, tlo, thi);
    if (!tlo && !thi) { // the rest of the integer part is free (no leading zero)
        rx_node *lead = p == 0 && len > 1 ? digits(m, 1, 9) : m->digit;
        rx_node *k[] = {lead, rx_rep(c, m->digit, len - p - 1, len - p - 1), frac_dp(m, 0, 0, 0)};
        return rx_cat(c, k, 3);
    }
    uint32_t a = p == 0 && len > 1 ? 1 : 0, b = 9;
    const uint32_t la = tlo ? (uint32_t)(m->lo->i[p] - '0') : 10;
    const uint32_t hb = thi ? (uint32_t)(m->hi->i[p] - '0') : 10;
    if (tlo && la > a)
        a = la;
    if (thi && hb < b)
        b = hb;
    rx_node *alt[12];
    uint32_t n = 0;
    for (uint32_t d = a; d <= b && a <= b;) {
        int nlo = tlo && d == la, nhi = thi && d == hb;
        uint32_t e = d;
        while (e + 1 <= b && (tlo && e + 1 == la) == nlo && (thi && e + 1 == hb) == nhi)
            e++;
        alt[n++] = rx_cat2(c, digits(m, d, e), int_dp(m, len, p + 1, nlo, nhi));
        d = e + 1;
    }
    return n ? rx_alt(c, alt, n) : rx_none(c);
}

// Magnitudes (no sign) in [lo, hi] (exclusive ends as flagged; hi NULL: no upper bound).
static rx_node *magnitudes(mag *m) {
    if (m->lo->huge)
        return rx_none(m->c);
    if (m->hi && m->hi->huge)
        m->hi = NULL;
    rx_node *alt[ND];
    uint32_t n = 0;
    for (uint32_t len = 1; len <= ND; len++) {
        if (len < m->lo->ni || (m->hi && len > m->hi->ni))
            continue;
        alt[n++] = int_dp(m, len, 0, len == m->lo->ni, m->hi && len == m->hi->ni);
    }
    return n ? rx_alt(m->c, alt, n) : rx_none(m->c);
}

int rx_has_number_bounds(const json_t *schema) {
    return json_object_get(schema, "minimum") || json_object_get(schema, "maximum") ||
           json_object_get(schema, "exclusiveMinimum") ||
           json_object_get(schema, "exclusiveMaximum");
}

rx_node *rx_number_range(rx_ctx *c, const json_t *schema, int integer) {
    bound lo, hi;
    if (read_side(c, schema, "minimum", "exclusiveMinimum", 1, &lo) ||
        read_side(c, schema, "maximum", "exclusiveMaximum", 0, &hi))
        return NULL;
    static const uint32_t d09[] = {'0', '9'};
    const dec zero = {.i = "0", .ni = 1};
    mag base = {.c = c, .frac = !integer, .digit = rx_set(c, d09, 1, 0)};
    rx_node *alt[2];
    uint32_t n = 0;
    // v >= 0: magnitudes in [max(lo, 0), hi]
    if (!hi.has || !hi.neg || dec_is_zero(&hi.m)) {
        mag m = base;
        int lo_pos = lo.has && !lo.neg;
        m.lo = lo_pos ? &lo.m : &zero, m.lo_excl = lo_pos && lo.excl;
        if (lo.has && lo.neg && dec_is_zero(&lo.m)) // "-0": zero
            m.lo_excl = lo.excl;
        m.hi = hi.has ? &hi.m : NULL, m.hi_excl = hi.has && hi.excl;
        alt[n++] = magnitudes(&m);
    }
    // v < 0: "-" and magnitudes in (max(-hi, 0), -lo], never zero
    if (!lo.has || (lo.neg && !dec_is_zero(&lo.m))) {
        mag m = base;
        int hi_neg = hi.has && hi.neg && !dec_is_zero(&hi.m);
        m.lo = hi_neg ? &hi.m : &zero, m.lo_excl = hi_neg ? hi.excl : 1;
        m.hi = lo.has ? &lo.m : NULL, m.hi_excl = lo.has && lo.excl;
        alt[n++] = rx_cat2(c, rx_str(c, "-"), magnitudes(&m));
    }
    return n ? rx_alt(c, alt, n) : rx_none(c);
}
