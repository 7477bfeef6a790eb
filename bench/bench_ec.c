/* SPDX-License-Identifier: Apache-2.0 */
/*
 * `kvtier bench ec`: encoder-cache pushes between two processes over the network stack, against
 * `ucx_perftest tag_bw` with the same message size and transport, in the same command
 * (BENCHMARKS.md).
 *
 * The command runs the producer (kvt_ec_producer over kvt_ec_net_consumer) and spawns itself
 * as the consumer (one shard behind kvt_ec_server with its data plane; its worker takes and
 * retires every item as its readiness event arrives, so the buffer is reused). Items of 64 KiB,
 * 1 MiB and 16 MiB are pushed one at a time, each a full push: reserve, UCX send into the
 * reserved region, completion accepted once the bytes landed (so "ready" on the consumer).
 * `gbps` is bytes / time for 16 MiB items; `p50_us_64k` the median push of a 64 KiB item.
 * The baseline: ucx_perftest's server and client (tag_bw, the same size) on the same
 * transport; its "MB/s" are MiB/s. Transports: `--transport tcp` (UCX_TLS=tcp, loopback) or
 * `shm` (UCX_TLS=shm: posix/sysv shared memory and cma).
 */
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "bench_util.h"
#include "ec/ctl.h"
#include "ec_cmds.h"
#include "kvtier/kvtier.h"

extern char **environ;

#define CAP (256u << 20)

/* ---- the consumer process ------------------------------------------------------------------- */

static int take_retire(kvt_ec_shard *sh, void *arg)
{
    const kvt_ec_ready_event *e = arg;
    kvt_slab_view v;
    int rc = kvt_ec_shard_take(sh, e->transfer_id, (uint32_t)strlen(e->transfer_id), e->mm_hash,
                               (uint32_t)strlen(e->mm_hash), NULL, &v);
    if (!rc)
        rc = kvt_ec_shard_retire(sh, e->mm_hash, (uint32_t)strlen(e->mm_hash), NULL) == 1
                 ? 0
                 : KVT_ESTATE;
    return rc;
}

/* Serves until stdin closes: prints "port N" once bound. */
int kvt_bench_ec_consumer(void);
int kvt_bench_ec_consumer(void)
{
    uint8_t *buf = aligned_alloc(4096, CAP);
    kvt_ec_shard_config sc;
    kvt_ec_shard_config_init(&sc);
    sc.base = buf;
    sc.capacity = CAP;
    kvt_ec_shard *sh;
    kvt_ec_server *srv = NULL;
    if (!buf || kvt_ec_shard_create(&sc, &sh))
        return 1;
    kvt_ec_server_config c;
    kvt_ec_server_config_init(&c);
    c.host = "127.0.0.1";
    c.poll_ms = 5;
    int rc = KVT_EIO;
    for (uint32_t i = 0; i < 100 && rc; i++) {
        c.base_port = 30000 + (uint32_t)((getpid() * 7u + i * 97u) % 25000u);
        rc = kvt_ec_server_start(&c, sh, &srv);
    }
    if (rc) {
        fprintf(stderr, "bench ec consumer: %s\n", kvt_last_error());
        return 1;
    }
    printf("port %u\n", kvt_ec_server_port(srv));
    fflush(stdout);
    void *ctx = zmq_ctx_new(), *pull = zmq_socket(ctx, ZMQ_PULL);
    char ep[64];
    snprintf(ep, sizeof(ep), "tcp://127.0.0.1:%u", kvt_ec_server_event_port(srv));
    int t = 100, zero = 0;
    zmq_setsockopt(pull, ZMQ_RCVTIMEO, &t, sizeof(t));
    zmq_setsockopt(pull, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_connect(pull, ep);
    for (;;) {
        uint8_t m[2048];
        int n = zmq_recv(pull, m, sizeof(m), 0);
        if (n < 0) {
            if (getppid() == 1)
                break; /* the bench is gone */
            continue;
        }
        kvt_ecc_event ev;
        kvt_ecc_event_init(&ev);
        kvt_ec_ready_event e;
        memset(&e, 0, sizeof(e));
        bool ok = kvt_ecc_event_decode(&ev, m, (size_t)n) == 0 && !ev.abandoned;
        if (ok) {
            memcpy(e.transfer_id, ev.transfer_id.ptr, ev.transfer_id.len);
            memcpy(e.mm_hash, ev.mm_hash.ptr, ev.mm_hash.len);
        }
        kvt_ecc_event_release(&ev);
        if (!ok)
            continue;
        (void)kvt_ec_server_with_shard(srv, take_retire, &e);
    }
    zmq_close(pull);
    zmq_ctx_term(ctx);
    kvt_ec_server_stop(srv);
    (void)kvt_ec_shard_destroy(sh);
    free(buf);
    return 0;
}

/* ---- the baseline -----------------------------------------------------------------------------
 */

/* ucx_perftest tag_bw of size bytes on the transport UCX_TLS names: GB/s, 0 if it failed. */
static double perftest_once(uint64_t size, int iters, uint32_t port)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "timeout 60 ucx_perftest -p %u >/dev/null 2>&1 &", port);
    if (system(cmd) != 0)
        return 0;
    usleep(1000 * 1000); /* the server is listening by then */
    snprintf(cmd, sizeof(cmd),
             "timeout 60 ucx_perftest 127.0.0.1 -p %u -t tag_bw -s %llu -n %d 2>/dev/null", port,
             (unsigned long long)size, iters);
    FILE *f = popen(cmd, "r");
    if (!f)
        return 0;
    char line[512];
    double mibs = 0;
    while (fgets(line, sizeof(line), f)) {
        double it, p50, avg, all, bw_avg, bw_all;
        if (sscanf(line, "Final: %lf %lf %lf %lf %lf %lf", &it, &p50, &avg, &all, &bw_avg,
                   &bw_all) == 6)
            mibs = bw_all;
    }
    pclose(f);
    return mibs * 1048576.0 / 1e9;
}

