/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Node tier metadata: the shared-memory object that says which slot of a node's shared host
 * tier carries which keys, who pins it and which replicas are alive (kvtier/node.h).
 *
 * Layout of /kvtier.<name>.meta (one mapping, fixed at creation):
 *   header   magic, layout version, the configuration every replica must match, the robust
 *            mutex, the change log's counters, a record per rank (attached, pid, epoch)
 *   slots    per slot: version (bumped by every change of its keys), key count, keys
 *   pins     per rank, per slot: 1 while that rank pins the slot
 *   log      a ring of slot ids: every change appends the slot it touched
 *
 * Every replica keeps a private view of the tier in its host pool (pool_share.h) and brings it
 * up to date at the start of each locked call by reading the log from where it stopped: a
 * peer's slot whose version moved gets its published keys, one of its own slots whose peer
 * pins appeared or vanished gets or loses one local reference (so the owner's pool never
 * hands it out while a peer reads it). A replica that fell a whole ring behind, or that finds
 * a rescan asked for (a holder died inside the lock and may have left half an entry), reads
 * every slot instead. Every update of the metadata is idempotent per slot, so reading an
 * entry twice costs time, never correctness.
 *
 * Liveness is not a heartbeat: each replica holds an open-file-description write lock on
 * byte `rank` of the metadata object, which the kernel drops when the process dies; F_OFD_GETLK
 * from another description tells whether it is still held.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/config.h"
#include "base/error.h"
#include "base/guard.h"
#include "base/log.h"
#include "base/util.h"
#include "node/node_config.h"
#include "node/node_internal.h"
#include "base/shm.h"
#include "pool/pool_share.h"

#define NODE_MAGIC   0x314e544e5456414bull /* "KAVTNTN1" */
#define NODE_LAYOUT  1u
#define LOG_MIN      4096u
#define OPEN_WAIT_MS 2000u

struct node_slot {
    uint32_t version;
    uint32_t n_keys;
    uint8_t keys[]; /* n_keys x key_stride: hash, group (u32), num_tokens (u32) */
};

/* Where things are in the metadata object: computed from this replica's own configuration
 * (which attach compares with the header's) and never read back from the shared header, so
 * that nothing another process writes there can move an access out of the mapping. */
struct node_lay {
    size_t slot_stride, slots_off, pins_off, log_off, size;
    uint32_t log_cap;
};

#define STEM_MAX (KVT_NODE_NAME_MAX + 40) /* "<name>.<32 hex>" */

struct kvt_node {
    kvt_node_config cfg;
    char name[KVT_NODE_NAME_MAX + 1];
    char group[64];
    char dir[1024];      /* the rendezvous's directory (kvi_shm_dir) */
    char stem[STEM_MAX]; /* the objects' names: /kvtier.<stem>.meta, .data (kvi_shm_stem) */
    kvi_shm_share share;
    int fd;
    struct node_hdr *h;
    size_t size;
    struct node_lay lay;
    uint32_t total, own_lo, own_hi, me;
    size_t key_stride;
    uint32_t *seen; /* per slot: the version the pool's view holds */
    uint8_t *busy;  /* per slot: own slot held by one local reference for the peers' pins */
    uint64_t seq, rescan;
    kvt_pool *pool;
    uint32_t depth;
    int guard;     /* the metadata mapping's SIGBUS guard (base/guard.h) */
    bool lost;     /* a sharer shrank the metadata object: this replica goes on alone, peers' blocks
                      are misses (meta_lost) */
    bool orphaned; /* detached by its owner while still lent: freed when the manager unbinds */
    uint32_t calls; /* locked calls, for the reap clock */
    uint64_t next_reap_ns;
    /* scratch of one slot's keys */
    uint8_t *khash;
    uint32_t *kgroup, *ktok;
    kvt_node_stats st;
};

/* ---- the shared object ----------------------------------------------------------------- */

static inline struct node_slot *slot_at(const kvt_node *n, uint32_t s)
{
    return (struct node_slot *)((char *)n->h + n->lay.slots_off + (size_t)s * n->lay.slot_stride);
}

static inline uint8_t *pins_of(const kvt_node *n, uint32_t r)
{
    return (uint8_t *)n->h + n->lay.pins_off + (size_t)r * n->total;
}

static inline uint32_t *log_ring(const kvt_node *n)
{
    return (uint32_t *)((char *)n->h + n->lay.log_off);
}

static void log_slot(kvt_node *n, uint32_t s)
{
    struct node_hdr *h = n->h;
    log_ring(n)[h->log_seq % n->lay.log_cap] = s;
    h->log_seq++;
}

/* An object of the tier whose stem (kvi_shm_stem) is `stem`; buf holds STEM_MAX + 16 bytes */
static void shm_path(char *buf, size_t cap, const char *stem, const char *kind)
{
    snprintf(buf, cap, KVI_NODE_SHM_NAME, stem, kind);
}

