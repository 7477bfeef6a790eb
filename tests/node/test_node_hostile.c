/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The node tier against another local user and against a damaged metadata object.
 *
 * "Another user" is a child process that switched to uid/gid 65534 (nobody/nogroup) before it
 * touched /dev/shm, so these cases need root (they are skipped, and say so, without it). It
 * plants the names a replica is about to use, with a mode that would let it read and write
 * the victim's KV; the victim must refuse them with a message naming the holder and share
 * nothing. A damaged header (every word of its shape and layout set to extreme values) must
 * be refused at attach, never crash the replica that attaches, and a replica already attached
 * must not read its layout back from the shared header (log_cap = 0 once divided by zero).
 */
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "kvt_test.h"
#include "node/node_internal.h"

#define OTHER_ID 65534u /* nobody, nogroup */
#define BPR      16u
#define RANKS    2u

static char g_name[40];

static int setup(void **state)
{
    static unsigned n;
    (void)state;
    snprintf(g_name, sizeof(g_name), "hostile-%d-%u", (int)getpid(), n++);
    return 0;
}

static void shm_path(char *buf, size_t cap, const char *kind)
{
    snprintf(buf, cap, "/kvtier.%s.%s", g_name, kind);
}

/* Opens the tier's metadata object (flags O_RDONLY or O_RDWR) and stats it. */
static int open_meta_object(int flags, struct stat *st)
{
    char p[96];
    shm_path(p, sizeof(p), "meta");
    int fd = shm_open(p, flags, 0);
    assert_true(fd >= 0);
    assert_int_equal(fstat(fd, st), 0);
    return fd;
}

static int teardown(void **state)
{
    (void)state;
    char p[96];
    shm_path(p, sizeof(p), "meta");
    shm_unlink(p);
    shm_path(p, sizeof(p), "data");
    shm_unlink(p);
    return 0;
}

static void node_cfg(kvt_node_config *c, uint32_t rank)
{
    kvt_node_config_init(c);
    c->name = g_name;
    c->rank = rank;
    c->ranks = RANKS;
    c->blocks_per_rank = BPR;
    c->reap_interval_ms = 0;
}

/* Runs fn in a child that is uid/gid 65534; returns the child's exit status (0: fn succeeded). */
static int as_other_user(int (*fn)(void *), void *arg)
{
    pid_t pid = fork();
    if (pid == 0) {
        if (setgroups(0, NULL) != 0 || setgid(OTHER_ID) != 0 || setuid(OTHER_ID) != 0)
            _exit(90);
        _exit(fn(arg));
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st))
        return 99;
    return WEXITSTATUS(st);
}

static void need_root(void)
{
    if (geteuid() != 0)
        KVT_SKIP("switching to a second user needs root");
}

typedef struct plant {
    const char *kind;
    const void *bytes; /* what the planted object holds (NULL: zeros) */
    size_t len;
    mode_t mode;
} plant;

/* The other user's side: creates the name, world readable and writable, with its content. */
static int plant_object(void *arg)
{
    const plant *pl = arg;
    char p[96];
    shm_path(p, sizeof(p), pl->kind);
    int fd = shm_open(p, O_RDWR | O_CREAT | O_EXCL, pl->mode);
    if (fd < 0 || fchmod(fd, pl->mode) != 0 || ftruncate(fd, (off_t)pl->len) != 0)
        return 1;
    if (pl->bytes && pwrite(fd, pl->bytes, pl->len, 0) != (ssize_t)pl->len)
        return 2;
    close(fd);
    return 0;
}

/* The bytes of a real, freshly created metadata object of this shape (made under another
 * name, then removed): what an attacker who knows kvtier would plant. */
static uint8_t *real_meta(size_t *len)
{
    char saved[40];
    memcpy(saved, g_name, sizeof(saved));
    snprintf(g_name, sizeof(g_name), "%.30s-src", saved);
    kvt_node_config c;
    node_cfg(&c, 0);
    kvt_node *n;
    KVT_OK_(kvt_node_attach(&c, &n));
    struct stat st;
    int fd = open_meta_object(O_RDONLY, &st);
    uint8_t *b = malloc((size_t)st.st_size);
    assert_non_null(b);
    assert_int_equal(pread(fd, b, (size_t)st.st_size, 0), st.st_size);
    close(fd);
    kvt_node_detach(n);
    memcpy(g_name, saved, sizeof(saved));
    *len = (size_t)st.st_size;
    return b;
}

