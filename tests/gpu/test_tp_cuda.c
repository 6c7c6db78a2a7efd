/* tests/gpu/test_tp_cuda.c - tensor parallel over NCCL (runner/engine/cuda/engine_cuda.h
 * tm_engine_cuda_tp_create) against the single-GPU CUDA engine, one process per GPU: rank 0 is this
 * process (device 0), rank 1 is this binary started again with --rank (device 1), joined through
 * the TCP rendezvous (runner/tp/rendezvous.h) that hands it the NCCL id, and serving rank 0's step
 * plans.
 *
 * Per mkmodel model (GQA with split KV heads; Qwen2 with q/k/v bias and tied embeddings; one KV
 * head, replicated on both ranks; an odd vocabulary that splits unevenly): the schedule of
 * tests/gpu/tm_gpu_compare.h that test_engine_cuda also runs (prefill chunks with and without
 * logits, prefills mixed with decodes, then 72 decode steps that replay CUDA graphs, batch 4 then
 * 3) runs on TP1 and TP2, both fed TP1's greedy tokens. Every step runs twice on TP2, through the
 * vtable (fp32 logits gathered from the vocabulary slices) and through forward_greedy (per-rank
 * argmax candidates merged on the device); running a step twice rewrites the same K/V, so both see
 * the same state. Checks: logits within 0.03 x the row's max |logit| of TP1's (both are bf16
 * engines; only the fp32 summation order of the split GEMMs differs), TP2's greedy tokens equal
 * TP1's at every step (>= 64 decode steps per sequence) except at near ties (TP1's top-2 margin
 * below twice the row's logit error; the count of those is printed), device greedy = argmax of the
 * gathered logits, kv_copy on TP2 = on TP1. Then a graph-less TP2 engine, and the failure path:
 * rank 1 is killed mid-run and rank 0's next step must fail within seconds with a message naming
 * rank 1, without hanging. Skipped (77) without CUDA, without a GPU, or without mkmodel.
 *
 * With TM_TP_COMM=host, or when only one GPU is visible, both ranks share device 0 and all-reduce
 * over host shared memory (runner/tp/tp_host.h): the same checks of the sharding (no CUDA
 * graphs in that mode; the NCCL init timeout is not run). */
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

#include "base/clock.h"
#include "runner/engine/engine.h"
#include "runner/engine/cuda/engine_cuda.h"
#include "runner/model/model.h"
#include "runner/tp/rendezvous.h"
#include "runner/tp/tp_nccl.h"
#include "tm_gpu_compare.h"

#define SPARE_BLOCK SEQ_BLOCKS /* one block beyond the sequences' */

/* 1: ranks share device 0 and all-reduce over host memory (TM_TP_COMM=host, inherited by rank 1) */
static int host_mode(void) {
    const char *e = getenv("TM_TP_COMM");
    return e && strcmp(e, "host") == 0;
}

static tm_engine_opts engine_opts(uint32_t tp) {
    return (tm_engine_opts){.block_size = BLOCK,
                            .n_kv_block = SPARE_BLOCK + 2,
                            .max_seqs = N_SEQ,
                            .max_batched_tokens = 256,
                            .tp_size = tp};
}

