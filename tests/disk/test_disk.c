/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The disk tier: the rank's private file (stale file replaced, 0600, a symlink never
 * followed, unlinked at shutdown), slot sizing, bytes stored and loaded back verified in
 * direct and page-cache modes, ids checked first, and failures: an I/O error or a short
 * transfer fails that block only (a store event listed as failed, a load's block listed as
 * invalid, the rest of the event intact), a fatal error is sticky and names the file. And a
 * chain of two disks behind the host under the real manager and worker, bytes checked.
 */
#include <errno.h>
#include <sys/stat.h>

#include "kvt_test.h"
#include "offload/sim.h"

#include "kvtier/disk.h"
#include "worker/worker_internal.h"

#define DEV 40
/* Unaligned regions (11,256 bytes, padded to 12,288) go through staging buffers; aligned
 * ones (8 + 4 + 4 KiB) are read and written in place with vectored I/O. */
static const uint64_t BPB_STAGED[3] = {8192, 3000, 64}, BPB_ALIGNED[3] = {8192, 4096, 4096};
static uint64_t BPB[3];

static char g_dir[256];

typedef struct drig {
    unsigned char *mem[3];
    kvt_layout *layout;
    kvt_disk *disk;
    char base[300];
} drig;

static int make_dir(void **state)
{
    (void)state;
    snprintf(g_dir, sizeof(g_dir), "kvt-disk-XXXXXX"); /* in the build tree, not tmpfs */
    assert_non_null(mkdtemp(g_dir));
    return 0;
}

static int remove_dir(void **state)
{
    (void)state;
    rmdir(g_dir);
    return 0;
}

static unsigned char pat(uint64_t tag, int r, uint64_t o)
{
    uint64_t x = (tag + 7) * 0x9E3779B97F4A7C15ull ^ (uint64_t)r << 52 ^ o * 0x2545F4914F6CDD1Dull;
    return (unsigned char)(x >> 37);
}

static void fill(drig *g, uint32_t b, uint64_t tag)
{
    for (int r = 0; r < 3; r++)
        for (uint64_t o = 0; o < BPB[r]; o++)
            g->mem[r][b * BPB[r] + o] = pat(tag, r, o);
}

static void expect(drig *g, uint32_t b, uint64_t tag)
{
    for (int r = 0; r < 3; r++)
        for (uint64_t o = 0; o < BPB[r]; o++)
            if (g->mem[r][b * BPB[r] + o] != pat(tag, r, o))
                fail_msg("block %u region %d byte %llu", b, r, (unsigned long long)o);
}

/* Returns false (and skips) when the file system refuses O_DIRECT. */
static bool rig_open_as(drig *g, bool page_cache, uint32_t qd, uint64_t slots, bool aligned)
{
    memset(g, 0, sizeof(*g));
    memcpy(BPB, aligned ? BPB_ALIGNED : BPB_STAGED, sizeof(BPB));
    KVT_OK_(kvt_layout_create(KVT_HOST_DEVICE, DEV, &g->layout));
    for (int r = 0; r < 3; r++) {
        g->mem[r] = aligned_alloc(4096, (DEV * BPB[r] + 4095) / 4096 * 4096);
        memset(g->mem[r], 0, DEV * BPB[r]);
        KVT_OK_(kvt_layout_add_region(g->layout, (uint64_t)(uintptr_t)g->mem[r], BPB[r]));
    }
    snprintf(g->base, sizeof(g->base), "%s/kv", g_dir);
    kvt_disk_config dc;
    kvt_disk_config_init(&dc);
    dc.path = g->base;
    dc.rank = 3;
    dc.page_cache = page_cache;
    dc.queue_depth = qd;
    uint64_t bpb = BPB[0] + BPB[1] + BPB[2];
    dc.capacity_bytes = slots * (page_cache ? bpb : (bpb + 4095) / 4096 * 4096) + 100;
    int rc = kvt_disk_create(&dc, g->layout, &g->disk);
    if (rc == KVT_ESYS && strstr(kvt_last_error(), "O_DIRECT")) {
        printf("# %s\n", kvt_last_error());
        return false;
    }
    KVT_OK_(rc);
    return true;
}

static bool rig_open(drig *g, bool page_cache, uint32_t qd, uint64_t slots)
{
    return rig_open_as(g, page_cache, qd, slots, false);
}

static void rig_close(drig *g)
{
    kvt_disk_destroy(g->disk);
    kvt_layout_destroy(g->layout);
    for (int r = 0; r < 3; r++)
        free(g->mem[r]);
}

static int64_t wait_event(kvt_disk *d, int dir, int64_t ev)
{
    int64_t hwm = -1;
    kvt_wait w = kvt_wait_start();
    do
        KVT_OK_(kvt_disk_poll(d, dir, &hwm));
    while (hwm < ev && kvt_wait_more(&w));
    assert_true(hwm >= ev);
    return hwm;
}

static void test_file_private_and_sized(void **state)
{
    (void)state;
    char stale[320], target[320];
    snprintf(stale, sizeof(stale), "%s/kv.rank3", g_dir);
    snprintf(target, sizeof(target), "%s/victim", g_dir);
    FILE *f = fopen(target, "w");
    fputs("do not touch", f);
    fclose(f);
    assert_int_equal(symlink("victim", stale), 0); /* a planted link at the rank's path */
    drig g;
    if (!rig_open(&g, false, 4, 10) && !rig_open(&g, true, 4, 10))
        fail();
    struct stat st;
    assert_int_equal(lstat(kvt_disk_path(g.disk), &st), 0);
    assert_true(S_ISREG(st.st_mode));
    assert_int_equal(st.st_mode & 0777, 0600);
    assert_int_equal(kvt_disk_num_slots(g.disk), 10);
    assert_int_equal((uint64_t)st.st_size, 10 * kvt_disk_slot_bytes(g.disk));
    assert_int_equal(stat(target, &st), 0);
    assert_int_equal(st.st_size, 12); /* the link's target was never written */
    char path[320];
    snprintf(path, sizeof(path), "%s", kvt_disk_path(g.disk));
    rig_close(&g);
    assert_int_equal(access(path, F_OK), -1); /* unlinked at shutdown */
    unlink(target);
}

