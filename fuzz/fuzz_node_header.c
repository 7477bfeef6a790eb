/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libFuzzer target for the node tier's metadata header check (src/node/node.c,
 * kvi_node_header_check): the input is a whole metadata object as a replica would map it.
 * Property: the check either refuses with a message, or accepts a header whose every region
 * (slots, pins, log) lies inside the object, in order, with non-zero capacities, so that a
 * replica trusting it can never index outside its mapping or divide by zero.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "node/node_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok)
{
    if (!ok)
        abort(); /* the fuzzer reports the input */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* the object as mapped: page-aligned memory, as mmap gives */
    void *p = NULL;
    if (size && posix_memalign(&p, 4096, size) != 0)
        return 0;
    if (size)
        memcpy(p, data, size);
    if (kvi_node_header_check(p, size) != 0) {
        check(kvt_last_error()[0] != 0);
        free(p);
        return 0;
    }
    const struct node_hdr *h = p;
    uint64_t total = (uint64_t)h->ranks * h->bpr;
    check(h->ranks >= 1 && h->ranks <= KVT_NODE_MAX_RANKS && h->bpr >= 2 && h->kpb >= 1);
    check(h->log_cap > 0 && h->slot_stride >= 8 + (uint64_t)h->kpb * (h->hash_len + 8u));
    check(h->slots_off >= sizeof(*h));
    check(h->slots_off + total * h->slot_stride <= h->pins_off);
    check(h->pins_off + total * h->ranks <= h->log_off);
    check(h->log_off + (uint64_t)h->log_cap * 4u == h->size && h->size == size);
    free(p);
    return 0;
}
