/* tests/unit/test_job_spec.c - job file loading: defaults (and that they match the schema),
 * relative path resolution, unknown keys, wrong types with the JSON path in the message, input
 * expansion (folders, globs, dedupe), the quickstart job, and every allocation failing in turn. */
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/utf8.h"
#include "ingest/job_spec.h"
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

static void make_dir(const char *rel) {
    char p[512];
    snprintf(p, sizeof(p), "%s/%s", g_tmp, rel);
    mkdir(p, 0777);
}

// Load g_tmp/rel; returns rc, fills err.
static tm_rc load(const char *rel, tm_job_spec **spec, tm_err *err) {
    char p[512];
    snprintf(p, sizeof(p), "%s/%s", g_tmp, rel);
    *spec = NULL;
    return tm_job_spec_load(p, spec, err);
}

// Write g_tmp/job.json from text and expect failure whose message contains want.
static void expect_error(const char *text, tm_rc want_rc, const char *want) {
    write_file("job.json", text);
    tm_job_spec *spec = NULL;
    tm_err err = {0};
    tm_rc rc = load("job.json", &spec, &err);
    TM_CHECK_MSG(rc == want_rc, "rc %s for %s", tm_rc_name(rc), text);
    TM_CHECK_MSG(strstr(err.msg, want) != NULL, "message '%s' lacks '%s'", err.msg, want);
    TM_CHECK(spec == NULL);
    tm_job_spec_destroy(spec);
}

static const char *MIN_JOB =
    "{\"model\": \"m\", \"input\": {\"files\": [\"in/a.jsonl\"]}, \"output\": {\"dir\": \"out\"}}";

static void test_defaults(void) {
    make_dir("in");
    write_file("in/a.jsonl", "{\"id\":1,\"prompt\":\"x\"}\n");
    write_file("job.json", MIN_JOB);
    tm_job_spec *spec = NULL;
    tm_err err = {0};
    TM_CHECK_OK(load("job.json", &spec, &err), &err);
    if (!spec)
        return;
    char want[512];
    snprintf(want, sizeof(want), "%s/m", g_tmp);
    TM_CHECK(strcmp(spec->model, want) == 0);
    snprintf(want, sizeof(want), "%s/out", g_tmp);
    TM_CHECK(strcmp(spec->output_dir, want) == 0);
    TM_CHECK(spec->n_inputs == 1);
    snprintf(want, sizeof(want), "%s/in/a.jsonl", g_tmp);
    TM_CHECK(strcmp(spec->inputs[0], want) == 0);
    TM_CHECK(spec->engine.backend == TM_BACKEND_AUTO);
    TM_CHECK(spec->engine.max_seqs == 8);
    TM_CHECK(spec->engine.max_batched_tokens == 16384);
    TM_CHECK(spec->engine.block_size == 128);
    TM_CHECK(spec->engine.prefix_cache);
    TM_CHECK(spec->engine.tp == 1);
    TM_CHECK(spec->engine.threads == 0);
    TM_CHECK(spec->engine.kv_blocks == 0);
    TM_CHECK(spec->engine.gpu_memory_utilization == 0.90);
    TM_CHECK(spec->engine.engram_cache_mb == 1024);
    TM_CHECK(spec->engine.quantization == TM_JOB_QUANT_NONE);
    TM_CHECK(spec->defaults.set == 0);
    TM_CHECK(spec->defaults.max_tokens == 256);
    TM_CHECK(spec->defaults.temperature == 1.0f);
    TM_CHECK(spec->defaults.top_p == 1.0f);
    TM_CHECK(spec->defaults.top_k == -1);
    TM_CHECK(spec->defaults.min_p == 0.0f);
    TM_CHECK(spec->defaults.seed == 0);
    TM_CHECK(spec->defaults.n_stop == 0);
    TM_CHECK(spec->max_line_bytes == 16u << 20);
    const char *canon =
        "{\"defaults\":{\"max_tokens\":256,\"min_p\":0.0,\"seed\":0,\"stop\":[],\"temperature\":1.0,"
        "\"top_k\":-1,\"top_p\":1.0},\"engine\":{\"backend\":\"auto\",\"block_size\":128,"
        "\"kv_blocks\":0,\"lookahead\":1024,\"max_batched_tokens\":16384,\"max_seqs\":8,"
        "\"prefix_cache\":true,\"schedule\":\"prefix\",\"threads\":0,\"tp\":1},\"input\":{\"files\":[\"in/a.jsonl\"]},\"limits\":{"
        "\"max_depth\":64,\"max_field_bytes\":8388608,\"max_line_bytes\":16777216,"
        "\"max_messages\":4096},\"model\":\"m\",\"output\":{\"dir\":\"out\"}}";
    TM_CHECK_MSG(strcmp(spec->canonical_json, canon) == 0, "canonical: %s", spec->canonical_json);

    // The schema's "default" values must be what the loader fills in: walk the schema's
    // properties and compare each default with the canonical spec.
    const char *src = getenv("TM_SRC");
    char sp[512];
    snprintf(sp, sizeof(sp), "%s/schemas/job.schema.json", src ? src : ".");
    json_error_t jerr;
    json_t *schema = json_load_file(sp, 0, &jerr);
    json_t *c = json_loads(spec->canonical_json, 0, &jerr);
    TM_CHECK_MSG(schema != NULL, "%s: %s", sp, jerr.text);
    int n_defaults = 0;
    const char *sect;
    json_t *sv;
    json_object_foreach(json_object_get(schema, "properties"), sect, sv) {
        const char *key;
        json_t *kv;
        json_object_foreach(json_object_get(sv, "properties"), key, kv) {
            json_t *d = json_object_get(kv, "default");
            if (!d)
                continue;
            n_defaults++;
            json_t *got = json_object_get(json_object_get(c, sect), key);
            if (!strcmp(sect, "engine") && !strcmp(key, "gpu_memory_utilization")) {
                // memory sizing: not part of the job's identity either
                TM_CHECK(!got && json_number_value(d) == spec->engine.gpu_memory_utilization);
                continue;
            }
            if (!strcmp(sect, "engine") && !strcmp(key, "engram_cache_mb")) {
                // memory sizing: not part of the job's identity
                TM_CHECK(!got && json_integer_value(d) == spec->engine.engram_cache_mb);
                continue;
            }
            if (!strcmp(sect, "engine") && !strcmp(key, "kv_cache_dtype")) {
                // written to the canonical spec only when not "auto" (identity kept)
                TM_CHECK(!got && !strcmp(json_string_value(d), "auto") &&
                         !spec->engine.kv_cache_fp8);
                continue;
            }
            if (!strcmp(sect, "engine") && !strcmp(key, "quantization")) {
                // written to the canonical spec only when not "none" (identity kept)
                TM_CHECK(!got && !strcmp(json_string_value(d),
                                         tm_job_quant_name(spec->engine.quantization)));
                continue;
            }
            if (!strcmp(sect, "output") && !strcmp(key, "compression")) { // canonical if "none"
                TM_CHECK(!got && !strcmp(json_string_value(d), "lz4") &&
                         spec->compression == TM_JOB_COMPRESSION_LZ4);
                continue;
            }
            if (!strcmp(sect, "limits") &&
                (!strcmp(key, "strict_fields") || !strcmp(key, "fail_on_error_records"))) {
                // strict_fields: canonical only when true; fail_on_error_records: exit status only
                TM_CHECK(!got && json_is_false(d) && !spec->strict_fields &&
                         !spec->fail_on_error_records);
                continue;
            }
            if (!strcmp(sect, "output") && !strcmp(key, "order")) { // the results file's order
                TM_CHECK(!got && !strcmp(json_string_value(d), "completion") &&
                         !spec->results_input_order);
                continue;
            }
            if (!strcmp(sect, "output")) { // commit cadence: not part of the job's identity
                double want_v = !strcmp(key, "commit_every_s") ? spec->commit_every_s
                                                               : spec->commit_every_records;
                TM_CHECK_MSG(json_number_value(d) == want_v, "schema default of output.%s", key);
                continue;
            }
            int same = got &&
                       (json_equal(got, d) || (json_is_number(got) && json_is_number(d) &&
                                               json_number_value(got) == json_number_value(d)));
            TM_CHECK_MSG(same, "schema default of %s.%s differs from the loader's", sect, key);
        }
    }
    TM_CHECK(n_defaults == 31); // engine 14, defaults 7, limits 6, output 4
    json_decref(schema);
    json_decref(c);
    tm_job_spec_destroy(spec);
}

