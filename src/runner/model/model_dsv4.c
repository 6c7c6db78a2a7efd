/* runner/model/model_dsv4.c - DeepSeek-V4 config.json parsing and weight binding for
 * tm_model_load. The rules follow transformers 5.17's
 * DeepseekV4Config.__post_init__: layer_types (or legacy compress_ratios
 * 0/4/128) default to 2x HCA then CSA/HCA alternating; mlp_layer_types (or
 * legacy num_hash_layers, default 3) give hash_moe then moe; the rope dim is
 * head_dim * partial_rotary_factor (or legacy qk_rope_head_dim; default 64/512
 * of head_dim); "main" rope is plain with rope_theta, "compress" rope uses
 * compress_rope_theta plus whatever rope_parameters (or rope_scaling) says,
 * YaRN with attention_factor 1.0 unless given. Already nested rope_parameters
 * {"main": {...}, "compress": {...}} (what save_pretrained writes) are read as
 * they are. Errors as in runner/model/model.c; messages name config.json. */
#include "runner/model/model_dsv4.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "runner/model/arch.h"
#include "runner/model/safetensors.h"

#define CFG "config.json"

/* ---- small JSON readers ---- */

static tm_rc get_num(json_t *obj, const char *key, int required, double def, double *out,
                     tm_err *err) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        if (required)
            return TM_ERR(err, TM_E_PARSE, CFG ": missing %s", key);
        *out = def;
        return TM_OK;
    }
    if (!json_is_number(v) || !isfinite(json_number_value(v)))
        return TM_ERR(err, TM_E_PARSE, CFG ": %s is not a finite number", key);
    *out = json_number_value(v);
    return TM_OK;
}

/* ---- RoPE ---- */

/* inv_freq as transformers computes it (fp32 results; the powers in double,
 * then rounded). */
static void rope_inv_freq(tm_dsv4_rope *r, uint32_t dim) {
    uint32_t half = dim / 2;
    for (uint32_t i = 0; i < half; i++) {
        float pos_freq = (float)pow((double)r->theta, (double)(float)(2.0 * i) / (double)dim);
        float extra = 1.0f / pos_freq;
        if (!r->yarn) {
            r->inv_freq[i] = extra;
            continue;
        }
        // YaRN: blend interpolated (1/(factor*f)) and extrapolated (1/f)
        // frequencies with a linear ramp over the dims whose wavelengths fall
        // between beta_fast and beta_slow rotations of the original context.
        float inter = 1.0f / (r->factor * pos_freq);
        double lo_d = dim * log(r->orig_ctx / (r->beta_fast * 2 * M_PI)) / (2 * log(r->theta));
        double hi_d = dim * log(r->orig_ctx / (r->beta_slow * 2 * M_PI)) / (2 * log(r->theta));
        double lo = floor(lo_d), hi = ceil(hi_d);
        if (lo < 0)
            lo = 0;
        if (hi > dim - 1)
            hi = dim - 1;
        float flo = (float)lo, fhi = (float)hi;
        if (flo == fhi)
            fhi += 0.001f;
        float ramp = ((float)i - flo) / (fhi - flo);
        ramp = ramp < 0.0f ? 0.0f : ramp > 1.0f ? 1.0f : ramp;
        float extra_w = 1.0f - ramp;
        r->inv_freq[i] = inter * (1.0f - extra_w) + extra * extra_w;
    }
}

/* One rope setting from a rope_parameters-style object p (may be NULL: plain
 * rope). */
