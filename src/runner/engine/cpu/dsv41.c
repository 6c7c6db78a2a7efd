/* runner/engine/cpu/dsv41.c - the DeepSeek-V4.1 forward pass on the CPU (docs/deepseek_v41.md
 * has the math and what differs from V4). A step stacks the tokens of every sequence (prefill
 * chunks and decodes mixed) into [T][...] activations for the projections; the compressor, the
 * indexer and the attention then work per token against the sequence's paged state.
 *
 * Numerics: activations are fp32 between ops; dot products accumulate in double in a fixed order
 * and round to fp32 (so results do not depend on batch composition, chunking or thread count);
 * the reference's activation quantization is applied exactly, quantize-then-dequantize: act_quant
 * (32-value blocks, ue8m0 scales) on the input of every FP8/FP4 linear and on the window KV,
 * fp4_act_quant on the indexer's keys and queries (32, ue8m0) and on the compressed KV (16, e4m3
 * scales). tests/oracles/v41_ref.py is the NumPy transliteration this is checked against.
 *
 * State: everything a later token needs lives in the KV blocks named by the block table: per
 * layer the window KV row of every token; per kv source layer the compressor inputs of every
 * token (ratio > 1: kv and gate projections, fp32), the compressed rows (one per closed group of
 * `ratio` tokens, in the block holding the group's first token) and, when it also runs an
 * indexer, the index keys; per block the compressed token ids (Engram n-gram context). Every value
 * is a function of the token prefix only, so blocks can be shared by the prefix cache and copied
 * (kv_copy) like plain KV. block_size must be a multiple of every ratio.
 *
 * All memory is allocated at create; forward allocates nothing. One thread drives an engine. */
#include "runner/engine/cpu/dsv41.h"

#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "runner/engine/cpu/arch.h"
#include "runner/engine/cpu/dsv4.h"
#include "runner/engine/cpu/dsv41_dspark.h"
#include "runner/engine/cpu/dsv_common.h"
#include "runner/engine/cpu/thread_pool.h"
#include "runner/model/engram_hash.h"
#include "runner/model/engram_open.h"
#include "runner/model/engram_table.h"
#include "runner/model/model_dsv41.h"
#include "runner/tp/shard.h"

typedef struct v41_state {
    float *win;  /* [n_block*bs][hd]: rotated, act_quant'ed KV of every token */
    float *tail; /* kv sources, ratio > 1: [n_block*bs][2*hd] compressor kv | gate of every token */
    float *comp; /* kv sources: [n_block*bs/ratio][hd] compressed rows (rotated, fp4 QDQ) */
    float *ikey; /* kv + index sources: [n_block*bs/ratio][di] index keys */
} v41_state;

typedef struct v41_eng {
    tm_engine eng;
    const tm_model *m;
    const tm_dsv41 *w;
    const tm_dsv41_cfg *c;
    tm_cpu_pool *pool;
    uint32_t n_thread;
    uint32_t bs, n_block, max_pos, T, S;
    uint32_t D, N, H, hd, rd, qlr, G, olr, ing, E, K, I, Hi, di, mix, topk, cb, ctop;
    uint32_t n_cols, ehd, max_in, max_ent;
    uint32_t tp, rank;  /* tensor parallel: this engine is rank of tp (1: the whole model) */
    tm_shard_dsv41 sh;  /* this rank's heads, groups, indexer heads, experts, vocabulary rows */
    tm_tensor *wo_b_sl; /* tp > 1: [n_layers] owned f32 column slices of wo_b (its groups) */
    float *isc;         /* tp > 1: [T][max_ent / 2] indexer scores, all-reduced over ranks */
    uint32_t isc_ld;
    v41_state *st; /* [n_layers] */
    int32_t *cid;  /* Engram: [n_block*bs] compressed id of every token, or NULL */
    const int32_t *tmap;
    uint32_t n_tmap;
    tm_engram_layout *lay;
    tm_engram_table **etab; /* [n_engram] the tables, read by rows from the model's files */
    uint64_t *hrows;        /* [n_engram][T * n_cols] the step's row ids per table */
    /* per step */
    const tm_batch *b;
    uint32_t *tok_seq, *tok_pos, *tok_id; /* [T] */
    float *cs_m, *sn_m, *cs_c, *sn_c;     /* [T][rd/2] rope tables: main, compress */
    float *s;                             /* [T][N*D] streams */
    float *x, *y, *xin;                   /* [T][max(D, max_in)] */
    float *pre, *apre, *post, *comb;      /* [T][N], [T][N], [T][N], [T][N*N] */
    float *mixes;                         /* [T][mix] */
    float *qr, *q, *kv, *o, *oa;          /* [T][qlr], [T][H*hd], [T][hd], [T][H*hd], [T][G*olr] */
    float *ckv, *cgate;                   /* [T][hd] */
    float *lat, *lk;                      /* [T][hd] new latents, [T][di] their index keys */
    uint32_t *lat_w, *lat_t;              /* [T] group index and the token that closed it */
    float *iq, *iw;                       /* [T][Hi*di], [T][Hi] */
    int32_t *pick;                        /* [T][topk] */
    uint32_t *n_pick;                     /* [T] */
    uint32_t *cand, *n_cand;              /* [T][ctop] kept candidate blocks (sorted), [T] */
    float *rl;                            /* [T][E] router scores */
    uint32_t *sel;                        /* [T][K] */
    float *selw;                          /* [T][K] */
    uint32_t *etok;                       /* [T] tokens routed to one expert */
    float *xg, *g, *u, *eo;               /* [T][D], [T][I], [T][I], [T][D] */
    double *yacc;                         /* [T][D] */
    int64_t *hid;                         /* [T][n_engram][n_cols] */
    float *erow, *ekv;                    /* [T][n_cols*ehd], [T][(N+1)*D] */
    /* per thread */
    float *wrow;           /* [n_thread][max_in] */
    float *score;          /* [n_thread][max_ent] */
    uint32_t *ord;         /* [n_thread][max_ent] */
    uint8_t *cmask;        /* [n_thread][max_ent] */
    double *ascore;        /* [n_thread][window + topk] */
    float *vec;            /* [max(D, q_lora, hd, di, E)] norm weights / biases of the op at hand */
    double iscale;         /* index_head_dim^-0.5 * index_n_heads^-0.5 */
    tm_dsv41_drafter *dsp; /* the DSpark drafter (dsv41_dspark.h), or NULL */
} v41_eng;

static void v41_destroy(tm_engine *eng);
static tm_rc v41_forward(tm_engine *eng, const tm_batch *b, float *logits, tm_err *err);
static tm_rc v41_kv_copy(tm_engine *eng, uint32_t src, uint32_t dst, uint32_t n_tok, tm_err *err);

static const tm_engine_ops v41_ops;

/* The drafter ops, served by the DSpark drafter (dsv41_dspark.h) when the model has one. The CPU
 * tensor-parallel engine hands itself to its rank 0's ops (engine_tp.c): its rank 0 is a V4.1
 * engine made with tp_size > 1, which has no drafter (DSpark runs at tp 1 only). */
