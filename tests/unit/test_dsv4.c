/* tests/unit/test_dsv4.c - the DeepSeek-V4 CPU engine against Hugging Face
 * transformers 5.17 (fixtures from tests/oracles/hf/make_dsv4_fixtures.py in
 * tests/fixtures/hf_dsv4/).
 *
 * For every fixture: rebuild the model with mkmodel from the stored arguments,
 * load it, check both rope settings' inv_freq against transformers', then run
 * three sequences through one engine (block size 128, block tables scattered
 * over the pool), sharing steps: A: the prompt in chunks that end at each
 * stored prompt position (1 to ~60 tokens), logits compared with transformers'
 * prefill logits there; B: the whole prompt in one chunk, then greedy decode
 * one token per step, logits compared with transformers' cached decode and the
 * argmax with its greedy tokens; C: (after A) the prefix-cache path: reuses A's
 * first full block, gets A's second block's first tokens through kv_copy, and
 * prefills the rest; its last logits must match too. Relative error per row =
 * max|ours - hf| / max|hf|, required below 1e-4. Also, on a small model of our
 * own: logits bit-identical across thread counts and prompt chunkings, config
 * errors, block sizes that are not a multiple of a compression ratio, and every
 * allocation of model load and engine create failing in turn. Without mkmodel
 * the test is skipped (exit 77). */
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "runner/engine/engine.h"
#include "runner/model/model.h"
#include "runner/model/model_dsv4.h"
#include "tm_test.h"

#define BS 128

static double g_worst = 0.0;
static int g_n_fixture = 0;

static double row_err(const float *ours, json_t *row, uint32_t nv, uint32_t *argmax) {
    double mx = 0.0, mb = 0.0;
    uint32_t arg = 0;
    for (uint32_t v = 0; v < nv; v++) {
        double hf = json_number_value(json_array_get(row, v));
        mx = fmax(mx, fabs(ours[v] - hf));
        mb = fmax(mb, fabs(hf));
        if (ours[v] > ours[arg])
            arg = v;
    }
    if (argmax)
        *argmax = arg;
    return mb > 0 ? mx / mb : mx;
}

static int build_model(const char *build, json_t *args, const char *dir) {
    char cmd[8192];
    int n = snprintf(cmd, sizeof(cmd), "'%s/mkmodel' --out '%s'", build, dir);
    for (size_t i = 0; i < json_array_size(args); i++)
        n += snprintf(cmd + n, sizeof(cmd) - (size_t)n, " '%s'",
                      json_string_value(json_array_get(args, i)));
    snprintf(cmd + n, sizeof(cmd) - (size_t)n, " >/dev/null");
    return system(cmd);
}

