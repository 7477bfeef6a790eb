/*
 * KV-offload metadata (vLLM SimpleCPUOffloadMetadata and SimpleCPUOffloadWorkerMetadata): the
 * C objects, their builders, validation, aggregation and wire encoding.
 *
 * Body of an offload message (after the 12-byte header):
 *   i64 load_event
 *   u32 n; n x u32 load_gpu_blocks      u32 n; n x u32 load_cpu_blocks
 *   u32 n_events; n_events x { i64 event; u32 n; n x str request_id }
 *   i64 store_event
 *   u32 n; n x u32 store_gpu_blocks     u32 n; n x u32 store_cpu_blocks
 *   u8  need_flush
 * The two lists of a pair carry their own lengths, as the Python dataclass does, and the
 * decoder insists that they agree.
 *
 * Body of a worker message: u32 n; n x { i64 event; u32 count }, events strictly ascending.
 */
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "meta/meta_internal.h"

/* ---- scheduler -> worker --------------------------------------------------------------- */

void kvt_offload_meta_init(kvt_offload_meta *m)
{
    memset(m, 0, sizeof(*m));
    m->load_event = KVT_NO_EVENT;
    m->store_event = KVT_NO_EVENT;
}

void kvt_offload_meta_clear(kvt_offload_meta *m)
{
    m->load_event = KVT_NO_EVENT;
    m->store_event = KVT_NO_EVENT;
    m->n_loads = m->n_stores = 0;
    m->n_load_events = m->n_load_reqs = 0;
    m->need_flush = false;
    kvt_bump_clear(&m->strings);
}

void kvt_offload_meta_release(kvt_offload_meta *m)
{
    free(m->load_gpu_blocks);
    free(m->load_cpu_blocks);
    free(m->load_events);
    free(m->load_req_first);
    free(m->load_req_ids);
    free(m->store_gpu_blocks);
    free(m->store_cpu_blocks);
    kvt_bump_release(&m->strings);
    kvt_offload_meta_init(m);
}

/* Grows a pair of parallel block lists. */
static int grow_pair(uint32_t **a, uint32_t **b, uint32_t *cap, uint32_t need)
{
    if (need > KVT_META_MAX_BLOCKS)
        return kvt_fail(KVT_ELIMIT, "meta: more than %u blocks in one list", KVT_META_MAX_BLOCKS);
    uint32_t cap_a = *cap, cap_b = *cap;
    int rc = kvt_meta_grow((void **)a, &cap_a, need, sizeof(uint32_t));
    if (!rc)
        rc = kvt_meta_grow((void **)b, &cap_b, need, sizeof(uint32_t));
    if (rc)
        return rc;
    *cap = cap_a < cap_b ? cap_a : cap_b;
    return 0;
}

int kvt_offload_meta_reserve(kvt_offload_meta *m, uint32_t loads, uint32_t stores, uint32_t events,
                             uint32_t reqs, size_t req_bytes)
{
    uint64_t nl = (uint64_t)m->n_loads + loads, ns = (uint64_t)m->n_stores + stores;
    uint64_t ne = (uint64_t)m->n_load_events + events, nr = (uint64_t)m->n_load_reqs + reqs;
    if (nl > KVT_META_MAX_BLOCKS || ns > KVT_META_MAX_BLOCKS || ne > KVT_META_MAX_ITEMS ||
        nr > KVT_META_MAX_ITEMS)
        return kvt_fail(KVT_ELIMIT, "meta: reserve beyond the message limits");
    int rc;
    if ((rc = grow_pair(&m->load_gpu_blocks, &m->load_cpu_blocks, &m->cap_loads, (uint32_t)nl)) ||
        (rc =
             grow_pair(&m->store_gpu_blocks, &m->store_cpu_blocks, &m->cap_stores, (uint32_t)ns)) ||
        (rc = kvt_meta_grow((void **)&m->load_events, &m->cap_events, (uint32_t)ne,
                            sizeof(int64_t))) ||
        (rc = kvt_meta_grow((void **)&m->load_req_first, &m->cap_first, (uint32_t)ne + 1,
                            sizeof(uint32_t))) ||
        (rc =
             kvt_meta_grow((void **)&m->load_req_ids, &m->cap_reqs, (uint32_t)nr, sizeof(kvt_str))))
        return rc;
    /* strdup takes len + 1 and up to 7 bytes of alignment per string */
    return req_bytes || reqs ? kvt_bump_reserve(&m->strings, req_bytes + 8 * (size_t)reqs) : 0;
}

