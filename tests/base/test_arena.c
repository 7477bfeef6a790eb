/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Host arenas: mapping, population, page-size rounding (never a power of two), bump
 * allocation, and failing closed with a clear message when huge pages are short.
 */
#include <errno.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kvt_test.h"

static unsigned long free_hugepages_2m(void)
{
    FILE *f = fopen("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages", "r");
    unsigned long n = 0;
    if (f) {
        if (fscanf(f, "%lu", &n) != 1)
            n = 0;
        fclose(f);
    }
    return n;
}

static void arena_is_rounded_to_pages_not_to_a_power_of_two(void **state)
{
    (void)state;
    kvt_arena_config c;
    kvt_arena_config_init(&c);
    c.size = 3 * 4096 * 1000 + 1; /* a bit over 12 MB */
    kvt_arena *a;
    KVT_OK_(kvt_arena_create(&c, &a));
    size_t page = kvt_arena_page_size(a);
    assert_int_equal(kvt_arena_size(a) % page, 0);
    assert_true(kvt_arena_size(a) >= c.size && kvt_arena_size(a) < c.size + page);
    unsigned char *base = kvt_arena_base(a);
    memset(base, 0x5a, kvt_arena_size(a));
    assert_int_equal(base[kvt_arena_size(a) - 1], 0x5a);
    kvt_arena_destroy(a);
}

/* The NUMA node of the page at p (move_pages in query mode), or -errno. */
static int page_node(void *p)
{
    void *pages[1] = {p};
    int status[1] = {-1};
    if (syscall(SYS_move_pages, 0, 1ul, pages, NULL, status, 0) != 0)
        return -errno;
    return status[0];
}

/* numa_node: -1 is no preference, a node this machine has holds every page, one it lacks (or a
 * value out of range) is refused with the reason, nothing left mapped. Node 0 exists on every
 * Linux machine: checked everywhere (test_arena_numa checks a second node where there is one). */
static void numa_node_places_pages_or_is_refused(void **state)
{
    (void)state;
    kvt_arena_config c;
    kvt_arena_config_init(&c);
    assert_int_equal(c.numa_node, -1);
    c.size = 64 * 4096;
    c.flags = KVT_ARENA_POPULATE;
    c.numa_node = 0;
    kvt_arena *a;
    KVT_OK_(kvt_arena_create(&c, &a));
    unsigned char *base = kvt_arena_base(a);
    for (size_t off = 0; off < kvt_arena_size(a); off += 4096)
        assert_int_equal(page_node(base + off), 0);
    kvt_arena_destroy(a);
    c.numa_node = 1000; /* in range, but no machine here has it */
    KVT_ERR_(kvt_arena_create(&c, &a), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "NUMA node 1000: this machine has no such node"));
    c.numa_node = -2;
    KVT_ERR_(kvt_arena_create(&c, &a), KVT_EINVAL);
    c.numa_node = 4096;
    KVT_ERR_(kvt_arena_create(&c, &a), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "numa_node 4096"));
    /* a host mirror passes its node to its arena */
    kvt_layout *lay;
    KVT_OK_(kvt_layout_create(KVT_HOST_DEVICE, 8, &lay));
    KVT_OK_(kvt_layout_add_region(lay, 1 << 20, 4096));
    kvt_mirror_config mc;
    kvt_mirror_config_init(&mc);
    assert_int_equal(mc.numa_node, -1);
    mc.host_blocks = 16;
    mc.pin = false;
    mc.numa_node = 1000;
    kvt_mirror *m;
    KVT_ERR_(kvt_mirror_create(&mc, lay, &m), KVT_EINVAL);
    mc.numa_node = 0;
    KVT_OK_(kvt_mirror_create(&mc, lay, &m));
    assert_int_equal(page_node((void *)(uintptr_t)kvt_mirror_regions(m)[0].base), 0);
    kvt_mirror_destroy(m);
    kvt_layout_destroy(lay);
}

