/* SPDX-License-Identifier: Apache-2.0 */
/* Prometheus text exposition (see prom.h). */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvtier/base.h"

#include "base/error.h"
#include "base/prom.h"

void kvi_prom_put(kvi_prom *p, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    size_t room = p->len < p->cap ? p->cap - p->len : 0;
    int n = vsnprintf(room ? p->buf + p->len : NULL, room, fmt, ap);
    va_end(ap);
    if (n > 0)
        p->len += (size_t)n;
}

void kvi_prom_family(kvi_prom *p, const char *prefix, const char *name, const char *help,
                     bool gauge)
{
    kvi_prom_put(p, "# HELP %s_%s %s\n# TYPE %s_%s %s\n", prefix, name, help, prefix, name,
                 gauge ? "gauge" : "counter");
}

void kvi_prom_metric(kvi_prom *p, const char *prefix, const char *name, const char *help,
                     bool gauge, uint64_t v)
{
    kvi_prom_family(p, prefix, name, help, gauge);
    kvi_prom_put(p, "%s_%s %" PRIu64 "\n", prefix, name, v);
}

void kvi_prom_sample(kvi_prom *p, const char *prefix, const char *name, const char *label,
                     const char *value, uint64_t v)
{
    kvi_prom_put(p, "%s_%s{%s=\"%s\"} %" PRIu64 "\n", prefix, name, label, value, v);
}

void kvi_prom_pair(kvi_prom *p, const char *prefix, const char *name, const char *help, bool gauge,
                   const char *const values[2], const uint64_t v[2])
{
    kvi_prom_family(p, prefix, name, help, gauge);
    for (int d = 0; d < 2; d++)
        kvi_prom_sample(p, prefix, name, "direction", values[d], v[d]);
}

int kvi_prom_finish(const kvi_prom *p, size_t *len, const char *what)
{
    *len = p->len;
    if (p->len >= p->cap)
        return kvt_fail(KVT_ENOSPC, "%s: prometheus: %zu bytes needed, buffer has %zu", what,
                        p->len + 1, p->cap);
    return 0;
}

static const double hist_bound_s[KVT_HIST_BOUNDS] = {1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3,
                                                     1e-2, 5e-2, 0.1,  0.5,  1.0,  5.0};

void kvi_hist_observe(kvi_hist *h, uint64_t ns)
{
    size_t b = 0;
    while (b < KVT_HIST_BOUNDS && (double)ns > hist_bound_s[b] * 1e9)
        b++;
    h->bucket[b]++;
    h->count++;
    h->sum_ns += ns;
}

void kvi_prom_hist(kvi_prom *p, const char *prefix, const char *name, const char *help,
                   const char *label, const char *const *values, const kvi_hist *h, size_t n)
{
    kvi_prom_put(p, "# HELP %s_%s %s\n# TYPE %s_%s histogram\n", prefix, name, help, prefix, name);
    for (size_t i = 0; i < n; i++) {
        char lab[128] = "";
        if (label)
            snprintf(lab, sizeof(lab), "%s=\"%s\",", label, values[i]);
        uint64_t cum = 0;
        for (size_t b = 0; b <= KVT_HIST_BOUNDS; b++) {
            cum += h[i].bucket[b];
            if (b < KVT_HIST_BOUNDS)
                kvi_prom_put(p, "%s_%s_bucket{%sle=\"%g\"} %" PRIu64 "\n", prefix, name, lab,
                             hist_bound_s[b], cum);
            else
                kvi_prom_put(p, "%s_%s_bucket{%sle=\"+Inf\"} %" PRIu64 "\n", prefix, name, lab,
                             cum);
        }
        if (label)
            lab[strlen(lab) - 1] = 0; /* the trailing comma */
        const char *open = label ? "{" : "", *close = label ? "}" : "";
        kvi_prom_put(p, "%s_%s_sum%s%s%s %.9f\n", prefix, name, open, lab, close,
                     (double)h[i].sum_ns / 1e9);
        kvi_prom_put(p, "%s_%s_count%s%s%s %" PRIu64 "\n", prefix, name, open, lab, close,
                     h[i].count);
    }
}

/* ---- kvt_metrics_merge: several objects' expositions as one ---------------------------- */

typedef struct mline {
    const char *s;
    size_t len;
    size_t src;  /* the source it came from */
    size_t fam;  /* index of its family */
    bool sample; /* a sample (else the family's HELP or TYPE line) */
} mline;

