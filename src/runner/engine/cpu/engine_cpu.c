/* runner/engine/cpu/engine_cpu.c - the CPU reference engine: the Llama-family forward pass
 * (Llama, Qwen2, Mistral) in fp32 over f32/f16/bf16 weights, with a paged fp32 KV cache. With
 * opts.kv_dtype fp8 (or bf16) each K/V element is rounded to that type when written and the cache
 * holds the rounded value in fp32: the reference of a smaller cache, not a smaller one.
 *
 * A step takes a batch of sequences, each a chunk of n_tok tokens at positions [pos, pos+n_tok)
 * (prefill chunks and decodes mixed). All tokens of the step are stacked into one [T][dim]
 * activation matrix, so every weight row is converted to fp32 once per step and reused for all
 * T tokens. Work is split across a persistent thread pool: matmuls by output rows, attention by
 * (sequence, head, block of query tokens), the element-wise ops by token ranges.
 *
 * Invariants: every (token, output) value is computed by the same code in the same order whatever
 * the batch composition, prompt chunking or thread count (see ops.h), so logits are bit-identical
 * across those. All memory (KV cache, activations, per-thread scratch) is allocated at create;
 * forward allocates nothing. One thread drives an engine. Not supported: tp_size > 1. */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "runner/engine/engine.h"
#include "runner/engine/cpu/arch.h"
#include "runner/engine/cpu/ops.h"
#include "runner/tp/shard.h"
#include "runner/engine/cpu/thread_pool.h"

#define TOK_PER_ITEM 16      /* tokens per work item of the element-wise ops */
#define ATTN_TOK_PER_ITEM 32 /* query tokens per attention work item */
#define MAX_MATS 3           /* matmuls sharing one input, run as one pool run */
#define MM_MIN_MACS 65536    /* least multiply-adds per matmul work item */

typedef struct cpu_impl cpu_impl;

/* Several matmuls over the same input rows, split into row chunks as one pool run. */
typedef struct mm_job {
    tm_k_matmul_args a[MAX_MATS];
    uint32_t n_mat;
    uint32_t rows_per_item;
    uint32_t item0[MAX_MATS + 1]; /* first item of each matmul; item0[n_mat] = total */
    cpu_impl *impl;
} mm_job;

/* Per-step element-wise work, split by token ranges. */
typedef struct tok_job {
    cpu_impl *impl;
    uint32_t n_tok;
    uint32_t layer;
    const tm_batch *b;
} tok_job;

typedef struct attn_item {
    uint32_t seq;   /* index into the batch */
    uint32_t t0;    /* first query token within the sequence's chunk */
    uint32_t n_tok; /* query tokens */
} attn_item;

struct cpu_impl {
    tm_engine eng;     /* eng.impl points back here */
    const tm_model *m; /* borrowed, or the owned shard when tp_size > 1 */
    tm_model *shard;   /* owned tensor-parallel shard of eng.model, or NULL */
    uint32_t vocab0;   /* first vocabulary row of this shard (0 without TP) */
    tm_model_cfg cfg;
    tm_cpu_pool *pool; /* owned */
    uint32_t n_thread;
    uint32_t q_dim, kv_dim, half;
    uint32_t max_pos;         /* n_kv_block * block_size: longest addressable sequence */
    size_t layer_kv_floats;   /* floats of K (or V) per layer */
    float *k_cache, *v_cache; /* owned: [layer][block][block_size][kv_dim] each */
    float *inv_freq;          /* owned: [head_dim/2] */
    float *attn_norm;         /* owned: [layer][n_embd] fp32 copies of the norm weights */
    float *ffn_norm;          /* owned: [layer][n_embd] */
    float *out_norm;          /* owned: [n_embd] */
    const tm_tensor *lm_head; /* borrowed from m: lm_head or embd when tied */
    /* activations, owned, sized for max_batched_tokens rows (T) */
    float *x;              /* [T][n_embd] residual stream */
    float *h;              /* [T][n_embd] normed */
    float *q;              /* [T][q_dim] */
    float *k;              /* [T][kv_dim] */
    float *v;              /* [T][kv_dim] */
    float *att;            /* [T][q_dim] */
    float *gate;           /* [T][n_ff] */
    float *up;             /* [T][n_ff] */
    float *cos, *sin;      /* [T][head_dim/2] */
    uint32_t *pos;         /* [T] position of each stacked token */
    uint32_t *tok_seq;     /* [T] batch index of each stacked token */
    uint32_t *seq_tok0;    /* [max_seqs] first stacked token of each sequence */
    float *last;           /* [max rows][n_embd] final-normed rows that want logits */
    attn_item *attn_items; /* [max_seqs + T / ATTN_TOK_PER_ITEM + ...] */
    uint32_t max_attn_items;
    /* per-thread scratch, owned */
    float *wbuf; /* [n_thread][TM_CPU_MM_ROWS * max_in] */
    size_t wbuf_floats;
    float *scores; /* [n_thread][max_pos] */
    /* the step being run (valid during forward) */
    uint32_t n_attn_items;
    uint32_t attn_layer;
    const tm_batch *b;
};

