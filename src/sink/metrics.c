/* sink/metrics.c - accumulation and metrics.json (built with jansson: written a few times per job,
 * not per record). */
#include "sink/metrics.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/fsutil.h"
#include "sink/nvml.h"

#ifndef TM_VERSION
#define TM_VERSION "unknown"
#endif
#ifndef TM_GIT_COMMIT
#define TM_GIT_COMMIT "unknown"
#endif

enum { N_ERRCODES = TM_ERRCODE_COUNT };

typedef struct samples {
    double *v; /* [n] in arrival order */
    size_t n, cap;
} samples;

/* ITL histogram: bucket i holds values in [ITL_X0 * ITL_G^i, ITL_X0 * ITL_G^(i+1)) ms; bucket 0
 * also takes everything smaller, the last bucket everything larger (1 us .. 20 min). */
#define ITL_X0 1e-3
#define ITL_G 1.01
#define ITL_BUCKETS 2100

typedef struct hist {
    uint64_t *count; /* [ITL_BUCKETS] */
    uint64_t n;
    double sum, min, max;
} hist;

#define MAX_GPUS 16

typedef struct gpu {
    char name[128];
    uint64_t energy0_mj, energy_mj; /* counter at the start and at the latest poll */
    int have_energy;
    double power_sum_w, power_max_w;
    uint64_t n_power;
} gpu;

struct tm_metrics {
    uint64_t n_ok, n_failed;
    uint64_t n_err_by_code[N_ERRCODES];
    uint64_t n_tok_prompt, n_tok_cached, n_tok_gen;
    tm_metrics_earlier earlier; /* what earlier runs of a resumed job counted (in the totals) */
    samples ttft, e2e, tpot;    /* ms */
    hist itl;                   /* ms */
    uint64_t n_steps, n_tok_prefill, n_tok_decode, n_preempt;
    double prefill_s, decode_s, sum_step_fill, sum_running;
    tm_metrics_spec spec; /* totals; accepted_pos points to spec_pos */
    uint64_t spec_pos[TM_METRICS_SPEC_MAX_K];
    bool spec_used;
    tm_metrics_guided guided; /* structured output; valid when guided_used */
    bool guided_used;
    /* settings (owned copies) */
    tm_metrics_settings set;
    char *backend, *kv_dtype, *quantization, *model_path, *model_arch, *device;
    bool have_settings;
    char *job_path;         /* owned, or NULL */
    tm_metrics_bench bench; /* strings owned; valid when have_bench */
    bool have_bench;
    tm_nvml *nvml; /* NULL without NVML */
    gpu gpus[MAX_GPUS];
    uint32_t n_gpu;
    char driver[96];
    double last_poll_ms;
    /* host and time */
    char hostname[256];
    char cpu_model[256];
    long n_cpus;
    char start_utc[32], end_utc[32];
    double start_ms, end_ms;
    double start_unix_s, end_unix_s;
    bool ended;
    tm_metrics_durability dur;
    bool have_dur;
    json_t *kafka; /* tm_metrics_set_kafka's section, or NULL */
};

static void read_cpu_model(char *out, size_t n) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    out[0] = '\0';
    while (f && fgets(line, sizeof(line), f)) {
        // x86: "model name"; some ARM kernels: "Hardware" or "cpu model"
        if (strncmp(line, "model name", 10) && strncmp(line, "Hardware", 8) &&
            strncmp(line, "cpu model", 9))
            continue;
        const char *colon = strchr(line, ':');
        if (!colon)
            continue;
        colon++;
        while (*colon == ' ' || *colon == '\t')
            colon++;
        snprintf(out, n, "%s", colon);
        out[strcspn(out, "\n")] = '\0';
        break;
    }
    if (f)
        fclose(f);
    if (!out[0]) {
        struct utsname u;
        snprintf(out, n, "%s", uname(&u) == 0 ? u.machine : "unknown");
    }
}

static double unix_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

