/* tests/unit/test_input_guard.c - what ingest refuses or guards against (issue 24): absurd
 * temperatures are per-record invalid_value errors naming the field and range; engine.threads is
 * capped (1024 and 4 x the online cores); a symbolic link inside an input folder is skipped while
 * one named in input.files is read; a ".gz" that is not gzip is an error naming the file; a file
 * is read up to the size it had at start and one that shrank is an error; a resumed stdin stream
 * must start with the fingerprinted prefix (the records there that were committed are dropped, the
 * others returned, new lines after it read), and a different, shorter or continued stream is
 * refused before any record is returned. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/seqset.h"
#include "ingest/job_spec.h"
#include "ingest/source.h"
#include "tm_test.h"

static char g_tmp[256];

static void write_file(const char *rel, const char *text) {
    char p[512];
    snprintf(p, sizeof(p), "%s/%s", g_tmp, rel);
    FILE *f = fopen(p, "wb");
    TM_CHECK(f != NULL);
    if (!f)
        return;
    fputs(text, f);
    fclose(f);
}

// Load g_tmp/job.json written from text; NULL (err filled) when it is refused.
static tm_job_spec *load_text(const char *text, tm_err *err) {
    write_file("job.json", text);
    char p[512];
    snprintf(p, sizeof(p), "%s/job.json", g_tmp);
    tm_job_spec *spec = NULL;
    memset(err, 0, sizeof(*err));
    if (tm_job_spec_load(p, &spec, err) != TM_OK)
        return NULL;
    return spec;
}

static tm_job_spec *spec_over(const char *files_json) {
    char job[1024];
    snprintf(job, sizeof(job),
             "{\"model\": \"m\", \"output\": {\"dir\": \"o\"}, \"input\": {\"files\": %s}}",
             files_json);
    tm_err err;
    tm_job_spec *spec = load_text(job, &err);
    TM_CHECK_MSG(spec != NULL, "%s: %s", files_json, err.msg);
    return spec;
}

// Read every record of src; ids (id_json, or "!code") joined by "," into out. Returns the rc.
static tm_rc read_ids(tm_source *src, char *out, size_t n, tm_err *err) {
    out[0] = '\0';
    size_t k = 0;
    for (;;) {
        tm_job *job = NULL;
        tm_rc rc = tm_source_next(src, &job, err);
        if (rc)
            return rc;
        k += (size_t)snprintf(out + k, n - k, "%s%s%s", k ? "," : "", job->err_code ? "!" : "",
                              job->err_code ? tm_errcode_name(job->err_code) : job->id_json);
        tm_job_destroy(job);
    }
}

static void test_temperature(void) {
    write_file("t.jsonl",
               "{\"id\": 1, \"prompt\": \"a\", \"temperature\": 1e308}\n"
               "{\"id\": 2, \"prompt\": \"a\", \"temperature\": 2.5}\n"
               "{\"id\": 3, \"prompt\": \"a\", \"temperature\": 2}\n"
               "{\"id\": 4, \"prompt\": \"a\", \"temperature\": 0}\n"
               "{\"custom_id\": \"o\", \"method\": \"POST\", \"url\": \"/v1/completions\","
               " \"body\": {\"model\": \"m\", \"prompt\": \"a\", \"temperature\": 3}}\n");
    tm_job_spec *spec = spec_over("[\"t.jsonl\"]");
    if (!spec)
        return;
    tm_source *src = NULL;
    tm_err err = {0};
    TM_CHECK_OK(tm_source_open(spec, &src, &err), &err);
    const char *want[] = {"field 'temperature': expected a number >= 0 and <= 2, got 1e308",
                          "field 'temperature': expected a number >= 0 and <= 2, got 2.5", NULL,
                          NULL, "field 'body.temperature': expected a number >= 0 and <= 2, got 3"};
    for (int i = 0; i < 5 && src; i++) {
        tm_job *job = NULL;
        TM_CHECK_OK(tm_source_next(src, &job, &err), &err);
        if (!job)
            break;
        if (want[i]) {
            TM_CHECK_MSG(job->err_code == TM_ERRCODE_INVALID_VALUE, "record %d: %s", i,
                         tm_errcode_name(job->err_code));
            TM_CHECK_MSG(job->err_msg && strstr(job->err_msg, want[i]), "record %d: %s", i,
                         job->err_msg ? job->err_msg : "(none)");
        } else {
            TM_CHECK_MSG(job->err_code == TM_ERRCODE_NONE, "record %d: %s", i,
                         job->err_msg ? job->err_msg : "");
        }
        tm_job_destroy(job);
    }
    tm_source_destroy(src);
    tm_job_spec_destroy(spec);
    // The job's defaults say the same.
    tm_job_spec *bad =
        load_text("{\"model\": \"m\", \"output\": {\"dir\": \"o\"}, \"input\": "
                  "{\"files\": [\"t.jsonl\"]}, \"defaults\": {\"temperature\": 1e308}}",
                  &err);
    TM_CHECK(bad == NULL && err.rc == TM_E_INVAL);
    TM_CHECK_MSG(strstr(err.msg, "defaults.temperature: expected a number >= 0 and <= 2"), "%s",
                 err.msg);
    tm_job_spec_destroy(bad);
}

static void test_threads(void) {
    long n_cpu = sysconf(_SC_NPROCESSORS_ONLN);
    char job[512];
    tm_err err;
    struct {
        long threads;
        const char *msg; /* NULL: accepted */
    } cases[] = {
        {65536, "engine.threads: expected an integer >= 0 and <= 1024, got 65536"},
        {1025, "engine.threads: expected an integer >= 0 and <= 1024"},
        {4 * n_cpu + 1, "online CPU cores"},
        {4 * n_cpu, NULL},
        {0, NULL},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        if (cases[i].threads > 1024 && !cases[i].msg)
            continue; // a machine with more than 256 cores: 4 x cores is past the hard cap
        snprintf(job, sizeof(job),
                 "{\"model\": \"m\", \"output\": {\"dir\": \"o\"}, \"input\": {\"files\": "
                 "[\"t.jsonl\"]}, \"engine\": {\"threads\": %ld}}",
                 cases[i].threads);
        tm_job_spec *spec = load_text(job, &err);
        if (cases[i].msg) {
            TM_CHECK_MSG(spec == NULL && err.rc == TM_E_INVAL, "threads %ld accepted",
                         cases[i].threads);
            TM_CHECK_MSG(strstr(err.msg, cases[i].msg) && strstr(err.msg, "engine.threads"),
                         "threads %ld: %s", cases[i].threads, err.msg);
        } else {
            TM_CHECK_MSG(spec != NULL, "threads %ld: %s", cases[i].threads, err.msg);
        }
        tm_job_spec_destroy(spec);
    }
}

