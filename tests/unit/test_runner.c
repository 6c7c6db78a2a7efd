/* tests/unit/test_runner.c - the runner end to end on a tiny model with the DeepSeek V3 tokenizer:
 * prefix cache on and off give byte-identical greedy (and seeded) outputs under both schedules;
 * a KV pool too small for the batch forces preemptions without changing any output; shared
 * prefixes are computed about once (prefill tokens close to the unique prompt tokens). Greedy
 * steps through an engine's forward_greedy (a wrapper around the CPU engine that picks the ids
 * itself, as the CUDA engine does on the device) give byte-identical records to steps through
 * forward, for greedy, sampled, stop-string, n > 1, logprobs and scoring records, with logits
 * full of ties, with padding ids above the tokenizer's vocabulary that would win, and with
 * non-finite logits.
 *
 * With TM_TEST_SMALL set (CMake sets it for the sanitized build, where this test took 406 s)
 * every check runs on fewer records: 5 questions per system prompt instead of 12 and 10 records of
 * the forward_greedy tests instead of 30 (each record kind still once); the full sizes run in the
 * normal build. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/queue.h"
#include "runner/engine/engine.h"
#include "runner/model/model.h"
#include "runner/runner.h"
#include "runner/sched/sample.h"
#include "runner/text/tokenizer.h"
#include "tm_test.h"
#include "tm_unit_model.h"

#define N_SYS 4
#define N_Q 12              /* questions per system prompt; N_Q_SMALL with TM_TEST_SMALL */
#define N_Q_SMALL 5         /* 20 records: 17 is coprime with 20 too (the shuffle in run) */
#define N_REC (N_SYS * N_Q) /* the most records; g_n_rec are used */

static tm_model *g_model;
static tm_tokenizer *g_tok;
static int g_n_rec = N_REC; /* records of the prefix-cache tests (N_SYS * N_Q_SMALL when small) */

typedef struct result {
    char *text[N_REC];
    uint32_t n_gen[N_REC];
    uint32_t cached[N_REC];
    tm_runner_stats stats;
} result;

static char *prompt_of(int i) {
    static const char *sys[N_SYS] = {
        "You are a careful assistant for a shipping company. Answer in one short sentence, "
        "cite the policy number when you can, and never invent tracking numbers. ",
        "System: translate the user's text into French, keep names unchanged, and keep the "
        "punctuation of the original. Text follows. ",
        "def helper(x):\n    # a long code prefix shared by several prompts\n    return x * 2 + 1\n",
        "以下是一段很长的系统提示，用来测试共享前缀的缓存是否有效。请简短回答。",
    };
    char buf[512];
    snprintf(buf, sizeof(buf), "%sQuestion %d: what about item %d?", sys[i % N_SYS], i, i * 7);
    return tm_strdup(buf);
}

/* Record i of a test input: id "i", prompt_of(i), max_tokens and seed i set. */
static tm_job *new_job(int i, uint32_t max_tokens) {
    tm_job *job = tm_calloc(1, sizeof(*job));
    TM_ASSERT(job);
    job->seq_no = (uint64_t)i;
    char id[16];
    snprintf(id, sizeof(id), "%d", i);
    job->id_json = tm_strdup(id);
    job->prompt = prompt_of(i);
    job->sp.set = TM_SP_MAX_TOKENS | TM_SP_SEED;
    job->sp.max_tokens = max_tokens;
    job->sp.seed = (uint64_t)i;
    return job;
}

// A slowed source (issue 35): feed's thread pushes the records one at a time, each only once the
// runner has taken the one before and 2 ms more have passed, as a source on a machine busy with
// other work (CPU hogs, a build) would; g_slow_feed selects it in run().
static int g_slow_feed;

typedef struct feed {
    tm_queue *in;
    tm_job *jobs[N_REC];
    int n;
} feed;

static void *feed_main(void *arg) {
    feed *f = arg;
    for (int k = 0; k < f->n; k++) {
        while (tm_queue_len(f->in) > 0)
            usleep(200);
        usleep(2000);
        TM_ASSERT(tm_queue_push(f->in, f->jobs[k]) == TM_OK);
    }
    tm_queue_close(f->in);
    return NULL;
}

// The CPU engine over g_model (2 threads, 16-token blocks, 96 tokens a step) and the runner's
// two queues of cap slots each; the caller destroys the three.
static tm_engine *cpu_engine(uint32_t max_seqs, uint32_t n_kv_block, size_t cap, tm_queue **in,
                             tm_queue **out) {
    tm_err err = {0};
    tm_engine *eng = NULL;
    tm_engine_opts eo = {.n_threads = 2,
                         .block_size = 16,
                         .n_kv_block = n_kv_block,
                         .max_seqs = max_seqs,
                         .max_batched_tokens = 96,
                         .tp_size = 1};
    TM_CHECK_OK(tm_engine_cpu_create(g_model, &eo, &eng, &err), &err);
    TM_CHECK_OK(tm_queue_create(cap, in, &err), &err);
    TM_CHECK_OK(tm_queue_create(cap, out, &err), &err);
    return eng;
}

