/* cmd/main.c - the tokenmill command line: run (a job file, or one command that builds the job in
 * memory), validate, tokenize, bench, report, merge, --help, --version. Parses arguments and hands
 * off to cmd/job_run.c (jobs), cmd/tp_run.c (the ranks of a tensor-parallel launch that do not run
 * the job) or the tokenizer. Every command answers --help / -h; the global options -q / -v may
 * stand before or after the command. Exit codes (docs/reference.md, "Exit codes"): 0 success, 1 the
 * job or command failed, 2 bad usage, 3 the job ran but no record succeeded (or, with
 * --fail-on-error / limits.fail_on_error_records, some record failed), 130 / 143 a file job stopped
 * gracefully by SIGINT / SIGTERM. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/buf.h"
#include "base/utf8.h"
#include "base/log.h"
#include "cmd/bench.h"
#include "cmd/job_run.h"
#include "cmd/merge.h"
#include "cmd/report.h"
#include "cmd/tp_run.h"
#include "ingest/job_spec.h"
#include "ingest/rec_parser_int.h" /* tm_rec_parser_nearest: did you mean */
#include "runner/text/tokenizer.h"

static const char usage[] =
    "usage: tokenmill [-q|-v] <command> [args]      (tokenmill <command> --help for more)\n"
    "\n"
    "commands:\n"
    "  run JOB.json        run a job: read its inputs, write completions, errors and metrics\n"
    "                      into its output folder (see schemas/job.schema.json); run again, it\n"
    "                      resumes an unfinished job and does nothing for a finished one\n"
    "  run --model DIR -i IN.jsonl -o OUT [options]  the same without a job file: the job is\n"
    "                      built from the options (--print-job shows it)\n"
    "  validate JOB.json   run's checks of the job, model, engine and every input record\n"
    "                      (tokenize, chat template, context length, fields) without the model\n"
    "  tokenize MODEL_DIR  read JSON lines {\"text\": ...} on stdin, write {\"ids\": [...]} per\n"
    "                      line (no BOS added), like llama-tokenize; lines up to 16 MiB\n"
    "  bench --model DIR [...]  run the standard workloads (W1, W8, P, prefix), print a summary\n"
    "                      and write a metrics.json for each\n"
    "  report METRICS... [-o report.html]  one self-contained HTML report of metrics files or\n"
    "                      folders of them\n"
    "  merge OUT [-o FILE.jsonl] [--partial]  join the shards of a sharded job (run --shard\n"
    "                      K/N) into one results file and metrics.json, proving that every\n"
    "                      input line was answered exactly once (docs/sharding.md)\n"
    "  --help              this text\n"
    "  --version           version and git commit\n"
    "\n"
    "global options (before or after the command):\n"
    "  -q, --quiet         only warnings and errors on stderr\n"
    "  -v, --verbose       debug logging\n"
    "\n"
    "exit status: 0 ok, 1 the job or command failed, 2 bad usage, 3 no record succeeded (or,\n"
    "with --fail-on-error, some record failed), 130 / 143 a file job stopped by SIGINT / SIGTERM\n";

