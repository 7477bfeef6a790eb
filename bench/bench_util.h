/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Shared helpers of the benchmarks: options, a seeded PRNG, timing and a tiny JSON writer.
 * Every benchmark prints exactly one JSON object with --json (and readable lines otherwise).
 */
#ifndef KVT_BENCH_UTIL_H
#define KVT_BENCH_UTIL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

#include "rand.h"

typedef struct kvt_bench_opts {
    bool json;
    double seconds; /* time budget per measured phase */
    uint64_t seed;
    uint32_t blocks;          /* pool size override (0 = the benchmark's default) */
    const char *backend;      /* copy: "cpu" (default) or "cuda" */
    double gib;               /* copy: GiB per direction (0 = the benchmark's default) */
    uint32_t threads;         /* copy: CPU copy threads (0 = the number of cores) */
    const char *dir;          /* disk: directory for the files (default: the current one) */
    const char *transport;    /* ec: "tcp" (default) or "shm" */
    bool ec_consumer;         /* ec: run as the consumer process (internal) */
    const char *peers;        /* ec: the Python that runs the peers (Mooncake, NIXL), or "none" */
    bool detect_peer_failure; /* ec: UCX peer failure detection on the producer's endpoints */
    bool thp;                 /* ec: the source and the receive buffer THP advised */
    uint32_t contend;         /* ec, remote: processes spinning while everything is measured */
    bool contend_pin;         /* ... each pinned to a core (i mod cores) */
} kvt_bench_opts;

typedef struct kvt_bench {
    const char *name;
    const char *what;
    int (*run)(const kvt_bench_opts *opts); /* 0 ok, 1 failure, 2 usage */
    const char *opts; /* the options it reads, comma-separated names (for parsing and --help) */
} kvt_bench;

extern const kvt_bench kvt_bench_pool;
extern const kvt_bench kvt_bench_sched;
extern const kvt_bench kvt_bench_copy;
extern const kvt_bench kvt_bench_disk;
extern const kvt_bench kvt_bench_ec;
extern const kvt_bench kvt_bench_remote;

double kvt_now_s(void);
/* qsort's comparator of doubles, ascending (for percentiles). */
int kvt_cmp_double(const void *a, const void *b);

/* Runs script_name (in bench/peers/, or $KVTIER_PEERS_DIR) with args under the Python that has
 * the peers' packages (--peers, $KVTIER_PEERS_PYTHON, or .venv-bench from make bench-env) and
 * returns the JSON object it printed, or NULL with why set (no such Python, "--peers none", no
 * JSON). */
json_t *kvt_bench_run_peers(const kvt_bench_opts *o, const char *script_name, const char *args,
                            char *why, size_t cap);

/* One JSON object built with jansson, printed by kvt_json_end: kvt_json_begin, then fields.
 * A number that is not finite (a ratio over nothing measured) is written as null, so the
 * output always parses. */
typedef struct kvt_json {
    FILE *f;
    json_t *root;
} kvt_json;

void kvt_json_begin(kvt_json *j, FILE *f);
void kvt_json_str(kvt_json *j, const char *key, const char *val);
void kvt_json_num(kvt_json *j, const char *key, double val);
void kvt_json_int(kvt_json *j, const char *key, long long val);
void kvt_json_bool(kvt_json *j, const char *key, bool val);
/* Sets key to a value built with jansson (the reference is taken over). */
void kvt_json_set(kvt_json *j, const char *key, json_t *val);
/* A finite number, or null. */
json_t *kvt_json_real(double v);
/* Prints the object on one line and frees it; 0, or -1 if it could not be written. */
int kvt_json_end(kvt_json *j);

/* The baseline of the network benchmarks: `ucx_perftest tag_bw` of size bytes, iters
 * iterations, GB/s (0 if it did not run). env: variables for both processes ("" for none);
 * server_prefix: what the server's command line starts with ("" or "ip netns exec NS");
 * host: the address the client reaches the server at. */
double kvt_bench_perftest_gbps(uint64_t size, int iters, const char *env, const char *server_prefix,
                               const char *host);

/* Host description for reports: cores and CPU model, and the contention it ran under. */
void kvt_json_host(kvt_json *j);

/* --contend N: runs measure(o) with o->contend processes spinning around it (kvtier's phases,
 * the baselines' and the peers' alike), each on a core of its own if o->contend_pin (core i mod
 * cores) — an inference server's cores are never idle. They die with the benchmark. Returns
 * measure's code, or 1 if the spinners could not be started. */
#define KVT_BENCH_MAX_CONTEND 64u
int kvt_bench_contended(const kvt_bench_opts *o, int (*measure)(const kvt_bench_opts *o),
                        const char *name);

#endif
