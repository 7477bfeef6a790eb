/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The encoder-cache data plane over UCX (tag matching). A consumer shard posts a tagged
 * receive on each reservation it hands a writer (tag = the reservation's, kvt_ecc_rid_tag),
 * straight into the reserved region; a producer sends the item's bytes with that tag to the
 * shard's worker address. The consumer thus knows by itself when the bytes have landed, a
 * peer's bytes can only land in a region a receive was posted on, and a receive is cancelled
 * (and its cancellation completed) before its region is released.
 *
 * One context and one worker per object, single-threaded (UCS_THREAD_MODE_SINGLE): the shard's
 * server thread owns the receiving one, the producer's thread the sending one. Transports are
 * UCX's choice (UCX_TLS overrides: tcp, posix/sysv shared memory, cma; verbs where present).
 */
#ifndef KVT_EC_UCX_H
#define KVT_EC_UCX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kvt_ucx kvt_ucx;
typedef struct kvt_ucx_recv kvt_ucx_recv;

int kvt_ucx_create(kvt_ucx **out);
/* Endpoints are closed (forcibly); receives still posted must have been cancelled. */
void kvt_ucx_destroy(kvt_ucx *u);
/* The worker's address, for peers to send to (valid until destroy). */
int kvt_ucx_address(kvt_ucx *u, const void **addr, size_t *len);
/* A peer's worker address is well formed enough to hand to UCX (see ucx.c): 0, or KVT_EPROTO
 * with a message. */
int kvt_ucx_address_check(const kvt_ucx *u, const void *addr, size_t len);
/* Registers [base, base + len) once (a consumer's receive buffer): zero-copy receives. */
int kvt_ucx_map(kvt_ucx *u, void *base, size_t len);
/* Endpoints made from now on ask UCX for peer failure detection (UCP_ERR_HANDLING_MODE_PEER;
 * off by default). On: a consumer that dies fails the sends in flight to it as soon as UCX
 * notices, but UCX 1.13 then restricts rendezvous to protocols that support it (over tcp, the
 * bytes arrive as active messages and are copied once more: 16 MiB items 2.5-3x slower,
 * docs/benchmarks.md). Off: such sends fail when the batch's timeout passes. Transports without
 * it (shared memory, cma) connect without it either way. */
void kvt_ucx_set_peer_failure(kvt_ucx *u, bool on);
/* Drives the worker (completions, connection setup); returns whether anything progressed. */
unsigned kvt_ucx_progress(kvt_ucx *u);
/* A file descriptor that becomes readable when the worker has something to progress (for a
 * poll loop), and arming it: 0 when armed (sleep on the fd), 1 when events are already pending
 * (progress again first). */
int kvt_ucx_efd(kvt_ucx *u, int *fd);
int kvt_ucx_arm(kvt_ucx *u);

/* Posts a receive of exactly len bytes into buf for tag. */
int kvt_ucx_recv_post(kvt_ucx *u, void *buf, size_t len, uint64_t tag, kvt_ucx_recv **out);
/* 1: every byte arrived; 0: still waiting; < 0: failed (truncated, short, transport error),
 * with a message. Progresses the worker for at most wait_ms first (0: just look). */
int kvt_ucx_recv_wait(kvt_ucx *u, kvt_ucx_recv *r, int wait_ms);
/* Ends a receive: cancels it if it still waits and progresses until UCX has let go of the
 * buffer (a receive under way finishes first), then frees it. Returns 1 if all its bytes had
 * arrived after all, 0 if not (cancelled or failed); KVT_EBUSY if UCX still holds the buffer
 * after wait_ms: the receive is kept (and its memory must be too); call again later. */
int kvt_ucx_recv_end(kvt_ucx *u, kvt_ucx_recv *r, int wait_ms);

/* One send of a batch (kvt_ucx_send_many); rc is the outcome: 0 or a KVT_E* code. */
typedef struct kvt_ucx_send_item {
    const void *addr; /* the receiving worker's address */
    size_t addr_len;
    const void *buf;
    size_t len;
    uint64_t tag;
    int rc;
} kvt_ucx_send_item;

/* Sends n items, at most `window` in flight at once (the next is posted as soon as one
 * completes), and returns when each has completed locally or failed: 0 if all were sent, else
 * the first failure's code (each item's rc says its own). A batch that makes no progress for
 * timeout_ms is cancelled: what is still in flight is cancelled and UCX has let go of every
 * source before this returns. Endpoints are cached per address; a peer that is gone or
 * unreachable fails its sends (KVT_EIO) and its endpoint is dropped. At most 32 distinct
 * addresses per batch. */
int kvt_ucx_send_many(kvt_ucx *u, kvt_ucx_send_item *v, uint32_t n, uint32_t window,
                      int timeout_ms);
/* One send (kvt_ucx_send_many of one item). */
int kvt_ucx_send(kvt_ucx *u, const void *addr, size_t addr_len, const void *buf, size_t len,
                 uint64_t tag, int timeout_ms);

#endif
