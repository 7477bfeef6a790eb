/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The node tier: a host tier shared by the replicas on one node (kvtier/node.h).
 *
 * Each replica here is what an engine has: a GPU pool and an offload manager on the scheduler
 * side (tests/offload/sim.h), attached to the node tier as one rank. The byte test adds each
 * replica's worker (CPU copy backend, "device" memory in host RAM) whose mirror is the node's
 * shared data region, and checks every byte a replica loads from a peer's slot. Dead peers are
 * real processes killed with SIGKILL: their pins must be released and their slots withdrawn,
 * and a holder that dies inside the metadata lock must leave a lock the next caller repairs.
 */
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>

#include "kvt_test.h"
#include "base/shm.h"
#include "kvtier/disk.h"
#include "node/node_internal.h"
#include "offload/sim.h"

#define BPR    24 /* slots per replica, its unused first one included */
#define RANKS  3
#define GPU_NB 64
#define SLOTS  (BPR * RANKS)

static char g_name[40];

static int setup(void **state)
{
    static unsigned n;
    (void)state;
    snprintf(g_name, sizeof(g_name), "test-%d-%u", (int)getpid(), n++);
    kvt_node_unlink(g_name);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    kvt_node_unlink(g_name);
    return 0;
}

static void node_cfg(kvt_node_config *c, uint32_t rank)
{
    kvt_node_config_init(c);
    c->name = g_name;
    c->rank = rank;
    c->ranks = RANKS;
    c->blocks_per_rank = BPR;
    c->hash_len = KVT_BLOCK_HASH_LEN;
    c->keys_per_block = 4; /* sim's GPU pool, which the host pool copies */
    c->hash_seed = SIM_SEED;
    c->reap_interval_ms = 0; /* the tests reap when they mean to */
}

typedef struct replica {
    kvt_node *node;
    sim s;
} replica;

static void replica_open(replica *r, uint32_t rank)
{
    kvt_node_config c;
    node_cfg(&c, rank);
    KVT_OK_(kvt_node_attach(&c, &r->node));
    sim_init(&r->s, GPU_NB, kvt_node_num_slots(r->node), false, 1, 8192);
    KVT_OK_(kvt_offload_attach_node(r->s.m, r->node));
}

static void replica_close(replica *r)
{
    sim_fini(&r->s);
    kvt_node_detach(r->node);
}

static kvt_node_stats stats_of(replica *r)
{
    kvt_node_stats st;
    KVT_OK_(kvt_node_get_stats(r->node, &st));
    return st;
}

static bool in_range(uint32_t b, uint32_t rank)
{
    return b > rank * BPR && b < (rank + 1) * BPR;
}

static void config_mismatches_are_refused_with_the_field_named(void **state)
{
    (void)state;
    kvt_node *a = NULL, *b = NULL;
    kvt_node_config c;
    node_cfg(&c, 0);
    KVT_OK_(kvt_node_attach(&c, &a));
    assert_int_equal(kvt_node_num_slots(a), SLOTS);

    node_cfg(&c, 1);
    c.hash_seed = SIM_SEED + 1;
    KVT_ERR_(kvt_node_attach(&c, &b), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "hash seed"));
    assert_null(b);
    node_cfg(&c, 1);
    c.blocks_per_rank = BPR + 1;
    KVT_ERR_(kvt_node_attach(&c, &b), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "blocks_per_rank"));
    node_cfg(&c, 1);
    c.block_bytes = 4096;
    KVT_ERR_(kvt_node_attach(&c, &b), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "block bytes"));
    node_cfg(&c, 1);
    c.signature[5] = 1;
    KVT_ERR_(kvt_node_attach(&c, &b), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "signature"));
    /* the same rank twice, while its first attachment lives */
    node_cfg(&c, 0);
    KVT_ERR_(kvt_node_attach(&c, &b), KVT_EBUSY);
    assert_non_null(strstr(kvt_last_error(), "live process"));
    /* bad configurations */
    node_cfg(&c, 1);
    c.name = "a/b";
    KVT_ERR_(kvt_node_attach(&c, &b), KVT_EINVAL);
    node_cfg(&c, RANKS);
    KVT_ERR_(kvt_node_attach(&c, &b), KVT_ERANGE);
    node_cfg(&c, 1);
    c.reserved[2] = 1;
    KVT_ERR_(kvt_node_attach(&c, &b), KVT_EINVAL);

    /* a manager whose host tier is not the node's size, or lazy, is refused */
    sim s;
    sim_init(&s, GPU_NB, SLOTS - 1, false, 1, 8192);
    KVT_ERR_(kvt_offload_attach_node(s.m, a), KVT_EINVAL);
    sim_fini(&s);
    sim_init(&s, GPU_NB, SLOTS, true, 1, 8192);
    KVT_ERR_(kvt_offload_attach_node(s.m, a), KVT_EINVAL);
    sim_fini(&s);

    /* once rank 0 detached the tier is gone: another configuration creates a new one */
    kvt_node_detach(a);
    node_cfg(&c, 1);
    c.hash_seed = 99;
    KVT_OK_(kvt_node_attach(&c, &b));
    kvt_node_detach(b);
}

