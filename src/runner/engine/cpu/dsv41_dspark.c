/* runner/engine/cpu/dsv41_dspark.c - the DeepSeek-V4.1 DSpark drafter on the CPU (header has the
 * contract). Op for op as the reference's forward_spec (tests/oracles/v41_ref.py mirrors it):
 *   main_x = main_norm(main_proj(act_quant(hidden)))                    (stage 0's, every stage)
 *   per stage: window row of position p = act_quant(rope_p(kv_norm(wkv(main_x_p))))
 *   block: tokens [anchor, noise x (B-1)] at positions P+1 .. P+B, embedded, hc copies, identity
 *   pre mix; each stage is a Block whose attention takes q, kv from the block (rope at their
 *   positions, kv act_quant'ed) and attends, with the sink, to the window rows of positions
 *   max(0, P-win+1) .. P and to every block position (no causal mask); MoE with the stages'
 *   expert counts. Head: hc_pre with the last pre mix, the last stage's norm, the backbone head;
 *   row i += markov_head(markov_embed[pick i-1]), pick i = argmax. Confidence: proj(x_i | embed).
 * The small kernels (act_quant, rmsnorm, the rope angles, hyper-connection collapse / expand, the
 * SwiGLU) are dsv41.c's, from dsv_common.h; the double-accumulated linear is its own (one
 * accumulator, where dsv41.c's sums four). */
#include "runner/engine/cpu/dsv41_dspark.h"

#include <math.h>
#include <string.h>

#include "base/alloc.h"
#include "runner/engine/cpu/dsv_common.h"
#include "runner/engine/cpu/thread_pool.h"
#include "runner/model/dsv41_dspark.h"
#include "runner/model/model_dsv41.h"

struct tm_dsv41_drafter {
    const tm_model *m;
    const tm_dsv41_cfg *c;
    const tm_dsv41_dspark *p;
    tm_cpu_pool *pool;
    uint32_t n_thread;
    uint32_t bs, n_block, T, S, B, TB;
    uint32_t D, N, H, hd, rd, qlr, G, olr, ing, E, K, I, R, V, width, mix, max_in;
    int8_t tgt_slot[TM_DSV41_MAX_LAYER]; /* layer -> index in the target list, or -1 */
    float **win;                         /* [n_stage][n_block*bs][hd] */
    float *hid;                          /* [T][width] the last forward's captured rows */
    uint32_t n_hid;
    /* per draft call */
    const tm_engine_draft_seq *seqs;
    uint32_t *tok_seq, *tok_pos, *tok_blk; /* [TB] block tokens: sequence, position, first row */
    uint32_t *tok_P;                       /* [TB] the block's start_pos */
    float *mx, *kvm;                       /* [T][D], [T][hd] */
    float *cs, *sn;                        /* [max(T,TB)][rd/2] */
    float *s, *x, *y, *xin;
    float *pre, *apre, *post, *comb, *mixes;
    float *qr, *q, *kv, *o, *oa;
    float *rl, *selw, *xg, *g, *u, *eo;
    uint32_t *sel, *etok, *ord;
    double *yacc, *ascore;
    float *wrow, *vec, *bias, *mk, *conf;
    uint32_t n_conf;
};

/* ---- the linear (act_quant, rmsnorm, rope angles: dsv_common.h) ---- */

static float dotd(const float *a, const float *b, uint32_t n) {
    double acc = 0.0;
    for (uint32_t i = 0; i < n; i++)
        acc += (double)a[i] * (double)b[i];
    return (float)acc;
}

typedef struct lin_job {
    tm_dsv41_drafter *d;
    const tm_tensor *w;
    const float *x;
    uint32_t ldx, n_tok, n_in, n_out, ldo, per_item;
    uint64_t row0;
    float *out;
} lin_job;

static void lin_item(void *ctx, uint32_t item, uint32_t tid) {
    const lin_job *j = ctx;
    float *wr = j->d->wrow + (size_t)tid * j->d->max_in;
    const uint32_t o1 = TM_MIN(j->n_out, (item + 1) * j->per_item);
    for (uint32_t o = item * j->per_item; o < o1; o++) {
        tm_tensor_row_f32(j->w, (size_t)(j->row0 + o), wr);
        for (uint32_t t = 0; t < j->n_tok; t++)
            j->out[(size_t)t * j->ldo + o] = dotd(j->x + (size_t)t * j->ldx, wr, j->n_in);
    }
}

