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

/* Sends len bytes from buf with tag to the worker at addr (endpoints cached per address) and
 * waits for the send to complete locally, at most timeout_ms. A peer that is gone or
 * unreachable fails the send (KVT_EIO) and its endpoint is dropped. */
int kvt_ucx_send(kvt_ucx *u, const void *addr, size_t addr_len, const void *buf, size_t len,
                 uint64_t tag, int timeout_ms);

#endif
