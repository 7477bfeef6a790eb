/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The run-time CUDA driver loader, and the device-memory helpers of the public API.
 *
 * libcuda.so.1 is opened with dlopen the first time anything asks for CUDA, so the library
 * links and runs on machines without a GPU (kvi_cuda() is then NULL and the CPU copy backend
 * is the only one). cuMemcpyBatchAsync is resolved through cuGetProcAddress with the CUDA 12.8
 * ABI; a driver without it (CUDA 12.4 / 550.x answers success, a NULL pointer and
 * SYMBOL_NOT_FOUND) leaves MemcpyBatchAsync NULL and batch_missing naming the requirement.
 * The copy engine's CUDA backend (copy/cuda.c), the disk tier's staging and the worker's
 * compute-done events all reach the driver through here.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/cuda.h"
#include "base/error.h"

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
