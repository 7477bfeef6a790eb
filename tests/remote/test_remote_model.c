/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Model-based test of the remote tier: three instances against a real Redis (started here),
 * driven by a random sequence of stores (with the withdraw of what a slot held), withdraws,
 * scribbles over published slots (bytes changed without a withdraw), restarts, and lookups
 * followed by reads, checked against a model of the directory and of every region:
 *
 *   directory[id] = (instance, slot) of the last publication of block id, removed by that
 *                   instance's withdraw of that slot or by its restart;
 *   lookup(chain) = the longest prefix of the chain whose blocks the directory names, owned by
 *                   another instance;
 *   read          = every block whose slot still holds the block intact is read byte for byte
 *                   (status 0), every scribbled one is refused (never status 0).
 *
 * Blocks are content-addressed (the bytes of block id are a function of id), as KV blocks of
 * one prefix are. KVTIER_TEST_SCALE multiplies the length, KVTIER_TEST_SEED replays a run.
 */
#include "kvt_test.h"
#include "redis_group.h"
#include "kvtier/remote.h"

#define NI    3u  /* instances */
#define SLOTS 24u /* slots per instance (slot 0 unused) */
#define IDS   48u /* distinct blocks */
#define BB    2048u
#define HL    16u
#define CHAIN 12u
#define CRED  "model-test-credential-of-the-space"

typedef struct minst {
    kvt_remote *r;
    uint8_t *region;
    int held[SLOTS];       /* block id in the slot, -1: none */
    bool published[SLOTS]; /* its publication stands (not withdrawn) */
    bool scribbled[SLOTS];
} minst;

typedef struct dentry {
    int inst; /* -1: no entry */
    uint32_t slot;
} dentry;

static minst g_in[NI];
static dentry g_dirm[IDS];
static const char *NAMES[NI] = {"m0", "m1", "m2"};

static void hash_of(uint32_t id, uint8_t *h)
{
    for (uint32_t j = 0; j < HL; j++)
        h[j] = (uint8_t)(id * 97u + j * 13u + 5u);
}

static void bytes_of(uint32_t id, uint8_t *p)
{
    for (uint32_t k = 0; k < BB; k += 4) {
        uint32_t v = (id + 1) * 2246822519u ^ k * 3266489917u;
        memcpy(p + k, &v, 4);
    }
}

static void inst_open(uint32_t i)
{
    minst *m = &g_in[i];
    kvt_remote_config c;
    kvt_remote_config_init(&c);
    c.directory = g_sock;
    c.space = "model";
    c.instance = NAMES[i];
    c.listen_host = "127.0.0.1";
    c.credential = CRED;
    c.block_bytes = BB;
    c.hash_len = HL;
    c.region = m->region;
    c.n_slots = SLOTS;
    /* nothing dies here: the bounds guard against a hang, and no wait on a loaded machine may
     * turn a predicted hit into a miss (issue 36) */
    c.timeout_ms = 60000;
    c.directory_timeout_ms = 30000;
    c.ttl_ms = 60000;
    KVT_OK_(kvt_remote_create(&c, &m->r));
    for (uint32_t s = 0; s < SLOTS; s++)
        m->held[s] = -1, m->published[s] = m->scribbled[s] = false;
}

static void model_drop_owner(uint32_t i)
{
    for (uint32_t id = 0; id < IDS; id++)
        if (g_dirm[id].inst == (int)i)
            g_dirm[id].inst = -1;
}

static void withdraw(uint32_t i, uint32_t s)
{
    minst *m = &g_in[i];
    KVT_OK_(kvt_remote_withdraw(m->r, &s, 1));
    if (m->held[s] >= 0 && m->published[s]) {
        dentry *d = &g_dirm[m->held[s]];
        if (d->inst == (int)i && d->slot == s)
            d->inst = -1;
    }
    m->published[s] = false;
}

static void store(uint32_t i, uint32_t s, uint32_t id)
{
    minst *m = &g_in[i];
    if (m->held[s] >= 0)
        withdraw(i, s); /* before the slot is reused */
    bytes_of(id, m->region + (size_t)s * BB);
    uint8_t h[HL];
    hash_of(id, h);
    KVT_OK_(kvt_remote_publish(m->r, &s, h, 1));
    m->held[s] = (int)id;
    m->published[s] = true;
    m->scribbled[s] = false;
    g_dirm[id] = (dentry){(int)i, s};
}

/* expected hits of chain for instance i */
static uint32_t model_lookup(uint32_t i, const uint32_t *chain, uint32_t n)
{
    uint32_t k = 0;
    while (k < n && g_dirm[chain[k]].inst >= 0 && g_dirm[chain[k]].inst != (int)i)
        k++;
    return k;
}

