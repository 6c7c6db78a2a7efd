/* runner/engine/cuda/engine_cuda_int.h - private to runner/engine/cuda/: the CUDA engine's runtime
 * (engine_cuda.c) as the architecture files (arch.h, e.g. llama.c) and the TP driver
 * (tp_driver_int.h) see it: the engine struct, the packed step, the arena carver, the projection
 * launcher (cuBLAS or the skinny split-K kernel) and the one launch wrapper of the forward pass,
 * which keeps benchmark ablation (TM_CUDA_ABLATE) and profiling marks (TM_CUDA_PROFILE) out of
 * the architectures' main line.
 *
 * Invariants: every device buffer is allocated at create; a step's metadata layout depends only
 * on (T, S), so a decode step of T sequences always uses the same device addresses and its CUDA
 * graph stays valid. Threading: one thread drives an engine. */
#ifndef TM_RUNNER_ENGINE_CUDA_ENGINE_CUDA_INT_H
#define TM_RUNNER_ENGINE_CUDA_ENGINE_CUDA_INT_H

#include <stddef.h>
#include <stdint.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "base/err.h"
#include "kernels/attn_prefill.h"
#include "runner/engine/cuda/arch.h"
#include "runner/engine/cuda/tp_driver_int.h"
#include "runner/engine/engine.h"
#include "runner/model/model.h"

#define TM_CUDA_ALIGN_BYTES 256                  /* every carved piece starts on this */
#define TM_CUDA_GEMM_WS_BYTES ((size_t)32 << 20) /* cuBLAS workspace (needed for graph capture) */
#define TM_CUDA_PROF_EVENTS 1024                 /* TM_CUDA_PROFILE: events per step */
#define TM_CUDA_PROF_KINDS 24

/* TM_CUDA_ABLATE=op,op,...: the ops named are planned but not launched, so that a benchmark can
 * measure what each kind of op costs inside the decode graph (no profiler sees into a graph, and
 * eager timings are dominated by launch gaps). The outputs are then meaningless: for benchmarks
 * only, and the engine says so at create. Names: engine_cuda.c. TM_CUDA_ABL_NEVER: an op that is
 * always launched. */
enum {
    TM_CUDA_ABL_NORM,
    TM_CUDA_ABL_QKV,
    TM_CUDA_ABL_ROPE,
    TM_CUDA_ABL_ATTN,
    TM_CUDA_ABL_O,
    TM_CUDA_ABL_AR,
    TM_CUDA_ABL_GU,
    TM_CUDA_ABL_SILU,
    TM_CUDA_ABL_DOWN,
    TM_CUDA_ABL_LM,
    TM_CUDA_ABL_N,
    TM_CUDA_ABL_NEVER = TM_CUDA_ABL_N,
};

/* Carves aligned pieces out of one allocation; with base NULL it only counts bytes (off). */
struct tm_cuda_carver {
    char *base;
    size_t off;
};

static inline void *tm_cuda_carve(tm_cuda_carver *cv, size_t bytes) {
    size_t at = TM_CEIL_DIV(cv->off, (size_t)TM_CUDA_ALIGN_BYTES) * TM_CUDA_ALIGN_BYTES;
    cv->off = at + bytes;
    return cv->base ? cv->base + at : NULL;
}

/* One packed step as an architecture's forward pass reads it: counts, and the device metadata
 * arrays (uint32 each, inside the runtime's metadata buffer). */
struct tm_cuda_step {
    uint32_t n_tok;  /* T: tokens of the step, sequences stacked */
    uint32_t n_seq;  /* S */
    uint32_t n_want; /* rows wanting logits */
    uint32_t n_tile; /* prefill attention tiles; 0: the step uses attn_paged */
    uint32_t graph;  /* arch->own_graphs: a pure decode (n_tok == n_seq == n_want) with graphs on */
    const uint32_t *tokens;              /* [T] token ids */
    const uint32_t *pos;                 /* [T] positions */
    const uint32_t *slot;                /* [T] KV slots: block * block_size + offset */
    const uint32_t *tok_seq;             /* [T] token -> sequence */
    const uint32_t *seq_bt;              /* [S] first block-table entry of each sequence */
    const uint32_t *want_row;            /* [n_want] token rows whose logits are wanted */
    const uint32_t *block_tables;        /* the sequences' block tables, concatenated */
    const tm_k_attn_prefill_tile *tiles; /* [n_tile] */
};

