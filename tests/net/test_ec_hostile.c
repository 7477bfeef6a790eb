/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Hostile peers on loopback (docs/security.md): a consumer shard with its control server and
 * UCX data plane runs in this process; attackers are separate processes (this binary spawned
 * with "attack <name> ..."), each exiting 0 only if every attempt of its own was refused.
 * Checked: no stranger learns, completes, abandons or cancels another client's reservation or
 * plants a tombstone ahead of it; bytes sent to guessed tags land nowhere; a completion flood
 * naming an unlanded reservation is answered at once; a consumer-cancelled writer whose
 * producer died is reaped; thousands of followers expire in one pass; a consumer answering a
 * crafted data address fails the producer's push cleanly (no abort). Honest transfers are
 * served byte for byte throughout, and nothing leaks.
 */
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <zmq.h>

#include "net/ec_ctl.h"
#include "net/ucx.h"
#include "kvt_test.h"

#define CAP     (8u << 20)
#define TIMEOUT 5000
#define HONEST  "0123456789abcdef0123456789abcdef" /* the honest producer's client key */
#define OWNER   "fedcba9876543210fedcba9876543210" /* the consumer's owner key */
#define EVIL    "00000000000000000000000000000bad" /* the attacker's own client key */

extern char **environ;
static char g_self[4096];

static kvt_str S(const char *s)
{
    return (kvt_str){s, (uint32_t)strlen(s)};
}

static kvi_ecc_item item(const char *tid, const char *hash, const char *key)
{
    kvi_ecc_item it = {.transfer_id = S(tid),
                       .mm_hash = S(hash),
                       .nbytes = 4096,
                       .ndim = 1,
                       .shape = {2048},
                       .dtype = S("float16"),
                       .client_key = S(key)};
    return it;
}

/* One exchange of one item; the reply's first result in *x (its strings live in p). */
static int call(kvi_ecc_client *cli, const char *ep, uint32_t op, const kvi_ecc_item *it,
                kvi_ecc_request *q, kvi_ecc_reply *p)
{
    kvi_ecc_request_begin(q, op);
    if (it && kvi_ecc_request_add(q, it))
        return -1;
    return kvi_ecc_client_call(cli, ep, q, p);
}

/* ---- the attackers (their own processes) ---------------------------------------------------- */

#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "attack: %s:%d: %s (%s)\n", __FILE__, __LINE__, #c, kvt_last_error()); \
            return __LINE__ % 200 + 1;                                                             \
        }                                                                                          \
    } while (0)

/* Tries every way into the victim's transfer: reserve it, read its id, cancel, abandon or
 * complete it without the id, and spray bytes at guessed tags. */
static int attack_steal(const char *ep, const char *victim)
{
    kvi_ecc_client *cli;
    CHECK(kvi_ecc_client_create(TIMEOUT, NULL, &cli) == 0);
    kvi_ecc_request q;
    kvi_ecc_reply p;
    kvi_ecc_request_init(&q);
    kvi_ecc_reply_init(&p);
    kvi_ecc_item it = item(victim, "img-victim", EVIL);
    CHECK(call(cli, ep, KVT_ECC_RESERVE, &it, &q, &p) == 0);
    CHECK(p.results[0].code == KVT_EEXIST && p.results[0].reservation_id.len == 0);
    kvi_ecc_item st = {.transfer_id = S(victim)};
    CHECK(call(cli, ep, KVT_ECC_STATUS, &st, &q, &p) == 0);
    CHECK(p.results[0].found && p.results[0].reservation_id.len == 0);
    kvi_ecc_item cc = {.transfer_id = S(victim), .client_key = S(EVIL)};
    CHECK(call(cli, ep, KVT_ECC_CANCEL, &cc, &q, &p) == 0);
    CHECK(p.results[0].code != 0 && !p.results[0].cancelled);
    kvi_ecc_item ab = {.transfer_id = S(victim), .reservation_id = S(EVIL), .abandon = true};
    CHECK(call(cli, ep, KVT_ECC_CANCEL, &ab, &q, &p) == 0);
    CHECK(p.results[0].code == 0 && !p.results[0].cancelled);
    ab.refresh = true;
    CHECK(call(cli, ep, KVT_ECC_CANCEL, &ab, &q, &p) == 0);
    CHECK(!p.results[0].cancelled);
    kvi_ecc_item cm = {.transfer_id = S(victim), .reservation_id = S(EVIL)};
    CHECK(call(cli, ep, KVT_ECC_COMPLETE, &cm, &q, &p) == 0);
    CHECK(!p.results[0].completed);
    /* bytes at guessed tags: sends may complete, but no receive matches them */
    CHECK(call(cli, ep, KVT_ECC_DATA_ADDRESS, NULL, &q, &p) == 0);
    kvi_ucx *u;
    CHECK(kvi_ucx_create(&u) == 0);
    uint8_t junk[4096];
    memset(junk, 0x66, sizeof(junk));
    for (uint64_t tag = 1; tag <= 64; tag++)
        (void)kvi_ucx_send(u, p.data_addr, p.data_addr_len, junk, sizeof(junk),
                           tag * 0x9E3779B97F4A7C15ull, 200);
    kvi_ucx_destroy(u);
    kvi_ecc_request_release(&q);
    kvi_ecc_reply_release(&p);
    kvi_ecc_client_destroy(cli);
    return 0;
}

