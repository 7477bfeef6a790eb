/* SPDX-License-Identifier: Apache-2.0 */
/*
 * `kvtier bench copy`: the copy engine moving randomly paired blocks, against the plain
 * contiguous copy of the same bytes measured in the same run (BENCHMARKS.md).
 *
 * For each block size (16 KiB: one layer's fragment of a block; 2 MiB: all layers of a
 * block) the "device" holds 2n blocks and the host mirror 2n blocks, n blocks making the
 * bytes per direction. Stores copy device blocks [0, n) to host blocks [0, n), loads host
 * [n, 2n) to device [n, 2n), both through random permutations (so almost nothing
 * coalesces), in events of about 64 MiB as an engine's steps would submit them. After a
 * warm-up pass, the phases run REPS times, the CPU baseline alternating with them so that
 * both see the same load on a shared machine; the best repetition counts, for kvtier and for
 * the baseline alike.
 *
 * Baselines: CPU backend, one contiguous memcpy of n blocks' bytes split evenly across the
 * same number of threads; CUDA backend, one cuMemcpyAsync of the same bytes between a
 * device buffer and pinned host memory per direction, and both directions at once on two
 * streams.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"
#include "kvtier/kvtier.h"

#define REPS        3
#define EVENT_BYTES (64ull << 20)

typedef struct copy_case {
    bool cuda;
    uint32_t threads;
    uint64_t bs, n;
    kvt_arena *dev_arena;
    uint64_t dptr; /* CUDA: the device buffer */
    uint64_t dev;
    kvt_layout *layout;
    kvt_mirror *mirror;
    kvt_copy *copy;
    uint32_t *st_src, *st_dst, *ld_src, *ld_dst;
    int64_t ev[2];
    double memcpy_gbps, store_gbps, load_gbps, both_gbps;
    double base_d2h, base_h2d, base_both;
    const char *kernel;   /* the copy kernel the engine used for these runs */
    char kernel_why[256]; /* CUDA: why the gather/scatter kernel is not loaded ("" if it is) */
    bool batched;         /* CUDA: the batch primitive was in use */
} copy_case;

static void shuffle(uint32_t *a, uint64_t n, uint32_t base, uint64_t *seed)
{
    for (uint64_t i = 0; i < n; i++)
        a[i] = base + (uint32_t)i;
    for (uint64_t i = n; i > 1; i--) {
        uint64_t j = kvt_rand_below(seed, (uint32_t)i);
        uint32_t t = a[i - 1];
        a[i - 1] = a[j];
        a[j] = t;
    }
}

static int submit_pass(copy_case *c, bool store, bool load)
{
    uint64_t per = EVENT_BYTES / c->bs ? EVENT_BYTES / c->bs : 1;
    for (uint64_t at = 0; at < c->n; at += per) {
        uint32_t k = (uint32_t)(c->n - at < per ? c->n - at : per);
        int rc = 0;
        if (store)
            rc = kvt_copy_submit(c->copy, KVT_COPY_STORE, c->ev[0]++, c->st_src + at,
                                 c->st_dst + at, k, NULL);
        if (!rc && load)
            rc = kvt_copy_submit(c->copy, KVT_COPY_LOAD, c->ev[1]++, c->ld_src + at, c->ld_dst + at,
                                 k, NULL);
        if (rc)
            return rc;
    }
    int rc = kvt_copy_flush(c->copy);
    int64_t hwm;
    kvt_copy_poll(c->copy, KVT_COPY_STORE, &hwm);
    kvt_copy_poll(c->copy, KVT_COPY_LOAD, &hwm);
    return rc;
}

/* One timed pass; keeps the best rate seen in *best. */
static int timed_pass(copy_case *c, bool store, bool load, double *best)
{
    double t0 = kvt_now_s();
    int rc = submit_pass(c, store, load);
    if (rc)
        return rc;
    double g = (double)c->n * c->bs * (store + load) / (kvt_now_s() - t0) / 1e9;
    if (g > *best)
        *best = g;
    return 0;
}

