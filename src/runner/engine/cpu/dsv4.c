/* runner/engine/cpu/dsv4.c - the DeepSeek-V4 forward pass on the CPU
 * (docs/deepseek_v4.md has the math). A step stacks the tokens of every
 * sequence (prefill chunks and decodes mixed) into one [T][...] activation
 * matrix for the projections; the compressors and the attention then work per
 * token against the sequence's paged state.
 *
 * State: everything a later token needs lives in the KV blocks named by the
 * block table, per layer: the rotated KV row of every token (sliding window),
 * the compressor inputs of every token (kv and gate projections; the indexer's
 * too on CSA layers) and the compressed rows (one per closed window of `ratio`
 * tokens, stored in the block holding the window's first token). Because every
 * stored value is a function of the token prefix only, blocks can be shared by
 * the prefix cache and copied (kv_copy) like plain KV, and nothing is kept per
 * sequence outside the blocks. Block size must be a multiple of each ratio so a
 * window never straddles blocks.
 *
 * Numerics: fp32; matmuls through tm_cpu_matmul_rows (fixed reduction order),
 * so results do not depend on batch composition, chunking or thread count.
 *
 * fp8 KV (opts->kv_dtype TM_KV_DTYPE_FP8, docs/deepseek_v4.md "fp8 KV cache"):
 * the rows the attention and the indexer read (rotated KV rows, compressed rows,
 * indexer compressed rows) are rounded when written to what DeepSeek's fp8 cache
 * holds (e4m3 tiles with power-of-two scales, the rope slice in bf16) and kept
 * in fp32; the compressor inputs stay fp32, as a GPU keeps them. The rounding
 * is per row, so values stay a function of the token prefix only.
 *
 * Tensor parallel (tp_size > 1, docs/deepseek_v4.md "Tensor parallel"): this
 * engine is one rank; it reads its rows of the full model's tensors in place
 * (query heads, output groups, expert width, vocabulary) and keeps owned f32
 * copies of its column slices (o_b, the down projections); opts->allreduce sums
 * the embedding, the o_b product and the MoE output. At tp 1 every call is the
 * unsplit one, bit for bit.
 *
 * MTP: the model's MTP layer, when it has one, is layer n_layer here (weights,
 * state in the KV blocks, kv_copy); tm_dsv4_mtp_forward runs it on its own
 * streams buffer so the main forward's final streams stay readable
 * (tm_dsv4_hidden). All memory is allocated at create; forward allocates
 * nothing. One thread drives an engine.
 */
#include "runner/engine/cpu/dsv4.h"

#include <math.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "runner/engine/cpu/arch.h"
#include "runner/engine/cpu/dsv_common.h"
#include "runner/engine/cpu/ops.h"
#include "runner/engine/cpu/thread_pool.h"
#include "runner/model/model_dsv4.h"
#include "runner/tp/shard.h"

/* fp32 copies of a layer's small tensors */
typedef struct dl_small {
    float *attn_hc_base, *attn_hc_scale, *ffn_hc_base, *ffn_hc_scale; /* [mix], [3] */
    float *attn_norm, *ffn_norm;                                      /* [D] */
    float *q_a_norm, *kv_norm, *sinks;                                /* [q_lora], [hd], [H] */
    float *c_bias, *c_norm;                                           /* [ratio][cw], [hd] */
    float *i_bias, *i_norm;                                           /* [4][2di], [di] */
    float *router_bias;                                               /* [E] or NULL */
    uint32_t *tid2eid;                                                /* [V][k] or NULL */
} dl_small;

/* A layer's paged state; each pointer is [n_block][...], NULL where the layer
 * has none. */
typedef struct dl_state {
    float *kv;    /* [n_block][bs][hd] rotated KV rows */
    float *cin;   /* [n_block][bs][2*cw] compressor inputs: kv (cw) | gate (cw) */
    float *comp;  /* [n_block][bs/ratio][hd] compressed rows */
    float *iin;   /* [n_block][bs][4*di] indexer inputs: kv (2di) | gate (2di) */
    float *icomp; /* [n_block][bs/4][di] indexer compressed rows */
    uint32_t ratio, cw;
} dl_state;

/* Tensor parallel: a layer's column slices of this rank (o_b's columns of its output groups, the
 * down projections' columns of its expert width), owned f32 copies (dequantized when the
 * checkpoint's are quantized). */
typedef struct dl_cols {
    tm_tensor o_b;     /* [D][n_group * o_lora] */
    tm_tensor down;    /* [E][D][n_ff] */
    tm_tensor sh_down; /* [D][n_ff] */
} dl_cols;

typedef struct dsv4_eng {
    tm_engine eng; /* eng.impl points back here */
    const tm_model *m;
    const tm_dsv4 *w;
    tm_model_cfg c;
    tm_dsv4_cfg d;
    tm_cpu_pool *pool;
    uint32_t n_thread;
    uint32_t bs, n_block, max_pos, T, S;
    uint32_t D, N, hd, H, rd, mix, qr, di, Hi, E, I, G, olr, ing;
    /* tensor parallel (docs/deepseek_v4.md "Tensor parallel"): H, G and Ir are this rank's
     * heads, output groups and expert width (the whole model's at tp 1), sh says where they
     * start; I is the full expert width (weight row offsets) */
    uint32_t tp, Ir;
    tm_shard_dsv4 sh;
    int kv8;       /* kv_dtype fp8: rows rounded when written (tm_dsv4_fp8_kv_row, _index_row) */
    uint32_t NL;   /* layers with weights and state: n_layer, + 1 with the MTP layer (last) */
    dl_cols *cols; /* [NL], NULL at tp 1 */
    dl_small *sm;  /* [NL] */
    dl_state *st;  /* [NL] */
    /* MTP (tm_dsv4_mtp_forward) */
    float *mstreams;                         /* [T][N*D] its streams; NULL without MTP */
    float *mtp_enorm, *mtp_hnorm, *mtp_norm; /* [D] */
    float *mtp_hc_base, *mtp_hc_scale;       /* [N], [1] */
    tm_batch_seq *mseqs;                     /* [S] its rows as a batch for the layers */
    tm_batch mb;
    uint32_t last_T; /* tokens of the last forward: e->streams holds their final streams */
    float *hc_head_base, *hc_head_scale, *out_norm;
    /* activations, [T] rows */
    float *streams;                       /* [T][N*D] */
    float *hcn;                           /* [T][N*D] normalized streams */
    float *mixes;                         /* [T][mix] */
    float *post;                          /* [T][N] */
    float *comb;                          /* [T][N*N] */
    float *x;                             /* [T][D] collapsed */
    float *h;                             /* [T][D] normed block input */
    float *qres;                          /* [T][q_lora] */
    float *q;                             /* [T][H*hd] */
    float *kvr;                           /* [T][hd] */
    float *cbuf;                          /* [T][2*2hd] compressor kv|gate */
    float *ibuf;                          /* [T][4di] */
    float *iq;                            /* [T][Hi*di] */
    float *iw;                            /* [T][Hi] */
    float *att;                           /* [T][H*hd] */
    float *gin;                           /* [T][max(ing, D)] gathered rows */
    float *oa;                            /* [T][G*olr] */
    float *out;                           /* [T][D] */
    float *rl;                            /* [T][E] router logits */
    uint32_t *sel_e;                      /* [T][k] chosen experts */
    float *sel_w;                         /* [T][k] their weights */
    uint32_t *e_tok;                      /* [T] tokens of one expert */
    float *e_wt;                          /* [T] */
    float *gu;                            /* [T][2I] */
    float *act;                           /* [T][I] */
    float *dn;                            /* [T][D] */
    float *tmp;                           /* [N*D] */
    float *cos_m, *sin_m, *cos_c, *sin_c; /* [T][rd/2] */
    uint32_t *pos, *tok_seq, *tok_id;     /* [T] */
    float *last;                          /* [S][N*D] streams of the rows that want logits */
    float *lastx;                         /* [S][D] */
    float *lastn;                         /* [S][N*D] */
    float *lastm;                         /* [S][N] */
    /* per-thread scratch */
    float *wbuf;
    size_t wbuf_floats;
    float *scr; /* [n_thread][scr_floats] */
    size_t scr_floats;
    /* the step being run */
    const tm_batch *b;
    uint32_t layer;
} dsv4_eng;

static void dsv4_destroy(tm_engine *eng);
static tm_rc dsv4_forward(tm_engine *eng, const tm_batch *b, float *logits, tm_err *err);
static tm_rc dsv4_kv_copy(tm_engine *eng, uint32_t src, uint32_t dst, uint32_t n_tok, tm_err *err);

static void dsv4_draft_info(const tm_engine *eng, tm_engine_draft_info *info);

static const tm_engine_ops dsv4_ops = {
    .name = "cpu",
    .kv_auto = "f32",
    .forward = dsv4_forward,
    .kv_copy = dsv4_kv_copy,
    .draft_info = dsv4_draft_info,
    .hidden = tm_dsv4_hidden,
    .draft = tm_dsv4_mtp_forward,
    .destroy = dsv4_destroy,
};

/* ---- helpers ---- */

static float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }

/* Unweighted RMS norm of n floats in place. */
static void rms_unweighted(float *x, uint32_t n, float eps) {
    float ss = tm_cpu_dot(x, x, n);
    float s = 1.0f / sqrtf(ss / (float)n + eps);
    for (uint32_t i = 0; i < n; i++)
        x[i] *= s;
}

/* Weighted RMS norm (DeepseekV4RMSNorm) of n floats in place. */
static void rms_weighted(float *x, const float *w, uint32_t n, float eps) {
    float ss = tm_cpu_dot(x, x, n);
    float s = 1.0f / sqrtf(ss / (float)n + eps);
    for (uint32_t i = 0; i < n; i++)
        x[i] = w[i] * (x[i] * s);
}

static void rope_head(float *x, uint32_t hd, uint32_t rd, const float *cs, const float *sn,
                      float sign) {
    tm_dsv_rope_head(x, hd, rd, cs, sn, sign); // runner/engine/cpu/dsv_common.c
}

static void rope_table(const tm_dsv4_rope *rp, uint32_t rd, uint32_t pos, float *cs, float *sn) {
    for (uint32_t i = 0; i < rd / 2; i++) {
        float ang = (float)pos * rp->inv_freq[i];
        cs[i] = cosf(ang) * rp->attn_factor;
        sn[i] = sinf(ang) * rp->attn_factor;
    }
}

/* ---- fp8 KV (docs/deepseek_v4.md "fp8 KV cache") ---- */

#define FP8_KV_TILE 64     /* values per scale in a KV / compressed row's non-rope slice */
#define FP8_INDEX_TILE 128 /* values per scale in an indexer compressed row */

/* x[0..n) as an fp8 cache tile stores it, widened back to fp32: each value rounded to bf16, then
 * x / 2^k rounded to nearest-even e4m3 (tm_kv_fp8_round) and multiplied back, k the least integer
 * with max(amax, 1e-4) <= 448 * 2^k (amax over the bf16 values): DeepSeek's ue8m0 act_quant rule.
 * The scale is a power of two, so both products are exact. A tile holding an infinity is rounded
 * with k = 0 (saturating); NaN stays NaN. */
static void fp8_tile(float *x, uint32_t n) {
    float amax = 1e-4f;
    for (uint32_t i = 0; i < n; i++) {
        x[i] = tm_bf16_to_f32(tm_f32_to_bf16(x[i]));
        amax = fmaxf(amax, fabsf(x[i]));
    }
    int k = 0;
    if (amax < INFINITY) {
        int ex;
        const float mant = frexpf(amax, &ex); // amax = mant * 2^ex, mant in [0.5, 1)
        k = mant <= 0.875f ? ex - 9 : ex - 8; // 448 = 0.875 * 2^9
    }
    for (uint32_t i = 0; i < n; i++)
        x[i] = ldexpf(tm_kv_fp8_round(ldexpf(x[i], -k)), k);
}

void tm_dsv4_fp8_kv_row(float *row, uint32_t hd, uint32_t rd) {
    const uint32_t nope = hd - rd;
    for (uint32_t t = 0; t < nope; t += FP8_KV_TILE)
        fp8_tile(row + t, TM_MIN(FP8_KV_TILE, nope - t));
    for (uint32_t i = nope; i < hd; i++)
        row[i] = tm_bf16_to_f32(tm_f32_to_bf16(row[i]));
}

void tm_dsv4_fp8_index_row(float *row, uint32_t di) {
    for (uint32_t t = 0; t < di; t += FP8_INDEX_TILE)
        fp8_tile(row + t, TM_MIN(FP8_INDEX_TILE, di - t));
}

/* ---- matmul over the pool ---- */

typedef struct mm_job {
    tm_k_matmul_args a;
    uint32_t rows_per_item;
    dsv4_eng *e;
} mm_job;

static void mm_item(void *ctx, uint32_t item, uint32_t tid) {
    mm_job *j = ctx;
    uint32_t o0 = item * j->rows_per_item;
    uint32_t o1 = TM_MIN(o0 + j->rows_per_item, j->a.n_out);
    tm_cpu_matmul_rows(&j->a, o0, o1, j->e->wbuf + (size_t)tid * j->e->wbuf_floats);
}

/* out[t][o] (row stride ld_out) = sum_i x[t][i] * w[o][i] for o < n_out; w is
 * the row block of tensor data starting at element w_off. */
static void mm(dsv4_eng *e, float *out, uint32_t ld_out, const float *x, uint32_t n_tok,
               uint32_t n_in, const tm_tensor *w, size_t w_off, uint32_t n_out) {
    if (n_tok == 0 || n_out == 0)
        return;
    TM_ASSERT((size_t)TM_CPU_MM_ROWS * n_in <= e->wbuf_floats);
    mm_job j = {0};
    j.a.out = out;
    j.a.x = x;
    if (w->quant != TM_QUANT_NONE) { // rows read dequantized; w_off is a whole number of rows
        TM_ASSERT(w_off % w->shape[w->n_dim - 1] == 0);
        j.a.wq = w;
        j.a.wq_row0 = w_off / w->shape[w->n_dim - 1];
    } else {
        j.a.w = (const char *)w->data + w_off * tm_dtype_size(w->dtype);
        j.a.w_dtype = w->dtype;
    }
    j.a.n_tok = n_tok;
    j.a.n_in = n_in;
    j.a.n_out = n_out;
    j.a.ld_out = ld_out;
    j.e = e;
    uint64_t macs = (uint64_t)n_in * n_tok;
    uint32_t want = TM_CEIL_DIV(n_out, e->n_thread * 4);
    uint32_t min_rows = (uint32_t)TM_MIN((uint64_t)n_out, TM_CEIL_DIV(65536, TM_MAX(macs, 1)));
    want = TM_MAX(want, min_rows);
    want = TM_CEIL_DIV(want, TM_CPU_MM_ROWS) * TM_CPU_MM_ROWS;
    j.rows_per_item = TM_MAX(want, (uint32_t)TM_CPU_MM_ROWS);
    tm_cpu_pool_run(e->pool, mm_item, &j, TM_CEIL_DIV(n_out, j.rows_per_item));
}

/* Tensor parallel: sum buf[0..n) over the ranks (a no-op at tp 1). */
static void allreduce(dsv4_eng *e, float *buf, size_t n) {
    if (e->tp > 1)
        e->eng.opts.allreduce(e->eng.opts.allreduce_ctx, buf, n);
}

/* ---- hyper-connections ---- */

/* From streams rows s[n][N*D]: pre-collapse into x[n][D] and keep post/comb.
 * fn/base/scale are the HC parameters. hcn, mixes: [n] scratch rows. */
static void hc_pre(dsv4_eng *e, const float *s, uint32_t n, const tm_tensor *fn, const float *base,
                   const float *scale, float *x, float *post, float *comb) {
    const uint32_t N = e->N, D = e->D, ND = N * D, mix = e->mix;
    const float eps = e->c.rms_eps, hc_eps = e->d.hc_eps;
    memcpy(e->hcn, s, (size_t)n * ND * sizeof(float));
    for (uint32_t t = 0; t < n; t++)
        rms_unweighted(e->hcn + (size_t)t * ND, ND, eps);
    mm(e, e->mixes, mix, e->hcn, n, ND, fn, 0, mix);
    for (uint32_t t = 0; t < n; t++) {
        const float *m = e->mixes + (size_t)t * mix;
        float pre[TM_DSV4_MAX_HC];
        float *po = post + (size_t)t * N, *cb = comb + (size_t)t * N * N;
        tm_dsv_hc_split(m, scale, base, N, e->d.hc_iters, hc_eps, pre, po, cb);
        const float *st = s + (size_t)t * ND;
        float *xo = x + (size_t)t * D;
        for (uint32_t dd = 0; dd < D; dd++) {
            float acc = 0.0f;
            for (uint32_t i = 0; i < N; i++)
                acc += pre[i] * st[i * D + dd];
            xo[dd] = acc;
        }
    }
}

/* streams[t][k] = post[k] * y[t] + sum_j comb[j][k] * streams[t][j], for t < n.
 */
static void hc_post(dsv4_eng *e, float *s, uint32_t n, const float *y, const float *post,
                    const float *comb) {
    const uint32_t N = e->N, D = e->D;
    for (uint32_t t = 0; t < n; t++) {
        float *st = s + (size_t)t * N * D;
        const float *po = post + (size_t)t * N, *cb = comb + (size_t)t * N * N;
        const float *yt = y + (size_t)t * D;
        for (uint32_t k = 0; k < N; k++)
            for (uint32_t dd = 0; dd < D; dd++) {
                float acc = 0.0f;
                for (uint32_t j = 0; j < N; j++)
                    acc += cb[j * N + k] * st[j * D + dd];
                e->tmp[k * D + dd] = po[k] * yt[dd] + acc;
            }
        memcpy(st, e->tmp, (size_t)N * D * sizeof(float));
    }
}

/* ---- paged state addressing ---- */

static size_t tok_slot(const dsv4_eng *e, const uint32_t *table, uint32_t p) {
    return (size_t)table[p / e->bs] * e->bs + p % e->bs;
}