// Run every record through the runner with the given switches; records are pushed in a
// shuffled order so the PREFIX schedule has something to reorder.
static void run(int prefix_cache, tm_sched_policy policy, uint32_t n_kv_block, float temp,
                result *res) {
    tm_err err = {0};
    tm_queue *in = NULL, *out = NULL;
    tm_engine *eng = cpu_engine(4, n_kv_block, N_REC + 1, &in, &out);
    feed fd = {.in = in, .n = g_n_rec};
    for (int k = 0; k < g_n_rec; k++) {
        int i = (k * 17) % g_n_rec; // a fixed shuffle (17 is coprime with 48 and 20)
        tm_job *job = new_job(i, 6 + i % 5);
        job->seq_no = (uint64_t)k;
        fd.jobs[k] = job;
        if (!g_slow_feed)
            TM_CHECK(tm_queue_push(in, job) == TM_OK);
    }
    pthread_t feeder;
    if (g_slow_feed)
        TM_ASSERT(pthread_create(&feeder, NULL, feed_main, &fd) == 0);
    else
        tm_queue_close(in);
    tm_runner_cfg cfg = {.max_seqs = 4,
                         .max_batched_tokens = 96,
                         .block_size = 16,
                         .n_kv_block = n_kv_block,
                         .n_ctx = 4096,
                         .prefix_cache = prefix_cache,
                         .policy = policy,
                         .lookahead = 64};
    cfg.defaults.max_tokens = 8;
    cfg.defaults.temperature = temp;
    cfg.defaults.top_p = 1.0f;
    cfg.defaults.top_k = -1;
    memset(res, 0, sizeof(*res));
    TM_CHECK_OK(tm_runner_run(&cfg, eng, g_tok, in, out, &res->stats, &err), &err);
    if (g_slow_feed)
        pthread_join(feeder, NULL);
    tm_queue_close(out);
    void *item;
    int n = 0;
    while (tm_queue_pop(out, &item) == TM_OK) {
        tm_completion *c = item;
        int i = atoi(c->id_json);
        TM_CHECK(c->err_code == TM_ERRCODE_NONE);
        TM_CHECK(res->text[i] == NULL); // exactly once
        res->text[i] = c->text, c->text = NULL;
        res->n_gen[i] = c->n_tok_gen;
        res->cached[i] = c->n_tok_cached;
        tm_completion_destroy(c);
        n++;
    }
    TM_CHECK(n == g_n_rec);
    tm_queue_destroy(in);
    tm_queue_destroy(out);
    tm_engine_destroy(eng);
}

static void result_fini(result *r) {
    for (int i = 0; i < g_n_rec; i++)
        tm_free(r->text[i]);
}

static int same_outputs(const result *a, const result *b) {
    for (int i = 0; i < g_n_rec; i++)
        if (!a->text[i] || !b->text[i] || strcmp(a->text[i], b->text[i]) != 0 ||
            a->n_gen[i] != b->n_gen[i]) {
            fprintf(stderr, "record %d differs: \"%s\" vs \"%s\"\n", i,
                    a->text[i] ? a->text[i] : "(none)", b->text[i] ? b->text[i] : "(none)");
            return 0;
        }
    return 1;
}

// Tokens of the token trie of all prompts = prompt tokens a perfect cache computes.
static uint64_t unique_prompt_tokens(void) {
    tm_ids ids[N_REC];
    tm_err err = {0};
    uint64_t total = 0;
    for (int i = 0; i < g_n_rec; i++) {
        ids[i] = (tm_ids){0};
        char *p = prompt_of(i);
        tm_ids_push(&ids[i], (uint32_t)tm_tok_bos_id(g_tok), &err);
        tm_tok_encode(g_tok, p, strlen(p), &ids[i], &err);
        tm_free(p);
    }
    for (int i = 0; i < g_n_rec; i++) {
        size_t best = 0; // longest common prefix with an earlier prompt: those tokens are shared
        for (int k = 0; k < i; k++) {
            size_t n = 0;
            while (n < ids[i].len && n < ids[k].len && ids[i].ids[n] == ids[k].ids[n])
                n++;
            best = n > best ? n : best;
        }
        total += ids[i].len - best;
    }
    for (int i = 0; i < g_n_rec; i++)
        tm_ids_fini(&ids[i]);
    return total;
}

