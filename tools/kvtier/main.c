/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The kvtier command-line tool: `kvtier demo`, `kvtier bench <name> [--json]`, --help and
 * --version. Subcommands live in their own files; this file only parses arguments.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"
#include "remote_cmds.h"
#include "cli.h"
#include "demo.h"
#include "ec_cmds.h"
#include "kvtier/kvtier.h"

static const kvt_bench *const benches[] = {&kvt_bench_pool, &kvt_bench_sched, &kvt_bench_copy,
                                           &kvt_bench_disk, &kvt_bench_ec,    &kvt_bench_remote};

static void usage(FILE *f)
{
    fprintf(
        f,
        "kvtier %s - KV-cache offload and encoder-cache transfer for LLM inference engines\n"
        "\n"
        "usage:\n"
        "  kvtier demo [options]              the reference engine with and without kvtier\n"
        "                                     (kvtier demo --help)\n"
        "  kvtier demo --components [...]     the library's parts one by one\n"
        "  kvtier demo --soak SECONDS         random faults, then a summary\n"
        "  kvtier bench <name> [options]      run a benchmark (kvtier bench <name> --help)\n"
        "  kvtier bench --list                list the benchmarks\n"
        "  kvtier ec-consumer --host A --port P [options]   an encoder-cache consumer (--help)\n"
        "  kvtier ec-producer --consumer tcp://A:P [options] pushes into one (--help)\n"
        "  kvtier ec-encoder --consumer tcp://A:P [options]  the demo's encoder process (--help)\n"
        "  kvtier remote-peer --directory A --instance I (--serve S | --read S) [...]\n"
        "                                     one remote-tier instance (--help)\n"
        "  kvtier --help | --version\n"
        "  Options take --name value or --name=value. Exit codes: 0 ok, 1 failure, 2 usage.\n"
        "\n"
        "environment: KVTIER_LOG=off|error|warn|info|debug|trace (default warn)\n",
        kvt_version());
}

