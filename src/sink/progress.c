/* sink/progress.c - status line, progress log lines and the Prometheus textfile. */
#include "sink/progress.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/buf.h"
#include "base/clock.h"
#include "base/fsutil.h"
#include "base/log.h"

#define BAR_EVERY_MS 200.0
#define TEXTFILE_EVERY_MS 1000.0
#define BAR_WIDTH 24

struct tm_progress {
    char *job_name;        /* owned */
    char *textfile;        /* owned, or NULL (also after the first write error) */
    tm_progress_mode mode; /* resolved: BAR, LINES or OFF */
    double interval_ms;
    FILE *out;                 /* borrowed */
    _Atomic uint64_t total_p1; /* total records + 1; 0 = not known yet */
    uint64_t n_done, n_failed, n_tok_prompt, n_tok_gen;
    int spec; /* a record drafted speculatively: the counters below are written */
    uint64_t n_spec_drafts, n_spec_draft_tok, n_spec_accepted; /* of the records done */
    double start_ms, start_unix_s;
    double last_draw_ms, last_line_ms, last_textfile_ms;
    int drawn;                                      /* BAR: something is on the line */
    int width;                                      /* cfg.width */
    const _Atomic uint64_t *live_gen, *live_prompt; /* tm_progress_set_live, or NULL */
    uint32_t max_tokens;                            /* tm_progress_set_max_tokens; 0 = not known */
    uint64_t n_earlier, n_earlier_failed;           /* tm_progress_set_earlier */
    tm_progress_kafka_fn kafka_fn;                  /* tm_progress_set_kafka, or NULL */
    void *kafka_ctx;
};

#define KPARTS_MAX 256 /* partitions shown (the line's sum and the textfile) */

void tm_progress_set_kafka(tm_progress *p, tm_progress_kafka_fn fn, void *ctx) {
    p->kafka_fn = fn;
    p->kafka_ctx = ctx;
}

// Sum of the known lags; -1 when none is known (or no Kafka input).
static int64_t kafka_lag_sum(const tm_progress *p) {
    if (!p->kafka_fn)
        return -1;
    tm_progress_kpart k[KPARTS_MAX];
    tm_progress_ktotals tot = {0};
    size_t n = p->kafka_fn(p->kafka_ctx, k, KPARTS_MAX, &tot);
    int64_t sum = -1;
    for (size_t i = 0; i < n && i < KPARTS_MAX; i++)
        if (k[i].lag >= 0)
            sum = (sum < 0 ? 0 : sum) + k[i].lag;
    return sum;
}

static double unix_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

tm_rc tm_progress_create(const tm_progress_cfg *cfg, tm_progress **out, tm_err *err) {
    tm_progress *p = tm_calloc(1, sizeof(*p));
    if (!p)
        return TM_ERR(err, TM_E_NOMEM, "progress");
    p->job_name = tm_strdup(cfg->job_name ? cfg->job_name : "job");
    p->textfile = cfg->textfile ? tm_strdup(cfg->textfile) : NULL;
    if (!p->job_name || (cfg->textfile && !p->textfile)) {
        tm_progress_destroy(p);
        return TM_ERR(err, TM_E_NOMEM, "progress");
    }
    p->out = cfg->out ? cfg->out : stderr;
    p->width = cfg->width;
    p->mode = cfg->mode;
    if (p->mode == TM_PROGRESS_AUTO) {
        if (tm_log_get_level() < TM_LOG_LEVEL_INFO)
            p->mode = TM_PROGRESS_OFF;
        else
            p->mode = isatty(fileno(p->out)) ? TM_PROGRESS_BAR : TM_PROGRESS_LINES;
    }
    p->interval_ms = (cfg->interval_s > 0 ? cfg->interval_s : 10.0) * 1e3;
    p->start_ms = tm_now_ms();
    p->start_unix_s = unix_now_s();
    p->last_draw_ms = p->last_line_ms = p->last_textfile_ms = p->start_ms;
    atomic_init(&p->total_p1, 0);
    *out = p;
    return TM_OK;
}

void tm_progress_destroy(tm_progress *p) {
    if (!p)
        return;
    tm_free(p->job_name);
    tm_free(p->textfile);
    tm_free(p);
}

void tm_progress_set_total(tm_progress *p, uint64_t n_records) {
    atomic_store(&p->total_p1, n_records + 1);
}

void tm_progress_set_live(tm_progress *p, const _Atomic uint64_t *n_tok_gen,
                          const _Atomic uint64_t *n_tok_prompt) {
    p->live_gen = n_tok_gen;
    p->live_prompt = n_tok_prompt;
}

