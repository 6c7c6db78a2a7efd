/* tests/unit/test_shard.c - the partition of a sharded job (ingest/shard.h): --shard arguments;
 * the index and count from the command line, the job file and the Slurm / Kubernetes variables
 * (precedence and every contradiction refused); records with a shared prefix on one shard; and,
 * through the source, every line of an input (valid, malformed, duplicate ids) kept by exactly one
 * of N shards, with dense seq_nos per shard and the duplicates judged as the unsharded job judges
 * them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "ingest/job_spec.h"
#include "ingest/shard.h"
#include "ingest/source.h"
#include "tm_test.h"

// ---- a fake environment ----

static const char *g_env[16]; /* NAME, VALUE pairs, NULL-ended */

static const char *fake_getenv(const char *name) {
    for (size_t i = 0; g_env[i]; i += 2)
        if (strcmp(g_env[i], name) == 0)
            return g_env[i + 1];
    return NULL;
}

static void set_env(const char *const *pairs) {
    size_t i = 0;
    for (; pairs && pairs[i] && i + 2 < sizeof(g_env) / sizeof(g_env[0]); i++)
        g_env[i] = pairs[i];
    g_env[i] = NULL;
}

// Resolve with the given file values, --shard values and environment; returns rc.
static tm_rc resolve(int64_t file_k, int64_t file_n, int64_t cli_k, int64_t cli_n,
                     const char *const *env, tm_job_shard *sh, tm_err *err) {
    *sh = (tm_job_shard){.on = true, .index = file_k, .count = file_n, .prefix_bytes = 256};
    set_env(env);
    memset(err, 0, sizeof(*err));
    return tm_shard_resolve(sh, cli_k, cli_n, fake_getenv, err);
}

static void expect_fail(int64_t file_k, int64_t file_n, int64_t cli_k, int64_t cli_n,
                        const char *const *env, const char *want) {
    tm_job_shard sh;
    tm_err err;
    tm_rc rc = resolve(file_k, file_n, cli_k, cli_n, env, &sh, &err);
    TM_CHECK_MSG(rc == TM_E_INVAL, "expected a failure with '%s'", want);
    TM_CHECK_MSG(strstr(err.msg, want) != NULL, "message '%s' lacks '%s'", err.msg, want);
    TM_CHECK(!sh.active);
}

static void expect_ok(int64_t file_k, int64_t file_n, int64_t cli_k, int64_t cli_n,
                      const char *const *env, int64_t want_k, int64_t want_n) {
    tm_job_shard sh;
    tm_err err;
    TM_CHECK_OK(resolve(file_k, file_n, cli_k, cli_n, env, &sh, &err), &err);
    TM_CHECK_MSG(sh.index == want_k && sh.count == want_n && sh.active,
                 "got %lld/%lld, want %lld/%lld", (long long)sh.index, (long long)sh.count,
                 (long long)want_k, (long long)want_n);
}

static void test_parse_arg(void) {
    int64_t k, n;
    tm_err err = {0};
    TM_CHECK_OK(tm_shard_parse_arg("2/4", &k, &n, &err), &err);
    TM_CHECK(k == 2 && n == 4);
    TM_CHECK_OK(tm_shard_parse_arg("auto/3", &k, &n, &err), &err);
    TM_CHECK(k == -1 && n == 3);
    TM_CHECK_OK(tm_shard_parse_arg("auto", &k, &n, &err), &err);
    TM_CHECK(k == -1 && n == 0);
    const char *bad[] = {"4/4", "-1/4", "1/0", "1", "a/4", "1/4x", "/4", "1/", "1/100001"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        memset(&err, 0, sizeof(err));
        TM_CHECK_MSG(tm_shard_parse_arg(bad[i], &k, &n, &err) == TM_E_INVAL, "%s", bad[i]);
        TM_CHECK(strstr(err.msg, bad[i]) != NULL);
    }
}