static void test_cache_on_off_identical(void) {
    for (int t = 0; t < 2; t++) {
        float temp = t ? 0.9f : 0.0f; // greedy, then seeded sampling
        result off, on, on_fcfs;
        run(0, TM_SCHED_FCFS, 256, temp, &off);
        run(1, TM_SCHED_PREFIX, 256, temp, &on);
        run(1, TM_SCHED_FCFS, 256, temp, &on_fcfs);
        TM_CHECK(same_outputs(&off, &on));
        TM_CHECK(same_outputs(&off, &on_fcfs));
        TM_CHECK(off.stats.n_tok_cached == 0);
        TM_CHECK(on.stats.n_tok_cached > 0);
        TM_CHECK(on.stats.n_tok_prefill < off.stats.n_tok_prefill);
        uint64_t cached = 0;
        for (int i = 0; i < g_n_rec; i++)
            cached += on.cached[i];
        TM_CHECK(cached == on.stats.n_tok_cached);
        // Every prompt token is either computed or served from the cache.
        TM_CHECK(on.stats.n_tok_prefill + on.stats.n_tok_cached >= on.stats.n_tok_prompt);
        if (t == 0) {
            uint64_t uniq = unique_prompt_tokens();
            fprintf(stderr,
                    "  prompt tokens %llu, unique %llu; prefill computed: off %llu, prefix "
                    "%llu (copied %llu), fcfs+cache %llu\n",
                    (unsigned long long)off.stats.n_tok_prompt, (unsigned long long)uniq,
                    (unsigned long long)off.stats.n_tok_prefill,
                    (unsigned long long)on.stats.n_tok_prefill,
                    (unsigned long long)on.stats.n_tok_copied,
                    (unsigned long long)on_fcfs.stats.n_tok_prefill);
            // The prefix schedule computes shared prefixes once: within 5% of the unique tokens.
            TM_CHECK_MSG(on.stats.n_tok_prefill <= uniq * 105 / 100, "prefill %llu, unique %llu",
                         (unsigned long long)on.stats.n_tok_prefill, (unsigned long long)uniq);
        }
        result_fini(&off);
        result_fini(&on);
        result_fini(&on_fcfs);
    }
}

static void test_preemption_keeps_outputs(void) {
    result big, small, small_cache;
    run(0, TM_SCHED_FCFS, 256, 0.0f, &big);
    // 4 sequences of up to ~60 tokens need ~16 blocks of 16; 9 blocks force preemptions.
    run(0, TM_SCHED_FCFS, 9, 0.0f, &small);
    run(1, TM_SCHED_PREFIX, 6, 0.0f, &small_cache);
    TM_CHECK(small.stats.n_preempt > 0);
    TM_CHECK(small_cache.stats.n_preempt > 0);
    fprintf(stderr, "  preemptions: %llu (cache off), %llu (cache on)\n",
            (unsigned long long)small.stats.n_preempt,
            (unsigned long long)small_cache.stats.n_preempt);
    TM_CHECK(same_outputs(&big, &small));
    TM_CHECK(same_outputs(&big, &small_cache));
    result_fini(&big);
    result_fini(&small);
    result_fini(&small_cache);
}

// Records with different cache_salt never share blocks; with the same salt they do.
static void test_cache_salt(void) {
    tm_err err = {0};
    tm_queue *in = NULL, *out = NULL;
    tm_engine *eng = cpu_engine(1, 64, 8, &in, &out);
    const uint64_t salts[4] = {0, 7, 7, 0}; // records run one at a time, in this order
    for (int i = 0; i < 4; i++) {
        tm_job *job = tm_calloc(1, sizeof(*job));
        job->seq_no = (uint64_t)i;
        char id[16]; // room for any int: gcc -O1 -fsanitize=address loses the range of i
        snprintf(id, sizeof(id), "%d", i);
        job->id_json = tm_strdup(id);
        job->prompt = prompt_of(0); // the same prompt every time
        job->cache_salt = salts[i];
        TM_CHECK(tm_queue_push(in, job) == TM_OK);
    }
    tm_queue_close(in);
    tm_runner_cfg cfg = {.max_seqs = 1,
                         .max_batched_tokens = 96,
                         .block_size = 16,
                         .n_kv_block = 64,
                         .n_ctx = 4096,
                         .prefix_cache = 1,
                         .policy = TM_SCHED_FCFS,
                         .lookahead = 1};
    cfg.defaults.max_tokens = 2;
    tm_runner_stats st = {0};
    TM_CHECK_OK(tm_runner_run(&cfg, eng, g_tok, in, out, &st, &err), &err);
    tm_queue_close(out);
    uint32_t cached[4] = {0};
    void *item;
    while (tm_queue_pop(out, &item) == TM_OK) {
        tm_completion *c = item;
        cached[atoi(c->id_json)] = c->n_tok_cached;
        tm_completion_destroy(c);
    }
    TM_CHECK(cached[0] == 0); // first of salt 0
    TM_CHECK(cached[1] == 0); // salt 7 does not see salt 0's blocks
    TM_CHECK(cached[2] > 0);  // the second salt-7 record does
    TM_CHECK(cached[3] > 0);  // and the second unsalted one sees the first's
    tm_queue_destroy(in);
    tm_queue_destroy(out);
    tm_engine_destroy(eng);
}

