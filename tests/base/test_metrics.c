/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Prometheus output of several objects in one process: kvt_metrics_merge's rules (one HELP and
 * TYPE per family, labels added per source, conflicts refused, sizing), the latency histogram,
 * and the exposition of two ranks' copy engines and two consumer shards checked by promtool
 * (skipped, visibly, where promtool is missing) - with plain concatenation refused by it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/prom.h"
#include "kvt_test.h"

static char *merge(const kvt_metrics_source *src, size_t n)
{
    size_t need = 0;
    assert_int_equal(kvt_metrics_merge(src, n, NULL, 0, &need), KVT_ENOSPC);
    char *t = malloc(need + 1);
    assert_non_null(t);
    size_t got = 0;
    KVT_OK_(kvt_metrics_merge(src, n, t, need + 1, &got));
    assert_int_equal(got, need);
    assert_int_equal(strlen(t), got);
    return t;
}

static size_t count(const char *hay, const char *needle)
{
    size_t n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p++)
        n++;
    return n;
}

static const char A[] = "# HELP x_total Things.\n# TYPE x_total counter\nx_total 3\n"
                        "# HELP y Level.\n# TYPE y gauge\ny{direction=\"load\"} 1\n"
                        "y{direction=\"store\"} 2\n";

static void merge_groups_families_and_adds_labels(void **state)
{
    (void)state;
    kvt_metrics_source s[2] = {{A, strlen(A), "rank=\"0\""}, {A, strlen(A), "rank=\"1\""}};
    char *t = merge(s, 2);
    assert_int_equal(count(t, "# HELP x_total"), 1);
    assert_int_equal(count(t, "# TYPE y gauge"), 1);
    assert_non_null(strstr(t, "x_total{rank=\"0\"} 3\nx_total{rank=\"1\"} 3\n"));
    assert_non_null(strstr(t, "y{rank=\"1\",direction=\"store\"} 2\n"));
    /* every sample sits under its family's TYPE line: y's come after "# TYPE y" */
    assert_true(strstr(t, "y{rank=\"0\"") > strstr(t, "# TYPE y gauge"));
    free(t);
}

static void merge_refuses_what_would_be_invalid(void **state)
{
    (void)state;
    char buf[4096];
    size_t len;
    kvt_metrics_source same[2] = {{A, strlen(A), NULL}, {A, strlen(A), ""}};
    assert_int_equal(kvt_metrics_merge(same, 2, buf, sizeof(buf), &len), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "labels of its own"));
    static const char B[] = "# HELP x_total Things.\n# TYPE x_total gauge\nx_total 1\n";
    kvt_metrics_source clash[2] = {{A, strlen(A), "rank=\"0\""}, {B, strlen(B), "rank=\"1\""}};
    assert_int_equal(kvt_metrics_merge(clash, 2, buf, sizeof(buf), &len), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "is a counter in one source and a gauge"));
    static const char *const bad[] = {"rank",        "rank=0",      "1x=\"a\"",
                                      "rank=\"a\"b", "r=\"a\\\"\"", "rank=\"0\","};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        kvt_metrics_source s = {A, strlen(A), bad[i]};
        assert_int_equal(kvt_metrics_merge(&s, 1, buf, sizeof(buf), &len), KVT_EINVAL);
    }
    assert_int_equal(kvt_metrics_merge(NULL, 1, buf, sizeof(buf), &len), KVT_EINVAL);
    /* too small: ENOSPC and the size needed */
    kvt_metrics_source one = {A, strlen(A), "rank=\"0\""};
    assert_int_equal(kvt_metrics_merge(&one, 1, buf, 10, &len), KVT_ENOSPC);
    assert_true(len > 10);
}

static void histogram_is_cumulative(void **state)
{
    (void)state;
    kvi_hist h = {0};
    kvi_hist_observe(&h, 5000);        /* 5 us: first bucket */
    kvi_hist_observe(&h, 2000000);     /* 2 ms: le 0.005 */
    kvi_hist_observe(&h, 60ull * 1e9); /* 60 s: +Inf only */
    char buf[4096];
    kvi_prom p = {buf, sizeof(buf), 0};
    const char *dir[1] = {"load"};
    kvi_prom_hist(&p, "t", "lat_seconds", "Latency.", "direction", dir, &h, 1);
    size_t len;
    KVT_OK_(kvi_prom_finish(&p, &len, "test"));
    assert_non_null(strstr(buf, "# TYPE t_lat_seconds histogram\n"));
    assert_non_null(strstr(buf, "t_lat_seconds_bucket{direction=\"load\",le=\"1e-05\"} 1\n"));
    assert_non_null(strstr(buf, "t_lat_seconds_bucket{direction=\"load\",le=\"0.001\"} 1\n"));
    assert_non_null(strstr(buf, "t_lat_seconds_bucket{direction=\"load\",le=\"0.005\"} 2\n"));
    assert_non_null(strstr(buf, "t_lat_seconds_bucket{direction=\"load\",le=\"5\"} 2\n"));
    assert_non_null(strstr(buf, "t_lat_seconds_bucket{direction=\"load\",le=\"+Inf\"} 3\n"));
    assert_non_null(strstr(buf, "t_lat_seconds_count{direction=\"load\"} 3\n"));
    assert_non_null(strstr(buf, "t_lat_seconds_sum{direction=\"load\"} 60.002005000\n"));
}

