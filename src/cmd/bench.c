/* cmd/bench.c - `tokenmill bench`. No source or sink threads: a workload's records all fit in the
 * queues (capacity = records + 1), so they are pushed, the input queue is closed, the runner runs
 * on this thread until every record is done, and the completions are counted afterwards. */
#define _POSIX_C_SOURCE 200809L
#include "cmd/bench.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/fsutil.h"
#include "base/log.h"
#include "base/queue.h"
#include "cmd/engine_opts.h"
#include "cmd/job_run.h"
#include "runner/engine/engine.h"
#include "runner/engine/cuda/engine_cuda.h"
#include "runner/engram_map.h"
#include "runner/model/model.h"
#include "runner/model/model_dsv41.h"
#include "runner/runner.h"
#include "runner/text/tokenizer.h"
#include "cmd/run_metrics.h"
#include "sink/metrics.h"

#define BENCH_MAX_SEQS 8
#define BENCH_MAX_BATCHED_TOKENS 16384
#define BENCH_BLOCK_SIZE 128

typedef struct workload {
    const char *name;
    uint32_t n_seqs, prompt_tok, gen_tok, shared_tok;
} workload;

/* BENCHMARKS.md: W1 = 1 x 512 + 256, W8 = 8 x 512 + 256, P = 8 x 2048 prefill + 1. "prefix":
 * 8 prompts of 1024 tokens whose first 768 (6 blocks of 128) are the same, 64 generated. */
static const workload full_wl[] = {
    {"W1", 1, 512, 256, 0},
    {"W8", 8, 512, 256, 0},
    {"P", 8, 2048, 1, 0},
    {"prefix", 8, 1024, 64, 768},
};
/* --scale small: the same shapes shrunk for CI on the tiny demo model (seconds on 2 cores). The
 * prefix workload keeps one full shared block of 128 tokens. */
static const workload small_wl[] = {
    {"W1", 1, 64, 16, 0},
    {"W8", 8, 64, 16, 0},
    {"P", 8, 256, 1, 0},
    {"prefix", 8, 192, 16, 160},
};
enum { N_WL = sizeof(full_wl) / sizeof(full_wl[0]) };

static const char usage[] =
    "usage: tokenmill bench --model DIR [options]\n"
    "\n"
    "Runs the standard workloads through the runner and engine, prints a summary table (prefill,\n"
    "decode and output tok/s, TTFT p50, and the decode % of the bandwidth ceiling when\n"
    "--bandwidth is given) and writes OUT/<workload>/metrics.json for each\n"
    "(schemas/metrics.schema.json, with a \"bench\" section):\n"
    "  W1      1 x 512-token prompt + 256 generated (batch-1 TTFT and decode)\n"
    "  W8      8 x 512 + 256 each (batched decode)\n"
    "  P       8 x 2048 prefill + 1 token (prefill throughput)\n"
    "  prefix  8 x 1024 sharing their first 768 tokens + 64 each (prefix cache)\n"
    "Prompts are random token ids (seeded); decoding is greedy and ignores EOS.\n"
    "\n"
    "options:\n"
    "  --model DIR         Hugging Face model folder (required)\n"
    "  --backend cpu|cuda  engine (default cpu)\n"
    "  --workloads LIST    comma-separated subset of W1,W8,P,prefix (default all)\n"
    "  --out DIR           output folder (default out/bench)\n"
    "  --bandwidth GBS     memory bandwidth in GB/s (e.g. 4237, an H200's measured copy rate,\n"
    "                      docs/BENCHMARKS.md): the table gives decode tok/s as a % of the\n"
    "                      ceiling B x GBS / (parameters x 2 bytes) (bf16 weights; KV reads\n"
    "                      left out, so the ceiling is a little high)\n"
    "  --scale full|small  small: 64-token prompts, 16 generated, P 8 x 256 (CI on tiny models)\n"
    "  --threads N         CPU threads (default: one per core)\n"
    "  --seed N            prompt seed (default 1)\n";

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

typedef struct bench {
    tm_model *model;
    tm_tokenizer *tok;
    tm_engine *eng;
    tm_engine_opts eo;
    char model_path[PATH_MAX];
    const char *backend;
    const char *scale;
    uint64_t seed;
    uint32_t n_vocab; /* ids a prompt may use */
    int32_t special[TM_MODEL_MAX_EOS + 2];
    uint32_t n_special;
} bench;

