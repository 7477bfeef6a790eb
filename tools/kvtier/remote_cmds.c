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

int kvt_cmd_remote_peer(int argc, char **argv)
{
    const char *directory = NULL, *space = "kvtier", *instance = NULL, *listen = "127.0.0.1";
    const char *advertise = NULL, *credential = NULL;
    uint64_t port = 0, seed = 0, block_kib = 64, slots = 1024, timeout = 2000, ttl = 3000;
    uint64_t serve = UINT64_MAX, read_seq = UINT64_MAX, blocks = 64, repeat = 1;
    uint64_t expect = UINT64_MAX, ranks = 1, rank = 0;
    bool no_owner_checksum = false, encrypt = false;
    const kvt_opt opts[] = {
        {"directory", KVT_OPT_STR, &directory, "ADDR",
         "the Redis server: host:port or a unix socket path (required)"},
        {"space", KVT_OPT_STR, &space, "S", "the space (default kvtier)"},
        {"instance", KVT_OPT_STR, &instance, "I", "this instance's name (required)"},
        {"listen", KVT_OPT_STR, &listen, "HOST",
         "address the read server binds (default 127.0.0.1)"},
        {"port", KVT_OPT_U64, &port, "P", "its port (default: any)", .lo = 0, .hi = 65535},
        {"advertise", KVT_OPT_STR, &advertise, "HOST", "address peers use (default: --listen)"},
        {"credential", KVT_OPT_STR, &credential, "SECRET",
         "the space's shared secret, 16..256 bytes (required;\n"
         "default: $KVTIER_REMOTE_CREDENTIAL)"},
        {"seed", KVT_OPT_U64, &seed, "N", "hash seed fingerprint (default 0)", .lo = 0,
         .hi = UINT64_MAX},
        {"block-kib", KVT_OPT_U64, &block_kib, "K", "block size, KiB (default 64)", .lo = 1,
         .hi = 1u << 20},
        {"slots", KVT_OPT_U64, &slots, "N", "slots of the served region (default 1024)", .lo = 1,
         .hi = 1u << 24},
        {"timeout-ms", KVT_OPT_U64, &timeout, "T", "a read's bound (default 2000)", .lo = 1,
         .hi = 3600000},
        {"ttl-ms", KVT_OPT_U64, &ttl, "T", "liveness key lifetime (default 3000)", .lo = 30,
         .hi = 3600000},
        {"serve", KVT_OPT_U64, &serve, "SEQ", "store sequence SEQ (--blocks of it), publish, serve",
         .lo = 0, .hi = UINT32_MAX},
        {"read", KVT_OPT_U64, &read_seq, "SEQ", "look sequence SEQ up, read and check the hits",
         .lo = 0, .hi = UINT32_MAX},
        {"blocks", KVT_OPT_U64, &blocks, "N", "blocks of the sequence (default 64)", .lo = 1,
         .hi = KVT_REMOTE_MAX_READ},
        {"repeat", KVT_OPT_U64, &repeat, "R", "--read: rounds (default 1)", .lo = 1,
         .hi = 1u << 30},
        {"no-owner-checksum", KVT_OPT_FLAG, &no_owner_checksum, NULL,
         "--serve: check generation and hash only before sending\n"
         "(kvt_remote_config.owner_checksum = 0; readers still check)"},
        {"encrypt", KVT_OPT_FLAG, &encrypt, NULL,
         "the bytes travel encrypted (kvt_remote_config.encrypt = 1;\n"
         "an owner that sets it serves encrypted reads only)"},
        {"ranks", KVT_OPT_U64, &ranks, "N",
         "--serve: one rank of an engine of N ranks (default 1);\n"
         "it serves as <instance>#<rank>, its part of each block\n"
         "generated as sequence SEQ + (rank << 32)",
         .lo = 1, .hi = KVT_REMOTE_MAX_RANKS},
        {"rank", KVT_OPT_U64, &rank, "K", "--serve: which rank (default 0)", .lo = 0,
         .hi = KVT_REMOTE_MAX_RANKS - 1},
        {"expect-hits", KVT_OPT_U64, &expect, "N",
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
        return prc < 0 ? 0 : prc;
    if (!credential)
        credential = getenv("KVTIER_REMOTE_CREDENTIAL");
    if (!directory || !instance || !credential ||
        (serve == UINT64_MAX) == (read_seq == UINT64_MAX) ||
        (serve != UINT64_MAX && blocks >= slots) || rank >= ranks ||
        (ranks > 1 && serve == UINT64_MAX)) {
        fprintf(stderr, "kvtier remote-peer: --directory, --instance, --credential and one of "
                        "--serve / --read are required; --blocks must be below --slots; --rank "
                        "below --ranks, which only --serve takes\n");
        return KVT_EXIT_USAGE;
    }
    const uint32_t hl = 16;
    const uint64_t bb = block_kib << 10;
    kvt_remote_config c;
    kvt_remote_config_init(&c);
    c.directory = directory;
    c.space = space;
    c.instance = instance;
    c.listen_host = listen;
    c.listen_port = (uint16_t)port;
    c.advertise_host = advertise;
    c.credential = credential;
    c.block_bytes = bb;
    c.hash_len = hl;
    c.hash_seed = seed;
    c.timeout_ms = (uint32_t)timeout;
    c.ttl_ms = (uint32_t)ttl;
    c.owner_checksum = no_owner_checksum ? 0 : 1;
    c.encrypt = encrypt ? 1 : 0;
    c.directory_password = getenv("KVTIER_REMOTE_DIRECTORY_PASSWORD");
    c.ranks = (uint32_t)ranks;
    c.rank = (uint32_t)rank;
    uint8_t *region = NULL;
    if (serve != UINT64_MAX) {
        region = calloc(slots, bb);
        if (!region) {
            fprintf(stderr, "kvtier remote-peer: out of memory for %" PRIu64 " slots\n", slots);
            return KVT_EXIT_FAIL;
        }
        c.region = region;
        c.n_slots = (uint32_t)slots;
    }
    uint8_t *hashes = malloc((size_t)blocks * hl);
    kvt_remote *r = NULL;
    int rc = hashes ? kvt_remote_create(&c, &r) : KVT_ENOMEM;
    if (rc) {
        fprintf(stderr, "kvtier remote-peer: %s\n", kvt_last_error());
        free(region);
        free(hashes);
        return KVT_EXIT_FAIL;
    }
    int code = KVT_EXIT_OK;
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    if (serve != UINT64_MAX) {
        /* wait until registered (a previous instance of this name may still be live) */
        kvt_remote_stats st;
        for (int i = 0; i < 2000 && !g_stop; i++) {
            kvt_remote_get_stats(r, &st);
            if (st.epoch)
                break;
            usleep(10000);
        }
        uint32_t *sl = malloc(blocks * sizeof(*sl));
        kvt_remote_seq_hashes(serve, (uint32_t)blocks, hl, hashes);
        for (uint32_t i = 0; sl && i < blocks; i++) {
            sl[i] = i + 1;
            kvt_remote_seq_fill(serve + (rank << 32), i, region + (uint64_t)sl[i] * bb, bb);
        }
        if (!sl || kvt_remote_publish(r, sl, hashes, (uint32_t)blocks)) {
            fprintf(stderr, "kvtier remote-peer: publish: %s\n", kvt_last_error());
            code = KVT_EXIT_FAIL;
        }
        free(sl);
        kvt_remote_get_stats(r, &st);
        printf("remote-peer: %s serving sequence %" PRIu64 " (%" PRIu64 " blocks of %" PRIu64
               " KiB) on port %u, epoch %" PRIu64 "\n",
               instance, serve, blocks, block_kib, kvt_remote_port(r), st.epoch);
        fflush(stdout);
        while (!g_stop && code == KVT_EXIT_OK)
            usleep(20000);
        kvt_remote_get_stats(r, &st);
        printf("remote-peer: %s done: %" PRIu64 " blocks served, %" PRIu64 " stale, %" PRIu64
               " requests refused, %" PRIu64 " registrations\n",
               instance, st.served_blocks, st.served_stale, st.refused_requests, st.registrations);
    } else {
        uint8_t *dst = malloc(blocks * bb);
        void **ptrs = malloc(blocks * sizeof(*ptrs));
        int *status = malloc(blocks * sizeof(*status));
        kvt_remote_loc *locs = malloc(blocks * sizeof(*locs));
        uint8_t *want = malloc(bb);
        if (!dst || !ptrs || !status || !locs || !want) {
            fprintf(stderr, "kvtier remote-peer: out of memory\n");
            code = KVT_EXIT_FAIL;
        }
        kvt_remote_seq_hashes(read_seq, (uint32_t)blocks, hl, hashes);
        uint64_t hits = 0, ok = 0, stale = 0, failed = 0, corrupt = 0, last_hit = 0, last_ok = 0;
        double t_read = 0;
        for (uint64_t k = 0; code == KVT_EXIT_OK && k < repeat && !g_stop; k++) {
            uint32_t hit = 0;
            (void)kvt_remote_lookup(r, hashes, (uint32_t)blocks, locs, &hit);
            for (uint32_t i = 0; i < hit; i++)
                ptrs[i] = dst + (uint64_t)i * bb;
            double t0 = kvt_now_s();
            (void)kvt_remote_read(r, locs, hashes, hit, ptrs, status);
            t_read += kvt_now_s() - t0;
            last_hit = hit, last_ok = 0, hits += hit;
            for (uint32_t i = 0; i < hit; i++) {
                if (status[i] == 0) {
                    kvt_remote_seq_fill(read_seq, i, want, bb);
                    if (memcmp(want, dst + (uint64_t)i * bb, bb) != 0) {
                        corrupt++;
                        fprintf(stderr,
                                "remote-peer: block %u of sequence %" PRIu64 " read wrong bytes\n",
                                i, read_seq);
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
        printf("remote-peer: read sequence %" PRIu64 ": %" PRIu64 " rounds, %" PRIu64
               " hit, %" PRIu64 " ok, %" PRIu64 " stale, %" PRIu64 " failed, %" PRIu64
               " corrupt; last round %" PRIu64 " hit, %" PRIu64 " ok; %.2f GB/s\n",
               read_seq, repeat, hits, ok, stale, failed, corrupt, last_hit, last_ok,
               t_read > 0 ? (double)ok * (double)bb / t_read / 1e9 : 0.0);
        if (corrupt || (expect != UINT64_MAX && (last_hit != expect || last_ok != expect)))
            code = KVT_EXIT_FAIL;
        free(dst), free(ptrs), free(status), free(locs), free(want);
    }
    kvt_remote_destroy(r);
    free(region);
    free(hashes);
    return code;
}
