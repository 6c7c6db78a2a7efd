/* runner/model/model.c - load a Llama-family Hugging Face model folder: config.json (+
 * generation_config.json) into tm_model_cfg, and the safetensors weights
 * (runner/model/safetensors.h) bound to tm_tensor views whose shapes are checked against the
 * config. Also the RoPE inverse frequency table both engines use (tm_model_rope_inv_freq).
 *
 * Error codes: TM_E_PARSE for malformed or inconsistent files (bad JSON, a missing field, a
 * value out of range, a tensor with the wrong shape), TM_E_INVAL for well-formed configs that ask
 * for something we do not implement (another architecture, a rope type other than default and
 * llama3, attention_bias on Llama), TM_E_IO when a file cannot be read, TM_E_NOMEM. Every
 * message is prefixed with "loading model <dir>". The model never writes to the mappings. */
#include "runner/model/model.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/fsutil.h"
#include "runner/model/model_dsv4.h"
#include "runner/model/safetensors.h"

/* ---- config.json ------------------------------------------------------------------------------
 */

#define CFG "config.json"

static tm_rc load_json(const char *dir, const char *name, int optional, json_t **out, tm_err *err) {
    char path[4096];
    int n = snprintf(path, sizeof(path), "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= sizeof(path))
        return TM_ERR(err, TM_E_INVAL, "model folder path too long");
    *out = NULL;
    struct stat st;
    if (stat(path, &st) != 0) {
        if (errno == ENOENT && optional)
            return TM_OK;
        return TM_ERR(err, TM_E_IO, "%s: %s", name, strerror(errno));
    }
    int fd = -1; // never blocks on a FIFO; only a regular file is read (issue 35)
    tm_rc rc = tm_fs_open_in(path, "model folder", &fd, NULL, err);
    if (rc)
        return rc;
    json_error_t je;
    json_t *root = json_loadfd(fd, JSON_REJECT_DUPLICATES, &je);
    close(fd);
    if (!root) {
        if (json_error_code(&je) == json_error_out_of_memory)
            return TM_ERR(err, TM_E_NOMEM, "%s: out of memory", name);
        if (json_error_code(&je) == json_error_cannot_open_file)
            return TM_ERR(err, TM_E_IO, "%s: %s", name, je.text);
        return TM_ERR(err, TM_E_PARSE, "%s: not valid JSON: %s (line %d, column %d)", name, je.text,
                      je.line, je.column);
    }
    if (!json_is_object(root)) {
        json_decref(root);
        return TM_ERR(err, TM_E_PARSE, "%s: not a JSON object", name);
    }
    *out = root;
    return TM_OK;
}

/* Integer field in [lo, hi]. Missing or null: *out = def if !required. */
static tm_rc get_u32(json_t *obj, const char *file, const char *key, int required, uint32_t def,
                     uint32_t lo, uint32_t hi, uint32_t *out, tm_err *err) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        if (required)
            return TM_ERR(err, TM_E_PARSE, "%s: missing %s", file, key);
        *out = def;
        return TM_OK;
    }
    if (!json_is_integer(v))
        return TM_ERR(err, TM_E_PARSE, "%s: %s is not an integer", file, key);
    json_int_t x = json_integer_value(v);
    if (x < (json_int_t)lo || x > (json_int_t)hi)
        return TM_ERR(err, TM_E_PARSE, "%s: %s = %lld is out of range [%u, %u]", file, key,
                      (long long)x, lo, hi);
    *out = (uint32_t)x;
    return TM_OK;
}

/* Number field (integer or real), finite; missing or null: def if !required. */
static tm_rc get_num(json_t *obj, const char *file, const char *key, int required, double def,
                     double *out, tm_err *err) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        if (required)
            return TM_ERR(err, TM_E_PARSE, "%s: missing %s", file, key);
        *out = def;
        return TM_OK;
    }
    if (!json_is_number(v))
        return TM_ERR(err, TM_E_PARSE, "%s: %s is not a number", file, key);
    double x = json_number_value(v);
    if (!isfinite(x))
        return TM_ERR(err, TM_E_PARSE, "%s: %s is not finite", file, key);
    *out = x;
    return TM_OK;
}

static tm_rc get_bool(json_t *obj, const char *file, const char *key, int def, int *out,
                      tm_err *err) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return TM_OK;
    }
    if (!json_is_boolean(v))
        return TM_ERR(err, TM_E_PARSE, "%s: %s is not a boolean", file, key);
    *out = json_is_true(v);
    return TM_OK;
}

