/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Host arenas: one large anonymous mapping per use (the host tier of a rank, staging buffers).
 *
 * Fail closed. A HugeTLB mapping without MAP_NORESERVE reserves its pages at mmap time, so a
 * shortage is an mmap error here rather than SIGBUS on first touch later; ordinary pages are
 * populated up front with MADV_POPULATE_WRITE (Linux 5.14+), which reports ENOMEM instead of
 * faulting lazily in the middle of a transfer. Older kernels answer EINVAL and we fall back to
 * writing one byte per page. MADV_DONTFORK keeps the buffers out of children (a fork after the
 * memory is registered with a NIC or GPU would otherwise copy-on-write pinned pages).
 *
 * Sizes are rounded up to the page size in use and never to a power of two: a 768 GiB tier
 * must not become 1 TiB.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/error.h"
#include "base/guard.h"
#include "base/log.h"
#include "base/shm.h"
#include "base/util.h"

#ifndef MAP_HUGE_SHIFT
#define MAP_HUGE_SHIFT 26
#endif
#ifndef MAP_HUGE_2MB
#define MAP_HUGE_2MB (21 << MAP_HUGE_SHIFT)
#endif
#ifndef MAP_HUGE_1GB
#define MAP_HUGE_1GB (30 << MAP_HUGE_SHIFT)
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

struct kvt_arena {
    void *base;
    size_t size;
    size_t page;
    size_t used;
    int guard; /* a shared object's mapping: its SIGBUS guard (base/guard.h); else -1 */
};

void kvt_arena_config_init(kvt_arena_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->flags = KVT_ARENA_POPULATE | KVT_ARENA_DONTFORK | KVT_ARENA_THP;
    cfg->numa_node = -1;
}

#define MAX_NUMA_NODES 1024 /* the nodemask passed to mbind */

/* Binds [p, p + size) to NUMA node `node` before its pages are populated (the raw syscall:
 * libnuma adds nothing here). Pages already present (an existing shared object) are moved
 * where the kernel can. */
static int bind_node(void *p, size_t size, int32_t node)
{
    unsigned long mask[MAX_NUMA_NODES / (8 * sizeof(unsigned long))] = {0};
    mask[node / (8 * sizeof(unsigned long))] = 1ul << (node % (8 * sizeof(unsigned long)));
    if (syscall(SYS_mbind, p, size, 2 /* MPOL_BIND */, mask, (unsigned long)MAX_NUMA_NODES + 1,
                2 /* MPOL_MF_MOVE */) == 0)
        return 0;
    int e = errno;
    if (e == EINVAL) {
        char path[64];
        snprintf(path, sizeof(path), "/sys/devices/system/node/node%d", node);
        if (access(path, F_OK) != 0)
            return kvt_fail(KVT_EINVAL,
                            "arena: NUMA node %d: this machine has no such node "
                            "(see /sys/devices/system/node)",
                            node);
    }
    return kvi_fail_errno(e, "arena: binding %zu bytes to NUMA node %d (mbind)", size, node);
}

static int populate(void *p, size_t size, size_t page)
{
    if (madvise(p, size, MADV_POPULATE_WRITE) == 0)
        return 0;
    int e = errno;
    if (e != EINVAL)
        return kvi_fail_errno(e, "arena: cannot populate %zu bytes (MADV_POPULATE_WRITE)", size);
    /* Kernel without MADV_POPULATE_WRITE: touch each page. */
    volatile unsigned char *c = p;
    for (size_t off = 0; off < size; off += page)
        c[off] = 0;
    return 0;
}

/* Maps shared memory object `name` of exactly `size` bytes, creating it if absent; an existing
 * one only if it is ours (or the sharing group's) and closed to others (base/shm.h). */
