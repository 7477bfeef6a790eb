/* SPDX-License-Identifier: Apache-2.0 */
/*
 * An in-process consumer for encoder-cache tests: N kvt_ec_shard over their own buffers, reached
 * through kvt_ec_consumer_ops (writes are memcpy into the shard's buffer at the reservation's
 * offset), with counters and injectable faults per shard and operation. Issue 7 replaces it
 * with the network; the producer and the tests do not change.
 */
#ifndef KVT_TEST_EC_INPROC_H
#define KVT_TEST_EC_INPROC_H

#include "kvt_test.h"
#include "base/error.h"

#define INPROC_MAX 8

enum { OP_RESERVE, OP_WRITE, OP_COMPLETE, OP_CANCEL, N_OPS };
#define INPROC_LOG 256

typedef struct inproc {
    uint32_t n;
    kvt_ec_shard *sh[INPROC_MAX];
    unsigned char *buf[INPROC_MAX];
    uint64_t cap;
    kvt_manual_clock *clock;
    uint32_t calls[N_OPS][INPROC_MAX];
    int fail_next[N_OPS][INPROC_MAX]; /* fail this many calls of op on shard */
    bool no_topology;
    /* batched forms (inproc_batch_ops): messages per op and shard (writes: shard 0), and a
     * whole batch call of op that fails before any of its operations is tried */
    uint32_t batch_calls[N_OPS][INPROC_MAX];
    bool fail_batch[N_OPS];
    /* the single calls in order, op * 100 + shard (the first INPROC_LOG) */
    uint32_t log[INPROC_LOG], n_log;
} inproc;

static inline void inproc_open(inproc *c, uint32_t shards, uint64_t cap, kvt_manual_clock *clock)
{
    memset(c, 0, sizeof(*c));
    c->n = shards;
    c->cap = cap;
    c->clock = clock;
    for (uint32_t k = 0; k < shards; k++) {
        c->buf[k] = aligned_alloc(256, cap);
        memset(c->buf[k], 0, cap);
        kvt_ec_shard_config sc;
        kvt_ec_shard_config_init(&sc);
        sc.base = c->buf[k];
        sc.capacity = cap;
        sc.clock = kvt_clock_manual(clock, clock->now_ns); /* shares the test clock */
        KVT_OK_(kvt_ec_shard_create(&sc, &c->sh[k]));
    }
}

static inline void inproc_close(inproc *c)
{
    for (uint32_t k = 0; k < c->n; k++) {
        KVT_OK_(kvt_ec_shard_destroy(c->sh[k]));
        free(c->buf[k]);
    }
}

static inline int inproc_fault(inproc *c, int op, uint32_t k)
{
    c->calls[op][k]++;
    if (c->n_log < INPROC_LOG)
        c->log[c->n_log++] = (uint32_t)op * 100 + k;
    if (c->fail_next[op][k] > 0) {
        c->fail_next[op][k]--;
        return kvt_fail(KVT_EIO, "injected failure (op %d, shard %u)", op, k);
    }
    return 0;
}

static inline int inproc_shards(void *ctx, const char *consumer, uint32_t *n)
{
    inproc *c = ctx;
    (void)consumer;
    if (c->no_topology)
        return kvt_fail(KVT_EIO, "consumer unreachable");
    *n = c->n;
    return 0;
}

static inline int inproc_reserve(void *ctx, const char *consumer, uint32_t k, const char *t,
                                 uint32_t len, const kvt_ec_item *it, kvt_ec_reply *out)
{
    inproc *c = ctx;
    (void)consumer;
    int rc = inproc_fault(c, OP_RESERVE, k);
    return rc ? rc : kvt_ec_shard_reserve(c->sh[k], t, len, it, out);
}

static inline int inproc_write(void *ctx, const char *consumer, uint32_t k, const kvt_ec_reply *dst,
                               const void *src, uint64_t n)
{
    inproc *c = ctx;
    (void)consumer;
    int rc = inproc_fault(c, OP_WRITE, k);
    if (rc)
        return rc;
    if (dst->offset + n > c->cap)
        return kvt_fail(KVT_ERANGE, "write outside the buffer");
    memcpy(c->buf[k] + dst->offset, src, n);
    return 0;
}

static inline int inproc_complete(void *ctx, const char *consumer, uint32_t k, const char *t,
                                  uint32_t len, const char *rid, bool *accepted)
{
    inproc *c = ctx;
    (void)consumer;
    bool ready;
    int rc = inproc_fault(c, OP_COMPLETE, k);
    return rc ? rc : kvt_ec_shard_complete(c->sh[k], t, len, rid, accepted, &ready);
}

