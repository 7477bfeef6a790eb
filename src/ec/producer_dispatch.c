/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The producer's dispatch: the records whose source is bound and whose fence passed are
 * written and completed in batches per (consumer, shard); request_finished cancels or fails
 * what still waits for a source; the reports and stats the worker hands back. The records and
 * their failures: producer.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/array.h"
#include "base/error.h"
#include "base/log.h"
#include "base/util.h"
#include "ec/producer_impl.h"

/* ---- dispatch -------------------------------------------------------------------------------- */

static bool ready_to_push(const prec *r)
{
    return r->used && r->state == KVT_ECP_WAITING_INPUTS && r->has_src &&
           (!r->fence.done || r->fence.done(r->fence.ctx));
}

/* Re-reserves shards whose reservation is not ready and has grown stale, as vLLM's Mooncake
 * producer does: every stale shard abandoned with refresh first (the consumer keeps nothing of
 * the old ones), then each reserved again with a new id - so no shard holds a new reservation
 * while another still holds a stale one of the same record. */
static int refresh_stale(kvt_ec_producer *p, prec *r)
{
    const kvt_ec_consumer_ops *o = &p->cfg.ops;
    uint64_t now = kvt_clock_now(&p->cfg.clock);
    uint64_t stale = 0; /* shards (at most KVT_EC_MAX_SHARDS) */
    for (uint32_t k = 0; k < r->n_shards; k++) {
        shard_res *x = &r->sh[k];
        if (!x->ok || x->r.ready || x->r.cancelled || now - x->at <= p->cfg.refresh_age_ns)
            continue;
        int rc =
            o->cancel(o->ctx, r->consumer.s, k, r->t.s, r->t.len, x->r.reservation_id, true, true);
        if (rc)
            return rc;
        x->ok = false; /* abandoned: nothing to abandon again if a re-reserve fails */
        stale |= 1ull << k;
    }
    for (uint32_t k = 0; k < r->n_shards; k++) {
        if (!(stale >> k & 1))
            continue;
        int rc = kvi_ecp_reserve_shard(p, r, k);
        if (rc)
            return rc;
        p->st.refreshes++;
    }
    return 0;
}

/* A record pushed to the end: DONE, its source let go, its latency observed. */
static void record_done(kvt_ec_producer *p, prec *r)
{
    r->state = KVT_ECP_DONE;
    r->has_src = false; /* the source reference goes */
    p->st.done++;
    uint64_t now = kvt_clock_now(&p->cfg.clock);
    kvi_hist_observe(&p->push_lat, now > r->pushed_ns ? now - r->pushed_ns : 0);
}

/* One dispatch batch: its records (in the producer's scratch arrays). */
typedef struct batch {
    uint32_t *idx, n;
} batch;

/* Room for n writes in the scratch arrays. */
static int write_room(kvt_ec_producer *p, uint64_t n)
{
    void **const arr[] = {(void **)&p->b_w, (void **)&p->b_w_rec};
    const size_t elem[] = {sizeof(*p->b_w), sizeof(*p->b_w_rec)};
    return kvi_ecp_grow(&p->cap_w, n, arr, elem, 2);
}

/* Writes every shard of every record of the batch in one call; records that fail are failed
 * later, the others go on to NOTIFYING. Returns the most shards a record has. */
