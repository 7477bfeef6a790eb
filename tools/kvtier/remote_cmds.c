/* SPDX-License-Identifier: Apache-2.0 */
/*
 * `kvtier remote-peer`: one instance of the remote tier (kvtier/remote.h), for the multi-host
 * test (tests/net/remote_hosts.sh) and the benchmark (bench remote). It either stores a
 * generated sequence of blocks into its region, publishes them and serves peers until
 * SIGTERM / SIGINT, or looks a sequence up and reads what hit, checking every byte against
 * the generator.
 */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"
#include "cli.h"
#include "kvtier/remote.h"
#include "remote_cmds.h"

void kvt_remote_seq_hashes(uint64_t seq, uint32_t n, uint32_t hash_len, uint8_t *out)
{
    /* chained: hash i mixes hash i-1, like a prefix's block hashes */
    uint64_t h = seq * 0x9e3779b97f4a7c15ull + 1;
    for (uint32_t i = 0; i < n; i++) {
        for (uint32_t j = 0; j < hash_len; j++) {
            h ^= h >> 33;
            h *= 0xff51afd7ed558ccdull;
            h ^= (uint64_t)i << 7 ^ j;
            out[(size_t)i * hash_len + j] = (uint8_t)(h >> 24);
        }
    }
}

void kvt_remote_seq_fill(uint64_t seq, uint32_t i, uint8_t *p, uint64_t len)
{
    uint64_t x = seq * 0x2545f4914f6cdd1dull + i * 0x9e3779b97f4a7c15ull + 1;
    for (uint64_t k = 0; k + 8 <= len; k += 8) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        memcpy(p + k, &x, 8);
    }
}

static volatile sig_atomic_t g_stop;

static void on_signal(int sig)
{
    (void)sig;
    g_stop = 1;
}

#define PEER_HASH_LEN 16u /* bytes of a block hash */

/* What `kvtier remote-peer` was asked. */
struct peer_args {
    const char *directory, *space, *instance, *listen;
    const char *advertise, *credential;
    uint64_t port, seed, block_kib, slots, timeout, ttl;
    uint64_t serve, read_seq, blocks, repeat;
    uint64_t expect, ranks, rank;
    bool no_owner_checksum, encrypt;
};