// Records that cannot be served (TM_E_RECORD inside the runner: a prompt too long or empty, an
// empty or too long continuation, a chat template that fails) become error completions with
// their codes and messages, and the job goes on: the good records around them are answered.
static void test_record_failures(void) {
    tm_err err = {0};
    tm_queue *in = NULL, *out = NULL;
    tm_engine *eng = cpu_engine(2, 64, 16, &in, &out);
    enum { N = 7 };
    for (int i = 0; i < N; i++) {
        tm_job *job = new_job(i, 2);
        if (i == 1) { // about 20 tokens per "item 7 " ...: far over the 64-token context
            tm_free(job->prompt);
            char buf[2048] = "";
            for (int k = 0; k < 100; k++)
                strcat(buf, "item 7 ");
            job->prompt = tm_strdup(buf);
        }
        if (i == 2) // no tokens at all (text always gets the BOS): prompt ids, none of them
            job->prompt_ids = tm_calloc(1, sizeof(uint32_t));
        if (i == 3 || i == 4) { // scoring records: an empty and a too long continuation
            job->continuations = tm_calloc(1, sizeof(char *));
            job->n_continuations = 1;
            char buf[1024] = "";
            for (int k = 0; i == 4 && k < 60; k++)
                strcat(buf, " yes");
            job->continuations[0] = tm_strdup(buf);
        }
        if (i == 5) { // a chat record: the template below fails on it
            tm_free(job->prompt);
            job->prompt = NULL;
            job->messages = tm_calloc(1, sizeof(*job->messages));
            job->messages[0].role = tm_strdup("user");
            job->messages[0].content = tm_strdup("hello");
            job->n_messages = 1;
        }
        TM_CHECK(tm_queue_push(in, job) == TM_OK);
    }
    tm_queue_close(in);
    tm_runner_cfg cfg = {.max_seqs = 2,
                         .max_batched_tokens = 96,
                         .block_size = 16,
                         .n_kv_block = 64,
                         .n_ctx = 64,
                         .policy = TM_SCHED_FCFS,
                         .lookahead = 1,
                         .chat_template = "{{ messages[0].content | no_such_filter }}"};
    cfg.defaults.max_tokens = 2;
    tm_runner_stats st = {0};
    TM_CHECK_OK(tm_runner_run(&cfg, eng, g_tok, in, out, &st, &err), &err);
    tm_queue_close(out);
    static const tm_errcode want[N] = {
        TM_ERRCODE_NONE,          TM_ERRCODE_CONTEXT_LENGTH_EXCEEDED, TM_ERRCODE_INVALID_VALUE,
        TM_ERRCODE_INVALID_VALUE, TM_ERRCODE_CONTEXT_LENGTH_EXCEEDED, TM_ERRCODE_TEMPLATE_ERROR,
        TM_ERRCODE_NONE};
    static const char *const want_msg[N] = {NULL,
                                            "prompt is ",
                                            "prompt is empty",
                                            "continuation 0 is empty",
                                            "prompt + continuation 0 is ",
                                            "template: ",
                                            NULL};
    int seen[N] = {0};
    void *item;
    while (tm_queue_pop(out, &item) == TM_OK) {
        tm_completion *c = item;
        int i = atoi(c->id_json);
        TM_CHECK(i >= 0 && i < N && !seen[i]);
        if (i >= 0 && i < N) {
            seen[i] = 1;
            TM_CHECK_MSG(c->err_code == want[i], "record %d: code %d (%s)", i, (int)c->err_code,
                         c->err_msg ? c->err_msg : "");
            const char *m = want_msg[i];
            if (m)
                TM_CHECK_MSG(c->err_msg && strncmp(c->err_msg, m, strlen(m)) == 0,
                             "record %d: \"%s\"", i, c->err_msg ? c->err_msg : "(none)");
        }
        tm_completion_destroy(c);
    }
    for (int i = 0; i < N; i++)
        TM_CHECK_MSG(seen[i], "record %d not answered", i);
    tm_queue_destroy(in);
    tm_queue_destroy(out);
    tm_engine_destroy(eng);
}

// A source that released records (tm_runner_cfg.start says false: a Kafka partition revoked
// while they were queued): the runner answers none of them, pushes a released completion (seq_no
// only) for each, and asks once per record; the others are answered as ever. Records released:
// an ingest error record (1), an n = 2 record (2, a group) and a plain one (4).
typedef struct starts {
    int asked[8];
} starts;

static bool start_unless_released(void *ctx, uint64_t seq_no) {
    starts *st = ctx;
    st->asked[seq_no]++;
    return seq_no != 1 && seq_no != 2 && seq_no != 4;
}

static void test_released(void) {
    tm_err err = {0};
    tm_queue *in = NULL, *out = NULL;
    tm_engine *eng = cpu_engine(2, 64, 16, &in, &out);
    enum { N = 6 };
    for (int i = 0; i < N; i++) {
        tm_job *job = new_job(i, 2);
        if (i == 1 || i == 3) { // ingest error records
            job->err_code = TM_ERRCODE_INVALID_JSON;
            job->err_msg = tm_strdup("not JSON");
        }
        if (i == 2 || i == 5)
            job->n = 2;
        TM_CHECK(tm_queue_push(in, job) == TM_OK);
    }
    tm_queue_close(in);
    starts st = {{0}};
    tm_runner_cfg cfg = {.max_seqs = 2,
                         .max_batched_tokens = 96,
                         .block_size = 16,
                         .n_kv_block = 64,
                         .n_ctx = 256,
                         .policy = TM_SCHED_PREFIX,
                         .lookahead = 8,
                         .start = start_unless_released,
                         .start_ctx = &st};
    cfg.defaults.max_tokens = 2;
    tm_runner_stats rs = {0};
    TM_CHECK_OK(tm_runner_run(&cfg, eng, g_tok, in, out, &rs, &err), &err);
    tm_queue_close(out);
    int seen[N] = {0};
    void *item;
    while (tm_queue_pop(out, &item) == TM_OK) {
        tm_completion *c = item;
        TM_CHECK(c->seq_no < N);
        int i = (int)c->seq_no;
        if (i >= 0 && i < N) {
            seen[i]++;
            bool rel = i == 1 || i == 2 || i == 4;
            TM_CHECK_MSG(c->released == rel, "record %d: released %d", i, c->released);
            if (rel)
                TM_CHECK(!c->text && !c->id_json && !c->choices && c->err_code == 0);
            else if (i == 3)
                TM_CHECK(c->err_code == TM_ERRCODE_INVALID_JSON);
            else if (i == 5)
                TM_CHECK(c->n_choices == 2 && c->err_code == 0);
            else
                TM_CHECK(c->text && c->err_code == 0);
        }
        tm_completion_destroy(c);
    }
    for (int i = 0; i < N; i++) {
        TM_CHECK_MSG(seen[i] == 1, "record %d: %d completions", i, seen[i]);
        TM_CHECK_MSG(st.asked[i] == 1, "record %d: asked %d times", i, st.asked[i]);
    }
    tm_queue_destroy(in);
    tm_queue_destroy(out);
    tm_engine_destroy(eng);
}