static void test_folder_links(void) {
    char p[512], t[512];
    snprintf(p, sizeof(p), "%s/d", g_tmp);
    TM_CHECK(mkdir(p, 0777) == 0);
    write_file("d/a.jsonl", "{\"id\": 1, \"prompt\": \"a\"}\n");
    write_file("secret.jsonl", "{\"id\": 2, \"prompt\": \"b\"}\n");
    snprintf(p, sizeof(p), "%s/d/link.jsonl", g_tmp);
    snprintf(t, sizeof(t), "%s/secret.jsonl", g_tmp);
    TM_CHECK(symlink(t, p) == 0);
    tm_job_spec *spec = spec_over("[\"d\"]");
    if (spec) {
        TM_CHECK_MSG(spec->n_inputs == 1 && strstr(spec->inputs[0], "d/a.jsonl"), "%zu inputs",
                     spec->n_inputs);
        tm_job_spec_destroy(spec);
    }
    spec = spec_over("[\"d/link.jsonl\"]"); // named explicitly: followed
    if (spec) {
        TM_CHECK(spec->n_inputs == 1 && strstr(spec->inputs[0], "link.jsonl"));
        tm_source *src = NULL;
        tm_err err = {0};
        char ids[256];
        TM_CHECK_OK(tm_source_open(spec, &src, &err), &err);
        TM_CHECK(src && read_ids(src, ids, sizeof(ids), &err) == TM_E_EOF && !strcmp(ids, "2"));
        tm_source_destroy(src);
        tm_job_spec_destroy(spec);
    }
}

static void test_fake_gz(void) {
    write_file("plain.jsonl.gz", "{\"id\": 1, \"prompt\": \"a\"}\n");
    tm_job_spec *spec = spec_over("[\"plain.jsonl.gz\"]");
    if (!spec)
        return;
    tm_source *src = NULL;
    tm_err err = {0};
    char ids[256];
    TM_CHECK_OK(tm_source_open(spec, &src, &err), &err);
    tm_rc rc = src ? read_ids(src, ids, sizeof(ids), &err) : TM_E_INTERNAL;
    TM_CHECK_MSG(rc == TM_E_PARSE, "rc %s, records %s", tm_rc_name(rc), ids);
    TM_CHECK_MSG(strstr(err.msg, "plain.jsonl.gz") && strstr(err.msg, "not a gzip file"), "%s",
                 err.msg);
    TM_CHECK(ids[0] == '\0'); // nothing was read as text
    tm_source_destroy(src);
    tm_job_spec_destroy(spec);
}

