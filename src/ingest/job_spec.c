/* ingest/job_spec.c - job file loader: jansson parse, hand-written validation that mirrors
 * schemas/job.schema.json, input expansion (files, folders, glob(3) patterns) and the canonical
 * JSON text. */
#include "ingest/job_spec.h"

#include <dirent.h>
#include <errno.h>
#include <fnmatch.h>
#include <glob.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/utf8.h"
#include "base/fsutil.h"
#include "base/log.h"
#include "ingest/fields_int.h"

typedef struct loader {
    const char *file; /* job file path, for messages */
    char *dir;        /* folder of the job file; "" when it is the current folder */
    tm_job_spec *spec;
    json_t *canon;   /* canonical spec being built */
    int canon_nomem; /* a jansson allocation for canon failed */
    char **list;     /* expanded input files, owned */
    size_t n_list, cap_list;
    tm_err *err;
} loader;

static const char *const root_keys[] = {"$schema",  "model",  "input",         "output", "engine",
                                        "defaults", "limits", "chat_template", NULL};
static const char *const input_keys[] = {"files", "kafka", "shard", NULL};
static const char *const shard_keys[] = {"index", "count", "by", "prefix_bytes", NULL};
static const char *const kafka_in_keys[] = {
    "brokers", "topics", "group", "mode", "config", "startup_timeout_s", "max_read_ahead", NULL};
static const char *const output_keys[] = {"dir",
                                          "prometheus_textfile",
                                          "commit_every_s",
                                          "commit_every_records",
                                          "kafka",
                                          "compression",
                                          "results_file",
                                          "order",
                                          "job_name",
                                          NULL};
static const char *const kafka_keys[] = {
    "brokers",           "topic", "config", "transactional_id", "partitioning", "error_topic",
    "startup_timeout_s", NULL};
static const char *const engine_keys[] = {
    "backend",        "max_seqs",     "max_batched_tokens",
    "block_size",     "prefix_cache", "tp",
    "threads",        "kv_blocks",    "gpu_memory_utilization",
    "schedule",       "lookahead",    "quantization",
    "kv_cache_dtype", "speculative",  "engram_cache_mb",
    "max_model_len",
    /* end */ NULL};
static const char *const spec_keys[] = {"method",
                                        "num_speculative_tokens",
                                        "prompt_lookup_min",
                                        "prompt_lookup_max",
                                        "draft_sample_method",
                                        "confidence_threshold",
                                        NULL};
static const char *const limits_keys[] = {
    "max_line_bytes",        "max_depth", "max_field_bytes", "max_messages", "strict_fields",
    "fail_on_error_records", NULL};

const char *tm_backend_name(tm_backend b) {
    switch (b) {
    case TM_BACKEND_AUTO:
        return "auto";
    case TM_BACKEND_CPU:
        return "cpu";
    case TM_BACKEND_CUDA:
        return "cuda";
    }
    return "unknown";
}

const char *tm_job_quant_name(tm_job_quant q) { return q == TM_JOB_QUANT_FP8 ? "fp8" : "none"; }

static tm_rc fail(loader *ld, tm_rc rc, const char *jpath, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static tm_rc fail(loader *ld, tm_rc rc, const char *jpath, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return TM_ERR(ld->err, rc, "%s: %s: %s", ld->file, jpath, msg);
}

// "expected <what>, got <v>" for jpath.
static tm_rc fail_value(loader *ld, const char *jpath, const char *what, const json_t *v) {
    tm_field_fail ff;
    tm_ingest_fail_set(&ff, TM_ERRCODE_INVALID_VALUE, what, v);
    return fail(ld, TM_E_INVAL, jpath, "%s", ff.msg);
}

static void join_path(char *out, size_t n, const char *parent, const char *key) {
    if (parent[0])
        snprintf(out, n, "%s.%s", parent, key);
    else
        snprintf(out, n, "%s", key);
}

static void canon_set(loader *ld, json_t *obj, const char *key, json_t *v) {
    if (!v || json_object_set_new(obj, key, v) != 0)
        ld->canon_nomem = 1;
}

// Reject keys of obj that are not in allowed[], listing the allowed ones.
static tm_rc check_keys(loader *ld, const json_t *obj, const char *jpath,
                        const char *const *allowed) {
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)obj, key, v) {
        int ok = 0;
        for (size_t i = 0; allowed[i] && !ok; i++)
            ok = strcmp(key, allowed[i]) == 0;
        if (ok)
            continue;
        char names[256] = "";
        for (size_t i = 0; allowed[i]; i++) {
            size_t len = strlen(names);
            snprintf(names + len, sizeof(names) - len, "%s%s", i ? ", " : "", allowed[i]);
        }
        char p[160];
        join_path(p, sizeof(p), jpath, key);
        return fail(ld, TM_E_INVAL, p, "unknown key (allowed here: %s)", names);
    }
    return TM_OK;
}

// Member `key` of obj as an object (NULL when absent); checks the type and the allowed keys.
static tm_rc get_section(loader *ld, const json_t *root, const char *key, int required,
                         const char *const *allowed, json_t **out) {
    json_t *v = json_object_get(root, key);
    *out = v;
    if (!v) {
        if (required)
            return fail(ld, TM_E_INVAL, key, "required key is missing");
        return TM_OK;
    }
    if (!json_is_object(v))
        return fail_value(ld, key, "an object", v);
    return check_keys(ld, v, key, allowed);
}

static tm_rc get_u32(loader *ld, const json_t *obj, const char *sect, const char *key, uint32_t lo,
                     uint32_t hi, uint32_t dflt, uint32_t *out, json_t *canon) {
    char p[96];
    join_path(p, sizeof(p), sect, key);
    const json_t *v = obj ? json_object_get(obj, key) : NULL;
    *out = dflt;
    if (v) {
        char what[64];
        if (hi == UINT32_MAX || hi == INT32_MAX)
            snprintf(what, sizeof(what), "an integer >= %u", lo);
        else
            snprintf(what, sizeof(what), "an integer >= %u and <= %u", lo, hi);
        if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
            return fail_value(ld, p, what, v);
        *out = (uint32_t)json_integer_value(v);
    }
    canon_set(ld, canon, key, json_integer(*out));
    return TM_OK;
}

static tm_rc get_path_str(loader *ld, const json_t *obj, const char *key, const char *jpath,
                          const char **out) {
    const json_t *v = json_object_get(obj, key);
    if (!v)
        return fail(ld, TM_E_INVAL, jpath, "required key is missing");
    if (!json_is_string(v) || json_string_length(v) == 0)
        return fail_value(ld, jpath, "a non-empty string", v);
    if (strlen(json_string_value(v)) != json_string_length(v))
        return fail_value(ld, jpath, "a string without NUL characters", v);
    *out = json_string_value(v);
    return TM_OK;
}

// A path from the file, resolved against the job file's folder. NULL on allocation failure.
static char *resolve(const loader *ld, const char *given) {
    if (given[0] == '/' || ld->dir[0] == '\0')
        return tm_strdup(given);
    size_t nd = strlen(ld->dir), ng = strlen(given);
    int slash = ld->dir[nd - 1] != '/';
    char *p = tm_malloc(nd + (size_t)slash + ng + 1);
    if (!p)
        return NULL;
    memcpy(p, ld->dir, nd);
    if (slash)
        p[nd] = '/';
    memcpy(p + nd + (size_t)slash, given, ng + 1);
    return p;
}

// Append p (ownership taken, also on failure) to the expanded input list.
static tm_rc list_push(loader *ld, char *p) {
    if (!p)
        return TM_ERR(ld->err, TM_E_NOMEM, "input file list");
    if (ld->n_list == ld->cap_list) {
        size_t cap = ld->cap_list ? ld->cap_list * 2 : 16;
        char **l = tm_realloc(ld->list, cap * sizeof(*l));
        if (!l) {
            tm_free(p);
            return TM_ERR(ld->err, TM_E_NOMEM, "input file list");
        }
        ld->list = l;
        ld->cap_list = cap;
    }
    ld->list[ld->n_list++] = p;
    return TM_OK;
}

static int has_suffix(const char *s, const char *suf) {
    size_t n = strlen(s), k = strlen(suf);
    return n >= k && memcmp(s + n - k, suf, k) == 0;
}

