/* runner/tp/rendezvous.c - TCP rendezvous and control channel (see rendezvous.h). Blocking sockets
 * with poll() for every wait that has a deadline; MSG_NOSIGNAL so a dead peer gives EPIPE, not
 * SIGPIPE. */
#include "runner/tp/rendezvous.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/clock.h"

#define MAGIC 0x544d5244u /* "TMRD" */
#define HOST_BYTES 64
#define HELLO_WAIT_MS 5000 /* an accepted peer must introduce itself this fast */

enum { MSG_HELLO = 1, MSG_WELCOME, MSG_REJECT, MSG_REPORT };

typedef struct msg_hdr {
    uint32_t magic, type, len;
} msg_hdr;

typedef struct hello_msg {
    uint32_t rank, world;
    char host[HOST_BYTES]; /* NUL-terminated */
} hello_msg;

struct tm_rdzv {
    uint32_t rank, world, timeout_ms;
    char addr[256];
    uint16_t port;
    int listen_fd;             /* rank 0 only; -1 otherwise */
    int *fds;                  /* rank 0: [world], fds[r] is rank r's connection (fds[0] = -1);
                                  other ranks: [1], the connection to rank 0 */
    char (*hosts)[HOST_BYTES]; /* [world] peer host names, for messages */
};

static void set_sock_opts(int fd) {
    int one = 1, idle = 30, intvl = 10, cnt = 3;
    unsigned user_timeout_ms = 60000;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms, sizeof(user_timeout_ms));
}

static int ms_left(double deadline_ms) {
    double left = deadline_ms - tm_now_ms();
    return left <= 0 ? 0 : left > 1e9 ? 1000000000 : (int)left + 1;
}

/* Send all iov bytes. Returns 0 or an errno value. */
static int send_iov(int fd, struct iovec *iov, int n_iov) {
    while (n_iov > 0) {
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n_iov};
        ssize_t k = sendmsg(fd, &mh, MSG_NOSIGNAL);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return errno;
        }
        while (n_iov > 0 && (size_t)k >= iov->iov_len) { // drop what went out whole
            k -= (ssize_t)iov->iov_len;
            iov++, n_iov--;
        }
        if (n_iov > 0) {
            iov->iov_base = (char *)iov->iov_base + k;
            iov->iov_len -= (size_t)k;
        }
    }
    return 0;
}

static int send_msg(int fd, uint32_t type, const void *a, size_t na, const void *b, size_t nb) {
    msg_hdr h = {.magic = MAGIC, .type = type, .len = (uint32_t)(na + nb)};
    struct iovec iov[3] = {{&h, sizeof(h)}, {(void *)a, na}, {(void *)b, nb}};
    return send_iov(fd, iov, 3);
}

/* Read exactly n bytes. deadline_ms < 0: no deadline. Returns 0, -1 on EOF, -2 on timeout, or an
 * errno value. */