static void test_size_at_start(void) {
    const char *l1 = "{\"id\": 1, \"prompt\": \"a\"}\n", *l2 = "{\"id\": 2, \"prompt\": \"b\"}\n";
    char text[256];
    snprintf(text, sizeof(text), "%s%s{\"id\": 3, \"prompt\": \"appended later\"}\n", l1, l2);
    write_file("grow.jsonl", text);
    tm_job_spec *spec = spec_over("[\"grow.jsonl\"]");
    if (!spec)
        return;
    char ids[256];
    tm_err err = {0};
    // The size seen at start covered two lines: the third is not read.
    int64_t size = (int64_t)(strlen(l1) + strlen(l2));
    tm_source *src = NULL;
    TM_CHECK_OK(tm_source_open(spec, &src, &err), &err);
    TM_CHECK_OK(tm_source_set_input_sizes(src, &size, 1, &err), &err);
    tm_rc rc = read_ids(src, ids, sizeof(ids), &err);
    TM_CHECK_MSG(rc == TM_E_EOF && !strcmp(ids, "1,2"), "rc %s, records %s", tm_rc_name(rc), ids);
    tm_source_destroy(src);
    // Without sizes, everything.
    TM_CHECK_OK(tm_source_open(spec, &src, &err), &err);
    rc = read_ids(src, ids, sizeof(ids), &err);
    TM_CHECK_MSG(rc == TM_E_EOF && !strcmp(ids, "1,2,3"), "records %s", ids);
    tm_source_destroy(src);
    // A file that is shorter than its size at start shrank.
    size = (int64_t)strlen(text) + 100;
    TM_CHECK_OK(tm_source_open(spec, &src, &err), &err);
    TM_CHECK_OK(tm_source_set_input_sizes(src, &size, 1, &err), &err);
    rc = read_ids(src, ids, sizeof(ids), &err);
    TM_CHECK_MSG(rc == TM_E_IO && strstr(err.msg, "shrank") && strstr(err.msg, "grow.jsonl"),
                 "rc %s: %s", tm_rc_name(rc), err.msg);
    tm_source_destroy(src);
    tm_job_spec_destroy(spec);
}

// Make fd 0 read the file g_tmp/rel (the source reads standard input from fd 0).
static void stdin_from(const char *rel, const char *text) {
    write_file(rel, text);
    char p[512];
    snprintf(p, sizeof(p), "%s/%s", g_tmp, rel);
    int fd = open(p, O_RDONLY);
    TM_CHECK(fd >= 0 && dup2(fd, STDIN_FILENO) == 0);
    close(fd);
}

// One run over stdin = text: with fp_in (resume) and skip; the records' ids into ids, the final
// fingerprint into fp_out. Returns the rc of the first failing call (TM_E_EOF when all was read).
static tm_rc stdin_run(const tm_job_spec *spec, const char *text, const tm_source_stdin_fp *fp_in,
                       const tm_seqset *skip, bool check_first, char *ids, size_t n,
                       tm_source_stdin_fp *fp_out, uint64_t *n_skipped, tm_err *err) {
    stdin_from("stdin.jsonl", text);
    tm_source *src = NULL;
    ids[0] = '\0';
    tm_rc rc = tm_source_open(spec, &src, err);
    if (rc)
        return rc;
    if (fp_in)
        tm_source_stdin_resume(src, skip, fp_in);
    if (check_first)
        rc = tm_source_stdin_check(src, err);
    if (!rc)
        rc = read_ids(src, ids, n, err);
    tm_source_stdin_fingerprint(src, fp_out);
    *n_skipped = tm_source_n_skipped(src);
    tm_source_destroy(src);
    return rc;
}

