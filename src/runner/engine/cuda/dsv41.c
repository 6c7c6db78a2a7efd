/* runner/engine/cuda/dsv41.c - DeepSeek-V4.1 on the CUDA engine (tm_cuda_arch_dsv41, arch.h): the
 * forward pass of the CPU engine (runner/engine/cpu/dsv41.c; math in docs/deepseek_v41.md) op
 * for op, with the reference's activation quantization (act_quant before every quantized linear
 * and on the window KV, fp4_act_quant on the indexer's keys and queries and on the compressed KV)
 * applied exactly. Two modes, chosen at init by TM_DSV41_CUDA_EXACT (logged):
 *
 * - fast (unset or 0, the default): every linear with bf16 weights (bf16 checkpoint tensors and
 *   the FP8 ones, dequantized at upload) runs on tensor cores with fp32 sums, on the CPU engine's
 *   inputs (kernels/dsv41.h tm_k_dsv41_to_bf16): act_quant'ed where the weight is quantized,
 *   which gives e4m3 * 2^k values that bf16 holds exactly; where it is not (wo_a, the
 *   compressor's wkv / wgate, the indexer's wk / weights_proj, the head) each fp32
 *   value x is split into hi = bf16(x) and lo = bf16(x - hi) and the linear runs as W.hi + W.lo
 *   (hi + lo is x to ~2^-17). The weights being exact in bf16, every product is exact, so each
 *   linear is the CPU engine's up to summation order and ~1e-5 relative. Decode steps (<= 16
 *   tokens) of the dense FP8 linears stream their e4m3 codes with the 32 x 32 ue8m0 block scales
 *   (kernels/gemm_quant.h, TM_K_FP8_BLOCK32_E8M0); other linears of decode steps the skinny
 *   split-K kernel over the bf16 weights (tm_cuda_project); a split input runs as ONE decode GEMM
 *   of 2 x T rows (hi rows, then lo rows: the weights are read once) when 2 x T fits the kernel,
 *   else as a hi pass and a lo pass; larger steps run cuBLAS over the bf16 copies (hi, then lo
 *   with beta 1). Split-K partials (and the hi / lo rows) are summed in order into the (possibly
 *   strided) output (tm_k_dsv41_sum_split). Routed MXFP4 experts stay packed and run
 *   through tm_k_moe_mxfp4 (pairs = the router's top-k rows on the device, outputs in pair order,
 *   so the combine still sums in expert-id order; steps of more pairs than one launch takes sort
 *   them by expert first, tm_k_dsv41_pair_sort, and the combine reads each pair's row through the
 *   permutation). Still on the plain kernel: the router (fp32
 *   inputs and weights), the hyper-connection projections (fp32 weights) and FP8 routed experts
 *   (expert_dtype fp8).
 * - exact (1, or any value but 0): the plain kernels (kernels/dsv41.h) with the CPU engine's
 *   numerics: fp32 activations, double sums (the first version, unchanged).
 *
 * A step stacks the tokens of every sequence into [T][...] rows. Engram first (host): every
 * token's compressed id goes into the state, the hash ids of the n-grams ending at each token
 * are computed on the host (the ids before the step's chunk read back from the state), and every
 * Engram table's rows are requested from the CPU engine's reader (engram_table.h) at once; each
 * Engram layer's rows are then staged through pinned memory onto the GPU (dsv41_engram.h) just
 * before the layer's kernels are queued, so the reads overlap the layers already queued. Then
 * embedding into hc_mult streams; per layer: Engram, the attention's hyper-connection mixes,
 * collapse by the previous pre mix + norm, attention (q low rank, window KV, the compressor and
 * index keys of kv sources, the indexer and its two-level selection, sparse attention, grouped
 * wo_a, wo_b), expand; the MoE's mixes, collapse + norm, MoE (router, top-k, the routed experts,
 * the shared expert, the combine in expert-id order), expand; the head on the wanted
 * rows.
 *
 * State: all per-sequence state lives in the runtime's paged KV cache: init raises impl->kv_dim so
 * that a token's K row plus its V row (in one layer) hold the layer's fields as fp32: the window
 * KV row; in kv source layers the compressor inputs (ratio > 1), the compressed row of the group
 * starting at this slot's position and, with an indexer, its index key; in layer 0 the token's
 * compressed id (Engram). Every value is a function of the token prefix, so the prefix cache, the
 * runtime's kv_copy and preemption work unchanged (a compressed row sits in the slot of its
 * group's first token, so copying a block's first n slots copies the groups closed in them).
 *
 * Weights: FP8 (32x32 ue8m0) dense linears are dequantized to bf16 at upload, which is exact for
 * e8m0 scales, and in the fast mode also kept as stored (codes + scales) for decode; MXFP4 routed
 * experts are kept packed in the fast mode, dequantized to bf16 in the exact ones; bf16 tensors
 * stay bf16; f32 (and f16, FP8 with float scales) tensors are kept fp32. Random weights
 * (benchmarks) take the same layout from the config alone (FP8 codes with power-of-two block
 * scales and their bf16 copy, packed MXFP4 experts in the fast mode); Engram tables are still read
 * from the model's folder (impl->eng.model->dir). Single GPU only (tp 1); kv_cache_dtype auto
 * only.
 *
 * CUDA graphs (own_graphs, arch.h): the runtime never captures forward (a step does host work);
 * on pure decode steps with graphs on (st->graph) forward replays graphs of its own, one per
 * SEGMENT of the layers split at the Engram layers (segment 0: the embedding and the layers before
 * the first Engram layer; segment k: Engram layer k's kernels up to the next Engram layer; the
 * last ends with the head), captured per batch size T at first use. Between segments the host
 * stages the next Engram layer's rows and the stream waits for their copy outside any graph, so
 * the reads overlap as in eager steps. A segment's launches take only (T, n_want) and fixed device
 * addresses (step metadata, state, activations, each slot's device rows); every host_meta read
 * and the checks happen before segment 0. TM_DSV41_CUDA_SYNC forces eager steps.
 * TM_DSV41_ENGRAM_SKIP=1 (benchmarks only, a warning at create): no rows read, every row zeros,
 * the Engram kernels still run (bench/dsv41_engram_overlap.sh times the reads with it).
 *
 * TM_DSV41_CUDA_SYNC=1 synchronizes after every op and names the op and layer of a failure.
 * Engine thread only; nothing allocates after init (the graphs at their first decode step). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/log.h"
#include "kernels/common.h"
#include "kernels/dequant.h"
#include "kernels/dsv41.h"
#include "kernels/fill.h"
#include "kernels/gemm_quant.h"
#include "kernels/gemm_skinny.h"
#include "runner/engine/cuda/dsv41_engram.h"
#include "runner/engine/cuda/engine_cuda.h"
#include "runner/engine/cuda/engine_cuda_int.h"
#include "runner/engine/cuda/weights.h"
#include "runner/model/engram_hash.h"
#include "runner/model/engram_open.h"
#include "runner/model/engram_table.h"
#include "runner/model/model_dsv41.h"

/* A device weight: rows of n_in, bf16 or fp32 at p; aq: its input is act_quant'ed (quantized in
 * the checkpoint). n_rows counts every expert's rows for the routed experts. f32x: the input stays
 * fp32 in every mode (the router: plain kernel). mx (fast mode, routed experts): MXFP4 kept packed,
 * codes at q ([n_rows][n_in / 2], even input in the low nibble) and e8m0 scales at qs ([n_rows]
 * [n_in / 32]); p is then NULL. f8 (fast mode, dense FP8 linears): the e4m3 codes at q ([n_rows]
 * [n_in]) and the 32 x 32 ue8m0 block scales at qs ([ceil(n_rows / 32)][n_in / 32]) beside the
 * bf16 copy at p: decode steps stream the FP8 form, larger ones run cuBLAS on the copy. */
typedef struct dw {
    void *p;
    uint8_t bf16, aq, f32x, mx, f8;
    uint8_t *q, *qs;
    uint64_t n_rows, n_in;
} dw;

/* TM_DSV41_CUDA_EXACT (read at init): 0 / unset the fast path; any other value the plain kernels
 * (fp32 inputs, double sums). */
enum { MODE_FAST = 0, MODE_EXACT = 1 };

/* Most floats of each indexer score array (isc, bsc): 128 MB. */
#define DSV41_SC_FLOATS ((uint64_t)32 << 20)

/* A state field: plane (0: K cache, 1: V cache) and float offset in the plane's row. */
typedef struct sfield {
    uint8_t on, plane;
    uint32_t off;
} sfield;

enum {
    W_HC_ATTN,
    W_HC_FFN,
    W_WQ_A,
    W_WQ_B,
    W_WKV,
    W_WO_A,
    W_WO_B,
    W_C_WKV,
    W_C_WGATE,
    W_I_WQ_B,
    W_I_WPROJ,
    W_I_WK,
    W_GATE,
    W_SH1,
    W_SH3,
    W_SH2,
    W_E_WKV,
    W_EX1,
    W_EX3,
    W_EX2,
    W_N
};
enum {
    V_HC_ATTN_BASE,
    V_HC_ATTN_SCALE,
    V_HC_FFN_BASE,
    V_HC_FFN_SCALE,
    V_ATTN_NORM,
    V_FFN_NORM,
    V_Q_NORM,
    V_KV_NORM,
    V_C_NORM,
    V_I_K_NORM,
    V_SINK,
    V_GATE_BIAS,
    V_N
};

typedef struct v41l {
    dw w[W_N];
    float *v[V_N];
    uint32_t v_n[V_N];
    float *e_w; /* Engram: [N][D] q_weight * k_weight */
    sfield f_win, f_tail, f_comp, f_ikey, f_cid;
} v41l;

typedef struct v41g {
    const tm_dsv41_cfg *c;
    uint32_t D, N, H, hd, rd, qlr, G, olr, ing, E, K, I, Hi, di, mix, topk, cb, ctop;
    uint32_t n_cols, ehd, max_in, T, S, P; /* P: floats per state row in each plane */
    size_t ld_sc;                          /* indexer score entries per token */
    uint64_t sc_pos;                       /* positions below this fit ld_sc (forward checks) */
    uint32_t sc_tok;                       /* tokens per indexer chunk: isc / bsc rows */
    double iscale;
    int sync_each;
    int mode; /* MODE_* */
    v41l *L;  /* host [n_layers] */
    dw embd, head;
    float *out_norm, *inv_main, *inv_comp;
    /* activations */
    float *s, *x, *y, *xq, *pre, *apre, *post, *comb, *mixes, *qr, *q, *kv, *o, *oa;
    float *ckv, *cgate, *lat, *lk, *iq, *iw, *isc, *bsc, *rl, *selw, *eg, *eu, *eo, *sh_g, *sh_u;
    float *sh_o, *ekv;
    uint16_t *xb; /* fast path: a linear's input rows as bf16 (split: hi rows, then lo rows) */
    float *q8p;   /* fast path: split-K partials of the FP8 decode GEMMs */
    size_t q8p_floats;
    uint32_t *pr_div, *pr_id; /* [T * K] p / K and p: the MoE kernel's x row of pair p */
    /* the pairs in expert order (tm_k_dsv41_pair_sort) for steps of more than sort_min pairs: */
    uint32_t *sp_perm, *sp_prow, *sp_inv; /* [T * K] */
    int32_t *sp_exp;                      /* [T * K] */
    float *sp_w;                          /* [T * K] */
    uint32_t sort_min;
    uint32_t *lens, *n_pick, *cand, *n_cand, *sel;
    int32_t *pick, *tmap_d;
    /* Engram (host) */
    tm_engram_layout *lay;
    tm_engram_table **etab;
    tm_dsv41_engram_stage *stage;
    const int32_t *tmap;
    uint32_t n_tmap;
    int64_t *hid;        /* [T][n_engram][n_cols] */
    uint64_t *hrows;     /* [n_engram][T * n_cols] */
    int32_t *prev_h;     /* pinned [S][max_ngram]: compressed ids before each chunk */
    const float **erows; /* host [n_engram]: each slot's device rows (fixed addresses) */
    int skip_rows;       /* TM_DSV41_ENGRAM_SKIP=1: no rows read, all zeros (benchmarks only) */
    /* CUDA graphs of pure decode steps (own_graphs): segment k of a step of T sequences is
     * gx[T * n_seg + k], captured on first use; segment 0 starts with the embedding, segment
     * k >= 1 with the Engram kernels of layer seg_l[k]; the host reads rows in between */
    uint32_t n_seg;      /* Engram layers + 1 */
    uint32_t *seg_l;     /* host [n_seg]: first layer of each segment (seg_l[0] = 0) */
    cudaGraphExec_t *gx; /* host [(S + 1) * n_seg] */
} v41g;

