/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Encoder-cache transfer across processes and hosts: the control server every consumer shard
 * runs, over ZeroMQ.
 *
 * A consumer shard (kvt_ec_shard) serves producers through a control server: a REP socket at
 * tcp://<host>:<base_port + dp_index * tp_size + tp_rank> answering `peers`, `event_port`,
 * `status`, `reserve`, `reserve_batch`, `complete`, `complete_batch` and `cancel` in the
 * binary encoding of docs/wire.md, and a PUSH socket (an ephemeral port, `event_port`) that
 * pushes readiness and abandoned events to the consumer's scheduler. The server runs its own
 * thread; from then on the shard belongs to it, and the engine's worker reaches the shard only
 * through kvt_ec_server_apply (which takes the server's lock).
 *
 * A malformed, truncated or oversized request gets an error reply and the server keeps
 * serving; a request never makes it free memory a writer may still write (kvt_ec_shard's
 * rules hold whoever asks).
 */
#ifndef KVTIER_EC_NET_H
#define KVTIER_EC_NET_H

#include "kvtier/ec.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvt_ec_server_config {
    const char *host;    /* address to bind (an IPv4 or IPv6 address or an interface name);
                            required: "0.0.0.0" or "::" only if the caller means every interface */
    uint32_t base_port;  /* ec_port; 1..65535 once the offset is added */
    uint32_t dp_index;   /* data-parallel index of this consumer instance; default 0 */
    uint32_t tp_size;    /* shards of the consumer (its TP size), 1..64; default 1 */
    uint32_t tp_rank;    /* this shard's rank, < tp_size; default 0 */
    uint32_t max_events; /* events kept while no scheduler pulls them (oldest dropped, counted);
                            default 4096 */
    uint64_t expire_interval_ns; /* the shard's TTL pass; default 1 s */
    uint32_t poll_ms;            /* the loop's receive timeout; default 100 ms */
    bool data_plane;             /* default true: a UCX receive is posted on every region a
                                    writer gets (the shard needs a base), and a completion is
                                    accepted only once its bytes have landed. false: the bytes
                                    move some other way and completions are trusted */
    uint32_t complete_wait_ms;   /* unused: a completion never waits (bytes still arriving:
                                    answered pending, completed by the server when they land) */
    uint32_t max_receives;       /* writers' receives posted at once; default 4096 */
    /* CURVE (optional): the server's secret key (40 Z85 characters) encrypts both sockets and
     * authenticates them to clients; curve_clients, a NULL-terminated list of public keys,
     * admits only those clients (NULL: any client that knows the server's public key). */
    const char *curve_secret_key;
    const char *const *curve_clients;
    /* The consumer's owner key (32 lowercase hex digits): a cancel without a reservation id
     * (the consumer's own scheduler letting go of a transfer, kvt_ec_inbox) must present it.
     * NULL: a random key, written for the inbox of this host and user to read (a 0600 file in
     * a 0700 directory, kvt_ec_owner_key_path); set it explicitly on the server and the inbox
     * when they run on different hosts. */
    const char *owner_key;
    /* Where the event socket binds. Default (NULL): a unix socket in this user's private
     * directory (the owner key's, kvt_ec_owner_key_path): only this user's processes on this
     * host can take readiness events. An address serves remote schedulers, and needs CURVE
     * (curve_secret_key; refused without it: whoever connected would take events). */
    const char *event_host;
    /* after UCX made progress, the server keeps polling (no sleep) this long before it waits
     * on its descriptors again: bytes that arrive in bursts are taken without a wake-up each.
     * 0 .. 100,000 us; default 300 (docs/benchmarks.md: without it, 1 run in 4 of 16 MiB
     * batches over tcp fell to half speed); the cost is CPU only while traffic flows */
    uint32_t spin_us;
    /* room for fields to come, so the struct keeps its size: zero (as *_config_init
     * leaves it); a create refuses a config whose room is not zero */
    uint64_t reserved[8];
} kvt_ec_server_config;

typedef struct kvt_ec_server kvt_ec_server;

KVT_API void kvt_ec_server_config_init(kvt_ec_server_config *cfg);
/* Where a server without a configured owner_key leaves the key it made, for the inbox of this
 * host and user: <XDG_RUNTIME_DIR or /tmp>/kvtier-<uid>/ec-owner-<control port>. */
KVT_API int kvt_ec_owner_key_path(uint32_t port, char *buf, size_t cap);
/* Binds both sockets (errors come back here: "failed to bind tcp://...: Address already in
 * use") and starts the server thread. The shard is borrowed and must outlive the server. */
