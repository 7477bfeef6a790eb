/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The remote tier (kvtier/remote.h) against a real Redis that the test starts itself (on a
 * unix socket in a temporary directory): hits across instances with every byte checked, stale
 * entries costing misses, the credential, mismatched seeds, an owner stopped or killed during
 * reads, an owner restarted, Redis restarted, and the read channel's decoders on broken input.
 * Without redis-server on PATH every case is skipped (and says so).
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include "kvt_test.h"
#include "redis_group.h"
#include "kvtier/remote.h"
#include "remote/remote_internal.h"

#include "remote_inst.h"

static void hits_across_instances_every_byte_checked(void **state)
{
    (void)state;
    NEED_REDIS();
    inst a, b;
    KVT_OK_(make(&a, "a", true, 7, CRED, 2000));
    KVT_OK_(make(&b, "b", true, 7, CRED, 2000));
    store(&a, 1, 32, 1);
    store(&b, 2, 8, 40);
    uint32_t ok, stale, failed;
    /* b finds a's 32 blocks (its chain of 40 ends there) and a finds b's 8 */
    assert_int_equal(fetch(&b, 1, 40, &ok, &stale, &failed), 32);
    assert_int_equal(ok, 32);
    assert_int_equal(fetch(&a, 2, 8, &ok, &stale, &failed), 8);
    assert_int_equal(ok, 8);
    /* an instance never finds itself */
    assert_int_equal(fetch(&a, 1, 32, &ok, &stale, &failed), 0);
    kvt_remote_stats sa, sb;
    kvt_remote_get_stats(a.r, &sa);
    kvt_remote_get_stats(b.r, &sb);
    assert_int_equal(sa.published, 32);
    assert_int_equal(sa.served_blocks, 32);
    assert_int_equal(sb.read_ok, 32);
    assert_int_equal(sb.read_bytes, 32ull * BB);
    assert_true(sa.epoch > 0 && sb.epoch > 0);
    assert_non_null(kvt_remote_peer_name(b.r, 0));
    drop_inst(&b);
    drop_inst(&a);
}

static void a_withdrawn_or_reused_slot_costs_a_miss_never_wrong_bytes(void **state)
{
    (void)state;
    NEED_REDIS();
    inst a, b;
    KVT_OK_(make(&a, "a", true, 7, CRED, 2000));
    KVT_OK_(make(&b, "b", false, 7, CRED, 2000));
    store(&a, 3, 16, 1);
    uint8_t hashes[16 * HL];
    kvt_remote_loc locs[16];
    uint32_t hit;
    chain(3, 16, hashes);
    KVT_OK_(kvt_remote_lookup(b.r, hashes, 16, locs, &hit));
    assert_int_equal(hit, 16);
    /* after the lookup, a reuses slot 6 (block 5) for another block: withdraw, then store */
    uint32_t s6 = 6;
    KVT_OK_(kvt_remote_withdraw(a.r, &s6, 1));
    fill(a.region + 6 * BB, 99, 0);
    /* and scribbles over slot 9 (block 8) without withdrawing it: the checksum catches it */
    a.region[9 * BB + 100] ^= 0xff;
    uint8_t *dst = malloc(16 * BB);
    void *ptrs[16];
    int st[16];
    for (uint32_t i = 0; i < 16; i++)
        ptrs[i] = dst + (size_t)i * BB;
    KVT_ERR_(kvt_remote_read(b.r, locs, hashes, 16, ptrs, st), KVT_ENOENT);
    for (uint32_t i = 0; i < 16; i++) {
        if (i == 5 || i == 8)
            assert_int_equal(st[i], KVT_ENOENT);
        else {
            assert_int_equal(st[i], 0);
            assert_true(same_as(dst + (size_t)i * BB, 3, i));
        }
    }
    free(dst);
    /* the directory lost block 5: the prefix now ends there */
    uint32_t ok, stale, failed;
    assert_int_equal(fetch(&b, 3, 16, &ok, &stale, &failed), 5);
    kvt_remote_stats sa;
    kvt_remote_get_stats(a.r, &sa);
    assert_int_equal(sa.withdrawn, 1);
    assert_true(sa.served_stale >= 2);
    drop_inst(&b);
    drop_inst(&a);
}

static void owner_checks_off(kvt_remote_config *c)
{
    c->owner_checksum = 0;
}

/* An owner that does not check its bytes (owner_checksum = 0) sends a scribbled block as it
 * is: the reader's tag over what landed refuses it (taken as each block lands, before the
 * owner's reply, or after the reply for a block still under way then; one comparison). */
static void the_reader_refuses_bytes_the_owner_did_not_check(void **state)
{
    (void)state;
    NEED_REDIS();
    inst a, b;
    KVT_OK_(make_with(&a, "a", true, 7, CRED, 2000, owner_checks_off));
    KVT_OK_(make(&b, "b", false, 7, CRED, 2000));
    store(&a, 3, 32, 1);
    uint8_t hashes[32 * HL];
    kvt_remote_loc locs[32];
    uint32_t hit;
    chain(3, 32, hashes);
    KVT_OK_(kvt_remote_lookup(b.r, hashes, 32, locs, &hit));
    assert_int_equal(hit, 32);
    a.region[1 * BB + 5] ^= 0x01;     /* block 0 */
    a.region[32 * BB + 8190] ^= 0x80; /* block 31 */
    uint8_t *dst = malloc(32 * BB);
    void *ptrs[32];
    int st[32];
    for (uint32_t i = 0; i < 32; i++)
        ptrs[i] = dst + (size_t)i * BB;
    const uint32_t rounds = 20;
    for (uint32_t k = 0; k < rounds; k++) {
        memset(dst, 0, 32 * BB);
        KVT_ERR_(kvt_remote_read(b.r, locs, hashes, 32, ptrs, st), KVT_EPROTO);
        for (uint32_t i = 0; i < 32; i++) {
            if (i == 0 || i == 31)
                assert_int_equal(st[i], KVT_EPROTO);
            else {
                assert_int_equal(st[i], 0);
                assert_true(same_as(dst + (size_t)i * BB, 3, i));
            }
        }
    }
    free(dst);
    kvt_remote_stats sb;
    kvt_remote_get_stats(b.r, &sb);
    assert_int_equal(sb.auth_failures, 2 * rounds);
    assert_int_equal(sb.read_ok, 30 * rounds);
    drop_inst(&b);
    drop_inst(&a);
}

