/* cmd/tp_run.h - tensor parallel across processes for `tokenmill run` (engine.tp > 1 with the cuda
 * backend): one process per GPU, torchrun's conventions. On one node `tokenmill run JOB.json`
 * starts the other local ranks itself (fork + exec of itself with the hidden --local-rank flag,
 * device = local rank). Across nodes every node runs `tokenmill run JOB.json --nnodes N
 * --node-rank K --master-addr HOST --master-port PORT`, with the job file and the model folder at
 * the same paths; each node starts engine.tp / N local ranks. Global rank 0 (node 0, local rank
 * 0) runs the job: source, runner, sinks, and rank 0's shard; it hands the NCCL id and the engine
 * settings out through the TCP rendezvous (runner/tp/rendezvous.h) and sends each step's plan. The
 * other ranks load the model, join, and serve plans until rank 0 stops them.
 *
 * Failure: a rank that does not join within the timeout fails the rendezvous with a message
 * naming it; a rank that dies later fails the current step on rank 0 (the job stops cleanly: the
 * sink closes its files, the manifest stays valid, a rerun resumes), and ranks whose rank 0 died
 * exit non-zero. Does not: restart ranks, or choose network interfaces (NCCL_SOCKET_IFNAME etc.:
 * docs/multinode.md, tools/rdma_check). */
#ifndef TM_CMD_TP_RUN_H
#define TM_CMD_TP_RUN_H

#include <stdint.h>

#include "base/err.h"
#include "runner/engine/engine.h"
#include "runner/model/model.h"

#define TM_TP_DEFAULT_PORT 29500
#define TM_TP_DEFAULT_TIMEOUT_S 120

typedef struct tm_tp_launch {
    uint32_t nnodes;         /* nodes in the job, >= 1 */
    uint32_t node_rank;      /* this node, 0 .. nnodes - 1; node 0 runs the job */
    const char *master_addr; /* rank 0's address; borrowed. NULL: 127.0.0.1 (one node only) */
    uint32_t master_port;    /* 0: a free port (one node only); TM_TP_DEFAULT_PORT across nodes */
    int32_t local_rank;      /* -1: this node's launcher; >= 0: a started local rank (hidden) */
    uint32_t timeout_s;      /* rendezvous and step timeout */
} tm_tp_launch;

/* The arguments of `tokenmill run JOB.json [options]`. */
typedef struct tm_tp_run_args {
    const char *path;    /* the job file; borrowed from argv */
    int restart;         /* --restart */
    tm_tp_launch launch; /* the launch options, defaults where not given */
} tm_tp_run_args;

/* Parse `tokenmill run JOB.json [options]` where options are --restart, --nnodes, --node-rank,
 * --master-addr, --master-port, --tp-timeout (and the hidden --local-rank); argv[0] is JOB.json.
 * Fills *out (its strings borrow argv). Returns 0, or 2 (bad usage; the message is printed). */
int tm_tp_run_parse(int argc, char **argv, tm_tp_run_args *out);

/* Is this process global rank 0 (node 0, local rank 0)? That one runs the job (cmd/main.c hands
 * it to tm_job_run_with, which calls tm_tp_engine_create); every other process serves
 * (tm_tp_serve_cmd). */
int tm_tp_is_rank0(const tm_tp_launch *l);

/* A process other than global rank 0: a node launcher (node_rank > 0, local_rank -1) starts its
 * node's other local ranks and serves as local rank 0; a started local rank serves. path is the
 * job file (its model and engine.tp are read). Errors are logged here. Returns the process exit
 * code: 0 success, 1 failure. */
int tm_tp_serve_cmd(const char *path, const tm_tp_launch *l);

/* Rank 0's side, for cmd/job_run.c (which includes this header; this module includes none of
 * cmd/job_run's): start the node's other local ranks, run the rendezvous (NCCL id,
 * engine settings eo), and create rank 0's CUDA engine on device 0. On success *out owns an engine
 * that also owns the rendezvous and the started processes: destroying it stops every rank and
 * waits for the local ones. m and job_path are borrowed; m must outlive the engine. Errors: the
 * rendezvous' (a missing rank), the engine's, TM_E_INVAL (tp does not divide by nnodes, fewer
 * GPUs than local ranks, bad launch options). */
tm_rc tm_tp_engine_create(const tm_tp_launch *l, const char *job_path, const tm_model *m,
                          const tm_engine_opts *eo, tm_engine **out, tm_err *err);

#endif /* TM_CMD_TP_RUN_H */
