/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The node tier against another local user, against a sharer that shrinks its objects and
 * against a damaged metadata object.
 *
 * "Another user" is a child process that switched to uid/gid 65534 (nobody/nogroup) before it
 * touched /dev/shm, so these cases need root (they are skipped, and say so, without it). It
 * plants every name it can guess a replica will use (the tier's names before issue 57,
 * /kvtier.<name>.meta and .data, and the rendezvous), with a mode that would let it read and
 * write the victim's KV: the victim attaches all the same, under names nobody else can know,
 * and shares nothing with it. An object of the tier's (its unguessable name) that is ours but
 * open to others is refused. A sharer that cuts the data or the metadata object short costs
 * misses and failed loads, never a signal. A damaged header (every word of its shape and
 * layout set to extreme values) must be refused at attach, never crash the replica that
 * attaches, and a replica already attached must not read its layout back from the shared
 * header (log_cap = 0 once divided by zero).
 */
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "kvt_test.h"
#include "base/guard.h"
#include "base/shm.h"
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

/* The tier's object `kind` as it is named now (its rendezvous made if absent, in the default
 * directory of this user). */
static void shm_path(char *buf, size_t cap, const char *kind)
{
    kvi_shm_share me = {0};
    char dir[1024], stem[128];
    KVT_OK_(kvi_shm_dir(NULL, &me, dir, sizeof(dir)));
    KVT_OK_(kvi_shm_stem(dir, g_name, &me, true, stem, sizeof(stem)));
    snprintf(buf, cap, "/kvtier.%s.%s", stem, kind);
}

/* The tier's object `kind` as it was named before issue 57 (what anyone can guess). */
static void guessable_path(char *buf, size_t cap, const char *kind)
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
    char p[160];
    for (int k = 0; k < 2; k++) {
        guessable_path(p, sizeof(p), k ? "data" : "meta");
        shm_unlink(p);
    }
    kvt_node_unlink(g_name); /* the objects under their real names, and the rendezvous */
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

/* The other user's side: creates the guessable name, world readable and writable, with its
 * content. */