static tm_rc parse_rope_obj(json_t *p, double theta_def, tm_dsv4_rope *r, tm_err *err) {
    double theta = theta_def, v;
    memset(r, 0, sizeof(*r));
    r->attn_factor = 1.0f;
    tm_rc rc = TM_OK;
    if (p && json_is_object(p) && json_object_get(p, "rope_theta") &&
        !json_is_null(json_object_get(p, "rope_theta")))
        rc = get_num(p, "rope_theta", 1, 0, &theta, err);
    if (rc)
        return rc;
    if (!(theta > 1.0) || theta > 1e12)
        return TM_ERR(err, TM_E_PARSE, CFG ": rope theta %g out of range", theta);
    r->theta = (float)theta;
    if (!p || json_is_null(p))
        return TM_OK;
    if (!json_is_object(p))
        return TM_ERR(err, TM_E_PARSE, CFG ": rope parameters are not an object");
    json_t *jt = json_object_get(p, "rope_type");
    if (!jt)
        jt = json_object_get(p, "type");
    const char *type = json_is_string(jt) ? json_string_value(jt) : "default";
    if (!strcmp(type, "default"))
        return TM_OK;
    if (strcmp(type, "yarn"))
        return TM_ERR(err, TM_E_INVAL, CFG ": rope type '%.40s' is not supported (default, yarn)",
                      type);
    r->yarn = 1;
    rc = get_num(p, "factor", 1, 0, &v, err);
    if (rc)
        return rc;
    if (!(v >= 1.0) || v > 1e6)
        return TM_ERR(err, TM_E_PARSE, CFG ": yarn factor %g out of range", v);
    r->factor = (float)v;
    rc = tm_arch_cfg_u32(p, CFG, "original_max_position_embeddings", 1, 0, 1, 1u << 30,
                         &r->orig_ctx, err);
    if (rc == TM_OK)
        rc = get_num(p, "beta_fast", 0, 32.0, &v, err);
    if (rc)
        return rc;
    r->beta_fast = (float)(v ? v : 32.0);
    rc = get_num(p, "beta_slow", 0, 1.0, &v, err);
    if (rc)
        return rc;
    r->beta_slow = (float)(v ? v : 1.0);
    rc = get_num(p, "attention_factor", 0, 1.0, &v, err);
    if (rc)
        return rc;
    r->attn_factor = (float)v;
    json_t *t = json_object_get(p, "truncate");
    if (t && json_is_false(t))
        return TM_ERR(err, TM_E_INVAL, CFG ": yarn truncate false is not supported");
    return TM_OK;
}

/* ---- config ---- */

/* Layers [0, n) (required) and the MTP layer's entry n (when the lists have it; else sliding
 * attention and top-k MoE). */
static tm_rc parse_layer_types(json_t *root, uint32_t n, tm_dsv4_cfg *d, tm_err *err) {
    json_t *lt = json_object_get(root, "layer_types");
    json_t *cr = json_object_get(root, "compress_ratios");
    d->attn[n] = TM_DSV4_ATTN_SLIDING;
    d->hash[n] = 0;
    if (lt && !json_is_null(lt)) {
        if (!json_is_array(lt) || json_array_size(lt) < n)
            return TM_ERR(err, TM_E_PARSE, CFG ": layer_types must list %u layers", n);
        for (uint32_t i = 0; i < n + (json_array_size(lt) > n); i++) {
            const char *s = json_string_value(json_array_get(lt, i));
            if (s && !strcmp(s, "sliding_attention"))
                d->attn[i] = TM_DSV4_ATTN_SLIDING;
            else if (s && !strcmp(s, "compressed_sparse_attention"))
                d->attn[i] = TM_DSV4_ATTN_CSA;
            else if (s && !strcmp(s, "heavily_compressed_attention"))
                d->attn[i] = TM_DSV4_ATTN_HCA;
            else
                return TM_ERR(err, TM_E_PARSE, CFG ": layer_types[%u] is not a V4 layer type", i);
        }
    } else if (cr && !json_is_null(cr)) {
        if (!json_is_array(cr) || json_array_size(cr) < n)
            return TM_ERR(err, TM_E_PARSE, CFG ": compress_ratios must list %u layers", n);
        for (uint32_t i = 0; i < n + (json_array_size(cr) > n); i++) {
            json_t *e = json_array_get(cr, i);
            json_int_t r = json_is_integer(e) ? json_integer_value(e) : -1;
            if (r == 0)
                d->attn[i] = TM_DSV4_ATTN_SLIDING;
            else if (r == 4)
                d->attn[i] = TM_DSV4_ATTN_CSA;
            else if (r == 128)
                d->attn[i] = TM_DSV4_ATTN_HCA;
            else
                return TM_ERR(err, TM_E_PARSE, CFG ": compress_ratios[%u] is not 0, 4 or 128", i);
        }
    } else {
        for (uint32_t i = 0; i < n; i++)
            d->attn[i] = i < 2 ? TM_DSV4_ATTN_HCA
                               : ((i - 2) % 2 ? TM_DSV4_ATTN_CSA : TM_DSV4_ATTN_HCA);
    }
    json_t *mt = json_object_get(root, "mlp_layer_types");
    if (mt && !json_is_null(mt)) {
        if (!json_is_array(mt) || json_array_size(mt) < n)
            return TM_ERR(err, TM_E_PARSE, CFG ": mlp_layer_types must list %u layers", n);
        for (uint32_t i = 0; i < n + (json_array_size(mt) > n); i++) {
            const char *s = json_string_value(json_array_get(mt, i));
            if (!s || (strcmp(s, "hash_moe") && strcmp(s, "moe")))
                return TM_ERR(err, TM_E_PARSE, CFG ": mlp_layer_types[%u] is not hash_moe or moe",
                              i);
            d->hash[i] = !strcmp(s, "hash_moe");
        }
    } else {
        uint32_t n_hash = 0;
        tm_rc rc = tm_arch_cfg_u32(root, CFG, "num_hash_layers", 0, 3, 0, TM_DSV4_MAX_LAYER,
                                   &n_hash, err);
        if (rc)
            return rc;
        for (uint32_t i = 0; i < n; i++)
            d->hash[i] = i < n_hash;
    }
    return TM_OK;
}

