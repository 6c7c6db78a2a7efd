/* tests/unit/test_engine.c - the CPU engine against itself and against independent references:
 *  (a) paged KV: one prefill chunk, random chunkings and token-by-token decode give the same
 *      logits, with block_size below the prompt length and shuffled block tables;
 *  (b) batch invariance: a sequence's logits do not depend on what shares its steps, nor on the
 *      thread count (checked bit-exact);
 *  (c) a naive reference in this file (contiguous KV, double accumulation, its own conversions
 *      and RoPE) matches within 1e-5 of the row's largest logit;
 *  (d) the paths: GQA, q/k/v bias, tied and untied lm_head, llama3 rope scaling, sliding window,
 *      f32/bf16/f16 weights;
 *  (e) Hugging Face fixtures (the JSON files in tests/fixtures/hf/, from
 * tests/oracles/hf/make_fixtures.py): rebuild the model with mkmodel, or load the checked-in model
 * a fixture's "model_dir" names (the trained demo model, tests/oracles/hf/make_demo_fixture.py),
 * replay prompt + greedy decode, compare logits (1e-4 relative) and greedy tokens. Skipped, not
 * failed, when no fixture exists. Tiny models are built in memory here so (a)-(d) do not depend on
 * the loader. */
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tm_test.h"
#include "base/alloc.h"
#include "base/clock.h"
#include "runner/engine/engine.h"
#include "runner/sched/sample.h"
#include "runner/model/model.h"

/* ---------------------------------------------------------------------------------------------
 * tiny in-memory models */

typedef struct spec {
    const char *name;
    tm_arch arch;
    uint32_t n_layer, n_embd, n_head, n_kv_head, head_dim, n_ff, n_vocab;
    int tied, bias, llama3;
    uint32_t window;
    tm_dtype dtype;
    uint64_t seed;
} spec;

#define MAX_BUFS 256

typedef struct tmodel {
    tm_model m;
    tm_layer_w layers[8];
    void *bufs[MAX_BUFS];
    int n_buf;
    uint64_t rng;
} tmodel;

static uint64_t lcg_next(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 11;
}

/* uniform in [-1, 1) */
static float frand(uint64_t *s) { return (float)((double)lcg_next(s) * 0x1p-52 - 1.0); }

static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* float -> f16 for values well inside the normal range (test weights are in [-2, 2] and not
 * tiny): round to nearest even on the mantissa. */
static uint16_t to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u;
    int32_t e = (int32_t)((u >> 23) & 0xff) - 127 + 15;
    uint32_t mant = u & 0x7fffffu;
    if (f == 0.0f || e <= 0)
        return (uint16_t)sign; // flush tiny test values to zero
    uint32_t r = mant >> 13, rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u)))
        r++;
    if (r == 0x400u) {
        r = 0;
        e++;
    }
    return (uint16_t)(sign | ((uint32_t)e << 10) | r);
}

/* The reference's own decoders, written differently from the engine's. */
static double dec_f16(uint16_t h) {
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
    return (h & 0x8000) ? -v : v;
}
static double dec_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static double elem(const tm_tensor *t, size_t i) {
    switch (t->dtype) {
    case TM_DTYPE_F32:
        return ((const float *)t->data)[i];
    case TM_DTYPE_BF16:
        return dec_bf16(((const uint16_t *)t->data)[i]);
    case TM_DTYPE_F16:
        return dec_f16(((const uint16_t *)t->data)[i]);
    default:
        break; // the test models are f32 / bf16 / f16
    }
    return NAN;
}

static void make_tensor(tmodel *tm, tm_tensor *t, tm_dtype dt, uint64_t d0, uint64_t d1,
                        float scale, float offset) {
    size_t n = (size_t)d0 * (d1 ? d1 : 1);
    size_t es = dt == TM_DTYPE_F32 ? 4 : 2;
    void *p = malloc(n * es);
    TM_ASSERT(p && tm->n_buf < MAX_BUFS);
    tm->bufs[tm->n_buf++] = p;
    for (size_t i = 0; i < n; i++) {
        float v = offset + scale * frand(&tm->rng);
        if (dt == TM_DTYPE_F32)
            ((float *)p)[i] = v;
        else if (dt == TM_DTYPE_BF16)
            ((uint16_t *)p)[i] = to_bf16(v);
        else
            ((uint16_t *)p)[i] = to_f16(v);
    }
    t->data = p;
    t->dtype = dt;
    t->n_dim = d1 ? 2 : 1;
    t->shape[0] = d0;
    t->shape[1] = d1;
}

