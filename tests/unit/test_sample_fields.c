/* tests/unit/test_sample_fields.c - the logits-processing fields of issue 22 end to end on the CPU:
 * parsing (native records and OpenAI bodies: presence / frequency / repetition_penalty,
 * logit_bias, min_tokens, stop_token_ids, ignore_eos; range checks with errors naming the field),
 * then the runner on a tiny random model: logit_bias forcing a token, min_tokens holding off EOS
 * and stop ids, stop_token_ids ending a record, ignore_eos, and penalised sampled records whose
 * every token is recomputed from the logits with tm_sample_token (itself checked against a
 * reference in test_sample_ref). */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/queue.h"
#include "ingest/job_spec.h"
#include "ingest/source.h"
#include "runner/engine/engine.h"
#include "runner/model/model.h"
#include "runner/runner.h"
#include "runner/sched/sample.h"
#include "runner/text/tokenizer.h"
#include "tm_test.h"
#include "tm_unit_model.h"

static char g_tmp[256];
static tm_model *g_model;
static tm_tokenizer *g_tok;

#define OAI                                                                                        \
    "{\"custom_id\":\"%s\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":"         \
    "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"

static const struct {
    const char *line;
    tm_errcode code;
    const char *msg; /* substring of the error message */
} cases[] = {
    {"{\"id\":\"n1\",\"prompt\":\"x\",\"presence_penalty\":0.5,\"frequency_penalty\":-1.5,"
     "\"repetition_penalty\":1.2,\"logit_bias\":{\"7\":-100,\"3\":2.5},\"min_tokens\":4,"
     "\"stop_token_ids\":[9,11],\"ignore_eos\":true}",
     TM_ERRCODE_NONE, NULL},
    {OAI "\"presence_penalty\":0.25,\"frequency_penalty\":0.5,\"logit_bias\":{\"42\":100},"
         "\"min_tokens\":2,\"stop_token_ids\":[5],\"ignore_eos\":false,\"repetition_penalty\":1}}",
     TM_ERRCODE_NONE, NULL},
    {"{\"id\":\"e1\",\"prompt\":\"x\",\"presence_penalty\":2.5}", TM_ERRCODE_INVALID_VALUE,
     "field 'presence_penalty': expected a number from -2 to 2, got 2.5"},
    {OAI "\"frequency_penalty\":\"lots\"}}", TM_ERRCODE_WRONG_TYPE,
     "field 'body.frequency_penalty': expected a number from -2 to 2"},
    {"{\"id\":\"e3\",\"prompt\":\"x\",\"repetition_penalty\":0}", TM_ERRCODE_INVALID_VALUE,
     "field 'repetition_penalty': expected a number > 0"},
    {OAI "\"logit_bias\":{\"12\":101}}}", TM_ERRCODE_INVALID_VALUE,
     "field 'body.logit_bias': expected an object of token id strings to numbers in [-100, 100]"},
    {OAI "\"logit_bias\":{\"a\":1}}}", TM_ERRCODE_INVALID_VALUE, "field 'body.logit_bias'"},
    {OAI "\"logit_bias\":[1]}}", TM_ERRCODE_WRONG_TYPE, "field 'body.logit_bias'"},
    {"{\"id\":\"e7\",\"prompt\":\"x\",\"logit_bias\":{\"1\":1,\"01\":2}}", TM_ERRCODE_INVALID_VALUE,
     "field 'logit_bias': expected distinct token ids"},
    {"{\"id\":\"e8\",\"prompt\":\"x\",\"min_tokens\":-1}", TM_ERRCODE_INVALID_VALUE,
     "field 'min_tokens': expected an integer from 0 to 2147483647"},
    {OAI "\"stop_token_ids\":[1,-2]}}", TM_ERRCODE_INVALID_VALUE, "field 'body.stop_token_ids'"},
    {OAI "\"stop_token_ids\":[1,2,3,4,5,6,7,8,9]}}", TM_ERRCODE_FIELD_TOO_LARGE,
     "field 'body.stop_token_ids' has 9 entries"},
    {"{\"id\":\"e11\",\"prompt\":\"x\",\"ignore_eos\":1}", TM_ERRCODE_WRONG_TYPE,
     "field 'ignore_eos': expected true or false"},
};
#define N_CASES (sizeof(cases) / sizeof(cases[0]))

