/* tests/gpu/test_dsv41_engram_stage.c - Engram rows staged from the host's tables to the GPU
 * (runner/engine/cuda/dsv41_engram.h) on an mkmodel DeepSeek-V4.1 checkpoint (Engram layers 0 and
 * 2, tables of 420 and 508 rows of 32): two steps of row ids per slot (repeats, rows past the
 * table, a different count in the second step so the pinned buffers are reused), prefetch, upload,
 * wait on another stream, and the device rows read back must be the bits tm_engram_table_get
 * gives on the host (zeros past the table). Refusals: a slot or a row count out of range, named.
 * Skipped (77) without a GPU, in a build without CUDA, or without TM_BUILD's mkmodel. Never run
 * yet: no GPU was lent when it was written (docs/deepseek_v41.md "CUDA"). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tm_test.h"

#ifndef TM_HAVE_CUDA
int main(void) { tm_test_skip("built without CUDA"); }
#else

#include <cuda_runtime_api.h>

#include "runner/engine/cuda/dsv41_engram.h"
#include "tm_gpu_test.h"

#define MAXR 64

static void test_stage(const char *dir) {
    tm_err err = {0};
    tm_engram_table *tab[2] = {NULL, NULL};
    const char *names[2][2] = {{"layers.0.engram.embed.weight", "layers.0.engram.embed.scale"},
                               {"layers.2.engram.embed.weight", "layers.2.engram.embed.scale"}};
    for (int i = 0; i < 2; i++) {
        tm_engram_table_cfg cfg = {dir, names[i][0], names[i][1], 0, 1, 1 << 20, 2};
        TM_CHECK_OK(tm_engram_table_open(&cfg, &tab[i], &err), &err);
        if (!tab[i])
            goto out;
    }
    tm_dsv41_engram_stage *st = NULL;
    TM_CHECK_OK(tm_dsv41_engram_stage_create(tab, 2, MAXR, &st, &err), &err);
    if (!st)
        goto out;
    const uint32_t dim = tm_dsv41_engram_stage_dim(st);
    TM_CHECK(dim == tm_engram_table_info_get(tab[0])->dim);
    float *want = xmalloc((size_t)MAXR * dim * 4), *got = xmalloc((size_t)MAXR * dim * 4);
    uint64_t rows[2][MAXR];
    for (int step = 0; step < 2; step++) {
        const size_t n = step == 0 ? MAXR : 17;
        for (int sl = 0; sl < 2; sl++) {
            const uint64_t nr = tm_engram_table_info_get(tab[sl])->rows;
            for (size_t i = 0; i < n; i++) // repeats, and 1 in 8 past the table (zeros)
                rows[sl][i] = i % 8 == 7 ? nr + i : (i * 37 + step * 11 + sl) % (nr / 2);
            tm_dsv41_engram_stage_prefetch(st, (uint32_t)sl, rows[sl], n);
        }
        for (int sl = 0; sl < 2; sl++)
            TM_CHECK_OK(tm_dsv41_engram_stage_upload(st, (uint32_t)sl, rows[sl], n, &err), &err);
        for (int sl = 0; sl < 2; sl++) {
            const float *dev = NULL;
            TM_CHECK_OK(tm_dsv41_engram_stage_wait(st, (uint32_t)sl, g_stream, &dev, &err), &err);
            TM_ASSERT(dev);
            TM_ASSERT(cudaMemcpyAsync(got, dev, n * dim * 4, cudaMemcpyDeviceToHost, g_stream) ==
                      cudaSuccess);
            TM_ASSERT(cudaStreamSynchronize(g_stream) == cudaSuccess);
            TM_CHECK_OK(tm_engram_table_get(tab[sl], rows[sl], n, want, &err), &err);
            TM_CHECK_MSG(memcmp(got, want, n * dim * 4) == 0, "step %d slot %d: device rows differ",
                         step, sl);
            int zeros = 1;
            for (uint32_t d = 0; d < dim; d++)
                zeros &= got[7 * dim + d] == 0.0f;
            TM_CHECK_MSG(zeros, "step %d slot %d: a row past the table is not zeros", step, sl);
        }
    }
    TM_CHECK(tm_dsv41_engram_stage_upload(st, 2, rows[0], 1, &err) == TM_E_INVAL);
    TM_CHECK(strstr(err.msg, "slot 2 of 2") != NULL);
    TM_CHECK(tm_dsv41_engram_stage_upload(st, 0, rows[0], MAXR + 1, &err) == TM_E_INVAL);
    TM_CHECK(tm_dsv41_engram_stage_create(tab, 0, MAXR, &(tm_dsv41_engram_stage *){NULL}, &err) ==
             TM_E_INVAL);
    free(want);
    free(got);
    tm_dsv41_engram_stage_destroy(st);
out:
    tm_engram_table_close(tab[0]);
    tm_engram_table_close(tab[1]);
}

int main(void) {
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0)
        tm_test_skip("no CUDA device");
    const char *b = getenv("TM_BUILD");
    char cmd[1024], dir[256];
    snprintf(dir, sizeof(dir), "/tmp/tm_test_dsv41_stage_%d", (int)getpid());
    snprintf(cmd, sizeof(cmd), "%s/mkmodel", b ? b : ".");
    if (access(cmd, X_OK) != 0)
        tm_test_skip("no mkmodel (set TM_BUILD)");
    snprintf(cmd, sizeof(cmd),
             "rm -rf '%s' && '%s/mkmodel' --arch deepseek_v41 --out '%s' >/dev/null", dir,
             b ? b : ".", dir);
    TM_ASSERT(system(cmd) == 0);
    TM_ASSERT(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking) == cudaSuccess);
    test_stage(dir);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    TM_CHECK(system(cmd) == 0);
    cudaStreamDestroy(g_stream);
    return tm_test_report();
}

#endif /* TM_HAVE_CUDA */
