/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Internals of the copy layer: descriptor building (pure functions, tested directly), the
 * engine's job queue shared by both backends, and the backend interface.
 *
 * Engine structure. Each direction has a ring of job slots (max_events): a slot is taken at
 * submit and given back when poll reports its event, so slots are reported in submission
 * order per direction. A third ring, the submission queue, holds every queued job of both
 * directions in submission order; the backend's threads take work from its head. Everything
 * shared with those threads is guarded by one mutex: a job's state, the queue positions and
 * the chunk counters. Per-chunk locking costs one uncontended lock per chunk_bytes (1 MiB by
 * default), noise next to copying a megabyte.
 *
 * Job states: QUEUED (in the submission queue) -> ISSUED (CUDA: handed to the stream,
 * completion pending on its CUevent) -> DONE or FAILED. The CPU backend goes straight from
 * QUEUED to DONE when its last chunk is copied.
 */
#ifndef KVT_COPY_INTERNAL_H
#define KVT_COPY_INTERNAL_H

#include <pthread.h>

#include "base/prom.h"
#include "base/ring.h"
#include "kvtier/copy.h"

struct kvt_layout {
    int32_t device;
    uint32_t num_blocks;
    uint32_t n_regions, cap_regions;
    kvt_region *regions;
    /* storages registered so far (dedup of shared storage) and the block size each derived */
    uint32_t n_storages, cap_storages;
    kvt_region *storages; /* base = storage address, block_bytes = derived block size */
};

struct kvt_mirror {
    uint32_t num_blocks;
    uint32_t n_regions;
    kvt_region *regions;
    kvt_arena *arena;
    bool pinned;
    uint32_t n_pins;
    void **pins; /* bases registered with CUDA, unregistered at destroy */
};

/* Whether the mirror is a node tier's data object that a sharer shrank under us (base/guard.h):
 * its pages read as zeros since, so no load from it may be trusted. */
bool kvi_mirror_poisoned(const kvt_mirror *m);

/* A copy of size bytes; addresses are device pointers or host pointers as integers. */
typedef struct kvi_desc {
    uint64_t dst, src, size;
} kvi_desc;

/* A run of consecutive ids: src_start.., dst_start.. for len blocks. */
typedef struct kvi_run {
    uint32_t src, dst, len;
} kvi_run;

/* Splits pairs into runs, merging pair i into the previous run only when both its src and its
 * dst are exactly one more than the previous pair's (spec §3.2). Returns the number of runs
 * (runs must have room for n). */
uint32_t kvi_copy_coalesce(const uint32_t *src, const uint32_t *dst, uint32_t n, kvi_run *runs);

/* Region-major descriptors for runs: for every region, every run. out must have room for
 * n_regions * n_runs entries. */
void kvi_copy_build_descs(const kvt_region *src_regions, const kvt_region *dst_regions,
                          uint32_t n_regions, const kvi_run *runs, uint32_t n_runs, kvi_desc *out);

/* Number of batch calls n descriptors take with at most cap per call (0 = uncapped). */
static inline uint32_t kvi_copy_batches(uint32_t n, uint32_t cap)
{
    if (n == 0)
        return 0;
    return cap == 0 ? 1 : (n + cap - 1) / cap;
}

enum copy_job_state { JOB_FREE = 0, JOB_QUEUED, JOB_ISSUED, JOB_DONE, JOB_FAILED };

typedef struct copy_job {
    int dir;
    int state;
    int64_t event;
    uint64_t submit_ns; /* when it was submitted: its latency lands in the histogram */
    void *wait;         /* CUDA: CUevent to wait for before the copies */
    void *be_event;     /* CUDA: CUevent recorded after the copies */
    void *be_frags;     /* CUDA: pinned fragment table of the gather/scatter kernel */
    uint32_t be_frags_cap;
    kvi_desc *descs;
    uint32_t n_descs, cap_descs;
    kvi_run *runs;
    uint32_t cap_runs;
    /* CPU work split: chunk k starts at descriptor chunk_desc[k], byte chunk_off[k] */
    uint32_t n_chunks, next_chunk, chunks_done, cap_chunks;
    uint32_t *chunk_desc;
    uint64_t *chunk_off;
    uint64_t bytes;
} copy_job;

typedef struct copy_ring {
    copy_job *slots;     /* max_events */
    uint32_t head, tail; /* slots head..tail (mod cap) are outstanding */
    int64_t hwm;
    int64_t last_event; /* last submitted event, for the ascending check */
    int64_t *failed;    /* failed events not yet taken */
    uint32_t n_failed;
} copy_ring;

struct kvt_copy;

typedef struct copy_backend_ops {
    const char *name;
    int (*start)(struct kvt_copy *c); /* threads, streams */
    void (*stop)(struct kvt_copy *c);
    /* Under c->mu: is an ISSUED job complete? Sets FAILED/DONE. Returns true if finished. */
    bool (*query)(struct kvt_copy *c, copy_job *j);
    /* Without the lock: blocks until an ISSUED job finishes (flush); false if it failed. */
    bool (*sync)(struct kvt_copy *c, copy_job *j);
    /* Per-slot resources (after start; stop frees them). May be NULL. */
    int (*job_init)(struct kvt_copy *c, copy_job *j);
} copy_backend_ops;

struct kvt_copy {
    kvt_copy_config cfg;
    const kvt_layout *layout;
    const kvt_mirror *mirror;
    const copy_backend_ops *ops;
    int kind;
    pthread_mutex_t mu;
    pthread_cond_t cv_work; /* queue gained work, or stop */
    pthread_cond_t cv_done; /* a job finished or was issued */
    copy_ring ring[2];
    kvi_ring queue; /* submission queue of copy_job *, 2 * max_events */
    bool stop;
    uint32_t active[2];            /* CPU: jobs started and not done, per direction (0 or 1) */
    kvt_copy_stats st;             /* counters (under mu) */
    kvi_hist lat[2];               /* submit-to-reported latency per direction (under mu) */
    uint64_t block_bytes;          /* the layout's bytes per block, for the byte counter */
    uint32_t kernel_blocks_per_sm; /* CUDA gather/scatter kernel: grid per multiprocessor */
    uint32_t n_threads;
    pthread_t *threads;
    const struct copy_kernel *kern[2]; /* CPU: kernels for small and large runs (kernels.h) */
    void *be;                          /* backend state */
};

/* Backend tables. kvi_copy_cuda_ops returns NULL (with the reason in *why) when no usable
 * driver is present. */
extern const copy_backend_ops kvi_copy_cpu_ops;
const copy_backend_ops *kvi_copy_cuda_ops(const char **why);
/* CUDA backend: "cuda_gather" if a job of run_bytes fragments goes to the gather/scatter
 * kernel, else "dma"; *why (if why) says why the kernel is not loaded ("" if it is). */
const char *kvi_copy_cuda_kernel(const kvt_copy *c, uint64_t run_bytes, const char **why);

/* Copies n bytes with non-temporal stores where the CPU has them (else memcpy). */
void kvi_copy_bytes_nt(void *dst, const void *src, size_t n);

/* Engine helpers for backends (caller holds c->mu). */
copy_job *kvi_copy_queue_front(struct kvt_copy *c);
/* Waits on cv_work for a queued job; NULL once the engine stops with the queue empty. */
copy_job *kvi_copy_wait_front(struct kvt_copy *c);
void kvi_copy_queue_pop(struct kvt_copy *c);
void kvi_copy_job_finish(struct kvt_copy *c, copy_job *j, bool ok);

#endif
