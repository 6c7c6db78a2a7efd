/* kernels/chain.cu - a stretch of a decode step as one persistent kernel (see chain.h).
 *
 * The weight stream. A task is one (tile of 16 output rows, split of the inner dimension) as in
 * gemm_skinny; a GEMM phase has about three per warp, and warps take them one at a time from the
 * phase's counter (an atomic), so that a warp the memory serves more slowly takes fewer: with a
 * static share per warp the phase waited for the slowest (H200: blocks finished up to 2x apart).
 * A warp's tasks' chunks (32 inner elements of 16 rows, 1 KB), in order across the phases, form
 * its stream: the warp issues the first `depth` chunks at the start, then one more after
 * consuming each, into a ring of `depth` shared-memory slots, one cp.async commit group per
 * chunk (empty past the end): the k-th chunk consumed has landed once at most depth - 1 groups
 * are pending. Taking the next task is done by the issuing side, so the tasks a warp will
 * consume wait in a small FIFO. The issuing cursor runs ahead across phases, so while the grid
 * does the small phases and waits at barriers the
 * next projection's first chunks are already arriving. */
#include "kernels/act.cuh"
#include "kernels/allreduce.cuh"
#include "kernels/chain.h"
#include "kernels/gemm_skinny.cuh"
#include "kernels/rmsnorm.cuh"
#include "kernels/rope.cuh"

#define CHAIN_THREADS (TM_CHAIN_WARPS * 32)
#define CHAIN_DEPTH_DEFAULT 4 /* H200: 4 beat 8 and 12 (bench/RESULTS.md) */
#define CHAIN_DEPTH_MAX 12
#define CHAIN_BARRIER_TIMEOUT_S (TM_AR_TIMEOUT_S + 10) /* longer than an all-reduce's wait */

/* Shared-memory bytes of a block's rings. */
static size_t ring_bytes(uint32_t depth) {
    return (size_t)TM_CHAIN_WARPS * depth * 2 * 32 * sizeof(uint4);
}

static __device__ __forceinline__ uint64_t ld_acquire64(const unsigned long long *p) {
    uint64_t v;
    asm volatile("ld.acquire.gpu.global.u64 %0, [%1];\n" : "=l"(v) : "l"(p) : "memory");
    return v;
}

/* All blocks of the grid (all resident: cooperative launch). *bar counts arrivals since the
 * barrier was zeroed; a launch's k-th barrier (k from 1) waits until it reaches base + k * B
 * (B blocks), base being a multiple of B taken at the launch's start: every earlier launch
 * completed all its barriers, and fewer than B arrivals of this launch can precede the slowest
 * block's first read, so base = the count rounded down to a multiple of B. 64 bits: no wrap. */
static __device__ __forceinline__ void grid_barrier(unsigned long long *bar, uint64_t target) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(bar, 1ull);
        if (ld_acquire64(bar) < target) {
            const uint64_t t0 = tm_ar_globaltimer_ns();
            while (ld_acquire64(bar) < target)
                if (tm_ar_globaltimer_ns() - t0 > (uint64_t)CHAIN_BARRIER_TIMEOUT_S * 1000000000ull)
                    __trap(); // a block never came (a trapped all-reduce elsewhere)
        }
        __threadfence();
    }
    __syncthreads();
}

/* A warp's issuing cursor: the next chunk to issue is chunk `chunk` of task `task` of phase `ph`
 * (ph == n_phase: the stream is done). wl / wh: the task's rows r and r + 8 at its k0 + 8c. */
struct wstream {
    uint32_t ph, task, chunk, n_chunk, rot;
    const uint4 *wl, *wh;
};

/* The tasks a warp has taken and not yet consumed, in order, in shared memory (lane 0 writes,
 * every lane reads): a task number, or END when the warp found the phase's tasks all taken. The
 * issuing cursor is at most `depth` chunks ahead, a task has at least one chunk, and each GEMM
 * phase adds one END: FIFO_N > depth + 1 + TM_CHAIN_MAX_PHASE entries suffice. */