static uint32_t batch_write(kvt_ec_producer *p, batch *b, const char *consumer)
{
    uint32_t nw = 0, max_shards = 0;
    kvt_ec_write_op *w = p->b_w;
    uint32_t *w_rec = p->b_w_rec;
    for (uint32_t i = 0; i < b->n; i++) {
        prec *r = &p->r[b->idx[i]];
        if (r->src_bytes != r->nbytes) { /* before anything is written */
            kvt_fail(KVT_EINVAL, "ec producer: source of %s is %llu bytes, the spec says %llu",
                     r->h.s, (unsigned long long)r->src_bytes, (unsigned long long)r->nbytes);
            kvi_ecp_fail_later(p, r, "checking the source");
            continue;
        }
        if (refresh_stale(p, r)) {
            kvi_ecp_fail_later(p, r, "refreshing a stale reservation");
            continue;
        }
        r->state = KVT_ECP_WRITING;
        if (r->n_shards > max_shards)
            max_shards = r->n_shards;
        for (uint32_t k = 0; k < r->n_shards; k++) {
            shard_res *x = &r->sh[k];
            if (!x->ok || !x->r.write || x->r.cached || x->r.cancelled)
                continue;
            w[nw] = (kvt_ec_write_op){.shard = k, .dst = &x->r, .src = r->src, .nbytes = r->nbytes};
            w_rec[nw++] = b->idx[i];
        }
    }
    kvi_ecp_call_write(p, consumer, w, nw);
    for (uint32_t j = 0; j < nw; j++) {
        prec *r = &p->r[w_rec[j]];
        if (w[j].rc) {
            if (r->state == KVT_ECP_WRITING) {
                kvt_fail(w[j].rc, "%s", w[j].error);
                kvi_ecp_fail_later(p, r, "writing");
            }
            continue;
        }
        p->st.writes++;
        p->st.bytes_written += r->nbytes;
    }
    for (uint32_t i = 0; i < b->n; i++)
        if (p->r[b->idx[i]].state == KVT_ECP_WRITING)
            p->r[b->idx[i]].state = KVT_ECP_NOTIFYING;
    return max_shards;
}

/* Completes, on shard k, every record of the batch still notifying, in one message. */
static void batch_complete(kvt_ec_producer *p, batch *b, const char *consumer, uint32_t k)
{
    kvt_ec_batch_op *c = p->b_c;
    uint32_t *c_rec = p->b_c_rec;
    uint32_t nc = 0;
    for (uint32_t i = 0; i < b->n; i++) {
        prec *r = &p->r[b->idx[i]];
        shard_res *x = &r->sh[k];
        if (r->state != KVT_ECP_NOTIFYING || k >= r->n_shards || !x->ok || x->r.cancelled)
            continue;
        c[nc] = (kvt_ec_batch_op){
            .transfer_id = r->t.s, .len = r->t.len, .reservation_id = x->r.reservation_id};
        c_rec[nc++] = b->idx[i];
    }
    if (!nc)
        return;
    if (kvi_ecp_call_complete(p, consumer, k, c, nc) == KVT_EIO)
        kvi_ecp_silence(p, &p->r[c_rec[0]], k); /* the message got no answer */
    p->st.completes += nc;
    for (uint32_t j = 0; j < nc; j++) {
        prec *r = &p->r[c_rec[j]];
        if (c[j].rc) {
            kvt_fail(c[j].rc, "%s", c[j].error);
            kvi_ecp_fail_later(p, r, "completing"); /* every shard abandoned, completed ones too */
        } else if (!c[j].accepted) {
            /* the consumer let go of it meanwhile (consumed, cancelled, expired): nothing
             * to undo, and not a failure of the push ([later] in the spec: logged, the
             * batch goes on) */
            KVT_LOG_I("ec producer: shard %u rejected the completion of %s", k, r->t.s);
            p->st.rejected++;
        }
    }
}

/* One batch of ready records of one consumer: every write in flight together, then one
 * completion message per shard. A record that fails anywhere has every shard abandoned
 * (FAILED, reported by take_failures, never raised); the others go on. */
static void push_batch(kvt_ec_producer *p, batch *b, const char *consumer)
{
    uint64_t need = 0;
    for (uint32_t i = 0; i < b->n; i++)
        need += p->r[b->idx[i]].n_shards;
    if (write_room(p, need)) {
        kvt_fail(KVT_ENOMEM, "ec producer: out of memory for %llu writes",
                 (unsigned long long)need);
        for (uint32_t i = 0; i < b->n; i++)
            kvi_ecp_fail_later(p, &p->r[b->idx[i]], "writing");
        kvi_ecp_fail_flush(p);
        return;
    }
    uint32_t max_shards = batch_write(p, b, consumer);
    for (uint32_t k = 0; k < max_shards; k++)
        batch_complete(p, b, consumer, k);
    for (uint32_t i = 0; i < b->n; i++)
        if (p->r[b->idx[i]].state == KVT_ECP_NOTIFYING)
            record_done(p, &p->r[b->idx[i]]);
    kvi_ecp_fail_flush(p); /* the batch's failed records, abandoned together */
}

