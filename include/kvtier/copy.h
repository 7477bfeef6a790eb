/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvtier copy: the engine that moves KV bytes between a device layout and a host mirror
 * (kvtier/layout.h has the vocabulary: tensors, regions, layouts, mirrors, directions).
 *
 *   kvt_copy     the copy engine: per-direction FIFO events (a store event copies device
 *                blocks to host blocks, a load event host to device), region-major
 *                descriptors with strictly ascending runs coalesced, a CPU backend (a pool
 *                of copy threads all working on the event at the head) and a CUDA backend
 *                (libcuda opened at run time; cuMemcpyBatchAsync on two lowest-priority
 *                streams). Completions are reported in submission order as a high-water mark.
 *
 * Thread rules: a kvt_copy is driven by one thread (submit, poll, flush, destroy); its copy
 * threads are internal. Calls never block except kvt_copy_flush, kvt_copy_wait and
 * kvt_copy_destroy.
 */
#ifndef KVTIER_COPY_H
#define KVTIER_COPY_H

#include "kvtier/base.h"
#include "kvtier/layout.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- copy engine ------------------------------------------------------------------------- */

enum kvt_copy_backend {
    KVT_BACKEND_AUTO = 0, /* CUDA for a layout on a CUDA device, else CPU */
    KVT_BACKEND_CPU = 1,  /* copy threads (device memory is host memory) */
    KVT_BACKEND_CUDA = 2  /* DMA through libcuda, loaded at run time */
};

typedef struct kvt_copy_config {
    int backend;               /* kvt_copy_backend; default AUTO */
    uint32_t threads;          /* CPU: copy threads; default 0 = the number of online cores */
    uint32_t max_descriptors;  /* descriptors per batch call; 0 = the backend's default: 512
                                  for CUDA (on an H200, uncapped batches of 4096 16 KiB
                                  descriptors cut both directions together from 27 to
                                  9 GB/s); the CPU backend makes no batch calls.
                                  KVTIER_MAX_BATCH_DESCRIPTORS > 0
                                  overrides */
    uint32_t max_events;       /* events queued or in flight per direction; default 1024 */
    uint64_t nt_min_bytes;     /* CPU: runs of at least this many bytes use the kernel
                                  calibrated for this machine (kvt_copy_kernel_name), shorter
                                  ones memcpy; default 4 KiB; UINT64_MAX: memcpy for all */
    uint64_t chunk_bytes;      /* CPU: unit of work a copy thread takes; default 1 MiB */
    bool force_fallback;       /* CUDA: use one cuMemcpyAsync per descriptor even when the
                                  driver has cuMemcpyBatchAsync (testing, old drivers) */
    bool prefer_overlap;       /* CUDA: CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE on batched
                                  copies (the driver tries to overlap them with kernels) */
    uint64_t kernel_max_bytes; /* CUDA: a job whose descriptors average at most this many
                                  bytes is copied by kvtier's gather/scatter kernel, all its
                                  fragments in one launch, instead of by DMA (when the kernel
                                  loaded and passed its self-test at create; see
                                  kvt_copy_kernel_name); default 128 KiB; 0: always DMA;
                                  KVTIER_CUDA_KERNEL_MAX_BYTES overrides */
    /* room for fields to come, so the struct keeps its size: zero (as *_config_init
     * leaves it); a create refuses a config whose room is not zero */
    uint64_t reserved[8];
} kvt_copy_config;

typedef struct kvt_copy kvt_copy;

/* Descriptors per cuMemcpyBatchAsync call unless configured (max_descriptors 0). Measured on
 * an H200 (driver 580, CUDA 13): with 16 KiB descriptors, stores and loads running together
 * moved 9.7 GB/s in batches of 4096, 13.4 in batches of 2048, 27.5 in batches of 256 or 512;
 * one direction alone and 2 MiB blocks did not care. */
#define KVT_CUDA_BATCH_DEFAULT 512u

KVT_API void kvt_copy_config_init(kvt_copy_config *cfg);
/* Creates the engine for device layout and host mirror (both borrowed; they must have the
 * same regions' block sizes and outlive the engine). KVT_EUNSUPPORTED with a message naming
 * the requirement when the CUDA backend is asked for and no usable driver is present. */
KVT_API int kvt_copy_create(const kvt_copy_config *cfg, const kvt_layout *layout,
                            const kvt_mirror *mirror, kvt_copy **out);
