/* runner/model/model_dsv41.c - DeepSeek-V4.1 config.json parsing and weight binding for
 * tm_model_load. config.json holds the reference's ModelArgs fields; a missing field takes the
 * ModelArgs default, as the reference does; an unknown key or a value this engine does not run
 * is refused naming it. The layer roles (which compressed cache, indexer picks and index keys a
 * layer reads) are derived here once, following the reference's SharedAttentionRuntime: a
 * consumer reads what the last source at or before it published. Errors name config.json. */
#include "runner/model/model_dsv41.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "runner/model/arch.h"
#include "runner/model/dsv41_dspark.h"
#include "runner/model/quant.h"
#include "runner/model/safetensors.h"

#define CFG "config.json"

/* Every key config.json may hold: ModelArgs' fields, plus what Hugging Face tooling adds. */
static const char *const known_keys[] = {
    "max_batch_size", "max_seq_len", "temperature", "dtype", "expert_dtype", "vocab_size", "dim",
    "moe_inter_dim", "n_layers", "n_mtp_layers", "n_heads", "n_routed_experts", "n_shared_experts",
    "n_activated_experts", "score_func", "gate_temp", "norm_topk_prob", "route_scale",
    "swiglu_limit", "q_lora_rank", "head_dim", "rope_head_dim", "norm_eps", "o_groups",
    "o_lora_rank", "window_size", "compress_ratios", "kv_source_layers", "index_source_layers",
    "compress_rope_theta", "original_seq_len", "rope_theta", "rope_factor", "beta_fast",
    "beta_slow", "index_n_heads", "index_head_dim", "index_topk", "candidate_source_layer",
    "candidate_topk_blocks", "candidate_block_size", "hc_mult", "hc_sinkhorn_iters", "hc_eps",
    "engram_layer_ids", "engram_num_embeddings", "engram_max_ngram_size", "engram_vocab_size",
    "engram_n_heads", "engram_head_dim", "engram_pad_id", "engram_compressed_vocab_size",
    "vision_n_layers", "vision_dim", "vision_n_heads", "vision_inter_dim", "vision_patch_size",
    "vision_rope_theta", "vision_downsample_ratio", "vision_max_n_token", "vision_min_pixels",
    "vision_max_wh_ratio", "image_token_id", "dspark_block_size", "dspark_noise_token_id",
    "dspark_target_layer_ids", "dspark_markov_rank", "dspark_n_routed_experts",
    "dspark_n_activated_experts",
    /* tooling */
    "architectures", "model_type", "torch_dtype", "transformers_version", "bos_token_id",
    "eos_token_id", "pad_token_id"};

/* ---- small JSON readers ---- */

static tm_rc get_u64(json_t *obj, const char *key, uint64_t def, uint64_t lo, uint64_t hi,
                     uint64_t *out, tm_err *err) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return TM_OK;
    }
    if (!json_is_integer(v))
        return TM_ERR(err, TM_E_PARSE, CFG ": %s is not an integer", key);
    json_int_t x = json_integer_value(v);
    if (x < 0 || (uint64_t)x < lo || (uint64_t)x > hi)
        return TM_ERR(err, TM_E_PARSE, CFG ": %s = %lld is out of range [%llu, %llu]", key,
                      (long long)x, (unsigned long long)lo, (unsigned long long)hi);
    *out = (uint64_t)x;
    return TM_OK;
}

static tm_rc get_u32(json_t *obj, const char *key, uint32_t def, uint32_t lo, uint32_t hi,
                     uint32_t *out, tm_err *err) {
    return tm_arch_cfg_u32(obj, CFG, key, 0, def, lo, hi, out, err); // runner/model/arch.h
}

static tm_rc get_num(json_t *obj, const char *key, double def, double *out, tm_err *err) {
    return tm_arch_cfg_num(obj, CFG, key, 0, def, out, err);
}

/* An integer list (absent: the n_def defaults). */
static tm_rc get_list(json_t *obj, const char *key, const int64_t *def, uint32_t n_def, int64_t lo,
                      int64_t hi, uint32_t cap, int64_t *out, uint32_t *n, tm_err *err) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        if (n_def) // def may be NULL when there is no default entry
            memcpy(out, def, n_def * sizeof(int64_t));
        *n = n_def;
        return TM_OK;
    }
    if (!json_is_array(v))
        return TM_ERR(err, TM_E_PARSE, CFG ": %s is not a list of integers", key);
    if (json_array_size(v) > cap)
        return TM_ERR(err, TM_E_INVAL, CFG ": %s has %zu entries, more than %u supported", key,
                      json_array_size(v), cap);
    *n = (uint32_t)json_array_size(v);
    for (uint32_t i = 0; i < *n; i++) {
        json_t *e = json_array_get(v, i);
        if (!json_is_integer(e) || json_integer_value(e) < lo || json_integer_value(e) > hi)
            return TM_ERR(err, TM_E_PARSE, CFG ": %s[%u] is not an integer in [%lld, %lld]", key, i,
                          (long long)lo, (long long)hi);
        out[i] = json_integer_value(e);
    }
    return TM_OK;
}

/* ---- RoPE: the reference's precompute_freqs_cis frequencies, in fp32 as torch computes them ----
 */

static void rope_freqs(float *out, uint32_t dim, double base, uint32_t orig, double factor,
                       double beta_fast, double beta_slow) {
    const uint32_t half = dim / 2;
    for (uint32_t i = 0; i < half; i++)
        out[i] = 1.0f / powf((float)base, (float)(2 * i) / (float)dim);
    if (orig == 0)
        return;
    // YaRN: the dims whose wavelength fits the training context keep their frequency, those far
    // beyond are divided by factor, a linear ramp between (corrected dims of beta_fast/slow).
    const double two_pi = 2 * M_PI;
    double lo_d = dim * log(orig / (beta_fast * two_pi)) / (2 * log(base));
    double hi_d = dim * log(orig / (beta_slow * two_pi)) / (2 * log(base));
    double lo = floor(lo_d), hi = ceil(hi_d);
    if (lo < 0)
        lo = 0;
    if (hi > dim - 1)
        hi = dim - 1;
    const float den = (float)(hi - lo > 1e-3 ? hi - lo : 1e-3);
    for (uint32_t i = 0; i < half; i++) {
        float ramp = ((float)i - (float)lo) / den;
        ramp = ramp < 0.0f ? 0.0f : ramp > 1.0f ? 1.0f : ramp;
        const float smooth = 1.0f - ramp;
        out[i] = out[i] / (float)factor * (1.0f - smooth) + out[i] * smooth;
    }
}