static tmodel *build_model(const spec *sp) {
    tmodel *tm = calloc(1, sizeof(*tm));
    TM_ASSERT(tm && sp->n_layer <= 8);
    tm->rng = sp->seed * 2654435761ull + 12345;
    tm_model_cfg *c = &tm->m.cfg;
    c->arch = sp->arch;
    c->n_layer = sp->n_layer;
    c->n_embd = sp->n_embd;
    c->n_ff = sp->n_ff;
    c->n_head = sp->n_head;
    c->n_kv_head = sp->n_kv_head;
    c->head_dim = sp->head_dim;
    c->n_vocab = sp->n_vocab;
    c->n_ctx = 4096;
    c->rms_eps = 1e-5f;
    c->rope_theta = sp->arch == TM_ARCH_QWEN2 ? 1000000.0f : 10000.0f;
    if (sp->llama3) {
        // Small original context so all three llama3 bands (kept, interpolated, slowed) occur.
        c->rope_type = TM_ROPE_LLAMA3;
        c->rope_factor = 8.0f;
        c->rope_low_freq_factor = 1.0f;
        c->rope_high_freq_factor = 4.0f;
        c->rope_orig_ctx = 64;
    }
    c->tie_embd = sp->tied;
    c->qkv_bias = sp->bias;
    c->bos_id = -1;
    c->sliding_window = sp->window;
    const uint32_t d = sp->n_embd, qd = sp->n_head * sp->head_dim;
    const uint32_t kvd = sp->n_kv_head * sp->head_dim;
    const float sd = 1.0f / sqrtf((float)d), sq = 1.0f / sqrtf((float)qd);
    const float sf = 1.0f / sqrtf((float)sp->n_ff);
    make_tensor(tm, &tm->m.embd, sp->dtype, sp->n_vocab, d, 1.0f, 0.0f);
    make_tensor(tm, &tm->m.out_norm, sp->dtype, d, 0, 0.2f, 1.0f);
    if (sp->tied)
        tm->m.lm_head = tm->m.embd;
    else
        make_tensor(tm, &tm->m.lm_head, sp->dtype, sp->n_vocab, d, sd, 0.0f);
    for (uint32_t l = 0; l < sp->n_layer; l++) {
        tm_layer_w *L = &tm->layers[l];
        make_tensor(tm, &L->attn_norm, sp->dtype, d, 0, 0.2f, 1.0f);
        // q and k scaled up so attention is far from uniform.
        make_tensor(tm, &L->wq, sp->dtype, qd, d, 2.0f * sd, 0.0f);
        make_tensor(tm, &L->wk, sp->dtype, kvd, d, 2.0f * sd, 0.0f);
        make_tensor(tm, &L->wv, sp->dtype, kvd, d, sd, 0.0f);
        if (sp->bias) {
            make_tensor(tm, &L->bq, sp->dtype, qd, 0, 0.5f, 0.0f);
            make_tensor(tm, &L->bk, sp->dtype, kvd, 0, 0.5f, 0.0f);
            make_tensor(tm, &L->bv, sp->dtype, kvd, 0, 0.5f, 0.0f);
        }
        make_tensor(tm, &L->wo, sp->dtype, d, qd, sq, 0.0f);
        make_tensor(tm, &L->ffn_norm, sp->dtype, d, 0, 0.2f, 1.0f);
        make_tensor(tm, &L->w_gate, sp->dtype, sp->n_ff, d, sd, 0.0f);
        make_tensor(tm, &L->w_up, sp->dtype, sp->n_ff, d, sd, 0.0f);
        make_tensor(tm, &L->w_down, sp->dtype, d, sp->n_ff, sf, 0.0f);
    }
    tm->m.layers = tm->layers;
    return tm;
}

static void free_model(tmodel *tm) {
    for (int i = 0; i < tm->n_buf; i++)
        free(tm->bufs[i]);
    free(tm);
}

/* ---------------------------------------------------------------------------------------------
 * the naive reference: one sequence, all positions at once, contiguous KV, doubles */

static void ref_matvec(const tm_tensor *w, const tm_tensor *b, const double *x, double *y) {
    size_t n_out = w->shape[0], n_in = w->shape[1];
    for (size_t o = 0; o < n_out; o++) {
        double s = b && b->data ? elem(b, o) : 0.0;
        for (size_t i = 0; i < n_in; i++)
            s += elem(w, o * n_in + i) * x[i];
        y[o] = s;
    }
}

static void ref_rmsnorm(const tm_tensor *w, const double *x, double *y, size_t n, double eps) {
    double ss = 0.0;
    for (size_t i = 0; i < n; i++)
        ss += x[i] * x[i];
    double sc = 1.0 / sqrt(ss / (double)n + eps);
    for (size_t i = 0; i < n; i++)
        y[i] = elem(w, i) * x[i] * sc;
}

static double ref_inv_freq(const tm_model_cfg *c, uint32_t i) {
    double f = 1.0 / pow(c->rope_theta, 2.0 * i / c->head_dim);
    if (c->rope_type != TM_ROPE_LLAMA3)
        return f;
    double wl = 2.0 * M_PI / f;
    double lo_wl = c->rope_orig_ctx / c->rope_low_freq_factor;
    double hi_wl = c->rope_orig_ctx / c->rope_high_freq_factor;
    if (wl < hi_wl)
        return f;
    if (wl > lo_wl)
        return f / c->rope_factor;
    double sm = (c->rope_orig_ctx / wl - c->rope_low_freq_factor) /
                (c->rope_high_freq_factor - c->rope_low_freq_factor);
    return (1.0 - sm) * f / c->rope_factor + sm * f;
}

static void ref_rope(const tm_model_cfg *c, double *x, uint32_t n_head, uint32_t pos) {
    uint32_t hd = c->head_dim, half = hd / 2;
    for (uint32_t h = 0; h < n_head; h++) {
        double *v = x + (size_t)h * hd;
        for (uint32_t i = 0; i < half; i++) {
            double a = pos * ref_inv_freq(c, i), x0 = v[i], x1 = v[i + half];
            v[i] = x0 * cos(a) - x1 * sin(a);
            v[i + half] = x1 * cos(a) + x0 * sin(a);
        }
    }
}

