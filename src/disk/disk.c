/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The disk tier (see kvtier/disk.h for the contract).
 *
 * Each direction is a pipeline: a thread, an io_uring, queue_depth staging buffers and a ring
 * of jobs (events). When every region's base and block size are multiples of the alignment
 * (always with page_cache), the I/O is vectored straight from and into the blocks, one iovec
 * per region plus one for the slot's padding, and the staging buffers stay unused. The thread runs
 * its jobs in order. For every block of a job it takes a free staging buffer (reaping a completion
 * if none is free), then either gathers the block's regions into it and queues a write of the slot
 * (store), or queues a read of the slot (load), whose completion scatters the buffer into the
 * block's regions. Copies and disk I/O of different blocks overlap; a job finishes when all its I/O
 * completed and every buffer is free again, so nothing still in flight can touch a buffer the next
 * job reuses.
 *
 * Locking: one mutex guards the job rings' positions and states, the failure lists and the
 * fatal error. A job's arrays belong to the submitting thread until the job is queued and to
 * the pipeline thread while it runs; poll hands the slot back once the job is DONE.
 */
#define _GNU_SOURCE /* O_DIRECT, pthread_timedjoin_np */
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "base/array.h"
#include "base/util.h"
#include "base/config.h"
#include "base/error.h"
#include "base/log.h"
#include "base/prom.h"
#include "base/cuda.h"
#include "disk/disk_config.h"
#include "disk/disk_internal.h"

enum { DJOB_FREE = 0, DJOB_QUEUED, DJOB_RUNNING, DJOB_DONE };

typedef struct disk_job {
    int64_t event;
    uint32_t n, cap;
    uint32_t *src, *dst;
    int state;
    bool failed;       /* a block's I/O failed */
    uint64_t ok_bytes; /* slot bytes moved successfully (pipeline thread; counted at DONE) */
    void *wait;        /* CUDA: event the job's device copies wait for */
} disk_job;

typedef struct disk_pipe {
    struct kvt_disk *d;
    int dir;
    pthread_t th;
    bool started, exited;
    bool leak;         /* I/O may still be in flight after a fatal error: never free its buffers */
    bool zero_copy;    /* vectored I/O straight from/to the blocks (everything aligned) */
    struct iovec *iov; /* zero copy: (n_regions + 1) per staging index */
    bool staging_pinned;
    kvi_CUstream stream;          /* CUDA layouts: device <-> staging copies */
    unsigned char *pad_raw, *pad; /* zero copy: the slot's padding (zeros / a read sink) */
    struct io_uring ring;
    bool ring_ok, fixed_file, fixed_bufs;
    unsigned char *staging_raw, *staging;
    uint32_t *free_bufs, n_free;
    disk_job *jobs;
    uint32_t head, next, tail; /* head: oldest unreported; next: next to run; tail: free */
    int64_t hwm, last_event;
} disk_pipe;

/* The layout's geometry, read once through the public accessors. */
typedef struct disk_geo {
    int32_t device;
    uint32_t num_blocks, n_regions;
    const kvt_region *regions;
} disk_geo;

struct kvt_disk {
    kvi_xfer_port port; /* first: the worker's way in (port/xfer.h) */
    kvt_disk_config cfg;
    const kvt_layout *layout;
    disk_geo geo;
    char path[4096];
    int fd;
    uint64_t slot_bytes, block_bytes;
    uint32_t n_slots;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    bool stop;
    disk_pipe pipe[2];
    int64_t *failed[2]; /* finished events with a failed block, per direction */
    uint32_t n_failed[2], cap_failed[2];
    uint32_t *invalid;
    uint32_t n_invalid, cap_invalid;
    int fatal;
    char fatal_msg[4096 + 256];
    kvt_disk_stats st; /* under mu */
    kvt_disk_fault_fn fault;
    void *fault_ctx;
};

/* libkvtier's kvt_describe_config (src/abi.c) makes its own table of the same rows: this
 * library's functions are not that one's to call */
static const kvi_config_table disk_config_table =
    KVI_CONFIG_TABLE(kvt_disk_config, "disk", KVI_DISK_CONFIG(KVI_DISK_CONFIG_ROW));

void kvt_disk_config_init(kvt_disk_config *cfg)
{
    kvi_config_init(&disk_config_table, cfg);
}

