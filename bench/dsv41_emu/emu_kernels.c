/* bench/dsv41_emu/emu_kernels.c - the launchers of kernels/dsv41.h done on the host, each a
 * loop-for-loop transliteration of its kernel in kernels/dsv41.cu (one thread's work after
 * another), so that the CUDA engine's host code (runner/engine/cuda/dsv41.c) can be checked
 * against the CPU engine without a GPU: state layout, slot arithmetic, buffer sizes and op
 * order (run it under ASan). The quantizers call the CPU engine's (equal to the kernels, checked
 * by test_dsv41_kernels); the selection is a plain sort in the CPU engine's order. What it
 * cannot check: the kernels' parallel structure (warp sums, barriers, the radix select).
 * CUDA graphs: while emu_cuda.c captures, every launcher records its arguments (by value, as a
 * kernel launch does) instead of running; cudaGraphLaunch replays the records (the end of this
 * file). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dsv41_ref.h"
#include "kernels/dsv41.h"
#include "runner/engine/cpu/dsv_common.h"
#include "runner/model/tensor.h"

static float bf2f(uint16_t h) { return tm_bf16_to_f32(h); }
static float wload(const void *w, int bf16, size_t i) {
    return bf16 ? bf2f(((const uint16_t *)w)[i]) : ((const float *)w)[i];
}
static size_t slot_of(const tm_k_dsv41_seqs *q, uint32_t t, uint32_t p) {
    const uint32_t b = q->block_tables[q->seq_bt[q->tok_seq[t]] + p / q->bs];
    return (size_t)b * q->bs + p % q->bs;
}

static tm_rc k_act_quant(float *x, size_t n, cudaStream_t s, tm_err *err) {
    (void)s, (void)err;
    TM_ASSERT(n % 32 == 0);
    tm_dsv_act_quant(x, (uint32_t)n);
    return TM_OK;
}
static tm_rc k_fp4_act_quant(float *x, size_t n, uint32_t block, int e4m3_scale, cudaStream_t s,
                             tm_err *err) {
    (void)s, (void)err;
    TM_ASSERT((block == 16 || block == 32) && n % block == 0);
    tm_dsv_fp4_act_quant(x, (uint32_t)n, block, e4m3_scale);
    return TM_OK;
}

static tm_rc k_engram_gate(const tm_k_dsv41_engram_gate_args *a, cudaStream_t s, tm_err *err) {
    (void)s, (void)err;
    const uint32_t N = a->n_hc, D = a->dim;
    for (uint32_t t = 0; t < a->n_tok; t++)
        for (uint32_t c = 0; c < N; c++) {
            float *hr = a->h + ((size_t)t * N + c) * D;
            const float *key = a->kv + (size_t)t * (N + 1) * D + (size_t)c * D;
            const float *value = a->kv + (size_t)t * (N + 1) * D + (size_t)N * D;
            const float *wr = a->w + (size_t)c * D;
            double hh = 0.0, kk = 0.0, dot = 0.0;
            for (uint32_t d = 0; d < D; d++) {
                hh += (double)hr[d] * hr[d];
                kk += (double)key[d] * key[d];
                dot += (double)hr[d] * wr[d] * key[d];
            }
            const double rstd = 1.0 / sqrt(hh / D + (double)a->eps) / sqrt(kk / D + (double)a->eps);
            const double x = dot * rstd * pow((double)D, -0.5);
            const double sq = copysign(sqrt(fmax(fabs(x), 1e-6)), x);
            const double gate = 1.0 / (1.0 + exp(-sq));
            for (uint32_t d = 0; d < D; d++)
                hr[d] = (float)((double)hr[d] + gate * value[d]);
        }
    return TM_OK;
}

static const float *g_sc;
static int cmp_desc(const void *x, const void *y) {
    const uint32_t i = *(const uint32_t *)x, j = *(const uint32_t *)y;
    if (g_sc[i] > g_sc[j])
        return -1;
    if (g_sc[i] < g_sc[j])
        return 1;
    return i < j ? -1 : i > j;
}
static int cmp_u32(const void *x, const void *y) {
    const int32_t i = *(const int32_t *)x, j = *(const int32_t *)y;
    return (i > j) - (i < j);
}

static tm_rc k_select(const tm_k_dsv41_select_args *a, cudaStream_t s, tm_err *err) {
    (void)s, (void)err;
    uint32_t *ord = malloc((a->ld + 1) * sizeof(uint32_t));
    for (uint32_t t = 0; t < a->n_tok; t++) {
        const uint32_t lens = a->lens[t];
        TM_ASSERT(lens <= a->ld);
        float *sc = a->score + (size_t)t * a->ld;
        if (lens == 0) {
            a->n_pick[t] = 0;
            if (a->mode == TM_DSV41_SEL_SOURCE)
                a->n_cand[t] = 0;
            continue;
        }
        if (a->mode == TM_DSV41_SEL_SOURCE) {
            const uint32_t nb = (lens + a->cb - 1) / a->cb;
            float *bsc = a->bsc + (size_t)t * a->ld;
            for (uint32_t bk = 0; bk < nb; bk++) {
                float mx = -INFINITY;
                for (uint32_t k = bk * a->cb; k < TM_MIN(lens, (bk + 1) * a->cb); k++)
                    mx = fmaxf(mx, sc[k]);
                bsc[bk] = bk == nb - 1 ? INFINITY : mx;
                ord[bk] = bk;
            }
            g_sc = bsc;
            qsort(ord, nb, sizeof(uint32_t), cmp_desc);
            const uint32_t keep = TM_MIN(nb, a->ctop);
            uint32_t *cd = a->cand + (size_t)t * a->ctop;
            memcpy(cd, ord, keep * sizeof(uint32_t));
            qsort(cd, keep, sizeof(uint32_t), cmp_u32);
            a->n_cand[t] = keep;
        } else if (a->mode == TM_DSV41_SEL_CONSUMER) {
            const uint32_t *cd = a->cand + (size_t)t * a->ctop, nc = a->n_cand[t];
            for (uint32_t i = 1; i < nc; i++) // the GPU kernel's binary search needs this order
                TM_ASSERT(cd[i - 1] < cd[i]);
            for (uint32_t k = 0; k < lens; k++) {
                int in = 0;
                for (uint32_t i = 0; i < nc; i++)
                    in |= cd[i] == k / a->cb;
                if (!in)
                    sc[k] = -INFINITY;
            }
        }
        for (uint32_t k = 0; k < lens; k++)
            ord[k] = k;
        g_sc = sc;
        qsort(ord, lens, sizeof(uint32_t), cmp_desc);
        const uint32_t n = TM_MIN(a->topk, lens);
        int32_t *pk = a->pick + (size_t)t * a->topk;
        for (uint32_t i = 0; i < n; i++)
            pk[i] = (int32_t)ord[i];
        qsort(pk, n, sizeof(int32_t), cmp_u32);
        a->n_pick[t] = n;
    }
    free(ord);
    return TM_OK;
}

static tm_rc k_linear(const tm_k_dsv41_linear_args *a, cudaStream_t s, tm_err *err) {
    (void)s, (void)err;
    TM_ASSERT(a->out && a->x && a->w && a->x_div >= 1);
    for (uint32_t t = 0; t < a->n_tok; t++)
        for (uint32_t o = 0; o < a->n_out; o++) {
            const float *x = a->x + (size_t)(t / a->x_div) * a->ldx;
            size_t wrow = (size_t)(a->row0 + o) * a->n_in;
            if (a->sel)
                wrow += (size_t)a->sel[t] * a->w_expert;
            double acc = 0.0;
            for (uint32_t i = 0; i < a->n_in; i++)
                acc += (double)x[i] * (double)wload(a->w, a->w_bf16, wrow + i);
            a->out[(size_t)t * a->ldo + o] = (float)acc;
        }
    return TM_OK;
}

static tm_rc k_rmsnorm(float *x, uint32_t ld, const float *w, uint32_t n_row, uint32_t n, float eps,
                       cudaStream_t s, tm_err *err) {
    (void)s, (void)err;
    TM_ASSERT(x && n > 0 && ld >= n);
    for (uint32_t r = 0; r < n_row; r++)
        tm_dsv_rmsnorm(x + (size_t)r * ld, w, n, eps);
    return TM_OK;
}

static tm_rc k_rope(const tm_k_dsv41_rope_args *a, cudaStream_t s, tm_err *err) {
    (void)s, (void)err;
    if (a->n_tok == 0 || a->rd == 0)
        return TM_OK;
    TM_ASSERT(a->x && a->pos && a->inv_freq && a->rd % 2 == 0 && a->rd <= a->hd);
    for (uint32_t t = 0; t < a->n_tok; t++)
        for (uint32_t h = 0; h < a->n_head; h++)
            for (uint32_t i = 0; i < a->rd / 2; i++) {
                uint32_t p = a->pos[t];
                if (a->lat_r)
                    p = ((p + 1) / a->lat_r - (p + 1 >= a->lat_r ? 1 : 0)) * a->lat_r;
                const float ang = (float)p * a->inv_freq[i];
                const float c = (float)cos((double)ang), sn = a->sign * (float)sin((double)ang);
                float *r = a->x + (size_t)t * a->tok_stride + (size_t)h * a->head_stride + a->hd -
                           a->rd;
                const float x0 = r[2 * i], x1 = r[2 * i + 1];
                r[2 * i] = x0 * c - x1 * sn;
                r[2 * i + 1] = x1 * c + x0 * sn;
            }
    return TM_OK;
}

static tm_rc k_embed(float *x, float *streams, float *pre, const void *emb, int bf16,
                     const uint32_t *tokens, uint32_t n_tok, uint32_t D, uint32_t N, cudaStream_t s,
                     tm_err *err) {
    (void)s, (void)err;
    TM_ASSERT(N <= D);
    for (uint32_t t = 0; t < n_tok; t++)
        for (uint32_t d = 0; d < D; d++) {
            const float v = wload(emb, bf16, (size_t)tokens[t] * D + d);
            x[(size_t)t * D + d] = v;
            for (uint32_t i = 0; i < N; i++)
                streams[((size_t)t * N + i) * D + d] = v;
            if (d < N)
                pre[(size_t)t * N + d] = d == 0 ? 1.0f : 0.0f;
        }
    return TM_OK;
}

static tm_rc k_hc_split(const tm_k_dsv41_hc_split_args *a, cudaStream_t s, tm_err *err) {
    (void)s, (void)err;
    const uint32_t N = a->N, ND = a->N * a->D, mix = (2 + N) * N;
    TM_ASSERT(N <= TM_DSV41_K_MAX_HC);
    for (uint32_t t = 0; t < a->n_tok; t++) {
        const float *st = a->streams + (size_t)t * ND;
        double ss = 0.0;
        for (uint32_t i = 0; i < ND; i++)
            ss += (double)st[i] * st[i];
        const double r = 1.0 / sqrt(ss / ND + (double)a->norm_eps);
        float m[(2 + TM_DSV41_K_MAX_HC) * TM_DSV41_K_MAX_HC];
        for (uint32_t i = 0; i < mix; i++)
            m[i] = (float)((double)a->mixes[(size_t)t * mix + i] * r);
        dsv41_ref_hc_split(m, a->scale, a->base, N, a->iters, a->hc_eps, a->pre + (size_t)t * N,
                           a->post + (size_t)t * N, a->comb + (size_t)t * N * N);
    }
    return TM_OK;
}

static tm_rc k_collapse_norm(float *x, const float *streams, const float *pre, const uint32_t *rows,
                             uint32_t n_row, uint32_t N, uint32_t D, const float *w, float eps,
                             cudaStream_t s, tm_err *err) {
    (void)s, (void)err;
    for (uint32_t r = 0; r < n_row; r++) {
        const uint32_t t = rows ? rows[r] : r;
        const float *sr = streams + (size_t)t * N * D, *p = pre + (size_t)t * N;
        float *xr = x + (size_t)r * D;
        for (uint32_t d = 0; d < D; d++) {
            double acc = 0.0;
            for (uint32_t i = 0; i < N; i++)
                acc += (double)p[i] * sr[(size_t)i * D + d];
            xr[d] = (float)acc;
        }
        tm_dsv_rmsnorm(xr, w, D, eps);
    }
    return TM_OK;
}

static tm_rc k_hc_expand(float *streams, const float *y, const float *post, const float *comb,
                         uint32_t n_tok, uint32_t N, uint32_t D, cudaStream_t s, tm_err *err) {
    (void)s, (void)err;
    tm_dsv_hc_expand(streams, N, D, n_tok, y, post, comb);
    return TM_OK;
}

static tm_rc k_store(const tm_k_dsv41_store_args *a, const tm_k_dsv41_seqs *q, cudaStream_t s,
                     tm_err *err) {
    (void)s, (void)err;
    TM_ASSERT(a->field && a->src && q->pos && q->block_tables && q->bs > 0);
    for (uint32_t t = 0; t < a->n_tok; t++) {
        const uint32_t p = q->pos[t];
        size_t slot;
        if (a->r == 0) {
            slot = slot_of(q, t, p);
        } else {
            if ((p + 1) % a->r)
                continue;
            slot = slot_of(q, t, ((p + 1) / a->r - 1) * a->r);
        }
        for (uint32_t j = 0; j < a->n; j++)
            a->field[slot * a->fld + j] = a->src[(size_t)t * a->lds + j];
    }
    return TM_OK;
}

static tm_rc k_latent(float *lat, const float *ckv, const float *tail, uint32_t tld, uint32_t hd,
                      uint32_t r, uint32_t n_tok, const tm_k_dsv41_seqs *q, cudaStream_t s,
                      tm_err *err) {
    (void)s, (void)err;
    TM_ASSERT(lat && ckv && r >= 1 && (r == 1 || tail));
    for (uint32_t t = 0; t < n_tok; t++)
        for (uint32_t c = 0; c < hd; c++) {
            const size_t k = (size_t)t * hd + c;
            const uint32_t p = q->pos[t];
            if (r == 1) {
                lat[k] = ckv[k];
                continue;
            }
            if ((p + 1) % r) {
                lat[k] = 0.0f;
                continue;
            }
            const uint32_t p0 = ((p + 1) / r - 1) * r;
            double mx = -INFINITY, den = 0.0, acc = 0.0;
            for (uint32_t i = 0; i < r; i++)
                mx = fmax(mx, (double)tail[slot_of(q, t, p0 + i) * tld + hd + c]);
            for (uint32_t i = 0; i < r; i++)
                den += exp((double)tail[slot_of(q, t, p0 + i) * tld + hd + c] - mx);
            for (uint32_t i = 0; i < r; i++) {
                const float *tl = tail + slot_of(q, t, p0 + i) * tld;
                acc += (double)tl[c] * (exp((double)tl[hd + c] - mx) / den);
            }
            lat[k] = (float)acc;
        }
    return TM_OK;
}

static tm_rc k_cid_store(float *field, uint32_t fld, const uint32_t *tokens, const int32_t *tmap,
                         const uint32_t *slot, uint32_t n_tok, cudaStream_t s, tm_err *err) {
    (void)s, (void)err;
    for (uint32_t t = 0; t < n_tok; t++)
        memcpy(&field[(size_t)slot[t] * fld], &tmap[tokens[t]], 4);
    return TM_OK;
}

static tm_rc k_index_scores(const tm_k_dsv41_iscore_args *a, const tm_k_dsv41_seqs *q,
                            cudaStream_t s, tm_err *err) {
    (void)s, (void)err;
    for (uint32_t t = 0; t < a->n_tok; t++) {
        const uint32_t lens = (q->pos[t] + 1) / a->r;
        a->lens[t] = lens;
        TM_ASSERT(lens <= a->ld);
        for (uint32_t k = 0; k < lens; k++) {
            const float *key = a->key_field + slot_of(q, t, k * a->r) * a->kld;
            const float *qt = a->q + (size_t)t * a->Hi * a->di, *w = a->w + (size_t)t * a->Hi;
            double acc = 0.0;
            for (uint32_t h = 0; h < a->Hi; h++) {
                double d = 0.0;
                for (uint32_t i = 0; i < a->di; i++)
                    d += (double)qt[h * a->di + i] * key[i];
                acc += (d > 0.0 ? d : 0.0) * ((double)w[h] * a->iscale);
            }
            a->score[(size_t)t * a->ld + k] = (float)acc;
        }
    }
    return TM_OK;
}

size_t tm_k_dsv41_attn_smem(uint32_t window, uint32_t topk, uint32_t hd) {
    return ((size_t)window + topk) * (sizeof(double) + sizeof(size_t)) +
           (size_t)hd * sizeof(float); // as kernels/dsv41.cu's: scores, row offsets, output
}

static tm_rc k_attn(const tm_k_dsv41_attn_args *a, const tm_k_dsv41_seqs *q, cudaStream_t s,
                    tm_err *err) {
    (void)s, (void)err;
    TM_ASSERT(!a->r || (a->comp && a->pick && a->n_pick));
    double *sc = malloc((a->window + a->topk) * sizeof(double));
    float *ob = malloc(a->hd * sizeof(float));
    for (uint32_t t = 0; t < a->n_tok; t++)
        for (uint32_t h = 0; h < a->H; h++) {
            const uint32_t hd = a->hd, p = q->pos[t],
                           p0 = p + 1 > a->window ? p + 1 - a->window : 0;
            const uint32_t n_w = p + 1 - p0, n_c = a->r ? a->n_pick[t] : 0, n = n_w + n_c;
            TM_ASSERT(n_w <= a->window && n_c <= a->topk);
            const float *qh = a->q + ((size_t)t * a->H + h) * hd;
            const int32_t *pk = a->pick + (size_t)t * a->topk;
            const double scale = pow((double)hd, -0.5);
            for (uint32_t i = 0; i < n; i++) {
                const float *row = i < n_w ? a->win + slot_of(q, t, p0 + i) * a->wld
                                           : a->comp + slot_of(q, t, (uint32_t)pk[i - n_w] * a->r) *
                                                           a->cld;
                double d = 0.0;
                for (uint32_t k = 0; k < hd; k++)
                    d += (double)qh[k] * row[k];
                sc[i] = d * scale;
            }
            const double sk = a->sinks[h];
            double mx = sk;
            for (uint32_t i = 0; i < n; i++)
                mx = fmax(mx, sc[i]);
            double den = exp(sk - mx);
            for (uint32_t i = 0; i < n; i++) {
                sc[i] = exp(sc[i] - mx);
                den += sc[i];
            }
            for (uint32_t k = 0; k < hd; k++) {
                double acc = 0.0;
                for (uint32_t i = 0; i < n; i++) {
                    const float *row =
                        i < n_w ? a->win + slot_of(q, t, p0 + i) * a->wld
                                : a->comp + slot_of(q, t, (uint32_t)pk[i - n_w] * a->r) * a->cld;
                    acc += sc[i] * row[k];
                }
                ob[k] = (float)(acc / den);
            }
            float *o = a->o + ((size_t)t * a->H + h) * hd;
            const uint32_t half = a->rd / 2, off = hd - a->rd;
            for (uint32_t k = 0; k < off; k++)
                o[k] = ob[k];
            for (uint32_t i = 0; i < half; i++) {
                const float ang = (float)p * a->inv_freq[i];
                const float c = (float)cos((double)ang), sn = -1.0f * (float)sin((double)ang);
                const float x0 = ob[off + 2 * i], x1 = ob[off + 2 * i + 1];
                o[off + 2 * i] = x0 * c - x1 * sn;
                o[off + 2 * i + 1] = x1 * c + x0 * sn;
            }
        }
    free(sc);
    free(ob);
    return TM_OK;
}

static tm_rc k_route(const tm_k_dsv41_route_args *a, cudaStream_t s, tm_err *err) {
    (void)s, (void)err;
    for (uint32_t t = 0; t < a->n_tok; t++) {
        float *sc = a->logits + (size_t)t * a->E;
        const double temp = a->gate_temp;
        double mx = -INFINITY, den = 0.0;
        for (uint32_t i = 0; i < a->E; i++)
            mx = fmax(mx, (double)sc[i] / temp);
        if (a->score_func == TM_DSV41_K_SCORE_SOFTMAX) {
            for (uint32_t i = 0; i < a->E; i++)
                den += exp((double)sc[i] / temp - mx);
            for (uint32_t i = 0; i < a->E; i++)
                sc[i] = (float)(exp((double)sc[i] / temp - mx) / den);
        } else {
            for (uint32_t i = 0; i < a->E; i++) {
                const double z = (double)sc[i] / temp;
                sc[i] = a->score_func == TM_DSV41_K_SCORE_SIGMOID
                            ? (float)(1.0 / (1.0 + exp(-z)))
                            : (float)sqrt(z > 20.0 ? z : log1p(exp(z)));
            }
        }
        uint32_t *sel = a->sel + (size_t)t * a->K;
        for (uint32_t k = 0; k < a->K; k++) {
            uint32_t best = UINT32_MAX;
            float bv = 0.0f;
            for (uint32_t i = 0; i < a->E; i++) {
                int taken = 0;
                for (uint32_t j = 0; j < k; j++)
                    taken |= sel[j] == i;
                if (taken)
                    continue;
                const float v = sc[i] + (a->bias ? a->bias[i] : 0.0f);
                if (best == UINT32_MAX || v > bv) {
                    best = i;
                    bv = v;
                }
            }
            sel[k] = best;
        }
        double sum = 0.0;
        for (uint32_t k = 0; k < a->K; k++)
            sum += (double)sc[sel[k]];
        for (uint32_t k = 0; k < a->K; k++) {
            double wv = sc[sel[k]];
            if (a->norm_topk && a->K > 1)
                wv = wv / (sum + 1e-20);
            a->weight[(size_t)t * a->K + k] = (float)(wv * a->route_scale);
        }
    }
    return TM_OK;
}

static tm_rc k_swiglu(float *g, const float *u, uint32_t n_row, uint32_t I, float lim,
                      const float *wt, cudaStream_t s, tm_err *err) {
    (void)s, (void)err;
    for (size_t k = 0; k < (size_t)n_row * I; k++) {
        float gv = g[k], uv = u[k];
        if (lim > 0.0f) {
            uv = uv < -lim ? -lim : uv > lim ? lim : uv;
            gv = fminf(gv, lim);
        }
        double h = (double)gv / (1.0 + exp(-(double)gv)) * uv;
        if (wt)
            h *= (double)wt[k / I];
        g[k] = (float)h;
    }
    return TM_OK;
}

static tm_rc k_moe_combine(float *y, const float *eo, const uint32_t *eo_row, const uint32_t *sel,
                           const float *sh, uint32_t n_tok, uint32_t K, uint32_t D, cudaStream_t s,
                           tm_err *err) {
    (void)s, (void)err;
    for (size_t k = 0; k < (size_t)n_tok * D; k++) {
        const uint32_t t = (uint32_t)(k / D), d = (uint32_t)(k % D);
        const uint32_t *st = sel + (size_t)t * K;
        double acc = 0.0;
        uint32_t last = 0;
        for (uint32_t j = 0; j < K; j++) {
            uint32_t bk = UINT32_MAX;
            for (uint32_t i = 0; i < K; i++)
                if ((j == 0 || st[i] > st[last]) && (bk == UINT32_MAX || st[i] < st[bk]))
                    bk = i;
            if (bk == UINT32_MAX)
                break;
            const size_t p = (size_t)t * K + bk;
            acc += eo[(eo_row ? (size_t)eo_row[p] : p) * D + d];
            last = bk;
        }
        y[k] = (float)(acc + sh[k]);
    }
    return TM_OK;
}

/* ---- the launchers: run, or recorded while a graph is being captured (emu_cuda.c) ---- */

