/* SPDX-License-Identifier: Apache-2.0 */
/*
 * KV-offload metadata, worker -> scheduler (vLLM SimpleCPUOffloadWorkerMetadata): the C
 * object, its builders, validation, aggregation over ranks and wire encoding; the scheduler's
 * message is offload_meta.c's.
 *
 * Body of a worker message (after the 12-byte header): the report stores, then
 *   u32 n; n x u32 failed_load_src        tier-0 blocks whose load failed, ascending
 *   u32 n; n x u32 failed_promo           tier-0 blocks whose promotion failed, ascending
 *   u8  n_tiers; n_tiers x, for each tier t with completions (ascending):
 *     u8  t; the reports tier_stores[t - 1], tier_loads[t - 1]
 * where a report is
 *   u32 n; n x { i64 event; u32 count }   events strictly ascending
 *   u32 n; n x i64 failed event           ascending, each among the completed
 * A tier without transfers (without completions) is left out, and a decoder refuses an empty
 * section: the encoding stays canonical, and a message says which tiers it speaks of.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "meta/meta_internal.h"

/* ---- worker -> scheduler --------------------------------------------------------------- */

static void report_release(kvt_event_report *r)
{
    free(r->events);
    free(r->counts);
    free(r->failed);
    memset(r, 0, sizeof(*r));
}

/* The reports of a worker message, in wire order: stores, then each tier's stores and loads. */
#define N_REPORTS (1 + 2 * (KVT_MAX_TIERS - 1))
static kvt_event_report *report(kvt_offload_worker_meta *m, int i)
{
    if (i == 0)
        return &m->stores;
    return (i - 1) % 2 == 0 ? &m->tier_stores[(i - 1) / 2] : &m->tier_loads[(i - 1) / 2];
}
static const kvt_event_report *creport(const kvt_offload_worker_meta *m, int i)
{
    return report((kvt_offload_worker_meta *)m, i);
}
/* Report i's name in messages: a table, as validation runs on every report of every step. */
static const char *const report_names[] = {
    "store events",       "tier 1 store events", "tier 1 load events", "tier 2 store events",
    "tier 2 load events", "tier 3 store events", "tier 3 load events"};
_Static_assert(sizeof(report_names) / sizeof(report_names[0]) == N_REPORTS,
               "name the reports of every tier");

/* Tier t's section (t >= 1) of a worker message holds reports 2t - 1 and 2t: it is written
 * when either has a completion (failed events are among the completed). */
static bool tier_reports_empty(const kvt_offload_worker_meta *m, uint32_t t)
{
    return m->tier_stores[t - 1].n_completed == 0 && m->tier_loads[t - 1].n_completed == 0;
}

void kvt_offload_worker_meta_init(kvt_offload_worker_meta *m)
{
    memset(m, 0, sizeof(*m));
}

void kvt_offload_worker_meta_clear(kvt_offload_worker_meta *m)
{
    for (int i = 0; i < N_REPORTS; i++)
        report(m, i)->n_completed = report(m, i)->n_failed = 0;
    m->n_failed_load_src = 0;
    m->n_failed_promo = 0;
}

void kvt_offload_worker_meta_release(kvt_offload_worker_meta *m)
{
    for (int i = 0; i < N_REPORTS; i++)
        report_release(report(m, i));
    free(m->failed_load_src);
    free(m->failed_promo);
    m->failed_load_src = m->failed_promo = NULL;
    m->n_failed_load_src = m->cap_failed_load_src = 0;
    m->n_failed_promo = m->cap_failed_promo = 0;
}

/* ---- failed load sources and promotions: ascending sets of tier-0 blocks ---------------- */

typedef struct blockset {
    uint32_t **a, *n, *cap;
    const char *what;
} blockset;

static blockset fls_of(kvt_offload_worker_meta *m)
{
    return (blockset){&m->failed_load_src, &m->n_failed_load_src, &m->cap_failed_load_src,
                      "failed load sources"};
}

