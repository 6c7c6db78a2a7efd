/* runner/model/dsv41_dspark.c - config and weights of the DeepSeek-V4.1 DSpark stages (mtp.*):
 * the reference's DSparkBlock.__init__ (declared in model_dsv41.h, "DSpark stages"). */
#include "runner/model/model_dsv41.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "runner/model/quant.h"
#include "runner/model/safetensors.h"

#define CFG "config.json"

tm_rc tm_dsv41_dspark_cfg(void *root_v, tm_dsv41_cfg *d, tm_err *err) {
    json_t *root = root_v;
    json_t *v = json_object_get(root, "dspark_target_layer_ids");
    d->n_dspark_target = 0;
    if (v && !json_is_null(v)) {
        if (!json_is_array(v))
            return TM_ERR(err, TM_E_PARSE, CFG ": dspark_target_layer_ids is not a list");
        if (json_array_size(v) > TM_DSV41_MAX_LAYER)
            return TM_ERR(err, TM_E_INVAL, CFG ": dspark_target_layer_ids has %zu entries",
                          json_array_size(v));
        for (size_t i = 0; i < json_array_size(v); i++) {
            json_t *e = json_array_get(v, i);
            if (!json_is_integer(e) || json_integer_value(e) < 0 ||
                json_integer_value(e) >= (json_int_t)d->n_layers)
                return TM_ERR(err, TM_E_PARSE,
                              CFG ": dspark_target_layer_ids[%zu] is not a layer id below "
                                  "n_layers %u",
                              i, d->n_layers);
            const uint32_t id = (uint32_t)json_integer_value(e);
            if (i && id <= d->dspark_target_layer_ids[i - 1])
                return TM_ERR(err, TM_E_INVAL,
                              CFG ": dspark_target_layer_ids must be increasing (entry %zu)", i);
            d->dspark_target_layer_ids[d->n_dspark_target++] = id;
        }
    }
    if (!d->dspark_block_size)
        return TM_OK;
    if (!d->n_mtp_layers)
        return TM_ERR(err, TM_E_INVAL,
                      CFG ": dspark_block_size %u needs n_mtp_layers >= 1 (the DSpark stages)",
                      d->dspark_block_size);
    if (!d->n_dspark_target)
        return TM_ERR(err, TM_E_INVAL,
                      CFG ": dspark_target_layer_ids is empty but dspark_block_size is %u",
                      d->dspark_block_size);
    if (!d->dspark_markov_rank)
        return TM_ERR(err, TM_E_INVAL, CFG ": dspark_markov_rank must be >= 1 with DSpark stages");
    if (d->n_layers + d->n_mtp_layers > TM_DSV41_MAX_LAYER)
        return TM_ERR(err, TM_E_INVAL, CFG ": n_layers + n_mtp_layers exceeds %u",
                      TM_DSV41_MAX_LAYER);
    if ((d->dim * d->n_dspark_target) % 32 || d->dim % 32)
        return TM_ERR(err, TM_E_INVAL,
                      CFG ": dim * len(dspark_target_layer_ids) must be a multiple of 32");
    json_t *cr = json_object_get(root, "compress_ratios");
    for (uint32_t k = 0; k < d->n_mtp_layers; k++) {
        json_t *e = json_is_array(cr) ? json_array_get(cr, d->n_layers + k) : NULL;
        if (e && (!json_is_integer(e) || json_integer_value(e) != 0))
            return TM_ERR(err, TM_E_INVAL,
                          CFG ": compress_ratios[%u] (DSpark stage %u) must be 0: the reference's "
                              "DSparkAttention has no compressor",
                          d->n_layers + k, k);
    }
    const uint32_t E = d->dspark_n_routed_experts ? d->dspark_n_routed_experts
                                                  : d->n_routed_experts;
    const uint32_t K = d->dspark_n_activated_experts ? d->dspark_n_activated_experts
                                                     : d->n_activated_experts;
    if (K > E)
        return TM_ERR(err, TM_E_INVAL,
                      CFG ": dspark_n_activated_experts %u exceeds the stages' %u experts", K, E);
    if (d->dspark_noise_token_id >= d->vocab_size)
        return TM_ERR(err, TM_E_INVAL, CFG ": dspark_noise_token_id %u is not below vocab_size %u",
                      d->dspark_noise_token_id, d->vocab_size);
    return TM_OK;
}

