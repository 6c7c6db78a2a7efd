/* tests/unit/test_guided.c - structured output compilers (runner/guided): regexes match what
 * ECMAScript would match whole (tables of strings in and out), JSON Schema subsets accept their
 * compact documents and refuse what breaks them, unsupported keywords are named, the DFA state
 * cap gives a clear error, and token masks over a small vocabulary equal a naive per-token walk
 * (EOS only in accepting states). tests/e2e/e2e_guided.sh checks whole jobs with ajv and node's
 * RegExp. */
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "runner/guided/cache.h"
#include "runner/guided/guided.h"
#include "runner/sched/sample.h"
#include "tm_test.h"

static tm_dfa *compile(tm_guide_kind kind, const char *spec) {
    tm_err err = {0};
    tm_dfa *d = NULL;
    tm_guide_why why;
    tm_rc rc = tm_dfa_compile(kind, spec, strlen(spec), &d, &why, &err);
    if (rc)
        fprintf(stderr, "compile %s: %s\n", spec, err.msg);
    TM_CHECK(rc == TM_OK);
    return d;
}

static void expect(tm_dfa *d, const char *s, int want, const char *what) {
    int got = tm_dfa_match(d, s, strlen(s));
    if (got != want)
        fprintf(stderr, "%s: '%s' matched %d, want %d\n", what, s, got, want);
    TM_CHECK(got == want);
}

static void check_table(tm_guide_kind kind, const char *spec, const char *const *yes,
                        const char *const *no) {
    tm_dfa *d = compile(kind, spec);
    if (!d)
        return;
    for (int i = 0; yes[i]; i++)
        expect(d, yes[i], 1, spec);
    for (int i = 0; no[i]; i++)
        expect(d, no[i], 0, spec);
    tm_dfa_destroy(d);
}

static void test_regex(void) {
    check_table(TM_GUIDE_KIND_REGEX, "a(b|c)*d?", (const char *[]){"a", "abcb", "abd", "ad", NULL},
                (const char *[]){"", "b", "abdd", "xa", NULL});
    check_table(TM_GUIDE_KIND_REGEX, "^\\d{3}-\\d{2,4}$",
                (const char *[]){"123-45", "123-4567", NULL},
                (const char *[]){"12-45", "123-4", "123-45678", "abc-12", NULL});
    check_table(TM_GUIDE_KIND_REGEX, "[A-Za-z_][\\w]{0,3}",
                (const char *[]){"a", "_x9", "Abcd", NULL},
                (const char *[]){"9", "abcde", "a-b", NULL});
    check_table(TM_GUIDE_KIND_REGEX, "[^a-c]+",
                (const char *[]){"xyz", "\xc3\xa9", "\xf0\x9f\x98\x80", "d", NULL},
                (const char *[]){"a", "xa", "", "\xff", "\xc3", NULL});
    check_table(TM_GUIDE_KIND_REGEX, ".{2}", (const char *[]){"ab", "\xe2\x82\xac!", NULL},
                (const char *[]){"a", "a\n", "abc", "\xed\xa0\x80", NULL});
    check_table(TM_GUIDE_KIND_REGEX, "(?:yes|no)\\.\\s?", (const char *[]){"yes.", "no. ", NULL},
                (const char *[]){"yes", "maybe.", NULL});
    check_table(TM_GUIDE_KIND_REGEX, "x{2,}|[]", (const char *[]){"xx", "xxxxx", NULL},
                (const char *[]){"x", "", NULL});
    check_table(TM_GUIDE_KIND_REGEX, "\\u00e9\\x41[\\u{1F600}-\\u{1F601}]",
                (const char *[]){"\xc3\xa9"
                                 "A\xf0\x9f\x98\x80",
                                 NULL},
                (const char *[]){"\xc3\xa9"
                                 "A",
                                 NULL});
    // nested repetitions fold: X+++... (each '++' a possessive '+') and (((a?)*)+) stay linear
    // (they doubled the NFA per level: the fuzzer's timeout of 2026-12-01)
    check_table(TM_GUIDE_KIND_REGEX,
                "]\\+++++++++++++++++++++++++++++++++++++++++++++++++++++++++d",
                (const char *[]){"]+d", "]+++d", NULL}, (const char *[]){"]d", "+d", NULL});
    check_table(
        TM_GUIDE_KIND_REGEX, "(((a?)*)+)b|(c+)?d|(e*){2}f|(g+){3,}h|(i{0,2})+j",
        (const char *[]){"b", "aab", "d", "cccd", "f", "eeef", "gggh", "ggggh", "j", "iiij", NULL},
        (const char *[]){"ab b", "cc", "ggh", "i", NULL});
    // finite nests fold too when the inner one may take a single copy: (a{0,2}){0,3} is a{0,6},
    // (b{1,2}){2,3} is b{2,6}; (c{2}){0,2} has gaps (0, 2 or 4 c's) and is not folded
    check_table(TM_GUIDE_KIND_REGEX, "(a{0,2}){0,3}x|(b{1,2}){2,3}y|(c{2}){0,2}z",
                (const char *[]){"x", "ax", "aaaaaax", "bby", "bbbby", "bbbbbby", "z", "ccz",
                                 "ccccz", NULL},
                (const char *[]){"aaaaaaax", "by", "bbbbbbby", "cz", "cccz", "cccccz", NULL});
    check_table(TM_GUIDE_KIND_CHOICE, "[\"red\", \"green\", \"gr\\\"ey\"]",
                (const char *[]){"red", "green", "gr\"ey", NULL},
                (const char *[]){"re", "redd", "blue", NULL});
}

static void expect_fail(tm_guide_kind kind, const char *spec, tm_guide_why want,
                        const char *needle) {
    tm_err err = {0};
    tm_dfa *d = NULL;
    tm_guide_why why = TM_GUIDE_WHY_NONE;
    tm_rc rc = tm_dfa_compile(kind, spec, strlen(spec), &d, &why, &err);
    TM_CHECK(rc == TM_E_INVAL);
    TM_CHECK(d == NULL);
    TM_CHECK(why == want);
    if (!strstr(err.msg, needle))
        fprintf(stderr, "'%s': message '%s' lacks '%s'\n", spec, err.msg, needle);
    TM_CHECK(strstr(err.msg, needle) != NULL);
}

