/* tests/gpu/test_sample_cuda.c - device sampling (kernels/sample.cu through the CUDA engine's
 * forward_sample) against the CPU sampler (tm_sample_token, tm_sample_logprobs) on the logits of
 * test models that tools/mkmodel writes (bf16 Llama and Qwen2 shapes, random weights).
 *
 * Per model: 8 sequences, 256 decode steps each, every sequence with its own sampling setup
 * (temperature / top-p, top-k, min-p, penalties, logit_bias, a min_tokens mask, greedy with a
 * penalty, a random allowed-ids bitmask drawn afresh every step on a sampled row (half the ids
 * allowed) and on the greedy one (1 in 64 allowed)), logprobs top-5 on every row. Engine B gives
 * each step's logits to the host; the CPU sampler picks from them, and the same rows are uploaded
 * and sampled by the kernel (same uniform), which must agree on >= 99% of the 2048 draws; every
 * difference is printed with the smallest perturbation eps of the uniform (u +- eps) at which the
 * kernel gives the CPU's token (the draw lay within eps of a boundary of the walk), or "level" when
 * no eps <= 1e-4 does (the top-p level moved by a rounding of the mass). Device logprobs must be
 * within 1e-3 of the CPU's and the top-5 ids equal. Engine A runs the same steps through
 * forward_sample (the engine's staging, uniform and wiring): its ids must equal the kernel's on B's
 * logits at >= 99% of the draws (both engines are fed the CPU's tokens, so their states stay
 * identical). Skipped (77) without a GPU, without CUDA, or without mkmodel. */
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

#include "kernels/sample.h"
#include "runner/engine/cuda/engine_cuda.h"
#include "runner/engine/engine.h"
#include "runner/model/model.h"
#include "runner/sched/sample.h"
#include "tm_gpu_test.h"

#define NS 8      /* sequences */
#define N_DEC 256 /* decode steps per sequence */
#define PROMPT 24 /* prompt tokens */
#define BS 16     /* block size */
#define MAX_TOK (PROMPT + N_DEC + 1)

static const uint32_t BIAS_IDS[3] = {3, 17, 250};
static const float BIAS_V[3] = {5.0f, -100.0f, 2.5f};
static const uint32_t MASK_IDS[3] = {0, 1, 2};
static uint32_t *g_allow[NS]; /* this step's allowed-ids bitmasks (NULL: none) */

// Sequence i's parameters at decode step k (hist: its tokens so far).
static tm_sample_params params_of(uint32_t i, uint32_t k, const uint32_t *hist) {
    tm_sample_params p = {
        .seed = 1000 + i, .hist = hist, .n_hist = PROMPT + k, .n_hist_prompt = PROMPT};
    switch (i) {
    case 0:
        p.temperature = 0.8f, p.top_p = 0.95f;
        break;
    case 1:
        p.temperature = 0.8f, p.top_k = 50;
        break;
    case 2:
        p.temperature = 1.0f, p.min_p = 0.05f;
        break;
    case 3:
        p.temperature = 0.7f, p.top_p = 0.9f, p.top_k = 100;
        p.repetition_penalty = 1.3f, p.frequency_penalty = 0.5f, p.presence_penalty = 0.3f;
        break;
    case 4:
        p.temperature = 0.5f, p.top_p = 0.95f;
        break;
    case 5:
        p.temperature = 1.2f, p.top_p = 0.5f;
        p.bias_ids = BIAS_IDS, p.bias = BIAS_V, p.n_bias = 3;
        break;
    case 6:
        p.temperature = 0.0f, p.repetition_penalty = 1.5f;
        break; // greedy + processing
    default:
        p.temperature = 0.9f, p.top_p = 0.95f;
        if (k < 100)
            p.mask_ids = MASK_IDS, p.n_mask = 3;
    }
    p.allow = g_allow[i];
    if (!(p.repetition_penalty > 0) && p.frequency_penalty == 0 && p.presence_penalty == 0)
        p.n_hist = 0;
    return p;
}