static void test_config_errors(void **state)
{
    (void)state;
    kvt_layout *l;
    KVT_OK_(kvt_layout_create(KVT_HOST_DEVICE, 4, &l));
    KVT_OK_(kvt_layout_add_region(l, 4096, 5000));
    kvt_disk_config dc;
    kvt_disk_config_init(&dc);
    kvt_disk *d;
    KVT_ERR_(kvt_disk_create(&dc, l, &d), KVT_EINVAL); /* no path */
    char base[300];
    snprintf(base, sizeof(base), "%s/cfg", g_dir);
    dc.path = base;
    dc.capacity_bytes = 8191; /* one slot is 8192 */
    KVT_ERR_(kvt_disk_create(&dc, l, &d), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "smaller than one disk slot"));
    dc.capacity_bytes = 1 << 20;
    dc.alignment = 3000;
    KVT_ERR_(kvt_disk_create(&dc, l, &d), KVT_EINVAL);
    dc.alignment = 4096;
    dc.queue_depth = 0;
    KVT_ERR_(kvt_disk_create(&dc, l, &d), KVT_EINVAL);
    kvt_layout_destroy(l);
    KVT_OK_(kvt_layout_create(0, 4, &l));
    KVT_OK_(kvt_layout_add_region(l, 4096, 5000));
    kvt_disk_config_init(&dc);
    dc.path = base;
    dc.capacity_bytes = 1 << 20;
    if (!kvt_cuda_available()) /* device memory needs a driver */
        KVT_ERR_(kvt_disk_create(&dc, l, &d), KVT_EUNSUPPORTED);
    kvt_layout_destroy(l);
    snprintf(base, sizeof(base), "%s/no/such/dir/kv", g_dir);
    KVT_OK_(kvt_layout_create(KVT_HOST_DEVICE, 4, &l));
    KVT_OK_(kvt_layout_add_region(l, 4096, 5000));
    dc.path = base;
    KVT_ERR_(kvt_disk_create(&dc, l, &d), KVT_ESYS);
    assert_non_null(strstr(kvt_last_error(), "no/such/dir"));
    kvt_layout_destroy(l);
}

static void roundtrip(bool page_cache, uint32_t qd, bool aligned)
{
    drig g;
    if (!rig_open_as(&g, page_cache, qd, 64, aligned))
        KVT_SKIP("direct I/O: the file system under %s refuses O_DIRECT", g_dir);
    uint64_t seed = kvt_test_seed();
    uint64_t slot_tag[64] = {0};
    int64_t sev = 0, lev = 0;
    for (int round = 0; round < 12; round++) {
        uint32_t n = 1 + kvt_test_below(&seed, 20), src[20], dst[20];
        for (uint32_t i = 0; i < n; i++) {
            src[i] = (uint32_t)(i * 2 + round) % DEV;
            dst[i] = (uint32_t)(i * 3 + round * 5) % 64;
            uint64_t tag = (uint64_t)round * 1000 + i;
            fill(&g, src[i], tag);
            slot_tag[dst[i]] = tag;
        }
        /* one event per block set: destinations distinct within it */
        KVT_OK_(kvt_disk_submit(g.disk, KVT_COPY_STORE, sev, src, dst, n, NULL));
        wait_event(g.disk, KVT_COPY_STORE, sev++);
        uint32_t back[20];
        for (uint32_t i = 0; i < n; i++)
            back[i] = (src[i] + 20) % DEV;
        KVT_OK_(kvt_disk_submit(g.disk, KVT_COPY_LOAD, lev, dst, back, n, NULL));
        KVT_OK_(kvt_disk_flush(g.disk));
        wait_event(g.disk, KVT_COPY_LOAD, lev++);
        for (uint32_t i = 0; i < n; i++)
            expect(&g, back[i], slot_tag[dst[i]]);
    }
    int64_t failed[4];
    uint32_t inv[4];
    assert_int_equal(kvt_disk_take_failed(g.disk, failed, 4), 0);
    assert_int_equal(kvt_disk_take_invalid_blocks(g.disk, inv, 4), 0);
    rig_close(&g);
}

static void test_roundtrip_direct(void **state)
{
    (void)state;
    roundtrip(false, 1, false);
    roundtrip(false, 8, false);
    roundtrip(false, 4, true);
}

static void test_roundtrip_page_cache(void **state)
{
    (void)state;
    roundtrip(true, 4, false);
    roundtrip(true, 2, true);
}

static void test_ids_checked(void **state)
{
    (void)state;
    drig g;
    if (!rig_open(&g, false, 4, 8) && !rig_open(&g, true, 4, 8))
        fail();
    uint32_t a[2] = {1, DEV}, b[2] = {1, 2}, s[2] = {1, 8};
    KVT_ERR_(kvt_disk_submit(g.disk, KVT_COPY_STORE, 0, a, b, 2, NULL), KVT_ERANGE);
    KVT_ERR_(kvt_disk_submit(g.disk, KVT_COPY_STORE, 0, b, s, 2, NULL), KVT_ERANGE);
    KVT_ERR_(kvt_disk_submit(g.disk, KVT_COPY_LOAD, 0, s, b, 2, NULL), KVT_ERANGE);
    KVT_ERR_(kvt_disk_submit(g.disk, KVT_COPY_LOAD, 0, b, b, 0, NULL), KVT_EINVAL);
    KVT_OK_(kvt_disk_submit(g.disk, KVT_COPY_STORE, 4, b, b, 2, NULL));
    KVT_ERR_(kvt_disk_submit(g.disk, KVT_COPY_STORE, 4, b, b, 2, NULL), KVT_EINVAL);
    KVT_OK_(kvt_disk_flush(g.disk));
    assert_int_equal(kvt_disk_outstanding(g.disk, KVT_COPY_STORE), 1);
    wait_event(g.disk, KVT_COPY_STORE, 4);
    assert_int_equal(kvt_disk_outstanding(g.disk, KVT_COPY_STORE), 0);
    rig_close(&g);
}

