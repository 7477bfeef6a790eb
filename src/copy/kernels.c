/* SPDX-License-Identifier: Apache-2.0 */
/*
 * CPU copy kernels, and the choice of the fastest for this machine.
 *
 * Which way of copying a block is fastest depends on the microarchitecture, not on taste: on
 * an AMD EPYC a non-temporal AVX2 loop beat a contiguous memcpy by 1.2x on 2 MiB runs; on an
 * Intel Xeon with AVX-512 the same loop reached 0.64-0.77 of it in `kvtier bench copy`, glibc's
 * memcpy run by run 0.60-0.64, a non-temporal AVX-512 loop 0.84-0.96, and one that copies four
 * pages at a time 1.04-1.10. (glibc switches to
 * non-temporal stores only above its own threshold, megabytes, so a run-by-run memcpy pays
 * for reading every destination line first.) So every kernel the CPU can run is timed once
 * per process, on the copy pattern the engine makes — runs of 16 KiB (a layer's fragment of
 * a block) and of 2 MiB (a whole block) at random places, from memory that is not in the
 * caches, by as many threads as the engine has (up to 8) — and the fastest for each size
 * class is used, unless the kernel the CPU's features suggest is within 10% of it: that is
 * the noise of a shared machine.
 *
 * The calibration takes 0.15-0.3 s and 128 MiB for that time, at the first kvt_copy_create of
 * the process; KVTIER_COPY_KERNEL skips it: "avx512nt" (both size classes) or
 * "small:movsb,large:avx2nt". Kernels: memcpy (glibc), movsb (rep movsb: ERMS), sse2nt, and
 * avx2nt and avx512nt with their variants: _pf prefetches the next run into L2 while copying
 * this one (runs are randomly placed, so the hardware prefetcher cannot see them coming), 4
 * copies four pages at a time. Features are read at run time: one binary runs everywhere.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include "base/log.h"
#include "kvtier/base.h"
#include "copy/copy_internal.h"
#include "copy/kernels.h"

static void k_memcpy(char *d, const char *s, size_t n, const char *next, size_t next_n)
{
    (void)next;
    (void)next_n;
    memcpy(d, s, n);
}

#if defined(__x86_64__)
static void k_movsb(char *d, const char *s, size_t n, const char *next, size_t next_n)
{
    (void)next;
    (void)next_n;
    __asm__ volatile("rep movsb" : "+D"(d), "+S"(s), "+c"(n) : : "memory");
}

/* Copies up to the destination's alignment with memcpy; returns how many bytes it did. */
static size_t head_bytes(const char *d, size_t n, size_t align)
{
    size_t head = (size_t)(-(uintptr_t)d) & (align - 1);
    return head > n ? n : head;
}

static void k_sse2nt(char *d, const char *s, size_t n, const char *next, size_t next_n)
{
    (void)next;
    (void)next_n;
    size_t h = head_bytes(d, n, 16);
    memcpy(d, s, h);
    d += h, s += h, n -= h;
    for (; n >= 64; d += 64, s += 64, n -= 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)s);
        __m128i b = _mm_loadu_si128((const __m128i *)(s + 16));
        __m128i e = _mm_loadu_si128((const __m128i *)(s + 32));
        __m128i f = _mm_loadu_si128((const __m128i *)(s + 48));
        _mm_stream_si128((__m128i *)d, a);
        _mm_stream_si128((__m128i *)(d + 16), b);
        _mm_stream_si128((__m128i *)(d + 32), e);
        _mm_stream_si128((__m128i *)(d + 48), f);
    }
    memcpy(d, s, n);
}

/* The AVX2 and AVX-512 loops. 256 bytes per step: loads, then streaming stores. WAYS 4: four
 * pages at a time, a step from each in turn, so that four DRAM streams are in flight instead
 * of one (glibc's loop for copies above its non-temporal threshold does the same); on the
 * Intel VM that took 2 MiB blocks from 0.89-0.94 to 1.02-1.10 of memcpy. PF: each step pulls
 * 256 bytes of the next run into L2 (into L1, _MM_HINT_T0, 16 KiB runs copied at 0.85-0.91
 * of memcpy; into L2 at 0.97-1.03). */
