/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Randomized model-based test of the offload manager on hybrid models (spec §2.14).
 *
 * Every episode draws a configuration: a full-attention group (16 or 32 tokens per block),
 * and, each by chance, a sliding-window group, a Mamba group (all mode, or align mode: its
 * states handed over by the engine at every boundary it computed) and a group that is
 * not prefix-cacheable (scratch or ring, of any block size). A small vLLM-like engine runs
 * requests with shared prefixes over one GPU pool: a GPU prefix hit, a host-tier hit that is
 * loaded, a prefill step, decode steps. As vLLM does, it frees and nulls the window group's
 * blocks that fall behind the window and all but the last state of the Mamba group (they stay
 * cached in the GPU pool until reused), and gives its calls the requests' hashes, so the
 * manager can recover nulled entries; half the episodes the manager reaches the pool only
 * through the engine-pool callbacks (touch, free, lookup, lru_scan), as vLLM's connector; a
 * third of the episodes store lazily (the window at the head of the GPU free queue). One simulated
 * worker executes each step's events at the start of the next step (the engine allocates and frees
 * in between) and reports them then.
 *
 * Block contents are tags derived from a block's key (hash, group). After every step:
 *   - no null block travels in a store or a load;
 *   - no block the engine allocates is one a transfer still uses;
 *   - every host block the manager lets be found holds the contents of exactly the key it is
 *     found under (the key of the GPU block it was copied from), and every GPU block that
 *     carries a key holds that key's contents (loads brought the right bytes);
 * and at the end of an episode, after draining, a clone of every finished prompt gets from
 * the host tier at least the hit the GPU pool itself offered when the prompt finished (the
 * longest hit the rules allow with what was computed: nulled window entries included).
 *
 * Every request gets an event context. Every stored event that names one is a block of that
 * request: its hash is the request's hash where the block ends, its parent the one where the
 * block before ends, its kind and window its group's; each context ends exactly once, after
 * its request finished, with no event naming it afterwards, and after draining all have.
 *
 * A quarter of the configurations are those of partial hash hits (full attention and a Mamba
 * align group of two hash blocks, spec §2.14; half of them under decode context parallelism of
 * two ranks, with attention blocks of two or four hash blocks and Mamba blocks of one or two,
 * issue 37): requests end at hash-block boundaries, where the
 * engine caches the partly filled attention block and hands over the state; a third of the
 * arrivals continue a finished request's text, so hits end inside blocks; a load that ends
 * there must bring the KV up to its end (a Mamba state exactly at its end), and the clone check
 * compares with the GPU pool's own partial hit.
 *
 * The host tier is large enough never to evict within an episode, so the last check is
 * exact; it is an eager-mode rule (lazy stores only what nears eviction), checked there only.
 * KVTIER_TEST_SCALE multiplies the episodes; the seed is printed on failure (KVTIER_TEST_SEED
 * replays it).
 */
#include "kvt_test.h"
#include "offload/pool_scan.h"

#define HBS      16u  /* hash block size */
#define MAXTOK   320u /* tokens of the longest request */
#define MAXH     (MAXTOK / HBS)
#define MAXB     MAXH /* blocks per group at 16 tokens */
#define NREQ     6u   /* running at once */
#define MAX_FIN  48u  /* requests per episode */
#define GPU_NB   400u
#define HOST_NB  4096u /* two tiers: never evicts within an episode */
#define DISK_NB  4096u /* three tiers: a host tier of 48..303 blocks in front of this */
#define HL       KVT_BLOCK_HASH_LEN
#define MAX_PAIR 4096u

static uint64_t g_seed, g_step;

#define CHECK(cond, ...) KVT_MODEL_CHECK("hybrid model", "step", g_step, g_seed, cond, __VA_ARGS__)

