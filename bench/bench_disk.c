/* SPDX-License-Identifier: Apache-2.0 */
/*
 * `kvtier bench disk`: the disk tier writing and reading 2 MiB slots against fio on the same
 * file system, with the same block size, queue depth and engine (io_uring, O_DIRECT), in the
 * same command (BENCHMARKS.md).
 *
 * kvtier: n slots (n x 2 MiB >= the requested size) written once to allocate the file, then
 * written and read in random slot order, in events of 32 blocks, through one host region of
 * 2 MiB blocks; each phase is timed from the first submit to the flush. fio: randwrite and
 * randread jobs of the same size on a file of the same size in the same directory, with
 * registered buffers and file as kvtier uses them. The two alternate, three times; the best
 * of each counts.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"
#include "kvtier/kvtier.h"

#define BS      (2u << 20)
#define QD      16
#define PER_EVT 32
#define ROUNDS  3

/* Runs one fio job and returns its bandwidth in GB/s (0 on failure). */
static double fio_run(const char *dir, uint64_t bytes, bool write, const char *extra)
{
    char cmd[1024];
    snprintf(cmd, sizeof(cmd),
             "fio --name=kvt --filename=%s/kvt-fio.dat --size=%llu --bs=%u --ioengine=io_uring "
             "--direct=1 --iodepth=%u --rw=%s %s --output-format=json 2>/dev/null",
             dir, (unsigned long long)bytes, BS, QD, write ? "randwrite" : "randread", extra);
    FILE *f = popen(cmd, "r");
    if (!f)
        return 0;
    static char out[1 << 16];
    size_t n = fread(out, 1, sizeof(out) - 1, f);
    out[n] = 0;
    if (pclose(f) != 0)
        return 0;
    const char *sec = strstr(out, write ? "\"write\"" : "\"read\"");
    const char *bw = sec ? strstr(sec, "\"bw_bytes\"") : NULL;
    const char *colon = bw ? strchr(bw, ':') : NULL;
    return colon ? strtod(colon + 1, NULL) / 1e9 : 0;
}

/* fio at its best: registered buffers and file, as kvtier uses them (plain if refused). */
static double fio_gbps(const char *dir, uint64_t bytes, bool write)
{
    double g = fio_run(dir, bytes, write, "--fixedbufs --registerfiles");
    return g > 0 ? g : fio_run(dir, bytes, write, "");
}

static int pass(kvt_disk *d, int dir, const uint32_t *blocks, const uint32_t *slots, uint32_t n,
                int64_t *ev, double *best)
{
    double t0 = kvt_now_s();
    for (uint32_t at = 0; at < n; at += PER_EVT) {
        uint32_t k = n - at < PER_EVT ? n - at : PER_EVT;
        int rc = dir == KVT_COPY_STORE
                     ? kvt_disk_submit(d, dir, (*ev)++, blocks + at, slots + at, k, NULL)
                     : kvt_disk_submit(d, dir, (*ev)++, slots + at, blocks + at, k, NULL);
        if (rc == KVT_EBUSY) {
            kvt_disk_flush(d);
            int64_t hwm;
            kvt_disk_poll(d, dir, &hwm);
            at -= PER_EVT;
            (*ev)--;
            continue;
        }
        if (rc)
            return rc;
    }
    int rc = kvt_disk_flush(d);
    int64_t hwm;
    if (!rc)
        rc = kvt_disk_poll(d, dir, &hwm);
    double g = (double)n * BS / (kvt_now_s() - t0) / 1e9;
    if (g > *best)
        *best = g;
    int64_t failed[1];
    uint32_t inv[1];
    if (!rc && (kvt_disk_take_failed(d, failed, 1) || kvt_disk_take_invalid_blocks(d, inv, 1)))
        rc = KVT_EIO;
    return rc;
}

