/* runner/engine/cuda/llama.c - the Llama family on the CUDA engine (tm_cuda_arch_llama, arch.h):
 * Llama, Qwen2 (q/k/v bias), Mistral (sliding window); tied or untied lm_head. Its weights on
 * the device, its activations, and its forward pass over a packed step.
 *
 * A step stacks the tokens of all its sequences (prefill chunks and decodes mixed) into one
 * [T][dim] activation matrix, as the CPU engine does. Per layer:
 *   rmsnorm(x) -> h (bf16); qkv = h @ Wqkv^T (fused q|k|v weight, fp32 out);
 *   rope_kv: bias, RoPE, q -> bf16, k/v -> paged cache; attn_paged -> att (bf16);
 *   x += att @ Wo^T (GEMM beta = 1); rmsnorm(x) -> h; gu = h @ Wgu^T (fused gate|up, fp32);
 *   act = silu(gate) * up (bf16); x += act @ Wdown^T.
 * Then the final norm gathers only the rows whose logits are wanted, and lm_head runs on them.
 * With the skinny projections (decode steps) a residual projection leaves split-K partials that
 * the next RMSNorm adds into x.
 *
 * Tensor parallel (impl->tp_size > 1): the weights are this rank's shard (runner/tp/shard.h:
 * query heads, KV heads or a replicated one, MLP rows and columns, a vocabulary slice of the
 * embedding and LM head). The embedding is gathered from the slice (zeros elsewhere) and summed
 * across ranks; o_proj and down_proj write rank 0's partial product plus the residual (GEMM beta
 * 1) and the other ranks' partial products alone (beta 0) into x, and an all-reduce (fp32 sum, in
 * place; the one-shot peer-memory kernel fused with the next RMSNorm for decode-sized steps, else
 * NCCL) makes x the full residual stream on every rank. Those branches live in three helpers
 * (embed, residual_reduce, residual_norm); the layer loop reads the same with and without TP.
 * Every op goes through TM_CUDA_OP or tm_cuda_project (engine_cuda_int.h), which skip ablated
 * ops and place the profiling marks.
 *
 * Weights are bf16 on the device (f32/f16 checkpoints rounded once, at upload); norm weights,
 * biases and the RoPE table fp32. FP8 checkpoints (engine_cuda.h) keep the seven linears of a
 * layer as e4m3 bytes and scales (cuda_lin): decode-sized steps run kernels/gemm_quant.h with
 * the same split-K partials as gemm_skinny, longer ones dequantize the weight into a bf16
 * scratch (kernels/dequant.h) for cuBLAS. q|k|v and gate|up share one fused weight whenever the
 * scales allow it (per-channel always; 128 x 128 blocks when every part's row count is a
 * multiple of 128); otherwise each part is its own launch and its partials are summed into its
 * columns of the fused output, so the consumers read the same layout either way.
 * TM_CUDA_FP8_VARIANT (mma|cvt|fma) and TM_CUDA_FP8_DEPTH (4|8) pick the FP8 decode kernel's
 * variant and pipeline depth, for benchmarks. Engine thread only; nothing allocates after init. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/log.h"
#include "kernels/act.h"
#include "kernels/allreduce.h"
#include "kernels/attn_paged.h"
#include "kernels/attn_prefill.h"
#include "kernels/common.h"
#include "kernels/dequant.h"
#include "kernels/embed.h"
#include "kernels/fill.h"
#include "kernels/gemm_quant.h"
#include "kernels/gemm_skinny.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/tp.h"
#include "runner/engine/cuda/lt_fp8.h"
#include "runner/engine/cuda/engine_cuda.h"
#include "runner/engine/cuda/engine_cuda_int.h"
#include "runner/engine/cuda/weights.h"
#include "runner/tp/shard.h"

#define ATTN_PART_HEADS 4096              /* (token, head, split) partials the attention may use */
#define UPLOAD_CHUNK TM_CUDA_UPLOAD_CHUNK /* elements converted per host staging pass */
#define LT_WS_BYTES ((size_t)32 << 20)    /* cuBLASLt workspace */
#define FP8_BLOCK 128                     /* the block side of kernels/gemm_quant.h */

/* A linear (or a fused group of them) on the device: bf16 rows, or e4m3 rows with scales in the
 * layouts of kernels/gemm_quant.h. fp8 and sk are set at init, the rest at carve. */
typedef struct cuda_lin {
    void *w;          /* [n_out][n_in] bf16, or e4m3 when fp8 */
    void *scale;      /* fp8: by sk, fp32 [ceil(n_out/128)][ceil(n_in/128)] or e8m0 bytes of
                       * that grid (block) or fp32 [n_out] (channel); NULL otherwise */
    float *scale_f32; /* e8m0 block scales only: the same grid as fp32 (cuBLASLt's W8A8 prefill
                       * takes fp32 block scales); NULL otherwise */
    uint32_t n_out, n_in;
    uint8_t fp8;
    tm_k_fp8_scale sk;
} cuda_lin;

typedef struct cuda_layer {
    /* n_qkv 1: one fused weight [q_dim + 2*kv_dim][n_embd], wq rows, then wk, then wv; 3: wq,
     * wk, wv apart (FP8 block scales whose row counts are not multiples of 128) */
    cuda_lin qkv[3];
    uint32_t n_qkv;
    cuda_lin o;     /* [n_embd][q_dim] */
    cuda_lin gu[2]; /* n_gu 1: fused [2*n_ff][n_embd], w_gate rows, then w_up; 2: apart */
    uint32_t n_gu;
    cuda_lin down;    /* [n_embd][n_ff] */
    float *b_qkv;     /* [q_dim + 2*kv_dim] fp32, NULL without bias */
    float *attn_norm; /* [n_embd] fp32 */
    float *ffn_norm;  /* [n_embd] fp32 */
} cuda_layer;

/* impl->arch_state. Device pointers unless marked host. */
typedef struct llama {
    uint32_t q_dim, qkv_dim; /* kv_dim is impl->kv_dim */
    /* weights (impl->w_arena) */
    uint16_t *embd;     /* [n_vocab][n_embd] */
    uint16_t *lm_head;  /* [n_vocab][n_embd]; == embd when tied */
    float *out_norm;    /* [n_embd] */
    float *inv_freq;    /* [head_dim/2] */
    cuda_layer *layers; /* host array of n_layer, owned */
    /* activations (impl->a_arena); T = max_batched_tokens, S = max_seqs */
    float *x;    /* [T][n_embd] residual stream */
    float *qkv;  /* [T][qkv_dim] */
    float *gu;   /* [T][2*n_ff] */
    float *part; /* attention split partials */
    size_t part_floats;
    uint16_t *h;      /* [T][n_embd] normed */
    uint16_t *q;      /* [T][q_dim] rotated */
    uint16_t *att;    /* [T][q_dim] */
    uint16_t *ffa;    /* [T][n_ff] */
    uint16_t *last;   /* [max rows][n_embd] final-normed wanted rows */
    uint16_t *wdq;    /* [wdq_elems] bf16: an FP8 weight dequantized (prefill steps) */
    size_t wdq_elems; /* 0: no FP8 linear */
    /* W8A8 prefill through cuBLASLt (lt_fp8.h): the handle (NULL: off, TM_CUDA_FP8_PREFILL=
     * dequant or no algorithm), which modes it has an algorithm for, the quantized activations
     * [T][max_in] e4m3 with their scales (at most [max_in/128][T] floats), the workspace */
    tm_lt_fp8 *lt;
    int lt_mode_ok[2];
    uint8_t *xq;
    float *xs;
    void *lt_ws;
    uint32_t max_in; /* the widest projection input: max(n_embd, q_dim, n_ff) */
    /* the FP8 decode GEMM's variant and depth (kernels/gemm_quant.h; 0: its defaults), from
     * TM_CUDA_FP8_VARIANT=mma|cvt|fma and TM_CUDA_FP8_DEPTH=4|8 (benchmarks) */
    tm_k_quant_variant fp8_variant;
    uint32_t fp8_depth;
} llama;