tm_rc tm_dsv4_config_parse(void *root_v, void *gen_v, tm_model_cfg *c, tm_dsv4 **out, tm_err *err) {
    json_t *root = root_v, *gen = gen_v;
    *out = NULL;
    tm_dsv4 *m = tm_calloc(1, sizeof(*m));
    if (!m)
        return TM_ERR(err, TM_E_NOMEM, "deepseek_v4 config");
    tm_dsv4_cfg *d = &m->cfg;
    tm_rc rc;
    double v;
#define U32(key, req, def, lo, hi, dst)                                                            \
    do {                                                                                           \
        rc = tm_arch_cfg_u32(root, CFG, key, req, def, lo, hi, dst, err);                          \
        if (rc)                                                                                    \
            goto fail;                                                                             \
    } while (0)
#define NUM(key, req, def, dst)                                                                    \
    do {                                                                                           \
        rc = get_num(root, key, req, def, &v, err);                                                \
        if (rc)                                                                                    \
            goto fail;                                                                             \
        dst = (float)v;                                                                            \
    } while (0)
    U32("num_hidden_layers", 1, 0, 1, TM_DSV4_MAX_LAYER, &c->n_layer);
    U32("hidden_size", 1, 0, 1, 1u << 16, &c->n_embd);
    U32("moe_intermediate_size", 1, 0, 1, 1u << 20, &c->n_ff);
    U32("num_attention_heads", 1, 0, 1, 1024, &c->n_head);
    U32("num_key_value_heads", 0, 1, 1, 1024, &c->n_kv_head);
    U32("head_dim", 1, 0, 2, 4096, &c->head_dim);
    U32("vocab_size", 1, 0, 1, 1u << 24, &c->n_vocab);
    U32("max_position_embeddings", 1, 0, 1, 1u << 30, &c->n_ctx);
    U32("q_lora_rank", 1, 0, 1, 1u << 16, &d->q_lora_rank);
    U32("o_groups", 1, 0, 1, 1024, &d->o_groups);
    U32("o_lora_rank", 1, 0, 1, 1u << 16, &d->o_lora_rank);
    U32("n_routed_experts", 1, 0, 1, 4096, &d->n_expert);
    U32("num_experts_per_tok", 1, 0, 1, 64, &d->n_expert_used);
    U32("sliding_window", 0, 128, 1, 1u << 20, &d->window);
    U32("index_n_heads", 0, 64, 1, 1024, &d->index_n_heads);
    U32("index_head_dim", 0, 128, 2, 4096, &d->index_head_dim);
    U32("index_topk", 0, 512, 1, 1u << 24, &d->index_topk);
    U32("hc_mult", 0, 4, 1, TM_DSV4_MAX_HC, &d->hc_mult);
    U32("hc_sinkhorn_iters", 0, 20, 1, 1000, &d->hc_iters);
    NUM("hc_eps", 0, 1e-6, d->hc_eps);
    NUM("routed_scaling_factor", 0, 1.5, d->routed_scale);
    NUM("swiglu_limit", 0, 10.0, d->swiglu_limit);
    NUM("rms_norm_eps", 0, 1e-6, c->rms_eps);
    if (c->n_kv_head != 1) {
        rc = TM_ERR(err, TM_E_INVAL, CFG ": num_key_value_heads must be 1 (shared KV head)");
        goto fail;
    }
    if (!(c->rms_eps > 0.0f) || c->rms_eps >= 1.0f) {
        rc = TM_ERR(err, TM_E_PARSE, CFG ": rms_norm_eps out of range");
        goto fail;
    }
    if (d->n_expert_used > d->n_expert || (c->n_head * c->head_dim) % d->o_groups) {
        rc = TM_ERR(err, TM_E_PARSE,
                    CFG ": num_experts_per_tok > n_routed_experts or "
                        "heads*head_dim not divisible "
                        "by o_groups");
        goto fail;
    }
    d->ratio_csa = 4;
    d->ratio_hca = 128;
    json_t *rates = json_object_get(root, "compress_rates");
    if (rates && json_is_object(rates)) {
        rc = tm_arch_cfg_u32(rates, CFG, "compressed_sparse_attention", 0, 4, 1, 1u << 16,
                             &d->ratio_csa, err);
        if (rc == TM_OK)
            rc = tm_arch_cfg_u32(rates, CFG, "heavily_compressed_attention", 0, 128, 1, 1u << 16,
                                 &d->ratio_hca, err);
        if (rc)
            goto fail;
    }
    U32("compress_rate_csa", 0, d->ratio_csa, 1, 1u << 16, &d->ratio_csa);
    U32("compress_rate_hca", 0, d->ratio_hca, 1, 1u << 16, &d->ratio_hca);
    rc = parse_layer_types(root, c->n_layer, d, err);
    if (rc)
        goto fail;

    json_t *sf = json_object_get(root, "scoring_func");
    const char *score = json_is_string(sf) ? json_string_value(sf) : "sqrtsoftplus";
    if (!strcmp(score, "sqrtsoftplus"))
        d->scoring = TM_DSV4_SCORE_SQRTSOFTPLUS;
    else if (!strcmp(score, "sigmoid"))
        d->scoring = TM_DSV4_SCORE_SIGMOID;
    else if (!strcmp(score, "softmax"))
        d->scoring = TM_DSV4_SCORE_SOFTMAX;
    else {
        rc = TM_ERR(err, TM_E_INVAL, CFG ": scoring_func '%.40s' is not supported", score);
        goto fail;
    }
    json_t *act = json_object_get(root, "hidden_act");
    if (act && !json_is_null(act) &&
        (!json_is_string(act) || strcmp(json_string_value(act), "silu"))) {
        rc = TM_ERR(err, TM_E_INVAL, CFG ": hidden_act must be \"silu\"");
        goto fail;
    }
    json_t *tie = json_object_get(root, "tie_word_embeddings");
    c->tie_embd = tie && json_is_true(tie);

    // Rope dim: partial_rotary_factor, else legacy qk_rope_head_dim, else 64/512.
    double prf = 0;
    rc = get_num(root, "partial_rotary_factor", 0, 0.0, &prf, err);
    if (rc)
        goto fail;
    if (prf > 1) { // a fraction of head_dim; also keeps the conversion below defined (fuzz seed)
        rc = TM_ERR(err, TM_E_PARSE, CFG ": partial_rotary_factor %g is over 1", prf);
        goto fail;
    }
    uint32_t qk_rope = 0;
    U32("qk_rope_head_dim", 0, 0, 0, 4096, &qk_rope);
    if (prf > 0)
        d->rope_dim = (uint32_t)(c->head_dim * prf);
    else if (qk_rope)
        d->rope_dim = qk_rope;
    else
        d->rope_dim = (uint32_t)(c->head_dim * (64.0 / 512.0));
    if (d->rope_dim % 2 || d->rope_dim == 0 || d->rope_dim > c->head_dim ||
        d->rope_dim > d->index_head_dim || d->rope_dim / 2 > 512) {
        rc = TM_ERR(err, TM_E_PARSE,
                    CFG ": rope dim %u must be even, > 0, <= head_dim and <= index_head_dim",
                    d->rope_dim);
        goto fail;
    }

    // Two rope settings.
    double theta, ctheta;
    rc = get_num(root, "rope_theta", 0, 10000.0, &theta, err);
    if (rc == TM_OK)
        rc = get_num(root, "compress_rope_theta", 0, 160000.0, &ctheta, err);
    if (rc)
        goto fail;
    json_t *rp = json_object_get(root, "rope_parameters");
    if (!rp || json_is_null(rp))
        rp = json_object_get(root, "rope_scaling");
    json_t *rp_main = rp ? json_object_get(rp, "main") : NULL;
    json_t *rp_comp = rp ? json_object_get(rp, "compress") : NULL;
    if (json_is_object(rp_main) && json_is_object(rp_comp)) {
        rc = parse_rope_obj(rp_main, theta, &d->rope_main, err);
        if (rc == TM_OK)
            rc = parse_rope_obj(rp_comp, ctheta, &d->rope_compress, err);
    } else {
        rc = parse_rope_obj(NULL, theta, &d->rope_main, err);
        if (rc == TM_OK)
            rc = parse_rope_obj(rp, ctheta, &d->rope_compress, err);
        // The flat form's rope_theta (if any) is the main one; compress keeps its
        // own theta.
        d->rope_compress.theta = (float)ctheta;
    }
    if (rc)
        goto fail;
    rope_inv_freq(&d->rope_main, d->rope_dim);
    rope_inv_freq(&d->rope_compress, d->rope_dim);
    c->rope_theta = d->rope_main.theta;
    c->rope_type = TM_ROPE_DEFAULT;
    c->rope_factor = 1.0f;

    rc = tm_arch_cfg_token_ids(root, gen, c, err);
    if (rc)
        goto fail;
#undef U32
#undef NUM
    *out = m;
    return TM_OK;
fail:
    tm_dsv4_destroy(m);
    return rc;
}

