/* tests/unit/test_dsv41_dspark.c - the DeepSeek-V4.1 DSpark drafter on the CPU engine
 * (runner/engine/cpu/dsv41_dspark.h, docs/speculative.md "DSpark").
 *
 * Against the NumPy oracle's forward_spec (tests/oracles/make_v41_dspark_fixture.py, fixtures in
 * tests/fixtures/v41/dspark/): rebuild each model with mkmodel, prefill the prompt, hand the
 * prompt's hidden rows to the drafter (seeding the stages' window KV), then per decode step one
 * forward of the last token and a draft call on its row: the main pick, the draft ids (the greedy
 * Markov chain) and the block's logits rows (max |d logprob| < 1e-3 stated) and confidence scores
 * must match. Then on the same model: draft logits bit-identical whether the rows come in one call
 * or one by one, across thread counts and after kv_copy of a partly filled block (the prefix
 * cache); a model without DSpark stages, or on the tp engine, reports no drafter; the job spec
 * takes "dspark" and vLLM's draft_sample_method spellings. Cost printed (bench/spec_dspark_cpu.sh).
 * Without mkmodel: skipped (77). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "ingest/job_spec.h"
#include "runner/engine/cpu/dsv41.h"
#include "runner/engine/engine.h"
#include "runner/engram_map.h"
#include "runner/model/model.h"
#include "runner/model/model_dsv41.h"
#include "runner/text/tokenizer.h"
#include "tm_test.h"
#include "tm_v41_model.h"

#define BS 16

static const char *g_build;

static tm_engine *make_engine(const v41 *v, uint32_t n_threads, uint32_t n_block, uint32_t T) {
    tm_engine_opts o = {0};
    o.n_threads = n_threads;
    o.block_size = BS;
    o.n_kv_block = n_block;
    o.max_seqs = 4;
    o.max_batched_tokens = T;
    o.max_rows = T;
    o.token_map = v->map;
    o.n_token_map = v->n_map;
    o.engram_cache_mb = 1;
    tm_engine *eng = NULL;
    tm_err err = {0};
    tm_rc rc = tm_engine_cpu_create(v->m, &o, &eng, &err);
    TM_CHECK_OK(rc, &err);
    return eng;
}

/* One forward of tokens[0..n) at pos; the last row's logits into out (when out). */
static int fwd(tm_engine *eng, const uint32_t *tokens, uint32_t pos, uint32_t n,
               const uint32_t *table, uint32_t n_block, float *out) {
    tm_batch_seq s = {.tokens = tokens,
                      .n_tok = n,
                      .pos = pos,
                      .block_table = table,
                      .n_block = n_block,
                      .want_logits = out != NULL};
    tm_batch b = {&s, 1};
    tm_err err = {0};
    tm_rc rc = tm_engine_forward(eng, &b, out, &err);
    TM_CHECK_OK(rc, &err);
    return rc != TM_OK;
}

/* The draft op over the last forward's n rows (positions pos..) with next tokens next[0..n). */
static int draft(tm_engine *eng, const float *hidden, const uint32_t *next, uint32_t pos,
                 uint32_t n, const uint32_t *table, uint32_t n_block, int want, float *out) {
    tm_engine_draft_seq q = {.hidden = hidden,
                             .next = next,
                             .n_tok = n,
                             .pos = pos,
                             .block_table = table,
                             .n_block = n_block,
                             .want_logits = want};
    tm_err err = {0};
    tm_rc rc = eng->ops->draft(eng, &q, 1, out, NULL, &err);
    TM_CHECK_OK(rc, &err);
    return rc != TM_OK;
}

static uint32_t argmax_f(const float *r, uint32_t V) {
    uint32_t b = 0;
    for (uint32_t i = 1; i < V; i++)
        b = r[i] > r[b] ? i : b;
    return b;
}

