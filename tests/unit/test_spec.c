/* tests/unit/test_spec.c - speculative decoding with n-gram drafts (issue 25) on the trained demo
 * model (models/demo-pystdlib, docs/demo_model.md) and the CPU engine:
 *  - tm_spec_ngram_propose against a naive reference on random token strings (longest match in
 *    [min, max], most recent occurrence, k and the end of the string), and the adaptive rule;
 *  - the engine's n_logits rows are bit-identical to the rows of one-token steps;
 *  - lossless: every record (greedy, sampled, penalties, stop strings, short max_tokens, logprobs,
 *    structured output (a regex whose mask cuts drafts),
 *    n > 1) is byte-identical with speculation on and off, at max_seqs 1..8, with chunked prefill,
 *    the prefix cache on and off, a KV pool so small that sequences are preempted under
 *    speculation, and through engines whose forward_greedy / forward_sample pick on the "device"
 *    (wrappers of the CPU engine, as the CUDA engine does), so the rows' parameters (history and
 *    step of each draft position) are checked too; drafts must have been made and accepted;
 *  - the distribution: 3000 seeded three-token records with top_k 5 at temperature 1, a draft from
 *    1-grams at the second token (made for most records, accepted or rejected), against the exact
 * joint distribution of (token 1, token 2) computed from the model's logits: chi-square test.
 * With TM_TEST_SMALL (the sanitized build) batch sizes 1, 4, 7 and 1500 draws. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/queue.h"
#include "ingest/job_spec.h"
#include "runner/engine/engine.h"
#include "runner/model/model.h"
#include "runner/runner.h"
#include "runner/sched/sample.h"
#include "runner/sched/spec.h"
#include "runner/text/tokenizer.h"
#include "tm_test.h"

#define DEMO "models/demo-pystdlib"

static tm_model *g_model;
static tm_tokenizer *g_tok;

// ---- the proposer ----

static uint64_t g_rng = 88172645463325252ull;
static uint32_t rnd(uint32_t n) {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng % n);
}

// Naive reference: every length from max down to min, every earlier end position from the most
// recent back; the first hit wins.
static uint32_t ref_propose(const uint32_t *t, size_t n, uint32_t lo, uint32_t hi, uint32_t k,
                            uint32_t *out) {
    for (uint32_t len = hi; len >= lo; len--) {
        if (len >= n)
            continue;
        for (size_t e = n - 1; e >= len; e--) { // occurrence t[e - len, e) == t[n - len, n)
            if (memcmp(t + e - len, t + n - len, len * sizeof(*t)) != 0)
                continue;
            uint32_t got = 0;
            for (size_t i = e; i < n && got < k; i++)
                out[got++] = t[i];
            return got;
        }
    }
    return 0;
}

static void test_propose_cases(void) {
    uint32_t out[TM_SPEC_MAX_K];
    // a b c d X a b c -> longest (3) match "a b c" at 0: drafts "d X a"
    const uint32_t t1[] = {1, 2, 3, 4, 9, 1, 2, 3};
    TM_CHECK(tm_spec_ngram_propose(t1, 8, 1, 3, 3, out) == 3);
    TM_CHECK(out[0] == 4 && out[1] == 9 && out[2] == 1);
    // the most recent of two equal matches: "7 5" at 1 and at 4 -> what follows the one at 4
    const uint32_t t2[] = {0, 7, 5, 8, 7, 5, 6, 7, 5};
    TM_CHECK(tm_spec_ngram_propose(t2, 9, 2, 2, 2, out) == 2);
    TM_CHECK(out[0] == 6 && out[1] == 7);
    // no n-gram of min length: nothing
    TM_CHECK(tm_spec_ngram_propose(t2, 9, 3, 4, 2, out) == 0);
    // drafts stop at the end of the string
    const uint32_t t3[] = {3, 4, 3};
    TM_CHECK(tm_spec_ngram_propose(t3, 3, 1, 1, 5, out) == 2);
    TM_CHECK(out[0] == 4 && out[1] == 3);
    TM_CHECK(tm_spec_ngram_propose(t3, 1, 1, 1, 5, out) == 0);
    TM_CHECK(tm_spec_ngram_propose(t3, 3, 1, 1, 0, out) == 0);
}

static void test_propose_random(void) {
    uint32_t t[200], a[TM_SPEC_MAX_K], b[TM_SPEC_MAX_K];
    for (int it = 0; it < 4000; it++) {
        const uint32_t n = 1 + rnd(200), alpha = 2 + rnd(6);
        for (uint32_t i = 0; i < n; i++)
            t[i] = rnd(alpha);
        const uint32_t lo = 1 + rnd(4), hi = lo + rnd(4), k = rnd(TM_SPEC_MAX_K + 1);
        const uint32_t na = tm_spec_ngram_propose(t, n, lo, hi, k, a);
        const uint32_t nb = ref_propose(t, n, lo, hi, k, b);
        TM_CHECK_MSG(na == nb && memcmp(a, b, na * sizeof(*a)) == 0,
                     "n %u alphabet %u lookup %u..%u k %u: %u vs %u drafts", n, alpha, lo, hi, k,
                     na, nb);
    }
}

static void test_adaptive(void) {
    tm_spec_state st = {0};
    TM_CHECK(tm_spec_may_draft(&st));
    tm_spec_verified(&st, 3, 0);
    TM_CHECK(tm_spec_may_draft(&st)); // one miss: still drafting
    tm_spec_verified(&st, 3, 0);      // the second in a row: a pause of TM_SPEC_PAUSE0 steps
    for (int i = 0; i < TM_SPEC_PAUSE0; i++)
        TM_CHECK(!tm_spec_may_draft(&st));
    TM_CHECK(tm_spec_may_draft(&st));
    tm_spec_verified(&st, 2, 0);
    tm_spec_verified(&st, 2, 0); // the next pause doubles
    int paused = 0;
    while (!tm_spec_may_draft(&st))
        paused++;
    TM_CHECK(paused == 2 * TM_SPEC_PAUSE0);
    tm_spec_verified(&st, 2, 1); // an acceptance resets everything
    TM_CHECK(st.miss == 0 && st.pause == 0 && st.next == 0);
    for (int r = 0; r < 20; r++) { // the pause never exceeds TM_SPEC_PAUSE_MAX
        tm_spec_verified(&st, 1, 0);
        tm_spec_verified(&st, 1, 0);
        TM_CHECK(st.pause <= TM_SPEC_PAUSE_MAX);
        while (!tm_spec_may_draft(&st))
            ;
    }
    TM_CHECK(st.next == TM_SPEC_PAUSE_MAX);
    // the step gate's estimate: from TM_SPEC_GAIN0 towards the accepted counts, back when gated
    st = (tm_spec_state){0};
    TM_CHECK(tm_spec_gain(&st) == TM_SPEC_GAIN0);
    for (int i = 0; i < 40; i++)
        tm_spec_verified(&st, 5, 5);
    TM_CHECK(fabsf(tm_spec_gain(&st) - 5.0f) < 1e-3f);
    for (int i = 0; i < 40; i++)
        tm_spec_verified(&st, 5, 0);
    TM_CHECK(tm_spec_gain(&st) < 0.01f);
    for (int i = 0; i < 100; i++)
        tm_spec_gated(&st);
    TM_CHECK(tm_spec_gain(&st) > 0.9f * TM_SPEC_GAIN0 && tm_spec_gain(&st) <= TM_SPEC_GAIN0);
    // the gate: open until both times are known, and for one record; else gain >= B (r - 1)
    TM_CHECK(tm_spec_gate_open(0.1, 8, 0, 1e-3) && tm_spec_gate_open(0.1, 8, 2e-3, 0));
    TM_CHECK(tm_spec_gate_open(0.1, 1, 5e-3, 1e-3));
    TM_CHECK(!tm_spec_gate_open(3.9, 8, 1.5e-3, 1e-3) && tm_spec_gate_open(4.0, 8, 1.5e-3, 1e-3));
    TM_CHECK(tm_spec_gate_open(0.0, 8, 0.9e-3, 1e-3)); // drafts cost nothing more
}

// ---- engine.speculative in the job spec ----

// The job with engine.speculative = sp loaded: its k / min / max, or the error's code.
static tm_rc load_spec(const char *sp, uint32_t *k, uint32_t *lo, uint32_t *hi, char *canon,
                       size_t n_canon, tm_err *err) {
    char text[1024];
    snprintf(
        text, sizeof(text),
        "{\"model\": \"m\", \"input\": {\"files\": [\"%s\"]}, \"output\": {\"dir\": \"o\"}%s%s%s}",
        "tests/fixtures/spec/copy.jsonl", sp ? ", \"engine\": {\"speculative\": " : "",
        sp ? sp : "", sp ? "}" : "");
    tm_job_spec *spec = NULL;
    tm_rc rc = tm_job_spec_load_text("(t)", NULL, text, &spec, err);
    if (!rc) {
        *k = spec->engine.spec_k, *lo = spec->engine.spec_lookup_min;
        *hi = spec->engine.spec_lookup_max;
        snprintf(canon, n_canon, "%s", spec->canonical_json);
    }
    tm_job_spec_destroy(spec);
    return rc;
}

static void test_job_spec(void) {
    tm_err err = {0};
    uint32_t k = 9, lo = 9, hi = 9;
    char c0[4096], c1[4096];
    TM_CHECK_OK(load_spec(NULL, &k, &lo, &hi, c0, sizeof(c0), &err), &err);
    TM_CHECK(k == 0 && strstr(c0, "speculative") == NULL); // off; identity unchanged
    TM_CHECK_OK(load_spec("{\"method\": \"ngram\", \"num_speculative_tokens\": 4}", &k, &lo, &hi,
                          c1, sizeof(c1), &err),
                &err);
    TM_CHECK(k == 4 && lo == 5 && hi == 5 && strstr(c1, "\"speculative\"") != NULL);
    TM_CHECK_OK(load_spec("{\"method\": \"ngram\", \"num_speculative_tokens\": 2, "
                          "\"prompt_lookup_max\": 3}",
                          &k, &lo, &hi, c1, sizeof(c1), &err),
                &err);
    TM_CHECK(k == 2 && lo == 3 && hi == 3);
    TM_CHECK_OK(load_spec("{\"method\": \"ngram\", \"num_speculative_tokens\": 2, "
                          "\"prompt_lookup_min\": 2}",
                          &k, &lo, &hi, c1, sizeof(c1), &err),
                &err);
    TM_CHECK(lo == 2 && hi == 2);
    TM_CHECK_OK(load_spec("{\"method\": \"ngram\", \"num_speculative_tokens\": 16, "
                          "\"prompt_lookup_min\": 1, \"prompt_lookup_max\": 7}",
                          &k, &lo, &hi, c1, sizeof(c1), &err),
                &err);
    TM_CHECK(k == 16 && lo == 1 && hi == 7);
    static const char *const bad[][2] = {
        {"{\"method\": \"MTP\", \"num_speculative_tokens\": 1}", "engine.speculative.method"},
        {"{\"method\": \"eagle\", \"num_speculative_tokens\": 1}", "engine.speculative.method"},
        {"{\"num_speculative_tokens\": 1}", "engine.speculative.method: required"},
        {"{\"method\": \"ngram\"}", "engine.speculative.num_speculative_tokens: required"},
        {"{\"method\": \"ngram\", \"num_speculative_tokens\": 0}", "num_speculative_tokens"},
        {"{\"method\": \"ngram\", \"num_speculative_tokens\": 17}", "num_speculative_tokens"},
        {"{\"method\": \"ngram\", \"num_speculative_tokens\": 1, \"prompt_lookup_min\": 0}",
         "prompt_lookup_min"},
        {"{\"method\": \"ngram\", \"num_speculative_tokens\": 1, \"prompt_lookup_min\": 6, "
         "\"prompt_lookup_max\": 5}",
         "prompt_lookup_min: 6 is more than"},
        {"{\"method\": \"ngram\", \"num_speculative_tokens\": 1, \"k\": 1}",
         "engine.speculative.k: unknown key"},
        {"[1]", "engine.speculative: expected an object"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        TM_CHECK(load_spec(bad[i][0], &k, &lo, &hi, c1, sizeof(c1), &err) == TM_E_INVAL);
        TM_CHECK_MSG(strstr(err.msg, bad[i][1]) != NULL, "%s: %s", bad[i][0], err.msg);
    }
}

// ---- engine rows ----

// n_logits rows of one chunk == the rows of the same positions computed one token per step.
static void test_engine_rows(void) {
    tm_err err = {0};
    enum { L = 24, K = 6 };
    const uint32_t V = g_model->cfg.n_vocab;
    tm_engine_opts eo = {.n_threads = 2,
                         .block_size = 16,
                         .n_kv_block = 16,
                         .max_seqs = 2,
                         .max_batched_tokens = 64,
                         .max_rows = 2 * (K + 1)};
    tm_engine *eng = NULL;
    TM_CHECK_OK(tm_engine_cpu_create(g_model, &eo, &eng, &err), &err);
    if (!eng)
        return;
    uint32_t tok[2][L + K], bt[2][4] = {{0, 1, 2, 3}, {4, 5, 6, 7}};
    for (uint32_t s = 0; s < 2; s++)
        for (uint32_t i = 0; i < L + K; i++)
            tok[s][i] = 3 + (i * 37 + s * 11) % 500;
    float *one = tm_calloc((size_t)2 * K * V, sizeof(float));
    float *many = tm_calloc((size_t)2 * (K + 1) * V, sizeof(float));
    TM_ASSERT(one && many);
    // one token per step: prefill [0, L), then positions L .. L + K - 1 each alone
    tm_batch_seq sq[2];
    for (uint32_t s = 0; s < 2; s++)
        sq[s] = (tm_batch_seq){.tokens = tok[s], .n_tok = L, .block_table = bt[s], .n_block = 4};
    TM_CHECK_OK(tm_engine_forward(eng, &(tm_batch){.seqs = sq, .n_seq = 2}, many, &err), &err);
    for (uint32_t k = 0; k < K; k++) {
        for (uint32_t s = 0; s < 2; s++)
            sq[s] = (tm_batch_seq){.tokens = tok[s] + L + k,
                                   .n_tok = 1,
                                   .pos = L + k,
                                   .block_table = bt[s],
                                   .n_block = 4,
                                   .want_logits = 1};
        float row2[2 * 4096];
        TM_ASSERT(2 * V <= sizeof(row2) / sizeof(row2[0]));
        TM_CHECK_OK(tm_engine_forward(eng, &(tm_batch){.seqs = sq, .n_seq = 2}, row2, &err), &err);
        for (uint32_t s = 0; s < 2; s++)
            memcpy(one + ((size_t)s * K + k) * V, row2 + (size_t)s * V, V * sizeof(float));
    }
    // again from position L - 1 as one verification chunk per sequence: rows of L - 1 .. L + K - 1
    // (the first row is the prefill's last; sequence 1 asks for its last 3 rows only)
    const uint32_t nl[2] = {K + 1, 3};
    for (uint32_t s = 0; s < 2; s++)
        sq[s] = (tm_batch_seq){.tokens = tok[s] + L - 1,
                               .n_tok = K + 1,
                               .pos = L - 1,
                               .block_table = bt[s],
                               .n_block = 4,
                               .want_logits = 1,
                               .n_logits = nl[s]};
    TM_CHECK_OK(tm_engine_forward(eng, &(tm_batch){.seqs = sq, .n_seq = 2}, many, &err), &err);
    for (uint32_t r = 1; r < K + 1; r++) // seq 0: rows 1..K = positions L .. L + K - 1
        TM_CHECK(memcmp(many + (size_t)r * V, one + (size_t)(r - 1) * V, V * sizeof(float)) == 0);
    for (uint32_t r = 0; r < 3; r++) // seq 1: positions L + K - 3 .. L + K - 1
        TM_CHECK(memcmp(many + (size_t)(K + 1 + r) * V, one + ((size_t)K + K - 3 + r) * V,
                        V * sizeof(float)) == 0);
    // n_logits beyond the chunk, or more rows than the engine holds: refused
    sq[1].n_logits = K + 2;
    TM_CHECK(tm_engine_forward(eng, &(tm_batch){.seqs = sq, .n_seq = 2}, many, &err) == TM_E_INVAL);
    eng->opts.max_rows = 0; // 2 rows (max_seqs) now
    sq[1].n_logits = 1;
    TM_CHECK(tm_engine_forward(eng, &(tm_batch){.seqs = sq, .n_seq = 2}, many, &err) == TM_E_INVAL);
    tm_free(one);
    tm_free(many);
    tm_engine_destroy(eng);
}

// ---- engines that pick on the "device": the CPU engine's logits, picked in the wrapper ----

typedef struct wrap {
    tm_engine eng;
    tm_engine *cpu;
    float *logits;
    tm_sample_scratch scr;
    uint32_t n_greedy, n_sample; /* calls */
} wrap;

