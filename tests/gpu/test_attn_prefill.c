/* tests/gpu/test_attn_prefill.c - the tensor-core prefill attention (kernels/attn_prefill.h)
 * against its host reference tm_cpu_attn (runner/engine/cpu/ops.h), and its tile builder. Shapes:
 * one sequence of 1..300 rows, chunks starting at nonzero positions, several sequences per launch
 * with unused stacked rows between them, row counts that are not multiples of 16 or 64, block
 * sizes 1, 7, 16, 128, GQA 32/8, 8/8, 4/1, head_dim 64 and 128, sliding window 50, and two big
 * prefill shapes (2 and 8 sequences x 2048 tokens, 32/8 heads, head_dim 128) that are also timed
 * with cudaEvents (printed only; the big shapes check a few heads, not all).
 *
 * Poison: the output starts as bf16 NaN (0xffff), so a row or column the kernel fails to write
 * shows up, and rows or columns it must not write are checked to be still 0xffff. Cache slots
 * past a sequence's length and unused blocks hold bf16 NaN, so a key the kernel must not see
 * turns its outputs into NaN.
 *
 * Tolerance: |gpu - ref| <= 2^-8 * |ref| + 2^-8 * max|V|. The output rounding to bf16 is half an
 * ulp (2^-9 |ref|); the probabilities are rounded to bf16 for the P.V product, which moves each
 * output by at most 2^-9 * max|V|; fp32 summation order and exp2f take a little more.
 *
 * Usage: test_attn_prefill [timing_reps] (default 20; 0 skips the timing and the 8 x 2048 case,
 * for compute-sanitizer). Skipped (77) without a GPU or in a build without CUDA. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tm_test.h"

#ifndef TM_HAVE_CUDA
int main(void) { tm_test_skip("built without CUDA"); }
#else

#include <cuda_runtime_api.h>

#include "kernels/attn_prefill.h"
#include "runner/engine/cpu/ops.h"
#include "tm_gpu_test.h"

#define BF16_NAN 0xffff

static int g_reps = 20;

/* One sequence of a case: `gap` unused stacked rows, then a chunk of n_tok tokens at positions
 * [pos0, pos0 + n_tok). */
typedef struct pf_seq {
    uint32_t gap, pos0, n_tok;
} pf_seq;

typedef struct pf_shape {
    uint32_t n_head, n_kv_head, hd, bs, window;
    uint32_t n_check_head; /* heads compared with the reference, spread evenly; 0 = all */
    int timed;             /* time the kernel with cudaEvents and print ms, TFLOP/s */
} pf_shape;

