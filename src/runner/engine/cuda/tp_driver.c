/* runner/engine/cuda/tp_driver.c - CUDA tensor parallel as a driver (tp_driver_int.h): the
 * communicator (NCCL and the one-shot peer-memory all-reduce), plan transport from rank 0 to the
 * other ranks, their serve loop, and failure detection (the watchdog thread, the abortable
 * stream wait), and the collectives over either transport: NCCL, or the host shared-memory
 * all-reduce of runner/tp/tp_host.h through pinned staging (ranks sharing one GPU, to check a
 * sharding: correct, not fast).
 *
 * The watchdog: every millisecond while a step is in flight, it checks the peers (one that exited
 * or reported a failure), NCCL's asynchronous errors and the step timeout; on a failure it aborts
 * the communicator, which also unblocks a host thread stuck inside an NCCL call, and keeps the
 * reason (naming the peer) for the step's error. The abort happens once, from whichever thread
 * sees a failure first. wd_mu guards the watchdog state; the rest is the engine thread's. */
#include "runner/engine/cuda/tp_driver_int.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/log.h"
#include "kernels/common.h"
#include "runner/tp/rendezvous.h"

#define PLAN_MSG TM_RDZV_MSG_USER /* rendezvous message type of a step plan */
#define SPIN_PLAN_MS 20.0         /* ranks > 0 poll this long for the next plan, then block */
#define DEAD_WAIT_MS 10000        /* destroy after a TP failure waits this long, then leaks */
#define TIMEOUT_MS_DEFAULT 300000

struct tm_cuda_drv {
    uint32_t rank, world;
    tm_rdzv *rdzv;       /* borrowed: plans out (rank 0) or in (the others) */
    uint32_t timeout_ms; /* a step running longer means a rank hung */
    tm_cuda_comm comm;   /* nccl and the all-reduce regions owned */
    /* the watchdog thread; wd_mu guards the wd_ fields below it */
    pthread_t wd;
    int wd_started;
    pthread_mutex_t wd_mu;
    int wd_busy; /* a step is in flight since wd_t0 */
    int wd_quit;
    int wd_aborted; /* the communicator was aborted (by either thread) */
    double wd_t0;
    tm_err wd_err; /* why the watchdog aborted */
};

/* ---- failure detection ---- */

/* Abort the communicator once, from whichever thread sees a failure first; why (may be NULL) is
 * kept for the step's error. */
static void abort_comm(tm_cuda_drv *drv, const tm_err *why) {
    pthread_mutex_lock(&drv->wd_mu);
    const int first = !drv->wd_aborted;
    drv->wd_aborted = 1;
    if (first && why)
        drv->wd_err = *why;
    pthread_mutex_unlock(&drv->wd_mu);
    if (first) {
        tm_nccl_abort(drv->comm.nccl);
        tm_tp_host_abort(drv->comm.host);
    }
}

/* The transport's asynchronous errors (NCCL) or a peer's abort (host). */
static tm_rc comm_check(tm_cuda_drv *drv, tm_err *err) {
    return drv->comm.kind == TM_CUDA_COMM_HOST ? tm_tp_host_check(drv->comm.host, err)
                                               : tm_nccl_check(drv->comm.nccl, err);
}

static int comm_aborted(tm_cuda_drv *drv, tm_err *why) {
    pthread_mutex_lock(&drv->wd_mu);
    const int a = drv->wd_aborted;
    if (a && why && drv->wd_err.rc)
        *why = drv->wd_err;
    pthread_mutex_unlock(&drv->wd_mu);
    return a;
}

static void set_busy(tm_cuda_drv *drv, int busy) {
    pthread_mutex_lock(&drv->wd_mu);
    drv->wd_busy = busy;
    drv->wd_t0 = tm_now_ms();
    pthread_mutex_unlock(&drv->wd_mu);
}