/* ---- config ---- */

static int in_list(const int64_t *l, uint32_t n, int64_t x) {
    for (uint32_t i = 0; i < n; i++)
        if (l[i] == x)
            return 1;
    return 0;
}

static tm_rc parse_args(json_t *root, json_t *ids, json_t *gen, tm_model_cfg *c, tm_dsv41 **out,
                        tm_err *err) {
    *out = NULL;
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        int ok = 0;
        for (size_t i = 0; i < sizeof(known_keys) / sizeof(known_keys[0]) && !ok; i++)
            ok = !strcmp(key, known_keys[i]);
        if (!ok)
            return TM_ERR(err, TM_E_INVAL,
                          CFG ": field '%.80s' is not a DeepSeek-V4.1 ModelArgs field (not "
                              "supported)",
                          key);
    }
    tm_dsv41 *m = tm_calloc(1, sizeof(*m));
    if (!m)
        return TM_ERR(err, TM_E_NOMEM, "deepseek_v41 config");
    tm_dsv41_cfg *d = &m->cfg;
    tm_rc rc = TM_OK;
    double x = 0;
    uint32_t u = 0;
    const uint32_t BIG = 1u << 30;
#define U32(k, def, lo, hi, dst)                                                                   \
    do {                                                                                           \
        if (rc == TM_OK)                                                                           \
            rc = get_u32(root, k, def, lo, hi, dst, err);                                          \
    } while (0)
