/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvt_describe against the structs it describes: every field, in the header's order, each
 * where the compiler put it and as wide; nothing past the struct; the families it names are
 * the ones the exposition writes. A field added to the header without its row (or a row whose
 * field moved) fails here. kvt_describe_config likewise for the configuration structs, whose
 * rows must also be what *_config_init sets and what *_create refuses outside of.
 */
#include "kvt_test.h"

#include <stddef.h>
#include <stdlib.h>

/* the rows cover the struct: each starts where the previous ended (plus the alignment the
 * compiler adds before a wider field) and the last ends at its size (plus tail padding) */
static void covers(const char *type, size_t type_size)
{
    const kvt_field *f;
    uint32_t n;
    KVT_OK_(kvt_describe(type, &f, &n));
    assert_true(n > 0);
    assert_int_equal(kvt_sizeof(type), type_size);
    size_t at = 0;
    for (uint32_t i = 0; i < n; i++) {
        size_t align = f[i].size;
        size_t want = (at + align - 1) / align * align;
        if (f[i].offset != want)
            fail_msg("%s: field %u (%s) at offset %u, the previous ends at %zu (next aligned %zu):"
                     " a field is missing from the description, or out of order",
                     type, i, f[i].name, f[i].offset, at, want);
        assert_true(f[i].count >= 1);
        assert_true(f[i].kind <= KVT_FIELD_ROOM);
        assert_true(f[i].help && f[i].help[0]);
        at = f[i].offset + (size_t)f[i].size * f[i].count;
    }
    assert_true(at <= type_size && type_size - at < 8);
}

static void test_describes_the_stats_structs(void **state)
{
    (void)state;
    covers("kvt_offload_stats", sizeof(kvt_offload_stats));
    covers("kvt_tier_stats", sizeof(kvt_tier_stats));
    covers("kvt_node_stats", sizeof(kvt_node_stats));
    covers("kvt_remote_stats", sizeof(kvt_remote_stats));
    const kvt_field *f;
    uint32_t n;
    KVT_OK_(kvt_describe("kvt_offload_stats", &f, &n));
    /* spot checks against the header, by name */
    int seen = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (!strcmp(f[i].name, "hit_requests")) {
            assert_int_equal(f[i].offset, offsetof(kvt_offload_stats, hit_requests));
            assert_string_equal(f[i].metric, "kvtier_offload_hit_requests_total");
            assert_int_equal(f[i].kind, KVT_FIELD_COUNTER);
            seen++;
        }
        if (!strcmp(f[i].name, "host_blocks")) {
            assert_int_equal(f[i].size, 4);
            assert_int_equal(f[i].kind, KVT_FIELD_GAUGE);
            seen++;
        }
    }
    assert_int_equal(seen, 2);
    KVT_OK_(kvt_describe("kvt_tier_stats", &f, &n));
    assert_string_equal(f[0].name, "name");
    assert_int_equal(f[0].kind, KVT_FIELD_STRING);
    assert_int_equal(f[n - 1].kind, KVT_FIELD_ROOM);
    assert_int_equal(f[n - 1].count, 6);
}

static void test_unknown_struct_is_refused(void **state)
{
    (void)state;
    const kvt_field *f = (const kvt_field *)1;
    uint32_t n = 7;
    assert_int_equal(kvt_describe("kvt_no_such_struct", &f, &n), KVT_ENOENT);
    assert_null(f);
    assert_int_equal(n, 0);
    assert_int_equal(kvt_describe(NULL, &f, &n), KVT_EINVAL);
}

/* every family a row names is in the exposition of a two-tier manager, but the disk's */
static void test_families_are_exposed(void **state)
{
    (void)state;
    kvt_pool_config pc;
    kvt_pool_config_init(&pc);
    pc.num_blocks = 16;
    kvt_pool *gpu;
    KVT_OK_(kvt_pool_create(&pc, &gpu));
    kvt_offload_config oc;
    kvt_offload_config_init(&oc);
    oc.host_blocks = 8;
    kvt_offload *m;
    KVT_OK_(kvt_offload_create(&oc, gpu, &m));
    size_t len = 0;
    assert_int_equal(kvt_offload_prometheus(m, NULL, 0, &len), KVT_ENOSPC);
    char *buf = malloc(len + 1);
    KVT_OK_(kvt_offload_prometheus(m, buf, len + 1, &len));
    KVT_PROMTOOL_OK(buf);
    const char *types[] = {"kvt_offload_stats", "kvt_tier_stats"};
    for (int t = 0; t < 2; t++) {
        const kvt_field *f;
        uint32_t n;
        KVT_OK_(kvt_describe(types[t], &f, &n));
        for (uint32_t i = 0; i < n; i++) {
            if (!f[i].metric[0] || strncmp(f[i].name, "disk_", 5) == 0 ||
                !strncmp(f[i].name, "promotion", 9))
                continue;
            char want[160];
            snprintf(want, sizeof(want), "# TYPE %s %s", f[i].metric,
                     f[i].kind == KVT_FIELD_GAUGE ? "gauge" : "counter");
            if (!strstr(buf, want))
                fail_msg("%s.%s: \"%s\" not in the exposition", types[t], f[i].name, want);
        }
    }
    free(buf);
    kvt_offload_destroy(m);
    kvt_pool_destroy(gpu);
}

