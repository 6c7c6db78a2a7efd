/* cmd/report.c - `tokenmill report`: metrics.json files in, one HTML page out. The page is built in
 * a growable buffer by put()/put_esc(), which keep the first error and do nothing after it, so the
 * builders read as straight-line HTML; the error is checked once before the file is written. */
#include "cmd/report.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/buf.h"

#define MAX_CARDS_ALL 24 /* above this many runs, cards only for each series' latest run */
#define N_COLORS 8

static const char *const colors[N_COLORS] = {"#2563eb", "#dc2626", "#16a34a", "#d97706",
                                             "#7c3aed", "#0891b2", "#db2777", "#4b5563"};

typedef enum kind {
    K_AUTO = 0, /* decimals by size: >= 100: 0, >= 10: 1, >= 1: 2, else 3 */
    K_INT,      /* integer */
    K_PCT,      /* a ratio shown as a percentage with 1 decimal (data-scale 100) */
    K_FIX1,     /* 1 decimal */
    K_FIX2,     /* 2 decimals */
} kind;

typedef enum better { LOWER = 0, HIGHER } better;

/* The figures compared between runs, shown on cards and charted. */
typedef struct figure {
    const char *path;  /* JSON path in metrics.json */
    const char *label; /* short label */
    const char *title; /* chart title */
    const char *unit;
    better dir;
    int chart; /* 1: has a chart */
} figure;

static const figure figures[] = {
    {"throughput.output_tok_s", "output", "Output throughput", "tok/s", HIGHER, 1},
    {"throughput.prefill_tok_s", "prefill", "Prefill throughput", "tok/s", HIGHER, 1},
    {"throughput.decode_tok_s", "decode", "Decode throughput", "tok/s", HIGHER, 1},
    {"latency_ms.ttft.p50", "TTFT p50", "TTFT p50", "ms", LOWER, 1},
    {"latency_ms.ttft.p99", "TTFT p99", "TTFT p99", "ms", LOWER, 0},
    {"latency_ms.tpot.p50", "TPOT p50", "TPOT p50", "ms", LOWER, 1},
    {"latency_ms.itl.p50", "ITL p50", "ITL p50", "ms", LOWER, 0},
    {"latency_ms.e2e.p50", "E2EL p50", "E2EL p50 (end-to-end)", "ms", LOWER, 1},
};
enum { N_FIG = sizeof(figures) / sizeof(figures[0]) };

typedef struct run {
    json_t *j;         /* owned metrics document */
    char *file;        /* owned; where it came from */
    double start_s;    /* Unix seconds */
    char workload[96]; /* "W8 (small)" or the job file's name */
    char backend[32];
    char model[160]; /* model folder name */
    char key[320];   /* workload | backend | model */
    int series;      /* index into report.keys */
    int prev;        /* previous run of the same series, or -1 */
    int latest;      /* the last run of its series */
} run;

typedef struct file_id {
    dev_t dev;
    ino_t ino;
    const char *path; /* borrowed: the argument or run path it was read as (for messages) */
} file_id;

typedef struct report {
    run *runs;
    size_t n, cap;
    file_id *read; /* owned [n_read]: every file opened as an input (-o must not be one) */
    size_t n_read, cap_read;
    char **read_paths; /* owned [n_read] */
    int strict;        /* --strict: a bad metrics file is an error, not a warning */
    int n_skipped;     /* metrics files skipped with a warning */
    const char **keys; /* [n_series] borrowed from runs, sorted */
    size_t n_series;
    double threshold; /* fraction, e.g. 0.05 */
    const char *title;
    tm_buf b; /* the page */
    tm_rc rc; /* first error while building */
    tm_err *err;
} report;

// ---- output helpers ----