#define NUM(k, def, dst)                                                                           \
    do {                                                                                           \
        if (rc == TM_OK) {                                                                         \
            rc = get_num(root, k, def, &x, err);                                                   \
            dst = (float)x;                                                                        \
        }                                                                                          \
    } while (0)
    U32("max_seq_len", 4096, 1, BIG, &d->max_seq_len);
    U32("vocab_size", 129280, 1, BIG, &d->vocab_size);
    U32("dim", 1024, 1, 1u << 16, &d->dim);
    U32("moe_inter_dim", 1024, 1, 1u << 20, &d->moe_inter_dim);
    U32("n_layers", 5, 1, TM_DSV41_MAX_LAYER, &d->n_layers);
    U32("n_mtp_layers", 1, 0, 64, &d->n_mtp_layers);
    U32("n_heads", 16, 1, 4096, &d->n_heads);
    U32("n_routed_experts", 8, 1, 1u << 16, &d->n_routed_experts);
    U32("n_shared_experts", 1, 1, 1, &u);
    U32("n_activated_experts", 2, 1, 1u << 16, &d->n_activated_experts);
    NUM("gate_temp", 1.0, d->gate_temp);
    NUM("route_scale", 1.0, d->route_scale);
    NUM("swiglu_limit", 0.0, d->swiglu_limit);
    U32("q_lora_rank", 256, 1, 1u << 16, &d->q_lora_rank);
    U32("head_dim", 128, 1, 1u << 14, &d->head_dim);
    U32("rope_head_dim", 32, 2, TM_DSV41_MAX_ROPE, &d->rope_head_dim);
    NUM("norm_eps", 1e-20, d->norm_eps);
    U32("o_groups", 8, 1, 4096, &d->o_groups);
    U32("o_lora_rank", 256, 1, 1u << 16, &d->o_lora_rank);
    U32("window_size", 128, 1, BIG, &d->window_size);
    NUM("compress_rope_theta", 40000.0, d->compress_rope_theta);
    U32("original_seq_len", 0, 0, BIG, &d->original_seq_len);
    NUM("rope_theta", 10000.0, d->rope_theta);
    NUM("rope_factor", 40.0, d->rope_factor);
    NUM("beta_fast", 32.0, d->beta_fast);
    NUM("beta_slow", 1.0, d->beta_slow);
    U32("index_n_heads", 16, 1, 4096, &d->index_n_heads);
    U32("index_head_dim", 64, 1, 1u << 14, &d->index_head_dim);
    U32("index_topk", 64, 1, BIG, &d->index_topk);
    U32("candidate_topk_blocks", 0, 0, BIG, &d->candidate_topk_blocks);
    U32("candidate_block_size", 0, 0, BIG, &d->candidate_block_size);
    U32("hc_mult", 4, 1, TM_DSV41_MAX_HC, &d->hc_mult);
    U32("hc_sinkhorn_iters", 20, 1, 1000, &d->hc_sinkhorn_iters);
    NUM("hc_eps", 1e-6, d->hc_eps);
    U32("engram_max_ngram_size", 1, 1, 16, &d->engram_max_ngram_size);
    U32("engram_n_heads", 0, 0, 4096, &d->engram_n_heads);
    U32("engram_head_dim", 0, 0, 1u << 16, &d->engram_head_dim);
    U32("engram_pad_id", 2, 0, BIG, &d->engram_pad_id);
    U32("vision_n_layers", 0, 0, 4096, &d->vision_n_layers);
    U32("dspark_block_size", 0, 0, 4096, &d->dspark_block_size);
    U32("dspark_noise_token_id", 0, 0, BIG, &d->dspark_noise_token_id);
    U32("dspark_markov_rank", 0, 0, 1u << 16, &d->dspark_markov_rank);
    U32("dspark_n_routed_experts", 0, 0, 1u << 16, &d->dspark_n_routed_experts);
    U32("dspark_n_activated_experts", 0, 0, 1u << 16, &d->dspark_n_activated_experts);
    if (rc == TM_OK)
        rc = get_u64(root, "engram_vocab_size", 0, 0, UINT64_C(1) << 62, &d->engram_vocab_size,
                     err);
    if (rc == TM_OK)
        rc = get_u64(root, "engram_compressed_vocab_size", 0, 0, UINT64_C(1) << 40,
                     &d->engram_compressed_vocab_size, err);
    if (rc)
        goto fail;
    // Fields read and range-checked, not used by the text forward: runtime limits, vision, DSpark.
    {
        static const char *const ints[] = {
            "max_batch_size",     "vision_dim",        "vision_n_heads",
            "vision_inter_dim",   "vision_patch_size", "vision_downsample_ratio",
            "vision_max_n_token", "vision_min_pixels", "image_token_id"};
        for (size_t i = 0; rc == TM_OK && i < sizeof(ints) / sizeof(ints[0]); i++)
            rc = get_u32(root, ints[i], 0, 0, BIG, &u, err);
        if (rc == TM_OK)
            rc = get_num(root, "temperature", 1.0, &x, err);
        if (rc == TM_OK)
            rc = get_num(root, "vision_rope_theta", 10000.0, &x, err);
        json_t *v = json_object_get(root, "vision_max_wh_ratio");
        if (rc == TM_OK && v && !json_is_null(v) && !json_is_number(v))
            rc = TM_ERR(err, TM_E_PARSE, CFG ": vision_max_wh_ratio is not a number or null");
        if (rc)
            goto fail;
    }
    // strings and booleans
    {
        json_t *v = json_object_get(root, "dtype");
        const char *s = v && !json_is_null(v) ? json_string_value(v) : "fp8";
        if (!s || (strcmp(s, "fp8") && strcmp(s, "bf16"))) {
            rc = TM_ERR(err, TM_E_INVAL, CFG ": dtype must be \"fp8\" or \"bf16\"");
            goto fail;
        }
        d->fp8 = !strcmp(s, "fp8");
        v = json_object_get(root, "expert_dtype");
        if (!v) {
            d->expert_fp4 = 1; // ModelArgs default "fp4"
        } else if (json_is_null(v)) {
            d->expert_fp4 = 0;
        } else if (json_is_string(v) && !strcmp(json_string_value(v), "fp4")) {
            d->expert_fp4 = 1;
        } else {
            rc = TM_ERR(err, TM_E_INVAL, CFG ": expert_dtype must be \"fp4\" or null");
            goto fail;
        }
        v = json_object_get(root, "score_func");
        s = v && !json_is_null(v) ? json_string_value(v) : "sqrtsoftplus";
        if (s && !strcmp(s, "sqrtsoftplus"))
            d->score_func = TM_DSV41_SCORE_SQRTSOFTPLUS;
        else if (s && !strcmp(s, "sigmoid"))
            d->score_func = TM_DSV41_SCORE_SIGMOID;
        else if (s && !strcmp(s, "softmax"))
            d->score_func = TM_DSV41_SCORE_SOFTMAX;
        else {
            rc = TM_ERR(err, TM_E_INVAL,
                        CFG ": score_func must be \"softmax\", \"sigmoid\" or \"sqrtsoftplus\"");
            goto fail;
        }
        v = json_object_get(root, "norm_topk_prob");
        if (v && !json_is_null(v) && !json_is_boolean(v)) {
            rc = TM_ERR(err, TM_E_PARSE, CFG ": norm_topk_prob is not a boolean");
            goto fail;
        }
        d->norm_topk_prob = !v || json_is_null(v) || json_is_true(v);
        v = json_object_get(root, "model_type");
        if (v && !(json_is_string(v) && !strcmp(json_string_value(v), "deepseek_v41"))) {
            rc = TM_ERR(err, TM_E_INVAL, CFG ": model_type is not \"deepseek_v41\"");
            goto fail;
        }
        v = json_object_get(root, "candidate_source_layer");
        if (v && !json_is_null(v) && !json_is_integer(v)) {
            rc = TM_ERR(err, TM_E_PARSE, CFG ": candidate_source_layer is not an integer");
            goto fail;
        }
        json_int_t cs = v && !json_is_null(v) ? json_integer_value(v) : -1;
        d->candidate_source_layer = cs < 0 ? -1 : cs > 100000 ? 100000 : (int32_t)cs;
    }
    // layer lists
    const uint32_t L = d->n_layers;
    {
        int64_t buf[2 * TM_DSV41_MAX_LAYER], kv[TM_DSV41_MAX_LAYER], ix[TM_DSV41_MAX_LAYER];
        static const int64_t def_ratio[] = {0, 2, 2, 1, 1, 0}, def_src[] = {1, 3};
        uint32_t n_r = 0, n_kv = 0, n_ix = 0;
        rc = get_list(root, "compress_ratios", def_ratio, 6, 0, 255, 2 * TM_DSV41_MAX_LAYER, buf,
                      &n_r, err);
        if (rc == TM_OK)
            rc = get_list(root, "kv_source_layers", def_src, 2, 0, 100000, TM_DSV41_MAX_LAYER, kv,
                          &n_kv, err);
        if (rc == TM_OK)
            rc = get_list(root, "index_source_layers", def_src, 2, 0, 100000, TM_DSV41_MAX_LAYER,
                          ix, &n_ix, err);
        if (rc)
            goto fail;
        if (n_r < L) {
            rc = TM_ERR(err, TM_E_PARSE, CFG ": compress_ratios has %u entries for n_layers %u",
                        n_r, L);
            goto fail;
        }
        int last_kv = -1, last_ix = -1, last_key = -1;
        for (uint32_t i = 0; i < L; i++) {
            d->ratio[i] = (uint8_t)buf[i];
            d->kv_source[i] = (uint8_t)in_list(kv, n_kv, i);
            d->index_source[i] = (uint8_t)in_list(ix, n_ix, i);
            d->kv_from[i] = d->idx_from[i] = d->key_from[i] = -1;
            d->engram_slot[i] = -1;
            const uint32_t r = d->ratio[i];
            if ((d->kv_source[i] || d->index_source[i]) && r == 0) {
                rc = TM_ERR(err, TM_E_INVAL,
                            CFG ": layer %u is in kv_source_layers or index_source_layers but "
                                "its compress_ratios entry is 0",
                            i);
                goto fail;
            }
            if (d->kv_source[i])
                last_kv = (int)i;
            if (d->kv_source[i] && d->index_source[i])
                last_key = (int)i;
            if (d->index_source[i])
                last_ix = (int)i;
            if (r == 0)
                continue;
            // The reference's SharedAttentionRuntime: a compressed layer reads the cache the last
            // kv source published and the picks the last index source made; both must exist and
            // share its ratio (the positions are counted in its ratio).
            if (last_kv < 0 || d->ratio[last_kv] != r || last_ix < 0 || d->ratio[last_ix] != r) {
                rc = TM_ERR(err, TM_E_INVAL,
                            CFG ": layer %u (compress ratio %u) has no kv source and index source "
                                "layer of the same ratio at or before it (kv_source_layers, "
                                "index_source_layers)",
                            i, r);
                goto fail;
            }
            d->kv_from[i] = (int16_t)last_kv;
            d->idx_from[i] = (int16_t)last_ix;
            if (d->index_source[i]) {
                if (last_key < 0 || d->ratio[last_key] != r) {
                    rc = TM_ERR(err, TM_E_INVAL,
                                CFG ": index source layer %u has no layer in both kv_source_layers "
                                    "and index_source_layers of ratio %u at or before it to own "
                                    "its index keys",
                                i, r);
                    goto fail;
                }
                d->key_from[i] = (int16_t)last_key;
            }
        }
        for (uint32_t k = 0; k < n_kv; k++)
            if (kv[k] >= (int64_t)L) {
                rc = TM_ERR(err, TM_E_INVAL, CFG ": kv_source_layers[%u] = %lld is not a layer", k,
                            (long long)kv[k]);
                goto fail;
            }
        for (uint32_t k = 0; k < n_ix; k++)
            if (ix[k] >= (int64_t)L) {
                rc = TM_ERR(err, TM_E_INVAL, CFG ": index_source_layers[%u] = %lld is not a layer",
                            k, (long long)ix[k]);
                goto fail;
            }
        // candidate selection: the source must run an indexer; the later index sources using its
        // mask must score the same compressed positions (same ratio).
        const int32_t cs = d->candidate_source_layer;
        if (cs >= 0) {
            if ((uint32_t)cs >= L || !d->index_source[cs]) {
                rc = TM_ERR(err, TM_E_INVAL,
                            CFG ": candidate_source_layer %d is not an index source layer", cs);
                goto fail;
            }
            if (!d->candidate_block_size || !d->candidate_topk_blocks) {
                rc = TM_ERR(err, TM_E_INVAL,
                            CFG ": candidate_source_layer %d needs candidate_topk_blocks and "
                                "candidate_block_size > 0",
                            cs);
                goto fail;
            }
            for (uint32_t i = (uint32_t)cs + 1; i < L; i++)
                if (d->index_source[i] && d->ratio[i] != d->ratio[cs]) {
                    rc = TM_ERR(err, TM_E_INVAL,
                                CFG ": index source layer %u (ratio %u) uses the candidates of "
                                    "layer %d (ratio %u): ratios must match",
                                i, d->ratio[i], cs, d->ratio[cs]);
                    goto fail;
                }
        }
        // Engram
        int64_t eid[TM_DSV41_MAX_ENGRAM], ne[TM_DSV41_MAX_ENGRAM];
        uint32_t n_e = 0, n_ne = 0;
        rc = get_list(root, "engram_layer_ids", NULL, 0, 0, 100000, TM_DSV41_MAX_ENGRAM, eid, &n_e,
                      err);
        if (rc == TM_OK)
            rc = get_list(root, "engram_num_embeddings", NULL, 0, 1, INT64_C(1) << 40,
                          TM_DSV41_MAX_ENGRAM, ne, &n_ne, err);
        if (rc)
            goto fail;
        d->n_engram = n_e;
        if (n_e) {
            if (n_ne != n_e) {
                rc = TM_ERR(err, TM_E_PARSE,
                            CFG ": engram_num_embeddings has %u entries for %u engram_layer_ids",
                            n_ne, n_e);
                goto fail;
            }
            if (d->engram_max_ngram_size < 2 || !d->engram_n_heads || !d->engram_head_dim ||
                d->engram_head_dim % 32 || !d->engram_compressed_vocab_size ||
                !d->engram_vocab_size) {
                rc = TM_ERR(err, TM_E_INVAL,
                            CFG ": engram layers need engram_max_ngram_size >= 2, engram_n_heads, "
                                "engram_vocab_size, engram_compressed_vocab_size > 0 and "
                                "engram_head_dim a multiple of 32");
                goto fail;
            }
            for (uint32_t k = 0; k < n_e; k++) {
                if (eid[k] >= (int64_t)L || d->engram_slot[eid[k]] >= 0) {
                    rc = TM_ERR(err, TM_E_INVAL,
                                CFG ": engram_layer_ids[%u] = %lld is not a layer (or repeats)", k,
                                (long long)eid[k]);
                    goto fail;
                }
                d->engram_layer_ids[k] = (uint32_t)eid[k];
                d->engram_num_embeddings[k] = (uint64_t)ne[k];
                d->engram_slot[eid[k]] = (int16_t)k;
            }
        }
    }
    // shapes the kernels need
    {
        const char *bad = NULL;
        if (d->dim % 32)
            bad = "dim must be a multiple of 32 (act_quant blocks)";
        else if (d->head_dim % 32 || d->head_dim < d->rope_head_dim || d->rope_head_dim % 2)
            bad = "head_dim must be a multiple of 32 and >= rope_head_dim (even)";
        else if (d->q_lora_rank % 32 || d->moe_inter_dim % 32 || d->o_lora_rank % 32)
            bad = "q_lora_rank, moe_inter_dim and o_lora_rank must be multiples of 32";
        else if (d->n_heads % d->o_groups || (d->n_heads * d->head_dim / d->o_groups) % 32)
            bad = "n_heads * head_dim must split into o_groups groups of a multiple of 32";
        else if (d->index_head_dim % 32 || d->index_head_dim < d->rope_head_dim)
            bad = "index_head_dim must be a multiple of 32 and >= rope_head_dim";
        else if (d->n_activated_experts > d->n_routed_experts)
            bad = "n_activated_experts exceeds n_routed_experts";
        else if (d->vocab_size > (1u << 30))
            bad = "vocab_size too large";
        if (bad) {
            rc = TM_ERR(err, TM_E_INVAL, CFG ": %s", bad);
            goto fail;
        }
    }
    rope_freqs(d->inv_freq_main, d->rope_head_dim, d->rope_theta, 0, 1, 1, 1);
    rope_freqs(d->inv_freq_comp, d->rope_head_dim, d->compress_rope_theta, d->original_seq_len,
               d->rope_factor, d->beta_fast, d->beta_slow);
    // the shared fields
    c->n_layer = L;
    c->n_embd = d->dim;
    c->n_ff = d->moe_inter_dim;
    c->n_head = d->n_heads;
    c->n_kv_head = 1;
    c->head_dim = d->head_dim;
    c->n_vocab = d->vocab_size;
    c->n_ctx = d->max_seq_len;
    c->rms_eps = d->norm_eps;
    c->rope_theta = d->rope_theta;
    rc = tm_arch_cfg_token_ids(ids, gen, c, err);
    if (rc == TM_OK)
        rc = tm_dsv41_dspark_cfg(root, d, err);
    if (rc)
        goto fail;
