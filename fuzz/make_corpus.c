/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Writes the seed corpus of every fuzz target: fuzz/corpus/<target>/seed-<n>, valid messages
 * built with the public API (tests/meta/meta_samples.h). Run by `make fuzz-corpus`; the output
 * is committed so CI fuzzing starts from meaningful inputs.
 */
#include <errno.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/shm.h"
#include "net/ec_ctl.h"
#include "meta/meta_samples.h"
#include "net/link_internal.h"
#include "kvtier/node.h"
#include "remote/remote_internal.h"

static const struct {
    uint32_t kind;
    const char *name;
} targets[] = {
    {KVT_META_OFFLOAD, "offload_meta"},
    {KVT_META_OFFLOAD_WORKER, "offload_worker_meta"},
    {KVT_META_EC, "ec_meta"},
    {KVT_META_EC_WORKER, "ec_worker_meta"},
    {KVT_META_EC_LOAD_SPEC, "ec_load_spec"},
    {KVT_META_EC_PUSH_SPEC, "ec_push_spec"},
};

static int write_file(const char *path, const void *buf, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(buf, 1, len, f) != len || fclose(f) != 0) {
        perror(path);
        return 1;
    }
    return 0;
}

/* Seeds of fuzz_link: selector byte, then a header, a hello, a status and an ids frame. */
static int link_seeds(const char *dir)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/link", dir);
    if (mkdir(path, 0755) != 0 && errno != EEXIST) {
        perror(path);
        return 1;
    }
    uint8_t buf[256];
    buf[0] = 0;
    kvi_link_hdr_encode(buf + 1, 3, 42);
    snprintf(path, sizeof(path), "%s/link/seed-0", dir);
    if (write_file(path, buf, 1 + KVT_LINK_HDR_LEN))
        return 1;
    buf[0] = 1;
    kvi_link_hello_encode(buf + 1, 1, 2, 4096);
    snprintf(path, sizeof(path), "%s/link/seed-1", dir);
    if (write_file(path, buf, 1 + KVT_LINK_HELLO_LEN))
        return 1;
    buf[0] = 2;
    uint32_t inv[3] = {7, 9, 1000};
    kvi_link_status_encode(buf + 1, 1, -12, inv, 3, "store failed", 12);
    snprintf(path, sizeof(path), "%s/link/seed-2", dir);
    if (write_file(path, buf, 1 + kvi_link_status_size(3, 12)))
        return 1;
    buf[0] = 3;
    kvt_str ids[2] = {{"req-1", 5}, {"chat-42-turn-3", 14}};
    kvi_link_ids_encode(buf + 1, ids, 2);
    snprintf(path, sizeof(path), "%s/link/seed-3", dir);
    return write_file(path, buf, 1 + kvi_link_ids_size(ids, 2));
}

/* Seeds of fuzz_ec_ctl: selector byte (0 request, 1 reply, 2 event), then the message. */
static int ec_ctl_seed(const char *dir, int n, uint8_t sel, const uint8_t *msg, size_t len)
{
    static uint8_t buf[1 << 16];
    char path[512];
    buf[0] = sel;
    memcpy(buf + 1, msg, len);
    snprintf(path, sizeof(path), "%s/ec_ctl/seed-%d", dir, n);
    return write_file(path, buf, len + 1);
}