// A model from $TM_BUILD/mkmodel with args into a new directory from the template dir.
static int mkmodel(char *dir, const char *args, char *cmd, size_t cmd_size) {
    const char *build = getenv("TM_BUILD");
    TM_ASSERT(mkdtemp(dir));
    snprintf(cmd, cmd_size, "%s/mkmodel --out %s %s > /dev/null", build ? build : "build", dir,
             args);
    return system(cmd);
}

static void rmdir_all(const char *dir) {
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
}

typedef struct dev_sampler {
    float *logits, *lp, *top_lp;
    uint32_t *cnt, *ids, *top_ids, *pk;
    tm_k_sample_row *rows;
    uint32_t *pk_h; /* [NS * (MAX_TOK + 16 + n_allow)] */
    size_t pk_n;
    tm_k_sample_row rows_h[NS];
    uint32_t V;
} dev_sampler;

static void ds_init(dev_sampler *d, uint32_t V) {
    d->V = V;
    d->pk_n = (size_t)NS * (MAX_TOK + 16 + TM_CEIL_DIV(V, 32));
    d->pk_h = xmalloc(d->pk_n * 4);
    d->logits = dalloc((size_t)NS * V * 4, 0);
    d->cnt = dalloc((size_t)NS * V * 4, 0);
    d->ids = dalloc(NS * 4, 0);
    d->lp = dalloc(NS * 4, 0);
    d->top_ids = dalloc(NS * TM_K_SAMPLE_MAX_TOP * 4, 0);
    d->top_lp = dalloc(NS * TM_K_SAMPLE_MAX_TOP * 4, 0);
    d->pk = dalloc(d->pk_n * 4, 0);
    d->rows = dalloc(sizeof(d->rows_h), 0);
}

static void ds_fini(dev_sampler *d) {
    cudaFree(d->logits), cudaFree(d->cnt), cudaFree(d->ids), cudaFree(d->lp);
    free(d->pk_h);
    cudaFree(d->top_ids), cudaFree(d->top_lp), cudaFree(d->pk), cudaFree(d->rows);
}

// Pack row i's parameters as the engine does (u given).
static size_t ds_pack(dev_sampler *d, uint32_t i, const tm_sample_params *p, double u, size_t o) {
    tm_k_sample_row *kr = &d->rows_h[i];
    *kr = (tm_k_sample_row){.u = u,
                            .inv_t = p->temperature > 0 ? 1.0f / p->temperature : 0.0f,
                            .top_k = p->top_k,
                            .top_p = p->top_p,
                            .min_p = p->min_p,
                            .rep = p->repetition_penalty,
                            .freq = p->frequency_penalty,
                            .pres = p->presence_penalty,
                            .n_top = 5,
                            .want_lp = 1};
    kr->hist0 = (uint32_t)o, kr->n_hist = p->n_hist, kr->n_hist_prompt = p->n_hist_prompt;
    memcpy(d->pk_h + o, p->hist, p->n_hist * 4);
    o += p->n_hist;
    kr->bias0 = (uint32_t)o, kr->n_bias = p->n_bias;
    memcpy(d->pk_h + o, p->bias_ids, p->n_bias * 4);
    memcpy(d->pk_h + o + p->n_bias, p->bias, p->n_bias * 4);
    o += 2 * p->n_bias;
    kr->mask0 = (uint32_t)o, kr->n_mask = p->n_mask;
    memcpy(d->pk_h + o, p->mask_ids, p->n_mask * 4);
    o += p->n_mask;
    kr->allow0 = (uint32_t)o, kr->has_allow = p->allow != NULL;
    if (p->allow) {
        memcpy(d->pk_h + o, p->allow, TM_CEIL_DIV(d->V, 32) * 4);
        o += TM_CEIL_DIV(d->V, 32);
    }
    return o;
}

