/* SPDX-License-Identifier: Apache-2.0 */
/*
 * `kvtier ec-consumer` and `kvtier ec-producer`: the encoder-cache transfer as two standalone
 * processes (on one host or two), for trying it out, for tests across network namespaces and
 * for operators checking a link. Items are generated from a seed and their names, so the
 * consumer can check every byte it receives without being told what to expect.
 *
 * Item i of producer seed S: transfer id "S-i", mm_hash "img-S-i", nbytes between --min-kib
 * and --max-kib (log-uniform, a multiple of 2), dtype bfloat16, bytes from xorshift64 seeded by
 * (S, i). The consumer takes every ready item on every shard, checks it, retires it.
 */
#include <math.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "kvtier/base.h"
#include "rand.h"
#include "bench_util.h"
#include "cli.h"
#include "ec_cmds.h"
#include "kvtier/kvtier.h"

static volatile sig_atomic_t g_stop;

static void on_signal(int sig)
{
    (void)sig;
    g_stop = 1;
}

static void fill(uint8_t *p, uint64_t n, uint64_t seed, uint64_t i)
{
    uint64_t x = (seed * 0x9E3779B97F4A7C15ull) ^ (i * 0xBF58476D1CE4E5B9ull) ^ n;
    x |= 1;
    for (uint64_t k = 0; k < n; k += 8) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        memcpy(p + k, &x, n - k < 8 ? n - k : 8);
    }
}

static uint64_t item_bytes(uint64_t seed, uint64_t i, uint64_t min, uint64_t max)
{
    uint64_t r = seed * 1000003u + i;
    double lo = (double)min, hi = (double)max;
    double u = (double)kvt_rand_below(&r, 1u << 30) / (double)(1u << 30);
    double v = lo * pow(hi / lo, u);
    uint64_t n = (uint64_t)v & ~1ull;
    return n < 2 ? 2 : n;
}

/* ---- consumer ------------------------------------------------------------------------------ */

typedef struct check_arg {
    char tid[KVT_EC_KEY_MAX + 1], hash[KVT_EC_KEY_MAX + 1];
    uint64_t nbytes;
    uint8_t *scratch;
    int result; /* 1 ok, 0 mismatch, -1 not an item of ours (taken and retired anyway) */
} check_arg;

static int take_check_retire(kvt_ec_shard *sh, void *arg)
{
    check_arg *a = arg;
    kvt_slab_view v;
    int rc = kvt_ec_shard_take(sh, a->tid, (uint32_t)strlen(a->tid), a->hash,
                               (uint32_t)strlen(a->hash), NULL, &v);
    if (rc)
        return rc;
    unsigned long long seed, i;
    a->result = -1;
    if (sscanf(a->tid, "%llu-%llu", &seed, &i) == 2 && v.nbytes == a->nbytes) {
        fill(a->scratch, v.nbytes, seed, i);
        a->result = memcmp(a->scratch, v.ptr, v.nbytes) == 0;
    }
    return kvt_ec_shard_retire(sh, a->hash, (uint32_t)strlen(a->hash), NULL) == 1 ? 0 : KVT_ESTATE;
}

/* What `kvtier ec-consumer` was asked. */
struct consumer_args {
    const char *host;
    uint64_t port, shards, dp, mib, ttl, exit_after;
};