#define PAGE 4096
#define NT_KERNEL(NAME, TARGET, VEC, LOAD, STREAM, W, WAYS, PF)                                    \
    __attribute__((target(TARGET))) static void NAME(char *d, const char *s, size_t n,             \
                                                     const char *next, size_t next_n)              \
    {                                                                                              \
        size_t pf = 0, h = head_bytes(d, n, W);                                                    \
        if (!(PF))                                                                                 \
            next_n = 0;                                                                            \
        memcpy(d, s, h);                                                                           \
        d += h, s += h, n -= h;                                                                    \
        for (; (WAYS) > 1 && n >= (WAYS)*PAGE;                                                     \
             d += (WAYS)*PAGE, s += (WAYS)*PAGE, n -= (WAYS)*PAGE)                                 \
            for (size_t off = 0; off < PAGE; off += 256)                                           \
                for (size_t w = 0; w < (WAYS); w++) {                                              \
                    NT_PREFETCH();                                                                 \
                    NT_STEP(VEC, LOAD, STREAM, W, d + w * PAGE + off, s + w * PAGE + off);         \
                }                                                                                  \
        for (; n >= 256; d += 256, s += 256, n -= 256) {                                           \
            NT_PREFETCH();                                                                         \
            NT_STEP(VEC, LOAD, STREAM, W, d, s);                                                   \
        }                                                                                          \
        for (; n >= W; d += W, s += W, n -= W)                                                     \
            STREAM((void *)d, LOAD((const void *)s));                                              \
        memcpy(d, s, n);                                                                           \
    }
#define NT_PREFETCH()                                                                              \
    if (pf < next_n) {                                                                             \
        for (int q = 0; q < 256; q += 64)                                                          \
            _mm_prefetch(next + pf + q, _MM_HINT_T1);                                              \
        pf += 256;                                                                                 \
    }
#define NT_STEP(VEC, LOAD, STREAM, W, D, S)                                                        \
    do {                                                                                           \
        char *d_ = (D);                                                                            \
        const char *s_ = (S);                                                                      \
        VEC r_[256 / (W)];                                                                         \
        for (int q = 0; q < 256 / (W); q++)                                                        \
            r_[q] = LOAD((const void *)(s_ + q * (W)));                                            \
        for (int q = 0; q < 256 / (W); q++)                                                        \
            STREAM((void *)(d_ + q * (W)), r_[q]);                                                 \
    } while (0)

static inline __attribute__((target("avx2"))) __m256i ld256(const void *p)
{
    return _mm256_loadu_si256((const __m256i *)p);
}
static inline __attribute__((target("avx2"))) void st256(void *p, __m256i v)
{
    _mm256_stream_si256((__m256i *)p, v);
}
static inline __attribute__((target("avx512f"))) __m512i ld512(const void *p)
{
    return _mm512_loadu_si512(p);
}
static inline __attribute__((target("avx512f"))) void st512(void *p, __m512i v)
{
    _mm512_stream_si512(p, v);
}

NT_KERNEL(k_avx2nt, "avx2", __m256i, ld256, st256, 32, 1, 0)
NT_KERNEL(k_avx2nt_pf, "avx2", __m256i, ld256, st256, 32, 1, 1)
NT_KERNEL(k_avx2nt4, "avx2", __m256i, ld256, st256, 32, 4, 0)
NT_KERNEL(k_avx2nt4_pf, "avx2", __m256i, ld256, st256, 32, 4, 1)
NT_KERNEL(k_avx512nt, "avx512f", __m512i, ld512, st512, 64, 1, 0)
NT_KERNEL(k_avx512nt_pf, "avx512f", __m512i, ld512, st512, 64, 1, 1)
NT_KERNEL(k_avx512nt4, "avx512f", __m512i, ld512, st512, 64, 4, 0)
NT_KERNEL(k_avx512nt4_pf, "avx512f", __m512i, ld512, st512, 64, 4, 1)

static bool has_erms(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return false;
    return (b >> 9) & 1; /* enhanced rep movsb */
}
#endif

static const copy_kernel kernels[] = {
    {"memcpy", k_memcpy},
#if defined(__x86_64__)
    {"movsb", k_movsb},         {"sse2nt", k_sse2nt},
    {"avx2nt", k_avx2nt},       {"avx2nt_pf", k_avx2nt_pf},
    {"avx2nt4", k_avx2nt4},     {"avx2nt4_pf", k_avx2nt4_pf},
    {"avx512nt", k_avx512nt},   {"avx512nt_pf", k_avx512nt_pf},
    {"avx512nt4", k_avx512nt4}, {"avx512nt4_pf", k_avx512nt4_pf},
#endif
};
#define N_KERNELS (sizeof(kernels) / sizeof(kernels[0]))