static tm_rc bind_f(const tm_st_set *st, const char *name, uint32_t n_dim, uint64_t d0, uint64_t d1,
                    tm_tensor *t, tm_err *err) {
    const uint64_t want[2] = {d0, d1};
    const tm_quant_cfg none = {0};
    return tm_quant_bind(st, &none, name, TM_QROLE_DENSE, n_dim, want, t, err);
}

/* A Linear [out][in] as the backbone's: FP8 32x32 ue8m0 blocks with dtype fp8 (experts: as
 * expert_dtype says; wo_a: FP8 or float), else float. */
static tm_rc bind_lin(const tm_st_set *st, const tm_dsv41_cfg *d, const char *name, uint64_t out,
                      uint64_t in, int kind, tm_tensor *t, tm_err *err) {
    tm_quant_cfg q = {0};
    q.method = TM_QMETHOD_DSREF;
    q.scale_dtype = TM_DTYPE_F8_E8M0;
    q.weight = d->fp8 || kind == 2 ? TM_QUANT_FP8_BLOCK : TM_QUANT_NONE;
    q.block[0] = q.block[1] = 32;
    q.expert = kind == 1 && d->expert_fp4 ? TM_QUANT_MXFP4 : q.weight;
    const uint64_t want[2] = {out, in};
    tm_rc rc = tm_quant_bind(st, &q, name, kind == 1 ? TM_QROLE_EXPERT : TM_QROLE_DENSE, 2, want, t,
                             err);
    if (rc || kind == 2)
        return rc;
    const tm_quant need = kind == 1 ? (tm_quant)q.expert : (tm_quant)q.weight;
    if ((tm_quant)t->quant != need)
        return TM_ERR(err, TM_E_PARSE, "tensor '%s' is %s but the config says %s", name,
                      t->quant ? tm_quant_name((tm_quant)t->quant) : tm_dtype_name(t->dtype),
                      need ? tm_quant_name(need) : "float");
    return TM_OK;
}

static tm_rc bind_stage(const tm_st_set *st, const tm_dsv41_cfg *d, uint32_t k, uint32_t E,
                        tm_dsv41_layer *Lw, tm_err *err) {
    const uint64_t D = d->dim, N = d->hc_mult, hd = d->head_dim, H = d->n_heads, mix = (2 + N) * N,
                   I = d->moe_inter_dim, G = d->o_groups;
    char name[192];
    tm_rc rc = TM_OK;
#define F(t, n_dim, d0, d1, sfx)                                                                   \
    do {                                                                                           \
        if (rc == TM_OK) {                                                                         \
            snprintf(name, sizeof(name), "mtp.%u.%s", k, sfx);                                     \
            rc = bind_f(st, name, n_dim, d0, d1, t, err);                                          \
        }                                                                                          \
    } while (0)
#define LIN(t, o, i, kind, ...)                                                                    \
    do {                                                                                           \
        if (rc == TM_OK) {                                                                         \
            snprintf(name, sizeof(name), __VA_ARGS__);                                             \
            rc = bind_lin(st, d, name, o, i, kind, t, err);                                        \
        }                                                                                          \
    } while (0)
    F(&Lw->hc_attn_fn, 2, mix, N * D, "hc_attn_fn");
    F(&Lw->hc_attn_base, 1, mix, 0, "hc_attn_base");
    F(&Lw->hc_attn_scale, 1, 3, 0, "hc_attn_scale");
    F(&Lw->hc_ffn_fn, 2, mix, N * D, "hc_ffn_fn");
    F(&Lw->hc_ffn_base, 1, mix, 0, "hc_ffn_base");
    F(&Lw->hc_ffn_scale, 1, 3, 0, "hc_ffn_scale");
    F(&Lw->attn_norm, 1, D, 0, "attn_norm.weight");
    F(&Lw->ffn_norm, 1, D, 0, "ffn_norm.weight");
    F(&Lw->attn_sink, 1, H, 0, "attn.attn_sink");
    LIN(&Lw->wq_a, d->q_lora_rank, D, 0, "mtp.%u.attn.wq_a.weight", k);
    F(&Lw->q_norm, 1, d->q_lora_rank, 0, "attn.q_norm.weight");
    LIN(&Lw->wq_b, H * hd, d->q_lora_rank, 0, "mtp.%u.attn.wq_b.weight", k);
    LIN(&Lw->wkv, hd, D, 0, "mtp.%u.attn.wkv.weight", k);
    F(&Lw->kv_norm, 1, hd, 0, "attn.kv_norm.weight");
    LIN(&Lw->wo_a, G * d->o_lora_rank, H * hd / G, 2, "mtp.%u.attn.wo_a.weight", k);
    LIN(&Lw->wo_b, D, G * d->o_lora_rank, 0, "mtp.%u.attn.wo_b.weight", k);
    F(&Lw->gate_w, 2, E, D, "ffn.gate.weight");
    F(&Lw->gate_bias, 1, E, 0, "ffn.gate.bias");
    if (rc == TM_OK) {
        Lw->experts = tm_calloc(E * 3, sizeof(tm_tensor));
        if (!Lw->experts)
            rc = TM_ERR(err, TM_E_NOMEM, "deepseek_v41 DSpark stage %u experts", k);
    }
    for (uint64_t e = 0; rc == TM_OK && e < E; e++) {
        LIN(&Lw->experts[e * 3 + 0], I, D, 1, "mtp.%u.ffn.experts.%llu.w1.weight", k,
            (unsigned long long)e);
        LIN(&Lw->experts[e * 3 + 1], I, D, 1, "mtp.%u.ffn.experts.%llu.w3.weight", k,
            (unsigned long long)e);
        LIN(&Lw->experts[e * 3 + 2], D, I, 1, "mtp.%u.ffn.experts.%llu.w2.weight", k,
            (unsigned long long)e);
    }
    LIN(&Lw->sh_w1, I, D, 0, "mtp.%u.ffn.shared_experts.w1.weight", k);
    LIN(&Lw->sh_w3, I, D, 0, "mtp.%u.ffn.shared_experts.w3.weight", k);
    LIN(&Lw->sh_w2, D, I, 0, "mtp.%u.ffn.shared_experts.w2.weight", k);
#undef F
#undef LIN
    return rc;
}

