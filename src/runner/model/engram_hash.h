/* runner/model/engram_hash.h - DeepSeek-V4.1 Engram n-gram hashing, exactly as the reference
 * (inference/engram.py of DeepSeek-V4.1-Flash: find_next_prime, build_compressed_token_map,
 * compute_hash_multipliers, EngramLayout, NgramHashState.forward):
 *
 *  - the layout: one prime-sized bucket range per (engram layer, n-gram size 2..max_ngram, head),
 *    the primes drawn in that order from a shared seen-set, each search starting above
 *    engram_vocab_size - 1; per layer the offsets are the running sums of its primes;
 *  - the multipliers: per layer, max_ngram odd int64 values drawn with NumPy's
 *    default_rng(10007 * layer_id).integers(0, bound, dtype=int64) * 2 + 1, bound =
 *    max(1, (INT64_MAX / compressed_vocab) / 2) (SeedSequence, PCG64 and the Lemire bounded draw
 *    reproduced bit for bit);
 *  - the compressed token map: every token id's decoded text normalised (NFKC, NFD, strip every
 *    combining mark (Mn, Mc, Me), lowercase, whitespace runs to one space, strip; a text that is
 *    one space stays one space) and equal keys collapsed to one id, in token id order; a text
 *    that is not valid UTF-8 or contains U+FFFD is keyed by the token's raw piece instead
 *    (utf8proc does the Unicode);
 *  - the hash ids of one position from the compressed ids of the position and the max_ngram - 1
 *    before it.
 *
 * This module depends on base/ only: the caller decodes the tokens (runner/text) and passes the
 * texts in. All functions are pure or act on caller-owned memory; a layout is immutable after
 * create, so any number of threads may read it. */
#ifndef TM_RUNNER_MODEL_ENGRAM_HASH_H
#define TM_RUNNER_MODEL_ENGRAM_HASH_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"

/* Context entries that take no part in an n-gram. DEAD marks a token of an image span (the
 * reference caches it as -1); NONE a slot before the start of the sequence. Either one, at
 * shift s, replaces it and every older slot with the pad id. */
#define TM_ENGRAM_DEAD (-1)
#define TM_ENGRAM_NONE (-2)

#define TM_ENGRAM_MAX_NGRAM 16 /* limit on engram_max_ngram_size accepted here */
#define TM_ENGRAM_MAX_LAYERS 256
#define TM_ENGRAM_MAX_COLUMNS 65536 /* layers x (max_ngram - 1) x heads: the primes of a layout */

/* The config fields the layout is built from (ModelArgs names in the comments). */
typedef struct tm_engram_params {
    uint32_t n_layer;               /* len(engram_layer_ids), 1..TM_ENGRAM_MAX_LAYERS */
    const uint32_t *layer_ids;      /* [n_layer] engram_layer_ids; borrowed during create */
    const uint64_t *num_embeddings; /* [n_layer] engram_num_embeddings (table rows) */
    uint32_t max_ngram;             /* engram_max_ngram_size, 2..TM_ENGRAM_MAX_NGRAM */
    uint32_t n_heads;               /* engram_n_heads, >= 1 */
    uint32_t head_dim;              /* engram_head_dim */
    uint64_t vocab_size;            /* engram_vocab_size: primes are searched above it - 1 */
    uint64_t compressed_vocab;      /* engram_compressed_vocab_size, >= 1 */
    int64_t pad_compressed;         /* token_map[engram_pad_id], in [0, compressed_vocab) */
} tm_engram_params;

typedef struct tm_engram_layout {
    uint32_t n_layer;   /* engram layers */
    uint32_t max_ngram; /* engram_max_ngram_size */
    uint32_t n_heads;   /* engram_n_heads */
    uint32_t head_dim;  /* engram_head_dim */
    uint32_t n_cols;    /* (max_ngram - 1) * n_heads: hash ids per position per layer */
    uint64_t compressed_vocab;
    int64_t pad_compressed;   /* compressed pad id */
    uint32_t *layer_ids;      /* [n_layer] */
    uint64_t *num_embeddings; /* [n_layer] table rows as configured */
    uint64_t *primes;         /* [n_layer][n_cols]: column (ngram - 2) * n_heads + head */
    uint64_t *offsets;        /* [n_layer][n_cols]: running sum of the layer's primes, from 0 */
    uint64_t *rows_used;      /* [n_layer]: offset + prime of the last column (ids are below) */
    int64_t *multipliers;     /* [n_layer][max_ngram], odd */
} tm_engram_layout;

