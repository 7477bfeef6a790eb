/* SPDX-License-Identifier: Apache-2.0 */
/*
 * `kvtier bench remote`: the remote tier between two instances, against `ucx_perftest tag_bw`
 * with the block size on the same link, in the same command (BENCHMARKS.md).
 *
 * The command starts its own Redis (a unix socket in a temporary directory) and an owner
 * instance (`kvtier remote-peer --serve`, a child process) holding 64 blocks of 1 MiB, and a
 * second one with owner_checksum off holding 64 others; this process is
 * the reader. When it runs as root and may create a network namespace, the owner and its
 * ucx_perftest server run in one of their own, joined to this one by a veth pair (two "hosts"
 * on one machine); otherwise both sides use loopback, and the JSON says which.
 *
 *   lookup_us_p50 / _p99  one kvt_remote_lookup of a request's 64 chained hashes (one Redis
 *                         round trip), over --seconds / 2
 *   load_gbps             bytes / time of kvt_remote_read of all 64 blocks (each a request to
 *                         the owner, its checks, the UCX sends and the reader's checksum),
 *                         repeated over --seconds / 2; the first read's bytes are compared
 *                         with the generator's
 *   ratio_vs_ucx_perftest load_gbps / ucx_perftest tag_bw of one block's size over the link
 *   load_gbps_reader_check_only  the same from a second owner that checks generation and hash
 *                         but not the bytes' tag before it sends (owner_checksum = 0; the
 *                         reader's check of the tag stays)
 *   load_gbps_encrypted   the same from a third owner with encrypt = 1, read by a reader with
 *                         encrypt = 1: the owner checks each block's tag and encrypts it
 *                         (AES-256-GCM) on the way out, the reader decrypts it in place
 *   first_read_extra_us   a fresh reader's first read of one block minus its second: what
 *                         connecting costs once per owner (the ZeroMQ connection, the
 *                         handshake's round trip and key derivations, UCX's endpoint setup)
 *   one_core_gbps         what each block's check costs on one core of this machine, in this
 *                         process: xxh3 (the checksum the tier used before authentication,
 *                         spoofable), GMAC (the tag it uses now), AES-256-GCM (encryption)
 *
 *   ranks2_load_gbps      tensor parallelism 2: two owner processes, the ranks of one
 *                         instance, each serving its half of every block (block size / 2),
 *                         and two reader ranks of this process reading their parts at once
 *                         (kvt_remote_read_from, a thread each) where a lookup-only client
 *                         (the scheduler's) found the blocks: bytes of whole blocks / time;
 *                         ratio_vs_ucx_perftest_ranks2 is over the same ucx_perftest figure
 *
 *   mooncake_store_gbps   Mooncake's store (bench/peers/remote_peers.py, in .venv-bench): its
 *                         master started here, an owner process (in the owner's namespace)
 *                         putting the same 64 blocks, this namespace reading them with
 *                         batch_get_into, no segment of its own; ratio_vs_mooncake_store is
 *                         load_gbps over it (mooncake_store_why when it did not run)
 */
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <xxhash.h>

#include "bench_util.h"
#include "kvtier/remote.h"
#include "redis_server.h"
#include "remote_cmds.h"

#define NBLK 64u
#define TP   2u /* the ranks of the tensor-parallel phase */
#define HL   16u
#define CRED "kvtier-bench-remote-credential"

typedef struct env {
    char dir[64], sock[96], ns[32], host_ip[32], peer_ip[32], prefix[64];
    pid_t redis;
    bool netns;
} env;