/* out[t][o] = x[t] . w[row0 + o]; x act_quant'ed first when aq (FP8 / FP4 weights). */
static void lin_aq(tm_dsv41_drafter *d, int aq, const tm_tensor *w, uint64_t row0, const float *x,
                   uint32_t ldx, uint32_t n_tok, uint32_t n_in, float *out, uint32_t ldo,
                   uint32_t n_out) {
    if (!n_tok || !n_out)
        return;
    TM_ASSERT(n_in <= d->max_in && w->shape[w->n_dim - 1] == n_in);
    if (aq) {
        TM_ASSERT(n_in % 32 == 0);
        for (uint32_t t = 0; t < n_tok; t++) {
            memcpy(d->xin + (size_t)t * d->max_in, x + (size_t)t * ldx, n_in * sizeof(float));
            tm_dsv_act_quant(d->xin + (size_t)t * d->max_in, n_in);
        }
        x = d->xin;
        ldx = d->max_in;
    }
    lin_job j = {d, w, x, ldx, n_tok, n_in, n_out, ldo, 0, row0, out};
    j.per_item = TM_MAX(1u, TM_CEIL_DIV(n_out, d->n_thread * 4));
    tm_cpu_pool_run(d->pool, lin_item, &j, TM_CEIL_DIV(n_out, j.per_item));
}

static void lin(tm_dsv41_drafter *d, const tm_tensor *w, const float *x, uint32_t ldx,
                uint32_t n_tok, uint32_t n_in, float *out, uint32_t ldo, uint32_t n_out) {
    lin_aq(d, w->quant != TM_QUANT_NONE, w, 0, x, ldx, n_tok, n_in, out, ldo, n_out);
}

static size_t slot_of(const tm_dsv41_drafter *d, const tm_engine_draft_seq *q, uint32_t p) {
    return (size_t)q->block_table[p / d->bs] * d->bs + p % d->bs;
}

/* ---- hyper-connections (Block.hc_mixes / hc_pre / hc_post) ---- */

static void hc_mixes(tm_dsv41_drafter *d, const tm_tensor *fn, const tm_tensor *scale,
                     const tm_tensor *base, uint32_t T, float *pre, float *post, float *comb) {
    const uint32_t ND = d->N * d->D;
    lin(d, fn, d->s, ND, T, ND, d->mixes, d->mix, d->mix);
    tm_dsv_hc_mix_split(d->s, d->N, d->D, T, d->mixes, scale, base, d->c->norm_eps,
                        d->c->hc_sinkhorn_iters, d->c->hc_eps, pre, post, comb);
}

/* ---- the stage's attention (DSparkAttention.forward, decode) ---- */

typedef struct attn_job {
    tm_dsv41_drafter *d;
    uint32_t k; /* stage */
} attn_job;