tm_rc tm_metrics_create(tm_metrics **out, tm_err *err) {
    tm_metrics *m = tm_calloc(1, sizeof(*m));
    if (!m)
        return TM_ERR(err, TM_E_NOMEM, "metrics");
    if (gethostname(m->hostname, sizeof(m->hostname) - 1) != 0)
        snprintf(m->hostname, sizeof(m->hostname), "unknown");
    read_cpu_model(m->cpu_model, sizeof(m->cpu_model));
    m->n_cpus = sysconf(_SC_NPROCESSORS_ONLN);
    m->itl.count = tm_calloc(ITL_BUCKETS, sizeof(*m->itl.count));
    if (!m->itl.count) {
        tm_metrics_destroy(m);
        return TM_ERR(err, TM_E_NOMEM, "metrics ITL histogram");
    }
    m->nvml = tm_nvml_open();
    m->n_gpu = TM_MIN(tm_nvml_count(m->nvml), (uint32_t)MAX_GPUS);
    tm_nvml_driver(m->nvml, m->driver, sizeof(m->driver));
    for (uint32_t i = 0; i < m->n_gpu; i++) {
        gpu *g = &m->gpus[i];
        tm_nvml_name(m->nvml, i, g->name, sizeof(g->name));
        g->have_energy = tm_nvml_energy_mj(m->nvml, i, &g->energy0_mj) == 0;
        g->energy_mj = g->energy0_mj;
    }
    tm_utc_now_str(m->start_utc, sizeof(m->start_utc));
    m->start_unix_s = unix_now_s();
    m->start_ms = tm_now_ms();
    m->last_poll_ms = m->start_ms;
    *out = m;
    return TM_OK;
}

static void free_settings(tm_metrics *m) {
    tm_free(m->backend);
    tm_free(m->kv_dtype);
    tm_free(m->quantization);
    tm_free(m->model_path);
    tm_free(m->model_arch);
    tm_free(m->device);
    m->backend = m->kv_dtype = m->quantization = m->model_path = m->model_arch = m->device = NULL;
}

void tm_metrics_destroy(tm_metrics *m) {
    if (!m)
        return;
    free_settings(m);
    tm_free(m->job_path);
    tm_free((char *)m->bench.workload);
    tm_free((char *)m->bench.scale);
    tm_nvml_close(m->nvml);
    tm_free(m->itl.count);
    tm_free(m->ttft.v);
    tm_free(m->e2e.v);
    tm_free(m->tpot.v);
    json_decref(m->kafka);
    tm_free(m);
}

// Copy of s, or NULL for NULL/"" (*nomem set on allocation failure).
static char *opt_dup(const char *s, int *nomem) {
    if (!s || !s[0])
        return NULL;
    char *d = tm_strdup(s);
    if (!d)
        *nomem = 1;
    return d;
}

tm_rc tm_metrics_set_settings(tm_metrics *m, const tm_metrics_settings *s, tm_err *err) {
    free_settings(m);
    int nomem = 0;
    m->set = *s;
    m->backend = opt_dup(s->backend, &nomem);
    m->kv_dtype = opt_dup(s->kv_dtype, &nomem);
    m->quantization = opt_dup(s->quantization, &nomem);
    m->model_path = opt_dup(s->model_path, &nomem);
    m->model_arch = opt_dup(s->model_arch, &nomem);
    m->device = opt_dup(s->device, &nomem);
    // The struct copy's pointers are the caller's; never use them after this call.
    m->set.backend = m->set.kv_dtype = m->set.quantization = m->set.model_path = m->set.model_arch =
        m->set.device = NULL;
    m->have_settings = true;
    if (nomem) {
        free_settings(m);
        return TM_ERR(err, TM_E_NOMEM, "metrics settings");
    }
    return TM_OK;
}

tm_rc tm_metrics_set_job(tm_metrics *m, const char *job_path, tm_err *err) {
    int nomem = 0;
    char *p = opt_dup(job_path, &nomem);
    if (nomem)
        return TM_ERR(err, TM_E_NOMEM, "metrics job path");
    tm_free(m->job_path);
    m->job_path = p;
    return TM_OK;
}