static void check_lookup_and_read(uint32_t i, const uint32_t *chain, uint32_t n, uint64_t seed,
                                  uint64_t step, uint64_t *reads_ok, uint64_t *refused)
{
    uint8_t hashes[CHAIN * HL];
    kvt_remote_loc locs[CHAIN];
    for (uint32_t k = 0; k < n; k++)
        hash_of(chain[k], hashes + k * HL);
    uint32_t hit = 0;
    KVT_OK_(kvt_remote_lookup(g_in[i].r, hashes, n, locs, &hit));
    uint32_t want = model_lookup(i, chain, n);
    KVT_MODEL_CHECK("remote model", "step", step, seed, hit == want,
                    "instance %u: lookup found %u blocks, the model %u", i, hit, want);
    if (!hit)
        return;
    uint8_t *dst = malloc((size_t)hit * BB), *expect = malloc(BB);
    void *ptrs[CHAIN];
    int st[CHAIN];
    for (uint32_t k = 0; k < hit; k++) {
        ptrs[k] = dst + (size_t)k * BB;
        memset(ptrs[k], 0xa5, BB);
    }
    (void)kvt_remote_read(g_in[i].r, locs, hashes, hit, ptrs, st);
    for (uint32_t k = 0; k < hit; k++) {
        const dentry *d = &g_dirm[chain[k]];
        bool intact = !g_in[d->inst].scribbled[d->slot];
        if (st[k] == 0) {
            bytes_of(chain[k], expect);
            KVT_MODEL_CHECK("remote model", "step", step, seed, memcmp(expect, ptrs[k], BB) == 0,
                            "instance %u: block %u read wrong bytes", i, chain[k]);
            KVT_MODEL_CHECK("remote model", "step", step, seed, intact,
                            "instance %u: block %u served from a scribbled slot", i, chain[k]);
            (*reads_ok)++;
        } else {
            KVT_MODEL_CHECK("remote model", "step", step, seed, !intact,
                            "instance %u: intact block %u (owner %d slot %u) not read: %s", i,
                            chain[k], d->inst, d->slot, kvt_strerror(st[k]));
            (*refused)++;
        }
    }
    free(dst);
    free(expect);
}

static void remote_against_the_model(void **state)
{
    (void)state;
    NEED_REDIS();
    uint64_t seed = kvt_test_seed();
    uint64_t steps = (uint64_t)(4000 * kvt_test_scale());
    uint64_t rng = seed;
    for (uint32_t id = 0; id < IDS; id++)
        g_dirm[id].inst = -1;
    for (uint32_t i = 0; i < NI; i++) {
        g_in[i].region = calloc(SLOTS, BB);
        assert_non_null(g_in[i].region);
        inst_open(i);
    }
    uint64_t stores = 0, withdraws = 0, scribbles = 0, restarts = 0, lookups = 0;
    uint64_t reads_ok = 0, refused = 0;
    for (uint64_t step = 0; step < steps; step++) {
        uint32_t i = (uint32_t)kvt_test_below(&rng, NI);
        minst *m = &g_in[i];
        uint32_t s = 1 + (uint32_t)kvt_test_below(&rng, SLOTS - 1);
        uint32_t op = (uint32_t)kvt_test_below(&rng, 100);
        if (op < 45) {
            store(i, s, (uint32_t)kvt_test_below(&rng, IDS));
            stores++;
        } else if (op < 52) {
            withdraw(i, s);
            withdraws++;
        } else if (op < 55) {
            if (m->held[s] >= 0 && m->published[s]) {
                m->region[(size_t)s * BB + kvt_test_below(&rng, BB)] ^= 0x40;
                m->scribbled[s] = true;
                scribbles++;
            }
        } else if (op < 57) {
            kvt_remote_destroy(m->r);
            model_drop_owner(i);
            inst_open(i);
            restarts++;
        } else {
            uint32_t chain[CHAIN], n = 1 + (uint32_t)kvt_test_below(&rng, CHAIN);
            uint32_t start = (uint32_t)kvt_test_below(&rng, IDS);
            for (uint32_t k = 0; k < n; k++) /* mostly consecutive ids, sometimes a jump */
                chain[k] = kvt_test_below(&rng, 8) ? (start + k) % IDS
                                                   : (uint32_t)kvt_test_below(&rng, IDS);
            check_lookup_and_read(i, chain, n, seed, step, &reads_ok, &refused);
            lookups++;
        }
    }
    print_message("remote model: seed %llu, %llu steps: %llu stores, %llu withdraws, %llu "
                  "scribbles, %llu restarts, %llu lookups; %llu blocks read intact, %llu "
                  "refused (scribbled)\n",
                  (unsigned long long)seed, (unsigned long long)steps, (unsigned long long)stores,
                  (unsigned long long)withdraws, (unsigned long long)scribbles,
                  (unsigned long long)restarts, (unsigned long long)lookups,
                  (unsigned long long)reads_ok, (unsigned long long)refused);
    assert_true(reads_ok > 100);
    for (uint32_t i = 0; i < NI; i++) {
        kvt_remote_destroy(g_in[i].r);
        free(g_in[i].region);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(remote_against_the_model),
    };
    return kvt_test_exit(cmocka_run_group_tests(tests, group_setup, group_teardown));
}