/* Plants a tombstone ahead of a transfer nobody reserved yet: without the owner key, and with
 * a made-up reservation id. Both must be refused. */
static int attack_tombstone(const char *ep, const char *future)
{
    kvi_ecc_client *cli;
    CHECK(kvi_ecc_client_create(TIMEOUT, NULL, &cli) == 0);
    kvi_ecc_request q;
    kvi_ecc_reply p;
    kvi_ecc_request_init(&q);
    kvi_ecc_reply_init(&p);
    kvi_ecc_item cc = {.transfer_id = S(future), .client_key = S(EVIL)};
    CHECK(call(cli, ep, KVT_ECC_CANCEL, &cc, &q, &p) == 0);
    CHECK(p.results[0].code != 0);
    kvi_ecc_item cr = {.transfer_id = S(future), .reservation_id = S(EVIL)};
    CHECK(call(cli, ep, KVT_ECC_CANCEL, &cr, &q, &p) == 0);
    CHECK(!p.results[0].cancelled);
    kvi_ecc_request_release(&q);
    kvi_ecc_reply_release(&p);
    kvi_ecc_client_destroy(cli);
    return 0;
}

/* Reserves its own transfer and completes it KVT_ECC_MAX_BATCH times in one message without
 * sending a byte: the server answers at once (pending), within the client's timeout. */
static int attack_flood(const char *ep)
{
    kvi_ecc_client *cli;
    CHECK(kvi_ecc_client_create(TIMEOUT, NULL, &cli) == 0);
    kvi_ecc_request q;
    kvi_ecc_reply p;
    kvi_ecc_request_init(&q);
    kvi_ecc_reply_init(&p);
    kvi_ecc_item it = item("flood", "img-flood", EVIL);
    CHECK(call(cli, ep, KVT_ECC_RESERVE, &it, &q, &p) == 0 && p.results[0].write);
    char rid[KVT_EC_RID_LEN + 1];
    memcpy(rid, p.results[0].reservation_id.ptr, sizeof(rid));
    kvi_ecc_item cm = {.transfer_id = S("flood"), .reservation_id = S(rid)};
    kvi_ecc_request_begin(&q, KVT_ECC_COMPLETE_BATCH);
    for (uint32_t i = 0; i < KVT_ECC_MAX_BATCH; i++)
        CHECK(kvi_ecc_request_add(&q, &cm) == 0);
    CHECK(kvi_ecc_client_call(cli, ep, &q, &p) == 0);
    for (uint32_t i = 0; i < p.n; i++)
        CHECK(p.results[i].pending);
    /* and it walks away: the writer is reaped at its TTL */
    kvi_ecc_request_release(&q);
    kvi_ecc_reply_release(&p);
    kvi_ecc_client_destroy(cli);
    return 0;
}

