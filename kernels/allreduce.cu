/* kernels/allreduce.cu - one-shot all-reduce of a few rows over peer memory, fused with the
 * partial sum before and the RMSNorm after (see allreduce.h; a row's code and the region layout
 * in kernels/allreduce.cuh). One block per row. */
#include "kernels/allreduce.cuh"

#define AR_THREADS 1024

static __global__ void __launch_bounds__(AR_THREADS) allreduce_kernel(tm_k_allreduce_args a) {
    tm_allreduce_row<AR_THREADS>(a, blockIdx.x);
}

extern "C" size_t tm_k_allreduce_region_bytes(uint32_t d_cap) {
    return 2 * (size_t)TM_AR_MAX_ROWS * TM_AR_MAX_RANKS * (d_cap / 2) * 16 +
           TM_AR_MAX_ROWS * sizeof(uint32_t);
}

extern "C" tm_rc tm_k_allreduce_sum_f32(const tm_k_allreduce_args *a, cudaStream_t s,
                                        tm_err *err) {
    if (a->n_tok == 0)
        return TM_OK;
    TM_ASSERT(a->world >= 2 && a->world <= TM_AR_MAX_RANKS && a->rank < a->world);
    TM_ASSERT(a->n_tok <= TM_AR_MAX_ROWS && a->d % 4 == 0 && a->d <= a->d_cap &&
              a->d_cap % 4 == 0 && a->d_cap <= TM_AR_MAX_D && (uintptr_t)a->x % 16 == 0);
    TM_ASSERT(!a->parts || (a->n_part >= 1 && a->part_stride % 4 == 0 &&
                            (uintptr_t)a->parts % 16 == 0));
    TM_ASSERT(!a->w || (a->out && (uintptr_t)a->w % 16 == 0 && (uintptr_t)a->out % 8 == 0));
    for (uint32_t r = 0; r < a->world; r++)
        TM_ASSERT(a->regions[r] && (uintptr_t)a->regions[r] % 16 == 0);
    allreduce_kernel<<<a->n_tok, AR_THREADS, 0, s>>>(*a);
    return tm_cuda_launched(err, s, "allreduce_sum_f32");
}