#define FIFO_N 32
#define END 0xffffffffu
struct wfifo {
    uint32_t *q;
    uint32_t head, tail; // popped, pushed (every lane keeps its own copy)
};

static __device__ __forceinline__ uint32_t gemm_tasks(const tm_k_gemm_skinny_args &g) {
    return (g.n_out + 15) / 16 * g.n_split;
}

/* Task t of a GEMM phase is split t % n_split of tile t / n_split: the tasks running at one time
 * spread over the splits' offsets (and tm_skinny_rot staggers them within a split). */
static __device__ __forceinline__ void task_of(const tm_k_gemm_skinny_args &g, uint32_t t,
                                               uint32_t *tile, uint32_t *split) {
    *split = t % g.n_split;
    *tile = t / g.n_split;
}

/* A task's weight pointers, chunk count and walking order (lane = 4r + c). */
static __device__ __forceinline__ uint32_t task_rows(const tm_k_gemm_skinny_args &g, uint32_t task,
                                                     uint32_t lane, const uint4 **wl,
                                                     const uint4 **wh, uint32_t *rot) {
    uint32_t tile, split;
    task_of(g, task, &tile, &split);
    const uint32_t r = lane >> 2, c = lane & 3;
    const uint32_t row_lo = tile * 16 + r, row_hi = row_lo + 8;
    const uint32_t k0 = split * g.k_per_split, k1 = min(g.n_in, k0 + g.k_per_split);
    // Rows past n_out (the last tile of a ragged n_out) read a valid row; never stored.
    *wl = reinterpret_cast<const uint4 *>(g.w + (size_t)min(row_lo, g.n_out - 1) * g.n_in + k0 +
                                          8 * c);
    *wh = reinterpret_cast<const uint4 *>(g.w + (size_t)min(row_hi, g.n_out - 1) * g.n_in + k0 +
                                          8 * c);
    *rot = tm_skinny_rot(tile, split, (k1 - k0) / 32);
    return (k1 - k0) / 32;
}

/* Take the next task of phase ph (one atomic per warp), or UINT32_MAX when all are taken. */
static __device__ __forceinline__ uint32_t take_task(const tm_k_chain_args &a, uint32_t ph,
                                                     uint32_t lane) {
    uint32_t t = 0;
    if (lane == 0)
        t = atomicAdd(a.barrier + 2 + ph, 1u);
    t = __shfl_sync(0xffffffffu, t, 0);
    return t < gemm_tasks(a.ph[ph].u.gemm) ? t : UINT32_MAX;
}

static __device__ __forceinline__ void fifo_push(wfifo &f, uint32_t v, uint32_t lane) {
    if (lane == 0)
        f.q[f.tail % FIFO_N] = v;
    f.tail++;
    __syncwarp();
}

/* Move the cursor to the next task with chunks, in phase s.ph or a later one: take tasks until
 * one is found, pushing each taken task (and END for each phase left) on the FIFO. */
static __device__ __forceinline__ void stream_seek(const tm_k_chain_args &a, wstream &s,
                                                   wfifo &f, uint32_t lane) {
    for (; s.ph < a.n_phase; s.ph++) {
        const tm_k_chain_phase &p = a.ph[s.ph];
        if (p.op != TM_CHAIN_GEMM)
            continue;
        for (;;) {
            const uint32_t t = take_task(a, s.ph, lane);
            if (t == UINT32_MAX)
                break;
            fifo_push(f, t, lane);
            s.task = t;
            s.chunk = 0;
            s.n_chunk = task_rows(p.u.gemm, t, lane, &s.wl, &s.wh, &s.rot);
            if (s.n_chunk)
                return;
        }
        fifo_push(f, END, lane);
    }
}

