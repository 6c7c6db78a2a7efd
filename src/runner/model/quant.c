/* runner/model/quant.c - quantization_config parsing and quantized weight binding (see
 * quant.h and docs/quantization.md). Unknown keys inside quantization_config are ignored, as
 * transformers does; every key we act on is checked, and a value we cannot honour is an error
 * naming it. */
#include "runner/model/quant.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "runner/model/safetensors.h"

#define QC "config.json: quantization_config"

static tm_rc want_string(json_t *obj, const char *where, const char *key, const char *want,
                         int required, tm_err *err) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        if (required)
            return TM_ERR(err, TM_E_PARSE, "%s: missing %s", where, key);
        return TM_OK;
    }
    if (!json_is_string(v))
        return TM_ERR(err, TM_E_PARSE, "%s: %s is not a string", where, key);
    if (strcmp(json_string_value(v), want))
        return TM_ERR(err, TM_E_INVAL, "%s: %s '%.40s' is not supported (\"%s\" is)", where, key,
                      json_string_value(v), want);
    return TM_OK;
}

static tm_rc parse_block(json_t *v, const char *where, const char *key, uint32_t *block,
                         tm_err *err) {
    if (!json_is_array(v) || json_array_size(v) != 2)
        return TM_ERR(err, TM_E_PARSE, "%s: %s is not an array of two integers", where, key);
    for (size_t i = 0; i < 2; i++) {
        json_t *e = json_array_get(v, i);
        if (!json_is_integer(e) || json_integer_value(e) < 1 || json_integer_value(e) > 65536)
            return TM_ERR(err, TM_E_PARSE, "%s: %s[%zu] is not an integer in [1, 65536]", where,
                          key, i);
        block[i] = (uint32_t)json_integer_value(e);
    }
    return TM_OK;
}

static tm_rc parse_fp8(json_t *qc, tm_quant_cfg *q, tm_err *err) {
    q->method = TM_QMETHOD_FP8;
    q->weight = TM_QUANT_FP8_BLOCK;
    q->scale_dtype = TM_DTYPE_F32;
    q->act = TM_QACT_DYNAMIC;
    q->block[0] = q->block[1] = 128;
    tm_rc rc = want_string(qc, QC, "fmt", "e4m3", 0, err);
    if (rc == TM_OK)
        rc = want_string(qc, QC, "activation_scheme", "dynamic", 0, err);
    if (rc)
        return rc;
    json_t *bs = json_object_get(qc, "weight_block_size");
    if (bs && !json_is_null(bs)) {
        rc = parse_block(bs, QC, "weight_block_size", q->block, err);
        if (rc)
            return rc;
    }
    json_t *sf = json_object_get(qc, "scale_fmt");
    if (sf && !json_is_null(sf)) {
        if (!json_is_string(sf))
            return TM_ERR(err, TM_E_PARSE, QC ": scale_fmt is not a string");
        if (strcmp(json_string_value(sf), "ue8m0"))
            return TM_ERR(err, TM_E_INVAL,
                          QC ": scale_fmt '%.40s' is not supported (\"ue8m0\" or absent)",
                          json_string_value(sf));
        q->scale_dtype = TM_DTYPE_F8_E8M0;
    }
    json_t *skip = json_object_get(qc, "modules_to_not_convert");
    if (skip && !json_is_null(skip) && !json_is_array(skip))
        return TM_ERR(err, TM_E_PARSE, QC ": modules_to_not_convert is not an array");
    return TM_OK;
}

/* One side (weights or input_activations) of a compressed-tensors group: 8-bit float. */
static tm_rc ct_side(json_t *s, const char *where, tm_err *err) {
    if (!json_is_object(s))
        return TM_ERR(err, TM_E_PARSE, "%s is not an object", where);
    json_t *nb = json_object_get(s, "num_bits");
    if (!json_is_integer(nb))
        return TM_ERR(err, TM_E_PARSE, "%s: num_bits is %s", where,
                      nb ? "not an integer" : "missing");
    if (json_integer_value(nb) != 8)
        return TM_ERR(err, TM_E_INVAL, "%s: num_bits %lld is not supported (8 is)", where,
                      (long long)json_integer_value(nb));
    return want_string(s, where, "type", "float", 1, err);
}

