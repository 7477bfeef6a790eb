/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The kvtier command-line tool: `kvtier demo`, `kvtier bench <name> [--json]`, --help and
 * --version. Subcommands live in their own files; this file only parses arguments.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "demo.h"
#include "ec_cmds.h"
#include "kvtier/kvtier.h"

static const kvt_bench *const benches[] = {&kvt_bench_pool, &kvt_bench_sched, &kvt_bench_copy,
                                           &kvt_bench_disk, &kvt_bench_ec};

static void usage(FILE *f)
{
    fprintf(
        f,
        "kvtier %s - KV-cache offload and encoder-cache transfer for LLM inference engines\n"
        "\n"
        "usage:\n"
        "  kvtier demo [options]              the reference engine with and without kvtier\n"
        "                                     (kvtier demo --help)\n"
        "  kvtier demo --components [--metrics-port P]  the library's parts one by one\n"
        "  kvtier demo --soak SECONDS         random faults, then a summary\n"
        "  kvtier bench <name> [options]      run a benchmark\n"
        "      --json          print one JSON object\n"
        "      --seconds S     time budget per measured phase (default 2)\n"
        "      --seed N        workload seed (default 1)\n"
        "      --blocks N      pool size where the benchmark has one\n"
        "      --backend B     copy: cpu (default) or cuda\n"
        "      --gib G         copy, disk: GiB moved per direction (default 1)\n"
        "      --threads N     copy: CPU copy threads (default: the number of cores)\n"
        "      --dir D         disk: directory of the test files (default: .)\n"
        "      --transport T   ec: tcp (default) or shm (UCX_TLS=shm: shared memory + cma)\n"
        "  kvtier bench --list                list the benchmarks\n"
        "  kvtier ec-consumer --host A --port P [options]   an encoder-cache consumer (--help)\n"
        "  kvtier ec-producer --consumer tcp://A:P [options] pushes into one (--help)\n"
        "  kvtier ec-encoder --consumer tcp://A:P [options]  the demo's encoder process (--help)\n"
        "  kvtier --help | --version\n"
        "\n"
        "environment: KVTIER_LOG=off|error|warn|info|debug|trace (default warn)\n",
        kvt_version());
}

static int parse_u64(const char *s, uint64_t *v)
{
    char *end;
    unsigned long long x = strtoull(s, &end, 10);
    if (!*s || *end)
        return -1;
    *v = x;
    return 0;
}

static int cmd_bench(int argc, char **argv)
{
    kvt_bench_opts o = {.json = false, .seconds = 2.0, .seed = 1, .blocks = 0, .backend = "cpu"};
    const char *name = NULL;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        uint64_t v;
        if (strcmp(a, "--json") == 0) {
            o.json = true;
        } else if (strcmp(a, "--list") == 0) {
            for (size_t k = 0; k < sizeof(benches) / sizeof(benches[0]); k++)
                printf("%-8s %s\n", benches[k]->name, benches[k]->what);
            return 0;
        } else if (strcmp(a, "--seconds") == 0 && i + 1 < argc) {
            char *end;
            o.seconds = strtod(argv[++i], &end);
            if (*end || o.seconds <= 0 || o.seconds > 3600) {
                fprintf(stderr, "kvtier bench: --seconds wants a number in (0, 3600]\n");
                return 2;
            }
        } else if (strcmp(a, "--seed") == 0 && i + 1 < argc) {
            if (parse_u64(argv[++i], &o.seed)) {
                fprintf(stderr, "kvtier bench: --seed wants an integer\n");
                return 2;
            }
        } else if (strcmp(a, "--blocks") == 0 && i + 1 < argc) {
            if (parse_u64(argv[++i], &v) || v < 2 || v > UINT32_MAX - 1) {
                fprintf(stderr, "kvtier bench: --blocks wants an integer in 2..2^32-2\n");
                return 2;
            }
            o.blocks = (uint32_t)v;
        } else if (strcmp(a, "--backend") == 0 && i + 1 < argc) {
            o.backend = argv[++i];
            if (strcmp(o.backend, "cpu") != 0 && strcmp(o.backend, "cuda") != 0) {
                fprintf(stderr, "kvtier bench: --backend wants cpu or cuda\n");
                return 2;
            }
        } else if (strcmp(a, "--gib") == 0 && i + 1 < argc) {
            char *end;
            o.gib = strtod(argv[++i], &end);
            if (*end || o.gib <= 0 || o.gib > 1024) {
                fprintf(stderr, "kvtier bench: --gib wants a number in (0, 1024]\n");
                return 2;
            }
        } else if (strcmp(a, "--dir") == 0 && i + 1 < argc) {
            o.dir = argv[++i];
        } else if (strcmp(a, "--transport") == 0 && i + 1 < argc) {
            o.transport = argv[++i];
            if (strcmp(o.transport, "tcp") != 0 && strcmp(o.transport, "shm") != 0) {
                fprintf(stderr, "kvtier bench: --transport wants tcp or shm\n");
                return 2;
            }
        } else if (strcmp(a, "--ec-consumer") == 0) {
            o.ec_consumer = true;
        } else if (strcmp(a, "--threads") == 0 && i + 1 < argc) {
            if (parse_u64(argv[++i], &v) || v < 1 || v > 256) {
                fprintf(stderr, "kvtier bench: --threads wants an integer in 1..256\n");
                return 2;
            }
            o.threads = (uint32_t)v;
        } else if (a[0] != '-' && !name) {
            name = a;
        } else {
            fprintf(stderr, "kvtier bench: unknown argument '%s'\n", a);
            return 2;
        }
    }
    if (!name) {
        fprintf(stderr, "kvtier bench: which benchmark? (kvtier bench --list)\n");
        return 2;
    }
    for (size_t k = 0; k < sizeof(benches) / sizeof(benches[0]); k++)
        if (strcmp(benches[k]->name, name) == 0)
            return benches[k]->run(&o);
    fprintf(stderr, "kvtier bench: no benchmark named '%s' (kvtier bench --list)\n", name);
    return 2;
}

