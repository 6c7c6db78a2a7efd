/* tests/fuzz/fuzz_engram_map.c - libFuzzer target for the DeepSeek-V4.1 Engram compressed token
 * map (runner/model/engram_hash.c: UTF-8 check, utf8proc NFKC/NFD, mark stripping, lowercase,
 * whitespace folding, Strip, the byte-level piece of invalid texts) and the V4.1 chat encoding
 * (runner/text/chat_dsv41.c), on arbitrary bytes: the input is split at NUL bytes into token
 * texts. The map must build (TM_OK), hand out ids in first-appearance order below the count it
 * reports, give the same map twice, and every key must agree with the map (equal keys <=> equal
 * ids); rendering the texts as a conversation ends in TM_OK or TM_E_INVAL with a message. Without
 * libFuzzer the same file replays the corpus in tests/fuzz/corpus_engram_map in every build. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/buf.h"
#include "runner/model/engram_hash.h"
#include "runner/text/chat.h"

#define MAX_TOK 64

static void check(int ok, const char *what, const tm_err *err) {
    if (ok)
        return;
    fprintf(stderr, "fuzz_engram_map: invariant broken: %s (rc %d, msg %s)\n", what, err->rc,
            err->msg);
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tm_engram_tok toks[MAX_TOK];
    uint32_t n = 0;
    size_t start = 0;
    for (size_t i = 0; i <= size && n < MAX_TOK; i++) {
        if (i == size || data[i] == 0) {
            toks[n++] = (tm_engram_tok){.text = (const char *)data + start, .text_len = i - start};
            start = i + 1;
        }
    }
    int32_t map[MAX_TOK], map2[MAX_TOK];
    uint32_t n_c = 0, n_c2 = 0;
    tm_err err = {0};
    tm_rc rc = tm_engram_token_map_build(toks, n, map, &n_c, &err);
    check(rc == TM_OK, "map build failed", &err);
    check(n_c >= (n > 0) && n_c <= n, "compressed count out of range", &err);
    int32_t next = 0;
    for (uint32_t i = 0; i < n; i++) {
        check(map[i] >= 0 && (uint32_t)map[i] < n_c, "id out of range", &err);
        check(map[i] <= next, "ids not in first-appearance order", &err);
        if (map[i] == next)
            next++;
    }
    check((uint32_t)next == n_c, "count differs from the ids handed out", &err);
    rc = tm_engram_token_map_build(toks, n, map2, &n_c2, &err);
    check(rc == TM_OK && n_c2 == n_c && !memcmp(map, map2, n * sizeof(*map)), "not deterministic",
          &err);
    char *keys[MAX_TOK];
    size_t kl[MAX_TOK];
    for (uint32_t i = 0; i < n; i++) {
        int by_piece;
        rc = tm_engram_token_key(&toks[i], &keys[i], &kl[i], &by_piece, &err);
        check(rc == TM_OK, "key failed", &err);
    }
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t j = 0; j < i; j++) {
            int same = kl[i] == kl[j] && !memcmp(keys[i], keys[j], kl[i]);
            check(same == (map[i] == map[j]), "keys and ids disagree", &err);
        }
    for (uint32_t i = 0; i < n; i++)
        tm_free(keys[i]);
    // The texts as a conversation (contents are C strings: cut at the first NUL, i.e. as split).
    static const char *const roles[4] = {"system", "user", "assistant", "tool"};
    tm_message msgs[MAX_TOK];
    char *owned[MAX_TOK];
    for (uint32_t i = 0; i < n; i++) {
        owned[i] = tm_strndup(toks[i].text, toks[i].text_len);
        check(owned[i] != NULL, "out of memory", &err);
        msgs[i].role = (char *)roles[(toks[i].text_len + i) & 3];
        msgs[i].content = owned[i];
    }
    tm_buf out = {0};
    err = (tm_err){0};
    rc = tm_chat_render_dsv41(msgs, n, size & 1, &out, &err);
    check(rc == TM_OK || (rc == TM_E_INVAL && err.msg[0]), "chat render: unexpected result", &err);
    tm_buf_fini(&out);
    for (uint32_t i = 0; i < n; i++)
        tm_free(owned[i]);
    return 0;
}

#include "fuzz_replay.h"
