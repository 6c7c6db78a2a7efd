/* tests/unit/test_logprobs.c - the evaluation features of the runner (issue 5) on a tiny model with
 * the DeepSeek V3 tokenizer: generated-token logprobs equal the log-softmax of the CPU engine's
 * logits (recomputed here with a fresh engine); a scoring record's continuation score equals the
 * sum of its token logprobs and of the greedy generation's logprobs, with is_greedy right;
 * prompt_logprobs with max_tokens 0; n = 4 gives four distinct samples, reproducible, the first
 * equal to the n = 1 sample; batch invariance: 50 records give byte-identical text and logprobs
 * alone (max_seqs 1) and in mixed batches (max_seqs 8, other chunk budgets, cache on/off, a
 * small KV pool that preempts); and the sink's native and OpenAI logprob lines parse. */
#define _POSIX_C_SOURCE 200809L
#include <jansson.h>
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

#define N_INV 50

static tm_model *g_model;
static tm_tokenizer *g_tok;

typedef struct run_opts {
    uint32_t max_seqs, max_batched_tokens, n_kv_block;
    int prefix_cache;
    tm_sched_policy policy;
} run_opts;

static const run_opts DEFAULT_OPTS = {4, 64, 256, 1, TM_SCHED_PREFIX};

static tm_job *new_job(int id, const char *prompt, int32_t max_tokens, float temp, uint64_t seed) {
    tm_job *job = tm_calloc(1, sizeof(*job));
    char buf[16];
    snprintf(buf, sizeof(buf), "%d", id);
    job->id_json = tm_strdup(buf);
    job->seq_no = (uint64_t)id;
    job->prompt = tm_strdup(prompt);
    job->sp.set = TM_SP_MAX_TOKENS | TM_SP_SEED | TM_SP_TEMPERATURE;
    job->sp.max_tokens = max_tokens;
    job->sp.temperature = temp;
    job->sp.seed = seed;
    return job;
}

// Run jobs[0..n) (ownership passes) and return the completions by id (caller destroys them).
static void run_jobs(const run_opts *o, tm_job **jobs, int n, tm_completion **out_by_id,
                     int n_out) {
    tm_err err = {0};
    tm_engine *eng = NULL;
    tm_engine_opts eo = {.n_threads = 2,
                         .block_size = 16,
                         .n_kv_block = o->n_kv_block,
                         .max_seqs = o->max_seqs,
                         .max_batched_tokens = o->max_batched_tokens,
                         .tp_size = 1};
    TM_CHECK_OK(tm_engine_cpu_create(g_model, &eo, &eng, &err), &err);
    tm_queue *in = NULL, *out = NULL;
    TM_CHECK_OK(tm_queue_create((size_t)n + 1, &in, &err), &err);
    TM_CHECK_OK(tm_queue_create((size_t)n + 1, &out, &err), &err);
    for (int i = 0; i < n; i++)
        TM_CHECK(tm_queue_push(in, jobs[i]) == TM_OK);
    tm_queue_close(in);
    tm_runner_cfg cfg = {.max_seqs = o->max_seqs,
                         .max_batched_tokens = o->max_batched_tokens,
                         .block_size = 16,
                         .n_kv_block = o->n_kv_block,
                         .n_ctx = 4096,
                         .prefix_cache = o->prefix_cache,
                         .policy = o->policy,
                         .lookahead = 64};
    cfg.defaults.max_tokens = 8;
    cfg.defaults.top_p = 1.0f;
    cfg.defaults.top_k = -1;
    tm_runner_stats st = {0};
    TM_CHECK_OK(tm_runner_run(&cfg, eng, g_tok, in, out, &st, &err), &err);
    tm_queue_close(out);
    tm_unit_collect(out, out_by_id, n_out, 1);
    tm_queue_destroy(in);
    tm_queue_destroy(out);
    tm_engine_destroy(eng);
}

static double ref_logprob(const float *row, uint32_t n_vocab, uint32_t id) {
    double mx = row[0], sum = 0;
    for (uint32_t i = 1; i < n_vocab; i++)
        mx = row[i] > mx ? row[i] : mx;
    for (uint32_t i = 0; i < n_vocab; i++)
        sum += exp((double)row[i] - mx);
    return (double)row[id] - mx - log(sum);
}

static void encode_prompt(const char *prompt, tm_ids *ids) {
    tm_err err = {0};
    TM_CHECK(tm_ids_push(ids, (uint32_t)tm_tok_bos_id(g_tok), &err) == TM_OK);
    TM_CHECK_OK(tm_tok_encode(g_tok, prompt, strlen(prompt), ids, &err), &err);
}

static const char *PROMPT = "The quick brown fox jumps over the lazy dog. Then it";

