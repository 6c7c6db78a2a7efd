/* runner/tp/rendezvous.h - the TCP rendezvous and control channel of tensor-parallel ranks, as
 * torchrun's: rank 0 listens on master_addr:master_port; every other rank connects (retrying
 * until the timeout), says who it is (rank, world size, host name) and receives one blob that
 * rank 0 hands out (in tokenmill: the ncclUniqueId and the engine settings). The connections stay
 * open as the control channel: rank 0 sends messages (step plans) to every other rank; the other
 * ranks send back only a failure report. A closed connection is how a rank learns that its peer
 * died: EOF gives an error naming the rank; TCP keepalive (about 60 s) catches hosts that vanish
 * without closing.
 *
 * Wire format: a header {uint32 magic, uint32 type, uint32 len} then len bytes, in host byte
 * order (every rank runs the same build on the same architecture; the magic rejects anything
 * else). One thread uses a tm_rdzv at a time. Does not: authenticate peers (use it on a trusted
 * cluster network), reconnect, or carry bulk data (NCCL does that). */
#ifndef TM_RUNNER_TP_RENDEZVOUS_H
#define TM_RUNNER_TP_RENDEZVOUS_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"

#define TM_RDZV_MAX_BLOB 4096       /* largest blob rank 0 hands out at join */
#define TM_RDZV_MAX_MSG (64u << 20) /* largest control message */
#define TM_RDZV_MSG_USER 16u        /* message types below this are the rendezvous' own */

typedef struct tm_rdzv tm_rdzv; /* opaque */

typedef struct tm_rdzv_cfg {
    const char *addr;     /* master address (host name or IPv4 literal); rank 0 binds it */
    uint16_t port;        /* master port; rank 0 with 0 takes a free one (see tm_rdzv_port) */
    uint32_t rank, world; /* this rank; number of ranks, >= 2 */
    uint32_t timeout_ms;  /* join: how long rank 0 waits for all ranks, and a rank retries to
                             reach rank 0 and waits for its answer */
} tm_rdzv_cfg;

/* Rank 0: bind and listen on cfg->addr:cfg->port. Nobody is accepted yet (tm_rdzv_accept does
 * that), so the caller can start the other ranks in between. On success *out owns the listener.
 * Errors: TM_E_INVAL (bad cfg, cfg->rank != 0), TM_E_IO (address does not resolve, port in use;
 * strerror in the message). */
tm_rc tm_rdzv_listen(const tm_rdzv_cfg *cfg, tm_rdzv **out, tm_err *err);

/* Rank 0: wait until every other rank has joined (at most cfg->timeout_ms), then send each of
 * them blob[0..len) (len <= TM_RDZV_MAX_BLOB). Errors: TM_E_IO naming the ranks that did not join
 * in time; TM_E_INVAL when a peer says a different world size, a rank out of range or a rank that
 * already joined (that peer is told why and the rendezvous fails). */
tm_rc tm_rdzv_accept(tm_rdzv *r, const void *blob, size_t len, tm_err *err);

/* Rank > 0: connect to rank 0 (retrying until cfg->timeout_ms has passed), introduce this rank and
 * receive rank 0's blob into blob[0..cap); *len gets its size. On success *out owns the
 * connection. Errors: TM_E_IO (rank 0 not reachable in time, connection lost), TM_E_INVAL (rank 0
 * refused this rank; its reason is in the message). */
tm_rc tm_rdzv_join(const tm_rdzv_cfg *cfg, tm_rdzv **out, void *blob, size_t cap, size_t *len,
                   tm_err *err);

/* Close every connection and the listener. NULL is a no-op. Peers see EOF. */
void tm_rdzv_close(tm_rdzv *r);

/* Rank 0: send one message of the given type (>= TM_RDZV_MSG_USER) to every other rank; its body
 * is a[0..na) followed by b[0..nb) (either may be empty). Blocks until the bytes are handed to the
 * kernel. Errors: TM_E_IO naming the rank whose connection failed. */
tm_rc tm_rdzv_bcast(tm_rdzv *r, uint32_t type, const void *a, size_t na, const void *b, size_t nb,
                    tm_err *err);

/* Rank > 0: receive the next message from rank 0 into buf[0..cap); *type and *len describe it.
 * timeout_ms < 0 waits for ever. Errors: TM_E_AGAIN (timeout, nothing consumed), TM_E_IO (rank 0
 * closed the connection: it exited or failed; or a read error), TM_E_PARSE (bad magic, or a
 * message larger than cap: the connection is unusable afterwards). */
tm_rc tm_rdzv_recv(tm_rdzv *r, int timeout_ms, uint32_t *type, void *buf, size_t cap, size_t *len,
                   tm_err *err);

/* Non-blocking liveness check of the peers without consuming their messages: rank 0 checks every
 * other rank, another rank checks rank 0. TM_OK when nobody has hung up or reported a failure;
 * TM_E_IO "rank N closed its connection ..." for a dead peer; TM_E_INTERNAL "rank N failed: ..."
 * with the peer's own message when it sent a failure report (tm_rdzv_report). */
tm_rc tm_rdzv_check(tm_rdzv *r, tm_err *err);

/* Rank > 0: tell rank 0 that this rank failed, with msg (best effort, never blocks long). */
void tm_rdzv_report(tm_rdzv *r, const char *msg);

uint16_t tm_rdzv_port(const tm_rdzv *r); /* the port rank 0 listens on (after listen) */
uint32_t tm_rdzv_rank(const tm_rdzv *r);
uint32_t tm_rdzv_world(const tm_rdzv *r);

#endif /* TM_RUNNER_TP_RENDEZVOUS_H */