/* Issue the cursor's chunk (if any) into the ring's next slot, and one commit group. */
template <int D>
static __device__ __forceinline__ void stream_issue(const tm_k_chain_args &a, wstream &s,
                                                    wfifo &f, uint4 (*ring)[2][32],
                                                    uint32_t &n_issued, uint32_t lane) {
    if (s.ph < a.n_phase) {
        uint4(*slot)[32] = ring[n_issued % D];
        const uint32_t at = tm_skinny_chunk_at(s.chunk, s.rot, s.n_chunk);
        tm_skinny_cp_async16(&slot[0][lane], s.wl + 4 * at);
        tm_skinny_cp_async16(&slot[1][lane], s.wh + 4 * at);
        if (++s.chunk == s.n_chunk)
            stream_seek(a, s, f, lane);
    }
    n_issued++;
    tm_cp_async_commit();
}

/* A GEMM phase: the tasks this warp took, consuming its stream in order (gemm_skinny's
 * arithmetic). x was written by an earlier phase of this launch: plain loads (L1-cached, which
 * the barrier's acquire keeps coherent), not the read-only path. */
template <int D>
static __device__ __forceinline__ void gemm_phase(const tm_k_chain_args &a,
                                                  const tm_k_gemm_skinny_args &g, wstream &s,
                                                  wfifo &f, uint4 (*ring)[2][32],
                                                  uint32_t &n_issued, uint32_t &n_used,
                                                  uint32_t lane) {
    const uint32_t r = lane >> 2, c = lane & 3;
    for (;;) {
        const uint32_t task = f.q[f.head++ % FIFO_N];
        if (task == END)
            break;
        uint32_t tile, split;
        task_of(g, task, &tile, &split);
        const uint4 *wl, *wh;
        uint32_t rot;
        const uint32_t n_chunk = task_rows(g, task, lane, &wl, &wh, &rot);
        const uint32_t k0 = split * g.k_per_split;
        const bool xok = r < g.n_tok;
        const uint4 *xp =
            reinterpret_cast<const uint4 *>(g.x + (size_t)(xok ? r : 0) * g.n_in + k0 + 8 * c);
        float acc[1][4] = {{0.0f, 0.0f, 0.0f, 0.0f}};
        const uint4 zero = make_uint4(0, 0, 0, 0);
        for (uint32_t i = 0; i < n_chunk; i++) {
            uint4 xv[1];
            xv[0] = xok ? xp[4 * tm_skinny_chunk_at(i, rot, n_chunk)] : zero;
            tm_cp_async_wait<D - 1>();
            const uint32_t slot = n_used++ % D;
            const uint4 lo = ring[slot][0][lane], hi = ring[slot][1][lane];
            tm_skinny_chunk_mma<1>(acc, lo, hi, xv);
            stream_issue<D>(a, s, f, ring, n_issued, lane); // refills the slot just read
        }
        tm_skinny_store<1>(acc, g, split, tile * 16 + r, c);
    }
}

