/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The spin before a sleep (src/net/spin.c): a fixed spin ends after its budget and stays
 * ended until work is found; an adaptive one stops spinning once most recent looks at the run
 * queue were crowded, keeps spinning through a single crowded look, and spins again once the
 * machine clears. The look is injected; the real one (/proc/loadavg) is run once.
 */
#include "kvt_test.h"

#include "net/spin.h"

#define MS 1000000ull

static bool g_crowded;
static int g_looks;

static bool fake_look(void)
{
    g_looks++;
    return g_crowded;
}

/* One idle stretch starting at t: whether it spins at all (its first poll) and, if it does,
 * that it spins until exactly max and not after. */
static bool stretch_spins(kvi_spin *s, uint64_t t)
{
    bool spins = kvi_spin_idle(s, t);
    if (spins) {
        assert_true(kvi_spin_idle(s, t + s->max_ns - 1));
        assert_false(kvi_spin_idle(s, t + s->max_ns));
    }
    assert_false(kvi_spin_idle(s, t + s->max_ns + 1)); /* slept: stays asleep */
    kvi_spin_busy(s);
    return spins;
}

static void test_fixed_spin(void **state)
{
    (void)state;
    kvi_spin_test_look(fake_look);
    g_crowded = true;
    kvi_spin s;
    kvi_spin_init(&s, 200000, false);
    for (int i = 0; i < 20; i++)
        assert_true(stretch_spins(&s, 1 + (uint64_t)i * 2 * MS));
    assert_int_equal(g_looks, 0); /* a fixed spin never looks */
    kvi_spin_init(&s, 0, true);   /* no spin at all */
    assert_false(kvi_spin_idle(&s, 5));
    kvi_spin_test_look(NULL);
}

static void test_adaptive_spin(void **state)
{
    (void)state;
    kvi_spin_test_look(fake_look);
    g_looks = 0;
    kvi_spin s;
    kvi_spin_init(&s, 200000, true);
    uint64_t t = 10 * MS;
    g_crowded = false;
    for (int i = 0; i < 10; i++, t += 2 * MS)
        assert_true(stretch_spins(&s, t));
    /* one crowded look among clear ones: still spinning */
    g_crowded = true;
    assert_true(stretch_spins(&s, t));
    t += 2 * MS;
    g_crowded = false;
    assert_true(stretch_spins(&s, t));
    t += 2 * MS;
    /* crowded from now on: within a few looks the spin stops */
    g_crowded = true;
    int spun = 0;
    for (int i = 0; i < 12; i++, t += 2 * MS)
        spun += stretch_spins(&s, t);
    assert_in_range(spun, 1, 8);
    assert_false(stretch_spins(&s, t));
    t += 2 * MS;
    /* looks are rate-limited: many stretches within a millisecond look once */
    int before = g_looks;
    for (int i = 0; i < 50; i++)
        assert_false(stretch_spins(&s, t + (uint64_t)i * 1000));
    assert_in_range(g_looks - before, 0, 1);
    t += 2 * MS;
    /* the machine clears: within a few looks spinning comes back */
    g_crowded = false;
    spun = 0;
    for (int i = 0; i < 10; i++, t += 2 * MS)
        spun += stretch_spins(&s, t);
    assert_in_range(spun, 3, 9);
    assert_true(stretch_spins(&s, t));
    kvi_spin_test_look(NULL);
}

/* The real look reads /proc/loadavg: on this idle test thread it must not stop a spin for
 * good (a crowded CI machine may make a stretch not spin; the stretch still ends in a sleep). */
static void test_real_look(void **state)
{
    (void)state;
    kvi_spin_test_look(NULL);
    kvi_spin s;
    kvi_spin_init(&s, 1000, true);
    for (int i = 0; i < 3; i++)
        (void)stretch_spins(&s, 1 + (uint64_t)i * 2 * MS);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixed_spin),
        cmocka_unit_test(test_adaptive_spin),
        cmocka_unit_test(test_real_look),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
