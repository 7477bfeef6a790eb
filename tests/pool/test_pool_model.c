/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Randomized model-based test of kvt_pool.
 *
 * A deliberately simple reference model (arrays and linear scans, no cleverness) is driven
 * with the same random operations as the pool: alloc, free, touch, insert, lookup, evict,
 * reset, longest-hit search, event draining — valid and invalid ones (ids out of range, double
 * frees, free blocks, too many keys). After every operation the pool must agree with the model
 * on the return code and on the whole observable state: reference counts, keys of every block
 * in order, the LRU order of the free queue, counters, and the event stream.
 *
 * At least 100,000 operations per run (times KVTIER_TEST_SCALE), over pools re-created with
 * random configurations. The seed is random unless KVTIER_TEST_SEED is set and is printed on
 * failure so the exact run can be replayed.
 */
#include "kvt_test.h"

#define MAX_N    40
#define MAX_KPB  3
#define N_KEYS   20
#define N_GROUPS 2
#define MAX_EV   64

struct mkey {
    uint32_t key, group, ntok;
};

struct model {
    uint32_t n, kpb, hash_len, ev_cap;
    uint32_t ref[MAX_N];
    uint32_t nkeys[MAX_N];
    struct mkey keys[MAX_N][MAX_KPB];
    uint32_t order[MAX_N]; /* free queue, LRU first */
    uint32_t n_order;
    kvt_pool_event ev[MAX_EV];
    uint32_t n_ev;
    uint64_t dropped;
};

static uint64_t g_seed;
static uint64_t g_op;

#define CHECK(cond, ...) KVT_MODEL_CHECK("pool model", "op", g_op, g_seed, cond, __VA_ARGS__)

static void key_bytes(const struct model *m, uint32_t key, uint8_t *out)
{
    memset(out, 0, KVT_HASH_MAX);
    out[0] = (uint8_t)key;
    for (uint32_t i = 1; i < m->hash_len; i++)
        out[i] = (uint8_t)(key * 31 + i);
}

static void m_emit(struct model *m, uint32_t type, uint32_t block, const struct mkey *k)
{
    if (m->ev_cap == 0)
        return;
    if (m->n_ev == m->ev_cap) {
        m->dropped++;
        return;
    }
    kvt_pool_event *e = &m->ev[m->n_ev++];
    memset(e, 0, sizeof(*e));
    e->type = type;
    e->block = block;
    if (k) {
        e->group = k->group;
        e->num_tokens = k->ntok;
        key_bytes(m, k->key, e->hash);
    }
}

static void m_drop_keys(struct model *m, uint32_t b)
{
    for (uint32_t i = 0; i < m->nkeys[b]; i++)
        m_emit(m, KVT_POOL_EV_REMOVED, b, &m->keys[b][i]);
    m->nkeys[b] = 0;
}

static void m_order_remove(struct model *m, uint32_t b)
{
    for (uint32_t i = 0; i < m->n_order; i++)
        if (m->order[i] == b) {
            memmove(&m->order[i], &m->order[i + 1], (m->n_order - i - 1) * sizeof(uint32_t));
            m->n_order--;
            return;
        }
}

static bool m_order_has(const struct model *m, uint32_t b)
{
    for (uint32_t i = 0; i < m->n_order; i++)
        if (m->order[i] == b)
            return true;
    return false;
}

/* Blocks carrying (key, group): returns how many, and whether `b` is one of them. */
static uint32_t m_carriers(const struct model *m, uint32_t key, uint32_t group, uint32_t b,
                           bool *has_b)
{
    uint32_t c = 0;
    *has_b = false;
    for (uint32_t i = 1; i < m->n; i++)
        for (uint32_t k = 0; k < m->nkeys[i]; k++)
            if (m->keys[i][k].key == key && m->keys[i][k].group == group) {
                c++;
                if (i == b)
                    *has_b = true;
            }
    return c;
}

