/* cmd/tp_run.c - tensor-parallel process orchestration for `tokenmill run` (see cmd/tp_run.h):
 * option parsing, starting local ranks, the rendezvous blob (NCCL id + engine settings + a model
 * fingerprint), rank 0's engine wrapper, and the serve loop of the other ranks. */
#define _POSIX_C_SOURCE 200809L
#include "cmd/tp_run.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/log.h"
#include "ingest/job_spec.h"
#include "runner/engine/cuda/engine_cuda.h"
#include "runner/tp/rendezvous.h"
#include "runner/tp/tp_nccl.h"

/* TM_TP_COMM=host: every local rank on device 0, all-reduces over host shared memory (a check of
 * the sharding on one GPU, not fast; runner/tp/tp_host.h). The spawned ranks inherit it. */
static int host_comm_env(void) {
    const char *e = getenv("TM_TP_COMM");
    return e && strcmp(e, "host") == 0;
}

#define WELCOME_MAGIC 0x544d5450u /* "TMTP" */
#define WELCOME_VERSION 3
#define REAP_WAIT_MS 20000 /* how long rank 0 waits for its local ranks to exit */

/* What rank 0 hands every other rank at the rendezvous: its engine options whole (resolved once
 * from the job, cmd/engine_opts.h; the same build on every rank, which magic, version and
 * opts_bytes check, so the struct's layout is shared; its pointers are sent NULL), the NCCL id and
 * a model fingerprint. With n_kv_block 0 every rank sizes its pool, then all take the min. */
typedef struct tp_welcome {
    uint32_t magic, version;
    uint32_t opts_bytes; /* sizeof(tm_engine_opts) */
    uint8_t nccl_id[TM_NCCL_ID_BYTES];
    tm_engine_opts eo; /* rank 0's, tp_rank 0, allreduce and allreduce_ctx NULL */
    uint32_t timeout_ms;
    uint32_t n_layer, n_embd, n_head, n_kv_head, n_ff, n_vocab, head_dim; /* model fingerprint */
} tp_welcome;

/* Rank 0's engine: the CUDA rank-0 engine plus the processes and connections it needs. */
typedef struct tp_engine {
    tm_engine eng;    /* eng.impl points back here */
    tm_engine *inner; /* owned: rank 0's CUDA engine */
    tm_rdzv *rdzv;    /* owned */
    pid_t *kids;      /* [n_kids] owned: the local ranks this process started */
    uint32_t n_kids;
} tp_engine;

static const char *addr_of(const tm_tp_launch *l) {
    return l->master_addr ? l->master_addr : "127.0.0.1";
}

/* Start local ranks [first, last) of this node: exec of this binary with the same job and launch
 * options plus --local-rank. Each child gets SIGTERM when this process dies. */
static tm_rc spawn_local(const tm_tp_launch *l, const char *job_path, uint32_t port, uint32_t first,
                         uint32_t last, pid_t *kids, uint32_t *n_kids, tm_err *err) {
    for (uint32_t lr = first; lr < last; lr++) {
        char nn[16], nr[16], mp[16], to[16], lrs[16];
        snprintf(nn, sizeof(nn), "%u", l->nnodes);
        snprintf(nr, sizeof(nr), "%u", l->node_rank);
        snprintf(mp, sizeof(mp), "%u", port);
        snprintf(to, sizeof(to), "%u", l->timeout_s);
        snprintf(lrs, sizeof(lrs), "%u", lr);
        char *argv[] = {"tokenmill",
                        "run",
                        (char *)job_path,
                        "--nnodes",
                        nn,
                        "--node-rank",
                        nr,
                        "--master-addr",
                        (char *)addr_of(l),
                        "--master-port",
                        mp,
                        "--tp-timeout",
                        to,
                        "--local-rank",
                        lrs,
                        NULL};
        const pid_t parent = getpid();
        pid_t pid = fork();
        if (pid < 0)
            return TM_ERR(err, TM_E_IO, "tp: cannot start local rank %u: fork: %s", lr,
                          strerror(errno));
        if (pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGTERM);
            if (getppid() != parent) // the parent died before prctl took effect
                _exit(1);
            execv("/proc/self/exe", argv);
            fprintf(stderr, "tokenmill: local rank %u: exec /proc/self/exe: %s\n", lr,
                    strerror(errno));
            _exit(127);
        }
        kids[(*n_kids)++] = pid;
    }
    return TM_OK;
}

/* Wait up to wait_ms for the children, then kill what is left. Returns how many exited with a
 * non-zero status or a signal. */