/* ---- two ranks and two shards through promtool ---------------------------------------- */

#define BLOCKS 16
#define BPB    4096

typedef struct rank_rig {
    uint8_t *dev;
    kvt_layout *layout;
    kvt_mirror *mirror;
    kvt_copy *copy;
} rank_rig;

static void rank_up(rank_rig *r)
{
    r->dev = calloc(BLOCKS, BPB);
    assert_non_null(r->dev);
    KVT_OK_(kvt_layout_create(KVT_HOST_DEVICE, BLOCKS, &r->layout));
    KVT_OK_(kvt_layout_add_region(r->layout, (uint64_t)(uintptr_t)r->dev, BPB));
    kvt_mirror_config mc;
    kvt_mirror_config_init(&mc);
    mc.host_blocks = BLOCKS;
    KVT_OK_(kvt_mirror_create(&mc, r->layout, &r->mirror));
    kvt_copy_config cc;
    kvt_copy_config_init(&cc);
    cc.threads = 1;
    KVT_OK_(kvt_copy_create(&cc, r->layout, r->mirror, &r->copy));
    uint32_t src[2] = {0, 1}, dst[2] = {3, 4};
    KVT_OK_(kvt_copy_submit(r->copy, KVT_COPY_STORE, 0, src, dst, 2, NULL));
    KVT_OK_(kvt_copy_flush(r->copy));
    int64_t hwm = -1;
    KVT_OK_(kvt_copy_poll(r->copy, KVT_COPY_STORE, &hwm));
    assert_int_equal(hwm, 0);
}

static void rank_down(rank_rig *r)
{
    kvt_copy_destroy(r->copy);
    kvt_mirror_destroy(r->mirror);
    kvt_layout_destroy(r->layout);
    free(r->dev);
}

static char *text_of_copy(const kvt_copy *c)
{
    size_t n = 0;
    kvt_copy_prometheus(c, NULL, 0, &n);
    char *t = malloc(n + 1);
    assert_non_null(t);
    KVT_OK_(kvt_copy_prometheus(c, t, n + 1, &n));
    return t;
}

static char *text_of_shard(const kvt_ec_shard *sh)
{
    size_t n = 0;
    kvt_ec_shard_prometheus(sh, NULL, 0, &n);
    char *t = malloc(n + 1);
    assert_non_null(t);
    KVT_OK_(kvt_ec_shard_prometheus(sh, t, n + 1, &n));
    return t;
}

static void two_ranks_and_two_shards_pass_promtool(void **state)
{
    (void)state;
    if (system("command -v promtool > /dev/null 2>&1") != 0)
        KVT_SKIP("promtool is not installed (Debian package prometheus; scripts/install-deps)");
    rank_rig r[2];
    rank_up(&r[0]);
    rank_up(&r[1]);
    uint8_t *buf[2];
    kvt_ec_shard *sh[2];
    for (int k = 0; k < 2; k++) {
        buf[k] = calloc(1, 1 << 20);
        assert_non_null(buf[k]);
        kvt_ec_shard_config c;
        kvt_ec_shard_config_init(&c);
        c.base = buf[k];
        c.capacity = 1 << 20;
        KVT_OK_(kvt_ec_shard_create(&c, &sh[k]));
    }
    char *t[4] = {text_of_copy(r[0].copy), text_of_copy(r[1].copy), text_of_shard(sh[0]),
                  text_of_shard(sh[1])};
    assert_non_null(strstr(t[0], "# TYPE kvtier_copy_transfer_seconds histogram"));
    assert_non_null(strstr(t[0], "kvtier_copy_transfer_seconds_count{direction=\"store\"} 1\n"));
    kvt_metrics_source src[4] = {{t[0], strlen(t[0]), "rank=\"0\""},
                                 {t[1], strlen(t[1]), "rank=\"1\""},
                                 {t[2], strlen(t[2]), "shard=\"0\""},
                                 {t[3], strlen(t[3]), "shard=\"1\""}};
    char *all = merge(src, 4);
    assert_int_equal(kvt_test_promtool(all), 0);
    assert_non_null(strstr(all, "kvtier_copy_events_total{rank=\"1\",direction=\"store\"} 1\n"));
    /* the check can fail: what two objects' texts give when simply concatenated */
    size_t a = strlen(t[0]), b = strlen(t[1]);
    char *cat = malloc(a + b + 1);
    assert_non_null(cat);
    memcpy(cat, t[0], a);
    memcpy(cat + a, t[1], b + 1);
    assert_int_not_equal(kvt_test_promtool(cat), 0);
    free(cat);
    free(all);
    for (int k = 0; k < 4; k++)
        free(t[k]);
    for (int k = 0; k < 2; k++) {
        KVT_OK_(kvt_ec_shard_destroy(sh[k]));
        free(buf[k]);
        rank_down(&r[k]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(merge_groups_families_and_adds_labels),
        cmocka_unit_test(merge_refuses_what_would_be_invalid),
        cmocka_unit_test(histogram_is_cumulative),
        cmocka_unit_test(two_ranks_and_two_shards_pass_promtool),
    };
    return kvt_test_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