static blockset fpr_of(kvt_offload_worker_meta *m)
{
    return (blockset){&m->failed_promo, &m->n_failed_promo, &m->cap_failed_promo,
                      "failed promotions"};
}

static int set_reserve(blockset s, uint64_t need)
{
    if (need > KVT_META_MAX_BLOCKS)
        return kvt_fail(KVT_ELIMIT, "meta: more than %u %s", KVT_META_MAX_BLOCKS, s.what);
    return need ? kvi_meta_grow((void **)s.a, s.cap, (uint32_t)need, sizeof(uint32_t)) : 0;
}

static int set_add(blockset s, uint32_t block)
{
    if (block == 0u) /* 0: the null block (kvtier/pool.h) */
        return kvt_fail(KVT_EINVAL, "meta: %s: the null block", s.what);
    uint32_t i = *s.n;
    while (i > 0 && (*s.a)[i - 1] > block)
        i--;
    if (i > 0 && (*s.a)[i - 1] == block)
        return 0;
    int rc = set_reserve(s, (uint64_t)*s.n + 1);
    if (rc)
        return rc;
    memmove(*s.a + i + 1, *s.a + i, (size_t)(*s.n - i) * sizeof(uint32_t));
    (*s.a)[i] = block;
    (*s.n)++;
    return 0;
}

int kvt_offload_worker_meta_add_failed_load(kvt_offload_worker_meta *m, uint32_t block)
{
    if (!m)
        return kvt_fail(KVT_EINVAL, "meta: failed load source: NULL metadata");
    return set_add(fls_of(m), block);
}

int kvt_offload_worker_meta_add_failed_promo(kvt_offload_worker_meta *m, uint32_t block)
{
    if (!m)
        return kvt_fail(KVT_EINVAL, "meta: failed promotion: NULL metadata");
    return set_add(fpr_of(m), block);
}

/* d's set united with the n_src blocks of src (room reserved: *d.n + n_src). */
static void set_merge(blockset d, const uint32_t *src, uint32_t n_src)
{
    uint32_t a = *d.n, b = n_src, k = a + b;
    uint32_t *x = *d.a;
    /* merge from the back into the reserved room, then drop duplicates */
    while (b > 0) {
        if (a > 0 && x[a - 1] > src[b - 1])
            x[--k] = x[--a];
        else
            x[--k] = src[--b];
    }
    uint32_t n = *d.n + n_src, w = 0;
    for (uint32_t i = 0; i < n; i++)
        if (w == 0 || x[i] != x[w - 1])
            x[w++] = x[i];
    *d.n = w;
}

static int set_validate(const uint32_t *a, uint32_t n, const char *what)
{
    if (n > KVT_META_MAX_BLOCKS)
        return kvt_fail(KVT_ELIMIT, "%s: %u exceed the limit of %u", what, n, KVT_META_MAX_BLOCKS);
    if (n && !a)
        return kvt_fail(KVT_EINVAL, "%s: NULL list", what);
    for (uint32_t i = 0; i < n; i++)
        if (a[i] == 0u || (i && a[i] <= a[i - 1]))
            return kvt_fail(KVT_EINVAL,
                            "%s: block %u at index %u is the null block or not ascending", what,
                            a[i], i);
    return 0;
}

static int report_reserve(kvt_event_report *m, uint32_t need)
{
    if (need > KVT_META_MAX_ITEMS)
        return kvt_fail(KVT_ELIMIT, "meta: more than %u completed events", KVT_META_MAX_ITEMS);
    uint32_t cap_e = m->cap, cap_c = m->cap;
    int rc = kvi_meta_grow((void **)&m->events, &cap_e, need, sizeof(int64_t));
    if (!rc)
        rc = kvi_meta_grow((void **)&m->counts, &cap_c, need, sizeof(uint32_t));
    if (rc)
        return rc;
    m->cap = cap_e < cap_c ? cap_e : cap_c;
    return 0;
}