static void test_env_slurm(void) {
    const char *arr[] = {"SLURM_ARRAY_TASK_ID",
                         "7",
                         "SLURM_ARRAY_TASK_MIN",
                         "5",
                         "SLURM_ARRAY_TASK_COUNT",
                         "4",
                         NULL};
    expect_ok(-1, 0, -1, 0, arr, 2, 4);                    // --shard auto: both from Slurm
    expect_ok(-1, 0, 2, 4, arr, 2, 4);                     // given and agreeing
    expect_ok(-1, 4, -1, 0, arr, 2, 4);                    // count in the job file
    expect_fail(-1, 0, 1, 4, arr, "SLURM_ARRAY_TASK_MIN"); // --shard 1/4 in task 2
    expect_fail(1, 4, -1, 0, arr, "input.shard.index gives index 1");
    expect_fail(-1, 0, -1, 3, arr, "SLURM_ARRAY_TASK_COUNT=4"); // auto/3 in an array of 4
    expect_fail(-1, 5, -1, 0, arr, "input.shard.count gives count 5");
    const char *nomin[] = {"SLURM_ARRAY_TASK_ID", "1", "SLURM_ARRAY_TASK_COUNT", "2", NULL};
    expect_ok(-1, 0, -1, 0, nomin, 1, 2); // SLURM_ARRAY_TASK_MIN unset: 0
    const char *step[] = {"SLURM_ARRAY_TASK_ID",
                          "2",
                          "SLURM_ARRAY_TASK_STEP",
                          "2",
                          "SLURM_ARRAY_TASK_COUNT",
                          "3",
                          NULL};
    expect_fail(-1, 0, -1, 0, step, "SLURM_ARRAY_TASK_STEP=2");
    const char *holes[] = {"SLURM_ARRAY_TASK_ID", "5", "SLURM_ARRAY_TASK_COUNT", "3", NULL};
    expect_fail(-1, 0, -1, 0, holes, "holes");
    const char *below[] = {"SLURM_ARRAY_TASK_ID", "1", "SLURM_ARRAY_TASK_MIN", "2", NULL};
    expect_fail(-1, 0, -1, 0, below, "below SLURM_ARRAY_TASK_MIN");
    const char *nan_id[] = {"SLURM_ARRAY_TASK_ID", "x1", NULL};
    expect_fail(-1, 0, -1, 0, nan_id, "SLURM_ARRAY_TASK_ID=x1");
}

static void test_env_k8s(void) {
    const char *k8s[] = {"JOB_COMPLETION_INDEX", "3", NULL};
    expect_ok(-1, 0, -1, 5, k8s, 3, 5); // --shard auto/5
    expect_ok(-1, 5, -1, 0, k8s, 3, 5); // input.shard.count 5
    expect_ok(-1, 5, -1, 8, k8s, 3, 8); // --shard wins over the job file
    expect_ok(1, 5, 3, 5, k8s, 3, 5);   // ... the index too, and the environment agrees
    expect_fail(-1, 0, -1, 0, k8s, "give the count with --shard auto/N");
    expect_fail(-1, 0, 2, 5, k8s, "JOB_COMPLETION_INDEX");
    expect_fail(-1, 3, -1, 0, k8s, "not below the count 3");
    const char *both[] = {"JOB_COMPLETION_INDEX",
                          "1",
                          "SLURM_ARRAY_TASK_ID",
                          "2",
                          "SLURM_ARRAY_TASK_COUNT",
                          "4",
                          NULL};
    expect_fail(-1, 0, -1, 0, both, "JOB_COMPLETION_INDEX says 1");
    const char *agree[] = {"JOB_COMPLETION_INDEX",
                           "2",
                           "SLURM_ARRAY_TASK_ID",
                           "2",
                           "SLURM_ARRAY_TASK_COUNT",
                           "4",
                           NULL};
    expect_ok(-1, 0, -1, 0, agree, 2, 4);
    expect_ok(-1, 0, 1, 2, NULL, 1, 2); // no environment at all
    expect_fail(-1, 0, -1, 2, NULL, "no shard index");
    expect_fail(-1, 0, -1, 0, NULL, "no shard count");
}