#undef U32
#undef NUM
    *out = m;
    return TM_OK;
fail:
    tm_dsv41_destroy(m);
    return rc;
}

/* The released config.json: the text model's fields in text_config under their Hugging Face
 * names, the FP8 / FP4 formats in quantization_config, vision in vision_config. Mapped onto a
 * ModelArgs object (its names, as inference/config.json spells them); fields that only restate
 * what this engine requires are checked, anything unknown is refused naming it. */
static const char *const hf_map[][2] = {
    {"vocab_size", "vocab_size"},
    {"hidden_size", "dim"},
    {"moe_intermediate_size", "moe_inter_dim"},
    {"num_hidden_layers", "n_layers"},
    {"num_attention_heads", "n_heads"},
    {"head_dim", "head_dim"},
    {"qk_rope_head_dim", "rope_head_dim"},
    {"q_lora_rank", "q_lora_rank"},
    {"o_lora_rank", "o_lora_rank"},
    {"o_groups", "o_groups"},
    {"swiglu_limit", "swiglu_limit"},
    {"rms_norm_eps", "norm_eps"},
    {"max_position_embeddings", "max_seq_len"},
    {"rope_theta", "rope_theta"},
    {"n_routed_experts", "n_routed_experts"},
    {"n_shared_experts", "n_shared_experts"},
    {"num_experts_per_tok", "n_activated_experts"},
    {"scoring_func", "score_func"},
    {"norm_topk_prob", "norm_topk_prob"},
    {"routed_scaling_factor", "route_scale"},
    {"gate_temp", "gate_temp"},
    {"sliding_window", "window_size"},
    {"compress_ratios", "compress_ratios"},
    {"compress_rope_theta", "compress_rope_theta"},
    {"kv_source_layer_ids", "kv_source_layers"},
    {"index_source_layer_ids", "index_source_layers"},
    {"index_n_heads", "index_n_heads"},
    {"index_head_dim", "index_head_dim"},
    {"index_topk", "index_topk"},
    {"candidate_source_layer_id", "candidate_source_layer"},
    {"candidate_topk_blocks", "candidate_topk_blocks"},
    {"candidate_block_size", "candidate_block_size"},
    {"hc_mult", "hc_mult"},
    {"hc_sinkhorn_iters", "hc_sinkhorn_iters"},
    {"hc_eps", "hc_eps"},
    {"engram_layer_ids", "engram_layer_ids"},
    {"engram_num_embeddings", "engram_num_embeddings"},
    {"engram_max_ngram_size", "engram_max_ngram_size"},
    {"engram_vocab_size", "engram_vocab_size"},
    {"engram_n_heads", "engram_n_heads"},
    {"engram_head_dim", "engram_head_dim"},
    {"engram_pad_token_id", "engram_pad_id"},
    {"engram_compressed_vocab_size", "engram_compressed_vocab_size"},
    {"num_nextn_predict_layers", "n_mtp_layers"},
    {"dspark_block_size", "dspark_block_size"},
    {"dspark_noise_token_id", "dspark_noise_token_id"},
    {"dspark_target_layer_ids", "dspark_target_layer_ids"},
    {"dspark_markov_rank", "dspark_markov_rank"},
    {"dspark_n_routed_experts", "dspark_n_routed_experts"},
    {"dspark_num_experts_per_tok", "dspark_n_activated_experts"},
};