int kvt_event_report_add(kvt_event_report *m, int64_t event, uint32_t count)
{
    if (event < 0 || count == 0)
        return kvt_fail(KVT_EINVAL,
                        "meta: completed event %lld with count %u (need an event >= 0 and a "
                        "count >= 1)",
                        (long long)event, count);
    uint32_t i = kvi_lower_bound_i64(m->events, m->n_completed, event);
    if (i < m->n_completed && m->events[i] == event) {
        if (m->counts[i] > UINT32_MAX - count)
            return kvt_fail(KVT_ELIMIT, "meta: count of event %lld overflows", (long long)event);
        m->counts[i] += count;
        return 0;
    }
    int rc = report_reserve(m, m->n_completed + 1);
    if (rc)
        return rc;
    memmove(&m->events[i + 1], &m->events[i], (size_t)(m->n_completed - i) * sizeof(int64_t));
    memmove(&m->counts[i + 1], &m->counts[i], (size_t)(m->n_completed - i) * sizeof(uint32_t));
    m->events[i] = event;
    m->counts[i] = count;
    m->n_completed++;
    return 0;
}

bool kvt_event_report_failed(const kvt_event_report *m, int64_t event)
{
    uint32_t i = kvi_lower_bound_i64(m->failed, m->n_failed, event);
    return i < m->n_failed && m->failed[i] == event;
}

/* Inserts event into the failed set (no check that it is completed). */
static int insert_failed(kvt_event_report *m, int64_t event)
{
    uint32_t i = kvi_lower_bound_i64(m->failed, m->n_failed, event);
    if (i < m->n_failed && m->failed[i] == event)
        return 0;
    if (m->n_failed >= KVT_META_MAX_ITEMS)
        return kvt_fail(KVT_ELIMIT, "meta: more than %u failed events", KVT_META_MAX_ITEMS);
    int rc = kvi_meta_grow((void **)&m->failed, &m->cap_failed, m->n_failed + 1, sizeof(int64_t));
    if (rc)
        return rc;
    memmove(&m->failed[i + 1], &m->failed[i], (size_t)(m->n_failed - i) * sizeof(int64_t));
    m->failed[i] = event;
    m->n_failed++;
    return 0;
}

int kvt_event_report_add_failed(kvt_event_report *m, int64_t event)
{
    uint32_t i = kvi_lower_bound_i64(m->events, m->n_completed, event);
    if (event < 0 || i == m->n_completed || m->events[i] != event)
        return kvt_fail(KVT_EINVAL, "meta: failed event %lld is not a completed event",
                        (long long)event);
    return insert_failed(m, event);
}

int kvt_offload_worker_meta_add(kvt_offload_worker_meta *m, int64_t event, uint32_t count)
{
    return kvt_event_report_add(&m->stores, event, count);
}

int kvt_offload_worker_meta_add_failed(kvt_offload_worker_meta *m, int64_t event)
{
    return kvt_event_report_add_failed(&m->stores, event);
}

bool kvt_offload_worker_meta_failed(const kvt_offload_worker_meta *m, int64_t event)
{
    return kvt_event_report_failed(&m->stores, event);
}

/* Makes room in dst for dst + src (failed union, completed union) and checks the counts for
 * overflow, so that report_merge cannot fail. *u receives the size of the completed union. */
