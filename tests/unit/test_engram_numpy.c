/* tests/unit/test_engram_numpy.c - the Engram hash multipliers of runner/model/engram_hash.c
 * against NumPy itself, bit for bit: tests/oracles/engram_numpy.py prints
 * default_rng(10007 * layer).integers(0, bound, dtype=int64) * 2 + 1 for layer ids 0..63 and
 * several compressed vocab sizes (99,092 as released, 129,280, 1,000, 7, 2^31 + 11 whose bound is
 * below 2^32 so NumPy draws from its buffered 32-bit stream, and 2^40 + 15), and raw
 * Generator.integers draws over both Lemire paths and their edges. Python is the first of
 * $TM_PYTHON, /usr/bin/python3, python3 that imports numpy (tools/setup installs python3-numpy);
 * exit 77 (skip) only when none does. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runner/model/engram_hash.h"
#include "tm_test.h"

#define MAX_NGRAM 8

int main(void) {
    const char *py = tm_test_find_python("numpy");
    if (!py) {
        tm_test_skip("no python3 with numpy (tools/setup installs python3-numpy)");
        return 77;
    }
    const char *src = getenv("TM_SRC") ? getenv("TM_SRC") : ".";
    char cmd[2048];
    snprintf(cmd, sizeof(cmd),
             "%s '%s/tests/oracles/engram_numpy.py' %d 99092 129280 1000 7 2147483659 "
             "1099511627791",
             py, src, MAX_NGRAM);
    FILE *f = popen(cmd, "r");
    TM_CHECK(f != NULL);
    if (!f)
        return tm_test_report();
    static char line[1 << 16];
    int n_mul = 0, n_int = 0;
    while (fgets(line, sizeof(line), f)) {
        char *save = NULL, *tok = strtok_r(line, " \n", &save);
        if (!tok)
            continue;
        if (!strcmp(tok, "numpy")) {
            printf("numpy %s", save);
            continue;
        }
        if (!strcmp(tok, "mul")) {
            uint32_t layer = (uint32_t)strtoul(strtok_r(NULL, " \n", &save), NULL, 10);
            uint64_t v = strtoull(strtok_r(NULL, " \n", &save), NULL, 10);
            int64_t got[MAX_NGRAM];
            tm_engram_multipliers(layer, MAX_NGRAM, v, got);
            for (int k = 0; k < MAX_NGRAM; k++) {
                char *w = strtok_r(NULL, " \n", &save);
                TM_CHECK(w != NULL);
                if (!w)
                    break;
                int64_t want = strtoll(w, NULL, 10);
                TM_CHECK_MSG(got[k] == want,
                             "layer %u vocab %" PRIu64 " k %d: C %" PRId64 " numpy %" PRId64, layer,
                             v, k, got[k], want);
            }
            n_mul++;
        } else if (!strcmp(tok, "int")) {
            uint64_t seed = strtoull(strtok_r(NULL, " \n", &save), NULL, 10);
            int64_t high = strtoll(strtok_r(NULL, " \n", &save), NULL, 10);
            uint32_t n = (uint32_t)strtoul(strtok_r(NULL, " \n", &save), NULL, 10);
            int64_t *got = calloc(n ? n : 1, sizeof(*got));
            TM_CHECK(got != NULL);
            if (!got)
                break;
            tm_engram_np_integers(seed, high, n, got);
            for (uint32_t k = 0; k < n; k++) {
                char *w = strtok_r(NULL, " \n", &save);
                TM_CHECK(w != NULL);
                if (!w)
                    break;
                int64_t want = strtoll(w, NULL, 10);
                TM_CHECK_MSG(got[k] == want,
                             "seed %" PRIu64 " high %" PRId64 " draw %u: C %" PRId64
                             " numpy %" PRId64,
                             seed, high, k, got[k], want);
            }
            free(got);
            n_int++;
        }
    }
    int st = pclose(f);
    TM_CHECK_MSG(st == 0, "%s exited with %d", py, st);
    TM_CHECK_MSG(n_mul == 6 * 64, "%d multiplier lines", n_mul);
    TM_CHECK_MSG(n_int == 16, "%d draw lines", n_int);
    return tm_test_report();
}
