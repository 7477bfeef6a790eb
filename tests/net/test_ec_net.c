/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Encoder-cache transfer over the network, end to end on loopback: a producer
 * (kvt_ec_producer over kvt_ec_net_consumer: ZeroMQ control, UCX data) pushes items into a
 * consumer with two shards (kvt_ec_shard behind kvt_ec_server, a UCX receive posted on every
 * writer's region). Checked: readiness events from every shard, the bytes on every shard
 * (hashed), duplicate pushes sharing one write, a completion refused until its bytes landed,
 * an abandon ending the receive before the memory is released, a consumer shard that is gone
 * failing the push without hanging, and, in a forked process, a producer killed mid-run.
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <zmq.h>

#include "kvt_test.h"
#include "net/ec_ctl.h"
#include "net/ucx.h"

#define SHARDS  2
#define CAP     (96u << 20)
#define TIMEOUT 10000

typedef struct consumer {
    uint8_t *buf[SHARDS];
    kvt_ec_shard *shard[SHARDS];
    kvt_ec_server *srv[SHARDS];
    char addr[64];
    void *zctx, *pull;
} consumer;

static void consumer_start_ttl(consumer *c, bool data_plane, uint64_t ttl_ns);

/* CURVE for the next consumer_start (NULL: none): the servers' secret key, the admitted
 * clients, and the key pair its own event puller uses. */
static const char *g_curve_secret, *const *g_curve_clients, *g_curve_pull[3];

static void consumer_start(consumer *c, bool data_plane)
{
    consumer_start_ttl(c, data_plane, 0);
}

static void consumer_start_ttl(consumer *c, bool data_plane, uint64_t ttl_ns)
{
    memset(c, 0, sizeof(*c));
    kvt_ec_server_config sc;
    kvt_ec_server_config_init(&sc);
    sc.host = "127.0.0.1";
    sc.tp_size = SHARDS;
    sc.poll_ms = 20;
    sc.data_plane = data_plane;
    sc.expire_interval_ns = 50000000ull;
    sc.curve_secret_key = g_curve_secret;
    sc.curve_clients = g_curve_clients;
    for (uint32_t k = 0; k < SHARDS; k++) {
        c->buf[k] = aligned_alloc(256, CAP);
        kvt_ec_shard_config cfg;
        kvt_ec_shard_config_init(&cfg);
        cfg.base = c->buf[k];
        cfg.capacity = CAP;
        if (ttl_ns)
            cfg.ttl_ns = ttl_ns;
        KVT_OK_(kvt_ec_shard_create(&cfg, &c->shard[k]));
    }
    int rc = KVT_EIO;
    for (uint32_t i = 0; i < 200 && rc; i++) { /* a free pair of ports */
        sc.base_port = 20000 + (uint32_t)((getpid() * 7927u + i * 257u) % 30000u);
        sc.tp_rank = 0;
        rc = kvt_ec_server_start(&sc, c->shard[0], &c->srv[0]);
        if (!rc) {
            sc.tp_rank = 1;
            if ((rc = kvt_ec_server_start(&sc, c->shard[1], &c->srv[1]))) {
                kvt_ec_server_stop(c->srv[0]);
                c->srv[0] = NULL;
            }
        }
    }
    KVT_OK_(rc);
    snprintf(c->addr, sizeof(c->addr), "tcp://127.0.0.1:%u", kvt_ec_server_port(c->srv[0]));
    c->zctx = zmq_ctx_new();
    c->pull = zmq_socket(c->zctx, ZMQ_PULL);
    int t = TIMEOUT, zero = 0;
    zmq_setsockopt(c->pull, ZMQ_RCVTIMEO, &t, sizeof(t));
    zmq_setsockopt(c->pull, ZMQ_LINGER, &zero, sizeof(zero));
    if (g_curve_secret) {
        zmq_setsockopt(c->pull, ZMQ_CURVE_SERVERKEY, g_curve_pull[0], 40);
        zmq_setsockopt(c->pull, ZMQ_CURVE_PUBLICKEY, g_curve_pull[1], 40);
        zmq_setsockopt(c->pull, ZMQ_CURVE_SECRETKEY, g_curve_pull[2], 40);
    }
    for (uint32_t k = 0; k < SHARDS; k++) {
        assert_int_equal(zmq_connect(c->pull, kvt_ec_server_event_endpoint(c->srv[k])), 0);
    }
}

static void consumer_stop(consumer *c)
{
    zmq_close(c->pull);
    zmq_ctx_term(c->zctx);
    for (uint32_t k = 0; k < SHARDS; k++) {
        kvt_ec_server_stop(c->srv[k]);
        KVT_OK_(kvt_ec_shard_destroy(c->shard[k]));
        free(c->buf[k]);
    }
}

/* Item i's bytes: a function of (seed, i) so that any process can check them. */
static void fill(uint8_t *p, uint64_t n, uint64_t seed)
{
    uint64_t x = seed * 0x9E3779B97F4A7C15ull | 1;
    for (uint64_t i = 0; i < n; i += 8) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        memcpy(p + i, &x, n - i < 8 ? n - i : 8);
    }
}

typedef struct take_arg {
    const char *tid, *hash;
    uint64_t seed, nbytes;
    int ok;
} take_arg;

/* The consumer's worker: the READY item becomes a resident it reads, then retires. */
static int take_and_check(kvt_ec_shard *sh, void *arg)
{
    take_arg *a = arg;
    kvt_slab_view v;
    int rc = kvt_ec_shard_take(sh, a->tid, (uint32_t)strlen(a->tid), a->hash,
                               (uint32_t)strlen(a->hash), NULL, &v);
    if (rc)
        return rc;
    uint8_t *want = malloc(a->nbytes);
    fill(want, a->nbytes, a->seed);
    a->ok = v.nbytes == a->nbytes && memcmp(v.ptr, want, a->nbytes) == 0;
    free(want);
    return kvt_ec_shard_retire(sh, a->hash, (uint32_t)strlen(a->hash), NULL) == 1 ? 0 : KVT_ESTATE;
}

static int count_writers(kvt_ec_shard *sh, void *arg)
{
    *(uint32_t *)arg = kvt_ec_shard_writers(sh);
    return 0;
}

typedef struct region_check {
    const uint8_t *p;
    size_t n;
    uint8_t byte;
    bool ok;
} region_check;

static int status_of(kvt_ec_shard *sh, void *arg);

/* 1 when the transfer named arg is READY on the shard. */
static int ready_of(kvt_ec_shard *sh, void *arg)
{
    return kvt_ec_shard_state(sh, arg, (uint32_t)strlen(arg)) == KVT_EC_READY;
}

static int check_region(kvt_ec_shard *sh, void *arg)
{
    (void)sh;
    region_check *r = arg;
    r->ok = true;
    for (size_t i = 0; i < r->n; i++)
        r->ok &= r->p[i] == r->byte;
    return 0;
}

static kvt_str S(const char *s)
{
    return (kvt_str){s, (uint32_t)strlen(s)};
}