static int report_prepare(kvt_event_report *dst, const kvt_event_report *src, uint32_t *u)
{
    if (src->n_failed) {
        uint64_t need = (uint64_t)dst->n_failed + src->n_failed;
        if (need > KVT_META_MAX_ITEMS)
            return kvt_fail(KVT_ELIMIT, "meta: aggregate: too many failed events");
        int rc =
            kvi_meta_grow((void **)&dst->failed, &dst->cap_failed, (uint32_t)need, sizeof(int64_t));
        if (rc)
            return rc;
    }
    uint32_t i = 0, j = 0, n = 0;
    while (i < dst->n_completed || j < src->n_completed) {
        if (j == src->n_completed || (i < dst->n_completed && dst->events[i] < src->events[j])) {
            i++;
        } else if (i == dst->n_completed || src->events[j] < dst->events[i]) {
            j++;
        } else {
            if (dst->counts[i] > UINT32_MAX - src->counts[j])
                return kvt_fail(KVT_ELIMIT, "meta: aggregate: count of event %lld overflows",
                                (long long)dst->events[i]);
            i++;
            j++;
        }
        n++;
    }
    *u = n;
    return report_reserve(dst, n);
}

static void report_merge(kvt_event_report *dst, const kvt_event_report *src, uint32_t u)
{
    /* Merge from the back so dst's entries are moved before they are overwritten. */
    int64_t a = (int64_t)dst->n_completed - 1, b = (int64_t)src->n_completed - 1;
    for (int64_t k = (int64_t)u - 1; k >= 0; k--) {
        if (b < 0 || (a >= 0 && dst->events[a] > src->events[b])) {
            dst->events[k] = dst->events[a];
            dst->counts[k] = dst->counts[a];
            a--;
        } else if (a < 0 || src->events[b] > dst->events[a]) {
            dst->events[k] = src->events[b];
            dst->counts[k] = src->counts[b];
            b--;
        } else {
            dst->events[k] = dst->events[a];
            dst->counts[k] = dst->counts[a] + src->counts[b];
            a--;
            b--;
        }
    }
    dst->n_completed = u;
    for (uint32_t k = 0; k < src->n_failed; k++)
        (void)insert_failed(dst, src->failed[k]); /* room reserved */
}

int kvt_offload_worker_meta_aggregate(kvt_offload_worker_meta *dst,
                                      const kvt_offload_worker_meta *src)
{
    if (!dst || !src)
        return kvt_fail(KVT_EINVAL, "meta: aggregate: NULL argument");
    uint32_t u[N_REPORTS];
    for (int i = 0; i < N_REPORTS; i++) { /* every check and allocation before any change */
        int rc = report_prepare(report(dst, i), creport(src, i), &u[i]);
        if (rc)
            return rc;
    }
    int rc = set_reserve(fls_of(dst), (uint64_t)dst->n_failed_load_src + src->n_failed_load_src);
    if (!rc)
        rc = set_reserve(fpr_of(dst), (uint64_t)dst->n_failed_promo + src->n_failed_promo);
    if (rc)
        return rc;
    for (int i = 0; i < N_REPORTS; i++)
        report_merge(report(dst, i), creport(src, i), u[i]);
    set_merge(fls_of(dst), src->failed_load_src, src->n_failed_load_src);
    set_merge(fpr_of(dst), src->failed_promo, src->n_failed_promo);
    return 0;
}

static int report_validate(const kvt_event_report *m, const char *what)
{
    if (m->n_completed > KVT_META_MAX_ITEMS)
        return kvt_fail(KVT_ELIMIT, "completed %s: %u entries exceed the limit of %u", what,
                        m->n_completed, KVT_META_MAX_ITEMS);
    if (m->n_completed && (!m->events || !m->counts))
        return kvt_fail(KVT_EINVAL, "completed %s: NULL list", what);
    for (uint32_t i = 0; i < m->n_completed; i++) {
        if (m->events[i] < 0 || (i && m->events[i] <= m->events[i - 1]))
            return kvt_fail(KVT_EINVAL,
                            "completed %s: event %lld at index %u is negative or not ascending",
                            what, (long long)m->events[i], i);
        if (m->counts[i] == 0)
            return kvt_fail(KVT_EINVAL, "completed %s: event %lld has count 0", what,
                            (long long)m->events[i]);
    }
    if (m->n_failed > m->n_completed)
        return kvt_fail(KVT_EINVAL, "failed %s: more entries than completed events", what);
    if (m->n_failed && !m->failed)
        return kvt_fail(KVT_EINVAL, "failed %s: NULL list", what);
    for (uint32_t i = 0, j = 0; i < m->n_failed; i++) {
        if (i && m->failed[i] <= m->failed[i - 1])
            return kvt_fail(KVT_EINVAL, "failed %s: event %lld not ascending", what,
                            (long long)m->failed[i]);
        while (j < m->n_completed && m->events[j] < m->failed[i])
            j++;
        if (j == m->n_completed || m->events[j] != m->failed[i])
            return kvt_fail(KVT_EINVAL, "failed %s: event %lld is not a completed event", what,
                            (long long)m->failed[i]);
    }
    return 0;
}