static int plant_object(void *arg)
{
    const plant *pl = arg;
    char p[96];
    guessable_path(p, sizeof(p), pl->kind);
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

/* The other user's side: tries to put a rendezvous of its own for the tier (naming objects it
 * would make) into the victim's rendezvous directory. 0 when it was refused. */
static int plant_rendezvous(void *arg)
{
    const char *dir = arg;
    char p[1200];
    snprintf(p, sizeof(p), "%s/%s.rendezvous", dir, g_name);
    int fd = open(p, O_WRONLY | O_CREAT | O_EXCL, 0666);
    if (fd >= 0) {
        close(fd);
        return 1;
    }
    return errno == EACCES ? 0 : 2;
}

/* A worker's mirror of the tier's data over a small host layout. */
static int node_mirror(kvt_layout **l, kvt_mirror **m, uint8_t *dev)
{
    KVT_OK_(kvt_layout_create(KVT_HOST_DEVICE, 64, l));
    KVT_OK_(kvt_layout_add_region(*l, (uint64_t)(uintptr_t)dev, 4096));
    kvt_mirror_config mc;
    kvt_mirror_config_init(&mc);
    mc.host_blocks = RANKS * BPR;
    mc.node_name = g_name;
    mc.pin = false;
    return kvt_mirror_create(&mc, *l, m);
}

/* Issue 57: another user plants every name it can guess - the tier's objects under the names
 * they had before (an empty object, then a perfect copy of a real tier's header; mode 0666)
 * - and tries to plant a rendezvous in the victim's directory. The victim's replica attaches
 * and its worker's mirror maps all the same (before: KVT_EEXIST naming the holder, and the
 * victim could not remove the squatter's object: a denial of service on a predictable name),
 * under names the squatter cannot know, and nothing of the victim's goes into the squatter's
 * objects. */
static void another_users_squat_of_every_name_costs_nothing(void **state)
{
    (void)state;
    need_root();
    size_t len;
    uint8_t *real = real_meta(&len);
    kvi_shm_share me = {0};
    char dir[1024];
    KVT_OK_(kvi_shm_dir(NULL, &me, dir, sizeof(dir)));
    static uint8_t dev[64 * 4096];
    for (int variant = 0; variant < 2; variant++) {
        plant pm = {"meta", variant ? real : NULL, len, 0666};
        plant pd = {"data", NULL, 1u << 20, 0666};
        assert_int_equal(as_other_user(plant_object, &pm), 0);
        assert_int_equal(as_other_user(plant_object, &pd), 0);
        assert_int_equal(as_other_user(plant_rendezvous, dir), 0); /* refused */
        kvt_node_config c;
        node_cfg(&c, 0);
        kvt_node *n = NULL;
        KVT_OK_(kvt_node_attach(&c, &n));
        kvt_layout *l;
        kvt_mirror *m = NULL;
        KVT_OK_(node_mirror(&l, &m, dev));
        char ours[160], theirs[96];
        shm_path(ours, sizeof(ours), "meta");
        guessable_path(theirs, sizeof(theirs), "meta");
        assert_string_not_equal(ours, theirs);
        /* nothing of ours went into the squatter's objects: their bytes are what it wrote */
        int fd = shm_open(theirs, O_RDONLY, 0);
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
        kvt_mirror_destroy(m);
        kvt_layout_destroy(l);
        kvt_node_detach(n);
        for (int k = 0; k < 2; k++) {
            guessable_path(theirs, sizeof(theirs), k ? "data" : "meta");
            shm_unlink(theirs);
        }
    }
    print_message("another user's objects under every guessable name, and a rendezvous it could "
                  "not plant: the replica attached and its mirror mapped\n");
    free(real);
}

/* Issue 57: a sharer (a process of this user here) cuts the data object short under a worker
 * that keeps blocks there. The next load from it fails - its blocks are reported invalid, the
 * engine recomputes them - and the process gets no signal; loads keep failing (the mapping
 * reads zeros) and the worker keeps working. Before: SIGBUS killed every replica at its next
 * load. */
static void a_shrunk_data_object_costs_failed_loads_not_a_signal(void **state)
{
    (void)state;
    static uint8_t dev[64 * 4096];
    kvt_layout *l;
    kvt_mirror *m;
    KVT_OK_(node_mirror(&l, &m, dev));
    kvt_worker_config wc;
    kvt_worker_config_init(&wc);
    wc.copy.threads = 1;
    kvt_worker *w;
    KVT_OK_(kvt_worker_create(&wc, l, m, &w));
    memset(dev + 4096, 0x5a, 4 * 4096);
    kvt_offload_meta meta;
    kvt_offload_meta_init(&meta);
    meta.store_event = 1;
    for (uint32_t b = 1; b <= 4; b++)
        KVT_OK_(kvt_offload_meta_add_store(&meta, b, b));
    const kvt_str *reqs;
    uint32_t n;
    KVT_OK_(kvt_worker_bind(w, &meta));
    KVT_OK_(kvt_worker_get_finished(w, NULL, &reqs, &n));
    KVT_OK_(kvt_worker_flush(w));
    kvt_worker_clear(w);
    char p[160];
    shm_path(p, sizeof(p), "data");
    int fd = shm_open(p, O_RDWR, 0);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, 0), 0); /* what any process of this user may do */
    close(fd);
    unsigned long trips = kvi_guard_trips();
    for (int round = 0; round < 2; round++) {
        kvt_offload_meta_clear(&meta);
        meta.load_event = 2 + round;
        for (uint32_t b = 0; b < 4; b++)
            KVT_OK_(kvt_offload_meta_add_load(&meta, 11 + b, 1 + b));
        KVT_OK_(kvt_offload_meta_add_load_req(&meta, meta.load_event, "r", 1));
        KVT_OK_(kvt_worker_bind(w, &meta));
        n = 0;
        kvt_wait wt = kvt_wait_start();
        do
            KVT_OK_(kvt_worker_get_finished(w, NULL, &reqs, &n));
        while (n == 0 && kvt_wait_more(&wt));
        assert_int_equal(n, 1); /* the request finishes: vLLM recomputes its invalid blocks */
        kvt_worker_clear(w);
        uint32_t inv[8];
        assert_int_equal(kvt_worker_take_invalid_blocks(w, inv, 8), 4);
        for (uint32_t b = 0; b < 4; b++)
            assert_int_equal(inv[b], 11 + b);
    }
    assert_true(kvi_guard_trips() > trips);
    print_message("a shrunk data object: %lu SIGBUS caught, every load of it reported invalid\n",
                  kvi_guard_trips() - trips);
    kvt_offload_meta_release(&meta);
    kvt_worker_destroy(w);
    kvt_mirror_destroy(m);
    kvt_layout_destroy(l);
}