static void test_errors(void) {
    expect_fail(TM_GUIDE_KIND_REGEX, "a(b", TM_GUIDE_WHY_INVALID, "missing ')'");
    expect_fail(TM_GUIDE_KIND_REGEX, "a)", TM_GUIDE_WHY_INVALID, "unmatched ')'");
    expect_fail(TM_GUIDE_KIND_REGEX, "*a", TM_GUIDE_WHY_INVALID, "nothing to repeat");
    expect_fail(TM_GUIDE_KIND_REGEX, "[z-a]", TM_GUIDE_WHY_INVALID, "out of order");
    expect_fail(TM_GUIDE_KIND_REGEX, "(a)\\1", TM_GUIDE_WHY_UNSUPPORTED, "'\\1'");
    expect_fail(TM_GUIDE_KIND_REGEX, "(?=a)a", TM_GUIDE_WHY_UNSUPPORTED, "lookaround");
    expect_fail(TM_GUIDE_KIND_REGEX, "a^b", TM_GUIDE_WHY_UNSUPPORTED, "anchors");
    expect_fail(TM_GUIDE_KIND_REGEX, "a{2000}", TM_GUIDE_WHY_UNSUPPORTED, "over 1000");
    // the state cap: (a|b)* followed by 18 fixed positions needs 2^18 states
    expect_fail(TM_GUIDE_KIND_REGEX, "[ab]*a[ab]{18}", TM_GUIDE_WHY_UNSUPPORTED,
                "more than 250000 automaton states");
    // the work bound: nested finite repetitions give subsets of ~10^5 NFA states per DFA state;
    // compilation stops after RX_MAX_WORK steps (about 0.25 s) instead of running for minutes
    expect_fail(TM_GUIDE_KIND_REGEX, "(a{0,300}b?){0,300}", TM_GUIDE_WHY_UNSUPPORTED,
                "too complex to compile");
    expect_fail(TM_GUIDE_KIND_JSON_SCHEMA, "{\"type\": \"number\", \"multipleOf\": 3}",
                TM_GUIDE_WHY_UNSUPPORTED, "keyword 'multipleOf'");
    expect_fail(TM_GUIDE_KIND_JSON_SCHEMA, "{\"not\": {\"type\": \"null\"}}",
                TM_GUIDE_WHY_UNSUPPORTED, "keyword 'not'");
    // (a{0,300}){0,300} folds to a{0,90000}: small subsets, a 90,002-state DFA in well under a
    // second (unfolded it ran to the work bound: ~3 s under ASan, the fuzzer's slow unit of
    // 2026-12-01)
    check_table(TM_GUIDE_KIND_REGEX, "(a{0,300}){0,300}b", (const char *[]){"b", "aaab", NULL},
                (const char *[]){"a", "ab b", NULL});
    expect_fail(TM_GUIDE_KIND_JSON_SCHEMA, "{\"$ref\": \"http://x/y\"}", TM_GUIDE_WHY_UNSUPPORTED,
                "'$ref'");
    expect_fail(TM_GUIDE_KIND_JSON_SCHEMA, "{\"$ref\": \"#/$defs/nope\"}", TM_GUIDE_WHY_INVALID,
                "names no schema");
    expect_fail(TM_GUIDE_KIND_JSON_SCHEMA, "{\"type\": \"strin\"}", TM_GUIDE_WHY_INVALID,
                "unknown type");
    expect_fail(TM_GUIDE_KIND_JSON_SCHEMA, "{\"type\": \"object\"", TM_GUIDE_WHY_INVALID,
                "invalid JSON");
    // recursion with no way out: an object that must contain itself
    expect_fail(TM_GUIDE_KIND_JSON_SCHEMA,
                "{\"type\": \"object\", \"properties\": {\"a\": {\"$ref\": \"#\"}}, "
                "\"required\": [\"a\"]}",
                TM_GUIDE_WHY_INVALID, "no output satisfies");
    expect_fail(TM_GUIDE_KIND_CHOICE, "[]", TM_GUIDE_WHY_INVALID, "non-empty array");
    expect_fail(TM_GUIDE_KIND_CHOICE, "[\"a\", 1]", TM_GUIDE_WHY_INVALID, "array of strings");
}