/* Removes the objects named by stem, then the rendezvous of `name` in dir. */
static int unlink_stem(const char *name, const char *dir, const char *stem)
{
    static const char *const kinds[] = {"meta", "data"};
    for (int i = 0; i < 2; i++) {
        char path[STEM_MAX + 16];
        shm_path(path, sizeof(path), stem, kinds[i]);
        if (shm_unlink(path) != 0 && errno != ENOENT)
            return kvi_fail_errno(errno, "node %s: cannot remove %s", name, path);
    }
    return kvi_shm_forget(dir, name);
}

static int check_name(const char *name)
{
    if (!name || !*name)
        return kvt_fail(KVT_EINVAL, "node: name is required");
    size_t len = strlen(name);
    if (len > KVT_NODE_NAME_MAX)
        return kvt_fail(KVT_EINVAL, "node: name '%.48s...' is longer than %u bytes", name,
                        KVT_NODE_NAME_MAX);
    for (size_t i = 0; i < len; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.'))
            return kvt_fail(KVT_EINVAL, "node: name '%s' has '%c'; use [A-Za-z0-9_.-]", name, c);
    }
    return 0;
}

/* Whether rank r's process still holds its liveness lock (true when it cannot be told). */
static bool rank_alive(const kvt_node *n, uint32_t r)
{
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = r, .l_len = 1};
    if (fcntl(n->fd, F_OFD_GETLK, &fl) != 0)
        return true;
    return fl.l_type != F_UNLCK;
}

/* Rank r's pins released and its slots withdrawn (locked). */
static void withdraw_rank(kvt_node *n, uint32_t r)
{
    uint8_t *pins = pins_of(n, r);
    for (uint32_t s = 0; s < n->total; s++)
        if (pins[s]) {
            pins[s] = 0;
            log_slot(n, s);
        }
    uint32_t bpr = n->cfg.blocks_per_rank;
    for (uint32_t s = r * bpr + 1; s < (r + 1) * bpr; s++) {
        struct node_slot *sl = slot_at(n, s);
        if (sl->n_keys) {
            sl->n_keys = 0;
            sl->version++;
            log_slot(n, s);
        }
    }
}

/* Rank r is gone: withdrawn, its record cleared (locked). */
static void cleanup_rank(kvt_node *n, uint32_t r)
{
    withdraw_rank(n, r);
    n->h->rank[r].attached = 0;
    n->h->rank[r].pid = 0;
}

static int reap_locked(kvt_node *n)
{
    int reaped = 0;
    for (uint32_t r = 0; r < n->cfg.ranks; r++) {
        if (r == n->me || !n->h->rank[r].attached || rank_alive(n, r))
            continue;
        KVT_LOG_W("node %s: replica %u (pid %d) is gone; releasing its pins and withdrawing "
                  "its slots",
                  n->name, r, n->h->rank[r].pid);
        cleanup_rank(n, r);
        n->st.reaped++;
        reaped++;
    }
    return reaped;
}

/* ---- the pool's view -------------------------------------------------------------------- */

static void node_free(kvt_node *n);

static bool own_slot(const kvt_node *n, uint32_t s)
{
    return s >= n->own_lo && s < n->own_hi;
}

/* Whether any replica but this one pins slot s. */
static bool peer_pinned(const kvt_node *n, uint32_t s)
{
    for (uint32_t r = 0; r < n->cfg.ranks; r++)
        if (r != n->me && pins_of(n, r)[s])
            return true;
    return false;
}

/* Whether a sharer shrank the metadata object under us (a replica of this user, or a member of
 * the group: the SIGBUS guard put zero pages in its place). The first time: every peer slot's
 * keys are dropped from the pool (their blocks are misses from now: nothing tells this replica
 * any more what they hold), and the lock, the log and the peers' pins are no longer used. The
 * replica goes on with its own slots alone, never crashing. */
static bool meta_lost(kvt_node *n)
{
    if (n->lost || !kvi_guard_poisoned(n->guard))
        return n->lost;
    n->lost = true;
    KVT_LOG_E("node %s: the metadata object was cut short by another process; this replica "
              "goes on alone (the peers' blocks are misses)",
              n->name);
    for (uint32_t s = 0; n->pool && s < n->total; s++)
        if (!own_slot(n, s) && s % n->cfg.blocks_per_rank != 0)
            (void)kvi_pool_share_set_keys(n->pool, s, 0, NULL, NULL, NULL);
    return true;
}

