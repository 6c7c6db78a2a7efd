/* tests/gpu/test_dsv4_tp_cuda.c - DeepSeek-V4 tensor parallel on the CUDA engine
 * (runner/engine/cuda/dsv4.c, split as runner/tp/shard.h tm_shard_dsv4_split) against the
 * single-GPU CUDA engine, checkable on ONE GPU: rank 0 is this process, ranks 1 .. W-1 are this
 * binary started again with --rank, all joined through the TCP rendezvous; by default every rank
 * is on device 0 and the all-reduces go over host shared memory (TM_TP_COMM=host, the
 * correctness transport of runner/tp/tp_host.h: NCCL refuses two ranks on one device). With
 * TM_TP_COMM=nccl, rank r runs on device r over NCCL instead (TP2 with 2 GPUs, TP4 with 4).
 *
 * Per small random mkmodel DeepSeek-V4 model (every attention kind, hyper-connections 4 and 2,
 * bf16 and f32 checkpoints, tied embeddings, a vocabulary that splits unevenly; 4 heads in 4
 * output groups, expert width 64, so TP4 holds one head, one group and 16 channels of every
 * expert per rank): the schedule of tests/gpu/tm_gpu_compare.h (prefill chunks with and without
 * logits, prefills mixed with decodes, 72 decode steps, batch 4 then 3) runs on TP1 and on TP2
 * and TP4, all fed TP1's greedy tokens. Every step runs twice on TPn, through the vtable (fp32
 * logits gathered from the vocabulary slices) and through forward_greedy (per-rank argmax
 * candidates merged on the device). Checks, as test_dsv4_cuda's single-GPU bounds: tie-free
 * models (hash-routed MoE, the indexer's top-k above every entry count) keep every row within
 * LOGIT_TOL x the row's max |logit| of TP1's (TP changes only the fp32 summation order of the
 * split products: o_b, the expert down projections, the vocab-parallel embedding is exact); a
 * model with top-k routing and an indexer top-k of 8 may have at most 8 rows beyond it (a near
 * tie in a discrete choice); everywhere a greedy token may differ only at a near tie (TP1's
 * top-2 margin below twice the row's error), and the device greedy equals the argmax of the
 * gathered logits. Then kv_copy on TPn = on TP1. Skipped (77) without CUDA, a GPU, or mkmodel.
 * TM_DSV4_TP_ONLY=name runs one case. */
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tm_test.h"

#ifndef TM_HAVE_CUDA
int main(void) { tm_test_skip("built without CUDA"); }
#else

#include <cuda_runtime_api.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "runner/engine/cuda/engine_cuda.h"
#include "runner/engine/engine.h"
#include "runner/model/model.h"
#include "runner/tp/rendezvous.h"
#include "runner/tp/tp_nccl.h"
#include "tm_gpu_compare.h"

#define SPARE_BLOCK SEQ_BLOCKS /* one block beyond the sequences' */
#define MAX_W 4

static int host_mode(void) {
    const char *e = getenv("TM_TP_COMM");
    return !(e && strcmp(e, "nccl") == 0);
}

static tm_engine_opts engine_opts(uint32_t tp) {
    return (tm_engine_opts){.block_size = BLOCK,
                            .n_kv_block = SPARE_BLOCK + 2,
                            .max_seqs = N_SEQ,
                            .max_batched_tokens = 256,
                            .tp_size = tp};
}

static tm_engine_cuda_tp tp_cfg(uint32_t rank, tm_rdzv *rdzv, const uint8_t *id) {
    return (tm_engine_cuda_tp){.device = host_mode() ? 0 : (int)rank,
                               .rdzv = rdzv,
                               .nccl_id = id,
                               .timeout_ms = 120000,
                               .host_comm = host_mode()};
}

