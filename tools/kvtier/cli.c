/* SPDX-License-Identifier: Apache-2.0 */
/* The CLI's option parser on getopt_long (see cli.h). */
#include "cli.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define KVT_CLI_MAX_OPTS 64
#define KVT_CLI_VAL_BASE 256 /* getopt_long's val for option i: base + i */

int kvt_cli_u64(const char *s, uint64_t lo, uint64_t hi, bool suffix, uint64_t *v)
{
    if (!s || !isdigit((unsigned char)s[0]))
        return -1; /* no sign, no blank, no empty string */
    errno = 0;
    char *end;
    unsigned long long x = strtoull(s, &end, 10);
    if (errno == ERANGE)
        return -1;
    if (suffix && *end) {
        unsigned shift = 0;
        switch (*end) {
        case 'K':
        case 'k':
            shift = 10;
            break;
        case 'M':
        case 'm':
            shift = 20;
            break;
        case 'G':
        case 'g':
            shift = 30;
            break;
        default:
            return -1;
        }
        if (x > (UINT64_MAX >> shift))
            return -1;
        x <<= shift;
        end++;
    }
    if (*end || x < lo || x > hi)
        return -1;
    *v = x;
    return 0;
}

int kvt_cli_double(const char *s, double lo, double hi, bool open_lo, double *v)
{
    if (!s || !*s || isspace((unsigned char)s[0]))
        return -1;
    errno = 0;
    char *end;
    double x = strtod(s, &end);
    if (*end || errno == ERANGE || !isfinite(x) || x > hi || x < lo || (open_lo && x == lo))
        return -1;
    *v = x;
    return 0;
}

/* Whether w is one of the words of list, separated by sep. */
static bool word_in(const char *list, char sep, const char *w)
{
    size_t n = strlen(w);
    for (const char *p = list; *p;) {
        const char *e = strchr(p, sep);
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && strncmp(p, w, n) == 0)
            return true;
        if (!e)
            break;
        p = e + 1;
    }
    return false;
}

/* An option the command accepts (no list: every one). */
static bool listed(const char *list, const char *name)
{
    return !list || word_in(list, ',', name);
}

static bool choice_ok(const char *choices, const char *v)
{
    return word_in(choices, '|', v);
}

/* What a value must look like, for the error message. */
static void wants(const kvt_opt *o, char *buf, size_t cap)
{
    switch (o->kind) {
    case KVT_OPT_U64:
        snprintf(buf, cap, "an integer in %" PRIu64 "..%" PRIu64, o->lo, o->hi);
        break;
    case KVT_OPT_BYTES:
        snprintf(buf, cap, "a size in %" PRIu64 "..%" PRIu64 " bytes (K, M, G suffixes allowed)",
                 o->lo, o->hi);
        break;
    case KVT_OPT_DOUBLE:
        snprintf(buf, cap, "a number in %c%g, %g]", o->open_lo ? '(' : '[', o->dlo, o->dhi);
        break;
    case KVT_OPT_CHOICE:
        snprintf(buf, cap, "one of %s", o->choices);
        break;
    default:
        snprintf(buf, cap, "a value");
        break;
    }
}

static int set_value(const kvt_cli *c, const kvt_opt *o, const char *v)
{
    int bad = 0;
    switch (o->kind) {
    case KVT_OPT_FLAG:
        *(bool *)o->dest = true;
        break;
    case KVT_OPT_U64:
    case KVT_OPT_BYTES:
        bad = kvt_cli_u64(v, o->lo, o->hi, o->kind == KVT_OPT_BYTES, (uint64_t *)o->dest);
        break;
    case KVT_OPT_DOUBLE:
        bad = kvt_cli_double(v, o->dlo, o->dhi, o->open_lo, (double *)o->dest);
        break;
    case KVT_OPT_STR:
        bad = !*v;
        if (!bad)
            *(const char **)o->dest = v;
        break;
    case KVT_OPT_CHOICE:
        bad = !choice_ok(o->choices, v);
        if (!bad)
            *(const char **)o->dest = v;
        break;
    }
    if (bad) {
        char w[160];
        wants(o, w, sizeof(w));
        fprintf(stderr, "%s: --%s '%s': wants %s\n", c->prog, o->name, v, w);
        return KVT_EXIT_USAGE;
    }
    if (o->seen)
        *o->seen = true;
    return 0;
}

