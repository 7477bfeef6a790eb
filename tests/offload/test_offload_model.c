/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Randomized model-based test of the offload manager.
 *
 * A small vLLM-like engine (waiting and running requests with shared prefixes, chunked
 * prefill, decode, preemption, aborts, resets; eager or lazy; a GPU pool with prefix caching)
 * drives kvt_offload, and world_size simulated workers execute every event the manager emits:
 * each rank moves block contents (a per-rank tag derived from the block's hash) between a GPU
 * array and a host array, completes events in order per direction after a random delay of its
 * own, and its reports reach the manager one to three steps late, interleaved across steps.
 * A need_flush makes every rank finish everything first.
 *
 * After every step the harness checks, from its own bookkeeping only:
 *   - references: every GPU block's count equals the engine's own references plus the
 *     transfers in flight that use it; every host block's equals the pending hits pinning it
 *     plus its transfers in flight — so no reference leaked or was released twice;
 *   - data: every host block the manager lets be found holds, on every rank, the contents
 *     of the block its key names (so nothing became findable before all stores landed), and
 *     every block a request computes from holds its own contents (loads brought the right
 *     bytes);
 *   - the engine is never handed a GPU block a transfer still uses;
 *   - every event is completed exactly once (no stale or unknown reports);
 * and at the end, after draining, both pools are fully free and the manager holds nothing.
 *
 * Most episodes run a chain of one to three tiers behind the host (the disk of disk_blocks or
 * a tier of kvt_offload_add_tier first, then more added): the ranks also execute write-backs
 * (host -> a tier's block) and promotions (a tier's block -> host), each failing now and then
 * on one rank (garbage lands, the event is reported failed). The checks extend to every tier:
 * every block's references are the pending hits pinning it plus the transfers using it; every
 * findable block holds its key's contents on every rank; a request whose hit continues behind
 * the host holds its GPU and host blocks from after_alloc until its GPU load is issued (or,
 * finished meanwhile, until its last promotion completed), and loads only after every tier's
 * promotion of it completed; a failed promotion must come back as invalid load destinations
 * (the engine then recomputes from the first one) or the request's contents check fails.
 *
 * Half the episodes run the manager over the engine's own pool (kvt_offload_create_ext): the
 * harness's GPU kvt_pool is then reached only through kvt_gpu_pool_ops callbacks (touch, free,
 * lru_scan, and lookup in some episodes), stored keys come from the requests' hashes, and the
 * callbacks must get whole batches (never more calls than the events' blocks).
 *
 * >= 200,000 manager calls per run (KVTIER_TEST_SCALE multiplies); the seed is printed on
 * failure (KVTIER_TEST_SEED replays it).
 */
#include "kvt_test.h"
#include "offload/pool_scan.h"

#define BS        16
#define MAXB      24
#define MAXR      6
#define MAX_RANKS 4
#define MAX_EV    4096
#define MAX_PAIRS 256
#define MAX_GPU   128
#define MAX_HOST  192
#define MAX_DISK  256
#define MAX_TIERS 4 /* the host and three behind it */
#define N_KINDS   (2 * MAX_TIERS)
#define HL        KVT_BLOCK_HASH_LEN
#define HASH_SEED 7

static uint64_t g_seed, g_step, g_ops, g_releases, g_clears;
static kvt_offload_stats g_tot;            /* summed over episodes, for the summary */
static kvt_tier_stats g_behind;            /* the tiers behind the host, summed */
static uint32_t g_chains[MAX_TIERS];       /* episodes per number of tiers (the host included) */
static uint64_t g_spans;                   /* requests promoted out of two tiers or more */
static uint64_t g_ext_calls, g_ext_blocks; /* engine-pool callbacks and the blocks they got */

#define CHECK(cond, ...) KVT_MODEL_CHECK("offload model", "step", g_step, g_seed, cond, __VA_ARGS__)

#define CALL(expr)                                                                                 \
    do {                                                                                           \
        g_ops++;                                                                                   \
        int rc_ = (expr);                                                                          \
        CHECK(rc_ == 0, "%s -> %s: %s", #expr, kvt_err_name(rc_), kvt_last_error());               \
    } while (0)

enum { R_WAITING, R_LOADING, R_RUNNING };

struct req {
    bool used;
    char id[16];
    uint32_t id_len;
    int state;
    uint32_t n_tokens, prompt, max_tokens;
    uint32_t tokens[MAXB * BS];
    uint8_t hashes[MAXB * HL];
    uint32_t blocks[MAXB], n_blocks;
    uint32_t computed;
    uint32_t pins[MAXB], n_pins; /* host blocks pinned by its pending hit */
    bool resumed;
    /* tiers behind the host */
    uint32_t ppins[MAXB], n_ppins; /* host blocks allocated for the part behind of its hit */
    uint32_t dpins[MAXB], dpin_t[MAXB], n_dpins; /* blocks (and their tiers) pinned there */
    uint32_t hold_g[MAXB], hold_h[MAXB], n_hold, hold_disk; /* load pairs waiting for a
                                       promotion; entries >= hold_disk are the promoted ones */
    uint32_t hold_s[MAXB], hold_st[MAXB], n_hold_s;         /* sources of the accepted promotions */
    bool promo_q;                                           /* promotions queued, no event yet */
    uint32_t promo_left;         /* promotion events issued and not yet completed */
    int32_t promo_ev[MAX_TIERS]; /* per tier: its promotion event, -1 none */
    bool zombie;                 /* finished while its promotions were in flight */
};

/* event kinds: GPU loads and stores, then per tier t >= 1 its write-backs (2t) and promotions
 * (2t + 1) */
enum { EV_LOAD, EV_STORE };
#define EV_TSTORE(t)  (2 * (t))
#define EV_TLOAD(t)   (2 * (t) + 1)
#define KIND_TIER(k)  ((uint32_t)(k) / 2)
#define KIND_TLOAD(k) ((k) >= 2 && (k) % 2 == 1)

struct wev {
    int64_t id;
    int kind;
    uint32_t n;
    uint32_t gpu[MAX_PAIRS], host[MAX_PAIRS], slot[MAX_PAIRS];
    uint32_t inv[MAX_PAIRS], n_inv; /* load: destinations reported invalid */
    uint32_t n_reqs;
    char reqs[MAXR][16];
    uint32_t done;    /* ranks that executed it */
    uint32_t applied; /* store: reports the manager has applied; load: 1 once applied */
    bool let_go;      /* store: its GPU sources were released early (kvt_offload_release_...) */
};

struct outbox { /* a report on its way to the scheduler */
    uint64_t at;
    int kind;
    bool failed; /* store: this rank could not write one block (a disk I/O error) */
    int64_t ev;
    uint32_t idx; /* load: event slot */
};

static struct {
    kvt_pool *gpu;
    kvt_offload *m;
    const kvt_pool *host, *tp[MAX_TIERS];                   /* tp[t]: tier t >= 1's pool */
    uint32_t gpu_nb, host_nb, tnb[MAX_TIERS], tiers, world; /* tiers: the host and behind */
    bool lazy;
    bool ext; /* the manager reaches S.gpu only through the callbacks below */
    uint64_t cb_calls, cb_blocks;
    uint64_t hit_matches; /* matches that offered a hit: kvt_offload_stats.hit_requests */
    struct req reqs[MAXR];
    uint64_t gcont[MAX_RANKS][MAX_GPU], hcont[MAX_RANKS][MAX_HOST];
    uint64_t tcont[MAX_TIERS][MAX_RANKS][MAX_DISK];
    struct wev ev[MAX_EV];
    uint32_t n_ev;                          /* events ever issued this episode */
    uint32_t rank_next[N_KINDS][MAX_RANKS]; /* per kind: next event index each rank executes */
    uint32_t idx[N_KINDS][MAX_EV], n_idx[N_KINDS]; /* per kind: events in issue order */
    struct outbox out[MAX_EV * MAX_RANKS];
    uint32_t n_out;
    uint32_t prefixes[4][6 * BS];
    bool reset_pending;
    kvt_offload_meta meta;
    kvt_offload_worker_meta wm;
    uint32_t next_id;
    uint32_t g_live[MAX_GPU], h_live[MAX_HOST], t_live[MAX_TIERS][MAX_DISK]; /* in flight */
    uint32_t hist[8][MAXB * BS], hist_len[8]; /* finished conversations that may come back */
} S;

/* ---- the engine's own pool, as kvt_gpu_pool_ops (ext episodes) ----------------------- */

static void cb_touch(void *ctx, const uint32_t *ids, uint32_t n)
{
    (void)ctx;
    S.cb_calls++;
    S.cb_blocks += n;
    CHECK(n > 0, "empty touch batch");
    CHECK(kvt_pool_touch(S.gpu, ids, n) == 0, "touch callback: %s", kvt_last_error());
}

static void cb_free(void *ctx, const uint32_t *ids, uint32_t n)
{
    (void)ctx;
    S.cb_calls++;
    S.cb_blocks += n;
    CHECK(n > 0, "empty free batch");
    CHECK(kvt_pool_free(S.gpu, ids, n) == 0, "free callback: %s", kvt_last_error());
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

static uint64_t tag(const uint8_t *hash, uint32_t rank)
{
    return kvt_hash64(hash, HL, rank + 1);
}

/* ---- engine ---------------------------------------------------------------------------- */

static void new_request(uint64_t *rng)
{
    for (uint32_t i = 0; i < MAXR; i++) {
        struct req *r = &S.reqs[i];
        if (r->used || r->zombie)
            continue;
        memset(r, 0, sizeof(*r));
        r->used = true;
        r->id_len = (uint32_t)snprintf(r->id, sizeof(r->id), "r%u", S.next_id++);
        uint32_t h = kvt_test_below(rng, 8);
        if (S.hist_len[h] && kvt_test_below(rng, 2)) {
            /* a conversation returns: its whole history plus a new turn */
            uint32_t own = 1 + kvt_test_below(rng, 40);
            r->prompt = S.hist_len[h] + own;
            memcpy(r->tokens, S.hist[h], S.hist_len[h] * sizeof(uint32_t));
            for (uint32_t t = S.hist_len[h]; t < r->prompt; t++)
                r->tokens[t] = 50000 + kvt_test_below(rng, 1000);
        } else {
            uint32_t p = kvt_test_below(rng, 4), shared = (2 + kvt_test_below(rng, 5)) * BS;
            uint32_t own = 1 + kvt_test_below(rng, 60);
            r->prompt = shared + own;
            for (uint32_t t = 0; t < r->prompt; t++)
                r->tokens[t] = t < shared ? S.prefixes[p][t] : 50000 + kvt_test_below(rng, 1000);
        }
        r->n_tokens = r->prompt;
        r->max_tokens = r->prompt + 1 + kvt_test_below(rng, 40);
        if (r->max_tokens > MAXB * BS)
            r->max_tokens = MAXB * BS;
        uint32_t n;
        KVT_OK_(
            kvt_hash_prompt(HASH_SEED, r->tokens, r->n_tokens, BS, NULL, 0, r->hashes, MAXB, &n));
        r->state = R_WAITING;
        return;
    }
}

static uint32_t full_hashes(const struct req *r)
{
    return r->n_tokens / BS;
}

/* A GPU block used by a transfer the manager has not yet seen completed. */
static bool gpu_in_transfer(uint32_t b)
{
    return S.g_live[b] > 0;
}

static void live(const struct wev *e, int d)
{
    for (uint32_t k = 0; k < e->n; k++) {
        if (e->kind == EV_LOAD || (e->kind == EV_STORE && !e->let_go))
            S.g_live[e->gpu[k]] += (uint32_t)d;
        if (!KIND_TLOAD(e->kind)) /* a promotion's host block is held by its request */
            S.h_live[e->host[k]] += (uint32_t)d;
        if (e->kind >= 2)
            S.t_live[KIND_TIER(e->kind)][e->slot[k]] += (uint32_t)d;
    }
}

static bool engine_alloc(uint32_t n, uint32_t *ids)
{
    if (kvt_pool_num_free(S.gpu) < n)
        return false;
    KVT_OK_(kvt_pool_alloc(S.gpu, n, ids));
    for (uint32_t i = 0; i < n; i++)
        CHECK(!gpu_in_transfer(ids[i]),
              "the engine was handed GPU block %u while a transfer "
              "uses it",
              ids[i]);
    return true;
}

static void release_blocks(struct req *r)
{
    uint32_t rev[MAXB];
    for (uint32_t i = 0; i < r->n_blocks; i++)
        rev[i] = r->blocks[r->n_blocks - 1 - i];
    KVT_OK_(kvt_pool_free(S.gpu, rev, r->n_blocks));
    r->n_blocks = 0;
}

static void finish(struct req *r)
{
    const uint32_t *tab[1] = {r->blocks};
    uint32_t nb[1] = {r->n_blocks};
    if (S.ext)
        CALL(kvt_offload_request_finished_hashed(S.m, r->id, r->id_len, tab, nb, r->hashes,
                                                 full_hashes(r), r->computed));
    else
        CALL(kvt_offload_request_finished(S.m, r->id, r->id_len, tab, nb, r->computed));
    r->n_pins = r->n_ppins = r->n_dpins = 0;
    release_blocks(r);
    r->used = false;
    /* promotions in flight keep their pairs until the last completes; queued ones or a
     * queued load are cancelled at once */
    r->zombie = r->n_hold && r->promo_left > 0;
    if (!r->zombie)
        r->n_hold = 0;
}

static uint32_t host_ref(uint32_t h)
{
    kvt_block_info bi;
    KVT_OK_(kvt_pool_block_info(S.host, h, &bi));
    return bi.ref_cnt;
}

static bool in_list(const uint32_t *l, uint32_t n, uint32_t v)
{
    for (uint32_t i = 0; i < n; i++)
        if (l[i] == v)
            return true;
    return false;
}

static void admit(struct req *r, uint64_t *rng)
{
    uint32_t out[MAXB], *outs[1] = {out};
    kvt_hit gh;
    uint32_t nh = full_hashes(r);
    KVT_OK_(kvt_pool_find_longest_hit(S.gpu, r->hashes, nh, r->n_tokens - 1, outs, &gh));
    /* predict the host blocks match will pin: the same search on the same state */
    uint32_t pred[MAXB], *pouts[1] = {pred}, start = gh.length / BS;
    kvt_hit hh = {0};
    if (start < nh && r->n_tokens > gh.length + 1)
        KVT_OK_(kvt_pool_find_longest_hit(S.host, r->hashes + start * HL, nh - start,
                                          r->n_tokens - 1 - gh.length, pouts, &hh));
    /* and behind the host: each tier where the ones before it stopped, in order (the blocks
     * found, behind one another, with their tiers) */
    uint32_t dpred[MAXB], dpred_t[MAXB], n_dpred = 0, at = start + hh.length / BS;
    uint32_t used = gh.length + hh.length;
    for (uint32_t t = 1; t < S.tiers; t++) {
        uint32_t found[MAXB], *fouts[1] = {found};
        kvt_hit th = {0};
        if (at < nh && r->n_tokens > used + 1)
            KVT_OK_(kvt_pool_find_longest_hit(S.tp[t], r->hashes + at * HL, nh - at,
                                              r->n_tokens - 1 - used, fouts, &th));
        for (uint32_t j = 0; j < th.n_blocks[0]; j++) {
            dpred[n_dpred] = found[j];
            dpred_t[n_dpred++] = t;
        }
        at += th.length / BS;
        used += th.length;
    }
    /* host references before the match, less the old pins it releases first */
    static uint32_t before[MAX_HOST];
    for (uint32_t h = 1; S.tiers > 1 && h < S.host_nb; h++)
        before[h] = host_ref(h);
    for (uint32_t j = 0; S.tiers > 1 && j < r->n_pins; j++)
        before[r->pins[j]]--;
    for (uint32_t j = 0; S.tiers > 1 && j < r->n_ppins; j++)
        before[r->ppins[j]]--;
    uint32_t hit;
    CALL(kvt_offload_match(S.m, r->id, r->id_len, r->hashes, nh, r->n_tokens, gh.length, &hit));
    CHECK(hit >= hh.length, "match offered %u tokens, the host tier holds %u", hit, hh.length);
    S.hit_matches += hit > 0;
    uint32_t nd = (hit - hh.length) / BS;
    CHECK(nd <= n_dpred, "match offered %u blocks behind the host, the tiers there hold %u", nd,
          n_dpred);
    r->n_pins = hh.n_blocks[0];
    memcpy(r->pins, pred, r->n_pins * sizeof(uint32_t));
    /* the part behind: the first nd blocks found, and nd newly referenced host blocks */
    r->n_dpins = nd;
    memcpy(r->dpins, dpred, nd * sizeof(uint32_t));
    memcpy(r->dpin_t, dpred_t, nd * sizeof(uint32_t));
    r->n_ppins = 0;
    for (uint32_t h = 1; nd && h < S.host_nb; h++)
        if (host_ref(h) == before[h] + 1 && !in_list(r->pins, r->n_pins, h))
            r->ppins[r->n_ppins++] = h;
    CHECK(r->n_ppins == nd, "%u host blocks allocated for %u promoted blocks", r->n_ppins, nd);
    uint32_t need = (r->n_tokens + BS - 1) / BS, evictable = 0;
    for (uint32_t j = 0; j < gh.n_blocks[0]; j++) {
        kvt_block_info bi;
        KVT_OK_(kvt_pool_block_info(S.gpu, out[j], &bi));
        evictable += bi.ref_cnt == 0; /* touching it takes it off the free queue */
    }
    if (kvt_pool_num_free(S.gpu) < need - gh.n_blocks[0] + evictable + 1)
        return; /* no room: stays waiting, pinned; the next match re-pins */
    KVT_OK_(kvt_pool_touch(S.gpu, out, gh.n_blocks[0]));
    memcpy(r->blocks, out, gh.n_blocks[0] * sizeof(uint32_t));
    if (!engine_alloc(need - gh.n_blocks[0], r->blocks + gh.n_blocks[0]))
        CHECK(false, "allocation failed after the room check");
    r->n_blocks = need;
    uint32_t accept = 0;
    uint32_t c = kvt_test_below(rng, 4);
    if (hit && c)
        accept = c == 1 ? hit : (kvt_test_below(rng, hit / BS + 1)) * BS;
    const uint32_t *tab[1] = {r->blocks};
    uint32_t nb[1] = {r->n_blocks};
    CALL(kvt_offload_after_alloc(S.m, r->id, r->id_len, tab, nb, accept));
    uint32_t acc = accept / BS, acc_host = acc < r->n_pins ? acc : r->n_pins;
    if (acc > acc_host) {
        /* promotions: the load pairs wait, held, until the promoted part is on the host */
        r->n_hold = 0;
        for (uint32_t j = 0; j < acc_host; j++) {
            r->hold_g[r->n_hold] = r->blocks[gh.n_blocks[0] + j];
            r->hold_h[r->n_hold++] = r->pins[j];
        }
        r->hold_disk = r->n_hold;
        for (uint32_t j = 0; j < r->n_ppins; j++)
            if (host_ref(r->ppins[j]) > 0) /* accepted: still referenced */
                r->hold_h[r->n_hold++] = r->ppins[j];
        CHECK(r->n_hold == acc, "%u of %u accepted blocks held", r->n_hold, acc);
        r->n_hold_s = acc - acc_host;
        memcpy(r->hold_s, r->dpins, r->n_hold_s * sizeof(uint32_t));
        memcpy(r->hold_st, r->dpin_t, r->n_hold_s * sizeof(uint32_t));
        for (uint32_t j = acc_host; j < acc; j++)
            r->hold_g[j] = r->blocks[gh.n_blocks[0] + j];
        r->promo_q = true;
        r->promo_left = 0;
        for (uint32_t t = 0; t < MAX_TIERS; t++)
            r->promo_ev[t] = -1;
    }
    r->n_pins = r->n_ppins = r->n_dpins = 0;
    r->computed = gh.length + accept;
    r->state = accept ? R_LOADING : R_RUNNING;
}

/* The blocks a request computes from must hold their own contents on every rank. */
static void verify_request(const struct req *r)
{
    for (uint32_t j = 0; j < r->computed / BS; j++)
        for (uint32_t k = 0; k < S.world; k++)
            CHECK(S.gcont[k][r->blocks[j]] == tag(r->hashes + j * HL, k),
                  "request %s block %u (GPU %u) holds wrong contents on rank %u", r->id, j,
                  r->blocks[j], k);
}

static void compute(struct req *r, uint32_t tokens)
{
    verify_request(r);
    uint32_t from = r->computed / BS;
    r->computed += tokens;
    for (uint32_t j = from; j < r->computed / BS; j++) {
        for (uint32_t k = 0; k < S.world; k++)
            S.gcont[k][r->blocks[j]] = tag(r->hashes + j * HL, k);
        kvt_block_info bi;
        KVT_OK_(kvt_pool_block_info(S.gpu, r->blocks[j], &bi));
        if (bi.n_keys == 0)
            KVT_OK_(kvt_pool_insert(S.gpu, r->blocks[j], r->hashes + j * HL, 0, BS));
    }
}

/* ---- workers --------------------------------------------------------------------------- */

static struct wev *new_event(int kind, int64_t id, uint32_t n, const uint32_t *a, const uint32_t *b)
{
    CHECK(S.n_ev < MAX_EV && n <= MAX_PAIRS, "harness capacity");
    struct wev *e = &S.ev[S.n_ev];
    memset(e, 0, sizeof(*e));
    e->id = id;
    e->kind = kind;
    e->n = n;
    /* a and b in the metadata's order: load (gpu, host), store (gpu, host), write-back
     * (host, block of the tier), promotion (block of the tier, host) */
    bool tload = KIND_TLOAD(kind), tstore = kind >= 2 && !tload;
    uint32_t *dst_a = tstore ? e->host : tload ? e->slot : e->gpu;
    uint32_t *dst_b = tstore ? e->slot : e->host;
    memcpy(dst_a, a, n * sizeof(uint32_t));
    memcpy(dst_b, b, n * sizeof(uint32_t));
    S.idx[kind][S.n_idx[kind]++] = S.n_ev++;
    return e;
}

static void record_events(void)
{
    const kvt_offload_meta *m = &S.meta;
    if (m->load_event != KVT_NO_EVENT) {
        struct wev *e =
            new_event(EV_LOAD, m->load_event, m->n_loads, m->load_gpu_blocks, m->load_cpu_blocks);
        e->n_inv = m->n_load_invalid;
        if (e->n_inv)
            memcpy(e->inv, m->load_invalid_blocks, e->n_inv * sizeof(uint32_t));
        for (uint32_t i = 0; i < m->n_load_events; i++)
            if (m->load_events[i] == e->id)
                for (uint32_t k = m->load_req_first[i]; k < m->load_req_first[i + 1]; k++)
                    snprintf(e->reqs[e->n_reqs++], 16, "%s", m->load_req_ids[k].ptr);
        for (uint32_t k = 0; k < e->n_reqs; k++) /* its held pairs are the event's now */
            for (uint32_t i = 0; i < MAXR; i++)
                if (S.reqs[i].used && strcmp(S.reqs[i].id, e->reqs[k]) == 0) {
                    CHECK(!S.reqs[i].n_hold || (!S.reqs[i].promo_q && !S.reqs[i].promo_left),
                          "request %s loads before its promotions completed", e->reqs[k]);
                    S.reqs[i].n_hold = 0;
                }
        live(e, 1);
    }
    if (m->store_event != KVT_NO_EVENT)
        live(new_event(EV_STORE, m->store_event, m->n_stores, m->store_gpu_blocks,
                       m->store_cpu_blocks),
             1);
    bool any_promotion = false;
    for (uint32_t t = 1; t < MAX_TIERS; t++) {
        const kvt_tier_xfers *x = &m->tiers[t - 1];
        CHECK(t < S.tiers || (x->store_event == KVT_NO_EVENT && x->load_event == KVT_NO_EVENT),
              "transfers of tier %u, which is not there", t);
        if (x->store_event != KVT_NO_EVENT)
            live(new_event(EV_TSTORE(t), x->store_event, x->n_stores, x->store_src, x->store_dst),
                 1);
        if (x->load_event == KVT_NO_EVENT)
            continue;
        any_promotion = true;
        struct wev *e = new_event(EV_TLOAD(t), x->load_event, x->n_loads, x->load_src, x->load_dst);
        for (uint32_t i = 0; i < MAXR; i++) { /* which requests it promotes */
            struct req *r = &S.reqs[i];
            bool mine = false;
            for (uint32_t j = r->hold_disk; r->n_hold && r->promo_q && j < r->n_hold; j++)
                mine |= in_list(e->host, e->n, r->hold_h[j]);
            if (mine) {
                r->promo_ev[t] = (int32_t)(S.n_ev - 1);
                r->promo_left++;
            }
        }
        live(e, 1);
    }
    /* a request's promotions go out together, every tier's in the same step */
    for (uint32_t i = 0; any_promotion && i < MAXR; i++) {
        struct req *r = &S.reqs[i];
        if (!r->n_hold || !r->promo_q || !r->promo_left)
            continue;
        uint32_t want = 0, got = 0;
        for (uint32_t j = 0; j < r->n_hold_s; j++) {
            bool seen = false;
            for (uint32_t k = 0; k < j; k++)
                seen |= r->hold_st[k] == r->hold_st[j];
            want += !seen;
        }
        for (uint32_t t = 1; t < MAX_TIERS; t++)
            got += r->promo_ev[t] >= 0;
        CHECK(got == want, "request %s: promotions out of %u tiers issued, %u expected", r->id, got,
              want);
        g_spans += got > 1;
        r->promo_q = false;
    }
}

static void post(int kind, int64_t ev, uint32_t idx, uint64_t *rng, bool failed)
{
    struct outbox *o = &S.out[S.n_out++];
    o->at = g_step + 1 + kvt_test_below(rng, 3);
    o->kind = kind;
    o->failed = failed;
    o->ev = ev;
    o->idx = idx;
}

/* Rank k moves the bytes of one event; now and then (not for GPU loads) one block cannot be
 * moved: garbage lands there and the rank reports the event completed and failed. The check
 * of findable data fails if the manager ever lets that block be found. */
static bool execute(struct wev *e, uint32_t k, uint64_t *rng)
{
    uint64_t *dst = NULL;
    for (uint32_t i = 0; i < e->n; i++) {
        switch (e->kind) {
        case EV_LOAD:
            S.gcont[k][e->gpu[i]] = S.hcont[k][e->host[i]];
            break;
        case EV_STORE:
            S.hcont[k][e->host[i]] = S.gcont[k][e->gpu[i]];
            break;
        default:
            if (KIND_TLOAD(e->kind))
                S.hcont[k][e->host[i]] = S.tcont[KIND_TIER(e->kind)][k][e->slot[i]];
            else
                S.tcont[KIND_TIER(e->kind)][k][e->slot[i]] = S.hcont[k][e->host[i]];
        }
    }
    if (e->kind == EV_LOAD || kvt_test_below(rng, 24))
        return false;
    uint32_t i = kvt_test_below(rng, e->n);
    dst = e->kind == EV_STORE || KIND_TLOAD(e->kind) ? &S.hcont[k][e->host[i]]
                                                     : &S.tcont[KIND_TIER(e->kind)][k][e->slot[i]];
    *dst = 0xBADBADBADull;
    return true;
}

/* Rank k executes up to a few of its next events per kind (all with flush). */
static void run_workers(bool flush, uint64_t *rng)
{
    for (uint32_t k = 0; k < S.world; k++)
        for (int kind = 0; kind < N_KINDS; kind++) {
            uint32_t n = flush ? UINT32_MAX : kvt_test_below(rng, 3);
            for (; n && S.rank_next[kind][k] < S.n_idx[kind]; n--) {
                uint32_t idx = S.idx[kind][S.rank_next[kind][k]++];
                struct wev *e = &S.ev[idx];
                bool failed = execute(e, k, rng);
                if (kind != EV_LOAD)
                    post(kind, e->id, idx, rng, failed);
                else if (++e->done == S.world) /* the aggregator reports when all ranks did */
                    post(kind, e->id, idx, rng, false);
            }
        }
}

static struct wev *find_event(int kind, int64_t id)
{
    for (uint32_t i = 0; i < S.n_idx[kind]; i++)
        if (S.ev[S.idx[kind][i]].id == id)
            return &S.ev[S.idx[kind][i]];
    return NULL;
}

static kvt_event_report *report_of(int kind)
{
    return kind == EV_STORE   ? &S.wm.stores
           : KIND_TLOAD(kind) ? &S.wm.tier_loads[KIND_TIER(kind) - 1]
                              : &S.wm.tier_stores[KIND_TIER(kind) - 1];
}

/* A promotion completed on every rank: the loads of the requests it was the last promotion of
 * are queued (or, finished, their pairs released). */
static void promotion_done(const struct wev *e)
{
    uint32_t idx = (uint32_t)(e - S.ev), t = KIND_TIER(e->kind);
    for (uint32_t i = 0; i < MAXR; i++) {
        struct req *r = &S.reqs[i];
        if (r->promo_ev[t] != (int32_t)idx)
            continue;
        r->promo_ev[t] = -1;
        if (--r->promo_left)
            continue;
        if (r->zombie) {
            r->zombie = false;
            r->n_hold = 0;
        }
    }
}

/* Delivers the reports due by now (or all of them), aggregated into one output. */
static void deliver(bool all)
{
    kvt_offload_worker_meta_clear(&S.wm);
    kvt_str ids[MAXR * 4];
    uint32_t n_ids = 0;
    struct wev *loads[MAX_EV];
    uint32_t n_loads = 0;
    uint32_t keep = 0;
    for (uint32_t i = 0; i < S.n_out; i++) {
        struct outbox *o = &S.out[i];
        if (!all && o->at > g_step) {
            S.out[keep++] = *o;
            continue;
        }
        if (o->kind != EV_LOAD) {
            KVT_OK_(kvt_event_report_add(report_of(o->kind), o->ev, 1));
            if (o->failed)
                KVT_OK_(kvt_event_report_add_failed(report_of(o->kind), o->ev));
        } else {
            struct wev *e = &S.ev[o->idx];
            for (uint32_t k = 0; k < e->n_reqs; k++)
                ids[n_ids++] = (kvt_str){e->reqs[k], (uint32_t)strlen(e->reqs[k])};
            loads[n_loads++] = e;
        }
    }
    S.n_out = keep;
    bool any = n_ids || S.wm.stores.n_completed;
    for (uint32_t t = 0; t < MAX_TIERS - 1; t++)
        any |= S.wm.tier_stores[t].n_completed || S.wm.tier_loads[t].n_completed;
    if (!any)
        return;
    CALL(kvt_offload_apply_output(S.m, ids, n_ids, &S.wm));
    for (int kind = EV_STORE; kind < N_KINDS; kind++) {
        const kvt_event_report *rep = report_of(kind);
        for (uint32_t i = 0; i < rep->n_completed; i++) {
            struct wev *e = find_event(kind, rep->events[i]);
            bool was_live = e->applied < S.world;
            e->applied += rep->counts[i];
            if (was_live && e->applied >= S.world) {
                live(e, -1);
                if (KIND_TLOAD(kind))
                    promotion_done(e);
            }
        }
    }
    for (uint32_t i = 0; i < n_loads; i++) {
        loads[i]->applied = 1;
        live(loads[i], -1);
    }
    for (uint32_t i = 0; i < n_loads; i++)
        for (uint32_t q = 0; q < loads[i]->n_reqs; q++)
            for (uint32_t x = 0; x < MAXR; x++) {
                struct req *r = &S.reqs[x];
                if (!r->used || r->state != R_LOADING || strcmp(r->id, loads[i]->reqs[q]) != 0)
                    continue;
                r->state = R_RUNNING;
                /* invalid destinations: the engine recomputes from the first of them */
                for (uint32_t v = 0; v < loads[i]->n_inv; v++)
                    for (uint32_t j = 0; j < r->n_blocks; j++)
                        if (r->blocks[j] == loads[i]->inv[v] && r->computed > j * BS)
                            r->computed = j * BS;
            }
}

/* An engine that resets its own prefix cache while stores are in flight (vLLM's pause with
 * clear_cache): the manager releases the GPU blocks in-flight stores read; the engine may hand
 * them out at once (the ranks may still copy them: those stores are abandoned, so whatever
 * they copy is never findable), and their completions must release nothing more. */
static void release_engine_blocks(void)
{
    g_ops++;
    g_releases++;
    uint32_t held = UINT32_MAX;
    int rc = kvt_offload_release_engine_blocks(S.m, &held);
    CHECK(rc == 0, "release_engine_blocks returned %d", rc);
    uint32_t loading = 0;
    for (uint32_t i = 0; i < S.n_idx[EV_STORE]; i++) {
        struct wev *e = &S.ev[S.idx[EV_STORE][i]];
        if (e->applied >= S.world || e->let_go)
            continue; /* completed: nothing of it is held */
        live(e, -1);
        e->let_go = true;
        live(e, +1); /* its host blocks stay held until it completes */
    }
    for (uint32_t i = 0; i < S.n_idx[EV_LOAD]; i++)
        if (!S.ev[S.idx[EV_LOAD][i]].applied)
            loading += S.ev[S.idx[EV_LOAD][i]].n;
    CHECK(held >= loading && held < S.gpu_nb, "%u engine blocks held by loads, %u in flight", held,
          loading);
}

/* After a reset or a clear nothing of before is findable on any tier. */
static void check_tiers_empty(const char *op)
{
    for (uint32_t h = 1; h < S.host_nb; h++) {
        kvt_pool_key k;
        uint32_t n;
        KVT_OK_(kvt_pool_block_keys(S.host, h, &k, 1, &n));
        CHECK(n == 0, "host block %u is findable after a %s", h, op);
    }
    for (uint32_t t = 1; t < S.tiers; t++)
        for (uint32_t d = 1; d < S.tnb[t]; d++) {
            kvt_pool_key k;
            uint32_t n;
            KVT_OK_(kvt_pool_block_keys(S.tp[t], d, &k, 1, &n));
            CHECK(n == 0, "tier %u block %u is findable after a %s", t, d, op);
        }
}

/* ---- invariants ------------------------------------------------------------------------ */

static void check_refs(void)
{
    uint32_t gexp[MAX_GPU] = {0}, hexp[MAX_HOST] = {0}, dexp[MAX_TIERS][MAX_DISK] = {{0}};
    for (uint32_t i = 0; i < MAXR; i++) {
        const struct req *r = &S.reqs[i];
        for (uint32_t j = 0; j < r->n_hold; j++) { /* zombies included */
            gexp[r->hold_g[j]]++;
            hexp[r->hold_h[j]]++;
        }
        for (uint32_t j = 0; r->n_hold && r->promo_q && j < r->n_hold_s; j++)
            dexp[r->hold_st[j]][r->hold_s[j]]++; /* promotion queued, not in an event yet */
        if (!r->used)
            continue;
        for (uint32_t j = 0; j < r->n_blocks; j++)
            gexp[r->blocks[j]]++;
        for (uint32_t j = 0; j < r->n_pins; j++)
            if (r->pins[j] != KVT_NULL_BLOCK)
                hexp[r->pins[j]]++;
        for (uint32_t j = 0; j < r->n_ppins; j++)
            hexp[r->ppins[j]]++;
        for (uint32_t j = 0; j < r->n_dpins; j++)
            dexp[r->dpin_t[j]][r->dpins[j]]++;
    }
    for (uint32_t b = 0; b < S.gpu_nb; b++)
        gexp[b] += S.g_live[b];
    for (uint32_t h = 0; h < S.host_nb; h++)
        hexp[h] += S.h_live[h];
    for (uint32_t b = 1; b < S.gpu_nb; b++) {
        kvt_block_info bi;
        KVT_OK_(kvt_pool_block_info(S.gpu, b, &bi));
        CHECK(bi.ref_cnt == gexp[b], "GPU block %u has %u references, expected %u", b, bi.ref_cnt,
              gexp[b]);
    }
    for (uint32_t h = 1; h < S.host_nb; h++) {
        kvt_block_info bi;
        KVT_OK_(kvt_pool_block_info(S.host, h, &bi));
        CHECK(bi.ref_cnt == hexp[h], "host block %u has %u references, expected %u", h, bi.ref_cnt,
              hexp[h]);
    }
    for (uint32_t t = 1; t < S.tiers; t++)
        for (uint32_t d = 1; d < S.tnb[t]; d++) {
            kvt_block_info bi;
            KVT_OK_(kvt_pool_block_info(S.tp[t], d, &bi));
            CHECK(bi.ref_cnt == dexp[t][d] + S.t_live[t][d],
                  "tier %u block %u has %u references, expected %u", t, d, bi.ref_cnt,
                  dexp[t][d] + S.t_live[t][d]);
        }
}

static void check_findable_data(void)
{
    for (uint32_t h = 1; h < S.host_nb; h++) {
        kvt_pool_key k;
        uint32_t n;
        KVT_OK_(kvt_pool_block_keys(S.host, h, &k, 1, &n));
        if (!n)
            continue;
        for (uint32_t r = 0; r < S.world; r++)
            CHECK(S.hcont[r][h] == tag(k.hash, r),
                  "host block %u is findable but rank %u holds "
                  "other contents",
                  h, r);
    }
    for (uint32_t t = 1; t < S.tiers; t++)
        for (uint32_t d = 1; d < S.tnb[t]; d++) {
            kvt_pool_key k;
            uint32_t n;
            KVT_OK_(kvt_pool_block_keys(S.tp[t], d, &k, 1, &n));
            for (uint32_t r = 0; n && r < S.world; r++)
                CHECK(S.tcont[t][r][d] == tag(k.hash, r),
                      "tier %u block %u is findable but rank %u holds other contents", t, d, r);
        }
    kvt_offload_stats st;
    kvt_offload_get_stats(S.m, &st);
    CHECK(st.stale_reports == 0, "%llu stale reports", (unsigned long long)st.stale_reports);
}

/* ---- episode --------------------------------------------------------------------------- */

static void step(uint64_t *rng)
{
    g_step++;
    if (kvt_test_below(rng, 3) == 0)
        new_request(rng);
    /* preempt a running request now and then (recompute, as vLLM v1 does) */
    bool preempted = false;
    if (kvt_test_below(rng, 25) == 0) {
        struct req *r = &S.reqs[kvt_test_below(rng, MAXR)];
        if (r->used && r->state == R_RUNNING) {
            release_blocks(r);
            r->computed = 0;
            r->state = R_WAITING;
            r->resumed = true;
            preempted = true;
        }
    }
    for (uint32_t i = 0; i < MAXR; i++)
        if (S.reqs[i].used && S.reqs[i].state == R_WAITING)
            admit(&S.reqs[i], rng);
    /* schedule running requests: a prefill chunk or one decode token */
    uint32_t sched[MAXR] = {0};
    for (uint32_t i = 0; i < MAXR; i++) {
        struct req *r = &S.reqs[i];
        if (!r->used || r->state != R_RUNNING || r->computed >= r->max_tokens)
            continue;
        uint32_t t;
        if (r->computed < r->n_tokens) {
            t = r->n_tokens - r->computed;
            uint32_t chunk = BS + kvt_test_below(rng, 3 * BS);
            if (t > chunk)
                t = chunk;
        } else {
            if (r->n_tokens / BS >= r->n_blocks) { /* the new token needs a new block */
                if (!engine_alloc(1, &r->blocks[r->n_blocks]))
                    continue; /* no room this step */
                r->n_blocks++;
            }
            r->tokens[r->n_tokens++] = 60000 + kvt_test_below(rng, 1000);
            if (r->n_tokens % BS == 0) {
                uint32_t j = r->n_tokens / BS - 1;
                KVT_OK_(kvt_hash_block(HASH_SEED, j ? r->hashes + (j - 1) * HL : NULL,
                                       r->tokens + j * BS, BS, NULL, 0, r->hashes + j * HL));
            }
            t = 1;
        }
        const uint32_t *tab[1] = {r->blocks};
        uint32_t nb[1] = {r->n_blocks};
        if (S.ext) { /* returns the blocks it left for later: never more than confirmed */
            g_ops++;
            int left = kvt_offload_schedule_hashed(S.m, r->id, r->id_len, tab, nb, r->hashes,
                                                   full_hashes(r), r->computed, t, r->resumed);
            CHECK(left >= 0 && (uint32_t)left <= r->computed / BS, "schedule_hashed -> %d: %s",
                  left, kvt_last_error());
        } else
            CALL(kvt_offload_schedule(S.m, r->id, r->id_len, tab, nb, r->computed, t, r->resumed));
        r->resumed = false;
        sched[i] = t;
    }
    CALL(kvt_offload_build_meta(S.m, preempted, &S.meta));
    KVT_OK_(kvt_offload_meta_validate(&S.meta));
    CHECK(S.meta.need_flush == preempted, "need_flush");
    record_events();
    check_refs();
    run_workers(S.meta.need_flush, rng);
    for (uint32_t i = 0; i < MAXR; i++)
        if (sched[i] && S.reqs[i].used)
            compute(&S.reqs[i], sched[i]);
    deliver(false);
    check_findable_data();
    /* finishes and aborts */
    for (uint32_t i = 0; i < MAXR; i++) {
        struct req *r = &S.reqs[i];
        if (!r->used)
            continue;
        bool done = r->state == R_RUNNING && r->computed >= r->max_tokens;
        if (done && r->n_tokens + 41 <= MAXB * BS) { /* remember it for a later turn */
            uint32_t h = kvt_test_below(rng, 8);
            memcpy(S.hist[h], r->tokens, r->n_tokens * sizeof(uint32_t));
            S.hist_len[h] = r->n_tokens;
        }
        if (done || kvt_test_below(rng, 150) == 0)
            finish(r);
    }
    /* (a reset cancels queued loads, which the engine is not told about: this engine resets
     * only while no request waits for one; promotions in flight are fine) */
    bool load_queued = false;
    for (uint32_t i = 0; i < MAXR; i++)
        load_queued |= S.reqs[i].n_hold && !S.reqs[i].promo_left;
    if (!load_queued && (S.reset_pending || kvt_test_below(rng, 600) == 0)) {
        g_ops++;
        /* clear empties the tiers at once, reset waits for the workers */
        bool clear = kvt_test_below(rng, 2);
        int rc = clear ? kvt_offload_clear(S.m) : kvt_offload_reset(S.m);
        CHECK(rc == 0 || rc == KVT_EBUSY, "%s returned %d", clear ? "clear" : "reset", rc);
        g_clears += clear && rc == 0;
        if (rc == 0)
            check_tiers_empty(clear ? "clear" : "reset");
        S.reset_pending = rc == KVT_EBUSY;
    } else if (kvt_test_below(rng, 500) == 0) {
        release_engine_blocks();
    }
    CHECK(S.n_ev < MAX_EV - 8, "harness event capacity");
}

static void episode(uint64_t *rng, uint64_t ops_goal)
{
    memset(&S, 0, sizeof(S));
    S.gpu_nb = 48 + kvt_test_below(rng, MAX_GPU - 48 + 1);
    S.host_nb = 8 + kvt_test_below(rng, MAX_HOST - 8 + 1);
    S.world = 1 + kvt_test_below(rng, MAX_RANKS);
    S.lazy = kvt_test_below(rng, 2);
    /* the chain: the host alone in a quarter of the episodes, else one to three tiers behind */
    S.tiers = 1 + kvt_test_below(rng, MAX_TIERS);
    for (uint32_t t = 1; t < S.tiers; t++)
        S.tnb[t] = 4 + kvt_test_below(rng, MAX_DISK - 4 + 1);
    bool disk_by_config = kvt_test_below(rng, 2);
    for (uint32_t p = 0; p < 4; p++)
        for (uint32_t t = 0; t < 6 * BS; t++)
            S.prefixes[p][t] = 1000 * (p + 1) + t;
    kvt_pool_config pc;
    kvt_pool_config_init(&pc);
    pc.num_blocks = S.gpu_nb;
    KVT_OK_(kvt_pool_create(&pc, &S.gpu));
    kvt_offload_config oc;
    kvt_offload_config_init(&oc);
    oc.host_blocks = S.host_nb;
    oc.world_size = S.world;
    oc.lazy = S.lazy;
    oc.max_batched_tokens = BS * (1 + kvt_test_below(rng, 4));
    uint32_t budgets[3] = {0, 2, 256};
    oc.restore_budget = budgets[kvt_test_below(rng, 3)];
    oc.max_requests = MAXR + 4;
    oc.disk_blocks = S.tiers > 1 && disk_by_config ? S.tnb[1] : 0;
    S.ext = kvt_test_below(rng, 2);
    /* the harness frees no GPU block between its schedule calls and build_meta */
    oc.defer_schedule_pins = S.ext && kvt_test_below(rng, 2);
    bool with_lookup = S.ext && kvt_test_below(rng, 2);
    if (S.ext) {
        kvt_gpu_pool_ops ops = {cb_touch, cb_free, cb_lru_scan, with_lookup ? cb_lookup : NULL};
        KVT_OK_(kvt_offload_create_ext(&oc, &pc, &ops, NULL, &S.m));
    } else {
        KVT_OK_(kvt_offload_create(&oc, S.gpu, &S.m));
    }
    for (uint32_t t = oc.disk_blocks ? 2 : 1; t < S.tiers; t++) {
        char name[16];
        uint32_t idx;
        snprintf(name, sizeof(name), "t%u", t);
        KVT_OK_(kvt_offload_add_tier(S.m, name, S.tnb[t], &idx));
        CHECK(idx == t, "tier %s added at %u", name, idx);
    }
    CHECK(kvt_offload_num_tiers(S.m) == S.tiers, "%u tiers", kvt_offload_num_tiers(S.m));
    S.host = kvt_offload_host_pool(S.m);
    for (uint32_t t = 1; t < S.tiers; t++)
        S.tp[t] = kvt_offload_tier_pool(S.m, t);
    kvt_offload_meta_init(&S.meta);
    kvt_offload_worker_meta_init(&S.wm);

    uint64_t start = g_ops;
    while (g_ops - start < ops_goal && S.n_ev < MAX_EV - 64)
        step(rng);

    /* drain: finish everything, let the workers and reports catch up, reset until done */
    for (uint32_t i = 0; i < MAXR; i++)
        if (S.reqs[i].used)
            finish(&S.reqs[i]);
    /* (lazy stores and re-stores keep coming while the GPU holds unstored blocks, and every
     * host store completed queues a write-back: a few rounds, until nothing is pending) */
    for (int round = 0; round < 8 || (round < 64 && kvt_offload_has_pending(S.m)); round++) {
        g_step++;
        CALL(kvt_offload_build_meta(S.m, false, &S.meta));
        record_events();
        check_refs();
        run_workers(true, rng);
        deliver(true);
        check_findable_data();
    }
    if (kvt_offload_has_pending(S.m)) {
        kvt_offload_stats ps;
        kvt_offload_get_stats(S.m, &ps);
        CHECK(false,
              "transfers still pending after draining: %u load, %u store events, %u store "
              "blocks (tier 1: %u promotion, %u write-back events)",
              ps.load_events_in_flight, ps.store_events_in_flight, ps.pending_store_blocks,
              ps.disk_load_events_in_flight, ps.disk_store_events_in_flight);
    }
    CALL(kvt_offload_reset(S.m));
    kvt_offload_stats st;
    kvt_offload_get_stats(S.m, &st);
    CHECK(!S.ext || S.cb_calls <= S.cb_blocks, "callback calls");
    g_ext_calls += S.cb_calls;
    g_ext_blocks += S.cb_blocks;
    CHECK(st.requests == 0, "%u requests still tracked", st.requests);
    CHECK(st.hit_requests == S.hit_matches, "hit_requests %llu, matches that offered a hit %llu",
          (unsigned long long)st.hit_requests, (unsigned long long)S.hit_matches);
    g_tot.hit_tokens += st.hit_tokens;
    g_tot.load_blocks += st.load_blocks;
    g_tot.store_blocks += st.store_blocks;
    g_tot.stores_abandoned += st.stores_abandoned;
    g_tot.host_evictions += st.host_evictions;
    g_tot.restores += st.restores;
    g_tot.resets += st.resets;
    g_tot.store_dropped_full += st.store_dropped_full;
    g_tot.stores_failed += st.stores_failed;
    g_tot.promotions += st.promotions;
    g_tot.promotions_failed += st.promotions_failed;
    g_chains[S.tiers - 1]++;
    for (uint32_t t = 1; t < S.tiers; t++) {
        kvt_tier_stats ts;
        KVT_OK_(kvt_offload_get_tier_stats(S.m, t, &ts));
        g_behind.hit_tokens += ts.hit_tokens;
        g_behind.stores_completed += ts.stores_completed;
        g_behind.stores_failed += ts.stores_failed;
        g_behind.store_dropped += ts.store_dropped;
        g_behind.load_events += ts.load_events;
        CHECK(ts.store_blocks == ts.stores_completed + ts.stores_abandoned + ts.stores_failed,
              "tier %u store blocks unbalanced", t);
        CHECK(kvt_pool_num_free(S.tp[t]) == S.tnb[t] - 1, "tier %u pool not fully free", t);
    }
    CHECK(st.store_blocks == st.stores_completed + st.stores_abandoned + st.stores_failed,
          "store blocks unbalanced");
    CHECK(st.load_blocks == st.loads_completed, "load blocks unbalanced");
    CHECK(kvt_pool_num_free(S.gpu) == S.gpu_nb - 1, "GPU pool not fully free: %u of %u",
          kvt_pool_num_free(S.gpu), S.gpu_nb - 1);
    CHECK(kvt_pool_num_free(S.host) == S.host_nb - 1, "host pool not fully free");
    check_refs();
    kvt_offload_meta_release(&S.meta);
    kvt_offload_worker_meta_release(&S.wm);
    kvt_offload_destroy(S.m);
    kvt_pool_destroy(S.gpu);
}

static void manager_keeps_every_invariant_under_random_traffic(void **state)
{
    (void)state;
    g_seed = kvt_test_seed();
    uint64_t rng = g_seed, goal = (uint64_t)(200000 * kvt_test_scale());
    uint32_t episodes = 0;
    g_ops = g_releases = g_clears = 0;
    g_ext_calls = g_ext_blocks = 0;
    memset(&g_tot, 0, sizeof(g_tot));
    memset(&g_behind, 0, sizeof(g_behind));
    memset(g_chains, 0, sizeof(g_chains));
    g_spans = 0;
    while (g_ops < goal) {
        episode(&rng, 5000 + kvt_test_below(&rng, 20000));
        episodes++;
    }
    print_message(
        "offload model: %llu manager calls in %u episodes, %llu steps (seed %llu): "
        "%llu hit tokens, %llu blocks loaded, %llu stored (%llu abandoned, %llu failed), %llu "
        "host evictions, %llu re-stores, %llu stores dropped for room, %llu resets (%llu "
        "clears), %llu engine block releases; chains of 1/2/3/4 tiers in %u/%u/%u/%u episodes: "
        "%llu hit tokens behind the host, %llu promoted (%llu failed) in %llu events, %llu "
        "requests out of two tiers or more, %llu "
        "written back (%llu failed, %llu dropped); engine-pool episodes: %llu callbacks for "
        "%llu blocks\n",
        (unsigned long long)g_ops, episodes, (unsigned long long)g_step, (unsigned long long)g_seed,
        (unsigned long long)g_tot.hit_tokens, (unsigned long long)g_tot.load_blocks,
        (unsigned long long)g_tot.store_blocks, (unsigned long long)g_tot.stores_abandoned,
        (unsigned long long)g_tot.stores_failed, (unsigned long long)g_tot.host_evictions,
        (unsigned long long)g_tot.restores, (unsigned long long)g_tot.store_dropped_full,
        (unsigned long long)g_tot.resets, (unsigned long long)g_clears,
        (unsigned long long)g_releases, g_chains[0], g_chains[1], g_chains[2], g_chains[3],
        (unsigned long long)g_behind.hit_tokens, (unsigned long long)g_tot.promotions,
        (unsigned long long)g_tot.promotions_failed, (unsigned long long)g_behind.load_events,
        (unsigned long long)g_spans, (unsigned long long)g_behind.stores_completed,
        (unsigned long long)g_behind.stores_failed, (unsigned long long)g_behind.store_dropped,
        (unsigned long long)g_ext_calls, (unsigned long long)g_ext_blocks);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(manager_keeps_every_invariant_under_random_traffic),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