static void compare_state(kvt_pool *p, const struct model *m)
{
    CHECK(kvt_pool_num_free(p) == m->n_order, "num_free %u, model %u", kvt_pool_num_free(p),
          m->n_order);
    uint32_t cached = 0;
    for (uint32_t b = 1; b < m->n; b++)
        cached += m->nkeys[b] > 0;
    CHECK(kvt_pool_num_cached(p) == cached, "num_cached %u, model %u", kvt_pool_num_cached(p),
          cached);
    uint32_t i = 0;
    for (uint32_t b = kvt_pool_lru_first(p); b != KVT_BLOCK_NONE; b = kvt_pool_lru_next(p, b)) {
        CHECK(i < m->n_order && m->order[i] == b, "free queue position %u holds %u", i, b);
        i++;
    }
    CHECK(i == m->n_order, "free queue has %u blocks, model %u", i, m->n_order);
    for (uint32_t b = 0; b < m->n; b++) {
        kvt_block_info bi;
        KVT_OK_(kvt_pool_block_info(p, b, &bi));
        CHECK(bi.ref_cnt == m->ref[b], "block %u ref %u, model %u", b, bi.ref_cnt, m->ref[b]);
        CHECK(bi.is_null == (b == 0), "block %u null flag", b);
        CHECK(bi.is_free == (b != 0 && m->ref[b] == 0), "block %u free flag", b);
        kvt_pool_key keys[MAX_KPB];
        uint32_t n;
        KVT_OK_(kvt_pool_block_keys(p, b, keys, MAX_KPB, &n));
        CHECK(n == m->nkeys[b], "block %u has %u keys, model %u", b, n, m->nkeys[b]);
        for (uint32_t k = 0; k < n; k++) {
            uint8_t kb[KVT_HASH_MAX];
            key_bytes(m, m->keys[b][k].key, kb);
            CHECK(memcmp(keys[k].hash, kb, KVT_HASH_MAX) == 0 &&
                      keys[k].group == m->keys[b][k].group &&
                      keys[k].num_tokens == m->keys[b][k].ntok,
                  "block %u key %u differs", b, k);
        }
    }
}

static void random_ids(uint64_t *rng, const struct model *m, uint32_t *ids, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        uint32_t r = kvt_test_below(rng, 100);
        ids[i] = r < 3   ? m->n + kvt_test_below(rng, 3)
                 : r < 6 ? 0
                         : 1 + kvt_test_below(rng, m->n - 1);
    }
}

static bool any_out_of_range(const struct model *m, const uint32_t *ids, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        if (ids[i] >= m->n)
            return true;
    return false;
}

static void op_alloc(kvt_pool *p, struct model *m, uint64_t *rng)
{
    uint32_t n = kvt_test_below(rng, 5), ids[8];
    int rc = kvt_pool_alloc(p, n, ids);
    if (n > m->n_order) {
        CHECK(rc == KVT_ENOSPC, "alloc %u of %u free returned %d", n, m->n_order, rc);
        return;
    }
    CHECK(rc == 0, "alloc %u returned %d (%s)", n, rc, kvt_last_error());
    for (uint32_t i = 0; i < n; i++) {
        uint32_t b = m->order[0];
        m_order_remove(m, b);
        CHECK(ids[i] == b, "alloc #%u gave %u, model %u", i, ids[i], b);
        m_drop_keys(m, b);
        m->ref[b] = 1;
    }
}

static void op_free(kvt_pool *p, struct model *m, uint64_t *rng)
{
    uint32_t n = 1 + kvt_test_below(rng, 4), ids[4];
    random_ids(rng, m, ids, n);
    if (kvt_test_below(rng, 3) == 0 && n > 1)
        ids[1] = ids[0];
    int rc = kvt_pool_free(p, ids, n);
    if (any_out_of_range(m, ids, n)) {
        CHECK(rc == KVT_ERANGE, "free out of range returned %d", rc);
        return;
    }
    uint32_t need[MAX_N] = {0};
    bool ok = true;
    for (uint32_t i = 0; i < n; i++)
        if (ids[i] != 0 && ++need[ids[i]] > m->ref[ids[i]])
            ok = false;
    if (!ok) {
        CHECK(rc == KVT_ESTATE, "free below zero returned %d", rc);
        return;
    }
    CHECK(rc == 0, "free returned %d (%s)", rc, kvt_last_error());
    for (uint32_t i = 0; i < n; i++)
        if (ids[i])
            m->ref[ids[i]]--;
    for (uint32_t i = 0; i < n; i++)
        if (ids[i] && m->ref[ids[i]] == 0 && !m_order_has(m, ids[i]))
            m->order[m->n_order++] = ids[i];
}

static void op_touch(kvt_pool *p, struct model *m, uint64_t *rng)
{
    uint32_t n = 1 + kvt_test_below(rng, 3), ids[3];
    random_ids(rng, m, ids, n);
    int rc = kvt_pool_touch(p, ids, n);
    if (any_out_of_range(m, ids, n)) {
        CHECK(rc == KVT_ERANGE, "touch out of range returned %d", rc);
        return;
    }
    CHECK(rc == 0, "touch returned %d (%s)", rc, kvt_last_error());
    for (uint32_t i = 0; i < n; i++) {
        if (!ids[i])
            continue;
        if (m->ref[ids[i]] == 0)
            m_order_remove(m, ids[i]);
        m->ref[ids[i]]++;
    }
}