bool kvi_copy_kernel_runs_here(const copy_kernel *k)
{
#if defined(__x86_64__)
    if (k->fn == k_movsb)
        return has_erms();
    if (k->fn == k_avx2nt || k->fn == k_avx2nt_pf || k->fn == k_avx2nt4 || k->fn == k_avx2nt4_pf)
        return __builtin_cpu_supports("avx2");
    if (k->fn == k_avx512nt || k->fn == k_avx512nt_pf || k->fn == k_avx512nt4 ||
        k->fn == k_avx512nt4_pf)
        return __builtin_cpu_supports("avx512f");
#else
    (void)k;
#endif
    return true;
}

const copy_kernel *kvi_copy_kernel_list(size_t *n)
{
    *n = N_KERNELS;
    return kernels;
}

const copy_kernel *kvi_copy_kernel_find(const char *name, size_t len)
{
    for (size_t i = 0; i < N_KERNELS; i++)
        if (strlen(kernels[i].name) == len && memcmp(kernels[i].name, name, len) == 0)
            return kvi_copy_kernel_runs_here(&kernels[i]) ? &kernels[i] : NULL;
    return NULL;
}

/* ---- calibration ----------------------------------------------------------------------------- */

/* Each timing copies CAL_BYTES: 1,024 runs of 16 KiB or 8 of 2 MiB, from and to its own slice
 * of buffers CAL_SLICES times that size, so that what it touches was last touched 3 timings
 * ago and is mostly out of the caches (with 8 MiB slices the non-temporal loops ran at
 * 22-25 GB/s, cached, and prefetching looked useless; with 16 MiB ones at the rates the bench
 * sees). Kernels take turns, CAL_ROUNDS times, and each keeps its fastest time, so a burst of
 * noise from a neighbour on a shared machine hits every kernel alike rather than one. Sanitized
 * builds: one small round, as timings mean nothing there. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define KVT_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define KVT_SANITIZED 1
#endif
#endif
/* A kernel replaces the CPU's expected best only if it copies this much faster: on a shared VM
 * the best of 5 timings of two kernels still swapped places in 1 calibration of 5 where the
 * bench then showed them 25% apart. */
#define CAL_MARGIN 1.10
#ifdef KVT_SANITIZED /* timings mean nothing under a sanitizer: the same code, less of it */
#define CAL_BYTES  (4u << 20)
#define CAL_SLICES 1
#define CAL_ROUNDS 1
#else
#define CAL_BYTES  (16u << 20)
#define CAL_SLICES 4
#define CAL_ROUNDS 5
#endif
#define CAL_MAX_THREADS 8

struct cal_job {
    const copy_kernel *k;
    char *dst;
    const char *src;
    const uint32_t *perm;
    uint32_t first, n;
    size_t run;
};

static void *cal_run(void *p)
{
    struct cal_job *j = p;
    for (uint32_t i = j->first; i < j->first + j->n; i++) {
        const char *next = i + 1 < j->first + j->n ? j->src + (size_t)(i + 1) * j->run : NULL;
        j->k->fn(j->dst + (size_t)j->perm[i] * j->run, j->src + (size_t)i * j->run, j->run, next,
                 next ? j->run : 0);
    }
    kvi_copy_fence();
    return NULL;
}

