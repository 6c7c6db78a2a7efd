/* runner/tp/tp_host.c - all-reduce and all-gather over host shared memory (see tp_host.h).
 *
 * The segment: a header (joined count, abort flag, the barrier's arrival count and generation,
 * each on its own cache line) and world slots of TM_TP_HOST_CHUNK_BYTES. ftruncate zero-fills a
 * new segment, which is the header's initial state, so any rank may create it. The barrier is a
 * generation barrier: the last rank to arrive resets the count and bumps the generation; the
 * others wait for the bump, checking the abort flag and the timeout. A rank that times out aborts
 * the communicator (the count is no longer trustworthy). All shared words are accessed with
 * sequentially consistent atomics, which also order the plain slot copies around the barriers. */
#include "runner/tp/tp_host.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/clock.h"

#define LINE 64

typedef struct shm_hdr {
    uint32_t joined;
    uint8_t pad0[LINE - 4];
    uint32_t aborted;
    uint8_t pad1[LINE - 4];
    uint32_t arrive;
    uint8_t pad2[LINE - 4];
    uint32_t gen;
    uint8_t pad3[LINE - 4];
} shm_hdr;

struct tm_tp_host {
    uint32_t rank, world;
    uint32_t timeout_ms; /* 0: no limit */
    size_t bytes;        /* of the mapping */
    shm_hdr *hdr;        /* the mapping */
    uint8_t *slots;      /* [world][TM_TP_HOST_CHUNK_BYTES], after hdr */
};

static void seg_name(const uint8_t id[TM_TP_HOST_ID_BYTES], char *name, size_t cap) {
    uint64_t a = 1469598103934665603ull, b = 0x9e3779b97f4a7c15ull; // FNV-1a, two seeds
    for (size_t i = 0; i < TM_TP_HOST_ID_BYTES; i++) {
        a = (a ^ id[i]) * 1099511628211ull;
        b = (b ^ id[i]) * 1099511628211ull;
    }
    snprintf(name, cap, "/tm_tp_%016llx%016llx", (unsigned long long)a, (unsigned long long)b);
}

static uint32_t ld(const uint32_t *p) { return __atomic_load_n(p, __ATOMIC_SEQ_CST); }

static int is_aborted(const tm_tp_host *c) { return ld(&c->hdr->aborted) != 0; }

void tm_tp_host_abort(tm_tp_host *c) {
    if (c)
        __atomic_store_n(&c->hdr->aborted, 1, __ATOMIC_SEQ_CST);
}

tm_rc tm_tp_host_check(tm_tp_host *c, tm_err *err) {
    if (is_aborted(c))
        return TM_ERR(err, TM_E_IO, "tp host all-reduce: aborted (a rank failed)");
    return TM_OK;
}

/* Wait: spin a little, then yield, then sleep 20 us (ranks may outnumber idle cores). */
static void pause_for(uint64_t spin) {
    if (spin < 256)
        return;
    if (spin < 4096) {
        sched_yield();
        return;
    }
    struct timespec ts = {0, 20 * 1000};
    nanosleep(&ts, NULL);
}

static tm_rc barrier(tm_tp_host *c, const char *what, tm_err *err) {
    shm_hdr *h = c->hdr;
    const uint32_t g = ld(&h->gen);
    if (is_aborted(c))
        return tm_tp_host_check(c, err);
    if (__atomic_add_fetch(&h->arrive, 1, __ATOMIC_SEQ_CST) == c->world) {
        __atomic_store_n(&h->arrive, 0, __ATOMIC_SEQ_CST);
        __atomic_add_fetch(&h->gen, 1, __ATOMIC_SEQ_CST);
        return TM_OK;
    }
    const double t0 = tm_now_ms();
    for (uint64_t spin = 0; ld(&h->gen) == g; spin++) {
        if (is_aborted(c))
            return tm_tp_host_check(c, err);
        if (c->timeout_ms && spin % 64 == 0 && tm_now_ms() - t0 > c->timeout_ms) {
            tm_tp_host_abort(c);
            return TM_ERR(err, TM_E_IO,
                          "tp host all-reduce: rank %u of %u waited %.0f s at the %s barrier: a "
                          "rank did not arrive (it died or hung)",
                          c->rank, c->world, c->timeout_ms / 1e3, what);
        }
        pause_for(spin);
    }
    return TM_OK;
}