static void cpu_destroy(tm_engine *eng);
static tm_rc cpu_forward(tm_engine *eng, const tm_batch *b, float *logits, tm_err *err);
static tm_rc cpu_kv_copy(tm_engine *eng, uint32_t src, uint32_t dst, uint32_t n_tok, tm_err *err);

static const tm_engine_ops cpu_ops = {
    .name = "cpu",
    .kv_auto = "f32",
    .forward = cpu_forward,
    .kv_copy = cpu_kv_copy,
    .destroy = cpu_destroy,
};

/* ---- matmul runs ---- */

static void mm_item(void *ctx, uint32_t item, uint32_t tid) {
    mm_job *j = ctx;
    uint32_t mi = 0;
    while (item >= j->item0[mi + 1])
        mi++;
    const tm_k_matmul_args *a = &j->a[mi];
    uint32_t o0 = (item - j->item0[mi]) * j->rows_per_item;
    uint32_t o1 = TM_MIN(o0 + j->rows_per_item, a->n_out);
    tm_cpu_matmul_rows(a, o0, o1, j->impl->wbuf + (size_t)tid * j->impl->wbuf_floats);
}

static void mm_run(cpu_impl *impl, mm_job *j) {
    uint32_t total_rows = 0;
    for (uint32_t i = 0; i < j->n_mat; i++)
        total_rows += j->a[i].n_out;
    // About 4 items per thread for balance, but at least MM_MIN_MACS of work per item so small
    // decode steps do not pay for waking every thread; in whole TM_CPU_MM_ROWS blocks.
    uint32_t want = TM_CEIL_DIV(total_rows, impl->n_thread * 4);
    uint64_t macs_per_row = (uint64_t)j->a[0].n_in * j->a[0].n_tok;
    uint64_t min_rows = TM_CEIL_DIV(MM_MIN_MACS, TM_MAX(macs_per_row, 1));
    want = (uint32_t)TM_MAX((uint64_t)want, TM_MIN(min_rows, (uint64_t)total_rows));
    want = TM_CEIL_DIV(want, TM_CPU_MM_ROWS) * TM_CPU_MM_ROWS;
    j->rows_per_item = TM_MAX(want, (uint32_t)TM_CPU_MM_ROWS);
    j->item0[0] = 0;
    for (uint32_t i = 0; i < j->n_mat; i++)
        j->item0[i + 1] = j->item0[i] + TM_CEIL_DIV(j->a[i].n_out, j->rows_per_item);
    j->impl = impl;
    tm_cpu_pool_run(impl->pool, mm_item, j, j->item0[j->n_mat]);
}

static tm_k_matmul_args mm_args(float *out, const float *x, const tm_tensor *w,
                                const tm_tensor *bias, const float *res, uint32_t n_tok) {
    tm_k_matmul_args a = {
        .out = out,
        .x = x,
        .w = w->data,
        .w_dtype = w->dtype,
        .wq = w->quant != TM_QUANT_NONE ? w : NULL,
        .bias = bias ? bias->data : NULL,
        .bias_dtype = bias ? bias->dtype : TM_DTYPE_F32,
        .res = res,
        .n_tok = n_tok,
        .n_in = (uint32_t)w->shape[1],
        .n_out = (uint32_t)w->shape[0],
        .ld_out = (uint32_t)w->shape[0],
    };
    return a;
}