static void test_stdin_resume(void) {
    tm_job_spec *spec = spec_over("[\"-\"]");
    if (!spec)
        return;
    const char *a = "{\"id\": 1, \"prompt\": \"a\"}\n\n{\"id\": 2, \"prompt\": \"b\"}\n"
                    "{\"id\": 3, \"prompt\": \"c\"}\n";
    char ids[512], more[1024];
    tm_err err = {0};
    tm_source_stdin_fp fp, fp2;
    uint64_t n_skip = 0;
    tm_rc rc = stdin_run(spec, a, NULL, NULL, false, ids, sizeof(ids), &fp, &n_skip, &err);
    TM_CHECK_MSG(rc == TM_E_EOF && !strcmp(ids, "1,2,3"), "%s", ids);
    TM_CHECK(fp.n_bytes == strlen(a) && fp.n_records == 3);
    tm_h128 h = tm_hash128(a, strlen(a));
    TM_CHECK(fp.xxh3.lo == h.lo && fp.xxh3.hi == h.hi);

    // Resumed with records 0 and 2 committed, the same stream and new lines after it: record 1
    // (id 2) runs again, the new ones are read, the committed ones are dropped.
    tm_seqset skip = {0};
    uint64_t done[] = {0, 2};
    for (int i = 0; i < 2; i++)
        TM_CHECK_OK(tm_seqset_add(&skip, done[i], &err), &err);
    snprintf(more, sizeof(more), "%s{\"id\": 4, \"prompt\": \"new\"}\n", a);
    for (int check_first = 0; check_first < 2; check_first++) {
        rc = stdin_run(spec, more, &fp, &skip, check_first, ids, sizeof(ids), &fp2, &n_skip, &err);
        TM_CHECK_MSG(rc == TM_E_EOF && !strcmp(ids, "2,4"), "rc %s (%s): %s", tm_rc_name(rc),
                     err.msg, ids);
        TM_CHECK(n_skip == 2 && fp2.n_bytes == strlen(more) && fp2.n_records == 4);
    }

    // Another stream of the same length, a shorter one, and one whose line at the prefix's end
    // goes on: refused before any record is returned, the fingerprint unchanged.
    char other[512];
    snprintf(other, sizeof(other), "%s", a);
    other[strlen(other) - 4] = 'X'; // inside the last record
    const char *refused[] = {other, "{\"id\": 1, \"prompt\": \"a\"}\n", NULL};
    const char *want[] = {"standard input is not the stream", "standard input ended after"};
    for (int i = 0; refused[i]; i++) {
        for (int check_first = 0; check_first < 2; check_first++) {
            rc = stdin_run(spec, refused[i], &fp, &skip, check_first, ids, sizeof(ids), &fp2,
                           &n_skip, &err);
            TM_CHECK_MSG(rc == TM_E_INVAL && strstr(err.msg, want[i]), "case %d: rc %s: %s", i,
                         tm_rc_name(rc), err.msg);
            TM_CHECK_MSG(ids[0] == '\0', "case %d returned %s", i, ids);
            TM_CHECK(fp2.n_bytes == fp.n_bytes && fp2.xxh3.lo == fp.xxh3.lo);
        }
    }
    // A stream whose last line had no "\n": the same bytes plus "\n" and more lines are the same
    // stream; the last line continued is not.
    const char *b = "{\"id\": 1, \"prompt\": \"a\"}\n{\"id\": 2, \"prompt\": \"b\"}";
    rc = stdin_run(spec, b, NULL, NULL, false, ids, sizeof(ids), &fp, &n_skip, &err);
    TM_CHECK(rc == TM_E_EOF && fp.n_bytes == strlen(b) && fp.n_records == 2);
    tm_seqset all = {0};
    TM_CHECK_OK(tm_seqset_add(&all, 0, &err), &err);
    TM_CHECK_OK(tm_seqset_add(&all, 1, &err), &err);
    snprintf(more, sizeof(more), "%s\r\n{\"id\": 3, \"prompt\": \"c\"}\n", b);
    rc = stdin_run(spec, more, &fp, &all, true, ids, sizeof(ids), &fp2, &n_skip, &err);
    TM_CHECK_MSG(rc == TM_E_EOF && !strcmp(ids, "3") && n_skip == 2, "rc %s (%s): %s",
                 tm_rc_name(rc), err.msg, ids);
    snprintf(more, sizeof(more), "%s{\"x\": 1}\n", b); // the line goes on past the prefix
    rc = stdin_run(spec, more, &fp, &all, true, ids, sizeof(ids), &fp2, &n_skip, &err);
    TM_CHECK_MSG(rc == TM_E_INVAL && ids[0] == '\0', "rc %s: %s", tm_rc_name(rc), ids);
    tm_seqset_fini(&all);
    tm_seqset_fini(&skip);
    tm_job_spec_destroy(spec);
}

int main(void) {
    snprintf(g_tmp, sizeof(g_tmp), "/tmp/tm_guard_XXXXXX");
    if (!mkdtemp(g_tmp))
        return 1;
    TM_RUN(test_temperature);
    TM_RUN(test_threads);
    TM_RUN(test_folder_links);
    TM_RUN(test_fake_gz);
    TM_RUN(test_size_at_start);
    TM_RUN(test_stdin_resume);
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_tmp);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", g_tmp);
    return tm_test_report();
}