/* Brings the pool's view of slot s up to date (locked, bound). */
static void sync_slot(kvt_node *n, uint32_t s)
{
    if (s >= n->total || s % n->cfg.blocks_per_rank == 0)
        return;
    if (own_slot(n, s)) {
        bool pinned = peer_pinned(n, s);
        if (pinned && !n->busy[s]) {
            n->busy[s] = 1;
            (void)kvt_pool_touch(n->pool, &s, 1);
        } else if (!pinned && n->busy[s]) {
            n->busy[s] = 0;
            (void)kvt_pool_free(n->pool, &s, 1);
        }
        return;
    }
    const struct node_slot *sl = slot_at(n, s);
    uint32_t version = sl->version;
    if (version == n->seen[s])
        return;
    n->seen[s] = version;
    uint32_t nk = sl->n_keys;
    const uint32_t hl = n->cfg.hash_len;
    if (nk > n->cfg.keys_per_block)
        nk = 0; /* a record no replica could have written: treat as empty */
    for (uint32_t i = 0; i < nk; i++) {
        const uint8_t *k = sl->keys + i * n->key_stride;
        memcpy(n->khash + (size_t)i * hl, k, hl);
        memcpy(&n->kgroup[i], k + hl, 4);
        memcpy(&n->ktok[i], k + hl + 4, 4);
    }
    if (kvi_pool_share_set_keys(n->pool, s, nk, n->khash, n->kgroup, n->ktok) != 0) {
        KVT_LOG_W("node %s: slot %u: %s; ignored", n->name, s, kvt_last_error());
        (void)kvi_pool_share_set_keys(n->pool, s, 0, NULL, NULL, NULL);
    }
}

static void refresh(kvt_node *n)
{
    if (meta_lost(n))
        return;
    struct node_hdr *h = n->h;
    /* the clock is read every 64th locked call: a call costs tens of nanoseconds */
    if (n->cfg.reap_interval_ms && (++n->calls & 63) == 0) {
        uint64_t t = kvt_monotonic_ns();
        if (t >= n->next_reap_ns) {
            reap_locked(n);
            n->next_reap_ns = t + (uint64_t)n->cfg.reap_interval_ms * 1000000ull;
        }
    }
    const uint32_t cap = n->lay.log_cap;
    if (n->rescan != h->rescan_seq || h->log_seq - n->seq > cap) {
        for (uint32_t s = 0; s < n->total; s++)
            sync_slot(n, s);
        n->seq = h->log_seq;
        n->rescan = h->rescan_seq;
        n->st.full_rescans++;
        return;
    }
    for (; n->seq != h->log_seq; n->seq++)
        sync_slot(n, log_ring(n)[n->seq % cap]);
}

/* The mutex is ours (rc 0), or ours from a holder that died inside it (EOWNERDEAD): that one
 * is reaped and every replica rescans every slot. */
static int locked(kvt_node *n, int rc)
{
    if (rc == EOWNERDEAD) {
        KVT_LOG_W("node %s: a replica died holding the metadata lock; repairing", n->name);
        pthread_mutex_consistent(&n->h->lock);
        n->h->rescan_seq++;
        n->st.lock_recoveries++;
        n->h->holder = (int32_t)n->me;
        reap_locked(n);
        return 0;
    }
    n->h->holder = (int32_t)n->me;
    return 0;
}

/* Takes the mutex; a holder that died inside it is reaped and every replica rescans. */
static int lock_raw(kvt_node *n)
{
    if (meta_lost(n))
        return 0; /* nothing shared is left to lock */
    /* uncontended: one trylock. (It also reports a dead holder as EOWNERDEAD to
     * ThreadSanitizer, whose timedlock interceptor records only a plain success.) */
    int rc = pthread_mutex_trylock(&n->h->lock);
    if (rc == 0 || rc == EOWNERDEAD)
        return locked(n, rc);
    if (rc != EBUSY)
        return kvi_fail_errno(rc, "node %s: cannot take the metadata lock", n->name);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until); /* pthread_mutex_timedlock's clock */
    uint64_t ns = (uint64_t)until.tv_nsec + (uint64_t)n->cfg.lock_timeout_ms * 1000000ull;
    until.tv_sec += (time_t)(ns / 1000000000ull);
    until.tv_nsec = (long)(ns % 1000000000ull);
    rc = pthread_mutex_timedlock(&n->h->lock, &until);
    if (rc == ETIMEDOUT) {
        int32_t holder = n->h->holder;
        int pid = holder >= 0 && (uint32_t)holder < n->cfg.ranks ? n->h->rank[holder].pid : 0;
        return kvt_fail(KVT_EBUSY,
                        "node %s: replica %d (pid %d) has held the metadata lock for over %u "
                        "ms; is it stopped?",
                        n->name, holder, pid, n->cfg.lock_timeout_ms);
    }
    if (rc != 0 && rc != EOWNERDEAD)
        return kvi_fail_errno(rc, "node %s: cannot take the metadata lock", n->name);
    return locked(n, rc);
}

static void unlock_raw(kvt_node *n)
{
    if (n->lost)
        return;
    n->h->holder = -1;
    pthread_mutex_unlock(&n->h->lock); /* poisoned meanwhile: EPERM on the zero page, harmless */
}

int kvi_node_lock(kvt_node *n)
{
    if (n->depth++)
        return 0;
    int rc = lock_raw(n);
    if (rc) {
        n->depth = 0;
        return rc;
    }
    if (n->pool)
        refresh(n);
    return 0;
}

void kvi_node_unlock(kvt_node *n)
{
    if (n->depth && --n->depth == 0)
        unlock_raw(n);
}

bool kvi_node_let_go(kvt_node *n)
{
    if (n->depth != 1)
        return false;
    n->depth = 0;
    unlock_raw(n);
    return true;
}