void kvt_disk_set_fault(kvt_disk *d, kvt_disk_fault_fn fn, void *ctx)
{
    pthread_mutex_lock(&d->mu);
    d->fault = fn;
    d->fault_ctx = ctx;
    pthread_mutex_unlock(&d->mu);
}

/* Under d->mu: records the first fatal error (sticky) and wakes everyone. */
static void set_fatal(kvt_disk *d, const char *what, int err)
{
    if (!d->fatal) {
        d->fatal = KVT_EIO;
        snprintf(d->fatal_msg, sizeof(d->fatal_msg),
                 "disk %s: %s: %s (fatal; the disk tier is "
                 "unusable until restart)",
                 d->path, what, strerror(err));
        KVT_LOG_E("%s", d->fatal_msg);
    }
    pthread_cond_broadcast(&d->cv_done);
    pthread_cond_broadcast(&d->cv_work);
}

/* ---- data movement ----------------------------------------------------------------------- */

/* CUDA layouts: device block <-> staging buffer, one async copy per region, then a wait
 * (the disk I/O of other blocks keeps running meanwhile). False on a device error. */
static bool cuda_copy(disk_pipe *p, uint32_t block, unsigned char *buf, bool to_host)
{
    const kvi_cuda_api *cu = kvi_cuda();
    const disk_geo *l = &p->d->geo;
    kvi_CUresult r = KVT_CUDA_SUCCESS;
    for (uint32_t i = 0; i < l->n_regions && r == KVT_CUDA_SUCCESS; i++) {
        uint64_t bpb = l->regions[i].block_bytes, dev = l->regions[i].base + block * bpb;
        kvi_CUdeviceptr host = (kvi_CUdeviceptr)(uintptr_t)buf;
        r = to_host ? cu->MemcpyAsync(host, dev, bpb, p->stream)
                    : cu->MemcpyAsync(dev, host, bpb, p->stream);
        buf += bpb;
    }
    if (r == KVT_CUDA_SUCCESS)
        r = cu->StreamSynchronize(p->stream);
    if (r != KVT_CUDA_SUCCESS) {
        pthread_mutex_lock(&p->d->mu);
        set_fatal(p->d, kvi_cuda_err(r), EIO);
        pthread_mutex_unlock(&p->d->mu);
        return false;
    }
    return true;
}

static void gather(const disk_geo *l, uint32_t block, unsigned char *buf)
{
    for (uint32_t r = 0; r < l->n_regions; r++) {
        uint64_t bpb = l->regions[r].block_bytes;
        memcpy(buf, (const void *)(uintptr_t)(l->regions[r].base + block * bpb), bpb);
        buf += bpb;
    }
}

static void scatter(const disk_geo *l, uint32_t block, const unsigned char *buf)
{
    for (uint32_t r = 0; r < l->n_regions; r++) {
        uint64_t bpb = l->regions[r].block_bytes;
        memcpy((void *)(uintptr_t)(l->regions[r].base + block * bpb), buf, bpb);
        buf += bpb;
    }
}

static unsigned char *buf_at(disk_pipe *p, uint32_t k)
{
    return p->staging + (size_t)k * p->d->slot_bytes;
}

/* Waits for one completion and settles it. Returns false on a fatal ring error. */
static bool reap_one(disk_pipe *p, disk_job *j)
{
    kvt_disk *d = p->d;
    struct io_uring_cqe *cqe;
    int rc;
    do
        rc = io_uring_wait_cqe(&p->ring, &cqe);
    while (rc == -EINTR);
    if (rc < 0) {
        pthread_mutex_lock(&d->mu);
        set_fatal(d, "waiting for an I/O completion", -rc);
        pthread_mutex_unlock(&d->mu);
        return false;
    }
    uint32_t k = (uint32_t)(cqe->user_data & 0xffffffffu), i = (uint32_t)(cqe->user_data >> 32);
    int res = cqe->res;
    io_uring_cqe_seen(&p->ring, cqe);
    p->free_bufs[p->n_free++] = k;
    uint32_t slot = p->dir == KVT_COPY_STORE ? j->dst[i] : j->src[i];
    if (d->fault)
        res = d->fault(d->fault_ctx, p->dir, slot, res);
    if (res == KVT_DISK_FAULT_FATAL) {
        pthread_mutex_lock(&d->mu);
        set_fatal(d, "injected fatal error", EIO);
        pthread_mutex_unlock(&d->mu);
        return false;
    }
    if (res == (int)d->slot_bytes) {
        j->ok_bytes += d->slot_bytes;
        if (p->dir == KVT_COPY_LOAD && p->stream)
            return cuda_copy(p, j->dst[i], buf_at(p, k), false);
        if (p->dir == KVT_COPY_LOAD && !p->zero_copy)
            scatter(&d->geo, j->dst[i], buf_at(p, k));
        return true;
    }
    /* an I/O error or a short transfer fails this block only */
    KVT_LOG_W("disk %s: %s of slot %u: %s", d->path, p->dir == KVT_COPY_STORE ? "write" : "read",
              slot, res < 0 ? strerror(-res) : "short transfer");
    pthread_mutex_lock(&d->mu);
    j->failed = true;
    d->st.io_errors[p->dir]++;
    if (p->dir == KVT_COPY_LOAD && kvi_array_grow((void **)&d->invalid, &d->cap_invalid,
                                                  d->n_invalid + 1ull, sizeof(uint32_t)) == 0)
        d->invalid[d->n_invalid++] = j->dst[i];
    pthread_mutex_unlock(&d->mu);
    return true;
}

