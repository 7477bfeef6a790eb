/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvtier link: the scheduler <-> worker control channel of KV offload across processes, over
 * ZeroMQ (ipc:// on one host, tcp:// across hosts).
 *
 * The scheduler binds a ROUTER socket; each of world_size workers connects a DEALER and says
 * hello with its rank and the host blocks it allocated (the pool-size handshake: the
 * scheduler lowers its host tier to the smallest, as every rank must be able to hold it). Then,
 * every engine step, the scheduler sends the step's encoded kvt_offload_meta (and an optional
 * opaque payload of the engine's own, e.g. its scheduler output) to every rank, and each rank
 * answers with its finished load requests, its completed store events and the device blocks
 * whose load failed. The scheduler side aggregates like vLLM's output aggregator: store
 * counts are summed per event, a request's load is finished once every rank reported it
 * (counted across steps), invalid blocks are united.
 *
 * Sizes are bounded before anything is buffered: a reply part over 16 MiB (ZMQ_MAXMSGSIZE on
 * the scheduler's socket) or a step part over 1 GiB (on a worker's) drops the sender's
 * connection, and every message has a fixed number of parts.
 *
 * Every message is validated before use (magic, version, type, step, rank, lengths, counts);
 * a malformed or unexpected message fails the call with KVT_EPROTO and a message naming the
 * rank, and changes nothing. Waits are bounded by a timeout (KVT_EIO on expiry).
 *
 * Thread rules: each object is used by one thread.
 */
#ifndef KVTIER_LINK_H
#define KVTIER_LINK_H

#include "kvtier/base.h"
#include "kvtier/meta.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVT_LINK_VERSION     2u
#define KVT_LINK_MAX_WORLD   1024u
#define KVT_LINK_MAX_INVALID (1u << 22) /* invalid blocks per reply (its status part <= 16 MiB) */

typedef struct kvt_link_sched kvt_link_sched;
typedef struct kvt_link_worker kvt_link_worker;

/* One step's aggregated answer. Owned by the link; valid until the next step call. */
typedef struct kvt_link_result {
    const kvt_str *finished_loads; /* requests every rank has now reported */
    uint32_t n_finished;
    const kvt_offload_worker_meta *stores; /* summed {event: count} of this step's replies */
    const uint32_t *invalid_blocks;        /* union, ascending */
    uint32_t n_invalid;
} kvt_link_result;

/* Binds endpoint (an ipc path such as "ipc:///tmp/kvt.sock", or tcp with a host and port)
 * for world_size workers. */
KVT_API int kvt_link_sched_create(const char *endpoint, uint32_t world_size, kvt_link_sched **out);
KVT_API void kvt_link_sched_destroy(kvt_link_sched *s);
/* Waits up to timeout_ms for every rank's hello; *host_blocks receives the smallest host
 * tier any rank allocated. A second hello from one rank, a rank >= world_size or a world size
 * that differs from ours fails with KVT_EPROTO. */
KVT_API int kvt_link_sched_accept(kvt_link_sched *s, int timeout_ms, uint32_t *host_blocks);
/* Sends meta (and payload, len bytes, may be NULL/0) to every rank and waits up to
 * timeout_ms for all their replies. A rank that reports a failure makes the call fail with
 * that rank's code and message (after all replies are in). */
KVT_API int kvt_link_sched_step(kvt_link_sched *s, const kvt_offload_meta *meta,
                                const void *payload, size_t len, int timeout_ms,
                                kvt_link_result *res);
/* Tells every rank to stop (kvt_link_worker_recv then reports stop). */
KVT_API int kvt_link_sched_stop(kvt_link_sched *s);

/* Connects rank (of world_size) to endpoint and says hello with host_blocks. */
KVT_API int kvt_link_worker_create(const char *endpoint, uint32_t rank, uint32_t world_size,
                                   uint32_t host_blocks, kvt_link_worker **out);
KVT_API void kvt_link_worker_destroy(kvt_link_worker *w);
/* Waits up to timeout_ms (-1: forever) for the next step: decodes its metadata into meta
 * and points *payload / *len at the engine payload (valid until the next recv). *stop is
 * set (and meta left empty) when the scheduler stopped. */
KVT_API int kvt_link_worker_recv(kvt_link_worker *w, int timeout_ms, kvt_offload_meta *meta,
                                 const void **payload, size_t *len, bool *stop);
/* Answers the step last received. status 0, or a negative KVT_E* code the scheduler will
 * return (the current kvt_last_error() message travels with it). */
KVT_API int kvt_link_worker_reply(kvt_link_worker *w, int status, const kvt_str *finished,
                                  uint32_t n_finished, const kvt_offload_worker_meta *stores,
                                  const uint32_t *invalid, uint32_t n_invalid);

#ifdef __cplusplus
}
#endif

#endif /* KVTIER_LINK_H */
