/* tests/unit/test_dsv41.c - the DeepSeek-V4.1 CPU engine (docs/deepseek_v41.md).
 *
 * Against the NumPy oracle (tests/oracles/v41_ref.py, fixtures in tests/fixtures/v41/ made by
 * tests/oracles/make_v41_fixtures.py): for every fixture, rebuild the model with mkmodel from the
 * stored arguments, load it with its tokenizer's compressed token map, and run the prompt (in
 * one chunk, and in the fixture's chunks) and the greedy decode: max |d logprob| over the stored
 * rows and greedy agreement are checked and printed. On an mkmodel model of our own (Engram on
 * two layers, compress ratios 0/2/1, candidate selection): logits bit-identical across thread
 * counts, prompt chunkings, batch composition and a prefix-shared block plus kv_copy; config
 * refusals naming the field; a wrong compressed vocabulary refused naming both numbers; every
 * allocation of model load and engine create failing in turn. Without mkmodel: skipped (77).
 * V41_FIXTURES=DIR compares with another fixture folder (e.g. the torch reference's,
 * tests/oracles/v41_torch_ref.py); V41_LP_TOL=T then sets the bound (default 1e-3), and a greedy
 * step is only required to agree where the fixture's top-1 margin exceeds 2T (below that, logprobs
 * within T of each other may rank the top two either way). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "runner/engine/engine.h"
#include "runner/engram_map.h"
#include "runner/model/model.h"
#include "runner/model/model_dsv41.h"
#include "runner/text/tokenizer.h"
#include "tm_test.h"
#include "tm_v41_model.h"

#define BS 16

static tm_engine *make_engine_tp(const v41 *v, uint32_t n_threads, uint32_t n_block, uint32_t T,
                                 uint32_t tp) {
    tm_engine_opts o = {0};
    o.tp_size = tp;
    o.n_threads = n_threads;
    o.block_size = BS;
    o.n_kv_block = n_block;
    o.max_seqs = 4;
    o.max_batched_tokens = T;
    o.max_rows = T;
    o.token_map = v->map;
    o.n_token_map = v->n_map;
    o.engram_cache_mb = 1; // the tables are read through the row cache (engram_table.h)
    tm_engine *eng = NULL;
    tm_err err = {0};
    tm_rc rc = tp > 1 ? tm_engine_cpu_tp_create(v->m, &o, &eng, &err)
                      : tm_engine_cpu_create(v->m, &o, &eng, &err);
    TM_CHECK_OK(rc, &err);
    return eng;
}

static tm_engine *make_engine(const v41 *v, uint32_t n_threads, uint32_t n_block, uint32_t T) {
    return make_engine_tp(v, n_threads, n_block, T, 1);
}

/* One forward of tokens[pos..pos + c) of a sequence holding pos tokens before them (blocks
 * table[0..n_block)), every row's logits into buf: 0, or 1 after a failed check. */
static int forward_chunk(tm_engine *eng, const uint32_t *tokens, uint32_t pos, uint32_t c,
                         const uint32_t *table, uint32_t n_block, float *buf) {
    tm_batch_seq s = {0};
    s.tokens = tokens + pos;
    s.n_tok = c;
    s.pos = pos;
    s.block_table = table;
    s.n_block = n_block;
    s.want_logits = 1;
    s.n_logits = c;
    tm_batch b = {&s, 1};
    tm_err err = {0};
    tm_rc rc = tm_engine_forward(eng, &b, buf, &err);
    TM_CHECK_OK(rc, &err);
    return rc != TM_OK;
}

/* Run tokens[0..n) of one sequence through eng in chunks of the given sizes (cycled), block
 * table table[], logits of every position into out[n][V] (when out). Returns 0 on success. */
