/* runner/engine/cuda/dsv4.c - DeepSeek-V4 on the CUDA engine (tm_cuda_arch_dsv4, arch.h): the
 * forward pass of the CPU engine (runner/engine/cpu/dsv4.c; math in docs/deepseek_v4.md) with
 * the projections on cuBLAS (bf16 in, fp32 accumulate) and the rest in kernels/dsv4.h.
 *
 * A step stacks the tokens of every sequence (prefill chunks and decodes mixed) into [T][...]
 * rows. Per layer: hyper-connection pre-mix (fp32 streams, Sinkhorn) -> h (bf16); q_a, RMSNorm,
 * q_b, per-head RMS + RoPE (fp32 q); kv_proj + norm + RoPE into the state; compressor (and
 * indexer) inputs into the state; the windows the step closes are compressed; the indexer picks
 * its top-k; attention over the window and the compressed rows (sinks, de-rotation) -> bf16;
 * grouped o_a (one strided-batched GEMM) and o_b; hc post-mix. Then the MoE: pre-mix, router
 * GEMM, routing kernel (top-k or hash), expert GEMVs over (token, expert) pairs (bf16 weights:
 * kernels/dsv4.h; MXFP4 experts: kernels/gemm_quant.h's MoE kernel), clamped SwiGLU, the shared
 * expert on cuBLAS, the combine (experts in increasing id, then the shared one), post-mix. The
 * head: hc head + norm on the wanted rows, lm_head.
 *
 * State: all per-sequence state lives in the runtime's paged KV cache, laid out by this file
 * inside its per-token rows: init raises impl->kv_dim so that a token's K row plus its V row
 * (in one layer) hold the layer's fields as fp32 (the layout of kernels/dsv4.h: KV row,
 * compressor inputs, indexer inputs, compressed rows spread over their window's slots). Every
 * stored value is a function of the token prefix, so the prefix cache, the runtime's kv_copy
 * (rows [0, n) of a block in every layer) and preemption keep working unchanged. block_size
 * must be a multiple of every compression ratio. The indexer's score scratch holds
 * ceil(min(pool, n_ctx) / 4) entries per token: positions past n_ctx see only those.
 *
 * Weights: bf16 on the device (f32/f16 rounded once); the FP8 dense linears of a quantized
 * checkpoint are dequantized to bf16 at upload (one rounding; exact for e8m0 scales); MXFP4
 * routed experts stay packed and run through tm_k_moe_mxfp4 (exact dequantization in
 * registers); FP8 experts are dequantized like the dense ones. Small tensors (norms, biases,
 * hyper-connection parameters, sinks) fp32.
 *
 * Tensor parallel (impl->tp_size > 1) splits exactly as the CPU engine (runner/tp/shard.h
 * tm_shard_dsv4_split, docs/deepseek_v4.md "Tensor parallel"): query heads with their sinks,
 * output groups (o_a rows, o_b columns), every expert's width (routed and shared gate/up rows,
 * down columns), vocabulary rows of the embedding (the rank holding a token's row gives it, the
 * others 0) and of the LM head; the KV head, compressor, indexer, router and hyper-connections
 * are replicated. g->H, g->G and g->I are then the rank's counts, so the kernels run unchanged on
 * the slices. Three all-reduces per layer step: the embedding (once), the o_b product and the MoE
 * output (routed + shared partials) of each layer, over impl->comm. Quantized checkpoints: the
 * bf16 copies are dequantized slices; the FP8 forms of q_b, o_b and the shared expert are sliced
 * with their 128 x 128 scale blocks (a rank's slice must start on a block: init refuses it
 * otherwise) and MXFP4 routed experts stay packed (down_proj's columns in whole 32-value groups).
 *
 * Not supported yet: fp8 KV, the MTP layer. Engine thread only; nothing allocates after init. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/log.h"
#include "kernels/common.h"
#include "kernels/dequant.h"
#include "kernels/dsv4.h"
#include "kernels/fill.h"
#include "kernels/gemm_quant.h"
#include "kernels/rmsnorm.h"
#include "runner/engine/cuda/engine_cuda.h"
#include "runner/engine/cuda/engine_cuda_int.h"
#include "runner/engine/cuda/weights.h"
#include "runner/model/model_dsv4.h"
#include "runner/tp/shard.h"
#include "runner/tp/shard_quant.h"

#define UPLOAD_CHUNK TM_CUDA_UPLOAD_CHUNK

/* State field: plane (0: K cache, 1: V cache) and float offset in the plane's row. */
typedef struct dfield {
    uint8_t plane;
    uint32_t off;
} dfield;

/* The FP8 (128 x 128 block-scaled) form of a dense linear, kept beside its bf16 copy: decode-sized
 * steps run kernels/gemm_quant.h on it, longer ones cuBLAS on the copy. */
enum { Q8_QA, Q8_QB, Q8_KV, Q8_OB, Q8_SHGU, Q8_SHDN, Q8_N };
typedef struct dq8 {
    uint8_t on;
    uint8_t sk;  /* tm_k_fp8_scale */
    uint8_t *w;  /* [n_out][n_in] e4m3 */
    void *scale; /* [ceil(n_out/128)][ceil(n_in/128)] fp32 or e8m0 */
    uint32_t n_out, n_in;
} dq8;

typedef struct dlayer {
    uint32_t kind, ratio, cw, hash;
    /* fp32 small tensors */
    float *attn_fn, *attn_base, *attn_scale, *ffn_fn, *ffn_base, *ffn_scale;
    float *attn_norm, *ffn_norm, *q_a_norm, *kv_norm, *sinks;
    float *c_bias, *c_norm, *i_bias, *i_norm, *router_bias;
    int32_t *tid2eid;
    /* bf16 linears */
    uint16_t *q_a, *q_b, *kv, *o_a, *o_b;
    uint16_t *c_kvg; /* [2cw][D]: compressor kv rows, then gate rows */
    uint16_t *i_kvg; /* [4di][D] */
    uint16_t *i_qb, *i_w, *router;
    uint16_t *sh_gu; /* [2I][D]: shared gate rows, then up rows */
    uint16_t *sh_down;
    /* routed experts: bf16 [E][2I][D] / [E][D][I], or MXFP4 packed with e8m0 scales */
    void *gu_w, *dn_w;
    uint8_t *gu_s, *dn_s;
    dq8 q8[Q8_N];
    /* state fields */
    dfield f_kv, f_ckv, f_cg, f_comp, f_ikv, f_ig, f_icomp;
} dlayer;

typedef struct dsv4 {
    tm_dsv4_cfg d;
    uint32_t D, N, hd, H, rd, mix, qr, di, Hi, E, I, G, olr, ing, K;
    uint32_t ld; /* floats per state row in each plane */
    uint32_t max_entries;
    int mxfp4; /* routed experts MXFP4 */
    /* weights */
    uint16_t *embd, *lm_head;
    float *out_norm, *hc_fn, *hc_base, *hc_scale;
    float *inv_main, *inv_comp; /* [rd/2] */
    dlayer *L;                  /* host [n_layer] */
    tm_shard_dsv4 sh;           /* this rank's split (the whole model at tp 1) */
    uint32_t vocab_full;        /* the full vocabulary (hash routing's tid2eid rows) */
    /* activations */
    float *streams, *mixes, *post, *comb, *qres, *q, *kvr, *cbuf, *ibuf, *iq, *iw, *isc, *out, *rl;
    float *pair_w, *gu, *dn, *sh_gu_o, *sh_dn;
    float *q8_part; /* split-K partials of the FP8 decode GEMMs */
    size_t q8_part_floats;
    float *hc_part;     /* hyper-connection dot partials of small steps (kernels/dsv4.h) */
    uint32_t moe_split; /* TM_DSV4_MOE_SPLIT: 0 = planned per step */
    uint16_t *h, *qres_bf, *att, *oa, *act, *sh_act, *last;
    uint32_t *sel, *n_sel, *pair_row, *iota;
    int32_t *pair_e;
} dsv4;

/* ---- config ---- */

static tm_rc check_cfg(const tm_model_cfg *c, tm_err *err) {
    if (c->arch != TM_ARCH_DEEPSEEK_V4 || c->n_kv_head != 1)
        return TM_ERR(err, TM_E_INVAL, "cuda engine: dsv4: not a DeepSeek-V4 config");
    if (!c->n_layer || !c->n_embd || !c->n_ff || !c->n_head || !c->head_dim || !c->n_vocab)
        return TM_ERR(err, TM_E_INVAL, "cuda engine: zero dimension in model config");
    if (c->head_dim > 512 || c->head_dim % 2 || c->n_embd % 8 || c->n_ff % 8 || c->n_embd > 12288)
        return TM_ERR(err, TM_E_INVAL,
                      "cuda engine: dsv4: head_dim %u (even, <= 512), hidden %u, n_ff %u "
                      "(multiples of 8) unsupported",
                      c->head_dim, c->n_embd, c->n_ff);
    return TM_OK;
}

static tm_rc check_weights(const tm_model *m, tm_err *err) {
    const tm_dsv4 *w = tm_model_dsv4(m);
    if (!w || !w->layers)
        return TM_ERR(err, TM_E_INVAL, "cuda engine: dsv4: no DeepSeek-V4 weights");
    for (uint32_t l = 0; l < m->cfg.n_layer; l++) {
        const tm_dsv4_layer *L = &w->layers[l];
        const int q1 = L->gate_up.quant, q2 = L->down.quant;
        if (q1 != q2 || (q1 != TM_QUANT_NONE && q1 != TM_QUANT_MXFP4 && q1 != TM_QUANT_FP8_BLOCK))
            return TM_ERR(err, TM_E_INVAL, "cuda engine: dsv4 layer %u: experts %s / %s", l,
                          tm_quant_name((tm_quant)q1), tm_quant_name((tm_quant)q2));
    }
    return TM_OK;
}

/* The counts of the split; the output groups (in the DeepSeek config, not here) are checked by
 * init, with the same message as the CPU engine's. */
static tm_rc shard_cfg(const tm_model_cfg *c, uint32_t rank, uint32_t tp, tm_model_cfg *s,
                       uint32_t *vocab0, uint32_t *v_per, tm_err *err) {
    tm_shard_dsv4 sh;
    tm_rc rc = tm_shard_dsv4_split(&sh, c, tp, rank, tp, err);
    if (rc)
        return rc;
    *s = *c;
    s->n_head = sh.n_head;
    s->n_ff = sh.n_ff;
    s->n_vocab = sh.n_vocab;
    s->tie_embd = 0; // the rank carries its own LM head slice
    *vocab0 = sh.vocab0;
    *v_per = TM_CEIL_DIV(c->n_vocab, tp);
    return TM_OK;
}

