/* tests/unit/test_spec_mtp.c - speculative decoding with MTP drafts (engine.speculative.method
 * "mtp", docs/speculative.md "MTP") on small mkmodel DeepSeek-V4 checkpoints with an MTP layer and
 * the CPU engine (the demo model's tokenizer, random weights):
 *  - the job spec takes "mtp"; the runner refuses it, naming the field, for a DeepSeek-V4 model
 *    without an MTP layer and for a Llama-family model;
 *  - lossless: greedy and sampled records byte-identical with MTP drafts on (k = 3: the one MTP
 *    layer chained on its own output streams) and off, at several batch sizes, with chunked
 *    prefill and with a KV pool so small that sequences are preempted; drafts made;
 *  - the MTP layer's state follows the kept tokens only: with no chunking or preemption limits
 *    each record's draft and acceptance counts are the same at batch 1 and batch 6 (a draft is a
 *    function of the record's kept tokens alone; rejected positions' MTP rows are recomputed);
 *  - metrics: per-position counts sum to the accepted tokens and the records' usage counts sum to
 *    the job's;
 *  - acceptance: with --dsv4-mtp-copy (the MTP block a copy of the main model's last layer, its
 *    head the model's) vs an independent random MTP layer; printed only (both ~0 on random
 *    weights, docs/speculative.md);
 *  - the cost of a draft step vs a decode step (printed; bench/spec_mtp_cpu.sh).
 * Needs mkmodel (TM_BUILD) and models/demo-pystdlib (TM_SRC); skipped without mkmodel. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/queue.h"
#include "ingest/job_spec.h"
#include "runner/engine/cpu/dsv4.h"
#include "runner/engine/engine.h"
#include "runner/model/model.h"
#include "runner/runner.h"
#include "runner/text/tokenizer.h"
#include "tm_test.h"

#define DEMO "models/demo-pystdlib"
#define N_REC 8
#define MK_BASE                                                                                    \
    "--arch deepseek_v4 --tokenizer " DEMO " --hidden 32 --heads 4 --head-dim 16 --o-groups 2 "    \
    "--o-lora 8 --q-lora 16 --ff 16 --ctx 1024 --window 8 --index-heads 4 --index-dim 8 "          \
    "--index-topk 3 --rope-dim 4 --experts 4 --experts-used 2 --hca-ratio 16 --hc 2 --dtype f32 "

static tm_tokenizer *g_tok;
static char g_dir[64];
static int g_ids; // 1: prompts as token ids below 16 (the 16-token models), EOS ignored

// mkmodel --out g_dir/name args; the loaded model, or NULL.
static tm_model *make_model(const char *name, const char *args) {
    char cmd[2048];
    snprintf(cmd, sizeof(cmd), "'%s/mkmodel' --out '%s/%s' %s >/dev/null", getenv("TM_BUILD"),
             g_dir, name, args);
    TM_CHECK_MSG(system(cmd) == 0, "%s", cmd);
    snprintf(cmd, sizeof(cmd), "%s/%s", g_dir, name);
    tm_err err = {0};
    tm_model *m = NULL;
    TM_CHECK_OK(tm_model_load(cmd, &m, &err), &err);
    return m;
}

static const char *const text[] = {
    "def clamp(x, lo, hi):\n    if x < lo:\n        return lo\n",
    "class Point:\n    def __init__(self, x, y):\n",
    "import os\n\n\ndef list_files(path):\n    out = []\n    for name in os.listdir(path):\n",
    "def count_words(text):\n    counts = {}\n",
};

static tm_job *new_job(int i) {
    tm_job *job = tm_calloc(1, sizeof(*job));
    TM_ASSERT(job);
    job->seq_no = (uint64_t)i;
    char id[16];
    snprintf(id, sizeof(id), "%d", i);
    job->id_json = tm_strdup(id);
    job->sp.set = TM_SP_MAX_TOKENS | TM_SP_SEED;
    if (g_ids) {
        job->n_prompt_ids = 6 + 3 * (uint32_t)i;
        job->prompt_ids = tm_calloc(job->n_prompt_ids, sizeof(uint32_t));
        TM_ASSERT(job->prompt_ids);
        for (uint32_t t = 0; t < job->n_prompt_ids; t++)
            job->prompt_ids[t] = (t * 5u + (uint32_t)i) % 16u;
        job->sp.set |= TM_SP_IGNORE_EOS;
        job->sp.ignore_eos = 1;
    } else
        job->prompt = tm_strdup(text[i % 4]);
    job->sp.max_tokens = i % 4 == 3 ? 5 + i : 40 + 4 * (i % 3);
    job->sp.seed = 7 + (uint64_t)i;
    return job;
}

typedef struct result {
    char *text[N_REC];
    uint32_t n_gen[N_REC], drafts[N_REC], draft_tok[N_REC], acc[N_REC];
    tm_runner_stats stats;
} result;

typedef struct variant {
    uint32_t max_seqs, max_batched_tokens, n_kv_block;
    int sampled, prefix_cache;
} variant;

// The N_REC records through the runner; spec_k 0: off. Returns the runner's rc (err set).
static tm_rc run(tm_model *m, const variant *v, uint32_t spec_k, int mtp, result *res,
                 tm_err *err) {
    tm_engine_opts eo = {.n_threads = 2,
                         .block_size = 16,
                         .n_kv_block = v->n_kv_block,
                         .max_seqs = v->max_seqs,
                         .max_batched_tokens = v->max_batched_tokens,
                         .max_rows = v->max_seqs * (spec_k + 1)};
    tm_engine *eng = NULL;
    TM_ASSERT(tm_engine_cpu_create(m, &eo, &eng, err) == TM_OK);
    tm_queue *in = NULL, *out = NULL;
    TM_ASSERT(tm_queue_create(N_REC + 1, &in, err) == TM_OK);
    TM_ASSERT(tm_queue_create(N_REC + 1, &out, err) == TM_OK);
    for (int i = 0; i < N_REC; i++)
        TM_CHECK(tm_queue_push(in, new_job(i)) == TM_OK);
    tm_queue_close(in);
    tm_runner_cfg cfg = {.max_seqs = v->max_seqs,
                         .max_batched_tokens = v->max_batched_tokens,
                         .block_size = 16,
                         .n_kv_block = v->n_kv_block,
                         .n_ctx = m->cfg.n_ctx,
                         .prefix_cache = v->prefix_cache,
                         .policy = TM_SCHED_FCFS,
                         .lookahead = 16,
                         .spec_k = spec_k,
                         .spec_lookup_min = 2,
                         .spec_lookup_max = 4,
                         .spec_no_gate = true,
                         .spec_mtp = mtp};
    cfg.defaults.max_tokens = 16;
    cfg.defaults.temperature = v->sampled ? 0.8f : 0.0f;
    cfg.defaults.top_p = v->sampled ? 0.95f : 1.0f;
    cfg.defaults.top_k = -1;
    memset(res, 0, sizeof(*res));
    tm_rc rc = tm_runner_run(&cfg, eng, g_tok, in, out, &res->stats, err);
    tm_queue_close(out);
    void *item;
    while (tm_queue_pop(in, &item) == TM_OK) // left when the runner refused to start
        tm_job_destroy(item);
    while (tm_queue_pop(out, &item) == TM_OK) {
        tm_completion *c = item;
        const int i = atoi(c->id_json);
        TM_CHECK_MSG(c->err_code == TM_ERRCODE_NONE, "record %d: %s", i, c->err_msg);
        TM_CHECK(res->text[i] == NULL);
        res->text[i] = c->text, c->text = NULL;
        res->n_gen[i] = c->n_tok_gen;
        res->drafts[i] = c->n_spec_drafts;
        res->draft_tok[i] = c->n_spec_draft_tok;
        res->acc[i] = c->n_spec_accepted;
        tm_completion_destroy(c);
    }
    tm_queue_destroy(in);
    tm_queue_destroy(out);
    tm_engine_destroy(eng);
    return rc;
}

static void result_fini(result *r) {
    for (int i = 0; i < N_REC; i++)
        tm_free(r->text[i]);
}

// The job's counters agree with themselves and with the records' usage counts.
static void check_metrics(const result *on) {
    const tm_runner_stats *s = &on->stats;
    uint64_t pos_sum = 0, d = 0, dt = 0, a = 0;
    for (int k = 0; k < TM_SPEC_MAX_K; k++) {
        pos_sum += s->spec_accepted_pos[k];
        if (k > 0)
            TM_CHECK(s->spec_accepted_pos[k] <= s->spec_accepted_pos[k - 1]);
    }
    for (int i = 0; i < N_REC; i++)
        d += on->drafts[i], dt += on->draft_tok[i], a += on->acc[i];
    TM_CHECK(pos_sum == s->n_spec_accepted);
    TM_CHECK(s->n_spec_accepted <= s->n_spec_draft_tok &&
             s->n_spec_draft_tok <= 3 * s->n_spec_drafts);
    TM_CHECK(d == s->n_spec_drafts && dt == s->n_spec_draft_tok && a == s->n_spec_accepted);
}

static uint64_t g_accepted; // drafts accepted in all check_variant runs

// On and off: every record byte-identical; drafts made. on_out: NULL, or gets
// the run with drafts (the caller frees it).
static void check_variant(tm_model *m, const variant *v, result *on_out) {
    tm_err err = {0};
    result off, on;
    TM_CHECK_OK(run(m, v, 0, 0, &off, &err), &err);
    TM_CHECK_OK(run(m, v, 3, 1, &on, &err), &err);
    for (int i = 0; i < N_REC; i++)
        TM_CHECK_MSG(off.text[i] && on.text[i] && strcmp(off.text[i], on.text[i]) == 0 &&
                         off.n_gen[i] == on.n_gen[i],
                     "max_seqs %u tokens %u kv %u sampled %d: record %d differs", v->max_seqs,
                     v->max_batched_tokens, v->n_kv_block, v->sampled, i);
    const tm_runner_stats *s = &on.stats;
    TM_CHECK(off.stats.n_spec_drafts == 0 && s->n_spec_drafts > 0); // random weights: few accepted
    check_metrics(&on);
    g_accepted += s->n_spec_accepted;
    printf("  max_seqs %u tokens %u kv %u sampled %d: %llu preemptions; %llu drafts, %llu/%llu "
           "accepted, steps %llu vs %llu\n",
           v->max_seqs, v->max_batched_tokens, v->n_kv_block, v->sampled,
           (unsigned long long)s->n_preempt, (unsigned long long)s->n_spec_drafts,
           (unsigned long long)s->n_spec_accepted, (unsigned long long)s->n_spec_draft_tok,
           (unsigned long long)s->n_step, (unsigned long long)off.stats.n_step);
    if (v->n_kv_block < 20)
        TM_CHECK(s->n_preempt > 0);
    result_fini(&off);
    if (on_out)
        *on_out = on;
    else
        result_fini(&on);
}

static tm_model *g_copy, *g_rand, *g_copy16, *g_rand16;

static void test_refused(void) {
    tm_err err = {0};
    const char *jtext =
        "{\"model\": \"m\", \"input\": {\"files\": [\"tests/fixtures/spec/copy.jsonl\"]}, "
        "\"output\": {\"dir\": \"o\"}, \"engine\": {\"speculative\": "
        "{\"method\": \"mtp\", \"num_speculative_tokens\": 2}}}";
    tm_job_spec *spec = NULL;
    TM_CHECK_OK(tm_job_spec_load_text("(t)", NULL, jtext, &spec, &err), &err);
    TM_CHECK(spec && spec->engine.spec_mtp && spec->engine.spec_k == 2 &&
             strstr(spec->canonical_json, "\"method\":\"mtp\"") != NULL);
    tm_job_spec_destroy(spec);
    // a DeepSeek-V4 model without an MTP layer, and a Llama-family model: refused at start
    tm_model *none = make_model("nomtp", MK_BASE "--seed 3 --layers 2 --dsv4-layers sc "
                                                 "--dsv4-mlp hm");
    tm_model *llama = NULL;
    TM_CHECK_OK(tm_model_load(DEMO, &llama, &err), &err);
    tm_model *ms[2] = {none, llama};
    for (int i = 0; i < 2; i++) {
        if (!ms[i])
            continue;
        TM_CHECK(!tm_dsv4_has_mtp(ms[i]) && !tm_model_has_drafter(ms[i]));
        result r;
        variant v = {.max_seqs = 2, .max_batched_tokens = 64, .n_kv_block = 64};
        TM_CHECK(run(ms[i], &v, 2, 1, &r, &err) == TM_E_INVAL);
        TM_CHECK_MSG(strstr(err.msg, "engine.speculative.method") != NULL, "%s", err.msg);
        result_fini(&r);
    }
    tm_model_destroy(none);
    tm_model_destroy(llama);
}

static void test_lossless(void) {
    const int small = getenv("TM_TEST_SMALL") != NULL;
    static const uint32_t batches[] = {1, 3, 8};
    for (size_t i = 0; i < 3; i++)
        if (!small || i != 1)
            check_variant(g_rand,
                          &(variant){.max_seqs = batches[i],
                                     .max_batched_tokens = 256,
                                     .n_kv_block = 128,
                                     .prefix_cache = 1},
                          NULL);
    // sampled (the target's own draw decides a point-mass draft), chunked prefill
    check_variant(
        g_rand,
        &(variant){.max_seqs = 4, .max_batched_tokens = 13, .n_kv_block = 128, .sampled = 1}, NULL);
    check_variant(g_copy, &(variant){.max_seqs = 3, .max_batched_tokens = 16, .n_kv_block = 128},
                  NULL);
    // 9 blocks of 16 tokens for 4 sequences of ~60 tokens: preemption under speculation
    check_variant(
        g_copy,
        &(variant){.max_seqs = 4, .max_batched_tokens = 256, .n_kv_block = 9, .prefix_cache = 1},
        NULL);
    check_variant(
        g_rand, &(variant){.max_seqs = 4, .max_batched_tokens = 40, .n_kv_block = 9, .sampled = 1},
        NULL);
}

// Each record's drafts depend on its kept tokens only: the same at batch 1 and 6.
static void test_state_per_record(void) {
    tm_err err = {0};
    result a, b;
    TM_CHECK_OK(run(g_copy, &(variant){.max_seqs = 1, .max_batched_tokens = 256, .n_kv_block = 128},
                    3, 1, &a, &err),
                &err);
    TM_CHECK_OK(run(g_copy, &(variant){.max_seqs = 6, .max_batched_tokens = 256, .n_kv_block = 128},
                    3, 1, &b, &err),
                &err);
    for (int i = 0; i < N_REC; i++)
        TM_CHECK_MSG(a.drafts[i] == b.drafts[i] && a.draft_tok[i] == b.draft_tok[i] &&
                         a.acc[i] == b.acc[i],
                     "record %d: drafts %u/%u tokens %u/%u accepted %u/%u", i, a.drafts[i],
                     b.drafts[i], a.draft_tok[i], b.draft_tok[i], a.acc[i], b.acc[i]);
    result_fini(&a);
    result_fini(&b);
}

// Acceptance with the copied MTP block vs an independent random one (greedy, batch 4).
static void acceptance(tm_model *copy, tm_model *rnd) {
    result c, r;
    const variant v = {.max_seqs = 4, .max_batched_tokens = 256, .n_kv_block = 128};
    check_variant(copy, &v, &c);
    check_variant(rnd, &v, &r);
    const double ac = (double)c.stats.n_spec_accepted / (double)c.stats.n_spec_draft_tok;
    const double ar = (double)r.stats.n_spec_accepted / (double)r.stats.n_spec_draft_tok;
    printf("  acceptance (k 3): copy %.3f (%llu/%llu, mean length %.2f; pos1 %llu/%llu), "
           "random %.3f (%llu/%llu, mean length %.2f)\n",
           ac, (unsigned long long)c.stats.n_spec_accepted,
           (unsigned long long)c.stats.n_spec_draft_tok,
           1.0 + (double)c.stats.n_spec_accepted / (double)c.stats.n_spec_drafts,
           (unsigned long long)c.stats.spec_accepted_pos[0],
           (unsigned long long)c.stats.n_spec_drafts, ar,
           (unsigned long long)r.stats.n_spec_accepted,
           (unsigned long long)r.stats.n_spec_draft_tok,
           1.0 + (double)r.stats.n_spec_accepted / (double)r.stats.n_spec_drafts);
    // Not asserted: on random weights both are ~0 (the copy leaves e_proj / h_proj / enorm / hnorm
    // random, so the MTP block does not see what the main model's last layer sees).
    result_fini(&c);
    result_fini(&r);
}

static void test_acceptance(void) {
    acceptance(g_copy, g_rand);
    g_ids = 1;
    acceptance(g_copy16, g_rand16);
    g_ids = 0;
}

// The 16-token models, prompts as ids: some drafts are accepted, so the MTP catch-up runs over
// several kept rows of a verification.
static void test_lossless_accepting(void) {
    g_ids = 1;
    g_accepted = 0;
    static const uint32_t batches[] = {1, 5};
    for (int i = 0; i < 2; i++) {
        check_variant(g_copy16,
                      &(variant){.max_seqs = batches[i],
                                 .max_batched_tokens = 256,
                                 .n_kv_block = 128,
                                 .prefix_cache = 1},
                      NULL);
    }
    check_variant(
        g_rand16,
        &(variant){.max_seqs = 4, .max_batched_tokens = 13, .n_kv_block = 128, .sampled = 1}, NULL);
    check_variant(
        g_copy16,
        &(variant){.max_seqs = 4, .max_batched_tokens = 256, .n_kv_block = 9, .prefix_cache = 1},
        NULL);
    check_variant(
        g_rand16,
        &(variant){.max_seqs = 4, .max_batched_tokens = 40, .n_kv_block = 9, .sampled = 1}, NULL);
    TM_CHECK(g_accepted > 0); // deterministic: these records get some drafts accepted
    // per record: the same drafts and acceptances at batch 1 and 6
    tm_err err = {0};
    result a, b;
    TM_CHECK_OK(run(g_copy16,
                    &(variant){.max_seqs = 1, .max_batched_tokens = 256, .n_kv_block = 128}, 3, 1,
                    &a, &err),
                &err);
    TM_CHECK_OK(run(g_copy16,
                    &(variant){.max_seqs = 6, .max_batched_tokens = 256, .n_kv_block = 128}, 3, 1,
                    &b, &err),
                &err);
    for (int i = 0; i < N_REC; i++)
        TM_CHECK_MSG(a.drafts[i] == b.drafts[i] && a.draft_tok[i] == b.draft_tok[i] &&
                         a.acc[i] == b.acc[i],
                     "16-token record %d: drafts %u/%u tokens %u/%u accepted %u/%u", i, a.drafts[i],
                     b.drafts[i], a.draft_tok[i], b.draft_tok[i], a.acc[i], b.acc[i]);
    result_fini(&a);
    result_fini(&b);
    g_ids = 0;
}

// ---- the draft step's cost (bench/spec_mtp_cpu.sh) ----

// Milliseconds per call of: a decode step (batch B, one token each), an MTP draft step (one row
// each, the chain's step), a verification step of k = 3 drafts (4 tokens each, 4 rows each).
static void cost(tm_model *m, uint32_t B, uint32_t reps) {
    enum { P = 64, K = 3 };
    tm_err err = {0};
    tm_engine_opts eo = {.n_threads = 2,
                         .block_size = 16,
                         .n_kv_block = B * (P + 16) / 16,
                         .max_seqs = B,
                         .max_batched_tokens = B * P,
                         .max_rows = B * (K + 1)};
    tm_engine *eng = NULL;
    TM_CHECK_OK(tm_engine_cpu_create(m, &eo, &eng, &err), &err);
    if (!eng)
        return;
    uint32_t *toks = tm_calloc((size_t)B * P, sizeof(uint32_t)), *bt = tm_calloc(B * 5, 4);
    tm_batch_seq *bs = tm_calloc(B, sizeof(*bs));
    tm_dsv4_mtp_seq *ms = tm_calloc(B, sizeof(*ms));
    const uint32_t nd = tm_dsv4_mtp_width(eng);
    float *lg = tm_calloc((size_t)B * (K + 1) * m->cfg.n_vocab, sizeof(float));
    float *st = tm_calloc((size_t)B * nd, sizeof(float)), *so = tm_calloc((size_t)B * nd, 4);
    TM_ASSERT(toks && bt && bs && ms && lg && st && so && nd);
    for (uint32_t i = 0; i < B * P; i++)
        toks[i] = 10 + (i * 7919u) % 2000u;
    for (uint32_t i = 0; i < B * 5; i++)
        bt[i] = i;
    for (uint32_t b = 0; b < B; b++) // prefill P - 1 tokens each
        bs[b] = (tm_batch_seq){.tokens = toks + b * P,
                               .n_tok = P - 1,
                               .pos = 0,
                               .block_table = bt + b * 5,
                               .n_block = 4,
                               .want_logits = 1};
    TM_CHECK_OK(tm_engine_forward(eng, &(tm_batch){.seqs = bs, .n_seq = B}, lg, &err), &err);
    double t_dec = 0, t_mtp = 0, t_ver = 0;
    for (uint32_t r = 0; r < reps; r++) {
        for (uint32_t b = 0; b < B; b++)
            bs[b] = (tm_batch_seq){.tokens = toks + b * P + P - 1,
                                   .n_tok = 1,
                                   .pos = P - 1,
                                   .block_table = bt + b * 5,
                                   .n_block = 4,
                                   .want_logits = 1};
        double t0 = tm_now_ms();
        TM_CHECK_OK(tm_engine_forward(eng, &(tm_batch){.seqs = bs, .n_seq = B}, lg, &err), &err);
        t_dec += tm_now_ms() - t0;
        uint32_t n_h = 0;
        const float *h = tm_dsv4_hidden(eng, &n_h);
        TM_ASSERT(h && n_h == B);
        memcpy(st, h, (size_t)B * nd * sizeof(float));
        for (uint32_t b = 0; b < B; b++)
            ms[b] = (tm_dsv4_mtp_seq){.hidden = st + (size_t)b * nd,
                                      .next = toks + b * P,
                                      .n_tok = 1,
                                      .pos = P - 1,
                                      .block_table = bt + b * 5,
                                      .n_block = 4,
                                      .want_logits = 1};
        t0 = tm_now_ms();
        TM_CHECK_OK(tm_dsv4_mtp_forward(eng, ms, B, lg, so, &err), &err);
        t_mtp += tm_now_ms() - t0;
        for (uint32_t b = 0; b < B; b++) // P - 4 .. P - 1 again: the decode token and 3 drafts
            bs[b] = (tm_batch_seq){.tokens = toks + b * P + P - 4,
                                   .n_tok = K + 1,
                                   .pos = P - 4,
                                   .block_table = bt + b * 5,
                                   .n_block = 4,
                                   .want_logits = 1,
                                   .n_logits = K + 1};
        t0 = tm_now_ms();
        TM_CHECK_OK(tm_engine_forward(eng, &(tm_batch){.seqs = bs, .n_seq = B}, lg, &err), &err);
        t_ver += tm_now_ms() - t0;
    }
    printf("  cost batch %u (%u reps, 2 threads): decode step %.3f ms, MTP draft step %.3f ms "
           "(%.2fx), verification of %d drafts %.3f ms (%.2fx)\n",
           B, reps, t_dec / reps, t_mtp / reps, t_mtp / t_dec, K, t_ver / reps, t_ver / t_dec);
    tm_free(toks), tm_free(bt), tm_free(bs), tm_free(ms), tm_free(lg), tm_free(st), tm_free(so);
    tm_engine_destroy(eng);
}

static void test_cost(void) {
    const char *dir = getenv("TM_SPEC_MTP_BENCH"); // a model folder: the bench's figures
    tm_model *m = NULL;
    tm_err err = {0};
    if (dir)
        TM_CHECK_OK(tm_model_load(dir, &m, &err), &err);
    const uint32_t reps = dir ? 20 : 2;
    cost(dir ? m : g_copy, 1, reps);
    cost(dir ? m : g_copy, 8, reps);
    tm_model_destroy(m);
}

int main(void) {
    tm_err err = {0};
    const char *build = getenv("TM_BUILD");
    char mk[512];
    snprintf(mk, sizeof(mk), "%s/mkmodel", build ? build : ".");
    FILE *f = fopen(mk, "rb");
    if (!build || !f) {
        tm_test_skip("no mkmodel (TM_BUILD)");
        return tm_test_report();
    }
    fclose(f);
    if (tm_tok_load(DEMO, &g_tok, &err)) {
        fprintf(stderr, "test_spec_mtp: %s: %s\n", DEMO, err.msg);
        return 1;
    }
    snprintf(g_dir, sizeof(g_dir), "/tmp/tm_test_specmtp_XXXXXX");
    TM_ASSERT(mkdtemp(g_dir));
    // two layers (sliding, compressed); the MTP block compressed (its compressor state rolls
    // back too): a copy of layer 1 and of the head, or its own random values
    g_copy = make_model("copy", MK_BASE "--seed 5 --layers 2 --dsv4-layers sc --dsv4-mlp hm "
                                        "--dsv4-mtp cm --dsv4-mtp-copy 1");
    g_rand = make_model("rand", MK_BASE "--seed 5 --layers 2 --dsv4-layers sc --dsv4-mlp hm "
                                        "--dsv4-mtp cm");
#define MK16                                                                                       \
    "--arch deepseek_v4 --vocab 16 --hidden 32 --heads 4 --head-dim 16 --o-groups 2 --o-lora 8 "   \
    "--q-lora 16 --ff 16 --ctx 1024 --window 8 --index-heads 4 --index-dim 8 --index-topk 3 "      \
    "--rope-dim 4 --experts 4 --experts-used 2 --hca-ratio 16 --hc 2 --dtype f32 --seed 5 "        \
    "--layers 2 --dsv4-layers sc --dsv4-mlp hm --dsv4-mtp cm "
    g_copy16 = make_model("copy16", MK16 "--dsv4-mtp-copy 1");
    g_rand16 = make_model("rand16", MK16);
    if (g_copy && g_rand && g_copy16 && g_rand16) {
        TM_RUN(test_refused);
        TM_RUN(test_lossless);
        TM_RUN(test_lossless_accepting);
        TM_RUN(test_state_per_record);
        TM_RUN(test_acceptance);
        TM_RUN(test_cost);
    }
    tm_model_destroy(g_copy);
    tm_model_destroy(g_rand);
    tm_model_destroy(g_copy16);
    tm_model_destroy(g_rand16);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_dir);
    TM_CHECK(system(cmd) == 0);
    tm_tok_destroy(g_tok);
    return tm_test_report();
}