/* The pool's reports (pool_share.h). They run inside the manager's locked calls; one that
 * does not takes the mutex for itself, without refreshing (the pool is mid-operation). */
static bool hook_enter(kvt_node *n)
{
    if (n->depth)
        return false;
    if (lock_raw(n) != 0) {
        KVT_LOG_E("node %s: %s; the metadata is updated unlocked", n->name, kvt_last_error());
        return false;
    }
    n->depth = 1;
    return true;
}

static void hook_leave(kvt_node *n, bool locked_here)
{
    if (locked_here)
        kvi_node_unlock(n);
}

static void hook_pin(void *ctx, uint32_t s, bool on)
{
    kvt_node *n = ctx;
    bool mine = hook_enter(n);
    pins_of(n, n->me)[s] = on;
    log_slot(n, s);
    hook_leave(n, mine);
}

static void hook_publish(void *ctx, uint32_t s, const uint8_t *hash, uint32_t group,
                         uint32_t num_tokens)
{
    kvt_node *n = ctx;
    bool mine = hook_enter(n);
    struct node_slot *sl = slot_at(n, s);
    uint32_t nk = sl->n_keys, hl = n->cfg.hash_len;
    if (nk < n->cfg.keys_per_block) {
        uint8_t *k = sl->keys + nk * n->key_stride;
        memcpy(k, hash, hl);
        memcpy(k + hl, &group, 4);
        memcpy(k + hl + 4, &num_tokens, 4);
        sl->n_keys = nk + 1;
        sl->version++;
        log_slot(n, s);
    }
    hook_leave(n, mine);
}

static void hook_unpublish(void *ctx, uint32_t s)
{
    kvt_node *n = ctx;
    bool mine = hook_enter(n);
    struct node_slot *sl = slot_at(n, s);
    if (sl->n_keys) {
        sl->n_keys = 0;
        sl->version++;
        log_slot(n, s);
    }
    hook_leave(n, mine);
}

static const struct kvi_pool_share_ops share_ops = {
    .pin = hook_pin, .publish = hook_publish, .unpublish = hook_unpublish};

int kvi_node_bind(kvt_node *n, kvt_pool *pool)
{
    if (n->pool)
        return kvt_fail(KVT_ESTATE, "node %s: already lent to an offload manager", n->name);
    kvt_pool_config pc;
    kvt_pool_get_config(pool, &pc);
    if (pc.num_blocks != n->total)
        return kvt_fail(KVT_EINVAL,
                        "node %s: the host tier has %u blocks; the node tier has %u slots "
                        "(host_blocks must be kvt_node_num_slots)",
                        n->name, pc.num_blocks, n->total);
    if (pc.hash_len != n->cfg.hash_len || pc.keys_per_block != n->cfg.keys_per_block ||
        pc.hash_block_size != n->cfg.hash_block_size)
        return kvt_fail(KVT_EINVAL,
                        "node %s: the host pool hashes %u-byte keys, %u per block, %u tokens "
                        "each; the node tier was created for %u, %u, %u",
                        n->name, pc.hash_len, pc.keys_per_block, pc.hash_block_size,
                        n->cfg.hash_len, n->cfg.keys_per_block, n->cfg.hash_block_size);
    int rc = kvi_node_lock(n); /* no pool yet: no refresh, the rescan below is the one */
    if (rc)
        return rc;
    rc = kvi_pool_share(pool, n->own_lo, n->own_hi, &share_ops, n);
    if (!rc) {
        n->pool = pool;
        memset(n->seen, 0, n->total * sizeof(*n->seen));
        memset(n->busy, 0, n->total);
        n->rescan = n->h->rescan_seq - 1; /* read every slot now */
        refresh(n);
    }
    kvi_node_unlock(n);
    return rc;
}

void kvi_node_unbind(kvt_node *n)
{
    if (n->pool && lock_raw(n) == 0) {
        withdraw_rank(n, n->me);
        unlock_raw(n);
    }
    n->pool = NULL;
    if (n->orphaned) /* its owner detached it first */
        node_free(n);
}

/* ---- attach / detach -------------------------------------------------------------------- */

const kvi_config_table kvi_node_config_table =
    KVI_CONFIG_TABLE(kvt_node_config, "node", KVI_NODE_CONFIG(KVI_NODE_CONFIG_ROW));

void kvt_node_config_init(kvt_node_config *cfg)
{
    kvi_config_init(&kvi_node_config_table, cfg);
}

/* The rows' bounds (node/node_config.h), then what no row can say. */
static int validate(const kvt_node_config *c)
{
    if (kvi_config_check(&kvi_node_config_table, c))
        return KVT_EINVAL;
    int rc = check_name(c->name);
    if (rc)
        return rc;
    if (c->rank >= c->ranks)
        return kvt_fail(KVT_ERANGE, "node: rank %u out of range (%u ranks)", c->rank, c->ranks);
    if ((uint64_t)c->blocks_per_rank * c->ranks >= UINT32_MAX)
        return kvt_fail(KVT_ERANGE, "node: %u ranks x %u blocks overflow slot ids", c->ranks,
                        c->blocks_per_rank);
    if (c->group && (!*c->group || strlen(c->group) >= 64))
        return kvt_fail(KVT_EINVAL, "node: group must be 1..63 bytes (or NULL: this user only)");
    return 0;
}

