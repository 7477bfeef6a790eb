/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libFuzzer target: a consumer shard (reservations and resident pool) driven by a fuzzed
 * operation stream — what a remote producer and the local scheduler can ask of it, in any
 * order, with forged reservation ids and time jumps. Two bytes per operation.
 *
 * Properties (abort = the fuzzer reports the input):
 *   - no destination handed to a writer overlaps one an earlier writer may still write (a
 *     producer owns its destination from write=true until it completes or abandons it);
 *   - every call returns 0 or a KVT_E* code with a message, never anything else;
 *   - the free bytes never exceed the capacity, and every byte given out is held by a writer,
 *     a resident entry or a fence (held_bytes); after every producer finished, the shard can
 *     be destroyed (no writer left) and the whole buffer allocated again.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvtier/kvtier.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define N_T 8
#define CAP (16 * 1024)

static void check(int ok)
{
    if (!ok)
        abort();
}

struct prod {
    bool active;
    char rid[KVT_EC_RID_LEN + 1];
    uint64_t off, len;
};

static void check_rc(int rc)
{
    check(rc == 0 || (rc < 0 && kvt_last_error()[0] != 0));
}

static kvt_ec_item item_of(uint32_t h)
{
    static const char *names[4] = {"a", "b", "c", "d"};
    uint64_t tokens = 1 + h % 4;
    kvt_ec_item it = {names[h], 1, tokens * 1024, 2, {tokens, 256}, "float32", 7};
    return it;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static unsigned char buf[CAP];
    kvt_manual_clock clock;
    kvt_ec_shard_config c;
    kvt_ec_shard_config_init(&c);
    c.base = buf;
    c.capacity = CAP;
    c.max_tombstones = 4;
    c.max_records = 64; /* small tables: many executions per second */
    c.max_residents = 64;
    c.max_events = 64;
    c.clock = kvt_clock_manual(&clock, 1);
    kvt_ec_shard *sh;
    if (kvt_ec_shard_create(&c, &sh))
        return 0;
    struct prod p[N_T] = {{0}};
    char tid[N_T][4];
    for (int t = 0; t < N_T; t++)
        tid[t][0] = 't', tid[t][1] = (char)('0' + t), tid[t][2] = 0;
    for (size_t i = 0; i + 1 < size; i += 2) {
        uint8_t op = data[i] >> 4, t = data[i] & 7, arg = data[i + 1];
        uint32_t h = arg & 3;
        bool a = arg & 4, b = arg & 8, done, ready;
        kvt_ec_reply r;
        kvt_slab_view v;
        kvt_ec_item it = item_of(h);
        switch (op) {
        case 0:
        case 1: {
            int rc = kvt_ec_shard_reserve(sh, tid[t], 2, &it, &r);
            check_rc(rc);
            if (rc || !r.write)
                break;
            check(!p[t].active); /* one destination per writer at a time */
            for (int u = 0; u < N_T; u++)
                if (u != t && p[u].active)
                    check(r.offset + it.nbytes <= p[u].off || p[u].off + p[u].len <= r.offset);
            p[t] = (struct prod){true, {0}, r.offset, it.nbytes};
            memcpy(p[t].rid, r.reservation_id, sizeof(p[t].rid));
            break;
        }
        case 2: /* the producer completes, or a forged / stale id tries to */
            check_rc(kvt_ec_shard_complete(sh, tid[t], 2, a ? "forged" : p[t].rid, &done, &ready));
            if (!a && p[t].active) {
                check(done); /* the writer's own completion is always accepted */
                p[t].active = false;
            }
            break;
        case 3: /* the producer abandons (refresh: it will reserve again) */
            check_rc(kvt_ec_shard_cancel(sh, tid[t], 2, p[t].rid, true, b, &done));
            if (done || !b)
                p[t].active = false;
            if (!done && b) { /* refresh refused: a plain abandon */
                check_rc(kvt_ec_shard_cancel(sh, tid[t], 2, p[t].rid, true, false, &done));
                p[t].active = false;
            }
            break;
        case 4: /* the consumer cancels: never frees a writer's memory */
            check_rc(kvt_ec_shard_cancel(sh, tid[t], 2, NULL, false, false, &done));
            break;
        case 5:
            check_rc(kvt_ec_shard_take(sh, tid[t], 2, it.mm_hash, 1, NULL, &v));
            break;
        case 6:
            check_rc(kvt_ec_shard_take_resident(sh, &it, &v));
            break;
        case 7:
            check_rc(kvt_ec_shard_retire(sh, it.mm_hash, 1, NULL) < 0 ? -1 : 0);
            break;
        case 8:
            kvt_clock_manual_advance(&clock, (uint64_t)arg * 5000000000ull);
            kvt_ec_shard_expire(sh);
            break;
        case 9: {
            kvt_ec_ready_event ev[8];
            char recl[8][KVT_EC_KEY_MAX + 1];
            (void)kvt_ec_shard_take_events(sh, ev, 8);
            (void)kvt_ec_shard_take_reclaimed(sh, recl, 8);
            break;
        }
        default:
            break;
        }
        kvt_ec_shard_stats st;
        kvt_ec_shard_get_stats(sh, &st);
        check(st.free_bytes <= st.capacity);
        check(st.held_bytes == st.capacity - st.free_bytes); /* nothing given out is lost */
    }
    for (int t = 0; t < N_T; t++) /* every producer finishes */
        if (p[t].active) {
            bool done, ready;
            check(kvt_ec_shard_complete(sh, tid[t], 2, p[t].rid, &done, &ready) == 0 && done);
        }
    check(kvt_ec_shard_writers(sh) == 0);
    for (uint32_t h = 0; h < 4; h++) /* let the worker's residents go */
        (void)kvt_ec_shard_retire(sh, item_of(h).mm_hash, 1, NULL);
    for (int t = 0; t < N_T; t++) {
        bool done;
        (void)kvt_ec_shard_cancel(sh, tid[t], 2, NULL, true, false, &done);
    }
    kvt_ec_item all = {"all", 3, CAP, 1, {CAP}, "uint8", 5};
    kvt_ec_reply r;
    check(kvt_ec_shard_reserve(sh, "final", 5, &all, &r) == 0); /* nothing leaked */
    bool done;
    check(kvt_ec_shard_cancel(sh, "final", 5, r.reservation_id, true, false, &done) == 0);
    check(kvt_ec_shard_destroy(sh) == 0);
    return 0;
}