static int is_input_name(const char *name) {
    return name[0] != '.' && (has_suffix(name, ".jsonl") || has_suffix(name, ".jsonl.lz4") ||
                              has_suffix(name, ".jsonl.gz"));
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

// Add the *.jsonl, *.jsonl.lz4 and *.jsonl.gz regular files directly inside folder, sorted by
// name (bytewise). Hidden files, subfolders and symbolic links (with a warning) are skipped.
// *n_added counts them.
static tm_rc add_folder(loader *ld, const char *jpath, const char *folder, size_t *n_added) {
    DIR *d = opendir(folder);
    if (!d)
        return fail(ld, TM_E_IO, jpath, "%s: %s", folder, strerror(errno));
    size_t first = ld->n_list;
    tm_rc rc = TM_OK;
    struct dirent *de;
    size_t nf = strlen(folder);
    int slash = nf > 0 && folder[nf - 1] != '/';
    for (;;) {
        errno = 0;
        de = readdir(d);
        if (!de)
            break;
        if (!is_input_name(de->d_name))
            continue;
        size_t nn = strlen(de->d_name);
        char *p = tm_malloc(nf + (size_t)slash + nn + 1);
        if (p) {
            memcpy(p, folder, nf);
            if (slash)
                p[nf] = '/';
            memcpy(p + nf + (size_t)slash, de->d_name, nn + 1);
            // A link inside a folder is not followed: whoever can write the folder could point
            // it anywhere (a system file's lines would be quoted into errors.jsonl). Naming the
            // link itself in input.files, or matching it by a pattern, reads what it points to.
            struct stat st;
            if (lstat(p, &st) == 0 && S_ISLNK(st.st_mode)) {
                TM_LOG_WARN("job_spec",
                            "%s: %s: skipping %s: a symbolic link inside an input folder is not "
                            "followed (list it in input.files to read it)",
                            ld->file, jpath, p);
                tm_free(p);
                continue;
            }
            if (stat(p, &st) != 0 || !S_ISREG(st.st_mode)) {
                tm_free(p);
                continue;
            }
        }
        rc = list_push(ld, p);
        if (rc)
            break;
    }
    if (!rc && errno != 0)
        rc = fail(ld, TM_E_IO, jpath, "%s: %s", folder, strerror(errno));
    closedir(d);
    if (rc)
        return rc;
    if (ld->n_list > first)
        qsort(ld->list + first, ld->n_list - first, sizeof(*ld->list), cmp_str);
    *n_added = ld->n_list - first;
    return TM_OK;
}

static tm_rc add_glob(loader *ld, const char *jpath, const char *pattern) {
    glob_t g;
    memset(&g, 0, sizeof(g));
    int grc = glob(pattern, 0, NULL, &g);
    if (grc == GLOB_NOMATCH) {
        globfree(&g);
        return fail(ld, TM_E_INVAL, jpath, "pattern %s matches nothing", pattern);
    }
    if (grc != 0) {
        globfree(&g);
        if (grc == GLOB_NOSPACE)
            return TM_ERR(ld->err, TM_E_NOMEM, "%s: %s: glob", ld->file, jpath);
        return fail(ld, TM_E_IO, jpath, "pattern %s: read error", pattern);
    }
    // glob(3) sorts with the locale's collation; re-sort bytewise for a locale-free order.
    qsort(g.gl_pathv, g.gl_pathc, sizeof(*g.gl_pathv), cmp_str);
    tm_rc rc = TM_OK;
    size_t n_added = 0;
    for (size_t i = 0; i < g.gl_pathc && !rc; i++) {
        struct stat st;
        if (stat(g.gl_pathv[i], &st) == 0 && S_ISDIR(st.st_mode)) {
            size_t k = 0;
            rc = add_folder(ld, jpath, g.gl_pathv[i], &k);
            n_added += k;
        } else {
            rc = list_push(ld, tm_strdup(g.gl_pathv[i]));
            n_added++;
        }
    }
    globfree(&g);
    if (!rc && n_added == 0)
        rc = fail(ld, TM_E_INVAL, jpath, "pattern %s matches no input files", pattern);
    return rc;
}

static tm_rc expand_entry(loader *ld, const char *jpath, const char *given) {
    if (strcmp(given, TM_JOB_STDIN) == 0) {
        for (size_t i = 0; i < ld->n_list; i++)
            if (strcmp(ld->list[i], TM_JOB_STDIN) == 0)
                return fail(ld, TM_E_INVAL, jpath, "standard input (\"-\") can be read only once");
        return list_push(ld, tm_strdup(TM_JOB_STDIN));
    }
    char *p = resolve(ld, given);
    if (!p)
        return TM_ERR(ld->err, TM_E_NOMEM, "input path");
    tm_rc rc;
    struct stat st;
    if (strpbrk(given, "*?[")) {
        rc = add_glob(ld, jpath, p);
    } else if (stat(p, &st) != 0) {
        rc = fail(ld, TM_E_IO, jpath, "%s: %s", p, strerror(errno));
    } else if (S_ISDIR(st.st_mode)) {
        size_t k = 0;
        rc = add_folder(ld, jpath, p, &k);
        if (!rc && k == 0)
            rc = fail(ld, TM_E_INVAL, jpath,
                      "folder %s holds no *.jsonl, *.jsonl.lz4 or *.jsonl.gz files", p);
    } else {
        rc = list_push(ld, p);
        p = NULL;
    }
    tm_free(p);
    return rc;
}

// Drop later duplicates of the same path (a file named twice, or by a folder and a glob), keeping
// the first position. O(n log n).
static void dedupe_inputs(loader *ld, size_t *order) {
    size_t n = ld->n_list;
    for (size_t i = 0; i < n; i++)
        order[i] = i;
    // insertion-free: sort indices by (path, index)
    for (size_t w = 1; w < n; w *= 2) { // bottom-up merge sort, stable, on order[]
        for (size_t lo = 0; lo + w < n; lo += 2 * w) {
            size_t mid = lo + w, hi = TM_MIN(lo + 2 * w, n);
            size_t a = lo, b = mid, k = 0;
            size_t *tmp = order + n; // scratch of n entries
            while (a < mid || b < hi) {
                if (b >= hi || (a < mid && strcmp(ld->list[order[a]], ld->list[order[b]]) <= 0))
                    tmp[k++] = order[a++];
                else
                    tmp[k++] = order[b++];
            }
            memcpy(order + lo, tmp, k * sizeof(*order));
        }
    }
    for (size_t i = 1; i < n; i++) {
        if (strcmp(ld->list[order[i]], ld->list[order[i - 1]]) == 0) {
            tm_free(ld->list[order[i]]); // stable sort: order[i] is the later one
            ld->list[order[i]] = NULL;
            order[i] = order[i - 1]; // keep comparing against the surviving path
        }
    }
    size_t w = 0;
    for (size_t i = 0; i < n; i++)
        if (ld->list[i])
            ld->list[w++] = ld->list[i];
    ld->n_list = w;
}

static tm_rc dup_str(loader *ld, const json_t *obj, const char *key, const char *jpath, char **out);

// A "config" object of strings (librdkafka settings) into [2 * n] owned key, value pairs.
static tm_rc load_rdkafka_config(loader *ld, const json_t *cfg, const char *jpath, char ***out,
                                 size_t *n_out) {
    if (!cfg)
        return TM_OK;
    if (!json_is_object(cfg))
        return fail_value(ld, jpath, "an object of strings", cfg);
    if (json_object_size(cfg) == 0)
        return TM_OK;
    char **kv = tm_calloc(2 * json_object_size(cfg), sizeof(char *));
    if (!kv)
        return TM_ERR(ld->err, TM_E_NOMEM, "%s", jpath);
    *out = kv; // owned by the spec from here on, also on failure
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)cfg, key, v) {
        if (!json_is_string(v)) {
            char p[160];
            snprintf(p, sizeof(p), "%s.%.100s", jpath, key);
            return fail_value(ld, p, "a string (librdkafka settings are strings)", v);
        }
        kv[2 * *n_out] = tm_strdup(key);
        kv[2 * *n_out + 1] = tm_strdup(json_string_value(v));
        (*n_out)++;
        if (!kv[2 * *n_out - 2] || !kv[2 * *n_out - 1])
            return TM_ERR(ld->err, TM_E_NOMEM, "%s", jpath);
    }
    return TM_OK;
}

// input/output.kafka.startup_timeout_s: seconds, > 0 and <= 3600 (not part of the job's identity:
// how long start-up waits for the brokers does not change the results).
static tm_rc get_startup_timeout(loader *ld, const json_t *k, const char *jpath, double *out) {
    *out = TM_JOB_DEFAULT_KAFKA_STARTUP_TIMEOUT_S;
    const json_t *v = json_object_get(k, "startup_timeout_s");
    if (!v)
        return TM_OK;
    if (!json_is_number(v) || json_number_value(v) <= 0 || json_number_value(v) > 3600)
        return fail_value(ld, jpath, "a number of seconds > 0 and <= 3600", v);
    *out = json_number_value(v);
    return TM_OK;
}

