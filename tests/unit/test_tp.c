/* tests/unit/test_tp.c - the tensor-parallel sharding math on the CPU: TP=2 and TP=4 shard engines
 * in one process (an in-process all-reduce standing in for NCCL) against TP=1 on mkmodel models:
 * logits within 1e-4 relative error and equal greedy tokens for 64 decode steps of a batch that
 * mixes sequences of different lengths. Shapes cover split and replicated KV heads, q/k/v bias,
 * tied and untied embeddings and a vocabulary that does not divide by tp. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "runner/engine/engine.h"
#include "runner/model/model.h"
#include "tm_test.h"

#define N_SEQ 3
#define N_STEP 64
#define BS 8
#define MAX_POS 160

typedef struct run_out {
    uint32_t tokens[N_SEQ][N_STEP];
    float *logits; /* [N_STEP][N_SEQ][n_vocab] */
} run_out;

// Greedy decode of N_SEQ prompts (lengths 5, 17, 30) for N_STEP steps on one engine; the first
// step prefills all prompts (the longest in two chunks), later steps decode all three together.
static void run(const tm_model *m, uint32_t tp, run_out *o) {
    tm_err err = {0};
    tm_engine *eng = NULL;
    tm_engine_opts eo = {.n_threads = tp,
                         .block_size = BS,
                         .n_kv_block = N_SEQ * MAX_POS / BS,
                         .max_seqs = N_SEQ,
                         .max_batched_tokens = 64,
                         .tp_size = tp};
    TM_CHECK_OK(tm_engine_cpu_tp_create(m, &eo, &eng, &err), &err);
    if (!eng)
        return;
    const uint32_t V = m->cfg.n_vocab;
    uint32_t ids[N_SEQ][MAX_POS], len[N_SEQ] = {5, 17, 30}, done[N_SEQ] = {0};
    uint32_t table[N_SEQ][MAX_POS / BS];
    for (uint32_t s = 0; s < N_SEQ; s++) {
        for (uint32_t i = 0; i < len[s]; i++)
            ids[s][i] = (s * 131 + i * 17 + 3) % V;
        for (uint32_t k = 0; k < MAX_POS / BS; k++)
            table[s][k] = k * N_SEQ + s; // interleaved blocks
    }
    float *logits = tm_calloc((size_t)N_SEQ * V, sizeof(float));
    o->logits = tm_calloc((size_t)N_STEP * N_SEQ * V, sizeof(float));
    for (uint32_t step = 0; step < N_STEP; step++) {
        // Prefill in two rounds for the long prompt (chunked), then one decode per step.
        int all_logits = 1;
        tm_batch_seq bs[N_SEQ];
        for (uint32_t s = 0; s < N_SEQ; s++) {
            uint32_t n = len[s] - done[s];
            if (n > 20)
                n = 20, all_logits = 0;
            bs[s] = (tm_batch_seq){.tokens = ids[s] + done[s],
                                   .n_tok = n,
                                   .pos = done[s],
                                   .block_table = table[s],
                                   .n_block = MAX_POS / BS,
                                   .want_logits = done[s] + n == len[s]};
        }
        tm_batch b = {.seqs = bs, .n_seq = N_SEQ};
        TM_CHECK_OK(tm_engine_forward(eng, &b, logits, &err), &err);
        uint32_t row = 0;
        for (uint32_t s = 0; s < N_SEQ; s++) {
            done[s] += bs[s].n_tok;
            if (!bs[s].want_logits)
                continue;
            const float *l = logits + (size_t)row++ * V;
            uint32_t best = 0;
            for (uint32_t v = 1; v < V; v++)
                if (l[v] > l[best])
                    best = v;
            ids[s][len[s]++] = best;
        }
        if (!all_logits) { // the chunked prompt needs another pass before this step counts
            step--;
            continue;
        }
        for (uint32_t s = 0; s < N_SEQ; s++) {
            o->tokens[s][step] = ids[s][len[s] - 1];
            memcpy(o->logits + ((size_t)step * N_SEQ + s) * V, logits + (size_t)s * V,
                   V * sizeof(float));
        }
    }
    tm_free(logits);
    tm_engine_destroy(eng);
}