static const char run_usage[] =
    "usage: tokenmill run JOB.json [--restart] [--fail-on-error] [--shard K/N] [tensor-parallel "
    "options]\n"
    "       tokenmill run --model DIR -i IN.jsonl [-i ...] -o OUT [options]\n"
    "\n"
    "Runs a job to completion. Over an output folder holding an unfinished run of the same job it\n"
    "resumes; a finished job is not run again. Without a job file the job is built in memory from\n"
    "the options below, by the same code that reads job files (schemas/job.schema.json).\n"
    "\n"
    "job file:\n"
    "  --restart           discard what the output folder holds and run the job anew\n"
    "  --shard K/N         run shard K (0-based) of N into output.dir/shard-K-of-N; auto/N\n"
    "                      takes K from JOB_COMPLETION_INDEX or SLURM_ARRAY_TASK_ID, auto takes\n"
    "                      K and N from the Slurm array; tokenmill merge joins the shards\n"
    "                      (docs/sharding.md; also with the one-command options)\n"
    "  --fail-on-error     exit 3 if any record ended in an error record\n"
    "  --nnodes N --node-rank K --master-addr HOST --master-port PORT --tp-timeout S\n"
    "                      engine.tp > 1 on GPUs: one process per GPU; on one node run starts\n"
    "                      them itself; across N nodes run it on each node (docs/multinode.md)\n"
    "\n"
    "one command (each option sets the job field named; values are JSON: 0.7, true, \"text\"):\n"
    "  --model DIR         model: a local Hugging Face folder (config.json, tokenizer.json,\n"
    "                      *.safetensors)\n"
    "  -i, --input IN      input.files: a .jsonl / .jsonl.lz4 / .jsonl.gz file, folder, glob or\n"
    "                      - (stdin); repeatable\n"
    "  -o, --output OUT    output.dir = OUT; OUT ending in .jsonl: output.results_file = OUT (every\n"
    "                      answer line in one plain file, as vLLM's run-batch -o writes for an\n"
    "                      OpenAI batch file) and output.dir = OUT without .jsonl, plus .d\n"
    "  --backend cpu|cuda|auto      engine.backend (default auto)\n"
    "  --max-seqs N  --max-batched-tokens N  --threads N  --kv-blocks N  --block-size N\n"
    "  --schedule prefix|fcfs  --lookahead N  --prefix-cache true|false  --quantization none|fp8\n"
    "  --gpu-memory-utilization X  --kv-cache-dtype auto|fp8  --tp N\n"
    "  --max-model-len N   engine.* (max_model_len caps the context below the model's)\n"
    "  vLLM's names work too: --input-file, --output-file, --max-num-seqs,\n"
    "  --max-num-batched-tokens, --tensor-parallel-size, --[no-]enable-prefix-caching\n"
    "  --max-tokens N  --temperature X  --top-p X  --top-k N  --min-p X  --seed N\n"
    "  --stop TEXT (repeatable)     defaults.* (a record's own fields win)\n"
    "  --compression lz4|none       output.compression (none: plain completions.jsonl)\n"
    "  --prometheus-textfile PATH   output.prometheus_textfile\n"
    "  --name NAME         output.job_name: the job's name in metrics.json, the report and the\n"
    "                      textfile (default: the output folder)\n"
    "  --strict-fields     limits.strict_fields: unknown record / body keys are errors\n"
    "  --fail-on-error     limits.fail_on_error_records: exit 3 if any record failed\n"
    "  --set SECTION.KEY=VALUE      any other job field (e.g. --set limits.max_depth=32)\n"
    "  --print-job         print the job built (JSON) and exit; save it as a job file in the\n"
    "                      current folder and `tokenmill run` it for the same outputs\n"
    "  --restart           as above\n";

static const char validate_usage[] =
    "usage: tokenmill validate JOB.json [--fail-on-error]\n"
    "       tokenmill validate --model DIR -i IN.jsonl -o OUT [run's one-command options]\n"
    "\n"
    "Checks what run checks, without the model's forward pass: the job file, the model folder,\n"
    "the tokenizer, that the engine asked for is available (backend cuda needs a GPU), and every\n"
    "input record: its fields and value ranges, the chat template on its messages, its token\n"
    "count against the context length. Rejected records are listed as run's error lines would\n"
    "be; unknown record or body keys are warned about (errors with limits.strict_fields).\n"
    "Exit status as run's would be: 0, 1 (the job cannot run), 3 (no record would succeed,\n"
    "or with --fail-on-error any record would fail).\n";

static const char tokenize_usage[] =
    "usage: tokenmill tokenize MODEL_DIR [--max-line-bytes N] < lines.jsonl\n"
    "\n"
    "Reads JSON lines {\"text\": ...} on stdin and writes {\"ids\": [...]} per line with the\n"
    "model folder's tokenizer (tokenizer.json; no BOS added), like llama-tokenize. A bad line is\n"
    "reported on stderr and the exit status is 1. A line over N bytes (default 16 MiB, run's\n"
    "limits.max_line_bytes; 1 to 1073741824) is such a bad line, named by its number; it is\n"
    "read past, never held in memory.\n";

// stdin for tokenize, read in blocks and cut into lines (a line is never held past the limit).
typedef struct line_in {
    char blk[1 << 16];
    size_t at, len;
} line_in;

