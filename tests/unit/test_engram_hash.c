/* tests/unit/test_engram_hash.c - runner/model/engram_hash: primes and offsets (a hand-worked
 * layout and the released DeepSeek-V4.1 one, whose primes must sum to its engram_num_embeddings),
 * multipliers (NumPy's values as literals; test_engram_numpy compares many more against NumPy
 * itself), the compressed token map on a small vocabulary with known collapses, hash ids of
 * hand-computed contexts (start of sequence, DEAD tokens), and the compressed-vocab refusal. */
#include <string.h>

#include "base/alloc.h"
#include "runner/model/engram_hash.h"
#include "tm_test.h"

static void test_is_prime(void) {
    static const uint64_t primes[] = {2,
                                      3,
                                      5,
                                      37,
                                      101,
                                      16000057,
                                      2147483647ull,
                                      2305843009213693951ull /* 2^61 - 1 */,
                                      18446744073709551557ull /* largest below 2^64 */};
    static const uint64_t composites[] = {0,
                                          1,
                                          4,
                                          561 /* Carmichael */,
                                          1373653,
                                          3215031751ull /* strong pseudoprime to 2, 3, 5, 7 */,
                                          3825123056546413051ull,
                                          18446744073709551615ull};
    for (size_t i = 0; i < sizeof(primes) / sizeof(primes[0]); i++)
        TM_CHECK_MSG(tm_engram_is_prime(primes[i]), "%llu", (unsigned long long)primes[i]);
    for (size_t i = 0; i < sizeof(composites) / sizeof(composites[0]); i++)
        TM_CHECK_MSG(!tm_engram_is_prime(composites[i]), "%llu", (unsigned long long)composites[i]);
}

/* Layers 0 and 1, 3-grams, 2 heads, engram_vocab_size 10: the primes above 9 handed out in
 * order, never twice, each n-gram size restarting its search at 10. */
static tm_engram_layout *small_layout(uint64_t rows0, tm_err *err, tm_rc *rc) {
    uint32_t ids[2] = {0, 1};
    uint64_t ne[2] = {rows0, 120};
    tm_engram_params p = {.n_layer = 2,
                          .layer_ids = ids,
                          .num_embeddings = ne,
                          .max_ngram = 3,
                          .n_heads = 2,
                          .head_dim = 32,
                          .vocab_size = 10,
                          .compressed_vocab = 19,
                          .pad_compressed = 2};
    tm_engram_layout *L = NULL;
    *rc = tm_engram_layout_create(&p, &L, err);
    return L;
}

static void test_layout_small(void) {
    tm_err err = {0};
    tm_rc rc;
    tm_engram_layout *L = small_layout(60, &err, &rc);
    TM_CHECK_OK(rc, &err);
    if (!L)
        return;
    static const uint64_t primes[2][4] = {{11, 13, 17, 19}, {23, 29, 31, 37}};
    static const uint64_t offsets[2][4] = {{0, 11, 24, 41}, {0, 23, 52, 83}};
    TM_CHECK(L->n_cols == 4);
    for (int l = 0; l < 2; l++)
        for (int c = 0; c < 4; c++) {
            TM_CHECK(L->primes[l * 4 + c] == primes[l][c]);
            TM_CHECK(L->offsets[l * 4 + c] == offsets[l][c]);
        }
    TM_CHECK(L->rows_used[0] == 60 && L->rows_used[1] == 120);
    // NumPy: default_rng(10007 * l).integers(0, (INT64_MAX // 19) // 2, size=3, dtype=int64)*2+1
    static const int64_t mul[2][3] = {{309207085020449323, 130965433244453989, 19890213417078843},
                                      {399664613758664907, 25241736938874909, 187542939445734933}};
    for (int l = 0; l < 2; l++)
        for (int k = 0; k < 3; k++)
            TM_CHECK_MSG(L->multipliers[l * 3 + k] == mul[l][k], "layer %d k %d: %lld", l, k,
                         (long long)L->multipliers[l * 3 + k]);
    tm_engram_layout_destroy(L);
    // A table too small for its bucket ranges is refused with both numbers.
    L = small_layout(59, &err, &rc);
    TM_CHECK(rc == TM_E_INVAL && !L);
    TM_CHECK(strstr(err.msg, "59") && strstr(err.msg, "60"));
    // A bad parameter names its field.
    tm_engram_params bad = {.n_layer = 1, .max_ngram = 1};
    TM_CHECK(tm_engram_layout_create(&bad, &L, &err) == TM_E_INVAL);
    TM_CHECK(strstr(err.msg, "engram_max_ngram_size") != NULL);
    uint32_t ids[256] = {0};
    uint64_t ne[256] = {0};
    tm_engram_params big = {.n_layer = 256,
                            .layer_ids = ids,
                            .num_embeddings = ne,
                            .max_ngram = 16,
                            .n_heads = 18,
                            .compressed_vocab = 7};
    TM_CHECK(tm_engram_layout_create(&big, &L, &err) == TM_E_INVAL);
    TM_CHECK(strstr(err.msg, "engram_n_heads 18") != NULL);
}

