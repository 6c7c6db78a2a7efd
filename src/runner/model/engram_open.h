/* runner/model/engram_open.h - what a DeepSeek-V4.1 engine (the CPU one, runner/engine/cpu/dsv41.c,
 * and the CUDA one, runner/engine/cuda/dsv41.c) needs for Engram at create: the compressed token
 * map checked against the config, the hash layout (engram_hash.h) and the tables of every Engram
 * layer opened for reading by rows from the model's files (engram_table.h). Nothing is read but
 * the tables' headers. Any thread; the results are the caller's. */
#ifndef TM_RUNNER_MODEL_ENGRAM_OPEN_H
#define TM_RUNNER_MODEL_ENGRAM_OPEN_H

#include <stdint.h>

#include "base/err.h"
#include "runner/model/engram_hash.h"
#include "runner/model/engram_table.h"
#include "runner/model/model_dsv41.h"

/* The token map (map[n_map]: the compressed id of every token id) against c: present, its largest
 * id + 1 equal to engram_compressed_vocab_size (both numbers named), engram_pad_id inside it.
 * who starts the messages ("dsv41 engine"). TM_E_INVAL. */
tm_rc tm_dsv41_engram_map_check(const tm_dsv41_cfg *c, const int32_t *map, uint32_t n_map,
                                const char *who, tm_err *err);

/* The hash layout of c's Engram layers for the (checked) token map into *lay, and table k of
 * layer engram_layer_ids[k] (layers.<id>.engram.embed.weight / .scale under the model folder
 * dir) into tabs[k] (c->n_engram entries, NULL on entry), each with a row cache of cache_mb MiB
 * (0: TM_ENGRAM_DEFAULT_CACHE_MB) and this rank's rows of world. On failure what was opened stays
 * in *lay and tabs for the caller to close. Errors of tm_engram_layout_create and
 * tm_engram_table_open. */
tm_rc tm_dsv41_engram_open(const tm_dsv41_cfg *c, const char *dir, const int32_t *map,
                           uint32_t rank, uint32_t world, uint64_t cache_mb, tm_engram_layout **lay,
                           tm_engram_table **tabs, tm_err *err);

#endif /* TM_RUNNER_MODEL_ENGRAM_OPEN_H */
