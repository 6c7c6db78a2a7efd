/* tests/tm_v41_model.h - a DeepSeek-V4.1 test model with what its Engram needs: the model, its
 * tokenizer and the tokenizer's compressed-id map (runner/engram_map.h). Shared by the CPU tests
 * (tests/unit/test_dsv41*.c) and the GPU test (tests/gpu/test_dsv41_cuda.c); include after
 * tm_test.h. */
#ifndef TM_TESTS_TM_V41_MODEL_H
#define TM_TESTS_TM_V41_MODEL_H

#include <stdint.h>
#include <string.h>

#include "base/alloc.h"
#include "runner/engram_map.h"
#include "runner/model/model.h"
#include "runner/text/tokenizer.h"
#include "tm_test.h"

typedef struct v41 {
    tm_model *m;
    tm_tokenizer *tok;
    int32_t *map; /* owned */
    uint32_t n_map, n_comp;
} v41;

/* Loads the model in dir, its tokenizer and the map; a failure is a failed check. 0 on success;
 * on failure *v holds what was loaded (close_v41 frees it). */
static inline int open_v41(const char *dir, v41 *v) {
    tm_err err = {0};
    memset(v, 0, sizeof(*v));
    tm_rc rc = tm_model_load(dir, &v->m, &err);
    TM_CHECK_OK(rc, &err);
    if (rc)
        return 1;
    rc = tm_tok_load(dir, &v->tok, &err);
    TM_CHECK_OK(rc, &err);
    if (rc)
        return 1;
    rc = tm_engram_map_from_tok(v->tok, &v->map, &v->n_map, &v->n_comp, &err);
    TM_CHECK_OK(rc, &err);
    return rc != TM_OK;
}

static inline void close_v41(v41 *v) {
    tm_free(v->map);
    tm_tok_destroy(v->tok);
    tm_model_destroy(v->m);
}

#endif /* TM_TESTS_TM_V41_MODEL_H */