/* Build the layout (primes, offsets, multipliers). Errors: TM_E_INVAL naming the field for a
 * bad parameter, or when a layer's num_embeddings is smaller than the bucket ranges need
 * (naming both numbers); TM_E_NOMEM. On success *out owns a new layout; free it with
 * tm_engram_layout_destroy. */
tm_rc tm_engram_layout_create(const tm_engram_params *p, tm_engram_layout **out, tm_err *err);
void tm_engram_layout_destroy(tm_engram_layout *L); /* NULL is a no-op */

/* The hash ids of one position for every engram layer. ctx[s] (s = 0..max_ngram-1) is the
 * compressed id s positions back (ctx[0] the position itself), or TM_ENGRAM_DEAD /
 * TM_ENGRAM_NONE; ids must be below compressed_vocab. out: [n_layer][n_cols] row indices into
 * each layer's table (below rows_used[layer]). Exactly NgramHashState.forward: the first
 * blocked shift and all older ones take the pad id, products XORed one look-back at a time,
 * each running value modulo the column's prime plus its offset. */
void tm_engram_hash_ids(const tm_engram_layout *L, const int64_t *ctx, int64_t *out);

/* Shift a context one position on: ctx[s] = ctx[s-1] for s >= 1, ctx[0] = id (a compressed id
 * or TM_ENGRAM_DEAD). A fresh sequence starts with every entry TM_ENGRAM_NONE. */
void tm_engram_ctx_push(int64_t *ctx, uint32_t max_ngram, int64_t id);

/* --- the compressed token map --- */

/* One token as the caller's tokenizer sees it. */
typedef struct tm_engram_tok {
    const char *text; /* the token decoded alone (byte-level bytes, special tokens as their
                       * content), not necessarily valid UTF-8; borrowed */
    size_t text_len;
    const char *piece; /* the raw vocabulary string (id_to_token); borrowed. NULL: the token is a
                        * byte-level BPE one, whose piece is tm_engram_byte_level_piece(text) */
    size_t piece_len;
} tm_engram_tok;

/* The byte-level BPE vocabulary string of the bytes b[0..n) (GPT-2's bytes_to_unicode table, one
 * char per byte): what id_to_token gives for a vocabulary token that decodes to these bytes. *out
 * is tm_alloc'd and NUL-terminated (*out_len bytes); the caller frees it with tm_free. */
tm_rc tm_engram_byte_level_piece(const char *b, size_t n, char **out, size_t *out_len, tm_err *err);

/* Build the compressed map of n_tok tokens: map[i] = compressed id of token i (ids handed out
 * in token order from 0), *n_compressed = number of distinct keys. Errors: TM_E_INVAL when a
 * text cannot be normalised (utf8proc's message); TM_E_NOMEM. map: [n_tok], caller-owned. */
tm_rc tm_engram_token_map_build(const tm_engram_tok *toks, uint32_t n_tok, int32_t *map,
                                uint32_t *n_compressed, tm_err *err);

/* The normalisation key of one token's text into *key (tm_alloc'd, caller frees with tm_free,
 * *key_len bytes, NUL-terminated): the normalised text, the text itself when that is empty,
 * or the piece when the text is not valid UTF-8 or contains U+FFFD. *by_piece says which of
 * the last case. Exposed for the tests. */
tm_rc tm_engram_token_key(const tm_engram_tok *tok, char **key, size_t *key_len, int *by_piece,
                          tm_err *err);

/* Refuse a config whose engram_compressed_vocab_size differs from what the tokenizer's map
 * gives: TM_E_INVAL "<where>: engram_compressed_vocab_size is <config> but the tokenizer's
 * compressed vocabulary has <built> entries". where names the config (its file). */
tm_rc tm_engram_check_compressed_vocab(uint64_t built, uint64_t config, const char *where,
                                       tm_err *err);

/* --- the pieces, exposed for the tests --- */

/* Deterministic primality for any 64-bit n (Miller-Rabin with the 12 first prime bases). */
int tm_engram_is_prime(uint64_t n);

/* The multipliers of one layer: out[k] = NumPy's
 * default_rng(10007 * layer_id).integers(0, bound, size=max_ngram, dtype=int64)[k] * 2 + 1. */
void tm_engram_multipliers(uint32_t layer_id, uint32_t max_ngram, uint64_t compressed_vocab,
                           int64_t *out);

/* NumPy's default_rng(seed).integers(0, high, size=n, dtype=int64) for any seed < 2^64 and
 * high >= 1, into out[n]. */
void tm_engram_np_integers(uint64_t seed, int64_t high, uint32_t n, int64_t *out);

#endif /* TM_RUNNER_MODEL_ENGRAM_HASH_H */
