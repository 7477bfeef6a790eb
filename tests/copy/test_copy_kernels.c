/* SPDX-License-Identifier: Apache-2.0 */
/*
 * CPU copy kernels (src/copy/kernels.c): every kernel this CPU runs copies every length and
 * alignment exactly, touching nothing outside the destination; the checker itself catches a
 * kernel that drops a byte; KVTIER_COPY_KERNEL picks kernels (one for both classes, one per
 * class, or a bad name, which falls back to calibration); a CPU engine reports its kernels by
 * kvt_copy_kernel_name and in its Prometheus text.
 *
 * The choice is made once per process, so each case that depends on it runs in a child
 * forked before this process ever calibrates.
 */
#include "kvt_test.h"

#include <sys/wait.h>

#include "copy/copy_internal.h"
#include "copy/kernels.h"

#define GUARD        64
#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* Copies with k for lengths around every boundary a kernel has (vector width, 256-byte
 * loop, alignment head, tail), at 8 source and 8 destination misalignments, the next run
 * given for prefetch. Returns how many copies came out wrong (0 for a correct kernel). */
static int kernel_errors(const copy_kernel *k)
{
    static const size_t lens[] = {0,    1,     15,    16,    17,
                                  31,   32,    33,    63,    64,
                                  65,   127,   255,   256,   257,
                                  511,  1000,  4095,  4096,  4097,
                                  8191, 16384, 16387, 65536, (256u << 10) + 5};
    const size_t maxlen = (256u << 10) + 5 + 64;
    unsigned char *src = malloc(maxlen + 2 * GUARD), *dst = malloc(maxlen + 2 * GUARD);
    unsigned char *next = malloc(4096);
    assert_non_null(src);
    assert_non_null(dst);
    assert_non_null(next);
    memset(next, 7, 4096);
    for (size_t i = 0; i < maxlen + 2 * GUARD; i++)
        src[i] = (unsigned char)(i * 131 + (i >> 8));
    int errors = 0;
    for (size_t li = 0; li < ARRAY_LEN(lens); li++)
        for (size_t so = 0; so < 64; so += 9)
            for (size_t d_o = 0; d_o < 64; d_o += 7) {
                size_t n = lens[li],
                       end = GUARD + d_o + n; /* guards: [0, d_o+GUARD), [end, end+GUARD) */
                memset(dst, 0xEE, end + GUARD);
                unsigned char *d = dst + GUARD + d_o;
                k->fn((char *)d, (const char *)src + GUARD + so, n, (const char *)next,
                      li % 2 ? 4096 : 0);
                kvi_copy_fence();
                bool ok = memcmp(d, src + GUARD + so, n) == 0;
                for (size_t g = 0; g < GUARD + d_o && ok; g++) /* before the destination */
                    ok = dst[g] == 0xEE;
                for (size_t g = end; g < end + GUARD && ok; g++) /* after it */
                    ok = dst[g] == 0xEE;
                if (!ok) {
                    if (errors == 0)
                        print_message("%s: wrong copy of %zu bytes (src +%zu, dst +%zu)\n", k->name,
                                      n, so, d_o);
                    errors++;
                }
            }
    free(src);
    free(dst);
    free(next);
    return errors;
}

static void test_every_kernel_exact(void **state)
{
    (void)state;
    size_t n;
    const copy_kernel *ks = kvi_copy_kernel_list(&n);
    assert_true(n >= 1);
    assert_string_equal(ks[0].name, "memcpy");
    int ran = 0;
    for (size_t i = 0; i < n; i++) {
        if (!kvi_copy_kernel_runs_here(&ks[i])) {
            print_message("kernel %s: this CPU lacks its instructions, not tested here\n",
                          ks[i].name);
            assert_null(kvi_copy_kernel_find(ks[i].name, strlen(ks[i].name)));
            continue;
        }
        assert_ptr_equal(kvi_copy_kernel_find(ks[i].name, strlen(ks[i].name)), &ks[i]);
        assert_int_equal(kernel_errors(&ks[i]), 0);
        ran++;
    }
    print_message("%d of %zu kernels run on this CPU and copied exactly\n", ran, n);
    assert_null(kvi_copy_kernel_find("avx1024nt", 9));
    assert_null(kvi_copy_kernel_find("memcp", 5)); /* a prefix is not a name */
}