typedef struct span {
    char *dst;
    const char *src;
    size_t n;
} span;

static void *memcpy_thread(void *arg)
{
    span *s = arg;
    memcpy(s->dst, s->src, s->n);
    return NULL;
}

/* One contiguous memcpy of the same bytes on the same number of threads; keeps the best. */
static void cpu_baseline(copy_case *c, double *best)
{
    char *dst = (char *)(uintptr_t)kvt_mirror_regions(c->mirror)[0].base;
    const char *src = (const char *)(uintptr_t)c->dev;
    size_t total = c->n * c->bs, per = total / c->threads;
    pthread_t t[256];
    span s[256];
    double t0 = kvt_now_s();
    for (uint32_t i = 0; i < c->threads; i++) {
        s[i] = (span){dst + i * per, src + i * per, i + 1 == c->threads ? total - i * per : per};
        pthread_create(&t[i], NULL, memcpy_thread, &s[i]);
    }
    for (uint32_t i = 0; i < c->threads; i++)
        pthread_join(t[i], NULL);
    double g = (double)total / (kvt_now_s() - t0) / 1e9;
    if (g > *best)
        *best = g;
}

/* cudaMemcpy-style baseline: contiguous pinned <-> device, per direction and both at once. */
static int cuda_baseline(copy_case *c)
{
    double g[3];
    int rc = kvt_cuda_memcpy_rate(0, kvt_mirror_regions(c->mirror)[0].base, c->dptr, c->n * c->bs,
                                  REPS, g);
    if (rc)
        return rc;
    c->base_d2h = g[0];
    c->base_h2d = g[1];
    c->base_both = g[2];
    return 0;
}

static void case_fini(copy_case *c)
{
    kvt_copy_destroy(c->copy);
    kvt_mirror_destroy(c->mirror);
    kvt_layout_destroy(c->layout);
    kvt_arena_destroy(c->dev_arena);
    kvt_cuda_mem_free(0, c->dptr);
    free(c->st_src);
    free(c->st_dst);
    free(c->ld_src);
    free(c->ld_dst);
}

static int case_init(copy_case *c, uint64_t seed)
{
    uint64_t bytes = 2 * c->n * c->bs;
    int rc = 0;
    if (c->cuda) {
        if ((rc = kvt_cuda_mem_alloc(0, bytes, &c->dptr)) ||
            (rc = kvt_cuda_mem_fill(0, c->dptr, 0x5A, bytes)))
            return rc;
        c->dev = c->dptr;
    } else {
        kvt_arena_config ac;
        kvt_arena_config_init(&ac);
        ac.size = bytes;
        if ((rc = kvt_arena_create(&ac, &c->dev_arena)))
            return rc;
        c->dev = (uint64_t)(uintptr_t)kvt_arena_base(c->dev_arena);
        uint64_t *w = kvt_arena_base(c->dev_arena);
        for (uint64_t i = 0; i < bytes / 8; i++)
            w[i] = i * 0x9E3779B97F4A7C15ull;
    }
    kvt_mirror_config mc;
    kvt_mirror_config_init(&mc);
    mc.host_blocks = (uint32_t)(2 * c->n);
    kvt_copy_config cc;
    kvt_copy_config_init(&cc);
    cc.backend = c->cuda ? KVT_BACKEND_CUDA : KVT_BACKEND_CPU;
    cc.threads = c->threads;
    /* CUDA variants for comparisons (bench/gpu/run.sh runs them) */
    cc.force_fallback = getenv("KVTIER_BENCH_FALLBACK") != NULL;
    cc.prefer_overlap = getenv("KVTIER_BENCH_PREFER_OVERLAP") != NULL;
    if ((rc = kvt_layout_create(c->cuda ? 0 : KVT_HOST_DEVICE, (uint32_t)(2 * c->n), &c->layout)) ||
        (rc = kvt_layout_add_region(c->layout, c->dev, c->bs)) ||
        (rc = kvt_mirror_create(&mc, c->layout, &c->mirror)) ||
        (rc = kvt_copy_create(&cc, c->layout, c->mirror, &c->copy)))
        return rc;
    c->st_src = malloc(c->n * 4);
    c->st_dst = malloc(c->n * 4);
    c->ld_src = malloc(c->n * 4);
    c->ld_dst = malloc(c->n * 4);
    if (!c->st_src || !c->st_dst || !c->ld_src || !c->ld_dst)
        return kvt_fail(KVT_ENOMEM, "bench: out of memory");
    shuffle(c->st_src, c->n, 0, &seed);
    shuffle(c->st_dst, c->n, 0, &seed);
    shuffle(c->ld_src, c->n, (uint32_t)c->n, &seed);
    shuffle(c->ld_dst, c->n, (uint32_t)c->n, &seed);
    return 0;
}