static void test_values_and_relative_paths(void) {
    make_dir("jobs");
    make_dir("jobs/data");
    write_file("jobs/data/x.jsonl", "");
    write_file("jobs/job.json",
               "{\"$schema\": \"../schemas/job.schema.json\", \"model\": \"../models/tiny\","
               " \"input\": {\"files\": [\"data/x.jsonl\", \"/dev/null\"]},"
               " \"output\": {\"dir\": \"/tmp/abs-out\"},"
               " \"engine\": {\"backend\": \"cpu\", \"max_seqs\": 4, \"max_batched_tokens\": 512,"
               " \"block_size\": 16, \"prefix_cache\": false, \"tp\": 2, \"threads\": 3,"
               " \"kv_blocks\": 100, \"gpu_memory_utilization\": 0.5, \"engram_cache_mb\": 64},"
               " \"defaults\": {\"max_tokens\": 7, \"temperature\": 0, \"top_p\": 0.9,"
               " \"top_k\": 50, \"min_p\": 0.05, \"seed\": 42, \"stop\": \"\\n\"},"
               " \"limits\": {\"max_line_bytes\": 1000, \"max_depth\": 5, \"max_field_bytes\": 99,"
               " \"max_messages\": 3}}");
    tm_job_spec *spec = NULL;
    tm_err err = {0};
    TM_CHECK_OK(load("jobs/job.json", &spec, &err), &err);
    if (!spec)
        return;
    char want[512];
    snprintf(want, sizeof(want), "%s/jobs/../models/tiny", g_tmp);
    TM_CHECK(strcmp(spec->model, want) == 0);
    TM_CHECK(strcmp(spec->output_dir, "/tmp/abs-out") == 0);
    TM_CHECK(spec->n_inputs == 2);
    snprintf(want, sizeof(want), "%s/jobs/data/x.jsonl", g_tmp);
    TM_CHECK(strcmp(spec->inputs[0], want) == 0);
    TM_CHECK(strcmp(spec->inputs[1], "/dev/null") == 0);
    TM_CHECK(spec->engine.backend == TM_BACKEND_CPU);
    TM_CHECK(spec->engine.max_seqs == 4 && spec->engine.max_batched_tokens == 512);
    TM_CHECK(spec->engine.block_size == 16 && !spec->engine.prefix_cache);
    TM_CHECK(spec->engine.tp == 2 && spec->engine.threads == 3 && spec->engine.kv_blocks == 100);
    TM_CHECK(spec->engine.gpu_memory_utilization == 0.5);
    TM_CHECK(spec->engine.engram_cache_mb == 64);
    TM_CHECK(strstr(spec->canonical_json, "engram") == NULL); // not part of the identity
    TM_CHECK(spec->defaults.max_tokens == 7 && spec->defaults.temperature == 0.0f);
    TM_CHECK_NEAR(spec->defaults.top_p, 0.9, 1e-6);
    TM_CHECK(spec->defaults.top_k == 50 && spec->defaults.seed == 42);
    TM_CHECK_NEAR(spec->defaults.min_p, 0.05, 1e-6);
    TM_CHECK(spec->defaults.n_stop == 1 && strcmp(spec->defaults.stop[0], "\n") == 0);
    TM_CHECK(spec->defaults.set == (TM_SP_MAX_TOKENS | TM_SP_TEMPERATURE | TM_SP_TOP_P |
                                    TM_SP_TOP_K | TM_SP_MIN_P | TM_SP_SEED | TM_SP_STOP));
    TM_CHECK(spec->max_line_bytes == 1000);
    TM_CHECK(spec->max_depth == 5 && spec->max_field_bytes == 99 && spec->max_messages == 3);
    TM_CHECK(strstr(spec->canonical_json, "\"top_p\":0.9}") != NULL);
    TM_CHECK(strstr(spec->canonical_json, "\"stop\":[\"\\n\"]") != NULL);
    tm_job_spec_destroy(spec);

    // A job file in the current folder: paths stay as written (no "./" prefix).
    char cwd[512];
    TM_CHECK(getcwd(cwd, sizeof(cwd)) != NULL);
    char jobs_dir[512];
    snprintf(jobs_dir, sizeof(jobs_dir), "%s/jobs", g_tmp);
    TM_CHECK(chdir(jobs_dir) == 0);
    TM_CHECK_OK(tm_job_spec_load("job.json", &spec, &err), &err);
    if (spec) {
        TM_CHECK(strcmp(spec->model, "../models/tiny") == 0);
        TM_CHECK(strcmp(spec->inputs[0], "data/x.jsonl") == 0);
    }
    tm_job_spec_destroy(spec);
    TM_CHECK(chdir(cwd) == 0);
}

