/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Host arenas: mapping, population, page-size rounding (never a power of two), bump
 * allocation, and failing closed with a clear message when huge pages are short.
 */
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
        cmocka_unit_test(bad_configs_are_rejected),
        cmocka_unit_test(huge_page_shortage_fails_closed),
        cmocka_unit_test(arena_is_not_inherited_by_children),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