/* The reader side (kvt_remote_read_from, by peer, into the reader's own slots), as an offload
 * worker runs it: on its own thread while the lookup side looks up and publishes, with peers
 * copied out of a lookup (kvt_remote_lookup_peer); every byte checked. */
typedef struct side_reader {
    kvt_remote *r;
    const uint8_t *region;
    kvt_remote_peer peers[KVT_REMOTE_MAX_PEERS];
    uint32_t n_peers;
    kvt_remote_loc locs[32];
    uint8_t hashes[32 * HL];
    uint32_t rounds, ok;
} side_reader;

static void *side_read(void *arg)
{
    side_reader *x = arg;
    uint32_t slots[32];
    int st[32];
    for (uint32_t i = 0; i < 32; i++)
        slots[i] = 10 + i;
    for (uint32_t k = 0; k < x->rounds; k++) {
        memset(st, 0x7f, sizeof(st));
        if (kvt_remote_read_from(x->r, x->peers, x->n_peers, x->locs, x->hashes, 32, slots, st))
            continue;
        bool good = true;
        for (uint32_t i = 0; i < 32; i++)
            good = good && st[i] == 0 && same_as(x->region + (size_t)slots[i] * BB, 1, i);
        x->ok += good;
    }
    return NULL;
}

static void reads_by_peer_run_beside_lookups_on_another_thread(void **state)
{
    (void)state;
    NEED_REDIS();
    inst a, b;
    KVT_OK_(make(&a, "a", true, 7, CRED, 2000));
    KVT_OK_(make(&b, "b", true, 7, CRED, 2000));
    store(&a, 1, 32, 1);
    store(&a, 2, 8, 40);
    side_reader x = {.r = b.r, .region = b.region, .rounds = 20};
    uint32_t hit = 0;
    chain(1, 32, x.hashes);
    KVT_OK_(kvt_remote_lookup(b.r, x.hashes, 32, x.locs, &hit));
    assert_int_equal(hit, 32);
    for (uint32_t i = 0; i < 32; i++) /* one owner: peer 0 of this lookup */
        assert_int_equal(x.locs[i].peer, 0);
    KVT_OK_(kvt_remote_lookup_peer(b.r, 0, &x.peers[0]));
    x.n_peers = 1;
    assert_string_equal(x.peers[0].instance, "a");
    kvt_remote_peer none;
    KVT_ERR_(kvt_remote_lookup_peer(b.r, 1, &none), KVT_ERANGE);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, side_read, &x), 0);
    uint32_t ok, stale, failed;
    for (uint32_t k = 0; k < 30; k++) { /* the lookup side meanwhile: lookups, reads, publishes */
        assert_int_equal(fetch(&b, 2, 8, &ok, &stale, &failed), 8);
        assert_int_equal(ok, 8);
        store(&b, 3, 4, 50);
    }
    pthread_join(t, NULL);
    assert_int_equal(x.ok, x.rounds);
    kvt_remote_stats sb;
    kvt_remote_get_stats(b.r, &sb);
    assert_int_equal(sb.read_ok, 20u * 32 + 30u * 8);

    /* bad requests are refused whole, each block's status saying so */
    uint32_t slots[32];
    int st[32];
    for (uint32_t i = 0; i < 32; i++)
        slots[i] = 10 + i;
    x.locs[3].peer = 1;
    KVT_ERR_(kvt_remote_read_from(b.r, x.peers, 1, x.locs, x.hashes, 32, slots, st), KVT_EINVAL);
    assert_int_equal(st[31], KVT_EINVAL);
    x.locs[3].peer = 0;
    slots[5] = SLOTS;
    KVT_ERR_(kvt_remote_read_from(b.r, x.peers, 1, x.locs, x.hashes, 32, slots, st), KVT_ERANGE);
    slots[5] = 15;
    kvt_remote_peer bad = x.peers[0];
    memset(bad.endpoint, 'x', sizeof(bad.endpoint));
    KVT_ERR_(kvt_remote_read_from(b.r, &bad, 1, x.locs, x.hashes, 32, slots, st), KVT_EINVAL);
    KVT_ERR_(kvt_remote_read_from(b.r, x.peers, KVT_REMOTE_MAX_PEERS + 1, x.locs, x.hashes, 32,
                                  slots, st),
             KVT_ELIMIT);
    /* an owner named with another epoch than its current one: nothing read */
    bad = x.peers[0];
    bad.epoch--;
    assert_int_not_equal(kvt_remote_read_from(b.r, &bad, 1, x.locs, x.hashes, 4, slots, st), 0);
    for (uint32_t i = 0; i < 4; i++)
        assert_int_not_equal(st[i], 0);
    /* and the right one again: read */
    KVT_OK_(kvt_remote_read_from(b.r, x.peers, 1, x.locs, x.hashes, 4, slots, st));
    drop_inst(&b);
    drop_inst(&a);
}

