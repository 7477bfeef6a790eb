/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Built only when the CUDA toolkit's cuda.h is found: asserts that the driver declarations in
 * cuda_api.h match the real ones, so the dlopen'ed calls use the driver's ABI.
 */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <stddef.h>

#include "base/cuda.h"

_Static_assert(sizeof(kvi_CUmemcpyAttributes) == sizeof(CUmemcpyAttributes), "attrs size");
_Static_assert(offsetof(kvi_CUmemcpyAttributes, srcLocHint) ==
                   offsetof(CUmemcpyAttributes, srcLocHint),
               "srcLocHint");
_Static_assert(offsetof(kvi_CUmemcpyAttributes, dstLocHint) ==
                   offsetof(CUmemcpyAttributes, dstLocHint),
               "dstLocHint");
_Static_assert(offsetof(kvi_CUmemcpyAttributes, flags) == offsetof(CUmemcpyAttributes, flags),
               "flags");
_Static_assert(sizeof(kvi_CUmemLocation) == sizeof(CUmemLocation), "location");
_Static_assert(sizeof(kvi_CUdeviceptr) == sizeof(CUdeviceptr), "deviceptr");
_Static_assert((int)KVT_CUDA_ERROR_NOT_READY == (int)CUDA_ERROR_NOT_READY, "not ready");
_Static_assert((int)KVT_CU_STREAM_NON_BLOCKING == (int)CU_STREAM_NON_BLOCKING, "non-blocking");
_Static_assert((int)KVT_CU_EVENT_DISABLE_TIMING == (int)CU_EVENT_DISABLE_TIMING, "disable timing");
_Static_assert((int)KVT_CU_MEMHOSTREGISTER_PORTABLE == (int)CU_MEMHOSTREGISTER_PORTABLE,
               "portable");
_Static_assert((int)KVT_CU_MEMHOSTREGISTER_DEVICEMAP == (int)CU_MEMHOSTREGISTER_DEVICEMAP,
               "devicemap");
_Static_assert((int)KVT_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT ==
                   (int)CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
               "sm count");
_Static_assert((int)KVT_CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING ==
                   (int)CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING,
               "uva");
_Static_assert((int)KVT_CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM ==
                   (int)CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM,
               "host pointer");
_Static_assert((int)KVT_CU_MEM_LOCATION_TYPE_DEVICE == (int)CU_MEM_LOCATION_TYPE_DEVICE,
               "loc device");
_Static_assert((int)KVT_CU_MEM_LOCATION_TYPE_HOST == (int)CU_MEM_LOCATION_TYPE_HOST, "loc host");
_Static_assert((int)KVT_CU_MEMCPY_SRC_ACCESS_ORDER_STREAM == (int)CU_MEMCPY_SRC_ACCESS_ORDER_STREAM,
               "order stream");
_Static_assert((int)KVT_CU_MEMCPY_SRC_ACCESS_ORDER_ANY == (int)CU_MEMCPY_SRC_ACCESS_ORDER_ANY,
               "order any");
_Static_assert((int)KVT_CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE ==
                   (int)CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE,
               "prefer overlap");
_Static_assert((int)KVT_CU_GET_PROC_ADDRESS_SUCCESS == (int)CU_GET_PROC_ADDRESS_SUCCESS,
               "proc success");

/* The 12.8 batch ABI we request by version. */
static PFN_cuMemcpyBatchAsync_v12080 check_batch_abi;
static kvi_pfn_memcpy_batch ours;
void kvi_cuda_abi_check_unused(void);
void kvi_cuda_abi_check_unused(void)
{
    ours = (kvi_pfn_memcpy_batch)check_batch_abi;
    (void)ours;
}