// Run the kernel on n rows of host logits already in d->logits; ids/lp/top to the host.
static void ds_run(dev_sampler *d, uint32_t n, size_t n_pk, uint32_t *ids, float *lp,
                   uint32_t *top_ids, float *top_lp) {
    tm_err err = {0};
    // pageable copies on the legacy stream may return before their DMA ends: wait for them
    TM_CHECK(cudaDeviceSynchronize() == cudaSuccess);
    TM_CHECK(cudaMemcpy(d->rows, d->rows_h, n * sizeof(d->rows_h[0]), cudaMemcpyHostToDevice) ==
             cudaSuccess);
    TM_CHECK(cudaMemcpy(d->pk, d->pk_h, (n_pk ? n_pk : 1) * 4, cudaMemcpyHostToDevice) ==
             cudaSuccess);
    TM_CHECK(cudaDeviceSynchronize() == cudaSuccess);
    tm_k_sample_f32_args a = {.ids = d->ids,
                              .lp = d->lp,
                              .top_ids = d->top_ids,
                              .top_lp = d->top_lp,
                              .logits = d->logits,
                              .cnt = d->cnt,
                              .rows = d->rows,
                              .pk = d->pk,
                              .n_row = n,
                              .n_col = d->V,
                              .n_limit = d->V};
    TM_CHECK_OK(tm_k_sample_f32(&a, g_stream, &err), &err);
    TM_CHECK(cudaStreamSynchronize(g_stream) == cudaSuccess);
    to_host(ids, d->ids, n * 4);
    if (lp) {
        to_host(lp, d->lp, n * 4);
        to_host(top_ids, d->top_ids, n * TM_K_SAMPLE_MAX_TOP * 4);
        to_host(top_lp, d->top_lp, n * TM_K_SAMPLE_MAX_TOP * 4);
    }
}

typedef struct tally {
    uint32_t n_draw, n_same, n_eng_same, n_lp, n_lp_bad, n_top_bad;
    double max_lp_err;
} tally;

