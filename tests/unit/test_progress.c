/* tests/unit/test_progress.c - live progress: the status text (records done/total, failures, tok/s,
 * ETA in tokens) at chosen times, the bar on a stream, progress log lines, the Prometheus textfile
 * (format, label escaping, atomic replace, finished flag), a textfile error that disables it with
 * one warning, live token counters of unfinished records (rates, tokens out, ETA) and the bar
 * clipped to 80 and 160 columns, Kafka figures on the line (lag N) and in the textfile, and
 * allocation failures in create. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/log.h"
#include "sink/progress.h"
#include "tm_test.h"

static char g_tmp[256];

static void add(tm_progress *p, uint32_t prompt, uint32_t gen, int failed) {
    tm_completion c = {.n_tok_prompt = prompt,
                       .n_tok_gen = gen,
                       .err_code = failed ? TM_ERRCODE_INVALID_JSON : TM_ERRCODE_NONE};
    tm_progress_add_record(p, &c);
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    static char buf[8192];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static void test_format(void) {
    tm_progress *p = NULL;
    tm_err err = {0};
    TM_CHECK_OK(
        tm_progress_create(&(tm_progress_cfg){.job_name = "j", .mode = TM_PROGRESS_OFF}, &p, &err),
        &err);
    if (!p)
        return;
    double t0 = tm_now_ms();
    char line[256];
    // nothing done, total unknown
    tm_progress_format(p, t0 + 1000, line, sizeof(line));
    TM_CHECK_MSG(strstr(line, "0 records | 0 tok/s out") == line, "%s", line);
    TM_CHECK(strstr(line, "ETA") == NULL);
    // 4 records of 100 prompt + 150 generated, one failure, after 10 s (approximately: t0 is
    // taken just after create)
    for (int i = 0; i < 4; i++)
        add(p, 100, 150, 0);
    add(p, 0, 0, 1);
    tm_progress_format(p, t0 + 10000, line, sizeof(line));
    TM_CHECK_MSG(strstr(line, "5 records, 1 failed | 60 tok/s out, 100 tok/s in+out | 10s") == line,
                 "%s", line);
    // total known: 20 records, 15 left at 1000/4 = 250 tokens each (the mean of the records that
    // succeeded: a failed one has no tokens to learn from) = 3750 tokens at 100 tok/s
    tm_progress_set_total(p, 20);
    tm_progress_format(p, t0 + 10000, line, sizeof(line));
    TM_CHECK_MSG(strstr(line, "5/20 records (25.0%), 1 failed") == line, "%s", line);
    TM_CHECK_MSG(strstr(line, "| ETA 38s (~3750 tok left)") != NULL, "%s", line);
    // large numbers are shortened, durations in minutes/hours
    for (int i = 0; i < 5; i++)
        add(p, 100000, 200000, 0);
    tm_progress_format(p, t0 + 100000, line, sizeof(line));
    TM_CHECK_MSG(strstr(line, "10/20 records (50.0%)") == line, "%s", line);
    TM_CHECK_MSG(strstr(line, "10.0k tok/s out") != NULL, "%s", line);
    // 10 left at 1,501,000 / 9 tokens each = 1.67M at 15,010 tok/s
    TM_CHECK_MSG(strstr(line, "| 1m40s | ETA 1m51s (~1.67M tok left)") != NULL, "%s", line);
    tm_progress_destroy(p);
}

// Issue 36: 3 rejected lines done, 3 records of up to 300 tokens left (one in flight with 105
// tokens computed, two not yet admitted): the ETA counts them all at max_tokens, never 0.
static void test_eta_unadmitted(void) {
    tm_progress *p = NULL;
    tm_err err = {0};
    TM_CHECK_OK(
        tm_progress_create(&(tm_progress_cfg){.job_name = "j", .mode = TM_PROGRESS_OFF}, &p, &err),
        &err);
    if (!p)
        return;
    _Atomic uint64_t gen = 0, prompt = 0;
    tm_progress_set_live(p, &gen, &prompt);
    tm_progress_set_total(p, 6);
    double t0 = tm_now_ms();
    char line[256];
    for (int i = 0; i < 3; i++)
        add(p, 0, 0, 1);
    atomic_store(&gen, 100);
    atomic_store(&prompt, 5);
    tm_progress_format(p, t0 + 1000, line, sizeof(line));
    TM_CHECK_MSG(strstr(line, "ETA") == NULL, "%s", line); // no record ok, no max_tokens: unknown
    tm_progress_set_max_tokens(p, 300);
    tm_progress_format(p, t0 + 1000, line, sizeof(line));
    TM_CHECK_MSG(strstr(line, "3/6 records (50.0%), 3 failed") == line, "%s", line);
    TM_CHECK_MSG(strstr(line, "| ETA 8s (~795 tok left)") != NULL, "%s", line); // 900 - 105
    // the one in flight went past the estimate: still at least one token per record left
    atomic_store(&gen, 5000);
    tm_progress_format(p, t0 + 1000, line, sizeof(line));
    TM_CHECK_MSG(strstr(line, "(~3 tok left)") != NULL, "%s", line);
    tm_progress_destroy(p);
}

static void test_bar(void) {
    char path[512];
    snprintf(path, sizeof(path), "%s/bar.txt", g_tmp);
    FILE *f = fopen(path, "w+");
    TM_CHECK(f != NULL);
    if (!f)
        return;
    tm_progress *p = NULL;
    tm_err err = {0};
    TM_CHECK_OK(tm_progress_create(&(tm_progress_cfg){.mode = TM_PROGRESS_BAR, .out = f}, &p, &err),
                &err);
    if (!p) {
        fclose(f);
        return;
    }
    tm_progress_set_total(p, 4);
    add(p, 10, 10, 0);
    usleep(210 * 1000); // past the redraw interval
    tm_progress_tick(p);
    add(p, 10, 10, 0);
    tm_progress_tick(p); // too soon: nothing drawn
    add(p, 10, 10, 0);
    add(p, 10, 10, 0);
    tm_progress_finish(p);
    tm_progress_destroy(p);
    fclose(f);
    const char *s = slurp(path);
    TM_CHECK(s != NULL);
    if (!s)
        return;
    TM_CHECK_MSG(strncmp(s, "\r\033[K[######..................] 1/4 records (25.0%)", 50) == 0,
                 "%s", s);
    TM_CHECK(strstr(s, "2/4") == NULL);
    TM_CHECK_MSG(strstr(s, "\r\033[K[########################] 4/4 records (100.0%)") != NULL, "%s",
                 s);
    TM_CHECK(s[strlen(s) - 1] == '\n');
}

typedef struct captured {
    int n_info, n_warn;
    char last[512];
} captured;

static void capture(tm_log_level level, const char *line, void *ud) {
    captured *c = ud;
    c->n_info += level == TM_LOG_LEVEL_INFO;
    c->n_warn += level == TM_LOG_LEVEL_WARN;
    snprintf(c->last, sizeof(c->last), "%s", line);
}

static void test_lines(void) {
    captured cap = {0};
    tm_log_level old = tm_log_get_level();
    tm_log_set_level(TM_LOG_LEVEL_INFO);
    tm_log_set_sink(capture, &cap);
    tm_progress *p = NULL;
    tm_err err = {0};
    TM_CHECK_OK(tm_progress_create(&(tm_progress_cfg){.job_name = "jobs/a.json",
                                                      .mode = TM_PROGRESS_LINES,
                                                      .interval_s = 0.05},
                                   &p, &err),
                &err);
    if (p) {
        add(p, 5, 5, 0);
        tm_progress_tick(p); // too soon
        TM_CHECK(cap.n_info == 0);
        usleep(60 * 1000);
        tm_progress_tick(p);
        TM_CHECK(cap.n_info == 1);
        TM_CHECK_MSG(strstr(cap.last, "progress: jobs/a.json: 1 records | ") != NULL, "%s",
                     cap.last);
        tm_progress_finish(p); // LINES: the job's own summary follows; no extra line
        TM_CHECK(cap.n_info == 1);
    }
    tm_progress_destroy(p);
    // AUTO below level info: nothing at all
    tm_log_set_level(TM_LOG_LEVEL_WARN);
    p = NULL;
    TM_CHECK_OK(tm_progress_create(&(tm_progress_cfg){.interval_s = 0.001}, &p, &err), &err);
    if (p) {
        usleep(5 * 1000);
        tm_progress_tick(p);
        tm_progress_finish(p);
    }
    tm_progress_destroy(p);
    TM_CHECK(cap.n_info == 1 && cap.n_warn == 0);
    tm_log_set_sink(NULL, NULL);
    tm_log_set_level(old);
}

static void test_textfile(void) {
    char path[512], tmp_path[600];
    snprintf(path, sizeof(path), "%s/tokenmill.prom", g_tmp);
    snprintf(tmp_path, sizeof(tmp_path), "%s.tmp", path);
    tm_progress *p = NULL;
    tm_err err = {0};
    TM_CHECK_OK(tm_progress_create(&(tm_progress_cfg){.job_name = "a \"b\"\\c\nd",
                                                      .textfile = path,
                                                      .mode = TM_PROGRESS_OFF},
                                   &p, &err),
                &err);
    if (!p)
        return;
    add(p, 100, 50, 0);
    add(p, 0, 0, 1);
    TM_CHECK_OK(tm_progress_write_textfile(p, tm_now_ms(), 0, &err), &err);
    const char *s = slurp(path);
    TM_CHECK(s != NULL);
    TM_CHECK(access(tmp_path, F_OK) != 0);
    if (s) {
        const char *label = "{job=\"a \\\"b\\\"\\\\c\\nd\"}";
        char want[256];
        snprintf(want, sizeof(want), "tokenmill_records_done_total%s 2\n", label);
        TM_CHECK_MSG(strstr(s, want) != NULL, "%s", s);
        snprintf(want, sizeof(want), "tokenmill_records_failed_total%s 1\n", label);
        TM_CHECK(strstr(s, want) != NULL);
        snprintf(want, sizeof(want), "tokenmill_completion_tokens_total%s 50\n", label);
        TM_CHECK(strstr(s, want) != NULL);
        snprintf(want, sizeof(want), "tokenmill_job_finished%s 0\n", label);
        TM_CHECK(strstr(s, want) != NULL);
        TM_CHECK(strstr(s, "# TYPE tokenmill_records_done_total counter\n") != NULL);
        TM_CHECK(strstr(s, "# HELP tokenmill_output_tokens_per_second ") != NULL);
        TM_CHECK(strstr(s, "# TYPE tokenmill_output_tokens_per_second gauge\n") != NULL);
        TM_CHECK(strstr(s, "tokenmill_records_in_job") == NULL); // not known yet
        TM_CHECK(strstr(s, "tokenmill_eta_seconds") == NULL);
        // every sample line: name{job="..."} value
        int n_samples = 0;
        for (const char *l = s; *l; l = strchr(l, '\n') + 1) {
            if (*l != '#') {
                n_samples++;
                TM_CHECK(strncmp(l, "tokenmill_", 10) == 0 && strstr(l, label) != NULL);
            }
            if (!strchr(l, '\n'))
                break;
        }
        TM_CHECK(n_samples == 8);
    }
    tm_progress_set_total(p, 4);
    tm_progress_finish(p);
    s = slurp(path);
    TM_CHECK(s && strstr(s, "tokenmill_records_in_job{") && strstr(s, "tokenmill_eta_seconds{"));
    TM_CHECK(s && strstr(s, "tokenmill_job_finished{job=\"a \\\"b\\\"\\\\c\\nd\"} 1\n"));
    tm_progress_destroy(p);

    // An unwritable textfile: one warning, then it is left alone; the job is not affected.
    captured cap = {0};
    tm_log_set_sink(capture, &cap);
    p = NULL;
    TM_CHECK_OK(tm_progress_create(&(tm_progress_cfg){.textfile = "/nonexistent-dir/x.prom",
                                                      .mode = TM_PROGRESS_OFF},
                                   &p, &err),
                &err);
    if (p) {
        TM_CHECK(tm_progress_write_textfile(p, tm_now_ms(), 0, &err) == TM_E_IO);
        tm_progress_finish(p);
        tm_progress_finish(p);
    }
    tm_progress_destroy(p);
    tm_log_set_sink(NULL, NULL);
    TM_CHECK(cap.n_warn == 1);
}

// Kafka figures (issue 39): a fake consumer with two partitions (one lag unknown) and counters.
// The status line shows "lag N" (the sum of the known lags; none without a Kafka input) and the
// textfile, the job's periodic snapshot, has the per-partition lag, committed offset and
// read-ahead depth and the commits, errors and released counters.
static size_t fake_kafka(void *ctx, tm_progress_kpart *out, size_t cap, tm_progress_ktotals *tot) {
    const int *lag1 = ctx;
    const tm_progress_kpart k[3] = {
        {.topic = "jobs", .partition = 0, .committed = 40, .lag = 7, .read_ahead = 5},
        {.topic = "jobs", .partition = 1, .committed = -1, .lag = *lag1, .read_ahead = 0},
        {.topic = "t\"x", .partition = 3, .committed = 12, .lag = 30, .read_ahead = 9}};
    for (size_t i = 0; i < 3 && i < cap; i++)
        out[i] = k[i];
    *tot = (tm_progress_ktotals){.commits = 17, .errors = 2, .released = 6};
    return 3;
}

static void test_kafka(void) {
    char path[512];
    snprintf(path, sizeof(path), "%s/kafka.prom", g_tmp);
    tm_progress *p = NULL;
    tm_err err = {0};
    TM_CHECK_OK(tm_progress_create(
                    &(tm_progress_cfg){.job_name = "k", .textfile = path, .mode = TM_PROGRESS_OFF},
                    &p, &err),
                &err);
    if (!p)
        return;
    char line[256];
    double t0 = tm_now_ms();
    tm_progress_format(p, t0 + 1000, line, sizeof(line));
    TM_CHECK_MSG(strstr(line, "lag") == NULL, "%s", line); // no Kafka input: no lag
    int lag1 = -1;
    tm_progress_set_kafka(p, fake_kafka, &lag1);
    add(p, 10, 5, 0);
    tm_progress_format(p, t0 + 1000, line, sizeof(line));
    TM_CHECK_MSG(strstr(line, " | lag 37") != NULL, "%s", line); // 7 + 30, the unknown one left out
    lag1 = 100;
    tm_progress_format(p, t0 + 1000, line, sizeof(line));
    TM_CHECK_MSG(strstr(line, " | lag 137") != NULL, "%s", line);
    TM_CHECK_OK(tm_progress_write_textfile(p, tm_now_ms(), 0, &err), &err);
    const char *s = slurp(path);
    TM_CHECK(s != NULL);
    static const char *const want[] = {
        "tokenmill_kafka_lag{job=\"k\",topic=\"jobs\",partition=\"0\"} 7\n",
        "tokenmill_kafka_lag{job=\"k\",topic=\"jobs\",partition=\"1\"} 100\n",
        "tokenmill_kafka_lag{job=\"k\",topic=\"t\\\"x\",partition=\"3\"} 30\n",
        "tokenmill_kafka_committed_offset{job=\"k\",topic=\"jobs\",partition=\"0\"} 40\n",
        "tokenmill_kafka_committed_offset{job=\"k\",topic=\"t\\\"x\",partition=\"3\"} 12\n",
        "tokenmill_kafka_read_ahead{job=\"k\",topic=\"jobs\",partition=\"0\"} 5\n",
        "tokenmill_kafka_read_ahead{job=\"k\",topic=\"jobs\",partition=\"1\"} 0\n",
        "tokenmill_kafka_read_ahead{job=\"k\",topic=\"t\\\"x\",partition=\"3\"} 9\n",
        "# TYPE tokenmill_kafka_read_ahead gauge\n",
        "# TYPE tokenmill_kafka_offset_commits_total counter\n",
        "tokenmill_kafka_offset_commits_total{job=\"k\"} 17\n",
        "# TYPE tokenmill_kafka_errors_total counter\n",
        "tokenmill_kafka_errors_total{job=\"k\"} 2\n",
        "tokenmill_kafka_released_total{job=\"k\"} 6\n",
    };
    for (size_t i = 0; s && i < sizeof(want) / sizeof(want[0]); i++)
        TM_CHECK_MSG(strstr(s, want[i]) != NULL, "no %s in\n%s", want[i], s);
    // an unknown committed offset is left out, not written as -1
    TM_CHECK(
        s &&
        !strstr(s, "tokenmill_kafka_committed_offset{job=\"k\",topic=\"jobs\",partition=\"1\"}"));
    tm_progress_destroy(p);
}

static void test_alloc_faults(void) {
    long base = tm_alloc_live();
    for (long k = 1; k < 100; k++) {
        tm_progress *p = NULL;
        tm_err err = {0};
        tm_fault_set(TM_FAULT_ALLOC, k);
        tm_rc rc = tm_progress_create(
            &(tm_progress_cfg){.job_name = "j", .textfile = "/tmp/x.prom", .mode = TM_PROGRESS_OFF},
            &p, &err);
        tm_fault_set(TM_FAULT_ALLOC, 0);
        tm_progress_destroy(p);
        TM_CHECK(tm_alloc_live() == base);
        if (!rc)
            break;
        TM_CHECK(rc == TM_E_NOMEM);
    }
}

// Live counters: tokens of unfinished records count in the rates, "tok out" and the ETA.
static void test_live(void) {
    tm_progress *p = NULL;
    tm_err err = {0};
    TM_CHECK_OK(
        tm_progress_create(&(tm_progress_cfg){.job_name = "j", .mode = TM_PROGRESS_OFF}, &p, &err),
        &err);
    if (!p)
        return;
    _Atomic uint64_t gen = 0, prompt = 0;
    tm_progress_set_live(p, &gen, &prompt);
    tm_progress_set_total(p, 2);
    double t0 = tm_now_ms();
    char line[256];
    // two long records in flight, none finished: 1150 tokens generated, 50 prompt tokens in 10 s
    atomic_store(&gen, 1150);
    atomic_store(&prompt, 50);
    tm_progress_format(p, t0 + 10000, line, sizeof(line));
    TM_CHECK_MSG(strstr(line, "0/2 records (0.0%) | 115 tok/s out, 120 tok/s in+out | 10s | "
                              "1150 tok out") == line,
                 "%s", line);
    TM_CHECK(strstr(line, "ETA") == NULL); // no record done: no size known yet
    // one finishes (25 prompt + 1000 generated); the other has 300 generated so far: the job is
    // ~2 x 1025 tokens, 1375 computed, 675 left at 1375 / 11 s = 125 tok/s
    add(p, 25, 1000, 0);
    atomic_store(&gen, 1300);
    atomic_store(&prompt, 75);
    tm_progress_format(p, t0 + 11000, line, sizeof(line));
    TM_CHECK_MSG(strstr(line, "1/2 records (50.0%) | 118 tok/s out, 125 tok/s in+out | 11s | "
                              "1300 tok out | ETA 5s (~675 tok left)") == line,
                 "%s", line);
    // the bar at 80 and 160 columns: never longer than width - 1, the bar dropped first
    char buf[320];
    for (int w = 80; w <= 160; w += 80) {
        tm_progress_bar_line(p, t0 + 11000, w, 0, buf, sizeof(buf));
        TM_CHECK(strncmp(buf, "\r\033[K", 4) == 0);
        TM_CHECK_MSG(strlen(buf + 4) <= (size_t)w - 1, "%d: %zu", w, strlen(buf + 4));
        TM_CHECK(strchr(buf, '\n') == NULL);
        TM_CHECK_MSG(strstr(buf, "1/2 records (50.0%)") != NULL, "%s", buf);
        TM_CHECK_MSG((strstr(buf, "[############............]") != NULL) == (w == 160), "%d %s", w,
                     buf);
    }
    tm_progress_bar_line(p, t0 + 11000, 160, 1, buf, sizeof(buf));
    TM_CHECK(buf[strlen(buf) - 1] == '\n' && strstr(buf, "ETA 5s (~675 tok left)"));
    tm_progress_bar_line(p, t0 + 11000, 20, 0, buf, sizeof(buf));
    TM_CHECK_MSG(strcmp(buf + 4, "1/2 records (50.0%)") == 0, "%s", buf + 4); // 19 columns
    tm_progress_destroy(p);
}

int main(void) {
    snprintf(g_tmp, sizeof(g_tmp), "/tmp/tm_progress_XXXXXX");
    if (!mkdtemp(g_tmp))
        return 1;
    TM_RUN(test_format);
    TM_RUN(test_bar);
    TM_RUN(test_live);
    TM_RUN(test_eta_unadmitted);
    TM_RUN(test_lines);
    TM_RUN(test_textfile);
    TM_RUN(test_kafka);
    TM_RUN(test_alloc_faults);
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_tmp);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", g_tmp);
    return tm_test_report();
}