static void a_replica_hits_what_a_peer_stored(void **state)
{
    (void)state;
    replica a, b;
    replica_open(&a, 0);
    replica_open(&b, 1);
    sim_req p;
    sim_req_make(&p, "p", 10 * SIM_BS + 3, 1, 10 * SIM_BS + 3, 0);
    sim_store_prompt(&a.s, &p, 1);
    assert_int_equal(stats_of(&a).published, 10);

    /* b finds all ten blocks in a's slots and loads them */
    sim_req q;
    sim_req_make(&q, "q", 10 * SIM_BS + 3, 1, 10 * SIM_BS + 3, 1);
    uint32_t hit = sim_admit(&b.s, &q, UINT32_MAX);
    assert_int_equal(hit, 10 * SIM_BS);
    sim_build(&b.s, false);
    assert_int_equal(b.s.meta.n_loads, 10);
    for (uint32_t i = 0; i < b.s.meta.n_loads; i++)
        assert_true(in_range(b.s.meta.load_cpu_blocks[i], 0));
    /* a's slots are pinned by b while the load runs, and a knows it */
    assert_int_equal(stats_of(&b).pinned_of_peers, 10);
    assert_int_equal(stats_of(&a).peer_pinned, 10);
    assert_int_equal(kvt_pool_num_free(kvt_offload_host_pool(a.s.m)), BPR - 1 - 10);
    sim_report_load(&b.s, &q);
    assert_int_equal(stats_of(&b).pinned_of_peers, 0);
    assert_int_equal(stats_of(&a).peer_pinned, 0);
    assert_int_equal(kvt_pool_num_free(kvt_offload_host_pool(a.s.m)), BPR - 1);

    /* b does not store again what a holds: its eager stores skip the cached blocks */
    sim_compute(&b.s, &q, q.n_tokens);
    sim_schedule(&b.s, &q, 1, false);
    sim_build(&b.s, false);
    assert_int_equal(b.s.meta.n_stores, 0);
    sim_finish(&b.s, &q);
    assert_int_equal(stats_of(&b).published, 0);

    /* a third replica attached later sees a's blocks too */
    replica c;
    replica_open(&c, 2);
    assert_true(sim_host_has(&c.s, &p, 0));
    assert_true(sim_host_has(&c.s, &p, 9));
    replica_close(&c);
    /* a's manager gone: its blocks are withdrawn */
    replica_close(&a);
    assert_int_equal(stats_of(&b).ranks_attached, 1);
    assert_false(sim_host_has(&b.s, &p, 0));
    replica_close(&b);
}