static void check_fixture(const char *path, const char *build) {
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    TM_CHECK_MSG(root != NULL, "%s: %s", path, jerr.text);
    if (!root)
        return;
    json_t *args = json_object_get(root, "mkmodel_args");
    json_t *prompt = json_object_get(root, "prompt_ids");
    json_t *row_pos = json_object_get(root, "row_pos");
    json_t *rows = json_object_get(root, "rows");
    json_t *greedy = json_object_get(root, "greedy_ids");
    json_t *steps = json_object_get(root, "steps");
    TM_CHECK(json_is_array(args) && json_is_array(prompt) && json_is_array(row_pos) &&
             json_is_array(rows) && json_is_array(greedy) && json_is_array(steps));
    char dir[] = "/tmp/tm_test_dsv4_XXXXXX";
    TM_ASSERT(mkdtemp(dir));
    char mdir[256];
    snprintf(mdir, sizeof(mdir), "%s/m", dir);
    tm_model *m = NULL;
    tm_engine *eng = NULL;
    tm_err err = {0};
    float *out = NULL;
    uint32_t *toks = NULL;
    int st = build_model(build, args, mdir);
    TM_CHECK_MSG(st == 0, "%s: mkmodel failed", path);
    if (st != 0)
        goto done;
    TM_CHECK_OK(tm_model_load(mdir, &m, &err), &err);
    if (!m)
        goto done;
    const tm_dsv4 *dm = tm_model_dsv4(m);
    TM_CHECK(dm != NULL);
    if (!dm)
        goto done;

    // rope tables
    const char *rk[2] = {"inv_freq_main", "inv_freq_compress"};
    const tm_dsv4_rope *rr[2] = {&dm->cfg.rope_main, &dm->cfg.rope_compress};
    for (int k = 0; k < 2; k++) {
        json_t *f = json_object_get(root, rk[k]);
        TM_CHECK(json_array_size(f) == dm->cfg.rope_dim / 2);
        for (size_t i = 0; i < json_array_size(f) && i < dm->cfg.rope_dim / 2; i++) {
            double hf = json_number_value(json_array_get(f, i));
            TM_CHECK_MSG(fabs(rr[k]->inv_freq[i] - hf) <= 1e-6 * fabs(hf), "%s: %s[%zu] %g vs %g",
                         path, rk[k], i, (double)rr[k]->inv_freq[i], hf);
        }
    }

    const uint32_t nv = m->cfg.n_vocab, n_prompt = (uint32_t)json_array_size(prompt);
    const uint32_t n_rows = (uint32_t)json_array_size(row_pos);
    const uint32_t n_steps = (uint32_t)json_array_size(steps);
    const uint32_t blocks_per_seq = TM_CEIL_DIV(n_prompt + n_steps, BS);
    tm_engine_opts o = {.n_threads = 3,
                        .block_size = BS,
                        .n_kv_block = 3 * blocks_per_seq + 2,
                        .max_seqs = 4,
                        .max_batched_tokens = n_prompt + 64};
    TM_CHECK_OK(tm_engine_cpu_create(m, &o, &eng, &err), &err);
    if (!eng)
        goto done;
    toks = malloc((n_prompt + n_steps) * sizeof(uint32_t));
    out = malloc(2 * (size_t)nv * sizeof(float));
    for (uint32_t i = 0; i < n_prompt; i++)
        toks[i] = (uint32_t)json_integer_value(json_array_get(prompt, i));
    for (uint32_t i = 0; i < n_steps; i++)
        toks[n_prompt + i] = (uint32_t)json_integer_value(json_array_get(greedy, i));
    // Block tables: A takes blocks 0, 3, 6.. reversed, B the others; C shares A's
    // first.
    uint32_t ta[16], tb[16], tc[16];
    TM_ASSERT(blocks_per_seq <= 16);
    for (uint32_t i = 0; i < blocks_per_seq; i++) {
        ta[i] = 3 * (blocks_per_seq - 1 - i);
        tb[i] = 3 * i + 1;
        tc[i] = 3 * i + 2;
    }
    double worst_rows = 0, worst_steps = 0, worst_c = 0;
    int greedy_ok = 1;
    uint32_t a_done = 0;
    for (uint32_t step = 0; step < TM_MAX(n_rows, n_steps); step++) {
        tm_batch_seq s[2];
        uint32_t n = 0, ia = UINT32_MAX, ib = UINT32_MAX;
        if (step < n_rows) {
            uint32_t end = (uint32_t)json_integer_value(json_array_get(row_pos, step)) + 1;
            s[n] = (tm_batch_seq){.tokens = toks + a_done,
                                  .n_tok = end - a_done,
                                  .pos = a_done,
                                  .block_table = ta,
                                  .n_block = blocks_per_seq,
                                  .want_logits = 1};
            a_done = end;
            ia = n++;
        }
        if (step < n_steps) {
            s[n] = (tm_batch_seq){.tokens = step == 0 ? toks : toks + n_prompt + step - 1,
                                  .n_tok = step == 0 ? n_prompt : 1,
                                  .pos = step == 0 ? 0 : n_prompt + step - 1,
                                  .block_table = tb,
                                  .n_block = blocks_per_seq,
                                  .want_logits = 1};
            ib = n++;
        }
        tm_batch b = {.seqs = s, .n_seq = n};
        TM_CHECK_OK(tm_engine_forward(eng, &b, out, &err), &err);
        if (ia != UINT32_MAX) {
            double e = row_err(out + (size_t)ia * nv, json_array_get(rows, step), nv, NULL);
            worst_rows = fmax(worst_rows, e);
            TM_CHECK_MSG(e < 1e-4, "%s: prompt position %u: rel err %g", path, a_done - 1, e);
        }
        if (ib != UINT32_MAX) {
            uint32_t arg;
            double e = row_err(out + (size_t)ib * nv, json_array_get(steps, step), nv, &arg);
            worst_steps = fmax(worst_steps, e);
            TM_CHECK_MSG(e < 1e-4, "%s: decode step %u: rel err %g", path, step, e);
            if (arg != toks[n_prompt + step])
                greedy_ok = 0;
        }
    }
    // C: prefix cache (A's first block shared) + kv_copy of part of A's second
    // block.
    if (n_prompt > BS + 8 && blocks_per_seq >= 2) {
        uint32_t part = TM_MIN(70u, n_prompt - BS - 1);
        tc[0] = ta[0];
        TM_CHECK_OK(eng->ops->kv_copy(eng, ta[1], tc[1], part, &err), &err);
        uint32_t p0 = BS + part;
        tm_batch_seq s = {.tokens = toks + p0,
                          .n_tok = n_prompt - p0,
                          .pos = p0,
                          .block_table = tc,
                          .n_block = blocks_per_seq,
                          .want_logits = 1};
        tm_batch b = {.seqs = &s, .n_seq = 1};
        TM_CHECK_OK(tm_engine_forward(eng, &b, out, &err), &err);
        worst_c = row_err(out, json_array_get(rows, n_rows - 1), nv, NULL);
        TM_CHECK_MSG(worst_c < 1e-4, "%s: prefix-cache sequence: rel err %g", path, worst_c);
    }
    TM_CHECK_MSG(greedy_ok, "%s: greedy tokens differ from transformers", path);
    fprintf(stderr,
            "  %s: %u prompt ids; prefill rows %u max rel err %.3g; decode steps "
            "%u max rel err "
            "%.3g, greedy %s; prefix-cache %.3g\n",
            path, n_prompt, n_rows, worst_rows, n_steps, worst_steps,
            greedy_ok ? "equal" : "DIFFERENT", worst_c);
    g_worst = fmax(g_worst, fmax(worst_rows, fmax(worst_steps, worst_c)));
    g_n_fixture++;
done:
    free(toks);
    free(out);
    tm_engine_destroy(eng);
    tm_model_destroy(m);
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "  could not remove %s\n", dir);
    json_decref(root);
}