/* ---- ranks > 0: this binary with --rank R W PORT DIR ---- */
static int rank_main(uint32_t rank, uint32_t world, uint16_t port, const char *dir) {
    tm_err err = {0};
    tm_model *m = NULL;
    tm_rdzv *rdzv = NULL;
    tm_engine *eng = NULL;
    uint8_t id[TM_NCCL_ID_BYTES];
    size_t len = 0;
    tm_rdzv_cfg rc_cfg = {
        .addr = "127.0.0.1", .port = port, .rank = rank, .world = world, .timeout_ms = 60000};
    tm_rc rc = tm_model_load(dir, &m, &err);
    if (!rc)
        rc = tm_rdzv_join(&rc_cfg, &rdzv, id, sizeof(id), &len, &err);
    tm_engine_opts eo = engine_opts(world);
    eo.tp_rank = rank;
    tm_engine_cuda_tp tp = tp_cfg(rank, rdzv, id);
    if (!rc)
        rc = tm_engine_cuda_tp_create(m, &eo, &tp, &eng, &err);
    if (!rc)
        rc = tm_engine_cuda_tp_serve(eng, &err);
    if (rc)
        fprintf(stderr, "rank %u of %u: %s\n", rank, world, err.msg);
    tm_engine_destroy(eng);
    tm_rdzv_close(rdzv);
    tm_model_destroy(m);
    return rc ? 1 : 0;
}

/* Rank 0's side of a TPn engine. */
typedef struct tpn {
    tm_engine *eng;
    tm_rdzv *rdzv;
    uint32_t world;
    pid_t kid[MAX_W];
} tpn;

/* Destroy (stops the other ranks); 0 when every rank exited cleanly. */
static int tpn_close(tpn *t) {
    tm_engine_destroy(t->eng);
    t->eng = NULL;
    tm_rdzv_close(t->rdzv);
    t->rdzv = NULL;
    int bad = 0;
    for (uint32_t r = 1; r < t->world; r++) {
        int st = 0;
        if (t->kid[r] > 0 && waitpid(t->kid[r], &st, 0) == t->kid[r])
            bad += !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
        else
            bad++;
        t->kid[r] = 0;
    }
    return bad;
}

/* Start a TPn engine on dir's model (m: rank 0's copy). With cerr, the engine create's error is
 * returned there instead of failing the test (a refusal the caller expects). */
static int tpn_open(const char *dir, const tm_model *m, uint32_t world, tpn *t, tm_err *cerr) {
    tm_err err = {0};
    memset(t, 0, sizeof(*t));
    t->world = world;
    uint8_t id[TM_NCCL_ID_BYTES];
    tm_rdzv_cfg c = {
        .addr = "127.0.0.1", .port = 0, .rank = 0, .world = world, .timeout_ms = 60000};
    if (host_mode()) { // any unique bytes name the shared segment; no NCCL needed
        uint64_t x = (uint64_t)getpid() * 0x9e3779b97f4a7c15ull ^ (uint64_t)tm_now_ms();
        for (int i = 0; i < TM_NCCL_ID_BYTES; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            id[i] = (uint8_t)(x >> 56);
        }
    } else {
        TM_CHECK_OK(tm_nccl_get_id(id, &err), &err);
    }
    TM_CHECK_OK(tm_rdzv_listen(&c, &t->rdzv, &err), &err);
    if (!t->rdzv)
        return 0;
    char port[16], ws[16], rs[16];
    snprintf(port, sizeof(port), "%u", tm_rdzv_port(t->rdzv));
    snprintf(ws, sizeof(ws), "%u", world);
    for (uint32_t r = 1; r < world; r++) {
        snprintf(rs, sizeof(rs), "%u", r);
        fflush(NULL);
        t->kid[r] = fork();
        if (t->kid[r] == 0) {
            execl("/proc/self/exe", "test_dsv4_tp_cuda", "--rank", rs, ws, port, dir, (char *)NULL);
            _exit(127);
        }
    }
    TM_CHECK_OK(tm_rdzv_accept(t->rdzv, id, sizeof(id), &err), &err);
    tm_engine_opts eo = engine_opts(world);
    tm_engine_cuda_tp tp = tp_cfg(0, t->rdzv, id);
    if (err.rc == TM_OK && cerr)
        tm_engine_cuda_tp_create(m, &eo, &tp, &t->eng, cerr);
    else if (err.rc == TM_OK)
        TM_CHECK_OK(tm_engine_cuda_tp_create(m, &eo, &tp, &t->eng, &err), &err);
    if (!t->eng)
        tpn_close(t); // the other ranks see EOF (or fail the same way) and exit
    return t->eng != NULL;
}