// The next line of stdin without its "\n" (and a "\r" before it) into line, its length in *n:
// 1, 0 at the end of the input, -1 when out of memory. A line over max bytes is read to its end
// but not kept (line empty, *n its length).
static int next_line(line_in *in, size_t max, tm_buf *line, size_t *n, tm_err *err) {
    tm_buf_clear(line);
    int any = 0;
    char last = 0;
    *n = 0;
    for (;;) {
        if (in->at == in->len) {
            in->at = 0;
            in->len = fread(in->blk, 1, sizeof(in->blk), stdin);
            if (in->len == 0)
                break;
        }
        any = 1;
        const char *p = in->blk + in->at, *nl = memchr(p, '\n', in->len - in->at);
        size_t seg = nl ? (size_t)(nl - p) : in->len - in->at;
        if (*n + seg <= max + 1 && tm_buf_append(line, p, seg, err))
            return -1; // up to max + 1 bytes: the last may be the "\r" of a CRLF
        if (seg)
            last = p[seg - 1];
        *n += seg;
        in->at += seg + (nl != NULL);
        if (nl)
            break;
    }
    if (last == '\r' && *n <= max + 1)
        line->data[--line->len] = '\0';
    *n -= last == '\r';
    if (*n > max)
        tm_buf_clear(line);
    return any;
}

// `tokenize MODEL_DIR [--max-line-bytes N]`.
static int cmd_tokenize(int argc, char **argv) {
    const char *model_dir = NULL;
    unsigned long long max = TM_JOB_DEFAULT_MAX_LINE_BYTES;
    for (int k = 0; k < argc; k++) {
        char *end = NULL;
        if (!strcmp(argv[k], "--max-line-bytes") && k + 1 < argc) {
            max = strtoull(argv[++k], &end, 10);
            if (*end || max < 1 || max > (1u << 30)) {
                fprintf(stderr, "tokenmill tokenize: --max-line-bytes wants 1 to %u\n", 1u << 30);
                return 2;
            }
        } else if (!model_dir && argv[k][0] != '-') {
            model_dir = argv[k];
        } else {
            model_dir = NULL;
            break;
        }
    }
    if (!model_dir) {
        fprintf(stderr, "tokenmill tokenize: expected one MODEL_DIR\n\n%s", tokenize_usage);
        return 2;
    }
    tm_err err = {0};
    tm_tokenizer *tok = NULL;
    if (tm_tok_load(model_dir, &tok, &err) != TM_OK) {
        fprintf(stderr, "tokenmill tokenize: %s\n", err.msg);
        return 1;
    }
    int status = 0, got;
    static line_in in;
    tm_buf line = {0};
    size_t n;
    unsigned long lineno = 0;
    tm_ids ids = {0};
    tm_buf out = {0};
    while ((got = next_line(&in, (size_t)max, &line, &n, &err)) > 0) {
        lineno++;
        if (n > max) {
            fprintf(stderr,
                    "tokenmill tokenize: stdin line %lu: %zu bytes, over the limit of %llu "
                    "(--max-line-bytes)\n",
                    lineno, n, max);
            status = 1;
            continue;
        }
        json_error_t jerr;
        json_t *j = json_loadb(line.data ? line.data : "", line.len, 0, &jerr);
        const char *text = j ? json_string_value(json_object_get(j, "text")) : NULL;
        if (!text) {
            fprintf(stderr, "tokenmill tokenize: stdin line %lu: expected {\"text\": string}%s%s\n",
                    lineno, j ? "" : ": ", j ? "" : jerr.text);
            json_decref(j);
            status = 1;
            continue;
        }
        ids.len = 0;
        tm_buf_clear(&out);
        tm_rc rc = tm_tok_encode(tok, text, json_string_length(json_object_get(j, "text")), &ids,
                                 &err);
        if (rc == TM_OK)
            rc = tm_buf_append_str(&out, "{\"ids\": [", &err);
        for (size_t i = 0; rc == TM_OK && i < ids.len; i++)
            rc = tm_buf_printf(&out, &err, i ? ", %u" : "%u", ids.ids[i]);
        if (rc == TM_OK)
            rc = tm_buf_append_str(&out, "]}\n", &err);
        json_decref(j);
        if (rc != TM_OK) {
            fprintf(stderr, "tokenmill tokenize: stdin line %lu: %s\n", lineno, err.msg);
            status = 1;
            continue;
        }
        fwrite(out.data, 1, out.len, stdout);
    }
    if (got < 0) {
        fprintf(stderr, "tokenmill tokenize: stdin line %lu: %s\n", lineno + 1, err.msg);
        status = 1;
    }
    tm_buf_fini(&line);
    tm_ids_fini(&ids);
    tm_buf_fini(&out);
    tm_tok_destroy(tok);
    return status;
}

