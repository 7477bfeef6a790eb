/* SPDX-License-Identifier: Apache-2.0 */
/* A program outside the tree, built against an installed kvtier (tests/install/run.sh). */
#include <kvtier/kvtier.h>
#include <stdio.h>

int main(void)
{
    kvt_pool_config cfg;
    kvt_pool_config_init(&cfg);
    cfg.num_blocks = 64;
    kvt_pool *pool;
    if (kvt_pool_create(&cfg, &pool) != 0) {
        fprintf(stderr, "app: %s\n", kvt_last_error());
        return 1;
    }
    uint32_t ids[4];
    int rc = kvt_pool_alloc(pool, 4, ids);
    printf("kvtier %s: allocated 4 blocks (rc %d), %u free\n", kvt_version(), rc,
           kvt_pool_num_free(pool));
    kvt_pool_destroy(pool);
    return rc != 0 || kvt_strerror(KVT_EINVAL)[0] == 0;
}