/* The command line into *a: 0, or the exit code (-1: help printed, exit 0). */
static int parse_consumer_args(int argc, char **argv, struct consumer_args *a)
{
    *a = (struct consumer_args){.shards = 1, .mib = 256, .ttl = 300};
    const kvt_opt opts[] = {
        {"host", KVT_OPT_STR, &a->host, "ADDR",
         "address to bind (required; 0.0.0.0 binds every interface)"},
        {"port", KVT_OPT_U64, &a->port, "P", "control port of shard 0 (required)", .lo = 1,
         .hi = 65535},
        {"shards", KVT_OPT_U64, &a->shards, "N", "tensor-parallel shards, 1..64 (default 1)",
         .lo = 1, .hi = 64},
        {"dp", KVT_OPT_U64, &a->dp, "D", "data-parallel index of this consumer (default 0)",
         .lo = 0, .hi = 65535},
        {"buffer-mib", KVT_OPT_U64, &a->mib, "M", "receive buffer per shard, MiB (default 256)",
         .lo = 1, .hi = 1 << 20},
        {"ttl", KVT_OPT_U64, &a->ttl, "S",
         "reservation TTL in seconds (default 300): a producer that\n"
         "dies mid-push has its reservations reaped after it",
         .lo = 1, .hi = 86400},
        {"exit-after", KVT_OPT_U64, &a->exit_after, "N",
         "stop after N items were checked on every shard (default:\n"
         "run until SIGINT or SIGTERM)",
         .lo = 1, .hi = 1u << 30},
    };
    kvt_cli cli = {
        .prog = "kvtier ec-consumer",
        .usage = "kvtier ec-consumer --host ADDR --port P [options]",
        .about = "  Runs an encoder-cache consumer: SHARDS consumer shards, each with a receive\n"
                 "  buffer, a ZeroMQ control server at tcp://ADDR:P+DP*SHARDS+rank and a UCX\n"
                 "  receive on every reserved region. Every item that becomes ready on a shard is\n"
                 "  taken, checked byte for byte against the generator `kvtier ec-producer` uses,\n"
                 "  and retired. Prints a line per second and a summary at the end.\n",
        .opts = opts,
        .n_opts = sizeof(opts) / sizeof(opts[0]),
        .footer = "  UCX_TLS selects the data plane's transports (e.g. tcp, shm).\n"
                  "  Exit code 0: every checked item was intact; 1: one was not, or a failure;\n"
                  "  2: a usage error.\n"};
    int prc = kvt_cli_parse(&cli, argc, argv);
    if (prc)
        return prc;
    if (!a->host || !a->port) {
        fprintf(stderr, "kvtier ec-consumer: --host and --port are required (see --help)\n");
        return 2;
    }
    /* Shard k listens on a->port + k; the a->shards of data-parallel indexes 0..dp-1 sit below. */
    if (a->port + a->shards - 1 > 65535 || a->dp * a->shards >= a->port) {
        fprintf(stderr,
                "kvtier ec-consumer: --port %llu with --shards %llu and --dp %llu needs ports "
                "%llu..%llu (base %lld): out of 1..65535\n",
                (unsigned long long)a->port, (unsigned long long)a->shards,
                (unsigned long long)a->dp, (unsigned long long)a->port,
                (unsigned long long)(a->port + a->shards - 1),
                (long long)a->port - (long long)(a->dp * a->shards));
        return 2;
    }
    return 0;
}

/* A running consumer: its shards, their servers and receive buffers, the events socket and
 * what was checked. */
struct consumer {
    const struct consumer_args *a;
    uint8_t *buf[KVT_EC_MAX_SHARDS];
    kvt_ec_shard *sh[KVT_EC_MAX_SHARDS];
    kvt_ec_server *srv[KVT_EC_MAX_SHARDS];
    uint8_t *scratch;
    void *ctx, *pull;
    uint64_t ok, bad, other, bytes, abandoned;
};

/* The shards, each with its receive buffer and control server, and the socket their
 * readiness events arrive on: 0, or the failure (kvt_fail). */