static void attn_item(void *ctx, uint32_t t, uint32_t tid) {
    const attn_job *j = ctx;
    tm_dsv41_drafter *d = j->d;
    const tm_engine_draft_seq *q = &d->seqs[d->tok_seq[t]];
    const uint32_t hd = d->hd, win = d->c->window_size, P = d->tok_P[t];
    const uint32_t p0 = P + 1 > win ? P + 1 - win : 0, n_w = P + 1 - p0, n = n_w + d->B;
    const float *wk = d->win[j->k];
    const float *bkv = d->kv + (size_t)d->tok_blk[t] * hd; // the block's rows
    double *sc = d->ascore + (size_t)tid * (win + d->B);
    const double scale = pow((double)hd, -0.5);
    const tm_tensor *sink = &d->p->stages[j->k].attn_sink;
    for (uint32_t h = 0; h < d->H; h++) {
        const float *qh = d->q + ((size_t)t * d->H + h) * hd;
        float *o = d->o + ((size_t)t * d->H + h) * hd;
        const double sk = tm_tensor_get_f32(sink, h);
        double mx = sk;
        for (uint32_t i = 0; i < n; i++) {
            const float *row = i < n_w ? wk + slot_of(d, q, p0 + i) * hd : bkv + (i - n_w) * hd;
            double acc = 0.0;
            for (uint32_t k = 0; k < hd; k++)
                acc += (double)qh[k] * row[k];
            sc[i] = acc * scale;
            mx = fmax(mx, sc[i]);
        }
        double den = exp(sk - mx);
        double acc[1024];
        TM_ASSERT(hd <= 1024);
        for (uint32_t k = 0; k < hd; k++)
            acc[k] = 0.0;
        for (uint32_t i = 0; i < n; i++) {
            const float *row = i < n_w ? wk + slot_of(d, q, p0 + i) * hd : bkv + (i - n_w) * hd;
            const double pr = exp(sc[i] - mx);
            den += pr;
            for (uint32_t k = 0; k < hd; k++)
                acc[k] += pr * row[k];
        }
        for (uint32_t k = 0; k < hd; k++)
            o[k] = (float)(acc[k] / den);
        tm_dsv_rope_head(o, hd, d->rd, d->cs + (size_t)t * (d->rd / 2),
                         d->sn + (size_t)t * (d->rd / 2), -1.0f);
    }
}

static void stage_attn(tm_dsv41_drafter *d, uint32_t k, uint32_t T) {
    const tm_dsv41_layer *L = &d->p->stages[k];
    const uint32_t hd = d->hd, rd = d->rd, half = rd / 2;
    const float eps = d->c->norm_eps;
    float *nw = d->vec;
    lin(d, &L->wq_a, d->x, d->D, T, d->D, d->qr, d->qlr, d->qlr);
    tm_dsv_vec_f32(&L->q_norm, nw);
    for (uint32_t t = 0; t < T; t++)
        tm_dsv_rmsnorm(d->qr + (size_t)t * d->qlr, nw, d->qlr, eps);
    lin(d, &L->wq_b, d->qr, d->qlr, T, d->qlr, d->q, d->H * hd, d->H * hd);
    for (uint32_t t = 0; t < T; t++)
        for (uint32_t h = 0; h < d->H; h++)
            tm_dsv_rope_head(d->q + ((size_t)t * d->H + h) * hd, hd, rd, d->cs + (size_t)t * half,
                             d->sn + (size_t)t * half, 1.0f);
    lin(d, &L->wkv, d->x, d->D, T, d->D, d->kv, hd, hd);
    tm_dsv_vec_f32(&L->kv_norm, nw);
    for (uint32_t t = 0; t < T; t++) {
        float *kv = d->kv + (size_t)t * hd;
        tm_dsv_rmsnorm(kv, nw, hd, eps);
        tm_dsv_rope_head(kv, hd, rd, d->cs + (size_t)t * half, d->sn + (size_t)t * half, 1.0f);
        tm_dsv_act_quant(kv, hd);
    }
    attn_job j = {d, k};
    tm_cpu_pool_run(d->pool, attn_item, &j, T);
    for (uint32_t g = 0; g < d->G; g++) // wo_a: bf16 einsum in the reference (no act_quant)
        lin_aq(d, 0, &L->wo_a, (uint64_t)g * d->olr, d->o + (size_t)g * d->ing, d->H * hd, T,
               d->ing, d->oa + (size_t)g * d->olr, d->G * d->olr, d->olr);
    lin(d, &L->wo_b, d->oa, d->G * d->olr, T, d->G * d->olr, d->y, d->D, d->D);
}

/* ---- the stage's MoE (MoE / Gate / Expert, the stages' expert counts) ---- */

static void expert(tm_dsv41_drafter *d, const tm_tensor *w1, const tm_tensor *w3,
                   const tm_tensor *w2, uint32_t n, const float *wt) {
    const uint32_t D = d->D, I = d->I;
    const float lim = d->c->swiglu_limit;
    lin(d, w1, d->xg, D, n, D, d->g, I, I);
    lin(d, w3, d->xg, D, n, D, d->u, I, I);
    tm_dsv_swiglu(d->g, d->u, n, I, lim, wt);
    lin(d, w2, d->g, I, n, I, d->eo, D, D);
}

