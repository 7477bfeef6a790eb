/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The copy engine: validation, descriptor building, per-direction event rings, the
 * submission queue, completion polling and flush. The backends (cpu.c, cuda.c) only take
 * queued jobs and move bytes; see copy_internal.h for the structure and locking.
 *
 * Ordering. Events of one direction complete in submission order: the CPU backend serves the
 * queue in order and a job is DONE only when all its chunks are; the CUDA backend issues jobs
 * of a direction on one stream, which completes them in order. poll() therefore walks a
 * direction's ring from its oldest job and stops at the first unfinished one, never querying
 * past it, and the high-water mark is the event of the last job it passed.
 *
 * Flush (spec §3.4's pitfall): waiting only for issued work would miss jobs still sitting in
 * the submission queue, so flush first waits until the queue is drained and every CPU job is
 * done, then synchronizes every issued CUDA job.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/array.h"
#include "base/config.h"
#include "base/error.h"
#include "base/log.h"
#include "base/prom.h"
#include "base/util.h"
#include "copy/copy_config.h"
#include "copy/copy_internal.h"
#include "copy/cuda_frag_internal.h"
#include "copy/kernels.h"

const kvi_config_table kvi_copy_config_table =
    KVI_CONFIG_TABLE(kvt_copy_config, "copy", KVI_COPY_CONFIG(KVI_COPY_CONFIG_ROW));

void kvt_copy_config_init(kvt_copy_config *cfg)
{
    kvi_config_init(&kvi_copy_config_table, cfg);
}

uint32_t kvi_copy_coalesce(const uint32_t *src, const uint32_t *dst, uint32_t n, kvi_run *runs)
{
    uint32_t k = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (k > 0 && i > 0 && src[i] == src[i - 1] + 1 && dst[i] == dst[i - 1] + 1 &&
            src[i - 1] != UINT32_MAX && dst[i - 1] != UINT32_MAX) {
            runs[k - 1].len++;
            continue;
        }
        runs[k++] = (kvi_run){src[i], dst[i], 1};
    }
    return k;
}

void kvi_copy_build_descs(const kvt_region *src_regions, const kvt_region *dst_regions,
                          uint32_t n_regions, const kvi_run *runs, uint32_t n_runs, kvi_desc *out)
{
    kvi_desc *d = out;
    for (uint32_t r = 0; r < n_regions; r++) {
        uint64_t bpb = src_regions[r].block_bytes;
        for (uint32_t k = 0; k < n_runs; k++) {
            d->src = src_regions[r].base + (uint64_t)runs[k].src * bpb;
            d->dst = dst_regions[r].base + (uint64_t)runs[k].dst * bpb;
            d->size = (uint64_t)runs[k].len * bpb;
            d++;
        }
    }
}

static int env_descriptor_cap(uint32_t *cap)
{
    const char *e = getenv("KVTIER_MAX_BATCH_DESCRIPTORS");
    if (!e || !*e)
        return 0;
    char *end;
    unsigned long v = strtoul(e, &end, 10);
    if (*end || v == 0 || v > UINT32_MAX)
        return kvt_fail(KVT_EINVAL, "copy: KVTIER_MAX_BATCH_DESCRIPTORS=\"%s\" is not a count > 0",
                        e);
    *cap = (uint32_t)v;
    return 0;
}

static int env_kernel_max(uint64_t *max)
{
    const char *e = getenv("KVTIER_CUDA_KERNEL_MAX_BYTES");
    if (!e || !*e)
        return 0;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(e, &end, 10);
    if (*end || errno || e[0] == '-')
        return kvt_fail(KVT_EINVAL,
                        "copy: KVTIER_CUDA_KERNEL_MAX_BYTES=\"%s\" is not a byte count (0: never "
                        "the kernel)",
                        e);
    *max = v;
    return 0;
}

/* Thread blocks per multiprocessor in one launch of the CUDA gather/scatter kernel: a
 * benchmark knob (bench/gpu/run.sh sweeps it). */