static tm_err run_err; /* a replayed launch's error: the host kernels assert instead */
int emu_capturing(void);
void emu_record(void (*run)(const void *args), const void *args, size_t n);

#define WRAP_A(name, A)                                                                            \
    static void run_##name(const void *p) {                                                        \
        tm_err e = {0};                                                                            \
        (void)k_##name((const A *)p, NULL, &e);                                                    \
    }                                                                                              \
    tm_rc tm_k_dsv41_##name(const A *a, cudaStream_t s, tm_err *err) {                             \
        if (!emu_capturing())                                                                      \
            return k_##name(a, s, err);                                                            \
        emu_record(run_##name, a, sizeof(*a));                                                     \
        return TM_OK;                                                                              \
    }
#define WRAP_AQ(name, A)                                                                           \
    typedef struct aq_##name {                                                                     \
        A a;                                                                                       \
        tm_k_dsv41_seqs q;                                                                         \
    } aq_##name;                                                                                   \
    static void run_##name(const void *p) {                                                        \
        const aq_##name *x = p;                                                                    \
        tm_err e = {0};                                                                            \
        (void)k_##name(&x->a, &x->q, NULL, &e);                                                    \
    }                                                                                              \
    tm_rc tm_k_dsv41_##name(const A *a, const tm_k_dsv41_seqs *q, cudaStream_t s, tm_err *err) {   \
        if (!emu_capturing())                                                                      \
            return k_##name(a, q, s, err);                                                         \
        const aq_##name x = {*a, *q};                                                              \
        emu_record(run_##name, &x, sizeof(x));                                                     \
        return TM_OK;                                                                              \
    }
