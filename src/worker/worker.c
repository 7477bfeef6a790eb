/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The offload worker (spec kv-offload §3.3, §3.4): binds the manager's metadata, launches
 * its copies after the forward, and turns copy completions into the per-step reports.
 *
 * Pending events are kept per direction in submission order (event ids only grow), so the
 * copy engine's high-water mark settles a prefix of them at once. A pending load keeps a
 * copy of its destination block ids, because a failure is reported as those ids and the
 * metadata that named them may have been cleared by then. Finished load events are
 * translated into request ids through the metadata bound when they finish: the manager
 * lists every outstanding load event in every step's load_event_to_reqs (the hang the
 * vllm-ascend review found when only the current event was listed cannot happen here).
 */
#include <stdlib.h>
#include <string.h>

#include "base/array.h"
#include "base/error.h"
#include "base/log.h"
#include "base/util.h"
#include "base/cuda.h"
#include "port/remote_port.h"
#include "port/xfer.h"
#include "copy/copy_internal.h"
#include "kvtier/disk.h"
#include "kvtier/worker.h"
#include "worker/worker_internal.h"

typedef struct pending_load {
    int64_t event;
    uint32_t n, cap, cap_src;
    uint32_t *blocks; /* destination device blocks */
    uint32_t *src;    /* their sources in tier 0, pairwise */
    uint32_t n_inv, cap_inv;
    uint32_t *inv; /* of which the manager declared invalid (failed promotions) */
} pending_load;

/* A tier behind the host: its events of one direction, submitted and not yet reported. */
typedef struct ev_fifo {
    int64_t *ev;
    uint32_t n, cap;
    int64_t last;
} ev_fifo;

/* One level of the stack: a transfer backend (xfer.h) and whether it still runs. */
typedef struct stage {
    kvi_xfer x;    /* x.ops NULL: no such stage */
    bool dead;     /* the backend stopped for good: its transfers fail without I/O */
    uint32_t nb;   /* blocks of the tier this stage fills */
    ev_fifo ev[2]; /* stages t >= 1: events submitted and not yet reported, by direction */
} stage;

/* Stage 0 moves the engine's KV to and from the first offload tier (the copy engine to the
 * host mirror, or a disk as that tier); stage t >= 1 moves the host mirror to and from tier t
 * behind it (write-backs and promotions: the metadata's tiers[t - 1]), e.g. stage 1 a disk,
 * stage 2 a second disk. */
enum { STAGE_TIER = 0 };

struct kvt_worker {
    kvt_worker_config cfg;
    const kvt_layout *layout;
    kvt_copy *copy; /* the copy engine (owned), when stage 0 is one */
    stage st[KVT_MAX_TIERS];
    int64_t *fev; /* scratch: failed events taken from a backend */
    uint32_t cap_fev;
    const kvt_offload_meta *meta;
    bool submitted;
    bool failed;
    int64_t last_load, last_store;
    pending_load *loads; /* FIFO: loads[0 .. n_loads) */
    uint32_t n_loads, cap_loads;
    int64_t *stores;
    uint32_t n_stores, cap_stores;
    kvt_offload_worker_meta done;
    kvt_str *fin;
    uint32_t n_fin, cap_fin;
    uint32_t *invalid;
    uint32_t n_invalid, cap_invalid;
    kvi_CUevent compute_done; /* CUDA backend only */
    const kvt_mirror *mirror;
};

void kvt_worker_config_init(kvt_worker_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    kvt_copy_config_init(&cfg->copy);
}

/* A worker with no stage yet: its configuration checked and kept, no event seen. */
static int worker_new(const kvt_worker_config *cfg, const kvt_layout *layout, kvt_worker **out)
{
    if (kvi_check_reserved(cfg->reserved, sizeof(cfg->reserved), "worker config"))
        return KVT_EINVAL;
    kvt_worker *w = calloc(1, sizeof(*w));
    if (!w)
        return kvt_fail(KVT_ENOMEM, "worker: out of memory");
    w->cfg = *cfg;
    w->layout = layout;
    w->last_load = w->last_store = -1;
    for (int t = 0; t < KVT_MAX_TIERS; t++)
        w->st[t].ev[0].last = w->st[t].ev[1].last = -1;
    kvt_offload_worker_meta_init(&w->done);
    *out = w;
    return 0;
}