static inline int inproc_cancel(void *ctx, const char *consumer, uint32_t k, const char *t,
                                uint32_t len, const char *rid, bool abandon, bool refresh)
{
    inproc *c = ctx;
    (void)consumer;
    bool done;
    int rc = inproc_fault(c, OP_CANCEL, k);
    return rc ? rc : kvt_ec_shard_cancel(c->sh[k], t, len, rid, abandon, refresh, &done);
}

static inline kvt_ec_consumer_ops inproc_ops(inproc *c)
{
    kvt_ec_consumer_ops o = {inproc_shards,   inproc_reserve, inproc_write,
                             inproc_complete, inproc_cancel,  c};
    return o;
}

/* ---- the batched forms: each operation goes through the single call above (its counters and
 * injected faults), and the message is counted once */

static inline int inproc_batch_fault(inproc *c, int op, uint32_t k)
{
    c->batch_calls[op][k]++;
    if (!c->fail_batch[op])
        return 0;
    c->fail_batch[op] = false;
    return kvt_fail(KVT_EIO, "injected failure of a whole batch (op %d)", op);
}

static inline void inproc_outcome(int rc, int *out, char *err, size_t cap)
{
    *out = rc;
    err[0] = 0;
    if (rc)
        snprintf(err, cap, "%s", kvt_last_error());
}

static inline int inproc_reserve_batch(void *ctx, const char *consumer, uint32_t k,
                                       kvt_ec_batch_op *ops, uint32_t n)
{
    int rc = inproc_batch_fault(ctx, OP_RESERVE, k);
    for (uint32_t i = 0; !rc && i < n; i++)
        inproc_outcome(inproc_reserve(ctx, consumer, k, ops[i].transfer_id, ops[i].len, ops[i].item,
                                      &ops[i].reply),
                       &ops[i].rc, ops[i].error, sizeof(ops[i].error));
    return rc;
}

static inline int inproc_write_batch(void *ctx, const char *consumer, kvt_ec_write_op *w,
                                     uint32_t n)
{
    int rc = inproc_batch_fault(ctx, OP_WRITE, 0);
    for (uint32_t i = 0; !rc && i < n; i++)
        inproc_outcome(inproc_write(ctx, consumer, w[i].shard, w[i].dst, w[i].src, w[i].nbytes),
                       &w[i].rc, w[i].error, sizeof(w[i].error));
    return rc;
}

static inline int inproc_complete_batch(void *ctx, const char *consumer, uint32_t k,
                                        kvt_ec_batch_op *ops, uint32_t n)
{
    int rc = inproc_batch_fault(ctx, OP_COMPLETE, k);
    for (uint32_t i = 0; !rc && i < n; i++)
        inproc_outcome(inproc_complete(ctx, consumer, k, ops[i].transfer_id, ops[i].len,
                                       ops[i].reservation_id, &ops[i].accepted),
                       &ops[i].rc, ops[i].error, sizeof(ops[i].error));
    return rc;
}

static inline int inproc_cancel_batch(void *ctx, const char *consumer, uint32_t k,
                                      kvt_ec_batch_op *ops, uint32_t n)
{
    int rc = inproc_batch_fault(ctx, OP_CANCEL, k);
    for (uint32_t i = 0; !rc && i < n; i++)
        inproc_outcome(inproc_cancel(ctx, consumer, k, ops[i].transfer_id, ops[i].len,
                                     ops[i].reservation_id, ops[i].abandon, ops[i].refresh),
                       &ops[i].rc, ops[i].error, sizeof(ops[i].error));
    return rc;
}

static inline kvt_ec_consumer_ops inproc_batch_ops(inproc *c)
{
    kvt_ec_consumer_ops o = inproc_ops(c);
    o.reserve_batch = inproc_reserve_batch;
    o.write_batch = inproc_write_batch;
    o.complete_batch = inproc_complete_batch;
    o.cancel_batch = inproc_cancel_batch;
    return o;
}

/* A push spec of `tokens` x 256 float32 for consumer "tcp://consumer:1". */
static inline kvt_ec_push_spec inproc_spec(const char *t, const char *h, uint64_t tokens,
                                           const char *req)
{
    kvt_ec_push_spec s;
    memset(&s, 0, sizeof(s));
    s.mm_hash = (kvt_str){h, (uint32_t)strlen(h)};
    s.nbytes = tokens * 1024;
    s.ndim = 2;
    s.shape[0] = tokens;
    s.shape[1] = 256;
    s.dtype = (kvt_str){"float32", 7};
    s.consumer_zmq = (kvt_str){"tcp://consumer:1", 16};
    s.transfer_id = (kvt_str){t, (uint32_t)strlen(t)};
    s.request_id = (kvt_str){req, req ? (uint32_t)strlen(req) : 0};
    return s;
}

#endif