int kvt_offload_meta_add_load(kvt_offload_meta *m, uint32_t gpu_block, uint32_t cpu_block)
{
    int rc = grow_pair(&m->load_gpu_blocks, &m->load_cpu_blocks, &m->cap_loads, m->n_loads + 1);
    if (rc)
        return rc;
    m->load_gpu_blocks[m->n_loads] = gpu_block;
    m->load_cpu_blocks[m->n_loads] = cpu_block;
    m->n_loads++;
    return 0;
}

int kvt_offload_meta_add_store(kvt_offload_meta *m, uint32_t gpu_block, uint32_t cpu_block)
{
    int rc = grow_pair(&m->store_gpu_blocks, &m->store_cpu_blocks, &m->cap_stores, m->n_stores + 1);
    if (rc)
        return rc;
    m->store_gpu_blocks[m->n_stores] = gpu_block;
    m->store_cpu_blocks[m->n_stores] = cpu_block;
    m->n_stores++;
    return 0;
}

int kvt_offload_meta_add_load_req(kvt_offload_meta *m, int64_t event, const char *req_id,
                                  uint32_t len)
{
    kvt_str id = {req_id, len};
    int rc = kvt_meta_check_str(id, 1, "meta: load request id");
    if (rc)
        return rc;
    if (event < 0)
        return kvt_fail(KVT_EINVAL, "meta: load event %lld is negative", (long long)event);
    bool new_event = m->n_load_events == 0 || m->load_events[m->n_load_events - 1] != event;
    if (new_event && m->n_load_events && event < m->load_events[m->n_load_events - 1])
        return kvt_fail(KVT_EINVAL, "meta: load event %lld added after %lld (must ascend)",
                        (long long)event, (long long)m->load_events[m->n_load_events - 1]);
    if (m->n_load_reqs >= KVT_META_MAX_ITEMS || m->n_load_events >= KVT_META_MAX_ITEMS)
        return kvt_fail(KVT_ELIMIT, "meta: more than %u load requests", KVT_META_MAX_ITEMS);
    rc =
        kvt_meta_grow((void **)&m->load_req_ids, &m->cap_reqs, m->n_load_reqs + 1, sizeof(kvt_str));
    if (rc)
        return rc;
    if (new_event) {
        rc = kvt_meta_grow((void **)&m->load_events, &m->cap_events, m->n_load_events + 1,
                           sizeof(int64_t));
        if (!rc)
            rc = kvt_meta_grow((void **)&m->load_req_first, &m->cap_first, m->n_load_events + 2,
                               sizeof(uint32_t));
        if (rc)
            return rc;
    }
    kvt_str copy;
    rc = kvt_meta_copy_str(&m->strings, req_id, len, &copy);
    if (rc)
        return rc;
    if (new_event) {
        m->load_events[m->n_load_events] = event;
        m->load_req_first[m->n_load_events] = m->n_load_reqs;
        m->n_load_events++;
    }
    m->load_req_ids[m->n_load_reqs++] = copy;
    m->load_req_first[m->n_load_events] = m->n_load_reqs;
    return 0;
}

static int check_blocks(const uint32_t *ids, uint32_t n, const char *what)
{
    if (n > KVT_META_MAX_BLOCKS)
        return kvt_fail(KVT_ELIMIT, "%s: %u blocks exceed the limit of %u", what, n,
                        KVT_META_MAX_BLOCKS);
    if (n && !ids)
        return kvt_fail(KVT_EINVAL, "%s: list is NULL", what);
    for (uint32_t i = 0; i < n; i++)
        if (ids[i] == 0)
            return kvt_fail(KVT_EINVAL, "%s[%u] is the null block 0", what, i);
    return 0;
}

static int check_event(int64_t event, uint32_t n, const char *what)
{
    if (event < KVT_NO_EVENT)
        return kvt_fail(KVT_EINVAL, "%s %lld is invalid", what, (long long)event);
    if ((event == KVT_NO_EVENT) != (n == 0))
        return kvt_fail(KVT_EINVAL, "%s is %lld with %u blocks (no event exactly when empty)", what,
                        (long long)event, n);
    return 0;
}