static int map_shared(const char *name, const char *group, size_t size, void **out)
{
    kvi_shm_share share;
    int rc = kvi_shm_share_of(group, &share);
    if (rc)
        return kvi_fail_wrap(rc, "arena");
    int fd;
    bool created;
    if ((rc = kvi_shm_open(name, &share, "arena", &fd, &created)))
        return rc;
    if (created) {
        if (ftruncate(fd, (off_t)size) != 0) {
            rc = kvi_fail_errno(errno, "arena: cannot size %s to %zu bytes", name, size);
            close(fd);
            shm_unlink(name);
            return rc;
        }
    } else {
        struct stat st;
        /* its creator may not have sized it yet */
        for (int i = 0; i < 2000 && fstat(fd, &st) == 0 && st.st_size == 0; i++)
            usleep(1000);
        if (fstat(fd, &st) != 0 || (size_t)st.st_size != size) {
            rc = kvt_fail(KVT_EINVAL,
                          "arena: %s has %lld bytes, this mapping needs %zu (the sharers' "
                          "layouts or block counts differ)",
                          name, (long long)st.st_size, size);
            close(fd);
            return rc;
        }
    }
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int e = errno;
    close(fd); /* the mapping keeps the object */
    if (p == MAP_FAILED) {
        if (created)
            shm_unlink(name);
        return kvi_fail_errno(e, "arena: cannot map %s (%zu bytes)", name, size);
    }
    *out = p;
    return 0;
}

static int finish(const kvt_arena_config *cfg, void *p, size_t size, size_t page, bool huge,
                  kvt_arena **out);

static int map_region(size_t size, size_t page, int huge_flags, void **out)
{
    int flags = MAP_PRIVATE | MAP_ANONYMOUS | huge_flags;
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, flags, -1, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        if (huge_flags)
            return kvt_fail(KVT_ENOMEM,
                            "arena: cannot map %zu bytes in %zu MiB huge pages (%s): reserve "
                            "%zu pages (e.g. /sys/kernel/mm/hugepages/hugepages-%zukB/"
                            "nr_hugepages) or do not ask for huge pages",
                            size, page >> 20, strerror(e), size / page, page >> 10);
        return kvi_fail_errno(e, "arena: cannot map %zu bytes", size);
    }
    *out = p;
    return 0;
}

/* An arena over shared object cfg->shm_name, guarded: a sharer may shrink the object, and a
 * SIGBUS then poisons the mapping (base/guard.h), not the process. */
static int create_shared(const kvt_arena_config *cfg, size_t size, size_t page, kvt_arena **out)
{
    void *p = NULL;
    int guard, rc = map_shared(cfg->shm_name, cfg->shm_group, size, &p);
    if (rc)
        return rc;
    if ((rc = kvi_guard_add(p, size, &guard))) {
        munmap(p, size);
        return rc;
    }
    if ((rc = finish(cfg, p, size, page, false, out)))
        kvi_guard_remove(guard);
    else
        (*out)->guard = guard;
    return rc;
}

