/* SPDX-License-Identifier: Apache-2.0 */
/* A program outside the tree that moves bytes: it stores two host blocks into the disk tier
 * (libkvtier_disk), loads them back into two other blocks and compares, and starts and stops
 * a scheduler link endpoint (libkvtier_net). tests/install/run.sh builds it against an
 * installed kvtier. Usage: app_io DIR */
#include <kvtier/kvtier.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { NB = 4, BLOCK = 4096 };

static int fail(const char *what)
{
    fprintf(stderr, "app_io: %s: %s\n", what, kvt_last_error());
    return 1;
}

/* flush (every transfer submitted finishes), then the event must be reported, not failed */
static int wait_event(kvt_disk *d, int dir, int64_t event)
{
    int64_t hwm = KVT_NO_EVENT;
    if (kvt_disk_flush(d) || kvt_disk_poll(d, dir, &hwm))
        return fail("flush and poll");
    if (hwm < event || kvt_disk_take_failed(d, &hwm, 1)) {
        fprintf(stderr, "app_io: event %lld did not complete\n", (long long)event);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    unsigned char *mem = aligned_alloc(4096, NB * BLOCK);
    if (!mem)
        return 1;
    for (int i = 0; i < NB * BLOCK; i++)
        mem[i] = (unsigned char)(i * 7 + 3);
    kvt_layout *l;
    if (kvt_layout_create(KVT_HOST_DEVICE, NB, &l) ||
        kvt_layout_add_region(l, (uint64_t)(uintptr_t)mem, BLOCK))
        return fail("layout");
    char base[4096];
    snprintf(base, sizeof(base), "%s/app_io", argv[1]);
    kvt_disk_config dc;
    kvt_disk_config_init(&dc);
    dc.path = base;
    dc.capacity_bytes = 8 * BLOCK;
    kvt_disk *d;
    if (kvt_disk_create(&dc, l, &d))
        return fail("kvt_disk_create");
    const uint32_t src[2] = {1, 2}, slot[2] = {5, 6}, back[2] = {0, 3};
    if (kvt_disk_submit(d, KVT_COPY_STORE, 0, src, slot, 2, NULL) ||
        wait_event(d, KVT_COPY_STORE, 0))
        return fail("store");
    if (kvt_disk_submit(d, KVT_COPY_LOAD, 0, slot, back, 2, NULL) ||
        wait_event(d, KVT_COPY_LOAD, 0))
        return fail("load");
    int bad = memcmp(mem + 1 * BLOCK, mem + 0 * BLOCK, BLOCK) ||
              memcmp(mem + 2 * BLOCK, mem + 3 * BLOCK, BLOCK);
    kvt_disk_destroy(d);
    kvt_layout_destroy(l);
    free(mem);
    if (bad) {
        fprintf(stderr, "app_io: the blocks loaded back differ from those stored\n");
        return 1;
    }
    char ep[4200];
    snprintf(ep, sizeof(ep), "ipc://%s/app_io.sock", argv[1]);
    kvt_link_sched *s;
    if (kvt_link_sched_create(ep, 1, &s))
        return fail("kvt_link_sched_create");
    kvt_link_sched_destroy(s);
    printf("kvtier %s: 2 blocks stored to disk and loaded back identical; link endpoint %s\n",
           kvt_version(), ep);
    return 0;
}