static void test_parse(void) {
    char path[512], job[1024], jpath[512];
    snprintf(path, sizeof(path), "%s/in.jsonl", g_tmp);
    FILE *f = fopen(path, "wb");
    TM_CHECK(f != NULL);
    if (!f)
        return;
    for (size_t i = 0; i < N_CASES; i++) {
        char id[16];
        snprintf(id, sizeof(id), "c%zu", i);
        fprintf(f, cases[i].line, id);
        fputc('\n', f);
    }
    fclose(f);
    snprintf(job, sizeof(job),
             "{\"model\": \"m\", \"output\": {\"dir\": \"o\"}, \"limits\": {\"max_messages\": 8}, "
             "\"input\": {\"files\": [\"%s\"]}, \"defaults\": {\"repetition_penalty\": 1.1, "
             "\"logit_bias\": {\"5\": 1}}}",
             path);
    snprintf(jpath, sizeof(jpath), "%s/job.json", g_tmp);
    f = fopen(jpath, "wb");
    fputs(job, f);
    fclose(f);
    tm_job_spec *spec = NULL;
    tm_source *src = NULL;
    tm_err err = {0};
    TM_CHECK_OK(tm_job_spec_load(jpath, &spec, &err), &err);
    if (!spec)
        return;
    TM_CHECK(spec->defaults.n_bias == 1 && spec->defaults.bias_ids[0] == 5);
    TM_CHECK_NEAR(spec->defaults.repetition_penalty, 1.1, 1e-6);
    TM_CHECK_OK(tm_source_open(spec, &src, &err), &err);
    for (size_t i = 0; src; i++) {
        tm_job *j = NULL;
        tm_rc rc = tm_source_next(src, &j, &err);
        if (rc == TM_E_EOF) {
            TM_CHECK(i == N_CASES);
            break;
        }
        TM_CHECK_OK(rc, &err);
        if (rc)
            break;
        TM_CHECK_MSG(j->err_code == cases[i].code, "case %zu: %s (%s)", i,
                     tm_errcode_name(j->err_code), j->err_msg ? j->err_msg : "");
        if (cases[i].msg)
            TM_CHECK_MSG(j->err_msg && strstr(j->err_msg, cases[i].msg), "case %zu: '%s'", i,
                         j->err_msg ? j->err_msg : "NULL");
        const tm_sampling *sp = &j->sp;
        if (i == 0) {
            TM_CHECK_NEAR(sp->presence_penalty, 0.5, 1e-6);
            TM_CHECK_NEAR(sp->frequency_penalty, -1.5, 1e-6);
            TM_CHECK_NEAR(sp->repetition_penalty, 1.2, 1e-6);
            TM_CHECK(sp->n_bias == 2 && sp->bias_ids[0] == 3 && sp->bias_ids[1] == 7);
            TM_CHECK(sp->bias[0] == 2.5f && sp->bias[1] == -100.0f);
            TM_CHECK(sp->min_tokens == 4 && sp->n_stop_ids == 2 && sp->stop_ids[1] == 11);
            TM_CHECK(sp->ignore_eos == 1 && (sp->set & TM_SP_IGNORE_EOS));
        }
        if (i == 1) {
            TM_CHECK(j->err_code == TM_ERRCODE_NONE && j->format == TM_REC_FORMAT_OPENAI_CHAT);
            TM_CHECK(sp->n_bias == 1 && sp->bias_ids[0] == 42 && sp->bias[0] == 100.0f);
            TM_CHECK(sp->min_tokens == 2 && sp->n_stop_ids == 1 && sp->ignore_eos == 0);
            TM_CHECK(sp->set & TM_SP_REPETITION_PENALTY);
        }
        tm_job_destroy(j);
    }
    tm_source_destroy(src);
    tm_job_spec_destroy(spec);
}

