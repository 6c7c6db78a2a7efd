/* runner/model/model_llama.c - the Llama family's part of the model loader (runner/model/arch.h):
 * Llama, Qwen2 and Mistral share one config parser and one weight binder (tm_model_cfg and
 * tm_layer_w hold all of their weights) and differ only in small hooks: Qwen2's q/k/v bias and its
 * refused use_sliding_window, Mistral's sliding_window. Error codes and messages as in
 * runner/model/model.c ("config.json: <field> ..."; tensors by name). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "runner/model/arch.h"
#include "runner/model/safetensors.h"

#define CFG "config.json"

/* ---- config.json ------------------------------------------------------------------------------
 */

/* rope_scaling (transformers 4.x) or rope_parameters (5.x): default or llama3. */
static tm_rc parse_rope(json_t *root, tm_model_cfg *c, tm_err *err) {
    double theta = 0;
    tm_rc rc = tm_arch_cfg_num(root, CFG, "rope_theta", 0, 10000.0, &theta, err);
    if (rc)
        return rc;
    const char *key = "rope_scaling";
    json_t *rs = json_object_get(root, "rope_parameters");
    if (rs && !json_is_null(rs)) {
        key = "rope_parameters";
        if (json_is_object(rs) && json_object_get(rs, "rope_theta")) {
            rc = tm_arch_cfg_num(rs, CFG ": rope_parameters", "rope_theta", 1, 0, &theta, err);
            if (rc)
                return rc;
        }
    } else {
        rs = json_object_get(root, "rope_scaling");
    }
    if (!(theta > 0) || theta > 1e12)
        return TM_ERR(err, TM_E_PARSE, CFG ": rope_theta %g is out of range", theta);
    c->rope_theta = (float)theta;
    c->rope_type = TM_ROPE_DEFAULT;
    c->rope_factor = 1.0f;
    c->rope_low_freq_factor = 0.0f;
    c->rope_high_freq_factor = 0.0f;
    c->rope_orig_ctx = 0;
    if (!rs || json_is_null(rs))
        return TM_OK;
    if (!json_is_object(rs))
        return TM_ERR(err, TM_E_PARSE, CFG ": %s is not an object", key);
    json_t *jt = json_object_get(rs, "rope_type");
    if (!jt)
        jt = json_object_get(rs, "type");
    if (!json_is_string(jt))
        return TM_ERR(err, TM_E_PARSE, CFG ": %s has no rope_type string", key);
    const char *type = json_string_value(jt);
    if (!strcmp(type, "default"))
        return TM_OK;
    if (strcmp(type, "llama3"))
        return TM_ERR(err, TM_E_INVAL,
                      CFG ": %s type '%.40s' is not supported (default, llama3 are)", key, type);
    char where[64];
    snprintf(where, sizeof(where), CFG ": %s", key);
    double factor, lo, hi;
    uint32_t orig;
    rc = tm_arch_cfg_num(rs, where, "factor", 1, 0, &factor, err);
    if (rc == TM_OK)
        rc = tm_arch_cfg_num(rs, where, "low_freq_factor", 1, 0, &lo, err);
    if (rc == TM_OK)
        rc = tm_arch_cfg_num(rs, where, "high_freq_factor", 1, 0, &hi, err);
    if (rc == TM_OK)
        rc = tm_arch_cfg_u32(rs, where, "original_max_position_embeddings", 1, 0, 1, 1u << 24,
                             &orig, err);
    if (rc)
        return rc;
    if (!(factor >= 1.0) || factor > 1e6)
        return TM_ERR(err, TM_E_PARSE, CFG ": llama3 rope factor %g must be in [1, 1e6]", factor);
    if (!(lo > 0) || !(hi > lo))
        return TM_ERR(err, TM_E_PARSE,
                      CFG ": llama3 rope needs 0 < low_freq_factor (%g) < high_freq_factor (%g)",
                      lo, hi);
    c->rope_type = TM_ROPE_LLAMA3;
    c->rope_factor = (float)factor;
    c->rope_low_freq_factor = (float)lo;
    c->rope_high_freq_factor = (float)hi;
    c->rope_orig_ctx = orig;
    return TM_OK;
}