static void *watchdog_main(void *arg) {
    tm_cuda_drv *drv = arg;
    for (;;) {
        struct timespec ts = {0, 1000 * 1000};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&drv->wd_mu);
        const int quit = drv->wd_quit, busy = drv->wd_busy && !drv->wd_aborted;
        const double t0 = drv->wd_t0;
        pthread_mutex_unlock(&drv->wd_mu);
        if (quit)
            return NULL;
        if (!busy)
            continue;
        tm_err e = {0};
        tm_rc rc = tm_rdzv_check(drv->rdzv, &e);
        if (!rc)
            rc = comm_check(drv, &e);
        if (!rc && tm_now_ms() - t0 > drv->timeout_ms)
            rc = TM_ERR(&e, TM_E_IO,
                        "a step did not finish within %.0f s (a rank hung or the "
                        "network stalled)",
                        drv->timeout_ms / 1e3);
        if (rc) {
            tm_err_wrap(&e, "tp rank %u of %u", drv->rank, drv->world);
            abort_comm(drv, &e);
        }
    }
}

void tm_cuda_drv_step_begin(tm_cuda_drv *drv) { set_busy(drv, 1); }

tm_rc tm_cuda_drv_sync(tm_cuda_drv *drv, cudaStream_t s, tm_err *err) {
    for (uint64_t spin = 0;; spin++) {
        cudaError_t e = cudaStreamQuery(s);
        if (e == cudaSuccess)
            return TM_OK;
        if (e != cudaErrorNotReady)
            return TM_CUDA_CHECK(e, err);
        if (spin % 64 == 0 && comm_aborted(drv, err))
            return err->rc ? err->rc : TM_ERR(err, TM_E_NCCL, "tp: communicator aborted");
    }
}

void tm_cuda_drv_step_end(tm_cuda_drv *drv, tm_rc rc, tm_err *err) {
    set_busy(drv, 0);
    if (rc) // the watchdog's reason (a dead peer) explains an NCCL failure best
        comm_aborted(drv, err);
}

void tm_cuda_drv_abort(tm_cuda_drv *drv) { abort_comm(drv, NULL); }

/* ---- lifecycle ---- */

tm_rc tm_cuda_drv_create(const tm_cuda_drv_cfg *cfg, uint32_t rank, uint32_t world,
                         tm_cuda_drv **out, tm_err *err) {
    tm_cuda_drv *drv = tm_calloc(1, sizeof(*drv));
    if (!drv)
        return TM_ERR(err, TM_E_NOMEM, "tp driver");
    drv->rank = rank;
    drv->world = world;
    drv->rdzv = cfg->rdzv;
    drv->timeout_ms = cfg->timeout_ms ? cfg->timeout_ms : TIMEOUT_MS_DEFAULT;
    pthread_mutex_init(&drv->wd_mu, NULL);
    drv->comm.kind = cfg->transport;
    drv->comm.drv = drv;
    tm_rc rc;
    if (cfg->transport == TM_CUDA_COMM_HOST) {
        // the NCCL id's bytes name the shared segment (unique per job, already on every rank)
        rc = tm_tp_host_create(cfg->nccl_id, rank, world, drv->timeout_ms, &drv->comm.host, err);
        if (!rc)
            rc = TM_CUDA_CHECK(
                cudaMallocHost(&drv->comm.stage, (size_t)(world + 1) * TM_TP_HOST_CHUNK_BYTES),
                err);
    } else {
        rc = tm_nccl_create(cfg->nccl_id, rank, world, drv->timeout_ms, &drv->comm.nccl, err);
    }
    if (rc) {
        tm_err_wrap(err, "tp rank %u of %u", rank, world);
        goto fail;
    }
    if (pthread_create(&drv->wd, NULL, watchdog_main, drv) != 0) {
        TM_ERR(err, TM_E_INTERNAL, "cuda engine: cannot start the tp watchdog thread");
        goto fail;
    }
    drv->wd_started = 1;
    *out = drv;
    return TM_OK;
fail:
    abort_comm(drv, NULL); // as after any failure: the other ranks may be gone
    tm_cuda_drv_destroy(drv);
    return err->rc;
}