// Every sampling field is a known body key (one key table, ingest/fields_int.h): with
// limits.strict_fields an OpenAI body that sets the issue-22 fields is a valid record (before the
// table, body.repetition_penalty, min_tokens, stop_token_ids and ignore_eos were read and also
// refused as unknown keys).
static void test_body_keys_strict(void) {
    char path[512], job[1024], jpath[512];
    snprintf(path, sizeof(path), "%s/strict.jsonl", g_tmp);
    FILE *f = fopen(path, "wb");
    TM_CHECK(f != NULL);
    if (!f)
        return;
    fprintf(f, cases[1].line, "s1");
    fputc('\n', f);
    fclose(f);
    snprintf(job, sizeof(job),
             "{\"model\": \"m\", \"output\": {\"dir\": \"o\"}, \"limits\": {\"strict_fields\": "
             "true}, \"input\": {\"files\": [\"%s\"]}}",
             path);
    snprintf(jpath, sizeof(jpath), "%s/strict.json", g_tmp);
    f = fopen(jpath, "wb");
    fputs(job, f);
    fclose(f);
    tm_job_spec *spec = NULL;
    tm_source *src = NULL;
    tm_err err = {0};
    TM_CHECK_OK(tm_job_spec_load(jpath, &spec, &err), &err);
    if (!spec)
        return;
    TM_CHECK(spec->strict_fields);
    TM_CHECK_OK(tm_source_open(spec, &src, &err), &err);
    tm_job *j = NULL;
    if (src)
        TM_CHECK_OK(tm_source_next(src, &j, &err), &err);
    TM_CHECK(j != NULL);
    if (j)
        TM_CHECK_MSG(j->err_code == TM_ERRCODE_NONE, "%s (%s)", tm_errcode_name(j->err_code),
                     j->err_msg ? j->err_msg : "");
    tm_job_destroy(j);
    tm_source_destroy(src);
    tm_job_spec_destroy(spec);
}

// tm_sampling_resolve: each field from the record where its bit is set, else the default.
static void test_resolve(void) {
    uint32_t d_ids[1] = {5}, r_ids[2] = {7, 8};
    float d_bias[1] = {1.0f};
    tm_sampling d = {.max_tokens = 16,
                     .temperature = 1.0f,
                     .top_p = 0.9f,
                     .top_k = -1,
                     .seed = 3,
                     .repetition_penalty = 1.1f,
                     .bias_ids = d_ids,
                     .bias = d_bias,
                     .n_bias = 1,
                     .min_tokens = 2};
    tm_sampling r = {.set = TM_SP_TEMPERATURE | TM_SP_STOP_TOKEN_IDS | TM_SP_MIN_TOKENS,
                     .max_tokens = 99,
                     .temperature = 0.0f,
                     .top_p = 0.5f,
                     .min_tokens = 0,
                     .stop_ids = r_ids,
                     .n_stop_ids = 2,
                     .repetition_penalty = 2.0f};
    tm_sampling out;
    tm_sampling_resolve(&d, &r, &out);
    TM_CHECK(out.set == r.set);
    TM_CHECK(out.max_tokens == 16 && out.temperature == 0.0f && out.top_p == 0.9f);
    TM_CHECK(out.top_k == -1 && out.seed == 3 && out.repetition_penalty == 1.1f);
    TM_CHECK(out.bias_ids == d_ids && out.bias == d_bias && out.n_bias == 1);
    TM_CHECK(out.stop_ids == r_ids && out.n_stop_ids == 2 && out.min_tokens == 0);
}

/* ---- the runner ---- */

static tm_job *new_job(int id, const char *prompt, int32_t max_tokens, float temp) {
    tm_job *job = tm_calloc(1, sizeof(*job));
    char buf[16];
    snprintf(buf, sizeof(buf), "%d", id);
    job->id_json = tm_strdup(buf);
    job->seq_no = (uint64_t)id;
    job->prompt = tm_strdup(prompt);
    job->sp.set = TM_SP_MAX_TOKENS | TM_SP_SEED | TM_SP_TEMPERATURE;
    job->sp.max_tokens = max_tokens;
    job->sp.temperature = temp;
    job->sp.seed = (uint64_t)id * 31 + 1;
    return job;
}

static void set_bias(tm_job *job, uint32_t id, float b) {
    job->sp.bias_ids = tm_malloc(sizeof(uint32_t));
    job->sp.bias = tm_malloc(sizeof(float));
    job->sp.bias_ids[0] = id, job->sp.bias[0] = b, job->sp.n_bias = 1;
    job->sp.set |= TM_SP_LOGIT_BIAS;
}