/* Row index of compressed entry w (ratio r) in a [n_block][bs/r] array. */
static size_t comp_slot(const dsv4_eng *e, const uint32_t *table, uint32_t w, uint32_t r) {
    uint32_t p = w * r;
    return (size_t)table[p / e->bs] * (e->bs / r) + (p % e->bs) / r;
}

/* Compressed entry w: softmax(gate + bias) over the window's slots per channel,
 * weighted sum of kv, RMSNorm, RoPE ("compress") at position w*r. in: per-token
 * rows of width 2*cw (kv | gate). overlap (CSA and indexer, cw = 2*dim): slots
 * are window w-1's first halves and window w's second halves; otherwise (HCA,
 * cw = dim) window w's tokens. */
static void compress_entry(dsv4_eng *e, const float *in, uint32_t cw, const uint32_t *table,
                           uint32_t w, uint32_t r, uint32_t dim, int overlap, const float *bias,
                           const float *norm, float *out, float *scr) {
    float *g = scr, *v = scr + 2 * r;
    const uint32_t rd = e->rd;
    for (uint32_t dd = 0; dd < dim; dd++) {
        uint32_t n = 0;
        if (overlap && w > 0)
            for (uint32_t j = 0; j < r; j++) {
                const float *row = in + tok_slot(e, table, (w - 1) * r + j) * 2 * cw;
                v[n] = row[dd];
                g[n++] = row[cw + dd] + bias[j * cw + dd];
            }
        uint32_t off = overlap ? dim : 0;
        for (uint32_t j = 0; j < r; j++) {
            const float *row = in + tok_slot(e, table, w * r + j) * 2 * cw;
            v[n] = row[off + dd];
            g[n++] = row[cw + off + dd] + bias[j * cw + off + dd];
        }
        float mx = -INFINITY, sum = 0.0f, acc = 0.0f;
        for (uint32_t i = 0; i < n; i++)
            mx = fmaxf(mx, g[i]);
        for (uint32_t i = 0; i < n; i++) {
            g[i] = expf(g[i] - mx);
            sum += g[i];
        }
        for (uint32_t i = 0; i < n; i++)
            acc += v[i] * (g[i] / sum);
        out[dd] = acc;
    }
    rms_weighted(out, norm, dim, e->c.rms_eps);
    float cs[512], sn[512];
    rope_table(&e->d.rope_compress, rd, w * r, cs, sn);
    rope_head(out, dim, rd, cs, sn, 1.0f);
}

/* ---- attention of one token (a pool item) ---- */

static void attn_item(void *ctx, uint32_t t, uint32_t tid) {
    dsv4_eng *e = ctx;
    const uint32_t il = e->layer, hd = e->hd, H = e->H;
    const dl_state *ls = &e->st[il];
    const dl_small *sm = &e->sm[il];
    const int kind = e->d.attn[il];
    const tm_batch_seq *sq = &e->b->seqs[e->tok_seq[t]];
    const uint32_t *table = sq->block_table;
    const uint32_t p = e->pos[t], W = e->d.window;
    float *scr = e->scr + (size_t)tid * e->scr_floats;
    const uint32_t max_c = e->max_pos;             // bound on compressed entries of any ratio
    float *lg = scr;                               // [W + max_c] logits of one head
    uint32_t *sel = (uint32_t *)(scr + W + max_c); // [max_c] chosen compressed entries
    float *isc = scr + W + 2 * (size_t)max_c;      // [max_c] indexer scores

    const uint32_t p0 = p + 1 > W ? p + 1 - W : 0, n_sl = p - p0 + 1;
    uint32_t n_c = 0;
    if (kind == TM_DSV4_ATTN_HCA) {
        n_c = (p + 1) / ls->ratio;
        for (uint32_t i = 0; i < n_c; i++)
            sel[i] = i;
    } else if (kind == TM_DSV4_ATTN_CSA) {
        // Lightning indexer: score every closed entry, keep the top index_topk.
        const uint32_t n_valid = (p + 1) / ls->ratio, Hi = e->Hi, di = e->di;
        const float *iq = e->iq + (size_t)t * Hi * di, *iw = e->iw + (size_t)t * Hi;
        const float sscale = 1.0f / sqrtf((float)di), wscale = 1.0f / sqrtf((float)Hi);
        for (uint32_t w = 0; w < n_valid; w++) {
            const float *k = ls->icomp + comp_slot(e, table, w, ls->ratio) * di;
            float s = 0.0f;
            for (uint32_t hh = 0; hh < Hi; hh++) {
                float dot = tm_cpu_dot(iq + (size_t)hh * di, k, di);
                s += (fmaxf(dot, 0.0f) * sscale) * (iw[hh] * wscale);
            }
            isc[w] = s;
        }
        uint32_t k = TM_MIN(e->d.index_topk, n_valid);
        if (k == n_valid) {
            for (uint32_t i = 0; i < n_valid; i++)
                sel[i] = i;
        } else {
            // Selection of the k best (lowest index first on ties); O(k * n), fine
            // here.
            for (uint32_t i = 0; i < k; i++) {
                uint32_t best = UINT32_MAX;
                for (uint32_t w = 0; w < n_valid; w++)
                    if (isc[w] != -INFINITY && (best == UINT32_MAX || isc[w] > isc[best]))
                        best = w;
                sel[i] = best;
                isc[best] = -INFINITY;
            }
        }
        n_c = k;
    }

    const float scale = 1.0f / sqrtf((float)hd);
    float *o = e->att + (size_t)t * H * hd;
    for (uint32_t h = 0; h < H; h++) {
        const float *qh = e->q + ((size_t)t * H + h) * hd;
        float mx = sm->sinks[e->sh.h0 + h];
        for (uint32_t i = 0; i < n_sl; i++) {
            lg[i] = tm_cpu_dot(qh, ls->kv + tok_slot(e, table, p0 + i) * hd, hd) * scale;
            mx = fmaxf(mx, lg[i]);
        }
        for (uint32_t i = 0; i < n_c; i++) {
            const float *kr = ls->comp + comp_slot(e, table, sel[i], ls->ratio) * hd;
            lg[n_sl + i] = tm_cpu_dot(qh, kr, hd) * scale;
            mx = fmaxf(mx, lg[n_sl + i]);
        }
        float sum = expf(sm->sinks[e->sh.h0 + h] - mx);
        for (uint32_t i = 0; i < n_sl + n_c; i++) {
            lg[i] = expf(lg[i] - mx);
            sum += lg[i];
        }
        float *oh = o + (size_t)h * hd;
        memset(oh, 0, hd * sizeof(float));
        for (uint32_t i = 0; i < n_sl + n_c; i++) {
            const float *vr = i < n_sl
                                  ? ls->kv + tok_slot(e, table, p0 + i) * hd
                                  : ls->comp + comp_slot(e, table, sel[i - n_sl], ls->ratio) * hd;
            float pr = lg[i] / sum;
            for (uint32_t dd = 0; dd < hd; dd++)
                oh[dd] += pr * vr[dd];
        }
        // K = V carried the rope; undo it on the output at the query position.
        const int main_rope = e->d.attn[il] == TM_DSV4_ATTN_SLIDING;
        const size_t ro = (size_t)t * (e->rd / 2);
        rope_head(oh, hd, e->rd, (main_rope ? e->cos_m : e->cos_c) + ro,
                  (main_rope ? e->sin_m : e->sin_c) + ro, -1.0f);
    }
}

/* ---- one layer ---- */

static void silu_clamped(float *out, const float *gate, const float *up, uint32_t n, float lim) {
    for (uint32_t i = 0; i < n; i++) {
        float g = fminf(gate[i], lim);
        float u = fminf(fmaxf(up[i], -lim), lim);
        out[i] = (g / (1.0f + expf(-g))) * u;
    }
}