/* Raised by init to the layout's width (see the file comment). */
static uint32_t kv_dim(const tm_model_cfg *c) { return c->head_dim; }

static int prefill_tiles(const tm_model_cfg *c) {
    (void)c;
    return 0;
}

static void fini(tm_cuda_engine *impl) {
    dsv4 *g = impl->arch_state;
    if (!g)
        return;
    tm_free(g->L);
    tm_free(g);
    impl->arch_state = NULL;
}

static void place(dfield *f, uint8_t plane, uint32_t *w, uint32_t n) {
    f->plane = plane;
    f->off = w[plane];
    w[plane] += n;
}

static tm_rc init(tm_cuda_engine *impl, tm_err *err) {
    const tm_model_cfg *c = &impl->cfg;
    const tm_model *m = impl->eng.model;
    const tm_dsv4 *w = m->cfg.arch == TM_ARCH_DEEPSEEK_V4 ? (const tm_dsv4 *)m->arch_w : NULL;
    if (!w)
        return TM_ERR(err, TM_E_INVAL, "cuda engine: dsv4: no DeepSeek-V4 config");
    if (impl->kv_fp8)
        return TM_ERR(err, TM_E_INVAL, "cuda engine: dsv4: kv_cache_dtype fp8 not supported");
    dsv4 *g = tm_calloc(1, sizeof(*g));
    impl->arch_state = g;
    if (g)
        g->L = tm_calloc(c->n_layer, sizeof(dlayer));
    if (!g || !g->L)
        return TM_ERR(err, TM_E_NOMEM, "cuda engine: dsv4 state");
    const tm_dsv4_cfg *d = &w->cfg;
    g->d = *d;
    g->vocab_full = m->cfg.n_vocab;
    tm_rc rc = tm_shard_dsv4_split(&g->sh, &m->cfg, d->o_groups, impl->tp_rank,
                                   TM_MAX(impl->tp_size, 1u), err);
    if (rc)
        return rc;
    if (g->sh.n_head != c->n_head || g->sh.n_ff != c->n_ff)
        return TM_ERR(err, TM_E_INTERNAL, "cuda engine: dsv4: shard cfg and split disagree");
    g->D = c->n_embd, g->N = d->hc_mult, g->hd = c->head_dim, g->H = c->n_head;
    g->rd = d->rope_dim, g->mix = (2 + g->N) * g->N, g->qr = d->q_lora_rank;
    g->di = d->index_head_dim, g->Hi = d->index_n_heads, g->E = d->n_expert, g->I = c->n_ff;
    g->G = g->sh.n_group, g->olr = d->o_lora_rank, g->ing = g->H * g->hd / g->G;
    g->K = d->n_expert_used;
    const uint32_t bs = impl->eng.opts.block_size;
    if (g->N < 1 || g->N > TM_DSV4_K_MAX_HC || g->K < 1 || g->K > 16 || g->K > g->E ||
        g->E > TM_MOE_MAX_EXPERT || g->rd > g->hd || g->rd % 2)
        return TM_ERR(err, TM_E_INVAL,
                      "cuda engine: dsv4: hc_mult %u (1..8), experts %u of %u (k <= 16), rope "
                      "dim %u unsupported",
                      g->N, g->K, g->E, g->rd);
    int any_csa = 0;
    uint32_t wmax = 4;
    for (uint32_t l = 0; l < c->n_layer; l++) {
        dlayer *L = &g->L[l];
        L->kind = d->attn[l];
        L->hash = d->hash[l];
        uint32_t wd[2] = {0, 0};
        place(&L->f_kv, 0, wd, g->hd);
        if (L->kind != TM_DSV4_ATTN_SLIDING) {
            const int csa = L->kind == TM_DSV4_ATTN_CSA;
            L->ratio = csa ? d->ratio_csa : d->ratio_hca;
            L->cw = csa ? 2 * g->hd : g->hd;
            if (L->ratio < 1 || L->ratio > 128 || bs % L->ratio)
                return TM_ERR(err, TM_E_INVAL,
                              "cuda engine: dsv4: layer %u ratio %u (1..128, dividing block_size "
                              "%u) unsupported",
                              l, L->ratio, bs);
            place(&L->f_ckv, 0, wd, L->cw);
            place(&L->f_cg, 1, wd, L->cw);
            place(&L->f_comp, 0, wd, TM_CEIL_DIV(g->hd, L->ratio));
            if (csa) {
                any_csa = 1;
                place(&L->f_ikv, 1, wd, 2 * g->di);
                place(&L->f_ig, 1, wd, 2 * g->di);
                place(&L->f_icomp, 0, wd, TM_CEIL_DIV(g->di, L->ratio));
            }
        }
        wmax = TM_MAX(wmax, TM_MAX(wd[0], wd[1]));
    }
    if (any_csa && (g->di % 2 || g->di > TM_DSV4_K_MAX_DIM || g->rd > g->di || d->index_topk < 1 ||
                    ((size_t)g->Hi * (g->di + 1) + 8 * (size_t)g->di + g->Hi) * 4 > 48 * 1024))
        return TM_ERR(err, TM_E_INVAL, "cuda engine: dsv4: indexer %u heads x %u unsupported",
                      g->Hi, g->di);
    g->ld = TM_CEIL_DIV(wmax, 4u) * 4;
    impl->kv_dim = 2 * g->ld; // bf16 elements of a K (and of a V) row = ld floats each
    const tm_engine_opts *o = &impl->eng.opts;
    uint64_t seq_pos = TM_CEIL_DIV((uint64_t)TM_MAX(c->n_ctx, 1u), bs) * bs;
    if (o->n_kv_block)
        seq_pos = TM_MIN(seq_pos, (uint64_t)o->n_kv_block * bs);
    g->max_entries = (uint32_t)TM_CEIL_DIV(seq_pos, 4);
    if (impl->random) {
        g->mxfp4 = impl->random_fmt != TM_CUDA_W_BF16;
    } else {
        // the runtime checks the weights at tp 1 only; the slicing below relies on them too
        rc = impl->tp_size > 1 ? check_weights(m, err) : TM_OK;
        if (rc)
            return rc;
        g->mxfp4 = w->layers && w->layers[0].gate_up.quant == TM_QUANT_MXFP4;
        for (uint32_t l = 0; w->layers && l < c->n_layer; l++)
            if ((w->layers[l].gate_up.quant == TM_QUANT_MXFP4) != g->mxfp4)
                return TM_ERR(err, TM_E_INVAL, "cuda engine: dsv4: mixed expert formats");
    }
    const char *ms = getenv("TM_DSV4_MOE_SPLIT"); // routed-expert split-K (benchmarks)
    g->moe_split = ms ? (uint32_t)TM_MIN(TM_MAX(atoi(ms), 0), 8) : 0;
    // FP8 dense decode GEMMs (TM_CUDA_DSV4_FP8=0: the bf16 copies for every step)
    const char *f8 = getenv("TM_CUDA_DSV4_FP8");
    const int f8_ok = !(f8 && !strcmp(f8, "0"));
    const uint32_t tp = TM_MAX(impl->tp_size, 1u);
    for (uint32_t l = 0; l < c->n_layer; l++) {
        dlayer *L = &g->L[l];
        const uint32_t shape[Q8_N][2] = {{g->qr, g->D},    {g->H * g->hd, g->qr},
                                         {g->hd, g->D},    {g->D, g->G * g->olr},
                                         {2 * g->I, g->D}, {g->D, g->I}};
        /* TP: the per-rank extent of the split dimension (rank r's slice starts at r times it:
         * q_b rows, o_b columns, the shared expert's gate/up rows and down columns); 0 for the
         * replicated q_a and kv_proj. The FP8 codes are sliced with their 128 x 128 scale blocks,
         * so every rank's slice must start on a block: the extent a multiple of 128. */
        const uint32_t cut[Q8_N] = {0, g->H * g->hd, 0, g->G * g->olr, g->I, g->I};
        static const char *const q8_what[Q8_N] = {"q_a",
                                                  "q_b rows (heads x head_dim)",
                                                  "kv_proj",
                                                  "o_b columns (groups x o_lora)",
                                                  "shared expert gate/up rows",
                                                  "shared expert down columns"};
        for (int i = 0; i < Q8_N; i++) {
            dq8 *q = &L->q8[i];
            q->n_out = shape[i][0], q->n_in = shape[i][1];
            if (impl->random) {
                q->on = impl->random_fmt == TM_CUDA_W_FP8_BLOCK ||
                        impl->random_fmt == TM_CUDA_W_FP8_BLOCK_E8M0;
                q->sk = impl->random_fmt == TM_CUDA_W_FP8_BLOCK_E8M0 ? TM_K_FP8_BLOCK_E8M0
                                                                     : TM_K_FP8_BLOCK_F32;
            } else if (w->layers) {
                const tm_dsv4_layer *W = &w->layers[l];
                const tm_tensor *t[Q8_N] = {&W->q_a, &W->q_b,     &W->kv,
                                            &W->o_b, &W->sh_gate, &W->sh_down};
                const tm_tensor *x = t[i];
                q->on = x->quant == TM_QUANT_FP8_BLOCK && x->qblock[0] == 128 &&
                        x->qblock[1] == 128 && x->dtype == TM_DTYPE_F8_E4M3;
                if (i == Q8_SHGU) // gate and up fused: both FP8, the block rows whole (the full
                                  // width's: a rank's slice is checked below)
                    q->on = q->on && W->sh_up.quant == TM_QUANT_FP8_BLOCK &&
                            W->sh_up.qblock[0] == 128 && W->sh_up.qblock[1] == 128 &&
                            W->sh_up.scale_dtype == x->scale_dtype && m->cfg.n_ff % 128 == 0;
                q->sk = x->scale_dtype == TM_DTYPE_F8_E8M0 ? TM_K_FP8_BLOCK_E8M0
                                                           : TM_K_FP8_BLOCK_F32;
                if (f8_ok && q->on && tp > 1 && cut[i] % 128)
                    return TM_ERR(err, TM_E_INVAL,
                                  "cuda engine: dsv4: tp %u: layer %u %s: %u per rank do not "
                                  "align to the FP8 128 x 128 scale blocks (rank r's slice starts "
                                  "at r x %u); TM_CUDA_DSV4_FP8=0 slices the bf16 copies instead",
                                  tp, l, q8_what[i], cut[i], cut[i]);
            }
            q->on = f8_ok && q->on && tm_k_gemm_fp8_fits(1, q->n_in, q->n_out);
        }
    }
    if (impl->tp_size > 1 && g->I % 8)
        return TM_ERR(err, TM_E_INVAL,
                      "cuda engine: dsv4: expert width %u per rank (tp %u) is not a multiple of 8",
                      g->I, impl->tp_size);
    if (tp > 1 && g->mxfp4 && g->I % 32) // down_proj's columns [r I/tp, ...) with their scales
        return TM_ERR(err, TM_E_INVAL,
                      "cuda engine: dsv4: tp %u: MXFP4 expert slices of %u channels (expert width "
                      "%u / tp) do not align to the 32-value scale groups of down_proj",
                      tp, g->I, m->cfg.n_ff);
    if (g->mxfp4 && (g->D % 32 || g->I % 32))
        return TM_ERR(err, TM_E_INVAL,
                      "cuda engine: dsv4: MXFP4 experts need widths that divide by 32");
    return TM_OK;
}