static tm_rc parse_ct(json_t *qc, tm_quant_cfg *q, tm_err *err) {
    q->method = TM_QMETHOD_CT;
    q->scale_dtype = TM_DTYPE_F32; // F32, BF16 or F16 are all taken (checked at bind)
    json_t *fmt = json_object_get(qc, "format");
    if (fmt && !json_is_null(fmt)) {
        if (!json_is_string(fmt))
            return TM_ERR(err, TM_E_PARSE, QC ": format is not a string");
        const char *f = json_string_value(fmt);
        if (strcmp(f, "float-quantized") && strcmp(f, "naive-quantized"))
            return TM_ERR(err, TM_E_INVAL,
                          QC ": format '%.40s' is not supported (float-quantized, "
                             "naive-quantized are)",
                          f);
    }
    json_t *ign = json_object_get(qc, "ignore");
    if (ign && !json_is_null(ign)) {
        if (!json_is_array(ign))
            return TM_ERR(err, TM_E_PARSE, QC ": ignore is not an array");
        for (size_t i = 0; i < json_array_size(ign); i++)
            if (!json_is_string(json_array_get(ign, i)))
                return TM_ERR(err, TM_E_PARSE, QC ": ignore[%zu] is not a string", i);
    }
    json_t *groups = json_object_get(qc, "config_groups");
    if (!json_is_object(groups) || json_object_size(groups) == 0)
        return TM_ERR(err, TM_E_PARSE, QC ": config_groups is %s",
                      groups ? "not a non-empty object" : "missing");
    if (json_object_size(groups) != 1)
        return TM_ERR(err, TM_E_INVAL, QC ": config_groups has %zu groups (one is supported)",
                      json_object_size(groups));
    const char *gname;
    json_t *g;
    json_object_foreach(groups, gname, g) {
        char where[160];
        snprintf(where, sizeof(where), QC ".config_groups.%.40s", gname);
        if (!json_is_object(g))
            return TM_ERR(err, TM_E_PARSE, "%s is not an object", where);
        json_t *tg = json_object_get(g, "targets");
        if (tg && !json_is_null(tg)) {
            int linear = 0;
            for (size_t i = 0; json_is_array(tg) && i < json_array_size(tg); i++)
                linear |= json_is_string(json_array_get(tg, i)) &&
                          !strcmp(json_string_value(json_array_get(tg, i)), "Linear");
            if (!linear)
                return TM_ERR(err, TM_E_INVAL, "%s: targets must list \"Linear\"", where);
        }
        char side[200];
        snprintf(side, sizeof(side), "%s.weights", where);
        json_t *w = json_object_get(g, "weights");
        tm_rc rc = ct_side(w, side, err);
        if (rc)
            return rc;
        json_t *dyn = json_object_get(w, "dynamic");
        if (dyn && json_is_true(dyn))
            return TM_ERR(err, TM_E_INVAL, "%s: dynamic weights are not supported", side);
        json_t *st = json_object_get(w, "strategy");
        const char *s = json_is_string(st) ? json_string_value(st) : NULL;
        if (!s)
            return TM_ERR(err, TM_E_PARSE, "%s: strategy is not a string", side);
        if (!strcmp(s, "channel")) {
            q->weight = TM_QUANT_FP8_CHANNEL;
        } else if (!strcmp(s, "tensor")) {
            q->weight = TM_QUANT_FP8_TENSOR;
        } else if (!strcmp(s, "block")) {
            q->weight = TM_QUANT_FP8_BLOCK;
            rc = parse_block(json_object_get(w, "block_structure"), side, "block_structure",
                             q->block, err);
            if (rc)
                return rc;
        } else {
            return TM_ERR(err, TM_E_INVAL,
                          "%s: strategy '%.40s' is not supported (channel, tensor, block are)",
                          side, s);
        }
        json_t *ia = json_object_get(g, "input_activations");
        q->act = TM_QACT_NONE;
        if (ia && !json_is_null(ia)) {
            snprintf(side, sizeof(side), "%s.input_activations", where);
            rc = ct_side(ia, side, err);
            if (rc)
                return rc;
            json_t *d = json_object_get(ia, "dynamic");
            if (d && !json_is_boolean(d))
                return TM_ERR(err, TM_E_PARSE, "%s: dynamic is not a boolean", side);
            q->act = d && json_is_true(d) ? TM_QACT_DYNAMIC : TM_QACT_STATIC;
        }
    }
    return TM_OK;
}