static bool has_load_event(const kvt_offload_meta *m, int64_t event)
{
    uint32_t lo = 0, hi = m->n_load_events;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (m->load_events[mid] < event)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < m->n_load_events && m->load_events[lo] == event;
}

int kvt_offload_meta_validate(const kvt_offload_meta *m)
{
    int rc;
    if (!m)
        return kvt_fail(KVT_EINVAL, "meta: NULL offload metadata");
    if ((rc = check_event(m->load_event, m->n_loads, "load_event")) ||
        (rc = check_blocks(m->load_gpu_blocks, m->n_loads, "load_gpu_blocks")) ||
        (rc = check_blocks(m->load_cpu_blocks, m->n_loads, "load_cpu_blocks")) ||
        (rc = check_event(m->store_event, m->n_stores, "store_event")) ||
        (rc = check_blocks(m->store_gpu_blocks, m->n_stores, "store_gpu_blocks")) ||
        (rc = check_blocks(m->store_cpu_blocks, m->n_stores, "store_cpu_blocks")))
        return rc;
    if (m->n_load_events > KVT_META_MAX_ITEMS || m->n_load_reqs > KVT_META_MAX_ITEMS)
        return kvt_fail(KVT_ELIMIT, "load_event_to_reqs: more than %u entries", KVT_META_MAX_ITEMS);
    if (m->n_load_events && (!m->load_events || !m->load_req_first || !m->load_req_ids))
        return kvt_fail(KVT_EINVAL, "load_event_to_reqs: NULL list");
    if (m->n_load_events == 0 && m->n_load_reqs != 0)
        return kvt_fail(KVT_EINVAL, "load_event_to_reqs: %u request ids without events",
                        m->n_load_reqs);
    for (uint32_t i = 0; i < m->n_load_events; i++) {
        if (m->load_events[i] < 0 || (i && m->load_events[i] <= m->load_events[i - 1]))
            return kvt_fail(KVT_EINVAL,
                            "load_event_to_reqs: event %lld at index %u is negative "
                            "or not ascending",
                            (long long)m->load_events[i], i);
        uint32_t first = m->load_req_first[i], end = m->load_req_first[i + 1];
        if ((i == 0 && first != 0) || end <= first || end > m->n_load_reqs)
            return kvt_fail(KVT_EINVAL,
                            "load_event_to_reqs: event %lld has a bad request range "
                            "[%u, %u)",
                            (long long)m->load_events[i], first, end);
    }
    if (m->n_load_events && m->load_req_first[m->n_load_events] != m->n_load_reqs)
        return kvt_fail(KVT_EINVAL, "load_event_to_reqs: ranges cover %u of %u request ids",
                        m->load_req_first[m->n_load_events], m->n_load_reqs);
    for (uint32_t i = 0; i < m->n_load_reqs; i++)
        if ((rc = kvt_meta_check_str(m->load_req_ids[i], 1, "load_event_to_reqs request id")))
            return rc;
    if (m->load_event != KVT_NO_EVENT && !has_load_event(m, m->load_event))
        return kvt_fail(KVT_EINVAL, "load_event %lld is missing from load_event_to_reqs",
                        (long long)m->load_event);
    return 0;
}

static bool blocks_equal(const uint32_t *a, const uint32_t *b, uint32_t n)
{
    return n == 0 || memcmp(a, b, (size_t)n * sizeof(uint32_t)) == 0;
}

bool kvt_offload_meta_equal(const kvt_offload_meta *a, const kvt_offload_meta *b)
{
    if (a->load_event != b->load_event || a->store_event != b->store_event ||
        a->need_flush != b->need_flush || a->n_loads != b->n_loads || a->n_stores != b->n_stores ||
        a->n_load_events != b->n_load_events || a->n_load_reqs != b->n_load_reqs)
        return false;
    if (!blocks_equal(a->load_gpu_blocks, b->load_gpu_blocks, a->n_loads) ||
        !blocks_equal(a->load_cpu_blocks, b->load_cpu_blocks, a->n_loads) ||
        !blocks_equal(a->store_gpu_blocks, b->store_gpu_blocks, a->n_stores) ||
        !blocks_equal(a->store_cpu_blocks, b->store_cpu_blocks, a->n_stores))
        return false;
    for (uint32_t i = 0; i < a->n_load_events; i++)
        if (a->load_events[i] != b->load_events[i] ||
            a->load_req_first[i + 1] != b->load_req_first[i + 1])
            return false;
    for (uint32_t i = 0; i < a->n_load_reqs; i++)
        if (!kvt_str_equal(a->load_req_ids[i], b->load_req_ids[i]))
            return false;
    return true;
}

