/* runner/engine/cuda/tp_driver_int.h - private to runner/engine/cuda/: CUDA tensor parallel as a
 * driver around the per-rank engines (tp_driver.c). One process per GPU; each holds a rank
 * engine (engine_cuda.c) that runs a given step plan on its shard with the communicator it was
 * given. The driver owns what makes the ranks one engine:
 *   - the communicator: the NCCL handle and the one-shot peer-memory all-reduce state;
 *   - plan transport: rank 0 sends each step's plan (tm_cuda_plan followed by its metadata) and
 *     each KV copy to the other ranks over the rendezvous connection before it launches its own
 *     work; the other ranks receive and run them in tm_cuda_drv_serve until rank 0 says stop;
 *   - failure detection: a watchdog thread per rank checks, while a step is in flight, the
 *     control connections (a peer that exited or reported a failure), NCCL's asynchronous errors
 *     and the step's age (the timeout); on a failure it aborts the communicator (from its own
 *     thread, since NCCL host calls can block on a dead peer) and the step fails with a message
 *     naming the peer. tm_cuda_drv_sync waits for the stream in a way such an abort can end.
 * The wire format is the bytes of tm_cuda_plan, then n_meta uint32 (rendezvous message type
 * TM_RDZV_MSG_USER); every rank runs the same build.
 *
 * Threading: the engine's thread calls everything here; the watchdog thread only reads the
 * connections and the step state under the driver's mutex, and may abort the communicator. */
#ifndef TM_RUNNER_ENGINE_CUDA_TP_DRIVER_INT_H
#define TM_RUNNER_ENGINE_CUDA_TP_DRIVER_INT_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "base/err.h"
#include "kernels/allreduce.h"
#include "runner/tp/rendezvous.h"
#include "runner/tp/tp_host.h"
#include "runner/tp/tp_nccl.h"

/* A step plan: everything a rank needs to run one step (or a KV copy, or to stop) besides the
 * packed metadata that follows it (n_meta uint32, the engine's meta layout of (T, S), ending with
 * n_tile prefill tiles of 4 uint32). Rank 0 builds it for itself too. */
enum { TM_CUDA_PLAN_STEP = 1, TM_CUDA_PLAN_KV_COPY, TM_CUDA_PLAN_STOP };
typedef struct tm_cuda_plan {
    uint32_t op;           /* TM_CUDA_PLAN_* */
    uint32_t T, S, n_want; /* step: tokens, sequences, rows wanting logits */
    uint32_t graph;        /* 1: a pure decode step (CUDA graph of T sequences) */
    uint32_t greedy;       /* 1: ids only (candidates), 0: full logits to rank 0 */
    uint32_t vocab_limit;  /* greedy: only ids below it compete, 1 .. the model's n_vocab */
    uint32_t n_meta;       /* uint32 that follow */
    uint32_t kv_src, kv_dst, kv_n_tok; /* TM_CUDA_PLAN_KV_COPY */
    uint32_t n_tile; /* prefill attention tiles (4 uint32 each) ending the metadata;
                        0: the step uses attn_paged */
} tm_cuda_plan;

/* The communicator a rank engine is given (owned by the driver, valid until
 * tm_cuda_drv_destroy): what its forward pass and logits head launch collectives on. */
typedef struct tm_cuda_drv tm_cuda_drv; /* opaque: one rank's driver */

/* The all-reduce transport of a communicator (tm_cuda_drv_cfg.transport). */
typedef enum tm_cuda_comm_kind {
    TM_CUDA_COMM_NCCL = 0, /* NCCL (one process per GPU), peer memory for decode-sized steps */
    TM_CUDA_COMM_HOST,     /* runner/tp/tp_host.h over host shared memory, through pinned
                              staging: ranks may share one GPU; a correctness mode (each
                              collective synchronizes the stream, so no CUDA graphs), not fast */
} tm_cuda_comm_kind;

