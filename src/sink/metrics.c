/* sink/metrics.c - accumulation and metrics.json (built with jansson: written a few times per job,
 * not per record). */
#include "sink/metrics.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/clock.h"

#ifndef TM_VERSION
#define TM_VERSION "unknown"
#endif
#ifndef TM_GIT_COMMIT
#define TM_GIT_COMMIT "unknown"
#endif

enum { N_ERRCODES = TM_ERRCODE_ENGINE_ERROR + 1 };

typedef struct samples {
    double *v; /* [n] in arrival order */
    size_t n, cap;
} samples;

struct tm_metrics {
    uint64_t n_ok, n_failed;
    uint64_t n_err_by_code[N_ERRCODES];
    uint64_t n_tok_prompt, n_tok_cached, n_tok_gen;
    samples ttft, e2e, tpot; /* ms */
    uint64_t n_steps, n_tok_prefill, n_tok_decode, n_preempt;
    double prefill_s, decode_s, sum_step_fill, sum_running;
    uint64_t n_spec_proposed, n_spec_accepted;
    bool spec_used;
    /* settings (owned copies) */
    tm_metrics_settings set;
    char *backend, *kv_dtype, *model_path, *model_arch, *device;
    bool have_settings;
    /* host and time */
    char hostname[256];
    char cpu_model[256];
    long n_cpus;
    char start_utc[32], end_utc[32];
    double start_ms, end_ms;
    bool ended;
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

tm_rc tm_metrics_create(tm_metrics **out, tm_err *err) {
    tm_metrics *m = tm_calloc(1, sizeof(*m));
    if (!m)
        return TM_ERR(err, TM_E_NOMEM, "metrics");
    if (gethostname(m->hostname, sizeof(m->hostname) - 1) != 0)
        snprintf(m->hostname, sizeof(m->hostname), "unknown");
    read_cpu_model(m->cpu_model, sizeof(m->cpu_model));
    m->n_cpus = sysconf(_SC_NPROCESSORS_ONLN);
    tm_utc_now_str(m->start_utc, sizeof(m->start_utc));
    m->start_ms = tm_now_ms();
    *out = m;
    return TM_OK;
}

static void free_settings(tm_metrics *m) {
    tm_free(m->backend);
    tm_free(m->kv_dtype);
    tm_free(m->model_path);
    tm_free(m->model_arch);
    tm_free(m->device);
    m->backend = m->kv_dtype = m->model_path = m->model_arch = m->device = NULL;
}

void tm_metrics_destroy(tm_metrics *m) {
    if (!m)
        return;
    free_settings(m);
    tm_free(m->ttft.v);
    tm_free(m->e2e.v);
    tm_free(m->tpot.v);
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
    m->model_path = opt_dup(s->model_path, &nomem);
    m->model_arch = opt_dup(s->model_arch, &nomem);
    m->device = opt_dup(s->device, &nomem);
    // The struct copy's pointers are the caller's; never use them after this call.
    m->set.backend = m->set.kv_dtype = m->set.model_path = m->set.model_arch = m->set.device = NULL;
    m->have_settings = true;
    if (nomem) {
        free_settings(m);
        return TM_ERR(err, TM_E_NOMEM, "metrics settings");
    }
    return TM_OK;
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

void tm_metrics_add_spec(tm_metrics *m, uint64_t n_proposed, uint64_t n_accepted) {
    m->spec_used = true;
    m->n_spec_proposed += n_proposed;
    m->n_spec_accepted += n_accepted;
}

void tm_metrics_end(tm_metrics *m) {
    tm_utc_now_str(m->end_utc, sizeof(m->end_utc));
    m->end_ms = tm_now_ms();
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

static json_t *build_json(const tm_metrics *m) {
    char now_utc[32];
    double end_ms = m->ended ? m->end_ms : tm_now_ms();
    if (!m->ended)
        tm_utc_now_str(now_utc, sizeof(now_utc));
    double wall_s = (end_ms - m->start_ms) / 1000.0;
    uint64_t n_in = m->n_ok + m->n_failed;

    json_t *by_code = json_object();
    for (int i = 1; by_code && i < N_ERRCODES; i++)
        if (m->n_err_by_code[i] &&
            json_object_set_new(by_code, tm_errcode_name((tm_errcode)i),
                                json_integer((json_int_t)m->n_err_by_code[i])) != 0) {
            json_decref(by_code);
            by_code = NULL;
        }
    json_t *spec = json_null();
    if (m->spec_used)
        spec = json_pack("{s:I, s:I, s:o}", "proposed", (json_int_t)m->n_spec_proposed,
                         "accepted", (json_int_t)m->n_spec_accepted, "acceptance_rate",
                         num_or_null(ratio((double)m->n_spec_accepted,
                                           (double)m->n_spec_proposed)));
    json_t *settings = json_null();
    if (m->have_settings)
        settings = json_pack(
            "{s:o, s:i, s:i, s:i, s:i, s:o, s:o, s:b, s:i}", "backend", str_or_null(m->backend),
            "tp", (int)m->set.tp, "max_seqs", (int)m->set.max_seqs, "max_batched_tokens",
            (int)m->set.max_batched_tokens, "block_size", (int)m->set.block_size, "kv_blocks",
            m->set.kv_blocks ? json_integer(m->set.kv_blocks) : json_null(), "kv_dtype",
            str_or_null(m->kv_dtype), "prefix_cache", (int)m->set.prefix_cache, "threads",
            (int)m->set.threads);
    json_t *model = json_pack(
        "{s:o, s:o, s:o}", "path", str_or_null(m->model_path), "arch", str_or_null(m->model_arch),
        "n_params", m->set.n_params ? json_integer((json_int_t)m->set.n_params) : json_null());

    // json_pack's "o" steals the reference, also on failure; a NULL argument fails the pack.
    return json_pack(
        "{s:i, s:{s:s, s:s}, s:{s:s, s:s, s:f, s:b},"
        " s:{s:I, s:I, s:I, s:o}, s:{s:I, s:I, s:I, s:o},"
        " s:{s:o, s:o, s:o, s:o}, s:{s:I, s:I, s:f, s:I, s:f, s:I, s:o, s:o},"
        " s:{s:o, s:o, s:o}, s:o, s:o, s:o, s:{s:s, s:s, s:I, s:o}}",
        "schema_version", TM_METRICS_SCHEMA_VERSION,
        "tokenmill", "version", TM_VERSION, "git_commit", TM_GIT_COMMIT,
        "time", "start_utc", m->start_utc, "end_utc", m->ended ? m->end_utc : now_utc, "wall_s",
        wall_s, "finished", (int)m->ended,
        "records", "in", (json_int_t)n_in, "ok", (json_int_t)m->n_ok, "failed",
        (json_int_t)m->n_failed, "errors_by_code", by_code,
        "tokens", "prompt", (json_int_t)m->n_tok_prompt, "cached", (json_int_t)m->n_tok_cached,
        "completion", (json_int_t)m->n_tok_gen, "prefix_cache_hit_rate",
        num_or_null(ratio((double)m->n_tok_cached, (double)m->n_tok_prompt)),
        "throughput", "prefill_tok_s", num_or_null(ratio((double)m->n_tok_prefill, m->prefill_s)),
        "decode_tok_s", num_or_null(ratio((double)m->n_tok_decode, m->decode_s)), "output_tok_s",
        num_or_null(ratio((double)m->n_tok_gen, wall_s)), "records_per_s",
        num_or_null(ratio((double)n_in, wall_s)),
        "engine", "steps", (json_int_t)m->n_steps, "prefill_tokens",
        (json_int_t)m->n_tok_prefill, "prefill_s", m->prefill_s, "decode_tokens",
        (json_int_t)m->n_tok_decode, "decode_s", m->decode_s, "preemptions",
        (json_int_t)m->n_preempt, "mean_step_fill",
        num_or_null(ratio(m->sum_step_fill, (double)m->n_steps)), "mean_running_seqs",
        num_or_null(ratio(m->sum_running, (double)m->n_steps)),
        "latency_ms", "ttft", summary(&m->ttft), "e2e", summary(&m->e2e), "tpot",
        summary(&m->tpot),
        "speculative", spec, "settings", settings, "model", model,
        "host", "hostname", m->hostname, "cpu_model", m->cpu_model, "n_cpus",
        (json_int_t)m->n_cpus, "device", str_or_null(m->device));
}

static tm_rc write_file_atomic(const char *path, const char *text, tm_err *err) {
    size_t np = strlen(path);
    char *tmp = tm_malloc(np + 5);
    if (!tmp)
        return TM_ERR(err, TM_E_NOMEM, "metrics path");
    memcpy(tmp, path, np);
    memcpy(tmp + np, ".tmp", 5);
    tm_rc rc = TM_OK;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0) {
        rc = TM_ERR(err, TM_E_IO, "opening %s: %s", tmp, strerror(errno));
        goto done;
    }
    size_t n = strlen(text), off = 0;
    while (off < n && !rc) {
        ssize_t w = write(fd, text + off, n - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            rc = TM_ERR(err, TM_E_IO, "writing %s: %s", tmp, strerror(errno));
        else
            off += (size_t)w;
    }
    if (!rc && fsync(fd) != 0)
        rc = TM_ERR(err, TM_E_IO, "fsync %s: %s", tmp, strerror(errno));
    if (close(fd) != 0 && !rc)
        rc = TM_ERR(err, TM_E_IO, "closing %s: %s", tmp, strerror(errno));
    if (!rc && rename(tmp, path) != 0)
        rc = TM_ERR(err, TM_E_IO, "renaming %s to %s: %s", tmp, path, strerror(errno));
    if (rc) {
        unlink(tmp);
        goto done;
    }
    // fsync the folder so the rename itself is durable
    const char *slash = strrchr(path, '/');
    char *dir = slash ? tm_strndup(path, slash == path ? 1 : (size_t)(slash - path)) : tm_strdup(".");
    if (!dir) {
        rc = TM_ERR(err, TM_E_NOMEM, "metrics path");
        goto done;
    }
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) {
        rc = TM_ERR(err, TM_E_IO, "opening %s: %s", dir, strerror(errno));
    } else {
        if (fsync(dfd) != 0 && errno != EINVAL)
            rc = TM_ERR(err, TM_E_IO, "fsync %s: %s", dir, strerror(errno));
        close(dfd);
    }
    tm_free(dir);
done:
    tm_free(tmp);
    return rc;
}

tm_rc tm_metrics_write_json(const tm_metrics *m, const char *path, tm_err *err) {
    json_t *root = build_json(m);
    if (!root)
        return TM_ERR(err, TM_E_NOMEM, "metrics JSON");
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_REAL_PRECISION(12));
    json_decref(root);
    if (!text)
        return TM_ERR(err, TM_E_NOMEM, "metrics JSON text");
    size_t n = strlen(text);
    char *with_nl = tm_malloc(n + 2); // end the file with a newline
    tm_rc rc;
    if (!with_nl) {
        rc = TM_ERR(err, TM_E_NOMEM, "metrics JSON text");
    } else {
        memcpy(with_nl, text, n);
        memcpy(with_nl + n, "\n", 2);
        rc = write_file_atomic(path, with_nl, err);
        tm_free(with_nl);
    }
    free(text); // jansson's allocation
    return rc;
}