static void a_pinned_slot_is_never_reused_by_its_owner(void **state)
{
    (void)state;
    replica a, b;
    replica_open(&a, 0);
    replica_open(&b, 1);
    sim_req p;
    sim_req_make(&p, "p", 6 * SIM_BS, 1, 6 * SIM_BS, 0);
    sim_store_prompt(&a.s, &p, 1);
    sim_req q;
    sim_req_make(&q, "q", 6 * SIM_BS + 1, 1, 6 * SIM_BS + 1, 1);
    assert_int_equal(sim_admit(&b.s, &q, UINT32_MAX), 6 * SIM_BS);
    sim_build(&b.s, false);
    uint32_t pinned[8], np = b.s.meta.n_loads;
    assert_int_equal(np, 6);
    memcpy(pinned, b.s.meta.load_cpu_blocks, np * sizeof(uint32_t));

    /* a churns its whole tier several times over; never into a slot b reads */
    for (uint32_t k = 0; k < 12; k++) {
        sim_req o;
        char id[16];
        snprintf(id, sizeof(id), "o%u", k);
        sim_req_make(&o, id, 8 * SIM_BS, 100 + k, 8 * SIM_BS, 0);
        sim_admit(&a.s, &o, 0);
        sim_compute(&a.s, &o, o.n_tokens);
        sim_schedule(&a.s, &o, 1, false);
        sim_build(&a.s, false);
        for (uint32_t i = 0; i < a.s.meta.n_stores; i++) {
            assert_true(in_range(a.s.meta.store_cpu_blocks[i], 0));
            for (uint32_t j = 0; j < np; j++)
                assert_int_not_equal(a.s.meta.store_cpu_blocks[i], pinned[j]);
        }
        if (a.s.meta.store_event != KVT_NO_EVENT)
            sim_report_store(&a.s, a.s.meta.store_event, 1);
        sim_finish(&a.s, &o);
    }
    /* p's blocks b pins are still published and still p's */
    assert_true(sim_host_has(&b.s, &p, 0) && sim_host_has(&b.s, &p, 5));
    sim_report_load(&b.s, &q);
    sim_finish(&b.s, &q);
    assert_int_equal(stats_of(&a).peer_pinned, 0);
    /* released: they are a's again to reuse */
    assert_int_equal(kvt_pool_num_free(kvt_offload_host_pool(a.s.m)), BPR - 1);
    replica_close(&b);
    replica_close(&a);
}

/* ---- dead peers ------------------------------------------------------------------------- */

/* The child's side: replica `rank` that pins p's blocks (a load it never finishes) or stores
 * prompt `own` (seed 7) and then reports on fd and waits to be killed. Exit codes name the
 * step that failed. */
static int child_replica(uint32_t rank, bool pin, int fd)
{
    kvt_node_config c;
    node_cfg(&c, rank);
    kvt_node *n;
    if (kvt_node_attach(&c, &n))
        return 10;
    kvt_pool_config pc;
    kvt_pool_config_init(&pc);
    pc.num_blocks = GPU_NB;
    pc.keys_per_block = 4;
    kvt_pool *gpu;
    kvt_offload *m;
    kvt_offload_config oc;
    kvt_offload_config_init(&oc);
    oc.host_blocks = kvt_node_num_slots(n);
    if (kvt_pool_create(&pc, &gpu) || kvt_offload_create(&oc, gpu, &m) ||
        kvt_offload_attach_node(m, n))
        return 11;
    sim_req r;
    sim_req_make(&r, "c", 6 * SIM_BS + 1, pin ? 1 : 7, 6 * SIM_BS + 1, 3);
    uint32_t hit = 0;
    if (kvt_offload_match(m, "c", 1, r.hashes, r.n_hashes, r.n_tokens, 0, &hit))
        return 12;
    if (pin && hit != 6 * SIM_BS)
        return 13;
    if (!pin) {
        /* store r's six blocks: allocate, schedule, report */
        uint32_t blocks[8];
        if (kvt_pool_alloc(gpu, 7, blocks))
            return 14;
        for (uint32_t i = 0; i < 6; i++)
            if (kvt_pool_insert(gpu, blocks[i], r.hashes + i * KVT_BLOCK_HASH_LEN, 0, SIM_BS))
                return 15;
        const uint32_t *tab[1] = {blocks};
        uint32_t nb[1] = {7};
        kvt_offload_meta meta;
        kvt_offload_meta_init(&meta);
        kvt_offload_worker_meta wm;
        kvt_offload_worker_meta_init(&wm);
        if (kvt_offload_after_alloc(m, "c", 1, tab, nb, 0) ||
            kvt_offload_schedule(m, "c", 1, tab, nb, 6 * SIM_BS, 1, false) ||
            kvt_offload_build_meta(m, false, &meta) || meta.n_stores != 6 ||
            kvt_offload_worker_meta_add(&wm, meta.store_event, 1) ||
            kvt_offload_apply_output(m, NULL, 0, &wm))
            return 16;
    } else {
        uint32_t blocks[8];
        if (kvt_pool_alloc(gpu, 7, blocks))
            return 14;
        const uint32_t *tab[1] = {blocks};
        uint32_t nb[1] = {7};
        if (kvt_offload_after_alloc(m, "c", 1, tab, nb, hit))
            return 17;
    }
    if (write(fd, "k", 1) != 1)
        return 18;
    for (;;)
        pause();
}

