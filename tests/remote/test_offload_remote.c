/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The remote tier behind the offload manager (kvt_offload_attach_remote): two engine instances,
 * each a manager, a worker and a host mirror whose regions the instance's kvt_remote serves,
 * against a Redis the test starts. What one instance stored, the other finds in match, reads
 * into its host tier and loads to its GPU blocks: every byte checked. Evicted blocks are
 * withdrawn (a peer's lookup never names them), a block whose bytes changed is a miss and
 * ends the hit there, a reset withdraws everything, and an instance whose configuration does
 * not fit is refused. Replicas of a node tier take part as one host tier: what one read from a
 * remote owner the other loads from the node, what one stored a remote instance reads, and the
 * directory's round trip runs with the node's lock let go.
 */
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "port/remote_port.h"
#include "offload_inst.h"

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
    /* b stored none of them: it publishes nothing (a stays their owner) */
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

static void a_block_whose_bytes_changed_is_an_invalid_block(void **state)
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
    /* all 8 offered (the lookup cannot know); the worker's read of block 5 fails: the engine
     * gets it as an invalid block and recomputes from there */
    assert_int_equal(admit_and_check(&b, &q, "q", 6, 8), 5);
    assert_int_equal(g_invalid, 1);
    assert_int_equal(rstats(&b).read_stale, 1);
    assert_int_equal(ostats(&b).remote_hit_blocks, 8);
    assert_int_equal(ostats(&b).promotions_failed, 1);
    /* the other seven are b's host blocks now; block 5 never got a key */
    assert_true(sim_host_has(&b.s, &q, 4) && sim_host_has(&b.s, &q, 6));
    assert_false(sim_host_has(&b.s, &q, 5));
    /* the remote is the chain's last tier, with figures of its own under its name */
    uint32_t rt = kvt_offload_remote_tier(b.s.m);
    assert_int_equal(rt, 1);
    assert_int_equal(kvt_offload_num_tiers(b.s.m), 2);
    kvt_tier_stats ts;
    KVT_OK_(kvt_offload_get_tier_stats(b.s.m, rt, &ts));
    assert_string_equal(ts.name, "remote");
    assert_int_equal(ts.hit_blocks, 8);
    assert_int_equal(ts.hit_tokens, 8 * SIM_BS);
    assert_int_equal(ts.load_events, 1);
    assert_int_equal(ts.loads_failed, 1);
    assert_int_equal(ts.blocks, 0);
    char prom[1 << 16];
    size_t plen;
    KVT_OK_(kvt_offload_prometheus(b.s.m, prom, sizeof(prom), &plen));
    KVT_PROMTOOL_OK(prom);
    assert_non_null(strstr(prom, "kvtier_offload_tier_loads_failed_total{tier=\"remote\"} 1"));
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
    assert_true(kvt_offload_has_pending(a.s.m)); /* the worker withdraws with the next step */
    step(&a);
    assert_int_equal(rstats(&a).withdrawn, 6);
    assert_int_equal(admit_and_check(&b, &q, "q", 7, 6), 0);
    assert_int_equal(rstats(&b).hit_blocks, 0);
    inst_close(&b);
    inst_close(&a);
}

/* Issue 36: the owner destroys the remote tier before the manager it lent it to (finalizers
 * in no particular order): the destroy waits for the manager, whose own destroy withdraws
 * what it published and then finishes it. A peer then finds nothing. */
static void the_remote_tier_may_go_before_its_manager(void **state)
{
    (void)state;
    NEED_REDIS();
    inst a, b;
    inst_open(&a, "a");
    inst_open(&b, "b");
    sim_req p, q;
    compute_and_store(&a, &p, "p", 11, 4);
    kvt_remote_destroy(a.r); /* deferred: a's manager still holds it */
    a.r = NULL;              /* (inst_close's destroy of it is then a no-op) */
    inst_close(&a);          /* the manager withdraws, then completes the destroy */
    assert_int_equal(admit_and_check(&b, &q, "q", 11, 4), 0);
    inst_close(&b);
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
    kvt_offload_stats st;
    kvt_offload_get_stats(b.s.m, &st);
    assert_int_equal(st.remote_lookups_spared, 0);
    compute_and_store(&a, &p, "p", 9, 6);
    assert_int_equal(admit_and_check(&b, &q2, "q2", 9, 6), 0);
    assert_int_equal(rstats(&b).lookups, 1);
    kvt_offload_get_stats(b.s.m, &st);
    assert_true(st.remote_lookups_spared >= 1); /* the manager says what it spared */
    uint64_t spared = st.remote_lookups_spared;
    /* another span is looked up */
    assert_int_equal(admit_and_check(&b, &r1, "r1", 10, 6), 0);
    assert_int_equal(rstats(&b).lookups, 2);
    kvt_offload_get_stats(b.s.m, &st);
    assert_int_equal(st.remote_lookups_spared, spared);
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

/* The owner of a_stopped_owner_costs_one_bounded_miss, in a process of its own (exec'd, so
 * that no thread of the test's is forked): stores families 5 and 6, says so on fd 3, waits. */
static int owner_main(const char *space, const char *sock)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    snprintf(g_space, sizeof(g_space), "%s", space);
    snprintf(g_sock, sizeof(g_sock), "%s", sock);
    g_ttl_ms = 30000; /* alive in the directory while stopped, for as long as the case runs */
    inst a;
    inst_open(&a, "a");
    sim_req p5, p6;
    compute_and_store(&a, &p5, "p5", 5, 6);
    compute_and_store(&a, &p6, "p6", 6, 6);
    char c = 'r';
    if (write(3, &c, 1) != 1)
        return 3;
    for (;;)
        pause();
}

