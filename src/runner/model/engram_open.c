/* runner/model/engram_open.c - the Engram pieces of a DeepSeek-V4.1 engine's create
 * (engram_open.h). */
#include "runner/model/engram_open.h"

#include <stdio.h>

tm_rc tm_dsv41_engram_map_check(const tm_dsv41_cfg *c, const int32_t *map, uint32_t n_map,
                                const char *who, tm_err *err) {
    if (!map)
        return TM_ERR(err, TM_E_INVAL,
                      "%s: the model has Engram layers but no compressed token map was given "
                      "(engine options token_map, built from the tokenizer)",
                      who);
    int32_t mx = -1;
    for (uint32_t i = 0; i < n_map; i++)
        mx = map[i] > mx ? map[i] : mx;
    if ((uint64_t)(mx + 1) != c->engram_compressed_vocab_size)
        return TM_ERR(err, TM_E_INVAL,
                      "%s: config.json engram_compressed_vocab_size is %llu but the tokenizer's "
                      "compressed vocabulary has %lld entries",
                      who, (unsigned long long)c->engram_compressed_vocab_size, (long long)mx + 1);
    if (c->engram_pad_id >= n_map)
        return TM_ERR(err, TM_E_INVAL, "%s: engram_pad_id %u is outside the token map (%u)", who,
                      c->engram_pad_id, n_map);
    return TM_OK;
}

tm_rc tm_dsv41_engram_open(const tm_dsv41_cfg *c, const char *dir, const int32_t *map,
                           uint32_t rank, uint32_t world, uint64_t cache_mb, tm_engram_layout **lay,
                           tm_engram_table **tabs, tm_err *err) {
    const tm_engram_params ep = {.n_layer = c->n_engram,
                                 .layer_ids = c->engram_layer_ids,
                                 .num_embeddings = c->engram_num_embeddings,
                                 .max_ngram = c->engram_max_ngram_size,
                                 .n_heads = c->engram_n_heads,
                                 .head_dim = c->engram_head_dim,
                                 .vocab_size = c->engram_vocab_size,
                                 .compressed_vocab = c->engram_compressed_vocab_size,
                                 .pad_compressed = map[c->engram_pad_id]};
    tm_rc rc = tm_engram_layout_create(&ep, lay, err);
    const uint64_t mb = cache_mb ? cache_mb : TM_ENGRAM_DEFAULT_CACHE_MB;
    for (uint32_t k = 0; !rc && k < c->n_engram; k++) {
        char wn[96], sn[96];
        snprintf(wn, sizeof(wn), "layers.%u.engram.embed.weight", c->engram_layer_ids[k]);
        snprintf(sn, sizeof(sn), "layers.%u.engram.embed.scale", c->engram_layer_ids[k]);
        const tm_engram_table_cfg tc = {.path = dir,
                                        .weight_name = wn,
                                        .scale_name = sn,
                                        .rank = rank,
                                        .world = world,
                                        .cache_bytes = mb << 20,
                                        .n_io_threads = 0};
        rc = tm_engram_table_open(&tc, &tabs[k], err);
    }
    return rc;
}