template <int D>
static __global__ void __launch_bounds__(CHAIN_THREADS, 1)
    chain_kernel(const __grid_constant__ tm_k_chain_args a) {
    extern __shared__ uint4 chain_smem[];
    __shared__ uint32_t fifo_q[TM_CHAIN_WARPS][FIFO_N];
    const uint32_t lane = threadIdx.x & 31;
    uint4(*ring)[2][32] =
        reinterpret_cast<uint4(*)[2][32]>(chain_smem) + (size_t)(threadIdx.x / 32) * D;
    wfifo f = {fifo_q[threadIdx.x / 32], 0, 0};
    wstream s = {0, 0, 0, 0, 0, NULL, NULL};
    stream_seek(a, s, f, lane);
    uint32_t n_issued = 0, n_used = 0;
#pragma unroll 1
    for (int i = 0; i < D; i++)
        stream_issue<D>(a, s, f, ring, n_issued, lane);

    unsigned long long *bar = reinterpret_cast<unsigned long long *>(a.barrier);
    const uint64_t base = *reinterpret_cast<volatile unsigned long long *>(bar) / gridDim.x *
                          gridDim.x;
    const size_t gtid = (size_t)blockIdx.x * CHAIN_THREADS + threadIdx.x;
    const size_t gthreads = (size_t)gridDim.x * CHAIN_THREADS;
    for (uint32_t ph = 0; ph < a.n_phase; ph++) {
        if (a.timing && threadIdx.x == 0) // benchmarks: when this block reached the phase
            a.timing[(size_t)ph * gridDim.x + blockIdx.x] = tm_ar_globaltimer_ns();
        if (ph > 0)
            grid_barrier(bar, base + (uint64_t)ph * gridDim.x);
        const tm_k_chain_phase &p = a.ph[ph];
        switch (p.op) {
        case TM_CHAIN_GEMM:
            gemm_phase<D>(a, p.u.gemm, s, f, ring, n_issued, n_used, lane);
            break;
        case TM_CHAIN_NORM:
            for (uint32_t row = blockIdx.x; row < p.u.norm.n_row; row += gridDim.x)
                tm_rmsnorm_row<CHAIN_THREADS>(p.u.norm, row);
            break;
        case TM_CHAIN_ALLREDUCE:
            for (uint32_t t = blockIdx.x; t < p.u.ar.n_tok; t += gridDim.x)
                tm_allreduce_row<CHAIN_THREADS>(p.u.ar, t);
            break;
        case TM_CHAIN_ROPE: {
            const tm_k_rope_kv_bf16_args &ra = p.u.rope;
            const uint32_t items = tm_rope_kv_items(ra.n_head, ra.n_kv_head, ra.head_dim);
            for (size_t i = gtid; i < (size_t)ra.n_tok * items; i += gthreads)
                tm_rope_kv_item(ra, i / items, (uint32_t)(i % items));
            break;
        }
        case TM_CHAIN_SILU:
            for (size_t i = gtid; i < (size_t)p.u.silu.n_tok * p.u.silu.n_ff; i += gthreads)
                tm_silu_mul_item(p.u.silu, i);
            break;
        default:
            break;
        }
    }
    if (a.timing && threadIdx.x == 0)
        a.timing[(size_t)a.n_phase * gridDim.x + blockIdx.x] = tm_ar_globaltimer_ns();
    tm_cp_async_wait<0>();
    // The last block out zeroes the task counters for the next launch (every block has taken
    // its last task before it counts itself out).
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(a.barrier + 2 + TM_CHAIN_MAX_PHASE, 1u) == gridDim.x - 1) {
            for (uint32_t i = 0; i < a.n_phase; i++)
                a.barrier[2 + i] = 0;
            a.barrier[2 + TM_CHAIN_MAX_PHASE] = 0;
            __threadfence();
        }
    }
}

extern "C" uint32_t tm_k_chain_splits(uint32_t n_in, uint32_t n_out, uint32_t n_sm,
                                      uint32_t *k_per_split) {
    const uint64_t n_tiles = (n_out + 15) / 16;
    const uint64_t n_warps = (uint64_t)TM_MAX(n_sm, 1u) * TM_CHAIN_WARPS;
    uint64_t n_split = (3 * n_warps + n_tiles - 1) / n_tiles; // about three tasks per warp
    n_split = TM_MIN(n_split, (uint64_t)TM_MAX(n_in / 256, 1u));
    n_split = TM_MIN(n_split, (uint64_t)TM_SKINNY_MAX_SPLIT);
    n_split = TM_MAX(n_split, (uint64_t)1);
    uint32_t kps = (uint32_t)((n_in + n_split - 1) / n_split);
    kps = (kps + 31) / 32 * 32;
    *k_per_split = kps;
    return (n_in + kps - 1) / kps; // no empty split
}

/* [0, 2): the barrier's 64-bit count; [2, 2 + TM_CHAIN_MAX_PHASE): each GEMM phase's next task;
 * then the count of blocks done. */
extern "C" size_t tm_k_chain_barrier_bytes(void) {
    return (2 + TM_CHAIN_MAX_PHASE + 1) * sizeof(uint32_t);
}