static int env_kernel_blocks(uint32_t *per_sm)
{
    const char *e = getenv("KVTIER_CUDA_KERNEL_BLOCKS_PER_SM");
    if (!e || !*e)
        return 0;
    char *end;
    errno = 0;
    unsigned long v = strtoul(e, &end, 10);
    if (*end || errno || e[0] == '-' || v == 0 || v > 64)
        return kvt_fail(KVT_EINVAL,
                        "copy: KVTIER_CUDA_KERNEL_BLOCKS_PER_SM=\"%s\" is not a count in 1..64", e);
    *per_sm = (uint32_t)v;
    return 0;
}

static void free_job(copy_job *j)
{
    free(j->descs);
    free(j->runs);
    free(j->chunk_desc);
    free(j->chunk_off);
}

static void free_engine(kvt_copy *c)
{
    for (int d = 0; d < 2; d++) {
        if (c->ring[d].slots)
            for (uint32_t i = 0; i < c->cfg.max_events; i++)
                free_job(&c->ring[d].slots[i]);
        free(c->ring[d].slots);
        free(c->ring[d].failed);
    }
    kvi_ring_free(&c->queue);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv_work);
    pthread_cond_destroy(&c->cv_done);
    free(c);
}

static int check_mirror(const kvt_layout *l, const kvt_mirror *m)
{
    if (l->n_regions == 0)
        return kvt_fail(KVT_EINVAL, "copy: the layout has no regions");
    if (l->n_regions != m->n_regions)
        return kvt_fail(KVT_EINVAL, "copy: layout has %u regions, mirror %u", l->n_regions,
                        m->n_regions);
    for (uint32_t r = 0; r < l->n_regions; r++)
        if (l->regions[r].block_bytes != m->regions[r].block_bytes)
            return kvt_fail(KVT_EINVAL,
                            "copy: region %u: %llu-byte blocks on the device, %llu "
                            "on the host",
                            r, (unsigned long long)l->regions[r].block_bytes,
                            (unsigned long long)m->regions[r].block_bytes);
    return 0;
}

static int pick_backend(const kvt_copy_config *cfg, const kvt_layout *l,
                        const copy_backend_ops **ops)
{
    int want = cfg->backend;
    if (want == KVT_BACKEND_AUTO)
        want = l->device >= 0 ? KVT_BACKEND_CUDA : KVT_BACKEND_CPU;
    if (want == KVT_BACKEND_CPU) {
        if (l->device >= 0)
            return kvt_fail(KVT_EINVAL, "copy: the CPU backend cannot copy device %d memory",
                            l->device);
        *ops = &kvi_copy_cpu_ops;
        return 0;
    }
    if (want != KVT_BACKEND_CUDA)
        return kvt_fail(KVT_EINVAL, "copy: unknown backend %d", cfg->backend);
    const char *why = NULL;
    *ops = kvi_copy_cuda_ops(&why);
    if (!*ops)
        return kvt_fail(KVT_EUNSUPPORTED, "copy: CUDA backend unavailable: %s", why);
    return 0;
}

static void stop_threads(kvt_copy *c)
{
    pthread_mutex_lock(&c->mu);
    c->stop = true;
    pthread_cond_broadcast(&c->cv_work);
    pthread_mutex_unlock(&c->mu);
    c->ops->stop(c);
}

/* The environment's overrides of the configuration (KVTIER_MAX_BATCH_DESCRIPTORS,
 * KVTIER_CUDA_KERNEL_MAX_BYTES, KVTIER_CUDA_KERNEL_BLOCKS_PER_SM); a malformed one fails. */
static int apply_env(kvt_copy *c)
{
    c->kernel_blocks_per_sm = KVT_FRAG_BLOCKS_PER_SM;
    int rc = env_descriptor_cap(&c->cfg.max_descriptors);
    if (!rc)
        rc = env_kernel_max(&c->cfg.kernel_max_bytes);
    if (!rc)
        rc = env_kernel_blocks(&c->kernel_blocks_per_sm);
    return rc;
}