static int run(const kvt_bench_opts *o)
{
    const char *dir = o->dir ? o->dir : ".";
    double gib = o->gib > 0 ? o->gib : 1.0;
    uint32_t n = (uint32_t)((gib * (double)(1ull << 30) + BS - 1) / BS);
    uint64_t bytes = (uint64_t)n * BS;
    if (system("command -v fio >/dev/null 2>&1") != 0) {
        fprintf(stderr, "kvtier bench disk: fio is not installed (scripts/install-deps)\n");
        return 1;
    }
    kvt_arena_config ac;
    kvt_arena_config_init(&ac);
    ac.size = bytes;
    kvt_arena *mem = NULL;
    kvt_layout *l = NULL;
    kvt_disk *d = NULL;
    uint32_t *blocks = malloc(n * sizeof(uint32_t)), *slots = malloc(n * sizeof(uint32_t));
    char base[1024];
    snprintf(base, sizeof(base), "%s/kvt-bench-disk", dir);
    kvt_disk_config dc;
    kvt_disk_config_init(&dc);
    dc.path = base;
    dc.capacity_bytes = bytes;
    dc.queue_depth = QD;
    int rc = blocks && slots ? 0 : KVT_ENOMEM;
    if (!rc)
        rc = kvt_arena_create(&ac, &mem);
    if (!rc)
        rc = kvt_layout_create(KVT_HOST_DEVICE, n, &l);
    if (!rc)
        rc = kvt_layout_add_region(l, (uint64_t)(uintptr_t)kvt_arena_base(mem), BS);
    if (!rc)
        rc = kvt_disk_create(&dc, l, &d);
    double w = 0, r = 0, fw = 0, fr = 0, first = 0;
    int64_t ev[2] = {0, 0};
    if (!rc) {
        memset(kvt_arena_base(mem), 0x5A, bytes);
        uint64_t seed = o->seed;
        for (uint32_t i = 0; i < n; i++)
            blocks[i] = slots[i] = i;
        for (uint32_t i = n; i > 1; i--) {
            uint32_t j = kvt_rand_below(&seed, i), t = slots[i - 1];
            slots[i - 1] = slots[j];
            slots[j] = t;
        }
        rc = pass(d, KVT_COPY_STORE, blocks, slots, n, &ev[0], &first); /* allocates the file */
    }
    for (int round = 0; round < ROUNDS && !rc; round++) {
        double g = fio_gbps(dir, bytes, true);
        fw = g > fw ? g : fw;
        rc = pass(d, KVT_COPY_STORE, blocks, slots, n, &ev[0], &w);
        g = fio_gbps(dir, bytes, false);
        fr = g > fr ? g : fr;
        if (!rc)
            rc = pass(d, KVT_COPY_LOAD, blocks, slots, n, &ev[1], &r);
    }
    char fio_file[1100];
    snprintf(fio_file, sizeof(fio_file), "%s/kvt-fio.dat", dir);
    unlink(fio_file);
    kvt_disk_destroy(d);
    kvt_layout_destroy(l);
    kvt_arena_destroy(mem);
    free(blocks);
    free(slots);
    if (rc) {
        fprintf(stderr, "kvtier bench disk: %s: %s\n", kvt_err_name(rc), kvt_last_error());
        return 1;
    }
    if (fw == 0 || fr == 0) {
        fprintf(stderr, "kvtier bench disk: fio failed in %s (is O_DIRECT supported there?)\n",
                dir);
        return 1;
    }
    double ratio = r / fr < w / fw ? r / fr : w / fw;
    if (o->json) {
        kvt_json j;
        kvt_json_begin(&j, stdout);
        kvt_json_str(&j, "bench", "disk");
        kvt_json_host(&j);
        kvt_json_str(&j, "dir", dir);
        kvt_json_int(&j, "block_bytes", BS);
        kvt_json_int(&j, "queue_depth", QD);
        kvt_json_int(&j, "bytes", (long long)bytes);
        kvt_json_num(&j, "first_write_gbps", first);
        kvt_json_num(&j, "fio_write_gbps", fw);
        kvt_json_num(&j, "fio_read_gbps", fr);
        kvt_json_num(&j, "write_gbps", w);
        kvt_json_num(&j, "read_gbps", r);
        kvt_json_num(&j, "ratio_vs_fio", ratio);
        kvt_json_end(&j);
    } else {
        printf("2 MiB slots, queue depth %u, %.2f GiB in %s\n", QD, (double)bytes / (1 << 30), dir);
        printf("  write %.2f GB/s (fio %.2f), read %.2f GB/s (fio %.2f): ratio %.2f\n", w, fw, r,
               fr, ratio);
    }
    return 0;
}

const kvt_bench kvt_bench_disk = {"disk", "disk tier vs fio (io_uring, O_DIRECT, 2 MiB)", run,
                                  "json,seed,gib,dir"};
