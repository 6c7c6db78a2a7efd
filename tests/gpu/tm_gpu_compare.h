/* tests/gpu/tm_gpu_compare.h - what the engine comparisons share (test_engine_cuda: the CUDA engine
 * against the CPU engine; test_tp_cuda: TP2 against TP1): the models that tools/mkmodel writes,
 * one schedule of N_SEQ sequences, the batch of a step, and the comparison of a logit row of the
 * engine under test with the reference engine's. Include after tm_test.h, in a build with CUDA.
 * Each test file sets g_rng's seed in main().
 *
 * The schedule (N_STEP steps): prompts of 37, 100, 5 and 64 random tokens, block ids shuffled
 * across the first SEQ_BLOCKS blocks of the pool; prefill chunks with and without logits,
 * prefills mixed with decodes in one step, then N_DECODE decode steps, batch 4 then 3 (seq 2 stops
 * after 30). Each test's step() runs both engines on the step's batch, compares the rows with
 * compare_row() and appends the reference's greedy token of each row to its sequence, so both
 * engines are fed the same tokens and their states stay identical. kv_copy_diff() is the kv_copy
 * check of one engine (test_engine_cuda, test_dsv4_cuda, test_dsv41_cuda). */
#ifndef TM_TESTS_TM_GPU_COMPARE_H
#define TM_TESTS_TM_GPU_COMPARE_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef TM_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "runner/engine/engine.h"
#include "tm_test.h"

#define N_SEQ 4
#define MAX_TOK 512
#define BLOCK 16
#define SEQ_BLOCKS (N_SEQ * MAX_TOK / BLOCK) /* block ids 0 .. SEQ_BLOCKS-1 hold the sequences */
#define N_DECODE 72
#define N_STEP (4 + N_DECODE)
#define LOGIT_TOL 0.03 /* a row passes when max |got - ref| <= LOGIT_TOL * max |ref| */

/* TM_CHECK_OK on a call's result, reported at the caller's line; ok (an int) becomes 0 when the
 * call failed. */
#define CHECK_CALL(ok, call, errp)                                                                 \
    do {                                                                                           \
        tm_rc rc = (call);                                                                         \
        TM_CHECK_OK(rc, (errp));                                                                   \
        (ok) &= rc == TM_OK;                                                                       \
    } while (0)

static uint64_t g_rng;

static inline uint32_t urand(uint32_t n) {
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)((g_rng >> 11) % n);
}

/* The first index of the largest of x[0..n). */
static inline uint32_t argmax(const float *x, uint32_t n) {
    uint32_t b = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[b])
            b = i;
    return b;
}

/* Writes a model with $TM_BUILD/mkmodel (default build/mkmodel) and the arguments args into a new
 * directory made from the mkdtemp template dir (filled in). The command goes into cmd (for the
 * caller's messages). Returns system()'s status: 0 on success. */
static inline int mkmodel(char *dir, const char *args, char *cmd, size_t cmd_size) {
    const char *build = getenv("TM_BUILD");
    TM_ASSERT(mkdtemp(dir));
    snprintf(cmd, cmd_size, "%s/mkmodel --out %s %s > /dev/null", build ? build : "build", dir,
             args);
    return system(cmd);
}

/* rm -rf dir; returns system()'s status: 0 on success. */
static inline int rmdir_all(const char *dir) {
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    return system(cmd);
}

typedef struct seq {
    uint32_t tok[MAX_TOK];
    uint32_t n;    /* tokens known (prompt + generated) */
    uint32_t done; /* tokens already in the KV cache */
    uint32_t bt[MAX_TOK / BLOCK];
} seq;

typedef struct stats {
    double max_abs, max_rel; /* over all compared rows; rel = abs / max |ref| of the row */
    int n_rows, n_bad_rows, n_greedy, n_greedy_diff;
    int n_dev_diff;   /* rows where a device greedy token differs from the argmax of its logits */
    int n_clear_flip; /* greedy differs although the reference's top-2 margin > 2 x row's error */
} stats;

