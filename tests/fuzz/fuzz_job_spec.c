/* tests/fuzz/fuzz_job_spec.c - libFuzzer target for the job-spec loader (ingest/job_spec.c): the
 * input is written as job.json in a private folder (on /dev/shm when there is one; the folder
 * also holds a.jsonl and data/b.jsonl so relative inputs, folders and globs can match) and loaded
 * with tm_job_spec_load. It must end in TM_OK or in TM_E_PARSE / TM_E_INVAL / TM_E_IO with a
 * message naming the job file (never a crash, hang, leak or other code). A loaded spec has at
 * least one input and a canonical JSON object; that canonical JSON, loaded as a job file from
 * the same folder, loads too and gives the same canonical JSON (it is a fixed point). Built with
 * clang -fsanitize=fuzzer,address,undefined when TM_FUZZ=ON; otherwise fuzz_replay.h adds a main()
 * that replays the files given on the command line (corpus tests/fuzz/corpus_job_spec). */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "ingest/job_spec.h"

static void check(int ok, const char *what, const tm_err *err) {
    if (ok)
        return;
    fprintf(stderr, "fuzz_job_spec: invariant broken: %s (rc %d, msg %s)\n", what,
            err ? (int)err->rc : 0, err ? err->msg : "");
    abort();
}

static char g_dir[64];

static void path_of(char *out, size_t cap, const char *name) {
    snprintf(out, cap, "%s/%s", g_dir, name);
}

static void write_file(const char *name, const void *p, size_t n) {
    char path[256];
    path_of(path, sizeof(path), name);
    FILE *f = fopen(path, "wb");
    TM_ASSERT(f);
    TM_ASSERT(fwrite(p, 1, n, f) == n);
    fclose(f);
}

static void cleanup(void) {
    static const char *const names[] = {"job.json", "job2.json", "a.jsonl", "data/b.jsonl", "data"};
    char p[256];
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        path_of(p, sizeof(p), names[i]);
        remove(p);
    }
    rmdir(g_dir);
}

static void setup(void) {
    if (g_dir[0])
        return;
    const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(g_dir, sizeof(g_dir), "%s/tm_fuzz_job_XXXXXX", base);
    TM_ASSERT(mkdtemp(g_dir) != NULL);
    char p[256];
    path_of(p, sizeof(p), "data");
    TM_ASSERT(mkdir(p, 0700) == 0);
    write_file("a.jsonl", "{\"id\": 1, \"prompt\": \"x\"}\n", 25);
    write_file("data/b.jsonl", "", 0);
    atexit(cleanup);
}

static tm_rc load(const char *name, tm_job_spec **spec, tm_err *err) {
    char path[256];
    path_of(path, sizeof(path), name);
    tm_rc rc = tm_job_spec_load(path, spec, err);
    if (rc != TM_OK) {
        check(*spec == NULL || rc == TM_OK, "failed load with a spec", err);
        check(rc == TM_E_PARSE || rc == TM_E_INVAL || rc == TM_E_IO || rc == TM_E_NOMEM,
              "load failed with an unexpected code", err);
        check(err->msg[0] && strstr(err->msg, name), "error message does not name the job file",
              err);
    }
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    setup();
    write_file("job.json", data, size);
    tm_job_spec *spec = NULL, *spec2 = NULL;
    tm_err err = {0};
    long live = tm_alloc_live();
    tm_rc rc = load("job.json", &spec, &err);
    if (rc != TM_OK) {
        check(tm_alloc_live() == live, "failed load leaked", &err);
        return 0;
    }
    check(spec->n_inputs > 0 && spec->canonical_json && spec->model && spec->output_dir,
          "loaded spec without inputs, model, output dir or canonical JSON", NULL);
    json_error_t jerr;
    json_t *j = json_loads(spec->canonical_json, JSON_REJECT_DUPLICATES, &jerr);
    check(json_is_object(j), "canonical JSON is not an object", NULL);
    json_decref(j);
    write_file("job2.json", spec->canonical_json, strlen(spec->canonical_json));
    err = (tm_err){0};
    rc = load("job2.json", &spec2, &err);
    check(rc == TM_OK, "the canonical JSON of a spec does not load", &err);
    check(strcmp(spec->canonical_json, spec2->canonical_json) == 0,
          "canonical JSON is not a fixed point", NULL);
    tm_job_spec_destroy(spec2);
    tm_job_spec_destroy(spec);
    check(tm_alloc_live() == live, "spec leaked", NULL);
    return 0;
}

#include "fuzz_replay.h"