/* The case and TP size being compared, and the schedule step, for the failure lines. */
static const char *g_case = "";
static uint32_t g_world, g_step, g_n_told;

static int step(tm_engine *tp1, tm_engine *tpe, seq *S, const uint32_t *which,
                const uint32_t *n_tok, uint32_t n_chunk, uint32_t V, stats *st) {
    tm_batch_seq bs[N_SEQ];
    uint32_t want_seq[N_SEQ];
    const uint32_t n_want = step_batch(S, which, n_tok, n_chunk, bs, want_seq);
    tm_batch b = {.seqs = bs, .n_seq = n_chunk};
    float *l1 = malloc((size_t)N_SEQ * V * 4), *l2 = malloc((size_t)N_SEQ * V * 4);
    uint32_t ids1[N_SEQ], ids2[N_SEQ];
    tm_err err = {0};
    int ok = 1;
    TM_ASSERT(l1 && l2);
    CHECK_CALL(ok, tm_engine_forward(tp1, &b, l1, &err), &err);
    CHECK_CALL(ok, tm_engine_cuda_forward_greedy(tp1, &b, ids1, &err), &err);
    CHECK_CALL(ok, tm_engine_forward(tpe, &b, l2, &err), &err);
    CHECK_CALL(ok, tm_engine_cuda_forward_greedy(tpe, &b, ids2, &err), &err);
    for (uint32_t r = 0; ok && r < n_want; r++) {
        const float *a = l1 + (size_t)r * V, *g = l2 + (size_t)r * V;
        double md = 0, mx = 0;
        for (uint32_t v = 0; v < V; v++) {
            md = fmax(md, fabs((double)a[v] - g[v]));
            mx = fmax(mx, fabs((double)a[v]));
        }
        if (!(md <= LOGIT_TOL * mx) && g_n_told++ < 8) // the first few, to place a failure
            fprintf(stderr,
                    "%s TP%u step %u seq %u (row %u of %u): max err %.3g of max |logit| %.3g "
                    "(%.3g > tol %.2g); greedy tp1 %u tpn %u\n",
                    g_case, g_world, g_step, want_seq[r], r, n_want, md, mx, md / mx, LOGIT_TOL,
                    ids1[r], ids2[r]);
        compare_row(st, "tp1", a, ids1[r], "tpn", g, ids2[r], V);
        st->n_dev_diff += ids2[r] != argmax(g, V) || ids1[r] != argmax(a, V);
        seq_append(&S[want_seq[r]], ids1[r]); // both engines continue with TP1's token
    }
    step_done(S, which, n_tok, n_chunk);
    free(l1);
    free(l2);
    return ok;
}

static void schedule(tm_engine *tp1, tm_engine *tpe, uint32_t V, stats *st) {
    static seq S[N_SEQ];
    g_rng = 91;
    seqs_init(S, V);
    int ok = 1;
    for (uint32_t k = 0; ok && k < N_STEP; k++) {
        uint32_t which[N_SEQ], n_tok[N_SEQ];
        const uint32_t n_chunk = sched_step(k, which, n_tok);
        g_step = k;
        ok = step(tp1, tpe, S, which, n_tok, n_chunk, V, st);
        if (!ok)
            fprintf(stderr, "%s TP%u: step %u failed (the error above)\n", g_case, g_world, k);
    }
    TM_CHECK(ok);
    // kv_copy of seq 1's first block into the spare one, continued by a new sequence
    tm_err err = {0};
    TM_CHECK_OK(tp1->ops->kv_copy(tp1, S[1].bt[0], SPARE_BLOCK, BLOCK, &err), &err);
    TM_CHECK_OK(tpe->ops->kv_copy(tpe, S[1].bt[0], SPARE_BLOCK, BLOCK, &err), &err);
    uint32_t bt[2] = {SPARE_BLOCK, SPARE_BLOCK + 1}, extra[3] = {1, 2, 3};
    tm_batch_seq e = {.tokens = extra,
                      .n_tok = 3,
                      .pos = BLOCK,
                      .block_table = bt,
                      .n_block = 2,
                      .want_logits = 1};
    float *a = malloc((size_t)V * 4), *g = malloc((size_t)V * 4);
    TM_ASSERT(a && g);
    TM_CHECK_OK(tm_engine_forward(tp1, &(tm_batch){.seqs = &e, .n_seq = 1}, a, &err), &err);
    TM_CHECK_OK(tm_engine_forward(tpe, &(tm_batch){.seqs = &e, .n_seq = 1}, g, &err), &err);
    double md = 0, mx = 0;
    for (uint32_t v = 0; v < V; v++) {
        md = fmax(md, fabs((double)a[v] - g[v]));
        mx = fmax(mx, fabs((double)a[v]));
    }
    TM_CHECK_MSG(md <= LOGIT_TOL * mx && argmax(a, V) == argmax(g, V),
                 "%s TP%u kv_copy: max err %.3g of max |logit| %.3g", g_case, g_world, md, mx);
    free(a), free(g);
}