static size_t skinny_floats(const tm_cuda_engine *impl, uint32_t n_tok) {
    (void)impl, (void)n_tok;
    return 0; // projections run on cuBLAS
}

/* ---- memory ---- */

static size_t q8_scale_bytes(const dq8 *q) {
    const size_t n = TM_CEIL_DIV((size_t)q->n_out, 128) * TM_CEIL_DIV((size_t)q->n_in, 128);
    return q->sk == TM_K_FP8_BLOCK_E8M0 ? n : n * sizeof(float);
}

static void carve_weights(tm_cuda_engine *impl, tm_cuda_carver *cv) {
    dsv4 *g = impl->arch_state;
    const tm_model_cfg *c = &impl->cfg;
    const size_t D = g->D, bf = 2, f4 = 4, ND = (size_t)g->N * D, I = g->I, E = g->E;
    g->embd = tm_cuda_carve(cv, (size_t)c->n_vocab * D * bf);
    g->lm_head = c->tie_embd ? g->embd : tm_cuda_carve(cv, (size_t)c->n_vocab * D * bf);
    g->out_norm = tm_cuda_carve(cv, D * f4);
    g->hc_fn = tm_cuda_carve(cv, g->N * ND * f4);
    g->hc_base = tm_cuda_carve(cv, g->N * f4);
    g->hc_scale = tm_cuda_carve(cv, f4);
    g->inv_main = tm_cuda_carve(cv, 512 * f4);
    g->inv_comp = tm_cuda_carve(cv, 512 * f4);
    for (uint32_t l = 0; l < c->n_layer; l++) {
        dlayer *L = &g->L[l];
        L->attn_fn = tm_cuda_carve(cv, g->mix * ND * f4);
        L->ffn_fn = tm_cuda_carve(cv, g->mix * ND * f4);
        L->attn_base = tm_cuda_carve(cv, g->mix * f4);
        L->ffn_base = tm_cuda_carve(cv, g->mix * f4);
        L->attn_scale = tm_cuda_carve(cv, 3 * f4);
        L->ffn_scale = tm_cuda_carve(cv, 3 * f4);
        L->attn_norm = tm_cuda_carve(cv, D * f4);
        L->ffn_norm = tm_cuda_carve(cv, D * f4);
        L->q_a_norm = tm_cuda_carve(cv, g->qr * f4);
        L->kv_norm = tm_cuda_carve(cv, g->hd * f4);
        L->sinks = tm_cuda_carve(cv, g->H * f4);
        L->q_a = tm_cuda_carve(cv, (size_t)g->qr * D * bf);
        L->q_b = tm_cuda_carve(cv, (size_t)g->H * g->hd * g->qr * bf);
        L->kv = tm_cuda_carve(cv, (size_t)g->hd * D * bf);
        L->o_a = tm_cuda_carve(cv, (size_t)g->G * g->olr * g->ing * bf);
        L->o_b = tm_cuda_carve(cv, D * g->G * g->olr * bf);
        if (L->kind != TM_DSV4_ATTN_SLIDING) {
            L->c_kvg = tm_cuda_carve(cv, 2 * (size_t)L->cw * D * bf);
            L->c_bias = tm_cuda_carve(cv, (size_t)L->ratio * L->cw * f4);
            L->c_norm = tm_cuda_carve(cv, g->hd * f4);
        }
        if (L->kind == TM_DSV4_ATTN_CSA) {
            L->i_kvg = tm_cuda_carve(cv, 4 * (size_t)g->di * D * bf);
            L->i_bias = tm_cuda_carve(cv, (size_t)L->ratio * 2 * g->di * f4);
            L->i_norm = tm_cuda_carve(cv, g->di * f4);
            L->i_qb = tm_cuda_carve(cv, (size_t)g->Hi * g->di * g->qr * bf);
            L->i_w = tm_cuda_carve(cv, (size_t)g->Hi * D * bf);
        }
        L->router = tm_cuda_carve(cv, E * D * bf);
        if (L->hash)
            L->tid2eid = tm_cuda_carve(cv, (size_t)g->vocab_full * g->K * sizeof(int32_t));
        else
            L->router_bias = tm_cuda_carve(cv, E * f4);
        if (g->mxfp4) {
            L->gu_w = tm_cuda_carve(cv, E * 2 * I * D / 2);
            L->gu_s = tm_cuda_carve(cv, E * 2 * I * D / 32);
            L->dn_w = tm_cuda_carve(cv, E * D * I / 2);
            L->dn_s = tm_cuda_carve(cv, E * D * I / 32);
        } else {
            L->gu_w = tm_cuda_carve(cv, E * 2 * I * D * bf);
            L->dn_w = tm_cuda_carve(cv, E * D * I * bf);
        }
        L->sh_gu = tm_cuda_carve(cv, 2 * I * D * bf);
        L->sh_down = tm_cuda_carve(cv, D * I * bf);
        for (int i = 0; i < Q8_N; i++) {
            dq8 *q = &L->q8[i];
            if (!q->on)
                continue;
            q->w = tm_cuda_carve(cv, (size_t)q->n_out * q->n_in);
            q->scale = tm_cuda_carve(cv, q8_scale_bytes(q));
        }
    }
}

static void carve_acts(tm_cuda_engine *impl, tm_cuda_carver *cv) {
    dsv4 *g = impl->arch_state;
    const size_t T = impl->eng.opts.max_batched_tokens, S = impl->eng.opts.max_seqs;
    const size_t D = g->D, f4 = 4, bf = 2, P = T * g->K, I = g->I;
    g->streams = tm_cuda_carve(cv, T * g->N * D * f4);
    g->mixes = tm_cuda_carve(cv, TM_MAX(T, S) * g->mix * f4);
    g->post = tm_cuda_carve(cv, T * g->N * f4);
    g->comb = tm_cuda_carve(cv, T * g->N * g->N * f4);
    g->qres = tm_cuda_carve(cv, T * g->qr * f4);
    g->q = tm_cuda_carve(cv, T * g->H * g->hd * f4);
    g->kvr = tm_cuda_carve(cv, T * g->hd * f4);
    g->cbuf = tm_cuda_carve(cv, T * 4 * g->hd * f4);
    g->ibuf = tm_cuda_carve(cv, T * 4 * g->di * f4);
    g->iq = tm_cuda_carve(cv, T * g->Hi * g->di * f4);
    g->iw = tm_cuda_carve(cv, T * g->Hi * f4);
    g->isc = tm_cuda_carve(cv, T * g->max_entries * f4);
    g->sel = tm_cuda_carve(cv, T * TM_MAX(g->d.index_topk, 1u) * 4);
    g->n_sel = tm_cuda_carve(cv, T * 4);
    g->out = tm_cuda_carve(cv, T * D * f4);
    g->rl = tm_cuda_carve(cv, T * g->E * f4);
    g->pair_e = tm_cuda_carve(cv, P * 4);
    g->pair_row = tm_cuda_carve(cv, P * 4);
    g->iota = tm_cuda_carve(cv, P * 4);
    g->pair_w = tm_cuda_carve(cv, P * f4);
    g->gu = tm_cuda_carve(cv, P * 2 * I * f4);
    g->dn = tm_cuda_carve(cv, P * D * f4);
    g->sh_gu_o = tm_cuda_carve(cv, T * 2 * I * f4);
    g->sh_dn = tm_cuda_carve(cv, T * D * f4);
    g->h = tm_cuda_carve(cv, T * D * bf);
    g->qres_bf = tm_cuda_carve(cv, T * g->qr * bf);
    g->att = tm_cuda_carve(cv, T * g->H * g->hd * bf);
    g->oa = tm_cuda_carve(cv, T * g->G * g->olr * bf);
    g->act = tm_cuda_carve(cv, P * I * bf);
    g->sh_act = tm_cuda_carve(cv, T * I * bf);
    g->last = tm_cuda_carve(cv, S * D * bf);
    size_t most = 0;
    for (uint32_t l = 0; l < impl->cfg.n_layer; l++)
        for (int i = 0; i < Q8_N; i++) {
            const dq8 *q = &g->L[l].q8[i];
            uint32_t kps = 0;
            if (q->on)
                most = TM_MAX(most,
                              (size_t)tm_k_gemm_fp8_splits(q->n_in, q->n_out, impl->n_sm, &kps) *
                                  TM_QUANT_MAX_TOK * q->n_out);
        }
    g->q8_part_floats = most;
    g->q8_part = most ? tm_cuda_carve(cv, most * f4) : NULL;
    g->hc_part =
        tm_cuda_carve(cv, (size_t)TM_DSV4_K_HC_SPLIT_TOK * (g->mix + 1) * TM_DSV4_K_HC_SPLIT * f4);
}

/* ---- weights ---- */

static tm_rc up_f32(float *dst, const tm_tensor *t, float *fb, tm_err *err) {
    const size_t n = (size_t)tm_tensor_n_elem(t);
    TM_ASSERT(n <= UPLOAD_CHUNK);
    for (size_t i = 0; i < n; i++)
        fb[i] = tm_tensor_get_f32(t, i);
    return tm_cuda_h2d(dst, fb, n * 4, err);
}