static double lp_diff(const float *ours, json_t *ref, uint32_t V) {
    double mo = -INFINITY, mr = -INFINITY, so = 0.0, sr = 0.0, worst = 0.0;
    for (uint32_t i = 0; i < V; i++) {
        mo = fmax(mo, ours[i]);
        mr = fmax(mr, json_number_value(json_array_get(ref, i)));
    }
    for (uint32_t i = 0; i < V; i++) {
        so += exp(ours[i] - mo);
        sr += exp(json_number_value(json_array_get(ref, i)) - mr);
    }
    const double lo = mo + log(so), lr = mr + log(sr);
    for (uint32_t i = 0; i < V; i++)
        worst = fmax(worst,
                     fabs((ours[i] - lo) - (json_number_value(json_array_get(ref, i)) - lr)));
    return worst;
}

static int build_model(json_t *fx, const char *dir) {
    char cmd[4096];
    int n = snprintf(cmd, sizeof(cmd), "rm -rf '%s' && '%s/mkmodel' --out '%s'", dir, g_build, dir);
    json_t *args = json_object_get(fx, "mkmodel_args");
    for (size_t i = 0; i < json_array_size(args); i++)
        n += snprintf(cmd + n, sizeof(cmd) - (size_t)n, " '%s'",
                      json_string_value(json_array_get(args, i)));
    snprintf(cmd + n, sizeof(cmd) - (size_t)n, " >/dev/null");
    return system(cmd);
}

static double g_worst = 0.0, g_worst_conf = 0.0;
static uint32_t g_steps = 0, g_ids = 0, g_ids_eq = 0;

/* The prompt's rows, then per step: forward of the token, draft of its row. */
static void check_fixture(const char *path) {
    json_error_t je;
    json_t *fx = json_load_file(path, 0, &je);
    TM_CHECK_MSG(fx != NULL, "%s: %s", path, je.text);
    if (!fx)
        return;
    char dir[256];
    snprintf(dir, sizeof(dir), "/tmp/tm_test_dspark_%d", (int)getpid());
    TM_CHECK_MSG(build_model(fx, dir) == 0, "%s: mkmodel failed", path);
    v41 v;
    if (open_v41(dir, &v)) {
        json_decref(fx);
        return;
    }
    const uint32_t V = v.m->cfg.n_vocab;
    json_t *prompt = json_object_get(fx, "prompt_ids"), *spec = json_object_get(fx, "spec");
    const uint32_t n = (uint32_t)json_array_size(prompt), ns = (uint32_t)json_array_size(spec);
    const uint32_t B = (uint32_t)json_integer_value(json_object_get(fx, "block_size"));
    uint32_t *tok = calloc(n + ns + 2, sizeof(uint32_t));
    for (uint32_t i = 0; i < n; i++)
        tok[i] = (uint32_t)json_integer_value(json_array_get(prompt, i));
    const uint32_t nb = (n + ns + B) / BS + 2;
    uint32_t *table = calloc(nb, sizeof(uint32_t));
    for (uint32_t i = 0; i < nb; i++)
        table[i] = nb - 1 - i; // reversed: slots are not positions
    tm_engine *eng = make_engine(&v, 2, nb, n + 8);
    float *row = malloc((size_t)V * sizeof(float)), *dl = malloc((size_t)B * V * sizeof(float));
    const tm_engine_draft_info info = eng ? tm_engine_drafter(eng) : (tm_engine_draft_info){0};
    TM_CHECK(info.kind == TM_DRAFT_BLOCK && info.n_out == B);
    double worst = 0.0;
    if (eng && info.kind == TM_DRAFT_BLOCK && !fwd(eng, tok, 0, n, table, nb, row)) {
        uint32_t nh = 0;
        const float *h = eng->ops->hidden(eng, &nh);
        TM_CHECK(h && nh == n);
        tok[n] = argmax_f(row, V);
        draft(eng, h, tok + 1, 0, n, table, nb, 0, NULL); // seeds the stages' windows
        for (uint32_t st = 0; st < ns; st++) {
            json_t *s = json_array_get(spec, st);
            const uint32_t p = (uint32_t)json_integer_value(json_object_get(s, "pos"));
            TM_CHECK(p == n + st);
            TM_CHECK_MSG(tok[p] == (uint32_t)json_integer_value(json_object_get(s, "token")),
                         "%s: step %u token %u", path, st, tok[p]);
            if (fwd(eng, tok + p, p, 1, table, nb, row))
                break;
            tok[p + 1] = argmax_f(row, V);
            TM_CHECK_MSG(tok[p + 1] == (uint32_t)json_integer_value(json_object_get(s, "main")),
                         "%s: step %u main pick %u", path, st, tok[p + 1]);
            h = eng->ops->hidden(eng, &nh);
            if (draft(eng, h, tok + p + 1, p, 1, table, nb, 1, dl))
                break;
            json_t *lg = json_object_get(s, "logits"), *ids = json_object_get(s, "draft");
            json_t *conf = json_object_get(s, "confidence");
            const float *cf = tm_dsv41_engine_confidence(eng);
            TM_CHECK(cf != NULL);
            if (!cf)
                break;
            for (uint32_t j = 0; j < B; j++) {
                worst = fmax(worst, lp_diff(dl + (size_t)j * V, json_array_get(lg, j), V));
                const uint32_t id = argmax_f(dl + (size_t)j * V, V);
                const uint32_t want = (uint32_t)json_integer_value(json_array_get(ids, j + 1));
                g_ids++;
                g_ids_eq += id == want;
                TM_CHECK_MSG(id == want, "%s: step %u draft %u: %u, oracle %u", path, st, j, id,
                             want);
                g_worst_conf = fmax(g_worst_conf,
                                    fabs(cf[j] - json_number_value(json_array_get(conf, j))));
            }
            g_steps++;
        }
    }
    printf("  %s: %u prompt tokens, %u draft blocks of %u: max |d logprob| %.3g\n", path, n, ns, B,
           worst);
    TM_CHECK_MSG(worst < 1e-3, "%s: draft logits max |d logprob| %.3g >= 1e-3", path, worst);
    g_worst = fmax(g_worst, worst);
    free(row);
    free(dl);
    free(table);
    free(tok);
    tm_engine_destroy(eng);
    close_v41(&v);
    json_decref(fx);
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    TM_CHECK(system(cmd) == 0);
}

