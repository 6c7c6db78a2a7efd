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
 * allocation of model load and engine create failing in turn. The MTP layer
 * (test_mtp): on mkmodel checkpoints whose MTP block and head copy main layer
 * 0 and the model's head (one-layer models, a CSA/top-k and an HCA/hash one),
 * the MTP forward given layer 0's input (the embedding streams) as its block
 * input must give the main forward's final streams and logits bit for bit, at
 * every step of chunked prefills and decodes of two sequences; and the MTP
 * forward from the main model's hidden streams and the next tokens must match
 * the block input the test computes itself from enorm/hnorm/e_proj/h_proj (in
 * double) within 1e-4; with the MTP layer's own random weights the first
 * check must fail (its tensors are the ones used). Without mkmodel the test is
 * skipped (exit 77). */
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "runner/engine/cpu/dsv4.h"
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

/* ---- MTP ---- */

#define MTP_BS 16
#define MTP_MAXP 96

typedef struct mtp_ctx {
    const tm_model *m;
    uint32_t D, N, V;
    float *ref; /* [rows][N*D] block inputs computed here */
} mtp_ctx;

// x_i = h_proj(hnorm(h_i)) + e_proj(enorm(embed(next))) for every stream i, in double.
static void mtp_block_in(const mtp_ctx *c, const float *hidden, const uint32_t *next, uint32_t n,
                         float *out) {
    const tm_dsv4 *w = tm_model_dsv4(c->m);
    const uint32_t D = c->D, N = c->N;
    const double eps = c->m->cfg.rms_eps;
    double *a = malloc(D * sizeof(double)), *ep = malloc(D * sizeof(double));
    for (uint32_t t = 0; t < n; t++) {
        double ss = 0;
        for (uint32_t d = 0; d < D; d++) {
            a[d] = tm_tensor_get_f32(&c->m->embd, (size_t)next[t] * D + d);
            ss += a[d] * a[d];
        }
        double sc = 1.0 / sqrt(ss / D + eps);
        for (uint32_t d = 0; d < D; d++)
            a[d] = tm_tensor_get_f32(&w->mtp.enorm, d) * (a[d] * sc);
        for (uint32_t o = 0; o < D; o++) {
            double acc = 0;
            for (uint32_t d = 0; d < D; d++)
                acc += tm_tensor_get_f32(&w->mtp.e_proj, (size_t)o * D + d) * a[d];
            ep[o] = acc;
        }
        for (uint32_t i = 0; i < N; i++) {
            const float *h = hidden + ((size_t)t * N + i) * D;
            ss = 0;
            for (uint32_t d = 0; d < D; d++)
                ss += (double)h[d] * h[d];
            sc = 1.0 / sqrt(ss / D + eps);
            for (uint32_t d = 0; d < D; d++)
                a[d] = tm_tensor_get_f32(&w->mtp.hnorm, d) * (h[d] * sc);
            for (uint32_t o = 0; o < D; o++) {
                double acc = 0;
                for (uint32_t d = 0; d < D; d++)
                    acc += tm_tensor_get_f32(&w->mtp.h_proj, (size_t)o * D + d) * a[d];
                out[((size_t)t * N + i) * D + o] = (float)(acc + ep[o]);
            }
        }
    }
    free(a);
    free(ep);
}

static double max_rel(const float *a, const float *b, size_t n) {
    double md = 0, ma = 0;
    for (size_t i = 0; i < n; i++) {
        md = fmax(md, fabs((double)a[i] - b[i]));
        ma = fmax(ma, fabs((double)a[i]));
    }
    return ma > 0 ? md / ma : md;
}