int kvt_worker_create(const kvt_worker_config *cfg, const kvt_layout *layout,
                      const kvt_mirror *mirror, kvt_worker **out)
{
    *out = NULL;
    kvt_worker *w;
    int rc = worker_new(cfg, layout, &w);
    if (rc)
        return rc;
    w->st[STAGE_TIER].nb = kvt_mirror_num_blocks(mirror);
    w->mirror = mirror;
    rc = kvt_copy_create(&cfg->copy, layout, mirror, &w->copy);
    if (!rc && kvt_copy_backend_kind(w->copy) == KVT_BACKEND_CUDA) {
        const kvi_cuda_api *cu = kvi_cuda();
        rc = kvi_cuda_use_device(kvt_layout_device(layout), NULL);
        kvi_CUresult r =
            rc ? KVT_CUDA_SUCCESS : cu->EventCreate(&w->compute_done, KVT_CU_EVENT_DISABLE_TIMING);
        if (r != KVT_CUDA_SUCCESS)
            rc = kvt_fail(KVT_EIO, "worker: cuEventCreate: %s", kvi_cuda_err(r));
    }
    if (rc) {
        kvt_copy_destroy(w->copy);
        free(w);
        return kvi_fail_wrap(rc, "worker");
    }
    w->st[STAGE_TIER].x = kvi_xfer_copy(w->copy);
    *out = w;
    return 0;
}

int kvt_worker_create_disk(const kvt_worker_config *cfg, const kvt_layout *layout, kvt_disk *disk,
                           kvt_worker **out)
{
    *out = NULL;
    if (!cfg || !disk)
        return kvt_fail(KVT_EINVAL, "worker: create_disk: NULL argument");
    kvt_worker *w;
    int rc = worker_new(cfg, layout, &w);
    if (rc)
        return rc;
    const kvi_xfer_port *port = kvi_xfer_port_of(disk);
    w->st[STAGE_TIER].x = (kvi_xfer){port->ops, disk};
    w->st[STAGE_TIER].nb = port->num_slots;
    *out = w;
    return 0;
}

int kvi_worker_attach_xfer(kvt_worker *w, uint32_t tier, const kvi_xfer_port *port, void *impl,
                           const char *what)
{
    if (tier == 0 || tier >= KVT_MAX_TIERS)
        return kvt_fail(KVT_ERANGE, "worker %u: attach %s: tier %u (1 to %u)", w->cfg.rank, what,
                        tier, KVT_MAX_TIERS - 1);
    if (!w->copy || w->st[tier].x.ops)
        return kvt_fail(KVT_ESTATE, "worker %u: attach %s: %s", w->cfg.rank, what,
                        w->st[tier].x.ops ? "tier already attached"
                                          : "a disk worker has no host tier");
    for (uint32_t t = 1; t < KVT_MAX_TIERS; t++)
        if (w->st[t].x.impl == impl)
            return kvt_fail(KVT_EINVAL, "worker %u: attach %s: it is tier %u already", w->cfg.rank,
                            what, t);
    const kvt_layout *l = port->layout;
    uint32_t nr = kvt_layout_num_regions(l);
    const kvt_region *lr = kvt_layout_regions(l), *mr = kvt_mirror_regions(w->mirror);
    bool same = kvt_layout_device(l) == KVT_HOST_DEVICE &&
                kvt_layout_num_blocks(l) == kvt_mirror_num_blocks(w->mirror) &&
                nr == kvt_mirror_num_regions(w->mirror);
    for (uint32_t i = 0; same && i < nr; i++)
        same = lr[i].base == mr[i].base && lr[i].block_bytes == mr[i].block_bytes;
    if (!same)
        return kvt_fail(KVT_EINVAL,
                        "worker %u: attach %s: its layout is not the host mirror's (create it "
                        "over kvt_mirror_layout)",
                        w->cfg.rank, what);
    w->st[tier].x = (kvi_xfer){port->ops, impl};
    w->st[tier].nb = port->num_slots;
    return 0;
}

int kvt_worker_attach_disk_tier(kvt_worker *w, uint32_t tier, kvt_disk *disk)
{
    if (!w || !disk)
        return kvt_fail(KVT_EINVAL, "worker: attach_disk: NULL argument");
    return kvi_worker_attach_xfer(w, tier, kvi_xfer_port_of(disk), disk, "disk");
}

int kvt_worker_attach_disk(kvt_worker *w, kvt_disk *disk)
{
    return kvt_worker_attach_disk_tier(w, 1, disk);
}

