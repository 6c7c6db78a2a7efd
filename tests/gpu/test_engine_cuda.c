/* tests/gpu/test_engine_cuda.c - the CUDA engine against the CPU engine (the oracle) on models that
 * tools/mkmodel writes ($TM_BUILD/mkmodel): Llama (GQA, untied), Qwen2 (q/k/v bias, tied
 * embeddings), llama3 rope scaling with f32 weights, f16 weights, and FP8 checkpoints (mkmodel
 * --quant: 128 x 128 blocks with fp32 scales, with e8m0 scales, per channel, per tensor with
 * static input scales), whose shapes cover both q|k|v layouts of the engine (fused, and apart
 * when kv_dim is not a multiple of the 128-row block).
 *
 * Each model runs one schedule of four sequences on both engines with the same block tables:
 * prefill chunks with and without want_logits, prefills mixed with decodes in one step, then
 * decode steps (CUDA graphs, batch size shrinking from 4 to 3 when one sequence stops), 72
 * decode steps in all. Both engines are fed the CPU engine's greedy tokens, so their states stay
 * identical and every step's logits can be compared; the greedy token of the CUDA engine (argmax
 * of its logits) must equal the CPU's at every step for bf16 models (same weights; 257 tokens per
 * model, 72+ decode steps per sequence), and may differ only at near ties for f32/f16 models
 * (rounded to bf16 on upload). FP8 models: the decode steps (at most 16 tokens) compute with
 * the exact checkpoint weights, prefill steps with the weights dequantized to bf16 (exact for
 * e8m0 scales only), or, at shapes cuBLASLt's block mode takes (fp8-block*-w8a8), as W8A8 with
 * activations quantized per token and 128 inputs (their own bound, LOGIT_TOL_W8A8); their greedy
 * tokens may flip only at near ties
 * (the f32/f16 rule: bf16 activations against the CPU's fp32 ones leave the same logit error as for
 * bf16 models, and these seeds put a few rows' top-2 margins below it), and the logit tolerance is
 * the bf16 one (W8A8 aside).
 *
 * Tolerance: the CUDA engine keeps weights, GEMM inputs and the KV cache in bf16 (the CPU engine
 * is fp32 throughout), so logits differ by bf16 rounding carried through the layers. A row
 * passes when max |cuda - cpu| <= 0.03 * max |cpu| over the row (about 4 bf16 ulps of the row's
 * scale); the maximum error seen is printed. A second CUDA engine without graphs, driven through
 * tm_engine_cuda_forward_greedy (argmax on the device), must give the same ids as the argmax of
 * the first engine's logits. Skipped (77) without a GPU, without CUDA, or without mkmodel. */
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

#include "base/log.h"
#include "runner/engine/engine.h"
#include "runner/engine/cuda/engine_cuda.h"
#include "runner/model/model.h"
#include "tm_gpu_compare.h"

/* One step over the chunks given (seq index, n_tok); appends each wanted row's CPU greedy token.
 * Returns 0 on engine failure. */
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

/* exact_greedy: the model is bf16, so both engines run the same weights and every greedy token
 * must agree. f32/f16 checkpoints are rounded to bf16 on upload (a slightly different model):
 * there a flip is allowed only at a near tie (CPU top-2 margin <= 2 x that row's logit error). */
#define LOGIT_TOL_KV_FP8 0.10
/* W8A8 prefill (fp8-block*-w8a8 models; TM_CUDA_FP8_PREFILL=dequant turns it off): activations
 * are rounded to e4m3 per token and 128 inputs, a relative error of up to 1/16 per element,
 * about 3.6% (rms) of a random-sign dot product, so the prefill logits of these random-weight
 * models sit a few times past LOGIT_TOL (0.12 on the first H200 run, dequantized 0.014). The
 * exact oracle of that arithmetic is test_lt_fp8 (the GEMM against a host reference quantizing
 * the same way); here rows over LOGIT_TOL are reported and the row error is held to
 * LOGIT_TOL_W8A8. */
#define LOGIT_TOL_W8A8 0.20
static double g_tol_loose; /* > 0: the run's row bound (rows over LOGIT_TOL reported) */

