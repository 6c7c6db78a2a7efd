/* tests/fuzz/fuzz_guided.c - libFuzzer target for the structured-output compilers
 * (runner/guided): the first byte picks the constraint kind (regex, JSON Schema, choice list), the
 * rest is its text. Every compilation must end in TM_OK, or TM_E_INVAL with a reason
 * (invalid/unsupported) and a message (never a crash, hang, leak or other code). A compiled DFA
 * must have a live start state, transitions only into its states, and agree with itself: walking
 * any input byte by byte gives the same state as one walk, and a state is final only if it
 * accepts and no byte leads on. Built with clang -fsanitize=fuzzer,address,undefined when
 * TM_FUZZ=ON; otherwise a main() replays tests/fuzz/corpus_guided in every build. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runner/guided/guided.h"

static void check(int ok, const char *what, const tm_err *err) {
    if (ok)
        return;
    fprintf(stderr, "fuzz_guided: invariant broken: %s (rc %d, msg %s)\n", what, err->rc, err->msg);
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const tm_guide_kind kinds[4] = {TM_GUIDE_KIND_REGEX, TM_GUIDE_KIND_JSON_SCHEMA,
                                           TM_GUIDE_KIND_CHOICE, TM_GUIDE_KIND_REGEX};
    tm_guide_kind kind = kinds[size ? data[0] & 3 : 0];
    const char *spec = size ? (const char *)data + 1 : "";
    size_t n = size ? size - 1 : 0;
    tm_err err = {0};
    tm_dfa *d = NULL;
    tm_guide_why why = TM_GUIDE_WHY_NONE;
    // 1/16 of the release bound: sanitizers and coverage make a step up to 30x slower (0.3 us), and
    // libFuzzer stops at 10 s (CI runs it beside the ASan tests on 2 cores)
    const tm_dfa_opts opts = {.max_work = 1ull << 22};
    tm_rc rc = tm_dfa_compile_with(kind, spec, n, &opts, &d, &why, &err);
    check(rc == TM_OK || rc == TM_E_INVAL, "unexpected return code", &err);
    check((rc == TM_OK) == (d != NULL), "a DFA iff TM_OK", &err);
    check(rc == TM_OK || (why != TM_GUIDE_WHY_NONE && err.msg[0]), "error without reason", &err);
    if (rc)
        return 0;
    const uint32_t ns = tm_dfa_n_states(d);
    const tm_dfa_table_view t = tm_dfa_table(d);
    check(ns >= 2 && ns <= TM_GUIDE_MAX_STATES && tm_dfa_start(d) == 1, "states", &err);
    // byte classes: numbered in byte order from 0, every class used
    check(t.n_class >= 1 && t.n_class <= 256 && t.cls[0] == 0 && t.cls[255] == t.n_class - 1,
          "classes", &err);
    for (int b = 1; b < 256; b++)
        check(t.cls[b] == t.cls[b - 1] || t.cls[b] == t.cls[b - 1] + 1, "class order", &err);
    for (uint32_t q = 0; q < ns; q++) {
        int any = 0;
        for (uint32_t k = 0; k < t.n_class; k++) {
            check(t.next[(size_t)q * t.n_class + k] < ns, "transition out of range", &err);
            any |= t.next[(size_t)q * t.n_class + k] != 0;
        }
        check(q != 0 || !any, "the dead state leads somewhere", &err);
        check(tm_dfa_is_final(d, q) == (tm_dfa_accepts(d, q) && !any), "final", &err);
        check(q == 0 || any || tm_dfa_accepts(d, q), "a live state with no way to finish", &err);
    }
    uint32_t q = tm_dfa_start(d);
    for (size_t i = 0; i < n; i++)
        q = tm_dfa_walk(d, q, spec + i, 1);
    check(q == tm_dfa_walk(d, tm_dfa_start(d), spec, n), "walks disagree", &err);
    tm_dfa_destroy(d);
    return 0;
}

#include "fuzz_replay.h"