void tm_progress_set_max_tokens(tm_progress *p, uint32_t max_tokens) { p->max_tokens = max_tokens; }

void tm_progress_set_earlier(tm_progress *p, uint64_t n_ok, uint64_t n_failed) {
    p->n_earlier = n_ok + n_failed;
    p->n_earlier_failed = n_failed;
}

void tm_progress_add_record(tm_progress *p, const tm_completion *c) {
    p->n_done++;
    if (c->released) // taken back by its source (counted as read): nothing else to count
        return;
    if (c->err_code != TM_ERRCODE_NONE) {
        p->n_failed++;
        return;
    }
    p->n_tok_prompt += c->n_tok_prompt;
    p->n_tok_gen += c->n_tok_gen;
    p->spec |= c->spec;
    p->n_spec_drafts += c->n_spec_drafts;
    p->n_spec_draft_tok += c->n_spec_draft_tok;
    p->n_spec_accepted += c->n_spec_accepted;
}

// "812", "4.9k", "1.25M"
static void fmt_count(double x, char *buf, size_t n) {
    if (x < 1e4)
        snprintf(buf, n, "%.0f", x);
    else if (x < 1e6)
        snprintf(buf, n, "%.1fk", x / 1e3);
    else if (x < 1e9)
        snprintf(buf, n, "%.2fM", x / 1e6);
    else
        snprintf(buf, n, "%.2fG", x / 1e9);
}

// "45s", "3m12s", "2h05m"
static void fmt_duration(double s, char *buf, size_t n) {
    long t = (long)(s + 0.5);
    if (t < 60)
        snprintf(buf, n, "%lds", t);
    else if (t < 3600)
        snprintf(buf, n, "%ldm%02lds", t / 60, t % 60);
    else
        snprintf(buf, n, "%ldh%02ldm", t / 3600, (t % 3600) / 60);
}

typedef struct snapshot {
    int total_known;
    uint64_t total;
    double tok_gen; /* generated so far (live: unfinished records too) */
    double elapsed_s, out_tok_s, all_tok_s;
    int eta_known;
    double eta_s, eta_tok;
} snapshot;

static snapshot take(const tm_progress *p, double now_ms) {
    snapshot s = {0};
    uint64_t t = atomic_load(&((tm_progress *)p)->total_p1);
    s.total_known = t != 0;
    s.total = t ? t - 1 : 0;
    s.elapsed_s = (now_ms - p->start_ms) / 1e3;
    uint64_t n_tok = p->n_tok_prompt + p->n_tok_gen; // of the finished records
    double gen = (double)p->n_tok_gen, done_tok = (double)n_tok;
    if (p->live_gen) { // tokens as computed, finished or not (never less than the finished ones)
        gen = TM_MAX(gen, (double)atomic_load_explicit(p->live_gen, memory_order_relaxed));
        double all = gen + (double)atomic_load_explicit(p->live_prompt, memory_order_relaxed);
        done_tok = TM_MAX(done_tok, all);
    }
    s.tok_gen = gen;
    if (s.elapsed_s > 0) {
        s.out_tok_s = gen / s.elapsed_s;
        s.all_tok_s = done_tok / s.elapsed_s;
    }
    // ETA in tokens: the tokens still to come over the token rate so far. Each record not done
    // (in flight, or not yet admitted) is expected to take the mean prompt + completion tokens of
    // the records that succeeded, its completion bounded by max_tokens; before any succeeded
    // (failed records have no tokens to learn from), max_tokens. The tokens the records in flight
    // have computed already are taken off, and each record left counts at least one token, so the
    // ETA is never 0 while work remains.
    uint64_t n_ok = p->n_done - p->n_failed;
    uint64_t done_all = p->n_done + p->n_earlier;
    if (s.total_known && s.all_tok_s > 0 && s.total >= done_all && (n_ok > 0 || p->max_tokens)) {
        double left = (double)(s.total - done_all);
        double gen_each = n_ok ? (double)p->n_tok_gen / (double)n_ok : (double)p->max_tokens;
        if (p->max_tokens)
            gen_each = TM_MIN(gen_each, (double)p->max_tokens);
        double prompt_each = n_ok ? (double)p->n_tok_prompt / (double)n_ok : 0.0;
        double in_flight = TM_MAX(done_tok - (double)n_tok, 0.0); // 0 without live counters
        s.eta_known = 1;
        s.eta_tok = TM_MAX(left * (gen_each + prompt_each) - in_flight, left);
        s.eta_s = s.eta_tok / s.all_tok_s;
    }
    return s;
}