static void stage_moe(tm_dsv41_drafter *d, uint32_t k, uint32_t T) {
    const tm_dsv41_layer *L = &d->p->stages[k];
    const tm_dsv41_cfg *c = d->c;
    const uint32_t D = d->D, E = d->E, K = d->K;
    float *bias = d->bias, *biased = d->vec;
    tm_dsv_vec_f32(&L->gate_bias, bias);
    lin(d, &L->gate_w, d->x, D, T, D, d->rl, E, E);
    for (uint32_t t = 0; t < T; t++) {
        float *sc = d->rl + (size_t)t * E;
        double mx = -INFINITY, den = 0.0;
        for (uint32_t i = 0; i < E; i++)
            mx = fmax(mx, (double)sc[i] / c->gate_temp);
        for (uint32_t i = 0; i < E; i++) {
            const double z = (double)sc[i] / c->gate_temp;
            if (c->score_func == TM_DSV41_SCORE_SOFTMAX)
                den += exp(z - mx);
            else if (c->score_func == TM_DSV41_SCORE_SIGMOID)
                sc[i] = (float)(1.0 / (1.0 + exp(-z)));
            else
                sc[i] = (float)sqrt(z > 20.0 ? z : log1p(exp(z)));
        }
        if (c->score_func == TM_DSV41_SCORE_SOFTMAX)
            for (uint32_t i = 0; i < E; i++)
                sc[i] = (float)(exp((double)sc[i] / c->gate_temp - mx) / den);
        // top-k of score + bias (larger first, ties to the lower id), weights from raw scores
        for (uint32_t i = 0; i < E; i++)
            biased[i] = sc[i] + bias[i];
        uint32_t *ord = d->ord;
        for (uint32_t i = 0; i < E; i++) { // insertion sort: stable, so ties keep id order
            uint32_t j = i;
            while (j > 0 && biased[ord[j - 1]] < biased[i]) {
                ord[j] = ord[j - 1];
                j--;
            }
            ord[j] = i;
        }
        double sum = 0.0;
        for (uint32_t m = 0; m < K; m++)
            sum += (double)sc[ord[m]];
        for (uint32_t m = 0; m < K; m++) {
            double wv = sc[ord[m]];
            if (c->norm_topk_prob && K > 1)
                wv = wv / (sum + 1e-20);
            d->sel[(size_t)t * K + m] = ord[m];
            d->selw[(size_t)t * K + m] = (float)(wv * c->route_scale);
        }
    }
    for (size_t i = 0; i < (size_t)T * D; i++)
        d->yacc[i] = 0.0;
    for (uint32_t ex = 0; ex < E; ex++) {
        uint32_t n = 0;
        float *wts = d->mk; // scratch for the routing weights of this expert's tokens
        for (uint32_t t = 0; t < T; t++)
            for (uint32_t m = 0; m < K; m++)
                if (d->sel[(size_t)t * K + m] == ex) {
                    d->etok[n] = t;
                    memcpy(d->xg + (size_t)n * D, d->x + (size_t)t * D, D * sizeof(float));
                    wts[n++] = d->selw[(size_t)t * K + m];
                }
        if (!n)
            continue;
        expert(d, &L->experts[ex * 3], &L->experts[ex * 3 + 1], &L->experts[ex * 3 + 2], n, wts);
        for (uint32_t i = 0; i < n; i++)
            for (uint32_t m = 0; m < D; m++)
                d->yacc[(size_t)d->etok[i] * D + m] += d->eo[(size_t)i * D + m];
    }
    memcpy(d->xg, d->x, (size_t)T * D * sizeof(float));
    expert(d, &L->sh_w1, &L->sh_w3, &L->sh_w2, T, NULL);
    for (size_t i = 0; i < (size_t)T * D; i++)
        d->y[i] = (float)(d->yacc[i] + d->eo[i]);
}

/* ---- hooks and ops ---- */

void tm_dsv41_drafter_begin(tm_dsv41_drafter *d, uint32_t T) {
    if (d)
        d->n_hid = T;
}