/* The schedule's sequences: S[N_SEQ] gets the prompts (tokens below n_vocab, from g_rng) and block
 * tables (a shuffle of the block ids below SEQ_BLOCKS), nothing computed yet. */
static inline void seqs_init(seq *S, uint32_t n_vocab) {
    const uint32_t plen[N_SEQ] = {37, 100, 5, 64};
    uint32_t perm[SEQ_BLOCKS];
    memset(S, 0, N_SEQ * sizeof(*S));
    for (uint32_t i = 0; i < SEQ_BLOCKS; i++)
        perm[i] = i;
    for (uint32_t i = SEQ_BLOCKS - 1; i > 0; i--) {
        uint32_t j = urand(i + 1), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (uint32_t i = 0; i < N_SEQ; i++) {
        S[i].n = plen[i];
        for (uint32_t k = 0; k < plen[i]; k++)
            S[i].tok[k] = urand(n_vocab);
        memcpy(S[i].bt, perm + i * (MAX_TOK / BLOCK), sizeof(S[i].bt));
    }
}

/* Step k (< N_STEP) of the schedule: the sequence of each chunk into which[], its token count
 * into n_tok[] (N_SEQ entries each); returns the number of chunks. */
static inline uint32_t sched_step(uint32_t k, uint32_t *which, uint32_t *n_tok) {
    static const struct {
        uint32_t n_chunk, which[N_SEQ], n_tok[N_SEQ];
    } prefill[4] = {
        {2, {0, 1}, {37, 50}},            // seq 0 whole prompt, seq 1 first chunk (no logits)
        {3, {1, 0, 2}, {50, 1, 5}},       // seq 1 rest, seq 0 decode, seq 2 whole prompt
        {4, {0, 1, 2, 3}, {1, 1, 1, 40}}, // decodes of 0, 1, 2 and seq 3's prompt in two chunks
        {4, {0, 3, 1, 2}, {1, 24, 1, 1}}, // over two steps
    };
    if (k < 4) {
        memcpy(which, prefill[k].which, sizeof(prefill[k].which));
        memcpy(n_tok, prefill[k].n_tok, sizeof(prefill[k].n_tok));
        return prefill[k].n_chunk;
    }
    // decode steps: all four, seq 2 stops after 30 (batch size 4 -> 3)
    uint32_t n = 0;
    for (uint32_t i = 0; i < N_SEQ; i++) {
        if (i == 2 && k - 4 >= 30)
            continue;
        which[n] = i;
        n_tok[n++] = 1;
    }
    return n;
}

/* The batch of a step into bs[] (n_chunk entries, borrowing S): chunk i is the next n_tok[i]
 * tokens of sequence which[i], and wants logits when it reaches the last known token; the
 * sequences of the rows that want logits go, in order, into want_seq[]. Returns their number. */
static inline uint32_t step_batch(const seq *S, const uint32_t *which, const uint32_t *n_tok,
                                  uint32_t n_chunk, tm_batch_seq *bs, uint32_t *want_seq) {
    uint32_t n_want = 0;
    for (uint32_t i = 0; i < n_chunk; i++) {
        const seq *s = &S[which[i]];
        bs[i] = (tm_batch_seq){.tokens = s->tok + s->done,
                               .n_tok = n_tok[i],
                               .pos = s->done,
                               .block_table = s->bt,
                               .n_block = MAX_TOK / BLOCK,
                               .want_logits = s->done + n_tok[i] == s->n};
        if (bs[i].want_logits)
            want_seq[n_want++] = which[i];
    }
    return n_want;
}

/* After a step: its chunks' tokens are in the KV cache. */
static inline void step_done(seq *S, const uint32_t *which, const uint32_t *n_tok,
                             uint32_t n_chunk) {
    for (uint32_t i = 0; i < n_chunk; i++)
        S[which[i]].done += n_tok[i];
}

/* Appends tok (the reference's greedy token) to s, which both engines compute next. */
static inline void seq_append(seq *s, uint32_t tok) {
    if (s->n < MAX_TOK)
        s->tok[s->n++] = tok;
}

/* Compares one logit row (n_vocab wide) of the engine under test, got, with the reference's, ref,
 * into st: the max error relative to the row's max |ref| (over LOGIT_TOL: a bad row), and the
 * greedy tokens ref_tok and got_tok. Where they differ it prints a "greedy differs" line with the
 * reference's top-2 margin: a near tie explains a flip, a large margin is a bug. ref_name and
 * got_name ("cpu", "tp2") label that line; ref_name NULL: no line (comparisons where flipped
 * discrete choices are expected and only their counts are printed). */
static inline void compare_row(stats *st, const char *ref_name, const float *ref, uint32_t ref_tok,
                               const char *got_name, const float *got, uint32_t got_tok,
                               uint32_t n_vocab) {
    double mx = 0.0, md = 0.0;
    for (uint32_t v = 0; v < n_vocab; v++) {
        mx = fmax(mx, fabs(ref[v]));
        double d = fabs((double)got[v] - ref[v]);
        md = isnan(d) ? INFINITY : fmax(md, d);
    }
    st->max_abs = fmax(st->max_abs, md);
    st->max_rel = fmax(st->max_rel, md / mx);
    st->n_rows++;
    st->n_bad_rows += !(md <= LOGIT_TOL * mx);
    st->n_greedy++;
    if (ref_tok != got_tok) {
        float second = -INFINITY;
        for (uint32_t v = 0; v < n_vocab; v++)
            if (v != ref_tok && ref[v] > second)
                second = ref[v];
        if (ref_name)
            fprintf(stderr, "greedy differs: %s %u %s %u (%s margin %g, row max err %g)\n",
                    ref_name, ref_tok, got_name, got_tok, ref_name, (double)(ref[ref_tok] - second),
                    md);
        st->n_greedy_diff++;
        st->n_clear_flip += ref[ref_tok] - second > 2.0 * md;
    }
}

/* An engine's kv_copy against recomputing (V: the model's vocabulary; block size BLOCK, KV
 * blocks 0-9 free): 20 tokens
 * on blocks 0, 1 (A); kv_copy of block 1's 20 - BLOCK slots into block 5; then 3 more tokens on
 * blocks 0, 5 (B) against all 23 on blocks 8, 9 (C). Returns max |logit B - logit C|, with
 * *max_c = max |logit C| and *same_argmax whether B and C pick the same token; a failed engine
 * call is a failed check. Each caller judges the difference with its own tolerance. */
static inline double kv_copy_diff(tm_engine *gpu, uint32_t V, double *max_c, int *same_argmax) {
    tm_err err = {0};
    uint32_t tok[23];
    for (uint32_t i = 0; i < 23; i++)
        tok[i] = (i * 37 + 11) % V;
    float *la = calloc(V, sizeof(float)), *lb = calloc(V, sizeof(float));
    float *lc = calloc(V, sizeof(float));
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
    double max_d = 0;
    *max_c = 0;
    for (uint32_t i = 0; i < V; i++) {
        max_d = fmax(max_d, fabs((double)lb[i] - lc[i]));
        *max_c = fmax(*max_c, fabs((double)lc[i]));
    }
    *same_argmax = argmax(lb, V) == argmax(lc, V);
    free(la), free(lb), free(lc);
    return max_d;
}

#ifdef TM_HAVE_CUDA
/* Skips the test (exit 77) without a CUDA device or without tools/mkmodel in $TM_BUILD (build/
 * without TM_BUILD). CUDA builds only (test_dsv4_kv8 includes this header in CPU-only builds). */
static inline void need_gpu_and_mkmodel(void) {
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0)
        tm_test_skip("no CUDA device");
    const char *build = getenv("TM_BUILD");
    char path[1024];
    snprintf(path, sizeof(path), "%s/mkmodel", build ? build : "build");
    if (access(path, X_OK) != 0)
        tm_test_skip("mkmodel not built (set TM_BUILD)");
}
#endif

#endif /* TM_TESTS_TM_GPU_COMPARE_H */