/* The released config: layers 1 and 14, 4-grams, 8 heads, engram_vocab_size 16,000,000; the
 * bucket ranges laid end to end give exactly its engram_num_embeddings. */
static void test_layout_released(void) {
    uint32_t ids[2] = {1, 14};
    uint64_t ne[2] = {384006168, 384016682};
    tm_engram_params p = {.n_layer = 2,
                          .layer_ids = ids,
                          .num_embeddings = ne,
                          .max_ngram = 4,
                          .n_heads = 8,
                          .head_dim = 256,
                          .vocab_size = 16000000,
                          .compressed_vocab = 99092,
                          .pad_compressed = 2};
    tm_engram_layout *L = NULL;
    tm_err err = {0};
    TM_CHECK_OK(tm_engram_layout_create(&p, &L, &err), &err);
    if (!L)
        return;
    TM_CHECK(L->rows_used[0] == 384006168ull && L->rows_used[1] == 384016682ull);
    TM_CHECK(L->primes[0] == 16000057ull); // the first prime above 15,999,999
    for (size_t i = 0; i < 48; i++)
        for (size_t j = 0; j < i; j++)
            TM_CHECK(L->primes[i] != L->primes[j]);
    // NumPy's values for layer 1 (seed 10007) and 14 (seed 140098) at vocab 99,092
    static const int64_t mul1[4] = {76632096046245, 4839876093313, 35959672319349, 73987337458391};
    for (int k = 0; k < 4; k++)
        TM_CHECK(L->multipliers[k] == mul1[k]);
    for (int k = 0; k < 8; k++) {
        TM_CHECK(L->multipliers[k] & 1);
        TM_CHECK(L->multipliers[k] < (int64_t)(INT64_MAX / 99092));
    }
    tm_engram_layout_destroy(L);
}

static void test_hash_ids(void) {
    tm_err err = {0};
    tm_rc rc;
    tm_engram_layout *L = small_layout(60, &err, &rc);
    TM_CHECK_OK(rc, &err);
    if (!L)
        return;
    static const uint64_t m[2][3] = {
        {309207085020449323ull, 130965433244453989ull, 19890213417078843ull},
        {399664613758664907ull, 25241736938874909ull, 187542939445734933ull}};
    static const uint64_t P[2][4] = {{11, 13, 17, 19}, {23, 29, 31, 37}};
    static const uint64_t O[2][4] = {{0, 11, 24, 41}, {0, 23, 52, 83}};
    const int64_t N = TM_ENGRAM_NONE, D = TM_ENGRAM_DEAD;
    // context (current, 1 back, 2 back) -> the tokens the hash sees (pad = 2)
    static const struct {
        int64_t ctx[3];
        uint64_t tok[3];
    } cases[] = {
        {{5, 7, 11}, {5, 7, 11}},   {{5, N, N}, {5, 2, 2}},  {{5, 7, N}, {5, 7, 2}},
        {{5, 7, D}, {5, 7, 2}},     {{5, D, 11}, {5, 2, 2}}, {{D, 7, 11}, {2, 2, 2}},
        {{18, 0, 17}, {18, 0, 17}}, {{0, 0, 0}, {0, 0, 0}},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int64_t out[8];
        tm_engram_hash_ids(L, cases[i].ctx, out);
        for (int l = 0; l < 2; l++) {
            const uint64_t *t = cases[i].tok;
            uint64_t h2 = (t[0] * m[l][0]) ^ (t[1] * m[l][1]);
            uint64_t h3 = h2 ^ (t[2] * m[l][2]);
            uint64_t want[4] = {h2 % P[l][0] + O[l][0], h2 % P[l][1] + O[l][1],
                                h3 % P[l][2] + O[l][2], h3 % P[l][3] + O[l][3]};
            for (int c = 0; c < 4; c++) {
                TM_CHECK_MSG((uint64_t)out[l * 4 + c] == want[c], "case %zu layer %d col %d", i, l,
                             c);
                TM_CHECK(out[l * 4 + c] >= 0 && (uint64_t)out[l * 4 + c] < L->rows_used[l]);
            }
        }
    }
    // One hand-worked value: layer 0, tokens (1, 1): (m0 ^ m1) % 11.
    int64_t ctx[3] = {1, 1, N}, out[8];
    tm_engram_hash_ids(L, ctx, out);
    TM_CHECK((uint64_t)out[0] == (309207085020449323ull ^ 130965433244453989ull) % 11);
    // ctx_push: a fresh sequence, then two tokens.
    int64_t c[3] = {N, N, N};
    tm_engram_ctx_push(c, 3, 5);
    TM_CHECK(c[0] == 5 && c[1] == N && c[2] == N);
    tm_engram_ctx_push(c, 3, D);
    TM_CHECK(c[0] == D && c[1] == 5 && c[2] == N);
    tm_engram_ctx_push(c, 3, 7);
    TM_CHECK(c[0] == 7 && c[1] == D && c[2] == 5);
    tm_engram_layout_destroy(L);
}