static int read_full(int fd, void *buf, size_t n, double deadline_ms) {
    char *p = buf;
    while (n > 0) {
        if (deadline_ms >= 0) {
            struct pollfd pf = {.fd = fd, .events = POLLIN};
            int pr = poll(&pf, 1, ms_left(deadline_ms));
            if (pr < 0 && errno == EINTR)
                continue;
            if (pr < 0)
                return errno;
            if (pr == 0)
                return -2;
        }
        ssize_t k = recv(fd, p, n, 0);
        if (k == 0)
            return -1;
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return errno;
        }
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

static const char *read_err_str(int e) {
    return e == -1 ? "connection closed" : e == -2 ? "timed out" : strerror(e);
}

static tm_rc resolve(const char *addr, uint16_t port, int passive, struct addrinfo **res,
                     tm_err *err) {
    char ps[16];
    snprintf(ps, sizeof(ps), "%u", port);
    struct addrinfo hints = {
        .ai_family = AF_INET, .ai_socktype = SOCK_STREAM, .ai_flags = passive ? AI_PASSIVE : 0};
    int g = getaddrinfo(addr, ps, &hints, res);
    if (g != 0)
        return TM_ERR(err, TM_E_IO, "rendezvous: cannot resolve %s: %s", addr, gai_strerror(g));
    return TM_OK;
}

static tm_rc check_cfg(const tm_rdzv_cfg *cfg, tm_err *err) {
    if (!cfg->addr || !cfg->addr[0] || strlen(cfg->addr) >= 256)
        return TM_ERR(err, TM_E_INVAL, "rendezvous: no master address");
    if (cfg->world < 2 || cfg->rank >= cfg->world)
        return TM_ERR(err, TM_E_INVAL, "rendezvous: rank %u of world %u", cfg->rank, cfg->world);
    return TM_OK;
}

static tm_rdzv *rdzv_new(const tm_rdzv_cfg *cfg, uint32_t n_fd, tm_err *err) {
    tm_rdzv *r = tm_calloc(1, sizeof(*r));
    if (!r) {
        TM_ERR(err, TM_E_NOMEM, "rendezvous state");
        return NULL;
    }
    r->rank = cfg->rank;
    r->world = cfg->world;
    r->timeout_ms = cfg->timeout_ms;
    snprintf(r->addr, sizeof(r->addr), "%s", cfg->addr);
    r->port = cfg->port;
    r->listen_fd = -1;
    r->fds = tm_calloc(n_fd, sizeof(*r->fds));
    r->hosts = tm_calloc(cfg->world, sizeof(*r->hosts));
    if (!r->fds || !r->hosts) {
        TM_ERR(err, TM_E_NOMEM, "rendezvous state for %u ranks", cfg->world);
        tm_free(r->fds);
        tm_free(r->hosts);
        tm_free(r);
        return NULL;
    }
    for (uint32_t i = 0; i < n_fd; i++)
        r->fds[i] = -1;
    return r;
}

tm_rc tm_rdzv_listen(const tm_rdzv_cfg *cfg, tm_rdzv **out, tm_err *err) {
    tm_rc rc = check_cfg(cfg, err);
    if (rc)
        return rc;
    if (cfg->rank != 0)
        return TM_ERR(err, TM_E_INVAL, "rendezvous: only rank 0 listens (this is rank %u)",
                      cfg->rank);
    tm_rdzv *r = rdzv_new(cfg, cfg->world, err);
    if (!r)
        return err->rc;
    struct addrinfo *ai = NULL;
    rc = resolve(cfg->addr, cfg->port, 1, &ai, err);
    if (rc)
        goto fail;
    r->listen_fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    int one = 1;
    if (r->listen_fd < 0 ||
        setsockopt(r->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
        bind(r->listen_fd, ai->ai_addr, ai->ai_addrlen) != 0 ||
        listen(r->listen_fd, (int)TM_MIN(cfg->world + 16, 4096u)) != 0) {
        rc = TM_ERR(err, TM_E_IO, "rendezvous: cannot listen on %s:%u: %s", cfg->addr, cfg->port,
                    strerror(errno));
        goto fail;
    }
    struct sockaddr_in sa;
    socklen_t sl = sizeof(sa);
    if (getsockname(r->listen_fd, (struct sockaddr *)&sa, &sl) == 0)
        r->port = ntohs(sa.sin_port);
    freeaddrinfo(ai);
    gethostname(r->hosts[0], HOST_BYTES - 1);
    *out = r;
    return TM_OK;
fail:
    if (ai)
        freeaddrinfo(ai);
    tm_rdzv_close(r);
    return rc;
}

static void reject(int fd, const char *why) {
    send_msg(fd, MSG_REJECT, why, strlen(why) + 1, NULL, 0);
}

tm_rc tm_rdzv_accept(tm_rdzv *r, const void *blob, size_t len, tm_err *err) {
    TM_ASSERT(r->rank == 0 && r->listen_fd >= 0);
    if (len > TM_RDZV_MAX_BLOB)
        return TM_ERR(err, TM_E_INVAL, "rendezvous: blob of %zu bytes", len);
    const double deadline = tm_now_ms() + r->timeout_ms;
    uint32_t n_joined = 0;
    while (n_joined < r->world - 1) {
        struct pollfd pf = {.fd = r->listen_fd, .events = POLLIN};
        int pr = poll(&pf, 1, ms_left(deadline));
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr <= 0) {
            char missing[256] = "";
            size_t off = 0;
            for (uint32_t k = 1; k < r->world && off < sizeof(missing) - 16; k++)
                if (r->fds[k] < 0)
                    off += (size_t)snprintf(missing + off, sizeof(missing) - off, "%s%u",
                                            off ? ", " : "", k);
            return TM_ERR(err, TM_E_IO,
                          "rendezvous on %s:%u: only %u of %u ranks joined within %.3g s; "
                          "missing rank(s) %s (did they start, with the same --master-addr, "
                          "--master-port and --nnodes? is the port reachable?)",
                          r->addr, r->port, n_joined + 1, r->world, r->timeout_ms / 1e3, missing);
        }
        int fd = accept4(r->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            continue;
        hello_msg h;
        msg_hdr mh;
        double hello_deadline = TM_MIN(deadline, tm_now_ms() + HELLO_WAIT_MS);
        if (read_full(fd, &mh, sizeof(mh), hello_deadline) != 0 || mh.magic != MAGIC ||
            mh.type != MSG_HELLO || mh.len != sizeof(h) ||
            read_full(fd, &h, sizeof(h), hello_deadline) != 0) {
            close(fd); // not one of ours (or too slow): ignore it
            continue;
        }
        h.host[HOST_BYTES - 1] = 0;
        char why[256] = "";
        if (h.world != r->world)
            snprintf(why, sizeof(why), "rank %u on %s says world size %u, rank 0 has %u", h.rank,
                     h.host, h.world, r->world);
        else if (h.rank == 0 || h.rank >= r->world)
            snprintf(why, sizeof(why), "rank %u on %s is out of range 1..%u", h.rank, h.host,
                     r->world - 1);
        else if (r->fds[h.rank] >= 0)
            snprintf(why, sizeof(why), "rank %u joined twice (%s and %s)", h.rank, r->hosts[h.rank],
                     h.host);
        if (why[0]) {
            reject(fd, why);
            close(fd);
            return TM_ERR(err, TM_E_INVAL, "rendezvous on %s:%u: %s", r->addr, r->port, why);
        }
        r->fds[h.rank] = fd;
        memcpy(r->hosts[h.rank], h.host, HOST_BYTES);
        n_joined++;
    }
    for (uint32_t k = 1; k < r->world; k++) {
        set_sock_opts(r->fds[k]);
        int e = send_msg(r->fds[k], MSG_WELCOME, blob, len, NULL, 0);
        if (e)
            return TM_ERR(err, TM_E_IO, "rendezvous: welcome to rank %u (%s): %s", k, r->hosts[k],
                          strerror(e));
    }
    return TM_OK;
}

/* One connection attempt bounded by deadline. Returns the fd, or -1 with *e set. */
static int connect_once(const struct addrinfo *ai, double deadline, int *e) {
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) {
        *e = errno;
        return -1;
    }
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        if (errno != EINPROGRESS) {
            *e = errno;
            close(fd);
            return -1;
        }
        struct pollfd pf = {.fd = fd, .events = POLLOUT};
        int pr = poll(&pf, 1, TM_MIN(ms_left(deadline), 2000));
        int so = 0;
        socklen_t sl = sizeof(so);
        if (pr <= 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &so, &sl) != 0 || so != 0) {
            *e = pr == 0 ? ETIMEDOUT : so ? so : errno;
            close(fd);
            return -1;
        }
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    return fd;
}

