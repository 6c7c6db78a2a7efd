/* tests/unit/test_plp_engine.c - prompt logprobs and scoring records through forward_sample's
 * scoring rows (tm_engine_sample_row.score, issue 22): a wrapper of the CPU engine that scores
 * (tm_sample_logprobs) and samples (tm_sample_token) its rows on the "device", as the CUDA
 * engine does, returning k + 1 entries per row. Mixed jobs (prompt_logprobs top 0 / 5 / 20,
 * continuations with and without logprobs, generated logprobs, sampled and greedy, n = 2) give
 * byte-identical output lines through the wrapper and through the plain CPU engine (whose rows
 * go to the host), at several batch shapes; every step with wanted rows went through
 * forward_sample (none through forward), scoring rows included. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/queue.h"
#include "runner/engine/engine.h"
#include "runner/model/model.h"
#include "runner/runner.h"
#include "runner/sched/sample.h"
#include "runner/text/tokenizer.h"
#include "sink/sink.h"
#include "tm_test.h"
#include "tm_unit_model.h"

#define N_REC 24

static tm_model *g_model;
static tm_tokenizer *g_tok;

// ---- the wrapper: forward_sample on the CPU engine's logits ----

typedef struct wrap {
    tm_engine eng;
    tm_engine *cpu;
    float *logits;
    tm_sample_scratch scr;
    uint64_t n_sample, n_score_rows, n_forward_rows; // calls / rows seen
} wrap;

static uint32_t n_rows(const tm_batch *b) {
    uint32_t n = 0;
    for (uint32_t i = 0; i < b->n_seq; i++)
        n += tm_batch_seq_rows(&b->seqs[i]);
    return n;
}

static tm_rc w_forward(tm_engine *eng, const tm_batch *b, float *logits, tm_err *err) {
    wrap *w = eng->impl;
    w->n_forward_rows += n_rows(b);
    return tm_engine_forward(w->cpu, b, logits, err);
}

static tm_rc w_sample(tm_engine *eng, const tm_batch *b, uint32_t lim,
                      const tm_engine_sample_row *rows, tm_engine_sample_out *out, tm_err *err) {
    wrap *w = eng->impl;
    const uint32_t V = eng->model->cfg.n_vocab, n = TM_MIN(lim, V);
    w->n_sample++;
    tm_rc rc = tm_engine_forward(w->cpu, b, w->logits, err);
    for (uint32_t r = 0; !rc && r < n_rows(b); r++) {
        const float *row = w->logits + (size_t)r * V;
        tm_err e = {0};
        if (rows[r].score) { // only k + 1 entries of the row leave the "device"
            TM_CHECK(rows[r].score_id < n);
            w->n_score_rows++;
            if (tm_sample_logprobs(row, n, rows[r].score_id, rows[r].n_top, &out[r].lp,
                                   out[r].top_ids, out[r].top_lp, &out[r].id, &e))
                out[r].id = TM_ENGINE_ID_NONFINITE;
            continue;
        }
        if (tm_sample_token(row, n, &rows[r].p, rows[r].step, &w->scr, &out[r].id, &e))
            out[r].id = TM_ENGINE_ID_NONFINITE;
        if (rows[r].want_lp && out[r].id < V)
            rc = tm_sample_logprobs(row, n, out[r].id, rows[r].n_top, &out[r].lp, out[r].top_ids,
                                    out[r].top_lp, &(uint32_t){0}, err);
    }
    return rc;
}

static tm_rc w_copy(tm_engine *eng, uint32_t src, uint32_t dst, uint32_t n, tm_err *err) {
    tm_engine *cpu = ((wrap *)eng->impl)->cpu;
    return cpu->ops->kv_copy(cpu, src, dst, n, err);
}

static void w_destroy(tm_engine *eng) {
    wrap *w = eng->impl;
    tm_engine_destroy(w->cpu);
    tm_free(w->logits);
    tm_sample_scratch_fini(&w->scr);
    tm_free(w);
}

static const tm_engine_ops w_ops = {.name = "wrap-score",
                                    .forward = w_forward,
                                    .forward_sample = w_sample,
                                    .kv_copy = w_copy,
                                    .destroy = w_destroy};

// ---- jobs ----

typedef struct run_opts {
    uint32_t max_seqs, max_batched_tokens, n_kv_block;
    int prefix_cache;
} run_opts;

static tm_job *rec_job(int i) {
    static const char *pre[4] = {
        "Once upon a time, in a kingdom by the sea, there lived ",
        "def fibonacci(n):\n    if n < 2:\n        return n\n    return ",
        "北京是中国的首都，",
        "Q: What is 17 times 23? A: ",
    };
    char p[256];
    snprintf(p, sizeof(p), "%s%d and %d", pre[i % 4], i, i * 7);
    tm_job *job = tm_calloc(1, sizeof(*job));
    char buf[16];
    snprintf(buf, sizeof(buf), "%d", i);
    job->id_json = tm_strdup(buf);
    job->seq_no = (uint64_t)i;
    job->prompt = tm_strdup(p);
    job->sp.set = TM_SP_MAX_TOKENS | TM_SP_SEED | TM_SP_TEMPERATURE;
    job->sp.max_tokens = i % 3 == 0 ? 1 : i % 3 == 1 ? 0 : 4;
    job->sp.temperature = i % 2 ? 0.8f : 0.0f;
    job->sp.seed = (uint64_t)i * 17;
    job->prompt_logprobs = i % 4 != 3;
    static const uint32_t tops[3] = {0, 5, 20};
    job->prompt_top_logprobs = tops[i % 3];
    job->logprobs = i % 2;
    job->top_logprobs = i % 5 == 1 ? 3 : 0;
    if (i % 8 == 5)
        job->n = 2;
    if (i % 6 == 3 || i % 6 == 4) { // a scoring record (with prompt logprobs on even i)
        job->sp.set &= ~(uint32_t)TM_SP_MAX_TOKENS;
        job->n = 0;
        job->continuations = tm_calloc(2, sizeof(char *));
        job->continuations[0] = tm_strdup(" the end");
        job->continuations[1] = tm_strdup(" and so on, and so forth");
        job->n_continuations = 2;
        job->logprobs = i % 6 == 3;
    }
    return job;
}

static char *canon(tm_completion *c) {
    tm_err err = {0};
    tm_buf b = {0};
    c->ttft_ms = c->total_ms = 0;
    c->n_tok_cached = 0;
    TM_CHECK_OK(tm_sink_format_ok(&b, c, &err), &err);
    return b.data;
}

// Every record's canonical line, through the CPU engine (wrapped: 1) with options o.
static void run_recs(const run_opts *o, int wrapped, char **lines) {
    tm_err err = {0};
    tm_engine *eng = NULL;
    tm_engine_opts eo = {.n_threads = 2,
                         .block_size = 16,
                         .n_kv_block = o->n_kv_block,
                         .max_seqs = o->max_seqs,
                         .max_batched_tokens = o->max_batched_tokens,
                         .tp_size = 1};
    TM_CHECK_OK(tm_engine_cpu_create(g_model, &eo, &eng, &err), &err);
    wrap *w = NULL;
    if (wrapped) {
        w = tm_calloc(1, sizeof(*w));
        TM_ASSERT(w);
        w->cpu = eng;
        w->logits = tm_calloc((size_t)tm_engine_max_rows(&eo) * g_model->cfg.n_vocab, 4);
        TM_ASSERT(w->logits && tm_sample_scratch_init(&w->scr, g_model->cfg.n_vocab, &err) == 0);
        w->eng = (tm_engine){.ops = &w_ops, .model = g_model, .opts = eng->opts, .impl = w};
        eng = &w->eng;
    }
    tm_queue *in = NULL, *out = NULL;
    TM_CHECK_OK(tm_queue_create(N_REC + 1, &in, &err), &err);
    TM_CHECK_OK(tm_queue_create(N_REC + 1, &out, &err), &err);
    for (int i = 0; i < N_REC; i++)
        TM_CHECK(tm_queue_push(in, rec_job(i)) == TM_OK);
    tm_queue_close(in);
    tm_runner_cfg cfg = {.max_seqs = o->max_seqs,
                         .max_batched_tokens = o->max_batched_tokens,
                         .block_size = 16,
                         .n_kv_block = o->n_kv_block,
                         .n_ctx = 4096,
                         .prefix_cache = o->prefix_cache,
                         .policy = TM_SCHED_PREFIX,
                         .lookahead = 64};
    cfg.defaults.max_tokens = 8;
    cfg.defaults.top_p = 1.0f;
    cfg.defaults.top_k = -1;
    tm_runner_stats st = {0};
    TM_CHECK_OK(tm_runner_run(&cfg, eng, g_tok, in, out, &st, &err), &err);
    tm_queue_close(out);
    void *item;
    while (tm_queue_pop(out, &item) == TM_OK) {
        tm_completion *c = item;
        int i = atoi(c->id_json);
        TM_CHECK_MSG(c->err_code == TM_ERRCODE_NONE, "record %d: %s", i, c->err_msg);
        if (i >= 0 && i < N_REC && !lines[i])
            lines[i] = canon(c);
        tm_completion_destroy(c);
    }
    if (w) { // the rows stayed on the "device": scoring rows were scored there, none went to
             // forward
        TM_CHECK_MSG(w->n_score_rows > 100 && w->n_forward_rows == 0,
                     "%llu scoring rows on the engine, %llu rows through forward",
                     (unsigned long long)w->n_score_rows, (unsigned long long)w->n_forward_rows);
    }
    tm_queue_destroy(in);
    tm_queue_destroy(out);
    tm_engine_destroy(eng);
}

static void test_identical(void) {
    static const run_opts runs[3] = {
        {4, 64, 256, 1}, // chunked, cache
        {8, 96, 256, 0}, // mixed batches, cache off
        {8, 40, 24, 1},  // a small KV pool: preemption and recompute
    };
    for (int k = 0; k < 3; k++) {
        char *ref[N_REC] = {0}, *got[N_REC] = {0};
        run_recs(&runs[k], 0, ref);
        run_recs(&runs[k], 1, got);
        for (int i = 0; i < N_REC; i++) {
            TM_CHECK_MSG(ref[i] && got[i] && strcmp(ref[i], got[i]) == 0,
                         "run %d record %d differs:\n%s\n%s", k, i, ref[i] ? ref[i] : "(none)",
                         got[i] ? got[i] : "(none)");
            tm_free(ref[i]);
            tm_free(got[i]);
        }
    }
}

int main(void) {
    char dir[] = "/tmp/tm_plp_engine_XXXXXX";
    tm_unit_llama_open(dir, 7, &g_model, &g_tok);
    TM_RUN(test_identical);
    tm_unit_llama_close(dir, g_model, g_tok);
    return tm_test_report();
}