static void put(report *rp, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(report *rp, const char *fmt, ...) {
    if (rp->rc)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
        rp->rc = TM_ERR(rp->err, TM_E_INTERNAL, "report: bad format");
        return;
    }
    rp->rc = tm_buf_reserve(&rp->b, (size_t)n + 1, rp->err);
    if (rp->rc)
        return;
    va_start(ap, fmt);
    vsnprintf(rp->b.data + rp->b.len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    rp->b.len += (size_t)n;
}

// Text with HTML's special characters escaped (also fine inside attribute values).
static void put_esc(report *rp, const char *s) {
    for (; s && *s && !rp->rc; s++) {
        switch (*s) {
        case '&':
            put(rp, "&amp;");
            break;
        case '<':
            put(rp, "&lt;");
            break;
        case '>':
            put(rp, "&gt;");
            break;
        case '"':
            put(rp, "&quot;");
            break;
        case '\'':
            put(rp, "&#39;");
            break;
        default:
            rp->rc = tm_buf_append(&rp->b, s, 1, rp->err);
        }
    }
}

// ---- reading metrics ----

// Member at a dotted path ("latency_ms.ttft.p50"; a number picks an array element), or NULL.
static json_t *at(json_t *root, const char *path) {
    char key[64];
    json_t *v = root;
    while (v && *path) {
        size_t n = strcspn(path, ".");
        if (n >= sizeof(key))
            return NULL;
        memcpy(key, path, n);
        key[n] = '\0';
        if (json_is_array(v) && key[0] >= '0' && key[0] <= '9')
            v = json_array_get(v, (size_t)strtoul(key, NULL, 10));
        else
            v = json_is_object(v) ? json_object_get(v, key) : NULL;
        path += n + (path[n] == '.');
    }
    return v;
}

static double num_at(const run *r, const char *path) {
    json_t *v = at(r->j, path);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

static const char *str_at(const run *r, const char *path) {
    return json_string_value(at(r->j, path)); /* NULL unless a string */
}

// "2026-11-30T07:45:00Z" -> Unix seconds; NAN if it does not parse.
static double parse_utc(const char *s) {
    struct tm t = {0};
    if (!s || sscanf(s, "%d-%d-%dT%d:%d:%d", &t.tm_year, &t.tm_mon, &t.tm_mday, &t.tm_hour,
                     &t.tm_min, &t.tm_sec) != 6)
        return NAN;
    t.tm_year -= 1900;
    t.tm_mon -= 1;
    return (double)timegm(&t);
}

static const char *base_name(const char *p) {
    const char *s = strrchr(p, '/');
    while (s && s[1] == '\0' && s > p) { // trailing slash: look before it
        const char *e = s;
        s = NULL;
        for (const char *q = p; q < e; q++)
            if (*q == '/')
                s = q;
        if (!s)
            return p;
    }
    return s ? s + 1 : p;
}

// Series fields of a loaded run.
static void describe(run *r) {
    json_t *bench = at(r->j, "bench");
    const char *job = str_at(r, "job");
    if (json_is_object(bench)) {
        const char *w = json_string_value(json_object_get(bench, "workload"));
        const char *sc = json_string_value(json_object_get(bench, "scale"));
        snprintf(r->workload, sizeof(r->workload), "%s%s%s%s", w ? w : "?",
                 sc && strcmp(sc, "full") ? " (" : "", sc && strcmp(sc, "full") ? sc : "",
                 sc && strcmp(sc, "full") ? ")" : "");
    } else if (job) { // a job file's name without .json; any other name (output.job_name, a
                      // one-command job's output folder) as it is: it tells jobs apart
        size_t n = strlen(job);
        if (n > 5 && !strcmp(job + n - 5, ".json"))
            snprintf(r->workload, sizeof(r->workload), "%.*s", (int)(strlen(base_name(job)) - 5),
                     base_name(job));
        else
            snprintf(r->workload, sizeof(r->workload), "%s", job);
    } else {
        snprintf(r->workload, sizeof(r->workload), "job");
    }
    const char *be = str_at(r, "settings.backend");
    snprintf(r->backend, sizeof(r->backend), "%s", be ? be : "?");
    const char *mp = str_at(r, "model.path"), *arch = str_at(r, "model.arch");
    snprintf(r->model, sizeof(r->model), "%s", mp ? base_name(mp) : arch ? arch : "?");
    snprintf(r->key, sizeof(r->key), "%s | %s | %s", r->workload, r->backend, r->model);
    r->start_s = num_at(r, "time.start_unix_s");
    if (!isfinite(r->start_s))
        r->start_s = parse_utc(str_at(r, "time.start_utc"));
}

// Remember that path was read (its device and inode), so that -o cannot name it.
static tm_rc note_read(report *rp, const char *path, tm_err *err) {
    struct stat st;
    if (stat(path, &st) != 0)
        return TM_OK; // it was just read; if it is gone now, -o cannot overwrite it
    if (rp->n_read == rp->cap_read) {
        size_t cap = rp->cap_read ? 2 * rp->cap_read : 16;
        file_id *nr = tm_realloc(rp->read, cap * sizeof(*nr));
        char **np = nr ? tm_realloc(rp->read_paths, cap * sizeof(*np)) : NULL;
        if (nr)
            rp->read = nr;
        if (!nr || !np)
            return TM_ERR(err, TM_E_NOMEM, "report inputs");
        rp->read_paths = np;
        rp->cap_read = cap;
    }
    char *copy = tm_strdup(path);
    if (!copy)
        return TM_ERR(err, TM_E_NOMEM, "report inputs");
    rp->read_paths[rp->n_read] = copy;
    rp->read[rp->n_read++] = (file_id){st.st_dev, st.st_ino, copy};
    return TM_OK;
}

static const char *json_kind(const json_t *v) {
    if (!v)
        return "missing";
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
    case JSON_REAL:
        return "a number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "a boolean";
    default:
        return "null";
    }
}

// What the report reads from a metrics file, with the JSON type it needs (null or absent is
// always accepted: old files lack some). Parents come before their members.
typedef enum want { W_OBJ, W_NUM, W_STR, W_BOOL, W_ARR } want;
static const struct {
    const char *path;
    want w;
} fields[] = {
    {"throughput", W_OBJ},
    {"throughput.output_tok_s", W_NUM},
    {"throughput.prefill_tok_s", W_NUM},
    {"throughput.decode_tok_s", W_NUM},
    {"latency_ms", W_OBJ},
    {"latency_ms.ttft", W_OBJ},
    {"latency_ms.ttft.p50", W_NUM},
    {"latency_ms.ttft.p99", W_NUM},
    {"latency_ms.tpot", W_OBJ},
    {"latency_ms.tpot.p50", W_NUM},
    {"latency_ms.itl", W_OBJ},
    {"latency_ms.itl.p50", W_NUM},
    {"latency_ms.e2e", W_OBJ},
    {"latency_ms.e2e.p50", W_NUM},
    {"time", W_OBJ},
    {"time.start_unix_s", W_NUM},
    {"time.start_utc", W_STR},
    {"time.wall_s", W_NUM},
    {"job", W_STR},
    {"bench", W_OBJ},
    {"bench.workload", W_STR},
    {"bench.scale", W_STR},
    {"bench.seqs", W_NUM},
    {"bench.prompt_tokens", W_NUM},
    {"bench.gen_tokens", W_NUM},
    {"bench.shared_prefix_tokens", W_NUM},
    {"model", W_OBJ},
    {"model.path", W_STR},
    {"model.arch", W_STR},
    {"model.n_params", W_NUM},
    {"settings", W_OBJ},
    {"settings.backend", W_STR},
    {"settings.block_size", W_NUM},
    {"settings.kv_blocks", W_NUM},
    {"settings.kv_dtype", W_STR},
    {"settings.max_batched_tokens", W_NUM},
    {"settings.max_seqs", W_NUM},
    {"settings.prefix_cache", W_BOOL},
    {"settings.threads", W_NUM},
    {"settings.tp", W_NUM},
    {"records", W_OBJ},
    {"records.in", W_NUM},
    {"records.ok", W_NUM},
    {"records.failed", W_NUM},
    {"tokens", W_OBJ},
    {"tokens.prompt", W_NUM},
    {"tokens.completion", W_NUM},
    {"tokens.prefix_cache_hit_rate", W_NUM},
    {"engine", W_OBJ},
    {"engine.steps", W_NUM},
    {"engine.preemptions", W_NUM},
    {"engine.mean_step_fill", W_NUM},
    {"host", W_OBJ},
    {"host.hostname", W_STR},
    {"host.cpu_model", W_STR},
    {"host.n_cpus", W_NUM},
    {"host.gpus", W_OBJ},
    {"host.gpus.count", W_NUM},
    {"host.gpus.name", W_STR},
    {"host.gpus.devices", W_ARR},
    {"tokenmill", W_OBJ},
    {"tokenmill.version", W_STR},
    {"tokenmill.git_commit", W_STR},
};

// What is wrong with metrics document j for the report, into why ("" when nothing is).
static void check_metrics(json_t *j, char *why, size_t n) {
    static const char *const want_name[] = {"an object", "a number", "a string", "a boolean",
                                            "an array"};
    why[0] = '\0';
    json_t *ver = json_object_get(j, "schema_version");
    if (!json_is_integer(ver)) {
        snprintf(why, n, "schema_version is %s, expected an integer (1 or 2)", json_kind(ver));
        return;
    }
    if (json_integer_value(ver) < 1 || json_integer_value(ver) > 2) {
        snprintf(why, n, "schema_version %lld is not one this report reads (1 or 2)",
                 (long long)json_integer_value(ver));
        return;
    }
    if (!json_is_object(json_object_get(j, "throughput"))) {
        snprintf(why, n, "throughput is %s, expected an object",
                 json_kind(json_object_get(j, "throughput")));
        return;
    }
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
        json_t *v = at(j, fields[i].path);
        int ok = !v || json_is_null(v);
        switch (fields[i].w) {
        case W_OBJ:
            ok |= json_is_object(v);
            break;
        case W_NUM:
            ok |= json_is_number(v);
            break;
        case W_STR:
            ok |= json_is_string(v);
            break;
        case W_BOOL:
            ok |= json_is_boolean(v);
            break;
        case W_ARR:
            ok |= json_is_array(v);
            break;
        }
        if (!ok) {
            snprintf(why, n, "%s is %s, expected %s", fields[i].path, json_kind(v),
                     want_name[fields[i].w]);
            return;
        }
    }
}