static void check_mtp(const char *name, const char *args, int copy) {
    const char *build = getenv("TM_BUILD");
    char dir[] = "/tmp/tm_test_dsv4m_XXXXXX", cmd[2048];
    TM_ASSERT(mkdtemp(dir));
    snprintf(cmd, sizeof(cmd), "'%s/mkmodel' --out '%s/m' --arch deepseek_v4 %s >/dev/null", build,
             dir, args);
    TM_CHECK(system(cmd) == 0);
    snprintf(cmd, sizeof(cmd), "%s/m", dir);
    tm_err err = {0};
    tm_model *m = NULL;
    TM_CHECK_OK(tm_model_load(cmd, &m, &err), &err);
    tm_engine *e1 = NULL, *e2 = NULL, *e3 = NULL;
    const uint32_t N_S = 2;
    tm_engine_opts o = {.n_threads = 2,
                        .block_size = MTP_BS,
                        .n_kv_block = N_S * MTP_MAXP / MTP_BS,
                        .max_seqs = N_S,
                        .max_batched_tokens = 64};
    if (m) {
        TM_CHECK(tm_dsv4_has_mtp(m) && tm_model_has_drafter(m));
        TM_CHECK_OK(tm_engine_cpu_create(m, &o, &e1, &err), &err);
        TM_CHECK_OK(tm_engine_cpu_create(m, &o, &e2, &err), &err);
        TM_CHECK_OK(tm_engine_cpu_create(m, &o, &e3, &err), &err);
    }
    if (e1 && e2 && e3) {
        const uint32_t D = m->cfg.n_embd, N = tm_model_dsv4(m)->cfg.hc_mult, V = m->cfg.n_vocab;
        const size_t ND = (size_t)N * D;
        mtp_ctx c = {.m = m, .D = D, .N = N, .V = V};
        uint32_t ids[2][MTP_MAXP + 1], len[2] = {37, 20}, done[2] = {0},
                                       table[2][MTP_MAXP / MTP_BS];
        for (uint32_t s = 0; s < N_S; s++) {
            for (uint32_t i = 0; i < len[s]; i++)
                ids[s][i] = (s * 29 + i * 13 + 5) % V;
            for (uint32_t k = 0; k < MTP_MAXP / MTP_BS; k++)
                table[s][k] = k * N_S + 1 - s;
        }
        float *lg = malloc(2 * V * sizeof(float)), *ml = malloc(2 * V * sizeof(float));
        float *ml2 = malloc(2 * V * sizeof(float)), *ml3 = malloc(2 * V * sizeof(float));
        float *emb = malloc(64 * ND * sizeof(float)), *so = malloc(64 * ND * sizeof(float));
        float *xin = malloc(64 * ND * sizeof(float));
        uint32_t nxt[64];
        int same_logits = 1, same_streams = 1, n_step = 0;
        double worst = 0;
        static const uint32_t chunk[] = {16, 5, 11, 20}; // prefill chunks, then decodes
        for (uint32_t step = 0; step < 16; step++) {
            tm_batch_seq bs[2];
            tm_dsv4_mtp_seq ms[2], ms2[2], ms3[2];
            uint32_t T = 0;
            for (uint32_t s = 0; s < N_S; s++) {
                uint32_t n = TM_MIN(len[s] - done[s], step < 4 ? chunk[(step + s) % 4] : 1u);
                if (n == 0)
                    n = 1; // prompt done: this step decodes
                bs[s] = (tm_batch_seq){.tokens = ids[s] + done[s],
                                       .n_tok = n,
                                       .pos = done[s],
                                       .block_table = table[s],
                                       .n_block = MTP_MAXP / MTP_BS,
                                       .want_logits = done[s] + n >= len[s]};
                for (uint32_t i = 0; i < n; i++, T++) // layer 0's input: the embedding streams
                    for (uint32_t k = 0; k < N; k++)
                        tm_dtype_to_f32(m->embd.data, m->embd.dtype,
                                        (size_t)ids[s][done[s] + i] * D, D,
                                        emb + (size_t)T * ND + (size_t)k * D);
            }
            tm_batch b = {.seqs = bs, .n_seq = N_S};
            TM_CHECK_OK(tm_engine_forward(e1, &b, lg, &err), &err);
            uint32_t r = 0;
            for (uint32_t s = 0; s < N_S; s++) {
                if (!bs[s].want_logits)
                    continue;
                const float *l = lg + (size_t)r++ * V;
                uint32_t best = 0;
                for (uint32_t v = 1; v < V; v++)
                    if (l[v] > l[best])
                        best = v;
                if (done[s] + bs[s].n_tok == len[s])
                    ids[s][len[s]++] = best;
            }
            uint32_t hT = 0;
            const float *hid = tm_dsv4_hidden(e1, &hT);
            TM_CHECK(hid && hT == T);
            if (!hid || hT != T)
                break;
            // 1. the MTP block as layer 0: same input, same output and head
            for (uint32_t s = 0, t0 = 0; s < N_S; t0 += bs[s++].n_tok)
                ms[s] = (tm_dsv4_mtp_seq){.block_in = emb + (size_t)t0 * ND,
                                          .next = bs[s].tokens,
                                          .n_tok = bs[s].n_tok,
                                          .pos = bs[s].pos,
                                          .block_table = table[s],
                                          .n_block = MTP_MAXP / MTP_BS,
                                          .want_logits = bs[s].want_logits};
            TM_CHECK_OK(tm_dsv4_mtp_forward(e1, ms, N_S, ml, so, &err), &err);
            same_logits &= memcmp(ml, lg, (size_t)r * V * sizeof(float)) == 0;
            same_streams &= memcmp(so, hid, (size_t)T * ND * sizeof(float)) == 0;
            // 2. from the hidden streams and the next tokens, against the block input made here
            for (uint32_t s = 0, t0 = 0; s < N_S; t0 += bs[s++].n_tok) {
                for (uint32_t i = 0; i < bs[s].n_tok; i++)
                    nxt[t0 + i] = ids[s][bs[s].pos + i + 1 < len[s] ? bs[s].pos + i + 1 : 0];
                ms2[s] = ms[s];
                ms2[s].block_in = NULL;
                ms2[s].hidden = hid + (size_t)t0 * ND;
                ms2[s].next = nxt + t0;
                ms3[s] = ms2[s];
                ms3[s].hidden = NULL;
                ms3[s].block_in = xin + (size_t)t0 * ND;
            }
            mtp_block_in(&c, hid, nxt, T, xin);
            TM_CHECK_OK(tm_dsv4_mtp_forward(e2, ms2, N_S, ml2, NULL, &err), &err);
            TM_CHECK_OK(tm_dsv4_mtp_forward(e3, ms3, N_S, ml3, NULL, &err), &err);
            for (uint32_t i = 0; i < r; i++)
                worst = fmax(worst, max_rel(ml3 + (size_t)i * V, ml2 + (size_t)i * V, V));
            for (uint32_t s = 0; s < N_S; s++)
                done[s] += bs[s].n_tok;
            n_step++;
        }
        fprintf(stderr,
                "  %s: %d steps; MTP on layer 0's input: logits %s, streams %s; MTP from hidden + "
                "next vs own block input: max rel err %.2e\n",
                name, n_step, same_logits ? "bit-equal" : "differ",
                same_streams ? "bit-equal" : "differ", worst);
        // a copy of layer 0 and the head must reproduce them; its own random weights must not
        TM_CHECK(copy ? same_logits && same_streams : !same_logits && !same_streams);
        TM_CHECK(worst < 1e-4);
        free(lg), free(ml), free(ml2), free(ml3), free(emb), free(so), free(xin);
    }
    tm_engine_destroy(e1);
    tm_engine_destroy(e2);
    tm_engine_destroy(e3);
    tm_model_destroy(m);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    TM_CHECK(system(cmd) == 0);
}