int kvt_arena_create(const kvt_arena_config *cfg, kvt_arena **out)
{
    *out = NULL;
    if (!cfg || cfg->size == 0)
        return kvt_fail(KVT_EINVAL, "arena: size must be positive");
    if (kvi_check_reserved(cfg->reserved, sizeof(cfg->reserved), "arena config"))
        return KVT_EINVAL;
    unsigned fl = cfg->flags;
    if (cfg->numa_node < -1 || cfg->numa_node >= MAX_NUMA_NODES)
        return kvt_fail(KVT_EINVAL, "arena: numa_node %d: -1 (no preference) or a node 0..%d",
                        cfg->numa_node, MAX_NUMA_NODES - 1);
    if ((fl & KVT_ARENA_HUGE_2M) && (fl & KVT_ARENA_HUGE_1G))
        return kvt_fail(KVT_EINVAL, "arena: choose 2 MiB or 1 GiB huge pages, not both");

    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    int huge_flags = 0;
    if (fl & KVT_ARENA_HUGE_2M) {
        page = 2u << 20;
        huge_flags = MAP_HUGETLB | MAP_HUGE_2MB;
    } else if (fl & KVT_ARENA_HUGE_1G) {
        page = 1u << 30;
        huge_flags = MAP_HUGETLB | MAP_HUGE_1GB;
    }
    size_t size;
    if (!kvi_round_up_sz(cfg->size, page, &size))
        return kvt_fail(KVT_EINVAL, "arena: size %zu overflows when rounded to pages", cfg->size);

    void *p = NULL;
    if (cfg->shm_name) {
        if (huge_flags)
            return kvt_fail(KVT_EINVAL,
                            "arena: %s: shared memory takes normal pages (THP "
                            "applies), not HugeTLB ones",
                            cfg->shm_name);
        return create_shared(cfg, size, page, out);
    }
    int rc = map_region(size, page, huge_flags, &p);
    if (rc != 0 && huge_flags && (fl & KVT_ARENA_HUGE_FALLBACK)) {
        KVT_LOG_W("%s; falling back to normal pages", kvt_last_error());
        page = (size_t)sysconf(_SC_PAGESIZE);
        huge_flags = 0;
        if (!kvi_round_up_sz(cfg->size, page, &size))
            return kvt_fail(KVT_EINVAL, "arena: size overflow");
        rc = map_region(size, page, 0, &p);
    }
    if (rc != 0)
        return rc;
    return finish(cfg, p, size, page, huge_flags != 0, out);
}

/* Advice, population and the handle for a fresh mapping (unmapped on failure). */
static int finish(const kvt_arena_config *cfg, void *p, size_t size, size_t page, bool huge,
                  kvt_arena **out)
{
    unsigned fl = cfg->flags;
    int rc;
    if (!huge && (fl & KVT_ARENA_THP))
        (void)madvise(p, size, MADV_HUGEPAGE); /* advisory; THP may be disabled */
    if ((fl & KVT_ARENA_DONTFORK) && madvise(p, size, MADV_DONTFORK) != 0) {
        rc = kvi_fail_errno(errno, "arena: MADV_DONTFORK on %zu bytes", size);
        munmap(p, size);
        return rc;
    }
    if (cfg->numa_node >= 0 && (rc = bind_node(p, size, cfg->numa_node)) != 0) {
        munmap(p, size);
        return rc;
    }
    if (fl & KVT_ARENA_POPULATE) {
        rc = populate(p, size, page);
        if (rc != 0) {
            munmap(p, size);
            return rc;
        }
    }
    kvt_arena *a = calloc(1, sizeof(*a));
    if (!a) {
        munmap(p, size);
        return kvt_fail(KVT_ENOMEM, "arena: out of memory");
    }
    a->base = p;
    a->size = size;
    a->page = page;
    a->guard = -1;
    *out = a;
    return 0;
}

void kvt_arena_destroy(kvt_arena *a)
{
    if (!a)
        return;
    kvi_guard_remove(a->guard);
    munmap(a->base, a->size);
    free(a);
}

int kvi_arena_guard(const kvt_arena *a)
{
    return a ? a->guard : -1;
}

KVI_GETTER(void *, kvt_arena_base, kvt_arena, base)
KVI_GETTER(size_t, kvt_arena_size, kvt_arena, size)
KVI_GETTER(size_t, kvt_arena_page_size, kvt_arena, page)

int kvt_arena_alloc(kvt_arena *a, size_t size, size_t align, void **out)
{
    *out = NULL;
    if (align == 0 || (align & (align - 1)) != 0)
        return kvt_fail(KVT_EINVAL, "arena: alignment %zu is not a power of two", align);
    size_t start;
    if (!kvi_round_up_sz(a->used, align, &start) || start > a->size || size > a->size - start)
        return kvt_fail(KVT_ENOSPC, "arena: %zu bytes (align %zu) do not fit: %zu of %zu used",
                        size, align, a->used, a->size);
    a->used = start + size;
    *out = (char *)a->base + start;
    return 0;
}
