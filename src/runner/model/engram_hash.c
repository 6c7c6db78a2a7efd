/* runner/model/engram_hash.c - DeepSeek-V4.1 Engram hashing (see engram_hash.h): primes,
 * offsets, NumPy-exact multipliers, the compressed token map (the one file of runner/model that
 * includes utf8proc.h) and per-position hash ids. Pure functions; no global state. */
#include "runner/model/engram_hash.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "base/alloc.h"
#include "base/hash.h"

/* ---------------------------------------------------------------- primes */

static uint64_t mulmod64(uint64_t a, uint64_t b, uint64_t m) {
    return (uint64_t)(((unsigned __int128)a * b) % m);
}

static uint64_t powmod64(uint64_t b, uint64_t e, uint64_t m) {
    uint64_t r = 1 % m;
    b %= m;
    while (e) {
        if (e & 1)
            r = mulmod64(r, b, m);
        b = mulmod64(b, b, m);
        e >>= 1;
    }
    return r;
}

int tm_engram_is_prime(uint64_t n) {
    static const uint64_t small[] = {2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37};
    if (n < 2)
        return 0;
    for (size_t i = 0; i < sizeof(small) / sizeof(small[0]); i++) {
        if (n % small[i] == 0)
            return n == small[i];
    }
    uint64_t d = n - 1;
    int s = 0;
    while ((d & 1) == 0) {
        d >>= 1;
        s++;
    }
    // These 12 bases decide primality for every n < 3.3e24, so for all 64-bit n.
    for (size_t i = 0; i < sizeof(small) / sizeof(small[0]); i++) {
        uint64_t x = powmod64(small[i], d, n);
        if (x == 1 || x == n - 1)
            continue;
        int composite = 1;
        for (int r = 1; r < s; r++) {
            x = mulmod64(x, x, n);
            if (x == n - 1) {
                composite = 0;
                break;
            }
        }
        if (composite)
            return 0;
    }
    return 1;
}

/* ---------------------------------------------------------------- NumPy's RNG */

/* SeedSequence (numpy/random/bit_generator.pyx): the hashmix/mix constants of its entropy pool. */
#define SS_INIT_A 0x43b0d7e5u
#define SS_MULT_A 0x931e8875u
#define SS_INIT_B 0x8b51f9ddu
#define SS_MULT_B 0x58f38dedu
#define SS_MIX_L 0xca01f9ddu
#define SS_MIX_R 0x4973f715u
#define SS_XSHIFT 16
#define SS_POOL 4

static uint32_t ss_hashmix(uint32_t value, uint32_t *hash_const) {
    value ^= *hash_const;
    *hash_const *= SS_MULT_A;
    value *= *hash_const;
    value ^= value >> SS_XSHIFT;
    return value;
}

static uint32_t ss_mix(uint32_t x, uint32_t y) {
    uint32_t r = SS_MIX_L * x - SS_MIX_R * y;
    return r ^ (r >> SS_XSHIFT);
}

/* SeedSequence(seed).generate_state(4, uint64) for an int seed (no spawn key). */
static void seed_sequence_state(uint64_t seed, uint64_t state[4]) {
    uint32_t entropy[2];
    uint32_t n_entropy = 0;
    // An int becomes its 32-bit words, least significant first; 0 is one word.
    entropy[n_entropy++] = (uint32_t)seed;
    if (seed >> 32)
        entropy[n_entropy++] = (uint32_t)(seed >> 32);
    uint32_t pool[SS_POOL];
    uint32_t hc = SS_INIT_A;
    for (uint32_t i = 0; i < SS_POOL; i++)
        pool[i] = ss_hashmix(i < n_entropy ? entropy[i] : 0, &hc);
    for (uint32_t src = 0; src < SS_POOL; src++) {
        for (uint32_t dst = 0; dst < SS_POOL; dst++) {
            if (src != dst)
                pool[dst] = ss_mix(pool[dst], ss_hashmix(pool[src], &hc));
        }
    }
    // generate_state: 8 32-bit words cycling over the pool, read back as 4 little-endian u64.
    uint32_t w[8];
    uint32_t hb = SS_INIT_B;
    for (uint32_t i = 0; i < 8; i++) {
        uint32_t v = pool[i % SS_POOL];
        v ^= hb;
        hb *= SS_MULT_B;
        v *= hb;
        v ^= v >> SS_XSHIFT;
        w[i] = v;
    }
    for (uint32_t i = 0; i < 4; i++)
        state[i] = (uint64_t)w[2 * i] | ((uint64_t)w[2 * i + 1] << 32);
}