/* Fails the I/O of chosen slots: EIO for slot 5, a short transfer for slot 6. */
static int faulty(void *ctx, int dir, uint32_t slot, int res)
{
    (void)ctx;
    (void)dir;
    if (slot == 5)
        return -EIO;
    if (slot == 6)
        return res > 512 ? res - 512 : 0;
    return res;
}

static void io_errors(bool aligned)
{
    drig g;
    if (!rig_open_as(&g, false, 2, 16, aligned) && !rig_open_as(&g, true, 2, 16, aligned))
        fail();
    /* healthy store of slots 5 and 6 first (to load from later) */
    uint32_t src[4] = {1, 2, 3, 4}, dst[4] = {4, 5, 6, 7};
    for (uint32_t i = 0; i < 4; i++)
        fill(&g, src[i], 100 + i);
    KVT_OK_(kvt_disk_submit(g.disk, KVT_COPY_STORE, 0, src, dst, 4, NULL));
    wait_event(g.disk, KVT_COPY_STORE, 0);
    kvt_disk_set_fault(g.disk, faulty, NULL);
    /* a store touching slot 5: the event completes and is listed as failed */
    uint32_t s2[2] = {8, 9}, d2[2] = {5, 9};
    KVT_OK_(kvt_disk_submit(g.disk, KVT_COPY_STORE, 1, s2, d2, 2, NULL));
    uint32_t s3[1] = {10}, d3[1] = {10};
    KVT_OK_(kvt_disk_submit(g.disk, KVT_COPY_STORE, 2, s3, d3, 1, NULL));
    wait_event(g.disk, KVT_COPY_STORE, 2);
    int64_t failed[4];
    assert_int_equal(kvt_disk_take_failed(g.disk, failed, 4), 1);
    assert_int_equal(failed[0], 1);
    assert_int_equal(kvt_disk_take_failed(g.disk, failed, 4), 0);
    /* a load of slots 4..7 into device 20..23: 5 (EIO) and 6 (short) invalid, 4 and 7 fine */
    uint32_t ls[4] = {4, 5, 6, 7}, ld[4] = {20, 21, 22, 23};
    KVT_OK_(kvt_disk_submit(g.disk, KVT_COPY_LOAD, 0, ls, ld, 4, NULL));
    wait_event(g.disk, KVT_COPY_LOAD, 0);
    uint32_t inv[8];
    uint32_t n = kvt_disk_take_invalid_blocks(g.disk, inv, 8);
    assert_int_equal(n, 2);
    assert_true((inv[0] == 21 && inv[1] == 22) || (inv[0] == 22 && inv[1] == 21));
    expect(&g, 20, 100);
    expect(&g, 23, 103);
    assert_int_equal(kvt_disk_take_failed(g.disk, failed, 4), 0); /* loads are not "failed" */
    kvt_disk_stats st;
    kvt_disk_get_stats(g.disk, &st);
    assert_int_equal(st.io_errors[KVT_COPY_STORE], 1);
    assert_int_equal(st.io_errors[KVT_COPY_LOAD], 2);
    assert_int_equal(st.events_done[KVT_COPY_STORE], 3);
    assert_int_equal(st.blocks[KVT_COPY_LOAD], 4);
    assert_int_equal(st.bytes[KVT_COPY_LOAD], 2 * kvt_disk_slot_bytes(g.disk));
    assert_int_equal(st.fatal, 0);
    char text[4096];
    size_t len;
    KVT_OK_(kvt_disk_prometheus(g.disk, text, sizeof(text), &len));
    KVT_PROMTOOL_OK(text);
    assert_non_null(strstr(text, "kvtier_disk_io_errors_total{direction=\"read\"} 2\n"));
    rig_close(&g);
}

static void test_io_errors_fail_one_block(void **state)
{
    (void)state;
    io_errors(false);
    io_errors(true);
}

static int fatal_fault(void *ctx, int dir, uint32_t slot, int res)
{
    (void)ctx;
    (void)dir;
    return slot == 3 ? KVT_DISK_FAULT_FATAL : res;
}

static void test_fatal_is_sticky(void **state)
{
    (void)state;
    drig g;
    if (!rig_open(&g, false, 2, 8) && !rig_open(&g, true, 2, 8))
        fail();
    kvt_disk_set_fault(g.disk, fatal_fault, NULL);
    uint32_t s[2] = {1, 2}, d[2] = {2, 3};
    KVT_OK_(kvt_disk_submit(g.disk, KVT_COPY_STORE, 0, s, d, 2, NULL));
    KVT_ERR_(kvt_disk_flush(g.disk), KVT_EIO);
    assert_non_null(strstr(kvt_last_error(), "kv.rank3"));
    assert_non_null(strstr(kvt_last_error(), "fatal"));
    int64_t hwm;
    KVT_ERR_(kvt_disk_poll(g.disk, KVT_COPY_STORE, &hwm), KVT_EIO);
    KVT_ERR_(kvt_disk_poll(g.disk, KVT_COPY_LOAD, &hwm), KVT_EIO);
    KVT_ERR_(kvt_disk_submit(g.disk, KVT_COPY_LOAD, 0, d, s, 2, NULL), KVT_EIO);
    rig_close(&g);
}

/* ---- the worker on a disk tier ------------------------------------------------------------ */