/* The checker must see a broken kernel: one that drops the last byte, one that writes a byte
 * past the end. */
static void drop_last(char *d, const char *s, size_t n, const char *next, size_t next_n)
{
    (void)next, (void)next_n;
    memcpy(d, s, n > 0 ? n - 1 : 0);
}

static void overrun(char *d, const char *s, size_t n, const char *next, size_t next_n)
{
    (void)next, (void)next_n;
    memcpy(d, s, n);
    d[n] = s[n];
}

static void test_checker_catches_broken_kernels(void **state)
{
    (void)state;
    copy_kernel bad1 = {"drop_last", drop_last}, bad2 = {"overrun", overrun};
    assert_true(kernel_errors(&bad1) > 0);
    assert_true(kernel_errors(&bad2) > 0);
}

static bool warned; /* in the child: the refusal of KVTIER_COPY_KERNEL was logged */

static void catch_warning(void *ctx, int level, const char *line)
{
    (void)ctx;
    if (level == KVT_LOG_WARN && strstr(line, "KVTIER_COPY_KERNEL") &&
        strstr(line, "calibrating instead"))
        warned = true;
}

/* In a child: KVTIER_COPY_KERNEL=env (unset if NULL), then the two chosen names (and
 * "warned" if the setting was refused with a warning), and with
 * engine set, a CPU engine's names for 1 KiB, 16 KiB and 2 MiB runs and its Prometheus
 * kernel lines. The child's report comes back through a pipe. */
static void chosen_in_child(const char *env, bool engine, char *out, size_t cap)
{
    int fd[2];
    assert_int_equal(pipe(fd), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(fd[0]);
        if (env)
            setenv("KVTIER_COPY_KERNEL", env, 1);
        else
            unsetenv("KVTIER_COPY_KERNEL");
        kvt_log_set_handler(catch_warning, NULL);
        char buf[1024];
        const copy_kernel *const *k = kvi_copy_kernels();
        int len =
            snprintf(buf, sizeof(buf), "%s %s%s", k[0]->name, k[1]->name, warned ? " warned" : "");
        if (engine) {
            static unsigned char dev[4 * 4096];
            kvt_layout *l;
            kvt_mirror *m;
            kvt_copy *c;
            kvt_mirror_config mc;
            kvt_copy_config cc;
            kvt_mirror_config_init(&mc);
            mc.host_blocks = 4;
            kvt_copy_config_init(&cc);
            cc.threads = 1;
            char prom[8192];
            size_t plen = 0;
            if (kvt_layout_create(KVT_HOST_DEVICE, 4, &l) ||
                kvt_layout_add_region(l, (uint64_t)(uintptr_t)dev, 4096) ||
                kvt_mirror_create(&mc, l, &m) || kvt_copy_create(&cc, l, m, &c) ||
                kvt_copy_prometheus(c, prom, sizeof(prom), &plen))
                _exit(3);
            len += snprintf(buf + len, sizeof(buf) - (size_t)len, " | %s %s %s |",
                            kvt_copy_kernel_name(c, 1024), kvt_copy_kernel_name(c, 16384),
                            kvt_copy_kernel_name(c, 2u << 20));
            for (char *line = strtok(prom, "\n"); line; line = strtok(NULL, "\n"))
                if (strncmp(line, "kvtier_copy_kernel_info{", 24) == 0)
                    len += snprintf(buf + len, sizeof(buf) - (size_t)len, " %s", line);
            kvt_copy_destroy(c);
            kvt_mirror_destroy(m);
            kvt_layout_destroy(l);
        }
        ssize_t w = write(fd[1], buf, (size_t)len);
        _exit(w == len ? 0 : 4);
    }
    close(fd[1]);
    size_t got = 0;
    ssize_t r;
    while (got + 1 < cap && (r = read(fd[0], out + got, cap - 1 - got)) > 0)
        got += (size_t)r;
    out[got] = '\0';
    close(fd[0]);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}

