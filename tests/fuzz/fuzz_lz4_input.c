/* tests/fuzz/fuzz_lz4_input.c - libFuzzer target for the compressed-input readers of
 * ingest/source.c: the LZ4 frame stream decoder (any number of frames, decoded incrementally) and
 * the gzip reader. The first input byte picks the file name (bit 0: in.jsonl.lz4 or in.jsonl.gz),
 * the rest is the file's content, written to a private folder (on /dev/shm when there is one) and
 * read with tm_source_next to the end. Every call must give a record (valid or an error record
 * with a code and a message), TM_E_EOF, or TM_E_PARSE / TM_E_IO with a message naming the file;
 * never a crash, hang, leak or other code. At most 4096 records are read per input (a small
 * stream can expand a great deal). Built with clang -fsanitize=fuzzer,address,undefined when
 * TM_FUZZ=ON; otherwise fuzz_replay.h adds a main() that replays the files given on the command
 * line (corpus tests/fuzz/corpus_lz4_input: frames written by the lz4 tool, cut and damaged). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "ingest/job_spec.h"
#include "ingest/source.h"

static void check(int ok, const char *what, const tm_err *err) {
    if (ok)
        return;
    fprintf(stderr, "fuzz_lz4_input: invariant broken: %s (rc %d, msg %s)\n", what,
            err ? (int)err->rc : 0, err ? err->msg : "");
    abort();
}

static char g_dir[64], g_lz4[96], g_gz[96];

static void cleanup(void) {
    unlink(g_lz4);
    unlink(g_gz);
    rmdir(g_dir);
}

static void setup(void) {
    if (g_dir[0])
        return;
    const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(g_dir, sizeof(g_dir), "%s/tm_fuzz_lz4_XXXXXX", base);
    TM_ASSERT(mkdtemp(g_dir) != NULL);
    snprintf(g_lz4, sizeof(g_lz4), "%s/in.jsonl.lz4", g_dir);
    snprintf(g_gz, sizeof(g_gz), "%s/in.jsonl.gz", g_dir);
    atexit(cleanup);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    setup();
    if (size == 0)
        return 0;
    char *path = (data[0] & 1) ? g_gz : g_lz4;
    FILE *f = fopen(path, "wb");
    TM_ASSERT(f);
    TM_ASSERT(fwrite(data + 1, 1, size - 1, f) == size - 1);
    fclose(f);
    char *inputs[1] = {path};
    tm_job_spec spec = {.inputs = inputs,
                        .n_inputs = 1,
                        .max_line_bytes = 1 << 16,
                        .max_depth = 16,
                        .max_field_bytes = 4096,
                        .max_messages = 8};
    tm_source *src = NULL;
    tm_err err = {0};
    long live = tm_alloc_live();
    check(tm_source_open(&spec, &src, &err) == TM_OK, "tm_source_open", &err);
    for (int i = 0; i < 4096; i++) {
        tm_job *job = NULL;
        err = (tm_err){0};
        tm_rc rc = tm_source_next(src, &job, &err);
        if (rc == TM_E_EOF)
            break;
        if (rc != TM_OK) {
            check(rc == TM_E_PARSE || rc == TM_E_IO, "next failed with an unexpected code", &err);
            check(err.msg[0] && strstr(err.msg, "in.jsonl"), "error without the file name", &err);
            break;
        }
        check(job != NULL, "TM_OK without a record", &err);
        if (job->err_code != TM_ERRCODE_NONE)
            check(job->err_msg && job->err_msg[0], "error record without a message", &err);
        else
            check(job->prompt != NULL || job->n_messages > 0, "valid record without a prompt",
                  &err);
        tm_job_destroy(job);
    }
    tm_source_destroy(src);
    check(tm_alloc_live() == live, "source leaked", NULL);
    return 0;
}

#include "fuzz_replay.h"