void tm_dsv41_drafter_capture(tm_dsv41_drafter *d, uint32_t il, uint32_t T, const float *s) {
    if (!d || il >= TM_DSV41_MAX_LAYER || d->tgt_slot[il] < 0)
        return;
    const uint32_t N = d->N, D = d->D, off = (uint32_t)d->tgt_slot[il] * D;
    for (uint32_t t = 0; t < T; t++) { // h.mean(dim=2): the mean over the hc copies
        const float *st = s + (size_t)t * N * D;
        float *h = d->hid + (size_t)t * d->width + off;
        for (uint32_t k = 0; k < D; k++) {
            double acc = 0.0;
            for (uint32_t i = 0; i < N; i++)
                acc += (double)st[i * D + k];
            h[k] = (float)(acc / N);
        }
    }
}

void tm_dsv41_drafter_kv_copy(tm_dsv41_drafter *d, uint32_t src, uint32_t dst, uint32_t n_tok) {
    if (!d || src == dst)
        return;
    const size_t bs = d->bs;
    for (uint32_t k = 0; k < d->p->n_stage; k++)
        memcpy(d->win[k] + dst * bs * d->hd, d->win[k] + src * bs * d->hd,
               (size_t)n_tok * d->hd * sizeof(float));
}

void tm_dsv41_drafter_info(const tm_dsv41_drafter *d, tm_engine_draft_info *info) {
    *info = (tm_engine_draft_info){TM_DRAFT_BLOCK, d->width, d->p->n_target, d->B};
}

const float *tm_dsv41_drafter_hidden(const tm_dsv41_drafter *d, uint32_t *n_tok) {
    *n_tok = d->n_hid;
    return d->n_hid ? d->hid : NULL;
}

const float *tm_dsv41_drafter_confidence(const tm_dsv41_drafter *d) { return d->conf; }

