/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Chunked bump storage: addresses never move, clear reuses memory, reserve guarantees room.
 */
#include "base/bump.h"
#include "kvt_test.h"

static void allocations_keep_their_address_and_content(void **state)
{
    (void)state;
    kvt_bump b = {0};
    char *ptrs[500];
    for (int i = 0; i < 500; i++) {
        char s[32];
        int n = snprintf(s, sizeof(s), "string-%d", i);
        ptrs[i] = kvi_bump_strdup(&b, s, (uint32_t)n);
        assert_non_null(ptrs[i]);
        assert_int_equal((uintptr_t)kvi_bump_alloc(&b, 3) % 8, 0);
    }
    for (int i = 0; i < 500; i++) {
        char s[32];
        snprintf(s, sizeof(s), "string-%d", i);
        assert_string_equal(ptrs[i], s);
    }
    void *big = kvi_bump_alloc(&b, 100000);
    assert_non_null(big);
    memset(big, 1, 100000);
    kvt_bump_release(&b);
    assert_null(b.head);
}

static void clear_reuses_the_chunks(void **state)
{
    (void)state;
    kvt_bump b = {0};
    char *first = kvi_bump_strdup(&b, "abc", 3);
    for (int i = 0; i < 100; i++)
        kvi_bump_alloc(&b, 100);
    struct kvt_bump_chunk *head = b.head;
    kvt_bump_clear(&b);
    assert_ptr_equal(kvi_bump_strdup(&b, "xyz", 3), first);
    assert_ptr_equal(b.head, head);
    KVT_OK_(kvi_bump_reserve(&b, 50000));
    void *p = kvi_bump_alloc(&b, 50000);
    assert_non_null(p);
    kvt_bump_release(&b);
    kvt_bump_clear(&b); /* on an empty bump: harmless */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(allocations_keep_their_address_and_content),
        cmocka_unit_test(clear_reuses_the_chunks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