// input.kafka. Only the topics enter the canonical spec (the manifest keeps done offsets per
// topic partition, whatever the group); brokers, group, mode and config do not change the
// results (a cluster reached under another address is the same input).
static tm_rc load_kafka_in(loader *ld, const json_t *k) {
    if (!json_is_object(k))
        return fail_value(ld, "input.kafka", "an object", k);
    tm_rc rc = check_keys(ld, k, "input.kafka", kafka_in_keys);
    if (rc)
        return rc;
    tm_job_kafka_in *ki = tm_calloc(1, sizeof(*ki));
    if (!ki)
        return TM_ERR(ld->err, TM_E_NOMEM, "input.kafka");
    ld->spec->kafka_in = ki;
    rc = dup_str(ld, k, "brokers", "input.kafka.brokers", &ki->brokers);
    if (!rc)
        rc = dup_str(ld, k, "group", "input.kafka.group", &ki->group);
    if (rc)
        return rc;
    const json_t *topics = json_object_get(k, "topics");
    if (!topics)
        return fail(ld, TM_E_INVAL, "input.kafka.topics", "required key is missing");
    if (!json_is_array(topics) || json_array_size(topics) == 0)
        return fail_value(ld, "input.kafka.topics", "a non-empty array of topic names", topics);
    ki->topics = tm_calloc(json_array_size(topics), sizeof(char *));
    if (!ki->topics)
        return TM_ERR(ld->err, TM_E_NOMEM, "input.kafka.topics");
    json_t *ctopics = json_array();
    size_t i;
    const json_t *v;
    json_array_foreach(topics, i, v) {
        char p[64];
        snprintf(p, sizeof(p), "input.kafka.topics[%zu]", i);
        if (!json_is_string(v) || json_string_length(v) == 0 ||
            strlen(json_string_value(v)) != json_string_length(v)) {
            json_decref(ctopics);
            return fail_value(ld, p, "a non-empty topic name", v);
        }
        ki->topics[i] = tm_strdup(json_string_value(v));
        if (!ki->topics[i]) {
            json_decref(ctopics);
            return TM_ERR(ld->err, TM_E_NOMEM, "input.kafka.topics");
        }
        ki->n_topics = i + 1;
        if (!ctopics || json_array_append_new(ctopics, json_string(ki->topics[i])) != 0)
            ld->canon_nomem = 1;
    }
    const json_t *mode = json_object_get(k, "mode");
    if (mode) {
        const char *s = json_is_string(mode) ? json_string_value(mode) : "";
        if (strcmp(s, "drain") != 0 && strcmp(s, "follow") != 0) {
            json_decref(ctopics);
            return fail_value(ld, "input.kafka.mode", "one of \"drain\", \"follow\"", mode);
        }
        ki->follow = strcmp(s, "follow") == 0;
    }
    rc = load_rdkafka_config(ld, json_object_get(k, "config"), "input.kafka.config", &ki->config,
                             &ki->n_config);
    if (!rc)
        rc = get_startup_timeout(ld, k, "input.kafka.startup_timeout_s", &ki->startup_timeout_s);
    json_t *scratch = json_object(); // not canonical: how far ahead a run reads changes no result
    if (!rc)
        rc = get_u32(ld, k, "input.kafka", "max_read_ahead", 1, 1048576,
                     TM_JOB_DEFAULT_KAFKA_MAX_READ_AHEAD, &ki->max_read_ahead, scratch);
    json_decref(scratch);
    if (rc) {
        json_decref(ctopics);
        return rc;
    }
    json_t *cinput = json_object();
    json_t *ck = json_object();
    canon_set(ld, ck, "topics", ctopics);
    canon_set(ld, cinput, "kafka", ck);
    canon_set(ld, ld->canon, "input", cinput);
    return TM_OK;
}

// input.shard: the partition's settings as given; the index and count may come later (the
// command line, the scheduler's environment: tm_job_spec_set_shard), which also puts them into
// the canonical spec. A job without input.shard keeps the identity it had.
static tm_rc load_shard(loader *ld, const json_t *input) {
    tm_job_shard *sh = &ld->spec->shard;
    sh->index = -1;
    sh->count = 0;
    sh->by = TM_SHARD_BY_PREFIX;
    sh->prefix_bytes = TM_SHARD_DEFAULT_PREFIX_BYTES;
    const json_t *v = json_object_get(input, "shard");
    if (!v)
        return TM_OK;
    if (!json_is_object(v))
        return fail_value(ld, "input.shard", "an object", v);
    tm_rc rc = check_keys(ld, v, "input.shard", shard_keys);
    if (rc)
        return rc;
    if (json_object_get(input, "kafka"))
        return fail(ld, TM_E_INVAL, "input.shard",
                    "a Kafka input is not sharded: the consumer group spreads its partitions "
                    "over the replicas (docs/sharding.md)");
    sh->on = true;
    const json_t *c = json_object_get(v, "count");
    if (c && (!json_is_integer(c) || json_integer_value(c) < 1 ||
              json_integer_value(c) > TM_SHARD_MAX_COUNT))
        return fail_value(ld, "input.shard.count", "an integer from 1 to 100000", c);
    sh->count = c ? json_integer_value(c) : 0;
    const json_t *i = json_object_get(v, "index");
    if (i && (!json_is_integer(i) || json_integer_value(i) < 0 ||
              json_integer_value(i) > TM_SHARD_MAX_COUNT))
        return fail_value(ld, "input.shard.index", "an integer >= 0", i);
    sh->index = i ? json_integer_value(i) : -1;
    if (sh->index >= 0 && sh->count > 0 && sh->index >= sh->count)
        return fail(ld, TM_E_INVAL, "input.shard.index", "%lld is not below input.shard.count %lld",
                    (long long)sh->index, (long long)sh->count);
    const json_t *by = json_object_get(v, "by");
    if (by && (!json_is_string(by) || (strcmp(json_string_value(by), "prefix") != 0 &&
                                       strcmp(json_string_value(by), "id") != 0)))
        return fail_value(ld, "input.shard.by", "one of \"prefix\", \"id\"", by);
    sh->by = by && strcmp(json_string_value(by), "id") == 0 ? TM_SHARD_BY_ID : TM_SHARD_BY_PREFIX;
    const json_t *pb = json_object_get(v, "prefix_bytes");
    if (pb &&
        (!json_is_integer(pb) || json_integer_value(pb) < 1 || json_integer_value(pb) > (1 << 20)))
        return fail_value(ld, "input.shard.prefix_bytes", "an integer from 1 to 1048576", pb);
    if (pb)
        sh->prefix_bytes = (uint32_t)json_integer_value(pb);
    return TM_OK;
}

static tm_rc load_input(loader *ld, const json_t *input) {
    const json_t *files = json_object_get(input, "files");
    const json_t *kafka = json_object_get(input, "kafka");
    if (files && kafka)
        return fail(ld, TM_E_INVAL, "input", "give either files or kafka, not both");
    tm_rc src = load_shard(ld, input);
    if (src)
        return src;
    if (kafka)
        return load_kafka_in(ld, kafka);
    if (!files)
        return fail(ld, TM_E_INVAL, "input.files", "required key is missing (or input.kafka)");
    if (!json_is_array(files) || json_array_size(files) == 0)
        return fail_value(ld, "input.files", "a non-empty array of strings", files);
    json_t *cfiles = json_array();
    json_t *cinput = json_object();
    canon_set(ld, cinput, "files", cfiles);
    canon_set(ld, ld->canon, "input", cinput);
    size_t i;
    const json_t *v;
    json_array_foreach(files, i, v) {
        char p[64];
        snprintf(p, sizeof(p), "input.files[%zu]", i);
        if (!json_is_string(v) || json_string_length(v) == 0 ||
            strlen(json_string_value(v)) != json_string_length(v))
            return fail_value(ld, p, "a non-empty string (file, folder or glob pattern)", v);
        if (cfiles && json_array_append_new(cfiles, json_string(json_string_value(v))) != 0)
            ld->canon_nomem = 1;
        char *given = tm_path_unescape(json_string_value(v)); // \xHH: any byte (base/utf8.h)
        if (!given)
            return TM_ERR(ld->err, TM_E_NOMEM, "input path");
        tm_rc rc = expand_entry(ld, p, given);
        tm_free(given);
        if (rc)
            return rc;
    }
    size_t *order = tm_calloc(ld->n_list * 2, sizeof(*order));
    if (!order)
        return TM_ERR(ld->err, TM_E_NOMEM, "input file list");
    dedupe_inputs(ld, order);
    tm_free(order);
    ld->spec->inputs = ld->list;
    ld->spec->n_inputs = ld->n_list;
    ld->list = NULL;
    ld->n_list = ld->cap_list = 0;
    return TM_OK;
}