static int run_seq(tm_engine *eng, const uint32_t *tokens, uint32_t n, const uint32_t *chunks,
                   uint32_t n_chunks, const uint32_t *table, uint32_t n_block, float *out,
                   uint32_t V) {
    uint32_t pos = 0, ci = 0, mx = 1;
    for (uint32_t i = 0; i < n_chunks; i++)
        mx = chunks[i] > mx ? chunks[i] : mx;
    float *buf = malloc((size_t)(mx < n ? mx : n) * V * sizeof(float));
    while (pos < n) {
        uint32_t c = chunks[ci++ % n_chunks];
        if (c > n - pos)
            c = n - pos;
        if (forward_chunk(eng, tokens, pos, c, table, n_block, buf)) {
            free(buf);
            return 1;
        }
        if (out)
            memcpy(out + (size_t)pos * V, buf, (size_t)c * V * sizeof(float));
        pos += c;
    }
    free(buf);
    return 0;
}

/* run_seq for tokens[pos..pos + n) of a sequence already holding pos tokens. */
static int run_seq_at(tm_engine *eng, const uint32_t *tokens, uint32_t pos, uint32_t n,
                      const uint32_t *chunks, const uint32_t *table, uint32_t n_block, float *out,
                      uint32_t V) {
    float *buf = malloc((size_t)chunks[0] * V * sizeof(float));
    uint32_t ci = 0, end = pos + n;
    int bad = 0;
    while (pos < end && !bad) {
        uint32_t c = chunks[ci++ % 1];
        if (c > end - pos)
            c = end - pos;
        bad = forward_chunk(eng, tokens, pos, c, table, n_block, buf);
        if (!bad && out)
            memcpy(out, buf, (size_t)c * V * sizeof(float));
        out += (size_t)c * V;
        pos += c;
    }
    free(buf);
    return bad;
}

static const char *g_build;
static double g_worst_lp = 0.0; /* max |d logprob| over every compared row */
static uint32_t g_rows = 0, g_greedy = 0, g_greedy_eq = 0;
static double g_lp_tol = 1e-3; /* V41_LP_TOL */
static int g_lp_tol_set = 0;   /* greedy equality only above a 2 * tol margin */

/* max |logsoftmax(ours) - logsoftmax(ref)| over the vocabulary. */
static double lp_diff(const float *ours, json_t *ref, uint32_t V) {
    double mo = -INFINITY, mr = -INFINITY, so = 0.0, sr = 0.0;
    for (uint32_t i = 0; i < V; i++) {
        mo = fmax(mo, ours[i]);
        mr = fmax(mr, json_number_value(json_array_get(ref, i)));
    }
    for (uint32_t i = 0; i < V; i++) {
        so += exp(ours[i] - mo);
        sr += exp(json_number_value(json_array_get(ref, i)) - mr);
    }
    const double lo = mo + log(so), lr = mr + log(sr);
    double d = 0.0;
    for (uint32_t i = 0; i < V; i++)
        d = fmax(d, fabs((ours[i] - lo) - (json_number_value(json_array_get(ref, i)) - lr)));
    return d;
}

static uint32_t argmax_f(const float *r, uint32_t V) {
    uint32_t am = 0;
    for (uint32_t i = 1; i < V; i++)
        if (r[i] > r[am])
            am = i;
    return am;
}

/* Build the fixture's model with mkmodel into dir. */
static int build_model(json_t *fx, const char *dir) {
    char cmd[4096];
    int n = snprintf(cmd, sizeof(cmd), "rm -rf '%s' && '%s/mkmodel' --out '%s'", dir, g_build, dir);
    json_t *args = json_object_get(fx, "mkmodel_args");
    for (size_t i = 0; i < json_array_size(args); i++)
        n += snprintf(cmd + n, sizeof(cmd) - (size_t)n, " '%s'",
                      json_string_value(json_array_get(args, i)));
    n += snprintf(cmd + n, sizeof(cmd) - (size_t)n, " >/dev/null");
    return system(cmd);
}

