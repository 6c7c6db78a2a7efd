/* tests/gpu/test_dsv4_cuda.c - DeepSeek-V4 on the CUDA engine against the CPU engine (the
 * oracle, itself matched to transformers) on small models that tools/mkmodel writes
 * ($TM_BUILD/mkmodel --arch deepseek_v4): every attention kind (s sliding, c compressed sparse
 * with the lightning indexer picking top-k below the entry count, h heavily compressed at ratio
 * 16 or 8), hash and top-k MoE, 2 and 4 hyper-connection streams, bf16, f32 (rounded to bf16 on
 * upload) and quantized weights (FP8 block-scaled dense + MXFP4 routed experts; e8m0 FP8 with
 * FP8 experts).
 *
 * Each model runs the schedule of tm_gpu_compare.h (four sequences, prompts of 37, 100, 5 and 64
 * tokens, chunked prefill with and without logits, prefills mixed with decodes, 72 decode steps
 * in CUDA graphs, batch 4 then 3) on both engines with the same block tables (16-token blocks),
 * feeding both the CPU's greedy tokens; sequences reach 173 tokens: past the 32-token window and
 * through many compression windows. A second CUDA engine without graphs, driven through
 * tm_engine_cuda_forward_greedy, must give the argmax of the first one's logits.
 *
 * Tolerance: the CUDA engine rounds GEMM inputs (normed rows, q_res, attention output, o_a
 * output, SwiGLU output) and weights to bf16 where the CPU engine is fp32 throughout; every row
 * must be within LOGIT_TOL (0.03 of the row's max |logit|, the bf16 bound of test_engine_cuda),
 * and a greedy token may differ only at a near tie (CPU top-2 margin <= 2 x the row's error),
 * each difference printed. A routing or indexer near tie can move one token's expert or entry
 * choice; that shows up as row error and is bounded the same way.
 *
 * Also: kv_copy of a partly filled block (compressed rows of the windows closed in it travel
 * with the slots) continued by another sequence equals a sequence that computed everything.
 * Skipped (77) without a GPU, without CUDA, or without mkmodel. TM_DSV4_ONLY=name runs one case
 * (for compute-sanitizer). */
#include <math.h>
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

#include "runner/engine/cuda/engine_cuda.h"
#include "runner/engine/engine.h"
#include "runner/model/model.h"
#include "tm_gpu_compare.h"

static int step(tm_engine *cpu, tm_engine *gpu, tm_engine *gpu2, seq *S, const uint32_t *which,
                const uint32_t *n_tok, uint32_t n_chunk, uint32_t n_vocab, stats *st) {
    tm_batch_seq bs[N_SEQ];
    uint32_t want_seq[N_SEQ];
    const uint32_t n_want = step_batch(S, which, n_tok, n_chunk, bs, want_seq);
    tm_batch b = {.seqs = bs, .n_seq = n_chunk};
    float *lc = malloc((size_t)N_SEQ * n_vocab * 4), *lg = malloc((size_t)N_SEQ * n_vocab * 4);
    uint32_t ids[N_SEQ];
    tm_err err = {0};
    TM_ASSERT(lc && lg);
    int ok = 1;
    CHECK_CALL(ok, tm_engine_forward(cpu, &b, lc, &err), &err);
    CHECK_CALL(ok, tm_engine_forward(gpu, &b, lg, &err), &err);
    CHECK_CALL(ok, tm_engine_cuda_forward_greedy(gpu2, &b, ids, &err), &err);
    for (uint32_t r = 0; ok && r < n_want; r++) {
        const float *c = lc + (size_t)r * n_vocab, *g = lg + (size_t)r * n_vocab;
        const uint32_t tc = argmax(c, n_vocab), tg = argmax(g, n_vocab);
        compare_row(st, "cpu", c, tc, "gpu", g, tg, n_vocab);
        st->n_dev_diff += ids[r] != tg;
        seq_append(&S[want_seq[r]], tc);
    }
    step_done(S, which, n_tok, n_chunk);
    free(lc);
    free(lg);
    return ok;
}

static int selected(const char *name) {
    const char *only = getenv("TM_DSV4_ONLY");
    return !only || !strcmp(only, name);
}