// engine.speculative (vLLM's speculative_config names): n-gram drafts, or "mtp" (the DeepSeek-V4
// MTP layer; the runner refuses it for a model without one or another engine). Written to the
// canonical spec only when present, so the identity of jobs without it stays what it was.
static tm_rc load_speculative(loader *ld, const json_t *eng, json_t *c) {
    tm_job_engine *e = &ld->spec->engine;
    const json_t *sp = eng ? json_object_get(eng, "speculative") : NULL;
    if (!sp)
        return TM_OK;
    if (!json_is_object(sp))
        return fail_value(ld, "engine.speculative", "an object", sp);
    tm_rc rc = check_keys(ld, sp, "engine.speculative", spec_keys);
    if (rc)
        return rc;
    const json_t *v = json_object_get(sp, "method");
    const char *m = json_is_string(v) ? json_string_value(v) : "";
    if (!v)
        return fail(ld, TM_E_INVAL, "engine.speculative.method", "required key is missing");
    e->spec_mtp = strcmp(m, "mtp") == 0;
    e->spec_dspark = strcmp(m, "dspark") == 0;
    if (!e->spec_mtp && !e->spec_dspark && strcmp(m, "ngram") != 0)
        return fail_value(ld, "engine.speculative.method", "one of \"ngram\", \"mtp\", \"dspark\"",
                          v);
    json_t *cs = json_object();
    canon_set(ld, c, "speculative", cs);
    if (!cs)
        return TM_ERR(ld->err, TM_E_NOMEM, "canonical spec");
    canon_set(ld, cs, "method", json_string(m));
    // vLLM's draft_sample_method: how a drafter picks its drafts. Verification draws the target's
    // token with the record's own uniform and accepts a draft iff it equals the draw, which keeps
    // the target distribution for drafts picked either way; the DSpark drafter's picks are its
    // greedy chain under both spellings (docs/speculative.md "DSpark").
    const json_t *dsm = json_object_get(sp, "draft_sample_method");
    if (dsm) {
        const char *ds = json_is_string(dsm) ? json_string_value(dsm) : "";
        if (strcmp(ds, "greedy") != 0 && strcmp(ds, "probabilistic") != 0)
            return fail_value(ld, "engine.speculative.draft_sample_method",
                              "one of \"greedy\", \"probabilistic\"", dsm);
        canon_set(ld, cs, "draft_sample_method", json_string(ds));
    }
    // DeepSpec's confidence_threshold (dspark only): a block's drafts end before the first whose
    // confidence-head probability is below it; 0 (the reference inference's behaviour): none cut
    const json_t *ct = json_object_get(sp, "confidence_threshold");
    if (ct) {
        if (!json_is_number(ct) || json_number_value(ct) < 0.0 || json_number_value(ct) > 1.0)
            return fail_value(ld, "engine.speculative.confidence_threshold", "a number in [0, 1]",
                              ct);
        if (!e->spec_dspark)
            return fail(ld, TM_E_INVAL, "engine.speculative.confidence_threshold",
                        "only applies to method \"dspark\"");
        e->spec_conf_threshold = json_number_value(ct);
        canon_set(ld, cs, "confidence_threshold", json_real(e->spec_conf_threshold));
    }
    if (!json_object_get(sp, "num_speculative_tokens"))
        return fail(ld, TM_E_INVAL, "engine.speculative.num_speculative_tokens",
                    "required key is missing");
    rc = get_u32(ld, sp, "engine.speculative", "num_speculative_tokens", 1, TM_JOB_MAX_SPEC_TOKENS,
                 0, &e->spec_k, cs);
    // vLLM: both unset 5 and 5; one unset takes the other's value.
    const int has_min = json_object_get(sp, "prompt_lookup_min") != NULL;
    const int has_max = json_object_get(sp, "prompt_lookup_max") != NULL;
    if (!rc)
        rc = get_u32(ld, sp, "engine.speculative", "prompt_lookup_max", 1, 1024,
                     TM_JOB_DEFAULT_PROMPT_LOOKUP, &e->spec_lookup_max, cs);
    if (!rc)
        rc = get_u32(ld, sp, "engine.speculative", "prompt_lookup_min", 1, 1024,
                     has_max ? e->spec_lookup_max : TM_JOB_DEFAULT_PROMPT_LOOKUP,
                     &e->spec_lookup_min, cs);
    if (!rc && has_min && !has_max) {
        e->spec_lookup_max = e->spec_lookup_min;
        canon_set(ld, cs, "prompt_lookup_max", json_integer(e->spec_lookup_max));
    }
    if (!rc && e->spec_lookup_min > e->spec_lookup_max)
        rc = fail(ld, TM_E_INVAL, "engine.speculative.prompt_lookup_min",
                  "%u is more than prompt_lookup_max %u", e->spec_lookup_min, e->spec_lookup_max);
    return rc;
}

static tm_rc load_engine(loader *ld, const json_t *eng) {
    tm_job_engine *e = &ld->spec->engine;
    json_t *c = json_object();
    canon_set(ld, ld->canon, "engine", c);
    if (!c)
        return TM_ERR(ld->err, TM_E_NOMEM, "canonical spec");
    const json_t *v = eng ? json_object_get(eng, "backend") : NULL;
    e->backend = TM_BACKEND_AUTO;
    if (v) {
        const char *s = json_is_string(v) ? json_string_value(v) : "";
        if (strcmp(s, "auto") == 0)
            e->backend = TM_BACKEND_AUTO;
        else if (strcmp(s, "cpu") == 0)
            e->backend = TM_BACKEND_CPU;
        else if (strcmp(s, "cuda") == 0)
            e->backend = TM_BACKEND_CUDA;
        else
            return fail_value(ld, "engine.backend", "one of \"auto\", \"cpu\", \"cuda\"", v);
    }
    canon_set(ld, c, "backend", json_string(tm_backend_name(e->backend)));
    tm_rc rc;
    rc = get_u32(ld, eng, "engine", "max_seqs", 1, INT32_MAX, TM_JOB_DEFAULT_MAX_SEQS, &e->max_seqs,
                 c);
    if (rc)
        return rc;
    rc = get_u32(ld, eng, "engine", "max_batched_tokens", 1, INT32_MAX,
                 TM_JOB_DEFAULT_MAX_BATCHED_TOKENS, &e->max_batched_tokens, c);
    if (rc)
        return rc;
    rc = get_u32(ld, eng, "engine", "block_size", 1, 65536, TM_JOB_DEFAULT_BLOCK_SIZE,
                 &e->block_size, c);
    if (rc)
        return rc;
    if (e->block_size & (e->block_size - 1))
        return fail_value(ld, "engine.block_size", "a power of two between 1 and 65536",
                          json_object_get(eng, "block_size"));
    v = eng ? json_object_get(eng, "prefix_cache") : NULL;
    e->prefix_cache = true;
    if (v) {
        if (!json_is_boolean(v))
            return fail_value(ld, "engine.prefix_cache", "true or false", v);
        e->prefix_cache = json_is_true(v);
    }
    canon_set(ld, c, "prefix_cache", json_boolean(e->prefix_cache));
    rc = get_u32(ld, eng, "engine", "tp", 1, 1024, 1, &e->tp, c);
    if (rc)
        return rc;
    rc = get_u32(ld, eng, "engine", "threads", 0, TM_JOB_MAX_THREADS, 0, &e->threads, c);
    if (rc)
        return rc;
    // More threads than cores only adds switching; far more (65,536 took 5 GB of stacks before
    // failing) is a typo. The limit depends on the machine, as the default (0) does.
    long n_cpu = sysconf(_SC_NPROCESSORS_ONLN);
    if (n_cpu > 0 && e->threads > 4 * (uint64_t)n_cpu)
        return fail(ld, TM_E_INVAL, "engine.threads",
                    "%u is more than 4 x the %ld online CPU cores of this machine (at most %ld; "
                    "0 means one per core)",
                    e->threads, n_cpu, 4 * n_cpu);
    rc = get_u32(ld, eng, "engine", "kv_blocks", 0, INT32_MAX, 0, &e->kv_blocks, c);
    if (rc)
        return rc;
    // Not part of the job's identity (like commit_every_s): it sizes memory, not results, and a
    // resumed run may need another value on another GPU.
    v = eng ? json_object_get(eng, "gpu_memory_utilization") : NULL;
    e->gpu_memory_utilization = TM_JOB_DEFAULT_GPU_MEMORY_UTILIZATION;
    if (v) {
        if (!json_is_number(v) || !(json_number_value(v) > 0) || json_number_value(v) > 1)
            return fail_value(ld, "engine.gpu_memory_utilization", "a number > 0 and <= 1", v);
        e->gpu_memory_utilization = json_number_value(v);
    }
    v = eng ? json_object_get(eng, "schedule") : NULL;
    e->schedule_fcfs = false;
    if (v) {
        const char *s = json_is_string(v) ? json_string_value(v) : "";
        if (strcmp(s, "fcfs") != 0 && strcmp(s, "prefix") != 0)
            return fail_value(ld, "engine.schedule", "one of \"prefix\", \"fcfs\"", v);
        e->schedule_fcfs = strcmp(s, "fcfs") == 0;
    }
    canon_set(ld, c, "schedule", json_string(e->schedule_fcfs ? "fcfs" : "prefix"));
    rc = get_u32(ld, eng, "engine", "lookahead", 1, 1u << 20, TM_JOB_DEFAULT_LOOKAHEAD,
                 &e->lookahead, c);
    if (rc)
        return rc;
    // 0 (absent): the model's context length. Part of the identity only when set.
    if (eng && json_object_get(eng, "max_model_len")) {
        rc = get_u32(ld, eng, "engine", "max_model_len", 1, INT32_MAX, 0, &e->max_model_len, c);
        if (rc)
            return rc;
    }
    // Part of the job's identity (it changes the results), but written only when not "none", so
    // the canonical spec (and so the resume identity) of jobs without it stays what it was.
    v = eng ? json_object_get(eng, "quantization") : NULL;
    e->quantization = TM_JOB_QUANT_NONE;
    if (v) {
        const char *s = json_is_string(v) ? json_string_value(v) : "";
        if (strcmp(s, "fp8") != 0 && strcmp(s, "none") != 0)
            return fail_value(ld, "engine.quantization", "one of \"none\", \"fp8\"", v);
        e->quantization = strcmp(s, "fp8") == 0 ? TM_JOB_QUANT_FP8 : TM_JOB_QUANT_NONE;
    }
    if (e->quantization != TM_JOB_QUANT_NONE) {
        if (e->tp > 1)
            return fail(ld, TM_E_INVAL, "engine.quantization",
                        "\"%s\" with engine.tp %u is not supported (no engine splits quantized "
                        "weights across ranks yet)",
                        tm_job_quant_name(e->quantization), e->tp);
        canon_set(ld, c, "quantization", json_string(tm_job_quant_name(e->quantization)));
    }
    // Not part of the job's identity (as gpu_memory_utilization): it sizes a cache, the rows
    // read are the same whatever it holds.
    v = eng ? json_object_get(eng, "engram_cache_mb") : NULL;
    e->engram_cache_mb = TM_JOB_DEFAULT_ENGRAM_CACHE_MB;
    if (v) {
        if (!json_is_integer(v) || json_integer_value(v) < 1 ||
            json_integer_value(v) > TM_JOB_MAX_ENGRAM_CACHE_MB)
            return fail_value(ld, "engine.engram_cache_mb", "an integer >= 1 and <= 1048576", v);
        e->engram_cache_mb = (uint32_t)json_integer_value(v);
    }
    // Also part of the identity, written only when not "auto" (as quantization).
    v = eng ? json_object_get(eng, "kv_cache_dtype") : NULL;
    e->kv_cache_fp8 = false;
    if (v) {
        const char *s = json_is_string(v) ? json_string_value(v) : "";
        if (strcmp(s, "fp8") != 0 && strcmp(s, "auto") != 0)
            return fail_value(ld, "engine.kv_cache_dtype", "one of \"auto\", \"fp8\"", v);
        e->kv_cache_fp8 = strcmp(s, "fp8") == 0;
    }
    if (e->kv_cache_fp8)
        canon_set(ld, c, "kv_cache_dtype", json_string("fp8"));
    return load_speculative(ld, eng, c);
}