/* ---- weights ---- */

static tm_rc bind(const tm_st_set *st, const char *name, uint32_t n_dim, uint64_t d0, uint64_t d1,
                  uint64_t d2, tm_tensor *t, tm_err *err) {
    const tm_st_tensor *s = tm_st_set_find(st, name);
    if (!s)
        return TM_ERR(err, TM_E_PARSE, "tensor '%s' is missing", name);
    uint64_t want[3] = {d0, d1, d2};
    int ok = s->n_dim == n_dim;
    for (uint32_t i = 0; ok && i < n_dim; i++)
        ok = s->shape[i] == want[i];
    if (!ok)
        return TM_ERR(err, TM_E_PARSE,
                      "%s: tensor '%s' has %u dims [%llu, %llu, ...], expected "
                      "[%llu, %llu, %llu]",
                      s->file, name, s->n_dim, (unsigned long long)(s->n_dim ? s->shape[0] : 0),
                      (unsigned long long)(s->n_dim > 1 ? s->shape[1] : 0), (unsigned long long)d0,
                      (unsigned long long)d1, (unsigned long long)d2);
    if (s->dtype != TM_DTYPE_F32 && s->dtype != TM_DTYPE_F16 && s->dtype != TM_DTYPE_BF16)
        return TM_ERR(err, TM_E_PARSE, "%s: tensor '%s' has dtype %s, expected F32, F16 or BF16",
                      s->file, name, tm_dtype_name(s->dtype));
    memset(t, 0, sizeof(*t));
    t->data = s->data;
    t->dtype = s->dtype;
    t->n_dim = n_dim;
    for (uint32_t i = 0; i < n_dim; i++)
        t->shape[i] = want[i];
    return TM_OK;
}