static void run_model(const char *name, const char *args, tally *all) {
    char dir[] = "/tmp/tm_sample_cuda_XXXXXX", cmd[1024];
    if (mkmodel(dir, args, cmd, sizeof(cmd)) != 0) {
        TM_CHECK_MSG(0, "%s: mkmodel failed: %s", name, cmd);
        return;
    }
    tm_err err = {0};
    tm_model *m = NULL;
    TM_CHECK_OK(tm_model_load(dir, &m, &err), &err);
    if (!m)
        return;
    const uint32_t V = m->cfg.n_vocab, nb = TM_CEIL_DIV(MAX_TOK, BS);
    tm_engine_opts eo = {
        .block_size = BS, .n_kv_block = NS * nb, .max_seqs = NS, .max_batched_tokens = NS * PROMPT};
    tm_engine *ea = NULL, *eb = NULL;
    TM_CHECK_OK(tm_engine_cuda_create(m, &eo, &ea, &err), &err);
    TM_CHECK_OK(tm_engine_cuda_create(m, &eo, &eb, &err), &err);
    if (!ea || !eb || !ea->ops->forward_sample) {
        TM_CHECK(0);
        return;
    }
    static uint32_t tok[NS][MAX_TOK], bt[NS][64];
    for (uint32_t i = 0; i < NS; i++) {
        for (uint32_t k = 0; k < PROMPT; k++)
            tok[i][k] = urand(V);
        for (uint32_t b = 0; b < nb; b++)
            bt[i][b] = i * nb + b;
    }
    float *logits = xmalloc((size_t)NS * V * 4);
    tm_sample_scratch scr;
    TM_CHECK_OK(tm_sample_scratch_init(&scr, V, &err), &err);
    dev_sampler d;
    ds_init(&d, V);
    tally t = {0};
    tm_batch_seq seqs[NS];
    tm_engine_sample_row rows[NS];
    tm_engine_sample_out outs[NS];
    const size_t n_aw = TM_CEIL_DIV(V, 32);
    uint32_t *allow4 = xmalloc(n_aw * 4), *allow6 = xmalloc(n_aw * 4);
    g_allow[4] = allow4, g_allow[6] = allow6;
    uint64_t n_allowed = 0, n_allow_rows = 0;
    for (uint32_t k = 0; k < N_DEC; k++) { // step k samples generated token k
        for (size_t w = 0; w < n_aw; w++) {
            allow4[w] = (uint32_t)rnd(); // half the ids
            allow6[w] = 0;
        }
        for (uint32_t j = 0; j < V / 64; j++) { // about 1 in 64 (the greedy row)
            const uint32_t id = urand(V);
            allow6[id >> 5] |= 1u << (id & 31);
        }
        for (uint32_t i = 0; i < NS; i++) {
            const uint32_t pos = k == 0 ? 0 : PROMPT + k - 1, n = k == 0 ? PROMPT : 1;
            seqs[i] = (tm_batch_seq){.tokens = tok[i] + pos,
                                     .n_tok = n,
                                     .pos = pos,
                                     .block_table = bt[i],
                                     .n_block = nb,
                                     .want_logits = 1};
            rows[i] = (tm_engine_sample_row){
                .p = params_of(i, k, tok[i]), .step = k, .want_lp = 1, .n_top = 5};
        }
        tm_batch b = {.seqs = seqs, .n_seq = NS};
        TM_CHECK_OK(tm_engine_forward(eb, &b, logits, &err), &err);
        TM_CHECK_OK(ea->ops->forward_sample(ea, &b, V, rows, outs, &err), &err);
        if (err.rc)
            break;
        uint32_t cpu[NS], dev[NS], top_ids[NS * TM_K_SAMPLE_MAX_TOP];
        float lp[NS], top_lp[NS * TM_K_SAMPLE_MAX_TOP];
        size_t o = 0;
        for (uint32_t i = 0; i < NS; i++) {
            TM_CHECK_OK(
                tm_sample_token(logits + (size_t)i * V, V, &rows[i].p, k, &scr, &cpu[i], &err),
                &err);
            o = ds_pack(&d, i, &rows[i].p, tm_sample_uniform(rows[i].p.seed, k), o);
        }
        TM_CHECK(cudaMemcpy(d.logits, logits, (size_t)NS * V * 4, cudaMemcpyHostToDevice) ==
                 cudaSuccess);
        ds_run(&d, NS, o, dev, lp, top_ids, top_lp);
        for (uint32_t i = 0; i < NS; i++) {
            t.n_draw++;
            t.n_same += dev[i] == cpu[i];
            if (g_allow[i]) { // the pick is an allowed id, on both
                n_allow_rows++;
                n_allowed += cpu[i] < V && ((g_allow[i][cpu[i] >> 5] >> (cpu[i] & 31)) & 1u) &&
                             dev[i] < V && ((g_allow[i][dev[i] >> 5] >> (dev[i] & 31)) & 1u);
            }
            t.n_eng_same += outs[i].id == dev[i];
            // logprobs
            uint32_t cids[5], am;
            float clp, ctop[5];
            TM_CHECK_OK(tm_sample_logprobs(logits + (size_t)i * V, V, dev[i] < V ? dev[i] : 0, 5,
                                           &clp, cids, ctop, &am, &err),
                        &err);
            double e = fabs((double)clp - lp[i]);
            for (uint32_t j = 0; j < 5; j++) {
                e = fmax(e, fabs((double)ctop[j] - top_lp[i * TM_K_SAMPLE_MAX_TOP + j]));
                t.n_top_bad += cids[j] != top_ids[i * TM_K_SAMPLE_MAX_TOP + j];
            }
            t.n_lp++;
            t.n_lp_bad += e > 1e-3;
            t.max_lp_err = fmax(t.max_lp_err, e);
            if (dev[i] == cpu[i])
                continue;
            // a difference: how close was the draw to a boundary?
            const double u = tm_sample_uniform(rows[i].p.seed, k);
            double found = -1;
            for (double eps = 1e-12; eps <= 1e-4 && found < 0; eps *= 10)
                for (int sg = -1; sg <= 1 && found < 0; sg += 2) {
                    uint32_t alt[1];
                    TM_CHECK(cudaMemcpy(d.logits, logits + (size_t)i * V, (size_t)V * 4,
                                        cudaMemcpyHostToDevice) == cudaSuccess);
                    size_t n_pk = ds_pack(&d, 0, &rows[i].p, u + sg * eps, 0);
                    ds_run(&d, 1, n_pk, alt, NULL, NULL, NULL);
                    if (alt[0] == cpu[i])
                        found = eps;
                }
            if (found > 0)
                printf("%s step %u seq %u: cpu %u gpu %u, u %.17g: the draw is within %.0e of a "
                       "boundary\n",
                       name, k, i, cpu[i], dev[i], u, found);
            else
                printf("%s step %u seq %u: cpu %u gpu %u, u %.17g: level (no u within 1e-4 "
                       "gives the cpu token)\n",
                       name, k, i, cpu[i], dev[i], u);
        }
        for (uint32_t i = 0; i < NS; i++)
            tok[i][PROMPT + k] = cpu[i]; // both engines continue with the CPU's tokens
    }
    printf("%s: %u/%u draws identical (%.3f%%), forward_sample = kernel on the same logits %u/%u, "
           "logprobs: max |gpu - cpu| %.2e, %u rows over 1e-3, %u top-5 ids differ\n",
           name, t.n_same, t.n_draw, 100.0 * t.n_same / (t.n_draw ? t.n_draw : 1), t.n_eng_same,
           t.n_draw, t.max_lp_err, t.n_lp_bad, t.n_top_bad);
    fflush(stdout);
    all->n_draw += t.n_draw, all->n_same += t.n_same, all->n_eng_same += t.n_eng_same;
    all->n_lp_bad += t.n_lp_bad, all->n_top_bad += t.n_top_bad;
    all->max_lp_err = fmax(all->max_lp_err, t.max_lp_err);
    printf("%s: allowed-ids rows: %llu/%llu picks allowed on both\n", name,
           (unsigned long long)n_allowed, (unsigned long long)n_allow_rows);
    TM_CHECK(n_allowed == n_allow_rows && n_allow_rows == 2 * N_DEC);
    g_allow[4] = g_allow[6] = NULL;
    free(allow4);
    free(allow6);
    ds_fini(&d);
    tm_sample_scratch_fini(&scr);
    free(logits);
    tm_engine_destroy(ea);
    tm_engine_destroy(eb);
    tm_model_destroy(m);
    rmdir_all(dir);
}