/* Append the ids in v (an integer, a list of them, or null) to c->eos_ids, skipping repeats. */
static tm_rc add_eos(tm_model_cfg *c, const char *file, json_t *v, tm_err *err) {
    if (!v || json_is_null(v))
        return TM_OK;
    size_t n = json_is_array(v) ? json_array_size(v) : 1;
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_is_array(v) ? json_array_get(v, i) : v;
        if (!json_is_integer(e))
            return TM_ERR(err, TM_E_PARSE, "%s: eos_token_id is not an integer or a list of them",
                          file);
        json_int_t id = json_integer_value(e);
        if (id < 0 || id >= (json_int_t)c->n_vocab)
            return TM_ERR(err, TM_E_PARSE, "%s: eos_token_id %lld is outside the vocabulary (%u)",
                          file, (long long)id, c->n_vocab);
        int seen = 0;
        for (uint32_t k = 0; k < c->n_eos; k++)
            seen |= c->eos_ids[k] == (int32_t)id;
        if (seen)
            continue;
        if (c->n_eos == TM_MODEL_MAX_EOS)
            return TM_ERR(err, TM_E_PARSE, "%s: more than %d distinct eos_token_id values", file,
                          TM_MODEL_MAX_EOS);
        c->eos_ids[c->n_eos++] = (int32_t)id;
    }
    return TM_OK;
}

static tm_rc get_bos(json_t *obj, const char *file, uint32_t n_vocab, int32_t *bos, tm_err *err) {
    json_t *v = json_object_get(obj, "bos_token_id");
    if (!v || json_is_null(v))
        return TM_OK;
    if (!json_is_integer(v))
        return TM_ERR(err, TM_E_PARSE, "%s: bos_token_id is not an integer", file);
    json_int_t id = json_integer_value(v);
    if (id < 0 || id >= (json_int_t)n_vocab)
        return TM_ERR(err, TM_E_PARSE, "%s: bos_token_id %lld is outside the vocabulary (%u)", file,
                      (long long)id, n_vocab);
    *bos = (int32_t)id;
    return TM_OK;
}

/* The config of the whole family. bias: attention_bias may be true (its q/k/v carry a bias);
 * window: the architecture's sliding-window fields, read at their place in the order of checks. */
typedef tm_rc (*window_fn)(json_t *root, tm_model_cfg *c, tm_err *err);