static void layer_attn(dsv4_eng *e, uint32_t il, uint32_t T) {
    const tm_dsv4_layer *L = &e->w->layers[il];
    const dl_small *sm = &e->sm[il];
    dl_state *ls = &e->st[il];
    const uint32_t D = e->D, hd = e->hd, H = e->H, rd = e->rd, kind = e->d.attn[il];
    const float eps = e->c.rms_eps;
    const float *cs = kind == TM_DSV4_ATTN_SLIDING ? e->cos_m : e->cos_c;
    const float *sn = kind == TM_DSV4_ATTN_SLIDING ? e->sin_m : e->sin_c;

    hc_pre(e, e->streams, T, &L->attn_hc_fn, sm->attn_hc_base, sm->attn_hc_scale, e->x, e->post,
           e->comb);
    memcpy(e->h, e->x, (size_t)T * D * sizeof(float));
    for (uint32_t t = 0; t < T; t++)
        rms_weighted(e->h + (size_t)t * D, sm->attn_norm, D, eps);
    // q: low-rank, per-head unweighted norm, rope
    mm(e, e->qres, e->qr, e->h, T, D, &L->q_a, 0, e->qr);
    for (uint32_t t = 0; t < T; t++)
        rms_weighted(e->qres + (size_t)t * e->qr, sm->q_a_norm, e->qr, eps);
    mm(e, e->q, H * hd, e->qres, T, e->qr, &L->q_b, (size_t)e->sh.h0 * hd * e->qr, H * hd);
    for (uint32_t t = 0; t < T; t++)
        for (uint32_t h = 0; h < H; h++) {
            float *qh = e->q + ((size_t)t * H + h) * hd;
            rms_unweighted(qh, hd, eps);
            rope_head(qh, hd, rd, cs + (size_t)t * (rd / 2), sn + (size_t)t * (rd / 2), 1.0f);
        }
    // the shared KV row
    mm(e, e->kvr, hd, e->h, T, D, &L->kv, 0, hd);
    for (uint32_t t = 0; t < T; t++) {
        float *kv = e->kvr + (size_t)t * hd;
        rms_weighted(kv, sm->kv_norm, hd, eps);
        rope_head(kv, hd, rd, cs + (size_t)t * (rd / 2), sn + (size_t)t * (rd / 2), 1.0f);
        if (e->kv8)
            tm_dsv4_fp8_kv_row(kv, hd, rd);
        const uint32_t *table = e->b->seqs[e->tok_seq[t]].block_table;
        memcpy(ls->kv + tok_slot(e, table, e->pos[t]) * hd, kv, hd * sizeof(float));
    }
    // compressor (and indexer) inputs, stored per token
    if (kind != TM_DSV4_ATTN_SLIDING) {
        const uint32_t cw = ls->cw;
        mm(e, e->cbuf, 2 * cw, e->h, T, D, &L->c_kv, 0, cw);
        mm(e, e->cbuf + cw, 2 * cw, e->h, T, D, &L->c_gate, 0, cw);
        for (uint32_t t = 0; t < T; t++) {
            const uint32_t *table = e->b->seqs[e->tok_seq[t]].block_table;
            memcpy(ls->cin + tok_slot(e, table, e->pos[t]) * 2 * cw, e->cbuf + (size_t)t * 2 * cw,
                   2 * cw * sizeof(float));
        }
    }
    if (kind == TM_DSV4_ATTN_CSA) {
        const uint32_t di = e->di, Hi = e->Hi;
        mm(e, e->ibuf, 4 * di, e->h, T, D, &L->i_kv, 0, 2 * di);
        mm(e, e->ibuf + 2 * di, 4 * di, e->h, T, D, &L->i_gate, 0, 2 * di);
        for (uint32_t t = 0; t < T; t++) {
            const uint32_t *table = e->b->seqs[e->tok_seq[t]].block_table;
            memcpy(ls->iin + tok_slot(e, table, e->pos[t]) * 4 * di, e->ibuf + (size_t)t * 4 * di,
                   4 * di * sizeof(float));
        }
        mm(e, e->iq, Hi * di, e->qres, T, e->qr, &L->i_qb, 0, Hi * di);
        for (uint32_t t = 0; t < T; t++)
            for (uint32_t h = 0; h < Hi; h++)
                rope_head(e->iq + ((size_t)t * Hi + h) * di, di, rd,
                          e->cos_c + (size_t)t * (rd / 2), e->sin_c + (size_t)t * (rd / 2), 1.0f);
        mm(e, e->iw, Hi, e->h, T, D, &L->i_w, 0, Hi);
    }
    // close the windows that end in this step (their inputs are all stored now)
    if (kind != TM_DSV4_ATTN_SLIDING) {
        const uint32_t r = ls->ratio;
        for (uint32_t t = 0; t < T; t++) {
            const uint32_t p = e->pos[t];
            if ((p + 1) % r)
                continue;
            const uint32_t *table = e->b->seqs[e->tok_seq[t]].block_table;
            const uint32_t w = (p + 1) / r - 1;
            float *crow = ls->comp + comp_slot(e, table, w, r) * hd;
            compress_entry(e, ls->cin, ls->cw, table, w, r, hd, kind == TM_DSV4_ATTN_CSA,
                           sm->c_bias, sm->c_norm, crow, e->scr);
            if (e->kv8)
                tm_dsv4_fp8_kv_row(crow, hd, rd);
            if (kind == TM_DSV4_ATTN_CSA) {
                float *irow = ls->icomp + comp_slot(e, table, w, r) * e->di;
                compress_entry(e, ls->iin, 2 * e->di, table, w, r, e->di, 1, sm->i_bias, sm->i_norm,
                               irow, e->scr);
                if (e->kv8)
                    tm_dsv4_fp8_index_row(irow, e->di);
            }
        }
    }
    e->layer = il;
    tm_cpu_pool_run(e->pool, attn_item, e, T);
    // grouped low-rank output projection
    const uint32_t G = e->G, ing = e->ing, olr = e->olr;
    for (uint32_t g = 0; g < G; g++) {
        for (uint32_t t = 0; t < T; t++)
            memcpy(e->gin + (size_t)t * ing, e->att + (size_t)t * H * hd + (size_t)g * ing,
                   ing * sizeof(float));
        mm(e, e->oa + (size_t)g * olr, G * olr, e->gin, T, ing, &L->o_a,
           (size_t)(e->sh.g0 + g) * olr * ing, olr);
    }
    mm(e, e->out, D, e->oa, T, G * olr, e->cols ? &e->cols[il].o_b : &L->o_b, 0, D);
    allreduce(e, e->out, (size_t)T * D); // TP: each rank's groups gave a partial o_b product
    hc_post(e, e->streams, T, e->out, e->post, e->comb);
}

static void layer_moe(dsv4_eng *e, uint32_t il, uint32_t T) {
    const tm_dsv4_layer *L = &e->w->layers[il];
    const dl_small *sm = &e->sm[il];
    const uint32_t D = e->D, E = e->E, I = e->I, Ir = e->Ir, f0 = e->sh.f0, k = e->d.n_expert_used;
    hc_pre(e, e->streams, T, &L->ffn_hc_fn, sm->ffn_hc_base, sm->ffn_hc_scale, e->x, e->post,
           e->comb);
    memcpy(e->h, e->x, (size_t)T * D * sizeof(float));
    for (uint32_t t = 0; t < T; t++)
        rms_weighted(e->h + (size_t)t * D, sm->ffn_norm, D, e->c.rms_eps);
    // routing
    mm(e, e->rl, E, e->h, T, D, &L->router, 0, E);
    for (uint32_t t = 0; t < T; t++) {
        float *sc = e->rl + (size_t)t * E;
        if (e->d.scoring == TM_DSV4_SCORE_SOFTMAX) {
            float mx = -INFINITY, sum = 0.0f;
            for (uint32_t i = 0; i < E; i++)
                mx = fmaxf(mx, sc[i]);
            for (uint32_t i = 0; i < E; i++)
                sum += (sc[i] = expf(sc[i] - mx));
            for (uint32_t i = 0; i < E; i++)
                sc[i] /= sum;
        } else {
            for (uint32_t i = 0; i < E; i++) {
                float x = sc[i];
                sc[i] = e->d.scoring == TM_DSV4_SCORE_SIGMOID
                            ? sigmoidf_(x)
                            : sqrtf(x > 20.0f ? x : log1pf(expf(x))); // torch softplus
            }
        }
        uint32_t *se = e->sel_e + (size_t)t * k;
        if (e->d.hash[il]) {
            for (uint32_t j = 0; j < k; j++)
                se[j] = sm->tid2eid[(size_t)e->tok_id[t] * k + j];
        } else {
            for (uint32_t j = 0; j < k; j++) {
                uint32_t best = UINT32_MAX;
                float bv = -INFINITY;
                for (uint32_t i = 0; i < E; i++) {
                    int taken = 0;
                    for (uint32_t q = 0; q < j; q++)
                        taken |= se[q] == i;
                    float v = sc[i] + sm->router_bias[i];
                    if (!taken && (best == UINT32_MAX || v > bv)) {
                        best = i;
                        bv = v;
                    }
                }
                se[j] = best;
            }
        }
        float *sw = e->sel_w + (size_t)t * k, sum = 0.0f;
        for (uint32_t j = 0; j < k; j++)
            sum += (sw[j] = sc[se[j]]);
        for (uint32_t j = 0; j < k; j++)
            sw[j] = sw[j] / (sum + 1e-20f) * e->d.routed_scale;
    }
    // routed experts, in expert order as transformers adds them
    memset(e->out, 0, (size_t)T * D * sizeof(float));
    for (uint32_t ex = 0; ex < E; ex++) {
        uint32_t n = 0;
        for (uint32_t t = 0; t < T; t++)
            for (uint32_t j = 0; j < k; j++)
                if (e->sel_e[(size_t)t * k + j] == ex) {
                    e->e_tok[n] = t;
                    e->e_wt[n] = e->sel_w[(size_t)t * k + j];
                    memcpy(e->gin + (size_t)n * D, e->h + (size_t)t * D, D * sizeof(float));
                    n++;
                }
        if (!n)
            continue;
        if (e->tp == 1) {
            mm(e, e->gu, 2 * I, e->gin, n, D, &L->gate_up, (size_t)ex * 2 * I * D, 2 * I);
        } else { // this rank's slice of the gate rows and of the up rows
            mm(e, e->gu, 2 * Ir, e->gin, n, D, &L->gate_up, ((size_t)ex * 2 * I + f0) * D, Ir);
            mm(e, e->gu + Ir, 2 * Ir, e->gin, n, D, &L->gate_up, ((size_t)ex * 2 * I + I + f0) * D,
               Ir);
        }
        for (uint32_t i = 0; i < n; i++)
            silu_clamped(e->act + (size_t)i * Ir, e->gu + (size_t)i * 2 * Ir,
                         e->gu + (size_t)i * 2 * Ir + Ir, Ir, e->d.swiglu_limit);
        mm(e, e->dn, D, e->act, n, Ir, e->cols ? &e->cols[il].down : &L->down, (size_t)ex * D * Ir,
           D);
        for (uint32_t i = 0; i < n; i++) {
            float *o = e->out + (size_t)e->e_tok[i] * D;
            const float *dv = e->dn + (size_t)i * D;
            for (uint32_t dd = 0; dd < D; dd++)
                o[dd] += dv[dd] * e->e_wt[i];
        }
    }
    // shared expert, added after the routed sum
    mm(e, e->gu, 2 * Ir, e->h, T, D, &L->sh_gate, (size_t)f0 * D, Ir);
    mm(e, e->gu + Ir, 2 * Ir, e->h, T, D, &L->sh_up, (size_t)f0 * D, Ir);
    for (uint32_t t = 0; t < T; t++)
        silu_clamped(e->act + (size_t)t * Ir, e->gu + (size_t)t * 2 * Ir,
                     e->gu + (size_t)t * 2 * Ir + Ir, Ir, e->d.swiglu_limit);
    mm(e, e->dn, D, e->act, T, Ir, e->cols ? &e->cols[il].sh_down : &L->sh_down, 0, D);
    for (size_t i = 0; i < (size_t)T * D; i++)
        e->out[i] = e->out[i] + e->dn[i];
    allreduce(e, e->out, (size_t)T * D); // TP: routed + shared partial down products
    hc_post(e, e->streams, T, e->out, e->post, e->comb);
}

