/* SPDX-License-Identifier: Apache-2.0 */
/* `kvtier demo`: the end-to-end demonstration of what kvtier does today. */
#ifndef KVT_TOOLS_DEMO_H
#define KVT_TOOLS_DEMO_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "kvtier/base.h"

/* Runs the demonstration; returns a process exit code (0 when every check passed). */
int kvt_demo_run(uint64_t seed);

/* Faults the soak injects (probabilities per event). */
typedef struct kvt_demo_faults {
    double disk_eio;      /* a disk read or write fails (EIO) */
    double reset;         /* a prefix-cache reset after a turn */
    double delay_report;  /* a worker's report arrives a step late (and out of order) */
    double preempt;       /* a step preempts: the workers flush before blocks are reused */
    double ec_write_fail; /* a producer's write into a shard fails */
    double ec_lost_event; /* a shard's readiness or abandoned event never arrives */
} kvt_demo_faults;

typedef struct kvt_demo_ec_result {
    uint64_t served, failed, mismatches, writers_left, stuck, verified_bytes;
    uint64_t write_faults, lost_events;
    uint64_t leaked_bytes; /* shard buffer bytes given out that no table holds */
    bool pending_pushes;
} kvt_demo_ec_result;

/* Part 3, encoder-cache transfer in process; returns 0 when every check passed and, when
 * metrics is not NULL, the components' Prometheus text (malloc'd) in *metrics. */
int kvt_demo_ec(uint64_t seed, char **metrics);
/* The same with faults (may be NULL), its figures in *res (may be NULL), printed or not. */
int kvt_demo_ec_run(uint64_t seed, const kvt_demo_faults *faults, kvt_demo_ec_result *res,
                    char **metrics, bool print);
/* `kvtier demo --soak SECONDS`: rounds of the offload (three tiers) and encoder-cache
 * workloads with random faults until the time is up, then a summary; 0 when nothing was
 * corrupt, leaked or stuck. */
int kvt_demo_soak(uint64_t seed, double seconds);
/* Several objects' Prometheus texts as one valid exposition (kvt_metrics_merge), malloc'd;
 * NULL with a message on failure. */
char *kvt_demo_merge_metrics(const kvt_metrics_source *src, size_t n);
/* out = the malloc'd Prometheus text of obj (fn: a kvt_*_prometheus function), or NULL. */
#define KVT_DEMO_PROM_TEXT(fn, obj, out)                                                           \
    do {                                                                                           \
        size_t n_ = 0;                                                                             \
        fn(obj, NULL, 0, &n_);                                                                     \
        (out) = malloc(n_ + 1);                                                                    \
        if ((out) && fn(obj, (out), n_ + 1, &n_) != 0) {                                           \
            free(out);                                                                             \
            (out) = NULL;                                                                          \
        }                                                                                          \
    } while (0)
/* Prometheus text of the last host-tier run (NULL before one). */
const char *kvt_demo_metrics(void);
/* Serves text at http://host:port/metrics (port 0: any free port, printed) for seconds
 * (< 0: until SIGINT/SIGTERM). Returns 0 or 1 with a message on stderr. */
int kvt_serve_metrics(const char *host, unsigned port, const char *text, double seconds);

/* `kvtier demo` (demo_engine.c): the reference engine, three runs; a process exit code. */
int kvt_demo_engine(int argc, char **argv);
/* `kvtier ec-encoder`: the encoder process of the demo's third run. */
int kvt_cmd_ec_encoder(int argc, char **argv);

#endif