// ---- one-command mode: options -> a job document -> tm_job_spec_load_text ----

typedef enum opt_kind {
    OPT_VALUE, /* the argument as a JSON value when it parses as one, else as a string */
    OPT_STRING,
    OPT_TRUE,  /* no argument: the field is true */
    OPT_FALSE, /* no argument: the field is false */
    OPT_STOP,  /* appended to defaults.stop */
    OPT_INPUT, /* appended to input.files */
} opt_kind;

static const struct {
    const char *flag, *alias, *section, *key;
    opt_kind kind;
} job_opts[] = {
    {"--model", NULL, NULL, "model", OPT_STRING},
    {"--input", "-i", "input", "files", OPT_INPUT},
    {"--backend", NULL, "engine", "backend", OPT_STRING},
    {"--max-seqs", NULL, "engine", "max_seqs", OPT_VALUE},
    {"--max-batched-tokens", NULL, "engine", "max_batched_tokens", OPT_VALUE},
    {"--threads", NULL, "engine", "threads", OPT_VALUE},
    {"--kv-blocks", NULL, "engine", "kv_blocks", OPT_VALUE},
    {"--block-size", NULL, "engine", "block_size", OPT_VALUE},
    {"--schedule", NULL, "engine", "schedule", OPT_STRING},
    {"--lookahead", NULL, "engine", "lookahead", OPT_VALUE},
    {"--prefix-cache", NULL, "engine", "prefix_cache", OPT_VALUE},
    {"--quantization", NULL, "engine", "quantization", OPT_STRING},
    {"--gpu-memory-utilization", NULL, "engine", "gpu_memory_utilization", OPT_VALUE},
    {"--max-tokens", NULL, "defaults", "max_tokens", OPT_VALUE},
    {"--temperature", NULL, "defaults", "temperature", OPT_VALUE},
    {"--top-p", NULL, "defaults", "top_p", OPT_VALUE},
    {"--top-k", NULL, "defaults", "top_k", OPT_VALUE},
    {"--min-p", NULL, "defaults", "min_p", OPT_VALUE},
    {"--seed", NULL, "defaults", "seed", OPT_VALUE},
    {"--stop", NULL, "defaults", "stop", OPT_STOP},
    {"--compression", NULL, "output", "compression", OPT_STRING},
    {"--prometheus-textfile", NULL, "output", "prometheus_textfile", OPT_STRING},
    {"--name", NULL, "output", "job_name", OPT_STRING},
    {"--strict-fields", NULL, "limits", "strict_fields", OPT_TRUE},
    {"--fail-on-error", NULL, "limits", "fail_on_error_records", OPT_TRUE},
    {"--kv-cache-dtype", NULL, "engine", "kv_cache_dtype", OPT_STRING},
    {"--tp", NULL, "engine", "tp", OPT_VALUE},
    {"--max-model-len", NULL, "engine", "max_model_len", OPT_VALUE},
    // vLLM's names for the same fields (`vllm serve` / `run-batch`), so its command lines carry
    {"--input-file", NULL, "input", "files", OPT_INPUT},
    {"--tensor-parallel-size", "-tp", "engine", "tp", OPT_VALUE},
    {"--max-num-seqs", NULL, "engine", "max_seqs", OPT_VALUE},
    {"--max-num-batched-tokens", NULL, "engine", "max_batched_tokens", OPT_VALUE},
    {"--enable-prefix-caching", NULL, "engine", "prefix_cache", OPT_TRUE},
    {"--no-enable-prefix-caching", NULL, "engine", "prefix_cache", OPT_FALSE},
};
enum { N_JOB_OPTS = sizeof(job_opts) / sizeof(job_opts[0]) };