int kvt_worker_attach_remote(kvt_worker *w, uint32_t tier, kvt_remote *remote)
{
    if (!w || !remote)
        return kvt_fail(KVT_EINVAL, "worker: attach_remote: NULL argument");
    kvi_remote_port *p = kvi_remote_port_of(remote);
    if (tier == 0 || tier >= KVT_MAX_TIERS)
        return kvt_fail(KVT_ERANGE, "worker %u: attach remote: tier %u (1 to %u)", w->cfg.rank,
                        tier, KVT_MAX_TIERS - 1);
    if (!w->copy || w->st[tier].x.ops)
        return kvt_fail(KVT_ESTATE, "worker %u: attach remote: %s", w->cfg.rank,
                        w->st[tier].x.ops ? "tier already attached"
                                          : "a disk worker has no host tier");
    /* it reads into its own slots: they must be the host mirror's blocks */
    uint32_t nr = kvt_mirror_num_regions(w->mirror);
    const kvt_region *mr = kvt_mirror_regions(w->mirror);
    bool same = p->n_slots == kvt_mirror_num_blocks(w->mirror) && p->n_regions == nr;
    for (uint32_t i = 0; same && i < nr; i++)
        same = p->regions[i].base == mr[i].base && p->regions[i].block_bytes == mr[i].block_bytes;
    if (!same)
        return kvt_fail(KVT_EINVAL,
                        "worker %u: attach remote: it serves other arrays than the host mirror's "
                        "(create it with kvt_mirror_regions and n_slots = the mirror's blocks)",
                        w->cfg.rank);
    const kvi_xfer_ops *ops;
    void *impl;
    int rc = p->stage_open(remote, tier, &ops, &impl);
    if (rc)
        return kvi_fail_wrap(rc, "worker: attach remote");
    w->st[tier].x = (kvi_xfer){ops, impl};
    w->st[tier].nb = UINT32_MAX; /* its loads name sources of the metadata, not blocks */
    return 0;
}

void kvt_worker_destroy(kvt_worker *w)
{
    if (!w)
        return;
    for (int i = 0; i < KVT_MAX_TIERS; i++) /* borrowed backends: nothing of ours in flight */
        if (w->st[i].x.ops && w->st[i].x.impl != w->copy)
            w->st[i].x.ops->flush(w->st[i].x.impl);
    for (int i = 0; i < KVT_MAX_TIERS; i++) /* and the ones the worker made, closed */
        if (w->st[i].x.ops && w->st[i].x.ops->close)
            w->st[i].x.ops->close(w->st[i].x.impl);
    kvt_copy_destroy(w->copy);
    for (int i = 0; i < KVT_MAX_TIERS; i++)
        for (int d = 0; d < 2; d++)
            free(w->st[i].ev[d].ev);
    free(w->fev);
    if (w->compute_done)
        kvi_cuda()->EventDestroy(w->compute_done);
    for (uint32_t i = 0; i < w->cap_loads; i++) {
        free(w->loads[i].blocks);
        free(w->loads[i].src);
        free(w->loads[i].inv);
    }
    free(w->loads);
    free(w->stores);
    free(w->fin);
    free(w->invalid);
    kvt_offload_worker_meta_release(&w->done);
    free(w);
}

static int grow(void **p, uint32_t *cap, uint64_t need, size_t elem, bool zero)
{
    uint32_t old = *cap;
    int rc = kvi_array_grow(p, cap, need, elem);
    if (rc)
        return kvi_fail_wrap(rc, "worker");
    if (zero && *cap > old)
        memset((char *)*p + (size_t)old * elem, 0, (size_t)(*cap - old) * elem);
    return 0;
}

static int check_ids(const kvt_worker *w, const char *what, const uint32_t *ids, uint32_t n,
                     uint32_t limit)
{
    for (uint32_t i = 0; i < n; i++)
        if (ids[i] >= limit)
            return kvt_fail(KVT_ERANGE, "worker %u: %s block %u out of range (%u blocks)",
                            w->cfg.rank, what, ids[i], limit);
    return 0;
}