static tm_rc load_defaults(loader *ld, const json_t *dflt) {
    tm_sampling *sp = &ld->spec->defaults;
    sp->max_tokens = TM_JOB_DEFAULT_MAX_TOKENS;
    sp->temperature = 1.0f;
    sp->top_p = 1.0f;
    sp->top_k = -1;
    sp->min_p = 0.0f;
    sp->seed = 0;
    if (dflt) {
        const char *key;
        json_t *v;
        json_object_foreach((json_t *)dflt, key, v) {
            char p[96];
            join_path(p, sizeof(p), "defaults", key);
            if (!tm_ingest_sp_bit(key))
                return check_keys(ld, dflt, "defaults", tm_ingest_sp_keys);
            tm_field_fail ff;
            tm_rc rc = tm_ingest_sp_field(key, v, sp, &ff, ld->err);
            if (rc)
                return rc;
            if (ff.code != TM_ERRCODE_NONE)
                return fail(ld, TM_E_INVAL, p, "%s", ff.msg);
        }
    }
    json_t *c = json_object();
    canon_set(ld, ld->canon, "defaults", c);
    if (!c)
        return TM_ERR(ld->err, TM_E_NOMEM, "canonical spec");
    // Reals are written from the JSON value (double), not the float copy, so "0.7" stays 0.7.
    const char *real_keys[] = {"temperature", "top_p", "min_p"};
    const double real_dflt[] = {1.0, 1.0, 0.0};
    for (size_t i = 0; i < 3; i++) {
        const json_t *v = dflt ? json_object_get(dflt, real_keys[i]) : NULL;
        canon_set(ld, c, real_keys[i], json_real(v ? json_number_value(v) : real_dflt[i]));
    }
    canon_set(ld, c, "max_tokens", json_integer(sp->max_tokens));
    canon_set(ld, c, "top_k", json_integer(sp->top_k));
    canon_set(ld, c, "seed", json_integer((json_int_t)sp->seed));
    json_t *stop = json_array();
    canon_set(ld, c, "stop", stop);
    for (uint32_t i = 0; stop && i < sp->n_stop; i++)
        if (json_array_append_new(stop, json_string(sp->stop[i])) != 0)
            ld->canon_nomem = 1;
    return TM_OK;
}

static tm_rc load_limits(loader *ld, const json_t *lim) {
    json_t *c = json_object();
    canon_set(ld, ld->canon, "limits", c);
    if (!c)
        return TM_ERR(ld->err, TM_E_NOMEM, "canonical spec");
    uint32_t m = 0;
    tm_rc rc = get_u32(ld, lim, "limits", "max_line_bytes", 1, 1u << 30,
                       TM_JOB_DEFAULT_MAX_LINE_BYTES, &m, c);
    ld->spec->max_line_bytes = m;
    if (!rc)
        rc = get_u32(ld, lim, "limits", "max_depth", 1, TM_JOB_MAX_DEPTH_LIMIT,
                     TM_JOB_DEFAULT_MAX_DEPTH, &ld->spec->max_depth, c);
    if (!rc)
        rc = get_u32(ld, lim, "limits", "max_field_bytes", 1, 1u << 30,
                     TM_JOB_DEFAULT_MAX_FIELD_BYTES, &m, c);
    ld->spec->max_field_bytes = m;
    if (!rc)
        rc = get_u32(ld, lim, "limits", "max_messages", 1, 1u << 20, TM_JOB_DEFAULT_MAX_MESSAGES,
                     &ld->spec->max_messages, c);
    // strict_fields changes which records fail, so it is canonical, but only when true (the
    // identity of jobs without it stays what it was); fail_on_error_records is the exit status
    // only, not part of the job's identity.
    const char *flags[] = {"strict_fields", "fail_on_error_records"};
    bool *outs[] = {&ld->spec->strict_fields, &ld->spec->fail_on_error_records};
    for (size_t i = 0; !rc && i < 2; i++) {
        const json_t *v = lim ? json_object_get(lim, flags[i]) : NULL;
        char p[64];
        join_path(p, sizeof(p), "limits", flags[i]);
        if (v && !json_is_boolean(v))
            return fail_value(ld, p, "true or false", v);
        *outs[i] = json_is_true(v);
    }
    if (!rc && ld->spec->strict_fields)
        canon_set(ld, c, "strict_fields", json_true());
    return rc;
}

static tm_rc dup_str(loader *ld, const json_t *obj, const char *key, const char *jpath,
                     char **out) {
    const char *s = NULL;
    tm_rc rc = get_path_str(ld, obj, key, jpath, &s);
    if (rc)
        return rc;
    *out = tm_strdup(s);
    return *out ? TM_OK : TM_ERR(ld->err, TM_E_NOMEM, "%s", jpath);
}

