/* SPDX-License-Identifier: Apache-2.0 */
/*
 * CUDA copy backend (the driver is loaded by base/cuda.c). A driver without
 * cuMemcpyBatchAsync (before CUDA 12.8) leaves the backend on one cuMemcpyAsync per
 * descriptor, with a warning naming the requirement.
 *
 * One issue thread per engine takes jobs from the submission queue in order and issues them
 * on the direction's stream: both streams are created at the lowest priority so KV traffic
 * yields to compute. A job first makes its stream wait on the job's wait event (the compute
 * point the engine recorded: stores must not read KV the forward is still writing, vLLM
 * #45704; loads must not overwrite blocks an earlier step's attention still reads, vLLM
 * #47282), then issues its descriptors in batches of max_descriptors, then records its
 * completion event. Store sources are read in stream order (they are device memory other
 * work may touch); load sources are pinned host memory nothing else writes (ANY).
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/log.h"
#include "copy/copy_internal.h"
#include "base/cuda.h"
#include "copy/cuda_frag_internal.h"

/* ---- backend ------------------------------------------------------------------------------ */

typedef struct cuda_be {
    const kvi_cuda_api *cu;
    kvi_CUcontext ctx;
    kvi_CUstream stream[2];
    kvi_CUmemcpyAttributes attrs[2];
    bool batched;
    kvi_frag_kernel frag; /* the gather/scatter kernel, when frag.ok */
    uint64_t frag_max;    /* jobs whose descriptors average at most this use it */
    /* issue thread scratch: descriptors as the batch call wants them */
    kvi_CUdeviceptr *dsts, *srcs;
    size_t *sizes;
    size_t cap;
} cuda_be;

static bool grow_scratch(cuda_be *b, size_t n)
{
    if (n <= b->cap)
        return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < n)
        cap *= 2;
    kvi_CUdeviceptr *d = realloc(b->dsts, cap * sizeof(*d));
    if (d)
        b->dsts = d;
    kvi_CUdeviceptr *s = realloc(b->srcs, cap * sizeof(*s));
    if (s)
        b->srcs = s;
    size_t *z = realloc(b->sizes, cap * sizeof(*z));
    if (z)
        b->sizes = z;
    if (!d || !s || !z)
        return false;
    b->cap = cap;
    return true;
}

/* The job's fragments in one launch of the gather/scatter kernel, from the slot's pinned
 * table: the slot is reused only after this job's completion event, so the kernel has read
 * the table by then. */
static bool issue_kernel(kvt_copy *c, cuda_be *b, copy_job *j, kvi_CUstream s, const char *what)
{
    const kvi_cuda_api *cu = b->cu;
    kvi_CUresult r;
    if (j->be_frags_cap < j->n_descs) {
        if (j->be_frags)
            cu->MemFreeHost(j->be_frags);
        j->be_frags = NULL;
        j->be_frags_cap = 0;
        r = cu->MemAllocHost(&j->be_frags, (size_t)j->n_descs * sizeof(kvi_frag));
        if (r != KVT_CUDA_SUCCESS) {
            j->be_frags = NULL;
            KVT_LOG_E("copy: %s event %lld: cuMemAllocHost of %u fragments: %s", what,
                      (long long)j->event, j->n_descs, kvi_cuda_err(r));
            return false;
        }
        j->be_frags_cap = j->n_descs;
    }
    kvi_frag *f = j->be_frags;
    for (uint32_t i = 0; i < j->n_descs; i++)
        f[i] = (kvi_frag){j->descs[i].dst, j->descs[i].src, j->descs[i].size};
    r = kvi_frag_launch(cu, &b->frag, f, j->n_descs, s);
    if (r != KVT_CUDA_SUCCESS) {
        KVT_LOG_E("copy: %s event %lld: launch of the copy kernel (%u fragments): %s", what,
                  (long long)j->event, j->n_descs, kvi_cuda_err(r));
        return false;
    }
    pthread_mutex_lock(&c->mu);
    c->st.kernel_events[j->dir]++;
    pthread_mutex_unlock(&c->mu);
    return true;
}