int kvt_worker_bind(kvt_worker *w, const kvt_offload_meta *meta)
{
    int rc = kvt_offload_meta_validate(meta);
    if (rc)
        return kvi_fail_wrap(rc, "worker: bind");
    uint32_t dev = kvt_layout_num_blocks(w->layout), host = w->st[STAGE_TIER].nb;
    if ((rc = check_ids(w, "load device", meta->load_gpu_blocks, meta->n_loads, dev)) ||
        (rc = check_ids(w, "load host", meta->load_cpu_blocks, meta->n_loads, host)) ||
        (rc = check_ids(w, "store device", meta->store_gpu_blocks, meta->n_stores, dev)) ||
        (rc = check_ids(w, "store host", meta->store_cpu_blocks, meta->n_stores, host)) ||
        (rc = check_ids(w, "invalid load device", meta->load_invalid_blocks, meta->n_load_invalid,
                        dev)))
        return rc;
    const kvt_remote_reads *rr = &meta->remote;
    if ((rr->n_pubs || rr->n_withdraws || rr->withdraw_all) &&
        !(w->st[rr->tier].x.ops && w->st[rr->tier].x.ops->set_meta))
        return kvt_fail(KVT_EINVAL,
                        "worker %u: the metadata publishes this rank's blocks in remote tier %u, "
                        "but this worker has no remote tier %u (kvt_worker_attach_remote)",
                        w->cfg.rank, rr->tier, rr->tier);
    for (uint32_t t = 1; t < KVT_MAX_TIERS; t++) { /* write-backs and promotions */
        const kvt_tier_xfers *x = &meta->tiers[t - 1];
        const stage *st = &w->st[t];
        uint32_t front = w->st[STAGE_TIER].nb; /* every tier behind exchanges with the host */
        if ((x->n_loads || x->n_stores) && !st->x.ops)
            return kvt_fail(KVT_EINVAL,
                            "worker %u: the metadata moves blocks to or from tier %u but this "
                            "worker has no tier %u (kvt_worker_attach_disk_tier attaches one)",
                            w->cfg.rank, t, t);
        if (!st->x.ops)
            continue;
        if (x->n_loads && (meta->remote.tier == t) != (st->x.ops->set_meta != NULL))
            return kvt_fail(KVT_EINVAL,
                            "worker %u: tier %u's loads are %s, but this worker's tier %u is a %s "
                            "tier",
                            w->cfg.rank, t, meta->remote.tier == t ? "remote reads" : "blocks", t,
                            st->x.ops->name);
        if ((rc = check_ids(w, "promotion source", x->load_src, x->n_loads, st->nb)) ||
            (rc = check_ids(w, "promotion destination", x->load_dst, x->n_loads, front)) ||
            (rc = check_ids(w, "write-back source", x->store_src, x->n_stores, front)) ||
            (rc = check_ids(w, "write-back destination", x->store_dst, x->n_stores, st->nb)))
            return rc;
        int64_t ev[2];
        ev[KVT_COPY_LOAD] = x->load_event;
        ev[KVT_COPY_STORE] = x->store_event;
        for (int d = 0; d < 2; d++)
            if (ev[d] != KVT_NO_EVENT && ev[d] <= st->ev[d].last)
                return kvt_fail(KVT_EINVAL, "worker %u: tier %u %s event %lld not above %lld",
                                w->cfg.rank, t, d == KVT_COPY_LOAD ? "load" : "store",
                                (long long)ev[d], (long long)st->ev[d].last);
    }
    if (meta->load_event != KVT_NO_EVENT && meta->load_event <= w->last_load)
        return kvt_fail(KVT_EINVAL, "worker %u: load event %lld not above %lld", w->cfg.rank,
                        (long long)meta->load_event, (long long)w->last_load);
    if (meta->store_event != KVT_NO_EVENT && meta->store_event <= w->last_store)
        return kvt_fail(KVT_EINVAL, "worker %u: store event %lld not above %lld", w->cfg.rank,
                        (long long)meta->store_event, (long long)w->last_store);
    if (w->meta && !w->submitted)
        KVT_LOG_W("worker %u: metadata replaced before get_finished launched its copies",
                  w->cfg.rank);
    w->meta = meta;
    w->submitted = false;
    return 0;
}

void kvt_worker_clear(kvt_worker *w)
{
    if (w->meta && !w->submitted &&
        (w->meta->load_event != KVT_NO_EVENT || w->meta->store_event != KVT_NO_EVENT))
        KVT_LOG_W("worker %u: metadata cleared before get_finished launched its copies; "
                  "load event %lld / store event %lld will never complete",
                  w->cfg.rank, (long long)w->meta->load_event, (long long)w->meta->store_event);
    w->meta = NULL;
}

/* A backend stopped for good (a disk's ring failed): from now on its transfers fail at once,
 * without I/O, so the engine keeps serving from its GPU tier (stores never become findable,
 * loads recompute). */
static void stage_kill(kvt_worker *w, stage *s)
{
    if (!s->dead)
        KVT_LOG_E("worker %u: %s; the %s tier (stage %d) is off: its transfers fail until "
                  "restart",
                  w->cfg.rank, kvt_last_error(), s->x.ops->name, (int)(s - w->st));
    s->dead = true;
}

/* A backend's return code: KVT_EIO from a backend that stops on it kills the stage. */
static int stage_rc(kvt_worker *w, stage *s, int rc)
{
    if (rc == KVT_EIO && s->x.ops->eio_is_final) {
        stage_kill(w, s);
        return 0;
    }
    return rc;
}