// A random id that is not BOS or an EOS id (an EOS in a prompt would be odd, not harmful).
static uint32_t random_id(const bench *b, uint64_t *state) {
    for (;;) {
        uint32_t id = (uint32_t)(splitmix64(state) % b->n_vocab);
        int ok = 1;
        for (uint32_t i = 0; i < b->n_special; i++)
            ok &= (uint32_t)b->special[i] != id;
        if (ok)
            return id;
    }
}

// Record i of workload w: shared prefix from one stream, the rest from the record's own stream.
static tm_rc make_job(const bench *b, const workload *w, uint32_t i, tm_job **out, tm_err *err) {
    tm_job *job = tm_calloc(1, sizeof(*job));
    if (!job)
        return TM_ERR(err, TM_E_NOMEM, "bench record");
    job->prompt_ids = tm_calloc(w->prompt_tok, sizeof(uint32_t));
    char id[32];
    snprintf(id, sizeof(id), "%u", i);
    job->id_json = tm_strdup(id);
    job->file = tm_strdup(w->name);
    if (!job->prompt_ids || !job->id_json || !job->file) {
        tm_job_destroy(job);
        return TM_ERR(err, TM_E_NOMEM, "bench record");
    }
    job->seq_no = i;
    job->line = i + 1;
    job->n_prompt_ids = w->prompt_tok;
    job->ignore_eos = 1;
    uint64_t shared = b->seed * 1000003u, own = b->seed * 1000003u + 1 + i;
    for (uint32_t t = 0; t < w->prompt_tok; t++)
        job->prompt_ids[t] = random_id(b, t < w->shared_tok ? &shared : &own);
    *out = job;
    return TM_OK;
}

static uint64_t count_params(const tm_model *m) {
    uint64_t n = tm_tensor_n_elem(&m->embd) + tm_tensor_n_elem(&m->out_norm);
    if (!m->cfg.tie_embd)
        n += tm_tensor_n_elem(&m->lm_head);
    for (uint32_t l = 0; l < m->cfg.n_layer; l++) {
        const tm_layer_w *w = &m->layers[l];
        const tm_tensor *t[] = {&w->attn_norm, &w->wq,     &w->wk,   &w->wv,
                                &w->bq,        &w->bk,     &w->bv,   &w->wo,
                                &w->ffn_norm,  &w->w_gate, &w->w_up, &w->w_down};
        for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++)
            if (t[i]->data)
                n += tm_tensor_n_elem(t[i]);
    }
    return n;
}

// One workload through a fresh runner. With metrics NULL it is a warm-up: nothing is recorded.
static tm_rc run_workload(bench *b, const workload *w, tm_metrics *metrics, tm_err *err) {
    tm_queue *in = NULL, *out = NULL;
    tm_runner_stats stats = {0};
    tm_rc rc = tm_queue_create(w->n_seqs + 1, &in, err);
    if (!rc)
        rc = tm_queue_create(w->n_seqs + 1, &out, err);
    for (uint32_t i = 0; !rc && i < w->n_seqs; i++) {
        tm_job *job = NULL;
        rc = make_job(b, w, i, &job, err);
        if (!rc && tm_queue_push(in, job) != TM_OK) {
            tm_job_destroy(job);
            rc = TM_ERR(err, TM_E_INTERNAL, "bench queue");
        }
    }
    if (!rc) {
        tm_queue_close(in);
        tm_runner_cfg rcfg = {
            .max_seqs = b->eo.max_seqs,
            .max_batched_tokens = b->eo.max_batched_tokens,
            .block_size = b->eo.block_size,
            .n_kv_block = b->eo.n_kv_block,
            .n_ctx = b->model->cfg.n_ctx,
            .defaults = {.max_tokens = (int32_t)w->gen_tok,
                         .temperature = 0,
                         .top_p = 1,
                         .top_k = -1},
            .prefix_cache = 1,
            .policy = TM_SCHED_PREFIX,
            .lookahead = w->n_seqs,
        };
        rc = tm_runner_run(&rcfg, b->eng, b->tok, in, out, &stats, err);
    }
    tm_queue_close(out);
    void *item;
    uint32_t n_failed = 0;
    while (out && tm_queue_try_pop(out, &item) == TM_OK) {
        tm_completion *c = item;
        n_failed += c->err_code != TM_ERRCODE_NONE;
        if (!rc && n_failed == 1 && c->err_code != TM_ERRCODE_NONE)
            rc = TM_ERR(err, TM_E_INTERNAL, "bench %s: record %s failed: %s", w->name, c->id_json,
                        c->err_msg ? c->err_msg : "");
        if (!rc && metrics)
            rc = tm_metrics_add_record(metrics, c, err);
        tm_completion_destroy(c);
    }
    while (in && tm_queue_try_pop(in, &item) == TM_OK)
        tm_job_destroy(item);
    tm_queue_destroy(in);
    tm_queue_destroy(out);
    if (!rc && metrics)
        tm_run_metrics_add_engine(metrics, &stats, 0);
    return rc;
}