/* The command line into *a: 0, or the exit code (-1: help printed, exit 0). */
static int parse_peer_args(int argc, char **argv, struct peer_args *a)
{
    *a = (struct peer_args){.space = "kvtier",
                            .listen = "127.0.0.1",
                            .block_kib = 64,
                            .slots = 1024,
                            .timeout = 2000,
                            .ttl = 3000,
                            .serve = UINT64_MAX,
                            .read_seq = UINT64_MAX,
                            .blocks = 64,
                            .repeat = 1,
                            .expect = UINT64_MAX,
                            .ranks = 1};
    const kvt_opt opts[] = {
        {"directory", KVT_OPT_STR, &a->directory, "ADDR",
         "the Redis server: host:port or a unix socket path (required)"},
        {"space", KVT_OPT_STR, &a->space, "S", "the space (default kvtier)"},
        {"instance", KVT_OPT_STR, &a->instance, "I", "this instance's name (required)"},
        {"listen", KVT_OPT_STR, &a->listen, "HOST",
         "address the read server binds (default 127.0.0.1)"},
        {"port", KVT_OPT_U64, &a->port, "P", "its port (default: any)", .lo = 0, .hi = 65535},
        {"advertise", KVT_OPT_STR, &a->advertise, "HOST", "address peers use (default: --listen)"},
        {"credential", KVT_OPT_STR, &a->credential, "SECRET",
         "the space's shared secret, 16..256 bytes (required;\n"
         "default: $KVTIER_REMOTE_CREDENTIAL)"},
        {"seed", KVT_OPT_U64, &a->seed, "N", "hash seed fingerprint (default 0)", .lo = 0,
         .hi = UINT64_MAX},
        {"block-kib", KVT_OPT_U64, &a->block_kib, "K", "block size, KiB (default 64)", .lo = 1,
         .hi = 1u << 20},
        {"slots", KVT_OPT_U64, &a->slots, "N", "slots of the served region (default 1024)", .lo = 1,
         .hi = 1u << 24},
        {"timeout-ms", KVT_OPT_U64, &a->timeout, "T", "a read's bound (default 2000)", .lo = 1,
         .hi = 3600000},
        {"ttl-ms", KVT_OPT_U64, &a->ttl, "T", "liveness key lifetime (default 3000)", .lo = 30,
         .hi = 3600000},
        {"serve", KVT_OPT_U64, &a->serve, "SEQ",
         "store sequence SEQ (--blocks of it), publish, serve", .lo = 0, .hi = UINT32_MAX},
        {"read", KVT_OPT_U64, &a->read_seq, "SEQ", "look sequence SEQ up, read and check the hits",
         .lo = 0, .hi = UINT32_MAX},
        {"blocks", KVT_OPT_U64, &a->blocks, "N", "blocks of the sequence (default 64)", .lo = 1,
         .hi = KVT_REMOTE_MAX_READ},
        {"repeat", KVT_OPT_U64, &a->repeat, "R", "--read: rounds (default 1)", .lo = 1,
         .hi = 1u << 30},
        {"no-owner-checksum", KVT_OPT_FLAG, &a->no_owner_checksum, NULL,
         "--serve: check generation and hash only before sending\n"
         "(kvt_remote_config.owner_checksum = 0; readers still check)"},
        {"encrypt", KVT_OPT_FLAG, &a->encrypt, NULL,
         "the bytes travel encrypted (kvt_remote_config.encrypt = 1;\n"
         "an owner that sets it serves encrypted reads only)"},
        {"ranks", KVT_OPT_U64, &a->ranks, "N",
         "--serve: one rank of an engine of N ranks (default 1);\n"
         "it serves as <instance>#<rank>, its part of each block\n"
         "generated as sequence SEQ + (rank << 32)",
         .lo = 1, .hi = KVT_REMOTE_MAX_RANKS},
        {"rank", KVT_OPT_U64, &a->rank, "K", "--serve: which rank (default 0)", .lo = 0,
         .hi = KVT_REMOTE_MAX_RANKS - 1},
        {"expect-hits", KVT_OPT_U64, &a->expect, "N",
         "--read: fail unless the last round found and read N blocks", .lo = 0,
         .hi = KVT_REMOTE_MAX_READ},
    };
    kvt_cli cli = {
        .prog = "kvtier remote-peer",
        .usage = "kvtier remote-peer --directory ADDR --instance I --credential C "
                 "(--serve SEQ | --read SEQ) [options]",
        .about = "  One remote-tier instance: serves a generated sequence of blocks, or finds\n"
                 "  and reads one from its peers, checking every byte.\n",
        .opts = opts,
        .n_opts = sizeof(opts) / sizeof(opts[0]),
        .footer = "  KVTIER_REMOTE_DIRECTORY_PASSWORD: Redis's password (AUTH; user:password).\n"
                  "  UCX_TLS selects the data plane's transports. Exit code 0: served until\n"
                  "  stopped, or every block read was intact (and --expect-hits held);\n"
                  "  1: a failure; 2: a usage error.\n"};
    int prc = kvt_cli_parse(&cli, argc, argv);
    if (prc)
        return prc;
    if (!a->credential)
        a->credential = getenv("KVTIER_REMOTE_CREDENTIAL");
    if (!a->directory || !a->instance || !a->credential ||
        (a->serve == UINT64_MAX) == (a->read_seq == UINT64_MAX) ||
        (a->serve != UINT64_MAX && a->blocks >= a->slots) || a->rank >= a->ranks ||
        (a->ranks > 1 && a->serve == UINT64_MAX)) {
        fprintf(stderr, "kvtier remote-peer: --directory, --instance, --credential and one of "
                        "--serve / --read are required; --blocks must be below --slots; --rank "
                        "below --ranks, which only --serve takes\n");
        return KVT_EXIT_USAGE;
    }
    return 0;
}