/* logits[n][n_vocab] for every position of tokens[0..n). */
static void ref_forward(const tm_model *m, const uint32_t *tokens, uint32_t n, float *logits) {
    const tm_model_cfg *c = &m->cfg;
    const size_t d = c->n_embd, hd = c->head_dim, qd = c->n_head * hd, kvd = c->n_kv_head * hd;
    const size_t f = c->n_ff;
    double *x = calloc(n * d, sizeof(double)), *h = calloc(d, sizeof(double));
    double *q = calloc(n * qd, sizeof(double)), *att = calloc(qd, sizeof(double));
    double *K = calloc(n * kvd, sizeof(double)), *V = calloc(n * kvd, sizeof(double));
    double *g = calloc(f, sizeof(double)), *u = calloc(f, sizeof(double));
    double *o = calloc(d, sizeof(double)), *sc = calloc(n, sizeof(double));
    TM_ASSERT(x && h && q && att && K && V && g && u && o && sc);
    for (uint32_t t = 0; t < n; t++)
        for (size_t i = 0; i < d; i++)
            x[t * d + i] = elem(&m->embd, tokens[t] * d + i);
    for (uint32_t l = 0; l < c->n_layer; l++) {
        const tm_layer_w *L = &m->layers[l];
        for (uint32_t t = 0; t < n; t++) {
            ref_rmsnorm(&L->attn_norm, x + t * d, h, d, c->rms_eps);
            ref_matvec(&L->wq, c->qkv_bias ? &L->bq : NULL, h, q + t * qd);
            ref_matvec(&L->wk, c->qkv_bias ? &L->bk : NULL, h, K + t * kvd);
            ref_matvec(&L->wv, c->qkv_bias ? &L->bv : NULL, h, V + t * kvd);
            ref_rope(c, q + t * qd, c->n_head, t);
            ref_rope(c, K + t * kvd, c->n_kv_head, t);
        }
        for (uint32_t t = 0; t < n; t++) {
            uint32_t p0 = c->sliding_window && t + 1 > c->sliding_window ? t + 1 - c->sliding_window
                                                                         : 0;
            for (uint32_t hh = 0; hh < c->n_head; hh++) {
                uint32_t kh = hh / (c->n_head / c->n_kv_head);
                double mx = -INFINITY, sum = 0.0;
                for (uint32_t p = p0; p <= t; p++) {
                    double s = 0.0;
                    for (size_t i = 0; i < hd; i++)
                        s += q[t * qd + hh * hd + i] * K[p * kvd + kh * hd + i];
                    sc[p] = s / sqrt((double)hd);
                    mx = fmax(mx, sc[p]);
                }
                for (uint32_t p = p0; p <= t; p++)
                    sum += (sc[p] = exp(sc[p] - mx));
                for (size_t i = 0; i < hd; i++) {
                    double a = 0.0;
                    for (uint32_t p = p0; p <= t; p++)
                        a += sc[p] / sum * V[p * kvd + kh * hd + i];
                    att[hh * hd + i] = a;
                }
            }
            ref_matvec(&L->wo, NULL, att, o);
            for (size_t i = 0; i < d; i++)
                x[t * d + i] += o[i];
            ref_rmsnorm(&L->ffn_norm, x + t * d, h, d, c->rms_eps);
            ref_matvec(&L->w_gate, NULL, h, g);
            ref_matvec(&L->w_up, NULL, h, u);
            for (size_t i = 0; i < f; i++)
                g[i] = g[i] / (1.0 + exp(-g[i])) * u[i];
            ref_matvec(&L->w_down, NULL, g, o);
            for (size_t i = 0; i < d; i++)
                x[t * d + i] += o[i];
        }
    }
    const tm_tensor *lm = m->lm_head.data ? &m->lm_head : &m->embd;
    double *lg = calloc(c->n_vocab, sizeof(double));
    TM_ASSERT(lg);
    for (uint32_t t = 0; t < n; t++) {
        ref_rmsnorm(&m->out_norm, x + t * d, h, d, c->rms_eps);
        ref_matvec(lm, NULL, h, lg);
        for (uint32_t v = 0; v < c->n_vocab; v++)
            logits[(size_t)t * c->n_vocab + v] = (float)lg[v];
    }
    free(lg);
    free(x), free(h), free(q), free(att), free(K), free(V), free(g), free(u), free(o), free(sc);
}

/* ---------------------------------------------------------------------------------------------
 * driving the engine with a chunking plan */

#define MAX_SEQ 4
#define MAX_LEN 64

/* Sequences with fixed token lists (prompt + continuation): the logits at position p depend
 * only on tokens[0..p], so any plan that feeds them can be compared with any other. */
typedef struct run {
    uint32_t n_seq;
    const uint32_t *tokens[MAX_SEQ];
    uint32_t len[MAX_SEQ];
    uint32_t table[MAX_SEQ][MAX_LEN]; /* block tables */
    uint32_t n_block[MAX_SEQ];
    float *logits[MAX_SEQ]; /* [len][n_vocab]; NaN where not produced */
} run;

/* Block ids for every sequence, disjoint, from a shuffled pool of n_kv_block. */
static void assign_blocks(run *r, uint32_t block_size, uint32_t n_kv_block, uint64_t seed) {
    uint32_t ids[512];
    TM_ASSERT(n_kv_block <= 512);
    for (uint32_t i = 0; i < n_kv_block; i++)
        ids[i] = i;
    uint64_t s = seed + 99;
    for (uint32_t i = n_kv_block - 1; i > 0; i--) {
        uint32_t j = (uint32_t)(lcg_next(&s) % (i + 1));
        uint32_t t = ids[i];
        ids[i] = ids[j];
        ids[j] = t;
    }
    uint32_t next = 0;
    for (uint32_t q = 0; q < r->n_seq; q++) {
        r->n_block[q] = TM_CEIL_DIV(r->len[q], block_size);
        for (uint32_t b = 0; b < r->n_block[q]; b++) {
            TM_ASSERT(next < n_kv_block);
            r->table[q][b] = ids[next++];
        }
    }
}

/* Feed every sequence to the end. chunk(q, pos, step) gives the chunk length of sequence q in
 * this step (0: sit out); every chunk asks for logits. Returns 0 on success. */
typedef uint32_t (*chunk_fn)(uint32_t q, uint32_t pos, uint32_t step, uint64_t *rng);