/* One step: bind, launch, wait for the disk, collect the reports. */
static uint32_t worker_step(kvt_worker *w, kvt_offload_meta *m, kvt_offload_worker_meta *wm,
                            const kvt_str **reqs)
{
    static kvt_str all[16]; /* the strings live in the bound metadata */
    uint32_t n = 0, got;
    const kvt_str *fin;
    KVT_OK_(kvt_worker_bind(w, m));
    KVT_OK_(kvt_worker_handle_preemptions(w));
    KVT_OK_(kvt_worker_get_finished(w, NULL, &fin, &got)); /* launches; may report already */
    for (uint32_t i = 0; i < got && n < 16; i++)
        all[n++] = fin[i];
    KVT_OK_(kvt_worker_flush(w));
    KVT_OK_(kvt_worker_get_finished(w, NULL, &fin, &got));
    for (uint32_t i = 0; i < got && n < 16; i++)
        all[n++] = fin[i];
    KVT_OK_(kvt_worker_build_meta(w, wm));
    *reqs = all;
    return n;
}

static void test_worker_on_disk(void **state)
{
    (void)state;
    drig g;
    if (!rig_open_as(&g, false, 4, 32, true) && !rig_open_as(&g, true, 4, 32, true))
        fail();
    kvt_worker_config wc;
    kvt_worker_config_init(&wc);
    kvt_worker *w;
    KVT_OK_(kvt_worker_create_disk(&wc, g.layout, g.disk, &w));
    assert_null(kvt_worker_copy(w));
    kvt_offload_meta m;
    kvt_offload_meta_init(&m);
    kvt_offload_worker_meta wm;
    kvt_offload_worker_meta_init(&wm);
    const kvt_str *reqs;
    for (uint32_t b = 1; b <= 4; b++)
        fill(&g, b, 40 + b);
    m.store_event = 0;
    for (uint32_t b = 1; b <= 4; b++)
        KVT_OK_(kvt_offload_meta_add_store(&m, b, 9 + b));
    worker_step(w, &m, &wm, &reqs);
    kvt_worker_clear(w);
    assert_int_equal(wm.stores.n_completed, 1);
    assert_int_equal(wm.stores.n_failed, 0);
    /* slot 32 does not exist: refused at bind */
    kvt_offload_meta_clear(&m);
    m.store_event = 1;
    KVT_OK_(kvt_offload_meta_add_store(&m, 1, 32));
    KVT_ERR_(kvt_worker_bind(w, &m), KVT_ERANGE);
    kvt_offload_meta_clear(&m);
    m.load_event = 0;
    for (uint32_t b = 1; b <= 4; b++)
        KVT_OK_(kvt_offload_meta_add_load(&m, 20 + b, 9 + b));
    KVT_OK_(kvt_offload_meta_add_load_req(&m, 0, "r1", 2));
    assert_int_equal(worker_step(w, &m, &wm, &reqs), 1);
    assert_string_equal(reqs[0].ptr, "r1");
    kvt_worker_clear(w);
    for (uint32_t b = 1; b <= 4; b++)
        expect(&g, 20 + b, 40 + b);
    uint32_t inv[4];
    assert_int_equal(kvt_worker_take_invalid_blocks(w, inv, 4), 0);
    kvt_worker_destroy(w);
    kvt_offload_meta_release(&m);
    kvt_offload_worker_meta_release(&wm);
    rig_close(&g);
}

static int fault_slot(void *ctx, int dir, uint32_t slot, int res)
{
    uint32_t *which = ctx;
    (void)dir;
    if (slot == which[0])
        return -EIO;
    if (slot == which[1])
        return KVT_DISK_FAULT_FATAL;
    return res;
}

/* I/O errors fail single transfers; a fatal error turns the tier off and everything after it
 * fails at once, while the worker keeps answering every step. */
static void test_worker_disk_failures(void **state)
{
    (void)state;
    drig g;
    if (!rig_open_as(&g, false, 2, 32, false) && !rig_open_as(&g, true, 2, 32, false))
        fail();
    uint32_t which[2] = {11, UINT32_MAX};
    kvt_disk_set_fault(g.disk, fault_slot, which);
    kvt_worker_config wc;
    kvt_worker_config_init(&wc);
    kvt_worker *w;
    KVT_OK_(kvt_worker_create_disk(&wc, g.layout, g.disk, &w));
    kvt_offload_meta m;
    kvt_offload_meta_init(&m);
    kvt_offload_worker_meta wm;
    kvt_offload_worker_meta_init(&wm);
    const kvt_str *reqs;
    /* store into slots 10..12, 11 fails: completed and failed */
    m.store_event = 0;
    for (uint32_t b = 1; b <= 3; b++)
        KVT_OK_(kvt_offload_meta_add_store(&m, b, 9 + b));
    worker_step(w, &m, &wm, &reqs);
    kvt_worker_clear(w);
    assert_int_equal(wm.stores.n_completed, 1);
    assert_int_equal(wm.stores.n_failed, 1);
    assert_true(kvt_offload_worker_meta_failed(&wm, 0));
    /* load from 10..12: 11 fails, its destination is invalid, the request still finishes */
    kvt_offload_meta_clear(&m);
    m.load_event = 0;
    for (uint32_t b = 0; b < 3; b++)
        KVT_OK_(kvt_offload_meta_add_load(&m, 20 + b, 10 + b));
    KVT_OK_(kvt_offload_meta_add_load_req(&m, 0, "r", 1));
    assert_int_equal(worker_step(w, &m, &wm, &reqs), 1);
    kvt_worker_clear(w);
    uint32_t inv[8];
    assert_int_equal(kvt_worker_take_invalid_blocks(w, inv, 8), 1);
    assert_int_equal(inv[0], 21);
    /* and its source goes to the manager, which forgets it (issue 37) */
    assert_int_equal(wm.n_failed_load_src, 1);
    assert_int_equal(wm.failed_load_src[0], 11);
    /* a fatal error on slot 5 */
    which[1] = 5;
    kvt_offload_meta_clear(&m);
    m.store_event = 1;
    KVT_OK_(kvt_offload_meta_add_store(&m, 4, 5));
    KVT_OK_(kvt_offload_meta_add_store(&m, 5, 6));
    worker_step(w, &m, &wm, &reqs);
    kvt_worker_clear(w);
    assert_true(kvt_offload_worker_meta_failed(&wm, 1));
    /* the tier is off: the next store fails at once, the next load too, all reported */
    kvt_offload_meta_clear(&m);
    m.store_event = 2;
    KVT_OK_(kvt_offload_meta_add_store(&m, 6, 7));
    m.load_event = 1;
    KVT_OK_(kvt_offload_meta_add_load(&m, 30, 10));
    KVT_OK_(kvt_offload_meta_add_load(&m, 31, 12));
    KVT_OK_(kvt_offload_meta_add_load_req(&m, 1, "s", 1));
    assert_int_equal(worker_step(w, &m, &wm, &reqs), 1);
    assert_string_equal(reqs[0].ptr, "s");
    kvt_worker_clear(w);
    assert_true(kvt_offload_worker_meta_failed(&wm, 2));
    assert_int_equal(kvt_worker_take_invalid_blocks(w, inv, 8), 2);
    assert_int_equal(wm.n_failed_load_src, 2); /* this step's: both, with the tier off */
    assert_int_equal(wm.failed_load_src[0], 10);
    assert_int_equal(wm.failed_load_src[1], 12);
    assert_int_equal(kvt_worker_pending(w, KVT_COPY_LOAD), 0);
    assert_int_equal(kvt_worker_pending(w, KVT_COPY_STORE), 0);
    kvt_worker_destroy(w);
    kvt_offload_meta_release(&m);
    kvt_offload_worker_meta_release(&wm);
    rig_close(&g);
}

