/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The gather/scatter kernel of the CUDA backend: loading its embedded PTX through the driver
 * API (cuModuleLoadData, which JIT-compiles it for the device), a self-test before first use,
 * and launches.
 *
 * The kernel reads and writes the host mirror through its host addresses, so it is used only
 * on a device with unified addressing that can use host pointers of registered memory
 * (CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM; every 64-bit Linux system
 * with a recent GPU). The self-test scatters fragments of every shape kvtier makes, and some
 * it does not, from pinned host memory to device memory and gathers them back, and compares
 * every byte: a driver that JIT-compiles the PTX wrongly, or a device that cannot reach host
 * memory the way we assume, leaves the backend on DMA with a warning instead of corrupting a
 * block. Any failure to load (no nvcc at build time; a driver older than the toolkit that
 * built the PTX) does the same.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "copy/cuda_frag.h"
#include "copy/cuda_frag_internal.h"

bool kvi_frag_use(uint64_t bytes, uint32_t n_descs, uint64_t max_mean)
{
    if (n_descs == 0 || max_mean == 0)
        return false;
    return bytes / n_descs <= max_mean;
}

#define TEST_BYTES (256u << 10)

/* Fragments for the self-test: 16-byte aligned ones of kvtier's sizes and odd ones, at
 * scattered places; returns how many (at most cap). */
static uint32_t test_frags(kvi_frag *f, uint32_t cap, unsigned long long dst_base,
                           unsigned long long src_base, bool reverse)
{
    static const uint32_t sizes[] = {16384, 4096, 16, 48, 1, 4095, 8192 + 3, 65536, 32};
    uint32_t n = 0;
    uint64_t at = 0;
    for (uint32_t i = 0; n < cap && i < 3 * (sizeof(sizes) / sizeof(sizes[0])); i++) {
        uint32_t sz = sizes[i % (sizeof(sizes) / sizeof(sizes[0]))];
        uint64_t skew = (i % 4 == 3) ? 5 : 0; /* some start unaligned */
        if (at + skew + sz > TEST_BYTES / 2)
            break;
        /* the destination of fragment i is the source's mirror image in the other half */
        uint64_t src_off = at + skew, dst_off = TEST_BYTES / 2 + (TEST_BYTES / 2 - at - sz) - skew;
        if (reverse) {
            uint64_t t = src_off;
            src_off = dst_off;
            dst_off = t;
        }
        f[n++] = (kvi_frag){dst_base + dst_off, src_base + src_off, sz};
        at += skew + sz + 4096;
    }
    return n;
}

/* Device <- pinned host (scatter), then pinned host <- device (gather back), on one stream;
 * false with the reason in why if anything differs. */
static bool self_test(const kvi_cuda_api *cu, kvi_frag_kernel *k, char *why, size_t why_len)
{
    unsigned char *host = NULL, *back = NULL;
    kvi_frag *frags = NULL;
    kvi_CUdeviceptr dev = 0;
    kvi_CUstream s = NULL;
    bool ok = false;
    kvi_CUresult r;
    if ((r = cu->MemAllocHost((void **)&host, TEST_BYTES)) ||
        (r = cu->MemAllocHost((void **)&back, TEST_BYTES)) ||
        (r = cu->MemAllocHost((void **)&frags, 2 * 64 * sizeof(kvi_frag))) ||
        (r = cu->MemAlloc(&dev, TEST_BYTES)) ||
        (r = cu->StreamCreateWithPriority(&s, KVT_CU_STREAM_NON_BLOCKING, 0))) {
        snprintf(why, why_len, "self-test: cannot allocate: %s", kvi_cuda_err(r));
        goto out;
    }
    for (uint32_t i = 0; i < TEST_BYTES; i++)
        host[i] = (unsigned char)(i * 167 + (i >> 9) + 1);
    memset(back, 0, TEST_BYTES);
    if ((r = cu->MemsetD8(dev, 0, TEST_BYTES))) {
        snprintf(why, why_len, "self-test: cuMemsetD8: %s", kvi_cuda_err(r));
        goto out;
    }
    /* host -> device: each fragment to the mirror place; device -> host: back where it was */
    uint32_t n1 = test_frags(frags, 64, dev, (unsigned long long)(uintptr_t)host, false);
    uint32_t n2 = test_frags(frags + 64, 64, (unsigned long long)(uintptr_t)back, dev, true);
    if ((r = kvi_frag_launch(cu, k, frags, n1, s)) ||
        (r = kvi_frag_launch(cu, k, frags + 64, n2, s)) || (r = cu->StreamSynchronize(s))) {
        snprintf(why, why_len, "self-test: launch: %s", kvi_cuda_err(r));
        goto out;
    }
    for (uint32_t i = 0; i < n1; i++) {
        uint64_t off = frags[i].src - (unsigned long long)(uintptr_t)host;
        if (memcmp(back + off, host + off, frags[i].size) != 0) {
            snprintf(why, why_len,
                     "self-test: fragment %u (%llu bytes) came back different: the kernel or "
                     "the device's access to host memory is broken",
                     i, frags[i].size);
            goto out;
        }
    }
    /* and nothing outside the fragments was written */
    for (uint32_t i = 0, at = 0; i <= n1; i++) {
        uint64_t end = i < n1 ? frags[i].src - (unsigned long long)(uintptr_t)host : TEST_BYTES / 2;
        for (; at < end; at++)
            if (back[at] != 0) {
                snprintf(why, why_len, "self-test: byte %u written outside every fragment", at);
                goto out;
            }
        if (i < n1)
            at = (uint32_t)(end + frags[i].size);
    }
    ok = true;
out:
    if (s)
        cu->StreamDestroy(s);
    if (dev)
        cu->MemFree(dev);
    if (frags)
        cu->MemFreeHost(frags);
    if (back)
        cu->MemFreeHost(back);
    if (host)
        cu->MemFreeHost(host);
    return ok;
}

