/* cmd/main.c - the tokenmill command line: run, validate, tokenize, --help, --version. Parses
 * arguments and hands off to cmd/job_run.c (jobs), cmd/tp_run.c (the ranks of a tensor-parallel
 * launch that do not run the job) or the tokenizer; exit codes: 0 success, 1 the job
 * or command failed, 2 bad usage, 130 / 143 a file job stopped gracefully by SIGINT / SIGTERM. */
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "base/buf.h"
#include "base/log.h"
#include "cmd/bench.h"
#include "cmd/job_run.h"
#include "cmd/report.h"
#include "cmd/tp_run.h"
#include "runner/text/tokenizer.h"

static const char usage[] =
    "usage: tokenmill <command> [args]\n"
    "\n"
    "commands:\n"
    "  run JOB.json        run a job: read its inputs, write completions, errors and metrics\n"
    "                      into its output folder (see schemas/job.schema.json); run again, it\n"
    "                      resumes an unfinished job and does nothing for a finished one\n"
    "  run --restart JOB.json  discard what the output folder holds and run the job anew\n"
    "  run JOB.json [--nnodes N --node-rank K --master-addr HOST --master-port PORT]\n"
    "      [--tp-timeout S]  engine.tp > 1 on GPUs: one process per GPU; on one node run\n"
    "                      starts them itself; across N nodes run it on each node\n"
    "                      (docs/multinode.md)\n"
    "  validate JOB.json   check the job file, the model folder, the tokenizer and every input\n"
    "                      line without running the model; bad lines are listed\n"
    "  tokenize MODEL_DIR  read JSON lines {\"text\": ...} on stdin, write {\"ids\": [...]} per\n"
    "                      line (no BOS added), like llama-tokenize\n"
    "  bench --model DIR [...]  run the standard workloads (W1, W8, P, prefix) and write a\n"
    "                      metrics.json for each (tokenmill bench --help)\n"
    "  report METRICS... [-o report.html]  one self-contained HTML report of metrics files or\n"
    "                      folders of them (tokenmill report --help)\n"
    "  --help              this text\n"
    "  --version           version and git commit\n"
    "\n"
    "options (before the command's arguments):\n"
    "  -q, --quiet         only warnings and errors on stderr\n"
    "  -v, --verbose       debug logging\n";

static int cmd_tokenize(const char *model_dir) {
    tm_err err = {0};
    tm_tokenizer *tok = NULL;
    if (tm_tok_load(model_dir, &tok, &err) != TM_OK) {
        fprintf(stderr, "tokenmill tokenize: %s\n", err.msg);
        return 1;
    }
    int status = 0;
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    unsigned long lineno = 0;
    tm_ids ids = {0};
    tm_buf out = {0};
    while ((n = getline(&line, &cap, stdin)) > 0) {
        lineno++;
        json_error_t jerr;
        json_t *j = json_loadb(line, (size_t)n, 0, &jerr);
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
    free(line);
    tm_ids_fini(&ids);
    tm_buf_fini(&out);
    tm_tok_destroy(tok);
    return status;
}

// Exit status of a job run: 0 done, 1 failed, 128 + the signal for a file job that a stop
// signal ended gracefully (base/stop.h: 130 SIGINT, 143 SIGTERM).
static int run_status(const char *path, tm_job_run_opts o) {
    int sig = 0;
    o.stop_signal = &sig;
    tm_rc rc = tm_job_run_with(path, &o);
    return rc != TM_OK ? 1 : sig ? 128 + sig : 0;
}

// `tokenmill run JOB.json [launch options]`: global rank 0 runs the job, every other rank of a
// tensor-parallel launch serves rank 0's steps (cmd/tp_run.h).
static int cmd_run_launch(int argc, char **argv) {
    tm_tp_run_args a;
    int status = tm_tp_run_parse(argc, argv, &a);
    if (status)
        return status;
    if (!tm_tp_is_rank0(&a.launch))
        return tm_tp_serve_cmd(a.path, &a.launch);
    return run_status(a.path, (tm_job_run_opts){.restart = a.restart, .tp = &a.launch});
}

int main(int argc, char **argv) {
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(usage, stdout);
            return 0;
        } else if (!strcmp(a, "--version")) {
            printf("tokenmill %s (git %s)\n", TM_VERSION, TM_GIT_COMMIT);
            return 0;
        } else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) {
            tm_log_set_level(TM_LOG_LEVEL_WARN);
        } else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) {
            tm_log_set_level(TM_LOG_LEVEL_DEBUG);
        } else {
            fprintf(stderr, "tokenmill: unknown option %s\n\n%s", a, usage);
            return 2;
        }
    }
    // bench and report take their own options
    if (i < argc && !strcmp(argv[i], "bench"))
        return tm_bench_cmd(argc - i - 1, argv + i + 1);
    if (i < argc && !strcmp(argv[i], "report"))
        return tm_report_cmd(argc - i - 1, argv + i + 1);
    if (i + 3 == argc && !strcmp(argv[i], "run") && !strcmp(argv[i + 1], "--restart"))
        return run_status(argv[i + 2], (tm_job_run_opts){.restart = 1});
    if (i + 2 < argc && !strcmp(argv[i], "run")) // launch options of tensor parallel (cmd/tp_run.h)
        return cmd_run_launch(argc - i - 1, argv + i + 1);
    if (i + 2 != argc) {
        fputs(usage, stderr);
        return 2;
    }
    const char *cmd = argv[i], *arg = argv[i + 1];
    if (!strcmp(cmd, "run"))
        return run_status(arg, (tm_job_run_opts){0});
    if (!strcmp(cmd, "validate"))
        return tm_job_validate(arg) == TM_OK ? 0 : 1;
    if (!strcmp(cmd, "tokenize"))
        return cmd_tokenize(arg);
    fprintf(stderr, "tokenmill: unknown command '%s'\n\n%s", cmd, usage);
    return 2;
}