/* ---- forward ---- */

/* The final hyper-connection head (fn, base, scale), norm and the LM head on the r streams rows
 * gathered in e->last: logits rows of ld floats, this rank's vocabulary slice [vocab0, vocab0 +
 * n_vocab) (all of it at tp 1). */
static void head_logits(dsv4_eng *e, uint32_t r, const tm_tensor *fn, const float *base,
                        const float *scale, const float *norm, float *logits, uint32_t ld) {
    const uint32_t D = e->D, N = e->N;
    memcpy(e->lastn, e->last, (size_t)r * N * D * sizeof(float));
    for (uint32_t i = 0; i < r; i++)
        rms_unweighted(e->lastn + (size_t)i * N * D, N * D, e->c.rms_eps);
    mm(e, e->lastm, N, e->lastn, r, N * D, fn, 0, N);
    for (uint32_t i = 0; i < r; i++) {
        float pre[TM_DSV4_MAX_HC];
        for (uint32_t j = 0; j < N; j++)
            pre[j] = sigmoidf_(e->lastm[(size_t)i * N + j] * scale[0] + base[j]) + e->d.hc_eps;
        float *xo = e->lastx + (size_t)i * D;
        const float *st = e->last + (size_t)i * N * D;
        for (uint32_t dd = 0; dd < D; dd++) {
            float acc = 0.0f;
            for (uint32_t j = 0; j < N; j++)
                acc += pre[j] * st[j * D + dd];
            xo[dd] = acc;
        }
        rms_weighted(xo, norm, D, e->c.rms_eps);
    }
    const tm_tensor *lm = e->m->lm_head.data ? &e->m->lm_head : &e->m->embd;
    mm(e, logits, ld, e->lastx, r, D, lm, (size_t)e->sh.vocab0 * D, e->sh.n_vocab);
}

static tm_rc dsv4_forward(tm_engine *eng, const tm_batch *b, float *logits, tm_err *err) {
    dsv4_eng *e = eng->impl;
    if (b->n_seq > e->S)
        return TM_ERR(err, TM_E_INVAL, "dsv4: %u sequences > max_seqs %u", b->n_seq, e->S);
    uint32_t T = 0, n_want = 0;
    for (uint32_t s = 0; s < b->n_seq; s++) {
        const tm_batch_seq *sq = &b->seqs[s];
        if (sq->n_tok == 0 || (uint64_t)sq->pos + sq->n_tok > e->max_pos ||
            (uint64_t)sq->n_block * e->bs < (uint64_t)sq->pos + sq->n_tok)
            return TM_ERR(err, TM_E_INVAL,
                          "dsv4: sequence %u: bad chunk (pos %u, %u tokens, %u "
                          "blocks)",
                          s, sq->pos, sq->n_tok, sq->n_block);
        for (uint32_t i = 0; i < sq->n_block; i++)
            if (sq->block_table[i] >= e->n_block)
                return TM_ERR(err, TM_E_INVAL, "dsv4: block id %u out of range",
                              sq->block_table[i]);
        for (uint32_t i = 0; i < sq->n_tok; i++)
            if (sq->tokens[i] >= e->c.n_vocab)
                return TM_ERR(err, TM_E_INVAL, "dsv4: token id %u out of range", sq->tokens[i]);
        if ((uint64_t)T + sq->n_tok > e->T)
            return TM_ERR(err, TM_E_INVAL, "dsv4: step has more than %u tokens", e->T);
        for (uint32_t i = 0; i < sq->n_tok; i++) {
            e->pos[T] = sq->pos + i;
            e->tok_seq[T] = s;
            e->tok_id[T] = sq->tokens[i];
            T++;
        }
        n_want += tm_batch_seq_rows(sq);
    }
    if (n_want > tm_engine_max_rows(&eng->opts))
        return TM_ERR(err, TM_E_INVAL, "dsv4: %u logits rows > %u", n_want,
                      tm_engine_max_rows(&eng->opts));
    e->b = b;
    const uint32_t D = e->D, N = e->N, half = e->rd / 2;
    // embeddings, copied into every stream
    if (e->tp > 1) { // vocab-parallel: the rank holding a token's row contributes it, others 0
        tm_dsv_embed_slice(&e->m->embd, e->tok_id, T, e->sh.vocab0, e->sh.n_vocab, D, e->x);
        allreduce(e, e->x, (size_t)T * D);
    }
    for (uint32_t t = 0; t < T; t++) {
        float *st = e->streams + (size_t)t * N * D;
        if (e->tp > 1)
            memcpy(st, e->x + (size_t)t * D, D * sizeof(float));
        else
            tm_dtype_to_f32(e->m->embd.data, e->m->embd.dtype, (size_t)e->tok_id[t] * D, D, st);
        for (uint32_t i = 1; i < N; i++)
            memcpy(st + (size_t)i * D, st, D * sizeof(float));
        rope_table(&e->d.rope_main, e->rd, e->pos[t], e->cos_m + (size_t)t * half,
                   e->sin_m + (size_t)t * half);
        rope_table(&e->d.rope_compress, e->rd, e->pos[t], e->cos_c + (size_t)t * half,
                   e->sin_c + (size_t)t * half);
    }
    for (uint32_t il = 0; il < e->c.n_layer; il++) {
        layer_attn(e, il, T);
        layer_moe(e, il, T);
    }
    e->last_T = T;
    if (!n_want)
        return TM_OK;
    // final hyper-connection head on the rows that want logits, norm, lm_head
    uint32_t r = 0, t0 = 0;
    for (uint32_t s = 0; s < b->n_seq; s++) {
        t0 += b->seqs[s].n_tok;
        for (uint32_t k = tm_batch_seq_rows(&b->seqs[s]); k > 0; k--)
            memcpy(e->last + (size_t)r++ * N * D, e->streams + (size_t)(t0 - k) * N * D,
                   (size_t)N * D * sizeof(float));
    }
    head_logits(e, r, &e->w->hc_head_fn, e->hc_head_base, e->hc_head_scale, e->out_norm, logits,
                e->sh.n_vocab);
    return TM_OK;
}

static tm_rc dsv4_kv_copy(tm_engine *eng, uint32_t src, uint32_t dst, uint32_t n_tok, tm_err *err) {
    dsv4_eng *e = eng->impl;
    if (src >= e->n_block || dst >= e->n_block || n_tok > e->bs)
        return TM_ERR(err, TM_E_INVAL, "dsv4 kv_copy: bad blocks %u -> %u or %u tokens", src, dst,
                      n_tok);
    if (src == dst)
        return TM_OK;
    for (uint32_t il = 0; il < e->NL; il++) { // the MTP layer's state too
        const dl_state *ls = &e->st[il];
        const size_t bs = e->bs;
        memcpy(ls->kv + dst * bs * e->hd, ls->kv + src * bs * e->hd, n_tok * e->hd * sizeof(float));
        if (ls->cin) {
            // Compressed rows exist only for windows closed within the first n_tok
            // slots.
            const size_t rows = bs / ls->ratio, n_done = n_tok / ls->ratio;
            memcpy(ls->cin + dst * bs * 2 * ls->cw, ls->cin + src * bs * 2 * ls->cw,
                   n_tok * 2 * ls->cw * sizeof(float));
            memcpy(ls->comp + dst * rows * e->hd, ls->comp + src * rows * e->hd,
                   n_done * e->hd * sizeof(float));
            if (ls->iin) {
                memcpy(ls->iin + dst * bs * 4 * e->di, ls->iin + src * bs * 4 * e->di,
                       n_tok * 4 * e->di * sizeof(float));
                memcpy(ls->icomp + dst * rows * e->di, ls->icomp + src * rows * e->di,
                       n_done * e->di * sizeof(float));
            }
        }
    }
    return TM_OK;
}

