/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Levelled logging (handler, level filter) and the injectable clocks.
 */
#include "base/log.h"
#include "kvt_test.h"

static char last_line[1300];
static int last_level, n_lines;

static void capture(void *ctx, int level, const char *line)
{
    (void)ctx;
    snprintf(last_line, sizeof(last_line), "%s", line);
    last_level = level;
    n_lines++;
}

static void log_lines_below_the_level_are_dropped(void **state)
{
    (void)state;
    kvt_log_set_handler(capture, NULL);
    kvt_log_set_level(KVT_LOG_WARN);
    n_lines = 0;
    KVT_LOG_I("not shown %d", 1);
    KVT_LOG_D("not shown");
    assert_int_equal(n_lines, 0);
    KVT_LOG_W("shown %d", 2);
    assert_int_equal(n_lines, 1);
    assert_int_equal(last_level, KVT_LOG_WARN);
    assert_non_null(strstr(last_line, "shown 2"));
    assert_non_null(strstr(last_line, "test_log_clock.c"));
    kvt_log_set_level(KVT_LOG_TRACE);
    KVT_LOG_T("trace");
    assert_int_equal(n_lines, 2);
    kvt_log_set_level(KVT_LOG_OFF);
    KVT_LOG_E("off");
    assert_int_equal(n_lines, 2);
    kvt_log_set_level(99);
    assert_int_equal(kvt_log_get_level(), KVT_LOG_TRACE);
    kvt_log_set_level(-3);
    assert_int_equal(kvt_log_get_level(), KVT_LOG_OFF);
    kvt_log_set_handler(NULL, NULL);
}

static void manual_clock_moves_only_when_told(void **state)
{
    (void)state;
    kvt_manual_clock mc;
    kvt_clock c = kvt_clock_manual(&mc, 1000);
    assert_int_equal(kvt_clock_now(&c), 1000);
    assert_int_equal(kvt_clock_now(&c), 1000);
    kvt_clock_manual_advance(&mc, 250);
    assert_int_equal(kvt_clock_now(&c), 1250);
}

static void monotonic_clock_never_goes_back(void **state)
{
    (void)state;
    kvt_clock c = kvt_clock_monotonic();
    uint64_t a = kvt_clock_now(&c), b = kvt_clock_now(NULL), d = kvt_monotonic_ns();
    assert_true(a <= b && b <= d);
    assert_true(a > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(log_lines_below_the_level_are_dropped),
        cmocka_unit_test(manual_clock_moves_only_when_told),
        cmocka_unit_test(monotonic_clock_never_goes_back),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
