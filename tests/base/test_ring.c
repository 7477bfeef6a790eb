/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Bounded ring: a model-based test against a plain array kept in order (shifted on every
 * drop), over random capacities (0 included), element sizes and operation sequences, and the
 * refusals of init.
 */
#include "base/ring.h"
#include "kvt_test.h"

#define MAXCAP 19u

struct model {
    uint32_t v[MAXCAP], n, cap;
};

static void model_drop(struct model *md, uint32_t k)
{
    memmove(md->v, md->v + k, (md->n - k) * sizeof(md->v[0]));
    md->n -= k;
}

/* An element of `elem` bytes carries the value in its first 4 and a pattern after it. */
static void fill(unsigned char *e, uint32_t elem, uint32_t v)
{
    memcpy(e, &v, 4);
    for (uint32_t i = 4; i < elem; i++)
        e[i] = (unsigned char)(v * 31 + i);
}

static bool holds(const unsigned char *e, uint32_t elem, uint32_t v)
{
    unsigned char want[64];
    fill(want, elem, v);
    return memcmp(e, want, elem) == 0;
}

static void check_same(const kvi_ring *r, const struct model *md, uint64_t seed, uint64_t step)
{
    KVT_MODEL_CHECK("ring", "step", step, seed, kvi_ring_len(r) == md->n, "len %u, model %u",
                    kvi_ring_len(r), md->n);
    KVT_MODEL_CHECK("ring", "step", step, seed, kvi_ring_full(r) == (md->n == md->cap),
                    "full %d with %u of %u", kvi_ring_full(r), md->n, md->cap);
    for (uint32_t i = 0; i < md->n; i++)
        KVT_MODEL_CHECK("ring", "step", step, seed, holds(kvi_ring_at(r, i), r->elem, md->v[i]),
                        "element %u is not %u", i, md->v[i]);
}

static void random_operations_match_the_model(void **state)
{
    (void)state;
    uint64_t seed = kvt_test_seed(), s = seed;
    uint32_t next = 1, runs = (uint32_t)(200 * kvt_test_scale());
    for (uint32_t run = 0; run < runs; run++) {
        uint32_t cap = kvt_test_below(&s, MAXCAP + 1), elem = 4 + kvt_test_below(&s, 60);
        kvi_ring r;
        KVT_OK_(kvi_ring_init(&r, elem, cap));
        struct model md = {.cap = cap};
        for (uint32_t step = 0; step < 400; step++) {
            uint64_t at = (uint64_t)run * 1000 + step;
            switch (kvt_test_below(&s, 6)) {
            case 0: { /* push: refused when full */
                void *e = kvi_ring_push(&r);
                KVT_MODEL_CHECK("ring", "step", at, seed, (e == NULL) == (md.n == cap),
                                "push gave %p with %u of %u", e, md.n, cap);
                if (e) {
                    fill(e, elem, next);
                    md.v[md.n++] = next++;
                }
                break;
            }
            case 1: { /* push over: the oldest goes when full */
                bool dropped = false;
                void *e = kvi_ring_push_over(&r, &dropped);
                KVT_MODEL_CHECK("ring", "step", at, seed, (e == NULL) == (cap == 0),
                                "push_over gave %p at capacity %u", e, cap);
                KVT_MODEL_CHECK("ring", "step", at, seed, dropped == (cap && md.n == cap),
                                "dropped %d with %u of %u", dropped, md.n, cap);
                if (e) {
                    if (dropped)
                        model_drop(&md, 1);
                    fill(e, elem, next);
                    md.v[md.n++] = next++;
                }
                break;
            }
            case 2: { /* take some, copied out in order */
                unsigned char out[MAXCAP * 64];
                uint32_t max = kvt_test_below(&s, MAXCAP + 2);
                uint32_t got = kvi_ring_take(&r, out, max), want = max < md.n ? max : md.n;
                KVT_MODEL_CHECK("ring", "step", at, seed, got == want, "took %u, model %u", got,
                                want);
                for (uint32_t i = 0; i < got; i++)
                    KVT_MODEL_CHECK("ring", "step", at, seed,
                                    holds(out + (size_t)i * elem, elem, md.v[i]),
                                    "taken element %u is not %u", i, md.v[i]);
                model_drop(&md, got);
                break;
            }
            case 3: { /* drop some */
                uint32_t k = md.n ? kvt_test_below(&s, md.n + 1) : 0;
                kvi_ring_drop(&r, k);
                model_drop(&md, k);
                break;
            }
            case 4: /* take into nothing: nothing goes */
                KVT_MODEL_CHECK("ring", "step", at, seed, kvi_ring_take(&r, NULL, 5) == 0,
                                "take into NULL took something");
                break;
            default:
                if (kvt_test_below(&s, 20) == 0) {
                    kvi_ring_clear(&r);
                    md.n = 0;
                }
            }
            check_same(&r, &md, seed, at);
        }
        kvi_ring_free(&r);
    }
}

static void init_refuses_what_is_not_a_ring(void **state)
{
    (void)state;
    kvi_ring r;
    KVT_ERR_(kvi_ring_init(&r, 0, 4), KVT_EINVAL);
    KVT_ERR_(kvi_ring_init(&r, 8, KVI_RING_MAX + 1), KVT_EINVAL);
    assert_null(r.buf);
    kvi_ring_free(&r); /* harmless on a refused ring */
    KVT_OK_(kvi_ring_init(&r, 8, 0));
    assert_null(r.buf);
    bool dropped = false;
    assert_null(kvi_ring_push(&r));
    assert_null(kvi_ring_push_over(&r, &dropped));
    assert_false(dropped);
    kvi_ring_free(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(random_operations_match_the_model),
        cmocka_unit_test(init_refuses_what_is_not_a_ring),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