/* ---- create / destroy ---- */

static float *small_f32(const tm_tensor *t, int *failed) {
    if (!t->data)
        return NULL;
    size_t n = (size_t)tm_tensor_n_elem(t);
    float *p = tm_malloc(n * sizeof(float));
    if (!p) {
        *failed = 1;
        return NULL;
    }
    tm_dtype_to_f32(t->data, t->dtype, 0, n, p);
    return p;
}

static int col_slice(const tm_tensor *t, uint64_t c0, uint64_t n, tm_tensor *out) {
    return tm_dsv_col_slice(t, c0, n, out); // runner/engine/cpu/dsv_common.c
}

static float *alloc_f(size_t n, int *failed) {
    float *p = tm_calloc(n ? n : 1, sizeof(float));
    if (!p)
        *failed = 1;
    return p;
}

tm_rc tm_dsv4_engine_create(const tm_model *m, const tm_engine_opts *opts, tm_engine **out,
                            tm_err *err) {
    const tm_dsv4 *w = tm_model_dsv4(m);
    if (!w)
        return TM_ERR(err, TM_E_INVAL, "dsv4 engine: not a DeepSeek-V4 model");
    if (!opts->block_size || !opts->n_kv_block || !opts->max_seqs || !opts->max_batched_tokens)
        return TM_ERR(err, TM_E_INVAL,
                      "dsv4 engine: block_size, n_kv_block, max_seqs and "
                      "max_batched_tokens must be > 0");
    if (opts->kv_dtype != TM_KV_DTYPE_AUTO && opts->kv_dtype != TM_KV_DTYPE_FP8)
        return TM_ERR(err, TM_E_INVAL, "dsv4 engine: kv_cache_dtype %s not supported (auto or fp8)",
                      tm_kv_dtype_name(opts->kv_dtype));
    const tm_dsv4_cfg *d = &w->cfg;
    const uint32_t tp = TM_MAX(opts->tp_size, 1u);
    if (tp > 1 && !opts->allreduce)
        return TM_ERR(err, TM_E_INVAL, "dsv4 engine: tp_size %u without an all-reduce", tp);
    tm_shard_dsv4 sh;
    tm_rc src = tm_shard_dsv4_split(&sh, &m->cfg, d->o_groups, tp > 1 ? opts->tp_rank : 0, tp, err);
    if (src)
        return src;
    for (uint32_t il = 0; il < m->cfg.n_layer + w->n_mtp; il++) {
        uint32_t r = d->attn[il] == TM_DSV4_ATTN_CSA   ? d->ratio_csa
                     : d->attn[il] == TM_DSV4_ATTN_HCA ? d->ratio_hca
                                                       : 1;
        if (opts->block_size % r)
            return TM_ERR(err, TM_E_INVAL,
                          "dsv4 engine: block_size %u is not a multiple of layer %u's "
                          "compression ratio %u",
                          opts->block_size, il, r);
    }
    uint64_t max_pos = (uint64_t)opts->n_kv_block * opts->block_size;
    if (max_pos > (1u << 30))
        return TM_ERR(err, TM_E_INVAL, "dsv4 engine: KV pool too large");
    dsv4_eng *e = tm_calloc(1, sizeof(*e));
    if (!e)
        return TM_ERR(err, TM_E_NOMEM, "dsv4 engine header");
    e->eng.ops = &dsv4_ops;
    e->eng.model = m;
    e->eng.opts = *opts;
    e->eng.impl = e;
    e->m = m;
    e->w = w;
    e->c = m->cfg;
    e->d = *d;
    e->n_thread = opts->n_threads;
    if (!e->n_thread) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        e->n_thread = n > 0 ? (uint32_t)n : 1;
    }
    e->eng.opts.n_threads = e->n_thread;
    e->bs = opts->block_size;
    e->n_block = opts->n_kv_block;
    e->max_pos = (uint32_t)max_pos;
    e->T = opts->max_batched_tokens;
    e->S = opts->max_seqs;
    e->D = m->cfg.n_embd;
    e->N = d->hc_mult;
    e->hd = m->cfg.head_dim;
    e->H = m->cfg.n_head;
    e->rd = d->rope_dim;
    e->mix = (2 + e->N) * e->N;
    e->qr = d->q_lora_rank;
    e->di = d->index_head_dim;
    e->Hi = d->index_n_heads;
    e->E = d->n_expert;
    e->I = m->cfg.n_ff;
    e->G = d->o_groups;
    e->olr = d->o_lora_rank;
    e->ing = e->H * e->hd / e->G;
    e->tp = tp;
    e->sh = sh;
    e->kv8 = opts->kv_dtype == TM_KV_DTYPE_FP8;
    e->H = sh.n_head; // from here on this rank's part
    e->G = sh.n_group;
    e->Ir = sh.n_ff;

    const size_t T = e->T, S = e->S, R = tm_engine_max_rows(opts), D = e->D, ND = (size_t)e->N * D,
                 hd = e->hd;
    e->NL = m->cfg.n_layer + w->n_mtp;
    const size_t nb = e->n_block, bs = e->bs, L = e->NL;
    int failed = 0;
    tm_rc rc = tm_cpu_pool_create(e->n_thread, &e->pool, err);
    if (rc) {
        tm_free(e);
        return rc;
    }
    e->sm = tm_calloc(L, sizeof(*e->sm));
    e->st = tm_calloc(L, sizeof(*e->st));
    if (!e->sm || !e->st)
        failed = 1;
    for (size_t il = 0; !failed && il < L; il++) {
        const tm_dsv4_layer *lw = &w->layers[il];
        dl_small *sm = &e->sm[il];
        dl_state *ls = &e->st[il];
        sm->attn_hc_base = small_f32(&lw->attn_hc_base, &failed);
        sm->attn_hc_scale = small_f32(&lw->attn_hc_scale, &failed);
        sm->ffn_hc_base = small_f32(&lw->ffn_hc_base, &failed);
        sm->ffn_hc_scale = small_f32(&lw->ffn_hc_scale, &failed);
        sm->attn_norm = small_f32(&lw->attn_norm, &failed);
        sm->ffn_norm = small_f32(&lw->ffn_norm, &failed);
        sm->q_a_norm = small_f32(&lw->q_a_norm, &failed);
        sm->kv_norm = small_f32(&lw->kv_norm, &failed);
        sm->sinks = small_f32(&lw->sinks, &failed);
        sm->c_bias = small_f32(&lw->c_bias, &failed);
        sm->c_norm = small_f32(&lw->c_norm, &failed);
        sm->i_bias = small_f32(&lw->i_bias, &failed);
        sm->i_norm = small_f32(&lw->i_norm, &failed);
        sm->router_bias = small_f32(&lw->router_bias, &failed);
        if (lw->tid2eid.data) {
            size_t n = (size_t)tm_tensor_n_elem(&lw->tid2eid);
            sm->tid2eid = tm_malloc(n * sizeof(uint32_t));
            if (!sm->tid2eid)
                failed = 1;
            for (size_t i = 0; sm->tid2eid && i < n; i++)
                sm->tid2eid[i] = (uint32_t)tm_tensor_get_f32(&lw->tid2eid, i);
        }
        ls->kv = alloc_f(nb * bs * hd, &failed);
        const int kind = d->attn[il];
        if (kind != TM_DSV4_ATTN_SLIDING) {
            ls->ratio = kind == TM_DSV4_ATTN_CSA ? d->ratio_csa : d->ratio_hca;
            ls->cw = kind == TM_DSV4_ATTN_CSA ? 2 * e->hd : e->hd;
            ls->cin = alloc_f(nb * bs * 2 * ls->cw, &failed);
            ls->comp = alloc_f(nb * (bs / ls->ratio) * hd, &failed);
        }
        if (kind == TM_DSV4_ATTN_CSA) {
            ls->iin = alloc_f(nb * bs * 4 * e->di, &failed);
            ls->icomp = alloc_f(nb * (bs / ls->ratio) * e->di, &failed);
        }
    }
    if (tp > 1 && !failed) {
        e->cols = tm_calloc(L, sizeof(*e->cols));
        failed = !e->cols;
        for (size_t il = 0; !failed && il < L; il++) {
            const tm_dsv4_layer *lw = &w->layers[il];
            const uint64_t olr = e->olr;
            failed = col_slice(&lw->o_b, sh.g0 * olr, sh.n_group * olr, &e->cols[il].o_b) ||
                     col_slice(&lw->down, sh.f0, sh.n_ff, &e->cols[il].down) ||
                     col_slice(&lw->sh_down, sh.f0, sh.n_ff, &e->cols[il].sh_down);
        }
    }
    e->hc_head_base = small_f32(&w->hc_head_base, &failed);
    e->hc_head_scale = small_f32(&w->hc_head_scale, &failed);
    e->out_norm = small_f32(&m->out_norm, &failed);
    if (w->n_mtp) {
        e->mstreams = alloc_f(T * ND, &failed);
        e->mtp_enorm = small_f32(&w->mtp.enorm, &failed);
        e->mtp_hnorm = small_f32(&w->mtp.hnorm, &failed);
        e->mtp_norm = small_f32(&w->mtp.norm, &failed);
        e->mtp_hc_base = small_f32(&w->mtp.hc_head_base, &failed);
        e->mtp_hc_scale = small_f32(&w->mtp.hc_head_scale, &failed);
        e->mseqs = tm_calloc(S, sizeof(*e->mseqs));
        failed |= !e->mseqs;
    }
    const size_t ing = e->ing, I = e->I, E = e->E, k = d->n_expert_used;
    e->streams = alloc_f(T * ND, &failed);
    e->hcn = alloc_f(T * ND, &failed);
    e->mixes = alloc_f(T * e->mix, &failed);
    e->post = alloc_f(T * e->N, &failed);
    e->comb = alloc_f(T * e->N * e->N, &failed);
    e->x = alloc_f(T * D, &failed);
    e->h = alloc_f(T * D, &failed);
    e->qres = alloc_f(T * e->qr, &failed);
    e->q = alloc_f(T * e->H * hd, &failed);
    e->kvr = alloc_f(T * hd, &failed);
    e->cbuf = alloc_f(T * 4 * hd, &failed);
    e->ibuf = alloc_f(T * 4 * e->di, &failed);
    e->iq = alloc_f(T * e->Hi * e->di, &failed);
    e->iw = alloc_f(T * e->Hi, &failed);
    e->att = alloc_f(T * e->H * hd, &failed);
    // Expert gathers take up to T * k rows (a token may list an expert more than
    // once).
    e->gin = alloc_f(T * k * TM_MAX(ing, D), &failed);
    e->oa = alloc_f(T * e->G * e->olr, &failed);
    e->out = alloc_f(T * D, &failed);
    e->rl = alloc_f(T * E, &failed);
    e->sel_e = tm_calloc(T * k, sizeof(uint32_t));
    e->e_tok = tm_calloc(T * k, sizeof(uint32_t));
    if (!e->sel_e || !e->e_tok)
        failed = 1;
    e->sel_w = alloc_f(T * k, &failed);
    e->e_wt = alloc_f(T * k, &failed);
    e->gu = alloc_f(T * k * 2 * I, &failed);
    e->act = alloc_f(T * k * I, &failed);
    e->dn = alloc_f(T * k * D, &failed);
    e->tmp = alloc_f(ND, &failed);
    e->cos_m = alloc_f(T * (e->rd / 2), &failed);
    e->sin_m = alloc_f(T * (e->rd / 2), &failed);
    e->cos_c = alloc_f(T * (e->rd / 2), &failed);
    e->sin_c = alloc_f(T * (e->rd / 2), &failed);
    e->pos = tm_calloc(T, sizeof(uint32_t));
    e->tok_seq = tm_calloc(T, sizeof(uint32_t));
    e->tok_id = tm_calloc(T, sizeof(uint32_t));
    if (!e->pos || !e->tok_seq || !e->tok_id)
        failed = 1;
    e->last = alloc_f(R * ND, &failed);
    e->lastn = alloc_f(R * ND, &failed);
    e->lastx = alloc_f(R * D, &failed);
    e->lastm = alloc_f(R * e->N, &failed);
    size_t max_in = TM_MAX(TM_MAX(ND, (size_t)e->qr), TM_MAX(ing, (size_t)e->G * e->olr));
    max_in = TM_MAX(max_in, TM_MAX(I, D));
    e->wbuf_floats = TM_CPU_MM_ROWS * max_in;
    e->wbuf = alloc_f(e->n_thread * e->wbuf_floats, &failed);
    // attention scratch: window logits + compressed logits, selection, indexer
    // scores; the compressor uses the first 4 * max ratio floats of thread 0's.
    uint32_t rmax = TM_MAX(d->ratio_csa, d->ratio_hca);
    e->scr_floats = TM_MAX((size_t)d->window + 3 * (size_t)e->max_pos, 4 * (size_t)rmax);
    e->scr = alloc_f(e->n_thread * e->scr_floats, &failed);
    if (failed) {
        dsv4_destroy(&e->eng);
        return TM_ERR(err, TM_E_NOMEM, "dsv4 engine: state and activations");
    }
    *out = &e->eng;
    return TM_OK;
}