static const v41_eng *v41_of(const tm_engine *eng) {
    if (eng->ops == &v41_ops)
        return eng->impl;
    const tm_engine *r0 = tm_engine_cpu_tp_rank((tm_engine *)eng, 0);
    return r0 && r0->ops == &v41_ops ? r0->impl : NULL;
}
static void v41_draft_info(const tm_engine *eng, tm_engine_draft_info *info) {
    const v41_eng *e = v41_of(eng);
    if (e && e->dsp)
        tm_dsv41_drafter_info(e->dsp, info);
    else
        *info = (tm_engine_draft_info){TM_DRAFT_NONE, 0, 0, 0};
}
static const float *v41_hidden(const tm_engine *eng, uint32_t *n_tok) {
    const v41_eng *e = v41_of(eng);
    *n_tok = 0;
    return e && e->dsp ? tm_dsv41_drafter_hidden(e->dsp, n_tok) : NULL;
}
static tm_rc v41_draft(tm_engine *eng, const tm_engine_draft_seq *seqs, uint32_t n_seq,
                       float *logits, float *hidden_out, tm_err *err) {
    const v41_eng *e = v41_of(eng);
    if (!e || !e->dsp)
        return TM_ERR(err, TM_E_INVAL,
                      "dsv41 draft: no DSpark drafter (the model has no DSpark stages, or tp > 1)");
    tm_rc rc = tm_dsv41_drafter_draft(e->dsp, &eng->opts, e->max_pos, seqs, n_seq, logits, err);
    if (rc == TM_OK && hidden_out) { // a block drafter's hidden_out: the confidence logits
        tm_engine_draft_info info;
        tm_dsv41_drafter_info(e->dsp, &info);
        uint32_t n_want = 0;
        for (uint32_t i = 0; i < n_seq; i++)
            n_want += seqs[i].want_logits != 0;
        memcpy(hidden_out, tm_dsv41_drafter_confidence(e->dsp),
               (size_t)n_want * info.n_out * sizeof(float));
    }
    return rc;
}

const float *tm_dsv41_engine_confidence(const tm_engine *eng) {
    const v41_eng *e = eng ? v41_of(eng) : NULL;
    return e && e->dsp ? tm_dsv41_drafter_confidence(e->dsp) : NULL;
}

static const tm_engine_ops v41_ops = {
    .name = "cpu",
    .forward = v41_forward,
    .kv_copy = v41_kv_copy,
    .draft_info = v41_draft_info,
    .hidden = v41_hidden,
    .draft = v41_draft,
    .destroy = v41_destroy,
};

/* ---- the reference's kernels (act_quant, fp4_act_quant, RMSNorm: dsv_common.h) ---- */

/* a . b accumulated in double (the oracle's float64 accumulation; each fp32 product is exact in
 * double) in a fixed order: four interleaved partial sums, then (s0 + s1) + (s2 + s3). */
static float dotd(const float *a, const float *b, uint32_t n) {
    double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
    uint32_t i = 0;
    for (; i + 4 <= n; i += 4) { // hot loop of every linear
        s0 += (double)a[i] * (double)b[i];
        s1 += (double)a[i + 1] * (double)b[i + 1];
        s2 += (double)a[i + 2] * (double)b[i + 2];
        s3 += (double)a[i + 3] * (double)b[i + 3];
    }
    for (; i < n; i++)
        s0 += (double)a[i] * (double)b[i];
    return (float)((s0 + s1) + (s2 + s3));
}

/* ---- linears over the pool ---- */

typedef struct lin_job {
    v41_eng *e;
    const tm_tensor *w;
    const float *x;
    uint32_t ldx, n_tok, n_in, n_out, ldo, per_item;
    uint64_t row0;
    float *out;
} lin_job;

static void lin_item(void *ctx, uint32_t item, uint32_t tid) {
    const lin_job *j = ctx;
    float *wr = j->e->wrow + (size_t)tid * j->e->max_in;
    const uint32_t o1 = TM_MIN(j->n_out, (item + 1) * j->per_item);
    for (uint32_t o = item * j->per_item; o < o1; o++) { // hot loop: one weight row, every token
        tm_tensor_row_f32(j->w, (size_t)(j->row0 + o), wr);
        for (uint32_t t = 0; t < j->n_tok; t++)
            j->out[(size_t)t * j->ldo + o] = dotd(j->x + (size_t)t * j->ldx, wr, j->n_in);
    }
}

/* out[t][o] = x[t] . w[row0 + o] for t < n_tok, o < n_out; with aq the act_quant'ed x (what the
 * reference's linear() does for FP8 and FP4 weights), else x as it is. */
static void lin_aq(v41_eng *e, int aq, const tm_tensor *w, uint64_t row0, const float *x,
                   uint32_t ldx, uint32_t n_tok, uint32_t n_in, float *out, uint32_t ldo,
                   uint32_t n_out) {
    if (!n_tok || !n_out)
        return;
    TM_ASSERT(n_in <= e->max_in && w->shape[w->n_dim - 1] == n_in);
    if (aq) {
        TM_ASSERT(n_in % 32 == 0);
        for (uint32_t t = 0; t < n_tok; t++) {
            memcpy(e->xin + (size_t)t * e->max_in, x + (size_t)t * ldx, n_in * sizeof(float));
            tm_dsv_act_quant(e->xin + (size_t)t * e->max_in, n_in);
        }
        x = e->xin;
        ldx = e->max_in;
    }
    lin_job j = {e, w, x, ldx, n_tok, n_in, n_out, ldo, 0, row0, out};
    j.per_item = TM_MAX(1u, TM_CEIL_DIV(n_out, e->n_thread * 4));
    tm_cpu_pool_run(e->pool, lin_item, &j, TM_CEIL_DIV(n_out, j.per_item));
}

/* lin_aq, quantizing x exactly when w is quantized (every Linear but wo_a). */
static void lin(v41_eng *e, const tm_tensor *w, uint64_t row0, const float *x, uint32_t ldx,
                uint32_t n_tok, uint32_t n_in, float *out, uint32_t ldo, uint32_t n_out) {
    lin_aq(e, w->quant != TM_QUANT_NONE, w, row0, x, ldx, n_tok, n_in, out, ldo, n_out);
}

/* Tensor parallel: sum buf[0..n) over the ranks, in pieces the in-process all-reduce takes (a
 * no-op at tp 1). Every rank calls it with the same n. */
static void allreduce(v41_eng *e, float *buf, size_t n) {
    if (e->tp <= 1)
        return;
    const size_t piece = (size_t)e->T * e->D;
    for (size_t i = 0; i < n; i += piece)
        e->eng.opts.allreduce(e->eng.opts.allreduce_ctx, buf + i, TM_MIN(piece, n - i));
}

/* ---- per-token addressing ---- */

static size_t tok_slot(const v41_eng *e, uint32_t t, uint32_t p) {
    const uint32_t *table = e->b->seqs[e->tok_seq[t]].block_table;
    return (size_t)table[p / e->bs] * e->bs + p % e->bs;
}

static size_t comp_slot(const v41_eng *e, uint32_t t, uint32_t w, uint32_t r) {
    const uint32_t *table = e->b->seqs[e->tok_seq[t]].block_table;
    const uint32_t p = w * r;
    return (size_t)table[p / e->bs] * (e->bs / r) + (p % e->bs) / r;
}

/* ---- hyper-connections ---- */

/* pre/post/comb of every token from the streams (Block.hc_mixes: one rms of the flattened streams
 * per token, norm_eps, applied after the projection). */
static void hc_mixes(v41_eng *e, const tm_tensor *fn, const tm_tensor *scale, const tm_tensor *base,
                     uint32_t T, float *pre, float *post, float *comb) {
    const uint32_t ND = e->N * e->D;
    lin(e, fn, 0, e->s, ND, T, ND, e->mixes, e->mix, e->mix);
    tm_dsv_hc_mix_split(e->s, e->N, e->D, T, e->mixes, scale, base, e->c->norm_eps,
                        e->c->hc_sinkhorn_iters, e->c->hc_eps, pre, post, comb);
}

