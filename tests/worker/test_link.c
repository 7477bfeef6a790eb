/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The scheduler <-> worker link in one process (workers on threads): the pool-size
 * handshake, aggregation across ranks and steps, a rank's failure travelling to the
 * scheduler, malformed or unexpected messages refused without breaking the next step, and
 * bounded waits.
 */
#include <pthread.h>
#include <zmq.h>

#include "kvt_test.h"
#include "base/error.h"
#include "net/link_internal.h"

#define TIMEOUT 10000
#define SHORT   300 /* ms: a step's wait when a rank is expected to stay silent */
#define LATE_MS 600

static char g_ep[128];
static int g_ep_seq;

static void new_endpoint(void)
{
    snprintf(g_ep, sizeof(g_ep), "ipc://kvt-link-test-%d-%d.sock", (int)getpid(), g_ep_seq++);
}

/* A scripted rank: answers each step with what `script` says for that step. */
typedef struct rank_ctx {
    uint32_t rank, world, host_blocks;
    int fail_at_step;   /* reply with KVT_EIO at this step (1-based), 0: never */
    const char *finish; /* request reported finished ... */
    int finish_at_step; /* ... at this step */
    int steps;          /* steps answered */
    int rc;
} rank_ctx;

static void *rank_main(void *arg)
{
    rank_ctx *c = arg;
    kvt_link_worker *w;
    c->rc = kvt_link_worker_create(g_ep, c->rank, c->world, c->host_blocks, &w);
    if (c->rc)
        return NULL;
    kvt_offload_meta meta;
    kvt_offload_meta_init(&meta);
    kvt_offload_worker_meta wm;
    kvt_offload_worker_meta_init(&wm);
    for (;;) {
        const void *payload;
        size_t len;
        bool stop;
        c->rc = kvt_link_worker_recv(w, TIMEOUT, &meta, &payload, &len, &stop);
        if (c->rc || stop)
            break;
        c->steps++;
        kvt_offload_worker_meta_clear(&wm);
        if (meta.store_event != KVT_NO_EVENT)
            kvt_offload_worker_meta_add(&wm, meta.store_event, 1);
        kvt_str fin = {c->finish, c->finish ? (uint32_t)strlen(c->finish) : 0};
        bool report = c->finish && c->steps == c->finish_at_step;
        uint32_t invalid[1] = {40 + c->rank};
        int status = 0;
        if (c->steps == c->fail_at_step)
            status = kvt_fail(KVT_EIO, "rank %u: disk on fire", c->rank);
        c->rc = kvt_link_worker_reply(w, status, &fin, report ? 1 : 0, &wm, invalid,
                                      c->steps == 1 ? 1 : 0);
        if (c->rc)
            break;
    }
    kvt_offload_meta_release(&meta);
    kvt_offload_worker_meta_release(&wm);
    kvt_link_worker_destroy(w);
    return NULL;
}

static void test_handshake_aggregation_and_failure(void **state)
{
    (void)state;
    new_endpoint();
    kvt_link_sched *s;
    KVT_OK_(kvt_link_sched_create(g_ep, 2, &s));
    rank_ctx c[2] = {{0, 2, 100, 0, "req-a", 1, 0, 0}, {1, 2, 90, 3, "req-a", 2, 0, 0}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&th[i], NULL, rank_main, &c[i]);
    uint32_t blocks;
    KVT_OK_(kvt_link_sched_accept(s, TIMEOUT, &blocks));
    assert_int_equal(blocks, 90); /* the smallest rank's */
    kvt_offload_meta meta;
    kvt_offload_meta_init(&meta);
    meta.store_event = 4;
    KVT_OK_(kvt_offload_meta_add_store(&meta, 1, 2));
    kvt_link_result res;
    /* step 1: both ranks stored event 4; only rank 0 finished req-a's load; invalid blocks */
    KVT_OK_(kvt_link_sched_step(s, &meta, "payload", 7, TIMEOUT, &res));
    assert_int_equal(res.stores->stores.n_completed, 1);
    assert_int_equal(res.stores->stores.counts[0], 2);
    assert_int_equal(res.n_finished, 0);
    assert_int_equal(res.n_invalid, 2);
    assert_int_equal(res.invalid_blocks[0], 40);
    assert_int_equal(res.invalid_blocks[1], 41);
    /* step 2: rank 1 reports req-a: now every rank did */
    kvt_offload_meta_clear(&meta);
    KVT_OK_(kvt_link_sched_step(s, &meta, NULL, 0, TIMEOUT, &res));
    assert_int_equal(res.n_finished, 1);
    assert_string_equal(res.finished_loads[0].ptr, "req-a");
    assert_int_equal(res.stores->stores.n_completed, 0);
    /* step 3: rank 1 fails; its code and message reach the scheduler */
    KVT_ERR_(kvt_link_sched_step(s, &meta, NULL, 0, TIMEOUT, &res), KVT_EIO);
    assert_non_null(strstr(kvt_last_error(), "rank 1"));
    assert_non_null(strstr(kvt_last_error(), "disk on fire"));
    /* step 4 works again */
    KVT_OK_(kvt_link_sched_step(s, &meta, NULL, 0, TIMEOUT, &res));
    KVT_OK_(kvt_link_sched_stop(s));
    for (int i = 0; i < 2; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(c[i].rc, 0);
        assert_int_equal(c[i].steps, 4);
    }
    kvt_offload_meta_release(&meta);
    kvt_link_sched_destroy(s);
}