#define CALL(expr)                                                                                 \
    do {                                                                                           \
        int rc_ = (expr);                                                                          \
        CHECK(rc_ >= 0, "%s -> %s: %s", #expr, kvt_err_name(rc_), kvt_last_error());               \
    } while (0)

struct req {
    bool used, loading;
    uint32_t ctx; /* index in S.ctx */
    char id[16];
    uint32_t id_len;
    uint32_t n_tokens, max_tokens, computed, gpu_hit;
    uint32_t tokens[MAXTOK];
    uint8_t hashes[MAXH * HL];
    uint32_t n_hashes;
    uint32_t tab[KVT_MAX_GROUPS][MAXB], nb[KVT_MAX_GROUPS];
};

struct fin { /* a finished prompt, for the clone check */
    uint32_t n_tokens, n_hashes, ref_hit;
    uint8_t hashes[MAXH * HL];
    uint32_t tokens[MAXTOK];
};

struct pair {
    uint32_t gpu, host;
};

struct ctxrec { /* an event context: its request's hashes as they grow */
    uint8_t hashes[MAXH * HL];
    uint32_t n_hashes;
    bool finished, done;
};

static struct {
    uint64_t rng;
    bool ext;     /* the manager reaches the GPU pool only through kvt_gpu_pool_ops */
    bool lazy;    /* lazy stores: no request context, no clone check */
    bool partial; /* partial hash hits: hits end at hash-block boundaries */
    kvt_pool_config pc;
    uint32_t ng, sched_bs, align;
    kvt_pool *gpu;
    kvt_offload *m;
    const kvt_pool *host;
    struct req r[NREQ];
    uint32_t prefixes[3][MAXTOK];
    uint64_t gcont[GPU_NB], hcont[HOST_NB], dcont[DISK_NB];
    bool disk;                              /* three tiers this episode */
    const kvt_pool *dpool;                  /* the disk tier's index */
    struct pair wb[MAX_PAIR], pr[MAX_PAIR]; /* write-backs (host, disk), promotions (disk, host) */
    uint32_t n_wb, n_pr;
    int64_t wb_ev, pr_ev;
    uint64_t writebacks, promotions, disk_episodes, disk_clone_episodes;
    /* the events of the last build_meta, executed and reported at the next step */
    struct pair st[MAX_PAIR], ld[MAX_PAIR];
    uint32_t n_st, n_ld;
    int64_t st_ev;
    kvt_str ld_reqs[NREQ];
    char ld_ids[NREQ][16];
    uint32_t n_ld_reqs;
    uint8_t busy[GPU_NB]; /* GPU blocks a pending transfer uses */
    kvt_offload_meta meta;
    kvt_offload_worker_meta wm;
    struct fin fin[MAX_FIN];
    uint32_t n_fin, arrivals, next_id;
    struct ctxrec ctx[MAX_FIN];
    uint32_t n_ctx;
    uint64_t ctx_events;
    uint64_t recovered, loads, stores, clones, clone_tokens, ext_episodes, lazy_episodes;
    uint64_t lazy_stores, lazy_loads, handed;
    uint64_t partial_episodes, partial_hits, partial_tails, dcp_episodes;
} S;

/* ---- the engine's own pool, as kvt_gpu_pool_ops (half the episodes) ------------------- */

static void cb_touch(void *ctx, const uint32_t *ids, uint32_t n)
{
    (void)ctx;
    KVT_OK_(kvt_pool_touch(S.gpu, ids, n));
}

static void cb_free(void *ctx, const uint32_t *ids, uint32_t n)
{
    (void)ctx;
    KVT_OK_(kvt_pool_free(S.gpu, ids, n));
}

static uint32_t cb_lru_scan(void *ctx, uint32_t cap, uint32_t *ids, kvt_pool_key *keys)
{
    (void)ctx;
    return kvt_test_lru_scan(S.gpu, cap, ids, keys);
}

static uint32_t cb_lookup(void *ctx, const uint8_t *hash, uint32_t group, uint32_t *ref)
{
    (void)ctx;
    uint32_t b;
    *ref = 0;
    if (kvt_pool_lookup(S.gpu, hash, group, &b) != 1)
        return KVT_BLOCK_NONE;
    kvt_block_info bi;
    KVT_OK_(kvt_pool_block_info(S.gpu, b, &bi));
    *ref = bi.ref_cnt;
    return b;
}

static uint32_t below(uint32_t n)
{
    return kvt_test_below(&S.rng, n);
}

static bool cacheable(uint32_t g)
{
    return kvt_group_kind_cacheable(S.pc.groups[g].kind);
}

static uint64_t tag_of(const uint8_t *hash, uint32_t g)
{
    uint64_t v;
    memcpy(&v, hash, sizeof(v));
    return (v ^ ((uint64_t)(g + 1) * 0x9E3779B97F4A7C15ull)) | 1; /* never 0 (0: no contents) */
}

/* The key block j of group g is stored under: the hash at its last hash-block boundary. */
static const uint8_t *key_hash(const struct req *q, uint32_t g, uint32_t j)
{
    uint32_t step = S.pc.groups[g].block_size / HBS;
    return q->hashes + ((size_t)(j + 1) * step - 1) * HL;
}

/* Set when the random episodes happened not to exercise partial hash hits (hits and stored
 * partial tails): the extra episodes then draw that configuration every time. */
static bool g_force_partial;

static void configure(void)
{
    kvt_pool_config *c = &S.pc;
    kvt_pool_config_init(c);
    c->num_blocks = GPU_NB;
    c->hash_block_size = HBS;
    uint32_t n = 0;
    c->groups[n++] = (kvt_group_spec){KVT_GROUP_FULL, HBS * (1 + below(2)), 0};
    if (g_force_partial || below(4) == 0) { /* the groups of partial hash hits: Mamba align
                                               wider than a hash */
        if (below(2)) { /* decode context parallelism over 2 ranks: the attention block is
                           the effective one, and a Mamba block of one hash is enough */
            c->dcp_world_size = 2;
            c->groups[0].block_size *= 2;
            c->groups[n++] = (kvt_group_spec){KVT_GROUP_MAMBA_ALIGN, HBS * (1 + below(2)), 0};
            S.dcp_episodes++;
        } else {
            c->groups[n++] = (kvt_group_spec){KVT_GROUP_MAMBA_ALIGN, 2 * HBS, 0};
        }
    } else {
        if (below(10) < 7)
            c->groups[n++] =
                (kvt_group_spec){KVT_GROUP_SLIDING, HBS * (1 + below(2)), 8 + below(96)};
        if (below(2))
            c->groups[n++] = (kvt_group_spec){below(2) ? KVT_GROUP_MAMBA : KVT_GROUP_MAMBA_ALIGN,
                                              HBS * (1 + below(2)), 0};
    }
    if (below(10) < 7)
        c->groups[n++] =
            (kvt_group_spec){below(2) ? KVT_GROUP_SCRATCH : KVT_GROUP_RING, 1 + below(40), 0};
    for (uint32_t i = n; i-- > 1;) { /* any order of the groups */
        uint32_t k = below(i + 1);
        kvt_group_spec t = c->groups[i];
        c->groups[i] = c->groups[k];
        c->groups[k] = t;
    }
    c->n_groups = S.ng = n;
    KVT_OK_(kvt_pool_config_validate(c, &S.sched_bs));
}

static void start_episode(void)
{
    memset(S.r, 0, sizeof(S.r));
    memset(S.gcont, 0, sizeof(S.gcont));
    memset(S.hcont, 0, sizeof(S.hcont));
    memset(S.dcont, 0, sizeof(S.dcont));
    S.n_wb = S.n_pr = 0;
    S.wb_ev = S.pr_ev = KVT_NO_EVENT;
    memset(S.busy, 0, sizeof(S.busy));
    S.n_st = S.n_ld = S.n_ld_reqs = S.n_fin = S.arrivals = S.n_ctx = 0;
    S.st_ev = KVT_NO_EVENT;
    configure();
    KVT_OK_(kvt_pool_create(&S.pc, &S.gpu));
    kvt_offload_config oc;
    kvt_offload_config_init(&oc);
    oc.host_blocks = HOST_NB;
    S.disk = below(3) == 0; /* three tiers: a small host tier, a disk tier behind it */
    if (S.disk) {
        oc.host_blocks = 48 + below(256);
        oc.disk_blocks = DISK_NB;
        S.disk_episodes++;
    }
    oc.max_model_len = MAXTOK;
    oc.max_requests = 64;
    oc.event_capacity = 1u << 16; /* never full within an episode */
    /* lazy with a host tier smaller than the GPU's cached blocks stores for ever: every block
     * the window reaches is stored, evicting one the rotation brings back later */
    S.lazy = !S.disk && below(2) == 0;
    oc.lazy = S.lazy;
    oc.max_batched_tokens = 64 + 16 * below(8);
    oc.max_num_seqs = below(2) ? NREQ : 0;
    S.lazy_episodes += S.lazy;
    S.ext = below(2);
    if (S.ext) { /* as vLLM's connector: touch, free, lookup (the recovery), lru_scan (lazy) */
        kvt_gpu_pool_ops ops = {cb_touch, cb_free, cb_lru_scan, cb_lookup};
        KVT_OK_(kvt_offload_create_ext(&oc, &S.pc, &ops, NULL, &S.m));
        S.ext_episodes++;
    } else {
        KVT_OK_(kvt_offload_create(&oc, S.gpu, &S.m));
    }
    S.host = kvt_offload_host_pool(S.m);
    S.align = kvt_offload_hit_alignment(S.m);
    S.partial = S.align < S.sched_bs;
    S.partial_episodes += S.partial;
    S.dpool = kvt_offload_disk_pool(S.m);
    for (uint32_t p = 0; p < 3; p++)
        for (uint32_t t = 0; t < MAXTOK; t++)
            S.prefixes[p][t] = 1 + p * 100000 + t;
}

static void end_episode(void)
{
    kvt_offload_destroy(S.m);
    kvt_pool_destroy(S.gpu);
}

static void rehash(struct req *q)
{
    KVT_OK_(
        kvt_hash_prompt(7, q->tokens, q->n_tokens, HBS, NULL, 0, q->hashes, MAXH, &q->n_hashes));
    if (q->used) { /* its event context follows */
        struct ctxrec *c = &S.ctx[q->ctx];
        memcpy(c->hashes, q->hashes, (size_t)q->n_hashes * HL);
        c->n_hashes = q->n_hashes;
    }
}

static uint32_t blocks_for(uint32_t g, uint32_t tokens)
{
    if (!cacheable(g))
        return 1; /* one scratch or ring block per request */
    uint32_t bs = S.pc.groups[g].block_size;
    return (tokens + bs - 1) / bs;
}

/* Allocation by the engine: never a block a pending transfer uses. */
static int engine_alloc(uint32_t n, uint32_t *out)
{
    if (kvt_pool_num_free(S.gpu) < n)
        return -1;
    KVT_OK_(kvt_pool_alloc(S.gpu, n, out));
    for (uint32_t i = 0; i < n; i++) {
        CHECK(!S.busy[out[i]], "the engine was handed GPU block %u, which a transfer still uses",
              out[i]);
        S.gcont[out[i]] = 0; /* new owner: nothing computed yet */
    }
    return 0;
}

static const uint32_t *const *tables(struct req *q, const uint32_t **t)
{
    for (uint32_t g = 0; g < S.ng; g++)
        t[g] = q->tab[g];
    return t;
}

static void arrive(struct req *q)
{
    memset(q, 0, sizeof(*q));
    q->id_len = (uint32_t)snprintf(q->id, sizeof(q->id), "r%u", S.next_id++);
    uint32_t shared = below(2) ? HBS * below(12) + below(HBS) : 0;
    q->n_tokens = 17 + below(220);
    if (shared > q->n_tokens)
        shared = q->n_tokens;
    const uint32_t *pre = S.prefixes[below(3)];
    if (S.partial && S.n_fin && below(3) == 0) {
        /* a follow-up of a finished request: its whole text, and more (partial hash hits
         * come from where a request ended, inside a block) */
        const struct fin *f = &S.fin[below(S.n_fin)];
        pre = f->tokens;
        shared = f->n_tokens;
        q->n_tokens = shared + 1 + below(40);
        if (q->n_tokens > MAXTOK - 40)
            q->n_tokens = MAXTOK - 40;
        if (shared > q->n_tokens)
            shared = q->n_tokens;
    }
    for (uint32_t t = 0; t < q->n_tokens; t++)
        q->tokens[t] = t < shared ? pre[t] : 500000 + (uint32_t)kvt_test_rand(&S.rng) % 400000;
    q->max_tokens = q->n_tokens + below(40);
    if (S.partial) /* it ends at a hash-block boundary: a partly filled last block to store */
        q->max_tokens = (q->max_tokens + HBS - 1) / HBS * HBS;
    if (q->max_tokens > MAXTOK)
        q->max_tokens = MAXTOK;
    rehash(q);
    uint32_t need = 0;
    for (uint32_t g = 0; g < S.ng; g++)
        need += blocks_for(g, q->max_tokens);
    if (kvt_pool_num_free(S.gpu) < need + 8)
        return; /* the engine keeps it waiting */
    uint32_t out[KVT_MAX_GROUPS][MAXB], *outs[KVT_MAX_GROUPS];
    for (uint32_t g = 0; g < S.ng; g++)
        outs[g] = out[g];
    kvt_hit gh;
    KVT_OK_(kvt_pool_find_longest_hit(S.gpu, q->hashes, q->n_hashes, q->n_tokens - 1, outs, &gh));
    /* every group's hit blocks are touched before any group allocates: a cached block of one
     * group's hit must not be handed out as another group's new block */
    for (uint32_t g = 0; g < S.ng; g++)
        for (uint32_t j = 0; j < gh.n_blocks[g]; j++) {
            q->tab[g][j] = out[g][j];
            if (out[g][j] != KVT_NULL_BLOCK)
                KVT_OK_(kvt_pool_touch(S.gpu, &out[g][j], 1));
        }
    for (uint32_t g = 0; g < S.ng; g++) {
        q->nb[g] = gh.n_blocks[g];
        uint32_t want = blocks_for(g, q->n_tokens);
        CHECK(engine_alloc(want - q->nb[g], q->tab[g] + q->nb[g]) == 0, "GPU pool sizing");
        q->nb[g] = want;
    }
    q->used = true;
    q->gpu_hit = gh.length;
    uint32_t hit;
    CALL(kvt_offload_match(S.m, q->id, q->id_len, q->hashes, q->n_hashes, q->n_tokens, gh.length,
                           &hit));
    CHECK(hit % S.align == 0 && gh.length + hit < q->n_tokens, "hit %u + %u of %u tokens", hit,
          gh.length, q->n_tokens);
    S.partial_hits += hit % S.sched_bs != 0;
    const uint32_t *t[KVT_MAX_GROUPS];
    CALL(kvt_offload_after_alloc(S.m, q->id, q->id_len, tables(q, t), q->nb, hit));
    CHECK(S.n_ctx < MAX_FIN, "more contexts than arrivals");
    q->ctx = S.n_ctx++;
    memset(&S.ctx[q->ctx], 0, sizeof(S.ctx[q->ctx]));
    rehash(q);
    int rc = kvt_offload_set_request_context(S.m, q->id, q->id_len, q->ctx + 1);
    CHECK(rc == !S.lazy, "set_request_context -> %d (lazy stores carry no context)", rc);
    S.ctx[q->ctx].done = S.lazy; /* nothing will end it */
    q->computed = gh.length + hit;
    q->loading = hit > 0;
    S.arrivals++;
}

/* Keys of the blocks q's computed tokens completed (cacheable groups, non-null blocks),
 * contents first; loaded blocks must already hold theirs. */
static void register_keys(struct req *q, uint32_t from_tokens, bool loaded)
{
    for (uint32_t g = 0; g < S.ng; g++) {
        if (!cacheable(g))
            continue;
        uint32_t bs = S.pc.groups[g].block_size;
        for (uint32_t j = from_tokens / bs; j < q->computed / bs && j < q->nb[g]; j++) {
            uint32_t b = q->tab[g][j];
            if (b == KVT_NULL_BLOCK)
                continue;
            uint64_t tag = tag_of(key_hash(q, g, j), g);
            kvt_block_info bi;
            KVT_OK_(kvt_pool_block_info(S.gpu, b, &bi));
            if (bi.n_keys) /* a GPU hit: cached already, under this key */
                continue;
            if (loaded)
                CHECK(S.gcont[b] == tag,
                      "GPU block %u (group %u of kind %u, position %u; GPU hit %u, computed %u) "
                      "was loaded with the wrong contents",
                      b, g, S.pc.groups[g].kind, j, q->gpu_hit, q->computed);
            S.gcont[b] = tag;
            KVT_OK_(kvt_pool_insert(S.gpu, b, key_hash(q, g, j), g, bs));
        }
    }
}

/* A partial hash hit ends inside a block: a full-attention group's block there holds the KV
 * up to the hit's end at least (a partly filled block stored under the hash there, or a whole
 * one), a Mamba align group's block there the state at exactly the hit's end. */
static void check_partial_load(struct req *q)
{
    const uint8_t *at_end = q->hashes + (size_t)(q->computed / HBS - 1) * HL;
    for (uint32_t g = 0; g < S.ng; g++) {
        uint32_t bs = S.pc.groups[g].block_size, j = q->computed / bs;
        if (!cacheable(g) || q->computed % bs == 0 || q->computed <= q->gpu_hit)
            continue;
        uint32_t b = q->tab[g][j];
        uint64_t part = tag_of(at_end, g), whole = 0;
        if ((j + 1) * (bs / HBS) <= q->n_hashes)
            whole = tag_of(key_hash(q, g, j), g);
        CHECK(S.gcont[b] == part || (S.pc.groups[g].kind == KVT_GROUP_FULL && S.gcont[b] == whole),
              "GPU block %u (group %u of kind %u, position %u) was loaded for a partial hit of "
              "%u tokens with the wrong contents",
              b, g, S.pc.groups[g].kind, j, q->computed);
    }
}

/* As vLLM: the window group's blocks behind the window, and all but the last state of a Mamba
 * group, are freed and nulled in the table (they stay cached until reused). */
static void drop_behind(struct req *q)
{
    for (uint32_t g = 0; g < S.ng; g++) {
        const kvt_group_spec *s = &S.pc.groups[g];
        if (s->kind != KVT_GROUP_SLIDING && s->kind != KVT_GROUP_MAMBA &&
            s->kind != KVT_GROUP_MAMBA_ALIGN)
            continue;
        /* the last state is in the block of the last computed token */
        uint32_t bs = s->block_size, last = (q->computed + bs - 1) / bs;
        for (uint32_t j = 0; j < q->nb[g]; j++) {
            /* a window of w tokens at position p needs tokens p - w + 1 .. p: block j is
             * behind once its last token is before that */
            bool behind = s->kind == KVT_GROUP_SLIDING
                              ? (j + 1) * bs + s->sliding_window - 1 <= q->computed
                              : j + 1 < last;
            if (behind && q->tab[g][j] != KVT_NULL_BLOCK) {
                KVT_OK_(kvt_pool_free(S.gpu, &q->tab[g][j], 1));
                q->tab[g][j] = KVT_NULL_BLOCK;
            }
        }
    }
}

/* Partial hash hits, at finish: the engine caches each full-attention group's partly filled
 * last block under the hash where its computed tokens end (with its token count), and hands
 * over the Mamba align state there. */
static void cache_partial_end(struct req *q)
{
    uint32_t end = q->computed / HBS * HBS;
    if (!S.partial || end == 0 || end > q->n_hashes * HBS)
        return;
    const uint8_t *h = q->hashes + (size_t)(end / HBS - 1) * HL;
    kvt_offload_boundary st[KVT_MAX_GROUPS];
    uint32_t n = 0;
    for (uint32_t g = 0; g < S.ng; g++) {
        uint32_t bs = S.pc.groups[g].block_size, j = end / bs, kind = S.pc.groups[g].kind;
        if (end % bs == 0 || j >= q->nb[g] || q->tab[g][j] == KVT_NULL_BLOCK ||
            (kind != KVT_GROUP_FULL && kind != KVT_GROUP_MAMBA_ALIGN))
            continue;
        uint32_t b = q->tab[g][j];
        kvt_block_info bi;
        KVT_OK_(kvt_pool_block_info(S.gpu, b, &bi));
        if (bi.n_keys)
            continue;
        S.gcont[b] = tag_of(h, g);
        KVT_OK_(kvt_pool_insert(S.gpu, b, h, g, end - j * bs));
        if (kind == KVT_GROUP_MAMBA_ALIGN)
            st[n++] = (kvt_offload_boundary){.req_id = q->id,
                                             .req_id_len = q->id_len,
                                             .group = g,
                                             .gpu_block = b,
                                             .num_tokens = end,
                                             .hash = h,
                                             .parent_hash = j ? key_hash(q, g, j - 1) : NULL};
    }
    int got = kvt_offload_boundary_states(S.m, st, n);
    CHECK(got >= 0, "boundary_states -> %d: %s", got, kvt_last_error());
    S.handed += (uint32_t)got;
}

static void finish(struct req *q)
{
    const uint32_t *t[KVT_MAX_GROUPS];
    cache_partial_end(q);
    CALL(kvt_offload_request_finished_hashed(S.m, q->id, q->id_len, tables(q, t), q->nb, q->hashes,
                                             q->n_hashes, q->computed));
    S.ctx[q->ctx].finished = true;
    if (S.n_fin < MAX_FIN && !q->loading) {
        /* what the GPU pool offers for this prompt now: the host tier must offer it too */
        struct fin *f = &S.fin[S.n_fin++];
        uint32_t out[KVT_MAX_GROUPS][MAXB], *outs[KVT_MAX_GROUPS];
        for (uint32_t g = 0; g < S.ng; g++)
            outs[g] = out[g];
        uint32_t len = q->computed < q->n_tokens ? q->computed : q->n_tokens;
        f->n_tokens = len;
        f->n_hashes = len / HBS;
        memcpy(f->hashes, q->hashes, (size_t)f->n_hashes * HL);
        memcpy(f->tokens, q->tokens, (size_t)len * sizeof(uint32_t));
        kvt_hit gh; /* with partial hash hits, the GPU pool's own partial hit */
        KVT_OK_(kvt_pool_find_longest_hit_flags(S.gpu, f->hashes, f->n_hashes, len - 1,
                                                S.partial ? KVT_HIT_PARTIAL : 0, outs, &gh));
        f->ref_hit = gh.length;
    }
    for (uint32_t g = 0; g < S.ng; g++)
        for (uint32_t j = q->nb[g]; j-- > 0;)
            if (q->tab[g][j] != KVT_NULL_BLOCK)
                KVT_OK_(kvt_pool_free(S.gpu, &q->tab[g][j], 1));
    q->used = false;
}

/* Mamba in align mode: the states q's computation from token `from` reached (block ends),
 * handed over while q still holds their blocks; the manager pins what it stores. */
static void hand_over(struct req *q, uint32_t from)
{
    kvt_offload_boundary b[KVT_MAX_GROUPS * MAXB];
    uint32_t n = 0;
    for (uint32_t g = 0; g < S.ng; g++) {
        if (S.pc.groups[g].kind != KVT_GROUP_MAMBA_ALIGN)
            continue;
        uint32_t bs = S.pc.groups[g].block_size;
        for (uint32_t j = from / bs; j < q->computed / bs && j < q->nb[g]; j++)
            if (q->tab[g][j] != KVT_NULL_BLOCK)
                b[n++] = (kvt_offload_boundary){.req_id = q->id,
                                                .req_id_len = q->id_len,
                                                .group = g,
                                                .gpu_block = q->tab[g][j],
                                                .num_tokens = (j + 1) * bs,
                                                .hash = key_hash(q, g, j),
                                                .parent_hash = j ? key_hash(q, g, j - 1) : NULL};
    }
    int got = kvt_offload_boundary_states(S.m, b, n);
    CHECK(got >= 0 && (uint32_t)got <= n, "boundary_states -> %d: %s", got, kvt_last_error());
    S.handed += (uint32_t)got;
}

/* The worker: last step's events, executed and reported now. */
static void work(void)
{
    for (uint32_t i = 0; i < S.n_st; i++) {
        CHECK(S.gcont[S.st[i].gpu] != 0, "store from GPU block %u, which holds nothing",
              S.st[i].gpu);
        S.hcont[S.st[i].host] = S.gcont[S.st[i].gpu];
    }
    for (uint32_t i = 0; i < S.n_wb; i++) { /* write-backs: their host blocks are stored */
        CHECK(S.hcont[S.wb[i].gpu] != 0, "write-back from host block %u, which holds nothing",
              S.wb[i].gpu);
        S.dcont[S.wb[i].host] = S.hcont[S.wb[i].gpu];
    }
    for (uint32_t i = 0; i < S.n_pr; i++) { /* promotions: (disk slot, host block) */
        CHECK(S.dcont[S.pr[i].gpu] != 0, "promotion from disk slot %u, which holds nothing",
              S.pr[i].gpu);
        S.hcont[S.pr[i].host] = S.dcont[S.pr[i].gpu];
    }
    for (uint32_t i = 0; i < S.n_ld; i++) {
        CHECK(S.hcont[S.ld[i].host] != 0, "load from host block %u, which holds nothing",
              S.ld[i].host);
        S.gcont[S.ld[i].gpu] = S.hcont[S.ld[i].host];
    }
    memset(S.busy, 0, sizeof(S.busy));
    kvt_offload_worker_meta_clear(&S.wm);
    if (S.st_ev != KVT_NO_EVENT)
        KVT_OK_(kvt_offload_worker_meta_add(&S.wm, S.st_ev, 1));
    if (S.wb_ev != KVT_NO_EVENT)
        KVT_OK_(kvt_event_report_add(&S.wm.tier_stores[0], S.wb_ev, 1));
    if (S.pr_ev != KVT_NO_EVENT)
        KVT_OK_(kvt_event_report_add(&S.wm.tier_loads[0], S.pr_ev, 1));
    S.writebacks += S.n_wb;
    S.promotions += S.n_pr;
    S.n_wb = S.n_pr = 0;
    S.wb_ev = S.pr_ev = KVT_NO_EVENT;
    CALL(kvt_offload_apply_output(S.m, S.ld_reqs, S.n_ld_reqs, &S.wm));
    for (uint32_t k = 0; k < S.n_ld_reqs; k++)
        for (uint32_t i = 0; i < NREQ; i++) {
            struct req *q = &S.r[i];
            if (q->used && q->loading && q->id_len == S.ld_reqs[k].len &&
                memcmp(q->id, S.ld_reqs[k].ptr, q->id_len) == 0) {
                q->loading = false;
                drop_behind(q); /* positions a window or a state no longer needs: never loaded */
                register_keys(q, q->gpu_hit, true);
                check_partial_load(q);
            }
        }
    S.stores += S.n_st;
    S.loads += S.n_ld;
    S.lazy_stores += S.lazy ? S.n_st : 0;
    S.lazy_loads += S.lazy ? S.n_ld : 0;
    S.n_st = S.n_ld = S.n_ld_reqs = 0;
    S.st_ev = KVT_NO_EVENT;
}

/* This step's events, for the worker to execute at the next. */
static void take_events(void)
{
    const kvt_offload_meta *m = &S.meta;
    CHECK(m->n_stores <= MAX_PAIR && m->n_loads <= MAX_PAIR, "too many pairs");
    for (uint32_t i = 0; i < m->n_stores; i++) {
        uint32_t gpu = m->store_gpu_blocks[i], host = m->store_cpu_blocks[i];
        CHECK(gpu != KVT_NULL_BLOCK && host != KVT_NULL_BLOCK && gpu < GPU_NB && host < HOST_NB,
              "store pair %u -> %u", gpu, host);
        S.st[S.n_st++] = (struct pair){gpu, host};
        S.busy[gpu] = 1;
    }
    S.st_ev = m->store_event;
    const kvt_tier_xfers *d = &m->tiers[0];
    CHECK(d->n_stores <= MAX_PAIR && d->n_loads <= MAX_PAIR, "too many disk pairs");
    for (uint32_t i = 0; i < d->n_stores; i++) {
        CHECK(S.disk && d->store_src[i] != KVT_NULL_BLOCK && d->store_dst[i] != KVT_NULL_BLOCK &&
                  d->store_src[i] < HOST_NB && d->store_dst[i] < DISK_NB,
              "write-back pair %u -> %u", d->store_src[i], d->store_dst[i]);
        S.wb[S.n_wb++] = (struct pair){d->store_src[i], d->store_dst[i]};
    }
    for (uint32_t i = 0; i < d->n_loads; i++) {
        CHECK(S.disk && d->load_src[i] != KVT_NULL_BLOCK && d->load_dst[i] != KVT_NULL_BLOCK &&
                  d->load_src[i] < DISK_NB && d->load_dst[i] < HOST_NB,
              "promotion pair %u -> %u", d->load_src[i], d->load_dst[i]);
        S.pr[S.n_pr++] = (struct pair){d->load_src[i], d->load_dst[i]};
    }
    S.wb_ev = d->store_event;
    S.pr_ev = d->load_event;
    for (uint32_t i = 0; i < m->n_loads; i++) {
        uint32_t gpu = m->load_gpu_blocks[i], host = m->load_cpu_blocks[i];
        CHECK(gpu != KVT_NULL_BLOCK && host != KVT_NULL_BLOCK && gpu < GPU_NB && host < HOST_NB,
              "load pair %u -> %u", host, gpu);
        S.ld[S.n_ld++] = (struct pair){gpu, host};
        S.busy[gpu] = 1;
    }
    for (uint32_t e = 0; e < m->n_load_events; e++)
        if (m->load_events[e] == m->load_event)
            for (uint32_t k = m->load_req_first[e]; k < m->load_req_first[e + 1]; k++) {
                CHECK(S.n_ld_reqs < NREQ, "more loading requests than running ones");
                kvt_str id = m->load_req_ids[k];
                memcpy(S.ld_ids[S.n_ld_reqs], id.ptr, id.len);
                S.ld_reqs[S.n_ld_reqs] = (kvt_str){S.ld_ids[S.n_ld_reqs], id.len};
                S.n_ld_reqs++;
            }
}

/* The manager's cache events since the last step: stored events that name a context are
 * blocks of its request, and each context ends once, after its request finished. */
static void check_cache_events(void)
{
    kvt_offload_event ev[256];
    uint64_t dropped;
    uint32_t n;
    do {
        n = kvt_offload_take_events(S.m, ev, 256, &dropped);
        CHECK(dropped == 0, "%llu cache events dropped", (unsigned long long)dropped);
        for (uint32_t i = 0; i < n; i++) {
            const kvt_offload_event *e = &ev[i];
            if (e->type != KVT_OFFLOAD_EV_STORED && e->type != KVT_OFFLOAD_EV_CONTEXT_DONE)
                continue;
            if (!e->ctx)
                continue;
            CHECK(e->ctx <= S.n_ctx, "an event names context %llu, never given",
                  (unsigned long long)e->ctx);
            struct ctxrec *c = &S.ctx[e->ctx - 1];
            CHECK(!c->done, "an event (type %u) names context %llu after it ended", e->type,
                  (unsigned long long)e->ctx);
            if (e->type == KVT_OFFLOAD_EV_CONTEXT_DONE) {
                CHECK(c->finished, "context %llu ended before its request finished",
                      (unsigned long long)e->ctx);
                c->done = true;
                continue;
            }
            const kvt_group_spec *gs = &S.pc.groups[e->group];
            uint32_t end = (e->token_start + e->num_tokens) / HBS;
            bool size_ok =
                e->num_tokens == gs->block_size ||
                (S.partial && e->num_tokens % HBS == 0 && e->num_tokens < gs->block_size);
            CHECK(e->medium == KVT_MEDIUM_HOST && e->group < S.ng && e->kind == gs->kind &&
                      e->window == (gs->kind == KVT_GROUP_SLIDING ? gs->sliding_window : 0) &&
                      size_ok && e->num_tokens > 0 && e->token_start % gs->block_size == 0,
                  "stored event of group %u (kind %u, window %u, %u tokens from %u) does not "
                  "match its group",
                  e->group, e->kind, e->window, e->num_tokens, e->token_start);
            CHECK(end >= 1 && end <= c->n_hashes &&
                      memcmp(e->hash, c->hashes + (size_t)(end - 1) * HL, HL) == 0,
                  "stored event (group %u, tokens %u..%u) is not its request's block", e->group,
                  e->token_start, e->token_start + e->num_tokens);
            if (e->token_start == 0)
                CHECK(!e->has_parent, "the first block has a parent");
            else
                CHECK(e->has_parent &&
                          memcmp(e->parent_hash,
                                 c->hashes + (size_t)(e->token_start / HBS - 1) * HL, HL) == 0,
                      "stored event (group %u, tokens from %u) names the wrong parent", e->group,
                      e->token_start);
            S.ctx_events++;
        }
    } while (n == 256);
}

/* Every host block that can be found holds exactly its key's contents; so does every GPU
 * block that carries a key. */
static void check_contents(void)
{
    kvt_pool_key keys[8];
    uint32_t n;
    for (uint32_t b = 1; b < kvt_pool_num_blocks(S.host); b++) {
        KVT_OK_(kvt_pool_block_keys(S.host, b, keys, 8, &n));
        CHECK(n <= 1, "host block %u carries %u keys (one per GPU block)", b, n);
        if (n)
            CHECK(S.hcont[b] == tag_of(keys[0].hash, keys[0].group),
                  "host block %u is found under a key (group %u) whose contents it lacks", b,
                  keys[0].group);
    }
    for (uint32_t b = 1; b < GPU_NB; b++) {
        KVT_OK_(kvt_pool_block_keys(S.gpu, b, keys, 8, &n));
        if (n)
            CHECK(S.gcont[b] == tag_of(keys[0].hash, keys[0].group),
                  "GPU block %u carries a key whose contents it lacks", b);
    }
    for (uint32_t b = 1; S.dpool && b < kvt_pool_num_blocks(S.dpool); b++) {
        KVT_OK_(kvt_pool_block_keys(S.dpool, b, keys, 8, &n));
        if (n)
            CHECK(S.dcont[b] == tag_of(keys[0].hash, keys[0].group),
                  "disk slot %u is found under a key (group %u) whose contents it lacks", b,
                  keys[0].group);
    }
}

static void step(bool arrivals)
{
    g_step++;
    work();
    for (uint32_t i = 0; i < NREQ; i++) {
        struct req *q = &S.r[i];
        if (q->used && !q->loading && q->computed >= q->max_tokens)
            finish(q);
        if (!q->used && arrivals && S.arrivals < MAX_FIN)
            arrive(q);
    }
    uint32_t sched[NREQ] = {0};
    for (uint32_t i = 0; i < NREQ; i++) {
        struct req *q = &S.r[i];
        if (!q->used || q->loading)
            continue;
        if (q->computed < q->n_tokens) {
            sched[i] = q->n_tokens - q->computed; /* prefill in one step */
        } else if (q->n_tokens < q->max_tokens) {
            bool room = true; /* decode: a new block where a group needs one */
            for (uint32_t g = 0; g < S.ng && room; g++)
                if (cacheable(g) && blocks_for(g, q->n_tokens + 1) > q->nb[g])
                    room = engine_alloc(1, &q->tab[g][q->nb[g]]) == 0 && ++q->nb[g];
            if (!room)
                continue;
            q->tokens[q->n_tokens++] = 900000 + (uint32_t)kvt_test_rand(&S.rng) % 50000;
            rehash(q);
            sched[i] = 1;
        } else {
            sched[i] = 0;
            q->computed = q->max_tokens; /* done */
            continue;
        }
        const uint32_t *t[KVT_MAX_GROUPS];
        CALL(kvt_offload_schedule_hashed(S.m, q->id, q->id_len, tables(q, t), q->nb, q->hashes,
                                         q->n_hashes, q->computed, sched[i], false));
    }
    CALL(kvt_offload_build_meta(S.m, false, &S.meta));
    KVT_OK_(kvt_offload_meta_validate(&S.meta));
    take_events();
    for (uint32_t i = 0; i < NREQ; i++) { /* the engine computes this step's tokens */
        struct req *q = &S.r[i];
        if (!sched[i])
            continue;
        uint32_t from = q->computed;
        q->computed += sched[i];
        register_keys(q, from, false);
        hand_over(q, from);
        drop_behind(q);
    }
    check_contents();
    check_cache_events();
}

/* After draining: a clone of every finished prompt gets at least what the GPU offered. */
static void check_clones(void)
{
    for (uint32_t i = 0; i < S.n_fin; i++) {
        struct fin *f = &S.fin[i];
        char id[16];
        uint32_t id_len = (uint32_t)snprintf(id, sizeof(id), "c%u", i), hit;
        CALL(kvt_offload_match(S.m, id, id_len, f->hashes, f->n_hashes, f->n_tokens, 0, &hit));
        CHECK(hit >= f->ref_hit,
              "a clone of finished prompt %u (%u tokens) gets %u tokens from the host tier; the "
              "GPU pool offered %u when it finished (disk tier: %d, partial hits: %d, ext: %d)",
              i, f->n_tokens, hit, f->ref_hit, S.disk, S.partial, S.ext);
        uint32_t none[KVT_MAX_GROUPS] = {0};
        const uint32_t *t[KVT_MAX_GROUPS] = {0};
        CALL(kvt_offload_request_finished_hashed(S.m, id, id_len, t, none, f->hashes, f->n_hashes,
                                                 0));
        S.clones++;
        S.clone_tokens += hit;
    }
}

static void episode(void)
{
    start_episode();
    while (S.arrivals < MAX_FIN)
        step(true);
    for (uint32_t i = 0; i < 400; i++) { /* drain: everything finishes and lands */
        bool busy = false;
        for (uint32_t k = 0; k < NREQ; k++)
            busy |= S.r[k].used;
        if (!busy && !kvt_offload_has_pending(S.m) && S.n_st == 0 && S.n_ld == 0 && S.n_wb == 0 &&
            S.n_pr == 0)
            break;
        step(false);
    }
    kvt_offload_stats st;
    kvt_offload_get_stats(S.m, &st);
    S.recovered += st.store_recovered_null;
    S.partial_tails += st.partial_tails;
    CHECK(!kvt_offload_has_pending(S.m), "the manager still has work after draining");
    check_cache_events();
    for (uint32_t i = 0; i < S.n_ctx; i++)
        CHECK(S.ctx[i].done, "context %u never ended (its request finished: %d)", i + 1,
              S.ctx[i].finished);
    /* the clone rule holds when nothing was lost for room: a small host tier whose blocks are
     * all pinned drops what it cannot take (a handed-over state for good) */
    kvt_tier_stats ts;
    KVT_OK_(kvt_offload_get_tier_stats(S.m, 0, &ts));
    if (!S.lazy && ts.store_dropped == 0 && st.disk_store_dropped == 0) {
        S.disk_clone_episodes += S.disk;
        check_clones();
    }
    end_episode();
}

static void hybrid_configurations_keep_every_invariant(void **state)
{
    (void)state;
    g_seed = kvt_test_seed();
    S.rng = g_seed;
    kvt_offload_meta_init(&S.meta);
    kvt_offload_worker_meta_init(&S.wm);
    uint32_t episodes = (uint32_t)(60 * kvt_test_scale());
    for (uint32_t e = 0; e < episodes; e++)
        episode();
    /* whether a partial hash hit and a partial tail occur in a run is up to the draws (seed
     * 46578639826433 had 7 partial episodes, 9 hits and no tail): more episodes of that
     * configuration, until both have been seen, so that the checks below never depend on luck */
    g_force_partial = true;
    for (uint32_t extra = 0;
         extra < 100 && (S.partial_hits == 0 || S.partial_tails == 0 || S.dcp_episodes == 0);
         extra++, episodes++)
        episode();
    g_force_partial = false;
    kvt_offload_meta_release(&S.meta);
    kvt_offload_worker_meta_release(&S.wm);
    print_message("hybrid model: %u episodes (%llu over the engine's own pool, %llu lazy, %llu "
                  "with a disk tier), %llu steps, %llu blocks stored, %llu loaded, %llu nulled "
                  "entries recovered, %llu clones (%llu tokens hit), %llu stored events with "
                  "context, %llu Mamba align states handed over; lazy: %llu stored, %llu loaded; "
                  "disk: %llu written back, %llu promoted, %llu episodes clone-checked; partial "
                  "hash hits: %llu episodes (%llu of decode context parallelism), %llu hits, "
                  "%llu partly filled blocks stored; seed %llu\n",
                  episodes, (unsigned long long)S.ext_episodes, (unsigned long long)S.lazy_episodes,
                  (unsigned long long)S.disk_episodes, (unsigned long long)g_step,
                  (unsigned long long)S.stores, (unsigned long long)S.loads,
                  (unsigned long long)S.recovered, (unsigned long long)S.clones,
                  (unsigned long long)S.clone_tokens, (unsigned long long)S.ctx_events,
                  (unsigned long long)S.handed, (unsigned long long)S.lazy_stores,
                  (unsigned long long)S.lazy_loads, (unsigned long long)S.writebacks,
                  (unsigned long long)S.promotions, (unsigned long long)S.disk_clone_episodes,
                  (unsigned long long)S.partial_episodes, (unsigned long long)S.dcp_episodes,
                  (unsigned long long)S.partial_hits, (unsigned long long)S.partial_tails,
                  (unsigned long long)g_seed);
    assert_true(S.stores > 0 && S.loads > 0 && S.recovered > 0 && S.ctx_events > 0);
    assert_true(S.lazy_episodes == 0 || S.lazy_stores > 0);
    assert_true(S.handed > 0);
    assert_true(S.partial_hits > 0 && S.partial_tails > 0 && S.dcp_episodes > 0);
    assert_true(S.disk_episodes == 0 || (S.writebacks > 0 && S.promotions > 0));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(hybrid_configurations_keep_every_invariant),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