static int stage_submit(kvt_worker *w, stage *s, int dir, int64_t event, const uint32_t *src,
                        const uint32_t *dst, uint32_t n, void *wait)
{
    if (s->dead)
        return 0;
    return stage_rc(w, s, s->x.ops->submit(s->x.impl, dir, event, src, dst, n, wait));
}

/* High-water mark of a direction; a dead stage has finished everything (failed). */
static int64_t stage_poll(kvt_worker *w, stage *s, int dir)
{
    int64_t hwm = -1;
    if (!s->dead)
        (void)stage_rc(w, s, s->x.ops->poll(s->x.impl, dir, &hwm));
    return s->dead ? INT64_MAX : hwm;
}

/* Every failed event of a direction into w->fev (none is dropped: a failed store reported as
 * fine would make wrong bytes findable). Loads with per_block: the failed blocks are appended
 * to w->invalid instead and the events are not listed; without: the events are listed and
 * the per-block list is drained. */
static int stage_failures(kvt_worker *w, stage *s, int dir, bool per_block, uint32_t *n);

int kvt_worker_flush(kvt_worker *w)
{
    int rc = 0;
    for (int i = KVT_MAX_TIERS - 1; i >= 0; i--) { /* the tiers behind first: a write-back
                                                     reads the tier in front */
        stage *s = &w->st[i];
        if (s->x.ops && !s->dead) {
            int r = stage_rc(w, s, s->x.ops->flush(s->x.impl));
            if (r && !rc)
                rc = r;
        }
    }
    return rc;
}

int kvt_worker_handle_preemptions(kvt_worker *w)
{
    if (!w->meta || !w->meta->need_flush)
        return 0;
    return kvt_worker_flush(w);
}

static int grow_invalid(kvt_worker *w, uint64_t more)
{
    return grow((void **)&w->invalid, &w->cap_invalid, (uint64_t)w->n_invalid + more,
                sizeof(uint32_t), false);
}

static int stage_failures(kvt_worker *w, stage *s, int dir, bool per_block, uint32_t *n)
{
    *n = 0;
    if (s->dead)
        return 0;
    const kvi_xfer_ops *o = s->x.ops;
    bool blocks = dir == KVT_COPY_LOAD && o->take_invalid;
    for (;;) {
        int rc = grow((void **)&w->fev, &w->cap_fev, (uint64_t)*n + 64, sizeof(int64_t), false);
        if (rc)
            return rc;
        uint32_t got = o->take_failed(s->x.impl, dir, w->fev + *n, 64);
        if (!(blocks && per_block))
            *n += got;
        if (got < 64)
            break;
    }
    if (!blocks)
        return 0;
    /* a tier behind the host names the host blocks whose promotion failed: the manager's */
    bool behind = s != &w->st[STAGE_TIER];
    uint32_t got, sink[256];
    do {
        int rc = per_block ? grow_invalid(w, 256) : 0;
        if (rc)
            return rc;
        got = o->take_invalid(s->x.impl, per_block ? w->invalid + w->n_invalid : sink, 256);
        if (per_block)
            w->n_invalid += got;
        for (uint32_t i = 0; behind && !per_block && i < got; i++)
            if ((rc = kvt_offload_worker_meta_add_failed_promo(&w->done, sink[i])))
                return rc;
    } while (got == 256);
    return 0;
}

/* Records the compute-done point on the engine's stream (CUDA), returning the event. */
static int compute_point(kvt_worker *w, void *stream, void **wait)
{
    *wait = NULL;
    if (!w->compute_done)
        return 0;
    kvi_CUresult r = kvi_cuda()->EventRecord(w->compute_done, (kvi_CUstream)stream);
    if (r != KVT_CUDA_SUCCESS)
        return kvt_fail(KVT_EIO, "worker %u: recording the compute-done event: %s", w->cfg.rank,
                        kvi_cuda_err(r));
    *wait = w->compute_done;
    return 0;
}

/* A tier behind the host: a promotion (slots -> host blocks) or a write-back (host blocks ->
 * slots). The
 * manager issues one only after everything it depends on completed on every rank (a
 * write-back reads a host block whose store all ranks reported; a promoted block is loaded to
 * the GPU only after all ranks reported the promotion), so it needs no wait event. */
static int submit_behind(kvt_worker *w, uint32_t t, int dir, int64_t event, const uint32_t *src,
                         const uint32_t *dst, uint32_t n)
{
    if (event == KVT_NO_EVENT)
        return 0;
    ev_fifo *f = &w->st[t].ev[dir];
    int rc = grow((void **)&f->ev, &f->cap, f->n + 1ull, sizeof(int64_t), false);
    if (!rc)
        rc = stage_submit(w, &w->st[t], dir, event, src, dst, n, NULL);
    if (rc)
        return kvi_fail_wrap(rc, "worker: tier");
    f->ev[f->n++] = event;
    f->last = event;
    return 0;
}

