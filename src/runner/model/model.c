/* runner/model/model.c - load a Hugging Face model folder: config.json (+
 * generation_config.json) and the safetensors weights (runner/model/safetensors.h). What depends
 * on the architecture (its config fields, its weight names and shapes, its own part arch_w) is
 * its tm_arch_ops (runner/model/arch.h: model_llama.c, model_dsv4.c); this file picks the ops by
 * architectures[0] (or model_type) and runs them. Also the checks every engine shares
 * (tm_model_check_weights), quantization at load and the RoPE inverse frequency table both engines
 * use (tm_model_rope_inv_freq).
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
#include "runner/model/arch.h"
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

static tm_rc parse_arch(json_t *root, tm_arch *arch, tm_err *err) {
    char names[256];
    json_t *archs = json_object_get(root, "architectures");
    if (archs && !json_is_null(archs)) {
        json_t *a0 = json_is_array(archs) ? json_array_get(archs, 0) : NULL;
        if (!json_is_string(a0))
            return TM_ERR(err, TM_E_PARSE, CFG ": architectures is not an array of strings");
        const char *s = json_string_value(a0);
        int a = tm_arch_find(s, 1);
        if (a >= 0) {
            *arch = (tm_arch)a;
            return TM_OK;
        }
        tm_arch_list_names(names, sizeof(names), 1);
        return TM_ERR(err, TM_E_INVAL, CFG ": architecture '%.80s' is not supported (%s are)", s,
                      names);
    }
    json_t *mt = json_object_get(root, "model_type");
    if (!json_is_string(mt))
        return TM_ERR(err, TM_E_PARSE, CFG ": neither architectures nor model_type is given");
    const char *s = json_string_value(mt);
    int a = tm_arch_find(s, 0);
    if (a >= 0) {
        *arch = (tm_arch)a;
        return TM_OK;
    }
    tm_arch_list_names(names, sizeof(names), 0);
    return TM_ERR(err, TM_E_INVAL, CFG ": model_type '%.80s' is not supported (%s are)", s, names);
}

/* ---- load ------------------------------------------------------------------------------------ */

tm_rc tm_model_cfg_load(const char *dir, tm_model_cfg *cfg, tm_err *err) {
    json_t *root = NULL, *gen = NULL;
    tm_rc rc = load_json(dir, "config.json", 0, &root, err);
    if (rc == TM_OK)
        rc = load_json(dir, "generation_config.json", 1, &gen, err);
    memset(cfg, 0, sizeof(*cfg));
    if (rc == TM_OK)
        rc = parse_arch(root, &cfg->arch, err);
    const tm_arch_ops *ops = tm_arch_ops_get(cfg->arch);
    if (rc == TM_OK && !ops->llama_shape)
        rc = TM_ERR(err, TM_E_INVAL, "%s: a %s config has no Llama-family shape", dir, ops->title);
    void *arch_w = NULL;
    if (rc == TM_OK)
        rc = ops->config_parse(root, gen, cfg, &arch_w, err);
    ops->destroy(arch_w); // a Llama-family shape has none
    if (rc == TM_OK)
        rc = tm_quant_cfg_parse(root, ops->quant_experts, &cfg->quant, err);
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
        rc = parse_arch(root, &m->cfg.arch, err);
    const tm_arch_ops *ops = tm_arch_ops_get(m->cfg.arch);
    if (rc == TM_OK)
        rc = ops->config_parse(root, gen, &m->cfg, &m->arch_w, err);
    if (rc == TM_OK)
        rc = tm_quant_cfg_parse(root, ops->quant_experts, &m->cfg.quant, err);
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
    rc = ops->bind(m, st, err);
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
    tm_arch_ops_get(m->cfg.arch)->destroy(m->arch_w);
    tm_free(m->qbuf);
    tm_free(m->layers);
    tm_free(m->dir);
    tm_free(m);
}

const char *tm_model_arch_name(const tm_model *m) {
    const tm_arch_ops *ops = tm_arch_ops_get(m->cfg.arch);
    return ops ? ops->name : "?";
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

int tm_model_has_drafter(const tm_model *m) {
    const tm_arch_ops *ops = tm_arch_ops_get(m->cfg.arch);
    return ops && ops->has_drafter ? ops->has_drafter(m) : 0;
}

int tm_model_is_quantized(const tm_model *m) {
    const tm_arch_ops *ops = tm_arch_ops_get(m->cfg.arch);
    return ops ? ops->is_quantized(m) : 0;
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
    const tm_arch_ops *ops = tm_arch_ops_get(m->cfg.arch);
    if (ops && !ops->llama_shape)
        return TM_ERR(err, TM_E_INVAL, "model %s: %s is not quantized at load (%s)", m->dir,
                      ops->name, ops->no_fp8_at_load);
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
