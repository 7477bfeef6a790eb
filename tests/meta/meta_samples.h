/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Representative messages of every kind, built through the public API and encoded. Used by
 * the robustness test (mutations of valid messages) and by fuzz/make_corpus (seed corpus).
 */
#ifndef KVT_META_SAMPLES_H
#define KVT_META_SAMPLES_H

#include <stdlib.h>
#include <string.h>

#include "kvtier/meta.h"

#define KVT_SAMPLE_KINDS 6

static inline void kvt_sample_load_spec(kvt_ec_load_spec *s, const char *h, bool local)
{
    memset(s, 0, sizeof(*s));
    s->mm_hash = (kvt_str){h, (uint32_t)strlen(h)};
    s->ndim = 2;
    s->shape[0] = 576;
    s->shape[1] = 1024;
    s->dtype = (kvt_str){"bfloat16", 8};
    s->nbytes = 576ull * 1024 * 2;
    s->transfer_id = (kvt_str){"c0ffee00c0ffee00", 16};
    s->local = local;
}

static inline void kvt_sample_push_spec(kvt_ec_push_spec *s, const char *h, const char *req)
{
    memset(s, 0, sizeof(*s));
    s->mm_hash = (kvt_str){h, (uint32_t)strlen(h)};
    s->ndim = 3;
    s->shape[0] = 4;
    s->shape[1] = 64;
    s->shape[2] = 1280;
    s->dtype = (kvt_str){"float16", 7};
    s->nbytes = 4ull * 64 * 1280 * 2;
    s->consumer_zmq = (kvt_str){"tcp://10.0.0.7:17100", 20};
    s->transfer_id = (kvt_str){"0123456789abcdef", 16};
    s->request_id = (kvt_str){req, (uint32_t)strlen(req)};
}