/* ---- config ---- */

static tm_rc check_cfg(const tm_model_cfg *c, tm_err *err) {
    if (!c->n_layer || !c->n_embd || !c->n_ff || !c->n_head || !c->n_kv_head || !c->head_dim ||
        !c->n_vocab)
        return TM_ERR(err, TM_E_INVAL, "cuda engine: zero dimension in model config");
    if (c->n_head % c->n_kv_head)
        return TM_ERR(err, TM_E_INVAL, "cuda engine: n_head %u not a multiple of n_kv_head %u",
                      c->n_head, c->n_kv_head);
    if (c->head_dim % 8 || c->head_dim > TM_ATTN_MAX_HEAD_DIM)
        return TM_ERR(err, TM_E_INVAL,
                      "cuda engine: head_dim %u unsupported (multiple of 8, at most %u)",
                      c->head_dim, TM_ATTN_MAX_HEAD_DIM);
    if (!(c->rope_theta > 0.0f))
        return TM_ERR(err, TM_E_INVAL, "cuda engine: rope_theta %g", (double)c->rope_theta);
    if (c->rope_type == TM_ROPE_LLAMA3 &&
        (!(c->rope_factor > 0.0f) || c->rope_high_freq_factor == c->rope_low_freq_factor ||
         !(c->rope_low_freq_factor > 0.0f) || !(c->rope_high_freq_factor > 0.0f) ||
         c->rope_orig_ctx == 0))
        return TM_ERR(err, TM_E_INVAL, "cuda engine: bad llama3 rope scaling parameters");
    return TM_OK;
}

/* The device format of a checkpoint linear: fp8 and sk of *f (its other fields untouched).
 * TM_E_INVAL naming the tensor for a scheme the kernels do not take. */
static tm_rc lin_fmt(const tm_tensor *t, uint32_t layer, const char *name, cuda_lin *f,
                     tm_err *err) {
    f->fp8 = t->quant != TM_QUANT_NONE;
    f->sk = TM_K_FP8_CHANNEL;
    switch ((tm_quant)t->quant) {
    case TM_QUANT_NONE:
    case TM_QUANT_FP8_CHANNEL:
    case TM_QUANT_FP8_TENSOR:
        return TM_OK; // a per-tensor scale is uploaded as per-channel
    case TM_QUANT_FP8_BLOCK:
        if (t->qblock[0] != FP8_BLOCK || t->qblock[1] != FP8_BLOCK)
            return TM_ERR(err, TM_E_INVAL,
                          "cuda engine: layer %u %s: fp8 blocks of %u x %u (the CUDA kernels "
                          "take 128 x 128)",
                          layer, name, t->qblock[0], t->qblock[1]);
        f->sk = t->scale_dtype == TM_DTYPE_F8_E8M0 ? TM_K_FP8_BLOCK_E8M0 : TM_K_FP8_BLOCK_F32;
        return TM_OK;
    case TM_QUANT_MXFP4:
        break;
    }
    return TM_ERR(err, TM_E_INVAL, "cuda engine: layer %u %s: %s weights are not supported", layer,
                  name, tm_quant_name((tm_quant)t->quant));
}

static int same_fmt(const cuda_lin *a, const cuda_lin *b) {
    return a->fp8 == b->fp8 && (!a->fp8 || a->sk == b->sk);
}

/* The formats of layer l's linears (the parts of a fused group in [0], [1], [2] as they come). */
static tm_rc layer_fmts(const tm_layer_w *W, uint32_t l, cuda_layer *L, tm_err *err) {
    tm_rc rc = lin_fmt(&W->wq, l, "q_proj", &L->qkv[0], err);
    if (!rc)
        rc = lin_fmt(&W->wk, l, "k_proj", &L->qkv[1], err);
    if (!rc)
        rc = lin_fmt(&W->wv, l, "v_proj", &L->qkv[2], err);
    if (!rc)
        rc = lin_fmt(&W->wo, l, "o_proj", &L->o, err);
    if (!rc)
        rc = lin_fmt(&W->w_gate, l, "gate_proj", &L->gu[0], err);
    if (!rc)
        rc = lin_fmt(&W->w_up, l, "up_proj", &L->gu[1], err);
    if (!rc)
        rc = lin_fmt(&W->w_down, l, "down_proj", &L->down, err);
    if (!rc && (!same_fmt(&L->qkv[0], &L->qkv[1]) || !same_fmt(&L->qkv[0], &L->qkv[2])))
        rc = TM_ERR(err, TM_E_INVAL,
                    "cuda engine: layer %u: q_proj, k_proj and v_proj in different formats", l);
    if (!rc && !same_fmt(&L->gu[0], &L->gu[1]))
        rc = TM_ERR(err, TM_E_INVAL,
                    "cuda engine: layer %u: gate_proj and up_proj in different formats", l);
    return rc;
}

static tm_rc check_weights(const tm_model *m, tm_err *err) {
    tm_rc rc = tm_model_check_weights_quant(m, "cuda engine", err);
    for (uint32_t l = 0; !rc && l < m->cfg.n_layer; l++) {
        cuda_layer L;
        rc = layer_fmts(&m->layers[l], l, &L, err);
    }
    return rc;
}

/* The split of runner/tp/shard.h (which upload's tm_shard_create cuts the weights by). */
static tm_rc shard_cfg(const tm_model_cfg *c, uint32_t rank, uint32_t tp, tm_model_cfg *s,
                       uint32_t *vocab0, uint32_t *v_per, tm_err *err) {
    if (rank >= tp)
        return TM_ERR(err, TM_E_INVAL, "cuda engine: tp rank %u of %u", rank, tp);
    tm_shard_split sp;
    tm_rc rc = tm_shard_split_init(&sp, c, rank, tp, "cuda engine", err);
    if (rc)
        return rc;
    *s = sp.cfg;
    *v_per = sp.v_per;
    *vocab0 = sp.vocab0;
    if (s->n_vocab == 0)
        return TM_ERR(err, TM_E_INVAL, "cuda engine: vocabulary of %u too small for tp %u",
                      c->n_vocab, tp);
    return TM_OK;
}

static uint32_t kv_dim(const tm_model_cfg *c) { return c->n_kv_head * c->head_dim; }

// Prefill attention on tensor cores for head_dim 64/128.
static int prefill_tiles(const tm_model_cfg *c) { return tm_k_attn_prefill_supported(c->head_dim); }

static void fini(tm_cuda_engine *impl) {
    llama *lm = impl->arch_state;
    if (!lm)
        return;
    tm_lt_fp8_destroy(lm->lt);
    tm_free(lm->layers);
    tm_free(lm);
    impl->arch_state = NULL;
}