static void expect_refused_naming_the_holder(int rc)
{
    if (rc != KVT_EEXIST)
        fail_msg("attach -> %s (%s), expected KVT_EEXIST", kvt_err_name(rc), kvt_last_error());
    if (!strstr(kvt_last_error(), "nobody") && !strstr(kvt_last_error(), "65534"))
        fail_msg("the message does not name the holder: %s", kvt_last_error());
}

/* Another user plants the metadata name: an empty object, and a perfect copy of a real tier's
 * header, both mode 0666. Either way the replica refuses, naming the holder, and writes
 * nothing into it. */
static void another_user_plants_the_metadata(void **state)
{
    (void)state;
    need_root();
    size_t len;
    uint8_t *real = real_meta(&len);
    for (int variant = 0; variant < 2; variant++) {
        plant pl = {"meta", variant ? real : NULL, len, 0666};
        assert_int_equal(as_other_user(plant_object, &pl), 0);
        kvt_node_config c;
        node_cfg(&c, 0);
        kvt_node *n = NULL;
        expect_refused_naming_the_holder(kvt_node_attach(&c, &n));
        assert_null(n);
        /* nothing of ours went into it: its bytes are what the other user wrote */
        char p[96];
        shm_path(p, sizeof(p), "meta");
        int fd = shm_open(p, O_RDONLY, 0);
        assert_true(fd >= 0);
        uint8_t *now = malloc(len);
        assert_non_null(now);
        assert_int_equal(pread(fd, now, len, 0), (ssize_t)len);
        close(fd);
        if (variant)
            assert_memory_equal(now, real, len);
        else
            for (size_t i = 0; i < len; i++)
                assert_int_equal(now[i], 0);
        free(now);
        shm_unlink(p);
    }
    free(real);
}

/* Another user plants the data name (the blocks): a worker's mirror refuses it. */
static void another_user_plants_the_data(void **state)
{
    (void)state;
    need_root();
    static uint8_t dev[64 * 4096];
    kvt_layout *l;
    KVT_OK_(kvt_layout_create(KVT_HOST_DEVICE, 64, &l));
    KVT_OK_(kvt_layout_add_region(l, (uint64_t)(uintptr_t)dev, 4096));
    kvt_mirror_config mc;
    kvt_mirror_config_init(&mc);
    mc.host_blocks = RANKS * BPR;
    mc.node_name = g_name;
    mc.pin = false;
    /* the exact size the mirror would map, so only ownership can refuse it */
    kvt_mirror *m;
    KVT_OK_(kvt_mirror_create(&mc, l, &m));
    kvt_mirror_destroy(m);
    char p[96];
    shm_path(p, sizeof(p), "data");
    int fd = shm_open(p, O_RDONLY, 0);
    struct stat st;
    assert_true(fd >= 0 && fstat(fd, &st) == 0);
    close(fd);
    shm_unlink(p);
    plant pl = {"data", NULL, (size_t)st.st_size, 0666};
    assert_int_equal(as_other_user(plant_object, &pl), 0);
    m = NULL;
    int rc = kvt_mirror_create(&mc, l, &m);
    if (rc != KVT_EEXIST || !strstr(kvt_last_error(), "65534"))
        fail_msg("mirror -> %s: %s", kvt_err_name(rc), kvt_last_error());
    assert_null(m);
    kvt_layout_destroy(l);
}

/* An object of our own whose mode lets others in (a umask of 0, a hand-made object): refused
 * as well, naming the mode. */
static void our_own_object_open_to_others_is_refused(void **state)
{
    (void)state;
    char p[96];
    shm_path(p, sizeof(p), "meta");
    int fd = shm_open(p, O_RDWR | O_CREAT | O_EXCL, 0600);
    assert_true(fd >= 0);
    assert_int_equal(fchmod(fd, 0644), 0);
    assert_int_equal(ftruncate(fd, 4096), 0);
    close(fd);
    kvt_node_config c;
    node_cfg(&c, 0);
    kvt_node *n = NULL;
    KVT_ERR_(kvt_node_attach(&c, &n), KVT_ESTATE);
    assert_non_null(strstr(kvt_last_error(), "0644"));
    assert_null(n);
}

/* Every 32-bit word of the header's shape and layout set to extreme values while a replica is
 * attached: a second replica's attach refuses what it cannot trust (or, for a word nobody
 * reads, attaches), never crashes; the first keeps working from its own copy of the layout. */