int tm_cuda_drv_stop(tm_cuda_drv *drv, int dead, cudaStream_t s) {
    int stuck = 0; // the watchdog or the stream does not come back: leak, do not hang
    if (drv->wd_started) {
        pthread_mutex_lock(&drv->wd_mu);
        drv->wd_quit = 1;
        pthread_mutex_unlock(&drv->wd_mu);
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += DEAD_WAIT_MS / 1000;
        if (pthread_timedjoin_np(drv->wd, NULL, &until) != 0) { // stuck in ncclCommAbort
            pthread_detach(drv->wd);
            stuck = 1;
        }
        drv->wd_started = 0;
    }
    if (dead) // peers may be gone: abort, so no NCCL kernel can wait on them
        abort_comm(drv, NULL);
    if (dead && s && !stuck) {
        const double t0 = tm_now_ms();
        while (cudaStreamQuery(s) == cudaErrorNotReady && !stuck)
            stuck = tm_now_ms() - t0 > DEAD_WAIT_MS;
    }
    if (stuck) {
        TM_LOG_WARN("cuda",
                    "tp rank %u: NCCL kernels still running %d s after the abort; "
                    "leaving the engine's GPU memory to process exit",
                    drv->rank, DEAD_WAIT_MS / 1000);
        return 1;
    }
    if (drv->rank == 0 && !dead) {
        tm_cuda_plan h = {.op = TM_CUDA_PLAN_STOP};
        tm_err e = {0};
        tm_rdzv_bcast(drv->rdzv, PLAN_MSG, &h, sizeof(h), NULL, 0, &e); // best effort
    }
    return 0;
}

void tm_cuda_drv_destroy(tm_cuda_drv *drv) {
    if (!drv)
        return;
    for (uint32_t r = 0; r < TM_AR_MAX_RANKS; r++) {
        if (!drv->comm.ar_regions[r])
            continue;
        if (r == drv->rank)
            cudaFree(drv->comm.ar_regions[r]);
        else
            cudaIpcCloseMemHandle(drv->comm.ar_regions[r]);
    }
    tm_nccl_destroy(drv->comm.nccl);
    tm_tp_host_destroy(drv->comm.host);
    if (drv->comm.stage)
        cudaFreeHost(drv->comm.stage);
    pthread_mutex_destroy(&drv->wd_mu);
    tm_free(drv);
}

tm_cuda_comm *tm_cuda_drv_comm(tm_cuda_drv *drv) { return &drv->comm; }

/* ---- create-time agreements ---- */

/* All-gather `bytes` (a multiple of 4) of every rank into all[rank * bytes], through scratch;
 * the watchdog guards it like a step. */
static tm_rc allgather_host(tm_cuda_drv *drv, const void *mine, size_t bytes, void *all,
                            void *scratch, size_t scratch_bytes, cudaStream_t s, tm_err *err) {
    uint8_t *d = scratch;
    TM_ASSERT(bytes % 4 == 0 && bytes * (drv->world + 1) <= scratch_bytes);
    set_busy(drv, 1);
    tm_rc rc = TM_CUDA_CHECK(cudaMemcpyAsync(d, mine, bytes, cudaMemcpyHostToDevice, s), err);
    if (!rc)
        rc = tm_cuda_comm_allgather(&drv->comm, d, d + bytes, bytes / 4, TM_NCCL_U32, s, err);
    if (!rc)
        rc = TM_CUDA_CHECK(
            cudaMemcpyAsync(all, d + bytes, bytes * drv->world, cudaMemcpyDeviceToHost, s), err);
    if (!rc)
        rc = tm_cuda_drv_sync(drv, s, err);
    set_busy(drv, 0);
    if (rc)
        comm_aborted(drv, err);
    return rc;
}