/* ---- forward_greedy: a wrapper engine that hides or offers the op ---- */

enum { WRAP_PLAIN = 0, WRAP_TIES, WRAP_PAD_WINS, WRAP_NAN };

typedef struct wrap {
    tm_engine eng;     /* eng.impl points back here */
    tm_engine *inner;  /* owned: the CPU engine */
    int mode;          /* WRAP_*: how the inner logits are changed (the same in both paths) */
    float *logits;     /* [max_seqs][n_vocab] forward_greedy's rows */
    uint64_t n_call;   /* forward + forward_greedy calls */
    uint64_t n_greedy; /* forward_greedy calls */
    uint64_t n_greedy_rows;
    uint32_t limit_seen; /* the n_vocab_limit of the last forward_greedy call */
} wrap;

static void wrap_edit(wrap *w, float *logits, uint32_t n_want) {
    const uint32_t V = w->eng.model->cfg.n_vocab;
    w->n_call++;
    for (uint32_t r = 0; r < n_want; r++) {
        float *row = logits + (size_t)r * V;
        if (w->mode == WRAP_TIES) // a handful of levels: every row has many equal maxima
            for (uint32_t i = 0; i < V; i++)
                row[i] = floorf(row[i] * 2.0f);
        if (w->mode == WRAP_PAD_WINS) // ids the tokenizer cannot decode would win without the limit
            row[V - 1] = row[V - 2] = 1e30f;
        if (w->mode == WRAP_NAN && w->n_call % 5 == 3 && r == 0)
            row[r + 100] = NAN;
    }
}

static tm_rc wrap_forward(tm_engine *eng, const tm_batch *b, float *logits, tm_err *err) {
    wrap *w = eng->impl;
    tm_rc rc = tm_engine_forward(w->inner, b, logits, err);
    uint32_t n_want = 0;
    for (uint32_t i = 0; i < b->n_seq; i++)
        n_want += b->seqs[i].want_logits != 0;
    if (!rc)
        wrap_edit(w, logits, n_want);
    return rc;
}

// The contract of forward_greedy over the (edited) logits: the first maximum below the limit,
// TM_ENGINE_ID_NONFINITE for a row with a NaN or infinite logit there.
static tm_rc wrap_forward_greedy(tm_engine *eng, const tm_batch *b, uint32_t n_vocab_limit,
                                 uint32_t *ids, tm_err *err) {
    wrap *w = eng->impl;
    const uint32_t V = eng->model->cfg.n_vocab, lim = n_vocab_limit < V ? n_vocab_limit : V;
    tm_rc rc = wrap_forward(eng, b, w->logits, err);
    if (rc)
        return rc;
    w->n_greedy++;
    w->limit_seen = n_vocab_limit;
    uint32_t n_want = 0;
    for (uint32_t i = 0; i < b->n_seq; i++)
        n_want += b->seqs[i].want_logits != 0;
    for (uint32_t r = 0; r < n_want; r++) {
        const float *row = w->logits + (size_t)r * V;
        uint32_t best = 0;
        for (uint32_t i = 0; i < lim && best != TM_ENGINE_ID_NONFINITE; i++)
            if (!isfinite(row[i]))
                best = TM_ENGINE_ID_NONFINITE;
            else if (row[i] > row[best])
                best = i;
        ids[r] = best;
    }
    w->n_greedy_rows += n_want;
    return TM_OK;
}

static tm_rc wrap_kv_copy(tm_engine *eng, uint32_t src, uint32_t dst, uint32_t n_tok, tm_err *err) {
    wrap *w = eng->impl;
    return w->inner->ops->kv_copy(w->inner, src, dst, n_tok, err);
}

static void wrap_destroy(tm_engine *eng) {
    wrap *w = eng->impl;
    tm_engine_destroy(w->inner);
    tm_free(w->logits);
    tm_free(w);
}