/* ---- rank 1: this binary with --rank 1 --port P --model DIR ---- */
static int rank_main(uint32_t rank, uint16_t port, const char *dir) {
    tm_err err = {0};
    tm_model *m = NULL;
    tm_rdzv *rdzv = NULL;
    tm_engine *eng = NULL;
    uint8_t id[TM_NCCL_ID_BYTES];
    size_t len = 0;
    tm_rdzv_cfg rc_cfg = {
        .addr = "127.0.0.1", .port = port, .rank = rank, .world = 2, .timeout_ms = 60000};
    tm_rc rc = tm_model_load(dir, &m, &err);
    if (!rc)
        rc = tm_rdzv_join(&rc_cfg, &rdzv, id, sizeof(id), &len, &err);
    tm_engine_opts eo = engine_opts(2);
    eo.tp_rank = rank;
    tm_engine_cuda_tp tp = {.device = host_mode() ? 0 : (int)rank,
                            .rdzv = rdzv,
                            .nccl_id = id,
                            .timeout_ms = 60000,
                            .host_comm = host_mode()};
    if (!rc)
        rc = tm_engine_cuda_tp_create(m, &eo, &tp, &eng, &err);
    if (!rc)
        rc = tm_engine_cuda_tp_serve(eng, &err);
    if (rc)
        fprintf(stderr, "rank %u: %s\n", rank, err.msg);
    tm_engine_destroy(eng);
    tm_rdzv_close(rdzv);
    tm_model_destroy(m);
    return rc ? 1 : 0;
}

/* Rank 0's side of a TP2 engine: start rank 1, rendezvous, create. */
typedef struct tp2 {
    tm_engine *eng;
    tm_rdzv *rdzv;
    pid_t kid;
} tp2;

/* Destroy (stops rank 1) and return rank 1's exit code. */
static int tp2_close(tp2 *t) {
    tm_engine_destroy(t->eng);
    tm_rdzv_close(t->rdzv);
    int st = 0;
    if (t->kid > 0 && waitpid(t->kid, &st, 0) == t->kid)
        return WIFEXITED(st) ? WEXITSTATUS(st) : 100 + WTERMSIG(st);
    return -1;
}

static int tp2_open(const char *dir, const tm_model *m, tp2 *t) {
    tm_err err = {0};
    memset(t, 0, sizeof(*t));
    uint8_t id[TM_NCCL_ID_BYTES];
    tm_rdzv_cfg c = {.addr = "127.0.0.1", .port = 0, .rank = 0, .world = 2, .timeout_ms = 60000};
    TM_CHECK_OK(tm_nccl_get_id(id, &err), &err);
    TM_CHECK_OK(tm_rdzv_listen(&c, &t->rdzv, &err), &err);
    if (!t->rdzv)
        return 0;
    char port[16];
    snprintf(port, sizeof(port), "%u", tm_rdzv_port(t->rdzv));
    fflush(NULL);
    t->kid = fork();
    if (t->kid == 0) {
        execl("/proc/self/exe", "test_tp_cuda", "--rank", "1", port, dir, (char *)NULL);
        _exit(127);
    }
    TM_CHECK_OK(tm_rdzv_accept(t->rdzv, id, sizeof(id), &err), &err);
    tm_engine_opts eo = engine_opts(2);
    tm_engine_cuda_tp tp = {
        .device = 0, .rdzv = t->rdzv, .nccl_id = id, .timeout_ms = 60000, .host_comm = host_mode()};
    if (err.rc == TM_OK)
        TM_CHECK_OK(tm_engine_cuda_tp_create(m, &eo, &tp, &t->eng, &err), &err);
    if (!t->eng)
        tp2_close(t); // rank 1 sees EOF and exits
    return t->eng != NULL;
}