static void spec_of(kvt_ec_push_spec *s, const char *to, const char *tid, const char *hash,
                    uint64_t rows)
{
    memset(s, 0, sizeof(*s));
    s->mm_hash = S(hash);
    s->ndim = 2;
    s->shape[0] = rows;
    s->shape[1] = 1024;
    s->dtype = S("bfloat16");
    s->nbytes = rows * 2048;
    s->consumer_zmq = S(to);
    s->transfer_id = S(tid);
    s->request_id = S("req");
}

static uint32_t drain_events(consumer *c, uint32_t want, char (*tids)[64])
{
    uint32_t got = 0;
    while (got < want) {
        uint8_t buf[2048];
        int n = zmq_recv(c->pull, buf, sizeof(buf), 0);
        if (n <= 0)
            break;
        kvi_ecc_event e;
        kvi_ecc_event_init(&e);
        KVT_OK_(kvi_ecc_event_decode(&e, buf, (size_t)n));
        assert_false(e.abandoned);
        if (tids)
            snprintf(tids[got], 64, "%s", e.transfer_id.ptr);
        got++;
        kvi_ecc_event_release(&e);
    }
    return got;
}

/* A producer over the network (nc NULL: default options). */
static void producer_open(const kvt_ec_net_config *nc, kvt_ec_net_consumer **net,
                          kvt_ec_producer **prod)
{
    kvt_ec_net_config d;
    kvt_ec_net_config_init(&d);
    KVT_OK_(kvt_ec_net_consumer_create(nc ? nc : &d, net));
    kvt_ec_producer_config pc;
    kvt_ec_producer_config_init(&pc);
    pc.ops = kvt_ec_net_consumer_ops(*net);
    KVT_OK_(kvt_ec_producer_create(&pc, prod));
}

static void pushes_land_on_every_shard_byte_for_byte(void **state)
{
    (void)state;
    consumer c;
    consumer_start(&c, true);
    kvt_ec_net_consumer *net;
    kvt_ec_producer *prod;
    producer_open(NULL, &net, &prod);
    /* items from 2 KiB to 8 MiB, one pushed twice under two transfer ids */
    enum { N = 12 };
    uint64_t rows[N];
    uint8_t *src[N];
    char tid[N + 1][32], hash[N][32];
    uint64_t rng = 7;
    for (int i = 0; i < N; i++) {
        rows[i] = 1ull << kvt_test_below(&rng, 13); /* 1..4096 rows of 2 KiB */
        snprintf(tid[i], sizeof(tid[i]), "xfer-%d", i);
        snprintf(hash[i], sizeof(hash[i]), "img-%d", i);
        src[i] = malloc(rows[i] * 2048);
        fill(src[i], rows[i] * 2048, (uint64_t)i + 1);
        kvt_ec_push_spec s;
        spec_of(&s, c.addr, tid[i], hash[i], rows[i]);
        KVT_OK_(kvt_ec_producer_push(prod, &s));
    }
    snprintf(tid[N], sizeof(tid[N]), "xfer-dup");
    kvt_ec_push_spec dup;
    spec_of(&dup, c.addr, tid[N], hash[3], rows[3]);
    KVT_OK_(kvt_ec_producer_push(prod, &dup));
    for (int i = 0; i < N; i++) /* item 3 has two records */
        assert_int_equal(kvt_ec_producer_bind_source(prod, hash[i], (uint32_t)strlen(hash[i]),
                                                     src[i], rows[i] * 2048, NULL),
                         i == 3 ? 2 : 1);
    assert_true(kvt_ec_producer_dispatch(prod) >= N);
    kvt_ec_producer_stats ps;
    kvt_ec_producer_get_stats(prod, &ps);
    assert_int_equal(ps.failed, 0);
    assert_int_equal(ps.writes, N * SHARDS); /* the duplicate followed: no second write */
    /* every transfer ready on every shard */
    assert_int_equal(drain_events(&c, (N + 1) * SHARDS, NULL), (N + 1) * SHARDS);
    for (int i = 0; i < N; i++)
        for (uint32_t k = 0; k < SHARDS; k++) {
            take_arg a = {tid[i], hash[i], (uint64_t)i + 1, rows[i] * 2048, 0};
            KVT_OK_(kvt_ec_server_with_shard(c.srv[k], take_and_check, &a));
            assert_true(a.ok);
        }
    kvt_ec_server_stats ss;
    kvt_ec_server_get_stats(c.srv[0], &ss);
    assert_int_equal(ss.receives_posted, N);
    assert_int_equal(ss.receives_done, N);
    assert_int_equal(ss.receives_failed, 0);
    /* an item the consumer still holds (resident, retired) is served without a transfer */
    kvt_ec_push_spec again;
    spec_of(&again, c.addr, "xfer-again", hash[0], rows[0]);
    KVT_OK_(kvt_ec_producer_push(prod, &again));
    assert_int_equal(kvt_ec_producer_bind_source(prod, hash[0], (uint32_t)strlen(hash[0]), src[0],
                                                 rows[0] * 2048, NULL),
                     1);
    assert_int_equal(kvt_ec_producer_dispatch(prod), 1);
    assert_int_equal(kvt_ec_producer_state(prod, "xfer-again", 10), KVT_ECP_DONE);
    kvt_ec_producer_get_stats(prod, &ps);
    assert_int_equal(ps.writes, N * SHARDS);                  /* no bytes moved */
    assert_int_equal(drain_events(&c, SHARDS, NULL), SHARDS); /* ready at once (a cached hit) */
    kvt_ec_producer_destroy(prod);
    kvt_ec_net_consumer_destroy(net);
    for (int i = 0; i < N; i++)
        free(src[i]);
    consumer_stop(&c);
}

/* A step's items pushed together (push_many: one reserve message per shard; one dispatch: the
 * writes in flight eight at a time, one completion message per shard): one item larger than a
 * shard's buffer is refused by the shards and fails alone, every other item lands byte for
 * byte on every shard. */
static void a_batch_of_pushes_lands_and_a_refused_item_fails_alone(void **state)
{
    (void)state;
    consumer c;
    consumer_start(&c, true);
    kvt_ec_net_config nc;
    kvt_ec_net_config_init(&nc);
    nc.write_window = 8;
    kvt_ec_net_consumer *net;
    kvt_ec_producer *prod;
    producer_open(&nc, &net, &prod);
    enum { N = 200, BIG = 77 };
    static char tid[N][32], hash[N][32];
    static kvt_ec_push_spec s[N];
    uint8_t *src = malloc(64 * 2048);
    fill(src, 64 * 2048, 42);
    for (int i = 0; i < N; i++) {
        snprintf(tid[i], sizeof(tid[i]), "batch-%d", i);
        snprintf(hash[i], sizeof(hash[i]), "bimg-%d", i);
        spec_of(&s[i], c.addr, tid[i], hash[i], i == BIG ? (CAP / 2048) + 1 : 64);
    }
    KVT_OK_(kvt_ec_producer_push_many(prod, s, N));
    assert_int_equal(kvt_ec_producer_state(prod, tid[BIG], (uint32_t)strlen(tid[BIG])),
                     KVT_ECP_FAILED);
    for (int i = 0; i < N; i++)
        if (i != BIG)
            assert_int_equal(kvt_ec_producer_bind_source(prod, hash[i], (uint32_t)strlen(hash[i]),
                                                         src, 64 * 2048, NULL),
                             1);
    assert_int_equal(kvt_ec_producer_dispatch(prod), N - 1);
    kvt_ec_push_failure f;
    assert_int_equal(kvt_ec_producer_take_failures(prod, &f, 1), 1);
    assert_string_equal(f.transfer_id, tid[BIG]);
    assert_non_null(strstr(f.error, "reserv"));
    kvt_ec_producer_stats ps;
    kvt_ec_producer_get_stats(prod, &ps);
    assert_int_equal(ps.done, N - 1);
    assert_int_equal(ps.writes, (N - 1) * SHARDS);
    assert_int_equal(drain_events(&c, (N - 1) * SHARDS, NULL), (N - 1) * SHARDS);
    for (int i = 0; i < N; i++)
        for (uint32_t k = 0; i != BIG && k < SHARDS; k++) {
            take_arg a = {tid[i], hash[i], 42, 64 * 2048, 0};
            KVT_OK_(kvt_ec_server_with_shard(c.srv[k], take_and_check, &a));
            assert_true(a.ok);
        }
    kvt_ec_producer_destroy(prod);
    kvt_ec_net_consumer_destroy(net);
    free(src);
    consumer_stop(&c);
}

