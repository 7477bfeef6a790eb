/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Common includes and helpers for kvtier's cmocka tests.
 */
#ifndef KVT_TEST_H
#define KVT_TEST_H

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include <cmocka.h>

#include "rand.h"
#include "kvtier/kvtier.h"

/* Skips the running test visibly: cmocka prints it SKIPPED with the reason, and the
 * executable's exit status becomes 77 (kvt_test_exit), which ctest reports as "Skipped"
 * (SKIP_RETURN_CODE), so a test that could not run never reads as passed. */
static int kvt_test_skips;
#define KVT_SKIP(...)                                                                              \
    do {                                                                                           \
        print_message("SKIPPED: " __VA_ARGS__);                                                    \
        print_message("\n");                                                                       \
        kvt_test_skips++;                                                                          \
        skip();                                                                                    \
    } while (0)

/* main's exit status: failures first, then 77 when any test was skipped. */
static inline int kvt_test_exit(int failed)
{
    return failed ? failed : kvt_test_skips ? 77 : 0;
}

/* Asserts a kvtier call succeeded, printing its message otherwise. */
#define KVT_OK_(call)                                                                              \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_ != 0)                                                                              \
            fail_msg("%s -> %s: %s", #call, kvt_err_name(rc_), kvt_last_error());                  \
    } while (0)

/* Asserts a kvtier call failed with the given code and left a message. */
#define KVT_ERR_(call, code)                                                                       \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_ != (code))                                                                         \
            fail_msg("%s -> %s (%d), expected %s", #call, kvt_err_name(rc_), rc_,                  \
                     kvt_err_name(code));                                                          \
        assert_true(kvt_last_error()[0] != '\0');                                                  \
    } while (0)

/* A model-based test's check: on failure names the test, how far it got (`unit` `at`: "step
 * 12") and the seed that replays it, then the message. */
#define KVT_MODEL_CHECK(what, unit, at, seed, cond, ...)                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            print_error("%s: %s %llu (replay with KVTIER_TEST_SEED=%llu): ", what, unit,           \
                        (unsigned long long)(at), (unsigned long long)(seed));                     \
            fail_msg(__VA_ARGS__);                                                                 \
        }                                                                                          \
    } while (0)

/* Multiplier for randomized test lengths (KVTIER_TEST_SCALE, default 1). */
static inline double kvt_test_scale(void)
{
    const char *s = getenv("KVTIER_TEST_SCALE");
    double v = s ? atof(s) : 1.0;
    return v > 0 ? v : 1.0;
}

/* Tests wait for a condition, never for a time or a count of tries (a count is a time that a
 * busy machine shrinks): one generous deadline for every wait, KVTIER_TEST_DEADLINE_S seconds
 * (default 60: what a loaded machine may need, never what a passing run takes).
 *
 *     kvt_wait w = kvt_wait_start();
 *     while (!ready(x) && kvt_wait_more(&w))
 *         ;
 *     assert_true(ready(x));
 *
 * or KVT_WAIT_UNTIL(ready(x), "x ready"), which fails naming what it waited for. */
typedef struct {
    uint64_t end;
    unsigned nap_us;
} kvt_wait;

static inline double kvt_test_deadline_s(void)
{
    const char *s = getenv("KVTIER_TEST_DEADLINE_S");
    double v = s ? atof(s) : 60.0;
    return v > 0 ? v : 60.0;
}

static inline kvt_wait kvt_wait_start(void)
{
    kvt_wait w = {kvt_monotonic_ns() + (uint64_t)(kvt_test_deadline_s() * 1e9), 0};
    return w;
}

/* Before the deadline: naps (0.05 ms at first, doubling to 10 ms) and returns 1, ask again;
 * past it, 0. */
static inline int kvt_wait_more(kvt_wait *w)
{
    if (kvt_monotonic_ns() > w->end)
        return 0;
    w->nap_us = w->nap_us ? (w->nap_us < 5000 ? 2 * w->nap_us : 10000) : 50;
    usleep(w->nap_us);
    return 1;
}

/* Before the deadline: 1, without a nap (for loops each of whose turns waits on its own, an
 * engine's step); past it, 0. */
static inline int kvt_wait_left(const kvt_wait *w)
{
    return kvt_monotonic_ns() <= w->end;
}

