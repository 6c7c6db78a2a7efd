/* tests/unit/test_engram_rss.c - an Engram table much larger than its row cache is read by random
 * rows without the process's resident memory growing past the cache (runner/model/engram_table.c).
 * The test writes a 158 MB table (600,000 rows of 256 FP8 values + 8 ue8m0 scales: 19x the 8 MB
 * cache) in 1 MB chunks, resets the peak-RSS counter (/proc/self/clear_refs "5"; without it the
 * baseline is the peak so far), opens the table with cache_bytes = 8 MB, and reads 300,000 rows at
 * fixed pseudo-random positions in batches of 48 (one token's rows for 2 layers x 3 n-gram sizes x
 * 8 heads), prefetching the next batch before each get. Peak RSS (VmHWM) must stay within the
 * baseline + the cache the table reports + a slack of 6 MB (reader thread stacks, the output
 * buffer, allocator slack). A cache that grew with the rows read would take ~60 MB more. The rows
 * read are spot-checked against the bytes written. A few seconds on the dev box. */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runner/model/engram_table.h"
#include "runner/model/tensor.h"
#include "tm_test.h"

#define ROWS 600000ull
#define DIM 256u
#define CACHE_BYTES (8ull << 20)
#define SLACK_BYTES (6ull << 20)
#define N_READ 300000u
#define BATCH 48u

static const char *W = "layers.1.engram.embed.weight";
static const char *S = "layers.1.engram.embed.scale";

// The byte at position i of the weight (or of the scales): a cheap hash, so rows can be checked.
static uint8_t val_byte(uint64_t i) {
    uint64_t x = i * 0x9e3779b97f4a7c15ull;
    uint8_t b = (uint8_t)(x >> 56);
    return (b & 0x7f) == 0x7f ? 0x38 : b; // no NaN
}
static uint8_t scale_byte(uint64_t i) { return (uint8_t)(120 + (i * 2654435761u >> 7) % 14); }

static uint64_t kb_field(const char *name) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    uint64_t v = 0;
    size_t n = strlen(name);
    while (f && fgets(line, sizeof(line), f))
        if (!strncmp(line, name, n) && line[n] == ':')
            v = strtoull(line + n + 1, NULL, 10);
    if (f)
        fclose(f);
    return v * 1024;
}

static int write_table(const char *path) {
    char hdr[512];
    uint64_t wb = ROWS * DIM, sb = ROWS * (DIM / 32);
    int n = snprintf(hdr, sizeof(hdr),
                     "{\"%s\":{\"dtype\":\"F8_E8M0\",\"shape\":[%llu,%u],\"data_offsets\":[%llu,"
                     "%llu]},\"%s\":{\"dtype\":\"F8_E4M3\",\"shape\":[%llu,%u],\"data_offsets\":"
                     "[0,%llu]}}",
                     S, (unsigned long long)ROWS, DIM / 32, (unsigned long long)wb,
                     (unsigned long long)(wb + sb), W, (unsigned long long)ROWS, DIM,
                     (unsigned long long)wb);
    while (n % 8) // data section 8-byte aligned, as writers do
        hdr[n++] = ' ';
    hdr[n] = 0;
    FILE *f = fopen(path, "wb");
    if (!f)
        return 0;
    uint8_t len[8];
    for (int i = 0; i < 8; i++)
        len[i] = (uint8_t)((uint64_t)n >> (8 * i));
    int ok = fwrite(len, 1, 8, f) == 8 && fwrite(hdr, 1, (size_t)n, f) == (size_t)n;
    size_t chunk = 1u << 20;
    uint8_t *buf = malloc(chunk);
    for (uint64_t at = 0; ok && at < wb; at += chunk) {
        size_t m = wb - at < chunk ? (size_t)(wb - at) : chunk;
        for (size_t i = 0; i < m; i++)
            buf[i] = val_byte(at + i);
        ok = fwrite(buf, 1, m, f) == m;
    }
    for (uint64_t at = 0; ok && at < sb; at += chunk) {
        size_t m = sb - at < chunk ? (size_t)(sb - at) : chunk;
        for (size_t i = 0; i < m; i++)
            buf[i] = scale_byte(at + i);
        ok = fwrite(buf, 1, m, f) == m;
    }
    free(buf);
    return fclose(f) == 0 && ok;
}