/* PCG64 (XSL-RR 128/64) as numpy's pcg64.h, with its buffered 32-bit output. */
typedef struct pcg64 {
    unsigned __int128 state, inc;
    int has_uint32;
    uint32_t uinteger;
} pcg64;

static const unsigned __int128 PCG_MULT = ((unsigned __int128)2549297995355413924ull << 64) |
                                          4865540595714422341ull;

static void pcg_step(pcg64 *r) { r->state = r->state * PCG_MULT + r->inc; }

static void pcg_seed(pcg64 *r, uint64_t seed) {
    uint64_t v[4];
    seed_sequence_state(seed, v);
    unsigned __int128 initstate = ((unsigned __int128)v[0] << 64) | v[1];
    unsigned __int128 initseq = ((unsigned __int128)v[2] << 64) | v[3];
    r->state = 0;
    r->inc = (initseq << 1) | 1;
    pcg_step(r);
    r->state += initstate;
    pcg_step(r);
    r->has_uint32 = 0;
    r->uinteger = 0;
}

static uint64_t pcg_next64(pcg64 *r) {
    pcg_step(r);
    uint64_t x = (uint64_t)(r->state >> 64) ^ (uint64_t)r->state;
    unsigned rot = (unsigned)(r->state >> 122);
    return (x >> rot) | (x << ((64 - rot) & 63));
}

static uint32_t pcg_next32(pcg64 *r) {
    if (r->has_uint32) {
        r->has_uint32 = 0;
        return r->uinteger;
    }
    uint64_t n = pcg_next64(r);
    r->has_uint32 = 1;
    r->uinteger = (uint32_t)(n >> 32);
    return (uint32_t)n;
}

/* distributions.c: Lemire's bounded draws in [0, rng]; rng < 2^32 - 1 for the 32-bit one. */
static uint32_t lemire32(pcg64 *r, uint32_t rng) {
    const uint32_t excl = rng + 1;
    uint64_t m = (uint64_t)pcg_next32(r) * excl;
    uint32_t left = (uint32_t)m;
    if (left < excl) {
        const uint32_t threshold = (UINT32_MAX - rng) % excl;
        while (left < threshold) {
            m = (uint64_t)pcg_next32(r) * excl;
            left = (uint32_t)m;
        }
    }
    return (uint32_t)(m >> 32);
}

static uint64_t lemire64(pcg64 *r, uint64_t rng) {
    const uint64_t excl = rng + 1;
    unsigned __int128 m = (unsigned __int128)pcg_next64(r) * excl;
    uint64_t left = (uint64_t)m;
    if (left < excl) {
        const uint64_t threshold = (UINT64_MAX - rng) % excl;
        while (left < threshold) {
            m = (unsigned __int128)pcg_next64(r) * excl;
            left = (uint64_t)m;
        }
    }
    return (uint64_t)(m >> 64);
}

void tm_engram_np_integers(uint64_t seed, int64_t high, uint32_t n, int64_t *out) {
    TM_ASSERT(high >= 1);
    pcg64 r;
    pcg_seed(&r, seed);
    // Generator.integers(0, high) -> random_bounded_uint64_fill(off 0, rng high - 1,
    // use_masked false): a range that fits 32 bits draws from the 32-bit stream.
    const uint64_t rng = (uint64_t)high - 1;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t v;
        if (rng == 0)
            v = 0;
        else if (rng < 0xFFFFFFFFull)
            v = lemire32(&r, (uint32_t)rng);
        else if (rng == 0xFFFFFFFFull)
            v = pcg_next32(&r);
        else
            v = lemire64(&r, rng);
        out[i] = (int64_t)v;
    }
}

void tm_engram_multipliers(uint32_t layer_id, uint32_t max_ngram, uint64_t compressed_vocab,
                           int64_t *out) {
    TM_ASSERT(compressed_vocab >= 1);
    uint64_t bound = ((uint64_t)INT64_MAX / compressed_vocab) / 2;
    if (bound < 1)
        bound = 1;
    tm_engram_np_integers(10007ull * layer_id, (int64_t)bound, max_ngram, out);
    for (uint32_t k = 0; k < max_ngram; k++)
        out[k] = out[k] * 2 + 1;
}

