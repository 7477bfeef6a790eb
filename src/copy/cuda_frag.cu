// SPDX-License-Identifier: Apache-2.0
//
// The gather/scatter copy kernel of the CUDA backend (cuda_frag.c). The DMA engines pay per
// descriptor, so a job of many small fragments (a per-layer layout splits every block into one
// per layer) runs far below the link's bandwidth through cuMemcpyBatchAsync; this kernel
// copies all of a job's fragments in one launch instead, its threads reading and writing the
// pinned host mirror directly over the bus (the mirror is registered with the device map
// flag, and on a device with unified addressing the host pointer is the device pointer).
//
// Compiled ahead to PTX by nvcc at build time (CMakeLists.txt), embedded in libkvtier as a
// string and loaded through the driver API kvtier already opens with dlopen: no CUDA runtime
// at run time, and a build without nvcc simply has no kernel (DMA only).
//
// One thread block per fragment at a time (grid-stride over fragments); inside a fragment
// each thread moves 16-byte words, four loads in flight before their four stores, so that
// enough reads are outstanding on the bus. Fragments not 16-byte aligned in address and size
// are copied byte by byte (kvtier's layouts never make them; the path exists for correctness).

struct kvi_frag {
    unsigned long long dst, src, size;
};

extern "C" __global__ void __launch_bounds__(256)
    kvi_copy_frags(const kvi_frag *__restrict__ frags, unsigned int n)
{
    for (unsigned int i = blockIdx.x; i < n; i += gridDim.x) {
        const kvi_frag f = frags[i];
        if (((f.dst | f.src | f.size) & 15ull) == 0) {
            const uint4 *s = reinterpret_cast<const uint4 *>(f.src);
            uint4 *d = reinterpret_cast<uint4 *>(f.dst);
            const unsigned long long words = f.size >> 4, step = blockDim.x;
            unsigned long long k = threadIdx.x;
            for (; k + 3 * step < words; k += 4 * step) {
                uint4 a = s[k], b = s[k + step], c = s[k + 2 * step], e = s[k + 3 * step];
                d[k] = a;
                d[k + step] = b;
                d[k + 2 * step] = c;
                d[k + 3 * step] = e;
            }
            for (; k < words; k += step)
                d[k] = s[k];
        } else {
            const unsigned char *s = reinterpret_cast<const unsigned char *>(f.src);
            unsigned char *d = reinterpret_cast<unsigned char *>(f.dst);
            for (unsigned long long k = threadIdx.x; k < f.size; k += blockDim.x)
                d[k] = s[k];
        }
    }
}