const char *tm_progress_format(const tm_progress *p, double now_ms, char *buf, size_t n) {
    snapshot s = take(p, now_ms);
    char a[32], b[32], c[32], d[32], e[32];
    int len;
    // Records: the whole job's (a resumed job's earlier runs included, and said so); rates and
    // tokens: this run's.
    uint64_t done = p->n_done + p->n_earlier, failed = p->n_failed + p->n_earlier_failed;
    if (s.total_known)
        len = snprintf(buf, n, "%llu/%llu records (%.1f%%)", (unsigned long long)done,
                       (unsigned long long)s.total,
                       s.total ? 100.0 * (double)done / (double)s.total : 100.0);
    else
        len = snprintf(buf, n, "%llu records", (unsigned long long)done);
    if (failed && len >= 0 && (size_t)len < n)
        len += snprintf(buf + len, n - (size_t)len, ", %llu failed", (unsigned long long)failed);
    if (p->n_earlier && len >= 0 && (size_t)len < n)
        len += snprintf(buf + len, n - (size_t)len, " (%llu by earlier runs)",
                        (unsigned long long)p->n_earlier);
    fmt_count(s.out_tok_s, a, sizeof(a));
    fmt_count(s.all_tok_s, b, sizeof(b));
    fmt_duration(s.elapsed_s, e, sizeof(e));
    if (len >= 0 && (size_t)len < n)
        len += snprintf(buf + len, n - (size_t)len, " | %s tok/s out, %s tok/s in+out | %s", a, b,
                        e);
    if (p->live_gen && len >= 0 && (size_t)len < n) {
        fmt_count(s.tok_gen, d, sizeof(d));
        len += snprintf(buf + len, n - (size_t)len, " | %s tok out", d);
    }
    int64_t lag = kafka_lag_sum(p);
    if (lag >= 0 && len >= 0 && (size_t)len < n)
        len += snprintf(buf + len, n - (size_t)len, " | lag %lld", (long long)lag);
    if (s.eta_known && len >= 0 && (size_t)len < n) {
        fmt_duration(s.eta_s, c, sizeof(c));
        fmt_count(s.eta_tok, d, sizeof(d));
        snprintf(buf + len, n - (size_t)len, " | ETA %s (~%s tok left)", c, d);
    }
    return buf;
}