static int drive(tm_engine *eng, run *r, chunk_fn chunk, uint64_t seed) {
    const uint32_t nv = eng->model->cfg.n_vocab;
    uint32_t pos[MAX_SEQ] = {0};
    float *out = malloc((size_t)MAX_SEQ * nv * sizeof(float));
    uint64_t rng = seed;
    for (uint32_t q = 0; q < r->n_seq; q++) {
        r->logits[q] = malloc((size_t)r->len[q] * nv * sizeof(float));
        for (size_t i = 0; i < (size_t)r->len[q] * nv; i++)
            r->logits[q][i] = NAN;
    }
    for (uint32_t step = 0;; step++) {
        tm_batch_seq seqs[MAX_SEQ];
        uint32_t who[MAX_SEQ], n = 0;
        for (uint32_t q = 0; q < r->n_seq; q++) {
            if (pos[q] >= r->len[q])
                continue;
            uint32_t c = chunk(q, pos[q], step, &rng);
            c = TM_MIN(c, r->len[q] - pos[q]);
            if (c == 0)
                continue;
            seqs[n] = (tm_batch_seq){.tokens = r->tokens[q] + pos[q],
                                     .n_tok = c,
                                     .pos = pos[q],
                                     .block_table = r->table[q],
                                     .n_block = r->n_block[q],
                                     .want_logits = 1};
            who[n++] = q;
        }
        if (n == 0) {
            int done = 1;
            for (uint32_t q = 0; q < r->n_seq; q++)
                done &= pos[q] >= r->len[q];
            if (done)
                break;
            continue;
        }
        tm_err err = {0};
        tm_batch b = {.seqs = seqs, .n_seq = n};
        tm_rc rc = tm_engine_forward(eng, &b, out, &err);
        TM_CHECK_OK(rc, &err);
        if (rc) {
            free(out);
            return 1;
        }
        for (uint32_t i = 0; i < n; i++) {
            uint32_t q = who[i];
            pos[q] += seqs[i].n_tok;
            memcpy(r->logits[q] + (size_t)(pos[q] - 1) * nv, out + (size_t)i * nv,
                   nv * sizeof(float));
        }
    }
    free(out);
    return 0;
}

static void free_run(run *r) {
    for (uint32_t q = 0; q < r->n_seq; q++) {
        free(r->logits[q]);
        r->logits[q] = NULL;
    }
}

static uint32_t chunk_all(uint32_t q, uint32_t pos, uint32_t step, uint64_t *rng) {
    (void)q, (void)pos, (void)step, (void)rng;
    return MAX_LEN;
}
static uint32_t chunk_one(uint32_t q, uint32_t pos, uint32_t step, uint64_t *rng) {
    (void)q, (void)pos, (void)step, (void)rng;
    return 1;
}
static uint32_t chunk_rand7(uint32_t q, uint32_t pos, uint32_t step, uint64_t *rng) {
    (void)q, (void)pos, (void)step;
    return 1 + (uint32_t)(lcg_next(rng) % 7);
}
/* Prompt-ish first chunk, then decodes; sequences join at different steps, some sit out. */
static uint32_t chunk_mixed(uint32_t q, uint32_t pos, uint32_t step, uint64_t *rng) {
    if (step < q)
        return 0; // staggered start
    if (pos == 0)
        return 3 + 5 * q;
    return lcg_next(rng) % 4 == 0 ? 0 : 1 + (uint32_t)(lcg_next(rng) % 3 == 0 ? 5 : 0);
}

/* max |a-b| / max |b| over one row of n; rows with NaN in a (not produced) return -1. */
static double rel_err(const float *a, const float *b, uint32_t n) {
    double mx = 0.0, mb = 0.0;
    for (uint32_t i = 0; i < n; i++) {
        if (isnan(a[i]))
            return -1.0;
        mx = fmax(mx, fabs((double)a[i] - b[i]));
        mb = fmax(mb, fabs((double)b[i]));
    }
    return mb > 0 ? mx / mb : mx;
}

static tm_engine *make_engine(const tm_model *m, uint32_t n_threads, uint32_t block_size,
                              uint32_t n_kv_block) {
    tm_err err = {0};
    tm_engine *eng = NULL;
    tm_engine_opts o = {.n_threads = n_threads,
                        .block_size = block_size,
                        .n_kv_block = n_kv_block,
                        .max_seqs = MAX_SEQ,
                        .max_batched_tokens = MAX_SEQ * MAX_LEN};
    TM_CHECK_OK(tm_engine_cpu_create(m, &o, &eng, &err), &err);
    return eng;
}

/* ---------------------------------------------------------------------------------------------
 * (a)-(d) over the model variants */

static const spec SPECS[] = {
    {"llama-gqa-untied-f32", TM_ARCH_LLAMA, 2, 48, 4, 2, 12, 80, 101, 0, 0, 0, 0, TM_DTYPE_F32, 1},
    {"qwen2-bias-tied-bf16", TM_ARCH_QWEN2, 2, 64, 4, 4, 16, 96, 97, 1, 1, 0, 0, TM_DTYPE_BF16, 2},
    {"llama3-rope-gqa4-f16", TM_ARCH_LLAMA, 3, 40, 8, 2, 10, 72, 64, 0, 0, 1, 0, TM_DTYPE_F16, 3},
    {"mistral-window-bf16", TM_ARCH_MISTRAL, 2, 32, 4, 1, 8, 64, 50, 0, 0, 0, 9, TM_DTYPE_BF16, 4},
    {"qwen2-bias-untied-f32", TM_ARCH_QWEN2, 1, 24, 2, 1, 12, 40, 33, 0, 1, 1, 0, TM_DTYPE_F32, 5},
};
#define N_SPECS (sizeof(SPECS) / sizeof(SPECS[0]))