static void test_errors(void) {
    // Unknown keys, at the top and inside sections, name the path and the allowed keys.
    expect_error("{\"modle\": \"m\"}", TM_E_INVAL,
                 "job.json: modle: unknown key (allowed here: "
                 "$schema, model, input");
    expect_error(
        "{\"model\": \"m\", \"input\": {\"files\": [\"in/a.jsonl\"]}, \"output\": {\"dir\":"
        " \"o\"}, \"engine\": {\"max_sqes\": 8}}",
        TM_E_INVAL, "job.json: engine.max_sqes: unknown key");
    expect_error(
        "{\"model\": \"m\", \"input\": {\"files\": [\"in/a.jsonl\"]}, \"output\": {\"dir\":"
        " \"o\"}, \"defaults\": {\"temprature\": 1}}",
        TM_E_INVAL, "job.json: defaults.temprature: unknown key");
    // Wrong types and values.
    expect_error(
        "{\"model\": \"m\", \"input\": {\"files\": [\"in/a.jsonl\"]}, \"output\": {\"dir\":"
        " \"o\"}, \"engine\": {\"max_seqs\": \"8\"}}",
        TM_E_INVAL, "job.json: engine.max_seqs: expected an integer >= 1, got \"8\"");
    expect_error(
        "{\"model\": \"m\", \"input\": {\"files\": [\"in/a.jsonl\"]}, \"output\": {\"dir\":"
        " \"o\"}, \"engine\": {\"max_seqs\": 0}}",
        TM_E_INVAL, "engine.max_seqs: expected an integer >= 1, got 0");
    expect_error(
        "{\"model\": \"m\", \"input\": {\"files\": [\"in/a.jsonl\"]}, \"output\": {\"dir\":"
        " \"o\"}, \"engine\": {\"block_size\": 100}}",
        TM_E_INVAL, "engine.block_size: expected a power of two");
    expect_error(
        "{\"model\": \"m\", \"input\": {\"files\": [\"in/a.jsonl\"]}, \"output\": {\"dir\":"
        " \"o\"}, \"engine\": {\"backend\": \"gpu\"}}",
        TM_E_INVAL, "engine.backend: expected one of \"auto\", \"cpu\", \"cuda\", got \"gpu\"");
    expect_error(
        "{\"model\": \"m\", \"input\": {\"files\": [\"in/a.jsonl\"]}, \"output\": {\"dir\":"
        " \"o\"}, \"engine\": {\"gpu_memory_utilization\": 0}}",
        TM_E_INVAL, "engine.gpu_memory_utilization: expected a number > 0 and <= 1, got 0");
    expect_error(
        "{\"model\": \"m\", \"input\": {\"files\": [\"in/a.jsonl\"]}, \"output\": {\"dir\":"
        " \"o\"}, \"engine\": {\"gpu_memory_utilization\": 1.2}}",
        TM_E_INVAL, "engine.gpu_memory_utilization: expected a number > 0 and <= 1");
    expect_error(
        "{\"model\": \"m\", \"input\": {\"files\": [\"in/a.jsonl\"]}, \"output\": {\"dir\":"
        " \"o\"}, \"engine\": {\"engram_cache_mb\": 0}}",
        TM_E_INVAL, "engine.engram_cache_mb: expected an integer >= 1 and <= 1048576, got 0");
    expect_error(
        "{\"model\": \"m\", \"input\": {\"files\": [\"in/a.jsonl\"]}, \"output\": {\"dir\":"
        " \"o\"}, \"engine\": {\"engram_cache_mb\": \"1G\"}}",
        TM_E_INVAL, "engine.engram_cache_mb: expected an integer >= 1 and <= 1048576");
    expect_error(
        "{\"model\": \"m\", \"input\": {\"files\": [\"in/a.jsonl\"]}, \"output\": {\"dir\":"
        " \"o\"}, \"engine\": {\"prefix_cache\": 1}}",
        TM_E_INVAL, "engine.prefix_cache: expected true or false, got 1");
    expect_error(
        "{\"model\": \"m\", \"input\": {\"files\": [\"in/a.jsonl\"]}, \"output\": {\"dir\":"
        " \"o\"}, \"engine\": {\"quantization\": \"int8\"}}",
        TM_E_INVAL,
        "job.json: engine.quantization: expected one of \"none\", \"fp8\", got \"int8\"");
    expect_error(
        "{\"model\": \"m\", \"input\": {\"files\": [\"in/a.jsonl\"]}, \"output\": {\"dir\":"
        " \"o\"}, \"engine\": {\"quantization\": 8}}",
        TM_E_INVAL, "job.json: engine.quantization: expected one of \"none\", \"fp8\", got 8");
    expect_error(
        "{\"model\": \"m\", \"input\": {\"files\": [\"in/a.jsonl\"]}, \"output\": {\"dir\":"
        " \"o\"}, \"engine\": {\"quantization\": true}}",
        TM_E_INVAL, "job.json: engine.quantization: expected one of \"none\", \"fp8\", got true");
    expect_error(
        "{\"model\": \"m\", \"input\": {\"files\": [\"in/a.jsonl\"]}, \"output\": {\"dir\":"
        " \"o\"}, \"engine\": {\"quantization\": \"fp8\", \"tp\": 2}}",
        TM_E_INVAL, "job.json: engine.quantization: \"fp8\" with engine.tp 2 is not supported");
    expect_error(
        "{\"model\": \"m\", \"input\": {\"files\": [\"in/a.jsonl\"]}, \"output\": {\"dir\":"
        " \"o\"}, \"defaults\": {\"temperature\": \"hot\"}}",
        TM_E_INVAL, "job.json: defaults.temperature: expected a number >= 0, got \"hot\"");
    expect_error(
        "{\"model\": \"m\", \"input\": {\"files\": [\"in/a.jsonl\"]}, \"output\": {\"dir\":"
        " \"o\"}, \"defaults\": {\"top_p\": 1.5}}",
        TM_E_INVAL, "defaults.top_p: expected a number > 0 and <= 1, got 1.5");
    expect_error(
        "{\"model\": \"m\", \"input\": {\"files\": [\"in/a.jsonl\"]}, \"output\": {\"dir\":"
        " \"o\"}, \"limits\": {\"max_line_bytes\": 1.5}}",
        TM_E_INVAL, "limits.max_line_bytes: expected an integer >= 1");
    expect_error(
        "{\"model\": \"m\", \"input\": {\"files\": [\"in/a.jsonl\"]}, \"output\": {\"dir\":"
        " \"o\"}, \"limits\": {\"max_depth\": 2049}}",
        TM_E_INVAL, "limits.max_depth: expected an integer >= 1 and <= 2048, got 2049");
    expect_error("{\"model\": \"m\", \"input\": {\"files\": [\"-\", \"in/a.jsonl\", \"-\"]}, "
                 "\"output\": {\"dir\": \"o\"}}",
                 TM_E_INVAL, "input.files[2]: standard input (\"-\") can be read only once");
    expect_error("{\"model\": \"m\", \"input\": {\"files\": [\"in/a.jsonl\", 3]}, \"output\": "
                 "{\"dir\": \"o\"}}",
                 TM_E_INVAL, "job.json: input.files[1]: expected a non-empty string");
    expect_error("{\"model\": \"m\", \"input\": {\"files\": []}, \"output\": {\"dir\": \"o\"}}",
                 TM_E_INVAL, "input.files: expected a non-empty array of strings, got []");
    expect_error("{\"model\": \"m\", \"input\": {\"files\": \"in/a.jsonl\"}, \"output\": {\"dir\": "
                 "\"o\"}}",
                 TM_E_INVAL,
                 "input.files: expected a non-empty array of strings, got \"in/a.jsonl\"");
    expect_error("{\"model\": 5, \"input\": {\"files\": [\"in/a.jsonl\"]}, \"output\": {\"dir\": "
                 "\"o\"}}",
                 TM_E_INVAL, "job.json: model: expected a non-empty string, got 5");
    expect_error("{\"input\": {\"files\": [\"in/a.jsonl\"]}, \"output\": {\"dir\": \"o\"}}",
                 TM_E_INVAL, "job.json: model: required key is missing");
    expect_error("{\"model\": \"m\", \"input\": {\"files\": [\"in/a.jsonl\"]}}", TM_E_INVAL,
                 "job.json: output: required key is missing");
    expect_error("{\"model\": \"m\", \"input\": {\"files\": [\"in/a.jsonl\"]}, \"output\": {}}",
                 TM_E_INVAL, "job.json: output.dir: required key is missing");
    expect_error("{\"model\": \"m\", \"input\": [\"in/a.jsonl\"], \"output\": {\"dir\": \"o\"}}",
                 TM_E_INVAL, "job.json: input: expected an object, got [\"in/a.jsonl\"]");
    expect_error("[1]", TM_E_INVAL, "job.json: expected a JSON object at the top level");
    expect_error("{\"model\": \"m\",", TM_E_PARSE, "job.json: line 1, column");
    expect_error("{\"model\": \"m\", \"model\": \"n\"}", TM_E_PARSE, "duplicate object key");
    // Inputs that name nothing.
    expect_error("{\"model\": \"m\", \"input\": {\"files\": [\"in/missing.jsonl\"]}, \"output\": "
                 "{\"dir\": \"o\"}}",
                 TM_E_IO, "input.files[0]: ");
    expect_error("{\"model\": \"m\", \"input\": {\"files\": [\"in/*.nothing\"]}, \"output\": "
                 "{\"dir\": \"o\"}}",
                 TM_E_INVAL, "input.files[0]: pattern ");
    make_dir("empty");
    expect_error("{\"model\": \"m\", \"input\": {\"files\": [\"empty\"]}, \"output\": "
                 "{\"dir\": \"o\"}}",
                 TM_E_INVAL, "holds no *.jsonl, *.jsonl.lz4 or *.jsonl.gz files");

    tm_job_spec *spec = NULL;
    tm_err err = {0};
    TM_CHECK(tm_job_spec_load("/nonexistent/job.json", &spec, &err) == TM_E_IO);
    TM_CHECK(strstr(err.msg, "/nonexistent/job.json") != NULL);
}

