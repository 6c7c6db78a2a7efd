/* runner/engine/cuda/engine_cuda.c - the CUDA engine (see engine_cuda.h): the Llama-family forward pass on
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
 * Tensor parallel (tp_size > 1, tm_engine_cuda_tp_create): one process per GPU. Each rank holds
 * the shard of runner/tp/shard.c (query heads, KV heads or a replicated one, MLP rows
 * and columns, a vocabulary slice of the embedding and LM head). The embedding is gathered from
 * the slice (zeros elsewhere) and summed across ranks; o_proj and down_proj write rank 0's
 * partial product plus the residual (GEMM beta 1) and the other ranks' partial products alone
 * (beta 0) into x, and an NCCL all-reduce (fp32 sum, in place) makes x the full residual stream
 * on every rank. The LM head gives each rank the logits of its slice: greedy steps gather one
 * (max, id) candidate per row and rank and merge them on the device; logits steps all-gather the
 * slices. Rank 0 sends each step's plan (the packed metadata below, with a small header) to the
 * other ranks over the rendezvous connection before it launches its own work; the others run
 * tm_engine_cuda_tp_serve. Decode steps replay CUDA graphs on every rank, all-reduces included
 * (NCCL kernels are captured like any other). While a step runs, a watchdog thread of each rank
 * checks the control connections, NCCL's asynchronous errors and the step's age: a peer that
 * exits, reports a failure or does not finish within the timeout makes it abort the communicator
 * (from its own thread, since NCCL host calls, e.g. lazy connection set-up or graph buffer
 * registration, can block on a dead peer), and the step fails with a message naming the peer.
 *
 * Memory is allocated at create. Device pointers below are device memory unless marked host. */
#include "runner/engine/cuda/engine_cuda.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/log.h"
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
#include "kernels/sample.h"
#include "kernels/tp.h"
#include "runner/tp/shard.h"
#include "runner/tp/rendezvous.h"
#include "runner/tp/tp_nccl.h"

#define GEMM_WS_BYTES ((size_t)32 << 20) /* cuBLAS workspace (needed for graph capture) */
#define ATTN_PART_HEADS 4096             /* (token, head, split) partials the attention may use */
#define UPLOAD_CHUNK ((size_t)1 << 22)   /* elements converted per host staging pass */
#define ALIGN_BYTES 256
#define PLAN_MSG TM_RDZV_MSG_USER   /* rendezvous message type of a step plan */
#define SPIN_PLAN_MS 20.0           /* ranks > 0 poll this long for the next plan, then block */
#define DEAD_WAIT_MS 10000          /* destroy after a TP failure waits this long, then leaks */
#define PROF_EVENTS 1024            /* TM_CUDA_PROFILE: events per step */
#define PROF_KINDS 24
#define KV_HEADROOM_BYTES ((size_t)1 << 30) /* kept free when the KV pool is sized from free
                                             * memory: cuBLAS, CUDA graphs, NCCL buffers */
#define GPU_MEM_UTIL_DEFAULT 0.90f

/* A step plan as rank 0 sends it to the other ranks: this header, then n_meta uint32 of packed
 * metadata (meta_layout(T, S)). */
enum { PLAN_STEP = 1, PLAN_KV_COPY, PLAN_STOP };
typedef struct plan_hdr {
    uint32_t op;               /* PLAN_* */
    uint32_t T, S, n_want;     /* step: tokens, sequences, rows wanting logits */
    uint32_t graph;            /* 1: a pure decode step (CUDA graph of T sequences) */
    uint32_t greedy;           /* 1: ids only (candidates), 0: full logits to rank 0 */
    uint32_t vocab_limit;      /* greedy: only ids below it compete, 1 .. the model's n_vocab */
    uint32_t n_meta;           /* uint32 that follow */
    uint32_t kv_src, kv_dst, kv_n_tok; /* PLAN_KV_COPY */
    uint32_t n_tile;           /* prefill attention tiles (4 uint32 each) ending the metadata;
                                  0: the step uses attn_paged */
} plan_hdr;

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
    float *sk_part;            /* split-K partials of the skinny projections (decode steps) */
    size_t sk_part_floats;
    uint32_t sk_max_tok;       /* steps of at most this many tokens use gemm_skinny; 0: none */
    uint32_t n_sm;             /* multiprocessors of the device (split-K planning) */
    int use_fa;                /* prefill steps use the tensor-core attn_prefill kernel */
    uint32_t ablate;           /* TM_CUDA_ABLATE: ops not launched (benchmarks only), ABL_* bits */
    /* TP inside one node: the one-shot peer-memory all-reduce (kernels/allreduce.h) for steps
     * of at most TM_AR_MAX_ROWS tokens (decode); NCCL otherwise or when ar_on is 0. */
    int ar_on;
    uint32_t ar_d;             /* row length the regions were sized for */
    void *ar_regions[TM_AR_MAX_RANKS]; /* [tp_rank]: own (owned); others: IPC-opened peers' */
    /* TM_CUDA_PROFILE=1: GPU time per op kind of eager steps (events between launches; decode
     * graphs are not split up, so run with graphs off), printed at destroy. */
    int prof;
    uint32_t prof_n;                  /* events recorded in this step */
    cudaEvent_t prof_ev[PROF_EVENTS]; /* [0]: step start */
    const char *prof_what[PROF_EVENTS];
    const char *prof_kind[PROF_KINDS];
    double prof_ms[PROF_KINDS];
    uint64_t prof_calls[PROF_KINDS];
    tm_k_attn_prefill_chunk *chunks_h; /* host [S] scratch of pack_batch, owned */
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
    plan_hdr *plan_h;          /* host: a plan header followed by meta_h */
    uint32_t *meta_h;          /* host [meta_cap], inside plan_h's allocation */
    float *logits_h;           /* host [S][n_vocab]; with TP [tp][S][v_per] gathered slices */
    uint32_t *ids_h;           /* host [S] */
    cudaGraphExec_t *graphs;   /* host array [S + 1]: decode steps of T sequences, or NULL */
    int device;                /* CUDA device ordinal */
    uint32_t v_stride;         /* row stride of logits: n_vocab, or v_per with TP */
    /* tensor parallel (tp_size > 1); cfg above is this rank's shard */
    uint32_t tp_rank, tp_size;
    uint32_t vocab_full;       /* the model's n_vocab */
    uint32_t vocab0, v_per;    /* this rank's first vocabulary row; rows per rank (last: fewer) */
    tm_nccl *nccl;             /* owned; NULL without TP or after an abort */
    tm_rdzv *rdzv;             /* borrowed: plans out (rank 0) or in (the others) */
    uint32_t timeout_ms;       /* a step running longer means a rank hung */
    float *logits_all;         /* [tp][S][v_per] gathered slices (TP) */
    uint32_t *cand, *cand_all; /* [S][2] this rank's argmax candidates, [tp][S][2] gathered */
    /* TP watchdog thread; wd_mu guards the wd_ fields below it */
    pthread_t wd;
    int wd_started;
    pthread_mutex_t wd_mu;
    int wd_busy;               /* a step is in flight since wd_t0 */
    int wd_quit;
    int wd_aborted;            /* the communicator was aborted (by either thread) */
    double wd_t0;
    tm_err wd_err;             /* why the watchdog aborted */
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
static tm_rc cuda_forward_greedy(tm_engine *eng, const tm_batch *b, uint32_t n_vocab_limit,
                                 uint32_t *ids, tm_err *err);
static tm_rc cuda_kv_copy(tm_engine *eng, uint32_t src, uint32_t dst, uint32_t n_tok,
                          tm_err *err);