/* The remote tier's configuration for a (a server: region, of a->slots blocks). */
static void peer_config(const struct peer_args *a, uint8_t *region, kvt_remote_config *cfg)
{
    const uint64_t bb = a->block_kib << 10;
    kvt_remote_config c;
    kvt_remote_config_init(&c);
    c.directory = a->directory;
    c.space = a->space;
    c.instance = a->instance;
    c.listen_host = a->listen;
    c.listen_port = (uint16_t)a->port;
    c.advertise_host = a->advertise;
    c.credential = a->credential;
    c.block_bytes = bb;
    c.hash_len = PEER_HASH_LEN;
    c.hash_seed = a->seed;
    c.timeout_ms = (uint32_t)a->timeout;
    c.ttl_ms = (uint32_t)a->ttl;
    c.owner_checksum = a->no_owner_checksum ? 0 : 1;
    c.encrypt = a->encrypt ? 1 : 0;
    c.directory_password = getenv("KVTIER_REMOTE_DIRECTORY_PASSWORD");
    c.ranks = (uint32_t)a->ranks;
    c.rank = (uint32_t)a->rank;
    if (region) {
        c.region = region;
        c.n_slots = (uint32_t)a->slots;
    }
    *cfg = c;
}

/* --serve: sequence a->serve stored into region and published, served until a signal. */
static int peer_serve(kvt_remote *r, const struct peer_args *a, uint8_t *region, uint8_t *hashes)
{
    const uint64_t bb = a->block_kib << 10;
    int code = KVT_EXIT_OK;
    /* wait until registered (a previous instance of this name may still be live) */
    kvt_remote_stats st;
    for (int i = 0; i < 2000 && !g_stop; i++) {
        kvt_remote_get_stats(r, &st);
        if (st.epoch)
            break;
        usleep(10000);
    }
    uint32_t *sl = malloc(a->blocks * sizeof(*sl));
    kvt_remote_seq_hashes(a->serve, (uint32_t)a->blocks, PEER_HASH_LEN, hashes);
    for (uint32_t i = 0; sl && i < a->blocks; i++) {
        sl[i] = i + 1;
        kvt_remote_seq_fill(a->serve + (a->rank << 32), i, region + (uint64_t)sl[i] * bb, bb);
    }
    if (!sl || kvt_remote_publish(r, sl, hashes, (uint32_t)a->blocks)) {
        fprintf(stderr, "kvtier remote-peer: publish: %s\n", kvt_last_error());
        code = KVT_EXIT_FAIL;
    }
    free(sl);
    kvt_remote_get_stats(r, &st);
    printf("remote-peer: %s serving sequence %" PRIu64 " (%" PRIu64 " blocks of %" PRIu64
           " KiB) on port %u, epoch %" PRIu64 "\n",
           a->instance, a->serve, a->blocks, a->block_kib, kvt_remote_port(r), st.epoch);
    fflush(stdout);
    while (!g_stop && code == KVT_EXIT_OK)
        usleep(20000);
    kvt_remote_get_stats(r, &st);
    printf("remote-peer: %s done: %" PRIu64 " blocks served, %" PRIu64 " stale, %" PRIu64
           " requests refused, %" PRIu64 " registrations\n",
           a->instance, st.served_blocks, st.served_stale, st.refused_requests, st.registrations);
    return code;
}