/* One fixture: the prompt in one chunk (rows at row_pos), then greedy decode (steps), on one
 * engine; and the prompt again as a second sequence in chunks of 1..13 tokens on scattered
 * blocks, whose logits must be the same bits as the first sequence's. */
static void check_fixture_tp(const char *path, uint32_t tp);

static void check_fixture(const char *path) {
    for (uint32_t tp = 1; tp <= 4; tp *= 2)
        check_fixture_tp(path, tp);
}

/* TP > 1: the reference's split (tm_shard_dsv41_split) on the in-process TP engine; the same
 * tolerance and greedy equality against the oracle. */
static void check_fixture_tp(const char *path, uint32_t tp) {
    json_error_t je;
    json_t *fx = json_load_file(path, 0, &je);
    TM_CHECK_MSG(fx != NULL, "%s: %s", path, je.text);
    if (!fx)
        return;
    char dir[512];
    snprintf(dir, sizeof(dir), "/tmp/tm_test_dsv41_%d", (int)getpid());
    TM_CHECK_MSG(build_model(fx, dir) == 0, "%s: mkmodel failed", path);
    v41 v;
    if (open_v41(dir, &v)) {
        json_decref(fx);
        return;
    }
    const uint32_t V = v.m->cfg.n_vocab;
    json_t *prompt = json_object_get(fx, "prompt_ids"), *rows = json_object_get(fx, "rows");
    json_t *row_pos = json_object_get(fx, "row_pos"), *steps = json_object_get(fx, "steps");
    json_t *greedy = json_object_get(fx, "greedy_ids");
    const uint32_t n = (uint32_t)json_array_size(prompt), ns = (uint32_t)json_array_size(steps);
    uint32_t *tok = calloc(n + ns + 1, sizeof(uint32_t));
    for (uint32_t i = 0; i < n; i++)
        tok[i] = (uint32_t)json_integer_value(json_array_get(prompt, i));
    const uint32_t nb = (n + ns) / BS + 2, n_block = 2 * nb;
    uint32_t *ta = calloc(nb, sizeof(uint32_t)), *tb = calloc(nb, sizeof(uint32_t));
    for (uint32_t i = 0; i < nb; i++) { // interleaved and reversed: scattered over the pool
        ta[i] = 2 * i;
        tb[i] = n_block - 1 - 2 * i;
    }
    const tm_dsv41_cfg *dc = &tm_model_dsv41(v.m)->cfg;
    if (tp > 1 && (dc->n_heads % tp || dc->o_groups % tp || dc->index_n_heads % tp ||
                   dc->n_routed_experts % tp || dc->vocab_size % tp || dc->moe_inter_dim % tp)) {
        printf("  %s: tp %u: shape does not split, skipped\n", path, tp);
        close_v41(&v);
        json_decref(fx);
        free(ta);
        free(tb);
        free(tok);
        return;
    }
    tm_engine *eng = make_engine_tp(&v, 2, n_block, n + 8, tp);
    float *la = malloc((size_t)(n + ns) * V * sizeof(float));
    float *lb = malloc((size_t)(n + ns) * V * sizeof(float));
    const uint32_t one[1] = {n}, var[5] = {1, 13, 4, 7, 2};
    double worst = 0.0;
    if (eng && !run_seq(eng, tok, n, one, 1, ta, nb, la, V)) {
        for (size_t i = 0; i < json_array_size(row_pos); i++) {
            const uint32_t p = (uint32_t)json_integer_value(json_array_get(row_pos, i));
            worst = fmax(worst, lp_diff(la + (size_t)p * V, json_array_get(rows, i), V));
            g_rows++;
        }
        // greedy decode, one token per forward; the fixture's ids are fed so both follow the
        // same path
        for (uint32_t st = 0; st < ns; st++) {
            const float *r = st == 0 ? la + (size_t)(n - 1) * V : la + (size_t)(n + st - 1) * V;
            worst = fmax(worst, lp_diff(r, json_array_get(steps, st), V));
            g_rows++;
            g_greedy++;
            const uint32_t want = (uint32_t)json_integer_value(json_array_get(greedy, st));
            g_greedy_eq += argmax_f(r, V) == want;
            json_t *mg = json_array_get(json_object_get(fx, "step_margins"), st);
            const int must = !g_lp_tol_set || !mg || json_number_value(mg) > 2.0 * g_lp_tol;
            TM_CHECK_MSG(!must || argmax_f(r, V) == want, "%s: step %u greedy %u, oracle %u", path,
                         st, argmax_f(r, V), want);
            if (st + 1 < ns) {
                tok[n + st] = want;
                const uint32_t c1[1] = {1};
                run_seq_at(eng, tok, n + st, 1, c1, ta, nb, la + (size_t)(n + st) * V, V);
            }
        }
        // the same prompt chunked, on other blocks: the same bits
        run_seq(eng, tok, n, var, 5, tb, nb, lb, V);
        TM_CHECK_MSG(!memcmp(la, lb, (size_t)n * V * sizeof(float)),
                     "%s: chunked prefill differs from the one-chunk prefill", path);
    }
    printf("  %s: tp %u: %u prompt tokens, %u steps: max |d logprob| %.3g\n", path, tp, n, ns,
           worst);
    TM_CHECK_MSG(worst < g_lp_tol, "%s: max |d logprob| %.3g >= %.3g", path, worst, g_lp_tol);
    g_worst_lp = fmax(g_worst_lp, worst);
    free(la);
    free(lb);
    free(ta);
    free(tb);
    free(tok);
    tm_engine_destroy(eng);
    close_v41(&v);
    json_decref(fx);
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    TM_CHECK(system(cmd) == 0);
}