static void run_jobs(tm_job **jobs, int n, tm_completion **out) {
    tm_err err = {0};
    tm_engine *eng = NULL;
    tm_engine_opts eo = {.n_threads = 2,
                         .block_size = 16,
                         .n_kv_block = 256,
                         .max_seqs = 4,
                         .max_batched_tokens = 64,
                         .tp_size = 1};
    TM_CHECK_OK(tm_engine_cpu_create(g_model, &eo, &eng, &err), &err);
    tm_queue *in = NULL, *oq = NULL;
    TM_CHECK_OK(tm_queue_create((size_t)n + 1, &in, &err), &err);
    TM_CHECK_OK(tm_queue_create((size_t)n + 1, &oq, &err), &err);
    for (int i = 0; i < n; i++)
        TM_CHECK(tm_queue_push(in, jobs[i]) == TM_OK);
    tm_queue_close(in);
    tm_runner_cfg cfg = {.max_seqs = 4,
                         .max_batched_tokens = 64,
                         .block_size = 16,
                         .n_kv_block = 256,
                         .n_ctx = 4096,
                         .prefix_cache = 1,
                         .policy = TM_SCHED_PREFIX,
                         .lookahead = 64};
    cfg.defaults.max_tokens = 8;
    cfg.defaults.top_p = 1.0f;
    cfg.defaults.top_k = -1;
    tm_runner_stats st = {0};
    TM_CHECK_OK(tm_runner_run(&cfg, eng, g_tok, in, oq, &st, &err), &err);
    tm_queue_close(oq);
    tm_unit_collect(oq, out, n, 0);
    tm_queue_destroy(in);
    tm_queue_destroy(oq);
    tm_engine_destroy(eng);
}

static const char *PROMPT = "The quick brown fox jumps over the lazy dog. Then it";