/* Engines of tensor parallelism 2: each rank of instance "a" serves its own part of every block
 * (its bytes differ by rank), registered as "a#0" and "a#1"; instance "b"'s scheduler looks up
 * with a lookup-only client and each of b's ranks reads its part from a's rank of the same
 * index. A block is a hit only when both ranks published it. */
static uint32_t g_rank;
static void rank_n_tweak(kvt_remote_config *c)
{
    c->ranks = 2;
    c->rank = g_rank;
}

static void lookup_only_tweak(kvt_remote_config *c)
{
    c->ranks = 2;
    c->rank = KVT_REMOTE_NO_RANK;
}

static void make_rank(inst *in, const char *name, uint32_t rank)
{
    g_rank = rank;
    KVT_OK_(make_with(in, name, true, 7, CRED, 2000, rank_n_tweak));
}

/* stores blocks [0, n) of seq into slots first.. with rank r's bytes (sequence seq + 100 r) */
static void store_part(inst *in, uint32_t seq, uint32_t r, uint32_t n, uint32_t first)
{
    uint8_t hashes[SLOTS * HL];
    uint32_t slots[SLOTS];
    chain(seq, n, hashes);
    for (uint32_t i = 0; i < n; i++) {
        slots[i] = first + i;
        fill(in->region + (size_t)slots[i] * BB, seq + 100 * r, i);
    }
    KVT_OK_(kvt_remote_publish(in->r, slots, hashes, n));
}

static void ranks_publish_their_parts_and_read_the_same_rank(void **state)
{
    (void)state;
    NEED_REDIS();
    inst a[2], b[2], bs, as;
    make_rank(&a[0], "a", 0);
    make_rank(&a[1], "a", 1);
    make_rank(&b[0], "b", 0);
    make_rank(&b[1], "b", 1);
    KVT_OK_(make_with(&bs, "b", false, 7, NULL, 2000, lookup_only_tweak));
    KVT_OK_(make_with(&as, "a", false, 7, NULL, 2000, lookup_only_tweak));
    store_part(&a[0], 1, 0, 16, 1);
    store_part(&a[1], 1, 1, 10, 1); /* rank 1 holds only the first 10 */
    uint8_t hashes[16 * HL];
    kvt_remote_loc locs[16 * 2];
    uint32_t hit = 0;
    chain(1, 16, hashes);
    KVT_OK_(kvt_remote_lookup(bs.r, hashes, 16, locs, &hit));
    assert_int_equal(hit, 10); /* whole blocks only */
    /* block i's part k at locs[2 i + k], from a's rank k */
    kvt_remote_peer peer[2];
    for (uint32_t k = 0; k < 2; k++) {
        KVT_OK_(kvt_remote_lookup_peer(bs.r, locs[k].peer, &peer[k]));
        char want[8];
        snprintf(want, sizeof(want), "a#%u", k);
        assert_string_equal(peer[k].instance, want);
    }
    /* an instance never finds itself, whichever rank published */
    uint32_t self = 0;
    KVT_OK_(kvt_remote_lookup(as.r, hashes, 16, locs + 0, &self));
    assert_int_equal(self, 0);
    KVT_OK_(kvt_remote_lookup(bs.r, hashes, 16, locs, &hit));
    /* each of b's ranks reads its part, into its own slots 20.., every byte checked */
    for (uint32_t k = 0; k < 2; k++) {
        kvt_remote_loc mine[10];
        uint32_t slots[10];
        int st[10];
        for (uint32_t i = 0; i < 10; i++) {
            mine[i] = locs[2 * i + k];
            mine[i].peer = 0;
            slots[i] = 20 + i;
        }
        KVT_OK_(kvt_remote_read_from(b[k].r, &peer[k], 1, mine, hashes, 10, slots, st));
        for (uint32_t i = 0; i < 10; i++) {
            assert_int_equal(st[i], 0);
            assert_true(same_as(b[k].region + (size_t)(20 + i) * BB, 1 + 100 * k, i));
        }
        /* the other rank's owner holds other heads of the block: refused, nothing read */
        KVT_ERR_(kvt_remote_read_from(b[k].r, &peer[1 - k], 1, mine, hashes, 10, slots, st),
                 KVT_EINVAL);
        assert_int_equal(st[0], KVT_EINVAL);
    }
    /* a lookup-only client neither publishes nor reads */
    uint32_t s1 = 1;
    int st1;
    KVT_ERR_(kvt_remote_publish(bs.r, &s1, hashes, 1), KVT_ESTATE);
    KVT_ERR_(kvt_remote_read_from(bs.r, &peer[0], 1, locs, hashes, 1, &s1, &st1), KVT_ESTATE);
    /* a rank withdraws its part: the block stops being a hit for everyone */
    uint32_t s4 = 4; /* block 3 */
    KVT_OK_(kvt_remote_withdraw(a[1].r, &s4, 1));
    KVT_OK_(kvt_remote_lookup(bs.r, hashes, 16, locs, &hit));
    assert_int_equal(hit, 3);
    /* an instance of one rank cannot join a space of two (its blocks would be split otherwise) */
    inst c;
    int rc = make(&c, "c", true, 7, CRED, 2000);
    assert_int_equal(rc, KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "ranks"));
    kvt_remote_stats sa;
    kvt_remote_get_stats(a[0].r, &sa);
    assert_int_equal(sa.served_blocks, 10);
    for (uint32_t k = 0; k < 2; k++)
        drop_inst(&a[k]), drop_inst(&b[k]);
    drop_inst(&bs);
    drop_inst(&as);
}

