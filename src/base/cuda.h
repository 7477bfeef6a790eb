/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The slice of the CUDA driver API kvtier uses, declared here so that the library builds
 * without the toolkit and loads libcuda.so.1 at run time: one binary runs on machines with
 * and without a GPU. The driver ABI is stable; when the toolkit's cuda.h is present at build
 * time, cuda_abi_check.c asserts these declarations match it.
 *
 * kvi_cuda() returns the resolved function table, or NULL when no driver or no device is
 * present (kvt_cuda_unavailable_reason() says which). Tests use it to
 * allocate device memory and to play the engine's compute stream.
 */
#ifndef KVI_BASE_CUDA_H
#define KVI_BASE_CUDA_H

#include "base/export.h"

#include <stddef.h>
#include <stdint.h>

#include "kvtier/base.h"

typedef int kvi_CUresult;
typedef int kvi_CUdevice;
typedef struct kvi_CUctx_st *kvi_CUcontext;
typedef struct kvi_CUstream_st *kvi_CUstream;
typedef struct kvi_CUevent_st *kvi_CUevent;
typedef unsigned long long kvi_CUdeviceptr;
typedef struct kvi_CUmod_st *kvi_CUmodule;
typedef struct kvi_CUfunc_st *kvi_CUfunction;

typedef struct kvi_CUmemLocation {
    int type; /* CU_MEM_LOCATION_TYPE_* */
    int id;
} kvi_CUmemLocation;

typedef struct kvi_CUmemcpyAttributes {
    int srcAccessOrder; /* CU_MEMCPY_SRC_ACCESS_ORDER_* */
    kvi_CUmemLocation srcLocHint;
    kvi_CUmemLocation dstLocHint;
    unsigned int flags;
} kvi_CUmemcpyAttributes;

enum {
    KVT_CUDA_SUCCESS = 0,
    KVT_CUDA_ERROR_NOT_READY = 600,
    KVT_CU_STREAM_NON_BLOCKING = 1,
    KVT_CU_EVENT_DISABLE_TIMING = 2,
    KVT_CU_MEMHOSTREGISTER_PORTABLE = 1,
    KVT_CU_MEMHOSTREGISTER_DEVICEMAP = 2,
    KVT_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
    KVT_CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING = 41,
    KVT_CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM = 91,
    KVT_CU_MEM_LOCATION_TYPE_DEVICE = 1,
    KVT_CU_MEM_LOCATION_TYPE_HOST = 2,
    KVT_CU_MEMCPY_SRC_ACCESS_ORDER_STREAM = 1,
    KVT_CU_MEMCPY_SRC_ACCESS_ORDER_ANY = 3,
    KVT_CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE = 1,
    KVT_CU_GET_PROC_ADDRESS_DEFAULT = 0,
    KVT_CU_GET_PROC_ADDRESS_SUCCESS = 0
};

/* cuMemcpyBatchAsync as of CUDA 12.8 (with failIdx); requested by version through
 * cuGetProcAddress so that a CUDA 13 driver hands out this ABI, not the 13.0 one. */
typedef kvi_CUresult (*kvi_pfn_memcpy_batch)(kvi_CUdeviceptr *dsts, kvi_CUdeviceptr *srcs,
                                             size_t *sizes, size_t count,
                                             kvi_CUmemcpyAttributes *attrs, size_t *attr_idxs,
                                             size_t num_attrs, size_t *fail_idx,
                                             kvi_CUstream stream);