// The known flag nearest to an unknown one (edit distance under 3, or the known flag that begins
// with it, or that it begins with: --max-token, --temperatures), for "did you mean"; NULL if none.
static const char *nearest_flag(const char *a) {
    static const char *extra[] = {"--output",    "--output-file", "--set",
                                  "--print-job", "--restart",     "--shard"};
    enum { N_EXTRA = sizeof(extra) / sizeof(extra[0]) };
    const char *known[N_JOB_OPTS + N_EXTRA + 1];
    for (int k = 0; k < N_JOB_OPTS; k++)
        known[k] = job_opts[k].flag;
    for (int k = 0; k < N_EXTRA; k++)
        known[N_JOB_OPTS + k] = extra[k];
    known[N_JOB_OPTS + N_EXTRA] = NULL;
    const char *eq = strchr(a, '='); // --max-tokens=32 style: the name before '='
    char name[64];
    snprintf(name, sizeof(name), "%.*s", eq ? (int)(eq - a) : (int)strlen(a), a);
    const char *near = tm_rec_parser_nearest(name, known);
    for (int k = 0; !near && strlen(name) > 4 && known[k]; k++)
        if (!strncmp(known[k], name, strlen(name)) || !strncmp(name, known[k], strlen(known[k])))
            near = known[k];
    return near;
}

// A flag's text as a JSON value: a number, true/false/null, an array or object when it parses as
// one; anything else is a string (so `--temperature hot` reaches the loader, which names it).
static json_t *arg_value(const char *s) {
    json_error_t jerr;
    json_t *v = json_loads(s, JSON_DECODE_ANY, &jerr);
    return v && !json_is_string(v) ? v : (json_decref(v), json_string(s));
}

// doc.section (created when missing); doc itself for section NULL.
static json_t *section_of(json_t *doc, const char *section) {
    if (!section)
        return doc;
    json_t *s = json_object_get(doc, section);
    if (!s) {
        s = json_object();
        json_object_set_new(doc, section, s);
    }
    return s;
}

static int has_suffix(const char *s, const char *suf) {
    size_t n = strlen(s), k = strlen(suf);
    return n >= k && strcmp(s + n - k, suf) == 0;
}

// -o OUT: the output folder, or (OUT.jsonl) the results file beside the folder OUT.d.
static void set_output(json_t *doc, const char *out) {
    json_t *o = section_of(doc, "output");
    if (has_suffix(out, ".jsonl") && strlen(out) > 6) {
        char dir[4096];
        snprintf(dir, sizeof(dir), "%.*s.d", (int)(strlen(out) - 6), out);
        json_object_set_new(o, "dir", json_string(dir));
        json_object_set_new(o, "results_file", json_string(out));
    } else {
        json_object_set_new(o, "dir", json_string(out));
    }
}

typedef struct cli_job {
    json_t *doc; /* the job document, keys in the order of the schema's sections */
    int print_job, restart;
    const char *shard; /* --shard's argument, or NULL */
} cli_job;

