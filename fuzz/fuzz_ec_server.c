/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libFuzzer target: the consumer shard's control server in process (src/net/ec_server.c without
 * its sockets), fed a stream of requests from three clients (two producers with their own
 * keys, and the consumer's scheduler with the owner key) and raw bytes. Six bytes per
 * operation choose the op, the transfer, the item, who sends it, which reservation id it
 * names and the flags; a selector of 255 sends the rest of the input as raw request bytes.
 *
 * Properties (abort = the fuzzer reports the input):
 *   - every request gets a reply that decodes and answers it (same op, one result per item);
 *   - a status reply never carries a reservation id, and no reserve reply ever tells a client
 *     a reservation id that another client was given;
 *   - every byte of the shard's buffer is free or held (no loss), and once every writer is
 *     abandoned by its own client, no writer is left.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/ec_ctl.h"
#include "net/ec_server_internal.h"
#include "kvtier/kvtier.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define N_T  6
#define N_R  1024
#define CAP  (64 * 1024)
#define KEY0 "0000000000000000000000000000000a"
#define KEY1 "0000000000000000000000000000000b"

#define check(ok)                                                                                  \
    do {                                                                                           \
        if (!(ok)) {                                                                               \
            fprintf(stderr, "fuzz_ec_server: line %d: %s (%s)\n", __LINE__, #ok,                   \
                    kvt_last_error());                                                             \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

typedef struct rid_rec {
    char rid[KVT_EC_RID_LEN + 1];
    char tid[8];
    int client;
} rid_rec;

static kvt_str S(const char *s)
{
    return (kvt_str){s, (uint32_t)strlen(s)};
}

/* The reply answers the request and keeps the capability rules. */
static void check_reply(const kvi_ecc_request *q, const uint8_t *rep, size_t len, int client,
                        rid_rec *rids, uint32_t *n_rids, const char *tid)
{
    kvi_ecc_reply p;
    kvi_ecc_reply_init(&p);
    check(kvi_ecc_reply_decode(&p, rep, len) == 0);
    if (q) {
        check(kvi_ecc_reply_check(&p, q) == 0);
        for (uint32_t i = 0; !p.code && i < p.n; i++) {
            const kvi_ecc_result *x = &p.results[i];
            if (q->op == KVT_ECC_STATUS)
                check(x->reservation_id.len == 0);
            if ((q->op != KVT_ECC_RESERVE && q->op != KVT_ECC_RESERVE_BATCH) || x->code ||
                !x->reservation_id.len)
                continue;
            uint32_t k = 0;
            while (k < *n_rids && strcmp(rids[k].rid, x->reservation_id.ptr) != 0)
                k++;
            if (k < *n_rids) { /* a known id: only ever told to the client that got it */
                check(rids[k].client == client && strcmp(rids[k].tid, tid) == 0);
            } else if (*n_rids < N_R) {
                memcpy(rids[*n_rids].rid, x->reservation_id.ptr, KVT_EC_RID_LEN + 1);
                snprintf(rids[*n_rids].tid, sizeof(rids[*n_rids].tid), "%s", tid);
                rids[(*n_rids)++].client = client;
            }
        }
    }
    kvi_ecc_reply_release(&p);
}

static void check_bytes(kvt_ec_shard *sh)
{
    kvt_ec_shard_stats st;
    kvt_ec_shard_get_stats(sh, &st);
    check(st.free_bytes <= st.capacity && st.capacity - st.free_bytes == st.held_bytes);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static uint8_t *buf;
    if (!buf)
        buf = aligned_alloc(256, CAP);
    kvt_manual_clock clock;
    kvt_ec_shard_config c;
    kvt_ec_shard_config_init(&c);
    c.base = buf;
    c.capacity = CAP;
    c.clock = kvt_clock_manual(&clock, 1);
    c.ttl_ns = 1000;
    c.max_records = c.max_tombstones = c.max_residents = 256; /* small tables: cheap runs */
    c.max_events = 64;
    kvt_ec_shard *sh;
    check(kvt_ec_shard_create(&c, &sh) == 0);
    kvt_ec_server *srv;
    check(kvi_ec_server_open_local(sh, &srv) == 0);
    const char *keys[3] = {KEY0, KEY1, kvi_ec_server_owner(srv)};
    rid_rec rids[N_R];
    uint32_t n_rids = 0;
    kvi_ecc_request q;
    kvi_ecc_request_init(&q);
    static const char *const tids[N_T] = {"t0", "t1", "t2", "t3", "t4", "t5"};
    static const char *const hashes[3] = {"ha", "hb", "hc"};
    size_t i = 0;
    while (i < size) {
        const uint8_t *reply;
        size_t rlen;
        if (data[i] == 255) { /* the rest, raw */
            check(kvi_ec_server_answer(srv, data + i + 1, size - i - 1, &reply, &rlen) == 0);
            kvi_ecc_reply p;
            kvi_ecc_reply_init(&p);
            check(kvi_ecc_reply_decode(&p, reply, rlen) == 0);
            kvi_ecc_reply_release(&p);
            break;
        }
        if (size - i < 6)
            break;
        const uint8_t *b = data + i;
        i += 6;
        static const uint32_t ops[] = {
            KVT_ECC_PEERS,          KVT_ECC_EVENT_PORT,    KVT_ECC_STATUS,
            KVT_ECC_RESERVE,        KVT_ECC_RESERVE_BATCH, KVT_ECC_COMPLETE,
            KVT_ECC_COMPLETE_BATCH, KVT_ECC_CANCEL,        KVT_ECC_CANCEL_BATCH};
        uint32_t op = ops[b[0] % (sizeof(ops) / sizeof(ops[0]))];
        bool cancel = op == KVT_ECC_CANCEL || op == KVT_ECC_CANCEL_BATCH;
        const char *tid = tids[b[1] % N_T];
        int client = b[2] % 3;
        kvi_ecc_item it = {.transfer_id = S(tid)};
        it.mm_hash = S(hashes[b[2] / 3 % 3]);
        it.ndim = 1;
        it.shape[0] = 1 + (uint64_t)(b[3] & 15) * 256;
        it.nbytes = it.shape[0] * 2;
        it.dtype = S("float16");
        it.client_key = S(keys[client]);
        /* the reservation id it names: one handed out (to anyone), a forged one, or none */
        const char *rid = b[4] % 4 == 0 ? "" : b[4] % 4 == 1 ? KEY1 : NULL;
        if (!rid)
            rid = n_rids ? rids[b[4] / 4 % n_rids].rid : "";
        it.reservation_id = S(rid);
        it.abandon = b[5] & 1;
        it.refresh = b[5] & 2;
        if (cancel && !rid[0])
            it.abandon = it.refresh = false;
        if (cancel && rid[0] && client == 2)
            it.client_key = S("");
        if (b[5] & 4) /* time passes: reservations expire, tombstones go */
            kvt_clock_manual_advance(&clock, 600);
        kvi_ecc_request_begin(&q, op);
        uint32_t n = op == KVT_ECC_RESERVE_BATCH || op == KVT_ECC_COMPLETE_BATCH ||
                             op == KVT_ECC_CANCEL_BATCH
                         ? 2
                         : 1;
        if (op == KVT_ECC_PEERS || op == KVT_ECC_EVENT_PORT)
            n = 0;
        for (uint32_t k = 0; k < n; k++)
            check(kvi_ecc_request_add(&q, &it) == 0);
        uint8_t enc[4096];
        size_t len;
        if (kvi_ecc_request_encode(&q, enc, sizeof(enc), &len) != 0)
            continue; /* not a request any client could send (the wire refuses it) */
        check(kvi_ec_server_answer(srv, enc, len, &reply, &rlen) == 0);
        check_reply(&q, reply, rlen, client, rids, &n_rids, tid);
        kvt_ec_shard_expire(sh); /* what the server's loop does between requests */
        check_bytes(sh);
    }
    /* every writer abandoned by the client that holds its id: none left */
    for (uint32_t k = 0; k < n_rids; k++) {
        kvi_ecc_item ab = {
            .transfer_id = S(rids[k].tid), .reservation_id = S(rids[k].rid), .abandon = true};
        kvi_ecc_request_begin(&q, KVT_ECC_CANCEL);
        check(kvi_ecc_request_add(&q, &ab) == 0);
        uint8_t enc[1024];
        size_t len;
        const uint8_t *reply;
        size_t rlen;
        check(kvi_ecc_request_encode(&q, enc, sizeof(enc), &len) == 0);
        check(kvi_ec_server_answer(srv, enc, len, &reply, &rlen) == 0);
    }
    check(kvt_ec_shard_writers(sh) == 0);
    check_bytes(sh);
    kvi_ecc_request_release(&q);
    kvi_ec_server_close_local(srv);
    check(kvt_ec_shard_destroy(sh) == 0);
    return 0;
}
