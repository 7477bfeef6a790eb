/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Prometheus text exposition into a caller's buffer: the metrics writers of the offload
 * manager, the copy engine and the disk tier share it. Writing past the buffer only counts
 * bytes, so a caller learns the size it needs from one call.
 */
#ifndef KVT_BASE_PROM_H
#define KVT_BASE_PROM_H

#include "base/export.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kvi_prom {
    char *buf;
    size_t cap, len;
} kvi_prom;

void kvi_prom_put(kvi_prom *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* "# HELP / # TYPE" lines and one unlabelled sample of family prefix_name. */
KVI_EXPORT void kvi_prom_metric(kvi_prom *p, const char *prefix, const char *name, const char *help,
                                bool gauge, uint64_t v);
/* HELP/TYPE lines of a labelled family, then kvi_prom_sample for each label value. */
KVI_EXPORT void kvi_prom_family(kvi_prom *p, const char *prefix, const char *name, const char *help,
                                bool gauge);
KVI_EXPORT void kvi_prom_sample(kvi_prom *p, const char *prefix, const char *name,
                                const char *label, const char *value, uint64_t v);
/* A labelled family with one sample per direction: label="values[d]" v[d], d = 0, 1 (the
 * transfer backends' per-direction counters). */
KVI_EXPORT void kvi_prom_pair(kvi_prom *p, const char *prefix, const char *name, const char *help,
                              bool gauge, const char *const values[2], const uint64_t v[2]);
/* A latency histogram in Prometheus' cumulative form, with fixed bounds from 10 us to 5 s
 * (KVT_HIST_BOUNDS); observations in nanoseconds. Plain counters: the owner serialises
 * observe and read (its lock, or its one thread). */
#define KVT_HIST_BOUNDS 12
typedef struct kvi_hist {
    uint64_t bucket[KVT_HIST_BOUNDS + 1]; /* per bucket (not cumulative); the last is +Inf */
    uint64_t count, sum_ns;
} kvi_hist;

void kvi_hist_observe(kvi_hist *h, uint64_t ns);
/* HELP/TYPE of a histogram family (name without _bucket), then n series: series i has
 * label=values[i] (no label when label is NULL; then n must be 1). */
void kvi_prom_hist(kvi_prom *p, const char *prefix, const char *name, const char *help,
                   const char *label, const char *const *values, const kvi_hist *h, size_t n);
/* *len = bytes written (or needed); KVT_ENOSPC with a message naming `what` if they did not
 * fit, 0 otherwise. */
KVI_EXPORT int kvi_prom_finish(const kvi_prom *p, size_t *len, const char *what);

#endif