static void a_wrong_credential_is_refused(void **state)
{
    (void)state;
    NEED_REDIS();
    inst a, b;
    KVT_OK_(make(&a, "a", true, 7, CRED, 2000));
    KVT_OK_(make(&b, "b", false, 7, "not-the-secret-of-the-space", 2000));
    store(&a, 4, 4, 1);
    uint32_t ok, stale, failed;
    assert_int_equal(fetch(&b, 4, 4, &ok, &stale, &failed), 4);
    assert_int_equal(ok, 0);
    assert_int_equal(failed, 4);
    /* b saw that a's proof was not made with its key and sent no request (no address, no
     * tag); a served nothing and never counted b as a member */
    kvt_remote_stats sa, sb;
    kvt_remote_get_stats(a.r, &sa);
    kvt_remote_get_stats(b.r, &sb);
    assert_int_equal(sa.served_blocks, 0);
    assert_int_equal(sa.handshakes, 0);
    assert_int_equal(sb.handshakes, 0);
    assert_int_equal(sb.auth_failures, 1);
    drop_inst(&b);
    drop_inst(&a);
}

static void mismatched_seeds_are_refused_naming_the_other(void **state)
{
    (void)state;
    NEED_REDIS();
    inst a, c;
    KVT_OK_(make(&a, "a", true, 7, CRED, 2000));
    KVT_ERR_(make(&c, "c", false, 8, CRED, 2000), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "'a'"));
    assert_non_null(strstr(kvt_last_error(), "hash seed"));
    /* once a is gone, a space may move to another seed */
    drop_inst(&a);
    KVT_OK_(make(&c, "c", false, 8, CRED, 2000));
    drop_inst(&c);
}

/* The owner process (main with --owner: a fresh process, so that no thread of the test's own
 * crosses the fork): serves seq's n blocks as instance `name` until killed; writes one byte to
 * fd 3 once it published them. */
static int owner_main(const char *space, const char *name, uint32_t seq, uint32_t n)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    snprintf(g_space, sizeof(g_space), "%s", space);
    inst a;
    if (make(&a, name, true, 7, CRED, 2000) != 0)
        return 2;
    /* the new epoch: wait until registered (an old key of the name may still be live) */
    kvt_remote_stats s;
    KVT_WAIT_UNTIL((kvt_remote_get_stats(a.r, &s), s.epoch != 0), "the owner registered");
    store(&a, seq, n, 1);
    char c = 'r';
    if (write(3, &c, 1) != 1)
        return 3;
    for (;;)
        pause();
}

static pid_t owner_child(const char *name, uint32_t seq, uint32_t n)
{
    int p2c[2];
    assert_int_equal(pipe(p2c), 0);
    pid_t p = fork();
    assert_true(p >= 0);
    if (p == 0) {
        dup2(p2c[1], 3);
        char s[16], k[16];
        snprintf(s, sizeof(s), "%u", seq);
        snprintf(k, sizeof(k), "%u", n);
        execl("/proc/self/exe", "test_remote", "--owner", g_space, g_sock, name, s, k,
              (char *)NULL);
        _exit(127);
    }
    close(p2c[1]);
    char c;
    assert_int_equal(read(p2c[0], &c, 1), 1);
    close(p2c[0]);
    return p;
}

static void an_owner_stopped_or_killed_mid_read_fails_the_read_and_restarts_empty(void **state)
{
    (void)state;
    NEED_REDIS();
    inst b;
    KVT_OK_(make(&b, "b", false, 7, CRED, 400));
    pid_t own = owner_child("a", 5, 24);
    uint32_t ok, stale, failed;
    assert_int_equal(fetch(&b, 5, 24, &ok, &stale, &failed), 24);
    assert_int_equal(ok, 24);
    /* stopped: its entries are still in the directory, the read fails within timeout_ms */
    uint8_t hashes[24 * HL];
    kvt_remote_loc locs[24];
    uint32_t hit;
    chain(5, 24, hashes);
    KVT_OK_(kvt_remote_lookup(b.r, hashes, 24, locs, &hit));
    assert_int_equal(hit, 24);
    kill(own, SIGSTOP);
    int ws;
    assert_int_equal(waitpid(own, &ws, WUNTRACED), own); /* stopped by now, not just signalled */
    assert_true(WIFSTOPPED(ws));
    uint8_t *dst = malloc(24 * BB);
    void *ptrs[24];
    int st[24];
    for (uint32_t i = 0; i < 24; i++)
        ptrs[i] = dst + (size_t)i * BB;
    KVT_ERR_(kvt_remote_read(b.r, locs, hashes, 24, ptrs, st), KVT_EIO);
    for (uint32_t i = 0; i < 24; i++)
        assert_int_equal(st[i], KVT_EIO);
    /* killed: its liveness key expires, its entries stop counting */
    kill(own, SIGKILL);
    waitpid(own, NULL, 0);
    KVT_ERR_(kvt_remote_read(b.r, locs, hashes, 24, ptrs, st), KVT_EIO);
    KVT_WAIT_UNTIL(fetch(&b, 5, 24, &ok, &stale, &failed) == 0, "the killed owner's key expired");
    /* restarted under the same name: empty, a new epoch; the old entries never come back,
     * what it stores anew is found */
    own = owner_child("a", 6, 8);
    assert_int_equal(fetch(&b, 5, 24, &ok, &stale, &failed), 0);
    assert_int_equal(fetch(&b, 6, 8, &ok, &stale, &failed), 8);
    assert_int_equal(ok, 8);
    /* an entry of the old epoch that survived in the directory (say, Redis restored from a
     * snapshot) does not count: the lookup checks the owner's live epoch */
    char cmd[512], hex[2 * HL + 1];
    for (uint32_t j = 0; j < HL; j++)
        snprintf(hex + 2 * j, 3, "%02x", hashes[j]);
    snprintf(cmd, sizeof(cmd), "redis-cli -s %s SET 'kvt:{%s}:b:%s' 'a 1 1 1' >/dev/null", g_sock,
             g_space, hex);
    assert_int_equal(system(cmd), 0);
    KVT_OK_(kvt_remote_lookup(b.r, hashes, 1, locs, &hit));
    assert_int_equal(hit, 0);

    kill(own, SIGKILL);
    waitpid(own, NULL, 0);
    free(dst);
    drop_inst(&b);
}

