/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Logging: one line per call, written with a single fputs so concurrent lines do not
 * interleave mid-line on stderr. The level is read once from KVTIER_LOG on first use and kept
 * in an atomic, so the check in KVT_LOG is a relaxed load.
 */
#include "base/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#define LEVEL_UNSET (-1)

static atomic_int log_level = LEVEL_UNSET;
static kvt_log_fn log_fn;
static void *log_ctx;

static const char *const level_names[] = {"off", "error", "warn", "info", "debug", "trace"};

static int level_from_env(void)
{
    const char *s = getenv("KVTIER_LOG");
    if (!s || !*s)
        return KVT_LOG_WARN;
    for (int i = 0; i <= KVT_LOG_TRACE; i++)
        if (strcasecmp(s, level_names[i]) == 0)
            return i;
    char *end;
    long v = strtol(s, &end, 10);
    if (*end == '\0' && v >= KVT_LOG_OFF && v <= KVT_LOG_TRACE)
        return (int)v;
    return KVT_LOG_WARN;
}

int kvi_log_level_cached(void)
{
    int lvl = atomic_load_explicit(&log_level, memory_order_relaxed);
    if (lvl == LEVEL_UNSET) {
        int want = level_from_env();
        int expect = LEVEL_UNSET;
        atomic_compare_exchange_strong(&log_level, &expect, want);
        lvl = atomic_load(&log_level);
    }
    return lvl;
}

void kvt_log_set_level(int level)
{
    if (level < KVT_LOG_OFF)
        level = KVT_LOG_OFF;
    if (level > KVT_LOG_TRACE)
        level = KVT_LOG_TRACE;
    atomic_store(&log_level, level);
}

int kvt_log_get_level(void)
{
    return kvi_log_level_cached();
}

void kvt_log_set_handler(kvt_log_fn fn, void *ctx)
{
    log_fn = fn;
    log_ctx = ctx;
}

void kvi_log_write(int level, const char *file, int line, const char *fmt, ...)
{
    char msg[1024];
    char out[1200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    if (level < KVT_LOG_ERROR || level > KVT_LOG_TRACE)
        level = KVT_LOG_ERROR;
    if (log_fn) {
        snprintf(out, sizeof(out), "%s:%d: %s", base, line, msg);
        log_fn(log_ctx, level, out);
        return;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    snprintf(out, sizeof(out), "%02d:%02d:%02d.%06ld kvtier %-5s %s:%d: %s\n", tm.tm_hour,
             tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000, level_names[level], base, line, msg);
    fputs(out, stderr);
}