static tm_rc parse_expert_dtype(json_t *v, const char *where, tm_quant_cfg *q, int *given,
                                tm_err *err) {
    if (!v || json_is_null(v))
        return TM_OK;
    *given = 1;
    if (!json_is_string(v))
        return TM_ERR(err, TM_E_PARSE, "%s: expert_dtype is not a string", where);
    const char *s = json_string_value(v);
    if (!strcmp(s, "fp4"))
        q->expert = TM_QUANT_MXFP4;
    else if (!strcmp(s, "fp8"))
        q->expert = TM_QUANT_FP8_BLOCK;
    else if (!strcmp(s, "bf16"))
        q->expert = TM_QUANT_NONE;
    else
        return TM_ERR(err, TM_E_INVAL, "%s: expert_dtype '%.40s' is not supported (fp4, fp8 are)",
                      where, s);
    if (q->expert != TM_QUANT_NONE && q->method != TM_QMETHOD_FP8)
        return TM_ERR(err, TM_E_INVAL,
                      "%s: expert_dtype %s needs quantization_config quant_method \"fp8\"", where,
                      s);
    return TM_OK;
}

tm_rc tm_quant_cfg_parse(void *root_v, int dsv4, tm_quant_cfg *q, tm_err *err) {
    json_t *root = root_v;
    memset(q, 0, sizeof(*q));
    json_t *qc = json_object_get(root, "quantization_config");
    tm_rc rc = TM_OK;
    int given = 0;
    if (qc && !json_is_null(qc)) {
        if (!json_is_object(qc))
            return TM_ERR(err, TM_E_PARSE, QC " is not an object");
        json_t *m = json_object_get(qc, "quant_method");
        if (!json_is_string(m))
            return TM_ERR(err, TM_E_PARSE, QC ": quant_method is %s",
                          m ? "not a string" : "missing");
        const char *method = json_string_value(m);
        if (!strcmp(method, "fp8"))
            rc = parse_fp8(qc, q, err);
        else if (!strcmp(method, "compressed-tensors"))
            rc = parse_ct(qc, q, err);
        else
            return TM_ERR(err, TM_E_INVAL,
                          QC ": quant_method '%.40s' is not supported (fp8, compressed-tensors "
                             "are)",
                          method);
        if (rc)
            return rc;
        if (dsv4)
            rc = parse_expert_dtype(json_object_get(qc, "expert_dtype"), QC, q, &given, err);
    }
    if (rc == TM_OK && dsv4 && json_object_get(root, "expert_dtype"))
        rc = parse_expert_dtype(json_object_get(root, "expert_dtype"), "config.json", q, &given,
                                err);
    if (rc == TM_OK && dsv4 && !given)
        q->expert = q->weight; // experts stored like the dense linears
    if (rc == TM_OK && dsv4 && q->method == TM_QMETHOD_CT)
        rc = TM_ERR(err, TM_E_INVAL, QC ": compressed-tensors is not supported for deepseek_v4");
    return rc;
}

/* ---- binding ---- */