/* A large fp32 matrix (hyper-connection fn) in chunks. */
static tm_rc up_f32_big(float *dst, const tm_tensor *t, float *fb, tm_err *err) {
    const size_t n = (size_t)tm_tensor_n_elem(t);
    for (size_t i = 0; i < n; i += UPLOAD_CHUNK) {
        const size_t k = TM_MIN(UPLOAD_CHUNK, n - i);
        tm_dtype_to_f32(t->data, t->dtype, i, k, fb);
        tm_rc rc = tm_cuda_h2d(dst + i, fb, k * 4, err);
        if (rc)
            return rc;
    }
    return TM_OK;
}

/* The e4m3 codes and block scales of t (and of t2 after it: a fused pair) into q. */
static tm_rc up_q8(const dq8 *q, const tm_tensor *t, const tm_tensor *t2, float *fb, tm_err *err) {
    const tm_tensor *parts[2] = {t, t2};
    size_t row = 0, srow = 0;
    tm_rc rc = TM_OK;
    for (int k = 0; !rc && k < 2 && parts[k]; k++) {
        const tm_tensor *x = parts[k];
        const size_t R = x->shape[0], C = x->shape[1];
        const size_t gr = TM_CEIL_DIV(R, (size_t)128), gc = TM_CEIL_DIV(C, (size_t)128);
        rc = tm_cuda_h2d(q->w + row * C, x->data, R * C, err);
        if (!rc && q->sk == TM_K_FP8_BLOCK_E8M0) {
            rc = tm_cuda_h2d((uint8_t *)q->scale + srow * gc, x->scale, gr * gc, err);
        } else if (!rc) {
            TM_ASSERT(gr * gc <= UPLOAD_CHUNK);
            tm_dtype_to_f32(x->scale, (tm_dtype)x->scale_dtype, 0, gr * gc, fb);
            rc = tm_cuda_h2d((float *)q->scale + srow * gc, fb, gr * gc * 4, err);
        }
        row += R, srow += gr;
    }
    return rc;
}

/* TP: rows [r0, r0 + nr) x columns [c0, c0 + nc) of t, whose rows (of any leading shape
 * flattened) have C elements, as bf16 [nr][nc] at dst; through sb (UPLOAD_CHUNK floats) in
 * batches of rows. A quantized t is dequantized a whole row at a time into rb (C floats:
 * tm_tensor_row_f32, the values tm_cuda_upload_bf16 gives at tp 1) and its columns taken, so any
 * slice works. */
static tm_rc up_sub(uint16_t *dst, const tm_tensor *t, size_t C, size_t r0, size_t nr, size_t c0,
                    size_t nc, float *sb, float *rb, uint16_t *stage, float *fb, tm_err *err) {
    TM_ASSERT(nc > 0 && nc <= UPLOAD_CHUNK && c0 + nc <= C && C <= UPLOAD_CHUNK);
    const size_t per = UPLOAD_CHUNK / nc;
    tm_rc rc = TM_OK;
    for (size_t i = 0; !rc && i < nr; i += per) {
        const size_t k = TM_MIN(per, nr - i);
        for (size_t j = 0; j < k; j++) {
            if (t->quant == TM_QUANT_NONE) {
                tm_dtype_to_f32(t->data, t->dtype, (r0 + i + j) * C + c0, nc, sb + j * nc);
            } else {
                tm_tensor_row_f32(t, r0 + i + j, rb);
                memcpy(sb + j * nc, rb + c0, nc * sizeof(float));
            }
        }
        const tm_tensor v = {.data = sb, .dtype = TM_DTYPE_F32, .n_dim = 2, .shape = {k, nc}};
        rc = tm_cuda_upload_bf16(dst + i * nc, &v, stage, fb, err);
    }
    return rc;
}

/* TP: rows [r0, r0 + nr) x columns [c0, c0 + nc) of the FP8 matrix t into q's codes and scales
 * from row qrow (runner/tp/shard_quant.h; init refused slices that do not start on a block). */
static tm_rc up_q8_sub(const dq8 *q, size_t qrow, const tm_tensor *t, size_t r0, size_t nr,
                       size_t c0, size_t nc, uint8_t *hb, float *fb, tm_err *err) {
    TM_ASSERT(nc == q->n_in);
    return tm_shard_fp8_block_put(tm_cuda_h2d, q->w, q->scale, q->sk == TM_K_FP8_BLOCK_E8M0, qrow,
                                  t, r0, nr, c0, nc, hb, fb, UPLOAD_CHUNK, err);
}

/* TP: elements [e0, e0 + n) of the 1-D tensor t as a view (its data borrowed). */
static tm_tensor elems(const tm_tensor *t, size_t e0, size_t n) {
    tm_tensor v = *t;
    if (t->data)
        v.data = (const char *)t->data + e0 * tm_dtype_size(t->dtype);
    v.shape[0] = n;
    return v;
}

/* TP: this rank's slices of the split weights (shard.h): embedding and LM head rows, q_b rows
 * and sinks of its heads, o_a rows and o_b columns of its groups, its width of every expert. The
 * bf16 copies of quantized tensors are dequantized slices (up_sub); the FP8 forms the decode
 * GEMMs run on (q->on: q_b, o_b, the shared expert) get the codes and scale blocks of the same
 * slices (up_q8_sub), MXFP4 routed experts their packed slices (runner/tp/shard_quant.h). */
static tm_rc upload_shard(tm_cuda_engine *impl, dsv4 *g, const tm_model *m, uint16_t *stage,
                          float *fb, tm_err *err) {
    const tm_dsv4 *w = tm_model_dsv4(m);
    const tm_shard_dsv4 *sh = &g->sh;
    const size_t D = g->D, hd = g->hd, olr = g->olr, I = impl->eng.model->cfg.n_ff, Is = g->I;
    const size_t Gf = g->d.o_groups;
    float *sb = tm_malloc(UPLOAD_CHUNK * 4), *rb = tm_malloc(UPLOAD_CHUNK * 4);
    uint8_t *hb = tm_malloc(UPLOAD_CHUNK);
    tm_rc rc = sb && rb && hb ? TM_OK : TM_ERR(err, TM_E_NOMEM, "cuda engine: upload staging");
    if (!rc && sh->n_vocab)
        rc = up_sub(g->embd, &m->embd, D, sh->vocab0, sh->n_vocab, 0, D, sb, rb, stage, fb, err);
    if (!rc && sh->n_vocab)
        rc = up_sub(g->lm_head, m->lm_head.data ? &m->lm_head : &m->embd, D, sh->vocab0,
                    sh->n_vocab, 0, D, sb, rb, stage, fb, err);
    for (uint32_t l = 0; !rc && l < impl->cfg.n_layer; l++) {
        const tm_dsv4_layer *W = &w->layers[l];
        dlayer *L = &g->L[l];
        const tm_tensor sk = elems(&W->sinks, sh->h0, sh->n_head);
        const size_t q0 = (size_t)sh->h0 * hd, nq = (size_t)sh->n_head * hd;
        const size_t o0 = (size_t)sh->g0 * olr, no = (size_t)sh->n_group * olr;
        rc = up_f32(L->sinks, &sk, fb, err);
        if (!rc)
            rc = up_sub(L->q_b, &W->q_b, g->qr, q0, nq, 0, g->qr, sb, rb, stage, fb, err);
        if (!rc && L->q8[Q8_QB].on)
            rc = up_q8_sub(&L->q8[Q8_QB], 0, &W->q_b, q0, nq, 0, g->qr, hb, fb, err);
        if (!rc)
            rc = up_sub(L->o_a, &W->o_a, g->ing, o0, no, 0, g->ing, sb, rb, stage, fb, err);
        if (!rc)
            rc = up_sub(L->o_b, &W->o_b, Gf * olr, 0, D, o0, no, sb, rb, stage, fb, err);
        if (!rc && L->q8[Q8_OB].on)
            rc = up_q8_sub(&L->q8[Q8_OB], 0, &W->o_b, 0, D, o0, no, hb, fb, err);
        // shared expert: gate rows, up rows (fused [gate | up]), down columns
        if (!rc)
            rc = up_sub(L->sh_gu, &W->sh_gate, D, sh->f0, Is, 0, D, sb, rb, stage, fb, err);
        if (!rc)
            rc = up_sub(L->sh_gu + Is * D, &W->sh_up, D, sh->f0, Is, 0, D, sb, rb, stage, fb, err);
        if (!rc)
            rc = up_sub(L->sh_down, &W->sh_down, I, 0, D, sh->f0, Is, sb, rb, stage, fb, err);
        if (!rc && L->q8[Q8_SHGU].on)
            rc = up_q8_sub(&L->q8[Q8_SHGU], 0, &W->sh_gate, sh->f0, Is, 0, D, hb, fb, err);
        if (!rc && L->q8[Q8_SHGU].on)
            rc = up_q8_sub(&L->q8[Q8_SHGU], Is, &W->sh_up, sh->f0, Is, 0, D, hb, fb, err);
        if (!rc && L->q8[Q8_SHDN].on)
            rc = up_q8_sub(&L->q8[Q8_SHDN], 0, &W->sh_down, 0, D, sh->f0, Is, hb, fb, err);
        if (!rc && g->mxfp4) {
            rc = tm_shard_mxfp4_experts_put(tm_cuda_h2d, L->gu_w, L->gu_s, L->dn_w, L->dn_s,
                                            &W->gate_up, &W->down, sh->f0, Is, hb, UPLOAD_CHUNK,
                                            err);
            continue;
        }
        // routed experts (bf16, or FP8 dequantized): [E][2I][D] gate rows f0.., up rows
        // I + f0..; [E][D][I] columns f0..
        uint16_t *gu = L->gu_w, *dn = L->dn_w;
        for (size_t e = 0; !rc && e < g->E; e++) {
            rc = up_sub(gu + e * 2 * Is * D, &W->gate_up, D, e * 2 * I + sh->f0, Is, 0, D, sb, rb,
                        stage, fb, err);
            if (!rc)
                rc = up_sub(gu + (e * 2 + 1) * Is * D, &W->gate_up, D, e * 2 * I + I + sh->f0, Is,
                            0, D, sb, rb, stage, fb, err);
            if (!rc)
                rc = up_sub(dn + e * D * Is, &W->down, I, e * D, D, sh->f0, Is, sb, rb, stage, fb,
                            err);
        }
    }
    tm_free(sb);
    tm_free(rb);
    tm_free(hb);
    return rc;
}

static tm_rc upload_inv_freq(dsv4 *g, tm_err *err) {
    tm_rc rc = tm_cuda_h2d(g->inv_main, g->d.rope_main.inv_freq, 512 * 4, err);
    return rc ? rc : tm_cuda_h2d(g->inv_comp, g->d.rope_compress.inv_freq, 512 * 4, err);
}

