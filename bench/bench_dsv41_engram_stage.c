/* bench/bench_dsv41_engram_stage.c - Engram rows from the host's table to the GPU through the
 * CUDA engine's staging (runner/engine/cuda/dsv41_engram.h): per decode step of `tokens` tokens
 * x 48 rows (2 Engram layers x (max_ngram 4 - 1) x 8 heads, as bench/bench_engram.c) of 256
 * values, the host time of prefetch + upload (engram_table_get into pinned memory, then the
 * queued copy), the time from the step's start until the rows are on the GPU (CUDA events on a
 * compute stream that waits for the copies), and the rate; warm (rows in the row cache: the same
 * steps twice) and cold (new rows every step).
 *
 *   bench_dsv41_engram_stage FILE [tokens] [steps] [cache_mb]
 *
 * FILE: a table file as bench_engram writes it (run bench_engram FILE first; tensor
 * layers.1.engram.embed.*). Both "layers" of a step read the same table (the bench measures the
 * path, not the hashing). Needs a GPU; never run yet (docs/deepseek_v41.md "CUDA"). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>

#include "base/clock.h"
#include "runner/engine/cuda/dsv41_engram.h"

#define ROWS_PER_TOKEN 48u

static uint64_t g_rng = 0x40404040ull;
static uint64_t rnd(void) {
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return g_rng >> 11;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE [tokens 16] [steps 200] [cache_mb 256]\n", argv[0]);
        return 2;
    }
    const uint32_t tokens = argc > 2 ? (uint32_t)atoi(argv[2]) : 16;
    const uint32_t steps = argc > 3 ? (uint32_t)atoi(argv[3]) : 200;
    const uint64_t cache_mb = argc > 4 ? (uint64_t)atoll(argv[4]) : 256;
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        fprintf(stderr, "no CUDA device\n");
        return 77;
    }
    tm_err err = {0};
    tm_engram_table *tab = NULL;
    tm_engram_table_cfg cfg = {argv[1],
                               "layers.1.engram.embed.weight",
                               "layers.1.engram.embed.scale",
                               0,
                               1,
                               cache_mb << 20,
                               0};
    if (tm_engram_table_open(&cfg, &tab, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    const uint64_t n_rows = tm_engram_table_info_get(tab)->rows;
    const size_t per_slot = (size_t)tokens * ROWS_PER_TOKEN / 2; /* 2 "layers" */
    tm_engram_table *tabs[2] = {tab, tab};
    tm_dsv41_engram_stage *st = NULL;
    if (tm_dsv41_engram_stage_create(tabs, 2, per_slot, &st, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    const uint32_t dim = tm_dsv41_engram_stage_dim(st);
    uint64_t *rows = malloc((size_t)steps * 2 * per_slot * sizeof(uint64_t));
    cudaStream_t comp;
    cudaEvent_t e0, e1;
    if (!rows || cudaStreamCreateWithFlags(&comp, cudaStreamNonBlocking) != cudaSuccess ||
        cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess)
        return 1;
    for (size_t i = 0; i < (size_t)steps * 2 * per_slot; i++)
        rows[i] = rnd() % n_rows;
    printf("table %s: %llu rows of %u; %u tokens x %u rows a step (%.2f MB fp32 to the GPU), "
           "%u steps\n",
           argv[1], (unsigned long long)n_rows, dim, tokens, ROWS_PER_TOKEN,
           2.0 * per_slot * dim * 4 / 1e6, steps);
    for (int pass = 0; pass < 2; pass++) { // cold (first touch of the rows), then warm
        double host_ms = 0.0;
        float copy_ms = 0.0f;
        const double t0 = tm_now_ms();
        for (uint32_t s = 0; s < steps; s++) {
            const uint64_t *r = rows + (size_t)s * 2 * per_slot;
            const double h0 = tm_now_ms();
            tm_dsv41_engram_stage_prefetch(st, 0, r, per_slot);
            tm_dsv41_engram_stage_prefetch(st, 1, r + per_slot, per_slot);
            cudaEventRecord(e0, comp);
            for (uint32_t sl = 0; sl < 2; sl++)
                if (tm_dsv41_engram_stage_upload(st, sl, r + sl * per_slot, per_slot, &err)) {
                    fprintf(stderr, "%s\n", err.msg);
                    return 1;
                }
            host_ms += tm_now_ms() - h0;
            for (uint32_t sl = 0; sl < 2; sl++)
                tm_dsv41_engram_stage_wait(st, sl, comp, NULL, &err);
            cudaEventRecord(e1, comp);
            cudaEventSynchronize(e1);
            float ms = 0.0f;
            cudaEventElapsedTime(&ms, e0, e1);
            copy_ms += ms;
        }
        const double wall = tm_now_ms() - t0;
        const double bytes = (double)steps * 2 * per_slot * dim * 4;
        printf("%s: %.3f ms/step wall, host (prefetch + get + queue) %.3f ms/step, step start to "
               "rows on the GPU %.3f ms/step, %.2f GB/s effective, %.0f rows/s\n",
               pass == 0 ? "cold" : "warm", wall / steps, host_ms / steps, copy_ms / steps,
               bytes / (wall * 1e6), (double)steps * 2 * per_slot / (wall * 1e-3));
    }
    tm_dsv41_engram_stage_destroy(st);
    tm_engram_table_close(tab);
    free(rows);
    return 0;
}
