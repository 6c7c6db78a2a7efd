/* runner/engine/cuda/engine_cuda.c - the CUDA engine's runtime (see engine_cuda.h): everything
 * that does not depend on the model's architecture. The architecture (its weights, activations
 * and forward pass) is a tm_cuda_arch table (arch.h; the Llama family: llama.c), picked at create
 * by tm_model_cfg.arch. Tensor parallel is the driver of tp_driver.c; this file runs one rank.
 *
 * Owns: the device and stream, the cuBLAS handle and the projection launcher (cuBLAS or the
 * skinny split-K kernel), batch validation and the packing of each step's metadata, the CUDA
 * graphs of decode steps, the sizing and allocation of the paged KV cache and the KV copies, the
 * logits head after the model (greedy argmax on the device, or logits to the host; with TP the
 * candidate merge or the slice gather), the arenas the architecture carves, benchmark ablation
 * (TM_CUDA_ABLATE) and the TM_CUDA_PROFILE event timings.
 *
 * Per-step metadata (token ids, positions, KV slots, token -> sequence, block tables, then the
 * prefill attention tiles) is packed into a pinned host buffer and sent with one copy; its layout
 * depends only on (T, n_seq), so a decode step of T sequences always uses the same device
 * addresses and its CUDA graph, captured once, stays valid (an arch with own_graphs, arch.h,
 * captures its own between its host work; the runtime then only tells it which steps may
 * replay them: tm_cuda_step.graph). The attention split count depends
 * only on T for the same reason. With TP, rank 0 hands each step's plan (that metadata with a
 * small header, tm_cuda_plan) to the driver, which sends it to the other ranks before this rank
 * launches its own work; every rank then runs the same plan (rank_run_plan). Decode
 * steps replay CUDA graphs on every rank, all-reduces included (NCCL kernels are captured like
 * any other).
 *
 * Memory is allocated at create. Device pointers are device memory unless marked host. One
 * thread drives an engine. */
#include "runner/engine/cuda/engine_cuda.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/log.h"
#include "kernels/attn_prefill.h"
#include "kernels/common.h"
#include "kernels/gemm_skinny.h"
#include "kernels/sample.h"
#include "kernels/tp.h"
#include "runner/engine/cuda/arch.h"
#include "runner/engine/cuda/engine_cuda_int.h"
#include "runner/engine/cuda/tp_driver_int.h"
#include "runner/tp/rendezvous.h"
#include "runner/tp/tp_nccl.h"

/* The device sampler (forward_sample, issue 22; tp_size 1): the count rows, and the per-step
 * parameters, packed history / bias / mask / allowed-ids arrays and outputs, staged through
 * pinned host buffers. */
#define SAMP_PK_CAP ((size_t)1 << 22) /* packed uint32 entries per step */
#define SAMP_OUT_WORDS(S) ((size_t)(S) * (2 + 2 * TM_K_SAMPLE_MAX_TOP))
typedef struct tm_cuda_samp {
    uint32_t *cnt;                    /* [S][n_vocab], all 0 between steps */
    tm_k_sample_row *rows_d, *rows_h; /* [S], then pk: one copy in; rows_h pinned host */
    uint32_t *pk_d, *pk_h;            /* [SAMP_PK_CAP] right after rows_d / rows_h */
    uint32_t *out_d, *out_h; /* ids [n], lp [n], top ids [n][20], top lp [n][20]; n = n_row */
    uint32_t n_row, n_limit; /* this step's */
    int any_lp;              /* a row of this step wants logprobs */
    size_t n_pk;
    int active; /* 1 while forward_sample runs its step */
} tm_cuda_samp;

/* Kept free when the KV pool is sized from free memory: cuBLAS, CUDA graphs, NCCL buffers. */
#define KV_HEADROOM_BYTES ((size_t)1 << 30)
#define GPU_MEM_UTIL_DEFAULT 0.90f

/* The CUDA engine's table of architectures (arch.h), indexed by tm_arch: one line per
 * architecture. */
static const tm_cuda_arch *const cuda_archs[TM_ARCH_COUNT] = {
    [TM_ARCH_LLAMA] = &tm_cuda_arch_llama,        [TM_ARCH_QWEN2] = &tm_cuda_arch_llama,
    [TM_ARCH_MISTRAL] = &tm_cuda_arch_llama,      [TM_ARCH_DEEPSEEK_V4] = &tm_cuda_arch_dsv4,
    [TM_ARCH_DEEPSEEK_V41] = &tm_cuda_arch_dsv41,
};

/* The architecture table of a model, or NULL when the CUDA engine has none for it. */
static const tm_cuda_arch *pick_arch(tm_arch arch) {
    return (unsigned)arch < TM_ARCH_COUNT ? cuda_archs[arch] : NULL;
}

/* Offsets (in uint32) of the step metadata arrays for T tokens, S sequences and W wanted rows
 * (W > S only with several rows per sequence: speculative verification). */
typedef struct meta_off {
    size_t tokens, pos, slot, tok_seq, seq_bt, want_row, bt;
} meta_off;

static meta_off meta_layout(uint32_t T, uint32_t S, uint32_t W) {
    meta_off o;
    o.tokens = 0;
    o.pos = T;
    o.slot = 2 * (size_t)T;
    o.tok_seq = 3 * (size_t)T;
    o.seq_bt = 4 * (size_t)T;
    o.want_row = 4 * (size_t)T + S;
    o.bt = 4 * (size_t)T + S + TM_MAX(S, W);
    return o;
}

static void cuda_destroy(tm_engine *eng);
static tm_rc cuda_forward(tm_engine *eng, const tm_batch *b, float *logits, tm_err *err);
static tm_rc cuda_forward_greedy(tm_engine *eng, const tm_batch *b, uint32_t n_vocab_limit,
                                 uint32_t *ids, tm_err *err);
static tm_rc cuda_kv_copy(tm_engine *eng, uint32_t src, uint32_t dst, uint32_t n_tok, tm_err *err);
static tm_rc cuda_forward_sample(tm_engine *eng, const tm_batch *b, uint32_t n_vocab_limit,
                                 const tm_engine_sample_row *rows, tm_engine_sample_out *out,
                                 tm_err *err);

static const tm_engine_ops cuda_ops = {
    .name = "cuda",
    .kv_auto = "bf16",
    .forward = cuda_forward,
    .forward_greedy = cuda_forward_greedy,
    .forward_sample = cuda_forward_sample,
    .kv_copy = cuda_kv_copy,
    .destroy = cuda_destroy,
};