/* The block tensors of layer il (the MTP layer when il == n_layer) under prefix ("model.layers.3.")
 * into *L. */
static tm_rc bind_layer(const tm_st_set *st, const tm_model_cfg *c, const tm_dsv4_cfg *d,
                        const char *prefix, uint32_t il, tm_dsv4_layer *L, tm_err *err) {
    const uint64_t D = c->n_embd, N = d->hc_mult, hd = c->head_dim, H = c->n_head,
                   mix = (2 + N) * N, E = d->n_expert, I = c->n_ff, di = d->index_head_dim;
    tm_rc rc = TM_OK;
    const int attn = d->attn[il], csa = attn == TM_DSV4_ATTN_CSA;
    const uint64_t cw = csa ? 2 * hd : hd;
    const uint64_t ratio = csa ? d->ratio_csa : d->ratio_hca;
    struct {
        const char *suffix;
        uint32_t n_dim;
        uint64_t d0, d1, d2;
        tm_tensor *t;
        int when; /* 0 always, 1 compressor, 2 indexer, 3 hash, 4 top-k */
        int lin;  /* 1: a linear, plain or quantized; 2: routed experts (expert_dtype) */
    } spec[] = {
        {"attn_hc.fn", 2, mix, N * D, 0, &L->attn_hc_fn, 0, 0},
        {"attn_hc.base", 1, mix, 0, 0, &L->attn_hc_base, 0, 0},
        {"attn_hc.scale", 1, 3, 0, 0, &L->attn_hc_scale, 0, 0},
        {"ffn_hc.fn", 2, mix, N * D, 0, &L->ffn_hc_fn, 0, 0},
        {"ffn_hc.base", 1, mix, 0, 0, &L->ffn_hc_base, 0, 0},
        {"ffn_hc.scale", 1, 3, 0, 0, &L->ffn_hc_scale, 0, 0},
        {"input_layernorm.weight", 1, D, 0, 0, &L->attn_norm, 0, 0},
        {"post_attention_layernorm.weight", 1, D, 0, 0, &L->ffn_norm, 0, 0},
        {"self_attn.q_a_proj.weight", 2, d->q_lora_rank, D, 0, &L->q_a, 0, 1},
        {"self_attn.q_a_norm.weight", 1, d->q_lora_rank, 0, 0, &L->q_a_norm, 0, 0},
        {"self_attn.q_b_proj.weight", 2, H * hd, d->q_lora_rank, 0, &L->q_b, 0, 1},
        {"self_attn.kv_proj.weight", 2, hd, D, 0, &L->kv, 0, 1},
        {"self_attn.kv_norm.weight", 1, hd, 0, 0, &L->kv_norm, 0, 0},
        {"self_attn.o_a_proj.weight", 2, (uint64_t)d->o_groups * d->o_lora_rank,
         H * hd / d->o_groups, 0, &L->o_a, 0, 1},
        {"self_attn.o_b_proj.weight", 2, D, (uint64_t)d->o_groups * d->o_lora_rank, 0, &L->o_b, 0,
         1},
        {"self_attn.sinks", 1, H, 0, 0, &L->sinks, 0, 0},
        {"self_attn.compressor.kv_proj.weight", 2, cw, D, 0, &L->c_kv, 1, 1},
        {"self_attn.compressor.gate_proj.weight", 2, cw, D, 0, &L->c_gate, 1, 1},
        {"self_attn.compressor.position_bias", 2, ratio, cw, 0, &L->c_bias, 1, 0},
        {"self_attn.compressor.kv_norm.weight", 1, hd, 0, 0, &L->c_norm, 1, 0},
        {"self_attn.compressor.indexer.kv_proj.weight", 2, 2 * di, D, 0, &L->i_kv, 2, 1},
        {"self_attn.compressor.indexer.gate_proj.weight", 2, 2 * di, D, 0, &L->i_gate, 2, 1},
        {"self_attn.compressor.indexer.position_bias", 2, d->ratio_csa, 2 * di, 0, &L->i_bias, 2,
         0},
        {"self_attn.compressor.indexer.kv_norm.weight", 1, di, 0, 0, &L->i_norm, 2, 0},
        {"self_attn.compressor.indexer.q_b_proj.weight", 2, (uint64_t)d->index_n_heads * di,
         d->q_lora_rank, 0, &L->i_qb, 2, 1},
        {"self_attn.compressor.indexer.scorer.weights_proj.weight", 2, d->index_n_heads, D, 0,
         &L->i_w, 2, 1},
        {"mlp.gate.weight", 2, E, D, 0, &L->router, 0, 0},
        {"mlp.gate.tid2eid", 2, c->n_vocab, d->n_expert_used, 0, &L->tid2eid, 3, 0},
        {"mlp.gate.e_score_correction_bias", 1, E, 0, 0, &L->router_bias, 4, 0},
        {"mlp.experts.gate_up_proj", 3, E, 2 * I, D, &L->gate_up, 0, 2},
        {"mlp.experts.down_proj", 3, E, D, I, &L->down, 0, 2},
        {"mlp.shared_experts.gate_proj.weight", 2, I, D, 0, &L->sh_gate, 0, 1},
        {"mlp.shared_experts.up_proj.weight", 2, I, D, 0, &L->sh_up, 0, 1},
        {"mlp.shared_experts.down_proj.weight", 2, D, I, 0, &L->sh_down, 0, 1},
    };
    for (size_t i = 0; rc == TM_OK && i < sizeof(spec) / sizeof(spec[0]); i++) {
        int when = spec[i].when;
        if ((when == 1 && attn == TM_DSV4_ATTN_SLIDING) || (when == 2 && !csa) ||
            (when == 3 && !d->hash[il]) || (when == 4 && d->hash[il]))
            continue;
        char name[160];
        snprintf(name, sizeof(name), "%s%s", prefix, spec[i].suffix);
        const uint64_t want[3] = {spec[i].d0, spec[i].d1, spec[i].d2};
        if (spec[i].lin)
            rc = tm_quant_bind(st, &c->quant, name,
                               spec[i].lin == 2 ? TM_QROLE_EXPERT : TM_QROLE_DENSE, spec[i].n_dim,
                               want, spec[i].t, err);
        else
            rc = bind(st, name, spec[i].n_dim, spec[i].d0, spec[i].d1, spec[i].d2, spec[i].t, err);
    }
    // Hash routing reads expert ids from tid2eid: they must be integers below
    // E.
    for (uint64_t i = 0; rc == TM_OK && d->hash[il] && i < (uint64_t)c->n_vocab * d->n_expert_used;
         i++) {
        float e = tm_tensor_get_f32(&L->tid2eid, (size_t)i);
        if (!(e >= 0.0f) || e >= (float)E || e != floorf(e))
            rc = TM_ERR(err, TM_E_PARSE, "layer %u: tid2eid[%llu] = %g is not an expert id", il,
                        (unsigned long long)i, (double)e);
    }
    return rc;
}

