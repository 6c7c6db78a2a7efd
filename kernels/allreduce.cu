/* kernels/allreduce.cu - one-shot all-reduce of a few rows over peer memory, fused with the
 * partial sum before and the RMSNorm after (see allreduce.h).
 *
 * Region layout: lines [2][TM_AR_MAX_ROWS][TM_AR_MAX_RANKS][d_cap / 2] of 16 bytes (line
 * [q][t][src] holds source rank src's row t in buffer q), then epochs [TM_AR_MAX_ROWS] (this
 * rank's own, read and written only by itself). A line is {value, epoch, value, epoch}: it is
 * written with one 16-byte store, so a reader that sees both epochs equal to the call's has both
 * values of that call (NCCL's "LL" protocol); no separate flag, fence or round trip is needed. */
#include "kernels/allreduce.h"
#include "kernels/common.cuh"

#define AR_THREADS 1024
#define AR_PER_THREAD (TM_AR_MAX_D / 4 / AR_THREADS) /* float4 columns per thread, at most */

static __device__ __forceinline__ void st_line(uint4 *p, float a, float b, uint32_t e) {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"l"(p),
                 "r"(__float_as_uint(a)), "r"(e), "r"(__float_as_uint(b)), "r"(e)
                 : "memory");
}
static __device__ __forceinline__ uint4 ld_line(const uint4 *p) {
    uint4 v;
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p)
                 : "memory");
    return v;
}
static __device__ __forceinline__ uint64_t globaltimer_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* Row t of source rank src in buffer q of region. */
static __device__ __forceinline__ uint4 *lines_of(void *region, uint32_t d_cap, uint32_t q,
                                                  uint32_t t, uint32_t src) {
    return static_cast<uint4 *>(region) +
           (((size_t)q * TM_AR_MAX_ROWS + t) * TM_AR_MAX_RANKS + src) * (d_cap / 2);
}

/* Both values of a line once its epochs are e; traps after TM_AR_TIMEOUT_S (a peer never came:
 * dead or hung). */
static __device__ __forceinline__ float2 wait_line(const uint4 *p, uint32_t e) {
    uint4 v = ld_line(p);
    if (v.y != e || v.w != e) {
        const uint64_t t0 = globaltimer_ns();
        do {
            if (globaltimer_ns() - t0 > (uint64_t)TM_AR_TIMEOUT_S * 1000000000ull)
                __trap();
            v = ld_line(p);
        } while (v.y != e || v.w != e);
    }
    return make_float2(__uint_as_float(v.x), __uint_as_float(v.z));
}

static __global__ void __launch_bounds__(AR_THREADS) allreduce_kernel(tm_k_allreduce_args a) {
    const uint32_t t = blockIdx.x, tid = threadIdx.x, d4 = a.d / 4;
    uint32_t *epochs = reinterpret_cast<uint32_t *>(
        lines_of(a.regions[a.rank], a.d_cap, 2, 0, 0)); // just past the lines
    const uint32_t e = epochs[t] + 1, q = e & 1;
    float4 *x4 = reinterpret_cast<float4 *>(a.x + (size_t)t * a.d);

    // 1. this rank's row (beta * x + partials in split order, or x), kept in registers and
    //    pushed to every peer's line [q][t][rank]; all loads are issued before the sums
    float4 mine[AR_PER_THREAD];
#pragma unroll
    for (int k = 0; k < AR_PER_THREAD; k++) {
        const uint32_t i = tid + k * AR_THREADS;
        if (i >= d4)
            break;
        float4 v = x4[i];
        if (a.parts) {
            if (a.beta == 0.0f)
                v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            const float4 *p4 = reinterpret_cast<const float4 *>(a.parts + (size_t)t * a.d) + i;
            for (uint32_t p = 0; p < a.n_part; p++) {
                const float4 u = p4[p * (a.part_stride / 4)];
                v.x += u.x;
                v.y += u.y;
                v.z += u.z;
                v.w += u.w;
            }
        }
        mine[k] = v;
        for (uint32_t r = 0; r < a.world; r++) {
            if (r == a.rank)
                continue;
            uint4 *dst = lines_of(a.regions[r], a.d_cap, q, t, a.rank) + 2 * i;
            st_line(dst, v.x, v.y, e);
            st_line(dst + 1, v.z, v.w, e);
        }
    }
    // 2. sum every rank's row in rank order (the same order, so the same bits, on every rank)
    //    into x; the sum of squares for the norm
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < AR_PER_THREAD; k++) {
        const uint32_t i = tid + k * AR_THREADS;
        if (i >= d4)
            break;
        float4 s = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (uint32_t r = 0; r < a.world; r++) {
            float4 v = mine[k];
            if (r != a.rank) {
                const uint4 *src = lines_of(a.regions[a.rank], a.d_cap, q, t, r) + 2 * i;
                const float2 lo = wait_line(src, e), hi = wait_line(src + 1, e);
                v = make_float4(lo.x, lo.y, hi.x, hi.y);
            }
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
    // 3. RMSNorm of the row (each thread re-reads its own columns of x)
    const float scale = 1.0f / sqrtf(tm_block_sum<AR_THREADS>(ss) / (float)a.d + a.eps);
    const float4 *w4 = reinterpret_cast<const float4 *>(a.w);
    uint2 *o = reinterpret_cast<uint2 *>(a.out + (size_t)t * a.d);
    for (uint32_t i = tid; i < d4; i += AR_THREADS) {
        const float4 v = x4[i], g = w4[i];
        const uint32_t lo = tm_f2bf(g.x * (v.x * scale)) | (uint32_t)tm_f2bf(g.y * (v.y * scale))
                                                               << 16;
        const uint32_t hi = tm_f2bf(g.z * (v.z * scale)) | (uint32_t)tm_f2bf(g.w * (v.w * scale))
                                                               << 16;
        o[i] = make_uint2(lo, hi);
    }
}

extern "C" size_t tm_k_allreduce_region_bytes(uint32_t d_cap) {
    return 2 * (size_t)TM_AR_MAX_ROWS * TM_AR_MAX_RANKS * (d_cap / 2) * 16 +
           TM_AR_MAX_ROWS * sizeof(uint32_t);
}

extern "C" tm_rc tm_k_allreduce_sum_f32(const tm_k_allreduce_args *a, cudaStream_t s, tm_err *err) {
    if (a->n_tok == 0)
        return TM_OK;
    TM_ASSERT(a->world >= 2 && a->world <= TM_AR_MAX_RANKS && a->rank < a->world);
    TM_ASSERT(a->n_tok <= TM_AR_MAX_ROWS && a->d % 4 == 0 && a->d <= a->d_cap &&
              a->d_cap % 4 == 0 && a->d_cap <= TM_AR_MAX_D && (uintptr_t)a->x % 16 == 0);
    TM_ASSERT(!a->parts ||
              (a->n_part >= 1 && a->part_stride % 4 == 0 && (uintptr_t)a->parts % 16 == 0));
    TM_ASSERT(!a->w || (a->out && (uintptr_t)a->w % 16 == 0 && (uintptr_t)a->out % 8 == 0));
    for (uint32_t r = 0; r < a->world; r++)
        TM_ASSERT(a->regions[r] && (uintptr_t)a->regions[r] % 16 == 0);
    allreduce_kernel<<<a->n_tok, AR_THREADS, 0, s>>>(*a);
    return tm_cuda_launched(err, s, "allreduce_sum_f32");
}