KVT_API int kvt_ec_server_start(const kvt_ec_server_config *cfg, kvt_ec_shard *shard,
                                kvt_ec_server **out);
/* Stops the thread and closes the sockets (pending events are dropped); NULL is a no-op. The
 * shard is left as it is: its writers still own their memory (kvt_ec_shard_destroy decides). */
KVT_API void kvt_ec_server_stop(kvt_ec_server *s);
/* The bound control port, and the event socket's port (0 when it is a unix socket: event_host
 * NULL). */
KVT_API uint32_t kvt_ec_server_port(const kvt_ec_server *s);
KVT_API uint32_t kvt_ec_server_event_port(const kvt_ec_server *s);
/* The endpoint a ZeroMQ PULL connects to for this server's events ("ipc://..." or
 * "tcp://host:port"); valid until the server stops. */
KVT_API const char *kvt_ec_server_event_endpoint(const kvt_ec_server *s);
/* kvt_ec_shard_apply under the server's lock: the consumer worker's step. */
KVT_API int kvt_ec_server_apply(kvt_ec_server *s, const kvt_ec_meta *meta,
                                const kvt_ec_cache_ops *ops, kvt_ec_worker_meta *out);
/* Runs fn(shard, arg) under the server's lock (any other call on the shard: stats, state). fn
 * must not complete or abandon a writer's reservation (the server owns their receives). */
KVT_API int kvt_ec_server_with_shard(kvt_ec_server *s, int (*fn)(kvt_ec_shard *, void *),
                                     void *arg);

typedef struct kvt_ec_server_stats {
    uint64_t requests;           /* requests answered */
    uint64_t malformed;          /* requests that could not be decoded (answered with an error) */
    uint64_t items;              /* items in them */
    uint64_t item_errors;        /* items the shard refused */
    uint64_t events_sent;        /* events pushed */
    uint64_t events_dropped;     /* events dropped: the backlog was full */
    uint64_t receives_posted;    /* data plane: receives posted on writers' regions */
    uint64_t receives_done;      /* ... whose bytes all arrived */
    uint64_t receives_cancelled; /* ... ended by an abandon before their bytes arrived */
    uint64_t receives_failed;    /* ... that failed (short, truncated, transport error) */
    uint64_t bytes_received;
    uint64_t completes_early;   /* completions refused: their bytes had not landed yet */
    uint64_t writers_reaped;    /* writers past their TTL whose receive was cancelled and whose
                                   memory was released (a producer that died mid-push) */
    uint64_t clients_refused;   /* CURVE handshakes of clients not admitted */
    uint64_t refused;           /* items refused as not the sender's: another client's
                                   reservation, or a consumer-side cancel without the owner key */
    uint64_t completes_pending; /* completions answered pending: bytes still arriving */
    uint64_t reserved[8];       /* room for figures to come (zero) */
} kvt_ec_server_stats;
KVT_API void kvt_ec_server_get_stats(kvt_ec_server *s, kvt_ec_server_stats *st);

/* ---- producer side: remote consumers ------------------------------------------------------- */

/* kvt_ec_consumer_ops over the network, for a producer (kvt_ec_producer_config.ops): a
 * consumer is named by its control address "host:port" or "tcp://host:port" (the port of its
 * shard 0, base + dp_index x tp_size); `peers` gives every shard's port (cached per consumer,
 * successes only), `reserve`, `complete` and `cancel` go to the shard's control server (the
 * batched forms: one message per shard and up to 4,096 items), and `write` sends the bytes over
 * UCX with the reservation's tag to the shard's worker address (asked once per shard with
 * `data_address`); a write batch keeps up to write_window sends in flight. Not thread-safe: one per
 * producer thread. */
typedef struct kvt_ec_net_config {
    uint32_t control_timeout_ms; /* each control exchange; default 30,000 */
    uint32_t write_timeout_ms;   /* a write batch making no progress for this long fails;
                                    default 30,000 */
    uint32_t write_window;       /* writes of a batch in flight at once, 1..4096; default 64 */
    /* UCX peer failure detection on the data plane (off by default): on, writes to a consumer
     * that died fail as soon as UCX notices rather than after write_timeout_ms, but UCX 1.13
     * then moves large items over tcp with an extra copy (16 MiB items 2.5-3x slower, measured
     * in docs/benchmarks.md) */
    bool detect_peer_failure;
    /* CURVE (optional, all three or none): the consumers' server public key and this
     * client's key pair, 40 Z85 characters each. */
    const char *curve_server_key, *curve_public_key, *curve_secret_key;
    /* room for fields to come, so the struct keeps its size: zero (as *_config_init
     * leaves it); a create refuses a config whose room is not zero */
    uint64_t reserved[8];
} kvt_ec_net_config;