static tm_rc init(tm_cuda_engine *impl, tm_err *err) {
    const tm_model_cfg *c = &impl->cfg;
    llama *lm = tm_calloc(1, sizeof(*lm));
    impl->arch_state = lm;
    if (lm)
        lm->layers = tm_calloc(c->n_layer, sizeof(cuda_layer));
    if (!lm || !lm->layers)
        return TM_ERR(err, TM_E_NOMEM, "cuda engine: %u layers", c->n_layer);
    lm->q_dim = c->n_head * c->head_dim;
    lm->qkv_dim = lm->q_dim + 2 * impl->kv_dim;
    // attention partials (attn_splits splits less when a step's would not fit)
    lm->part_floats = tm_k_attn_part_floats(1, ATTN_PART_HEADS, 1, c->head_dim);
    const char *fv = getenv("TM_CUDA_FP8_VARIANT"), *fd = getenv("TM_CUDA_FP8_DEPTH");
    lm->fp8_variant = !fv                  ? TM_K_QUANT_DEFAULT
                      : !strcmp(fv, "mma") ? TM_K_QUANT_MMA
                      : !strcmp(fv, "cvt") ? TM_K_QUANT_MMA_CVT
                      : !strcmp(fv, "fma") ? TM_K_QUANT_FMA
                                           : TM_K_QUANT_DEFAULT;
    lm->fp8_depth = fd && (!strcmp(fd, "4") || !strcmp(fd, "8")) ? (uint32_t)atoi(fd) : 0;
    const tm_model *m = impl->eng.model;
    const int quant = impl->random ? impl->random_fmt != TM_CUDA_W_BF16 : tm_model_is_quantized(m);
    if (quant && impl->tp_size > 1)
        return TM_ERR(err, TM_E_INVAL,
                      "cuda engine: tensor parallel with quantized (FP8) weights is not "
                      "supported; run it on one GPU");
    for (uint32_t l = 0; l < c->n_layer; l++) {
        cuda_layer *L = &lm->layers[l];
        if (impl->random) {
            const cuda_lin f = {
                .fp8 = impl->random_fmt != TM_CUDA_W_BF16,
                .sk = impl->random_fmt == TM_CUDA_W_FP8_BLOCK_E8M0 ? TM_K_FP8_BLOCK_E8M0
                      : impl->random_fmt == TM_CUDA_W_FP8_CHANNEL  ? TM_K_FP8_CHANNEL
                                                                   : TM_K_FP8_BLOCK_F32};
            L->qkv[0] = L->qkv[1] = L->qkv[2] = L->o = L->gu[0] = L->gu[1] = L->down = f;
        } else if (m->layers) {
            tm_rc rc = layer_fmts(&m->layers[l], l, L, err);
            if (rc)
                return rc;
        }
        // Fuse unless block scales straddle a part boundary.
        const int blk = L->qkv[0].fp8 && L->qkv[0].sk != TM_K_FP8_CHANNEL;
        L->n_qkv = blk && (lm->q_dim % FP8_BLOCK || impl->kv_dim % FP8_BLOCK) ? 3 : 1;
        const int blk_gu = L->gu[0].fp8 && L->gu[0].sk != TM_K_FP8_CHANNEL;
        L->n_gu = blk_gu && c->n_ff % FP8_BLOCK ? 2 : 1;
        // the dequantization scratch: the largest FP8 projection
        const size_t d = c->n_embd;
        if (L->qkv[0].fp8)
            lm->wdq_elems = TM_MAX(lm->wdq_elems, (size_t)lm->qkv_dim * d);
        if (L->o.fp8)
            lm->wdq_elems = TM_MAX(lm->wdq_elems, (size_t)lm->q_dim * d);
        if (L->gu[0].fp8)
            lm->wdq_elems = TM_MAX(lm->wdq_elems, (size_t)2 * c->n_ff * d);
        if (L->down.fp8)
            lm->wdq_elems = TM_MAX(lm->wdq_elems, (size_t)c->n_ff * d);
    }
    return TM_OK;
}

/* Rows of the parts of layer L's q|k|v and gate|up groups. */
static void group_rows(const tm_cuda_engine *impl, const llama *lm, uint32_t qkv[3],
                       uint32_t gu[2]) {
    qkv[0] = lm->q_dim, qkv[1] = qkv[2] = impl->kv_dim;
    gu[0] = gu[1] = impl->cfg.n_ff;
}

/* Floats of sk_part for the model's projections at up to T tokens. */
static size_t skinny_floats(const tm_cuda_engine *impl, uint32_t T) {
    const llama *lm = impl->arch_state;
    const tm_model_cfg *c = &impl->cfg;
    const uint32_t shapes[5][2] = {{c->n_embd, lm->qkv_dim},
                                   {lm->q_dim, c->n_embd},
                                   {c->n_embd, 2 * c->n_ff},
                                   {c->n_ff, c->n_embd},
                                   {c->n_embd, c->n_vocab}};
    size_t most = 0;
    for (int i = 0; i < 5; i++) {
        uint32_t kps = 0;
        if (!tm_k_gemm_skinny_fits(T, shapes[i][0], shapes[i][1]))
            continue;
        const uint32_t n = tm_k_gemm_skinny_splits(shapes[i][0], shapes[i][1], impl->n_sm, &kps);
        most = TM_MAX(most, (size_t)n * T * shapes[i][1]);
    }
    // FP8 projections: each launch (a fused group, or a part of one) with its own split
    uint32_t rq[3], rg[2];
    group_rows(impl, lm, rq, rg);
    for (uint32_t l = 0; l < c->n_layer; l++) {
        const cuda_layer *L = &lm->layers[l];
        uint32_t sh[8][2], n = 0; // (n_in, n_out) of its FP8 launches
        if (L->qkv[0].fp8) {
            if (L->n_qkv == 1)
                sh[n][0] = c->n_embd, sh[n++][1] = lm->qkv_dim;
            else
                for (int i = 0; i < 3; i++)
                    sh[n][0] = c->n_embd, sh[n++][1] = rq[i];
        }
        if (L->o.fp8)
            sh[n][0] = lm->q_dim, sh[n++][1] = c->n_embd;
        if (L->gu[0].fp8) {
            if (L->n_gu == 1)
                sh[n][0] = c->n_embd, sh[n++][1] = 2 * c->n_ff;
            else
                for (int i = 0; i < 2; i++)
                    sh[n][0] = c->n_embd, sh[n++][1] = rg[i];
        }
        if (L->down.fp8)
            sh[n][0] = c->n_ff, sh[n++][1] = c->n_embd;
        for (uint32_t i = 0; i < n; i++) {
            uint32_t kps = 0;
            if (!tm_k_gemm_fp8_fits(T, sh[i][0], sh[i][1]))
                continue;
            const uint32_t ns = tm_k_gemm_fp8_splits(sh[i][0], sh[i][1], impl->n_sm, &kps);
            most = TM_MAX(most, (size_t)ns * T * sh[i][1]);
        }
    }
    return most;
}

/* ---- memory ---- */

/* Bytes of the scales of an FP8 [n_out][n_in] weight in format sk. */
static size_t scale_bytes(tm_k_fp8_scale sk, size_t n_out, size_t n_in) {
    if (sk == TM_K_FP8_CHANNEL)
        return n_out * sizeof(float);
    const size_t n = TM_CEIL_DIV(n_out, (size_t)FP8_BLOCK) * TM_CEIL_DIV(n_in, (size_t)FP8_BLOCK);
    return sk == TM_K_FP8_BLOCK_E8M0 ? n : n * sizeof(float);
}

/* Carve one linear of n_out x n_in in f's format (bf16 weights carve exactly as before FP8). */
static void carve_lin(tm_cuda_carver *cv, cuda_lin *f, uint32_t n_out, uint32_t n_in) {
    f->n_out = n_out, f->n_in = n_in;
    f->w = tm_cuda_carve(cv, (size_t)n_out * n_in * (f->fp8 ? 1 : sizeof(uint16_t)));
    f->scale = f->fp8 ? tm_cuda_carve(cv, scale_bytes(f->sk, n_out, n_in)) : NULL;
    f->scale_f32 = f->fp8 && f->sk == TM_K_FP8_BLOCK_E8M0
                       ? tm_cuda_carve(cv, scale_bytes(TM_K_FP8_BLOCK_F32, n_out, n_in))
                       : NULL;
}

/* n e8m0 block scales (host bytes) into dst->scale_f32 as fp32: 2^(e - 127) exactly (byte 0 is
 * the fp32 subnormal 2^-127), byte 255 NaN, as kernels/gemm_quant.h reads them. f: n floats of
 * host staging. */
