/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A worker's reads of remote blocks (kvt_worker_attach_remote): the remote tier as a transfer
 * backend of the worker's stack (port/xfer.h), so that the bytes of a remote hit move the way
 * every promotion does — submitted with the step, polled by event, failures reported — and
 * never on the scheduler's thread.
 *
 * A load event names, per pair, a source id of the step's metadata (meta->remote: the owner,
 * slot, generation and hash of the block) and the host block it lands in. submit copies what
 * the read needs (the metadata goes with the step) and queues the event; one thread of this
 * backend takes events in order and reads each with kvt_remote_read_from into the remote's
 * own slots — the host mirror's blocks — bounded by the remote's timeout_ms. A block that did
 * not arrive whole and checked is a failed block (take_invalid: the manager makes it invalid
 * and its request recomputes it); the event completes either way. Its failed blocks are
 * recorded before the event counts as finished, so a poll that sees an event finished is
 * followed by a take_invalid that has all of its failures.
 *
 * A remote tier takes no write-backs (the host's own blocks are what it serves): a store
 * submitted to it is refused.
 *
 * The worker also publishes what its remote serves: the scheduler sends each step the host
 * blocks whose stores completed on every worker and those about to be written again
 * (meta->remote: publications, withdrawals). set_meta, on the engine's thread before the
 * step's transfers, withdraws locally at once (from then on no read is served from those
 * slots, and no publication asked for earlier is made) and notes each publication's
 * generation; the thread, in order with the reads, computes the tags and writes the directory
 * — a publication whose slot was withdrawn meanwhile is dropped there. A rank of an engine of
 * several ranks (kvt_remote_config.ranks) reads and publishes its own part of each block
 * (srcs[(id - 1) * parts + rank]).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/log.h"
#include "port/remote_port.h"
#include "base/util.h"
#include "port/xfer.h"
#include "kvtier/meta.h"
#include "remote/remote_internal.h"

/* One load event, as submit copied it; or a batch of publications or directory
 * withdrawals of a step. */
typedef struct rx_job {
    enum { JOB_READ, JOB_PUB, JOB_WITHDRAW } kind;
    int64_t event;
    uint32_t n, n_peers;
    kvt_remote_peer *peers;
    kvt_remote_loc *locs;
    uint8_t *hashes;
    uint32_t *slots;
    uint64_t *gens; /* publications: the generations they were asked at; withdrawals: the ones
                       published */
    struct rx_job *next;
} rx_job;

typedef struct rx_stage {
    kvt_remote *r;
    uint32_t hash_len;
    uint32_t tier, parts, rank, n_slots; /* its place in the chain; its part of a block */
    const kvt_offload_meta *meta;        /* the step being submitted (set_meta) */
    pthread_t thr;
    pthread_mutex_t mu;
    pthread_cond_t cv, idle;
    rx_job *head, *tail; /* queued */
    uint32_t queued;     /* jobs queued or running */
    uint32_t reads;      /* of them, reads (load events) */
    int64_t hwm;         /* the last event finished */
    uint32_t *invalid;   /* failed destination blocks, not yet taken */
    uint32_t n_invalid, cap_invalid;
    uint64_t pending; /* blocks of queued events: cap_invalid >= n_invalid + pending */
    bool stop;
    int *status; /* the thread's scratch: KVT_REMOTE_MAX_READ */
} rx_stage;

static void job_free(rx_job *j)
{
    if (!j)
        return;
    free(j->peers), free(j->locs), free(j->hashes), free(j->slots), free(j->gens);
    free(j);
}

/* Records the failed destinations of a read (under mu), into room submit reserved: a
 * failure is never lost for want of memory. */
static void record_failed(rx_stage *x, const rx_job *j, uint32_t from, uint32_t n, const int *st)
{
    for (uint32_t i = 0; i < n; i++)
        if (st[i])
            x->invalid[x->n_invalid++] = j->slots[from + i];
}