/* Seconds for `threads` threads to copy CAL_BYTES in runs of `run` bytes with kernel k. */
static double cal_time(const copy_kernel *k, char *dst, const char *src, const uint32_t *perm,
                       size_t run, uint32_t threads)
{
    /* each timing copies its own slice of buffers CAL_SLICES times larger, so what it reads
     * was last touched CAL_SLICES - 1 timings ago: out of the caches, mostly, as an engine's
     * blocks are (flushing the lines instead took 7 s on a VM) */
    static uint32_t slice;
    size_t at = (size_t)(slice++ % CAL_SLICES) * CAL_BYTES;
    src += at;
    dst += at;
    uint32_t runs = (uint32_t)(CAL_BYTES / run), per = runs / threads;
    pthread_t th[CAL_MAX_THREADS];
    struct cal_job jobs[CAL_MAX_THREADS];
    uint64_t t0 = kvt_monotonic_ns();
    uint32_t started = 0;
    for (uint32_t t = 0; t < threads; t++) {
        jobs[t] = (struct cal_job){
            k, dst, src, perm, t * per, t + 1 == threads ? runs - t * per : per, run};
        if (t + 1 < threads && pthread_create(&th[started], NULL, cal_run, &jobs[t]) == 0)
            started++;
        else
            cal_run(&jobs[t]); /* the last share (or one whose thread would not start) here */
    }
    for (uint32_t t = 0; t < started; t++)
        pthread_join(th[t], NULL);
    return (double)(kvt_monotonic_ns() - t0) / 1e9;
}

static const copy_kernel *chosen[2];
static pthread_once_t once = PTHREAD_ONCE_INIT;

size_t kvi_copy_kernel_pick(const double *secs, size_t n, size_t dflt)
{
    size_t pick = dflt;
    for (size_t i = 0; i < n; i++)
        if (secs[i] > 0 && (secs[pick] <= 0 || secs[i] < secs[pick]))
            pick = i;
    if (secs[dflt] > 0 && secs[pick] * CAL_MARGIN > secs[dflt]) /* within the noise */
        pick = dflt;
    return pick;
}

/* The kernel expected to be fastest from the CPU's features alone, from what the bench showed
 * on the Intel VM: for small runs (cls 0) the widest non-temporal loop prefetching the next
 * run (a 16 KiB run is over before the hardware prefetcher has found it), for large ones the
 * widest four-way loop. Calibration replaces it only with a kernel clearly faster
 * (CAL_MARGIN). */
static const copy_kernel *default_kernel(int cls)
{
    static const char *const order[2][4] = {{"avx512nt_pf", "avx2nt_pf", "sse2nt", "memcpy"},
                                            {"avx512nt4", "avx2nt4", "sse2nt", "memcpy"}};
    for (size_t i = 0; i < 4; i++) {
        const copy_kernel *k = kvi_copy_kernel_find(order[cls][i], strlen(order[cls][i]));
        if (k)
            return k;
    }
    return &kernels[0];
}

/* KVTIER_COPY_KERNEL: "name" (both classes), or "small:name", "large:name" or both joined by
 * a comma (a class not named uses the other's kernel). False if unset, or if any part names
 * no kernel this CPU runs: then a warning, and calibration decides. */
static bool from_env(void)
{
    const char *e = getenv("KVTIER_COPY_KERNEL");
    if (!e || !*e)
        return false;
    const copy_kernel *k[2] = {NULL, NULL};
    bool bad = false;
    if (!strchr(e, ':')) {
        k[0] = k[1] = kvi_copy_kernel_find(e, strlen(e));
        bad = !k[0];
    } else {
        for (const char *p = e; *p && !bad;) {
            const char *comma = strchr(p, ',');
            size_t len = comma ? (size_t)(comma - p) : strlen(p);
            int cls = len > 6 && strncmp(p, "small:", 6) == 0   ? 0
                      : len > 6 && strncmp(p, "large:", 6) == 0 ? 1
                                                                : -1;
            if (cls < 0 || k[cls] || !(k[cls] = kvi_copy_kernel_find(p + 6, len - 6)))
                bad = true;
            p += len + (comma ? 1 : 0);
        }
        for (int c = 0; c < 2 && !bad; c++)
            if (!k[c])
                k[c] = k[1 - c];
    }
    if (bad || !k[0] || !k[1]) {
        char names[256] = "";
        size_t at = 0;
        for (size_t i = 0; i < N_KERNELS; i++)
            if (kvi_copy_kernel_runs_here(&kernels[i]) && at < sizeof(names))
                at += (size_t)snprintf(names + at, sizeof(names) - at, "%s%s", i ? ", " : "",
                                       kernels[i].name);
        KVT_LOG_W("copy: KVTIER_COPY_KERNEL=\"%s\" does not name kernels this CPU runs (\"name\" "
                  "or \"small:name,large:name\"; this CPU runs: %s); calibrating instead",
                  e, names);
        return false;
    }
    chosen[0] = k[0];
    chosen[1] = k[1];
    KVT_LOG_I("copy: kernels from KVTIER_COPY_KERNEL: %s for small runs, %s for large", k[0]->name,
              k[1]->name);
    return true;
}