static tm_rc upload_iota(tm_cuda_engine *impl, dsv4 *g, float *fb, tm_err *err) {
    const size_t P = (size_t)impl->eng.opts.max_batched_tokens * g->K;
    uint32_t *u = (uint32_t *)fb;
    tm_rc rc = TM_OK;
    for (size_t i = 0; !rc && i < P; i += UPLOAD_CHUNK) {
        const size_t k = TM_MIN(UPLOAD_CHUNK, P - i);
        for (size_t j = 0; j < k; j++)
            u[j] = (uint32_t)(i + j);
        rc = tm_cuda_h2d(g->iota + i, u, k * 4, err);
    }
    return rc;
}

static tm_rc upload(tm_cuda_engine *impl, const tm_model *m, tm_err *err) {
    dsv4 *g = impl->arch_state;
    const tm_model_cfg *c = &impl->cfg;
    const tm_dsv4 *w = tm_model_dsv4(m);
    uint16_t *stage = tm_malloc(UPLOAD_CHUNK * 2);
    float *fb = tm_malloc(UPLOAD_CHUNK * 4);
    tm_rc rc = stage && fb ? TM_OK : TM_ERR(err, TM_E_NOMEM, "cuda engine: upload staging");
    const size_t D = g->D, I = g->I;
    const int tp = impl->tp_size > 1; // the split tensors: upload_shard
    if (!rc)
        rc = upload_inv_freq(g, err);
    if (!rc)
        rc = upload_iota(impl, g, fb, err);
    if (!rc && tp)
        rc = upload_shard(impl, g, m, stage, fb, err);
    if (!rc && !tp)
        rc = tm_cuda_upload_bf16(g->embd, &m->embd, stage, fb, err);
    if (!rc && !tp && !c->tie_embd)
        rc = tm_cuda_upload_bf16(g->lm_head, m->lm_head.data ? &m->lm_head : &m->embd, stage, fb,
                                 err);
    if (!rc)
        rc = up_f32(g->out_norm, &m->out_norm, fb, err);
    if (!rc)
        rc = up_f32_big(g->hc_fn, &w->hc_head_fn, fb, err);
    if (!rc)
        rc = up_f32(g->hc_base, &w->hc_head_base, fb, err);
    if (!rc)
        rc = up_f32(g->hc_scale, &w->hc_head_scale, fb, err);
    for (uint32_t l = 0; !rc && l < c->n_layer; l++) {
        const tm_dsv4_layer *W = &w->layers[l];
        dlayer *L = &g->L[l];
        rc = up_f32_big(L->attn_fn, &W->attn_hc_fn, fb, err);
        if (!rc)
            rc = up_f32_big(L->ffn_fn, &W->ffn_hc_fn, fb, err);
        const struct {
            float *dst;
            const tm_tensor *t;
        } sm[] = {{L->attn_base, &W->attn_hc_base},  {L->attn_scale, &W->attn_hc_scale},
                  {L->ffn_base, &W->ffn_hc_base},    {L->ffn_scale, &W->ffn_hc_scale},
                  {L->attn_norm, &W->attn_norm},     {L->ffn_norm, &W->ffn_norm},
                  {L->q_a_norm, &W->q_a_norm},       {L->kv_norm, &W->kv_norm},
                  {tp ? NULL : L->sinks, &W->sinks}, {L->c_bias, &W->c_bias},
                  {L->c_norm, &W->c_norm},           {L->i_bias, &W->i_bias},
                  {L->i_norm, &W->i_norm},           {L->router_bias, &W->router_bias}};
        for (size_t i = 0; !rc && i < sizeof(sm) / sizeof(sm[0]); i++)
            if (sm[i].dst)
                rc = up_f32(sm[i].dst, sm[i].t, fb, err);
        const struct {
            uint16_t *dst;
            const tm_tensor *t;
        } lin[] = {{L->q_a, &W->q_a},
                   {tp ? NULL : L->q_b, &W->q_b},
                   {L->kv, &W->kv},
                   {tp ? NULL : L->o_a, &W->o_a},
                   {tp ? NULL : L->o_b, &W->o_b},
                   {L->c_kvg, &W->c_kv},
                   {L->c_kvg ? L->c_kvg + (size_t)L->cw * D : NULL, &W->c_gate},
                   {L->i_kvg, &W->i_kv},
                   {L->i_kvg ? L->i_kvg + 2 * (size_t)g->di * D : NULL, &W->i_gate},
                   {L->i_qb, &W->i_qb},
                   {L->i_w, &W->i_w},
                   {L->router, &W->router},
                   {tp ? NULL : L->sh_gu, &W->sh_gate},
                   {tp ? NULL : L->sh_gu + I * D, &W->sh_up},
                   {tp ? NULL : L->sh_down, &W->sh_down}};
        for (size_t i = 0; !rc && i < sizeof(lin) / sizeof(lin[0]); i++)
            if (lin[i].dst)
                rc = tm_cuda_upload_bf16(lin[i].dst, lin[i].t, stage, fb, err);
        const tm_tensor *q8t[Q8_N][2] = {{&W->q_a, NULL},          {&W->q_b, NULL},
                                         {&W->kv, NULL},           {&W->o_b, NULL},
                                         {&W->sh_gate, &W->sh_up}, {&W->sh_down, NULL}};
        for (int i = 0; !rc && i < Q8_N; i++) // TP: q_b, o_b, shared expert sliced in upload_shard
            if (L->q8[i].on && (!tp || i == Q8_QA || i == Q8_KV))
                rc = up_q8(&L->q8[i], q8t[i][0], q8t[i][1], fb, err);
        if (!rc && L->tid2eid) {
            const size_t n = (size_t)g->vocab_full * g->K;
            int32_t *u = tm_malloc(n * 4);
            if (!u)
                rc = TM_ERR(err, TM_E_NOMEM, "cuda engine: tid2eid");
            for (size_t i = 0; u && i < n; i++) {
                const float v = tm_tensor_get_f32(&W->tid2eid, i);
                u[i] = v >= 0.0f && v < (float)g->E ? (int32_t)v : 0;
            }
            if (!rc)
                rc = tm_cuda_h2d(L->tid2eid, u, n * 4, err);
            tm_free(u);
        }
        if (!rc && g->mxfp4 && !tp) {
            const tm_tensor *t2[2] = {&W->gate_up, &W->down};
            void *dw[2] = {L->gu_w, L->dn_w};
            uint8_t *ds[2] = {L->gu_s, L->dn_s};
            for (int i = 0; !rc && i < 2; i++) {
                const size_t n = (size_t)tm_tensor_n_elem(t2[i]);
                rc = tm_cuda_h2d(dw[i], t2[i]->data, n / 2, err);
                if (!rc)
                    rc = tm_cuda_h2d(ds[i], t2[i]->scale, n / 32, err);
            }
        } else if (!rc && !tp) {
            rc = tm_cuda_upload_bf16(L->gu_w, &W->gate_up, stage, fb, err);
            if (!rc)
                rc = tm_cuda_upload_bf16(L->dn_w, &W->down, stage, fb, err);
        }
    }
    tm_free(stage);
    tm_free(fb);
    return rc;
}

/* ---- random weights (benchmarks) ---- */

/* Random MXFP4 experts: bytes from the e4m3 fill (every nibble is a valid e2m1 code), scales a
 * power of two near 1 / (3 sqrt(n_in)) (e2m1 codes have an rms of about 3). */
static tm_rc fill_mxfp4(tm_cuda_engine *impl, void *w, uint8_t *s, size_t n_elem, size_t n_in,
                        uint64_t seed, tm_err *err) {
    tm_k_fill_e4m3_args fa = {.p = w, .n = n_elem / 2, .seed = seed, .amax = 448.0f};
    tm_rc rc = tm_k_fill_e4m3(&fa, impl->stream, err);
    const int e = 127 + (int)floorf(log2f(1.0f / (3.0f * sqrtf((float)n_in))));
    if (!rc)
        rc = TM_CUDA_CHECK(cudaMemsetAsync(s, e, n_elem / 32, impl->stream), err);
    return rc;
}

/* Random FP8 linear q (as the Llama arch's): e4m3 over the whole range, block scales about
 * sqrt(3 / n_in) / 448 (+-10%; e8m0: the power of two at or above), and its bf16 copy bf (the
 * exact products rounded once: the same weights for prefill). */
static tm_rc fill_q8(tm_cuda_engine *impl, const dq8 *q, uint16_t *bf, uint64_t seed, float *fb,
                     tm_err *err) {
    tm_k_fill_e4m3_args fa = {
        .p = q->w, .n = (size_t)q->n_out * q->n_in, .seed = seed, .amax = 448.0f};
    tm_rc rc = tm_k_fill_e4m3(&fa, impl->stream, err);
    const float s0 = sqrtf(3.0f / (float)q->n_in) / 448.0f;
    const size_t sb = q8_scale_bytes(q);
    if (!rc && q->sk == TM_K_FP8_BLOCK_E8M0)
        rc = TM_CUDA_CHECK(cudaMemsetAsync(q->scale, 127 + (int)ceilf(log2f(s0)), sb, impl->stream),
                           err);
    else if (!rc)
        rc = tm_cuda_fill_f32(q->scale, sb / 4, seed, 0.1f * s0, s0, fb, err);
    tm_k_dequant_fp8_args da = {.out = bf,
                                .w = q->w,
                                .scale = q->scale,
                                .n_out = q->n_out,
                                .n_in = q->n_in,
                                .scale_kind = (tm_k_fp8_scale)q->sk};
    if (!rc)
        rc = tm_k_dequant_fp8_bf16(&da, impl->stream, err);
    return rc;
}