static bool queue_io(disk_pipe *p, disk_job *j, uint32_t i, uint32_t k)
{
    kvt_disk *d = p->d;
    struct io_uring_sqe *sqe = io_uring_get_sqe(&p->ring);
    if (!sqe) { /* cannot happen: the ring has queue_depth entries and one per buffer */
        pthread_mutex_lock(&d->mu);
        set_fatal(d, "submission queue full", EBUSY);
        pthread_mutex_unlock(&d->mu);
        return false;
    }
    bool store = p->dir == KVT_COPY_STORE;
    uint32_t slot = store ? j->dst[i] : j->src[i];
    uint64_t off = (uint64_t)slot * d->slot_bytes;
    int fd = p->fixed_file ? 0 : d->fd;
    unsigned char *b = buf_at(p, k);
    unsigned len = (unsigned)d->slot_bytes;
    if (p->zero_copy) {
        const disk_geo *l = &d->geo;
        uint32_t block = store ? j->src[i] : j->dst[i], cnt = l->n_regions;
        struct iovec *iov = p->iov + (size_t)k * (l->n_regions + 1);
        for (uint32_t r = 0; r < l->n_regions; r++)
            iov[r] = (struct iovec){
                (void *)(uintptr_t)(l->regions[r].base + block * l->regions[r].block_bytes),
                l->regions[r].block_bytes};
        if (d->slot_bytes > d->block_bytes)
            iov[cnt++] = (struct iovec){p->pad, d->slot_bytes - d->block_bytes};
        if (store)
            io_uring_prep_writev(sqe, fd, iov, cnt, off);
        else
            io_uring_prep_readv(sqe, fd, iov, cnt, off);
    } else if (store && p->fixed_bufs)
        io_uring_prep_write_fixed(sqe, fd, b, len, off, (int)k);
    else if (store)
        io_uring_prep_write(sqe, fd, b, len, off);
    else if (p->fixed_bufs)
        io_uring_prep_read_fixed(sqe, fd, b, len, off, (int)k);
    else
        io_uring_prep_read(sqe, fd, b, len, off);
    if (p->fixed_file)
        sqe->flags |= IOSQE_FIXED_FILE;
    sqe->user_data = (uint64_t)i << 32 | k;
    int rc;
    do
        rc = io_uring_submit(&p->ring);
    while (rc == -EINTR || rc == -EAGAIN);
    if (rc < 0) {
        pthread_mutex_lock(&d->mu);
        set_fatal(d, "submitting I/O", -rc);
        pthread_mutex_unlock(&d->mu);
        return false;
    }
    return true;
}

/* Runs one job; false if the ring failed (fatal). */
static bool run_job(disk_pipe *p, disk_job *j)
{
    kvt_disk *d = p->d;
    bool ok = true;
    /* CUDA: the engine's compute point (stores: KV written; loads: the blocks' readers done) */
    if (p->stream && j->wait) {
        kvi_CUresult r = kvi_cuda()->StreamWaitEvent(p->stream, (kvi_CUevent)j->wait, 0);
        if (r != KVT_CUDA_SUCCESS) {
            pthread_mutex_lock(&d->mu);
            set_fatal(d, kvi_cuda_err(r), EIO);
            pthread_mutex_unlock(&d->mu);
            return false;
        }
    }
    for (uint32_t i = 0; i < j->n && ok; i++) {
        while (p->n_free == 0 && ok)
            ok = reap_one(p, j);
        if (!ok)
            break;
        uint32_t k = p->free_bufs[--p->n_free];
        if (p->dir == KVT_COPY_STORE && p->stream)
            ok = cuda_copy(p, j->src[i], buf_at(p, k), true);
        else if (p->dir == KVT_COPY_STORE && !p->zero_copy)
            gather(&d->geo, j->src[i], buf_at(p, k));
        if (ok)
            ok = queue_io(p, j, i, k);
        if (!ok)
            p->n_free++;
    }
    while (ok && p->n_free < d->cfg.queue_depth)
        ok = reap_one(p, j);
    return ok;
}