/* ---- Engram ---- */

/* Engram layer il: the step's rows of its table (requested ahead by forward's prefetch; e4m3 x
 * ue8m0 per 32, zero past the table), wkv into one key per stream and a value, the gated add. */
static tm_rc engram(v41_eng *e, uint32_t il, uint32_t T, tm_err *err) {
    const tm_dsv41_layer *L = &e->w->layers[il];
    const uint32_t slot = (uint32_t)e->c->engram_slot[il], N = e->N, D = e->D;
    const uint32_t nc = e->n_cols, ehd = e->ehd, w_kv = (N + 1) * D;
    tm_rc rc = tm_engram_table_get(e->etab[slot], e->hrows + (size_t)slot * e->T * nc,
                                   (size_t)T * nc, e->erow, err);
    if (rc)
        return rc;
    allreduce(e, e->erow, (size_t)T * nc * ehd); // each row comes from the rank holding it
    lin(e, &L->e_wkv, 0, e->erow, nc * ehd, T, nc * ehd, e->ekv, w_kv, w_kv);
    const double inv_sqrt_d = pow((double)D, -0.5);
    for (uint32_t t = 0; t < T; t++) {
        float *st = e->s + (size_t)t * N * D;
        const float *kv = e->ekv + (size_t)t * w_kv, *value = kv + (size_t)N * D;
        for (uint32_t c = 0; c < N; c++) {
            float *h = st + (size_t)c * D;
            const float *key = kv + (size_t)c * D;
            double hh = 0.0, kk = 0.0, dot = 0.0;
            for (uint32_t d = 0; d < D; d++) {
                const float wq = tm_tensor_get_f32(&L->e_q, (size_t)c * D + d);
                const float wk = tm_tensor_get_f32(&L->e_k, (size_t)c * D + d);
                const float wgt = (float)((double)wq * wk);
                hh += (double)h[d] * h[d];
                kk += (double)key[d] * key[d];
                dot += (double)h[d] * wgt * key[d];
            }
            const double rstd = 1.0 / sqrt(hh / D + (double)e->c->norm_eps) /
                                sqrt(kk / D + (double)e->c->norm_eps);
            dot = dot * rstd * inv_sqrt_d;
            const double sq = copysign(sqrt(fmax(fabs(dot), 1e-6)), dot);
            const double gate = 1.0 / (1.0 + exp(-sq));
            for (uint32_t d = 0; d < D; d++)
                h[d] = (float)((double)h[d] + gate * value[d]);
        }
    }
    return TM_OK;
}

/* ---- attention ---- */

typedef struct tok_job {
    v41_eng *e;
    uint32_t il;
} tok_job;

/* Index i before j: higher score first, equal scores (and -inf) by lower index, as the oracle's
 * stable sort (the reference's torch.topk leaves tie order unspecified). */
static int before(const float *s, uint32_t i, uint32_t j) {
    return s[i] > s[j] || (s[i] == s[j] && i < j);
}

/* Sort idx[0..n) by `before` over s: a merge sort (stable, no allocation; tmp holds n). */
static void sort_desc(uint32_t *idx, uint32_t *tmp, uint32_t n, const float *s) {
    if (n < 2)
        return;
    const uint32_t h = n / 2;
    sort_desc(idx, tmp, h, s);
    sort_desc(idx + h, tmp, n - h, s);
    uint32_t i = 0, j = h, k = 0;
    while (i < h && j < n)
        tmp[k++] = before(s, idx[j], idx[i]) ? idx[j++] : idx[i++];
    while (i < h)
        tmp[k++] = idx[i++];
    while (j < n)
        tmp[k++] = idx[j++];
    memcpy(idx, tmp, n * sizeof(uint32_t));
}

/* The indexer of index source il for token t: scores over the reachable compressed positions,
 * candidate blocks (published by the candidate source, applied by the later index sources), the
 * top index_topk kept in position order. */
/* Token t's indexer scores over its lens reachable positions into sc (this rank's heads). */
static void index_scores(v41_eng *e, uint32_t il, uint32_t t, uint32_t lens, float *sc) {
    const uint32_t r = e->c->ratio[il], Hi = e->Hi, di = e->di;
    const v41_state *ks = &e->st[e->c->key_from[il]];
    const float *q = e->iq + (size_t)t * Hi * di, *w = e->iw + (size_t)t * Hi;
    for (uint32_t k = 0; k < lens; k++) {
        const float *key = ks->ikey + comp_slot(e, t, k, r) * di;
        double acc = 0.0;
        for (uint32_t h = 0; h < Hi; h++) {
            double d = 0.0;
            for (uint32_t i = 0; i < di; i++)
                d += (double)q[h * di + i] * key[i];
            acc += (d > 0.0 ? d : 0.0) * ((double)w[h] * e->iscale);
        }
        sc[k] = (float)acc;
    }
}

/* Token t's candidate blocks and top-k from its scores sc[0..lens) (sc is scratch of max_ent). */
static void index_select(v41_eng *e, uint32_t il, uint32_t t, uint32_t lens, float *sc,
                         uint32_t tid) {
    uint32_t *ord = e->ord + (size_t)tid * e->max_ent;
    uint32_t *tmp = ord + e->max_ent / 2;
    const int32_t cs = e->c->candidate_source_layer;
    const uint32_t cb = e->cb;
    if (cs >= 0 && (uint32_t)cs == il) {
        // level one: blocks of cb positions scored by their best entry, the newest (partly
        // filled) block pinned, the top candidate_topk_blocks kept
        const uint32_t nb = TM_CEIL_DIV(lens, cb);
        float *bsc = sc + lens;
        for (uint32_t bk = 0; bk < nb; bk++) {
            float mx = -INFINITY;
            for (uint32_t k = bk * cb; k < TM_MIN(lens, (bk + 1) * cb); k++)
                mx = fmaxf(mx, sc[k]);
            bsc[bk] = bk == nb - 1 ? INFINITY : mx;
            ord[bk] = bk;
        }
        sort_desc(ord, tmp, nb, bsc);
        const uint32_t keep = TM_MIN(nb, e->ctop);
        uint32_t *cd = e->cand + (size_t)t * e->ctop;
        memcpy(cd, ord, keep * sizeof(uint32_t));
        e->n_cand[t] = keep;
    } else if (cs >= 0 && (uint32_t)cs < il) {
        uint8_t *mk = e->cmask + (size_t)tid * e->max_ent;
        memset(mk, 0, TM_CEIL_DIV(lens, cb));
        const uint32_t *cd = e->cand + (size_t)t * e->ctop;
        for (uint32_t i = 0; i < e->n_cand[t]; i++)
            mk[cd[i]] = 1;
        for (uint32_t k = 0; k < lens; k++)
            if (!mk[k / cb])
                sc[k] = -INFINITY;
    }
    for (uint32_t k = 0; k < lens; k++)
        ord[k] = k;
    sort_desc(ord, tmp, lens, sc);
    const uint32_t n = TM_MIN(e->topk, lens);
    int32_t *pk = e->pick + (size_t)t * e->topk;
    for (uint32_t i = 0; i < n; i++)
        pk[i] = (int32_t)ord[i];
    // position order
    for (uint32_t i = 1; i < n; i++) {
        int32_t v = pk[i];
        uint32_t k = i;
        while (k > 0 && pk[k - 1] > v) {
            pk[k] = pk[k - 1];
            k--;
        }
        pk[k] = v;
    }
    e->n_pick[t] = n;
}