static void a_stopped_owner_costs_one_bounded_miss(void **state)
{
    (void)state;
    NEED_REDIS();
    g_miss_ms = 600000;
    g_timeout_ms = 300;
    int p2c[2];
    assert_int_equal(pipe(p2c), 0);
    pid_t own = fork();
    assert_true(own >= 0);
    if (own == 0) {
        dup2(p2c[1], 3);
        execl("/proc/self/exe", "test_offload_remote", "--owner", g_space, g_sock, (char *)NULL);
        _exit(127);
    }
    close(p2c[1]);
    char c;
    assert_int_equal(read(p2c[0], &c, 1), 1);
    close(p2c[0]);
    inst b;
    inst_open(&b, "b");
    sim_req q5, q6, q6b;
    assert_int_equal(admit_and_check(&b, &q5, "q5", 5, 6), 6); /* a serves */
    /* stopped (and seen stopped): the directory still names it; b's match offers the hit,
     * its worker's read fails within the timeout (the scheduler waits for nothing) and the
     * engine recomputes the prompt */
    kill(own, SIGSTOP);
    int ws;
    assert_int_equal(waitpid(own, &ws, WUNTRACED), own);
    assert_true(WIFSTOPPED(ws));
    assert_int_equal(admit_and_check(&b, &q6, "q6", 6, 6), 0);
    assert_int_equal(g_invalid, 6);
    assert_int_equal(rstats(&b).read_failed, 6);
    assert_int_equal(rstats(&b).lookups, 2);
    /* asked again: the directory still names it, but an owner whose reads failed is not read
     * from again for remote_miss_ms: no hit, no second read */
    assert_int_equal(admit_and_check(&b, &q6b, "q6b", 6, 6), 0);
    assert_int_equal(rstats(&b).reads, 2);
    assert_int_equal(rstats(&b).read_failed, 6);
    kill(own, SIGKILL);
    waitpid(own, NULL, 0);
    inst_close(&b);
}