/* After a fatal error: collects what the kernel still completes (1 s per I/O at most), so
 * that no staging buffer is freed while a read may still land in it; whatever does not come
 * back marks the pipeline's memory as leaked on purpose. */
static void drain_after_fatal(disk_pipe *p)
{
    while (p->n_free < p->d->cfg.queue_depth) {
        struct io_uring_cqe *cqe;
        struct __kernel_timespec ts = {.tv_sec = 1};
        if (io_uring_wait_cqe_timeout(&p->ring, &cqe, &ts) != 0)
            break;
        io_uring_cqe_seen(&p->ring, cqe);
        p->n_free++;
    }
    p->leak = p->n_free < p->d->cfg.queue_depth;
}

static void *pipe_thread(void *arg)
{
    disk_pipe *p = arg;
    kvt_disk *d = p->d;
    if (p->stream)
        kvi_cuda_use_device(d->geo.device, NULL);
    pthread_mutex_lock(&d->mu);
    for (;;) {
        while (!d->stop && !d->fatal && p->next == p->tail)
            pthread_cond_wait(&d->cv_work, &d->mu);
        if (d->fatal || (d->stop && p->next == p->tail))
            break;
        disk_job *j = &p->jobs[p->next % d->cfg.max_events];
        j->state = DJOB_RUNNING;
        pthread_mutex_unlock(&d->mu);
        bool ok = run_job(p, j);
        if (!ok)
            drain_after_fatal(p);
        pthread_mutex_lock(&d->mu);
        j->state = DJOB_DONE;
        d->st.events_done[p->dir]++;
        d->st.bytes[p->dir] += j->ok_bytes;
        if (!ok)
            j->failed = true;
        p->next++;
        pthread_cond_broadcast(&d->cv_done);
        if (!ok)
            break;
    }
    p->exited = true;
    pthread_cond_broadcast(&d->cv_done);
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

/* ---- setup and teardown ------------------------------------------------------------------ */

static int pipe_init(kvt_disk *d, int dir)
{
    disk_pipe *p = &d->pipe[dir];
    p->d = d;
    p->dir = dir;
    p->hwm = p->last_event = -1;
    uint32_t qd = d->cfg.queue_depth;
    p->jobs = calloc(d->cfg.max_events, sizeof(*p->jobs));
    p->free_bufs = calloc(qd, sizeof(uint32_t));
    size_t align = d->cfg.alignment, bytes = (size_t)qd * d->slot_bytes;
    p->staging_raw = calloc(1, bytes + align);
    if (!p->jobs || !p->free_bufs || !p->staging_raw)
        return kvt_fail(KVT_ENOMEM, "disk: out of memory for %zu bytes of staging", bytes);
    p->staging =
        (unsigned char *)(((uintptr_t)p->staging_raw + align - 1) & ~(uintptr_t)(align - 1));
    for (uint32_t k = 0; k < qd; k++)
        p->free_bufs[p->n_free++] = qd - 1 - k;
    /* Zero copy when every region's blocks can be the target of direct I/O as they are. */
    const disk_geo *l = &d->geo;
    p->zero_copy = l->n_regions < IOV_MAX && l->device < 0;
    if (l->device >= 0) { /* device memory: staged through pinned buffers on a copy stream */
        const kvi_cuda_api *cu = kvi_cuda();
        int least = 0, greatest = 0;
        int rc = kvi_cuda_use_device(l->device, NULL);
        if (rc)
            return rc;
        rc = kvi_cuda_host_register(p->staging, bytes);
        if (rc)
            return rc;
        p->staging_pinned = true;
        cu->CtxGetStreamPriorityRange(&least, &greatest);
        kvi_CUresult r =
            cu->StreamCreateWithPriority(&p->stream, KVT_CU_STREAM_NON_BLOCKING, least);
        if (r != KVT_CUDA_SUCCESS)
            return kvt_fail(KVT_EIO, "disk: cannot create a copy stream: %s", kvi_cuda_err(r));
    }
    for (uint32_t r = 0; r < l->n_regions && p->zero_copy && !d->cfg.page_cache; r++)
        p->zero_copy = l->regions[r].base % align == 0 && l->regions[r].block_bytes % align == 0;
    if (p->zero_copy) {
        p->iov = calloc((size_t)qd * (l->n_regions + 1), sizeof(*p->iov));
        p->pad_raw = calloc(1, d->slot_bytes - d->block_bytes + 2 * align);
        if (!p->iov || !p->pad_raw)
            return kvt_fail(KVT_ENOMEM, "disk: out of memory");
        p->pad = (unsigned char *)(((uintptr_t)p->pad_raw + align - 1) & ~(uintptr_t)(align - 1));
    }
    int rc = io_uring_queue_init(qd, &p->ring, 0);
    if (rc < 0)
        return kvi_fail_errno(-rc, "disk: io_uring_queue_init(%u)", qd);
    p->ring_ok = true;
    p->fixed_file = io_uring_register_files(&p->ring, &d->fd, 1) == 0;
    struct iovec *iov = calloc(qd, sizeof(*iov));
    if (iov) {
        for (uint32_t k = 0; k < qd; k++)
            iov[k] = (struct iovec){buf_at(p, k), d->slot_bytes};
        p->fixed_bufs = io_uring_register_buffers(&p->ring, iov, qd) == 0;
        free(iov);
    }
    if (!p->fixed_bufs)
        KVT_LOG_I("disk %s: staging buffers not registered (RLIMIT_MEMLOCK?); plain reads and "
                  "writes",
                  d->path);
    int e = pthread_create(&p->th, NULL, pipe_thread, p);
    if (e)
        return kvi_fail_errno(e, "disk: cannot start the %s thread",
                              dir == KVT_COPY_STORE ? "store" : "load");
    p->started = true;
    return 0;
}

/* Joins a pipeline thread for at most 10 s; false if it is still running. */
static bool join_pipe(disk_pipe *p)
{
    if (!p->started)
        return true;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 10;
    int e = pthread_timedjoin_np(p->th, NULL, &ts);
    if (e) {
        KVT_LOG_E("disk %s: the %s thread did not stop; keeping its file descriptor open",
                  p->d->path, p->dir == KVT_COPY_STORE ? "store" : "load");
        return false;
    }
    p->started = false;
    return true;
}

static void pipe_free(kvt_disk *d, disk_pipe *p)
{
    if (p->ring_ok)
        io_uring_queue_exit(&p->ring);
    if (p->stream)
        kvi_cuda()->StreamDestroy(p->stream);
    if (p->staging_pinned)
        kvi_cuda_host_unregister(p->staging);
    for (uint32_t i = 0; p->jobs && i < d->cfg.max_events; i++) {
        free(p->jobs[i].src);
        free(p->jobs[i].dst);
    }
    free(p->jobs);
    free(p->free_bufs);
    free(p->staging_raw);
    free(p->iov);
    free(p->pad_raw);
}

void kvt_disk_destroy(kvt_disk *d)
{
    if (!d)
        return;
    pthread_mutex_lock(&d->mu);
    d->stop = true;
    pthread_cond_broadcast(&d->cv_work);
    pthread_mutex_unlock(&d->mu);
    bool joined = true;
    for (int i = 0; i < 2; i++)
        joined &= join_pipe(&d->pipe[i]);
    if (d->path[0])
        unlink(d->path);
    if (!joined || d->pipe[0].leak || d->pipe[1].leak) {
        /* leak rather than let a late write hit a reused descriptor or freed memory */
        KVT_LOG_E("disk %s: I/O may still be in flight; its memory and descriptor are kept",
                  d->path);
        return;
    }
    for (int i = 0; i < 2; i++)
        pipe_free(d, &d->pipe[i]);
    if (d->fd >= 0)
        close(d->fd);
    free(d->failed[0]);
    free(d->failed[1]);
    free(d->invalid);
    pthread_mutex_destroy(&d->mu);
    pthread_cond_destroy(&d->cv_work);
    pthread_cond_destroy(&d->cv_done);
    free(d);
}

static int open_file(kvt_disk *d)
{
    int n = snprintf(d->path, sizeof(d->path), "%s.rank%u", d->cfg.path, d->cfg.rank);
    if (n < 0 || (size_t)n >= sizeof(d->path))
        return kvt_fail(KVT_EINVAL, "disk: path too long");
    if (unlink(d->path) != 0 && errno != ENOENT)
        return kvi_fail_errno(errno, "disk: cannot remove the stale file %s", d->path);
    int flags = O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
    if (!d->cfg.page_cache)
        flags |= O_DIRECT;
    d->fd = open(d->path, flags, 0600);
    if (d->fd < 0 && errno == EINVAL && !d->cfg.page_cache)
        return kvt_fail(KVT_ESYS,
                        "disk: %s: the file system does not support O_DIRECT (set "
                        "page_cache to use buffered I/O)",
                        d->path);
    if (d->fd < 0)
        return kvi_fail_errno(errno, "disk: cannot create %s", d->path);
    if (ftruncate(d->fd, (off_t)(d->slot_bytes * d->n_slots)) != 0) {
        int e = errno;
        close(d->fd);
        d->fd = -1;
        unlink(d->path);
        return kvi_fail_errno(e, "disk: cannot size %s to %llu bytes", d->path,
                              (unsigned long long)(d->slot_bytes * d->n_slots));
    }
    return 0;
}

int kvt_disk_create(const kvt_disk_config *cfg, const kvt_layout *layout, kvt_disk **out)
{
    *out = NULL;
    if (kvi_config_check(&disk_config_table, cfg))
        return KVT_EINVAL;
    if (!cfg->path || !cfg->path[0])
        return kvt_fail(KVT_EINVAL, "disk: path is required");
    if (kvt_layout_device(layout) >= 0 && !kvt_cuda_available())
        return kvt_fail(KVT_EUNSUPPORTED,
                        "disk: a layout on CUDA device %d needs a CUDA "
                        "driver: %s",
                        kvt_layout_device(layout), kvt_cuda_unavailable_reason());
    if (kvt_layout_num_regions(layout) == 0)
        return kvt_fail(KVT_EINVAL, "disk: the layout has no regions");
    uint32_t a = cfg->alignment;
    if (a & (a - 1)) /* the row bounds it to 512..2^30 */
        return kvt_fail(KVT_EINVAL, "disk: alignment %u is not a power of two", a);
    uint64_t bpb = kvt_layout_block_bytes(layout);
    uint64_t slot = cfg->page_cache ? bpb : (bpb + a - 1) / a * a;
    if (slot > INT32_MAX)
        return kvt_fail(KVT_ELIMIT, "disk: blocks of %llu bytes exceed one I/O",
                        (unsigned long long)bpb);
    if (cfg->capacity_bytes < slot)
        return kvt_fail(KVT_EINVAL,
                        "disk: capacity of %llu bytes is smaller than one disk slot "
                        "(%llu bytes)",
                        (unsigned long long)cfg->capacity_bytes, (unsigned long long)slot);
    uint64_t n = cfg->capacity_bytes / slot;
    kvt_disk *d = calloc(1, sizeof(*d));
    if (!d)
        return kvt_fail(KVT_ENOMEM, "disk: out of memory");
    d->cfg = *cfg;
    d->cfg.path = NULL; /* not kept: the caller's string may go away */
    d->layout = layout;
    d->geo = (disk_geo){kvt_layout_device(layout), kvt_layout_num_blocks(layout),
                        kvt_layout_num_regions(layout), kvt_layout_regions(layout)};
    d->fd = -1;
    d->block_bytes = bpb;
    d->slot_bytes = slot;
    d->n_slots = n > UINT32_MAX - 1 ? UINT32_MAX - 1 : (uint32_t)n;
    kvi_disk_port_init(&d->port, layout, d->n_slots);
    d->cfg.path = cfg->path;
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->cv_work, NULL);
    pthread_cond_init(&d->cv_done, NULL);
    int rc = open_file(d);
    d->cfg.path = NULL;
    for (int i = 0; i < 2 && !rc; i++)
        rc = pipe_init(d, i);
    if (rc) {
        int err = rc;
        char msg[512];
        snprintf(msg, sizeof(msg), "%s", kvt_last_error());
        kvt_disk_destroy(d);
        return kvt_fail(err, "%s", msg);
    }
    *out = d;
    return 0;
}

