/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The remote tier behind the offload manager (kvt_offload_attach_remote): two engine instances,
 * each a manager, a worker and a host mirror whose regions the instance's kvt_remote serves,
 * against a Redis the test starts. What one instance stored, the other finds in match, reads
 * into its host tier and loads to its GPU blocks: every byte checked. Evicted blocks are
 * withdrawn (a peer's lookup never names them), a block whose bytes changed is a miss and
 * ends the hit there, a reset withdraws everything, and an instance whose configuration does
 * not fit is refused.
 */
#include <stdlib.h>

#include "redis_server.h"
#include "kvtier/remote.h"
#include "kvtier/worker.h"
#include "offload/sim.h"

#define GPU_NB  64
#define HOST_NB 24 /* null block included */
#define KV_BPB  2048
#define CRED    "a-shared-secret-of-the-space"

static char g_dir[64], g_sock[96], g_space[32];
static pid_t g_redis = -1;
static uint32_t g_miss_ms; /* the managers' remote_miss_ms: 0 (look up every time) unless a
                              case says otherwise */

static int group_setup(void **state)
{
    (void)state;
    snprintf(g_dir, sizeof(g_dir), "/tmp/kvt-oremote-XXXXXX");
    if (!mkdtemp(g_dir))
        return -1;
    snprintf(g_sock, sizeof(g_sock), "%s/redis.sock", g_dir);
    g_redis = kvt_redis_start(g_dir, g_sock, NULL);
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    kvt_redis_stop(g_redis, g_sock);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static int each_setup(void **state)
{
    (void)state;
    static int n;
    snprintf(g_space, sizeof(g_space), "o%d-%d", (int)getpid(), n++);
    g_miss_ms = 0;
    return 0;
}

#define NEED_REDIS()                                                                               \
    do {                                                                                           \
        if (g_redis <= 0)                                                                          \
            KVT_SKIP("redis-server could not be started (scripts/install-deps installs it)");      \
    } while (0)

static unsigned char kv_byte(uint64_t tag, uint32_t region, uint64_t off)
{
    uint64_t x = tag ^ ((uint64_t)region << 48) ^ off * 0x9E3779B97F4A7C15ull;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    return (unsigned char)(x >> 40);
}

/* One engine instance: its "GPU" (two regions of GPU_NB blocks in host memory), host mirror,
 * worker, manager and remote tier. */
typedef struct inst {
    sim s;
    unsigned char *kv;
    kvt_layout *layout;
    kvt_mirror *mirror;
    kvt_worker *w;
    kvt_remote *r;
} inst;

static int remote_open(inst *x, const char *name, uint32_t n_slots, uint32_t hash_len)
{
    kvt_remote_config c;
    kvt_remote_config_init(&c);
    c.directory = g_sock;
    c.space = g_space;
    c.instance = name;
    c.listen_host = "127.0.0.1";
    c.credential = CRED;
    c.regions = kvt_mirror_regions(x->mirror);
    c.n_regions = kvt_mirror_num_regions(x->mirror);
    c.n_slots = n_slots;
    c.hash_len = hash_len;
    c.hash_seed = SIM_SEED;
    c.ttl_ms = 600;
    c.retry_ms = 100;
    return kvt_remote_create(&c, &x->r);
}

/* sim_init with the manager's remote_miss_ms set */
static void sim_open(sim *s)
{
    kvt_pool_config pc;
    kvt_pool_config_init(&pc);
    pc.num_blocks = GPU_NB;
    pc.keys_per_block = 4;
    KVT_OK_(kvt_pool_create(&pc, &s->gpu));
    kvt_offload_config oc;
    kvt_offload_config_init(&oc);
    oc.host_blocks = HOST_NB;
    oc.remote_miss_ms = g_miss_ms;
    KVT_OK_(kvt_offload_create(&oc, s->gpu, &s->m));
    kvt_offload_meta_init(&s->meta);
    kvt_offload_worker_meta_init(&s->wm);
}

static void inst_open(inst *x, const char *name)
{
    sim_open(&x->s);
    x->kv = calloc(2 * GPU_NB, KV_BPB);
    assert_non_null(x->kv);
    KVT_OK_(kvt_layout_create(KVT_HOST_DEVICE, GPU_NB, &x->layout));
    kvt_kv_tensor kv = {KVT_HOST_DEVICE, (uint64_t)(uintptr_t)x->kv, 2ull * GPU_NB * KV_BPB, GPU_NB,
                        KV_BPB};
    KVT_OK_(kvt_layout_add_tensor(x->layout, &kv));
    kvt_mirror_config mc;
    kvt_mirror_config_init(&mc);
    mc.host_blocks = HOST_NB;
    KVT_OK_(kvt_mirror_create(&mc, x->layout, &x->mirror));
    assert_int_equal(kvt_mirror_num_regions(x->mirror), 2);
    kvt_worker_config wc;
    kvt_worker_config_init(&wc);
    wc.copy.threads = 1;
    KVT_OK_(kvt_worker_create(&wc, x->layout, x->mirror, &x->w));
    KVT_OK_(remote_open(x, name, HOST_NB, KVT_BLOCK_HASH_LEN));
    KVT_OK_(kvt_offload_attach_remote(x->s.m, x->r));
}

static void inst_close(inst *x)
{
    sim_fini(&x->s); /* withdraws what it published, before the remote and the mirror go */
    kvt_remote_destroy(x->r);
    kvt_worker_destroy(x->w);
    kvt_mirror_destroy(x->mirror);
    kvt_layout_destroy(x->layout);
    free(x->kv);
}

static uint64_t tag_of(const sim_req *q, uint32_t j)
{
    uint64_t t;
    memcpy(&t, q->hashes + j * KVT_BLOCK_HASH_LEN, 8);
    return t;
}

static unsigned char *dev_block(inst *x, uint32_t region, uint32_t b)
{
    return x->kv + ((size_t)region * GPU_NB + b) * KV_BPB;
}

/* One engine step after scheduling: metadata to the worker, copies to completion, reports
 * back (twice: a step without new events collects what finished). */
static void step(inst *x)
{
    sim *s = &x->s;
    sim_build(s, false);
    const kvt_str *fin;
    uint32_t n_fin;
    for (int round = 0; round < 2; round++) {
        KVT_OK_(kvt_worker_bind(x->w, &s->meta));
        KVT_OK_(kvt_worker_get_finished(x->w, NULL, &fin, &n_fin));
        KVT_OK_(kvt_worker_build_meta(x->w, &s->wm));
        KVT_OK_(kvt_offload_apply_output(s->m, fin, n_fin, &s->wm));
        kvt_worker_clear(x->w);
        KVT_OK_(kvt_worker_flush(x->w));
        if (round == 0)
            sim_build(s, false);
    }
}

/* x computes prompt p (n_blocks full blocks and a tail; its KV bytes tagged by block hash)
 * and stores it. */
static void compute_and_store(inst *x, sim_req *p, const char *id, uint32_t seed, uint32_t n_blocks)
{
    sim_req_make(p, id, n_blocks * SIM_BS + 5, seed, n_blocks * SIM_BS + 5, 0);
    sim_admit(&x->s, p, 0);
    for (uint32_t j = 0; j < n_blocks; j++)
        for (uint32_t reg = 0; reg < 2; reg++)
            for (uint32_t o = 0; o < KV_BPB; o++)
                dev_block(x, reg, p->blocks[j])[o] = kv_byte(tag_of(p, j), reg, o);
    sim_compute(&x->s, p, p->n_tokens);
    sim_schedule(&x->s, p, 1, false);
    step(x);
    sim_finish(&x->s, p);
}

/* y admits prompt `seed` (as q); returns the blocks of its hit, every loaded byte checked. */
static uint32_t admit_and_check(inst *y, sim_req *q, const char *id, uint32_t seed,
                                uint32_t n_blocks)
{
    sim_req_make(q, id, n_blocks * SIM_BS + 5, seed, n_blocks * SIM_BS + 5, 1);
    uint32_t hit = sim_admit(&y->s, q, UINT32_MAX);
    assert_int_equal(hit % SIM_BS, 0);
    step(y);
    for (uint32_t j = 0; j < hit / SIM_BS; j++)
        for (uint32_t reg = 0; reg < 2; reg++) {
            const unsigned char *d = dev_block(y, reg, q->blocks[j]);
            for (uint32_t o = 0; o < KV_BPB; o++)
                if (d[o] != kv_byte(tag_of(q, j), reg, o))
                    fail_msg("%s: block %u region %u byte %u differs", id, j, reg, o);
        }
    sim_finish(&y->s, q);
    return hit / SIM_BS;
}

static kvt_remote_stats rstats(inst *x)
{
    kvt_remote_stats st;
    kvt_remote_get_stats(x->r, &st);
    return st;
}

static kvt_offload_stats ostats(inst *x)
{
    kvt_offload_stats st;
    kvt_offload_get_stats(x->s.m, &st);
    return st;
}

static void a_second_instance_loads_what_the_first_stored(void **state)
{
    (void)state;
    NEED_REDIS();
    inst a, b;
    inst_open(&a, "a");
    inst_open(&b, "b");
    sim_req p, q, q2;
    compute_and_store(&a, &p, "p", 3, 9);
    assert_int_equal(rstats(&a).published, 9);
    /* b has nothing of it: all 9 blocks come from a, checked byte for byte on b's GPU */
    assert_int_equal(admit_and_check(&b, &q, "q", 3, 9), 9);
    assert_int_equal(ostats(&b).remote_hit_blocks, 9);
    assert_int_equal(rstats(&b).read_ok, 9);
    assert_int_equal(rstats(&a).served_blocks, 9);
    /* they are b's host blocks now: the next request hits there, no read */
    assert_int_equal(admit_and_check(&b, &q2, "q2", 3, 9), 9);
    assert_int_equal(rstats(&b).reads, 1);
    /* a longer prompt on a: its own host tier has the first 9; nothing of b's is published
     * back (b stored none of them) */
    assert_int_equal(rstats(&b).published, 0);
    inst_close(&b);
    inst_close(&a);
}

static void evicted_blocks_are_withdrawn_and_never_named(void **state)
{
    (void)state;
    NEED_REDIS();
    inst a, b;
    inst_open(&a, "a");
    inst_open(&b, "b");
    sim_req p1, p2, q;
    compute_and_store(&a, &p1, "p1", 4, 12);
    compute_and_store(&a, &p2, "p2", 5, 16); /* 28 blocks through 23 host slots: p1 evicted */
    kvt_remote_stats sa = rstats(&a);
    assert_true(sa.withdrawn >= 5);
    /* b's lookup of p1 stops where a no longer holds it: no entry it names is stale */
    uint32_t got = admit_and_check(&b, &q, "q", 4, 12);
    assert_true(got < 12);
    assert_int_equal(rstats(&b).read_stale, 0);
    assert_int_equal(rstats(&b).read_ok, got);
    sim_req q2;
    assert_int_equal(admit_and_check(&b, &q2, "q2", 5, 16), 16);
    inst_close(&b);
    inst_close(&a);
}

static void a_block_whose_bytes_changed_ends_the_hit_there(void **state)
{
    (void)state;
    NEED_REDIS();
    inst a, b;
    inst_open(&a, "a");
    inst_open(&b, "b");
    sim_req p, q;
    compute_and_store(&a, &p, "p", 6, 8);
    /* scribble over the host copy of block 5 (a store gone wrong): the owner refuses it */
    uint32_t h5;
    assert_int_equal(
        kvt_pool_lookup(kvt_offload_host_pool(a.s.m), p.hashes + 5 * KVT_BLOCK_HASH_LEN, 0, &h5),
        1);
    const kvt_region *reg = kvt_mirror_regions(a.mirror);
    ((unsigned char *)(uintptr_t)reg[1].base)[(size_t)h5 * reg[1].block_bytes + 17] ^= 0x40;
    assert_int_equal(admit_and_check(&b, &q, "q", 6, 8), 5);
    assert_int_equal(rstats(&b).read_stale, 1);
    assert_int_equal(ostats(&b).remote_hit_blocks, 5);
    inst_close(&b);
    inst_close(&a);
}

static void a_reset_withdraws_everything(void **state)
{
    (void)state;
    NEED_REDIS();
    inst a, b;
    inst_open(&a, "a");
    inst_open(&b, "b");
    sim_req p, q;
    compute_and_store(&a, &p, "p", 7, 6);
    KVT_OK_(kvt_offload_reset(a.s.m));
    assert_int_equal(rstats(&a).withdrawn, 6);
    assert_int_equal(admit_and_check(&b, &q, "q", 7, 6), 0);
    assert_int_equal(rstats(&b).hit_blocks, 0);
    inst_close(&b);
    inst_close(&a);
}

static void a_span_that_missed_is_not_looked_up_again_at_once(void **state)
{
    (void)state;
    NEED_REDIS();
    g_miss_ms = 600000; /* far longer than this case */
    inst a, b;
    inst_open(&a, "a");
    inst_open(&b, "b");
    sim_req p, q1, q2, r1;
    /* b asks for a prompt nobody holds: one lookup; asked again (a waiting request matched
     * every step), none, even though a has stored it meanwhile */
    assert_int_equal(admit_and_check(&b, &q1, "q1", 9, 6), 0);
    assert_int_equal(rstats(&b).lookups, 1);
    compute_and_store(&a, &p, "p", 9, 6);
    assert_int_equal(admit_and_check(&b, &q2, "q2", 9, 6), 0);
    assert_int_equal(rstats(&b).lookups, 1);
    /* another span is looked up */
    assert_int_equal(admit_and_check(&b, &r1, "r1", 10, 6), 0);
    assert_int_equal(rstats(&b).lookups, 2);
    inst_close(&b);
    /* with a window of 1 ms, the same span is looked up again once it passed */
    g_miss_ms = 1;
    inst_open(&b, "b");
    sim_req p2, q4, q5;
    assert_int_equal(admit_and_check(&b, &q4, "q4", 12, 5), 0);
    compute_and_store(&a, &p2, "p2", 12, 5);
    struct timespec ts = {0, 20 * 1000000L};
    nanosleep(&ts, NULL);
    assert_int_equal(admit_and_check(&b, &q5, "q5", 12, 5), 5);
    assert_int_equal(rstats(&b).lookups, 2);
    inst_close(&b);
    inst_close(&a);
}

static void configurations_that_do_not_fit_are_refused(void **state)
{
    (void)state;
    NEED_REDIS();
    inst a;
    sim_open(&a.s);
    a.kv = calloc(2 * GPU_NB, KV_BPB);
    assert_non_null(a.kv);
    KVT_OK_(kvt_layout_create(KVT_HOST_DEVICE, GPU_NB, &a.layout));
    kvt_kv_tensor kv = {KVT_HOST_DEVICE, (uint64_t)(uintptr_t)a.kv, 2ull * GPU_NB * KV_BPB, GPU_NB,
                        KV_BPB};
    KVT_OK_(kvt_layout_add_tensor(a.layout, &kv));
    kvt_mirror_config mc;
    kvt_mirror_config_init(&mc);
    mc.host_blocks = HOST_NB;
    KVT_OK_(kvt_mirror_create(&mc, a.layout, &a.mirror));
    a.w = NULL;
    /* slots that are not the host blocks */
    KVT_OK_(remote_open(&a, "a", HOST_NB - 1, KVT_BLOCK_HASH_LEN));
    KVT_ERR_(kvt_offload_attach_remote(a.s.m, a.r), KVT_EINVAL);
    kvt_remote_destroy(a.r);
    /* another hash length */
    KVT_OK_(remote_open(&a, "a", HOST_NB, 8));
    KVT_ERR_(kvt_offload_attach_remote(a.s.m, a.r), KVT_EINVAL);
    kvt_remote_destroy(a.r);
    KVT_OK_(remote_open(&a, "a", HOST_NB, KVT_BLOCK_HASH_LEN));
    KVT_OK_(kvt_offload_attach_remote(a.s.m, a.r));
    KVT_ERR_(kvt_offload_attach_remote(a.s.m, a.r), KVT_ESTATE);
    KVT_ERR_(kvt_offload_attach_remote(a.s.m, NULL), KVT_EINVAL);
    sim_fini(&a.s);
    kvt_remote_destroy(a.r);
    kvt_mirror_destroy(a.mirror);
    kvt_layout_destroy(a.layout);
    free(a.kv);
}

int main(int argc, char **argv)
{
    (void)argc, (void)argv;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(a_second_instance_loads_what_the_first_stored, each_setup),
        cmocka_unit_test_setup(evicted_blocks_are_withdrawn_and_never_named, each_setup),
        cmocka_unit_test_setup(a_block_whose_bytes_changed_ends_the_hit_there, each_setup),
        cmocka_unit_test_setup(a_reset_withdraws_everything, each_setup),
        cmocka_unit_test_setup(a_span_that_missed_is_not_looked_up_again_at_once, each_setup),
        cmocka_unit_test_setup(configurations_that_do_not_fit_are_refused, each_setup),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