// engine.quantization: "fp8" is read and is part of the job's identity; "none" (explicit or by
// default) leaves the canonical spec as it was before the field existed.
static void test_quantization(void) {
    write_file("in/a.jsonl", "{\"id\":1,\"prompt\":\"x\"}\n");
    const char *fmt = "{\"model\":\"m\",\"input\":{\"files\":[\"in/a.jsonl\"]},\"output\":{"
                      "\"dir\":\"out\"},\"engine\":{\"quantization\":\"%s\"}}";
    char job[256];
    char *canon_none = NULL;
    for (int fp8 = 0; fp8 < 2; fp8++) {
        snprintf(job, sizeof(job), fmt, fp8 ? "fp8" : "none");
        write_file("job.json", job);
        tm_job_spec *spec = NULL;
        tm_err err = {0};
        TM_CHECK_OK(load("job.json", &spec, &err), &err);
        if (!spec)
            continue;
        TM_CHECK(spec->engine.quantization == (fp8 ? TM_JOB_QUANT_FP8 : TM_JOB_QUANT_NONE));
        TM_CHECK(!strcmp(tm_job_quant_name(spec->engine.quantization), fp8 ? "fp8" : "none"));
        const char *q = strstr(spec->canonical_json, "\"quantization\":\"fp8\"");
        TM_CHECK_MSG(fp8 ? q != NULL : strstr(spec->canonical_json, "quantization") == NULL,
                     "canonical: %s", spec->canonical_json);
        if (!fp8)
            canon_none = strdup(spec->canonical_json);
        tm_job_spec_destroy(spec);
    }
    // explicit "none" gives the same identity as leaving the field out
    write_file("job.json", MIN_JOB);
    tm_job_spec *spec = NULL;
    tm_err err = {0};
    TM_CHECK_OK(load("job.json", &spec, &err), &err);
    TM_CHECK(spec && canon_none && !strcmp(spec->canonical_json, canon_none));
    tm_job_spec_destroy(spec);
    free(canon_none);
}