/* Every option a benchmark may read; each benchmark accepts the ones it names. */
static int cmd_bench(int argc, char **argv)
{
    kvt_bench_opts o = {.json = false, .seconds = 2.0, .seed = 1, .blocks = 0, .backend = "cpu"};
    uint64_t blocks = 0, threads = 0, contend = 0;
    bool list = false;
    const kvt_opt opts[] = {
        {"json", KVT_OPT_FLAG, &o.json, NULL, "print one JSON object on stdout"},
        {"seconds", KVT_OPT_DOUBLE, &o.seconds, "S", "time budget per measured phase (default 2)",
         .dlo = 0, .dhi = 3600, .open_lo = true},
        {"seed", KVT_OPT_U64, &o.seed, "N", "workload seed (default 1)", .lo = 0, .hi = UINT64_MAX},
        {"blocks", KVT_OPT_U64, &blocks, "N", "pool size (default: the benchmark's)", .lo = 2,
         .hi = UINT32_MAX - 1},
        {"backend", KVT_OPT_CHOICE, &o.backend, "B", "cpu (default) or cuda",
         .choices = "cpu|cuda"},
        {"gib", KVT_OPT_DOUBLE, &o.gib, "G", "GiB moved per direction (default 1)", .dlo = 0,
         .dhi = 1024, .open_lo = true},
        {"threads", KVT_OPT_U64, &threads, "N", "CPU copy threads (default: the number of cores)",
         .lo = 1, .hi = 256},
        {"dir", KVT_OPT_STR, &o.dir, "DIR", "directory of the test files (default: .)"},
        {"transport", KVT_OPT_CHOICE, &o.transport, "T",
         "tcp (default) or shm (UCX_TLS=shm: shared memory + cma)", .choices = "tcp|shm"},
        {"peers", KVT_OPT_STR, &o.peers, "PYTHON",
         "ec, remote: the Python with the peers' packages (default:\n"
         "$KVTIER_PEERS_PYTHON, then the source tree's .venv-bench from make\n"
         "bench-env); none: skip them. $KVTIER_PEERS_DIR: where their scripts are\n"
         "(default: the source tree's bench/peers)"},
        {"detect-peer-failure", KVT_OPT_FLAG, &o.detect_peer_failure, NULL,
         "ec: the producer's endpoints with UCX peer failure detection\n"
         "(kvt_ec_net_config.detect_peer_failure; off by default)"},
        {"thp", KVT_OPT_FLAG, &o.thp, NULL,
         "ec: the producer's source and the consumer's buffer THP advised\n"
         "(default: normal pages, as ucx_perftest's sender has)"},
        {"contend", KVT_OPT_U64, &contend, "N",
         "ec, remote: N processes spin during every phase, kvtier's and the\n"
         "baselines' (default 0: a quiet machine)",
         .lo = 0, .hi = KVT_BENCH_MAX_CONTEND},
        {"contend-pin", KVT_OPT_FLAG, &o.contend_pin, NULL,
         "with --contend: each spinner pinned to a core of its own"},
        {"ec-consumer", KVT_OPT_FLAG, &o.ec_consumer, NULL,
         "internal: run as the consumer process of bench ec"},
        {"list", KVT_OPT_FLAG, &list, NULL, "list the benchmarks"},
    };
    kvt_cli c = {.prog = "kvtier bench",
                 .usage = "kvtier bench <name> [options] | kvtier bench --list",
                 .about = "  Runs one benchmark against the baseline its docs name\n"
                          "  (docs/benchmarks.md); `kvtier bench <name> --help` lists its "
                          "options.\n",
                 .opts = opts,
                 .n_opts = sizeof(opts) / sizeof(opts[0]),
                 .only = "list"};
    const kvt_bench *b = NULL;
    if (argc > 1 && argv[1][0] != '-') {
        for (size_t k = 0; k < sizeof(benches) / sizeof(benches[0]); k++)
            if (strcmp(benches[k]->name, argv[1]) == 0)
                b = benches[k];
        if (!b) {
            fprintf(stderr, "kvtier bench: no benchmark named '%s' (kvtier bench --list)\n",
                    argv[1]);
            return KVT_EXIT_USAGE;
        }
        char prog[64], usage[96];
        snprintf(prog, sizeof(prog), "kvtier bench %s", b->name);
        snprintf(usage, sizeof(usage), "kvtier bench %s [options]", b->name);
        c.prog = prog;
        c.usage = usage;
        c.about = NULL;
        c.only = b->opts;
        char about[160];
        snprintf(about, sizeof(about), "  %s\n", b->what);
        c.about = about;
        int rc = kvt_cli_parse(&c, argc - 1, argv + 1); /* argv[0]: the bench's name */
        if (rc)
            return rc < 0 ? KVT_EXIT_OK : rc;
        o.blocks = (uint32_t)blocks;
        o.threads = (uint32_t)threads;
        o.contend = (uint32_t)contend;
        return b->run(&o);
    }
    /* No name: --list or --help. */
    int rc = kvt_cli_parse(&c, argc, argv);
    if (rc)
        return rc < 0 ? KVT_EXIT_OK : rc;
    if (list) {
        for (size_t k = 0; k < sizeof(benches) / sizeof(benches[0]); k++)
            printf("%-8s %s\n", benches[k]->name, benches[k]->what);
        return KVT_EXIT_OK;
    }
    fprintf(stderr, "kvtier bench: which benchmark? (kvtier bench --list)\n");
    return KVT_EXIT_USAGE;
}

