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
 * biases and the RoPE table fp32. Engine thread only; nothing allocates after init. */
#include <math.h>
#include <string.h>

#include "base/alloc.h"
#include "kernels/act.h"
#include "kernels/allreduce.h"
#include "kernels/attn_paged.h"
#include "kernels/attn_prefill.h"
#include "kernels/common.h"
#include "kernels/embed.h"
#include "kernels/fill.h"
#include "kernels/gemm_skinny.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/tp.h"
#include "runner/engine/cuda/engine_cuda_int.h"
#include "runner/tp/shard.h"

#define ATTN_PART_HEADS 4096             /* (token, head, split) partials the attention may use */
#define UPLOAD_CHUNK ((size_t)1 << 22)   /* elements converted per host staging pass */

typedef struct cuda_layer {
    uint16_t *w_qkv;   /* [q_dim + 2*kv_dim][n_embd] bf16: wq rows, then wk, then wv */
    uint16_t *w_o;     /* [n_embd][q_dim] */
    uint16_t *w_gu;    /* [2*n_ff][n_embd]: w_gate rows, then w_up */
    uint16_t *w_down;  /* [n_embd][n_ff] */
    float *b_qkv;      /* [q_dim + 2*kv_dim] fp32, NULL without bias */
    float *attn_norm;  /* [n_embd] fp32 */
    float *ffn_norm;   /* [n_embd] fp32 */
} cuda_layer;