// engine.kv_cache_dtype: "fp8" is read and is part of the job's identity; "auto" (explicit or
// by default) leaves the canonical spec as it was before the field existed; other values fail.
static void test_kv_cache_dtype(void) {
    write_file("in/a.jsonl", "{\"id\":1,\"prompt\":\"x\"}\n");
    const char *fmt = "{\"model\":\"m\",\"input\":{\"files\":[\"in/a.jsonl\"]},\"output\":{"
                      "\"dir\":\"out\"},\"engine\":{\"kv_cache_dtype\":\"%s\"}}";
    char job[256];
    write_file("job.json", MIN_JOB);
    tm_job_spec *spec = NULL;
    tm_err err = {0};
    TM_CHECK_OK(load("job.json", &spec, &err), &err);
    char *canon_min = spec ? strdup(spec->canonical_json) : NULL;
    tm_job_spec_destroy(spec);
    for (int fp8 = 0; fp8 < 2; fp8++) {
        snprintf(job, sizeof(job), fmt, fp8 ? "fp8" : "auto");
        write_file("job.json", job);
        spec = NULL;
        TM_CHECK_OK(load("job.json", &spec, &err), &err);
        if (!spec)
            continue;
        TM_CHECK(spec->engine.kv_cache_fp8 == (fp8 != 0));
        if (fp8)
            TM_CHECK_MSG(strstr(spec->canonical_json, "\"kv_cache_dtype\":\"fp8\"") != NULL,
                         "canonical: %s", spec->canonical_json);
        else
            TM_CHECK(canon_min && !strcmp(spec->canonical_json, canon_min));
        tm_job_spec_destroy(spec);
    }
    free(canon_min);
    expect_error(
        "{\"model\": \"m\", \"input\": {\"files\": [\"in/a.jsonl\"]}, \"output\": {\"dir\":"
        " \"o\"}, \"engine\": {\"kv_cache_dtype\": \"fp8_e5m2\"}}",
        TM_E_INVAL,
        "job.json: engine.kv_cache_dtype: expected one of \"auto\", \"fp8\", got \"fp8_e5m2\"");
    expect_error(
        "{\"model\": \"m\", \"input\": {\"files\": [\"in/a.jsonl\"]}, \"output\": {\"dir\":"
        " \"o\"}, \"engine\": {\"kv_cache_dtype\": 8}}",
        TM_E_INVAL, "job.json: engine.kv_cache_dtype: expected one of \"auto\", \"fp8\", got 8");
}