// output.kafka: part of the job's identity (where the results go), so it enters the canonical
// spec; only its hash is ever stored (the manifest), so secrets in config stay in the job file.
static tm_rc load_kafka_out(loader *ld, const json_t *k, json_t *cout) {
    if (!json_is_object(k))
        return fail_value(ld, "output.kafka", "an object", k);
    tm_rc rc = check_keys(ld, k, "output.kafka", kafka_keys);
    if (rc)
        return rc;
    tm_job_kafka_out *ko = tm_calloc(1, sizeof(*ko));
    if (!ko)
        return TM_ERR(ld->err, TM_E_NOMEM, "output.kafka");
    ld->spec->kafka = ko;
    rc = dup_str(ld, k, "brokers", "output.kafka.brokers", &ko->brokers);
    if (!rc)
        rc = dup_str(ld, k, "topic", "output.kafka.topic", &ko->topic);
    if (!rc && json_object_get(k, "transactional_id"))
        rc = dup_str(ld, k, "transactional_id", "output.kafka.transactional_id",
                     &ko->transactional_id);
    if (!rc)
        rc = load_rdkafka_config(ld, json_object_get(k, "config"), "output.kafka.config",
                                 &ko->config, &ko->n_config);
    if (!rc)
        rc = get_startup_timeout(ld, k, "output.kafka.startup_timeout_s", &ko->startup_timeout_s);
    if (!rc && json_object_get(k, "error_topic"))
        rc = dup_str(ld, k, "error_topic", "output.kafka.error_topic", &ko->error_topic);
    const json_t *part = json_object_get(k, "partitioning");
    if (!rc && part) {
        const char *s = json_is_string(part) ? json_string_value(part) : "";
        if (strcmp(s, "key") != 0 && strcmp(s, "input") != 0)
            return fail_value(ld, "output.kafka.partitioning", "one of \"key\", \"input\"", part);
        ko->by_input_partition = strcmp(s, "input") == 0;
    }
    if (!rc && cout) {
        json_t *ck = json_deep_copy(k);
        if (ck)
            json_object_del(ck, "startup_timeout_s"); // how long start-up waits: not identity
        canon_set(ld, cout, "kafka", ck);
    }
    return rc;
}

// output.commit_every_s / commit_every_records (not part of the job's identity: how often
// progress is saved does not change the results) and output.kafka.
static tm_rc load_output_extra(loader *ld, const json_t *output, json_t *cout) {
    tm_job_spec *spec = ld->spec;
    spec->commit_every_s = TM_JOB_DEFAULT_COMMIT_EVERY_S;
    const json_t *v = json_object_get(output, "commit_every_s");
    if (v) {
        if (!json_is_number(v) || json_number_value(v) <= 0 || json_number_value(v) > 86400)
            return fail_value(ld, "output.commit_every_s", "a number > 0 and <= 86400", v);
        spec->commit_every_s = json_number_value(v);
    }
    json_t *scratch = json_object(); // get_u32 writes the value into a canonical object
    tm_rc rc = get_u32(ld, output, "output", "commit_every_records", 1, INT32_MAX,
                       TM_JOB_DEFAULT_COMMIT_EVERY_RECORDS, &spec->commit_every_records, scratch);
    json_decref(scratch);
    // compression: part of the identity (another file), written only when not "lz4" so the
    // canonical spec of existing jobs stays what it was. results_file: where a copy goes, not.
    v = json_object_get(output, "compression");
    if (!rc && v) {
        const char *s = json_is_string(v) ? json_string_value(v) : "";
        if (strcmp(s, "lz4") != 0 && strcmp(s, "none") != 0)
            return fail_value(ld, "output.compression", "one of \"lz4\", \"none\"", v);
        spec->compression = strcmp(s, "none") == 0 ? TM_JOB_COMPRESSION_NONE
                                                   : TM_JOB_COMPRESSION_LZ4;
        if (spec->compression == TM_JOB_COMPRESSION_NONE && cout)
            canon_set(ld, cout, "compression", json_string("none"));
    }
    if (!rc && json_object_get(output, "results_file")) {
        const char *s = NULL;
        rc = get_path_str(ld, output, "results_file", "output.results_file", &s);
        if (!rc && !(spec->results_file = resolve(ld, s)))
            rc = TM_ERR(ld->err, TM_E_NOMEM, "output path");
    }
    // job_name: what metrics.json, the report and the textfile call the job; not part of the
    // identity (a label).
    v = json_object_get(output, "job_name");
    if (!rc && v) {
        if (!json_is_string(v) || !json_string_length(v) || json_string_length(v) > 200)
            return fail_value(ld, "output.job_name", "a string of 1 to 200 bytes", v);
        if (!(spec->job_name = tm_strdup(json_string_value(v))))
            return TM_ERR(ld->err, TM_E_NOMEM, "output.job_name");
    }
    // order: how the results file's lines are ordered; not part of the identity (a copy's order).
    v = json_object_get(output, "order");
    if (!rc && v) {
        const char *s = json_is_string(v) ? json_string_value(v) : "";
        if (strcmp(s, "completion") != 0 && strcmp(s, "input") != 0)
            return fail_value(ld, "output.order", "one of \"completion\", \"input\"", v);
        spec->results_input_order = strcmp(s, "input") == 0;
    }
    if (!rc && json_object_get(output, "kafka"))
        rc = load_kafka_out(ld, json_object_get(output, "kafka"), cout);
    return rc;
}

// ---- what the job writes against what it reads (issue 24) ----

// The names tokenmill writes in output.dir (sink/sink.h, sink/manifest.h, metrics.json and the
// temporary files of its atomic replacements). ingest does not include the sink's headers, so
// they are listed here; sink/manifest.c's tm_manifest_check_folder checks the same names.
static const char *const out_names[] = {
    "completions.jsonl.lz4", "completions.jsonl", "errors.jsonl",      "metrics.json",
    "manifest.json",         "tokenmill.lock",    "manifest.json.tmp", "metrics.json.tmp"};
enum { N_OUT_NAMES = sizeof(out_names) / sizeof(out_names[0]) };

// One file the job writes: its folder (canonical) and name there, and the field that makes it.
typedef struct out_file {
    const char *dir;  /* tm_fs_canon of the folder; borrowed from out_set */
    const char *name; /* name in dir; borrowed */
    char *canon;      /* owned; tm_fs_canon of dir/name (a link there resolved) */
    char field[80];   /* "output.dir (errors.jsonl)", "output.prometheus_textfile", ... */
} out_file;

typedef struct out_set {
    char *dir, *text_dir, *text_name, *text_tmp; /* owned canonical folders and names */
    char *res_dir, *res_name, *res_tmp;          /* output.results_file's */
    out_file f[N_OUT_NAMES + 4];
    size_t n;
} out_set;

static void out_set_fini(out_set *o) {
    for (size_t i = 0; i < o->n; i++)
        tm_free(o->f[i].canon);
    tm_free(o->dir);
    tm_free(o->text_dir);
    tm_free(o->text_name);
    tm_free(o->text_tmp);
    tm_free(o->res_dir);
    tm_free(o->res_name);
    tm_free(o->res_tmp);
}

// The canonical folder of path and the name in it (new strings; false when out of memory).
static bool split_canon(const char *path, char **dir, char **name) {
    char *c = tm_fs_canon(path);
    const char *slash = c ? strrchr(c, '/') : NULL;
    *dir = !c       ? NULL
           : !slash ? tm_strdup(".")
                    : tm_strndup(c, slash == c ? 1 : (size_t)(slash - c));
    *name = !c ? NULL : tm_strdup(slash ? slash + 1 : c);
    tm_free(c);
    return *dir && *name;
}

static bool out_add(out_set *o, const char *dir, const char *name, const char *field) {
    out_file *f = &o->f[o->n++];
    f->dir = dir;
    f->name = name;
    // field names are short literals; a longer one is cut (it only names the field in errors)
    const size_t fl = strnlen(field, sizeof(f->field) - 1);
    memcpy(f->field, field, fl);
    f->field[fl] = 0;
    char *p = tm_fs_path_join(dir, name);
    f->canon = p ? tm_fs_canon(p) : NULL;
    tm_free(p);
    return f->canon != NULL;
}

// A file given by path (a job field) and its .tmp file, added to o; the names go to *dir,
// *name and *tmp (owned by o).
static bool out_add_file(out_set *o, const char *path, const char *field, char **dir, char **name,
                         char **tmp) {
    if (!split_canon(path, dir, name))
        return false;
    size_t n = strlen(*name);
    *tmp = tm_malloc(n + sizeof(".tmp"));
    if (!*tmp)
        return false;
    memcpy(*tmp, *name, n);
    memcpy(*tmp + n, ".tmp", sizeof(".tmp"));
    char tfield[96];
    snprintf(tfield, sizeof(tfield), "%s (its .tmp file)", field);
    return out_add(o, *dir, *name, field) && out_add(o, *dir, *tmp, tfield);
}

static bool out_set_make(const tm_job_spec *spec, out_set *o) {
    o->dir = tm_fs_canon(spec->output_dir);
    if (!o->dir)
        return false;
    for (size_t i = 0; i < N_OUT_NAMES; i++) {
        char field[80];
        snprintf(field, sizeof(field), "output.dir (%s)", out_names[i]);
        if (!out_add(o, o->dir, out_names[i], field))
            return false;
    }
    if (spec->prometheus_textfile &&
        !out_add_file(o, spec->prometheus_textfile, "output.prometheus_textfile", &o->text_dir,
                      &o->text_name, &o->text_tmp))
        return false;
    return !spec->results_file || out_add_file(o, spec->results_file, "output.results_file",
                                               &o->res_dir, &o->res_name, &o->res_tmp);
}