static void test_fixtures(void) {
    const char *src = getenv("TM_SRC");
    char dir[1024];
    const char *env = getenv("V41_FIXTURES"), *tol = getenv("V41_LP_TOL");
    if (tol && *tol) {
        g_lp_tol = atof(tol);
        g_lp_tol_set = 1;
    }
    snprintf(dir, sizeof(dir), "%s", env ? env : "");
    if (!env)
        snprintf(dir, sizeof(dir), "%s/tests/fixtures/v41", src ? src : ".");
    char cmd[1200];
    snprintf(cmd, sizeof(cmd), "ls '%s'/*.json 2>/dev/null", dir);
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
    printf("  %d fixtures, %u rows: max |d logprob| %.3g; greedy equal %u of %u\n", n, g_rows,
           g_worst_lp, g_greedy_eq, g_greedy);
    TM_CHECK_MSG(n > 0, "no fixtures in %s", dir);
}

/* ---- our own model: bit-identity, prefix sharing, refusals, allocation failures ---- */

#define OWN_ARGS                                                                                   \
    "--arch deepseek_v41 --seed 5 --layers 6 --compress-ratios 0,2,2,1,1,1 --kv-sources 1,3 "      \
    "--index-sources 1,3,5 --candidate-source 3 --candidate-topk-blocks 2 "                        \
    "--candidate-block-size 2 --engram-layers 0,2"

static char g_own[256];

static int own_model(void) {
    if (g_own[0])
        return 0;
    snprintf(g_own, sizeof(g_own), "/tmp/tm_test_dsv41_own_%d", (int)getpid());
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s' && '%s/mkmodel' --out '%s' " OWN_ARGS " >/dev/null",
             g_own, g_build, g_own);
    int st = system(cmd);
    TM_CHECK_MSG(st == 0, "mkmodel failed: %s", cmd);
    return st != 0;
}

/* Logits of every position of the prompt tok[0..n) run as the given step plans; the reference
 * run is one chunk, 1 thread. Threads, chunk sizes, a second sequence sharing the steps and a
 * prefix-shared block must not change a bit. */
