/* SPDX-License-Identifier: Apache-2.0 */
/* Prometheus text exposition (see prom.h). */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>

#include "base/error.h"
#include "base/prom.h"

void kvt_prom_put(kvt_prom *p, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    size_t room = p->len < p->cap ? p->cap - p->len : 0;
    int n = vsnprintf(room ? p->buf + p->len : NULL, room, fmt, ap);
    va_end(ap);
    if (n > 0)
        p->len += (size_t)n;
}

void kvt_prom_family(kvt_prom *p, const char *prefix, const char *name, const char *help,
                     bool gauge)
{
    kvt_prom_put(p, "# HELP %s_%s %s\n# TYPE %s_%s %s\n", prefix, name, help, prefix, name,
                 gauge ? "gauge" : "counter");
}

void kvt_prom_metric(kvt_prom *p, const char *prefix, const char *name, const char *help,
                     bool gauge, uint64_t v)
{
    kvt_prom_family(p, prefix, name, help, gauge);
    kvt_prom_put(p, "%s_%s %" PRIu64 "\n", prefix, name, v);
}

void kvt_prom_sample(kvt_prom *p, const char *prefix, const char *name, const char *label,
                     const char *value, uint64_t v)
{
    kvt_prom_put(p, "%s_%s{%s=\"%s\"} %" PRIu64 "\n", prefix, name, label, value, v);
}

int kvt_prom_finish(const kvt_prom *p, size_t *len, const char *what)
{
    *len = p->len;
    if (p->len >= p->cap)
        return kvt_fail(KVT_ENOSPC, "%s: prometheus: %zu bytes needed, buffer has %zu", what,
                        p->len + 1, p->cap);
    return 0;
}
