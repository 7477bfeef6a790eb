/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Remote-tier instances for the tests (test_remote, test_remote_hostile): each one a
 * kvt_remote against the test program's Redis (redis_group.h), serving a region of SLOTS
 * blocks of BB bytes whose contents are a function of (sequence, index), so that every byte a
 * reader gets can be checked, and the chained hashes of a sequence.
 */
#ifndef KVT_TEST_REMOTE_INST_H
#define KVT_TEST_REMOTE_INST_H

#include <errno.h>
#include <time.h>

#include "redis_group.h"
#include "kvtier/remote.h"

#define BB    8192u /* block bytes */
#define SLOTS 64u
#define HL    16u
#define CRED  "a-shared-secret-of-the-space"

static char g_space[32];

static inline int each_setup(void **state)
{
    (void)state;
    static int n;
    snprintf(g_space, sizeof(g_space), "t%d-%d", (int)getpid(), n++);
    return 0;
}

/* chained block hashes of prefix `seq`: hash i depends on i and the sequence */
static inline void chain(uint32_t seq, uint32_t n, uint8_t *out)
{
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t j = 0; j < HL; j++)
            out[i * HL + j] = (uint8_t)(seq * 131u + i * 7u + j * 29u + (i >> 8));
}

/* the bytes of block i of sequence seq */
static inline void fill(uint8_t *p, uint32_t seq, uint32_t i)
{
    for (uint32_t k = 0; k < BB; k += 4) {
        uint32_t v = seq * 2654435761u ^ i * 40503u ^ k;
        memcpy(p + k, &v, 4);
    }
}

static inline bool same_as(const uint8_t *p, uint32_t seq, uint32_t i)
{
    uint8_t want[BB];
    fill(want, seq, i);
    return memcmp(p, want, BB) == 0;
}

typedef struct inst {
    kvt_remote *r;
    uint8_t *region;
} inst;

/* A case's changes to an instance's config (NULL: none). */
typedef void (*cfg_tweak)(kvt_remote_config *c);

static inline int make_with(inst *in, const char *name, bool serve, uint64_t seed, const char *cred,
                            uint32_t timeout_ms, cfg_tweak tweak)
{
    kvt_remote_config c;
    test_remote_config(&c, g_space, name, cred);
    c.block_bytes = BB;
    c.hash_len = HL;
    c.hash_seed = seed;
    c.timeout_ms = timeout_ms;
    if (tweak)
        tweak(&c);
    in->region = NULL;
    if (serve) {
        in->region = calloc(SLOTS, BB);
        assert_non_null(in->region);
        c.region = in->region;
        c.n_slots = SLOTS;
    }
    int rc = kvt_remote_create(&c, &in->r);
    if (rc) {
        free(in->region);
        in->region = NULL;
    }
    return rc;
}

static inline int make(inst *in, const char *name, bool serve, uint64_t seed, const char *cred,
                       uint32_t timeout_ms)
{
    return make_with(in, name, serve, seed, cred, timeout_ms, NULL);
}

static inline void drop_inst(inst *in)
{
    kvt_remote_destroy(in->r);
    free(in->region);
    in->r = NULL;
    in->region = NULL;
}

/* stores blocks [0, n) of seq into slots first.. and publishes them */
static inline void store(inst *in, uint32_t seq, uint32_t n, uint32_t first)
{
    uint8_t hashes[SLOTS * HL];
    uint32_t slots[SLOTS];
    chain(seq, n, hashes);
    for (uint32_t i = 0; i < n; i++) {
        slots[i] = first + i;
        fill(in->region + (size_t)slots[i] * BB, seq, i);
    }
    KVT_OK_(kvt_remote_publish(in->r, slots, hashes, n));
}

/* looks up n blocks of seq and reads what hit; returns the hits, checks every byte read;
 * counts outcomes into ok / stale / failed */
static inline uint32_t fetch(inst *in, uint32_t seq, uint32_t n, uint32_t *ok, uint32_t *stale,
                             uint32_t *failed)
{
    uint8_t hashes[SLOTS * HL];
    kvt_remote_loc locs[SLOTS];
    uint32_t hit = 0;
    chain(seq, n, hashes);
    KVT_OK_(kvt_remote_lookup(in->r, hashes, n, locs, &hit));
    *ok = *stale = *failed = 0;
    if (!hit)
        return 0;
    uint8_t *dst = malloc((size_t)hit * BB);
    void *ptrs[SLOTS];
    int st[SLOTS];
    assert_non_null(dst);
    for (uint32_t i = 0; i < hit; i++)
        ptrs[i] = dst + (size_t)i * BB;
    (void)kvt_remote_read(in->r, locs, hashes, hit, ptrs, st);
    for (uint32_t i = 0; i < hit; i++) {
        if (st[i] == 0) {
            if (!same_as(dst + (size_t)i * BB, seq, i))
                fail_msg("block %u of sequence %u: wrong bytes read", i, seq);
            (*ok)++;
        } else if (st[i] == KVT_ENOENT) {
            (*stale)++;
        } else {
            assert_true(st[i] == KVT_EIO || st[i] == KVT_EINVAL);
            (*failed)++;
        }
    }
    free(dst);
    return hit;
}

#endif