/* Where things are for a tier of this shape (the fields the header records); false when the
 * shape does not fit in memory. */
static bool meta_layout(uint32_t ranks, uint32_t bpr, uint32_t hash_len, uint32_t kpb,
                        struct node_lay *l)
{
    uint64_t total = (uint64_t)ranks * bpr;
    uint64_t ks = hash_len + 8u;
    l->slot_stride = (sizeof(struct node_slot) + ks * kpb + 7) & ~(size_t)7;
    l->slots_off = (sizeof(struct node_hdr) + 63) & ~(size_t)63;
    uint64_t cap = total * 2 > LOG_MIN ? total * 2 : LOG_MIN;
    l->log_cap = (uint32_t)(cap > UINT32_MAX / 2 ? UINT32_MAX / 2 : cap);
    size_t slots, pins, log;
    if (__builtin_mul_overflow(total, l->slot_stride, &slots) ||
        __builtin_mul_overflow(total, (uint64_t)ranks, &pins) ||
        __builtin_add_overflow(l->slots_off, slots, &l->pins_off) ||
        __builtin_add_overflow(l->pins_off, pins + 7, &l->log_off))
        return false;
    l->log_off &= ~(size_t)7;
    log = (size_t)l->log_cap * sizeof(uint32_t);
    return !__builtin_add_overflow(l->log_off, log, &l->size);
}

/* The creator fills a fresh object of `size` bytes. */
static int init_meta(struct node_hdr *h, const kvt_node_config *c, const struct node_lay *l)
{
    h->magic = NODE_MAGIC;
    h->layout = NODE_LAYOUT;
    h->ranks = c->ranks;
    h->bpr = c->blocks_per_rank;
    h->hash_len = c->hash_len;
    h->kpb = c->keys_per_block;
    h->hash_block_size = c->hash_block_size;
    h->block_bytes = c->block_bytes;
    h->hash_seed = c->hash_seed;
    memcpy(h->signature, c->signature, sizeof(h->signature));
    h->slot_stride = l->slot_stride;
    h->slots_off = l->slots_off;
    h->pins_off = l->pins_off;
    h->log_off = l->log_off;
    h->size = l->size;
    h->log_cap = l->log_cap;
    h->holder = -1;
    pthread_mutexattr_t a;
    int rc = pthread_mutexattr_init(&a);
    if (!rc)
        rc = pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    if (!rc)
        rc = pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    if (!rc)
        rc = pthread_mutex_init(&h->lock, &a);
    pthread_mutexattr_destroy(&a);
    if (rc)
        return kvi_fail_errno(rc, "node: cannot set up a robust process-shared mutex");
    __atomic_store_n(&h->ready, 1, __ATOMIC_RELEASE);
    return 0;
}

/* What differs between the tier's header and this replica's config (NULL: nothing). */
static const char *mismatch(const struct node_hdr *h, const kvt_node_config *c, char *buf,
                            size_t cap)
{
#define DIFF(what, fmt, a, b)                                                                      \
    if ((a) != (b)) {                                                                              \
        snprintf(buf, cap, what ": this replica " fmt ", the tier " fmt, (a), (b));                \
        return buf;                                                                                \
    }
    DIFF("ranks", "%u", c->ranks, h->ranks);
    DIFF("blocks_per_rank", "%u", c->blocks_per_rank, h->bpr);
    DIFF("hash length", "%u", c->hash_len, h->hash_len);
    DIFF("keys_per_block", "%u", c->keys_per_block, h->kpb);
    DIFF("hash block size", "%u", c->hash_block_size, h->hash_block_size);
    DIFF("block bytes (the KV layout)", "%llu", (unsigned long long)c->block_bytes,
         (unsigned long long)h->block_bytes);
    DIFF("hash seed (set the same PYTHONHASHSEED or a sha256 hash on every replica, or no "
         "prefix would ever match)",
         "%016llx", (unsigned long long)c->hash_seed, (unsigned long long)h->hash_seed);
#undef DIFF
    if (memcmp(c->signature, h->signature, sizeof(h->signature)) != 0) {
        snprintf(buf, cap, "configuration signature (model, dtype or cache groups) differs");
        return buf;
    }
    return NULL;
}