static void test_prefix_groups(void) {
    tm_job_shard sh = {.on = true, .active = true, .index = 0, .count = 7, .prefix_bytes = 64};
    char sys[200], prompt[400];
    int groups_on_shards[7] = {0};
    for (int s = 0; s < 10; s++) {
        snprintf(sys, sizeof(sys),
                 "System %d: you are a careful assistant who answers in one short sentence. ", s);
        uint32_t first = 0;
        for (int q = 0; q < 20; q++) {
            snprintf(prompt, sizeof(prompt), "%sQuestion %d?", sys, q);
            tm_job job = {.prompt = prompt, .line = (uint64_t)(s * 20 + q + 1)};
            uint32_t k = tm_shard_of(&job, &sh);
            TM_CHECK(k < 7);
            if (q == 0)
                first = k;
            TM_CHECK_MSG(k == first, "system %d question %d on shard %u, not %u", s, q, k, first);
            // chat: the same system message, varying last message
            tm_message msgs[2] = {{.role = "system", .content = sys},
                                  {.role = "user", .content = prompt}};
            tm_job chat = {.messages = msgs, .n_messages = 2};
            tm_job chat0 = {.messages = msgs, .n_messages = 2};
            TM_CHECK(tm_shard_of(&chat, &sh) == tm_shard_of(&chat0, &sh));
        }
        groups_on_shards[first]++;
    }
    int used = 0;
    for (int k = 0; k < 7; k++)
        used += groups_on_shards[k] > 0;
    TM_CHECK_MSG(used >= 3, "10 prefixes on only %d of 7 shards", used);
    // by id: the 20 questions of one system prompt spread
    sh.by = TM_SHARD_BY_ID;
    int seen[7] = {0};
    for (int q = 0; q < 20; q++) {
        char id[32];
        snprintf(id, sizeof(id), "\"q%d\"", q);
        tm_job job = {.prompt = "same", .id_json = id};
        seen[tm_shard_of(&job, &sh)]++;
    }
    int spread = 0;
    for (int k = 0; k < 7; k++)
        spread += seen[k] > 0;
    TM_CHECK(spread >= 3);
    // an error record: by file name and line, whatever the partition
    tm_job e1 = {.err_code = TM_ERRCODE_INVALID_JSON, .file = "/a/b/in.jsonl", .line = 9};
    tm_job e2 = {.err_code = TM_ERRCODE_INVALID_JSON, .file = "rel/in.jsonl", .line = 9};
    TM_CHECK(tm_shard_of(&e1, &sh) == tm_shard_of(&e2, &sh));
}

// ---- through the source: every line on exactly one shard ----

static char g_tmp[256];

static void test_source_exactly_once(void) {
    char path[512], job[1024];
    snprintf(path, sizeof(path), "%s/in.jsonl", g_tmp);
    FILE *f = fopen(path, "wb");
    TM_CHECK(f != NULL);
    if (!f)
        return;
    int n_lines = 0;
    for (int i = 0; i < 300; i++, n_lines++) {
        if (i % 29 == 0)
            fprintf(f, "{\"id\": \"x%d\", \"prompt\": oops}\n", i);
        else if (i % 31 == 0)
            fprintf(f, "{\"id\": \"r%d\", \"prompt\": \"a duplicate\"}\n", i - 1);
        else if (i % 5 == 0)
            fprintf(
                f,
                "{\"id\": \"r%d\", \"messages\": [{\"role\": \"system\", \"content\": \"S%d\"}, "
                "{\"role\": \"user\", \"content\": \"q%d\"}]}\n",
                i, i % 3, i);
        else
            fprintf(f, "{\"id\": \"r%d\", \"prompt\": \"System %d. Question %d\"}\n", i, i % 4, i);
        if (i % 50 == 0)
            fputs("   \n", f); // blank lines get no record on any shard
    }
    fclose(f);
    enum { N = 3 };
    int owner[400];
    for (int i = 0; i < 400; i++)
        owner[i] = -1;
    tm_errcode code[400] = {0};
    for (int k = 0; k < N; k++) {
        snprintf(job, sizeof(job),
                 "{\"model\": \"m\", \"input\": {\"files\": [\"%s\"], \"shard\": {\"count\": %d, "
                 "\"prefix_bytes\": 8}}, \"output\": {\"dir\": \"%s/out\"}}",
                 path, N, g_tmp);
        tm_job_spec *spec = NULL;
        tm_err err = {0};
        TM_CHECK_OK(tm_job_spec_load_text("(t)", g_tmp, job, &spec, &err), &err);
        if (!spec)
            return;
        set_env((const char *[]){"JOB_COMPLETION_INDEX", k == 0 ? "0" : k == 1 ? "1" : "2", NULL});
        TM_CHECK_OK(tm_job_spec_set_shard(spec, false, -1, 0, fake_getenv, &err), &err);
        char want_dir[600];
        snprintf(want_dir, sizeof(want_dir), "%s/out/shard-%d-of-%d", g_tmp, k, N);
        TM_CHECK_MSG(strcmp(spec->output_dir, want_dir) == 0, "%s", spec->output_dir);
        TM_CHECK(strstr(spec->canonical_json, "\"shard\":{\"by\":\"prefix\",\"count\":3,") != NULL);
        tm_source *src = NULL;
        TM_CHECK_OK(tm_source_open(spec, &src, &err), &err);
        uint64_t want_seq = 0;
        for (;;) {
            tm_job *j = NULL;
            tm_rc rc = tm_source_next(src, &j, &err);
            if (rc)
                break;
            TM_CHECK(j->seq_no == want_seq); // dense per shard
            want_seq++;
            int line = (int)j->line;
            TM_CHECK(line > 0 && line < 400);
            if (line > 0 && line < 400) {
                TM_CHECK_MSG(owner[line] < 0, "line %d on shards %d and %d", line, owner[line], k);
                owner[line] = k;
                code[line] = j->err_code;
            }
            tm_job_destroy(j);
        }
        tm_source_destroy(src);
        tm_job_spec_destroy(spec);
    }
    // Every non-blank line once; the duplicates and the malformed lines are errors, as unsharded.
    int n_records = 0, n_dup = 0, n_bad = 0;
    for (int line = 1; line < 400; line++) {
        if (owner[line] < 0)
            continue;
        n_records++;
        n_dup += code[line] == TM_ERRCODE_DUPLICATE_ID;
        n_bad += code[line] == TM_ERRCODE_INVALID_JSON;
    }
    TM_CHECK_MSG(n_records == n_lines, "%d records on the shards, %d lines", n_records, n_lines);
    TM_CHECK_MSG(n_dup == 9, "%d duplicate_id", n_dup); // i = 31, 62, ..., 279
    TM_CHECK_MSG(n_bad == 11, "%d invalid_json", n_bad);
}