// One row of the summary table, read back from the metrics.json just written.
typedef struct bench_row {
    const workload *w;
    double prefill_tok_s, decode_tok_s, output_tok_s, ttft_p50_ms;
} bench_row;

static double num_at(const json_t *root, const char *a, const char *b, const char *c) {
    const json_t *v = json_object_get(json_object_get(root, a), b);
    if (c)
        v = json_object_get(v, c);
    return json_is_number(v) ? json_number_value(v) : -1;
}

static void read_row(const char *path, bench_row *row) {
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    row->prefill_tok_s = num_at(root, "throughput", "prefill_tok_s", NULL);
    row->decode_tok_s = num_at(root, "throughput", "decode_tok_s", NULL);
    row->output_tok_s = num_at(root, "throughput", "output_tok_s", NULL);
    row->ttft_p50_ms = num_at(root, "latency_ms", "ttft", "p50");
    json_decref(root);
}

// "%10.1f" of x, or "-" when unknown (< 0).
static const char *cell(double x, const char *fmt, char *buf, size_t n) {
    if (x < 0)
        snprintf(buf, n, "%s", "-");
    else
        snprintf(buf, n, fmt, x);
    return buf;
}

static void print_table(const bench *b, const bench_row *rows, int n, double bandwidth_gbs) {
    double weight_bytes = (double)count_params(b->model) * 2.0;
    printf("\n%-7s %-16s %12s %12s %12s %10s %10s\n", "work", "shape", "prefill t/s", "decode t/s",
           "output t/s", "TTFT p50", "% ceiling");
    for (int i = 0; i < n; i++) {
        const bench_row *r = &rows[i];
        char shape[32], c1[24], c2[24], c3[24], c4[24], c5[24];
        snprintf(shape, sizeof(shape), "%u x %u + %u", r->w->n_seqs, r->w->prompt_tok,
                 r->w->gen_tok);
        double pct = -1;
        if (bandwidth_gbs > 0 && r->w->gen_tok > 1 && r->decode_tok_s > 0 && weight_bytes > 0)
            pct = 100.0 * r->decode_tok_s / (r->w->n_seqs * bandwidth_gbs * 1e9 / weight_bytes);
        printf("%-7s %-16s %12s %12s %12s %10s %10s\n", r->w->name, shape,
               cell(r->prefill_tok_s, "%.0f", c1, sizeof(c1)),
               cell(r->w->gen_tok > 1 ? r->decode_tok_s : -1, "%.1f", c2, sizeof(c2)),
               cell(r->output_tok_s, "%.1f", c3, sizeof(c3)),
               cell(r->ttft_p50_ms, "%.1f ms", c4, sizeof(c4)),
               cell(pct, "%.1f%%", c5, sizeof(c5)));
    }
    if (bandwidth_gbs <= 0)
        printf("(%% of ceiling: give --bandwidth GB/s; tokenmill bench --help)\n");
    else
        printf("(ceiling: B x %.0f GB/s / %.2f GB of bf16 weights per decode step)\n",
               bandwidth_gbs, weight_bytes / 1e9);
}