static tm_rc upload_e8m0_f32(const cuda_lin *dst, const uint8_t *e, size_t n, float *f,
                             tm_err *err) {
    for (size_t i = 0; i < n; i++)
        f[i] = e[i] == 255 ? NAN : ldexpf(1.0f, (int)e[i] - 127);
    return TM_CUDA_CHECK(cudaMemcpy(dst->scale_f32, f, n * sizeof(float), cudaMemcpyHostToDevice),
                         err);
}

/* A group of parts (rows[i] rows each, n_in columns): one fused linear when n == 1. */
static void carve_group(tm_cuda_carver *cv, cuda_lin *g, uint32_t n, const uint32_t *rows,
                        uint32_t n_parts, uint32_t n_in) {
    if (n == 1) {
        uint32_t total = 0;
        for (uint32_t i = 0; i < n_parts; i++)
            total += rows[i];
        carve_lin(cv, &g[0], total, n_in);
        return;
    }
    for (uint32_t i = 0; i < n; i++)
        carve_lin(cv, &g[i], rows[i], n_in);
}

/* Part i of a group as a linear of its own (a view into the fused weight when n == 1: the rows
 * before it skipped in the weight and, block rows being whole, in the scales). */
static cuda_lin group_part(const cuda_lin *g, uint32_t n, const uint32_t *rows, uint32_t i) {
    if (n > 1)
        return g[i];
    cuda_lin p = g[0];
    size_t r0 = 0;
    for (uint32_t j = 0; j < i; j++)
        r0 += rows[j];
    p.n_out = rows[i];
    p.w = (char *)p.w + r0 * p.n_in * (p.fp8 ? 1 : sizeof(uint16_t));
    if (p.fp8) {
        TM_ASSERT(p.sk == TM_K_FP8_CHANNEL || r0 % FP8_BLOCK == 0);
        p.scale = (char *)p.scale +
                  (p.sk == TM_K_FP8_CHANNEL ? r0 * sizeof(float) : scale_bytes(p.sk, r0, p.n_in));
        if (p.scale_f32)
            p.scale_f32 =
                (float *)((char *)p.scale_f32 + scale_bytes(TM_K_FP8_BLOCK_F32, r0, p.n_in));
    }
    return p;
}

static void carve_weights(tm_cuda_engine *impl, tm_cuda_carver *cv) {
    llama *lm = impl->arch_state;
    const tm_model_cfg *c = &impl->cfg;
    const size_t d = c->n_embd, bf = sizeof(uint16_t), f4 = sizeof(float);
    uint32_t rq[3], rg[2];
    group_rows(impl, lm, rq, rg);
    lm->embd = tm_cuda_carve(cv, (size_t)c->n_vocab * d * bf);
    lm->lm_head = c->tie_embd ? lm->embd : tm_cuda_carve(cv, (size_t)c->n_vocab * d * bf);
    lm->out_norm = tm_cuda_carve(cv, d * f4);
    lm->inv_freq = tm_cuda_carve(cv, c->head_dim / 2 * f4);
    for (uint32_t l = 0; l < c->n_layer; l++) {
        cuda_layer *L = &lm->layers[l];
        carve_group(cv, L->qkv, L->n_qkv, rq, 3, c->n_embd);
        carve_lin(cv, &L->o, c->n_embd, lm->q_dim);
        carve_group(cv, L->gu, L->n_gu, rg, 2, c->n_embd);
        carve_lin(cv, &L->down, c->n_embd, c->n_ff);
        L->b_qkv = c->qkv_bias ? tm_cuda_carve(cv, lm->qkv_dim * f4) : NULL;
        L->attn_norm = tm_cuda_carve(cv, d * f4);
        L->ffn_norm = tm_cuda_carve(cv, d * f4);
    }
}

static void carve_acts(tm_cuda_engine *impl, tm_cuda_carver *cv) {
    llama *lm = impl->arch_state;
    const tm_model_cfg *c = &impl->cfg;
    const size_t T = impl->eng.opts.max_batched_tokens;
    const size_t d = c->n_embd, ff = c->n_ff, bf = sizeof(uint16_t), f4 = sizeof(float);
    // the fp32 projection outputs: rows up to the W8A8 GEMM's padded token count (lt_fp8.h)
    const size_t T4 = TM_LT_FP8_TOK(T);
    lm->x = tm_cuda_carve(cv, T4 * d * f4);
    lm->qkv = tm_cuda_carve(cv, T4 * lm->qkv_dim * f4);
    lm->gu = tm_cuda_carve(cv, T4 * 2 * ff * f4);
    lm->part = tm_cuda_carve(cv, lm->part_floats * f4);
    lm->h = tm_cuda_carve(cv, T * d * bf);
    lm->q = tm_cuda_carve(cv, T * lm->q_dim * bf);
    lm->att = tm_cuda_carve(cv, T * lm->q_dim * bf);
    lm->ffa = tm_cuda_carve(cv, T * ff * bf);
    lm->last = tm_cuda_carve(cv, tm_engine_max_rows(&impl->eng.opts) * d * bf);
    lm->wdq = lm->wdq_elems ? tm_cuda_carve(cv, lm->wdq_elems * bf) : NULL;
    lm->max_in = TM_MAX(TM_MAX((uint32_t)d, lm->q_dim), (uint32_t)ff);
    const int lt = lm->wdq_elems && T > impl->sk_max_tok;
    lm->xq = lt ? tm_cuda_carve(cv, T4 * lm->max_in) : NULL;
    lm->xs = lt ? tm_cuda_carve(cv, T4 * TM_CEIL_DIV(lm->max_in, 128) * f4) : NULL;
    lm->lt_ws = lt ? tm_cuda_carve(cv, LT_WS_BYTES) : NULL;
}

/* The cuBLASLt W8A8 prefill path, after the carves (lm->lt stays NULL if off or unavailable:
 * prefill then dequantizes the weight and runs bf16, W8A16). TM_CUDA_FP8_PREFILL: auto (the
 * default: W8A8 for 128 x 128 block-scaled weights, fp32 or e8m0 scales (the latter through their
 * fp32 copy, cuda_lin.scale_f32), whose 1 x 128 activation groups keep the
 * logits within the bf16 checks' bounds; channel-scaled weights dequantize, because one scale
 * per token was measured 2.5x past them), w8a8 (both), dequant (neither). A mode is used only if
 * cuBLASLt has an algorithm for the model's projection shape at a prefill size. */
static void lt_setup(tm_cuda_engine *impl, llama *lm) {
    const char *env = getenv("TM_CUDA_FP8_PREFILL");
    if (!lm->xq || (env && !strcmp(env, "dequant")))
        return;
    tm_err e = {0};
    if (tm_lt_fp8_create(impl->stream, lm->lt_ws, LT_WS_BYTES, &lm->lt, &e)) {
        TM_LOG_WARN("cuda", "FP8 prefill dequantizes (%s)", e.msg);
        return;
    }
    const uint32_t d = impl->cfg.n_embd, T = impl->sk_max_tok + 1;
    const int all = env && !strcmp(env, "w8a8");
    for (int m = 0; m < 2; m++) {
        lm->lt_mode_ok[m] = (m == TM_LT_FP8_BLOCK || all) &&
                            tm_lt_fp8_fits((tm_lt_fp8_mode)m, d, lm->q_dim) &&
                            tm_lt_fp8_probe(lm->lt, (tm_lt_fp8_mode)m, T, d, lm->q_dim, &e);
        if (!lm->lt_mode_ok[m] && e.msg[0])
            TM_LOG_WARN("cuda", "FP8 prefill dequantizes for %s scales (%s)",
                        m == TM_LT_FP8_BLOCK ? "block" : "channel", e.msg);
        e.msg[0] = 0;
    }
}

