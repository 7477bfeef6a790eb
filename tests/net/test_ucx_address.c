/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A peer's UCX worker address is parsed in full before UCX sees it (src/net/ucx_addr.c).
 *
 * The property that matters is not the parser's own opinion but what UCX does: every address
 * the check accepts must be one UCX can be handed without dying. So this test mutates a real
 * worker address byte by byte (each byte set to 0x00 and 0xff, and flipped in its top and its
 * lowest bit), truncates and extends it, and hands every variant to UCX in a child process:
 * kvi_ucx_send, which makes an endpoint and tries to send. The child reports each variant's
 * index and the check's verdict before it tries; a child that dies by a signal names the
 * variant that killed it, and a new child goes on from the next one.
 *
 *   - accepted and killed UCX: must be none;
 *   - rejected and killed UCX: the check's reason to exist (this build's UCX 1.13 aborts on
 *     some of them: the test prints how many, and fails if none does, since then it would no
 *     longer show that it can see a crash).
 */
#include <signal.h>
#include <sys/wait.h>

#include "kvt_test.h"
#include "net/ucx.h"

#define N_OPS 4 /* per byte: 0x00, 0xff, ^0x80, ^0x01 */

typedef struct variant {
    uint8_t buf[KVI_UCX_ADDR_MAX];
    size_t len;
} variant;

/* Variant i of base (len bytes): false once past the last. */
static bool make_variant(const uint8_t *base, size_t len, uint32_t i, variant *v)
{
    uint32_t n_mut = (uint32_t)len * N_OPS;
    memcpy(v->buf, base, len);
    v->len = len;
    if (i < n_mut) {
        uint8_t *b = &v->buf[i / N_OPS];
        static const int op_xor[N_OPS] = {-1, -2, 0x80, 0x01};
        int op = op_xor[i % N_OPS];
        *b = op == -1 ? 0x00 : op == -2 ? 0xff : (uint8_t)(*b ^ op);
        return true;
    }
    i -= n_mut;
    if (i < len) { /* truncated to i bytes */
        v->len = i;
        return true;
    }
    i -= (uint32_t)len;
    if (i < 3) { /* extended by 1, 2 or 64 bytes */
        size_t extra = i == 2 ? 64 : i + 1;
        memset(v->buf + len, 0xa5, extra);
        v->len = len + extra;
        return true;
    }
    return false;
}

/* The child: walks the variants from `from`, writing (index, verdict) before each attempt. */
static int child_main(int fd, uint32_t from, size_t want_len)
{
    kvi_ucx *u;
    if (kvi_ucx_create(&u) != 0)
        return 2;
    const void *a;
    size_t len;
    kvi_ucx_address(u, &a, &len);
    if (len != want_len && want_len)
        return 3;
    static variant v;
    static uint8_t base[KVI_UCX_ADDR_MAX];
    memcpy(base, a, len);
    uint8_t payload[64] = {0};
    for (uint32_t i = from; make_variant(base, len, i, &v); i++) {
        int32_t rec[2] = {(int32_t)i, kvi_ucx_address_check(u, v.buf, v.len) == 0};
        if (write(fd, rec, sizeof(rec)) != sizeof(rec))
            return 4;
        if (memcmp(v.buf, base, len) == 0 && v.len == len)
            continue; /* the genuine address (a mutation that changed nothing) */
        (void)kvi_ucx_send(u, v.buf, v.len, payload, sizeof(payload), 7, 5);
    }
    kvi_ucx_destroy(u);
    return 0;
}

static void every_accepted_address_is_safe_for_ucx(void **state)
{
    (void)state;
    /* the genuine address's length, from a worker of our own */
    kvi_ucx *u;
    KVT_OK_(kvi_ucx_create(&u));
    const void *a;
    size_t len;
    kvi_ucx_address(u, &a, &len);
    KVT_OK_(kvi_ucx_address_check(u, a, len));
    kvi_ucx_destroy(u);
    uint32_t total = (uint32_t)len * N_OPS + (uint32_t)len + 3;
    uint32_t next = 0, accepted = 0, rejected = 0, killed_rejected = 0, killed_accepted = 0;
    int32_t last_verdict = -1;
    while (next < total) {
        int p[2];
        assert_int_equal(pipe(p), 0);
        pid_t pid = fork();
        if (pid == 0) {
            close(p[0]);
            signal(SIGPIPE, SIG_IGN);
            /* a crash must end the child, not run cmocka's handler (inherited) */
            static const int sigs[] = {SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL};
            for (size_t k = 0; k < sizeof(sigs) / sizeof(sigs[0]); k++)
                signal(sigs[k], SIG_DFL);
            _exit(child_main(p[1], next, len));
        }
        close(p[1]);
        int32_t rec[2];
        int32_t last = -1;
        while (read(p[0], rec, sizeof(rec)) == (ssize_t)sizeof(rec)) {
            if (getenv("KVT_TEST_VERBOSE"))
                fprintf(stderr, "variant %d verdict %d\n", rec[0], rec[1]);
            last = rec[0];
            last_verdict = rec[1];
            if (rec[1])
                accepted++;
            else
                rejected++;
        }
        close(p[0]);
        int st;
        assert_int_equal(waitpid(pid, &st, 0), pid);
        if (WIFEXITED(st)) {
            assert_int_equal(WEXITSTATUS(st), 0);
            break; /* every variant tried */
        }
        assert_true(last >= 0); /* it died trying variant `last` */
        if (last_verdict) {
            killed_accepted++;
            print_message("variant %d (accepted by the check) killed UCX with signal %d\n", last,
                          WTERMSIG(st));
        } else {
            killed_rejected++;
        }
        next = (uint32_t)last + 1;
    }
    print_message("%zu-byte worker address, %u variants: %u accepted, %u rejected; UCX died on "
                  "%u rejected and %u accepted ones\n",
                  len, total, accepted, rejected, killed_rejected, killed_accepted);
    assert_int_equal(killed_accepted, 0);
    assert_true(killed_rejected > 0);
    assert_true(accepted > 0); /* the genuine bytes that carry no structure pass */
}

/* The parser on its own: truncations of a real address fail, the address itself passes, and
 * a header of another format version is named. */
static void the_parse_needs_every_byte(void **state)
{
    (void)state;
    kvi_ucx *u;
    KVT_OK_(kvi_ucx_create(&u));
    const void *a;
    size_t len;
    kvi_ucx_address(u, &a, &len);
    unsigned version = ((const uint8_t *)a)[0] & 0x0fu;
    KVT_OK_(kvi_ucx_addr_parse(a, len, version, NULL, NULL));
    for (size_t cut = 0; cut < len; cut++)
        KVT_ERR_(kvi_ucx_addr_parse(a, cut, version, NULL, NULL), KVT_EPROTO);
    KVT_ERR_(kvi_ucx_addr_parse(a, len, version ^ 1u, NULL, NULL), KVT_EPROTO);
    assert_non_null(strstr(kvt_last_error(), "version"));
    kvi_ucx_destroy(u);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(the_parse_needs_every_byte),
        cmocka_unit_test(every_accepted_address_is_safe_for_ucx),
    };
    return kvt_test_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