static int cmd_demo_components(int argc, char **argv)
{
    uint64_t seed = 1, port = 0;
    bool serve = false;
    double seconds = -1, soak = 0;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            printf(
                "kvtier demo --components [--seed N] [--metrics-port P [--metrics-seconds S]]\n"
                "kvtier demo --soak SECONDS [--seed N]\n"
                "  --components runs the library's parts one by one: a multi-turn chat workload on "
                "the GPU\n"
                "  tier, with a host tier, with three tiers (host + disk); one step's metadata\n"
                "  across the wire; encoder-cache transfer between an encoder and a 2-shard\n"
                "  prefill instance. Every figure printed is checked; exit code 0 = all passed.\n"
                "  --seed N             workload seed (default 1)\n"
                "  --metrics-port P     then serve the runs' Prometheus metrics at\n"
                "                       http://0.0.0.0:P/metrics (0: any free port, printed)\n"
                "  --metrics-seconds S  serve for S seconds (default: until interrupted)\n"
                "  --soak SECONDS       instead, rounds of the three-tier offload and the\n"
                "                       encoder-cache workloads with random faults (disk EIO\n"
                "                       and torn writes, resets, delayed and reordered worker\n"
                "                       reports, preemption flushes, failed encoder-cache\n"
                "                       writes, lost readiness events, producer processes\n"
                "                       killed mid-push) until SECONDS passed;\n"
                "                       then a summary. Exit code 0 only if nothing was\n"
                "                       corrupt, leaked or stuck (docs/reliability.md).\n"
                "  The three-tier run creates kvtier-demo-disk.rank0 in the working directory\n"
                "  (a file system with O_DIRECT, or buffered I/O is used) and removes it.\n");
            return 0;
        } else if (strcmp(argv[i], "--components") == 0) {
            continue;
        } else if (strcmp(argv[i], "--soak") == 0 && i + 1 < argc) {
            char *end;
            soak = strtod(argv[++i], &end);
            if (*end || soak <= 0) {
                fprintf(stderr, "kvtier demo: --soak wants a number of seconds > 0\n");
                return 2;
            }
        } else if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc) {
            if (parse_u64(argv[++i], &seed)) {
                fprintf(stderr, "kvtier demo: --seed wants an integer\n");
                return 2;
            }
        } else if (strcmp(argv[i], "--metrics-port") == 0 && i + 1 < argc) {
            if (parse_u64(argv[++i], &port) || port > 65535) {
                fprintf(stderr, "kvtier demo: --metrics-port wants a port 0..65535\n");
                return 2;
            }
            serve = true;
        } else if (strcmp(argv[i], "--metrics-seconds") == 0 && i + 1 < argc) {
            char *end;
            seconds = strtod(argv[++i], &end);
            if (*end || seconds < 0) {
                fprintf(stderr, "kvtier demo: --metrics-seconds wants a number >= 0\n");
                return 2;
            }
        } else {
            fprintf(stderr, "kvtier demo: unknown argument '%s'\n", argv[i]);
            return 2;
        }
    }
    if (soak > 0)
        return kvt_demo_soak(seed, soak);
    int rc = kvt_demo_run(seed);
    if (serve && kvt_demo_metrics())
        rc |= kvt_serve_metrics((unsigned)port, kvt_demo_metrics(), seconds);
    return rc;
}