/* Stored blocks must equal their sources (CPU: compared directly). */
static int check_stores(copy_case *c)
{
    if (c->cuda)
        return 0;
    const char *host = (const char *)(uintptr_t)kvt_mirror_regions(c->mirror)[0].base;
    const char *dev = (const char *)(uintptr_t)c->dev;
    for (uint64_t i = 0; i < c->n; i += 1 + c->n / 16)
        if (memcmp(host + (uint64_t)c->st_dst[i] * c->bs, dev + (uint64_t)c->st_src[i] * c->bs,
                   c->bs) != 0)
            return kvt_fail(KVT_EIO, "bench: stored block %u differs from device block %u",
                            c->st_dst[i], c->st_src[i]);
    return 0;
}

static int run_case(const kvt_bench_opts *o, copy_case *c)
{
    int rc = case_init(c, o->seed);
    if (!rc) {
        c->kernel = kvt_copy_kernel_name(c->copy, c->bs);
        snprintf(c->kernel_why, sizeof(c->kernel_why), "%s", kvt_copy_kernel_unavailable(c->copy));
        c->batched = kvt_copy_batched(c->copy);
    }
    if (!rc)
        rc = submit_pass(c, true, true); /* warm-up */
    if (!rc)
        rc = check_stores(c);
    /* CPU: baseline and kvtier passes alternate, so both see the same machine weather */
    for (int r = 0; r < REPS && !rc; r++) {
        if (!c->cuda)
            cpu_baseline(c, &c->memcpy_gbps);
        rc = timed_pass(c, true, false, &c->store_gbps);
        if (!rc)
            rc = timed_pass(c, false, true, &c->load_gbps);
        if (!rc)
            rc = timed_pass(c, true, true, &c->both_gbps);
    }
    if (!rc && c->cuda)
        rc = cuda_baseline(c);
    case_fini(c);
    return rc;
}

static double min2(double a, double b)
{
    return a < b ? a : b;
}

