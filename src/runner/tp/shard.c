/* runner/tp/shard.c - the tensor-parallel split of a Llama-family model (runner/tp/shard.h): the
 * per-rank counts, and the weights sliced by them for one rank; and the DeepSeek-V4 per-rank
 * counts (its engine slices the weights itself). */
#include "runner/tp/shard.h"

#include <string.h>

#include "base/alloc.h"
#include "runner/model/tensor.h"

/* Owned buffers of a shard: column-slice copies, freed with it. */
typedef struct shard_owned {
    void **bufs;
    uint32_t n, cap;
} shard_owned;

// Rows [r0, r0 + n) of a 2-D tensor (or elements of a 1-D one), as a view.
static tm_tensor rows(const tm_tensor *t, uint64_t r0, uint64_t n) {
    tm_tensor v = *t;
    if (!t->data)
        return v;
    size_t row_bytes = tm_dtype_size(t->dtype) * (t->n_dim > 1 ? t->shape[1] : 1);
    v.data = (const char *)t->data + r0 * row_bytes;
    v.shape[0] = n;
    return v;
}

// Columns [c0, c0 + n) of a 2-D tensor, copied into a new owned buffer.
static tm_rc cols(const tm_tensor *t, uint64_t c0, uint64_t n, shard_owned *own, tm_tensor *out,
                  tm_err *err) {
    size_t es = tm_dtype_size(t->dtype);
    char *buf = tm_malloc(t->shape[0] * n * es);
    if (!buf)
        return TM_ERR(err, TM_E_NOMEM, "tp shard: %llu x %llu slice",
                      (unsigned long long)t->shape[0], (unsigned long long)n);
    own->bufs[own->n++] = buf;
    for (uint64_t r = 0; r < t->shape[0]; r++)
        memcpy(buf + r * n * es, (const char *)t->data + (r * t->shape[1] + c0) * es, n * es);
    *out = *t;
    out->data = buf;
    out->shape[1] = n;
    return TM_OK;
}

tm_rc tm_shard_split_init(tm_shard_split *out, const tm_model_cfg *c, uint32_t rank, uint32_t tp,
                          const char *who, tm_err *err) {
    if (tp == 0 || rank >= tp)
        return TM_ERR(err, TM_E_INVAL, "%s: rank %u of %u", who, rank, tp);
    if (c->n_head % tp || c->n_ff % tp)
        return TM_ERR(err, TM_E_INVAL,
                      "%s: %u attention heads and intermediate size %u must divide by tp %u", who,
                      c->n_head, c->n_ff, tp);
    if (c->n_kv_head % tp && tp % c->n_kv_head)
        return TM_ERR(err, TM_E_INVAL, "%s: %u KV heads neither divide by nor divide tp %u", who,
                      c->n_kv_head, tp);
    const uint32_t nkv = c->n_kv_head >= tp ? c->n_kv_head / tp : 1;
    const uint32_t v_per = TM_CEIL_DIV(c->n_vocab, tp);
    const uint32_t v0 = TM_MIN(rank * v_per, c->n_vocab);
    out->cfg = *c;
    out->cfg.n_head = c->n_head / tp;
    out->cfg.n_kv_head = nkv;
    out->cfg.n_ff = c->n_ff / tp;
    out->cfg.n_vocab = TM_MIN(v_per, c->n_vocab - v0);
    out->kv0 = c->n_kv_head >= tp ? rank * nkv : rank / (tp / c->n_kv_head);
    out->vocab0 = v0;
    out->v_per = v_per;
    return TM_OK;
}

tm_rc tm_shard_dsv4_split(tm_shard_dsv4 *out, const tm_model_cfg *c, uint32_t o_groups,
                          uint32_t rank, uint32_t tp, tm_err *err) {
    if (tp == 0 || rank >= tp)
        return TM_ERR(err, TM_E_INVAL, "tp shard: deepseek_v4: rank %u of %u", rank, tp);
    if (c->n_head % tp || o_groups % tp || c->n_ff % tp)
        return TM_ERR(err, TM_E_INVAL,
                      "tp shard: deepseek_v4: %u attention heads, %u output groups and expert "
                      "width %u must all divide by tp %u",
                      c->n_head, o_groups, c->n_ff, tp);
    tm_shard_split sp; // the vocabulary rows, as every TP engine splits them
    tm_rc rc = tm_shard_split_init(&sp, c, rank, tp, "tp shard: deepseek_v4", err);
    if (rc)
        return rc;
    out->n_head = c->n_head / tp;
    out->h0 = rank * out->n_head;
    out->n_group = o_groups / tp;
    out->g0 = rank * out->n_group;
    out->n_ff = c->n_ff / tp;
    out->f0 = rank * out->n_ff;
    out->vocab0 = sp.vocab0;
    out->n_vocab = sp.cfg.n_vocab;
    return TM_OK;
}

