/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The slice of the CUDA driver API kvtier uses, declared here so that the library builds
 * without the toolkit and loads libcuda.so.1 at run time: one binary runs on machines with
 * and without a GPU. The driver ABI is stable; when the toolkit's cuda.h is present at build
 * time, cuda_abi_check.c asserts these declarations match it.
 *
 * kvt_cuda() returns the resolved function table, or NULL when no driver or no device is
 * present (kvt_cuda_unavailable_reason() says which). Tests and benchmarks use it to
 * allocate device memory and to play the engine's compute stream.
 */
#ifndef KVT_COPY_CUDA_API_H
#define KVT_COPY_CUDA_API_H

#include <stddef.h>
#include <stdint.h>

typedef int kvt_CUresult;
typedef int kvt_CUdevice;
typedef struct kvt_CUctx_st *kvt_CUcontext;
typedef struct kvt_CUstream_st *kvt_CUstream;
typedef struct kvt_CUevent_st *kvt_CUevent;
typedef unsigned long long kvt_CUdeviceptr;
typedef struct kvt_CUmod_st *kvt_CUmodule;
typedef struct kvt_CUfunc_st *kvt_CUfunction;

typedef struct kvt_CUmemLocation {
    int type; /* CU_MEM_LOCATION_TYPE_* */
    int id;
} kvt_CUmemLocation;

typedef struct kvt_CUmemcpyAttributes {
    int srcAccessOrder; /* CU_MEMCPY_SRC_ACCESS_ORDER_* */
    kvt_CUmemLocation srcLocHint;
    kvt_CUmemLocation dstLocHint;
    unsigned int flags;
} kvt_CUmemcpyAttributes;

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
typedef kvt_CUresult (*kvt_pfn_memcpy_batch)(kvt_CUdeviceptr *dsts, kvt_CUdeviceptr *srcs,
                                             size_t *sizes, size_t count,
                                             kvt_CUmemcpyAttributes *attrs, size_t *attr_idxs,
                                             size_t num_attrs, size_t *fail_idx,
                                             kvt_CUstream stream);

typedef struct kvt_cuda_api {
    kvt_CUresult (*Init)(unsigned flags);
    kvt_CUresult (*DriverGetVersion)(int *v);
    kvt_CUresult (*DeviceGetCount)(int *n);
    kvt_CUresult (*DeviceGet)(kvt_CUdevice *d, int ordinal);
    kvt_CUresult (*DevicePrimaryCtxRetain)(kvt_CUcontext *ctx, kvt_CUdevice d);
    kvt_CUresult (*DevicePrimaryCtxRelease)(kvt_CUdevice d);
    kvt_CUresult (*CtxSetCurrent)(kvt_CUcontext ctx);
    kvt_CUresult (*CtxPushCurrent)(kvt_CUcontext ctx);
    kvt_CUresult (*CtxPopCurrent)(kvt_CUcontext *ctx);
    kvt_CUresult (*CtxGetStreamPriorityRange)(int *least, int *greatest);
    kvt_CUresult (*StreamCreateWithPriority)(kvt_CUstream *s, unsigned flags, int prio);
    kvt_CUresult (*StreamDestroy)(kvt_CUstream s);
    kvt_CUresult (*StreamSynchronize)(kvt_CUstream s);
    kvt_CUresult (*StreamWaitEvent)(kvt_CUstream s, kvt_CUevent e, unsigned flags);
    kvt_CUresult (*EventCreate)(kvt_CUevent *e, unsigned flags);
    kvt_CUresult (*EventDestroy)(kvt_CUevent e);
    kvt_CUresult (*EventRecord)(kvt_CUevent e, kvt_CUstream s);
    kvt_CUresult (*EventQuery)(kvt_CUevent e);
    kvt_CUresult (*EventSynchronize)(kvt_CUevent e);
    kvt_CUresult (*EventElapsedTime)(float *ms, kvt_CUevent a, kvt_CUevent b);
    kvt_CUresult (*MemcpyAsync)(kvt_CUdeviceptr dst, kvt_CUdeviceptr src, size_t n, kvt_CUstream s);
    kvt_CUresult (*MemHostRegister)(void *p, size_t n, unsigned flags);
    kvt_CUresult (*MemHostUnregister)(void *p);
    kvt_CUresult (*MemAllocHost)(void **p, size_t n);
    kvt_CUresult (*MemFreeHost)(void *p);
    kvt_CUresult (*MemAlloc)(kvt_CUdeviceptr *p, size_t n);
    kvt_CUresult (*MemFree)(kvt_CUdeviceptr p);
    kvt_CUresult (*MemcpyHtoD)(kvt_CUdeviceptr dst, const void *src, size_t n);
    kvt_CUresult (*MemcpyDtoH)(void *dst, kvt_CUdeviceptr src, size_t n);
    kvt_CUresult (*MemsetD8)(kvt_CUdeviceptr dst, unsigned char v, size_t n);
    kvt_CUresult (*GetErrorString)(kvt_CUresult r, const char **s);
    kvt_CUresult (*DeviceGetAttribute)(int *v, int attr, kvt_CUdevice d);
    kvt_CUresult (*ModuleLoadData)(kvt_CUmodule *m, const void *image);
    kvt_CUresult (*ModuleUnload)(kvt_CUmodule m);
    kvt_CUresult (*ModuleGetFunction)(kvt_CUfunction *f, kvt_CUmodule m, const char *name);
    kvt_CUresult (*LaunchKernel)(kvt_CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                 unsigned bx, unsigned by, unsigned bz, unsigned shared_bytes,
                                 kvt_CUstream s, void **params, void **extra);
    kvt_pfn_memcpy_batch MemcpyBatchAsync; /* NULL: driver older than CUDA 12.8 */
    const char *batch_missing;             /* why MemcpyBatchAsync is NULL */
    int driver_version;
    int device_count;
} kvt_cuda_api;

/* The driver, loaded and initialized once; NULL without a driver or a device. */
const kvt_cuda_api *kvt_cuda(void);
/* "CUDA_ERROR_..." text for r (never NULL). */
const char *kvt_cuda_err(kvt_CUresult r);
/* Makes device's primary context current on the calling thread (retained once per process). */
int kvt_cuda_use_device(int device, kvt_CUcontext *ctx);

#endif