static void redis_down_means_misses_and_a_restart_rebuilds_the_directory(void **state)
{
    (void)state;
    NEED_REDIS();
    inst a, b;
    KVT_OK_(make(&a, "a", true, 7, CRED, 2000));
    KVT_OK_(make(&b, "b", false, 7, CRED, 2000));
    store(&a, 7, 12, 1);
    uint32_t ok, stale, failed;
    assert_int_equal(fetch(&b, 7, 12, &ok, &stale, &failed), 12);
    redis_stop();
    assert_int_equal(fetch(&b, 7, 12, &ok, &stale, &failed), 0); /* a miss, not an error */
    store(&a, 8, 4, 20);                                         /* dropped, not an error */
    kvt_remote_stats sa, sb;
    kvt_remote_get_stats(a.r, &sa);
    kvt_remote_get_stats(b.r, &sb);
    assert_int_equal(sa.publish_dropped, 4);
    assert_true(sb.directory_errors >= 1);
    assert_true(redis_start());
    /* a notices its key is gone, enters again and publishes what it holds */
    KVT_WAIT_UNTIL(fetch(&b, 7, 12, &ok, &stale, &failed) == 12, "a's blocks found again");
    assert_int_equal(ok, 12);
    assert_int_equal(fetch(&b, 8, 4, &ok, &stale, &failed), 4);
    kvt_remote_get_stats(a.r, &sa);
    assert_true(sa.registrations >= 2);
    drop_inst(&b);
    drop_inst(&a);
}

/* A restarted Redis closes every client's connection; the first call on each then finds it
 * closed. It reconnects at once and makes the call, rather than failing it (a lookup that
 * misses, a publication dropped) and waiting retry_ms. */
static void the_first_calls_after_a_directory_restart_are_not_lost(void **state)
{
    (void)state;
    NEED_REDIS();
    inst a, b;
    KVT_OK_(make(&a, "a", true, 7, CRED, 2000));
    KVT_OK_(make(&b, "b", false, 7, CRED, 2000));
    store(&a, 7, 6, 1);
    uint32_t ok, stale, failed;
    assert_int_equal(fetch(&b, 7, 6, &ok, &stale, &failed), 6);
    kvt_remote_stats sa0, sb0, sa, sb;
    kvt_remote_get_stats(a.r, &sa0);
    kvt_remote_get_stats(b.r, &sb0);
    redis_stop();
    assert_true(redis_start());
    /* both connections are stale now: neither call fails (a's server thread may be entering
     * again meanwhile: a publication then waits for the entry's republish, it is not lost) */
    fetch(&b, 7, 6, &ok, &stale, &failed);
    store(&a, 9, 4, 30);
    kvt_remote_get_stats(a.r, &sa);
    kvt_remote_get_stats(b.r, &sb);
    assert_int_equal(sb.directory_errors, sb0.directory_errors);
    assert_int_equal(sa.publish_dropped, sa0.publish_dropped);
    /* once a entered again (registrations count an entry once it republished), what it
     * published before and since is found */
    KVT_WAIT_UNTIL((kvt_remote_get_stats(a.r, &sa), sa.registrations > sa0.registrations),
                   "a entered again");
    assert_int_equal(fetch(&b, 9, 4, &ok, &stale, &failed), 4);
    assert_int_equal(fetch(&b, 7, 6, &ok, &stale, &failed), 6);
    drop_inst(&b);
    drop_inst(&a);
}

static void a_password_protected_directory(void **state)
{
    (void)state;
    NEED_REDIS();
    char sock[128];
    snprintf(sock, sizeof(sock), "%s/auth.sock", g_dir);
    pid_t pr = kvt_redis_start(g_dir, sock, "directory-secret");
    assert_true(pr > 0);
    kvt_remote_config c;
    kvt_remote_config_init(&c);
    c.directory = sock;
    c.space = g_space;
    c.instance = "a";
    c.listen_host = "127.0.0.1";
    c.credential = CRED;
    c.block_bytes = BB;
    c.hash_len = HL;
    uint8_t *region = calloc(SLOTS, BB);
    c.region = region;
    c.n_slots = SLOTS;
    kvt_remote *a = NULL, *b = NULL;
    /* no password or a wrong one: a configuration error, said at create */
    KVT_ERR_(kvt_remote_create(&c, &a), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "directory_password"));
    c.directory_password = "wrong";
    KVT_ERR_(kvt_remote_create(&c, &a), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "refused the password"));
    c.directory_password = "directory-secret";
    KVT_OK_(kvt_remote_create(&c, &a));
    c.instance = "b";
    c.region = NULL;
    c.n_slots = 0;
    KVT_OK_(kvt_remote_create(&c, &b));
    uint8_t hashes[4 * HL];
    uint32_t slots[4] = {1, 2, 3, 4};
    chain(9, 4, hashes);
    for (uint32_t i = 0; i < 4; i++)
        fill(region + (size_t)slots[i] * BB, 9, i);
    KVT_OK_(kvt_remote_publish(a, slots, hashes, 4));
    kvt_remote_loc locs[4];
    uint32_t hit = 0;
    KVT_OK_(kvt_remote_lookup(b, hashes, 4, locs, &hit));
    assert_int_equal(hit, 4);
    kvt_remote_destroy(b);
    kvt_remote_destroy(a);
    free(region);
    kvt_redis_stop(pr, sock);
}

