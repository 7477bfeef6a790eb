/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The producer's state, shared by its two files (and nothing else):
 *   producer.c           records, abandons and failures, life cycle, push, bind_source
 *   producer_dispatch.c  dispatch (writes and completions in batches per shard),
 *                        request_finished, reports and stats
 */
#ifndef KVT_EC_PRODUCER_IMPL_H
#define KVT_EC_PRODUCER_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include "base/map.h"
#include "base/prom.h"
#include "ec/ec_key.h"

#define NONE UINT32_MAX

typedef struct shard_res {
    kvt_ec_reply r;
    bool ok;     /* reserved (not refused) */
    bool lost;   /* the reserve got no answer: it may have landed */
    uint64_t at; /* when */
} shard_res;

typedef struct prec {
    bool used, reported;
    uint8_t state;
    ec_key t, h, consumer, req, dtype;
    uint64_t nbytes;
    uint32_t ndim;
    uint64_t shape[KVT_EC_MAX_DIMS];
    uint32_t n_shards;
    shard_res *sh; /* n_shards of them (a record is small; most consumers have few shards) */
    const void *src;
    uint64_t src_bytes;
    kvt_ec_fence fence;
    bool has_src;
    bool in_wait; /* listed in the producer's `waiting` map under its mm_hash */
    char error[256];
    uint64_t seq;
    uint64_t pushed_ns; /* when the push arrived: its latency to DONE lands in the histogram */
    uint32_t free_next;
} prec;

struct kvt_ec_producer {
    kvt_ec_producer_config cfg;
    prec *r;
    uint32_t n_r, cap_r, free_r, count;
    uint64_t seq;
    kvi_map map;
    kvi_map waiting; /* mm_hash -> records that may still wait for their source */
    ec_key *failed_saves;
    uint32_t n_fs, cap_fs;
    kvt_ec_producer_stats st;
    kvi_hist push_lat; /* push-to-done latency */
    /* a dispatch batch's scratch, kept from one dispatch to the next */
    uint32_t *b_idx, *b_c_rec, *b_w_rec, cap_w;
    kvt_ec_batch_op *b_c;
    kvt_ec_write_op *b_w;
    /* abandon scratch, and the records a batch failed (abandoned together at its end) */
    kvt_ec_batch_op *ab_ops;
    uint32_t *ab_rec, cap_ab;
    bool *ab_grouped;
    uint32_t *fl, n_fl, cap_fl, cap_fl_ok;
    bool *fl_ok;
    uint64_t silent_mask; /* shards of silent_consumer that did not answer in this call */
    ec_key silent_consumer;
    /* push_many's reserve scratch, likewise */
    kvt_ec_batch_op *rs_ops;
    kvt_ec_item *rs_items;
    uint32_t *rs_rec, cap_rs;
    bool *rs_done;
};

/* ---- records (producer.c) ------------------------------------------------------------------ */

/* *k from s, checked (what names it in the message; an empty one only if may_be_empty). */
int kvi_ecp_key_set(ec_key *k, kvt_str s, const char *what, bool may_be_empty);
/* DONE, CANCELLED or FAILED. */
bool kvi_ecp_terminal(const prec *r);
/* The record of transfer id t, or NULL. */
prec *kvi_ecp_find(const kvt_ec_producer *p, const ec_key *t);
/* A record's reserve on shard k came back (rc, the reply in r->sh[k].r): 0 when it holds. */
int kvi_ecp_reserved(kvt_ec_producer *p, prec *r, uint32_t k, int rc);
/* Reserves one shard; a refusal (an error reply) is recorded as such. */
int kvi_ecp_reserve_shard(kvt_ec_producer *p, prec *r, uint32_t k);

/* ---- shards that did not answer, batched consumer calls (producer.c) ----------------------- */

/* Forgets the shards silenced in the last public call (at the start of every one). */
void kvi_ecp_silence_reset(kvt_ec_producer *p);
/* Shard k of r's consumer did not answer: not asked again during this call. */
void kvi_ecp_silence(kvt_ec_producer *p, const prec *r, uint32_t k);
/* Grows k scratch arrays that share one capacity to hold n entries each (kvi_array_grow);
 * *cap moves only once every one grew (one that grew before a failure stays valid). */
int kvi_ecp_grow(uint32_t *cap, uint64_t n, void **const arr[], const size_t elem[], uint32_t k);
/* The consumer's complete for n operations on shard k: its batched form, or one call each. */
int kvi_ecp_call_complete(kvt_ec_producer *p, const char *consumer, uint32_t k,
                          kvt_ec_batch_op *ops, uint32_t n);
/* The consumer's writes of n operations: its batched form, or one call each. */
void kvi_ecp_call_write(kvt_ec_producer *p, const char *consumer, kvt_ec_write_op *w, uint32_t n);

/* ---- abandons and failures (producer.c) ---------------------------------------------------- */

/* Abandons the reservations of records idx[0..n) on every shard, one cancel message per
 * (consumer, shard); ok[i] false for a record not abandoned everywhere (its error says why). */
void kvi_ecp_abandon_many(kvt_ec_producer *p, const uint32_t *idx, uint32_t n, bool *ok);
/* r FAILED with what, its reservations abandoned now. */
void kvi_ecp_fail(kvt_ec_producer *p, prec *r, const char *what);
/* kvi_ecp_fail() within a batch: r FAILED now, its reservations abandoned with the batch's
 * other failures by kvi_ecp_fail_flush, in one cancel message per shard. */
void kvi_ecp_fail_later(kvt_ec_producer *p, prec *r, const char *what);
/* Abandons the reservations of the records kvi_ecp_fail_later failed. */
void kvi_ecp_fail_flush(kvt_ec_producer *p);

#endif
