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
#include "copy/copy_internal.h"
#include "base/cuda.h"
#include "disk/disk_internal.h"
#include "kvtier/disk.h"
#include "kvtier/worker.h"

typedef struct pending_load {
    int64_t event;
    uint32_t n, cap;
    uint32_t *blocks; /* destination device blocks */
    uint32_t n_inv, cap_inv;
    uint32_t *inv; /* of which the manager declared invalid (failed promotions) */
} pending_load;

/* Three tiers: the disk events of one direction, submitted and not yet reported. */
typedef struct ev_fifo {
    int64_t *ev;
    uint32_t n, cap;
    int64_t last;
} ev_fifo;

struct kvt_worker {
    kvt_worker_config cfg;
    const kvt_layout *layout;
    kvt_copy *copy;       /* host tier: the copy engine (owned) ... */
    kvt_disk *disk;       /* ... or disk as the tier (borrowed) */
    uint32_t host_blocks; /* mirror blocks or disk slots */
    bool tier_dead;       /* the disk failed fatally: transfers fail without I/O */
    int64_t *fev;         /* scratch: failed events taken from the engine */
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
    /* three tiers */
    const kvt_mirror *mirror;
    kvt_disk *tier3;    /* borrowed */
    bool tier3_dead;    /* fatal disk error: write-backs and promotions fail without I/O */
    ev_fifo disk_ev[2]; /* indexed by KVT_COPY_LOAD (promotions) / KVT_COPY_STORE (writes) */
};

void kvt_worker_config_init(kvt_worker_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    kvt_copy_config_init(&cfg->copy);
}