/* The step's load into the GPU, and what the worker keeps of it until it completes (its GPU
 * blocks, their host sources, the blocks already known invalid). */
static int submit_load(kvt_worker *w, const kvt_offload_meta *m, void *wait)
{
    int rc = grow((void **)&w->loads, &w->cap_loads, w->n_loads + 1, sizeof(*w->loads), true);
    pending_load *p = rc ? NULL : &w->loads[w->n_loads];
    if (p)
        rc = grow((void **)&p->blocks, &p->cap, m->n_loads, sizeof(uint32_t), false);
    if (p && !rc)
        rc = grow((void **)&p->src, &p->cap_src, m->n_loads, sizeof(uint32_t), false);
    if (!rc)
        rc = stage_submit(w, &w->st[STAGE_TIER], KVT_COPY_LOAD, m->load_event, m->load_cpu_blocks,
                          m->load_gpu_blocks, m->n_loads, wait);
    if (rc)
        return kvi_fail_wrap(rc, "worker: load");
    memcpy(p->blocks, m->load_gpu_blocks, m->n_loads * sizeof(uint32_t));
    memcpy(p->src, m->load_cpu_blocks, m->n_loads * sizeof(uint32_t));
    p->n = m->n_loads;
    p->n_inv = 0;
    if (m->n_load_invalid &&
        (rc = grow((void **)&p->inv, &p->cap_inv, m->n_load_invalid, sizeof(uint32_t), false)))
        return rc;
    if (m->n_load_invalid) {
        memcpy(p->inv, m->load_invalid_blocks, m->n_load_invalid * sizeof(uint32_t));
        p->n_inv = m->n_load_invalid;
    }
    p->event = m->load_event;
    w->n_loads++;
    w->last_load = m->load_event;
    return 0;
}

static int submit(kvt_worker *w, void *stream)
{
    const kvt_offload_meta *m = w->meta;
    w->submitted = true;
    /* the step's metadata to the backends described there (the remote tier: its reads'
     * sources, and the publications and withdrawals that come before any transfer) */
    for (uint32_t t = 1; t < KVT_MAX_TIERS; t++) {
        const kvi_xfer_ops *o = w->st[t].x.ops;
        int rc = o && o->set_meta && !w->st[t].dead ? o->set_meta(w->st[t].x.impl, m) : 0;
        if (rc)
            return kvi_fail_wrap(rc, "worker: tier");
    }
    bool any = m->load_event != KVT_NO_EVENT || m->store_event != KVT_NO_EVENT;
    for (uint32_t t = 1; t < KVT_MAX_TIERS; t++)
        any |= m->tiers[t - 1].load_event != KVT_NO_EVENT ||
               m->tiers[t - 1].store_event != KVT_NO_EVENT;
    if (!any)
        return 0;
    void *wait;
    int rc = compute_point(w, stream, &wait);
    if (rc)
        return rc;
    if (m->load_event != KVT_NO_EVENT && (rc = submit_load(w, m, wait)))
        return rc;
    if (m->store_event != KVT_NO_EVENT) {
        rc = grow((void **)&w->stores, &w->cap_stores, w->n_stores + 1, sizeof(int64_t), false);
        if (!rc)
            rc = stage_submit(w, &w->st[STAGE_TIER], KVT_COPY_STORE, m->store_event,
                              m->store_gpu_blocks, m->store_cpu_blocks, m->n_stores, wait);
        if (rc)
            return kvi_fail_wrap(rc, "worker: store");
        w->stores[w->n_stores++] = m->store_event;
        w->last_store = m->store_event;
    }
    for (uint32_t t = 1; t < KVT_MAX_TIERS; t++) {
        const kvt_tier_xfers *x = &m->tiers[t - 1];
        if ((rc = submit_behind(w, t, KVT_COPY_LOAD, x->load_event, x->load_src, x->load_dst,
                                x->n_loads)) ||
            (rc = submit_behind(w, t, KVT_COPY_STORE, x->store_event, x->store_src, x->store_dst,
                                x->n_stores)))
            return rc;
    }
    return 0;
}

static bool event_in(const int64_t *ev, uint32_t n, int64_t e)
{
    for (uint32_t i = 0; i < n; i++)
        if (ev[i] == e)
            return true;
    return false;
}