static void fill_host(const kvt_mirror *mi, uint32_t h, unsigned char v)
{
    const kvt_region *r = kvt_mirror_regions(mi);
    for (uint32_t i = 0; i < kvt_mirror_num_regions(mi); i++)
        memset((unsigned char *)(uintptr_t)(r[i].base + h * r[i].block_bytes), v, r[i].block_bytes);
}

/* Three tiers on one worker: GPU -> host mirror -> disk slots and back, byte for byte; the
 * manager's invalid load destinations reported; a failed promotion and a fatal disk error
 * reported per event while the host tier keeps working; misuse refused. */
static void test_worker_three_tiers(void **state)
{
    (void)state;
    drig g; /* its "device" memory and layout; its own disk is the wrong one to attach */
    if (!rig_open_as(&g, false, 2, 32, true) && !rig_open_as(&g, true, 2, 32, true))
        fail();
    kvt_mirror_config mc;
    kvt_mirror_config_init(&mc);
    mc.host_blocks = 16;
    kvt_mirror *mi;
    KVT_OK_(kvt_mirror_create(&mc, g.layout, &mi));
    kvt_layout *ml;
    KVT_OK_(kvt_mirror_layout(mi, &ml));
    assert_int_equal(kvt_layout_num_blocks(ml), 16);
    assert_int_equal(kvt_layout_num_regions(ml), 3);
    kvt_disk_config dc;
    kvt_disk_config_init(&dc);
    char base[300];
    snprintf(base, sizeof(base), "%s/three", g_dir);
    dc.path = base;
    dc.page_cache = true;
    dc.capacity_bytes = 16 * (8192 + 4096 + 4096);
    kvt_disk *d;
    KVT_OK_(kvt_disk_create(&dc, ml, &d));
    uint32_t which[2] = {UINT32_MAX, UINT32_MAX};
    kvt_disk_set_fault(d, fault_slot, which);
    kvt_worker_config wc;
    kvt_worker_config_init(&wc);
    wc.copy.threads = 1;
    kvt_worker *w, *dw;
    KVT_OK_(kvt_worker_create(&wc, g.layout, mi, &w));
    kvt_offload_meta m;
    kvt_offload_meta_init(&m);
    kvt_offload_worker_meta wm;
    kvt_offload_worker_meta_init(&wm);
    const kvt_str *reqs;
    /* metadata with disk lists needs an attached disk */
    m.tiers[0].store_event = 0;
    KVT_OK_(kvt_offload_meta_add_tier_store(&m, 1, 1, 1));
    KVT_ERR_(kvt_worker_bind(w, &m), KVT_EINVAL);
    /* the disk must be over the mirror's layout; one disk per worker; not on a disk worker */
    KVT_ERR_(kvt_worker_attach_disk(w, g.disk), KVT_EINVAL);
    KVT_OK_(kvt_worker_attach_disk(w, d));
    KVT_ERR_(kvt_worker_attach_disk(w, d), KVT_ESTATE);
    KVT_OK_(kvt_worker_create_disk(&wc, g.layout, g.disk, &dw));
    KVT_ERR_(kvt_worker_attach_disk(dw, d), KVT_ESTATE);
    kvt_worker_destroy(dw);
    /* GPU 1..3 -> host 1..3 */
    kvt_offload_meta_clear(&m);
    for (uint32_t b = 1; b <= 3; b++)
        fill(&g, b, 100 + b);
    m.store_event = 0;
    for (uint32_t b = 1; b <= 3; b++)
        KVT_OK_(kvt_offload_meta_add_store(&m, b, b));
    worker_step(w, &m, &wm, &reqs);
    kvt_worker_clear(w);
    assert_int_equal(wm.stores.n_completed, 1);
    /* host 1..3 -> slots 4..6 */
    kvt_offload_meta_clear(&m);
    m.tiers[0].store_event = 0;
    for (uint32_t b = 1; b <= 3; b++)
        KVT_OK_(kvt_offload_meta_add_tier_store(&m, 1, b, 3 + b));
    worker_step(w, &m, &wm, &reqs);
    kvt_worker_clear(w);
    assert_int_equal(wm.tier_stores[0].n_completed, 1);
    assert_int_equal(wm.tier_stores[0].n_failed, 0);
    assert_int_equal(wm.stores.n_completed, 0);
    for (uint32_t h = 1; h <= 3; h++) /* the host tier forgets them */
        fill_host(mi, h, 0xEE);
    /* slots 4..6 -> host 7..9, then host 7..9 -> GPU 10..12 with 12 declared invalid */
    kvt_offload_meta_clear(&m);
    m.tiers[0].load_event = 0;
    for (uint32_t b = 1; b <= 3; b++)
        KVT_OK_(kvt_offload_meta_add_tier_load(&m, 1, 3 + b, 6 + b));
    worker_step(w, &m, &wm, &reqs);
    kvt_worker_clear(w);
    assert_int_equal(wm.tier_loads[0].n_completed, 1);
    assert_int_equal(wm.tier_loads[0].n_failed, 0);
    kvt_offload_meta_clear(&m);
    m.load_event = 0;
    for (uint32_t b = 1; b <= 3; b++)
        KVT_OK_(kvt_offload_meta_add_load(&m, 9 + b, 6 + b));
    KVT_OK_(kvt_offload_meta_add_load_req(&m, 0, "r", 1));
    KVT_OK_(kvt_offload_meta_add_load_invalid(&m, 12));
    assert_int_equal(worker_step(w, &m, &wm, &reqs), 1);
    kvt_worker_clear(w);
    for (uint32_t b = 1; b <= 3; b++)
        expect(&g, 9 + b, 100 + b); /* three tiers there and back */
    uint32_t inv[8];
    assert_int_equal(kvt_worker_take_invalid_blocks(w, inv, 8), 1);
    assert_int_equal(inv[0], 12);
    /* a promotion from slot 5 fails: that event is reported failed, nothing is invalid */
    which[0] = 5;
    kvt_offload_meta_clear(&m);
    m.tiers[0].load_event = 1;
    KVT_OK_(kvt_offload_meta_add_tier_load(&m, 1, 4, 10));
    KVT_OK_(kvt_offload_meta_add_tier_load(&m, 1, 5, 11));
    worker_step(w, &m, &wm, &reqs);
    kvt_worker_clear(w);
    assert_true(kvt_event_report_failed(&wm.tier_loads[0], 1));
    assert_int_equal(kvt_worker_take_invalid_blocks(w, inv, 8), 0);
    /* a fatal error on a write-back turns the third tier off; the host tier keeps working */
    which[1] = 6;
    kvt_offload_meta_clear(&m);
    m.tiers[0].store_event = 1;
    KVT_OK_(kvt_offload_meta_add_tier_store(&m, 1, 1, 6));
    worker_step(w, &m, &wm, &reqs);
    kvt_worker_clear(w);
    assert_true(kvt_event_report_failed(&wm.tier_stores[0], 1));
    kvt_offload_meta_clear(&m);
    m.tiers[0].load_event = 2;
    KVT_OK_(kvt_offload_meta_add_tier_load(&m, 1, 4, 12));
    m.store_event = 1;
    fill(&g, 5, 555);
    KVT_OK_(kvt_offload_meta_add_store(&m, 5, 13));
    worker_step(w, &m, &wm, &reqs);
    kvt_worker_clear(w);
    assert_true(kvt_event_report_failed(&wm.tier_loads[0], 2));
    assert_int_equal(wm.stores.n_completed, 1);
    assert_int_equal(wm.stores.n_failed, 0);
    assert_int_equal(kvt_worker_pending(w, 2 + KVT_COPY_LOAD), 0);
    assert_int_equal(kvt_worker_pending(w, 2 + KVT_COPY_STORE), 0);
    kvt_worker_destroy(w);
    kvt_disk_destroy(d);
    kvt_layout_destroy(ml);
    kvt_mirror_destroy(mi);
    kvt_offload_meta_release(&m);
    kvt_offload_worker_meta_release(&wm);
    rig_close(&g);
}

