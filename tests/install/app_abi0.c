/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A program built against kvtier/offload.h as it stood at 3e4dc23 (tests/install/abi0), run
 * against this tree's library: its stats struct is 448 bytes, the library's is longer. It
 * reads them through the symbol it was built to call and checks what it knows: the figures
 * of one miss and one skipped lookup, and that nothing was written past its struct.
 */
#include <kvtier/offload.h>
#include <stdio.h>
#include <string.h>

#define CANARY 0xA5

static int fail(const char *what)
{
    fprintf(stderr, "app_abi0: %s: %s\n", what, kvt_last_error());
    return 1;
}

int main(void)
{
    _Static_assert(sizeof(kvt_offload_stats) == 448, "built against the 448-byte struct");
    kvt_pool_config pc;
    kvt_pool_config_init(&pc);
    pc.num_blocks = 64;
    kvt_pool *gpu;
    if (kvt_pool_create(&pc, &gpu) != 0)
        return fail("kvt_pool_create");
    kvt_offload_config oc;
    kvt_offload_config_init(&oc);
    oc.host_blocks = 32;
    kvt_offload *m;
    if (kvt_offload_create(&oc, gpu, &m) != 0)
        return fail("kvt_offload_create");
    uint8_t hashes[4 * 16];
    for (unsigned i = 0; i < sizeof(hashes); i++)
        hashes[i] = (uint8_t)(i * 37 + 11);
    uint32_t hit = 99;
    if (kvt_offload_match(m, "a", 1, hashes, 4, 64, 0, &hit) != 0 || hit != 0)
        return fail("kvt_offload_match");
    if (kvt_offload_match_flags(m, "b", 1, hashes, 4, 64, 0, KVT_MATCH_SKIP_PREFIX_CACHE, &hit))
        return fail("kvt_offload_match_flags");
    struct {
        kvt_offload_stats s;
        unsigned char after[64];
    } box;
    memset(&box, CANARY, sizeof(box));
    kvt_offload_get_stats(m, &box.s);
    for (unsigned i = 0; i < sizeof(box.after); i++)
        if (box.after[i] != CANARY) {
            fprintf(stderr, "app_abi0: the library wrote byte %u past the 448-byte stats\n", i);
            return 1;
        }
    const kvt_offload_stats *s = &box.s;
    /* one lookup of 4 hash blocks of 16 tokens, the last token always recomputed: 63 tokens
     * searched, all missed; one lookup skipped; 31 usable host blocks (the null one aside) */
    if (s->lookups != 1 || s->lookup_tokens != 63 || s->miss_tokens != 63 || s->hit_tokens != 0 ||
        s->lookups_skipped != 1 || s->host_blocks != 31 || s->remote_hit_blocks != 0 ||
        s->resets != 0 || s->disk_blocks != 0) {
        fprintf(stderr,
                "app_abi0: stats read wrong: lookups %llu lookup_tokens %llu miss_tokens %llu "
                "lookups_skipped %llu host_blocks %u\n",
                (unsigned long long)s->lookups, (unsigned long long)s->lookup_tokens,
                (unsigned long long)s->miss_tokens, (unsigned long long)s->lookups_skipped,
                s->host_blocks);
        return 1;
    }
    printf("app_abi0: a 3e4dc23 program read its 448-byte stats correctly\n");
    kvt_offload_destroy(m);
    kvt_pool_destroy(gpu);
    return 0;
}