static const tm_engine_ops wrap_ops_greedy = {.name = "wrap",
                                              .forward = wrap_forward,
                                              .forward_greedy = wrap_forward_greedy,
                                              .kv_copy = wrap_kv_copy,
                                              .destroy = wrap_destroy};
static const tm_engine_ops wrap_ops_plain = {
    .name = "wrap", .forward = wrap_forward, .kv_copy = wrap_kv_copy, .destroy = wrap_destroy};

static wrap *wrap_create(const tm_engine_opts *eo, int with_op, int mode) {
    tm_err err = {0};
    wrap *w = tm_calloc(1, sizeof(*w));
    TM_ASSERT(w);
    TM_ASSERT(tm_engine_cpu_create(g_model, eo, &w->inner, &err) == TM_OK);
    TM_ASSERT(w->inner->ops->kv_copy);
    w->eng = (tm_engine){.ops = with_op ? &wrap_ops_greedy : &wrap_ops_plain,
                         .model = g_model,
                         .opts = *eo,
                         .impl = w};
    w->mode = mode;
    w->logits = tm_calloc((size_t)eo->max_seqs * g_model->cfg.n_vocab, sizeof(float));
    TM_ASSERT(w->logits);
    return w;
}

#define N_G 30       /* the most records of the forward_greedy tests; g_n_g are used */
#define N_G_SMALL 10 /* each of the 10 kinds of greedy_job once */
static int g_n_g = N_G;

// Record kinds: all (kinds 1: by i % 10), or only those sampled greedily (kinds 0).
static tm_job *greedy_job(int i, int kinds) {
    tm_job *job = new_job(i, 5 + i % 7);
    static const int greedy_kinds[4] = {0, 3, 4, 6};
    const int k = kinds ? i % 10 : greedy_kinds[i % 4];
    if (k == 1 || k == 2) { // sampled
        job->sp.set |= TM_SP_TEMPERATURE;
        job->sp.temperature = 0.9f;
    }
    if (k == 3) { // temperature > 0 but top_k 1: greedy by sample.c's rule
        job->sp.set |= TM_SP_TEMPERATURE | TM_SP_TOP_K;
        job->sp.temperature = 0.7f;
        job->sp.top_k = 1;
    }
    if (k == 4) { // stop strings cut the text
        job->sp.set |= TM_SP_STOP;
        job->sp.stop = tm_calloc(2, sizeof(char *));
        job->sp.stop[0] = tm_strdup("e");
        job->sp.stop[1] = tm_strdup("a");
        job->sp.n_stop = 2;
    }
    if (k == 5) { // logprobs on a greedy record: its rows need the logits
        job->logprobs = 1;
        job->top_logprobs = 2;
    }
    if (k == 6) // n > 1 greedy samples
        job->n = 3;
    if (k == 7) { // a scoring record
        job->continuations = tm_calloc(2, sizeof(char *));
        job->continuations[0] = tm_strdup(" yes");
        job->continuations[1] = tm_strdup(" it ships tomorrow");
        job->n_continuations = 2;
    }
    if (k == 8) { // prompt logprobs and a greedy generation
        job->prompt_logprobs = 1;
        job->prompt_top_logprobs = 1;
    }
    return job;
}

static void put_lp(char *buf, size_t cap, size_t *o, const tm_logprobs *l) {
    if (!l)
        return;
    for (uint32_t t = 0; t < l->n_tok && *o < cap; t++) {
        *o += (size_t)snprintf(buf + *o, cap - *o, " %u:%a", l->ids[t], (double)l->lp[t]);
        for (uint32_t j = 0; j < l->n_top && *o < cap; j++)
            *o += (size_t)snprintf(buf + *o, cap - *o, "/%u:%a", l->top_ids[t * l->n_top + j],
                                   (double)l->top_lp[t * l->n_top + j]);
    }
}

// Everything a record's answer says, except timings, as one string.
static char *digest(const tm_completion *c) {
    size_t cap = 1 << 16, o = 0;
    char *buf = tm_calloc(cap, 1);
    TM_ASSERT(buf);
    o += (size_t)snprintf(buf + o, cap - o, "err %d %s | %s | fin %d gen %u |", (int)c->err_code,
                          c->err_msg ? c->err_msg : "", c->text ? c->text : "", (int)c->finish,
                          c->n_tok_gen);
    put_lp(buf, cap, &o, c->logprobs);
    put_lp(buf, cap, &o, c->prompt_logprobs);
    for (uint32_t i = 0; i < c->n_choices && o < cap; i++) {
        o += (size_t)snprintf(buf + o, cap - o, " [%s %d %u]", c->choices[i].text,
                              (int)c->choices[i].finish, c->choices[i].n_tok_gen);
        put_lp(buf, cap, &o, c->choices[i].logprobs);
    }
    for (uint32_t i = 0; i < c->n_scores && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, " {%a %u %d}", c->scores[i].logprob,
                              c->scores[i].n_tok, c->scores[i].is_greedy);
    TM_ASSERT(o < cap);
    return buf;
}

typedef struct gresult {
    char *d[N_G];
    uint64_t n_step, n_step_greedy, n_greedy_rows, n_forward_rows_call;
    uint32_t limit_seen;
    int n_err;
} gresult;

