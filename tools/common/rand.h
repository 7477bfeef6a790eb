/* SPDX-License-Identifier: Apache-2.0 */
/*
 * splitmix64: a tiny seedable PRNG for workloads, randomized tests and benchmarks (never for
 * anything security-related). Deterministic for a seed, so a printed seed replays a run.
 */
#ifndef KVT_TOOLS_RAND_H
#define KVT_TOOLS_RAND_H

#include <stdint.h>

static inline uint64_t kvt_rand_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [0, n) (n > 0), by multiply-shift. */
static inline uint32_t kvt_rand_below(uint64_t *s, uint32_t n)
{
    return (uint32_t)(((kvt_rand_next(s) >> 32) * (uint64_t)n) >> 32);
}

#endif