/* ---- config ---- */

static tm_rc check_cfg(const tm_model_cfg *c, tm_err *err) {
    if (c->arch != TM_ARCH_DEEPSEEK_V41)
        return TM_ERR(err, TM_E_INVAL, "cuda engine: dsv41: not a DeepSeek-V4.1 config");
    if (!c->n_layer || !c->n_embd || !c->n_head || !c->head_dim || !c->n_vocab)
        return TM_ERR(err, TM_E_INVAL, "cuda engine: zero dimension in model config");
    return TM_OK;
}

static tm_rc check_weights(const tm_model *m, tm_err *err) {
    const tm_dsv41 *w = tm_model_dsv41(m);
    if (!w || !w->layers)
        return TM_ERR(err, TM_E_INVAL, "cuda engine: dsv41: no DeepSeek-V4.1 weights");
    return TM_OK;
}

static tm_rc shard_cfg(const tm_model_cfg *c, uint32_t rank, uint32_t tp, tm_model_cfg *s,
                       uint32_t *vocab0, uint32_t *v_per, tm_err *err) {
    (void)c, (void)rank, (void)s, (void)vocab0, (void)v_per;
    return TM_ERR(err, TM_E_INVAL,
                  "cuda engine: deepseek_v41 runs on one GPU (engine.tp %u asked for): tensor "
                  "parallel of DeepSeek-V4.1 is on the cpu backend only for now",
                  tp);
}

/* Raised by init to the state layout's width (see the file comment). */
static uint32_t kv_dim(const tm_model_cfg *c) { return c->head_dim; }

static int prefill_tiles(const tm_model_cfg *c) {
    (void)c;
    return 0;
}

/* ---- the model's tensors ---- */

/* The host tensor behind weight i of layer W (NULL where the layer has none); experts: expert 0's
 * (the others follow in the same format). */
static const tm_tensor *wsrc(const tm_dsv41_layer *W, int i) {
    const tm_tensor *t[W_N] = {&W->hc_attn_fn, &W->hc_ffn_fn, &W->wq_a,   &W->wq_b,    &W->wkv,
                               &W->wo_a,       &W->wo_b,      &W->c_wkv,  &W->c_wgate, &W->i_wq_b,
                               &W->i_wproj,    &W->i_wk,      &W->gate_w, &W->sh_w1,   &W->sh_w3,
                               &W->sh_w2,      &W->e_wkv,     NULL,       NULL,        NULL};
    if (i >= W_EX1)
        return W->experts ? &W->experts[i - W_EX1] : NULL;
    return t[i] && t[i]->data ? t[i] : NULL;
}

static const tm_tensor *vsrc(const tm_dsv41_layer *W, int i) {
    const tm_tensor *t[V_N] = {&W->hc_attn_base, &W->hc_attn_scale, &W->hc_ffn_base,
                               &W->hc_ffn_scale, &W->attn_norm,     &W->ffn_norm,
                               &W->q_norm,       &W->kv_norm,       &W->c_norm,
                               &W->i_k_norm,     &W->attn_sink,     &W->gate_bias};
    return t[i]->data ? t[i] : NULL;
}

/* The device format of host tensor t: bf16 where that is exact (bf16, or FP8 / FP4 codes with
 * power-of-two scales), else fp32. */
static void wformat(const tm_tensor *t, uint64_t n_rows_mul, dw *d) {
    const uint64_t n_in = t->shape[t->n_dim - 1];
    d->n_in = n_in;
    d->n_rows = tm_tensor_n_elem(t) / n_in * n_rows_mul;
    d->aq = t->quant != TM_QUANT_NONE;
    if (t->quant != TM_QUANT_NONE)
        d->bf16 = t->scale_dtype == TM_DTYPE_F8_E8M0 &&
                  (t->dtype == TM_DTYPE_F8_E4M3 || t->dtype == TM_DTYPE_F4_E2M1);
    else
        d->bf16 = t->dtype == TM_DTYPE_BF16;
}

static void fini(tm_cuda_engine *impl) {
    v41g *g = impl->arch_state;
    if (!g)
        return;
    tm_dsv41_engram_stage_destroy(g->stage);
    for (uint32_t k = 0; g->etab && k < g->c->n_engram; k++)
        tm_engram_table_close(g->etab[k]);
    tm_engram_layout_destroy(g->lay);
    if (g->prev_h)
        cudaFreeHost(g->prev_h);
    for (size_t i = 0; g->gx && i < (size_t)(g->S + 1) * g->n_seg; i++)
        if (g->gx[i])
            cudaGraphExecDestroy(g->gx[i]);
    tm_free(g->gx);
    tm_free(g->seg_l);
    tm_free(g->erows);
    tm_free(g->etab);
    tm_free(g->hid);
    tm_free(g->hrows);
    tm_free(g->L);
    tm_free(g);
    impl->arch_state = NULL;
}

static void place(sfield *f, uint32_t *used, uint32_t P, uint32_t n) {
    f->on = 1;
    f->plane = used[0] + n <= P ? 0 : 1;
    f->off = used[f->plane];
    used[f->plane] += n;
}

/* The fields of every layer in planes of P floats; 0 when one does not fit. */
static int layout(v41g *g, uint32_t P) {
    const tm_dsv41_cfg *c = g->c;
    for (uint32_t l = 0; l < c->n_layers; l++) {
        v41l *L = &g->L[l];
        uint32_t used[2] = {0, 0};
        memset(&L->f_win, 0, 5 * sizeof(sfield));
        place(&L->f_win, used, P, g->hd);
        if (c->ratio[l] && c->kv_source[l]) {
            if (c->ratio[l] > 1)
                place(&L->f_tail, used, P, 2 * g->hd);
            place(&L->f_comp, used, P, g->hd);
            if (c->index_source[l])
                place(&L->f_ikey, used, P, g->di);
        }
        if (l == 0 && c->n_engram)
            place(&L->f_cid, used, P, 1);
        if (used[0] > P || used[1] > P)
            return 0;
    }
    return 1;
}

/* The Engram tables (read by rows from the model's files), their hash layout and the staging. */
static tm_rc engram_open(tm_cuda_engine *impl, v41g *g, tm_err *err) {
    const tm_dsv41_cfg *c = g->c;
    const tm_engine_opts *o = &impl->eng.opts;
    tm_rc rc = tm_dsv41_engram_map_check(c, o->token_map, o->n_token_map, "cuda engine: dsv41",
                                         err);
    if (rc)
        return rc;
    g->tmap = o->token_map;
    g->n_tmap = o->n_token_map;
    g->etab = tm_calloc(c->n_engram, sizeof(*g->etab));
    g->erows = tm_calloc(c->n_engram, sizeof(*g->erows));
    g->hid = tm_calloc((size_t)g->T * c->n_engram * g->n_cols, sizeof(*g->hid));
    g->hrows = tm_calloc((size_t)g->T * c->n_engram * g->n_cols, sizeof(*g->hrows));
    if (!g->etab || !g->erows || !g->hid || !g->hrows)
        return TM_ERR(err, TM_E_NOMEM, "cuda engine: dsv41 Engram buffers");
    rc = tm_dsv41_engram_open(c, impl->eng.model->dir, o->token_map, 0, 1, o->engram_cache_mb,
                              &g->lay, g->etab, err);
    if (!rc)
        rc = TM_CUDA_CHECK(
            cudaMallocHost((void **)&g->prev_h, (size_t)g->S * TM_ENGRAM_MAX_NGRAM * 4), err);
    for (uint32_t k = 0; !rc && k < c->n_engram; k++) // the rows are read as [n_cols][ehd]
        if (tm_engram_table_info_get(g->etab[k])->dim != g->ehd)
            rc = TM_ERR(err, TM_E_INVAL,
                        "cuda engine: dsv41: Engram table of layer %u has rows of %u values, "
                        "engram_head_dim is %u",
                        c->engram_layer_ids[k], tm_engram_table_info_get(g->etab[k])->dim, g->ehd);
    if (!rc)
        rc = tm_dsv41_engram_stage_create(g->etab, c->n_engram, (size_t)g->T * g->n_cols, &g->stage,
                                          err);
    const char *skip = getenv("TM_DSV41_ENGRAM_SKIP");
    g->skip_rows = skip && strcmp(skip, "0") != 0;
    if (!rc && g->skip_rows) { // zero rows at fixed addresses, which the Engram kernels read
        TM_LOG_WARN("cuda",
                    "TM_DSV41_ENGRAM_SKIP=%s: Engram rows are NOT read (every row is zeros): the "
                    "outputs are wrong; for timing the Engram reads only",
                    skip);
        rc = tm_dsv41_engram_stage_zero(g->stage, err);
        for (uint32_t k = 0; !rc && k < c->n_engram; k++)
            rc = tm_dsv41_engram_stage_wait(g->stage, k, NULL, &g->erows[k], err);
    }
    return rc;
}

/* 1 when the fast path can keep MXFP4 routed experts packed (tm_k_moe_mxfp4's limits). */
static int mx_ok(const v41g *g) {
    return g->mode == MODE_FAST && g->D % 32 == 0 && g->I % 32 == 0 && g->E <= TM_MOE_MAX_EXPERT;
}

/* A dense FP8 tensor as tm_k_gemm_fp8 reads it with TM_K_FP8_BLOCK32_E8M0. */
static int is_fp8_32(const tm_tensor *t) {
    return t->quant == TM_QUANT_FP8_BLOCK && t->dtype == TM_DTYPE_F8_E4M3 &&
           t->scale_dtype == TM_DTYPE_F8_E8M0 && t->qblock[0] == 32 && t->qblock[1] == 32;
}

/* 1 when the fast path keeps linear d's FP8 form for decode steps (d: bf16 copy, not the router;
 * wo_a runs per group: olr rows of ing). */
static int f8_ok(const v41g *g, int i, const dw *d) {
    const uint64_t n_in = i == W_WO_A ? g->ing : d->n_in, n_out = i == W_WO_A ? g->olr : d->n_rows;
    return g->mode == MODE_FAST && d->bf16 && !d->f32x && d->n_rows &&
           tm_k_gemm_fp8_kind_fits(TM_K_FP8_BLOCK32_E8M0, 1, (uint32_t)n_in, (uint32_t)n_out);
}

/* An MXFP4 tensor as tm_k_moe_mxfp4 reads it: e2m1 pairs, e8m0 scales per 32 inputs of a row. */
static int is_mxfp4(const tm_tensor *t) {
    return t->quant == TM_QUANT_MXFP4 && t->dtype == TM_DTYPE_F4_E2M1 &&
           t->scale_dtype == TM_DTYPE_F8_E8M0 && t->qblock[0] == 1 && t->qblock[1] == 32;
}

/* Random weights (benchmarks: only the config is known): the checkpoint's layout with the dense
 * linears bf16 (as upload stores FP8 ones), routed experts packed MXFP4 in the fast mode (bf16 in
 * the exact ones, as upload), hyper-connection projections fp32, and aq where the released
 * checkpoint quantizes the weight. */