int kvt_cli_parse(const kvt_cli *c, int argc, char **argv)
{
    struct option lo[KVT_CLI_MAX_OPTS + 2];
    size_t n = 0;
    if (c->n_opts > KVT_CLI_MAX_OPTS) {
        fprintf(stderr, "%s: internal: too many options\n", c->prog);
        return KVT_EXIT_USAGE;
    }
    for (size_t i = 0; i < c->n_opts; i++) {
        if (!listed(c->only, c->opts[i].name))
            continue;
        lo[n++] = (struct option){c->opts[i].name,
                                  c->opts[i].kind == KVT_OPT_FLAG ? no_argument : required_argument,
                                  NULL, KVT_CLI_VAL_BASE + (int)i};
    }
    lo[n++] = (struct option){"help", no_argument, NULL, 'h'};
    lo[n] = (struct option){NULL, 0, NULL, 0};
    if (c->n_pos)
        *c->n_pos = 0;
    optind = 0; /* a full re-initialisation of getopt's state (GNU) */
    opterr = 0;
    for (;;) {
        int ch = getopt_long(argc, argv, ":h", lo, NULL);
        if (ch == -1)
            break;
        if (ch == 'h') {
            kvt_cli_help(c, stdout);
            return -1;
        }
        if (ch == '?' || ch == ':') {
            const char *arg = optind >= 1 && optind <= argc ? argv[optind - 1] : "";
            if (ch == ':')
                fprintf(stderr, "%s: %s wants a value (see %s --help)\n", c->prog, arg, c->prog);
            else
                fprintf(stderr, "%s: unknown option '%s' (see %s --help)\n", c->prog, arg, c->prog);
            return KVT_EXIT_USAGE;
        }
        const kvt_opt *o = &c->opts[ch - KVT_CLI_VAL_BASE];
        /* `--seed --json`: the next option is not a value. */
        if (o->kind != KVT_OPT_FLAG && optarg && optarg[0] == '-' && optarg[1] == '-') {
            fprintf(stderr, "%s: --%s wants a value, got the option '%s' (see %s --help)\n",
                    c->prog, o->name, optarg, c->prog);
            return KVT_EXIT_USAGE;
        }
        int rc = set_value(c, o, optarg);
        if (rc)
            return rc;
    }
    for (int i = optind; i < argc; i++) {
        if (!c->n_pos || *c->n_pos >= c->max_pos) {
            fprintf(stderr, "%s: unexpected argument '%s' (see %s --help)\n", c->prog, argv[i],
                    c->prog);
            return KVT_EXIT_USAGE;
        }
        c->pos[(*c->n_pos)++] = argv[i];
    }
    return 0;
}

void kvt_cli_help(const kvt_cli *c, FILE *f)
{
    fprintf(f, "usage: %s\n", c->usage);
    if (c->about)
        fprintf(f, "%s", c->about);
    bool any = false;
    for (size_t i = 0; i < c->n_opts; i++) {
        const kvt_opt *o = &c->opts[i];
        if (!listed(c->only, o->name))
            continue;
        if (!any)
            fprintf(f, "options (--name value or --name=value):\n");
        any = true;
        char left[64];
        if (o->kind == KVT_OPT_FLAG)
            snprintf(left, sizeof(left), "--%s", o->name);
        else
            snprintf(left, sizeof(left), "--%s %s", o->name, o->meta ? o->meta : "V");
        fprintf(f, "  %-22s ", left);
        for (const char *p = o->help; *p; p++) {
            fputc(*p, f);
            if (*p == '\n')
                fprintf(f, "  %-22s ", "");
        }
        fputc('\n', f);
    }
    fprintf(f, "  %-22s this text\n", "--help");
    if (c->footer)
        fprintf(f, "%s", c->footer);
}