/* ---- element-wise runs over token ranges ---- */

static void tok_range(const tok_job *j, uint32_t item, uint32_t *t0, uint32_t *t1) {
    *t0 = item * TOK_PER_ITEM;
    *t1 = TM_MIN(*t0 + TOK_PER_ITEM, j->n_tok);
}

static uint32_t tok_items(uint32_t n_tok) { return TM_CEIL_DIV(n_tok, TOK_PER_ITEM); }

/* h = RMSNorm(x) of the item's tokens with this layer's row of w_all ([n_layer][n_embd]). */
static void norm_item(const tok_job *j, uint32_t item, const float *w_all) {
    cpu_impl *impl = j->impl;
    uint32_t t0, t1;
    tok_range(j, item, &t0, &t1);
    const uint32_t d = impl->cfg.n_embd;
    tm_k_rmsnorm_args a = {
        .out = impl->h + (size_t)t0 * d,
        .x = impl->x + (size_t)t0 * d,
        .w = w_all + (size_t)j->layer * d,
        .w_dtype = TM_DTYPE_F32,
        .n_row = t1 - t0,
        .n_col = d,
        .eps = impl->cfg.rms_eps,
    };
    tm_cpu_rmsnorm(&a);
}

static void attn_norm_item(void *ctx, uint32_t item, uint32_t tid) {
    (void)tid;
    const tok_job *j = ctx;
    norm_item(j, item, j->impl->attn_norm);
}

static void ffn_norm_item(void *ctx, uint32_t item, uint32_t tid) {
    (void)tid;
    const tok_job *j = ctx;
    norm_item(j, item, j->impl->ffn_norm);
}

/* One cache row (kv_dim floats, heads of hd) as a KV cache of dtype kvt stores it: the cache
 * holds the rounded values widened to fp32 (exactly what reading the smaller entries gives). */
static void kv_round(tm_kv_dtype kvt, float *row, uint32_t kv_dim, uint32_t hd) {
    if (kvt == TM_KV_DTYPE_FP8) {
        for (uint32_t i = 0; i < kv_dim; i++)
            row[i] = tm_kv_fp8_round(row[i]);
    } else if (kvt == TM_KV_DTYPE_BF16) {
        for (uint32_t i = 0; i < kv_dim; i++)
            row[i] = tm_bf16_to_f32(tm_f32_to_bf16(row[i]));
    } else if (kvt == TM_KV_DTYPE_FP8_HEAD) {
        for (uint32_t h0 = 0; h0 < kv_dim; h0 += hd) {
            float amax = 0.0f;
            for (uint32_t i = 0; i < hd; i++)
                amax = fmaxf(amax, fabsf(row[h0 + i]));
            const float sc = amax > 0.0f ? amax / 448.0f : 1.0f;
            for (uint32_t i = 0; i < hd; i++)
                row[h0 + i] = tm_kv_fp8_round(row[h0 + i] / sc) * sc;
        }
    }
}