static void random_formats(v41g *g) {
    const tm_dsv41_cfg *c = g->c;
    const uint64_t D = g->D, ND = (uint64_t)g->N * g->D, hd = g->hd, E = g->E, I = g->I;
    for (uint32_t l = 0; l < c->n_layers; l++) {
        v41l *L = &g->L[l];
        const uint32_t r = c->ratio[l];
        const int kv = r && c->kv_source[l], ix = r && c->index_source[l];
        const struct {
            int i, on, bf16, aq;
            uint64_t rows, n_in;
        } f[] = {{W_HC_ATTN, 1, 0, 0, g->mix, ND},
                 {W_HC_FFN, 1, 0, 0, g->mix, ND},
                 {W_WQ_A, 1, 1, 1, g->qlr, D},
                 {W_WQ_B, 1, 1, 1, (uint64_t)g->H * hd, g->qlr},
                 {W_WKV, 1, 1, 1, hd, D},
                 {W_WO_A, 1, 1, 0, (uint64_t)g->G * g->olr, g->ing},
                 {W_WO_B, 1, 1, 1, D, (uint64_t)g->G * g->olr},
                 {W_C_WKV, kv, 1, 0, hd, D},
                 {W_C_WGATE, kv && r > 1, 1, 0, hd, D},
                 {W_I_WQ_B, ix, 1, 1, (uint64_t)g->Hi * g->di, g->qlr},
                 {W_I_WPROJ, ix, 1, 0, g->Hi, D},
                 {W_I_WK, kv && ix, 1, 0, g->di, hd},
                 {W_GATE, 1, 1, 0, E, D},
                 {W_SH1, 1, 1, 1, I, D},
                 {W_SH3, 1, 1, 1, I, D},
                 {W_SH2, 1, 1, 1, D, I},
                 {W_E_WKV, c->engram_slot[l] >= 0, 1, 1, (uint64_t)(g->N + 1) * D,
                  (uint64_t)g->n_cols * g->ehd},
                 {W_EX1, 1, 1, 1, E * I, D},
                 {W_EX3, 1, 1, 1, E * I, D},
                 {W_EX2, 1, 1, 1, E * D, I}};
        for (size_t k = 0; k < sizeof(f) / sizeof(f[0]); k++)
            if (f[k].on)
                L->w[f[k].i] = (dw){.bf16 = (uint8_t)f[k].bf16,
                                    .aq = (uint8_t)f[k].aq,
                                    .f32x = f[k].i == W_GATE,
                                    .mx = f[k].i >= W_EX1 && mx_ok(g),
                                    .n_rows = f[k].rows,
                                    .n_in = f[k].n_in};
        // FP8 where the release quantizes (wo_a too: FP8 stored, its input not act_quant'ed)
        for (int i = 0; i < W_EX1; i++)
            L->w[i].f8 = (L->w[i].aq || i == W_WO_A) && f8_ok(g, i, &L->w[i]);
        const uint32_t vn[V_N] = {
            g->mix, 3,   g->mix, 3, g->D, g->D, g->qlr, g->hd, kv ? g->hd : 0, kv && ix ? g->di : 0,
            g->H,   g->E};
        memcpy(L->v_n, vn, sizeof(vn));
    }
    g->embd = (dw){.bf16 = 1, .n_rows = c->vocab_size, .n_in = D};
    g->head = (dw){.bf16 = 1, .n_rows = c->vocab_size, .n_in = D};
}

static tm_rc init(tm_cuda_engine *impl, tm_err *err) {
    const tm_model *m = impl->eng.model;
    const tm_dsv41 *w = tm_model_dsv41(m);
    if (!w)
        return TM_ERR(err, TM_E_INVAL, "cuda engine: dsv41: no DeepSeek-V4.1 config");
    if (impl->kv_fp8)
        return TM_ERR(err, TM_E_INVAL, "cuda engine: dsv41: kv_cache_dtype fp8 not supported");
    if (impl->tp_size > 1)
        return TM_ERR(err, TM_E_INVAL, "cuda engine: dsv41: tp %u not supported (one GPU)",
                      impl->tp_size);
    const tm_dsv41_cfg *c = &w->cfg;
    const tm_engine_opts *o = &impl->eng.opts;
    v41g *g = tm_calloc(1, sizeof(*g));
    impl->arch_state = g;
    if (g)
        g->L = tm_calloc(c->n_layers, sizeof(v41l));
    if (!g || !g->L)
        return TM_ERR(err, TM_E_NOMEM, "cuda engine: dsv41 state");
    g->c = c;
    g->D = c->dim, g->N = c->hc_mult, g->H = c->n_heads, g->hd = c->head_dim;
    g->rd = c->rope_head_dim, g->qlr = c->q_lora_rank, g->G = c->o_groups;
    g->olr = c->o_lora_rank, g->ing = c->n_heads * c->head_dim / c->o_groups;
    g->E = c->n_routed_experts, g->K = c->n_activated_experts, g->I = c->moe_inter_dim;
    g->Hi = c->index_n_heads, g->di = c->index_head_dim, g->mix = (2 + g->N) * g->N;
    g->topk = c->index_topk ? c->index_topk : 1;
    g->cb = c->candidate_block_size ? c->candidate_block_size : 1;
    g->ctop = c->candidate_topk_blocks ? c->candidate_topk_blocks : 1;
    g->n_cols = c->n_engram ? (c->engram_max_ngram_size - 1) * c->engram_n_heads : 0;
    g->ehd = c->engram_head_dim;
    g->iscale = pow((double)g->di, -0.5) * pow((double)c->index_n_heads, -0.5);
    g->T = o->max_batched_tokens, g->S = o->max_seqs;
    const char *sy = getenv("TM_DSV41_CUDA_SYNC");
    g->sync_each = sy && strcmp(sy, "0") != 0;
    const char *ex = getenv("TM_DSV41_CUDA_EXACT");
    g->mode = !ex || !strcmp(ex, "0") ? MODE_FAST : MODE_EXACT;
    TM_LOG_INFO("cuda", "dsv41: %s (TM_DSV41_CUDA_EXACT=%s)",
                g->mode == MODE_FAST ? "fast path: bf16 tensor-core linears, MXFP4 MoE kernel"
                                     : "exact mode: plain kernels (fp32 inputs, double sums)",
                ex ? ex : "unset");
    if (g->N < 1 || g->N > TM_DSV41_K_MAX_HC || g->K < 1 || g->K > g->E || g->rd > g->hd ||
        g->rd % 2 || g->T > 65535)
        return TM_ERR(err, TM_E_INVAL,
                      "cuda engine: dsv41: hc_mult %u (1..%d), experts %u of %u, rope dim %u, "
                      "max_batched_tokens %u (<= 65535) unsupported",
                      g->N, TM_DSV41_K_MAX_HC, g->K, g->E, g->rd, g->T);
    if (tm_k_dsv41_attn_smem(c->window_size, g->topk, g->hd) > 48 * 1024)
        return TM_ERR(err, TM_E_INVAL,
                      "cuda engine: dsv41: window %u + index_topk %u with head_dim %u exceed the "
                      "attention kernel's shared memory",
                      c->window_size, g->topk, g->hd);
    uint32_t rmin = 0;
    for (uint32_t l = 0; l < c->n_layers; l++) {
        if (c->ratio[l] && o->block_size % c->ratio[l])
            return TM_ERR(err, TM_E_INVAL,
                          "cuda engine: dsv41: block_size %u is not a multiple of layer %u's "
                          "compression ratio %u",
                          o->block_size, l, c->ratio[l]);
        if (c->ratio[l] && (!rmin || c->ratio[l] < rmin))
            rmin = c->ratio[l];
    }
    // indexer entries per token: min(max_seq_len, n_ctx, pool) positions / the smallest ratio
    // (n_ctx: the model's context as the job capped it, engine.max_model_len; the pool is sized
    // only later when n_kv_block is 0)
    uint64_t seq_pos = TM_MAX(c->max_seq_len, 1u);
    if (impl->cfg.n_ctx)
        seq_pos = TM_MIN(seq_pos, (uint64_t)impl->cfg.n_ctx);
    if (o->n_kv_block)
        seq_pos = TM_MIN(seq_pos, (uint64_t)o->n_kv_block * o->block_size);
    g->sc_pos = seq_pos;
    g->ld_sc = (size_t)(rmin ? seq_pos / rmin : 1) + 1;
    // The score rows (isc, bsc) of T tokens over a long context would be T x ld_sc floats each
    // (at max_seq_len 1M and ratio 1: 4 MB a token): the indexer runs over the step's tokens in
    // chunks of sc_tok rows, within DSV41_SC_FLOATS floats per array. TM_DSV41_INDEX_CHUNK=n
    // (tests): chunks of at most n tokens.
    g->sc_tok = (uint32_t)TM_MIN((uint64_t)g->T, TM_MAX(DSV41_SC_FLOATS / g->ld_sc, (uint64_t)1));
    const char *ich = getenv("TM_DSV41_INDEX_CHUNK");
    if (ich && atoi(ich) > 0)
        g->sc_tok = TM_MIN(g->sc_tok, (uint32_t)atoi(ich));
    // Packed MXFP4 experts over more pairs than one MoE launch takes (prefill): the pairs in
    // expert order first (each launch then streams a few experts, not nearly all of them).
    // TM_DSV41_MOE_SORT_MIN=n (tests): sort above n pairs.
    g->sort_min = TM_MOE_MAX_PAIRS;
    const char *smin = getenv("TM_DSV41_MOE_SORT_MIN");
    if (smin && *smin)
        g->sort_min = (uint32_t)strtoul(smin, NULL, 10);
    {
        uint32_t mi = TM_MAX(g->N * g->D, g->qlr);
        mi = TM_MAX(mi, g->hd);
        mi = TM_MAX(mi, g->ing);
        mi = TM_MAX(mi, g->G * g->olr);
        mi = TM_MAX(mi, g->I);
        mi = TM_MAX(mi, g->n_cols * g->ehd);
        g->max_in = mi;
    }
    // the weights' device formats (the routed experts: one array per w1 / w3 / w2)
    if (impl->random)
        random_formats(g);
    for (uint32_t l = 0; !impl->random && l < c->n_layers; l++) {
        const tm_dsv41_layer *W = &w->layers[l];
        v41l *L = &g->L[l];
        for (int i = 0; i < W_N; i++) {
            const tm_tensor *t = wsrc(W, i);
            if (!t)
                continue;
            wformat(t, i >= W_EX1 ? g->E : 1, &L->w[i]);
            // the router stays on fp32 inputs in every mode, as the CPU engine's: a bf16 rounding
            // there flips expert choices at near ties (the reference computes it in fp32)
            L->w[i].f32x = i == W_GATE;
            L->w[i].mx = i >= W_EX1 && is_mxfp4(t) && mx_ok(g);
            L->w[i].f8 = i < W_EX1 && is_fp8_32(t) && f8_ok(g, i, &L->w[i]);
            for (uint32_t e = 1; i >= W_EX1 && e < g->E; e++) {
                const tm_tensor *x = &W->experts[e * 3 + (i - W_EX1)];
                if (x->dtype != t->dtype || x->quant != t->quant ||
                    x->scale_dtype != t->scale_dtype)
                    return TM_ERR(err, TM_E_INVAL,
                                  "cuda engine: dsv41: layer %u: experts of mixed formats", l);
            }
        }
        for (int i = 0; i < V_N; i++) {
            const tm_tensor *t = vsrc(W, i);
            L->v_n[i] = t ? (uint32_t)tm_tensor_n_elem(t) : 0;
        }
    }
    if (!impl->random) {
        wformat(&m->embd, 1, &g->embd);
        wformat(&m->lm_head, 1, &g->head);
    }
    // the state layout: the smallest plane width (a multiple of 4 floats) that holds every
    // layer's fields
    uint32_t need = 0;
    for (uint32_t l = 0; l < c->n_layers; l++) {
        uint32_t f = g->hd;
        if (c->ratio[l] && c->kv_source[l])
            f += (c->ratio[l] > 1 ? 2 * g->hd : 0) + g->hd + (c->index_source[l] ? g->di : 0);
        f += l == 0 && c->n_engram;
        need = TM_MAX(need, f);
    }
    uint32_t P = TM_CEIL_DIV(TM_CEIL_DIV(need, 2u), 4u) * 4;
    while (!layout(g, P))
        P += 4;
    g->P = P;
    impl->kv_dim = 2 * P; // bf16 elements of a K (and of a V) row = P floats each
    // the decode graphs' segments: split before every Engram layer
    g->n_seg = 1;
    for (uint32_t l = 0; l < c->n_layers; l++)
        g->n_seg += c->engram_slot[l] >= 0;
    g->seg_l = tm_calloc(g->n_seg, sizeof(*g->seg_l));
    g->gx = tm_calloc((size_t)(g->S + 1) * g->n_seg, sizeof(*g->gx));
    if (!g->seg_l || !g->gx)
        return TM_ERR(err, TM_E_NOMEM, "cuda engine: dsv41 graphs");
    for (uint32_t l = 0, k = 1; l < c->n_layers; l++)
        if (c->engram_slot[l] >= 0)
            g->seg_l[k++] = l;
    if (c->n_engram)
        return engram_open(impl, g, err);
    return TM_OK;
}

/* 1 when the fast path runs linear w on tensor cores (bf16 weights at p; not the router). */
static int fast_lin(const v41g *g, const dw *w) {
    return g->mode == MODE_FAST && w->bf16 && !w->f32x && !w->mx && w->n_rows;
}

/* The skinny kernel's partial floats for (n_in, n_out) at n_tok tokens (0 where it does not run).
 */