static void test_bit_identity(void) {
    if (own_model())
        return;
    v41 v;
    if (open_v41(g_own, &v))
        return;
    const uint32_t V = v.m->cfg.n_vocab, n = 70;
    uint32_t tok[80];
    for (uint32_t i = 0; i < n; i++)
        tok[i] = (i * 37 + 11) % V;
    const uint32_t nb = n / BS + 1;
    uint32_t ta[8], tb[8], tc[8];
    for (uint32_t i = 0; i < nb; i++) {
        ta[i] = i;
        tb[i] = 20 + 2 * i;
        tc[i] = 40 + i;
    }
    float *ref = malloc((size_t)n * V * sizeof(float)),
          *got = malloc((size_t)n * V * sizeof(float));
    tm_engine *e1 = make_engine(&v, 1, 64, 128);
    const uint32_t one[1] = {n}, ones[1] = {1}, var[4] = {3, 17, 1, 6};
    TM_CHECK(!run_seq(e1, tok, n, one, 1, ta, nb, ref, V));
    // 3 threads, token by token
    tm_engine *e3 = make_engine(&v, 3, 64, 128);
    TM_CHECK(!run_seq(e3, tok, n, ones, 1, tb, nb, got, V));
    TM_CHECK_MSG(!memcmp(ref, got, (size_t)n * V * sizeof(float)), "threads/chunking changed bits");
    // two sequences in the same steps: B in chunks of var, C decoding token by token behind it
    {
        tm_engine *e = make_engine(&v, 2, 64, 128);
        float *lb = calloc((size_t)n * V, sizeof(float)),
              *lc = calloc((size_t)n * V, sizeof(float));
        float *buf = malloc((size_t)64 * V * sizeof(float));
        uint32_t pb = 0, pc = 0, ci = 0;
        while (pb < n || pc < n) {
            tm_batch_seq s[2];
            uint32_t k = 0;
            memset(s, 0, sizeof(s));
            if (pc < n) {
                s[k] = (tm_batch_seq){tok + pc, 1, pc, tc, nb, 1, 1};
                k++;
            }
            uint32_t c = 0;
            if (pb < n) {
                c = var[ci++ % 4];
                c = c > n - pb ? n - pb : c;
                s[k] = (tm_batch_seq){tok + pb, c, pb, tb, nb, 1, c};
                k++;
            }
            tm_batch b = {s, k};
            tm_err err = {0};
            tm_rc rc = tm_engine_forward(e, &b, buf, &err);
            TM_CHECK_OK(rc, &err);
            if (rc)
                break;
            uint32_t r = 0;
            if (pc < n) {
                memcpy(lc + (size_t)pc * V, buf, V * sizeof(float));
                r = 1;
                pc++;
            }
            if (c) {
                memcpy(lb + (size_t)pb * V, buf + (size_t)r * V, (size_t)c * V * sizeof(float));
                pb += c;
            }
        }
        TM_CHECK_MSG(!memcmp(ref, lb, (size_t)n * V * sizeof(float)),
                     "batched chunks changed bits");
        TM_CHECK_MSG(!memcmp(ref, lc, (size_t)n * V * sizeof(float)),
                     "batched decode changed bits");
        // prefix sharing: D reuses B's first block (tb[0]), gets B's second block's first 5
        // tokens by kv_copy, then runs the rest
        uint32_t td[8];
        memcpy(td, tb, sizeof(td));
        td[1] = 60;
        tm_err err = {0};
        tm_rc rc = e->ops->kv_copy(e, tb[1], td[1], 5, &err);
        TM_CHECK_OK(rc, &err);
        float *ld = malloc((size_t)n * V * sizeof(float));
        TM_CHECK(!run_seq_at(e, tok, BS + 5, n - BS - 5, one, td, nb, ld, V));
        TM_CHECK_MSG(
            !memcmp(ref + (size_t)(BS + 5) * V, ld, (size_t)(n - BS - 5) * V * sizeof(float)),
            "prefix-shared block + kv_copy changed bits");
        free(ld);
        free(buf);
        free(lb);
        free(lc);
        tm_engine_destroy(e);
    }
    free(ref);
    free(got);
    tm_engine_destroy(e1);
    tm_engine_destroy(e3);
    close_v41(&v);
}