/* Appends the requests of finished load event e (from the bound metadata). */
static int add_finished_reqs(kvt_worker *w, int64_t e)
{
    const kvt_offload_meta *m = w->meta;
    uint32_t lo = m ? kvi_lower_bound_i64(m->load_events, m->n_load_events, e) : 0;
    if (!m || lo == m->n_load_events || m->load_events[lo] != e) {
        KVT_LOG_E("worker %u: finished load event %lld is not in load_event_to_reqs; its "
                  "requests cannot be reported",
                  w->cfg.rank, (long long)e);
        return 0;
    }
    uint32_t a = m->load_req_first[lo], b = m->load_req_first[lo + 1];
    int rc =
        grow((void **)&w->fin, &w->cap_fin, (uint64_t)w->n_fin + (b - a), sizeof(kvt_str), false);
    if (rc)
        return rc;
    for (uint32_t i = a; i < b; i++)
        w->fin[w->n_fin++] = m->load_req_ids[i];
    return 0;
}

/* Where a stage's direction stands: its high-water mark and its failed events (w->fev). */
static int stage_settle(kvt_worker *w, stage *s, int dir, bool per_block, int64_t *hwm,
                        uint32_t *n_failed)
{
    *hwm = stage_poll(w, s, dir);
    return stage_failures(w, s, dir, per_block, n_failed);
}

/* GPU block gpu's load failed: the source of the pending load that fills it is reported. */
static int report_failed_source(kvt_worker *w, uint32_t gpu)
{
    for (uint32_t k = 0; k < w->n_loads; k++)
        for (uint32_t i = 0; i < w->loads[k].n; i++)
            if (w->loads[k].blocks[i] == gpu)
                return kvt_offload_worker_meta_add_failed_load(&w->done, w->loads[k].src[i]);
    return 0;
}

static int poll_loads(kvt_worker *w)
{
    /* Without metadata finished loads cannot be translated: they wait for the next bind. */
    if (w->n_loads == 0 || !w->meta)
        return 0;
    stage *s = &w->st[STAGE_TIER];
    /* a backend that knows which blocks failed names them; a dead stage fails them all */
    int64_t hwm;
    uint32_t n_failed, inv_before = w->n_invalid;
    int rc0 = stage_settle(w, s, KVT_COPY_LOAD, true, &hwm, &n_failed);
    if (rc0)
        return rc0;
    /* blocks the backend named failed: their sources go to the manager, which drops their keys */
    for (uint32_t i = inv_before; i < w->n_invalid && !rc0; i++)
        rc0 = report_failed_source(w, w->invalid[i]);
    if (rc0)
        return rc0;
    const int64_t *failed = w->fev;
    uint32_t k = 0;
    for (; k < w->n_loads && w->loads[k].event <= hwm; k++) {
        pending_load *p = &w->loads[k];
        int rc = add_finished_reqs(w, p->event);
        if (!rc && p->n_inv) { /* failed promotions: invalid whatever the copy did */
            rc = grow((void **)&w->invalid, &w->cap_invalid, (uint64_t)w->n_invalid + p->n_inv,
                      sizeof(uint32_t), false);
            if (!rc) {
                memcpy(w->invalid + w->n_invalid, p->inv, p->n_inv * sizeof(uint32_t));
                w->n_invalid += p->n_inv;
            }
        }
        /* a node tier's data object shrunk by a sharer reads as zeros: no load of it counts */
        bool poisoned = w->mirror && kvi_mirror_poisoned(w->mirror);
        if (!rc && (s->dead || poisoned || event_in(failed, n_failed, p->event))) {
            rc = grow((void **)&w->invalid, &w->cap_invalid, (uint64_t)w->n_invalid + p->n,
                      sizeof(uint32_t), false);
            if (!rc) {
                memcpy(w->invalid + w->n_invalid, p->blocks, p->n * sizeof(uint32_t));
                w->n_invalid += p->n;
            }
            for (uint32_t i = 0; i < p->n && !rc; i++) /* a whole event failed */
                rc = kvt_offload_worker_meta_add_failed_load(&w->done, p->src[i]);
        }
        if (rc)
            return rc;
    }
    /* rotate the finished entries to the end so their block arrays are reused */
    for (uint32_t i = 0; i < k; i++) {
        pending_load t = w->loads[0];
        memmove(w->loads, w->loads + 1, (w->n_loads - 1) * sizeof(*w->loads));
        w->loads[w->n_loads - 1] = t;
        w->n_loads--;
    }
    return 0;
}