static void test_oracle(void) {
    const char *src = getenv("TM_SRC");
    char cmd[1200];
    snprintf(cmd, sizeof(cmd), "ls '%s/tests/fixtures/v41/dspark'/*.json 2>/dev/null",
             src ? src : ".");
    FILE *ls = popen(cmd, "r");
    char line[1200];
    int n = 0;
    while (ls && fgets(line, sizeof(line), ls)) {
        line[strcspn(line, "\n")] = 0;
        check_fixture(line);
        n++;
    }
    if (ls)
        pclose(ls);
    printf("  %d fixtures, %u draft blocks: max |d logprob| %.3g, draft ids equal %u of %u, "
           "max |d confidence| %.3g\n",
           n, g_steps, g_worst, g_ids_eq, g_ids, g_worst_conf);
    TM_CHECK_MSG(n > 0, "no fixtures");
    TM_CHECK(g_worst_conf < 1e-3);
}

/* ---- bit identity on our own model ---- */

#define OWN_ARGS                                                                                   \
    "--arch deepseek_v41 --seed 9 --layers 3 --compress-ratios 0,2,1,0,0 --kv-sources 1,2 "        \
    "--index-sources 1,2 --engram-layers 0 --window 8 --dspark 2 --dspark-block 5 "                \
    "--dspark-targets 0,1,2 --markov-rank 32"

/* Prompt n tokens on table t, its rows drafted in pieces of `piece` rows (0: one call), then the
 * block after the last row: B rows into out. */
static int prompt_draft(tm_engine *eng, const uint32_t *tok, uint32_t n, const uint32_t *t,
                        uint32_t nb, uint32_t piece, uint32_t V, float *out) {
    float *row = malloc((size_t)V * sizeof(float));
    int bad = fwd(eng, tok, 0, n, t, nb, row);
    uint32_t nh = 0;
    const float *h = eng->ops->hidden(eng, &nh);
    const uint32_t w = tm_engine_drafter(eng).width;
    if (!piece)
        piece = n;
    for (uint32_t p = 0; !bad && p < n; p += piece) {
        const uint32_t c = p + piece > n ? n - p : piece;
        bad = draft(eng, h + (size_t)p * w, tok + p + 1, p, c, t, nb, p + c == n, out);
    }
    free(row);
    return bad;
}