static const tm_engine_ops cuda_ops = {
    .name = "cuda",
    .forward = cuda_forward,
    .forward_greedy = cuda_forward_greedy,
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
    cudaSetDevice(impl->device);
    if (impl->tp_size > 1 && impl->tp_rank == 0) {
        plan_hdr h = {.op = PLAN_KV_COPY, .kv_src = src, .kv_dst = dst, .kv_n_tok = n_tok};
        tm_rc rc = tm_rdzv_bcast(impl->rdzv, PLAN_MSG, &h, sizeof(h), NULL, 0, err);
        if (rc) {
            impl->dead = 1;
            return rc;
        }
    }
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

/* A projection's result as the consumer reads it: n partial products (split-K, summed in
 * order by the consumer) stride floats apart, each [T][n_out] fp32; n == 1: p is the result. */
typedef struct proj_out {
    float *p;
    uint32_t n;
    size_t stride;
} proj_out;

/* TM_CUDA_ABLATE=op,op,...: the ops named are planned but not launched, so that a benchmark can
 * measure what each kind of op costs inside the decode graph (no profiler sees into a graph, and
 * eager timings are dominated by launch gaps). The outputs are then meaningless: for benchmarks
 * only, and the engine says so at create. */
enum { ABL_NORM, ABL_QKV, ABL_ROPE, ABL_ATTN, ABL_O, ABL_AR, ABL_GU, ABL_SILU, ABL_DOWN, ABL_LM,
       ABL_N };
static const char *const abl_names[ABL_N] = {"norm", "qkv", "rope", "attn", "o",
                                              "ar",   "gu",  "silu", "down", "lm"};

static int ablated(const cuda_impl *impl, int op) {
    return (impl->ablate >> op) & 1u;
}

/* The ABL_* bits of a comma-separated list of abl_names; unknown names are ignored. */
static uint32_t parse_ablate(const char *list) {
    uint32_t bits = 0;
    for (const char *p = list; p && *p;) {
        const size_t n = strcspn(p, ",");
        for (int i = 0; i < ABL_N; i++)
            if (strlen(abl_names[i]) == n && strncmp(p, abl_names[i], n) == 0)
                bits |= 1u << i;
        p += n + (p[n] == ',');
    }
    return bits;
}

/* y = x[T][n_in] @ w[n_out][n_in]^T. Steps of at most sk_max_tok tokens (decode) use the
 * tensor-core skinny kernel: split-K partials in sk_part (or straight into dst when the plan has
 * one split and beta is 0), which the consumer sums; beta is then NOT applied (a residual
 * consumer adds the partials into x itself). Larger steps use cuBLAS into dst with beta. */
static tm_rc project(cuda_impl *impl, int op, const uint16_t *w, const uint16_t *x, uint32_t T,
                     uint32_t n_in, uint32_t n_out, float *dst, float beta, proj_out *out,
                     tm_err *err) {
    if (T <= impl->sk_max_tok && tm_k_gemm_skinny_fits(T, n_in, n_out)) {
        uint32_t kps = 0;
        const uint32_t n_split = tm_k_gemm_skinny_splits(n_in, n_out, impl->n_sm, &kps);
        float *part = n_split == 1 && beta == 0.0f ? dst : impl->sk_part;
        TM_ASSERT((size_t)n_split * T * n_out <= impl->sk_part_floats);
        tm_k_gemm_skinny_args ga = {.part = part, .w = w, .x = x, .n_tok = T, .n_in = n_in,
                                    .n_out = n_out, .n_split = n_split, .k_per_split = kps};
        *out = (proj_out){.p = part, .n = n_split, .stride = (size_t)T * n_out};
        return ablated(impl, op) ? TM_OK : tm_k_gemm_skinny(&ga, impl->stream, err);
    }
    *out = (proj_out){.p = dst, .n = 1, .stride = 0};
    if (ablated(impl, op))
        return TM_OK;
    return gemm(impl, w, x, dst, 1, T, n_in, n_out, beta, err);
}

/* Floats of sk_part for the model's projections at up to T tokens. */
static size_t skinny_part_floats(const cuda_impl *impl, uint32_t T) {
    const tm_model_cfg *c = &impl->cfg;
    const uint32_t shapes[5][2] = {{c->n_embd, impl->qkv_dim}, {impl->q_dim, c->n_embd},
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

/* Splits of the attention context for a step of T tokens: enough blocks to fill the GPU, as long
 * as the partials fit. Depends on T only (graph replay). */
static uint32_t attn_splits(const cuda_impl *impl, uint32_t T) {
    return tm_k_attn_paged_splits(T, impl->cfg.n_head, impl->cfg.n_kv_head, impl->cfg.head_dim,
                                  impl->n_sm, impl->part_floats);
}

/* Tensor parallel, after the embedding or a residual projection (o_proj, down_proj) into x:
 * make x the full residual stream on every rank and, with w, h = RMSNorm(x) for the next
 * block. This rank's part is x as cuBLAS left it (rank 0: residual + product; the others:
 * product), or with the skinny kernel the split-K partials in *res plus beta * x. Decode-sized
 * steps (T <= TM_AR_MAX_ROWS) over peer memory do it all in one kernel (kernels/allreduce.h);
 * otherwise sum_parts, an NCCL all-reduce and the RMSNorm kernel. *res is consumed. */
static tm_rc tp_reduce_norm(cuda_impl *impl, uint32_t T, proj_out *res, float beta,
                            const float *w, tm_err *err) {
    const uint32_t d = impl->cfg.n_embd;
    const int skinny = res && res->p && res->p != impl->x;
    tm_rc rc = TM_OK;
    if (ablated(impl, ABL_AR)) { // benchmarks only: nothing launched
    } else if (impl->ar_on && T <= TM_AR_MAX_ROWS && d % 4 == 0) {
        tm_k_allreduce_args a = {.x = impl->x, .n_tok = T, .d = d, .d_cap = impl->ar_d,
                                 .rank = impl->tp_rank, .world = impl->tp_size,
                                 .parts = skinny ? res->p : NULL,
                                 .part_stride = skinny ? res->stride : 0,
                                 .n_part = skinny ? res->n : 0, .beta = beta,
                                 .out = w ? impl->h : NULL, .w = w, .eps = impl->cfg.rms_eps};
        memcpy(a.regions, impl->ar_regions, sizeof(a.regions));
        rc = tm_k_allreduce_sum_f32(&a, impl->stream, err);
    } else {
        const size_t n_x = (size_t)T * d;
        if (skinny) {
            tm_k_sum_parts_args sp = {.y = impl->x, .part = res->p, .stride = res->stride,
                                      .n = n_x, .n_part = res->n, .beta = beta};
            rc = tm_k_sum_parts(&sp, impl->stream, err);
        }
        if (!rc)
            rc = tm_nccl_allreduce_sum(impl->nccl, impl->x, n_x, TM_NCCL_F32, impl->stream, err);
        if (!rc && w) {
            tm_k_rmsnorm_bf16_args na = {.out = impl->h, .x = impl->x, .w = w, .n_row = T,
                                         .n_col = d, .eps = impl->cfg.rms_eps};
            rc = tm_k_rmsnorm_bf16(&na, impl->stream, err);
        }
    }
    if (res)
        *res = (proj_out){0};
    return rc;
}

/* TM_CUDA_PROFILE: mark the end of an op of kind what (a string literal) on the stream. */
static void prof_mark(cuda_impl *impl, const char *what) {
    if (!impl->prof || impl->prof_n >= PROF_EVENTS)
        return;
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(impl->stream, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone)
        return;
    if (impl->prof_n == 0) { // the step's start
        cudaEventRecord(impl->prof_ev[0], impl->stream);
        impl->prof_what[0] = NULL;
        impl->prof_n = 1;
    }
    cudaEventRecord(impl->prof_ev[impl->prof_n], impl->stream);
    impl->prof_what[impl->prof_n++] = what;
}

/* After the step's sync: add the intervals between its events to their kinds. */
static void prof_collect(cuda_impl *impl) {
    for (uint32_t i = 1; i < impl->prof_n; i++) {
        float ms = 0.0f;
        if (cudaEventElapsedTime(&ms, impl->prof_ev[i - 1], impl->prof_ev[i]) != cudaSuccess)
            continue;
        uint32_t k = 0;
        while (k < PROF_KINDS && impl->prof_kind[k] && strcmp(impl->prof_kind[k], impl->prof_what[i]))
            k++;
        if (k == PROF_KINDS)
            continue;
        impl->prof_kind[k] = impl->prof_what[i];
        impl->prof_ms[k] += ms;
        impl->prof_calls[k]++;
    }
    impl->prof_n = 0;
}

/* The whole model for a step whose metadata is already on the device (meta_layout(T, S)). */
static tm_rc run_model(cuda_impl *impl, uint32_t T, uint32_t S, uint32_t n_want, uint32_t n_tile,
                       size_t tile_off, tm_err *err) {
    const tm_model_cfg *c = &impl->cfg;
    const uint32_t d = c->n_embd, ff = c->n_ff;
    const meta_off mo = meta_layout(T, S);
    const uint32_t *md = impl->meta_d;
    cudaStream_t s = impl->stream;
    tm_rc rc;

    const int tp = impl->tp_size > 1;
    // With TP, rank 0's partial products carry the residual (beta 1); the others' do not.
    const float beta_res = tp && impl->tp_rank != 0 ? 0.0f : 1.0f;
    if (tp) { // each rank has a slice of the table: sum, then layer 0's attention norm
        tm_k_embed_part_bf16_args ea = {.x = impl->x, .table = impl->embd,
                                        .tokens = md + mo.tokens, .n_tok = T, .n_embd = d,
                                        .vocab0 = impl->vocab0, .n_vocab = c->n_vocab};
        rc = tm_k_embed_part_bf16(&ea, s, err);
        if (!rc)
            rc = tp_reduce_norm(impl, T, NULL, 1.0f,
                                c->n_layer ? impl->layers[0].attn_norm : NULL, err);
    } else {
        tm_k_embed_bf16_args ea = {
            .x = impl->x, .table = impl->embd, .tokens = md + mo.tokens, .n_tok = T, .n_embd = d};
        rc = tm_k_embed_bf16(&ea, s, err);
    }
    if (rc)
        return rc;
    prof_mark(impl, "metadata upload + embed");
    const uint32_t n_split = attn_splits(impl, T);
    // A residual projection's partials not yet added into x (skinny path without TP): the next
    // RMSNorm adds them.
    proj_out res = {0};
    proj_out po;
    for (uint32_t l = 0; l < c->n_layer; l++) {
        const cuda_layer *L = &impl->layers[l];
        uint16_t *kc = impl->k_cache + (size_t)l * impl->layer_kv_elems;
        uint16_t *vc = impl->v_cache + (size_t)l * impl->layer_kv_elems;
        tm_k_rmsnorm_bf16_args na = {.out = impl->h, .x = impl->x, .rows = NULL,
                                     .w = L->attn_norm, .n_row = T, .n_col = d,
                                     .eps = c->rms_eps, .add = res.p, .add_stride = res.stride,
                                     .n_add = res.n};
        if (!tp && !ablated(impl, ABL_NORM)) { // with TP, h came with the all-reduce before
            rc = tm_k_rmsnorm_bf16(&na, s, err);
            prof_mark(impl, "attn_norm (+residual)");
        }
        if (!rc)
            rc = project(impl, ABL_QKV, L->w_qkv, impl->h, T, d, impl->qkv_dim, impl->qkv, 0.0f,
                         &po, err);
        if (rc)
            return rc;
        prof_mark(impl, "qkv_proj");
        tm_k_rope_kv_bf16_args ra = {
            .q = impl->q, .k_cache = kc, .v_cache = vc, .qkv = po.p, .bias = L->b_qkv,
            .pos = md + mo.pos, .slot = md + mo.slot, .inv_freq = impl->inv_freq, .n_tok = T,
            .n_head = c->n_head, .n_kv_head = c->n_kv_head, .head_dim = c->head_dim,
            .n_part = po.n, .part_stride = po.stride};
        rc = ablated(impl, ABL_ROPE) ? TM_OK : tm_k_rope_kv_bf16(&ra, s, err);
        if (rc)
            return rc;
        prof_mark(impl, "rope_kv");
        tm_k_attn_paged_bf16_args aa = {
            .out = impl->att, .q = impl->q, .k_cache = kc, .v_cache = vc, .pos = md + mo.pos,
            .tok_seq = md + mo.tok_seq, .seq_bt = md + mo.seq_bt, .block_tables = md + mo.bt,
            .part_acc = impl->part,
            .part_ml = impl->part + (size_t)T * c->n_head * n_split * c->head_dim,
            .n_tok = T, .n_head = c->n_head, .n_kv_head = c->n_kv_head,
            .head_dim = c->head_dim, .block_size = impl->eng.opts.block_size,
            .ld_q = impl->q_dim, .window = c->sliding_window, .n_split = n_split,
            .scale = 1.0f / sqrtf((float)c->head_dim)};
        if (n_tile) {
            tm_k_attn_prefill_bf16_args fa = {
                .out = impl->att, .q = impl->q, .k_cache = kc, .v_cache = vc,
                .seq_bt = md + mo.seq_bt, .block_tables = md + mo.bt,
                .tiles = (const tm_k_attn_prefill_tile *)(md + tile_off), .n_tile = n_tile,
                .n_head = c->n_head, .n_kv_head = c->n_kv_head, .head_dim = c->head_dim,
                .block_size = impl->eng.opts.block_size, .ld_q = impl->q_dim,
                .window = c->sliding_window, .scale = aa.scale};
            rc = tm_k_attn_prefill_bf16(&fa, s, err);
        } else {
            rc = ablated(impl, ABL_ATTN) ? TM_OK : tm_k_attn_paged_bf16(&aa, s, err);
        }
        prof_mark(impl, n_tile ? "attention (prefill)" : "attention (paged)");
        if (!rc)
            rc = project(impl, ABL_O, L->w_o, impl->att, T, impl->q_dim, d, impl->x, beta_res,
                         &res, err);
        prof_mark(impl, "o_proj");
        if (rc)
            return rc;
        if (tp) {
            rc = tp_reduce_norm(impl, T, &res, beta_res, L->ffn_norm, err);
            prof_mark(impl, "tp all-reduce + norm");
        } else {
            if (res.p == impl->x) // cuBLAS added the product into x itself
                res = (proj_out){0};
            na.w = L->ffn_norm;
            na.add = res.p;
            na.add_stride = res.stride;
            na.n_add = res.n;
            rc = ablated(impl, ABL_NORM) ? TM_OK : tm_k_rmsnorm_bf16(&na, s, err);
            res = (proj_out){0};
            prof_mark(impl, "ffn_norm (+residual)");
        }
        if (!rc)
            rc = project(impl, ABL_GU, L->w_gu, impl->h, T, d, 2 * ff, impl->gu, 0.0f, &po,
                         err);
        if (rc)
            return rc;
        prof_mark(impl, "gate_up_proj");
        tm_k_silu_mul_bf16_args sa = {.out = impl->ffa, .gu = po.p, .n_tok = T, .n_ff = ff,
                                      .n_part = po.n, .part_stride = po.stride};
        rc = ablated(impl, ABL_SILU) ? TM_OK : tm_k_silu_mul_bf16(&sa, s, err);
        prof_mark(impl, "silu_mul");
        if (!rc)
            rc = project(impl, ABL_DOWN, L->w_down, impl->ffa, T, ff, d, impl->x, beta_res,
                         &res, err);
        prof_mark(impl, "down_proj");
        if (!rc && tp) {
            rc = tp_reduce_norm(impl, T, &res, beta_res,
                                l + 1 < c->n_layer ? impl->layers[l + 1].attn_norm : NULL, err);
            prof_mark(impl, "tp all-reduce + norm");
        } else if (!rc && res.p == impl->x) {
            res = (proj_out){0};
        }
        if (rc)
            return rc;
    }
    if (n_want == 0)
        return TM_OK;
    tm_k_rmsnorm_bf16_args fa = {.out = impl->last, .x = impl->x, .rows = md + mo.want_row,
                                 .w = impl->out_norm, .n_row = n_want, .n_col = d,
                                 .eps = c->rms_eps, .add = res.p, .add_stride = res.stride,
                                 .n_add = res.n};
    rc = ablated(impl, ABL_LM) ? TM_OK : tm_k_rmsnorm_bf16(&fa, s, err);
    prof_mark(impl, "final_norm");
    if (!rc)
        rc = project(impl, ABL_LM, impl->lm_head, impl->last, n_want, d, c->n_vocab,
                     impl->logits, 0.0f, &po, err);
    if (rc || po.p == impl->logits) {
        prof_mark(impl, "lm_head");
        return rc;
    }
    tm_k_sum_parts_args sp = {.y = impl->logits, .part = po.p, .stride = po.stride,
                              .n = (size_t)n_want * c->n_vocab, .n_part = po.n, .beta = 0.0f};
    rc = ablated(impl, ABL_LM) ? TM_OK : tm_k_sum_parts(&sp, s, err);
    prof_mark(impl, "lm_head");
    return rc;
}

/* Validate the batch (as the CPU engine does) and pack its metadata into meta_h. */
static tm_rc pack_batch(cuda_impl *impl, const tm_batch *b, uint32_t *T_out, uint32_t *n_want_out,
                        size_t *n_meta_out, uint32_t *n_tile_out, int *decode_only,
                        tm_err *err) {
    const tm_engine_opts *o = &impl->eng.opts;
    uint32_t T = 0;
    uint64_t n_bt = 0;
    tm_rc rc = tm_batch_check(b, o, impl->max_pos, impl->vocab_full, "cuda forward", &T, &n_bt,
                              err);
    if (rc)
        return rc;
    if (n_bt > impl->bt_cap)
        return TM_ERR(err, TM_E_INVAL,
                      "cuda forward: %llu block table entries in one step > %u (max_seqs x "
                      "blocks of n_ctx)",
                      (unsigned long long)n_bt, impl->bt_cap);

    const meta_off mo = meta_layout(T, b->n_seq);
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
        impl->chunks_h[i] = (tm_k_attn_prefill_chunk){
            .t0 = t - s->n_tok, .n_tok = s->n_tok, .pos0 = s->pos};
    }
    // Steps other than pure decodes run attention as query tiles on tensor cores (every
    // sequence of the step, a decode being a one-row tile); their list ends the metadata.
    uint32_t n_tile = 0;
    if (impl->use_fa && !*decode_only)
        n_tile = tm_k_attn_prefill_tiles(impl->chunks_h, b->n_seq,
                                         (tm_k_attn_prefill_tile *)(mh + mo.bt + bt));
    *T_out = T;
    *n_want_out = n_want;
    *n_tile_out = n_tile;
    *n_meta_out = mo.bt + bt + 4 * (size_t)n_tile;
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
        rc = run_model(impl, T, T, T, 0, 0, err);
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

/* Abort the communicator once, from whichever thread sees a failure first; why (may be NULL) is
 * kept for the step's error. */
static void abort_comm(cuda_impl *impl, const tm_err *why) {
    pthread_mutex_lock(&impl->wd_mu);
    const int first = !impl->wd_aborted;
    impl->wd_aborted = 1;
    if (first && why)
        impl->wd_err = *why;
    pthread_mutex_unlock(&impl->wd_mu);
    if (first)
        tm_nccl_abort(impl->nccl);
}

static int comm_aborted(cuda_impl *impl, tm_err *why) {
    pthread_mutex_lock(&impl->wd_mu);
    const int a = impl->wd_aborted;
    if (a && why && impl->wd_err.rc)
        *why = impl->wd_err;
    pthread_mutex_unlock(&impl->wd_mu);
    return a;
}

static void set_busy(cuda_impl *impl, int busy) {
    pthread_mutex_lock(&impl->wd_mu);
    impl->wd_busy = busy;
    impl->wd_t0 = tm_now_ms();
    pthread_mutex_unlock(&impl->wd_mu);
}

/* The watchdog: every millisecond while a step is in flight, check the peers (one that exited or
 * reported a failure), NCCL's asynchronous errors and the step timeout; on a failure abort the
 * communicator, which also unblocks a host thread stuck inside an NCCL call. */
static void *watchdog_main(void *arg) {
    cuda_impl *impl = arg;
    for (;;) {
        struct timespec ts = {0, 1000 * 1000};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&impl->wd_mu);
        const int quit = impl->wd_quit, busy = impl->wd_busy && !impl->wd_aborted;
        const double t0 = impl->wd_t0;
        pthread_mutex_unlock(&impl->wd_mu);
        if (quit)
            return NULL;
        if (!busy)
            continue;
        tm_err e = {0};
        tm_rc rc = tm_rdzv_check(impl->rdzv, &e);
        if (!rc)
            rc = tm_nccl_check(impl->nccl, &e);
        if (!rc && tm_now_ms() - t0 > impl->timeout_ms)
            rc = TM_ERR(&e, TM_E_IO, "a step did not finish within %.0f s (a rank hung or the "
                        "network stalled)", impl->timeout_ms / 1e3);
        if (rc) {
            tm_err_wrap(&e, "tp rank %u of %u", impl->tp_rank, impl->tp_size);
            abort_comm(impl, &e);
        }
    }
}

/* Wait for the stream. With TP, poll it, so that a step the watchdog aborted returns its error
 * instead of waiting for kernels that never finish. */
static tm_rc step_sync(cuda_impl *impl, tm_err *err) {
    if (impl->tp_size < 2)
        return TM_CUDA_CHECK(cudaStreamSynchronize(impl->stream), err);
    for (uint64_t spin = 0;; spin++) {
        cudaError_t e = cudaStreamQuery(impl->stream);
        if (e == cudaSuccess)
            return TM_OK;
        if (e != cudaErrorNotReady)
            return TM_CUDA_CHECK(e, err);
        if (spin % 64 == 0 && comm_aborted(impl, err))
            return err->rc ? err->rc : TM_ERR(err, TM_E_NCCL, "tp: communicator aborted");
    }
}

/* After a failure with TP: no later collective can be trusted. Abort the communicator (if the
 * watchdog has not), so that NCCL kernels waiting for a dead peer return; the engine is dead. */
static void fail_engine(cuda_impl *impl) {
    impl->dead = 1;
    if (impl->tp_size > 1)
        abort_comm(impl, NULL);
}

/* Everything on the device for one step whose plan (header h, metadata in meta_h) every rank
 * has: metadata upload, the model (graph or eager), the logits head and, with TP, its
 * collectives; rank 0 (or the only rank) also copies ids or logits to pinned host memory. Ends
 * with the stream synchronized. */
static tm_rc run_step(cuda_impl *impl, const plan_hdr *h, tm_err *err) {
    const int tp = impl->tp_size > 1, out_host = impl->tp_rank == 0;
    cudaStream_t s = impl->stream;
    if (tp)
        set_busy(impl, 1);
    prof_mark(impl, "(step start)");
    tm_rc rc = TM_CUDA_CHECK(cudaMemcpyAsync(impl->meta_d, impl->meta_h,
                                             h->n_meta * sizeof(uint32_t),
                                             cudaMemcpyHostToDevice, s),
                             err);
    if (!rc) {
        if (h->graph && impl->use_graphs)
            rc = run_graph(impl, h->T, err);
        else
            rc = run_model(impl, h->T, h->S, h->n_want, h->n_tile,
                           h->n_meta - 4 * (size_t)h->n_tile, err);
    }
    const uint32_t n_want = h->n_want, nv = impl->cfg.n_vocab;
    if (!rc && n_want && h->greedy) {
        if (tp) {
            tm_k_argmax_part_f32_args pa = {.cand = impl->cand, .logits = impl->logits,
                                            .n_row = n_want, .n_col = nv, .id0 = impl->vocab0,
                                            .id_limit = h->vocab_limit};
            rc = tm_k_argmax_part_f32(&pa, s, err);
            if (!rc)
                rc = tm_nccl_allgather(impl->nccl, impl->cand, impl->cand_all, 2 * (size_t)n_want,
                                       TM_NCCL_U32, s, err);
            tm_k_argmax_merge_args ma = {.ids = impl->ids, .cand = impl->cand_all,
                                         .n_row = n_want, .n_rank = impl->tp_size};
            if (!rc && out_host)
                rc = tm_k_argmax_merge(&ma, s, err);
        } else {
            tm_k_argmax_f32_args ga = {.ids = impl->ids, .logits = impl->logits,
                                       .n_row = n_want, .n_col = nv, .n_limit = h->vocab_limit};
            rc = tm_k_argmax_f32(&ga, s, err);
        }
        if (!rc && out_host)
            rc = TM_CUDA_CHECK(cudaMemcpyAsync(impl->ids_h, impl->ids, n_want * sizeof(uint32_t),
                                               cudaMemcpyDeviceToHost, s),
                               err);
    } else if (!rc && n_want) {
        const float *src = impl->logits;
        size_t n = (size_t)n_want * nv;
        if (tp) {
            // every rank sends n_want * v_per floats; the last rank's rows are shorter (nv)
            rc = tm_nccl_allgather(impl->nccl, impl->logits, impl->logits_all,
                                   (size_t)n_want * impl->v_per, TM_NCCL_F32, s, err);
            src = impl->logits_all;
            n = (size_t)impl->tp_size * n_want * impl->v_per;
        }
        if (!rc && out_host)
            rc = TM_CUDA_CHECK(cudaMemcpyAsync(impl->logits_h, src, n * sizeof(float),
                                               cudaMemcpyDeviceToHost, s),
                               err);
    }
    prof_mark(impl, "sample/gather + copy out");
    if (!rc)
        rc = step_sync(impl, err);
    if (impl->prof)
        prof_collect(impl);
    if (tp) {
        set_busy(impl, 0);
        if (rc) // the watchdog's reason (a dead peer) explains an NCCL failure best
            comm_aborted(impl, err);
    }
    return rc;
}

/* One step; fills logits (host, [n_want][n_vocab]) or ids (host, [n_want]: the argmax over ids
 * [0, vocab_limit), vocab_limit in [1, n_vocab]). */
static tm_rc forward_step(cuda_impl *impl, const tm_batch *b, float *logits, uint32_t *ids,
                          uint32_t vocab_limit, tm_err *err) {
    if (impl->dead)
        return TM_ERR(err, TM_E_CUDA, "cuda engine: unusable after an earlier CUDA error");
    cudaSetDevice(impl->device);
    uint32_t T = 0, n_want = 0;
    size_t n_meta = 0;
    uint32_t n_tile = 0;
    int decode_only = 0;
    tm_rc rc = pack_batch(impl, b, &T, &n_want, &n_meta, &n_tile, &decode_only, err);
    if (rc || T == 0)
        return rc;
    plan_hdr *h = impl->plan_h;
    *h = (plan_hdr){.op = PLAN_STEP, .T = T, .S = b->n_seq, .n_want = n_want,
                    .graph = (uint32_t)(decode_only && impl->use_graphs), .greedy = ids != NULL,
                    .vocab_limit = ids ? vocab_limit : 0, .n_meta = (uint32_t)n_meta,
                    .n_tile = n_tile};
    if (impl->tp_size > 1) // the other ranks start while this one launches its own work
        rc = tm_rdzv_bcast(impl->rdzv, PLAN_MSG, h, sizeof(*h), impl->meta_h,
                           n_meta * sizeof(uint32_t), err);
    if (!rc)
        rc = run_step(impl, h, err);
    if (rc) {
        fail_engine(impl);
        return rc;
    }
    if (n_want && ids) {
        memcpy(ids, impl->ids_h, n_want * sizeof(uint32_t));
    } else if (n_want && impl->tp_size > 1) {
        const size_t V = impl->vocab_full;
        for (uint32_t r = 0; r < impl->tp_size; r++) {
            const size_t v0 = TM_MIN((size_t)r * impl->v_per, V);
            const size_t nv = TM_MIN((size_t)impl->v_per, V - v0);
            const float *blk = impl->logits_h + (size_t)r * n_want * impl->v_per;
            for (uint32_t w = 0; w < n_want; w++)
                memcpy(logits + w * V + v0, blk + w * nv, nv * sizeof(float));
        }
    } else if (n_want) {
        memcpy(logits, impl->logits_h, (size_t)n_want * impl->vocab_full * sizeof(float));
    }
    return TM_OK;
}

static tm_rc cuda_forward(tm_engine *eng, const tm_batch *b, float *logits, tm_err *err) {
    return forward_step(eng->impl, b, logits, NULL, 0, err);
}

static tm_rc cuda_forward_greedy(tm_engine *eng, const tm_batch *b, uint32_t n_vocab_limit,
                                 uint32_t *ids, tm_err *err) {
    cuda_impl *impl = eng->impl;
    if (n_vocab_limit == 0)
        return TM_ERR(err, TM_E_INVAL, "cuda forward_greedy: n_vocab_limit 0");
    return forward_step(impl, b, NULL, ids, TM_MIN(n_vocab_limit, impl->vocab_full), err);
}

tm_rc tm_engine_cuda_forward_greedy(tm_engine *eng, const tm_batch *b, uint32_t *ids,
                                    tm_err *err) {
    if (!eng || eng->ops != &cuda_ops)
        return TM_ERR(err, TM_E_INVAL, "cuda forward_greedy: not a CUDA engine");
    return cuda_forward_greedy(eng, b, UINT32_MAX, ids, err);
}

tm_rc tm_engine_cuda_tp_serve(tm_engine *eng, tm_err *err) {
    if (!eng || eng->ops != &cuda_ops)
        return TM_ERR(err, TM_E_INVAL, "cuda tp_serve: not a CUDA engine");
    cuda_impl *impl = eng->impl;
    if (impl->tp_size < 2 || impl->tp_rank == 0)
        return TM_ERR(err, TM_E_INVAL, "cuda tp_serve: only ranks > 0 serve (rank %u of %u)",
                      impl->tp_rank, impl->tp_size);
    cudaSetDevice(impl->device);
    const tm_engine_opts *o = &eng->opts;
    const size_t cap = sizeof(plan_hdr) + impl->meta_cap * sizeof(uint32_t);
    for (uint64_t n_step = 0;; n_step++) {
        if (impl->dead)
            return TM_ERR(err, TM_E_CUDA, "cuda engine: unusable after an earlier error");
        uint32_t type = 0;
        size_t len = 0;
        // The previous step is synchronized, so plan_h / meta_h are free to overwrite. Spin for
        // the next plan a little (steps follow each other within microseconds while decoding;
        // waking from a blocking read costs tens of them), then block.
        tm_rc rc = TM_E_AGAIN;
        for (double t0 = tm_now_ms(); rc == TM_E_AGAIN && tm_now_ms() - t0 < SPIN_PLAN_MS;)
            rc = tm_rdzv_recv(impl->rdzv, 0, &type, impl->plan_h, cap, &len, err);
        if (rc == TM_E_AGAIN)
            rc = tm_rdzv_recv(impl->rdzv, -1, &type, impl->plan_h, cap, &len, err);
        const plan_hdr *h = impl->plan_h;
        if (!rc && (type != PLAN_MSG || len < sizeof(*h)))
            rc = TM_ERR(err, TM_E_PARSE, "tp rank %u: unexpected control message type %u",
                        impl->tp_rank, type);
        if (!rc && h->op == PLAN_STOP)
            return TM_OK;
        if (!rc && h->op == PLAN_KV_COPY) {
            rc = cuda_kv_copy(eng, h->kv_src, h->kv_dst, h->kv_n_tok, err);
        } else if (!rc && h->op == PLAN_STEP) {
            // rank 0 validated the batch; check what could corrupt memory here
            if (h->T == 0 || h->T > o->max_batched_tokens || h->S > o->max_seqs ||
                h->n_want > h->S || h->n_meta > impl->meta_cap ||
                (h->greedy && (h->vocab_limit == 0 || h->vocab_limit > impl->vocab_full)) ||
                len != sizeof(*h) + (size_t)h->n_meta * sizeof(uint32_t) ||
                (h->graph && (h->T != h->S || h->T != h->n_want)) ||
                (h->n_tile && (!impl->use_fa || 4 * (size_t)h->n_tile > h->n_meta)))
                rc = TM_ERR(err, TM_E_PARSE, "tp rank %u: malformed step plan %llu (T %u, S %u)",
                            impl->tp_rank, (unsigned long long)n_step, h->T, h->S);
            if (!rc)
                rc = run_step(impl, h, err);
        } else if (!rc) {
            rc = TM_ERR(err, TM_E_PARSE, "tp rank %u: unknown plan op %u", impl->tp_rank, h->op);
        }
        if (rc) {
            tm_rdzv_report(impl->rdzv, err->msg);
            fail_engine(impl);
            return rc;
        }
    }
}

void tm_engine_cuda_set_graphs(tm_engine *eng, int on) {
    if (eng && eng->ops == &cuda_ops)
        ((cuda_impl *)eng->impl)->use_graphs = on;
}

/* ---- create / destroy ---- */

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
    impl->logits = carve(cv, S * impl->v_stride * f4);
    if (impl->tp_size > 1) {
        impl->logits_all = carve(cv, (size_t)impl->tp_size * S * impl->v_per * f4);
        impl->cand = carve(cv, S * 2 * sizeof(uint32_t));
        impl->cand_all = carve(cv, (size_t)impl->tp_size * S * 2 * sizeof(uint32_t));
    }
    impl->part = carve(cv, impl->part_floats * f4);
    impl->sk_part = impl->sk_part_floats ? carve(cv, impl->sk_part_floats * f4) : NULL;
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

/* The shard config of rank of tp: the split of runner/tp/shard.h (which the weights path cuts
 * them by itself; create asserts that both agree). */
static tm_rc tp_shard_cfg(const tm_model_cfg *c, uint32_t rank, uint32_t tp, tm_model_cfg *s,
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

/* KV blocks that max_seqs sequences of the model's whole context need: the most a pool sized from
 * free memory gets (more could never be used). */
static uint32_t kv_cap_blocks(const tm_model_cfg *c, const tm_engine_opts *o) {
    const uint64_t per_seq = TM_CEIL_DIV((uint64_t)TM_MAX(c->n_ctx, 1u), o->block_size);
    return (uint32_t)TM_MIN(per_seq * o->max_seqs, (uint64_t)UINT32_MAX / o->block_size);
}

/* TP: all-gather `bytes` (a multiple of 4) of every rank into all[rank * bytes], through the
 * cuBLAS workspace (idle during create); the watchdog guards it like a step. */
static tm_rc tp_allgather_host(cuda_impl *impl, const void *mine, size_t bytes, void *all,
                               tm_err *err) {
    uint8_t *d = impl->gemm_ws;
    TM_ASSERT(bytes % 4 == 0 && bytes * (impl->tp_size + 1) <= GEMM_WS_BYTES);
    set_busy(impl, 1);
    tm_rc rc = TM_CUDA_CHECK(
        cudaMemcpyAsync(d, mine, bytes, cudaMemcpyHostToDevice, impl->stream), err);
    if (!rc)
        rc = tm_nccl_allgather(impl->nccl, d, d + bytes, bytes / 4, TM_NCCL_U32, impl->stream,
                               err);
    if (!rc)
        rc = TM_CUDA_CHECK(cudaMemcpyAsync(all, d + bytes, bytes * impl->tp_size,
                                           cudaMemcpyDeviceToHost, impl->stream),
                           err);
    if (!rc)
        rc = step_sync(impl, err);
    set_busy(impl, 0);
    if (rc)
        comm_aborted(impl, err);
    return rc;
}

/* TP: the smallest of every rank's n, so that every rank sizes its pool the same. */
static tm_rc tp_agree_min(cuda_impl *impl, uint32_t *n, tm_err *err) {
    uint32_t *all = tm_calloc(impl->tp_size, sizeof(uint32_t));
    if (!all)
        return TM_ERR(err, TM_E_NOMEM, "tp: KV block counts");
    tm_rc rc = tp_allgather_host(impl, n, sizeof(*n), all, err);
    if (rc)
        tm_err_wrap(err, "tp rank %u: agreeing on the KV pool size", impl->tp_rank);
    for (uint32_t r = 0; !rc && r < impl->tp_size; r++)
        *n = TM_MIN(*n, all[r]);
    tm_free(all);
    return rc;
}

/* The KV cache, allocated after the weights and activations. With opts n_kv_block 0 its size
 * comes from free memory: device use (everything on the GPU now, this process's weights and
 * activations included, plus the pool) stays within util x total memory and KV_HEADROOM_BYTES
 * stay free; at most kv_cap_blocks, at least one block per sequence; with TP the smallest count of
 * all ranks. The count ends up in eng.opts.n_kv_block. */
static tm_rc alloc_kv(cuda_impl *impl, float util, tm_err *err) {
    tm_engine_opts *o = &impl->eng.opts;
    const size_t block_bytes =
        2 * (size_t)impl->cfg.n_layer * o->block_size * impl->kv_dim * sizeof(uint16_t);
    tm_rc rc;
    if (o->n_kv_block == 0) {
        size_t free_b = 0, total_b = 0;
        rc = TM_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b), err);
        if (rc)
            return rc;
        const double used = (double)(total_b - free_b);
        const double avail = TM_MIN((double)util * (double)total_b - used,
                                    (double)free_b - (double)KV_HEADROOM_BYTES);
        const uint32_t cap = kv_cap_blocks(&impl->cfg, o);
        uint32_t n = avail > 0 ? (uint32_t)TM_MIN(avail / (double)block_bytes, (double)cap) : 0;
        if (impl->tp_size > 1) {
            rc = tp_agree_min(impl, &n, err);
            if (rc)
                return rc;
        }
        if (n < o->max_seqs) {
            TM_LOG_WARN("cuda", "KV pool: %u blocks fit within gpu_memory_utilization %.2f of "
                        "%.1f GB (%.1f GB in use) but max_seqs is %u; taking one block per "
                        "sequence (set engine.kv_blocks, raise gpu_memory_utilization or lower "
                        "max_seqs)",
                        n, (double)util, total_b / 1e9, used / 1e9, o->max_seqs);
            n = o->max_seqs;
        }
        o->n_kv_block = n;
        TM_LOG_INFO("cuda", "KV pool: %u blocks of %u tokens, %.2f GB, from free memory "
                    "(gpu_memory_utilization %.2f of %.1f GB, %.1f GB in use before; %u blocks "
                    "would hold max_seqs %u full contexts)",
                    n, o->block_size, (double)n * block_bytes / 1e9, (double)util, total_b / 1e9,
                    used / 1e9, cap, o->max_seqs);
    }
    const uint64_t max_pos = (uint64_t)o->n_kv_block * o->block_size;
    TM_ASSERT(max_pos <= UINT32_MAX); // explicit counts are checked in create, sized ones capped
    impl->max_pos = (uint32_t)max_pos;
    impl->layer_kv_elems = (size_t)max_pos * impl->kv_dim;
    const size_t kv_bytes = (size_t)impl->cfg.n_layer * impl->layer_kv_elems * sizeof(uint16_t);
    rc = TM_CUDA_CHECK(cudaMalloc((void **)&impl->k_cache, kv_bytes), err);
    if (!rc)
        rc = TM_CUDA_CHECK(cudaMalloc((void **)&impl->v_cache, kv_bytes), err);
    if (rc)
        return tm_err_wrap(err, "cuda engine: KV cache of %u blocks, %.2f GB: ", o->n_kv_block,
                           2 * kv_bytes / 1e9);
    // Zero the KV cache once so that no step can read uninitialised memory as NaN.
    rc = TM_CUDA_CHECK(cudaMemset(impl->k_cache, 0, kv_bytes), err);
    if (!rc)
        rc = TM_CUDA_CHECK(cudaMemset(impl->v_cache, 0, kv_bytes), err);
    return rc;
}

/* What a rank tells the others about its all-reduce region. */
typedef struct ar_card {
    cudaIpcMemHandle_t handle;
    uint64_t host;             /* hash of the host name */
    uint32_t ok;               /* 1: region allocated and exported */
    uint32_t pad;
} ar_card;

/* TP: set up the peer-memory all-reduce when every rank runs on this host and can map every
 * other rank's region (CUDA IPC); otherwise (other nodes, no peer access, TM_TP_CUSTOM_AR=0 on
 * any rank) all-reduces stay on NCCL. The decision is the same on every rank: every rank takes
 * part in both exchanges whatever it wants. Errors only when the exchanges themselves fail. */
static tm_rc ar_setup(cuda_impl *impl, tm_err *err) {
    const uint32_t tp = impl->tp_size, me = impl->tp_rank;
    if (tp > TM_AR_MAX_RANKS || impl->cfg.n_embd > TM_AR_MAX_D)
        return TM_OK; // NCCL only (the same on every rank)
    const char *env = getenv("TM_TP_CUSTOM_AR");
    const int want = !(env && strcmp(env, "0") == 0);
    impl->ar_d = TM_CEIL_DIV(impl->cfg.n_embd, 4u) * 4;
    ar_card mine = {0};
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    mine.host = 1469598103934665603ull; // FNV-1a
    for (const char *p = host; *p; p++)
        mine.host = (mine.host ^ (uint8_t)*p) * 1099511628211ull;
    if (want) {
        const size_t bytes = tm_k_allreduce_region_bytes(impl->ar_d);
        void *region = NULL;
        mine.ok = cudaMalloc(&region, bytes) == cudaSuccess &&
                  cudaMemset(region, 0, bytes) == cudaSuccess &&
                  cudaDeviceSynchronize() == cudaSuccess &&
                  cudaIpcGetMemHandle(&mine.handle, region) == cudaSuccess;
        impl->ar_regions[me] = region;
        cudaGetLastError(); // a failure here only means: NCCL all-reduces
    }
    ar_card *all = tm_calloc(tp, sizeof(ar_card));
    if (!all)
        return TM_ERR(err, TM_E_NOMEM, "tp all-reduce cards");
    tm_rc rc = tp_allgather_host(impl, &mine, sizeof(mine), all, err);
    uint32_t ok = !rc, oks[TM_AR_MAX_RANKS] = {0};
    const char *why = "a rank disabled it (TM_TP_CUSTOM_AR=0) or could not export its region";
    for (uint32_t r = 0; ok && r < tp; r++) {
        ok = all[r].ok && all[r].host == mine.host;
        if (all[r].ok && all[r].host != mine.host)
            why = "ranks on more than one host";
    }
    for (uint32_t r = 0; ok && r < tp; r++) {
        if (r == me)
            continue;
        ok = cudaIpcOpenMemHandle(&impl->ar_regions[r], all[r].handle,
                                  cudaIpcMemLazyEnablePeerAccess) == cudaSuccess;
        if (!ok) {
            impl->ar_regions[r] = NULL;
            why = "a rank could not map a peer's memory (no peer access between the GPUs?)";
            cudaGetLastError();
        }
    }
    tm_free(all);
    if (!rc) // did every rank map every peer?
        rc = tp_allgather_host(impl, &ok, sizeof(ok), oks, err);
    if (rc)
        return tm_err_wrap(err, "tp rank %u: setting up the all-reduce", me);
    impl->ar_on = 1;
    for (uint32_t r = 0; r < tp; r++)
        impl->ar_on &= oks[r] == 1;
    if (!impl->ar_on) {
        for (uint32_t r = 0; r < TM_AR_MAX_RANKS; r++) {
            if (impl->ar_regions[r] && r != me)
                cudaIpcCloseMemHandle(impl->ar_regions[r]);
            if (r != me)
                impl->ar_regions[r] = NULL;
        }
        if (me == 0)
            TM_LOG_INFO("cuda", "tp: all-reduces on NCCL only (%s)", why);
        return TM_OK;
    }
    if (me == 0)
        TM_LOG_INFO("cuda", "tp: all-reduces of steps of up to %u tokens over peer memory "
                    "(one-shot, fused with the RMSNorm), larger ones on NCCL", TM_AR_MAX_ROWS);
    return TM_OK;
}

static tm_rc create(const tm_model *m, const tm_engine_opts *opts, const tm_engine_cuda_tp *tp,
                    int random, uint64_t seed, tm_engine **out, tm_err *err) {
    if (!opts->block_size || !opts->max_seqs || !opts->max_batched_tokens)
        return TM_ERR(err, TM_E_INVAL,
                      "cuda engine: block_size, max_seqs and max_batched_tokens must be > 0");
    const float util = opts->gpu_mem_util == 0.0f ? GPU_MEM_UTIL_DEFAULT : opts->gpu_mem_util;
    if (!(util > 0.0f && util <= 1.0f))
        return TM_ERR(err, TM_E_INVAL, "cuda engine: gpu_memory_utilization %g not in (0, 1]",
                      (double)opts->gpu_mem_util);
    const uint32_t tp_size = TM_MAX(opts->tp_size, 1u);
    if (tp_size > 1 && (!tp || !tp->rdzv || !tp->nccl_id))
        return TM_ERR(err, TM_E_INVAL,
                      "cuda engine: tp_size %u needs tm_engine_cuda_tp_create (rendezvous, NCCL "
                      "id)",
                      opts->tp_size);
    if (tp_size > 1 && (tm_rdzv_rank(tp->rdzv) != opts->tp_rank ||
                        tm_rdzv_world(tp->rdzv) != tp_size))
        return TM_ERR(err, TM_E_INVAL, "cuda engine: rank %u of %u, rendezvous says %u of %u",
                      opts->tp_rank, tp_size, tm_rdzv_rank(tp->rdzv), tm_rdzv_world(tp->rdzv));
    tm_rc rc = check_cfg(&m->cfg, err);
    if (!rc && !random && tp_size == 1)
        rc = tm_model_check_weights(m, "cuda engine", err);
    if (rc)
        return rc;
    tm_model_cfg shard_c = m->cfg;
    uint32_t vocab0 = 0, v_per = m->cfg.n_vocab;
    if (tp_size > 1) {
        rc = tp_shard_cfg(&m->cfg, opts->tp_rank, tp_size, &shard_c, &vocab0, &v_per, err);
        if (rc)
            return rc;
    }
    // With the pool sized later (n_kv_block 0) the step buffers are sized for its largest size.
    const uint32_t n_block_max = opts->n_kv_block ? opts->n_kv_block : kv_cap_blocks(&m->cfg, opts);
    const uint64_t max_pos = (uint64_t)n_block_max * opts->block_size;
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
    const int device = tp ? tp->device : 0;
    if (device < 0 || device >= n_dev)
        return TM_ERR(err, TM_E_CUDA, "cuda engine: device %d asked for, %d visible", device,
                      n_dev);

    cuda_impl *impl = tm_calloc(1, sizeof(*impl));
    if (!impl)
        return TM_ERR(err, TM_E_NOMEM, "cuda engine header");
    tm_model *shard = NULL;
    const tm_model_cfg *c = &shard_c;
    impl->eng.ops = &cuda_ops;
    impl->eng.model = m;
    impl->eng.opts = *opts;
    impl->eng.impl = impl;
    impl->cfg = *c;
    impl->use_graphs = 1;
    impl->device = device;
    impl->tp_rank = tp_size > 1 ? opts->tp_rank : 0;
    impl->tp_size = tp_size;
    impl->vocab_full = m->cfg.n_vocab;
    impl->vocab0 = vocab0;
    impl->v_per = v_per;
    impl->v_stride = tp_size > 1 ? v_per : c->n_vocab;
    impl->rdzv = tp ? tp->rdzv : NULL;
    impl->timeout_ms = tp && tp->timeout_ms ? tp->timeout_ms : 300000;
    pthread_mutex_init(&impl->wd_mu, NULL);
    impl->q_dim = c->n_head * c->head_dim;
    impl->kv_dim = c->n_kv_head * c->head_dim;
    impl->qkv_dim = impl->q_dim + 2 * impl->kv_dim;
    const uint32_t S = opts->max_seqs, T = opts->max_batched_tokens;
    // Block-table entries per step: each sequence covers at most min(pool, n_ctx) positions.
    const uint64_t seq_pos = TM_MIN(max_pos, (uint64_t)TM_MAX(c->n_ctx, 1u));
    const uint64_t bt_cap = (uint64_t)S * TM_CEIL_DIV(seq_pos, opts->block_size);
    impl->bt_cap = (uint32_t)TM_MIN(bt_cap, (uint64_t)UINT32_MAX / 2);
    // Prefill attention on tensor cores for head_dim 64/128 (TM_CUDA_FA=0: attn_paged always).
    const char *fa_env = getenv("TM_CUDA_FA");
    const uint32_t max_tiles = tm_k_attn_prefill_max_tiles(T, S);
    impl->use_fa = tm_k_attn_prefill_supported(c->head_dim) && max_tiles <= 65535 &&
                   !(fa_env && strcmp(fa_env, "0") == 0);
    impl->meta_cap = 4 * (size_t)T + 2 * (size_t)S + impl->bt_cap +
                     (impl->use_fa ? 4 * (size_t)max_tiles : 0);
    // attention partials (attn_splits splits less when a step's would not fit)
    impl->part_floats = tm_k_attn_part_floats(1, ATTN_PART_HEADS, 1, c->head_dim);

    impl->layers = tm_calloc(c->n_layer, sizeof(cuda_layer));
    impl->graphs = tm_calloc((size_t)S + 1, sizeof(cudaGraphExec_t));
    impl->chunks_h = tm_calloc(S, sizeof(tm_k_attn_prefill_chunk));
    if (!impl->layers || !impl->graphs || !impl->chunks_h) {
        TM_ERR(err, TM_E_NOMEM, "cuda engine: %u layers", c->n_layer);
        goto fail;
    }
    rc = TM_CUDA_CHECK(cudaSetDevice(device), err);
    if (!rc)
        rc = TM_CUDA_CHECK(cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking), err);
    if (rc)
        goto fail;
    if (tp_size > 1) {
        // Every rank blocks here until all have joined the communicator.
        rc = tm_nccl_create(tp->nccl_id, impl->tp_rank, tp_size, impl->timeout_ms, &impl->nccl,
                            err);
        if (rc) {
            tm_err_wrap(err, "tp rank %u of %u", impl->tp_rank, tp_size);
            goto fail;
        }
        if (pthread_create(&impl->wd, NULL, watchdog_main, impl) != 0) {
            TM_ERR(err, TM_E_INTERNAL, "cuda engine: cannot start the tp watchdog thread");
            goto fail;
        }
        impl->wd_started = 1;
        const int v = tm_nccl_version(), hv = tm_nccl_header_version();
        TM_LOG_INFO("cuda", "tp rank %u of %u on device %d: NCCL %d.%d.%d (built with %d.%d.%d), "
                    "%u heads, %u KV heads, n_ff %u, vocabulary rows [%u, %u)",
                    impl->tp_rank, tp_size, device, v / 10000, v / 100 % 100, v % 100,
                    hv / 10000, hv / 100 % 100, hv % 100, c->n_head, c->n_kv_head, c->n_ff,
                    vocab0, vocab0 + c->n_vocab);
    }

    int n_sm = 0;
    rc = TM_CUDA_CHECK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, device), err);
    if (rc)
        goto fail;
    const char *prof_env = getenv("TM_CUDA_PROFILE");
    if (prof_env && strcmp(prof_env, "1") == 0) {
        for (uint32_t i = 0; i < PROF_EVENTS && !rc; i++)
            rc = TM_CUDA_CHECK(cudaEventCreate(&impl->prof_ev[i]), err);
        if (rc)
            goto fail;
        impl->prof = 1;
    }
    impl->n_sm = (uint32_t)TM_MAX(n_sm, 1);
    // Decode-sized steps use the skinny tensor-core projections (TM_CUDA_SKINNY=0: cuBLAS for
    // everything, to compare).
    const char *sk_env = getenv("TM_CUDA_SKINNY");
    impl->sk_max_tok = sk_env && strcmp(sk_env, "0") == 0 ? 0 : TM_MIN(T, TM_SKINNY_MAX_TOK);
    impl->sk_part_floats = impl->sk_max_tok ? skinny_part_floats(impl, impl->sk_max_tok) : 0;
    impl->ablate = parse_ablate(getenv("TM_CUDA_ABLATE"));
    if (impl->ablate)
        TM_LOG_WARN("cuda", "TM_CUDA_ABLATE=%s: ops skipped, outputs are meaningless "
                    "(benchmarks only)", getenv("TM_CUDA_ABLATE"));

    carver cw = {0};
    carve_weights(impl, &cw);
    carver ca = {0};
    carve_acts(impl, &ca);
    const size_t logits_h_n = (size_t)tp_size * S * impl->v_stride;
    rc = TM_CUDA_CHECK(cudaMalloc(&impl->w_arena, cw.off), err);
    if (!rc)
        rc = TM_CUDA_CHECK(cudaMalloc(&impl->a_arena, ca.off), err);
    if (!rc)
        rc = TM_CUDA_CHECK(
            cudaMallocHost((void **)&impl->plan_h, sizeof(plan_hdr) + impl->meta_cap * 4), err);
    if (!rc)
        rc = TM_CUDA_CHECK(cudaMallocHost((void **)&impl->logits_h, logits_h_n * sizeof(float)),
                           err);
    if (!rc)
        rc = TM_CUDA_CHECK(cudaMallocHost((void **)&impl->ids_h, (size_t)S * 4), err);
    if (rc) {
        tm_err_wrap(err, "cuda engine: weights %.2f GB, activations %.2f GB: ", cw.off / 1e9,
                    ca.off / 1e9);
        goto fail;
    }
    impl->meta_h = (uint32_t *)(impl->plan_h + 1);
    cw = (carver){.base = impl->w_arena};
    carve_weights(impl, &cw);
    ca = (carver){.base = impl->a_arena};
    carve_acts(impl, &ca);
    rc = alloc_kv(impl, util, err);
    if (!rc && tp_size > 1)
        rc = ar_setup(impl, err);
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
    tm_model_rope_inv_freq(c, inv_freq);
    rc = TM_CUDA_CHECK(cudaMemcpy(impl->inv_freq, inv_freq, c->head_dim / 2 * sizeof(float),
                                  cudaMemcpyHostToDevice),
                       err);
    if (rc)
        goto fail;
    if (random) {
        rc = fill_weights(impl, seed * 131 + impl->tp_rank, err);
    } else if (tp_size > 1) {
        // This rank's slices of the host weights (views, plus column copies of o_proj and
        // down_proj), uploaded and dropped.
        uint32_t sv0 = 0;
        rc = tm_shard_create(m, impl->tp_rank, tp_size, &shard, &sv0, err);
        if (!rc) {
            const tm_model_cfg *sc = &shard->cfg;
            TM_ASSERT(sv0 == vocab0 && sc->n_head == c->n_head && sc->n_kv_head == c->n_kv_head &&
                      sc->n_ff == c->n_ff && sc->n_vocab == c->n_vocab);
            rc = tm_model_check_weights(shard, "cuda engine", err);
        }
        if (!rc)
            rc = upload_weights(impl, shard, err);
    } else {
        rc = upload_weights(impl, m, err);
    }
    if (rc)
        goto fail;
    tm_shard_destroy(shard);
    *out = &impl->eng;
    return TM_OK;