static void dsv4_destroy(tm_engine *eng) {
    if (!eng)
        return;
    dsv4_eng *e = eng->impl;
    tm_cpu_pool_destroy(e->pool);
    for (uint32_t il = 0; e->sm && il < e->NL; il++) {
        dl_small *sm = &e->sm[il];
        float *f[] = {sm->attn_hc_base, sm->attn_hc_scale, sm->ffn_hc_base, sm->ffn_hc_scale,
                      sm->attn_norm,    sm->ffn_norm,      sm->q_a_norm,    sm->kv_norm,
                      sm->sinks,        sm->c_bias,        sm->c_norm,      sm->i_bias,
                      sm->i_norm,       sm->router_bias};
        for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++)
            tm_free(f[i]);
        tm_free(sm->tid2eid);
    }
    for (uint32_t il = 0; e->st && il < e->NL; il++) {
        tm_free(e->st[il].kv);
        tm_free(e->st[il].cin);
        tm_free(e->st[il].comp);
        tm_free(e->st[il].iin);
        tm_free(e->st[il].icomp);
    }
    for (uint32_t il = 0; e->cols && il < e->NL; il++) {
        tm_free((void *)e->cols[il].o_b.data);
        tm_free((void *)e->cols[il].down.data);
        tm_free((void *)e->cols[il].sh_down.data);
    }
    tm_free(e->cols);
    tm_free(e->sm);
    tm_free(e->st);
    void *p[] = {e->mstreams,
                 e->mtp_enorm,
                 e->mtp_hnorm,
                 e->mtp_norm,
                 e->mtp_hc_base,
                 e->mtp_hc_scale,
                 e->mseqs,
                 e->hc_head_base,
                 e->hc_head_scale,
                 e->out_norm,
                 e->streams,
                 e->hcn,
                 e->mixes,
                 e->post,
                 e->comb,
                 e->x,
                 e->h,
                 e->qres,
                 e->q,
                 e->kvr,
                 e->cbuf,
                 e->ibuf,
                 e->iq,
                 e->iw,
                 e->att,
                 e->gin,
                 e->oa,
                 e->out,
                 e->rl,
                 e->sel_e,
                 e->sel_w,
                 e->e_tok,
                 e->e_wt,
                 e->gu,
                 e->act,
                 e->dn,
                 e->tmp,
                 e->cos_m,
                 e->sin_m,
                 e->cos_c,
                 e->sin_c,
                 e->pos,
                 e->tok_seq,
                 e->tok_id,
                 e->last,
                 e->lastn,
                 e->lastx,
                 e->lastm,
                 e->wbuf,
                 e->scr};
    for (size_t i = 0; i < sizeof(p) / sizeof(p[0]); i++)
        tm_free(p[i]);
    tm_free(e);
}

/* ---- the paged state, read back ---- */

const float *tm_dsv4_state(const tm_engine *eng, uint32_t il, tm_dsv4_part part, uint32_t block,
                           uint32_t *n_row, uint32_t *width) {
    *n_row = *width = 0;
    const tm_engine *r0 = tm_engine_cpu_tp_rank((tm_engine *)eng, 0); // every rank holds it
    if (r0)
        eng = r0;
    if (!eng || eng->ops != &dsv4_ops)
        return NULL;
    const dsv4_eng *e = eng->impl;
    if (il >= e->NL || block >= e->n_block)
        return NULL;
    const dl_state *ls = &e->st[il];
    const float *base = NULL;
    uint32_t rows = e->bs, w = 0;
    switch (part) {
    case TM_DSV4_PART_KV:
        base = ls->kv, w = e->hd;
        break;
    case TM_DSV4_PART_CIN:
        base = ls->cin, w = 2 * ls->cw;
        break;
    case TM_DSV4_PART_COMP:
        base = ls->comp, w = e->hd, rows = ls->ratio ? e->bs / ls->ratio : 0;
        break;
    case TM_DSV4_PART_IIN:
        base = ls->iin, w = 4 * e->di;
        break;
    case TM_DSV4_PART_ICOMP:
        base = ls->icomp, w = e->di, rows = ls->ratio ? e->bs / ls->ratio : 0;
        break;
    }
    if (!base)
        return NULL;
    *n_row = rows;
    *width = w;
    return base + (size_t)block * rows * w;
}

/* ---- MTP ---- */

int tm_dsv4_has_mtp(const tm_model *m) {
    const tm_dsv4 *w = tm_model_dsv4(m);
    return w && w->n_mtp;
}

const float *tm_dsv4_hidden(const tm_engine *eng, uint32_t *n_tok) {
    *n_tok = 0;
    const tm_engine *r0 = tm_engine_cpu_tp_rank((tm_engine *)eng, 0); // every rank holds them
    if (r0)
        eng = r0;
    if (!eng || eng->ops != &dsv4_ops)
        return NULL;
    const dsv4_eng *e = eng->impl;
    *n_tok = e->last_T;
    return e->last_T ? e->streams : NULL;
}