/* The submission queue (never full: each direction's ring bounds its queued jobs to
 * max_events) and each direction's ring of job slots; false when out of memory. */
static bool init_rings(kvt_copy *c)
{
    uint32_t n = c->cfg.max_events;
    bool ok = kvi_ring_init(&c->queue, sizeof(copy_job *), 2 * n) == 0;
    for (int d = 0; d < 2 && ok; d++) {
        c->ring[d].slots = calloc(n, sizeof(copy_job));
        c->ring[d].failed = calloc(n, sizeof(int64_t));
        c->ring[d].hwm = -1;
        c->ring[d].last_event = -1;
        ok = c->ring[d].slots && c->ring[d].failed;
    }
    return ok;
}

int kvt_copy_create(const kvt_copy_config *cfg, const kvt_layout *layout, const kvt_mirror *mirror,
                    kvt_copy **out)
{
    *out = NULL;
    if (kvi_config_check(&kvi_copy_config_table, cfg))
        return KVT_EINVAL;
    int rc = check_mirror(layout, mirror);
    if (rc)
        return rc;
    const copy_backend_ops *ops = NULL;
    rc = pick_backend(cfg, layout, &ops);
    if (rc)
        return rc;
    kvt_copy *c = calloc(1, sizeof(*c));
    if (!c)
        return kvt_fail(KVT_ENOMEM, "copy: out of memory");
    c->cfg = *cfg;
    if ((rc = apply_env(c))) {
        free(c);
        return rc;
    }
    c->layout = layout;
    c->mirror = mirror;
    c->block_bytes = kvt_layout_block_bytes(layout);
    c->ops = ops;
    c->kind = ops == &kvi_copy_cpu_ops ? KVT_BACKEND_CPU : KVT_BACKEND_CUDA;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv_work, NULL);
    pthread_cond_init(&c->cv_done, NULL);
    if (!init_rings(c)) {
        free_engine(c);
        return kvt_fail(KVT_ENOMEM, "copy: out of memory");
    }
    rc = ops->start(c);
    if (rc) {
        free_engine(c);
        return rc;
    }
    for (int d = 0; d < 2 && ops->job_init && !rc; d++)
        for (uint32_t i = 0; i < cfg->max_events && !rc; i++)
            rc = ops->job_init(c, &c->ring[d].slots[i]);
    if (rc) {
        stop_threads(c);
        free_engine(c);
        return rc;
    }
    *out = c;
    return 0;
}

void kvt_copy_destroy(kvt_copy *c)
{
    if (!c)
        return;
    kvt_copy_flush(c);
    stop_threads(c);
    free_engine(c);
}

KVI_GETTER(int, kvt_copy_backend_kind, kvt_copy, kind)

static int check_ids(const char *what, const uint32_t *ids, uint32_t n, uint32_t limit,
                     int64_t event)
{
    for (uint32_t i = 0; i < n; i++)
        if (ids[i] >= limit)
            return kvt_fail(KVT_ERANGE, "copy: event %lld: %s block %u out of range (%u blocks)",
                            (long long)event, what, ids[i], limit);
    return 0;
}

static int reserve(void **p, uint32_t *cap, uint64_t need, size_t elem)
{
    int rc = kvi_array_grow(p, cap, need, elem);
    return rc ? kvi_fail_wrap(rc, "copy") : 0;
}