/* ---------------------------------------------------------------- layout */

void tm_engram_layout_destroy(tm_engram_layout *L) {
    if (!L)
        return;
    tm_free(L->layer_ids);
    tm_free(L->num_embeddings);
    tm_free(L->primes);
    tm_free(L->offsets);
    tm_free(L->rows_used);
    tm_free(L->multipliers);
    tm_free(L);
}

tm_rc tm_engram_layout_create(const tm_engram_params *p, tm_engram_layout **out, tm_err *err) {
    *out = NULL;
    if (p->n_layer < 1 || p->n_layer > TM_ENGRAM_MAX_LAYERS)
        return TM_ERR(err, TM_E_INVAL, "engram: engram_layer_ids has %u entries (1..%d)",
                      p->n_layer, TM_ENGRAM_MAX_LAYERS);
    if (p->max_ngram < 2 || p->max_ngram > TM_ENGRAM_MAX_NGRAM)
        return TM_ERR(err, TM_E_INVAL, "engram: engram_max_ngram_size %u is not in 2..%d",
                      p->max_ngram, TM_ENGRAM_MAX_NGRAM);
    if (p->n_heads < 1 || p->n_heads > 4096)
        return TM_ERR(err, TM_E_INVAL, "engram: engram_n_heads %u is not in 1..4096", p->n_heads);
    if ((uint64_t)p->n_layer * (p->max_ngram - 1) * p->n_heads > TM_ENGRAM_MAX_COLUMNS)
        return TM_ERR(err, TM_E_INVAL,
                      "engram: %u layers x (engram_max_ngram_size %u - 1) x engram_n_heads %u "
                      "bucket ranges exceed %d",
                      p->n_layer, p->max_ngram, p->n_heads, TM_ENGRAM_MAX_COLUMNS);
    if (p->compressed_vocab < 1 || p->compressed_vocab > (uint64_t)INT32_MAX)
        return TM_ERR(err, TM_E_INVAL,
                      "engram: engram_compressed_vocab_size %llu is not in 1..2147483647",
                      (unsigned long long)p->compressed_vocab);
    if (p->pad_compressed < 0 || (uint64_t)p->pad_compressed >= p->compressed_vocab)
        return TM_ERR(err, TM_E_INVAL, "engram: compressed pad id %lld is outside [0, %llu)",
                      (long long)p->pad_compressed, (unsigned long long)p->compressed_vocab);
    if (p->vocab_size > ((uint64_t)1 << 48))
        return TM_ERR(err, TM_E_INVAL, "engram: engram_vocab_size %llu is above 2^48",
                      (unsigned long long)p->vocab_size);
    tm_engram_layout *L = tm_calloc(1, sizeof(*L));
    if (!L)
        return TM_ERR(err, TM_E_NOMEM, "engram: layout");
    tm_rc rc = TM_OK;
    L->n_layer = p->n_layer;
    L->max_ngram = p->max_ngram;
    L->n_heads = p->n_heads;
    L->head_dim = p->head_dim;
    L->n_cols = (p->max_ngram - 1) * p->n_heads;
    L->compressed_vocab = p->compressed_vocab;
    L->pad_compressed = p->pad_compressed;
    size_t n_all = (size_t)L->n_layer * L->n_cols;
    L->layer_ids = tm_calloc(L->n_layer, sizeof(*L->layer_ids));
    L->num_embeddings = tm_calloc(L->n_layer, sizeof(*L->num_embeddings));
    L->primes = tm_calloc(n_all, sizeof(*L->primes));
    L->offsets = tm_calloc(n_all, sizeof(*L->offsets));
    L->rows_used = tm_calloc(L->n_layer, sizeof(*L->rows_used));
    L->multipliers = tm_calloc((size_t)L->n_layer * L->max_ngram, sizeof(*L->multipliers));
    if (!L->layer_ids || !L->num_embeddings || !L->primes || !L->offsets || !L->rows_used ||
        !L->multipliers) {
        rc = TM_ERR(err, TM_E_NOMEM, "engram: layout");
        goto fail;
    }
    // EngramLayout.from_args: per layer, per n-gram size, per head, the next unused prime above
    // the previous head's (the first head's search starts above engram_vocab_size - 1). Every
    // search starts at engram_vocab_size and the primes handed out so far are exactly the
    // primes in [engram_vocab_size, last], so "not yet handed out" is "above last": the same
    // sequence as the reference's seen-set, in time linear in the number of primes.
    size_t n_seen = 0;
    uint64_t last = 0;
    for (uint32_t l = 0; l < L->n_layer; l++) {
        L->layer_ids[l] = p->layer_ids[l];
        L->num_embeddings[l] = p->num_embeddings[l];
        for (uint32_t g = 0; g + 1 < L->max_ngram; g++) {
            uint64_t cand = p->vocab_size; // find_next_prime(vocab_size - 1, seen) starts here
            for (uint32_t h = 0; h < L->n_heads; h++) {
                if (n_seen && cand <= last)
                    cand = last + 1;
                while (!tm_engram_is_prime(cand))
                    cand++;
                L->primes[n_seen++] = cand;
                last = cand++;
            }
        }
        uint64_t *pr = L->primes + (size_t)l * L->n_cols;
        uint64_t *off = L->offsets + (size_t)l * L->n_cols;
        uint64_t sum = 0;
        for (uint32_t c = 0; c < L->n_cols; c++) {
            off[c] = sum;
            sum += pr[c];
        }
        L->rows_used[l] = sum;
        if (L->num_embeddings[l] < sum) {
            rc = TM_ERR(err, TM_E_INVAL,
                        "engram: engram_num_embeddings[%u] (layer %u) is %llu but its bucket "
                        "ranges need %llu rows",
                        l, L->layer_ids[l], (unsigned long long)L->num_embeddings[l],
                        (unsigned long long)sum);
            goto fail;
        }
        tm_engram_multipliers(L->layer_ids[l], L->max_ngram, L->compressed_vocab,
                              L->multipliers + (size_t)l * L->max_ngram);
    }
    *out = L;
    return TM_OK;
fail:
    tm_engram_layout_destroy(L);
    return rc;
}

