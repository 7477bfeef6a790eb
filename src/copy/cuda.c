/* SPDX-License-Identifier: Apache-2.0 */
/*
 * CUDA copy backend and the run-time driver loader.
 *
 * libcuda.so.1 is opened with dlopen the first time anything asks for CUDA, so the library
 * links and runs on machines without a GPU (kvi_cuda() is then NULL and the CPU backend is
 * the only one). cuMemcpyBatchAsync is resolved through cuGetProcAddress with the CUDA 12.8
 * ABI; a driver without it (CUDA 12.4 / 550.x answers success, a NULL pointer and
 * SYMBOL_NOT_FOUND) leaves the backend on one cuMemcpyAsync per descriptor, with a warning
 * naming the requirement.
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
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/log.h"
#include "copy/copy_internal.h"
#include "copy/cuda_api.h"
#include "copy/cuda_frag_internal.h"

#define MAX_DEVICES 64

static kvi_cuda_api g_cu;
static const kvi_cuda_api *g_cu_ok;
static char g_why[256] = "not loaded";
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t g_ctx_mu = PTHREAD_MUTEX_INITIALIZER;
static kvi_CUcontext g_ctx[MAX_DEVICES];

typedef kvi_CUresult (*pfn_get_proc)(const char *sym, void **pfn, int ver, uint64_t flags,
                                     int *status);

static const struct {
    const char *name;
    size_t off;
} g_syms[] = {
#define SYM(field, name)                                                                           \
    {                                                                                              \
        name, offsetof(kvi_cuda_api, field)                                                        \
    }
    SYM(Init, "cuInit"),
    SYM(DriverGetVersion, "cuDriverGetVersion"),
    SYM(DeviceGetCount, "cuDeviceGetCount"),
    SYM(DeviceGet, "cuDeviceGet"),
    SYM(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"),
    SYM(DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"),
    SYM(CtxSetCurrent, "cuCtxSetCurrent"),
    SYM(CtxPushCurrent, "cuCtxPushCurrent_v2"),
    SYM(CtxPopCurrent, "cuCtxPopCurrent_v2"),
    SYM(CtxGetStreamPriorityRange, "cuCtxGetStreamPriorityRange"),
    SYM(StreamCreateWithPriority, "cuStreamCreateWithPriority"),
    SYM(StreamDestroy, "cuStreamDestroy_v2"),
    SYM(StreamSynchronize, "cuStreamSynchronize"),
    SYM(StreamWaitEvent, "cuStreamWaitEvent"),
    SYM(EventCreate, "cuEventCreate"),
    SYM(EventDestroy, "cuEventDestroy_v2"),
    SYM(EventRecord, "cuEventRecord"),
    SYM(EventQuery, "cuEventQuery"),
    SYM(EventSynchronize, "cuEventSynchronize"),
    SYM(EventElapsedTime, "cuEventElapsedTime"),
    SYM(MemcpyAsync, "cuMemcpyAsync"),
    SYM(MemHostRegister, "cuMemHostRegister_v2"),
    SYM(MemHostUnregister, "cuMemHostUnregister"),
    SYM(MemAllocHost, "cuMemAllocHost_v2"),
    SYM(MemFreeHost, "cuMemFreeHost"),
    SYM(MemAlloc, "cuMemAlloc_v2"),
    SYM(MemFree, "cuMemFree_v2"),
    SYM(MemcpyHtoD, "cuMemcpyHtoD_v2"),
    SYM(MemcpyDtoH, "cuMemcpyDtoH_v2"),
    SYM(MemsetD8, "cuMemsetD8_v2"),
    SYM(GetErrorString, "cuGetErrorString"),
    SYM(DeviceGetAttribute, "cuDeviceGetAttribute"),
    SYM(ModuleLoadData, "cuModuleLoadData"),
    SYM(ModuleUnload, "cuModuleUnload"),
    SYM(ModuleGetFunction, "cuModuleGetFunction"),
    SYM(LaunchKernel, "cuLaunchKernel"),
#undef SYM
};

static void resolve_batch(void *lib)
{
    pfn_get_proc gpa = (pfn_get_proc)dlsym(lib, "cuGetProcAddress_v2");
    if (!gpa) {
        g_cu.batch_missing = "cuGetProcAddress_v2 missing: cuMemcpyBatchAsync requires a driver "
                             "supporting CUDA 12.8";
        return;
    }
    void *fn = NULL;
    int status = -1;
    kvi_CUresult r =
        gpa("cuMemcpyBatchAsync", &fn, 12080, KVT_CU_GET_PROC_ADDRESS_DEFAULT, &status);
    if (r != KVT_CUDA_SUCCESS || !fn || status != KVT_CU_GET_PROC_ADDRESS_SUCCESS) {
        g_cu.batch_missing = "cuMemcpyBatchAsync not found: it requires a driver supporting "
                             "CUDA 12.8";
        return;
    }
    g_cu.MemcpyBatchAsync = (kvi_pfn_memcpy_batch)fn;
}

static void load_driver(void)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(g_why, sizeof(g_why), "no CUDA driver: %s", dlerror());
        return;
    }
    for (size_t i = 0; i < sizeof(g_syms) / sizeof(g_syms[0]); i++) {
        void *f = dlsym(lib, g_syms[i].name);
        if (!f) {
            snprintf(g_why, sizeof(g_why), "CUDA driver lacks %s", g_syms[i].name);
            return;
        }
        memcpy((char *)&g_cu + g_syms[i].off, &f, sizeof(f));
    }
    kvi_CUresult r = g_cu.Init(0);
    if (r != KVT_CUDA_SUCCESS) {
        snprintf(g_why, sizeof(g_why), "cuInit failed: %s", kvi_cuda_err(r));
        return;
    }
    g_cu.DriverGetVersion(&g_cu.driver_version);
    if (g_cu.DeviceGetCount(&g_cu.device_count) != KVT_CUDA_SUCCESS || g_cu.device_count <= 0) {
        snprintf(g_why, sizeof(g_why), "CUDA driver %d found no device", g_cu.driver_version);
        return;
    }
    resolve_batch(lib);
    g_cu_ok = &g_cu;
    g_why[0] = 0;
}

const kvi_cuda_api *kvi_cuda(void)
{
    pthread_once(&g_once, load_driver);
    return g_cu_ok;
}

bool kvt_cuda_available(void)
{
    return kvi_cuda() != NULL;
}

const char *kvt_cuda_unavailable_reason(void)
{
    kvi_cuda();
    return g_why;
}

const char *kvi_cuda_err(kvi_CUresult r)
{
    const char *s = NULL;
    if (g_cu.GetErrorString && g_cu.GetErrorString(r, &s) == KVT_CUDA_SUCCESS && s)
        return s;
    return "unknown CUDA error";
}

int kvi_cuda_use_device(int device, kvi_CUcontext *ctx)
{
    const kvi_cuda_api *cu = kvi_cuda();
    if (!cu)
        return kvt_fail(KVT_EUNSUPPORTED, "cuda: %s", g_why);
    if (device < 0 || device >= cu->device_count || device >= MAX_DEVICES)
        return kvt_fail(KVT_EINVAL, "cuda: device %d out of range (%d devices)", device,
                        cu->device_count);
    pthread_mutex_lock(&g_ctx_mu);
    kvi_CUresult r = KVT_CUDA_SUCCESS;
    if (!g_ctx[device]) {
        kvi_CUdevice d;
        r = cu->DeviceGet(&d, device);
        if (r == KVT_CUDA_SUCCESS)
            r = cu->DevicePrimaryCtxRetain(&g_ctx[device], d);
    }
    kvi_CUcontext c = g_ctx[device];
    pthread_mutex_unlock(&g_ctx_mu);
    if (r == KVT_CUDA_SUCCESS)
        r = cu->CtxSetCurrent(c);
    if (r != KVT_CUDA_SUCCESS)
        return kvt_fail(KVT_EIO, "cuda: device %d: cannot use its primary context: %s", device,
                        kvi_cuda_err(r));
    if (ctx)
        *ctx = c;
    return 0;
}

int kvi_cuda_host_register(void *p, size_t n)
{
    const kvi_cuda_api *cu = kvi_cuda();
    if (!cu)
        return kvt_fail(KVT_EUNSUPPORTED, "cuda: %s", g_why);
    int rc = kvi_cuda_use_device(0, NULL);
    if (rc)
        return rc;
    /* mapped too: the gather/scatter kernel reads and writes it through its host address */
    kvi_CUresult r = cu->MemHostRegister(
        p, n, KVT_CU_MEMHOSTREGISTER_PORTABLE | KVT_CU_MEMHOSTREGISTER_DEVICEMAP);
    if (r != KVT_CUDA_SUCCESS)
        return kvt_fail(KVT_EIO, "cuMemHostRegister of %zu bytes: %s", n, kvi_cuda_err(r));
    return 0;
}