size_t kvt_offload_meta_encoded_size(const kvt_offload_meta *m)
{
    size_t n = KVT_META_HEADER_LEN;
    n += 8 + 4 + 4 * (size_t)m->n_loads + 4 + 4 * (size_t)m->n_loads;
    n += 4 + 12 * (size_t)m->n_load_events;
    for (uint32_t i = 0; i < m->n_load_reqs; i++)
        n += 4 + m->load_req_ids[i].len;
    n += 8 + 4 + 4 * (size_t)m->n_stores + 4 + 4 * (size_t)m->n_stores;
    n += 1;
    return n;
}

static void wr_blocks(kvt_wr *w, const uint32_t *ids, uint32_t n)
{
    wr_u32(w, n);
    for (uint32_t i = 0; i < n; i++)
        wr_u32(w, ids[i]);
}

int kvt_offload_meta_encode(const kvt_offload_meta *m, void *buf, size_t cap, size_t *len)
{
    int rc = kvt_offload_meta_validate(m);
    if (rc)
        return kvt_fail_wrap(rc, "meta: encode offload metadata");
    size_t need = kvt_offload_meta_encoded_size(m);
    if ((rc = kvt_wire_check_out(buf, cap, need, len)))
        return rc;
    kvt_wr w = {buf};
    kvt_wire_header(&w, KVT_META_OFFLOAD, need - KVT_META_HEADER_LEN);
    wr_u64(&w, (uint64_t)m->load_event);
    wr_blocks(&w, m->load_gpu_blocks, m->n_loads);
    wr_blocks(&w, m->load_cpu_blocks, m->n_loads);
    wr_u32(&w, m->n_load_events);
    for (uint32_t i = 0; i < m->n_load_events; i++) {
        wr_u64(&w, (uint64_t)m->load_events[i]);
        uint32_t first = m->load_req_first[i], end = m->load_req_first[i + 1];
        wr_u32(&w, end - first);
        for (uint32_t k = first; k < end; k++)
            wr_str(&w, m->load_req_ids[k]);
    }
    wr_u64(&w, (uint64_t)m->store_event);
    wr_blocks(&w, m->store_gpu_blocks, m->n_stores);
    wr_blocks(&w, m->store_cpu_blocks, m->n_stores);
    wr_u8(&w, m->need_flush ? 1 : 0);
    return 0;
}

/* Reads a pair of block lists of equal length into *a / *b via add(). */
static int rd_block_pair(kvt_rd *r, kvt_offload_meta *m, bool loads)
{
    const char *what_g = loads ? "load_gpu_blocks" : "store_gpu_blocks";
    const char *what_c = loads ? "load_cpu_blocks" : "store_cpu_blocks";
    uint32_t n_g, n_c;
    int rc = rd_count(r, &n_g, KVT_META_MAX_BLOCKS, 4, what_g);
    if (rc)
        return rc;
    const uint8_t *gpu = r->p;
    r->p += (size_t)n_g * 4;
    if ((rc = rd_count(r, &n_c, KVT_META_MAX_BLOCKS, 4, what_c)))
        return rc;
    if (n_c != n_g)
        return kvt_fail(KVT_EPROTO, "%s has %u entries but %s has %u", what_g, n_g, what_c, n_c);
    const uint8_t *cpu = r->p;
    r->p += (size_t)n_c * 4;
    uint32_t **g = loads ? &m->load_gpu_blocks : &m->store_gpu_blocks;
    uint32_t **c = loads ? &m->load_cpu_blocks : &m->store_cpu_blocks;
    uint32_t *cap = loads ? &m->cap_loads : &m->cap_stores;
    if ((rc = grow_pair(g, c, cap, n_g)))
        return rc;
    for (uint32_t i = 0; i < n_g; i++) {
        (*g)[i] = ld_le32(gpu + 4 * (size_t)i);
        (*c)[i] = ld_le32(cpu + 4 * (size_t)i);
    }
    if (loads)
        m->n_loads = n_g;
    else
        m->n_stores = n_g;
    return 0;
}