// Parse the one-command options into c->doc. Returns 0, or 2 (bad usage; printed).
static int parse_cli_job(const char *cmd, int argc, char **argv, cli_job *c) {
    c->doc = json_object();
    const char *sections[] = {"input", "output", "engine", "defaults", "limits"};
    json_object_set_new(c->doc, "model", json_null()); // first in the printed job
    for (size_t i = 0; i < sizeof(sections) / sizeof(sections[0]); i++)
        json_object_set_new(c->doc, sections[i], json_object());
    int have_out = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--print-job")) {
            c->print_job = 1;
            continue;
        }
        if (!strcmp(a, "--restart")) {
            c->restart = 1;
            continue;
        }
        if (!strcmp(a, "--shard") && v) {
            c->shard = v;
            i++;
            continue;
        }
        if ((!strcmp(a, "-o") || !strcmp(a, "--output") || !strcmp(a, "--output-file")) && v) {
            set_output(c->doc, v);
            have_out = 1;
            i++;
            continue;
        }
        const char *dot = v ? strchr(v, '.') : NULL, *eq = v ? strchr(v, '=') : NULL;
        if (!strcmp(a, "--set") && dot && eq && dot < eq) {
            char sect[64], key[64];
            snprintf(sect, sizeof(sect), "%.*s", (int)(dot - v), v);
            snprintf(key, sizeof(key), "%.*s", (int)(eq - dot - 1), dot + 1);
            json_object_set_new(section_of(c->doc, sect), key, arg_value(eq + 1));
            i++;
            continue;
        }
        int k = 0;
        while (k < N_JOB_OPTS && strcmp(a, job_opts[k].flag) != 0 &&
               !(job_opts[k].alias && !strcmp(a, job_opts[k].alias)))
            k++;
        if (k == N_JOB_OPTS ||
            (job_opts[k].kind != OPT_TRUE && job_opts[k].kind != OPT_FALSE && !v)) {
            const char *near = k == N_JOB_OPTS && a[0] == '-' ? nearest_flag(a) : NULL;
            fprintf(stderr,
                    "tokenmill %s: %s %s%s%s%s%s\n(tokenmill %s --help lists the options)\n", cmd,
                    k == N_JOB_OPTS ? "unknown option" : "missing value after", a,
                    near ? " (did you mean " : "", near ? near : "", near ? "?)" : "",
                    k == N_JOB_OPTS && !strcmp(cmd, "run") && a[0] != '-'
                        ? " (a job file and --model options do not go together)"
                        : "",
                    cmd);
            return 2;
        }
        json_t *s = section_of(c->doc, job_opts[k].section);
        const char *key = job_opts[k].key;
        switch (job_opts[k].kind) {
        case OPT_VALUE:
            json_object_set_new(s, key, arg_value(v));
            break;
        case OPT_STRING:
            json_object_set_new(s, key, json_string(v));
            break;
        case OPT_TRUE:
        case OPT_FALSE:
            json_object_set_new(s, key, json_boolean(job_opts[k].kind == OPT_TRUE));
            i--;
            break;
        case OPT_STOP:
        case OPT_INPUT: {
            json_t *arr = json_object_get(s, key);
            if (!arr) {
                arr = json_array();
                json_object_set_new(s, key, arr);
            }
            // an input path is bytes: escaped so that JSON carries any name (base/utf8.h); a
            // stop string is text, and one that is not UTF-8 is refused below
            char *ev = job_opts[k].kind == OPT_INPUT ? tm_path_escape(v) : NULL;
            json_t *sv = json_string(ev ? ev : v);
            tm_free(ev);
            if (!sv || json_array_append_new(arr, sv) != 0) {
                fprintf(stderr, "tokenmill %s: %s %s: not valid UTF-8 text\n", cmd, a, v);
                return 2;
            }
            break;
        }
        }
        i++;
    }
    const char *missing = json_is_null(json_object_get(c->doc, "model")) ? "--model"
                          : !json_object_get(json_object_get(c->doc, "input"), "files")
                              ? "-i IN.jsonl"
                          : !have_out ? "-o OUT"
                                      : NULL;
    if (missing) {
        fprintf(stderr, "tokenmill %s: %s is required without a job file\n\n%s", cmd, missing,
                run_usage);
        return 2;
    }
    for (size_t i = 0; i < sizeof(sections) / sizeof(sections[0]); i++) // drop empty sections
        if (json_object_size(json_object_get(c->doc, sections[i])) == 0)
            json_object_del(c->doc, sections[i]);
    return 0;
}

static int is_help(const char *a) { return !strcmp(a, "--help") || !strcmp(a, "-h"); }

static int is_one_command(int argc, char **argv) {
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--model") || !strcmp(argv[i], "-i") || !strcmp(argv[i], "--input"))
            return 1;
    return 0;
}

// The exit status of a run or validate: 1 failed; 128 + the signal for a file job that a stop
// signal ended gracefully (base/stop.h: 130 SIGINT, 143 SIGTERM); 3 records failed as
// docs/reference.md's "Exit codes" say.
static int exit_status(tm_rc rc, int sig, const tm_job_run_result *r, int fail_on_error) {
    if (rc != TM_OK)
        return 1;
    if (sig)
        return 128 + sig;
    if (r->n_ok == 0 && r->n_failed > 0) {
        fprintf(stderr, "tokenmill: no record succeeded (%llu failed); exit status 3\n",
                (unsigned long long)r->n_failed);
        return 3;
    }
    if ((fail_on_error || r->fail_on_error) && r->n_failed > 0) {
        fprintf(stderr, "tokenmill: %llu record(s) failed (fail on error records); exit status 3\n",
                (unsigned long long)r->n_failed);
        return 3;
    }
    return 0;
}

