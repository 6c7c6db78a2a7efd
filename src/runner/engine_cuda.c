/* runner/engine_cuda.c - the CUDA engine (see engine_cuda.h): the Llama-family forward pass on
 * one GPU with bf16 weights, cuBLAS projections and the kernels of kernels/.
 *
 * A step stacks the tokens of all its sequences (prefill chunks and decodes mixed) into one
 * [T][dim] activation matrix, as the CPU engine does. Per layer:
 *   rmsnorm(x) -> h (bf16); qkv = h @ Wqkv^T (fused q|k|v weight, fp32 out);
 *   rope_kv: bias, RoPE, q -> bf16, k/v -> paged cache; attn_paged -> att (bf16);
 *   x += att @ Wo^T (GEMM beta = 1); rmsnorm(x) -> h; gu = h @ Wgu^T (fused gate|up, fp32);
 *   act = silu(gate) * up (bf16); x += act @ Wdown^T.
 * Then the final norm gathers only the rows whose logits are wanted, and lm_head runs on them.
 *
 * Per-step metadata (token ids, positions, KV slots, token -> sequence, block tables) is packed
 * into a pinned host buffer and sent with one copy; its layout depends only on (T, n_seq), so a
 * decode step of T sequences always uses the same device addresses and its CUDA graph, captured
 * once, stays valid. The attention split count depends only on T for the same reason.
 *
 * Memory is allocated at create. Device pointers below are device memory unless marked host. */
#include "runner/engine_cuda.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <string.h>

#include "base/alloc.h"
#include "kernels/act.h"
#include "kernels/attn_paged.h"
#include "kernels/common.h"
#include "kernels/embed.h"
#include "kernels/fill.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/sample.h"
#include "runner/engine_cpu/ops.h"

#define GEMM_WS_BYTES ((size_t)32 << 20) /* cuBLAS workspace (needed for graph capture) */
#define ATTN_TARGET_BLOCKS 1056          /* about 8 attention blocks per SM of an H200 */
#define ATTN_MAX_SPLIT 32
#define UPLOAD_CHUNK ((size_t)1 << 22)   /* elements converted per host staging pass */
#define ALIGN_BYTES 256

typedef struct cuda_layer {
    uint16_t *w_qkv;   /* [q_dim + 2*kv_dim][n_embd] bf16: wq rows, then wk, then wv */
    uint16_t *w_o;     /* [n_embd][q_dim] */
    uint16_t *w_gu;    /* [2*n_ff][n_embd]: w_gate rows, then w_up */
    uint16_t *w_down;  /* [n_embd][n_ff] */
    float *b_qkv;      /* [q_dim + 2*kv_dim] fp32, NULL without bias */
    float *attn_norm;  /* [n_embd] fp32 */
    float *ffn_norm;   /* [n_embd] fp32 */
} cuda_layer;

typedef struct cuda_impl {
    tm_engine eng;             /* eng.impl points back here */
    tm_model_cfg cfg;
    cudaStream_t stream;       /* owned */
    cublasHandle_t blas;       /* owned, bound to stream */
    int dead;                  /* a CUDA error happened during forward */
    int use_graphs;
    uint32_t q_dim, kv_dim, qkv_dim;
    uint32_t max_pos;          /* n_kv_block * block_size */
    uint32_t bt_cap;           /* block table entries per step */
    /* weights: one allocation, carved */
    void *w_arena;             /* owned */
    uint16_t *embd;            /* [n_vocab][n_embd] */
    uint16_t *lm_head;         /* [n_vocab][n_embd]; == embd when tied */
    float *out_norm;           /* [n_embd] */
    float *inv_freq;           /* [head_dim/2] */
    cuda_layer *layers;        /* host array of n_layer, owned */
    /* KV cache: [layer][block][block_size][kv_dim] bf16 each */
    uint16_t *k_cache, *v_cache; /* owned */
    size_t layer_kv_elems;
    /* activations: one allocation, carved; T = max_batched_tokens, S = max_seqs */
    void *a_arena;             /* owned */
    float *x;                  /* [T][n_embd] residual stream */
    float *qkv;                /* [T][qkv_dim] */
    float *gu;                 /* [T][2*n_ff] */
    float *logits;             /* [S][n_vocab] */
    float *part;               /* attention split partials */
    size_t part_floats;
    uint16_t *h;               /* [T][n_embd] normed */
    uint16_t *q;               /* [T][q_dim] rotated */
    uint16_t *att;             /* [T][q_dim] */
    uint16_t *ffa;             /* [T][n_ff] */
    uint16_t *last;            /* [S][n_embd] final-normed wanted rows */
    uint32_t *ids;             /* [S] */
    void *gemm_ws;             /* [GEMM_WS_BYTES] */
    uint32_t *meta_d;          /* [meta_cap] step metadata */
    size_t meta_cap;
    /* pinned host staging, owned */
    uint32_t *meta_h;          /* host [meta_cap] */
    float *logits_h;           /* host [S][n_vocab] */
    uint32_t *ids_h;           /* host [S] */
    cudaGraphExec_t *graphs;   /* host array [S + 1]: decode steps of T sequences, or NULL */
} cuda_impl;