static void test_schema(void) {
    // a long string: each of its 500 positions spans U+0000-U+10FFFF (a position once walked
    // that range code point by code point: seconds for this schema)
    check_table(TM_GUIDE_KIND_JSON_SCHEMA,
                "{\"type\": \"array\", \"items\": {\"type\": \"string\", \"maxLength\": 500}, "
                "\"maxItems\": 1}",
                (const char *[]){"[\"abc\"]", "[\"\xf0\x9f\x98\x80\\u0041\"]", "[]", NULL},
                (const char *[]){"[abc]", "[\"a\",\"b\"]", NULL});
    const char *person =
        "{\"type\": \"object\", \"additionalProperties\": false,"
        " \"properties\": {\"name\": {\"type\": \"string\", \"maxLength\": 5},"
        "  \"age\": {\"type\": \"integer\"}, \"tags\": {\"type\": \"array\", \"items\": "
        "{\"enum\": [\"a\", \"b\", 3, null]}, \"minItems\": 1, \"maxItems\": 2},"
        "  \"ok\": {\"type\": [\"boolean\", \"null\"]}},"
        " \"required\": [\"name\", \"age\", \"tags\"]}";
    check_table(
        TM_GUIDE_KIND_JSON_SCHEMA, person,
        (const char *[]){"{\"name\":\"bob\",\"age\":-12,\"tags\":[\"a\"]}",
                         "{\"name\": \"\",\"age\": 0, \"tags\":[3, null]}",
                         "{\"name\":\"a\\\"\\\\\\n\",\"age\":7,\"tags\":[\"b\"],\"ok\":true}",
                         "{\"name\":\"\xc3\xa9\\u00e9\",\"age\":1,\"tags\":[3],\"ok\":null}", NULL},
        (const char *[]){"{\"name\":\"bob\",\"age\":1}", "{\"age\":1,\"name\":\"b\",\"tags\":[3]}",
                         "{\"name\":\"toolong\",\"age\":1,\"tags\":[3]}",
                         "{\"name\":\"a\",\"age\":01,\"tags\":[3]}",
                         "{\"name\":\"a\",\"age\":1,\"tags\":[]}",
                         "{\"name\":\"a\",\"age\":1,\"tags\":[3,3,3]}",
                         "{\"name\":\"a\",\"age\":1.5,\"tags\":[3]}",
                         "{\"name\":\"a\n\",\"age\":1,\"tags\":[3]}",
                         "{\"name\":\"a\",  \"age\":1,\"tags\":[3]}",
                         "{\"name\":\"\\ud800\",\"age\":1,\"tags\":[3]}", NULL});
    const char *refs = "{\"$defs\": {\"node\": {\"type\": \"object\", \"properties\": {\"v\": "
                       "{\"const\": 1}, \"next\": {\"anyOf\": [{\"$ref\": \"#/$defs/node\"}, "
                       "{\"type\": \"null\"}]}}, \"required\": [\"v\", \"next\"]}}, "
                       "\"$ref\": \"#/$defs/node\"}";
    check_table(TM_GUIDE_KIND_JSON_SCHEMA, refs,
                (const char *[]){"{\"v\":1,\"next\":null}",
                                 "{\"v\":1,\"next\":{\"v\":1,\"next\":null}}", NULL},
                (const char *[]){"{\"v\":2,\"next\":null}",
                                 "{\"v\":1,\"next\":{\"v\":1,\"next\":{\"v\":1,\"next\":{\"v\":1,"
                                 "\"next\":null}}}}",
                                 NULL});
    check_table(TM_GUIDE_KIND_JSON_SCHEMA,
                "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"number\"}, \"b\": "
                "{\"type\": \"string\", \"pattern\": \"^[a-z]+\\\"?$\"}, \"c\": {\"type\": "
                "\"null\"}}}",
                (const char *[]){"{}", "{\"a\":1.5e-3}", "{\"b\":\"xy\\\"\"}",
                                 "{\"a\":0,\"c\":null}", "{\"c\":null}", NULL},
                (const char *[]){"{,\"c\":null}", "{\"a\":1,}", "{\"b\":\"X\"}", "{\"b\":\"x\"\"}",
                                 "{\"a\":.5}", NULL});
    check_table(TM_GUIDE_KIND_JSON_OBJECT, "",
                (const char *[]){"{}", "{\"a\":[1,{\"b\":[true]}], \"c\":\"\\u12aB\"}", NULL},
                (const char *[]){"[]", "{\"a\":[[[[1]]]]}", "{\"a\":1,}", "{'a':1}", NULL});
}

// Mask of each state of a small vocabulary against a naive walk of every token.
static void test_mask(void) {
    const char *pieces[] = {"{",   "}", "\"",  "a", "ab",   "abc",  "\":",      "1", "12",
                            "{\"", "",  "b\"", "x", "\xc3", "\xa9", "\xc3\xa9", NULL};
    uint32_t n = 0;
    size_t len[32];
    while (pieces[n])
        len[n] = strlen(pieces[n]), n++;
    const uint32_t eos = 10; // the empty piece: a special token
    tm_err err = {0};
    tm_guide_vocab *v = NULL;
    TM_CHECK_OK(tm_guide_vocab_create(pieces, len, n, &eos, 1, &v, &err), &err);
    tm_dfa *d = compile(TM_GUIDE_KIND_JSON_SCHEMA,
                        "{\"type\": \"object\", \"properties\": {\"ab\": {\"type\": \"string\", "
                        "\"maxLength\": 2}}, \"required\": [\"ab\"]}");
    tm_guide *g = NULL;
    TM_CHECK_OK(tm_guide_create(d, v, &g, &err), &err);
    uint8_t seen[4096] = {0}; // mask classes met so far: the first state of each is cold
    TM_CHECK(tm_guide_n_classes(g) <= tm_dfa_n_states(d) && tm_guide_n_classes(g) < 4096);
    for (uint32_t q = 1; q < tm_dfa_n_states(d); q++) {
        int cold = 0;
        const uint32_t *m = tm_guide_mask(g, q, NULL, &cold, &err);
        const uint32_t k = tm_guide_state_class(g, q);
        TM_CHECK(m != NULL && k > 0 && k < 4096 && cold == !seen[k]);
        seen[k] = 1;
        for (uint32_t i = 0; i < n; i++) {
            int want = i == eos ? tm_dfa_accepts(d, q)
                                : len[i] > 0 && tm_dfa_walk(d, q, pieces[i], len[i]) != 0;
            TM_CHECK(((m[i >> 5] >> (i & 31)) & 1) == (uint32_t)want);
        }
        TM_CHECK(tm_guide_mask(g, q, NULL, &cold, &err) == m && cold == 0);
    }
    TM_CHECK(tm_guide_n_cached(g) == tm_guide_n_classes(g) - 1); // every class but the dead one
    // the start state allows "{" and "{\"" only
    const uint32_t *m0 = tm_guide_mask(g, tm_dfa_start(d), NULL, NULL, &err);
    TM_CHECK(m0 && m0[0] == ((1u << 0) | (1u << 9)));
    // after the whole document, only EOS
    uint32_t q = tm_dfa_walk(d, tm_dfa_start(d), "{\"ab\":\"\xc3\xa9\"}", 11);
    TM_CHECK(tm_dfa_is_final(d, q));
    const uint32_t *mf = tm_guide_mask(g, q, NULL, NULL, &err);
    TM_CHECK(mf && mf[0] == (1u << eos));
    tm_guide_destroy(g);
    // a full cache: states past its limit are computed into the caller's spare, the same masks
    d = compile(TM_GUIDE_KIND_JSON_SCHEMA,
                "{\"type\": \"object\", \"properties\": {\"ab\": {\"type\": \"string\", "
                "\"maxLength\": 2}}, \"required\": [\"ab\"]}");
    TM_CHECK_OK(tm_guide_create(d, v, &g, &err), &err);
    tm_guide_set_cache_cap(g, 2);
    uint32_t spare[1], cached[2] = {0, 0}, n_in = 0;
    for (uint32_t s = 1; s < tm_dfa_n_states(d); s++) {
        int cold = 0;
        const uint32_t *m = tm_guide_mask(g, s, spare, &cold, &err);
        const uint32_t k = tm_guide_state_class(g, s);
        const int hit = (n_in > 0 && cached[0] == k) || (n_in > 1 && cached[1] == k);
        if (hit) {
            TM_CHECK(cold == 0 && m != spare); // its class is in the cache
        } else if (n_in < 2) {
            TM_CHECK(cold == 1 && m != spare); // cached now
            cached[n_in++] = k;
        } else {
            TM_CHECK(cold == 1 && m == spare); // the cache is full
        }
        uint32_t want[1];
        tm_guide_vocab_mask(v, d, s, want);
        TM_CHECK(m && m[0] == want[0]);
    }
    TM_CHECK(tm_guide_n_cached(g) == 2 && tm_guide_cache_full(g));
    tm_guide_destroy(g);
    // a long free string: hundreds of states, a handful of mask classes (positions more than the
    // longest token from the end look alike to every token), each state's mask still exact
    d = compile(TM_GUIDE_KIND_JSON_SCHEMA, "{\"type\": \"string\", \"maxLength\": 60}");
    TM_CHECK_OK(tm_guide_create(d, v, &g, &err), &err);
    TM_CHECK_MSG(tm_guide_n_classes(g) * 4 < tm_dfa_n_states(d), "%u classes of %u states",
                 tm_guide_n_classes(g), tm_dfa_n_states(d));
    for (uint32_t s = 1; s < tm_dfa_n_states(d); s++) {
        const uint32_t *m = tm_guide_mask(g, s, NULL, NULL, &err);
        uint32_t want[1];
        tm_guide_vocab_mask(v, d, s, want);
        TM_CHECK(m && m[0] == want[0]);
    }
    tm_guide_destroy(g);
    tm_guide_vocab_destroy(v);
}

