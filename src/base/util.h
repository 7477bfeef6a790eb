/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Small helpers shared by every layer: branch hints, min/max, alignment and overflow-checked
 * arithmetic. Header-only.
 */
#ifndef KVT_BASE_UTIL_H
#define KVT_BASE_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define KVT_LIKELY(x)    __builtin_expect(!!(x), 1)
#define KVT_UNLIKELY(x)  __builtin_expect(!!(x), 0)
#define KVT_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define KVT_CACHELINE    64

/* Defines public accessor `ret name(const T *x)`, which returns x->field (its declaration,
 * with its documentation, is in the public header). */
#define KVI_GETTER(ret, name, T, field)                                                            \
    ret name(const T *x)                                                                           \
    {                                                                                              \
        return x->field;                                                                           \
    }

#define kvi_container_of(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))

static inline uint32_t kvi_min_u32(uint32_t a, uint32_t b)
{
    return a < b ? a : b;
}

static inline uint32_t kvi_max_u32(uint32_t a, uint32_t b)
{
    return a > b ? a : b;
}

/* ceil(a / b), b > 0, without overflow. */
static inline uint32_t kvi_div_ceil_u32(uint32_t a, uint32_t b)
{
    return a / b + (a % b != 0);
}

static inline uint64_t kvi_gcd_u64(uint64_t a, uint64_t b)
{
    while (b) {
        uint64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* Rounds x up to a multiple of a (any a > 0); false on overflow. */
static inline bool kvi_round_up_sz(size_t x, size_t a, size_t *out)
{
    size_t r = x % a;
    if (r == 0) {
        *out = x;
        return true;
    }
    return !__builtin_add_overflow(x, a - r, out);
}

/* First index of the ascending array a[0..n) whose value is >= v (n if none). */
static inline uint32_t kvi_lower_bound_i64(const int64_t *a, uint32_t n, int64_t v)
{
    uint32_t lo = 0, hi = n;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (a[mid] < v)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Smallest power of two >= x (x <= 2^63). */
static inline uint64_t kvi_pow2_ceil(uint64_t x)
{
    if (x <= 1)
        return 1;
    return 1ull << (64 - __builtin_clzll(x - 1));
}

/* POSIX shared-memory name of a node tier's object: kind "meta" (kvtier/node.h, src/node) or
 * "data" (the workers' mirrors, src/copy). */
#define KVI_NODE_SHM_NAME "/kvtier.%s.%s"

/* A get_stats call's first step: false, with *st zeroed where st is given, when obj is NULL (an
 * object that failed to be created reads as all zero) or st is. */
static inline bool kvi_stats_begin(const void *obj, void *st, size_t size)
{
    if (obj && st)
        return true;
    if (st)
        memset(st, 0, size);
    return false;
}

#endif