template <int D> static cudaError_t chain_prepare(int device, int *ok) {
    cudaError_t e = cudaFuncSetAttribute(chain_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)ring_bytes(D));
    int n = 0;
    if (e == cudaSuccess)
        e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, chain_kernel<D>, CHAIN_THREADS,
                                                          ring_bytes(D));
    (void)device;
    *ok = e == cudaSuccess && n >= 1;
    return e;
}

extern "C" int tm_k_chain_supported(int device) {
    int coop = 0, ok4 = 0, ok8 = 0, ok12 = 0;
    if (cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, device) != cudaSuccess ||
        !coop)
        return 0;
    if (chain_prepare<4>(device, &ok4) != cudaSuccess || chain_prepare<8>(device, &ok8) ||
        chain_prepare<CHAIN_DEPTH_MAX>(device, &ok12)) {
        (void)cudaGetLastError();
        return 0;
    }
    return ok4 && ok8 && ok12;
}

template <int D>
static cudaError_t chain_launch(const tm_k_chain_args *a, cudaStream_t s) {
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeCooperative;
    attr[0].val.cooperative = 1;
    cfg.gridDim = dim3(a->n_sm);
    cfg.blockDim = dim3(CHAIN_THREADS);
    cfg.dynamicSmemBytes = ring_bytes(D);
    cfg.stream = s;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, chain_kernel<D>, *a);
}

extern "C" tm_rc tm_k_chain(const tm_k_chain_args *a, cudaStream_t s, tm_err *err) {
    TM_ASSERT(a->n_phase >= 1 && a->n_phase <= TM_CHAIN_MAX_PHASE && a->n_sm >= 1 && a->barrier);
    for (uint32_t i = 0; i < a->n_phase; i++) {
        const tm_k_chain_phase *p = &a->ph[i];
        switch (p->op) {
        case TM_CHAIN_GEMM: {
            const tm_k_gemm_skinny_args *g = &p->u.gemm;
            TM_ASSERT(g->n_tok >= 1 && g->n_tok <= TM_CHAIN_MAX_TOK &&
                      tm_k_gemm_skinny_fits(g->n_tok, g->n_in, g->n_out));
            TM_ASSERT(g->n_split >= 1 && g->k_per_split % 32 == 0 && g->k_per_split > 0);
            TM_ASSERT((uint64_t)g->n_split * g->k_per_split >= g->n_in &&
                      (uint64_t)(g->n_split - 1) * g->k_per_split < g->n_in);
            TM_ASSERT(((uintptr_t)g->w % 16) == 0 && ((uintptr_t)g->x % 16) == 0 && g->part);
            break;
        }
        case TM_CHAIN_NORM:
            TM_ASSERT(p->u.norm.n_col % 4 == 0 && p->u.norm.out && p->u.norm.x && p->u.norm.w);
            break;
        case TM_CHAIN_ALLREDUCE:
            TM_ASSERT(p->u.ar.world >= 2 && p->u.ar.world <= TM_AR_MAX_RANKS &&
                      p->u.ar.n_tok <= TM_AR_MAX_ROWS && p->u.ar.d % 4 == 0 &&
                      p->u.ar.d <= p->u.ar.d_cap);
            break;
        case TM_CHAIN_ROPE:
            TM_ASSERT(p->u.rope.head_dim % 2 == 0 && p->u.rope.q && p->u.rope.qkv);
            break;
        case TM_CHAIN_SILU:
            TM_ASSERT(p->u.silu.out && p->u.silu.gu);
            break;
        default:
            TM_ASSERT(!"unknown chain phase");
        }
    }
    const uint32_t depth = a->depth ? a->depth : CHAIN_DEPTH_DEFAULT;
    cudaError_t e = depth <= 4    ? chain_launch<4>(a, s)
                    : depth <= 8  ? chain_launch<8>(a, s)
                                  : chain_launch<CHAIN_DEPTH_MAX>(a, s);
    if (e != cudaSuccess)
        return TM_ERR(err, TM_E_CUDA, "chain: launch failed: %s", cudaGetErrorString(e));
    return tm_cuda_launched(err, s, "chain");
}
