/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvtier remote tier: blocks one engine instance holds in its host tier, found and read by
 * instances on other hosts (issue 23, part 2).
 *
 * Two parts, behind one interface (src/remote/remote_internal.h), so that other backends can
 * follow:
 *   directory     which instance holds which block. Redis (hiredis): an entry per block hash,
 *                 written only after the block's store completed (kvt_remote_publish), removed
 *                 before its slot is reused (kvt_remote_withdraw); a liveness key per instance
 *                 that expires unless the instance refreshes it; an epoch per instance start.
 *                 A lookup of a request's chained hashes is one round trip (a server-side
 *                 script) and returns the longest prefix whose owners are alive in the epoch
 *                 that published them: a restarted instance's old entries never count. Redis
 *                 holds no KV bytes.
 *   data channel  the bytes, peer to peer. A connection starts with a handshake in which both
 *                 sides prove they hold the space's credential without sending it (keys
 *                 derived from it; docs/security.md); requests and replies are MACed under
 *                 the session. The reader posts UCX tagged receives straight into its
 *                 destinations and sends the owner a request (ZeroMQ); the owner checks that
 *                 each slot still holds the block (generation, hash, and its bytes against
 *                 the tag it recorded at publish) before it sends, and re-checks the
 *                 generation after; the reader accepts a block only if the owner's tag (GMAC
 *                 under a key only members can derive, over the hash and the bytes) checks
 *                 on what landed. So neither a stale entry nor a directory writer without the
 *                 credential can make a reader accept a wrong byte: either costs a miss.
 *
 * Failure: every wait is bounded. An owner that dies or stalls mid-read fails the read's
 * blocks within timeout_ms (the engine recomputes them). Redis unreachable: lookups return no
 * hit and publications are dropped (counted in kvt_remote_stats), never an error; the
 * instance registers again (with a new epoch) once Redis answers. Instances whose hash seed
 * or signature differ from a live instance of the same space are refused at create, naming
 * the other instance (they would never hit each other's blocks).
 *
 * Tensor parallelism: each rank of an engine is an object of its own (config ranks, rank),
 * registered as "<instance>#<rank>", publishing and serving its part of each block; the
 * scheduler's lookup-only client (rank KVT_REMOTE_NO_RANK) finds the blocks all ranks hold.
 *
 * Thread rules: three sides, each called by one thread at a time, any of them at once if need
 * be: the lookup side (lookup, lookup_peer, peer_name, and read / read_slots, which name the
 * last lookup's peers), the publisher side (publish, withdraw: an offload worker's, as its
 * scheduler's metadata asks) and the reader side (read_from: an offload worker's reads, by
 * peer). get_stats may be called on any. The object runs one thread of its own that serves
 * peers' reads and refreshes the liveness key.
 */
#ifndef KVTIER_REMOTE_H
#define KVTIER_REMOTE_H

#include "kvtier/base.h"
#include "kvtier/layout.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVT_REMOTE_NAME_MAX  64u   /* bytes of a space's or an instance's name */
#define KVT_REMOTE_MAX_HASH  32u   /* bytes of a block hash */
#define KVT_REMOTE_MAX_READ  4096u /* blocks per kvt_remote_lookup / kvt_remote_read */
#define KVT_REMOTE_MAX_PEERS 64u   /* distinct owners one lookup may name */

typedef struct kvt_remote_config {
    const char *directory;      /* the Redis server: "host:port" or a unix socket path; required */
    const char *space;          /* the instances that may read each other's blocks: 1..64 bytes
                                   of [A-Za-z0-9_.-]; required */
    const char *instance;       /* this instance, unique in the space (same charset); required */
    const char *listen_host;    /* address the read server binds (tcp); required */
    uint16_t listen_port;       /* 0: any free port (kvt_remote_port tells) */
    const char *advertise_host; /* the address peers use to reach it; default listen_host */
    const char *credential;     /* the space's shared secret, 16..256 bytes; required. Keys are
                                   derived from it at create and it is not kept: it never
                                   leaves the process, not even hashed */
    void *region;               /* the bytes this instance serves: slot s at region +
                                   s * block_bytes (NULL: serve nothing, read only; or
                                   regions below) */
    uint64_t block_bytes;       /* bytes per block, the same in the whole space; required
                                   (with regions: their block bytes summed, or 0 for that) */
    uint32_t n_slots;           /* slots of region (or of each of regions) */
    uint32_t hash_len;          /* bytes per block hash, 1..32; default 16 */
    uint64_t hash_seed;         /* fingerprint of the hash function and its seed (vLLM: the first 8
                                   bytes of the root hash); must agree across the space */
    uint8_t signature[32];      /* digest of what else must agree (model, dtype, layout) */
    uint32_t ttl_ms;     /* liveness key lifetime, refreshed every ttl_ms / 3; default 3000 */
    uint32_t timeout_ms; /* a read's bound, per owner; default 2000 */
    uint32_t directory_timeout_ms; /* bound of one whole directory call (connecting, AUTH, the
                                      request and its reply): a Redis that is slow, stops
                                      half-way or drips bytes costs at most this, then the call
                                      is a miss (or a dropped publication); default 250 */
    uint32_t retry_ms;             /* after Redis failed, how long calls skip it before one tries
                                      to reconnect; default 1000 */
    uint32_t owner_checksum; /* 1 (default): the owner hashes a slot's bytes before it sends and
                                compares with the checksum recorded at publish; 0: it checks
                                generation and hash only, and the reader's check of what landed
                                (always on) catches changed bytes (reads 15-17% faster on
                                2 cores, docs/remote.md) */
    uint32_t n_regions;      /* with regions: how many (1..KVT_MAX_REGIONS) */
    const char *directory_password; /* Redis AUTH (requirepass or an ACL user's password;
                                       "user:password" for an ACL user); NULL: none. A
                                       directory that refuses it fails the create */
    /* Instead of region: a block scattered over several arrays, as a host mirror holds it
     * (kvt_mirror_regions): slot s is regions[0].base + s * regions[0].block_bytes, then
     * regions[1]'s, and so on, n_slots slots each; a block moves as one piece per region and
     * its checksum covers them in order. Every instance of a space must use the same split
     * (the signature says so). NULL: region. */
    const kvt_region *regions;
    uint32_t encrypt; /* 1: the bytes of blocks this instance reads, and of those it serves,
                         travel encrypted (AES-256-GCM under the connection's session key); an
                         owner with encrypt set refuses readers that do not ask for it. 0
                         (default): authenticated (a tag under the owner's key), not secret */
    uint32_t pad0;
    /* An engine of tensor parallelism: every rank holds its part of each block (its heads) and
     * serves and reads only that part, rank r from the owners' rank r. ranks: 0 or 1 (one
     * rank: the object is the whole instance), 2..KVT_REMOTE_MAX_RANKS; rank: which one this
     * object is (0..ranks-1; it registers, publishes and is read as "<instance>#<rank>", so the
     * instance may have at most 62 bytes, 61 past 10 ranks), or KVT_REMOTE_NO_RANK: the directory
     * client of a scheduler, which only looks up (a hit is a block every rank of one or more owners
     * holds, its parts in rank order), serves and reads nothing and never registers (no region,
     * listen host or credential needed). Every instance of a space has the same ranks (the
     * directory refuses another). */
    uint32_t ranks;
    uint32_t rank;
    /* room for fields to come: zero (as kvt_remote_config_init leaves it) */
    uint64_t reserved[1];
} kvt_remote_config;

#define KVT_REMOTE_MAX_RANKS 16u         /* tensor-parallel ranks of one instance */
#define KVT_REMOTE_NO_RANK   0xffffffffu /* kvt_remote_config.rank: lookups only */

typedef struct kvt_remote kvt_remote;

#define KVT_REMOTE_EP_MAX 80u /* bytes of an endpoint "host:port" */

/* An owner: its instance name, the endpoint of its read server and the epoch (start) of it
 * that published the blocks. What a reader needs to reach it, on any thread or process of the
 * space: a lookup's peers (kvt_remote_lookup_peer) travel to the reader as these. */
typedef struct kvt_remote_peer {
    char instance[KVT_REMOTE_NAME_MAX + 1];
    char endpoint[KVT_REMOTE_EP_MAX + 1];
    uint64_t epoch;
} kvt_remote_peer;

/* Where a looked-up block is: an owner (index into this object's peer table, valid until the
 * next kvt_remote_lookup; or, for kvt_remote_read_from, into the peers it is given) and the
 * slot and generation it was published with. */
typedef struct kvt_remote_loc {
    uint32_t peer;
    uint32_t slot;
    uint64_t generation;
} kvt_remote_loc;

typedef struct kvt_remote_stats {
    uint64_t epoch;                /* this instance's epoch (0: not registered) */
    uint64_t registrations;        /* times it registered (Redis restarts, expiries), each
                                      counted once it published again what it holds */
    uint64_t published, withdrawn; /* directory entries written / removed */
    uint64_t publish_dropped;      /* publications lost to an unreachable directory */
    uint64_t lookups, lookup_blocks, hit_blocks;
    uint64_t directory_errors;                 /* Redis round trips that failed or timed out */
    uint64_t reads, read_blocks;               /* blocks asked of peers */
    uint64_t read_ok, read_stale, read_failed; /* their outcomes */
    uint64_t read_bytes;
    uint64_t served_blocks, served_stale, served_bytes; /* this instance as an owner */
    uint64_t refused_requests; /* requests refused: authentication, epoch, malformed */
    uint64_t handshakes;       /* sessions established (as reader and as owner) */
    uint64_t auth_failures;    /* proofs, MACs or block tags that did not check: a peer without
                                  the credential, a replay, bytes changed on the way */
    uint64_t reserved[6];
} kvt_remote_stats;

KVT_API void kvt_remote_config_init(kvt_remote_config *c);
/* Connects to the directory, registers (new epoch; refused when a live instance of the space
 * has another hash seed or signature: KVT_EINVAL naming it), binds the read server and starts
 * its thread. An unreachable directory is not an error: the instance registers when it
 * answers. */
KVT_API int kvt_remote_create(const kvt_remote_config *c, kvt_remote **out);
/* Removes the liveness key (peers stop consulting this instance at once), stops the server
 * and frees everything. Reads in flight have ended (every read is bounded). Safe in any order
 * with an offload manager it was lent to (kvt_offload_attach_remote): while the manager holds
 * it, the destroy is deferred to the manager's kvt_offload_destroy. */
KVT_API void kvt_remote_destroy(kvt_remote *r);
/* The read server's port. */
KVT_API uint16_t kvt_remote_port(const kvt_remote *r);
/* Slots slots[0 .. n) now hold the blocks with hashes[i * hash_len ..], their stores
 * complete: records each one's checksum and generation and writes their directory entries
 * (one round trip). A directory failure is counted (publish_dropped), not returned;
 * KVT_ERANGE for a slot out of range (nothing published). Publishing a slot again replaces
 * its block; the old block's entry stays until overwritten (a read of it is stale, a miss):
 * withdraw before reuse. */
KVT_API int kvt_remote_publish(kvt_remote *r, const uint32_t *slots, const uint8_t *hashes,
                               uint32_t n);
/* Slots slots[0 .. n) are about to be reused: from now on no read is served from them (a read
 * under way is reported stale to its reader), and their directory entries are removed (those
 * still ours; one round trip). */
KVT_API int kvt_remote_withdraw(kvt_remote *r, const uint32_t *slots, uint32_t n);
/* Finds the longest prefix of hashes (n chained block hashes, hash_len bytes each) held by
 * live instances of the space (this one excluded), in one directory round trip: *n_hit
 * blocks, located in out[0 .. *n_hit). An unreachable directory gives *n_hit = 0. With ranks
 * > 1, a block is found when every rank's part is (each filed by an owner's rank of the same
 * index): out holds n * ranks entries, block i's rank k at out[i * ranks + k], and at most
 * KVT_REMOTE_MAX_READ / ranks blocks are looked up per call. */
KVT_API int kvt_remote_lookup(kvt_remote *r, const uint8_t *hashes, uint32_t n, kvt_remote_loc *out,
                              uint32_t *n_hit);
/* Reads n looked-up blocks (locs, their hashes) into dst[i] (block_bytes each). status[i]:
 * 0 (the bytes landed and their checksum matched), KVT_ENOENT (the owner no longer holds the
 * block), KVT_EIO (owner unreachable, dead or too slow: failed within timeout_ms) or
 * KVT_EPROTO (wrong bytes). Returns 0 when every block was read, else the first failure's
 * code; a read refused before it started (bad arguments, no memory) returns that code and
 * writes it as every block's status, so a status of 0 always means read and checked. A destination
 * whose status is KVT_EBUSY may still be written by UCX until kvt_remote_destroy returns (a receive
 * UCX did not give back; not seen in practice). */
KVT_API int kvt_remote_read(kvt_remote *r, const kvt_remote_loc *locs, const uint8_t *hashes,
                            uint32_t n, void *const *dst, int *status);
/* kvt_remote_read into this instance's own slots (region or regions): block i lands in slot
 * slots[i] (which the caller keeps from being served or written meanwhile: withdrawn, not
 * published). The same statuses and return. */
KVT_API int kvt_remote_read_slots(kvt_remote *r, const kvt_remote_loc *locs, const uint8_t *hashes,
                                  uint32_t n, const uint32_t *slots, int *status);
/* kvt_remote_read_slots by peer: block i is read from owner peers[locs[i].peer] (n_peers of
 * them, at most KVT_REMOTE_MAX_PEERS) into this instance's slot slots[i]. The reader side:
 * it may run on another thread than the lookup side, and the peers may come from another
 * process's lookup. The same statuses and return. */
KVT_API int kvt_remote_read_from(kvt_remote *r, const kvt_remote_peer *peers, uint32_t n_peers,
                                 const kvt_remote_loc *locs, const uint8_t *hashes, uint32_t n,
                                 const uint32_t *slots, int *status);
/* Peer `index` of the last lookup, as a reader elsewhere needs it. KVT_ERANGE past the
 * lookup's peers. */
KVT_API int kvt_remote_lookup_peer(const kvt_remote *r, uint32_t index, kvt_remote_peer *out);
/* The endpoint ("host:port") and instance name of peer `index` of the last lookup. */
KVT_API const char *kvt_remote_peer_name(const kvt_remote *r, uint32_t index);
KVT_API void kvt_remote_get_stats(kvt_remote *r, kvt_remote_stats *out);

#ifdef __cplusplus
}
#endif

#endif /* KVTIER_REMOTE_H */
