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
 * output, SwiGLU output) and weights to bf16 where the CPU engine is fp32 throughout. These
 * small random models amplify such roundings strongly where they make discrete choices (top-k
 * experts, the indexer's top-k): measured on the CPU engine alone, the same model written as f32
 * and as bf16 (a 2^-9 perturbation of every weight) disagrees by up to 0.95 of a row's max
 * |logit| on 15-50% of the rows. So each case first measures that baseline (CPU f32 weights vs
 * CPU bf16 weights, same schedule), then: tie-free models (hash-routed MoE, indexer top-k above
 * every entry count) must keep every row within max(LOGIT_TOL, 2 x the baseline's worst row);
 * models with discrete choices may have at most 2 x the baseline's rows over LOGIT_TOL + 8. In
 * all: a greedy token may differ only at a near tie (CPU top-2 margin <= 2 x the row's error;
 * each difference printed), and the device argmax (graph-less engine) equals the host argmax.
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

/* One step of the schedule on the reference ref and the engine under test got (CUDA when gpu2 is
 * given: gpu2 is a second CUDA engine without graphs, driven through forward_greedy), rows
 * compared into st; appends the reference's greedy tokens. Returns 0 on engine failure. */
static int step(tm_engine *ref, tm_engine *got, tm_engine *gpu2, seq *S, const uint32_t *which,
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
    CHECK_CALL(ok, tm_engine_forward(ref, &b, lc, &err), &err);
    CHECK_CALL(ok, tm_engine_forward(got, &b, lg, &err), &err);
    if (gpu2)
        CHECK_CALL(ok, tm_engine_cuda_forward_greedy(gpu2, &b, ids, &err), &err);
    for (uint32_t r = 0; ok && r < n_want; r++) {
        const float *c = lc + (size_t)r * n_vocab, *g = lg + (size_t)r * n_vocab;
        const uint32_t tc = argmax(c, n_vocab), tg = argmax(g, n_vocab);
        compare_row(st, "cpu", c, tc, gpu2 ? "gpu" : "cpu-perturbed", g, tg, n_vocab);
        st->n_dev_diff += gpu2 && ids[r] != tg;
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

static const tm_engine_opts g_eo = {.n_threads = 0,
                                    .block_size = BLOCK,
                                    .n_kv_block = SEQ_BLOCKS,
                                    .max_seqs = N_SEQ,
                                    .max_batched_tokens = 256};

/* The schedule on ref and got (CUDA: with gpu2), the same seed for the prompts every time. */
static int run_schedule(tm_engine *ref, tm_engine *got, tm_engine *gpu2, uint32_t V, stats *st) {
    static seq S[N_SEQ];
    g_rng = 91;
    seqs_init(S, V);
    int ok = 1;
    for (uint32_t k = 0; ok && k < N_STEP; k++) {
        uint32_t which[N_SEQ], n_tok[N_SEQ];
        const uint32_t n_chunk = sched_step(k, which, n_tok);
        ok = step(ref, got, gpu2, S, which, n_tok, n_chunk, V, st);
    }
    return ok;
}

/* The perturbation baseline: the CPU engine on base_args written as f32 against the CPU engine
 * on the same model written as bf16 (mkmodel draws the same values and rounds them: a 2^-9
 * relative perturbation of every weight, about what the CUDA engine's bf16 activations do). */
static int baseline(const char *name, const char *base_args, stats *st) {
    char d32[] = "/tmp/tm_dsv4_cuda_XXXXXX", d16[] = "/tmp/tm_dsv4_cuda_XXXXXX", cmd[1024];
    char args[768];
    int ok = 0;
    tm_model *m32 = NULL, *m16 = NULL;
    tm_engine *e32 = NULL, *e16 = NULL;
    tm_err err = {0};
    snprintf(args, sizeof(args), "%s --dtype f32", base_args);
    if (mkmodel(d32, args, cmd, sizeof(cmd)) != 0)
        goto out;
    snprintf(args, sizeof(args), "%s --dtype bf16", base_args);
    if (mkmodel(d16, args, cmd, sizeof(cmd)) != 0)
        goto out;
    TM_CHECK_OK(tm_model_load(d32, &m32, &err), &err);
    TM_CHECK_OK(tm_model_load(d16, &m16, &err), &err);
    if (m32 && m16) {
        TM_CHECK_OK(tm_engine_cpu_create(m32, &g_eo, &e32, &err), &err);
        TM_CHECK_OK(tm_engine_cpu_create(m16, &g_eo, &e16, &err), &err);
    }
    if (e32 && e16)
        ok = run_schedule(e32, e16, NULL, m32->cfg.n_vocab, st);
    fprintf(stderr,
            "%s baseline (cpu f32 vs cpu bf16 weights): max err / row max|logit| %.4g, %d rows "
            "over %.2g, greedy %d/%d equal\n",
            name, st->max_rel, st->n_bad_rows, LOGIT_TOL, st->n_greedy - st->n_greedy_diff,
            st->n_greedy);
out:
    tm_engine_destroy(e32);
    tm_engine_destroy(e16);
    tm_model_destroy(m32);
    tm_model_destroy(m16);
    rmdir_all(d32);
    rmdir_all(d16);
    TM_CHECK_MSG(ok, "%s: baseline failed: %s", name, cmd);
    return ok;
}

/* tie_free: the model makes no discrete choice that a rounding can flip (hash-routed MoE only,
 * index_topk above every entry count), so every row must be within the bf16 bound: LOGIT_TOL,
 * or twice the baseline's worst row where the model itself amplifies a 2^-9 perturbation beyond
 * it. Otherwise (top-k routing, indexer top-k below the entry count) a near tie in one token's
 * expert or entry choice changes that token's state for every later token that reads it, in
 * either engine: the CUDA engine may then not disagree with the CPU more often than the baseline
 * does (rows over LOGIT_TOL at most 2 x the baseline's + 8). In both: a greedy token may differ
 * only at a near tie (each printed), and the device argmax equals the host one. */
static void run_case(const char *name, const char *args, const char *base_args, int tie_free) {
    if (!selected(name))
        return;
    stats base = {0};
    if (!baseline(name, base_args, &base))
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
    tm_engine *cpu = NULL, *gpu = NULL, *gpu2 = NULL;
    TM_CHECK_OK(tm_engine_cpu_create(m, &g_eo, &cpu, &err), &err);
    TM_CHECK_OK(tm_engine_cuda_create(m, &g_eo, &gpu, &err), &err);
    TM_CHECK_OK(tm_engine_cuda_create(m, &g_eo, &gpu2, &err), &err);
    if (!cpu || !gpu || !gpu2)
        goto done;
    tm_engine_cuda_set_graphs(gpu2, 0);
    stats st = {0};
    const int ok = run_schedule(cpu, gpu, gpu2, V, &st);
    fprintf(stderr,
            "%s (%s): %d logit rows, max abs err %.4g, max err / row max|logit| %.4g (tol %.2g), "
            "%d rows over; greedy %d/%d equal (%d not near a tie); device greedy vs host "
            "argmax: %d differ\n",
            name, tie_free ? "tie-free" : "with discrete choices", st.n_rows, st.max_abs,
            st.max_rel, LOGIT_TOL, st.n_bad_rows, st.n_greedy - st.n_greedy_diff, st.n_greedy,
            st.n_clear_flip, st.n_dev_diff);
    TM_CHECK(ok);
    TM_CHECK(st.n_rows >= N_DECODE * 3);
    if (tie_free) {
        const double bound = fmax(LOGIT_TOL, 2.0 * base.max_rel);
        TM_CHECK_MSG(st.max_rel <= bound, "%s: max err / max|logit| %.4g > %.4g", name, st.max_rel,
                     bound);
    } else {
        TM_CHECK_MSG(st.n_bad_rows <= 2 * base.n_bad_rows + 8,
                     "%s: %d rows beyond tolerance (baseline %d)", name, st.n_bad_rows,
                     base.n_bad_rows);
    }
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
    "--index-dim 32 "
#define TOPK8 "--index-topk 8 "
#define TOPK_ALL "--index-topk 512 "

#define MIX "--layers 4 --dsv4-layers schc --hc 4 --experts 8 --experts-used 2 --hca-ratio 16 "
// every layer kind, 4 streams, bf16: tie-free (hash MoE, all entries) and with top-k routing
// and the indexer picking 8
static void test_mix_tie_free(void) {
    run_case("mix-hc4-bf16-tie-free", COMMON TOPK_ALL MIX "--dsv4-mlp hhhh --seed 31",
             COMMON TOPK_ALL MIX "--dsv4-mlp hhhh --seed 31", 1);
}
static void test_mix(void) {
    run_case("mix-hc4-bf16", COMMON TOPK8 MIX "--dsv4-mlp hhmm --seed 31",
             COMMON TOPK8 MIX "--dsv4-mlp hhmm --seed 31", 0);
}
#define HC2                                                                                        \
    "--layers 3 --dsv4-layers hcs --hc 2 --experts 6 --experts-used 3 --hca-ratio 8 --tied 1 "     \
    "--yarn 0 "
// 2 streams, tied embeddings, HCA ratio 8, plain rope; an f32 checkpoint (rounded to bf16 on
// upload)
static void test_hc2_tie_free(void) {
    run_case("hc2-f32-tie-free", COMMON TOPK_ALL HC2 "--dsv4-mlp hhh --dtype f32 --seed 37",
             COMMON TOPK_ALL HC2 "--dsv4-mlp hhh --seed 37", 1);
}
static void test_hc2(void) {
    run_case("hc2-f32", COMMON TOPK8 HC2 "--dsv4-mlp mhm --dtype f32 --seed 32",
             COMMON TOPK8 HC2 "--dsv4-mlp mhm --seed 32", 0);
}
#define Q3 "--layers 3 --dsv4-layers csh --hc 4 --experts 8 --experts-used 2 --hca-ratio 16 "
// FP8 block-scaled dense (fp32 scales) + MXFP4 routed experts; the baseline is the unquantized
// model (a quantized checkpoint written from f32 or bf16 values differs by more than a rounding)
static void test_fp8_mxfp4_tie_free(void) {
    run_case("fp8-mxfp4-tie-free",
             COMMON TOPK_ALL Q3 "--dsv4-mlp hhh --quant fp8-block --expert-dtype fp4 --seed 36",
             COMMON TOPK_ALL Q3 "--dsv4-mlp hhh --seed 36", 1);
}
static void test_fp8_mxfp4(void) {
    run_case("fp8-mxfp4",
             COMMON TOPK8 Q3 "--dsv4-mlp hmm --quant fp8-block --expert-dtype fp4 --seed 33",
             COMMON TOPK8 Q3 "--dsv4-mlp hmm --seed 33", 0);
}
// FP8 with e8m0 scales, experts FP8 too (3 streams)
static void test_fp8_ue8m0(void) {
    run_case("fp8-ue8m0",
             COMMON TOPK8 "--layers 2 --dsv4-layers ch --dsv4-mlp mm --hc 3 --experts 4 "
                          "--experts-used 2 --hca-ratio 16 --quant fp8-block-ue8m0 --seed 34",
             COMMON TOPK8 "--layers 2 --dsv4-layers ch --dsv4-mlp mm --hc 3 --experts 4 "
                          "--experts-used 2 --hca-ratio 16 --seed 34",
             0);
}

// kv_copy: B shares A's first 20 tokens (block 0 whole, the 4 computed slots of A's block 1
// copied), then computes 3 more; its logits must match C, which computed all 23 itself.
static void test_kv_copy(void) {
    if (!selected("kv-copy"))
        return;
    char dir[] = "/tmp/tm_dsv4_cuda_XXXXXX", cmd[1024];
    TM_CHECK(mkmodel(dir,
                     COMMON TOPK8 "--layers 3 --dsv4-layers chs --dsv4-mlp hmm --hc 4 --experts 4 "
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
    double max_c = 0;
    int same = 0;
    const double max_d = kv_copy_diff(gpu, V, &max_c, &same);
    fprintf(stderr, "  kv_copy: max |logit B - logit C| / max |C| = %.3g\n", max_d / max_c);
    TM_CHECK(max_d / max_c < 1e-3); // same kernels, same state: only GEMM shapes differ
    TM_CHECK(same);
    tm_engine_destroy(gpu);
    tm_model_destroy(m);
    TM_CHECK(rmdir_all(dir) == 0);
}

int main(void) {
    g_rng = 91;
    need_gpu_and_mkmodel();
    TM_RUN(test_kv_copy);
    TM_RUN(test_mix_tie_free);
    TM_RUN(test_mix);
    TM_RUN(test_hc2_tie_free);
    TM_RUN(test_hc2);
    TM_RUN(test_fp8_mxfp4_tie_free);
    TM_RUN(test_fp8_mxfp4);
    TM_RUN(test_fp8_ue8m0);
    return tm_test_report();
}

#endif /* TM_HAVE_CUDA */