tm_rc tm_cuda_drv_agree_min(tm_cuda_drv *drv, uint32_t *n, void *scratch, size_t scratch_bytes,
                            cudaStream_t s, tm_err *err) {
    uint32_t *all = tm_calloc(drv->world, sizeof(uint32_t));
    if (!all)
        return TM_ERR(err, TM_E_NOMEM, "tp: KV block counts");
    tm_rc rc = allgather_host(drv, n, sizeof(*n), all, scratch, scratch_bytes, s, err);
    if (rc)
        tm_err_wrap(err, "tp rank %u: agreeing on the KV pool size", drv->rank);
    for (uint32_t r = 0; !rc && r < drv->world; r++)
        *n = TM_MIN(*n, all[r]);
    tm_free(all);
    return rc;
}

/* What a rank tells the others about its all-reduce region. */
typedef struct ar_card {
    cudaIpcMemHandle_t handle;
    uint64_t host; /* hash of the host name */
    uint32_t ok;   /* 1: region allocated and exported */
    uint32_t pad;
} ar_card;

// Every rank takes part in both exchanges whatever it wants, so the decision is the same on all.
tm_rc tm_cuda_drv_ar_setup(tm_cuda_drv *drv, uint32_t n_embd, void *scratch, size_t scratch_bytes,
                           cudaStream_t s, tm_err *err) {
    tm_cuda_comm *cm = &drv->comm;
    const uint32_t tp = drv->world, me = drv->rank;
    if (cm->kind == TM_CUDA_COMM_HOST) { // ranks may share a device: no peer regions
        if (me == 0)
            TM_LOG_INFO("cuda", "tp: all-reduces over host shared memory (ranks sharing a GPU: a "
                                "correctness mode, not a fast one; no CUDA graphs)");
        return TM_OK;
    }
    if (tp > TM_AR_MAX_RANKS || n_embd > TM_AR_MAX_D)
        return TM_OK; // NCCL only (the same on every rank)
    const char *env = getenv("TM_TP_CUSTOM_AR");
    const int want = !(env && strcmp(env, "0") == 0);
    cm->ar_d = TM_CEIL_DIV(n_embd, 4u) * 4;
    ar_card mine = {0};
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    mine.host = 1469598103934665603ull; // FNV-1a
    for (const char *p = host; *p; p++)
        mine.host = (mine.host ^ (uint8_t)*p) * 1099511628211ull;
    if (want) {
        const size_t bytes = tm_k_allreduce_region_bytes(cm->ar_d);
        void *region = NULL;
        mine.ok = cudaMalloc(&region, bytes) == cudaSuccess &&
                  cudaMemset(region, 0, bytes) == cudaSuccess &&
                  cudaDeviceSynchronize() == cudaSuccess &&
                  cudaIpcGetMemHandle(&mine.handle, region) == cudaSuccess;
        cm->ar_regions[me] = region;
        cudaGetLastError(); // a failure here only means: NCCL all-reduces
    }
    ar_card *all = tm_calloc(tp, sizeof(ar_card));
    if (!all)
        return TM_ERR(err, TM_E_NOMEM, "tp all-reduce cards");
    tm_rc rc = allgather_host(drv, &mine, sizeof(mine), all, scratch, scratch_bytes, s, err);
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
        ok = cudaIpcOpenMemHandle(&cm->ar_regions[r], all[r].handle,
                                  cudaIpcMemLazyEnablePeerAccess) == cudaSuccess;
        if (!ok) {
            cm->ar_regions[r] = NULL;
            why = "a rank could not map a peer's memory (no peer access between the GPUs?)";
            cudaGetLastError();
        }
    }
    tm_free(all);
    if (!rc) // did every rank map every peer?
        rc = allgather_host(drv, &ok, sizeof(ok), oks, scratch, scratch_bytes, s, err);
    if (rc)
        return tm_err_wrap(err, "tp rank %u: setting up the all-reduce", me);
    cm->ar_on = 1;
    for (uint32_t r = 0; r < tp; r++)
        cm->ar_on &= oks[r] == 1;
    if (!cm->ar_on) {
        for (uint32_t r = 0; r < TM_AR_MAX_RANKS; r++) {
            if (cm->ar_regions[r] && r != me)
                cudaIpcCloseMemHandle(cm->ar_regions[r]);
            if (r != me)
                cm->ar_regions[r] = NULL;
        }
        if (me == 0)
            TM_LOG_INFO("cuda", "tp: all-reduces on NCCL only (%s)", why);
        return TM_OK;
    }
    if (me == 0)
        TM_LOG_INFO("cuda",
                    "tp: all-reduces of steps of up to %u tokens over peer memory "
                    "(one-shot, fused with the RMSNorm), larger ones on NCCL",
                    TM_AR_MAX_ROWS);
    return TM_OK;
}