static void test_bit_identity(void) {
    char dir[128], cmd[2048];
    snprintf(dir, sizeof(dir), "/tmp/tm_test_dspark_own_%d", (int)getpid());
    snprintf(cmd, sizeof(cmd), "rm -rf '%s' && '%s/mkmodel' --out '%s' " OWN_ARGS " >/dev/null",
             dir, g_build, dir);
    TM_CHECK(system(cmd) == 0);
    v41 v;
    if (open_v41(dir, &v))
        return;
    const uint32_t V = v.m->cfg.n_vocab, n = 37, B = 5;
    uint32_t tok[40];
    for (uint32_t i = 0; i < 40; i++)
        tok[i] = (i * 37 + 11) % (V - 1);
    const uint32_t ta[4] = {0, 1, 2, 3}, tb[4] = {7, 5, 4, 6};
    float *a = malloc((size_t)B * V * sizeof(float)), *b = malloc((size_t)B * V * sizeof(float));
    tm_engine *e2 = make_engine(&v, 2, 8, 64), *e1 = make_engine(&v, 1, 8, 64);
    if (e1 && e2) {
        TM_CHECK(!prompt_draft(e2, tok, n, ta, 4, 0, V, a));
        TM_CHECK(!prompt_draft(e2, tok, n, tb, 4, 1, V, b)); // row by row, other blocks
        TM_CHECK_MSG(!memcmp(a, b, (size_t)B * V * sizeof(float)),
                     "draft logits differ between one call and one row per call");
        TM_CHECK(!prompt_draft(e1, tok, n, tb, 4, 7, V, b));
        TM_CHECK_MSG(!memcmp(a, b, (size_t)B * V * sizeof(float)),
                     "draft logits differ between 2 threads and 1");
        // a prefix shared by kv_copy: blocks 0, 1 computed by sequence a; sequence c takes them
        // (block 0 whole, block 1's first 5 slots copied into block 6), then its own rows
        tm_err err = {0};
        tm_rc rc = e2->ops->kv_copy(e2, 1, 6, 5, &err);
        TM_CHECK_OK(rc, &err);
        const uint32_t tc[4] = {0, 6, 5, 4};
        uint32_t nh = 0;
        float *row = malloc((size_t)V * sizeof(float));
        TM_CHECK(!fwd(e2, tok + 21, 21, n - 21, tc, 4, row));
        const float *h = e2->ops->hidden(e2, &nh);
        TM_CHECK(!draft(e2, h, tok + 22, 21, n - 21, tc, 4, 1, b));
        TM_CHECK_MSG(!memcmp(a, b, (size_t)B * V * sizeof(float)),
                     "draft logits differ after kv_copy of a shared prefix");
        free(row);
        // the draft's greedy chain: row j's argmax feeds row j+1's Markov bias, so every row's
        // pick is a valid token id and the rows differ from the unbiased head's
        for (uint32_t j = 0; j < B; j++)
            TM_CHECK(argmax_f(a + (size_t)j * V, V) < V);
        // bad rows refused, nothing run
        tm_engine_draft_seq q = {.hidden = h,
                                 .next = tok,
                                 .n_tok = 1,
                                 .pos = 100,
                                 .block_table = tc,
                                 .n_block = 4,
                                 .want_logits = 1};
        rc = e2->ops->draft(e2, &q, 1, b, NULL, &err);
        TM_CHECK(rc == TM_E_INVAL);
        TM_CHECK(strstr(err.msg, "dspark draft") != NULL);
    }
    free(a);
    free(b);
    tm_engine_destroy(e1);
    tm_engine_destroy(e2);
    close_v41(&v);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    TM_CHECK(system(cmd) == 0);
}