static double g_worst_ref; /* largest engine-vs-naive relative error over all variants */

static void make_tokens(uint32_t *t, uint32_t n, uint32_t n_vocab, uint64_t seed) {
    uint64_t s = seed;
    for (uint32_t i = 0; i < n; i++)
        t[i] = (uint32_t)(lcg_next(&s) % n_vocab);
}

static void check_variant(const spec *sp) {
    tmodel *tm = build_model(sp);
    const tm_model *m = &tm->m;
    const uint32_t nv = sp->n_vocab, len = 37, bs = 4, n_kv_block = 40;
    uint32_t toks[MAX_LEN];
    make_tokens(toks, len, nv, sp->seed);

    // Token-by-token decode: logits at every position; the baseline for everything below.
    tm_engine *eng = make_engine(m, 3, bs, n_kv_block);
    if (!eng) {
        free_model(tm);
        return;
    }
    run base = {.n_seq = 1, .tokens = {toks}, .len = {len}};
    assign_blocks(&base, bs, n_kv_block, sp->seed);
    TM_CHECK(drive(eng, &base, chunk_one, 1) == 0);

    // (c) the naive reference, all positions.
    float *ref = malloc((size_t)len * nv * sizeof(float));
    ref_forward(m, toks, len, ref);
    double worst = 0.0;
    for (uint32_t p = 0; p < len; p++) {
        double e = rel_err(base.logits[0] + (size_t)p * nv, ref + (size_t)p * nv, nv);
        TM_CHECK_MSG(e >= 0 && e < 1e-5, "%s: position %u: engine vs naive rel err %g", sp->name, p,
                     e);
        worst = fmax(worst, e);
    }
    g_worst_ref = fmax(g_worst_ref, worst);
    fprintf(stderr, "  %-24s engine vs naive reference: max rel err %.3g\n", sp->name, worst);

    // (a) one chunk, and random chunks of 1..7, each with a different shuffled block table, on
    // the same engine (stale KV in other blocks must not matter): bit-identical rows.
    for (int variant = 0; variant < 4; variant++) {
        run r = {.n_seq = 1, .tokens = {toks}, .len = {len}};
        assign_blocks(&r, bs, n_kv_block, sp->seed + 1000 + variant);
        TM_CHECK(drive(eng, &r, variant == 0 ? chunk_all : chunk_rand7, variant) == 0);
        int n_cmp = 0, n_same = 0;
        for (uint32_t p = 0; p < len; p++) {
            const float *a = r.logits[0] + (size_t)p * nv;
            if (isnan(a[0]))
                continue;
            n_cmp++;
            const float *b = base.logits[0] + (size_t)p * nv;
            n_same += memcmp(a, b, nv * sizeof(float)) == 0;
            double e = rel_err(a, b, nv);
            TM_CHECK_MSG(e >= 0 && e <= 1e-5, "%s: chunked p %u rel err %g", sp->name, p, e);
        }
        TM_CHECK(n_cmp >= 1);
        TM_CHECK_MSG(n_same == n_cmp, "%s: chunking variant %d: %d of %d rows bit-identical",
                     sp->name, variant, n_same, n_cmp);
        free_run(&r);
    }
    tm_engine_destroy(eng);
    free(ref);
    free_run(&base);
    free_model(tm);
}

static void test_variants(void) {
    for (size_t i = 0; i < N_SPECS; i++)
        check_variant(&SPECS[i]);
    fprintf(stderr, "  worst engine vs naive relative error: %.3g\n", g_worst_ref);
}

/* (b) batch invariance: each sequence alone (1 thread) vs all together with a mixed plan
 * (prefill chunks next to decodes, staggered, 4 threads): every produced row bit-identical. */
static void test_batch_invariance(void) {
    for (size_t si = 0; si < 2; si++) {
        const spec *sp = &SPECS[si];
        tmodel *tm = build_model(sp);
        const uint32_t nv = sp->n_vocab, bs = 8, n_kv_block = 32;
        uint32_t toks[MAX_SEQ][MAX_LEN];
        run all = {.n_seq = MAX_SEQ};
        for (uint32_t q = 0; q < MAX_SEQ; q++) {
            all.len[q] = 20 + 9 * q;
            make_tokens(toks[q], all.len[q], nv, 77 + q);
            all.tokens[q] = toks[q];
        }
        assign_blocks(&all, bs, n_kv_block, 5);
        tm_engine *e4 = make_engine(&tm->m, 4, bs, n_kv_block);
        tm_engine *e1 = make_engine(&tm->m, 1, bs, n_kv_block);
        if (!e4 || !e1) {
            tm_engine_destroy(e4);
            tm_engine_destroy(e1);
            free_model(tm);
            return;
        }
        TM_CHECK(drive(e4, &all, chunk_mixed, 3) == 0);
        int n_cmp = 0, n_same = 0;
        for (uint32_t q = 0; q < MAX_SEQ; q++) {
            run one = {.n_seq = 1, .tokens = {toks[q]}, .len = {all.len[q]}};
            assign_blocks(&one, bs, n_kv_block, 11 + q);
            TM_CHECK(drive(e1, &one, chunk_one, 0) == 0);
            for (uint32_t p = 0; p < all.len[q]; p++) {
                const float *a = all.logits[q] + (size_t)p * nv;
                if (isnan(a[0]))
                    continue;
                n_cmp++;
                n_same += memcmp(a, one.logits[0] + (size_t)p * nv, nv * sizeof(float)) == 0;
            }
            free_run(&one);
        }
        fprintf(stderr, "  %-24s batched vs alone: %d of %d rows bit-identical\n", sp->name, n_same,
                n_cmp);
        TM_CHECK(n_cmp > MAX_SEQ * 5);
        TM_CHECK(n_same == n_cmp);
        free_run(&all);
        tm_engine_destroy(e4);
        tm_engine_destroy(e1);
        free_model(tm);
    }
}