static int is_str(json_t *v, const char *s) {
    return json_is_string(v) && !strcmp(json_string_value(v), s);
}

static tm_rc from_release(json_t *root, json_t *args, tm_err *err) {
    json_t *tc = json_object_get(root, "text_config");
    if (!json_is_object(tc))
        return TM_ERR(err, TM_E_PARSE, CFG ": text_config is not an object");
    const char *key;
    json_t *v;
    json_object_foreach(tc, key, v) {
        size_t i = 0;
        while (i < sizeof(hf_map) / sizeof(hf_map[0]) && strcmp(key, hf_map[i][0]))
            i++;
        if (i < sizeof(hf_map) / sizeof(hf_map[0])) {
            json_object_set(args, hf_map[i][1], v);
            continue;
        }
        int ok = 1;
        if (!strcmp(key, "rope_scaling")) {
            if (json_is_null(v))
                continue;
            if (!json_is_object(v) || !is_str(json_object_get(v, "rope_type"), "yarn"))
                return TM_ERR(err, TM_E_INVAL,
                              CFG ": text_config.rope_scaling must be null or rope_type \"yarn\"");
            const char *rk;
            json_t *rv;
            json_object_foreach(v, rk, rv) {
                if (!strcmp(rk, "factor"))
                    json_object_set(args, "rope_factor", rv);
                else if (!strcmp(rk, "beta_fast") || !strcmp(rk, "beta_slow"))
                    json_object_set(args, rk, rv);
                else if (!strcmp(rk, "original_max_position_embeddings"))
                    json_object_set(args, "original_seq_len", rv);
                else if (strcmp(rk, "rope_type"))
                    return TM_ERR(err, TM_E_INVAL,
                                  CFG ": text_config.rope_scaling.%.60s is not supported", rk);
            }
            continue;
        }
        if (!strcmp(key, "model_type"))
            ok = is_str(v, "deepseek_v41_text");
        else if (!strcmp(key, "num_key_value_heads"))
            ok = json_is_integer(v) && json_integer_value(v) == 1;
        else if (!strcmp(key, "hidden_act"))
            ok = is_str(v, "silu");
        else if (!strcmp(key, "attention_bias") || !strcmp(key, "tie_word_embeddings"))
            ok = json_is_false(v);
        else if (!strcmp(key, "topk_method"))
            ok = is_str(v, "noaux_tc");
        else if (strcmp(key, "attention_dropout") && strcmp(key, "initializer_range") &&
                 strcmp(key, "use_cache"))
            return TM_ERR(err, TM_E_INVAL, CFG ": text_config.%.80s is not a supported field", key);
        if (!ok)
            return TM_ERR(err, TM_E_INVAL, CFG ": text_config.%.80s has an unsupported value", key);
    }
    // the formats: FP8 32x32 ue8m0 dense, expert_dtype
    json_t *q = json_object_get(root, "quantization_config");
    if (!q || json_is_null(q)) {
        json_object_set_new(args, "dtype", json_string("bf16"));
        json_object_set_new(args, "expert_dtype", json_null());
    } else {
        json_t *blk = json_object_get(q, "weight_block_size");
        if (!json_is_object(q) || !is_str(json_object_get(q, "quant_method"), "fp8") ||
            !is_str(json_object_get(q, "scale_fmt"), "ue8m0") || !json_is_array(blk) ||
            json_array_size(blk) != 2 || json_integer_value(json_array_get(blk, 0)) != 32 ||
            json_integer_value(json_array_get(blk, 1)) != 32)
            return TM_ERR(err, TM_E_INVAL,
                          CFG ": quantization_config must be quant_method fp8, scale_fmt ue8m0, "
                              "weight_block_size [32, 32] (DeepSeek-V4.1's format)");
        json_object_foreach(q, key, v) {
            if (!strcmp(key, "expert_dtype")) {
                if (!json_is_null(v) && !is_str(v, "fp4"))
                    return TM_ERR(err, TM_E_INVAL,
                                  CFG ": quantization_config.expert_dtype must be fp4 or null");
            } else if (!strcmp(key, "activation_scheme")) {
                if (!is_str(v, "dynamic"))
                    return TM_ERR(err, TM_E_INVAL,
                                  CFG ": quantization_config.activation_scheme must be dynamic");
            } else if (strcmp(key, "quant_method") && strcmp(key, "scale_fmt") &&
                       strcmp(key, "weight_block_size") && strcmp(key, "fmt")) {
                return TM_ERR(err, TM_E_INVAL,
                              CFG ": quantization_config.%.80s is not a supported field", key);
            }
        }
        json_t *ed = json_object_get(q, "expert_dtype");
        json_object_set_new(args, "dtype", json_string("fp8"));
        json_object_set(args, "expert_dtype", ed ? ed : json_null());
    }
    json_object_foreach(root, key, v) {
        if (!strcmp(key, "image_token_id")) {
            json_object_set(args, key, v);
        } else if (!strcmp(key, "tie_word_embeddings")) {
            if (!json_is_false(v))
                return TM_ERR(err, TM_E_INVAL, CFG ": tie_word_embeddings must be false");
        } else if (strcmp(key, "architectures") && strcmp(key, "model_type") &&
                   strcmp(key, "bos_token_id") && strcmp(key, "eos_token_id") &&
                   strcmp(key, "pad_token_id") && strcmp(key, "dtype") &&
                   strcmp(key, "torch_dtype") && strcmp(key, "transformers_version") &&
                   strcmp(key, "quantization_config") && strcmp(key, "text_config") &&
                   strcmp(key, "vision_config")) {
            return TM_ERR(err, TM_E_INVAL, CFG ": field '%.80s' is not supported", key);
        }
    }
    json_t *mt = json_object_get(root, "model_type");
    if (mt && !is_str(mt, "deepseek_v41"))
        return TM_ERR(err, TM_E_INVAL, CFG ": model_type is not \"deepseek_v41\"");
    // vision: the tower is not run (image records are answered unsupported); its layer count is
    // kept so the config says whether the checkpoint has one
    json_t *vc = json_object_get(root, "vision_config");
    if (json_is_object(vc) && json_is_integer(json_object_get(vc, "num_hidden_layers")))
        json_object_set(args, "vision_n_layers", json_object_get(vc, "num_hidden_layers"));
    return TM_OK;
}