/* Rewrite config.json's text_config field key to val (JSON text; NULL removes it), load, expect
 * failure whose message contains want (want NULL: expect success). */
static void refuse(const char *key, const char *val, const char *want, int top) {
    char path[512], cmd[2048];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s_c' && cp -r '%s' '%s_c'", g_own, g_own, g_own);
    TM_CHECK(system(cmd) == 0);
    snprintf(path, sizeof(path), "%s_c/config.json", g_own);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    TM_CHECK(root != NULL);
    if (!root)
        return;
    json_t *obj = top ? root : json_object_get(root, "text_config");
    if (val)
        json_object_set_new(obj, key, json_loads(val, JSON_DECODE_ANY, &je));
    else
        json_object_del(obj, key);
    TM_CHECK(json_dump_file(root, path, 0) == 0);
    json_decref(root);
    snprintf(path, sizeof(path), "%s_c", g_own);
    tm_model *m = NULL;
    tm_err err = {0};
    tm_rc rc = tm_model_load(path, &m, &err);
    if (!want) {
        TM_CHECK_OK(rc, &err);
        tm_model_destroy(m);
        return;
    }
    TM_CHECK_MSG(rc != TM_OK, "%s = %s: loaded", key, val ? val : "(removed)");
    TM_CHECK_MSG(rc == TM_OK || strstr(err.msg, want), "%s: message '%s' lacks '%s'", key, err.msg,
                 want);
    tm_model_destroy(m);
}

static void test_refusals(void) {
    if (own_model())
        return;
    refuse("bogus_field", "1", "bogus_field", 0);
    refuse("bogus_top", "1", "bogus_top", 1);
    refuse("scoring_func", "\"relu\"", "score_func", 0);
    refuse("hidden_act", "\"gelu\"", "hidden_act", 0);
    refuse("num_key_value_heads", "2", "num_key_value_heads", 0);
    refuse("n_shared_experts", "2", "n_shared_experts", 0);
    refuse("kv_source_layer_ids", "[2]", "kv source", 0);
    refuse("candidate_source_layer_id", "2", "candidate_source_layer", 0);
    refuse("compress_ratios", "[0,2]", "compress_ratios", 0);
    refuse("hidden_size", "48", "multiple of 32", 0);
    refuse("engram_layer_ids", "[0,9]", "engram_layer_ids", 0);
    refuse("rope_scaling", "{\"rope_type\": \"linear\", \"factor\": 2}", "rope_scaling", 0);
    refuse("quantization_config", "{\"quant_method\": \"fp8\", \"weight_block_size\": [128, 128]}",
           "weight_block_size", 1);
    refuse("model_type", "\"deepseek_v4\"", "deepseek_v", 1);
    // vision fields are accepted (the tower is not read), and so are runtime limits
    refuse("vision_config", "{\"num_hidden_layers\": 2, \"hidden_size\": 64}", NULL, 1);
    refuse("gate_temp", "1.5", NULL, 0);
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s_c'", g_own);
    TM_CHECK(system(cmd) == 0);
}