/* Bad batches are refused with TM_E_INVAL, and create validates its inputs. */
// Every architecture has an entry in the CPU engine's table (runner/engine/cpu/arch.c): create
// gets past the architecture lookup (and fails later on the empty model and options).
static void test_arch_entries(void) {
    for (int a = 0; a < TM_ARCH_COUNT; a++) {
        tm_model m = {.cfg = {.arch = (tm_arch)a}};
        tm_engine_opts o = {0};
        tm_engine *e = NULL;
        tm_err err = {0};
        TM_CHECK(tm_engine_cpu_create(&m, &o, &e, &err) != TM_OK && !e);
        TM_CHECK_MSG(!strstr(err.msg, "architecture"), "%s", err.msg);
    }
    tm_model m = {.cfg = {.arch = TM_ARCH_COUNT}};
    tm_engine_opts o = {0};
    tm_engine *e = NULL;
    tm_err err = {0};
    TM_CHECK(tm_engine_cpu_create(&m, &o, &e, &err) == TM_E_INVAL && !e);
    TM_CHECK_MSG(strstr(err.msg, "architecture ? is not supported"), "%s", err.msg);
}

static void test_errors(void) {
    tmodel *tm = build_model(&SPECS[0]);
    tm_engine *eng = make_engine(&tm->m, 2, 4, 4);
    if (!eng) {
        free_model(tm);
        return;
    }
    float out[2 * 101];
    uint32_t toks[20] = {1, 2, 3}, table[4] = {0, 1, 2, 3}, bad_table[1] = {9};
    tm_err err = {0};
    tm_batch_seq s = {
        .tokens = toks, .n_tok = 3, .block_table = table, .n_block = 1, .want_logits = 1};
    tm_batch b = {.seqs = &s, .n_seq = 1};
    TM_CHECK_OK(tm_engine_forward(eng, &b, out, &err), &err);
    s.pos = 3; // positions 3..5 need a second block
    TM_CHECK(tm_engine_forward(eng, &b, out, &err) == TM_E_INVAL);
    s.pos = 0;
    s.block_table = bad_table;
    TM_CHECK(tm_engine_forward(eng, &b, out, &err) == TM_E_INVAL);
    s.block_table = table;
    toks[1] = 101; // out of vocab
    TM_CHECK(tm_engine_forward(eng, &b, out, &err) == TM_E_INVAL);
    toks[1] = 2;
    s.n_tok = 17; // 4 blocks of 4 = 16 positions
    s.n_block = 4;
    TM_CHECK(tm_engine_forward(eng, &b, out, &err) == TM_E_INVAL);
    s.n_tok = 0;
    TM_CHECK(tm_engine_forward(eng, &b, out, &err) == TM_E_INVAL);
    tm_engine_destroy(eng);

    tm_engine_opts o = {
        .n_threads = 1, .block_size = 4, .n_kv_block = 4, .max_seqs = 1, .max_batched_tokens = 8};
    tm_engine *e2 = NULL;
    tm->layers[1].wk.shape[0] = 7; // wrong shape
    TM_CHECK(tm_engine_cpu_create(&tm->m, &o, &e2, &err) == TM_E_INVAL);
    tm->layers[1].wk.shape[0] = 24;
    o.block_size = 0;
    TM_CHECK(tm_engine_cpu_create(&tm->m, &o, &e2, &err) == TM_E_INVAL);
    o.block_size = 4;
    // Every allocation of create failing in turn: clean TM_E_NOMEM, nothing leaked.
    long live0 = tm_alloc_live();
    int n_fail_paths = 0;
    for (long k = 1; k < 200; k++) {
        tm_fault_set(TM_FAULT_ALLOC, k);
        e2 = NULL;
        tm_rc rc = tm_engine_cpu_create(&tm->m, &o, &e2, &err);
        tm_fault_set(TM_FAULT_ALLOC, 0);
        if (rc == TM_OK) {
            tm_engine_destroy(e2);
            break;
        }
        TM_CHECK(rc == TM_E_NOMEM);
        TM_CHECK(tm_alloc_live() == live0);
        n_fail_paths++;
    }
    TM_CHECK(n_fail_paths > 10);
    TM_CHECK(tm_alloc_live() == live0);
    free_model(tm);
}

/* Throughput (informational; no check). TM_ENGINE_BENCH=0 skips it; =big uses a 0.4B-parameter
 * shape (8 layers, d 2048, ff 5632, vocab 32000) instead of the small default. */