/* Splits the job's byte stream into chunk_bytes pieces for the CPU copy threads. */
static int plan_chunks(kvt_copy *c, copy_job *j)
{
    uint64_t C = c->cfg.chunk_bytes;
    uint64_t n = (j->bytes + C - 1) / C;
    uint32_t cap1 = j->cap_chunks, cap2 = j->cap_chunks;
    int rc = reserve((void **)&j->chunk_desc, &cap1, n, sizeof(uint32_t));
    if (!rc)
        rc = reserve((void **)&j->chunk_off, &cap2, n, sizeof(uint64_t));
    if (rc)
        return rc;
    j->cap_chunks = cap1 < cap2 ? cap1 : cap2;
    uint64_t acc = 0;
    uint32_t k = 0;
    for (uint32_t d = 0; d < j->n_descs; d++) {
        uint64_t off = 0, size = j->descs[d].size;
        while (off < size) {
            if (acc == 0) {
                j->chunk_desc[k] = d;
                j->chunk_off[k] = off;
                k++;
            }
            uint64_t take = size - off < C - acc ? size - off : C - acc;
            off += take;
            acc += take;
            if (acc == C)
                acc = 0;
        }
    }
    j->n_chunks = k;
    j->next_chunk = j->chunks_done = 0;
    return 0;
}

int kvt_copy_submit(kvt_copy *c, int dir, int64_t event, const uint32_t *src, const uint32_t *dst,
                    uint32_t n, void *wait)
{
    if (dir != KVT_COPY_STORE && dir != KVT_COPY_LOAD)
        return kvt_fail(KVT_EINVAL, "copy: direction %d invalid", dir);
    if (n == 0 || !src || !dst)
        return kvt_fail(KVT_EINVAL, "copy: event %lld has no blocks", (long long)event);
    copy_ring *ring = &c->ring[dir];
    const char *name = dir == KVT_COPY_STORE ? "store" : "load";
    if (event <= ring->last_event)
        return kvt_fail(KVT_EINVAL, "copy: %s event %lld not above the previous one (%lld)", name,
                        (long long)event, (long long)ring->last_event);
    uint32_t dev = c->layout->num_blocks, host = c->mirror->num_blocks;
    bool store = dir == KVT_COPY_STORE;
    int rc = check_ids(store ? "device" : "host", src, n, store ? dev : host, event);
    if (!rc)
        rc = check_ids(store ? "host" : "device", dst, n, store ? host : dev, event);
    if (rc)
        return rc;
    pthread_mutex_lock(&c->mu);
    bool full = ring->tail - ring->head >= c->cfg.max_events;
    pthread_mutex_unlock(&c->mu);
    if (full)
        return kvt_fail(KVT_EBUSY, "copy: %u %s events outstanding (max_events)", c->cfg.max_events,
                        name);
    /* The slot is FREE: no copy thread looks at it until it is queued below. */
    copy_job *j = &ring->slots[ring->tail % c->cfg.max_events];
    uint32_t nr = c->layout->n_regions;
    rc = reserve((void **)&j->runs, &j->cap_runs, n, sizeof(kvi_run));
    if (rc)
        return rc;
    uint32_t runs = kvi_copy_coalesce(src, dst, n, j->runs);
    rc = reserve((void **)&j->descs, &j->cap_descs, (uint64_t)runs * nr, sizeof(kvi_desc));
    if (rc)
        return rc;
    const kvt_region *dev_r = c->layout->regions, *host_r = c->mirror->regions;
    kvi_copy_build_descs(store ? dev_r : host_r, store ? host_r : dev_r, nr, j->runs, runs,
                         j->descs);
    j->n_descs = runs * nr;
    j->bytes = (uint64_t)n * c->block_bytes; /* the CUDA backend picks DMA or kernel by it */
    if (c->kind == KVT_BACKEND_CPU && (rc = plan_chunks(c, j)))
        return rc;
    j->dir = dir;
    j->event = event;
    j->submit_ns = kvt_monotonic_ns();
    j->wait = wait;
    ring->last_event = event;
    pthread_mutex_lock(&c->mu);
    c->st.events[dir]++;
    c->st.blocks[dir] += n;
    c->st.bytes[dir] += (uint64_t)n * c->block_bytes;
    c->st.descriptors[dir] += j->n_descs;
    j->state = JOB_QUEUED;
    ring->tail++;
    *(copy_job **)kvi_ring_push(&c->queue) = j;
    pthread_cond_broadcast(&c->cv_work);
    pthread_mutex_unlock(&c->mu);
    return 0;
}

