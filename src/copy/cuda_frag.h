/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The CUDA backend's gather/scatter kernel (cuda_frag.cu, compiled to PTX at build time and
 * embedded; cuda_frag.c loads it through the driver API and launches it).
 */
#ifndef KVT_COPY_CUDA_FRAG_H
#define KVT_COPY_CUDA_FRAG_H

#include <stddef.h>

/* The kernel's PTX, NUL-terminated; kvi_cuda_frag_ptx_len is 0 in a build without nvcc. */
extern const unsigned char kvi_cuda_frag_ptx[];
extern const size_t kvi_cuda_frag_ptx_len;

/* One fragment as the kernel reads it (struct kvi_frag in cuda_frag.cu). */
typedef struct kvi_frag {
    unsigned long long dst, src, size;
} kvi_frag;

#endif