/* A completion sent before any byte arrived is answered at once, pending (the server thread
 * never waits on it); an abandon ends the receive first and only then releases the region; a
 * late send to that tag lands nowhere; a pending completion whose bytes land later becomes
 * ready by itself. */
static void completion_waits_for_the_bytes_and_abandon_ends_the_receive(void **state)
{
    (void)state;
    consumer c;
    consumer_start(&c, true);
    kvi_ecc_client *cli;
    KVT_OK_(kvi_ecc_client_create(TIMEOUT, NULL, &cli));
    kvi_ecc_request q;
    kvi_ecc_reply p;
    kvi_ecc_request_init(&q);
    kvi_ecc_reply_init(&p);
    char ep[64];
    snprintf(ep, sizeof(ep), "tcp://127.0.0.1:%u", kvt_ec_server_port(c.srv[0]));
    kvi_ecc_item it = {.transfer_id = S("t1"),
                       .mm_hash = S("h1"),
                       .nbytes = 4096,
                       .ndim = 1,
                       .shape = {2048},
                       .dtype = S("float16"),
                       .client_key = S("00000000000000000000000000000001")};
    kvi_ecc_request_begin(&q, KVT_ECC_RESERVE);
    KVT_OK_(kvi_ecc_request_add(&q, &it));
    KVT_OK_(kvi_ecc_client_call(cli, ep, &q, &p));
    char rid[KVT_EC_RID_LEN + 1];
    memcpy(rid, p.results[0].reservation_id.ptr, sizeof(rid));
    /* complete without writing, 4096 times in one message: answered at once, pending */
    kvi_ecc_item cm = {.transfer_id = S("t1"), .reservation_id = S(rid)};
    kvi_ecc_request_begin(&q, KVT_ECC_COMPLETE_BATCH);
    for (int i = 0; i < (int)KVT_ECC_MAX_BATCH; i++)
        KVT_OK_(kvi_ecc_request_add(&q, &cm));
    KVT_OK_(kvi_ecc_client_call(cli, ep, &q, &p));
    for (uint32_t i = 0; i < p.n; i++)
        assert_true(p.results[i].code == 0 && p.results[i].completed && p.results[i].pending &&
                    !p.results[i].became_ready);
    assert_int_equal(kvt_ec_server_with_shard(c.srv[0], status_of, (void *)"t1"), 1);
    /* the writer abandons: the receive is cancelled, then the memory freed */
    kvi_ecc_item ab = {.transfer_id = S("t1"), .reservation_id = S(rid), .abandon = true};
    kvi_ecc_request_begin(&q, KVT_ECC_CANCEL);
    KVT_OK_(kvi_ecc_request_add(&q, &ab));
    KVT_OK_(kvi_ecc_client_call(cli, ep, &q, &p));
    assert_true(p.results[0].cancelled);
    kvt_ec_server_stats ss;
    kvt_ec_server_get_stats(c.srv[0], &ss);
    assert_int_equal(ss.completes_pending, 1); /* one receive, however often it was named */
    assert_int_equal(ss.receives_cancelled, 1);
    /* a send with the old tag now lands nowhere: the region is someone else's next */
    kvi_ucx *u;
    KVT_OK_(kvi_ucx_create(&u));
    kvi_ecc_request_begin(&q, KVT_ECC_DATA_ADDRESS);
    KVT_OK_(kvi_ecc_client_call(cli, ep, &q, &p));
    kvi_ecc_item it2 = it;
    it2.transfer_id = S("t2"), it2.mm_hash = S("h2");
    kvi_ecc_reply p2;
    kvi_ecc_reply_init(&p2);
    kvi_ecc_request_begin(&q, KVT_ECC_RESERVE);
    KVT_OK_(kvi_ecc_request_add(&q, &it2));
    KVT_OK_(kvi_ecc_client_call(cli, ep, &q, &p2)); /* probably the same region as t1 */
    uint8_t junk[4096];
    memset(junk, 0x5a, sizeof(junk));
    KVT_OK_(kvi_ucx_send(u, p.data_addr, p.data_addr_len, junk, sizeof(junk), kvi_ecc_rid_tag(rid),
                         TIMEOUT));
    uint8_t good[4096];
    memset(good, 0x11, sizeof(good));
    KVT_OK_(kvi_ucx_send(u, p.data_addr, p.data_addr_len, good, sizeof(good), p2.results[0].tag,
                         TIMEOUT));
    kvi_ecc_item cm2 = {.transfer_id = S("t2"), .reservation_id = p2.results[0].reservation_id};
    kvi_ecc_request_begin(&q, KVT_ECC_COMPLETE);
    KVT_OK_(kvi_ecc_request_add(&q, &cm2));
    KVT_OK_(kvi_ecc_client_call(cli, ep, &q, &p));
    assert_true(p.results[0].completed); /* at once, or pending until the bytes land */
    /* ready means landed */
    KVT_WAIT_UNTIL(kvt_ec_server_with_shard(c.srv[0], ready_of, (void *)"t2") == 1, "t2 ready");
    region_check rc = {c.buf[0] + p2.results[0].offset, 4096, 0x11, false};
    KVT_OK_(kvt_ec_server_with_shard(c.srv[0], check_region, &rc)); /* under the server's lock */
    assert_true(rc.ok);
    /* completed first, written after: pending, then ready once the bytes land */
    kvi_ecc_item it3 = it;
    it3.transfer_id = S("t3"), it3.mm_hash = S("h3");
    kvi_ecc_request_begin(&q, KVT_ECC_RESERVE);
    KVT_OK_(kvi_ecc_request_add(&q, &it3));
    KVT_OK_(kvi_ecc_client_call(cli, ep, &q, &p2));
    char rid3[KVT_EC_RID_LEN + 1];
    memcpy(rid3, p2.results[0].reservation_id.ptr, sizeof(rid3));
    uint64_t tag3 = p2.results[0].tag, off3 = p2.results[0].offset;
    kvi_ecc_item cm3 = {.transfer_id = S("t3"), .reservation_id = S(rid3)};
    kvi_ecc_request_begin(&q, KVT_ECC_COMPLETE);
    KVT_OK_(kvi_ecc_request_add(&q, &cm3));
    KVT_OK_(kvi_ecc_client_call(cli, ep, &q, &p2));
    assert_true(p2.results[0].completed && p2.results[0].pending);
    assert_int_equal(kvt_ec_server_with_shard(c.srv[0], ready_of, (void *)"t3"), 0);
    kvi_ecc_request_begin(&q, KVT_ECC_DATA_ADDRESS);
    KVT_OK_(kvi_ecc_client_call(cli, ep, &q, &p));
    memset(good, 0x33, sizeof(good));
    KVT_OK_(kvi_ucx_send(u, p.data_addr, p.data_addr_len, good, sizeof(good), tag3, TIMEOUT));
    /* the server's loop completes it */
    KVT_WAIT_UNTIL(kvt_ec_server_with_shard(c.srv[0], ready_of, (void *)"t3") == 1, "t3 ready");
    region_check rc3 = {c.buf[0] + off3, 4096, 0x33, false};
    KVT_OK_(kvt_ec_server_with_shard(c.srv[0], check_region, &rc3));
    assert_true(rc3.ok);
    kvi_ucx_destroy(u);
    kvi_ecc_reply_release(&p2);
    kvi_ecc_request_release(&q);
    kvi_ecc_reply_release(&p);
    kvi_ecc_client_destroy(cli);
    consumer_stop(&c);
}