static void shape_str(char *out, size_t cap, uint32_t n_dim, const uint64_t *shape) {
    size_t at = (size_t)snprintf(out, cap, "[");
    for (uint32_t d = 0; d < n_dim && at < cap; d++)
        at += (size_t)snprintf(out + at, cap - at, "%s%llu", d ? ", " : "",
                               (unsigned long long)shape[d]);
    if (at < cap)
        snprintf(out + at, cap - at, "]");
}

static int same_shape(const tm_st_tensor *s, uint32_t n_dim, const uint64_t *want) {
    if (s->n_dim != n_dim)
        return 0;
    for (uint32_t d = 0; d < n_dim; d++)
        if (s->shape[d] != want[d])
            return 0;
    return 1;
}

static tm_rc bad_shape(const tm_st_tensor *s, const char *what, uint32_t n_dim,
                       const uint64_t *want, tm_err *err) {
    char got[160], exp[160];
    shape_str(got, sizeof(got), s->n_dim, s->shape);
    shape_str(exp, sizeof(exp), n_dim, want);
    return TM_ERR(err, TM_E_PARSE, "%s: tensor '%s'%s has shape %s, expected %s", s->file, s->name,
                  what, got, exp);
}

static int is_float(tm_dtype dt) {
    return dt == TM_DTYPE_F32 || dt == TM_DTYPE_F16 || dt == TM_DTYPE_BF16;
}

/* Bind the scale of weight `name` (scheme in t) and check it. */
static tm_rc bind_scale(const tm_st_set *st, const tm_quant_cfg *q, const char *name,
                        uint32_t n_dim, const uint64_t *want, tm_tensor *t, tm_err *err) {
    char sname[256];
    const size_t n_name = strlen(name);
    if (q->method == TM_QMETHOD_DSREF && n_name > 7 && !strcmp(name + n_name - 7, ".weight"))
        snprintf(sname, sizeof(sname), "%.*s.scale", (int)(n_name - 7), name);
    else
        snprintf(sname, sizeof(sname), "%s%s", name,
                 q->method == TM_QMETHOD_CT ? "_scale" : "_scale_inv");
    const tm_st_tensor *s = tm_st_set_find(st, sname);
    if (!s)
        return TM_ERR(err, TM_E_PARSE, "tensor '%s' is missing (the %s scale of '%s')", sname,
                      tm_quant_name((tm_quant)t->quant), name);
    // Scale grid: leading (expert) dims, then ceil(R / bo) x ceil(C / bi).
    const uint64_t R = want[n_dim - 2], C = want[n_dim - 1];
    uint64_t grid[4] = {0};
    for (uint32_t d = 0; d + 2 < n_dim; d++)
        grid[d] = want[d];
    grid[n_dim - 2] = TM_CEIL_DIV(R, t->qblock[0]);
    grid[n_dim - 1] = TM_CEIL_DIV(C, t->qblock[1]);
    int ok;
    if (t->quant == TM_QUANT_FP8_TENSOR) // [] or [1]
        ok = s->n_dim == 0 || (s->n_dim == 1 && s->shape[0] == 1);
    else if (t->quant == TM_QUANT_FP8_CHANNEL && n_dim == 2) // [out, 1] or [out]
        ok = same_shape(s, 2, grid) || (s->n_dim == 1 && s->shape[0] == R);
    else
        ok = same_shape(s, n_dim, grid);
    if (!ok)
        return bad_shape(s, " (scale)", t->quant == TM_QUANT_FP8_TENSOR ? 0 : n_dim, grid, err);
    int dt_ok;
    const char *want_dt;
    if (t->quant == TM_QUANT_MXFP4) {
        dt_ok = s->dtype == TM_DTYPE_F8_E8M0;
        want_dt = "F8_E8M0";
    } else if (q->method == TM_QMETHOD_CT) {
        dt_ok = is_float(s->dtype);
        want_dt = "F32, BF16 or F16";
    } else {
        dt_ok = s->dtype == (tm_dtype)q->scale_dtype;
        want_dt = q->scale_dtype == TM_DTYPE_F8_E8M0 ? "F8_E8M0 (scale_fmt ue8m0)" : "F32";
    }
    if (!dt_ok)
        return TM_ERR(err, TM_E_PARSE, "%s: tensor '%s' (scale) has dtype %s, expected %s", s->file,
                      sname, tm_dtype_name(s->dtype), want_dt);
    t->scale = s->data;
    t->scale_dtype = (uint8_t)s->dtype;
    // Scales must be finite and positive: a NaN or zero scale is a broken checkpoint.
    for (uint64_t i = 0; i < s->n_elem; i++) {
        float v;
        tm_dtype_to_f32(s->data, s->dtype, (size_t)i, 1, &v);
        if (!(v > 0.0f) || !isfinite(v))
            return TM_ERR(err, TM_E_PARSE, "%s: tensor '%s' (scale) element %llu is %g", s->file,
                          sname, (unsigned long long)i, (double)v);
    }
    // compressed-tensors static activations: a positive scalar input_scale beside the weight.
    if (q->method == TM_QMETHOD_CT && q->act == TM_QACT_STATIC) {
        size_t n = strlen(name);
        if (n > 6 && !strcmp(name + n - 6, "weight")) {
            snprintf(sname, sizeof(sname), "%.*sinput_scale", (int)(n - 6), name);
            const tm_st_tensor *is = tm_st_set_find(st, sname);
            if (!is)
                return TM_ERR(err, TM_E_PARSE, "tensor '%s' is missing (static input_activations)",
                              sname);
            float v = 0.0f;
            if (!is_float(is->dtype) || !(is->n_dim == 0 || (is->n_dim == 1 && is->shape[0] == 1)))
                return TM_ERR(err, TM_E_PARSE, "%s: tensor '%s' is not a float scalar", is->file,
                              sname);
            tm_dtype_to_f32(is->data, is->dtype, 0, 1, &v);
            if (!(v > 0.0f) || !isfinite(v))
                return TM_ERR(err, TM_E_PARSE, "%s: tensor '%s' is %g", is->file, sname, (double)v);
        }
    }
    return TM_OK;
}