/* A namespace with a veth pair to this one; false (loopback) if it cannot be made here. */
static bool make_netns(env *e)
{
    if (geteuid() != 0 || system("command -v ip >/dev/null 2>&1") != 0)
        return false;
    unsigned k = (unsigned)getpid() % 200u;
    snprintf(e->ns, sizeof(e->ns), "kvtb-%d", (int)getpid());
    snprintf(e->host_ip, sizeof(e->host_ip), "10.79.%u.1", k);
    snprintf(e->peer_ip, sizeof(e->peer_ip), "10.79.%u.2", k);
    char cmd[768];
    snprintf(cmd, sizeof(cmd),
             "set -e; ip netns add %s; ip link add kvtbh%d type veth peer name kvtbp%d;"
             "ip link set kvtbp%d netns %s; ip addr add %s/24 dev kvtbh%d;"
             "ip -n %s addr add %s/24 dev kvtbp%d; ip link set kvtbh%d up;"
             "ip -n %s link set kvtbp%d up; ip -n %s link set lo up",
             e->ns, (int)getpid(), (int)getpid(), (int)getpid(), e->ns, e->host_ip, (int)getpid(),
             e->ns, e->peer_ip, (int)getpid(), (int)getpid(), e->ns, (int)getpid(), e->ns);
    if (system(cmd) != 0) {
        snprintf(cmd, sizeof(cmd), "ip netns del %s 2>/dev/null; ip link del kvtbh%d 2>/dev/null",
                 e->ns, (int)getpid());
        (void)system(cmd);
        return false;
    }
    snprintf(e->prefix, sizeof(e->prefix), "ip netns exec %s", e->ns);
    return true;
}

static void teardown(env *e)
{
    char cmd[256];
    if (e->netns) {
        snprintf(cmd, sizeof(cmd), "ip netns del %s 2>/dev/null; ip link del kvtbh%d 2>/dev/null",
                 e->ns, (int)getpid());
        (void)system(cmd);
    }
    kvt_redis_stop(e->redis, e->sock);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", e->dir);
    (void)system(cmd);
}

/* The owner process: `kvtier remote-peer --serve 1`, in the namespace (or here); its stdout
 * is read until it says it serves. */