/* The job's descriptors to the copy engines: batches of at most max_descriptors through
 * cuMemcpyBatchAsync, or one cuMemcpyAsync each where the driver lacks it. */
static bool issue_dma(kvt_copy *c, cuda_be *b, copy_job *j, kvi_CUstream s, const char *what)
{
    const kvi_cuda_api *cu = b->cu;
    kvi_CUresult r;
    if (!b->batched) {
        for (uint32_t i = 0; i < j->n_descs; i++) {
            r = cu->MemcpyAsync(j->descs[i].dst, j->descs[i].src, j->descs[i].size, s);
            if (r != KVT_CUDA_SUCCESS) {
                KVT_LOG_E("copy: %s event %lld: cuMemcpyAsync of descriptor %u: %s", what,
                          (long long)j->event, i, kvi_cuda_err(r));
                return false;
            }
        }
        return true;
    }
    if (!grow_scratch(b, j->n_descs)) {
        KVT_LOG_E("copy: %s event %lld: out of memory", what, (long long)j->event);
        return false;
    }
    for (uint32_t i = 0; i < j->n_descs; i++) {
        b->dsts[i] = j->descs[i].dst;
        b->srcs[i] = j->descs[i].src;
        b->sizes[i] = j->descs[i].size;
    }
    uint32_t cap = c->cfg.max_descriptors ? c->cfg.max_descriptors : KVT_CUDA_BATCH_DEFAULT;
    for (uint32_t at = 0; at < j->n_descs; at += cap) {
        size_t n = j->n_descs - at < cap ? j->n_descs - at : cap, attr_idx = 0, fail = 0;
        r = cu->MemcpyBatchAsync(b->dsts + at, b->srcs + at, b->sizes + at, n, &b->attrs[j->dir],
                                 &attr_idx, 1, &fail, s);
        if (r != KVT_CUDA_SUCCESS) {
            KVT_LOG_E("copy: %s event %lld: cuMemcpyBatchAsync failed at descriptor %zu: %s", what,
                      (long long)j->event, at + fail, kvi_cuda_err(r));
            return false;
        }
    }
    return true;
}

/* Issues one job on its stream: its wait event, its copies (the kernel or DMA), its
 * completion event. Returns false (with the reason logged) on failure. */
static bool issue(kvt_copy *c, cuda_be *b, copy_job *j)
{
    const kvi_cuda_api *cu = b->cu;
    kvi_CUstream s = b->stream[j->dir];
    const char *what = j->dir == KVT_COPY_STORE ? "store" : "load";
    kvi_CUresult r = KVT_CUDA_SUCCESS;
    if (j->wait)
        r = cu->StreamWaitEvent(s, (kvi_CUevent)j->wait, 0);
    if (r != KVT_CUDA_SUCCESS) {
        KVT_LOG_E("copy: %s event %lld: cuStreamWaitEvent: %s", what, (long long)j->event,
                  kvi_cuda_err(r));
        return false;
    }
    bool ok = b->frag.ok && kvi_frag_use(j->bytes, j->n_descs, b->frag_max)
                  ? issue_kernel(c, b, j, s, what)
                  : issue_dma(c, b, j, s, what);
    if (!ok)
        return false;
    r = cu->EventRecord((kvi_CUevent)j->be_event, s);
    if (r != KVT_CUDA_SUCCESS) {
        KVT_LOG_E("copy: %s event %lld: cuEventRecord: %s", what, (long long)j->event,
                  kvi_cuda_err(r));
        return false;
    }
    return true;
}