// Columns of the terminal out is (else $COLUMNS, else 80); a stream that is not a terminal does
// not wrap, so it gets the whole line.
static int term_width(FILE *out) {
    struct winsize ws;
    if (ioctl(fileno(out), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0)
        return ws.ws_col;
    if (!isatty(fileno(out)))
        return 1 << 20;
    const char *c = getenv("COLUMNS");
    int w = c ? atoi(c) : 0;
    return w > 0 ? w : 80;
}

const char *tm_progress_bar_line(const tm_progress *p, double now_ms, int width, int final,
                                 char *buf, size_t n) {
    char line[256], bar[BAR_WIDTH + 3];
    tm_progress_format(p, now_ms, line, sizeof(line));
    uint64_t t = atomic_load(&((tm_progress *)p)->total_p1);
    bar[0] = '\0';
    if (t > 1) {
        uint64_t total = t - 1;
        int fill = (int)((double)BAR_WIDTH * (double)TM_MIN(p->n_done + p->n_earlier, total) /
                         (double)total);
        bar[0] = '[';
        for (int i = 0; i < BAR_WIDTH; i++)
            bar[1 + i] = i < fill ? '#' : '.';
        bar[BAR_WIDTH + 1] = ']';
        bar[BAR_WIDTH + 2] = '\0';
    }
    // At most width - 1 columns (the last column would wrap on some terminals): the bar goes
    // first, then the status is cut. All of it is ASCII, one column per byte.
    size_t room = width > 1 ? (size_t)width - 1 : 1;
    if (bar[0] && strlen(bar) + 1 + strlen(line) > room)
        bar[0] = '\0';
    if (strlen(line) > room)
        line[room] = '\0';
    // \r back to the start of the line, ESC[K clears what a longer earlier line left
    snprintf(buf, n, "\r\033[K%s%s%s%s", bar, bar[0] ? " " : "", line, final ? "\n" : "");
    return buf;
}

static void draw_bar(tm_progress *p, double now_ms, int final) {
    char buf[320];
    int width = p->width > 0 ? p->width : term_width(p->out);
    fputs(tm_progress_bar_line(p, now_ms, width, final, buf, sizeof(buf)), p->out);
    fflush(p->out);
    p->drawn = !final;
}

// Prometheus label value: backslash, double quote and newline escaped.
static tm_rc append_label(tm_buf *b, const char *v, tm_err *err) {
    tm_rc rc = TM_OK;
    for (const char *s = v; *s && !rc; s++) {
        if (*s == '\\' || *s == '"')
            rc = tm_buf_printf(b, err, "\\%c", *s);
        else if (*s == '\n')
            rc = tm_buf_append_str(b, "\\n", err);
        else
            rc = tm_buf_printf(b, err, "%c", *s);
    }
    return rc;
}

// One metric: a counter (a count that only grows while the job runs; its name ends in _total, as
// Prometheus' naming rules and promtool check metrics require) or a gauge (anything else).
static tm_rc metric(tm_buf *b, const tm_progress *p, const char *name, const char *help, double v,
                    tm_err *err) {
    size_t n = strlen(name);
    bool counter = n > 6 && strcmp(name + n - 6, "_total") == 0;
    tm_rc rc = tm_buf_printf(b, err, "# HELP %s %s\n# TYPE %s %s\n%s{job=\"", name, help, name,
                             counter ? "counter" : "gauge", name);
    if (!rc)
        rc = append_label(b, p->job_name, err);
    if (!rc)
        rc = tm_buf_printf(b, err, "\"} %.17g\n", v);
    return rc;
}

// tokenmill_kafka_lag, tokenmill_kafka_committed_offset and tokenmill_kafka_read_ahead per topic
// and partition (known ones), then the consumer's counters.
static tm_rc kafka_metrics(tm_buf *b, const tm_progress *p, tm_err *err) {
    tm_progress_kpart k[KPARTS_MAX];
    tm_progress_ktotals tot = {0};
    size_t n = p->kafka_fn(p->kafka_ctx, k, KPARTS_MAX, &tot);
    if (n > KPARTS_MAX)
        n = KPARTS_MAX;
    static const char *const names[3] = {"tokenmill_kafka_lag", "tokenmill_kafka_committed_offset",
                                         "tokenmill_kafka_read_ahead"};
    static const char *const helps[3] = {
        "Records of an assigned input partition not yet committed by this consumer (high "
        "watermark - committed offset).",
        "The offset this consumer last committed for an assigned input partition.",
        "Records of an assigned input partition read and handed to the runner, not yet durable "
        "(input.kafka.max_read_ahead bounds it)."};
    tm_rc rc = TM_OK;
    for (int m = 0; m < 3 && !rc; m++) {
        rc = tm_buf_printf(b, err, "# HELP %s %s\n# TYPE %s gauge\n", names[m], helps[m], names[m]);
        for (size_t i = 0; i < n && !rc; i++) {
            int64_t v = m == 0 ? k[i].lag : m == 1 ? k[i].committed : (int64_t)k[i].read_ahead;
            if (v < 0)
                continue;
            rc = tm_buf_printf(b, err, "%s{job=\"", names[m]);
            if (!rc)
                rc = append_label(b, p->job_name, err);
            if (!rc)
                rc = tm_buf_append_str(b, "\",topic=\"", err);
            if (!rc)
                rc = append_label(b, k[i].topic, err);
            if (!rc)
                rc = tm_buf_printf(b, err, "\",partition=\"%d\"} %lld\n", (int)k[i].partition,
                                   (long long)v);
        }
    }
    if (!rc)
        rc = metric(b, p, "tokenmill_kafka_offset_commits_total",
                    "Offset commits of the input's consumer that the brokers accepted.",
                    (double)tot.commits, err);
    if (!rc)
        rc = metric(b, p, "tokenmill_kafka_errors_total",
                    "Offset commits of the input's consumer that failed or were not answered, and "
                    "its librdkafka errors (broker and transport errors included).",
                    (double)tot.errors, err);
    if (!rc)
        rc = metric(b, p, "tokenmill_kafka_released_total",
                    "Records released at rebalances before they started (their partition's next "
                    "owner answers them).",
                    (double)tot.released, err);
    return rc;
}

tm_rc tm_progress_write_textfile(const tm_progress *p, double now_ms, int finished, tm_err *err) {
    if (!p->textfile)
        return TM_OK;
    snapshot s = take(p, now_ms);
    tm_buf b = {0};
    tm_rc rc = metric(&b, p, "tokenmill_records_done_total",
                      "Records finished so far (ok or failed).", (double)(p->n_done + p->n_earlier),
                      err);
    if (!rc)
        rc = metric(&b, p, "tokenmill_records_failed_total",
                    "Records that ended in an error record.",
                    (double)(p->n_failed + p->n_earlier_failed), err);
    if (!rc && s.total_known)
        rc = metric(&b, p, "tokenmill_records_in_job",
                    "Records in the job (known once the input has been read to its end).",
                    (double)s.total, err);
    if (!rc)
        rc = metric(&b, p, "tokenmill_prompt_tokens_total", "Prompt tokens of the records done.",
                    (double)p->n_tok_prompt, err);
    if (!rc)
        rc = metric(&b, p, "tokenmill_completion_tokens_total",
                    "Tokens generated for the records done.", (double)p->n_tok_gen, err);
    if (!rc)
        rc = metric(&b, p, "tokenmill_output_tokens_per_second",
                    "Generated tokens per second since the job started.", s.out_tok_s, err);
    if (!rc && s.eta_known)
        rc = metric(&b, p, "tokenmill_eta_seconds",
                    "Estimated seconds left: tokens still to come over the token rate so far.",
                    s.eta_s, err);
    if (!rc && p->spec) // speculative decoding (engine.speculative), vLLM's counters
        rc = metric(&b, p, "tokenmill_spec_decode_num_drafts_total",
                    "Speculative verifications (sequence-steps with drafts) of the records done.",
                    (double)p->n_spec_drafts, err);
    if (!rc && p->spec)
        rc = metric(&b, p, "tokenmill_spec_decode_num_draft_tokens_total",
                    "Draft tokens verified for the records done.", (double)p->n_spec_draft_tok,
                    err);
    if (!rc && p->spec)
        rc = metric(&b, p, "tokenmill_spec_decode_num_accepted_tokens_total",
                    "Draft tokens accepted for the records done.", (double)p->n_spec_accepted, err);
    if (!rc && p->kafka_fn)
        rc = kafka_metrics(&b, p, err);
    if (!rc)
        rc = metric(&b, p, "tokenmill_job_start_time_seconds",
                    "When the job started, seconds since the Unix epoch.", p->start_unix_s, err);
    if (!rc)
        rc = metric(&b, p, "tokenmill_job_finished", "1 once the job has ended, else 0.",
                    finished ? 1 : 0, err);
    if (!rc)
        rc = metric(&b, p, "tokenmill_last_update_time_seconds",
                    "When this file was written, seconds since the Unix epoch.", unix_now_s(), err);
    // Atomic for the collector: write a temporary name it ignores (not *.prom), then rename. A
    // gauge file: no fsync, and not one of the commit protocol's hooked steps (fsutil.h).
    const char *parts[] = {b.data};
    if (!rc)
        rc = tm_fs_replace(p->textfile, parts, 1,
                           &(tm_fs_replace_opts){.mode = 0644, .hooks = TM_FS_HOOKS_OFF}, err);
    tm_buf_fini(&b);
    return rc;
}

static void textfile_now(tm_progress *p, double now_ms, int finished) {
    tm_err err = {0};
    p->last_textfile_ms = now_ms;
    if (tm_progress_write_textfile(p, now_ms, finished, &err) != TM_OK) {
        TM_LOG_WARN("progress", "%s: Prometheus textfile: %s (not written again)", p->job_name,
                    err.msg);
        tm_free(p->textfile);
        p->textfile = NULL;
    }
}

void tm_progress_tick(tm_progress *p) {
    double now = tm_now_ms();
    if (p->mode == TM_PROGRESS_BAR && now - p->last_draw_ms >= BAR_EVERY_MS) {
        p->last_draw_ms = now;
        draw_bar(p, now, 0);
    }
    if (p->mode == TM_PROGRESS_LINES && now - p->last_line_ms >= p->interval_ms) {
        char line[256];
        p->last_line_ms = now;
        TM_LOG_INFO("progress", "%s: %s", p->job_name,
                    tm_progress_format(p, now, line, sizeof(line)));
    }
    if (p->textfile && now - p->last_textfile_ms >= TEXTFILE_EVERY_MS)
        textfile_now(p, now, 0);
}

void tm_progress_finish(tm_progress *p) {
    double now = tm_now_ms();
    if (p->mode == TM_PROGRESS_BAR)
        draw_bar(p, now, 1);
    if (p->textfile)
        textfile_now(p, now, 1);
}