/* A model without DSpark stages has no drafter; bad DSpark configs are refused naming the field. */
static void test_no_drafter(void) {
    char dir[128], cmd[2048];
    snprintf(dir, sizeof(dir), "/tmp/tm_test_dspark_none_%d", (int)getpid());
    snprintf(cmd, sizeof(cmd),
             "rm -rf '%s' && '%s/mkmodel' --out '%s' --arch deepseek_v41 --layers 2 "
             "--compress-ratios 0,1 --kv-sources 1 --index-sources 1 --engram-layers 0 >/dev/null",
             dir, g_build, dir);
    TM_CHECK(system(cmd) == 0);
    v41 v;
    if (!open_v41(dir, &v)) {
        TM_CHECK(!tm_model_has_drafter(v.m));
        tm_engine *e = make_engine(&v, 1, 4, 16);
        if (e)
            TM_CHECK(tm_engine_drafter(e).kind == TM_DRAFT_NONE);
        tm_engine_destroy(e);
        close_v41(&v);
    }
    // a DSpark model on the CPU tensor-parallel engine (tp 2): no drafter (DSpark runs at tp 1)
    snprintf(cmd, sizeof(cmd), "rm -rf '%s' && '%s/mkmodel' --out '%s' " OWN_ARGS " >/dev/null",
             dir, g_build, dir);
    TM_CHECK(system(cmd) == 0);
    if (!open_v41(dir, &v)) {
        TM_CHECK(tm_model_has_drafter(v.m));
        tm_engine_opts o = {.n_threads = 1,
                            .block_size = BS,
                            .n_kv_block = 8,
                            .max_seqs = 2,
                            .max_batched_tokens = 32,
                            .max_rows = 32,
                            .tp_size = 2,
                            .token_map = v.map,
                            .n_token_map = v.n_map,
                            .engram_cache_mb = 1};
        tm_engine *e = NULL;
        tm_err terr = {0};
        TM_CHECK_OK(tm_engine_cpu_tp_create(v.m, &o, &e, &terr), &terr);
        if (e) {
            TM_CHECK(tm_engine_drafter(e).kind == TM_DRAFT_NONE);
            uint32_t nh = 1;
            TM_CHECK(e->ops->hidden(e, &nh) == NULL && nh == 0);
            TM_CHECK(e->ops->draft(e, NULL, 0, NULL, NULL, &terr) == TM_E_INVAL);
        }
        tm_engine_destroy(e);
        close_v41(&v);
    }
    // a DSpark model whose stage has a compress ratio: refused naming compress_ratios
    snprintf(
        cmd, sizeof(cmd),
        "rm -rf '%s' && '%s/mkmodel' --out '%s' " OWN_ARGS " >/dev/null && "
        "python3 -c \"import json,sys; p=sys.argv[1]+'/config.json'; c=json.load(open(p)); "
        "t=c.get('text_config', c); t['compress_ratios'][-1]=1; json.dump(c, open(p,'w'))\" '%s'",
        dir, g_build, dir, dir);
    TM_CHECK(system(cmd) == 0);
    tm_model *m = NULL;
    tm_err err = {0};
    tm_rc rc = tm_model_load(dir, &m, &err);
    TM_CHECK(rc != TM_OK);
    TM_CHECK_MSG(strstr(err.msg, "compress_ratios") != NULL, "%s", err.msg);
    tm_model_destroy(m);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    TM_CHECK(system(cmd) == 0);
}

/* engine.speculative: "dspark" and vLLM's draft_sample_method spellings taken (and in the
 * canonical spec), anything else refused naming the field. */