// The program as invoked (argv[0]), for the commands that messages print.
static const char *prog = "tokenmill";

// s quoted for a POSIX shell when it needs to be ('...', a ' as '\''), appended to b.
static void shell_word(tm_buf *b, const char *s, tm_err *err) {
    size_t n = strlen(s),
           plain = n > 0 && strspn(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstu"
                                      "vwxyz0123456789_-./=:,+@%") == n;
    if (plain) {
        tm_buf_append(b, s, n, err);
        return;
    }
    tm_buf_append(b, "'", 1, err);
    for (const char *p = s; *p; p++)
        tm_buf_append(b, *p == '\'' ? "'\\''" : p, *p == '\'' ? 4 : 1, err);
    tm_buf_append(b, "'", 1, err);
}

// The one-command line that starts this job over: the program, the command, its options as given
// (quoted for the shell) and --restart; malloc'd, NULL when out of memory.
static char *restart_line(const char *cmd, int argc, char **argv) {
    tm_buf b = {0};
    tm_err err = {0};
    shell_word(&b, prog, &err);
    tm_buf_append(&b, " run", 4, &err);
    (void)cmd;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--restart") || !strcmp(argv[i], "--print-job"))
            continue;
        tm_buf_append(&b, " ", 1, &err);
        shell_word(&b, argv[i], &err);
    }
    tm_buf_append(&b, " --restart", 10, &err);
    if (err.rc || !b.data) {
        tm_buf_fini(&b);
        return NULL;
    }
    return b.data; // tm_buf's bytes: malloc'd, NUL-terminated
}

// `run --model ...` / `validate --model ...`: build the job, print it or hand it on.
static int cmd_one_command(const char *cmd, int argc, char **argv) {
    cli_job c = {0};
    int status = parse_cli_job(cmd, argc, argv, &c);
    if (status) {
        json_decref(c.doc);
        return status;
    }
    char *text = json_dumps(c.doc, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    json_decref(c.doc);
    if (!text) {
        fprintf(stderr, "tokenmill %s: out of memory\n", cmd);
        return 1;
    }
    if (c.print_job) {
        printf("%s\n", text);
        free(text);
        return 0;
    }
    tm_job_run_result res = {0};
    int sig = 0;
    char *again = restart_line(cmd, argc, argv);
    tm_job_run_opts o = {.restart = c.restart,
                         .spec_json = text,
                         .restart_cmd = again,
                         .result = &res,
                         .stop_signal = &sig,
                         .shard = c.shard};
    tm_rc rc = !strcmp(cmd, "run") ? tm_job_run_with(TM_JOB_CLI_NAME, &o)
                                   : tm_job_validate_with(TM_JOB_CLI_NAME, &o);
    free(text);
    free(again);
    return exit_status(rc, sig, &res, 0);
}

// `tokenmill run JOB.json [--restart] [--fail-on-error] [launch options]`: global rank 0 runs the
// job, every other rank of a tensor-parallel launch serves rank 0's steps (cmd/tp_run.h).
static int cmd_run(int argc, char **argv) {
    int fail_on_error = 0, n = 0;
    const char *shard = NULL;
    for (int i = 0; i < argc; i++) { // --fail-on-error, --shard: ours; the rest: tm_tp_run_parse
        if (!strcmp(argv[i], "--fail-on-error"))
            fail_on_error = 1;
        else if (!strcmp(argv[i], "--shard") && i + 1 < argc)
            shard = argv[++i];
        else
            argv[n++] = argv[i];
    }
    if (n == 0) {
        fprintf(stderr, "tokenmill run: no job file (or --model DIR -i IN -o OUT)\n\n%s",
                run_usage);
        return 2;
    }
    tm_tp_run_args a;
    int status = tm_tp_run_parse(n, argv, &a);
    if (status) {
        fprintf(stderr, "\n%s", run_usage);
        return status;
    }
    if (!tm_tp_is_rank0(&a.launch))
        return tm_tp_serve_cmd(a.path, &a.launch);
    tm_job_run_result res = {0};
    int sig = 0;
    tm_rc rc = tm_job_run_with(a.path, &(tm_job_run_opts){.restart = a.restart,
                                                          .tp = &a.launch,
                                                          .result = &res,
                                                          .stop_signal = &sig,
                                                          .shard = shard});
    return exit_status(rc, sig, &res, fail_on_error);
}

static int cmd_validate(int argc, char **argv) {
    int fail_on_error = 0;
    const char *path = NULL;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--fail-on-error")) {
            fail_on_error = 1;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "tokenmill validate: unknown option %s\n\n%s", argv[i], validate_usage);
            return 2;
        } else if (!path) {
            path = argv[i];
        } else {
            fprintf(stderr, "tokenmill validate: one job file only (got %s and %s)\n\n%s", path,
                    argv[i], validate_usage);
            return 2;
        }
    }
    if (!path) {
        fprintf(stderr, "tokenmill validate: no job file\n\n%s", validate_usage);
        return 2;
    }
    tm_job_run_result res = {0};
    tm_rc rc = tm_job_validate_with(path, &(tm_job_run_opts){.result = &res});
    return exit_status(rc, 0, &res, fail_on_error);
}