static tm_rc parse_family(json_t *root, json_t *gen, tm_model_cfg *c, int bias, window_fn window,
                          tm_err *err) {
    tm_rc rc = tm_arch_cfg_u32(root, CFG, "num_hidden_layers", 1, 0, 1, 4096, &c->n_layer, err);
    if (rc == TM_OK)
        rc = tm_arch_cfg_u32(root, CFG, "hidden_size", 1, 0, 1, 1u << 16, &c->n_embd, err);
    if (rc == TM_OK)
        rc = tm_arch_cfg_u32(root, CFG, "intermediate_size", 1, 0, 1, 1u << 20, &c->n_ff, err);
    if (rc == TM_OK)
        rc = tm_arch_cfg_u32(root, CFG, "num_attention_heads", 1, 0, 1, 1024, &c->n_head, err);
    if (rc == TM_OK)
        rc = tm_arch_cfg_u32(root, CFG, "num_key_value_heads", 0, c->n_head, 1, 1024, &c->n_kv_head,
                             err);
    if (rc == TM_OK)
        rc = tm_arch_cfg_u32(root, CFG, "vocab_size", 1, 0, 1, 1u << 24, &c->n_vocab, err);
    if (rc == TM_OK)
        rc = tm_arch_cfg_u32(root, CFG, "max_position_embeddings", 1, 0, 1, 1u << 24, &c->n_ctx,
                             err);
    if (rc)
        return rc;
    if (c->n_kv_head > c->n_head || c->n_head % c->n_kv_head != 0)
        return TM_ERR(err, TM_E_PARSE,
                      CFG ": num_attention_heads %u is not a multiple of num_key_value_heads %u",
                      c->n_head, c->n_kv_head);
    json_t *hd = json_object_get(root, "head_dim");
    if (!hd || json_is_null(hd)) {
        if (c->n_embd % c->n_head != 0)
            return TM_ERR(err, TM_E_PARSE,
                          CFG ": hidden_size %u is not divisible by num_attention_heads %u (and "
                              "no head_dim is given)",
                          c->n_embd, c->n_head);
        c->head_dim = c->n_embd / c->n_head;
    } else {
        rc = tm_arch_cfg_u32(root, CFG, "head_dim", 1, 0, 1, 1024, &c->head_dim, err);
        if (rc)
            return rc;
    }
    if (c->head_dim % 2 != 0 || c->head_dim > 1024)
        return TM_ERR(err, TM_E_PARSE, CFG ": head_dim %u must be even and at most 1024 (RoPE)",
                      c->head_dim);
    double eps = 0;
    rc = tm_arch_cfg_num(root, CFG, "rms_norm_eps", 0, 1e-6, &eps, err);
    if (rc)
        return rc;
    if (!(eps > 0) || eps >= 1)
        return TM_ERR(err, TM_E_PARSE, CFG ": rms_norm_eps %g must be in (0, 1)", eps);
    c->rms_eps = (float)eps;
    rc = parse_rope(root, c, err);
    if (rc)
        return rc;

    json_t *act = json_object_get(root, "hidden_act");
    if (act && !json_is_null(act) &&
        (!json_is_string(act) || strcmp(json_string_value(act), "silu")))
        return TM_ERR(err, TM_E_INVAL, CFG ": hidden_act must be \"silu\"");
    int flag = 0;
    rc = tm_arch_cfg_bool(root, CFG, "tie_word_embeddings", 0, &c->tie_embd, err);
    if (rc == TM_OK)
        rc = tm_arch_cfg_bool(root, CFG, "attention_bias", 0, &flag, err);
    if (rc)
        return rc;
    if (flag && !bias)
        return TM_ERR(err, TM_E_INVAL, CFG ": attention_bias true is not supported for %s",
                      tm_arch_ops_get(c->arch)->name);
    rc = tm_arch_cfg_bool(root, CFG, "mlp_bias", 0, &flag, err);
    if (rc)
        return rc;
    if (flag)
        return TM_ERR(err, TM_E_INVAL, CFG ": mlp_bias true is not supported");
    c->qkv_bias = bias;
    if (window) {
        rc = window(root, c, err);
        if (rc)
            return rc;
    }

    c->bos_id = -1;
    rc = get_bos(root, CFG, c->n_vocab, &c->bos_id, err);
    if (rc == TM_OK && c->bos_id < 0 && gen)
        rc = get_bos(gen, "generation_config.json", c->n_vocab, &c->bos_id, err);
    if (rc == TM_OK)
        rc = add_eos(c, CFG, json_object_get(root, "eos_token_id"), err);
    if (rc == TM_OK && gen)
        rc = add_eos(c, "generation_config.json", json_object_get(gen, "eos_token_id"), err);
    return rc;
}

/* ---- tensors --------------------------------------------------------------------------------- */

static void shape_str(char *out, size_t cap, uint32_t n_dim, const uint64_t *shape) {
    size_t at = 0;
    at += (size_t)snprintf(out + at, cap - at, "[");
    for (uint32_t d = 0; d < n_dim && at < cap; d++)
        at += (size_t)snprintf(out + at, cap - at, "%s%llu", d ? ", " : "",
                               (unsigned long long)shape[d]);
    if (at < cap)
        snprintf(out + at, cap - at, "]");
}