// Greedy generation with logprobs + top 5, checked against a recomputation; then the greedy
// text scored as a continuation, and prompt_logprobs.
static void test_logprobs_and_scoring(void) {
    uint32_t V = tm_tok_n_vocab(g_tok) < g_model->cfg.n_vocab ? tm_tok_n_vocab(g_tok)
                                                              : g_model->cfg.n_vocab;
    tm_job *jobs[4];
    jobs[0] = new_job(0, PROMPT, 6, 0.0f, 1);
    jobs[0]->logprobs = 1;
    jobs[0]->top_logprobs = 5;
    jobs[0]->ignore_eos = 1;
    tm_completion *c[4] = {0};
    run_jobs(&DEFAULT_OPTS, jobs, 1, c, 4);
    TM_CHECK(c[0] && c[0]->logprobs && c[0]->logprobs->n_tok == 6);
    if (!c[0] || !c[0]->logprobs)
        return;
    const tm_logprobs *l = c[0]->logprobs;
    tm_ids ids = {0};
    encode_prompt(PROMPT, &ids);
    uint32_t n_prompt = (uint32_t)ids.len;
    tm_err err = {0};
    for (uint32_t i = 0; i < l->n_tok; i++)
        tm_ids_push(&ids, l->ids[i], &err);
    float *rows = tm_unit_rows_of(g_model, ids.ids, (uint32_t)ids.len);
    uint32_t Vm = g_model->cfg.n_vocab;
    double sum = 0;
    for (uint32_t i = 0; i < l->n_tok; i++) {
        const float *row = rows + (size_t)(n_prompt - 1 + i) * Vm;
        double ref = ref_logprob(row, V, l->ids[i]);
        TM_CHECK_NEAR(l->lp[i], ref, 1e-5);
        TM_CHECK(l->top_ids[(size_t)i * 5] == l->ids[i]); // greedy: the best is the token
        for (uint32_t j = 0; j < 5; j++) {
            TM_CHECK_NEAR(l->top_lp[(size_t)i * 5 + j], ref_logprob(row, V, l->top_ids[i * 5 + j]),
                          1e-5);
            if (j)
                TM_CHECK(l->top_lp[i * 5 + j] <= l->top_lp[i * 5 + j - 1]);
        }
        sum += l->lp[i];
    }
    // Token strings: the entries' bytes decode to the text.
    tm_buf joined = {0};
    for (uint32_t i = 0; i < l->n_tok; i++)
        tm_buf_append(&joined, l->text + l->off[i * 6], l->off[i * 6 + 1] - l->off[i * 6], &err);
    TM_CHECK(joined.data && strcmp(joined.data, c[0]->text) == 0);
    tm_buf_fini(&joined);

    // Scoring: the greedy text, a different text, and the greedy text as one continuation.
    char *greedy = tm_strdup(c[0]->text);
    jobs[1] = new_job(1, PROMPT, 0, 0.0f, 0);
    jobs[1]->sp.set = 0;
    jobs[1]->continuations = tm_calloc(2, sizeof(char *));
    jobs[1]->continuations[0] = tm_strdup(greedy);
    jobs[1]->continuations[1] = tm_strdup(" barks at the moon");
    jobs[1]->n_continuations = 2;
    jobs[1]->logprobs = 1;
    // prompt_logprobs with max_tokens 0 (top 2)
    jobs[2] = new_job(2, PROMPT, 0, 0.0f, 0);
    jobs[2]->prompt_logprobs = 1;
    jobs[2]->prompt_top_logprobs = 2;
    run_jobs(&DEFAULT_OPTS, jobs + 1, 2, c, 4);
    tm_completion *sc = c[1], *pl = c[2];
    TM_CHECK(sc && sc->n_scores == 2 && sc->scores && sc->n_tok_prompt == n_prompt);
    if (sc && sc->n_scores == 2) {
        const tm_score *s0 = &sc->scores[0], *s1 = &sc->scores[1];
        // The greedy continuation re-tokenizes to the generated ids here (plain ASCII words).
        TM_CHECK(s0->n_tok == l->n_tok);
        TM_CHECK(s0->is_greedy == 1);
        TM_CHECK_NEAR(s0->logprob, sum, 1e-5);
        TM_CHECK(s0->logprobs && s0->logprobs->n_tok == s0->n_tok);
        double s = 0;
        for (uint32_t i = 0; s0->logprobs && i < s0->logprobs->n_tok; i++) {
            s += s0->logprobs->lp[i];
            TM_CHECK(s0->logprobs->ids[i] == l->ids[i]);
            TM_CHECK(s0->logprobs->lp[i] == l->lp[i]); // bit-exact engine: same float
        }
        TM_CHECK_NEAR(s0->logprob, s, 1e-9);
        TM_CHECK(s1->is_greedy == 0);
        TM_CHECK(s1->logprob < s0->logprob);
        // score of continuation 1 recomputed from the engine
        tm_ids c1 = {0};
        encode_prompt(PROMPT, &c1);
        const char *t1 = " barks at the moon";
        TM_CHECK_OK(tm_tok_encode(g_tok, t1, strlen(t1), &c1, &err), &err);
        float *r1 = tm_unit_rows_of(g_model, c1.ids, (uint32_t)c1.len);
        double ref = 0;
        for (size_t p = n_prompt - 1; p + 1 < c1.len; p++)
            ref += ref_logprob(r1 + p * Vm, V, c1.ids[p + 1]);
        TM_CHECK(s1->n_tok == c1.len - n_prompt);
        TM_CHECK_NEAR(s1->logprob, ref, 1e-4);
        tm_free(r1);
        tm_ids_fini(&c1);
    }
    TM_CHECK(pl && pl->prompt_logprobs && pl->n_tok_gen == 0 && pl->text && !pl->text[0]);
    if (pl && pl->prompt_logprobs) {
        const tm_logprobs *p = pl->prompt_logprobs;
        TM_CHECK(p->n_tok == n_prompt && p->n_top == 2);
        TM_CHECK(isnan(p->lp[0]) && p->ids[0] == ids.ids[0]);
        for (uint32_t i = 1; i < p->n_tok && i < n_prompt; i++) {
            TM_CHECK(p->ids[i] == ids.ids[i]);
            TM_CHECK_NEAR(p->lp[i], ref_logprob(rows + (size_t)(i - 1) * Vm, V, ids.ids[i]), 1e-5);
            TM_CHECK(p->top_lp[i * 2] >= p->lp[i]);
        }
    }
    tm_completion_destroy(sc);
    tm_completion_destroy(pl);
    tm_free(greedy);
    tm_free(rows);
    tm_ids_fini(&ids);
    tm_completion_destroy(c[0]);
}