static int poll_stores(kvt_worker *w)
{
    if (w->n_stores == 0)
        return 0;
    stage *s = &w->st[STAGE_TIER];
    int64_t hwm;
    uint32_t n_failed;
    int rc0 = stage_settle(w, s, KVT_COPY_STORE, true, &hwm, &n_failed);
    if (rc0)
        return rc0;
    const int64_t *failed = w->fev;
    if (n_failed && s->x.ops->store_fail_is_fatal) {
        w->failed = true;
        return kvt_fail(KVT_EIO, "worker %u: store event %lld failed; the rank must restart",
                        w->cfg.rank, (long long)failed[0]);
    }
    /* other backends' failures fail the event only: reported completed and failed */
    uint32_t k = 0;
    for (; k < w->n_stores && w->stores[k] <= hwm; k++) {
        int rc = kvt_offload_worker_meta_add(&w->done, w->stores[k], 1);
        if (!rc && (s->dead || event_in(failed, n_failed, w->stores[k])))
            rc = kvt_offload_worker_meta_add_failed(&w->done, w->stores[k]);
        if (rc)
            return rc;
    }
    memmove(w->stores, w->stores + k, (w->n_stores - k) * sizeof(int64_t));
    w->n_stores -= k;
    return 0;
}

/* Reports the write-backs / promotions of stage t >= 1 in one direction that finished. */
static int poll_behind(kvt_worker *w, uint32_t t, int dir)
{
    stage *s = &w->st[t];
    ev_fifo *f = &s->ev[dir];
    if (f->n == 0)
        return 0;
    int64_t hwm;
    uint32_t n_failed; /* a promotion fails as an event (the manager re-reads nothing of it),
                          or, from a backend that knows, block by block (failed_promo) */
    int rc0 = stage_settle(w, s, dir, false, &hwm, &n_failed);
    if (rc0)
        return rc0;
    kvt_event_report *rep =
        dir == KVT_COPY_STORE ? &w->done.tier_stores[t - 1] : &w->done.tier_loads[t - 1];
    uint32_t k = 0;
    for (; k < f->n && f->ev[k] <= hwm; k++) {
        int rc = kvt_event_report_add(rep, f->ev[k], 1);
        if (!rc && (s->dead || event_in(w->fev, n_failed, f->ev[k])))
            rc = kvt_event_report_add_failed(rep, f->ev[k]);
        if (rc)
            return rc;
    }
    memmove(f->ev, f->ev + k, (f->n - k) * sizeof(int64_t));
    f->n -= k;
    return 0;
}

int kvt_worker_get_finished(kvt_worker *w, void *compute_stream, const kvt_str **reqs, uint32_t *n)
{
    *reqs = NULL;
    *n = 0;
    w->n_fin = 0;
    if (w->failed)
        return kvt_fail(KVT_EIO, "worker %u: a store failed earlier; the rank must restart",
                        w->cfg.rank);
    int rc = 0;
    if (w->meta && !w->submitted)
        rc = submit(w, compute_stream);
    if (!rc)
        rc = poll_loads(w);
    if (!rc)
        rc = poll_stores(w);
    for (uint32_t t = 1; !rc && t < KVT_MAX_TIERS; t++)
        if (w->st[t].x.ops && !(rc = poll_behind(w, t, KVT_COPY_STORE)))
            rc = poll_behind(w, t, KVT_COPY_LOAD);
    if (rc)
        return rc;
    *reqs = w->fin;
    *n = w->n_fin;
    return 0;
}

int kvt_worker_build_meta(kvt_worker *w, kvt_offload_worker_meta *out)
{
    kvt_offload_worker_meta_clear(out);
    int rc = kvt_offload_worker_meta_aggregate(out, &w->done);
    if (rc)
        return rc;
    kvt_offload_worker_meta_clear(&w->done);
    return 0;
}

uint32_t kvt_worker_take_invalid_blocks(kvt_worker *w, uint32_t *out, uint32_t cap)
{
    uint32_t n = w->n_invalid < cap ? w->n_invalid : cap;
    if (n == 0)
        return 0;
    memcpy(out, w->invalid, n * sizeof(uint32_t));
    memmove(w->invalid, w->invalid + n, (w->n_invalid - n) * sizeof(uint32_t));
    w->n_invalid -= n;
    return n;
}

uint32_t kvt_worker_pending(const kvt_worker *w, int dir)
{
    if (dir == KVT_COPY_LOAD || dir == KVT_COPY_STORE)
        return dir == KVT_COPY_LOAD ? w->n_loads : w->n_stores;
    if (dir == 2 + KVT_COPY_LOAD || dir == 2 + KVT_COPY_STORE)
        return w->st[1].ev[dir - 2].n; /* the disk behind the host tier */
    return 0;
}

kvt_copy *kvt_worker_copy(kvt_worker *w)
{
    return w->copy;
}