static void *issue_thread(void *arg)
{
    kvt_copy *c = arg;
    cuda_be *b = c->be;
    b->cu->CtxSetCurrent(b->ctx);
    pthread_mutex_lock(&c->mu);
    for (;;) {
        copy_job *j = kvi_copy_wait_front(c);
        if (!j)
            break;
        pthread_mutex_unlock(&c->mu);
        bool ok = issue(c, b, j);
        pthread_mutex_lock(&c->mu);
        kvi_copy_queue_pop(c);
        if (ok)
            j->state = JOB_ISSUED;
        else
            kvi_copy_job_finish(c, j, false);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

static void destroy_be(cuda_be *b)
{
    kvi_frag_unload(b->cu, &b->frag);
    for (int d = 0; d < 2; d++)
        if (b->stream[d])
            b->cu->StreamDestroy(b->stream[d]);
    free(b->dsts);
    free(b->srcs);
    free(b->sizes);
    free(b);
}

static int cuda_start(kvt_copy *c)
{
    int device = c->layout->device;
    if (device < 0)
        return kvt_fail(KVT_EINVAL, "copy: the CUDA backend needs a layout on a CUDA device");
    cuda_be *b = calloc(1, sizeof(*b));
    if (!b)
        return kvt_fail(KVT_ENOMEM, "copy: out of memory");
    b->cu = kvi_cuda();
    int rc = kvi_cuda_use_device(device, &b->ctx);
    if (rc) {
        free(b);
        return rc;
    }
    int least = 0, greatest = 0;
    kvi_CUresult r = b->cu->CtxGetStreamPriorityRange(&least, &greatest);
    for (int d = 0; d < 2 && r == KVT_CUDA_SUCCESS; d++)
        r = b->cu->StreamCreateWithPriority(&b->stream[d], KVT_CU_STREAM_NON_BLOCKING, least);
    if (r != KVT_CUDA_SUCCESS) {
        destroy_be(b);
        return kvt_fail(KVT_EIO, "copy: cannot create copy streams: %s", kvi_cuda_err(r));
    }
    kvi_CUmemLocation dev = {KVT_CU_MEM_LOCATION_TYPE_DEVICE, device};
    kvi_CUmemLocation host = {KVT_CU_MEM_LOCATION_TYPE_HOST, 0};
    unsigned flags = c->cfg.prefer_overlap ? KVT_CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE : 0;
    b->attrs[KVT_COPY_STORE] =
        (kvi_CUmemcpyAttributes){KVT_CU_MEMCPY_SRC_ACCESS_ORDER_STREAM, dev, host, flags};
    b->attrs[KVT_COPY_LOAD] =
        (kvi_CUmemcpyAttributes){KVT_CU_MEMCPY_SRC_ACCESS_ORDER_ANY, host, dev, flags};
    b->batched = b->cu->MemcpyBatchAsync && !c->cfg.force_fallback;
    if (!b->cu->MemcpyBatchAsync)
        KVT_LOG_W("copy: %s; using one cuMemcpyAsync per descriptor", b->cu->batch_missing);
    b->frag_max = c->cfg.kernel_max_bytes;
    kvi_CUdevice dev_handle;
    if (b->frag_max == 0)
        snprintf(b->frag.why, sizeof(b->frag.why), "kernel_max_bytes is 0");
    else if (b->cu->DeviceGet(&dev_handle, device) != KVT_CUDA_SUCCESS)
        snprintf(b->frag.why, sizeof(b->frag.why), "cuDeviceGet(%d) failed", device);
    else if (kvi_frag_load(b->cu, dev_handle, c->kernel_blocks_per_sm, &b->frag))
        KVT_LOG_I("copy: device %d: gather/scatter kernel loaded and self-tested; jobs of "
                  "fragments averaging <= %llu bytes use it",
                  device, (unsigned long long)b->frag_max);
    else if (kvi_cuda_frag_ptx_len == 0)
        KVT_LOG_I("copy: device %d: no gather/scatter kernel (%s); small fragments go by DMA",
                  device, b->frag.why);
    else
        KVT_LOG_W("copy: device %d: gather/scatter kernel not used: %s; small fragments go by "
                  "DMA",
                  device, b->frag.why);
    c->be = b;
    c->threads = calloc(1, sizeof(*c->threads));
    int e = c->threads ? pthread_create(&c->threads[0], NULL, issue_thread, c) : ENOMEM;
    if (e) {
        free(c->threads);
        c->threads = NULL;
        c->be = NULL;
        destroy_be(b);
        return kvi_fail_errno(e, "copy: cannot start the issue thread");
    }
    c->n_threads = 1;
    return 0;
}

/* Joins the issue thread, waits for the streams, then frees every CUDA object. */
static void cuda_stop(kvt_copy *c)
{
    cuda_be *b = c->be;
    if (c->n_threads)
        pthread_join(c->threads[0], NULL);
    free(c->threads);
    c->threads = NULL;
    c->n_threads = 0;
    if (!b)
        return;
    b->cu->CtxPushCurrent(b->ctx);
    for (int d = 0; d < 2; d++) {
        b->cu->StreamSynchronize(b->stream[d]);
        for (uint32_t i = 0; i < c->cfg.max_events; i++) {
            copy_job *j = &c->ring[d].slots[i];
            if (j->be_event)
                b->cu->EventDestroy((kvi_CUevent)j->be_event);
            j->be_event = NULL;
            if (j->be_frags) /* the stream is synchronized: no kernel reads it any more */
                b->cu->MemFreeHost(j->be_frags);
            j->be_frags = NULL;
            j->be_frags_cap = 0;
        }
    }
    kvi_frag_unload(b->cu, &b->frag); /* cuModuleUnload acts on the current context */
    kvi_CUcontext prev;
    b->cu->CtxPopCurrent(&prev);
    destroy_be(b);
    c->be = NULL;
}

static bool cuda_query(kvt_copy *c, copy_job *j)
{
    cuda_be *b = c->be;
    kvi_CUresult r = b->cu->EventQuery((kvi_CUevent)j->be_event);
    if (r == KVT_CUDA_ERROR_NOT_READY)
        return false;
    if (r != KVT_CUDA_SUCCESS)
        KVT_LOG_E("copy: event %lld: %s", (long long)j->event, kvi_cuda_err(r));
    kvi_copy_job_finish(c, j, r == KVT_CUDA_SUCCESS);
    return true;
}

static bool cuda_sync(kvt_copy *c, copy_job *j)
{
    cuda_be *b = c->be;
    kvi_CUresult r = b->cu->EventSynchronize((kvi_CUevent)j->be_event);
    if (r != KVT_CUDA_SUCCESS)
        KVT_LOG_E("copy: event %lld: %s", (long long)j->event, kvi_cuda_err(r));
    return r == KVT_CUDA_SUCCESS;
}

static int cuda_job_init(kvt_copy *c, copy_job *j)
{
    cuda_be *b = c->be;
    kvi_CUevent e = NULL;
    b->cu->CtxPushCurrent(b->ctx);
    kvi_CUresult r = b->cu->EventCreate(&e, KVT_CU_EVENT_DISABLE_TIMING);
    kvi_CUcontext prev;
    b->cu->CtxPopCurrent(&prev);
    if (r != KVT_CUDA_SUCCESS)
        return kvt_fail(KVT_EIO, "copy: cuEventCreate: %s", kvi_cuda_err(r));
    j->be_event = e;
    return 0;
}

static const copy_backend_ops cuda_ops = {
    .name = "cuda",
    .start = cuda_start,
    .stop = cuda_stop,
    .query = cuda_query,
    .sync = cuda_sync,
    .job_init = cuda_job_init,
};

const copy_backend_ops *kvi_copy_cuda_ops(const char **why)
{
    if (!kvi_cuda()) {
        *why = kvt_cuda_unavailable_reason();
        return NULL;
    }
    return &cuda_ops;
}

const char *kvi_copy_cuda_kernel(const kvt_copy *c, uint64_t run_bytes, const char **why)
{
    const cuda_be *b = c->be;
    if (why)
        *why = b->frag.ok ? "" : b->frag.why;
    return b->frag.ok && run_bytes <= b->frag_max ? "cuda_gather" : "dma";
}

const char *kvt_copy_kernel_unavailable(const kvt_copy *c)
{
    if (!c || c->kind != KVT_BACKEND_CUDA)
        return "";
    const char *why = "";
    kvi_copy_cuda_kernel(c, 0, &why);
    return why;
}

bool kvt_copy_batched(const kvt_copy *c)
{
    return c->kind == KVT_BACKEND_CUDA && ((const cuda_be *)c->be)->batched;
}