/* A raw peer that says hello as rank r of `world` and then answers every step with the
 * frames `bad` chooses. */
typedef struct rogue {
    uint32_t rank, world;
    int mode; /* 0 well-formed, 1 garbage status frame, 2 reply claiming another rank,
                 3 dies after answering step 1, 4 answers step 1 late (after LATE_MS),
                 5 a status part of 32 MiB (over the scheduler's part limit), 6 a sixth part,
                 7 an ids part with an empty request id */
    int steps;
} rogue;

static void *rogue_main(void *arg)
{
    rogue *r = arg;
    void *ctx = zmq_ctx_new(), *sock = zmq_socket(ctx, ZMQ_DEALER);
    char id[32];
    int n = snprintf(id, sizeof(id), "kvt-rank-%u", r->rank);
    zmq_setsockopt(sock, ZMQ_ROUTING_ID, id, (size_t)n);
    int linger = 0, rcvtimeo = TIMEOUT;
    zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof(linger));
    zmq_setsockopt(sock, ZMQ_RCVTIMEO, &rcvtimeo, sizeof(rcvtimeo));
    zmq_connect(sock, g_ep);
    uint8_t hdr[KVT_LINK_HDR_LEN], hello[KVT_LINK_HELLO_LEN];
    kvi_link_hdr_encode(hdr, KVT_LINK_HELLO, 0);
    kvi_link_hello_encode(hello, r->rank, r->world, 64);
    zmq_send(sock, hdr, sizeof(hdr), ZMQ_SNDMORE);
    zmq_send(sock, hello, sizeof(hello), 0);
    for (;;) {
        uint8_t buf[4096];
        int got = zmq_recv(sock, buf, sizeof(buf), 0);
        if (got < 0)
            break;
        uint32_t type;
        uint64_t step;
        if (kvi_link_hdr_decode(buf, (size_t)got, &type, &step) || type == KVT_LINK_STOP)
            break;
        int more = 1;
        size_t ml = sizeof(more);
        while (zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &ml) == 0 && more)
            zmq_recv(sock, buf, sizeof(buf), 0);
        r->steps++;
        if (r->mode == 4 && r->steps == 1)
            usleep(LATE_MS * 1000);
        kvi_link_hdr_encode(hdr, KVT_LINK_REPLY, step);
        uint8_t st[64];
        kvi_link_status_encode(st, r->mode == 2 ? (r->rank + 1) % r->world : r->rank, 0, NULL, 0,
                               "", 0);
        size_t st_len = kvi_link_status_size(0, 0);
        if (r->mode == 1 && r->steps == 1)
            memset(st, 0xff, st_len);
        kvt_offload_worker_meta wm;
        kvt_offload_worker_meta_init(&wm);
        uint8_t wbuf[64];
        size_t wlen;
        kvt_offload_worker_meta_encode(&wm, wbuf, sizeof(wbuf), &wlen);
        uint8_t ids[16] = {0}; /* u32 count 0 */
        size_t ids_len = 4;
        if (r->mode == 7) { /* one id of length 0 */
            ids[0] = 1;
            ids_len = 8;
        }
        zmq_send(sock, hdr, sizeof(hdr), ZMQ_SNDMORE);
        if (r->mode == 5) {
            size_t big = 32u << 20;
            uint8_t *b = calloc(1, big);
            zmq_send(sock, b, big, ZMQ_SNDMORE);
            free(b);
        } else {
            zmq_send(sock, st, st_len, ZMQ_SNDMORE);
        }
        zmq_send(sock, wbuf, wlen, ZMQ_SNDMORE);
        zmq_send(sock, ids, ids_len, r->mode == 6 ? ZMQ_SNDMORE : 0);
        if (r->mode == 6)
            zmq_send(sock, ids, ids_len, 0);
        if (r->mode == 3)
            break; /* killed after its first answer: the socket goes away without a word */
    }
    zmq_close(sock);
    zmq_ctx_term(ctx);
    return NULL;
}