tm_rc tm_dsv41_config_parse(void *root_v, void *gen_v, tm_model_cfg *c, tm_dsv41 **out,
                            tm_err *err) {
    json_t *root = root_v, *gen = gen_v;
    *out = NULL;
    if (!json_object_get(root, "text_config")) // ModelArgs names (inference/config.json)
        return parse_args(root, root, gen, c, out, err);
    json_t *args = json_object();
    if (!args)
        return TM_ERR(err, TM_E_NOMEM, "deepseek_v41 config");
    tm_rc rc = from_release(root, args, err);
    if (rc == TM_OK)
        rc = parse_args(args, root, gen, c, out, err);
    json_decref(args);
    return rc;
}

/* ---- weights ---- */

/* A float tensor (any float dtype) of exactly the shape. */
static tm_rc bind_f(const tm_st_set *st, const char *name, uint32_t n_dim, uint64_t d0, uint64_t d1,
                    tm_tensor *t, tm_err *err) {
    const uint64_t want[2] = {d0, d1};
    const tm_quant_cfg none = {0};
    return tm_quant_bind(st, &none, name, TM_QROLE_DENSE, n_dim, want, t, err);
}

/* A Linear [out][in]: FP8 with 32x32 ue8m0 block scales when the config says fp8 (expert: as
 * expert_dtype says), else float. */