static tm_rc fill_random(tm_cuda_engine *impl, uint64_t seed, tm_err *err) {
    dsv4 *g = impl->arch_state;
    const tm_model_cfg *c = &impl->cfg;
    const size_t D = g->D, I = g->I, E = g->E, ND = (size_t)g->N * D;
    float *fb = tm_malloc(UPLOAD_CHUNK * 4);
    if (!fb)
        return TM_ERR(err, TM_E_NOMEM, "cuda engine: staging");
    uint64_t k = seed * 1000003ull;
    tm_rc rc = upload_inv_freq(g, err);
    if (!rc)
        rc = upload_iota(impl, g, fb, err);
    if (!rc)
        rc = tm_cuda_fill_bf16(impl, g->embd, c->n_vocab, D, k++, err);
    if (!rc && !c->tie_embd)
        rc = tm_cuda_fill_bf16(impl, g->lm_head, c->n_vocab, D, k++, err);
    if (!rc)
        rc = tm_cuda_fill_f32(g->out_norm, D, k++, 0.1f, 1.0f, fb, err);
    if (!rc)
        rc = tm_cuda_fill_f32(g->hc_fn, g->N * ND, k++, 1.0f / sqrtf((float)ND), 0.0f, fb, err);
    if (!rc)
        rc = tm_cuda_fill_f32(g->hc_base, g->N, k++, 0.5f, 0.0f, fb, err);
    if (!rc)
        rc = tm_cuda_fill_f32(g->hc_scale, 1, k++, 0.1f, 1.0f, fb, err);
    for (uint32_t l = 0; !rc && l < c->n_layer; l++) {
        dlayer *L = &g->L[l];
        const struct {
            float *p;
            size_t n;
            float sc, off;
        } v[] = {{L->attn_fn, g->mix * ND, 1.0f / sqrtf((float)ND), 0.0f},
                 {L->ffn_fn, g->mix * ND, 1.0f / sqrtf((float)ND), 0.0f},
                 {L->attn_base, g->mix, 0.5f, 0.0f},
                 {L->ffn_base, g->mix, 0.5f, 0.0f},
                 {L->attn_scale, 3, 0.1f, 1.0f},
                 {L->ffn_scale, 3, 0.1f, 1.0f},
                 {L->attn_norm, D, 0.1f, 1.0f},
                 {L->ffn_norm, D, 0.1f, 1.0f},
                 {L->q_a_norm, g->qr, 0.1f, 1.0f},
                 {L->kv_norm, g->hd, 0.1f, 1.0f},
                 {L->sinks, g->H, 0.5f, 0.0f},
                 {L->c_bias, (size_t)L->ratio * L->cw, 0.5f, 0.0f},
                 {L->c_norm, g->hd, 0.1f, 1.0f},
                 {L->i_bias, (size_t)L->ratio * 2 * g->di, 0.5f, 0.0f},
                 {L->i_norm, g->di, 0.1f, 1.0f},
                 {L->router_bias, E, 0.1f, 0.0f}};
        for (size_t i = 0; !rc && i < sizeof(v) / sizeof(v[0]); i++)
            if (v[i].p)
                rc = tm_cuda_fill_f32(v[i].p, v[i].n, k++, v[i].sc, v[i].off, fb, err);
        const struct {
            uint16_t *p;
            size_t n_out, n_in;
        } m[] = {{L->q_a, g->qr, D},
                 {L->q_b, (size_t)g->H * g->hd, g->qr},
                 {L->kv, g->hd, D},
                 {L->o_a, (size_t)g->G * g->olr, g->ing},
                 {L->o_b, D, (size_t)g->G * g->olr},
                 {L->c_kvg, 2 * (size_t)L->cw, D},
                 {L->i_kvg, 4 * (size_t)g->di, D},
                 {L->i_qb, (size_t)g->Hi * g->di, g->qr},
                 {L->i_w, g->Hi, D},
                 {L->router, E, D},
                 {L->sh_gu, 2 * I, D},
                 {L->sh_down, D, I}};
        for (size_t i = 0; !rc && i < sizeof(m) / sizeof(m[0]); i++)
            if (m[i].p)
                rc = tm_cuda_fill_bf16(impl, m[i].p, m[i].n_out, m[i].n_in, k++, err);
        uint16_t *q8bf[Q8_N] = {L->q_a, L->q_b, L->kv, L->o_b, L->sh_gu, L->sh_down};
        for (int i = 0; !rc && i < Q8_N; i++)
            if (L->q8[i].on)
                rc = fill_q8(impl, &L->q8[i], q8bf[i], k++, fb, err);
        if (!rc && g->mxfp4) {
            rc = fill_mxfp4(impl, L->gu_w, L->gu_s, E * 2 * I * D, D, k++, err);
            if (!rc)
                rc = fill_mxfp4(impl, L->dn_w, L->dn_s, E * D * I, I, k++, err);
        } else if (!rc) {
            rc = tm_cuda_fill_bf16(impl, L->gu_w, E * 2 * I, D, k++, err);
            if (!rc)
                rc = tm_cuda_fill_bf16(impl, L->dn_w, E * D, I, k++, err);
        }
        if (!rc && L->tid2eid) {
            const size_t n = (size_t)g->vocab_full * g->K;
            int32_t *u = (int32_t *)fb;
            for (size_t i0 = 0; !rc && i0 < n; i0 += UPLOAD_CHUNK) {
                const size_t kk = TM_MIN(UPLOAD_CHUNK, n - i0);
                for (size_t i = 0; i < kk; i++) {
                    const size_t t = (i0 + i) / g->K, j = (i0 + i) % g->K;
                    u[i] = (int32_t)((t * 2654435761u + j) % E); // distinct within a token
                }
                rc = tm_cuda_h2d(L->tid2eid + i0, u, kk * 4, err);
            }
        }
    }
    if (!rc)
        rc = TM_CUDA_CHECK(cudaStreamSynchronize(impl->stream), err);
    tm_free(fb);
    return rc;
}

/* ---- forward ---- */

static tm_rc blas_rc(cublasStatus_t st, const char *what, tm_err *err) {
    return st == CUBLAS_STATUS_SUCCESS ? TM_OK
                                       : TM_ERR(err, TM_E_CUDA, "cuda engine: dsv4 %s: %s", what,
                                                cublasGetStatusString(st));
}

/* y[T][n_out] (row stride ldy, fp32 or bf16) = x[T][n_in] (row stride ldx) @ w[n_out][n_in]^T:
 * the runtime's cuBLAS GEMM (engine_cuda_int.h), marked as op what. */
static tm_rc gemm(tm_cuda_engine *impl, const char *what, const uint16_t *w, const uint16_t *x,
                  uint32_t ldx, void *y, int y_bf16, uint32_t ldy, uint32_t T, uint32_t n_in,
                  uint32_t n_out, tm_err *err) {
    if (!T)
        return TM_OK; // nothing launched, nothing marked
    return tm_cuda_op_end(
        impl, what,
        tm_cuda_gemm(impl, what, w, x, ldx, y, !y_bf16, ldy, T, n_in, n_out, 0.0f, err));
}

/* y[T][n_out] fp32 (row stride n_out) = x (row stride n_in) @ linear i of layer L: the FP8 decode
 * GEMM for steps of at most TM_QUANT_MAX_TOK tokens when the linear has an FP8 form, else cuBLAS
 * on the bf16 copy bf. With part (the consumer sums split-K partials itself): *part gets y or
 * g->q8_part (valid until the next linear), *n_part their count, *stride their distance; without
 * it the partials are summed into y. */
static tm_rc lin_part(tm_cuda_engine *impl, dsv4 *g, const dlayer *L, int i, const char *what,
                      const uint16_t *bf, const uint16_t *x, float *y, uint32_t T,
                      const float **part_out, uint32_t *n_part, size_t *stride, tm_err *err) {
    const dq8 *q = &L->q8[i];
    if (part_out)
        *part_out = y, *n_part = 1, *stride = 0;
    if (!q->on || T > TM_QUANT_MAX_TOK)
        return gemm(impl, what, bf, x, q->n_in, y, 0, q->n_out, T, q->n_in, q->n_out, err);
    uint32_t kps = 0;
    const uint32_t ns = tm_k_gemm_fp8_splits(q->n_in, q->n_out, impl->n_sm, &kps);
    float *part = ns == 1 ? y : g->q8_part;
    TM_ASSERT(ns == 1 || (size_t)ns * T * q->n_out <= g->q8_part_floats);
    tm_k_gemm_fp8_args ga = {.part = part,
                             .w = q->w,
                             .scale = q->scale,
                             .x = x,
                             .n_tok = T,
                             .n_in = q->n_in,
                             .n_out = q->n_out,
                             .n_split = ns,
                             .k_per_split = kps,
                             .scale_kind = (tm_k_fp8_scale)q->sk};
    tm_rc rc = TM_CUDA_OP(impl, TM_CUDA_ABL_NEVER, NULL, tm_k_gemm_fp8(&ga, impl->stream, err));
    if (part_out) {
        *part_out = part, *n_part = ns, *stride = (size_t)T * q->n_out;
        return tm_cuda_op_end(impl, what, rc);
    }
    tm_k_dsv4_sum_args sa = {.y = y,
                             .part = part,
                             .stride = (size_t)T * q->n_out,
                             .n = (size_t)T * q->n_out,
                             .n_part = ns};
    if (!rc && ns > 1)
        rc = tm_k_dsv4_sum(&sa, impl->stream, err);
    return tm_cuda_op_end(impl, what, rc);
}

static float *fieldp(const tm_cuda_engine *impl, const dsv4 *g, uint32_t l, dfield f) {
    char *plane = (char *)(f.plane ? impl->v_cache : impl->k_cache) +
                  (size_t)l * impl->layer_kv_bytes;
    (void)g;
    return (float *)plane + f.off;
}

#define OP(what, launch) TM_CUDA_OP(impl, TM_CUDA_ABL_NEVER, what, (launch))

/* TP: sum buf[0..n) (fp32, device) over the ranks; nothing at tp 1. Every rank reaches the same
 * calls in the same order (the step plan is the same). */
static tm_rc tp_sum(tm_cuda_engine *impl, float *buf, size_t n, tm_err *err) {
    if (impl->tp_size < 2)
        return TM_OK;
    tm_rc rc = tm_cuda_comm_allreduce_sum(impl->comm, buf, n, TM_NCCL_F32, impl->stream, err);
    return tm_cuda_op_end(impl, "tp all-reduce", rc);
}

/* The hyper-connection pre-mix of a block (attention or MoE: its fn / base / scale / norm
 * weights) over the step's T tokens: g->h, g->post, g->comb from g->streams. */