static void test_mtp(void) {
    if (!getenv("TM_BUILD")) {
        tm_test_skip("no mkmodel");
        return;
    }
#define MTP_SMALL                                                                                  \
    "--hidden 32 --heads 4 --head-dim 16 --o-groups 2 --o-lora 8 --q-lora 16 --ff 16 --vocab 64 "  \
    "--ctx 1024 --window 8 --index-heads 4 --index-dim 8 --index-topk 3 --rope-dim 4 "             \
    "--experts 4 --experts-used 2 --hca-ratio 16 --layers 1 "
    check_mtp("mtp csa/top-k bf16",
              MTP_SMALL "--seed 31 --dsv4-layers c --dsv4-mlp m --dsv4-mtp cm "
                        "--dsv4-mtp-copy 0 --hc 2 --dtype bf16",
              1);
    check_mtp("mtp hca/hash f32",
              MTP_SMALL "--seed 32 --dsv4-layers h --dsv4-mlp h --dsv4-mtp hh "
                        "--dsv4-mtp-copy 0 --hc 3 --dtype f32 --yarn 1",
              1);
    check_mtp("mtp sliding/top-k fp8",
              MTP_SMALL "--seed 33 --dsv4-layers s --dsv4-mlp m "
                        "--dsv4-mtp sm --dsv4-mtp-copy 0 --hc 2 "
                        "--dtype bf16 --quant fp8-block --quant-block 16",
              1);
    check_mtp("mtp own weights",
              MTP_SMALL "--seed 31 --dsv4-layers c --dsv4-mlp m --dsv4-mtp cm "
                        "--hc 2 --dtype bf16",
              0);
    // a model without the MTP layer refuses the MTP forward
    char dir[256];
    if (make_small(dir, sizeof(dir)) == 0) {
        tm_err err = {0};
        tm_model *m = NULL;
        tm_engine *e = NULL;
        TM_CHECK_OK(tm_model_load(dir, &m, &err), &err);
        tm_engine_opts o = {.n_threads = 1,
                            .block_size = 128,
                            .n_kv_block = 2,
                            .max_seqs = 1,
                            .max_batched_tokens = 8};
        if (m && tm_engine_cpu_create(m, &o, &e, &err) == TM_OK) {
            TM_CHECK(!tm_dsv4_has_mtp(m));
            uint32_t tok = 1, table[1] = {0};
            float x[2 * 64];
            tm_dsv4_mtp_seq s = {
                .block_in = x, .next = &tok, .n_tok = 1, .block_table = table, .n_block = 1};
            TM_CHECK(tm_dsv4_mtp_forward(e, &s, 1, NULL, NULL, &err) == TM_E_INVAL);
            TM_CHECK(strstr(err.msg, "no MTP layer") != NULL);
        }
        tm_engine_destroy(e);
        tm_model_destroy(m);
        char cmd[400];
        dir[strlen(dir) - 2] = '\0';
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
        TM_CHECK(system(cmd) == 0);
    }
}

int main(void) {
    TM_RUN(test_small_model);
    TM_RUN(test_mtp);
    TM_RUN(test_hf_fixtures);
    return tm_test_report();
}