typedef struct mfam {
    const char *name;
    size_t name_len;
    const char *type; /* the TYPE line's word */
    size_t type_len;
    const char *help_line, *type_line;
    size_t help_len, type_line_len;
} mfam;

static bool label_name_ok(const char *s, size_t n)
{
    if (!n || !((s[0] >= 'a' && s[0] <= 'z') || (s[0] >= 'A' && s[0] <= 'Z') || s[0] == '_'))
        return false;
    for (size_t i = 1; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
              (s[i] >= '0' && s[i] <= '9') || s[i] == '_'))
            return false;
    return true;
}

/* labels: `name="value",name="value"` (values without '"', '\\' or newlines), or "" / NULL. */
static int labels_ok(const char *l)
{
    if (!l || !*l)
        return 0;
    const char *p = l;
    for (;;) {
        const char *eq = strchr(p, '=');
        if (!eq || !label_name_ok(p, (size_t)(eq - p)) || eq[1] != '"')
            return -1;
        const char *v = eq + 2, *q = v;
        while (*q && *q != '"' && *q != '\\' && *q != '\n')
            q++;
        if (*q != '"')
            return -1;
        if (q[1] == 0)
            return 0;
        if (q[1] != ',')
            return -1;
        p = q + 2;
    }
}

static size_t find_fam(const mfam *f, size_t n, const char *name, size_t len)
{
    for (size_t i = 0; i < n; i++)
        if (f[i].name_len == len && memcmp(f[i].name, name, len) == 0)
            return i;
    return n;
}

static int by_family(const void *a, const void *b)
{
    const mline *x = a, *y = b;
    if (x->fam != y->fam)
        return x->fam < y->fam ? -1 : 1;
    if (x->src != y->src)
        return x->src < y->src ? -1 : 1;
    return x->s < y->s ? -1 : x->s > y->s; /* text order within a source */
}

/* The merge's working set: every sample line of every source and every family seen. */
typedef struct merge {
    mline *ln;
    mfam *fam;
    size_t nl, nf;
} merge;

/* Checks the sources; *max_lines: an upper bound of their lines. */
static int check_sources(const kvt_metrics_source *src, size_t n, size_t *max_lines)
{
    *max_lines = 0;
    for (size_t i = 0; i < n; i++) {
        if (!src[i].text)
            return kvt_fail(KVT_EINVAL, "metrics merge: source %zu has no text", i);
        if (labels_ok(src[i].labels))
            return kvt_fail(KVT_EINVAL,
                            "metrics merge: source %zu: labels '%s' are not name=\"value\" pairs "
                            "separated by commas",
                            i, src[i].labels);
        for (size_t k = 0; k < src[i].len; k++)
            *max_lines += src[i].text[k] == '\n';
        (*max_lines)++;
    }
    return 0;
}

static size_t family_of(merge *g, const char *name, size_t len)
{
    size_t f = find_fam(g->fam, g->nf, name, len);
    if (f == g->nf)
        g->fam[g->nf++] = (mfam){.name = name, .name_len = len};
    return f;
}

/* A "# HELP" or "# TYPE" line t of l bytes in source i; *cur: the family of the last TYPE. */
static int merge_comment(merge *g, const char *t, size_t l, size_t i, size_t *cur)
{
    bool help = memcmp(t, "# HELP ", 7) == 0;
    const char *nm = t + 7, *sp = memchr(nm, ' ', l - 7);
    size_t nlen = sp ? (size_t)(sp - nm) : l - 7;
    size_t f = family_of(g, nm, nlen);
    mfam *F = &g->fam[f];
    if (help) {
        if (!F->help_line) {
            F->help_line = t;
            F->help_len = l;
        }
        return 0;
    }
    const char *ty = sp ? sp + 1 : "";
    size_t tl = sp ? (size_t)(t + l - ty) : 0;
    if (F->type && (F->type_len != tl || memcmp(F->type, ty, tl)))
        return kvt_fail(KVT_EINVAL,
                        "metrics merge: family %.*s is a %.*s in one source and a %.*s in "
                        "source %zu",
                        (int)nlen, nm, (int)F->type_len, F->type, (int)tl, ty, i);
    F->type = ty;
    F->type_len = tl;
    F->type_line = t;
    F->type_line_len = l;
    *cur = f;
    return 0;
}

