/* runner/engine/cuda/dsv41_engram.c - Engram rows staged from the host's tables to the GPU
 * (dsv41_engram.h): per slot a pinned buffer, a device buffer and an event on one copy stream. */
#include "runner/engine/cuda/dsv41_engram.h"

#include "base/alloc.h"
#include "kernels/common.h"

typedef struct stage_slot {
    tm_engram_table *tab; /* borrowed */
    float *host;          /* pinned [max_rows][dim] */
    float *dev;           /* [max_rows][dim] */
    cudaEvent_t done;     /* the slot's last copy */
    int copied;           /* done was recorded at least once */
} stage_slot;

struct tm_dsv41_engram_stage {
    uint32_t n_slot, dim;
    size_t max_rows;
    cudaStream_t copy;
    stage_slot *slot; /* [n_slot] */
};

void tm_dsv41_engram_stage_destroy(tm_dsv41_engram_stage *st) {
    if (!st)
        return;
    if (st->copy)
        cudaStreamSynchronize(st->copy);
    for (uint32_t i = 0; st->slot && i < st->n_slot; i++) {
        stage_slot *s = &st->slot[i];
        if (s->host)
            cudaFreeHost(s->host);
        if (s->dev)
            cudaFree(s->dev);
        if (s->done)
            cudaEventDestroy(s->done);
    }
    if (st->copy)
        cudaStreamDestroy(st->copy);
    tm_free(st->slot);
    tm_free(st);
}

tm_rc tm_dsv41_engram_stage_create(tm_engram_table *const *tabs, uint32_t n_tab, size_t max_rows,
                                   tm_dsv41_engram_stage **out, tm_err *err) {
    *out = NULL;
    if (n_tab == 0 || max_rows == 0)
        return TM_ERR(err, TM_E_INVAL, "engram stage: %u tables, %zu rows per step (both >= 1)",
                      n_tab, max_rows);
    const uint32_t dim = tm_engram_table_info_get(tabs[0])->dim;
    for (uint32_t i = 1; i < n_tab; i++)
        if (tm_engram_table_info_get(tabs[i])->dim != dim)
            return TM_ERR(err, TM_E_INVAL, "engram stage: table %u has dim %u, table 0 dim %u", i,
                          tm_engram_table_info_get(tabs[i])->dim, dim);
    tm_dsv41_engram_stage *st = tm_calloc(1, sizeof(*st));
    if (!st || !(st->slot = tm_calloc(n_tab, sizeof(stage_slot)))) {
        tm_free(st);
        return TM_ERR(err, TM_E_NOMEM, "engram stage: out of memory");
    }
    st->n_slot = n_tab;
    st->dim = dim;
    st->max_rows = max_rows;
    const size_t bytes = max_rows * dim * sizeof(float);
    tm_rc rc = TM_CUDA_CHECK(cudaStreamCreateWithFlags(&st->copy, cudaStreamNonBlocking), err);
    for (uint32_t i = 0; !rc && i < n_tab; i++) {
        stage_slot *s = &st->slot[i];
        s->tab = tabs[i];
        rc = TM_CUDA_CHECK(cudaHostAlloc((void **)&s->host, bytes, cudaHostAllocDefault), err);
        if (!rc)
            rc = TM_CUDA_CHECK(cudaMalloc((void **)&s->dev, bytes), err);
        if (!rc)
            rc = TM_CUDA_CHECK(cudaEventCreateWithFlags(&s->done, cudaEventDisableTiming), err);
    }
    if (rc) {
        tm_dsv41_engram_stage_destroy(st);
        return rc;
    }
    *out = st;
    return TM_OK;
}

void tm_dsv41_engram_stage_prefetch(tm_dsv41_engram_stage *st, uint32_t slot, const uint64_t *rows,
                                    size_t n) {
    if (slot < st->n_slot && n)
        tm_engram_table_prefetch(st->slot[slot].tab, rows, TM_MIN(n, st->max_rows));
}

tm_rc tm_dsv41_engram_stage_upload(tm_dsv41_engram_stage *st, uint32_t slot, const uint64_t *rows,
                                   size_t n, tm_err *err) {
    if (slot >= st->n_slot || n > st->max_rows)
        return TM_ERR(err, TM_E_INVAL, "engram stage: slot %u of %u, %zu rows of at most %zu", slot,
                      st->n_slot, n, st->max_rows);
    stage_slot *s = &st->slot[slot];
    if (s->copied) { // the pinned buffer is still the source of the previous copy until it ends
        tm_rc rc = TM_CUDA_CHECK(cudaEventSynchronize(s->done), err);
        if (rc)
            return rc;
    }
    if (n == 0)
        return TM_OK;
    tm_rc rc = tm_engram_table_get(s->tab, rows, n, s->host, err);
    if (rc)
        return rc;
    rc = TM_CUDA_CHECK(cudaMemcpyAsync(s->dev, s->host, n * st->dim * sizeof(float),
                                       cudaMemcpyHostToDevice, st->copy),
                       err);
    if (!rc)
        rc = TM_CUDA_CHECK(cudaEventRecord(s->done, st->copy), err);
    if (!rc)
        s->copied = 1;
    return rc;
}

tm_rc tm_dsv41_engram_stage_wait(tm_dsv41_engram_stage *st, uint32_t slot, cudaStream_t s,
                                 const float **dev_rows, tm_err *err) {
    if (slot >= st->n_slot)
        return TM_ERR(err, TM_E_INVAL, "engram stage: slot %u of %u", slot, st->n_slot);
    stage_slot *sl = &st->slot[slot];
    if (dev_rows)
        *dev_rows = sl->dev;
    return sl->copied ? TM_CUDA_CHECK(cudaStreamWaitEvent(s, sl->done, 0), err) : TM_OK;
}

tm_rc tm_dsv41_engram_stage_zero(tm_dsv41_engram_stage *st, tm_err *err) {
    tm_rc rc = TM_CUDA_CHECK(cudaStreamSynchronize(st->copy), err);
    for (uint32_t i = 0; !rc && i < st->n_slot; i++)
        rc = TM_CUDA_CHECK(cudaMemset(st->slot[i].dev, 0, st->max_rows * st->dim * sizeof(float)),
                           err);
    if (!rc)
        rc = TM_CUDA_CHECK(cudaDeviceSynchronize(), err);
    return rc;
}

uint32_t tm_dsv41_engram_stage_dim(const tm_dsv41_engram_stage *st) { return st->dim; }