static void test_hf_fixtures(void) {
    const char *src = getenv("TM_SRC"), *build = getenv("TM_BUILD");
    char dir[1024], mk[1024];
    snprintf(mk, sizeof(mk), "%s/mkmodel", build ? build : ".");
    snprintf(dir, sizeof(dir), "%s/tests/fixtures/hf_dsv4", src ? src : ".");
    DIR *d = opendir(dir);
    if (!build || access(mk, X_OK) != 0 || !d) {
        fprintf(stderr, "  no mkmodel or no fixtures in %s: skipped\n", dir);
        if (d)
            closedir(d);
        tm_test_skip("no DeepSeek-V4 fixtures or mkmodel");
    }
    char names[32][256];
    int n_names = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && n_names < 32) {
        size_t l = strlen(e->d_name);
        if (l > 5 && l < 256 && strcmp(e->d_name + l - 5, ".json") == 0)
            snprintf(names[n_names++], 256, "%s", e->d_name);
    }
    closedir(d);
    for (int i = 0; i < n_names; i++) {
        char path[1400];
        snprintf(path, sizeof(path), "%.1023s/%.255s", dir, names[i]);
        check_fixture(path, build);
    }
    fprintf(stderr, "  %d DeepSeek-V4 fixtures, worst relative error %.3g\n", g_n_fixture, g_worst);
}

/* ---- own small model: invariance, errors, allocation faults ---- */

static const char *const SMALL_ARGS[] = {"--arch",        "deepseek_v4", "--seed",        "5",
                                         "--layers",      "3",           "--dsv4-layers", "chs",
                                         "--dsv4-mlp",    "hmm",         "--hidden",      "32",
                                         "--heads",       "2",           "--head-dim",    "16",
                                         "--ff",          "16",          "--vocab",       "64",
                                         "--ctx",         "4096",        "--dtype",       "bf16",
                                         "--window",      "8",           "--index-topk",  "3",
                                         "--index-heads", "16",          "--index-dim",   "8",
                                         "--rope-dim",    "4",           "--q-lora",      "16",
                                         "--o-lora",      "8",           "--hc",          "2",
                                         "--hca-ratio",   "16",          "--experts",     "4"};

static int make_small(char *dir, size_t cap) {
    const char *build = getenv("TM_BUILD");
    if (!build)
        return -1;
    char tmpl[] = "/tmp/tm_test_dsv4s_XXXXXX";
    TM_ASSERT(mkdtemp(tmpl));
    snprintf(dir, cap, "%s/m", tmpl);
    json_t *args = json_array();
    for (size_t i = 0; i < sizeof(SMALL_ARGS) / sizeof(SMALL_ARGS[0]); i++)
        json_array_append_new(args, json_string(SMALL_ARGS[i]));
    int st = build_model(build, args, dir);
    json_decref(args);
    return st;
}

static void run_prompt(tm_engine *eng, const uint32_t *toks, uint32_t n, const uint32_t *chunks,
                       uint32_t n_chunk, float *out) {
    static const uint32_t table[4] = {3, 1, 0, 2};
    tm_err err = {0};
    uint32_t done = 0;
    for (uint32_t c = 0; c < n_chunk && done < n; c++) {
        uint32_t k = TM_MIN(chunks[c], n - done);
        tm_batch_seq s = {.tokens = toks + done,
                          .n_tok = k,
                          .pos = done,
                          .block_table = table,
                          .n_block = 4,
                          .want_logits = done + k == n};
        tm_batch b = {.seqs = &s, .n_seq = 1};
        TM_CHECK_OK(tm_engine_forward(eng, &b, out, &err), &err);
        done += k;
    }
}