static uint32_t reap(pid_t *kids, uint32_t n, double wait_ms) {
    const double deadline = tm_now_ms() + wait_ms;
    uint32_t n_bad = 0, n_left = n;
    while (n_left > 0) {
        for (uint32_t i = 0; i < n; i++) {
            if (kids[i] <= 0)
                continue;
            int st = 0;
            pid_t w = waitpid(kids[i], &st, WNOHANG);
            if (w == kids[i] || (w < 0 && errno == ECHILD)) {
                n_bad += w == kids[i] && !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
                kids[i] = 0;
                n_left--;
            }
        }
        if (n_left == 0)
            break;
        if (tm_now_ms() > deadline) {
            for (uint32_t i = 0; i < n; i++)
                if (kids[i] > 0) {
                    TM_LOG_WARN("tp", "local rank process %d did not exit; killing it",
                                (int)kids[i]);
                    kill(kids[i], SIGKILL);
                    waitpid(kids[i], NULL, 0);
                    kids[i] = 0;
                    n_bad++;
                }
            break;
        }
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return n_bad;
}

static tm_rc tp_forward(tm_engine *eng, const tm_batch *b, float *logits, tm_err *err) {
    tp_engine *t = eng->impl;
    return tm_engine_forward(t->inner, b, logits, err);
}

static tm_rc tp_forward_greedy(tm_engine *eng, const tm_batch *b, uint32_t n_vocab_limit,
                               uint32_t *ids, tm_err *err) {
    tp_engine *t = eng->impl;
    return t->inner->ops->forward_greedy(t->inner, b, n_vocab_limit, ids, err);
}

static tm_rc tp_kv_copy(tm_engine *eng, uint32_t src, uint32_t dst, uint32_t n_tok, tm_err *err) {
    tp_engine *t = eng->impl;
    return t->inner->ops->kv_copy(t->inner, src, dst, n_tok, err);
}

static void tp_destroy(tm_engine *eng) {
    if (!eng)
        return;
    tp_engine *t = eng->impl;
    tm_engine_destroy(t->inner); // tells the other ranks to stop (unless it is dead)
    tm_rdzv_close(t->rdzv);      // ranks still waiting on it see EOF and exit
    uint32_t n_bad = reap(t->kids, t->n_kids, REAP_WAIT_MS);
    if (n_bad)
        TM_LOG_WARN("tp", "%u local rank(s) exited with an error (see their messages above)",
                    n_bad);
    tm_free(t->kids);
    tm_free(t);
}

static const tm_engine_ops tp_ops = {
    .name = "cuda", // rank 0's engine is the CUDA engine; "tp" shows in the metrics settings
    .kv_auto = "bf16",
    .forward = tp_forward,
    .forward_greedy = tp_forward_greedy,
    .kv_copy = tp_kv_copy,
    .destroy = tp_destroy,
};

static tm_rc check_launch(const tm_tp_launch *l, uint32_t tp, uint32_t *nproc, tm_err *err) {
    const uint32_t nn = TM_MAX(l->nnodes, 1u);
    if (tp < 2)
        return TM_ERR(err, TM_E_INVAL, "tp: engine.tp is %u; multi-process runs need tp >= 2", tp);
    if (tp % nn)
        return TM_ERR(err, TM_E_INVAL, "tp: engine.tp %u does not divide by --nnodes %u", tp, nn);
    if (l->node_rank >= nn)
        return TM_ERR(err, TM_E_INVAL, "tp: --node-rank %u with --nnodes %u", l->node_rank, nn);
    if (nn > 1 && (!l->master_addr || !l->master_port))
        return TM_ERR(err, TM_E_INVAL, "tp: --nnodes %u needs --master-addr and --master-port", nn);
    *nproc = tp / nn;
    if (l->local_rank >= (int32_t)*nproc)
        return TM_ERR(err, TM_E_INVAL, "tp: local rank %d of %u", l->local_rank, *nproc);
    return TM_OK;
}

static void fingerprint(const tm_model_cfg *c, tp_welcome *w) {
    w->n_layer = c->n_layer, w->n_embd = c->n_embd, w->n_head = c->n_head;
    w->n_kv_head = c->n_kv_head, w->n_ff = c->n_ff, w->n_vocab = c->n_vocab;
    w->head_dim = c->head_dim;
}

tm_rc tm_tp_engine_create(const tm_tp_launch *l, const char *job_path, const tm_model *m,
                          const tm_engine_opts *eo, tm_engine **out, tm_err *err) {
    uint32_t nproc = 0;
    tm_rc rc = check_launch(l, eo->tp_size, &nproc, err);
    if (rc)
        return rc;
    const int n_dev = tm_engine_cuda_n_devices();
    if (n_dev < (host_comm_env() ? 1 : (int)nproc)) // TM_TP_COMM=host: all on device 0
        return TM_ERR(err, TM_E_INVAL,
                      "tp: engine.tp %u on %u node(s) needs %u GPUs on this node, %d visible",
                      eo->tp_size, TM_MAX(l->nnodes, 1u), nproc, n_dev);
    tp_engine *t = tm_calloc(1, sizeof(*t));
    if (!t)
        return TM_ERR(err, TM_E_NOMEM, "tp engine");
    t->eng = (tm_engine){.ops = &tp_ops, .model = m, .opts = *eo, .impl = t};
    t->kids = tm_calloc(nproc, sizeof(*t->kids));
    if (!t->kids) {
        rc = TM_ERR(err, TM_E_NOMEM, "tp engine");
        goto fail;
    }
    tp_welcome w;
    memset(&w, 0, sizeof(w)); // padding included: the bytes go on the wire
    w.magic = WELCOME_MAGIC;
    w.version = WELCOME_VERSION;
    w.opts_bytes = sizeof(tm_engine_opts);
    w.eo = *eo;
    w.eo.tp_rank = 0;
    w.eo.allreduce = NULL;
    w.eo.allreduce_ctx = NULL;
    w.timeout_ms = l->timeout_s * 1000;
    fingerprint(&m->cfg, &w);
    rc = tm_nccl_get_id(w.nccl_id, err);
    if (rc)
        goto fail;
    tm_rdzv_cfg rcfg = {.addr = addr_of(l),
                        .port = (uint16_t)l->master_port,
                        .rank = 0,
                        .world = eo->tp_size,
                        .timeout_ms = l->timeout_s * 1000};
    rc = tm_rdzv_listen(&rcfg, &t->rdzv, err);
    if (rc)
        goto fail;
    const int v = tm_nccl_version();
    TM_LOG_INFO("tp", "%u ranks on %u node(s), %u per node; rendezvous on %s:%u; NCCL %d.%d.%d",
                eo->tp_size, TM_MAX(l->nnodes, 1u), nproc, addr_of(l), tm_rdzv_port(t->rdzv),
                v / 10000, v / 100 % 100, v % 100);
    rc = spawn_local(l, job_path, tm_rdzv_port(t->rdzv), 1, nproc, t->kids, &t->n_kids, err);
    if (!rc)
        rc = tm_rdzv_accept(t->rdzv, &w, sizeof(w), err);
    if (rc)
        goto fail;
    tm_engine_opts ro = *eo;
    ro.tp_rank = 0;
    tm_engine_cuda_tp tcfg = {.device = 0,
                              .rdzv = t->rdzv,
                              .nccl_id = w.nccl_id,
                              .timeout_ms = l->timeout_s * 1000,
                              .host_comm = host_comm_env()};
    rc = tm_engine_cuda_tp_create(m, &ro, &tcfg, &t->inner, err);
    if (rc)
        goto fail;
    t->eng.opts.n_kv_block = t->inner->opts.n_kv_block; // the count all ranks agreed on
    *out = &t->eng;
    return TM_OK;
fail:
    tm_rdzv_close(t->rdzv); // started ranks see EOF (or never reach us) and exit
    t->rdzv = NULL;
    tp_destroy(&t->eng);
    return rc;
}

/* A rank other than 0: load the job's model, join, serve plans until rank 0 says stop. */
static tm_rc serve_rank(const tm_tp_launch *l, const char *job_path, uint32_t rank,
                        uint32_t local_rank, tm_err *err) {
    tm_job_spec *spec = NULL;
    tm_model *m = NULL;
    tm_rdzv *rdzv = NULL;
    tm_engine *eng = NULL;
    tm_rc rc = tm_job_spec_load(job_path, &spec, err);
    if (!rc)
        rc = tm_model_load(spec->model, &m, err);
    if (rc)
        goto done;
    tm_rdzv_cfg rcfg = {.addr = addr_of(l),
                        .port = (uint16_t)l->master_port,
                        .rank = rank,
                        .world = spec->engine.tp,
                        .timeout_ms = l->timeout_s * 1000};
    tp_welcome w, mine = {0};
    size_t len = 0;
    rc = tm_rdzv_join(&rcfg, &rdzv, &w, sizeof(w), &len, err);
    if (rc)
        goto done;
    fingerprint(&m->cfg, &mine);
    if (len != sizeof(w) || w.magic != WELCOME_MAGIC || w.version != WELCOME_VERSION ||
        w.opts_bytes != sizeof(tm_engine_opts)) {
        rc = TM_ERR(err, TM_E_PARSE, "tp rank %u: rank 0 runs a different tokenmill build", rank);
        goto done;
    }
    if (memcmp(&w.n_layer, &mine.n_layer, 7 * sizeof(uint32_t)) != 0 ||
        w.eo.tp_size != rcfg.world) {
        rc = TM_ERR(err, TM_E_INVAL,
                    "tp rank %u: model %s (%u layers, hidden %u, vocab %u) or engine.tp %u differ "
                    "from rank 0's (%u layers, hidden %u, vocab %u, tp %u)",
                    rank, spec->model, mine.n_layer, mine.n_embd, mine.n_vocab, rcfg.world,
                    w.n_layer, w.n_embd, w.n_vocab, w.eo.tp_size);
        goto done;
    }
    tm_engine_opts eo = w.eo; // rank 0's, resolved once from the job (cmd/engine_opts.h)
    eo.tp_rank = rank;
    tm_engine_cuda_tp tcfg = {.device = host_comm_env() ? 0 : (int)local_rank,
                              .rdzv = rdzv,
                              .nccl_id = w.nccl_id,
                              .timeout_ms = w.timeout_ms,
                              .host_comm = host_comm_env()};
    rc = tm_engine_cuda_tp_create(m, &eo, &tcfg, &eng, err);
    if (rc) {
        tm_rdzv_report(rdzv, err->msg);
        goto done;
    }
    TM_LOG_INFO("tp", "rank %u (local %u) ready; serving rank 0's steps", rank, local_rank);
    rc = tm_engine_cuda_tp_serve(eng, err);
done:
    tm_engine_destroy(eng);
    tm_rdzv_close(rdzv);
    tm_model_destroy(m);
    tm_job_spec_destroy(spec);
    return rc;
}

static int parse_u32(const char *s, uint32_t max, uint32_t *out) {
    char *end = NULL;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (errno || !end || *end || end == s || v > max)
        return 0;
    *out = (uint32_t)v;
    return 1;
}

int tm_tp_run_parse(int argc, char **argv, tm_tp_run_args *out) {
    tm_tp_launch l = {.nnodes = 1, .local_rank = -1, .timeout_s = TM_TP_DEFAULT_TIMEOUT_S};
    int port_set = 0, restart = 0;
    const char *path = NULL;
    for (int i = 0; i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        uint32_t x = 0;
        int ok = v != NULL;
        if (a[0] != '-' && !path) {
            path = a;
            i--;
        } else if (!strcmp(a, "--restart")) {
            restart = 1;
            i--;
        } else if (ok && !strcmp(a, "--master-addr")) {
            l.master_addr = v;
        } else if (ok && !strcmp(a, "--nnodes") && parse_u32(v, 65536, &x) && x >= 1) {
            l.nnodes = x;
        } else if (ok && !strcmp(a, "--node-rank") && parse_u32(v, 65535, &x)) {
            l.node_rank = x;
        } else if (ok && !strcmp(a, "--master-port") && parse_u32(v, 65535, &x)) {
            l.master_port = x;
            port_set = 1;
        } else if (ok && !strcmp(a, "--tp-timeout") && parse_u32(v, 86400, &x) && x >= 1) {
            l.timeout_s = x;
        } else if (ok && !strcmp(a, "--local-rank") && parse_u32(v, 65535, &x)) {
            l.local_rank = (int32_t)x;
        } else {
            fprintf(stderr, "tokenmill run: bad option %s%s%s\n", a, v ? " " : "", v ? v : "");
            return 2;
        }
    }
    if (!path) {
        fprintf(stderr, "tokenmill run: no job file\n");
        return 2;
    }
    if (l.nnodes > 1 && !port_set)
        l.master_port = TM_TP_DEFAULT_PORT;
    *out = (tm_tp_run_args){.path = path, .restart = restart, .launch = l};
    return 0;
}

int tm_tp_is_rank0(const tm_tp_launch *l) { return l->node_rank == 0 && l->local_rank <= 0; }

int tm_tp_serve_cmd(const char *path, const tm_tp_launch *launch) {
    const tm_tp_launch l = *launch;
    tm_err err = {0};
    tm_job_spec *spec = NULL;
    tm_rc rc = tm_job_spec_load(path, &spec, &err);
    uint32_t nproc = 0, tp = spec ? spec->engine.tp : 0;
    tm_job_spec_destroy(spec);
    if (!rc)
        rc = check_launch(&l, tp, &nproc, &err);
    pid_t *kids = NULL;
    uint32_t n_kids = 0;
    const uint32_t local = l.local_rank < 0 ? 0 : (uint32_t)l.local_rank;
    if (!rc && l.local_rank < 0) {
        kids = tm_calloc(nproc, sizeof(*kids));
        rc = kids ? spawn_local(&l, path, l.master_port, 1, nproc, kids, &n_kids, &err)
                  : TM_ERR(&err, TM_E_NOMEM, "tp launcher");
    }
    const uint32_t rank = l.node_rank * nproc + local;
    if (!rc)
        rc = serve_rank(&l, path, rank, local, &err);
    if (rc)
        TM_LOG_ERROR("tp", "%s: rank %u (node %u, local rank %u): %s", path, rank, l.node_rank,
                     local, err.msg);
    uint32_t n_bad = reap(kids, n_kids, rc ? 2000 : REAP_WAIT_MS);
    tm_free(kids);
    return rc || n_bad ? 1 : 0;
}