static void index_item(void *ctx, uint32_t t, uint32_t tid) {
    const tok_job *j = ctx;
    v41_eng *e = j->e;
    const uint32_t lens = (e->tok_pos[t] + 1) / e->c->ratio[j->il];
    float *sc = e->score + (size_t)tid * e->max_ent;
    e->n_pick[t] = 0;
    if (!lens)
        return;
    if (e->tp > 1) // the scores all-reduced over the ranks' heads (forward's second pass)
        memcpy(sc, e->isc + (size_t)t * e->isc_ld, lens * sizeof(float));
    else
        index_scores(e, j->il, t, lens, sc);
    index_select(e, j->il, t, lens, sc, tid);
}

/* tp > 1, first pass: this rank's partial scores of every token into isc. */
static void index_score_item(void *ctx, uint32_t t, uint32_t tid) {
    (void)tid;
    const tok_job *j = ctx;
    v41_eng *e = j->e;
    const uint32_t lens = (e->tok_pos[t] + 1) / e->c->ratio[j->il];
    float *row = e->isc + (size_t)t * e->isc_ld;
    memset(row, 0, e->isc_ld * sizeof(float));
    index_scores(e, j->il, t, lens, row);
}

/* sparse_attn of token t over its window rows and its picked compressed rows, with the sink;
 * then the output's rope slice rotated back. */
static void attn_item(void *ctx, uint32_t t, uint32_t tid) {
    const tok_job *j = ctx;
    v41_eng *e = j->e;
    const uint32_t il = j->il, r = e->c->ratio[il], p = e->tok_pos[t], hd = e->hd;
    const uint32_t win = e->c->window_size, p0 = p + 1 > win ? p + 1 - win : 0;
    const v41_state *ls = &e->st[il];
    const v41_state *cs = r ? &e->st[e->c->kv_from[il]] : NULL;
    const uint32_t n_c = r ? e->n_pick[t] : 0, n_w = p + 1 - p0;
    const int32_t *pk = e->pick + (size_t)t * e->topk;
    double *sc = e->ascore + (size_t)tid * (win + e->topk);
    const double scale = pow((double)hd, -0.5);
    const tm_tensor *sink = &e->w->layers[il].attn_sink;
    for (uint32_t h = 0; h < e->H; h++) {
        const float *q = e->q + ((size_t)t * e->H + h) * hd;
        float *o = e->o + ((size_t)t * e->H + h) * hd;
        const double sk = tm_tensor_get_f32(sink, e->sh.h0 + h);
        double mx = sk;
        for (uint32_t i = 0; i < n_w + n_c; i++) {
            const float *row = i < n_w ? ls->win + tok_slot(e, t, p0 + i) * hd
                                       : cs->comp + comp_slot(e, t, (uint32_t)pk[i - n_w], r) * hd;
            double d = 0.0;
            for (uint32_t k = 0; k < hd; k++)
                d += (double)q[k] * row[k];
            sc[i] = d * scale;
            mx = fmax(mx, sc[i]);
        }
        double den = exp(sk - mx);
        double acc[1024];
        TM_ASSERT(hd <= 1024);
        for (uint32_t k = 0; k < hd; k++)
            acc[k] = 0.0;
        for (uint32_t i = 0; i < n_w + n_c; i++) {
            const float *row = i < n_w ? ls->win + tok_slot(e, t, p0 + i) * hd
                                       : cs->comp + comp_slot(e, t, (uint32_t)pk[i - n_w], r) * hd;
            const double pr = exp(sc[i] - mx);
            den += pr;
            for (uint32_t k = 0; k < hd; k++)
                acc[k] += pr * row[k];
        }
        for (uint32_t k = 0; k < hd; k++)
            o[k] = (float)(acc[k] / den);
        const float *csn = r ? e->cs_c : e->cs_m, *snn = r ? e->sn_c : e->sn_m;
        tm_dsv_rope_head(o, hd, e->rd, csn + (size_t)t * (e->rd / 2), snn + (size_t)t * (e->rd / 2),
                         -1.0f);
    }
}