tm_rc tm_metrics_set_bench(tm_metrics *m, const tm_metrics_bench *b, tm_err *err) {
    int nomem = 0;
    char *workload = opt_dup(b ? b->workload : NULL, &nomem);
    char *scale = opt_dup(b ? b->scale : NULL, &nomem);
    if (nomem) {
        tm_free(workload);
        tm_free(scale);
        return TM_ERR(err, TM_E_NOMEM, "metrics bench");
    }
    tm_free((char *)m->bench.workload);
    tm_free((char *)m->bench.scale);
    m->have_bench = b != NULL;
    m->bench = b ? *b : (tm_metrics_bench){0};
    m->bench.workload = workload;
    m->bench.scale = scale;
    return TM_OK;
}

static void hist_add(hist *h, double v) {
    int i = 0;
    if (v > ITL_X0)
        i = (int)(log(v / ITL_X0) / log(ITL_G));
    i = TM_MAX(0, TM_MIN(i, ITL_BUCKETS - 1));
    h->count[i]++;
    h->min = h->n ? fmin(h->min, v) : v;
    h->max = h->n ? fmax(h->max, v) : v;
    h->n++;
    h->sum += v;
}

// Value of the sample of 0-based rank k: the geometric middle of its bucket, kept within the
// observed [min, max].
static double hist_rank(const hist *h, uint64_t k) {
    uint64_t seen = 0;
    int i = 0;
    for (; i < ITL_BUCKETS - 1; i++) {
        seen += h->count[i];
        if (seen > k)
            break;
    }
    double mid = ITL_X0 * pow(ITL_G, i + 0.5);
    return fmin(fmax(mid, h->min), h->max);
}

// Percentile with the same rank interpolation as tm_metrics_percentile.
static double hist_percentile(const hist *h, double p) {
    if (h->n == 0)
        return NAN;
    double pos = p / 100.0 * (double)(h->n - 1);
    uint64_t lo = (uint64_t)pos;
    double a = hist_rank(h, lo);
    if (lo + 1 >= h->n)
        return a;
    return a + (hist_rank(h, lo + 1) - a) * (pos - (double)lo);
}

static tm_rc push(samples *s, double v, tm_err *err) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 1024;
        double *nv = tm_realloc(s->v, cap * sizeof(*nv));
        if (!nv)
            return TM_ERR(err, TM_E_NOMEM, "metrics samples (%zu)", cap);
        s->v = nv;
        s->cap = cap;
    }
    s->v[s->n++] = v;
    return TM_OK;
}

void tm_metrics_add_earlier(tm_metrics *m, const tm_metrics_earlier *e) {
    m->earlier.n_ok += e->n_ok;
    m->earlier.n_failed += e->n_failed;
    m->earlier.n_tok_prompt += e->n_tok_prompt;
    m->earlier.n_tok_cached += e->n_tok_cached;
    m->earlier.n_tok_gen += e->n_tok_gen;
    m->n_ok += e->n_ok;
    m->n_failed += e->n_failed;
    for (int i = 0; e->n_err_by_code && i < N_ERRCODES; i++)
        m->n_err_by_code[i] += e->n_err_by_code[i];
    m->n_tok_prompt += e->n_tok_prompt;
    m->n_tok_cached += e->n_tok_cached;
    m->n_tok_gen += e->n_tok_gen;
}

static json_t *int_or_null(int64_t v) { return v >= 0 ? json_integer((json_int_t)v) : json_null(); }