uint32_t tm_dsv4_mtp_width(const tm_engine *eng) {
    const tm_engine *r0 = tm_engine_cpu_tp_rank((tm_engine *)eng, 0);
    if (r0)
        eng = r0;
    if (!eng || eng->ops != &dsv4_ops)
        return 0;
    const dsv4_eng *e = eng->impl;
    return e->w->n_mtp ? e->N * e->D : 0;
}

/* The MTP forward of one engine (a rank at tp > 1): logits rows of ld floats, this rank's
 * vocabulary slice at their start. */
static tm_rc mtp_forward(dsv4_eng *e, const tm_dsv4_mtp_seq *seqs, uint32_t n_seq, float *logits,
                         uint32_t ld, float *streams_out, tm_err *err) {
    if (!e->w->n_mtp)
        return TM_ERR(err, TM_E_INVAL, "dsv4 mtp: the model has no MTP layer");
    if (n_seq > e->S)
        return TM_ERR(err, TM_E_INVAL, "dsv4 mtp: %u sequences > max_seqs %u", n_seq, e->S);
    const uint32_t D = e->D, N = e->N, half = e->rd / 2, il = e->c.n_layer;
    const size_t ND = (size_t)N * D;
    uint32_t T = 0, r = 0;
    for (uint32_t s = 0; s < n_seq; s++) {
        const tm_dsv4_mtp_seq *sq = &seqs[s];
        if (sq->n_tok == 0 || (uint64_t)sq->pos + sq->n_tok > e->max_pos ||
            (uint64_t)sq->n_block * e->bs < (uint64_t)sq->pos + sq->n_tok || !sq->next ||
            (!sq->hidden && !sq->block_in))
            return TM_ERR(err, TM_E_INVAL,
                          "dsv4 mtp: sequence %u: bad rows (pos %u, %u rows, %u blocks, inputs)", s,
                          sq->pos, sq->n_tok, sq->n_block);
        for (uint32_t i = 0; i < sq->n_block; i++)
            if (sq->block_table[i] >= e->n_block)
                return TM_ERR(err, TM_E_INVAL, "dsv4 mtp: block id %u out of range",
                              sq->block_table[i]);
        for (uint32_t i = 0; i < sq->n_tok; i++)
            if (sq->next[i] >= e->c.n_vocab)
                return TM_ERR(err, TM_E_INVAL, "dsv4 mtp: token id %u out of range", sq->next[i]);
        if ((uint64_t)T + sq->n_tok > e->T)
            return TM_ERR(err, TM_E_INVAL, "dsv4 mtp: step has more than %u rows", e->T);
        if (sq->want_logits && !logits)
            return TM_ERR(err, TM_E_INVAL, "dsv4 mtp: sequence %u wants logits, none given", s);
        for (uint32_t i = 0; i < sq->n_tok; i++) {
            e->pos[T] = sq->pos + i;
            e->tok_seq[T] = s;
            e->tok_id[T] = sq->next[i]; // the MTP layer's input ids (hash routing, if any)
            T++;
        }
        e->mseqs[s] = (tm_batch_seq){.tokens = sq->next,
                                     .n_tok = sq->n_tok,
                                     .pos = sq->pos,
                                     .block_table = sq->block_table,
                                     .n_block = sq->n_block,
                                     .want_logits = sq->want_logits};
    }
    e->mb = (tm_batch){.seqs = e->mseqs, .n_seq = n_seq};
    e->b = &e->mb;
    const tm_dsv4_mtp *x = &e->w->mtp;
    float *main_streams = e->streams, *B = e->mstreams;
    // e = e_proj(enorm(embed(next))) [T][D] (vocab-parallel embedding, as the main forward's)
    tm_dsv_embed_slice(&e->m->embd, e->tok_id, T, e->sh.vocab0, e->sh.n_vocab, D, e->h);
    allreduce(e, e->h, (size_t)T * D);
    for (uint32_t t = 0; t < T; t++)
        rms_weighted(e->h + (size_t)t * D, e->mtp_enorm, D, e->c.rms_eps);
    mm(e, e->out, D, e->h, T, D, &x->e_proj, 0, D);
    // h_proj(hnorm(stream)) of every stream, [T * N][D]; rows given as block_in are 0 here
    for (uint32_t s = 0, t0 = 0; s < n_seq; t0 += seqs[s++].n_tok) {
        float *dst = e->hcn + (size_t)t0 * ND;
        if (seqs[s].block_in)
            memset(dst, 0, (size_t)seqs[s].n_tok * ND * sizeof(float));
        else
            memcpy(dst, seqs[s].hidden, (size_t)seqs[s].n_tok * ND * sizeof(float));
    }
    for (size_t i = 0; i < (size_t)T * N; i++)
        rms_weighted(e->hcn + i * D, e->mtp_hnorm, D, e->c.rms_eps);
    mm(e, B, D, e->hcn, T * N, D, &x->h_proj, 0, D);
    for (uint32_t t = 0; t < T; t++)
        for (uint32_t i = 0; i < N; i++) {
            float *st = B + (size_t)t * ND + (size_t)i * D;
            const float *ev = e->out + (size_t)t * D;
            for (uint32_t dd = 0; dd < D; dd++)
                st[dd] = ev[dd] + st[dd];
        }
    for (uint32_t s = 0, t0 = 0; s < n_seq; t0 += seqs[s++].n_tok)
        if (seqs[s].block_in)
            memcpy(B + (size_t)t0 * ND, seqs[s].block_in,
                   (size_t)seqs[s].n_tok * ND * sizeof(float));
    for (uint32_t t = 0; t < T; t++) {
        rope_table(&e->d.rope_main, e->rd, e->pos[t], e->cos_m + (size_t)t * half,
                   e->sin_m + (size_t)t * half);
        rope_table(&e->d.rope_compress, e->rd, e->pos[t], e->cos_c + (size_t)t * half,
                   e->sin_c + (size_t)t * half);
    }
    // the block, on its own streams (the main forward's stay for tm_dsv4_hidden)
    e->streams = B;
    layer_attn(e, il, T);
    layer_moe(e, il, T);
    e->streams = main_streams;
    if (streams_out)
        memcpy(streams_out, B, (size_t)T * ND * sizeof(float));
    for (uint32_t s = 0, t0 = 0; s < n_seq; s++) {
        t0 += seqs[s].n_tok;
        if (seqs[s].want_logits)
            memcpy(e->last + (size_t)r++ * ND, B + (size_t)(t0 - 1) * ND, ND * sizeof(float));
    }
    if (r)
        head_logits(e, r, &x->hc_head_fn, e->mtp_hc_base, e->mtp_hc_scale, e->mtp_norm, logits, ld);
    return TM_OK;
}

// The MTP layer as the engine's drafter (engine.h): one token per row, on the final streams.
static void dsv4_draft_info(const tm_engine *eng, tm_engine_draft_info *info) {
    const uint32_t width = tm_dsv4_mtp_width(eng);
    *info = (tm_engine_draft_info){.kind = width ? TM_DRAFT_MTP : TM_DRAFT_NONE,
                                   .width = width,
                                   .n_src_layer = width ? 1 : 0,
                                   .n_out = width ? 1 : 0};
}

typedef struct mtp_job {
    const tm_dsv4_mtp_seq *seqs;
    uint32_t n_seq;
    float *logits, *streams_out;
} mtp_job;

// One rank of a tensor-parallel MTP forward: its vocabulary columns of the shared logits rows.
static tm_rc mtp_rank(tm_engine *reng, uint32_t rank, void *ctx, tm_err *err) {
    const mtp_job *j = ctx;
    if (reng->ops != &dsv4_ops)
        return TM_ERR(err, TM_E_INVAL, "dsv4 mtp: not a DeepSeek-V4 CPU engine");
    dsv4_eng *e = reng->impl;
    return mtp_forward(e, j->seqs, j->n_seq, j->logits ? j->logits + e->sh.vocab0 : NULL,
                       e->c.n_vocab, rank == 0 ? j->streams_out : NULL, err);
}

tm_rc tm_dsv4_mtp_forward(tm_engine *eng, const tm_dsv4_mtp_seq *seqs, uint32_t n_seq,
                          float *logits, float *streams_out, tm_err *err) {
    if (tm_engine_cpu_tp_rank(eng, 0)) {
        mtp_job j = {.seqs = seqs, .n_seq = n_seq, .logits = logits, .streams_out = streams_out};
        return tm_engine_cpu_tp_run(eng, mtp_rank, &j, err);
    }
    if (!eng || eng->ops != &dsv4_ops)
        return TM_ERR(err, TM_E_INVAL, "dsv4 mtp: not a DeepSeek-V4 CPU engine");
    dsv4_eng *e = eng->impl;
    return mtp_forward(e, seqs, n_seq, logits, e->sh.n_vocab, streams_out, err);
}

const tm_cpu_arch tm_cpu_arch_dsv4 = {
    .name = "deepseek_v4",
    // auto, or fp8 by its own tile-scaled rule (tm_dsv4_fp8_kv_row)
    .kv_dtypes = TM_CPU_KV(TM_KV_DTYPE_AUTO) | TM_CPU_KV(TM_KV_DTYPE_FP8),
    .create = tm_dsv4_engine_create,
};