static int consumer_open(struct consumer *s)
{
    const struct consumer_args *a = s->a;
    uint64_t cap = a->mib << 20;
    s->scratch = malloc(cap);
    int rc = s->scratch
                 ? 0
                 : kvt_fail(KVT_ENOMEM, "cannot allocate a %llu MiB check buffer (--buffer-mib)",
                            (unsigned long long)a->mib);
    for (uint32_t k = 0; k < a->shards && !rc; k++) {
        s->buf[k] = aligned_alloc(4096, cap);
        if (!s->buf[k]) {
            rc = kvt_fail(KVT_ENOMEM,
                          "cannot allocate the %llu MiB receive buffer of shard %u "
                          "(--buffer-mib)",
                          (unsigned long long)a->mib, k);
            break;
        }
        kvt_ec_shard_config sc;
        kvt_ec_shard_config_init(&sc);
        sc.base = s->buf[k];
        sc.capacity = cap;
        sc.ttl_ns = a->ttl * 1000000000ull;
        rc = s->buf[k] ? kvt_ec_shard_create(&sc, &s->sh[k]) : KVT_ENOMEM;
        kvt_ec_server_config c;
        kvt_ec_server_config_init(&c);
        c.host = a->host;
        c.base_port = (uint32_t)a->port - (uint32_t)(a->dp * a->shards); /* --port names shard 0 */
        c.dp_index = (uint32_t)a->dp;
        c.tp_size = (uint32_t)a->shards;
        c.tp_rank = k;
        if (!rc)
            rc = kvt_ec_server_start(&c, s->sh[k], &s->srv[k]);
    }
    s->ctx = zmq_ctx_new();
    s->pull = s->ctx ? zmq_socket(s->ctx, ZMQ_PULL) : NULL;
    if (!s->pull && !rc)
        rc = kvt_fail(KVT_EIO, "cannot open the events socket");
    int t = 200, zero = 0;
    if (s->pull) {
        zmq_setsockopt(s->pull, ZMQ_RCVTIMEO, &t, sizeof(t));
        zmq_setsockopt(s->pull, ZMQ_LINGER, &zero, sizeof(zero));
    }
    for (uint32_t k = 0; k < a->shards && !rc; k++) {
        if (zmq_connect(s->pull, kvt_ec_server_event_endpoint(s->srv[k])) != 0)
            rc = kvt_fail(KVT_EIO, "cannot connect to the events of shard %u", k);
    }
    return rc;
}

/* Every ready item taken, checked and retired until a signal (or --exit-after); a line a
 * second. */
static int consumer_run(struct consumer *s)
{
    const struct consumer_args *args = s->a;
    printf("ec-consumer: %llu shard(s) on %s, control ports %u..%u, %llu MiB each\n",
           (unsigned long long)args->shards, args->host, kvt_ec_server_port(s->srv[0]),
           kvt_ec_server_port(s->srv[args->shards - 1]), (unsigned long long)args->mib);
    fflush(stdout);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    double t0 = kvt_now_s(), last = t0;
    check_arg *a = calloc(1, sizeof(*a));
    if (!a)
        return kvt_fail(KVT_ENOMEM, "out of memory");
    a->scratch = s->scratch;
    while (!g_stop &&
           !(args->exit_after && s->ok + s->bad + s->other >= args->exit_after * args->shards)) {
        uint8_t m[2048];
        int n = zmq_recv(s->pull, m, sizeof(m), 0);
        if (n > 0) {
            kvt_ec_ready_event e;
            uint32_t shard;
            if (kvt_ec_event_decode(m, (size_t)n, &e, &shard) == 0 && shard < args->shards) {
                if (e.abandoned) {
                    s->abandoned++;
                } else {
                    snprintf(a->tid, sizeof(a->tid), "%s", e.transfer_id);
                    snprintf(a->hash, sizeof(a->hash), "%s", e.mm_hash);
                    a->nbytes = e.nbytes;
                    if (kvt_ec_server_with_shard(s->srv[shard], take_check_retire, a) == 0) {
                        s->ok += a->result == 1;
                        s->bad += a->result == 0;
                        s->other += a->result < 0;
                        s->bytes += e.nbytes;
                    }
                }
            }
        }
        double now = kvt_now_s();
        if (now - last >= 1.0) {
            printf("ec-consumer: %llu items checked (%llu corrupt), %.1f MiB, %llu abandoned\n",
                   (unsigned long long)(s->ok + s->bad), (unsigned long long)s->bad,
                   (double)s->bytes / (1 << 20), (unsigned long long)s->abandoned);
            fflush(stdout);
            last = now;
        }
    }
    free(a);
    return 0;
}