tm_rc tm_dsv41_dspark_bind(const tm_st_set *st, const tm_dsv41_cfg *d, tm_dsv41_dspark **out,
                           tm_err *err) {
    *out = NULL;
    tm_dsv41_dspark *p = tm_calloc(1, sizeof(*p));
    if (!p)
        return TM_ERR(err, TM_E_NOMEM, "deepseek_v41 DSpark stages");
    p->n_stage = d->n_mtp_layers;
    p->block_size = d->dspark_block_size;
    p->n_target = d->n_dspark_target;
    p->rank = d->dspark_markov_rank;
    p->n_experts = d->dspark_n_routed_experts ? d->dspark_n_routed_experts : d->n_routed_experts;
    p->n_active = d->dspark_n_activated_experts ? d->dspark_n_activated_experts
                                                : d->n_activated_experts;
    p->noise_id = d->dspark_noise_token_id;
    p->stages = tm_calloc(p->n_stage, sizeof(*p->stages));
    tm_rc rc = p->stages ? TM_OK : TM_ERR(err, TM_E_NOMEM, "deepseek_v41 DSpark stages");
    for (uint32_t k = 0; rc == TM_OK && k < p->n_stage; k++)
        rc = bind_stage(st, d, k, p->n_experts, &p->stages[k], err);
    const uint64_t D = d->dim, V = d->vocab_size, R = p->rank;
    char name[96];
    if (rc == TM_OK)
        rc = bind_lin(st, d, "mtp.0.main_proj.weight", D, D * p->n_target, 0, &p->main_proj, err);
    if (rc == TM_OK)
        rc = bind_f(st, "mtp.0.main_norm.weight", 1, D, 0, &p->main_norm, err);
    const uint32_t last = p->n_stage - 1;
#define LAST(t, n_dim, d0, d1, sfx)                                                                \
    do {                                                                                           \
        if (rc == TM_OK) {                                                                         \
            snprintf(name, sizeof(name), "mtp.%u.%s", last, sfx);                                  \
            rc = bind_f(st, name, n_dim, d0, d1, t, err);                                          \
        }                                                                                          \
    } while (0)
    LAST(&p->norm, 1, D, 0, "norm.weight");
    LAST(&p->markov_embed, 2, V, R, "markov_head.embed.weight");
    LAST(&p->markov_head, 2, V, R, "markov_head.head.weight");
    LAST(&p->conf_proj, 2, 1, D + R, "confidence_head.proj.weight");
#undef LAST
    if (rc) {
        tm_dsv41_dspark_destroy(p);
        return rc;
    }
    *out = p;
    return TM_OK;
}

void tm_dsv41_dspark_destroy(tm_dsv41_dspark *p) {
    if (!p)
        return;
    for (uint32_t k = 0; p->stages && k < p->n_stage; k++)
        tm_free(p->stages[k].experts);
    tm_free(p->stages);
    tm_free(p);
}