static void test_byte_level_piece(void) {
    tm_err err = {0};
    static const struct {
        const char *in;
        size_t n;
        const char *want;
    } cases[] = {{" ", 1, "\xc4\xa0"},
                 {"a", 1, "a"},
                 {"\xff", 1, "\xc3\xbf"},
                 {"\0", 1, "\xc4\x80"},
                 {"\xad", 1, "\xc5\x83"},
                 {"\n", 1, "\xc4\x8a"},
                 {"\xef\xbf\xbd", 3, "\xc3\xaf\xc2\xbf\xc2\xbd"}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *p = NULL;
        size_t n = 0;
        TM_CHECK_OK(tm_engram_byte_level_piece(cases[i].in, cases[i].n, &p, &n, &err), &err);
        TM_CHECK_MSG(p && n == strlen(cases[i].want) && !memcmp(p, cases[i].want, n), "case %zu",
                     i);
        tm_free(p);
    }
}

/* A small vocabulary whose compressed ids are worked out by hand. */
static void test_token_map(void) {
    static const struct {
        const char *text, *piece;
        int32_t want;
    } v[] = {
        {"the", NULL, 0},
        {" The", NULL, 0},
        {"THE", NULL, 0},
        {"caf\xc3\xa9", NULL, 1}, // precomposed e acute: NFD + strip accents
        {"cafe", NULL, 1},
        {"Caf\xc3\xa9", NULL, 1},
        {" ", NULL, 2}, // a lone space survives Strip (the sentinel)
        {"\t", NULL, 2},
        {"  ", NULL, 2},
        {"\xef\xac\x81", NULL, 3}, // U+FB01 ligature -> NFKC "fi"
        {"fi", NULL, 3},
        {"\xff", NULL, 4},                                 // invalid UTF-8: byte-level piece
        {"\xc3", "\xc3\x83", 5},                           // partial UTF-8: the given piece
        {"x\xef\xbf\xbd", "x\xc3\xaf\xc2\xbf\xc2\xbd", 6}, // contains U+FFFD: the piece
        {"", NULL, 7},                                     // empty stays empty
        {"\xcc\x81", NULL, 8},                             // a lone Mn mark: normalises to ""
        {"\x0b", NULL, 9},                                 // VT: stripped to "", keeps itself
        {"\xc3\xbf", NULL, 10},                            // y diaeresis -> "y" (not "\xff")
        {"Y", NULL, 10},
        {"\xe3\x80\x80x\xe2\x80\x83", NULL, 11}, // ideographic / em space -> NFKC " x " -> "x"
        {"x", NULL, 11},
        {" \n x", NULL, 11},
        {"\xe1\x9a\x80", NULL, 12}, // U+1680: White_Space, stripped to "", keeps itself
        {"\xef\xbc\xa1", NULL, 13}, // fullwidth A
        {"a", NULL, 13},
        {"\xce\xa3", NULL, 14},    // Sigma -> sigma
        {"\xcf\x82", NULL, 15},    // final sigma stays itself (char-wise lowercase)
        {"\xee\x80\x80", NULL, 2}, // a text U+E000 becomes a space after Strip, like a space
        {"\xc4\xb0", NULL, 16},    // I with dot above: NFD, strip the dot, lowercase
        {"i", NULL, 16},
        {"\xe2\x84\xab", NULL, 13}, // Angstrom sign -> A ring -> a
        {"\xc3\x9f", NULL, 17},     // sharp s stays (no full case folding)
        {"SS", NULL, 18},
        {"\xcf\x83", NULL, 14},
        {"\xe0\xa4\x95\xe0\xa4\x83", NULL, 19}, // KA + visarga (Mc): the mark goes too
        {"\xe0\xa4\x95", NULL, 19},
        {"a\xe2\x83\x9d", NULL, 13}, // a + enclosing circle (Me) -> "a"
        {"\xe0\xa4\x83", NULL, 20},  // a lone Mc mark: "" -> keeps itself
    };
    const uint32_t n = sizeof(v) / sizeof(v[0]);
    tm_engram_tok toks[64];
    for (uint32_t i = 0; i < n; i++)
        toks[i] = (tm_engram_tok){.text = v[i].text,
                                  .text_len = strlen(v[i].text),
                                  .piece = v[i].piece,
                                  .piece_len = v[i].piece ? strlen(v[i].piece) : 0};
    int32_t map[64];
    uint32_t n_c = 0;
    tm_err err = {0};
    TM_CHECK_OK(tm_engram_token_map_build(toks, n, map, &n_c, &err), &err);
    TM_CHECK_MSG(n_c == 21, "%u", n_c);
    for (uint32_t i = 0; i < n; i++)
        TM_CHECK_MSG(map[i] == v[i].want, "token %u: got %d want %d", i, map[i], v[i].want);
    // The key of a byte-level token is reported as keyed by its piece.
    char *key = NULL;
    size_t kl = 0;
    int by_piece = 0;
    TM_CHECK_OK(tm_engram_token_key(&toks[11], &key, &kl, &by_piece, &err), &err);
    TM_CHECK(by_piece && kl == 2 && !memcmp(key, "\xc3\xbf", 2));
    tm_free(key);
    TM_CHECK_OK(tm_engram_token_key(&toks[1], &key, &kl, &by_piece, &err), &err);
    TM_CHECK(!by_piece && kl == 3 && !memcmp(key, "the", 3));
    tm_free(key);
}