static void pf_case(const char *name, const pf_seq *seqs, uint32_t n_seq, pf_shape sh) {
    tm_err err = {0};
    const uint32_t hd = sh.hd, bs = sh.bs, n_head = sh.n_head;
    const uint32_t qd = n_head * hd, kvd = sh.n_kv_head * hd, ld_q = qd + 8;
    uint32_t T = 0, n_bt = 0;
    tm_k_attn_prefill_chunk *chunks = xmalloc(n_seq * sizeof(*chunks));
    uint32_t *seq_bt = xmalloc(n_seq * 4);
    for (uint32_t i = 0; i < n_seq; i++) {
        T += seqs[i].gap;
        chunks[i] =
            (tm_k_attn_prefill_chunk){.t0 = T, .n_tok = seqs[i].n_tok, .pos0 = seqs[i].pos0};
        T += seqs[i].n_tok;
        seq_bt[i] = n_bt;
        n_bt += TM_CEIL_DIV(seqs[i].pos0 + seqs[i].n_tok, bs);
    }
    T += 3;                            // trailing rows nobody owns
    const uint32_t n_block = n_bt + 3; // a few blocks nobody uses
    // shuffled block ids, handed out in order
    uint32_t *perm = shuffled(n_block);
    const uint32_t *bt = perm; // the first n_bt entries
    // every slot starts as NaN; the sequences' live positions get values
    const size_t cache_n = (size_t)n_block * bs * kvd;
    uint16_t *kc = xmalloc(cache_n * 2), *vc = xmalloc(cache_n * 2);
    float *kf = xmalloc(cache_n * 4), *vf = xmalloc(cache_n * 4);
    for (size_t i = 0; i < cache_n; i++)
        kc[i] = vc[i] = BF16_NAN;
    for (uint32_t i = 0; i < n_seq; i++)
        for (uint32_t p = 0; p < seqs[i].pos0 + seqs[i].n_tok; p++) {
            const size_t row = (size_t)bt[seq_bt[i] + p / bs] * bs + p % bs;
            for (uint32_t c = 0; c < kvd; c++) {
                kc[row * kvd + c] = to_bf(2.0f * frand());
                vc[row * kvd + c] = to_bf(frand());
            }
        }
    float vmax = 0.0f;
    for (size_t i = 0; i < cache_n; i++) {
        kf[i] = bf(kc[i]);
        vf[i] = bf(vc[i]);
        if (vc[i] != BF16_NAN)
            vmax = fmaxf(vmax, fabsf(vf[i]));
    }
    uint16_t *q;
    float *qf;
    rand_bf16((size_t)T * ld_q, 2.0f, &q, &qf);

    const uint32_t n_tile = tm_k_attn_prefill_n_tiles(chunks, n_seq);
    tm_k_attn_prefill_tile *tiles = xmalloc(n_tile * sizeof(*tiles));
    TM_CHECK(tm_k_attn_prefill_tiles(chunks, n_seq, tiles) == n_tile);

    uint16_t *d_kc = dup_to_dev(kc, cache_n * 2), *d_vc = dup_to_dev(vc, cache_n * 2);
    uint16_t *d_q = dup_to_dev(q, (size_t)T * ld_q * 2);
    uint16_t *d_out = dalloc((size_t)T * ld_q * 2, 0xff);
    uint32_t *d_sbt = dup_to_dev(seq_bt, n_seq * 4), *d_bt = dup_to_dev(bt, n_bt * 4);
    tm_k_attn_prefill_tile *d_tiles = dup_to_dev(tiles, n_tile * sizeof(*tiles));
    tm_k_attn_prefill_bf16_args a = {.out = d_out,
                                     .q = d_q,
                                     .k_cache = d_kc,
                                     .v_cache = d_vc,
                                     .seq_bt = d_sbt,
                                     .block_tables = d_bt,
                                     .tiles = d_tiles,
                                     .n_tile = n_tile,
                                     .n_head = n_head,
                                     .n_kv_head = sh.n_kv_head,
                                     .head_dim = hd,
                                     .block_size = bs,
                                     .ld_q = ld_q,
                                     .window = sh.window,
                                     .scale = 1.0f / sqrtf((float)hd)};
    TM_CHECK_OK(tm_k_attn_prefill_bf16(&a, g_stream, &err), &err);
    uint16_t *out = xmalloc((size_t)T * ld_q * 2);
    to_host(out, d_out, (size_t)T * ld_q * 2);

    // reference, on the checked heads
    const uint32_t n_chk = sh.n_check_head && sh.n_check_head < n_head ? sh.n_check_head : n_head;
    uint32_t max_pos = 1;
    for (uint32_t i = 0; i < n_seq; i++)
        max_pos = seqs[i].pos0 + seqs[i].n_tok > max_pos ? seqs[i].pos0 + seqs[i].n_tok : max_pos;
    float *ref = xmalloc((size_t)T * ld_q * 4), *scores = xmalloc((size_t)max_pos * 4);
    const float tol_abs = 0x1p-8f * vmax;
    double max_err = 0.0, max_ratio = 0.0;
    int bad = 0;
    for (uint32_t i = 0; i < n_seq; i++) {
        if (!seqs[i].n_tok)
            continue;
        const size_t t0 = chunks[i].t0;
        tm_k_attn_args ra = {.out = ref + t0 * ld_q,
                             .q = qf + t0 * ld_q,
                             .k_cache = kf,
                             .v_cache = vf,
                             .block_table = bt + seq_bt[i],
                             .pos0 = seqs[i].pos0,
                             .n_tok = seqs[i].n_tok,
                             .n_head = n_head,
                             .n_kv_head = sh.n_kv_head,
                             .head_dim = hd,
                             .block_size = bs,
                             .ld_q = ld_q,
                             .window = sh.window,
                             .scale = 1.0f / sqrtf((float)hd)};
        for (uint32_t k = 0; k < n_chk; k++) {
            // n_chk heads spread evenly from 0 to n_head - 1
            const uint32_t h = n_chk == n_head ? k
                                               : (n_chk == 1 ? 0 : k * (n_head - 1) / (n_chk - 1));
            tm_cpu_attn_head(&ra, h, scores);
            for (uint32_t t = 0; t < seqs[i].n_tok; t++)
                for (uint32_t c = 0; c < hd; c++) {
                    const size_t e = (t0 + t) * ld_q + (size_t)h * hd + c;
                    const float g = bf(out[e]), r = ref[e];
                    const double d = fabs((double)g - r);
                    const double tol = 0x1p-8 * fabs(r) + tol_abs;
                    if (!(d <= tol)) { // NaN fails too
                        if (!bad)
                            fprintf(stderr, "%s: seq %u row %u head %u dim %u: gpu %.8g ref %.8g\n",
                                    name, i, t, h, c, g, r);
                        bad++;
                        max_err = INFINITY;
                    } else {
                        max_err = d > max_err ? d : max_err;
                        max_ratio = d / tol > max_ratio ? d / tol : max_ratio;
                    }
                }
        }
    }
    // rows outside every chunk and the padding columns stay poisoned
    int untouched = 1;
    char *owned = calloc(T, 1);
    TM_ASSERT(owned);
    for (uint32_t i = 0; i < n_seq; i++)
        memset(owned + chunks[i].t0, 1, seqs[i].n_tok);
    for (uint32_t t = 0; t < T; t++)
        for (uint32_t c = owned[t] ? qd : 0; c < ld_q; c++)
            untouched &= out[(size_t)t * ld_q + c] == BF16_NAN;
    TM_CHECK_MSG(bad == 0 && untouched,
                 "%s: %u seqs %u rows, %u/%u heads, hd %u, bs %u, window %u: %d bad, others "
                 "untouched %d",
                 name, n_seq, T, n_head, sh.n_kv_head, hd, bs, sh.window, bad, untouched);
    fprintf(stderr, "  %-22s max err %.3g (%.2f of tolerance), %u tiles, %u/%u heads checked\n",
            name, max_err, max_ratio, n_tile, n_chk, n_head);

    if (sh.timed && g_reps > 0) {
        double flop = 0.0; // 2 * hd for q.k and 2 * hd for p.v per (row, key, head)
        for (uint32_t i = 0; i < n_seq; i++)
            for (uint32_t t = 0; t < seqs[i].n_tok; t++) {
                const uint32_t n_pos = seqs[i].pos0 + t + 1;
                const uint32_t n_key = sh.window && n_pos > sh.window ? sh.window : n_pos;
                flop += 4.0 * hd * n_key * n_head;
            }
        cudaEvent_t e0, e1;
        TM_ASSERT(cudaEventCreate(&e0) == cudaSuccess && cudaEventCreate(&e1) == cudaSuccess);
        TM_CHECK_OK(tm_k_attn_prefill_bf16(&a, g_stream, &err), &err); // warm-up
        TM_ASSERT(cudaEventRecord(e0, g_stream) == cudaSuccess);
        for (int r = 0; r < g_reps; r++)
            TM_CHECK_OK(tm_k_attn_prefill_bf16(&a, g_stream, &err), &err);
        TM_ASSERT(cudaEventRecord(e1, g_stream) == cudaSuccess);
        TM_ASSERT(cudaEventSynchronize(e1) == cudaSuccess);
        float ms = 0.0f;
        TM_ASSERT(cudaEventElapsedTime(&ms, e0, e1) == cudaSuccess);
        ms /= (float)g_reps;
        fprintf(stderr, "  %-22s %.3f ms per launch, %.1f TFLOP/s (%d reps)\n", name, ms,
                flop / (ms * 1e-3) * 1e-12, g_reps);
        cudaEventDestroy(e0), cudaEventDestroy(e1);
    }

    cudaFree(d_kc), cudaFree(d_vc), cudaFree(d_q), cudaFree(d_out), cudaFree(d_sbt);
    cudaFree(d_bt), cudaFree(d_tiles);
    free(chunks), free(seq_bt), free(perm), free(kc), free(vc), free(kf), free(vf), free(q);
    free(qf), free(tiles), free(out), free(ref), free(scores), free(owned);
}