int kvt_ec_producer_dispatch(kvt_ec_producer *p)
{
    int pushed = 0;
    batch b = {p->b_idx, 0};
    kvi_ecp_silence_reset(p);
    /* batches per consumer with a ready record; waiting records are not looked at */
    for (uint32_t i = 0; i < p->n_r; i++) {
        while (ready_to_push(&p->r[i])) {
            ec_key consumer = p->r[i].consumer;
            uint64_t bytes = 0;
            b.n = 0;
            for (uint32_t j = i; j < p->n_r && b.n < p->cfg.max_batch; j++) {
                prec *r = &p->r[j];
                if (!ready_to_push(r) || !ec_key_eq(&r->consumer, &consumer))
                    continue;
                if (b.n && bytes + r->nbytes > p->cfg.max_batch_bytes)
                    break;
                bytes += r->nbytes;
                b.idx[b.n++] = j;
            }
            p->st.batches++;
            push_batch(p, &b, consumer.s);
            pushed += (int)b.n;
        }
    }
    return pushed;
}

int kvt_ec_producer_request_finished(kvt_ec_producer *p, const char *req_id, uint32_t len)
{
    ec_key req;
    int rc = kvi_ecp_key_set(&req, (kvt_str){req_id, len}, "request id", false);
    if (rc)
        return rc;
    kvi_ecp_silence_reset(p);
    /* the request's records still without a source: abandoned together (one cancel message
     * per shard); each CANCELLED, or FAILED where a shard could not be reached twice */
    p->n_fl = 0;
    for (uint32_t i = 0; i < p->n_r; i++) {
        prec *r = &p->r[i];
        if (!r->used || r->state != KVT_ECP_WAITING_INPUTS || r->has_src ||
            !ec_key_eq(&r->req, &req))
            continue;
        uint32_t cap = p->cap_fl;
        if (kvi_array_grow((void **)&p->fl, &cap, p->n_fl + 1ull, sizeof(*p->fl)))
            return kvt_fail(KVT_ENOMEM, "ec producer: out of memory");
        p->cap_fl = cap;
        r->state = KVT_ECP_CANCEL_PENDING;
        p->fl[p->n_fl++] = i;
    }
    uint32_t cap = p->cap_fl_ok;
    if (p->n_fl && kvi_array_grow((void **)&p->fl_ok, &cap, p->n_fl, sizeof(bool))) {
        for (uint32_t i = 0; i < p->n_fl; i++) /* no room for outcomes: one at a time */
            p->r[p->fl[i]].state = KVT_ECP_WAITING_INPUTS;
        p->n_fl = 0;
        return kvt_fail(KVT_ENOMEM, "ec producer: out of memory");
    }
    p->cap_fl_ok = cap;
    if (p->n_fl)
        kvi_ecp_abandon_many(p, p->fl, p->n_fl, p->fl_ok);
    for (uint32_t i = 0; i < p->n_fl; i++) {
        prec *r = &p->r[p->fl[i]];
        if (p->fl_ok[i]) {
            r->state = KVT_ECP_CANCELLED;
            p->st.cancelled++;
        } else {
            r->state = KVT_ECP_FAILED;
            p->st.failed++;
        }
    }
    p->n_fl = 0;
    return 0;
}

/* ---- reports -----------------------------------------------------------------------------------
 */

bool kvt_ec_producer_pending(const kvt_ec_producer *p)
{
    if (!p) /* an object that failed to be created has nothing pending */
        return false;
    for (uint32_t i = 0; i < p->n_r; i++)
        if (p->r[i].used && !kvi_ecp_terminal(&p->r[i]))
            return true;
    return false;
}