/* A block split over three arrays, as a host mirror holds it: the pieces travel one by one,
 * land in the reader's own slots (or back to back in a buffer), and a scribble in the last
 * piece of a published slot costs a miss. */
#define NPIECE 3
static const uint64_t g_piece[NPIECE] = {BB / 4, BB / 2, BB / 4};

typedef struct split_inst {
    kvt_remote *r;
    uint8_t *arr[NPIECE];
    kvt_region reg[NPIECE];
} split_inst;

static void make_split(split_inst *in, const char *name)
{
    kvt_remote_config c;
    test_remote_config(&c, g_space, name, CRED);
    c.hash_len = HL;
    c.hash_seed = 7;
    for (uint32_t j = 0; j < NPIECE; j++) {
        in->arr[j] = calloc(SLOTS, g_piece[j]);
        assert_non_null(in->arr[j]);
        in->reg[j] =
            (kvt_region){.base = (uint64_t)(uintptr_t)in->arr[j], .block_bytes = g_piece[j]};
    }
    c.regions = in->reg;
    c.n_regions = NPIECE;
    c.n_slots = SLOTS;
    KVT_OK_(kvt_remote_create(&c, &in->r));
}

static void drop_split(split_inst *in)
{
    kvt_remote_destroy(in->r);
    for (uint32_t j = 0; j < NPIECE; j++)
        free(in->arr[j]);
}

/* slot s of in, its pieces gathered back to back */
static void gather(const split_inst *in, uint32_t s, uint8_t *out)
{
    for (uint32_t j = 0, off = 0; j < NPIECE; off += (uint32_t)g_piece[j], j++)
        memcpy(out + off, in->arr[j] + (size_t)s * g_piece[j], g_piece[j]);
}

static void a_block_split_over_regions_moves_piece_by_piece(void **state)
{
    (void)state;
    NEED_REDIS();
    split_inst a, b;
    make_split(&a, "a");
    make_split(&b, "b");
    enum { N = 12 };
    uint8_t hashes[N * HL], block[BB];
    uint32_t slots[N];
    chain(5, N, hashes);
    for (uint32_t i = 0; i < N; i++) {
        slots[i] = 3 + i;
        fill(block, 5, i);
        for (uint32_t j = 0, off = 0; j < NPIECE; off += (uint32_t)g_piece[j], j++)
            memcpy(a.arr[j] + (size_t)slots[i] * g_piece[j], block + off, g_piece[j]);
    }
    KVT_OK_(kvt_remote_publish(a.r, slots, hashes, N));
    kvt_remote_loc locs[N];
    uint32_t hit = 0, dst[N];
    int st[N];
    KVT_OK_(kvt_remote_lookup(b.r, hashes, N, locs, &hit));
    assert_int_equal(hit, N);
    for (uint32_t i = 0; i < N; i++)
        dst[i] = SLOTS - 1 - i;
    KVT_OK_(kvt_remote_read_slots(b.r, locs, hashes, N, dst, st));
    for (uint32_t i = 0; i < N; i++) {
        assert_int_equal(st[i], 0);
        gather(&b, dst[i], block);
        if (!same_as(block, 5, i))
            fail_msg("block %u: wrong bytes in the reader's slot", i);
    }
    /* into a plain buffer: the pieces back to back */
    uint8_t *buf = malloc((size_t)N * BB);
    void *ptrs[N];
    assert_non_null(buf);
    for (uint32_t i = 0; i < N; i++)
        ptrs[i] = buf + (size_t)i * BB;
    KVT_OK_(kvt_remote_read(b.r, locs, hashes, N, ptrs, st));
    for (uint32_t i = 0; i < N; i++)
        if (st[i] || !same_as(buf + (size_t)i * BB, 5, i))
            fail_msg("block %u: status %d or wrong bytes in the buffer", i, st[i]);
    /* a scribble in the last piece of published block 4: that block is a miss, the rest hit */
    a.arr[NPIECE - 1][(size_t)slots[4] * g_piece[NPIECE - 1] + 5] ^= 0x5a;
    (void)kvt_remote_read(b.r, locs, hashes, N, ptrs, st);
    for (uint32_t i = 0; i < N; i++)
        assert_int_equal(st[i], i == 4 ? KVT_ENOENT : 0);
    /* out-of-range destination slots are refused before anything moves */
    dst[0] = SLOTS;
    KVT_ERR_(kvt_remote_read_slots(b.r, locs, hashes, 1, dst, st), KVT_ERANGE);
    free(buf);
    drop_split(&b);
    drop_split(&a);
}