/* Tile builder: counts, the bound, coverage of every row once, and the longest-first order. */
static void test_tiles(void) {
    const tm_k_attn_prefill_chunk ch[] = {{.t0 = 0, .n_tok = 1, .pos0 = 0},
                                          {.t0 = 1, .n_tok = 0, .pos0 = 9},
                                          {.t0 = 1, .n_tok = 130, .pos0 = 37},
                                          {.t0 = 131, .n_tok = 64, .pos0 = 1000},
                                          {.t0 = 195, .n_tok = 65, .pos0 = 0}};
    const uint32_t n = tm_k_attn_prefill_n_tiles(ch, 5);
    TM_CHECK(n == 1 + 0 + 3 + 1 + 2);
    TM_CHECK(n <= tm_k_attn_prefill_max_tiles(1 + 130 + 64 + 65, 5));
    TM_CHECK(tm_k_attn_prefill_n_tiles(ch, 0) == 0);
    tm_k_attn_prefill_tile tiles[7];
    TM_CHECK(tm_k_attn_prefill_tiles(ch, 5, tiles) == n);
    uint8_t seen[260] = {0};
    int ok = 1;
    for (uint32_t i = 0; i < n; i++) {
        const tm_k_attn_prefill_tile *t = &tiles[i];
        ok &= t->n >= 1 && t->n <= TM_ATTN_PREFILL_TILE_M;
        ok &= t->t0 >= ch[t->seq].t0 && t->t0 + t->n <= ch[t->seq].t0 + ch[t->seq].n_tok;
        ok &= t->pos0 - ch[t->seq].pos0 == t->t0 - ch[t->seq].t0;
        for (uint32_t r = 0; r < t->n; r++)
            seen[t->t0 + r]++;
        if (i)
            ok &= tiles[i - 1].pos0 + tiles[i - 1].n >= t->pos0 + t->n;
    }
    for (uint32_t r = 0; r < 260; r++)
        ok &= seen[r] == 1;
    TM_CHECK(ok);
    TM_CHECK(tiles[0].seq == 3 && tiles[0].pos0 == 1000);
    TM_CHECK(tm_k_attn_prefill_supported(64) && tm_k_attn_prefill_supported(128));
    TM_CHECK(!tm_k_attn_prefill_supported(96) && !tm_k_attn_prefill_supported(256));
}

