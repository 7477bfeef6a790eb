/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Event table: a model-based test against a plain sorted array of (id, payload) over random
 * capacities and random add / find / remove sequences, ids ascending with gaps as events are
 * issued; the walk must give the active entries in ascending id and each record its payload.
 */
#include "base/evtable.h"
#include "kvt_test.h"

#define MAXCAP 40u

struct rec {
    int64_t id;
    uint64_t payload;
};

struct model {
    int64_t id[MAXCAP];
    uint64_t payload[MAXCAP];
    uint32_t n;
};

static void check_same(const kvi_evtable *t, const struct model *md, uint64_t seed, uint64_t at)
{
    KVT_MODEL_CHECK("evtable", "step", at, seed, kvi_evtable_len(t) == md->n, "len %u, model %u",
                    kvi_evtable_len(t), md->n);
    uint32_t k = 0;
    for (uint32_t i = kvi_evtable_first(t); i != KVI_NIL; i = kvi_evtable_next(t, i), k++) {
        const struct rec *r = kvi_evtable_rec(t, i);
        KVT_MODEL_CHECK("evtable", "step", at, seed, k < md->n && r->id == md->id[k],
                        "walk entry %u is event %lld", k, (long long)r->id);
        KVT_MODEL_CHECK("evtable", "step", at, seed, r->payload == md->payload[k],
                        "event %lld lost its record", (long long)r->id);
    }
    KVT_MODEL_CHECK("evtable", "step", at, seed, k == md->n, "walk gave %u of %u", k, md->n);
}

static void random_operations_match_the_model(void **state)
{
    (void)state;
    uint64_t seed = kvt_test_seed(), s = seed;
    uint32_t runs = (uint32_t)(100 * kvt_test_scale());
    for (uint32_t run = 0; run < runs; run++) {
        uint32_t cap = kvt_test_below(&s, MAXCAP + 1);
        kvi_evtable t;
        KVT_OK_(kvi_evtable_init(&t, cap, sizeof(struct rec)));
        struct model md = {.n = 0};
        int64_t next = (int64_t)kvt_test_below(&s, 1000) - 500;
        for (uint32_t step = 0; step < 500; step++) {
            uint64_t at = (uint64_t)run * 1000 + step;
            uint32_t op = kvt_test_below(&s, 3);
            if (op == 0) { /* issue */
                next += 1 + kvt_test_below(&s, 3);
                uint32_t i = kvi_evtable_add(&t, next);
                KVT_MODEL_CHECK("evtable", "step", at, seed, (i == KVI_NIL) == (md.n == cap),
                                "add gave %u with %u of %u", i, md.n, cap);
                if (i != KVI_NIL) {
                    struct rec *r = kvi_evtable_rec(&t, i);
                    KVT_MODEL_CHECK("evtable", "step", at, seed, r->id == 0 && r->payload == 0,
                                    "a new record is not zeroed");
                    r->id = next;
                    r->payload = kvt_test_rand(&s);
                    md.id[md.n] = next;
                    md.payload[md.n++] = r->payload;
                }
            } else if (op == 1 && md.n) { /* complete one, any */
                uint32_t k = kvt_test_below(&s, md.n);
                uint32_t i = kvi_evtable_find(&t, md.id[k]);
                KVT_MODEL_CHECK("evtable", "step", at, seed, i != KVI_NIL, "event %lld not found",
                                (long long)md.id[k]);
                KVT_MODEL_CHECK("evtable", "step", at, seed,
                                kvi_evtable_index(&t, kvi_evtable_rec(&t, i)) == i,
                                "index of record %u", i);
                kvi_evtable_remove(&t, i);
                memmove(md.id + k, md.id + k + 1, (md.n - k - 1) * sizeof(md.id[0]));
                memmove(md.payload + k, md.payload + k + 1, (md.n - k - 1) * sizeof(md.payload[0]));
                md.n--;
            } else { /* an event that is not in flight (completed, never issued) */
                int64_t id = next - (int64_t)kvt_test_below(&s, 40);
                bool active = false;
                for (uint32_t k = 0; k < md.n; k++)
                    active |= md.id[k] == id;
                KVT_MODEL_CHECK("evtable", "step", at, seed,
                                (kvi_evtable_find(&t, id) != KVI_NIL) == active,
                                "find(%lld) disagrees with the model", (long long)id);
            }
            check_same(&t, &md, seed, at);
        }
        kvi_evtable_free(&t);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(random_operations_match_the_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