/* The MTP layer: found by its enorm under model.layers.<n_layer>. or mtp.0.; none is fine. */
static tm_rc bind_mtp(tm_model *m, const tm_st_set *st, tm_err *err) {
    tm_dsv4 *w = m->arch_w;
    const tm_model_cfg *c = &m->cfg;
    const uint64_t D = c->n_embd, N = w->cfg.hc_mult;
    char pre[64], name[160];
    snprintf(pre, sizeof(pre), "model.layers.%u.", c->n_layer);
    snprintf(name, sizeof(name), "%senorm.weight", pre);
    if (!tm_st_set_find(st, name)) {
        snprintf(pre, sizeof(pre), "mtp.0.");
        snprintf(name, sizeof(name), "%senorm.weight", pre);
        if (!tm_st_set_find(st, name))
            return TM_OK;
    }
    tm_dsv4_mtp *x = &w->mtp;
    tm_rc rc = bind_layer(st, c, &w->cfg, pre, c->n_layer, &w->layers[c->n_layer], err);
    const uint64_t dd[2] = {D, D};
    struct {
        const char *suffix, *alt;
        uint32_t n_dim;
        uint64_t d0, d1;
        tm_tensor *t;
        int lin;
    } spec[] = {
        {"enorm.weight", NULL, 1, D, 0, &x->enorm, 0},
        {"hnorm.weight", NULL, 1, D, 0, &x->hnorm, 0},
        {"e_proj.weight", NULL, 2, D, D, &x->e_proj, 1},
        {"h_proj.weight", NULL, 2, D, D, &x->h_proj, 1},
        {"norm.weight", "shared_head.norm.weight", 1, D, 0, &x->norm, 0},
        {"hc_head_fn", "hc_head.hc_fn", 2, N, N * D, &x->hc_head_fn, 0},
        {"hc_head_base", "hc_head.hc_base", 1, N, 0, &x->hc_head_base, 0},
        {"hc_head_scale", "hc_head.hc_scale", 1, 1, 0, &x->hc_head_scale, 0},
    };
    for (size_t i = 0; rc == TM_OK && i < sizeof(spec) / sizeof(spec[0]); i++) {
        snprintf(name, sizeof(name), "%s%s", pre, spec[i].suffix);
        if (spec[i].alt && !tm_st_set_find(st, name))
            snprintf(name, sizeof(name), "%s%s", pre, spec[i].alt);
        if (spec[i].lin)
            rc = tm_quant_bind(st, &c->quant, name, TM_QROLE_DENSE, 2, dd, spec[i].t, err);
        else
            rc = bind(st, name, spec[i].n_dim, spec[i].d0, spec[i].d1, 0, spec[i].t, err);
    }
    if (rc == TM_OK)
        w->n_mtp = 1;
    return rc;
}