static void test_single(void) {
    const pf_shape s128 = {.n_head = 8, .n_kv_head = 2, .hd = 128, .bs = 16};
    const pf_shape s64 = {.n_head = 8, .n_kv_head = 8, .hd = 64, .bs = 7};
    const uint32_t rows[] = {1, 2, 15, 16, 17, 63, 64, 65, 100, 128, 129, 255, 300};
    char name[64];
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        const pf_seq one[] = {{0, 0, rows[i]}};
        snprintf(name, sizeof(name), "single %u hd128", rows[i]);
        pf_case(name, one, 1, s128);
        snprintf(name, sizeof(name), "single %u hd64", rows[i]);
        pf_case(name, one, 1, s64);
    }
}

static void test_chunks(void) {
    const pf_seq at37[] = {{0, 37, 50}};
    const pf_seq at128[] = {{0, 128, 64}};
    const pf_seq at1000[] = {{2, 1000, 77}};
    const pf_shape g41 = {.n_head = 4, .n_kv_head = 1, .hd = 128, .bs = 16};
    const pf_shape g88 = {.n_head = 8, .n_kv_head = 8, .hd = 64, .bs = 7};
    const pf_shape bs1 = {.n_head = 4, .n_kv_head = 2, .hd = 64, .bs = 1};
    const pf_shape bs128 = {.n_head = 4, .n_kv_head = 1, .hd = 128, .bs = 128};
    pf_case("chunk@37 4/1", at37, 1, g41);
    pf_case("chunk@37 8/8 bs7", at37, 1, g88);
    pf_case("chunk@128 4/1", at128, 1, g41);
    pf_case("chunk@128 bs128", at128, 1, bs128);
    pf_case("chunk@1000 4/1", at1000, 1, g41);
    pf_case("chunk@1000 bs1", at1000, 1, bs1);
    pf_case("chunk@1000 bs128", at1000, 1, bs128);
}