/* The pairs in expert order: the stable counting sort of kernels/dsv41.cu's pair_sort_kernel. */
static tm_rc k_pair_sort(const tm_k_dsv41_pair_sort_args *a, cudaStream_t s, tm_err *err) {
    (void)s, (void)err;
    TM_ASSERT(a->n_expert >= 1 && a->n_expert <= TM_DSV41_K_SORT_MAX_EXPERT);
    uint32_t start[TM_DSV41_K_SORT_MAX_EXPERT] = {0};
    for (uint32_t p = 0; p < a->n_pair; p++) {
        TM_ASSERT(a->sel[p] < a->n_expert);
        start[a->sel[p]]++;
    }
    for (uint32_t e = 0, acc = 0; e < a->n_expert; e++) {
        const uint32_t c = start[e];
        start[e] = acc;
        acc += c;
    }
    for (uint32_t p = 0; p < a->n_pair; p++) {
        const uint32_t q = start[a->sel[p]]++;
        a->perm[q] = p;
        a->sexp[q] = (int32_t)a->sel[p];
        a->prow[q] = p / a->K;
        a->wq[q] = a->w[p];
        a->inv[p] = q;
    }
    return TM_OK;
}

WRAP_A(pair_sort, tm_k_dsv41_pair_sort_args)
WRAP_A(engram_gate, tm_k_dsv41_engram_gate_args)
WRAP_A(select, tm_k_dsv41_select_args)
WRAP_A(linear, tm_k_dsv41_linear_args)
WRAP_A(rope, tm_k_dsv41_rope_args)
WRAP_A(hc_split, tm_k_dsv41_hc_split_args)
WRAP_A(route, tm_k_dsv41_route_args)
WRAP_AQ(store, tm_k_dsv41_store_args)
WRAP_AQ(index_scores, tm_k_dsv41_iscore_args)
WRAP_AQ(attn, tm_k_dsv41_attn_args)