static int decode_offload(void *obj, kvt_rd *r)
{
    kvt_offload_meta *m = obj;
    int rc;
    if ((rc = rd_i64(r, &m->load_event, "load_event")) || (rc = rd_block_pair(r, m, true)))
        return rc;
    uint32_t n_events;
    if ((rc = rd_count(r, &n_events, KVT_META_MAX_ITEMS, 12, "load_event_to_reqs")))
        return rc;
    for (uint32_t i = 0; i < n_events; i++) {
        int64_t ev;
        uint32_t n_reqs;
        if ((rc = rd_i64(r, &ev, "load_event_to_reqs event")) ||
            (rc = rd_count(r, &n_reqs, KVT_META_MAX_ITEMS, 4, "load_event_to_reqs requests")))
            return rc;
        if (ev < 0 || (i && ev <= m->load_events[i - 1]))
            return kvt_fail(KVT_EPROTO,
                            "load_event_to_reqs: event %lld is negative or not "
                            "ascending",
                            (long long)ev);
        if (n_reqs == 0)
            return kvt_fail(KVT_EPROTO, "load_event_to_reqs: event %lld has no requests",
                            (long long)ev);
        for (uint32_t k = 0; k < n_reqs; k++) {
            const char *s = NULL;
            uint32_t len;
            if ((rc = rd_str(r, &s, &len, "load request id")) ||
                (rc = kvt_offload_meta_add_load_req(m, ev, s, len)))
                return rc;
        }
    }
    if ((rc = rd_i64(r, &m->store_event, "store_event")) || (rc = rd_block_pair(r, m, false)) ||
        (rc = rd_bool(r, &m->need_flush, "need_flush")))
        return rc;
    return kvt_offload_meta_validate(m);
}

int kvt_offload_meta_decode(kvt_offload_meta *m, const void *buf, size_t len)
{
    kvt_offload_meta_clear(m);
    int rc = kvt_wire_decode(buf, len, KVT_META_OFFLOAD, decode_offload, m,
                             "meta: decode offload metadata");
    if (rc)
        kvt_offload_meta_clear(m);
    return rc;
}

/* ---- worker -> scheduler --------------------------------------------------------------- */

void kvt_offload_worker_meta_init(kvt_offload_worker_meta *m)
{
    memset(m, 0, sizeof(*m));
}

void kvt_offload_worker_meta_clear(kvt_offload_worker_meta *m)
{
    m->n_completed = 0;
    m->n_failed = 0;
}

void kvt_offload_worker_meta_release(kvt_offload_worker_meta *m)
{
    free(m->events);
    free(m->counts);
    free(m->failed);
    kvt_offload_worker_meta_init(m);
}

static int worker_reserve(kvt_offload_worker_meta *m, uint32_t need)
{
    if (need > KVT_META_MAX_ITEMS)
        return kvt_fail(KVT_ELIMIT, "meta: more than %u completed store events",
                        KVT_META_MAX_ITEMS);
    uint32_t cap_e = m->cap, cap_c = m->cap;
    int rc = kvt_meta_grow((void **)&m->events, &cap_e, need, sizeof(int64_t));
    if (!rc)
        rc = kvt_meta_grow((void **)&m->counts, &cap_c, need, sizeof(uint32_t));
    if (rc)
        return rc;
    m->cap = cap_e < cap_c ? cap_e : cap_c;
    return 0;
}

static uint32_t event_lower_bound(const kvt_offload_worker_meta *m, int64_t event)
{
    return kvt_lower_bound_i64(m->events, m->n_completed, event);
}

int kvt_offload_worker_meta_add(kvt_offload_worker_meta *m, int64_t event, uint32_t count)
{
    if (event < 0 || count == 0)
        return kvt_fail(KVT_EINVAL,
                        "meta: completed store event %lld with count %u (need an "
                        "event >= 0 and a count >= 1)",
                        (long long)event, count);
    uint32_t i = event_lower_bound(m, event);
    if (i < m->n_completed && m->events[i] == event) {
        if (m->counts[i] > UINT32_MAX - count)
            return kvt_fail(KVT_ELIMIT, "meta: count of store event %lld overflows",
                            (long long)event);
        m->counts[i] += count;
        return 0;
    }
    int rc = worker_reserve(m, m->n_completed + 1);
    if (rc)
        return rc;
    memmove(&m->events[i + 1], &m->events[i], (size_t)(m->n_completed - i) * sizeof(int64_t));
    memmove(&m->counts[i + 1], &m->counts[i], (size_t)(m->n_completed - i) * sizeof(uint32_t));
    m->events[i] = event;
    m->counts[i] = count;
    m->n_completed++;
    return 0;
}