fail:
    tm_shard_destroy(shard);
    fail_engine(impl); // abort, not destroy: other ranks may be gone
    cuda_destroy(&impl->eng);
    return err->rc;
}

tm_rc tm_engine_cuda_create(const tm_model *m, const tm_engine_opts *opts, tm_engine **out,
                            tm_err *err) {
    return create(m, opts, NULL, 0, 0, out, err);
}

tm_rc tm_engine_cuda_create_random(const tm_model *m, const tm_engine_opts *opts, uint64_t seed,
                                   tm_engine **out, tm_err *err) {
    return create(m, opts, NULL, 1, seed, out, err);
}

tm_rc tm_engine_cuda_tp_create(const tm_model *m, const tm_engine_opts *opts,
                               const tm_engine_cuda_tp *tp, tm_engine **out, tm_err *err) {
    return create(m, opts, tp, tp->random, tp->seed, out, err);
}

int tm_engine_cuda_n_devices(void) {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

static void cuda_destroy(tm_engine *eng) {
    if (!eng)
        return;
    cuda_impl *impl = eng->impl;
    cudaSetDevice(impl->device);
    if (impl->prof) {
        double total = 0.0;
        for (uint32_t k = 0; k < PROF_KINDS && impl->prof_kind[k]; k++)
            total += impl->prof_ms[k];
        fprintf(stderr, "TM_CUDA_PROFILE (tp rank %u, eager steps): %.3f ms of GPU time\n",
                impl->tp_rank, total);
        for (uint32_t k = 0; k < PROF_KINDS && impl->prof_kind[k]; k++)
            fprintf(stderr, "  %-28s %10.3f ms %5.1f%% %8llu calls %9.2f us/call\n",
                    impl->prof_kind[k], impl->prof_ms[k], 100.0 * impl->prof_ms[k] / total,
                    (unsigned long long)impl->prof_calls[k],
                    1e3 * impl->prof_ms[k] / (double)TM_MAX(impl->prof_calls[k], 1ull));
        for (uint32_t i = 0; i < PROF_EVENTS; i++)
            cudaEventDestroy(impl->prof_ev[i]);
    }
    int stuck = 0; // a dead TP engine whose stream or watchdog does not come back: leak, do not hang
    if (impl->wd_started) {
        pthread_mutex_lock(&impl->wd_mu);
        impl->wd_quit = 1;
        pthread_mutex_unlock(&impl->wd_mu);
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += DEAD_WAIT_MS / 1000;
        if (pthread_timedjoin_np(impl->wd, NULL, &until) != 0) { // stuck in ncclCommAbort
            pthread_detach(impl->wd);
            stuck = 1;
        }
    }
    if (impl->dead && impl->nccl) // peers may be gone: abort, so no NCCL kernel can wait on them
        abort_comm(impl, NULL);
    if (impl->dead && impl->tp_size > 1 && impl->stream && !stuck) {
        const double t0 = tm_now_ms();
        while (cudaStreamQuery(impl->stream) == cudaErrorNotReady && !stuck)
            stuck = tm_now_ms() - t0 > DEAD_WAIT_MS;
    }
    if (stuck) {
        // cudaFree and cudaStreamSynchronize would wait for kernels that never finish; the
        // process is about to exit after a failed rank, so the device memory is left to it.
        TM_LOG_WARN("cuda", "tp rank %u: NCCL kernels still running %d s after the abort; "
                    "leaving the engine's GPU memory to process exit", impl->tp_rank,
                    DEAD_WAIT_MS / 1000);
        return;
    }
    if (impl->nccl && impl->tp_rank == 0 && !impl->dead) {
        plan_hdr h = {.op = PLAN_STOP};
        tm_err e = {0};
        tm_rdzv_bcast(impl->rdzv, PLAN_MSG, &h, sizeof(h), NULL, 0, &e); // best effort
    }
    if (impl->stream)
        cudaStreamSynchronize(impl->stream); // nothing may still use the buffers
    if (impl->graphs) {
        for (uint32_t i = 0; i <= impl->eng.opts.max_seqs; i++)
            if (impl->graphs[i])
                cudaGraphExecDestroy(impl->graphs[i]);
        tm_free(impl->graphs);
    }
    tm_free(impl->chunks_h);
    if (impl->blas)
        cublasDestroy(impl->blas);
    cudaFree(impl->w_arena);
    cudaFree(impl->a_arena);
    cudaFree(impl->k_cache);
    cudaFree(impl->v_cache);
    cudaFreeHost(impl->plan_h);
    cudaFreeHost(impl->logits_h);
    cudaFreeHost(impl->ids_h);
    for (uint32_t r = 0; r < TM_AR_MAX_RANKS; r++) {
        if (!impl->ar_regions[r])
            continue;
        if (r == impl->tp_rank)
            cudaFree(impl->ar_regions[r]);
        else
            cudaIpcCloseMemHandle(impl->ar_regions[r]);
    }
    if (impl->stream)
        cudaStreamDestroy(impl->stream);
    tm_nccl_destroy(impl->nccl);
    pthread_mutex_destroy(&impl->wd_mu);
    tm_free(impl->layers);
    tm_free(impl);
}