static double perftest_gbps(uint64_t size, int iters)
{
    double g = 0;
    for (uint32_t i = 0; i < 3 && g == 0; i++) /* a port someone else holds: another one */
        g = perftest_once(size, iters, 40000 + (uint32_t)((getpid() * 13u + i * 977u) % 20000u));
    return g;
}

/* ---- the producer (this process) ----------------------------------------------------------- */

typedef struct phase {
    uint64_t size;
    int items;
    double gbps, p50_us, items_per_s;
} phase;

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int push_phase(kvt_ec_producer *prod, const char *addr, phase *ph, uint8_t *src, int seq)
{
    double *lat = calloc((size_t)ph->items, sizeof(double));
    if (!lat)
        return 1;
    double t0 = kvt_now_s();
    int bad = 0;
    char why[256];
    for (int i = 0; i < ph->items && !bad; i++) {
        char tid[48], hash[48];
        snprintf(tid, sizeof(tid), "b%d-%llu-%d", seq, (unsigned long long)ph->size, i);
        snprintf(hash, sizeof(hash), "h%d-%llu-%d", seq, (unsigned long long)ph->size, i);
        kvt_ec_push_spec s;
        memset(&s, 0, sizeof(s));
        s.mm_hash = (kvt_str){hash, (uint32_t)strlen(hash)};
        s.ndim = 1;
        s.shape[0] = ph->size;
        s.dtype = (kvt_str){"uint8", 5};
        s.nbytes = ph->size;
        s.consumer_zmq = (kvt_str){addr, (uint32_t)strlen(addr)};
        s.transfer_id = (kvt_str){tid, (uint32_t)strlen(tid)};
        double a = kvt_now_s();
        bad = kvt_ec_push_now(prod, &s, src, why, sizeof(why)) != 0;
        lat[i] = kvt_now_s() - a;
    }
    double dt = kvt_now_s() - t0;
    if (bad)
        fprintf(stderr, "bench ec: push failed: %s\n", why);
    ph->gbps = (double)ph->size * ph->items / dt / 1e9;
    ph->items_per_s = ph->items / dt;
    qsort(lat, (size_t)ph->items, sizeof(double), cmp_d);
    ph->p50_us = lat[ph->items / 2] * 1e6;
    free(lat);
    return bad;
}