static uint32_t failed_lower_bound(const kvt_offload_worker_meta *m, int64_t event)
{
    return kvt_lower_bound_i64(m->failed, m->n_failed, event);
}

bool kvt_offload_worker_meta_failed(const kvt_offload_worker_meta *m, int64_t event)
{
    uint32_t i = failed_lower_bound(m, event);
    return i < m->n_failed && m->failed[i] == event;
}

/* Inserts event into the failed set (no check that it is completed). */
static int insert_failed(kvt_offload_worker_meta *m, int64_t event)
{
    uint32_t i = failed_lower_bound(m, event);
    if (i < m->n_failed && m->failed[i] == event)
        return 0;
    if (m->n_failed >= KVT_META_MAX_ITEMS)
        return kvt_fail(KVT_ELIMIT, "meta: more than %u failed store events", KVT_META_MAX_ITEMS);
    int rc = kvt_meta_grow((void **)&m->failed, &m->cap_failed, m->n_failed + 1, sizeof(int64_t));
    if (rc)
        return rc;
    memmove(&m->failed[i + 1], &m->failed[i], (size_t)(m->n_failed - i) * sizeof(int64_t));
    m->failed[i] = event;
    m->n_failed++;
    return 0;
}

int kvt_offload_worker_meta_add_failed(kvt_offload_worker_meta *m, int64_t event)
{
    uint32_t i = event_lower_bound(m, event);
    if (event < 0 || i == m->n_completed || m->events[i] != event)
        return kvt_fail(KVT_EINVAL, "meta: failed store event %lld is not a completed store event",
                        (long long)event);
    return insert_failed(m, event);
}

int kvt_offload_worker_meta_aggregate(kvt_offload_worker_meta *dst,
                                      const kvt_offload_worker_meta *src)
{
    if (!dst || !src)
        return kvt_fail(KVT_EINVAL, "meta: aggregate: NULL argument");
    /* Room for the failed union first, so the merge below cannot fail half-way. */
    if (src->n_failed) {
        uint64_t need = (uint64_t)dst->n_failed + src->n_failed;
        if (need > KVT_META_MAX_ITEMS)
            return kvt_fail(KVT_ELIMIT, "meta: aggregate: too many failed store events");
        int rc =
            kvt_meta_grow((void **)&dst->failed, &dst->cap_failed, (uint32_t)need, sizeof(int64_t));
        if (rc)
            return rc;
    }
    /* First pass: size of the union and overflow check, so a failure changes nothing. */
    uint32_t i = 0, j = 0, u = 0;
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
        u++;
    }
    int rc = worker_reserve(dst, u);
    if (rc)
        return rc;
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
        (void)insert_failed(dst, src->failed[k]); /* room reserved above */
    return 0;
}

int kvt_offload_worker_meta_validate(const kvt_offload_worker_meta *m)
{
    if (!m)
        return kvt_fail(KVT_EINVAL, "meta: NULL worker metadata");
    if (m->n_completed > KVT_META_MAX_ITEMS)
        return kvt_fail(KVT_ELIMIT, "completed_store_events: %u entries exceed the limit of %u",
                        m->n_completed, KVT_META_MAX_ITEMS);
    if (m->n_completed && (!m->events || !m->counts))
        return kvt_fail(KVT_EINVAL, "completed_store_events: NULL list");
    for (uint32_t i = 0; i < m->n_completed; i++) {
        if (m->events[i] < 0 || (i && m->events[i] <= m->events[i - 1]))
            return kvt_fail(KVT_EINVAL,
                            "completed_store_events: event %lld at index %u is "
                            "negative or not ascending",
                            (long long)m->events[i], i);
        if (m->counts[i] == 0)
            return kvt_fail(KVT_EINVAL, "completed_store_events: event %lld has count 0",
                            (long long)m->events[i]);
    }
    if (m->n_failed > m->n_completed)
        return kvt_fail(KVT_EINVAL, "failed_store_events: more entries than completed events");
    if (m->n_failed && !m->failed)
        return kvt_fail(KVT_EINVAL, "failed_store_events: NULL list");
    for (uint32_t i = 0, j = 0; i < m->n_failed; i++) {
        if (i && m->failed[i] <= m->failed[i - 1])
            return kvt_fail(KVT_EINVAL, "failed_store_events: event %lld not ascending",
                            (long long)m->failed[i]);
        while (j < m->n_completed && m->events[j] < m->failed[i])
            j++;
        if (j == m->n_completed || m->events[j] != m->failed[i])
            return kvt_fail(KVT_EINVAL,
                            "failed_store_events: event %lld is not a completed store event",
                            (long long)m->failed[i]);
    }
    return 0;
}