static size_t sk_need(const tm_cuda_engine *impl, uint32_t n_tok, uint64_t n_in, uint64_t n_out) {
    if (!tm_k_gemm_skinny_fits(n_tok, (uint32_t)n_in, (uint32_t)n_out))
        return 0;
    uint32_t kps = 0;
    const uint32_t ns = tm_k_gemm_skinny_splits((uint32_t)n_in, (uint32_t)n_out, impl->n_sm, &kps);
    return (size_t)ns * n_tok * n_out;
}

/* sk_part for the fast path's projections at up to n_tok tokens (tm_cuda_project asserts it
 * holds n_split x n_tok x n_out even when one split writes straight to its output). */
static size_t skinny_floats(const tm_cuda_engine *impl, uint32_t n_tok) {
    const v41g *g = impl->arch_state;
    size_t need = 0;
    if (fast_lin(g, &g->head))
        need = sk_need(impl, n_tok, g->head.n_in, g->head.n_rows);
    for (uint32_t l = 0; l < g->c->n_layers; l++)
        for (int i = 0; i < W_EX1; i++) {
            const dw *d = &g->L[l].w[i];
            if (fast_lin(g, d)) // wo_a runs per group: olr rows of ing
                need = TM_MAX(need, i == W_WO_A ? sk_need(impl, n_tok, g->ing, g->olr)
                                                : sk_need(impl, n_tok, d->n_in, d->n_rows));
        }
    return need;
}

/* ---- memory ---- */

static void carve_w(tm_cuda_carver *cv, dw *d) {
    if (d->n_rows && d->mx) {
        d->q = tm_cuda_carve(cv, (size_t)(d->n_rows * d->n_in / 2));
        d->qs = tm_cuda_carve(cv, (size_t)(d->n_rows * d->n_in / 32));
    } else if (d->n_rows) {
        d->p = tm_cuda_carve(cv, (size_t)(d->n_rows * d->n_in) * (d->bf16 ? 2 : 4));
    }
    if (d->n_rows && d->f8) {
        d->q = tm_cuda_carve(cv, (size_t)(d->n_rows * d->n_in));
        d->qs = tm_cuda_carve(cv, (size_t)(TM_CEIL_DIV(d->n_rows, 32) * (d->n_in / 32)));
    }
}

static void carve_weights(tm_cuda_engine *impl, tm_cuda_carver *cv) {
    v41g *g = impl->arch_state;
    const tm_dsv41_cfg *c = g->c;
    const size_t f4 = sizeof(float);
    carve_w(cv, &g->embd);
    carve_w(cv, &g->head);
    g->out_norm = tm_cuda_carve(cv, g->D * f4);
    g->inv_main = tm_cuda_carve(cv, TM_MAX(g->rd / 2, 1u) * f4);
    g->inv_comp = tm_cuda_carve(cv, TM_MAX(g->rd / 2, 1u) * f4);
    g->tmap_d = tm_cuda_carve(cv, TM_MAX(g->n_tmap, 1u) * f4);
    for (uint32_t l = 0; l < c->n_layers; l++) {
        v41l *L = &g->L[l];
        for (int i = 0; i < W_N; i++)
            carve_w(cv, &L->w[i]);
        for (int i = 0; i < V_N; i++)
            L->v[i] = L->v_n[i] ? tm_cuda_carve(cv, L->v_n[i] * f4) : NULL;
        L->e_w = c->engram_slot[l] >= 0 ? tm_cuda_carve(cv, (size_t)g->N * g->D * f4) : NULL;
    }
}

static void carve_acts(tm_cuda_engine *impl, tm_cuda_carver *cv) {
    v41g *g = impl->arch_state;
    const size_t T = g->T, f4 = sizeof(float), TK = T * g->K;
#define CF(p, n) (p) = tm_cuda_carve(cv, TM_MAX((size_t)(n), (size_t)1) * f4)
    CF(g->s, T * g->N * g->D);
    CF(g->x, T * g->D);
    CF(g->y, T * g->D);
    CF(g->xq, T * TM_MAX(g->max_in, g->K * g->I)); // the experts' w2 input: T * K rows of I
    CF(g->pre, T * g->N);
    CF(g->apre, T * g->N);
    CF(g->post, T * g->N);
    CF(g->comb, T * g->N * g->N);
    CF(g->mixes, T * g->mix);
    CF(g->qr, T * g->qlr);
    CF(g->q, T * g->H * g->hd);
    CF(g->kv, T * g->hd);
    CF(g->o, T * g->H * g->hd);
    CF(g->oa, T * g->G * g->olr);
    CF(g->ckv, T * g->hd);
    CF(g->cgate, T * g->hd);
    CF(g->lat, T * g->hd);
    CF(g->lk, T * g->di);
    CF(g->iq, T * g->Hi * g->di);
    CF(g->iw, T * g->Hi);
    CF(g->isc, (size_t)g->sc_tok * g->ld_sc);
    CF(g->bsc, (size_t)g->sc_tok * g->ld_sc);
    CF(g->rl, T * g->E);
    CF(g->selw, TK);
    CF(g->eg, TK * g->I);
    CF(g->eu, TK * g->I);
    CF(g->eo, TK * g->D);
    CF(g->sh_g, T * g->I);
    CF(g->sh_u, T * g->I);
    CF(g->sh_o, T * g->D);
    CF(g->ekv, T * (g->N + 1) * g->D);
    // bf16 inputs of the fast path: twice as many values as xq holds (a split input's hi and lo
    // rows), 2 per float
    CF(g->xb, T * TM_MAX(g->max_in, g->K * g->I));
    g->q8p_floats = 0; // the FP8 decode GEMMs' partials: n_split x TM_QUANT_MAX_TOK x n_out
    for (uint32_t l = 0; l < g->c->n_layers; l++)
        for (int i = 0; i < W_EX1; i++) {
            const dw *d = &g->L[l].w[i];
            if (!d->f8)
                continue;
            const uint32_t n_in = i == W_WO_A ? g->ing : (uint32_t)d->n_in;
            const uint32_t n_out = i == W_WO_A ? g->olr : (uint32_t)d->n_rows;
            uint32_t kps = 0;
            const uint32_t ns = tm_k_gemm_fp8_splits(n_in, n_out, impl->n_sm, &kps);
            g->q8p_floats = TM_MAX(g->q8p_floats, (size_t)ns * TM_QUANT_MAX_TOK * n_out);
        }
    CF(g->q8p, g->q8p_floats);
    CF(g->pr_div, TK);
    CF(g->pr_id, TK);
    CF(g->sp_perm, TK);
    CF(g->sp_prow, TK);
    CF(g->sp_inv, TK);
    CF(g->sp_exp, TK);
    CF(g->sp_w, TK);
    CF(g->lens, T);
    CF(g->n_pick, T);
    CF(g->cand, T * g->ctop);
    CF(g->n_cand, T);
    CF(g->sel, TK);
    CF(g->pick, T * g->topk);
#undef CF
}

/* ---- weights ---- */

/* t (rows of any dtype, quantized ones dequantized: tm_tensor_row_f32) as fp32 at dst through fb
 * (TM_CUDA_UPLOAD_CHUNK floats). */
static tm_rc up_f32(float *dst, const tm_tensor *t, float *fb, tm_err *err) {
    const uint64_t C = t->shape[t->n_dim - 1], R = tm_tensor_n_elem(t) / C;
    TM_ASSERT(C <= TM_CUDA_UPLOAD_CHUNK);
    const uint64_t per = TM_CUDA_UPLOAD_CHUNK / C;
    for (uint64_t r = 0; r < R; r += per) {
        const uint64_t k = TM_MIN(per, R - r);
        for (uint64_t j = 0; j < k; j++)
            tm_tensor_row_f32(t, (size_t)(r + j), fb + j * C);
        tm_rc rc = tm_cuda_h2d(dst + r * C, fb, (size_t)(k * C) * 4, err);
        if (rc)
            return rc;
    }
    return TM_OK;
}

static tm_rc up_w(void *dst, int bf16, const tm_tensor *t, uint16_t *stage, float *fb,
                  tm_err *err) {
    return bf16 ? tm_cuda_upload_bf16(dst, t, stage, fb, err) : up_f32(dst, t, fb, err);
}

/* The MoE kernel's row of x for pair p = t * K + k: p / K for w1 / w3 (the token's row), p for
 * w2 (the pair's own SwiGLU row); fb holds TM_CUDA_UPLOAD_CHUNK floats (>= T * K). */
static tm_rc up_pairs(v41g *g, float *fb, tm_err *err) {
    const size_t TK = (size_t)g->T * g->K;
    uint32_t *u = (uint32_t *)fb;
    TM_ASSERT(TK <= TM_CUDA_UPLOAD_CHUNK);
    for (size_t p = 0; p < TK; p++)
        u[p] = (uint32_t)(p / g->K);
    tm_rc rc = tm_cuda_h2d(g->pr_div, u, TK * 4, err);
    for (size_t p = 0; p < TK; p++)
        u[p] = (uint32_t)p;
    return rc ? rc : tm_cuda_h2d(g->pr_id, u, TK * 4, err);
}

static tm_rc upload(tm_cuda_engine *impl, const tm_model *m, tm_err *err) {
    v41g *g = impl->arch_state;
    const tm_dsv41 *w = tm_model_dsv41(m);
    const tm_dsv41_cfg *c = g->c;
    float *fb = tm_malloc(TM_CUDA_UPLOAD_CHUNK * sizeof(float));
    uint16_t *stage = tm_malloc(TM_CUDA_UPLOAD_CHUNK * sizeof(uint16_t));
    float *ew = tm_malloc((size_t)g->N * g->D * sizeof(float));
    tm_rc rc = TM_OK;
    if (!fb || !stage || !ew) {
        rc = TM_ERR(err, TM_E_NOMEM, "cuda engine: dsv41 upload staging");
        goto out;
    }
    rc = up_w(g->embd.p, g->embd.bf16, &m->embd, stage, fb, err);
    if (!rc)
        rc = up_w(g->head.p, g->head.bf16, &m->lm_head, stage, fb, err);
    if (!rc)
        rc = up_f32(g->out_norm, &m->out_norm, fb, err);
    if (!rc && g->rd)
        rc = tm_cuda_h2d(g->inv_main, c->inv_freq_main, g->rd / 2 * sizeof(float), err);
    if (!rc && g->rd)
        rc = tm_cuda_h2d(g->inv_comp, c->inv_freq_comp, g->rd / 2 * sizeof(float), err);
    if (!rc && g->n_tmap)
        rc = tm_cuda_h2d(g->tmap_d, g->tmap, g->n_tmap * sizeof(int32_t), err);
    for (uint32_t l = 0; !rc && l < c->n_layers; l++) {
        const tm_dsv41_layer *W = &w->layers[l];
        v41l *L = &g->L[l];
        for (int i = 0; !rc && i < W_N; i++) {
            dw *d = &L->w[i];
            if (!d->n_rows)
                continue;
            if (i < W_EX1 && d->f8) { // the FP8 form as stored (codes, 32 x 32 block scales),
                                      // then the bf16 copy from it on the device (exact)
                const tm_tensor *t = wsrc(W, i);
                rc = tm_cuda_h2d(d->q, t->data, (size_t)(d->n_rows * d->n_in), err);
                if (!rc)
                    rc = tm_cuda_h2d(d->qs, t->scale,
                                     (size_t)(TM_CEIL_DIV(d->n_rows, 32) * (d->n_in / 32)), err);
                if (!rc)
                    rc = tm_k_dsv41_dequant_fp8_32(d->p, d->q, d->qs, (uint32_t)d->n_rows,
                                                   (uint32_t)d->n_in, impl->stream, err);
                continue;
            }
            if (i < W_EX1) {
                rc = up_w(d->p, d->bf16, wsrc(W, i), stage, fb, err);
                continue;
            }
            if (d->mx) { // packed as stored, raw bytes (no host conversion): codes then scales
                const size_t per = (size_t)(d->n_rows / g->E * d->n_in);
                for (uint32_t e = 0; !rc && e < g->E; e++) {
                    const tm_tensor *t = &W->experts[e * 3 + (i - W_EX1)];
                    rc = tm_cuda_h2d(d->q + e * per / 2, t->data, per / 2, err);
                    if (!rc)
                        rc = tm_cuda_h2d(d->qs + e * per / 32, t->scale, per / 32, err);
                }
                continue;
            }
            const size_t per = (size_t)(d->n_rows / g->E * d->n_in) * (d->bf16 ? 2 : 4);
            for (uint32_t e = 0; !rc && e < g->E; e++)
                rc = up_w((char *)d->p + e * per, d->bf16, &W->experts[e * 3 + (i - W_EX1)], stage,
                          fb, err);
        }
        for (int i = 0; !rc && i < V_N; i++)
            if (L->v[i])
                rc = up_f32(L->v[i], vsrc(W, i), fb, err);
        if (!rc && L->e_w) { // the Engram gate's weight: fp32 products, as the CPU engine
            for (size_t k = 0; k < (size_t)g->N * g->D; k++)
                ew[k] =
                    (float)((double)tm_tensor_get_f32(&W->e_q, k) * tm_tensor_get_f32(&W->e_k, k));
            rc = tm_cuda_h2d(L->e_w, ew, (size_t)g->N * g->D * sizeof(float), err);
        }
    }
    if (!rc)
        rc = up_pairs(g, fb, err);
    if (!rc)
        rc = TM_CUDA_CHECK(cudaStreamSynchronize(impl->stream), err);
out:
    tm_free(fb);
    tm_free(stage);
    tm_free(ew);
    return rc;
}