/* Issue 57: the metadata object cut short under an attached replica: its calls go on, no
 * signal; it is alone from then on (what peers published are misses for it). */
static void a_shrunk_metadata_object_costs_no_signal(void **state)
{
    (void)state;
    kvt_node_config c;
    node_cfg(&c, 0);
    kvt_node *n;
    KVT_OK_(kvt_node_attach(&c, &n));
    struct stat st;
    int fd = open_meta_object(O_RDWR, &st);
    assert_int_equal(ftruncate(fd, 0), 0);
    close(fd);
    unsigned long trips = kvi_guard_trips();
    kvt_node_stats s;
    KVT_OK_(kvt_node_get_stats(n, &s)); /* touches the mapping: caught, zeros */
    assert_true(kvi_guard_trips() > trips);
    KVT_OK_(kvt_node_reap(n) >= 0 ? 0 : KVT_EIO);
    KVT_OK_(kvt_node_get_stats(n, &s));
    kvt_node_detach(n);
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
    kvt_node_config c;
    node_cfg(&c, 0);
    c.group = "nogroup";
    c.dir = arg;
    kvt_node *n;
    if (kvt_node_attach(&c, &n) != 0)
        return 1;
    return 0; /* exits attached: the tier stays, rank 0 dead (reaped by the next attach) */
}

/* With a sharing group, a replica of another user of that group made the tier, its rendezvous
 * in a directory of the group closed to others: a replica naming the group and the directory
 * attaches. Naming the group without a directory, or with one open to others, is refused
 * saying why; an unknown group too. */
static void a_sharing_group_admits_its_members(void **state)
{
    (void)state;
    need_root();
    struct group *gr = getgrnam("nogroup");
    if (!gr)
        KVT_SKIP("no group named nogroup");
    char dir[] = "/tmp/kvt-node-group-XXXXXX";
    assert_non_null(mkdtemp(dir));
    assert_int_equal(chown(dir, 0, gr->gr_gid), 0);
    assert_int_equal(chmod(dir, 02770), 0);
    assert_int_equal(as_other_user(create_as_group_member, dir), 0);
    kvt_node_config c;
    node_cfg(&c, 1);
    c.group = "nogroup";
    c.dir = dir;
    kvt_node *n = NULL;
    KVT_OK_(kvt_node_attach(&c, &n));
    kvt_node_detach(n);
    c.dir = NULL;
    KVT_ERR_(kvt_node_attach(&c, &n), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "chmod 2770"));
    assert_int_equal(chmod(dir, 02777), 0);
    c.dir = dir;
    KVT_ERR_(kvt_node_attach(&c, &n), KVT_ESTATE);
    assert_non_null(strstr(kvt_last_error(), "closed to everyone else"));
    assert_int_equal(chmod(dir, 02770), 0);
    c.group = "no-such-group-here";
    KVT_ERR_(kvt_node_attach(&c, &n), KVT_EINVAL);
    KVT_OK_(kvt_node_unlink_at(g_name, dir, "nogroup"));
    assert_int_equal(rmdir(dir), 0);
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
        cmocka_unit_test_setup_teardown(another_users_squat_of_every_name_costs_nothing, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(our_own_object_open_to_others_is_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(a_shrunk_data_object_costs_failed_loads_not_a_signal, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(a_shrunk_metadata_object_costs_no_signal, setup, teardown),
        cmocka_unit_test_setup_teardown(damaged_header_words_are_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(a_sharing_group_admits_its_members, setup, teardown),
        cmocka_unit_test_setup_teardown(the_header_check_refuses_truncations, setup, teardown),
    };
    return kvt_test_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
