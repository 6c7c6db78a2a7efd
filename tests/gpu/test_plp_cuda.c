/* tests/gpu/test_plp_cuda.c - scoring rows on the device (tm_engine_sample_row.score: prompt
 * logprobs and continuations, issue 22) against the CPU's tm_sample_logprobs on the logits of
 * bf16 test models that tools/mkmodel writes (Llama and Qwen2 shapes, random weights).
 *
 * Per model: 8 sequences of 96 random prompt tokens, computed one position per step (as the runner
 * computes a record with prompt logprobs); at each position engine A's forward_sample scores the
 * next prompt token (top 20, 5 or 0 alternatives by sequence; one sequence's row is a greedy
 * sampled row instead, mixing both kinds in one step) while engine B gives the same rows to the
 * host, where tm_sample_logprobs computes them. The argmax must be the CPU's, the scored token's
 * logprob and every alternative's within 1e-3 of the CPU's, the alternatives' ids equal (ties
 * excepted: an id swap between equal logits is not counted). Skipped (77) without a GPU, without
 * CUDA, or without mkmodel. */
#define _POSIX_C_SOURCE 200809L
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
#include "runner/sched/sample.h"

#define NS 8      /* sequences */
#define PROMPT 96 /* prompt tokens, all scored but the first */
#define BS 16     /* block size */

static uint64_t g_rng = 4242;
static uint32_t urand(uint32_t n) {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng % n);
}

typedef struct tally {
    uint64_t n_row, n_am_bad, n_lp_bad, n_top_bad;
    double max_err;
} tally;

static void run_model(const char *name, const char *args, tally *all) {
    char dir[] = "/tmp/tm_plp_cuda_XXXXXX", cmd[1024];
    const char *build = getenv("TM_BUILD");
    TM_ASSERT(mkdtemp(dir));
    snprintf(cmd, sizeof(cmd), "%s/mkmodel --out %s %s > /dev/null", build ? build : "build", dir,
             args);
    if (system(cmd) != 0) {
        TM_CHECK_MSG(0, "%s: mkmodel failed: %s", name, cmd);
        return;
    }
    tm_err err = {0};
    tm_model *m = NULL;
    TM_CHECK_OK(tm_model_load(dir, &m, &err), &err);
    if (!m)
        return;
    const uint32_t V = m->cfg.n_vocab, nb = TM_CEIL_DIV(PROMPT, BS);
    tm_engine_opts eo = {
        .block_size = BS, .n_kv_block = NS * nb, .max_seqs = NS, .max_batched_tokens = NS * 4};
    tm_engine *ea = NULL, *eb = NULL;
    TM_CHECK_OK(tm_engine_cuda_create(m, &eo, &ea, &err), &err);
    TM_CHECK_OK(tm_engine_cuda_create(m, &eo, &eb, &err), &err);
    if (!ea || !eb || !ea->ops->forward_sample) {
        TM_CHECK(0);
        return;
    }
    static uint32_t tok[NS][PROMPT], bt[NS][16];
    for (uint32_t i = 0; i < NS; i++) {
        for (uint32_t k = 0; k < PROMPT; k++)
            tok[i][k] = urand(V);
        for (uint32_t b = 0; b < nb; b++)
            bt[i][b] = i * nb + b;
    }
    float *logits = malloc((size_t)NS * V * 4);
    TM_ASSERT(logits);
    static const uint32_t tops[NS] = {20, 5, 0, 20, 5, 1, 20, 5};
    tally t = {0};
    tm_batch_seq seqs[NS];
    tm_engine_sample_row rows[NS];
    tm_engine_sample_out outs[NS];
    for (uint32_t k = 0; k + 1 < PROMPT; k++) { // position k scores token k + 1
        for (uint32_t i = 0; i < NS; i++) {
            seqs[i] = (tm_batch_seq){.tokens = tok[i] + k,
                                     .n_tok = 1,
                                     .pos = k,
                                     .block_table = bt[i],
                                     .n_block = nb,
                                     .want_logits = 1};
            rows[i] =
                (tm_engine_sample_row){.score = 1, .score_id = tok[i][k + 1], .n_top = tops[i]};
            if (i == 7 && k % 2) // a greedy sampled row in the same step
                rows[i] =
                    (tm_engine_sample_row){.p = {.temperature = 0.0f, .top_p = 1.0f, .top_k = -1},
                                           .want_lp = 1,
                                           .n_top = 5};
        }
        tm_batch b = {.seqs = seqs, .n_seq = NS};
        TM_CHECK_OK(tm_engine_forward(eb, &b, logits, &err), &err);
        memset(outs, 0, sizeof(outs));
        TM_CHECK_OK(ea->ops->forward_sample(ea, &b, V, rows, outs, &err), &err);
        if (err.rc)
            break;
        for (uint32_t i = 0; i < NS; i++) {
            const float *row = logits + (size_t)i * V;
            const uint32_t nt = rows[i].n_top;
            uint32_t cids[TM_ENGINE_MAX_TOP], am;
            float clp, ctop[TM_ENGINE_MAX_TOP];
            const uint32_t id = rows[i].score ? rows[i].score_id : outs[i].id;
            TM_CHECK(id < V);
            if (id >= V)
                continue;
            TM_CHECK_OK(tm_sample_logprobs(row, V, id, nt, &clp, cids, ctop, &am, &err), &err);
            t.n_row++;
            t.n_am_bad += outs[i].id != am;
            double e = fabs((double)clp - outs[i].lp);
            t.n_lp_bad += e > 1e-3;
            for (uint32_t j = 0; j < nt; j++) {
                const double ej = fabs((double)ctop[j] - outs[i].top_lp[j]);
                e = fmax(e, ej);
                t.n_lp_bad += ej > 1e-3;
                t.n_top_bad += cids[j] != outs[i].top_ids[j] &&
                               row[cids[j]] != row[outs[i].top_ids[j]];
            }
            t.max_err = fmax(t.max_err, e);
        }
    }
    printf("%s: %llu rows (scored and sampled), argmax differs %llu, logprobs over 1e-3 %llu, "
           "max |gpu - cpu| %.2e, top ids differ %llu\n",
           name, (unsigned long long)t.n_row, (unsigned long long)t.n_am_bad,
           (unsigned long long)t.n_lp_bad, t.max_err, (unsigned long long)t.n_top_bad);
    fflush(stdout);
    all->n_row += t.n_row, all->n_am_bad += t.n_am_bad, all->n_lp_bad += t.n_lp_bad;
    all->n_top_bad += t.n_top_bad, all->max_err = fmax(all->max_err, t.max_err);
    free(logits);
    tm_engine_destroy(ea);
    tm_engine_destroy(eb);
    tm_model_destroy(m);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
}