/* Random packed MXFP4 experts (as dsv4.c's): code bytes from the e4m3 fill (every nibble is a
 * valid e2m1 code), scales the power of two near 1 / (3 sqrt(n_in)) (e2m1 codes have an rms of
 * about 3), so the products have the bf16 fill's scale. */
static tm_rc fill_mxfp4(tm_cuda_engine *impl, const dw *d, uint64_t seed, tm_err *err) {
    const size_t n = (size_t)(d->n_rows * d->n_in);
    tm_k_fill_e4m3_args fa = {.p = d->q, .n = n / 2, .seed = seed, .amax = 448.0f};
    tm_rc rc = tm_k_fill_e4m3(&fa, impl->stream, err);
    const int e = 127 + (int)floorf(log2f(1.0f / (3.0f * sqrtf((float)d->n_in))));
    if (!rc)
        rc = TM_CUDA_CHECK(cudaMemsetAsync(d->qs, e, n / 32, impl->stream), err);
    return rc;
}

/* Random FP8 dense linear (as dsv4.c's fill_q8): e4m3 codes over the whole range, block scales
 * the power of two at or above sqrt(3 / n_in) / 448, and the bf16 copy from them (exact). */
static tm_rc fill_fp8(tm_cuda_engine *impl, const dw *d, uint64_t seed, tm_err *err) {
    tm_k_fill_e4m3_args fa = {
        .p = d->q, .n = (size_t)(d->n_rows * d->n_in), .seed = seed, .amax = 448.0f};
    tm_rc rc = tm_k_fill_e4m3(&fa, impl->stream, err);
    const float s0 = sqrtf(3.0f / (float)d->n_in) / 448.0f;
    const size_t sb = (size_t)(TM_CEIL_DIV(d->n_rows, 32) * (d->n_in / 32));
    if (!rc)
        rc = TM_CUDA_CHECK(cudaMemsetAsync(d->qs, 127 + (int)ceilf(log2f(s0)), sb, impl->stream),
                           err);
    if (!rc)
        rc = tm_k_dsv41_dequant_fp8_32(d->p, d->q, d->qs, (uint32_t)d->n_rows, (uint32_t)d->n_in,
                                       impl->stream, err);
    return rc;
}

/* Random weights (benchmarks): linears uniform with std 1/sqrt(n_in), norms about 1. */
static tm_rc fill_random(tm_cuda_engine *impl, uint64_t seed, tm_err *err) {
    v41g *g = impl->arch_state;
    const tm_dsv41_cfg *c = g->c;
    float *fb = tm_malloc(TM_CUDA_UPLOAD_CHUNK * sizeof(float));
    if (!fb)
        return TM_ERR(err, TM_E_NOMEM, "cuda engine: dsv41 staging");
    uint64_t k = seed * 1000003ull;
    tm_rc rc = tm_cuda_fill_bf16(impl, g->embd.p, g->embd.n_rows, g->embd.n_in, k++, err);
    if (!rc)
        rc = tm_cuda_fill_bf16(impl, g->head.p, g->head.n_rows, g->head.n_in, k++, err);
    if (!rc)
        rc = tm_cuda_fill_f32(g->out_norm, g->D, k++, 0.1f, 1.0f, fb, err);
    if (!rc && g->rd)
        rc = tm_cuda_h2d(g->inv_main, c->inv_freq_main, g->rd / 2 * sizeof(float), err);
    if (!rc && g->rd)
        rc = tm_cuda_h2d(g->inv_comp, c->inv_freq_comp, g->rd / 2 * sizeof(float), err);
    if (!rc && g->n_tmap)
        rc = tm_cuda_h2d(g->tmap_d, g->tmap, g->n_tmap * sizeof(int32_t), err);
    for (uint32_t l = 0; !rc && l < c->n_layers; l++) {
        v41l *L = &g->L[l];
        for (int i = 0; !rc && i < W_N; i++) {
            const dw *d = &L->w[i];
            if (!d->n_rows)
                continue;
            if (d->mx)
                rc = fill_mxfp4(impl, d, k++, err);
            else if (d->f8)
                rc = fill_fp8(impl, d, k++, err);
            else if (d->bf16)
                rc = tm_cuda_fill_bf16(impl, d->p, d->n_rows, d->n_in, k++, err);
            else
                rc = tm_cuda_fill_f32(d->p, (size_t)(d->n_rows * d->n_in), k++,
                                      1.0f / sqrtf((float)d->n_in), 0.0f, fb, err);
        }
        // bases and sinks around 0, scales about 0.1, norm weights about 1
        const float sc[V_N] = {0.5f, 0.1f, 0.5f, 0.1f, 0.1f, 0.1f,
                               0.1f, 0.1f, 0.1f, 0.1f, 0.5f, 0.1f};
        const float off[V_N] = {0.0f, 0.0f, 0.0f, 0.0f, 1.0f, 1.0f,
                                1.0f, 1.0f, 1.0f, 1.0f, 0.0f, 0.0f};
        for (int i = 0; !rc && i < V_N; i++)
            if (L->v[i])
                rc = tm_cuda_fill_f32(L->v[i], L->v_n[i], k++, sc[i], off[i], fb, err);
        if (!rc && L->e_w)
            rc = tm_cuda_fill_f32(L->e_w, (size_t)g->N * g->D, k++, 0.1f, 1.0f, fb, err);
    }
    if (!rc)
        rc = up_pairs(g, fb, err);
    if (!rc)
        rc = TM_CUDA_CHECK(cudaStreamSynchronize(impl->stream), err);
    tm_free(fb);
    return rc;
}

/* ---- forward ---- */

/* Ends one op: with TM_DSV41_CUDA_SYNC=1 the stream is synchronized and a fault named by op and
 * layer. */
static tm_rc op_end(tm_cuda_engine *impl, const v41g *g, const char *what, uint32_t l, tm_rc rc,
                    tm_err *err) {
    if (rc || !g->sync_each)
        return rc;
    const cudaError_t e = cudaStreamSynchronize(impl->stream);
    if (e != cudaSuccess)
        return TM_ERR(err, TM_E_CUDA, "cuda engine: dsv41: %s (layer %u): %s", what, l,
                      cudaGetErrorString(e));
    return TM_OK;
}

#define OP(what, l, call)                                                                          \
    do {                                                                                           \
        rc = op_end(impl, g, (what), (l), (call), err);                                            \
        if (rc)                                                                                    \
            return rc;                                                                             \
    } while (0)

static float *field(const tm_cuda_engine *impl, const v41g *g, uint32_t l, sfield f) {
    if (!f.on)
        return NULL;
    float *base = (float *)(f.plane ? impl->v_cache : impl->k_cache);
    return base + (size_t)l * impl->max_pos * g->P + f.off;
}

/* 1 when a decode GEMM of r rows runs w's FP8 codes (tm_k_gemm_fp8, 32 x 32 e8m0 blocks). */
static int dec_fp8(const dw *w, uint64_t row0, uint32_t r, uint32_t n_in, uint32_t n_out) {
    return w->f8 && r <= TM_QUANT_MAX_TOK && row0 % 32 == 0 &&
           tm_k_gemm_fp8_kind_fits(TM_K_FP8_BLOCK32_E8M0, r, n_in, n_out);
}

/* 1 when a GEMM of r rows runs on a decode kernel (FP8 codes or the skinny kernel), else cuBLAS. */
static int dec_fits(const tm_cuda_engine *impl, const dw *w, uint64_t row0, uint32_t r,
                    uint32_t n_in, uint32_t n_out) {
    return dec_fp8(w, row0, r, n_in, n_out) ||
           (r <= impl->sk_max_tok && tm_k_gemm_skinny_fits(r, n_in, n_out));
}

/* A decode GEMM (dec_fits) of the r bf16 rows at x with w's rows row0..: split-K partials
 * ([n][r][n_out], *pr) in q8p (FP8) or sk_part (skinny); dst (r contiguous rows of n_out; NULL:
 * none) takes a single split's product straight. */
static tm_rc dec_gemm(tm_cuda_engine *impl, v41g *g, const dw *w, uint64_t row0, const uint16_t *x,
                      uint32_t r, uint32_t n_in, uint32_t n_out, float *dst, tm_cuda_proj *pr,
                      tm_err *err) {
    if (dec_fp8(w, row0, r, n_in, n_out)) {
        uint32_t kps = 0;
        const uint32_t ns = tm_k_gemm_fp8_splits(n_in, n_out, impl->n_sm, &kps);
        float *part = ns == 1 && dst ? dst : g->q8p;
        TM_ASSERT(part == dst || (size_t)ns * r * n_out <= g->q8p_floats);
        *pr = (tm_cuda_proj){.p = part, .n = ns, .stride = (size_t)r * n_out};
        const tm_k_gemm_fp8_args fa = {.part = part,
                                       .w = w->q + row0 * n_in,
                                       .scale = w->qs + row0 / 32 * (n_in / 32),
                                       .x = x,
                                       .n_tok = r,
                                       .n_in = n_in,
                                       .n_out = n_out,
                                       .n_split = ns,
                                       .k_per_split = kps,
                                       .scale_kind = TM_K_FP8_BLOCK32_E8M0};
        return tm_k_gemm_fp8(&fa, impl->stream, err);
    }
    // with one split the product lands in dst, else in sk_part (which also holds one split's)
    const uint16_t *wp = (const uint16_t *)w->p + row0 * n_in;
    const tm_rc rc = tm_cuda_project(impl, TM_CUDA_ABL_NEVER, NULL, wp, x, r, n_in, n_out,
                                     dst ? dst : impl->sk_part, 0.0f, pr, err);
    if (!rc && pr->n == 1)
        pr->stride = (size_t)r * n_out;
    return rc;
}

/* out's n_tok rows (ldo apart) = the sum of pr's partials (lo: and of rows n_tok + t, the lo
 * halves; add: onto out). */
static tm_rc dec_sum(tm_cuda_engine *impl, const tm_cuda_proj *pr, uint32_t n_tok, uint32_t n_out,
                     float *out, uint32_t ldo, int lo, int add, tm_err *err) {
    const tm_k_dsv41_sum_split_args sa = {.y = out,
                                          .ld_y = ldo,
                                          .part = pr->p,
                                          .stride = pr->stride,
                                          .n_part = pr->n,
                                          .n_tok = n_tok,
                                          .n_col = n_out,
                                          .lo = lo,
                                          .add = add};
    return tm_k_dsv41_sum_split(&sa, impl->stream, err);
}

/* The fast path of lin, on tensor cores with fp32 sums. x's rows go to bf16 in xb: act_quant'ed
 * when w is quantized (exact in bf16), else split into hi = bf16(x) (xb's first n_tok rows) and
 * lo = bf16(x - hi) (the next n_tok rows), run as W.hi + W.lo: the CPU engine's fp32-input
 * product up to ~1e-5 relative and summation order. Decode steps run the decode kernels (FP8
 * codes for a dense FP8 linear, else the skinny kernel on the bf16 weights; a split input as ONE
 * GEMM of 2 x n_tok rows when they fit, so the weights are read once, else a hi pass and a lo
 * pass), their split-K partials (and the hi / lo rows) summed in order into out's rows; larger
 * steps run cuBLAS on the bf16 weights (the lo product with beta 1 onto the hi one). */