/* Reads source i's lines into the working set. */
static int merge_source(merge *g, const kvt_metrics_source *src, size_t i)
{
    const char *t = src[i].text, *end = t + src[i].len;
    size_t cur = SIZE_MAX; /* the family of the last TYPE line */
    while (t < end) {
        const char *e = memchr(t, '\n', (size_t)(end - t));
        size_t l = e ? (size_t)(e - t) : (size_t)(end - t);
        if (l > 7 && (memcmp(t, "# HELP ", 7) == 0 || memcmp(t, "# TYPE ", 7) == 0)) {
            int rc = merge_comment(g, t, l, i, &cur);
            if (rc)
                return rc;
        } else if (l > 0 && t[0] != '#') {
            size_t nlen = strcspn(t, "{ ");
            if (nlen > l)
                nlen = l;
            size_t f = cur;
            /* a sample outside its family's TYPE block (or of an untyped family) */
            if (f == SIZE_MAX || g->fam[f].name_len > nlen ||
                memcmp(g->fam[f].name, t, g->fam[f].name_len) != 0)
                f = family_of(g, t, nlen);
            g->ln[g->nl++] = (mline){.s = t, .len = l, .src = i, .fam = f, .sample = true};
        }
        t += l + 1;
    }
    return 0;
}

/* Writes the sorted samples, each family's HELP and TYPE first, each source's labels added. */
static void merge_write(const merge *g, const kvt_metrics_source *src, kvi_prom *p)
{
    size_t last_fam = SIZE_MAX;
    for (size_t k = 0; k < g->nl; k++) {
        const mline *m = &g->ln[k];
        const mfam *f = &g->fam[m->fam];
        if (m->fam != last_fam) {
            if (f->help_line)
                kvi_prom_put(p, "%.*s\n", (int)f->help_len, f->help_line);
            if (f->type_line)
                kvi_prom_put(p, "%.*s\n", (int)f->type_line_len, f->type_line);
            last_fam = m->fam;
        }
        const char *labels = src[m->src].labels;
        size_t nlen = strcspn(m->s, "{ ");
        if (!labels || !*labels || nlen >= m->len) {
            kvi_prom_put(p, "%.*s\n", (int)m->len, m->s);
        } else if (m->s[nlen] == '{') {
            bool empty = nlen + 1 < m->len && m->s[nlen + 1] == '}';
            kvi_prom_put(p, "%.*s{%s%s%.*s\n", (int)nlen, m->s, labels, empty ? "" : ",",
                         (int)(m->len - nlen - 1), m->s + nlen + 1);
        } else {
            kvi_prom_put(p, "%.*s{%s}%.*s\n", (int)nlen, m->s, labels, (int)(m->len - nlen),
                         m->s + nlen);
        }
    }
}

/* Two sources whose series coincide (same labels) make an invalid exposition. */
static int merge_check_collisions(const merge *g, const kvt_metrics_source *src)
{
    for (size_t k = 1; k < g->nl; k++) {
        const mline *a = &g->ln[k - 1], *b = &g->ln[k];
        if (a->fam != b->fam || a->src == b->src)
            continue;
        const char *la = src[a->src].labels ? src[a->src].labels : "";
        const char *lb = src[b->src].labels ? src[b->src].labels : "";
        if (strcmp(la, lb) == 0)
            return kvt_fail(KVT_EINVAL,
                            "metrics merge: sources %zu and %zu both write %.*s with labels "
                            "'%s': give each source labels of its own (rank, shard)",
                            a->src, b->src, (int)g->fam[a->fam].name_len, g->fam[a->fam].name, la);
    }
    return 0;
}

int kvt_metrics_merge(const kvt_metrics_source *src, size_t n, char *buf, size_t cap, size_t *len)
{
    if (!len || (n && !src) || (cap && !buf))
        return kvt_fail(KVT_EINVAL, "metrics merge: NULL argument");
    size_t max_lines;
    int rc = check_sources(src, n, &max_lines);
    if (rc)
        return rc;
    merge g = {calloc(max_lines ? max_lines : 1, sizeof(mline)),
               calloc(max_lines ? max_lines : 1, sizeof(mfam)), 0, 0};
    if (!g.ln || !g.fam)
        rc = kvt_fail(KVT_ENOMEM, "metrics merge: out of memory");
    for (size_t i = 0; i < n && !rc; i++)
        rc = merge_source(&g, src, i);
    if (!rc) {
        qsort(g.ln, g.nl, sizeof(*g.ln), by_family);
        kvi_prom p = {buf, cap, 0};
        merge_write(&g, src, &p);
        rc = merge_check_collisions(&g, src);
        if (!rc)
            rc = kvi_prom_finish(&p, len, "metrics merge");
    }
    free(g.ln);
    free(g.fam);
    return rc;
}