static void *rx_main(void *arg)
{
    rx_stage *x = arg;
    pthread_mutex_lock(&x->mu);
    for (;;) {
        while (!x->head && !x->stop)
            pthread_cond_wait(&x->cv, &x->mu);
        if (!x->head)
            break;
        rx_job *j = x->head;
        pthread_mutex_unlock(&x->mu);
        /* the job, outside the lock: polls and takes go on meanwhile */
        for (uint32_t at = 0; j->kind == JOB_PUB && at < j->n; at += KVT_REMOTE_MAX_READ)
            (void)kvi_remote_publish_at(x->r, j->slots + at, j->hashes + (size_t)at * x->hash_len,
                                        j->gens + at, kvi_min_u32(j->n - at, KVT_REMOTE_MAX_READ));
        if (j->kind == JOB_WITHDRAW)
            kvi_remote_dir_withdraw(x->r, j->hashes, j->slots, j->gens, j->n);
        for (uint32_t at = 0; j->kind == JOB_READ && at < j->n; at += KVT_REMOTE_MAX_READ) {
            uint32_t k = j->n - at < KVT_REMOTE_MAX_READ ? j->n - at : KVT_REMOTE_MAX_READ;
            for (uint32_t i = 0; i < k; i++)
                x->status[i] = KVT_EIO;
            (void)kvt_remote_read_from(x->r, j->peers, j->n_peers, j->locs + at,
                                       j->hashes + (size_t)at * x->hash_len, k, j->slots + at,
                                       x->status);
            pthread_mutex_lock(&x->mu);
            record_failed(x, j, at, k, x->status);
            pthread_mutex_unlock(&x->mu);
        }
        pthread_mutex_lock(&x->mu);
        x->head = j->next;
        if (!x->head)
            x->tail = NULL;
        if (j->kind == JOB_READ) {
            x->hwm = j->event; /* after its failures: see the top of this file */
            x->reads--;
            x->pending -= j->n;
        }
        x->queued--;
        if (x->queued == 0)
            pthread_cond_broadcast(&x->idle);
        job_free(j);
    }
    pthread_mutex_unlock(&x->mu);
    return NULL;
}

/* Queues j (under mu). */
static void enqueue(rx_stage *x, rx_job *j)
{
    if (x->tail)
        x->tail->next = j;
    else
        x->head = j;
    x->tail = j;
    x->queued++;
    x->reads += j->kind == JOB_READ;
    pthread_cond_signal(&x->cv);
}

/* A job of n blocks' slots, hashes and generations (the arrays its to fill). */
static rx_job *job_new(int kind, uint32_t n, uint32_t hash_len)
{
    rx_job *j = calloc(1, sizeof(*j));
    size_t k = n ? n : 1;
    if (j && (!(j->slots = malloc(k * sizeof(*j->slots))) || !(j->hashes = malloc(k * hash_len)) ||
              !(j->gens = malloc(k * sizeof(*j->gens))))) {
        job_free(j);
        j = NULL;
    }
    if (j)
        j->kind = kind;
    return j;
}

/* The local half of a withdrawal of slots (all of them when NULL) now, the directory's
 * queued. */
static int withdraw_now(rx_stage *x, const uint32_t *slots, uint32_t n)
{
    rx_job *j = job_new(JOB_WITHDRAW, slots ? n : x->n_slots, x->hash_len);
    if (!j)
        return kvt_fail(KVT_ENOMEM, "remote tier: out of memory");
    j->n = kvi_remote_unpublish(x->r, slots, n, j->hashes, j->slots, j->gens);
    if (j->n == 0) {
        job_free(j);
        return 0;
    }
    pthread_mutex_lock(&x->mu);
    enqueue(x, j);
    pthread_mutex_unlock(&x->mu);
    return 0;
}

/* Every block of a step's list is one of the remote's slots. */
static int check_slots(const rx_stage *x, const uint32_t *blocks, uint32_t n, const char *what)
{
    for (uint32_t i = 0; i < n; i++)
        if (blocks[i] >= x->n_slots)
            return kvt_fail(KVT_ERANGE, "remote tier: %s of block %u (%u slots)", what, blocks[i],
                            x->n_slots);
    return 0;
}

/* A step's publications and withdrawals: withdraw_all, then the publications (each with its
 * slot's generation now), then the withdrawals, which cancel a publication of the same slot
 * made just before. */
static int apply_pubs(rx_stage *x, const kvt_remote_reads *rr)
{
    if (rr->hash_len != x->hash_len)
        return kvt_fail(KVT_EINVAL,
                        "remote tier: the metadata's hashes have %u bytes, the remote's %u",
                        rr->hash_len, x->hash_len);
    int rc = check_slots(x, rr->pub_blocks, rr->n_pubs, "publication");
    if (!rc)
        rc = check_slots(x, rr->withdraw_blocks, rr->n_withdraws, "withdrawal");
    if (!rc && rr->withdraw_all)
        rc = withdraw_now(x, NULL, 0);
    if (!rc && rr->n_pubs) {
        rx_job *j = job_new(JOB_PUB, rr->n_pubs, x->hash_len);
        if (!j)
            return kvt_fail(KVT_ENOMEM, "remote tier: out of memory");
        j->n = rr->n_pubs;
        memcpy(j->slots, rr->pub_blocks, j->n * sizeof(*j->slots));
        memcpy(j->hashes, rr->pub_hashes, (size_t)j->n * x->hash_len);
        kvi_remote_slot_gens(x->r, j->slots, j->n, j->gens);
        pthread_mutex_lock(&x->mu);
        enqueue(x, j);
        pthread_mutex_unlock(&x->mu);
    }
    if (!rc && rr->n_withdraws)
        rc = withdraw_now(x, rr->withdraw_blocks, rr->n_withdraws);
    return rc;
}

