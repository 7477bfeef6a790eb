/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Benchmark helpers: timing, JSON output and a description of the host, so a printed figure
 * always says where it was measured.
 */
#define _GNU_SOURCE /* sched_setaffinity */
#include "bench_util.h"

#include <math.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

double kvt_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void kvt_json_begin(kvt_json *j, FILE *f)
{
    j->f = f;
    j->root = json_object();
}

json_t *kvt_json_real(double v)
{
    return isfinite(v) ? json_real(v) : json_null();
}

void kvt_json_set(kvt_json *j, const char *k, json_t *v)
{
    /* json_object_set_new takes v over even when it fails (no root: out of memory). */
    json_object_set_new(j->root, k, v);
}

void kvt_json_str(kvt_json *j, const char *k, const char *v)
{
    kvt_json_set(j, k, json_string(v ? v : ""));
}

void kvt_json_num(kvt_json *j, const char *k, double v)
{
    kvt_json_set(j, k, kvt_json_real(v));
}

void kvt_json_int(kvt_json *j, const char *k, long long v)
{
    kvt_json_set(j, k, json_integer(v));
}

void kvt_json_bool(kvt_json *j, const char *k, bool v)
{
    kvt_json_set(j, k, json_boolean(v));
}

int kvt_json_end(kvt_json *j)
{
    int rc = j->root ? json_dumpf(j->root, j->f, JSON_REAL_PRECISION(9) | JSON_PRESERVE_ORDER) : -1;
    if (rc == 0)
        fputc('\n', j->f);
    else
        fprintf(stderr, "kvtier bench: the JSON object could not be built or written\n");
    fflush(j->f);
    json_decref(j->root);
    j->root = NULL;
    return rc;
}

/* ---- contention ---------------------------------------------------------------------------- */

static struct {
    pid_t pids[KVT_BENCH_MAX_CONTEND];
    uint32_t n;
    bool pin;
} g_contend;

static void spin_forever(uint32_t i, bool pin)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlives the benchmark */
    if (pin) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET((int)(i % (uint32_t)(cores > 0 ? cores : 1)), &set);
        (void)sched_setaffinity(0, sizeof(set), &set);
    }
    volatile uint64_t x = 0;
    for (;;)
        x++;
}

static void contend_stop(void)
{
    for (uint32_t i = 0; i < g_contend.n; i++) {
        kill(g_contend.pids[i], SIGKILL);
        waitpid(g_contend.pids[i], NULL, 0);
    }
    g_contend.n = 0;
    g_contend.pin = false;
}

/* n spinners (see bench_util.h); 0, or -1 with none left running */
static int contend_start(uint32_t n, bool pin)
{
    if (n > KVT_BENCH_MAX_CONTEND)
        return -1;
    g_contend.pin = pin && n > 0;
    for (uint32_t i = 0; i < n; i++) {
        pid_t p = fork();
        if (p < 0) {
            contend_stop();
            return -1;
        }
        if (p == 0)
            spin_forever(i, pin);
        g_contend.pids[g_contend.n++] = p;
    }
    return 0;
}

int kvt_bench_contended(const kvt_bench_opts *o, int (*measure)(const kvt_bench_opts *o),
                        const char *name)
{
    if (o->contend && contend_start(o->contend, o->contend_pin) != 0) {
        fprintf(stderr, "kvtier bench %s: cannot start %u spinning processes\n", name, o->contend);
        return 1;
    }
    if (o->contend && !o->json)
        printf("(%u process%s spinning%s during every phase, the baselines' included)\n",
               o->contend, o->contend == 1 ? "" : "es", o->contend_pin ? ", pinned" : "");
    int rc = measure(o);
    contend_stop();
    return rc;
}