static tm_rc measure(bench *b, const workload *w, const char *out_dir, bench_row *row,
                     tm_err *err) {
    tm_metrics *m = NULL;
    tm_rc rc = tm_metrics_create(&m, err);
    if (rc)
        return rc;
    tm_metrics_settings ms = {
        .backend = b->backend,
        .tp = 1,
        .max_seqs = b->eo.max_seqs,
        .max_batched_tokens = b->eo.max_batched_tokens,
        .block_size = b->eo.block_size,
        .kv_blocks = b->eo.n_kv_block,
        .kv_dtype = tm_engine_kv_dtype_name(b->eng),
        .prefix_cache = true,
        .threads = b->eo.n_threads,
        .model_path = b->model_path,
        .model_arch = tm_model_arch_name(b->model),
        .n_params = count_params(b->model),
    };
    tm_metrics_bench mb = {.workload = w->name,
                           .scale = b->scale,
                           .n_seqs = w->n_seqs,
                           .prompt_tokens = w->prompt_tok,
                           .gen_tokens = w->gen_tok,
                           .shared_prefix_tokens = w->shared_tok,
                           .seed = b->seed};
    rc = tm_metrics_set_settings(m, &ms, err);
    if (!rc)
        rc = tm_metrics_set_bench(m, &mb, err);
    if (!rc)
        rc = run_workload(b, w, m, err);
    tm_metrics_end(m);
    char dir[PATH_MAX], path[PATH_MAX + 16];
    snprintf(dir, sizeof(dir), "%s/%s", out_dir, w->name);
    if (!rc)
        rc = tm_fs_mkdir_p(dir, err);
    snprintf(path, sizeof(path), "%s/metrics.json", dir);
    if (!rc)
        rc = tm_metrics_write_json(m, path, err);
    tm_metrics_destroy(m);
    if (!rc) {
        printf("  %-7s %u x %5u + %3u  -> %s\n", w->name, w->n_seqs, w->prompt_tok, w->gen_tok,
               path);
        *row = (bench_row){.w = w};
        read_row(path, row);
    }
    return rc;
}

// --workloads LIST: which of the N_WL workloads to run (want[i] = 1).
static int parse_workloads(const char *list, int *want) {
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", list);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int found = 0;
        for (int i = 0; i < N_WL; i++)
            if (!strcmp(t, full_wl[i].name))
                want[i] = found = 1;
        if (!found) {
            fprintf(stderr, "tokenmill bench: unknown workload '%s' (W1, W8, P, prefix)\n", t);
            return -1;
        }
    }
    return 0;
}

static int parse_u64(const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-')
        return -1;
    *out = v;
    return 0;
}