static tm_rc bind_lin(const tm_st_set *st, const tm_dsv41_cfg *d, const char *name, uint64_t out,
                      uint64_t in, int expert, tm_tensor *t, tm_err *err) {
    tm_quant_cfg q = {0};
    q.method = TM_QMETHOD_DSREF;
    q.scale_dtype = TM_DTYPE_F8_E8M0;
    q.weight = d->fp8 ? TM_QUANT_FP8_BLOCK : TM_QUANT_NONE;
    q.block[0] = q.block[1] = 32;
    q.expert = expert && d->expert_fp4 ? TM_QUANT_MXFP4 : q.weight;
    const uint64_t want[2] = {out, in};
    tm_rc rc = tm_quant_bind(st, &q, name, expert ? TM_QROLE_EXPERT : TM_QROLE_DENSE, 2, want, t,
                             err);
    if (rc)
        return rc;
    const tm_quant need = expert ? (tm_quant)q.expert : (tm_quant)q.weight;
    if ((tm_quant)t->quant != need)
        return TM_ERR(err, TM_E_PARSE, "tensor '%s' is %s but the config says %s (dtype %s%s)",
                      name, t->quant ? tm_quant_name((tm_quant)t->quant) : tm_dtype_name(t->dtype),
                      need ? tm_quant_name(need) : "float", d->fp8 ? "fp8" : "bf16",
                      expert ? (d->expert_fp4 ? ", expert_dtype fp4" : ", expert_dtype null") : "");
    return TM_OK;
}

static tm_rc bind_layer(const tm_st_set *st, const tm_dsv41_cfg *d, uint32_t il, tm_dsv41_layer *Lw,
                        tm_err *err) {
    const uint64_t D = d->dim, N = d->hc_mult, hd = d->head_dim, H = d->n_heads, mix = (2 + N) * N,
                   E = d->n_routed_experts, I = d->moe_inter_dim, di = d->index_head_dim,
                   Hi = d->index_n_heads, G = d->o_groups;
    char name[192];
    tm_rc rc = TM_OK;
#define NAME(...) snprintf(name, sizeof(name), __VA_ARGS__)
#define F(t, n_dim, d0, d1, ...)                                                                   \
    do {                                                                                           \
        if (rc == TM_OK) {                                                                         \
            NAME(__VA_ARGS__);                                                                     \
            rc = bind_f(st, name, n_dim, d0, d1, t, err);                                          \
        }                                                                                          \
    } while (0)
#define LIN(t, o, i, ex, ...)                                                                      \
    do {                                                                                           \
        if (rc == TM_OK) {                                                                         \
            NAME(__VA_ARGS__);                                                                     \
            rc = bind_lin(st, d, name, o, i, ex, t, err);                                          \
        }                                                                                          \
    } while (0)
    F(&Lw->hc_attn_fn, 2, mix, N * D, "layers.%u.hc_attn_fn", il);
    F(&Lw->hc_attn_base, 1, mix, 0, "layers.%u.hc_attn_base", il);
    F(&Lw->hc_attn_scale, 1, 3, 0, "layers.%u.hc_attn_scale", il);
    F(&Lw->hc_ffn_fn, 2, mix, N * D, "layers.%u.hc_ffn_fn", il);
    F(&Lw->hc_ffn_base, 1, mix, 0, "layers.%u.hc_ffn_base", il);
    F(&Lw->hc_ffn_scale, 1, 3, 0, "layers.%u.hc_ffn_scale", il);
    F(&Lw->attn_norm, 1, D, 0, "layers.%u.attn_norm.weight", il);
    F(&Lw->ffn_norm, 1, D, 0, "layers.%u.ffn_norm.weight", il);
    F(&Lw->attn_sink, 1, H, 0, "layers.%u.attn.attn_sink", il);
    LIN(&Lw->wq_a, d->q_lora_rank, D, 0, "layers.%u.attn.wq_a.weight", il);
    F(&Lw->q_norm, 1, d->q_lora_rank, 0, "layers.%u.attn.q_norm.weight", il);
    LIN(&Lw->wq_b, H * hd, d->q_lora_rank, 0, "layers.%u.attn.wq_b.weight", il);
    LIN(&Lw->wkv, hd, D, 0, "layers.%u.attn.wkv.weight", il);
    F(&Lw->kv_norm, 1, hd, 0, "layers.%u.attn.kv_norm.weight", il);
    if (rc == TM_OK) { // float, or FP8 as released (the reference's convert.py dequantizes it)
        NAME("layers.%u.attn.wo_a.weight", il);
        tm_quant_cfg q = {0};
        q.method = TM_QMETHOD_DSREF;
        q.scale_dtype = TM_DTYPE_F8_E8M0;
        q.weight = TM_QUANT_FP8_BLOCK;
        q.block[0] = q.block[1] = 32;
        const uint64_t want[2] = {G * d->o_lora_rank, H * hd / G};
        rc = tm_quant_bind(st, &q, name, TM_QROLE_DENSE, 2, want, &Lw->wo_a, err);
    }
    LIN(&Lw->wo_b, D, G * d->o_lora_rank, 0, "layers.%u.attn.wo_b.weight", il);
    if (d->kv_source[il]) {
        F(&Lw->c_wkv, 2, hd, D, "layers.%u.attn.compressor.wkv.weight", il);
        if (d->ratio[il] > 1)
            F(&Lw->c_wgate, 2, hd, D, "layers.%u.attn.compressor.wgate.weight", il);
        F(&Lw->c_norm, 1, hd, 0, "layers.%u.attn.compressor.norm.weight", il);
    }
    if (d->index_source[il]) {
        LIN(&Lw->i_wq_b, Hi * di, d->q_lora_rank, 0, "layers.%u.attn.indexer.wq_b.weight", il);
        F(&Lw->i_wproj, 2, Hi, D, "layers.%u.attn.indexer.weights_proj.weight", il);
        if (d->kv_source[il]) {
            F(&Lw->i_wk, 2, di, hd, "layers.%u.attn.indexer.wk.weight", il);
            F(&Lw->i_k_norm, 1, di, 0, "layers.%u.attn.indexer.k_norm.weight", il);
        }
    }
    F(&Lw->gate_w, 2, E, D, "layers.%u.ffn.gate.weight", il);
    F(&Lw->gate_bias, 1, E, 0, "layers.%u.ffn.gate.bias", il);
    if (rc == TM_OK) {
        Lw->experts = tm_calloc(E * 3, sizeof(tm_tensor));
        if (!Lw->experts)
            rc = TM_ERR(err, TM_E_NOMEM, "deepseek_v41 layer %u experts", il);
    }
    for (uint64_t e = 0; rc == TM_OK && e < E; e++) {
        LIN(&Lw->experts[e * 3 + 0], I, D, 1, "layers.%u.ffn.experts.%llu.w1.weight", il,
            (unsigned long long)e);
        LIN(&Lw->experts[e * 3 + 1], I, D, 1, "layers.%u.ffn.experts.%llu.w3.weight", il,
            (unsigned long long)e);
        LIN(&Lw->experts[e * 3 + 2], D, I, 1, "layers.%u.ffn.experts.%llu.w2.weight", il,
            (unsigned long long)e);
    }
    LIN(&Lw->sh_w1, I, D, 0, "layers.%u.ffn.shared_experts.w1.weight", il);
    LIN(&Lw->sh_w3, I, D, 0, "layers.%u.ffn.shared_experts.w3.weight", il);
    LIN(&Lw->sh_w2, D, I, 0, "layers.%u.ffn.shared_experts.w2.weight", il);
    const int slot = d->engram_slot[il];
    if (slot >= 0 && rc == TM_OK) {
        const uint64_t ehd = d->engram_head_dim,
                       n_cols = (uint64_t)(d->engram_max_ngram_size - 1) * d->engram_n_heads;
        // the table: FP8 rows with one ue8m0 scale per 32 values. Only its header is checked
        // here: the engine reads rows from the file on demand (runner/model/engram_table.h),
        // so nothing of it (scales included) is read at load.
        const uint64_t rows = d->engram_num_embeddings[slot];
        NAME("layers.%u.engram.embed.weight", il);
        const tm_st_tensor *tw = tm_st_set_find(st, name);
        NAME("layers.%u.engram.embed.scale", il);
        const tm_st_tensor *ts = tm_st_set_find(st, name);
        NAME("layers.%u.engram.embed.weight", il);
        if (!tw || !ts)
            rc = TM_ERR(err, TM_E_PARSE, "tensor '%s' or its .scale is missing", name);
        else if (tw->dtype != TM_DTYPE_F8_E4M3 || tw->n_dim != 2 || tw->shape[0] != rows ||
                 tw->shape[1] != ehd ||
                 (ts->dtype != TM_DTYPE_F8_E8M0 && ts->dtype != TM_DTYPE_U8) || ts->n_dim != 2 ||
                 ts->shape[0] != rows || ts->shape[1] != ehd / 32)
            rc = TM_ERR(err, TM_E_PARSE,
                        "%s: tensor '%s' must be F8_E4M3 [%llu, %llu] with an F8_E8M0 scale "
                        "[%llu, %llu] (engram_num_embeddings, engram_head_dim)",
                        tw->file, name, (unsigned long long)rows, (unsigned long long)ehd,
                        (unsigned long long)rows, (unsigned long long)ehd / 32);
        if (rc == TM_OK) {
            Lw->e_table = (tm_tensor){.data = tw->data,
                                      .dtype = TM_DTYPE_F8_E4M3,
                                      .n_dim = 2,
                                      .shape = {rows, ehd},
                                      .scale = ts->data,
                                      .quant = TM_QUANT_FP8_BLOCK,
                                      .scale_dtype = TM_DTYPE_F8_E8M0,
                                      .qblock = {1, 32}};
        }
        LIN(&Lw->e_wkv, (N + 1) * D, n_cols * ehd, 0, "layers.%u.engram.wkv.weight", il);
        F(&Lw->e_q, 2, N, D, "layers.%u.engram.q_weight", il);
        F(&Lw->e_k, 2, N, D, "layers.%u.engram.k_weight", il);
    }
#undef F
#undef LIN
#undef NAME
    return rc;
}