int kvi_node_header_check(const void *p, size_t size)
{
    const struct node_hdr *h = p;
    if (size < sizeof(*h))
        return kvt_fail(KVT_EPROTO, "node: a metadata object of %zu bytes (a header is %zu)", size,
                        sizeof(*h));
    if (h->magic != NODE_MAGIC || h->layout != NODE_LAYOUT)
        return kvt_fail(KVT_EVERSION,
                        "node: not a node tier of this kvtier version (layout %u, this build "
                        "reads %u)",
                        h->layout, NODE_LAYOUT);
    if (h->ranks < 1 || h->ranks > KVT_NODE_MAX_RANKS || h->bpr < 2 ||
        (uint64_t)h->ranks * h->bpr >= UINT32_MAX || h->hash_len < 1 ||
        h->hash_len > KVT_HASH_MAX || h->kpb < 1 || h->kpb > 64 || h->hash_block_size < 1)
        return kvt_fail(KVT_EPROTO,
                        "node: a header with ranks %u, blocks_per_rank %u, hash_len %u, "
                        "keys_per_block %u, hash_block_size %u (out of range)",
                        h->ranks, h->bpr, h->hash_len, h->kpb, h->hash_block_size);
    struct node_lay l;
    if (!meta_layout(h->ranks, h->bpr, h->hash_len, h->kpb, &l) || h->size != size ||
        l.size != size || h->slot_stride != l.slot_stride || h->slots_off != l.slots_off ||
        h->pins_off != l.pins_off || h->log_off != l.log_off || h->log_cap != l.log_cap)
        return kvt_fail(KVT_EPROTO,
                        "node: a header whose offsets, capacities or size (%" PRIu64
                        " bytes recorded, %zu mapped) are not the ones its shape gives",
                        h->size, size);
    return 0;
}

/* Succeeded (rc 0): the descriptor and the mapping of `size` bytes become the node's. Failed:
 * both are let go, and the object is unlinked when its creator failed (unlink_path). */
static int keep_meta(kvt_node *n, int rc, int fd, void *p, size_t size, const char *unlink_path)
{
    if (rc) {
        if (p && p != MAP_FAILED)
            munmap(p, size);
        close(fd);
        if (unlink_path)
            shm_unlink(unlink_path);
        return rc;
    }
    /* a sharer may shrink the object: a SIGBUS then poisons this mapping, not the process */
    if ((rc = kvi_guard_add(p, size, &n->guard))) {
        munmap(p, size);
        close(fd);
        if (unlink_path)
            shm_unlink(unlink_path);
        return rc;
    }
    n->fd = fd;
    n->h = p;
    n->size = size;
    return 0;
}