KVI_GETTER(uint32_t, kvt_disk_num_slots, kvt_disk, n_slots)
KVI_GETTER(uint64_t, kvt_disk_slot_bytes, kvt_disk, slot_bytes)
KVI_GETTER(const char *, kvt_disk_path, kvt_disk, path)

/* ---- events -------------------------------------------------------------------------------- */

static int check_ids(const char *what, const uint32_t *ids, uint32_t n, uint32_t limit,
                     int64_t event)
{
    for (uint32_t i = 0; i < n; i++)
        if (ids[i] >= limit)
            return kvt_fail(KVT_ERANGE, "disk: event %lld: %s %u out of range (%u)",
                            (long long)event, what, ids[i], limit);
    return 0;
}

int kvt_disk_submit(kvt_disk *d, int dir, int64_t event, const uint32_t *src, const uint32_t *dst,
                    uint32_t n, void *wait)
{
    if (dir != KVT_COPY_STORE && dir != KVT_COPY_LOAD)
        return kvt_fail(KVT_EINVAL, "disk: direction %d invalid", dir);
    if (n == 0 || !src || !dst)
        return kvt_fail(KVT_EINVAL, "disk: event %lld has no blocks", (long long)event);
    disk_pipe *p = &d->pipe[dir];
    if (event <= p->last_event)
        return kvt_fail(KVT_EINVAL, "disk: event %lld not above the previous one (%lld)",
                        (long long)event, (long long)p->last_event);
    bool store = dir == KVT_COPY_STORE;
    uint32_t dev = d->geo.num_blocks;
    int rc = check_ids(store ? "device block" : "slot", src, n, store ? dev : d->n_slots, event);
    if (!rc)
        rc = check_ids(store ? "slot" : "device block", dst, n, store ? d->n_slots : dev, event);
    if (rc)
        return rc;
    pthread_mutex_lock(&d->mu);
    int fatal = d->fatal;
    bool full = p->tail - p->head >= d->cfg.max_events;
    pthread_mutex_unlock(&d->mu);
    if (fatal)
        return kvt_fail(KVT_EIO, "%s", d->fatal_msg);
    if (full)
        return kvt_fail(KVT_EBUSY, "disk: %u events outstanding (max_events)", d->cfg.max_events);
    disk_job *j = &p->jobs[p->tail % d->cfg.max_events]; /* FREE: ours until queued */
    uint32_t c1 = j->cap, c2 = j->cap;
    rc = kvi_array_grow((void **)&j->src, &c1, n, sizeof(uint32_t));
    if (!rc)
        rc = kvi_array_grow((void **)&j->dst, &c2, n, sizeof(uint32_t));
    j->cap = c1 < c2 ? c1 : c2;
    if (rc)
        return kvi_fail_wrap(rc, "disk");
    memcpy(j->src, src, n * sizeof(uint32_t));
    memcpy(j->dst, dst, n * sizeof(uint32_t));
    j->n = n;
    j->event = event;
    j->failed = false;
    j->ok_bytes = 0;
    j->wait = wait;
    p->last_event = event;
    pthread_mutex_lock(&d->mu);
    d->st.events[dir]++;
    d->st.blocks[dir] += n;
    j->state = DJOB_QUEUED;
    p->tail++;
    pthread_cond_broadcast(&d->cv_work);
    pthread_mutex_unlock(&d->mu);
    return 0;
}