static void test_pick_fastest_beyond_noise(void **state)
{
    (void)state;
    /* secs per kernel, 0: does not run here; kernel 2 is the expected one */
    double b[] = {1.0, 0.5, 0.56, 0}; /* 1 is more than 10% faster than 2: taken */
    assert_int_equal(kvi_copy_kernel_pick(b, 4, 2), 1);
    double c[] = {1.0, 0.52, 0.56, 0}; /* within 10%: the expected one stays */
    assert_int_equal(kvi_copy_kernel_pick(c, 4, 2), 2);
    double d[] = {1.0, 0.9, 0, 0.3}; /* the expected one does not run: plain fastest */
    assert_int_equal(kvi_copy_kernel_pick(d, 4, 2), 3);
    double e[] = {1.0, 0, 0, 0};
    assert_int_equal(kvi_copy_kernel_pick(e, 4, 0), 0);
    double f[] = {0.3, 0.2, 0.1, 0.4}; /* the expected one slowest by far */
    assert_int_equal(kvi_copy_kernel_pick(f, 4, 3), 2);
}

static void test_env_names_kernels(void **state)
{
    (void)state;
    char out[1024];
    chosen_in_child("memcpy", false, out, sizeof(out));
    assert_string_equal(out, "memcpy memcpy");
    chosen_in_child("small:sse2nt,large:memcpy", false, out, sizeof(out));
#if defined(__x86_64__)
    assert_string_equal(out, "sse2nt memcpy");
#else
    /* no sse2nt here: the bad name is refused and calibration decides */
    assert_true(strlen(out) > 0);
#endif
    chosen_in_child("large:memcpy", false, out, sizeof(out)); /* one class: both use it */
    assert_string_equal(out, "memcpy memcpy");
}

static void test_env_bad_name_calibrates(void **state)
{
    (void)state;
    char out[1024], a[64], b[64];
    chosen_in_child(NULL, false, out, sizeof(out));
    print_message("calibrated here: %s\n", out);
    assert_null(strstr(out, "warned"));
    /* a name no kernel has, an empty name, a class twice, no class, a bad part among good
     * ones: refused with a warning, and calibration picks a runnable kernel per class */
    const char *bad[] = {"warp9",       "small:memcpy,large:", "small:memcpy,small:memcpy",
                         "tiny:memcpy", "small:memcpy,warp9",  ":"};
    for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
        chosen_in_child(bad[i], false, out, sizeof(out));
        if (!strstr(out, " warned"))
            fail_msg("KVTIER_COPY_KERNEL=\"%s\" taken without a warning: %s", bad[i], out);
        assert_int_equal(sscanf(out, "%63s %63s", a, b), 2);
        assert_non_null(kvi_copy_kernel_find(a, strlen(a)));
        assert_non_null(kvi_copy_kernel_find(b, strlen(b)));
    }
}

static void test_engine_reports_kernels(void **state)
{
    (void)state;
    char out[1024];
    chosen_in_child("small:memcpy,large:memcpy", true, out, sizeof(out));
    assert_string_equal(out, "memcpy memcpy | memcpy memcpy memcpy | "
                             "kvtier_copy_kernel_info{runs=\"small\",kernel=\"memcpy\"} 1 "
                             "kvtier_copy_kernel_info{runs=\"large\",kernel=\"memcpy\"} 1");
#if defined(__x86_64__)
    chosen_in_child("small:sse2nt,large:memcpy", true, out, sizeof(out));
    /* 1 KiB runs are under nt_min_bytes (4 KiB): memcpy whatever the kernels */
    assert_string_equal(out, "sse2nt memcpy | memcpy sse2nt memcpy | "
                             "kvtier_copy_kernel_info{runs=\"small\",kernel=\"sse2nt\"} 1 "
                             "kvtier_copy_kernel_info{runs=\"large\",kernel=\"memcpy\"} 1");
#endif
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pick_fastest_beyond_noise),
        cmocka_unit_test(test_env_names_kernels),
        cmocka_unit_test(test_env_bad_name_calibrates),
        cmocka_unit_test(test_engine_reports_kernels),
        cmocka_unit_test(test_every_kernel_exact),
        cmocka_unit_test(test_checker_catches_broken_kernels),
    };
    return kvt_test_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