static int step(tm_engine *tp1, tm_engine *tp2e, seq *S, const uint32_t *which,
                const uint32_t *n_tok, uint32_t n_chunk, uint32_t V, stats *st) {
    tm_batch_seq bs[N_SEQ];
    uint32_t want_seq[N_SEQ];
    const uint32_t n_want = step_batch(S, which, n_tok, n_chunk, bs, want_seq);
    tm_batch b = {.seqs = bs, .n_seq = n_chunk};
    float *l1 = malloc((size_t)N_SEQ * V * 4), *l2 = malloc((size_t)N_SEQ * V * 4);
    uint32_t ids1[N_SEQ], ids2[N_SEQ];
    tm_err err = {0};
    int ok = 1;
    CHECK_CALL(ok, tm_engine_forward(tp1, &b, l1, &err), &err);
    CHECK_CALL(ok, tm_engine_cuda_forward_greedy(tp1, &b, ids1, &err), &err);
    CHECK_CALL(ok, tm_engine_forward(tp2e, &b, l2, &err), &err);
    CHECK_CALL(ok, tm_engine_cuda_forward_greedy(tp2e, &b, ids2, &err), &err);
    for (uint32_t r = 0; ok && r < n_want; r++) {
        const float *a = l1 + (size_t)r * V, *g = l2 + (size_t)r * V;
        compare_row(st, "tp1", a, ids1[r], "tp2", g, ids2[r], V);
        st->n_dev_diff += ids2[r] != argmax(g, V) || ids1[r] != argmax(a, V);
        seq_append(&S[want_seq[r]], ids1[r]); // both engines continue with TP1's token
    }
    step_done(S, which, n_tok, n_chunk);
    free(l1);
    free(l2);
    return ok;
}

static double schedule(tm_engine *tp1, tm_engine *tp2e, uint32_t V, stats *st) {
    static seq S[N_SEQ];
    seqs_init(S, V);
    const double t0 = tm_now_ms();
    int ok = 1;
    for (uint32_t k = 0; ok && k < N_STEP; k++) {
        uint32_t which[N_SEQ], n_tok[N_SEQ];
        const uint32_t n_chunk = sched_step(k, which, n_tok);
        ok = step(tp1, tp2e, S, which, n_tok, n_chunk, V, st);
    }
    TM_CHECK(ok);
    // kv_copy: seq 1's first block (full) into the spare block; a new sequence that starts with
    // the same 16 tokens reads it and computes 3 more; TP1 and TP2 must agree.
    tm_err err = {0};
    TM_CHECK_OK(tp1->ops->kv_copy(tp1, S[1].bt[0], SPARE_BLOCK, BLOCK, &err), &err);
    TM_CHECK_OK(tp2e->ops->kv_copy(tp2e, S[1].bt[0], SPARE_BLOCK, BLOCK, &err), &err);
    uint32_t bt[2] = {SPARE_BLOCK, SPARE_BLOCK + 1}, extra[3] = {1, 2, 3};
    tm_batch_seq e = {.tokens = extra,
                      .n_tok = 3,
                      .pos = BLOCK,
                      .block_table = bt,
                      .n_block = 2,
                      .want_logits = 1};
    float *a = malloc((size_t)V * 4), *g = malloc((size_t)V * 4);
    TM_CHECK_OK(tm_engine_forward(tp1, &(tm_batch){.seqs = &e, .n_seq = 1}, a, &err), &err);
    TM_CHECK_OK(tm_engine_forward(tp2e, &(tm_batch){.seqs = &e, .n_seq = 1}, g, &err), &err);
    double md = 0, mx = 0;
    for (uint32_t v = 0; v < V; v++) {
        md = fmax(md, fabs((double)a[v] - g[v]));
        mx = fmax(mx, fabs((double)a[v]));
    }
    TM_CHECK(md <= LOGIT_TOL * mx && argmax(a, V) == argmax(g, V));
    free(a), free(g);
    return tm_now_ms() - t0;
}

