/* tests/unit/test_metrics.c - metrics accumulation and metrics.json: percentiles on known data,
 * TPOT, ITL (pooled histogram), throughput formulas, error counts by code, settings, job and bench
 * sections, null for unknowns (GPUs without NVML), atomic write. With
 * TM_SAMPLE_DIR set, a sample metrics.json is left there for schema validation. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "sink/metrics.h"
#include "tm_test.h"

static char g_tmp[256];

static void test_percentile(void) {
    double v[100];
    for (int i = 0; i < 100; i++)
        v[i] = i + 1; // 1..100
    TM_CHECK_NEAR(tm_metrics_percentile(v, 100, 50), 50.5, 1e-12);
    TM_CHECK_NEAR(tm_metrics_percentile(v, 100, 90), 90.1, 1e-12);
    TM_CHECK_NEAR(tm_metrics_percentile(v, 100, 99), 99.01, 1e-12);
    TM_CHECK_NEAR(tm_metrics_percentile(v, 100, 0), 1, 0);
    TM_CHECK_NEAR(tm_metrics_percentile(v, 100, 100), 100, 0);
    double one = 7;
    TM_CHECK_NEAR(tm_metrics_percentile(&one, 1, 99), 7, 0);
    TM_CHECK(isnan(tm_metrics_percentile(v, 0, 50)));
    double two[] = {10, 20};
    TM_CHECK_NEAR(tm_metrics_percentile(two, 2, 50), 15, 1e-12);
    TM_CHECK_NEAR(tm_metrics_percentile(two, 2, 90), 19, 1e-12);
}

static json_t *get(json_t *root, const char *a, const char *b) {
    json_t *x = json_object_get(root, a);
    TM_CHECK_MSG(x != NULL, "missing %s", a);
    if (!b)
        return x;
    json_t *y = json_object_get(x, b);
    TM_CHECK_MSG(y != NULL, "missing %s.%s", a, b);
    return y;
}

static void fill(tm_metrics *m) {
    tm_err err = {0};
    // 100 ok records: ttft = i ms (shuffled order), total = 10 * i ms, 11 tokens -> TPOT 0.9 * i;
    // ITL: 10 gaps of 0.9 * i ms each
    for (int k = 0; k < 100; k++) {
        int i = (k * 37) % 100 + 1;
        float itl[10];
        for (int t = 0; t < 10; t++)
            itl[t] = (float)(0.9 * i);
        tm_completion c = {.n_tok_prompt = 100,
                           .n_tok_cached = 25,
                           .n_tok_gen = 11,
                           .ttft_ms = i,
                           .total_ms = 10.0 * i,
                           .itl_ms = itl,
                           .n_itl = 10};
        TM_CHECK_OK(tm_metrics_add_record(m, &c, &err), &err);
    }
    tm_completion one_tok = {.n_tok_prompt = 100, .n_tok_gen = 1, .ttft_ms = 5, .total_ms = 5};
    TM_CHECK_OK(tm_metrics_add_record(m, &one_tok, &err), &err); // no TPOT sample
    tm_completion e1 = {.err_code = TM_ERRCODE_INVALID_JSON};
    tm_completion e2 = {.err_code = TM_ERRCODE_DUPLICATE_ID};
    TM_CHECK_OK(tm_metrics_add_record(m, &e1, &err), &err);
    TM_CHECK_OK(tm_metrics_add_record(m, &e1, &err), &err);
    TM_CHECK_OK(tm_metrics_add_record(m, &e2, &err), &err);
    tm_metrics_add_engine(
        m, &(tm_metrics_engine){.steps = 1, .n_tok_prefill = 8000, .prefill_s = 2.0});
    tm_metrics_add_engine(m, &(tm_metrics_engine){.steps = 1,
                                                  .n_tok_prefill = 2100,
                                                  .prefill_s = 0.5,
                                                  .n_tok_decode = 1000,
                                                  .decode_s = 1.5});
    tm_metrics_add_engine(m,
                          &(tm_metrics_engine){.steps = 1, .n_tok_decode = 100, .decode_s = 0.5});
}

static void test_json(void) {
    tm_metrics *m = NULL;
    tm_err err = {0};
    TM_CHECK_OK(tm_metrics_create(&m, &err), &err);
    if (!m)
        return;
    fill(m);
    tm_metrics_settings s = {.backend = "cpu",
                             .tp = 1,
                             .max_seqs = 8,
                             .max_batched_tokens = 2048,
                             .block_size = 128,
                             .kv_dtype = "f32",
                             .prefix_cache = true,
                             .threads = 4,
                             .model_path = "/models/tiny",
                             .model_arch = "llama",
                             .n_params = 123456};
    TM_CHECK_OK(tm_metrics_set_settings(m, &s, &err), &err);
    TM_CHECK_OK(tm_metrics_set_job(m, "jobs/x.json", &err), &err);
    tm_metrics_poll_gpus(m); // no-op or a sample; either way the JSON stays valid
    usleep(20 * 1000);
    tm_metrics_end(m);
    char path[512];
    snprintf(path, sizeof(path), "%s/metrics.json", g_tmp);
    TM_CHECK_OK(tm_metrics_write_json(m, path, &err), &err);
    TM_CHECK_OK(tm_metrics_write_json(m, path, &err), &err); // rewrite over an existing file
    char tmp_path[600];
    snprintf(tmp_path, sizeof(tmp_path), "%s.tmp", path);
    TM_CHECK(access(tmp_path, F_OK) != 0);

    json_error_t jerr;
    json_t *j = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    TM_CHECK_MSG(j != NULL, "%s", jerr.text);
    if (!j) {
        tm_metrics_destroy(m);
        return;
    }
    TM_CHECK(json_integer_value(get(j, "schema_version", NULL)) == TM_METRICS_SCHEMA_VERSION);
    TM_CHECK(TM_METRICS_SCHEMA_VERSION == 2);
    TM_CHECK(strcmp(json_string_value(get(j, "job", NULL)), "jobs/x.json") == 0);
    TM_CHECK(json_is_null(get(j, "bench", NULL)));
    double t0 = json_number_value(get(j, "time", "start_unix_s"));
    double t1 = json_number_value(get(j, "time", "end_unix_s"));
    TM_CHECK(t0 > 1.7e9 && t1 >= t0 && t1 - t0 < 10);
    TM_CHECK(strcmp(json_string_value(get(j, "tokenmill", "version")), TM_VERSION) == 0);
    TM_CHECK(json_is_string(get(j, "tokenmill", "git_commit")));
    TM_CHECK(json_is_string(get(j, "time", "start_utc")));
    TM_CHECK(json_is_true(get(j, "time", "finished")));
    double wall = json_number_value(get(j, "time", "wall_s"));
    TM_CHECK(wall >= 0.015 && wall < 10);
    TM_CHECK(json_integer_value(get(j, "records", "in")) == 104);
    TM_CHECK(json_integer_value(get(j, "records", "ok")) == 101);
    TM_CHECK(json_integer_value(get(j, "records", "failed")) == 3);
    json_t *by = get(j, "records", "errors_by_code");
    TM_CHECK(json_integer_value(json_object_get(by, "invalid_json")) == 2);
    TM_CHECK(json_integer_value(json_object_get(by, "duplicate_id")) == 1);
    TM_CHECK(json_object_size(by) == 2);
    TM_CHECK(json_integer_value(get(j, "tokens", "prompt")) == 10100);
    TM_CHECK(json_integer_value(get(j, "tokens", "cached")) == 2500);
    TM_CHECK(json_integer_value(get(j, "tokens", "completion")) == 1101);
    TM_CHECK_NEAR(json_number_value(get(j, "tokens", "prefix_cache_hit_rate")), 2500.0 / 10100,
                  1e-9);
    TM_CHECK_NEAR(json_number_value(get(j, "throughput", "prefill_tok_s")), 10100 / 2.5, 1e-6);
    TM_CHECK_NEAR(json_number_value(get(j, "throughput", "decode_tok_s")), 1100 / 2.0, 1e-6);
    TM_CHECK_NEAR(json_number_value(get(j, "throughput", "output_tok_s")), 1101 / wall,
                  1101 / wall * 1e-6);
    TM_CHECK(json_integer_value(get(j, "engine", "steps")) == 3);
    TM_CHECK(json_integer_value(get(j, "engine", "prefill_tokens")) == 10100);
    TM_CHECK(json_integer_value(get(j, "engine", "decode_tokens")) == 1100);
    TM_CHECK_NEAR(json_number_value(get(j, "engine", "prefill_s")), 2.5, 1e-12);
    TM_CHECK_NEAR(json_number_value(get(j, "engine", "decode_s")), 2.0, 1e-12);
    json_t *lat = get(j, "latency_ms", NULL);
    json_t *ttft = json_object_get(lat, "ttft");
    // ttft samples: 1..100 plus one 5
    TM_CHECK(json_integer_value(json_object_get(ttft, "n")) == 101);
    TM_CHECK_NEAR(json_number_value(json_object_get(ttft, "mean")), (5050.0 + 5) / 101, 1e-9);
    TM_CHECK_NEAR(json_number_value(json_object_get(ttft, "p50")), 50, 1e-9);
    TM_CHECK_NEAR(json_number_value(json_object_get(ttft, "max")), 100, 1e-9);
    json_t *tpot = json_object_get(lat, "tpot");
    TM_CHECK(json_integer_value(json_object_get(tpot, "n")) == 100);
    TM_CHECK_NEAR(json_number_value(json_object_get(tpot, "p50")), 0.9 * 50.5, 1e-9);
    TM_CHECK_NEAR(json_number_value(json_object_get(tpot, "p90")), 0.9 * 90.1, 1e-9);
    TM_CHECK_NEAR(json_number_value(json_object_get(tpot, "p99")), 0.9 * 99.01, 1e-9);
    json_t *e2e = json_object_get(lat, "e2e");
    TM_CHECK(json_integer_value(json_object_get(e2e, "n")) == 101);
    // ITL: 1000 samples 0.9 * i (i = 1..100, 10 each); histogram percentiles within 1%
    json_t *itl = json_object_get(lat, "itl");
    TM_CHECK(json_integer_value(json_object_get(itl, "n")) == 1000);
    TM_CHECK_NEAR(json_number_value(json_object_get(itl, "mean")), 0.9 * 50.5, 1e-4);
    TM_CHECK_NEAR(json_number_value(json_object_get(itl, "max")), 90, 1e-4);
    TM_CHECK_NEAR(json_number_value(json_object_get(itl, "p50")), 0.9 * 50.5, 0.9 * 50.5 * 0.01);
    TM_CHECK_NEAR(json_number_value(json_object_get(itl, "p90")), 0.9 * 90, 0.9 * 90 * 0.01);
    TM_CHECK_NEAR(json_number_value(json_object_get(itl, "p99")), 0.9 * 99, 0.9 * 99 * 0.01);
    json_t *gpus = get(j, "host", "gpus");
    TM_CHECK(json_is_null(gpus) || json_integer_value(json_object_get(gpus, "count")) >= 1);
    TM_CHECK(json_is_null(get(j, "speculative", NULL)));
    TM_CHECK(strcmp(json_string_value(get(j, "settings", "backend")), "cpu") == 0);
    TM_CHECK(json_integer_value(get(j, "settings", "max_batched_tokens")) == 2048);
    TM_CHECK(json_is_true(get(j, "settings", "prefix_cache")));
    TM_CHECK(json_is_null(get(j, "settings", "kv_blocks")));
    TM_CHECK(strcmp(json_string_value(get(j, "settings", "kv_dtype")), "f32") == 0);
    TM_CHECK(strcmp(json_string_value(get(j, "model", "arch")), "llama") == 0);
    TM_CHECK(json_integer_value(get(j, "model", "n_params")) == 123456);
    TM_CHECK(json_is_string(get(j, "host", "hostname")));
    TM_CHECK(json_is_string(get(j, "host", "cpu_model")));
    TM_CHECK(json_is_null(get(j, "host", "device")));
    json_decref(j);
    tm_metrics_destroy(m);
}

// ITL percentiles from the histogram against exact ones on log-uniform data (0.01 ms .. 10 s),
// and values outside the histogram's range (0, huge) counted without harm.
static void test_itl_histogram(void) {
    tm_metrics *m = NULL;
    tm_err err = {0};
    TM_CHECK_OK(tm_metrics_create(&m, &err), &err);
    if (!m)
        return;
    enum { N = 5000 };
    static float itl[N];
    static double sorted[N];
    uint64_t x = 12345;
    for (int i = 0; i < N; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        double u = (double)(x >> 11) / 9007199254740992.0;
        itl[i] = (float)(0.01 * pow(1e6, u));
        sorted[i] = itl[i];
    }
    tm_completion c = {.n_tok_gen = N + 1, .ttft_ms = 1, .total_ms = 2, .itl_ms = itl, .n_itl = N};
    TM_CHECK_OK(tm_metrics_add_record(m, &c, &err), &err);
    for (int i = 1; i < N; i++) // insertion sort (small N)
        for (int k = i; k > 0 && sorted[k - 1] > sorted[k]; k--) {
            double t = sorted[k];
            sorted[k] = sorted[k - 1];
            sorted[k - 1] = t;
        }
    char path[512];
    snprintf(path, sizeof(path), "%s/itl.json", g_tmp);
    TM_CHECK_OK(tm_metrics_write_json(m, path, &err), &err);
    json_error_t jerr;
    json_t *j = json_load_file(path, 0, &jerr);
    TM_CHECK(j != NULL);
    json_t *itl_j = get(j, "latency_ms", "itl");
    const char *keys[] = {"p50", "p90", "p99"};
    const double ps[] = {50, 90, 99};
    for (int k = 0; k < 3; k++) {
        double want = tm_metrics_percentile(sorted, N, ps[k]);
        double got = json_number_value(json_object_get(itl_j, keys[k]));
        TM_CHECK_MSG(fabs(got - want) <= want * 0.006, "%s: got %g want %g", keys[k], got, want);
    }
    TM_CHECK_NEAR(json_number_value(json_object_get(itl_j, "max")), sorted[N - 1], 1e-6);
    json_decref(j);
    float odd[] = {0.0f, 1e12f};
    tm_completion c2 = {.n_tok_gen = 3, .ttft_ms = 1, .total_ms = 2, .itl_ms = odd, .n_itl = 2};
    TM_CHECK_OK(tm_metrics_add_record(m, &c2, &err), &err);
    TM_CHECK_OK(tm_metrics_write_json(m, path, &err), &err);
    tm_metrics_destroy(m);
}

static void test_bench_section(void) {
    tm_metrics *m = NULL;
    tm_err err = {0};
    TM_CHECK_OK(tm_metrics_create(&m, &err), &err);
    if (!m)
        return;
    tm_metrics_bench b = {.workload = "W8",
                          .scale = "small",
                          .n_seqs = 8,
                          .prompt_tokens = 64,
                          .gen_tokens = 16,
                          .shared_prefix_tokens = 0,
                          .seed = 42};
    TM_CHECK_OK(tm_metrics_set_bench(m, &b, &err), &err);
    TM_CHECK_OK(tm_metrics_set_bench(m, &b, &err), &err); // replacing frees the old copy
    char path[512];
    snprintf(path, sizeof(path), "%s/bench.json", g_tmp);
    TM_CHECK_OK(tm_metrics_write_json(m, path, &err), &err);
    json_error_t jerr;
    json_t *j = json_load_file(path, 0, &jerr);
    TM_CHECK(j != NULL);
    TM_CHECK(strcmp(json_string_value(get(j, "bench", "workload")), "W8") == 0);
    TM_CHECK(strcmp(json_string_value(get(j, "bench", "scale")), "small") == 0);
    TM_CHECK(json_integer_value(get(j, "bench", "seqs")) == 8);
    TM_CHECK(json_integer_value(get(j, "bench", "prompt_tokens")) == 64);
    TM_CHECK(json_integer_value(get(j, "bench", "gen_tokens")) == 16);
    TM_CHECK(json_integer_value(get(j, "bench", "seed")) == 42);
    json_decref(j);
    tm_metrics_destroy(m);
}

// No records, no settings, not ended: nulls where nothing is known, still valid JSON.
static void test_empty(void) {
    tm_metrics *m = NULL;
    tm_err err = {0};
    TM_CHECK_OK(tm_metrics_create(&m, &err), &err);
    if (!m)
        return;
    tm_metrics_add_spec(m, &(tm_metrics_spec){.method = "ngram", .k = 2});
    char path[512];
    snprintf(path, sizeof(path), "%s/empty.json", g_tmp);
    TM_CHECK_OK(tm_metrics_write_json(m, path, &err), &err);
    json_error_t jerr;
    json_t *j = json_load_file(path, 0, &jerr);
    TM_CHECK(j != NULL);
    TM_CHECK(json_is_false(get(j, "time", "finished")));
    TM_CHECK(json_is_null(get(j, "tokens", "prefix_cache_hit_rate")));
    TM_CHECK(json_is_null(get(j, "throughput", "prefill_tok_s")));
    TM_CHECK(json_is_null(json_object_get(get(j, "latency_ms", "ttft"), "p50")));
    TM_CHECK(json_is_null(json_object_get(get(j, "latency_ms", "itl"), "p50")));
    TM_CHECK(json_integer_value(json_object_get(get(j, "latency_ms", "itl"), "n")) == 0);
    TM_CHECK(json_is_null(get(j, "job", NULL)));
    TM_CHECK(json_is_null(get(j, "settings", NULL)));
    TM_CHECK(json_is_null(get(j, "speculative", "acceptance_rate")));
    TM_CHECK(json_is_null(get(j, "speculative", "mean_acceptance_length")));
    TM_CHECK(json_array_size(get(j, "speculative", "acceptance_rate_per_pos")) == 2);
    json_decref(j);
    // An unwritable path is an I/O error.
    TM_CHECK(tm_metrics_write_json(m, "/nonexistent-dir/metrics.json", &err) == TM_E_IO);
    tm_metrics_destroy(m);
}

static void test_alloc_faults(void) {
    long base = tm_alloc_live();
    char path[512];
    snprintf(path, sizeof(path), "%s/faults.json", g_tmp);
    for (long k = 1; k < 1000; k++) {
        tm_metrics *m = NULL;
        tm_err err = {0};
        tm_fault_set(TM_FAULT_ALLOC, k);
        tm_rc rc = tm_metrics_create(&m, &err);
        tm_metrics_settings s = {.backend = "cuda", .model_path = "/m", .device = "H200"};
        if (!rc)
            rc = tm_metrics_set_settings(m, &s, &err);
        if (!rc)
            rc = tm_metrics_set_job(m, "job.json", &err);
        if (!rc)
            rc = tm_metrics_set_bench(m, &(tm_metrics_bench){.workload = "W1", .scale = "full"},
                                      &err);
        float itl[2] = {1, 2};
        tm_completion c = {.n_tok_gen = 3, .ttft_ms = 1, .total_ms = 3, .itl_ms = itl, .n_itl = 2};
        for (int i = 0; !rc && i < 2000; i++)
            rc = tm_metrics_add_record(m, &c, &err);
        if (!rc)
            rc = tm_metrics_write_json(m, path, &err);
        tm_fault_set(TM_FAULT_ALLOC, 0);
        tm_metrics_destroy(m);
        TM_CHECK(tm_alloc_live() == base);
        if (!rc)
            break;
        TM_CHECK_MSG(rc == TM_E_NOMEM, "alloc %ld: %s", k, err.msg);
    }
}

static void write_sample(void) {
    const char *dir = getenv("TM_SAMPLE_DIR");
    if (!dir)
        return;
    tm_metrics *m = NULL;
    tm_err err = {0};
    TM_CHECK_OK(tm_metrics_create(&m, &err), &err);
    if (!m)
        return;
    fill(m);
    const uint64_t pos[3] = {30, 25, 15}; // 40 verifications of 100 drafts, 70 accepted
    tm_metrics_add_spec(m, &(tm_metrics_spec){.method = "ngram",
                                              .k = 3,
                                              .n_drafts = 40,
                                              .n_draft_tok = 100,
                                              .n_accepted = 70,
                                              .accepted_pos = pos});
    TM_CHECK_OK(tm_metrics_set_bench(m,
                                     &(tm_metrics_bench){.workload = "P",
                                                         .scale = "small",
                                                         .n_seqs = 8,
                                                         .prompt_tokens = 256,
                                                         .gen_tokens = 1,
                                                         .seed = 1},
                                     &err),
                &err);
    tm_metrics_settings s = {.backend = "cuda",
                             .tp = 4,
                             .max_seqs = 8,
                             .max_batched_tokens = 16384,
                             .block_size = 128,
                             .kv_blocks = 4096,
                             .kv_dtype = "bf16",
                             .prefix_cache = true,
                             .threads = 16,
                             .model_path = "/models/x",
                             .model_arch = "LlamaForCausalLM",
                             .device = "NVIDIA H200 x4"};
    TM_CHECK_OK(tm_metrics_set_settings(m, &s, &err), &err);
    tm_metrics_end(m);
    char path[512];
    snprintf(path, sizeof(path), "%s/metrics.json", dir);
    TM_CHECK_OK(tm_metrics_write_json(m, path, &err), &err);
    snprintf(path, sizeof(path), "%s/metrics-empty.json", dir);
    tm_metrics_destroy(m);
    TM_CHECK_OK(tm_metrics_create(&m, &err), &err);
    TM_CHECK_OK(tm_metrics_write_json(m, path, &err), &err);
    tm_metrics_destroy(m);
}

int main(void) {
    snprintf(g_tmp, sizeof(g_tmp), "/tmp/tm_metrics_XXXXXX");
    if (!mkdtemp(g_tmp))
        return 1;
    TM_RUN(test_percentile);
    TM_RUN(test_json);
    TM_RUN(test_itl_histogram);
    TM_RUN(test_bench_section);
    TM_RUN(test_empty);
    TM_RUN(test_alloc_faults);
    TM_RUN(write_sample);
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_tmp);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", g_tmp);
    return tm_test_report();
}