bool kvt_offload_worker_meta_equal(const kvt_offload_worker_meta *a,
                                   const kvt_offload_worker_meta *b)
{
    if (a->n_completed != b->n_completed)
        return false;
    for (uint32_t i = 0; i < a->n_completed; i++)
        if (a->events[i] != b->events[i] || a->counts[i] != b->counts[i])
            return false;
    if (a->n_failed != b->n_failed)
        return false;
    for (uint32_t i = 0; i < a->n_failed; i++)
        if (a->failed[i] != b->failed[i])
            return false;
    return true;
}

size_t kvt_offload_worker_meta_encoded_size(const kvt_offload_worker_meta *m)
{
    return KVT_META_HEADER_LEN + 4 + 12 * (size_t)m->n_completed + 4 + 8 * (size_t)m->n_failed;
}

int kvt_offload_worker_meta_encode(const kvt_offload_worker_meta *m, void *buf, size_t cap,
                                   size_t *len)
{
    int rc = kvt_offload_worker_meta_validate(m);
    if (rc)
        return kvt_fail_wrap(rc, "meta: encode worker metadata");
    size_t need = kvt_offload_worker_meta_encoded_size(m);
    if ((rc = kvt_wire_check_out(buf, cap, need, len)))
        return rc;
    kvt_wr w = {buf};
    kvt_wire_header(&w, KVT_META_OFFLOAD_WORKER, need - KVT_META_HEADER_LEN);
    wr_u32(&w, m->n_completed);
    for (uint32_t i = 0; i < m->n_completed; i++) {
        wr_u64(&w, (uint64_t)m->events[i]);
        wr_u32(&w, m->counts[i]);
    }
    wr_u32(&w, m->n_failed);
    for (uint32_t i = 0; i < m->n_failed; i++)
        wr_u64(&w, (uint64_t)m->failed[i]);
    return 0;
}

static int decode_worker(void *obj, kvt_rd *r)
{
    kvt_offload_worker_meta *m = obj;
    uint32_t n;
    int rc = rd_count(r, &n, KVT_META_MAX_ITEMS, 12, "completed_store_events");
    if (rc || (rc = worker_reserve(m, n)))
        return rc;
    for (uint32_t i = 0; i < n; i++) {
        int64_t ev;
        uint32_t count;
        if ((rc = rd_i64(r, &ev, "completed store event")) ||
            (rc = rd_u32(r, &count, "completed store count")))
            return rc;
        m->events[i] = ev;
        m->counts[i] = count;
    }
    m->n_completed = n;
    if ((rc = rd_count(r, &n, KVT_META_MAX_ITEMS, 8, "failed_store_events")))
        return rc;
    if (n && (rc = kvt_meta_grow((void **)&m->failed, &m->cap_failed, n, sizeof(int64_t))))
        return rc;
    for (uint32_t i = 0; i < n; i++)
        if ((rc = rd_i64(r, &m->failed[i], "failed store event")))
            return rc;
    m->n_failed = n;
    return kvt_offload_worker_meta_validate(m);
}

int kvt_offload_worker_meta_decode(kvt_offload_worker_meta *m, const void *buf, size_t len)
{
    kvt_offload_worker_meta_clear(m);
    int rc = kvt_wire_decode(buf, len, KVT_META_OFFLOAD_WORKER, decode_worker, m,
                             "meta: decode worker metadata");
    if (rc)
        kvt_offload_worker_meta_clear(m);
    return rc;
}
