/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Clocks. Everything in kvtier that keeps a deadline reads time through a kvt_clock so tests
 * can drive it by hand; production code passes NULL or kvt_clock_monotonic().
 */
#include "kvtier/base.h"

#include <time.h>

uint64_t kvt_monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t monotonic_cb(void *ctx)
{
    (void)ctx;
    return kvt_monotonic_ns();
}

kvt_clock kvt_clock_monotonic(void)
{
    kvt_clock c = {monotonic_cb, NULL};
    return c;
}

uint64_t kvt_clock_now(const kvt_clock *clock)
{
    if (!clock || !clock->now_ns)
        return kvt_monotonic_ns();
    return clock->now_ns(clock->ctx);
}

static uint64_t manual_cb(void *ctx)
{
    return ((const kvt_manual_clock *)ctx)->now_ns;
}

kvt_clock kvt_clock_manual(kvt_manual_clock *mc, uint64_t start_ns)
{
    mc->now_ns = start_ns;
    kvt_clock c = {manual_cb, mc};
    return c;
}

void kvt_clock_manual_advance(kvt_manual_clock *mc, uint64_t delta_ns)
{
    mc->now_ns += delta_ns;
}