tm_rc tm_quant_bind(const tm_st_set *st, const tm_quant_cfg *q, const char *name, tm_qrole role,
                    uint32_t n_dim, const uint64_t *want, tm_tensor *t, tm_err *err) {
    TM_ASSERT(n_dim >= 1 && n_dim <= 4);
    memset(t, 0, sizeof(*t));
    const tm_st_tensor *s = tm_st_set_find(st, name);
    if (!s)
        return TM_ERR(err, TM_E_PARSE, "tensor '%s' is missing", name);
    t->data = s->data;
    t->dtype = s->dtype;
    t->n_dim = n_dim;
    for (uint32_t d = 0; d < n_dim; d++)
        t->shape[d] = want[d];
    const int expert = role == TM_QROLE_EXPERT;
    const tm_quant scheme = expert ? (tm_quant)q->expert : (tm_quant)q->weight;
    if (is_float(s->dtype)) {
        if (!same_shape(s, n_dim, want))
            return bad_shape(s, "", n_dim, want, err);
        if (expert && q->expert != TM_QUANT_NONE)
            return TM_ERR(err, TM_E_PARSE,
                          "%s: tensor '%s' is %s but expert_dtype says the experts are %s", s->file,
                          name, tm_dtype_name(s->dtype), tm_quant_name(scheme));
        char sname[256];
        snprintf(sname, sizeof(sname), "%s_scale_inv", name);
        const tm_st_tensor *stray = tm_st_set_find(st, sname);
        if (!stray) {
            snprintf(sname, sizeof(sname), "%s_scale", name);
            stray = tm_st_set_find(st, sname);
        }
        if (stray)
            return TM_ERR(err, TM_E_PARSE, "%s: tensor '%s' has a scale '%s' but is stored as %s",
                          s->file, name, sname, tm_dtype_name(s->dtype));
        return TM_OK;
    }
    if (n_dim < 2)
        return TM_ERR(err, TM_E_PARSE, "%s: tensor '%s' has dtype %s, expected F32, F16 or BF16",
                      s->file, name, tm_dtype_name(s->dtype));
    if (s->dtype == TM_DTYPE_F8_E4M3) {
        if (q->method == TM_QMETHOD_NONE)
            return TM_ERR(err, TM_E_PARSE,
                          "%s: tensor '%s' is F8_E4M3 but config.json has no quantization_config",
                          s->file, name);
        if (scheme != TM_QUANT_FP8_BLOCK && scheme != TM_QUANT_FP8_CHANNEL &&
            scheme != TM_QUANT_FP8_TENSOR)
            return TM_ERR(err, TM_E_PARSE, "%s: tensor '%s' is F8_E4M3 but the config says %s",
                          s->file, name, expert ? "expert_dtype fp4" : "no fp8 weights");
        if (!same_shape(s, n_dim, want))
            return bad_shape(s, "", n_dim, want, err);
        t->quant = (uint8_t)scheme;
        if (scheme == TM_QUANT_FP8_BLOCK) {
            t->qblock[0] = q->block[0];
            t->qblock[1] = q->block[1];
        } else if (scheme == TM_QUANT_FP8_CHANNEL) {
            t->qblock[0] = 1;
            t->qblock[1] = (uint32_t)want[n_dim - 1];
        } else {
            if (n_dim != 2)
                return TM_ERR(err, TM_E_PARSE,
                              "%s: tensor '%s': per-tensor scales need a 2-D "
                              "weight",
                              s->file, name);
            t->qblock[0] = (uint32_t)want[0];
            t->qblock[1] = (uint32_t)want[1];
        }
        return bind_scale(st, q, name, n_dim, want, t, err);
    }
    if (s->dtype == TM_DTYPE_I8 || s->dtype == TM_DTYPE_U8) {
        if (!expert || scheme != TM_QUANT_MXFP4)
            return TM_ERR(err, TM_E_PARSE,
                          "%s: tensor '%s' is %s: packed FP4 is only read for routed experts with "
                          "expert_dtype fp4",
                          s->file, name, tm_dtype_name(s->dtype));
        const uint64_t in = want[n_dim - 1];
        if (in % 32)
            return TM_ERR(err, TM_E_PARSE,
                          "%s: tensor '%s': MXFP4 needs the input width (%llu) to be a multiple "
                          "of 32",
                          s->file, name, (unsigned long long)in);
        uint64_t packed[4];
        memcpy(packed, want, n_dim * sizeof(uint64_t));
        packed[n_dim - 1] = in / 2;
        if (!same_shape(s, n_dim, packed))
            return bad_shape(s, " (packed FP4, two values a byte)", n_dim, packed, err);
        t->dtype = TM_DTYPE_F4_E2M1;
        t->quant = TM_QUANT_MXFP4;
        t->qblock[0] = 1;
        t->qblock[1] = 32;
        return bind_scale(st, q, name, n_dim, want, t, err);
    }
    return TM_ERR(err, TM_E_PARSE, "%s: tensor '%s' has dtype %s, which is not a weight dtype",
                  s->file, name, tm_dtype_name(s->dtype));
}

float tm_quant_fp8_row(const float *v, size_t n, uint8_t *q) {
    float amax = 0.0f;
    for (size_t i = 0; i < n; i++) { // fmaxf without the libm call: a NaN compares false
        const float a = fabsf(v[i]);
        amax = a > amax ? a : amax;
    }
    const float s = amax > 0.0f ? amax / 448.0f : 1.0f;
    for (size_t i = 0; i < n; i++)
        q[i] = tm_f32_to_e4m3(v[i] / s);
    return s;
}