bool kvi_frag_load(const kvi_cuda_api *cu, kvi_CUdevice device, uint32_t blocks_per_sm,
                   kvi_frag_kernel *k)
{
    memset(k, 0, sizeof(*k));
    if (kvi_cuda_frag_ptx_len == 0) {
        snprintf(k->why, sizeof(k->why), "built without nvcc (no kernel PTX embedded)");
        return false;
    }
    int uva = 0, host_ptr = 0, sms = 0;
    kvi_CUresult r;
    if ((r = cu->DeviceGetAttribute(&uva, KVT_CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, device)) ||
        (r = cu->DeviceGetAttribute(
             &host_ptr, KVT_CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM, device)) ||
        (r = cu->DeviceGetAttribute(&sms, KVT_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device))) {
        snprintf(k->why, sizeof(k->why), "cuDeviceGetAttribute: %s", kvi_cuda_err(r));
        return false;
    }
    if (!uva || !host_ptr) {
        snprintf(k->why, sizeof(k->why),
                 "device %d cannot use host pointers of registered memory (unified addressing "
                 "%d, host pointers %d)",
                 device, uva, host_ptr);
        return false;
    }
    if ((r = cu->ModuleLoadData(&k->mod, kvi_cuda_frag_ptx))) {
        snprintf(k->why, sizeof(k->why),
                 "cuModuleLoadData: %s (the PTX came from a newer toolkit than this driver "
                 "supports?)",
                 kvi_cuda_err(r));
        k->mod = NULL;
        return false;
    }
    if ((r = cu->ModuleGetFunction(&k->fn, k->mod, "kvi_copy_frags"))) {
        snprintf(k->why, sizeof(k->why), "cuModuleGetFunction(kvi_copy_frags): %s",
                 kvi_cuda_err(r));
        kvi_frag_unload(cu, k);
        return false;
    }
    k->max_grid = (sms > 0 ? (uint32_t)sms : 32) * blocks_per_sm;
    char why[sizeof(k->why)];
    if (!self_test(cu, k, why, sizeof(why))) {
        kvi_frag_unload(cu, k);
        memcpy(k->why, why, sizeof(why));
        return false;
    }
    k->ok = true;
    return true;
}

void kvi_frag_unload(const kvi_cuda_api *cu, kvi_frag_kernel *k)
{
    if (k->mod)
        cu->ModuleUnload(k->mod);
    k->mod = NULL;
    k->fn = NULL;
    k->ok = false;
}

kvi_CUresult kvi_frag_launch(const kvi_cuda_api *cu, const kvi_frag_kernel *k,
                             const kvi_frag *frags, uint32_t n, kvi_CUstream s)
{
    if (n == 0)
        return KVT_CUDA_SUCCESS;
    /* frags is pinned host memory (cuMemAllocHost): with unified addressing its host address
     * is its device address */
    const kvi_frag *arg0 = frags;
    unsigned int arg1 = n;
    void *params[] = {&arg0, &arg1};
    unsigned grid = n < k->max_grid ? n : k->max_grid;
    return cu->LaunchKernel(k->fn, grid, 1, 1, KVT_FRAG_THREADS, 1, 1, 0, s, params, NULL);
}
