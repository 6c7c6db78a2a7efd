/* runner/model/arch.c - the registry of model architectures: TM_ARCH_LIST
 * (runner/model/model_types.h) turned into a table of tm_arch_ops indexed by tm_arch, and the
 * config.json field readers the architectures' config_parse hooks share. Constant data and pure
 * functions; any thread. */
#include "runner/model/arch.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

static const tm_arch_ops *const archs[TM_ARCH_COUNT] = {
#define TM_ARCH_ENTRY(e, name, ops) [TM_ARCH_##e] = &ops,
    TM_ARCH_LIST(TM_ARCH_ENTRY)
#undef TM_ARCH_ENTRY
};

const tm_arch_ops *tm_arch_ops_get(tm_arch arch) {
    return (unsigned)arch < TM_ARCH_COUNT ? archs[arch] : NULL;
}

int tm_arch_find(const char *s, int by_class) {
    for (int i = 0; i < TM_ARCH_COUNT; i++)
        if (!strcmp(s, by_class ? archs[i]->hf_class : archs[i]->name))
            return i;
    return -1;
}

void tm_arch_list_names(char *buf, size_t cap, int by_class) {
    size_t at = 0;
    buf[0] = '\0';
    for (int i = 0; i < TM_ARCH_COUNT && at < cap; i++) {
        int n = snprintf(buf + at, cap - at, "%s%s", i ? ", " : "",
                         by_class ? archs[i]->hf_class : archs[i]->name);
        if (n < 0)
            break;
        at += (size_t)n;
    }
}

/* ---- config.json fields (the hooks' shared readers) ---- */

tm_rc tm_arch_cfg_u32(const void *obj_v, const char *file, const char *key, int required,
                      uint32_t def, uint32_t lo, uint32_t hi, uint32_t *out, tm_err *err) {
    json_t *v = json_object_get(obj_v, key);
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

tm_rc tm_arch_cfg_num(const void *obj_v, const char *file, const char *key, int required,
                      double def, double *out, tm_err *err) {
    json_t *v = json_object_get(obj_v, key);
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

tm_rc tm_arch_cfg_bool(const void *obj_v, const char *file, const char *key, int def, int *out,
                       tm_err *err) {
    json_t *v = json_object_get(obj_v, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return TM_OK;
    }
    if (!json_is_boolean(v))
        return TM_ERR(err, TM_E_PARSE, "%s: %s is not a boolean", file, key);
    *out = json_is_true(v);
    return TM_OK;
}

/* One bos_token_id or eos_token_id field (an integer or a list; absent: nothing) into c. */
static tm_rc token_id(json_t *obj, const char *file, const char *key, uint32_t n_vocab,
                      tm_model_cfg *c, int is_eos, tm_err *err) {
    json_t *v = obj ? json_object_get(obj, key) : NULL;
    if (!v || json_is_null(v))
        return TM_OK;
    size_t n = json_is_array(v) ? json_array_size(v) : 1;
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_is_array(v) ? json_array_get(v, i) : v;
        if (!json_is_integer(e) || json_integer_value(e) < 0 ||
            json_integer_value(e) >= (json_int_t)n_vocab)
            return TM_ERR(err, TM_E_PARSE, "%s: %s is not a token id below %u", file, key, n_vocab);
        int32_t id = (int32_t)json_integer_value(e);
        if (!is_eos) {
            if (c->bos_id < 0)
                c->bos_id = id;
            continue;
        }
        int seen = 0;
        for (uint32_t k = 0; k < c->n_eos; k++)
            seen |= c->eos_ids[k] == id;
        if (seen)
            continue;
        if (c->n_eos == TM_MODEL_MAX_EOS)
            return TM_ERR(err, TM_E_PARSE, "%s: too many eos ids", file);
        c->eos_ids[c->n_eos++] = id;
    }
    return TM_OK;
}

tm_rc tm_arch_cfg_token_ids(const void *root_v, const void *gen_v, tm_model_cfg *c, tm_err *err) {
    json_t *root = (json_t *)root_v, *gen = (json_t *)gen_v;
    const char *const gen_file = "generation_config.json";
    c->bos_id = -1;
    tm_rc rc = token_id(root, "config.json", "bos_token_id", c->n_vocab, c, 0, err);
    if (rc == TM_OK)
        rc = token_id(gen, gen_file, "bos_token_id", c->n_vocab, c, 0, err);
    if (rc == TM_OK)
        rc = token_id(root, "config.json", "eos_token_id", c->n_vocab, c, 1, err);
    if (rc == TM_OK)
        rc = token_id(gen, gen_file, "eos_token_id", c->n_vocab, c, 1, err);
    return rc;
}