// A glob pattern with the folders before its first wildcard made canonical (new string or NULL).
static char *canon_pattern(const char *pat) {
    const char *w = strpbrk(pat, "*?[");
    const char *slash = NULL;
    for (const char *q = pat; q < w; q++)
        if (*q == '/')
            slash = q;
    char *pre = !slash ? tm_strdup(".") : tm_strndup(pat, slash == pat ? 1 : (size_t)(slash - pat));
    char *c = pre ? tm_fs_canon(pre) : NULL;
    tm_free(pre);
    if (!c)
        return NULL;
    const char *rest = slash ? slash + 1 : pat;
    size_t nc = strlen(c), nr = strlen(rest);
    char *out = tm_malloc(nc + nr + 2);
    if (out) {
        memcpy(out, c, nc);
        size_t k = nc;
        if (nc == 0 || c[nc - 1] != '/')
            out[k++] = '/';
        memcpy(out + k, rest, nr + 1);
    }
    tm_free(c);
    return out;
}

// Does input entry `given` (input.files[i], resolved p) read out file f, now or once the job has
// written it? A file: the same file. A folder: f is one of its input-named files. A pattern: it
// matches f, or the folder of f when f has an input name (glob expands folders).
static bool entry_reads(const char *given, const char *p, const out_file *f, bool *nomem) {
    char *in_dir = tm_fs_path_join(f->dir, f->name);
    if (!in_dir) {
        *nomem = true;
        return false;
    }
    bool hit = false;
    if (strpbrk(given, "*?[")) {
        char *pat = canon_pattern(p);
        if (!pat)
            *nomem = true;
        else
            hit = fnmatch(pat, in_dir, FNM_PATHNAME | FNM_PERIOD) == 0 ||
                  fnmatch(pat, f->canon, FNM_PATHNAME | FNM_PERIOD) == 0 ||
                  (is_input_name(f->name) && fnmatch(pat, f->dir, FNM_PATHNAME | FNM_PERIOD) == 0);
        tm_free(pat);
    } else {
        char *c = tm_fs_canon(p);
        struct stat st;
        if (!c)
            *nomem = true;
        else if (stat(c, &st) == 0 && S_ISDIR(st.st_mode))
            hit = is_input_name(f->name) && tm_fs_same_file(c, f->dir);
        else
            hit = tm_fs_same_file(c, f->canon);
        tm_free(c);
    }
    tm_free(in_dir);
    return hit;
}

// Every path the job writes against every other one, the job file, the model folder and every
// input (as given and as expanded): a collision is a job-spec error naming both fields. Paths are
// compared in canonical form (tm_fs_canon) and, where both exist, by inode.
static tm_rc check_outputs(loader *ld, const json_t *input) {
    const tm_job_spec *spec = ld->spec;
    out_set o = {0};
    char *job = NULL, *model = NULL;
    tm_rc rc = TM_OK;
    bool nomem = !out_set_make(spec, &o);
    if (!nomem) {
        job = tm_fs_canon(ld->file);
        model = tm_fs_canon(spec->model);
        nomem = !job || !model;
    }
    // The side files (textfile, results file, their .tmp) against output.dir's and each other.
    for (size_t i = N_OUT_NAMES; i < o.n && !rc && !nomem; i++) {
        char key[64];
        snprintf(key, sizeof(key), "%.*s", (int)strcspn(o.f[i].field, " "), o.f[i].field);
        for (size_t k = 0; k < i && !rc; k++)
            if (tm_fs_same_file(o.f[i].canon, o.f[k].canon))
                rc = fail(ld, TM_E_INVAL, key,
                          "%s is also %s: outputs must not overwrite each other", o.f[i].canon,
                          o.f[k].field);
        if (!rc && tm_fs_same_file(o.f[i].dir, model))
            rc = fail(ld, TM_E_INVAL, key,
                      "%s is inside the model folder (model): outputs must not write into it",
                      o.f[i].canon);
    }
    for (size_t i = 0; i < o.n && !rc && !nomem; i++)
        if (tm_fs_same_file(o.f[i].canon, job))
            rc = fail(ld, TM_E_INVAL, o.f[i].field, "%s is the job file itself", o.f[i].canon);
    const json_t *files = json_object_get(input, "files");
    for (size_t e = 0; e < json_array_size(files) && !rc && !nomem; e++) {
        const char *given = json_string_value(json_array_get(files, e));
        if (!given || strcmp(given, TM_JOB_STDIN) == 0)
            continue;
        char *p = resolve(ld, given);
        nomem = !p;
        for (size_t i = 0; i < o.n && !rc && !nomem; i++) {
            if (!entry_reads(given, p, &o.f[i], &nomem))
                continue;
            char jpath[64];
            snprintf(jpath, sizeof(jpath), "input.files[%zu]", e);
            rc = fail(ld, TM_E_INVAL, jpath,
                      "\"%s\" reads %s, which is %s: a job must not read its own outputs (they "
                      "would be overwritten, or read as inputs by the next run); choose paths "
                      "outside the inputs",
                      given, o.f[i].canon, o.f[i].field);
        }
        tm_free(p);
    }
    // The expanded inputs against outputs that exist: another name (a link) of an output.
    for (size_t i = 0; i < o.n && !rc && !nomem; i++) {
        struct stat so, si;
        if (stat(o.f[i].canon, &so) != 0)
            continue;
        for (size_t k = 0; k < spec->n_inputs && !rc; k++)
            if (strcmp(spec->inputs[k], TM_JOB_STDIN) != 0 && stat(spec->inputs[k], &si) == 0 &&
                si.st_dev == so.st_dev && si.st_ino == so.st_ino)
                rc = fail(ld, TM_E_INVAL, "input.files",
                          "input %s is %s (%s): a job must not read its own outputs",
                          spec->inputs[k], o.f[i].canon, o.f[i].field);
    }
    if (nomem && !rc)
        rc = TM_ERR(ld->err, TM_E_NOMEM, "output paths");
    tm_free(job);
    tm_free(model);
    out_set_fini(&o);
    return rc;
}

static tm_rc load_root(loader *ld, const json_t *root) {
    tm_job_spec *spec = ld->spec;
    tm_rc rc = check_keys(ld, root, "", root_keys);
    if (rc)
        return rc;
    const json_t *v = json_object_get(root, "$schema");
    if (v && !json_is_string(v))
        return fail_value(ld, "$schema", "a string", v);
    const char *s = NULL;
    rc = get_path_str(ld, root, "model", "model", &s);
    if (rc)
        return rc;
    canon_set(ld, ld->canon, "model", json_string(s));
    spec->model = resolve(ld, s);
    if (!spec->model)
        return TM_ERR(ld->err, TM_E_NOMEM, "model path");
    // chat_template overrides the tokenizer's; it changes the prompts, so it is canonical.
    v = json_object_get(root, "chat_template");
    if (v) {
        if (!json_is_string(v) || json_string_length(v) == 0)
            return fail_value(ld, "chat_template", "a non-empty string", v);
        spec->chat_template = tm_strndup(json_string_value(v), json_string_length(v));
        if (!spec->chat_template)
            return TM_ERR(ld->err, TM_E_NOMEM, "chat_template");
        canon_set(ld, ld->canon, "chat_template", json_string(spec->chat_template));
    }

    json_t *input, *output, *eng, *dflt, *lim;
    rc = get_section(ld, root, "input", 1, input_keys, &input);
    if (!rc)
        rc = get_section(ld, root, "output", 1, output_keys, &output);
    if (!rc)
        rc = get_section(ld, root, "engine", 0, engine_keys, &eng);
    if (!rc)
        rc = get_section(ld, root, "defaults", 0, tm_ingest_sp_keys, &dflt);
    if (!rc)
        rc = get_section(ld, root, "limits", 0, limits_keys, &lim);
    if (rc)
        return rc;

    rc = get_path_str(ld, output, "dir", "output.dir", &s);
    if (rc)
        return rc;
    json_t *cout = json_object();
    canon_set(ld, ld->canon, "output", cout);
    if (cout)
        canon_set(ld, cout, "dir", json_string(s));
    spec->output_dir = resolve(ld, s);
    if (!spec->output_dir)
        return TM_ERR(ld->err, TM_E_NOMEM, "output path");
    // Optional and not part of the canonical spec: where progress is published does not change
    // the job's identity (resume).
    if (json_object_get(output, "prometheus_textfile")) {
        rc = get_path_str(ld, output, "prometheus_textfile", "output.prometheus_textfile", &s);
        if (rc)
            return rc;
        spec->prometheus_textfile = resolve(ld, s);
        if (!spec->prometheus_textfile)
            return TM_ERR(ld->err, TM_E_NOMEM, "output path");
    }

    rc = load_output_extra(ld, output, cout);
    if (!rc)
        rc = load_engine(ld, eng);
    if (!rc)
        rc = load_defaults(ld, dflt);
    if (!rc)
        rc = load_limits(ld, lim);
    if (!rc)
        rc = load_input(ld, input); // last: it touches the file system
    if (!rc)
        rc = check_outputs(ld, input);
    return rc;
}