static int is_global_opt(const char *a) {
    return !strcmp(a, "-q") || !strcmp(a, "--quiet") || !strcmp(a, "-v") || !strcmp(a, "--verbose");
}

int main(int argc, char **argv) {
    // Global options anywhere (before or after the command); they are taken out of argv. The
    // value of an option that takes one is never a global option here: none of them is "-q"/"-v".
    int n = 1;
    prog = argv[0];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-q") || !strcmp(a, "--quiet"))
            tm_log_set_level(TM_LOG_LEVEL_WARN);
        else if (!strcmp(a, "-v") || !strcmp(a, "--verbose"))
            tm_log_set_level(TM_LOG_LEVEL_DEBUG);
        if (!is_global_opt(a))
            argv[n++] = argv[i];
    }
    argc = n;
    if (argc < 2) {
        fputs(usage, stderr);
        return 2;
    }
    const char *cmd = argv[1];
    int sub_argc = argc - 2;
    char **sub = argv + 2;
    if (is_help(cmd)) {
        fputs(usage, stdout);
        return 0;
    }
    if (!strcmp(cmd, "--version")) {
        printf("tokenmill %s (git %s)\n", TM_VERSION, TM_GIT_COMMIT);
        return 0;
    }
    if (cmd[0] == '-') {
        fprintf(stderr, "tokenmill: unknown option %s\n\n%s", cmd, usage);
        return 2;
    }
    // bench and report take their own options (and answer --help themselves)
    if (!strcmp(cmd, "bench"))
        return tm_bench_cmd(sub_argc, sub);
    if (!strcmp(cmd, "report"))
        return tm_report_cmd(sub_argc, sub);
    if (!strcmp(cmd, "merge"))
        return tm_merge_cmd(sub_argc, sub);
    const char *help = !strcmp(cmd, "run")        ? run_usage
                       : !strcmp(cmd, "validate") ? validate_usage
                       : !strcmp(cmd, "tokenize") ? tokenize_usage
                                                  : NULL;
    if (!help) {
        fprintf(stderr,
                "tokenmill: unknown command '%s' (commands: run, validate, tokenize, "
                "bench, report, merge; tokenmill --help)\n",
                cmd);
        return 2;
    }
    for (int i = 0; i < sub_argc; i++)
        if (is_help(sub[i])) {
            fputs(help, stdout);
            return 0;
        }
    if (strcmp(cmd, "tokenize") && is_one_command(sub_argc, sub))
        return cmd_one_command(cmd, sub_argc, sub);
    if (!strcmp(cmd, "run"))
        return cmd_run(sub_argc, sub);
    if (!strcmp(cmd, "validate"))
        return cmd_validate(sub_argc, sub);
    return cmd_tokenize(sub_argc, sub);
}