static tm_rc lin_fast(tm_cuda_engine *impl, v41g *g, const dw *w, uint64_t row0, const float *x,
                      uint32_t ldx, uint32_t n_tok, uint32_t n_in, float *out, uint32_t ldo,
                      uint32_t n_out, tm_err *err) {
    const int split = !w->aq;
    uint16_t *lo = split ? g->xb + (size_t)n_tok * n_in : NULL;
    const tm_k_dsv41_to_bf16_args ca = {
        .y = g->xb, .lo = lo, .x = x, .ldx = ldx, .n = n_in, .n_tok = n_tok, .aq = w->aq};
    tm_rc rc = tm_k_dsv41_to_bf16(&ca, impl->stream, err);
    if (rc)
        return rc;
    tm_cuda_proj pr;
    if (split && dec_fits(impl, w, row0, 2 * n_tok, n_in, n_out)) { // hi and lo rows at once
        rc = dec_gemm(impl, g, w, row0, g->xb, 2 * n_tok, n_in, n_out, NULL, &pr, err);
        return rc ? rc : dec_sum(impl, &pr, n_tok, n_out, out, ldo, 1, 0, err);
    }
    if (dec_fits(impl, w, row0, n_tok, n_in, n_out)) {
        float *dst = !split && ldo == n_out ? out : NULL;
        rc = dec_gemm(impl, g, w, row0, g->xb, n_tok, n_in, n_out, dst, &pr, err);
        if (rc || pr.p == out)
            return rc;
        rc = dec_sum(impl, &pr, n_tok, n_out, out, ldo, 0, 0, err);
        if (!rc && split) // the lo pass, onto the hi sums
            rc = dec_gemm(impl, g, w, row0, lo, n_tok, n_in, n_out, NULL, &pr, err);
        return rc || !split ? rc : dec_sum(impl, &pr, n_tok, n_out, out, ldo, 0, 1, err);
    }
    const uint16_t *wp = (const uint16_t *)w->p + row0 * n_in;
    rc = tm_cuda_gemm(impl, "dsv41 linear", wp, g->xb, n_in, out, 1, ldo, n_tok, n_in, n_out, 0.0f,
                      err);
    if (!rc && split)
        rc = tm_cuda_gemm(impl, "dsv41 linear lo", wp, lo, n_in, out, 1, ldo, n_tok, n_in, n_out,
                          1.0f, err);
    return rc;
}

/* out[t][o] = x[t] . w[row0 + o] (out's rows ldo floats apart). The fast mode runs lin_fast on
 * bf16 weights (not the router); else the plain kernel, x act_quant'ed first (into xq) when w is
 * quantized. */
static tm_rc lin(tm_cuda_engine *impl, v41g *g, const dw *w, uint64_t row0, const float *x,
                 uint32_t ldx, uint32_t n_tok, uint32_t n_in, float *out, uint32_t ldo,
                 uint32_t n_out, tm_err *err) {
    if (!n_tok || !n_out)
        return TM_OK;
    TM_ASSERT(w->p && w->n_in == n_in && n_in <= g->max_in);
    if (fast_lin(g, w))
        return lin_fast(impl, g, w, row0, x, ldx, n_tok, n_in, out, ldo, n_out, err);
    tm_rc rc;
    if (w->aq) {
        rc = TM_CUDA_CHECK(cudaMemcpy2DAsync(g->xq, (size_t)n_in * 4, x, (size_t)ldx * 4,
                                             (size_t)n_in * 4, n_tok, cudaMemcpyDeviceToDevice,
                                             impl->stream),
                           err);
        if (!rc)
            rc = tm_k_dsv41_act_quant(g->xq, (size_t)n_tok * n_in, impl->stream, err);
        if (rc)
            return rc;
        x = g->xq;
        ldx = n_in;
    }
    const tm_k_dsv41_linear_args a = {.out = out,
                                      .x = x,
                                      .w = w->p,
                                      .row0 = row0,
                                      .ldo = ldo,
                                      .ldx = ldx,
                                      .n_tok = n_tok,
                                      .n_in = n_in,
                                      .n_out = n_out,
                                      .x_div = 1,
                                      .w_bf16 = w->bf16};
    return tm_k_dsv41_linear(&a, impl->stream, err);
}

/* Routed expert matrix w (E stacked [n_out][n_in]) on the step's T*K (token, expert) rows: row p
 * reads x row p / x_div (act_quant'ed first when w is quantized). Packed MXFP4 (the fast mode):
 * the n_x rows of x act_quant'ed to bf16, then tm_k_moe_mxfp4 over the pairs (expert sel[p], x row
 * pr_div[p] = p / K or pr_id[p] = p), in chunks of TM_MOE_MAX_PAIRS, one split: out row p is the
 * pair's whole product. sorted (packed only): the pairs in expert order (layer_moe's
 * tm_k_dsv41_pair_sort), out row q the sorted pair q's. */
static tm_rc lin_experts(tm_cuda_engine *impl, v41g *g, const dw *w, const float *x, uint32_t x_div,
                         uint32_t n_x, uint32_t n_in, float *out, uint32_t n_out, uint32_t T,
                         int sorted, tm_err *err) {
    if (w->mx) {
        TM_ASSERT(w->aq && (x_div == g->K || x_div == 1) && n_in % 32 == 0);
        TM_ASSERT((size_t)n_x * n_in <= (size_t)g->T * TM_MAX(g->max_in, g->K * g->I));
        const tm_k_dsv41_to_bf16_args ca = {
            .y = g->xb, .x = x, .ldx = n_in, .n = n_in, .n_tok = n_x, .aq = 1};
        tm_rc rc = tm_k_dsv41_to_bf16(&ca, impl->stream, err);
        const uint32_t P = T * g->K, kps = TM_CEIL_DIV(n_in, 128u) * 128;
        // sorted: pair q is the sorted pair (its expert sp_exp[q], its token's row sp_prow[q]; for
        // w2 row q of x, the sorted w1 / w3 outputs)
        const uint32_t *prow = x_div == 1 ? g->pr_id : sorted ? g->sp_prow : g->pr_div;
        const int32_t *pexp = sorted ? g->sp_exp : (const int32_t *)g->sel;
        for (uint32_t c0 = 0; !rc && c0 < P; c0 += TM_MOE_MAX_PAIRS) {
            const uint32_t n = TM_MIN((uint32_t)TM_MOE_MAX_PAIRS, P - c0);
            const tm_k_moe_mxfp4_args ma = {.part = out + (size_t)c0 * n_out,
                                            .w = w->q,
                                            .scale = w->qs,
                                            .x = g->xb,
                                            .pair_expert = pexp + c0,
                                            .pair_row = prow + c0,
                                            .n_pair = n,
                                            .n_expert = g->E,
                                            .max_pair_per_expert = TM_MIN(T, n),
                                            .n_in = n_in,
                                            .n_out = n_out,
                                            .n_split = 1,
                                            .k_per_split = kps};
            rc = tm_k_moe_mxfp4(&ma, impl->stream, err);
        }
        return rc;
    }
    if (w->aq) {
        TM_ASSERT((size_t)n_x * n_in <= (size_t)g->T * TM_MAX(g->max_in, g->K * g->I));
        tm_rc rc = TM_CUDA_CHECK(cudaMemcpyAsync(g->xq, x, (size_t)n_x * n_in * 4,
                                                 cudaMemcpyDeviceToDevice, impl->stream),
                                 err);
        if (!rc)
            rc = tm_k_dsv41_act_quant(g->xq, (size_t)n_x * n_in, impl->stream, err);
        if (rc)
            return rc;
        x = g->xq;
    }
    const tm_k_dsv41_linear_args a = {.out = out,
                                      .x = x,
                                      .w = w->p,
                                      .sel = g->sel,
                                      .w_expert = (size_t)n_out * n_in,
                                      .ldo = n_out,
                                      .ldx = n_in,
                                      .n_tok = T * g->K,
                                      .n_in = n_in,
                                      .n_out = n_out,
                                      .x_div = x_div,
                                      .w_bf16 = w->bf16};
    return tm_k_dsv41_linear(&a, impl->stream, err);
}

static tm_rc hc_mixes(tm_cuda_engine *impl, v41g *g, uint32_t l, int ffn, uint32_t T, float *pre,
                      tm_err *err) {
    const v41l *L = &g->L[l];
    const uint32_t ND = g->N * g->D;
    tm_rc rc;
    OP("hc fn", l,
       lin(impl, g, &L->w[ffn ? W_HC_FFN : W_HC_ATTN], 0, g->s, ND, T, ND, g->mixes, g->mix, g->mix,
           err));
    const tm_k_dsv41_hc_split_args a = {.mixes = g->mixes,
                                        .streams = g->s,
                                        .scale = L->v[ffn ? V_HC_FFN_SCALE : V_HC_ATTN_SCALE],
                                        .base = L->v[ffn ? V_HC_FFN_BASE : V_HC_ATTN_BASE],
                                        .pre = pre,
                                        .post = g->post,
                                        .comb = g->comb,
                                        .n_tok = T,
                                        .N = g->N,
                                        .D = g->D,
                                        .iters = g->c->hc_sinkhorn_iters,
                                        .norm_eps = g->c->norm_eps,
                                        .hc_eps = g->c->hc_eps};
    OP("hc split", l, tm_k_dsv41_hc_split(&a, impl->stream, err));
    return TM_OK;
}

static tm_rc rope(tm_cuda_engine *impl, float *x, uint32_t T, uint32_t n_head, uint32_t hd,
                  uint32_t rd, const uint32_t *pos, uint32_t lat_r, const float *inv, tm_err *err) {
    const tm_k_dsv41_rope_args a = {.x = x,
                                    .pos = pos,
                                    .inv_freq = inv,
                                    .n_tok = T,
                                    .n_head = n_head,
                                    .tok_stride = n_head * hd,
                                    .head_stride = hd,
                                    .hd = hd,
                                    .rd = rd,
                                    .lat_r = lat_r,
                                    .sign = 1.0f};
    return tm_k_dsv41_rope(&a, impl->stream, err);
}

static tm_rc store(tm_cuda_engine *impl, float *fieldp, uint32_t P, const float *src, uint32_t lds,
                   uint32_t n, uint32_t T, uint32_t r, const tm_k_dsv41_seqs *q, tm_err *err) {
    const tm_k_dsv41_store_args a = {
        .field = fieldp, .src = src, .fld = P, .lds = lds, .n = n, .n_tok = T, .r = r};
    return tm_k_dsv41_store(&a, q, impl->stream, err);
}

/* The compressor of kv source l: latents of the groups this step closes, their index keys (index
 * sources) and compressed rows into the state. */
static tm_rc compressor(tm_cuda_engine *impl, v41g *g, uint32_t l, uint32_t T,
                        const tm_k_dsv41_seqs *q, const uint32_t *pos, tm_err *err) {
    const tm_dsv41_cfg *c = g->c;
    const v41l *L = &g->L[l];
    const uint32_t hd = g->hd, r = c->ratio[l], P = g->P;
    cudaStream_t s = impl->stream;
    tm_rc rc;
    OP("compressor wkv", l,
       lin(impl, g, &L->w[W_C_WKV], 0, g->x, g->D, T, g->D, g->ckv, hd, hd, err));
    float *tail = field(impl, g, l, L->f_tail);
    if (r > 1) {
        OP("compressor wgate", l,
           lin(impl, g, &L->w[W_C_WGATE], 0, g->x, g->D, T, g->D, g->cgate, hd, hd, err));
        OP("store tail kv", l, store(impl, tail, P, g->ckv, hd, hd, T, 0, q, err));
        OP("store tail gate", l, store(impl, tail + hd, P, g->cgate, hd, hd, T, 0, q, err));
    }
    OP("latent", l, tm_k_dsv41_latent(g->lat, g->ckv, tail, P, hd, r, T, q, s, err));
    OP("compressor norm", l,
       tm_k_dsv41_rmsnorm(g->lat, hd, L->v[V_C_NORM], T, hd, c->norm_eps, s, err));
    if (c->index_source[l]) { // this layer owns the index keys
        const uint32_t di = g->di;
        OP("indexer wk", l, lin(impl, g, &L->w[W_I_WK], 0, g->lat, hd, T, hd, g->lk, di, di, err));
        OP("indexer k_norm", l,
           tm_k_dsv41_rmsnorm(g->lk, di, L->v[V_I_K_NORM], T, di, c->norm_eps, s, err));
        OP("indexer key rope", l, rope(impl, g->lk, T, 1, di, g->rd, pos, r, g->inv_comp, err));
        OP("indexer key fp4", l, tm_k_dsv41_fp4_act_quant(g->lk, (size_t)T * di, 32, 0, s, err));
        OP("store index keys", l,
           store(impl, field(impl, g, l, L->f_ikey), P, g->lk, di, di, T, r, q, err));
    }
    OP("latent rope", l, rope(impl, g->lat, T, 1, hd, g->rd, pos, r, g->inv_comp, err));
    OP("latent fp4", l, tm_k_dsv41_fp4_act_quant(g->lat, (size_t)T * hd, 16, 1, s, err));
    OP("store compressed", l,
       store(impl, field(impl, g, l, L->f_comp), P, g->lat, hd, hd, T, r, q, err));
    return TM_OK;
}