/* A consumer whose shard 1 is gone: the push fails (reported through take_failures), the
 * reservation on shard 0 is abandoned, and nothing hangs past the timeouts. */
static void a_dead_shard_fails_the_push_and_nothing_hangs(void **state)
{
    (void)state;
    consumer c;
    consumer_start(&c, true);
    kvt_ec_server_stop(c.srv[1]);
    c.srv[1] = NULL;
    kvt_ec_net_config nc;
    kvt_ec_net_config_init(&nc);
    nc.control_timeout_ms = 300;
    nc.write_timeout_ms = 300;
    kvt_ec_net_consumer *net;
    kvt_ec_producer *prod;
    producer_open(&nc, &net, &prod);
    kvt_ec_push_spec s;
    spec_of(&s, c.addr, "xfer-x", "img-x", 4);
    uint8_t src[8192];
    fill(src, sizeof(src), 9);
    (void)kvt_ec_producer_push(prod, &s);
    (void)kvt_ec_producer_bind_source(prod, "img-x", 5, src, sizeof(src), NULL);
    (void)kvt_ec_producer_dispatch(prod);
    assert_int_equal(kvt_ec_producer_state(prod, "xfer-x", 6), KVT_ECP_FAILED);
    kvt_ec_push_failure f[4];
    assert_int_equal(kvt_ec_producer_take_failures(prod, f, 4), 1);
    uint32_t writers = 1; /* shard 0's reservation was abandoned: its memory is free again */
    KVT_OK_(kvt_ec_server_with_shard(c.srv[0], count_writers, &writers));
    assert_int_equal(writers, 0);
    kvt_ec_producer_destroy(prod);
    kvt_ec_net_consumer_destroy(net);
    consumer_stop(&c);
}

static int status_of(kvt_ec_shard *sh, void *arg)
{
    kvt_ec_status st;
    return kvt_ec_shard_status(sh, arg, (uint32_t)strlen(arg), &st); /* 1 active, 0 not */
}

/* ---- CURVE ---------------------------------------------------------------------------------- */

/* With CURVE, only admitted clients reach a shard: a producer with an admitted key pushes and
 * its bytes arrive; a client without keys, or with a key pair not on the list, gets nothing
 * (its handshake is refused, its call times out) and reserves nothing. */
static void curve_admits_only_listed_clients(void **state)
{
    (void)state;
    if (!zmq_has("curve"))
        KVT_SKIP("this libzmq has no CURVE");
    char spub[41], ssec[41], ppub[41], psec[41], opub[41], osec[41];
    assert_int_equal(zmq_curve_keypair(spub, ssec), 0);
    assert_int_equal(zmq_curve_keypair(ppub, psec), 0);
    assert_int_equal(zmq_curve_keypair(opub, osec), 0);
    const char *admitted[] = {ppub, NULL};
    g_curve_secret = ssec;
    g_curve_clients = admitted;
    g_curve_pull[0] = spub, g_curve_pull[1] = ppub, g_curve_pull[2] = psec;
    consumer c;
    consumer_start(&c, true);
    g_curve_secret = NULL, g_curve_clients = NULL;
    /* the admitted producer */
    kvt_ec_net_config nc;
    kvt_ec_net_config_init(&nc);
    nc.curve_server_key = spub, nc.curve_public_key = ppub, nc.curve_secret_key = psec;
    kvt_ec_net_consumer *net;
    kvt_ec_producer *prod;
    producer_open(&nc, &net, &prod);
    static uint8_t src[8192];
    fill(src, sizeof(src), 3);
    kvt_ec_push_spec s;
    spec_of(&s, c.addr, "xfer-k", "h-k", 4);
    KVT_OK_(kvt_ec_producer_push(prod, &s));
    assert_int_equal(kvt_ec_producer_bind_source(prod, "h-k", 3, src, sizeof(src), NULL), 1);
    assert_int_equal(kvt_ec_producer_dispatch(prod), 1);
    assert_int_equal(kvt_ec_producer_state(prod, "xfer-k", 6), KVT_ECP_DONE);
    assert_int_equal(drain_events(&c, SHARDS, NULL), SHARDS);
    /* a client without keys and one whose key is not admitted */
    char ep[64];
    snprintf(ep, sizeof(ep), "tcp://127.0.0.1:%u", kvt_ec_server_port(c.srv[0]));
    kvi_ecc_request q;
    kvi_ecc_reply p;
    kvi_ecc_request_init(&q);
    kvi_ecc_reply_init(&p);
    kvi_ecc_item it = {.transfer_id = S("xfer-x"),
                       .mm_hash = S("h-x"),
                       .nbytes = 4096,
                       .ndim = 1,
                       .shape = {2048},
                       .dtype = S("float16"),
                       .client_key = S("00000000000000000000000000000001")};
    kvi_ecc_request_begin(&q, KVT_ECC_RESERVE);
    KVT_OK_(kvi_ecc_request_add(&q, &it));
    kvi_ecc_client *plain, *other;
    KVT_OK_(kvi_ecc_client_create(300, NULL, &plain));
    kvi_ecc_curve ok = {spub, opub, osec};
    KVT_OK_(kvi_ecc_client_create(300, &ok, &other));
    KVT_ERR_(kvi_ecc_client_call(plain, ep, &q, &p), KVT_EIO);
    KVT_ERR_(kvi_ecc_client_call(other, ep, &q, &p), KVT_EIO);
    kvt_ec_server_stats ss;
    kvt_ec_server_get_stats(c.srv[0], &ss);
    assert_true(ss.clients_refused >= 1);
    assert_int_equal(kvt_ec_server_with_shard(c.srv[0], status_of, (void *)"xfer-x"), 0);
    /* malformed keys are refused up front */
    kvi_ecc_curve bad = {spub, "short", osec};
    kvi_ecc_client *nope;
    KVT_ERR_(kvi_ecc_client_create(300, &bad, &nope), KVT_EINVAL);
    kvi_ecc_client_destroy(plain);
    kvi_ecc_client_destroy(other);
    kvi_ecc_request_release(&q);
    kvi_ecc_reply_release(&p);
    kvt_ec_producer_destroy(prod);
    kvt_ec_net_consumer_destroy(net);
    consumer_stop(&c);
}