static void compare(const char *name, const tm_model *m, uint32_t tp) {
    run_out ref = {0}, got = {0};
    run(m, 1, &ref);
    run(m, tp, &got);
    if (!ref.logits || !got.logits) {
        TM_CHECK(!"run failed");
        return;
    }
    const uint32_t V = m->cfg.n_vocab;
    double worst = 0;
    int tokens_equal = 1;
    for (uint32_t step = 0; step < N_STEP; step++)
        for (uint32_t s = 0; s < N_SEQ; s++) {
            const float *a = ref.logits + ((size_t)step * N_SEQ + s) * V;
            const float *b = got.logits + ((size_t)step * N_SEQ + s) * V;
            double max_d = 0, max_a = 0;
            for (uint32_t v = 0; v < V; v++) {
                max_d = fmax(max_d, fabs((double)a[v] - b[v]));
                max_a = fmax(max_a, fabs((double)a[v]));
            }
            worst = fmax(worst, max_d / max_a);
            tokens_equal &= ref.tokens[s][step] == got.tokens[s][step];
            if (!tokens_equal) // later steps would compare different continuations
                step = N_STEP;
        }
    fprintf(stderr, "  %s tp=%u: max relative logit error %.2e, greedy tokens %s\n", name, tp,
            worst, tokens_equal ? "equal" : "DIFFER");
    TM_CHECK(worst < 1e-4);
    TM_CHECK(tokens_equal);
    tm_free(ref.logits);
    tm_free(got.logits);
}

static void check_shape(const char *name, const char *args, const uint32_t *tps, int n_tp) {
    const char *build = getenv("TM_BUILD");
    char dir[] = "/tmp/tm_tp_XXXXXX", cmd[2048];
    TM_ASSERT(mkdtemp(dir));
    snprintf(cmd, sizeof(cmd), "'%s/mkmodel' --out '%s' %s >/dev/null", build ? build : ".", dir,
             args);
    TM_CHECK(system(cmd) == 0);
    tm_err err = {0};
    tm_model *m = NULL;
    TM_CHECK_OK(tm_model_load(dir, &m, &err), &err);
    for (int i = 0; m && i < n_tp; i++)
        compare(name, m, tps[i]);
    tm_model_destroy(m);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    TM_CHECK(system(cmd) == 0);
}

static void test_llama_gqa(void) { // 8 q heads, 2 KV heads: split at tp 2, replicated at tp 4
    check_shape("llama gqa",
                "--arch llama --seed 11 --layers 2 --hidden 64 --heads 8 --kv-heads 2 "
                "--ff 96 --vocab 501 --ctx 512 --tied 0 --dtype bf16 --rope-scaling llama3",
                (uint32_t[]){2, 4}, 2);
}

static void test_qwen2_bias_tied(void) {
    check_shape("qwen2 bias tied",
                "--arch qwen2 --seed 12 --layers 2 --hidden 64 --heads 4 "
                "--kv-heads 4 --ff 128 --vocab 320 --ctx 512 --tied 1 --dtype f32",
                (uint32_t[]){2, 4}, 2);
}

static void test_bad_split(void) {
    const char *build = getenv("TM_BUILD");
    char dir[] = "/tmp/tm_tp_XXXXXX", cmd[1024];
    TM_ASSERT(mkdtemp(dir));
    snprintf(cmd, sizeof(cmd),
             "'%s/mkmodel' --out '%s' --arch llama --layers 1 --hidden 48 --heads 3 --kv-heads 3 "
             "--ff 64 --vocab 100 >/dev/null",
             build ? build : ".", dir);
    TM_CHECK(system(cmd) == 0);
    tm_err err = {0};
    tm_model *m = NULL;
    tm_engine *eng = NULL;
    TM_CHECK_OK(tm_model_load(dir, &m, &err), &err);
    tm_engine_opts eo = {.n_threads = 2,
                         .block_size = 8,
                         .n_kv_block = 4,
                         .max_seqs = 1,
                         .max_batched_tokens = 8,
                         .tp_size = 2};
    TM_CHECK(tm_engine_cpu_tp_create(m, &eo, &eng, &err) == TM_E_INVAL);
    TM_CHECK(strstr(err.msg, "must divide by tp 2") != NULL);
    tm_model_destroy(m);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    TM_CHECK(system(cmd) == 0);
}

int main(void) {
    TM_RUN(test_llama_gqa);
    TM_RUN(test_qwen2_bias_tied);
    TM_RUN(test_bad_split);
    return tm_test_report();
}