int kvt_ec_producer_report(kvt_ec_producer *p, kvt_ec_worker_meta *out)
{
    if (!out)
        return kvt_fail(KVT_EINVAL, "ec producer: report: NULL out");
    out->pending_saves = out->pending_saves || kvt_ec_producer_pending(p);
    for (uint32_t i = 0; i < p->n_fs; i++) {
        int rc = kvt_ec_worker_meta_add(out, KVT_EC_FAILED_SAVES, p->failed_saves[i].s,
                                        p->failed_saves[i].len);
        if (rc)
            return kvi_fail_wrap(rc, "ec producer: report");
    }
    p->n_fs = 0;
    return 0;
}

uint32_t kvt_ec_producer_take_failures(kvt_ec_producer *p, kvt_ec_push_failure *out, uint32_t cap)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < p->n_r && n < cap; i++) {
        prec *r = &p->r[i];
        if (!r->used || r->state != KVT_ECP_FAILED || r->reported)
            continue;
        memcpy(out[n].mm_hash, r->h.s, r->h.len + 1);
        memcpy(out[n].transfer_id, r->t.s, r->t.len + 1);
        snprintf(out[n].error, sizeof(out[n].error), "%s", r->error);
        r->reported = true;
        n++;
    }
    return n;
}

int kvt_ec_producer_state(const kvt_ec_producer *p, const char *tid, uint32_t len)
{
    ec_key t;
    if (kvi_ecp_key_set(&t, (kvt_str){tid, len}, "transfer id", false))
        return KVT_ECP_NONE;
    const prec *r = kvi_ecp_find(p, &t);
    return r ? r->state : KVT_ECP_NONE;
}

void kvt_ec_producer_get_stats(const kvt_ec_producer *p, kvt_ec_producer_stats *st)
{
    if (!kvi_stats_begin(p, st, sizeof(*st)))
        return;
    *st = p->st;
}

int kvt_ec_producer_prometheus(const kvt_ec_producer *p, char *buf, size_t cap, size_t *len)
{
    if (!p || !len || (cap && !buf))
        return kvt_fail(KVT_EINVAL, "ec producer: prometheus: NULL argument");
    const kvt_ec_producer_stats *st = &p->st;
    uint64_t pending = 0;
    for (uint32_t i = 0; i < p->n_r; i++)
        pending += p->r[i].used && !kvi_ecp_terminal(&p->r[i]);
    kvi_prom pr = {buf, cap, 0};
    const struct {
        const char *name, *help;
        uint64_t v;
        bool gauge;
    } m[] = {
        {"pushes_total", "Push specs received.", st->pushes, false},
        {"reused_total", "Specs that reused a record (the same push).", st->reused, false},
        {"conflicts_total", "Conflicting payloads under one transfer id.", st->conflicts, false},
        {"reservations_total", "Reserve requests sent to shards.", st->reservations, false},
        {"refreshes_total", "Stale reservations refreshed.", st->refreshes, false},
        {"batches_total", "Push batches (one per consumer per dispatch).", st->batches, false},
        {"writes_total", "Shard writes.", st->writes, false},
        {"written_bytes_total", "Bytes written to shards.", st->bytes_written, false},
        {"completes_total", "Completions sent.", st->completes, false},
        {"rejected_total", "Completions a shard rejected (it had let go of the item).",
         st->rejected, false},
        {"abandons_total", "Reservations abandoned.", st->abandons, false},
        {"failed_total", "Pushes failed.", st->failed, false},
        {"cancelled_total", "Pushes cancelled (request finished without a source).", st->cancelled,
         false},
        {"done_total", "Pushes completed on every shard.", st->done, false},
        {"silent_shards_total",
         "Shards that let a control message time out (not asked again in that call).",
         st->silent_shards, false},
        {"pending", "Push records not yet terminal (pending_saves).", pending, true},
    };
    for (size_t i = 0; i < sizeof(m) / sizeof(m[0]); i++)
        kvi_prom_metric(&pr, "kvtier_ec_producer", m[i].name, m[i].help, m[i].gauge, m[i].v);
    kvi_prom_hist(&pr, "kvtier_ec_producer", "push_seconds",
                  "Latency of a push, from push to completed on every shard.", NULL, NULL,
                  &p->push_lat, 1);
    return kvi_prom_finish(&pr, len, "ec producer");
}