static void bump_allocation_respects_alignment_and_size(void **state)
{
    (void)state;
    kvt_arena_config c;
    kvt_arena_config_init(&c);
    c.size = 8192;
    kvt_arena *a;
    KVT_OK_(kvt_arena_create(&c, &a));
    void *p, *q;
    KVT_OK_(kvt_arena_alloc(a, 10, 1, &p));
    KVT_OK_(kvt_arena_alloc(a, 100, 256, &q));
    assert_int_equal((uintptr_t)q % 256, 0);
    assert_true((char *)q >= (char *)p + 10);
    KVT_ERR_(kvt_arena_alloc(a, 100, 3, &p), KVT_EINVAL);
    KVT_ERR_(kvt_arena_alloc(a, 1u << 20, 8, &p), KVT_ENOSPC);
    assert_null(p);
    KVT_OK_(kvt_arena_alloc(a, 8192 - 512, 512, &p)); /* exactly the rest */
    KVT_ERR_(kvt_arena_alloc(a, 1, 1, &p), KVT_ENOSPC);
    kvt_arena_destroy(a);
}

static void bad_configs_are_rejected(void **state)
{
    (void)state;
    kvt_arena_config c;
    kvt_arena *a = (kvt_arena *)1;
    kvt_arena_config_init(&c);
    KVT_ERR_(kvt_arena_create(&c, &a), KVT_EINVAL); /* size 0 */
    assert_null(a);
    c.size = 4096;
    c.flags |= KVT_ARENA_HUGE_2M | KVT_ARENA_HUGE_1G;
    KVT_ERR_(kvt_arena_create(&c, &a), KVT_EINVAL);
    c.flags = 0;
    c.size = SIZE_MAX - 10;
    KVT_ERR_(kvt_arena_create(&c, &a), KVT_EINVAL);
}

/* Asking for more 2 MiB pages than the system has fails now, with a message saying what to do,
 * instead of succeeding and dying of SIGBUS on first touch. */
static void huge_page_shortage_fails_closed(void **state)
{
    (void)state;
    kvt_arena_config c;
    kvt_arena_config_init(&c);
    c.flags |= KVT_ARENA_HUGE_2M;
    c.size = (free_hugepages_2m() + 4) * (2u << 20);
    kvt_arena *a = NULL;
    KVT_ERR_(kvt_arena_create(&c, &a), KVT_ENOMEM);
    assert_null(a);
    assert_non_null(strstr(kvt_last_error(), "huge pages"));
    assert_non_null(strstr(kvt_last_error(), "nr_hugepages"));
    /* with the fallback flag the same request is served by normal pages */
    c.flags |= KVT_ARENA_HUGE_FALLBACK;
    kvt_log_set_level(KVT_LOG_ERROR); /* the fallback warns */
    KVT_OK_(kvt_arena_create(&c, &a));
    kvt_log_set_level(KVT_LOG_WARN);
    assert_true(kvt_arena_page_size(a) < (2u << 20));
    kvt_arena_destroy(a);
}

/* MADV_DONTFORK: a forked child does not get the arena mapped at all. */
static void arena_is_not_inherited_by_children(void **state)
{
    (void)state;
    kvt_arena_config c;
    kvt_arena_config_init(&c);
    c.size = 1 << 20;
    kvt_arena *a;
    KVT_OK_(kvt_arena_create(&c, &a));
    uintptr_t base = (uintptr_t)kvt_arena_base(a);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* In the child the range must not appear in its own memory map. */
        FILE *f = fopen("/proc/self/maps", "r");
        char line[512];
        int found = 0;
        while (f && fgets(line, sizeof(line), f)) {
            unsigned long lo, hi;
            if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && base >= lo && base < hi)
                found = 1;
        }
        if (f)
            fclose(f);
        _exit(found ? 1 : 0);
    }
    int st;
    waitpid(pid, &st, 0);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    kvt_arena_destroy(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(arena_is_rounded_to_pages_not_to_a_power_of_two),
        cmocka_unit_test(bump_allocation_respects_alignment_and_size),
        cmocka_unit_test(numa_node_places_pages_or_is_refused),
        cmocka_unit_test(bad_configs_are_rejected),
        cmocka_unit_test(huge_page_shortage_fails_closed),
        cmocka_unit_test(arena_is_not_inherited_by_children),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