static void run_model_kv(const char *name, const char *args, int exact_greedy, tm_kv_dtype kvt) {
    char dir[] = "/tmp/tm_engine_cuda_XXXXXX", cmd[1024];
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
                         .max_batched_tokens = 256,
                         .kv_dtype = kvt};
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
            "%d rows over; greedy %d/%d equal; device greedy vs host argmax: %d differ\n",
            name, st.n_rows, st.max_abs, st.max_rel, LOGIT_TOL, st.n_bad_rows,
            st.n_greedy - st.n_greedy_diff, st.n_greedy, st.n_dev_diff);
    TM_CHECK(ok);
    TM_CHECK(st.n_rows >= N_DECODE * 3);
    const double loose = kvt == TM_KV_DTYPE_FP8 ? LOGIT_TOL_KV_FP8 : g_tol_loose;
    if (loose > 0) // the rows over LOGIT_TOL are reported above, not failed
        TM_CHECK_MSG(st.max_rel <= loose, "%s: max err / max|logit| %.4g > %.2g", name, st.max_rel,
                     loose);
    else
        TM_CHECK_MSG(st.n_bad_rows == 0, "%s: %d rows beyond tolerance", name, st.n_bad_rows);
    TM_CHECK_MSG(exact_greedy ? st.n_greedy_diff == 0 : st.n_clear_flip == 0,
                 "%s: %d greedy tokens differ (%d not near a tie)", name, st.n_greedy_diff,
                 st.n_clear_flip);
    TM_CHECK(st.n_dev_diff == 0);

    // Bad input fails the call, not the engine.
    {
        uint32_t bad_tok = V;
        tm_batch_seq bs = {.tokens = &bad_tok,
                           .n_tok = 1,
                           .pos = 0,
                           .block_table = S[0].bt,
                           .n_block = 1,
                           .want_logits = 1};
        tm_batch b = {.seqs = &bs, .n_seq = 1};
        float *lg = malloc((size_t)V * 4);
        TM_CHECK(tm_engine_forward(gpu, &b, lg, &err) == TM_E_INVAL);
        bs.tokens = S[0].tok;
        TM_CHECK_OK(tm_engine_forward(gpu, &b, lg, &err), &err);
        free(lg);
    }
done:
    tm_engine_destroy(gpu2);
    tm_engine_destroy(gpu);
    tm_engine_destroy(cpu);
    tm_model_destroy(m);
    if (rmdir_all(dir) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
}

static void run_model(const char *name, const char *args, int exact_greedy) {
    run_model_kv(name, args, exact_greedy, TM_KV_DTYPE_AUTO);
}

static void test_llama(void) {
    run_model("llama",
              "--layers 3 --hidden 256 --heads 8 --kv-heads 2 --ff 512 --vocab 512 "
              "--ctx 1024 --seed 3",
              1);
}
static void test_qwen2_tied(void) {
    run_model("qwen2-tied",
              "--arch qwen2 --tied 1 --layers 2 --hidden 128 --heads 4 "
              "--kv-heads 2 --ff 256 --vocab 300 --ctx 1024 --seed 4",
              1);
}
static void test_llama3_f32(void) {
    run_model("llama3-f32",
              "--layers 2 --hidden 256 --heads 4 --kv-heads 1 --ff 384 "
              "--vocab 400 --ctx 1024 --rope-scaling llama3 --dtype f32 --seed 5",
              0);
}
static void test_f16(void) {
    run_model("f16",
              "--layers 2 --hidden 128 --heads 2 --kv-heads 2 --head-dim 64 --ff 256 "
              "--vocab 256 --ctx 1024 --dtype f16 --seed 6",
              0);
}

