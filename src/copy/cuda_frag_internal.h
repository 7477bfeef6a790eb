/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The gather/scatter kernel as the CUDA backend uses it (cuda_frag.c).
 */
#ifndef KVT_COPY_CUDA_FRAG_INTERNAL_H
#define KVT_COPY_CUDA_FRAG_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "base/cuda.h"
#include "copy/cuda_frag.h"

#define KVT_FRAG_THREADS 256 /* threads per block: __launch_bounds__ in cuda_frag.cu */
/* Thread blocks per multiprocessor in one launch (KVTIER_CUDA_KERNEL_BLOCKS_PER_SM overrides).
 * The grid strides over the fragments, so a launch holds its blocks until its last fragment:
 * a grid that fills every multiprocessor keeps a store's and a load's launch from running
 * side by side (docs/benchmarks.md, the H200 figures). */
#define KVT_FRAG_BLOCKS_PER_SM 2

typedef struct kvi_frag_kernel {
    kvi_CUmodule mod;
    kvi_CUfunction fn;
    uint32_t max_grid; /* blocks per launch: blocks_per_sm per multiprocessor */
    bool ok;           /* loaded and passed its self-test */
    char why[200];     /* why not, when !ok */
} kvi_frag_kernel;

/* Loads the kernel into the current context (device's) and tests it; false with k->why set
 * when it cannot be used (the backend then copies by DMA). */
bool kvi_frag_load(const kvi_cuda_api *cu, kvi_CUdevice device, uint32_t blocks_per_sm,
                   kvi_frag_kernel *k);
void kvi_frag_unload(const kvi_cuda_api *cu, kvi_frag_kernel *k);
/* Copies the n fragments of frags (pinned host memory from cuMemAllocHost, left untouched
 * until the stream has passed the launch) in one launch on s. */
kvi_CUresult kvi_frag_launch(const kvi_cuda_api *cu, const kvi_frag_kernel *k,
                             const kvi_frag *frags, uint32_t n, kvi_CUstream s);
/* Whether a job of n_descs descriptors and `bytes` bytes goes to the kernel: its mean
 * descriptor is at most max_mean bytes (0: never). */
bool kvi_frag_use(uint64_t bytes, uint32_t n_descs, uint64_t max_mean);

#endif