/* RoPE on q and k, then K and V rows into the paged cache (rounded to the KV dtype). */
static void rope_kv_item(void *ctx, uint32_t item, uint32_t tid) {
    (void)tid;
    tok_job *j = ctx;
    cpu_impl *impl = j->impl;
    uint32_t t0, t1;
    tok_range(j, item, &t0, &t1);
    const uint32_t hd = impl->cfg.head_dim, kv_dim = impl->kv_dim;
    const uint32_t bs = impl->eng.opts.block_size;
    tm_k_rope_args rq = {
        .x = impl->q + (size_t)t0 * impl->q_dim,
        .cos = impl->cos + (size_t)t0 * impl->half,
        .sin = impl->sin + (size_t)t0 * impl->half,
        .n_tok = t1 - t0,
        .n_head = impl->cfg.n_head,
        .head_dim = hd,
        .ld_x = impl->q_dim,
    };
    tm_cpu_rope(&rq);
    tm_k_rope_args rk = rq;
    rk.x = impl->k + (size_t)t0 * kv_dim;
    rk.n_head = impl->cfg.n_kv_head;
    rk.ld_x = kv_dim;
    tm_cpu_rope(&rk);
    float *kc = impl->k_cache + (size_t)j->layer * impl->layer_kv_floats;
    float *vc = impl->v_cache + (size_t)j->layer * impl->layer_kv_floats;
    for (uint32_t t = t0; t < t1; t++) {
        const tm_batch_seq *s = &j->b->seqs[impl->tok_seq[t]];
        uint32_t p = impl->pos[t];
        size_t row = (size_t)s->block_table[p / bs] * bs + p % bs;
        memcpy(kc + row * kv_dim, impl->k + (size_t)t * kv_dim, kv_dim * sizeof(float));
        memcpy(vc + row * kv_dim, impl->v + (size_t)t * kv_dim, kv_dim * sizeof(float));
        if (impl->eng.opts.kv_dtype != TM_KV_DTYPE_AUTO) {
            kv_round(impl->eng.opts.kv_dtype, kc + row * kv_dim, kv_dim, hd);
            kv_round(impl->eng.opts.kv_dtype, vc + row * kv_dim, kv_dim, hd);
        }
    }
}

static void silu_item(void *ctx, uint32_t item, uint32_t tid) {
    (void)tid;
    tok_job *j = ctx;
    cpu_impl *impl = j->impl;
    uint32_t t0, t1;
    tok_range(j, item, &t0, &t1);
    const size_t f = impl->cfg.n_ff;
    tm_k_silu_mul_args a = {
        .out = impl->gate + t0 * f,
        .gate = impl->gate + t0 * f,
        .up = impl->up + t0 * f,
        .n = (t1 - t0) * f,
    };
    tm_cpu_silu_mul(&a);
}

/* ---- attention: items are (sequence, head, block of query tokens) ---- */

static void attn_item_run(void *ctx, uint32_t item, uint32_t tid) {
    cpu_impl *impl = ctx;
    const uint32_t n_head = impl->cfg.n_head;
    const attn_item *it = &impl->attn_items[item / n_head];
    const uint32_t h = item % n_head;
    const tm_batch_seq *s = &impl->b->seqs[it->seq];
    const size_t tok = (size_t)impl->seq_tok0[it->seq] + it->t0;
    tm_k_attn_args a = {
        .out = impl->att + tok * impl->q_dim,
        .q = impl->q + tok * impl->q_dim,
        .k_cache = impl->k_cache + (size_t)impl->attn_layer * impl->layer_kv_floats,
        .v_cache = impl->v_cache + (size_t)impl->attn_layer * impl->layer_kv_floats,
        .block_table = s->block_table,
        .pos0 = s->pos + it->t0,
        .n_tok = it->n_tok,
        .n_head = n_head,
        .n_kv_head = impl->cfg.n_kv_head,
        .head_dim = impl->cfg.head_dim,
        .block_size = impl->eng.opts.block_size,
        .ld_q = impl->q_dim,
        .window = impl->cfg.sliding_window,
        .scale = 1.0f / sqrtf((float)impl->cfg.head_dim),
    };
    tm_cpu_attn_head(&a, h, impl->scores + (size_t)tid * impl->max_pos);
}

/* ---- forward ---- */

// TP: h holds this rank's partial [T][n_embd] product; sum it across ranks and add it to x.
static void add_reduced(cpu_impl *impl, uint32_t T) {
    const size_t n = (size_t)T * impl->cfg.n_embd;
    impl->eng.opts.allreduce(impl->eng.opts.allreduce_ctx, impl->h, n);
    for (size_t i = 0; i < n; i++)
        impl->x[i] += impl->h[i];
}