/* Rank 0 behaves, rank 1 answers in `mode`; returns the first step's result, then (when
 * then_ok) checks that the next step works again. */
static int run_rogue_pair(int mode, bool then_ok)
{
    new_endpoint();
    kvt_link_sched *s;
    KVT_OK_(kvt_link_sched_create(g_ep, 2, &s));
    rogue r[2] = {{0, 2, 0, 0}, {1, 2, mode, 0}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&th[i], NULL, rogue_main, &r[i]);
    uint32_t blocks;
    KVT_OK_(kvt_link_sched_accept(s, TIMEOUT, &blocks));
    kvt_offload_meta meta;
    kvt_offload_meta_init(&meta);
    kvt_link_result res;
    /* a rank dropped by libzmq never answers: wait less than the honest rank's own receive
     * timeout, so that it is still there for the stop */
    int rc = kvt_link_sched_step(s, &meta, NULL, 0, mode == 5 ? TIMEOUT / 5 : TIMEOUT, &res);
    char msg[512];
    snprintf(msg, sizeof(msg), "%s", kvt_last_error());
    /* the next step: rank 0's late reply to step 1 is dropped, both answer step 2 */
    if (then_ok)
        KVT_OK_(kvt_link_sched_step(s, &meta, NULL, 0, TIMEOUT, &res));
    KVT_OK_(kvt_link_sched_stop(s));
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    kvt_link_sched_destroy(s);
    kvt_offload_meta_release(&meta);
    kvt_fail(rc ? rc : KVT_OK, "%s", msg); /* the first step's message, for the caller */
    return rc;
}

static void test_malformed_replies_are_refused_and_the_next_step_works(void **state)
{
    (void)state;
    int rc = run_rogue_pair(1, true);
    assert_true(rc == KVT_EPROTO || rc == KVT_ELIMIT); /* a count of 2^32 - 1 invalid blocks */
    assert_non_null(strstr(kvt_last_error(), "status"));
}

static void test_a_reply_claiming_another_rank_is_refused(void **state)
{
    (void)state;
    assert_int_equal(run_rogue_pair(2, false), KVT_EPROTO);
    assert_non_null(strstr(kvt_last_error(), "another peer"));
}

/* Sizes are bounded before anything is buffered: a part over the limit costs the sender its
 * connection (the step times out naming it), a message with an extra part or a malformed ids
 * part is refused; the honest rank is unaffected. */
static void test_oversized_or_extra_parts_are_refused(void **state)
{
    (void)state;
    assert_int_equal(run_rogue_pair(5, false), KVT_EIO);
    assert_non_null(strstr(kvt_last_error(), "did not answer (1)"));
    assert_int_equal(run_rogue_pair(6, false), KVT_EPROTO);
    assert_non_null(strstr(kvt_last_error(), "more than 5 frames"));
    assert_int_equal(run_rogue_pair(7, false), KVT_EPROTO);
    assert_non_null(strstr(kvt_last_error(), "finished requests"));
}