static void bad_configs_are_refused(void **state)
{
    (void)state;
    kvt_remote_config c;
    kvt_remote *r = NULL;
    kvt_remote_config_init(&c);
    c.directory = "/nonexistent/redis.sock";
    c.space = "s";
    c.instance = "x";
    c.listen_host = "127.0.0.1";
    c.credential = CRED;
    c.block_bytes = BB;
    c.credential = "short";
    KVT_ERR_(kvt_remote_create(&c, &r), KVT_EINVAL);
    c.credential = CRED;
    c.space = "a space";
    KVT_ERR_(kvt_remote_create(&c, &r), KVT_EINVAL);
    c.space = "s";
    c.hash_len = 33;
    KVT_ERR_(kvt_remote_create(&c, &r), KVT_EINVAL);
    c.hash_len = HL;
    c.reserved[0] = 1;
    KVT_ERR_(kvt_remote_create(&c, &r), KVT_EINVAL);
    c.reserved[0] = 0;
    c.ranks = KVT_REMOTE_MAX_RANKS + 1;
    KVT_ERR_(kvt_remote_create(&c, &r), KVT_EINVAL);
    c.ranks = 2;
    c.rank = 2; /* past the ranks */
    KVT_ERR_(kvt_remote_create(&c, &r), KVT_EINVAL);
    c.rank = 1;
    c.instance = "an-instance-name-of-sixty-three-bytes-which-is-one-too-many-012";
    KVT_ERR_(kvt_remote_create(&c, &r), KVT_EINVAL); /* "<instance>#1" would not fit */
    c.instance = "x";
    uint8_t one_block[BB];
    c.rank = KVT_REMOTE_NO_RANK; /* a lookup-only client serves nothing */
    c.region = one_block;
    c.n_slots = 1;
    KVT_ERR_(kvt_remote_create(&c, &r), KVT_EINVAL);
    c.region = NULL;
    c.n_slots = 0;
    c.ranks = 0;
    c.rank = 0;
    kvt_region reg[2] = {{.base = 4096, .block_bytes = BB / 2},
                         {.base = 8192, .block_bytes = BB / 2}};
    c.regions = reg;
    c.n_regions = 2;
    c.n_slots = 4;
    c.block_bytes = BB + 1; /* not the regions' sum */
    KVT_ERR_(kvt_remote_create(&c, &r), KVT_EINVAL);
    c.block_bytes = BB;
    c.region = reg; /* both a region and regions */
    KVT_ERR_(kvt_remote_create(&c, &r), KVT_EINVAL);
    c.region = NULL;
    c.n_regions = 0; /* regions without their count */
    KVT_ERR_(kvt_remote_create(&c, &r), KVT_EINVAL);
    c.regions = NULL;
    c.n_slots = 0;
    /* an unreachable directory is not an error: the instance starts unregistered */
    KVT_OK_(kvt_remote_create(&c, &r));
    uint8_t h[HL] = {1};
    kvt_remote_loc loc;
    uint32_t hit = 7;
    KVT_OK_(kvt_remote_lookup(r, h, 1, &loc, &hit));
    assert_int_equal(hit, 0);
    uint32_t slot = 0;
    KVT_ERR_(kvt_remote_publish(r, &slot, h, 1), KVT_ESTATE); /* it serves no region */
    /* a read refused before it starts writes its code as every block's status: a status of
     * 0 always means read and checked */
    uint8_t buf[BB];
    void *ptrs[2] = {buf, buf};
    int st[2] = {0, 0};
    kvt_remote_loc bad[2] = {{.peer = 7}, {.peer = 7}};
    uint8_t h2[2 * HL] = {1};
    KVT_ERR_(kvt_remote_read(r, bad, h2, 2, ptrs, st), KVT_EINVAL);
    assert_int_equal(st[0], KVT_EINVAL);
    assert_int_equal(st[1], KVT_EINVAL);
    st[0] = st[1] = 0;
    uint32_t two[2] = {0, 0};
    KVT_ERR_(kvt_remote_read_slots(r, bad, h2, 2, two, st), KVT_EINVAL);
    assert_int_equal(st[0], KVT_EINVAL);
    kvt_remote_destroy(r);
}