/* Bind name (must exist, with shape [d0] or [d0][d1]) to *t. */
static tm_rc bind(const tm_st_set *st, const char *name, uint32_t n_dim, uint64_t d0, uint64_t d1,
                  tm_tensor *t, tm_err *err) {
    const tm_st_tensor *s = tm_st_set_find(st, name);
    if (!s)
        return TM_ERR(err, TM_E_PARSE, "tensor '%s' is missing", name);
    uint64_t want[2] = {d0, d1};
    int ok = s->n_dim == n_dim;
    for (uint32_t d = 0; ok && d < n_dim; d++)
        ok = s->shape[d] == want[d];
    if (!ok) {
        char got_s[160], want_s[64];
        shape_str(got_s, sizeof(got_s), s->n_dim, s->shape);
        shape_str(want_s, sizeof(want_s), n_dim, want);
        return TM_ERR(err, TM_E_PARSE, "%s: tensor '%s' has shape %s, expected %s", s->file, name,
                      got_s, want_s);
    }
    if (s->dtype != TM_DTYPE_F32 && s->dtype != TM_DTYPE_F16 && s->dtype != TM_DTYPE_BF16)
        return TM_ERR(err, TM_E_PARSE, "%s: tensor '%s' has dtype %s, expected F32, F16 or BF16",
                      s->file, name, tm_dtype_name(s->dtype));
    memset(t, 0, sizeof(*t));
    t->data = s->data;
    t->dtype = s->dtype;
    t->n_dim = n_dim;
    t->shape[0] = d0;
    t->shape[1] = n_dim > 1 ? d1 : 0;
    return TM_OK;
}

static tm_rc bind_layer(const tm_st_set *st, const tm_model_cfg *c, uint32_t il, tm_layer_w *w,
                        tm_err *err) {
    const uint64_t e = c->n_embd, q = (uint64_t)c->n_head * c->head_dim,
                   kv = (uint64_t)c->n_kv_head * c->head_dim, ff = c->n_ff;
    struct {
        const char *suffix;
        uint32_t n_dim;
        uint64_t d0, d1;
        tm_tensor *t;
        int linear; /* may be quantized */
    } spec[] = {
        {"input_layernorm.weight", 1, e, 0, &w->attn_norm, 0},
        {"self_attn.q_proj.weight", 2, q, e, &w->wq, 1},
        {"self_attn.k_proj.weight", 2, kv, e, &w->wk, 1},
        {"self_attn.v_proj.weight", 2, kv, e, &w->wv, 1},
        {"self_attn.o_proj.weight", 2, e, q, &w->wo, 1},
        {"post_attention_layernorm.weight", 1, e, 0, &w->ffn_norm, 0},
        {"mlp.gate_proj.weight", 2, ff, e, &w->w_gate, 1},
        {"mlp.up_proj.weight", 2, ff, e, &w->w_up, 1},
        {"mlp.down_proj.weight", 2, e, ff, &w->w_down, 1},
        {"self_attn.q_proj.bias", 1, q, 0, &w->bq, 0},
        {"self_attn.k_proj.bias", 1, kv, 0, &w->bk, 0},
        {"self_attn.v_proj.bias", 1, kv, 0, &w->bv, 0},
    };
    size_t n_spec = sizeof(spec) / sizeof(spec[0]) - (c->qkv_bias ? 0 : 3);
    for (size_t i = 0; i < n_spec; i++) {
        char name[128];
        snprintf(name, sizeof(name), "model.layers.%u.%s", il, spec[i].suffix);
        const uint64_t want[2] = {spec[i].d0, spec[i].d1};
        tm_rc rc = spec[i].linear
                       ? tm_quant_bind(st, &c->quant, name, TM_QROLE_DENSE, 2, want, spec[i].t, err)
                       : bind(st, name, spec[i].n_dim, spec[i].d0, spec[i].d1, spec[i].t, err);
        if (rc)
            return rc;
    }
    return TM_OK;
}

/* A tensor "model.layers.<i>...." with i >= n_layer means config and weights disagree. */
static tm_rc check_layer_names(const tm_st_set *st, uint32_t n_layer, tm_err *err) {
    static const char prefix[] = "model.layers.";
    for (size_t i = 0; i < tm_st_set_n_tensor(st); i++) {
        const tm_st_tensor *t = tm_st_set_tensor(st, i);
        if (strncmp(t->name, prefix, sizeof(prefix) - 1))
            continue;
        const char *p = t->name + sizeof(prefix) - 1;
        unsigned long long il = 0;
        int digits = 0;
        while (*p >= '0' && *p <= '9' && digits < 10) {
            il = il * 10 + (unsigned long long)(*p++ - '0');
            digits++;
        }
        if (digits > 0 && il >= n_layer)
            return TM_ERR(err, TM_E_PARSE,
                          "%s: tensor '%.100s' is for layer %llu but num_hidden_layers is %u",
                          t->file, t->name, il, n_layer);
    }
    return TM_OK;
}