/* The creator's part: the object sized, mapped and filled (ready set last). */
static int create_meta(kvt_node *n, const kvt_node_config *c, int fd, const char *path)
{
    const size_t size = n->lay.size;
    void *p = MAP_FAILED;
    int rc;
    if (ftruncate(fd, (off_t)size) != 0)
        rc = kvi_fail_errno(errno, "node %s: cannot size the metadata object to %zu bytes", n->name,
                            size);
    else if ((p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED)
        rc = kvi_fail_errno(errno, "node %s: cannot map metadata", n->name);
    else
        rc = init_meta(p, c, &n->lay);
    return keep_meta(n, rc, fd, p, size, path);
}

/* A joiner's part: the object mapped once its creator has sized it, then waited for until
 * the creator marks it ready (OPEN_WAIT_MS at most). *h and *mapped: what was mapped. */
static int await_meta(kvt_node *n, int fd, const char *path, struct node_hdr **h, size_t *mapped)
{
    struct stat st;
    for (uint32_t waited = 0;; waited++) {
        if (fstat(fd, &st) != 0)
            return kvi_fail_errno(errno, "node %s: cannot stat %s", n->name, path);
        if ((size_t)st.st_size >= sizeof(**h)) {
            if (!*h) {
                *mapped = (size_t)st.st_size;
                *h = mmap(NULL, *mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            }
            if (*h == MAP_FAILED) {
                *h = NULL;
                return kvi_fail_errno(errno, "node %s: cannot map %s", n->name, path);
            }
            if (__atomic_load_n(&(*h)->ready, __ATOMIC_ACQUIRE))
                return 0;
        }
        if (waited >= OPEN_WAIT_MS)
            return kvt_fail(KVT_EBUSY,
                            "node %s: %s was never finished by its creator (remove it with "
                            "kvt_node_unlink if no replica runs)",
                            n->name, path);
        usleep(1000);
    }
}

/* Opens the metadata object, creating and filling it if absent, and maps it. An existing
 * object must be ours (kvi_shm_open) and its header must check before anything in it is
 * used. */
static int open_meta(kvt_node *n, const kvt_node_config *c)
{
    char path[STEM_MAX + 16], who[80];
    /* the names, from the rendezvous (made by the first replica or worker to come) */
    int rc = kvi_shm_stem(n->dir, n->name, &n->share, true, n->stem, sizeof(n->stem));
    if (rc)
        return kvi_fail_wrap(rc, "node");
    shm_path(path, sizeof(path), n->stem, "meta");
    snprintf(who, sizeof(who), "node %s", n->name);
    int fd;
    bool created;
    rc = kvi_shm_open(path, &n->share, who, &fd, &created);
    if (rc)
        return rc;
    if (created)
        return create_meta(n, c, fd, path);
    /* the creator may still be sizing and filling it */
    struct node_hdr *h = NULL;
    size_t mapped = 0;
    rc = await_meta(n, fd, path, &h, &mapped);
    if (!rc && (rc = kvi_node_header_check(h, mapped)))
        rc = kvt_fail(rc, "node %s: %s: %s; remove it with kvt_node_unlink once no replica uses it",
                      n->name, path, kvt_last_error());
    return keep_meta(n, rc, fd, h, mapped, NULL);
}

static void close_meta(kvt_node *n)
{
    kvi_guard_remove(n->guard);
    n->guard = -1;
    if (n->h)
        munmap(n->h, n->size);
    if (n->fd >= 0)
        close(n->fd);
    n->h = NULL;
    n->fd = -1;
}

/* Whether the name still refers to the object n mapped (a last detach may have removed it
 * between our open and our lock). */
static bool name_current(const kvt_node *n)
{
    char path[STEM_MAX + 16];
    shm_path(path, sizeof(path), n->stem, "meta");
    int fd = shm_open(path, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0)
        return false;
    struct stat a, b;
    bool same =
        fstat(fd, &a) == 0 && fstat(n->fd, &b) == 0 && a.st_ino == b.st_ino && a.st_dev == b.st_dev;
    close(fd);
    return same;
}

static uint32_t attached_alive(kvt_node *n)
{
    uint32_t k = 0;
    for (uint32_t r = 0; r < n->cfg.ranks; r++)
        k += n->h->rank[r].attached && (r == n->me || rank_alive(n, r));
    return k;
}

static void node_free(kvt_node *n)
{
    if (n->h && !meta_lost(n) && lock_raw(n) == 0) {
        cleanup_rank(n, n->me);
        bool last = attached_alive(n) == 0;
        if (last)
            unlink_stem(n->name, n->dir, n->stem);
        unlock_raw(n);
    }
    close_meta(n);
    free(n->seen);
    free(n->busy);
    free(n->khash);
    free(n->kgroup);
    free(n->ktok);
    free(n);
}

void kvt_node_detach(kvt_node *n)
{
    if (!n)
        return;
    if (n->pool) { /* still lent: the manager's destroy detaches it (any order is safe) */
        n->orphaned = true;
        return;
    }
    node_free(n);
}

/* The handle with its private state; the tier not yet opened. */
static int node_new(const kvt_node_config *cfg, kvt_node **out)
{
    int rc;
    kvt_node *n = calloc(1, sizeof(*n));
    if (!n)
        return kvt_fail(KVT_ENOMEM, "node: out of memory");
    n->fd = -1;
    n->guard = -1;
    n->cfg = *cfg;
    snprintf(n->name, sizeof(n->name), "%s", cfg->name);
    n->cfg.name = n->name;
    n->me = cfg->rank;
    n->total = cfg->ranks * cfg->blocks_per_rank;
    n->own_lo = cfg->rank * cfg->blocks_per_rank + 1;
    n->own_hi = (cfg->rank + 1) * cfg->blocks_per_rank;
    n->key_stride = cfg->hash_len + 8u;
    if (cfg->group)
        snprintf(n->group, sizeof(n->group), "%s", cfg->group);
    n->cfg.group = cfg->group ? n->group : NULL;
    if ((rc = kvi_shm_share_of(cfg->group, &n->share)) ||
        (rc = kvi_shm_dir(cfg->dir, &n->share, n->dir, sizeof(n->dir)))) {
        kvt_node_detach(n);
        return kvi_fail_wrap(rc, "node");
    }
    n->cfg.dir = n->dir;
    if (!meta_layout(cfg->ranks, cfg->blocks_per_rank, cfg->hash_len, cfg->keys_per_block,
                     &n->lay)) {
        kvt_node_detach(n);
        return kvt_fail(KVT_ERANGE, "node: %u ranks x %u blocks do not fit in memory", cfg->ranks,
                        cfg->blocks_per_rank);
    }
    n->seen = calloc(n->total, sizeof(*n->seen));
    n->busy = calloc(n->total, 1);
    n->khash = calloc(cfg->keys_per_block, cfg->hash_len);
    n->kgroup = calloc(cfg->keys_per_block, sizeof(uint32_t));
    n->ktok = calloc(cfg->keys_per_block, sizeof(uint32_t));
    if (!n->seen || !n->busy || !n->khash || !n->kgroup || !n->ktok) {
        kvt_node_detach(n);
        return kvt_fail(KVT_ENOMEM, "node: out of memory for %u slots", n->total);
    }
    *out = n;
    return 0;
}

/* Takes this rank's liveness lock (no live process may hold it) and registers the rank, under
 * the tier's lock, which it releases. */
static int take_rank(kvt_node *n, const kvt_node_config *cfg)
{
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = cfg->rank, .l_len = 1};
    if (fcntl(n->fd, F_OFD_SETLK, &fl) != 0) {
        int e = errno;
        int pid = n->h->rank[cfg->rank].pid;
        unlock_raw(n);
        return (e == EAGAIN || e == EACCES)
                   ? kvt_fail(KVT_EBUSY, "node %s: rank %u is attached by a live process (pid %d)",
                              n->name, cfg->rank, pid)
                   : kvi_fail_errno(e, "node %s: cannot take rank %u's liveness lock", n->name,
                                    cfg->rank);
    }
    if (n->h->rank[n->me].attached) /* a previous instance died without detaching */
        cleanup_rank(n, n->me);
    reap_locked(n);
    n->h->epochs++;
    n->h->rank[n->me] = (struct node_rank){1, (int32_t)getpid(), n->h->epochs};
    n->st.epoch = n->h->epochs;
    n->seq = n->h->log_seq;
    n->rescan = n->h->rescan_seq;
    n->next_reap_ns = kvt_monotonic_ns() + (uint64_t)cfg->reap_interval_ms * 1000000ull;
    unlock_raw(n);
    return 0;
}

#define JOIN_AGAIN 1 /* the tier was removed or replaced meanwhile: open it again */

/* One attempt to join the tier: 0, JOIN_AGAIN or an error. */
static int join_once(kvt_node *n, const kvt_node_config *cfg, int attempt)
{
    int rc = open_meta(n, cfg);
    if (rc || (rc = lock_raw(n)))
        return rc;
    if (!name_current(n)) { /* removed by a last detach meanwhile: start over */
        unlock_raw(n);
        close_meta(n);
        return attempt < 3 ? JOIN_AGAIN
                           : kvt_fail(KVT_EBUSY, "node %s: the tier keeps being removed", n->name);
    }
    char why[256];
    const char *diff = mismatch(n->h, cfg, why, sizeof(why));
    if (diff) {
        bool stale = attached_alive(n) == 0;
        unlock_raw(n);
        if (stale && attempt < 3) {
            KVT_LOG_W("node %s: replacing a tier left by dead replicas (%s)", n->name, diff);
            unlink_stem(n->name, n->dir, n->stem);
            close_meta(n);
            return JOIN_AGAIN;
        }
        return kvt_fail(KVT_EINVAL, "node %s: %s", n->name, diff);
    }
    return take_rank(n, cfg);
}

int kvt_node_attach(const kvt_node_config *cfg, kvt_node **out)
{
    if (!out)
        return kvt_fail(KVT_EINVAL, "node: attach: out is NULL");
    *out = NULL;
    if (!cfg)
        return kvt_fail(KVT_EINVAL, "node: attach: config is NULL");
    kvt_node *n = NULL;
    int rc = validate(cfg);
    if (rc || (rc = node_new(cfg, &n)))
        return rc;
    for (int attempt = 0; (rc = join_once(n, cfg, attempt)) == JOIN_AGAIN; attempt++)
        ;
    if (rc == 0) {
        *out = n;
        return 0;
    }
    close_meta(n);
    n->h = NULL;
    kvt_node_detach(n);
    return rc;
}

KVI_GETTER(uint32_t, kvt_node_num_slots, kvt_node, total)

int kvt_node_reap(kvt_node *n)
{
    if (!n)
        return kvt_fail(KVT_EINVAL, "node: reap: NULL node");
    int rc = kvi_node_lock(n);
    if (rc)
        return rc;
    int k = reap_locked(n);
    if (n->pool)
        refresh(n);
    kvi_node_unlock(n);
    return k;
}

int kvt_node_get_stats(kvt_node *n, kvt_node_stats *s)
{
    if (!n || !s)
        return kvt_fail(KVT_EINVAL, "node: stats: NULL argument");
    int rc = kvi_node_lock(n);
    if (rc)
        return rc;
    *s = n->st;
    s->ranks_attached = 0;
    for (uint32_t r = 0; r < n->cfg.ranks; r++)
        s->ranks_attached += n->h->rank[r].attached;
    s->published = s->peer_pinned = s->pinned_of_peers = 0;
    for (uint32_t id = n->own_lo; id < n->own_hi; id++) {
        s->published += slot_at(n, id)->n_keys != 0;
        s->peer_pinned += peer_pinned(n, id);
    }
    const uint8_t *mine = pins_of(n, n->me);
    for (uint32_t id = 0; id < n->total; id++)
        s->pinned_of_peers += mine[id];
    kvi_node_unlock(n);
    return 0;
}

int kvt_node_unlink(const char *name)
{
    return kvt_node_unlink_at(name, NULL, NULL);
}

int kvt_node_unlink_at(const char *name, const char *dir, const char *group)
{
    int rc = check_name(name);
    if (rc)
        return rc;
    kvi_shm_share share;
    char d[1024], stem[STEM_MAX];
    if ((rc = kvi_shm_share_of(group, &share)) || (rc = kvi_shm_dir(dir, &share, d, sizeof(d))))
        return kvi_fail_wrap(rc, "node");
    rc = kvi_shm_stem(d, name, &share, false, stem, sizeof(stem));
    if (rc == KVT_ENOENT)
        return 0; /* no rendezvous: nothing of the tier can be named */
    return rc ? kvi_fail_wrap(rc, "node") : unlink_stem(name, d, stem);
}