/* ---------------------------------------------------------------- hash ids */

void tm_engram_ctx_push(int64_t *ctx, uint32_t max_ngram, int64_t id) {
    for (uint32_t s = max_ngram - 1; s >= 1; s--)
        ctx[s] = ctx[s - 1];
    ctx[0] = id;
}

void tm_engram_hash_ids(const tm_engram_layout *L, const int64_t *ctx, int64_t *out) {
    uint64_t tok[TM_ENGRAM_MAX_NGRAM];
    int blocked = 0;
    for (uint32_t s = 0; s < L->max_ngram; s++) {
        if (ctx[s] < 0)
            blocked = 1;
        TM_ASSERT(blocked || (uint64_t)ctx[s] < L->compressed_vocab);
        tok[s] = (uint64_t)(blocked ? L->pad_compressed : ctx[s]);
    }
    for (uint32_t l = 0; l < L->n_layer; l++) {
        const int64_t *mul = L->multipliers + (size_t)l * L->max_ngram;
        const uint64_t *pr = L->primes + (size_t)l * L->n_cols;
        const uint64_t *off = L->offsets + (size_t)l * L->n_cols;
        int64_t *o = out + (size_t)l * L->n_cols;
        // token < compressed_vocab and multiplier <= INT64_MAX / compressed_vocab: the products
        // and their XOR stay non-negative int64, so % is the reference's remainder.
        uint64_t rolling = tok[0] * (uint64_t)mul[0];
        for (uint32_t i = 1; i < L->max_ngram; i++) {
            rolling ^= tok[i] * (uint64_t)mul[i];
            for (uint32_t h = 0; h < L->n_heads; h++) {
                uint32_t c = (i - 1) * L->n_heads + h;
                o[c] = (int64_t)(rolling % pr[c] + off[c]);
            }
        }
    }
}

/* ---------------------------------------------------------------- compressed token map */

