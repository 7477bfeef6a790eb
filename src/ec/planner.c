/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The producer scheduler's push planning (spec ec-transfer §1.4 step 1, §2.2, §2.4's
 * has_pending_push_work and failed_saves, the [later] up-front conflict check).
 *
 * A prepared push per transfer id (a map), shared by the requests that asked for the same
 * encoding; the spec is queued once for the next metadata; a transfer id no request shares
 * any more is forgotten, so the set does not grow with the engine's lifetime.
 */
#include <stdlib.h>
#include <string.h>

#include "base/array.h"
#include "base/util.h"
#include "base/error.h"
#include "base/map.h"
#include "ec/ec_key.h"

#define NONE UINT32_MAX

typedef struct plan {
    bool used, queued;
    ec_key t, h, dtype, consumer;
    uint64_t nbytes;
    uint32_t ndim;
    uint64_t shape[KVT_EC_MAX_DIMS];
    uint32_t sharers;
    uint32_t free_next;
} plan;

typedef struct share { /* (plan, request) */
    uint32_t plan;
    ec_key req;
} share;

struct kvt_ec_planner {
    uint32_t max;
    plan *pl;
    uint32_t n_pl, cap_pl, free_pl, count;
    kvi_map map;
    share *sh;
    uint32_t n_sh, cap_sh;
    ec_key *failed;
    uint32_t n_failed, cap_failed;
    bool pending;
};

static int lkey_set(ec_key *k, kvt_str s, const char *what)
{
    return ec_key_set(k, s.ptr, s.len, false, "ec planner", what);
}

static plan *find(const kvt_ec_planner *p, const ec_key *t)
{
    uint32_t i = ec_key_find(&p->map, p->pl, sizeof(plan), offsetof(plan, t), t);
    return i == NONE ? NULL : &p->pl[i];
}

static void fail_request(kvt_ec_planner *p, const ec_key *req)
{
    for (uint32_t i = 0; i < p->n_failed; i++)
        if (ec_key_eq(&p->failed[i], req))
            return;
    if (kvi_array_grow((void **)&p->failed, &p->cap_failed, p->n_failed + 1ull, sizeof(ec_key)) ==
        0)
        p->failed[p->n_failed++] = *req;
}

int kvt_ec_planner_create(uint32_t max_prepared, kvt_ec_planner **out)
{
    if (!out)
        return kvt_fail(KVT_EINVAL, "ec planner: NULL out");
    *out = NULL;
    if (max_prepared == 0)
        max_prepared = 65536;
    if (max_prepared > (1u << 24))
        return kvt_fail(KVT_EINVAL, "ec planner: max_prepared %u above 16 Mi", max_prepared);
    kvt_ec_planner *p = calloc(1, sizeof(*p));
    if (!p)
        return kvt_fail(KVT_ENOMEM, "ec planner: out of memory");
    p->max = max_prepared;
    p->free_pl = NONE;
    int rc = kvi_map_init(&p->map, max_prepared);
    if (rc) {
        free(p);
        return kvi_fail_wrap(rc, "ec planner");
    }
    *out = p;
    return 0;
}

void kvt_ec_planner_destroy(kvt_ec_planner *p)
{
    if (!p)
        return;
    kvi_map_free(&p->map);
    free(p->pl);
    free(p->sh);
    free(p->failed);
    free(p);
}

static bool same_payload(const plan *x, const kvt_ec_push_spec *s)
{
    return x->h.len == s->mm_hash.len && memcmp(x->h.s, s->mm_hash.ptr, s->mm_hash.len) == 0 &&
           x->nbytes == s->nbytes && x->ndim == s->ndim &&
           memcmp(x->shape, s->shape, s->ndim * sizeof(uint64_t)) == 0 &&
           x->dtype.len == s->dtype.len && memcmp(x->dtype.s, s->dtype.ptr, s->dtype.len) == 0 &&
           x->consumer.len == s->consumer_zmq.len &&
           memcmp(x->consumer.s, s->consumer_zmq.ptr, s->consumer_zmq.len) == 0;
}

static int add_sharer(kvt_ec_planner *p, plan *x, const ec_key *req)
{
    uint32_t idx = (uint32_t)(x - p->pl);
    for (uint32_t i = 0; i < p->n_sh; i++)
        if (p->sh[i].plan == idx && ec_key_eq(&p->sh[i].req, req))
            return 0; /* prepared for this request already */
    if (kvi_array_grow((void **)&p->sh, &p->cap_sh, p->n_sh + 1ull, sizeof(share)))
        return kvt_fail(KVT_ENOMEM, "ec planner: out of memory");
    p->sh[p->n_sh++] = (share){idx, *req};
    x->sharers++;
    return 0;
}

