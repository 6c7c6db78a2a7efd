/* tests/tm_test.h - the whole test harness: checks count failures and keep going; main() ends
 * with `return tm_test_report();` (0 pass, 1 fail). A test that cannot run here (no GPU, missing
 * test data) calls tm_test_skip(), which exits 77, ctest's "skipped". */
#ifndef TM_TESTS_TM_TEST_H
#define TM_TESTS_TM_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/err.h"

static int tm_test_failures;
static int tm_test_checks;

#define TM_CHECK(cond)                                                                             \
    do {                                                                                           \
        tm_test_checks++;                                                                          \
        if (!(cond)) {                                                                             \
            tm_test_failures++;                                                                    \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);               \
        }                                                                                          \
    } while (0)

#define TM_CHECK_MSG(cond, ...)                                                                    \
    do {                                                                                           \
        tm_test_checks++;                                                                          \
        if (!(cond)) {                                                                             \
            tm_test_failures++;                                                                    \
            fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond);               \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
    } while (0)

#define TM_CHECK_OK(expr, errp)                                                                    \
    do {                                                                                           \
        tm_test_checks++;                                                                          \
        tm_rc tm_check_rc_ = (expr);                                                               \
        if (tm_check_rc_ != TM_OK) {                                                               \
            tm_test_failures++;                                                                    \
            fprintf(stderr, "%s:%d: %s returned %s: %s\n", __FILE__, __LINE__, #expr,              \
                    tm_rc_name(tm_check_rc_), (errp)->msg);                                        \
        }                                                                                          \
    } while (0)

#define TM_CHECK_NEAR(a, b, tol)                                                                   \
    do {                                                                                           \
        tm_test_checks++;                                                                          \
        double tm_a_ = (double)(a), tm_b_ = (double)(b);                                           \
        if (!(fabs(tm_a_ - tm_b_) <= (tol))) {                                                     \
            tm_test_failures++;                                                                    \
            fprintf(stderr, "%s:%d: %s = %g, %s = %g, tolerance %g\n", __FILE__, __LINE__, #a,     \
                    tm_a_, #b, tm_b_, (double)(tol));                                              \
        }                                                                                          \
    } while (0)

#define TM_RUN(fn)                                                                                 \
    do {                                                                                           \
        int tm_before_ = tm_test_failures;                                                         \
        fn();                                                                                      \
        fprintf(stderr, "%s %s\n", tm_test_failures == tm_before_ ? "ok  " : "FAIL", #fn);         \
    } while (0)

static inline int tm_test_report(void) {
    fprintf(stderr, "%d checks, %d failed\n", tm_test_checks, tm_test_failures);
    return tm_test_failures ? 1 : 0;
}

static inline void tm_test_skip(const char *why) {
    fprintf(stderr, "skipped: %s\n", why);
    exit(77);
}

/* Skips the test (exit 77) when the build folder's tool `name` ($TM_BUILD/name, ./name without
 * TM_BUILD) cannot be opened. */
static inline void tm_test_need_build_tool(const char *name) {
    const char *build = getenv("TM_BUILD");
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", build ? build : ".", name);
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "skipped: no %s at %s\n", name, path);
        exit(77);
    }
    fclose(f);
}

/* The first of $TM_PYTHON, /usr/bin/python3, python3 that can import module (a static buffer),
 * or NULL if none can. */
static inline const char *tm_test_find_python(const char *module) {
    static char buf[512];
    const char *cands[] = {getenv("TM_PYTHON"), "/usr/bin/python3", "python3"};
    for (size_t i = 0; i < 3; i++) {
        if (!cands[i] || !*cands[i])
            continue;
        char cmd[700];
        snprintf(cmd, sizeof(cmd), "%s -c 'import %s' >/dev/null 2>&1", cands[i], module);
        if (system(cmd) == 0) {
            snprintf(buf, sizeof(buf), "%s", cands[i]);
            return buf;
        }
    }
    return NULL;
}

#endif /* TM_TESTS_TM_TEST_H */