/* The indexer of index source l: scores over the reachable compressed positions, the two-level
 * selection, the picks (which later compressed layers without an indexer reuse). */
static tm_rc indexer(tm_cuda_engine *impl, v41g *g, uint32_t l, uint32_t T,
                     const tm_k_dsv41_seqs *q, const uint32_t *pos, tm_err *err) {
    const tm_dsv41_cfg *c = g->c;
    const v41l *L = &g->L[l];
    const uint32_t Hi = g->Hi, di = g->di, r = c->ratio[l];
    cudaStream_t s = impl->stream;
    tm_rc rc;
    OP("indexer wq_b", l,
       lin(impl, g, &L->w[W_I_WQ_B], 0, g->qr, g->qlr, T, g->qlr, g->iq, Hi * di, Hi * di, err));
    OP("indexer weights_proj", l,
       lin(impl, g, &L->w[W_I_WPROJ], 0, g->x, g->D, T, g->D, g->iw, Hi, Hi, err));
    OP("indexer q rope", l, rope(impl, g->iq, T, Hi, di, g->rd, pos, 0, g->inv_comp, err));
    OP("indexer q fp4", l, tm_k_dsv41_fp4_act_quant(g->iq, (size_t)T * Hi * di, 32, 0, s, err));
    const int16_t kf = c->key_from[l];
    TM_ASSERT(kf >= 0);
    const int32_t cs = c->candidate_source_layer;
    const uint32_t mode = cs >= 0 && (uint32_t)cs == l  ? TM_DSV41_SEL_SOURCE
                          : cs >= 0 && (uint32_t)cs < l ? TM_DSV41_SEL_CONSUMER
                                                        : TM_DSV41_SEL_PLAIN;
    // scores and selection in chunks of sc_tok tokens (the score rows hold that many)
    for (uint32_t t0 = 0; t0 < T; t0 += g->sc_tok) {
        const uint32_t n = TM_MIN(g->sc_tok, T - t0);
        const tm_k_dsv41_seqs qc = {.pos = q->pos + t0,
                                    .tok_seq = q->tok_seq + t0,
                                    .seq_bt = q->seq_bt,
                                    .block_tables = q->block_tables,
                                    .bs = q->bs};
        const tm_k_dsv41_iscore_args sa = {
            .score = g->isc,
            .lens = g->lens + t0,
            .q = g->iq + (size_t)t0 * Hi * di,
            .w = g->iw + (size_t)t0 * Hi,
            .key_field = field(impl, g, (uint32_t)kf, g->L[kf].f_ikey),
            .ld = g->ld_sc,
            .iscale = g->iscale,
            .kld = g->P,
            .Hi = Hi,
            .di = di,
            .r = r,
            .n_tok = n};
        OP("indexer scores", l, tm_k_dsv41_index_scores(&sa, &qc, s, err));
        const tm_k_dsv41_select_args ka = {.score = g->isc,
                                           .bsc = g->bsc,
                                           .lens = g->lens + t0,
                                           .cand = g->cand + (size_t)t0 * g->ctop,
                                           .n_cand = g->n_cand + t0,
                                           .pick = g->pick + (size_t)t0 * g->topk,
                                           .n_pick = g->n_pick + t0,
                                           .ld = g->ld_sc,
                                           .n_tok = n,
                                           .mode = mode,
                                           .cb = g->cb,
                                           .ctop = g->ctop,
                                           .topk = g->topk};
        OP("indexer select", l, tm_k_dsv41_select(&ka, s, err));
    }
    return TM_OK;
}

static tm_rc layer_attn(tm_cuda_engine *impl, v41g *g, uint32_t l, uint32_t T,
                        const tm_k_dsv41_seqs *q, const uint32_t *pos, tm_err *err) {
    const tm_dsv41_cfg *c = g->c;
    const v41l *L = &g->L[l];
    const uint32_t hd = g->hd, rd = g->rd, r = c->ratio[l], H = g->H, D = g->D;
    const float *inv = r ? g->inv_comp : g->inv_main;
    cudaStream_t s = impl->stream;
    tm_rc rc;
    // q: low rank, RoPE
    OP("wq_a", l, lin(impl, g, &L->w[W_WQ_A], 0, g->x, D, T, D, g->qr, g->qlr, g->qlr, err));
    OP("q_norm", l,
       tm_k_dsv41_rmsnorm(g->qr, g->qlr, L->v[V_Q_NORM], T, g->qlr, c->norm_eps, s, err));
    OP("wq_b", l,
       lin(impl, g, &L->w[W_WQ_B], 0, g->qr, g->qlr, T, g->qlr, g->q, H * hd, H * hd, err));
    OP("q rope", l, rope(impl, g->q, T, H, hd, rd, pos, 0, inv, err));
    // window KV: rotated, act_quant'ed, stored at the token's slot
    OP("wkv", l, lin(impl, g, &L->w[W_WKV], 0, g->x, D, T, D, g->kv, hd, hd, err));
    OP("kv_norm", l, tm_k_dsv41_rmsnorm(g->kv, hd, L->v[V_KV_NORM], T, hd, c->norm_eps, s, err));
    OP("kv rope", l, rope(impl, g->kv, T, 1, hd, rd, pos, 0, inv, err));
    OP("kv act_quant", l, tm_k_dsv41_act_quant(g->kv, (size_t)T * hd, s, err));
    OP("store window", l,
       store(impl, field(impl, g, l, L->f_win), g->P, g->kv, hd, hd, T, 0, q, err));
    if (r && c->kv_source[l]) {
        rc = compressor(impl, g, l, T, q, pos, err);
        if (rc)
            return rc;
    }
    if (r && c->index_source[l]) {
        rc = indexer(impl, g, l, T, q, pos, err);
        if (rc)
            return rc;
    }
    const int16_t kvf = r ? c->kv_from[l] : -1;
    TM_ASSERT(!r || kvf >= 0);
    const tm_k_dsv41_attn_args aa = {.o = g->o,
                                     .q = g->q,
                                     .win = field(impl, g, l, L->f_win),
                                     .comp = r ? field(impl, g, (uint32_t)kvf, g->L[kvf].f_comp)
                                               : NULL,
                                     .pick = g->pick,
                                     .n_pick = g->n_pick,
                                     .sinks = L->v[V_SINK],
                                     .inv_freq = inv,
                                     .wld = g->P,
                                     .cld = g->P,
                                     .H = H,
                                     .hd = hd,
                                     .rd = rd,
                                     .r = r,
                                     .window = c->window_size,
                                     .topk = g->topk,
                                     .n_tok = T};
    OP("sparse attention", l, tm_k_dsv41_attn(&aa, q, s, err));
    // grouped wo_a (block-diagonal, a bf16 einsum in the reference: no act_quant), then wo_b
    dw woa = L->w[W_WO_A];
    woa.aq = 0;
    for (uint32_t gi = 0; gi < g->G; gi++)
        OP("wo_a", l,
           lin(impl, g, &woa, (uint64_t)gi * g->olr, g->o + (size_t)gi * g->ing, H * hd, T, g->ing,
               g->oa + (size_t)gi * g->olr, g->G * g->olr, g->olr, err));
    OP("wo_b", l,
       lin(impl, g, &L->w[W_WO_B], 0, g->oa, g->G * g->olr, T, g->G * g->olr, g->y, D, D, err));
    return TM_OK;
}

static tm_rc layer_moe(tm_cuda_engine *impl, v41g *g, uint32_t l, uint32_t T, tm_err *err) {
    const tm_dsv41_cfg *c = g->c;
    const v41l *L = &g->L[l];
    const uint32_t D = g->D, I = g->I, K = g->K;
    cudaStream_t s = impl->stream;
    tm_rc rc;
    OP("router", l, lin(impl, g, &L->w[W_GATE], 0, g->x, D, T, D, g->rl, g->E, g->E, err));
    const tm_k_dsv41_route_args ra = {.logits = g->rl,
                                      .bias = L->v[V_GATE_BIAS],
                                      .sel = g->sel,
                                      .weight = g->selw,
                                      .n_tok = T,
                                      .E = g->E,
                                      .K = K,
                                      .score_func = c->score_func,
                                      .norm_topk = c->norm_topk_prob,
                                      .gate_temp = c->gate_temp,
                                      .route_scale = c->route_scale};
    OP("route", l, tm_k_dsv41_route(&ra, s, err));
    // packed experts over more pairs than one MoE launch: the pairs in expert order; eg, eu and
    // eo then hold the sorted pairs' rows (sp_w their weights, sp_inv each pair's row)
    const int sorted = L->w[W_EX1].mx && L->w[W_EX3].mx && L->w[W_EX2].mx && T * K > g->sort_min;
    if (sorted) {
        const tm_k_dsv41_pair_sort_args pa = {.sel = g->sel,
                                              .w = g->selw,
                                              .perm = g->sp_perm,
                                              .prow = g->sp_prow,
                                              .inv = g->sp_inv,
                                              .sexp = g->sp_exp,
                                              .wq = g->sp_w,
                                              .n_pair = T * K,
                                              .n_expert = g->E,
                                              .K = K};
        OP("moe pair sort", l, tm_k_dsv41_pair_sort(&pa, s, err));
    }
    OP("experts w1", l,
       lin_experts(impl, g, &L->w[W_EX1], g->x, K, T, D, g->eg, I, T, sorted, err));
    OP("experts w3", l,
       lin_experts(impl, g, &L->w[W_EX3], g->x, K, T, D, g->eu, I, T, sorted, err));
    OP("experts swiglu", l,
       tm_k_dsv41_swiglu(g->eg, g->eu, T * K, I, c->swiglu_limit, sorted ? g->sp_w : g->selw, s,
                         err));
    OP("experts w2", l,
       lin_experts(impl, g, &L->w[W_EX2], g->eg, 1, T * K, I, g->eo, D, T, sorted, err));
    OP("shared w1", l, lin(impl, g, &L->w[W_SH1], 0, g->x, D, T, D, g->sh_g, I, I, err));
    OP("shared w3", l, lin(impl, g, &L->w[W_SH3], 0, g->x, D, T, D, g->sh_u, I, I, err));
    OP("shared swiglu", l,
       tm_k_dsv41_swiglu(g->sh_g, g->sh_u, T, I, c->swiglu_limit, NULL, s, err));
    OP("shared w2", l, lin(impl, g, &L->w[W_SH2], 0, g->sh_g, I, T, I, g->sh_o, D, D, err));
    OP("moe combine", l,
       tm_k_dsv41_moe_combine(g->y, g->eo, sorted ? g->sp_inv : NULL, g->sel, g->sh_o, T, K, D, s,
                              err));
    return TM_OK;
}

/* Host pointer of a step metadata array (the runtime's meta_h mirrors meta_d). */
static const uint32_t *host_meta(const tm_cuda_engine *impl, const uint32_t *dev) {
    return impl->meta_h + (dev - impl->meta_d);
}

/* Engram, before the layers: the step's compressed ids into the state, every token's hash ids
 * (the ids before each chunk read back from the state), every table's rows requested. */