/* Flushes, then stops the threads and frees everything. */
KVT_API void kvt_copy_destroy(kvt_copy *c);
/* The backend actually in use (KVT_BACKEND_CPU or KVT_BACKEND_CUDA). */
KVT_API int kvt_copy_backend_kind(const kvt_copy *c);
/* True if the CUDA batch primitive is in use (false: per-descriptor fallback or CPU). */
KVT_API bool kvt_copy_batched(const kvt_copy *c);

/* Queues one event: src[i] -> dst[i] for i < n (device -> host ids for stores, host ->
 * device for loads). event must exceed every event submitted before in that direction.
 * wait (CUDA: a CUevent, may be NULL) is a device-side dependency the copy waits for; the
 * CPU backend ignores it. Every id is checked against the layout and the mirror before
 * anything is queued: KVT_ERANGE names the first bad one. KVT_EBUSY when max_events are
 * outstanding in this direction. Does not block: the copy threads issue the work.
 * Events of one direction run one after the other, in submission order; the two directions are not
 * ordered with each other (as vLLM's two streams), so the caller never lets an in-flight store and
 * load touch the same block (the offload manager's references guarantee it). */
KVT_API int kvt_copy_submit(kvt_copy *c, int dir, int64_t event, const uint32_t *src,
                            const uint32_t *dst, uint32_t n, void *wait);
/* Non-blocking completion check: advances the direction's high-water mark over the prefix of
 * finished events (never looking past the first unfinished one) and returns it in *hwm
 * (-1 before any completion). KVT_EIO if an event of this direction failed; the failed
 * event is reported by kvt_copy_take_failed. */
KVT_API int kvt_copy_poll(kvt_copy *c, int dir, int64_t *hwm);
/* Failed events of a direction (complete but not copied, e.g. the driver rejected a batch),
 * oldest first; up to cap ids into out, returns how many. Each is reported once. */
KVT_API uint32_t kvt_copy_take_failed(kvt_copy *c, int dir, int64_t *out, uint32_t cap);
/* Blocks until every event submitted so far, in both directions, has finished: first until
 * the submission queue is drained, then until everything issued completed. */
KVT_API int kvt_copy_flush(kvt_copy *c);
/* Events submitted and not yet reported by poll, in a direction. */
KVT_API uint32_t kvt_copy_outstanding(const kvt_copy *c, int dir);

/* Counters per direction (index KVT_COPY_STORE / KVT_COPY_LOAD). */
typedef struct kvt_copy_stats {
    uint64_t events[2];        /* submitted */
    uint64_t events_done[2];   /* reported by poll (failed ones included) */
    uint64_t events_failed[2]; /* the backend could not complete them */
    uint64_t blocks[2];        /* block pairs submitted */
    uint64_t bytes[2];         /* bytes submitted */
    uint64_t descriptors[2];   /* copies after coalescing, region-major */
    uint32_t outstanding[2];   /* events submitted and not yet reported */
    uint64_t kernel_events[2]; /* CUDA: of the events, those the gather/scatter kernel copied */
    uint64_t reserved[6];      /* room for figures to come (zero) */
} kvt_copy_stats;

KVT_API void kvt_copy_get_stats(const kvt_copy *c, kvt_copy_stats *s);
/* The CPU kernel this engine copies runs of run_bytes with: "memcpy" below nt_min_bytes, else
 * the fastest on this machine for its size class (runs under 256 KiB, or longer), measured
 * once per process at its first CPU kvt_copy_create (0.15-0.3 s; KVTIER_COPY_KERNEL names
 * them instead: "avx512nt" for both, or "small:movsb,large:avx2nt"). Kernels: memcpy, movsb,
 * sse2nt, avx2nt, avx2nt_pf, avx2nt4, avx2nt4_pf, avx512nt, avx512nt_pf, avx512nt4,
 * avx512nt4_pf (those the CPU runs; _pf: prefetching the next run, 4: four pages at a time,
 * see docs/worker.md). CUDA backend: "cuda_gather" where runs that size go to the
 * gather/scatter kernel (kernel_max_bytes), "dma" where they go to the copy engines. */
KVT_API const char *kvt_copy_kernel_name(const kvt_copy *c, uint64_t run_bytes);
/* The stats in Prometheus text (kvtier_copy_* families, label direction="store"|"load");
 * *len receives the length, KVT_ENOSPC (and the length needed) if cap is too small. */
KVT_API int kvt_copy_prometheus(const kvt_copy *c, char *buf, size_t cap, size_t *len);

/* Why the CUDA gather/scatter kernel is not used by this engine ("" when it is, or for the
 * CPU backend): the PTX failed to load or its self-test failed. */
KVT_API const char *kvt_copy_kernel_unavailable(const kvt_copy *c);

#ifdef __cplusplus
}
#endif

#endif /* KVTIER_COPY_H */