// output.compression, output.results_file, limits.strict_fields / fail_on_error_records: values,
// identity (compression "none" and strict_fields true are canonical; "lz4", false, the results
// file and fail_on_error_records are not), bad values, and the same job from text in memory.
static void test_cli_fields(void) {
    write_file("in/a.jsonl", "{\"id\":1,\"prompt\":\"x\"}\n");
    write_file("job.json", MIN_JOB);
    tm_job_spec *base = NULL, *spec = NULL;
    tm_err err = {0};
    TM_CHECK_OK(load("job.json", &base, &err), &err);
    const char *same =
        "{\"model\":\"m\",\"input\":{\"files\":[\"in/a.jsonl\"]},\"output\":{\"dir\":\"out\","
        "\"compression\":\"lz4\",\"results_file\":\"r.jsonl\"},\"limits\":{\"strict_fields\":"
        "false,\"fail_on_error_records\":true}}";
    write_file("job.json", same);
    TM_CHECK_OK(load("job.json", &spec, &err), &err);
    if (base && spec) {
        TM_CHECK_MSG(!strcmp(base->canonical_json, spec->canonical_json), "%s",
                     spec->canonical_json);
        TM_CHECK(spec->compression == TM_JOB_COMPRESSION_LZ4 && !spec->strict_fields &&
                 spec->fail_on_error_records);
        TM_CHECK(spec->results_file && strstr(spec->results_file, "/r.jsonl") &&
                 !strncmp(spec->results_file, g_tmp, strlen(g_tmp)));
        TM_CHECK(!base->results_file && !base->fail_on_error_records);
    }
    tm_job_spec_destroy(spec);
    write_file("job.json", "{\"model\":\"m\",\"input\":{\"files\":[\"in/a.jsonl\"]},\"output\":{"
                           "\"dir\":\"out\",\"compression\":\"none\"},\"limits\":{"
                           "\"strict_fields\":true}}");
    TM_CHECK_OK(load("job.json", &spec, &err), &err);
    if (spec) {
        TM_CHECK(spec->compression == TM_JOB_COMPRESSION_NONE && spec->strict_fields);
        TM_CHECK_MSG(strstr(spec->canonical_json, "\"compression\":\"none\"") &&
                         strstr(spec->canonical_json, "\"strict_fields\":true"),
                     "%s", spec->canonical_json);
    }
    tm_job_spec_destroy(spec);
    expect_error("{\"model\":\"m\",\"input\":{\"files\":[\"in/a.jsonl\"]},\"output\":{\"dir\":"
                 "\"o\",\"compression\":\"gzip\"}}",
                 TM_E_INVAL, "output.compression: expected one of \"lz4\", \"none\", got \"gzip\"");
    expect_error("{\"model\":\"m\",\"input\":{\"files\":[\"in/a.jsonl\"]},\"output\":{\"dir\":"
                 "\"o\"},\"limits\":{\"strict_fields\":1}}",
                 TM_E_INVAL, "limits.strict_fields: expected true or false, got 1");
    // From text: relative paths against base_dir, the name in messages, same canonical spec.
    char dir[300];
    snprintf(dir, sizeof(dir), "%s", g_tmp);
    spec = NULL;
    TM_CHECK_OK(tm_job_spec_load_text("(cli)", dir, MIN_JOB, &spec, &err), &err);
    if (base && spec) {
        TM_CHECK(!strcmp(base->canonical_json, spec->canonical_json));
        TM_CHECK(!strcmp(base->inputs[0], spec->inputs[0]) && !strcmp(spec->path, "(cli)"));
    }
    tm_job_spec_destroy(spec);
    spec = NULL;
    TM_CHECK(tm_job_spec_load_text("(cli)", dir, "{\"model\": 1", &spec, &err) == TM_E_PARSE);
    TM_CHECK_MSG(strstr(err.msg, "(cli): line 1") != NULL, "%s", err.msg);
    TM_CHECK(tm_job_spec_load_text("(cli)", dir,
                                   "{\"model\":\"m\",\"input\":{\"files\":[\"in/"
                                   "a.jsonl\"]},\"output\":{\"dir\":\"o\"},\"defaults\":"
                                   "{\"max_tokens\":\"hot\"}}",
                                   &spec, &err) == TM_E_INVAL);
    TM_CHECK_MSG(strstr(err.msg, "(cli): defaults.max_tokens") != NULL, "%s", err.msg);
    tm_job_spec_destroy(base);
}