static void test_alloc_faults(void) {
    const char *schema = "{\"type\": \"object\", \"properties\": {\"a\": {\"enum\": [1, 2]}}}";
    for (long k = 1; k < 400; k++) {
        tm_err err = {0};
        tm_dfa *d = NULL;
        tm_guide_why why;
        tm_fault_set(TM_FAULT_ALLOC, k);
        tm_rc rc = tm_dfa_compile(TM_GUIDE_KIND_JSON_SCHEMA, schema, strlen(schema), &d, &why,
                                  &err);
        tm_fault_set(TM_FAULT_ALLOC, 0);
        TM_CHECK(rc == TM_OK || rc == TM_E_NOMEM);
        TM_CHECK((rc == TM_OK) == (d != NULL));
        if (d)
            expect(d, "{\"a\":2}", 1, schema);
        tm_dfa_destroy(d);
        if (rc == TM_OK)
            break;
    }
}

// The sampler honours allow (greedy and sampled, with penalties and bias in play): only allowed
// ids are picked, the greedy pick is the best allowed one, an empty mask fails the row.
static void test_sample_allow(void) {
    enum { N = 1000 };
    static float lg[N];
    static uint32_t allow[(N + 31) / 32];
    tm_err err = {0};
    tm_sample_scratch sc = {0};
    TM_CHECK_OK(tm_sample_scratch_init(&sc, N, &err), &err);
    uint64_t x = 7;
    for (int i = 0; i < N; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        lg[i] = (float)((x >> 40) % 2000) / 100.0f - 10.0f;
    }
    const uint32_t ids[] = {3, 64, 65, 500, 999};
    for (int i = 0; i < 5; i++)
        allow[ids[i] >> 5] |= 1u << (ids[i] & 31);
    uint32_t best = ids[0];
    for (int i = 1; i < 5; i++)
        if (lg[ids[i]] > lg[best])
            best = ids[i];
    const uint32_t hist[] = {64, 65};
    tm_sample_params g = {.temperature = 0, .allow = allow};
    TM_CHECK(tm_sample_has_proc(&g));
    uint32_t out = 0;
    TM_CHECK_OK(tm_sample_token(lg, N, &g, 0, &sc, &out, &err), &err);
    TM_CHECK(out == best);
    int seen[5] = {0};
    for (uint64_t step = 0; step < 400; step++) {
        tm_sample_params p = {.temperature = 1.5f,
                              .top_p = 0.95f,
                              .seed = 11,
                              .allow = allow,
                              .presence_penalty = 0.5f,
                              .hist = hist,
                              .n_hist = 2,
                              .n_hist_prompt = 0};
        TM_CHECK_OK(tm_sample_token(lg, N, &p, step, &sc, &out, &err), &err);
        int ok = 0;
        for (int i = 0; i < 5; i++)
            if (out == ids[i])
                ok = 1, seen[i] = 1;
        TM_CHECK(ok);
    }
    TM_CHECK(seen[0] + seen[1] + seen[2] + seen[3] + seen[4] >= 2);
    static uint32_t none[(N + 31) / 32];
    tm_sample_params e = {.temperature = 0, .allow = none};
    TM_CHECK(tm_sample_token(lg, N, &e, 0, &sc, &out, &err) == TM_E_INVAL);
    tm_sample_scratch_fini(&sc);
}