static tally g_all;

static void test_llama(void) {
    run_model("llama-bf16",
              "--arch llama --layers 2 --hidden 256 --heads 4 --kv-heads 2 --ff 512 --vocab 32000 "
              "--ctx 2048 --dtype bf16 --seed 21",
              &g_all);
}

static void test_qwen2(void) {
    run_model("qwen2-bf16",
              "--arch qwen2 --layers 2 --hidden 128 --heads 4 --kv-heads 2 --ff 384 --vocab "
              "151936 --ctx 2048 --tied 1 --dtype bf16 --seed 22",
              &g_all);
}

int main(void) {
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0)
        tm_test_skip("no CUDA device");
    const char *build = getenv("TM_BUILD");
    char path[1024];
    snprintf(path, sizeof(path), "%s/mkmodel", build ? build : "build");
    if (access(path, X_OK) != 0)
        tm_test_skip("mkmodel not built (set TM_BUILD)");
    TM_RUN(test_llama);
    TM_RUN(test_qwen2);
    const tally *t = &g_all;
    printf("all: %llu rows, argmax differs %llu, logprobs over 1e-3 %llu (max err %.2e), top ids "
           "differ %llu\n",
           (unsigned long long)t->n_row, (unsigned long long)t->n_am_bad,
           (unsigned long long)t->n_lp_bad, t->max_err, (unsigned long long)t->n_top_bad);
    TM_CHECK(t->n_row >= 2 * NS * (PROMPT - 1));
    TM_CHECK(t->n_am_bad == 0);
    TM_CHECK(t->n_lp_bad == 0);
    TM_CHECK(t->n_top_bad == 0);
    return tm_test_report();
}
#endif