static pid_t start_owner(const env *e, uint64_t block_kib, const char *name, const char *seq,
                         bool owner_checksum, bool encrypt, int rank)
{
    char self[512];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    int fd[2];
    if (n <= 0 || pipe(fd) != 0)
        return -1;
    self[n] = '\0';
    char blocks[16], slots[16], kib[24];
    snprintf(blocks, sizeof(blocks), "%u", NBLK);
    snprintf(slots, sizeof(slots), "%u", NBLK + 1);
    snprintf(kib, sizeof(kib), "%" PRIu64, block_kib);
    const char *argv[32];
    int k = 0;
    if (e->netns)
        argv[k++] = "ip", argv[k++] = "netns", argv[k++] = "exec", argv[k++] = e->ns;
    const char *rest[] = {
        self,           "remote-peer", "--directory", e->sock,
        "--instance",   name,          "--listen",    e->netns ? e->peer_ip : "127.0.0.1",
        "--credential", CRED,          "--serve",     seq,
        "--blocks",     blocks,        "--slots",     slots,
        "--block-kib",  kib,           NULL};
    for (int i = 0; rest[i]; i++)
        argv[k++] = rest[i];
    if (!owner_checksum)
        argv[k++] = "--no-owner-checksum";
    if (encrypt)
        argv[k++] = "--encrypt";
    char rk[8];
    snprintf(rk, sizeof(rk), "%d", rank);
    if (rank >= 0) /* a rank of an instance of TP ranks, in a space of such instances */
        argv[k++] = "--ranks", argv[k++] = "2", argv[k++] = "--rank", argv[k++] = rk,
        argv[k++] = "--space", argv[k++] = "kvtier-tp";
    argv[k] = NULL;
    pid_t p = fork();
    if (p == 0) {
        dup2(fd[1], 1);
        close(fd[0]);
        close(fd[1]);
        execvp(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(fd[1]);
    FILE *f = p > 0 ? fdopen(fd[0], "r") : NULL;
    char line[512];
    bool up = false;
    while (f && !up && fgets(line, sizeof(line), f))
        up = strstr(line, "serving") != NULL;
    if (f)
        fclose(f);
    else
        close(fd[0]);
    if (!up && p > 0) {
        kill(p, SIGKILL);
        waitpid(p, NULL, 0);
        return -1;
    }
    return p;
}

/* Reads the NBLK blocks at locs again and again for `seconds` (at least 3 times): GB/s, or -1
 * after a failure or wrong bytes (the first read's are compared with the generator's). */
static double read_phase(kvt_remote *r, const kvt_remote_loc *locs, const uint8_t *hashes,
                         uint64_t seq, uint8_t *dst, uint8_t *want, uint64_t bb, double seconds)
{
    void *ptrs[NBLK];
    int st[NBLK];
    for (uint32_t i = 0; i < NBLK; i++)
        ptrs[i] = dst + (uint64_t)i * bb;
    /* one untimed round first: connections, UCX's protocol choice and the destination's
     * pages are set up before the clock runs (the first phase used to pay for them alone) */
    if (kvt_remote_read(r, locs, hashes, NBLK, ptrs, st)) {
        fprintf(stderr, "kvtier bench remote: read: %s\n", kvt_last_error());
        return -1;
    }
    uint64_t bytes = 0, rounds = 0;
    double t_read = 0, t_end = kvt_now_s() + seconds;
    while (rounds < 3 || kvt_now_s() < t_end) {
        double t0 = kvt_now_s();
        int rc = kvt_remote_read(r, locs, hashes, NBLK, ptrs, st);
        t_read += kvt_now_s() - t0;
        if (rc) {
            fprintf(stderr, "kvtier bench remote: read: %s\n", kvt_last_error());
            return -1;
        }
        for (uint32_t i = 0; rounds == 0 && i < NBLK; i++) {
            kvt_remote_seq_fill(seq, i, want, bb);
            if (memcmp(want, ptrs[i], bb) != 0) {
                fprintf(stderr, "kvtier bench remote: block %u read wrong bytes\n", i);
                return -1;
            }
        }
        bytes += NBLK * bb;
        rounds++;
    }
    return (double)bytes / t_read / 1e9;
}

/* A fresh reader's first read of one block of sequence 1 (connection, handshake and UCX
 * endpoint included) minus its second: microseconds. */
static double first_read_extra_us(const kvt_remote_config *base, uint64_t bb)
{
    kvt_remote_config c = *base;
    c.instance = "reader-hs";
    kvt_remote *r;
    uint8_t hashes[HL];
    kvt_remote_seq_hashes(1, 1, HL, hashes);
    kvt_remote_loc loc;
    uint32_t hit = 0;
    void *dst = malloc(bb);
    double t[2] = {-1, -1};
    if (dst && kvt_remote_create(&c, &r) == 0) {
        if (kvt_remote_lookup(r, hashes, 1, &loc, &hit) == 0 && hit == 1)
            for (int k = 0; k < 2; k++) {
                int st;
                double t0 = kvt_now_s();
                if (kvt_remote_read(r, &loc, hashes, 1, &dst, &st) == 0)
                    t[k] = kvt_now_s() - t0;
            }
        kvt_remote_destroy(r);
    }
    free(dst);
    return t[0] >= 0 && t[1] >= 0 ? (t[0] - t[1]) * 1e6 : 0.0 / 0.0;
}

/* One reader rank's read of its part of the NBLK blocks (a thread of ranks_phase). */
typedef struct tp_reader {
    kvt_remote *r;
    kvt_remote_peer peers[KVT_REMOTE_MAX_PEERS];
    uint32_t n_peers;
    kvt_remote_loc locs[NBLK];
    const uint8_t *hashes;
    uint32_t slots[NBLK];
    int st[NBLK];
    int rc;
    uint8_t *region;
} tp_reader;

static void *tp_read(void *arg)
{
    tp_reader *x = arg;
    x->rc =
        kvt_remote_read_from(x->r, x->peers, x->n_peers, x->locs, x->hashes, NBLK, x->slots, x->st);
    return NULL;
}

/* Both reader ranks read their parts at once; 0, or the first failure. */
static int tp_round(tp_reader *x)
{
    pthread_t t[TP];
    for (uint32_t k = 0; k < TP; k++)
        if (pthread_create(&t[k], NULL, tp_read, &x[k]) != 0)
            x[k].rc = KVT_ESYS, t[k] = 0;
    int rc = 0;
    for (uint32_t k = 0; k < TP; k++) {
        if (t[k])
            pthread_join(t[k], NULL);
        if (x[k].rc && !rc)
            rc = x[k].rc;
    }
    return rc;
}

/* Tensor parallelism 2 (the owners started as ranks of "owner-tp", sequence 4, a half block
 * each): a lookup-only client finds the blocks, two reader ranks read their parts at once,
 * each into slots of its own, again and again for `seconds` (at least 3 rounds): GB/s of
 * whole blocks, or -1 after a failure or wrong bytes (the first round's are checked). */
static double ranks_phase(const kvt_remote_config *base, uint64_t bb, double seconds)
{
    const uint64_t part = bb / TP;
    kvt_remote_config c = *base;
    c.space = "kvtier-tp"; /* every instance of a space has the same ranks */
    c.instance = "reader-tp";
    c.ranks = TP;
    c.rank = KVT_REMOTE_NO_RANK;
    c.block_bytes = part;
    kvt_remote *client = NULL;
    tp_reader x[TP];
    memset(x, 0, sizeof(x));
    uint8_t hashes[NBLK * HL], *want = malloc(part);
    kvt_remote_loc locs[NBLK * TP];
    uint32_t hit = 0;
    double gbps = -1;
    int rc = want ? kvt_remote_create(&c, &client) : KVT_ENOMEM;
    for (uint32_t k = 0; k < TP && !rc; k++) {
        c.rank = k;
        c.region = x[k].region = calloc(NBLK + 1, part);
        c.n_slots = NBLK + 1;
        rc = c.region ? kvt_remote_create(&c, &x[k].r) : KVT_ENOMEM;
    }
    kvt_remote_seq_hashes(4, NBLK, HL, hashes);
    if (!rc)
        rc = kvt_remote_lookup(client, hashes, NBLK, locs, &hit);
    if (!rc && hit != NBLK)
        rc = kvt_fail(KVT_ENOENT, "the lookup found %u of %u blocks", hit, NBLK);
    for (uint32_t k = 0; k < TP && !rc; k++) { /* rank k's part of block i: locs[i * TP + k] */
        x[k].hashes = hashes;
        for (uint32_t i = 0; i < NBLK && !rc; i++) {
            uint32_t lp = locs[i * TP + k].peer, j = 0;
            kvt_remote_peer id;
            rc = kvt_remote_lookup_peer(client, lp, &id);
            while (!rc && j < x[k].n_peers && strcmp(x[k].peers[j].instance, id.instance))
                j++;
            if (!rc && j == x[k].n_peers)
                x[k].peers[x[k].n_peers++] = id;
            x[k].locs[i] = locs[i * TP + k];
            x[k].locs[i].peer = j;
            x[k].slots[i] = i + 1;
        }
    }
    if (!rc && !(rc = tp_round(x))) { /* untimed: connections and pages first */
        uint64_t bytes = 0, rounds = 0;
        double t = 0, t_end = kvt_now_s() + seconds;
        while (!rc && (rounds < 3 || kvt_now_s() < t_end)) {
            double t0 = kvt_now_s();
            rc = tp_round(x);
            t += kvt_now_s() - t0;
            for (uint32_t k = 0; !rc && rounds == 0 && k < TP; k++)
                for (uint32_t i = 0; !rc && i < NBLK; i++) {
                    kvt_remote_seq_fill(4 + ((uint64_t)k << 32), i, want, part);
                    if (memcmp(want, x[k].region + (uint64_t)(i + 1) * part, part) != 0)
                        rc = kvt_fail(KVT_EPROTO, "rank %u's part of block %u: wrong bytes", k, i);
                }
            bytes += NBLK * bb;
            rounds++;
        }
        if (!rc)
            gbps = (double)bytes / t / 1e9;
    }
    if (rc)
        fprintf(stderr, "kvtier bench remote: tensor parallelism 2: %s\n", kvt_last_error());
    for (uint32_t k = 0; k < TP; k++) {
        kvt_remote_destroy(x[k].r);
        free(x[k].region);
    }
    kvt_remote_destroy(client);
    free(want);
    return gbps;
}

/* GB/s on one core over a block of bb bytes: xxh3 (the old checksum), GMAC and AES-256-GCM. */
static void one_core(uint64_t bb, uint8_t *buf, double *xxh3, double *gmac, double *gcm)
{
    static const uint8_t key[32] = {1}, iv[12] = {2};
    EVP_CIPHER *aes = EVP_CIPHER_fetch(NULL, "AES-256-GCM", NULL);
    EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
    uint8_t *out = malloc(bb);
    double sec[3] = {0, 0, 0};
    uint64_t sink = 0;
    int reps = 64, l;
    for (int mode = 0; aes && c && out && mode < 3; mode++) {
        double t0 = kvt_now_s();
        for (int k = 0; k < reps; k++) {
            if (mode == 0) {
                sink ^= XXH3_64bits_withSeed(buf, bb, (uint64_t)k);
                continue;
            }
            EVP_EncryptInit_ex(c, aes, NULL, key, iv);
            EVP_EncryptUpdate(c, mode == 1 ? NULL : out, &l, buf, (int)bb);
            EVP_EncryptFinal_ex(c, out, &l);
        }
        sec[mode] = kvt_now_s() - t0;
    }
    double bytes = (double)bb * reps;
    *xxh3 = sec[0] > 0 ? bytes / sec[0] / 1e9 : 0.0 / 0.0;
    *gmac = sec[1] > 0 ? bytes / sec[1] / 1e9 : 0.0 / 0.0;
    *gcm = sec[2] > 0 ? bytes / sec[2] / 1e9 : 0.0 / 0.0;
    if (sink == 1)
        fprintf(stderr, " "); /* keeps the hashing from being optimized away */
    free(out);
    EVP_CIPHER_CTX_free(c);
    EVP_CIPHER_free(aes);
}

/* What one run of the benchmark measured (and the peer's figures or why it did not run). */
struct remote_figures {
    const char *tls, *link;
    uint64_t bb, block_kib;
    size_t nl;                                       /* lookups */
    double p50, p99;                                 /* lookup latency, us */
    double gbps, gbps_fast, gbps_enc, gbps_tp, base; /* reads; base: ucx_perftest */
    double hs_us, core_xxh3, core_gmac, core_gcm;
    double mc_gbps; /* the Mooncake store's, -1 when it did not run (mc_why says why) */
    json_t *mc;
    const char *mc_why;
};

/* The figures as one JSON object (--json) or as text. */
static void print_figures(const kvt_bench_opts *o, const struct remote_figures *f)
{
    if (o->json) {
        kvt_json j;
        kvt_json_begin(&j, stdout);
        kvt_json_str(&j, "bench", "remote");
        kvt_json_host(&j);
        kvt_json_str(&j, "transport", f->tls);
        kvt_json_str(&j, "link", f->link);
        kvt_json_int(&j, "block_bytes", (long long)f->bb);
        kvt_json_int(&j, "blocks_per_read", NBLK);
        kvt_json_int(&j, "lookups", (long long)f->nl);
        kvt_json_num(&j, "lookup_us_p50", f->p50);
        kvt_json_num(&j, "lookup_us_p99", f->p99);
        kvt_json_num(&j, "load_gbps", f->gbps);
        kvt_json_num(&j, "load_gbps_reader_check_only", f->gbps_fast);
        kvt_json_num(&j, "load_gbps_encrypted", f->gbps_enc);
        kvt_json_int(&j, "ranks2_owners", TP);
        kvt_json_num(&j, "ranks2_load_gbps", f->gbps_tp);
        kvt_json_num(&j, "ratio_vs_ucx_perftest_ranks2",
                     f->base > 0 ? f->gbps_tp / f->base : 0.0 / 0.0);
        kvt_json_num(&j, "first_read_extra_us", f->hs_us);
        kvt_json_num(&j, "one_core_xxh3_gbps", f->core_xxh3);
        kvt_json_num(&j, "one_core_gmac_gbps", f->core_gmac);
        kvt_json_num(&j, "one_core_aes_gcm_gbps", f->core_gcm);
        kvt_json_num(&j, "ucx_perftest_gbps", f->base);
        kvt_json_num(&j, "ratio_vs_ucx_perftest", f->base > 0 ? f->gbps / f->base : 0.0 / 0.0);
        kvt_json_num(&j, "ratio_vs_ucx_perftest_reader_check_only",
                     f->base > 0 ? f->gbps_fast / f->base : 0.0 / 0.0);
        kvt_json_num(&j, "ratio_vs_ucx_perftest_encrypted",
                     f->base > 0 ? f->gbps_enc / f->base : 0.0 / 0.0);
        if (f->mc_gbps > 0) {
            kvt_json_num(&j, "mooncake_store_gbps", f->mc_gbps);
            kvt_json_num(&j, "ratio_vs_mooncake_store", f->gbps / f->mc_gbps);
            kvt_json_str(&j, "mooncake_store_version",
                         json_string_value(json_object_get(f->mc, "version")));
        } else {
            kvt_json_set(&j, "ratio_vs_mooncake_store", json_null());
            kvt_json_str(&j, "mooncake_store_why", f->mc_why);
        }
        kvt_json_end(&j);
    } else {
        printf("bench remote (%s, UCX_TLS=%s): lookup of %u chained hashes p50 %.1f us, p99 "
               "%.1f us (%zu lookups)\n",
               f->link, f->tls, NBLK, f->p50, f->p99, f->nl);
        printf("  read of %u x %" PRIu64 " KiB blocks: %.2f GB/s (owner and reader check "
               "tags), %.2f GB/s (reader only), %.2f GB/s (encrypted); ucx_perftest tag_bw "
               "%" PRIu64 " KiB: %.2f GB/s; ratios %.2f, %.2f, %.2f\n",
               NBLK, f->block_kib, f->gbps, f->gbps_fast, f->gbps_enc, f->block_kib, f->base,
               f->base > 0 ? f->gbps / f->base : 0.0, f->base > 0 ? f->gbps_fast / f->base : 0.0,
               f->base > 0 ? f->gbps_enc / f->base : 0.0);
        printf("  tensor parallelism 2 (two owner ranks, two reader ranks at once, each a half "
               "block): %.2f GB/s of whole blocks; ratio %.2f\n",
               f->gbps_tp, f->base > 0 ? f->gbps_tp / f->base : 0.0);
        printf("  a first read costs %.0f us more (connection, handshake, UCX endpoint); one "
               "core: xxh3 %.1f GB/s, GMAC %.1f GB/s, AES-256-GCM "
               "%.1f GB/s\n",
               f->hs_us, f->core_xxh3, f->core_gmac, f->core_gcm);
        if (f->mc_gbps > 0)
            printf("  Mooncake store (batch_get_into of the same blocks, same link): %.2f GB/s; "
                   "ratio %.2f\n",
                   f->mc_gbps, f->gbps / f->mc_gbps);
        else
            printf("  Mooncake store: not run: %s\n", f->mc_why);
    }
}

static int measure(const kvt_bench_opts *o)
{
    env e = {0};
    snprintf(e.dir, sizeof(e.dir), "/tmp/kvtb-remote-XXXXXX");
    if (!mkdtemp(e.dir)) {
        fprintf(stderr, "kvtier bench remote: cannot make a temporary directory\n");
        return 1;
    }
    snprintf(e.sock, sizeof(e.sock), "%s/redis.sock", e.dir);
    const char *tls = o->transport && strcmp(o->transport, "shm") == 0 ? "shm" : "tcp";
    setenv("UCX_TLS", tls, 1);
    e.redis = kvt_redis_start(e.dir, e.sock, NULL);
    if (e.redis <= 0) {
        fprintf(stderr, "kvtier bench remote: cannot start redis-server (scripts/install-deps "
                        "installs it)\n");
        teardown(&e);
        return 1;
    }
    e.netns = strcmp(tls, "tcp") == 0 && make_netns(&e);
    const uint64_t block_kib = 1024, bb = block_kib << 10;
    pid_t owner = start_owner(&e, block_kib, "owner", "1", true, false, -1);
    pid_t owner2 = owner > 0 ? start_owner(&e, block_kib, "owner-fast", "2", false, false, -1) : -1;
    pid_t owner3 = owner2 > 0 ? start_owner(&e, block_kib, "owner-enc", "3", true, true, -1) : -1;
    pid_t tp_owner[TP] = {-1, -1};
    for (int k = 0; k < (int)TP && owner3 > 0; k++)
        tp_owner[k] = start_owner(&e, block_kib / TP, "owner-tp", "4", true, false, k);
    kvt_remote *r = NULL, *renc = NULL;
    json_t *mc_all = NULL; /* the Mooncake store's figures */
    uint8_t *dst = malloc(NBLK * bb), *want = malloc(bb), hashes[NBLK * HL];
    int code = 1;
    if (owner <= 0 || owner2 <= 0 || owner3 <= 0 || tp_owner[0] <= 0 || tp_owner[1] <= 0 || !dst ||
        !want) {
        fprintf(stderr, "kvtier bench remote: the owner did not start\n");
        goto out;
    }
    kvt_remote_config c;
    kvt_remote_config_init(&c);
    c.directory = e.sock;
    c.space = "kvtier";
    c.instance = "reader";
    c.listen_host = e.netns ? e.host_ip : "127.0.0.1";
    c.credential = CRED;
    c.block_bytes = bb;
    c.hash_len = HL;
    c.timeout_ms = 10000;
    double hs_us = first_read_extra_us(&c, bb);
    if (kvt_remote_create(&c, &r)) {
        fprintf(stderr, "kvtier bench remote: %s\n", kvt_last_error());
        goto out;
    }
    c.instance = "reader-enc";
    c.encrypt = 1;
    if (kvt_remote_create(&c, &renc)) {
        fprintf(stderr, "kvtier bench remote: %s\n", kvt_last_error());
        goto out;
    }
    kvt_remote_seq_hashes(1, NBLK, HL, hashes);
    kvt_remote_loc locs[NBLK];
    uint32_t hit = 0;
    /* lookups */
    size_t cap = 1u << 20, nl = 0;
    double *lat = malloc(cap * sizeof(double));
    double t_end = kvt_now_s() + o->seconds / 2;
    while (lat && nl < cap && (nl < 100 || kvt_now_s() < t_end)) {
        double t0 = kvt_now_s();
        (void)kvt_remote_lookup(r, hashes, NBLK, locs, &hit);
        lat[nl++] = (kvt_now_s() - t0) * 1e6;
    }
    if (!lat || hit != NBLK) {
        fprintf(stderr, "kvtier bench remote: the lookup found %u of %u blocks\n", hit, NBLK);
        free(lat);
        goto out;
    }
    qsort(lat, nl, sizeof(double), kvt_cmp_double);
    double p50 = lat[nl / 2], p99 = lat[(size_t)((double)nl * 0.99)];
    free(lat);
    /* reads: sequence 1 from the owner that checks checksums, 2 from the one that does not */
    double gbps = read_phase(r, locs, hashes, 1, dst, want, bb, o->seconds / 4);
    uint8_t hashes2[NBLK * HL];
    kvt_remote_loc locs2[NBLK];
    kvt_remote_seq_hashes(2, NBLK, HL, hashes2);
    (void)kvt_remote_lookup(r, hashes2, NBLK, locs2, &hit);
    double gbps_fast =
        hit == NBLK ? read_phase(r, locs2, hashes2, 2, dst, want, bb, o->seconds / 4) : -1;
    uint8_t hashes3[NBLK * HL];
    kvt_remote_loc locs3[NBLK];
    kvt_remote_seq_hashes(3, NBLK, HL, hashes3);
    (void)kvt_remote_lookup(renc, hashes3, NBLK, locs3, &hit);
    double gbps_enc =
        hit == NBLK ? read_phase(renc, locs3, hashes3, 3, dst, want, bb, o->seconds / 4) : -1;
    double gbps_tp = ranks_phase(&c, bb, o->seconds / 4);
    if (gbps < 0 || gbps_fast < 0 || gbps_enc < 0 || gbps_tp < 0)
        goto out;
    double core_xxh3, core_gmac, core_gcm;
    one_core(bb, dst, &core_xxh3, &core_gmac, &core_gcm);
    double base = kvt_bench_perftest_gbps(bb, 400, "", e.prefix, e.netns ? e.peer_ip : "127.0.0.1");
    const char *link = e.netns ? "veth between two network namespaces" : "loopback";
    /* Mooncake's store on the same link: its owner in the owner's namespace */
    char mc_why[512] = "", mc_args[512];
    snprintf(mc_args, sizeof(mc_args),
             "--blocks %u --block-bytes %" PRIu64 " --seconds %g%s%s%s%s%s%s%s", NBLK, bb,
             o->seconds / 2 > 0.3 ? o->seconds / 2 : 0.3, e.netns ? " --owner-prefix '" : "",
             e.netns ? e.prefix : "", e.netns ? "' --host-ip " : "", e.netns ? e.host_ip : "",
             e.netns ? " --peer-ip " : "", e.netns ? e.peer_ip : "", "");
    mc_all = kvt_bench_run_peers(o, "remote_peers.py", mc_args, mc_why, sizeof(mc_why));
    json_t *mc = mc_all ? json_object_get(mc_all, "mooncake_store") : NULL;
    double mc_gbps = -1;
    if (mc && json_is_true(json_object_get(mc, "ran")))
        mc_gbps = json_number_value(json_object_get(mc, "gbps"));
    else if (mc && json_is_string(json_object_get(mc, "why")))
        snprintf(mc_why, sizeof(mc_why), "%s", json_string_value(json_object_get(mc, "why")));
    else if (mc_all && !mc_why[0])
        snprintf(mc_why, sizeof(mc_why), "remote_peers.py printed no mooncake_store figures");
    struct remote_figures fig = {.tls = tls,
                                 .link = link,
                                 .bb = bb,
                                 .block_kib = block_kib,
                                 .nl = nl,
                                 .p50 = p50,
                                 .p99 = p99,
                                 .gbps = gbps,
                                 .gbps_fast = gbps_fast,
                                 .gbps_enc = gbps_enc,
                                 .gbps_tp = gbps_tp,
                                 .base = base,
                                 .hs_us = hs_us,
                                 .core_xxh3 = core_xxh3,
                                 .core_gmac = core_gmac,
                                 .core_gcm = core_gcm,
                                 .mc_gbps = mc_gbps,
                                 .mc = mc,
                                 .mc_why = mc_why};
    print_figures(o, &fig);
    code = 0;
out:
    json_decref(mc_all);
    kvt_remote_destroy(r);
    kvt_remote_destroy(renc);
    pid_t owners[3 + TP] = {owner, owner2, owner3, tp_owner[0], tp_owner[1]};
    for (int i = 0; i < 3 + (int)TP; i++)
        if (owners[i] > 0) { /* ip netns exec execs the command: the pid is the owner's */
            kill(owners[i], SIGTERM);
            waitpid(owners[i], NULL, 0);
        }
    free(dst);
    free(want);
    teardown(&e);
    return code;
}

static int run(const kvt_bench_opts *o)
{
    return kvt_bench_contended(o, measure, "remote");
}

const kvt_bench kvt_bench_remote = {"remote",
                                    "remote tier: lookup latency and reads between two instances, "
                                    "vs ucx_perftest and Mooncake's store",
                                    run, "json,seconds,transport,peers,contend,contend-pin"};
