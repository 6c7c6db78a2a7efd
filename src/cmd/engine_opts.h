/* cmd/engine_opts.h - the one resolution of engine options from a job's engine section
 * (ingest/job_spec.h) into tm_engine_opts (runner/engine/engine.h). `tokenmill run` resolves them
 * once on rank 0 and sends the result to the other tensor-parallel ranks (cmd/tp_run.c);
 * `tokenmill bench` fills a tm_job_engine of its own and resolves it the same way. Pure apart from
 * reading the number of online CPUs; any thread. */
#ifndef TM_CMD_ENGINE_OPTS_H
#define TM_CMD_ENGINE_OPTS_H

#include "ingest/job_spec.h"
#include "runner/engine/engine.h"

/* The engine options of e: threads (0: the online CPUs), block_size, max_seqs,
 * max_batched_tokens, tp_size, n_kv_block (kv_blocks as given: 0 lets the CUDA engine size its
 * pool within gpu_mem_util; the CPU engine's count is the caller's, see job_run.c), gpu_mem_util,
 * kv_dtype (kv_cache_dtype: fp8 or auto) and max_rows (with speculative decoding a row for the
 * decode token and each draft). tp_rank 0 and no all-reduce: the engine factories set those. */
tm_engine_opts tm_job_engine_opts(const tm_job_engine *e);

#endif /* TM_CMD_ENGINE_OPTS_H */