int kvt_ec_planner_prepare(kvt_ec_planner *p, const kvt_ec_push_spec *s)
{
    if (!s)
        return kvt_fail(KVT_EINVAL, "ec planner: NULL spec");
    if (s->consumer_zmq.len == 0)
        return 0; /* no consumer to push to */
    int rc = kvt_ec_push_spec_validate(s);
    if (rc)
        return kvi_fail_wrap(rc, "ec planner");
    ec_key t, req;
    if ((rc = lkey_set(&t, s->transfer_id, "transfer id")) ||
        (rc = lkey_set(&req, s->request_id, "request id")))
        return rc;
    plan *x = find(p, &t);
    if (x) {
        if (!same_payload(x, s)) { /* the conflict fails this request, up front */
            fail_request(p, &req);
            return 0;
        }
        return add_sharer(p, x, &req);
    }
    if (p->count >= p->max)
        return kvt_fail(KVT_ELIMIT, "ec planner: %u transfer ids prepared (max_prepared)",
                        p->count);
    ec_key h, dtype, consumer;
    if ((rc = lkey_set(&h, s->mm_hash, "mm_hash")) || (rc = lkey_set(&dtype, s->dtype, "dtype")) ||
        (rc = lkey_set(&consumer, s->consumer_zmq, "consumer address")))
        return rc;
    uint32_t idx = kvi_slot_take((void **)&p->pl, &p->n_pl, &p->cap_pl, &p->free_pl, sizeof(plan),
                                 offsetof(plan, free_next));
    if (idx == NONE)
        return kvt_fail(KVT_ENOMEM, "ec planner: out of memory");
    x = &p->pl[idx];
    memset(x, 0, sizeof(*x));
    x->t = t;
    x->h = h;
    x->dtype = dtype;
    x->consumer = consumer;
    x->used = true;
    x->nbytes = s->nbytes;
    x->ndim = s->ndim;
    memcpy(x->shape, s->shape, s->ndim * sizeof(uint64_t));
    x->queued = true;
    (void)kvi_map_insert(&p->map, t.hash, (uint32_t)(x - p->pl)); /* room: max */
    p->count++;
    if ((rc = add_sharer(p, x, &req)))
        return rc;
    return 1;
}

int kvt_ec_planner_build_meta(kvt_ec_planner *p, kvt_ec_meta *out)
{
    if (!out)
        return kvt_fail(KVT_EINVAL, "ec planner: NULL out");
    for (uint32_t i = 0; i < p->n_pl; i++) {
        plan *x = &p->pl[i];
        if (!x->used || !x->queued)
            continue;
        const ec_key *req = NULL; /* the first request it was prepared for */
        for (uint32_t k = 0; k < p->n_sh && !req; k++)
            if (p->sh[k].plan == i)
                req = &p->sh[k].req;
        kvt_ec_push_spec sp;
        memset(&sp, 0, sizeof(sp));
        sp.mm_hash = (kvt_str){x->h.s, x->h.len};
        sp.nbytes = x->nbytes;
        sp.ndim = x->ndim;
        memcpy(sp.shape, x->shape, x->ndim * sizeof(uint64_t));
        sp.dtype = (kvt_str){x->dtype.s, x->dtype.len};
        sp.consumer_zmq = (kvt_str){x->consumer.s, x->consumer.len};
        sp.transfer_id = (kvt_str){x->t.s, x->t.len};
        sp.request_id = req ? (kvt_str){req->s, req->len} : (kvt_str){"", 0};
        int rc = kvt_ec_meta_add_push(out, &sp);
        if (rc)
            return kvi_fail_wrap(rc, "ec planner: build_meta");
        x->queued = false; /* emitted exactly once */
    }
    return 0;
}

uint32_t kvt_ec_planner_bindings(const kvt_ec_planner *p, const char *req_id, uint32_t len,
                                 kvt_ec_binding *out, uint32_t cap)
{
    ec_key req;
    if (lkey_set(&req, (kvt_str){req_id, len}, "request id"))
        return 0;
    uint32_t n = 0;
    for (uint32_t i = 0; i < p->n_sh && n < cap; i++) {
        if (!ec_key_eq(&p->sh[i].req, &req))
            continue;
        const plan *x = &p->pl[p->sh[i].plan];
        memcpy(out[n].mm_hash, x->h.s, x->h.len + 1);
        memcpy(out[n].transfer_id, x->t.s, x->t.len + 1);
        n++;
    }
    return n;
}

int kvt_ec_planner_request_finished(kvt_ec_planner *p, const char *req_id, uint32_t len)
{
    ec_key req;
    int rc = lkey_set(&req, (kvt_str){req_id, len}, "request id");
    if (rc)
        return rc;
    uint32_t k = 0;
    for (uint32_t i = 0; i < p->n_sh; i++) {
        if (!ec_key_eq(&p->sh[i].req, &req)) {
            p->sh[k++] = p->sh[i];
            continue;
        }
        plan *x = &p->pl[p->sh[i].plan];
        if (--x->sharers == 0) { /* nobody shares it: forgotten */
            kvi_map_remove(&p->map, x->t.hash, p->sh[i].plan);
            x->used = false;
            kvi_slot_give(p->pl, &p->free_pl, sizeof(plan), offsetof(plan, free_next),
                          p->sh[i].plan);
            p->count--;
        }
    }
    p->n_sh = k;
    return 0;
}

int kvt_ec_planner_apply_output(kvt_ec_planner *p, const kvt_ec_worker_meta *agg)
{
    if (!agg)
        return kvt_fail(KVT_EINVAL, "ec planner: NULL report");
    int rc = kvt_ec_worker_meta_validate(agg);
    if (rc)
        return kvi_fail_wrap(rc, "ec planner: apply_output");
    p->pending = agg->pending_saves;
    for (uint32_t i = 0; i < agg->failed_saves.n; i++) {
        ec_key req;
        if (lkey_set(&req, agg->failed_saves.items[i], "request id") == 0)
            fail_request(p, &req);
    }
    return 0;
}

KVI_GETTER(bool, kvt_ec_planner_has_pending_push_work, kvt_ec_planner, pending)

uint32_t kvt_ec_planner_take_failed(kvt_ec_planner *p, char (*out)[KVT_EC_KEY_MAX + 1],
                                    uint32_t cap)
{
    uint32_t n = p->n_failed < cap ? p->n_failed : cap;
    if (n == 0)
        return 0;
    for (uint32_t i = 0; i < n; i++)
        memcpy(out[i], p->failed[i].s, p->failed[i].len + 1);
    memmove(p->failed, p->failed + n, (p->n_failed - n) * sizeof(ec_key));
    p->n_failed -= n;
    return n;
}