/* Everything consumer_open made (a buffer a writer may still write is kept): the dead
 * writers the servers reaped and the writers still active. */
static void consumer_close(struct consumer *s, uint64_t *reaped_out, uint64_t *writers_out)
{
    const struct consumer_args *a = s->a;
    if (s->pull)
        zmq_close(s->pull);
    if (s->ctx)
        zmq_ctx_term(s->ctx);
    uint64_t reaped = 0, writers = 0;
    for (uint32_t k = 0; k < a->shards; k++) {
        if (s->srv[k]) {
            kvt_ec_server_stats ss;
            kvt_ec_server_get_stats(s->srv[k], &ss);
            reaped += ss.writers_reaped;
        }
        kvt_ec_server_stop(s->srv[k]);
        if (s->sh[k]) {
            writers += kvt_ec_shard_writers(s->sh[k]);
            if (kvt_ec_shard_destroy(s->sh[k]) == 0)
                free(s->buf[k]); /* a writer still active keeps its buffer (never freed under it) */
        }
    }
    free(s->scratch);
    *reaped_out = reaped;
    *writers_out = writers;
}

int kvt_cmd_ec_consumer(int argc, char **argv)
{
    struct consumer_args args;
    int prc = parse_consumer_args(argc, argv, &args);
    if (prc)
        return prc < 0 ? 0 : prc;
    struct consumer cons = {.a = &args}, *s = &cons;
    int rc = consumer_open(s);
    if (!rc)
        rc = consumer_run(s);
    uint64_t reaped, writers;
    consumer_close(s, &reaped, &writers);
    if (rc) {
        fprintf(stderr, "kvtier ec-consumer: %s\n", kvt_last_error());
        return 1;
    }
    printf("ec-consumer: done: %llu items intact, %llu corrupt, %llu not ours, %.1f MiB; %llu "
           "abandoned, %llu dead writers reaped, %llu writers active at exit\n",
           (unsigned long long)s->ok, (unsigned long long)s->bad, (unsigned long long)s->other,
           (double)s->bytes / (1 << 20), (unsigned long long)s->abandoned,
           (unsigned long long)reaped, (unsigned long long)writers);
    return s->bad ? 1 : 0;
}

/* ---- producer ------------------------------------------------------------------------------ */

int kvt_ec_push_now(kvt_ec_producer *p, const kvt_ec_push_spec *s, const void *src, char *why,
                    size_t cap)
{
    if (kvt_ec_producer_push(p, s) == 0 &&
        kvt_ec_producer_bind_source(p, s->mm_hash.ptr, s->mm_hash.len, src, s->nbytes, NULL) == 1 &&
        kvt_ec_producer_dispatch(p) >= 0 &&
        kvt_ec_producer_state(p, s->transfer_id.ptr, s->transfer_id.len) == KVT_ECP_DONE)
        return 0;
    kvt_ec_push_failure f;
    snprintf(why, cap, "%s", kvt_ec_producer_take_failures(p, &f, 1) ? f.error : kvt_last_error());
    return -1;
}