static pid_t spawn_consumer(int *out_fd)
{
    int fds[2];
    if (pipe(fds) != 0)
        return -1;
    char self[4096];
    ssize_t l = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (l <= 0)
        return -1;
    self[l] = 0;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    posix_spawn_file_actions_addclose(&fa, fds[0]);
    char *argv[] = {self, "bench", "ec", "--ec-consumer", NULL};
    pid_t pid;
    int rc = posix_spawn(&pid, self, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    if (rc != 0) {
        close(fds[0]);
        return -1;
    }
    *out_fd = fds[0];
    return pid;
}

static int run(const kvt_bench_opts *o)
{
    if (o->ec_consumer)
        return kvt_bench_ec_consumer();
    const char *tr = o->transport ? o->transport : "tcp";
    const char *tls = strcmp(tr, "tcp") == 0 ? "tcp" : strcmp(tr, "shm") == 0 ? "shm" : NULL;
    if (!tls) {
        fprintf(stderr, "kvtier bench ec: --transport wants tcp or shm\n");
        return 2;
    }
    setenv("UCX_TLS", tls, 1); /* this process, the consumer and ucx_perftest alike */
    int fd;
    pid_t pid = spawn_consumer(&fd);
    if (pid < 0) {
        fprintf(stderr, "kvtier bench ec: cannot start the consumer process\n");
        return 1;
    }
    char line[64] = {0};
    FILE *cf = fdopen(fd, "r");
    unsigned port = 0;
    if (!cf || !fgets(line, sizeof(line), cf) || sscanf(line, "port %u", &port) != 1) {
        fprintf(stderr, "kvtier bench ec: the consumer did not start\n");
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return 1;
    }
    char addr[64];
    snprintf(addr, sizeof(addr), "tcp://127.0.0.1:%u", port);
    kvt_ec_net_config nc;
    kvt_ec_net_config_init(&nc);
    kvt_ec_net_consumer *net = NULL;
    kvt_ec_producer *prod = NULL;
    kvt_ec_producer_config pc;
    kvt_ec_producer_config_init(&pc);
    int bad = kvt_ec_net_consumer_create(&nc, &net);
    if (!bad) {
        pc.ops = kvt_ec_net_consumer_ops(net);
        bad = kvt_ec_producer_create(&pc, &prod);
    }
    uint8_t *src = malloc(16u << 20);
    for (size_t i = 0; src && i < (16u << 20); i++)
        src[i] = (uint8_t)(i * 131u);
    /* item counts: about o->seconds per phase on a slow link, at least a few of each */
    double scale = o->seconds / 2.0;
    phase ph[3] = {{64u << 10, (int)(2000 * scale) + 20, 0, 0, 0},
                   {1u << 20, (int)(300 * scale) + 10, 0, 0, 0},
                   {16u << 20, (int)(40 * scale) + 4, 0, 0, 0}};
    phase warm = {1u << 20, 10, 0, 0, 0};
    if (!bad && src)
        bad = push_phase(prod, addr, &warm, src, 0);
    for (int k = 0; k < 3 && !bad; k++)
        bad = push_phase(prod, addr, &ph[k], src, k + 1);
    kvt_ec_producer_destroy(prod);
    kvt_ec_net_consumer_destroy(net);
    free(src);
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    fclose(cf);
    if (bad) {
        fprintf(stderr, "kvtier bench ec: %s\n", kvt_last_error());
        return 1;
    }
    double base = perftest_gbps(16u << 20, 100);
    if (base <= 0) { /* no baseline, no figure: a ratio of 0 would read as a result */
        fprintf(stderr,
                "kvtier bench ec: the baseline `ucx_perftest tag_bw` did not run on %s (is "
                "ucx-utils installed? scripts/install-deps installs it)\n",
                tr);
        return 1;
    }
    double ratio = ph[2].gbps / base;
    if (o->json) {
        kvt_json j;
        kvt_json_begin(&j, stdout);
        kvt_json_str(&j, "bench", "ec");
        kvt_json_str(&j, "transport", tr);
        kvt_json_num(&j, "gbps", ph[2].gbps);
        kvt_json_num(&j, "ucx_perftest_gbps", base);
        kvt_json_num(&j, "ratio_vs_ucx_perftest", ratio);
        kvt_json_num(&j, "gbps_1m", ph[1].gbps);
        kvt_json_num(&j, "gbps_64k", ph[0].gbps);
        kvt_json_num(&j, "items_per_s_64k", ph[0].items_per_s);
        kvt_json_num(&j, "p50_us_64k", ph[0].p50_us);
        kvt_json_num(&j, "p50_us_1m", ph[1].p50_us);
        kvt_json_num(&j, "p50_us_16m", ph[2].p50_us);
        kvt_json_int(&j, "items_16m", ph[2].items);
        kvt_json_host(&j);
        kvt_json_end(&j);
    } else {
        printf("encoder-cache push over %s (UCX_TLS=%s), producer -> consumer process:\n", tr, tls);
        for (int k = 0; k < 3; k++)
            printf("  %8llu KiB items: %6.2f GB/s, %8.0f items/s, p50 %8.0f us (%d items)\n",
                   (unsigned long long)(ph[k].size >> 10), ph[k].gbps, ph[k].items_per_s,
                   ph[k].p50_us, ph[k].items);
        printf("  ucx_perftest tag_bw 16 MiB: %.2f GB/s; ratio %.2f\n", base, ratio);
    }
    return 0;
}

const kvt_bench kvt_bench_ec = {"ec", "encoder-cache push, 2 processes, vs ucx_perftest", run,
                                "json,seconds,transport,ec-consumer"};
