/* tests/fuzz/fuzz_model_config.c - libFuzzer target for the model config parser
 * (runner/model/model.c parse_config and, for "model_type": "deepseek_v4",
 * runner/model/model_dsv4.c): the input up to its first NUL is written as config.json, the rest
 * (after the NUL, when there is one) as generation_config.json, into a private folder (on /dev/shm
 * when there is one) that holds no weights, and tm_model_load is called. It can never succeed
 * (there are no weights), so it must end in TM_E_PARSE / TM_E_INVAL (the config) or TM_E_IO (no
 * weights, after a config that was accepted) with a message and no model; never a crash, hang, leak
 * or other code. Built with clang -fsanitize=fuzzer,address,undefined when TM_FUZZ=ON; otherwise
 * fuzz_replay.h adds a main() that replays the files given on the command line (corpus
 * tests/fuzz/corpus_model_config). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "runner/model/model.h"

static void check(int ok, const char *what, const tm_err *err) {
    if (ok)
        return;
    fprintf(stderr, "fuzz_model_config: invariant broken: %s (rc %d, msg %s)\n", what,
            err ? (int)err->rc : 0, err ? err->msg : "");
    abort();
}

static char g_dir[64], g_cfg[96], g_gen[96];

static void cleanup(void) {
    unlink(g_cfg);
    unlink(g_gen);
    rmdir(g_dir);
}

static void setup(void) {
    if (g_dir[0])
        return;
    const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(g_dir, sizeof(g_dir), "%s/tm_fuzz_model_XXXXXX", base);
    TM_ASSERT(mkdtemp(g_dir) != NULL);
    snprintf(g_cfg, sizeof(g_cfg), "%s/config.json", g_dir);
    snprintf(g_gen, sizeof(g_gen), "%s/generation_config.json", g_dir);
    atexit(cleanup);
}

static void write_file(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    TM_ASSERT(f);
    TM_ASSERT(fwrite(p, 1, n, f) == n);
    fclose(f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    setup();
    const uint8_t *nul = memchr(data, '\0', size);
    size_t n_cfg = nul ? (size_t)(nul - data) : size;
    write_file(g_cfg, data, n_cfg);
    if (nul)
        write_file(g_gen, nul + 1, size - n_cfg - 1);
    else
        unlink(g_gen);
    tm_model *m = NULL;
    tm_err err = {0};
    long live = tm_alloc_live();
    tm_rc rc = tm_model_load(g_dir, &m, &err);
    check(rc == TM_E_PARSE || rc == TM_E_INVAL || rc == TM_E_IO || rc == TM_E_NOMEM,
          "load without weights gave an unexpected code", &err);
    check(m == NULL && err.msg[0], "failed load with a model or without a message", &err);
    check(tm_alloc_live() == live, "failed load leaked", &err);
    return 0;
}

#include "fuzz_replay.h"