/* ---- weights ---- */

/* Copy t (a small vector, any dtype) to dst as fp32. */
static tm_rc upload_f32(float *dst, const tm_tensor *t, uint16_t *stage, tm_err *err) {
    const size_t n = (size_t)tm_tensor_n_elem(t);
    TM_ASSERT(n <= UPLOAD_CHUNK);
    float *f = (float *)(stage + UPLOAD_CHUNK);
    tm_dtype_to_f32(t->data, t->dtype, 0, n, f);
    return TM_CUDA_CHECK(cudaMemcpy(dst, f, n * sizeof(float), cudaMemcpyHostToDevice), err);
}

/* A checkpoint linear t into dst (t's format: lin_fmt): bf16 as tm_cuda_upload_bf16; FP8 as its
 * bytes, its scales as fp32 (a per-tensor scale repeated per row) or, e8m0 block scales, as bytes.
 */
static tm_rc upload_lin(const cuda_lin *dst, const tm_tensor *t, uint16_t *stage, tm_err *err) {
    if (!dst->fp8)
        return tm_cuda_upload_bf16(dst->w, t, stage, (float *)(stage + UPLOAD_CHUNK), err);
    TM_ASSERT(t->dtype == TM_DTYPE_F8_E4M3 && t->shape[0] == dst->n_out &&
              t->shape[1] == dst->n_in);
    tm_rc rc = TM_CUDA_CHECK(
        cudaMemcpy(dst->w, t->data, (size_t)dst->n_out * dst->n_in, cudaMemcpyHostToDevice), err);
    if (rc)
        return rc;
    const size_t sb = scale_bytes(dst->sk, dst->n_out, dst->n_in);
    float *f = (float *)(stage + UPLOAD_CHUNK);
    if (dst->sk == TM_K_FP8_BLOCK_E8M0) {
        TM_ASSERT(sb <= UPLOAD_CHUNK);
        rc = TM_CUDA_CHECK(cudaMemcpy(dst->scale, t->scale, sb, cudaMemcpyHostToDevice), err);
        return rc ? rc : upload_e8m0_f32(dst, t->scale, sb, f, err);
    }
    const size_t n = sb / sizeof(float);
    TM_ASSERT(n <= UPLOAD_CHUNK);
    if (t->quant == TM_QUANT_FP8_TENSOR) {
        tm_dtype_to_f32(t->scale, (tm_dtype)t->scale_dtype, 0, 1, f);
        for (size_t i = 1; i < n; i++)
            f[i] = f[0];
    } else {
        tm_dtype_to_f32(t->scale, (tm_dtype)t->scale_dtype, 0, n, f);
    }
    return TM_CUDA_CHECK(cudaMemcpy(dst->scale, f, sb, cudaMemcpyHostToDevice), err);
}

/* The RoPE inverse frequencies (runner/model/model.h), before the weights either way. */
static tm_rc upload_inv_freq(tm_cuda_engine *impl, llama *lm, tm_err *err) {
    const tm_model_cfg *c = &impl->cfg;
    float inv_freq[TM_ATTN_MAX_HEAD_DIM / 2];
    tm_model_rope_inv_freq(c, inv_freq);
    return TM_CUDA_CHECK(
        cudaMemcpy(lm->inv_freq, inv_freq, c->head_dim / 2 * sizeof(float), cudaMemcpyHostToDevice),
        err);
}

static tm_rc upload_weights(tm_cuda_engine *impl, llama *lm, const tm_model *m, tm_err *err) {
    const tm_model_cfg *c = &impl->cfg;
    uint32_t rq[3], rg[2];
    group_rows(impl, lm, rq, rg);
    // staging: UPLOAD_CHUNK bf16 followed by UPLOAD_CHUNK floats
    uint16_t *stage = tm_malloc(UPLOAD_CHUNK * (sizeof(uint16_t) + sizeof(float)));
    if (!stage)
        return TM_ERR(err, TM_E_NOMEM, "cuda engine: upload staging buffer");
    float *fb = (float *)(stage + UPLOAD_CHUNK);
    tm_rc rc = tm_cuda_upload_bf16(lm->embd, &m->embd, stage, fb, err);
    if (!rc && !c->tie_embd)
        rc = tm_cuda_upload_bf16(lm->lm_head, m->lm_head.data ? &m->lm_head : &m->embd, stage, fb,
                                 err);
    if (!rc)
        rc = upload_f32(lm->out_norm, &m->out_norm, stage, err);
    for (uint32_t l = 0; !rc && l < c->n_layer; l++) {
        const tm_layer_w *W = &m->layers[l];
        cuda_layer *L = &lm->layers[l];
        const tm_tensor *qkv[3] = {&W->wq, &W->wk, &W->wv}, *gu[2] = {&W->w_gate, &W->w_up};
        for (uint32_t i = 0; !rc && i < 3; i++) {
            const cuda_lin p = group_part(L->qkv, L->n_qkv, rq, i);
            rc = upload_lin(&p, qkv[i], stage, err);
        }
        if (!rc)
            rc = upload_lin(&L->o, &W->wo, stage, err);
        for (uint32_t i = 0; !rc && i < 2; i++) {
            const cuda_lin p = group_part(L->gu, L->n_gu, rg, i);
            rc = upload_lin(&p, gu[i], stage, err);
        }
        if (!rc)
            rc = upload_lin(&L->down, &W->w_down, stage, err);
        if (!rc && c->qkv_bias) {
            rc = upload_f32(L->b_qkv, &W->bq, stage, err);
            if (!rc)
                rc = upload_f32(L->b_qkv + lm->q_dim, &W->bk, stage, err);
            if (!rc)
                rc = upload_f32(L->b_qkv + lm->q_dim + impl->kv_dim, &W->bv, stage, err);
        }
        if (!rc)
            rc = upload_f32(L->attn_norm, &W->attn_norm, stage, err);
        if (!rc)
            rc = upload_f32(L->ffn_norm, &W->ffn_norm, stage, err);
    }
    tm_free(stage);
    return rc;
}

static tm_rc upload(tm_cuda_engine *impl, const tm_model *m, tm_err *err) {
    llama *lm = impl->arch_state;
    const tm_model_cfg *c = &impl->cfg;
    tm_rc rc = upload_inv_freq(impl, lm, err);
    if (rc)
        return rc;
    if (impl->tp_size < 2) {
        rc = upload_weights(impl, lm, m, err);
        if (!rc)
            lt_setup(impl, lm);
        return rc;
    }
    // This rank's slices of the host weights (views, plus column copies of o_proj and
    // down_proj), uploaded and dropped.
    tm_model *shard = NULL;
    uint32_t sv0 = 0;
    rc = tm_shard_create(m, impl->tp_rank, impl->tp_size, &shard, &sv0, err);
    if (!rc) {
        const tm_model_cfg *sc = &shard->cfg;
        TM_ASSERT(sv0 == impl->vocab0 && sc->n_head == c->n_head && sc->n_kv_head == c->n_kv_head &&
                  sc->n_ff == c->n_ff && sc->n_vocab == c->n_vocab);
        rc = tm_model_check_weights(shard, "cuda engine", err);
    }
    if (!rc)
        rc = upload_weights(impl, lm, shard, err);
    tm_shard_destroy(shard);
    return rc;
}

/* Random FP8 linear p (engine_cuda.h, tm_engine_cuda_create_random_fmt): e4m3 over the whole
 * range, scales s0 = sqrt(3 / n_in) / 448 with a +-10% spread (e8m0: the power of two at or
 * above s0). */