static const char demo_help[] =
    "kvtier demo [options]\n"
    "  The main demonstration: a reference engine (a small transformer with a paged KV cache,\n"
    "  a vLLM-like scheduler, tensor-parallel ranks as threads, a vision encoder) serves a\n"
    "  multi-turn chat workload with images three times: without offload, with the host tier,\n"
    "  and with the host tier plus an encoder process pushing embeddings over UCX. Checks that\n"
    "  the generated tokens are identical, every transferred embedding equals the local one,\n"
    "  the host tier was hit and saved prefill, every block loaded from it holds the KV\n"
    "  computed for its hash (checksums per rank) and nothing leaked; prints a table, writes\n"
    "  report.json and ttft.svg (gnuplot). Exit 0 = all passed, 1 = a check failed (named).\n"
    "  --requests N            conversations (default 16)\n"
    "  --turns T               turns per conversation (default 4)\n"
    "  --tp N                  tensor-parallel ranks: 1, 2 or 4 (default 2)\n"
    "  --concurrency N         turns in flight at once (default 4)\n"
    "  --cpu-bytes B           host tier across ranks, with K/M/G suffix (default 512M)\n"
    "  --lazy                  lazy stores (default eager)\n"
    "  --gpu-blocks N          GPU-tier KV blocks of 16 tokens per rank (default 512)\n"
    "  --max-batched-tokens N  tokens per step (default 512)\n"
    "  --doc-tokens N          longest first-turn document (default 1500)\n"
    "  --answer-tokens N       tokens generated per turn (default 16)\n"
    "  --images N              distinct images (default 8; 0: none)\n"
    "  --seed N                workload and weights seed (default 1)\n"
    "  --out DIR               where report.json and ttft.svg go (default .)\n"
    "  --json                  the report on stdout (the table goes to stderr)\n"
    "  --inject corrupt|swap|drop  a fault on rank 0 to watch the KV check fail: a loaded\n"
    "                          block's byte flipped, two loaded blocks swapped, or every\n"
    "                          store reported done without its bytes\n"
    "  --no-plot, --no-progress\n"
    "kvtier demo --components [...]   the library's parts one by one (--components --help)\n"
    "kvtier demo --soak SECONDS       random faults for SECONDS (docs/reliability.md)\n";

static int cmd_demo(int argc, char **argv)
{
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--components") == 0 || strcmp(argv[i], "--soak") == 0 ||
            strcmp(argv[i], "--metrics-port") == 0)
            return cmd_demo_components(argc, argv);
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(demo_help, stdout);
            return 0;
        }
    }
    return kvt_demo_engine(argc, argv);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(cmd, "--version") == 0) {
        printf("kvtier %s\n", kvt_version());
        return 0;
    }
    if (strcmp(cmd, "bench") == 0)
        return cmd_bench(argc - 2, argv + 2);
    if (strcmp(cmd, "demo") == 0)
        return cmd_demo(argc - 2, argv + 2);
    if (strcmp(cmd, "ec-consumer") == 0)
        return kvt_cmd_ec_consumer(argc - 2, argv + 2);
    if (strcmp(cmd, "ec-producer") == 0)
        return kvt_cmd_ec_producer(argc - 2, argv + 2);
    if (strcmp(cmd, "ec-encoder") == 0)
        return kvt_cmd_ec_encoder(argc - 2, argv + 2);
    fprintf(stderr, "kvtier: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return 2;
}