static void run_greedy(int with_op, int mode, int kinds, int prefix_cache, uint32_t n_kv_block,
                       gresult *res) {
    tm_err err = {0};
    tm_engine_opts eo = {.n_threads = 2,
                         .block_size = 16,
                         .n_kv_block = n_kv_block,
                         .max_seqs = 4,
                         .max_batched_tokens = 64,
                         .tp_size = 1};
    wrap *w = wrap_create(&eo, with_op, mode);
    tm_queue *in = NULL, *out = NULL;
    TM_CHECK_OK(tm_queue_create(N_G + 1, &in, &err), &err);
    TM_CHECK_OK(tm_queue_create(N_G + 1, &out, &err), &err);
    for (int i = 0; i < g_n_g; i++)
        TM_CHECK(tm_queue_push(in, greedy_job(i, kinds)) == TM_OK);
    tm_queue_close(in);
    tm_runner_cfg cfg = {.max_seqs = 4,
                         .max_batched_tokens = 64,
                         .block_size = 16,
                         .n_kv_block = n_kv_block,
                         .n_ctx = 4096,
                         .prefix_cache = prefix_cache,
                         .policy = TM_SCHED_FCFS,
                         .lookahead = 8};
    cfg.defaults.max_tokens = 8;
    cfg.defaults.temperature = 0.0f;
    cfg.defaults.top_p = 1.0f;
    cfg.defaults.top_k = -1;
    memset(res, 0, sizeof(*res));
    tm_runner_stats st = {0};
    TM_CHECK_OK(tm_runner_run(&cfg, &w->eng, g_tok, in, out, &st, &err), &err);
    tm_queue_close(out);
    void *item;
    while (tm_queue_pop(out, &item) == TM_OK) {
        tm_completion *c = item;
        int i = atoi(c->id_json);
        TM_CHECK(i >= 0 && i < g_n_g && res->d[i] == NULL);
        if (i >= 0 && i < g_n_g && !res->d[i])
            res->d[i] = digest(c);
        res->n_err += c->err_code != TM_ERRCODE_NONE;
        tm_completion_destroy(c);
    }
    res->n_step = st.n_step;
    res->n_step_greedy = st.n_step_greedy;
    res->n_greedy_rows = w->n_greedy_rows;
    res->limit_seen = w->limit_seen;
    TM_CHECK(st.n_step_greedy == w->n_greedy);
    tm_queue_destroy(in);
    tm_queue_destroy(out);
    tm_engine_destroy(&w->eng);
}

static void gresult_fini(gresult *r) {
    for (int i = 0; i < g_n_g; i++)
        tm_free(r->d[i]);
}

static int same_digests(const gresult *a, const gresult *b) {
    for (int i = 0; i < g_n_g; i++)
        if (!a->d[i] || !b->d[i] || strcmp(a->d[i], b->d[i]) != 0) {
            fprintf(stderr, "record %d differs:\n  %.400s\n  %.400s\n", i,
                    a->d[i] ? a->d[i] : "(none)", b->d[i] ? b->d[i] : "(none)");
            return 0;
        }
    return 1;
}

// The records of both paths agree. With NaN logits the error text differs (the host sampler
// names the logit); the records that fail and every other answer do not.
static void check_same(const gresult *off, const gresult *on, int mode) {
    if (mode != WRAP_NAN) {
        TM_CHECK_MSG(same_digests(off, on), "mode %d", mode);
        TM_CHECK(off->n_err == 0);
        return;
    }
    TM_CHECK(off->n_err > 0 && off->n_err == on->n_err);
    for (int i = 0; i < g_n_g; i++) {
        int e_off = off->d[i] && strncmp(off->d[i], "err 0 ", 6) != 0;
        int e_on = on->d[i] && strncmp(on->d[i], "err 0 ", 6) != 0;
        TM_CHECK_MSG(e_off == e_on, "record %d fails in one path only", i);
        if (!e_off && !e_on)
            TM_CHECK_MSG(off->d[i] && on->d[i] && strcmp(off->d[i], on->d[i]) == 0,
                         "record %d differs", i);
    }
}

// Only records sampled greedily (temperature 0 or top_k 1; stop strings; n > 1): every step goes
// through forward_greedy, with the tokenizer's limit.
static void test_greedy_op_pure(void) {
    for (int mode = WRAP_PLAIN; mode <= WRAP_NAN; mode++) {
        gresult off, on;
        run_greedy(0, mode, 0, 1, 256, &off);
        run_greedy(1, mode, 0, 1, 256, &on);
        check_same(&off, &on, mode);
        TM_CHECK(off.n_step_greedy == 0);
        TM_CHECK_MSG(on.n_step_greedy == on.n_step && on.n_step > 0 && on.n_greedy_rows > 0,
                     "mode %d: %llu of %llu steps greedy", mode,
                     (unsigned long long)on.n_step_greedy, (unsigned long long)on.n_step);
        TM_CHECK(on.limit_seen == tm_tok_n_vocab(g_tok));
        gresult_fini(&off);
        gresult_fini(&on);
    }
    TM_CHECK(tm_tok_n_vocab(g_tok) < g_model->cfg.n_vocab); // WRAP_PAD_WINS tested the limit
}