static tm_rc fill_lin_fp8(tm_cuda_engine *impl, const cuda_lin *p, uint64_t seed, tm_err *err) {
    tm_k_fill_e4m3_args fa = {
        .p = p->w, .n = (size_t)p->n_out * p->n_in, .seed = seed, .amax = 448.0f};
    tm_rc rc = tm_k_fill_e4m3(&fa, impl->stream, err);
    const float s0 = sqrtf(3.0f / (float)p->n_in) / 448.0f;
    const size_t sb = scale_bytes(p->sk, p->n_out, p->n_in);
    if (rc)
        return rc;
    if (p->sk != TM_K_FP8_BLOCK_E8M0)
        return tm_cuda_fill_f32(p->scale, sb / sizeof(float), seed, 0.1f * s0, s0, NULL, err);
    uint8_t *h = tm_malloc(sb);
    if (!h)
        return TM_ERR(err, TM_E_NOMEM, "cuda engine: %zu scale bytes", sb);
    memset(h, 127 + (int)ceilf(log2f(s0)), sb);
    rc = TM_CUDA_CHECK(cudaMemcpy(p->scale, h, sb, cudaMemcpyHostToDevice), err);
    float *f = rc ? NULL : tm_malloc(sb * sizeof(float));
    if (!rc && !f)
        rc = TM_ERR(err, TM_E_NOMEM, "cuda engine: %zu scales", sb);
    if (!rc)
        rc = upload_e8m0_f32(p, h, sb, f, err);
    tm_free(f);
    tm_free(h);
    return rc;
}

/* A random linear (a fused group as one matrix): bf16 as always, or FP8. */
static tm_rc fill_lin(tm_cuda_engine *impl, const cuda_lin *g, uint32_t n, uint64_t seed,
                      tm_err *err) {
    tm_rc rc = TM_OK;
    for (uint32_t i = 0; !rc && i < n; i++)
        rc = g[i].fp8 ? fill_lin_fp8(impl, &g[i], seed * 4 + i, err)
                      : tm_cuda_fill_bf16(impl, g[i].w, g[i].n_out, g[i].n_in, seed, err);
    return rc;
}

static tm_rc fill_random(tm_cuda_engine *impl, uint64_t seed, tm_err *err) {
    llama *lm = impl->arch_state;
    const tm_model_cfg *c = &impl->cfg;
    const size_t d = c->n_embd;
    tm_rc rc = upload_inv_freq(impl, lm, err);
    if (rc)
        return rc;
    uint64_t k = seed * 1000003ull;
    rc = tm_cuda_fill_bf16(impl, lm->embd, c->n_vocab, d, k++, err);
    if (!rc && !c->tie_embd)
        rc = tm_cuda_fill_bf16(impl, lm->lm_head, c->n_vocab, d, k++, err);
    if (!rc)
        rc = tm_cuda_fill_f32(lm->out_norm, d, k++, 0.1f, 1.0f, NULL, err);
    for (uint32_t l = 0; !rc && l < c->n_layer; l++) {
        cuda_layer *L = &lm->layers[l];
        rc = fill_lin(impl, L->qkv, L->n_qkv, k++, err);
        if (!rc)
            rc = fill_lin(impl, &L->o, 1, k++, err);
        if (!rc)
            rc = fill_lin(impl, L->gu, L->n_gu, k++, err);
        if (!rc)
            rc = fill_lin(impl, &L->down, 1, k++, err);
        if (!rc && L->b_qkv)
            rc = tm_cuda_fill_f32(L->b_qkv, lm->qkv_dim, k++, 0.1f, 0.0f, NULL, err);
        if (!rc)
            rc = tm_cuda_fill_f32(L->attn_norm, d, k++, 0.1f, 1.0f, NULL, err);
        if (!rc)
            rc = tm_cuda_fill_f32(L->ffn_norm, d, k++, 0.1f, 1.0f, NULL, err);
    }
    if (!rc)
        lt_setup(impl, lm);
    if (!rc)
        rc = TM_CUDA_CHECK(cudaStreamSynchronize(impl->stream), err);
    return rc;
}

/* ---- forward ---- */

/* Splits of the attention context for a step of T tokens: enough blocks to fill the GPU, as long
 * as the partials fit. Depends on T only (graph replay). */
static uint32_t attn_splits(const tm_cuda_engine *impl, const llama *lm, uint32_t T) {
    return tm_k_attn_paged_splits(T, impl->cfg.n_head, impl->cfg.n_kv_head, impl->cfg.head_dim,
                                  impl->n_sm, lm->part_floats);
}

/* Tensor parallel, after the embedding or a residual projection (o_proj, down_proj) into x:
 * make x the full residual stream on every rank and, with w, h = RMSNorm(x) for the next
 * block. This rank's part is x as cuBLAS left it (rank 0: residual + product; the others:
 * product), or with the skinny kernel the split-K partials in *res plus beta * x. Decode-sized
 * steps (T <= TM_AR_MAX_ROWS) over peer memory do it all in one kernel (kernels/allreduce.h);
 * otherwise sum_parts, an NCCL all-reduce and the RMSNorm kernel. *res is consumed. */
static tm_rc tp_reduce_norm(tm_cuda_engine *impl, llama *lm, uint32_t T, tm_cuda_proj *res,
                            float beta, const float *w, tm_err *err) {
    const tm_cuda_comm *cm = impl->comm;
    const uint32_t d = impl->cfg.n_embd;
    const int skinny = res && res->p && res->p != lm->x;
    tm_rc rc = TM_OK;
    if (tm_cuda_ablated(impl, TM_CUDA_ABL_AR)) { // benchmarks only: nothing launched
    } else if (cm->ar_on && T <= TM_AR_MAX_ROWS && d % 4 == 0) {
        tm_k_allreduce_args a = {.x = lm->x,
                                 .n_tok = T,
                                 .d = d,
                                 .d_cap = cm->ar_d,
                                 .rank = impl->tp_rank,
                                 .world = impl->tp_size,
                                 .parts = skinny ? res->p : NULL,
                                 .part_stride = skinny ? res->stride : 0,
                                 .n_part = skinny ? res->n : 0,
                                 .beta = beta,
                                 .out = w ? lm->h : NULL,
                                 .w = w,
                                 .eps = impl->cfg.rms_eps};
        memcpy(a.regions, cm->ar_regions, sizeof(a.regions));
        rc = tm_k_allreduce_sum_f32(&a, impl->stream, err);
    } else {
        const size_t n_x = (size_t)T * d;
        if (skinny) {
            tm_k_sum_parts_args sp = {.y = lm->x,
                                      .part = res->p,
                                      .stride = res->stride,
                                      .n = n_x,
                                      .n_part = res->n,
                                      .beta = beta};
            rc = tm_k_sum_parts(&sp, impl->stream, err);
        }
        if (!rc)
            rc = tm_cuda_comm_allreduce_sum(impl->comm, lm->x, n_x, TM_NCCL_F32, impl->stream, err);
        if (!rc && w) {
            tm_k_rmsnorm_bf16_args na = {
                .out = lm->h, .x = lm->x, .w = w, .n_row = T, .n_col = d, .eps = impl->cfg.rms_eps};
            rc = tm_k_rmsnorm_bf16(&na, impl->stream, err);
        }
    }
    if (res)
        *res = (tm_cuda_proj){0};
    return rc;
}

/* x = the embedding rows of the step's tokens. With TP each rank has a slice of the table: the
 * slices are summed, and layer 0's attention norm comes with the sum. */