int kvt_cmd_ec_producer(int argc, char **argv)
{
    const char *consumer = NULL;
    uint64_t items = 100, seed = 1, min_kib = 1, max_kib = 16384, timeout = 30000;
    uint64_t die_after = UINT64_MAX;
    const kvt_opt opts[] = {
        {"consumer", KVT_OPT_STR, &consumer, "ADDR",
         "the consumer's shard-0 control address (required)"},
        {"items", KVT_OPT_U64, &items, "N", "items to push (default 100)", .lo = 1, .hi = 1u << 30},
        {"seed", KVT_OPT_U64, &seed, "S", "generator seed; item i is \"S-i\" (default 1)", .lo = 0,
         .hi = UINT64_MAX},
        {"min-kib", KVT_OPT_U64, &min_kib, "A", "smallest item, KiB (default 1)", .lo = 1,
         .hi = 1u << 20},
        {"max-kib", KVT_OPT_U64, &max_kib, "B", "largest item, KiB (default 16384 = 16 MiB)",
         .lo = 1, .hi = 1u << 20},
        {"timeout-ms", KVT_OPT_U64, &timeout, "T",
         "each control exchange and each write (default 30000)", .lo = 1, .hi = 3600000},
        {"die-after", KVT_OPT_U64, &die_after, "N",
         "fault injection: after N items, reserve the next one on\n"
         "every shard and die (SIGKILL) before writing it",
         .lo = 0, .hi = 1u << 30},
    };
    kvt_cli cli = {
        .prog = "kvtier ec-producer",
        .usage = "kvtier ec-producer --consumer tcp://ADDR:P [options]",
        .about = "  Pushes generated encoder outputs into a consumer's shards (ZeroMQ control,\n"
                 "  UCX data), one at a time, and prints what happened.\n",
        .opts = opts,
        .n_opts = sizeof(opts) / sizeof(opts[0]),
        .footer = "  UCX_TLS selects the data plane's transports (e.g. tcp, shm).\n"
                  "  Exit code 0: every push completed on every shard; 1: one failed;\n"
                  "  2: a usage error.\n"};
    int prc = kvt_cli_parse(&cli, argc, argv);
    if (prc)
        return prc < 0 ? 0 : prc;
    if (!consumer || min_kib > max_kib) {
        fprintf(stderr, "kvtier ec-producer: --consumer is required and --min-kib must not "
                        "exceed --max-kib (see --help)\n");
        return 2;
    }
    kvt_ec_net_config nc;
    kvt_ec_net_config_init(&nc);
    nc.control_timeout_ms = nc.write_timeout_ms = (uint32_t)timeout;
    kvt_ec_net_consumer *net = NULL;
    kvt_ec_producer *prod = NULL;
    kvt_ec_producer_config pc;
    kvt_ec_producer_config_init(&pc);
    int rc = kvt_ec_net_consumer_create(&nc, &net);
    if (!rc) {
        pc.ops = kvt_ec_net_consumer_ops(net);
        rc = kvt_ec_producer_create(&pc, &prod);
    }
    uint8_t *src = rc ? NULL : malloc(max_kib << 10);
    uint64_t done = 0, failed = 0, bytes = 0;
    double t0 = kvt_now_s();
    for (uint64_t i = 0; src && i < items; i++) {
        if (i == die_after) { /* a producer that dies mid-push: reserved, nothing written */
            char tid[48], hash[56];
            snprintf(tid, sizeof(tid), "%llu-%llu", (unsigned long long)seed,
                     (unsigned long long)i);
            snprintf(hash, sizeof(hash), "img-%s", tid);
            uint64_t n = item_bytes(seed, i, min_kib << 10, max_kib << 10);
            kvt_ec_item it = {hash, (uint32_t)strlen(hash), n, 1, {n / 2}, "bfloat16", 8};
            kvt_ec_consumer_ops ops = kvt_ec_net_consumer_ops(net);
            uint32_t shards = 0;
            (void)ops.shards(ops.ctx, consumer, &shards);
            for (uint32_t k = 0; k < shards; k++) {
                kvt_ec_reply r;
                (void)ops.reserve(ops.ctx, consumer, k, tid, (uint32_t)strlen(tid), &it, &r);
            }
            raise(SIGKILL);
        }
        char tid[48], hash[56];
        snprintf(tid, sizeof(tid), "%llu-%llu", (unsigned long long)seed, (unsigned long long)i);
        snprintf(hash, sizeof(hash), "img-%s", tid);
        uint64_t n = item_bytes(seed, i, min_kib << 10, max_kib << 10);
        fill(src, n, seed, i);
        kvt_ec_push_spec s;
        memset(&s, 0, sizeof(s));
        s.mm_hash = (kvt_str){hash, (uint32_t)strlen(hash)};
        s.ndim = 1;
        s.shape[0] = n / 2;
        s.dtype = (kvt_str){"bfloat16", 8};
        s.nbytes = n;
        s.consumer_zmq = (kvt_str){consumer, (uint32_t)strlen(consumer)};
        s.transfer_id = (kvt_str){tid, (uint32_t)strlen(tid)};
        char why[256];
        if (kvt_ec_push_now(prod, &s, src, why, sizeof(why)) == 0) {
            done++;
            bytes += n;
        } else {
            failed++;
            fprintf(stderr, "ec-producer: item %s failed: %s\n", tid, why);
        }
    }
    double dt = kvt_now_s() - t0;
    free(src);
    kvt_ec_producer_destroy(prod);
    kvt_ec_net_consumer_destroy(net);
    if (rc) {
        fprintf(stderr, "kvtier ec-producer: %s\n", kvt_last_error());
        return 1;
    }
    printf("ec-producer: %llu of %llu items pushed (%llu failed), %.1f MiB in %.2f s (%.2f GB/s)\n",
           (unsigned long long)done, (unsigned long long)items, (unsigned long long)failed,
           (double)bytes / (1 << 20), dt, dt > 0 ? (double)bytes / dt / 1e9 : 0.0);
    return failed ? 1 : 0;
}