static void run_model(const char *name, const char *args) {
    char dir[] = "/tmp/tm_tp_cuda_XXXXXX", cmd[1024];
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
    tp2 t;
    if (tp1 && tp2_open(dir, m, &t)) {
        stats st = {0};
        const uint32_t V = m->cfg.n_vocab;
        double ms = schedule(tp1, t.eng, V, &st);
        fprintf(stderr,
                "%s: %d logit rows, TP2 vs TP1 max err / row max|logit| %.3g (tol %.2g), %d over; "
                "greedy %d/%d equal (%d decode steps); device greedy vs argmax: %d differ; "
                "%.0f ms\n",
                name, st.n_rows, st.max_rel, LOGIT_TOL, st.n_bad_rows,
                st.n_greedy - st.n_greedy_diff, st.n_greedy, N_DECODE, st.n_dev_diff, ms);
        TM_CHECK(st.n_rows >= N_DECODE * 3);
        TM_CHECK(st.n_bad_rows == 0);
        // Both engines round GEMM inputs to bf16, and TP sums the split products in another
        // order: a flip is a bug only where TP1's top-2 margin is larger than that row's error.
        TM_CHECK_MSG(st.n_clear_flip == 0, "%s: %d greedy tokens differ (%d not near a tie)", name,
                     st.n_greedy_diff, st.n_clear_flip);
        TM_CHECK(st.n_dev_diff == 0);
        TM_CHECK_MSG(tp2_close(&t) == 0, "%s: rank 1 did not exit cleanly", name);
    }
    tm_engine_destroy(tp1);
    tm_model_destroy(m);
    TM_CHECK(rmdir_all(dir) == 0);
}

static void test_llama_gqa(void) { // 8 heads, 2 KV heads: one KV head per rank
    run_model("llama gqa", "--layers 3 --hidden 256 --heads 8 --kv-heads 2 --ff 512 --vocab 512 "
                           "--ctx 1024 --seed 3");
}
static void test_qwen2_tied(void) {
    run_model("qwen2 bias tied", "--arch qwen2 --tied 1 --layers 2 --hidden 128 --heads 4 "
                                 "--kv-heads 2 --ff 256 --vocab 300 --ctx 1024 --seed 4");
}
static void test_kv_replicated(void) { // 1 KV head: replicated on both ranks
    run_model("llama 1 kv head", "--layers 2 --hidden 256 --heads 4 --kv-heads 1 --ff 384 "
                                 "--vocab 400 --ctx 1024 --rope-scaling llama3 --seed 5");
}
static void test_odd_vocab(void) { // 509 = 255 + 254: uneven slices
    run_model("odd vocab", "--layers 2 --hidden 128 --heads 2 --kv-heads 2 --head-dim 64 "
                           "--ff 256 --vocab 509 --ctx 1024 --seed 6");
}

/* Eager TP2 (no graphs) must give the graphs' tokens; then kill rank 1 mid-run. */
static void test_no_graphs_and_dead_rank(void) {
    char dir[] = "/tmp/tm_tp_cuda_XXXXXX", cmd[1024];
    TM_CHECK(mkmodel(dir,
                     "--layers 2 --hidden 256 --heads 8 --kv-heads 2 --ff 512 --vocab 512 "
                     "--ctx 1024 --seed 8",
                     cmd, sizeof(cmd)) == 0);
    tm_err err = {0};
    tm_model *m = NULL;
    TM_CHECK_OK(tm_model_load(dir, &m, &err), &err);
    tp2 t;
    if (!m || !tp2_open(dir, m, &t)) {
        tm_model_destroy(m);
        return;
    }
    tm_engine *tp1 = NULL;
    tm_engine_opts eo = engine_opts(1);
    TM_CHECK_OK(tm_engine_cuda_create(m, &eo, &tp1, &err), &err);
    tm_engine_cuda_set_graphs(t.eng, 0);
    stats st = {0};
    if (tp1)
        schedule(tp1, t.eng, m->cfg.n_vocab, &st);
    fprintf(stderr, "  eager tp2: greedy %d/%d equal, max err %.3g\n",
            st.n_greedy - st.n_greedy_diff, st.n_greedy, st.max_rel);
    TM_CHECK(st.n_clear_flip == 0 && st.n_bad_rows == 0);
    tm_engine_cuda_set_graphs(t.eng, 1);

    // Kill rank 1; rank 0's next steps fail, naming it, within a few seconds.
    kill(t.kid, SIGKILL);
    int st_code = 0;
    waitpid(t.kid, &st_code, 0);
    t.kid = 0;
    uint32_t tok = 5, bt[2] = {0, 1}, ids[1];
    tm_batch_seq s = {
        .tokens = &tok, .n_tok = 1, .pos = 0, .block_table = bt, .n_block = 2, .want_logits = 1};
    const double t0 = tm_now_ms();
    tm_rc rc = TM_OK;
    for (int i = 0; i < 100 && rc == TM_OK; i++)
        rc = tm_engine_cuda_forward_greedy(t.eng, &(tm_batch){.seqs = &s, .n_seq = 1}, ids, &err);
    const double dt = tm_now_ms() - t0;
    fprintf(stderr, "  dead rank 1: rc %s after %.0f ms: %s\n", tm_rc_name(rc), dt, err.msg);
    TM_CHECK(rc != TM_OK && strstr(err.msg, "rank 1") != NULL);
    TM_CHECK(dt < 30000);
    // the engine stays dead, and destroying it does not hang
    TM_CHECK(tm_engine_cuda_forward_greedy(t.eng, &(tm_batch){.seqs = &s, .n_seq = 1}, ids, &err) !=
             TM_OK);
    const double t1 = tm_now_ms();
    tp2_close(&t);
    fprintf(stderr, "  destroy after the failure: %.0f ms\n", tm_now_ms() - t1);
    tm_engine_destroy(tp1);
    tm_model_destroy(m);
    TM_CHECK(rmdir_all(dir) == 0);
}