int kvt_disk_poll(kvt_disk *d, int dir, int64_t *hwm)
{
    if (dir != KVT_COPY_STORE && dir != KVT_COPY_LOAD)
        return kvt_fail(KVT_EINVAL, "disk: direction %d invalid", dir);
    disk_pipe *p = &d->pipe[dir];
    pthread_mutex_lock(&d->mu);
    while (p->head != p->next) {
        disk_job *j = &p->jobs[p->head % d->cfg.max_events];
        if (j->state != DJOB_DONE)
            break;
        if (j->failed) {
            if (kvi_array_grow((void **)&d->failed[dir], &d->cap_failed[dir],
                               d->n_failed[dir] + 1ull, sizeof(int64_t)) != 0) {
                /* a failed event must never be reported as fine */
                set_fatal(d, "recording a failed event (out of memory)", ENOMEM);
                break;
            }
            d->failed[dir][d->n_failed[dir]++] = j->event;
        }
        p->hwm = j->event;
        j->state = DJOB_FREE;
        p->head++;
    }
    *hwm = p->hwm;
    int fatal = d->fatal;
    pthread_mutex_unlock(&d->mu);
    if (fatal)
        return kvt_fail(KVT_EIO, "%s", d->fatal_msg);
    return 0;
}

static uint32_t take_failed(kvt_disk *d, int dir, int64_t *out, uint32_t cap)
{
    pthread_mutex_lock(&d->mu);
    uint32_t n = d->n_failed[dir] < cap ? d->n_failed[dir] : cap;
    if (n) {
        memcpy(out, d->failed[dir], n * sizeof(*out));
        memmove(d->failed[dir], d->failed[dir] + n, (d->n_failed[dir] - n) * sizeof(*out));
        d->n_failed[dir] -= n;
    }
    pthread_mutex_unlock(&d->mu);
    return n;
}