// The runner's cache compiles each distinct constraint once, failures included.
static void test_cache(void) {
    tm_err err = {0};
    tm_guide_cache *c = NULL;
    const int32_t eos = 0;
    TM_CHECK_OK(tm_guide_cache_create(NULL, 10, &eos, 1, &c, &err), &err);
    const char *bad = "{\"type\": \"string\", \"format\": \"uri\"}";
    for (int k = 0; k < 3; k++) {
        tm_guide_ent *e = NULL;
        tm_errcode code = TM_ERRCODE_NONE;
        err = (tm_err){0};
        TM_CHECK(tm_guide_cache_get(c, TM_GUIDED_JSON_SCHEMA, bad, &e, &code, &err) == TM_E_RECORD);
        TM_CHECK(e == NULL && code == TM_ERRCODE_UNSUPPORTED && strstr(err.msg, "'format'"));
    }
    tm_guide_ent *a = NULL, *b = NULL;
    tm_errcode code = TM_ERRCODE_NONE;
    TM_CHECK_OK(tm_guide_cache_get(c, TM_GUIDED_REGEX, "a|b", &a, &code, &err), &err);
    TM_CHECK_OK(tm_guide_cache_get(c, TM_GUIDED_REGEX, "a|b", &b, &code, &err), &err);
    TM_CHECK(a && a == b);
    TM_CHECK(tm_guide_cache_stats(c)->n_compiled == 2);
    TM_CHECK(tm_guide_cache_get(NULL, TM_GUIDED_REGEX, "(", &b, &code, &err) == TM_E_RECORD);
    TM_CHECK(code == TM_ERRCODE_INVALID_VALUE);
    tm_guide_cache_unref(c, a);
    tm_guide_cache_unref(c, a);
    tm_guide_cache_destroy(c);
}

#define YES(...) ((const char *[]){__VA_ARGS__, NULL})
#define NO(...) ((const char *[]){__VA_ARGS__, NULL})

// minimum / maximum / exclusive bounds: exact decimals, both signs, integers and numbers
static void test_numbers(void) {
    const tm_guide_kind S = TM_GUIDE_KIND_JSON_SCHEMA;
    check_table(S, "{\"type\": \"integer\", \"minimum\": 3, \"maximum\": 17}",
                YES("3", "9", "10", "17"), NO("2", "18", "-1", "03", "017", "3.0", "1e1"));
    check_table(S, "{\"type\": \"integer\", \"exclusiveMinimum\": -5, \"maximum\": 5}",
                YES("-4", "-1", "0", "5"), NO("-5", "-0", "6", "-10", "-05"));
    check_table(S, "{\"type\": \"number\", \"minimum\": 0, \"maximum\": 1}",
                YES("0", "1", "0.5", "0.999", "1.0", "1.000", "0.0", "0.0001"),
                NO("1.01", "-0.1", "2", "1e0", ".5", "00.5", "-0", "1.0000000000000001"));
    check_table(S, "{\"type\": \"number\", \"exclusiveMinimum\": 0.1, \"exclusiveMaximum\": 0.25}",
                YES("0.11", "0.2", "0.24999", "0.1000001"),
                NO("0.1", "0.10", "0.25", "0.250", "0.3", "0.05", "0"));
    check_table(S, "{\"type\": \"number\", \"minimum\": -2.5, \"maximum\": -0.5}",
                YES("-2.5", "-1", "-0.5", "-2.49", "-0.50", "-2.5000"),
                NO("-2.51", "-0.49", "0", "-3", "2"));
    check_table(S, "{\"type\": \"number\", \"minimum\": 100}",
                YES("100", "100.5", "12345", "99999999", "1000000000000000"),
                NO("99.9", "-100", "99", "0"));
    check_table(S, "{\"type\": \"integer\", \"maximum\": -3}", YES("-3", "-100", "-9999"),
                NO("-2", "0", "3", "-0"));
    check_table(S, "{\"type\": \"number\", \"minimum\": 1e-3, \"maximum\": 0.002}",
                YES("0.001", "0.0015", "0.002", "0.00200"), NO("0.0009", "0.0021", "0.01"));
    // a double bound is its shortest decimal: 0.1 is 0.1, not 0.1000000000000000055...
    check_table(S, "{\"type\": \"number\", \"maximum\": 0.1, \"minimum\": 0}",
                YES("0.1", "0.0999", "0.10"), NO("0.1000000001", "0.11"));
    check_table(S, "{\"type\": \"integer\", \"minimum\": 0.5, \"maximum\": 3.5}", YES("1", "3"),
                NO("0", "4", "1.5"));
    // the tighter of minimum and exclusiveMinimum at the same value is the exclusive one
    check_table(S, "{\"type\": \"integer\", \"minimum\": 1, \"exclusiveMinimum\": 1}", YES("2"),
                NO("1", "0"));
    check_table(S, "{\"type\": \"number\", \"maximum\": 1e20}", YES("123456", "-7.5"), NO("1e3"));
    check_table(S, "{\"type\": [\"number\", \"null\"], \"minimum\": 2}", YES("2", "null", "3.5"),
                NO("1.9"));
    expect_fail(S, "{\"type\": \"integer\", \"minimum\": 5, \"maximum\": 4}", TM_GUIDE_WHY_INVALID,
                "no output satisfies");
    expect_fail(S, "{\"type\": \"integer\", \"minimum\": 1e20}", TM_GUIDE_WHY_INVALID,
                "no output satisfies");
    expect_fail(S, "{\"type\": \"number\", \"exclusiveMinimum\": true, \"minimum\": 1}",
                TM_GUIDE_WHY_UNSUPPORTED, "draft 4");
    expect_fail(S, "{\"minimum\": 1}", TM_GUIDE_WHY_UNSUPPORTED, "without 'type'");
    expect_fail(S, "{\"type\": \"number\", \"maximum\": \"1\"}", TM_GUIDE_WHY_INVALID,
                "must be a number");
    expect_fail(S, "{\"type\": \"number\", \"maximum\": 1.5e-17}", TM_GUIDE_WHY_UNSUPPORTED,
                "fraction digits");
}