/* ---- soak: a producer killed mid-push ------------------------------------------------------ */

static int shard_figures(kvt_ec_shard *sh, void *arg)
{
    kvt_ec_shard_get_stats(sh, arg);
    return 0;
}

static pid_t spawn_producer(uint32_t port, int items, uint64_t seed, int die_after)
{
    char self[4096], addr[64], its[16], sd[24], die[16];
    snprintf(die, sizeof(die), "%d", die_after < 0 ? items + 1 : die_after);
    ssize_t l = readlink("/proc/self/exe", self, sizeof(self) - 1);
    self[l > 0 ? l : 0] = 0;
    snprintf(addr, sizeof(addr), "tcp://127.0.0.1:%u", port);
    snprintf(its, sizeof(its), "%d", items);
    snprintf(sd, sizeof(sd), "%llu", (unsigned long long)seed);
    char *argv[] = {
        self,        "ec-producer", "--consumer",  addr, "--items",      its,    "--seed", sd,
        "--max-kib", "1024",        "--die-after", die,  "--timeout-ms", "2000", NULL};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    extern char **environ;
    pid_t pid;
    int rc = posix_spawn(&pid, self, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    return rc == 0 ? pid : -1;
}

int kvt_ec_net_soak_round(uint64_t seed, kvt_ec_net_soak *res)
{
    enum { SH = 2, ITEMS = 30 };
    const uint64_t cap = 16u << 20;
    memset(res, 0, sizeof(*res));
    uint8_t *buf[SH] = {0};
    kvt_ec_shard *sh[SH] = {0};
    kvt_ec_server *srv[SH] = {0};
    uint8_t *scratch = malloc(cap);
    int rc = scratch ? 0 : KVT_ENOMEM;
    for (uint32_t k = 0; k < SH && !rc; k++) {
        buf[k] = aligned_alloc(4096, cap);
        kvt_ec_shard_config sc;
        kvt_ec_shard_config_init(&sc);
        sc.base = buf[k];
        sc.capacity = cap;
        sc.ttl_ns = 1000000000ull; /* a killed producer's writers are reaped after 1 s */
        rc = buf[k] ? kvt_ec_shard_create(&sc, &sh[k]) : KVT_ENOMEM;
    }
    kvt_ec_server_config c;
    kvt_ec_server_config_init(&c);
    c.host = "127.0.0.1";
    c.tp_size = SH;
    c.poll_ms = 10;
    c.expire_interval_ns = 50000000ull;
    for (uint32_t i = 0; i < 100 && !rc; i++) { /* a free pair of ports */
        c.base_port = 20000 + (uint32_t)((getpid() * 131u + seed * 17u + i * 389u) % 30000u);
        int e = 0;
        for (uint32_t k = 0; k < SH && !e; k++) {
            c.tp_rank = k;
            e = kvt_ec_server_start(&c, sh[k], &srv[k]);
        }
        if (!e)
            break;
        for (uint32_t k = 0; k < SH; k++) {
            kvt_ec_server_stop(srv[k]);
            srv[k] = NULL;
        }
        if (i == 99)
            rc = e;
    }
    void *ctx = zmq_ctx_new(), *pull = zmq_socket(ctx, ZMQ_PULL);
    int t = 20, zero = 0;
    zmq_setsockopt(pull, ZMQ_RCVTIMEO, &t, sizeof(t));
    zmq_setsockopt(pull, ZMQ_LINGER, &zero, sizeof(zero));
    for (uint32_t k = 0; k < SH && !rc; k++) {
        zmq_connect(pull, kvt_ec_server_event_endpoint(srv[k]));
    }
    /* half the time the producer dies mid-push: after a random number of items it reserves
     * the next one everywhere and kills itself before writing it */
    uint64_t r = seed * 0x9E3779B97F4A7C15ull | 1;
    int die = kvt_rand_below(&r, 2) == 0 ? (int)kvt_rand_below(&r, ITEMS) : -1;
    res->killed = die >= 0;
    pid_t pid = rc ? -1 : spawn_producer(kvt_ec_server_port(srv[0]), ITEMS, seed, die);
    if (!rc && pid < 0)
        rc = kvt_fail(KVT_ESYS, "soak: cannot start a producer process");
    double deadline = kvt_now_s() + 15.0;
    bool exited = false;
    check_arg *a = calloc(1, sizeof(*a));
    if (a)
        a->scratch = scratch;
    while (!rc && a && kvt_now_s() < deadline) {
        if (!exited && waitpid(pid, NULL, WNOHANG) == pid)
            exited = true;
        uint8_t m[2048];
        int n = zmq_recv(pull, m, sizeof(m), 0);
        if (n > 0) {
            kvt_ec_ready_event e;
            uint32_t shard;
            if (kvt_ec_event_decode(m, (size_t)n, &e, &shard) == 0 && shard < SH && !e.abandoned) {
                snprintf(a->tid, sizeof(a->tid), "%s", e.transfer_id);
                snprintf(a->hash, sizeof(a->hash), "%s", e.mm_hash);
                a->nbytes = e.nbytes;
                if (kvt_ec_server_with_shard(srv[shard], take_check_retire, a) == 0) {
                    res->items_checked += a->result == 1;
                    res->corrupt += a->result != 1;
                    res->bytes += e.nbytes;
                }
            }
            continue;
        }
        if (!exited)
            continue;
        /* the producer is gone: done once no writer is left on any shard */
        uint64_t writers = 0;
        for (uint32_t k = 0; k < SH; k++) {
            kvt_ec_shard_stats st;
            (void)kvt_ec_server_with_shard(srv[k], shard_figures, &st);
            writers += st.writers;
        }
        if (writers == 0)
            break;
    }
    free(a);
    if (pid > 0 && !exited) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    for (uint32_t k = 0; k < SH; k++) {
        if (srv[k]) {
            kvt_ec_shard_stats st;
            kvt_ec_server_stats ss;
            (void)kvt_ec_server_with_shard(srv[k], shard_figures, &st);
            kvt_ec_server_get_stats(srv[k], &ss);
            res->writers_left += st.writers;
            res->leaked_bytes += st.capacity - st.free_bytes - st.held_bytes;
            res->reaped += ss.writers_reaped;
        }
        kvt_ec_server_stop(srv[k]);
        if (sh[k] && kvt_ec_shard_destroy(sh[k]) == 0)
            free(buf[k]); /* a writer still active keeps its buffer */
    }
    zmq_close(pull);
    zmq_ctx_term(ctx);
    free(scratch);
    if (rc)
        return rc;
    return res->corrupt || res->writers_left || res->leaked_bytes ? 1 : 0;
}