/* name's model (mkmodel args) on TP1, then TP2 and TP4 compared with it; tie_free: no row may be
 * beyond LOGIT_TOL. With refuse4, TP4 is not compared but must be refused at create with a
 * message containing refuse4 (a slice that does not align to the quantization blocks). */
static void run_case_q(const char *name, const char *args, int tie_free, const char *refuse4) {
    const char *only = getenv("TM_DSV4_TP_ONLY");
    if (only && strcmp(only, name) != 0)
        return;
    char dir[] = "/tmp/tm_dsv4_tp_XXXXXX", cmd[1024];
    if (mkmodel(dir, args, cmd, sizeof(cmd)) != 0) {
        fprintf(stderr, "%s: mkmodel failed: %s\n", name, cmd);
        TM_CHECK(0);
        return;
    }
    tm_err err = {0};
    tm_model *m = NULL;
    tm_engine *tp1 = NULL;
    TM_CHECK_OK(tm_model_load(dir, &m, &err), &err);
    tm_engine_opts eo = engine_opts(1);
    if (m)
        TM_CHECK_OK(tm_engine_cuda_create(m, &eo, &tp1, &err), &err);
    const uint32_t worlds[2] = {2, 4};
    for (int wi = 0; tp1 && wi < 2; wi++) {
        const uint32_t W = worlds[wi];
        if (!host_mode() && (int)W > tm_engine_cuda_n_devices()) {
            fprintf(stderr, "%s TP%u: not run (NCCL needs %u GPUs)\n", name, W, W);
            continue;
        }
        tpn t;
        if (refuse4 && W == 4) {
            tm_err ce = {0};
            const int opened = tpn_open(dir, m, W, &t, &ce);
            fprintf(stderr, "%s TP4: create %s: %s\n", name, opened ? "succeeded" : "refused",
                    opened ? "(a refusal was expected)" : ce.msg);
            TM_CHECK_MSG(!opened && ce.rc == TM_E_INVAL && strstr(ce.msg, refuse4),
                         "%s TP4: expected a refusal containing \"%s\", got rc %d: %s", name,
                         refuse4, (int)ce.rc, ce.msg);
            if (opened)
                tpn_close(&t);
            continue;
        }
        if (!tpn_open(dir, m, W, &t, NULL)) {
            TM_CHECK_MSG(0, "%s: TP%u did not start (the rank's error above)", name, W);
            continue;
        }
        g_case = name, g_world = W, g_n_told = 0;
        stats st = {0};
        const double t0 = tm_now_ms();
        schedule(tp1, t.eng, m->cfg.n_vocab, &st);
        fprintf(stderr,
                "%s TP%u (%s, %s): %d logit rows, max err / row max|logit| %.3g (tol %.2g), %d "
                "over; greedy %d/%d equal (%d not near a tie); device greedy vs argmax: %d "
                "differ; %.0f ms\n",
                name, W, host_mode() ? "one GPU, host all-reduce" : "NCCL",
                tie_free ? "tie-free" : "with discrete choices", st.n_rows, st.max_rel, LOGIT_TOL,
                st.n_bad_rows, st.n_greedy - st.n_greedy_diff, st.n_greedy, st.n_clear_flip,
                st.n_dev_diff, tm_now_ms() - t0);
        TM_CHECK(st.n_rows >= N_DECODE * 3);
        if (tie_free)
            TM_CHECK_MSG(st.n_bad_rows == 0, "%s TP%u: %d rows beyond tolerance", name, W,
                         st.n_bad_rows);
        else
            TM_CHECK_MSG(st.n_bad_rows <= 8, "%s TP%u: %d rows beyond tolerance", name, W,
                         st.n_bad_rows);
        TM_CHECK_MSG(st.n_clear_flip == 0, "%s TP%u: %d greedy tokens differ (%d not near a tie)",
                     name, W, st.n_greedy_diff, st.n_clear_flip);
        TM_CHECK(st.n_dev_diff == 0);
        TM_CHECK_MSG(tpn_close(&t) == 0, "%s TP%u: a rank did not exit cleanly", name, W);
    }
    tm_engine_destroy(tp1);
    tm_model_destroy(m);
    TM_CHECK(rmdir_all(dir) == 0);
}