void kvi_cuda_host_unregister(void *p)
{
    const kvi_cuda_api *cu = kvi_cuda();
    if (cu && kvi_cuda_use_device(0, NULL) == 0)
        cu->MemHostUnregister(p);
}

int kvt_cuda_driver_version(void)
{
    const kvi_cuda_api *cu = kvi_cuda();
    return cu ? cu->driver_version : 0;
}

int kvt_cuda_mem_alloc(int device, uint64_t bytes, uint64_t *dptr)
{
    if (!dptr || !bytes)
        return kvt_fail(KVT_EINVAL, "cuda: mem_alloc needs bytes > 0 and an output");
    int rc = kvi_cuda_use_device(device, NULL);
    if (rc)
        return rc;
    kvi_CUdeviceptr p = 0;
    kvi_CUresult r = kvi_cuda()->MemAlloc(&p, bytes);
    if (r != KVT_CUDA_SUCCESS)
        return kvt_fail(KVT_ENOMEM, "cuMemAlloc of %llu bytes on device %d: %s",
                        (unsigned long long)bytes, device, kvi_cuda_err(r));
    *dptr = p;
    return 0;
}

void kvt_cuda_mem_free(int device, uint64_t dptr)
{
    if (dptr && kvi_cuda_use_device(device, NULL) == 0)
        kvi_cuda()->MemFree(dptr);
}