static void configurations_that_do_not_fit_are_refused(void **state)
{
    (void)state;
    NEED_REDIS();
    inst a;
    sim_open(&a.s);
    sim_host_kv(GPU_NB, KV_BPB, &a.kv, &a.layout);
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

/* ---- a node tier beside the remote tier ----------------------------------------------------- */

static char g_node[40];
static int (*g_real_lookup)(kvt_remote *r, const uint8_t *hashes, uint32_t n, kvt_remote_loc *out,
                            uint32_t *n_hit);
static inst *g_storer; /* set: the next lookup through the wrapped port has it store first */
static uint32_t g_store_seed, g_store_blocks;

/* A lookup during which another replica of the node stores the prompt looked up: it takes the
 * node's lock for each of its calls, which it gets only if the looking replica let it go. */
static int lookup_while_a_peer_stores(kvt_remote *r, const uint8_t *hashes, uint32_t n,
                                      kvt_remote_loc *out, uint32_t *n_hit)
{
    inst *x = g_storer;
    g_storer = NULL;
    if (x) {
        sim_req p;
        compute_and_store(x, &p, "during", g_store_seed, g_store_blocks);
    }
    return g_real_lookup(r, hashes, n, out, n_hit);
}

static void replicas_of_a_node_tier_share_the_remote_tier(void **state)
{
    (void)state;
    NEED_REDIS();
    snprintf(g_node, sizeof(g_node), "tr-%d", (int)getpid());
    kvt_node_unlink(g_node);
    inst a0, a1, b;
    inst_open_on(&a0, "a0", 0, g_node, 0, 2);
    inst_open_on(&a1, "a1", 0, g_node, 1, 2);
    inst_open(&b, "b");
    sim_req p, q, q2, u, v, w;

    /* a0 reads what b stored, into its own slots of the node; a1 then loads it from the node,
     * reading nothing; neither publishes it (b owns it) */
    compute_and_store(&b, &p, "p", 3, 9);
    assert_int_equal(admit_and_check(&a0, &q, "q", 3, 9), 9);
    assert_int_equal(rstats(&a0).read_ok, 9);
    assert_int_equal(admit_and_check(&a1, &q2, "q2", 3, 9), 9);
    assert_int_equal(rstats(&a1).reads, 0);
    assert_int_equal(rstats(&a0).published + rstats(&a1).published, 0);
    for (uint32_t j = 0; j < 9; j++) {
        uint32_t s;
        assert_int_equal(kvt_pool_lookup(kvt_offload_host_pool(a1.s.m),
                                         p.hashes + j * KVT_BLOCK_HASH_LEN, 0, &s),
                         1);
        assert_true(s > 0 && s < HOST_NB); /* a0's slot */
    }

    /* what a1 stores in its own slots it publishes: b reads it from a1 */
    compute_and_store(&a1, &u, "u", 4, 8);
    assert_int_equal(rstats(&a1).published, 8);
    assert_int_equal(admit_and_check(&b, &v, "v", 4, 8), 8);
    assert_int_equal(rstats(&a1).served_blocks, 8);

    /* the lookup runs with the node's lock let go: a1 stores prompt 5 meanwhile (b stored it
     * first, so the directory names it), and a0 takes it from the node, not the directory —
     * its answer came back for a hit that had moved */
    sim_req bp, q3;
    compute_and_store(&b, &bp, "bp", 5, 6);
    kvi_remote_port *port = kvi_remote_port_of(a0.r);
    g_real_lookup = port->lookup;
    port->lookup = lookup_while_a_peer_stores;
    g_storer = &a1, g_store_seed = 5, g_store_blocks = 6;
    uint64_t reads = rstats(&a0).reads;
    assert_int_equal(admit_and_check(&a0, &q3, "q3", 5, 6), 6);
    port->lookup = g_real_lookup;
    assert_null(g_storer); /* it ran */
    assert_int_equal(rstats(&a0).reads, reads);
    kvt_tier_stats ts;
    KVT_OK_(kvt_offload_get_tier_stats(a0.s.m, kvt_offload_remote_tier(a0.s.m), &ts));
    assert_int_equal(ts.lookups_dropped, 1);
    static char prom[1 << 16];
    size_t plen;
    KVT_OK_(kvt_offload_prometheus(a0.s.m, prom, sizeof(prom), &plen));
    KVT_PROMTOOL_OK(prom);
    assert_non_null(strstr(prom, "kvtier_offload_tier_lookups_dropped_total{tier=\"remote\"} 1"));
    /* the node's and the remote's own families, from the tiers the manager was lent */
    char want[128];
    assert_non_null(strstr(prom, "\nkvtier_node_ranks_attached 2\n"));
    snprintf(want, sizeof(want), "\nkvtier_remote_read_ok_total %llu\n",
             (unsigned long long)rstats(&a0).read_ok);
    assert_non_null(strstr(prom, want));
    assert_non_null(strstr(prom, "# TYPE kvtier_remote_epoch gauge\n"));

    /* a0's reset withdraws its own slots from the node: a1 reads prompt 3 from b again */
    KVT_OK_(kvt_offload_reset(a0.s.m));
    step(&a0);
    KVT_OK_(kvt_pool_reset_prefix_cache(a1.s.gpu));
    reads = rstats(&a1).read_ok;
    assert_int_equal(admit_and_check(&a1, &w, "w", 3, 9), 9);
    assert_int_equal(rstats(&a1).read_ok, reads + 9);
    inst_close(&b);
    inst_close(&a1);
    inst_close(&a0);
    kvt_node_unlink(g_node);
}

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "--owner") == 0)
        return owner_main(argv[2], argv[3]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(a_second_instance_loads_what_the_first_stored, each_setup),
        cmocka_unit_test_setup(evicted_blocks_are_withdrawn_and_never_named, each_setup),
        cmocka_unit_test_setup(a_block_whose_bytes_changed_is_an_invalid_block, each_setup),
        cmocka_unit_test_setup(a_reset_withdraws_everything, each_setup),
        cmocka_unit_test_setup(the_remote_tier_may_go_before_its_manager, each_setup),
        cmocka_unit_test_setup(a_span_that_missed_is_not_looked_up_again_at_once, each_setup),
        cmocka_unit_test_setup(a_stopped_owner_costs_one_bounded_miss, each_setup),
        cmocka_unit_test_setup(configurations_that_do_not_fit_are_refused, each_setup),
        cmocka_unit_test_setup(replicas_of_a_node_tier_share_the_remote_tier, each_setup),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