/* ---- collectives ---- */

static tm_tp_host_dtype host_dtype(tm_nccl_dtype dt) {
    return dt == TM_NCCL_BF16  ? TM_TP_HOST_BF16
           : dt == TM_NCCL_U32 ? TM_TP_HOST_U32
                               : TM_TP_HOST_F32;
}

int tm_cuda_comm_graphable(const tm_cuda_comm *cm) { return cm->kind != TM_CUDA_COMM_HOST; }

tm_rc tm_cuda_comm_allreduce_sum(tm_cuda_comm *cm, void *buf, size_t n, tm_nccl_dtype dt,
                                 cudaStream_t s, tm_err *err) {
    if (cm->kind != TM_CUDA_COMM_HOST)
        return tm_nccl_allreduce_sum(cm->nccl, buf, n, dt, s, err);
    // one chunk at a time through the staging: device -> host, sum across ranks, host -> device;
    // the next chunk's copy out is ordered after this one's copy in on the stream
    const size_t es = dt == TM_NCCL_BF16 ? 2 : 4, per = TM_TP_HOST_CHUNK_BYTES / es;
    uint8_t *d = buf;
    tm_rc rc = TM_OK;
    for (size_t i = 0; !rc && i < n; i += per) {
        const size_t k = TM_MIN(per, n - i);
        rc = TM_CUDA_CHECK(
            cudaMemcpyAsync(cm->stage, d + i * es, k * es, cudaMemcpyDeviceToHost, s), err);
        if (!rc)
            rc = tm_cuda_drv_sync(cm->drv, s, err);
        if (!rc)
            rc = tm_tp_host_allreduce_sum(cm->host, cm->stage, k, host_dtype(dt), err);
        if (!rc)
            rc = TM_CUDA_CHECK(
                cudaMemcpyAsync(d + i * es, cm->stage, k * es, cudaMemcpyHostToDevice, s), err);
    }
    // the staging is rewritten by the next collective only after a sync that follows this copy
    return rc ? rc : tm_cuda_drv_sync(cm->drv, s, err);
}

tm_rc tm_cuda_comm_allgather(tm_cuda_comm *cm, const void *send, void *recv, size_t n,
                             tm_nccl_dtype dt, cudaStream_t s, tm_err *err) {
    if (cm->kind != TM_CUDA_COMM_HOST)
        return tm_nccl_allgather(cm->nccl, send, recv, n, dt, s, err);
    const size_t es = dt == TM_NCCL_BF16 ? 2 : 4, per = TM_TP_HOST_CHUNK_BYTES / es;
    const uint32_t W = cm->drv->world;
    const uint8_t *sd = send;
    uint8_t *rd = recv, *st = cm->stage, *all = st + TM_TP_HOST_CHUNK_BYTES;
    // staging: [0, chunk) this rank's chunk, then W chunks gathered (W + 1 fit: see create)
    tm_rc rc = TM_OK;
    for (size_t i = 0; !rc && i < n; i += per) {
        const size_t k = TM_MIN(per, n - i);
        rc = TM_CUDA_CHECK(cudaMemcpyAsync(st, sd + i * es, k * es, cudaMemcpyDeviceToHost, s),
                           err);
        if (!rc)
            rc = tm_cuda_drv_sync(cm->drv, s, err);
        if (!rc)
            rc = tm_tp_host_allgather(cm->host, st, all, k, host_dtype(dt), err);
        for (uint32_t r = 0; !rc && r < W; r++)
            rc = TM_CUDA_CHECK(cudaMemcpyAsync(rd + ((size_t)r * n + i) * es,
                                               all + (size_t)r * k * es, k * es,
                                               cudaMemcpyHostToDevice, s),
                               err);
        if (!rc) // the staging is rewritten next
            rc = tm_cuda_drv_sync(cm->drv, s, err);
    }
    return rc;
}

