/* kernels/chain.h - a stretch of a decode step in one persistent kernel: the projections and
 * the small ops between them (RMSNorm, all-reduce + RMSNorm, RoPE + KV write, SwiGLU) as phases
 * of one launch, with a grid-wide barrier between phases.
 *
 * Why: a decode step is about 300 short kernels, and each one pays a launch gap, a ramp while
 * its first weight loads come back from DRAM and a tail while its last warps finish, 3-4 us
 * that do not shrink with the bytes moved (bench/RESULTS.md, "where a decode step's time goes").
 * Here every warp of the grid owns one continuous stream of weight chunks through all the
 * projection phases of the launch: it keeps `depth` chunks of 1 KB in flight in its own ring of
 * shared memory, and the chunks of the next projection are already on their way while the grid
 * does the small ops and waits at the barriers, so the DRAM keeps streaming across phase
 * boundaries (weights never depend on activations). This is the "megakernel" idea of
 * persistent decode kernels, applied to the stretch between two attentions.
 *
 * Phases (each an existing op's arguments, the same semantics and the same arithmetic in the
 * same order as its own kernel, so the results are bitwise those of the separate launches):
 *   GEMM       kernels/gemm_skinny.h (partials [n_split][n_tok][n_out]; the split plan from
 *              tm_k_chain_splits; chunks in tm_skinny_rot order, as gemm_skinny's `stagger`)
 *   NORM       kernels/rmsnorm.h (residual add of partials + RMSNorm)
 *   ALLREDUCE  kernels/allreduce.h (peer-memory all-reduce + RMSNorm, tensor parallel)
 *   ROPE       kernels/rope.h (bias + RoPE + KV cache write)
 *   SILU       kernels/act.h (SwiGLU)
 * Reads of activations written by an earlier phase of the same launch go through the L2 (no
 * read-only cache), and the barrier orders them.
 *
 * The grid is one block of TM_CHAIN_WARPS warps per multiprocessor, launched cooperatively
 * (all blocks resident, which the barrier needs). */
#ifndef TM_KERNELS_CHAIN_H
#define TM_KERNELS_CHAIN_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "base/err.h" /* C declarations: C linkage also from .cu files */
#include "kernels/act.h"
#include "kernels/allreduce.h"
#include "kernels/gemm_skinny.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"

#define TM_CHAIN_WARPS 16     /* warps per block, one block per multiprocessor */
#define TM_CHAIN_MAX_PHASE 10 /* phases per launch */
#define TM_CHAIN_MAX_TOK 8    /* rows per step (one 8-column mma tile) */

typedef enum tm_k_chain_op {
    TM_CHAIN_GEMM = 1,
    TM_CHAIN_NORM,
    TM_CHAIN_ALLREDUCE,
    TM_CHAIN_ROPE,
    TM_CHAIN_SILU,
} tm_k_chain_op;

typedef struct tm_k_chain_phase {
    uint32_t op; /* tm_k_chain_op */
    union {
        tm_k_gemm_skinny_args gemm; /* unroll ignored */
        tm_k_rmsnorm_bf16_args norm;
        tm_k_allreduce_args ar;
        tm_k_rope_kv_bf16_args rope;
        tm_k_silu_mul_bf16_args silu;
    } u;
} tm_k_chain_phase;

typedef struct tm_k_chain_args {
    uint32_t n_phase;             /* 1..TM_CHAIN_MAX_PHASE */
    uint32_t n_sm;                /* blocks of the grid: the device's multiprocessors */
    uint32_t depth;               /* weight chunks in flight per warp: 4, 8 or 12; 0: 4 */
    uint32_t *barrier;            /* tm_k_chain_barrier_bytes, zeroed once; one launch at a time */
    /* Benchmarks: NULL, or [n_phase + 1][n_sm]: globaltimer ns when each block reached phase p
     * (for p > 0 its arrival at the barrier; n_phase: its end). */
    uint64_t *timing;
    tm_k_chain_phase ph[TM_CHAIN_MAX_PHASE];
} tm_k_chain_args;

/* The split of a projection's inner dimension for a chain on n_sm multiprocessors: about three
 * (tile, split) tasks per warp of the grid, splits of at least 256. */
uint32_t tm_k_chain_splits(uint32_t n_in, uint32_t n_out, uint32_t n_sm, uint32_t *k_per_split);

/* Device bytes of the grid barrier (zero them once). */
size_t tm_k_chain_barrier_bytes(void);

/* 1 if this device can run the chain (cooperative launch, one block per multiprocessor with the
 * deepest ring), else 0. */
int tm_k_chain_supported(int device);

/* One launch on s; every phase's n_tok must be <= TM_CHAIN_MAX_TOK. */
tm_rc tm_k_chain(const tm_k_chain_args *a, cudaStream_t s, tm_err *err);

#ifdef __cplusplus
}
#endif

#endif /* TM_KERNELS_CHAIN_H */