/* impl->arch_state. Device pointers unless marked host. */
typedef struct llama {
    uint32_t q_dim, qkv_dim;   /* kv_dim is impl->kv_dim */
    /* weights (impl->w_arena) */
    uint16_t *embd;            /* [n_vocab][n_embd] */
    uint16_t *lm_head;         /* [n_vocab][n_embd]; == embd when tied */
    float *out_norm;           /* [n_embd] */
    float *inv_freq;           /* [head_dim/2] */
    cuda_layer *layers;        /* host array of n_layer, owned */
    /* activations (impl->a_arena); T = max_batched_tokens, S = max_seqs */
    float *x;                  /* [T][n_embd] residual stream */
    float *qkv;                /* [T][qkv_dim] */
    float *gu;                 /* [T][2*n_ff] */
    float *part;               /* attention split partials */
    size_t part_floats;
    uint16_t *h;               /* [T][n_embd] normed */
    uint16_t *q;               /* [T][q_dim] rotated */
    uint16_t *att;             /* [T][q_dim] */
    uint16_t *ffa;             /* [T][n_ff] */
    uint16_t *last;            /* [S][n_embd] final-normed wanted rows */
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

static tm_rc check_weights(const tm_model *m, tm_err *err) {
    return tm_model_check_weights(m, "cuda engine", err);
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

static uint32_t kv_dim(const tm_model_cfg *c) {
    return c->n_kv_head * c->head_dim;
}

// Prefill attention on tensor cores for head_dim 64/128.
static int prefill_tiles(const tm_model_cfg *c) {
    return tm_k_attn_prefill_supported(c->head_dim);
}

static void fini(tm_cuda_engine *impl) {
    llama *lm = impl->arch_state;
    if (!lm)
        return;
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
    return TM_OK;
}

/* Floats of sk_part for the model's projections at up to T tokens. */
static size_t skinny_floats(const tm_cuda_engine *impl, uint32_t T) {
    const llama *lm = impl->arch_state;
    const tm_model_cfg *c = &impl->cfg;
    const uint32_t shapes[5][2] = {{c->n_embd, lm->qkv_dim}, {lm->q_dim, c->n_embd},
                                   {c->n_embd, 2 * c->n_ff}, {c->n_ff, c->n_embd},
                                   {c->n_embd, c->n_vocab}};
    size_t most = 0;
    for (int i = 0; i < 5; i++) {
        uint32_t kps = 0;
        if (!tm_k_gemm_skinny_fits(T, shapes[i][0], shapes[i][1]))
            continue;
        const uint32_t n = tm_k_gemm_skinny_splits(shapes[i][0], shapes[i][1], impl->n_sm, &kps);
        most = TM_MAX(most, (size_t)n * T * shapes[i][1]);
    }
    return most;
}

/* ---- memory ---- */

static void carve_weights(tm_cuda_engine *impl, tm_cuda_carver *cv) {
    llama *lm = impl->arch_state;
    const tm_model_cfg *c = &impl->cfg;
    const size_t d = c->n_embd, ff = c->n_ff, bf = sizeof(uint16_t), f4 = sizeof(float);
    lm->embd = tm_cuda_carve(cv, (size_t)c->n_vocab * d * bf);
    lm->lm_head = c->tie_embd ? lm->embd : tm_cuda_carve(cv, (size_t)c->n_vocab * d * bf);
    lm->out_norm = tm_cuda_carve(cv, d * f4);
    lm->inv_freq = tm_cuda_carve(cv, c->head_dim / 2 * f4);
    for (uint32_t l = 0; l < c->n_layer; l++) {
        cuda_layer *L = &lm->layers[l];
        L->w_qkv = tm_cuda_carve(cv, (size_t)lm->qkv_dim * d * bf);
        L->w_o = tm_cuda_carve(cv, d * lm->q_dim * bf);
        L->w_gu = tm_cuda_carve(cv, 2 * ff * d * bf);
        L->w_down = tm_cuda_carve(cv, d * ff * bf);
        L->b_qkv = c->qkv_bias ? tm_cuda_carve(cv, lm->qkv_dim * f4) : NULL;
        L->attn_norm = tm_cuda_carve(cv, d * f4);
        L->ffn_norm = tm_cuda_carve(cv, d * f4);
    }
}

static void carve_acts(tm_cuda_engine *impl, tm_cuda_carver *cv) {
    llama *lm = impl->arch_state;
    const tm_model_cfg *c = &impl->cfg;
    const size_t T = impl->eng.opts.max_batched_tokens, S = impl->eng.opts.max_seqs;
    const size_t d = c->n_embd, ff = c->n_ff, bf = sizeof(uint16_t), f4 = sizeof(float);
    lm->x = tm_cuda_carve(cv, T * d * f4);
    lm->qkv = tm_cuda_carve(cv, T * lm->qkv_dim * f4);
    lm->gu = tm_cuda_carve(cv, T * 2 * ff * f4);
    lm->part = tm_cuda_carve(cv, lm->part_floats * f4);
    lm->h = tm_cuda_carve(cv, T * d * bf);
    lm->q = tm_cuda_carve(cv, T * lm->q_dim * bf);
    lm->att = tm_cuda_carve(cv, T * lm->q_dim * bf);
    lm->ffa = tm_cuda_carve(cv, T * ff * bf);
    lm->last = tm_cuda_carve(cv, S * d * bf);
}

/* ---- weights ---- */

/* Copy rows [0, n_row) of t (any dtype) to dst as bf16, converting on the host in chunks. */
static tm_rc upload_bf16(uint16_t *dst, const tm_tensor *t, uint16_t *stage, tm_err *err) {
    const size_t n = (size_t)tm_tensor_n_elem(t);
    if (t->dtype == TM_DTYPE_BF16)
        return TM_CUDA_CHECK(cudaMemcpy(dst, t->data, n * 2, cudaMemcpyHostToDevice), err);
    float *f = (float *)(stage + UPLOAD_CHUNK); // stage holds UPLOAD_CHUNK bf16 + floats
    for (size_t i = 0; i < n; i += UPLOAD_CHUNK) {
        const size_t k = TM_MIN((size_t)UPLOAD_CHUNK, n - i);
        tm_dtype_to_f32(t->data, t->dtype, i, k, f);
        for (size_t j = 0; j < k; j++)
            stage[j] = tm_f32_to_bf16(f[j]);
        tm_rc rc = TM_CUDA_CHECK(cudaMemcpy(dst + i, stage, k * 2, cudaMemcpyHostToDevice), err);
        if (rc)
            return rc;
    }
    return TM_OK;
}

/* Copy t (a small vector, any dtype) to dst as fp32. */
static tm_rc upload_f32(float *dst, const tm_tensor *t, uint16_t *stage, tm_err *err) {
    const size_t n = (size_t)tm_tensor_n_elem(t);
    TM_ASSERT(n <= UPLOAD_CHUNK);
    float *f = (float *)(stage + UPLOAD_CHUNK);
    tm_dtype_to_f32(t->data, t->dtype, 0, n, f);
    return TM_CUDA_CHECK(cudaMemcpy(dst, f, n * sizeof(float), cudaMemcpyHostToDevice), err);
}

/* The RoPE inverse frequencies (runner/model/model.h), before the weights either way. */
static tm_rc upload_inv_freq(tm_cuda_engine *impl, llama *lm, tm_err *err) {
    const tm_model_cfg *c = &impl->cfg;
    float inv_freq[TM_ATTN_MAX_HEAD_DIM / 2];
    tm_model_rope_inv_freq(c, inv_freq);
    return TM_CUDA_CHECK(cudaMemcpy(lm->inv_freq, inv_freq, c->head_dim / 2 * sizeof(float),
                                    cudaMemcpyHostToDevice),
                         err);
}

static tm_rc upload_weights(tm_cuda_engine *impl, llama *lm, const tm_model *m, tm_err *err) {
    const tm_model_cfg *c = &impl->cfg;
    const size_t d = c->n_embd, ff = c->n_ff;
    // staging: UPLOAD_CHUNK bf16 followed by UPLOAD_CHUNK floats
    uint16_t *stage = tm_malloc(UPLOAD_CHUNK * (sizeof(uint16_t) + sizeof(float)));
    if (!stage)
        return TM_ERR(err, TM_E_NOMEM, "cuda engine: upload staging buffer");
    tm_rc rc = upload_bf16(lm->embd, &m->embd, stage, err);
    if (!rc && !c->tie_embd)
        rc = upload_bf16(lm->lm_head, m->lm_head.data ? &m->lm_head : &m->embd, stage, err);
    if (!rc)
        rc = upload_f32(lm->out_norm, &m->out_norm, stage, err);
    for (uint32_t l = 0; !rc && l < c->n_layer; l++) {
        const tm_layer_w *W = &m->layers[l];
        cuda_layer *L = &lm->layers[l];
        rc = upload_bf16(L->w_qkv, &W->wq, stage, err);
        if (!rc)
            rc = upload_bf16(L->w_qkv + (size_t)lm->q_dim * d, &W->wk, stage, err);
        if (!rc)
            rc = upload_bf16(L->w_qkv + (size_t)(lm->q_dim + impl->kv_dim) * d, &W->wv, stage,
                             err);
        if (!rc)
            rc = upload_bf16(L->w_o, &W->wo, stage, err);
        if (!rc)
            rc = upload_bf16(L->w_gu, &W->w_gate, stage, err);
        if (!rc)
            rc = upload_bf16(L->w_gu + ff * d, &W->w_up, stage, err);
        if (!rc)
            rc = upload_bf16(L->w_down, &W->w_down, stage, err);
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
    if (impl->tp_size < 2)
        return upload_weights(impl, lm, m, err);
    // This rank's slices of the host weights (views, plus column copies of o_proj and
    // down_proj), uploaded and dropped.
    tm_model *shard = NULL;
    uint32_t sv0 = 0;
    rc = tm_shard_create(m, impl->tp_rank, impl->tp_size, &shard, &sv0, err);
    if (!rc) {
        const tm_model_cfg *sc = &shard->cfg;
        TM_ASSERT(sv0 == impl->vocab0 && sc->n_head == c->n_head &&
                  sc->n_kv_head == c->n_kv_head && sc->n_ff == c->n_ff &&
                  sc->n_vocab == c->n_vocab);
        rc = tm_model_check_weights(shard, "cuda engine", err);
    }
    if (!rc)
        rc = upload_weights(impl, lm, shard, err);
    tm_shard_destroy(shard);
    return rc;
}

static tm_rc fill_mat(tm_cuda_engine *impl, uint16_t *p, size_t n_out, size_t n_in, uint64_t seed,
                      tm_err *err) {
    // uniform [-a, a) has std a/sqrt(3); aim for std 1/sqrt(n_in)
    tm_k_fill_bf16_args fa = {.p = p, .n = n_out * n_in, .seed = seed,
                              .scale = sqrtf(3.0f / (float)n_in), .offset = 0.0f};
    return tm_k_fill_bf16(&fa, impl->stream, err);
}

static tm_rc fill_vec_f32(float *dst, size_t n, uint64_t seed, float scale, float offset,
                          tm_err *err) {
    float *h = tm_malloc(n * sizeof(float));
    if (!h)
        return TM_ERR(err, TM_E_NOMEM, "cuda engine: %zu floats", n);
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        h[i] = offset + scale * (float)((double)(s >> 11) * 0x1p-52 - 1.0);
    }
    tm_rc rc = TM_CUDA_CHECK(cudaMemcpy(dst, h, n * sizeof(float), cudaMemcpyHostToDevice), err);
    tm_free(h);
    return rc;
}

static tm_rc fill_random(tm_cuda_engine *impl, uint64_t seed, tm_err *err) {
    llama *lm = impl->arch_state;
    const tm_model_cfg *c = &impl->cfg;
    const size_t d = c->n_embd, ff = c->n_ff;
    tm_rc rc = upload_inv_freq(impl, lm, err);
    if (rc)
        return rc;
    uint64_t k = seed * 1000003ull;
    rc = fill_mat(impl, lm->embd, c->n_vocab, d, k++, err);
    if (!rc && !c->tie_embd)
        rc = fill_mat(impl, lm->lm_head, c->n_vocab, d, k++, err);
    if (!rc)
        rc = fill_vec_f32(lm->out_norm, d, k++, 0.1f, 1.0f, err);
    for (uint32_t l = 0; !rc && l < c->n_layer; l++) {
        cuda_layer *L = &lm->layers[l];
        rc = fill_mat(impl, L->w_qkv, lm->qkv_dim, d, k++, err);
        if (!rc)
            rc = fill_mat(impl, L->w_o, d, lm->q_dim, k++, err);
        if (!rc)
            rc = fill_mat(impl, L->w_gu, 2 * ff, d, k++, err);
        if (!rc)
            rc = fill_mat(impl, L->w_down, d, ff, k++, err);
        if (!rc && L->b_qkv)
            rc = fill_vec_f32(L->b_qkv, lm->qkv_dim, k++, 0.1f, 0.0f, err);
        if (!rc)
            rc = fill_vec_f32(L->attn_norm, d, k++, 0.1f, 1.0f, err);
        if (!rc)
            rc = fill_vec_f32(L->ffn_norm, d, k++, 0.1f, 1.0f, err);
    }
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
        tm_k_allreduce_args a = {.x = lm->x, .n_tok = T, .d = d, .d_cap = cm->ar_d,
                                 .rank = impl->tp_rank, .world = impl->tp_size,
                                 .parts = skinny ? res->p : NULL,
                                 .part_stride = skinny ? res->stride : 0,
                                 .n_part = skinny ? res->n : 0, .beta = beta,
                                 .out = w ? lm->h : NULL, .w = w, .eps = impl->cfg.rms_eps};
        memcpy(a.regions, cm->ar_regions, sizeof(a.regions));
        rc = tm_k_allreduce_sum_f32(&a, impl->stream, err);
    } else {
        const size_t n_x = (size_t)T * d;
        if (skinny) {
            tm_k_sum_parts_args sp = {.y = lm->x, .part = res->p, .stride = res->stride,
                                      .n = n_x, .n_part = res->n, .beta = beta};
            rc = tm_k_sum_parts(&sp, impl->stream, err);
        }
        if (!rc)
            rc = tm_nccl_allreduce_sum(cm->nccl, lm->x, n_x, TM_NCCL_F32, impl->stream, err);
        if (!rc && w) {
            tm_k_rmsnorm_bf16_args na = {.out = lm->h, .x = lm->x, .w = w, .n_row = T,
                                         .n_col = d, .eps = impl->cfg.rms_eps};
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
        tm_k_embed_part_bf16_args ea = {.x = lm->x, .table = lm->embd, .tokens = st->tokens,
                                        .n_tok = st->n_tok, .n_embd = c->n_embd,
                                        .vocab0 = impl->vocab0, .n_vocab = c->n_vocab};
        rc = tm_k_embed_part_bf16(&ea, impl->stream, err);
        if (!rc)
            rc = tp_reduce_norm(impl, lm, st->n_tok, NULL, 1.0f,
                                c->n_layer ? lm->layers[0].attn_norm : NULL, err);
    } else {
        tm_k_embed_bf16_args ea = {.x = lm->x, .table = lm->embd, .tokens = st->tokens,
                                   .n_tok = st->n_tok, .n_embd = c->n_embd};
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
    tm_k_rmsnorm_bf16_args na = {.out = lm->h, .x = lm->x, .rows = NULL, .w = w, .n_row = T,
                                 .n_col = impl->cfg.n_embd, .eps = impl->cfg.rms_eps,
                                 .add = res->p, .add_stride = res->stride, .n_add = res->n};
    *res = (tm_cuda_proj){0};
    return TM_CUDA_OP(impl, TM_CUDA_ABL_NORM, what, tm_k_rmsnorm_bf16(&na, impl->stream, err));
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
        uint16_t *kc = impl->k_cache + (size_t)l * impl->layer_kv_elems;
        uint16_t *vc = impl->v_cache + (size_t)l * impl->layer_kv_elems;
        rc = residual_norm(impl, lm, T, &res, L->attn_norm, "attn_norm (+residual)", err);
        if (!rc)
            rc = tm_cuda_project(impl, TM_CUDA_ABL_QKV, "qkv_proj", L->w_qkv, lm->h, T, d,
                                 lm->qkv_dim, lm->qkv, 0.0f, &po, err);
        if (rc)
            return rc;
        tm_k_rope_kv_bf16_args ra = {
            .q = lm->q, .k_cache = kc, .v_cache = vc, .qkv = po.p, .bias = L->b_qkv,
            .pos = st->pos, .slot = st->slot, .inv_freq = lm->inv_freq, .n_tok = T,
            .n_head = c->n_head, .n_kv_head = c->n_kv_head, .head_dim = c->head_dim,
            .n_part = po.n, .part_stride = po.stride};
        rc = TM_CUDA_OP(impl, TM_CUDA_ABL_ROPE, "rope_kv", tm_k_rope_kv_bf16(&ra, s, err));
        if (rc)
            return rc;
        tm_k_attn_paged_bf16_args aa = {
            .out = lm->att, .q = lm->q, .k_cache = kc, .v_cache = vc, .pos = st->pos,
            .tok_seq = st->tok_seq, .seq_bt = st->seq_bt, .block_tables = st->block_tables,
            .part_acc = lm->part,
            .part_ml = lm->part + (size_t)T * c->n_head * n_split * c->head_dim,
            .n_tok = T, .n_head = c->n_head, .n_kv_head = c->n_kv_head,
            .head_dim = c->head_dim, .block_size = impl->eng.opts.block_size,
            .ld_q = lm->q_dim, .window = c->sliding_window, .n_split = n_split,
            .scale = 1.0f / sqrtf((float)c->head_dim)};
        tm_k_attn_prefill_bf16_args fa = {
            .out = lm->att, .q = lm->q, .k_cache = kc, .v_cache = vc, .seq_bt = st->seq_bt,
            .block_tables = st->block_tables, .tiles = st->tiles, .n_tile = st->n_tile,
            .n_head = c->n_head, .n_kv_head = c->n_kv_head, .head_dim = c->head_dim,
            .block_size = impl->eng.opts.block_size, .ld_q = lm->q_dim,
            .window = c->sliding_window, .scale = aa.scale};
        rc = st->n_tile ? TM_CUDA_OP(impl, TM_CUDA_ABL_NEVER, "attention (prefill)",
                                     tm_k_attn_prefill_bf16(&fa, s, err))
                        : TM_CUDA_OP(impl, TM_CUDA_ABL_ATTN, "attention (paged)",
                                     tm_k_attn_paged_bf16(&aa, s, err));
        if (!rc)
            rc = tm_cuda_project(impl, TM_CUDA_ABL_O, "o_proj", L->w_o, lm->att, T, lm->q_dim, d,
                                 lm->x, beta_res, &res, err);
        if (!rc)
            rc = residual_reduce(impl, lm, T, &res, beta_res, L->ffn_norm, err);
        if (!rc)
            rc = residual_norm(impl, lm, T, &res, L->ffn_norm, "ffn_norm (+residual)", err);
        if (!rc)
            rc = tm_cuda_project(impl, TM_CUDA_ABL_GU, "gate_up_proj", L->w_gu, lm->h, T, d,
                                 2 * ff, lm->gu, 0.0f, &po, err);
        if (rc)
            return rc;
        tm_k_silu_mul_bf16_args sa = {.out = lm->ffa, .gu = po.p, .n_tok = T, .n_ff = ff,
                                      .n_part = po.n, .part_stride = po.stride};
        rc = TM_CUDA_OP(impl, TM_CUDA_ABL_SILU, "silu_mul", tm_k_silu_mul_bf16(&sa, s, err));
        if (!rc)
            rc = tm_cuda_project(impl, TM_CUDA_ABL_DOWN, "down_proj", L->w_down, lm->ffa, T, ff,
                                 d, lm->x, beta_res, &res, err);
        if (!rc)
            rc = residual_reduce(impl, lm, T, &res, beta_res,
                                 l + 1 < c->n_layer ? lm->layers[l + 1].attn_norm : NULL, err);
        if (rc)
            return rc;
    }
    if (st->n_want == 0)
        return TM_OK;
    tm_k_rmsnorm_bf16_args na = {.out = lm->last, .x = lm->x, .rows = st->want_row,
                                 .w = lm->out_norm, .n_row = st->n_want, .n_col = d,
                                 .eps = c->rms_eps, .add = res.p, .add_stride = res.stride,
                                 .n_add = res.n};
    rc = TM_CUDA_OP(impl, TM_CUDA_ABL_LM, "final_norm", tm_k_rmsnorm_bf16(&na, s, err));
    if (!rc)
        rc = tm_cuda_project(impl, TM_CUDA_ABL_LM, NULL, lm->lm_head, lm->last, st->n_want, d,
                             c->n_vocab, impl->logits, 0.0f, &po, err);
    if (rc)
        return rc;
    // the skinny kernel's split-K partials, summed into the logits
    tm_k_sum_parts_args sp = {.y = impl->logits, .part = po.p, .stride = po.stride,
                              .n = (size_t)st->n_want * c->n_vocab, .n_part = po.n,
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