// output.commit_every_* and output.kafka: values, identity (kafka is in the canonical spec, the
// commit cadence is not) and errors.
static void test_output_durability(void) {
    write_file("in/a.jsonl", "{\"id\":1,\"prompt\":\"x\"}\n");
    write_file("job.json",
               "{\"model\":\"m\",\"input\":{\"files\":[\"in/a.jsonl\"]},\"output\":{\"dir\":"
               "\"out\",\"commit_every_s\":0.5,\"commit_every_records\":10,\"kafka\":{"
               "\"brokers\":\"b:9092\",\"topic\":\"t\",\"transactional_id\":\"x\","
               "\"config\":{\"linger.ms\":\"5\"}}}}");
    tm_job_spec *spec = NULL;
    tm_err err = {0};
    TM_CHECK_OK(load("job.json", &spec, &err), &err);
    if (!spec)
        return;
    TM_CHECK(spec->commit_every_s == 0.5 && spec->commit_every_records == 10);
    TM_CHECK(spec->kafka && !strcmp(spec->kafka->topic, "t") && spec->kafka->n_config == 1);
    TM_CHECK(!strcmp(spec->kafka->config[0], "linger.ms") && !strcmp(spec->kafka->config[1], "5"));
    TM_CHECK(!strcmp(spec->kafka->transactional_id, "x"));
    TM_CHECK(strstr(spec->canonical_json, "\"kafka\":{") != NULL);
    TM_CHECK(strstr(spec->canonical_json, "commit_every") == NULL);
    tm_job_spec_destroy(spec);
    const char *bad[] = {
        "\"commit_every_s\":0",
        "\"commit_every_records\":0",
        "\"kafka\":{\"topic\":\"t\"}",
        "\"kafka\":{\"brokers\":\"b\",\"topic\":\"t\",\"acks\":1}",
        "\"kafka\":{\"brokers\":\"b\",\"topic\":\"t\",\"config\":{\"linger.ms\":5}}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char job[512];
        snprintf(job, sizeof(job),
                 "{\"model\":\"m\",\"input\":{\"files\":[\"in/a.jsonl\"]},\"output\":{"
                 "\"dir\":\"out\",%s}}",
                 bad[i]);
        write_file("job.json", job);
        spec = NULL;
        TM_CHECK_MSG(load("job.json", &spec, &err) == TM_E_INVAL, "accepted: %s", bad[i]);
        TM_CHECK(strstr(err.msg, "output.") != NULL);
        tm_job_spec_destroy(spec);
    }
}

static void test_expand(void) {
    make_dir("d");
    make_dir("d/sub");
    write_file("d/b.jsonl", "");
    write_file("d/a.jsonl.lz4", "");
    write_file("d/c.jsonl.gz", "");
    write_file("d/.hidden.jsonl", "");
    write_file("d/notes.txt", "");
    write_file("d/sub/deep.jsonl", "");
    make_dir("g");
    write_file("g/x2.jsonl", "");
    write_file("g/x1.jsonl", "");
    write_file("g/y.txt", "");
    write_file("job.json",
               "{\"model\": \"m\", \"output\": {\"dir\": \"o\"}, \"input\": {\"files\": "
               "[\"g/x2.jsonl\", \"d\", \"g/x*.jsonl\", \"d/b.jsonl\", \"d/s?b\"]}}");
    tm_job_spec *spec = NULL;
    tm_err err = {0};
    TM_CHECK_OK(load("job.json", &spec, &err), &err);
    if (!spec)
        return;
    // explicit g/x2 first; folder d sorted (hidden, txt and subfolder skipped); glob sorted with
    // x2 already present (dropped); d/b.jsonl again (dropped); glob d/s?b matches folder d/sub.
    const char *want[] = {"g/x2.jsonl",   "d/a.jsonl.lz4", "d/b.jsonl",
                          "d/c.jsonl.gz", "g/x1.jsonl",    "d/sub/deep.jsonl"};
    TM_CHECK_MSG(spec->n_inputs == 6, "n_inputs %zu", spec->n_inputs);
    for (size_t i = 0; i < 6 && i < spec->n_inputs; i++) {
        char p[512];
        snprintf(p, sizeof(p), "%s/%s", g_tmp, want[i]);
        TM_CHECK_MSG(strcmp(spec->inputs[i], p) == 0, "inputs[%zu] = %s, want %s", i,
                     spec->inputs[i], p);
    }
    tm_job_spec_destroy(spec);
}