/* A server's CURVE settings that cannot work are refused at start, each with its own message,
 * and nothing is left behind (the allowlist is freed when a later key is malformed). */
static void a_servers_bad_curve_settings_are_refused(void **state)
{
    (void)state;
    if (!zmq_has("curve"))
        KVT_SKIP("this libzmq has no CURVE");
    char pub[41], sec[41];
    assert_int_equal(zmq_curve_keypair(pub, sec), 0);
    static uint8_t buf[1u << 20];
    kvt_ec_shard_config shc;
    kvt_ec_shard_config_init(&shc);
    shc.base = buf, shc.capacity = sizeof(buf);
    kvt_ec_shard *shard;
    KVT_OK_(kvt_ec_shard_create(&shc, &shard));
    kvt_ec_server_config sc;
    kvt_ec_server_config_init(&sc);
    sc.host = "127.0.0.1";
    sc.data_plane = false;
    sc.base_port = 20000 + (uint32_t)(getpid() * 7919u % 30000u);
    kvt_ec_server *srv = NULL;
    const char *one[] = {pub, NULL}, *bad_second[] = {pub, "not-a-key", NULL};
    struct {
        const char *secret, *const *clients, *says;
    } cases[] = {
        {NULL, one, "curve_clients without a curve_secret_key"},
        {"short", NULL, "curve_secret_key is not 40 Z85 characters"},
        {sec, bad_second, "curve client key 1 is not 40 Z85 characters"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        sc.curve_secret_key = cases[i].secret;
        sc.curve_clients = cases[i].clients;
        KVT_ERR_(kvt_ec_server_start(&sc, shard, &srv), KVT_EINVAL);
        assert_null(srv);
        assert_non_null(strstr(kvt_last_error(), cases[i].says));
    }
    /* the same settings with good keys start (on the first free port) */
    sc.curve_secret_key = sec;
    sc.curve_clients = one;
    int rc = KVT_EIO;
    for (uint32_t i = 0; i < 200 && rc; i++, sc.base_port = 20000 + (sc.base_port + 257) % 30000)
        rc = kvt_ec_server_start(&sc, shard, &srv);
    KVT_OK_(rc);
    kvt_ec_server_stop(srv);
    kvt_ec_shard_destroy(shard);
}

/* ---- the consumer scheduler's side --------------------------------------------------------- */

/* The scheduler hears readiness from every shard through the inbox, and its cancels reach
 * every shard, without its thread ever waiting on the network. */
static void the_scheduler_hears_its_shards_and_its_cancels_reach_them(void **state)
{
    (void)state;
    consumer c;
    consumer_start(&c, true);
    zmq_close(c.pull); /* the inbox is the only puller (PUSH deals events out among pullers) */
    c.pull = zmq_socket(c.zctx, ZMQ_PULL);
    kvt_ec_sched_config scfg;
    kvt_ec_sched_config_init(&scfg);
    scfg.shards = SHARDS;
    kvt_ec_sched *sched;
    KVT_OK_(kvt_ec_sched_create(&scfg, &sched));
    kvt_ec_inbox_config icfg;
    kvt_ec_inbox_config_init(&icfg);
    icfg.consumer = c.addr;
    kvt_ec_inbox *in;
    KVT_OK_(kvt_ec_inbox_create(&icfg, &in));
    /* a producer in this thread pushes three items */
    kvt_ec_net_consumer *net;
    kvt_ec_producer *prod;
    producer_open(NULL, &net, &prod);
    static uint8_t src[3][8192];
    const char *tids[3] = {"xfer-a", "xfer-b", "xfer-c"}, *hashes[3] = {"h-a", "h-b", "h-c"};
    /* the scheduler steps before discovery finished: nothing, and no wait */
    assert_true(kvt_ec_inbox_step(in, sched) >= 0);
    for (int i = 0; i < 3; i++) {
        kvt_ec_push_spec s;
        spec_of(&s, c.addr, tids[i], hashes[i], 4);
        fill(src[i], sizeof(src[i]), (uint64_t)i + 1);
        KVT_OK_(kvt_ec_producer_push(prod, &s));
        assert_int_equal(
            kvt_ec_producer_bind_source(prod, hashes[i], 3, src[i], sizeof(src[i]), NULL), 1);
    }
    int pushed = 0;
    kvt_wait w = kvt_wait_start();
    do
        pushed += kvt_ec_producer_dispatch(prod);
    while (pushed < 3 && kvt_wait_more(&w));
    assert_int_equal(pushed, 3);
    /* steps until every transfer is AVAILABLE (readiness from both shards) */
    int available = 0;
    w = kvt_wait_start();
    do {
        assert_true(kvt_ec_inbox_step(in, sched) >= 0);
        available = 0;
        for (int i = 0; i < 3; i++)
            available += kvt_ec_sched_state(sched, tids[i], 6) == KVT_ECT_AVAILABLE;
    } while (available < 3 && kvt_wait_more(&w));
    assert_int_equal(available, 3);
    /* a request that gave up: its transfer is cancelled on every shard */
    kvt_ec_feature f = {"h-a", 3, "xfer-a", 6};
    bool ready;
    KVT_OK_(kvt_ec_sched_ensure(sched, "req-1", 5, &f, 1, &ready));
    KVT_OK_(kvt_ec_sched_request_finished(sched, "req-1", 5));
    assert_true(kvt_ec_inbox_step(in, sched) >= 0);
    int active;
    w = kvt_wait_start();
    do {
        active = 0;
        for (uint32_t k = 0; k < SHARDS; k++)
            active += kvt_ec_server_with_shard(c.srv[k], status_of, (void *)"xfer-a");
    } while (active && kvt_wait_more(&w));
    assert_int_equal(active, 0);
    for (uint32_t k = 0; k < SHARDS; k++) /* the others are still there */
        assert_int_equal(kvt_ec_server_with_shard(c.srv[k], status_of, (void *)"xfer-b"), 1);
    kvt_ec_inbox_stats st;
    /* counted after its last reply */
    KVT_WAIT_UNTIL((kvt_ec_inbox_get_stats(in, &st), st.cancels_sent >= 1), "the cancel sent");
    assert_int_equal(st.shards, SHARDS);
    assert_int_equal(st.events, 3 * SHARDS);
    assert_int_equal(st.cancels_sent, 1);
    assert_int_equal(st.cancels_failed, 0);
    kvt_ec_inbox_destroy(in);
    kvt_ec_sched_destroy(sched);
    kvt_ec_producer_destroy(prod);
    kvt_ec_net_consumer_destroy(net);
    consumer_stop(&c);
}

/* A consumer nobody answers for: the scheduler steps on (nothing arrives, nothing blocks),
 * discovery keeps retrying in the background, and the inbox goes away cleanly. */
static void an_unreachable_consumer_never_blocks_the_scheduler(void **state)
{
    (void)state;
    kvt_ec_sched_config scfg;
    kvt_ec_sched_config_init(&scfg);
    kvt_ec_sched *sched;
    KVT_OK_(kvt_ec_sched_create(&scfg, &sched));
    kvt_ec_inbox_config icfg;
    kvt_ec_inbox_config_init(&icfg);
    icfg.consumer = "tcp://127.0.0.1:9"; /* discard: nobody serves */
    icfg.control_timeout_ms = 200;
    icfg.retry_ms = 50;
    kvt_ec_inbox *in;
    KVT_OK_(kvt_ec_inbox_create(&icfg, &in));
    kvt_ec_feature f = {"h", 1, "t", 1};
    bool ready;
    KVT_OK_(kvt_ec_sched_ensure(sched, "r", 1, &f, 1, &ready));
    KVT_OK_(kvt_ec_sched_request_finished(sched, "r", 1)); /* a cancel for nobody */
    for (int i = 0; i < 3; i++)
        assert_int_equal(kvt_ec_inbox_step(in, sched), 0);
    kvt_ec_inbox_stats st;
    /* discovery is retried in the background */
    KVT_WAIT_UNTIL((kvt_ec_inbox_get_stats(in, &st), st.discoveries >= 2), "a second discovery");
    assert_int_equal(st.shards, 0);
    assert_int_equal(st.cancels_sent, 0); /* queued until there is a topology */
    kvt_ec_inbox_destroy(in);
    kvt_ec_inbox_config bad = icfg;
    bad.consumer = "not-an-address";
    KVT_ERR_(kvt_ec_inbox_create(&bad, &in), KVT_EINVAL);
    kvt_ec_sched_destroy(sched);
}

/* ---- processes --------------------------------------------------------------------------- */

/* Item i of a producer run: 2 KiB .. 16 MiB, log-uniform, from the seed. */
static uint64_t item_rows(uint64_t seed, int i)
{
    uint64_t r = seed * 1000003u + (uint64_t)i;
    uint32_t lg = kvt_test_below(&r, 13); /* 1 .. 8191 rows of 2 KiB: 2 KiB .. 16 MiB */
    return (1ull << lg) + kvt_test_below(&r, (uint32_t)(1ull << lg));
}

/* A control proxy in front of a consumer's first shard that swallows the first `drop`
 * requests (no answer: the client times out) and relays the rest; counts what it saw. */
typedef struct dropper {
    void *ctx, *front, *back;
    uint32_t port, drop;
    _Atomic uint32_t seen;
    char to[64];
    pthread_t th;
    _Atomic int stop;
} dropper;

static void *dropper_main(void *arg)
{
    dropper *d = arg;
    char buf[65536], id[256];
    while (!d->stop) {
        zmq_pollitem_t it = {d->front, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 20) != 1)
            continue;
        int il = zmq_recv(d->front, id, sizeof(id), 0), more = 1;
        size_t ml = sizeof(more);
        int n = -1;
        while (zmq_getsockopt(d->front, ZMQ_RCVMORE, &more, &ml) == 0 && more)
            n = zmq_recv(d->front, buf, sizeof(buf), 0); /* the empty delimiter, then the body */
        if (il <= 0 || n < 0 || d->seen++ < d->drop)
            continue; /* swallowed */
        void *req = zmq_socket(d->ctx, ZMQ_REQ);
        int t = TIMEOUT, zero = 0;
        zmq_setsockopt(req, ZMQ_RCVTIMEO, &t, sizeof(t));
        zmq_setsockopt(req, ZMQ_LINGER, &zero, sizeof(zero));
        zmq_connect(req, d->to);
        int r = zmq_send(req, buf, (size_t)n, 0) == n ? zmq_recv(req, buf, sizeof(buf), 0) : -1;
        zmq_close(req);
        if (r < 0)
            continue;
        zmq_send(d->front, id, (size_t)il, ZMQ_SNDMORE);
        zmq_send(d->front, "", 0, ZMQ_SNDMORE);
        zmq_send(d->front, buf, (size_t)(r < (int)sizeof(buf) ? r : (int)sizeof(buf)), 0);
    }
    return NULL;
}