static void test_job_spec(void) {
    static const char *const fmt =
        "{\"model\": \"m\", \"input\": {\"files\": [\"tests/fixtures/spec/copy.jsonl\"]}, "
        "\"output\": {\"dir\": \"o\"}, \"engine\": {\"speculative\": {\"method\": \"%s\", "
        "\"num_speculative_tokens\": 5%s}}}";
    static const struct {
        const char *method, *extra, *field; /* field: NULL = accepted */
    } cases[] = {
        {"dspark", "", NULL},
        {"dspark", ", \"draft_sample_method\": \"greedy\"", NULL},
        {"dspark", ", \"draft_sample_method\": \"probabilistic\"", NULL},
        {"dspark", ", \"draft_sample_method\": \"beam\"", "engine.speculative.draft_sample_method"},
        {"dspark", ", \"draft_sample_method\": 3", "engine.speculative.draft_sample_method"},
        {"dsparkle", "", "engine.speculative.method"},
        {"dspark", ", \"confidence_threshold\": 0.5", NULL},
        {"dspark", ", \"confidence_threshold\": 1.5", "engine.speculative.confidence_threshold"},
        {"ngram", ", \"confidence_threshold\": 0.5", "engine.speculative.confidence_threshold"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char text[1024];
        snprintf(text, sizeof(text), fmt, cases[i].method, cases[i].extra);
        tm_job_spec *spec = NULL;
        tm_err err = {0};
        tm_rc rc = tm_job_spec_load_text("(t)", NULL, text, &spec, &err);
        if (!cases[i].field) {
            TM_CHECK_OK(rc, &err);
            TM_CHECK(spec && spec->engine.spec_dspark && !spec->engine.spec_mtp &&
                     spec->engine.spec_k == 5 &&
                     strstr(spec->canonical_json, "\"method\":\"dspark\"") != NULL);
        } else {
            TM_CHECK(rc != TM_OK);
            TM_CHECK_MSG(strstr(err.msg, cases[i].field) != NULL, "case %zu: %s", i, err.msg);
        }
        tm_job_spec_destroy(spec);
    }
}

/* ---- cost (bench/spec_dspark_cpu.sh): printed, never asserted ---- */

/* Milliseconds per call, batch B with P-token prompts: a plain decode step (one token each), a
 * DSpark draft pass (one new row each + its block), a verification step of K = 5 drafts (6
 * tokens, 6 rows each). */
static void cost(const v41 *v, uint32_t B, uint32_t reps) {
    enum { P = 64, K = 5 };
    const uint32_t V = v->m->cfg.n_vocab, nbs = (P + 16) / BS + 1;
    tm_engine_opts o = {.n_threads = 2,
                        .block_size = BS,
                        .n_kv_block = B * nbs,
                        .max_seqs = B,
                        .max_batched_tokens = B * P,
                        .max_rows = B * (K + 1),
                        .token_map = v->map,
                        .n_token_map = v->n_map,
                        .engram_cache_mb = 64};
    tm_engine *eng = NULL;
    tm_err err = {0};
    TM_CHECK_OK(tm_engine_cpu_create(v->m, &o, &eng, &err), &err);
    if (!eng)
        return;
    const tm_engine_draft_info info = tm_engine_drafter(eng);
    uint32_t *toks = calloc((size_t)B * P, sizeof(uint32_t)), *bt = calloc((size_t)B * nbs, 4);
    tm_batch_seq *bs = calloc(B, sizeof(*bs));
    tm_engine_draft_seq *ds = calloc(B, sizeof(*ds));
    float *lg = calloc((size_t)B * TM_MAX(K + 1, info.n_out) * V, sizeof(float));
    float *hb = calloc((size_t)B * P * info.width, sizeof(float));
    for (uint32_t i = 0; i < B * P; i++)
        toks[i] = 3 + (i * 7919u) % (V - 8);
    for (uint32_t i = 0; i < B * nbs; i++)
        bt[i] = i;
    for (uint32_t b = 0; b < B; b++)
        bs[b] = (tm_batch_seq){.tokens = toks + b * P,
                               .n_tok = P - K - 1,
                               .pos = 0,
                               .block_table = bt + b * nbs,
                               .n_block = nbs,
                               .want_logits = 1};
    TM_CHECK_OK(tm_engine_forward(eng, &(tm_batch){bs, B}, lg, &err), &err);
    uint32_t nh = 0;
    const float *h = eng->ops->hidden(eng, &nh);
    memcpy(hb, h, (size_t)nh * info.width * sizeof(float));
    for (uint32_t b = 0; b < B; b++)
        ds[b] = (tm_engine_draft_seq){.hidden = hb + (size_t)b * (P - K - 1) * info.width,
                                      .next = toks + b * P + 1,
                                      .n_tok = P - K - 1,
                                      .pos = 0,
                                      .block_table = bt + b * nbs,
                                      .n_block = nbs};
    TM_CHECK_OK(eng->ops->draft(eng, ds, B, lg, NULL, &err), &err);
    double t_dec = 0, t_dr = 0, t_ver = 0;
    const uint32_t p = P - K - 1;
    for (uint32_t r = 0; r < reps; r++) {
        for (uint32_t b = 0; b < B; b++)
            bs[b] = (tm_batch_seq){.tokens = toks + b * P + p,
                                   .n_tok = 1,
                                   .pos = p,
                                   .block_table = bt + b * nbs,
                                   .n_block = nbs,
                                   .want_logits = 1};
        double t0 = tm_now_ms();
        TM_CHECK_OK(tm_engine_forward(eng, &(tm_batch){bs, B}, lg, &err), &err);
        t_dec += tm_now_ms() - t0;
        h = eng->ops->hidden(eng, &nh);
        memcpy(hb, h, (size_t)nh * info.width * sizeof(float));
        for (uint32_t b = 0; b < B; b++)
            ds[b] = (tm_engine_draft_seq){.hidden = hb + (size_t)b * info.width,
                                          .next = toks + b * P + p + 1,
                                          .n_tok = 1,
                                          .pos = p,
                                          .block_table = bt + b * nbs,
                                          .n_block = nbs,
                                          .want_logits = 1};
        t0 = tm_now_ms();
        TM_CHECK_OK(eng->ops->draft(eng, ds, B, lg, NULL, &err), &err);
        t_dr += tm_now_ms() - t0;
        for (uint32_t b = 0; b < B; b++)
            bs[b] = (tm_batch_seq){.tokens = toks + b * P + p,
                                   .n_tok = K + 1,
                                   .pos = p,
                                   .block_table = bt + b * nbs,
                                   .n_block = nbs,
                                   .want_logits = 1,
                                   .n_logits = K + 1};
        t0 = tm_now_ms();
        TM_CHECK_OK(tm_engine_forward(eng, &(tm_batch){bs, B}, lg, &err), &err);
        t_ver += tm_now_ms() - t0;
    }
    printf("  cost batch %u (%u reps, 2 threads, block %u): decode step %.3f ms, DSpark draft pass "
           "%.3f ms (%.2fx), verification of %d drafts %.3f ms (%.2fx)\n",
           B, reps, info.n_out, t_dec / reps, t_dr / reps, t_dr / t_dec, K, t_ver / reps,
           t_ver / t_dec);
    free(toks), free(bt), free(bs), free(ds), free(lg), free(hb);
    tm_engine_destroy(eng);
}

static void test_cost(void) {
    const char *env = getenv("TM_DSPARK_BENCH"); // a model folder: the bench's figures
    char dir[256], cmd[1024];
    snprintf(dir, sizeof(dir), "/tmp/tm_test_dspark_cost_%d", (int)getpid());
    if (!env) {
        snprintf(cmd, sizeof(cmd),
                 "rm -rf '%s' && '%s/mkmodel' --out '%s' " OWN_ARGS " --dspark-block 6 >/dev/null",
                 dir, g_build, dir);
        TM_CHECK(system(cmd) == 0);
    }
    v41 v;
    if (!open_v41(env ? env : dir, &v)) {
        const uint32_t reps = env ? 20 : 2;
        cost(&v, 1, reps);
        cost(&v, 8, reps);
    }
    close_v41(&v);
    if (!env) {
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
        TM_CHECK(system(cmd) == 0);
    }
}

int main(void) {
    g_build = getenv("TM_BUILD");
    if (!g_build) {
        tm_test_skip("no mkmodel (TM_BUILD)");
        return tm_test_report();
    }
    TM_RUN(test_job_spec);
    TM_RUN(test_oracle);
    TM_RUN(test_bit_identity);
    TM_RUN(test_no_drafter);
    TM_RUN(test_cost);
    return tm_test_report();
}