static int rx_set_meta(void *impl, const kvt_offload_meta *meta)
{
    rx_stage *x = impl;
    x->meta = meta;
    const kvt_remote_reads *rr = &meta->remote;
    if (rr->tier != x->tier || (!rr->n_pubs && !rr->n_withdraws && !rr->withdraw_all))
        return 0;
    return apply_pubs(x, rr);
}

/* The job of load event `event`: pairs (source id src[i] of the metadata's remote reads,
 * host block dst[i]), every owner they name copied as a kvt_remote_peer. */
static int make_job(rx_stage *x, int64_t event, const uint32_t *src, const uint32_t *dst,
                    uint32_t n, rx_job **out)
{
    const kvt_remote_reads *rr = x->meta ? &x->meta->remote : NULL;
    if (!rr || rr->n_srcs == 0)
        return kvt_fail(KVT_EINVAL, "remote tier: load event %lld without remote sources",
                        (long long)event);
    if (rr->hash_len != x->hash_len || rr->parts != x->parts)
        return kvt_fail(KVT_EINVAL,
                        "remote tier: the metadata's blocks have %u-byte hashes and %u parts, "
                        "the remote's %u and %u (its engine's ranks)",
                        rr->hash_len, rr->parts, x->hash_len, x->parts);
    rx_job *j = calloc(1, sizeof(*j));
    uint32_t map[KVT_META_MAX_OWNERS];
    if (!j || !(j->peers = malloc(KVT_META_MAX_OWNERS * sizeof(*j->peers))) ||
        !(j->locs = malloc(n * sizeof(*j->locs))) ||
        !(j->hashes = malloc((size_t)n * x->hash_len)) ||
        !(j->slots = malloc(n * sizeof(*j->slots)))) {
        job_free(j);
        return kvt_fail(KVT_ENOMEM, "remote tier: out of memory");
    }
    memset(map, 0xff, sizeof(map));
    for (uint32_t i = 0; i < n; i++) {
        if (src[i] == 0 || src[i] > rr->n_srcs) { /* the metadata was validated: not seen */
            job_free(j);
            return kvt_fail(KVT_EINVAL, "remote tier: source %u of %u", src[i], rr->n_srcs);
        }
        const kvt_remote_src *s = &rr->srcs[(size_t)(src[i] - 1) * x->parts + x->rank];
        if (map[s->owner] == UINT32_MAX) {
            const kvt_remote_owner *o = &rr->owners[s->owner];
            kvt_remote_peer *p = &j->peers[j->n_peers];
            memset(p, 0, sizeof(*p));
            memcpy(p->instance, o->instance.ptr, o->instance.len); /* lengths validated */
            memcpy(p->endpoint, o->endpoint.ptr, o->endpoint.len);
            p->epoch = o->epoch;
            map[s->owner] = j->n_peers++;
        }
        j->locs[i] =
            (kvt_remote_loc){.peer = map[s->owner], .slot = s->slot, .generation = s->generation};
        memcpy(j->hashes + (size_t)i * x->hash_len, s->hash, x->hash_len);
        j->slots[i] = dst[i];
    }
    j->n = n;
    j->event = event;
    *out = j;
    return 0;
}

static int rx_submit(void *impl, int dir, int64_t event, const uint32_t *src, const uint32_t *dst,
                     uint32_t n, void *wait)
{
    (void)wait;
    rx_stage *x = impl;
    if (dir != KVT_COPY_LOAD)
        return kvt_fail(KVT_EINVAL, "remote tier: takes no write-backs (store event %lld)",
                        (long long)event);
    rx_job *j;
    int rc = make_job(x, event, src, dst, n, &j);
    if (rc)
        return rc;
    pthread_mutex_lock(&x->mu);
    uint64_t need = x->n_invalid + x->pending + n;
    if (need > x->cap_invalid) { /* room for every block of it to fail */
        uint32_t *p = need > UINT32_MAX ? NULL : realloc(x->invalid, need * sizeof(*p));
        if (!p) {
            pthread_mutex_unlock(&x->mu);
            job_free(j);
            return kvt_fail(KVT_ENOMEM, "remote tier: out of memory");
        }
        x->invalid = p;
        x->cap_invalid = (uint32_t)need;
    }
    x->pending += n;
    enqueue(x, j);
    pthread_mutex_unlock(&x->mu);
    return 0;
}

