/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A consumer in the same process, behind kvt_ec_consumer_ops: every call goes straight to the
 * shard; a write copies into the region the reservation named (its ptr), after checking that
 * the bytes fit it. The network layer (net_consumer.c) implements the same operations across
 * processes.
 */
#include <string.h>

#include "base/error.h"
#include "kvtier/ec.h"

static int shard_of(kvt_ec_local_consumer *c, uint32_t k, kvt_ec_shard **out)
{
    if (k >= c->n || !c->shards[k])
        return kvt_fail(KVT_ERANGE, "ec local consumer: shard %u of %u", k, c->n);
    *out = c->shards[k];
    return 0;
}

static int l_shards(void *ctx, const char *consumer, uint32_t *n)
{
    kvt_ec_local_consumer *c = ctx;
    (void)consumer;
    if (c->n == 0 || c->n > KVT_EC_MAX_SHARDS)
        return kvt_fail(KVT_EINVAL, "ec local consumer: %u shards", c->n);
    *n = c->n;
    return 0;
}

static int l_reserve(void *ctx, const char *consumer, uint32_t k, const char *t, uint32_t len,
                     const kvt_ec_item *it, kvt_ec_reply *out)
{
    kvt_ec_shard *sh = NULL;
    (void)consumer;
    int rc = shard_of(ctx, k, &sh);
    return rc ? rc : kvt_ec_shard_reserve(sh, t, len, it, out);
}

static int l_write(void *ctx, const char *consumer, uint32_t k, const kvt_ec_reply *dst,
                   const void *src, uint64_t n)
{
    kvt_ec_shard *sh = NULL;
    (void)consumer;
    int rc = shard_of(ctx, k, &sh);
    if (rc)
        return rc;
    if (!dst->ptr || !dst->write || n > dst->nbytes || (n && !src))
        return kvt_fail(KVT_EINVAL,
                        "ec local consumer: shard %u: %llu bytes do not fit the reservation", k,
                        (unsigned long long)n);
    memcpy(dst->ptr, src, n);
    return 0;
}

static int l_complete(void *ctx, const char *consumer, uint32_t k, const char *t, uint32_t len,
                      const char *rid, bool *accepted)
{
    kvt_ec_shard *sh = NULL;
    bool ready;
    (void)consumer;
    int rc = shard_of(ctx, k, &sh);
    return rc ? rc : kvt_ec_shard_complete(sh, t, len, rid, accepted, &ready);
}

static int l_cancel(void *ctx, const char *consumer, uint32_t k, const char *t, uint32_t len,
                    const char *rid, bool abandon, bool refresh)
{
    kvt_ec_shard *sh = NULL;
    bool done;
    (void)consumer;
    int rc = shard_of(ctx, k, &sh);
    return rc ? rc : kvt_ec_shard_cancel(sh, t, len, rid, abandon, refresh, &done);
}

kvt_ec_consumer_ops kvt_ec_local_consumer_ops(kvt_ec_local_consumer *c)
{
    kvt_ec_consumer_ops o = {l_shards, l_reserve, l_write, l_complete, l_cancel, c};
    return o;
}