static tm_rc cpu_forward(tm_engine *eng, const tm_batch *b, float *logits, tm_err *err) {
    cpu_impl *impl = eng->impl;
    const tm_model *m = impl->m;
    const tm_model_cfg *c = &impl->cfg;
    const uint32_t d = c->n_embd;
    uint32_t T = 0;
    uint64_t n_bt = 0;
    tm_rc rc = tm_batch_check(b, &impl->eng.opts, impl->max_pos, impl->eng.model->cfg.n_vocab,
                              "cpu forward", &T, &n_bt, err);
    if (rc)
        return rc;
    if (T == 0)
        return TM_OK;

    // Stack the tokens, embed them, and build the rope tables for their positions.
    uint32_t t = 0, n_attn = 0;
    for (uint32_t i = 0; i < b->n_seq; i++) {
        const tm_batch_seq *s = &b->seqs[i];
        impl->seq_tok0[i] = t;
        for (uint32_t k = 0; k < s->n_tok; k++, t++) {
            impl->pos[t] = s->pos + k;
            impl->tok_seq[t] = i;
            uint32_t row = s->tokens[k] - impl->vocab0; // wraps when below the shard
            if (row < c->n_vocab)
                tm_dtype_to_f32(m->embd.data, m->embd.dtype, (size_t)row * d, d,
                                impl->x + (size_t)t * d);
            else // another rank's vocabulary slice: it contributes the row to the sum
                memset(impl->x + (size_t)t * d, 0, d * sizeof(float));
        }
        for (uint32_t t0 = 0; t0 < s->n_tok; t0 += ATTN_TOK_PER_ITEM) {
            TM_ASSERT(n_attn < impl->max_attn_items);
            impl->attn_items[n_attn++] =
                (attn_item){.seq = i, .t0 = t0, .n_tok = TM_MIN(ATTN_TOK_PER_ITEM, s->n_tok - t0)};
        }
    }
    const int tp = impl->eng.opts.tp_size > 1;
    if (tp)
        impl->eng.opts.allreduce(impl->eng.opts.allreduce_ctx, impl->x, (size_t)T * d);
    tm_cpu_rope_table(impl->pos, T, impl->inv_freq, c->head_dim, impl->cos, impl->sin);
    impl->b = b;
    impl->n_attn_items = n_attn;

    for (uint32_t l = 0; l < c->n_layer; l++) {
        const tm_layer_w *L = &m->layers[l];
        tok_job tj = {.impl = impl, .n_tok = T, .layer = l, .b = b};
        tm_cpu_pool_run(impl->pool, attn_norm_item, &tj, tok_items(T));

        mm_job qkv = {.n_mat = 3};
        qkv.a[0] = mm_args(impl->q, impl->h, &L->wq, c->qkv_bias ? &L->bq : NULL, NULL, T);
        qkv.a[1] = mm_args(impl->k, impl->h, &L->wk, c->qkv_bias ? &L->bk : NULL, NULL, T);
        qkv.a[2] = mm_args(impl->v, impl->h, &L->wv, c->qkv_bias ? &L->bv : NULL, NULL, T);
        mm_run(impl, &qkv);

        tm_cpu_pool_run(impl->pool, rope_kv_item, &tj, tok_items(T));
        impl->attn_layer = l;
        tm_cpu_pool_run(impl->pool, attn_item_run, impl, n_attn * c->n_head);

        // x = x + att @ wo^T (with TP: each rank's partial product, summed across ranks)
        mm_job o = {.n_mat = 1};
        o.a[0] = mm_args(tp ? impl->h : impl->x, impl->att, &L->wo, NULL, tp ? NULL : impl->x, T);
        mm_run(impl, &o);
        if (tp)
            add_reduced(impl, T);

        tm_cpu_pool_run(impl->pool, ffn_norm_item, &tj, tok_items(T));
        mm_job gu = {.n_mat = 2};
        gu.a[0] = mm_args(impl->gate, impl->h, &L->w_gate, NULL, NULL, T);
        gu.a[1] = mm_args(impl->up, impl->h, &L->w_up, NULL, NULL, T);
        mm_run(impl, &gu);
        tm_cpu_pool_run(impl->pool, silu_item, &tj, tok_items(T));
        // x = x + act @ w_down^T
        mm_job dn = {.n_mat = 1};
        dn.a[0] = mm_args(tp ? impl->h : impl->x, impl->gate, &L->w_down, NULL, tp ? NULL : impl->x,
                          T);
        mm_run(impl, &dn);
        if (tp)
            add_reduced(impl, T);
    }

    // Final norm and lm_head for the last tm_batch_seq_rows tokens of each sequence.
    uint32_t n_want = 0;
    for (uint32_t i = 0; i < b->n_seq; i++) {
        const tm_batch_seq *s = &b->seqs[i];
        const uint32_t n_rows = tm_batch_seq_rows(s);
        for (uint32_t k = s->n_tok - n_rows; k < s->n_tok; k++) {
            const float *src = impl->x + (size_t)(impl->seq_tok0[i] + k) * d;
            memcpy(impl->last + (size_t)n_want * d, src, d * sizeof(float));
            n_want++;
        }
    }
    if (n_want == 0)
        return TM_OK;
    tm_k_rmsnorm_args na = {
        .out = impl->last,
        .x = impl->last,
        .w = impl->out_norm,
        .w_dtype = TM_DTYPE_F32,
        .n_row = n_want,
        .n_col = d,
        .eps = c->rms_eps,
    };
    tm_cpu_rmsnorm(&na);
    mm_job lm = {.n_mat = 1};
    lm.a[0] = mm_args(logits, impl->last, impl->lm_head, NULL, NULL, n_want);
    mm_run(impl, &lm);
    return TM_OK;
}