static void layer_attn(v41_eng *e, uint32_t il, uint32_t T) {
    const tm_dsv41_layer *L = &e->w->layers[il];
    const tm_dsv41_cfg *c = e->c;
    const uint32_t hd = e->hd, rd = e->rd, half = rd / 2, r = c->ratio[il];
    const float *cs = r ? e->cs_c : e->cs_m, *sn = r ? e->sn_c : e->sn_m;
    float *nw = e->vec;
    // q: low rank, RoPE
    lin(e, &L->wq_a, 0, e->x, e->D, T, e->D, e->qr, e->qlr, e->qlr);
    tm_dsv_vec_f32(&L->q_norm, nw);
    for (uint32_t t = 0; t < T; t++)
        tm_dsv_rmsnorm(e->qr + (size_t)t * e->qlr, nw, e->qlr, c->norm_eps);
    lin(e, &L->wq_b, (uint64_t)e->sh.h0 * hd, e->qr, e->qlr, T, e->qlr, e->q, e->H * hd, e->H * hd);
    for (uint32_t t = 0; t < T; t++)
        for (uint32_t h = 0; h < e->H; h++)
            tm_dsv_rope_head(e->q + ((size_t)t * e->H + h) * hd, hd, rd, cs + (size_t)t * half,
                             sn + (size_t)t * half, 1.0f);
    // window KV: rotated, act_quant'ed, stored at the token's slot
    lin(e, &L->wkv, 0, e->x, e->D, T, e->D, e->kv, hd, hd);
    tm_dsv_vec_f32(&L->kv_norm, nw);
    for (uint32_t t = 0; t < T; t++) {
        float *kv = e->kv + (size_t)t * hd;
        tm_dsv_rmsnorm(kv, nw, hd, c->norm_eps);
        tm_dsv_rope_head(kv, hd, rd, cs + (size_t)t * half, sn + (size_t)t * half, 1.0f);
        tm_dsv_act_quant(kv, hd);
        memcpy(e->st[il].win + tok_slot(e, t, e->tok_pos[t]) * hd, kv, hd * sizeof(float));
    }
    if (r && c->kv_source[il]) {
        // the compressor: latents of the groups this step closes (pre-RoPE)
        v41_state *ls = &e->st[il];
        uint32_t n_lat = 0;
        lin(e, &L->c_wkv, 0, e->x, e->D, T, e->D, e->ckv, hd, hd);
        tm_dsv_vec_f32(&L->c_norm, nw);
        if (r == 1) {
            for (uint32_t t = 0; t < T; t++) {
                memcpy(e->lat + (size_t)n_lat * hd, e->ckv + (size_t)t * hd, hd * sizeof(float));
                e->lat_w[n_lat] = e->tok_pos[t];
                e->lat_t[n_lat++] = t;
            }
        } else {
            lin(e, &L->c_wgate, 0, e->x, e->D, T, e->D, e->cgate, hd, hd);
            for (uint32_t t = 0; t < T; t++) {
                float *tl = ls->tail + tok_slot(e, t, e->tok_pos[t]) * 2 * hd;
                memcpy(tl, e->ckv + (size_t)t * hd, hd * sizeof(float));
                memcpy(tl + hd, e->cgate + (size_t)t * hd, hd * sizeof(float));
            }
            for (uint32_t t = 0; t < T; t++) {
                const uint32_t p = e->tok_pos[t];
                if ((p + 1) % r)
                    continue;
                const uint32_t w = (p + 1) / r - 1;
                float *lat = e->lat + (size_t)n_lat * hd;
                for (uint32_t k = 0; k < hd;
                     k++) { // per-channel softmax of the gate over the group
                    double mx = -INFINITY, den = 0.0, acc = 0.0;
                    for (uint32_t i = 0; i < r; i++)
                        mx = fmax(mx, ls->tail[tok_slot(e, t, w * r + i) * 2 * hd + hd + k]);
                    for (uint32_t i = 0; i < r; i++)
                        den +=
                            exp((double)ls->tail[tok_slot(e, t, w * r + i) * 2 * hd + hd + k] - mx);
                    for (uint32_t i = 0; i < r; i++) {
                        const float *tl = ls->tail + tok_slot(e, t, w * r + i) * 2 * hd;
                        acc += (double)tl[k] * (exp((double)tl[hd + k] - mx) / den);
                    }
                    lat[k] = (float)acc;
                }
                e->lat_w[n_lat] = w;
                e->lat_t[n_lat++] = t;
            }
        }
        for (uint32_t i = 0; i < n_lat; i++)
            tm_dsv_rmsnorm(e->lat + (size_t)i * hd, nw, hd, c->norm_eps);
        float csg[TM_DSV41_MAX_ROPE / 2], sng[TM_DSV41_MAX_ROPE / 2];
        if (c->index_source[il] && n_lat) { // this layer owns the index keys
            lin(e, &L->i_wk, 0, e->lat, hd, n_lat, hd, e->lk, e->di, e->di);
            tm_dsv_vec_f32(&L->i_k_norm, nw);
            for (uint32_t i = 0; i < n_lat; i++) {
                float *k = e->lk + (size_t)i * e->di;
                tm_dsv_rmsnorm(k, nw, e->di, c->norm_eps);
                tm_dsv_cos_sin(c->inv_freq_comp, rd, e->lat_w[i] * r, csg, sng);
                tm_dsv_rope_head(k, e->di, rd, csg, sng, 1.0f);
                tm_dsv_fp4_act_quant(k, e->di, 32, 0);
                memcpy(ls->ikey + comp_slot(e, e->lat_t[i], e->lat_w[i], r) * e->di, k,
                       e->di * sizeof(float));
            }
        }
        for (uint32_t i = 0; i < n_lat; i++) {
            float *lat = e->lat + (size_t)i * hd;
            tm_dsv_cos_sin(c->inv_freq_comp, rd, e->lat_w[i] * r, csg, sng);
            tm_dsv_rope_head(lat, hd, rd, csg, sng, 1.0f);
            tm_dsv_fp4_act_quant(lat, hd, 16, 1);
            memcpy(ls->comp + comp_slot(e, e->lat_t[i], e->lat_w[i], r) * hd, lat,
                   hd * sizeof(float));
        }
    }
    tok_job j = {e, il};
    if (r && c->index_source[il]) {
        lin(e, &L->i_wq_b, (uint64_t)e->sh.ih0 * e->di, e->qr, e->qlr, T, e->qlr, e->iq,
            e->Hi * e->di, e->Hi * e->di);
        lin(e, &L->i_wproj, e->sh.ih0, e->x, e->D, T, e->D, e->iw, e->Hi, e->Hi);
        for (uint32_t t = 0; t < T; t++)
            for (uint32_t h = 0; h < e->Hi; h++) {
                float *q = e->iq + ((size_t)t * e->Hi + h) * e->di;
                tm_dsv_rope_head(q, e->di, rd, cs + (size_t)t * half, sn + (size_t)t * half, 1.0f);
                tm_dsv_fp4_act_quant(q, e->di, 32, 0);
            }
        if (e->tp > 1) {
            tm_cpu_pool_run(e->pool, index_score_item, &j, T);
            allreduce(e, e->isc, (size_t)T * e->isc_ld);
        }
        tm_cpu_pool_run(e->pool, index_item, &j, T);
    }
    tm_cpu_pool_run(e->pool, attn_item, &j, T);
    // grouped wo_a (block-diagonal), then wo_b
    for (uint32_t g = 0; g < e->G; g++)
        lin_aq(e, 0, &L->wo_a, (uint64_t)(e->sh.g0 + g) * e->olr, e->o + (size_t)g * e->ing,
               e->H * hd, T, e->ing, e->oa + (size_t)g * e->olr, e->G * e->olr,
               e->olr); // bf16 einsum: no aq
    // wo_b: row-parallel over the groups (its input act_quant'ed per rank, as RowParallelLinear)
    const tm_tensor *wob = e->tp > 1 ? &e->wo_b_sl[il] : &L->wo_b;
    lin_aq(e, L->wo_b.quant != TM_QUANT_NONE, wob, 0, e->oa, e->G * e->olr, T, e->G * e->olr, e->y,
           e->D, e->D);
    allreduce(e, e->y, (size_t)T * e->D);
}

/* ---- MoE ---- */

/* One expert (w1, w3, w2) on the n gathered rows of xg; the routing weight (wt, or NULL for the
 * shared expert) multiplies before w2. Output in eo. */
static void expert(v41_eng *e, const tm_tensor *w1, const tm_tensor *w3, const tm_tensor *w2,
                   uint32_t n, const float *wt) {
    const uint32_t D = e->D, I = e->I;
    const float lim = e->c->swiglu_limit;
    lin(e, w1, 0, e->xg, D, n, D, e->g, I, I);
    lin(e, w3, 0, e->xg, D, n, D, e->u, I, I);
    tm_dsv_swiglu(e->g, e->u, n, I, lim, wt);
    lin(e, w2, 0, e->g, I, n, I, e->eo, D, D);
}

static void layer_moe(v41_eng *e, uint32_t il, uint32_t T) {
    const tm_dsv41_layer *L = &e->w->layers[il];
    const tm_dsv41_cfg *c = e->c;
    const uint32_t D = e->D, E = e->E, K = e->K;
    float *bias = e->vec;
    tm_dsv_vec_f32(&L->gate_bias, bias);
    lin(e, &L->gate_w, 0, e->x, D, T, D, e->rl, E, E);
    for (uint32_t t = 0; t < T; t++) {
        float *sc = e->rl + (size_t)t * E;
        double mx = -INFINITY, den = 0.0;
        for (uint32_t i = 0; i < E; i++)
            mx = fmax(mx, (double)sc[i] / c->gate_temp);
        for (uint32_t i = 0; i < E; i++) {
            const double z = (double)sc[i] / c->gate_temp;
            double v;
            if (c->score_func == TM_DSV41_SCORE_SOFTMAX) {
                den += exp(z - mx);
                continue; // rounded below, once the sum is known
            } else if (c->score_func == TM_DSV41_SCORE_SIGMOID) {
                v = 1.0 / (1.0 + exp(-z));
            } else {
                v = sqrt(z > 20.0 ? z : log1p(exp(z)));
            }
            sc[i] = (float)v;
        }
        if (c->score_func == TM_DSV41_SCORE_SOFTMAX) // exp(z - mx) / sum, rounded once
            for (uint32_t i = 0; i < E; i++)
                sc[i] = (float)(exp((double)sc[i] / c->gate_temp - mx) / den);
        // top-k of score + bias (ties to the lower id), weights from the raw scores
        float *biased = e->score; // thread 0's scratch: this loop runs on the caller
        uint32_t *ord = e->ord, *tmp = e->ord + e->max_ent / 2;
        for (uint32_t i = 0; i < E; i++) {
            biased[i] = sc[i] + bias[i];
            ord[i] = i;
        }
        sort_desc(ord, tmp, E, biased);
        double sum = 0.0;
        for (uint32_t k = 0; k < K; k++)
            sum += (double)sc[ord[k]];
        for (uint32_t k = 0; k < K; k++) {
            double wv = sc[ord[k]];
            if (c->norm_topk_prob && K > 1)
                wv = wv / (sum + 1e-20);
            e->sel[(size_t)t * K + k] = ord[k];
            e->selw[(size_t)t * K + k] = (float)(wv * c->route_scale);
        }
    }
    for (size_t i = 0; i < (size_t)T * D; i++)
        e->yacc[i] = 0.0;
    for (uint32_t ex = e->sh.e0; ex < e->sh.e0 + e->sh.n_expert; ex++) { // in id order
        uint32_t n = 0;
        for (uint32_t t = 0; t < T; t++)
            for (uint32_t k = 0; k < K; k++)
                if (e->sel[(size_t)t * K + k] == ex) {
                    e->etok[n] = t;
                    memcpy(e->xg + (size_t)n * D, e->x + (size_t)t * D, D * sizeof(float));
                    e->lat[n] = e->selw[(size_t)t * K + k]; // lat: scratch for the weights
                    n++;
                }
        if (!n)
            continue;
        expert(e, &L->experts[ex * 3], &L->experts[ex * 3 + 1], &L->experts[ex * 3 + 2], n, e->lat);
        for (uint32_t i = 0; i < n; i++)
            for (uint32_t d = 0; d < D; d++)
                e->yacc[(size_t)e->etok[i] * D + d] += e->eo[(size_t)i * D + d];
    }
    memcpy(e->xg, e->x, (size_t)T * D * sizeof(float));
    expert(e, &L->sh_w1, &L->sh_w3, &L->sh_w2, T, NULL);
    if (e->tp <= 1) {
        for (size_t i = 0; i < (size_t)T * D; i++)
            e->y[i] = (float)(e->yacc[i] + e->eo[i]);
    } else { // the routed experts all-reduced over the ranks, then the shared one (replicated)
        for (size_t i = 0; i < (size_t)T * D; i++)
            e->y[i] = (float)e->yacc[i];
        allreduce(e, e->y, (size_t)T * D);
        for (size_t i = 0; i < (size_t)T * D; i++)
            e->y[i] = (float)((double)e->y[i] + e->eo[i]);
    }
}

