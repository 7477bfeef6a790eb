/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Benchmark helpers: timing, JSON output and a description of the host, so a printed figure
 * always says where it was measured.
 */
#include "bench_util.h"

#include <math.h>
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