uint32_t kvt_disk_take_failed(kvt_disk *d, int64_t *out, uint32_t cap)
{
    return take_failed(d, KVT_COPY_STORE, out, cap);
}

uint32_t kvt_disk_take_failed_loads(kvt_disk *d, int64_t *out, uint32_t cap)
{
    return take_failed(d, KVT_COPY_LOAD, out, cap);
}

uint32_t kvt_disk_take_invalid_blocks(kvt_disk *d, uint32_t *out, uint32_t cap)
{
    pthread_mutex_lock(&d->mu);
    uint32_t n = d->n_invalid < cap ? d->n_invalid : cap;
    if (n) {
        memcpy(out, d->invalid, n * sizeof(*out));
        memmove(d->invalid, d->invalid + n, (d->n_invalid - n) * sizeof(*out));
        d->n_invalid -= n;
    }
    pthread_mutex_unlock(&d->mu);
    return n;
}

int kvt_disk_flush(kvt_disk *d)
{
    pthread_mutex_lock(&d->mu);
    while (!d->fatal && (d->pipe[0].next != d->pipe[0].tail || d->pipe[1].next != d->pipe[1].tail))
        pthread_cond_wait(&d->cv_done, &d->mu);
    int fatal = d->fatal;
    pthread_mutex_unlock(&d->mu);
    if (fatal)
        return kvt_fail(KVT_EIO, "%s", d->fatal_msg);
    return 0;
}