/* ---- a tier of its own kind ------------------------------------------------------------ */

/* What a new kind of tier costs: an in-memory "far" tier (a CXL pool, another host's memory)
 * with injected latency. Its whole implementation is this backend — it answers the worker's
 * transfer interface (port/xfer.h), moving blocks between the host mirror and its own memory —
 * plus its registration: kvt_offload_add_tier on the scheduler side, kvi_worker_attach_xfer on
 * the worker. Nothing in the offload manager knows it. */
#define FAR_Q 64
typedef struct far_tier {
    kvi_xfer_port port; /* first: the worker reaches the backend through it */
    const kvt_mirror *mirror;
    unsigned char *mem; /* nb blocks, each the mirror's regions' bytes in order */
    uint64_t block_bytes;
    uint32_t delay; /* polls an event waits before it completes */
    bool fail_stores;
    struct {
        int64_t ev[FAR_Q], failed[FAR_Q], hwm;
        uint32_t due[FAR_Q], n, n_failed;
        bool bad[FAR_Q];
    } q[2];
} far_tier;

static void far_copy(far_tier *f, uint32_t host, uint32_t blk, bool to_far)
{
    const kvt_region *r = kvt_mirror_regions(f->mirror);
    unsigned char *p = f->mem + blk * f->block_bytes;
    for (uint32_t i = 0; i < kvt_mirror_num_regions(f->mirror); i++) {
        unsigned char *h = (unsigned char *)(uintptr_t)(r[i].base + host * r[i].block_bytes);
        memcpy(to_far ? p : h, to_far ? h : p, r[i].block_bytes);
        p += r[i].block_bytes;
    }
}

static int far_submit(void *impl, int dir, int64_t event, const uint32_t *src, const uint32_t *dst,
                      uint32_t n, void *wait)
{
    far_tier *f = impl;
    (void)wait;
    if (f->q[dir].n == FAR_Q)
        return kvt_fail(KVT_ENOSPC, "far tier: queue full");
    bool bad = dir == KVT_COPY_STORE && f->fail_stores;
    for (uint32_t i = 0; i < n; i++) /* store: host -> far; load: far -> host */
        if (!bad)
            far_copy(f, dir == KVT_COPY_STORE ? src[i] : dst[i],
                     dir == KVT_COPY_STORE ? dst[i] : src[i], dir == KVT_COPY_STORE);
    uint32_t k = f->q[dir].n++;
    f->q[dir].ev[k] = event;
    f->q[dir].due[k] = f->delay;
    f->q[dir].bad[k] = bad;
    return 0;
}