static void damaged_header_words_are_refused(void **state)
{
    (void)state;
    kvt_node_config c0, c1;
    node_cfg(&c0, 0);
    node_cfg(&c1, 1);
    kvt_node *a;
    KVT_OK_(kvt_node_attach(&c0, &a));
    struct stat st;
    int fd = open_meta_object(O_RDWR, &st);
    uint8_t *h = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    assert_true(h != MAP_FAILED);
    close(fd);
    static const uint32_t values[] = {0, 1, 0x7fffffffu, 0xffffffffu, 4096, 63};
    const size_t ready_at = offsetof(struct node_hdr, ready);
    uint32_t refused = 0, attached = 0;
    for (size_t off = 0; off < KVI_NODE_HDR_SHAPE_BYTES; off += 4) {
        if (off == ready_at)
            continue; /* 0 there means "still being made": attach waits, then KVT_EBUSY */
        uint32_t saved;
        memcpy(&saved, h + off, 4);
        for (size_t v = 0; v < sizeof(values) / sizeof(values[0]); v++) {
            if (values[v] == saved)
                continue;
            memcpy(h + off, &values[v], 4);
            kvt_node *b = NULL;
            int rc = kvt_node_attach(&c1, &b);
            if (rc == 0) {
                attached++;
                kvt_node_detach(b);
            } else {
                if (rc != KVT_EPROTO && rc != KVT_EVERSION && rc != KVT_EINVAL)
                    fail_msg("word at %zu = %u: attach -> %s (%s)", off, values[v],
                             kvt_err_name(rc), kvt_last_error());
                refused++;
            }
            /* the attached replica never reads its layout back from the header */
            kvt_node_stats s;
            KVT_OK_(kvt_node_get_stats(a, &s));
            KVT_OK_(kvt_node_reap(a) >= 0 ? 0 : KVT_EIO);
        }
        memcpy(h + off, &saved, 4);
    }
    print_message("damaged header words: %u refused, %u harmless (padding)\n", refused, attached);
    assert_true(refused > 100);
    /* log_cap = 0 under a live replica: it keeps logging with its own capacity */
    uint32_t zero = 0;
    memcpy(h + offsetof(struct node_hdr, log_cap), &zero, 4);
    kvt_node_stats s;
    KVT_OK_(kvt_node_get_stats(a, &s));
    munmap(h, (size_t)st.st_size);
    kvt_node_detach(a);
}

static int create_as_group_member(void *arg)
{
    (void)arg;
    kvt_node_config c;
    node_cfg(&c, 0);
    c.group = "nogroup";
    kvt_node *n;
    if (kvt_node_attach(&c, &n) != 0)
        return 1;
    return 0; /* exits attached: the tier stays, rank 0 dead (reaped by the next attach) */
}

/* With a sharing group, a replica of another user of that group made the tier: a replica
 * naming the group attaches; one that does not refuses, naming the holder. */
static void a_sharing_group_admits_its_members(void **state)
{
    (void)state;
    need_root();
    if (!getgrnam("nogroup"))
        KVT_SKIP("no group named nogroup");
    assert_int_equal(as_other_user(create_as_group_member, NULL), 0);
    struct stat st;
    close(open_meta_object(O_RDONLY, &st));
    assert_int_equal(st.st_uid, OTHER_ID);
    assert_int_equal(st.st_mode & 0777, 0660);
    kvt_node_config c;
    node_cfg(&c, 1);
    kvt_node *n = NULL;
    expect_refused_naming_the_holder(kvt_node_attach(&c, &n));
    c.group = "nogroup";
    KVT_OK_(kvt_node_attach(&c, &n));
    kvt_node_detach(n);
    c.group = "no-such-group-here";
    KVT_ERR_(kvt_node_attach(&c, &n), KVT_EINVAL);
}

/* The header decoder on its own: a real header passes, every truncation fails cleanly. */
static void the_header_check_refuses_truncations(void **state)
{
    (void)state;
    size_t len;
    uint8_t *real = real_meta(&len);
    KVT_OK_(kvi_node_header_check(real, len));
    for (size_t cut = 0; cut < len; cut += cut < 256 ? 1 : 997)
        assert_int_not_equal(kvi_node_header_check(real, cut), 0);
    free(real);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(another_user_plants_the_metadata, setup, teardown),
        cmocka_unit_test_setup_teardown(another_user_plants_the_data, setup, teardown),
        cmocka_unit_test_setup_teardown(our_own_object_open_to_others_is_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(damaged_header_words_are_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(a_sharing_group_admits_its_members, setup, teardown),
        cmocka_unit_test_setup_teardown(the_header_check_refuses_truncations, setup, teardown),
    };
    return kvt_test_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