static tally g_all;

static void test_llama(void) {
    run_model("llama-bf16",
              "--arch llama --layers 2 --hidden 256 --heads 4 --kv-heads 2 --ff 512 --vocab 32000 "
              "--ctx 2048 --dtype bf16 --seed 11",
              &g_all);
}

static void test_qwen2(void) {
    run_model("qwen2-bf16",
              "--arch qwen2 --layers 2 --hidden 128 --heads 4 --kv-heads 2 --ff 384 --vocab "
              "151936 --ctx 2048 --tied 1 --dtype bf16 --seed 12",
              &g_all);
}

int main(void) {
    g_rng = 2222;
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0)
        tm_test_skip("no CUDA device");
    const char *build = getenv("TM_BUILD");
    char path[1024];
    snprintf(path, sizeof(path), "%s/mkmodel", build ? build : "build");
    if (access(path, X_OK) != 0)
        tm_test_skip("mkmodel not built (set TM_BUILD)");
    TM_ASSERT(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking) == cudaSuccess);
    TM_RUN(test_llama);
    TM_RUN(test_qwen2);
    const tally *t = &g_all;
    printf("all: %u/%u draws identical (%.3f%%), engine %u/%u, logprobs max err %.2e\n", t->n_same,
           t->n_draw, 100.0 * t->n_same / (t->n_draw ? t->n_draw : 1), t->n_eng_same, t->n_draw,
           t->max_lp_err);
    TM_CHECK(t->n_draw >= 2 * NS * N_DEC);
    TM_CHECK(t->n_same >= 0.99 * t->n_draw);
    TM_CHECK(t->n_eng_same >= 0.99 * t->n_draw);
    TM_CHECK(t->n_lp_bad == 0);
    TM_CHECK(t->n_top_bad == 0);
    return tm_test_report();
}
#endif