/* A projection's result as the consumer reads it: n partial products (split-K, summed in
 * order by the consumer) stride floats apart, each [T][n_out] fp32; n == 1: p is the result. */
typedef struct tm_cuda_proj {
    float *p;
    uint32_t n;
    size_t stride;
} tm_cuda_proj;

struct tm_cuda_engine {
    tm_engine eng;            /* eng.impl points back here */
    const tm_cuda_arch *arch; /* the model's architecture (arch.h) */
    void *arch_state;         /* owned by arch (init / fini) */
    tm_model_cfg cfg;         /* this rank's shard with TP, else the model's */
    cudaStream_t stream;      /* owned */
    cublasHandle_t blas;      /* owned, bound to stream */
    int dead;                 /* a CUDA error happened during forward */
    int random;               /* weights from arch->fill_random (only eng.model->cfg is read) */
    uint8_t random_fmt;       /* with random: tm_cuda_wfmt of the linears (engine_cuda.h) */
    int use_graphs;
    uint32_t kv_dim;  /* arch->kv_dim: bf16 per token and layer in each of K and V */
    uint32_t max_pos; /* n_kv_block * block_size */
    uint32_t bt_cap;  /* block table entries per step */
    void *w_arena;    /* owned: the weights, carved by arch->carve_weights */
    /* KV cache: [layer][block][block_size][kv_dim] bf16 each, or e4m3 bytes with kv_fp8 */
    uint16_t *k_cache, *v_cache; /* owned */
    size_t layer_kv_elems;
    size_t layer_kv_bytes;  /* layer_kv_elems * kv_elem_bytes: one layer of K (or V) */
    uint32_t kv_fp8;        /* opts.kv_dtype fp8: e4m3 entries (kernels/kv_fp8.cuh) */
    uint32_t kv_elem_bytes; /* 2 (bf16) or 1 (fp8) */
    /* activations: one allocation, carved (arch->carve_acts, then the runtime's below);
     * T = max_batched_tokens, S = max_seqs */
    void *a_arena;  /* owned */
    float *logits;  /* [S][v_stride] */
    float *sk_part; /* split-K partials of the skinny projections (decode steps) */
    size_t sk_part_floats;
    uint32_t sk_max_tok; /* steps of at most this many tokens use gemm_skinny; 0: none */
    uint32_t n_sm;       /* multiprocessors of the device (split-K planning) */
    int use_fa;          /* prefill steps carry attention tiles (arch->prefill_tiles) */
    uint32_t ablate;     /* TM_CUDA_ABLATE: ops not launched (benchmarks only), bits */
    /* TM_CUDA_PROFILE=1: GPU time per op kind of eager steps (events between launches; decode
     * graphs are not split up, so run with graphs off), printed at destroy. */
    int prof;
    uint32_t prof_n;                          /* events recorded in this step */
    cudaEvent_t prof_ev[TM_CUDA_PROF_EVENTS]; /* [0]: step start */
    const char *prof_what[TM_CUDA_PROF_EVENTS];
    const char *prof_kind[TM_CUDA_PROF_KINDS];
    double prof_ms[TM_CUDA_PROF_KINDS];
    uint64_t prof_calls[TM_CUDA_PROF_KINDS];
    tm_k_attn_prefill_chunk *chunks_h; /* host [S] scratch of pack_batch, owned */
    uint32_t *ids;                     /* [S] */
    void *gemm_ws;                     /* [TM_CUDA_GEMM_WS_BYTES] */
    uint32_t *meta_d;                  /* [meta_cap] step metadata */
    size_t meta_cap;
    /* pinned host staging, owned */
    tm_cuda_plan *plan_h;    /* host: a plan header followed by meta_h */
    uint32_t *meta_h;        /* host [meta_cap], inside plan_h's allocation */
    float *logits_h;         /* host [S][n_vocab]; with TP [tp][S][v_per] gathered slices */
    uint32_t *ids_h;         /* host [S] */
    cudaGraphExec_t *graphs; /* host array [S + 1]: decode steps of T sequences, or NULL */
    int device;              /* CUDA device ordinal */
    uint32_t v_stride;       /* logits rows allocated: n_vocab, or v_per with TP; the rows are
                                written and read compact (row stride cfg.n_vocab, the rank's) */
    /* tensor parallel (tp_size > 1); cfg above is this rank's shard */
    uint32_t tp_rank, tp_size;
    uint32_t vocab_full;       /* the model's n_vocab */
    uint32_t vocab0, v_per;    /* this rank's first vocabulary row; rows per rank (last: fewer) */
    tm_cuda_drv *drv;          /* owned; NULL without TP (tp_driver_int.h) */
    tm_cuda_comm *comm;        /* drv's communicator; NULL without TP */
    float *logits_all;         /* [tp][S][v_per] gathered slices (TP) */
    uint32_t *cand, *cand_all; /* [S][2] this rank's argmax candidates, [tp][S][2] gathered */
    struct tm_cuda_samp *samp; /* owned device sampler state (engine_cuda.c); NULL with TP */
};