/* A producer pushing into a consumer that answers a crafted data address: the push fails with
 * a message; UCX never sees the address. */
static int attack_victim_of_a_crafted_address(const char *ep)
{
    kvt_ec_net_config nc;
    kvt_ec_net_config_init(&nc);
    nc.control_timeout_ms = nc.write_timeout_ms = TIMEOUT;
    kvt_ec_net_consumer *net;
    CHECK(kvt_ec_net_consumer_create(&nc, &net) == 0);
    kvt_ec_consumer_ops ops = kvt_ec_net_consumer_ops(net);
    kvt_ec_item it = {"img-x", 5, 4096, 1, {2048}, "float16", 7};
    kvt_ec_reply r;
    CHECK(ops.reserve(ops.ctx, ep, 0, "xfer-x", 6, &it, &r) == 0);
    uint8_t src[4096] = {0};
    CHECK(ops.write(ops.ctx, ep, 0, &r, src, sizeof(src)) == KVT_EPROTO);
    CHECK(strstr(kvt_last_error(), "data address") != NULL);
    kvt_ec_net_consumer_destroy(net);
    return 0;
}

static int attack_main(int argc, char **argv)
{
    const char *what = argv[2], *ep = argv[3];
    if (strcmp(what, "steal") == 0 && argc == 5)
        return attack_steal(ep, argv[4]);
    if (strcmp(what, "tombstone") == 0 && argc == 5)
        return attack_tombstone(ep, argv[4]);
    if (strcmp(what, "flood") == 0)
        return attack_flood(ep);
    if (strcmp(what, "address") == 0)
        return attack_victim_of_a_crafted_address(ep);
    return 99;
}