static tm_rc bind_all(tm_model *m, const tm_st_set *st, tm_err *err) {
    const tm_model_cfg *c = &m->cfg;
    tm_rc rc = check_layer_names(st, c->n_layer, err);
    if (rc == TM_OK)
        rc = bind(st, "model.embed_tokens.weight", 2, c->n_vocab, c->n_embd, &m->embd, err);
    if (rc == TM_OK)
        rc = bind(st, "model.norm.weight", 1, c->n_embd, 0, &m->out_norm, err);
    if (rc)
        return rc;
    if (c->tie_embd) {
        m->lm_head = m->embd;
    } else {
        if (!tm_st_set_find(st, "lm_head.weight"))
            return TM_ERR(err, TM_E_PARSE,
                          "tensor 'lm_head.weight' is missing and tie_word_embeddings is false");
        rc = bind(st, "lm_head.weight", 2, c->n_vocab, c->n_embd, &m->lm_head, err);
        if (rc)
            return rc;
    }
    for (uint32_t il = 0; il < c->n_layer; il++) {
        rc = bind_layer(st, c, il, &m->layers[il], err);
        if (rc)
            return rc;
    }
    return TM_OK;
}

/* ---- the architectures ----------------------------------------------------------------------- */

// Sliding-window attention: Mistral v0.1 sets sliding_window; Qwen2 only when
// use_sliding_window is true, and then only for some layers, which we do not implement.
static tm_rc qwen2_window(json_t *root, tm_model_cfg *c, tm_err *err) {
    (void)c;
    int flag = 0;
    tm_rc rc = tm_arch_cfg_bool(root, CFG, "use_sliding_window", 0, &flag, err);
    if (rc)
        return rc;
    if (flag)
        return TM_ERR(err, TM_E_INVAL, CFG ": use_sliding_window true is not supported");
    return TM_OK;
}

static tm_rc mistral_window(json_t *root, tm_model_cfg *c, tm_err *err) {
    tm_rc rc = tm_arch_cfg_u32(root, CFG, "sliding_window", 0, 0, 0, UINT32_MAX, &c->sliding_window,
                               err);
    if (rc)
        return rc;
    if (c->sliding_window >= c->n_ctx)
        c->sliding_window = 0; // never reached: plain attention
    return TM_OK;
}

static tm_rc llama_parse(void *root, void *gen, tm_model_cfg *c, void **arch_w, tm_err *err) {
    *arch_w = NULL;
    return parse_family(root, gen, c, 0, NULL, err);
}

static tm_rc qwen2_parse(void *root, void *gen, tm_model_cfg *c, void **arch_w, tm_err *err) {
    *arch_w = NULL;
    return parse_family(root, gen, c, 1, qwen2_window, err);
}

static tm_rc mistral_parse(void *root, void *gen, tm_model_cfg *c, void **arch_w, tm_err *err) {
    *arch_w = NULL;
    return parse_family(root, gen, c, 0, mistral_window, err);
}

static int family_is_quantized(const tm_model *m) {
    for (uint32_t l = 0; l < m->cfg.n_layer && m->layers; l++) {
        const tm_layer_w *L = &m->layers[l];
        const tm_tensor *lin[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (size_t i = 0; i < sizeof(lin) / sizeof(lin[0]); i++)
            if (lin[i]->quant != TM_QUANT_NONE)
                return 1;
    }
    return 0;
}

static void family_destroy(void *arch_w) { (void)arch_w; }

#define FAMILY_OPS(cls, nm, ttl, parse)                                                            \
    {                                                                                              \
        .name = nm, .hf_class = cls, .title = ttl, .llama_shape = 1, .config_parse = parse,        \
        .bind = bind_all, .is_quantized = family_is_quantized, .destroy = family_destroy,          \
    }

const tm_arch_ops tm_arch_llama = FAMILY_OPS("LlamaForCausalLM", "llama", "Llama", llama_parse);
const tm_arch_ops tm_arch_qwen2 = FAMILY_OPS("Qwen2ForCausalLM", "qwen2", "Qwen2", qwen2_parse);
const tm_arch_ops tm_arch_mistral = FAMILY_OPS("MistralForCausalLM", "mistral", "Mistral",
                                               mistral_parse);
