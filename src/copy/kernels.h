/* SPDX-License-Identifier: Apache-2.0 */
/*
 * CPU copy kernels and the per-machine choice between them (kernels.c). Runs shorter than
 * KVT_KERNEL_LARGE_MIN use the kernel calibrated on KVT_KERNEL_SMALL_RUN-byte runs, longer ones
 * the kernel calibrated on KVT_KERNEL_LARGE_RUN-byte runs.
 */
#ifndef KVT_COPY_KERNELS_H
#define KVT_COPY_KERNELS_H

#include <stdbool.h>
#include <stddef.h>

#define KVT_KERNEL_SMALL_RUN (16u << 10)
#define KVT_KERNEL_LARGE_RUN (2u << 20)
#define KVT_KERNEL_LARGE_MIN (256u << 10)

/* Copies n bytes from s to d; next (next_n bytes, may be NULL) is the run copied after this
 * one, which a prefetching kernel pulls into the cache while it copies. Non-temporal stores
 * are weakly ordered: after the last kernel call of a batch, and before anything tells another
 * thread the bytes are there, call kvi_copy_fence() (one store fence per batch, not per run:
 * a fence drains the write-combining buffers, which per 16 KiB run costs a tenth of the copy). */
typedef void (*copy_kernel_fn)(char *d, const char *s, size_t n, const char *next, size_t next_n);

static inline void kvi_copy_fence(void)
{
#if defined(__x86_64__)
    __builtin_ia32_sfence();
#else
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
#endif
}

typedef struct copy_kernel {
    const char *name;
    copy_kernel_fn fn;
} copy_kernel;

/* The kernels for this machine, [0] small runs, [1] large runs: KVTIER_COPY_KERNEL, or the
 * fastest measured at the first call of the process (0.15-0.3 s). Thread-safe. */
const copy_kernel *const *kvi_copy_kernels(void);
/* All kernels kvtier has (*n of them), whether this CPU runs them or not. */
const copy_kernel *kvi_copy_kernel_list(size_t *n);
/* Whether this CPU has the instructions k needs (read at run time). */
bool kvi_copy_kernel_runs_here(const copy_kernel *k);
/* Calibration's choice from secs[i], kernel i's best time (0: the CPU does not run it): the
 * fastest, unless the expected kernel dflt is within 10% of it. */
size_t kvi_copy_kernel_pick(const double *secs, size_t n, size_t dflt);
/* The kernel of that name if this CPU can run it, else NULL. */
const copy_kernel *kvi_copy_kernel_find(const char *name, size_t len);

#endif