/* ---- create / destroy ---- */

static tm_rc check_model(const tm_model *m, tm_err *err) {
    const tm_model_cfg *c = &m->cfg;
    if (!c->n_layer || !c->n_embd || !c->n_ff || !c->n_head || !c->n_kv_head || !c->head_dim ||
        !c->n_vocab)
        return TM_ERR(err, TM_E_INVAL, "cpu engine: zero dimension in model config");
    if (c->n_head % c->n_kv_head || c->head_dim % 2)
        return TM_ERR(err, TM_E_INVAL, "cpu engine: n_head %u / n_kv_head %u / head_dim %u",
                      c->n_head, c->n_kv_head, c->head_dim);
    if (!(c->rope_theta > 0.0f))
        return TM_ERR(err, TM_E_INVAL, "cpu engine: rope_theta %g", (double)c->rope_theta);
    if (c->rope_type == TM_ROPE_LLAMA3 &&
        (!(c->rope_factor > 0.0f) || c->rope_high_freq_factor == c->rope_low_freq_factor ||
         !(c->rope_low_freq_factor > 0.0f) || !(c->rope_high_freq_factor > 0.0f) ||
         c->rope_orig_ctx == 0))
        return TM_ERR(err, TM_E_INVAL, "cpu engine: bad llama3 rope scaling parameters");
    return tm_model_check_weights_quant(m, "cpu engine", err); // rows read dequantized
}

static void *alloc_floats(size_t n, int *failed) {
    void *p = tm_malloc(n * sizeof(float));
    if (!p)
        *failed = 1;
    return p;
}

