/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The offload manager's metrics: kvt_offload_stats (totals, with the disk tier's counters
 * under their historical names), per-tier stats (kvt_offload_get_tier_stats) and the
 * Prometheus exposition, whose tier families carry the tier's name as a label.
 */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "base/prom.h"
#include "port/remote_port.h"
#include "offload/offload_internal.h"
#include "offload/stats_schema.h"

/* ---- metrics --------------------------------------------------------------------------- */

static void fill_stats(const kvt_offload *m, kvt_offload_stats *s);

size_t kvt_offload_stats_read(const kvt_offload *m, kvt_offload_stats *s, size_t size)
{
    if (!s)
        return sizeof(*s);
    kvt_offload_stats all;
    memset(&all, 0, sizeof(all)); /* an object that failed to be created reads as all zero */
    if (m)
        fill_stats(m, &all);
    memcpy(s, &all, size < sizeof(all) ? size : sizeof(all));
    if (size > sizeof(all)) /* a newer header's fields: this library has none of them */
        memset((char *)s + sizeof(all), 0, size - sizeof(all));
    return sizeof(all);
}

_Static_assert(sizeof(kvt_offload_stats) >= KVT_OFFLOAD_STATS_SIZE_0,
               "kvt_offload_stats only grows");
_Static_assert(offsetof(kvt_offload_stats, hit_requests) == KVT_OFFLOAD_STATS_SIZE_0,
               "the fields after the frozen size start at it");

/* the symbol programs built before kvt_offload_stats_read call (the header's macro aside) */
void(kvt_offload_get_stats)(const kvt_offload *m, kvt_offload_stats *s)
{
    (void)kvt_offload_stats_read(m, s, KVT_OFFLOAD_STATS_SIZE_0);
}

static void fill_stats(const kvt_offload *m, kvt_offload_stats *s)
{
    *s = m->st;
    kvt_tier_stats h, d;
    (void)kvt_offload_get_tier_stats(m, 0, &h);
    /* the disk's fields are all zero without one (engines read these every step: no failed
     * call, whose message costs more than the rest) */
    if (kvt_offload_num_tiers(m) > 1)
        (void)kvt_offload_get_tier_stats(m, 1, &d);
    else
        memset(&d, 0, sizeof(d));
    s->hit_blocks = h.hit_blocks;
    s->load_events = h.load_events;
    s->store_events = h.store_events;
    s->store_blocks = h.store_blocks;
    s->stores_completed = h.stores_completed;
    s->stores_failed = h.stores_failed;
    s->stores_abandoned = h.stores_abandoned;
    s->store_skipped_cached = h.store_skipped_cached;
    s->store_dropped_full = h.store_dropped;
    s->host_evictions = h.evictions;
    s->host_blocks = h.blocks;
    s->host_used_blocks = h.used_blocks;
    s->host_cached_blocks = h.cached_blocks;
    s->load_events_in_flight = h.load_events_in_flight;
    s->store_events_in_flight = h.store_events_in_flight;
    s->disk_hit_blocks = d.hit_blocks;
    s->disk_hit_tokens = d.hit_tokens;
    s->disk_load_events = d.load_events;
    s->disk_store_events = d.store_events;
    s->disk_store_blocks = d.store_blocks;
    s->disk_stores_completed = d.stores_completed;
    s->disk_stores_failed = d.stores_failed;
    s->disk_stores_abandoned = d.stores_abandoned;
    s->disk_store_skipped_cached = d.store_skipped_cached;
    s->disk_store_dropped = d.store_dropped;
    s->disk_evictions = d.evictions;
    s->disk_blocks = d.blocks;
    s->disk_used_blocks = d.used_blocks;
    s->disk_cached_blocks = d.cached_blocks;
    s->disk_load_events_in_flight = d.load_events_in_flight;
    s->disk_store_events_in_flight = d.store_events_in_flight;
    s->requests = m->n_reqs;
    uint32_t pending = m->tier[0].acc_n;
    KVI_OFL_FOR_EVENTS (e, &m->tier[0].stores)
        pending += e->n;
    s->pending_store_blocks = pending;
}