static int run(const kvt_bench_opts *o)
{
    bool cuda = strcmp(o->backend, "cuda") == 0;
    if (cuda && !kvt_cuda_available()) {
        fprintf(stderr, "kvtier bench copy: no CUDA: %s\n", kvt_cuda_unavailable_reason());
        return 1;
    }
    uint32_t threads = o->threads;
    if (!threads) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (uint32_t)n : 1;
    }
    double gib = o->gib > 0 ? o->gib : 1.0;
    uint64_t bytes = (uint64_t)(gib * (double)(1ull << 30));
    const uint64_t sizes[2] = {16u << 10, 2u << 20};
    copy_case cs[2];
    for (int i = 0; i < 2; i++) {
        memset(&cs[i], 0, sizeof(cs[i]));
        cs[i].cuda = cuda;
        cs[i].threads = cuda ? 1 : threads;
        cs[i].bs = sizes[i];
        cs[i].n = bytes / sizes[i] ? bytes / sizes[i] : 1;
        int rc = run_case(o, &cs[i]);
        if (rc) {
            fprintf(stderr, "kvtier bench copy: %s: %s\n", kvt_err_name(rc), kvt_last_error());
            return 1;
        }
    }
    copy_case *k = &cs[0], *m = &cs[1];
    if (o->json) {
        kvt_json j;
        kvt_json_begin(&j, stdout);
        kvt_json_str(&j, "bench", "copy");
        kvt_json_str(&j, "backend", cuda ? "cuda" : "cpu");
        kvt_json_host(&j);
        kvt_json_int(&j, "threads", cuda ? 1 : threads);
        kvt_json_int(&j, "bytes_per_direction", (long long)(m->n * m->bs));
        kvt_json_str(&j, "kernel", m->kernel);
        kvt_json_str(&j, "kernel_16k", k->kernel);
        if (cuda) {
            kvt_json_int(&j, "batched", m->batched);
            kvt_json_int(&j, "prefer_overlap", getenv("KVTIER_BENCH_PREFER_OVERLAP") != NULL);
            const char *cap = getenv("KVTIER_MAX_BATCH_DESCRIPTORS");
            kvt_json_int(&j, "max_descriptors", cap ? atoi(cap) : (int)KVT_CUDA_BATCH_DEFAULT);
            kvt_json_int(&j, "cuda_driver", kvt_cuda_driver_version());
            kvt_json_str(&j, "cuda_kernel_unavailable", m->kernel_why);
            kvt_json_num(&j, "cuda_memcpy_d2h_gbps", m->base_d2h);
            kvt_json_num(&j, "cuda_memcpy_h2d_gbps", m->base_h2d);
            kvt_json_num(&j, "cuda_memcpy_both_gbps", m->base_both);
            kvt_json_num(&j, "store_gbps", m->store_gbps);
            kvt_json_num(&j, "load_gbps", m->load_gbps);
            kvt_json_num(&j, "both_gbps", m->both_gbps);
            kvt_json_num(&j, "ratio_store", m->store_gbps / m->base_d2h);
            kvt_json_num(&j, "ratio_load", m->load_gbps / m->base_h2d);
            kvt_json_num(&j, "ratio_both", m->both_gbps / m->base_both);
            kvt_json_num(&j, "store_gbps_16k", k->store_gbps);
            kvt_json_num(&j, "load_gbps_16k", k->load_gbps);
            kvt_json_num(&j, "both_gbps_16k", k->both_gbps);
            kvt_json_num(&j, "ratio_vs_memcpy_16k",
                         min2(k->store_gbps / k->base_d2h, k->load_gbps / k->base_h2d));
            kvt_json_num(&j, "ratio_vs_memcpy",
                         min2(m->store_gbps / m->base_d2h, m->load_gbps / m->base_h2d));
        } else {
            kvt_json_num(&j, "memcpy_gbps", m->memcpy_gbps);
            kvt_json_num(&j, "store_gbps", m->store_gbps);
            kvt_json_num(&j, "load_gbps", m->load_gbps);
            kvt_json_num(&j, "both_gbps", m->both_gbps);
            kvt_json_num(&j, "ratio_vs_memcpy", min2(m->store_gbps, m->load_gbps) / m->memcpy_gbps);
            kvt_json_num(&j, "memcpy_gbps_16k", k->memcpy_gbps);
            kvt_json_num(&j, "store_gbps_16k", k->store_gbps);
            kvt_json_num(&j, "load_gbps_16k", k->load_gbps);
            kvt_json_num(&j, "ratio_vs_memcpy_16k",
                         min2(k->store_gbps, k->load_gbps) / k->memcpy_gbps);
        }
        kvt_json_end(&j);
    }
    if (!o->json)
        for (int i = 0; i < 2; i++)
            printf("%7llu KiB blocks (%s): store %.2f GB/s, load %.2f GB/s, both %.2f GB/s; "
                   "baseline %.2f GB/s\n",
                   (unsigned long long)(cs[i].bs >> 10), cs[i].kernel, cs[i].store_gbps,
                   cs[i].load_gbps, cs[i].both_gbps,
                   cuda ? min2(cs[i].base_d2h, cs[i].base_h2d) : cs[i].memcpy_gbps);
    return 0;
}

const kvt_bench kvt_bench_copy = {"copy", "copy engine vs contiguous memcpy / cudaMemcpy", run,
                                  "json,seed,backend,gib,threads"};