static tm_rc llama_create(const tm_model *m, const tm_engine_opts *opts, tm_engine **out,
                          tm_err *err) {
    if (!opts->block_size || !opts->n_kv_block || !opts->max_seqs || !opts->max_batched_tokens)
        return TM_ERR(err, TM_E_INVAL,
                      "cpu engine: block_size, n_kv_block, max_seqs and max_batched_tokens must "
                      "be > 0");
    if (opts->tp_size > 1 && !opts->allreduce)
        return TM_ERR(err, TM_E_INVAL, "cpu engine: tp_size %u without an all-reduce",
                      opts->tp_size);
    tm_model *shard = NULL;
    uint32_t vocab0 = 0;
    const tm_model *full = m;
    if (opts->tp_size > 1 && tm_model_is_quantized(m))
        return TM_ERR(err, TM_E_INVAL,
                      "cpu engine: tensor parallel (tp_size %u) of quantized weights is not "
                      "supported",
                      opts->tp_size);
    if (opts->tp_size > 1) {
        tm_rc rc = tm_shard_create(full, opts->tp_rank, opts->tp_size, &shard, &vocab0, err);
        if (rc)
            return rc;
        m = shard;
    }
    tm_rc rc = check_model(m, err);
    if (rc) {
        tm_shard_destroy(shard);
        return rc;
    }
    const tm_model_cfg *c = &m->cfg;
    uint64_t max_pos = (uint64_t)opts->n_kv_block * opts->block_size;
    cpu_impl *impl = max_pos > UINT32_MAX ? NULL : tm_calloc(1, sizeof(*impl));
    if (!impl) {
        tm_shard_destroy(shard);
        if (max_pos > UINT32_MAX)
            return TM_ERR(err, TM_E_INVAL, "cpu engine: KV pool of %llu positions too large",
                          (unsigned long long)max_pos);
        return TM_ERR(err, TM_E_NOMEM, "cpu engine header");
    }
    impl->shard = shard;
    impl->vocab0 = vocab0;
    impl->eng.ops = &cpu_ops;
    impl->eng.model = full;
    impl->eng.opts = *opts;
    impl->eng.impl = impl;
    impl->m = m;
    impl->cfg = *c;
    impl->n_thread = opts->n_threads;
    if (impl->n_thread == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        impl->n_thread = n > 0 ? (uint32_t)n : 1;
    }
    impl->eng.opts.n_threads = impl->n_thread;
    impl->q_dim = c->n_head * c->head_dim;
    impl->kv_dim = c->n_kv_head * c->head_dim;
    impl->half = c->head_dim / 2;
    impl->max_pos = (uint32_t)max_pos;
    impl->lm_head = m->lm_head.data ? &m->lm_head : &m->embd;

    const size_t T = opts->max_batched_tokens, S = opts->max_seqs, d = c->n_embd;
    impl->layer_kv_floats = (size_t)max_pos * impl->kv_dim;
    size_t max_in = TM_MAX(TM_MAX((size_t)d, (size_t)impl->q_dim), (size_t)c->n_ff);
    impl->wbuf_floats = TM_CPU_MM_ROWS * max_in;
    impl->max_attn_items = (uint32_t)(S + T / ATTN_TOK_PER_ITEM + 1);

    int failed = 0;
    impl->k_cache = tm_calloc((size_t)c->n_layer * impl->layer_kv_floats, sizeof(float));
    impl->v_cache = tm_calloc((size_t)c->n_layer * impl->layer_kv_floats, sizeof(float));
    if (!impl->k_cache || !impl->v_cache)
        failed = 1;
    impl->inv_freq = alloc_floats(impl->half, &failed);
    impl->attn_norm = alloc_floats((size_t)c->n_layer * d, &failed);
    impl->ffn_norm = alloc_floats((size_t)c->n_layer * d, &failed);
    impl->out_norm = alloc_floats(d, &failed);
    impl->x = alloc_floats(T * d, &failed);
    impl->h = alloc_floats(T * d, &failed);
    impl->q = alloc_floats(T * impl->q_dim, &failed);
    impl->k = alloc_floats(T * impl->kv_dim, &failed);
    impl->v = alloc_floats(T * impl->kv_dim, &failed);
    impl->att = alloc_floats(T * impl->q_dim, &failed);
    impl->gate = alloc_floats(T * c->n_ff, &failed);
    impl->up = alloc_floats(T * c->n_ff, &failed);
    impl->cos = alloc_floats(T * impl->half, &failed);
    impl->sin = alloc_floats(T * impl->half, &failed);
    impl->last = alloc_floats((size_t)tm_engine_max_rows(opts) * d, &failed);
    impl->wbuf = alloc_floats(impl->n_thread * impl->wbuf_floats, &failed);
    impl->scores = alloc_floats((size_t)impl->n_thread * impl->max_pos, &failed);
    impl->pos = tm_malloc(T * sizeof(uint32_t));
    impl->tok_seq = tm_malloc(T * sizeof(uint32_t));
    impl->seq_tok0 = tm_malloc(S * sizeof(uint32_t));
    impl->attn_items = tm_malloc(impl->max_attn_items * sizeof(attn_item));
    if (failed || !impl->pos || !impl->tok_seq || !impl->seq_tok0 || !impl->attn_items) {
        TM_ERR(err, TM_E_NOMEM,
               "cpu engine: buffers for %zu tokens, %zu seqs, %u KV blocks of %u tokens", T, S,
               opts->n_kv_block, opts->block_size);
        goto fail;
    }

    tm_model_rope_inv_freq(c, impl->inv_freq);
    for (uint32_t l = 0; l < c->n_layer; l++) {
        const tm_layer_w *L = &m->layers[l];
        tm_dtype_to_f32(L->attn_norm.data, L->attn_norm.dtype, 0, d, impl->attn_norm + l * d);
        tm_dtype_to_f32(L->ffn_norm.data, L->ffn_norm.dtype, 0, d, impl->ffn_norm + l * d);
    }
    tm_dtype_to_f32(m->out_norm.data, m->out_norm.dtype, 0, d, impl->out_norm);

    rc = tm_cpu_pool_create(impl->n_thread, &impl->pool, err);
    if (rc)
        goto fail;
    *out = &impl->eng;
    return TM_OK;
fail:
    cpu_destroy(&impl->eng);
    return err->rc;
}

