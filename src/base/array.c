/* SPDX-License-Identifier: Apache-2.0 */
/* Growable arrays (see array.h). */
#include <stdlib.h>

#include "base/array.h"
#include "base/error.h"

int kvi_array_grow(void **arr, uint32_t *cap, uint64_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    if (need > UINT32_MAX)
        return kvt_fail(KVT_ELIMIT, "list of %llu entries exceeds 2^32 - 1",
                        (unsigned long long)need);
    uint64_t ncap = *cap ? (uint64_t)*cap * 2 : 16;
    while (ncap < need)
        ncap *= 2;
    if (ncap > UINT32_MAX)
        ncap = UINT32_MAX;
    void *p = realloc(*arr, (size_t)ncap * elem);
    if (!p)
        return kvt_fail(KVT_ENOMEM, "out of memory growing a list to %llu entries",
                        (unsigned long long)need);
    *arr = p;
    *cap = (uint32_t)ncap;
    return 0;
}