static pid_t spawn_replica(uint32_t rank, bool pin)
{
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* a failing test leaves no process behind */
        close(fds[0]);
        _exit(child_replica(rank, pin, fds[1]));
    }
    close(fds[1]);
    char c;
    ssize_t got = read(fds[0], &c, 1);
    close(fds[0]);
    if (got != 1) {
        int status;
        waitpid(pid, &status, 0);
        fail_msg("replica %u's process failed before it was ready (exit %d)", rank,
                 WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    }
    return pid;
}

static void kill_replica(pid_t pid)
{
    int status;
    kill(pid, SIGKILL);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status));
}

static void a_killed_replica_leaves_no_pinned_slot_behind(void **state)
{
    (void)state;
    replica a;
    replica_open(&a, 0);
    sim_req p;
    sim_req_make(&p, "p", 6 * SIM_BS + 1, 1, 6 * SIM_BS + 1, 0);
    sim_store_prompt(&a.s, &p, 1);
    pid_t pid = spawn_replica(1, true);
    kvt_node_stats st = stats_of(&a);
    assert_int_equal(st.peer_pinned, 6);
    assert_int_equal(st.ranks_attached, 2);
    assert_int_equal(kvt_pool_num_free(kvt_offload_host_pool(a.s.m)), BPR - 1 - 6);
    /* alive: nothing to reap */
    assert_int_equal(kvt_node_reap(a.node), 0);
    kill_replica(pid);
    assert_int_equal(kvt_node_reap(a.node), 1);
    st = stats_of(&a);
    assert_int_equal(st.peer_pinned, 0);
    assert_int_equal(st.ranks_attached, 1);
    assert_int_equal(st.reaped, 1);
    assert_int_equal(kvt_pool_num_free(kvt_offload_host_pool(a.s.m)), BPR - 1);
    /* rank 1 can come back: a new epoch, empty */
    replica b;
    replica_open(&b, 1);
    assert_true(stats_of(&b).epoch > st.epoch);
    assert_int_equal(stats_of(&b).published, 0);
    assert_true(sim_host_has(&b.s, &p, 0));
    replica_close(&b);
    replica_close(&a);
}

static void a_restarted_replica_is_not_consulted_for_old_entries(void **state)
{
    (void)state;
    replica a;
    replica_open(&a, 0);
    pid_t pid = spawn_replica(2, false); /* stores prompt seed 7 in rank 2's slots */
    sim_req r;
    sim_req_make(&r, "r", 6 * SIM_BS + 1, 7, 6 * SIM_BS + 1, 3);
    (void)stats_of(&a); /* a locked call brings a's view up to date */
    for (uint32_t i = 0; i < 6; i++)
        assert_true(sim_host_has(&a.s, &r, i));
    uint32_t b;
    assert_int_equal(kvt_pool_lookup(kvt_offload_host_pool(a.s.m), r.hashes, 0, &b), 1);
    assert_true(in_range(b, 2));
    kill_replica(pid);
    /* a finds the death on its own, in its next locked call after the interval */
    kvt_node_stats st = stats_of(&a);
    assert_int_equal(st.ranks_attached, 2); /* not reaped yet: no interval with 0 */
    assert_int_equal(kvt_node_reap(a.node), 1);
    for (uint32_t i = 0; i < 6; i++)
        assert_false(sim_host_has(&a.s, &r, i));
    /* a match finds nothing of the dead replica's */
    sim_req q;
    sim_req_make(&q, "q", 6 * SIM_BS + 1, 7, 6 * SIM_BS + 1, 4);
    assert_int_equal(sim_admit(&a.s, &q, UINT32_MAX), 0);
    sim_finish(&a.s, &q);
    replica_close(&a);
}