static int far_poll(void *impl, int dir, int64_t *hwm)
{
    far_tier *f = impl;
    while (f->q[dir].n && f->q[dir].due[0]-- == 0) {
        if (f->q[dir].bad[0])
            f->q[dir].failed[f->q[dir].n_failed++] = f->q[dir].ev[0];
        f->q[dir].hwm = f->q[dir].ev[0];
        f->q[dir].n--;
        memmove(f->q[dir].ev, f->q[dir].ev + 1, f->q[dir].n * sizeof(int64_t));
        memmove(f->q[dir].due, f->q[dir].due + 1, f->q[dir].n * sizeof(uint32_t));
        memmove(f->q[dir].bad, f->q[dir].bad + 1, f->q[dir].n * sizeof(bool));
    }
    *hwm = f->q[dir].hwm;
    return 0;
}

static uint32_t far_take_failed(void *impl, int dir, int64_t *out, uint32_t cap)
{
    far_tier *f = impl;
    uint32_t n = f->q[dir].n_failed < cap ? f->q[dir].n_failed : cap;
    memcpy(out, f->q[dir].failed, n * sizeof(int64_t));
    f->q[dir].n_failed -= n;
    memmove(f->q[dir].failed, f->q[dir].failed + n, f->q[dir].n_failed * sizeof(int64_t));
    return n;
}

static int far_flush(void *impl)
{
    far_tier *f = impl;
    for (int d = 0; d < 2; d++) {
        for (uint32_t i = 0; i < f->q[d].n; i++)
            f->q[d].due[i] = 0;
        int64_t hwm;
        far_poll(f, d, &hwm);
    }
    return 0;
}

static uint32_t far_outstanding(const void *impl, int dir)
{
    return ((const far_tier *)impl)->q[dir].n;
}

static const kvi_xfer_ops far_ops = {
    .name = "far",
    .submit = far_submit,
    .poll = far_poll,
    .take_failed = far_take_failed,
    .take_invalid = NULL, /* failures per event */
    .flush = far_flush,
    .outstanding = far_outstanding,
};

/* ---- a chain of tiers under the real manager and worker --------------------------------- */

#define CH_GPU 64
#define CH_BPB 4096

static bool g_fail_stores; /* the disk of tier 1 fails every write while set */

static int fail_stores(void *ctx, int dir, uint32_t slot, int res)
{
    (void)ctx;
    (void)slot;
    return dir == KVT_COPY_STORE && g_fail_stores ? -EIO : res;
}

typedef struct chain {
    sim s;
    unsigned char *kv;
    kvt_layout *layout, *ml;
    kvt_mirror *mirror;
    kvt_disk *d[2];
    far_tier *far; /* with far: tier 1, and the disk d[1] tier 2 */
    kvt_worker *w;
} chain;

static void chain_open(chain *c, uint32_t host_blocks, bool far)
{
    memset(c, 0, sizeof(*c));
    sim_init3(&c->s, CH_GPU, host_blocks, false, 1, 64, far ? 0 : 32);
    if (far)
        KVT_OK_(kvt_offload_add_tier(c->s.m, "far", 32, NULL));
    KVT_OK_(kvt_offload_add_tier(c->s.m, far ? "disk" : "disk2", 32, NULL));
    sim_host_kv(CH_GPU, CH_BPB, &c->kv, &c->layout);
    kvt_mirror_config mc;
    kvt_mirror_config_init(&mc);
    mc.host_blocks = host_blocks;
    KVT_OK_(kvt_mirror_create(&mc, c->layout, &c->mirror));
    KVT_OK_(kvt_mirror_layout(c->mirror, &c->ml));
    kvt_worker_config wc;
    kvt_worker_config_init(&wc);
    wc.copy.threads = 1;
    KVT_OK_(kvt_worker_create(&wc, c->layout, c->mirror, &c->w));
    for (int i = far ? 1 : 0; i < 2; i++) {
        kvt_disk_config dc;
        kvt_disk_config_init(&dc);
        char base[300];
        snprintf(base, sizeof(base), "%s/chain%d", g_dir, i + 1);
        dc.path = base;
        dc.page_cache = true;
        dc.capacity_bytes = 32ull * 2 * CH_BPB;
        KVT_OK_(kvt_disk_create(&dc, c->ml, &c->d[i]));
        assert_int_equal(kvt_disk_num_slots(c->d[i]), 32);
    }
    if (far) {
        far_tier *f = c->far = calloc(1, sizeof(*f));
        assert_non_null(f);
        f->mirror = c->mirror;
        f->block_bytes = 2 * CH_BPB;
        f->mem = calloc(32, f->block_bytes);
        assert_non_null(f->mem);
        f->delay = 3;
        f->q[0].hwm = f->q[1].hwm = -1;
        f->port = (kvi_xfer_port){&far_ops, c->ml, 32};
        KVT_OK_(kvi_worker_attach_xfer(c->w, 1, &f->port, f, "far"));
        KVT_OK_(kvt_worker_attach_disk_tier(c->w, 2, c->d[1]));
        return;
    }
    kvt_disk_set_fault(c->d[0], fail_stores, NULL);
    KVT_ERR_(kvt_worker_attach_disk_tier(c->w, 4, c->d[1]), KVT_ERANGE);
    KVT_OK_(kvt_worker_attach_disk_tier(c->w, 2, c->d[1]));
    KVT_ERR_(kvt_worker_attach_disk_tier(c->w, 1, c->d[1]), KVT_EINVAL); /* tier 2 already */
    KVT_OK_(kvt_worker_attach_disk(c->w, c->d[0]));
}

static void chain_close(chain *c)
{
    kvt_worker_destroy(c->w);
    for (int i = 0; i < 2; i++)
        kvt_disk_destroy(c->d[i]);
    if (c->far) {
        free(c->far->mem);
        free(c->far);
    }
    kvt_layout_destroy(c->ml);
    kvt_mirror_destroy(c->mirror);
    kvt_layout_destroy(c->layout);
    free(c->kv);
    sim_fini(&c->s);
}