typedef struct kvt_ec_net_consumer kvt_ec_net_consumer;

KVT_API void kvt_ec_net_config_init(kvt_ec_net_config *cfg);
KVT_API int kvt_ec_net_consumer_create(const kvt_ec_net_config *cfg, kvt_ec_net_consumer **out);
KVT_API void kvt_ec_net_consumer_destroy(kvt_ec_net_consumer *c);
/* The ops (valid until destroy). */
KVT_API kvt_ec_consumer_ops kvt_ec_net_consumer_ops(kvt_ec_net_consumer *c);

/* ---- consumer scheduler side: discovery, events, cancels ----------------------------------- */

/* The consumer scheduler's link to its own shards: a background
 * thread discovers the topology (`peers`, then `event_port` on every shard; the whole topology
 * is retried while any shard fails) and sends the scheduler's cancels to every shard (two
 * rounds, the second only to the shards that failed); the scheduler thread's step never
 * blocks: it takes the events that arrived (none until discovery finished) into the
 * scheduler and hands over its queued cancels. A dead or unreachable shard therefore never
 * stalls scheduling. */
typedef struct kvt_ec_inbox_config {
    const char *consumer;        /* this consumer's shard-0 control address, tcp://host:port */
    uint32_t control_timeout_ms; /* each control exchange; default 30,000 */
    uint32_t retry_ms;           /* discovery retried this long after a failure; default 1000 */
    uint32_t max_cancels;        /* cancels queued for the thread (more are dropped, counted);
                                    default 65,536 */
    /* CURVE, as kvt_ec_net_config */
    const char *curve_server_key, *curve_public_key, *curve_secret_key;
    /* The shards' owner key (kvt_ec_server_config.owner_key); NULL: read, per shard, from the
     * file its server wrote on this host (kvt_ec_owner_key_path). */
    const char *owner_key;
    /* Where the shards' event sockets are reached: default (NULL) their unix sockets on this
     * host (kvt_ec_server_config.event_host NULL; the servers and this inbox run as one user);
     * an address: their tcp ports there (with CURVE). */
    const char *event_host;
    /* room for fields to come, so the struct keeps its size: zero (as *_config_init
     * leaves it); a create refuses a config whose room is not zero */
    uint64_t reserved[8];
} kvt_ec_inbox_config;

typedef struct kvt_ec_inbox kvt_ec_inbox;

typedef struct kvt_ec_inbox_stats {
    uint64_t discoveries;     /* discovery attempts */
    uint64_t events;          /* events handed to the scheduler */
    uint64_t bad_events;      /* events that did not decode (dropped, logged) */
    uint64_t cancels_sent;    /* transfer ids cancelled on every shard */
    uint64_t cancels_failed;  /* ... on some shard not even after the second round */
    uint64_t cancels_dropped; /* the queue was full */
    uint32_t shards;          /* discovered shards, 0 until discovery succeeded */
    uint64_t reserved[8];     /* room for figures to come (zero) */
} kvt_ec_inbox_stats;

KVT_API void kvt_ec_inbox_config_init(kvt_ec_inbox_config *cfg);
/* Starts the background thread (discovery begins at once). */
KVT_API int kvt_ec_inbox_create(const kvt_ec_inbox_config *cfg, kvt_ec_inbox **out);
KVT_API void kvt_ec_inbox_destroy(kvt_ec_inbox *in);
/* The scheduler thread, once per step: every event received so far goes to sched
 * (observe_ready / observe_abandoned), then sched's queued cancels go to the thread. Never
 * waits on the network. Returns the events delivered, or a code if sched refused one. */
KVT_API int kvt_ec_inbox_step(kvt_ec_inbox *in, kvt_ec_sched *sched);
KVT_API void kvt_ec_inbox_get_stats(kvt_ec_inbox *in, kvt_ec_inbox_stats *st);

/* For programs that read a shard's event socket themselves (a ZeroMQ PULL connected to
 * kvt_ec_server_event_endpoint) instead of through an inbox: decodes one
 * message into out, and the sending shard's rank into shard (may be NULL). KVT_EPROTO /
 * KVT_ELIMIT / KVT_EVERSION for a message that is not a valid event (out is untouched). */
KVT_API int kvt_ec_event_decode(const void *buf, size_t len, kvt_ec_ready_event *out,
                                uint32_t *shard);

#ifdef __cplusplus
}
#endif

#endif