tm_rc tm_rdzv_join(const tm_rdzv_cfg *cfg, tm_rdzv **out, void *blob, size_t cap, size_t *len,
                   tm_err *err) {
    tm_rc rc = check_cfg(cfg, err);
    if (rc)
        return rc;
    if (cfg->rank == 0)
        return TM_ERR(err, TM_E_INVAL, "rendezvous: rank 0 listens, it does not join");
    tm_rdzv *r = rdzv_new(cfg, 1, err);
    if (!r)
        return err->rc;
    const double deadline = tm_now_ms() + cfg->timeout_ms;
    int last_e = 0;
    char last_what[sizeof(((tm_err *)0)->msg)] = "no attempt";
    for (;;) {
        struct addrinfo *ai = NULL;
        tm_err rerr = {0};
        if (resolve(cfg->addr, cfg->port, 0, &ai, &rerr) == TM_OK) {
            r->fds[0] = connect_once(ai, deadline, &last_e);
            freeaddrinfo(ai);
            snprintf(last_what, sizeof(last_what), "%s", strerror(last_e));
        } else {
            memcpy(last_what, rerr.msg, sizeof(last_what));
        }
        if (r->fds[0] >= 0)
            break;
        if (ms_left(deadline) == 0) {
            rc = TM_ERR(err, TM_E_IO,
                        "rendezvous: rank %u cannot reach rank 0 at %s:%u within %.3g s: %s (is "
                        "rank 0 running with the same --master-addr/--master-port?)",
                        cfg->rank, cfg->addr, cfg->port, cfg->timeout_ms / 1e3, last_what);
            goto fail;
        }
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    hello_msg h = {.rank = cfg->rank, .world = cfg->world};
    gethostname(h.host, HOST_BYTES - 1);
    int e = send_msg(r->fds[0], MSG_HELLO, &h, sizeof(h), NULL, 0);
    msg_hdr mh = {0};
    if (!e)
        e = read_full(r->fds[0], &mh, sizeof(mh), deadline);
    if (e) {
        rc = TM_ERR(err, TM_E_IO,
                    "rendezvous: rank %u got no answer from rank 0 at %s:%u within %.3g s: %s "
                    "(are all %u ranks started?)",
                    cfg->rank, cfg->addr, cfg->port, cfg->timeout_ms / 1e3, read_err_str(e),
                    cfg->world);
        goto fail;
    }
    if (mh.magic != MAGIC || (mh.type != MSG_WELCOME && mh.type != MSG_REJECT) ||
        mh.len > TM_RDZV_MAX_BLOB) {
        rc = TM_ERR(err, TM_E_PARSE, "rendezvous: %s:%u is not a tokenmill rank 0", cfg->addr,
                    cfg->port);
        goto fail;
    }
    char body[TM_RDZV_MAX_BLOB + 1];
    e = read_full(r->fds[0], body, mh.len, deadline);
    if (e) {
        rc = TM_ERR(err, TM_E_IO, "rendezvous: reading rank 0's answer: %s", read_err_str(e));
        goto fail;
    }
    body[mh.len] = 0;
    if (mh.type == MSG_REJECT) {
        rc = TM_ERR(err, TM_E_INVAL, "rendezvous: rank 0 refused rank %u: %s", cfg->rank, body);
        goto fail;
    }
    if (mh.len > cap) {
        rc = TM_ERR(err, TM_E_PARSE, "rendezvous: blob of %u bytes > %zu", mh.len, cap);
        goto fail;
    }
    memcpy(blob, body, mh.len);
    *len = mh.len;
    set_sock_opts(r->fds[0]);
    *out = r;
    return TM_OK;
fail:
    tm_rdzv_close(r);
    return rc;
}

void tm_rdzv_close(tm_rdzv *r) {
    if (!r)
        return;
    const uint32_t n_fd = r->rank == 0 ? r->world : 1;
    for (uint32_t i = 0; r->fds && i < n_fd; i++)
        if (r->fds[i] >= 0)
            close(r->fds[i]);
    if (r->listen_fd >= 0)
        close(r->listen_fd);
    tm_free(r->fds);
    tm_free(r->hosts);
    tm_free(r);
}

tm_rc tm_rdzv_bcast(tm_rdzv *r, uint32_t type, const void *a, size_t na, const void *b, size_t nb,
                    tm_err *err) {
    TM_ASSERT(r->rank == 0 && type >= TM_RDZV_MSG_USER);
    if (na + nb > TM_RDZV_MAX_MSG)
        return TM_ERR(err, TM_E_INVAL, "rendezvous: message of %zu bytes", na + nb);
    for (uint32_t k = 1; k < r->world; k++) {
        int e = send_msg(r->fds[k], type, a, na, b, nb);
        if (e)
            return TM_ERR(err, TM_E_IO, "rank %u (%s): sending a control message failed: %s", k,
                          r->hosts[k], strerror(e));
    }
    return TM_OK;
}

tm_rc tm_rdzv_recv(tm_rdzv *r, int timeout_ms, uint32_t *type, void *buf, size_t cap, size_t *len,
                   tm_err *err) {
    TM_ASSERT(r->rank != 0);
    const int fd = r->fds[0];
    if (timeout_ms >= 0) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        int pr;
        do
            pr = poll(&pf, 1, timeout_ms);
        while (pr < 0 && errno == EINTR);
        if (pr == 0)
            return TM_ERR(err, TM_E_AGAIN, "rendezvous: no message within %d ms", timeout_ms);
    }
    msg_hdr mh;
    int e = read_full(fd, &mh, sizeof(mh), -1);
    if (e == -1)
        return TM_ERR(err, TM_E_IO,
                      "rank %u: rank 0 at %s:%u closed the control connection (it exited or "
                      "failed)",
                      r->rank, r->addr, r->port);
    if (e)
        return TM_ERR(err, TM_E_IO, "rank %u: control connection to rank 0: %s", r->rank,
                      read_err_str(e));
    if (mh.magic != MAGIC || mh.len > cap)
        return TM_ERR(err, TM_E_PARSE,
                      "rank %u: bad control message (magic %08x, %u bytes, "
                      "buffer %zu)",
                      r->rank, mh.magic, mh.len, cap);
    e = read_full(fd, buf, mh.len, -1);
    if (e)
        return TM_ERR(err, TM_E_IO, "rank %u: control connection to rank 0: %s", r->rank,
                      read_err_str(e));
    *type = mh.type;
    *len = mh.len;
    return TM_OK;
}