static void test_refusals(void) {
    char job[1024];
    tm_err err = {0};
    tm_job_spec *spec = NULL;
    snprintf(job, sizeof(job),
             "{\"model\": \"m\", \"input\": {\"files\": [\"-\"], \"shard\": {\"count\": 2, "
             "\"index\": 0}}, \"output\": {\"dir\": \"%s/o\"}}",
             g_tmp);
    TM_CHECK_OK(tm_job_spec_load_text("(t)", g_tmp, job, &spec, &err), &err);
    if (spec)
        TM_CHECK(tm_job_spec_set_shard(spec, false, -1, 0, fake_getenv, &err) == TM_E_INVAL &&
                 strstr(err.msg, "standard input"));
    tm_job_spec_destroy(spec);
    spec = NULL;
    // Unsharded and no --shard: nothing changes, whatever the environment says.
    snprintf(job, sizeof(job),
             "{\"model\": \"m\", \"input\": {\"files\": [\"%s/in.jsonl\"]}, \"output\": "
             "{\"dir\": \"%s/o\"}}",
             g_tmp, g_tmp);
    TM_CHECK_OK(tm_job_spec_load_text("(t)", g_tmp, job, &spec, &err), &err);
    if (spec) {
        char *canon = tm_strdup(spec->canonical_json);
        set_env((const char *[]){"SLURM_ARRAY_TASK_ID", "1", "SLURM_ARRAY_TASK_COUNT", "2", NULL});
        TM_CHECK_OK(tm_job_spec_set_shard(spec, false, -1, 0, fake_getenv, &err), &err);
        TM_CHECK(!spec->shard.active && strcmp(canon, spec->canonical_json) == 0);
        tm_free(canon);
    }
    tm_job_spec_destroy(spec);
    // Bad input.shard fields name their path.
    const char *bad[][2] = {
        {"{\"count\": 0}", "input.shard.count"},
        {"{\"count\": 2, \"index\": 2}", "input.shard.index"},
        {"{\"by\": \"bytes\"}", "input.shard.by"},
        {"{\"prefix_bytes\": 0}", "input.shard.prefix_bytes"},
        {"{\"size\": 2}", "input.shard"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        snprintf(job, sizeof(job),
                 "{\"model\": \"m\", \"input\": {\"files\": [\"%s/in.jsonl\"], \"shard\": %s}, "
                 "\"output\": {\"dir\": \"%s/o\"}}",
                 g_tmp, bad[i][0], g_tmp);
        spec = NULL;
        memset(&err, 0, sizeof(err));
        TM_CHECK_MSG(tm_job_spec_load_text("(t)", g_tmp, job, &spec, &err) == TM_E_INVAL, "%s",
                     bad[i][0]);
        TM_CHECK_MSG(strstr(err.msg, bad[i][1]) != NULL, "'%s' lacks '%s'", err.msg, bad[i][1]);
        tm_job_spec_destroy(spec);
    }
}

int main(void) {
    snprintf(g_tmp, sizeof(g_tmp), "/tmp/tm_test_shard_XXXXXX");
    if (!mkdtemp(g_tmp))
        return 1;
    TM_RUN(test_parse_arg);
    TM_RUN(test_env_slurm);
    TM_RUN(test_env_k8s);
    TM_RUN(test_prefix_groups);
    TM_RUN(test_source_exactly_once);
    TM_RUN(test_refusals);
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_tmp);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", g_tmp);
    return tm_test_report();
}