static void a_tier_left_by_dead_replicas_is_replaced_not_refused(void **state)
{
    (void)state;
    pid_t pid = spawn_replica(1, false); /* creates the tier (seed SIM_SEED) and stores */
    kvt_node_config c;
    node_cfg(&c, 0);
    c.hash_seed = 99;
    kvt_node *n = NULL;
    KVT_ERR_(kvt_node_attach(&c, &n), KVT_EINVAL); /* its creator lives: refused */
    assert_non_null(strstr(kvt_last_error(), "hash seed"));
    kill_replica(pid); /* now no one uses it: another configuration takes the name */
    KVT_OK_(kvt_node_attach(&c, &n));
    kvt_node_stats st;
    KVT_OK_(kvt_node_get_stats(n, &st));
    assert_int_equal(st.ranks_attached, 1);
    assert_int_equal(st.epoch, 1); /* a new tier */
    kvt_node_detach(n);
}

static void a_holder_dying_inside_the_lock_is_repaired(void **state)
{
    (void)state;
    replica a;
    replica_open(&a, 0);
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        kvt_node_config c;
        node_cfg(&c, 1);
        kvt_node *n;
        if (kvt_node_attach(&c, &n) || kvi_node_lock(n))
            _exit(10);
        _exit(write(fds[1], "k", 1) == 1 ? 0 : 11); /* dies holding the lock */
    }
    close(fds[1]);
    char ch;
    assert_int_equal(read(fds[0], &ch, 1), 1);
    close(fds[0]);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    kvt_node_stats st = stats_of(&a); /* would hang on a lock nobody releases */
    assert_int_equal(st.lock_recoveries, 1);
    assert_int_equal(st.ranks_attached, 1); /* the holder was reaped */
    assert_true(st.full_rescans >= 2);      /* bind, then the repair */
    /* the tier works on */
    sim_req p;
    sim_req_make(&p, "p", 3 * SIM_BS, 1, 3 * SIM_BS, 0);
    sim_store_prompt(&a.s, &p, 1);
    assert_int_equal(stats_of(&a).published, 3);
    replica_close(&a);
}

static void a_stopped_holder_makes_calls_fail_not_hang(void **state)
{
    (void)state;
    kvt_node_config c;
    node_cfg(&c, 0);
    c.lock_timeout_ms = 200;
    replica a;
    KVT_OK_(kvt_node_attach(&c, &a.node));
    sim_init(&a.s, GPU_NB, kvt_node_num_slots(a.node), false, 1, 8192);
    KVT_OK_(kvt_offload_attach_node(a.s.m, a.node));
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        kvt_node_config cc;
        node_cfg(&cc, 1);
        kvt_node *n;
        if (kvt_node_attach(&cc, &n) || kvi_node_lock(n) || write(fds[1], "k", 1) != 1)
            _exit(10);
        for (;;)
            pause(); /* holds the lock, alive */
    }
    close(fds[1]);
    char ch;
    assert_int_equal(read(fds[0], &ch, 1), 1);
    close(fds[0]);
    kvt_node_stats st;
    KVT_ERR_(kvt_node_get_stats(a.node, &st), KVT_EBUSY);
    assert_non_null(strstr(kvt_last_error(), "is it stopped"));
    uint32_t hit = 1;
    sim_req p;
    sim_req_make(&p, "p", 3 * SIM_BS, 1, 3 * SIM_BS, 0);
    KVT_ERR_(kvt_offload_match(a.s.m, "p", 1, p.hashes, p.n_hashes, p.n_tokens, 0, &hit),
             KVT_EBUSY);
    kill_replica(pid); /* the kernel hands the lock over; the next call repairs */
    st = stats_of(&a);
    assert_int_equal(st.lock_recoveries, 1);
    assert_int_equal(st.ranks_attached, 1);
    sim_store_prompt(&a.s, &p, 1);
    assert_int_equal(stats_of(&a).published, 3);
    replica_close(&a);
}