static tm_rc w_forward(tm_engine *eng, const tm_batch *b, float *logits, tm_err *err) {
    return tm_engine_forward(((wrap *)eng->impl)->cpu, b, logits, err);
}

static uint32_t n_rows(const tm_batch *b) {
    uint32_t n = 0;
    for (uint32_t i = 0; i < b->n_seq; i++)
        n += tm_batch_seq_rows(&b->seqs[i]);
    return n;
}

static tm_rc w_greedy(tm_engine *eng, const tm_batch *b, uint32_t lim, uint32_t *ids, tm_err *err) {
    wrap *w = eng->impl;
    const uint32_t V = eng->model->cfg.n_vocab;
    w->n_greedy++;
    tm_rc rc = tm_engine_forward(w->cpu, b, w->logits, err);
    for (uint32_t r = 0; !rc && r < n_rows(b); r++) {
        const float *row = w->logits + (size_t)r * V;
        uint32_t best = 0;
        for (uint32_t v = 0; v < TM_MIN(lim, V); v++) {
            if (!isfinite(row[v])) {
                best = TM_ENGINE_ID_NONFINITE;
                break;
            }
            best = row[v] > row[best] ? v : best;
        }
        ids[r] = best;
    }
    return rc;
}

static tm_rc w_sample(tm_engine *eng, const tm_batch *b, uint32_t lim,
                      const tm_engine_sample_row *rows, tm_engine_sample_out *out, tm_err *err) {
    wrap *w = eng->impl;
    const uint32_t V = eng->model->cfg.n_vocab;
    w->n_sample++;
    tm_rc rc = tm_engine_forward(w->cpu, b, w->logits, err);
    for (uint32_t r = 0; !rc && r < n_rows(b); r++) {
        const float *row = w->logits + (size_t)r * V;
        tm_err e = {0};
        if (rows[r].score) { // a scoring row (tm_engine_sample_row.score)
            if (tm_sample_logprobs(row, TM_MIN(lim, V), rows[r].score_id, rows[r].n_top, &out[r].lp,
                                   out[r].top_ids, out[r].top_lp, &out[r].id, &e))
                out[r].id = TM_ENGINE_ID_NONFINITE;
            continue;
        }
        if (tm_sample_token(row, TM_MIN(lim, V), &rows[r].p, rows[r].step, &w->scr, &out[r].id, &e))
            out[r].id = TM_ENGINE_ID_NONFINITE;
        if (rows[r].want_lp && out[r].id < V)
            rc = tm_sample_logprobs(row, TM_MIN(lim, V), out[r].id, rows[r].n_top, &out[r].lp,
                                    out[r].top_ids, out[r].top_lp, &(uint32_t){0}, err);
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

static const tm_engine_ops w_ops_greedy = {.name = "wrap-greedy",
                                           .forward = w_forward,
                                           .forward_greedy = w_greedy,
                                           .kv_copy = w_copy,
                                           .destroy = w_destroy};
static const tm_engine_ops w_ops_sample = {.name = "wrap-sample",
                                           .forward = w_forward,
                                           .forward_greedy = w_greedy,
                                           .forward_sample = w_sample,
                                           .kv_copy = w_copy,
                                           .destroy = w_destroy};

// kind 0: the CPU engine; 1: with forward_greedy; 2: with forward_greedy and forward_sample.
static tm_engine *make_engine(int kind, const tm_engine_opts *eo) {
    tm_err err = {0};
    tm_engine *cpu = NULL;
    TM_ASSERT(tm_engine_cpu_create(g_model, eo, &cpu, &err) == TM_OK);
    if (kind == 0)
        return cpu;
    wrap *w = tm_calloc(1, sizeof(*w));
    TM_ASSERT(w);
    w->cpu = cpu;
    w->logits = tm_calloc((size_t)tm_engine_max_rows(eo) * g_model->cfg.n_vocab, sizeof(float));
    TM_ASSERT(w->logits && tm_sample_scratch_init(&w->scr, g_model->cfg.n_vocab, &err) == TM_OK);
    w->eng = (tm_engine){.ops = kind == 1 ? &w_ops_greedy : &w_ops_sample,
                         .model = g_model,
                         .opts = cpu->opts,
                         .impl = w};
    return &w->eng;
}

// ---- lossless: the same records with speculation on and off ----

#define N_REC 12

static const char *const code[] = {
    "def clamp(x, lo, hi):\n    if x < lo:\n        return lo\n    if x > hi:\n        return hi\n"
    "    return x\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n\n"
    "    def __repr__(self):\n        return 'Point(%r, %r)' % (self.x, self.y)\n",
    "import os\n\n\ndef list_files(path):\n    out = []\n    for name in os.listdir(path):\n"
    "        if os.path.isfile(os.path.join(path, name)):\n            out.append(name)\n"
    "    return out\n",
    "def count_words(text):\n    counts = {}\n    for word in text.split():\n"
    "        counts[word] = counts.get(word, 0) + 1\n    return counts\n",
};

// Record i: a code snippet, then "again" and its first line (copy-heavy), or a plain start.
static char *prompt_of(int i) {
    const char *c = code[i % 4];
    char buf[1024];
    if (i % 3 == 2) { // uncopyable-ish: just the start of a function
        snprintf(buf, sizeof(buf), "def helper_%d(value):\n", i);
        return tm_strdup(buf);
    }
    const char *nl = strchr(c, '\n');
    snprintf(buf, sizeof(buf), "%s\n\n# again:\n%.*s", c, (int)(nl - c + 1), c);
    return tm_strdup(buf);
}

typedef struct result {
    char *text[N_REC];
    uint32_t n_gen[N_REC], finish[N_REC];
    float lp_sum[N_REC];
    tm_runner_stats stats;
    uint32_t n_greedy_calls, n_sample_calls;
} result;

typedef struct variant {
    uint32_t max_seqs, max_batched_tokens, n_kv_block;
    int prefix_cache, engine_kind;
    int mode; /* 0 greedy, 1 sampled t0.8 p0.95, 2 penalties + logprobs, 3 stop strings, 4 n = 2,
               * 5 greedy and 6 sampled under a regex constraint (structured output) */
} variant;

static tm_job *new_job(int i, int mode) {
    tm_job *job = tm_calloc(1, sizeof(*job));
    TM_ASSERT(job);
    job->seq_no = (uint64_t)i;
    char id[16];
    snprintf(id, sizeof(id), "%d", i);
    job->id_json = tm_strdup(id);
    job->prompt = prompt_of(i);
    job->sp.set = TM_SP_MAX_TOKENS | TM_SP_SEED;
    job->sp.max_tokens = i % 4 == 3 ? 3 + i : 48 + 8 * (i % 3); // some stop at max_tokens early
    job->sp.seed = 100 + (uint64_t)i;
    if (mode == 2) {
        job->sp.set |= TM_SP_REPETITION_PENALTY | TM_SP_MIN_TOKENS;
        job->sp.repetition_penalty = 1.05f;
        job->sp.min_tokens = 4;
        job->logprobs = 1;
        job->top_logprobs = 2;
    }
    if (mode == 3) {
        job->sp.set |= TM_SP_STOP;
        job->sp.stop = tm_calloc(2, sizeof(char *));
        job->sp.stop[0] = tm_strdup("return");
        job->sp.stop[1] = tm_strdup("\n\n");
        job->sp.n_stop = 2;
    }
    if (mode == 4)
        job->n = 2;
    if (mode >= 5) { // no parentheses: drafts copied from the code are cut where one would come
        job->guided_kind = TM_GUIDED_REGEX;
        job->guided = tm_strdup("[^()]{1,300}");
    }
    return job;
}

static void run(const variant *v, uint32_t spec_k, result *res) {
    tm_err err = {0};
    tm_engine_opts eo = {.n_threads = 2,
                         .block_size = 16,
                         .n_kv_block = v->n_kv_block,
                         .max_seqs = v->max_seqs,
                         .max_batched_tokens = v->max_batched_tokens,
                         .max_rows = v->max_seqs * (spec_k + 1)};
    tm_engine *eng = make_engine(v->engine_kind, &eo);
    tm_queue *in = NULL, *out = NULL;
    TM_CHECK_OK(tm_queue_create(N_REC + 1, &in, &err), &err);
    TM_CHECK_OK(tm_queue_create(N_REC + 1, &out, &err), &err);
    for (int i = 0; i < N_REC; i++)
        TM_CHECK(tm_queue_push(in, new_job(i, v->mode)) == TM_OK);
    tm_queue_close(in);
    tm_runner_cfg cfg = {.max_seqs = v->max_seqs,
                         .max_batched_tokens = v->max_batched_tokens,
                         .block_size = 16,
                         .n_kv_block = v->n_kv_block,
                         .n_ctx = g_model->cfg.n_ctx,
                         .prefix_cache = v->prefix_cache,
                         .policy = TM_SCHED_FCFS,
                         .lookahead = 16,
                         .spec_k = spec_k,
                         .spec_lookup_min = 2,
                         .spec_lookup_max = 4,
                         .spec_no_gate = true}; // every draft a record may make (timing aside)
    cfg.defaults.max_tokens = 16;
    cfg.defaults.temperature = v->mode == 0 || v->mode == 3 || v->mode == 5 ? 0.0f : 0.8f;
    cfg.defaults.top_p = v->mode == 0 || v->mode == 5 ? 1.0f : 0.95f;
    cfg.defaults.top_k = -1;
    memset(res, 0, sizeof(*res));
    TM_CHECK_OK(tm_runner_run(&cfg, eng, g_tok, in, out, &res->stats, &err), &err);
    tm_queue_close(out);
    void *item;
    while (tm_queue_pop(out, &item) == TM_OK) {
        tm_completion *c = item;
        const int i = atoi(c->id_json);
        TM_CHECK_MSG(c->err_code == TM_ERRCODE_NONE, "record %d: %s", i, c->err_msg);
        TM_CHECK(res->text[i] == NULL);
        TM_CHECK(c->spec == (spec_k > 0));
        if (c->n_choices) { // n = 2: both texts, joined
            size_t n0 = strlen(c->choices[0].text), n1 = strlen(c->choices[1].text);
            res->text[i] = tm_malloc(n0 + n1 + 2);
            snprintf(res->text[i], n0 + n1 + 2, "%s|%s", c->choices[0].text, c->choices[1].text);
        } else {
            res->text[i] = c->text, c->text = NULL;
        }
        TM_CHECK(v->mode < 5 || strpbrk(res->text[i], "()") == NULL); // the constraint held
        res->n_gen[i] = c->n_tok_gen;
        res->finish[i] = c->finish;
        for (uint32_t t = 0; c->logprobs && t < c->logprobs->n_tok; t++)
            res->lp_sum[i] += c->logprobs->lp[t] + c->logprobs->top_lp[2 * t + 1];
        tm_completion_destroy(c);
    }
    if (v->engine_kind) {
        res->n_greedy_calls = ((wrap *)eng->impl)->n_greedy;
        res->n_sample_calls = ((wrap *)eng->impl)->n_sample;
    }
    tm_queue_destroy(in);
    tm_queue_destroy(out);
    tm_engine_destroy(eng);
}

static void result_fini(result *r) {
    for (int i = 0; i < N_REC; i++)
        tm_free(r->text[i]);
}

static void check_variant(const variant *v) {
    result off, on;
    run(v, 0, &off);
    run(v, 5, &on);
    int same = 1;
    for (int i = 0; i < N_REC; i++) {
        const int ok = off.text[i] && on.text[i] && strcmp(off.text[i], on.text[i]) == 0 &&
                       off.n_gen[i] == on.n_gen[i] && off.finish[i] == on.finish[i] &&
                       off.lp_sum[i] == on.lp_sum[i];
        TM_CHECK_MSG(ok,
                     "max_seqs %u tokens %u kv %u cache %d engine %d mode %d: record %d differs",
                     v->max_seqs, v->max_batched_tokens, v->n_kv_block, v->prefix_cache,
                     v->engine_kind, v->mode, i);
        same &= ok;
    }
    const tm_runner_stats *s = &on.stats;
    TM_CHECK(off.stats.n_spec_drafts == 0 && s->n_spec_drafts > 0);
    TM_CHECK(s->n_spec_accepted > 0 && s->n_spec_accepted <= s->n_spec_draft_tok);
    uint64_t pos_sum = 0;
    for (int k = 0; k < TM_SPEC_MAX_K; k++) {
        pos_sum += s->spec_accepted_pos[k];
        if (k > 0) // accepting position k needs position k - 1 accepted
            TM_CHECK(s->spec_accepted_pos[k] <= s->spec_accepted_pos[k - 1]);
    }
    TM_CHECK(pos_sum == s->n_spec_accepted);
    // tokens: decode tokens counted as kept positions; fewer steps with drafts accepted
    TM_CHECK(s->n_step < off.stats.n_step);
    if (v->engine_kind == 1 && (v->mode == 0 || v->mode == 3))
        TM_CHECK(on.n_greedy_calls > 0);
    if (v->engine_kind == 2 && v->mode == 1)
        TM_CHECK(on.n_sample_calls > 0);
    if (!same || v->n_kv_block < 40)
        printf("  max_seqs %u tokens %u kv %u cache %d engine %d mode %d: %llu preemptions; "
               "%llu drafts, %llu/%llu accepted, steps %llu vs %llu\n",
               v->max_seqs, v->max_batched_tokens, v->n_kv_block, v->prefix_cache, v->engine_kind,
               v->mode, (unsigned long long)s->n_preempt, (unsigned long long)s->n_spec_drafts,
               (unsigned long long)s->n_spec_accepted, (unsigned long long)s->n_spec_draft_tok,
               (unsigned long long)s->n_step, (unsigned long long)off.stats.n_step);
    if (v->n_kv_block < 40)
        TM_CHECK(s->n_preempt > 0);
    result_fini(&off);
    result_fini(&on);
}

static void test_lossless_batches(void) {
    const uint32_t step = getenv("TM_TEST_SMALL") ? 3 : 1; // sanitized builds: 1, 4, 7
    for (uint32_t b = 1; b <= 8; b += step) // batch sizes 1..8, greedy, no chunking limit
        check_variant(&(variant){.max_seqs = b,
                                 .max_batched_tokens = 512,
                                 .n_kv_block = 256,
                                 .prefix_cache = 1,
                                 .engine_kind = 0,
                                 .mode = 0});
}

static void test_lossless_modes(void) {
    // each mode through the paths that its rows take: logits on the host (kind 0), forward_greedy
    // (kind 1: greedy rows), forward_sample (kind 2: sampled rows, logprobs included)
    static const int kinds[7][2] = {{0, 1}, {0, 2}, {0, 2}, {1, 1}, {2, 2}, {0, 1}, {0, 2}};
    for (int mode = 0; mode <= 6; mode++)
        for (int j = 0; j < 2 && (j == 0 || kinds[mode][1] != kinds[mode][0]); j++)
            check_variant(&(variant){.max_seqs = 3 + (uint32_t)mode % 3,
                                     .max_batched_tokens = 512,
                                     .n_kv_block = 256,
                                     .prefix_cache = j == 0,
                                     .engine_kind = kinds[mode][j],
                                     .mode = mode});
}

static void test_lossless_chunked(void) {
    // prefill in chunks of 16 / 23 tokens (drafts compete for the budget), cache on and off
    check_variant(&(variant){.max_seqs = 4,
                             .max_batched_tokens = 16,
                             .n_kv_block = 256,
                             .prefix_cache = 1,
                             .engine_kind = 0,
                             .mode = 0});
    check_variant(&(variant){.max_seqs = 5,
                             .max_batched_tokens = 23,
                             .n_kv_block = 256,
                             .prefix_cache = 0,
                             .engine_kind = 2,
                             .mode = 1});
}

static void test_lossless_preempt(void) {
    // 12 blocks of 16 tokens for 4 sequences of ~120 tokens: preemptions under speculation, and
    // drafts cut short by the pool (KV of rejected drafts rolled back, blocks released)
    check_variant(&(variant){.max_seqs = 4,
                             .max_batched_tokens = 512,
                             .n_kv_block = 12,
                             .prefix_cache = 1,
                             .engine_kind = 1,
                             .mode = 0});
    check_variant(&(variant){.max_seqs = 6,
                             .max_batched_tokens = 40,
                             .n_kv_block = 13,
                             .prefix_cache = 0,
                             .engine_kind = 2,
                             .mode = 1});
    check_variant(&(variant){.max_seqs = 3,
                             .max_batched_tokens = 512,
                             .n_kv_block = 11,
                             .prefix_cache = 1,
                             .engine_kind = 0,
                             .mode = 2});
}

// ---- the distribution: chi-square over seeded draws ----

#define TOPK 5

// The kept set's probabilities of a row at temperature 1 with top_k TOPK (docs/sampling.md 3):
// ids[TOPK] and p[TOPK].
static void topk_probs(const float *row, uint32_t V, uint32_t *ids, double *p) {
    for (uint32_t k = 0; k < TOPK; k++) {
        uint32_t best = UINT32_MAX;
        for (uint32_t v = 0; v < V; v++) {
            int taken = 0;
            for (uint32_t j = 0; j < k; j++)
                taken |= ids[j] == v;
            if (!taken && (best == UINT32_MAX || row[v] > row[best]))
                best = v;
        }
        ids[k] = best;
    }
    double s = 0;
    for (uint32_t k = 0; k < TOPK; k++)
        s += p[k] = (double)expf(row[ids[k]] - row[ids[0]]);
    for (uint32_t k = 0; k < TOPK; k++)
        p[k] /= s;
}

static void test_distribution(void) {
    tm_err err = {0};
    const uint32_t V = g_model->cfg.n_vocab;
    const int small = getenv("TM_TEST_SMALL") != NULL;
    const int n_draw = small ? 1500 : 3000;
    // A prompt whose tokens repeat, so that 1-gram drafts exist for most first tokens.
    const char *prompt = "def f(a, b):\n    return a + b\n\n\ndef g(a, b):\n    return a - b\n\n\n"
                         "def h(a, b):\n    return";
    tm_ids ids = {0};
    TM_CHECK_OK(tm_ids_push(&ids, (uint32_t)tm_tok_bos_id(g_tok), &err), &err);
    TM_CHECK_OK(tm_tok_encode(g_tok, prompt, strlen(prompt), &ids, &err), &err);
    const uint32_t L = (uint32_t)ids.len;
    // exact joint distribution of (t1, t2): p(t1) p(t2 | t1), from the engine's rows
    tm_engine_opts eo = {.n_threads = 2,
                         .block_size = 16,
                         .n_kv_block = 16,
                         .max_seqs = 1,
                         .max_batched_tokens = 128};
    tm_engine *eng = NULL;
    TM_CHECK_OK(tm_engine_cpu_create(g_model, &eo, &eng, &err), &err);
    float *row = tm_calloc(V, sizeof(float));
    uint32_t bt[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    uint32_t id1[TOPK], id2[TOPK][TOPK];
    double p1[TOPK], p2[TOPK][TOPK];
    tm_batch_seq sq = {
        .tokens = ids.ids, .n_tok = L, .block_table = bt, .n_block = 8, .want_logits = 1};
    TM_CHECK_OK(tm_engine_forward(eng, &(tm_batch){.seqs = &sq, .n_seq = 1}, row, &err), &err);
    topk_probs(row, V, id1, p1);
    for (uint32_t a = 0; a < TOPK; a++) {
        uint32_t t = id1[a];
        sq = (tm_batch_seq){
            .tokens = &t, .n_tok = 1, .pos = L, .block_table = bt, .n_block = 8, .want_logits = 1};
        TM_CHECK_OK(tm_engine_forward(eng, &(tm_batch){.seqs = &sq, .n_seq = 1}, row, &err), &err);
        topk_probs(row, V, id2[a], p2[a]);
    }
    tm_engine_destroy(eng);
    tm_free(row);
    // the runner: n_draw records of 2 tokens, seeds 1.., drafts of 1..2-grams, k 3
    tm_engine_opts ro = {.n_threads = 2,
                         .block_size = 16,
                         .n_kv_block = 256,
                         .max_seqs = 8,
                         .max_batched_tokens = 256,
                         .max_rows = 8 * 4};
    eng = make_engine(0, &ro);
    tm_queue *in = NULL, *out = NULL;
    TM_CHECK_OK(tm_queue_create((size_t)n_draw + 1, &in, &err), &err);
    TM_CHECK_OK(tm_queue_create((size_t)n_draw + 1, &out, &err), &err);
    for (int i = 0; i < n_draw; i++) {
        tm_job *job = tm_calloc(1, sizeof(*job));
        TM_ASSERT(job);
        job->seq_no = (uint64_t)i;
        job->id_json = tm_strdup("0");
        job->prompt = tm_strdup(prompt);
        job->sp.set = TM_SP_SEED;
        job->sp.seed = 1 + (uint64_t)i;
        job->logprobs = 1;
        TM_CHECK(tm_queue_push(in, job) == TM_OK);
    }
    tm_queue_close(in);
    tm_runner_cfg cfg = {.max_seqs = 8,
                         .max_batched_tokens = 256,
                         .block_size = 16,
                         .n_kv_block = 256,
                         .n_ctx = g_model->cfg.n_ctx,
                         .prefix_cache = 1,
                         .policy = TM_SCHED_FCFS,
                         .lookahead = 16,
                         .spec_k = 3,
                         .spec_lookup_min = 1,
                         .spec_lookup_max = 2,
                         .spec_no_gate = true};
    cfg.defaults.max_tokens = 3; // one draft at the second token (k <= max_tokens - n_gen - 1)
    cfg.defaults.temperature = 1.0f;
    cfg.defaults.top_k = TOPK;
    cfg.defaults.ignore_eos = 1;
    tm_runner_stats st = {0};
    TM_CHECK_OK(tm_runner_run(&cfg, eng, g_tok, in, out, &st, &err), &err);
    tm_queue_close(out);
    double cnt[TOPK][TOPK] = {{0}};
    int n = 0, other = 0;
    void *item;
    while (tm_queue_pop(out, &item) == TM_OK) {
        tm_completion *c = item;
        if (c->err_code == TM_ERRCODE_NONE && c->logprobs && c->logprobs->n_tok == 3) {
            int a = -1, b = -1;
            for (int k = 0; k < TOPK; k++)
                if (id1[k] == c->logprobs->ids[0])
                    a = k;
            for (int k = 0; a >= 0 && k < TOPK; k++)
                if (id2[a][k] == c->logprobs->ids[1])
                    b = k;
            if (a >= 0 && b >= 0)
                cnt[a][b]++;
            else
                other++;
            n++;
        }
        tm_completion_destroy(c);
    }
    tm_queue_destroy(in);
    tm_queue_destroy(out);
    tm_engine_destroy(eng);
    tm_ids_fini(&ids);
    TM_CHECK(n == n_draw && other == 0);
    // Drafts were made at the second token and both accepted and rejected.
    TM_CHECK(st.n_spec_drafts > (uint64_t)n_draw / 2);
    TM_CHECK(st.n_spec_accepted > 0 && st.n_spec_accepted < st.n_spec_draft_tok);
    // Chi-square over the cells with expectation >= 5 (the rest pooled into one cell).
    double chi = 0, pool_e = 0, pool_o = 0;
    int df = -1;
    for (int a = 0; a < TOPK; a++)
        for (int b = 0; b < TOPK; b++) {
            const double e = n * p1[a] * p2[a][b];
            if (e >= 5) {
                chi += (cnt[a][b] - e) * (cnt[a][b] - e) / e;
                df++;
            } else {
                pool_e += e, pool_o += cnt[a][b];
            }
        }
    if (pool_e > 0) {
        chi += (pool_o - pool_e) * (pool_o - pool_e) / pool_e;
        df++;
    }
    // 99.9th percentile of chi-square with df degrees (Wilson-Hilferty approximation)
    const double z = 3.09, h = 2.0 / (9.0 * df);
    const double crit = df * pow(1 - h + z * sqrt(h), 3);
    printf("  distribution: %d draws, %llu drafts (%llu of %llu draft tokens accepted), chi2 %.2f "
           "with %d df (99.9%% critical %.2f)\n",
           n, (unsigned long long)st.n_spec_drafts, (unsigned long long)st.n_spec_accepted,
           (unsigned long long)st.n_spec_draft_tok, chi, df, crit);
    TM_CHECK(df >= 4);
    TM_CHECK(chi < crit);
}

int main(void) {
    tm_err err = {0};
    if (tm_model_load(DEMO, &g_model, &err) || tm_tok_load(DEMO, &g_tok, &err)) {
        fprintf(stderr, "test_spec: %s: %s\n", DEMO, err.msg);
        return 1;
    }
    TM_RUN(test_propose_cases);
    TM_RUN(test_propose_random);
    TM_RUN(test_adaptive);
    TM_RUN(test_job_spec);
    TM_RUN(test_engine_rows);
    TM_RUN(test_lossless_batches);
    TM_RUN(test_lossless_modes);
    TM_RUN(test_lossless_chunked);
    TM_RUN(test_lossless_preempt);
    TM_RUN(test_distribution);
    tm_tok_destroy(g_tok);
    tm_model_destroy(g_model);
    return tm_test_report();
}