static tm_rc cpu_kv_copy(tm_engine *eng, uint32_t src, uint32_t dst, uint32_t n_tok, tm_err *err) {
    cpu_impl *impl = eng->impl;
    const uint32_t bs = eng->opts.block_size;
    if (src >= eng->opts.n_kv_block || dst >= eng->opts.n_kv_block || n_tok > bs)
        return TM_ERR(err, TM_E_INVAL, "kv_copy: block %u -> %u, %u tokens out of range", src, dst,
                      n_tok);
    const size_t blk = (size_t)bs * impl->kv_dim, n = (size_t)n_tok * impl->kv_dim;
    for (uint32_t l = 0; l < impl->cfg.n_layer; l++) {
        size_t base = (size_t)l * impl->layer_kv_floats;
        memcpy(impl->k_cache + base + dst * blk, impl->k_cache + base + src * blk,
               n * sizeof(float));
        memcpy(impl->v_cache + base + dst * blk, impl->v_cache + base + src * blk,
               n * sizeof(float));
    }
    return TM_OK;
}

static void cpu_destroy(tm_engine *eng) {
    if (!eng)
        return;
    cpu_impl *impl = eng->impl;
    tm_cpu_pool_destroy(impl->pool);
    tm_free(impl->k_cache);
    tm_free(impl->v_cache);
    tm_free(impl->inv_freq);
    tm_free(impl->attn_norm);
    tm_free(impl->ffn_norm);
    tm_free(impl->out_norm);
    tm_free(impl->x);
    tm_free(impl->h);
    tm_free(impl->q);
    tm_free(impl->k);
    tm_free(impl->v);
    tm_free(impl->att);
    tm_free(impl->gate);
    tm_free(impl->up);
    tm_free(impl->cos);
    tm_free(impl->sin);
    tm_free(impl->last);
    tm_free(impl->wbuf);
    tm_free(impl->scores);
    tm_free(impl->pos);
    tm_free(impl->tok_seq);
    tm_free(impl->seq_tok0);
    tm_free(impl->attn_items);
    tm_shard_destroy(impl->shard);
    tm_free(impl);
}

const tm_cpu_arch tm_cpu_arch_llama = {
    .name = "llama",
    .kv_dtypes = TM_CPU_KV(TM_KV_DTYPE_AUTO) | TM_CPU_KV(TM_KV_DTYPE_FP8) |
                 TM_CPU_KV(TM_KV_DTYPE_BF16) | TM_CPU_KV(TM_KV_DTYPE_FP8_HEAD),
    .create = llama_create,
};