void kvt_json_host(kvt_json *j)
{
    char model[256] = "unknown";
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[512];
        while (fgets(line, sizeof(line), f)) {
            if (strncmp(line, "model name", 10) == 0) {
                char *c = strchr(line, ':');
                if (c) {
                    c += 2;
                    c[strcspn(c, "\n")] = '\0';
                    snprintf(model, sizeof(model), "%s", c);
                }
                break;
            }
        }
        fclose(f);
    }
    /* TCP's congestion control moves loopback figures by a third (docs/benchmarks.md) */
    char cc[64] = "unknown";
    f = fopen("/proc/sys/net/ipv4/tcp_congestion_control", "r");
    if (f) {
        if (fgets(cc, sizeof(cc), f))
            cc[strcspn(cc, "\n")] = '\0';
        fclose(f);
    }
    kvt_json_int(j, "host_cores", sysconf(_SC_NPROCESSORS_ONLN));
    kvt_json_str(j, "host_cpu", model);
    kvt_json_str(j, "host_tcp_congestion_control", cc);
    kvt_json_int(j, "contend_processes", g_contend.n);
    kvt_json_bool(j, "contend_pinned", g_contend.pin);
}

/* ---- the network benchmarks' baseline ------------------------------------------------------ */

static double perftest_once(uint64_t size, int iters, uint32_t port, const char *env,
                            const char *server_prefix, const char *host)
{
    char cmd[768];
    snprintf(cmd, sizeof(cmd), "%s %s timeout 60 ucx_perftest -p %u >/dev/null 2>&1 &", env,
             server_prefix, port);
    if (system(cmd) != 0)
        return 0;
    usleep(1000 * 1000); /* the server is listening by then */
    snprintf(cmd, sizeof(cmd),
             "%s timeout 60 ucx_perftest %s -p %u -t tag_bw -s %llu -n %d 2>/dev/null", env, host,
             port, (unsigned long long)size, iters);
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
    return mibs * 1048576.0 / 1e9; /* its "MB/s" are MiB/s */
}

double kvt_bench_perftest_gbps(uint64_t size, int iters, const char *env, const char *server_prefix,
                               const char *host)
{
    double g = 0;
    for (uint32_t i = 0; i < 3 && g == 0; i++) /* a port someone else holds: another one */
        g = perftest_once(size, iters, 40000 + (uint32_t)((getpid() * 13u + i * 977u) % 20000u),
                          env, server_prefix, host);
    return g;
}

int kvt_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* ---- the peers' Python (bench/peers/) ------------------------------------------------------- */

#ifndef KVT_SOURCE_DIR
#define KVT_SOURCE_DIR "."
#endif

json_t *kvt_bench_run_peers(const kvt_bench_opts *o, const char *script_name, const char *args,
                            char *why, size_t cap)
{
    const char *py = o->peers ? o->peers : getenv("KVTIER_PEERS_PYTHON");
    const char *venv = KVT_SOURCE_DIR "/.venv-bench/bin/python";
    if (!py)
        py = access(venv, X_OK) == 0 ? venv : NULL;
    if (!py) {
        snprintf(why, cap,
                 "no Python with the peers' packages: make bench-env makes %s, or "
                 "--peers / KVTIER_PEERS_PYTHON names one",
                 venv);
        return NULL;
    }
    if (strcmp(py, "none") == 0) {
        snprintf(why, cap, "skipped (--peers none)");
        return NULL;
    }
    char script[4096];
    const char *dir = getenv("KVTIER_PEERS_DIR");
    snprintf(script, sizeof(script), "%s/%s", dir ? dir : KVT_SOURCE_DIR "/bench/peers",
             script_name);
    if (strchr(py, '\'') || strchr(script, '\'')) {
        snprintf(why, cap, "a quote in the peers' Python or script path");
        return NULL;
    }
    char cmd[8192];
    snprintf(cmd, sizeof(cmd), "'%s' '%s' %s", py, script, args);
    FILE *f = popen(cmd, "r");
    if (!f) {
        snprintf(why, cap, "cannot run %s", py);
        return NULL;
    }
    json_error_t err;
    json_t *r = json_loadf(f, JSON_DISABLE_EOF_CHECK, &err);
    while (fgetc(f) != EOF) /* read to its end: a script still writing (the line's newline, */
        ;                   /* unbuffered) would otherwise die of a broken pipe */
    int st = pclose(f);
    if (!r || !json_is_object(r)) {
        snprintf(why, cap, "%s printed no JSON object (exit status %d): %s", script, st, err.text);
        json_decref(r);
        return NULL;
    }
    return r;
}