int kvt_cuda_mem_fill(int device, uint64_t dptr, uint8_t byte, uint64_t bytes)
{
    int rc = kvi_cuda_use_device(device, NULL);
    if (rc)
        return rc;
    kvi_CUresult r = kvi_cuda()->MemsetD8(dptr, byte, bytes);
    if (r != KVT_CUDA_SUCCESS)
        return kvt_fail(KVT_EIO, "cuMemsetD8 of %llu bytes: %s", (unsigned long long)bytes,
                        kvi_cuda_err(r));
    return 0;
}

int kvt_cuda_memcpy_rate(int device, uint64_t host, uint64_t dptr, uint64_t bytes, uint32_t reps,
                         double gbps[3])
{
    if (!host || !dptr || !bytes || !reps || !gbps)
        return kvt_fail(KVT_EINVAL, "cuda: memcpy_rate needs buffers, bytes, reps and an output");
    int rc = kvi_cuda_use_device(device, NULL);
    if (rc)
        return rc;
    const kvi_cuda_api *cu = kvi_cuda();
    kvi_CUstream s[2] = {NULL, NULL};
    int least, greatest;
    kvi_CUresult r = cu->CtxGetStreamPriorityRange(&least, &greatest);
    for (int i = 0; i < 2 && r == KVT_CUDA_SUCCESS; i++)
        r = cu->StreamCreateWithPriority(&s[i], KVT_CU_STREAM_NON_BLOCKING, least);
    double best[3] = {0, 0, 0};
    for (uint32_t round = 0; round <= reps && r == KVT_CUDA_SUCCESS; round++)
        for (int mode = 0; mode < 3 && r == KVT_CUDA_SUCCESS; mode++) {
            uint64_t t0 = kvt_monotonic_ns();
            if (mode != 1)
                r = cu->MemcpyAsync(host, dptr, bytes, s[0]); /* device to host */
            if (mode != 0 && r == KVT_CUDA_SUCCESS)
                r = cu->MemcpyAsync(dptr + bytes, host + bytes, bytes, s[1]); /* host to device */
            kvi_CUresult r0 = cu->StreamSynchronize(s[0]), r1 = cu->StreamSynchronize(s[1]);
            if (r == KVT_CUDA_SUCCESS)
                r = r0 != KVT_CUDA_SUCCESS ? r0 : r1;
            uint64_t ns = kvt_monotonic_ns() - t0;
            double g = (double)bytes * (mode == 2 ? 2 : 1) / (double)(ns ? ns : 1);
            if (round > 0 && g > best[mode]) /* round 0 warms up */
                best[mode] = g;
        }
    for (int i = 0; i < 2; i++)
        if (s[i])
            cu->StreamDestroy(s[i]);
    if (r != KVT_CUDA_SUCCESS)
        return kvt_fail(KVT_EIO, "cuda: memcpy_rate over %llu bytes: %s", (unsigned long long)bytes,
                        kvi_cuda_err(r));
    memcpy(gbps, best, sizeof(best));
    return 0;
}

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

/* Issues one job on its stream. Returns false (with the reason logged) on failure. */
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
    if (b->frag.ok && kvi_frag_use(j->bytes, j->n_descs, b->frag_max)) {
        /* the job's fragments in the slot's pinned table: the slot is reused only after this
         * job's completion event, so the kernel has read the table by then */
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
    } else if (b->batched) {
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
            r = cu->MemcpyBatchAsync(b->dsts + at, b->srcs + at, b->sizes + at, n,
                                     &b->attrs[j->dir], &attr_idx, 1, &fail, s);
            if (r != KVT_CUDA_SUCCESS) {
                KVT_LOG_E("copy: %s event %lld: cuMemcpyBatchAsync failed at descriptor %zu: %s",
                          what, (long long)j->event, at + fail, kvi_cuda_err(r));
                return false;
            }
        }
    } else {
        for (uint32_t i = 0; i < j->n_descs; i++) {
            r = cu->MemcpyAsync(j->descs[i].dst, j->descs[i].src, j->descs[i].size, s);
            if (r != KVT_CUDA_SUCCESS) {
                KVT_LOG_E("copy: %s event %lld: cuMemcpyAsync of descriptor %u: %s", what,
                          (long long)j->event, i, kvi_cuda_err(r));
                return false;
            }
        }
    }
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
    else if (kvi_frag_load(b->cu, dev_handle, &b->frag))
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
        *why = g_why;
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