// FP8: q|k|v apart (kv_dim 64 < 128), gate|up fused; fp32 block scales.
static void test_fp8_block(void) {
    run_model("fp8-block",
              "--layers 3 --hidden 256 --heads 8 --kv-heads 2 --ff 512 --vocab 512 "
              "--ctx 1024 --quant fp8-block --seed 13",
              0);
}
// FP8: q|k|v fused (head_dim 128), gate|up apart and a partial block in down_proj's inner
// dimension (n_ff 320), e8m0 block scales.
static void test_fp8_block_ue8m0(void) {
    run_model("fp8-block-ue8m0",
              "--layers 2 --hidden 256 --heads 2 --kv-heads 1 --head-dim 128 "
              "--ff 320 --vocab 400 --ctx 1024 --quant fp8-block-ue8m0 "
              "--seed 14",
              0);
}
// FP8 at a W8A8 prefill shape (every inner dimension a multiple of 512: the cuBLASLt block mode
// of lt_fp8.h runs the prefill chunks, decode steps stay on gemm_quant): fp32 and e8m0 block
// scales (the e8m0 grid reaches cuBLASLt as its fp32 copy, cuda_lin.scale_f32).
static void test_fp8_block_w8a8(void) {
    const char *env = getenv("TM_CUDA_FP8_PREFILL");
    g_tol_loose = env && !strcmp(env, "dequant") ? 0.0 : LOGIT_TOL_W8A8;
    run_model("fp8-block-w8a8",
              "--layers 2 --hidden 512 --heads 4 --kv-heads 1 --head-dim 128 "
              "--ff 1024 --vocab 512 --ctx 1024 --quant fp8-block --seed 17",
              0);
    g_tol_loose = 0.0;
}
static void test_fp8_block_ue8m0_w8a8(void) {
    const char *env = getenv("TM_CUDA_FP8_PREFILL");
    g_tol_loose = env && !strcmp(env, "dequant") ? 0.0 : LOGIT_TOL_W8A8;
    run_model("fp8-block-ue8m0-w8a8",
              "--layers 2 --hidden 512 --heads 4 --kv-heads 1 --head-dim 128 "
              "--ff 1024 --vocab 512 --ctx 1024 --quant fp8-block-ue8m0 --seed 18",
              0);
    g_tol_loose = 0.0;
}
static void test_fp8_channel(void) {
    run_model("fp8-channel",
              "--arch qwen2 --tied 1 --layers 2 --hidden 128 --heads 4 "
              "--kv-heads 2 --ff 256 --vocab 300 --ctx 1024 --quant fp8-channel "
              "--seed 15",
              0);
}
static void test_fp8_tensor_static(void) {
    run_model("fp8-tensor-static",
              "--layers 2 --hidden 256 --heads 4 --kv-heads 2 --ff 512 "
              "--vocab 300 --ctx 1024 --quant fp8-tensor --ct-static 1 "
              "--seed 16",
              0);
}

// fp8 (e4m3) KV on both engines: the CPU engine rounds each K/V element from its fp32 value, the
// CUDA engine from its own (bf16 GEMM inputs, about 2^-9 apart), so an element near a rounding
// tie lands one e4m3 step (1/16 to 1/8 of its value) apart: a few percent of the elements do.
// That, not the kernels (test_kernels: exact widening, the bf16 tolerances), sets the logit error:
// measured 0.034 to 0.067 of max|logit| on the first H200 run (bf16 models: 0.009 to 0.018), so
// the bf16 bound LOGIT_TOL is not met; rows over it are reported and the row error is held to
// LOGIT_TOL_KV_FP8 (fp8 KV's own error against bf16 KV on these models, test_kv_fp8: 0.09 to
// 0.12). Greedy tokens may flip only at near ties (as for f32/f16 models). head_dim 32 (generic
// paged kernel, prefill on it too), 128 with 4 query heads per KV head (GQA decode kernel,
// tensor-core prefill), 64 with 4 (both too), and FP8 weights with fp8 KV.
static void test_kv_fp8_hd32(void) {
    run_model_kv("kv-fp8-hd32",
                 "--layers 3 --hidden 256 --heads 8 --kv-heads 2 --ff 512 --vocab 512 "
                 "--ctx 1024 --seed 3",
                 0, TM_KV_DTYPE_FP8);
}
static void test_kv_fp8_hd128(void) {
    run_model_kv("kv-fp8-hd128",
                 "--layers 2 --hidden 512 --heads 4 --kv-heads 1 --head-dim 128 --ff 1024 "
                 "--vocab 512 --ctx 1024 --seed 21",
                 0, TM_KV_DTYPE_FP8);
}
static void test_kv_fp8_hd64_qwen2(void) {
    run_model_kv("kv-fp8-hd64-qwen2",
                 "--arch qwen2 --layers 2 --hidden 256 --heads 8 --kv-heads 2 --head-dim 64 "
                 "--ff 512 --vocab 512 --ctx 1024 --seed 22",
                 0, TM_KV_DTYPE_FP8);
}
static void test_kv_fp8_weights_fp8(void) {
    run_model_kv("kv-fp8-w-fp8-ue8m0",
                 "--layers 2 --hidden 256 --heads 2 --kv-heads 1 --head-dim 128 "
                 "--ff 320 --vocab 400 --ctx 1024 --quant fp8-block-ue8m0 --seed 14",
                 0, TM_KV_DTYPE_FP8);
}