static void test_handshake_errors_and_timeouts(void **state)
{
    (void)state;
    new_endpoint();
    kvt_link_sched *s;
    KVT_ERR_(kvt_link_sched_create(g_ep, 0, &s), KVT_EINVAL);
    KVT_OK_(kvt_link_sched_create(g_ep, 2, &s));
    uint32_t blocks;
    /* nobody says hello */
    KVT_ERR_(kvt_link_sched_accept(s, 50, &blocks), KVT_EIO);
    assert_non_null(strstr(kvt_last_error(), "timed out"));
    /* a rank that believes in another world size */
    rogue r = {0, 3, 0, 0};
    pthread_t th;
    pthread_create(&th, NULL, rogue_main, &r);
    KVT_ERR_(kvt_link_sched_accept(s, TIMEOUT, &blocks), KVT_EPROTO);
    assert_non_null(strstr(kvt_last_error(), "world size"));
    kvt_link_sched_destroy(s); /* the rogue's recv times out and it exits */
    pthread_join(th, NULL);
    kvt_link_worker *w;
    KVT_ERR_(kvt_link_worker_create(g_ep, 2, 2, 10, &w), KVT_EINVAL);
    KVT_ERR_(kvt_link_worker_create(g_ep, 0, 2, 1, &w), KVT_EINVAL);
}

/* A scheduler and two rogue ranks that said hello. */
static kvt_link_sched *start_pair(rogue r[2], pthread_t th[2])
{
    new_endpoint();
    kvt_link_sched *s;
    KVT_OK_(kvt_link_sched_create(g_ep, 2, &s));
    for (int i = 0; i < 2; i++)
        pthread_create(&th[i], NULL, rogue_main, &r[i]);
    uint32_t blocks;
    KVT_OK_(kvt_link_sched_accept(s, TIMEOUT, &blocks));
    return s;
}

/* ZeroMQ endpoint faults: a worker that dies mid-run, one that answers too late. */
static void test_a_dead_rank_fails_the_step_by_name(void **state)
{
    (void)state;
    rogue r[2] = {{0, 2, 0, 0}, {1, 2, 3, 0}};
    pthread_t th[2];
    kvt_link_sched *s = start_pair(r, th);
    kvt_offload_meta meta;
    kvt_offload_meta_init(&meta);
    kvt_link_result res;
    KVT_OK_(kvt_link_sched_step(s, &meta, NULL, 0, TIMEOUT, &res));
    pthread_join(th[1], NULL); /* rank 1 is gone before step 2 */
    /* either ZeroMQ already knows the peer is gone (the send fails) or the step times out;
     * both name rank 1 */
    KVT_ERR_(kvt_link_sched_step(s, &meta, NULL, 0, SHORT, &res), KVT_EIO);
    assert_true(strstr(kvt_last_error(), "1 of 2 ranks did not answer (1)") ||
                strstr(kvt_last_error(), "sending step 2 to rank 1"));
    /* the stop reaches rank 0 whether or not sending to the dead rank fails */
    int rc = kvt_link_sched_stop(s);
    assert_true(rc == KVT_OK || (rc == KVT_EIO && strstr(kvt_last_error(), "to rank 1")));
    pthread_join(th[0], NULL);
    assert_int_equal(r[0].steps, 2);
    kvt_link_sched_destroy(s);
    kvt_offload_meta_release(&meta);
}

static void test_a_late_reply_is_dropped_and_the_next_step_works(void **state)
{
    (void)state;
    rogue r[2] = {{0, 2, 0, 0}, {1, 2, 4, 0}};
    pthread_t th[2];
    kvt_link_sched *s = start_pair(r, th);
    kvt_offload_meta meta;
    kvt_offload_meta_init(&meta);
    kvt_link_result res;
    KVT_ERR_(kvt_link_sched_step(s, &meta, NULL, 0, SHORT, &res), KVT_EIO);
    assert_non_null(strstr(kvt_last_error(), "(1)"));
    /* rank 1's answer to step 1 arrives during step 2 and is dropped; both answer step 2 */
    KVT_OK_(kvt_link_sched_step(s, &meta, NULL, 0, TIMEOUT, &res));
    KVT_OK_(kvt_link_sched_stop(s));
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    assert_int_equal(r[1].steps, 2);
    kvt_link_sched_destroy(s);
    kvt_offload_meta_release(&meta);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_handshake_aggregation_and_failure),
        cmocka_unit_test(test_malformed_replies_are_refused_and_the_next_step_works),
        cmocka_unit_test(test_a_reply_claiming_another_rank_is_refused),
        cmocka_unit_test(test_oversized_or_extra_parts_are_refused),
        cmocka_unit_test(test_handshake_errors_and_timeouts),
        cmocka_unit_test(test_a_dead_rank_fails_the_step_by_name),
        cmocka_unit_test(test_a_late_reply_is_dropped_and_the_next_step_works),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