static void dropper_start(dropper *d, const char *to, uint32_t drop)
{
    memset(d, 0, sizeof(*d));
    snprintf(d->to, sizeof(d->to), "%s", to);
    d->drop = drop;
    d->ctx = zmq_ctx_new();
    d->front = zmq_socket(d->ctx, ZMQ_ROUTER);
    int zero = 0;
    zmq_setsockopt(d->front, ZMQ_LINGER, &zero, sizeof(zero));
    assert_int_equal(zmq_bind(d->front, "tcp://127.0.0.1:*"), 0);
    char ep[64];
    size_t el = sizeof(ep);
    zmq_getsockopt(d->front, ZMQ_LAST_ENDPOINT, ep, &el);
    d->port = (uint32_t)atoi(strrchr(ep, ':') + 1);
    assert_int_equal(pthread_create(&d->th, NULL, dropper_main, d), 0);
}

static void dropper_stop(dropper *d)
{
    d->stop = 1;
    pthread_join(d->th, NULL);
    zmq_close(d->front);
    zmq_ctx_term(d->ctx);
}

/* Issue 56: the producer asks for a consumer's topology twice, as vLLM's Mooncake producer
 * does, before it fails a push without a confirmed topology: a first request lost (or a
 * consumer still starting) costs one control timeout, not the push. A consumer that never
 * answers costs two attempts and no more. */
static void a_lost_topology_answer_is_asked_again_once(void **state)
{
    (void)state;
    consumer c;
    consumer_start(&c, false);
    dropper d;
    dropper_start(&d, c.addr, 1);
    kvt_ec_net_config nc;
    kvt_ec_net_config_init(&nc);
    nc.control_timeout_ms = 300;
    kvt_ec_net_consumer *net;
    KVT_OK_(kvt_ec_net_consumer_create(&nc, &net));
    kvt_ec_consumer_ops ops = kvt_ec_net_consumer_ops(net);
    char via[64];
    snprintf(via, sizeof(via), "tcp://127.0.0.1:%u", d.port);
    uint32_t shards = 0;
    KVT_OK_(ops.shards(ops.ctx, via, &shards));
    assert_int_equal(shards, SHARDS);
    assert_int_equal(d.seen, 2); /* the first swallowed, the second answered */
    kvt_ec_net_consumer_destroy(net);
    dropper_stop(&d);
    /* nobody answers: two attempts, then the error */
    dropper_start(&d, c.addr, 100);
    KVT_OK_(kvt_ec_net_consumer_create(&nc, &net));
    ops = kvt_ec_net_consumer_ops(net);
    snprintf(via, sizeof(via), "tcp://127.0.0.1:%u", d.port);
    KVT_ERR_(ops.shards(ops.ctx, via, &shards), KVT_EIO);
    assert_non_null(strstr(kvt_last_error(), "no answer"));
    KVT_WAIT_UNTIL(d.seen >= 2, "the second attempt");
    assert_int_equal(d.seen, 2);
    kvt_ec_net_consumer_destroy(net);
    dropper_stop(&d);
    consumer_stop(&c);
}