static void op_insert(kvt_pool *p, struct model *m, uint64_t *rng)
{
    uint32_t b;
    random_ids(rng, m, &b, 1);
    struct mkey k = {kvt_test_below(rng, N_KEYS), kvt_test_below(rng, N_GROUPS + 1),
                     kvt_test_below(rng, 18)};
    uint8_t kb[KVT_HASH_MAX];
    key_bytes(m, k.key, kb);
    int rc = kvt_pool_insert(p, b, kb, k.group, k.ntok);
    int expect = 0;
    if (b == 0 || b >= m->n || k.group >= N_GROUPS || k.ntok < 1 || k.ntok > 16)
        expect = KVT_ERANGE;
    else if (m->ref[b] == 0)
        expect = KVT_ESTATE;
    if (expect) {
        CHECK(rc == expect, "insert expected %d got %d", expect, rc);
        return;
    }
    for (uint32_t i = 0; i < m->nkeys[b]; i++)
        if (m->keys[b][i].key == k.key && m->keys[b][i].group == k.group) {
            CHECK(rc == 0, "re-insert returned %d", rc);
            return;
        }
    if (m->nkeys[b] >= m->kpb) {
        CHECK(rc == KVT_ELIMIT, "insert over the limit returned %d", rc);
        return;
    }
    CHECK(rc == 0, "insert returned %d (%s)", rc, kvt_last_error());
    m->keys[b][m->nkeys[b]++] = k;
    m_emit(m, KVT_POOL_EV_STORED, b, &k);
}

static void op_lookup(kvt_pool *p, struct model *m, uint64_t *rng)
{
    uint32_t key = kvt_test_below(rng, N_KEYS), group = kvt_test_below(rng, N_GROUPS), b;
    uint8_t kb[KVT_HASH_MAX];
    key_bytes(m, key, kb);
    int rc = kvt_pool_lookup(p, kb, group, &b);
    bool has;
    uint32_t c = m_carriers(m, key, group, b, &has);
    CHECK(rc == (c > 0), "lookup of key %u returned %d, model has %u carriers", key, rc, c);
    if (rc == 1)
        CHECK(has, "lookup returned block %u which does not carry the key", b);
}

static void op_evict(kvt_pool *p, struct model *m, uint64_t *rng)
{
    uint32_t n = 1 + kvt_test_below(rng, 3), ids[3];
    random_ids(rng, m, ids, n);
    int rc = kvt_pool_evict(p, ids, n);
    if (any_out_of_range(m, ids, n)) {
        CHECK(rc == KVT_ERANGE, "evict out of range returned %d", rc);
        return;
    }
    CHECK(rc == 0, "evict returned %d", rc);
    for (uint32_t i = 0; i < n; i++)
        m_drop_keys(m, ids[i]);
}

static void op_reset(kvt_pool *p, struct model *m)
{
    int rc = kvt_pool_reset_prefix_cache(p);
    if (m->n_order != m->n - 1) {
        CHECK(rc == KVT_EBUSY, "reset with referenced blocks returned %d", rc);
        return;
    }
    CHECK(rc == 0, "reset returned %d", rc);
    for (uint32_t b = 0; b < m->n; b++)
        m->nkeys[b] = 0;
    m_emit(m, KVT_POOL_EV_ALL_CLEARED, 0, NULL);
}

/* Two full-attention groups of 16 tokens: the hit is the longest prefix cached in both. */
static void op_hit(kvt_pool *p, struct model *m, uint64_t *rng)
{
    uint32_t nh = kvt_test_below(rng, 7);
    uint32_t keys[8];
    uint8_t hashes[8 * KVT_HASH_MAX];
    for (uint32_t i = 0; i < nh; i++) {
        keys[i] = kvt_test_below(rng, 4) ? (uint32_t)i : kvt_test_below(rng, N_KEYS);
        key_bytes(m, keys[i], hashes + i * m->hash_len);
    }
    uint32_t max_len = kvt_test_below(rng, 120);
    uint32_t o0[8], o1[8];
    uint32_t *outs[2] = {o0, o1};
    kvt_hit hit;
    KVT_OK_(kvt_pool_find_longest_hit(p, hashes, nh, max_len, outs, &hit));
    uint32_t limit = max_len / 16 < nh ? max_len / 16 : nh;
    uint32_t n = 0;
    bool has;
    while (n < limit && m_carriers(m, keys[n], 0, 0, &has) && m_carriers(m, keys[n], 1, 0, &has))
        n++;
    CHECK(hit.length == n * 16 && hit.n_blocks[0] == n && hit.n_blocks[1] == n,
          "hit %u tokens (%u, %u blocks), model %u blocks", hit.length, hit.n_blocks[0],
          hit.n_blocks[1], n);
    for (uint32_t i = 0; i < n; i++) {
        m_carriers(m, keys[i], 0, o0[i], &has);
        CHECK(has, "hit block %u of group 0 does not carry its key", i);
        m_carriers(m, keys[i], 1, o1[i], &has);
        CHECK(has, "hit block %u of group 1 does not carry its key", i);
    }
}