static int ec_ctl_seeds(const char *dir)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/ec_ctl", dir);
    if (mkdir(path, 0755) != 0 && errno != EEXIST) {
        perror(path);
        return 1;
    }
    static uint8_t msg[1 << 15];
    size_t len;
    int n = 0, rc = 0;
    const char *rid = "0123456789abcdef0123456789abcdef";
    kvi_ecc_request q;
    kvi_ecc_request_init(&q);
    for (uint32_t op = KVT_ECC_PEERS; op <= KVT_ECC_CANCEL_BATCH && !rc; op++) {
        kvi_ecc_request_begin(&q, op);
        uint32_t items = op <= KVT_ECC_EVENT_PORT || op == KVT_ECC_DATA_ADDRESS      ? 0
                         : op == KVT_ECC_RESERVE_BATCH || op == KVT_ECC_CANCEL_BATCH ? 2
                                                                                     : 1;
        for (uint32_t i = 0; i < items; i++) {
            kvi_ecc_item it = {.transfer_id = {"xfer-1", 6},
                               .mm_hash = {"img-1", 5},
                               .nbytes = 512,
                               .ndim = 2,
                               .shape = {4, 64},
                               .dtype = {"bfloat16", 8},
                               .reservation_id = {rid, 32},
                               .client_key = {rid, 32},
                               .abandon = true};
            kvi_ecc_request_add(&q, &it);
        }
        rc = kvi_ecc_request_encode(&q, msg, sizeof(msg), &len) ||
             ec_ctl_seed(dir, n++, 0, msg, len);
    }
    kvi_ecc_request_release(&q);
    kvi_ecc_reply p;
    kvi_ecc_reply_init(&p);
    kvi_ecc_reply_begin(&p, KVT_ECC_PEERS);
    p.n_ports = 2, p.ports[0] = 19000, p.ports[1] = 19001;
    rc = rc || kvi_ecc_reply_encode(&p, msg, sizeof(msg), &len) ||
         ec_ctl_seed(dir, n++, 1, msg, len);
    kvi_ecc_reply_begin(&p, KVT_ECC_RESERVE_BATCH);
    kvi_ecc_result x = {
        .reservation_id = {rid, 32}, .offset = 256, .nbytes = 512, .tag = 7, .write = true};
    kvi_ecc_result bad = {.code = KVT_ENOSPC, .error = {"pool full", 9}};
    kvi_ecc_reply_add(&p, &x);
    kvi_ecc_reply_add(&p, &bad);
    rc = rc || kvi_ecc_reply_encode(&p, msg, sizeof(msg), &len) ||
         ec_ctl_seed(dir, n++, 1, msg, len);
    kvi_ecc_reply_begin(&p, KVT_ECC_STATUS);
    kvi_ecc_result st = {.found = true,
                         .mm_hash = {"img-1", 5},
                         .nbytes = 512,
                         .ndim = 2,
                         .shape = {4, 64},
                         .dtype = {"bfloat16", 8}};
    kvi_ecc_reply_add(&p, &st);
    rc = rc || kvi_ecc_reply_encode(&p, msg, sizeof(msg), &len) ||
         ec_ctl_seed(dir, n++, 1, msg, len);
    kvi_ecc_reply_begin(&p, KVT_ECC_DATA_ADDRESS);
    kvi_ecc_reply_set_address(&p, "\x01\x00\x02ucx-worker-address", 21);
    rc = rc || kvi_ecc_reply_encode(&p, msg, sizeof(msg), &len) ||
         ec_ctl_seed(dir, n++, 1, msg, len);
    kvi_ecc_reply_begin(&p, KVT_ECC_COMPLETE);
    kvi_ecc_reply_fail(&p, KVT_ESTATE, "shutting down");
    rc = rc || kvi_ecc_reply_encode(&p, msg, sizeof(msg), &len) ||
         ec_ctl_seed(dir, n++, 1, msg, len);
    kvi_ecc_reply_release(&p);
    kvi_ecc_event e = {.transfer_id = {"xfer-1", 6},
                       .mm_hash = {"img-1", 5},
                       .reservation_id = {rid, 32},
                       .dtype = {"bfloat16", 8},
                       .nbytes = 512,
                       .ndim = 2,
                       .shape = {4, 64},
                       .shard = 1};
    rc = rc || kvi_ecc_event_encode(&e, msg, sizeof(msg), &len) ||
         ec_ctl_seed(dir, n++, 2, msg, len);
    if (rc)
        fprintf(stderr, "make_corpus: ec_ctl: %s\n", kvt_last_error());
    return rc;
}

/* Seeds of fuzz_ec_server: six bytes per operation (op, transfer, client and item, size,
 * which reservation id, flags): a reserve, a completion with the id it got, a stranger's
 * cancel, the owner's cancel, a status, a refresh-abandon, time passing. */
static int ec_server_seeds(const char *dir)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/ec_server", dir);
    if (mkdir(path, 0755) != 0 && errno != EEXIST) {
        perror(path);
        return 1;
    }
    static const uint8_t ops[] = {
        3, 0, 0, 1, 0, 0, /* reserve t0 by client 0 */
        5, 0, 0, 0, 2, 0, /* complete t0 with the first id handed out */
        3, 1, 1, 2, 0, 0, /* reserve t1 by client 1 */
        7, 1, 0, 0, 1, 1, /* a forged abandon of t1 */
        7, 2, 2, 0, 0, 0, /* the owner cancels t2 before anyone reserved it */
        3, 2, 0, 1, 0, 0, /* ... then client 0 reserves it */
        2, 1, 0, 0, 0, 0, /* status of t1 */
        7, 1, 1, 0, 6, 3, /* client 1 refresh-abandons t1 with its id (second handed out) */
        3, 3, 0, 1, 0, 4, /* reserve t3 after time passed */
    };
    snprintf(path, sizeof(path), "%s/ec_server/seed-0", dir);
    return write_file(path, ops, sizeof(ops));
}

/* Seeds of fuzz_remote_wire (version 3): selector byte, then a hello, a challenge, a request
 * of two blocks and its reply. */