/* A rank that never joins NCCL: the others' create fails after the timeout with a message that
 * says so, instead of blocking forever (rank 0 of 2 alone on GPU 0, timeout 2 s). */
static void test_nccl_init_timeout(void) {
    tm_err err = {0};
    uint8_t id[TM_NCCL_ID_BYTES];
    TM_CHECK_OK(tm_nccl_get_id(id, &err), &err);
    TM_ASSERT(cudaSetDevice(0) == cudaSuccess);
    tm_nccl *c = NULL;
    const double t0 = tm_now_ms();
    tm_rc rc = tm_nccl_create(id, 0, 2, 2000, &c, &err);
    const double ms = tm_now_ms() - t0;
    TM_CHECK_MSG(rc == TM_E_NCCL && strstr(err.msg, "not complete after 2 s") && ms >= 1900 &&
                     ms < 4000,
                 "nccl init with a missing rank: rc %d after %.0f ms: %s", rc, ms, err.msg);
    fprintf(stderr, "  missing rank at NCCL init: rc %d after %.0f ms: %s\n", rc, ms, err.msg);
    tm_nccl_destroy(c);
}

int main(int argc, char **argv) {
    if (argc == 5 && !strcmp(argv[1], "--rank"))
        return rank_main((uint32_t)atoi(argv[2]), (uint16_t)atoi(argv[3]), argv[4]);
    signal(SIGPIPE, SIG_IGN);
    g_rng = 91;
    const int n_dev = tm_engine_cuda_n_devices();
    if (n_dev < 1)
        tm_test_skip("no GPU");
    if (n_dev < 2 && !host_mode()) { // one GPU: both ranks on it, host all-reduce
        fprintf(stderr, "test_tp_cuda: 1 GPU visible: 2 ranks share it (TM_TP_COMM=host)\n");
        setenv("TM_TP_COMM", "host", 1);
    }
    const int v = tm_nccl_version();
    fprintf(stderr, "NCCL runtime %d (headers %d), %d GPUs; all-reduce %s\n", v,
            tm_nccl_header_version(), n_dev,
            host_mode() ? "over host memory, ranks sharing GPU 0" : "NCCL, one GPU per rank");
    if (!host_mode())
        TM_RUN(test_nccl_init_timeout);
    TM_RUN(test_llama_gqa);
    TM_RUN(test_qwen2_tied);
    TM_RUN(test_kv_replicated);
    TM_RUN(test_odd_vocab);
    TM_RUN(test_no_graphs_and_dead_rank);
    return tm_test_report();
}
#endif
