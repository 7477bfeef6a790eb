/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvt_describe against the structs it describes: every field, in the header's order, each
 * where the compiler put it and as wide; nothing past the struct; the families it names are
 * the ones the exposition writes. A field added to the header without its row (or a row whose
 * field moved) fails here.
 */
#include "kvt_test.h"

#include <stddef.h>

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_describes_the_stats_structs),
        cmocka_unit_test(test_unknown_struct_is_refused),
        cmocka_unit_test(test_families_are_exposed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