/* Rust's char::is_whitespace (the White_Space property), which tokenizers' Strip uses. */
static int rust_is_whitespace(int32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

/* 1 when s[0..n) is valid UTF-8 without U+FFFD (what from_utf8_lossy leaves unchanged). */
static int utf8_clean(const char *s, size_t n) {
    const utf8proc_uint8_t *p = (const utf8proc_uint8_t *)s;
    size_t i = 0;
    while (i < n) {
        utf8proc_int32_t c;
        utf8proc_ssize_t k = utf8proc_iterate(p + i, (utf8proc_ssize_t)(n - i), &c);
        if (k <= 0 || c == 0xFFFD)
            return 0;
        i += (size_t)k;
    }
    return 1;
}

static tm_rc utf8proc_fail(utf8proc_ssize_t r, tm_err *err) {
    if (r == UTF8PROC_ERROR_NOMEM)
        return TM_ERR(err, TM_E_NOMEM, "engram: utf8proc: %s", utf8proc_errmsg(r));
    return TM_ERR(err, TM_E_INVAL, "engram: utf8proc: %s", utf8proc_errmsg(r));
}

/* The normaliser sequence of build_compressed_token_map on valid UTF-8 text: *out (tm_alloc'd,
 * NUL-terminated, *out_len bytes) may be empty. */
static tm_rc normalize(const char *text, size_t len, char **out, size_t *out_len, tm_err *err) {
    *out = NULL;
    *out_len = 0;
    utf8proc_uint8_t *nfkc = NULL, *nfd = NULL;
    int32_t *cp = NULL;
    char *res = NULL;
    tm_rc rc = TM_OK;
    // NFKC, then NFD (as two steps, like the reference's sequence).
    utf8proc_ssize_t n1 = utf8proc_map((const utf8proc_uint8_t *)text, (utf8proc_ssize_t)len, &nfkc,
                                       UTF8PROC_STABLE | UTF8PROC_COMPAT | UTF8PROC_COMPOSE);
    if (n1 < 0)
        return utf8proc_fail(n1, err);
    utf8proc_ssize_t n2 = utf8proc_map(nfkc, n1, &nfd, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE);
    if (n2 < 0) {
        rc = utf8proc_fail(n2, err);
        goto done;
    }
    cp = tm_malloc(((size_t)n2 + 1) * sizeof(*cp));
    if (!cp) {
        rc = TM_ERR(err, TM_E_NOMEM, "engram: normalize");
        goto done;
    }
    // StripAccents (drop every combining mark: General_Category Mark = Mn, Mc, Me, as the
    // unicode-normalization crate's is_combining_mark that tokenizers calls), Lowercase (per
    // char), [ \t\r\n]+ -> " ".
    size_t n = 0;
    for (utf8proc_ssize_t i = 0; i < n2;) {
        utf8proc_int32_t c;
        utf8proc_ssize_t k = utf8proc_iterate(nfd + i, n2 - i, &c);
        TM_ASSERT(k > 0);
        i += k;
        utf8proc_category_t cat = utf8proc_category(c);
        if (cat == UTF8PROC_CATEGORY_MN || cat == UTF8PROC_CATEGORY_MC ||
            cat == UTF8PROC_CATEGORY_ME)
            continue;
        c = utf8proc_tolower(c);
        if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
            if (n > 0 && cp[n - 1] == ' ')
                continue;
            c = ' ';
        }
        cp[n++] = c;
    }
    // "^ $" -> sentinel, Strip, sentinel -> " ": a lone space survives; then every U+E000 (the
    // sentinel or one of the text's own) becomes a space.
    size_t b = 0, e = n;
    if (!(n == 1 && cp[0] == ' ')) {
        while (b < e && rust_is_whitespace(cp[b]))
            b++;
        while (e > b && rust_is_whitespace(cp[e - 1]))
            e--;
    }
    res = tm_malloc((e - b) * 4 + 1);
    if (!res) {
        rc = TM_ERR(err, TM_E_NOMEM, "engram: normalize");
        goto done;
    }
    size_t o = 0;
    for (size_t i = b; i < e; i++) {
        int32_t c = cp[i] == 0xE000 ? ' ' : cp[i];
        o += (size_t)utf8proc_encode_char(c, (utf8proc_uint8_t *)res + o);
    }
    res[o] = 0;
    *out = res;
    *out_len = o;
    res = NULL;
done:
    free(nfkc); // utf8proc_map allocates with malloc
    free(nfd);
    tm_free(cp);
    tm_free(res);
    return rc;
}

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 bytes
 * for U+0100.. in byte order. */