// A metrics file that cannot be reported: skipped with a warning, or (--strict) the error.
static tm_rc bad_file(report *rp, const char *path, const char *why, tm_err *err) {
    if (rp->strict)
        return TM_ERR(err, TM_E_PARSE, "%s: %s", path, why);
    fprintf(stderr, "tokenmill report: warning: skipping %s: %s\n", path, why);
    rp->n_skipped++;
    return TM_OK;
}

// Load one metrics file. A JSON file without schema_version in a folder listing is not metrics
// and is passed over in silence; any other file that cannot be reported (unreadable, not JSON,
// wrong types: check_metrics) is skipped with a warning naming the field, or with --strict is
// the error.
static tm_rc load_file(report *rp, const char *path, int from_dir, tm_err *err) {
    json_error_t jerr;
    json_t *j = json_load_file(path, 0, &jerr);
    tm_rc rc = note_read(rp, path, err);
    if (rc) {
        json_decref(j);
        return rc;
    }
    if (from_dir && (!json_is_object(j) || !json_object_get(j, "schema_version"))) {
        json_decref(j);
        return TM_OK;
    }
    char why[300];
    if (!j)
        snprintf(why, sizeof(why), "%s (line %d)", jerr.text, jerr.line);
    else if (!json_is_object(j))
        snprintf(why, sizeof(why), "the document is %s, not a metrics object", json_kind(j));
    else
        check_metrics(j, why, sizeof(why));
    if (why[0]) {
        json_decref(j);
        return bad_file(rp, path, why, err);
    }
    if (rp->n == rp->cap) {
        size_t cap = rp->cap ? 2 * rp->cap : 16;
        run *nr = tm_realloc(rp->runs, cap * sizeof(*nr));
        if (!nr) {
            json_decref(j);
            return TM_ERR(err, TM_E_NOMEM, "report runs");
        }
        rp->runs = nr;
        rp->cap = cap;
    }
    run *r = &rp->runs[rp->n];
    *r = (run){.j = j, .file = tm_strdup(path), .prev = -1};
    if (!r->file) {
        json_decref(j);
        return TM_ERR(err, TM_E_NOMEM, "report path");
    }
    describe(r);
    if (!isfinite(r->start_s)) {
        json_decref(j);
        tm_free(r->file);
        return bad_file(rp, path,
                        "no start time (time.start_unix_s, or time.start_utc "
                        "as YYYY-MM-DDTHH:MM:SSZ)",
                        err);
    }
    rp->n++;
    return TM_OK;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static int is_file(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

// A folder: its *.json files and the metrics.json of each direct subfolder, in name order.
static tm_rc load_dir(report *rp, const char *dir, tm_err *err) {
    DIR *d = opendir(dir);
    if (!d)
        return TM_ERR(err, TM_E_IO, "%s: %s", dir, strerror(errno));
    char **names = NULL;
    size_t n = 0, cap = 0;
    tm_rc rc = TM_OK;
    struct dirent *e;
    while (!rc && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            char **nn = tm_realloc(names, cap * sizeof(*nn));
            if (!nn) {
                rc = TM_ERR(err, TM_E_NOMEM, "report folder listing");
                break;
            }
            names = nn;
        }
        names[n] = tm_strdup(e->d_name);
        if (!names[n])
            rc = TM_ERR(err, TM_E_NOMEM, "report folder listing");
        else
            n++;
    }
    closedir(d);
    if (!rc)
        qsort(names, n, sizeof(*names), cmp_str);
    for (size_t i = 0; !rc && i < n; i++) {
        tm_buf p = {0};
        rc = tm_buf_printf(&p, err, "%s/%s", dir, names[i]);
        size_t len = strlen(names[i]);
        if (!rc && is_dir(p.data)) {
            rc = tm_buf_append_str(&p, "/metrics.json", err);
            if (!rc && is_file(p.data))
                rc = load_file(rp, p.data, 1, err);
        } else if (!rc && len > 5 && !strcmp(names[i] + len - 5, ".json") && is_file(p.data)) {
            rc = load_file(rp, p.data, 1, err);
        }
        tm_buf_fini(&p);
    }
    for (size_t i = 0; i < n; i++)
        tm_free(names[i]);
    tm_free(names);
    return rc;
}

static int cmp_run(const void *a, const void *b) {
    const run *x = a, *y = b;
    if (x->start_s != y->start_s)
        return x->start_s < y->start_s ? -1 : 1;
    return strcmp(x->file, y->file);
}

// Order runs by start, name the series, link each run to the previous run of its series.
static tm_rc link_runs(report *rp, tm_err *err) {
    qsort(rp->runs, rp->n, sizeof(*rp->runs), cmp_run);
    rp->keys = tm_calloc(rp->n ? rp->n : 1, sizeof(*rp->keys));
    if (!rp->keys)
        return TM_ERR(err, TM_E_NOMEM, "report series");
    for (size_t i = 0; i < rp->n; i++) {
        size_t k = 0;
        while (k < rp->n_series && strcmp(rp->keys[k], rp->runs[i].key))
            k++;
        if (k == rp->n_series)
            rp->keys[rp->n_series++] = rp->runs[i].key;
    }
    qsort(rp->keys, rp->n_series, sizeof(*rp->keys), cmp_str);
    for (size_t i = 0; i < rp->n; i++) {
        run *r = &rp->runs[i];
        for (size_t k = 0; k < rp->n_series; k++)
            if (!strcmp(rp->keys[k], r->key))
                r->series = (int)k;
        r->latest = 1;
        for (size_t p = i; p-- > 0;)
            if (rp->runs[p].series == r->series) {
                r->prev = (int)p;
                rp->runs[p].latest = 0;
                break;
            }
    }
    return TM_OK;
}

// ---- numbers ----

// v with `dec` decimals and thousands separators ("12,345.6").
static void fmt_fixed(double v, int dec, char *buf, size_t n) {
    char raw[64];
    snprintf(raw, sizeof(raw), "%.*f", dec, fabs(v));
    const char *dot = strchr(raw, '.');
    size_t int_len = dot ? (size_t)(dot - raw) : strlen(raw);
    size_t o = 0;
    if (v < 0 && strspn(raw, "0.") != strlen(raw) && o + 1 < n)
        buf[o++] = '-';
    for (size_t i = 0; i < int_len && o + 2 < n; i++) {
        if (i && (int_len - i) % 3 == 0)
            buf[o++] = ',';
        buf[o++] = raw[i];
    }
    for (const char *s = dot; s && *s && o + 1 < n; s++)
        buf[o++] = *s;
    buf[o] = '\0';
}

static void fmt_num(double v, kind k, char *buf, size_t n) {
    double a = fabs(v);
    switch (k) {
    case K_INT:
        fmt_fixed(v, 0, buf, n);
        break;
    case K_PCT:
        fmt_fixed(v * 100, 1, buf, n);
        break;
    case K_FIX1:
        fmt_fixed(v, 1, buf, n);
        break;
    case K_FIX2:
        fmt_fixed(v, 2, buf, n);
        break;
    case K_AUTO:
        fmt_fixed(v, a >= 100 ? 0 : a >= 10 ? 1 : a >= 1 ? 2 : 3, buf, n);
        break;
    }
}

// A number from run i's file: <span class="num" data-src data-path data-value>text</span>.
static void put_num(report *rp, int i, const char *path, kind k) {
    json_t *v = at(rp->runs[i].j, path);
    put(rp, "<span class=\"num\" data-src=\"%d\" data-path=\"%s\"", i, path);
    if (k == K_PCT)
        put(rp, " data-scale=\"100\"");
    if (json_is_integer(v)) {
        char t[64];
        fmt_num((double)json_integer_value(v), k, t, sizeof(t));
        put(rp, " data-value=\"%lld\">%s</span>", (long long)json_integer_value(v), t);
    } else if (json_is_real(v)) {
        char t[64];
        fmt_num(json_real_value(v), k, t, sizeof(t));
        put(rp, " data-value=\"%.17g\">%s</span>", json_real_value(v), t);
    } else {
        put(rp, " data-value=\"null\">&ndash;</span>");
    }
}

// Relative change of figure f from run prev to run i, as a fraction; NAN when not comparable.
static double change(const report *rp, int i, int prev, const figure *f) {
    if (prev < 0)
        return NAN;
    double a = num_at(&rp->runs[prev], f->path), b = num_at(&rp->runs[i], f->path);
    if (!isfinite(a) || !isfinite(b) || a <= 0)
        return NAN;
    return (b - a) / a;
}

// How much worse (fraction > 0) or better (< 0).
static double worse_by(const figure *f, double ch) { return f->dir == HIGHER ? -ch : ch; }

static int n_regressions(const report *rp, int i) {
    int n = 0;
    for (int k = 0; k < N_FIG; k++) {
        double ch = change(rp, i, rp->runs[i].prev, &figures[k]);
        n += isfinite(ch) && worse_by(&figures[k], ch) > rp->threshold;
    }
    return n;
}

// The change of figure f against the previous comparable run, e.g. "+3.2%", classed bad (a
// regression beyond the threshold), good (better by more than the threshold) or flat.
static void put_delta(report *rp, int i, const figure *f) {
    int prev = rp->runs[i].prev;
    double ch = change(rp, i, prev, f);
    if (!isfinite(ch))
        return;
    double w = worse_by(f, ch);
    const char *cls = w > rp->threshold ? "bad" : w < -rp->threshold ? "good" : "flat";
    put(rp,
        "<span class=\"delta %s\" data-kind=\"delta\" data-src=\"%d\" data-prev=\"%d\" "
        "data-path=\"%s\">%s%.1f%%</span>",
        cls, i, prev, f->path, ch >= 0 ? "+" : "", ch * 100);
}

static void fmt_time(double unix_s, const char *fmt, char *buf, size_t n) {
    time_t t = (time_t)unix_s;
    struct tm tmv;
    gmtime_r(&t, &tmv);
    strftime(buf, n, fmt, &tmv);
}

// ---- page parts ----

static const char css[] =
    ":root{--bg:#f5f6f8;--card:#fff;--ink:#1f2933;--muted:#66717f;--line:#e3e6ea;"
    "--bad:#c62828;--good:#1b7f3b}"
    "*{box-sizing:border-box}"
    "body{margin:0;background:var(--bg);color:var(--ink);font:14px/1.45 system-ui,-apple-system,"
    "'Segoe UI',Roboto,'DejaVu Sans',sans-serif}"
    "main{max-width:1280px;margin:0 auto;padding:24px 28px 48px}"
    "h1{font-size:24px;margin:0 0 4px}h2{font-size:18px;margin:32px 0 12px}"
    "h3{font-size:16px;margin:0}"
    ".sub{color:var(--muted);margin:0}"
    ".summary{display:flex;gap:12px;flex-wrap:wrap;margin-top:16px}"
    ".pill{background:var(--card);border:1px solid var(--line);border-radius:999px;"
    "padding:4px 12px}"
    ".pill.bad{border-color:var(--bad);color:var(--bad);font-weight:600}"
    ".pill.good{border-color:var(--good);color:var(--good)}"
    ".cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(380px,1fr));gap:16px}"
    ".card{background:var(--card);border:1px solid var(--line);border-radius:10px;"
    "padding:16px 18px;box-shadow:0 1px 2px rgba(0,0,0,.05)}"
    ".card.regressed{border-left:4px solid var(--bad)}"
    ".card header{display:flex;align-items:center;justify-content:space-between;gap:8px}"
    ".swatch{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:6px}"
    ".badge{font-size:12px;border-radius:999px;padding:2px 8px;background:#eef1f4;"
    "white-space:nowrap}"
    ".badge.bad{background:#fdecea;color:var(--bad);font-weight:600}"
    ".meta{color:var(--muted);font-size:12px;margin:4px 0 12px}"
    ".kpis{display:grid;grid-template-columns:repeat(4,1fr);gap:10px 12px;margin-bottom:12px}"
    ".kpi .label{font-size:11px;text-transform:uppercase;letter-spacing:.04em;color:var(--muted)}"
    ".kpi .value{font-size:18px;font-weight:600;white-space:nowrap}"
    ".kpi .unit{font-size:11px;font-weight:400;color:var(--muted);margin-left:3px}"
    ".delta{font-size:11px;font-weight:600}.delta.bad{color:var(--bad)}"
    ".delta.good{color:var(--good)}.delta.flat{color:var(--muted);font-weight:400}"
    "dl.cfg{display:grid;grid-template-columns:max-content 1fr;gap:2px 12px;margin:0;"
    "font-size:12px;border-top:1px solid var(--line);padding-top:10px}"
    "dl.cfg dt{color:var(--muted)}dl.cfg dd{margin:0;overflow-wrap:anywhere}"
    ".charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(560px,1fr));gap:16px}"
    "figure.chart{margin:0;background:var(--card);border:1px solid var(--line);"
    "border-radius:10px;padding:12px 12px 6px}"
    "figure.chart figcaption{font-weight:600;margin:0 0 4px 4px}"
    "figure.chart svg{width:100%;height:auto;display:block}"
    ".legend{display:flex;flex-wrap:wrap;gap:6px 18px;margin:0 0 12px;font-size:13px}"
    "table{border-collapse:collapse;width:100%;background:var(--card);font-size:12px;"
    "border:1px solid var(--line)}"
    "th,td{padding:5px 6px;border-bottom:1px solid var(--line);text-align:right;"
    "overflow-wrap:anywhere}"
    "th{background:#f0f2f5;position:sticky;top:0}"
    "td.l,th.l{text-align:left}"
    "tr.regressed td:first-child{box-shadow:inset 3px 0 var(--bad)}"
    ".ok{color:var(--good);font-weight:600}"
    ".scroll{overflow-x:auto}"
    ".note{color:var(--muted);font-size:12px}"
    "footer{color:var(--muted);font-size:12px;margin-top:32px}";

static void put_series_name(report *rp, const run *r) {
    put(rp, "<span class=\"swatch\" style=\"background:%s\"></span>", colors[r->series % N_COLORS]);
    put_esc(rp, r->workload);
    put(rp, " &middot; ");
    put_esc(rp, r->backend);
    put(rp, " &middot; ");
    put_esc(rp, r->model);
}

static void put_regressions(report *rp) {
    put(rp, "<section id=\"regressions\"><h2>Regressions</h2>");
    put(rp,
        "<p class=\"note\">Each series' latest run against the run before it in the same series "
        "(same workload, backend and model); a figure more than %.3g%% worse is flagged.</p>",
        rp->threshold * 100);
    int any = 0;
    for (size_t i = 0; i < rp->n; i++) {
        const run *r = &rp->runs[i];
        if (!r->latest || r->prev < 0)
            continue;
        for (int k = 0; k < N_FIG; k++) {
            const figure *f = &figures[k];
            double ch = change(rp, (int)i, r->prev, f);
            if (!isfinite(ch) || worse_by(f, ch) <= rp->threshold)
                continue;
            if (!any)
                put(rp, "<table class=\"regr\"><tr><th class=\"l\">series</th><th class=\"l\">"
                        "figure</th><th>previous</th><th>latest</th><th>change</th>"
                        "<th class=\"l\">runs</th></tr>");
            any = 1;
            char t0[32], t1[32];
            fmt_time(rp->runs[r->prev].start_s, "%Y-%m-%d %H:%M:%S", t0, sizeof(t0));
            fmt_time(r->start_s, "%Y-%m-%d %H:%M:%S", t1, sizeof(t1));
            put(rp, "<tr class=\"regressed\"><td class=\"l\">");
            put_series_name(rp, r);
            put(rp, "</td><td class=\"l\">%s (%s)</td><td>", f->label, f->unit);
            put_num(rp, r->prev, f->path, K_AUTO);
            put(rp, "</td><td>");
            put_num(rp, (int)i, f->path, K_AUTO);
            put(rp, "</td><td>");
            put_delta(rp, (int)i, f);
            put(rp, " <span class=\"note\">(%.1f%% worse)</span>", worse_by(f, ch) * 100);
            put(rp,
                "</td><td class=\"l\"><a href=\"#run-%d\">#%d</a> %s &rarr; "
                "<a href=\"#run-%zu\">#%zu</a> %s</td></tr>",
                r->prev, r->prev, t0, i, i, t1);
        }
    }
    if (any)
        put(rp, "</table>");
    else
        put(rp, "<p class=\"ok\">No regressions beyond %.3g%%.</p>", rp->threshold * 100);
    put(rp, "</section>");
}

static void put_kv_str(report *rp, const char *label, const char *v) {
    put(rp, "<dt>%s</dt><dd>", label);
    if (v)
        put_esc(rp, v);
    else
        put(rp, "&ndash;");
    put(rp, "</dd>");
}

static void put_card(report *rp, int i) {
    const run *r = &rp->runs[i];
    int n_reg = n_regressions(rp, i);
    char when[40];
    fmt_time(r->start_s, "%Y-%m-%d %H:%M:%S UTC", when, sizeof(when));
    put(rp, "<article class=\"card%s\" id=\"run-%d\"><header><h3>", n_reg ? " regressed" : "", i);
    put_series_name(rp, r);
    put(rp, "</h3>");
    if (n_reg)
        put(rp, "<span class=\"badge bad\">%d regression%s</span>", n_reg, n_reg > 1 ? "s" : "");
    else if (r->prev < 0)
        put(rp, "<span class=\"badge\">first run</span>");
    else
        put(rp, "<span class=\"badge\">vs #%d</span>", r->prev);
    put(rp, "</header><p class=\"meta\">#%d &middot; %s &middot; host ", i, when);
    put_esc(rp, str_at(r, "host.hostname"));
    put(rp, " &middot; git ");
    put_esc(rp, str_at(r, "tokenmill.git_commit"));
    put(rp, "</p><div class=\"kpis\">");
    for (int k = 0; k < N_FIG; k++) {
        const figure *f = &figures[k];
        put(rp, "<div class=\"kpi\"><div class=\"label\">%s</div><div class=\"value\">", f->label);
        put_num(rp, i, f->path, K_AUTO);
        put(rp, "<span class=\"unit\">%s</span></div>", f->unit);
        put_delta(rp, i, f);
        put(rp, "</div>");
    }
    put(rp, "</div><dl class=\"cfg\">");
    json_t *bench = at(r->j, "bench");
    if (json_is_object(bench)) {
        put(rp, "<dt>workload</dt><dd>");
        put_num(rp, i, "bench.seqs", K_INT);
        put(rp, " &times; ");
        put_num(rp, i, "bench.prompt_tokens", K_INT);
        put(rp, " prompt + ");
        put_num(rp, i, "bench.gen_tokens", K_INT);
        put(rp, " generated");
        if (num_at(r, "bench.shared_prefix_tokens") > 0) {
            put(rp, ", ");
            put_num(rp, i, "bench.shared_prefix_tokens", K_INT);
            put(rp, " shared");
        }
        put(rp, "</dd>");
    } else {
        put_kv_str(rp, "job", str_at(r, "job"));
    }
    put_kv_str(rp, "backend", str_at(r, "settings.backend"));
    put(rp, "<dt>model</dt><dd>");
    put_esc(rp, r->model);
    if (str_at(r, "model.arch")) {
        put(rp, " (");
        put_esc(rp, str_at(r, "model.arch"));
        put(rp, ")");
    }
    if (num_at(r, "model.n_params") > 0) {
        put(rp, ", ");
        put_num(rp, i, "model.n_params", K_INT);
        put(rp, " params");
    }
    put(rp, "</dd>");
    if (json_is_object(at(r->j, "settings"))) {
        put(rp, "<dt>batching</dt><dd>max_seqs ");
        put_num(rp, i, "settings.max_seqs", K_INT);
        put(rp, ", max_batched_tokens ");
        put_num(rp, i, "settings.max_batched_tokens", K_INT);
        put(rp, "</dd><dt>KV cache</dt><dd>blocks of ");
        put_num(rp, i, "settings.block_size", K_INT);
        put(rp, " tokens, ");
        put_num(rp, i, "settings.kv_blocks", K_INT);
        put(rp, " blocks, ");
        put_esc(rp, str_at(r, "settings.kv_dtype") ? str_at(r, "settings.kv_dtype") : "?");
        put(rp, ", prefix cache %s</dd>",
            json_is_true(at(r->j, "settings.prefix_cache")) ? "on" : "off");
        put(rp, "<dt>parallel</dt><dd>tp ");
        put_num(rp, i, "settings.tp", K_INT);
        put(rp, ", ");
        put_num(rp, i, "settings.threads", K_INT);
        put(rp, " CPU threads</dd>");
    }
    put(rp, "<dt>records</dt><dd>");
    put_num(rp, i, "records.ok", K_INT);
    put(rp, " ok of ");
    put_num(rp, i, "records.in", K_INT);
    put(rp, ", ");
    put_num(rp, i, "records.failed", K_INT);
    put(rp, " failed</dd><dt>tokens</dt><dd>");
    put_num(rp, i, "tokens.prompt", K_INT);
    put(rp, " prompt (");
    put_num(rp, i, "tokens.prefix_cache_hit_rate", K_PCT);
    put(rp, "%% cached), ");
    put_num(rp, i, "tokens.completion", K_INT);
    put(rp, " completion</dd><dt>engine</dt><dd>");
    put_num(rp, i, "engine.steps", K_INT);
    put(rp, " steps, ");
    put_num(rp, i, "engine.preemptions", K_INT);
    put(rp, " preemptions, mean fill ");
    put_num(rp, i, "engine.mean_step_fill", K_PCT);
    put(rp, "%%</dd>");
    if (json_is_object(at(r->j, "speculative"))) { // engine.speculative: vLLM's counters
        put(rp, "<dt>speculative</dt><dd>");
        put_esc(rp, str_at(r, "speculative.method") ? str_at(r, "speculative.method") : "?");
        put(rp, ", k ");
        put_num(rp, i, "speculative.num_speculative_tokens", K_INT);
        put(rp, ": ");
        put_num(rp, i, "speculative.num_drafts", K_INT);
        put(rp, " drafts, ");
        put_num(rp, i, "speculative.num_accepted_tokens", K_INT);
        put(rp, " of ");
        put_num(rp, i, "speculative.num_draft_tokens", K_INT);
        put(rp, " draft tokens accepted (");
        put_num(rp, i, "speculative.acceptance_rate", K_PCT);
        put(rp, "%%), mean acceptance length ");
        put_num(rp, i, "speculative.mean_acceptance_length", K_FIX2);
        put(rp, "; by position");
        json_t *pos = at(r->j, "speculative.acceptance_rate_per_pos");
        for (size_t d = 0; d < json_array_size(pos); d++) {
            char p[64];
            snprintf(p, sizeof(p), "speculative.acceptance_rate_per_pos.%zu", d);
            put(rp, d ? ", " : " ");
            put_num(rp, i, p, K_PCT);
            put(rp, "%%");
        }
        put(rp, "</dd>");
    }
    put(rp, "<dt>wall time</dt><dd>");
    put_num(rp, i, "time.wall_s", K_FIX2);
    put(rp, " s</dd>");
    if (json_is_object(at(r->j, "host.gpus"))) {
        put(rp, "<dt>GPU</dt><dd>");
        put_num(rp, i, "host.gpus.count", K_INT);
        put(rp, " &times; ");
        put_esc(rp, str_at(r, "host.gpus.name") ? str_at(r, "host.gpus.name") : "?");
        json_t *devs = at(r->j, "host.gpus.devices");
        for (size_t d = 0; d < json_array_size(devs); d++) {
            char p[64];
            put(rp, "<br>GPU %zu: ", d);
            snprintf(p, sizeof(p), "host.gpus.devices.%zu.power_w_mean", d);
            put_num(rp, i, p, K_FIX1);
            put(rp, " W mean, ");
            snprintf(p, sizeof(p), "host.gpus.devices.%zu.energy_j", d);
            put_num(rp, i, p, K_AUTO);
            put(rp, " J");
        }
        put(rp, "</dd>");
    } else if (str_at(r, "host.device")) {
        put_kv_str(rp, "device", str_at(r, "host.device"));
    }
    put(rp, "<dt>CPU</dt><dd>");
    put_esc(rp, str_at(r, "host.cpu_model"));
    put(rp, ", ");
    put_num(rp, i, "host.n_cpus", K_INT);
    put(rp, " cores</dd>");
    put(rp, "<dt>tokenmill</dt><dd>");
    put_esc(rp, str_at(r, "tokenmill.version"));
    put(rp, " (git ");
    put_esc(rp, str_at(r, "tokenmill.git_commit"));
    put(rp, ")</dd></dl></article>");
}

// Numbers along an axis: linear from 0 with 1-2-5 steps, or powers of ten (log).
static double nice_step(double range) {
    double mag = pow(10, floor(log10(range)));
    double f = range / mag;
    return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * mag;
}

static void put_chart(report *rp, const figure *f) {
    const double W = 640, H = 250, L = 70, R = 16, T = 14, B = 40;
    double lo = INFINITY, hi = -INFINITY, t0 = INFINITY, t1 = -INFINITY;
    int n_pts = 0;
    for (size_t i = 0; i < rp->n; i++) {
        double v = num_at(&rp->runs[i], f->path);
        if (!isfinite(v) || v <= 0)
            continue;
        n_pts++;
        lo = fmin(lo, v), hi = fmax(hi, v);
        t0 = fmin(t0, rp->runs[i].start_s), t1 = fmax(t1, rp->runs[i].start_s);
    }
    put(rp, "<figure class=\"chart\" data-path=\"%s\"><figcaption>%s (%s)%s</figcaption>", f->path,
        f->title, f->unit, n_pts && hi / lo > 30 ? " &middot; log scale" : "");
    put(rp,
        "<svg viewBox=\"0 0 %.0f %.0f\" xmlns=\"http://www.w3.org/2000/svg\" role=\"img\" "
        "font-family=\"system-ui,sans-serif\" font-size=\"11\">",
        W, H);
    if (n_pts == 0) {
        put(rp,
            "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\" fill=\"#66717f\">no data"
            "</text></svg></figure>",
            W / 2, H / 2);
        return;
    }
    int log_scale = hi / lo > 30;
    double y_lo, y_hi;
    if (log_scale) {
        y_lo = floor(log10(lo));
        y_hi = ceil(log10(hi));
        if (y_hi == y_lo)
            y_hi += 1;
    } else {
        double step = nice_step(hi / 4);
        y_lo = 0;
        y_hi = ceil(hi * 1.05 / step) * step;
    }
    if (t1 - t0 < 1) { // one moment: centre it
        t0 -= 1;
        t1 += 1;
    }
    const double pw = W - L - R, ph = H - T - B;
#define X(t) (L + ((t)-t0) / (t1 - t0) * pw)
#define Y(v) (T + ph - (((log_scale ? log10(v) : (v)) - y_lo) / (y_hi - y_lo)) * ph)
    // grid and y ticks
    put(rp, "<g class=\"axis\" stroke=\"#e3e6ea\">");
    if (log_scale) {
        for (double e = y_lo; e <= y_hi + 1e-9; e++)
            for (int m = 1; m <= (e < y_hi ? 9 : 1); m++) {
                double v = m * pow(10, e);
                put(rp, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\"%s/>", L, W - R, Y(v),
                    Y(v), m == 1 ? "" : " stroke-opacity=\"0.45\"");
            }
    } else {
        double step = nice_step(hi / 4);
        for (double v = 0; v <= y_hi + step * 1e-6; v += step)
            put(rp, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\"/>", L, W - R,
                T + ph - v / y_hi * ph, T + ph - v / y_hi * ph);
    }
    put(rp, "</g><g class=\"tick\" fill=\"#66717f\" text-anchor=\"end\">");
    if (log_scale) {
        for (double e = y_lo; e <= y_hi + 1e-9; e++) {
            char t[32];
            fmt_num(pow(10, e), K_AUTO, t, sizeof(t));
            put(rp, "<text x=\"%.1f\" y=\"%.1f\">%s</text>", L - 6, Y(pow(10, e)) + 4, t);
        }
    } else {
        double step = nice_step(hi / 4);
        for (double v = 0; v <= y_hi + step * 1e-6; v += step) {
            char t[32];
            fmt_num(v, K_AUTO, t, sizeof(t));
            if (v == 0)
                snprintf(t, sizeof(t), "0");
            put(rp, "<text x=\"%.1f\" y=\"%.1f\">%s</text>", L - 6, T + ph - v / y_hi * ph + 4, t);
        }
    }
    put(rp, "</g><g class=\"tick\" fill=\"#66717f\">");
    const char *tf = t1 - t0 > 2 * 86400 ? "%m-%d" : t1 - t0 > 3600 ? "%m-%d %H:%M" : "%H:%M:%S";
    for (int k = 0; k < 3; k++) {
        double t = t0 + (t1 - t0) * k / 2.0;
        char s[32];
        fmt_time(t, tf, s, sizeof(s));
        put(rp, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\">%s</text>", X(t), H - B + 16,
            k == 0   ? "start"
            : k == 1 ? "middle"
                     : "end",
            s);
    }
    put(rp, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">start time (UTC)</text></g>",
        L + pw / 2, H - 6);
    put(rp, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#9aa3ad\"/>", L, W - R,
        T + ph, T + ph);
    // one line per series, then its points (each point carries its source)
    for (size_t s = 0; s < rp->n_series; s++) {
        const char *col = colors[s % N_COLORS];
        int n = 0;
        for (size_t i = 0; i < rp->n; i++) {
            double v = num_at(&rp->runs[i], f->path);
            if (rp->runs[i].series != (int)s || !isfinite(v) || v <= 0)
                continue;
            if (n == 0)
                put(rp, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"", col);
            put(rp, "%s%.1f,%.1f", n ? " " : "", X(rp->runs[i].start_s), Y(v));
            n++;
        }
        if (n)
            put(rp, "\"/>");
    }
    for (size_t i = 0; i < rp->n; i++) {
        const run *r = &rp->runs[i];
        double v = num_at(r, f->path);
        if (!isfinite(v) || v <= 0)
            continue;
        char t[64], when[32];
        fmt_num(v, K_AUTO, t, sizeof(t));
        fmt_time(r->start_s, "%Y-%m-%d %H:%M:%S", when, sizeof(when));
        put(rp,
            "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\" stroke=\"#fff\" "
            "data-src=\"%zu\" data-path=\"%s\" data-value=\"%.17g\"><title>#%zu ",
            X(r->start_s), Y(v), colors[r->series % N_COLORS], i, f->path, v, i);
        put_esc(rp, r->key);
        put(rp, ", %s: %s %s</title></circle>", when, t, f->unit);
    }
#undef X
#undef Y
    put(rp, "</svg></figure>");
}

static void put_charts(report *rp) {
    put(rp, "<section id=\"charts\"><h2>Trends</h2><div class=\"legend\">");
    for (size_t s = 0; s < rp->n_series; s++) {
        put(rp, "<span><span class=\"swatch\" style=\"background:%s\"></span>",
            colors[s % N_COLORS]);
        put_esc(rp, rp->keys[s]);
        put(rp, "</span>");
    }
    put(rp, "</div><div class=\"charts\">");
    for (int k = 0; k < N_FIG; k++)
        if (figures[k].chart)
            put_chart(rp, &figures[k]);
    put(rp, "</div></section>");
}

static void put_table(report *rp) {
    put(rp, "<section id=\"runs-table\"><h2>All runs</h2><div class=\"scroll\"><table><tr>"
            "<th>#</th>"
            "<th class=\"l\">start (UTC)</th><th class=\"l\">series</th><th>records ok</th>");
    for (int k = 0; k < N_FIG; k++)
        put(rp, "<th>%s<br><span class=\"note\">%s</span></th>", figures[k].label, figures[k].unit);
    put(rp, "<th>wall s</th><th class=\"l\">git</th></tr>");
    for (size_t i = rp->n; i-- > 0;) {
        const run *r = &rp->runs[i];
        char when[32];
        fmt_time(r->start_s, "%Y-%m-%d %H:%M:%S", when, sizeof(when));
        put(rp,
            "<tr%s><td><a href=\"#run-%zu\">%zu</a></td><td class=\"l\">%s</td>"
            "<td class=\"l\">",
            n_regressions(rp, (int)i) ? " class=\"regressed\"" : "", i, i, when);
        put_series_name(rp, r);
        put(rp, "</td><td>");
        put_num(rp, (int)i, "records.ok", K_INT);
        put(rp, "</td>");
        for (int k = 0; k < N_FIG; k++) {
            put(rp, "<td>");
            put_num(rp, (int)i, figures[k].path, K_AUTO);
            put(rp, " ");
            put_delta(rp, (int)i, &figures[k]);
            put(rp, "</td>");
        }
        put(rp, "<td>");
        put_num(rp, (int)i, "time.wall_s", K_FIX2);
        put(rp, "</td><td class=\"l\">");
        put_esc(rp, str_at(r, "tokenmill.git_commit"));
        put(rp, "</td></tr>");
    }
    put(rp, "</table></div></section>");
}

static void build_page(report *rp) {
    char now[40];
    fmt_time((double)time(NULL), "%Y-%m-%d %H:%M:%S UTC", now, sizeof(now));
    int n_latest_reg = 0, n_cards = 0;
    for (size_t i = 0; i < rp->n; i++)
        if (rp->runs[i].latest)
            n_latest_reg += n_regressions(rp, (int)i);
    put(rp, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\"><title>");
    put_esc(rp, rp->title);
    put(rp, "</title><style>%s</style></head><body><main><header><h1>", css);
    put_esc(rp, rp->title);
    put(rp,
        "</h1><p class=\"sub\">Generated %s by tokenmill %s (git %s) from %zu metrics "
        "file%s.</p><div class=\"summary\"><span class=\"pill\">%zu run%s</span>"
        "<span class=\"pill\">%zu series</span>",
        now, TM_VERSION, TM_GIT_COMMIT, rp->n, rp->n == 1 ? "" : "s", rp->n, rp->n == 1 ? "" : "s",
        rp->n_series);
    if (n_latest_reg)
        put(rp, "<span class=\"pill bad\">%d regression%s in the latest runs</span>", n_latest_reg,
            n_latest_reg == 1 ? "" : "s");
    else
        put(rp, "<span class=\"pill good\">no regressions in the latest runs</span>");
    put(rp, "<span class=\"pill\">threshold %.3g%%</span></div></header>", rp->threshold * 100);
    put_regressions(rp);
    int all = rp->n <= MAX_CARDS_ALL;
    put(rp, "<section id=\"cards\"><h2>%s</h2><div class=\"cards\">",
        all ? "Runs, newest first" : "Latest run of each series");
    for (size_t i = rp->n; i-- > 0;)
        if (all || rp->runs[i].latest) {
            put_card(rp, (int)i);
            n_cards++;
        }
    put(rp, "</div>");
    if (!all)
        put(rp, "<p class=\"note\">%zu older run%s in the table below.</p>",
            rp->n - (size_t)n_cards, rp->n - (size_t)n_cards == 1 ? " is" : "s are");
    put(rp, "</section>");
    put_charts(rp);
    put_table(rp);
    put(rp, "<section id=\"sources\"><h2>Sources</h2><ol start=\"0\">");
    for (size_t i = 0; i < rp->n; i++) {
        put(rp, "<li data-src=\"%zu\" data-file=\"", i);
        put_esc(rp, rp->runs[i].file);
        put(rp, "\">");
        put_esc(rp, rp->runs[i].file);
        put(rp, "</li>");
    }
    put(rp, "</ol></section><footer>Latencies follow vLLM's benchmark definitions (TTFT, TPOT, "
            "ITL, E2EL); throughput: output = completion tokens / wall time, prefill and decode "
            "= tokens / engine time spent on them. See schemas/metrics.schema.json.</footer>"
            "</main></body></html>\n");
}

static tm_rc write_out(const char *path, const tm_buf *b, tm_err *err) {
    tm_buf tmp = {0};
    tm_rc rc = tm_buf_printf(&tmp, err, "%s.tmp", path);
    if (rc)
        return rc;
    FILE *f = fopen(tmp.data, "wb");
    if (!f) {
        rc = TM_ERR(err, TM_E_IO, "%s: %s", tmp.data, strerror(errno));
    } else {
        size_t w = fwrite(b->data, 1, b->len, f);
        int bad = w != b->len;
        bad |= fclose(f) != 0;
        if (bad)
            rc = TM_ERR(err, TM_E_IO, "writing %s: %s", tmp.data, strerror(errno));
        else if (rename(tmp.data, path) != 0)
            rc = TM_ERR(err, TM_E_IO, "renaming %s to %s: %s", tmp.data, path, strerror(errno));
        if (rc)
            unlink(tmp.data);
    }
    tm_buf_fini(&tmp);
    return rc;
}

// The input that out is (the same file: device and inode, so links and other spellings of its
// path count too), or its temporary out.tmp is; NULL if none.
static const char *output_is_input(const report *rp, const char *out) {
    struct stat st[2];
    char tmp[4096];
    snprintf(tmp, sizeof(tmp), "%s.tmp", out);
    int have[2] = {stat(out, &st[0]) == 0, stat(tmp, &st[1]) == 0};
    for (size_t i = 0; i < rp->n_read; i++)
        for (int k = 0; k < 2; k++)
            if (have[k] && st[k].st_dev == rp->read[i].dev && st[k].st_ino == rp->read[i].ino)
                return rp->read[i].path;
    return NULL;
}

static void free_report(report *rp) {
    for (size_t i = 0; i < rp->n; i++) {
        json_decref(rp->runs[i].j);
        tm_free(rp->runs[i].file);
    }
    for (size_t i = 0; i < rp->n_read; i++)
        tm_free(rp->read_paths[i]);
    tm_free(rp->read_paths);
    tm_free(rp->read);
    tm_free(rp->runs);
    tm_free(rp->keys);
    tm_buf_fini(&rp->b);
}

static const char usage[] =
    "usage: tokenmill report [options] METRICS...\n"
    "\n"
    "Writes one self-contained HTML page (no scripts, no network) from metrics.json files: a card\n"
    "per run, SVG charts of throughput and latency over time, a table of all runs, and the\n"
    "regressions of each series' latest run against the run before it (same workload, backend\n"
    "and model). METRICS are files or folders; a folder contributes its *.json files and the\n"
    "metrics.json of each direct subfolder (a folder of nightly files is a history).\n"
    "\n"
    "options:\n"
    "  -o, --out FILE          output (default report.html)\n"
    "  --threshold PCT         how much worse counts as a regression (default 5)\n"
    "  --title TEXT            page title\n"
    "  --fail-on-regression    exit 3 when a latest run regressed\n"
    "  --strict                a metrics file that cannot be reported (not JSON, a field of the\n"
    "                          wrong type, no start time) is an error (exit 1); by default it is\n"
    "                          skipped with a warning that names the file and the field\n"
    "\n"
    "The output may not be one of the input files (exit 2).\n";

int tm_report_cmd(int argc, char **argv) {
    const char *out = "report.html";
    int fail_on_reg = 0;
    tm_err err = {0};
    report rp = {.threshold = 0.05, .title = "tokenmill throughput report", .err = &err};
    const char **inputs = tm_calloc(argc ? (size_t)argc : 1, sizeof(*inputs));
    size_t n_in = 0;
    if (!inputs) {
        fprintf(stderr, "tokenmill report: out of memory\n");
        return 1;
    }
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage, stdout);
            tm_free(inputs);
            return 0;
        } else if ((!strcmp(a, "-o") || !strcmp(a, "--out")) && v) {
            out = v, i++;
        } else if (!strcmp(a, "--threshold") && v) {
            char *end;
            rp.threshold = strtod(v, &end) / 100;
            if (*end || end == v || !(rp.threshold >= 0)) {
                fprintf(stderr, "tokenmill report: bad --threshold %s\n", v);
                tm_free(inputs);
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--title") && v) {
            rp.title = v, i++;
        } else if (!strcmp(a, "--fail-on-regression")) {
            fail_on_reg = 1;
        } else if (!strcmp(a, "--strict")) {
            rp.strict = 1;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "tokenmill report: bad option %s\n\n%s", a, usage);
            tm_free(inputs);
            return 2;
        } else {
            inputs[n_in++] = a;
        }
    }
    if (n_in == 0) {
        fputs(usage, stderr);
        tm_free(inputs);
        return 2;
    }
    tm_rc rc = TM_OK;
    for (size_t i = 0; !rc && i < n_in; i++)
        rc = is_dir(inputs[i]) ? load_dir(&rp, inputs[i], &err)
                               : load_file(&rp, inputs[i], 0, &err);
    if (!rc && rp.n == 0)
        rc = TM_ERR(&err, TM_E_INVAL, "no metrics files found in the arguments");
    const char *clash = rc ? NULL : output_is_input(&rp, out);
    if (clash) {
        fprintf(stderr, "tokenmill report: the output %s is the input %s; choose another -o\n", out,
                clash);
        free_report(&rp);
        tm_free(inputs);
        return 2;
    }
    if (!rc)
        rc = link_runs(&rp, &err);
    if (!rc) {
        build_page(&rp);
        rc = rp.rc;
    }
    if (!rc)
        rc = write_out(out, &rp.b, &err);
    int n_reg = 0;
    for (size_t i = 0; !rc && i < rp.n; i++)
        if (rp.runs[i].latest)
            n_reg += n_regressions(&rp, (int)i);
    if (!rc)
        printf(
            "tokenmill report: %s: %zu run%s, %zu series, %d regression%s in the latest runs%s\n",
            out, rp.n, rp.n == 1 ? "" : "s", rp.n_series, n_reg, n_reg == 1 ? "" : "s",
            rp.n_skipped ? " (some files skipped: see the warnings)" : "");
    else
        fprintf(stderr, "tokenmill report: %s\n", err.msg);
    free_report(&rp);
    tm_free(inputs);
    return rc ? 1 : fail_on_reg && n_reg ? 3 : 0;
}
