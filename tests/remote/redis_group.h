/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The remote tier's tests share one redis-server per test program (tools/common/
 * redis_server.h): started on a unix socket in a temporary directory by the cmocka group setup,
 * stopped and removed by its teardown. Without redis-server on PATH every case that needs it is
 * skipped, and says so (NEED_REDIS).
 */
#ifndef KVT_TEST_REDIS_GROUP_H
#define KVT_TEST_REDIS_GROUP_H

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "kvt_test.h"
#include "redis_server.h"
#include "kvtier/remote.h"

static char g_dir[64], g_sock[96];
static pid_t g_redis = -1;

static inline bool redis_start(void)
{
    g_redis = kvt_redis_start(g_dir, g_sock, NULL);
    return g_redis > 0;
}

static inline void redis_stop(void)
{
    kvt_redis_stop(g_redis, g_sock);
    g_redis = -1;
}

static inline int group_setup(void **state)
{
    (void)state;
    snprintf(g_dir, sizeof(g_dir), "/tmp/kvt-remote-XXXXXX");
    if (!mkdtemp(g_dir))
        return -1;
    snprintf(g_sock, sizeof(g_sock), "%s/redis.sock", g_dir);
    redis_start();
    return 0;
}

static inline int group_teardown(void **state)
{
    (void)state;
    redis_stop();
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* A remote tier config against the test's Redis: instance `name` of `space`, serving on
 * loopback, short liveness (300 ms) and reconnect (100 ms) times for the tests' restarts. */
static inline void test_remote_config(kvt_remote_config *c, const char *space, const char *name,
                                      const char *cred)
{
    kvt_remote_config_init(c);
    c->directory = g_sock;
    c->space = space;
    c->instance = name;
    c->listen_host = "127.0.0.1";
    c->credential = cred;
    c->ttl_ms = 300;
    c->retry_ms = 100;
}

#define NEED_REDIS()                                                                               \
    do {                                                                                           \
        if (g_redis <= 0)                                                                          \
            KVT_SKIP("redis-server could not be started (scripts/install-deps installs it)");      \
    } while (0)

#endif