tm_rc tm_tp_host_create(const uint8_t id[TM_TP_HOST_ID_BYTES], uint32_t rank, uint32_t world,
                        uint32_t timeout_ms, tm_tp_host **out, tm_err *err) {
    if (world < 2 || world > TM_TP_HOST_MAX_RANKS || rank >= world)
        return TM_ERR(err, TM_E_INVAL, "tp host all-reduce: rank %u of %u (2..%u ranks)", rank,
                      world, TM_TP_HOST_MAX_RANKS);
    tm_tp_host *c = tm_calloc(1, sizeof(*c));
    if (!c)
        return TM_ERR(err, TM_E_NOMEM, "tp host all-reduce");
    c->rank = rank, c->world = world, c->timeout_ms = timeout_ms;
    c->bytes = sizeof(shm_hdr) + (size_t)world * TM_TP_HOST_CHUNK_BYTES;
    char name[64];
    seg_name(id, name, sizeof(name));
    const int fd = shm_open(name, O_CREAT | O_RDWR, 0600);
    if (fd < 0) {
        TM_ERR(err, TM_E_IO, "tp host all-reduce: shm_open %s: %s", name, strerror(errno));
        goto fail;
    }
    struct stat sb;
    int ok = fstat(fd, &sb) == 0;
    // the first rank sizes it; a later one must not shrink it (a world mismatch is caught below)
    if (ok && (size_t)sb.st_size < c->bytes)
        ok = ftruncate(fd, (off_t)c->bytes) == 0;
    void *p = ok ? mmap(NULL, c->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
    const int e = errno;
    close(fd);
    if (p == MAP_FAILED) {
        shm_unlink(name);
        TM_ERR(err, TM_E_IO, "tp host all-reduce: mapping %s (%zu bytes): %s", name, c->bytes,
               strerror(e));
        goto fail;
    }
    c->hdr = p;
    c->slots = (uint8_t *)p + sizeof(shm_hdr);
    __atomic_add_fetch(&c->hdr->joined, 1, __ATOMIC_SEQ_CST);
    const double t0 = tm_now_ms();
    for (uint64_t spin = 0; ld(&c->hdr->joined) < world; spin++) {
        if (is_aborted(c) || (timeout_ms && tm_now_ms() - t0 > timeout_ms)) {
            tm_tp_host_abort(c);
            shm_unlink(name);
            TM_ERR(err, TM_E_IO,
                   "tp host all-reduce: %u of %u ranks joined within %.0f s (rank %u waited)",
                   ld(&c->hdr->joined), world, timeout_ms / 1e3, rank);
            goto fail;
        }
        pause_for(spin);
    }
    if (ld(&c->hdr->joined) != world) {
        tm_tp_host_abort(c);
        TM_ERR(err, TM_E_INVAL, "tp host all-reduce: %u ranks joined a communicator of %u",
               ld(&c->hdr->joined), world);
        goto fail;
    }
    if (rank == 0) // every rank has it mapped: nothing left in /dev/shm after the job
        shm_unlink(name);
    *out = c;
    return TM_OK;
fail:
    tm_tp_host_destroy(c);
    return err->rc;
}

void tm_tp_host_destroy(tm_tp_host *c) {
    if (!c)
        return;
    if (c->hdr)
        munmap(c->hdr, c->bytes);
    tm_free(c);
}

static size_t elem_bytes(tm_tp_host_dtype dt) { return dt == TM_TP_HOST_BF16 ? 2 : 4; }

static float bf16_f32(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t f32_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) // NaN stays NaN
        return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

/* out[0..k) = sum over ranks, in rank order, of slot r's first k elements. */
static void sum_slots(const tm_tp_host *c, void *out, size_t k, tm_tp_host_dtype dt) {
    const uint8_t *s = c->slots;
    const size_t stride = TM_TP_HOST_CHUNK_BYTES;
    if (dt == TM_TP_HOST_F32) {
        float *o = out;
        for (size_t i = 0; i < k; i++) {
            float acc = ((const float *)s)[i];
            for (uint32_t r = 1; r < c->world; r++)
                acc += ((const float *)(s + r * stride))[i];
            o[i] = acc;
        }
    } else if (dt == TM_TP_HOST_BF16) {
        uint16_t *o = out;
        for (size_t i = 0; i < k; i++) {
            float acc = bf16_f32(((const uint16_t *)s)[i]);
            for (uint32_t r = 1; r < c->world; r++)
                acc += bf16_f32(((const uint16_t *)(s + r * stride))[i]);
            o[i] = f32_bf16(acc);
        }
    } else {
        uint32_t *o = out;
        for (size_t i = 0; i < k; i++) {
            uint32_t acc = 0;
            for (uint32_t r = 0; r < c->world; r++)
                acc += ((const uint32_t *)(s + r * stride))[i];
            o[i] = acc;
        }
    }
}

tm_rc tm_tp_host_allreduce_sum(tm_tp_host *c, void *buf, size_t n, tm_tp_host_dtype dt,
                               tm_err *err) {
    const size_t es = elem_bytes(dt), per = TM_TP_HOST_CHUNK_BYTES / es;
    uint8_t *b = buf;
    tm_rc rc = tm_tp_host_check(c, err);
    for (size_t i = 0; !rc && i < n; i += per) {
        const size_t k = n - i < per ? n - i : per;
        memcpy(c->slots + (size_t)c->rank * TM_TP_HOST_CHUNK_BYTES, b + i * es, k * es);
        rc = barrier(c, "all-reduce", err);
        if (!rc)
            sum_slots(c, b + i * es, k, dt);
        if (!rc) // nobody may overwrite a slot before every rank has read it
            rc = barrier(c, "all-reduce", err);
    }
    return rc;
}

tm_rc tm_tp_host_allgather(tm_tp_host *c, const void *send, void *recv, size_t n,
                           tm_tp_host_dtype dt, tm_err *err) {
    const size_t es = elem_bytes(dt), per = TM_TP_HOST_CHUNK_BYTES / es;
    const uint8_t *sb = send;
    uint8_t *rb = recv;
    tm_rc rc = tm_tp_host_check(c, err);
    for (size_t i = 0; !rc && i < n; i += per) {
        const size_t k = n - i < per ? n - i : per;
        memcpy(c->slots + (size_t)c->rank * TM_TP_HOST_CHUNK_BYTES, sb + i * es, k * es);
        rc = barrier(c, "all-gather", err);
        for (uint32_t r = 0; !rc && r < c->world; r++)
            memcpy(rb + ((size_t)r * n + i) * es, c->slots + (size_t)r * TM_TP_HOST_CHUNK_BYTES,
                   k * es);
        if (!rc)
            rc = barrier(c, "all-gather", err);
    }
    return rc;
}