// Load from the file at path, or (text != NULL) from JSON text named path whose relative paths
// resolve against base_dir.
static tm_rc spec_load(const char *path, const char *base_dir, const char *text, tm_job_spec **out,
                       tm_err *err) {
    loader ld = {.file = path, .err = err};
    json_t *root = NULL;
    tm_job_spec *spec = tm_calloc(1, sizeof(*spec));
    if (!spec)
        return TM_ERR(err, TM_E_NOMEM, "job spec");
    ld.spec = spec;
    spec->path = tm_strdup(path);
    const char *slash = strrchr(path, '/');
    if (text)
        ld.dir = tm_strdup(base_dir ? base_dir : "");
    else
        ld.dir = !slash ? tm_strdup("")
                        : tm_strndup(path, slash == path ? 1 : (size_t)(slash - path));
    ld.canon = json_object();
    if (!spec->path || !ld.dir || !ld.canon) {
        TM_ERR(err, TM_E_NOMEM, "job spec");
        goto fail;
    }
    struct stat st;
    if (!text && stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        TM_ERR(err, TM_E_INVAL, "%s is a folder, not a job file (give the path of the job's .json)",
               path);
        goto fail;
    }
    json_error_t jerr;
    int fd = -1; // never blocks on a FIFO; only a regular file is read (issue 35)
    if (!text && tm_fs_open_in(path, "job file", &fd, NULL, err))
        goto fail;
    root = text ? json_loads(text, JSON_REJECT_DUPLICATES, &jerr)
                : json_loadfd(fd, JSON_REJECT_DUPLICATES, &jerr);
    if (fd >= 0)
        close(fd);
    if (!root) {
        if (json_error_code(&jerr) == json_error_cannot_open_file)
            TM_ERR(err, TM_E_IO, "%s: %s", path, jerr.text);
        else
            TM_ERR(err, TM_E_PARSE, "%s: line %d, column %d: %s", path, jerr.line, jerr.column,
                   jerr.text);
        goto fail;
    }
    if (!json_is_object(root)) {
        TM_ERR(err, TM_E_INVAL, "%s: expected a JSON object at the top level", path);
        goto fail;
    }
    if (load_root(&ld, root))
        goto fail;
    char *canon = json_dumps(ld.canon, JSON_COMPACT | JSON_SORT_KEYS | JSON_REAL_PRECISION(15));
    spec->canonical_json = canon ? tm_strdup(canon) : NULL;
    free(canon); // jansson's allocation
    if (ld.canon_nomem || !spec->canonical_json) {
        TM_ERR(err, TM_E_NOMEM, "canonical spec");
        goto fail;
    }
    json_decref(root);
    json_decref(ld.canon);
    tm_free(ld.dir);
    *out = spec;
    return TM_OK;
fail:
    json_decref(root);
    json_decref(ld.canon);
    for (size_t i = 0; i < ld.n_list; i++)
        tm_free(ld.list[i]);
    tm_free(ld.list);
    tm_free(ld.dir);
    tm_job_spec_destroy(spec);
    return err->rc;
}

tm_rc tm_job_spec_load(const char *path, tm_job_spec **out, tm_err *err) {
    return spec_load(path, NULL, NULL, out, err);
}

tm_rc tm_job_spec_load_text(const char *name, const char *base_dir, const char *json_text,
                            tm_job_spec **out, tm_err *err) {
    return spec_load(name, base_dir, json_text, out, err);
}

tm_rc tm_job_spec_set_shard(tm_job_spec *spec, bool cli_given, int64_t cli_index, int64_t cli_count,
                            const char *(*getenv_fn)(const char *name), tm_err *err) {
    tm_job_shard *sh = &spec->shard;
    if (!sh->on && !cli_given)
        return TM_OK;
    const char *what = cli_given ? "--shard" : "input.shard";
    if (spec->kafka_in)
        return TM_ERR(err, TM_E_INVAL,
                      "%s: %s: a Kafka input is not sharded: the consumer group spreads its "
                      "partitions over the replicas (docs/sharding.md)",
                      spec->path, what);
    for (size_t i = 0; i < spec->n_inputs; i++)
        if (strcmp(spec->inputs[i], TM_JOB_STDIN) == 0)
            return TM_ERR(err, TM_E_INVAL,
                          "%s: %s: standard input cannot be shared by shards (each shard reads "
                          "every input line); give input files on a shared file system",
                          spec->path, what);
    if (spec->results_file)
        return TM_ERR(err, TM_E_INVAL,
                      "%s: %s: output.results_file is written by `tokenmill merge OUT -o FILE` "
                      "for a sharded job, not by each shard",
                      spec->path, what);
    if (spec->kafka)
        return TM_ERR(err, TM_E_INVAL,
                      "%s: %s: output.kafka: a sharded job writes files that `tokenmill merge` "
                      "joins",
                      spec->path, what);
    tm_rc rc = tm_shard_resolve(sh, cli_index, cli_count, getenv_fn, err);
    if (rc)
        return tm_err_wrap(err, "%s", spec->path);
    // The shard's identity: the canonical spec with input.shard (index included), and its own
    // output folder.
    json_error_t jerr;
    json_t *canon = json_loads(spec->canonical_json, 0, &jerr);
    json_t *input = canon ? json_object_get(canon, "input") : NULL;
    json_t *cs = json_pack("{s:s, s:I, s:I, s:i}", "by", tm_shard_by_name(sh->by), "count",
                           (json_int_t)sh->count, "index", (json_int_t)sh->index, "prefix_bytes",
                           (int)sh->prefix_bytes);
    char *text = NULL;
    if (input && cs && json_object_set_new(input, "shard", cs) == 0) {
        cs = NULL;
        text = json_dumps(canon, JSON_COMPACT | JSON_SORT_KEYS | JSON_REAL_PRECISION(15));
    }
    json_decref(cs);
    json_decref(canon);
    char *canon_text = text ? tm_strdup(text) : NULL;
    free(text); // jansson's allocation
    size_t n_dir = strlen(spec->output_dir) + 64;
    char *dir = tm_malloc(n_dir);
    if (!canon_text || !dir) {
        tm_free(canon_text);
        tm_free(dir);
        return TM_ERR(err, TM_E_NOMEM, "shard spec");
    }
    snprintf(dir, n_dir, "%s/" TM_SHARD_DIR_FMT, spec->output_dir, (long long)sh->index,
             (long long)sh->count);
    tm_free(spec->canonical_json);
    spec->canonical_json = canon_text;
    tm_free(spec->output_dir);
    spec->output_dir = dir;
    return TM_OK;
}

void tm_job_spec_destroy(tm_job_spec *spec) {
    if (!spec)
        return;
    tm_free(spec->results_file);
    tm_free(spec->job_name);
    tm_free(spec->path);
    tm_free(spec->model);
    for (size_t i = 0; i < spec->n_inputs; i++)
        tm_free(spec->inputs[i]);
    tm_free(spec->inputs);
    tm_free(spec->output_dir);
    tm_free(spec->prometheus_textfile);
    tm_free(spec->chat_template);
    if (spec->kafka_in) {
        tm_free(spec->kafka_in->brokers);
        for (size_t i = 0; i < spec->kafka_in->n_topics; i++)
            tm_free(spec->kafka_in->topics[i]);
        tm_free(spec->kafka_in->topics);
        tm_free(spec->kafka_in->group);
        for (size_t i = 0; i < 2 * spec->kafka_in->n_config; i++)
            tm_free(spec->kafka_in->config[i]);
        tm_free(spec->kafka_in->config);
        tm_free(spec->kafka_in);
    }
    if (spec->kafka) {
        tm_free(spec->kafka->brokers);
        tm_free(spec->kafka->topic);
        tm_free(spec->kafka->transactional_id);
        tm_free(spec->kafka->error_topic);
        for (size_t i = 0; i < 2 * spec->kafka->n_config; i++)
            tm_free(spec->kafka->config[i]);
        tm_free(spec->kafka->config);
        tm_free(spec->kafka);
    }
    tm_sampling_fini(&spec->defaults);
    tm_free(spec->canonical_json);
    tm_free(spec);
}