static void run_case(const char *name, const char *args) {
    if (!selected(name))
        return;
    char dir[] = "/tmp/tm_dsv4_cuda_XXXXXX", cmd[1024];
    if (mkmodel(dir, args, cmd, sizeof(cmd)) != 0) {
        fprintf(stderr, "%s: mkmodel failed: %s\n", name, cmd);
        TM_CHECK(0);
        return;
    }
    tm_err err = {0};
    tm_model *m = NULL;
    TM_CHECK_OK(tm_model_load(dir, &m, &err), &err);
    if (!m)
        return;
    const uint32_t V = m->cfg.n_vocab;
    tm_engine_opts eo = {.n_threads = 0,
                         .block_size = BLOCK,
                         .n_kv_block = SEQ_BLOCKS,
                         .max_seqs = N_SEQ,
                         .max_batched_tokens = 256};
    tm_engine *cpu = NULL, *gpu = NULL, *gpu2 = NULL;
    TM_CHECK_OK(tm_engine_cpu_create(m, &eo, &cpu, &err), &err);
    TM_CHECK_OK(tm_engine_cuda_create(m, &eo, &gpu, &err), &err);
    TM_CHECK_OK(tm_engine_cuda_create(m, &eo, &gpu2, &err), &err);
    if (!cpu || !gpu || !gpu2)
        goto done;
    tm_engine_cuda_set_graphs(gpu2, 0);
    static seq S[N_SEQ];
    seqs_init(S, V);
    stats st = {0};
    int ok = 1;
    for (uint32_t k = 0; ok && k < N_STEP; k++) {
        uint32_t which[N_SEQ], n_tok[N_SEQ];
        const uint32_t n_chunk = sched_step(k, which, n_tok);
        ok = step(cpu, gpu, gpu2, S, which, n_tok, n_chunk, V, &st);
    }
    fprintf(stderr,
            "%s: %d logit rows, max abs err %.4g, max err / row max|logit| %.4g (tol %.2g), "
            "%d rows over; greedy %d/%d equal (%d not near a tie); device greedy vs host "
            "argmax: %d differ\n",
            name, st.n_rows, st.max_abs, st.max_rel, LOGIT_TOL, st.n_bad_rows,
            st.n_greedy - st.n_greedy_diff, st.n_greedy, st.n_clear_flip, st.n_dev_diff);
    TM_CHECK(ok);
    TM_CHECK(st.n_rows >= N_DECODE * 3);
    TM_CHECK_MSG(st.n_bad_rows == 0, "%s: %d rows beyond tolerance", name, st.n_bad_rows);
    TM_CHECK_MSG(st.n_clear_flip == 0, "%s: %d greedy tokens differ (%d not near a tie)", name,
                 st.n_greedy_diff, st.n_clear_flip);
    TM_CHECK(st.n_dev_diff == 0);
done:
    tm_engine_destroy(gpu2);
    tm_engine_destroy(gpu);
    tm_engine_destroy(cpu);
    tm_model_destroy(m);
    if (rmdir_all(dir) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
}

#define COMMON                                                                                     \
    "--arch deepseek_v4 --hidden 128 --heads 4 --head-dim 64 --rope-dim 16 --q-lora 64 "           \
    "--o-groups 2 --o-lora 32 --ff 64 --vocab 512 --ctx 1024 --window 32 --index-heads 16 "        \
    "--index-dim 32 --index-topk 8 "

// every layer kind, hash then top-k MoE, 4 streams, bf16
static void test_mix_hc4_bf16(void) {
    run_case("mix-hc4-bf16", COMMON "--layers 4 --dsv4-layers schc --dsv4-mlp hhmm --hc 4 "
                                    "--experts 8 --experts-used 2 --hca-ratio 16 --seed 31");
}
// 2 streams, tied embeddings, HCA ratio 8, f32 checkpoint (rounded to bf16 on upload)
static void test_hc2_f32(void) {
    run_case("hc2-f32-tied", COMMON "--layers 3 --dsv4-layers hcs --dsv4-mlp mhm --hc 2 "
                                    "--experts 6 --experts-used 3 --hca-ratio 8 --tied 1 "
                                    "--dtype f32 --yarn 0 --seed 32");
}
// FP8 block-scaled dense (fp32 scales) + MXFP4 routed experts
static void test_fp8_mxfp4(void) {
    run_case("fp8-mxfp4", COMMON "--layers 3 --dsv4-layers csh --dsv4-mlp hmm --hc 4 "
                                 "--experts 8 --experts-used 2 --hca-ratio 16 "
                                 "--quant fp8-block --expert-dtype fp4 --seed 33");
}
// FP8 with e8m0 scales, experts FP8 too
static void test_fp8_ue8m0(void) {
    run_case("fp8-ue8m0", COMMON "--layers 2 --dsv4-layers ch --dsv4-mlp mm --hc 3 "
                                 "--experts 4 --experts-used 2 --hca-ratio 16 "
                                 "--quant fp8-block-ue8m0 --seed 34");
}

// kv_copy: B shares A's first 20 tokens (block 0 whole, the 4 computed slots of A's block 1
// copied), then computes 3 more; its logits must match C, which computed all 23 itself.
static void test_kv_copy(void) {
    if (!selected("kv-copy"))
        return;
    char dir[] = "/tmp/tm_dsv4_cuda_XXXXXX", cmd[1024];
    TM_CHECK(mkmodel(dir,
                     COMMON "--layers 3 --dsv4-layers chs --dsv4-mlp hmm --hc 4 --experts 4 "
                            "--experts-used 2 --hca-ratio 8 --seed 35",
                     cmd, sizeof(cmd)) == 0);
    tm_err err = {0};
    tm_model *m = NULL;
    tm_engine *gpu = NULL;
    TM_CHECK_OK(tm_model_load(dir, &m, &err), &err);
    tm_engine_opts eo = {
        .block_size = BLOCK, .n_kv_block = 16, .max_seqs = 2, .max_batched_tokens = 64};
    if (m)
        TM_CHECK_OK(tm_engine_cuda_create(m, &eo, &gpu, &err), &err);
    if (!gpu) {
        tm_model_destroy(m);
        return;
    }
    const uint32_t V = m->cfg.n_vocab;
    uint32_t tok[23];
    for (uint32_t i = 0; i < 23; i++)
        tok[i] = (i * 37 + 11) % V;
    float *la = calloc(V, 4), *lb = calloc(V, 4), *lc = calloc(V, 4);
    uint32_t bt_a[2] = {0, 1}, bt_b[2] = {0, 5}, bt_c[2] = {8, 9};
    tm_batch_seq a = {
        .tokens = tok, .n_tok = 20, .pos = 0, .block_table = bt_a, .n_block = 2, .want_logits = 1};
    TM_CHECK_OK(tm_engine_forward(gpu, &(tm_batch){.seqs = &a, .n_seq = 1}, la, &err), &err);
    TM_CHECK_OK(gpu->ops->kv_copy(gpu, 1, 5, 20 - BLOCK, &err), &err);
    tm_batch_seq b = {.tokens = tok + 20,
                      .n_tok = 3,
                      .pos = 20,
                      .block_table = bt_b,
                      .n_block = 2,
                      .want_logits = 1};
    tm_batch_seq c = {
        .tokens = tok, .n_tok = 23, .pos = 0, .block_table = bt_c, .n_block = 2, .want_logits = 1};
    TM_CHECK_OK(tm_engine_forward(gpu, &(tm_batch){.seqs = &b, .n_seq = 1}, lb, &err), &err);
    TM_CHECK_OK(tm_engine_forward(gpu, &(tm_batch){.seqs = &c, .n_seq = 1}, lc, &err), &err);
    double max_d = 0, max_c = 0;
    for (uint32_t v = 0; v < V; v++) {
        max_d = fmax(max_d, fabs((double)lb[v] - lc[v]));
        max_c = fmax(max_c, fabs((double)lc[v]));
    }
    fprintf(stderr, "  kv_copy: max |logit B - logit C| / max |C| = %.3g\n", max_d / max_c);
    TM_CHECK(max_d / max_c < 1e-3); // same kernels, same state: only GEMM shapes differ
    TM_CHECK(argmax(lb, V) == argmax(lc, V));
    free(la), free(lb), free(lc);
    tm_engine_destroy(gpu);
    tm_model_destroy(m);
    TM_CHECK(rmdir_all(dir) == 0);
}

int main(void) {
    g_rng = 91;
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0)
        tm_test_skip("no CUDA device");
    const char *build = getenv("TM_BUILD");
    char path[1024];
    snprintf(path, sizeof(path), "%s/mkmodel", build ? build : "build");
    if (access(path, X_OK) != 0)
        tm_test_skip("mkmodel not built (set TM_BUILD)");
    TM_RUN(test_kv_copy);
    TM_RUN(test_mix_hc4_bf16);
    TM_RUN(test_hc2_f32);
    TM_RUN(test_fp8_mxfp4);
    TM_RUN(test_fp8_ue8m0);
    return tm_test_report();
}

#endif /* TM_HAVE_CUDA */