uint32_t kvt_offload_hit_alignment(const kvt_offload *m)
{
    return m ? m->hit_align : 0;
}

uint32_t kvt_offload_lazy_window(const kvt_offload *m)
{
    return m ? m->target_free : 0;
}

uint32_t kvt_offload_num_tiers(const kvt_offload *m)
{
    return m ? kvi_ofl_chain_len(m) : 0;
}

int kvt_offload_get_tier_stats(const kvt_offload *m, uint32_t tier, kvt_tier_stats *out)
{
    if (!out)
        return kvt_fail(KVT_EINVAL, "offload: get_tier_stats: NULL output");
    memset(out, 0, sizeof(*out));
    if (tier >= KVI_OFL_TIERS || tier >= kvt_offload_num_tiers(m))
        return kvt_fail(KVT_ERANGE, "offload: tier %u of %u", tier, kvt_offload_num_tiers(m));
    const struct kvi_ofl_tier *T = &m->tier[tier];
    out->name = kvi_ofl_tier_name(m, tier);
    out->hit_blocks = T->st.hit_blocks;
    /* a hit's tokens are counted once, by the tier that serves them: the host's are what the
     * tiers behind it did not serve */
    out->hit_tokens = tier == 0 ? m->st.hit_tokens : T->st.hit_tokens;
    for (uint32_t t = 1; tier == 0 && t < KVI_OFL_TIERS; t++)
        out->hit_tokens -= m->tier[t].st.hit_tokens;
    out->load_events = T->st.load_events;
    out->store_events = T->st.store_events;
    out->store_blocks = T->st.store_blocks;
    out->stores_completed = T->st.stores_completed;
    out->stores_failed = T->st.stores_failed;
    out->stores_abandoned = T->st.stores_abandoned;
    out->store_skipped_cached = T->st.store_skipped_cached;
    out->store_dropped = T->st.store_dropped;
    out->evictions = T->st.evictions;
    out->loads_failed = T->st.loads_failed;
    out->lookups_dropped = T->st.lookups_dropped;
    if (T->pool) { /* the remote tier's blocks are its owners' */
        out->blocks = T->nb - 1;
        out->used_blocks = T->nb - 1 - kvt_pool_num_free(T->pool);
        out->cached_blocks = kvt_pool_num_cached(T->pool);
    }
    out->load_events_in_flight = kvi_evtable_len(&T->loads);
    out->store_events_in_flight = kvi_evtable_len(&T->stores);
    return 0;
}

/* ---- the Prometheus exposition: one row per family ----------------------------------- */

/* A family read from a field of a stats struct: name (after "kvtier_offload_"), help text,
 * where the field is and how wide (4 or 8 bytes), gauge or counter, only with a disk tier.
 * The rows come from the schema (KVT_OFFLOAD_STATS_ROWS, stats_schema.h); fields without a family
 * of their own and names are left out (a row with no name). */
struct stat_row {
    const char *name, *help;
    size_t off, size;
    bool gauge, disk;
};