tm_rc tm_dsv41_drafter_draft(tm_dsv41_drafter *d, const tm_engine_opts *o, uint32_t max_pos,
                             const tm_engine_draft_seq *seqs, uint32_t n_seq, float *logits,
                             tm_err *err) {
    if (n_seq > d->S)
        return TM_ERR(err, TM_E_INVAL, "dsv41 dspark draft: %u sequences, max_seqs %u", n_seq,
                      d->S);
    uint32_t n_rows = 0, n_want = 0;
    for (uint32_t i = 0; i < n_seq; i++) {
        const tm_engine_draft_seq *q = &seqs[i];
        if (!q->hidden || !q->next || !q->n_tok || q->block_in || !q->block_table)
            return TM_ERR(err, TM_E_INVAL,
                          "dsv41 dspark draft: sequence %u needs hidden, next and >= 1 rows "
                          "(block_in is not supported)",
                          i);
        const uint64_t end = (uint64_t)q->pos + q->n_tok;
        if (end > max_pos || TM_CEIL_DIV(end, d->bs) > q->n_block)
            return TM_ERR(err, TM_E_INVAL,
                          "dsv41 dspark draft: sequence %u rows %u..%llu outside its %u blocks "
                          "or the context %u",
                          i, q->pos, (unsigned long long)end, q->n_block, max_pos);
        for (uint32_t b = 0; b < TM_CEIL_DIV(end, d->bs); b++)
            if (q->block_table[b] >= o->n_kv_block)
                return TM_ERR(err, TM_E_INVAL, "dsv41 dspark draft: block id %u of %u",
                              q->block_table[b], o->n_kv_block);
        for (uint32_t t = 0; t < q->n_tok; t++)
            if (q->next[t] >= d->V)
                return TM_ERR(err, TM_E_INVAL, "dsv41 dspark draft: token id %u >= vocab %u",
                              q->next[t], d->V);
        n_rows += q->n_tok;
        n_want += q->want_logits != 0;
    }
    if (n_rows > d->T)
        return TM_ERR(err, TM_E_INVAL, "dsv41 dspark draft: %u rows, max_batched_tokens %u", n_rows,
                      d->T);
    d->seqs = seqs;
    const tm_dsv41_dspark *p = d->p;
    const tm_dsv41_cfg *c = d->c;
    const uint32_t D = d->D, N = d->N, hd = d->hd, half = d->rd / 2, B = d->B;
    float *nw = d->vec;
    // every row: main_x, then each stage's window row at its position
    for (uint32_t i = 0, r = 0; i < n_seq; i++)
        for (uint32_t t = 0; t < seqs[i].n_tok; t++, r++) {
            d->tok_pos[r] = seqs[i].pos + t;
            d->tok_seq[r] = i;
        }
    {
        uint32_t r = 0;
        for (uint32_t i = 0; i < n_seq; i++) {
            lin(d, &p->main_proj, seqs[i].hidden, d->width, seqs[i].n_tok, d->width,
                d->mx + (size_t)r * D, D, D);
            r += seqs[i].n_tok;
        }
        tm_dsv_vec_f32(&p->main_norm, nw);
        for (uint32_t t = 0; t < n_rows; t++) {
            tm_dsv_rmsnorm(d->mx + (size_t)t * D, nw, D, c->norm_eps);
            tm_dsv_cos_sin(c->inv_freq_main, d->rd, d->tok_pos[t], d->cs + (size_t)t * half,
                           d->sn + (size_t)t * half);
        }
        for (uint32_t k = 0; k < p->n_stage; k++) {
            const tm_dsv41_layer *L = &p->stages[k];
            lin(d, &L->wkv, d->mx, D, n_rows, D, d->kvm, hd, hd);
            tm_dsv_vec_f32(&L->kv_norm, nw);
            for (uint32_t t = 0; t < n_rows; t++) {
                float *kv = d->kvm + (size_t)t * hd;
                tm_dsv_rmsnorm(kv, nw, hd, c->norm_eps);
                tm_dsv_rope_head(kv, hd, d->rd, d->cs + (size_t)t * half, d->sn + (size_t)t * half,
                                 1.0f);
                tm_dsv_act_quant(kv, hd);
                memcpy(d->win[k] + slot_of(d, &seqs[d->tok_seq[t]], d->tok_pos[t]) * hd, kv,
                       hd * sizeof(float));
            }
        }
    }
    d->n_conf = n_want;
    if (!n_want)
        return TM_OK;
    // the draft blocks: [anchor, noise ...] at P+1 .. P+B of every wanting sequence
    uint32_t T = 0;
    for (uint32_t i = 0; i < n_seq; i++) {
        const tm_engine_draft_seq *q = &seqs[i];
        if (!q->want_logits)
            continue;
        const uint32_t P = q->pos + q->n_tok - 1, b0 = T;
        for (uint32_t j = 0; j < B; j++, T++) {
            const uint32_t id = j == 0 ? q->next[q->n_tok - 1] : p->noise_id;
            d->tok_seq[T] = i;
            d->tok_pos[T] = P + 1 + j;
            d->tok_P[T] = P;
            d->tok_blk[T] = b0;
            float *st = d->s + (size_t)T * N * D;
            tm_dtype_to_f32(d->m->embd.data, d->m->embd.dtype, (size_t)id * D, D, st);
            for (uint32_t k = 1; k < N; k++)
                memcpy(st + (size_t)k * D, st, D * sizeof(float));
            for (uint32_t k = 0; k < N; k++)
                d->pre[(size_t)T * N + k] = k == 0 ? 1.0f : 0.0f;
            tm_dsv_cos_sin(c->inv_freq_main, d->rd, d->tok_pos[T], d->cs + (size_t)T * half,
                           d->sn + (size_t)T * half);
        }
    }
    for (uint32_t k = 0; k < p->n_stage; k++) { // Block.forward
        const tm_dsv41_layer *L = &p->stages[k];
        hc_mixes(d, &L->hc_attn_fn, &L->hc_attn_scale, &L->hc_attn_base, T, d->apre, d->post,
                 d->comb);
        tm_dsv_collapse_norm(d->s, d->N, D, T, d->pre, &L->attn_norm, c->norm_eps, nw, d->x);
        stage_attn(d, k, T);
        tm_dsv_hc_expand(d->s, d->N, d->D, T, d->y, d->post, d->comb);
        hc_mixes(d, &L->hc_ffn_fn, &L->hc_ffn_scale, &L->hc_ffn_base, T, d->pre, d->post, d->comb);
        tm_dsv_collapse_norm(d->s, d->N, D, T, d->apre, &L->ffn_norm, c->norm_eps, nw, d->x);
        stage_moe(d, k, T);
        tm_dsv_hc_expand(d->s, d->N, d->D, T, d->y, d->post, d->comb);
    }
    // forward_head: hc_pre, the last stage's norm, the shared head; x kept for the confidence
    tm_dsv_hc_collapse(d->s, d->N, d->D, T, d->pre, d->x);
    memcpy(d->y, d->x, (size_t)T * D * sizeof(float));
    tm_dsv_vec_f32(&p->norm, nw);
    for (uint32_t t = 0; t < T; t++)
        tm_dsv_rmsnorm(d->y + (size_t)t * D, nw, D, c->norm_eps);
    const uint32_t V = d->V, R = d->R;
    lin(d, &d->m->lm_head, d->y, D, T, D, logits, V, V);
    // the Markov head, sequentially: row j += head(embed(pick j-1)), pick j = argmax
    float *cw = d->xin; // [D + R] the confidence proj
    tm_dsv_vec_f32(&p->conf_proj, cw);
    for (uint32_t b = 0; b < T / B; b++) {
        uint32_t prev = seqs[d->tok_seq[b * B]].next[seqs[d->tok_seq[b * B]].n_tok - 1];
        for (uint32_t j = 0; j < B; j++) {
            const uint32_t t = b * B + j;
            float *emb = d->mk + (size_t)t * R;
            tm_tensor_row_f32(&p->markov_embed, prev, emb);
            lin(d, &p->markov_head, emb, R, 1, R, d->bias, V, V);
            float *row = logits + (size_t)t * V;
            uint32_t best = 0;
            for (uint32_t v = 0; v < V; v++) {
                row[v] = (float)((double)row[v] + (double)d->bias[v]);
                best = row[v] > row[best] ? v : best;
            }
            prev = best;
            double acc = 0.0; // confidence: proj . (x | markov embed), fp32 out
            for (uint32_t k = 0; k < D; k++)
                acc += (double)d->x[(size_t)t * D + k] * cw[k];
            for (uint32_t k = 0; k < R; k++)
                acc += (double)emb[k] * cw[D + k];
            d->conf[t] = (float)acc;
        }
    }
    return TM_OK;
}