int tm_bench_cmd(int argc, char **argv) {
    const char *model_dir = NULL, *backend = "cpu", *list = "W1,W8,P,prefix";
    const char *out_dir = "out/bench", *scale = "full";
    uint64_t threads = 0, seed = 1;
    double bandwidth = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(usage, stdout);
            return 0;
        }
        if (!v)
            bad = 1;
        else if (!strcmp(a, "--model"))
            model_dir = v;
        else if (!strcmp(a, "--backend"))
            backend = v;
        else if (!strcmp(a, "--workloads"))
            list = v;
        else if (!strcmp(a, "--out"))
            out_dir = v;
        else if (!strcmp(a, "--scale"))
            scale = v;
        else if (!strcmp(a, "--threads"))
            bad = parse_u64(v, &threads) || threads > 65536;
        else if (!strcmp(a, "--seed"))
            bad = parse_u64(v, &seed);
        else if (!strcmp(a, "--bandwidth")) {
            char *end;
            bandwidth = strtod(v, &end);
            bad = *end || end == v || !(bandwidth > 0);
        } else
            bad = 1;
        if (bad) {
            fprintf(stderr, "tokenmill bench: bad option %s%s%s\n\n%s", a, v ? " " : "", v ? v : "",
                    usage);
            return 2;
        }
        i++;
    }
    int want[N_WL] = {0};
    if (!model_dir || (strcmp(scale, "full") && strcmp(scale, "small")) ||
        parse_workloads(list, want)) {
        fputs(usage, stderr);
        return 2;
    }
    if (strcmp(backend, "cpu") && strcmp(backend, "cuda")) {
        fprintf(stderr, "tokenmill bench: --backend is cpu or cuda, not '%s'\n", backend);
        return 2;
    }
    const workload *wl = strcmp(scale, "small") ? full_wl : small_wl;

    bench b = {.backend = backend, .scale = scale, .seed = seed};
    int32_t *token_map = NULL; /* DeepSeek-V4.1 with Engram: the tokenizer's compressed map */
    tm_err err = {0};
    tm_rc rc = TM_OK;
    rc = tm_job_check_model_dir(model_dir, &err); // the same hints as run's
    if (!rc && !realpath(model_dir, b.model_path))
        rc = TM_ERR(&err, TM_E_IO, "model folder %s: %s", model_dir, strerror(errno));
    if (!rc)
        rc = tm_model_load(b.model_path, &b.model, &err);
    if (!rc)
        rc = tm_tok_load(b.model_path, &b.tok, &err);
    uint32_t need_blocks = 0;
    for (int i = 0; !rc && i < N_WL; i++) {
        if (!want[i])
            continue;
        uint32_t len = wl[i].prompt_tok + wl[i].gen_tok;
        if (len > b.model->cfg.n_ctx)
            rc = TM_ERR(&err, TM_E_INVAL,
                        "workload %s needs %u tokens per sequence; the model's context is %u",
                        wl[i].name, len, b.model->cfg.n_ctx);
        need_blocks = TM_MAX(need_blocks, wl[i].n_seqs * TM_CEIL_DIV(len, BENCH_BLOCK_SIZE));
    }
    if (!rc) {
        b.n_vocab = TM_MIN(b.model->cfg.n_vocab, tm_tok_n_vocab(b.tok));
        if (tm_tok_bos_id(b.tok) >= 0)
            b.special[b.n_special++] = tm_tok_bos_id(b.tok);
        if (tm_tok_eos_id(b.tok) >= 0)
            b.special[b.n_special++] = tm_tok_eos_id(b.tok);
        for (uint32_t i = 0; i < b.model->cfg.n_eos && b.n_special < TM_MODEL_MAX_EOS + 2; i++)
            b.special[b.n_special++] = b.model->cfg.eos_ids[i];
        const tm_job_engine je = {
            .threads = (uint32_t)threads,
            .block_size = BENCH_BLOCK_SIZE,
            // every sequence of the largest workload fits, plus the warm-up's slack
            .kv_blocks = need_blocks + BENCH_MAX_SEQS,
            .max_seqs = BENCH_MAX_SEQS,
            .max_batched_tokens = BENCH_MAX_BATCHED_TOKENS,
            .tp = 1,
        };
        b.eo = tm_job_engine_opts(&je); // as a job's engine section resolves
        const tm_dsv41 *d41 = tm_model_dsv41(b.model);
        uint32_t n_comp = 0;
        if (d41 && d41->cfg.n_engram) // the Engram compressed token map, as job_run builds it
            rc = tm_engram_map_from_tok(b.tok, &token_map, &b.eo.n_token_map, &n_comp, &err);
        b.eo.token_map = token_map;
        if (!rc && !strcmp(backend, "cuda")) // fails cleanly in a build without CUDA
            rc = tm_engine_cuda_create(b.model, &b.eo, &b.eng, &err);
        else if (!rc)
            rc = tm_engine_cpu_create(b.model, &b.eo, &b.eng, &err);
    }
    if (!rc) {
        printf("tokenmill bench: %s (%s), %s engine, %u threads, scale %s, seed %llu\n",
               b.model_path, tm_model_arch_name(b.model), backend, b.eo.n_threads, scale,
               (unsigned long long)seed);
        const workload warm = {"warm-up", 1, 16, 2, 0};
        rc = run_workload(&b, &warm, NULL, &err); // first-touch costs: weights paged in, etc.
    }
    bench_row rows[N_WL];
    int n_rows = 0;
    for (int i = 0; !rc && i < N_WL; i++)
        if (want[i] && (rc = measure(&b, &wl[i], out_dir, &rows[n_rows], &err)) == TM_OK)
            n_rows++;
    if (!rc)
        print_table(&b, rows, n_rows, bandwidth);
    tm_engine_destroy(b.eng);
    tm_free(token_map);
    tm_tok_destroy(b.tok);
    tm_model_destroy(b.model);
    if (rc) {
        fprintf(stderr, "tokenmill bench: %s\n", err.msg);
        return 1;
    }
    return 0;
}