static void run_case(const char *name, const char *args, int tie_free) {
    run_case_q(name, args, tie_free, NULL);
}

/* 4 heads in 4 output groups, expert width 64: splits 2 and 4 ways */
#define COMMON                                                                                     \
    "--arch deepseek_v4 --hidden 128 --heads 4 --head-dim 64 --rope-dim 16 --q-lora 64 "           \
    "--o-groups 4 --o-lora 32 --ff 64 --ctx 1024 --window 32 --index-heads 16 --index-dim 32 "
#define TOPK8 "--index-topk 8 "
#define TOPK_ALL "--index-topk 512 "
#define MIX "--layers 4 --dsv4-layers schc --hc 4 --experts 8 --experts-used 2 --hca-ratio 16 "
#define HC2                                                                                        \
    "--layers 3 --dsv4-layers hcs --hc 2 --experts 6 --experts-used 3 --hca-ratio 8 --tied 1 "     \
    "--yarn 0 "

// every layer kind, 4 streams, bf16, hash MoE, every entry selected
static void test_mix_tie_free(void) {
    run_case("mix-hc4-bf16-tie-free",
             COMMON TOPK_ALL MIX "--vocab 512 --dsv4-mlp hhhh --dtype bf16 --seed 31", 1);
}
// 2 streams, tied embeddings, an f32 checkpoint, vocabulary 509 (TP4: 128, 128, 128, 125)
static void test_hc2_odd_vocab(void) {
    run_case("hc2-f32-tied-vocab509-tie-free",
             COMMON TOPK_ALL HC2 "--vocab 509 --dsv4-mlp hhh --dtype f32 --seed 37", 1);
}
// top-k routing and the indexer picking 8 entries: discrete choices
static void test_mix_topk(void) {
    run_case("mix-hc4-bf16-topk", COMMON TOPK8 MIX "--vocab 512 --dsv4-mlp hhmm --seed 32", 0);
}

/* Quantized checkpoints (docs/deepseek_v4.md "CUDA tensor parallel"): 8 heads x 64 in 4 output
 * groups of o_lora 128, expert width 512, so a TP4 rank holds 128 q_b rows, 128 o_b columns and
 * 128 channels of every expert: whole 128 x 128 FP8 blocks (the FP8 decode GEMMs run on the
 * sliced codes) and whole 32-value MXFP4 groups. The same configs run on the CPU engine's TP in
 * tests/unit/test_dsv4_tp.c. */
#define QCOMMON                                                                                    \
    "--arch deepseek_v4 --hidden 128 --heads 8 --head-dim 64 --rope-dim 16 --q-lora 64 "           \
    "--o-groups 4 --o-lora 128 --ctx 1024 --window 32 --index-heads 16 --index-dim 32 "
#define FP8_MSG "do not align to the FP8 128 x 128 scale blocks"
#define MXFP4_MSG "do not align to the 32-value scale groups"