static tm_rc embed(tm_cuda_engine *impl, llama *lm, const tm_cuda_step *st, tm_err *err) {
    const tm_model_cfg *c = &impl->cfg;
    tm_rc rc;
    if (impl->tp_size > 1) {
        tm_k_embed_part_bf16_args ea = {.x = lm->x,
                                        .table = lm->embd,
                                        .tokens = st->tokens,
                                        .n_tok = st->n_tok,
                                        .n_embd = c->n_embd,
                                        .vocab0 = impl->vocab0,
                                        .n_vocab = c->n_vocab};
        rc = tm_k_embed_part_bf16(&ea, impl->stream, err);
        if (!rc)
            rc = tp_reduce_norm(impl, lm, st->n_tok, NULL, 1.0f,
                                c->n_layer ? lm->layers[0].attn_norm : NULL, err);
    } else {
        tm_k_embed_bf16_args ea = {.x = lm->x,
                                   .table = lm->embd,
                                   .tokens = st->tokens,
                                   .n_tok = st->n_tok,
                                   .n_embd = c->n_embd};
        rc = tm_k_embed_bf16(&ea, impl->stream, err);
    }
    return tm_cuda_op_end(impl, "metadata upload + embed", rc);
}

/* After a residual projection into x (o_proj, down_proj; *res says where its product is). With
 * TP: the all-reduce, and h = RMSNorm(x) * w unless w is NULL (after the last layer). Without:
 * nothing is launched; the next residual_norm (or the final norm) adds what is pending. */
static tm_rc residual_reduce(tm_cuda_engine *impl, llama *lm, uint32_t T, tm_cuda_proj *res,
                             float beta, const float *w, tm_err *err) {
    if (impl->tp_size > 1)
        return tm_cuda_op_end(impl, "tp all-reduce + norm",
                              tp_reduce_norm(impl, lm, T, res, beta, w, err));
    if (res->p == lm->x) // cuBLAS added the product into x itself
        *res = (tm_cuda_proj){0};
    return TM_OK;
}

/* h = RMSNorm(x + the pending partials of *res) * w, consuming *res; with TP nothing (h came
 * with the all-reduce of residual_reduce or embed). */
static tm_rc residual_norm(tm_cuda_engine *impl, llama *lm, uint32_t T, tm_cuda_proj *res,
                           const float *w, const char *what, tm_err *err) {
    if (impl->tp_size > 1)
        return TM_OK;
    tm_k_rmsnorm_bf16_args na = {.out = lm->h,
                                 .x = lm->x,
                                 .rows = NULL,
                                 .w = w,
                                 .n_row = T,
                                 .n_col = impl->cfg.n_embd,
                                 .eps = impl->cfg.rms_eps,
                                 .add = res->p,
                                 .add_stride = res->stride,
                                 .n_add = res->n};
    *res = (tm_cuda_proj){0};
    return TM_CUDA_OP(impl, TM_CUDA_ABL_NORM, what, tm_k_rmsnorm_bf16(&na, impl->stream, err));
}

/* y = x @ W^T for the linear (group) g of n parts, as tm_cuda_project (engine_cuda_int.h) does
 * for bf16 weights, which it is for them. FP8 steps of at most sk_max_tok tokens run the FP8
 * decode GEMM with the same partial convention (several parts: beta 0 only; each part's
 * partials summed into its columns of dst, which is then the result); longer steps dequantize
 * the weight into lm->wdq (the parts at their row offsets) and run the bf16 projection. */
static tm_rc project(tm_cuda_engine *impl, llama *lm, int abl, const char *what, const cuda_lin *g,
                     uint32_t n, const uint16_t *x, uint32_t T, float *dst, float beta,
                     tm_cuda_proj *out, tm_err *err) {
    const uint32_t n_in = g[0].n_in;
    uint32_t n_out = 0;
    for (uint32_t i = 0; i < n; i++)
        n_out += g[i].n_out;
    if (!g[0].fp8)
        return tm_cuda_project(impl, abl, what, g[0].w, x, T, n_in, n_out, dst, beta, out, err);
    cudaStream_t s = impl->stream;
    tm_rc rc = TM_OK;
    if (T <= impl->sk_max_tok && tm_k_gemm_fp8_fits(T, n_in, n_out)) {
        TM_ASSERT(n == 1 || beta == 0.0f);
        uint32_t col = 0;
        for (uint32_t i = 0; !rc && i < n; i++) {
            uint32_t kps = 0;
            const uint32_t ns = tm_k_gemm_fp8_splits(n_in, g[i].n_out, impl->n_sm, &kps);
            float *part = n == 1 && ns == 1 && beta == 0.0f ? dst : impl->sk_part;
            TM_ASSERT((size_t)ns * T * g[i].n_out <= impl->sk_part_floats);
            tm_k_gemm_fp8_args ga = {.part = part,
                                     .w = g[i].w,
                                     .scale = g[i].scale,
                                     .x = x,
                                     .n_tok = T,
                                     .n_in = n_in,
                                     .n_out = g[i].n_out,
                                     .n_split = ns,
                                     .k_per_split = kps,
                                     .scale_kind = g[i].sk,
                                     .variant = lm->fp8_variant,
                                     .depth = lm->fp8_depth};
            if (n == 1) {
                *out = (tm_cuda_proj){.p = part, .n = ns, .stride = (size_t)T * n_out};
                return TM_CUDA_OP(impl, abl, what, tm_k_gemm_fp8(&ga, s, err));
            }
            tm_k_sum_parts_cols_args sc = {.y = dst + col,
                                           .ld_y = n_out,
                                           .part = part,
                                           .stride = (size_t)T * g[i].n_out,
                                           .n_part = ns,
                                           .n_tok = T,
                                           .n_col = g[i].n_out};
            rc = TM_CUDA_OP(impl, abl, NULL, tm_k_gemm_fp8(&ga, s, err));
            if (!rc)
                rc = TM_CUDA_OP(impl, abl, NULL, tm_k_sum_parts_cols(&sc, s, err));
            col += g[i].n_out;
        }
        *out = (tm_cuda_proj){.p = dst, .n = 1, .stride = 0};
        return tm_cuda_op_end(impl, what, rc);
    }
    const tm_lt_fp8_mode mode = g[0].sk == TM_K_FP8_CHANNEL ? TM_LT_FP8_ROWWISE : TM_LT_FP8_BLOCK;
    if (lm->lt && n == 1 && lm->lt_mode_ok[mode] && tm_lt_fp8_fits(mode, n_in, n_out) &&
        n_in <= lm->max_in) {
        const uint32_t group = mode == TM_LT_FP8_BLOCK ? 128 : n_in;
        tm_k_act_quant_fp8_args qa = {.out = lm->xq,
                                      .scale = lm->xs,
                                      .x = x,
                                      .n_tok = T,
                                      .n_in = n_in,
                                      .n_tok_pad = TM_LT_FP8_TOK(T),
                                      .group = group};
        rc = TM_CUDA_OP(impl, abl, NULL, tm_k_act_quant_fp8(&qa, s, err));
        if (!rc)
            rc = TM_CUDA_OP(impl, abl, NULL,
                            tm_lt_fp8_gemm(lm->lt, mode, g[0].w,
                                           g[0].scale_f32 ? g[0].scale_f32 : g[0].scale, lm->xq,
                                           lm->xs, T, n_in, n_out, dst, beta, err));
        *out = (tm_cuda_proj){.p = dst, .n = 1, .stride = 0};
        return tm_cuda_op_end(impl, what, rc);
    }
    size_t row = 0;
    TM_ASSERT((size_t)n_out * n_in <= lm->wdq_elems);
    for (uint32_t i = 0; !rc && i < n; i++) {
        tm_k_dequant_fp8_args da = {.out = lm->wdq + row * n_in,
                                    .w = g[i].w,
                                    .scale = g[i].scale,
                                    .n_out = g[i].n_out,
                                    .n_in = n_in,
                                    .scale_kind = g[i].sk};
        rc = TM_CUDA_OP(impl, abl, NULL, tm_k_dequant_fp8_bf16(&da, s, err));
        row += g[i].n_out;
    }
    if (rc)
        return rc;
    return tm_cuda_project(impl, abl, what, lm->wdq, x, T, n_in, n_out, dst, beta, out, err);
}