tm_rc tm_metrics_set_kafka(tm_metrics *m, const tm_metrics_kafka *k, tm_err *err) {
    json_t *parts = json_array();
    int64_t lag = -1;
    for (size_t i = 0; parts && i < k->n_parts; i++) {
        const tm_metrics_kpart *p = &k->parts[i];
        if (p->lag >= 0)
            lag = (lag < 0 ? 0 : lag) + p->lag;
        if (json_array_append_new(
                parts, json_pack("{s:s, s:i, s:o, s:o, s:o, s:o}", "topic", p->topic, "partition",
                                 (int)p->partition, "committed", int_or_null(p->committed),
                                 "position", int_or_null(p->position), "high_watermark",
                                 int_or_null(p->high), "lag", int_or_null(p->lag))) != 0) {
            json_decref(parts);
            parts = NULL;
        }
    }
    json_t *o = parts ? json_pack("{s:o, s:o, s:I, s:I, s:I, s:I, s:I, s:I}", "partitions", parts,
                                  "lag_total", int_or_null(lag), "tombstones",
                                  (json_int_t)k->tombstones, "empty_values", (json_int_t)k->empty,
                                  "done_before", (json_int_t)k->done_before, "released",
                                  (json_int_t)k->released, "commits", (json_int_t)k->commits,
                                  "errors", (json_int_t)k->errors)
                      : NULL;
    if (!o)
        return TM_ERR(err, TM_E_NOMEM, "metrics kafka");
    json_decref(m->kafka);
    m->kafka = o;
    return TM_OK;
}

void tm_metrics_set_durability(tm_metrics *m, const tm_metrics_durability *d) {
    m->dur = *d;
    m->have_dur = true;
}

tm_rc tm_metrics_add_record(tm_metrics *m, const tm_completion *c, tm_err *err) {
    if (c->err_code != TM_ERRCODE_NONE) {
        m->n_failed++;
        if ((unsigned)c->err_code < N_ERRCODES)
            m->n_err_by_code[c->err_code]++;
        return TM_OK;
    }
    m->n_ok++;
    m->n_tok_prompt += c->n_tok_prompt;
    m->n_tok_cached += c->n_tok_cached;
    m->n_tok_gen += c->n_tok_gen;
    tm_rc rc = push(&m->ttft, c->ttft_ms, err);
    if (!rc)
        rc = push(&m->e2e, c->total_ms, err);
    if (!rc && c->n_tok_gen >= 2)
        rc = push(&m->tpot, (c->total_ms - c->ttft_ms) / (double)(c->n_tok_gen - 1), err);
    for (uint32_t i = 0; !rc && i < c->n_itl; i++)
        hist_add(&m->itl, c->itl_ms[i]);
    return rc;
}

void tm_metrics_add_engine(tm_metrics *m, const tm_metrics_engine *e) {
    m->n_steps += e->steps;
    m->n_tok_prefill += e->n_tok_prefill;
    m->prefill_s += e->prefill_s;
    m->n_tok_decode += e->n_tok_decode;
    m->decode_s += e->decode_s;
    m->n_preempt += e->preemptions;
    m->sum_step_fill += e->sum_step_fill;
    m->sum_running += e->sum_running;
}

void tm_metrics_add_spec(tm_metrics *m, const tm_metrics_spec *s) {
    TM_ASSERT(s->k <= TM_METRICS_SPEC_MAX_K);
    m->spec_used = true;
    m->spec.method = s->method;
    m->spec.k = s->k;
    m->spec.n_drafts += s->n_drafts;
    m->spec.n_draft_tok += s->n_draft_tok;
    m->spec.n_accepted += s->n_accepted;
    for (uint32_t i = 0; i < s->k && s->accepted_pos; i++)
        m->spec_pos[i] += s->accepted_pos[i];
}

void tm_metrics_add_guided(tm_metrics *m, const tm_metrics_guided *g) {
    m->guided_used = true;
    m->guided.records += g->records;
    m->guided.compiled += g->compiled;
    m->guided.masks += g->masks;
    m->guided.masks_cold += g->masks_cold;
    m->guided.mask_s += g->mask_s;
    m->guided.compile_s += g->compile_s;
    m->guided.unfinished += g->unfinished;
}