/* The producer process (this binary with "producer"): "die" reserves n items on every shard
 * and kills itself before writing any; "push" pushes n items one at a time and exits 0 when
 * none failed. */
static int producer_main(const char *mode, const char *addr, int n, uint64_t seed)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the test */
    alarm(300);
    kvt_ec_net_config nc;
    kvt_ec_net_config_init(&nc);
    kvt_ec_net_consumer *net;
    if (kvt_ec_net_consumer_create(&nc, &net))
        return 10;
    kvt_ec_consumer_ops ops = kvt_ec_net_consumer_ops(net);
    if (strcmp(mode, "die") == 0) {
        uint32_t shards = 0;
        if (ops.shards(ops.ctx, addr, &shards) || shards != SHARDS)
            return 11;
        for (int i = 0; i < n; i++) {
            char tid[32], hash[32];
            snprintf(tid, sizeof(tid), "dead-%d", i);
            snprintf(hash, sizeof(hash), "img-dead-%d", i);
            kvt_ec_item it = {hash, (uint32_t)strlen(hash), 4096, 1, {2048}, "float16", 7};
            for (uint32_t k = 0; k < SHARDS; k++) {
                kvt_ec_reply r;
                if (ops.reserve(ops.ctx, addr, k, tid, (uint32_t)strlen(tid), &it, &r) || !r.write)
                    return 12;
            }
        }
        raise(SIGKILL); /* mid-push: reserved everywhere, nothing written */
    }
    kvt_ec_producer_config pc;
    kvt_ec_producer_config_init(&pc);
    pc.ops = ops;
    kvt_ec_producer *prod;
    if (kvt_ec_producer_create(&pc, &prod))
        return 13;
    uint8_t *src = malloc(16u << 20);
    int bad = 0;
    for (int i = 0; i < n && !bad; i++) {
        char tid[32], hash[32];
        snprintf(tid, sizeof(tid), "p-%d", i);
        snprintf(hash, sizeof(hash), "img-p-%d", i);
        uint64_t rows = item_rows(seed, i);
        fill(src, rows * 2048, seed + (uint64_t)i);
        kvt_ec_push_spec sp;
        spec_of(&sp, addr, tid, hash, rows);
        bad = kvt_ec_producer_push(prod, &sp) ||
              kvt_ec_producer_bind_source(prod, hash, (uint32_t)strlen(hash), src, rows * 2048,
                                          NULL) != 1 ||
              kvt_ec_producer_dispatch(prod) != 1 ||
              kvt_ec_producer_state(prod, tid, (uint32_t)strlen(tid)) != KVT_ECP_DONE;
        if (bad)
            fprintf(stderr, "producer: item %d (%llu bytes): %s\n", i,
                    (unsigned long long)(rows * 2048), kvt_last_error());
    }
    free(src);
    kvt_ec_producer_destroy(prod);
    kvt_ec_net_consumer_destroy(net);
    return bad ? 14 : 0;
}

static char g_self[4096];

static pid_t spawn_producer(const char *mode, const char *addr, int n, uint64_t seed)
{
    char ns[16], ss[24];
    snprintf(ns, sizeof(ns), "%d", n);
    snprintf(ss, sizeof(ss), "%llu", (unsigned long long)seed);
    char *argv[] = {g_self, "producer", (char *)mode, (char *)addr, ns, ss, NULL};
    pid_t pid;
    extern char **environ;
    assert_int_equal(posix_spawn(&pid, g_self, NULL, NULL, argv, environ), 0);
    return pid;
}

static int shard_state(kvt_ec_shard *sh, void *arg)
{
    kvt_ec_shard_stats *st = arg;
    kvt_ec_shard_get_stats(sh, st);
    return 0;
}

/* The consumer's side of a producer run: each readiness event's item is taken on its shard
 * and its bytes checked at once (a READY item lives only its TTL). Returns the bytes checked. */
static uint64_t consume(consumer *c, int n, uint64_t seed)
{
    uint64_t bytes = 0;
    for (int got = 0; got < n * (int)SHARDS; got++) {
        uint8_t buf[2048];
        int m = zmq_recv(c->pull, buf, sizeof(buf), 0);
        assert_true(m > 0); /* no event for TIMEOUT ms: the producer is stuck or gone */
        kvi_ecc_event e;
        kvi_ecc_event_init(&e);
        KVT_OK_(kvi_ecc_event_decode(&e, buf, (size_t)m));
        assert_false(e.abandoned);
        int i = atoi(e.transfer_id.ptr + 2);
        take_arg a = {e.transfer_id.ptr, e.mm_hash.ptr, seed + (uint64_t)i,
                      item_rows(seed, i) * 2048, 0};
        KVT_OK_(kvt_ec_server_with_shard(c->srv[e.shard], take_and_check, &a));
        assert_true(a.ok);
        bytes += a.nbytes;
        kvi_ecc_event_release(&e);
    }
    return bytes;
}

/* A producer killed after reserving: its regions stay reserved (nothing is freed early), until
 * the writers' TTL passes; then each receive is cancelled, the memory released and the waiting
 * side told (abandoned events). The next producer is served. */
static void a_killed_producer_is_reaped_at_its_ttl_and_the_next_one_is_served(void **state)
{
    (void)state;
    consumer c;
    consumer_start_ttl(&c, true, 1000000000ull); /* a 1 s TTL */
    int status;
    pid_t pid = spawn_producer("die", c.addr, 3, 1);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    kvt_ec_shard_stats st;
    KVT_OK_(kvt_ec_server_with_shard(c.srv[1], shard_state, &st));
    /* reserved when it died (unless its TTL already passed on a slow machine) */
    assert_true(st.writers == 3 || st.writers == 0);
    /* the reaper runs every 50 ms once the TTL passed: wait for it */
    uint32_t writers;
    kvt_wait w = kvt_wait_start();
    do {
        writers = 0;
        for (uint32_t k = 0; k < SHARDS; k++) {
            KVT_OK_(kvt_ec_server_with_shard(c.srv[k], shard_state, &st));
            writers += st.writers;
        }
    } while (writers && kvt_wait_more(&w));
    for (uint32_t k = 0; k < SHARDS; k++) {
        KVT_OK_(kvt_ec_server_with_shard(c.srv[k], shard_state, &st));
        assert_int_equal(st.writers, 0);
        assert_int_equal(st.free_bytes, st.capacity);
        kvt_ec_server_stats ss;
        kvt_ec_server_get_stats(c.srv[k], &ss);
        assert_int_equal(ss.writers_reaped, 3);
    }
    uint32_t abandoned = 0;
    for (int i = 0; i < 3 * SHARDS; i++) {
        uint8_t buf[2048];
        int n = zmq_recv(c.pull, buf, sizeof(buf), 0);
        kvi_ecc_event e;
        kvi_ecc_event_init(&e);
        if (n > 0 && kvi_ecc_event_decode(&e, buf, (size_t)n) == 0 && e.abandoned)
            abandoned++;
        kvi_ecc_event_release(&e);
    }
    assert_int_equal(abandoned, 3 * SHARDS);
    /* the next producer: 20 items, every byte checked on every shard */
    pid = spawn_producer("push", c.addr, 20, 5);
    assert_true(consume(&c, 20, 5) > 0);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    consumer_stop(&c);
}