tm_rc tm_dsv4_bind(tm_model *m, const struct tm_st_set *st, tm_err *err) {
    tm_dsv4 *w = m->arch_w;
    const tm_model_cfg *c = &m->cfg;
    const tm_dsv4_cfg *d = &w->cfg;
    w->layers = tm_calloc(c->n_layer + 1, sizeof(*w->layers)); // + the MTP layer's
    if (!w->layers)
        return TM_ERR(err, TM_E_NOMEM, "deepseek_v4 layers");
    const uint64_t D = c->n_embd, N = d->hc_mult;
    tm_rc rc = bind(st, "model.embed_tokens.weight", 2, c->n_vocab, D, 0, &m->embd, err);
    if (rc == TM_OK)
        rc = bind(st, "model.norm.weight", 1, D, 0, 0, &m->out_norm, err);
    if (rc == TM_OK)
        rc = bind(st, "model.hc_head.hc_fn", 2, N, N * D, 0, &w->hc_head_fn, err);
    if (rc == TM_OK)
        rc = bind(st, "model.hc_head.hc_base", 1, N, 0, 0, &w->hc_head_base, err);
    if (rc == TM_OK)
        rc = bind(st, "model.hc_head.hc_scale", 1, 1, 0, 0, &w->hc_head_scale, err);
    if (rc == TM_OK) {
        if (c->tie_embd)
            m->lm_head = m->embd;
        else
            rc = bind(st, "lm_head.weight", 2, c->n_vocab, D, 0, &m->lm_head, err);
    }
    for (uint32_t il = 0; rc == TM_OK && il < c->n_layer; il++) {
        char pre[64];
        snprintf(pre, sizeof(pre), "model.layers.%u.", il);
        rc = bind_layer(st, c, d, pre, il, &w->layers[il], err);
    }
    if (rc == TM_OK)
        rc = bind_mtp(m, st, err);
    return rc;
}