static void test_small_model(void) {
    char dir[256];
    int st = make_small(dir, sizeof(dir));
    TM_CHECK(st == 0);
    if (st != 0)
        return;
    tm_err err = {0};
    tm_model *m = NULL;
    TM_CHECK_OK(tm_model_load(dir, &m, &err), &err);
    if (!m)
        return;
    TM_CHECK(strcmp(tm_model_arch_name(m), "deepseek_v4") == 0);
    // invariance: 1 thread, whole prompt vs 4 threads, odd chunks
    uint32_t toks[200];
    for (uint32_t i = 0; i < 200; i++)
        toks[i] = (i * 37u + 11u) % 64u;
    tm_engine_opts o = {.n_threads = 1,
                        .block_size = 128,
                        .n_kv_block = 4,
                        .max_seqs = 2,
                        .max_batched_tokens = 256};
    tm_engine *e1 = NULL, *e4 = NULL;
    TM_CHECK_OK(tm_engine_cpu_create(m, &o, &e1, &err), &err);
    o.n_threads = 4;
    TM_CHECK_OK(tm_engine_cpu_create(m, &o, &e4, &err), &err);
    float a[64], b[64];
    const uint32_t whole[1] = {200}, odd[6] = {1, 15, 37, 50, 63, 200};
    if (e1 && e4) {
        run_prompt(e1, toks, 200, whole, 1, a);
        run_prompt(e4, toks, 200, odd, 6, b);
        TM_CHECK(memcmp(a, b, sizeof(a)) == 0);
    }
    tm_engine_destroy(e1);
    tm_engine_destroy(e4);
    // block size not a multiple of the HCA ratio (16)
    o.block_size = 8;
    o.n_kv_block = 64;
    tm_engine *bad = NULL;
    TM_CHECK(tm_engine_cpu_create(m, &o, &bad, &err) == TM_E_INVAL);
    // every allocation of engine create failing in turn
    o.block_size = 128;
    o.n_kv_block = 4;
    long live0 = tm_alloc_live();
    int n_fail = 0;
    for (long k = 1; k < 400; k++) {
        tm_engine *e = NULL;
        tm_fault_set(TM_FAULT_ALLOC, k);
        tm_rc rc = tm_engine_cpu_create(m, &o, &e, &err);
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
    tm_model_destroy(m);
    // ... and of model load
    live0 = tm_alloc_live();
    n_fail = 0;
    for (long k = 1; k < 400; k++) {
        tm_model *m2 = NULL;
        tm_fault_set(TM_FAULT_ALLOC, k);
        tm_rc rc = tm_model_load(dir, &m2, &err);
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
    // config errors
    char cfg[300];
    snprintf(cfg, sizeof(cfg), "%s/config.json", dir);
    json_t *root = json_load_file(cfg, 0, NULL);
    TM_ASSERT(root);
    struct {
        const char *key;
        json_t *val;
        tm_rc want;
    } cases[] = {
        {"num_key_value_heads", json_integer(2), TM_E_INVAL},
        {"layer_types", json_pack("[sss]", "sliding_attention", "full", "sliding_attention"),
         TM_E_PARSE},
        {"mlp_layer_types", json_pack("[ss]", "moe", "moe"), TM_E_PARSE},
        {"partial_rotary_factor", json_real(0.1), TM_E_PARSE}, /* rope dim 1 */
        {"rope_parameters", json_pack("{ss}", "rope_type", "llama3"), TM_E_INVAL},
        {"q_lora_rank", json_integer(17), TM_E_PARSE}, /* tensor shapes disagree */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        json_t *c = json_deep_copy(root);
        json_object_set_new(c, cases[i].key, cases[i].val);
        TM_ASSERT(json_dump_file(c, cfg, 0) == 0);
        json_decref(c);
        tm_model *m3 = NULL;
        tm_rc rc = tm_model_load(dir, &m3, &err);
        TM_CHECK_MSG(rc == cases[i].want, "%s: got %d (%s)", cases[i].key, (int)rc, err.msg);
        tm_model_destroy(m3);
    }
    json_decref(root);
    char cmd[400];
    dir[strlen(dir) - 2] = '\0'; // the mkdtemp folder
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "  could not remove %s\n", dir);
}

int main(void) {
    TM_RUN(test_small_model);
    TM_RUN(test_hf_fixtures);
    return tm_test_report();
}