/* ---- bytes through the shared data region ----------------------------------------------- */

#define KV_BPB 2048

typedef struct wrep {
    replica r;
    unsigned char *kv; /* "device": 2 regions of GPU_NB blocks */
    kvt_layout *layout;
    kvt_mirror *mirror;
    kvt_worker *w;
} wrep;

static void wrep_open(wrep *x, uint32_t rank)
{
    replica_open(&x->r, rank);
    sim_host_kv(GPU_NB, KV_BPB, &x->kv, &x->layout);
    kvt_mirror_config mc;
    kvt_mirror_config_init(&mc);
    mc.host_blocks = kvt_node_num_slots(x->r.node);
    mc.node_name = g_name;
    KVT_OK_(kvt_mirror_create(&mc, x->layout, &x->mirror));
    kvt_worker_config wc;
    kvt_worker_config_init(&wc);
    wc.copy.threads = 1;
    KVT_OK_(kvt_worker_create(&wc, x->layout, x->mirror, &x->w));
}

static void wrep_close(wrep *x)
{
    kvt_worker_destroy(x->w);
    kvt_mirror_destroy(x->mirror);
    kvt_layout_destroy(x->layout);
    free(x->kv);
    replica_close(&x->r);
}

/* One engine step of replica x after its scheduling: the manager's metadata to the worker,
 * the copies run to completion, the reports back. */
static void wrep_step(wrep *x)
{
    sim_worker_step(&x->r.s, x->w);
}

static void loaded_bytes_come_from_the_peer_that_stored_them(void **state)
{
    (void)state;
    wrep a, b;
    wrep_open(&a, 0);
    wrep_open(&b, 1);
    /* a computes a 9-block prompt (its bytes tagged by the block hash) and stores it */
    sim_req p;
    sim_req_make(&p, "p", 9 * SIM_BS + 5, 3, 9 * SIM_BS + 5, 0);
    sim_admit(&a.r.s, &p, 0);
    sim_kv_write(a.kv, GPU_NB, KV_BPB, &p, 9);
    sim_compute(&a.r.s, &p, p.n_tokens);
    sim_schedule(&a.r.s, &p, 1, false);
    wrep_step(&a);
    sim_finish(&a.r.s, &p);
    assert_int_equal(stats_of(&a.r).published, 9);

    /* b loads them into its own GPU blocks, from a's slots */
    sim_req q;
    sim_req_make(&q, "q", 9 * SIM_BS + 5, 3, 9 * SIM_BS + 5, 1);
    assert_int_equal(sim_admit(&b.r.s, &q, UINT32_MAX), 9 * SIM_BS);
    wrep_step(&b);
    assert_int_equal(stats_of(&b.r).pinned_of_peers, 0); /* the load finished */
    sim_kv_expect(b.kv, GPU_NB, KV_BPB, &q, 9, "peer");
    sim_finish(&b.r.s, &q);
    wrep_close(&b);
    wrep_close(&a);
}

/* Computes prompt p on replica x (bytes tagged by each block's hash), stores it and lets
 * every transfer it causes land. */
static void wrep_store(wrep *x, sim_req *p)
{
    sim_admit(&x->r.s, p, 0);
    sim_kv_write(x->kv, GPU_NB, KV_BPB, p, p->n_tokens / SIM_BS);
    sim_compute(&x->r.s, p, p->n_tokens);
    sim_schedule(&x->r.s, p, 1, false);
    wrep_step(x);
    sim_finish(&x->r.s, p);
    wrep_step(x);
}