static void bench(void) {
    const char *env = getenv("TM_ENGINE_BENCH");
    if (env && strcmp(env, "0") == 0)
        return;
    spec sp = {"bench", TM_ARCH_LLAMA, 4, 512, 8, 4, 64, 1408, 4096, 0, 0, 0, 0, TM_DTYPE_BF16, 9};
    if (env && strcmp(env, "big") == 0)
        sp = (spec){"bench-big", TM_ARCH_LLAMA, 8, 2048, 16, 4, 128, 5632, 32000, 0, 0, 0,
                    0,           TM_DTYPE_BF16, 9};
    tmodel *tm = build_model(&sp);
    tm_err err = {0};
    tm_engine *eng = NULL;
    tm_engine_opts o = {
        .block_size = 16, .n_kv_block = 256, .max_seqs = 8, .max_batched_tokens = 512};
    TM_CHECK_OK(tm_engine_cpu_create(&tm->m, &o, &eng, &err), &err);
    if (!eng) {
        free_model(tm);
        return;
    }
    uint32_t toks[512], table[8][32];
    make_tokens(toks, 512, sp.n_vocab, 1);
    for (uint32_t q = 0; q < 8; q++)
        for (uint32_t b = 0; b < 32; b++)
            table[q][b] = q * 32 + b;
    float *out = malloc((size_t)8 * sp.n_vocab * sizeof(float));
    // prefill: 8 sequences x 64 tokens in one step
    tm_batch_seq s[8];
    for (uint32_t q = 0; q < 8; q++)
        s[q] = (tm_batch_seq){.tokens = toks + q * 64,
                              .n_tok = 64,
                              .pos = 0,
                              .block_table = table[q],
                              .n_block = 32,
                              .want_logits = 1};
    tm_batch b = {.seqs = s, .n_seq = 8};
    double t0 = tm_now_ms();
    TM_CHECK_OK(tm_engine_forward(eng, &b, out, &err), &err);
    double t_pre = tm_now_ms() - t0;
    // decode: 8 sequences x 1 token, 32 steps
    const int n_step = 32;
    t0 = tm_now_ms();
    for (int step = 0; step < n_step; step++) {
        for (uint32_t q = 0; q < 8; q++) {
            s[q].tokens = toks + q;
            s[q].n_tok = 1;
            s[q].pos = 64 + (uint32_t)step;
        }
        TM_CHECK_OK(tm_engine_forward(eng, &b, out, &err), &err);
    }
    double t_dec = tm_now_ms() - t0;
    // single-sequence decode
    b.n_seq = 1;
    t0 = tm_now_ms();
    for (int step = 0; step < n_step; step++) {
        s[0].pos = 64 + n_step + (uint32_t)step;
        TM_CHECK_OK(tm_engine_forward(eng, &b, out, &err), &err);
    }
    double t_dec1 = tm_now_ms() - t0;
    fprintf(stderr,
            "  bench (%u layers, d %u, ff %u, vocab %u, bf16, %u threads): prefill %.0f tok/s, "
            "decode batch 8 %.0f tok/s, decode batch 1 %.0f tok/s\n",
            sp.n_layer, sp.n_embd, sp.n_ff, sp.n_vocab, eng->opts.n_threads, 512 / (t_pre / 1e3),
            8 * n_step / (t_dec / 1e3), n_step / (t_dec1 / 1e3));
    free(out);
    tm_engine_destroy(eng);
    free_model(tm);
}

/* ---------------------------------------------------------------------------------------------
 * (e) Hugging Face fixtures */

static double g_worst_hf = 0.0;

