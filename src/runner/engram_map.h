/* runner/engram_map.h - the Engram compressed token map of a model's tokenizer (DeepSeek-V4.1):
 * every token id decoded alone (runner/text, special tokens as their content) and normalised by
 * runner/model/engram_hash.h's tm_engram_token_map_build. Built where the tokenizer and the model
 * meet (cmd/job_run.c, the tests) and handed to the engine through tm_engine_opts.token_map. */
#ifndef TM_RUNNER_ENGRAM_MAP_H
#define TM_RUNNER_ENGRAM_MAP_H

#include <stdint.h>

#include "base/err.h"
#include "runner/text/tokenizer.h"

/* On success *map owns [*n_tok] compressed ids (tm_free it), *n_tok = the tokenizer's vocabulary
 * size, *n_compressed the number of distinct keys. Errors: TM_E_INVAL (a text utf8proc cannot
 * normalise), TM_E_NOMEM. */
tm_rc tm_engram_map_from_tok(const tm_tokenizer *tok, int32_t **map, uint32_t *n_tok,
                             uint32_t *n_compressed, tm_err *err);

#endif /* TM_RUNNER_ENGRAM_MAP_H */