/* ---- configuration structs ------------------------------------------------------------- */

static uint64_t cfg_get(const void *cfg, const kvt_config_field *f)
{
    const char *p = (const char *)cfg + f->offset;
    if (f->size == 1)
        return *(const uint8_t *)p;
    if (f->size == 4)
        return f->type == KVT_CONFIG_INT ? (uint64_t)(int64_t) * (const int32_t *)p
                                         : *(const uint32_t *)p;
    return *(const uint64_t *)p;
}

static void cfg_put(void *cfg, const kvt_config_field *f, uint64_t v)
{
    char *p = (char *)cfg + f->offset;
    if (f->size == 1)
        *(uint8_t *)p = (uint8_t)v;
    else if (f->size == 4)
        *(uint32_t *)p = (uint32_t)v;
    else
        *(uint64_t *)p = v;
}

/* a create of the struct type from cfg; what a successful one made is destroyed */
typedef int (*try_create_fn)(const void *cfg);

static kvt_pool *g_gpu;
static kvt_layout *g_layout;
static kvt_mirror *g_mirror;
static char g_dir[] = "/tmp/kvt-describe-XXXXXX";
static uint8_t g_dev[4][4096];

static int try_offload(const void *cfg)
{
    kvt_offload *m = NULL;
    int rc = kvt_offload_create(cfg, g_gpu, &m);
    kvt_offload_destroy(m);
    return rc;
}

static int try_copy(const void *cfg)
{
    kvt_copy *c = NULL;
    int rc = kvt_copy_create(cfg, g_layout, g_mirror, &c);
    kvt_copy_destroy(c);
    return rc;
}

static int try_disk(const void *cfg)
{
    kvt_disk *d = NULL;
    int rc = kvt_disk_create(cfg, g_layout, &d);
    kvt_disk_destroy(d);
    return rc;
}

static int try_node(const void *cfg)
{
    kvt_node *n = NULL;
    int rc = kvt_node_attach(cfg, &n);
    if (n) {
        kvt_node_detach(n);
        kvt_node_unlink(((const kvt_node_config *)cfg)->name);
    }
    return rc;
}

static void rigs_up(void)
{
    kvt_pool_config pc;
    kvt_pool_config_init(&pc);
    pc.num_blocks = 16;
    KVT_OK_(kvt_pool_create(&pc, &g_gpu));
    KVT_OK_(kvt_layout_create(KVT_HOST_DEVICE, 4, &g_layout));
    KVT_OK_(kvt_layout_add_region(g_layout, (uint64_t)(uintptr_t)g_dev, 4096));
    kvt_mirror_config mc;
    kvt_mirror_config_init(&mc);
    mc.host_blocks = 4;
    KVT_OK_(kvt_mirror_create(&mc, g_layout, &g_mirror));
    assert_non_null(mkdtemp(g_dir));
}

static void rigs_down(void)
{
    kvt_mirror_destroy(g_mirror);
    kvt_layout_destroy(g_layout);
    kvt_pool_destroy(g_gpu);
    rmdir(g_dir);
}

/* The rows cover the struct, config_init sets each row's default, a create from the defaults
 * (plus what `ready` sets: the required fields) succeeds, and every bound is enforced: one
 * below the minimum and one above the maximum fail naming the field, as does reserved room
 * that is not zero. */