tm_rc tm_dsv41_bind(tm_model *m, const struct tm_st_set *st, tm_err *err) {
    tm_dsv41 *w = m->arch_w;
    const tm_dsv41_cfg *d = &w->cfg;
    w->layers = tm_calloc(d->n_layers, sizeof(*w->layers));
    if (!w->layers)
        return TM_ERR(err, TM_E_NOMEM, "deepseek_v41 layers");
    const uint64_t D = d->dim;
    tm_rc rc = bind_f(st, "embed.weight", 2, d->vocab_size, D, &m->embd, err);
    if (rc == TM_OK)
        rc = bind_f(st, "norm.weight", 1, D, 0, &m->out_norm, err);
    if (rc == TM_OK)
        rc = bind_f(st, "head.weight", 2, d->vocab_size, D, &m->lm_head, err);
    for (uint32_t il = 0; rc == TM_OK && il < d->n_layers; il++)
        rc = bind_layer(st, d, il, &w->layers[il], err);
    if (rc == TM_OK && d->dspark_block_size)
        rc = tm_dsv41_dspark_bind(st, d, &w->dspark, err);
    return rc;
}

void tm_dsv41_destroy(tm_dsv41 *d) {
    if (!d)
        return;
    for (uint32_t il = 0; d->layers && il < d->cfg.n_layers; il++)
        tm_free(d->layers[il].experts);
    tm_free(d->layers);
    tm_dsv41_dspark_destroy(d->dspark);
    tm_free(d);
}

/* ---- the loader's table entry (runner/model/arch.h) ---- */

static tm_rc arch_parse(void *root, void *gen, tm_model_cfg *c, void **arch_w, tm_err *err) {
    tm_dsv41 *d = NULL;
    tm_rc rc = tm_dsv41_config_parse(root, gen, c, &d, err);
    *arch_w = d;
    return rc;
}

static int arch_is_quantized(const tm_model *m) {
    const tm_dsv41 *d = tm_model_dsv41(m);
    return d && (d->cfg.fp8 || d->cfg.expert_fp4);
}

static int arch_has_drafter(const tm_model *m) {
    const tm_dsv41 *d = tm_model_dsv41(m);
    return d && d->dspark;
}

static void arch_destroy(void *arch_w) { tm_dsv41_destroy(arch_w); }

const tm_arch_ops tm_arch_dsv41 = {
    .name = "deepseek_v41",
    .hf_class = "DeepseekV41ForCausalLM",
    .title = "DeepSeek-V4.1",
    .llama_shape = 0,
    .no_fp8_at_load = "its FP8 format is 32x32 block-scaled with ue8m0 scales, as released",
    .quant_experts = 0,
    .config_parse = arch_parse,
    .bind = tm_dsv41_bind,
    .is_quantized = arch_is_quantized,
    .has_drafter = arch_has_drafter,
    .destroy = arch_destroy,
};