#define ROW(type, prefix, f, kind, family, help)                                                   \
    {sizeof(family) > 1 ? prefix family : NULL,                                                    \
     help,                                                                                         \
     offsetof(type, f),                                                                            \
     sizeof(((type *)0)->f),                                                                       \
     KVI_STAT_KIND_##kind == KVT_FIELD_GAUGE,                                                      \
     KVI_STAT_DISK_##kind},
#define STAT(f, kind, family, help) ROW(kvt_offload_stats, "", f, kind, family, help)
#define TIER(f, kind, family, help) ROW(kvt_tier_stats, "tier_", f, kind, family, help)

#define TYPED_STAT(type, ...) STAT(__VA_ARGS__) /* the public rows carry each field's type */

static const struct stat_row offload_rows[] = {KVT_OFFLOAD_STATS_ROWS(TYPED_STAT)};
/* Every tier's figures, with a tier label, for dashboards that sum or compare tiers (the
 * unlabelled families above stay for existing scrapes). */
static const struct stat_row tier_rows[] = {KVI_TIER_STATS(TIER)};
/* the node and remote tiers the manager was lent: their own families, kvtier_node_* and
 * kvtier_remote_* (emitted with their prefix, not "kvtier_offload") */
#define NODE(f, kind, family, help)   ROW(kvt_node_stats, "", f, kind, family, help)
#define REMOTE(f, kind, family, help) ROW(kvt_remote_stats, "", f, kind, family, help)
static const struct stat_row node_rows[] = {KVI_NODE_STATS(NODE)};
static const struct stat_row remote_rows[] = {KVI_REMOTE_STATS(REMOTE)};
#undef REMOTE
#undef NODE

#undef TIER
#undef STAT
#undef ROW

static uint64_t row_value(const void *stats, const struct stat_row *r)
{
    const char *f = (const char *)stats + r->off;
    if (r->size == sizeof(uint64_t)) {
        uint64_t v;
        memcpy(&v, f, sizeof(v));
        return v;
    }
    uint32_t v32;
    memcpy(&v32, f, sizeof(v32));
    return v32;
}

static void emit_rows(kvi_prom *p, const char *prefix, const void *stats,
                      const struct stat_row *rows, size_t n, bool disk)
{
    for (size_t i = 0; i < n; i++)
        if (rows[i].name && (disk || !rows[i].disk))
            kvi_prom_metric(p, prefix, rows[i].name, rows[i].help, rows[i].gauge,
                            row_value(stats, &rows[i]));
}

static void emit_tiers(kvi_prom *p, const kvt_offload *m)
{
    kvt_tier_stats ts[KVT_MAX_TIERS];
    uint32_t n_tiers = kvt_offload_num_tiers(m);
    for (uint32_t t = 0; t < n_tiers && t < KVT_MAX_TIERS; t++)
        (void)kvt_offload_get_tier_stats(m, t, &ts[t]);
    for (size_t i = 0; i < KVT_ARRAY_LEN(tier_rows); i++) {
        const struct stat_row *r = &tier_rows[i];
        if (!r->name)
            continue;
        kvi_prom_family(p, "kvtier_offload", r->name, r->help, r->gauge);
        for (uint32_t t = 0; t < n_tiers && t < KVT_MAX_TIERS; t++)
            kvi_prom_sample(p, "kvtier_offload", r->name, "tier", ts[t].name, row_value(&ts[t], r));
    }
}

int kvt_offload_prometheus(const kvt_offload *m, char *buf, size_t cap, size_t *len)
{
    if (!len || (cap && !buf))
        return kvt_fail(KVT_EINVAL, "offload: prometheus: NULL argument");
    kvt_offload_stats s;
    kvt_offload_get_stats(m, &s);
    kvi_prom p = {buf, cap, 0};
    emit_rows(&p, "kvtier_offload", &s, offload_rows, KVT_ARRAY_LEN(offload_rows),
              m && m->tier[1].pool);
    if (m && m->node) {
        kvt_node_stats ns;
        if (kvt_node_get_stats(m->node, &ns) == 0)
            emit_rows(&p, "kvtier_node", &ns, node_rows, KVT_ARRAY_LEN(node_rows), false);
    }
    if (m && m->remote && m->rport->stats) {
        kvt_remote_stats rs;
        m->rport->stats(m->remote, &rs);
        emit_rows(&p, "kvtier_remote", &rs, remote_rows, KVT_ARRAY_LEN(remote_rows), false);
    }
    emit_tiers(&p, m);
    const struct {
        const char *reason;
        uint64_t v;
    } skipped[] = {
        {"already_cached", s.store_skipped_cached}, {"in_flight", s.store_skipped_in_flight},
        {"not_hashed", s.store_skipped_unhashed},   {"null_block", s.store_skipped_null},
        {"host_full", s.store_dropped_full},
    };
    kvi_prom_family(&p, "kvtier_offload", "store_skipped_blocks_total",
                    "Blocks not stored, by reason.", false);
    for (size_t i = 0; i < KVT_ARRAY_LEN(skipped); i++)
        kvi_prom_sample(&p, "kvtier_offload", "store_skipped_blocks_total", "reason",
                        skipped[i].reason, skipped[i].v);
    return kvi_prom_finish(&p, len, "offload");
}