static void test_multi(void) {
    // unused stacked rows between chunks (e.g. decode tokens another kernel handles)
    const pf_seq mixed[] = {{0, 0, 37}, {1, 127, 1},   {0, 5, 3},    {4, 300, 129},
                            {0, 0, 0},  {2, 128, 200}, {0, 1000, 70}};
    const pf_shape g328 = {.n_head = 32, .n_kv_head = 8, .hd = 128, .bs = 16};
    const pf_shape g88 = {.n_head = 8, .n_kv_head = 8, .hd = 128, .bs = 7};
    const pf_shape g41 = {.n_head = 4, .n_kv_head = 1, .hd = 64, .bs = 128};
    const pf_shape g328h64 = {.n_head = 32, .n_kv_head = 8, .hd = 64, .bs = 16};
    pf_case("multi 32/8 hd128", mixed, 7, g328);
    pf_case("multi 8/8 hd128 bs7", mixed, 7, g88);
    pf_case("multi 4/1 hd64 bs128", mixed, 7, g41);
    pf_case("multi 32/8 hd64", mixed, 7, g328h64);
}

static void test_window(void) {
    const pf_seq mixed[] = {{0, 0, 300}, {3, 37, 50}, {0, 1000, 130}, {1, 20, 20}};
    const pf_shape w128 = {.n_head = 8, .n_kv_head = 2, .hd = 128, .bs = 16, .window = 50};
    const pf_shape w64 = {.n_head = 4, .n_kv_head = 1, .hd = 64, .bs = 7, .window = 50};
    const pf_shape w1 = {.n_head = 4, .n_kv_head = 4, .hd = 64, .bs = 16, .window = 1};
    const pf_shape w200 = {.n_head = 8, .n_kv_head = 2, .hd = 128, .bs = 128, .window = 200};
    pf_case("window 50 hd128", mixed, 4, w128);
    pf_case("window 50 hd64 bs7", mixed, 4, w64);
    pf_case("window 1", mixed, 4, w1);
    pf_case("window 200 bs128", mixed, 4, w200);
}

static void test_big(void) {
    const pf_seq two[] = {{0, 0, 2048}, {0, 0, 2048}};
    pf_seq eight[8];
    for (int i = 0; i < 8; i++)
        eight[i] = (pf_seq){0, 0, 2048};
    const pf_shape llama = {
        .n_head = 32, .n_kv_head = 8, .hd = 128, .bs = 16, .n_check_head = 3, .timed = 1};
    pf_shape llama1 = llama;
    llama1.n_check_head = 1;
    pf_case("big 2x2048", two, 2, llama);
    if (g_reps > 0) // the P workload's shape; left out under compute-sanitizer (reps 0)
        pf_case("big 8x2048", eight, 8, llama1);
}

int main(int argc, char **argv) {
    g_rng = 0x5eed1234ull; // this test's data
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0)
        tm_test_skip("no CUDA device");
    if (argc > 1)
        g_reps = atoi(argv[1]);
    TM_ASSERT(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking) == cudaSuccess);
    TM_RUN(test_tiles);
    TM_RUN(test_single);
    TM_RUN(test_chunks);
    TM_RUN(test_multi);
    TM_RUN(test_window);
    TM_RUN(test_big);
    cudaStreamDestroy(g_stream);
    return tm_test_report();
}

#endif /* TM_HAVE_CUDA */