typedef struct tm_cuda_comm {
    tm_cuda_comm_kind kind;
    tm_nccl *nccl;                     /* the NCCL communicator (TM_CUDA_COMM_NCCL) */
    tm_tp_host *host;                  /* the host communicator (TM_CUDA_COMM_HOST) */
    void *stage;                       /* host: pinned, (world + 1) * TM_TP_HOST_CHUNK_BYTES */
    tm_cuda_drv *drv;                  /* the driver that owns this (for its abortable sync) */
    int ar_on;                         /* 1: steps of at most TM_AR_MAX_ROWS tokens all-reduce
                                          over peer memory (kernels/allreduce.h); NCCL otherwise */
    uint32_t ar_d;                     /* row length the regions were sized for */
    void *ar_regions[TM_AR_MAX_RANKS]; /* [rank]: own (cudaMalloc); others: IPC-opened peers' */
} tm_cuda_comm;

/* What the driver needs to join the ranks (the engine copies it from its tm_engine_cuda_tp). */
typedef struct tm_cuda_drv_cfg {
    tm_rdzv *rdzv;               /* borrowed, must outlive the driver */
    const uint8_t *nccl_id;      /* TM_NCCL_ID_BYTES, the same on every rank; read during create */
    uint32_t timeout_ms;         /* a step running longer fails; 0: 300 s */
    tm_cuda_comm_kind transport; /* NCCL, or host memory (ranks sharing one GPU) */
} tm_cuda_drv_cfg;

/* The rank engine as the serve loop drives it: a table the engine (engine_cuda.c) passes to
 * tm_cuda_drv_serve with itself as ctx, so the driver calls the engine only through it and the
 * dependency goes one way (engine -> driver). */
typedef struct tm_cuda_rank_ops {
    int (*dead)(const void *ctx); /* 1 after an earlier failure */
    /* The pinned receive buffer for a plan and its metadata; *cap: its bytes. */
    tm_cuda_plan *(*plan_buf)(void *ctx, size_t *cap);
    /* 1 when step plan h, received as len bytes, fits the engine's buffers and limits (rank 0
     * validated the batch; this checks what could corrupt memory here). */
    int (*plan_fits)(const void *ctx, const tm_cuda_plan *h, size_t len);
    /* Run step plan h (its metadata in the plan buffer) to the end, stream synchronized. */
    tm_rc (*run_plan)(void *ctx, const tm_cuda_plan *h, tm_err *err);
    /* The engine's kv_copy op (range checks included). */
    tm_rc (*kv_copy)(void *ctx, uint32_t src, uint32_t dst, uint32_t n_tok, tm_err *err);
    void (*fail)(void *ctx); /* mark dead, abort the communicator */
} tm_cuda_rank_ops;

/* ---- collectives on the rank's stream, over the communicator's transport ---- */

/* In-place sum of the device buffer buf[0..n) across all ranks, enqueued on stream (NCCL), or
 * (host transport) copied through the pinned staging in chunks, the stream synchronized around
 * each (abortable like tm_cuda_drv_sync), summed in rank order, copied back. Errors: TM_E_NCCL,
 * TM_E_IO (host: a rank failed or the barrier timed out), TM_E_CUDA. */
tm_rc tm_cuda_comm_allreduce_sum(tm_cuda_comm *cm, void *buf, size_t n, tm_nccl_dtype dt,
                                 cudaStream_t s, tm_err *err);
/* recv[r * n + i] = send_of_rank_r[i] for i < n (device buffers), like the all-reduce. */
tm_rc tm_cuda_comm_allgather(tm_cuda_comm *cm, const void *send, void *recv, size_t n,
                             tm_nccl_dtype dt, cudaStream_t s, tm_err *err);
/* 1 when the transport's collectives may be captured into a CUDA graph (NCCL; not host). */
int tm_cuda_comm_graphable(const tm_cuda_comm *cm);

/* ---- the driver (tp_driver.c) ---- */

/* Join the communicator of cfg->nccl_id as rank of world on the current CUDA device (blocks until
 * every rank has joined, at most the timeout: cfg->timeout_ms, 0 meaning 300 s) over
 * cfg->transport and start the watchdog. cfg->rdzv is borrowed and must outlive the driver. On
 * success *out owns the driver. Errors: TM_E_NCCL or TM_E_IO (host transport) ("tp rank R of W:
 * ..."), TM_E_INTERNAL (no watchdog thread), TM_E_NOMEM. */