static void test_check_compressed_vocab(void) {
    tm_err err = {0};
    TM_CHECK(tm_engram_check_compressed_vocab(99092, 99092, "m/config.json", &err) == TM_OK);
    TM_CHECK(tm_engram_check_compressed_vocab(99045, 99092, "m/config.json", &err) == TM_E_INVAL);
    TM_CHECK(strstr(err.msg, "99045") && strstr(err.msg, "99092") &&
             strstr(err.msg, "m/config.json") && strstr(err.msg, "engram_compressed_vocab_size"));
}

static void test_alloc_failures(void) {
    // Every allocation of layout create and map build failing in turn: clean error, no leak.
    tm_err err = {0};
    tm_engram_tok toks[3] = {{"The", 3, NULL, 0}, {"the", 3, NULL, 0}, {"\xff", 1, NULL, 0}};
    for (long k = 1; k < 40; k++) {
        long live = tm_alloc_live();
        tm_fault_set(TM_FAULT_ALLOC, k);
        tm_rc rc;
        tm_engram_layout *L = small_layout(60, &err, &rc);
        tm_engram_layout_destroy(L);
        int32_t map[3];
        uint32_t n_c;
        tm_rc rc2 = tm_engram_token_map_build(toks, 3, map, &n_c, &err);
        tm_fault_set(TM_FAULT_ALLOC, 0);
        TM_CHECK(rc == TM_OK || rc == TM_E_NOMEM);
        TM_CHECK(rc2 == TM_OK || rc2 == TM_E_NOMEM);
        TM_CHECK(rc2 != TM_OK || (n_c == 2 && map[0] == 0 && map[1] == 0 && map[2] == 1));
        TM_CHECK_MSG(tm_alloc_live() == live, "allocation %ld", k);
    }
}

int main(void) {
    TM_RUN(test_is_prime);
    TM_RUN(test_layout_small);
    TM_RUN(test_layout_released);
    TM_RUN(test_hash_ids);
    TM_RUN(test_byte_level_piece);
    TM_RUN(test_token_map);
    TM_RUN(test_check_compressed_vocab);
    TM_RUN(test_alloc_failures);
    return tm_test_report();
}