/* ---- plan transport ---- */

tm_rc tm_cuda_drv_send_step(tm_cuda_drv *drv, const tm_cuda_plan *h, const uint32_t *meta,
                            tm_err *err) {
    return tm_rdzv_bcast(drv->rdzv, PLAN_MSG, h, sizeof(*h), meta,
                         (size_t)h->n_meta * sizeof(uint32_t), err);
}

tm_rc tm_cuda_drv_send_kv_copy(tm_cuda_drv *drv, uint32_t src, uint32_t dst, uint32_t n_tok,
                               tm_err *err) {
    tm_cuda_plan h = {.op = TM_CUDA_PLAN_KV_COPY, .kv_src = src, .kv_dst = dst, .kv_n_tok = n_tok};
    return tm_rdzv_bcast(drv->rdzv, PLAN_MSG, &h, sizeof(h), NULL, 0, err);
}

tm_rc tm_cuda_drv_serve(tm_cuda_drv *drv, const tm_cuda_rank_ops *ops, void *ctx, tm_err *err) {
    size_t cap = 0;
    tm_cuda_plan *h = ops->plan_buf(ctx, &cap);
    for (uint64_t n_step = 0;; n_step++) {
        if (ops->dead(ctx))
            return TM_ERR(err, TM_E_CUDA, "cuda engine: unusable after an earlier error");
        uint32_t type = 0;
        size_t len = 0;
        // The previous step is synchronized, so the plan buffer is free to overwrite. Spin for
        // the next plan a little (steps follow each other within microseconds while decoding;
        // waking from a blocking read costs tens of them), then block.
        tm_rc rc = TM_E_AGAIN;
        for (double t0 = tm_now_ms(); rc == TM_E_AGAIN && tm_now_ms() - t0 < SPIN_PLAN_MS;)
            rc = tm_rdzv_recv(drv->rdzv, 0, &type, h, cap, &len, err);
        if (rc == TM_E_AGAIN)
            rc = tm_rdzv_recv(drv->rdzv, -1, &type, h, cap, &len, err);
        if (!rc && (type != PLAN_MSG || len < sizeof(*h)))
            rc = TM_ERR(err, TM_E_PARSE, "tp rank %u: unexpected control message type %u",
                        drv->rank, type);
        if (!rc && h->op == TM_CUDA_PLAN_STOP)
            return TM_OK;
        if (!rc && h->op == TM_CUDA_PLAN_KV_COPY) {
            rc = ops->kv_copy(ctx, h->kv_src, h->kv_dst, h->kv_n_tok, err);
        } else if (!rc && h->op == TM_CUDA_PLAN_STEP) {
            if (!ops->plan_fits(ctx, h, len))
                rc = TM_ERR(err, TM_E_PARSE, "tp rank %u: malformed step plan %llu (T %u, S %u)",
                            drv->rank, (unsigned long long)n_step, h->T, h->S);
            if (!rc)
                rc = ops->run_plan(ctx, h, err);
        } else if (!rc) {
            rc = TM_ERR(err, TM_E_PARSE, "tp rank %u: unknown plan op %u", drv->rank, h->op);
        }
        if (rc) {
            tm_rdzv_report(drv->rdzv, err->msg);
            ops->fail(ctx);
            return rc;
        }
    }
}