static void test_runner(void) {
    const uint32_t eos = (uint32_t)tm_tok_eos_id(g_tok), X = 1000;
    tm_job *jobs[6];
    tm_completion *c[6] = {0};
    // 0: logit_bias +100 on X, greedy: every token is X
    jobs[0] = new_job(0, PROMPT, 6, 0.0f);
    set_bias(jobs[0], X, 100.0f);
    // 1: EOS +100, min_tokens 5: five other tokens, then EOS (6 counted, finish stop)
    jobs[1] = new_job(1, PROMPT, 20, 0.7f);
    set_bias(jobs[1], eos, 100.0f);
    jobs[1]->sp.min_tokens = 5, jobs[1]->sp.set |= TM_SP_MIN_TOKENS;
    // 2: X +100 and a stop id, min_tokens 3: stops at the 4th token, which is not in the text
    jobs[2] = new_job(2, PROMPT, 20, 0.0f);
    set_bias(jobs[2], X, 100.0f);
    jobs[2]->sp.stop_ids = tm_malloc(sizeof(uint32_t));
    jobs[2]->sp.stop_ids[0] = X, jobs[2]->sp.n_stop_ids = 1;
    jobs[2]->sp.min_tokens = 3;
    jobs[2]->sp.set |= TM_SP_STOP_TOKEN_IDS | TM_SP_MIN_TOKENS;
    // 3: EOS +100 with ignore_eos: runs to max_tokens
    jobs[3] = new_job(3, PROMPT, 5, 0.0f);
    set_bias(jobs[3], eos, 100.0f);
    jobs[3]->sp.ignore_eos = 1, jobs[3]->sp.set |= TM_SP_IGNORE_EOS;
    // 4: a bias id beyond the vocabulary: the record fails, naming the field
    jobs[4] = new_job(4, PROMPT, 5, 0.0f);
    set_bias(jobs[4], 1u << 30, 1.0f);
    // 5: penalised sampling, recomputed below
    jobs[5] = new_job(5, PROMPT, 12, 0.9f);
    jobs[5]->sp.repetition_penalty = 1.3f, jobs[5]->sp.frequency_penalty = 0.7f;
    jobs[5]->sp.presence_penalty = 0.4f, jobs[5]->sp.top_k = 40, jobs[5]->sp.top_p = 0.9f;
    jobs[5]->sp.set |= TM_SP_REPETITION_PENALTY | TM_SP_FREQUENCY_PENALTY | TM_SP_PRESENCE_PENALTY |
                       TM_SP_TOP_K | TM_SP_TOP_P;
    jobs[5]->logprobs = 1; // the ids come back in the logprobs
    jobs[0]->logprobs = jobs[1]->logprobs = jobs[2]->logprobs = 1;
    run_jobs(jobs, 6, c);
    for (int i = 0; i < 6; i++)
        TM_CHECK(c[i] != NULL);
    if (!c[0] || !c[1] || !c[2] || !c[3] || !c[4] || !c[5])
        return;
    TM_CHECK(c[0]->err_code == TM_ERRCODE_NONE && c[0]->n_tok_gen == 6);
    for (uint32_t i = 0; c[0]->logprobs && i < c[0]->logprobs->n_tok; i++)
        TM_CHECK(c[0]->logprobs->ids[i] == X);
    TM_CHECK(c[1]->n_tok_gen == 6 && c[1]->finish == TM_FINISH_STOP);
    for (uint32_t i = 0; c[1]->logprobs && i < 5; i++)
        TM_CHECK(c[1]->logprobs->ids[i] != eos);
    TM_CHECK(c[2]->n_tok_gen == 4 && c[2]->finish == TM_FINISH_STOP);
    TM_CHECK(c[2]->logprobs && c[2]->logprobs->ids[3] == X && c[2]->logprobs->ids[0] != X);
    TM_CHECK(c[3]->n_tok_gen == 5 && c[3]->finish == TM_FINISH_LENGTH);
    TM_CHECK(c[4]->err_code == TM_ERRCODE_INVALID_VALUE && c[4]->err_msg &&
             strstr(c[4]->err_msg, "field 'logit_bias': token id 1073741824 is beyond"));
    // 5: every sampled token is tm_sample_token's pick over the history so far
    tm_ids ids = {0};
    tm_err err = {0};
    TM_CHECK(tm_ids_push(&ids, (uint32_t)tm_tok_bos_id(g_tok), &err) == TM_OK);
    TM_CHECK_OK(tm_tok_encode(g_tok, PROMPT, strlen(PROMPT), &ids, &err), &err);
    const uint32_t n_prompt = (uint32_t)ids.len, V = g_model->cfg.n_vocab;
    const tm_logprobs *lp = c[5]->logprobs;
    TM_CHECK(lp && lp->n_tok == c[5]->n_tok_gen && lp->n_tok > 0);
    for (uint32_t i = 0; lp && i < lp->n_tok; i++)
        TM_CHECK(tm_ids_push(&ids, lp->ids[i], &err) == TM_OK);
    float *rows = tm_unit_rows_of(g_model, ids.ids, (uint32_t)ids.len);
    tm_sample_scratch s;
    TM_CHECK_OK(tm_sample_scratch_init(&s, V, &err), &err);
    int n_bad = 0, n_pen = 0;
    for (uint32_t j = 0; lp && j < lp->n_tok; j++) {
        tm_sample_params p = {.temperature = 0.9f,
                              .top_k = 40,
                              .top_p = 0.9f,
                              .seed = 5 * 31 + 1,
                              .repetition_penalty = 1.3f,
                              .frequency_penalty = 0.7f,
                              .presence_penalty = 0.4f,
                              .hist = ids.ids,
                              .n_hist = n_prompt + j,
                              .n_hist_prompt = n_prompt};
        uint32_t tok;
        const float *row = rows + (size_t)(n_prompt + j - 1) * V;
        TM_CHECK_OK(tm_sample_token(row, tm_tok_n_vocab(g_tok) < V ? tm_tok_n_vocab(g_tok) : V, &p,
                                    j, &s, &tok, &err),
                    &err);
        n_bad += tok != lp->ids[j];
        p.repetition_penalty = p.frequency_penalty = p.presence_penalty = 0;
        uint32_t plain;
        TM_CHECK_OK(tm_sample_token(row, tm_tok_n_vocab(g_tok) < V ? tm_tok_n_vocab(g_tok) : V, &p,
                                    j, &s, &plain, &err),
                    &err);
        n_pen += plain != tok;
    }
    TM_CHECK(n_bad == 0);
    fprintf(stderr, "penalised record: %u tokens, %d differ from the unpenalised pick\n",
            lp ? lp->n_tok : 0, n_pen);
    tm_sample_scratch_fini(&s);
    tm_free(rows);
    tm_ids_fini(&ids);
    for (int i = 0; i < 6; i++)
        tm_completion_destroy(c[i]);
}

int main(void) {
    snprintf(g_tmp, sizeof(g_tmp), "/tmp/tm_sample_fields_XXXXXX");
    TM_ASSERT(mkdtemp(g_tmp));
    TM_RUN(test_parse);
    TM_RUN(test_body_keys_strict);
    TM_RUN(test_resolve);
    char tokdir[1024];
    if (tm_unit_tokdir(tokdir, sizeof(tokdir))) {
        char dir[600];
        snprintf(dir, sizeof(dir), "%s/m", g_tmp);
        TM_ASSERT(tm_unit_mkmodel_llama(dir, 5) == 0);
        tm_err err = {0};
        TM_ASSERT(tm_model_load(dir, &g_model, &err) == TM_OK);
        TM_ASSERT(tm_tok_load(dir, &g_tok, &err) == TM_OK);
        TM_RUN(test_runner);
        tm_tok_destroy(g_tok);
        tm_model_destroy(g_model);
    } else {
        fprintf(stderr, "no DeepSeek tokenizer test data: runner part skipped\n");
    }
    tm_unit_rmdir(g_tmp);
    return tm_test_report();
}