static void test_quickstart(void) {
    const char *src = getenv("TM_SRC");
    char p[512];
    snprintf(p, sizeof(p), "%s/jobs/quickstart.json", src ? src : ".");
    if (access(p, R_OK) != 0)
        return;
    tm_job_spec *spec = NULL;
    tm_err err = {0};
    TM_CHECK_OK(tm_job_spec_load(p, &spec, &err), &err);
    if (spec)
        TM_CHECK(spec->n_inputs >= 1);
    tm_job_spec_destroy(spec);
}

// Every allocation of a successful load fails in turn: an error comes back and nothing leaks.
static void test_alloc_faults(void) {
    write_file("job.json",
               "{\"model\": \"m\", \"output\": {\"dir\": \"o\"}, \"input\": {\"files\": "
               "[\"d\", \"g/*.jsonl\"]}, \"defaults\": {\"stop\": [\"a\", \"b\"]}}");
    long base = tm_alloc_live();
    int n_fail = 0;
    for (long n = 1; n < 10000; n++) {
        tm_job_spec *spec = NULL;
        tm_err err = {0};
        tm_fault_set(TM_FAULT_ALLOC, n);
        tm_rc rc = load("job.json", &spec, &err);
        tm_fault_set(TM_FAULT_ALLOC, 0);
        tm_job_spec_destroy(spec);
        TM_CHECK(tm_alloc_live() == base);
        if (rc == TM_OK)
            break;
        TM_CHECK_MSG(rc == TM_E_NOMEM, "alloc %ld: %s", n, err.msg);
        n_fail++;
    }
    TM_CHECK(n_fail > 10);
}

// Issue 35: input paths in JSON (base/utf8.h). Every byte pair survives escape + unescape; the
// escaped form is valid UTF-8 (json_string takes it); UTF-8 names without a backslash are left as
// they are; a backslash becomes \x5c; a lone backslash in a job file stays.
static void test_path_escape(void) {
    char p[3] = {0};
    for (int a = 1; a < 256; a++)
        for (int b = 1; b < 256; b++) {
            p[0] = (char)a, p[1] = (char)b;
            char *e = tm_path_escape(p);
            TM_ASSERT(e);
            json_t *j = json_string(e);
            TM_CHECK_MSG(j != NULL, "escaped %02x %02x is not UTF-8", a, b);
            json_decref(j);
            char *u = tm_path_unescape(e);
            TM_ASSERT(u);
            TM_CHECK_MSG(strcmp(u, p) == 0, "%02x %02x -> %s", a, b, e);
            tm_free(u);
            tm_free(e);
        }
    static const struct {
        const char *raw, *esc;
    } cases[] = {{"data/in.jsonl", "data/in.jsonl"},
                 {"caf\xc3\xa9.jsonl", "caf\xc3\xa9.jsonl"}, // UTF-8 \u00e9: as it is
                 {"caf\xe9.jsonl", "caf\\xe9.jsonl"},        // Latin-1: escaped
                 {"a\\b", "a\\x5cb"},
                 {"\xed\xa0\x80", "\\xed\\xa0\\x80"}}; // a UTF-8 surrogate is not UTF-8
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *e = tm_path_escape(cases[i].raw);
        TM_CHECK_MSG(e && strcmp(e, cases[i].esc) == 0, "%s -> %s", cases[i].esc, e ? e : "");
        tm_free(e);
    }
    char *u = tm_path_unescape("a\\b\\x0\\x00\\xZZ\\x41");
    TM_CHECK_MSG(u && strcmp(u, "a\\b\\x0\\x00\\xZZA") == 0, "%s", u ? u : "");
    tm_free(u);
}

int main(void) {
    snprintf(g_tmp, sizeof(g_tmp), "/tmp/tm_job_spec_XXXXXX");
    if (!mkdtemp(g_tmp))
        return 1;
    TM_RUN(test_defaults);
    TM_RUN(test_path_escape);
    TM_RUN(test_values_and_relative_paths);
    TM_RUN(test_errors);
    TM_RUN(test_output_durability);
    TM_RUN(test_quantization);
    TM_RUN(test_kv_cache_dtype);
    TM_RUN(test_cli_fields);
    TM_RUN(test_expand);
    TM_RUN(test_quickstart);
    TM_RUN(test_alloc_faults);
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_tmp);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", g_tmp);
    return tm_test_report();
}