static void test_n_samples(void) {
    tm_completion *c[3] = {0};
    for (int run = 0; run < 2; run++) {
        tm_job *jobs[2];
        jobs[0] = new_job(0, PROMPT, 8, 1.0f, 7);
        jobs[0]->n = 4;
        jobs[0]->logprobs = 1;
        jobs[0]->ignore_eos = 1;
        jobs[1] = new_job(1, PROMPT, 8, 1.0f, 7);
        jobs[1]->ignore_eos = 1;
        tm_completion *r[3] = {0};
        run_jobs(&DEFAULT_OPTS, jobs, 2, r, 3);
        if (run == 0) {
            c[0] = r[0];
            c[1] = r[1];
            continue;
        }
        TM_CHECK(r[0] && r[0]->n_choices == 4 && c[0] && c[0]->n_choices == 4);
        for (uint32_t i = 0; r[0] && c[0] && i < 4 && i < r[0]->n_choices; i++) {
            TM_CHECK(strcmp(r[0]->choices[i].text, c[0]->choices[i].text) == 0); // reproducible
            TM_CHECK(r[0]->choices[i].logprobs &&
                     r[0]->choices[i].logprobs->n_tok == r[0]->choices[i].n_tok_gen);
        }
        tm_completion_destroy(r[0]);
        tm_completion_destroy(r[1]);
    }
    if (!c[0] || c[0]->n_choices != 4 || !c[1])
        return;
    TM_CHECK(c[0]->n_tok_gen == 32);
    for (int i = 0; i < 4; i++)
        for (int j = i + 1; j < 4; j++)
            TM_CHECK_MSG(strcmp(c[0]->choices[i].text, c[0]->choices[j].text) != 0,
                         "samples %d and %d are equal: %s", i, j, c[0]->choices[i].text);
    TM_CHECK(strcmp(c[0]->choices[0].text, c[1]->text) == 0); // sample 0 keeps the seed
    // Sink lines: native choices; OpenAI chat and completions logprobs.
    tm_err err = {0};
    tm_buf b = {0};
    TM_CHECK_OK(tm_sink_format_ok(&b, c[0], &err), &err);
    json_t *j = json_loads(b.data, 0, NULL);
    TM_CHECK(j && json_array_size(json_object_get(j, "choices")) == 4);
    json_t *lp0 = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs");
    TM_CHECK(json_array_size(json_object_get(lp0, "token_logprobs")) == 8);
    json_decref(j);
    c[0]->format = TM_REC_FORMAT_OPENAI_CHAT;
    tm_buf_clear(&b);
    TM_CHECK_OK(tm_sink_format_ok(&b, c[0], &err), &err);
    j = json_loads(b.data, 0, NULL);
    json_t *body = json_object_get(json_object_get(j, "response"), "body");
    json_t *ch = json_object_get(body, "choices");
    TM_CHECK(json_array_size(ch) == 4);
    json_t *content = json_object_get(json_object_get(json_array_get(ch, 3), "logprobs"),
                                      "content");
    TM_CHECK(json_array_size(content) == 8);
    TM_CHECK(json_is_array(json_object_get(json_array_get(content, 0), "bytes")));
    TM_CHECK(json_is_real(json_object_get(json_array_get(content, 0), "logprob")));
    json_decref(j);
    c[0]->format = TM_REC_FORMAT_OPENAI_COMPLETION;
    tm_buf_clear(&b);
    TM_CHECK_OK(tm_sink_format_ok(&b, c[0], &err), &err);
    j = json_loads(b.data, 0, NULL);
    ch = json_object_get(json_object_get(json_object_get(j, "response"), "body"), "choices");
    json_t *cl = json_object_get(json_array_get(ch, 0), "logprobs");
    TM_CHECK(json_array_size(json_object_get(cl, "tokens")) == 8);
    TM_CHECK(json_array_size(json_object_get(cl, "text_offset")) == 8);
    TM_CHECK(json_object_size(json_array_get(json_object_get(cl, "top_logprobs"), 0)) == 1);
    json_decref(j);
    tm_buf_fini(&b);
    tm_completion_destroy(c[0]);
    tm_completion_destroy(c[1]);
}