static int remote_seeds(const char *dir)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/remote_wire", dir);
    if (mkdir(path, 0755) != 0 && errno != EEXIST) {
        perror(path);
        return 1;
    }
    static uint8_t buf[4096];
    uint8_t hash[16] = {1, 2, 3}, addr[40] = {0x20, 7};
    kvi_rhello h = {.nr = {9}, .er = {5}, .name = (const uint8_t *)"reader-1", .name_len = 8};
    kvi_rchal c = {.nr = {9},
                   .no = {8},
                   .er = {5},
                   .eo = {4},
                   .boot = {7},
                   .name = (const uint8_t *)"owner-1",
                   .name_len = 7,
                   .proof = {6}};
    kvi_rreq_block blk[2] = {{3, 5, hash}, {4, 6, hash}};
    kvi_rreq q = {.seq = 1,
                  .req_id = 2,
                  .epoch = 3,
                  .flags = 1,
                  .hash_len = 16,
                  .addr = addr,
                  .addr_len = 40,
                  .n = 2,
                  .blocks = blk};
    kvi_rrep_block rb[2] = {{0, {1}}, {KVT_ENOENT, {0}}};
    kvi_rrep p = {.seq = 1, .req_id = 2, .n = 2, .blocks = rb};
    size_t len[4] = {kvi_rhello_size(&h), kvi_rchal_size(&c), kvi_rreq_size(&q), kvi_rrep_size(&p)};
    for (int v = 0; v < 4; v++) {
        buf[0] = (uint8_t)v;
        if (v == 0)
            kvi_rhello_encode(&h, buf + 1);
        else if (v == 1)
            kvi_rchal_encode(&c, buf + 1);
        else if (v == 2)
            kvi_rreq_encode(&q, buf + 1);
        else
            kvi_rrep_encode(&p, buf + 1);
        snprintf(path, sizeof(path), "%s/remote_wire/v3-seed-%d", dir, v);
        if (write_file(path, buf, 1 + len[v]))
            return 1;
    }
    return 0;
}

/* Seeds of fuzz_node_header: real metadata objects of two shapes (attached, copied, detached). */
static int node_seeds(const char *dir)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/node_header", dir);
    if (mkdir(path, 0755) != 0 && errno != EEXIST) {
        perror(path);
        return 1;
    }
    static const uint32_t shapes[][3] = {{1, 2, 1}, {2, 8, 4}}; /* ranks, bpr, keys per block */
    for (int v = 0; v < 2; v++) {
        char name[64];
        snprintf(name, sizeof(name), "corpus-%d-%d", (int)getpid(), v);
        kvt_node_config c;
        kvt_node_config_init(&c);
        c.name = name;
        c.ranks = shapes[v][0];
        c.blocks_per_rank = shapes[v][1];
        c.keys_per_block = shapes[v][2];
        kvt_node *n;
        if (kvt_node_attach(&c, &n) != 0) {
            fprintf(stderr, "make_corpus: node tier: %s\n", kvt_last_error());
            return 1;
        }
        /* the tier's object as its rendezvous names it (node.h) */
        kvi_shm_share me = {0};
        char shm[1200], rdir[1024], stem[128];
        if (kvi_shm_dir(NULL, &me, rdir, sizeof(rdir)) ||
            kvi_shm_stem(rdir, name, &me, false, stem, sizeof(stem))) {
            fprintf(stderr, "make_corpus: node tier: %s\n", kvt_last_error());
            kvt_node_detach(n);
            return 1;
        }
        snprintf(shm, sizeof(shm), "/dev/shm/kvtier.%s.meta", stem);
        FILE *f = fopen(shm, "rb");
        static uint8_t buf[1 << 20];
        size_t len = f ? fread(buf, 1, sizeof(buf), f) : 0;
        if (f)
            fclose(f);
        kvt_node_detach(n);
        snprintf(path, sizeof(path), "%s/node_header/seed-%d", dir, v);
        if (!len || write_file(path, buf, len))
            return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    const char *dir = argc > 1 ? argv[1] : "fuzz/corpus";
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        perror(dir);
        return 1;
    }
    for (size_t t = 0; t < sizeof(targets) / sizeof(targets[0]); t++) {
        char path[512];
        snprintf(path, sizeof(path), "%s/%s", dir, targets[t].name);
        if (mkdir(path, 0755) != 0 && errno != EEXIST) {
            perror(path);
            return 1;
        }
        for (int v = 0; v < 3; v++) {
            size_t len;
            unsigned char *buf = kvt_sample_encode(targets[t].kind, v, &len);
            if (!buf) {
                fprintf(stderr, "make_corpus: cannot encode %s/%d: %s\n", targets[t].name, v,
                        kvt_last_error());
                return 1;
            }
            snprintf(path, sizeof(path), "%s/%s/seed-%d", dir, targets[t].name, v);
            int rc = write_file(path, buf, len);
            free(buf);
            if (rc)
                return 1;
        }
    }
    return link_seeds(dir) || ec_ctl_seeds(dir) || ec_server_seeds(dir) || node_seeds(dir) ||
           remote_seeds(dir);
}
