/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The remote tier against the directory and the network (issue 36): everything a directory
 * writer without the credential, a slow or lying Redis, or a peer on the read ports can do,
 * from processes and threads of this test, on loopback only, each case bounded.
 *
 *   - a Redis that drips its reply a byte at a time holds a call no longer than its deadline;
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>

#include "kvt_test.h"
#include "redis_group.h"
#include "kvtier/remote.h"

#define HL   16u
#define CRED "a-shared-secret-of-the-space"

static char g_space[32];

static int each_setup(void **state)
{
    (void)state;
    static int n;
    snprintf(g_space, sizeof(g_space), "h%d-%d", (int)getpid(), n++);
    return 0;
}

static double now_s(void)
{
    return (double)kvt_monotonic_ns() / 1e9;
}

/* ---- a Redis that drips ---------------------------------------------------------------------- */

/* Answers every connection with the start of a huge bulk reply, then one byte every 20 ms,
 * for at most DRIP_S seconds: a client bounded per read (not per call) would wait that long. */
#define DRIP_S 20

typedef struct dripper {
    char path[128];
    int lfd;
    pthread_t thr;
    atomic_bool stop;
} dripper;

static void *drip_main(void *arg)
{
    dripper *d = arg;
    struct pollfd pf[33];
    int n = 1;
    pf[0] = (struct pollfd){d->lfd, POLLIN, 0};
    double end = now_s() + DRIP_S;
    while (!atomic_load(&d->stop) && now_s() < end) {
        if (poll(pf, (nfds_t)n, 20) > 0 && (pf[0].revents & POLLIN) && n < 33) {
            int c = accept(d->lfd, NULL, NULL);
            if (c >= 0) {
                pf[n++] = (struct pollfd){c, POLLIN, 0};
                (void)!write(c, "$100000\r\n", 9);
            }
        }
        for (int i = 1; i < n; i++) {
            char sink[4096];
            if (pf[i].revents & POLLIN)
                (void)!read(pf[i].fd, sink, sizeof(sink));
            (void)send(pf[i].fd, "x", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
        }
    }
    for (int i = 0; i < n; i++)
        close(pf[i].fd);
    return NULL;
}

static void drip_start(dripper *d)
{
    snprintf(d->path, sizeof(d->path), "%s/drip-%d.sock", g_dir, (int)getpid());
    unlink(d->path);
    d->lfd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof(a.sun_path), "%.100s", d->path);
    assert_int_equal(bind(d->lfd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(d->lfd, 16), 0);
    atomic_store(&d->stop, false);
    assert_int_equal(pthread_create(&d->thr, NULL, drip_main, d), 0);
}

static void drip_stop(dripper *d)
{
    atomic_store(&d->stop, true);
    pthread_join(d->thr, NULL);
    unlink(d->path);
}

/* Issue 36: directory_timeout_ms bounded each socket read, so a Redis that keeps sending a
 * byte now and then held a lookup inside the scheduler's match for as long as it liked (over
 * 15 s seen). Now the whole call has a deadline: create (which registers) and a lookup each
 * end within a few deadlines, as misses, while the dripper would have kept them DRIP_S s. */
static void a_dripping_directory_costs_one_deadline(void **state)
{
    (void)state;
    dripper d;
    drip_start(&d);
    kvt_remote_config c;
    test_remote_config(&c, g_space, "a", CRED);
    c.directory = d.path;
    c.block_bytes = 4096;
    c.directory_timeout_ms = 200;
    kvt_remote *r;
    double t0 = now_s();
    KVT_OK_(kvt_remote_create(&c, &r)); /* unregistered: the directory never answered */
    double t_create = now_s() - t0;
    usleep(2 * c.retry_ms * 1000); /* past the reconnect back-off: the lookup asks again */
    uint8_t hashes[8 * HL] = {1, 2, 3};
    kvt_remote_loc loc[8];
    uint32_t hit = 99;
    t0 = now_s();
    KVT_OK_(kvt_remote_lookup(r, hashes, 8, loc, &hit));
    double t_lookup = now_s() - t0;
    assert_int_equal(hit, 0);
    kvt_remote_stats st;
    kvt_remote_get_stats(r, &st);
    assert_true(st.directory_errors >= 1);
    assert_int_equal(st.epoch, 0);
    kvt_remote_destroy(r);
    drip_stop(&d);
    print_message("dripping directory: create %.2f s, lookup %.2f s (deadline 0.2 s, the drip "
                  "lasts %d s)\n",
                  t_create, t_lookup, DRIP_S);
    /* a bound, not a timing: the old code took the whole drip */
    assert_true(t_create < DRIP_S / 4.0 && t_lookup < DRIP_S / 4.0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(a_dripping_directory_costs_one_deadline, each_setup),
    };
    return kvt_test_exit(cmocka_run_group_tests(tests, group_setup, group_teardown));
}