/* The launchers with positional arguments: each records them in a struct of its own. */
#define REC(name, ...)                                                                             \
    do {                                                                                           \
        if (emu_capturing()) {                                                                     \
            const name##_a rec_ = {__VA_ARGS__};                                                   \
            emu_record(run_##name, &rec_, sizeof(rec_));                                           \
            return TM_OK;                                                                          \
        }                                                                                          \
    } while (0)

typedef struct act_quant_a {
    float *x;
    size_t n;
} act_quant_a;
static void run_act_quant(const void *p) {
    const act_quant_a *a = p;
    (void)k_act_quant(a->x, a->n, NULL, &run_err);
}
tm_rc tm_k_dsv41_act_quant(float *x, size_t n, cudaStream_t s, tm_err *err) {
    REC(act_quant, x, n);
    return k_act_quant(x, n, s, err);
}

typedef struct fp4_act_quant_a {
    float *x;
    size_t n;
    uint32_t block;
    int e4m3_scale;
} fp4_act_quant_a;
static void run_fp4_act_quant(const void *p) {
    const fp4_act_quant_a *a = p;
    (void)k_fp4_act_quant(a->x, a->n, a->block, a->e4m3_scale, NULL, &run_err);
}
tm_rc tm_k_dsv41_fp4_act_quant(float *x, size_t n, uint32_t block, int e4m3_scale, cudaStream_t s,
                               tm_err *err) {
    REC(fp4_act_quant, x, n, block, e4m3_scale);
    return k_fp4_act_quant(x, n, block, e4m3_scale, s, err);
}

typedef struct rmsnorm_a {
    float *x;
    uint32_t ld;
    const float *w;
    uint32_t n_row, n;
    float eps;
} rmsnorm_a;
static void run_rmsnorm(const void *p) {
    const rmsnorm_a *a = p;
    (void)k_rmsnorm(a->x, a->ld, a->w, a->n_row, a->n, a->eps, NULL, &run_err);
}
tm_rc tm_k_dsv41_rmsnorm(float *x, uint32_t ld, const float *w, uint32_t n_row, uint32_t n,
                         float eps, cudaStream_t s, tm_err *err) {
    REC(rmsnorm, x, ld, w, n_row, n, eps);
    return k_rmsnorm(x, ld, w, n_row, n, eps, s, err);
}

typedef struct embed_a {
    float *x, *streams, *pre;
    const void *emb;
    int bf16;
    const uint32_t *tokens;
    uint32_t n_tok, D, N;
} embed_a;
static void run_embed(const void *p) {
    const embed_a *a = p;
    (void)k_embed(a->x, a->streams, a->pre, a->emb, a->bf16, a->tokens, a->n_tok, a->D, a->N, NULL,
                  &run_err);
}
tm_rc tm_k_dsv41_embed(float *x, float *streams, float *pre, const void *emb, int bf16,
                       const uint32_t *tokens, uint32_t n_tok, uint32_t D, uint32_t N,
                       cudaStream_t s, tm_err *err) {
    REC(embed, x, streams, pre, emb, bf16, tokens, n_tok, D, N);
    return k_embed(x, streams, pre, emb, bf16, tokens, n_tok, D, N, s, err);
}

typedef struct collapse_norm_a {
    float *x;
    const float *streams, *pre;
    const uint32_t *rows;
    uint32_t n_row, N, D;
    const float *w;
    float eps;
} collapse_norm_a;
static void run_collapse_norm(const void *p) {
    const collapse_norm_a *a = p;
    (void)k_collapse_norm(a->x, a->streams, a->pre, a->rows, a->n_row, a->N, a->D, a->w, a->eps,
                          NULL, &run_err);
}
tm_rc tm_k_dsv41_collapse_norm(float *x, const float *streams, const float *pre,
                               const uint32_t *rows, uint32_t n_row, uint32_t N, uint32_t D,
                               const float *w, float eps, cudaStream_t s, tm_err *err) {
    REC(collapse_norm, x, streams, pre, rows, n_row, N, D, w, eps);
    return k_collapse_norm(x, streams, pre, rows, n_row, N, D, w, eps, s, err);
}

typedef struct hc_expand_a {
    float *streams;
    const float *y, *post, *comb;
    uint32_t n_tok, N, D;
} hc_expand_a;
static void run_hc_expand(const void *p) {
    const hc_expand_a *a = p;
    (void)k_hc_expand(a->streams, a->y, a->post, a->comb, a->n_tok, a->N, a->D, NULL, &run_err);
}
tm_rc tm_k_dsv41_hc_expand(float *streams, const float *y, const float *post, const float *comb,
                           uint32_t n_tok, uint32_t N, uint32_t D, cudaStream_t s, tm_err *err) {
    REC(hc_expand, streams, y, post, comb, n_tok, N, D);
    return k_hc_expand(streams, y, post, comb, n_tok, N, D, s, err);
}

typedef struct latent_a {
    float *lat;
    const float *ckv, *tail;
    uint32_t tld, hd, r, n_tok;
    tm_k_dsv41_seqs q;
} latent_a;
static void run_latent(const void *p) {
    const latent_a *a = p;
    (void)k_latent(a->lat, a->ckv, a->tail, a->tld, a->hd, a->r, a->n_tok, &a->q, NULL, &run_err);
}
tm_rc tm_k_dsv41_latent(float *lat, const float *ckv, const float *tail, uint32_t tld, uint32_t hd,
                        uint32_t r, uint32_t n_tok, const tm_k_dsv41_seqs *q, cudaStream_t s,
                        tm_err *err) {
    REC(latent, lat, ckv, tail, tld, hd, r, n_tok, *q);
    return k_latent(lat, ckv, tail, tld, hd, r, n_tok, q, s, err);
}

typedef struct cid_store_a {
    float *field;
    uint32_t fld;
    const uint32_t *tokens;
    const int32_t *tmap;
    const uint32_t *slot;
    uint32_t n_tok;
} cid_store_a;
static void run_cid_store(const void *p) {
    const cid_store_a *a = p;
    (void)k_cid_store(a->field, a->fld, a->tokens, a->tmap, a->slot, a->n_tok, NULL, &run_err);
}
tm_rc tm_k_dsv41_cid_store(float *field, uint32_t fld, const uint32_t *tokens, const int32_t *tmap,
                           const uint32_t *slot, uint32_t n_tok, cudaStream_t s, tm_err *err) {
    REC(cid_store, field, fld, tokens, tmap, slot, n_tok);
    return k_cid_store(field, fld, tokens, tmap, slot, n_tok, s, err);
}

typedef struct swiglu_a {
    float *g;
    const float *u;
    uint32_t n_row, I;
    float lim;
    const float *wt;
} swiglu_a;
static void run_swiglu(const void *p) {
    const swiglu_a *a = p;
    (void)k_swiglu(a->g, a->u, a->n_row, a->I, a->lim, a->wt, NULL, &run_err);
}
tm_rc tm_k_dsv41_swiglu(float *g, const float *u, uint32_t n_row, uint32_t I, float lim,
                        const float *wt, cudaStream_t s, tm_err *err) {
    REC(swiglu, g, u, n_row, I, lim, wt);
    return k_swiglu(g, u, n_row, I, lim, wt, s, err);
}

typedef struct moe_combine_a {
    float *y;
    const float *eo;
    const uint32_t *eo_row, *sel;
    const float *sh;
    uint32_t n_tok, K, D;
} moe_combine_a;
static void run_moe_combine(const void *p) {
    const moe_combine_a *a = p;
    (void)k_moe_combine(a->y, a->eo, a->eo_row, a->sel, a->sh, a->n_tok, a->K, a->D, NULL,
                        &run_err);
}
tm_rc tm_k_dsv41_moe_combine(float *y, const float *eo, const uint32_t *eo_row, const uint32_t *sel,
                             const float *sh, uint32_t n_tok, uint32_t K, uint32_t D,
                             cudaStream_t s, tm_err *err) {
    REC(moe_combine, y, eo, eo_row, sel, sh, n_tok, K, D);
    return k_moe_combine(y, eo, eo_row, sel, sh, n_tok, K, D, s, err);
}
