/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The CLI's option parser: each command describes its options in a table; kvt_cli_parse reads
 * them with getopt_long (so `--name value` and `--name=value` both work), parses numbers
 * strictly (no sign where none is allowed, finite, in range, no silent clamping) and prints the
 * command's --help from the same table. Exit codes across the CLI: 0 ok, 1 failure, 2 usage.
 */
#ifndef KVT_CLI_H
#define KVT_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum { KVT_EXIT_OK = 0, KVT_EXIT_FAIL = 1, KVT_EXIT_USAGE = 2 };

typedef enum kvt_opt_kind {
    KVT_OPT_FLAG,   /* bool *: set to true, takes no value */
    KVT_OPT_U64,    /* uint64_t *: a decimal integer in [lo, hi] */
    KVT_OPT_BYTES,  /* uint64_t *: an integer with an optional K, M or G suffix, in [lo, hi] */
    KVT_OPT_DOUBLE, /* double *: a finite number in [dlo, dhi] (dlo excluded if open_lo) */
    KVT_OPT_STR,    /* const char **: any non-empty text */
    KVT_OPT_CHOICE, /* const char **: one of the '|'-separated words in choices */
} kvt_opt_kind;

typedef struct kvt_opt {
    const char *name; /* without the leading "--" */
    kvt_opt_kind kind;
    void *dest;
    const char *meta; /* the value's name in --help ("N", "DIR") */
    const char *help; /* may hold '\n' for continuation lines */
    uint64_t lo, hi;
    double dlo, dhi;
    bool open_lo;
    const char *choices;
    bool *seen; /* optional: set when the option was given */
} kvt_opt;

typedef struct kvt_cli {
    const char *prog;  /* "kvtier bench" */
    const char *usage; /* the synopsis after "usage: " */
    const char *about; /* paragraph(s) under the synopsis, or NULL */
    const kvt_opt *opts;
    size_t n_opts;
    const char *footer; /* text after the options, or NULL */
    /* Positional arguments: at most max_pos, stored in pos[] (may be NULL when max_pos is 0). */
    size_t max_pos;
    const char **pos;
    size_t *n_pos;
    /* Only options whose name appears in this comma-separated list are accepted and shown
     * (NULL: all of them). */
    const char *only;
} kvt_cli;

/* 0: parsed; KVT_EXIT_USAGE: a usage error (already printed to stderr); -1: --help was printed
 * to stdout (the caller exits 0). argv[0] is the command's name. */
int kvt_cli_parse(const kvt_cli *c, int argc, char **argv);
void kvt_cli_help(const kvt_cli *c, FILE *f);

/* Strict parsers, also used outside the table: 0 or -1. */
int kvt_cli_u64(const char *s, uint64_t lo, uint64_t hi, bool suffix, uint64_t *v);
int kvt_cli_double(const char *s, double lo, double hi, bool open_lo, double *v);

#endif
