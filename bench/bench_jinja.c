/* bench/bench_jinja.c - the hostile-template cost (issue 35): builds a flat chat template of
 * n_blocks `{% if messages %}{{ messages[0].content }}{% endif %}` blocks (53 bytes each; 20,000
 * make about 1 MiB) and a template of `depth` nested `{% if true %}` blocks, then times
 * tm_jinja_parse and tm_jinja_render of a one-message chat record (what a job does: parse once,
 * render per record), and the parse (or refusal) of the nested one. Prints one line per figure,
 * the median of `reps` runs. Uses only runner/text/jinja.h, so bench/jinja_hostile.sh can build it
 * against an older jinja.c for the comparison.
 *
 *   bench_jinja [n_blocks=20000] [depth=100000] [reps=5] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runner/text/jinja.h"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof(*v), cmp_d);
    return v[n / 2];
}

int main(int argc, char **argv) {
    size_t n_blk = argc > 1 ? strtoull(argv[1], NULL, 10) : 20000;
    size_t depth = argc > 2 ? strtoull(argv[2], NULL, 10) : 100000;
    int reps = argc > 3 ? atoi(argv[3]) : 5;
    if (reps < 1 || reps > 100)
        reps = 5;
    static const char blk[] = "{% if messages %}{{ messages[0].content }}{% endif %}\n";
    size_t nb = sizeof(blk) - 1, n = n_blk * nb;
    char *src = malloc(n + 1);
    if (!src)
        return 1;
    for (size_t i = 0; i < n_blk; i++)
        memcpy(src + i * nb, blk, nb);
    src[n] = '\0';
    double t_parse[100], t_render[100];
    tm_message m[1] = {{"user", "hi"}};
    tm_jinja_vars v = {.msgs = m, .n_msgs = 1, .bos_token = "", .eos_token = ""};
    size_t out_len = 0;
    for (int r = 0; r < reps; r++) {
        tm_err err = {0};
        tm_jinja *t = NULL;
        double t0 = now_ms();
        if (tm_jinja_parse(src, n, &t, &err)) {
            fprintf(stderr, "parse: %s\n", err.msg);
            return 1;
        }
        double t1 = now_ms();
        tm_buf out = {0};
        if (tm_jinja_render(t, &v, &out, &err)) {
            fprintf(stderr, "render: %s\n", err.msg);
            return 1;
        }
        double t2 = now_ms();
        out_len = out.len;
        tm_buf_fini(&out);
        tm_jinja_destroy(t);
        t_parse[r] = t1 - t0, t_render[r] = t2 - t1;
    }
    printf("flat  %zu blocks, %zu bytes: parse %.2f ms, render %.2f ms (%zu bytes out), "
           "parse+render %.2f ms\n",
           n_blk, n, median(t_parse, reps), median(t_render, reps), out_len,
           median(t_parse, reps) + median(t_render, reps));
    free(src);

    static const char op[] = "{% if true %}\n", cl[] = "{% endif %}\n";
    size_t no = sizeof(op) - 1, nc = sizeof(cl) - 1;
    n = depth * (no + nc);
    src = malloc(n + 1);
    if (!src)
        return 1;
    for (size_t i = 0; i < depth; i++) {
        memcpy(src + i * no, op, no);
        memcpy(src + depth * no + i * nc, cl, nc);
    }
    src[n] = '\0';
    char msg[600] = "";
    for (int r = 0; r < reps; r++) {
        tm_err err = {0};
        tm_jinja *t = NULL;
        double t0 = now_ms();
        tm_rc rc = tm_jinja_parse(src, n, &t, &err);
        t_parse[r] = now_ms() - t0;
        snprintf(msg, sizeof(msg), "%s", rc ? err.msg : "parsed");
        tm_jinja_destroy(t);
    }
    printf("nested %zu blocks, %zu bytes: parse %.2f ms (%s)\n", depth, n, median(t_parse, reps),
           msg);
    free(src);
    return 0;
}