static int cmd_demo_components(int argc, char **argv)
{
    uint64_t seed = 1, port = 0;
    bool serve = false, components = false;
    double seconds = -1, soak = 0;
    const char *host = "127.0.0.1";
    const kvt_opt opts[] = {
        {"components", KVT_OPT_FLAG, &components, NULL,
         "run the library's parts one by one: a multi-turn chat workload on the GPU\n"
         "tier, with a host tier, with three tiers (host + disk); one step's metadata\n"
         "across the wire; encoder-cache transfer between an encoder and a 2-shard\n"
         "prefill instance. Every figure printed is checked"},
        {"soak", KVT_OPT_DOUBLE, &soak, "SECONDS",
         "instead, rounds of the three-tier offload and the encoder-cache\n"
         "workloads with random faults (disk EIO and torn writes, resets, delayed\n"
         "and reordered worker reports, preemption flushes, failed encoder-cache\n"
         "writes, lost readiness events, producer processes killed mid-push) until\n"
         "SECONDS passed; then a summary (docs/reliability.md)",
         .dlo = 0, .dhi = 30 * 86400.0, .open_lo = true},
        {"seed", KVT_OPT_U64, &seed, "N", "workload seed (default 1)", .lo = 0, .hi = UINT64_MAX},
        {"metrics-port", KVT_OPT_U64, &port, "P",
         "then serve the runs' Prometheus metrics at http://HOST:P/metrics\n"
         "(0: any free port, printed)",
         .lo = 0, .hi = 65535, .seen = &serve},
        {"metrics-host", KVT_OPT_STR, &host, "HOST",
         "address the metrics server binds (default 127.0.0.1;\n0.0.0.0: every interface)"},
        {"metrics-seconds", KVT_OPT_DOUBLE, &seconds, "S",
         "serve for S seconds (default: until interrupted)", .dlo = 0, .dhi = 1e9},
    };
    kvt_cli c = {.prog = "kvtier demo",
                 .usage = "kvtier demo --components [--seed N] [--metrics-port P ...]\n"
                          "       kvtier demo --soak SECONDS [--seed N]",
                 .opts = opts,
                 .n_opts = sizeof(opts) / sizeof(opts[0]),
                 .footer = "  Exit code 0: every check passed; 1: one failed; 2: a usage error.\n"
                           "  The three-tier run creates kvtier-demo-disk.rank0 in the working\n"
                           "  directory (a file system with O_DIRECT, or buffered I/O is used) "
                           "and removes it.\n"};
    int rc = kvt_cli_parse(&c, argc, argv);
    if (rc)
        return rc < 0 ? KVT_EXIT_OK : rc;
    if (soak > 0)
        return kvt_demo_soak(seed, soak);
    rc = kvt_demo_run(seed);
    if (serve && kvt_demo_metrics())
        rc |= kvt_serve_metrics(host, (unsigned)port, kvt_demo_metrics(), seconds);
    return rc ? KVT_EXIT_FAIL : KVT_EXIT_OK;
}

/* `kvtier demo` runs the reference engine; --components, --soak and --metrics-* pick the
 * library's component runs instead. */
static int cmd_demo(int argc, char **argv)
{
    static const char *const comp[] = {"--components", "--soak", "--metrics-"};
    for (int i = 1; i < argc; i++)
        for (size_t k = 0; k < sizeof(comp) / sizeof(comp[0]); k++)
            if (strncmp(argv[i], comp[k], strlen(comp[k])) == 0)
                return cmd_demo_components(argc, argv);
    return kvt_demo_engine(argc, argv);
}

/* OpenBLAS (the reference engine's matrix products, one thread per rank by design) starts its
 * own thread pool when the library loads, before main, unless OPENBLAS_NUM_THREADS says
 * otherwise; under a memory limit those threads retry a failing allocation forever and the
 * process spins at exit. So the CLI runs with OPENBLAS_NUM_THREADS=1, re-executing itself once
 * to set it. */
static void single_threaded_blas(char **argv)
{
    if (getenv("OPENBLAS_NUM_THREADS"))
        return;
    if (setenv("OPENBLAS_NUM_THREADS", "1", 1) != 0)
        return;
    execv("/proc/self/exe", argv); /* returns only if it failed: go on as we are */
}

int main(int argc, char **argv)
{
    single_threaded_blas(argv);
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
    /* Each command gets argv[0] = its own name, as getopt_long expects. */
    if (strcmp(cmd, "bench") == 0)
        return cmd_bench(argc - 1, argv + 1);
    if (strcmp(cmd, "demo") == 0)
        return cmd_demo(argc - 1, argv + 1);
    if (strcmp(cmd, "ec-consumer") == 0)
        return kvt_cmd_ec_consumer(argc - 1, argv + 1);
    if (strcmp(cmd, "ec-producer") == 0)
        return kvt_cmd_ec_producer(argc - 1, argv + 1);
    if (strcmp(cmd, "ec-encoder") == 0)
        return kvt_cmd_ec_encoder(argc - 1, argv + 1);
    if (strcmp(cmd, "remote-peer") == 0)
        return kvt_cmd_remote_peer(argc - 1, argv + 1);
    fprintf(stderr, "kvtier: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return 2;
}