static tm_rc engram_begin(tm_cuda_engine *impl, v41g *g, const tm_cuda_step *st, tm_err *err) {
    const tm_dsv41_cfg *c = g->c;
    const uint32_t T = st->n_tok, ng = c->engram_max_ngram_size, nc = g->n_cols;
    const uint32_t *tok = host_meta(impl, st->tokens), *pos = host_meta(impl, st->pos);
    const uint32_t *tseq = host_meta(impl, st->tok_seq), *sbt = host_meta(impl, st->seq_bt);
    const uint32_t *bt = host_meta(impl, st->block_tables), bs = impl->eng.opts.block_size;
    for (uint32_t t = 0; t < T; t++) // before the kernel reads the map with them
        if (tok[t] >= g->n_tmap)
            return TM_ERR(err, TM_E_INVAL,
                          "cuda engine: dsv41: token id %u has no entry in the Engram compressed "
                          "token map (%u entries)",
                          tok[t], g->n_tmap);
    float *cidf = field(impl, g, 0, g->L[0].f_cid);
    tm_rc rc = tm_k_dsv41_cid_store(cidf, g->P, st->tokens, g->tmap_d, st->slot, T, impl->stream,
                                    err);
    // the ng - 1 ids before each chunk's first token, from the state (earlier steps)
    for (uint32_t t = 0; !rc && t < T; t++) {
        if (t > 0 && tseq[t - 1] == tseq[t])
            continue;
        for (uint32_t k = 1; !rc && k < ng && k <= pos[t]; k++) {
            const uint32_t p = pos[t] - k;
            const size_t slot = (size_t)bt[sbt[tseq[t]] + p / bs] * bs + p % bs;
            rc = TM_CUDA_CHECK(cudaMemcpyAsync(&g->prev_h[tseq[t] * TM_ENGRAM_MAX_NGRAM + k],
                                               cidf + slot * g->P, 4, cudaMemcpyDeviceToHost,
                                               impl->stream),
                               err);
        }
    }
    if (!rc)
        rc = TM_CUDA_CHECK(cudaStreamSynchronize(impl->stream), err);
    if (rc)
        return rc;
    uint32_t t0 = 0; // the chunk's first token
    for (uint32_t t = 0; t < T; t++) {
        if (t == 0 || tseq[t - 1] != tseq[t])
            t0 = t;
        int64_t ctx[TM_ENGRAM_MAX_NGRAM];
        for (uint32_t k = 0; k < ng; k++) {
            if (k > pos[t])
                ctx[k] = TM_ENGRAM_NONE;
            else if (k <= t - t0)
                ctx[k] = g->tmap[tok[t - k]];
            else // before the chunk: k - (t - t0) back from its first token
                ctx[k] = g->prev_h[tseq[t] * TM_ENGRAM_MAX_NGRAM + (k - (t - t0))];
        }
        tm_engram_hash_ids(g->lay, ctx, g->hid + (size_t)t * c->n_engram * nc);
    }
    for (uint32_t k = 0; k < c->n_engram; k++) {
        uint64_t *rows = g->hrows + (size_t)k * g->T * nc;
        for (uint32_t t = 0; t < T; t++)
            for (uint32_t j = 0; j < nc; j++)
                rows[(size_t)t * nc + j] = (uint64_t)g->hid[((size_t)t * c->n_engram + k) * nc + j];
        if (!g->skip_rows)
            tm_dsv41_engram_stage_prefetch(g->stage, k, rows, (size_t)T * nc);
    }
    return TM_OK;
}

/* Engram layer l, host part (outside any graph): its rows staged onto the GPU (host reads,
 * dequant, the copy on the stage's stream), then the compute stream waits for the copy. The
 * device rows stay at the slot's fixed address (g->erows). With skip_rows: nothing (zeros). */
static tm_rc engram_rows(tm_cuda_engine *impl, v41g *g, uint32_t l, uint32_t T, tm_err *err) {
    const uint32_t slot = (uint32_t)g->c->engram_slot[l], nc = g->n_cols;
    const uint64_t *rows = g->hrows + (size_t)slot * g->T * nc;
    tm_rc rc;
    if (g->skip_rows)
        return TM_OK;
    OP("engram upload", l, tm_dsv41_engram_stage_upload(g->stage, slot, rows, (size_t)T * nc, err));
    OP("engram wait", l,
       tm_dsv41_engram_stage_wait(g->stage, slot, impl->stream, &g->erows[slot], err));
    return TM_OK;
}

/* Engram layer l, kernels: wkv of the staged rows into one key per stream and a value, the gated
 * add into the streams. */
static tm_rc engram_layer(tm_cuda_engine *impl, v41g *g, uint32_t l, uint32_t T, tm_err *err) {
    const tm_dsv41_cfg *c = g->c;
    const uint32_t slot = (uint32_t)c->engram_slot[l], nc = g->n_cols, w_kv = (g->N + 1) * g->D;
    tm_rc rc;
    OP("engram wkv", l,
       lin(impl, g, &g->L[l].w[W_E_WKV], 0, g->erows[slot], nc * g->ehd, T, nc * g->ehd, g->ekv,
           w_kv, w_kv, err));
    const tm_k_dsv41_engram_gate_args ga = {.h = g->s,
                                            .kv = g->ekv,
                                            .w = g->L[l].e_w,
                                            .n_tok = T,
                                            .n_hc = g->N,
                                            .dim = g->D,
                                            .eps = c->norm_eps};
    OP("engram gate", l, tm_k_dsv41_engram_gate(&ga, impl->stream, err));
    return TM_OK;
}

/* Layer l after its Engram op: attention and MoE with their hyper-connection mixes. */
static tm_rc layer(tm_cuda_engine *impl, v41g *g, uint32_t l, uint32_t T, const tm_k_dsv41_seqs *q,
                   const uint32_t *pos, tm_err *err) {
    const tm_dsv41_cfg *c = g->c;
    const v41l *L = &g->L[l];
    const uint32_t N = g->N, D = g->D;
    cudaStream_t s = impl->stream;
    // attention takes the previous sublayer's pre mix; its own mixes give its post / comb and
    // the MoE's pre mix
    tm_rc rc = hc_mixes(impl, g, l, 0, T, g->apre, err);
    if (rc)
        return rc;
    OP("attn collapse", l,
       tm_k_dsv41_collapse_norm(g->x, g->s, g->pre, NULL, T, N, D, L->v[V_ATTN_NORM], c->norm_eps,
                                s, err));
    rc = layer_attn(impl, g, l, T, q, pos, err);
    if (rc)
        return rc;
    OP("attn expand", l, tm_k_dsv41_hc_expand(g->s, g->y, g->post, g->comb, T, N, D, s, err));
    rc = hc_mixes(impl, g, l, 1, T, g->pre, err);
    if (rc)
        return rc;
    OP("ffn collapse", l,
       tm_k_dsv41_collapse_norm(g->x, g->s, g->apre, NULL, T, N, D, L->v[V_FFN_NORM], c->norm_eps,
                                s, err));
    rc = layer_moe(impl, g, l, T, err);
    if (rc)
        return rc;
    OP("ffn expand", l, tm_k_dsv41_hc_expand(g->s, g->y, g->post, g->comb, T, N, D, s, err));
    return TM_OK;
}

/* The kernels of segment k of a step (device work only: no host reads, no syncs but
 * TM_DSV41_CUDA_SYNC's, which forces eager steps), so that a decode step's segment can be a CUDA
 * graph: every argument is a function of (T, n_want) and of fixed device addresses (the step's
 * metadata, the state, the activations, the slots' Engram rows). Segment 0: the embedding and the
 * layers before the first Engram layer; segment k >= 1: Engram layer seg_l[k]'s Engram kernels
 * and the layers up to the next Engram layer; the last one ends with the head. */
static tm_rc segment(tm_cuda_engine *impl, v41g *g, const tm_cuda_step *st, uint32_t k,
                     tm_err *err) {
    const tm_dsv41_cfg *c = g->c;
    const uint32_t T = st->n_tok, N = g->N, D = g->D, l0 = g->seg_l[k];
    const uint32_t l1 = k + 1 < g->n_seg ? g->seg_l[k + 1] : c->n_layers;
    cudaStream_t s = impl->stream;
    const tm_k_dsv41_seqs q = {.pos = st->pos,
                               .tok_seq = st->tok_seq,
                               .seq_bt = st->seq_bt,
                               .block_tables = st->block_tables,
                               .bs = impl->eng.opts.block_size};
    tm_rc rc;
    if (k == 0) {
        OP("embed", 0,
           tm_k_dsv41_embed(g->x, g->s, g->pre, g->embd.p, g->embd.bf16, st->tokens, T, D, N, s,
                            err));
    } else {
        rc = engram_layer(impl, g, l0, T, err);
        if (rc)
            return rc;
    }
    for (uint32_t l = l0; l < l1; l++) {
        rc = layer(impl, g, l, T, &q, st->pos, err);
        if (rc)
            return rc;
    }
    if (k + 1 < g->n_seg || !st->n_want)
        return TM_OK;
    // the head: the last FFN's pre mix collapses the wanted rows' streams, norm, head
    OP("head collapse", c->n_layers,
       tm_k_dsv41_collapse_norm(g->x, g->s, g->pre, st->want_row, st->n_want, N, D, g->out_norm,
                                c->norm_eps, s, err));
    OP("head", c->n_layers,
       lin(impl, g, &g->head, 0, g->x, D, st->n_want, D, impl->logits, impl->v_stride,
           c->vocab_size, err));
    return TM_OK;
}

/* Segment k of a pure decode step as its CUDA graph (T = n_tok sequences), captured on first
 * use, then replayed. */
static tm_rc segment_graph(tm_cuda_engine *impl, v41g *g, const tm_cuda_step *st, uint32_t k,
                           tm_err *err) {
    cudaGraphExec_t *x = &g->gx[(size_t)st->n_tok * g->n_seg + k];
    if (!*x) {
        cudaGraph_t gr = NULL;
        tm_rc rc = TM_CUDA_CHECK(
            cudaStreamBeginCapture(impl->stream, cudaStreamCaptureModeThreadLocal), err);
        if (rc)
            return rc;
        rc = segment(impl, g, st, k, err);
        const cudaError_t e = cudaStreamEndCapture(impl->stream, &gr);
        if (!rc)
            rc = TM_CUDA_CHECK(e, err);
        if (!rc)
            rc = TM_CUDA_CHECK(cudaGraphInstantiate(x, gr, 0), err);
        if (gr)
            cudaGraphDestroy(gr);
        if (rc) {
            *x = NULL;
            return rc;
        }
    }
    return TM_CUDA_CHECK(cudaGraphLaunch(*x, impl->stream), err);
}

/* A step: the host checks, Engram's host work (ids, hashes, every table's reads issued), then per
 * segment: the rows of its Engram layer staged (host), the segment's kernels (eager, or its graph
 * on pure decode steps with graphs on). The host reads the rows of Engram layer k while the
 * segments before it run. */
static tm_rc forward(tm_cuda_engine *impl, const tm_cuda_step *st, tm_err *err) {
    v41g *g = impl->arch_state;
    const tm_dsv41_cfg *c = g->c;
    const uint32_t T = st->n_tok;
    tm_rc rc;
    if (!T)
        return TM_OK;
    TM_ASSERT(T <= g->T && st->n_want <= g->T);
    const uint32_t *pos_h = host_meta(impl, st->pos);
    // as the CPU engine: positions below max_seq_len; also below n_ctx (the indexer's score rows
    // hold sc_pos positions, init)
    for (uint32_t t = 0; t < T; t++)
        if (pos_h[t] >= g->sc_pos)
            return TM_ERR(err, TM_E_INVAL,
                          "cuda engine: dsv41: position %u is beyond the context (%llu: the least "
                          "of max_seq_len %u, n_ctx %u and the KV pool)",
                          pos_h[t], (unsigned long long)g->sc_pos, c->max_seq_len, impl->cfg.n_ctx);
    if (c->n_engram) {
        rc = engram_begin(impl, g, st, err);
        if (rc)
            return rc;
    }
    // TM_DSV41_CUDA_SYNC synchronizes inside the ops: never captured
    const int graph = st->graph && !g->sync_each;
    TM_ASSERT(!graph || (T == st->n_seq && T == st->n_want && T <= g->S));
    for (uint32_t k = 0; k < g->n_seg; k++) {
        rc = k > 0 ? engram_rows(impl, g, g->seg_l[k], T, err) : TM_OK;
        if (!rc)
            rc = graph ? segment_graph(impl, g, st, k, err) : segment(impl, g, st, k, err);
        if (rc)
            return rc;
    }
    return TM_OK;
}

const tm_cuda_arch tm_cuda_arch_dsv41 = {
    .name = "deepseek_v41",
    .own_graphs = 1,
    .check_cfg = check_cfg,
    .check_weights = check_weights,
    .shard_cfg = shard_cfg,
    .kv_dim = kv_dim,
    .prefill_tiles = prefill_tiles,
    .init = init,
    .fini = fini,
    .skinny_floats = skinny_floats,
    .carve_weights = carve_weights,
    .carve_acts = carve_acts,
    .upload = upload,
    .fill_random = fill_random,
    .forward = forward,
};
