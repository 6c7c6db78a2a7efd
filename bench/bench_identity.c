/* bench/bench_identity.c - the cost of an input's resume identity (issue 35): times
 * tm_manifest_identify on one input file (a stat, then the content sample: at most 8 MiB read,
 * sink/manifest.h), and, for comparison, reading and hashing the whole file (what a fingerprint
 * of the full input or of a long committed prefix would cost). Median of `reps` runs of the
 * sample; one run of the full hash.
 *
 *   bench_identity MODEL_DIR INPUT [reps=5] */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/hash.h"
#include "sink/manifest.h"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: bench_identity MODEL_DIR INPUT [reps]\n");
        return 2;
    }
    int reps = argc > 3 ? atoi(argv[3]) : 5;
    if (reps < 1 || reps > 100)
        reps = 5;
    double t[100];
    char *inputs[] = {argv[2]};
    tm_manifest m = {0};
    for (int r = 0; r < reps; r++) {
        tm_manifest_fini(&m);
        tm_err err = {0};
        double t0 = now_ms();
        if (tm_manifest_identify(&m, "{}", "job.json", argv[1], inputs, 1, &err)) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        t[r] = now_ms() - t0;
    }
    qsort(t, (size_t)reps, sizeof(*t), cmp_d);
    printf("identity (stat + sample): median %.2f ms, min %.2f, max %.2f; input %lld bytes, "
           "sample %s\n",
           t[reps / 2], t[0], t[reps - 1], (long long)m.inputs[0].size, m.inputs[0].sample);
    tm_manifest_fini(&m);
    int fd = open(argv[2], O_RDONLY);
    if (fd < 0)
        return 1;
    enum { CH = 1 << 20 };
    char *buf = tm_malloc(CH);
    tm_hash_stream xs;
    tm_hash_stream_init(&xs);
    double t0 = now_ms();
    ssize_t n;
    long long total = 0;
    while ((n = read(fd, buf, CH)) > 0) {
        tm_hash_stream_update(&xs, buf, (size_t)n);
        total += n;
    }
    double dt = now_ms() - t0;
    printf("whole file read + xxh3: %.0f ms for %lld bytes (%.2f GB/s), %016llx\n", dt, total,
           total / dt / 1e6, (unsigned long long)tm_hash_stream_digest64(&xs));
    tm_free(buf);
    close(fd);
    return 0;
}
