/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The remote tier's seams (kvtier/remote.h): a directory (which live instance holds which
 * block: an ops table, kvi_rdir_ops, the Redis one in dir_redis.c) and a data channel (the
 * bytes, with the owner's checks): ZeroMQ requests and UCX sends, its messages in chan_wire.c,
 * its owner side in owner.c and its reader side in reader.c. The channel has no ops table of
 * its own yet (issue 58 asks for one, chan.h); kvt_remote (remote.c, remote_impl.h) composes
 * the two.
 */
#ifndef KVT_REMOTE_INTERNAL_H
#define KVT_REMOTE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "kvtier/remote.h"

#define KVI_RDIR_EP_MAX KVT_REMOTE_EP_MAX /* bytes of an endpoint "host:port" */

/* What an instance tells the directory about itself. */
typedef struct kvi_rdir_self {
    const char *space;
    const char *instance; /* as registered: "<instance>#<rank>" for a rank of several */
    const char *base;     /* the instance's own name (a lookup excludes all its ranks) */
    uint32_t ranks;       /* every instance's ranks: entries and hits are per rank */
    uint32_t rank;        /* this one's (KVT_REMOTE_NO_RANK: a lookup-only client) */
    const char *endpoint; /* "host:port" of its read server */
    uint64_t hash_seed;
    const uint8_t *signature; /* 32 bytes */
    uint32_t hash_len;
    uint32_t ttl_ms;
} kvi_rdir_self;

/* Whether `instance` names rank `rank` of an instance of `ranks` ranks ("<I>#<rank>", I not
 * empty), or, with one rank, an instance without a rank. What the directory's lookup and the
 * reader both require of an owner: another rank's part carries a tag that checks. */
static inline bool kvi_rname_is_rank(const char *instance, uint32_t rank, uint32_t ranks)
{
    const char *sharp = strchr(instance, '#');
    if (ranks <= 1)
        return sharp == NULL;
    char want[16];
    snprintf(want, sizeof(want), "#%u", rank);
    return sharp && sharp != instance && strcmp(sharp, want) == 0;
}

/* One directory entry found by a lookup. */
typedef struct kvi_rdir_hit {
    char instance[KVT_REMOTE_NAME_MAX + 1];
    char endpoint[KVI_RDIR_EP_MAX + 1];
    uint64_t epoch;
    uint32_t slot;
    uint64_t generation;
} kvi_rdir_hit;

/* A directory. Every call is one round trip bounded by the directory's timeout; a failed
 * round trip returns KVT_EIO with a message (the caller counts it and goes on). */
typedef struct kvi_rdir_ops {
    /* Registers self: refuses (KVT_EINVAL, naming it) when a live instance of the space has
     * another seed or signature; otherwise drops self's entries of earlier epochs and starts a
     * new epoch with a liveness key of ttl_ms. */
    int (*enter)(void *d, const kvi_rdir_self *self, uint64_t *epoch);
    /* Refreshes the liveness key of epoch; KVT_ENOENT if it expired or belongs to another
     * epoch (the caller registers again). */
    int (*refresh)(void *d, const kvi_rdir_self *self, uint64_t epoch);
    /* Removes the liveness key and self's entries. */
    int (*leave)(void *d, const kvi_rdir_self *self, uint64_t epoch);
    int (*publish)(void *d, const kvi_rdir_self *self, uint64_t epoch, const uint8_t *hashes,
                   const uint32_t *slots, const uint64_t *gens, uint32_t n);
    int (*withdraw)(void *d, const kvi_rdir_self *self, uint64_t epoch, const uint8_t *hashes,
                    const uint32_t *slots, const uint64_t *gens, uint32_t n);
    /* The longest prefix of hashes whose entries name live instances in their current epoch
     * (self excluded): *n_hit blocks, each with self->ranks parts in out (block i's rank k at
     * out[i * ranks + k], an owner registered as rank k). */
    int (*lookup)(void *d, const kvi_rdir_self *self, const uint8_t *hashes, uint32_t n,
                  kvi_rdir_hit *out, uint32_t *n_hit);
    void (*close)(void *d);
} kvi_rdir_ops;

typedef struct kvi_rdir {
    const kvi_rdir_ops *ops;
    void *d;
} kvi_rdir;

/* The worker's reads through remote r (remote_xfer.c; the port's stage_open), and their end:
 * the stage lets go of r, which a kvt_remote_destroy while it read may have left to it. */
struct kvi_xfer_ops;
int kvi_remote_stage_open(kvt_remote *r, uint32_t tier, const struct kvi_xfer_ops **ops,
                          void **impl);
void kvi_remote_unstage(kvt_remote *r);

/* A rank's publications, as its scheduler's metadata asks for them (remote_xfer.c), in two
 * halves so that none waits for the directory on the engine's thread:
 *   kvi_remote_slot_gens     slots' generations now (taken when the publications are asked for);
 *   kvi_remote_publish_at    kvt_remote_publish of the slots whose generation is still
 *                            expect[i]: a slot withdrawn since (its bytes may be another
 *                            block's by now) is left unpublished;
 *   kvi_remote_unpublish     the local half of a withdrawal (every slot when slots is NULL):
 *                            no read is served from them from now on, no publication asked for
 *                            before is made; the ones that were published are written to
 *                            hashes/ws/gens (room for n, or n_slots), their count returned;
 *   kvi_remote_dir_withdraw  the directory's half, for those.
 * publish_at and dir_withdraw are the publisher side (kvtier/remote.h): its own directory
 * connection, atomic counters and scratch; one thread at a time. */
void kvi_remote_slot_gens(kvt_remote *r, const uint32_t *slots, uint32_t n, uint64_t *gens);
int kvi_remote_publish_at(kvt_remote *r, const uint32_t *slots, const uint8_t *hashes,
                          const uint64_t *expect, uint32_t n);
uint32_t kvi_remote_unpublish(kvt_remote *r, const uint32_t *slots, uint32_t n, uint8_t *hashes,
                              uint32_t *ws, uint64_t *gens);
void kvi_remote_dir_withdraw(kvt_remote *r, const uint8_t *hashes, const uint32_t *slots,
                             const uint64_t *gens, uint32_t n);

/* The Redis directory at addr ("host:port" or a unix socket path), authenticating with
 * password (NULL: none; "user:password" for an ACL user). Connects lazily: opening never
 * fails for an unreachable server; a server that refuses the password fails each call with
 * KVT_EINVAL (a configuration error, not an outage). */
int kvi_rdir_redis_open(const char *addr, const char *password, uint32_t timeout_ms,
                        uint32_t retry_ms, kvi_rdir *out);

/* ---- the data channel's wire (chan_wire.c): validated, authenticated ------------------- */

/* A connection starts with a handshake in which each side proves it holds the space's
 * credential without sending it (auth.h): hello (the reader's nonce and ephemeral X25519 key),
 * challenge (the owner's nonce, ephemeral key, instance, boot id and proof over both keys).
 * The reader's first request, MACed with the session key only a member that took part in
 * this handshake can derive, is its proof; the owner reads nothing of a request (its UCX
 * address included) before that MAC checks. The reads' UCX tags come from the session key
 * (kvi_rauth_tag), never from the wire. */
#define KVI_RHELLO_MAGIC  0x4852564bu /* "KVRH" */
#define KVI_RCHAL_MAGIC   0x4352564bu /* "KVRC" */
#define KVI_RREQ_MAGIC    0x5252564bu /* "KVRR" */
#define KVI_RREP_MAGIC    0x5052564bu /* "KVRP" */
#define KVI_RWIRE_VERSION 3u
#define KVI_RCRED_MAX     256u
#define KVI_RADDR_MAX     4096u /* bytes of a UCX worker address */
#define KVI_RREQ_ENCRYPT  1u    /* request flag: send the bytes encrypted under the session */

typedef struct kvi_rhello {
    uint8_t nr[32];      /* the reader's nonce */
    uint8_t er[32];      /* the reader's ephemeral X25519 public key */
    const uint8_t *name; /* the reader's instance name, for the owner's logs */
    uint32_t name_len;
} kvi_rhello;

typedef struct kvi_rchal {
    uint8_t nr[32], no[32]; /* the reader's nonce echoed, the owner's */
    uint8_t er[32], eo[32]; /* the reader's ephemeral key echoed, the owner's */
    uint8_t boot[16];       /* the owner's boot id (its block key) */
    const uint8_t *name;    /* the owner's instance name */
    uint32_t name_len;
    uint8_t proof[32]; /* kvi_rauth_proof("owner", {nr, no, er, eo}, name, boot) */
} kvi_rchal;

typedef struct kvi_rreq_block {
    uint32_t slot;
    uint64_t generation;
    const uint8_t *hash; /* hash_len bytes (into the message) */
} kvi_rreq_block;

typedef struct kvi_rreq {
    uint64_t seq; /* strictly growing per session: a replayed request is refused */
    uint64_t req_id;
    uint64_t epoch; /* the owner's epoch the entries were published in */
    uint32_t flags; /* KVI_RREQ_ENCRYPT */
    uint32_t hash_len;
    const uint8_t *addr; /* the reader's UCX worker address */
    uint32_t addr_len;
    uint32_t n;
    kvi_rreq_block *blocks; /* decode: caller's array of KVT_REMOTE_MAX_READ */
} kvi_rreq;

/* Per block: its outcome and, when sent, its tag: the owner's published tag (GMAC under its
 * block key), or the GCM tag of the encrypted bytes. */
typedef struct kvi_rrep_block {
    int32_t status; /* 0 sent, KVT_ENOENT stale */
    uint8_t tag[16];
} kvi_rrep_block;

typedef struct kvi_rrep {
    uint64_t seq; /* the request's */
    uint64_t req_id;
    int32_t status; /* 0, or the owner's refusal of the whole request */
    uint32_t n;
    kvi_rrep_block *blocks;
} kvi_rrep;

/* Encoders write the whole message; a request's and a reply's last 16 bytes are its MAC,
 * written as zeros here and filled by the caller (over every byte before them). Decoders
 * return KVT_EPROTO / KVT_EVERSION / KVT_ELIMIT with a message; pointers point into buf; a
 * request's or reply's MAC is at buf + len - 16 (kvi_rwire_mac). */
#define KVI_RMAC 16u
/* each message T has T_size (its encoded bytes), T_encode and T_decode */
#define KVI_RWIRE_CODEC(T)                                                                         \
    size_t T##_size(const T *m);                                                                   \
    void T##_encode(const T *m, uint8_t *buf);                                                     \
    int T##_decode(const uint8_t *buf, size_t len, T *m);
KVI_RWIRE_CODEC(kvi_rhello)
KVI_RWIRE_CODEC(kvi_rchal)
KVI_RWIRE_CODEC(kvi_rreq)
KVI_RWIRE_CODEC(kvi_rrep)
/* The magic a message starts with (0 if shorter than 4 bytes). */
uint32_t kvi_rwire_magic(const uint8_t *buf, size_t len);

#endif