static tm_rc parse_arch(json_t *root, tm_arch *arch, tm_err *err) {
    static const struct {
        const char *cls, *type;
        tm_arch arch;
    } known[] = {{"LlamaForCausalLM", "llama", TM_ARCH_LLAMA},
                 {"Qwen2ForCausalLM", "qwen2", TM_ARCH_QWEN2},
                 {"MistralForCausalLM", "mistral", TM_ARCH_MISTRAL},
                 {"DeepseekV4ForCausalLM", "deepseek_v4", TM_ARCH_DEEPSEEK_V4}};
    json_t *archs = json_object_get(root, "architectures");
    if (archs && !json_is_null(archs)) {
        json_t *a0 = json_is_array(archs) ? json_array_get(archs, 0) : NULL;
        if (!json_is_string(a0))
            return TM_ERR(err, TM_E_PARSE, CFG ": architectures is not an array of strings");
        const char *s = json_string_value(a0);
        for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++)
            if (!strcmp(s, known[i].cls)) {
                *arch = known[i].arch;
                return TM_OK;
            }
        return TM_ERR(err, TM_E_INVAL,
                      CFG ": architecture '%.80s' is not supported (LlamaForCausalLM, "
                          "Qwen2ForCausalLM, MistralForCausalLM are)",
                      s);
    }
    json_t *mt = json_object_get(root, "model_type");
    if (!json_is_string(mt))
        return TM_ERR(err, TM_E_PARSE, CFG ": neither architectures nor model_type is given");
    const char *s = json_string_value(mt);
    for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++)
        if (!strcmp(s, known[i].type)) {
            *arch = known[i].arch;
            return TM_OK;
        }
    return TM_ERR(err, TM_E_INVAL,
                  CFG ": model_type '%.80s' is not supported (llama, qwen2, mistral are)", s);
}

