/* bench/bench_engram.c - Engram table rows read from disk (runner/model/engram_table.h): rows/s
 * and microseconds per token for random rows, with the file's pages dropped from the page cache
 * (posix_fadvise DONTNEED after an fsync: the reads then come from the disk), with the file in the
 * page cache but the row cache empty, and with every row already in the row cache.
 *
 *   bench_engram FILE [rows] [tokens] [cache_mb] [io_threads]
 *
 * FILE is written first when it does not exist (rows x 256 FP8 values + rows x 8 ue8m0 scales in
 * one safetensors file, default 4,000,000 rows = 1.06 GB). A token reads 48 rows (2 Engram layers
 * x (max_ngram 4 - 1) x 8 heads, each a separate lookup as the reference's hash_ids columns), at
 * fixed pseudo-random positions. Each phase runs `tokens` tokens (default 2000) two ways: "get"
 * (the token's rows are asked for when the layer needs them; misses are read in parallel by the
 * reader threads and the caller) and "prefetch+get" (the next token's rows are prefetched before
 * the current token's get, as the engine issues reads ahead of the layers); the last two phases
 * take 16 tokens per step (a decode step of 16 sequences: 768 rows per prefetch and get). Prints
 * one line per phase and way. */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/clock.h"
#include "runner/model/engram_table.h"

#define DIM 256u
#define ROWS_PER_TOKEN 48u

static const char *W = "layers.1.engram.embed.weight";
static const char *S = "layers.1.engram.embed.scale";

static int write_table(const char *path, uint64_t rows) {
    char hdr[512];
    uint64_t wb = rows * DIM, sb = rows * (DIM / 32);
    int n = snprintf(hdr, sizeof(hdr),
                     "{\"%s\":{\"dtype\":\"F8_E4M3\",\"shape\":[%llu,%u],\"data_offsets\":[0,"
                     "%llu]},\"%s\":{\"dtype\":\"F8_E8M0\",\"shape\":[%llu,%u],\"data_offsets\":"
                     "[%llu,%llu]}}",
                     W, (unsigned long long)rows, DIM, (unsigned long long)wb, S,
                     (unsigned long long)rows, DIM / 32, (unsigned long long)wb,
                     (unsigned long long)(wb + sb));
    while (n % 8)
        hdr[n++] = ' ';
    FILE *f = fopen(path, "wb");
    if (!f)
        return 0;
    uint8_t len[8];
    for (int i = 0; i < 8; i++)
        len[i] = (uint8_t)((uint64_t)n >> (8 * i));
    int ok = fwrite(len, 1, 8, f) == 8 && fwrite(hdr, 1, (size_t)n, f) == (size_t)n;
    size_t chunk = 4u << 20;
    uint8_t *buf = malloc(chunk);
    uint64_t x = 1;
    for (uint64_t at = 0; ok && at < wb + sb; at += chunk) {
        size_t m = wb + sb - at < chunk ? (size_t)(wb + sb - at) : chunk;
        for (size_t i = 0; i < m; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            uint8_t b = (uint8_t)(x >> 56);
            buf[i] = at + i < wb ? ((b & 0x7f) == 0x7f ? 0 : b) : (uint8_t)(120 + b % 12);
        }
        ok = fwrite(buf, 1, m, f) == m;
    }
    free(buf);
    return fclose(f) == 0 && ok;
}

static void drop_pages(const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return;
    fdatasync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
}

static uint64_t *make_rows(uint64_t rows, uint32_t tokens, uint64_t seed, uint64_t span) {
    uint64_t *r = malloc((size_t)tokens * ROWS_PER_TOKEN * sizeof(*r));
    uint64_t x = seed;
    for (size_t i = 0; i < (size_t)tokens * ROWS_PER_TOKEN; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        r[i] = (x % span) % rows;
    }
    return r;
}