/* Encodes sample `variant` (0..2) of message `kind` into a malloc'd buffer. NULL on failure. */
static inline unsigned char *kvt_sample_encode(uint32_t kind, int variant, size_t *len)
{
    unsigned char *buf = NULL;
    size_t need = 0;
    int rc = -1;
    *len = 0;
    switch (kind) {
    case KVT_META_OFFLOAD: {
        kvt_offload_meta m;
        kvt_offload_meta_init(&m);
        if (variant >= 1) {
            m.load_event = 12;
            for (uint32_t i = 0; i < 5; i++)
                kvt_offload_meta_add_load(&m, 40 + i, 900 + 2 * i);
            kvt_offload_meta_add_load_req(&m, 11, "req-a", 5);
            kvt_offload_meta_add_load_req(&m, 12, "req-b", 5);
            kvt_offload_meta_add_load_req(&m, 12, "cmpl-7f3e-0", 11);
        }
        if (variant >= 2) {
            m.store_event = 30;
            for (uint32_t i = 0; i < 7; i++)
                kvt_offload_meta_add_store(&m, 3 + i, 70 + i);
            m.need_flush = true;
            /* three-tier lists: one invalid load destination, a promotion, write-backs */
            kvt_offload_meta_add_load_invalid(&m, 42);
            m.tiers[0].load_event = 4;
            kvt_offload_meta_add_tier_load(&m, 1, 17, 902);
            m.tiers[0].store_event = 8;
            for (uint32_t i = 0; i < 3; i++)
                kvt_offload_meta_add_tier_store(&m, 1, 70 + i, 200 + i);
            /* remote reads (tier 2) of an engine of two ranks: two owners' ranks, three
             * sources of two parts; a publication and two withdrawals */
            uint32_t own[2], id;
            uint8_t hash[16];
            kvt_offload_meta_add_remote_owner(&m, "inst-a#0", "10.1.2.3:41000", 7, &own[0]);
            kvt_offload_meta_add_remote_owner(&m, "inst-a#1", "10.1.2.4:41000", 2, &own[1]);
            m.tiers[1].load_event = 3;
            for (uint32_t i = 0; i < 3; i++) {
                kvt_remote_src parts[2] = {{.owner = own[0], .slot = 5 + i, .generation = 11 + i},
                                           {.owner = own[1], .slot = 5 + i, .generation = 12}};
                memset(hash, 0x30 + (int)i, sizeof(hash));
                kvt_offload_meta_add_remote_parts(&m, 2, 2, parts, hash, 16, &id);
                kvt_offload_meta_add_tier_load(&m, 2, id, 300 + i);
            }
            kvt_offload_meta_add_remote_pub(&m, 2, 70, hash, 16);
            kvt_offload_meta_add_remote_withdraw(&m, 2, 300, 16);
            kvt_offload_meta_add_remote_withdraw(&m, 2, 301, 16);
        }
        need = kvt_offload_meta_encoded_size(&m);
        buf = malloc(need);
        rc = buf ? kvt_offload_meta_encode(&m, buf, need, len) : -1;
        kvt_offload_meta_release(&m);
        break;
    }
    case KVT_META_OFFLOAD_WORKER: {
        kvt_offload_worker_meta m;
        kvt_offload_worker_meta_init(&m);
        for (int i = 0; i < variant * 2; i++)
            kvt_offload_worker_meta_add(&m, 100 - 7 * i, 1 + (uint32_t)i);
        if (variant == 2) {
            kvt_offload_worker_meta_add_failed(&m, 93);
            kvt_event_report_add(&m.tier_stores[0], 5, 1);
            kvt_event_report_add(&m.tier_loads[0], 2, 2);
            kvt_event_report_add_failed(&m.tier_loads[0], 2);
            kvt_event_report_add(&m.tier_loads[1], 3, 1); /* remote reads, two blocks failed */
            kvt_offload_worker_meta_add_failed_promo(&m, 301);
            kvt_offload_worker_meta_add_failed_promo(&m, 300);
        }
        need = kvt_offload_worker_meta_encoded_size(&m);
        buf = malloc(need);
        rc = buf ? kvt_offload_worker_meta_encode(&m, buf, need, len) : -1;
        kvt_offload_worker_meta_release(&m);
        break;
    }
    case KVT_META_EC: {
        kvt_ec_meta m;
        kvt_ec_meta_init(&m);
        kvt_ec_load_spec l;
        kvt_ec_push_spec p;
        if (variant >= 1) {
            kvt_sample_load_spec(&l, "sha256:aaaa", false);
            kvt_ec_meta_add_load(&m, &l);
            kvt_sample_push_spec(&p, "sha256:bbbb", "req-9");
            kvt_ec_meta_add_push(&m, &p);
            m.has_freed = true;
        }
        if (variant >= 2) {
            kvt_sample_load_spec(&l, "sha256:cccc", true);
            kvt_ec_meta_add_load(&m, &l);
            kvt_ec_meta_add_freed(&m, "sha256:dddd", 11);
        }
        need = kvt_ec_meta_encoded_size(&m);
        buf = malloc(need);
        rc = buf ? kvt_ec_meta_encode(&m, buf, need, len) : -1;
        kvt_ec_meta_release(&m);
        break;
    }
    case KVT_META_EC_WORKER: {
        kvt_ec_worker_meta m;
        kvt_ec_worker_meta_init(&m);
        if (variant >= 1) {
            kvt_ec_worker_meta_add(&m, KVT_EC_LOADED, "img-2", 5);
            kvt_ec_worker_meta_add(&m, KVT_EC_LOADED, "img-1", 5);
            kvt_ec_worker_meta_add(&m, KVT_EC_RECLAIMED, "img-0", 5);
        }
        if (variant >= 2) {
            kvt_ec_worker_meta_add(&m, KVT_EC_FAILED_LOADS, "img-3", 5);
            kvt_ec_worker_meta_add(&m, KVT_EC_FAILED_SAVES, "req-4", 5);
            m.pending_saves = true;
        }
        need = kvt_ec_worker_meta_encoded_size(&m);
        buf = malloc(need);
        rc = buf ? kvt_ec_worker_meta_encode(&m, buf, need, len) : -1;
        kvt_ec_worker_meta_release(&m);
        break;
    }
    case KVT_META_EC_LOAD_SPEC: {
        kvt_ec_load_spec s;
        kvt_sample_load_spec(&s, variant ? "sha256:0123" : "h", variant == 2);
        need = kvt_ec_load_spec_encoded_size(&s);
        buf = malloc(need);
        rc = buf ? kvt_ec_load_spec_encode(&s, buf, need, len) : -1;
        break;
    }
    default: {
        kvt_ec_push_spec s;
        kvt_sample_push_spec(&s, "sha256:4567", variant ? "req-1" : "");
        need = kvt_ec_push_spec_encoded_size(&s);
        buf = malloc(need);
        rc = buf ? kvt_ec_push_spec_encode(&s, buf, need, len) : -1;
        break;
    }
    }
    if (rc != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

#endif