// FP8 block-scaled dense (fp32 scales) + MXFP4 routed experts, every layer kind, tie-free
static void test_fp8_mxfp4(void) {
    run_case("fp8-mxfp4-mix-hc4-tie-free",
             QCOMMON TOPK_ALL MIX "--ff 512 --vocab 512 --dsv4-mlp hhhh --dtype bf16 --quant "
                                  "fp8-block --expert-dtype fp4 --seed 41",
             1);
}
// FP8 with e8m0 scales, FP8 routed experts (dequantized slices), top-k routing, indexer top-8
static void test_fp8_ue8m0_topk(void) {
    run_case("fp8ue8m0-fp8experts-hc2-topk",
             QCOMMON TOPK8 HC2 "--ff 512 --vocab 509 --dsv4-mlp hmm --dtype bf16 --quant "
                               "fp8-block-ue8m0 --expert-dtype fp8 --seed 42",
             0);
}
// expert width 256: TP2's 128 channels are whole FP8 blocks and run; TP4's 64 are refused
static void test_fp8_misaligned(void) {
    run_case_q("fp8-mxfp4-ff256-tp4-misaligned",
               QCOMMON TOPK_ALL "--layers 2 --dsv4-layers sc --hc 2 --experts 4 --experts-used 2 "
                                "--ff 256 --vocab 512 --dsv4-mlp hh --dtype bf16 --quant fp8-block "
                                "--expert-dtype fp4 --seed 43",
               1, FP8_MSG);
}
// FP8 in 16 x 16 blocks (no FP8 GEMM: dequantized slices at any offset) + MXFP4 experts of width
// 64: TP2's 32 channels are one scale group and run; TP4's 16 are refused
static void test_mxfp4_misaligned(void) {
    run_case_q("fp8b16-mxfp4-ff64-tp4-misaligned",
               COMMON TOPK_ALL "--layers 2 --dsv4-layers sh --hc 2 --experts 4 --experts-used 2 "
                               "--hca-ratio 16 --vocab 512 --dsv4-mlp hh --dtype bf16 --quant "
                               "fp8-block --quant-block 16 --expert-dtype fp4 --seed 44",
               1, MXFP4_MSG);
}

/* TM_DSV4_TP_CASES="name=mkmodel args;name=args;...": extra tie-free cases after the built-in
 * ones (bisecting a failing config on the GPU machine without a rebuild); TM_DSV4_TP_ONLY=none
 * skips the built-in ones. */
static void run_env_cases(void) {
    const char *env = getenv("TM_DSV4_TP_CASES");
    if (!env)
        return;
    unsetenv("TM_DSV4_TP_ONLY");
    char *all = tm_strdup(env), *save = NULL;
    TM_ASSERT(all);
    for (char *c = strtok_r(all, ";", &save); c; c = strtok_r(NULL, ";", &save)) {
        char *eq = strchr(c, '=');
        if (!eq)
            continue;
        *eq = 0;
        run_case(c, eq + 1, 1);
    }
    tm_free(all);
}

int main(int argc, char **argv) {
    if (argc == 6 && !strcmp(argv[1], "--rank"))
        return rank_main((uint32_t)atoi(argv[2]), (uint32_t)atoi(argv[3]), (uint16_t)atoi(argv[4]),
                         argv[5]);
    signal(SIGPIPE, SIG_IGN);
    g_rng = 91;
    const int n_dev = tm_engine_cuda_n_devices();
    if (n_dev < 1)
        tm_test_skip("no CUDA device");
    if (!host_mode() && n_dev < 2)
        tm_test_skip("TM_TP_COMM=nccl needs 2 GPUs (4 for TP4)");
    const char *build = getenv("TM_BUILD");
    char path[1024];
    snprintf(path, sizeof(path), "%s/mkmodel", build ? build : "build");
    if (access(path, X_OK) != 0)
        tm_test_skip("mkmodel not built (set TM_BUILD)");
    fprintf(stderr, "test_dsv4_tp_cuda: %d GPU(s); TP ranks %s\n", n_dev,
            host_mode() ? "share GPU 0, all-reduce over host memory (correctness mode)"
                        : "one GPU each, NCCL");
    TM_RUN(test_mix_tie_free);
    TM_RUN(test_hc2_odd_vocab);
    TM_RUN(test_mix_topk);
    TM_RUN(test_fp8_mxfp4);
    TM_RUN(test_fp8_ue8m0_topk);
    TM_RUN(test_fp8_misaligned);
    TM_RUN(test_mxfp4_misaligned);
    TM_RUN(run_env_cases);
    return tm_test_report();
}

#endif /* TM_HAVE_CUDA */