static void poll_gpus(tm_metrics *m, double now_ms) {
    m->last_poll_ms = now_ms;
    for (uint32_t i = 0; i < m->n_gpu; i++) {
        gpu *g = &m->gpus[i];
        uint32_t mw;
        if (tm_nvml_power_mw(m->nvml, i, &mw) == 0) {
            g->power_sum_w += mw / 1e3;
            g->power_max_w = fmax(g->power_max_w, mw / 1e3);
            g->n_power++;
        }
        uint64_t mj;
        if (g->have_energy && tm_nvml_energy_mj(m->nvml, i, &mj) == 0)
            g->energy_mj = mj;
    }
}

void tm_metrics_poll_gpus(tm_metrics *m) {
    double now = tm_now_ms();
    if (m->n_gpu && now - m->last_poll_ms >= 1000)
        poll_gpus(m, now);
}

void tm_metrics_end(tm_metrics *m) {
    tm_utc_now_str(m->end_utc, sizeof(m->end_utc));
    m->end_ms = tm_now_ms();
    m->end_unix_s = unix_now_s();
    if (m->n_gpu)
        poll_gpus(m, m->end_ms);
    m->ended = true;
}

double tm_metrics_percentile(const double *sorted, size_t n, double p) {
    if (n == 0)
        return NAN;
    double pos = p / 100.0 * (double)(n - 1);
    if (pos <= 0)
        return sorted[0];
    if (pos >= (double)(n - 1))
        return sorted[n - 1];
    size_t lo = (size_t)pos;
    double frac = pos - (double)lo;
    return sorted[lo] + (sorted[lo + 1] - sorted[lo]) * frac;
}

// ---- JSON ----

static json_t *num_or_null(double x) { return isfinite(x) ? json_real(x) : json_null(); }
static json_t *str_or_null(const char *s) { return s ? json_string(s) : json_null(); }
static double ratio(double a, double b) { return b > 0 ? a / b : NAN; }