copy_job *kvi_copy_queue_front(kvt_copy *c)
{
    return kvi_ring_len(&c->queue) ? *KVI_RING_AT(&c->queue, copy_job *, 0) : NULL;
}

copy_job *kvi_copy_wait_front(kvt_copy *c)
{
    for (;;) {
        copy_job *j = kvi_copy_queue_front(c);
        if (j || c->stop)
            return j;
        pthread_cond_wait(&c->cv_work, &c->mu);
    }
}

void kvi_copy_queue_pop(kvt_copy *c)
{
    kvi_ring_drop(&c->queue, 1);
    pthread_cond_broadcast(&c->cv_done);
}

void kvi_copy_job_finish(kvt_copy *c, copy_job *j, bool ok)
{
    j->state = ok ? JOB_DONE : JOB_FAILED;
    pthread_cond_broadcast(&c->cv_done);
}

int kvt_copy_poll(kvt_copy *c, int dir, int64_t *hwm)
{
    if (dir != KVT_COPY_STORE && dir != KVT_COPY_LOAD)
        return kvt_fail(KVT_EINVAL, "copy: direction %d invalid", dir);
    copy_ring *ring = &c->ring[dir];
    pthread_mutex_lock(&c->mu);
    while (ring->head != ring->tail) {
        copy_job *j = &ring->slots[ring->head % c->cfg.max_events];
        if (j->state == JOB_ISSUED && !c->ops->query(c, j))
            break;
        if (j->state != JOB_DONE && j->state != JOB_FAILED)
            break;
        if (j->state == JOB_FAILED) {
            ring->failed[ring->n_failed++] = j->event;
            c->st.events_failed[dir]++;
        }
        c->st.events_done[dir]++;
        kvi_hist_observe(&c->lat[dir], kvt_monotonic_ns() - j->submit_ns);
        ring->hwm = j->event;
        j->state = JOB_FREE;
        ring->head++;
    }
    *hwm = ring->hwm;
    pthread_mutex_unlock(&c->mu);
    return 0;
}

uint32_t kvt_copy_take_failed(kvt_copy *c, int dir, int64_t *out, uint32_t cap)
{
    if (dir != KVT_COPY_STORE && dir != KVT_COPY_LOAD)
        return 0;
    copy_ring *ring = &c->ring[dir];
    pthread_mutex_lock(&c->mu);
    uint32_t n = ring->n_failed < cap ? ring->n_failed : cap;
    memcpy(out, ring->failed, n * sizeof(*out));
    memmove(ring->failed, ring->failed + n, (ring->n_failed - n) * sizeof(*out));
    ring->n_failed -= n;
    pthread_mutex_unlock(&c->mu);
    return n;
}

/* Under c->mu: a job still waiting for a copy thread or being copied by the CPU backend. */
static bool any_queued(kvt_copy *c)
{
    if (kvi_ring_len(&c->queue))
        return true;
    for (int d = 0; d < 2; d++)
        for (uint32_t i = c->ring[d].head; i != c->ring[d].tail; i++)
            if (c->ring[d].slots[i % c->cfg.max_events].state == JOB_QUEUED)
                return true;
    return false;
}

int kvt_copy_flush(kvt_copy *c)
{
    pthread_mutex_lock(&c->mu);
    while (any_queued(c))
        pthread_cond_wait(&c->cv_done, &c->mu);
    for (int d = 0; d < 2; d++) {
        copy_ring *ring = &c->ring[d];
        for (uint32_t i = ring->head; i != ring->tail; i++) {
            copy_job *j = &ring->slots[i % c->cfg.max_events];
            if (j->state != JOB_ISSUED)
                continue;
            /* Issued jobs are owned by this thread now: the copy threads are done with them. */
            pthread_mutex_unlock(&c->mu);
            bool ok = c->ops->sync(c, j);
            pthread_mutex_lock(&c->mu);
            kvi_copy_job_finish(c, j, ok);
        }
    }
    pthread_mutex_unlock(&c->mu);
    return 0;
}