int kvt_worker_create(const kvt_worker_config *cfg, const kvt_layout *layout,
                      const kvt_mirror *mirror, kvt_worker **out)
{
    *out = NULL;
    kvt_worker *w = calloc(1, sizeof(*w));
    if (!w)
        return kvt_fail(KVT_ENOMEM, "worker: out of memory");
    w->cfg = *cfg;
    w->layout = layout;
    w->host_blocks = mirror->num_blocks;
    w->mirror = mirror;
    w->last_load = w->last_store = -1;
    w->disk_ev[0].last = w->disk_ev[1].last = -1;
    kvt_offload_worker_meta_init(&w->done);
    int rc = kvt_copy_create(&cfg->copy, layout, mirror, &w->copy);
    if (!rc && kvt_copy_backend_kind(w->copy) == KVT_BACKEND_CUDA) {
        const kvi_cuda_api *cu = kvi_cuda();
        rc = kvi_cuda_use_device(layout->device, NULL);
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
    *out = w;
    return 0;
}

int kvt_worker_create_disk(const kvt_worker_config *cfg, const kvt_layout *layout, kvt_disk *disk,
                           kvt_worker **out)
{
    *out = NULL;
    kvt_worker *w = calloc(1, sizeof(*w));
    if (!w)
        return kvt_fail(KVT_ENOMEM, "worker: out of memory");
    w->cfg = *cfg;
    w->layout = layout;
    w->disk = disk;
    w->host_blocks = kvt_disk_num_slots(disk);
    w->last_load = w->last_store = -1;
    kvt_offload_worker_meta_init(&w->done);
    *out = w;
    return 0;
}

int kvt_worker_attach_disk(kvt_worker *w, kvt_disk *disk)
{
    if (!w || !disk)
        return kvt_fail(KVT_EINVAL, "worker: attach_disk: NULL argument");
    if (!w->copy || w->tier3)
        return kvt_fail(KVT_ESTATE, "worker %u: attach_disk: %s", w->cfg.rank,
                        w->tier3 ? "a disk is already attached" : "a disk worker has no host tier");
    const kvt_layout *l = kvi_disk_layout(disk);
    bool same = l->device == KVT_HOST_DEVICE && l->num_blocks == w->mirror->num_blocks &&
                l->n_regions == w->mirror->n_regions;
    for (uint32_t i = 0; same && i < l->n_regions; i++)
        same = l->regions[i].base == w->mirror->regions[i].base &&
               l->regions[i].block_bytes == w->mirror->regions[i].block_bytes;
    if (!same)
        return kvt_fail(KVT_EINVAL,
                        "worker %u: attach_disk: the disk's layout is not the host mirror's "
                        "(create it over kvt_mirror_layout)",
                        w->cfg.rank);
    w->tier3 = disk;
    return 0;
}

void kvt_worker_destroy(kvt_worker *w)
{
    if (!w)
        return;
    kvt_copy_destroy(w->copy);
    if (w->disk)
        kvt_disk_flush(w->disk);
    if (w->tier3)
        kvt_disk_flush(w->tier3);
    for (int i = 0; i < 2; i++)
        free(w->disk_ev[i].ev);
    free(w->fev);
    if (w->compute_done)
        kvi_cuda()->EventDestroy(w->compute_done);
    for (uint32_t i = 0; i < w->cap_loads; i++) {
        free(w->loads[i].blocks);
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
    uint32_t dev = w->layout->num_blocks, host = w->host_blocks;
    if ((rc = check_ids(w, "load device", meta->load_gpu_blocks, meta->n_loads, dev)) ||
        (rc = check_ids(w, "load host", meta->load_cpu_blocks, meta->n_loads, host)) ||
        (rc = check_ids(w, "store device", meta->store_gpu_blocks, meta->n_stores, dev)) ||
        (rc = check_ids(w, "store host", meta->store_cpu_blocks, meta->n_stores, host)) ||
        (rc = check_ids(w, "invalid load device", meta->load_invalid_blocks, meta->n_load_invalid,
                        dev)))
        return rc;
    if ((meta->n_disk_loads || meta->n_disk_stores) && !w->tier3)
        return kvt_fail(KVT_EINVAL,
                        "worker %u: the metadata moves blocks to or from disk but no disk is "
                        "attached (kvt_worker_attach_disk)",
                        w->cfg.rank);
    if (w->tier3) {
        uint32_t slots = kvt_disk_num_slots(w->tier3);
        if ((rc = check_ids(w, "promotion slot", meta->disk_load_slots, meta->n_disk_loads,
                            slots)) ||
            (rc = check_ids(w, "promotion host", meta->disk_load_host_blocks, meta->n_disk_loads,
                            host)) ||
            (rc = check_ids(w, "write-back host", meta->disk_store_host_blocks, meta->n_disk_stores,
                            host)) ||
            (rc = check_ids(w, "write-back slot", meta->disk_store_slots, meta->n_disk_stores,
                            slots)))
            return rc;
        int64_t ev[2];
        ev[KVT_COPY_LOAD] = meta->disk_load_event;
        ev[KVT_COPY_STORE] = meta->disk_store_event;
        for (int d = 0; d < 2; d++)
            if (ev[d] != KVT_NO_EVENT && ev[d] <= w->disk_ev[d].last)
                return kvt_fail(KVT_EINVAL, "worker %u: disk %s event %lld not above %lld",
                                w->cfg.rank, d == KVT_COPY_LOAD ? "load" : "store",
                                (long long)ev[d], (long long)w->disk_ev[d].last);
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

/* The disk failed fatally: from now on every transfer fails at once, without I/O, so the
 * engine keeps serving from its GPU tier (stores never become findable, loads recompute). */
static void kill_tier(kvt_worker *w)
{
    if (!w->tier_dead)
        KVT_LOG_E("worker %u: %s; the disk tier is off, transfers fail until restart", w->cfg.rank,
                  kvt_last_error());
    w->tier_dead = true;
}

static void kill_tier3(kvt_worker *w)
{
    if (!w->tier3_dead)
        KVT_LOG_E("worker %u: %s; the disk tier is off (write-backs and promotions fail) until "
                  "restart",
                  w->cfg.rank, kvt_last_error());
    w->tier3_dead = true;
}

int kvt_worker_flush(kvt_worker *w)
{
    if (w->tier3 && !w->tier3_dead && kvt_disk_flush(w->tier3) == KVT_EIO)
        kill_tier3(w);
    if (w->copy)
        return kvt_copy_flush(w->copy);
    if (!w->tier_dead && kvt_disk_flush(w->disk) == KVT_EIO)
        kill_tier(w);
    return 0;
}

int kvt_worker_handle_preemptions(kvt_worker *w)
{
    if (!w->meta || !w->meta->need_flush)
        return 0;
    return kvt_worker_flush(w);
}

static int engine_submit(kvt_worker *w, int dir, int64_t event, const uint32_t *src,
                         const uint32_t *dst, uint32_t n, void *wait)
{
    if (w->copy)
        return kvt_copy_submit(w->copy, dir, event, src, dst, n, wait);
    if (w->tier_dead)
        return 0;
    int rc = kvt_disk_submit(w->disk, dir, event, src, dst, n, wait);
    if (rc == KVT_EIO) {
        kill_tier(w);
        return 0;
    }
    return rc;
}

/* Takes every failed event of a direction from the engine into w->fev (none is dropped: a
 * failed store reported as fine would make wrong bytes findable). */
static int take_failed(kvt_worker *w, int dir, uint32_t *n)
{
    *n = 0;
    for (;;) {
        int rc = grow((void **)&w->fev, &w->cap_fev, (uint64_t)*n + 64, sizeof(int64_t), false);
        if (rc)
            return rc;
        uint32_t got = w->copy ? kvt_copy_take_failed(w->copy, dir, w->fev + *n, 64)
                       : dir == KVT_COPY_STORE && !w->tier_dead
                           ? kvt_disk_take_failed(w->disk, w->fev + *n, 64)
                           : 0;
        *n += got;
        if (got < 64)
            return 0;
    }
}

/* High-water mark of a direction; a dead disk tier has finished everything (failed). */
static int64_t engine_poll(kvt_worker *w, int dir)
{
    int64_t hwm = -1;
    if (w->copy) {
        kvt_copy_poll(w->copy, dir, &hwm);
        return hwm;
    }
    if (!w->tier_dead && kvt_disk_poll(w->disk, dir, &hwm) == KVT_EIO)
        kill_tier(w);
    return w->tier_dead ? INT64_MAX : hwm;
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

/* Three tiers: a promotion (slots -> host blocks) or a write-back (host blocks -> slots). The
 * manager issues one only after everything it depends on completed on every rank (a
 * write-back reads a host block whose store all ranks reported; a promoted block is loaded to
 * the GPU only after all ranks reported the promotion), so it needs no wait event. */
static int submit_disk(kvt_worker *w, int dir, int64_t event, const uint32_t *src,
                       const uint32_t *dst, uint32_t n)
{
    ev_fifo *f = &w->disk_ev[dir];
    int rc = grow((void **)&f->ev, &f->cap, f->n + 1ull, sizeof(int64_t), false);
    if (rc)
        return rc;
    if (!w->tier3_dead) {
        rc = kvt_disk_submit(w->tier3, dir, event, src, dst, n, NULL);
        if (rc == KVT_EIO)
            kill_tier3(w);
        else if (rc)
            return kvi_fail_wrap(rc, "worker: disk");
    }
    f->ev[f->n++] = event;
    f->last = event;
    return 0;
}

static int submit(kvt_worker *w, void *stream)
{
    const kvt_offload_meta *m = w->meta;
    w->submitted = true;
    if (m->load_event == KVT_NO_EVENT && m->store_event == KVT_NO_EVENT &&
        m->disk_load_event == KVT_NO_EVENT && m->disk_store_event == KVT_NO_EVENT)
        return 0;
    void *wait;
    int rc = compute_point(w, stream, &wait);
    if (rc)
        return rc;
    if (m->load_event != KVT_NO_EVENT) {
        rc = grow((void **)&w->loads, &w->cap_loads, w->n_loads + 1, sizeof(*w->loads), true);
        pending_load *p = rc ? NULL : &w->loads[w->n_loads];
        if (p)
            rc = grow((void **)&p->blocks, &p->cap, m->n_loads, sizeof(uint32_t), false);
        if (!rc)
            rc = engine_submit(w, KVT_COPY_LOAD, m->load_event, m->load_cpu_blocks,
                               m->load_gpu_blocks, m->n_loads, wait);
        if (rc)
            return kvi_fail_wrap(rc, "worker: load");
        memcpy(p->blocks, m->load_gpu_blocks, m->n_loads * sizeof(uint32_t));
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
    }
    if (m->store_event != KVT_NO_EVENT) {
        rc = grow((void **)&w->stores, &w->cap_stores, w->n_stores + 1, sizeof(int64_t), false);
        if (!rc)
            rc = engine_submit(w, KVT_COPY_STORE, m->store_event, m->store_gpu_blocks,
                               m->store_cpu_blocks, m->n_stores, wait);
        if (rc)
            return kvi_fail_wrap(rc, "worker: store");
        w->stores[w->n_stores++] = m->store_event;
        w->last_store = m->store_event;
    }
    if (m->disk_load_event != KVT_NO_EVENT &&
        (rc = submit_disk(w, KVT_COPY_LOAD, m->disk_load_event, m->disk_load_slots,
                          m->disk_load_host_blocks, m->n_disk_loads)))
        return rc;
    if (m->disk_store_event != KVT_NO_EVENT &&
        (rc = submit_disk(w, KVT_COPY_STORE, m->disk_store_event, m->disk_store_host_blocks,
                          m->disk_store_slots, m->n_disk_stores)))
        return rc;
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

static int poll_loads(kvt_worker *w)
{
    /* Without metadata finished loads cannot be translated: they wait for the next bind. */
    if (w->n_loads == 0 || !w->meta)
        return 0;
    int64_t hwm = engine_poll(w, KVT_COPY_LOAD);
    uint32_t n_failed;
    int rc0 = take_failed(w, KVT_COPY_LOAD, &n_failed);
    if (rc0)
        return rc0;
    const int64_t *failed = w->fev;
    if (w->disk) { /* the disk knows which blocks failed; a dead tier fails them all */
        uint32_t got;
        do {
            uint32_t need = (uint32_t)w->n_invalid + 256;
            int rc = grow((void **)&w->invalid, &w->cap_invalid, need, sizeof(uint32_t), false);
            if (rc)
                return rc;
            got = kvt_disk_take_invalid_blocks(w->disk, w->invalid + w->n_invalid, 256);
            w->n_invalid += got;
        } while (got == 256);
    }
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
        if (!rc && (w->tier_dead || event_in(failed, n_failed, p->event))) {
            rc = grow((void **)&w->invalid, &w->cap_invalid, (uint64_t)w->n_invalid + p->n,
                      sizeof(uint32_t), false);
            if (!rc) {
                memcpy(w->invalid + w->n_invalid, p->blocks, p->n * sizeof(uint32_t));
                w->n_invalid += p->n;
            }
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
    int64_t hwm = engine_poll(w, KVT_COPY_STORE);
    uint32_t n_failed;
    int rc0 = take_failed(w, KVT_COPY_STORE, &n_failed);
    if (rc0)
        return rc0;
    const int64_t *failed = w->fev;
    if (n_failed && w->copy) { /* a DMA failure: the device is in an unknown state */
        w->failed = true;
        return kvt_fail(KVT_EIO, "worker %u: store event %lld failed; the rank must restart",
                        w->cfg.rank, (long long)failed[0]);
    }
    /* disk I/O errors fail the event only: reported completed and failed */
    uint32_t k = 0;
    for (; k < w->n_stores && w->stores[k] <= hwm; k++) {
        int rc = kvt_offload_worker_meta_add(&w->done, w->stores[k], 1);
        if (!rc && (w->tier_dead || event_in(failed, n_failed, w->stores[k])))
            rc = kvt_offload_worker_meta_add_failed(&w->done, w->stores[k]);
        if (rc)
            return rc;
    }
    memmove(w->stores, w->stores + k, (w->n_stores - k) * sizeof(int64_t));
    w->n_stores -= k;
    return 0;
}

/* Three tiers: reports the write-backs / promotions of one direction that finished. */
static int poll_disk(kvt_worker *w, int dir)
{
    ev_fifo *f = &w->disk_ev[dir];
    if (f->n == 0)
        return 0;
    int64_t hwm = INT64_MAX;
    if (!w->tier3_dead && kvt_disk_poll(w->tier3, dir, &hwm) == KVT_EIO)
        kill_tier3(w);
    if (w->tier3_dead)
        hwm = INT64_MAX;
    uint32_t n_failed = 0;
    for (;;) { /* every failed event, none dropped */
        int rc =
            grow((void **)&w->fev, &w->cap_fev, (uint64_t)n_failed + 64, sizeof(int64_t), false);
        if (rc)
            return rc;
        uint32_t got = w->tier3_dead ? 0
                       : dir == KVT_COPY_STORE
                           ? kvt_disk_take_failed(w->tier3, w->fev + n_failed, 64)
                           : kvt_disk_take_failed_loads(w->tier3, w->fev + n_failed, 64);
        n_failed += got;
        if (got < 64)
            break;
    }
    if (dir == KVT_COPY_LOAD && !w->tier3_dead) { /* per-block failures: the event says it */
        uint32_t sink[256];
        while (kvt_disk_take_invalid_blocks(w->tier3, sink, 256) == 256)
            ;
    }
    kvt_event_report *rep = dir == KVT_COPY_STORE ? &w->done.disk_stores : &w->done.disk_loads;
    uint32_t k = 0;
    for (; k < f->n && f->ev[k] <= hwm; k++) {
        int rc = kvt_event_report_add(rep, f->ev[k], 1);
        if (!rc && (w->tier3_dead || event_in(w->fev, n_failed, f->ev[k])))
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
    if (!rc && w->tier3)
        rc = poll_disk(w, KVT_COPY_STORE);
    if (!rc && w->tier3)
        rc = poll_disk(w, KVT_COPY_LOAD);
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
        return w->disk_ev[dir - 2].n;
    return 0;
}

kvt_copy *kvt_worker_copy(kvt_worker *w)
{
    return w->copy;
}
