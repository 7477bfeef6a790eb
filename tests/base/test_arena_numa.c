/* SPDX-License-Identifier: Apache-2.0 */
/*
 * NUMA placement on a machine with several nodes: an arena and a host mirror bound to the
 * last node have every page there (move_pages in query mode). On a machine with one node there
 * is nothing to tell apart: the test says skipped (ctest "Skipped", never "Passed"); CI allows
 * that skip by name.
 */
#include <dirent.h>
#include <errno.h>
#include <sys/syscall.h>

#include "kvt_test.h"

/* The highest node with memory, and how many nodes have memory. */
static int last_node(int *count)
{
    *count = 0;
    int last = -1;
    DIR *d = opendir("/sys/devices/system/node");
    struct dirent *e;
    while (d && (e = readdir(d))) {
        int n;
        char extra;
        if (sscanf(e->d_name, "node%d%c", &n, &extra) != 1)
            continue;
        char path[128];
        snprintf(path, sizeof(path), "/sys/devices/system/node/node%d/meminfo", n);
        if (access(path, R_OK) != 0)
            continue;
        (*count)++;
        if (n > last)
            last = n;
    }
    if (d)
        closedir(d);
    return last;
}

static void pages_are_on(unsigned char *base, size_t size, int node)
{
    for (size_t off = 0; off < size; off += 4096) {
        void *pages[1] = {base + off};
        int status[1] = {-1};
        assert_int_equal(syscall(SYS_move_pages, 0, 1ul, pages, NULL, status, 0), 0);
        assert_int_equal(status[0], node);
    }
}

static void an_arena_and_a_mirror_live_on_the_node_asked_for(void **state)
{
    (void)state;
    int nodes, node = last_node(&nodes);
    if (nodes < 2)
        KVT_SKIP("this machine has %d NUMA node%s with memory: placement cannot be told apart",
                 nodes, nodes == 1 ? "" : "s");
    kvt_arena_config c;
    kvt_arena_config_init(&c);
    c.size = 256 * 4096;
    c.numa_node = node;
    kvt_arena *a;
    KVT_OK_(kvt_arena_create(&c, &a));
    pages_are_on(kvt_arena_base(a), kvt_arena_size(a), node);
    kvt_arena_destroy(a);

    kvt_layout *lay;
    KVT_OK_(kvt_layout_create(KVT_HOST_DEVICE, 8, &lay));
    KVT_OK_(kvt_layout_add_region(lay, 1 << 20, 4096));
    kvt_mirror_config mc;
    kvt_mirror_config_init(&mc);
    mc.host_blocks = 64;
    mc.pin = false;
    mc.numa_node = node;
    kvt_mirror *m;
    KVT_OK_(kvt_mirror_create(&mc, lay, &m));
    pages_are_on((unsigned char *)(uintptr_t)kvt_mirror_regions(m)[0].base, 64 * 4096, node);
    kvt_mirror_destroy(m);
    kvt_layout_destroy(lay);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(an_arena_and_a_mirror_live_on_the_node_asked_for),
    };
    return kvt_test_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