tm_rc tm_rdzv_check(tm_rdzv *r, tm_err *err) {
    const uint32_t n_fd = r->rank == 0 ? r->world : 1;
    for (uint32_t i = 0; i < n_fd; i++) {
        const int fd = r->fds[i];
        if (fd < 0)
            continue;
        const uint32_t peer = r->rank == 0 ? i : 0;
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        if (poll(&pf, 1, 0) <= 0)
            continue;
        msg_hdr mh;
        ssize_t k = recv(fd, &mh, sizeof(mh), MSG_PEEK | MSG_DONTWAIT);
        if (k < 0 && (errno == EAGAIN || errno == EINTR))
            continue;
        if (k <= 0)
            return TM_ERR(err, TM_E_IO,
                          "rank %u (%s) closed its connection: it exited or crashed%s%s", peer,
                          r->hosts[peer][0] ? r->hosts[peer] : r->addr, k < 0 ? ": " : "",
                          k < 0 ? strerror(errno) : "");
        if (r->rank != 0)
            continue; // rank 0 sent the next message: it is alive
        // a rank only ever sends a failure report
        char msg[1024] = "";
        if (read_full(fd, &mh, sizeof(mh), tm_now_ms() + 1000) == 0 && mh.magic == MAGIC &&
            mh.type == MSG_REPORT && mh.len < sizeof(msg))
            read_full(fd, msg, mh.len, tm_now_ms() + 1000);
        msg[sizeof(msg) - 1] = 0;
        return TM_ERR(err, TM_E_INTERNAL, "rank %u (%s) failed: %s", peer, r->hosts[peer],
                      msg[0] ? msg : "(no message)");
    }
    return TM_OK;
}

void tm_rdzv_report(tm_rdzv *r, const char *msg) {
    if (!r || r->rank == 0 || r->fds[0] < 0)
        return;
    size_t n = TM_MIN(strlen(msg), 1000u);
    char buf[1001];
    memcpy(buf, msg, n);
    buf[n] = 0;
    msg_hdr h = {.magic = MAGIC, .type = MSG_REPORT, .len = (uint32_t)n + 1};
    struct iovec iov[2] = {{&h, sizeof(h)}, {buf, n + 1}};
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = 2};
    (void)!sendmsg(r->fds[0], &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
}

uint16_t tm_rdzv_port(const tm_rdzv *r) { return r->port; }
uint32_t tm_rdzv_rank(const tm_rdzv *r) { return r->rank; }
uint32_t tm_rdzv_world(const tm_rdzv *r) { return r->world; }
