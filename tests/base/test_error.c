/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Error codes, names, and the thread-local detail message; a NULL object's stats read as zero.
 */
#include <pthread.h>

#include "base/error.h"
#include "kvt_test.h"
#include "kvtier/copy.h"
#include "kvtier/disk.h"
#include "kvtier/ec.h"
#include "kvtier/ec_net.h"

static void every_code_has_a_name_and_a_text(void **state)
{
    (void)state;
    for (int e = 0; e >= KVT_EUNSUPPORTED; e--) {
        assert_string_not_equal(kvt_err_name(e), "KVT_E?");
        assert_string_not_equal(kvt_strerror(e), "unknown error");
    }
    assert_string_equal(kvt_err_name(KVT_EPROTO), "KVT_EPROTO");
    assert_string_equal(kvt_err_name(-999), "KVT_E?");
    assert_string_equal(kvt_strerror(12345), "unknown error");
}

/* An object that failed to be created (NULL) reads as all-zero stats, whatever the caller's
 * struct held; a NULL struct is ignored. */
#define READS_ZERO(type, fn)                                                                       \
    do {                                                                                           \
        type st_, zero_;                                                                           \
        memset(&st_, 0xA5, sizeof(st_));                                                           \
        memset(&zero_, 0, sizeof(zero_));                                                          \
        fn(NULL, &st_);                                                                            \
        assert_memory_equal(&st_, &zero_, sizeof(st_));                                            \
        fn(NULL, NULL);                                                                            \
    } while (0)

static void a_null_object_reads_as_all_zero_stats(void **state)
{
    (void)state;
    READS_ZERO(kvt_copy_stats, kvt_copy_get_stats);
    READS_ZERO(kvt_disk_stats, kvt_disk_get_stats);
    READS_ZERO(kvt_ec_shard_stats, kvt_ec_shard_get_stats);
    READS_ZERO(kvt_ec_sched_stats, kvt_ec_sched_get_stats);
    READS_ZERO(kvt_ec_producer_stats, kvt_ec_producer_get_stats);
    READS_ZERO(kvt_ec_server_stats, kvt_ec_server_get_stats);
    READS_ZERO(kvt_ec_inbox_stats, kvt_ec_inbox_get_stats);
    /* and a producer never made has nothing pending (the demo asks after a failed start) */
    assert_false(kvt_ec_producer_pending(NULL));
}

static void failure_message_is_kept_and_wrapped(void **state)
{
    (void)state;
    assert_int_equal(kvt_fail(KVT_ERANGE, "block %u out of range", 7u), KVT_ERANGE);
    assert_string_equal(kvt_last_error(), "block 7 out of range");
    assert_int_equal(kvi_fail_wrap(KVT_EPROTO, "decode"), KVT_EPROTO);
    assert_string_equal(kvt_last_error(), "decode: block 7 out of range");
    assert_int_equal(kvi_fail_errno(2, "open %s", "x"), KVT_ESYS);
    assert_non_null(strstr(kvt_last_error(), "open x: "));
    kvi_clear_error();
    assert_string_equal(kvt_last_error(), "");
}

/* The message being replaced may be an argument of its replacement (node.c did so, issue 56:
 * the output overwrote its own input, garbled); kvt_fail and kvi_fail_errno format it first. */
static void a_message_may_quote_the_last_one(void **state)
{
    (void)state;
    kvt_fail(KVT_EINVAL, "header version 9, expected 3");
    kvt_fail(KVT_EINVAL, "node n: /kvtier.n.meta: %s; remove it", kvt_last_error());
    assert_string_equal(kvt_last_error(),
                        "node n: /kvtier.n.meta: header version 9, expected 3; remove it");
    kvi_fail_errno(2, "opening (%s)", kvt_last_error());
    assert_non_null(strstr(kvt_last_error(), "opening (node n: /kvtier.n.meta: header version"));
}

static void long_messages_are_truncated_not_overflowed(void **state)
{
    (void)state;
    char big[2000];
    memset(big, 'a', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    kvt_fail(KVT_EINVAL, "%s", big);
    assert_true(strlen(kvt_last_error()) < 600);
    kvi_fail_wrap(KVT_EINVAL, big);
    assert_true(strlen(kvt_last_error()) < 600);
    kvi_fail_errno(5, "%s", big);
    assert_true(strlen(kvt_last_error()) < 600);
}

static void *other_thread(void *arg)
{
    (void)arg;
    kvt_fail(KVT_EIO, "from the other thread");
    return NULL;
}

static void messages_are_per_thread(void **state)
{
    (void)state;
    kvt_fail(KVT_EINVAL, "mine");
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, other_thread, NULL), 0);
    pthread_join(t, NULL);
    assert_string_equal(kvt_last_error(), "mine");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_code_has_a_name_and_a_text),
        cmocka_unit_test(failure_message_is_kept_and_wrapped),
        cmocka_unit_test(a_null_object_reads_as_all_zero_stats),
        cmocka_unit_test(a_message_may_quote_the_last_one),
        cmocka_unit_test(long_messages_are_truncated_not_overflowed),
        cmocka_unit_test(messages_are_per_thread),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
