/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Intrusive list: push, remove, order, and the detached-node check the pool relies on.
 */
#include "base/list.h"
#include "kvt_test.h"

struct item {
    int v;
    kvi_list link;
};

static void push_remove_and_walk_keep_order(void **state)
{
    (void)state;
    kvi_list head;
    kvi_list_init(&head);
    assert_true(kvi_list_empty(&head));
    assert_null(kvi_list_first(&head));
    struct item it[4];
    for (int i = 0; i < 4; i++) {
        it[i].v = i;
        kvi_list_init(&it[i].link);
        assert_false(kvi_list_linked(&it[i].link));
    }
    kvi_list_push_back(&head, &it[1].link);
    kvi_list_push_back(&head, &it[2].link);
    kvi_list_push_front(&head, &it[0].link);
    kvi_list_push_back(&head, &it[3].link);
    kvi_list_remove(&it[2].link);
    assert_false(kvi_list_linked(&it[2].link));
    int expect[] = {0, 1, 3}, n = 0;
    kvi_list *pos;
    kvi_list_for_each (pos, &head) {
        assert_int_equal(kvi_list_entry(pos, struct item, link)->v, expect[n++]);
    }
    assert_int_equal(n, 3);
    assert_ptr_equal(kvi_list_first(&head), &it[0].link);
    assert_ptr_equal(kvi_list_next(&head, &it[1].link), &it[3].link);
    assert_null(kvi_list_next(&head, &it[3].link));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(push_remove_and_walk_keep_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
