/* SPDX-License-Identifier: Apache-2.0 */
/*
 * SPSC ring: FIFO order, full/empty edges and wrap-around on one thread; then a producer and a
 * consumer thread moving a million sequence numbers (run under ThreadSanitizer in CI).
 */
#include <pthread.h>

#include "base/spsc.h"
#include "kvt_test.h"

static void fifo_order_full_and_empty_edges(void **state)
{
    (void)state;
    kvi_spsc q;
    KVT_ERR_(kvi_spsc_init(&q, 0, 4), KVT_EINVAL);
    KVT_OK_(kvi_spsc_init(&q, sizeof(uint64_t), 3)); /* rounded to 4 */
    assert_int_equal(kvi_spsc_capacity(&q), 4);
    uint64_t v;
    assert_false(kvi_spsc_pop(&q, &v));
    for (uint64_t round = 0; round < 10; round++) {
        for (uint64_t i = 0; i < 4; i++) {
            uint64_t x = round * 10 + i;
            assert_true(kvi_spsc_push(&q, &x));
        }
        uint64_t x = 99;
        assert_false(kvi_spsc_push(&q, &x));
        assert_int_equal(kvi_spsc_size(&q), 4);
        for (uint64_t i = 0; i < 4; i++) {
            assert_true(kvi_spsc_pop(&q, &v));
            assert_int_equal(v, round * 10 + i);
        }
        assert_false(kvi_spsc_pop(&q, &v));
    }
    kvi_spsc_destroy(&q);
}

#define N_ITEMS 1000000ull

struct item {
    uint64_t seq, check;
};

static void *producer(void *arg)
{
    kvi_spsc *q = arg;
    for (uint64_t i = 0; i < N_ITEMS; i++) {
        struct item it = {i, i * 2654435761u};
        while (!kvi_spsc_push(q, &it))
            ;
    }
    return NULL;
}

static void two_threads_move_every_item_once_in_order(void **state)
{
    (void)state;
    kvi_spsc q;
    KVT_OK_(kvi_spsc_init(&q, sizeof(struct item), 256));
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, producer, &q), 0);
    uint64_t next = 0;
    while (next < N_ITEMS) {
        struct item it;
        if (!kvi_spsc_pop(&q, &it))
            continue;
        if (it.seq != next || it.check != next * 2654435761u)
            fail_msg("item %llu arrived as %llu", (unsigned long long)next,
                     (unsigned long long)it.seq);
        next++;
    }
    pthread_join(t, NULL);
    struct item it;
    assert_false(kvi_spsc_pop(&q, &it));
    kvi_spsc_destroy(&q);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(fifo_order_full_and_empty_edges),
        cmocka_unit_test(two_threads_move_every_item_once_in_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