/* Offsets (in uint32) of the step metadata arrays for T tokens and S sequences. */
typedef struct meta_off {
    size_t tokens, pos, slot, tok_seq, seq_bt, want_row, bt;
} meta_off;

static meta_off meta_layout(uint32_t T, uint32_t S) {
    meta_off o;
    o.tokens = 0;
    o.pos = T;
    o.slot = 2 * (size_t)T;
    o.tok_seq = 3 * (size_t)T;
    o.seq_bt = 4 * (size_t)T;
    o.want_row = 4 * (size_t)T + S;
    o.bt = 4 * (size_t)T + 2 * (size_t)S;
    return o;
}

static void cuda_destroy(tm_engine *eng);
static tm_rc cuda_forward(tm_engine *eng, const tm_batch *b, float *logits, tm_err *err);
static tm_rc cuda_kv_copy(tm_engine *eng, uint32_t src, uint32_t dst, uint32_t n_tok,
                          tm_err *err);

static const tm_engine_ops cuda_ops = {
    .name = "cuda",
    .forward = cuda_forward,
    .kv_copy = cuda_kv_copy,
    .destroy = cuda_destroy,
};

// The first n_tok token slots of block src into block dst, in every layer: one strided copy per
// cache (a row per layer), ordered on the engine's stream with the forward passes.
static tm_rc cuda_kv_copy(tm_engine *eng, uint32_t src, uint32_t dst, uint32_t n_tok,
                          tm_err *err) {
    cuda_impl *impl = eng->impl;
    const uint32_t bs = eng->opts.block_size;
    if (impl->dead)
        return TM_ERR(err, TM_E_CUDA, "cuda engine: dead after an earlier CUDA error");
    if (src >= eng->opts.n_kv_block || dst >= eng->opts.n_kv_block || n_tok > bs)
        return TM_ERR(err, TM_E_INVAL, "kv_copy: block %u -> %u, %u tokens out of range", src, dst,
                      n_tok);
    if (n_tok == 0)
        return TM_OK;
    const size_t blk = (size_t)bs * impl->kv_dim, pitch = impl->layer_kv_elems * sizeof(uint16_t);
    const size_t width = (size_t)n_tok * impl->kv_dim * sizeof(uint16_t);
    uint16_t *caches[2] = {impl->k_cache, impl->v_cache};
    for (int c = 0; c < 2; c++) {
        tm_rc rc = TM_CUDA_CHECK(cudaMemcpy2DAsync(caches[c] + dst * blk, pitch,
                                                   caches[c] + src * blk, pitch, width,
                                                   impl->cfg.n_layer, cudaMemcpyDeviceToDevice,
                                                   impl->stream),
                                 err);
        if (rc) {
            impl->dead = 1;
            return rc;
        }
    }
    return TM_OK;
}

static tm_rc blas_check(cublasStatus_t st, const char *what, tm_err *err) {
    if (st == CUBLAS_STATUS_SUCCESS)
        return TM_OK;
    return TM_ERR(err, TM_E_CUDA, "cuda engine: %s: %s", what, cublasGetStatusString(st));
}

/* y[n_tok][n_out] (fp32 or bf16, row stride n_out) = x[n_tok][n_in] @ w[n_out][n_in]^T
 * + beta * y. Row-major y^T = w x^T in cuBLAS's column-major terms. */