// const / enum: the values the sibling type allows; other constraining siblings refused
static void test_literals(void) {
    const tm_guide_kind S = TM_GUIDE_KIND_JSON_SCHEMA;
    check_table(S, "{\"type\": \"string\", \"enum\": [\"a\", 1, null]}", YES("\"a\""),
                NO("1", "null"));
    check_table(S, "{\"type\": [\"integer\", \"null\"], \"enum\": [1, 2.0, 2.5, null, \"x\"]}",
                YES("1", "2.0", "null"), NO("2.5", "\"x\""));
    check_table(S, "{\"const\": \"a\", \"enum\": [\"a\", \"b\"]}", YES("\"a\""), NO("\"b\""));
    check_table(S, "{\"const\": \"cat\", \"title\": \"Kind\", \"type\": \"string\"}",
                YES("\"cat\""), NO("\"dog\""));
    expect_fail(S, "{\"type\": \"string\", \"const\": 1}", TM_GUIDE_WHY_INVALID,
                "no output satisfies");
    expect_fail(S, "{\"const\": \"c\", \"enum\": [\"a\", \"b\"]}", TM_GUIDE_WHY_INVALID,
                "no output satisfies");
    expect_fail(S, "{\"enum\": [\"abcdef\"], \"maxLength\": 3}", TM_GUIDE_WHY_UNSUPPORTED,
                "together with 'maxLength'");
}

// $ref as any local JSON pointer (zod's "#/properties/...", escapes, array indexes)
static void test_refs(void) {
    const tm_guide_kind S = TM_GUIDE_KIND_JSON_SCHEMA;
    check_table(S,
                "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}, \"b\": "
                "{\"$ref\": \"#/properties/a\"}}, \"required\": [\"a\", \"b\"]}",
                YES("{\"a\":1,\"b\":2}"), NO("{\"a\":1,\"b\":\"x\"}"));
    check_table(
        S,
        "{\"$defs\": {\"a/b\": {\"const\": 1}, \"t~x\": {\"const\": 2}, \"sp ace\": {\"const\": 3}, "
        "\"l\": [{\"const\": 4}, {\"const\": 5}]}, \"anyOf\": [{\"$ref\": \"#/$defs/a~1b\"}, "
        "{\"$ref\": \"#/$defs/t~0x\"}, {\"$ref\": \"#/$defs/sp%20ace\"}, {\"$ref\": "
        "\"#/$defs/l/1\"}]}",
        YES("1", "2", "3", "5"), NO("4"));
    expect_fail(S, "{\"$ref\": \"#/$defs/l/01\", \"$defs\": {\"l\": [1, 2]}}", TM_GUIDE_WHY_INVALID,
                "names no schema");
    expect_fail(S, "{\"$ref\": \"other.json#/a\"}", TM_GUIDE_WHY_UNSUPPORTED, "only local");
}

static void test_formats(void) {
    const tm_guide_kind S = TM_GUIDE_KIND_JSON_SCHEMA;
    check_table(S, "{\"type\": \"string\", \"format\": \"date\"}",
                YES("\"2024-02-29\"", "\"2023-12-31\"", "\"2000-02-29\"", "\"1999-04-30\""),
                NO("\"2023-02-29\"", "\"1900-02-29\"", "\"2023-04-31\"", "\"2023-13-01\"",
                   "\"2023-1-01\"", "2023-01-01"));
    check_table(
        S, "{\"type\": \"string\", \"format\": \"date-time\"}",
        YES("\"2024-05-06T07:08:09Z\"", "\"2024-05-06T23:59:59.123+05:30\""),
        NO("\"2024-05-06 07:08:09Z\"", "\"2024-05-06T24:00:00Z\"", "\"2024-05-06T07:08:09\""));
    check_table(S, "{\"type\": \"string\", \"format\": \"time\"}", YES("\"07:08:09-01:00\""),
                NO("\"7:08:09Z\"", "\"07:60:00Z\""));
    check_table(S, "{\"type\": \"string\", \"format\": \"duration\"}",
                YES("\"P1Y2M3DT4H5M6S\"", "\"PT5M\"", "\"P3W\"", "\"P2D\""),
                NO("\"P\"", "\"PT\"", "\"P1WT1H\"", "\"P1H\""));
    check_table(S, "{\"type\": \"string\", \"format\": \"email\"}",
                YES("\"a.b@c.io\"", "\"x_y+z@mail.example.org\""),
                NO("\"a..b@c.io\"", "\"@c.io\"", "\"a@b\"", "\"a@-b.io\""));
    check_table(S, "{\"type\": \"string\", \"format\": \"hostname\"}",
                YES("\"localhost\"", "\"a-b.example.com\""), NO("\"-a.com\"", "\"a..b\""));
    check_table(S, "{\"type\": \"string\", \"format\": \"ipv4\"}",
                YES("\"255.255.255.255\"", "\"10.0.0.1\""),
                NO("\"256.1.1.1\"", "\"01.2.3.4\"", "\"1.2.3\""));
    check_table(S, "{\"type\": \"string\", \"format\": \"ipv6\"}", YES("\"2001:db8:0:0:0:0:2:1\""),
                NO("\"2001:db8::1\"", "\"1:2:3:4:5:6:7\""));
    check_table(
        S, "{\"type\": \"string\", \"format\": \"uuid\"}",
        YES("\"123e4567-e89b-12d3-a456-426614174000\""),
        NO("\"123e4567e89b12d3a456426614174000\"", "\"123E4567-E89B-12D3-A456-426614174000\""));
    expect_fail(S, "{\"type\": \"string\", \"format\": \"uri\"}", TM_GUIDE_WHY_UNSUPPORTED,
                "'uri'");
    expect_fail(S, "{\"type\": \"string\", \"format\": \"date\", \"maxLength\": 4}",
                TM_GUIDE_WHY_UNSUPPORTED, "'format' together with");
    expect_fail(S, "{\"format\": \"date\"}", TM_GUIDE_WHY_UNSUPPORTED, "without 'type'");
}