/* --read: sequence a->read_seq looked up and read a->repeat times, every byte checked. */
static int peer_read(kvt_remote *r, const struct peer_args *a, uint8_t *hashes)
{
    const uint64_t bb = a->block_kib << 10;
    int code = KVT_EXIT_OK;
    uint8_t *dst = malloc(a->blocks * bb);
    void **ptrs = malloc(a->blocks * sizeof(*ptrs));
    int *status = malloc(a->blocks * sizeof(*status));
    kvt_remote_loc *locs = malloc(a->blocks * sizeof(*locs));
    uint8_t *want = malloc(bb);
    if (!dst || !ptrs || !status || !locs || !want) {
        fprintf(stderr, "kvtier remote-peer: out of memory\n");
        code = KVT_EXIT_FAIL;
    }
    kvt_remote_seq_hashes(a->read_seq, (uint32_t)a->blocks, PEER_HASH_LEN, hashes);
    uint64_t hits = 0, ok = 0, stale = 0, failed = 0, corrupt = 0, last_hit = 0, last_ok = 0;
    double t_read = 0;
    for (uint64_t k = 0; code == KVT_EXIT_OK && k < a->repeat && !g_stop; k++) {
        uint32_t hit = 0;
        (void)kvt_remote_lookup(r, hashes, (uint32_t)a->blocks, locs, &hit);
        for (uint32_t i = 0; i < hit; i++)
            ptrs[i] = dst + (uint64_t)i * bb;
        double t0 = kvt_now_s();
        (void)kvt_remote_read(r, locs, hashes, hit, ptrs, status);
        t_read += kvt_now_s() - t0;
        last_hit = hit, last_ok = 0, hits += hit;
        for (uint32_t i = 0; i < hit; i++) {
            if (status[i] == 0) {
                kvt_remote_seq_fill(a->read_seq, i, want, bb);
                if (memcmp(want, dst + (uint64_t)i * bb, bb) != 0) {
                    corrupt++;
                    fprintf(stderr,
                            "remote-peer: block %u of sequence %" PRIu64 " read wrong bytes\n", i,
                            a->read_seq);
                } else {
                    ok++, last_ok++;
                }
            } else if (status[i] == KVT_ENOENT) {
                stale++;
            } else {
                failed++;
            }
        }
    }
    printf("remote-peer: read sequence %" PRIu64 ": %" PRIu64 " rounds, %" PRIu64 " hit, %" PRIu64
           " ok, %" PRIu64 " stale, %" PRIu64 " failed, %" PRIu64 " corrupt; last round %" PRIu64
           " hit, %" PRIu64 " ok; %.2f GB/s\n",
           a->read_seq, a->repeat, hits, ok, stale, failed, corrupt, last_hit, last_ok,
           t_read > 0 ? (double)ok * (double)bb / t_read / 1e9 : 0.0);
    if (corrupt || (a->expect != UINT64_MAX && (last_hit != a->expect || last_ok != a->expect)))
        code = KVT_EXIT_FAIL;
    free(dst), free(ptrs), free(status), free(locs), free(want);
    return code;
}

int kvt_cmd_remote_peer(int argc, char **argv)
{
    struct peer_args args, *a = &args;
    int prc = parse_peer_args(argc, argv, a);
    if (prc)
        return prc < 0 ? 0 : prc;
    const uint64_t bb = a->block_kib << 10;
    uint8_t *region = NULL;
    if (a->serve != UINT64_MAX) {
        region = calloc(a->slots, bb);
        if (!region) {
            fprintf(stderr, "kvtier remote-peer: out of memory for %" PRIu64 " slots\n", a->slots);
            return KVT_EXIT_FAIL;
        }
    }
    kvt_remote_config c;
    peer_config(a, region, &c);
    uint8_t *hashes = malloc((size_t)a->blocks * PEER_HASH_LEN);
    kvt_remote *r = NULL;
    int rc = hashes ? kvt_remote_create(&c, &r) : KVT_ENOMEM;
    if (rc) {
        fprintf(stderr, "kvtier remote-peer: %s\n", kvt_last_error());
        free(region);
        free(hashes);
        return KVT_EXIT_FAIL;
    }
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    int code = a->serve != UINT64_MAX ? peer_serve(r, a, region, hashes) : peer_read(r, a, hashes);
    kvt_remote_destroy(r);
    free(region);
    free(hashes);
    return code;
}