// A record's output line without the fields that may differ between runs (timing, cache use).
static char *canon(tm_completion *c) {
    tm_err err = {0};
    tm_buf b = {0};
    c->ttft_ms = c->total_ms = 0;
    c->n_tok_cached = 0;
    TM_CHECK_OK(tm_sink_format_ok(&b, c, &err), &err);
    return b.data;
}

static tm_job *inv_job(int i) {
    static const char *pre[5] = {
        "Once upon a time, in a kingdom by the sea, there lived ",
        "def fibonacci(n):\n    if n < 2:\n        return n\n    return ",
        "Translate to French: the cat sleeps on the warm windowsill while ",
        "北京是中国的首都，",
        "Q: What is 17 times 23? A: ",
    };
    char p[256];
    snprintf(p, sizeof(p), "%s%d and %d", pre[i % 5], i, i * 13);
    tm_job *job = new_job(i, p, 3 + i % 7, i % 3 ? 0.8f : 0.0f, (uint64_t)i * 31);
    job->logprobs = i % 2;
    job->top_logprobs = i % 4 == 1 ? 3 : 0;
    job->ignore_eos = i % 5 == 0;
    if (i % 10 == 4)
        job->n = 2;
    if (i % 10 == 6)
        job->prompt_logprobs = 1;
    if (i % 10 == 8) { // a scoring record
        job->sp.set &= ~(uint32_t)TM_SP_MAX_TOKENS;
        job->continuations = tm_calloc(2, sizeof(char *));
        job->continuations[0] = tm_strdup(" the end");
        job->continuations[1] = tm_strdup(" and so on, and so forth");
        job->n_continuations = 2;
        job->logprobs = 1;
    }
    return job;
}

static void test_batch_invariance(void) {
    static const run_opts runs[4] = {
        {1, 64, 256, 0, TM_SCHED_FCFS},   // alone: one sequence at a time
        {8, 40, 256, 1, TM_SCHED_PREFIX}, // mixed batches, small chunks, cache
        {8, 96, 256, 0, TM_SCHED_FCFS},   // mixed batches, cache off
        {8, 96, 20, 1, TM_SCHED_PREFIX},  // a small KV pool: preemption and recompute
    };
    char *ref[N_INV] = {0};
    for (int k = 0; k < 4; k++) {
        tm_job *jobs[N_INV];
        tm_completion *c[N_INV] = {0};
        for (int i = 0; i < N_INV; i++)
            jobs[i] = inv_job(i);
        run_jobs(&runs[k], jobs, N_INV, c, N_INV);
        for (int i = 0; i < N_INV; i++) {
            TM_CHECK(c[i] != NULL);
            if (!c[i])
                continue;
            char *line = canon(c[i]);
            if (k == 0)
                ref[i] = line;
            else {
                TM_CHECK_MSG(ref[i] && line && strcmp(ref[i], line) == 0,
                             "run %d record %d differs:\n%s\n%s", k, i, ref[i], line);
                tm_free(line);
            }
            tm_completion_destroy(c[i]);
        }
    }
    for (int i = 0; i < N_INV; i++)
        tm_free(ref[i]);
}

int main(void) {
    char dir[] = "/tmp/tm_logprobs_XXXXXX";
    tm_unit_llama_open(dir, 5, &g_model, &g_tok);
    TM_RUN(test_logprobs_and_scoring);
    TM_RUN(test_n_samples);
    TM_RUN(test_batch_invariance);
    tm_unit_llama_close(dir, g_model, g_tok);
    return tm_test_report();
}