static char g_log[4096]; /* the "cuda" INFO lines of the last engine create */
static void log_sink(tm_log_level level, const char *line, void *ud) {
    (void)level, (void)ud;
    if (strstr(line, "KV pool") && strlen(g_log) + strlen(line) + 2 < sizeof(g_log)) {
        strcat(g_log, line);
        strcat(g_log, "\n");
    }
}

// The KV pool sized from free memory (n_kv_block 0) holds twice the tokens with fp8 entries: the
// same memory, half the bytes per token; the start-up log says how many tokens.
static void test_kv_fp8_pool(void) {
    tm_model m = {.cfg = {.arch = TM_ARCH_LLAMA,
                          .n_layer = 4,
                          .n_embd = 512,
                          .n_ff = 1024,
                          .n_head = 8,
                          .n_kv_head = 2,
                          .head_dim = 64,
                          .n_vocab = 1024,
                          .n_ctx = 1u << 20, // the cap (max_seqs full contexts) above memory
                          .rope_theta = 1e4f,
                          .rms_eps = 1e-5f,
                          .bos_id = -1}};
    uint32_t n_block[2] = {0, 0};
    for (int f = 0; f < 2; f++) {
        tm_engine_opts eo = {.block_size = BLOCK,
                             .n_kv_block = 0,
                             .max_seqs = 64,
                             .max_batched_tokens = 256,
                             .gpu_mem_util = 0.2f, // fp8 stays below the cap too
                             .kv_dtype = f ? TM_KV_DTYPE_FP8 : TM_KV_DTYPE_AUTO};
        tm_engine *eng = NULL;
        tm_err err = {0};
        g_log[0] = 0;
        tm_log_set_sink(log_sink, NULL);
        TM_CHECK_OK(tm_engine_cuda_create_random(&m, &eo, 5, &eng, &err), &err);
        tm_log_set_sink(NULL, NULL);
        if (!eng)
            return;
        n_block[f] = eng->opts.n_kv_block;
        char want[128];
        snprintf(want, sizeof(want), "= %llu tokens of %s KV",
                 (unsigned long long)n_block[f] * BLOCK, f ? "fp8 e4m3" : "bf16");
        TM_CHECK_MSG(strstr(g_log, want) != NULL, "no '%s' in the log:\n%s", want, g_log);
        fputs(g_log, stderr);
        tm_engine_destroy(eng);
    }
    const double ratio = (double)n_block[1] / n_block[0];
    fprintf(stderr, "  KV pool from the same memory: bf16 %u blocks, fp8 %u blocks (x%.4f)\n",
            n_block[0], n_block[1], ratio);
    TM_CHECK(ratio > 1.99 && ratio < 2.01);
}

// Block scales other than 128 x 128 are refused with a message naming the tensor.
static void test_fp8_bad_block(void) {
    char dir[] = "/tmp/tm_engine_cuda_XXXXXX", cmd[1024];
    TM_CHECK(mkmodel(dir,
                     "--layers 1 --hidden 128 --heads 4 --kv-heads 2 --ff 256 --vocab 300 "
                     "--ctx 1024 --quant fp8-block --quant-block 32 --seed 17",
                     cmd, sizeof(cmd)) == 0);
    tm_err err = {0};
    tm_model *m = NULL;
    tm_engine *gpu = NULL;
    TM_CHECK_OK(tm_model_load(dir, &m, &err), &err);
    tm_engine_opts eo = {
        .block_size = BLOCK, .n_kv_block = 16, .max_seqs = 2, .max_batched_tokens = 64};
    if (m) {
        TM_CHECK(tm_engine_cuda_create(m, &eo, &gpu, &err) == TM_E_INVAL && !gpu);
        TM_CHECK_MSG(strstr(err.msg, "q_proj") && strstr(err.msg, "128 x 128"), "%s", err.msg);
    }
    tm_model_destroy(m);
    TM_CHECK(rmdir_all(dir) == 0);
}