/* Steps until nothing is pending (write-backs and promotions take a few steps). */
static void chain_drain(chain *c)
{
    for (int i = 0; i < 3 || (i < 30 && kvt_offload_has_pending(c->s.m)); i++)
        sim_worker_step(&c->s, c->w);
    assert_false(kvt_offload_has_pending(c->s.m));
}

/* Computes q's prompt (bytes tagged by each block's hash), stores it and lets every transfer
 * it causes land (the host store, then the write-backs into the tiers behind). */
static void chain_store(chain *c, sim_req *q)
{
    sim_admit(&c->s, q, 0);
    sim_kv_write(c->kv, CH_GPU, CH_BPB, q, q->n_tokens / SIM_BS);
    sim_compute(&c->s, q, q->n_tokens);
    sim_schedule(&c->s, q, 1, false);
    sim_worker_step(&c->s, c->w);
    sim_finish(&c->s, q);
    chain_drain(c);
}

/* Stores other prompts until the host tier holds none of q's 4 blocks; the engine's prefix
 * cache and its "device" bytes are then cleared. */
static void chain_push_out(chain *c, const sim_req *q)
{
    for (uint32_t i = 0; i < 8 && (sim_host_has(&c->s, q, 0) || sim_host_has(&c->s, q, 1) ||
                                   sim_host_has(&c->s, q, 2) || sim_host_has(&c->s, q, 3));
         i++) {
        sim_req o;
        char id[16];
        snprintf(id, sizeof(id), "o%u", i);
        sim_req_make(&o, id, 4 * SIM_BS + 1, 50 + i, 4 * SIM_BS + 1, 50 + i);
        chain_store(c, &o);
    }
    for (uint32_t j = 0; j < 4; j++)
        assert_false(sim_host_has(&c->s, q, j));
    KVT_OK_(kvt_pool_reset_prefix_cache(c->s.gpu));
    memset(c->kv, 0, 2ull * CH_GPU * CH_BPB);
}

/* A chain of two tiers behind the host: the host's stores are written back into both from the
 * host mirror; tier 1 failing its writes of a prompt's last two blocks leaves tier 2's copies;
 * the prompt, once out of the host, comes back from both tiers at once (each the part it
 * holds) in one GPU load, and the GPU gets the bytes that were computed, every byte checked. */
static void chain_hit_across_two_tiers(bool far)
{
    chain c;
    chain_open(&c, 8, far);
    bool *fail = far ? &c.far->fail_stores : &g_fail_stores;
    sim_req x, a, b;
    sim_req_make(&x, "x", 2 * SIM_BS + 1, 1, 2 * SIM_BS, 9); /* a's first two blocks */
    chain_store(&c, &x);
    sim_req_make(&a, "a", 4 * SIM_BS + 1, 1, 4 * SIM_BS + 1, 0);
    *fail = true;
    chain_store(&c, &a);
    *fail = false;
    kvt_tier_stats t1, t2;
    KVT_OK_(kvt_offload_get_tier_stats(c.s.m, 1, &t1));
    KVT_OK_(kvt_offload_get_tier_stats(c.s.m, 2, &t2));
    assert_string_equal(t1.name, far ? "far" : "disk");
    assert_int_equal(t1.stores_completed, 2);
    assert_int_equal(t1.stores_failed, 2);
    assert_int_equal(t2.stores_completed, 4);
    chain_push_out(&c, &a);

    sim_req_make(&b, "b", 4 * SIM_BS + 1, 1, 4 * SIM_BS + 1, 0);
    assert_int_equal(sim_admit(&c.s, &b, UINT32_MAX), 4 * SIM_BS);
    chain_drain(&c); /* promotions out of both tiers, then the GPU load */
    KVT_OK_(kvt_offload_get_tier_stats(c.s.m, 1, &t1));
    KVT_OK_(kvt_offload_get_tier_stats(c.s.m, 2, &t2));
    assert_int_equal(t1.hit_tokens, 2 * SIM_BS);
    assert_int_equal(t2.hit_tokens, 2 * SIM_BS);
    assert_int_equal(t1.load_events, 1);
    assert_int_equal(t2.load_events, 1);
    kvt_offload_stats st;
    kvt_offload_get_stats(c.s.m, &st);
    assert_int_equal(st.promotions, 4);
    assert_int_equal(st.promotions_failed, 0);
    assert_int_equal(st.load_events, 1); /* b's single GPU load */
    sim_kv_expect(c.kv, CH_GPU, CH_BPB, &b, 4, "chain");
    sim_finish(&c.s, &b);
    chain_close(&c);
}

/* Two disks, each attached at its tier's index (kvt_worker_attach_disk_tier). */
static void test_chain_of_two_disks_end_to_end(void **state)
{
    (void)state;
    chain_hit_across_two_tiers(false);
}

/* The far tier (tier 1, three polls of latency, its promotion completing after the disk's)
 * with a disk behind it (tier 2). */
static void test_a_new_tier_kind_in_the_chain(void **state)
{
    (void)state;
    chain_hit_across_two_tiers(true);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_file_private_and_sized),
        cmocka_unit_test(test_config_errors),
        cmocka_unit_test(test_roundtrip_direct),
        cmocka_unit_test(test_roundtrip_page_cache),
        cmocka_unit_test(test_ids_checked),
        cmocka_unit_test(test_io_errors_fail_one_block),
        cmocka_unit_test(test_fatal_is_sticky),
        cmocka_unit_test(test_worker_on_disk),
        cmocka_unit_test(test_worker_disk_failures),
        cmocka_unit_test(test_worker_three_tiers),
        cmocka_unit_test(test_chain_of_two_disks_end_to_end),
        cmocka_unit_test(test_a_new_tier_kind_in_the_chain),
    };
    return kvt_test_exit(cmocka_run_group_tests(tests, make_dir, remove_dir));
}