/* Runs an attacker process to its end; it must exit 0 (no signal, no abort). */
static void run_attacker(const char *what, const char *ep, const char *arg)
{
    char *argv[] = {g_self, "attack", (char *)what, (char *)ep, (char *)arg, NULL};
    if (!arg)
        argv[4] = NULL;
    pid_t pid;
    assert_int_equal(posix_spawn(&pid, g_self, NULL, NULL, argv, environ), 0);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fail_msg("attacker %s: %s %d", what, WIFSIGNALED(st) ? "killed by signal" : "exit",
                 WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
}

/* ---- the consumer (this process) ------------------------------------------------------------ */

typedef struct consumer {
    uint8_t *buf;
    kvt_ec_shard *shard;
    kvt_ec_server *srv;
    char ep[64];
} consumer;

static void consumer_start(consumer *c, uint64_t ttl_ns)
{
    memset(c, 0, sizeof(*c));
    c->buf = aligned_alloc(256, CAP);
    kvt_ec_shard_config cfg;
    kvt_ec_shard_config_init(&cfg);
    cfg.base = c->buf;
    cfg.capacity = CAP;
    cfg.ttl_ns = ttl_ns;
    KVT_OK_(kvt_ec_shard_create(&cfg, &c->shard));
    kvt_ec_server_config sc;
    kvt_ec_server_config_init(&sc);
    sc.host = "127.0.0.1";
    sc.poll_ms = 20;
    sc.expire_interval_ns = 50000000ull;
    sc.owner_key = OWNER;
    int rc = KVT_EIO;
    for (uint32_t i = 0; i < 200 && rc; i++) {
        sc.base_port = 20000 + (uint32_t)((getpid() * 6151u + i * 389u) % 30000u);
        rc = kvt_ec_server_start(&sc, c->shard, &c->srv);
    }
    KVT_OK_(rc);
    snprintf(c->ep, sizeof(c->ep), "tcp://127.0.0.1:%u", kvt_ec_server_port(c->srv));
}

static int writers_of(kvt_ec_shard *sh, void *arg)
{
    *(uint32_t *)arg = kvt_ec_shard_writers(sh);
    return 0;
}

static int stats_of(kvt_ec_shard *sh, void *arg)
{
    kvt_ec_shard_get_stats(sh, arg);
    return 0;
}

static int state_of(kvt_ec_shard *sh, void *arg)
{
    return kvt_ec_shard_state(sh, arg, (uint32_t)strlen(arg));
}

static uint32_t writers(consumer *c)
{
    uint32_t n = 0;
    KVT_OK_(kvt_ec_server_with_shard(c->srv, writers_of, &n));
    return n;
}

/* Waits until the shard has no writer left. */
static void wait_no_writers(consumer *c)
{
    KVT_WAIT_UNTIL(writers(c) == 0, "no writer left");
}

static void consumer_stop(consumer *c)
{
    wait_no_writers(c);
    kvt_ec_shard_stats st;
    KVT_OK_(kvt_ec_server_with_shard(c->srv, stats_of, &st));
    assert_int_equal(st.capacity - st.free_bytes, st.held_bytes); /* nothing lost */
    kvt_ec_server_stop(c->srv);
    KVT_OK_(kvt_ec_shard_destroy(c->shard));
    free(c->buf);
}

typedef struct honest {
    kvi_ecc_client *cli;
    kvi_ecc_request q;
    kvi_ecc_reply p;
    kvi_ucx *ucx;
    char rid[KVT_EC_RID_LEN + 1];
    uint64_t tag, off;
} honest;

static void honest_reserve(honest *h, consumer *c, const char *tid, const char *hash)
{
    memset(h, 0, sizeof(*h));
    KVT_OK_(kvi_ecc_client_create(TIMEOUT, NULL, &h->cli));
    kvi_ecc_request_init(&h->q);
    kvi_ecc_reply_init(&h->p);
    KVT_OK_(kvi_ucx_create(&h->ucx));
    kvi_ecc_item it = item(tid, hash, HONEST);
    KVT_OK_(call(h->cli, c->ep, KVT_ECC_RESERVE, &it, &h->q, &h->p));
    assert_true(h->p.results[0].write);
    memcpy(h->rid, h->p.results[0].reservation_id.ptr, sizeof(h->rid));
    h->tag = h->p.results[0].tag;
    h->off = h->p.results[0].offset;
}

/* Writes its bytes, completes, and sees them ready and intact on the shard. */
static void honest_finish(honest *h, consumer *c, const char *tid)
{
    KVT_OK_(call(h->cli, c->ep, KVT_ECC_DATA_ADDRESS, NULL, &h->q, &h->p));
    uint8_t b[4096];
    memset(b, 0x42, sizeof(b));
    KVT_OK_(
        kvi_ucx_send(h->ucx, h->p.data_addr, h->p.data_addr_len, b, sizeof(b), h->tag, TIMEOUT));
    kvi_ecc_item cm = {.transfer_id = S(tid), .reservation_id = S(h->rid)};
    KVT_OK_(call(h->cli, c->ep, KVT_ECC_COMPLETE, &cm, &h->q, &h->p));
    assert_true(h->p.results[0].completed);
    KVT_WAIT_UNTIL(kvt_ec_server_with_shard(c->srv, state_of, (void *)tid) == KVT_EC_READY,
                   "the item ready");
    for (int i = 0; i < 4096; i++) /* (ready: no writer writes it any more) */
        assert_int_equal(c->buf[h->off + (uint64_t)i], 0x42);
    kvi_ecc_item ab = {.transfer_id = S(tid), .reservation_id = S(h->rid), .abandon = true};
    KVT_OK_(call(h->cli, c->ep, KVT_ECC_CANCEL, &ab, &h->q, &h->p)); /* release it */
    kvi_ucx_destroy(h->ucx);
    kvi_ecc_request_release(&h->q);
    kvi_ecc_reply_release(&h->p);
    kvi_ecc_client_destroy(h->cli);
}

static void strangers_cannot_touch_a_reservation(void **state)
{
    (void)state;
    consumer c;
    consumer_start(&c, 300ull * 1000000000ull);
    honest h;
    honest_reserve(&h, &c, "victim", "img-victim");
    run_attacker("steal", c.ep, "victim");
    run_attacker("tombstone", c.ep, "future");
    kvt_ec_server_stats ss;
    kvt_ec_server_get_stats(c.srv, &ss);
    assert_true(ss.refused >= 3);
    honest_finish(&h, &c, "victim");
    /* the transfer the attacker tried to cancel in advance is reserved normally */
    honest f;
    honest_reserve(&f, &c, "future", "img-future");
    honest_finish(&f, &c, "future");
    consumer_stop(&c);
}

static void a_completion_flood_is_answered_at_once_and_its_writer_reaped(void **state)
{
    (void)state;
    consumer c;
    consumer_start(&c, 1000000000ull); /* TTL 1 s: the flooder's writer is reaped after it */
    run_attacker("flood", c.ep, NULL);
    honest h; /* served meanwhile */
    honest_reserve(&h, &c, "t", "img-t");
    honest_finish(&h, &c, "t");
    wait_no_writers(&c);
    kvt_ec_server_stats ss;
    kvt_ec_server_get_stats(c.srv, &ss);
    assert_int_equal(ss.writers_reaped, 1);
    assert_true(ss.completes_pending >= 1); /* the flood named one reservation */
    consumer_stop(&c);
}

/* The consumer's scheduler cancels a transfer whose producer then dies without writing:
 * deferred (the writer might still write), then reaped a TTL later. */
static void a_cancelled_writer_whose_producer_died_is_reaped(void **state)
{
    (void)state;
    consumer c;
    consumer_start(&c, 1000000000ull);
    honest h;
    honest_reserve(&h, &c, "gone", "img-gone");
    kvi_ecc_item cc = {.transfer_id = S("gone"), .client_key = S(OWNER)};
    KVT_OK_(call(h.cli, c.ep, KVT_ECC_CANCEL, &cc, &h.q, &h.p));
    assert_true(h.p.results[0].cancelled);
    assert_int_equal(writers(&c), 1); /* the memory stays the writer's for now */
    kvi_ucx_destroy(h.ucx);           /* the producer is gone */
    kvi_ecc_request_release(&h.q);
    kvi_ecc_reply_release(&h.p);
    kvi_ecc_client_destroy(h.cli);
    wait_no_writers(&c);
    kvt_ec_server_stats ss;
    kvt_ec_server_get_stats(c.srv, &ss);
    assert_int_equal(ss.writers_reaped, 1);
    consumer_stop(&c);
}

/* Thousands of followers of one writer expire in one pass, and the server keeps answering. */
static void many_followers_expire_together(void **state)
{
    (void)state;
    consumer c;
    consumer_start(&c, 5000000000ull); /* 5 s: long enough to reserve them all, even slowly */
    honest h;
    honest_reserve(&h, &c, "w", "img-w");
    char(*tids)[16] = calloc(3 * KVT_ECC_MAX_BATCH, 16);
    for (uint32_t b = 0; b < 3; b++) {
        kvi_ecc_request_begin(&h.q, KVT_ECC_RESERVE_BATCH);
        for (uint32_t i = 0; i < KVT_ECC_MAX_BATCH; i++) {
            char *t = tids[b * KVT_ECC_MAX_BATCH + i];
            snprintf(t, 16, "f%u", b * KVT_ECC_MAX_BATCH + i);
            kvi_ecc_item it = item(t, "img-w", HONEST);
            KVT_OK_(kvi_ecc_request_add(&h.q, &it));
        }
        KVT_OK_(kvi_ecc_client_call(h.cli, c.ep, &h.q, &h.p));
        for (uint32_t i = 0; i < h.p.n; i++)
            assert_true(h.p.results[i].code == 0 && !h.p.results[i].write);
    }
    /* expired */
    KVT_WAIT_UNTIL(kvt_ec_server_with_shard(c.srv, state_of, (void *)"f12287") != KVT_EC_WRITING,
                   "f12287's reservation expired");
    kvi_ecc_item s = {.transfer_id = S("w")};
    KVT_OK_(call(h.cli, c.ep, KVT_ECC_STATUS, &s, &h.q, &h.p));
    free(tids);
    kvi_ecc_item ab = {.transfer_id = S("w"), .reservation_id = S(h.rid), .abandon = true};
    KVT_OK_(call(h.cli, c.ep, KVT_ECC_CANCEL, &ab, &h.q, &h.p));
    kvi_ucx_destroy(h.ucx);
    kvi_ecc_request_release(&h.q);
    kvi_ecc_reply_release(&h.p);
    kvi_ecc_client_destroy(h.cli);
    consumer_stop(&c);
}

/* ---- a consumer that lies: a crafted data address ------------------------------------------ */

typedef struct liar {
    void *ctx, *rep;
    char ep[64];
    pthread_t th;
} liar;

static void *liar_main(void *arg)
{
    liar *l = arg;
    kvi_ecc_request q;
    kvi_ecc_reply p;
    kvi_ecc_request_init(&q);
    kvi_ecc_reply_init(&p);
    uint8_t in[65536], out[65536];
    for (int served = 0; served < 3; served++) { /* peers, reserve, data_address */
        int n = zmq_recv(l->rep, in, sizeof(in), 0);
        if (n < 0 || kvi_ecc_request_decode(&q, in, (size_t)n))
            break;
        kvi_ecc_reply_begin(&p, q.op);
        if (q.op == KVT_ECC_PEERS) {
            p.n_ports = 1;
            p.ports[0] = (uint32_t)atoi(strrchr(l->ep, ':') + 1);
        } else if (q.op == KVT_ECC_RESERVE) {
            kvi_ecc_result x = {.reservation_id = S(HONEST), .nbytes = 4096, .write = true};
            x.tag = kvi_ecc_rid_tag(HONEST);
            (void)kvi_ecc_reply_add(&p, &x);
        } else if (q.op == KVT_ECC_DATA_ADDRESS) {
            uint8_t crafted[64];
            memset(crafted, 0xff, sizeof(crafted)); /* a header byte no UCX packs */
            (void)kvi_ecc_reply_set_address(&p, crafted, sizeof(crafted));
        }
        size_t len;
        if (kvi_ecc_reply_encode(&p, out, sizeof(out), &len))
            break;
        zmq_send(l->rep, out, len, 0);
    }
    kvi_ecc_request_release(&q);
    kvi_ecc_reply_release(&p);
    return NULL;
}

static void a_crafted_data_address_fails_the_push_cleanly(void **state)
{
    (void)state;
    liar l;
    l.ctx = zmq_ctx_new();
    l.rep = zmq_socket(l.ctx, ZMQ_REP);
    int zero = 0, t = 2 * TIMEOUT;
    zmq_setsockopt(l.rep, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(l.rep, ZMQ_RCVTIMEO, &t, sizeof(t));
    assert_int_equal(zmq_bind(l.rep, "tcp://127.0.0.1:*"), 0);
    size_t ll = sizeof(l.ep);
    assert_int_equal(zmq_getsockopt(l.rep, ZMQ_LAST_ENDPOINT, l.ep, &ll), 0);
    pthread_create(&l.th, NULL, liar_main, &l);
    run_attacker("address", l.ep, NULL); /* here the attacker is the consumer */
    pthread_join(l.th, NULL);
    zmq_close(l.rep);
    zmq_ctx_term(l.ctx);
}

int main(int argc, char **argv)
{
    if (argc >= 4 && strcmp(argv[1], "attack") == 0)
        return attack_main(argc, argv);
    ssize_t n = readlink("/proc/self/exe", g_self, sizeof(g_self) - 1);
    assert_true(n > 0);
    g_self[n] = 0;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(strangers_cannot_touch_a_reservation),
        cmocka_unit_test(a_completion_flood_is_answered_at_once_and_its_writer_reaped),
        cmocka_unit_test(a_cancelled_writer_whose_producer_died_is_reaped),
        cmocka_unit_test(many_followers_expire_together),
        cmocka_unit_test(a_crafted_data_address_fails_the_push_cleanly),
    };
    return kvt_test_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