int main(void) {
    char dir[64], path[128];
    snprintf(dir, sizeof(dir), "/tmp/tm_engram_rss_XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    snprintf(path, sizeof(path), "%s/engram.safetensors", dir);
    TM_CHECK(write_table(path));
    struct stat st;
    TM_CHECK(stat(path, &st) == 0 && (uint64_t)st.st_size >= 10 * CACHE_BYTES);

    // Reset the peak to the current RSS where the kernel allows it (Linux >= 4.0).
    int fd = open("/proc/self/clear_refs", O_WRONLY);
    int reset = fd >= 0 && write(fd, "5", 1) == 1;
    if (fd >= 0)
        close(fd);
    uint64_t base = reset ? kb_field("VmRSS") : kb_field("VmHWM");

    tm_err err = {0};
    tm_engram_table *t = NULL;
    tm_engram_table_cfg cfg = {path, W, S, 0, 1, CACHE_BYTES, 0};
    TM_CHECK_OK(tm_engram_table_open(&cfg, &t, &err), &err);
    if (!t)
        return tm_test_report();
    const tm_engram_table_info *info = tm_engram_table_info_get(t);
    TM_CHECK(info->cache_bytes <= CACHE_BYTES && info->n_slots < ROWS / 10);
    uint64_t rows[2][BATCH];
    float *out = malloc(BATCH * DIM * sizeof(float));
    uint64_t rng = 88172645463325252ull;
    int bad = 0, cur = 0;
    for (uint32_t b = 0; b <= N_READ / BATCH; b++) {
        int nxt = cur ^ 1; // draw the next batch, prefetch it, then get the current one
        for (uint32_t i = 0; i < BATCH; i++) {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rows[nxt][i] = rng % ROWS;
        }
        tm_engram_table_prefetch(t, rows[nxt], BATCH);
        if (b > 0) {
            TM_CHECK_OK(tm_engram_table_get(t, rows[cur], BATCH, out, &err), &err);
            // spot-check one row per batch against the bytes written
            uint64_t r = rows[cur][b % BATCH];
            for (uint32_t c = 0; c < DIM; c++) {
                float v = tm_e4m3_to_f32(val_byte(r * DIM + c)) *
                          tm_e8m0_to_f32(scale_byte(r * (DIM / 32) + c / 32));
                bad += tm_bf16_to_f32(tm_f32_to_bf16(v)) != out[(b % BATCH) * DIM + c];
            }
        }
        cur = nxt;
    }
    TM_CHECK(bad == 0);
    tm_engram_table_stats s;
    tm_engram_table_stats_get(t, &s);
    uint64_t peak = kb_field("VmHWM");
    fprintf(stderr,
            "engram rss: table %lld bytes, cache %llu bytes (%u rows), %llu rows read (%llu "
            "reads, %llu hits, %llu waits, %llu misses, %llu evictions); RSS baseline %llu, peak "
            "%llu (+%llu, bound +%llu)%s\n",
            (long long)st.st_size, (unsigned long long)info->cache_bytes, info->n_slots,
            (unsigned long long)s.rows_get, (unsigned long long)s.reads, (unsigned long long)s.hits,
            (unsigned long long)s.waits, (unsigned long long)s.misses,
            (unsigned long long)s.evictions, (unsigned long long)base, (unsigned long long)peak,
            (unsigned long long)(peak > base ? peak - base : 0),
            (unsigned long long)(info->cache_bytes + SLACK_BYTES),
            reset ? "" : " (peak not resettable: baseline is the earlier peak)");
    TM_CHECK(s.evictions > 0 && s.reads > 10 * info->n_slots);
    TM_CHECK(peak <= base + info->cache_bytes + SLACK_BYTES);
    free(out);
    tm_engram_table_close(t);
    unlink(path);
    rmdir(dir);
    return tm_test_report();
}
