/* runner/tp_nccl.c - NCCL wrapper (see tp_nccl.h). Compiled in every build; the NCCL part only
 * when TM_HAVE_CUDA is defined (tm_runner links NCCL then). */
#include "runner/tp_nccl.h"

#ifdef TM_HAVE_CUDA

#include <nccl.h>
#include <string.h>

#include "base/alloc.h"

struct tm_nccl {
    ncclComm_t comm;
    uint32_t rank, world;
    int aborted; /* atomic: 1 once ncclCommAbort ran (comm must not be used again) */
};

static int is_aborted(tm_nccl *c) { return __atomic_load_n(&c->aborted, __ATOMIC_ACQUIRE); }

static tm_rc nccl_fail(ncclResult_t r, ncclComm_t comm, const char *what, tm_err *err) {
    const char *last = comm ? ncclGetLastError(comm) : ncclGetLastError(NULL);
    return TM_ERR(err, TM_E_NCCL, "nccl: %s: %s%s%s", what, ncclGetErrorString(r),
                  last && last[0] ? ": " : "", last ? last : "");
}

#define NCCL_TRY(call, comm, err)                                                                  \
    do {                                                                                           \
        ncclResult_t r_ = (call);                                                                  \
        if (r_ != ncclSuccess)                                                                     \
            return nccl_fail(r_, (comm), #call, (err));                                            \
    } while (0)

static ncclDataType_t nccl_type(tm_nccl_dtype dt) {
    switch (dt) {
    case TM_NCCL_BF16:
        return ncclBfloat16;
    case TM_NCCL_U32:
        return ncclUint32;
    case TM_NCCL_F32:
    default:
        return ncclFloat32;
    }
}

tm_rc tm_nccl_get_id(uint8_t id[TM_NCCL_ID_BYTES], tm_err *err) {
    _Static_assert(sizeof(ncclUniqueId) == TM_NCCL_ID_BYTES, "ncclUniqueId size");
    ncclUniqueId u;
    NCCL_TRY(ncclGetUniqueId(&u), NULL, err);
    memcpy(id, &u, sizeof(u));
    return TM_OK;
}

tm_rc tm_nccl_create(const uint8_t id[TM_NCCL_ID_BYTES], uint32_t rank, uint32_t world,
                     tm_nccl **out, tm_err *err) {
    tm_nccl *c = tm_calloc(1, sizeof(*c));
    if (!c)
        return TM_ERR(err, TM_E_NOMEM, "nccl communicator");
    ncclUniqueId u;
    memcpy(&u, id, sizeof(u));
    ncclResult_t r = ncclCommInitRank(&c->comm, (int)world, u, (int)rank);
    if (r != ncclSuccess) {
        tm_rc rc = nccl_fail(r, NULL, "ncclCommInitRank", err);
        tm_free(c);
        return rc;
    }
    c->rank = rank;
    c->world = world;
    *out = c;
    return TM_OK;
}

void tm_nccl_destroy(tm_nccl *c) {
    if (!c)
        return;
    if (!is_aborted(c))
        ncclCommDestroy(c->comm);
    tm_free(c);
}

void tm_nccl_abort(tm_nccl *c) {
    if (!c || __atomic_exchange_n(&c->aborted, 1, __ATOMIC_ACQ_REL))
        return;
    ncclCommAbort(c->comm);
}

#define CHECK_ALIVE(c, err)                                                                        \
    do {                                                                                           \
        if (is_aborted(c))                                                                         \
            return TM_ERR((err), TM_E_NCCL, "nccl: communicator aborted (a rank failed)");         \
    } while (0)

tm_rc tm_nccl_allreduce_sum(tm_nccl *c, void *buf, size_t n, tm_nccl_dtype dt, void *stream,
                            tm_err *err) {
    CHECK_ALIVE(c, err);
    NCCL_TRY(ncclAllReduce(buf, buf, n, nccl_type(dt), ncclSum, c->comm, (cudaStream_t)stream),
             c->comm, err);
    return TM_OK;
}

tm_rc tm_nccl_allgather(tm_nccl *c, const void *send, void *recv, size_t n, tm_nccl_dtype dt,
                        void *stream, tm_err *err) {
    CHECK_ALIVE(c, err);
    NCCL_TRY(ncclAllGather(send, recv, n, nccl_type(dt), c->comm, (cudaStream_t)stream), c->comm,
             err);
    return TM_OK;
}

tm_rc tm_nccl_check(tm_nccl *c, tm_err *err) {
    CHECK_ALIVE(c, err);
    ncclResult_t ae = ncclSuccess;
    NCCL_TRY(ncclCommGetAsyncError(c->comm, &ae), c->comm, err);
    if (ae != ncclSuccess && ae != ncclInProgress)
        return nccl_fail(ae, c->comm, "asynchronous error", err);
    return TM_OK;
}

int tm_nccl_version(void) {
    int v = 0;
    if (ncclGetVersion(&v) != ncclSuccess)
        return 0;
    return v;
}

int tm_nccl_header_version(void) { return NCCL_VERSION_CODE; }

#else /* !TM_HAVE_CUDA */

#define NO_NCCL(err) TM_ERR((err), TM_E_INVAL, "nccl: built without NCCL (configure with -DTM_CUDA=ON)")

tm_rc tm_nccl_get_id(uint8_t id[TM_NCCL_ID_BYTES], tm_err *err) {
    (void)id;
    return NO_NCCL(err);
}
tm_rc tm_nccl_create(const uint8_t id[TM_NCCL_ID_BYTES], uint32_t rank, uint32_t world,
                     tm_nccl **out, tm_err *err) {
    (void)id, (void)rank, (void)world, (void)out;
    return NO_NCCL(err);
}
void tm_nccl_destroy(tm_nccl *c) { (void)c; }
void tm_nccl_abort(tm_nccl *c) { (void)c; }
tm_rc tm_nccl_allreduce_sum(tm_nccl *c, void *buf, size_t n, tm_nccl_dtype dt, void *stream,
                            tm_err *err) {
    (void)c, (void)buf, (void)n, (void)dt, (void)stream;
    return NO_NCCL(err);
}
tm_rc tm_nccl_allgather(tm_nccl *c, const void *send, void *recv, size_t n, tm_nccl_dtype dt,
                        void *stream, tm_err *err) {
    (void)c, (void)send, (void)recv, (void)n, (void)dt, (void)stream;
    return NO_NCCL(err);
}
tm_rc tm_nccl_check(tm_nccl *c, tm_err *err) {
    (void)c;
    return NO_NCCL(err);
}
int tm_nccl_version(void) { return 0; }
int tm_nccl_header_version(void) { return 0; }

#endif /* TM_HAVE_CUDA */