int kvt_offload_worker_meta_validate(const kvt_offload_worker_meta *m)
{
    if (!m)
        return kvt_fail(KVT_EINVAL, "meta: NULL worker metadata");
    for (int i = 0; i < N_REPORTS; i++) {
        int rc = report_validate(creport(m, i), report_names[i]);
        if (rc)
            return rc;
    }
    int rc = set_validate(m->failed_load_src, m->n_failed_load_src, "failed load sources");
    return rc ? rc : set_validate(m->failed_promo, m->n_failed_promo, "failed promotions");
}

static bool report_equal(const kvt_event_report *a, const kvt_event_report *b)
{
    if (a->n_completed != b->n_completed || a->n_failed != b->n_failed)
        return false;
    for (uint32_t i = 0; i < a->n_completed; i++)
        if (a->events[i] != b->events[i] || a->counts[i] != b->counts[i])
            return false;
    for (uint32_t i = 0; i < a->n_failed; i++)
        if (a->failed[i] != b->failed[i])
            return false;
    return true;
}

bool kvt_offload_worker_meta_equal(const kvt_offload_worker_meta *a,
                                   const kvt_offload_worker_meta *b)
{
    for (int i = 0; i < N_REPORTS; i++)
        if (!report_equal(creport(a, i), creport(b, i)))
            return false;
    return a->n_failed_load_src == b->n_failed_load_src &&
           kvi_meta_blocks_equal(a->failed_load_src, b->failed_load_src, a->n_failed_load_src) &&
           a->n_failed_promo == b->n_failed_promo &&
           kvi_meta_blocks_equal(a->failed_promo, b->failed_promo, a->n_failed_promo);
}

size_t kvt_offload_worker_meta_encoded_size(const kvt_offload_worker_meta *m)
{
    size_t n = KVT_META_HEADER_LEN + 1 + 4 + 4 * (size_t)m->n_failed_load_src + 4 +
               4 * (size_t)m->n_failed_promo;
    for (int i = 0; i < N_REPORTS; i++) {
        const kvt_event_report *e = creport(m, i);
        if (i && tier_reports_empty(m, (uint32_t)(i - 1) / 2 + 1))
            continue;
        n +=
            (i && (i - 1) % 2 == 0) + 4 + 12 * (size_t)e->n_completed + 4 + 8 * (size_t)e->n_failed;
    }
    return n;
}