static tm_rc hc_pre(tm_cuda_engine *impl, dsv4 *g, uint32_t T, const float *fn, const float *base,
                    const float *scale, const float *norm_w, tm_err *err) {
    tm_k_dsv4_hc_pre_args hp = {.h = g->h,
                                .post = g->post,
                                .comb = g->comb,
                                .streams = g->streams,
                                .fn = fn,
                                .base = base,
                                .scale = scale,
                                .norm_w = norm_w,
                                .mixes = g->mixes,
                                .dot_part = g->hc_part,
                                .ss_part = g->hc_part + (size_t)TM_DSV4_K_HC_SPLIT_TOK * g->mix *
                                                            TM_DSV4_K_HC_SPLIT,
                                .n_tok = T,
                                .N = g->N,
                                .D = g->D,
                                .iters = g->d.hc_iters,
                                .eps = impl->cfg.rms_eps,
                                .hc_eps = g->d.hc_eps};
    return OP("hc pre-mix", tm_k_dsv4_hc_pre(&hp, impl->stream, err));
}

static tm_rc attn_block(tm_cuda_engine *impl, dsv4 *g, uint32_t l, const tm_cuda_step *st,
                        tm_err *err) {
    const dlayer *L = &g->L[l];
    const uint32_t T = st->n_tok, D = g->D, hd = g->hd, H = g->H, ld = g->ld;
    const float eps = impl->cfg.rms_eps;
    cudaStream_t s = impl->stream;
    const int csa = L->kind == TM_DSV4_ATTN_CSA, sliding = L->kind == TM_DSV4_ATTN_SLIDING;
    const float *inv = sliding ? g->inv_main : g->inv_comp;
    const float af = sliding ? g->d.rope_main.attn_factor : g->d.rope_compress.attn_factor;
    const float afc = g->d.rope_compress.attn_factor;
    const tm_k_dsv4_seqs sq = {.pos = st->pos,
                               .tok_seq = st->tok_seq,
                               .seq_bt = st->seq_bt,
                               .block_tables = st->block_tables,
                               .block_size = impl->eng.opts.block_size};
    tm_rc rc = hc_pre(impl, g, T, L->attn_fn, L->attn_base, L->attn_scale, L->attn_norm, err);
    const float *xp = NULL;
    uint32_t np = 1;
    size_t xs = 0;
    if (!rc)
        rc = lin_part(impl, g, L, Q8_QA, "q/kv proj", L->q_a, g->h, g->qres, T, &xp, &np, &xs, err);
    // q_a's split-K partials summed by the norm (into partial 0, which nothing reads after)
    tm_k_rmsnorm_bf16_args na = {.out = g->qres_bf,
                                 .x = (float *)xp,
                                 .w = L->q_a_norm,
                                 .n_row = T,
                                 .n_col = g->qr,
                                 .eps = eps,
                                 .add = np > 1 ? xp + xs : NULL,
                                 .add_stride = xs,
                                 .n_add = np - 1};
    if (!rc)
        rc = OP("norm+rope", tm_k_rmsnorm_bf16(&na, s, err));
    if (!rc)
        rc = lin_part(impl, g, L, Q8_QB, "q/kv proj", L->q_b, g->qres_bf, g->q, T, &xp, &np, &xs,
                      err);
    tm_k_dsv4_norm_rope_args qa = {.out = g->q,
                                   .ld_out = H * hd,
                                   .x = xp,
                                   .ld_x = H * hd,
                                   .n_part = np,
                                   .x_stride = xs,
                                   .pos = st->pos,
                                   .inv_freq = inv,
                                   .attn_factor = af,
                                   .n_tok = T,
                                   .n_head = H,
                                   .dim = hd,
                                   .rd = g->rd,
                                   .norm = 1,
                                   .eps = eps};
    if (!rc)
        rc = OP("norm+rope", tm_k_dsv4_norm_rope(&qa, s, err));
    if (!rc)
        rc = lin_part(impl, g, L, Q8_KV, "q/kv proj", L->kv, g->h, g->kvr, T, &xp, &np, &xs, err);
    tm_k_dsv4_norm_rope_args ka = {.state = fieldp(impl, g, l, L->f_kv),
                                   .ld_state = ld,
                                   .slot = st->slot,
                                   .x = xp,
                                   .ld_x = hd,
                                   .n_part = np,
                                   .x_stride = xs,
                                   .w = L->kv_norm,
                                   .pos = st->pos,
                                   .inv_freq = inv,
                                   .attn_factor = af,
                                   .n_tok = T,
                                   .n_head = 1,
                                   .dim = hd,
                                   .rd = g->rd,
                                   .norm = 2,
                                   .eps = eps};
    if (!rc)
        rc = OP("norm+rope", tm_k_dsv4_norm_rope(&ka, s, err));
    if (!rc && !sliding) {
        const uint32_t cw = L->cw;
        rc = gemm(impl, "compressor proj", L->c_kvg, g->h, D, g->cbuf, 0, 2 * cw, T, D, 2 * cw,
                  err);
        tm_k_dsv4_store_args sa = {.dst = fieldp(impl, g, l, L->f_ckv),
                                   .ld = ld,
                                   .slot = st->slot,
                                   .src = g->cbuf,
                                   .ld_src = 2 * cw,
                                   .c0 = 0,
                                   .n = cw,
                                   .n_tok = T,
                                   .dst2 = fieldp(impl, g, l, L->f_cg),
                                   .c0_2 = cw};
        if (!rc)
            rc = OP("store", tm_k_dsv4_store(&sa, s, err));
    }
    if (!rc && csa) {
        const uint32_t di = g->di, Hi = g->Hi;
        rc = gemm(impl, "indexer proj", L->i_kvg, g->h, D, g->ibuf, 0, 4 * di, T, D, 4 * di, err);
        tm_k_dsv4_store_args sa = {.dst = fieldp(impl, g, l, L->f_ikv),
                                   .ld = ld,
                                   .slot = st->slot,
                                   .src = g->ibuf,
                                   .ld_src = 4 * di,
                                   .c0 = 0,
                                   .n = 2 * di,
                                   .n_tok = T,
                                   .dst2 = fieldp(impl, g, l, L->f_ig),
                                   .c0_2 = 2 * di};
        if (!rc)
            rc = OP("store", tm_k_dsv4_store(&sa, s, err));
        if (!rc)
            rc = gemm(impl, "indexer proj", L->i_qb, g->qres_bf, g->qr, g->iq, 0, Hi * di, T, g->qr,
                      Hi * di, err);
        tm_k_dsv4_norm_rope_args ia = {.out = g->iq,
                                       .ld_out = Hi * di,
                                       .x = g->iq,
                                       .ld_x = Hi * di,
                                       .pos = st->pos,
                                       .inv_freq = g->inv_comp,
                                       .attn_factor = afc,
                                       .n_tok = T,
                                       .n_head = Hi,
                                       .dim = di,
                                       .rd = g->rd,
                                       .norm = 0,
                                       .eps = eps};
        if (!rc)
            rc = OP("norm+rope", tm_k_dsv4_norm_rope(&ia, s, err));
        if (!rc)
            rc = gemm(impl, "indexer proj", L->i_w, g->h, D, g->iw, 0, Hi, T, D, Hi, err);
    }
    if (!rc && !sliding) {
        tm_k_dsv4_compress_args ca = {.comp = fieldp(impl, g, l, L->f_comp),
                                      .in_kv = fieldp(impl, g, l, L->f_ckv),
                                      .in_gate = fieldp(impl, g, l, L->f_cg),
                                      .ld = ld,
                                      .bias = L->c_bias,
                                      .norm = L->c_norm,
                                      .inv_freq = g->inv_comp,
                                      .attn_factor = afc,
                                      .sq = sq,
                                      .n_tok = T,
                                      .r = L->ratio,
                                      .dim = hd,
                                      .cw = L->cw,
                                      .rd = g->rd,
                                      .overlap = (uint32_t)csa,
                                      .eps = eps};
        rc = OP("compress", tm_k_dsv4_compress(&ca, s, err));
        if (!rc && csa) {
            ca.comp = fieldp(impl, g, l, L->f_icomp);
            ca.in_kv = fieldp(impl, g, l, L->f_ikv);
            ca.in_gate = fieldp(impl, g, l, L->f_ig);
            ca.bias = L->i_bias, ca.norm = L->i_norm, ca.dim = g->di, ca.cw = 2 * g->di;
            rc = OP("compress", tm_k_dsv4_compress(&ca, s, err));
        }
        if (!rc && csa) {
            tm_k_dsv4_index_args xa = {.sel = g->sel,
                                       .n_sel = g->n_sel,
                                       .score = g->isc,
                                       .max_entries = g->max_entries,
                                       .icomp = fieldp(impl, g, l, L->f_icomp),
                                       .ld = ld,
                                       .iq = g->iq,
                                       .iw = g->iw,
                                       .sq = sq,
                                       .n_tok = T,
                                       .n_head = g->Hi,
                                       .di = g->di,
                                       .r = L->ratio,
                                       .topk = g->d.index_topk};
            rc = OP("indexer top-k", tm_k_dsv4_index(&xa, s, err));
        }
    }
    tm_k_dsv4_attn_args aa = {.out = g->att,
                              .q = g->q,
                              .kv = fieldp(impl, g, l, L->f_kv),
                              .comp = sliding ? NULL : fieldp(impl, g, l, L->f_comp),
                              .ld = ld,
                              .sinks = L->sinks,
                              .sel = g->sel,
                              .n_sel = g->n_sel,
                              .topk = g->d.index_topk,
                              .inv_freq = inv,
                              .attn_factor = af,
                              .sq = sq,
                              .n_tok = T,
                              .H = H,
                              .hd = hd,
                              .rd = g->rd,
                              .window = g->d.window,
                              .r = L->ratio,
                              .kind = csa       ? 1u
                                      : sliding ? 0u
                                                : 2u};
    if (!rc)
        rc = OP("attention", tm_k_dsv4_attn(&aa, s, err));
    if (rc)
        return rc;
    // grouped low-rank output: group i's heads through its [olr][ing] block of o_a
    const float alpha = 1.0f, beta = 0.0f;
    cublasStatus_t bs = cublasGemmStridedBatchedEx(
        impl->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)g->olr, (int)T, (int)g->ing, &alpha, L->o_a,
        CUDA_R_16BF, (int)g->ing, (long long)g->olr * g->ing, g->att, CUDA_R_16BF, (int)(H * hd),
        (long long)g->ing, &beta, g->oa, CUDA_R_16BF, (int)(g->G * g->olr), (long long)g->olr,
        (int)g->G, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    rc = tm_cuda_op_end(impl, "o proj", blas_rc(bs, "o_a", err));
    if (!rc)
        rc = lin_part(impl, g, L, Q8_OB, "o proj", L->o_b, g->oa, g->out, T,
                      impl->tp_size < 2 ? &xp : NULL, &np, &xs, err);
    // TP: each rank's groups gave a partial o_b product, its FP8 split-K partials summed into
    // g->out by lin_part before the all-reduce
    if (impl->tp_size > 1)
        xp = g->out, np = 1, xs = 0;
    if (!rc)
        rc = tp_sum(impl, g->out, (size_t)T * D, err);
    tm_k_dsv4_hc_post_args po = {.streams = g->streams,
                                 .y = xp,
                                 .y_stride = xs,
                                 .n_part = np,
                                 .post = g->post,
                                 .comb = g->comb,
                                 .n_tok = T,
                                 .N = g->N,
                                 .D = D};
    if (!rc)
        rc = OP("hc post-mix", tm_k_dsv4_hc_post(&po, s, err));
    return rc;
}