/* A random permutation of [0, n): where each calibration run lands, as blocks of a pool do. */
static void shuffle(uint32_t *perm, uint32_t n, uint64_t seed)
{
    for (uint32_t i = 0; i < n; i++)
        perm[i] = i;
    for (uint32_t i = n; i > 1; i--) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t j = (uint32_t)((seed >> 33) % i), t = perm[i - 1];
        perm[i - 1] = perm[j];
        perm[j] = t;
    }
}

/* The fastest kernel for size class cls (0: 16 KiB runs, 1: 2 MiB), by CAL_ROUNDS interleaved
 * timings of each. */
static const copy_kernel *fastest(char *dst, const char *src, uint32_t *perm, int cls,
                                  uint32_t threads)
{
    size_t run = cls ? KVT_KERNEL_LARGE_RUN : KVT_KERNEL_SMALL_RUN;
    double best[N_KERNELS];
    shuffle(perm, (uint32_t)(CAL_BYTES / run), 0x6b76636bu + run);
    for (size_t i = 0; i < N_KERNELS; i++) /* warms code and TLB; its time is kept only if best */
        best[i] = kvi_copy_kernel_runs_here(&kernels[i])
                      ? cal_time(&kernels[i], dst, src, perm, run, threads)
                      : 0;
    for (int round = 0; round < CAL_ROUNDS; round++)
        for (size_t i = 0; i < N_KERNELS; i++)
            if (best[i] > 0) {
                double t = cal_time(&kernels[i], dst, src, perm, run, threads);
                best[i] = t < best[i] ? t : best[i];
            }
    for (size_t i = 0; i < N_KERNELS; i++)
        if (best[i] > 0)
            KVT_LOG_D("copy: calibration, %zu-byte runs, %u threads: %-12s %.2f GB/s", run, threads,
                      kernels[i].name, CAL_BYTES / best[i] / 1e9);
    size_t pick = kvi_copy_kernel_pick(best, N_KERNELS, (size_t)(default_kernel(cls) - kernels));
    return &kernels[pick];
}

static void calibrate(void)
{
    if (from_env())
        return;
    chosen[0] = default_kernel(0);
    chosen[1] = default_kernel(1);
    long on = sysconf(_SC_NPROCESSORS_ONLN);
    uint32_t threads = on < 1 ? 1 : on > CAL_MAX_THREADS ? CAL_MAX_THREADS : (uint32_t)on;
    /* source and destination, in transparent huge pages where the kernel allows them (as
     * kvtier's arenas are): 4 KiB pages would add a TLB miss to every page of every run */
    const size_t span = (size_t)CAL_BYTES * CAL_SLICES, huge = 2u << 20;
    size_t len = 2 * span + huge;
    char *map = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    uint32_t *perm = malloc((CAL_BYTES / KVT_KERNEL_SMALL_RUN) * sizeof(uint32_t));
    if (map == MAP_FAILED || !perm) {
        KVT_LOG_W("copy: no memory to calibrate the copy kernels; using %s", chosen[0]->name);
    } else {
        char *src = (char *)(((uintptr_t)map + huge - 1) & ~(uintptr_t)(huge - 1));
        char *dst = src + span;
        (void)madvise(src, 2 * span, MADV_HUGEPAGE); /* advisory */
        memset(src, 0x5a, span);
        memset(dst, 0xa5, span);
        chosen[0] = fastest(dst, src, perm, 0, threads);
        chosen[1] = fastest(dst, src, perm, 1, threads);
        KVT_LOG_I("copy: kernels chosen by calibration: %s for small runs, %s for large",
                  chosen[0]->name, chosen[1]->name);
    }
    if (map != MAP_FAILED)
        munmap(map, len);
    free(perm);
}

const copy_kernel *const *kvi_copy_kernels(void)
{
    pthread_once(&once, calibrate);
    return chosen;
}

void kvi_copy_bytes_nt(void *dst, const void *src, size_t n)
{
    const copy_kernel *const *k = kvi_copy_kernels();
    k[n >= KVT_KERNEL_LARGE_MIN]->fn(dst, src, n, NULL, 0);
    kvi_copy_fence();
}