// The shapes pydantic (model_json_schema), zod-to-json-schema and the OpenAI helpers emit:
// oneOf with provably disjoint branches (a discriminated union, nullable, disjoint enums),
// allOf around one schema, tuples (prefixItems; draft 7's items list), $ref with annotations.
static void test_schema_shapes(void) {
    const tm_guide_kind S = TM_GUIDE_KIND_JSON_SCHEMA;
    // pydantic 2.13: Union[Cat, Dog] = Field(discriminator="pet_type"), Dog's tag an enum
    const char *pets =
        "{\"$defs\": {\"Cat\": {\"additionalProperties\": false, \"properties\": {\"pet_type\": "
        "{\"const\": \"cat\", \"title\": \"Pet Type\", \"type\": \"string\"}, \"meows\": "
        "{\"title\": \"Meows\", \"type\": \"integer\"}}, \"required\": [\"pet_type\", \"meows\"], "
        "\"title\": \"Cat\", \"type\": \"object\"}, \"Dog\": {\"properties\": {\"pet_type\": "
        "{\"enum\": [\"dog\", \"puppy\"], \"title\": \"Pet Type\", \"type\": \"string\"}, "
        "\"barks\": {\"title\": \"Barks\", \"type\": \"number\"}}, \"required\": [\"pet_type\", "
        "\"barks\"], \"title\": \"Dog\", \"type\": \"object\"}}, \"properties\": {\"pet\": "
        "{\"discriminator\": {\"mapping\": {\"cat\": \"#/$defs/Cat\", \"dog\": \"#/$defs/Dog\", "
        "\"puppy\": \"#/$defs/Dog\"}, \"propertyName\": \"pet_type\"}, \"oneOf\": [{\"$ref\": "
        "\"#/$defs/Cat\"}, {\"$ref\": \"#/$defs/Dog\"}], \"title\": \"Pet\"}, \"opt\": "
        "{\"anyOf\": [{\"discriminator\": {\"propertyName\": \"pet_type\"}, \"oneOf\": "
        "[{\"$ref\": \"#/$defs/Cat\"}, {\"$ref\": \"#/$defs/Dog\"}]}, {\"type\": \"null\"}], "
        "\"default\": null}}, \"required\": [\"pet\"], \"title\": \"Owner\", \"type\": "
        "\"object\"}";
    check_table(S, pets,
                YES("{\"pet\":{\"pet_type\":\"cat\",\"meows\":3}}",
                    "{\"pet\": {\"pet_type\": \"puppy\", \"barks\": 1.5}, \"opt\": null}",
                    "{\"pet\":{\"pet_type\":\"dog\",\"barks\":0},\"opt\":{\"pet_type\":\"cat\","
                    "\"meows\":1}}"),
                NO("{\"pet\":{\"pet_type\":\"cat\",\"barks\":1.5}}",
                   "{\"pet\":{\"pet_type\":\"bird\",\"meows\":1}}", "{\"pet\":null}",
                   "{\"pet\":{\"meows\":1}}"));
    check_table(S, "{\"oneOf\": [{\"type\": \"string\", \"maxLength\": 3}, {\"type\": \"null\"}]}",
                YES("\"ab\"", "null", "\"\""), NO("1", "\"abcd\"", "nul"));
    check_table(S, "{\"oneOf\": [{\"enum\": [\"a\", \"b\", 2]}, {\"enum\": [\"c\", 1, null]}]}",
                YES("\"a\"", "\"c\"", "1", "2", "null"), NO("\"d\"", "3", "\"1\""));
    // literals compared deeply (arrays, objects; numbers as doubles)
    check_table(S, "{\"oneOf\": [{\"const\": [1, 2]}, {\"enum\": [[1], {\"a\": [1, 2]}]}]}",
                YES("[1,2]", "[1]", "{\"a\":[1,2]}"), NO("[2]", "[1, 2]"));
    // different types (a list, const's type); a property one branch requires and the other
    // forbids (additionalProperties false)
    check_table(
        S,
        "{\"oneOf\": [{\"type\": [\"string\", \"null\"], \"maxLength\": 1}, {\"const\": 4}, "
        "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}}, "
        "\"required\": [\"a\"], \"additionalProperties\": false}, {\"type\": \"object\", "
        "\"properties\": {\"b\": {\"type\": \"boolean\"}}, \"required\": [\"b\"]}]}",
        YES("\"x\"", "null", "4", "{\"a\":1}", "{\"b\":true}"), NO("5", "{}", "{\"a\":true}"));
    // allOf around one $ref (pydantic v1, some generators), annotations beside it and among its
    // schemas; pydantic v2's $ref with default / description / title
    const char *wrapped =
        "{\"$defs\": {\"I\": {\"type\": \"object\", \"properties\": {\"x\": {\"type\": "
        "\"integer\"}}, \"required\": [\"x\"]}}, \"type\": \"object\", \"properties\": {\"i\": "
        "{\"allOf\": [{\"$ref\": \"#/$defs/I\"}], \"description\": \"d\", \"default\": {\"x\": "
        "1}}, \"j\": {\"allOf\": [{\"description\": \"n\"}, {\"$ref\": \"#/$defs/I\"}, true]}, "
        "\"k\": {\"$ref\": \"#/$defs/I\", \"default\": {\"x\": 2}, \"description\": \"d2\", "
        "\"title\": \"T\", \"examples\": [{\"x\": 3}], \"deprecated\": true}, \"any\": {\"allOf\": "
        "[{\"title\": \"t\"}]}}, \"required\": [\"i\", \"j\", \"k\"]}";
    check_table(S, wrapped,
                YES("{\"i\":{\"x\":1},\"j\":{\"x\":2},\"k\":{\"x\":-3}}",
                    "{\"i\":{\"x\":1},\"j\":{\"x\":2},\"k\":{\"x\":3},\"any\":[1,\"a\"]}"),
                NO("{\"i\":{\"x\":1},\"j\":{},\"k\":{\"x\":3}}", "{\"i\":{\"x\":1}}"));
    // tuples: pydantic's Tuple[int, str]; items false; items a schema within min/max; no items
    // but minItems past the positions; items false alone
    check_table(S,
                "{\"maxItems\": 2, \"minItems\": 2, \"prefixItems\": [{\"type\": \"integer\"}, "
                "{\"type\": \"string\", \"maxLength\": 2}], \"type\": \"array\"}",
                YES("[1,\"ab\"]", "[-4, \"\"]"), NO("[1]", "[1,\"ab\",2]", "[\"a\",1]", "[]"));
    check_table(S,
                "{\"type\": \"array\", \"prefixItems\": [{\"type\": \"integer\"}, {\"enum\": "
                "[\"a\"]}], \"items\": false}",
                YES("[]", "[1]", "[1,\"a\"]", "[1, \"a\"]"), NO("[1,\"a\",2]", "[\"a\"]", "[1,]"));
    check_table(S,
                "{\"type\": \"array\", \"prefixItems\": [{\"type\": \"boolean\"}], \"items\": "
                "{\"type\": \"null\"}, \"minItems\": 2, \"maxItems\": 3}",
                YES("[true,null]", "[false, null, null]"),
                NO("[true]", "[true,null,null,null]", "[null,null]", "[true,true]"));
    check_table(S, "{\"prefixItems\": [{\"const\": 1}], \"minItems\": 3}",
                YES("[1,\"x\",{}]", "[1,[2],null]"), NO("[1]", "[1,2]", "[1,2,3,4]", "[2,2,2]"));
    check_table(S, "{\"type\": \"array\", \"items\": false}", YES("[]"), NO("[1]", "[null]"));
    // draft 7: items as a list, additionalItems
    check_table(S,
                "{\"$schema\": \"http://json-schema.org/draft-07/schema#\", \"type\": \"array\", "
                "\"items\": [{\"type\": \"integer\"}, {\"type\": \"null\"}], \"additionalItems\": "
                "{\"type\": \"boolean\"}, \"maxItems\": 3}",
                YES("[]", "[1]", "[1,null]", "[1,null,true]"),
                NO("[1,null,true,false]", "[null]", "[1,2]"));
    check_table(S, "{\"type\": \"array\", \"items\": [{\"type\": \"null\"}], \"minItems\": 1}",
                YES("[null]"), NO("[]", "[1]", "[null,null]"));
    // refused: branches that may both match (the same type; integer and number: 1 is both; 1
    // and 1.0 are equal; a tag neither requires; an unconstrained branch), intersections,
    // discriminator alone, $ref with a sibling that constrains, tuples nothing satisfies
    expect_fail(
        S, "{\"oneOf\": [{\"type\": \"string\"}, {\"type\": \"string\", \"maxLength\": 3}]}",
        TM_GUIDE_WHY_UNSUPPORTED, "'oneOf' branches 1 and 2 (counting from 1) may both match");
    expect_fail(
        S, "{\"oneOf\": [{\"type\": \"null\"}, {\"type\": \"integer\"}, {\"type\": \"number\"}]}",
        TM_GUIDE_WHY_UNSUPPORTED, "branches 2 and 3");
    expect_fail(S, "{\"oneOf\": [{\"enum\": [\"x\", 1]}, {\"const\": 1.0}]}",
                TM_GUIDE_WHY_UNSUPPORTED, "may both match");
    expect_fail(S,
                "{\"oneOf\": [{\"type\": \"object\", \"properties\": {\"k\": {\"const\": \"a\"}}}, "
                "{\"type\": \"object\", \"properties\": {\"k\": {\"const\": \"b\"}}}]}",
                TM_GUIDE_WHY_UNSUPPORTED, "may both match");
    expect_fail(
        S,
        "{\"oneOf\": [{\"properties\": {\"k\": {\"const\": \"a\"}}, \"required\": [\"k\"]}, "
        "{\"properties\": {\"k\": {\"const\": \"b\"}}, \"required\": [\"k\"]}]}",
        TM_GUIDE_WHY_UNSUPPORTED, "may both match");
    expect_fail(S,
                "{\"oneOf\": [{\"const\": [1, {\"a\": 2}]}, {\"enum\": [\"x\", [1, {\"a\": "
                "2.0}]]}]}",
                TM_GUIDE_WHY_UNSUPPORTED, "may both match");
    expect_fail(S, "{\"oneOf\": [{}, {\"type\": \"null\"}]}", TM_GUIDE_WHY_UNSUPPORTED,
                "may both match");
    expect_fail(S, "{\"oneOf\": [{\"type\": \"null\"}], \"type\": \"null\"}",
                TM_GUIDE_WHY_UNSUPPORTED, "'oneOf' with the sibling keyword 'type'");
    expect_fail(S, "{\"allOf\": [{\"type\": \"object\"}, {\"required\": [\"a\"]}]}",
                TM_GUIDE_WHY_UNSUPPORTED, "'allOf' of 2 schemas that constrain");
    expect_fail(S, "{\"allOf\": []}", TM_GUIDE_WHY_INVALID, "non-empty array");
    expect_fail(S, "{\"type\": \"object\", \"discriminator\": {\"propertyName\": \"k\"}}",
                TM_GUIDE_WHY_UNSUPPORTED, "only supported next to 'oneOf' or 'anyOf'");
    expect_fail(S,
                "{\"$defs\": {\"a\": {\"type\": \"string\"}}, \"$ref\": \"#/$defs/a\", "
                "\"maxLength\": 3}",
                TM_GUIDE_WHY_UNSUPPORTED, "sibling keyword 'maxLength'");
    expect_fail(S, "{\"type\": \"array\", \"items\": {}, \"additionalItems\": false}",
                TM_GUIDE_WHY_UNSUPPORTED, "'additionalItems' is only supported after 'items'");
    expect_fail(S, "{\"prefixItems\": [{}], \"items\": [{}]}", TM_GUIDE_WHY_INVALID,
                "next to 'prefixItems'");
    expect_fail(S,
                "{\"type\": \"array\", \"prefixItems\": [{\"type\": \"null\"}], \"items\": false, "
                "\"minItems\": 2}",
                TM_GUIDE_WHY_INVALID, "no output satisfies");
}

int main(void) {
    long live = tm_alloc_live();
    TM_RUN(test_regex);
    TM_RUN(test_errors);
    TM_RUN(test_schema);
    TM_RUN(test_mask);
    TM_RUN(test_alloc_faults);
    TM_RUN(test_sample_allow);
    TM_RUN(test_cache);
    TM_RUN(test_numbers);
    TM_RUN(test_formats);
    TM_RUN(test_literals);
    TM_RUN(test_refs);
    TM_RUN(test_schema_shapes);
    TM_CHECK(tm_alloc_live() == live);
    return tm_test_report();
}