/* ---- forward ---- */

static tm_rc v41_forward(tm_engine *eng, const tm_batch *b, float *logits, tm_err *err) {
    v41_eng *e = eng->impl;
    const tm_dsv41_cfg *c = e->c;
    uint32_t T = 0;
    uint64_t n_bt = 0;
    tm_rc rc = tm_batch_check(b, &eng->opts, e->max_pos, c->vocab_size, "dsv41 forward", &T, &n_bt,
                              err);
    if (rc)
        return rc;
    (void)n_bt;
    if (!T)
        return TM_OK;
    uint32_t n_want = 0;
    T = 0;
    for (uint32_t s = 0; s < b->n_seq; s++) {
        const tm_batch_seq *sq = &b->seqs[s];
        for (uint32_t i = 0; i < sq->n_tok; i++) {
            if (e->lay && sq->tokens[i] >= e->n_tmap)
                return TM_ERR(err, TM_E_INVAL,
                              "dsv41 forward: token id %u has no entry in the Engram compressed "
                              "token map (%u entries)",
                              sq->tokens[i], e->n_tmap);
            e->tok_pos[T] = sq->pos + i;
            e->tok_seq[T] = s;
            e->tok_id[T] = sq->tokens[i];
            T++;
        }
        n_want += tm_batch_seq_rows(sq);
    }
    e->b = b;
    const uint32_t D = e->D, N = e->N, half = e->rd / 2;
    // Engram context: every token's compressed id into its slot, then the hash ids
    if (e->lay) {
        for (uint32_t t = 0; t < T; t++)
            e->cid[tok_slot(e, t, e->tok_pos[t])] = e->tmap[e->tok_id[t]];
        const uint32_t ng = c->engram_max_ngram_size;
        for (uint32_t t = 0; t < T; t++) {
            int64_t ctx[TM_ENGRAM_MAX_NGRAM];
            const uint32_t p = e->tok_pos[t];
            for (uint32_t k = 0; k < ng; k++)
                ctx[k] = k <= p ? (int64_t)e->cid[tok_slot(e, t, p - k)] : TM_ENGRAM_NONE;
            tm_engram_hash_ids(e->lay, ctx, e->hid + (size_t)t * c->n_engram * e->n_cols);
        }
        // every table's rows requested now, read while the layers before it run
        const uint32_t nc = e->n_cols;
        for (uint32_t k = 0; k < c->n_engram; k++) {
            uint64_t *rows = e->hrows + (size_t)k * e->T * nc;
            for (uint32_t t = 0; t < T; t++)
                for (uint32_t j = 0; j < nc; j++)
                    rows[(size_t)t * nc + j] =
                        (uint64_t)e->hid[((size_t)t * c->n_engram + k) * nc + j];
            tm_engram_table_prefetch(e->etab[k], rows, (size_t)T * nc);
        }
    }
    // vocab-parallel: the rank holding a row gives it
    tm_dsv_embed_slice(&e->m->embd, e->tok_id, T, e->sh.vocab0, e->sh.n_vocab, D, e->x);
    allreduce(e, e->x, (size_t)T * D);
    for (uint32_t t = 0; t < T; t++) {
        float *st = e->s + (size_t)t * N * D;
        memcpy(st, e->x + (size_t)t * D, D * sizeof(float));
        for (uint32_t i = 1; i < N; i++)
            memcpy(st + (size_t)i * D, st, D * sizeof(float));
        for (uint32_t i = 0; i < N; i++)
            e->pre[(size_t)t * N + i] = i == 0 ? 1.0f : 0.0f; // make_identity_pre_mix
        tm_dsv_cos_sin(c->inv_freq_main, e->rd, e->tok_pos[t], e->cs_m + (size_t)t * half,
                       e->sn_m + (size_t)t * half);
        tm_dsv_cos_sin(c->inv_freq_comp, e->rd, e->tok_pos[t], e->cs_c + (size_t)t * half,
                       e->sn_c + (size_t)t * half);
    }
    float *nw = e->vec;
    tm_dsv41_drafter_begin(e->dsp, T);
    for (uint32_t il = 0; il < c->n_layers; il++) {
        const tm_dsv41_layer *L = &e->w->layers[il];
        if (c->engram_slot[il] >= 0) {
            rc = engram(e, il, T, err);
            if (rc)
                return rc;
        }
        tm_dsv41_drafter_capture(e->dsp, il, T, e->s); // DSpark: the target layers' inputs
        // attention takes the previous sublayer's pre mix; its own mixes give its post / comb
        // and the MoE's pre mix
        hc_mixes(e, &L->hc_attn_fn, &L->hc_attn_scale, &L->hc_attn_base, T, e->apre, e->post,
                 e->comb);
        tm_dsv_collapse_norm(e->s, N, D, T, e->pre, &L->attn_norm, c->norm_eps, nw, e->x);
        layer_attn(e, il, T);
        tm_dsv_hc_expand(e->s, e->N, e->D, T, e->y, e->post, e->comb);
        hc_mixes(e, &L->hc_ffn_fn, &L->hc_ffn_scale, &L->hc_ffn_base, T, e->pre, e->post, e->comb);
        tm_dsv_collapse_norm(e->s, N, D, T, e->apre, &L->ffn_norm, c->norm_eps, nw, e->x);
        layer_moe(e, il, T);
        tm_dsv_hc_expand(e->s, e->N, e->D, T, e->y, e->post, e->comb);
    }
    if (!n_want)
        return TM_OK;
    // the head: the last FFN's pre mix collapses the streams, norm, head (wanted rows only)
    uint32_t r = 0, t0 = 0;
    for (uint32_t s = 0; s < b->n_seq; s++) {
        t0 += b->seqs[s].n_tok;
        for (uint32_t k = tm_batch_seq_rows(&b->seqs[s]); k > 0; k--, r++) {
            const uint32_t t = t0 - k;
            memmove(e->s + (size_t)r * N * D, e->s + (size_t)t * N * D,
                    (size_t)N * D * sizeof(float));
            memmove(e->pre + (size_t)r * N, e->pre + (size_t)t * N, N * sizeof(float));
        }
    }
    tm_dsv_collapse_norm(e->s, N, D, r, e->pre, &e->m->out_norm, c->norm_eps, nw, e->x);
    lin(e, &e->m->lm_head, e->sh.vocab0, e->x, D, r, D, logits, e->sh.n_vocab, e->sh.n_vocab);
    return TM_OK;
}