/* Run the tokens on a freshly opened table; print rows/s and us/token. */
static int run(const char *phase, const char *path, const uint64_t *rows, uint32_t tokens,
               uint64_t cache_mb, uint32_t io_threads, int prefetch, int warm_first,
               uint32_t step_tok) {
    tm_err err = {0};
    tm_engram_table *t = NULL;
    tm_engram_table_cfg cfg = {path, W, S, 0, 1, cache_mb << 20, io_threads};
    if (tm_engram_table_open(&cfg, &t, &err)) {
        fprintf(stderr, "bench_engram: %s\n", err.msg);
        return 1;
    }
    float *out = malloc((size_t)step_tok * ROWS_PER_TOKEN * DIM * sizeof(float));
    if (warm_first) // fill the row cache with these rows first (row-cache-hit phase)
        for (uint32_t k = 0; k < tokens; k++)
            tm_engram_table_get(t, rows + (size_t)k * ROWS_PER_TOKEN, ROWS_PER_TOKEN, out, &err);
    tm_engram_table_stats s0, s1;
    tm_engram_table_stats_get(t, &s0);
    uint64_t t0 = tm_now_ns();
    size_t step_rows = (size_t)step_tok * ROWS_PER_TOKEN;
    for (uint32_t k = 0; k + step_tok <= tokens; k += step_tok) {
        if (prefetch && k + 2 * step_tok <= tokens)
            tm_engram_table_prefetch(t, rows + (size_t)(k + step_tok) * ROWS_PER_TOKEN, step_rows);
        if (tm_engram_table_get(t, rows + (size_t)k * ROWS_PER_TOKEN, step_rows, out, &err)) {
            fprintf(stderr, "bench_engram: %s\n", err.msg);
            return 1;
        }
    }
    double s = (double)(tm_now_ns() - t0) * 1e-9;
    tm_engram_table_stats_get(t, &s1);
    uint64_t n = (uint64_t)tokens * ROWS_PER_TOKEN;
    printf("%-24s %-13s %2u tok/step threads %u cache %4llu MB: %8.0f rows/s  %8.1f us/token  "
           "(%llu rows, %llu reads, %llu hits, %llu waits, %llu misses)\n",
           phase, prefetch ? "prefetch+get" : "get", step_tok, io_threads,
           (unsigned long long)cache_mb, (double)n / s, s * 1e6 / tokens, (unsigned long long)n,
           (unsigned long long)(s1.reads - s0.reads), (unsigned long long)(s1.hits - s0.hits),
           (unsigned long long)(s1.waits - s0.waits), (unsigned long long)(s1.misses - s0.misses));
    fflush(stdout);
    free(out);
    tm_engram_table_close(t);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: bench_engram FILE [rows] [tokens] [cache_mb] [io_threads]\n");
        return 2;
    }
    const char *path = argv[1];
    uint64_t rows = argc > 2 ? strtoull(argv[2], NULL, 10) : 4000000ull;
    uint32_t tokens = argc > 3 ? (uint32_t)strtoul(argv[3], NULL, 10) : 2000u;
    uint64_t cache_mb = argc > 4 ? strtoull(argv[4], NULL, 10) : 64;
    uint32_t io_threads = argc > 5 ? (uint32_t)strtoul(argv[5], NULL, 10) : 4;
    struct stat st;
    if (stat(path, &st) != 0) {
        double t0 = tm_now_ms();
        if (!write_table(path, rows)) {
            fprintf(stderr, "bench_engram: cannot write %s\n", path);
            return 1;
        }
        printf("wrote %s: %llu rows x %u in %.1f s\n", path, (unsigned long long)rows, DIM,
               (tm_now_ms() - t0) / 1e3);
    }
    int rc = 0;
    for (int pf = 0; pf < 2 && !rc; pf++) {
        uint64_t *r = make_rows(rows, tokens, 0x1234567ull + (uint64_t)pf * 7919, rows);
        drop_pages(path);
        rc |= run("disk (pages dropped)", path, r, tokens, cache_mb, io_threads, pf, 0, 1);
        rc |= run("page cache, rows cold", path, r, tokens, cache_mb, io_threads, pf, 0, 1);
        free(r);
    }
    // Row-cache hits: a working set that fits the cache (rows drawn from the first 100k).
    uint64_t *hot = make_rows(rows, tokens, 0x777ull, 100000);
    rc |= run("row cache, all hits", path, hot, tokens, cache_mb, io_threads, 0, 1, 1);
    free(hot);
    if (io_threads != 1) {
        uint64_t *r = make_rows(rows, tokens, 0x4242ull, rows);
        drop_pages(path);
        rc |= run("disk (pages dropped)", path, r, tokens, cache_mb, 1, 1, 0, 1);
        free(r);
    }
    // A decode step of 16 sequences: their 768 rows prefetched together (queue depth), 4 threads.
    uint64_t *r16 = make_rows(rows, tokens, 0x5151ull, rows);
    drop_pages(path);
    rc |= run("disk (pages dropped)", path, r16, tokens, cache_mb, io_threads, 1, 0, 16);
    rc |= run("page cache, rows cold", path, r16, tokens, cache_mb, io_threads, 1, 0, 16);
    free(r16);
    return rc;
}