void kvt_disk_get_stats(const kvt_disk *d, kvt_disk_stats *s)
{
    if (!kvi_stats_begin(d, s, sizeof(*s)))
        return;
    kvt_disk *m = (kvt_disk *)d;
    pthread_mutex_lock(&m->mu);
    *s = d->st;
    s->fatal = d->fatal != 0;
    pthread_mutex_unlock(&m->mu);
}

int kvt_disk_prometheus(const kvt_disk *d, char *buf, size_t cap, size_t *len)
{
    if (!len || (cap && !buf))
        return kvt_fail(KVT_EINVAL, "disk: prometheus: NULL argument");
    kvt_disk_stats s;
    kvt_disk_get_stats(d, &s);
    kvi_prom p = {buf, cap, 0};
    static const char *const dir_name[2] = {"write", "read"};
    const struct {
        const char *name, *help;
        const uint64_t *v;
    } counters[] = {
        {"events_total", "Disk events submitted.", s.events},
        {"events_done_total", "Disk events finished.", s.events_done},
        {"blocks_total", "Blocks submitted.", s.blocks},
        {"bytes_total", "Slot bytes moved successfully.", s.bytes},
        {"io_errors_total", "Blocks whose I/O failed or was short.", s.io_errors},
    };
    for (size_t i = 0; i < sizeof(counters) / sizeof(counters[0]); i++)
        kvi_prom_pair(&p, "kvtier_disk", counters[i].name, counters[i].help, false, dir_name,
                      counters[i].v);
    kvi_prom_metric(&p, "kvtier_disk", "fatal", "1 once a fatal error stopped the tier.", true,
                    s.fatal);
    return kvi_prom_finish(&p, len, "disk");
}

uint32_t kvt_disk_outstanding(const kvt_disk *d, int dir)
{
    if (dir != KVT_COPY_STORE && dir != KVT_COPY_LOAD)
        return 0;
    kvt_disk *m = (kvt_disk *)d;
    pthread_mutex_lock(&m->mu);
    uint32_t n = d->pipe[dir].tail - d->pipe[dir].head;
    pthread_mutex_unlock(&m->mu);
    return n;
}