static tm_rc gemm(cuda_impl *impl, const uint16_t *w, const uint16_t *x, void *y, int y_f32,
                  uint32_t n_tok, uint32_t n_in, uint32_t n_out, float beta, tm_err *err) {
    if (n_tok == 0)
        return TM_OK;
    const float alpha = 1.0f;
    cublasStatus_t st = cublasGemmEx(impl->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n_out,
                                     (int)n_tok, (int)n_in, &alpha, w, CUDA_R_16BF, (int)n_in, x,
                                     CUDA_R_16BF, (int)n_in, &beta, y,
                                     y_f32 ? CUDA_R_32F : CUDA_R_16BF, (int)n_out,
                                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    return blas_check(st, "cublasGemmEx", err);
}

/* Splits of the attention context for a step of T tokens: enough blocks to fill the GPU, as long
 * as the partials fit. Depends on T only (graph replay). */
static uint32_t attn_splits(const cuda_impl *impl, uint32_t T) {
    const uint32_t n_head = impl->cfg.n_head;
    uint32_t n = TM_CEIL_DIV(ATTN_TARGET_BLOCKS, T * n_head);
    n = TM_MIN(n, (uint32_t)ATTN_MAX_SPLIT);
    while (n > 1 && tm_k_attn_part_floats(T, n_head, n, impl->cfg.head_dim) > impl->part_floats)
        n--;
    return TM_MAX(n, 1u);
}

/* The whole model for a step whose metadata is already on the device (meta_layout(T, S)). */
static tm_rc run_model(cuda_impl *impl, uint32_t T, uint32_t S, uint32_t n_want, tm_err *err) {
    const tm_model_cfg *c = &impl->cfg;
    const uint32_t d = c->n_embd, ff = c->n_ff;
    const meta_off mo = meta_layout(T, S);
    const uint32_t *md = impl->meta_d;
    cudaStream_t s = impl->stream;
    tm_rc rc;

    tm_k_embed_bf16_args ea = {
        .x = impl->x, .table = impl->embd, .tokens = md + mo.tokens, .n_tok = T, .n_embd = d};
    rc = tm_k_embed_bf16(&ea, s, err);
    if (rc)
        return rc;
    const uint32_t n_split = attn_splits(impl, T);
    for (uint32_t l = 0; l < c->n_layer; l++) {
        const cuda_layer *L = &impl->layers[l];
        uint16_t *kc = impl->k_cache + (size_t)l * impl->layer_kv_elems;
        uint16_t *vc = impl->v_cache + (size_t)l * impl->layer_kv_elems;
        tm_k_rmsnorm_bf16_args na = {.out = impl->h, .x = impl->x, .rows = NULL,
                                     .w = L->attn_norm, .n_row = T, .n_col = d,
                                     .eps = c->rms_eps};
        rc = tm_k_rmsnorm_bf16(&na, s, err);
        if (!rc)
            rc = gemm(impl, L->w_qkv, impl->h, impl->qkv, 1, T, d, impl->qkv_dim, 0.0f, err);
        if (rc)
            return rc;
        tm_k_rope_kv_bf16_args ra = {
            .q = impl->q, .k_cache = kc, .v_cache = vc, .qkv = impl->qkv, .bias = L->b_qkv,
            .pos = md + mo.pos, .slot = md + mo.slot, .inv_freq = impl->inv_freq, .n_tok = T,
            .n_head = c->n_head, .n_kv_head = c->n_kv_head, .head_dim = c->head_dim};
        rc = tm_k_rope_kv_bf16(&ra, s, err);
        if (rc)
            return rc;
        tm_k_attn_paged_bf16_args aa = {
            .out = impl->att, .q = impl->q, .k_cache = kc, .v_cache = vc, .pos = md + mo.pos,
            .tok_seq = md + mo.tok_seq, .seq_bt = md + mo.seq_bt, .block_tables = md + mo.bt,
            .part_acc = impl->part,
            .part_ml = impl->part + (size_t)T * c->n_head * n_split * c->head_dim,
            .n_tok = T, .n_head = c->n_head, .n_kv_head = c->n_kv_head,
            .head_dim = c->head_dim, .block_size = impl->eng.opts.block_size,
            .ld_q = impl->q_dim, .window = c->sliding_window, .n_split = n_split,
            .scale = 1.0f / sqrtf((float)c->head_dim)};
        rc = tm_k_attn_paged_bf16(&aa, s, err);
        if (!rc)
            rc = gemm(impl, L->w_o, impl->att, impl->x, 1, T, impl->q_dim, d, 1.0f, err);
        if (rc)
            return rc;
        na.w = L->ffn_norm;
        rc = tm_k_rmsnorm_bf16(&na, s, err);
        if (!rc)
            rc = gemm(impl, L->w_gu, impl->h, impl->gu, 1, T, d, 2 * ff, 0.0f, err);
        if (rc)
            return rc;
        tm_k_silu_mul_bf16_args sa = {.out = impl->ffa, .gu = impl->gu, .n_tok = T, .n_ff = ff};
        rc = tm_k_silu_mul_bf16(&sa, s, err);
        if (!rc)
            rc = gemm(impl, L->w_down, impl->ffa, impl->x, 1, T, ff, d, 1.0f, err);
        if (rc)
            return rc;
    }
    if (n_want == 0)
        return TM_OK;
    tm_k_rmsnorm_bf16_args fa = {.out = impl->last, .x = impl->x, .rows = md + mo.want_row,
                                 .w = impl->out_norm, .n_row = n_want, .n_col = d,
                                 .eps = c->rms_eps};
    rc = tm_k_rmsnorm_bf16(&fa, s, err);
    if (rc)
        return rc;
    return gemm(impl, impl->lm_head, impl->last, impl->logits, 1, n_want, d, c->n_vocab, 0.0f,
                err);
}

/* Validate the batch (as the CPU engine does) and pack its metadata into meta_h. */
static tm_rc pack_batch(cuda_impl *impl, const tm_batch *b, uint32_t *T_out, uint32_t *n_want_out,
                        size_t *n_meta_out, int *decode_only, tm_err *err) {
    const tm_engine_opts *o = &impl->eng.opts;
    if (b->n_seq > o->max_seqs)
        return TM_ERR(err, TM_E_INVAL, "cuda forward: %u sequences > max_seqs %u", b->n_seq,
                      o->max_seqs);
    uint64_t T = 0, n_bt = 0;
    for (uint32_t i = 0; i < b->n_seq; i++) {
        const tm_batch_seq *s = &b->seqs[i];
        if (s->n_tok == 0 || !s->tokens)
            return TM_ERR(err, TM_E_INVAL, "cuda forward: sequence %u has no tokens", i);
        uint64_t end = (uint64_t)s->pos + s->n_tok;
        if (end > impl->max_pos || end > (uint64_t)s->n_block * o->block_size || !s->block_table)
            return TM_ERR(err, TM_E_INVAL,
                          "cuda forward: sequence %u positions [%u, %llu) not covered by its %u "
                          "blocks of %u (pool of %u)",
                          i, s->pos, (unsigned long long)end, s->n_block, o->block_size,
                          o->n_kv_block);
        uint32_t n_used = (uint32_t)TM_CEIL_DIV(end, o->block_size);
        for (uint32_t k = 0; k < n_used; k++)
            if (s->block_table[k] >= o->n_kv_block)
                return TM_ERR(err, TM_E_INVAL, "cuda forward: sequence %u block %u id %u >= %u",
                              i, k, s->block_table[k], o->n_kv_block);
        for (uint32_t k = 0; k < s->n_tok; k++)
            if (s->tokens[k] >= impl->cfg.n_vocab)
                return TM_ERR(err, TM_E_INVAL, "cuda forward: sequence %u token %u id %u >= %u",
                              i, k, s->tokens[k], impl->cfg.n_vocab);
        T += s->n_tok;
        n_bt += n_used;
    }
    if (T > o->max_batched_tokens)
        return TM_ERR(err, TM_E_INVAL, "cuda forward: %llu tokens > max_batched_tokens %u",
                      (unsigned long long)T, o->max_batched_tokens);
    if (n_bt > impl->bt_cap)
        return TM_ERR(err, TM_E_INVAL,
                      "cuda forward: %llu block table entries in one step > %u (max_seqs x "
                      "blocks of n_ctx)",
                      (unsigned long long)n_bt, impl->bt_cap);

    const meta_off mo = meta_layout((uint32_t)T, b->n_seq);
    uint32_t *mh = impl->meta_h;
    const uint32_t bs = o->block_size;
    uint32_t t = 0, n_want = 0, bt = 0;
    *decode_only = 1;
    for (uint32_t i = 0; i < b->n_seq; i++) {
        const tm_batch_seq *s = &b->seqs[i];
        const uint32_t n_used = (uint32_t)TM_CEIL_DIV((uint64_t)s->pos + s->n_tok, bs);
        mh[mo.seq_bt + i] = bt;
        memcpy(mh + mo.bt + bt, s->block_table, n_used * sizeof(uint32_t));
        bt += n_used;
        for (uint32_t k = 0; k < s->n_tok; k++, t++) {
            const uint32_t p = s->pos + k;
            mh[mo.tokens + t] = s->tokens[k];
            mh[mo.pos + t] = p;
            mh[mo.slot + t] = s->block_table[p / bs] * bs + p % bs;
            mh[mo.tok_seq + t] = i;
        }
        if (s->want_logits)
            mh[mo.want_row + n_want++] = t - 1;
        if (s->n_tok != 1 || !s->want_logits)
            *decode_only = 0;
    }
    *T_out = (uint32_t)T;
    *n_want_out = n_want;
    *n_meta_out = mo.bt + bt;
    return TM_OK;
}

/* Run the decode graph for T sequences, capturing it on first use. */
static tm_rc run_graph(cuda_impl *impl, uint32_t T, tm_err *err) {
    if (!impl->graphs[T]) {
        cudaGraph_t g = NULL;
        tm_rc rc = TM_CUDA_CHECK(
            cudaStreamBeginCapture(impl->stream, cudaStreamCaptureModeThreadLocal), err);
        if (rc)
            return rc;
        rc = run_model(impl, T, T, T, err);
        cudaError_t e = cudaStreamEndCapture(impl->stream, &g);
        if (!rc)
            rc = TM_CUDA_CHECK(e, err);
        if (!rc)
            rc = TM_CUDA_CHECK(cudaGraphInstantiate(&impl->graphs[T], g, 0), err);
        if (g)
            cudaGraphDestroy(g);
        if (rc)
            return rc;
    }
    return TM_CUDA_CHECK(cudaGraphLaunch(impl->graphs[T], impl->stream), err);
}

/* One step; fills logits (host, [n_want][n_vocab]) or ids (host, [n_want]). */
static tm_rc forward_step(cuda_impl *impl, const tm_batch *b, float *logits, uint32_t *ids,
                          tm_err *err) {
    if (impl->dead)
        return TM_ERR(err, TM_E_CUDA, "cuda engine: unusable after an earlier CUDA error");
    uint32_t T = 0, n_want = 0;
    size_t n_meta = 0;
    int decode_only = 0;
    tm_rc rc = pack_batch(impl, b, &T, &n_want, &n_meta, &decode_only, err);
    if (rc || T == 0)
        return rc;
    const size_t V = impl->cfg.n_vocab;
    rc = TM_CUDA_CHECK(cudaMemcpyAsync(impl->meta_d, impl->meta_h, n_meta * sizeof(uint32_t),
                                       cudaMemcpyHostToDevice, impl->stream),
                       err);
    if (!rc) {
        if (decode_only && impl->use_graphs)
            rc = run_graph(impl, T, err);
        else
            rc = run_model(impl, T, b->n_seq, n_want, err);
    }
    if (!rc && n_want && ids) {
        tm_k_argmax_f32_args ga = {
            .ids = impl->ids, .logits = impl->logits, .n_row = n_want, .n_col = (uint32_t)V};
        rc = tm_k_argmax_f32(&ga, impl->stream, err);
        if (!rc)
            rc = TM_CUDA_CHECK(cudaMemcpyAsync(impl->ids_h, impl->ids, n_want * sizeof(uint32_t),
                                               cudaMemcpyDeviceToHost, impl->stream),
                               err);
    } else if (!rc && n_want) {
        rc = TM_CUDA_CHECK(cudaMemcpyAsync(impl->logits_h, impl->logits,
                                           n_want * V * sizeof(float), cudaMemcpyDeviceToHost,
                                           impl->stream),
                           err);
    }
    if (!rc)
        rc = TM_CUDA_CHECK(cudaStreamSynchronize(impl->stream), err);
    if (rc) {
        impl->dead = 1;
        return rc;
    }
    if (n_want && ids)
        memcpy(ids, impl->ids_h, n_want * sizeof(uint32_t));
    else if (n_want)
        memcpy(logits, impl->logits_h, n_want * V * sizeof(float));
    return TM_OK;
}

static tm_rc cuda_forward(tm_engine *eng, const tm_batch *b, float *logits, tm_err *err) {
    return forward_step(eng->impl, b, logits, NULL, err);
}

tm_rc tm_engine_cuda_forward_greedy(tm_engine *eng, const tm_batch *b, uint32_t *ids,
                                    tm_err *err) {
    if (!eng || eng->ops != &cuda_ops)
        return TM_ERR(err, TM_E_INVAL, "cuda forward_greedy: not a CUDA engine");
    return forward_step(eng->impl, b, NULL, ids, err);
}

void tm_engine_cuda_set_graphs(tm_engine *eng, int on) {
    if (eng && eng->ops == &cuda_ops)
        ((cuda_impl *)eng->impl)->use_graphs = on;
}

/* ---- create / destroy ---- */

static tm_rc check_tensor(const tm_tensor *t, const char *name, uint32_t layer, uint64_t d0,
                          uint64_t d1, tm_err *err) {
    uint32_t n_dim = d1 ? 2 : 1;
    if (!t->data)
        return TM_ERR(err, TM_E_INVAL, "cuda engine: layer %u %s missing", layer, name);
    if (tm_cpu_dtype_size(t->dtype) == 0)
        return TM_ERR(err, TM_E_INVAL, "cuda engine: layer %u %s: unknown dtype %d", layer, name,
                      (int)t->dtype);
    if (t->n_dim != n_dim || t->shape[0] != d0 || (d1 && t->shape[1] != d1))
        return TM_ERR(err, TM_E_INVAL,
                      "cuda engine: layer %u %s: shape [%llu, %llu] (n_dim %u), want [%llu, %llu]",
                      layer, name, (unsigned long long)t->shape[0],
                      (unsigned long long)(t->n_dim > 1 ? t->shape[1] : 0), t->n_dim,
                      (unsigned long long)d0, (unsigned long long)d1);
    return TM_OK;
}

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

static tm_rc check_model(const tm_model *m, tm_err *err) {
    const tm_model_cfg *c = &m->cfg;
    const uint64_t d = c->n_embd, qd = (uint64_t)c->n_head * c->head_dim;
    const uint64_t kvd = (uint64_t)c->n_kv_head * c->head_dim;
    tm_rc rc = check_tensor(&m->embd, "embed_tokens", 0, c->n_vocab, d, err);
    if (!rc)
        rc = check_tensor(&m->out_norm, "norm", 0, d, 0, err);
    if (!rc && !c->tie_embd && !m->lm_head.data)
        rc = TM_ERR(err, TM_E_INVAL, "cuda engine: untied model without lm_head");
    if (!rc)
        rc = check_tensor(m->lm_head.data ? &m->lm_head : &m->embd, "lm_head", 0, c->n_vocab, d,
                          err);
    for (uint32_t l = 0; !rc && l < c->n_layer; l++) {
        const tm_layer_w *L = &m->layers[l];
        rc = check_tensor(&L->attn_norm, "input_layernorm", l, d, 0, err);
        if (!rc)
            rc = check_tensor(&L->wq, "q_proj", l, qd, d, err);
        if (!rc)
            rc = check_tensor(&L->wk, "k_proj", l, kvd, d, err);
        if (!rc)
            rc = check_tensor(&L->wv, "v_proj", l, kvd, d, err);
        if (!rc && c->qkv_bias)
            rc = check_tensor(&L->bq, "q_proj.bias", l, qd, 0, err);
        if (!rc && c->qkv_bias)
            rc = check_tensor(&L->bk, "k_proj.bias", l, kvd, 0, err);
        if (!rc && c->qkv_bias)
            rc = check_tensor(&L->bv, "v_proj.bias", l, kvd, 0, err);
        if (!rc)
            rc = check_tensor(&L->wo, "o_proj", l, d, qd, err);
        if (!rc)
            rc = check_tensor(&L->ffn_norm, "post_attention_layernorm", l, d, 0, err);
        if (!rc)
            rc = check_tensor(&L->w_gate, "gate_proj", l, c->n_ff, d, err);
        if (!rc)
            rc = check_tensor(&L->w_up, "up_proj", l, c->n_ff, d, err);
        if (!rc)
            rc = check_tensor(&L->w_down, "down_proj", l, d, c->n_ff, err);
    }
    return rc;
}

/* Carves aligned pieces out of one allocation; with base NULL it only counts bytes. */
typedef struct carver {
    char *base;
    size_t off;
} carver;

static void *carve(carver *cv, size_t bytes) {
    size_t at = TM_CEIL_DIV(cv->off, (size_t)ALIGN_BYTES) * ALIGN_BYTES;
    cv->off = at + bytes;
    return cv->base ? cv->base + at : NULL;
}

static void carve_weights(cuda_impl *impl, carver *cv) {
    const tm_model_cfg *c = &impl->cfg;
    const size_t d = c->n_embd, ff = c->n_ff, bf = sizeof(uint16_t), f4 = sizeof(float);
    impl->embd = carve(cv, (size_t)c->n_vocab * d * bf);
    impl->lm_head = c->tie_embd ? impl->embd : carve(cv, (size_t)c->n_vocab * d * bf);
    impl->out_norm = carve(cv, d * f4);
    impl->inv_freq = carve(cv, c->head_dim / 2 * f4);
    for (uint32_t l = 0; l < c->n_layer; l++) {
        cuda_layer *L = &impl->layers[l];
        L->w_qkv = carve(cv, (size_t)impl->qkv_dim * d * bf);
        L->w_o = carve(cv, d * impl->q_dim * bf);
        L->w_gu = carve(cv, 2 * ff * d * bf);
        L->w_down = carve(cv, d * ff * bf);
        L->b_qkv = c->qkv_bias ? carve(cv, impl->qkv_dim * f4) : NULL;
        L->attn_norm = carve(cv, d * f4);
        L->ffn_norm = carve(cv, d * f4);
    }
}

static void carve_acts(cuda_impl *impl, carver *cv) {
    const tm_model_cfg *c = &impl->cfg;
    const size_t T = impl->eng.opts.max_batched_tokens, S = impl->eng.opts.max_seqs;
    const size_t d = c->n_embd, ff = c->n_ff, bf = sizeof(uint16_t), f4 = sizeof(float);
    impl->x = carve(cv, T * d * f4);
    impl->qkv = carve(cv, T * impl->qkv_dim * f4);
    impl->gu = carve(cv, T * 2 * ff * f4);
    impl->logits = carve(cv, S * c->n_vocab * f4);
    impl->part = carve(cv, impl->part_floats * f4);
    impl->h = carve(cv, T * d * bf);
    impl->q = carve(cv, T * impl->q_dim * bf);
    impl->att = carve(cv, T * impl->q_dim * bf);
    impl->ffa = carve(cv, T * ff * bf);
    impl->last = carve(cv, S * d * bf);
    impl->ids = carve(cv, S * sizeof(uint32_t));
    impl->gemm_ws = carve(cv, GEMM_WS_BYTES);
    impl->meta_d = carve(cv, impl->meta_cap * sizeof(uint32_t));
}

/* Copy rows [0, n_row) of t (any dtype) to dst as bf16, converting on the host in chunks. */
static tm_rc upload_bf16(uint16_t *dst, const tm_tensor *t, uint16_t *stage, tm_err *err) {
    const size_t n = (size_t)tm_tensor_n_elem(t);
    if (t->dtype == TM_DTYPE_BF16)
        return TM_CUDA_CHECK(cudaMemcpy(dst, t->data, n * 2, cudaMemcpyHostToDevice), err);
    float *f = (float *)(stage + UPLOAD_CHUNK); // stage holds UPLOAD_CHUNK bf16 + floats
    for (size_t i = 0; i < n; i += UPLOAD_CHUNK) {
        const size_t k = TM_MIN((size_t)UPLOAD_CHUNK, n - i);
        tm_cpu_to_f32(t->data, t->dtype, i, k, f);
        for (size_t j = 0; j < k; j++)
            stage[j] = tm_cpu_f32_to_bf16(f[j]);
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
    tm_cpu_to_f32(t->data, t->dtype, 0, n, f);
    return TM_CUDA_CHECK(cudaMemcpy(dst, f, n * sizeof(float), cudaMemcpyHostToDevice), err);
}

static tm_rc upload_weights(cuda_impl *impl, const tm_model *m, tm_err *err) {
    const tm_model_cfg *c = &impl->cfg;
    const size_t d = c->n_embd, ff = c->n_ff;
    // staging: UPLOAD_CHUNK bf16 followed by UPLOAD_CHUNK floats
    uint16_t *stage = tm_malloc(UPLOAD_CHUNK * (sizeof(uint16_t) + sizeof(float)));
    if (!stage)
        return TM_ERR(err, TM_E_NOMEM, "cuda engine: upload staging buffer");
    tm_rc rc = upload_bf16(impl->embd, &m->embd, stage, err);
    if (!rc && !c->tie_embd)
        rc = upload_bf16(impl->lm_head, m->lm_head.data ? &m->lm_head : &m->embd, stage, err);
    if (!rc)
        rc = upload_f32(impl->out_norm, &m->out_norm, stage, err);
    for (uint32_t l = 0; !rc && l < c->n_layer; l++) {
        const tm_layer_w *W = &m->layers[l];
        cuda_layer *L = &impl->layers[l];
        rc = upload_bf16(L->w_qkv, &W->wq, stage, err);
        if (!rc)
            rc = upload_bf16(L->w_qkv + (size_t)impl->q_dim * d, &W->wk, stage, err);
        if (!rc)
            rc = upload_bf16(L->w_qkv + (size_t)(impl->q_dim + impl->kv_dim) * d, &W->wv, stage,
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
                rc = upload_f32(L->b_qkv + impl->q_dim, &W->bk, stage, err);
            if (!rc)
                rc = upload_f32(L->b_qkv + impl->q_dim + impl->kv_dim, &W->bv, stage, err);
        }
        if (!rc)
            rc = upload_f32(L->attn_norm, &W->attn_norm, stage, err);
        if (!rc)
            rc = upload_f32(L->ffn_norm, &W->ffn_norm, stage, err);
    }
    tm_free(stage);
    return rc;
}

static tm_rc fill_mat(cuda_impl *impl, uint16_t *p, size_t n_out, size_t n_in, uint64_t seed,
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

static tm_rc fill_weights(cuda_impl *impl, uint64_t seed, tm_err *err) {
    const tm_model_cfg *c = &impl->cfg;
    const size_t d = c->n_embd, ff = c->n_ff;
    uint64_t k = seed * 1000003ull;
    tm_rc rc = fill_mat(impl, impl->embd, c->n_vocab, d, k++, err);
    if (!rc && !c->tie_embd)
        rc = fill_mat(impl, impl->lm_head, c->n_vocab, d, k++, err);
    if (!rc)
        rc = fill_vec_f32(impl->out_norm, d, k++, 0.1f, 1.0f, err);
    for (uint32_t l = 0; !rc && l < c->n_layer; l++) {
        cuda_layer *L = &impl->layers[l];
        rc = fill_mat(impl, L->w_qkv, impl->qkv_dim, d, k++, err);
        if (!rc)
            rc = fill_mat(impl, L->w_o, d, impl->q_dim, k++, err);
        if (!rc)
            rc = fill_mat(impl, L->w_gu, 2 * ff, d, k++, err);
        if (!rc)
            rc = fill_mat(impl, L->w_down, d, ff, k++, err);
        if (!rc && L->b_qkv)
            rc = fill_vec_f32(L->b_qkv, impl->qkv_dim, k++, 0.1f, 0.0f, err);
        if (!rc)
            rc = fill_vec_f32(L->attn_norm, d, k++, 0.1f, 1.0f, err);
        if (!rc)
            rc = fill_vec_f32(L->ffn_norm, d, k++, 0.1f, 1.0f, err);
    }
    if (!rc)
        rc = TM_CUDA_CHECK(cudaStreamSynchronize(impl->stream), err);
    return rc;
}

static tm_rc create(const tm_model *m, const tm_engine_opts *opts, int random, uint64_t seed,
                    tm_engine **out, tm_err *err) {
    if (!opts->block_size || !opts->n_kv_block || !opts->max_seqs || !opts->max_batched_tokens)
        return TM_ERR(err, TM_E_INVAL,
                      "cuda engine: block_size, n_kv_block, max_seqs and max_batched_tokens "
                      "must be > 0");
    if (opts->tp_size > 1)
        return TM_ERR(err, TM_E_INVAL, "cuda engine: tensor parallel (tp_size %u) not supported",
                      opts->tp_size);
    tm_rc rc = check_cfg(&m->cfg, err);
    if (!rc && !random)
        rc = check_model(m, err);
    if (rc)
        return rc;
    const uint64_t max_pos = (uint64_t)opts->n_kv_block * opts->block_size;
    if (max_pos > UINT32_MAX)
        return TM_ERR(err, TM_E_INVAL, "cuda engine: KV pool of %llu positions too large",
                      (unsigned long long)max_pos);
    int n_dev = 0;
    cudaError_t ce = cudaGetDeviceCount(&n_dev);
    if (ce != cudaSuccess)
        return TM_ERR(err, TM_E_CUDA, "cuda engine: no usable GPU: cudaGetDeviceCount: %s (%s)",
                      cudaGetErrorString(ce), cudaGetErrorName(ce));
    if (n_dev == 0)
        return TM_ERR(err, TM_E_CUDA, "cuda engine: no usable GPU: no CUDA device found");

    cuda_impl *impl = tm_calloc(1, sizeof(*impl));
    if (!impl)
        return TM_ERR(err, TM_E_NOMEM, "cuda engine header");
    const tm_model_cfg *c = &m->cfg;
    impl->eng.ops = &cuda_ops;
    impl->eng.model = m;
    impl->eng.opts = *opts;
    impl->eng.impl = impl;
    impl->cfg = *c;
    impl->use_graphs = 1;
    impl->q_dim = c->n_head * c->head_dim;
    impl->kv_dim = c->n_kv_head * c->head_dim;
    impl->qkv_dim = impl->q_dim + 2 * impl->kv_dim;
    impl->max_pos = (uint32_t)max_pos;
    const uint32_t S = opts->max_seqs, T = opts->max_batched_tokens;
    // Block-table entries per step: each sequence covers at most min(pool, n_ctx) positions.
    const uint64_t seq_pos = TM_MIN(max_pos, (uint64_t)TM_MAX(c->n_ctx, 1u));
    const uint64_t bt_cap = (uint64_t)S * TM_CEIL_DIV(seq_pos, opts->block_size);
    impl->bt_cap = (uint32_t)TM_MIN(bt_cap, (uint64_t)UINT32_MAX / 2);
    impl->meta_cap = 4 * (size_t)T + 2 * (size_t)S + impl->bt_cap;
    // attention partials: split only while T * n_head < ATTN_TARGET_BLOCKS (see attn_splits)
    impl->part_floats = tm_k_attn_part_floats(1, 2 * ATTN_TARGET_BLOCKS, 1, c->head_dim);
    impl->layer_kv_elems = (size_t)max_pos * impl->kv_dim;

    impl->layers = tm_calloc(c->n_layer, sizeof(cuda_layer));
    impl->graphs = tm_calloc((size_t)S + 1, sizeof(cudaGraphExec_t));
    if (!impl->layers || !impl->graphs) {
        TM_ERR(err, TM_E_NOMEM, "cuda engine: %u layers", c->n_layer);
        goto fail;
    }
    rc = TM_CUDA_CHECK(cudaSetDevice(0), err);
    if (!rc)
        rc = TM_CUDA_CHECK(cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking), err);
    if (rc)
        goto fail;

    carver cw = {0};
    carve_weights(impl, &cw);
    carver ca = {0};
    carve_acts(impl, &ca);
    const size_t kv_bytes = (size_t)c->n_layer * impl->layer_kv_elems * sizeof(uint16_t);
    rc = TM_CUDA_CHECK(cudaMalloc(&impl->w_arena, cw.off), err);
    if (!rc)
        rc = TM_CUDA_CHECK(cudaMalloc(&impl->a_arena, ca.off), err);
    if (!rc)
        rc = TM_CUDA_CHECK(cudaMalloc((void **)&impl->k_cache, kv_bytes), err);
    if (!rc)
        rc = TM_CUDA_CHECK(cudaMalloc((void **)&impl->v_cache, kv_bytes), err);
    if (!rc)
        rc = TM_CUDA_CHECK(cudaMallocHost((void **)&impl->meta_h, impl->meta_cap * 4), err);
    if (!rc)
        rc = TM_CUDA_CHECK(
            cudaMallocHost((void **)&impl->logits_h, (size_t)S * c->n_vocab * sizeof(float)), err);
    if (!rc)
        rc = TM_CUDA_CHECK(cudaMallocHost((void **)&impl->ids_h, (size_t)S * 4), err);
    if (rc) {
        tm_err_wrap(err, "cuda engine: weights %.2f GB, activations %.2f GB, KV %.2f GB: ",
                    cw.off / 1e9, ca.off / 1e9, 2 * kv_bytes / 1e9);
        goto fail;
    }
    cw = (carver){.base = impl->w_arena};
    carve_weights(impl, &cw);
    ca = (carver){.base = impl->a_arena};
    carve_acts(impl, &ca);
    // Zero the KV cache once so that no step can read uninitialised memory as NaN.
    rc = TM_CUDA_CHECK(cudaMemset(impl->k_cache, 0, kv_bytes), err);
    if (!rc)
        rc = TM_CUDA_CHECK(cudaMemset(impl->v_cache, 0, kv_bytes), err);
    if (rc)
        goto fail;

    rc = blas_check(cublasCreate(&impl->blas), "cublasCreate", err);
    if (!rc)
        rc = blas_check(cublasSetStream(impl->blas, impl->stream), "cublasSetStream", err);
    if (!rc)
        rc = blas_check(cublasSetWorkspace(impl->blas, impl->gemm_ws, GEMM_WS_BYTES),
                        "cublasSetWorkspace", err);
    if (rc)
        goto fail;

    float inv_freq[TM_ATTN_MAX_HEAD_DIM / 2];
    tm_cpu_rope_inv_freq(c, inv_freq);
    rc = TM_CUDA_CHECK(cudaMemcpy(impl->inv_freq, inv_freq, c->head_dim / 2 * sizeof(float),
                                  cudaMemcpyHostToDevice),
                       err);
    if (!rc)
        rc = random ? fill_weights(impl, seed, err) : upload_weights(impl, m, err);
    if (rc)
        goto fail;
    *out = &impl->eng;
    return TM_OK;
fail:
    cuda_destroy(&impl->eng);
    return err->rc;
}

tm_rc tm_engine_cuda_create(const tm_model *m, const tm_engine_opts *opts, tm_engine **out,
                            tm_err *err) {
    return create(m, opts, 0, 0, out, err);
}

tm_rc tm_engine_cuda_create_random(const tm_model *m, const tm_engine_opts *opts, uint64_t seed,
                                   tm_engine **out, tm_err *err) {
    return create(m, opts, 1, seed, out, err);
}

static void cuda_destroy(tm_engine *eng) {
    if (!eng)
        return;
    cuda_impl *impl = eng->impl;
    if (impl->stream)
        cudaStreamSynchronize(impl->stream); // nothing may still use the buffers
    if (impl->graphs) {
        for (uint32_t i = 0; i <= impl->eng.opts.max_seqs; i++)
            if (impl->graphs[i])
                cudaGraphExecDestroy(impl->graphs[i]);
        tm_free(impl->graphs);
    }
    if (impl->blas)
        cublasDestroy(impl->blas);
    cudaFree(impl->w_arena);
    cudaFree(impl->a_arena);
    cudaFree(impl->k_cache);
    cudaFree(impl->v_cache);
    cudaFreeHost(impl->meta_h);
    cudaFreeHost(impl->logits_h);
    cudaFreeHost(impl->ids_h);
    if (impl->stream)
        cudaStreamDestroy(impl->stream);
    tm_free(impl->layers);
    tm_free(impl);
}
