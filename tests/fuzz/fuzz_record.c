/* tests/fuzz/fuzz_record.c - libFuzzer target for the JSONL record parser (ingest/rec_parser.c via
 * tm_rec_parser_line): the input is split at '\n' into lines, each parsed as a record with small
 * limits (depth 16, fields 4 KiB, 8 messages) so the limit paths are reached, and every result is
 * checked for the record invariants: an error record has a code and a message and nothing else;
 * a valid one has an id and exactly one of prompt / messages; the sink formats either as one
 * JSON line that jansson parses back. Built with clang -fsanitize=fuzzer,address,undefined when
 * TM_FUZZ=ON; without libFuzzer the same file builds with a main() that replays files given on
 * the command line (the regression corpus in tests/fuzz/corpus_record runs in every build). */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "ingest/job_spec.h"
#include "ingest/rec_parser_int.h"
#include "sink/sink.h"

static void check(int ok, const char *what, const tm_job *job) {
    if (ok)
        return;
    fprintf(stderr, "fuzz_record: invariant broken: %s (code %s, msg %s)\n", what,
            tm_errcode_name(job->err_code), job->err_msg ? job->err_msg : "NULL");
    abort();
}

static void check_job(const tm_job *job) {
    if (job->err_code != TM_ERRCODE_NONE) {
        check(job->err_msg && job->err_msg[0], "error record without a message", job);
        check(!job->prompt && !job->messages && !job->sp.stop, "error record with payload", job);
    } else {
        check(job->id_json != NULL, "valid record without an id", job);
        check(!job->err_msg, "valid record with a message", job);
        check((job->prompt != NULL) != (job->n_messages > 0), "prompt xor messages", job);
        check(job->format == TM_REC_FORMAT_NATIVE || job->format == TM_REC_FORMAT_OPENAI_CHAT ||
                  job->format == TM_REC_FORMAT_OPENAI_COMPLETION,
              "valid record of unknown format", job);
    }
    // The sink's line for it must be one valid JSON object line.
    tm_completion c = {.seq_no = job->seq_no,
                       .file = job->file,
                       .line = job->line,
                       .id_json = job->id_json,
                       .text = "t",
                       .err_code = job->err_code,
                       .err_msg = job->err_msg,
                       .format = job->format,
                       .model = job->model};
    tm_buf b = {0};
    tm_err err = {0};
    tm_rc rc = job->err_code ? tm_sink_format_error(&b, &c, &err) : tm_sink_format_ok(&b, &c, &err);
    check(rc == TM_OK, "sink could not format the record", job);
    json_error_t jerr;
    json_t *j = json_loadb(b.data, b.len, JSON_REJECT_DUPLICATES, &jerr);
    check(j && json_is_object(j), "sink line is not a JSON object", job);
    json_decref(j);
    tm_buf_fini(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static char *inputs[1] = {"fuzz.jsonl"};
    tm_job_spec spec = {.inputs = inputs,
                        .n_inputs = 0,
                        .max_line_bytes = 1 << 20,
                        .max_depth = 16,
                        .max_field_bytes = 4096,
                        .max_messages = 8};
    tm_rec_parser ps;
    tm_err err = {0};
    tm_rec_parser_init(&ps, &spec);
    const char *p = (const char *)data, *end = p + size;
    uint64_t line = 0;
    while (p <= end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
        tm_job *job = NULL;
        if (tm_rec_parser_line(&ps, "fuzz.jsonl", ++line, p, n, &job, &err) == TM_OK) {
            check_job(job);
            tm_job_destroy(job);
        }
        if (!nl)
            break;
        p = nl + 1;
    }
    tm_rec_parser_fini(&ps);
    return 0;
}

#include "fuzz_replay.h"
