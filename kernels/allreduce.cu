/* kernels/allreduce.cu - one-shot all-reduce of a few rows over peer memory, fused with the
 * partial sum before and the RMSNorm after (see allreduce.h).
 *
 * Region layout: [2][TM_AR_MAX_ROWS][d_cap] staging floats, then flags
 * [TM_AR_MAX_ROWS][TM_AR_MAX_RANKS] uint32 (flag [t][p] = the last epoch peer p announced for
 * row t), then epochs [TM_AR_MAX_ROWS] (this rank's own, read and written only by itself). */
#include "kernels/allreduce.h"
#include "kernels/common.cuh"

#define AR_THREADS 512

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

static __device__ __forceinline__ uint32_t *flags_of(void *region, uint32_t d_cap) {
    return reinterpret_cast<uint32_t *>(static_cast<float *>(region) +
                                        2 * (size_t)TM_AR_MAX_ROWS * d_cap);
}

static __global__ void __launch_bounds__(AR_THREADS) allreduce_kernel(tm_k_allreduce_args a) {
    const uint32_t t = blockIdx.x, tid = threadIdx.x, d4 = a.d / 4;
    uint32_t *my_flags = flags_of(a.regions[a.rank], a.d_cap);
    uint32_t *epochs = my_flags + TM_AR_MAX_ROWS * TM_AR_MAX_RANKS;
    const uint32_t e = epochs[t] + 1, q = e & 1;
    const size_t slot = ((size_t)q * TM_AR_MAX_ROWS + t) * a.d_cap; // row t of buffer q

    // 1. stage this rank's row: beta * x + partials in split order, or x
    float4 *x4 = reinterpret_cast<float4 *>(a.x + (size_t)t * a.d);
    float4 *mine = reinterpret_cast<float4 *>(static_cast<float *>(a.regions[a.rank]) + slot);
    for (uint32_t i = tid; i < d4; i += AR_THREADS) {
        float4 v = x4[i];
        if (a.parts) {
            if (a.beta == 0.0f)
                v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            const float4 *p4 = reinterpret_cast<const float4 *>(a.parts + (size_t)t * a.d);
            for (uint32_t p = 0; p < a.n_part; p++) {
                const float4 u = p4[p * (a.part_stride / 4) + i];
                v.x += u.x;
                v.y += u.y;
                v.z += u.z;
                v.w += u.w;
            }
        }
        mine[i] = v;
    }
    __syncthreads();
    // 2. announce epoch e to every peer (the release orders the block's stores, published to
    //    this thread by the barrier, before it), then wait for theirs
    if (tid < a.world && tid != a.rank) {
        st_release_sys(flags_of(a.regions[tid], a.d_cap) + t * TM_AR_MAX_RANKS + a.rank, e);
        const uint32_t *f = my_flags + t * TM_AR_MAX_RANKS + tid;
        const uint64_t t0 = globaltimer_ns();
        while (ld_acquire_sys(f) < e)
            if (globaltimer_ns() - t0 > (uint64_t)TM_AR_TIMEOUT_S * 1000000000ull)
                __trap(); // a peer never came: dead or hung
    }
    __syncthreads();
    // 3. sum the rows of every rank in rank order into x; the sum of squares for the norm
    float ss = 0.0f;
    for (uint32_t i = tid; i < d4; i += AR_THREADS) {
        float4 s = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (uint32_t r = 0; r < a.world; r++) {
            const float4 *buf =
                reinterpret_cast<const float4 *>(static_cast<const float *>(a.regions[r]) + slot);
            const float4 v = __ldcg(buf + i); // not through L1: peers' memory
            s.x += v.x;
            s.y += v.y;
            s.z += v.z;
            s.w += v.w;
        }
        x4[i] = s;
        ss += s.x * s.x + s.y * s.y + s.z * s.z + s.w * s.w;
    }
    if (tid == 0)
        epochs[t] = e;
    if (!a.w)
        return;
    // 4. RMSNorm of the row (each thread re-reads its own columns of x)
    const float scale = 1.0f / sqrtf(tm_block_sum<AR_THREADS>(ss) / (float)a.d + a.eps);
    const float4 *w4 = reinterpret_cast<const float4 *>(a.w);
    uint2 *o = reinterpret_cast<uint2 *>(a.out + (size_t)t * a.d);
    for (uint32_t i = tid; i < d4; i += AR_THREADS) {
        const float4 v = x4[i], g = w4[i];
        const uint32_t lo =
            tm_f2bf(g.x * (v.x * scale)) | (uint32_t)tm_f2bf(g.y * (v.y * scale)) << 16;
        const uint32_t hi =
            tm_f2bf(g.z * (v.z * scale)) | (uint32_t)tm_f2bf(g.w * (v.w * scale)) << 16;
        o[i] = make_uint2(lo, hi);
    }
}

extern "C" size_t tm_k_allreduce_region_bytes(uint32_t d_cap) {
    return 2 * (size_t)TM_AR_MAX_ROWS * d_cap * sizeof(float) +
           (TM_AR_MAX_ROWS * TM_AR_MAX_RANKS + TM_AR_MAX_ROWS) * sizeof(uint32_t);
}

extern "C" tm_rc tm_k_allreduce_sum_f32(const tm_k_allreduce_args *a, cudaStream_t s,
                                        tm_err *err) {
    if (a->n_tok == 0)
        return TM_OK;
    TM_ASSERT(a->world >= 2 && a->world <= TM_AR_MAX_RANKS && a->rank < a->world);
    TM_ASSERT(a->n_tok <= TM_AR_MAX_ROWS && a->d % 4 == 0 && a->d <= a->d_cap &&
              a->d_cap % 4 == 0 && (uintptr_t)a->x % 16 == 0);
    TM_ASSERT(!a->parts || (a->n_part >= 1 && a->part_stride % 4 == 0 &&
                            (uintptr_t)a->parts % 16 == 0));
    TM_ASSERT(!a->w || (a->out && (uintptr_t)a->w % 16 == 0 && (uintptr_t)a->out % 8 == 0));
    for (uint32_t r = 0; r < a->world; r++)
        TM_ASSERT(a->regions[r] && (uintptr_t)a->regions[r] % 16 == 0);
    allreduce_kernel<<<a->n_tok, AR_THREADS, 0, s>>>(*a);
    return tm_cuda_launched(err, s, "allreduce_sum_f32");
}