void kvt_copy_get_stats(const kvt_copy *c, kvt_copy_stats *s)
{
    if (!kvi_stats_begin(c, s, sizeof(*s)))
        return;
    kvt_copy *m = (kvt_copy *)c;
    pthread_mutex_lock(&m->mu);
    *s = c->st;
    for (int d = 0; d < 2; d++)
        s->outstanding[d] = c->ring[d].tail - c->ring[d].head;
    pthread_mutex_unlock(&m->mu);
}

const char *kvt_copy_kernel_name(const kvt_copy *c, uint64_t run_bytes)
{
    if (c->kind != KVT_BACKEND_CPU)
        return kvi_copy_cuda_kernel(c, run_bytes, NULL);
    if (run_bytes < c->cfg.nt_min_bytes)
        return "memcpy";
    return c->kern[run_bytes >= KVT_KERNEL_LARGE_MIN]->name;
}

int kvt_copy_prometheus(const kvt_copy *c, char *buf, size_t cap, size_t *len)
{
    if (!len || (cap && !buf))
        return kvt_fail(KVT_EINVAL, "copy: prometheus: NULL argument");
    kvt_copy_stats s;
    kvt_copy_get_stats(c, &s);
    kvi_prom p = {buf, cap, 0};
    static const char *const dir_name[2] = {"store", "load"};
    const struct {
        const char *name, *help;
        const uint64_t *v;
    } counters[] = {
        {"events_total", "Copy events submitted.", s.events},
        {"events_done_total", "Copy events completed (failed ones included).", s.events_done},
        {"events_failed_total", "Copy events the backend could not complete.", s.events_failed},
        {"blocks_total", "Block pairs submitted.", s.blocks},
        {"bytes_total", "Bytes submitted.", s.bytes},
        {"descriptors_total", "Copies after coalescing.", s.descriptors},
        {"kernel_events_total", "Events the CUDA gather/scatter kernel copied (the rest: DMA).",
         s.kernel_events},
    };
    for (size_t i = 0; i < KVT_ARRAY_LEN(counters); i++)
        kvi_prom_pair(&p, "kvtier_copy", counters[i].name, counters[i].help, false, dir_name,
                      counters[i].v);
    uint64_t outstanding[2] = {s.outstanding[0], s.outstanding[1]};
    kvi_prom_pair(&p, "kvtier_copy", "outstanding_events", "Events submitted, not reported.", true,
                  dir_name, outstanding);
    kvi_hist lat[2];
    pthread_mutex_lock(&((kvt_copy *)c)->mu);
    memcpy(lat, c->lat, sizeof(lat));
    pthread_mutex_unlock(&((kvt_copy *)c)->mu);
    kvi_prom_hist(&p, "kvtier_copy", "transfer_seconds",
                  "Latency of a copy event, from submission to the poll that reported it.",
                  "direction", dir_name, lat, 2);
    kvi_prom_family(&p, "kvtier_copy", "kernel_info",
                    "The copy kernel of small (16 KiB class) and large (2 MiB class) runs.", true);
    const char *kern[2] = {kvt_copy_kernel_name(c, KVT_KERNEL_SMALL_RUN),
                           kvt_copy_kernel_name(c, KVT_KERNEL_LARGE_RUN)};
    for (int k = 0; k < 2; k++)
        kvi_prom_put(&p, "kvtier_copy_kernel_info{runs=\"%s\",kernel=\"%s\"} 1\n",
                     k ? "large" : "small", kern[k]);
    return kvi_prom_finish(&p, len, "copy");
}

uint32_t kvt_copy_outstanding(const kvt_copy *c, int dir)
{
    if (dir != KVT_COPY_STORE && dir != KVT_COPY_LOAD)
        return 0;
    kvt_copy *m = (kvt_copy *)c;
    pthread_mutex_lock(&m->mu);
    uint32_t n = c->ring[dir].tail - c->ring[dir].head;
    pthread_mutex_unlock(&m->mu);
    return n;
}