typedef struct kvi_cuda_api {
    kvi_CUresult (*Init)(unsigned flags);
    kvi_CUresult (*DriverGetVersion)(int *v);
    kvi_CUresult (*DeviceGetCount)(int *n);
    kvi_CUresult (*DeviceGet)(kvi_CUdevice *d, int ordinal);
    kvi_CUresult (*DevicePrimaryCtxRetain)(kvi_CUcontext *ctx, kvi_CUdevice d);
    kvi_CUresult (*DevicePrimaryCtxRelease)(kvi_CUdevice d);
    kvi_CUresult (*CtxSetCurrent)(kvi_CUcontext ctx);
    kvi_CUresult (*CtxPushCurrent)(kvi_CUcontext ctx);
    kvi_CUresult (*CtxPopCurrent)(kvi_CUcontext *ctx);
    kvi_CUresult (*CtxGetStreamPriorityRange)(int *least, int *greatest);
    kvi_CUresult (*StreamCreateWithPriority)(kvi_CUstream *s, unsigned flags, int prio);
    kvi_CUresult (*StreamDestroy)(kvi_CUstream s);
    kvi_CUresult (*StreamSynchronize)(kvi_CUstream s);
    kvi_CUresult (*StreamWaitEvent)(kvi_CUstream s, kvi_CUevent e, unsigned flags);
    kvi_CUresult (*EventCreate)(kvi_CUevent *e, unsigned flags);
    kvi_CUresult (*EventDestroy)(kvi_CUevent e);
    kvi_CUresult (*EventRecord)(kvi_CUevent e, kvi_CUstream s);
    kvi_CUresult (*EventQuery)(kvi_CUevent e);
    kvi_CUresult (*EventSynchronize)(kvi_CUevent e);
    kvi_CUresult (*EventElapsedTime)(float *ms, kvi_CUevent a, kvi_CUevent b);
    kvi_CUresult (*MemcpyAsync)(kvi_CUdeviceptr dst, kvi_CUdeviceptr src, size_t n, kvi_CUstream s);
    kvi_CUresult (*MemHostRegister)(void *p, size_t n, unsigned flags);
    kvi_CUresult (*MemHostUnregister)(void *p);
    kvi_CUresult (*MemAllocHost)(void **p, size_t n);
    kvi_CUresult (*MemFreeHost)(void *p);
    kvi_CUresult (*MemAlloc)(kvi_CUdeviceptr *p, size_t n);
    kvi_CUresult (*MemFree)(kvi_CUdeviceptr p);
    kvi_CUresult (*MemcpyHtoD)(kvi_CUdeviceptr dst, const void *src, size_t n);
    kvi_CUresult (*MemcpyDtoH)(void *dst, kvi_CUdeviceptr src, size_t n);
    kvi_CUresult (*MemsetD8)(kvi_CUdeviceptr dst, unsigned char v, size_t n);
    kvi_CUresult (*GetErrorString)(kvi_CUresult r, const char **s);
    kvi_CUresult (*DeviceGetAttribute)(int *v, int attr, kvi_CUdevice d);
    kvi_CUresult (*ModuleLoadData)(kvi_CUmodule *m, const void *image);
    kvi_CUresult (*ModuleUnload)(kvi_CUmodule m);
    kvi_CUresult (*ModuleGetFunction)(kvi_CUfunction *f, kvi_CUmodule m, const char *name);
    kvi_CUresult (*LaunchKernel)(kvi_CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                 unsigned bx, unsigned by, unsigned bz, unsigned shared_bytes,
                                 kvi_CUstream s, void **params, void **extra);
    kvi_pfn_memcpy_batch MemcpyBatchAsync; /* NULL: driver older than CUDA 12.8 */
    const char *batch_missing;             /* why MemcpyBatchAsync is NULL */
    int driver_version;
    int device_count;
} kvi_cuda_api;

/* The driver, loaded and initialized once; NULL without a driver or a device. */
KVI_EXPORT const kvi_cuda_api *kvi_cuda(void);
/* "CUDA_ERROR_..." text for r (never NULL). */
KVI_EXPORT const char *kvi_cuda_err(kvi_CUresult r);
/* Makes device's primary context current on the calling thread (retained once per process). */
KVI_EXPORT int kvi_cuda_use_device(int device, kvi_CUcontext *ctx);
/* Pins host memory for DMA on device 0 (mapped too: the copy kernel reads it by its host
 * address); KVT_EUNSUPPORTED without a driver. The mirror and the disk's staging use it. */
KVI_EXPORT int kvi_cuda_host_register(void *p, size_t n);
KVI_EXPORT void kvi_cuda_host_unregister(void *p);

#endif