/* The whole model for a step whose metadata is already on the device. */
static tm_rc forward(tm_cuda_engine *impl, const tm_cuda_step *st, tm_err *err) {
    llama *lm = impl->arch_state;
    const tm_model_cfg *c = &impl->cfg;
    const uint32_t d = c->n_embd, ff = c->n_ff, T = st->n_tok;
    cudaStream_t s = impl->stream;
    // With TP, rank 0's partial products carry the residual (beta 1); the others' do not.
    const float beta_res = impl->tp_size > 1 && impl->tp_rank != 0 ? 0.0f : 1.0f;
    tm_rc rc = embed(impl, lm, st, err);
    if (rc)
        return rc;
    const uint32_t n_split = attn_splits(impl, lm, T);
    // A residual projection's partials not yet added into x (skinny path without TP): the next
    // RMSNorm adds them.
    tm_cuda_proj res = {0};
    tm_cuda_proj po;
    for (uint32_t l = 0; l < c->n_layer; l++) {
        const cuda_layer *L = &lm->layers[l];
        // layer l's K and V (bf16, or e4m3 bytes with kv_fp8)
        uint16_t *kc = (uint16_t *)((char *)impl->k_cache + (size_t)l * impl->layer_kv_bytes);
        uint16_t *vc = (uint16_t *)((char *)impl->v_cache + (size_t)l * impl->layer_kv_bytes);
        rc = residual_norm(impl, lm, T, &res, L->attn_norm, "attn_norm (+residual)", err);
        if (!rc)
            rc = project(impl, lm, TM_CUDA_ABL_QKV, "qkv_proj", L->qkv, L->n_qkv, lm->h, T, lm->qkv,
                         0.0f, &po, err);
        if (rc)
            return rc;
        tm_k_rope_kv_bf16_args ra = {.q = lm->q,
                                     .k_cache = kc,
                                     .v_cache = vc,
                                     .qkv = po.p,
                                     .bias = L->b_qkv,
                                     .pos = st->pos,
                                     .slot = st->slot,
                                     .inv_freq = lm->inv_freq,
                                     .n_tok = T,
                                     .n_head = c->n_head,
                                     .n_kv_head = c->n_kv_head,
                                     .head_dim = c->head_dim,
                                     .n_part = po.n,
                                     .part_stride = po.stride,
                                     .kv_fp8 = impl->kv_fp8};
        rc = TM_CUDA_OP(impl, TM_CUDA_ABL_ROPE, "rope_kv", tm_k_rope_kv_bf16(&ra, s, err));
        if (rc)
            return rc;
        tm_k_attn_paged_bf16_args aa = {.out = lm->att,
                                        .q = lm->q,
                                        .k_cache = kc,
                                        .v_cache = vc,
                                        .pos = st->pos,
                                        .tok_seq = st->tok_seq,
                                        .seq_bt = st->seq_bt,
                                        .block_tables = st->block_tables,
                                        .part_acc = lm->part,
                                        .part_ml = lm->part +
                                                   (size_t)T * c->n_head * n_split * c->head_dim,
                                        .n_tok = T,
                                        .n_head = c->n_head,
                                        .n_kv_head = c->n_kv_head,
                                        .head_dim = c->head_dim,
                                        .block_size = impl->eng.opts.block_size,
                                        .ld_q = lm->q_dim,
                                        .window = c->sliding_window,
                                        .n_split = n_split,
                                        .scale = 1.0f / sqrtf((float)c->head_dim),
                                        .kv_fp8 = impl->kv_fp8};
        tm_k_attn_prefill_bf16_args fa = {.out = lm->att,
                                          .q = lm->q,
                                          .k_cache = kc,
                                          .v_cache = vc,
                                          .seq_bt = st->seq_bt,
                                          .block_tables = st->block_tables,
                                          .tiles = st->tiles,
                                          .n_tile = st->n_tile,
                                          .n_head = c->n_head,
                                          .n_kv_head = c->n_kv_head,
                                          .head_dim = c->head_dim,
                                          .block_size = impl->eng.opts.block_size,
                                          .ld_q = lm->q_dim,
                                          .window = c->sliding_window,
                                          .scale = aa.scale,
                                          .kv_fp8 = impl->kv_fp8};
        rc = st->n_tile ? TM_CUDA_OP(impl, TM_CUDA_ABL_NEVER, "attention (prefill)",
                                     tm_k_attn_prefill_bf16(&fa, s, err))
                        : TM_CUDA_OP(impl, TM_CUDA_ABL_ATTN, "attention (paged)",
                                     tm_k_attn_paged_bf16(&aa, s, err));
        if (!rc)
            rc = project(impl, lm, TM_CUDA_ABL_O, "o_proj", &L->o, 1, lm->att, T, lm->x, beta_res,
                         &res, err);
        if (!rc)
            rc = residual_reduce(impl, lm, T, &res, beta_res, L->ffn_norm, err);
        if (!rc)
            rc = residual_norm(impl, lm, T, &res, L->ffn_norm, "ffn_norm (+residual)", err);
        if (!rc)
            rc = project(impl, lm, TM_CUDA_ABL_GU, "gate_up_proj", L->gu, L->n_gu, lm->h, T, lm->gu,
                         0.0f, &po, err);
        if (rc)
            return rc;
        tm_k_silu_mul_bf16_args sa = {.out = lm->ffa,
                                      .gu = po.p,
                                      .n_tok = T,
                                      .n_ff = ff,
                                      .n_part = po.n,
                                      .part_stride = po.stride};
        rc = TM_CUDA_OP(impl, TM_CUDA_ABL_SILU, "silu_mul", tm_k_silu_mul_bf16(&sa, s, err));
        if (!rc)
            rc = project(impl, lm, TM_CUDA_ABL_DOWN, "down_proj", &L->down, 1, lm->ffa, T, lm->x,
                         beta_res, &res, err);
        if (!rc)
            rc = residual_reduce(impl, lm, T, &res, beta_res,
                                 l + 1 < c->n_layer ? lm->layers[l + 1].attn_norm : NULL, err);
        if (rc)
            return rc;
    }
    if (st->n_want == 0)
        return TM_OK;
    tm_k_rmsnorm_bf16_args na = {.out = lm->last,
                                 .x = lm->x,
                                 .rows = st->want_row,
                                 .w = lm->out_norm,
                                 .n_row = st->n_want,
                                 .n_col = d,
                                 .eps = c->rms_eps,
                                 .add = res.p,
                                 .add_stride = res.stride,
                                 .n_add = res.n};
    rc = TM_CUDA_OP(impl, TM_CUDA_ABL_LM, "final_norm", tm_k_rmsnorm_bf16(&na, s, err));
    if (!rc)
        rc = tm_cuda_project(impl, TM_CUDA_ABL_LM, NULL, lm->lm_head, lm->last, st->n_want, d,
                             c->n_vocab, impl->logits, 0.0f, &po, err);
    if (rc)
        return rc;
    // the skinny kernel's split-K partials, summed into the logits
    tm_k_sum_parts_args sp = {.y = impl->logits,
                              .part = po.p,
                              .stride = po.stride,
                              .n = (size_t)st->n_want * c->n_vocab,
                              .n_part = po.n,
                              .beta = 0.0f};
    return TM_CUDA_OP(impl, TM_CUDA_ABL_LM, "lm_head",
                      po.p == impl->logits ? TM_OK : tm_k_sum_parts(&sp, s, err));
}

const tm_cuda_arch tm_cuda_arch_llama = {
    .name = "llama",
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