static int32_t byte_level_char(uint8_t b) {
    if ((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE)
        return b;
    int32_t n = 0;
    for (int x = 0; x < b; x++)
        if (!((x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE))
            n++;
    return 256 + n;
}

tm_rc tm_engram_byte_level_piece(const char *b, size_t n, char **out, size_t *out_len,
                                 tm_err *err) {
    char *s = tm_malloc(n * 2 + 1);
    if (!s)
        return TM_ERR(err, TM_E_NOMEM, "engram: byte-level piece");
    size_t o = 0;
    for (size_t i = 0; i < n; i++)
        o += (size_t)utf8proc_encode_char(byte_level_char((uint8_t)b[i]),
                                          (utf8proc_uint8_t *)s + o);
    s[o] = 0;
    *out = s;
    *out_len = o;
    return TM_OK;
}

tm_rc tm_engram_token_key(const tm_engram_tok *tok, char **key, size_t *key_len, int *by_piece,
                          tm_err *err) {
    *key = NULL;
    *key_len = 0;
    *by_piece = 0;
    if (!utf8_clean(tok->text, tok->text_len)) {
        // a partial UTF-8 byte token: keyed by its raw vocabulary string
        *by_piece = 1;
        if (!tok->piece)
            return tm_engram_byte_level_piece(tok->text, tok->text_len, key, key_len, err);
        *key = tm_strndup(tok->piece, tok->piece_len);
        if (!*key)
            return TM_ERR(err, TM_E_NOMEM, "engram: token key");
        *key_len = tok->piece_len;
        return TM_OK;
    }
    char *norm;
    size_t norm_len;
    tm_rc rc = normalize(tok->text, tok->text_len, &norm, &norm_len, err);
    if (rc)
        return rc;
    if (norm_len == 0) {
        tm_free(norm);
        norm = tm_strndup(tok->text_len ? tok->text : "", tok->text_len);
        if (!norm)
            return TM_ERR(err, TM_E_NOMEM, "engram: token key");
        norm_len = tok->text_len;
    }
    *key = norm;
    *key_len = norm_len;
    return TM_OK;
}

tm_rc tm_engram_token_map_build(const tm_engram_tok *toks, uint32_t n_tok, int32_t *map,
                                uint32_t *n_compressed, tm_err *err) {
    *n_compressed = 0;
    // Open addressing over the distinct keys: slot -> key index + 1 (0 = empty).
    size_t cap = 16;
    while (cap < (size_t)n_tok * 2)
        cap *= 2;
    uint32_t *slot = tm_calloc(cap, sizeof(*slot));
    char **keys = tm_calloc(n_tok ? n_tok : 1, sizeof(*keys));
    size_t *klen = tm_calloc(n_tok ? n_tok : 1, sizeof(*klen));
    uint32_t n_key = 0;
    tm_rc rc = TM_OK;
    if (!slot || !keys || !klen) {
        rc = TM_ERR(err, TM_E_NOMEM, "engram: token map");
        goto done;
    }
    for (uint32_t t = 0; t < n_tok; t++) {
        char *k;
        size_t kl;
        int by_piece;
        rc = tm_engram_token_key(&toks[t], &k, &kl, &by_piece, err);
        if (rc) {
            tm_err_wrap(err, "token %u: ", t);
            goto done;
        }
        size_t i = (size_t)tm_hash64(k, kl) & (cap - 1);
        for (;;) {
            uint32_t s = slot[i];
            if (s == 0) {
                keys[n_key] = k;
                klen[n_key] = kl;
                slot[i] = ++n_key;
                map[t] = (int32_t)(n_key - 1);
                break;
            }
            if (klen[s - 1] == kl && memcmp(keys[s - 1], k, kl) == 0) {
                tm_free(k);
                map[t] = (int32_t)(s - 1);
                break;
            }
            i = (i + 1) & (cap - 1);
        }
    }
    *n_compressed = n_key;
done:
    for (uint32_t i = 0; i < n_key; i++)
        tm_free(keys[i]);
    tm_free(keys);
    tm_free(klen);
    tm_free(slot);
    return rc;
}

tm_rc tm_engram_check_compressed_vocab(uint64_t built, uint64_t config, const char *where,
                                       tm_err *err) {
    if (built == config)
        return TM_OK;
    return TM_ERR(err, TM_E_INVAL,
                  "%s: engram_compressed_vocab_size is %llu but the tokenizer's compressed "
                  "vocabulary has %llu entries (every hash multiplier derives from it)",
                  where ? where : "config", (unsigned long long)config, (unsigned long long)built);
}