tm_rc tm_cuda_drv_create(const tm_cuda_drv_cfg *cfg, uint32_t rank, uint32_t world,
                         tm_cuda_drv **out, tm_err *err);
/* Stop the watchdog and, unless the step failed (dead 0), tell the other ranks to stop (rank 0).
 * After a failure (dead 1) abort the communicator and wait up to 10 s for stream s to drain.
 * Returns 1 when the watchdog or the stream did not come back: the caller must then leak the
 * driver and every device buffer (process exit frees them); 0: call tm_cuda_drv_destroy once
 * nothing uses the communicator. */
int tm_cuda_drv_stop(tm_cuda_drv *drv, int dead, cudaStream_t s);
/* Free the all-reduce regions and the communicator. NULL is a no-op. */
void tm_cuda_drv_destroy(tm_cuda_drv *drv);
/* The communicator; valid until tm_cuda_drv_destroy. */
tm_cuda_comm *tm_cuda_drv_comm(tm_cuda_drv *drv);

/* Create-time agreements, through scratch (device, scratch_bytes, idle) on stream s, guarded by
 * the watchdog like a step. agree_min: *n becomes the smallest of every rank's *n. ar_setup: set
 * up the peer-memory all-reduce for rows of n_embd floats when every rank is on this host and can
 * map every other rank's region (CUDA IPC; TM_TP_CUSTOM_AR=0 on any rank turns it off); the
 * decision is the same on every rank. Errors only when the exchanges fail. */
tm_rc tm_cuda_drv_agree_min(tm_cuda_drv *drv, uint32_t *n, void *scratch, size_t scratch_bytes,
                            cudaStream_t s, tm_err *err);
tm_rc tm_cuda_drv_ar_setup(tm_cuda_drv *drv, uint32_t n_embd, void *scratch, size_t scratch_bytes,
                           cudaStream_t s, tm_err *err);

/* Rank 0: send a step plan h with its h->n_meta uint32 of metadata, or a KV copy, to the other
 * ranks. TM_E_IO when a rank is gone. */
tm_rc tm_cuda_drv_send_step(tm_cuda_drv *drv, const tm_cuda_plan *h, const uint32_t *meta,
                            tm_err *err);
tm_rc tm_cuda_drv_send_kv_copy(tm_cuda_drv *drv, uint32_t src, uint32_t dst, uint32_t n_tok,
                               tm_err *err);

/* A step on this rank: begin before its first launch; sync waits for stream s (polling, so that
 * a step the watchdog aborted returns the watchdog's error instead of waiting for kernels that
 * never finish); end after it (with the step's rc: a failure's message becomes the watchdog's
 * reason when it has one, a dead peer explaining an NCCL failure best). */
void tm_cuda_drv_step_begin(tm_cuda_drv *drv);
tm_rc tm_cuda_drv_sync(tm_cuda_drv *drv, cudaStream_t s, tm_err *err);
void tm_cuda_drv_step_end(tm_cuda_drv *drv, tm_rc rc, tm_err *err);
/* After a failure: no later collective can be trusted; abort the communicator (once), so that
 * NCCL kernels waiting for a dead peer return. */
void tm_cuda_drv_abort(tm_cuda_drv *drv);

/* Ranks > 0: receive and run the plans rank 0 sends (steps, KV copies) on the rank engine (ops
 * with ctx) until it says stop (TM_OK). Errors: the step's error (reported to rank 0 first),
 * TM_E_PARSE for a malformed plan, TM_E_IO when rank 0 is gone or another rank failed; the engine
 * is dead afterwards. */
tm_rc tm_cuda_drv_serve(tm_cuda_drv *drv, const tm_cuda_rank_ops *ops, void *ctx, tm_err *err);

#endif /* TM_RUNNER_ENGINE_CUDA_TP_DRIVER_INT_H */
