/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The producer worker's push records (spec ec-transfer §1.4 steps 2-6 and 14, §3.5).
 *
 *   WAITING_INPUTS --(source bound, fence passed)--> WRITING --> NOTIFYING --> DONE
 *   WAITING_INPUTS --request finished, no source--> CANCEL_PENDING --> CANCELLED | FAILED
 *   any non-terminal --error--> FAILED (every shard's reservation abandoned first)
 *
 * The reference runs reservations, writes and notifications on thread pools and guards the
 * source until every future that may read it finished. Here every consumer call is made, and
 * has returned, before the record moves on, so that invariant holds by construction: a record
 * refers to its source until it is terminal, and pending() stays true until then.
 *
 * Records are found by transfer id (a map); terminal ones are kept, up to max_records, so a
 * repeated spec in later metadata stays idempotent. This file: the records, their abandons and
 * failures, the life cycle, push and bind_source; the dispatch, request_finished and the
 * reports are in producer_dispatch.c (the shared state: producer_impl.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/array.h"
#include "base/error.h"
#include "base/util.h"
#include "base/log.h"
#include "base/map.h"
#include "base/prom.h"
#include "ec/ec_key.h"
#include "ec/producer_impl.h"

int kvi_ecp_key_set(ec_key *k, kvt_str s, const char *what, bool may_be_empty)
{
    return ec_key_set(k, s.ptr, s.len, may_be_empty, "ec producer", what);
}

bool kvi_ecp_terminal(const prec *r)
{
    return r->state == KVT_ECP_DONE || r->state == KVT_ECP_CANCELLED || r->state == KVT_ECP_FAILED;
}

prec *kvi_ecp_find(const kvt_ec_producer *p, const ec_key *t)
{
    uint32_t i = ec_key_find(&p->map, p->r, sizeof(prec), offsetof(prec, t), t);
    return i == NONE ? NULL : &p->r[i];
}

static void rec_free(kvt_ec_producer *p, prec *r)
{
    uint32_t i = (uint32_t)(r - p->r);
    kvi_map_remove(&p->map, r->t.hash, i);
    if (r->in_wait)
        kvi_map_remove(&p->waiting, r->h.hash, i);
    free(r->sh);
    r->sh = NULL;
    r->used = false;
    kvi_slot_give(p->r, &p->free_r, sizeof(prec), offsetof(prec, free_next), i);
    p->count--;
}

/* Room for one more record: the oldest terminal ones go first. */
static int make_room(kvt_ec_producer *p)
{
    while (p->count >= p->cfg.max_records) {
        prec *oldest = NULL;
        for (uint32_t i = 0; i < p->n_r; i++)
            if (p->r[i].used && kvi_ecp_terminal(&p->r[i]) &&
                (!oldest || p->r[i].seq < oldest->seq))
                oldest = &p->r[i];
        if (!oldest)
            return kvt_fail(KVT_ELIMIT, "ec producer: %u pushes in flight (max_records)", p->count);
        rec_free(p, oldest);
    }
    return 0;
}

/* A new record for t, or NULL with *err set (KVT_ELIMIT, KVT_ENOMEM). */
static prec *rec_new(kvt_ec_producer *p, const ec_key *t, int *err)
{
    if ((*err = make_room(p)))
        return NULL;
    uint32_t i = kvi_slot_take((void **)&p->r, &p->n_r, &p->cap_r, &p->free_r, sizeof(prec),
                               offsetof(prec, free_next));
    if (i == NONE) {
        *err = kvt_fail(KVT_ENOMEM, "ec producer: out of memory");
        return NULL;
    }
    prec *r = &p->r[i];
    memset(r, 0, sizeof(*r));
    r->used = true;
    r->t = *t;
    r->seq = ++p->seq;
    (void)kvi_map_insert(&p->map, t->hash, (uint32_t)(r - p->r)); /* room: max_records */
    p->count++;
    return r;
}

static kvt_ec_item item_of(const prec *r)
{
    kvt_ec_item it;
    memset(&it, 0, sizeof(it));
    it.mm_hash = r->h.s;
    it.mm_hash_len = r->h.len;
    it.nbytes = r->nbytes;
    it.ndim = r->ndim;
    memcpy(it.shape, r->shape, r->ndim * sizeof(uint64_t));
    it.dtype = r->dtype.s;
    it.dtype_len = r->dtype.len;
    return it;
}

static void set_error(prec *r, const char *what)
{
    if (!r->error[0])
        snprintf(r->error, sizeof(r->error), "%s: %s", what, kvt_last_error());
}

/* ---- shards that did not answer ---------------------------------------------------------------
 * A shard that let a control message time out (KVT_EIO: no answer) within one public call is
 * not asked again during that call: a batch of 512 records whose consumer died would otherwise
 * wait two control timeouts per record to abandon each. Its reservations are left to the
 * consumer's TTL reaper; the records say so. Forgotten at the start of every public call. */

void kvi_ecp_silence_reset(kvt_ec_producer *p)
{
    p->silent_mask = 0;
    p->silent_consumer.len = 0;
}

void kvi_ecp_silence(kvt_ec_producer *p, const prec *r, uint32_t k)
{
    if (!ec_key_eq(&p->silent_consumer, &r->consumer)) {
        p->silent_consumer = r->consumer;
        p->silent_mask = 0;
    }
    p->silent_mask |= 1ull << k;
    p->st.silent_shards++;
}

static bool silent(const kvt_ec_producer *p, const prec *r, uint32_t k)
{
    return (p->silent_mask >> k & 1) && ec_key_eq(&p->silent_consumer, &r->consumer);
}

static void op_failed(int rc, int *out, char *err, size_t cap)
{
    *out = rc;
    snprintf(err, cap, "%s", kvt_last_error());
}

/* The single calls one by one: after one got no answer (KVT_EIO), the rest of the batch is not
 * tried (each would wait its own timeout): they fail the same way. */
static bool unanswered(kvt_ec_batch_op *ops, uint32_t i, uint32_t n)
{
    if (ops[i].rc != KVT_EIO)
        return false;
    for (uint32_t j = i + 1; j < n; j++) {
        ops[j].rc = KVT_EIO;
        snprintf(ops[j].error, sizeof(ops[j].error),
                 "not sent: the shard did not answer the batch's previous operation");
    }
    return true;
}

/* After a batch call: an operation left without an outcome gets the call's own failure. */
static void batch_settle(int rc, kvt_ec_batch_op *ops, uint32_t n)
{
    for (uint32_t i = 0; rc && i < n; i++)
        if (!ops[i].rc)
            op_failed(rc, &ops[i].rc, ops[i].error, sizeof(ops[i].error));
}

static int call_cancel(kvt_ec_producer *p, const char *consumer, uint32_t k, kvt_ec_batch_op *ops,
                       uint32_t n)
{
    const kvt_ec_consumer_ops *o = &p->cfg.ops;
    if (o->cancel_batch) {
        int rc = o->cancel_batch(o->ctx, consumer, k, ops, n);
        batch_settle(rc, ops, n);
        return rc;
    }
    for (uint32_t i = 0; i < n; i++) {
        ops[i].rc = o->cancel(o->ctx, consumer, k, ops[i].transfer_id, ops[i].len,
                              ops[i].reservation_id, ops[i].abandon, ops[i].refresh);
        if (ops[i].rc)
            op_failed(ops[i].rc, &ops[i].rc, ops[i].error, sizeof(ops[i].error));
        if (unanswered(ops, i, n))
            break;
    }
    return 0;
}

/* Grows k scratch arrays that share one capacity to hold n entries each (kvi_array_grow);
 * *cap moves only once every one grew (one that grew before a failure stays valid). */
int kvi_ecp_grow(uint32_t *cap, uint64_t n, void **const arr[], const size_t elem[], uint32_t k)
{
    uint32_t c = *cap;
    for (uint32_t i = 0; i < k; i++) {
        c = *cap;
        int rc = kvi_array_grow(arr[i], &c, n, elem[i]);
        if (rc)
            return rc;
    }
    *cap = c;
    return 0;
}

/* Room for n entries in the abandon scratch. */
static int abandon_room(kvt_ec_producer *p, uint32_t n)
{
    void **const arr[] = {(void **)&p->ab_ops, (void **)&p->ab_rec, (void **)&p->ab_grouped};
    const size_t elem[] = {sizeof(*p->ab_ops), sizeof(*p->ab_rec), sizeof(*p->ab_grouped)};
    return kvi_ecp_grow(&p->cap_ab, n, arr, elem, 3);
}

/* Before abandoning: a shard that stopped answering keeps its reservation (the consumer's TTL
 * ends it); a reservation lost with its connection is asked for again, to be abandoned. */
static void abandon_prepare(kvt_ec_producer *p, const uint32_t *idx, uint32_t n, bool *ok)
{
    const kvt_ec_consumer_ops *o = &p->cfg.ops;
    for (uint32_t i = 0; i < n; i++) {
        prec *r = &p->r[idx[i]];
        ok[i] = true;
        for (uint32_t k = 0; k < r->n_shards; k++) {
            shard_res *x = &r->sh[k];
            if ((x->ok || x->lost) && !x->r.cancelled && silent(p, r, k)) {
                kvt_fail(KVT_EIO,
                         "ec producer: shard %u of %s did not answer; its reservation is left "
                         "to the consumer's TTL",
                         k, r->consumer.s);
                set_error(r, "abandoning a reservation");
                x->ok = x->lost = false;
                ok[i] = false;
            } else if (x->lost) {
                kvt_ec_item it = item_of(r);
                x->lost = false;
                if (o->reserve(o->ctx, r->consumer.s, k, r->t.s, r->t.len, &it, &x->r) == 0)
                    x->ok = true;
            }
        }
    }
}

/* Abandons, on shard k, the reservations of the records idx[i..n) of record idx[i]'s consumer
 * not yet grouped, in one batch (asked twice); false when none of them has a shard k. */
static bool abandon_on_shard(kvt_ec_producer *p, const uint32_t *idx, uint32_t n, uint32_t i,
                             uint32_t k, const bool *grouped, kvt_ec_batch_op *ops, uint32_t *rec,
                             bool *ok)
{
    const ec_key *consumer = &p->r[idx[i]].consumer;
    uint32_t m = 0;
    bool more = false;
    for (uint32_t j = i; j < n; j++) {
        prec *r = &p->r[idx[j]];
        if (grouped[j] || !ec_key_eq(&r->consumer, consumer) || k >= r->n_shards)
            continue;
        more = true;
        if (!r->sh[k].ok || r->sh[k].r.cancelled)
            continue;
        ops[m] = (kvt_ec_batch_op){.transfer_id = r->t.s,
                                   .len = r->t.len,
                                   .reservation_id = r->sh[k].r.reservation_id,
                                   .abandon = true};
        rec[m++] = j;
    }
    if (!more)
        return false;
    uint32_t left = m;
    int call_rc = 0;
    for (int attempt = 0; attempt < 2 && left; attempt++) {
        call_rc = call_cancel(p, consumer->s, k, ops, left);
        uint32_t f = 0;
        for (uint32_t j = 0; j < left; j++) {
            prec *r = &p->r[idx[rec[j]]];
            if (!ops[j].rc) {
                r->sh[k].ok = false;
                p->st.abandons++;
                continue;
            }
            ops[f] = ops[j]; /* asked again */
            rec[f++] = rec[j];
        }
        left = f;
    }
    for (uint32_t j = 0; j < left; j++) { /* two attempts failed */
        prec *r = &p->r[idx[rec[j]]];
        kvt_fail(ops[j].rc, "%s", ops[j].error);
        set_error(r, "abandoning a reservation");
        r->sh[k].ok = false;
        p->st.abandons++;
        ok[rec[j]] = false;
    }
    if (left && (call_rc == KVT_EIO || ops[0].rc == KVT_EIO))
        kvi_ecp_silence(p, &p->r[idx[rec[0]]], k);
    return true;
}

/* Abandons the reservations of the records idx[0..n) on every shard that granted one: one
 * cancel message per (consumer, shard) for them all (cancel_batch), a second attempt for the
 * operations that failed. ok[i] becomes false for a record not abandoned everywhere (its error
 * says why). A shard that did not answer is silenced (see above); a reserve whose reply was
 * lost is asked again first (the shard answers its own client with the same reservation). */
void kvi_ecp_abandon_many(kvt_ec_producer *p, const uint32_t *idx, uint32_t n, bool *ok)
{
    kvt_ec_batch_op one_op;
    uint32_t one_rec;
    bool one_grouped;
    kvt_ec_batch_op *ops = &one_op;
    uint32_t *rec = &one_rec;
    bool *grouped = &one_grouped;
    if (n > 1 && abandon_room(p, n)) { /* no scratch: one record at a time */
        for (uint32_t i = 0; i < n; i++)
            kvi_ecp_abandon_many(p, &idx[i], 1, &ok[i]);
        return;
    }
    if (n > 1) {
        ops = p->ab_ops;
        rec = p->ab_rec;
        grouped = p->ab_grouped;
    }
    abandon_prepare(p, idx, n, ok);
    memset(grouped, 0, n * sizeof(bool));
    for (uint32_t i = 0; i < n; i++) {
        if (grouped[i])
            continue;
        for (uint32_t k = 0;
             k < KVT_EC_MAX_SHARDS && abandon_on_shard(p, idx, n, i, k, grouped, ops, rec, ok); k++)
            ;
        const ec_key *consumer = &p->r[idx[i]].consumer;
        for (uint32_t j = i; j < n; j++)
            if (ec_key_eq(&p->r[idx[j]].consumer, consumer))
                grouped[j] = true;
    }
}

/* Abandons the record's reservation on every shard that granted one (two attempts each). */
static bool abandon_all(kvt_ec_producer *p, prec *r)
{
    uint32_t i = (uint32_t)(r - p->r);
    bool ok;
    kvi_ecp_abandon_many(p, &i, 1, &ok);
    return ok;
}

void kvi_ecp_fail(kvt_ec_producer *p, prec *r, const char *what)
{
    set_error(r, what);
    abandon_all(p, r);
    r->state = KVT_ECP_FAILED;
    r->has_src = false; /* the source is no longer read */
    p->st.failed++;
}

/* kvi_ecp_fail() within a batch: the record is FAILED now (the batch leaves it alone), its
 * reservations abandoned with the batch's other failures by fail_flush, in one cancel
 * message per shard. */
void kvi_ecp_fail_later(kvt_ec_producer *p, prec *r, const char *what)
{
    uint32_t cap = p->cap_fl;
    if (kvi_array_grow((void **)&p->fl, &cap, p->n_fl + 1ull, sizeof(*p->fl))) {
        kvi_ecp_fail(p, r, what); /* no room in the list: abandoned now */
        return;
    }
    p->cap_fl = cap;
    set_error(r, what);
    r->state = KVT_ECP_FAILED;
    r->has_src = false;
    p->st.failed++;
    p->fl[p->n_fl++] = (uint32_t)(r - p->r);
}

void kvi_ecp_fail_flush(kvt_ec_producer *p)
{
    uint32_t cap = p->cap_fl_ok;
    if (p->n_fl && kvi_array_grow((void **)&p->fl_ok, &cap, p->n_fl, sizeof(bool)) == 0) {
        p->cap_fl_ok = cap;
        kvi_ecp_abandon_many(p, p->fl, p->n_fl, p->fl_ok);
    } else {
        for (uint32_t i = 0; i < p->n_fl; i++)
            abandon_all(p, &p->r[p->fl[i]]);
    }
    p->n_fl = 0;
}

/* ---- life cycle ----------------------------------------------------------------------------- */

void kvt_ec_producer_config_init(kvt_ec_producer_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->refresh_age_ns = 150ull * 1000000000ull;
    cfg->max_records = 65536;
    cfg->max_batch = 1024;
    cfg->max_batch_bytes = 256ull << 20;
    cfg->clock = kvt_clock_monotonic();
}

int kvt_ec_producer_create(const kvt_ec_producer_config *cfg, kvt_ec_producer **out)
{
    if (!cfg || !out)
        return kvt_fail(KVT_EINVAL, "ec producer: NULL argument");
    if (kvi_check_reserved(cfg->reserved, sizeof(cfg->reserved), "ec producer config"))
        return KVT_EINVAL;
    *out = NULL;
    const kvt_ec_consumer_ops *o = &cfg->ops;
    if (!o->shards || !o->reserve || !o->write || !o->complete || !o->cancel)
        return kvt_fail(KVT_EINVAL, "ec producer: every consumer operation is required");
    if (!cfg->max_records || cfg->max_records > (1u << 24) || !cfg->clock.now_ns)
        return kvt_fail(KVT_EINVAL, "ec producer: max_records (1..16 Mi) and a clock needed");
    if (!cfg->max_batch || cfg->max_batch > (1u << 20) || !cfg->max_batch_bytes)
        return kvt_fail(KVT_EINVAL, "ec producer: max_batch 1..1 Mi and max_batch_bytes > 0");
    kvt_ec_producer *p = calloc(1, sizeof(*p));
    if (!p)
        return kvt_fail(KVT_ENOMEM, "ec producer: out of memory");
    p->cfg = *cfg;
    p->free_r = NONE;
    int rc = kvi_map_init(&p->map, cfg->max_records + 1);
    if (!rc && (rc = kvi_map_init(&p->waiting, cfg->max_records + 1)))
        kvi_map_free(&p->map);
    if (!rc) {
        p->b_idx = malloc(cfg->max_batch * sizeof(*p->b_idx));
        p->b_c_rec = malloc(cfg->max_batch * sizeof(*p->b_c_rec));
        p->b_c = malloc(cfg->max_batch * sizeof(*p->b_c));
        if (!p->b_idx || !p->b_c_rec || !p->b_c) {
            kvi_map_free(&p->map);
            kvi_map_free(&p->waiting);
            rc = KVT_ENOMEM;
        }
    }
    if (rc) {
        free(p->b_idx);
        free(p->b_c_rec);
        free(p->b_c);
        free(p);
        return kvi_fail_wrap(rc, "ec producer");
    }
    *out = p;
    return 0;
}

void kvt_ec_producer_destroy(kvt_ec_producer *p)
{
    if (!p)
        return;
    kvi_ecp_silence_reset(p);
    for (uint32_t i = 0; i < p->n_r; i++)
        if (p->r[i].used && !kvi_ecp_terminal(&p->r[i]))
            abandon_all(p, &p->r[i]); /* shutdown: cancel the orphans first */
    kvi_map_free(&p->map);
    kvi_map_free(&p->waiting);
    free(p->b_idx);
    free(p->b_c_rec);
    free(p->b_c);
    free(p->b_w);
    free(p->b_w_rec);
    free(p->ab_ops);
    free(p->ab_rec);
    free(p->ab_grouped);
    free(p->fl);
    free(p->fl_ok);
    free(p->rs_ops);
    free(p->rs_items);
    free(p->rs_rec);
    free(p->rs_done);
    for (uint32_t i = 0; i < p->n_r; i++)
        free(p->r[i].sh);
    free(p->r);
    free(p->failed_saves);
    free(p);
}

/* ---- push ------------------------------------------------------------------------------------ */

static bool same_push(const prec *r, const kvt_ec_push_spec *s)
{
    return r->h.len == s->mm_hash.len && memcmp(r->h.s, s->mm_hash.ptr, s->mm_hash.len) == 0 &&
           r->nbytes == s->nbytes && r->ndim == s->ndim &&
           memcmp(r->shape, s->shape, s->ndim * sizeof(uint64_t)) == 0 &&
           r->dtype.len == s->dtype.len && memcmp(r->dtype.s, s->dtype.ptr, s->dtype.len) == 0 &&
           r->consumer.len == s->consumer_zmq.len &&
           memcmp(r->consumer.s, s->consumer_zmq.ptr, s->consumer_zmq.len) == 0;
}

static void add_failed_save(kvt_ec_producer *p, const ec_key *req)
{
    if (!req->len)
        return;
    for (uint32_t i = 0; i < p->n_fs; i++)
        if (ec_key_eq(&p->failed_saves[i], req))
            return;
    if (kvi_array_grow((void **)&p->failed_saves, &p->cap_fs, p->n_fs + 1ull, sizeof(ec_key)) == 0)
        p->failed_saves[p->n_fs++] = *req;
}

/* ---- batched consumer calls: the ops' batched forms, or their single calls one by one ---- */

/* The batched calls return the batch call's own failure (0 when each operation's rc tells). */
static int call_reserve(kvt_ec_producer *p, const char *consumer, uint32_t k, kvt_ec_batch_op *ops,
                        uint32_t n)
{
    const kvt_ec_consumer_ops *o = &p->cfg.ops;
    if (o->reserve_batch) {
        int rc = o->reserve_batch(o->ctx, consumer, k, ops, n);
        batch_settle(rc, ops, n);
        return rc;
    }
    for (uint32_t i = 0; i < n; i++) {
        ops[i].rc = o->reserve(o->ctx, consumer, k, ops[i].transfer_id, ops[i].len, ops[i].item,
                               &ops[i].reply);
        if (ops[i].rc)
            op_failed(ops[i].rc, &ops[i].rc, ops[i].error, sizeof(ops[i].error));
        if (unanswered(ops, i, n))
            break;
    }
    return 0;
}

int kvi_ecp_call_complete(kvt_ec_producer *p, const char *consumer, uint32_t k,
                          kvt_ec_batch_op *ops, uint32_t n)
{
    const kvt_ec_consumer_ops *o = &p->cfg.ops;
    if (o->complete_batch) {
        int rc = o->complete_batch(o->ctx, consumer, k, ops, n);
        batch_settle(rc, ops, n);
        return rc;
    }
    for (uint32_t i = 0; i < n; i++) {
        ops[i].rc = o->complete(o->ctx, consumer, k, ops[i].transfer_id, ops[i].len,
                                ops[i].reservation_id, &ops[i].accepted);
        if (ops[i].rc)
            op_failed(ops[i].rc, &ops[i].rc, ops[i].error, sizeof(ops[i].error));
        if (unanswered(ops, i, n))
            break;
    }
    return 0;
}

void kvi_ecp_call_write(kvt_ec_producer *p, const char *consumer, kvt_ec_write_op *w, uint32_t n)
{
    const kvt_ec_consumer_ops *o = &p->cfg.ops;
    if (o->write_batch) {
        int rc = o->write_batch(o->ctx, consumer, w, n);
        for (uint32_t i = 0; rc && i < n; i++)
            if (!w[i].rc)
                op_failed(rc, &w[i].rc, w[i].error, sizeof(w[i].error));
        return;
    }
    for (uint32_t i = 0; i < n; i++) {
        w[i].rc = o->write(o->ctx, consumer, w[i].shard, w[i].dst, w[i].src, w[i].nbytes);
        if (w[i].rc)
            op_failed(w[i].rc, &w[i].rc, w[i].error, sizeof(w[i].error));
    }
}

/* A record's reserve on shard k came back (rc, the reply in r->sh[k].r): 0 when it holds. */
int kvi_ecp_reserved(kvt_ec_producer *p, prec *r, uint32_t k, int rc)
{
    r->sh[k].ok = rc == 0;
    r->sh[k].lost = rc == KVT_EIO; /* no answer: the reserve may have landed all the same */
    r->sh[k].at = kvt_clock_now(&p->cfg.clock);
    p->st.reservations++;
    if (!rc && !r->sh[k].r.cancelled && r->sh[k].r.write && r->sh[k].r.nbytes != r->nbytes)
        return kvt_fail(KVT_EPROTO, "ec producer: shard %u reserved %llu bytes, %llu asked", k,
                        (unsigned long long)r->sh[k].r.nbytes, (unsigned long long)r->nbytes);
    return rc;
}

/* Reserves one shard; a refusal (an error reply) is recorded as such. */
int kvi_ecp_reserve_shard(kvt_ec_producer *p, prec *r, uint32_t k)
{
    const kvt_ec_consumer_ops *o = &p->cfg.ops;
    kvt_ec_item it = item_of(r);
    int rc = o->reserve(o->ctx, r->consumer.s, k, r->t.s, r->t.len, &it, &r->sh[k].r);
    return kvi_ecp_reserved(p, r, k, rc);
}

/* The record of one spec: *idx is the new record's index, or NONE when the spec shares an
 * existing transfer, conflicts with one, or failed before any reserve (FAILED). */
static int push_record(kvt_ec_producer *p, const kvt_ec_push_spec *s, uint32_t *idx)
{
    int rc;
    *idx = NONE;
    if (!s)
        return kvt_fail(KVT_EINVAL, "ec producer: NULL spec");
    if ((rc = kvt_ec_push_spec_validate(s)))
        return kvi_fail_wrap(rc, "ec producer");
    ec_key t, req;
    if ((rc = kvi_ecp_key_set(&t, s->transfer_id, "transfer id", false)) ||
        (rc = kvi_ecp_key_set(&req, s->request_id, "request id", true)))
        return rc;
    p->st.pushes++;
    prec *r = kvi_ecp_find(p, &t);
    if (r) {
        if (same_push(r, s)) { /* the same encoding asked for twice shares the transfer */
            p->st.reused++;
            return 0;
        }
        p->st.conflicts++; /* a different payload under the id: that request fails */
        add_failed_save(p, &req);
        return 0;
    }
    if (!(r = rec_new(p, &t, &rc)))
        return kvi_fail_wrap(rc, "ec producer: push");
    if ((rc = kvi_ecp_key_set(&r->h, s->mm_hash, "mm_hash", false)) ||
        (rc = kvi_ecp_key_set(&r->dtype, s->dtype, "dtype", false)) ||
        (rc = kvi_ecp_key_set(&r->consumer, s->consumer_zmq, "consumer address", false))) {
        rec_free(p, r);
        return rc;
    }
    r->req = req;
    r->pushed_ns = kvt_clock_now(&p->cfg.clock);
    r->nbytes = s->nbytes;
    r->ndim = s->ndim;
    memcpy(r->shape, s->shape, s->ndim * sizeof(uint64_t));
    r->state = KVT_ECP_WAITING_INPUTS;
    (void)kvi_map_insert(&p->waiting, r->h.hash, (uint32_t)(r - p->r)); /* room: max_records */
    r->in_wait = true;
    const kvt_ec_consumer_ops *o = &p->cfg.ops;
    uint32_t n = 0;
    if ((rc = o->shards(o->ctx, r->consumer.s, &n)) || n == 0 || n > KVT_EC_MAX_SHARDS) {
        if (!rc)
            kvt_fail(KVT_EPROTO, "ec producer: consumer %s reports %u shards", r->consumer.s, n);
        kvi_ecp_fail(p, r, "discovering the consumer's shards"); /* no RPC without a topology */
        return 0;
    }
    if (!(r->sh = calloc(n, sizeof(*r->sh)))) {
        kvt_fail(KVT_ENOMEM, "ec producer: out of memory");
        kvi_ecp_fail(p, r, "reserving");
        return 0;
    }
    r->n_shards = n;
    *idx = (uint32_t)(r - p->r);
    return 0;
}

/* The reserve call's scratch, kept from one call to the next, for n records. */
static int grow_reserve_scratch(kvt_ec_producer *p, uint32_t n)
{
    void **const arr[] = {(void **)&p->rs_ops, (void **)&p->rs_items, (void **)&p->rs_rec,
                          (void **)&p->rs_done};
    const size_t elem[] = {sizeof(*p->rs_ops), sizeof(*p->rs_items), sizeof(*p->rs_rec),
                           sizeof(*p->rs_done)};
    return kvi_ecp_grow(&p->cap_rs, n, arr, elem, 4);
}

/* One reserve message to shard k of consumer for the m records rec[] (ops[] their items):
 * each record takes its reply, or fails (the shards it reserved already are abandoned). */
static void reserve_on_shard(kvt_ec_producer *p, const ec_key *consumer, uint32_t k,
                             kvt_ec_batch_op *ops, const uint32_t *rec, uint32_t m)
{
    if (call_reserve(p, consumer->s, k, ops, m) == KVT_EIO)
        kvi_ecp_silence(p, &p->r[rec[0]], k); /* the message got no answer */
    for (uint32_t j = 0; j < m; j++) {
        prec *r = &p->r[rec[j]];
        if (!ops[j].rc)
            r->sh[k].r = ops[j].reply;
        else
            kvt_fail(ops[j].rc, "%s", ops[j].error);
        if (kvi_ecp_reserved(p, r, k, ops[j].rc))
            kvi_ecp_fail_later(p, r, "reserving");
    }
}

/* Reserves the new records idx[0..n) on every shard of their consumers: one batch per
 * (consumer, shard). A record refused by a shard is FAILED (the shards it holds abandoned)
 * and asks no further shard. */
static int reserve_new(kvt_ec_producer *p, const uint32_t *idx, uint32_t n)
{
    int rc = grow_reserve_scratch(p, n);
    kvt_ec_batch_op *ops = p->rs_ops;
    kvt_ec_item *items = p->rs_items;
    uint32_t *rec = p->rs_rec;
    bool *done = p->rs_done;
    if (!rc)
        memset(done, 0, n * sizeof(*done));
    for (uint32_t i = 0; i < n; i++)
        if (rc) { /* nothing reserved: these records fail (nothing to abandon) */
            p->r[idx[i]].n_shards = 0;
            kvi_ecp_fail_later(p, &p->r[idx[i]], "reserving");
        }
    for (uint32_t i = 0; !rc && i < n; i++) {
        if (done[i])
            continue;
        const ec_key *consumer = &p->r[idx[i]].consumer;
        for (uint32_t k = 0; k < KVT_EC_MAX_SHARDS; k++) {
            uint32_t m = 0;
            for (uint32_t j = i; j < n; j++) {
                prec *r = &p->r[idx[j]];
                if (done[j] || !ec_key_eq(&r->consumer, consumer) || k >= r->n_shards ||
                    r->state != KVT_ECP_WAITING_INPUTS)
                    continue;
                items[m] = item_of(r);
                ops[m] =
                    (kvt_ec_batch_op){.transfer_id = r->t.s, .len = r->t.len, .item = &items[m]};
                rec[m++] = idx[j];
            }
            if (!m)
                break;
            reserve_on_shard(p, consumer, k, ops, rec, m);
        }
        for (uint32_t j = i; j < n; j++)
            if (ec_key_eq(&p->r[idx[j]].consumer, consumer))
                done[j] = true;
    }
    kvi_ecp_fail_flush(
        p); /* the refused records' other reservations, one cancel message per shard */
    return rc;
}

int kvt_ec_producer_push_many(kvt_ec_producer *p, const kvt_ec_push_spec *specs, uint32_t n)
{
    if (!p || (!specs && n))
        return kvt_fail(KVT_EINVAL, "ec producer: NULL argument");
    kvi_ecp_silence_reset(p);
    uint32_t *fresh = malloc((n ? n : 1) * sizeof(*fresh)), nf = 0;
    if (!fresh)
        return kvt_fail(KVT_ENOMEM, "ec producer: out of memory");
    int first = 0;
    for (uint32_t i = 0; i < n && !first; i++) {
        uint32_t idx;
        first = push_record(p, &specs[i], &idx);
        if (!first && idx != NONE)
            fresh[nf++] = idx;
    }
    if (nf) { /* a failed spec's message survives the reserves of those before it */
        char msg[256] = "";
        if (first)
            snprintf(msg, sizeof(msg), "%s", kvt_last_error());
        (void)reserve_new(p, fresh, nf);
        if (first)
            kvt_fail(first, "%s", msg);
    }
    free(fresh);
    return first;
}

int kvt_ec_producer_push(kvt_ec_producer *p, const kvt_ec_push_spec *s)
{
    if (!s)
        return kvt_fail(KVT_EINVAL, "ec producer: NULL spec");
    return kvt_ec_producer_push_many(p, s, 1);
}

/* Why record r's push does not describe the output desc (NULL: it does), written into buf. */
static const char *desc_mismatch(const prec *r, const kvt_ec_source_desc *d, char *buf, size_t cap)
{
    bool same = d->ndim == r->ndim && strlen(d->dtype) == r->dtype.len &&
                memcmp(d->dtype, r->dtype.s, r->dtype.len) == 0;
    for (uint32_t i = 0; same && i < d->ndim; i++)
        same = d->shape[i] == r->shape[i];
    if (same)
        return NULL;
    char have[96] = "", want[96] = "";
    for (uint32_t i = 0, o = 0, q = 0; i < KVT_EC_MAX_DIMS; i++) {
        if (i < d->ndim && o < sizeof(have))
            o += (uint32_t)snprintf(have + o, sizeof(have) - o, "%s%llu", i ? "," : "",
                                    (unsigned long long)d->shape[i]);
        if (i < r->ndim && q < sizeof(want))
            q += (uint32_t)snprintf(want + q, sizeof(want) - q, "%s%llu", i ? "," : "",
                                    (unsigned long long)r->shape[i]);
    }
    snprintf(buf, cap, "source of %.64s is (%.40s) %.24s but the push says (%.40s) %.24s", r->h.s,
             have, d->dtype, want, r->dtype.s);
    return buf;
}

static int check_desc(const kvt_ec_source_desc *d)
{
    if (d->ndim > KVT_EC_MAX_DIMS)
        return kvt_fail(KVT_EINVAL, "ec producer: bind_source: ndim %u exceeds %u", d->ndim,
                        KVT_EC_MAX_DIMS);
    if (!d->dtype || !d->dtype[0] || strlen(d->dtype) > KVT_EC_KEY_MAX)
        return kvt_fail(KVT_EINVAL, "ec producer: bind_source: dtype must be 1..%u bytes",
                        KVT_EC_KEY_MAX);
    return 0;
}

static int bind_source(kvt_ec_producer *p, const char *mm_hash, uint32_t len, const void *src,
                       uint64_t nbytes, const kvt_ec_source_desc *desc, const kvt_ec_fence *fence)
{
    ec_key h;
    int rc = kvi_ecp_key_set(&h, (kvt_str){mm_hash, len}, "mm_hash", false);
    if (rc)
        return rc;
    if (!src && nbytes)
        return kvt_fail(KVT_EINVAL, "ec producer: NULL source");
    if (desc && (rc = check_desc(desc)))
        return rc;
    /* the records listed under h: each leaves the list once bound, or once found no longer
     * waiting (the walk collects them first: the map must not change during it) */
    uint32_t found[64], nf;
    int bound = 0;
    do {
        nf = 0;
        uint64_t pos = kvi_map_probe_start(&p->waiting, h.hash);
        uint32_t i;
        while (nf < 64 && kvi_map_probe_next(&p->waiting, h.hash, &pos, &i))
            if (ec_key_eq(&p->r[i].h, &h))
                found[nf++] = i;
        for (uint32_t k = 0; k < nf; k++) {
            prec *r = &p->r[found[k]];
            kvi_map_remove(&p->waiting, h.hash, found[k]);
            r->in_wait = false;
            if (!r->used || r->state != KVT_ECP_WAITING_INPUTS || r->has_src)
                continue;
            char why[256];
            const char *bad = desc ? desc_mismatch(r, desc, why, sizeof(why)) : NULL;
            if (bad) { /* never pushed: the consumer would read it with the wrong shape; its
                        * request fails through failed_saves (the message is this one's, not
                        * whatever an earlier call left in kvt_last_error) */
                KVT_LOG_W("ec producer: push %s failed: %s", r->t.s, bad);
                kvt_fail(KVT_EINVAL, "ec producer: %s", bad);
                kvi_ecp_fail(p, r, "binding the source");
                add_failed_save(p, &r->req);
                continue;
            }
            r->src = src;
            r->src_bytes = nbytes;
            r->fence = fence ? *fence : (kvt_ec_fence){NULL, NULL};
            r->has_src = true;
            bound++;
        }
    } while (nf == 64);
    return bound;
}

int kvt_ec_producer_bind_source(kvt_ec_producer *p, const char *mm_hash, uint32_t len,
                                const void *src, uint64_t nbytes, const kvt_ec_fence *fence)
{
    return bind_source(p, mm_hash, len, src, nbytes, NULL, fence);
}

int kvt_ec_producer_bind_source_typed(kvt_ec_producer *p, const char *mm_hash, uint32_t len,
                                      const void *src, uint64_t nbytes,
                                      const kvt_ec_source_desc *desc, const kvt_ec_fence *fence)
{
    if (!desc)
        return kvt_fail(KVT_EINVAL, "ec producer: bind_source_typed: NULL desc");
    return bind_source(p, mm_hash, len, src, nbytes, desc, fence);
}