tm_rc tm_shard_dsv41_split(tm_shard_dsv41 *out, uint32_t n_head, uint32_t o_groups,
                           uint32_t index_n_heads, uint32_t n_experts, uint32_t vocab,
                           uint32_t rank, uint32_t tp, tm_err *err) {
    if (tp == 0 || rank >= tp)
        return TM_ERR(err, TM_E_INVAL, "tp shard: deepseek_v41: rank %u of %u", rank, tp);
    if (n_head % tp || o_groups % tp || index_n_heads % tp || n_experts % tp || vocab % tp)
        return TM_ERR(err, TM_E_INVAL,
                      "tp shard: deepseek_v41: %u attention heads, %u output groups, %u indexer "
                      "heads, %u routed experts and vocabulary %u must all divide by tp %u",
                      n_head, o_groups, index_n_heads, n_experts, vocab, tp);
    out->n_head = n_head / tp;
    out->h0 = rank * out->n_head;
    out->n_group = o_groups / tp;
    out->g0 = rank * out->n_group;
    out->n_ihead = index_n_heads / tp;
    out->ih0 = rank * out->n_ihead;
    out->n_expert = n_experts / tp;
    out->e0 = rank * out->n_expert;
    out->n_vocab = vocab / tp;
    out->vocab0 = rank * out->n_vocab;
    return TM_OK;
}

tm_rc tm_shard_create(const tm_model *full, uint32_t rank, uint32_t tp, tm_model **out,
                      uint32_t *vocab0, tm_err *err) {
    const tm_model_cfg *c = &full->cfg;
    tm_shard_split sp;
    tm_rc rc = tm_shard_split_init(&sp, c, rank, tp, "tp shard", err);
    if (rc)
        return rc;
    tm_model *s = tm_calloc(1, sizeof(*s));
    if (!s)
        return TM_ERR(err, TM_E_NOMEM, "tp shard header");
    shard_owned *own = tm_calloc(1, sizeof(*own));
    s->impl = own;
    s->layers = tm_calloc(c->n_layer, sizeof(*s->layers));
    if (own)
        own->bufs = tm_calloc(2 * (size_t)c->n_layer, sizeof(void *));
    if (!own || !s->layers || !own->bufs) {
        TM_ERR(err, TM_E_NOMEM, "tp shard of %u layers", c->n_layer);
        goto fail;
    }
    s->cfg = sp.cfg;
    const uint64_t hd = c->head_dim;
    const uint32_t nh = sp.cfg.n_head, nkv = sp.cfg.n_kv_head, kv0 = sp.kv0, ff = sp.cfg.n_ff;
    const uint32_t v0 = sp.vocab0, nv = sp.cfg.n_vocab;
    s->embd = rows(&full->embd, v0, nv);
    s->out_norm = full->out_norm;
    s->lm_head = rows(full->lm_head.data ? &full->lm_head : &full->embd, v0, nv);
    s->cfg.tie_embd = 0; // the shard always carries its own lm_head view
    for (uint32_t l = 0; l < c->n_layer; l++) {
        const tm_layer_w *F = &full->layers[l];
        tm_layer_w *L = &s->layers[l];
        L->attn_norm = F->attn_norm;
        L->ffn_norm = F->ffn_norm;
        L->wq = rows(&F->wq, rank * nh * hd, nh * hd);
        L->wk = rows(&F->wk, kv0 * hd, nkv * hd);
        L->wv = rows(&F->wv, kv0 * hd, nkv * hd);
        L->bq = rows(&F->bq, rank * nh * hd, nh * hd);
        L->bk = rows(&F->bk, kv0 * hd, nkv * hd);
        L->bv = rows(&F->bv, kv0 * hd, nkv * hd);
        L->w_gate = rows(&F->w_gate, (uint64_t)rank * ff, ff);
        L->w_up = rows(&F->w_up, (uint64_t)rank * ff, ff);
        rc = cols(&F->wo, rank * nh * hd, nh * hd, own, &L->wo, err);
        if (!rc)
            rc = cols(&F->w_down, (uint64_t)rank * ff, ff, own, &L->w_down, err);
        if (rc)
            goto fail;
    }
    *vocab0 = v0;
    *out = s;
    return TM_OK;
fail:
    tm_shard_destroy(s);
    return err->rc;
}

void tm_shard_destroy(tm_model *shard) {
    if (!shard)
        return;
    shard_owned *own = shard->impl;
    if (own) {
        for (uint32_t i = 0; i < own->n; i++)
            tm_free(own->bufs[i]);
        tm_free(own->bufs);
        tm_free(own);
    }
    tm_free(shard->layers);
    tm_free(shard);
}