static void the_read_messages_are_validated(void **state)
{
    (void)state;
    uint8_t hash[HL] = {9};
    uint8_t addr[40] = {1};
    kvi_rreq_block blk[2] = {{.slot = 3, .generation = 5, .hash = hash},
                             {.slot = 4, .generation = 6, .hash = hash}};
    kvi_rreq q = {.seq = 3,
                  .req_id = 11,
                  .epoch = 2,
                  .flags = KVI_RREQ_ENCRYPT,
                  .hash_len = HL,
                  .addr = addr,
                  .addr_len = sizeof(addr),
                  .n = 2,
                  .blocks = blk};
    size_t len = kvi_rreq_size(&q);
    uint8_t *buf = malloc(len + 1);
    kvi_rreq_encode(&q, buf);
    kvi_rreq_block *out = malloc(KVT_REMOTE_MAX_READ * sizeof(*out));
    kvi_rreq d = {.blocks = out};
    KVT_OK_(kvi_rreq_decode(buf, len, &d));
    assert_int_equal(d.n, 2);
    assert_int_equal(d.seq, 3);
    assert_int_equal(d.flags, KVI_RREQ_ENCRYPT);
    assert_int_equal(d.blocks[1].slot, 4);
    assert_int_equal(d.blocks[1].generation, 6);
    /* every truncation, a trailing byte, a bad magic, version, flags, hash length and count */
    for (size_t cut = 0; cut < len; cut++)
        assert_true(kvi_rreq_decode(buf, cut, &d) < 0);
    buf[len] = 0;
    KVT_ERR_(kvi_rreq_decode(buf, len + 1, &d), KVT_EPROTO);
    buf[0] ^= 1;
    KVT_ERR_(kvi_rreq_decode(buf, len, &d), KVT_EPROTO);
    buf[0] ^= 1;
    buf[4] = 1; /* version 1 carried the credential: refused */
    KVT_ERR_(kvi_rreq_decode(buf, len, &d), KVT_EVERSION);
    buf[4] = 2; /* version 2's sessions were not forward-secret, its tags in clear: refused */
    KVT_ERR_(kvi_rreq_decode(buf, len, &d), KVT_EVERSION);
    buf[4] = 3;
    const size_t flags_at = 4 + 4 + 8 + 8 + 8, hl_at = flags_at + 4;
    buf[flags_at] = 6;
    KVT_ERR_(kvi_rreq_decode(buf, len, &d), KVT_EPROTO);
    buf[flags_at] = 1;
    buf[hl_at] = 0; /* hash_len 0 */
    KVT_ERR_(kvi_rreq_decode(buf, len, &d), KVT_EPROTO);
    buf[hl_at] = HL;
    size_t n_at = hl_at + 4 + 4 + q.addr_len;
    buf[n_at + 3] = 0x7f; /* a huge count */
    KVT_ERR_(kvi_rreq_decode(buf, len, &d), KVT_ELIMIT);
    free(buf);
    free(out);

    kvi_rrep_block rb[2] = {{0, {77}}, {KVT_ENOENT, {0}}};
    kvi_rrep p = {.seq = 3, .req_id = 11, .status = 0, .n = 2, .blocks = rb};
    len = kvi_rrep_size(&p);
    buf = malloc(len);
    kvi_rrep_encode(&p, buf);
    kvi_rrep_block *big = malloc(KVT_REMOTE_MAX_READ * sizeof(*big));
    kvi_rrep pd = {.blocks = big};
    KVT_OK_(kvi_rrep_decode(buf, len, &pd));
    assert_int_equal(pd.blocks[0].tag[0], 77);
    assert_int_equal(pd.blocks[1].status, KVT_ENOENT);
    for (size_t cut = 0; cut < len; cut++)
        assert_true(kvi_rrep_decode(buf, cut, &pd) < 0);
    buf[len - KVI_RMAC - 20] = 0x55; /* an unknown status */
    KVT_ERR_(kvi_rrep_decode(buf, len, &pd), KVT_EPROTO);
    free(buf);
    free(big);

    /* hello and challenge: round trips, every truncation refused */
    kvi_rhello h = {.nr = {1, 2, 3}, .er = {7}, .name = (const uint8_t *)"reader", .name_len = 6};
    uint8_t hb[128], cb[256];
    kvi_rhello_encode(&h, hb);
    kvi_rhello hd;
    KVT_OK_(kvi_rhello_decode(hb, kvi_rhello_size(&h), &hd));
    assert_int_equal(hd.name_len, 6);
    assert_int_equal(hd.er[0], 7);
    for (size_t cut = 0; cut < kvi_rhello_size(&h); cut++)
        assert_true(kvi_rhello_decode(hb, cut, &hd) < 0);
    kvi_rchal c = {.nr = {1},
                   .no = {2},
                   .er = {5},
                   .eo = {6},
                   .boot = {3},
                   .name = (const uint8_t *)"o",
                   .name_len = 1,
                   .proof = {4}};
    kvi_rchal_encode(&c, cb);
    kvi_rchal cd;
    KVT_OK_(kvi_rchal_decode(cb, kvi_rchal_size(&c), &cd));
    assert_int_equal(cd.proof[0], 4);
    assert_int_equal(cd.boot[0], 3);
    assert_int_equal(cd.er[0], 5);
    assert_int_equal(cd.eo[0], 6);
    for (size_t cut = 0; cut < kvi_rchal_size(&c); cut++)
        assert_true(kvi_rchal_decode(cb, cut, &cd) < 0);
}

int main(int argc, char **argv)
{
    if (argc == 7 && strcmp(argv[1], "--owner") == 0) {
        snprintf(g_sock, sizeof(g_sock), "%s", argv[3]);
        return owner_main(argv[2], argv[4], (uint32_t)atoi(argv[5]), (uint32_t)atoi(argv[6]));
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(hits_across_instances_every_byte_checked, each_setup),
        cmocka_unit_test_setup(a_withdrawn_or_reused_slot_costs_a_miss_never_wrong_bytes,
                               each_setup),
        cmocka_unit_test_setup(the_reader_refuses_bytes_the_owner_did_not_check, each_setup),
        cmocka_unit_test_setup(reads_by_peer_run_beside_lookups_on_another_thread, each_setup),
        cmocka_unit_test_setup(ranks_publish_their_parts_and_read_the_same_rank, each_setup),
        cmocka_unit_test_setup(a_wrong_credential_is_refused, each_setup),
        cmocka_unit_test_setup(mismatched_seeds_are_refused_naming_the_other, each_setup),
        cmocka_unit_test_setup(
            an_owner_stopped_or_killed_mid_read_fails_the_read_and_restarts_empty, each_setup),
        cmocka_unit_test_setup(redis_down_means_misses_and_a_restart_rebuilds_the_directory,
                               each_setup),
        cmocka_unit_test_setup(the_first_calls_after_a_directory_restart_are_not_lost, each_setup),
        cmocka_unit_test_setup(a_password_protected_directory, each_setup),
        cmocka_unit_test_setup(a_block_split_over_regions_moves_piece_by_piece, each_setup),
        cmocka_unit_test(bad_configs_are_refused),
        cmocka_unit_test(the_read_messages_are_validated),
    };
    return kvt_test_exit(cmocka_run_group_tests(tests, group_setup, group_teardown));
}