void tm_dsv4_destroy(tm_dsv4 *d) {
    if (!d)
        return;
    tm_free(d->layers);
    tm_free(d);
}

/* ---- the architecture (runner/model/arch.h) ---- */

static tm_rc arch_parse(void *root, void *gen, tm_model_cfg *c, void **arch_w, tm_err *err) {
    tm_dsv4 *d = NULL;
    tm_rc rc = tm_dsv4_config_parse(root, gen, c, &d, err);
    *arch_w = d;
    return rc;
}

static int arch_is_quantized(const tm_model *m) {
    const tm_dsv4 *d = tm_model_dsv4(m);
    if (!d)
        return 0;
    // tm_dsv4_layer is made of tm_tensor fields only
    const size_t n_t = sizeof(tm_dsv4_layer) / sizeof(tm_tensor);
    for (uint32_t l = 0; l < m->cfg.n_layer && d->layers; l++) {
        const tm_tensor *t = (const tm_tensor *)&d->layers[l];
        for (size_t i = 0; i < n_t; i++)
            if (t[i].quant != TM_QUANT_NONE)
                return 1;
    }
    return 0;
}

static int arch_has_drafter(const tm_model *m) {
    const tm_dsv4 *d = tm_model_dsv4(m);
    return d && d->n_mtp;
}

static void arch_destroy(void *arch_w) { tm_dsv4_destroy(arch_w); }

const tm_arch_ops tm_arch_dsv4 = {
    .name = "deepseek_v4",
    .hf_class = "DeepseekV4ForCausalLM",
    .title = "DeepSeek-V4",
    .llama_shape = 0,
    .no_fp8_at_load = "its FP8 format is 128x128 block-scaled with ue8m0 scales, not per channel; "
                      "use its FP8 checkpoint",
    .quant_experts = 1,
    .config_parse = arch_parse,
    .bind = tm_dsv4_bind,
    .is_quantized = arch_is_quantized,
    .has_drafter = arch_has_drafter,
    .destroy = arch_destroy,
};