/* ---- create / destroy ---- */

tm_rc tm_dsv41_drafter_create(const tm_model *m, const tm_engine_opts *opts, uint32_t n_thread,
                              tm_dsv41_drafter **out, tm_err *err) {
    *out = NULL;
    const tm_dsv41 *w = tm_model_dsv41(m);
    if (!w || !w->dspark)
        return TM_ERR(err, TM_E_INVAL, "dsv41 dspark: the model has no DSpark stages");
    tm_dsv41_drafter *d = tm_calloc(1, sizeof(*d));
    if (!d)
        return TM_ERR(err, TM_E_NOMEM, "dsv41 dspark drafter");
    const tm_dsv41_cfg *c = &w->cfg;
    const tm_dsv41_dspark *p = w->dspark;
    d->m = m;
    d->c = c;
    d->p = p;
    d->n_thread = n_thread ? n_thread : 1;
    d->bs = opts->block_size;
    d->n_block = opts->n_kv_block;
    d->T = opts->max_batched_tokens;
    d->S = opts->max_seqs;
    d->B = p->block_size;
    d->TB = d->S * d->B;
    d->D = c->dim;
    d->N = c->hc_mult;
    d->H = c->n_heads;
    d->hd = c->head_dim;
    d->rd = c->rope_head_dim;
    d->qlr = c->q_lora_rank;
    d->G = c->o_groups;
    d->olr = c->o_lora_rank;
    d->ing = d->H * d->hd / d->G;
    d->E = p->n_experts;
    d->K = p->n_active;
    d->I = c->moe_inter_dim;
    d->R = p->rank;
    d->V = c->vocab_size;
    d->width = d->D * p->n_target;
    d->mix = (2 + d->N) * d->N;
    memset(d->tgt_slot, -1, sizeof(d->tgt_slot));
    for (uint32_t i = 0; i < p->n_target; i++)
        d->tgt_slot[c->dspark_target_layer_ids[i]] = (int8_t)i;
    uint32_t mi = TM_MAX(d->N * d->D, d->width);
    mi = TM_MAX(mi, d->qlr);
    mi = TM_MAX(mi, d->ing);
    mi = TM_MAX(mi, d->G * d->olr);
    mi = TM_MAX(mi, d->I);
    mi = TM_MAX(mi, d->D + d->R);
    d->max_in = mi;
    const size_t slots = (size_t)d->n_block * d->bs, T = d->T, TB = d->TB, TM = TM_MAX(T, TB),
                 nt = d->n_thread;
    int failed = 0;
#define AL(ptr, n)                                                                                 \
    do {                                                                                           \
        (ptr) = tm_calloc(TM_MAX((size_t)(n), (size_t)1), sizeof(*(ptr)));                         \
        failed |= !(ptr);                                                                          \
    } while (0)
    AL(d->win, p->n_stage);
    for (uint32_t k = 0; !failed && k < p->n_stage; k++)
        AL(d->win[k], slots * d->hd);
    AL(d->hid, T * d->width);
    AL(d->tok_seq, TM);
    AL(d->tok_pos, TM);
    AL(d->tok_blk, TB);
    AL(d->tok_P, TB);
    AL(d->mx, T * d->D);
    AL(d->kvm, T * d->hd);
    AL(d->cs, TM * (d->rd / 2));
    AL(d->sn, TM * (d->rd / 2));
    AL(d->s, TB * d->N * d->D);
    AL(d->x, TB * d->D);
    AL(d->y, TB * d->D);
    AL(d->xin, TM * d->max_in);
    AL(d->pre, TB * d->N);
    AL(d->apre, TB * d->N);
    AL(d->post, TB * d->N);
    AL(d->comb, TB * d->N * d->N);
    AL(d->mixes, TB * d->mix);
    AL(d->qr, TB * d->qlr);
    AL(d->q, TB * d->H * d->hd);
    AL(d->kv, TB * d->hd);
    AL(d->o, TB * d->H * d->hd);
    AL(d->oa, TB * d->G * d->olr);
    AL(d->rl, TB * d->E);
    AL(d->sel, TB * d->K);
    AL(d->selw, TB * d->K);
    AL(d->etok, TB);
    AL(d->ord, d->E);
    AL(d->xg, TB * d->D);
    AL(d->g, TB * d->I);
    AL(d->u, TB * d->I);
    AL(d->eo, TB * d->D);
    AL(d->yacc, TB * d->D);
    AL(d->ascore, nt * (c->window_size + d->B));
    AL(d->wrow, nt * d->max_in);
    AL(d->vec, TM_MAX(TM_MAX(d->D, d->qlr), TM_MAX(d->hd, d->E)));
    AL(d->bias, TM_MAX(d->V, d->E));
    AL(d->mk, TM_MAX(TB * d->R, TB * d->K));
    AL(d->conf, TB);
#undef AL
    tm_rc rc = failed ? TM_ERR(err, TM_E_NOMEM, "dsv41 dspark buffers") : TM_OK;
    if (rc == TM_OK)
        rc = tm_cpu_pool_create(d->n_thread, &d->pool, err);
    if (rc) {
        tm_dsv41_drafter_destroy(d);
        return rc;
    }
    *out = d;
    return TM_OK;
}

void tm_dsv41_drafter_destroy(tm_dsv41_drafter *d) {
    if (!d)
        return;
    tm_cpu_pool_destroy(d->pool);
    for (uint32_t k = 0; d->win && k < d->p->n_stage; k++)
        tm_free(d->win[k]);
    void *bufs[] = {d->win,  d->hid,  d->tok_seq, d->tok_pos, d->tok_blk, d->tok_P, d->mx,
                    d->kvm,  d->cs,   d->sn,      d->s,       d->x,       d->y,     d->xin,
                    d->pre,  d->apre, d->post,    d->comb,    d->mixes,   d->qr,    d->q,
                    d->kv,   d->o,    d->oa,      d->rl,      d->sel,     d->selw,  d->etok,
                    d->ord,  d->xg,   d->g,       d->u,       d->eo,      d->yacc,  d->ascore,
                    d->wrow, d->vec,  d->bias,    d->mk,      d->conf};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        tm_free(bufs[i]);
    tm_free(d);
}