/* rope_scaling (transformers 4.x) or rope_parameters (5.x): default or llama3. */
static tm_rc parse_rope(json_t *root, tm_model_cfg *c, tm_err *err) {
    double theta = 0;
    tm_rc rc = get_num(root, CFG, "rope_theta", 0, 10000.0, &theta, err);
    if (rc)
        return rc;
    const char *key = "rope_scaling";
    json_t *rs = json_object_get(root, "rope_parameters");
    if (rs && !json_is_null(rs)) {
        key = "rope_parameters";
        if (json_is_object(rs) && json_object_get(rs, "rope_theta")) {
            rc = get_num(rs, CFG ": rope_parameters", "rope_theta", 1, 0, &theta, err);
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
    rc = get_num(rs, where, "factor", 1, 0, &factor, err);
    if (rc == TM_OK)
        rc = get_num(rs, where, "low_freq_factor", 1, 0, &lo, err);
    if (rc == TM_OK)
        rc = get_num(rs, where, "high_freq_factor", 1, 0, &hi, err);
    if (rc == TM_OK)
        rc = get_u32(rs, where, "original_max_position_embeddings", 1, 0, 1, 1u << 24, &orig, err);
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

static tm_rc parse_config(json_t *root, json_t *gen, tm_model_cfg *c, tm_err *err) {
    memset(c, 0, sizeof(*c));
    tm_rc rc = parse_arch(root, &c->arch, err);
    if (rc || c->arch == TM_ARCH_DEEPSEEK_V4)
        return rc; // runner/model/model_dsv4.c parses the rest
    rc = get_u32(root, CFG, "num_hidden_layers", 1, 0, 1, 4096, &c->n_layer, err);
    if (rc == TM_OK)
        rc = get_u32(root, CFG, "hidden_size", 1, 0, 1, 1u << 16, &c->n_embd, err);
    if (rc == TM_OK)
        rc = get_u32(root, CFG, "intermediate_size", 1, 0, 1, 1u << 20, &c->n_ff, err);
    if (rc == TM_OK)
        rc = get_u32(root, CFG, "num_attention_heads", 1, 0, 1, 1024, &c->n_head, err);
    if (rc == TM_OK)
        rc = get_u32(root, CFG, "num_key_value_heads", 0, c->n_head, 1, 1024, &c->n_kv_head, err);
    if (rc == TM_OK)
        rc = get_u32(root, CFG, "vocab_size", 1, 0, 1, 1u << 24, &c->n_vocab, err);
    if (rc == TM_OK)
        rc = get_u32(root, CFG, "max_position_embeddings", 1, 0, 1, 1u << 24, &c->n_ctx, err);
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
        rc = get_u32(root, CFG, "head_dim", 1, 0, 1, 1024, &c->head_dim, err);
        if (rc)
            return rc;
    }
    if (c->head_dim % 2 != 0 || c->head_dim > 1024)
        return TM_ERR(err, TM_E_PARSE, CFG ": head_dim %u must be even and at most 1024 (RoPE)",
                      c->head_dim);
    double eps = 0;
    rc = get_num(root, CFG, "rms_norm_eps", 0, 1e-6, &eps, err);
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
    rc = get_bool(root, CFG, "tie_word_embeddings", 0, &c->tie_embd, err);
    if (rc == TM_OK)
        rc = get_bool(root, CFG, "attention_bias", 0, &flag, err);
    if (rc)
        return rc;
    if (flag && c->arch != TM_ARCH_QWEN2)
        return TM_ERR(err, TM_E_INVAL, CFG ": attention_bias true is not supported for %s",
                      c->arch == TM_ARCH_LLAMA ? "llama" : "mistral");
    rc = get_bool(root, CFG, "mlp_bias", 0, &flag, err);
    if (rc)
        return rc;
    if (flag)
        return TM_ERR(err, TM_E_INVAL, CFG ": mlp_bias true is not supported");
    c->qkv_bias = c->arch == TM_ARCH_QWEN2;

    // Sliding-window attention: Mistral v0.1 sets sliding_window; Qwen2 only when
    // use_sliding_window is true, and then only for some layers, which we do not implement.
    if (c->arch == TM_ARCH_QWEN2) {
        rc = get_bool(root, CFG, "use_sliding_window", 0, &flag, err);
        if (rc)
            return rc;
        if (flag)
            return TM_ERR(err, TM_E_INVAL, CFG ": use_sliding_window true is not supported");
    } else if (c->arch == TM_ARCH_MISTRAL) {
        rc = get_u32(root, CFG, "sliding_window", 0, 0, 0, UINT32_MAX, &c->sliding_window, err);
        if (rc)
            return rc;
        if (c->sliding_window >= c->n_ctx)
            c->sliding_window = 0; // never reached: plain attention
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

/* ---- load ------------------------------------------------------------------------------------ */

tm_rc tm_model_cfg_load(const char *dir, tm_model_cfg *cfg, tm_err *err) {
    json_t *root = NULL, *gen = NULL;
    tm_rc rc = load_json(dir, "config.json", 0, &root, err);
    if (rc == TM_OK)
        rc = load_json(dir, "generation_config.json", 1, &gen, err);
    if (rc == TM_OK)
        rc = parse_config(root, gen, cfg, err);
    if (rc == TM_OK && cfg->arch == TM_ARCH_DEEPSEEK_V4)
        rc = TM_ERR(err, TM_E_INVAL, "%s: a DeepSeek-V4 config has no Llama-family shape", dir);
    if (rc == TM_OK)
        rc = tm_quant_cfg_parse(root, 0, &cfg->quant, err);
    json_decref(root);
    json_decref(gen);
    return rc;
}

tm_rc tm_model_load(const char *dir, tm_model **out, tm_err *err) {
    json_t *root = NULL, *gen = NULL;
    tm_model *m = tm_calloc(1, sizeof(*m));
    if (!m)
        return TM_ERR(err, TM_E_NOMEM, "loading model %s: model header", dir);
    tm_rc rc = TM_OK;
    m->dir = tm_strdup(dir);
    if (!m->dir) {
        rc = TM_ERR(err, TM_E_NOMEM, "folder name");
        goto fail;
    }
    rc = load_json(dir, "config.json", 0, &root, err);
    if (rc == TM_OK)
        rc = load_json(dir, "generation_config.json", 1, &gen, err);
    if (rc == TM_OK)
        rc = parse_config(root, gen, &m->cfg, err);
    if (rc == TM_OK && m->cfg.arch == TM_ARCH_DEEPSEEK_V4)
        rc = tm_dsv4_config_parse(root, gen, &m->cfg, (tm_dsv4 **)&m->arch_w, err);
    if (rc == TM_OK)
        rc = tm_quant_cfg_parse(root, m->cfg.arch == TM_ARCH_DEEPSEEK_V4, &m->cfg.quant, err);
    if (rc)
        goto fail;
    json_decref(root);
    json_decref(gen);
    root = gen = NULL;
    m->layers = tm_calloc(m->cfg.n_layer, sizeof(*m->layers));
    if (!m->layers) {
        rc = TM_ERR(err, TM_E_NOMEM, "%u layers", m->cfg.n_layer);
        goto fail;
    }
    tm_st_set *st = NULL;
    rc = tm_st_set_open(dir, &st, err);
    if (rc)
        goto fail;
    m->impl = st;
    if (m->cfg.arch == TM_ARCH_DEEPSEEK_V4)
        rc = tm_dsv4_bind(m, st, err);
    else
        rc = bind_all(m, st, err);
    if (rc == TM_OK) // binding read the weights (quantizing, converting): from the file as loaded?
        rc = tm_st_set_check(st, err);
    if (rc)
        goto fail;
    *out = m;
    return TM_OK;
fail:
    json_decref(root);
    json_decref(gen);
    tm_model_destroy(m);
    return tm_err_wrap(err, "loading model %s", dir);
}

tm_rc tm_model_check_files(const tm_model *m, tm_err *err) {
    return m->impl ? tm_st_set_check(m->impl, err) : TM_OK;
}

void tm_model_destroy(tm_model *m) {
    if (!m)
        return;
    tm_st_set_close(m->impl);
    tm_dsv4_destroy(m->arch_w);
    tm_free(m->qbuf);
    tm_free(m->layers);
    tm_free(m->dir);
    tm_free(m);
}

const char *tm_model_arch_name(const tm_model *m) {
    switch (m->cfg.arch) {
    case TM_ARCH_LLAMA:
        return "llama";
    case TM_ARCH_QWEN2:
        return "qwen2";
    case TM_ARCH_MISTRAL:
        return "mistral";
    case TM_ARCH_DEEPSEEK_V4:
        return "deepseek_v4";
    }
    return "?";
}

/* quant: 1 if t may be a quantized view (a linear, for an engine that dequantizes rows). */
static tm_rc check_weight(const char *who, const tm_tensor *t, const char *name, uint32_t layer,
                          uint64_t d0, uint64_t d1, int quant, tm_err *err) {
    uint32_t n_dim = d1 ? 2 : 1;
    if (!t->data)
        return TM_ERR(err, TM_E_INVAL, "%s: layer %u %s missing", who, layer, name);
    if (t->quant != TM_QUANT_NONE) {
        if (!quant)
            return TM_ERR(err, TM_E_INVAL,
                          "%s: layer %u %s: %s quantized weights are not supported here", who,
                          layer, name, tm_quant_name((tm_quant)t->quant));
        int ok_dt = t->quant == TM_QUANT_MXFP4 ? t->dtype == TM_DTYPE_F4_E2M1
                                               : t->dtype == TM_DTYPE_F8_E4M3;
        if (t->quant > TM_QUANT_MXFP4 || !ok_dt || !t->scale || !t->qblock[0] || !t->qblock[1])
            return TM_ERR(err, TM_E_INVAL, "%s: layer %u %s: bad quantized view (%s, %s)", who,
                          layer, name, tm_quant_name((tm_quant)t->quant), tm_dtype_name(t->dtype));
    } else if ((unsigned)t->dtype > (unsigned)TM_DTYPE_BF16) {
        return TM_ERR(err, TM_E_INVAL, "%s: layer %u %s: dtype %s is not a float dtype", who, layer,
                      name, tm_dtype_name(t->dtype));
    }
    if (t->n_dim != n_dim || t->shape[0] != d0 || (d1 && t->shape[1] != d1))
        return TM_ERR(err, TM_E_INVAL,
                      "%s: layer %u %s: shape [%llu, %llu] (n_dim %u), want [%llu, %llu]", who,
                      layer, name, (unsigned long long)t->shape[0],
                      (unsigned long long)(t->n_dim > 1 ? t->shape[1] : 0), t->n_dim,
                      (unsigned long long)d0, (unsigned long long)d1);
    return TM_OK;
}

static tm_rc check_weights(const tm_model *m, const char *who, int q, tm_err *err) {
    const tm_model_cfg *c = &m->cfg;
    const uint64_t d = c->n_embd, qd = (uint64_t)c->n_head * c->head_dim;
    const uint64_t kvd = (uint64_t)c->n_kv_head * c->head_dim;
    tm_rc rc = check_weight(who, &m->embd, "embed_tokens", 0, c->n_vocab, d, 0, err);
    if (!rc)
        rc = check_weight(who, &m->out_norm, "norm", 0, d, 0, 0, err);
    const tm_tensor *lm = m->lm_head.data ? &m->lm_head : &m->embd;
    if (!rc && !c->tie_embd && !m->lm_head.data)
        rc = TM_ERR(err, TM_E_INVAL, "%s: untied model without lm_head", who);
    if (!rc)
        rc = check_weight(who, lm, "lm_head", 0, c->n_vocab, d, 0, err);
    for (uint32_t l = 0; !rc && l < c->n_layer; l++) {
        const tm_layer_w *L = &m->layers[l];
        rc = check_weight(who, &L->attn_norm, "input_layernorm", l, d, 0, 0, err);
        if (!rc)
            rc = check_weight(who, &L->wq, "q_proj", l, qd, d, q, err);
        if (!rc)
            rc = check_weight(who, &L->wk, "k_proj", l, kvd, d, q, err);
        if (!rc)
            rc = check_weight(who, &L->wv, "v_proj", l, kvd, d, q, err);
        if (!rc && c->qkv_bias)
            rc = check_weight(who, &L->bq, "q_proj.bias", l, qd, 0, 0, err);
        if (!rc && c->qkv_bias)
            rc = check_weight(who, &L->bk, "k_proj.bias", l, kvd, 0, 0, err);
        if (!rc && c->qkv_bias)
            rc = check_weight(who, &L->bv, "v_proj.bias", l, kvd, 0, 0, err);
        if (!rc)
            rc = check_weight(who, &L->wo, "o_proj", l, d, qd, q, err);
        if (!rc)
            rc = check_weight(who, &L->ffn_norm, "post_attention_layernorm", l, d, 0, 0, err);
        if (!rc)
            rc = check_weight(who, &L->w_gate, "gate_proj", l, c->n_ff, d, q, err);
        if (!rc)
            rc = check_weight(who, &L->w_up, "up_proj", l, c->n_ff, d, q, err);
        if (!rc)
            rc = check_weight(who, &L->w_down, "down_proj", l, d, c->n_ff, q, err);
    }
    return rc;
}

tm_rc tm_model_check_weights(const tm_model *m, const char *who, tm_err *err) {
    return check_weights(m, who, 0, err);
}

tm_rc tm_model_check_weights_quant(const tm_model *m, const char *who, tm_err *err) {
    return check_weights(m, who, 1, err);
}

int tm_model_is_quantized(const tm_model *m) {
    const tm_dsv4 *d = tm_model_dsv4(m);
    if (d) {
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
    for (uint32_t l = 0; l < m->cfg.n_layer && m->layers; l++) {
        const tm_layer_w *L = &m->layers[l];
        const tm_tensor *lin[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (size_t i = 0; i < sizeof(lin) / sizeof(lin[0]); i++)
            if (lin[i]->quant != TM_QUANT_NONE)
                return 1;
    }
    return 0;
}

/* ---- quantization at load (tm_model_quantize_fp8) ---------------------------------------- */

#define QROW_CHUNK 64 /* rows per work item */
#define N_LIN 7

static const char *const lin_names[N_LIN] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                             "gate_proj", "up_proj", "down_proj"};

static void layer_lins(tm_layer_w *L, tm_tensor *lin[N_LIN]) {
    lin[0] = &L->wq, lin[1] = &L->wk, lin[2] = &L->wv, lin[3] = &L->wo;
    lin[4] = &L->w_gate, lin[5] = &L->w_up, lin[6] = &L->w_down;
}

// One linear to quantize: its float view, where its codes and scales go, its first work item.
typedef struct qjob {
    const tm_tensor *src;
    uint8_t *codes; /* [R][C] */
    float *scales;  /* [R] */
    uint64_t item0; /* index of its first chunk of QROW_CHUNK rows */
} qjob;

typedef struct qwork {
    const qjob *jobs;
    size_t n_jobs;
    uint64_t n_items;
    uint64_t max_cols;
    atomic_uint_fast64_t next; /* next work item */
    atomic_int bad_job;        /* 1 + index of a job with a row whose scale is not finite, or 0 */
} qwork;

static void *quant_worker(void *arg) {
    qwork *w = arg;
    float *row = tm_malloc((size_t)w->max_cols * sizeof(float));
    if (!row)
        return NULL; // the others (the caller at least) do the work
    size_t j = 0;
    for (;;) { // hot loop: chunks of rows, in item order, over all linears
        uint64_t it = atomic_fetch_add(&w->next, 1);
        if (it >= w->n_items)
            break;
        while (j + 1 < w->n_jobs && w->jobs[j + 1].item0 <= it)
            j++;
        while (w->jobs[j].item0 > it)
            j--;
        const qjob *q = &w->jobs[j];
        const uint64_t R = q->src->shape[0], C = q->src->shape[1];
        const uint64_t r0 = (it - q->item0) * QROW_CHUNK, r1 = TM_MIN(R, r0 + QROW_CHUNK);
        for (uint64_t r = r0; r < r1; r++) {
            tm_tensor_row_f32(q->src, (size_t)r, row);
            const float s = tm_quant_fp8_row(row, (size_t)C, q->codes + r * C);
            q->scales[r] = s;
            if (!(s > 0.0f) || !isfinite(s))
                atomic_store(&w->bad_job, (int)j + 1);
        }
    }
    tm_free(row);
    return NULL;
}

tm_rc tm_model_quantize_fp8_check(const tm_model *m, tm_err *err) {
    if (m->cfg.arch == TM_ARCH_DEEPSEEK_V4)
        return TM_ERR(err, TM_E_INVAL,
                      "model %s: deepseek_v4 is not quantized at load (its FP8 format is 128x128 "
                      "block-scaled with ue8m0 scales, not per channel; use its FP8 checkpoint)",
                      m->dir);
    if (m->cfg.quant.method != TM_QMETHOD_NONE || tm_model_is_quantized(m)) {
        const tm_quant_cfg *q = &m->cfg.quant;
        return TM_ERR(err, TM_E_INVAL,
                      "model %s is already quantized (quant_method %s, %s weights): only float "
                      "checkpoints are quantized at load; run it as stored",
                      m->dir,
                      q->method == TM_QMETHOD_FP8  ? "fp8"
                      : q->method == TM_QMETHOD_CT ? "compressed-tensors"
                                                   : "none",
                      tm_quant_name((tm_quant)q->weight));
    }
    return tm_model_check_weights(m, "quantizing at load", err);
}

tm_rc tm_model_quantize_fp8(tm_model *m, uint32_t n_threads, tm_err *err) {
    tm_rc rc = tm_model_quantize_fp8_check(m, err);
    if (rc)
        return rc;
    const size_t n_jobs = (size_t)m->cfg.n_layer * N_LIN;
    qjob *jobs = tm_calloc(n_jobs ? n_jobs : 1, sizeof(*jobs));
    if (!jobs)
        return TM_ERR(err, TM_E_NOMEM, "quantizing %s: %zu linears", m->dir, n_jobs);
    // One allocation: for each linear its codes, then its scales, each 64-byte aligned.
    uint64_t off = 0, n_items = 0, max_cols = 1;
    for (size_t j = 0; j < n_jobs; j++) {
        tm_tensor *lin[N_LIN];
        layer_lins(&m->layers[j / N_LIN], lin);
        const tm_tensor *t = lin[j % N_LIN];
        const uint64_t R = t->shape[0], C = t->shape[1];
        jobs[j].src = t;
        jobs[j].codes = (uint8_t *)(uintptr_t)off;
        off += TM_CEIL_DIV(R * C, 64) * 64;
        jobs[j].scales = (float *)(uintptr_t)off;
        off += TM_CEIL_DIV(R * sizeof(float), 64) * 64;
        jobs[j].item0 = n_items;
        n_items += TM_CEIL_DIV(R, QROW_CHUNK);
        max_cols = TM_MAX(max_cols, C);
    }
    uint8_t *buf = off <= SIZE_MAX - 64 ? tm_malloc((size_t)off + 64) : NULL;
    if (!buf) {
        tm_free(jobs);
        return TM_ERR(err, TM_E_NOMEM, "quantizing %s: %llu bytes of fp8 weights and scales",
                      m->dir, (unsigned long long)off);
    }
    uint8_t *base = (uint8_t *)(((uintptr_t)buf + 63) & ~(uintptr_t)63);
    for (size_t j = 0; j < n_jobs; j++) {
        jobs[j].codes = base + (uintptr_t)jobs[j].codes;
        jobs[j].scales = (float *)(void *)(base + (uintptr_t)jobs[j].scales);
    }
    qwork w = {.jobs = jobs, .n_jobs = n_jobs, .n_items = n_items, .max_cols = max_cols};
    atomic_init(&w.next, 0);
    atomic_init(&w.bad_job, 0);
    // The caller is one worker; threads that cannot be started leave their share to the others.
    uint32_t n_th = TM_MAX(n_threads, 1u), n_started = 0;
    pthread_t *th = n_th > 1 ? tm_calloc(n_th - 1, sizeof(*th)) : NULL;
    for (uint32_t i = 0; th && i + 1 < n_th; i++) {
        if (pthread_create(&th[n_started], NULL, quant_worker, &w) != 0)
            break;
        n_started++;
    }
    // The caller's own pass takes items until none is left, so a thread that could not get its
    // row buffer only costs time; if the caller's fails too, items remain: TM_E_NOMEM.
    quant_worker(&w);
    for (uint32_t i = 0; i < n_started; i++)
        pthread_join(th[i], NULL);
    tm_free(th);
    const int bad = atomic_load(&w.bad_job);
    if (atomic_load(&w.next) < n_items) {
        rc = TM_ERR(err, TM_E_NOMEM, "quantizing %s: row buffers", m->dir);
    } else if (bad) {
        rc = TM_ERR(err, TM_E_INVAL,
                    "quantizing %s: layer %zu %s has a row with an infinite (or all "
                    "below 448 * 2^-149) weight: no finite fp8 scale",
                    m->dir, (size_t)(bad - 1) / N_LIN, lin_names[(bad - 1) % N_LIN]);
    }
    if (rc) {
        tm_free(buf);
        tm_free(jobs);
        return rc;
    }
    // Every row is done: switch the views (nothing above touched m).
    for (size_t j = 0; j < n_jobs; j++) {
        tm_tensor *lin[N_LIN];
        layer_lins(&m->layers[j / N_LIN], lin);
        tm_tensor *t = lin[j % N_LIN];
        const uint64_t R = t->shape[0], C = t->shape[1];
        *t = (tm_tensor){.data = jobs[j].codes,
                         .dtype = TM_DTYPE_F8_E4M3,
                         .n_dim = 2,
                         .shape = {R, C},
                         .scale = jobs[j].scales,
                         .quant = TM_QUANT_FP8_CHANNEL,
                         .scale_dtype = TM_DTYPE_F32,
                         .qblock = {1, (uint32_t)C}};
    }
    m->cfg.quant = (tm_quant_cfg){.method = TM_QMETHOD_CT,
                                  .weight = TM_QUANT_FP8_CHANNEL,
                                  .scale_dtype = TM_DTYPE_F32,
                                  .act = TM_QACT_DYNAMIC};
    tm_free(m->qbuf);
    m->qbuf = buf;
    tm_free(jobs);
    return TM_OK;
}

void tm_model_rope_inv_freq(const tm_model_cfg *cfg, float *inv_freq) {
    const uint32_t d = cfg->head_dim, half = d / 2;
    for (uint32_t i = 0; i < half; i++)
        inv_freq[i] = 1.0f / powf(cfg->rope_theta, (float)(2 * i) / (float)d);
    if (cfg->rope_type != TM_ROPE_LLAMA3)
        return;
    // llama3: long wavelengths are slowed down by `factor`, short ones kept, and the band in
    // between interpolated (transformers' _compute_llama3_parameters).
    const float factor = cfg->rope_factor, lo = cfg->rope_low_freq_factor;
    const float hi = cfg->rope_high_freq_factor, old_ctx = (float)cfg->rope_orig_ctx;
    const float lo_wavelen = old_ctx / lo, hi_wavelen = old_ctx / hi;
    const float two_pi = (float)(2.0 * 3.14159265358979323846);
    for (uint32_t i = 0; i < half; i++) {
        float f = inv_freq[i];
        float wavelen = two_pi / f;
        float scaled = wavelen > lo_wavelen ? f / factor : f;
        if (!(wavelen < hi_wavelen) && !(wavelen > lo_wavelen)) {
            float smooth = (old_ctx / wavelen - lo) / (hi - lo);
            scaled = (1.0f - smooth) * scaled / factor + smooth * scaled;
        }
        inv_freq[i] = scaled;
    }
}