static tm_rc v41_kv_copy(tm_engine *eng, uint32_t src, uint32_t dst, uint32_t n_tok, tm_err *err) {
    v41_eng *e = eng->impl;
    if (src >= e->n_block || dst >= e->n_block || n_tok > e->bs)
        return TM_ERR(err, TM_E_INVAL, "dsv41 kv_copy: bad blocks %u -> %u or %u tokens", src, dst,
                      n_tok);
    if (src == dst)
        return TM_OK;
    const size_t bs = e->bs;
    for (uint32_t il = 0; il < e->c->n_layers; il++) {
        const v41_state *ls = &e->st[il];
        memcpy(ls->win + dst * bs * e->hd, ls->win + src * bs * e->hd,
               n_tok * e->hd * sizeof(float));
        if (ls->tail)
            memcpy(ls->tail + dst * bs * 2 * e->hd, ls->tail + src * bs * 2 * e->hd,
                   n_tok * 2 * e->hd * sizeof(float));
        if (ls->comp) {
            // compressed rows exist only for the groups closed within the first n_tok slots
            const uint32_t r = e->c->ratio[il];
            const size_t rows = bs / r, n_done = n_tok / r;
            memcpy(ls->comp + dst * rows * e->hd, ls->comp + src * rows * e->hd,
                   n_done * e->hd * sizeof(float));
            if (ls->ikey)
                memcpy(ls->ikey + dst * rows * e->di, ls->ikey + src * rows * e->di,
                       n_done * e->di * sizeof(float));
        }
    }
    if (e->cid)
        memcpy(e->cid + dst * bs, e->cid + src * bs, n_tok * sizeof(int32_t));
    tm_dsv41_drafter_kv_copy(e->dsp, src, dst, n_tok);
    return TM_OK;
}

/* ---- create / destroy ---- */

tm_rc tm_dsv41_engine_create(const tm_model *m, const tm_engine_opts *opts, tm_engine **out,
                             tm_err *err) {
    const tm_dsv41 *w = tm_model_dsv41(m);
    if (!w)
        return TM_ERR(err, TM_E_INVAL, "dsv41 engine: not a DeepSeek-V4.1 model");
    const tm_dsv41_cfg *c = &w->cfg;
    if (!opts->block_size || !opts->n_kv_block || !opts->max_seqs || !opts->max_batched_tokens)
        return TM_ERR(err, TM_E_INVAL,
                      "dsv41 engine: block_size, n_kv_block, max_seqs and max_batched_tokens "
                      "must be > 0");
    if (opts->kv_dtype != TM_KV_DTYPE_AUTO)
        return TM_ERR(err, TM_E_INVAL,
                      "dsv41 engine: kv_cache_dtype %s not supported (auto: the reference's own "
                      "fp8/fp4 rounding of the cache is always applied)",
                      tm_kv_dtype_name(opts->kv_dtype));
    const uint32_t tp = TM_MAX(opts->tp_size, 1u), rank = tp > 1 ? opts->tp_rank : 0;
    if (tp > 1 && !opts->allreduce)
        return TM_ERR(err, TM_E_INVAL, "dsv41 engine: tp_size %u without an all-reduce", tp);
    tm_shard_dsv41 sh;
    tm_rc src = tm_shard_dsv41_split(&sh, c->n_heads, c->o_groups, c->index_n_heads,
                                     c->n_routed_experts, c->vocab_size, rank, tp, err);
    if (src)
        return src;
    for (uint32_t il = 0; il < c->n_layers; il++)
        if (c->ratio[il] && opts->block_size % c->ratio[il])
            return TM_ERR(err, TM_E_INVAL,
                          "dsv41 engine: block_size %u is not a multiple of layer %u's "
                          "compression ratio %u",
                          opts->block_size, il, c->ratio[il]);
    if (c->n_engram) {
        tm_rc mrc = tm_dsv41_engram_map_check(c, opts->token_map, opts->n_token_map, "dsv41 engine",
                                              err);
        if (mrc)
            return mrc;
    }
    const uint64_t max_pos64 = (uint64_t)opts->n_kv_block * opts->block_size;
    if (max_pos64 > (1u << 28))
        return TM_ERR(err, TM_E_INVAL, "dsv41 engine: KV pool too large");
    v41_eng *e = tm_calloc(1, sizeof(*e));
    if (!e)
        return TM_ERR(err, TM_E_NOMEM, "dsv41 engine header");
    tm_rc rc = TM_OK;
    e->eng.ops = &v41_ops;
    e->eng.model = m;
    e->eng.opts = *opts;
    e->eng.impl = e;
    e->m = m;
    e->w = w;
    e->c = c;
    e->tp = tp;
    e->rank = rank;
    e->sh = sh;
    e->n_thread = opts->n_threads;
    if (!e->n_thread) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        e->n_thread = n > 0 ? (uint32_t)n : 1;
    }
    e->eng.opts.n_threads = e->n_thread;
    e->bs = opts->block_size;
    e->n_block = opts->n_kv_block;
    e->max_pos = (uint32_t)TM_MIN(max_pos64, (uint64_t)c->max_seq_len);
    e->T = opts->max_batched_tokens;
    e->S = opts->max_seqs;
    e->D = c->dim;
    e->N = c->hc_mult;
    e->H = sh.n_head; // this rank's heads (all at tp 1)
    e->hd = c->head_dim;
    e->rd = c->rope_head_dim;
    e->qlr = c->q_lora_rank;
    e->G = sh.n_group;
    e->olr = c->o_lora_rank;
    e->ing = c->n_heads * e->hd / c->o_groups;
    e->E = c->n_routed_experts;
    e->K = c->n_activated_experts;
    e->I = c->moe_inter_dim;
    e->Hi = sh.n_ihead;
    e->di = c->index_head_dim;
    e->mix = (2 + e->N) * e->N;
    e->iscale = pow((double)e->di, -0.5) * pow((double)c->index_n_heads, -0.5);
    e->topk = c->index_topk;
    e->cb = c->candidate_block_size ? c->candidate_block_size : 1;
    e->ctop = c->candidate_topk_blocks ? c->candidate_topk_blocks : 1;
    e->n_cols = c->n_engram ? (c->engram_max_ngram_size - 1) * c->engram_n_heads : 0;
    e->ehd = c->engram_head_dim;
    {
        uint32_t mi = TM_MAX(e->N * e->D, e->qlr);
        mi = TM_MAX(mi, e->hd);
        mi = TM_MAX(mi, e->ing);
        mi = TM_MAX(mi, e->G * e->olr);
        mi = TM_MAX(mi, e->I);
        mi = TM_MAX(mi, e->n_cols * e->ehd);
        e->max_in = mi;
    }
    // entries an indexer may score: positions / the smallest ratio; twice for the sort scratch
    uint32_t rmin = 0;
    for (uint32_t il = 0; il < c->n_layers; il++)
        if (c->ratio[il] && (!rmin || c->ratio[il] < rmin))
            rmin = c->ratio[il];
    e->max_ent = 2 * (TM_MAX(e->E, rmin ? e->max_pos / rmin : 1u) + 2);
    const size_t T = e->T, slots = (size_t)e->n_block * e->bs, nt = e->n_thread;
    int failed = 0;