/* One projection of the routed experts over the step's P = T * K (token, expert) pairs: out
 * [P][n_out] (MXFP4: n_split split-K partials of k_per_split inputs, in TM_MOE_MAX_PAIRS chunks of
 * pairs; bf16: one pass) = x rows pair_row[p] @ expert pair_e[p]'s w (and scale, MXFP4). */
static tm_rc experts(tm_cuda_engine *impl, dsv4 *g, float *out, const void *w, const uint8_t *scale,
                     const uint16_t *x, const uint32_t *pair_row, uint32_t n_in, uint32_t n_out,
                     uint32_t n_split, uint32_t k_per_split, uint32_t T, tm_err *err) {
    cudaStream_t s = impl->stream;
    const uint32_t P = T * g->K;
    tm_rc rc = TM_OK;
    if (g->mxfp4) {
        for (uint32_t c0 = 0; !rc && c0 < P; c0 += TM_MOE_MAX_PAIRS) {
            const uint32_t n = TM_MIN((uint32_t)TM_MOE_MAX_PAIRS, P - c0);
            tm_k_moe_mxfp4_args ma = {.part = out + (size_t)c0 * n_out,
                                      .w = w,
                                      .scale = scale,
                                      .x = x,
                                      .pair_expert = g->pair_e + c0,
                                      .pair_row = pair_row + c0,
                                      .n_pair = n,
                                      .n_expert = g->E,
                                      .max_pair_per_expert = TM_MIN(T, n),
                                      .n_in = n_in,
                                      .n_out = n_out,
                                      .n_split = n_split,
                                      .k_per_split = k_per_split};
            rc = OP("experts", tm_k_moe_mxfp4(&ma, s, err));
        }
        return rc;
    }
    tm_k_dsv4_moe_bf16_args ma = {.out = out,
                                  .w = w,
                                  .x = x,
                                  .pair_e = g->pair_e,
                                  .pair_row = pair_row,
                                  .n_pair = P,
                                  .n_out = n_out,
                                  .n_in = n_in};
    return OP("experts", tm_k_dsv4_moe_bf16(&ma, s, err));
}

static tm_rc moe_block(tm_cuda_engine *impl, dsv4 *g, uint32_t l, const tm_cuda_step *st,
                       tm_err *err) {
    const dlayer *L = &g->L[l];
    const uint32_t T = st->n_tok, D = g->D, I = g->I, E = g->E, K = g->K, P = T * K;
    cudaStream_t s = impl->stream;
    tm_rc rc = hc_pre(impl, g, T, L->ffn_fn, L->ffn_base, L->ffn_scale, L->ffn_norm, err);
    if (!rc)
        rc = gemm(impl, "router", L->router, g->h, D, g->rl, 0, E, T, D, E, err);
    tm_k_dsv4_route_args ra = {.pair_e = g->pair_e,
                               .pair_row = g->pair_row,
                               .pair_w = g->pair_w,
                               .logits = g->rl,
                               .bias = L->hash ? NULL : L->router_bias,
                               .tid2eid = L->hash ? L->tid2eid : NULL,
                               .tokens = st->tokens,
                               .n_tok = T,
                               .E = E,
                               .k = K,
                               .scoring = (uint32_t)g->d.scoring,
                               .scale = g->d.routed_scale};
    if (!rc)
        rc = OP("route", tm_k_dsv4_route(&ra, s, err));
    // MXFP4 experts of small steps: split-K (partials summed by the SwiGLU and the combine) with
    // TM_DSV4_MOE_SPLIT > 1; unsplit by default (on an H200 at Flash widths, batch 1, 8 layers:
    // 2.304 ms/step unsplit, 2.347 with 2 splits, 2.375 with 4; bench/RESULTS.md)
    uint32_t ms = 1, kgu = TM_CEIL_DIV(D, 128u) * 128, kdn = TM_CEIL_DIV(I, 128u) * 128;
    const size_t p_max = (size_t)impl->eng.opts.max_batched_tokens * K;
    if (g->mxfp4 && g->moe_split > 1 && T <= TM_QUANT_MAX_TOK && P <= TM_MOE_MAX_PAIRS) {
        ms = (uint32_t)TM_MIN((size_t)TM_MIN(g->moe_split, 4u), p_max / P);
        ms = TM_MAX(ms, 1u);
        kgu = TM_CEIL_DIV(TM_CEIL_DIV(D, ms), 128u) * 128;
        kdn = TM_CEIL_DIV(TM_CEIL_DIV(I, ms), 128u) * 128;
    }
    const uint32_t ns_gu = TM_CEIL_DIV(D, kgu), ns_dn = TM_CEIL_DIV(I, kdn);
    if (!rc)
        rc = experts(impl, g, g->gu, L->gu_w, L->gu_s, g->h, g->pair_row, D, 2 * I, ns_gu, kgu, T,
                     err);
    tm_k_dsv4_swiglu_args sw = {.act = g->act,
                                .gu = g->gu,
                                .stride = (size_t)P * 2 * I,
                                .n_part = g->mxfp4 ? ns_gu : 1,
                                .n_row = P,
                                .n = I,
                                .limit = g->d.swiglu_limit};
    if (!rc)
        rc = OP("swiglu", tm_k_dsv4_swiglu(&sw, s, err));
    if (!rc)
        rc = experts(impl, g, g->dn, L->dn_w, L->dn_s, g->act, g->iota, I, D, ns_dn, kdn, T, err);
    // shared expert
    const float *xp = NULL;
    uint32_t np = 1;
    size_t xs = 0;
    if (!rc)
        rc = lin_part(impl, g, L, Q8_SHGU, "shared expert", L->sh_gu, g->h, g->sh_gu_o, T, &xp, &np,
                      &xs, err);
    // the fused weight puts gate rows then up rows: row t of the output is [gate | up]
    tm_k_dsv4_swiglu_args ss = {.act = g->sh_act,
                                .gu = xp,
                                .stride = xs,
                                .n_part = np,
                                .n_row = T,
                                .n = I,
                                .limit = g->d.swiglu_limit};
    if (!rc)
        rc = OP("swiglu", tm_k_dsv4_swiglu(&ss, s, err));
    if (!rc)
        rc = lin_part(impl, g, L, Q8_SHDN, "shared expert", L->sh_down, g->sh_act, g->sh_dn, T, &xp,
                      &np, &xs, err);
    tm_k_dsv4_combine_args ca = {.y = g->out,
                                 .dn = g->dn,
                                 .dn_stride = (size_t)P * D,
                                 .dn_part = g->mxfp4 ? ns_dn : 1,
                                 .sh = xp,
                                 .sh_stride = xs,
                                 .sh_part = np,
                                 .pair_e = g->pair_e,
                                 .pair_w = g->pair_w,
                                 .n_tok = T,
                                 .k = K,
                                 .D = D};
    if (!rc)
        rc = OP("combine", tm_k_dsv4_combine(&ca, s, err));
    if (!rc) // TP: routed + shared partial down products of this rank's expert width
        rc = tp_sum(impl, g->out, (size_t)T * D, err);
    tm_k_dsv4_hc_post_args po = {.streams = g->streams,
                                 .y = g->out,
                                 .n_part = 1,
                                 .post = g->post,
                                 .comb = g->comb,
                                 .n_tok = T,
                                 .N = g->N,
                                 .D = D};
    if (!rc)
        rc = OP("hc post-mix", tm_k_dsv4_hc_post(&po, s, err));
    return rc;
}

static tm_rc forward(tm_cuda_engine *impl, const tm_cuda_step *st, tm_err *err) {
    dsv4 *g = impl->arch_state;
    const tm_model_cfg *c = &impl->cfg;
    cudaStream_t s = impl->stream;
    tm_k_dsv4_embed_args ea = {.streams = g->streams,
                               .embd = g->embd,
                               .tokens = st->tokens,
                               .n_tok = st->n_tok,
                               .n_hc = g->N,
                               .D = g->D,
                               .vocab0 = g->sh.vocab0,
                               .n_vocab = g->sh.n_vocab,
                               .sliced = impl->tp_size > 1};
    tm_rc rc = OP("embed", tm_k_dsv4_embed(&ea, s, err));
    if (!rc) // TP: vocab-parallel, one rank gave each token's row (exact)
        rc = tp_sum(impl, g->streams, (size_t)st->n_tok * g->N * g->D, err);
    for (uint32_t l = 0; !rc && l < c->n_layer; l++) {
        rc = attn_block(impl, g, l, st, err);
        if (!rc)
            rc = moe_block(impl, g, l, st, err);
    }
    if (rc || st->n_want == 0)
        return rc;
    tm_k_dsv4_head_args ha = {.out = g->last,
                              .streams = g->streams,
                              .rows = st->want_row,
                              .fn = g->hc_fn,
                              .base = g->hc_base,
                              .scale = g->hc_scale,
                              .norm_w = g->out_norm,
                              .mixes = g->mixes,
                              .n_row = st->n_want,
                              .N = g->N,
                              .D = g->D,
                              .eps = c->rms_eps,
                              .hc_eps = g->d.hc_eps};
    rc = OP("hc head", tm_k_dsv4_head(&ha, s, err));
    // the logits rows compact, [n_want][the rank's n_vocab], as the runtime's gather and argmax
    // read them (impl->v_stride, v_per with TP, sizes the buffer: the last rank's rows are
    // shorter when the vocabulary does not divide by tp)
    if (!rc)
        rc = gemm(impl, "lm_head", g->lm_head, g->last, g->D, impl->logits, 0, c->n_vocab,
                  st->n_want, g->D, c->n_vocab, err);
    return rc;
}

const tm_cuda_arch tm_cuda_arch_dsv4 = {
    .name = "dsv4",
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