// The first n_tok token slots of block src into block dst, in every layer: one strided copy per
// cache (a row per layer), ordered on the engine's stream with the forward passes.
static tm_rc cuda_kv_copy(tm_engine *eng, uint32_t src, uint32_t dst, uint32_t n_tok, tm_err *err) {
    tm_cuda_engine *impl = eng->impl;
    const uint32_t bs = eng->opts.block_size;
    if (impl->dead)
        return TM_ERR(err, TM_E_CUDA, "cuda engine: dead after an earlier CUDA error");
    if (src >= eng->opts.n_kv_block || dst >= eng->opts.n_kv_block || n_tok > bs)
        return TM_ERR(err, TM_E_INVAL, "kv_copy: block %u -> %u, %u tokens out of range", src, dst,
                      n_tok);
    if (n_tok == 0)
        return TM_OK;
    cudaSetDevice(impl->device);
    if (impl->drv && impl->tp_rank == 0) {
        tm_rc rc = tm_cuda_drv_send_kv_copy(impl->drv, src, dst, n_tok, err);
        if (rc) {
            impl->dead = 1;
            return rc;
        }
    }
    // in bytes: the entries are bf16 or e4m3 (the prefix cache shares blocks of either)
    const size_t eb = impl->kv_elem_bytes, blk = (size_t)bs * impl->kv_dim * eb;
    const size_t pitch = impl->layer_kv_bytes, width = (size_t)n_tok * impl->kv_dim * eb;
    char *caches[2] = {(char *)impl->k_cache, (char *)impl->v_cache};
    for (int c = 0; c < 2; c++) {
        tm_rc rc = TM_CUDA_CHECK(
            cudaMemcpy2DAsync(caches[c] + dst * blk, pitch, caches[c] + src * blk, pitch, width,
                              impl->cfg.n_layer, cudaMemcpyDeviceToDevice, impl->stream),
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

tm_rc tm_cuda_gemm(tm_cuda_engine *impl, const char *what, const uint16_t *w, const uint16_t *x,
                   uint32_t ldx, void *y, int y_f32, uint32_t ldy, uint32_t n_tok, uint32_t n_in,
                   uint32_t n_out, float beta, tm_err *err) {
    if (n_tok == 0)
        return TM_OK;
    const float alpha = 1.0f;
    // Row-major y^T = w x^T in cuBLAS's column-major terms.
    cublasStatus_t st = cublasGemmEx(impl->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n_out, (int)n_tok,
                                     (int)n_in, &alpha, w, CUDA_R_16BF, (int)n_in, x, CUDA_R_16BF,
                                     (int)ldx, &beta, y, y_f32 ? CUDA_R_32F : CUDA_R_16BF, (int)ldy,
                                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    return blas_check(st, what, err);
}

/* The TM_CUDA_ABLATE names of the TM_CUDA_ABL_* kinds (engine_cuda_int.h). */
static const char *const abl_names[TM_CUDA_ABL_N] = {"norm", "qkv", "rope", "attn", "o",
                                                     "ar",   "gu",  "silu", "down", "lm"};

/* The TM_CUDA_ABL_* bits of a comma-separated list of abl_names; unknown names are ignored. */
static uint32_t parse_ablate(const char *list) {
    uint32_t bits = 0;
    for (const char *p = list; p && *p;) {
        const size_t n = strcspn(p, ",");
        for (int i = 0; i < TM_CUDA_ABL_N; i++)
            if (strlen(abl_names[i]) == n && strncmp(p, abl_names[i], n) == 0)
                bits |= 1u << i;
        p += n + (p[n] == ',');
    }
    return bits;
}

tm_rc tm_cuda_project(tm_cuda_engine *impl, int abl, const char *what, const uint16_t *w,
                      const uint16_t *x, uint32_t T, uint32_t n_in, uint32_t n_out, float *dst,
                      float beta, tm_cuda_proj *out, tm_err *err) {
    if (T <= impl->sk_max_tok && tm_k_gemm_skinny_fits(T, n_in, n_out)) {
        uint32_t kps = 0;
        const uint32_t n_split = tm_k_gemm_skinny_splits(n_in, n_out, impl->n_sm, &kps);
        float *part = n_split == 1 && beta == 0.0f ? dst : impl->sk_part;
        TM_ASSERT((size_t)n_split * T * n_out <= impl->sk_part_floats);
        tm_k_gemm_skinny_args ga = {.part = part,
                                    .w = w,
                                    .x = x,
                                    .n_tok = T,
                                    .n_in = n_in,
                                    .n_out = n_out,
                                    .n_split = n_split,
                                    .k_per_split = kps};
        *out = (tm_cuda_proj){.p = part, .n = n_split, .stride = (size_t)T * n_out};
        return TM_CUDA_OP(impl, abl, what, tm_k_gemm_skinny(&ga, impl->stream, err));
    }
    *out = (tm_cuda_proj){.p = dst, .n = 1, .stride = 0};
    return TM_CUDA_OP(
        impl, abl, what,
        tm_cuda_gemm(impl, "cublasGemmEx", w, x, n_in, dst, 1, n_out, T, n_in, n_out, beta, err));
}

void tm_cuda_prof_mark(tm_cuda_engine *impl, const char *what) {
    if (!impl->prof || impl->prof_n >= TM_CUDA_PROF_EVENTS)
        return;
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(impl->stream, &cs) != cudaSuccess ||
        cs != cudaStreamCaptureStatusNone)
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
static void prof_collect(tm_cuda_engine *impl) {
    for (uint32_t i = 1; i < impl->prof_n; i++) {
        float ms = 0.0f;
        if (cudaEventElapsedTime(&ms, impl->prof_ev[i - 1], impl->prof_ev[i]) != cudaSuccess)
            continue;
        uint32_t k = 0;
        while (k < TM_CUDA_PROF_KINDS && impl->prof_kind[k] &&
               strcmp(impl->prof_kind[k], impl->prof_what[i]))
            k++;
        if (k == TM_CUDA_PROF_KINDS)
            continue;
        impl->prof_kind[k] = impl->prof_what[i];
        impl->prof_ms[k] += ms;
        impl->prof_calls[k]++;
    }
    impl->prof_n = 0;
}

/* The architecture's forward pass for a step whose metadata is already on the device
 * (meta_layout(T, S, n_want), the n_tile prefill tiles at tile_off). */
static tm_rc run_model(tm_cuda_engine *impl, uint32_t T, uint32_t S, uint32_t n_want,
                       uint32_t n_tile, size_t tile_off, int graph, tm_err *err) {
    const meta_off mo = meta_layout(T, S, n_want);
    const uint32_t *md = impl->meta_d;
    const tm_cuda_step st = {.n_tok = T,
                             .n_seq = S,
                             .n_want = n_want,
                             .n_tile = n_tile,
                             .graph = (uint32_t)graph,
                             .tokens = md + mo.tokens,
                             .pos = md + mo.pos,
                             .slot = md + mo.slot,
                             .tok_seq = md + mo.tok_seq,
                             .seq_bt = md + mo.seq_bt,
                             .want_row = md + mo.want_row,
                             .block_tables = md + mo.bt,
                             .tiles = (const tm_k_attn_prefill_tile *)(md + tile_off)};
    return impl->arch->forward(impl, &st, err);
}

/* Validate the batch (as the CPU engine does) and pack its metadata into meta_h. */
static tm_rc pack_batch(tm_cuda_engine *impl, const tm_batch *b, uint32_t *T_out,
                        uint32_t *n_want_out, size_t *n_meta_out, uint32_t *n_tile_out,
                        int *decode_only, tm_err *err) {
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

    uint32_t n_rows = 0;
    for (uint32_t i = 0; i < b->n_seq; i++)
        n_rows += tm_batch_seq_rows(&b->seqs[i]);
    const meta_off mo = meta_layout(T, b->n_seq, n_rows);
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
        for (uint32_t k = tm_batch_seq_rows(s); k > 0; k--)
            mh[mo.want_row + n_want++] = t - k;
        if (s->n_tok != 1 || !s->want_logits)
            *decode_only = 0;
        impl->chunks_h[i] =
            (tm_k_attn_prefill_chunk){.t0 = t - s->n_tok, .n_tok = s->n_tok, .pos0 = s->pos};
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
static tm_rc run_graph(tm_cuda_engine *impl, uint32_t T, tm_err *err) {
    if (!impl->graphs[T]) {
        cudaGraph_t g = NULL;
        tm_rc rc = TM_CUDA_CHECK(
            cudaStreamBeginCapture(impl->stream, cudaStreamCaptureModeThreadLocal), err);
        if (rc)
            return rc;
        rc = run_model(impl, T, T, T, 0, 0, 0, err);
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

/* After a failure: the engine is dead; with TP no later collective can be trusted, so the
 * driver aborts the communicator (NCCL kernels waiting for a dead peer return). */
static void fail_engine(tm_cuda_engine *impl) {
    impl->dead = 1;
    if (impl->drv)
        tm_cuda_drv_abort(impl->drv);
}

/* Everything on the device for one step whose plan (header h, metadata in meta_h) every rank
 * has: metadata upload, the model (graph or eager), the logits head and, with TP, its
 * collectives; rank 0 (or the only rank) also copies ids or logits to pinned host memory. Ends
 * with the stream synchronized. */
static tm_rc run_step(tm_cuda_engine *impl, const tm_cuda_plan *h, tm_err *err) {
    const int tp = impl->tp_size > 1, out_host = impl->tp_rank == 0;
    cudaStream_t s = impl->stream;
    if (tp)
        tm_cuda_drv_step_begin(impl->drv);
    tm_cuda_mark(impl, "(step start)");
    tm_rc rc = TM_CUDA_CHECK(cudaMemcpyAsync(impl->meta_d, impl->meta_h,
                                             h->n_meta * sizeof(uint32_t), cudaMemcpyHostToDevice,
                                             s),
                             err);
    if (!rc) {
        // an arch with graphs of its own gets the step eagerly and replays them itself
        const int graph = h->graph && impl->use_graphs;
        if (graph && !impl->arch->own_graphs)
            rc = run_graph(impl, h->T, err);
        else
            rc = run_model(impl, h->T, h->S, h->n_want, h->n_tile,
                           h->n_meta - 4 * (size_t)h->n_tile, graph, err);
    }
    const uint32_t n_want = h->n_want, nv = impl->cfg.n_vocab;
    tm_cuda_samp *sp = impl->samp;
    if (!rc && n_want && sp && sp->active) {
        // device sampling: parameters in, the kernel, ids (and logprobs) out
        const size_t S = n_want, T20 = TM_K_SAMPLE_MAX_TOP; // outputs packed for n_want rows
        const size_t n_in = (size_t)((char *)sp->pk_h - (char *)sp->rows_h) + sp->n_pk * 4;
        rc = TM_CUDA_CHECK(cudaMemcpyAsync(sp->rows_d, sp->rows_h, n_in, cudaMemcpyHostToDevice, s),
                           err);
        tm_k_sample_f32_args ka = {.ids = sp->out_d,
                                   .lp = (float *)(sp->out_d + S),
                                   .top_ids = sp->out_d + 2 * S,
                                   .top_lp = (float *)(sp->out_d + 2 * S + T20 * S),
                                   .logits = impl->logits,
                                   .cnt = sp->cnt,
                                   .rows = sp->rows_d,
                                   .pk = sp->pk_d,
                                   .n_row = n_want,
                                   .n_col = nv,
                                   .n_limit = sp->n_limit};
        if (!rc)
            rc = tm_k_sample_f32(&ka, s, err);
        if (!rc)
            rc = TM_CUDA_CHECK(
                cudaMemcpyAsync(sp->out_h, sp->out_d,
                                (sp->any_lp ? SAMP_OUT_WORDS(S) : S) * sizeof(uint32_t),
                                cudaMemcpyDeviceToHost, s),
                err);
    } else if (!rc && n_want && h->greedy) {
        if (tp) {
            tm_k_argmax_part_f32_args pa = {.cand = impl->cand,
                                            .logits = impl->logits,
                                            .n_row = n_want,
                                            .n_col = nv,
                                            .id0 = impl->vocab0,
                                            .id_limit = h->vocab_limit};
            rc = tm_k_argmax_part_f32(&pa, s, err);
            if (!rc)
                rc = tm_cuda_comm_allgather(impl->comm, impl->cand, impl->cand_all,
                                            2 * (size_t)n_want, TM_NCCL_U32, s, err);
            tm_k_argmax_merge_args ma = {
                .ids = impl->ids, .cand = impl->cand_all, .n_row = n_want, .n_rank = impl->tp_size};
            if (!rc && out_host)
                rc = tm_k_argmax_merge(&ma, s, err);
        } else {
            tm_k_argmax_f32_args ga = {.ids = impl->ids,
                                       .logits = impl->logits,
                                       .n_row = n_want,
                                       .n_col = nv,
                                       .n_limit = h->vocab_limit};
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
            rc = tm_cuda_comm_allgather(impl->comm, impl->logits, impl->logits_all,
                                        (size_t)n_want * impl->v_per, TM_NCCL_F32, s, err);
            src = impl->logits_all;
            n = (size_t)impl->tp_size * n_want * impl->v_per;
        }
        if (!rc && out_host)
            rc = TM_CUDA_CHECK(
                cudaMemcpyAsync(impl->logits_h, src, n * sizeof(float), cudaMemcpyDeviceToHost, s),
                err);
    }
    tm_cuda_mark(impl, "sample/gather + copy out");
    // Wait for the stream; with TP the driver polls it, so that a step its watchdog aborted
    // returns the error instead of waiting for kernels that never finish.
    if (!rc)
        rc = tp ? tm_cuda_drv_sync(impl->drv, s, err)
                : TM_CUDA_CHECK(cudaStreamSynchronize(impl->stream), err);
    if (impl->prof)
        prof_collect(impl);
    if (tp)
        tm_cuda_drv_step_end(impl->drv, rc, err);
    return rc;
}

/* One step; fills logits (host, [n_want][n_vocab]) or ids (host, [n_want]: the argmax over ids
 * [0, vocab_limit), vocab_limit in [1, n_vocab]). */
static tm_rc forward_step(tm_cuda_engine *impl, const tm_batch *b, float *logits, uint32_t *ids,
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
    tm_cuda_plan *h = impl->plan_h;
    *h = (tm_cuda_plan){.op = TM_CUDA_PLAN_STEP,
                        .T = T,
                        .S = b->n_seq,
                        .n_want = n_want,
                        .graph = (uint32_t)(decode_only && impl->use_graphs),
                        .greedy = ids != NULL,
                        .vocab_limit = ids ? vocab_limit : 0,
                        .n_meta = (uint32_t)n_meta,
                        .n_tile = n_tile};
    if (impl->drv) // the other ranks start while this one launches its own work
        rc = tm_cuda_drv_send_step(impl->drv, h, impl->meta_h, err);
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
    } else if (n_want && logits) { // (forward_sample's step leaves its ids in samp->out_h)
        memcpy(logits, impl->logits_h, (size_t)n_want * impl->vocab_full * sizeof(float));
    }
    return TM_OK;
}

// Stage the rows' parameters and packed arrays, run the step with the device sampler on, and
// unpack its outputs.
static tm_rc cuda_forward_sample(tm_engine *eng, const tm_batch *b, uint32_t n_vocab_limit,
                                 const tm_engine_sample_row *rows, tm_engine_sample_out *out,
                                 tm_err *err) {
    tm_cuda_engine *impl = eng->impl;
    tm_cuda_samp *sp = impl->samp;
    if (!sp)
        return TM_ERR(err, TM_E_AGAIN, "cuda forward_sample: no device sampler (TP)");
    if (n_vocab_limit == 0)
        return TM_ERR(err, TM_E_INVAL, "cuda forward_sample: n_vocab_limit 0");
    uint32_t n_want = 0;
    size_t n_pk = 0;
    const uint32_t n_limit = TM_MIN(n_vocab_limit, impl->vocab_full);
    const size_t n_allow = TM_CEIL_DIV((size_t)n_limit, 32); // words of an allowed-ids bitmask
    for (uint32_t i = 0; i < b->n_seq; i++)
        n_want += tm_batch_seq_rows(&b->seqs[i]);
    const uint32_t R = tm_engine_max_rows(&eng->opts);
    for (uint32_t i = 0; i < n_want && n_want <= R; i++) {
        const tm_sample_params *p = &rows[i].p;
        if (rows[i].score && rows[i].score_id >= n_limit)
            return TM_ERR(err, TM_E_INVAL, "cuda forward_sample: scored id %u beyond %u",
                          rows[i].score_id, n_limit);
        if (rows[i].score)
            continue; // not sampled: a greedy row without processing, nothing packed
        n_pk += (size_t)p->n_hist + 2 * (size_t)p->n_bias + p->n_mask + (p->allow ? n_allow : 0);
    }
    if (n_want > R || n_pk > SAMP_PK_CAP)
        return TM_ERR(err, TM_E_AGAIN, "cuda forward_sample: %zu packed entries", n_pk);
    size_t o = 0;
    sp->any_lp = 0;
    for (uint32_t i = 0; i < n_want; i++) {
        const tm_sample_params *p = &rows[i].p;
        tm_k_sample_row *kr = &sp->rows_h[i];
        sp->any_lp |= rows[i].want_lp != 0 || rows[i].score;
        if (rows[i].score) { // the raw row's argmax, the logprob of score_id and the top n_top
            *kr = (tm_k_sample_row){
                .n_top = TM_MIN(rows[i].n_top, (uint32_t)TM_K_SAMPLE_MAX_TOP),
                .want_lp = 1,
                .has_lp_id = 1,
                .lp_id = rows[i].score_id,
                .hist0 = (uint32_t)o,
                .bias0 = (uint32_t)o,
                .mask0 = (uint32_t)o,
                .allow0 = (uint32_t)o,
            };
            continue;
        }
        *kr = (tm_k_sample_row){
            .u = tm_sample_uniform(p->seed, rows[i].step),
            .inv_t = p->temperature > 0.0f ? 1.0f / p->temperature : 0.0f,
            .top_k = p->top_k,
            .top_p = p->top_p,
            .min_p = p->min_p,
            .rep = p->repetition_penalty,
            .freq = p->frequency_penalty,
            .pres = p->presence_penalty,
            .n_top = TM_MIN(rows[i].n_top, (uint32_t)TM_K_SAMPLE_MAX_TOP),
            .want_lp = rows[i].want_lp,
        };
        kr->hist0 = (uint32_t)o, kr->n_hist = p->n_hist, kr->n_hist_prompt = p->n_hist_prompt;
        if (p->n_hist)
            memcpy(sp->pk_h + o, p->hist, p->n_hist * sizeof(uint32_t));
        o += p->n_hist;
        kr->bias0 = (uint32_t)o, kr->n_bias = p->n_bias;
        if (p->n_bias) {
            memcpy(sp->pk_h + o, p->bias_ids, p->n_bias * sizeof(uint32_t));
            memcpy(sp->pk_h + o + p->n_bias, p->bias, p->n_bias * sizeof(float));
        }
        o += 2 * (size_t)p->n_bias;
        kr->mask0 = (uint32_t)o, kr->n_mask = p->n_mask;
        if (p->n_mask)
            memcpy(sp->pk_h + o, p->mask_ids, p->n_mask * sizeof(uint32_t));
        o += p->n_mask;
        kr->allow0 = (uint32_t)o, kr->has_allow = p->allow != NULL;
        if (p->allow) {
            memcpy(sp->pk_h + o, p->allow, n_allow * sizeof(uint32_t));
            o += n_allow;
        }
    }
    sp->n_pk = o;
    sp->n_row = n_want;
    sp->n_limit = n_limit;
    sp->active = 1;
    tm_rc rc = forward_step(impl, b, NULL, NULL, 0, err);
    sp->active = 0;
    if (rc)
        return rc;
    const size_t S = n_want, T20 = TM_K_SAMPLE_MAX_TOP; // as run_step packed them
    const float *lp = (const float *)(sp->out_h + S);
    const float *top_lp = (const float *)(sp->out_h + 2 * S + T20 * S);
    for (uint32_t i = 0; i < n_want; i++) {
        out[i].id = sp->out_h[i]; // the TM_K_SAMPLE_ codes are the TM_ENGINE_ID_ ones
        if (!rows[i].want_lp && !rows[i].score)
            continue;
        out[i].lp = lp[i];
        memcpy(out[i].top_ids, sp->out_h + 2 * S + T20 * i, T20 * sizeof(uint32_t));
        memcpy(out[i].top_lp, top_lp + T20 * i, T20 * sizeof(float));
    }
    return TM_OK;
}

static tm_rc samp_alloc(tm_cuda_engine *impl, tm_err *err) {
    const size_t S = tm_engine_max_rows(&impl->eng.opts), V = impl->cfg.n_vocab; // rows
    if (!tm_k_sample_f32_supported((uint32_t)V, impl->device))
        return TM_OK; // no device sampler: sampled steps take the logits to the host
    tm_cuda_samp *sp = tm_calloc(1, sizeof(*sp));
    if (!sp)
        return TM_ERR(err, TM_E_NOMEM, "cuda sampler state");
    impl->samp = sp;
    tm_rc rc = TM_CUDA_CHECK(cudaMalloc((void **)&sp->cnt, S * V * sizeof(uint32_t)), err);
    if (!rc)
        rc = TM_CUDA_CHECK(cudaMemset(sp->cnt, 0, S * V * sizeof(uint32_t)), err);
    const size_t n_in = S * sizeof(tm_k_sample_row) + SAMP_PK_CAP * sizeof(uint32_t);
    if (!rc)
        rc = TM_CUDA_CHECK(cudaMalloc((void **)&sp->rows_d, n_in), err);
    if (!rc)
        rc = TM_CUDA_CHECK(cudaMallocHost((void **)&sp->rows_h, n_in), err);
    if (!rc) {
        sp->pk_d = (uint32_t *)(sp->rows_d + S);
        sp->pk_h = (uint32_t *)(sp->rows_h + S);
    }
    if (!rc)
        rc = TM_CUDA_CHECK(cudaMalloc((void **)&sp->out_d, SAMP_OUT_WORDS(S) * 4), err);
    if (!rc)
        rc = TM_CUDA_CHECK(cudaMallocHost((void **)&sp->out_h, SAMP_OUT_WORDS(S) * 4), err);
    if (!rc)
        rc = tm_k_sample_f32_prepare((uint32_t)V, err);
    return rc;
}

static void samp_free(tm_cuda_samp *sp) {
    if (!sp)
        return;
    cudaFree(sp->cnt);
    cudaFree(sp->rows_d);
    cudaFreeHost(sp->rows_h);
    cudaFree(sp->out_d);
    cudaFreeHost(sp->out_h);
    tm_free(sp);
}

static tm_rc cuda_forward(tm_engine *eng, const tm_batch *b, float *logits, tm_err *err) {
    return forward_step(eng->impl, b, logits, NULL, 0, err);
}

static tm_rc cuda_forward_greedy(tm_engine *eng, const tm_batch *b, uint32_t n_vocab_limit,
                                 uint32_t *ids, tm_err *err) {
    tm_cuda_engine *impl = eng->impl;
    if (n_vocab_limit == 0)
        return TM_ERR(err, TM_E_INVAL, "cuda forward_greedy: n_vocab_limit 0");
    return forward_step(impl, b, NULL, ids, TM_MIN(n_vocab_limit, impl->vocab_full), err);
}

tm_rc tm_engine_cuda_forward_greedy(tm_engine *eng, const tm_batch *b, uint32_t *ids, tm_err *err) {
    if (!eng || eng->ops != &cuda_ops)
        return TM_ERR(err, TM_E_INVAL, "cuda forward_greedy: not a CUDA engine");
    return cuda_forward_greedy(eng, b, UINT32_MAX, ids, err);
}

/* ---- the rank engine, as the TP driver's serve loop drives it (tm_cuda_rank_ops) ---- */

static int rank_dead(const void *ctx) { return ((const tm_cuda_engine *)ctx)->dead; }

static tm_cuda_plan *rank_plan_buf(void *ctx, size_t *cap) {
    tm_cuda_engine *impl = ctx;
    *cap = sizeof(tm_cuda_plan) + impl->meta_cap * sizeof(uint32_t);
    return impl->plan_h;
}

static int rank_plan_fits(const void *ctx, const tm_cuda_plan *h, size_t len) {
    const tm_cuda_engine *impl = ctx;
    const tm_engine_opts *o = &impl->eng.opts;
    return !(h->T == 0 || h->T > o->max_batched_tokens || h->S > o->max_seqs || h->n_want > h->T ||
             h->n_want > tm_engine_max_rows(o) || h->n_meta > impl->meta_cap ||
             (h->greedy && (h->vocab_limit == 0 || h->vocab_limit > impl->vocab_full)) ||
             len != sizeof(*h) + (size_t)h->n_meta * sizeof(uint32_t) ||
             (h->graph && (h->T != h->S || h->T != h->n_want)) ||
             (h->n_tile && (!impl->use_fa || 4 * (size_t)h->n_tile > h->n_meta)));
}

static tm_rc rank_run_plan(void *ctx, const tm_cuda_plan *h, tm_err *err) {
    return run_step(ctx, h, err);
}

static tm_rc rank_kv_copy(void *ctx, uint32_t src, uint32_t dst, uint32_t n_tok, tm_err *err) {
    return cuda_kv_copy(&((tm_cuda_engine *)ctx)->eng, src, dst, n_tok, err);
}

static void rank_fail(void *ctx) { fail_engine(ctx); }

static const tm_cuda_rank_ops rank_ops = {
    .dead = rank_dead,
    .plan_buf = rank_plan_buf,
    .plan_fits = rank_plan_fits,
    .run_plan = rank_run_plan,
    .kv_copy = rank_kv_copy,
    .fail = rank_fail,
};

tm_rc tm_engine_cuda_tp_serve(tm_engine *eng, tm_err *err) {
    if (!eng || eng->ops != &cuda_ops)
        return TM_ERR(err, TM_E_INVAL, "cuda tp_serve: not a CUDA engine");
    tm_cuda_engine *impl = eng->impl;
    if (impl->tp_size < 2 || impl->tp_rank == 0)
        return TM_ERR(err, TM_E_INVAL, "cuda tp_serve: only ranks > 0 serve (rank %u of %u)",
                      impl->tp_rank, impl->tp_size);
    cudaSetDevice(impl->device);
    return tm_cuda_drv_serve(impl->drv, &rank_ops, impl, err);
}

void tm_engine_cuda_set_graphs(tm_engine *eng, int on) {
    if (!eng || eng->ops != &cuda_ops)
        return;
    tm_cuda_engine *impl = eng->impl;
    // the host all-reduce transport synchronizes inside its collectives: never captured
    impl->use_graphs = on && !impl->arch->eager &&
                       (!impl->comm || tm_cuda_comm_graphable(impl->comm));
}

/* ---- create / destroy ---- */

/* The runtime's activations, after the architecture's (meta_d last, as before the split into
 * arch and runtime, so the arena's size is the same). */
static void carve_acts(tm_cuda_engine *impl, tm_cuda_carver *cv) {
    const size_t S = tm_engine_max_rows(&impl->eng.opts), f4 = sizeof(float); // logits rows
    impl->arch->carve_acts(impl, cv);
    impl->logits = tm_cuda_carve(cv, S * impl->v_stride * f4);
    if (impl->tp_size > 1) {
        impl->logits_all = tm_cuda_carve(cv, (size_t)impl->tp_size * S * impl->v_per * f4);
        impl->cand = tm_cuda_carve(cv, S * 2 * sizeof(uint32_t));
        impl->cand_all = tm_cuda_carve(cv, (size_t)impl->tp_size * S * 2 * sizeof(uint32_t));
    }
    impl->sk_part = impl->sk_part_floats ? tm_cuda_carve(cv, impl->sk_part_floats * f4) : NULL;
    impl->ids = tm_cuda_carve(cv, S * sizeof(uint32_t));
    impl->gemm_ws = tm_cuda_carve(cv, TM_CUDA_GEMM_WS_BYTES);
    impl->meta_d = tm_cuda_carve(cv, impl->meta_cap * sizeof(uint32_t));
}

/* KV blocks that max_seqs sequences of the model's whole context need: the most a pool sized from
 * free memory gets (more could never be used). */
static uint32_t kv_cap_blocks(const tm_model_cfg *c, const tm_engine_opts *o) {
    const uint64_t per_seq = TM_CEIL_DIV((uint64_t)TM_MAX(c->n_ctx, 1u), o->block_size);
    return (uint32_t)TM_MIN(per_seq * o->max_seqs, (uint64_t)UINT32_MAX / o->block_size);
}

/* The KV cache, allocated after the weights and activations. With opts n_kv_block 0 its size
 * comes from free memory: device use (everything on the GPU now, this process's weights and
 * activations included, plus the pool) stays within util x total memory and KV_HEADROOM_BYTES
 * stay free; at most kv_cap_blocks, at least one block per sequence; with TP the smallest count of
 * all ranks. The count ends up in eng.opts.n_kv_block. */
static tm_rc alloc_kv(tm_cuda_engine *impl, float util, tm_err *err) {
    tm_engine_opts *o = &impl->eng.opts;
    const size_t block_bytes = 2 * (size_t)impl->cfg.n_layer * o->block_size * impl->kv_dim *
                               impl->kv_elem_bytes; // fp8 entries: half the bytes
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
        if (impl->drv) {
            rc = tm_cuda_drv_agree_min(impl->drv, &n, impl->gemm_ws, TM_CUDA_GEMM_WS_BYTES,
                                       impl->stream, err);
            if (rc)
                return rc;
        }
        if (n < o->max_seqs) {
            TM_LOG_WARN("cuda",
                        "KV pool: %u blocks fit within gpu_memory_utilization %.2f of "
                        "%.1f GB (%.1f GB in use) but max_seqs is %u; taking one block per "
                        "sequence (set engine.kv_blocks, raise gpu_memory_utilization or lower "
                        "max_seqs)",
                        n, (double)util, total_b / 1e9, used / 1e9, o->max_seqs);
            n = o->max_seqs;
        }
        o->n_kv_block = n;
        TM_LOG_INFO("cuda",
                    "KV pool: %u blocks of %u tokens, %.2f GB, from free memory "
                    "(gpu_memory_utilization %.2f of %.1f GB, %.1f GB in use before; %u blocks "
                    "would hold max_seqs %u full contexts)",
                    n, o->block_size, (double)n * block_bytes / 1e9, (double)util, total_b / 1e9,
                    used / 1e9, cap, o->max_seqs);
    }
    const uint64_t max_pos = (uint64_t)o->n_kv_block * o->block_size;
    TM_ASSERT(max_pos <= UINT32_MAX); // explicit counts are checked in create, sized ones capped
    impl->max_pos = (uint32_t)max_pos;
    impl->layer_kv_elems = (size_t)max_pos * impl->kv_dim;
    impl->layer_kv_bytes = impl->layer_kv_elems * impl->kv_elem_bytes;
    const size_t kv_bytes = (size_t)impl->cfg.n_layer * impl->layer_kv_bytes;
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
    if (!rc)
        TM_LOG_INFO("cuda",
                    "KV pool: %u blocks of %u tokens = %llu tokens of %s KV (%u bytes per token "
                    "and layer in K and V), %.2f GB",
                    o->n_kv_block, o->block_size, (unsigned long long)max_pos,
                    impl->kv_fp8 ? "fp8 e4m3" : "bf16", 2 * impl->kv_dim * impl->kv_elem_bytes,
                    2 * kv_bytes / 1e9);
    return rc;
}

static tm_rc create(const tm_model *m, const tm_engine_opts *opts, const tm_engine_cuda_tp *tp,
                    int random, uint64_t seed, tm_cuda_wfmt fmt, tm_engine **out, tm_err *err) {
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
    if (tp_size > 1 &&
        (tm_rdzv_rank(tp->rdzv) != opts->tp_rank || tm_rdzv_world(tp->rdzv) != tp_size))
        return TM_ERR(err, TM_E_INVAL, "cuda engine: rank %u of %u, rendezvous says %u of %u",
                      opts->tp_rank, tp_size, tm_rdzv_rank(tp->rdzv), tm_rdzv_world(tp->rdzv));
    if (opts->kv_dtype != TM_KV_DTYPE_AUTO && opts->kv_dtype != TM_KV_DTYPE_FP8)
        return TM_ERR(err, TM_E_INVAL, "cuda engine: kv_cache_dtype %s not supported (auto, fp8)",
                      tm_kv_dtype_name(opts->kv_dtype));
    if (opts->kv_dtype == TM_KV_DTYPE_FP8 && tp_size > 1)
        return TM_ERR(err, TM_E_INVAL,
                      "cuda engine: kv_cache_dtype fp8 with tp_size %u is not supported yet",
                      tp_size);
    const tm_cuda_arch *arch = pick_arch(m->cfg.arch);
    if (!arch)
        return TM_ERR(err, TM_E_INVAL,
                      "cuda engine: architecture %s not supported (the Llama family: llama, "
                      "qwen2, mistral)",
                      tm_model_arch_name(m));
    tm_rc rc = arch->check_cfg(&m->cfg, err);
    if (!rc && !random && tp_size == 1)
        rc = arch->check_weights(m, err);
    if (rc)
        return rc;
    tm_model_cfg shard_c = m->cfg;
    uint32_t vocab0 = 0, v_per = m->cfg.n_vocab;
    if (tp_size > 1) {
        rc = arch->shard_cfg(&m->cfg, opts->tp_rank, tp_size, &shard_c, &vocab0, &v_per, err);
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
        return TM_ERR(err, TM_E_CUDA, "cuda engine: no GPU found (cudaGetDeviceCount: %s, %s)",
                      cudaGetErrorString(ce), cudaGetErrorName(ce));
    if (n_dev == 0)
        return TM_ERR(err, TM_E_CUDA, "cuda engine: no GPU found");
    const int device = tp ? tp->device : 0;
    if (device < 0 || device >= n_dev)
        return TM_ERR(err, TM_E_CUDA, "cuda engine: device %d asked for, %d visible", device,
                      n_dev);

    tm_cuda_engine *impl = tm_calloc(1, sizeof(*impl));
    if (!impl)
        return TM_ERR(err, TM_E_NOMEM, "cuda engine header");
    const tm_model_cfg *c = &shard_c;
    impl->eng.ops = &cuda_ops;
    impl->eng.model = m;
    impl->eng.opts = *opts;
    impl->eng.impl = impl;
    impl->arch = arch;
    impl->cfg = *c;
    impl->use_graphs = !arch->eager;
    impl->random = random;
    impl->random_fmt = (uint8_t)fmt;
    impl->device = device;
    impl->tp_rank = tp_size > 1 ? opts->tp_rank : 0;
    impl->tp_size = tp_size;
    impl->vocab_full = m->cfg.n_vocab;
    impl->vocab0 = vocab0;
    impl->v_per = v_per;
    impl->v_stride = tp_size > 1 ? v_per : c->n_vocab;
    impl->kv_dim = arch->kv_dim(c);
    impl->kv_fp8 = opts->kv_dtype == TM_KV_DTYPE_FP8;
    impl->kv_elem_bytes = impl->kv_fp8 ? 1 : 2;
    const uint32_t S = opts->max_seqs, T = opts->max_batched_tokens;
    // Block-table entries per step: each sequence covers at most min(pool, n_ctx) positions.
    const uint64_t seq_pos = TM_MIN(max_pos, (uint64_t)TM_MAX(c->n_ctx, 1u));
    const uint64_t bt_cap = (uint64_t)S * TM_CEIL_DIV(seq_pos, opts->block_size);
    impl->bt_cap = (uint32_t)TM_MIN(bt_cap, (uint64_t)UINT32_MAX / 2);
    // Prefill attention tiles where the architecture has them (TM_CUDA_FA=0: never).
    const char *fa_env = getenv("TM_CUDA_FA");
    const uint32_t max_tiles = tm_k_attn_prefill_max_tiles(T, S);
    impl->use_fa = arch->prefill_tiles(c) && max_tiles <= 65535 &&
                   !(fa_env && strcmp(fa_env, "0") == 0);
    impl->meta_cap = 4 * (size_t)T + S + (size_t)tm_engine_max_rows(opts) + impl->bt_cap +
                     (impl->use_fa ? 4 * (size_t)max_tiles : 0);

    rc = arch->init(impl, err);
    if (rc)
        goto fail;
    impl->graphs = tm_calloc((size_t)S + 1, sizeof(cudaGraphExec_t));
    impl->chunks_h = tm_calloc(S, sizeof(tm_k_attn_prefill_chunk));
    if (!impl->graphs || !impl->chunks_h) {
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
        const tm_cuda_drv_cfg dc = {.rdzv = tp->rdzv,
                                    .nccl_id = tp->nccl_id,
                                    .timeout_ms = tp->timeout_ms,
                                    .transport = tp->host_comm ? TM_CUDA_COMM_HOST
                                                               : TM_CUDA_COMM_NCCL};
        rc = tm_cuda_drv_create(&dc, impl->tp_rank, tp_size, &impl->drv, err);
        if (rc)
            goto fail;
        impl->comm = tm_cuda_drv_comm(impl->drv);
        // the host transport synchronizes inside its collectives: nothing to capture
        impl->use_graphs = tm_cuda_comm_graphable(impl->comm);
        const int v = tp->host_comm ? 0 : tm_nccl_version(), hv = tm_nccl_header_version();
        TM_LOG_INFO("cuda",
                    "tp rank %u of %u on device %d: %s %d.%d.%d (built with %d.%d.%d), "
                    "%u heads, %u KV heads, n_ff %u, vocabulary rows [%u, %u)",
                    impl->tp_rank, tp_size, device,
                    tp->host_comm ? "host shared-memory all-reduce, NCCL unused" : "NCCL",
                    v / 10000, v / 100 % 100, v % 100, hv / 10000, hv / 100 % 100, hv % 100,
                    c->n_head, c->n_kv_head, c->n_ff, vocab0, vocab0 + c->n_vocab);
    }

    int n_sm = 0;
    rc = TM_CUDA_CHECK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, device), err);
    if (rc)
        goto fail;
    const char *prof_env = getenv("TM_CUDA_PROFILE");
    if (prof_env && strcmp(prof_env, "1") == 0) {
        for (uint32_t i = 0; i < TM_CUDA_PROF_EVENTS && !rc; i++)
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
    impl->sk_part_floats = impl->sk_max_tok ? arch->skinny_floats(impl, impl->sk_max_tok) : 0;
    impl->ablate = parse_ablate(getenv("TM_CUDA_ABLATE"));
    if (impl->ablate)
        TM_LOG_WARN("cuda",
                    "TM_CUDA_ABLATE=%s: ops skipped, outputs are meaningless "
                    "(benchmarks only)",
                    getenv("TM_CUDA_ABLATE"));

    // Size the arenas (carving with no base), allocate them, then carve them for real.
    tm_cuda_carver cw = {0};
    arch->carve_weights(impl, &cw);
    tm_cuda_carver ca = {0};
    carve_acts(impl, &ca);
    const size_t R = tm_engine_max_rows(opts); // logits rows per step
    const size_t logits_h_n = (size_t)tp_size * R * impl->v_stride;
    rc = TM_CUDA_CHECK(cudaMalloc(&impl->w_arena, cw.off), err);
    if (!rc)
        rc = TM_CUDA_CHECK(cudaMalloc(&impl->a_arena, ca.off), err);
    if (!rc)
        rc = TM_CUDA_CHECK(
            cudaMallocHost((void **)&impl->plan_h, sizeof(tm_cuda_plan) + impl->meta_cap * 4), err);
    if (!rc)
        rc = TM_CUDA_CHECK(cudaMallocHost((void **)&impl->logits_h, logits_h_n * sizeof(float)),
                           err);
    if (!rc)
        rc = TM_CUDA_CHECK(cudaMallocHost((void **)&impl->ids_h, R * 4), err);
    if (rc) {
        tm_err_wrap(err, "cuda engine: weights %.2f GB, activations %.2f GB: ", cw.off / 1e9,
                    ca.off / 1e9);
        goto fail;
    }
    impl->meta_h = (uint32_t *)(impl->plan_h + 1);
    cw = (tm_cuda_carver){.base = impl->w_arena};
    arch->carve_weights(impl, &cw);
    ca = (tm_cuda_carver){.base = impl->a_arena};
    carve_acts(impl, &ca);
    // before the KV pool is sized; TM_CUDA_HOST_SAMPLE=1: none (sampling on the host, tests)
    rc = impl->tp_size > 1 || getenv("TM_CUDA_HOST_SAMPLE") ? TM_OK : samp_alloc(impl, err);
    if (!rc)
        rc = alloc_kv(impl, util, err);
    if (!rc && impl->drv)
        rc = tm_cuda_drv_ar_setup(impl->drv, impl->cfg.n_embd, impl->gemm_ws, TM_CUDA_GEMM_WS_BYTES,
                                  impl->stream, err);
    if (rc)
        goto fail;

    rc = blas_check(cublasCreate(&impl->blas), "cublasCreate", err);
    if (!rc)
        rc = blas_check(cublasSetStream(impl->blas, impl->stream), "cublasSetStream", err);
    if (!rc)
        rc = blas_check(cublasSetWorkspace(impl->blas, impl->gemm_ws, TM_CUDA_GEMM_WS_BYTES),
                        "cublasSetWorkspace", err);
    if (rc)
        goto fail;

    const double t_w = tm_now_ms();
    if (random)
        rc = arch->fill_random(impl, seed * 131 + impl->tp_rank, err);
    else
        rc = arch->upload(impl, m, err);
    if (rc)
        goto fail;
    TM_LOG_INFO("cuda", "weights %s in %.1f s (%.2f GB on the device)",
                random ? "filled at random" : "uploaded", (tm_now_ms() - t_w) / 1e3,
                (double)cw.off / 1e9);
    *out = &impl->eng;
    return TM_OK;
fail:
    fail_engine(impl); // abort, not destroy: other ranks may be gone
    cuda_destroy(&impl->eng);
    return err->rc;
}

tm_rc tm_engine_cuda_create(const tm_model *m, const tm_engine_opts *opts, tm_engine **out,
                            tm_err *err) {
    return create(m, opts, NULL, 0, 0, TM_CUDA_W_BF16, out, err);
}

tm_rc tm_engine_cuda_create_random(const tm_model *m, const tm_engine_opts *opts, uint64_t seed,
                                   tm_engine **out, tm_err *err) {
    return create(m, opts, NULL, 1, seed, TM_CUDA_W_BF16, out, err);
}

tm_rc tm_engine_cuda_create_random_fmt(const tm_model *m, const tm_engine_opts *opts, uint64_t seed,
                                       tm_cuda_wfmt fmt, tm_engine **out, tm_err *err) {
    if ((unsigned)fmt > TM_CUDA_W_FP8_CHANNEL)
        return TM_ERR(err, TM_E_INVAL, "cuda engine: weight format %d", (int)fmt);
    return create(m, opts, NULL, 1, seed, fmt, out, err);
}

tm_rc tm_engine_cuda_tp_create(const tm_model *m, const tm_engine_opts *opts,
                               const tm_engine_cuda_tp *tp, tm_engine **out, tm_err *err) {
    return create(m, opts, tp, tp->random, tp->seed, TM_CUDA_W_BF16, out, err);
}

bool tm_engine_cuda_built(void) { return true; }

int tm_engine_cuda_n_devices(void) {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

static void cuda_destroy(tm_engine *eng) {
    if (!eng)
        return;
    tm_cuda_engine *impl = eng->impl;
    cudaSetDevice(impl->device);
    if (impl->prof) {
        double total = 0.0;
        for (uint32_t k = 0; k < TM_CUDA_PROF_KINDS && impl->prof_kind[k]; k++)
            total += impl->prof_ms[k];
        fprintf(stderr, "TM_CUDA_PROFILE (tp rank %u, eager steps): %.3f ms of GPU time\n",
                impl->tp_rank, total);
        for (uint32_t k = 0; k < TM_CUDA_PROF_KINDS && impl->prof_kind[k]; k++)
            fprintf(stderr, "  %-28s %10.3f ms %5.1f%% %8llu calls %9.2f us/call\n",
                    impl->prof_kind[k], impl->prof_ms[k], 100.0 * impl->prof_ms[k] / total,
                    (unsigned long long)impl->prof_calls[k],
                    1e3 * impl->prof_ms[k] / (double)TM_MAX(impl->prof_calls[k], 1ull));
        for (uint32_t i = 0; i < TM_CUDA_PROF_EVENTS; i++)
            cudaEventDestroy(impl->prof_ev[i]);
    }
    // A dead TP engine whose stream or watchdog does not come back: cudaFree and
    // cudaStreamSynchronize would wait for kernels that never finish; the process is about to
    // exit after a failed rank, so everything is left to it (the driver has said so).
    if (impl->drv && tm_cuda_drv_stop(impl->drv, impl->dead, impl->stream))
        return;
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
    samp_free(impl->samp);
    if (impl->stream)
        cudaStreamDestroy(impl->stream);
    tm_cuda_drv_destroy(impl->drv);
    if (impl->arch)
        impl->arch->fini(impl);
    tm_free(impl);
}