/* Issue 41: a node tier with a disk behind it. The replica's stores are written back into its
 * own disk; once its own slots let a prompt go, a request finds it on that disk, promotes it
 * into the replica's own slots, and the peers find it there again (published): every byte
 * checked on both replicas. */
static void a_disk_behind_the_node_tier_promotes_into_own_slots(void **state)
{
    (void)state;
    char dir[] = "kvt-node-disk-XXXXXX";
    assert_non_null(mkdtemp(dir));
    wrep a, b;
    wrep_open(&a, 0);
    wrep_open(&b, 1);
    KVT_OK_(kvt_offload_add_tier(a.r.s.m, "disk", 64, NULL));
    kvt_layout *ml;
    KVT_OK_(kvt_mirror_layout(a.mirror, &ml));
    kvt_disk_config dc;
    kvt_disk_config_init(&dc);
    char path[64];
    snprintf(path, sizeof(path), "%s/kv", dir);
    dc.path = path;
    dc.page_cache = true;
    dc.capacity_bytes = 64ull * 2 * KV_BPB;
    kvt_disk *d;
    KVT_OK_(kvt_disk_create(&dc, ml, &d));
    KVT_OK_(kvt_worker_attach_disk_tier(a.w, 1, d));

    sim_req p;
    sim_req_make(&p, "p", 9 * SIM_BS + 5, 3, 9 * SIM_BS + 5, 0);
    wrep_store(&a, &p);
    kvt_tier_stats ts;
    KVT_OK_(kvt_offload_get_tier_stats(a.r.s.m, 1, &ts));
    assert_int_equal(ts.stores_completed, 9);
    for (uint32_t i = 0; i < 3; i++) { /* 27 blocks more than a's 23 own slots hold */
        sim_req o;
        char id[8];
        snprintf(id, sizeof(id), "o%u", i);
        sim_req_make(&o, id, 9 * SIM_BS + 5, 10 + i, 9 * SIM_BS + 5, 0);
        wrep_store(&a, &o);
    }
    for (uint32_t j = 0; j < 9; j++)
        assert_false(sim_host_has(&b.r.s, &p, j)); /* the node let it go */

    memset(a.kv, 0, 2ull * GPU_NB * KV_BPB);
    KVT_OK_(kvt_pool_reset_prefix_cache(a.r.s.gpu));
    sim_req q;
    sim_req_make(&q, "q", 9 * SIM_BS + 5, 3, 9 * SIM_BS + 5, 1);
    assert_int_equal(sim_admit(&a.r.s, &q, UINT32_MAX), 9 * SIM_BS);
    for (int i = 0; i < 3; i++) /* the promotion, then the GPU load */
        wrep_step(&a);
    KVT_OK_(kvt_offload_get_tier_stats(a.r.s.m, 1, &ts));
    assert_int_equal(ts.hit_tokens, 9 * SIM_BS);
    assert_int_equal(ts.load_events, 1);
    assert_false(kvt_offload_has_pending(a.r.s.m));
    sim_kv_expect(a.kv, GPU_NB, KV_BPB, &q, 9, "promoted");
    sim_finish(&a.r.s, &q);

    /* published again from a's own slots: b loads it through the node */
    sim_req u;
    sim_req_make(&u, "u", 9 * SIM_BS + 5, 3, 9 * SIM_BS + 5, 2);
    assert_int_equal(sim_admit(&b.r.s, &u, UINT32_MAX), 9 * SIM_BS);
    wrep_step(&b);
    sim_kv_expect(b.kv, GPU_NB, KV_BPB, &u, 9, "through the node");
    sim_finish(&b.r.s, &u);

    kvt_worker_destroy(a.w); /* before the disk it borrows */
    a.w = NULL;
    kvt_disk_destroy(d);
    kvt_layout_destroy(ml);
    wrep_close(&b);
    wrep_close(&a);
    rmdir(dir);
}