// metrics.json's speculative block (vLLM's names): totals, acceptance rate, mean acceptance
// length 1 + accepted / drafts (tokens per verification step), and per draft position the
// accepted count and its rate over the drafts. NULL on allocation failure.
static json_t *spec_json(const tm_metrics *m) {
    const tm_metrics_spec *s = &m->spec;
    json_t *pos = json_array(), *rate = json_array();
    for (uint32_t i = 0; pos && rate && i < s->k; i++)
        if (json_array_append_new(pos, json_integer((json_int_t)m->spec_pos[i])) ||
            json_array_append_new(
                rate, num_or_null(ratio((double)m->spec_pos[i], (double)s->n_drafts)))) {
            json_decref(pos);
            pos = NULL;
        }
    if (!pos || !rate) {
        json_decref(pos);
        json_decref(rate);
        return NULL;
    }
    return json_pack(
        "{s:s, s:i, s:I, s:I, s:I, s:o, s:o, s:o, s:o}", "method", s->method ? s->method : "ngram",
        "num_speculative_tokens", (int)s->k, "num_drafts", (json_int_t)s->n_drafts,
        "num_draft_tokens", (json_int_t)s->n_draft_tok, "num_accepted_tokens",
        (json_int_t)s->n_accepted, "acceptance_rate",
        num_or_null(ratio((double)s->n_accepted, (double)s->n_draft_tok)), "mean_acceptance_length",
        s->n_drafts ? json_real(1.0 + (double)s->n_accepted / (double)s->n_drafts) : json_null(),
        "num_accepted_tokens_per_pos", pos, "acceptance_rate_per_pos", rate);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// {"n", "mean", "p50", "p90", "p99", "max"} of s (sorted in a scratch copy); NULL on NOMEM.
static json_t *summary(const samples *s) {
    double *v = tm_malloc((s->n ? s->n : 1) * sizeof(*v));
    if (!v)
        return NULL;
    if (s->n)
        memcpy(v, s->v, s->n * sizeof(*v));
    qsort(v, s->n, sizeof(*v), cmp_double);
    double sum = 0;
    for (size_t i = 0; i < s->n; i++)
        sum += v[i];
    json_t *o = json_pack("{s:I, s:o, s:o, s:o, s:o, s:o}", "n", (json_int_t)s->n, "mean",
                          num_or_null(s->n ? sum / (double)s->n : NAN), "p50",
                          num_or_null(tm_metrics_percentile(v, s->n, 50)), "p90",
                          num_or_null(tm_metrics_percentile(v, s->n, 90)), "p99",
                          num_or_null(tm_metrics_percentile(v, s->n, 99)), "max",
                          num_or_null(s->n ? v[s->n - 1] : NAN));
    tm_free(v);
    return o;
}

static json_t *hist_summary(const hist *h) {
    return json_pack("{s:I, s:o, s:o, s:o, s:o, s:o}", "n", (json_int_t)h->n, "mean",
                     num_or_null(h->n ? h->sum / (double)h->n : NAN), "p50",
                     num_or_null(hist_percentile(h, 50)), "p90",
                     num_or_null(hist_percentile(h, 90)), "p99",
                     num_or_null(hist_percentile(h, 99)), "max", num_or_null(h->n ? h->max : NAN));
}

// host.gpus: null without NVML, else the devices with their power over the job so far.
static json_t *gpus_json(const tm_metrics *m, double wall_s) {
    if (m->n_gpu == 0)
        return json_null();
    json_t *devs = json_array();
    for (uint32_t i = 0; devs && i < m->n_gpu; i++) {
        const gpu *g = &m->gpus[i];
        double energy_j = g->have_energy ? (double)(g->energy_mj - g->energy0_mj) / 1e3 : NAN;
        // Mean power: energy over the job when the counter exists (exact), else sampled.
        double mean_w = g->have_energy && wall_s > 0 ? energy_j / wall_s
                        : g->n_power                 ? g->power_sum_w / (double)g->n_power
                                                     : NAN;
        json_t *d = json_pack("{s:i, s:o, s:o, s:o, s:o, s:I}", "index", (int)i, "name",
                              str_or_null(g->name[0] ? g->name : NULL), "power_w_mean",
                              num_or_null(mean_w), "power_w_max",
                              num_or_null(g->n_power ? g->power_max_w : NAN), "energy_j",
                              num_or_null(energy_j), "power_samples", (json_int_t)g->n_power);
        if (!d || json_array_append_new(devs, d) != 0) {
            json_decref(devs);
            devs = NULL;
        }
    }
    return json_pack("{s:i, s:o, s:o, s:o}", "count", (int)m->n_gpu, "name",
                     str_or_null(m->gpus[0].name[0] ? m->gpus[0].name : NULL), "driver",
                     str_or_null(m->driver[0] ? m->driver : NULL), "devices", devs);
}

static json_t *build_json(const tm_metrics *m) {
    char now_utc[32];
    double end_ms = m->ended ? m->end_ms : tm_now_ms();
    if (!m->ended)
        tm_utc_now_str(now_utc, sizeof(now_utc));
    double wall_s = (end_ms - m->start_ms) / 1000.0;
    uint64_t n_in = m->n_ok + m->n_failed;
    // This run's share: the totals (records, tokens) are the whole job's, earlier runs of a
    // resumed job included; the rates over this run's wall time count this run's work only.
    const tm_metrics_earlier *e = &m->earlier;
    uint64_t run_in = n_in - (e->n_ok + e->n_failed), run_gen = m->n_tok_gen - e->n_tok_gen;

    json_t *by_code = json_object();
    for (int i = 1; by_code && i < N_ERRCODES; i++)
        if (m->n_err_by_code[i] &&
            json_object_set_new(by_code, tm_errcode_name((tm_errcode)i),
                                json_integer((json_int_t)m->n_err_by_code[i])) != 0) {
            json_decref(by_code);
            by_code = NULL;
        }
    json_t *spec = m->spec_used ? spec_json(m) : json_null();
    json_t *settings = json_null();
    if (m->have_settings)
        settings =
            json_pack("{s:o, s:i, s:i, s:i, s:i, s:o, s:o, s:o, s:b, s:i}", "backend",
                      str_or_null(m->backend), "tp", (int)m->set.tp, "max_seqs",
                      (int)m->set.max_seqs, "max_batched_tokens", (int)m->set.max_batched_tokens,
                      "block_size", (int)m->set.block_size, "kv_blocks",
                      m->set.kv_blocks ? json_integer(m->set.kv_blocks) : json_null(), "kv_dtype",
                      str_or_null(m->kv_dtype), "quantization", str_or_null(m->quantization),
                      "prefix_cache", (int)m->set.prefix_cache, "threads", (int)m->set.threads);
    json_t *bench = json_null();
    if (m->have_bench)
        bench = json_pack("{s:o, s:o, s:i, s:i, s:i, s:i, s:I}", "workload",
                          str_or_null(m->bench.workload), "scale", str_or_null(m->bench.scale),
                          "seqs", (int)m->bench.n_seqs, "prompt_tokens",
                          (int)m->bench.prompt_tokens, "gen_tokens", (int)m->bench.gen_tokens,
                          "shared_prefix_tokens", (int)m->bench.shared_prefix_tokens, "seed",
                          (json_int_t)m->bench.seed);
    json_t *model = json_pack(
        "{s:o, s:o, s:o}", "path", str_or_null(m->model_path), "arch", str_or_null(m->model_arch),
        "n_params", m->set.n_params ? json_integer((json_int_t)m->set.n_params) : json_null());

    // json_pack's "o" steals the reference, also on failure; a NULL argument fails the pack.
    return json_pack(
        "{s:i, s:{s:s, s:s}, s:o, s:o, s:{s:s, s:s, s:f, s:f, s:f, s:b},"
        " s:{s:I, s:I, s:I, s:o}, s:{s:I, s:I, s:I, s:o},"
        " s:{s:o, s:o, s:o, s:o}, s:{s:I, s:I, s:f, s:I, s:f, s:I, s:o, s:o},"
        " s:{s:o, s:o, s:o, s:o}, s:o, s:o, s:o, s:{s:s, s:s, s:I, s:o, s:o}}",
        "schema_version", TM_METRICS_SCHEMA_VERSION, "tokenmill", "version", TM_VERSION,
        "git_commit", TM_GIT_COMMIT, "job", str_or_null(m->job_path), "bench", bench, "time",
        "start_utc", m->start_utc, "end_utc", m->ended ? m->end_utc : now_utc, "start_unix_s",
        m->start_unix_s, "end_unix_s", m->ended ? m->end_unix_s : unix_now_s(), "wall_s", wall_s,
        "finished", (int)m->ended, "records", "in", (json_int_t)n_in, "ok", (json_int_t)m->n_ok,
        "failed", (json_int_t)m->n_failed, "errors_by_code", by_code, "tokens", "prompt",
        (json_int_t)m->n_tok_prompt, "cached", (json_int_t)m->n_tok_cached, "completion",
        (json_int_t)m->n_tok_gen, "prefix_cache_hit_rate",
        num_or_null(ratio((double)m->n_tok_cached, (double)m->n_tok_prompt)), "throughput",
        "prefill_tok_s", num_or_null(ratio((double)m->n_tok_prefill, m->prefill_s)), "decode_tok_s",
        num_or_null(ratio((double)m->n_tok_decode, m->decode_s)), "output_tok_s",
        num_or_null(ratio((double)run_gen, wall_s)), "records_per_s",
        num_or_null(ratio((double)run_in, wall_s)), "engine", "steps", (json_int_t)m->n_steps,
        "prefill_tokens", (json_int_t)m->n_tok_prefill, "prefill_s", m->prefill_s, "decode_tokens",
        (json_int_t)m->n_tok_decode, "decode_s", m->decode_s, "preemptions",
        (json_int_t)m->n_preempt, "mean_step_fill",
        num_or_null(ratio(m->sum_step_fill, (double)m->n_steps)), "mean_running_seqs",
        num_or_null(ratio(m->sum_running, (double)m->n_steps)), "latency_ms", "ttft",
        summary(&m->ttft), "e2e", summary(&m->e2e), "tpot", summary(&m->tpot), "itl",
        hist_summary(&m->itl), "speculative", spec, "settings", settings, "model", model, "host",
        "hostname", m->hostname, "cpu_model", m->cpu_model, "n_cpus", (json_int_t)m->n_cpus,
        "device", str_or_null(m->device), "gpus", gpus_json(m, wall_s));
}

// metrics.json's "this_run": this run's records and tokens (the top-level ones are the job's).
static json_t *this_run_json(const tm_metrics *m) {
    const tm_metrics_earlier *e = &m->earlier;
    uint64_t ok = m->n_ok - e->n_ok, failed = m->n_failed - e->n_failed;
    return json_pack("{s:{s:I, s:I, s:I}, s:{s:I, s:I, s:I}, s:b}", "records", "in",
                     (json_int_t)(ok + failed), "ok", (json_int_t)ok, "failed", (json_int_t)failed,
                     "tokens", "prompt", (json_int_t)(m->n_tok_prompt - e->n_tok_prompt), "cached",
                     (json_int_t)(m->n_tok_cached - e->n_tok_cached), "completion",
                     (json_int_t)(m->n_tok_gen - e->n_tok_gen), "resumed",
                     e->n_ok + e->n_failed > 0);
}

tm_rc tm_metrics_write_json(const tm_metrics *m, const char *path, tm_err *err) {
    json_t *root = build_json(m);
    if (root && json_object_set_new(root, "this_run", this_run_json(m)) != 0) {
        json_decref(root);
        root = NULL;
    }
    if (root && m->kafka && json_object_set(root, "kafka", m->kafka) != 0) {
        json_decref(root);
        root = NULL;
    }
    if (root && m->have_dur &&
        json_object_set_new(
            root, "durability",
            json_pack("{s:I, s:I, s:f, s:f, s:i, s:I, s:I}", "commits", (json_int_t)m->dur.commits,
                      "commits_total", (json_int_t)m->dur.commits_total, "commit_ms_total",
                      m->dur.commit_ms_total, "commit_ms_max", m->dur.commit_ms_max, "runs",
                      (int)m->dur.runs, "resumed_records", (json_int_t)m->dur.resumed_records,
                      "cut_bytes", (json_int_t)m->dur.cut_bytes)) != 0) {
        json_decref(root);
        root = NULL;
    }
    const tm_metrics_guided *g = &m->guided;
    if (root && m->guided_used &&
        json_object_set_new(
            root, "guided",
            json_pack("{s:I, s:I, s:I, s:I, s:f, s:o, s:f, s:I}", "records", (json_int_t)g->records,
                      "compiled", (json_int_t)g->compiled, "masks", (json_int_t)g->masks,
                      "masks_cold", (json_int_t)g->masks_cold, "mask_s", g->mask_s,
                      "mask_us_per_token", num_or_null(ratio(g->mask_s * 1e6, (double)g->masks)),
                      "compile_s", g->compile_s, "unfinished", (json_int_t)g->unfinished)) != 0) {
        json_decref(root);
        root = NULL;
    }
    if (!root)
        return TM_ERR(err, TM_E_NOMEM, "metrics JSON");
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_REAL_PRECISION(12));
    json_decref(root);
    if (!text)
        return TM_ERR(err, TM_E_NOMEM, "metrics JSON text");
    // Durable, not hooked: the crash tests' one point here leaves metrics.json old or new.
    const char *parts[] = {text, "\n"}; // end the file with a newline
    tm_rc rc = tm_fs_replace(path, parts, 2,
                             &(tm_fs_replace_opts){
                                 .mode = 0666,
                                 .durable = true,
                                 .hooks = TM_FS_HOOKS_OFF,
                                 .point_before_rename = "metrics_before_rename",
                             },
                             err);
    free(text); // jansson's allocation
    return rc;
}