static void op_events(kvt_pool *p, struct model *m, uint64_t *rng)
{
    uint32_t cap = kvt_test_below(rng, 6);
    kvt_pool_event ev[8];
    uint64_t dropped;
    uint32_t n = kvt_pool_take_events(p, ev, cap, &dropped);
    uint32_t expect = cap < m->n_ev ? cap : m->n_ev;
    CHECK(n == expect, "took %u events, model %u", n, expect);
    CHECK(dropped == m->dropped, "dropped %llu, model %llu", (unsigned long long)dropped,
          (unsigned long long)m->dropped);
    for (uint32_t i = 0; i < n; i++)
        CHECK(memcmp(&ev[i], &m->ev[i], sizeof(ev[i])) == 0, "event %u differs (type %u/%u)", i,
              ev[i].type, m->ev[i].type);
    memmove(m->ev, m->ev + n, (m->n_ev - n) * sizeof(m->ev[0]));
    m->n_ev -= n;
    m->dropped = 0;
}

static kvt_pool *new_pool(struct model *m, uint64_t *rng)
{
    static const uint32_t lens[] = {1, 8, 16, 32};
    memset(m, 0, sizeof(*m));
    m->n = 2 + kvt_test_below(rng, MAX_N - 1);
    m->kpb = 1 + kvt_test_below(rng, MAX_KPB);
    m->hash_len = lens[kvt_test_below(rng, 4)];
    m->ev_cap = kvt_test_below(rng, 3) ? 0 : 1 + kvt_test_below(rng, 12);
    for (uint32_t b = 1; b < m->n; b++)
        m->order[m->n_order++] = b;
    kvt_pool_config c;
    kvt_pool_config_init(&c);
    c.num_blocks = m->n;
    c.keys_per_block = m->kpb;
    c.hash_len = m->hash_len;
    c.event_capacity = m->ev_cap;
    c.n_groups = N_GROUPS;
    c.groups[1] = c.groups[0];
    kvt_pool *p;
    KVT_OK_(kvt_pool_create(&c, &p));
    return p;
}

static void pool_matches_reference_model(void **state)
{
    (void)state;
    g_seed = kvt_test_seed();
    uint64_t rng = g_seed;
    uint64_t total = (uint64_t)(100000 * kvt_test_scale());
    struct model m;
    kvt_pool *p = NULL;
    uint64_t counts[10] = {0};
    for (g_op = 0; g_op < total; g_op++) {
        if (g_op % 4000 == 0) {
            kvt_pool_destroy(p);
            p = new_pool(&m, &rng);
        }
        uint32_t r = kvt_test_below(&rng, 100), kind;
        if (r < 20)
            op_alloc(p, &m, &rng), kind = 0;
        else if (r < 40)
            op_free(p, &m, &rng), kind = 1;
        else if (r < 50)
            op_touch(p, &m, &rng), kind = 2;
        else if (r < 65)
            op_insert(p, &m, &rng), kind = 3;
        else if (r < 75)
            op_lookup(p, &m, &rng), kind = 4;
        else if (r < 80)
            op_evict(p, &m, &rng), kind = 5;
        else if (r < 82)
            op_reset(p, &m), kind = 6;
        else if (r < 92)
            op_hit(p, &m, &rng), kind = 7;
        else
            op_events(p, &m, &rng), kind = 8;
        counts[kind]++;
        compare_state(p, &m);
    }
    kvt_pool_destroy(p);
    print_message(
        "pool model: %llu ops (seed %llu): alloc %llu free %llu touch %llu insert %llu "
        "lookup %llu evict %llu reset %llu hit %llu events %llu\n",
        (unsigned long long)total, (unsigned long long)g_seed, (unsigned long long)counts[0],
        (unsigned long long)counts[1], (unsigned long long)counts[2], (unsigned long long)counts[3],
        (unsigned long long)counts[4], (unsigned long long)counts[5], (unsigned long long)counts[6],
        (unsigned long long)counts[7], (unsigned long long)counts[8]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(pool_matches_reference_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