static void check_fixture(const char *path) {
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    TM_CHECK_MSG(root != NULL, "%s: %s", path, jerr.text);
    if (!root)
        return;
    const char *build = getenv("TM_BUILD");
    json_t *args = json_object_get(root, "mkmodel_args");
    const char *model_dir = json_string_value(json_object_get(root, "model_dir"));
    if (model_dir && !args)
        args = json_array(); // a checked-in model: nothing to build (freed below)
    else
        json_incref(args);
    json_t *prompt = json_object_get(root, "prompt_ids");
    json_t *greedy = json_object_get(root, "greedy_ids");
    json_t *logits = json_object_get(root, "logits");
    TM_CHECK(json_is_array(args) && json_is_array(prompt) && json_is_array(greedy) &&
             json_is_array(logits));
    if (!json_is_array(args) || !json_is_array(prompt) || !json_is_array(greedy) ||
        !json_is_array(logits) || !build) {
        TM_CHECK_MSG(build != NULL, "TM_BUILD not set (run through ctest)");
        json_decref(args);
        json_decref(root);
        return;
    }
    char dir[] = "/tmp/tm_test_engine_XXXXXX";
    TM_ASSERT(mkdtemp(dir));
    char cmd[4096];
    int n = snprintf(cmd, sizeof(cmd), "'%s/mkmodel' --out '%s/m'", build, dir);
    for (size_t i = 0; i < json_array_size(args); i++)
        n += snprintf(cmd + n, sizeof(cmd) - (size_t)n, " '%s'",
                      json_string_value(json_array_get(args, i)));
    n += snprintf(cmd + n, sizeof(cmd) - (size_t)n, " >/dev/null");
    TM_ASSERT(n < (int)sizeof(cmd));
    int st = model_dir ? 0 : system(cmd);
    TM_CHECK_MSG(st == 0, "%s: mkmodel failed: %s", path, cmd);
    tm_model *m = NULL;
    tm_engine *eng = NULL;
    tm_err err = {0};
    char mdir[4200];
    const char *src = getenv("TM_SRC");
    if (model_dir)
        snprintf(mdir, sizeof(mdir), "%s/%s", src ? src : ".", model_dir);
    else
        snprintf(mdir, sizeof(mdir), "%s/m", dir);
    float *out = NULL;
    if (st != 0)
        goto done;
    TM_CHECK_OK(tm_model_load(mdir, &m, &err), &err);
    if (!m)
        goto done;
    const uint32_t nv = m->cfg.n_vocab, n_prompt = (uint32_t)json_array_size(prompt);
    const uint32_t n_gen = (uint32_t)json_array_size(greedy);
    TM_CHECK(json_array_size(logits) == n_gen && n_gen >= 1);
    uint32_t total = n_prompt + n_gen;
    tm_engine_opts o = {.n_threads = 0,
                        .block_size = 16,
                        .n_kv_block = TM_CEIL_DIV(total, 16),
                        .max_seqs = 1,
                        .max_batched_tokens = n_prompt};
    TM_CHECK_OK(tm_engine_cpu_create(m, &o, &eng, &err), &err);
    if (!eng)
        goto done;
    uint32_t *toks = malloc(total * sizeof(uint32_t)), table[64];
    for (uint32_t i = 0; i < o.n_kv_block && i < 64; i++)
        table[i] = o.n_kv_block - 1 - i; // reversed: paging matters
    for (uint32_t i = 0; i < n_prompt; i++)
        toks[i] = (uint32_t)json_integer_value(json_array_get(prompt, i));
    for (uint32_t i = 0; i < n_gen; i++)
        toks[n_prompt + i] = (uint32_t)json_integer_value(json_array_get(greedy, i));
    out = malloc(nv * sizeof(float));
    double worst = 0.0, score_tm = 0.0, score_hf = 0.0, worst_lp = 0.0;
    int greedy_ok = 1;
    for (uint32_t g = 0; g < n_gen; g++) {
        // step 0: the whole prompt; step g: greedy token g-1 as a decode
        tm_batch_seq s = {.tokens = g == 0 ? toks : toks + n_prompt + g - 1,
                          .n_tok = g == 0 ? n_prompt : 1,
                          .pos = g == 0 ? 0 : n_prompt + g - 1,
                          .block_table = table,
                          .n_block = o.n_kv_block,
                          .want_logits = 1};
        tm_batch b = {.seqs = &s, .n_seq = 1};
        TM_CHECK_OK(tm_engine_forward(eng, &b, out, &err), &err);
        json_t *row = json_array_get(logits, g);
        TM_CHECK(json_array_size(row) == nv);
        if (json_array_size(row) != nv)
            break;
        double mx = 0.0, mb = 0.0;
        uint32_t arg = 0;
        for (uint32_t v = 0; v < nv; v++) {
            double hf = json_number_value(json_array_get(row, v));
            mx = fmax(mx, fabs(out[v] - hf));
            mb = fmax(mb, fabs(hf));
            if (out[v] > out[arg])
                arg = v;
        }
        double e = mb > 0 ? mx / mb : mx;
        worst = fmax(worst, e);
        // Scoring: the greedy continuation's token logprobs, as the runner computes them for
        // scoring records (tm_sample_logprobs on the engine's logits), against the log-softmax
        // of transformers' logits.
        const uint32_t id = toks[n_prompt + g];
        float lp = 0.0f;
        uint32_t am = 0;
        TM_CHECK_OK(tm_sample_logprobs(out, nv, id, 0, &lp, NULL, NULL, &am, &err), &err);
        double hmax = -INFINITY, hsum = 0.0;
        for (uint32_t v = 0; v < nv; v++)
            hmax = fmax(hmax, json_number_value(json_array_get(row, v)));
        for (uint32_t v = 0; v < nv; v++)
            hsum += exp(json_number_value(json_array_get(row, v)) - hmax);
        double hf_lp = json_number_value(json_array_get(row, id)) - hmax - log(hsum);
        worst_lp = fmax(worst_lp, fabs(lp - hf_lp));
        score_tm += lp;
        score_hf += hf_lp;
        TM_CHECK_MSG(e < 1e-4, "%s: step %u: rel err %g", path, g, e);
        if (arg != toks[n_prompt + g])
            greedy_ok = 0;
    }
    TM_CHECK_MSG(greedy_ok, "%s: greedy tokens differ from HF", path);
    TM_CHECK_MSG(worst_lp < 1e-4 && fabs(score_tm - score_hf) < 1e-4 * n_gen,
                 "%s: continuation score %.6f vs transformers %.6f (worst token %.3g)", path,
                 score_tm, score_hf, worst_lp);
    fprintf(stderr, "  %s: greedy continuation score %.6f, transformers %.6f\n", path, score_tm,
            score_hf);
    fprintf(stderr, "  %s: %u prompt ids, %u logit rows, max rel err %.3g, greedy %s\n", path,
            n_prompt, n_gen, worst, greedy_ok ? "equal" : "DIFFERENT");
    g_worst_hf = fmax(g_worst_hf, worst);
    free(toks);
done:
    free(out);
    tm_engine_destroy(eng);
    tm_model_destroy(m);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "  could not remove %s\n", dir);
    json_decref(args);
    json_decref(root);
}

static void test_hf_fixtures(void) {
    const char *src = getenv("TM_SRC"), *build = getenv("TM_BUILD");
    char dir[4096], mk[4096];
    snprintf(mk, sizeof(mk), "%s/mkmodel", build ? build : ".");
    if (access(mk, X_OK) != 0) {
        // A targeted build (--target test_engine) does not build mkmodel.
        fprintf(stderr, "  %s not built (build the mkmodel target): HF fixtures skipped\n", mk);
        return;
    }
    snprintf(dir, sizeof(dir), "%s/tests/fixtures/hf", src ? src : ".");
    DIR *d = opendir(dir);
    int n = 0;
    if (d) {
        struct dirent *e;
        char names[64][256];
        int n_names = 0;
        while ((e = readdir(d)) != NULL && n_names < 64) {
            size_t l = strlen(e->d_name);
            if (l > 5 && l < 256 && strcmp(e->d_name + l - 5, ".json") == 0)
                snprintf(names[n_names++], 256, "%s", e->d_name);
        }
        closedir(d);
        for (int i = 0; i < n_names; i++) {
            char path[4400];
            snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
            check_fixture(path);
            n++;
        }
    }
    if (n == 0)
        fprintf(stderr, "  no HF fixtures in %s: that part skipped\n", dir);
    else
        fprintf(stderr, "  %d HF fixtures, worst relative error %.3g\n", n, g_worst_hf);
}

int main(void) {
    TM_RUN(test_variants);
    TM_RUN(test_batch_invariance);
    TM_RUN(test_arch_entries);
    TM_RUN(test_errors);
    TM_RUN(test_hf_fixtures);
    TM_RUN(bench);
    return tm_test_report();
}
