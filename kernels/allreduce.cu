/* kernels/allreduce.cu - one-shot all-reduce over peer memory (see allreduce.h).
 *
 * Region layout (uint32 / float words): [2][cap] staging floats, then flags
 * [TM_AR_BLOCKS][TM_AR_MAX_RANKS] (flag [b][p] = the last epoch peer p's block b announced),
 * then epochs [TM_AR_BLOCKS] (this rank's own, read and written only by itself). */
#include "kernels/allreduce.h"
#include "kernels/common.cuh"

#define AR_THREADS 256

static __device__ __forceinline__ void st_release_sys(uint32_t *p, uint32_t v) {
    asm volatile("st.release.sys.global.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
static __device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t *p) {
    uint32_t v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}
static __device__ __forceinline__ uint64_t globaltimer_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

static __device__ __forceinline__ uint32_t *flags_of(void *region, size_t cap) {
    return reinterpret_cast<uint32_t *>(static_cast<float *>(region) + 2 * cap);
}

static __global__ void __launch_bounds__(AR_THREADS) allreduce_kernel(tm_k_allreduce_args a) {
    const uint32_t b = blockIdx.x, tid = threadIdx.x;
    uint32_t *my_flags = flags_of(a.regions[a.rank], a.cap);
    uint32_t *epochs = my_flags + TM_AR_BLOCKS * TM_AR_MAX_RANKS;
    const uint32_t e = epochs[b] + 1, q = e & 1;
    const size_t n_chunk = (a.n + TM_AR_CHUNK - 1) / TM_AR_CHUNK;

    // 1. stage this block's stripes of x in its own buffer q
    float4 *mine = reinterpret_cast<float4 *>(static_cast<float *>(a.regions[a.rank]) + q * a.cap);
    const float4 *x4 = reinterpret_cast<const float4 *>(a.x);
    for (size_t c = b; c < n_chunk; c += TM_AR_BLOCKS) {
        const size_t i0 = c * TM_AR_CHUNK / 4, i1 = min(a.n, (c + 1) * TM_AR_CHUNK) / 4;
        for (size_t i = i0 + tid; i < i1; i += AR_THREADS)
            mine[i] = x4[i];
    }
    __syncthreads();
    // 2. announce epoch e to every peer (the release orders the block's stores before it: the
    //    barrier above made them visible to this thread), then wait for theirs
    if (tid < a.world && tid != a.rank)
        st_release_sys(flags_of(a.regions[tid], a.cap) + b * TM_AR_MAX_RANKS + a.rank, e);
    if (tid < a.world && tid != a.rank) {
        const uint32_t *f = my_flags + b * TM_AR_MAX_RANKS + tid;
        const uint64_t t0 = globaltimer_ns();
        while (ld_acquire_sys(f) < e)
            if (globaltimer_ns() - t0 > (uint64_t)TM_AR_TIMEOUT_S * 1000000000ull)
                __trap(); // a peer never came: dead or hung
    }
    __syncthreads();
    // 3. sum every rank's stripes, in rank order, into x
    float4 *xo = reinterpret_cast<float4 *>(a.x);
    for (size_t c = b; c < n_chunk; c += TM_AR_BLOCKS) {
        const size_t i0 = c * TM_AR_CHUNK / 4, i1 = min(a.n, (c + 1) * TM_AR_CHUNK) / 4;
        for (size_t i = i0 + tid; i < i1; i += AR_THREADS) {
            float4 s = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            for (uint32_t r = 0; r < a.world; r++) {
                const float4 *buf = reinterpret_cast<const float4 *>(
                    static_cast<const float *>(a.regions[r]) + q * a.cap);
                const float4 v = __ldcg(buf + i); // not through L1: peers' memory
                s.x += v.x;
                s.y += v.y;
                s.z += v.z;
                s.w += v.w;
            }
            xo[i] = s;
        }
    }
    if (tid == 0)
        epochs[b] = e;
}

extern "C" size_t tm_k_allreduce_region_bytes(size_t cap) {
    return 2 * cap * sizeof(float) +
           (TM_AR_BLOCKS * TM_AR_MAX_RANKS + TM_AR_BLOCKS) * sizeof(uint32_t);
}

extern "C" tm_rc tm_k_allreduce_sum_f32(const tm_k_allreduce_args *a, cudaStream_t s,
                                        tm_err *err) {
    if (a->n == 0)
        return TM_OK;
    TM_ASSERT(a->world >= 2 && a->world <= TM_AR_MAX_RANKS && a->rank < a->world);
    TM_ASSERT(a->n <= a->cap && a->n % 4 == 0 && a->cap % 4 == 0 && (uintptr_t)a->x % 16 == 0);
    for (uint32_t r = 0; r < a->world; r++)
        TM_ASSERT(a->regions[r] && (uintptr_t)a->regions[r] % 16 == 0);
    allreduce_kernel<<<TM_AR_BLOCKS, AR_THREADS, 0, s>>>(*a);
    return tm_cuda_launched(err, s, "allreduce_sum_f32");
}