/* y[n_tok][n_out] (fp32 with y_f32, else bf16; row stride ldy) = x[n_tok][n_in] (bf16, row stride
 * ldx) @ w[n_out][n_in]^T (bf16) + beta * y, by cuBLAS on impl's stream (fp32 accumulation).
 * TM_E_CUDA "cuda engine: <what>: <cuBLAS status>". n_tok 0 launches nothing. */
tm_rc tm_cuda_gemm(tm_cuda_engine *impl, const char *what, const uint16_t *w, const uint16_t *x,
                   uint32_t ldx, void *y, int y_f32, uint32_t ldy, uint32_t n_tok, uint32_t n_in,
                   uint32_t n_out, float beta, tm_err *err);

/* y = x[T][n_in] @ w[n_out][n_in]^T (bf16 in, fp32 out). Steps of at most sk_max_tok tokens
 * (decode) use the tensor-core skinny kernel: split-K partials in sk_part (or straight into dst
 * when the plan has one split and beta is 0), which the consumer sums; beta is then NOT applied
 * (a residual consumer adds the partials into x itself). Larger steps use cuBLAS into dst with
 * beta. *out says where the result is (also when op kind abl is ablated: then nothing is
 * launched). On success marks the end of kind what (NULL: no mark). */
tm_rc tm_cuda_project(tm_cuda_engine *impl, int abl, const char *what, const uint16_t *w,
                      const uint16_t *x, uint32_t T, uint32_t n_in, uint32_t n_out, float *dst,
                      float beta, tm_cuda_proj *out, tm_err *err);

/* TM_CUDA_PROFILE: record the end of an op of kind what (a string literal) on the stream (not
 * while capturing a graph). Call it through tm_cuda_mark. */
void tm_cuda_prof_mark(tm_cuda_engine *impl, const char *what);

/* The profiling mark: nothing but a flag test unless TM_CUDA_PROFILE=1. */
static inline void tm_cuda_mark(tm_cuda_engine *impl, const char *what) {
    if (impl->prof)
        tm_cuda_prof_mark(impl, what);
}

/* 1 when ops of kind abl are not launched (TM_CUDA_ABLATE). */
static inline int tm_cuda_ablated(const tm_cuda_engine *impl, int abl) {
    return (impl->ablate >> abl) & 1u;
}

/* The end of one op of a step: on success, the profiling mark of kind what; returns rc. */
static inline tm_rc tm_cuda_op_end(tm_cuda_engine *impl, const char *what, tm_rc rc) {
    if (!rc && what)
        tm_cuda_mark(impl, what);
    return rc;
}

/* The forward pass's launch wrapper, one per op:
 *     rc = TM_CUDA_OP(impl, TM_CUDA_ABL_ROPE, "rope_kv", tm_k_rope_kv_bf16(&ra, s, err));
 * evaluates launch (a tm_rc expression) unless op kind abl is ablated, then marks the end of
 * kind what. */
#define TM_CUDA_OP(impl, abl, what, launch)                                                        \
    tm_cuda_op_end((impl), (what), tm_cuda_ablated((impl), (abl)) ? TM_OK : (launch))

#endif /* TM_RUNNER_ENGINE_CUDA_ENGINE_CUDA_INT_H */