/* The compressed vocabulary the tokenizer gives must be the config's: both numbers named. */
static void test_vocab_mismatch(void) {
    if (own_model())
        return;
    v41 v;
    if (open_v41(g_own, &v))
        return;
    int32_t *bad = malloc(v.n_map * sizeof(int32_t));
    memcpy(bad, v.map, v.n_map * sizeof(int32_t));
    bad[v.n_map - 1] = (int32_t)v.n_comp; // one more distinct key than the config says
    tm_engine_opts o = {0};
    o.n_threads = 1;
    o.block_size = BS;
    o.n_kv_block = 8;
    o.max_seqs = 1;
    o.max_batched_tokens = 8;
    o.token_map = bad;
    o.n_token_map = v.n_map;
    tm_engine *eng = NULL;
    tm_err err = {0};
    TM_CHECK(tm_engine_cpu_create(v.m, &o, &eng, &err) == TM_E_INVAL);
    char a[64], b[64];
    snprintf(a, sizeof(a), "%u", v.n_comp);
    snprintf(b, sizeof(b), "%u", v.n_comp + 1);
    TM_CHECK_MSG(strstr(err.msg, a) && strstr(err.msg, b), "message '%s' lacks %s and %s", err.msg,
                 a, b);
    o.token_map = NULL; // an Engram model without a map
    TM_CHECK(tm_engine_cpu_create(v.m, &o, &eng, &err) == TM_E_INVAL);
    o.token_map = v.map;
    o.block_size = 5; // not a multiple of ratio 2
    TM_CHECK(tm_engine_cpu_create(v.m, &o, &eng, &err) == TM_E_INVAL);
    o.block_size = BS;
    o.kv_dtype = TM_KV_DTYPE_FP8;
    TM_CHECK(tm_engine_cpu_create(v.m, &o, &eng, &err) == TM_E_INVAL);
    o.kv_dtype = TM_KV_DTYPE_AUTO;
    o.tp_size = 3; // 4 heads do not split 3 ways: refused naming the counts
    TM_CHECK(tm_engine_cpu_tp_create(v.m, &o, &eng, &err) == TM_E_INVAL);
    TM_CHECK_MSG(strstr(err.msg, "divide by tp 3"), "message '%s'", err.msg);
    free(bad);
    close_v41(&v);
}

static void test_alloc_faults(void) {
    if (own_model())
        return;
    v41 v;
    if (open_v41(g_own, &v))
        return;
    tm_engine_opts o = {0};
    o.n_threads = 2;
    o.block_size = BS;
    o.n_kv_block = 8;
    o.max_seqs = 2;
    o.max_batched_tokens = 16;
    o.token_map = v.map;
    o.n_token_map = v.n_map;
    tm_err err = {0};
    long live0 = tm_alloc_live();
    int n_fail = 0;
    for (long k = 1; k < 400; k++) {
        tm_engine *e = NULL;
        tm_fault_set(TM_FAULT_ALLOC, k);
        tm_rc rc = tm_engine_cpu_create(v.m, &o, &e, &err);
        tm_fault_set(TM_FAULT_ALLOC, 0);
        if (rc == TM_OK) {
            tm_engine_destroy(e);
            break;
        }
        TM_CHECK(rc == TM_E_NOMEM || rc == TM_E_IO);
        TM_CHECK(tm_alloc_live() == live0);
        n_fail++;
    }
    TM_CHECK(n_fail > 20);
    close_v41(&v);
    live0 = tm_alloc_live();
    n_fail = 0;
    for (long k = 1; k < 400; k++) {
        tm_model *m2 = NULL;
        tm_fault_set(TM_FAULT_ALLOC, k);
        tm_rc rc = tm_model_load(g_own, &m2, &err);
        tm_fault_set(TM_FAULT_ALLOC, 0);
        if (rc == TM_OK) {
            tm_model_destroy(m2);
            break;
        }
        TM_CHECK(rc == TM_E_NOMEM);
        TM_CHECK(tm_alloc_live() == live0);
        n_fail++;
    }
    TM_CHECK(n_fail > 3);
}

int main(void) {
    g_build = getenv("TM_BUILD");
    if (!g_build) {
        tm_test_skip("no mkmodel (TM_BUILD)");
        return tm_test_report();
    }
    TM_RUN(test_fixtures);
    TM_RUN(test_bit_identity);
    TM_RUN(test_refusals);
    TM_RUN(test_vocab_mismatch);
    TM_RUN(test_alloc_faults);
    if (g_own[0]) {
        char cmd[600];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_own);
        TM_CHECK(system(cmd) == 0);
    }
    return tm_test_report();
}