static int rx_poll(void *impl, int dir, int64_t *hwm)
{
    rx_stage *x = impl;
    pthread_mutex_lock(&x->mu);
    *hwm = dir == KVT_COPY_LOAD ? x->hwm : -1;
    pthread_mutex_unlock(&x->mu);
    return 0;
}

static uint32_t rx_take_failed(void *impl, int dir, int64_t *out, uint32_t cap)
{
    (void)impl, (void)dir, (void)out, (void)cap;
    return 0; /* failures are per block */
}

static uint32_t rx_take_invalid(void *impl, uint32_t *out, uint32_t cap)
{
    rx_stage *x = impl;
    pthread_mutex_lock(&x->mu);
    uint32_t n = x->n_invalid < cap ? x->n_invalid : cap;
    memcpy(out, x->invalid, n * sizeof(*out));
    memmove(x->invalid, x->invalid + n, (x->n_invalid - n) * sizeof(*out));
    x->n_invalid -= n;
    pthread_mutex_unlock(&x->mu);
    return n;
}

static int rx_flush(void *impl)
{
    rx_stage *x = impl;
    pthread_mutex_lock(&x->mu);
    while (x->queued)
        pthread_cond_wait(&x->idle, &x->mu);
    pthread_mutex_unlock(&x->mu);
    return 0;
}

static uint32_t rx_outstanding(const void *impl, int dir)
{
    rx_stage *x = (rx_stage *)impl;
    pthread_mutex_lock(&x->mu);
    uint32_t n = dir == KVT_COPY_LOAD ? x->reads : 0;
    pthread_mutex_unlock(&x->mu);
    return n;
}

static void rx_close(void *impl)
{
    rx_stage *x = impl;
    pthread_mutex_lock(&x->mu);
    x->stop = true;
    pthread_cond_signal(&x->cv);
    pthread_mutex_unlock(&x->mu);
    pthread_join(x->thr, NULL); /* the queue drains first: every read is bounded */
    pthread_mutex_destroy(&x->mu);
    pthread_cond_destroy(&x->cv);
    pthread_cond_destroy(&x->idle);
    kvt_remote *r = x->r;
    free(x->invalid);
    free(x->status);
    free(x);
    kvi_remote_unstage(r);
}

static const kvi_xfer_ops rx_ops = {.name = "remote",
                                    .eio_is_final = false,
                                    .store_fail_is_fatal = false,
                                    .submit = rx_submit,
                                    .poll = rx_poll,
                                    .take_failed = rx_take_failed,
                                    .take_invalid = rx_take_invalid,
                                    .flush = rx_flush,
                                    .outstanding = rx_outstanding,
                                    .set_meta = rx_set_meta,
                                    .close = rx_close};

int kvi_remote_stage_open(kvt_remote *r, uint32_t tier, const kvi_xfer_ops **ops, void **impl)
{
    kvi_remote_port *p = kvi_remote_port_of(r);
    if (p->staged)
        return kvt_fail(KVT_ESTATE, "remote: a worker reads through this remote tier already");
    if (p->n_slots == 0)
        return kvt_fail(KVT_EINVAL, "remote: a worker reads into the remote's slots: this one "
                                    "has none (give it the host mirror's regions)");
    rx_stage *x = calloc(1, sizeof(*x));
    if (!x || !(x->status = malloc(KVT_REMOTE_MAX_READ * sizeof(*x->status)))) {
        free(x);
        return kvt_fail(KVT_ENOMEM, "remote: out of memory");
    }
    x->r = r;
    x->hash_len = p->hash_len;
    x->tier = tier;
    x->parts = p->parts;
    x->rank = p->parts > 1 ? p->rank : 0;
    x->n_slots = p->n_slots;
    x->hwm = -1;
    pthread_mutex_init(&x->mu, NULL);
    pthread_cond_init(&x->cv, NULL);
    pthread_cond_init(&x->idle, NULL);
    if (pthread_create(&x->thr, NULL, rx_main, x) != 0) {
        pthread_mutex_destroy(&x->mu);
        pthread_cond_destroy(&x->cv);
        pthread_cond_destroy(&x->idle);
        free(x->status);
        free(x);
        return kvt_fail(KVT_ESYS, "remote: cannot start the reader thread");
    }
    p->staged = true;
    *ops = &rx_ops;
    *impl = x;
    return 0;
}
