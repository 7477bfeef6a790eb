/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Benchmark helpers: timing, JSON output and a description of the host, so a printed figure
 * always says where it was measured.
 */
#include "bench_util.h"

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
    j->n = 0;
    fputc('{', f);
}

static void key(kvt_json *j, const char *k)
{
    fprintf(j->f, "%s\"%s\": ", j->n++ ? ", " : "", k);
}

void kvt_json_str(kvt_json *j, const char *k, const char *v)
{
    key(j, k);
    fputc('"', j->f);
    for (const char *p = v; *p; p++) {
        if (*p == '"' || *p == '\\')
            fputc('\\', j->f);
        if ((unsigned char)*p >= 0x20)
            fputc(*p, j->f);
    }
    fputc('"', j->f);
}

void kvt_json_num(kvt_json *j, const char *k, double v)
{
    key(j, k);
    fprintf(j->f, "%.6g", v);
}

void kvt_json_int(kvt_json *j, const char *k, long long v)
{
    key(j, k);
    fprintf(j->f, "%lld", v);
}

void kvt_json_raw(kvt_json *j, const char *k, const char *json)
{
    key(j, k);
    fputs(json, j->f);
}

void kvt_json_end(kvt_json *j)
{
    fputs("}\n", j->f);
    fflush(j->f);
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