static void config_rows_hold(const char *type, size_t size, void (*init)(void *),
                             void (*ready)(void *), try_create_fn try_create)
{
    const kvt_config_field *f;
    uint32_t n;
    KVT_OK_(kvt_describe_config(type, &f, &n));
    assert_int_equal(kvt_sizeof(type), size);
    void *def = malloc(size), *cfg = malloc(size);
    assert_non_null(def);
    assert_non_null(cfg);
    memset(def, 0xa5, size); /* init must set every byte the rows cover */
    init(def);
    size_t at = 0;
    for (uint32_t i = 0; i < n; i++) {
        size_t align = f[i].type == KVT_CONFIG_ROOM    ? 8
                       : f[i].type == KVT_CONFIG_BYTES ? 1
                                                       : f[i].size;
        size_t want = (at + align - 1) / align * align;
        if (f[i].offset != want)
            fail_msg("%s: row %u (%s) at offset %u, the previous ends at %zu: a field is missing "
                     "from the rows, or out of order",
                     type, i, f[i].name, f[i].offset, at);
        assert_true(f[i].help && f[i].help[0]);
        at = f[i].offset + (size_t)f[i].size;
        if (f[i].type > KVT_CONFIG_BOOL) /* a string, bytes, room: no default but zero */
            continue;
        if (cfg_get(def, &f[i]) != f[i].def)
            fail_msg("%s.%s: config_init set %llu, the row says %llu", type, f[i].name,
                     (unsigned long long)cfg_get(def, &f[i]), (unsigned long long)f[i].def);
    }
    assert_int_equal(at, size);
    ready(def);
    KVT_OK_(try_create(def));
    for (uint32_t i = 0; i < n; i++) {
        const kvt_config_field *r = &f[i];
        if (r->type == KVT_CONFIG_STRING || r->type == KVT_CONFIG_BYTES)
            continue;
        uint64_t bad[2];
        int nbad = 0;
        if (r->type == KVT_CONFIG_ROOM) {
            bad[nbad++] = 1;
        } else {
            bool sign = r->type == KVT_CONFIG_INT;
            uint64_t top = r->size == 4 ? (sign ? INT32_MAX : UINT32_MAX) : UINT64_MAX;
            if (sign ? (int64_t)r->min > INT32_MIN : r->min > 0)
                bad[nbad++] = r->min - 1;
            if (r->type != KVT_CONFIG_BOOL && r->max < top)
                bad[nbad++] = r->max + 1;
        }
        for (int k = 0; k < nbad; k++) {
            memcpy(cfg, def, size);
            cfg_put(cfg, r, bad[k]);
            if (try_create(cfg) != KVT_EINVAL)
                fail_msg("%s.%s = %lld: created, outside the row's bounds", type, r->name,
                         (long long)bad[k]);
            const char *name = r->type == KVT_CONFIG_ROOM ? "reserved word" : r->name;
            if (!strstr(kvt_last_error(), name))
                fail_msg("%s.%s: the error \"%s\" does not name it", type, r->name,
                         kvt_last_error());
        }
    }
    free(cfg);
    free(def);
}

static void offload_init(void *c)
{
    kvt_offload_config_init(c);
}

static void offload_ready(void *c)
{
    ((kvt_offload_config *)c)->host_blocks = 8;
}

static void copy_init(void *c)
{
    kvt_copy_config_init(c);
}

static void copy_ready(void *c)
{
    ((kvt_copy_config *)c)->threads = 1;
}

static void disk_init(void *c)
{
    kvt_disk_config_init(c);
}

static void disk_ready(void *c)
{
    kvt_disk_config *d = c;
    d->path = g_dir;
    d->capacity_bytes = 4 * 4096;
    d->page_cache = true; /* tmpfs has no O_DIRECT */
}

static void node_init(void *c)
{
    kvt_node_config_init(c);
}

static char g_node_name[48];

static void node_ready(void *c)
{
    kvt_node_config *n = c;
    snprintf(g_node_name, sizeof(g_node_name), "kvt-describe-%d", (int)getpid());
    n->name = g_node_name;
    n->blocks_per_rank = 8;
}

static void test_config_rows_are_the_defaults_and_the_bounds(void **state)
{
    (void)state;
    rigs_up();
    config_rows_hold("kvt_offload_config", sizeof(kvt_offload_config), offload_init, offload_ready,
                     try_offload);
    config_rows_hold("kvt_copy_config", sizeof(kvt_copy_config), copy_init, copy_ready, try_copy);
    config_rows_hold("kvt_disk_config", sizeof(kvt_disk_config), disk_init, disk_ready, try_disk);
    config_rows_hold("kvt_node_config", sizeof(kvt_node_config), node_init, node_ready, try_node);
    rigs_down();
    const kvt_config_field *f = (const kvt_config_field *)1;
    uint32_t n = 3;
    KVT_ERR_(kvt_describe_config("kvt_offload_stats", &f, &n), KVT_ENOENT);
    assert_null(f);
    assert_int_equal(n, 0);
    KVT_ERR_(kvt_describe_config(NULL, &f, &n), KVT_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_describes_the_stats_structs),
        cmocka_unit_test(test_unknown_struct_is_refused),
        cmocka_unit_test(test_families_are_exposed),
        cmocka_unit_test(test_config_rows_are_the_defaults_and_the_bounds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
