/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Benchmark helpers: timing, JSON output and a description of the host, so a printed figure
 * always says where it was measured.
 */
#include "bench_util.h"

#include <math.h>
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
    kvt_json_int(j, "host_cores", sysconf(_SC_NPROCESSORS_ONLN));
    kvt_json_str(j, "host_cpu", model);
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