#define AL(p, n)                                                                                   \
    do {                                                                                           \
        (p) = tm_calloc(TM_MAX((size_t)(n), (size_t)1), sizeof(*(p)));                             \
        failed |= !(p);                                                                            \
    } while (0)
    AL(e->st, c->n_layers);
    for (uint32_t il = 0; !failed && il < c->n_layers; il++) {
        const uint32_t r = c->ratio[il];
        AL(e->st[il].win, slots * e->hd);
        if (c->kv_source[il]) {
            if (r > 1)
                AL(e->st[il].tail, slots * 2 * e->hd);
            AL(e->st[il].comp, slots / r * e->hd);
            if (c->index_source[il])
                AL(e->st[il].ikey, slots / r * e->di);
        }
    }
    AL(e->tok_seq, T);
    AL(e->tok_pos, T);
    AL(e->tok_id, T);
    AL(e->cs_m, T * (e->rd / 2));
    AL(e->sn_m, T * (e->rd / 2));
    AL(e->cs_c, T * (e->rd / 2));
    AL(e->sn_c, T * (e->rd / 2));
    AL(e->s, T * e->N * e->D);
    AL(e->x, T * e->D);
    AL(e->y, T * e->D);
    AL(e->xin, T * e->max_in);
    AL(e->pre, T * e->N);
    AL(e->apre, T * e->N);
    AL(e->post, T * e->N);
    AL(e->comb, T * e->N * e->N);
    AL(e->mixes, T * e->mix);
    AL(e->qr, T * e->qlr);
    AL(e->q, T * e->H * e->hd);
    AL(e->kv, T * e->hd);
    AL(e->o, T * e->H * e->hd);
    AL(e->oa, T * e->G * e->olr);
    AL(e->ckv, T * e->hd);
    AL(e->cgate, T * e->hd);
    AL(e->lat, T * TM_MAX(e->hd, 1u));
    AL(e->lk, T * e->di);
    AL(e->lat_w, T);
    AL(e->lat_t, T);
    AL(e->iq, T * e->Hi * e->di);
    AL(e->iw, T * e->Hi);
    AL(e->pick, T * e->topk);
    AL(e->n_pick, T);
    AL(e->cand, T * e->ctop);
    AL(e->n_cand, T);
    AL(e->rl, T * e->E);
    AL(e->sel, T * e->K);
    AL(e->selw, T * e->K);
    AL(e->etok, T);
    AL(e->xg, T * e->D);
    AL(e->g, T * e->I);
    AL(e->u, T * e->I);
    AL(e->eo, T * e->D);
    AL(e->yacc, T * e->D);
    AL(e->wrow, nt * e->max_in);
    AL(e->score, nt * e->max_ent);
    AL(e->ord, nt * e->max_ent);
    AL(e->cmask, nt * e->max_ent);
    AL(e->ascore, nt * (c->window_size + e->topk));
    AL(e->vec, TM_MAX(TM_MAX(e->D, e->qlr), TM_MAX(TM_MAX(e->hd, e->di), e->E)));
    if (tp > 1) {
        e->isc_ld = e->max_ent / 2;
        AL(e->isc, T * e->isc_ld);
        AL(e->wo_b_sl, c->n_layers);
    }
    if (c->n_engram) {
        AL(e->cid, slots);
        AL(e->hid, T * c->n_engram * e->n_cols);
        AL(e->erow, T * e->n_cols * e->ehd);
        AL(e->ekv, T * (e->N + 1) * e->D);
        AL(e->hrows, T * c->n_engram * e->n_cols);
        AL(e->etab, c->n_engram);
    }
#undef AL
    for (uint32_t il = 0; !failed && tp > 1 && il < c->n_layers; il++)
        failed |= tm_dsv_col_slice(&w->layers[il].wo_b, (uint64_t)sh.g0 * e->olr,
                                   (uint64_t)sh.n_group * e->olr, &e->wo_b_sl[il]);
    if (failed) {
        rc = TM_ERR(err, TM_E_NOMEM, "dsv41 engine buffers");
        goto fail;
    }
    if (c->n_engram) {
        e->tmap = opts->token_map;
        e->n_tmap = opts->n_token_map;
        rc = tm_dsv41_engram_open(c, m->dir, opts->token_map, rank, tp, opts->engram_cache_mb,
                                  &e->lay, e->etab, err);
        if (rc)
            goto fail;
    }
    rc = tm_cpu_pool_create(e->n_thread, &e->pool, err);
    if (rc == TM_OK && w->dspark && tp == 1) // DSpark: tp 1 only (docs/speculative.md)
        rc = tm_dsv41_drafter_create(m, &e->eng.opts, e->n_thread, &e->dsp, err);
    if (rc)
        goto fail;
    *out = &e->eng;
    return TM_OK;
fail:
    v41_destroy(&e->eng);
    return rc;
}

static void v41_destroy(tm_engine *eng) {
    if (!eng)
        return;
    v41_eng *e = eng->impl;
    tm_cpu_pool_destroy(e->pool);
    tm_dsv41_drafter_destroy(e->dsp);
    tm_engram_layout_destroy(e->lay);
    for (uint32_t k = 0; e->etab && k < e->c->n_engram; k++)
        tm_engram_table_close(e->etab[k]);
    for (uint32_t il = 0; e->wo_b_sl && il < e->c->n_layers; il++)
        tm_free((void *)e->wo_b_sl[il].data);
    if (e->st)
        for (uint32_t il = 0; il < e->c->n_layers; il++) {
            tm_free(e->st[il].win);
            tm_free(e->st[il].tail);
            tm_free(e->st[il].comp);
            tm_free(e->st[il].ikey);
        }
    void *bufs[] = {e->st,     e->tok_seq, e->tok_pos, e->tok_id, e->cs_m,  e->sn_m,   e->cs_c,
                    e->sn_c,   e->s,       e->x,       e->y,      e->xin,   e->pre,    e->apre,
                    e->post,   e->comb,    e->mixes,   e->qr,     e->q,     e->kv,     e->o,
                    e->oa,     e->ckv,     e->cgate,   e->lat,    e->lk,    e->lat_w,  e->lat_t,
                    e->iq,     e->iw,      e->pick,    e->n_pick, e->cand,  e->n_cand, e->rl,
                    e->sel,    e->selw,    e->etok,    e->xg,     e->g,     e->u,      e->eo,
                    e->yacc,   e->wrow,    e->score,   e->ord,    e->cmask, e->ascore, e->cid,
                    e->hid,    e->erow,    e->ekv,     e->vec,    e->hrows, e->etab,   e->isc,
                    e->wo_b_sl};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        tm_free(bufs[i]);
    tm_free(e);
}

const tm_cpu_arch tm_cpu_arch_dsv41 = {
    .name = "deepseek_v41",
    .kv_dtypes = TM_CPU_KV(TM_KV_DTYPE_AUTO), // the reference's own fp8/fp4 cache rounding
    .create = tm_dsv41_engine_create,
};
