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
    // the state cap: (a|b)* followed by 15 fixed positions needs 2^15 states
    expect_fail(TM_GUIDE_KIND_REGEX, "[ab]*a[ab]{15}", TM_GUIDE_WHY_UNSUPPORTED,
                "more than 20000 automaton states");
    // the work bound: nested finite repetitions give subsets of ~10^5 NFA states per DFA state;
    // compilation stops after RX_MAX_WORK steps (about 0.25 s) instead of running for minutes
    expect_fail(TM_GUIDE_KIND_REGEX, "(a{0,300}b?){0,300}", TM_GUIDE_WHY_UNSUPPORTED,
                "too complex to compile");
    // (a{0,300}){0,300} folds to a{0,90000}: small subsets, so the state cap ends it in ~10 ms
    // (unfolded it ran to the work bound: ~3 s under ASan, the fuzzer's slow unit of 2026-12-01)
    expect_fail(TM_GUIDE_KIND_REGEX, "(a{0,300}){0,300}b", TM_GUIDE_WHY_UNSUPPORTED,
                "more than 20000 automaton states");
    expect_fail(TM_GUIDE_KIND_JSON_SCHEMA, "{\"type\": \"string\", \"format\": \"date\"}",
                TM_GUIDE_WHY_UNSUPPORTED, "keyword 'format'");
    expect_fail(TM_GUIDE_KIND_JSON_SCHEMA, "{\"type\": \"integer\", \"minimum\": 3}",
                TM_GUIDE_WHY_UNSUPPORTED, "keyword 'minimum'");
    expect_fail(TM_GUIDE_KIND_JSON_SCHEMA, "{\"oneOf\": [{\"type\": \"null\"}]}",
                TM_GUIDE_WHY_UNSUPPORTED, "keyword 'oneOf'");
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
    for (uint32_t q = 1; q < tm_dfa_n_states(d); q++) {
        int cold = 0;
        const uint32_t *m = tm_guide_mask(g, q, &cold, &err);
        TM_CHECK(m != NULL && cold == 1);
        for (uint32_t i = 0; i < n; i++) {
            int want = i == eos ? tm_dfa_accepts(d, q)
                                : len[i] > 0 && tm_dfa_walk(d, q, pieces[i], len[i]) != 0;
            TM_CHECK(((m[i >> 5] >> (i & 31)) & 1) == (uint32_t)want);
        }
        TM_CHECK(tm_guide_mask(g, q, &cold, &err) == m && cold == 0);
    }
    TM_CHECK(tm_guide_n_cached(g) == tm_dfa_n_states(d) - 1);
    // the start state allows "{" and "{\"" only
    const uint32_t *m0 = tm_guide_mask(g, tm_dfa_start(d), NULL, &err);
    TM_CHECK(m0 && m0[0] == ((1u << 0) | (1u << 9)));
    // after the whole document, only EOS
    uint32_t q = tm_dfa_walk(d, tm_dfa_start(d), "{\"ab\":\"\xc3\xa9\"}", 11);
    TM_CHECK(tm_dfa_is_final(d, q));
    const uint32_t *mf = tm_guide_mask(g, q, NULL, &err);
    TM_CHECK(mf && mf[0] == (1u << eos));
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
    const char *bad = "{\"type\": \"string\", \"format\": \"email\"}";
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

int main(void) {
    long live = tm_alloc_live();
    TM_RUN(test_regex);
    TM_RUN(test_errors);
    TM_RUN(test_schema);
    TM_RUN(test_mask);
    TM_RUN(test_alloc_faults);
    TM_RUN(test_sample_allow);
    TM_RUN(test_cache);
    TM_CHECK(tm_alloc_live() == live);
    return tm_test_report();
}