// kv_copy: B shares A's first 20 tokens; B takes A's full block 0 and a copy of the 4 computed
// slots of A's block 1, then computes its own 3 tokens. Its logits must match C, which computes
// all 23 tokens itself.
static void kv_copy_case(tm_kv_dtype kvt) {
    char dir[] = "/tmp/tm_engine_cuda_XXXXXX", cmd[1024];
    TM_CHECK(mkmodel(dir,
                     "--layers 2 --hidden 128 --heads 4 --kv-heads 2 --ff 256 --vocab 300 "
                     "--ctx 1024 --seed 9",
                     cmd, sizeof(cmd)) == 0);
    tm_err err = {0};
    tm_model *m = NULL;
    tm_engine *gpu = NULL;
    TM_CHECK_OK(tm_model_load(dir, &m, &err), &err);
    tm_engine_opts eo = {.block_size = BLOCK,
                         .n_kv_block = 16,
                         .max_seqs = 2,
                         .max_batched_tokens = 64,
                         .kv_dtype = kvt};
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
    fprintf(stderr, "  kv_copy (%s KV): max |logit B - logit C| / max |C| = %.3g\n",
            tm_kv_dtype_name(kvt), max_d / max_c);
    TM_CHECK(max_d / max_c < LOGIT_TOL);
    TM_CHECK(same);
    TM_CHECK(gpu->ops->kv_copy(gpu, 16, 0, 1, &err) == TM_E_INVAL); // block out of range
    tm_engine_destroy(gpu);
    tm_model_destroy(m);
    TM_CHECK(rmdir_all(dir) == 0);
}

// fp8 KV: the copy moves e4m3 bytes (half the bytes per slot)
static void test_kv_copy(void) {
    kv_copy_case(TM_KV_DTYPE_AUTO);
    kv_copy_case(TM_KV_DTYPE_FP8);
}

static void test_no_gpu_error(void) {
    // With a GPU present create succeeds; this only checks that bad opts are rejected cleanly.
    tm_model m = {0};
    tm_engine_opts eo = {.block_size = 16};
    tm_engine *eng = NULL;
    tm_err err = {0};
    TM_CHECK(tm_engine_cuda_create(&m, &eo, &eng, &err) == TM_E_INVAL && eng == NULL);
}

int main(void) {
    g_rng = 77;
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        // The engine must say so clearly.
        tm_model m = {.cfg = {.n_layer = 1,
                              .n_embd = 8,
                              .n_ff = 8,
                              .n_head = 1,
                              .n_kv_head = 1,
                              .head_dim = 8,
                              .n_vocab = 8,
                              .rope_theta = 1e4f}};
        tm_engine_opts eo = {
            .block_size = 16, .n_kv_block = 4, .max_seqs = 1, .max_batched_tokens = 8};
        tm_engine *eng = NULL;
        tm_err err = {0};
        tm_rc rc = tm_engine_cuda_create_random(&m, &eo, 1, &eng, &err);
        fprintf(stderr, "without a GPU: %s: %s\n", tm_rc_name(rc), err.msg);
        if (rc != TM_E_CUDA || !strstr(err.msg, "no GPU found"))
            return 1;
        tm_test_skip("no CUDA device");
    }
    const char *build = getenv("TM_BUILD");
    char path[1024];
    snprintf(path, sizeof(path), "%s/mkmodel", build ? build : "build");
    if (access(path, X_OK) != 0)
        tm_test_skip("mkmodel not built (set TM_BUILD)");
    TM_RUN(test_no_gpu_error);
    TM_RUN(test_kv_copy);
    TM_RUN(test_llama);
    TM_RUN(test_qwen2_tied);
    TM_RUN(test_llama3_f32);
    TM_RUN(test_f16);
    TM_RUN(test_fp8_block);
    TM_RUN(test_fp8_block_ue8m0);
    TM_RUN(test_fp8_block_w8a8);
    TM_RUN(test_fp8_block_ue8m0_w8a8);
    TM_RUN(test_fp8_channel);
    TM_RUN(test_fp8_tensor_static);
    TM_RUN(test_fp8_bad_block);
    TM_RUN(test_kv_fp8_hd32);
    TM_RUN(test_kv_fp8_hd128);
    TM_RUN(test_kv_fp8_hd64_qwen2);
    TM_RUN(test_kv_fp8_weights_fp8);
    TM_RUN(test_kv_fp8_pool);
    return tm_test_report();
}

#endif /* TM_HAVE_CUDA */
