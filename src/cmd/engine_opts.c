/* cmd/engine_opts.c - a job's engine section resolved into tm_engine_opts (cmd/engine_opts.h). */
#include "cmd/engine_opts.h"

#include <unistd.h>

tm_engine_opts tm_job_engine_opts(const tm_job_engine *e) {
    long n_cpu = sysconf(_SC_NPROCESSORS_ONLN);
    return (tm_engine_opts){
        .n_threads = e->threads ? e->threads : (uint32_t)TM_MAX(n_cpu, 1),
        .block_size = e->block_size,
        .n_kv_block = e->kv_blocks,
        .max_seqs = e->max_seqs,
        .max_batched_tokens = e->max_batched_tokens,
        .tp_size = e->tp,
        .gpu_mem_util = (float)e->gpu_memory_utilization,
        .kv_dtype = e->kv_cache_fp8 ? TM_KV_DTYPE_FP8 : TM_KV_DTYPE_AUTO,
        // speculative verification: a row for the decode token and each draft
        .max_rows = e->spec_k ? e->max_seqs * (e->spec_k + 1) : 0,
        .engram_cache_mb = e->engram_cache_mb,
    };
}