#define KVT_WAIT_UNTIL(cond, what)                                                                 \
    do {                                                                                           \
        kvt_wait w_ = kvt_wait_start();                                                            \
        while (!(cond))                                                                            \
            if (!kvt_wait_more(&w_))                                                               \
                fail_msg("waited %.0f s (KVTIER_TEST_DEADLINE_S) for %s", kvt_test_deadline_s(),   \
                         what);                                                                    \
    } while (0)

/* Seed from KVTIER_TEST_SEED, else from the clock (printed by the caller on failure). */
static inline uint64_t kvt_test_seed(void)
{
    const char *s = getenv("KVTIER_TEST_SEED");
    if (s && *s)
        return strtoull(s, NULL, 0);
    return kvt_monotonic_ns() ^ ((uint64_t)getpid() << 32);
}

static inline uint64_t kvt_test_rand(uint64_t *s)
{
    return kvt_rand_next(s);
}

static inline uint32_t kvt_test_below(uint64_t *s, uint32_t n)
{
    return kvt_rand_below(s, n);
}

/* A copy of this test program that another uid can run: the directory it was built in may be
 * closed to others (a clone under a 0700 home or `mktemp -d`), so a test that re-executes
 * itself as another user copies itself into a fresh directory under /tmp open to all (the test
 * programs link kvtier statically, so the copy needs nothing else from the build). Returns 0
 * with the copy's path in out, or -1 with the reason in why; kvt_test_exe_drop removes it. */
static inline int kvt_test_exe_for_others(char *out, size_t n, char *why, size_t wn)
{
    char dir[] = "/tmp/kvt-exe-XXXXXX";
    int in = -1, fd = -1, ok = 0;
    if (!mkdtemp(dir)) {
        snprintf(why, wn, "mkdtemp under /tmp: %s", strerror(errno));
        return -1;
    }
    snprintf(out, n, "%s/self", dir);
    if (chmod(dir, 0755) != 0 || (in = open("/proc/self/exe", O_RDONLY | O_CLOEXEC)) < 0 ||
        (fd = open(out, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0755)) < 0) {
        snprintf(why, wn, "copying this program to %s: %s", out, strerror(errno));
    } else {
        char buf[1 << 16];
        ssize_t r;
        ok = 1;
        while (ok && (r = read(in, buf, sizeof(buf))) != 0)
            ok = r > 0 && write(fd, buf, (size_t)r) == r;
        if (!ok)
            snprintf(why, wn, "copying this program to %s: %s", out, strerror(errno));
    }
    if (in >= 0)
        close(in);
    if (fd >= 0 && close(fd) != 0)
        ok = 0;
    if (!ok) {
        unlink(out);
        rmdir(dir);
        return -1;
    }
    return 0;
}

/* Removes kvt_test_exe_for_others's copy and its directory. */
static inline void kvt_test_exe_drop(const char *path)
{
    char dir[256];
    snprintf(dir, sizeof(dir), "%s", path);
    char *slash = strrchr(dir, '/');
    unlink(path);
    if (slash) {
        *slash = 0;
        rmdir(dir);
    }
}

/* `promtool check metrics` on a Prometheus text: its exit status (0: valid), or -1 when
 * promtool cannot be run (Debian package prometheus; scripts/install-deps installs it). */
static inline int kvt_test_promtool(const char *text)
{
    char path[] = "/tmp/kvt-metrics-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    size_t n = strlen(text);
    assert_int_equal(write(fd, text, n), (ssize_t)n);
    close(fd);
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "promtool check metrics < %s > /dev/null 2>&1", path);
    int st = system(cmd);
    unlink(path);
    if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) == 127)
        return -1;
    return WEXITSTATUS(st);
}

/* Asserts that promtool finds an exposition valid; says "skipped" (the rest of the test
 * runs) where promtool is missing. */
#define KVT_PROMTOOL_OK(text)                                                                      \
    do {                                                                                           \
        int st_ = kvt_test_promtool(text);                                                         \
        if (st_ < 0)                                                                               \
            print_message("skipped: promtool check at %s:%d (promtool not installed)\n", __FILE__, \
                          __LINE__);                                                               \
        else                                                                                       \
            assert_int_equal(st_, 0);                                                              \
    } while (0)

#endif