/* 1 producer process -> a consumer with 2 shards, items from 2 KiB to 16 MiB (1000 per run at
 * scale 1), consumed as they arrive: every item's bytes verified on both shards. */
static void a_thousand_items_from_another_process(void **state)
{
    (void)state;
    consumer c;
    consumer_start(&c, true);
    int n = (int)(1000 * kvt_test_scale());
    if (n < 20)
        n = 20;
    uint64_t seed = kvt_test_seed() % 1000000 + 11;
    pid_t pid = spawn_producer("push", c.addr, n, seed);
    uint64_t bytes = consume(&c, n, seed);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    print_message("ec net: %d items (seed %llu), %.1f MiB verified on %u shards\n", n,
                  (unsigned long long)seed, (double)bytes / (1 << 20), SHARDS);
    consumer_stop(&c);
}

/* The rendezvous threshold in an endpoint's protocol table (kvi_ucx_ep_info), 0 where this
 * UCX words its table otherwise. */
static unsigned long long rndv_thresh_of(const char *info)
{
    const char *l = strstr(info, "tag_send:");
    const char *r = l ? strstr(l, "..<rndv>") : NULL;
    const char *eol = l ? strchr(l, '\n') : NULL;
    if (!r || (eol && r > eol))
        return 0;
    const char *d = r;
    while (d > l && d[-1] >= '0' && d[-1] <= '9')
        d--;
    return d < r ? strtoull(d, NULL, 10) : 0;
}

/* The threshold UCX gave an endpoint of a new context to rx's worker. */
static unsigned long long rndv_thresh_to(kvi_ucx *rx, unsigned flags, char *info, size_t cap)
{
    const void *addr;
    size_t len;
    kvi_ucx *tx;
    KVT_OK_(kvi_ucx_address(rx, &addr, &len));
    KVT_OK_(kvi_ucx_create_as(&tx, flags));
    KVT_OK_(kvi_ucx_ep_info(tx, addr, len, info, cap));
    kvi_ucx_destroy(tx);
    return rndv_thresh_of(info);
}

/* Sets (or, val NULL, unsets) an environment variable; returns the old value (NULL if unset),
 * to be given back with env_restore. */
static char *env_swap(const char *name, const char *val)
{
    const char *was = getenv(name);
    char *saved = was ? strdup(was) : NULL;
    if (val)
        setenv(name, val, 1);
    else
        unsetenv(name);
    return saved;
}

static void env_restore(const char *name, char *saved)
{
    if (saved)
        setenv(name, saved, 1);
    else
        unsetenv(name);
    free(saved);
}

/* The thresholds of a sender's endpoint and of a plain context's, to a receiver made under the
 * same UCX_TLS (tls) with UCX_RNDV_THRESH as user (NULL: unset). */
static void thresholds(const char *tls, const char *user, unsigned long long *sender,
                       unsigned long long *plain, char *info, size_t cap)
{
    char *old_tls = env_swap("UCX_TLS", tls), *old_th = env_swap("UCX_RNDV_THRESH", user);
    kvi_ucx *rx;
    KVT_OK_(kvi_ucx_create(&rx));
    *sender = rndv_thresh_to(rx, KVI_UCX_EC_SENDER, info, cap);
    *plain = *sender ? rndv_thresh_to(rx, 0, info, cap) : 0;
    kvi_ucx_destroy(rx);
    env_restore("UCX_RNDV_THRESH", old_th);
    env_restore("UCX_TLS", old_tls);
}

/* An encoder-cache sender's items below 256 KiB go eager (no rendezvous round trip) over tcp,
 * unless the user set UCX_RNDV_THRESH or the host has RDMA devices; not where the context has
 * shared memory; other contexts keep UCX's own threshold. */
static void an_encoder_sender_sends_small_items_eager_over_tcp(void **state)
{
    (void)state;
    assert_string_equal(kvi_ucx_rndv_thresh(NULL, false, false), KVI_UCX_EC_RNDV_THRESH);
    assert_string_equal(kvi_ucx_rndv_thresh("", false, false), KVI_UCX_EC_RNDV_THRESH);
    assert_null(kvi_ucx_rndv_thresh("64K", false, false));
    assert_null(kvi_ucx_rndv_thresh(NULL, true, false));
    assert_null(kvi_ucx_rndv_thresh(NULL, false, true));
    static char info[1 << 16];
    unsigned long long tcp_s, tcp_p, shm_s, shm_p, user_s, user_p;
    thresholds("tcp", NULL, &tcp_s, &tcp_p, info, sizeof(info));
    if (!tcp_s || !tcp_p)
        KVT_SKIP("this UCX words its endpoint protocols otherwise (UCX_PROTO_ENABLE=y?): %.300s",
                 info);
    thresholds("tcp,shm", NULL, &shm_s, &shm_p, info, sizeof(info));
    thresholds("tcp", "32K", &user_s, &user_p, info, sizeof(info));
    print_message("rendezvous from (encoder sender / UCX's own): tcp %llu / %llu, tcp and shared "
                  "memory %llu / %llu, the user's 32K %llu / %llu\n",
                  tcp_s, tcp_p, shm_s, shm_p, user_s, user_p);
    if (kvi_ucx_host_rdma())
        assert_int_equal(tcp_s, tcp_p);
    else {
        assert_int_equal(tcp_s, 256u << 10);
        assert_int_not_equal(tcp_p, 256u << 10);
    }
    assert_int_equal(shm_s, shm_p);
    assert_int_equal(user_s, 32u << 10);
}

int main(int argc, char **argv)
{
    if (argc == 6 && strcmp(argv[1], "producer") == 0)
        return producer_main(argv[2], argv[3], atoi(argv[4]), strtoull(argv[5], NULL, 10));
    ssize_t l = readlink("/proc/self/exe", g_self, sizeof(g_self) - 1);
    assert_true(l > 0);
    g_self[l] = 0;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(pushes_land_on_every_shard_byte_for_byte),
        cmocka_unit_test(a_batch_of_pushes_lands_and_a_refused_item_fails_alone),
        cmocka_unit_test(completion_waits_for_the_bytes_and_abandon_ends_the_receive),
        cmocka_unit_test(a_dead_shard_fails_the_push_and_nothing_hangs),
        cmocka_unit_test(the_scheduler_hears_its_shards_and_its_cancels_reach_them),
        cmocka_unit_test(curve_admits_only_listed_clients),
        cmocka_unit_test(a_servers_bad_curve_settings_are_refused),
        cmocka_unit_test(an_unreachable_consumer_never_blocks_the_scheduler),
        cmocka_unit_test(a_lost_topology_answer_is_asked_again_once),
        cmocka_unit_test(a_killed_producer_is_reaped_at_its_ttl_and_the_next_one_is_served),
        cmocka_unit_test(a_thousand_items_from_another_process),
        cmocka_unit_test(an_encoder_sender_sends_small_items_eager_over_tcp),
    };
    return kvt_test_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