static void the_data_region_is_one_memory_and_its_size_is_checked(void **state)
{
    (void)state;
    kvt_layout *lay, *other;
    unsigned char *dev = calloc(GPU_NB, 4096);
    KVT_OK_(kvt_layout_create(KVT_HOST_DEVICE, GPU_NB, &lay));
    KVT_OK_(kvt_layout_add_region(lay, (uint64_t)(uintptr_t)dev, 4096));
    KVT_OK_(kvt_layout_create(KVT_HOST_DEVICE, GPU_NB, &other));
    KVT_OK_(kvt_layout_add_region(other, (uint64_t)(uintptr_t)dev, 2048));
    kvt_mirror_config mc;
    kvt_mirror_config_init(&mc);
    mc.host_blocks = SLOTS;
    mc.node_name = g_name;
    kvt_mirror *m1, *m2, *bad = NULL;
    KVT_OK_(kvt_mirror_create(&mc, lay, &m1));
    KVT_OK_(kvt_mirror_create(&mc, lay, &m2));
    const kvt_region *r1 = kvt_mirror_regions(m1), *r2 = kvt_mirror_regions(m2);
    assert_ptr_not_equal((void *)(uintptr_t)r1->base, (void *)(uintptr_t)r2->base);
    memset((void *)(uintptr_t)(r1->base + 17 * 4096), 0xA5, 4096);
    assert_int_equal(((unsigned char *)(uintptr_t)r2->base)[17 * 4096 + 100], 0xA5);
    KVT_ERR_(kvt_mirror_create(&mc, other, &bad), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "differ"));
    mc.node_name = "no/slash";
    KVT_ERR_(kvt_mirror_create(&mc, lay, &bad), KVT_EINVAL);
    assert_null(bad);
    kvt_mirror_destroy(m2);
    kvt_mirror_destroy(m1);
    kvt_layout_destroy(other);
    kvt_layout_destroy(lay);
    free(dev);
}

/* Issue 36: the node tier detached before the manager it was lent to (finalizers in no
 * particular order, as at a Python interpreter's exit): the detach waits for the manager,
 * whose destroy completes it; the last replica's names are then gone. */
static void detach_before_the_manager_is_deferred_not_a_crash(void **state)
{
    (void)state;
    replica r;
    replica_open(&r, 0);
    kvt_node_detach(r.node); /* still lent: deferred */
    kvt_node_stats st;
    KVT_OK_(kvt_node_get_stats(r.node, &st)); /* still valid */
    assert_int_equal(st.ranks_attached, 1);
    char p[160], dir[1024], stem[128];
    kvi_shm_share me = {0};
    KVT_OK_(kvi_shm_dir(NULL, &me, dir, sizeof(dir)));
    KVT_OK_(kvi_shm_stem(dir, g_name, &me, false, stem, sizeof(stem)));
    snprintf(p, sizeof(p), "/kvtier.%s.meta", stem);
    sim_fini(&r.s); /* the manager lets go: the detach happens now */
    int fd = shm_open(p, O_RDONLY, 0);
    assert_int_equal(fd, -1);
    /* and its rendezvous */
    KVT_ERR_(kvi_shm_stem(dir, g_name, &me, false, stem, sizeof(stem)), KVT_ENOENT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(config_mismatches_are_refused_with_the_field_named, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(a_replica_hits_what_a_peer_stored, setup, teardown),
        cmocka_unit_test_setup_teardown(a_pinned_slot_is_never_reused_by_its_owner, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(a_killed_replica_leaves_no_pinned_slot_behind, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(a_restarted_replica_is_not_consulted_for_old_entries, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(a_tier_left_by_dead_replicas_is_replaced_not_refused, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(a_holder_dying_inside_the_lock_is_repaired, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(a_stopped_holder_makes_calls_fail_not_hang, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(loaded_bytes_come_from_the_peer_that_stored_them, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(the_data_region_is_one_memory_and_its_size_is_checked,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(a_disk_behind_the_node_tier_promotes_into_own_slots, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(detach_before_the_manager_is_deferred_not_a_crash, setup,
                                        teardown),
    };
    return kvt_test_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