int kvt_offload_worker_meta_encode(const kvt_offload_worker_meta *m, void *buf, size_t cap,
                                   size_t *len)
{
    int rc = kvt_offload_worker_meta_validate(m);
    if (rc)
        return kvi_fail_wrap(rc, "meta: encode worker metadata");
    size_t need = kvt_offload_worker_meta_encoded_size(m);
    if ((rc = kvi_wire_check_out(buf, cap, need, len)))
        return rc;
    kvi_wr w = {buf};
    kvi_wire_header(&w, KVT_META_OFFLOAD_WORKER, need - KVT_META_HEADER_LEN);
    uint32_t sections = 0;
    for (uint32_t t = 1; t < KVT_MAX_TIERS; t++)
        sections += !tier_reports_empty(m, t);
    for (int r = 0; r < N_REPORTS; r++) {
        const kvt_event_report *e = creport(m, r);
        uint32_t t = r ? (uint32_t)(r - 1) / 2 + 1 : 0;
        if (r == 1) {
            kvi_meta_wr_blocks(&w, m->failed_load_src, m->n_failed_load_src);
            kvi_meta_wr_blocks(&w, m->failed_promo, m->n_failed_promo);
            wr_u8(&w, (uint8_t)sections);
        }
        if (t && tier_reports_empty(m, t))
            continue;
        if (t && (r - 1) % 2 == 0)
            wr_u8(&w, (uint8_t)t);
        wr_u32(&w, e->n_completed);
        for (uint32_t i = 0; i < e->n_completed; i++) {
            wr_u64(&w, (uint64_t)e->events[i]);
            wr_u32(&w, e->counts[i]);
        }
        wr_u32(&w, e->n_failed);
        for (uint32_t i = 0; i < e->n_failed; i++)
            wr_u64(&w, (uint64_t)e->failed[i]);
    }
    return 0;
}

static int decode_report(kvi_rd *r, kvt_event_report *m, const char *what)
{
    uint32_t n;
    int rc = rd_count(r, &n, KVT_META_MAX_ITEMS, 12, what);
    if (rc || (rc = report_reserve(m, n)))
        return rc;
    for (uint32_t i = 0; i < n; i++) {
        int64_t ev;
        uint32_t count;
        if ((rc = rd_i64(r, &ev, what)) || (rc = rd_u32(r, &count, what)))
            return rc;
        m->events[i] = ev;
        m->counts[i] = count;
    }
    m->n_completed = n;
    if ((rc = rd_count(r, &n, KVT_META_MAX_ITEMS, 8, what)))
        return rc;
    if (n && (rc = kvi_meta_grow((void **)&m->failed, &m->cap_failed, n, sizeof(int64_t))))
        return rc;
    for (uint32_t i = 0; i < n; i++)
        if ((rc = rd_i64(r, &m->failed[i], what)))
            return rc;
    m->n_failed = n;
    return 0;
}

static int decode_worker(void *obj, kvi_rd *r)
{
    kvt_offload_worker_meta *m = obj;
    uint8_t n_tiers, tier = 0;
    int rc = decode_report(r, &m->stores, report_names[0]);
    if (rc ||
        (rc = kvi_meta_rd_blocks(r, &m->failed_load_src, &m->cap_failed_load_src,
                                 &m->n_failed_load_src, "failed load sources")) ||
        (rc = kvi_meta_rd_blocks(r, &m->failed_promo, &m->cap_failed_promo, &m->n_failed_promo,
                                 "failed promotions")) ||
        (rc = kvi_meta_rd_tier_count(r, &n_tiers)))
        return rc;
    for (uint32_t i = 0; i < n_tiers; i++) {
        if ((rc = kvi_meta_rd_tier(r, i, &tier)))
            return rc;
        int k = 2 * tier - 1;
        if ((rc = decode_report(r, report(m, k), report_names[k])) ||
            (rc = decode_report(r, report(m, k + 1), report_names[k + 1])))
            return rc;
        if (tier_reports_empty(m, tier))
            return kvt_fail(KVT_EPROTO, "tier %u: an empty section", tier);
    }
    return kvt_offload_worker_meta_validate(m);
}

int kvt_offload_worker_meta_decode(kvt_offload_worker_meta *m, const void *buf, size_t len)
{
    kvt_offload_worker_meta_clear(m);
    int rc = kvi_wire_decode(buf, len, KVT_META_OFFLOAD_WORKER, decode_worker, m,
                             "meta: decode worker metadata");
    if (rc)
        kvt_offload_worker_meta_clear(m);
    return rc;
}