// Every kind of record mixed: steps with a sampled, logprobs or scoring row use forward; the
// others forward_greedy; the records are the same either way, also under preemption, with ties,
// and when a row has a NaN logit (its record fails the same way).
static void test_greedy_op_mixed(void) {
    static const struct {
        int mode, prefix_cache;
        uint32_t n_kv_block;
    } cases[] = {{WRAP_PLAIN, 1, 256},
                 {WRAP_PLAIN, 0, 10},
                 {WRAP_TIES, 1, 256},
                 {WRAP_PAD_WINS, 0, 256},
                 {WRAP_NAN, 1, 256}};
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        gresult off, on;
        run_greedy(0, cases[k].mode, 1, cases[k].prefix_cache, cases[k].n_kv_block, &off);
        run_greedy(1, cases[k].mode, 1, cases[k].prefix_cache, cases[k].n_kv_block, &on);
        check_same(&off, &on, cases[k].mode);
        TM_CHECK_MSG(on.n_step_greedy > 0 && on.n_step_greedy < on.n_step,
                     "case %zu: %llu of %llu steps greedy", k, (unsigned long long)on.n_step_greedy,
                     (unsigned long long)on.n_step);
        fprintf(stderr, "  mixed case %zu: %llu of %llu steps greedy, %d error records\n", k,
                (unsigned long long)on.n_step_greedy, (unsigned long long)on.n_step, on.n_err);
        gresult_fini(&off);
        gresult_fini(&on);
    }
}

// Issue 35: the schedule is a function of the input and the job, not of when records arrive. The
// same job with every record queued at once and with a slowed source (one record at a time, each
// after the runner took the one before) makes the same steps, computes the same prompt tokens and
// gives the same outputs. Before, the runner admitted whatever had arrived: one record per window
// with the slowed source, so the prefix ordering and the prefix cache saw nothing to share.
static void test_schedule_timing_free(void) {
    result fast, slow;
    run(1, TM_SCHED_PREFIX, 4096, 0.0f, &fast);
    g_slow_feed = 1;
    run(1, TM_SCHED_PREFIX, 4096, 0.0f, &slow);
    g_slow_feed = 0;
    TM_CHECK_MSG(fast.stats.n_step == slow.stats.n_step &&
                     fast.stats.n_tok_prefill == slow.stats.n_tok_prefill,
                 "steps %llu vs %llu, prefill tokens %llu vs %llu (all queued vs slowed source)",
                 (unsigned long long)fast.stats.n_step, (unsigned long long)slow.stats.n_step,
                 (unsigned long long)fast.stats.n_tok_prefill,
                 (unsigned long long)slow.stats.n_tok_prefill);
    TM_CHECK(same_outputs(&fast, &slow));
    result_fini(&fast);
    result_fini(&slow);
}

// The greedy rule the runner relies on is tm_sample_token's.
static void test_greedy_rule(void) {
    tm_err err = {0};
    tm_sample_scratch sc = {0};
    TM_CHECK_OK(tm_sample_scratch_init(&sc, 8, &err), &err);
    const float row[8] = {1, 3, 2, 3, 0, 3, 9, 9};
    tm_sample_params g = {.temperature = 0.0f}, k1 = {.temperature = 0.8f, .top_k = 1};
    tm_sample_params t = {.temperature = 0.8f, .top_p = 1.0f}, n = {.temperature = NAN};
    TM_CHECK(tm_sample_is_greedy(&g, 8) && tm_sample_is_greedy(&k1, 8));
    TM_CHECK(tm_sample_is_greedy(&n, 8) && tm_sample_is_greedy(&t, 1));
    TM_CHECK(!tm_sample_is_greedy(&t, 8));
    uint32_t id = 99;
    TM_CHECK_OK(tm_sample_token(row, 6, &g, 0, &sc, &id, &err), &err);
    TM_CHECK(id == 1); // the lowest of the tied maxima below the limit
    TM_CHECK_OK(tm_sample_token(row, 8, &k1, 0, &sc, &id, &err), &err);
    TM_CHECK(id == 6);
    tm_sample_scratch_fini(&sc);
}

int main(void) {
    char dir[] = "/tmp/tm_runner_XXXXXX";
    const char *small = getenv("TM_TEST_SMALL");
    if (small && *small && strcmp(small, "0") != 0) {
        g_n_rec = N_SYS * N_Q_SMALL;
        g_n_g = N_G_SMALL;
        fprintf(stderr, "TM_TEST_SMALL: %d and %d records (full: %d and %d)\n", g_n_rec, g_n_g,
                N_REC, N_G);
    }
    tm_unit_llama_open(dir, 3, &g_model, &g_tok);
    TM_RUN(test_cache_on_off_identical);
    TM_RUN(test_schedule_timing_free);
    TM_RUN(test_preemption_keeps_outputs);
    TM_RUN(test_cache_salt);
    TM_RUN(test_record_failures);
    TM_RUN(test_released);
    TM_RUN(test_greedy_rule);
    TM_RUN(test_greedy_op_pure);
    TM_RUN(test_greedy_op_mixed);
    tm_unit_llama_close(dir, g_model, g_tok);
    return tm_test_report();
}
