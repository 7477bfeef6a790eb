/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The encoder-cache data plane over UCX (tag matching). A consumer shard posts a tagged
 * receive on each reservation it hands a writer (tag = the reservation's, kvi_ecc_rid_tag),
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

typedef struct kvi_ucx kvi_ucx;
typedef struct kvi_ucx_recv kvi_ucx_recv;

/* A context and worker with UCX's classic protocol selection (UCX_PROTO_ENABLE=n; the user's
 * UCX_PROTO_ENABLE wins): over shared memory its rendezvous is one copy by the receiver (cma),
 * which keeps its speed on a busy machine, where the newer selection's two-sided pipeline
 * fell to a fifth (docs/benchmarks.md, contention); over tcp the two tie. */
int kvi_ucx_create(kvi_ucx **out);
/* kvi_ucx_create for an encoder-cache sender (KVI_UCX_EC_SENDER): besides the classic
 * selection, items below KVI_UCX_EC_RNDV_THRESH go eager where kvi_ucx_rndv_thresh says so. An
 * eager item is sent with its tag and lands in the posted receive without the rendezvous's
 * three extra messages (request, reply, acknowledgement); over tcp, with UCX's own threshold of
 * 8 KiB, 64 KiB items went from 16-25 k to 30-33 k a second quiet and from 11-14 k to 16-23 k
 * beside a busy core (docs/benchmarks.md). Not over shared memory: there an eager item is
 * copied through the shared queue by both processes, and beside a busy core 64 KiB items fell
 * from 17-20 k to 8-9 k a second. The threshold is the sender's choice: a consumer receives
 * either way. 0 flags is kvi_ucx_create. */
#define KVI_UCX_EC_SENDER      1u
#define KVI_UCX_EC_RNDV_THRESH "256K"
int kvi_ucx_create_as(kvi_ucx **out, unsigned flags);
/* The rendezvous threshold an encoder-cache sender's context is given: NULL (UCX's own) where
 * the user chose one (user_env: UCX_RNDV_THRESH, set and not empty), the host has RDMA devices
 * (rdma: their rendezvous reads the bytes straight into the receive buffer, where eager copies
 * them once more, and UCX's own threshold is tuned for them) or the context has a
 * shared-memory transport (shm: peers on the same host reach it through that);
 * KVI_UCX_EC_RNDV_THRESH otherwise (tcp, as with UCX_TLS=tcp). */
const char *kvi_ucx_rndv_thresh(const char *user_env, bool rdma, bool shm);
/* Whether this host has RDMA devices (an entry under /sys/class/infiniband). */
bool kvi_ucx_host_rdma(void);
/* The protocols UCX chose for the endpoint to a peer's worker address (ucp_ep_print_info, in
 * this UCX's words: "tag_send: 0..<egr/short>..8185..<egr/zcopy>..262144..<rndv>..(inf)" for
 * UCX 1.13's classic selection), NUL-terminated, cut at cap; the endpoint is made if there is
 * none, as a send makes it. 0, or an error. */
int kvi_ucx_ep_info(kvi_ucx *u, const void *addr, size_t len, char *buf, size_t cap);
/* Endpoints are closed (forcibly); receives still posted must have been cancelled. */
void kvi_ucx_destroy(kvi_ucx *u);
/* The worker's address, for peers to send to (valid until destroy). */
int kvi_ucx_address(kvi_ucx *u, const void **addr, size_t *len);
#define KVI_UCX_ADDR_MAX (1u << 16) /* bytes of a worker address we accept */

/* A peer's worker address may be handed to UCX: parsed in full as this build's UCX packs one
 * (kvi_ucx_addr_parse), in the format version u's own address has. 0, or KVT_EPROTO with a
 * message naming what does not fit. */
int kvi_ucx_address_check(const kvi_ucx *u, const void *addr, size_t len);
/* What our own address says of each transport: its name checksum and the lengths of its
 * device and interface addresses (any_dev_len: a transport whose device address length
 * varies, tcp's by address family). */
#define KVI_UCX_ADDR_REF_MAX 128u
typedef struct kvi_ucx_addr_ref_entry {
    uint16_t csum;
    unsigned dev_len, if_len;
    bool any_dev_len;
} kvi_ucx_addr_ref_entry;
typedef struct kvi_ucx_addr_ref {
    uint32_t n;
    kvi_ucx_addr_ref_entry e[KVI_UCX_ADDR_REF_MAX];
} kvi_ucx_addr_ref;

/* The parse itself (ucx_addr.c; no UCX needed): UCX 1.13's worker address layout, format
 * `version` (the header's low 4 bits: 0 for UCX's v1, 1 for its v2), every length inside
 * [addr, addr + len), every value in its range and the parse ending exactly there; with ref,
 * a transport we also have must have our interface address length and a device address
 * length we have (UCX's transports read those addresses without knowing their length).
 * out (may be NULL) receives the transports, to serve as a ref. 0, or KVT_EPROTO. */
int kvi_ucx_addr_parse(const void *addr, size_t len, unsigned version, const kvi_ucx_addr_ref *ref,
                       kvi_ucx_addr_ref *out);
/* Registers [base, base + len) (a consumer's receive buffer, an owner's served arrays; one
 * call per buffer): zero-copy transfers. */
int kvi_ucx_map(kvi_ucx *u, void *base, size_t len);
/* Endpoints made from now on ask UCX for peer failure detection (UCP_ERR_HANDLING_MODE_PEER;
 * off by default). On: a consumer that dies fails the sends in flight to it as soon as UCX
 * notices, but UCX 1.13 then restricts rendezvous to protocols that support it (over tcp, the
 * bytes arrive as active messages and are copied once more: 16 MiB items 2.5-3x slower,
 * docs/benchmarks.md). Off: such sends fail when the batch's timeout passes. Transports without
 * it (shared memory, cma) connect without it either way. */
void kvi_ucx_set_peer_failure(kvi_ucx *u, bool on);
/* Drives the worker (completions, connection setup); returns whether anything progressed. */
unsigned kvi_ucx_progress(kvi_ucx *u);
/* A file descriptor that becomes readable when the worker has something to progress (for a
 * poll loop), and arming it: 0 when armed (sleep on the fd), 1 when events are already pending
 * (progress again first). */
int kvi_ucx_efd(kvi_ucx *u, int *fd);
int kvi_ucx_arm(kvi_ucx *u);

/* Posts a receive of exactly len bytes into buf for tag. */
int kvi_ucx_recv_post(kvi_ucx *u, void *buf, size_t len, uint64_t tag, kvi_ucx_recv **out);
/* 1: every byte arrived; 0: still waiting; < 0: failed (truncated, short, transport error),
 * with a message. Progresses the worker for at most wait_ms first (0: just look). */
int kvi_ucx_recv_wait(kvi_ucx *u, kvi_ucx_recv *r, int wait_ms);
/* Ends a receive: cancels it if it still waits and progresses until UCX has let go of the
 * buffer (a receive under way finishes first), then frees it. Returns 1 if all its bytes had
 * arrived after all, 0 if not (cancelled or failed); KVT_EBUSY if UCX still holds the buffer
 * after wait_ms: the receive is kept (and its memory must be too); call again later. */
int kvi_ucx_recv_end(kvi_ucx *u, kvi_ucx_recv *r, int wait_ms);

/* Frees a receive that kvi_ucx_recv_end could not end, once its worker was destroyed
 * (kvi_ucx_destroy): nothing can write its buffer any more. */
void kvi_ucx_recv_forget(kvi_ucx_recv *r);

/* One send of a batch (kvi_ucx_send_many); rc is the outcome: 0 or a KVT_E* code. */
typedef struct kvi_ucx_send_item {
    const void *addr; /* the receiving worker's address */
    size_t addr_len;
    const void *buf;
    size_t len;
    uint64_t tag;
    int rc;
} kvi_ucx_send_item;

/* Sends n items, at most `window` in flight at once (the next is posted as soon as one
 * completes), and returns when each has completed locally or failed: 0 if all were sent, else
 * the first failure's code (each item's rc says its own). A batch that makes no progress for
 * timeout_ms is cancelled: what is still in flight is cancelled, its endpoints forced closed,
 * and this returns within about timeout_ms + 2 s whatever the peer does. A send UCX still
 * holds after its endpoint's forced close (a rendezvous whose peer never answered: UCX 1.13
 * keeps it) is abandoned (KVT_EIO; kvi_ucx_abandoned counts them): no byte of its source
 * moves again on the closed endpoint, but the source must stay mapped until kvi_ucx_destroy.
 * Endpoints are cached per address; a peer that is gone or unreachable fails its sends
 * (KVT_EIO) and its endpoint is dropped. At most 32 distinct addresses per batch. */
int kvi_ucx_send_many(kvi_ucx *u, kvi_ucx_send_item *v, uint32_t n, uint32_t window,
                      int timeout_ms);
/* kvi_ucx_send_many calling prep(arg, i, w) just before item i is posted from window slot w
 * (0 .. window - 1; while earlier items are in flight, so that work per item overlaps the
 * transfer). prep may point v[i].buf elsewhere, at memory it owns per window slot: slot w is
 * given to no other item until item i's send completed. A nonzero return is item i's rc, and
 * it is not sent. */
int kvi_ucx_send_many_prep(kvi_ucx *u, kvi_ucx_send_item *v, uint32_t n, uint32_t window,
                           int timeout_ms, int (*prep)(void *arg, uint32_t i, uint32_t w),
                           void *arg);
/* Sends abandoned so far (kvi_ucx_send_many). */
uint64_t kvi_ucx_abandoned(const kvi_ucx *u);
/* One send (kvi_ucx_send_many of one item). */
int kvi_ucx_send(kvi_ucx *u, const void *addr, size_t addr_len, const void *buf, size_t len,
                 uint64_t tag, int timeout_ms);

#endif
