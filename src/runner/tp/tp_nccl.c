/* runner/tp/tp_nccl.c - NCCL wrapper (see tp_nccl.h). Compiled in every build; the NCCL part only
 * when TM_HAVE_CUDA is defined (tm_runner links NCCL then). */
#include "runner/tp/tp_nccl.h"

#ifdef TM_HAVE_CUDA

#include <cuda_runtime_api.h>
#include <errno.h>
#include <nccl.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "base/alloc.h"
#include "base/clock.h"

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

/* ncclCommInitRank blocks until every rank has joined, with no time limit. It runs on a thread
 * of its own so that create can give up after the timeout; an abandoned thread keeps waiting
 * (NCCL offers no way to cancel a blocking init) and aborts the communicator if it ever
 * completes. The job shared by both threads is freed by whichever finishes last. */
typedef struct init_job {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int device; /* the caller's current CUDA device, set on the thread */
    ncclUniqueId id;
    int world, rank;
    ncclComm_t comm; /* results, once done */
    ncclResult_t r;
    const char *last; /* ncclGetLastError after a failure (static storage of NCCL) */
    int done, abandoned;
} init_job;

static void init_job_free(init_job *j) {
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    tm_free(j);
}

static void *init_main(void *arg) {
    init_job *j = arg;
    ncclComm_t comm = NULL;
    ncclResult_t r = cudaSetDevice(j->device) == cudaSuccess
                         ? ncclCommInitRank(&comm, j->world, j->id, j->rank)
                         : ncclInvalidUsage;
    pthread_mutex_lock(&j->mu);
    j->comm = comm;
    j->r = r;
    j->last = r != ncclSuccess ? ncclGetLastError(NULL) : NULL;
    j->done = 1;
    const int abandoned = j->abandoned;
    pthread_cond_signal(&j->cv);
    pthread_mutex_unlock(&j->mu);
    if (abandoned) { // create gave up on us: nobody will use this communicator
        if (r == ncclSuccess)
            ncclCommAbort(comm);
        init_job_free(j);
    }
    return NULL;
}

tm_rc tm_nccl_create(const uint8_t id[TM_NCCL_ID_BYTES], uint32_t rank, uint32_t world,
                     uint32_t timeout_ms, tm_nccl **out, tm_err *err) {
    init_job *j = tm_calloc(1, sizeof(*j));
    if (!j)
        return TM_ERR(err, TM_E_NOMEM, "nccl communicator");
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    memcpy(&j->id, id, sizeof(j->id));
    j->world = (int)world;
    j->rank = (int)rank;
    if (cudaGetDevice(&j->device) != cudaSuccess) {
        init_job_free(j);
        return TM_ERR(err, TM_E_CUDA, "nccl: no current CUDA device");
    }
    pthread_t th;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    const int started = pthread_create(&th, &at, init_main, j) == 0;
    pthread_attr_destroy(&at);
    if (!started) {
        init_job_free(j);
        return TM_ERR(err, TM_E_INTERNAL, "nccl: cannot start the init thread");
    }
    struct timespec dl;
    tm_deadline_in_ms(&dl, (long)timeout_ms);
    pthread_mutex_lock(&j->mu);
    int timed_out = 0;
    while (!j->done && !timed_out) {
        if (timeout_ms == 0)
            pthread_cond_wait(&j->cv, &j->mu);
        else
            timed_out = pthread_cond_timedwait(&j->cv, &j->mu, &dl) == ETIMEDOUT;
    }
    if (!j->done) {
        j->abandoned = 1; // the thread frees the job
        pthread_mutex_unlock(&j->mu);
        return TM_ERR(err, TM_E_NCCL,
                      "nccl: the communicator of %u ranks was not complete after %.0f s (rank %u "
                      "waited): a rank did not join NCCL (it died or hung after the rendezvous, "
                      "or the network blocks NCCL's own connections between the nodes)",
                      world, timeout_ms / 1e3, rank);
    }
    pthread_mutex_unlock(&j->mu);
    const ncclResult_t r = j->r;
    ncclComm_t comm = j->comm;
    const char *last = j->last;
    init_job_free(j);
    if (r != ncclSuccess)
        return TM_ERR(err, TM_E_NCCL, "nccl: ncclCommInitRank: %s%s%s", ncclGetErrorString(r),
                      last && last[0] ? ": " : "", last ? last : "");
    tm_nccl *c = tm_calloc(1, sizeof(*c));
    if (!c) {
        ncclCommDestroy(comm);
        return TM_ERR(err, TM_E_NOMEM, "nccl communicator");
    }
    c->comm = comm;
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

#define NO_NCCL(err)                                                                               \
    TM_ERR((err), TM_E_INVAL, "nccl: built without NCCL (configure with -DTM_CUDA=ON)")

tm_rc tm_nccl_get_id(uint8_t id[TM_NCCL_ID_BYTES], tm_err *err) {
    (void)id;
    return NO_NCCL(err);
}
tm_rc tm_nccl_create(const uint8_t id[TM_NCCL_ID_BYTES], uint32_t rank, uint32_t world,
                     uint32_t timeout_ms, tm_nccl **out, tm_err *err) {
    (void)id, (void)rank, (void)world, (void)timeout_ms, (void)out;
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
