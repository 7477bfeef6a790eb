/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The reference engine's scheduler loop and ranks (engine.h).
 *
 * One step:
 *   1. remote images: drain the shards' readiness events, take each embedding into the
 *      engine's encoder cache, compare it with the local encoder's, retire it;
 *   2. schedule: running requests first (a decode token or the next prefill chunk, blocks
 *      allocated as needed; when none are left the newest running request is preempted),
 *      then waiting ones: GPU prefix hit, host-tier hit (kvt_offload_match); a host hit is
 *      loaded asynchronously and the request waits for it; eager stores are selected
 *      (kvt_offload_schedule) and the step's transfer metadata built (kvt_offload_build_meta);
 *   3. the ranks (threads) bind the metadata to their workers, run the forward together,
 *      launch the step's copies and report; the scheduler aggregates the reports across
 *      ranks (a load is finished when every rank says so; store counts add up);
 *   4. outputs: sampled tokens appended, full blocks cached in the GPU pool, finished
 *      requests handed to kvt_offload_request_finished and their blocks freed.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "kvtier/base.h"
#include "engine.h"
#include "kvtier/kvtier.h"

enum { RQ_WAITING, RQ_LOADING, RQ_RUNNING, RQ_DONE };

struct req {
    char id[64];
    uint32_t idlen;
    uint32_t *tok, n_prompt, len, cap, max_new;
    ref_image_ref *imgs;
    int32_t *img_slot; /* per image: index into the engine's image table */
    uint32_t n_imgs;
    uint8_t *hashes; /* full blocks of tok[0..len) */
    uint32_t n_hashed;
    uint32_t *blocks, n_blocks, blocks_cap;
    uint32_t *sw; /* hybrid: the windowed layers' table (n_blocks entries; KVT_NULL_BLOCK behind
                     the window) */
    uint32_t computed, cached; /* tokens whose KV is in place; blocks cached in the pool */
    uint32_t load_tokens;      /* host-hit tokens being loaded */
    uint32_t verified;         /* blocks below this were checked as loaded (not recorded) */
    uint32_t load_reports;
    int state;
    bool resumed, admitted_once;
    double t_arrive, t_first, t_load;
    uint32_t gpu_hit, host_hit, prefilled, preemptions;
};

struct image {
    char hash[33];
    uint32_t id;
    float *local;  /* the local encoder's output (always computed: used, or to check) */
    float **rank;  /* remote: each rank's received copy */
    uint32_t have; /* remote: ranks that received it */
    double t_need;
};

struct rank_out {
    kvt_str *fin; /* max_running: every request with a load in flight counts as running */
    uint32_t n_fin;
    uint32_t invalid;
    int rc;
    char err[256];
};

struct ref_engine {
    ref_engine_config cfg;
    uint32_t tp, max_tok;
    uint32_t ng; /* KV-cache groups: 1, or 2 for a hybrid model (full + sliding window) */
    kvt_pool *gpu;
    kvt_offload *off;
    kvt_offload_meta meta;
    kvt_offload_worker_meta agg;
    /* ranks */
    ref_shared *shared;
    ref_rank **rank;
    ref_kv *kv;
    kvt_layout **layout;
    kvt_mirror **mirror;
    kvt_worker **worker;
    kvt_offload_worker_meta *wm;
    struct rank_out *out;
    kvt_str *loads_done; /* loads every rank finished, this step */
    pthread_t *thr;
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    uint64_t gen;
    uint32_t n_done;
    bool stop, threads_up;
    ref_batch batch;
    bool preempted_this_step;
    /* batch storage */
    uint32_t *btok;
    const float **bemb;
    ref_seq *bseq;
    struct req **bseq_req;
    uint32_t *sampled;
    /* requests */
    struct req **q; /* all live requests, arrival order */
    uint32_t n_q, cap_q;
    ref_result *fin;
    uint32_t n_fin, cap_fin;
    /* images */
    ref_encoder *enc;
    struct image *img;
    uint32_t n_img, cap_img;
    /* remote images */
    kvt_ec_shard **shard;
    void **shard_buf;
    kvt_ec_server **srv;
    void *zctx, *pull;
    /* the KV check: block hash -> checksum of its KV on every rank (open addressing, grows) */
    struct kv_sum *sums;
    uint32_t sums_cap, sums_n;
    bool injected;         /* REF_INJECT_CORRUPT / SWAP: done once */
    struct drop_ev *drops; /* REF_INJECT_DROP: store events in flight and their host blocks */
    uint32_t n_drops;
    ref_engine_stats st;
};

struct drop_ev {
    int64_t id;
    uint32_t n;
    uint32_t *blocks;
};

struct kv_sum {
    uint8_t hash[KVT_BLOCK_HASH_LEN];
    bool used;
    uint64_t *per_rank; /* tp checksums */
};

static double now_s(void)
{
    return (double)kvt_monotonic_ns() * 1e-9;
}

static int fail(char *err, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, cap, fmt, ap);
    va_end(ap);
    return -1;
}

void ref_engine_config_init(ref_engine_config *c)
{
    memset(c, 0, sizeof(*c));
    ref_config_default(&c->model);
    c->gpu_blocks = 512;
    c->max_batched_tokens = 512;
    c->max_running = 8;
    c->max_len = 8192;
    c->ec_port = 27000;
    c->image_seed = 7;
    c->hash_seed = 0x6b7674;
}

/* ---- ranks --------------------------------------------------------------------------------- */

struct rank_arg {
    ref_engine *e;
    uint32_t r;
};

static void rank_step(ref_engine *e, uint32_t r)
{
    struct rank_out *o = &e->out[r];
    o->n_fin = 0;
    o->invalid = 0;
    o->rc = 0;
    kvt_worker *w = e->worker ? e->worker[r] : NULL;
    int rc = 0;
    if (w) {
        rc = kvt_worker_bind(w, &e->meta);
        if (!rc)
            rc = kvt_worker_handle_preemptions(w);
    }
    /* every rank runs the forward, even after a failed bind: the others wait at its barriers */
    if (e->batch.n_tok)
        ref_rank_forward(e->rank[r], &e->kv[r], &e->batch);
    if (w && !rc) {
        const kvt_str *fin;
        uint32_t n;
        if (!e->batch.n_tok) /* nothing to compute: let the copies finish instead of spinning */
            rc = kvt_worker_flush(w);
        if (!rc)
            rc = kvt_worker_get_finished(w, NULL, &fin, &n);
        if (!rc && n > e->cfg.max_running)
            rc = kvt_fail(KVT_ELIMIT,
                          "%u finished loads reported in one step, at most %u "
                          "requests run",
                          n, e->cfg.max_running);
        for (uint32_t i = 0; !rc && i < n; i++)
            o->fin[o->n_fin++] = fin[i];
        if (!rc)
            rc = kvt_worker_build_meta(w, &e->wm[r]);
        uint32_t bad[64];
        if (!rc)
            o->invalid = kvt_worker_take_invalid_blocks(w, bad, 64);
        kvt_worker_clear(w);
    }
    if (rc) {
        o->rc = rc;
        snprintf(o->err, sizeof(o->err), "rank %u: %s", r, kvt_last_error());
    }
}

static void *rank_main(void *p)
{
    struct rank_arg *a = p;
    ref_engine *e = a->e;
    uint32_t r = a->r;
    free(a);
    uint64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&e->mu);
        while (e->gen == seen && !e->stop)
            pthread_cond_wait(&e->go, &e->mu);
        if (e->stop) {
            pthread_mutex_unlock(&e->mu);
            return NULL;
        }
        seen = e->gen;
        pthread_mutex_unlock(&e->mu);
        rank_step(e, r);
        pthread_mutex_lock(&e->mu);
        if (++e->n_done == e->tp)
            pthread_cond_signal(&e->done);
        pthread_mutex_unlock(&e->mu);
    }
}

static void run_ranks(ref_engine *e)
{
    pthread_mutex_lock(&e->mu);
    e->n_done = 0;
    e->gen++;
    pthread_cond_broadcast(&e->go);
    while (e->n_done < e->tp)
        pthread_cond_wait(&e->done, &e->mu);
    pthread_mutex_unlock(&e->mu);
}

/* ---- images -------------------------------------------------------------------------------- */

static int image_slot(ref_engine *e, uint32_t id)
{
    for (uint32_t i = 0; i < e->n_img; i++)
        if (e->img[i].id == id)
            return (int)i;
    if (e->n_img == e->cap_img) {
        uint32_t nc = e->cap_img ? 2 * e->cap_img : 16;
        struct image *n = realloc(e->img, nc * sizeof(*n));
        if (!n)
            return -1;
        e->img = n;
        e->cap_img = nc;
    }
    struct image *im = &e->img[e->n_img];
    memset(im, 0, sizeof(*im));
    im->id = id;
    uint8_t px[REF_IMG_BYTES];
    ref_image_pixels(e->cfg.image_seed, id, px);
    ref_image_hash(px, im->hash);
    /* computed when the image is first seen: the model's input, or (remote) what every
     * received copy is checked against */
    im->local = malloc(ref_embedding_bytes(&e->cfg.model));
    im->rank = e->cfg.remote_images ? calloc(e->tp, sizeof(float *)) : NULL;
    if (!im->local || (e->cfg.remote_images && !im->rank)) {
        free(im->local);
        free(im->rank);
        return -1;
    }
    ref_encoder_run(e->enc, px, im->local);
    e->st.images_encoded += !e->cfg.remote_images;
    im->t_need = -1;
    return (int)e->n_img++;
}

int ref_engine_register_image(ref_engine *e, uint32_t id)
{
    return image_slot(e, id) < 0 ? -1 : 0;
}

static bool image_ready(ref_engine *e, const struct image *im)
{
    return !e->cfg.remote_images || im->have == (1u << e->tp) - 1;
}

/* The embedding rank 0 feeds the model (its own received copy when remote). */
static const float *image_data(ref_engine *e, const struct image *im)
{
    return e->cfg.remote_images ? im->rank[0] : im->local;
}

struct take_arg {
    ref_engine *e;
    const kvt_ec_ready_event *ev;
    float *dst;
    uint64_t want;
    int got;
};

static int take_copy_retire(kvt_ec_shard *sh, void *p)
{
    struct take_arg *a = p;
    kvt_slab_view v;
    int rc = kvt_ec_shard_take(sh, a->ev->transfer_id, (uint32_t)strlen(a->ev->transfer_id),
                               a->ev->mm_hash, (uint32_t)strlen(a->ev->mm_hash), NULL, &v);
    if (rc)
        return rc;
    a->got = v.nbytes == a->want;
    if (a->got)
        memcpy(a->dst, v.ptr, a->want);
    return kvt_ec_shard_retire(sh, a->ev->mm_hash, (uint32_t)strlen(a->ev->mm_hash), NULL) == 1
               ? 0
               : KVT_ESTATE;
}

static int drain_images(ref_engine *e, char *err, size_t cap)
{
    uint8_t m[2048];
    int n;
    while ((n = zmq_recv(e->pull, m, sizeof(m), ZMQ_DONTWAIT)) > 0) {
        kvt_ec_ready_event ev;
        uint32_t shard;
        if (kvt_ec_event_decode(m, (size_t)n, &ev, &shard) != 0 || shard >= e->tp || ev.abandoned)
            continue;
        struct image *im = NULL;
        for (uint32_t i = 0; i < e->n_img && !im; i++)
            if (strlen(ev.mm_hash) == 32 && memcmp(e->img[i].hash, ev.mm_hash, 32) == 0)
                im = &e->img[i];
        uint64_t want = ref_embedding_bytes(&e->cfg.model);
        float *dst = malloc(want);
        struct take_arg a = {e, &ev, dst, want, 0};
        int rc = dst ? kvt_ec_server_with_shard(e->srv[shard], take_copy_retire, &a) : -1;
        if (rc == 0 && im && a.got && !(im->have & (1u << shard))) {
            e->st.images_received++;
            e->st.image_bytes_received += want;
            if (memcmp(dst, im->local, want) != 0)
                e->st.image_mismatches++;
            im->rank[shard] = dst;
            im->have |= 1u << shard;
            if (image_ready(e, im) && im->t_need >= 0)
                e->st.image_wait_s += now_s() - im->t_need;
            dst = NULL;
        } else if (rc == 0 && (!im || !a.got)) {
            e->st.image_mismatches++; /* an item nobody asked for, or of the wrong size */
        }
        free(dst);
        if (rc && rc != KVT_ENOENT) {
            fail(err, cap, "encoder cache: taking %s from shard %u failed: %s", ev.mm_hash, shard,
                 kvt_last_error());
            return -1;
        }
    }
    return 0;
}

/* ---- requests ------------------------------------------------------------------------------ */

static void req_free(struct req *r)
{
    if (!r)
        return;
    free(r->tok);
    free(r->imgs);
    free(r->img_slot);
    free(r->hashes);
    free(r->blocks);
    free(r->sw);
    free(r);
}

static int reserve_blocks(ref_engine *e, struct req *r, uint32_t n)
{
    if (n <= r->blocks_cap)
        return 0;
    uint32_t nc = n + 16;
    uint32_t *b = realloc(r->blocks, nc * sizeof(*b));
    if (!b)
        return -1;
    r->blocks = b;
    if (e->ng == 2) {
        if (!(b = realloc(r->sw, nc * sizeof(*b))))
            return -1;
        r->sw = b;
    }
    r->blocks_cap = nc;
    return 0;
}

/* r's block tables as kvtier takes them, one per KV-cache group. */
static const uint32_t *const *tables(const ref_engine *e, const struct req *r, const uint32_t **tab,
                                     uint32_t *nb)
{
    tab[0] = r->blocks;
    nb[0] = r->n_blocks;
    if (e->ng == 2) {
        tab[1] = r->sw;
        nb[1] = r->n_blocks;
    }
    return tab;
}

/* Hybrid: whether block j is wholly before the window of position pos (no token from pos on
 * sees it). */
static bool behind_window(const ref_engine *e, uint32_t j, uint32_t pos)
{
    return (j + 1) * REF_BT + e->cfg.model.window - 1 <= pos;
}

/* Hybrid: as vLLM, the windowed group's blocks that no later token can see (behind the
 * window of position `computed`) are freed and nulled; they stay cached in the pool until
 * reused. */
static void drop_behind(ref_engine *e, struct req *r)
{
    for (uint32_t j = 0; e->ng == 2 && j < r->n_blocks; j++)
        if (behind_window(e, j, r->computed) && r->sw[j] != KVT_NULL_BLOCK) {
            kvt_pool_free(e->gpu, &r->sw[j], 1);
            r->sw[j] = KVT_NULL_BLOCK;
        }
}

/* Extends the chained hashes to every full block of tok[0..len); a block that holds image
 * placeholders carries those images' mm_hash as extra bytes. */
static int hash_blocks(ref_engine *e, struct req *r)
{
    uint32_t full = r->len / REF_BT;
    for (uint32_t b = r->n_hashed; b < full; b++) {
        char extra[33 * 8];
        size_t xl = 0;
        for (uint32_t i = 0; i < r->n_imgs && xl + 32 <= sizeof(extra); i++) {
            uint32_t p0 = r->imgs[i].pos, p1 = p0 + REF_IMG_TOKENS;
            if (p0 < (b + 1) * REF_BT && p1 > b * REF_BT) {
                memcpy(extra + xl, e->img[r->img_slot[i]].hash, 32);
                xl += 32;
            }
        }
        const uint8_t *parent = b ? r->hashes + (size_t)(b - 1) * KVT_BLOCK_HASH_LEN : NULL;
        if (kvt_hash_block(e->cfg.hash_seed, parent, r->tok + (size_t)b * REF_BT, REF_BT,
                           xl ? extra : NULL, xl, r->hashes + (size_t)b * KVT_BLOCK_HASH_LEN))
            return -1;
    }
    r->n_hashed = full;
    return 0;
}

int ref_engine_add(ref_engine *e, const ref_request_spec *s, char *err, size_t cap)
{
    size_t idl = s->id ? strlen(s->id) : 0;
    if (!idl || idl >= sizeof(((struct req *)0)->id))
        return fail(err, cap, "request id must be 1..63 characters");
    if (!s->n_tokens || !s->max_new || s->n_tokens + s->max_new > e->cfg.max_len)
        return fail(err, cap, "request %s: %u prompt + %u new tokens: must be 1..%u", s->id,
                    s->n_tokens, s->max_new, e->cfg.max_len);
    uint32_t need_blocks = (s->n_tokens + s->max_new + REF_BT - 1) / REF_BT * e->ng;
    if (need_blocks > e->cfg.gpu_blocks - 1)
        return fail(err, cap, "request %s needs %u KV blocks; the GPU tier has %u", s->id,
                    need_blocks, e->cfg.gpu_blocks - 1);
    for (uint32_t i = 0; i < s->n_tokens; i++)
        if (s->tokens[i] >= e->cfg.model.vocab)
            return fail(err, cap, "request %s: token %u out of range", s->id, s->tokens[i]);
    for (uint32_t i = 0; i < s->n_images; i++) {
        uint32_t p = s->images[i].pos;
        if (p + REF_IMG_TOKENS > s->n_tokens)
            return fail(err, cap, "request %s: image %u at %u runs past the prompt", s->id, i, p);
        for (uint32_t k = p; k < p + REF_IMG_TOKENS; k++)
            if (s->tokens[k] != ref_img_token(&e->cfg.model))
                return fail(err, cap, "request %s: image %u: position %u is no placeholder", s->id,
                            i, k);
    }
    if (e->n_q == e->cap_q) {
        uint32_t nc = e->cap_q ? 2 * e->cap_q : 64;
        struct req **n = realloc(e->q, nc * sizeof(*n));
        if (!n)
            return fail(err, cap, "out of memory");
        e->q = n;
        e->cap_q = nc;
    }
    struct req *r = calloc(1, sizeof(*r));
    uint32_t total = s->n_tokens + s->max_new;
    if (r) {
        r->tok = malloc(total * sizeof(uint32_t));
        r->hashes = malloc((size_t)(total / REF_BT + 1) * KVT_BLOCK_HASH_LEN);
        r->imgs = malloc((s->n_images + 1) * sizeof(*r->imgs));
        r->img_slot = malloc((s->n_images + 1) * sizeof(int32_t));
    }
    if (!r || !r->tok || !r->hashes || !r->imgs || !r->img_slot) {
        req_free(r);
        return fail(err, cap, "out of memory");
    }
    memcpy(r->id, s->id, idl + 1);
    r->idlen = (uint32_t)idl;
    memcpy(r->tok, s->tokens, s->n_tokens * sizeof(uint32_t));
    r->n_prompt = r->len = s->n_tokens;
    r->cap = total;
    r->max_new = s->max_new;
    r->n_imgs = s->n_images;
    if (s->n_images)
        memcpy(r->imgs, s->images, s->n_images * sizeof(*r->imgs));
    for (uint32_t i = 0; i < s->n_images; i++)
        if ((r->img_slot[i] = image_slot(e, s->images[i].image)) < 0) {
            req_free(r);
            return fail(err, cap, "out of memory");
        }
    r->state = RQ_WAITING;
    r->t_arrive = now_s();
    e->q[e->n_q++] = r;
    return 0;
}

/* ---- scheduling ---------------------------------------------------------------------------- */

static int off_check(int rc, const char *what, char *err, size_t cap)
{
    return rc ? fail(err, cap, "%s: %s (%s)", what, kvt_strerror(rc), kvt_last_error()) : 0;
}

static void free_blocks(ref_engine *e, struct req *r)
{
    for (uint32_t i = 0; i < r->n_blocks / 2; i++) { /* tail first: evicted first */
        uint32_t t = r->blocks[i];
        r->blocks[i] = r->blocks[r->n_blocks - 1 - i];
        r->blocks[r->n_blocks - 1 - i] = t;
    }
    if (r->n_blocks)
        kvt_pool_free(e->gpu, r->blocks, r->n_blocks);
    for (uint32_t j = r->n_blocks; e->ng == 2 && j-- > 0;)
        if (r->sw[j] != KVT_NULL_BLOCK)
            kvt_pool_free(e->gpu, &r->sw[j], 1);
    r->n_blocks = 0;
}

/* Recompute-style preemption: the request gives its blocks back and starts over later. */
static int preempt(ref_engine *e, struct req *v, char *err, size_t cap)
{
    if (e->off) {
        const uint32_t *tab[2];
        uint32_t nb[2];
        /* its confirmed blocks are flushed to the host tier before the blocks are reused */
        if (off_check(kvt_offload_request_finished_hashed(e->off, v->id, v->idlen,
                                                          tables(e, v, tab, nb), nb, v->hashes,
                                                          v->n_hashed, v->computed),
                      "request_finished (preemption)", err, cap))
            return -1;
    }
    free_blocks(e, v);
    v->computed = 0;
    v->cached = 0;
    v->state = RQ_WAITING;
    v->resumed = true;
    v->preemptions++;
    e->st.preemptions++;
    e->preempted_this_step = true;
    return 0;
}

/* Grows r's block table to cover n tokens. In the running pass (may_preempt) it preempts the
 * newest running request after r (not batched yet) while the pool is short, and r itself when
 * there is none. 1 if r could not grow (preempted, or no room), 0 if done, -1 on error. */
static int grow(ref_engine *e, struct req *r, uint32_t n_tokens, bool may_preempt, char *err,
                size_t cap)
{
    uint32_t need = (n_tokens + REF_BT - 1) / REF_BT;
    if (need <= r->n_blocks)
        return 0;
    uint32_t more = need - r->n_blocks;
    while (kvt_pool_num_free(e->gpu) < more * e->ng) {
        if (!may_preempt)
            return 1;
        struct req *v = NULL;
        for (uint32_t i = e->n_q; i-- > 0 && !v && e->q[i] != r;)
            if (e->q[i]->state == RQ_RUNNING)
                v = e->q[i];
        if (preempt(e, v ? v : r, err, cap))
            return -1;
        if (!v)
            return 1;
    }
    if (reserve_blocks(e, r, need) ||
        off_check(kvt_pool_alloc(e->gpu, more, r->blocks + r->n_blocks), "alloc", err, cap) ||
        (e->ng == 2 &&
         off_check(kvt_pool_alloc(e->gpu, more, r->sw + r->n_blocks), "alloc", err, cap)))
        return -1;
    r->n_blocks = need;
    return 0;
}

static bool images_ready(ref_engine *e, struct req *r)
{
    bool ok = true;
    for (uint32_t i = 0; i < r->n_imgs; i++) {
        struct image *im = &e->img[r->img_slot[i]];
        if (!image_ready(e, im)) {
            if (im->t_need < 0)
                im->t_need = now_s();
            ok = false;
        }
    }
    return ok;
}

/* Adds r's next chunk (up to budget tokens) to the batch. */
static void add_chunk(ref_engine *e, struct req *r, uint32_t chunk)
{
    ref_batch *b = &e->batch;
    ref_seq *s = &e->bseq[b->n_seq];
    s->first = b->n_tok;
    s->n = chunk;
    s->start_pos = r->computed;
    s->blocks = r->blocks;
    s->sw_blocks = r->sw;
    s->sample = r->computed + chunk == r->len;
    for (uint32_t i = 0; i < chunk; i++) {
        uint32_t pos = r->computed + i;
        e->btok[b->n_tok + i] = r->tok[pos];
        e->bemb[b->n_tok + i] = NULL;
        for (uint32_t k = 0; k < r->n_imgs; k++)
            if (pos >= r->imgs[k].pos && pos < r->imgs[k].pos + REF_IMG_TOKENS)
                e->bemb[b->n_tok + i] = image_data(e, &e->img[r->img_slot[k]]) +
                                        (size_t)(pos - r->imgs[k].pos) * e->cfg.model.d_model;
    }
    e->bseq_req[b->n_seq] = r;
    b->n_seq++;
    b->n_tok += chunk;
}

/* Admits a waiting request: prefix hits, then either a load (it waits) or a run. 1 admitted
 * or loading, 0 not now (no room), -1 error. */
static int admit(ref_engine *e, struct req *r, uint32_t budget, char *err, size_t cap)
{
    if (hash_blocks(e, r))
        return fail(err, cap, "hashing failed: %s", kvt_last_error());
    uint32_t nfull = r->len / REF_BT, hit_ids[2][1024], ng = e->ng;
    /* room for a first chunk, before looking anything up */
    uint32_t free_blocks = kvt_pool_num_free(e->gpu);
    uint32_t first_chunk = r->len < budget ? r->len : budget;
    if (free_blocks < (first_chunk + REF_BT - 1) / REF_BT * ng)
        return 0;
    uint32_t *outs[2] = {hit_ids[0], hit_ids[1]};
    kvt_hit hit;
    uint32_t limit = nfull < 1024 ? nfull : 1024;
    if (off_check(kvt_pool_find_longest_hit(e->gpu, r->hashes, limit, r->len - 1, outs, &hit),
                  "find_longest_hit", err, cap))
        return -1;
    uint32_t nhit = hit.n_blocks[0], host = 0;
    if (e->off && off_check(kvt_offload_match(e->off, r->id, r->idlen, r->hashes, nfull, r->len,
                                              hit.length, &host),
                            "match", err, cap))
        return -1;
    /* accept as much of the host hit as fits (fewer tokens than offered is allowed); without
     * one, blocks for the hit and the first chunk */
    /* the hit blocks nobody holds leave the free queue when touched (a window group's hit
     * has null blocks where no later token looks) */
    uint32_t hit_free = 0, touch[2 * 1024], n_touch = 0;
    for (uint32_t g = 0; g < ng; g++)
        for (uint32_t i = 0; i < nhit; i++) {
            kvt_block_info bi;
            if (hit_ids[g][i] == KVT_NULL_BLOCK)
                continue;
            touch[n_touch++] = hit_ids[g][i];
            hit_free += kvt_pool_block_info(e->gpu, hit_ids[g][i], &bi) == 0 && bi.is_free;
        }
    uint32_t avail = free_blocks - hit_free, room = avail / ng; /* a block in every group */
    if (room == 0) /* its pinned host hit, if any, is released by the next match */
        return 0;
    /* A hybrid hit is taken whole or not at all (the window group's blocks before a shorter
     * end are not in it); as in vLLM, the window group gets no block where the loaded hit
     * needs none (wholly before the window of its end): those stay null. */
    if (ng == 2 && host) {
        uint32_t end = hit.length + host, nb = (end + REF_BT - 1) / REF_BT, want = nb - nhit;
        for (uint32_t j = nhit; j < nb; j++)
            want += !behind_window(e, j, end);
        if (want > avail)
            host = 0;
    } else if (host > room * REF_BT) {
        host = room * REF_BT;
    }
    uint32_t rest = r->len - hit.length;
    uint32_t first = host ? 0 : (rest < budget ? rest : budget);
    if (!host && (first + REF_BT - 1) / REF_BT > room)
        first = room * REF_BT;
    uint32_t need = (hit.length + host + first + REF_BT - 1) / REF_BT;
    if (reserve_blocks(e, r, need) ||
        off_check(kvt_pool_touch(e->gpu, touch, n_touch), "touch", err, cap))
        return -1;
    memcpy(r->blocks, hit_ids[0], nhit * sizeof(uint32_t));
    if (need > nhit &&
        off_check(kvt_pool_alloc(e->gpu, need - nhit, r->blocks + nhit), "alloc", err, cap))
        return -1;
    if (ng == 2) {
        memcpy(r->sw, hit_ids[1], nhit * sizeof(uint32_t));
        for (uint32_t j = nhit; j < need; j++) {
            bool behind = host && behind_window(e, j, hit.length + host);
            r->sw[j] = KVT_NULL_BLOCK;
            if (!behind && off_check(kvt_pool_alloc(e->gpu, 1, &r->sw[j]), "alloc", err, cap))
                return -1;
        }
    }
    r->n_blocks = need;
    r->cached = nhit;
    r->computed = hit.length;
    if (!r->admitted_once) {
        r->gpu_hit = hit.length;
        r->host_hit = host;
        e->st.gpu_hit_tokens += hit.length;
        e->st.host_hit_tokens += host;
        e->st.prompt_tokens += r->n_prompt;
        r->admitted_once = true;
    }
    if (e->off) {
        const uint32_t *tab[2];
        uint32_t nb[2];
        if (off_check(
                kvt_offload_after_alloc(e->off, r->id, r->idlen, tables(e, r, tab, nb), nb, host),
                "after_alloc", err, cap))
            return -1;
    }
    if (host) {
        r->state = RQ_LOADING;
        r->load_tokens = host;
        r->load_reports = 0;
        r->t_load = now_s();
        return 1;
    }
    r->state = RQ_RUNNING;
    return 1;
}

/* r's next chunk (or decode token) under the budget: blocks, eager stores, batch. 1 if it
 * could not run this step, 0 if added, -1 on error. */
static int run_chunk(ref_engine *e, struct req *r, uint32_t *budget, bool may_preempt, char *err,
                     size_t cap)
{
    uint32_t chunk = r->len - r->computed;
    chunk = chunk < *budget ? chunk : *budget;
    int g = grow(e, r, r->computed + chunk, may_preempt, err, cap);
    if (g)
        return g;
    if (e->off) {
        /* with the hashes: a window group's nulled blocks still cached are stored too */
        const uint32_t *tab[2];
        uint32_t nb[2];
        int left =
            kvt_offload_schedule_hashed(e->off, r->id, r->idlen, tables(e, r, tab, nb), nb,
                                        r->hashes, r->n_hashed, r->computed, chunk, r->resumed);
        if (off_check(left < 0 ? left : 0, "schedule", err, cap))
            return -1;
    }
    r->resumed = false;
    add_chunk(e, r, chunk);
    *budget -= chunk;
    return 0;
}

static int schedule(ref_engine *e, char *err, size_t cap)
{
    e->batch.n_tok = e->batch.n_seq = 0;
    e->preempted_this_step = false;
    uint32_t budget = e->cfg.max_batched_tokens, running = 0;
    /* running requests first, in arrival order: the next chunk or decode token each */
    for (uint32_t i = 0; i < e->n_q && budget; i++)
        if (e->q[i]->state == RQ_RUNNING && run_chunk(e, e->q[i], &budget, true, err, cap) < 0)
            return -1;
    /* then the waiting requests whose load finished: they hold blocks already, so they run
     * before any new request may take the blocks they need to finish */
    for (uint32_t i = 0; i < e->n_q && budget; i++) {
        struct req *r = e->q[i];
        if (r->state != RQ_WAITING || !r->n_blocks)
            continue;
        r->state = RQ_RUNNING;
        if (run_chunk(e, r, &budget, false, err, cap) < 0)
            return -1;
    }
    for (uint32_t i = 0; i < e->n_q; i++)
        running += e->q[i]->state == RQ_RUNNING || e->q[i]->state == RQ_LOADING;
    /* then new ones, first come first served, while there is room */
    for (uint32_t i = 0; i < e->n_q && budget && !e->preempted_this_step; i++) {
        struct req *r = e->q[i];
        if (r->state != RQ_WAITING || r->n_blocks || running >= e->cfg.max_running ||
            !images_ready(e, r))
            continue;
        int a = admit(e, r, budget, err, cap);
        if (a < 0)
            return -1;
        if (a == 0)
            break;
        running++;
        if (r->state != RQ_RUNNING)
            continue;
        int c = run_chunk(e, r, &budget, false, err, cap);
        if (c < 0)
            return -1;
    }
    return 0;
}

/* ---- outputs ------------------------------------------------------------------------------- */

static int finish(ref_engine *e, struct req *r, char *err, size_t cap)
{
    if (e->off) {
        const uint32_t *tab[2];
        uint32_t nb[2];
        if (off_check(kvt_offload_request_finished_hashed(e->off, r->id, r->idlen,
                                                          tables(e, r, tab, nb), nb, r->hashes,
                                                          r->n_hashed, r->computed),
                      "request_finished", err, cap))
            return -1;
    }
    free_blocks(e, r);
    if (e->n_fin == e->cap_fin) {
        uint32_t nc = e->cap_fin ? 2 * e->cap_fin : 64;
        ref_result *n = realloc(e->fin, nc * sizeof(*n));
        if (!n)
            return fail(err, cap, "out of memory");
        e->fin = n;
        e->cap_fin = nc;
    }
    ref_result *o = &e->fin[e->n_fin++];
    memset(o, 0, sizeof(*o));
    memcpy(o->id, r->id, r->idlen + 1);
    o->tokens = r->tok;
    r->tok = NULL;
    o->n_tokens = r->len;
    o->n_prompt = r->n_prompt;
    o->ttft_s = r->t_first - r->t_arrive;
    o->gpu_hit = r->gpu_hit;
    o->host_hit = r->host_hit;
    o->computed = r->prefilled;
    o->preemptions = r->preemptions;
    r->state = RQ_DONE;
    return 0;
}

/* ---- the KV check --------------------------------------------------------------------------- */

/* Checksum of block b of group g on rank r: the regions (a K and a V per layer) of the
 * layers that use the group's blocks, chained. */
static uint64_t kv_checksum(ref_engine *e, uint32_t r, uint32_t b, uint32_t g)
{
    const kvt_region *reg = kvt_layout_regions(e->layout[r]);
    uint64_t h = 0x6b76636b;
    for (uint32_t i = 0; i < kvt_layout_num_regions(e->layout[r]); i++)
        if (e->ng == 1 || ref_layer_windowed(&e->cfg.model, i / 2) == (g == 1))
            h = kvt_hash64(
                (const void *)(uintptr_t)(reg[i].base + (uint64_t)b * reg[i].block_bytes),
                reg[i].block_bytes, h);
    return h;
}

static struct kv_sum *kv_slot(ref_engine *e, const uint8_t *hash, bool add)
{
    if (add && (e->sums_n + 1) * 2 > e->sums_cap) { /* load factor <= 1/2 */
        uint32_t ncap = e->sums_cap ? e->sums_cap * 2 : 4096;
        struct kv_sum *n = calloc(ncap, sizeof(*n));
        if (!n)
            return NULL;
        for (uint32_t i = 0; i < e->sums_cap; i++) {
            if (!e->sums[i].used)
                continue;
            uint32_t j = (uint32_t)kvt_hash64(e->sums[i].hash, KVT_BLOCK_HASH_LEN, 0) & (ncap - 1);
            while (n[j].used)
                j = (j + 1) & (ncap - 1);
            n[j] = e->sums[i];
        }
        free(e->sums);
        e->sums = n;
        e->sums_cap = ncap;
    }
    if (!e->sums_cap)
        return NULL;
    uint32_t j = (uint32_t)kvt_hash64(hash, KVT_BLOCK_HASH_LEN, 0) & (e->sums_cap - 1);
    while (e->sums[j].used) {
        if (memcmp(e->sums[j].hash, hash, KVT_BLOCK_HASH_LEN) == 0)
            return &e->sums[j];
        j = (j + 1) & (e->sums_cap - 1);
    }
    if (!add)
        return NULL;
    uint64_t *pr = calloc(e->tp, sizeof(uint64_t));
    if (!pr)
        return NULL;
    memcpy(e->sums[j].hash, hash, KVT_BLOCK_HASH_LEN);
    e->sums[j].used = true;
    e->sums[j].per_rank = pr;
    e->sums_n++;
    return &e->sums[j];
}

/* Block j of request r (GPU block b) holds KV the engine either computed (record its checksum
 * the first time its hash is seen, compare after) or loaded (compare: it must be what was
 * computed). Returns -1 only when out of memory. */
static int kv_check_block(ref_engine *e, struct req *r, uint32_t j, uint32_t g, bool loaded)
{
    const char *how = loaded ? "loaded from the host tier" : "computed again";
    uint8_t hash[KVT_BLOCK_HASH_LEN]; /* per group: the window group's KV is another */
    memcpy(hash, r->hashes + (size_t)j * KVT_BLOCK_HASH_LEN, sizeof(hash));
    hash[0] ^= (uint8_t)(g * 0x5b);
    uint32_t b = g ? r->sw[j] : r->blocks[j];
    if (b == KVT_NULL_BLOCK)
        return 0;
    struct kv_sum *k = kv_slot(e, hash, false);
    if (!k) {
        if (!(k = kv_slot(e, hash, true)))
            return -1;
        for (uint32_t rk = 0; rk < e->tp; rk++)
            k->per_rank[rk] = kv_checksum(e, rk, b, g);
        e->st.kv_blocks_recorded++;
        return 0;
    }
    for (uint32_t rk = 0; rk < e->tp; rk++) {
        if (kv_checksum(e, rk, b, g) == k->per_rank[rk])
            continue;
        if (!e->st.kv_blocks_mismatched++)
            snprintf(e->st.kv_first_mismatch, sizeof(e->st.kv_first_mismatch),
                     "request %.*s block %u of group %u (GPU block %u, rank %u, %s) differs "
                     "from the KV computed for its hash",
                     (int)r->idlen, r->id, j, g, b, rk, how);
        return 0;
    }
    e->st.kv_blocks_verified++;
    e->st.kv_loads_verified += loaded;
    return 0;
}

/* The faults of --inject that act on a completed load (rank 0's copy of the blocks). */
static void inject_load(ref_engine *e, struct req *r, uint32_t first, uint32_t end)
{
    if (e->injected || end <= first)
        return;
    const kvt_region *reg = kvt_layout_regions(e->layout[0]);
    uint32_t nreg = kvt_layout_num_regions(e->layout[0]);
    if (e->cfg.inject == REF_INJECT_CORRUPT) {
        ((uint8_t *)(uintptr_t)(reg[0].base +
                                (uint64_t)r->blocks[first] * reg[0].block_bytes))[7] ^= 0x5a;
        e->injected = true;
    } else if (e->cfg.inject == REF_INJECT_SWAP && end - first >= 2) {
        for (uint32_t i = 0; i < nreg; i++) {
            uint8_t *a = (uint8_t *)(uintptr_t)(reg[i].base +
                                                (uint64_t)r->blocks[first] * reg[i].block_bytes);
            uint8_t *c = (uint8_t *)(uintptr_t)(reg[i].base + (uint64_t)r->blocks[first + 1] *
                                                                  reg[i].block_bytes);
            for (uint64_t x = 0; x < reg[i].block_bytes; x++) {
                uint8_t t = a[x];
                a[x] = c[x];
                c[x] = t;
            }
        }
        e->injected = true;
    }
}

/* --inject drop, at issue: remember each store event's host blocks. */
static int drop_note(ref_engine *e)
{
    if (e->cfg.inject != REF_INJECT_DROP || e->meta.store_event == KVT_NO_EVENT)
        return 0;
    struct drop_ev *n = realloc(e->drops, (e->n_drops + 1) * sizeof(*n));
    if (!n)
        return -1;
    e->drops = n;
    n = &e->drops[e->n_drops];
    n->id = e->meta.store_event;
    n->n = e->meta.n_stores;
    n->blocks = malloc(n->n * sizeof(uint32_t));
    if (!n->blocks)
        return -1;
    memcpy(n->blocks, e->meta.store_cpu_blocks, n->n * sizeof(uint32_t));
    e->n_drops++;
    return 0;
}

/* --inject drop, at completion: rank 0 reported its stores done, but their bytes never reached
 * the host tier (its copy of those host blocks zeroed). */
static void drop_done(ref_engine *e)
{
    const kvt_event_report *rep = &e->wm[0].stores;
    const kvt_region *reg = kvt_mirror_regions(e->mirror[0]);
    uint32_t nreg = kvt_mirror_num_regions(e->mirror[0]);
    for (uint32_t c = 0; c < rep->n_completed; c++)
        for (uint32_t d = 0; d < e->n_drops; d++) {
            struct drop_ev *x = &e->drops[d];
            if (x->id != rep->events[c])
                continue;
            for (uint32_t i = 0; i < x->n; i++)
                for (uint32_t k = 0; k < nreg; k++)
                    memset((void *)(uintptr_t)(reg[k].base +
                                               (uint64_t)x->blocks[i] * reg[k].block_bytes),
                           0, reg[k].block_bytes);
            free(x->blocks);
            *x = e->drops[--e->n_drops];
            break;
        }
}

static int apply_outputs(ref_engine *e, char *err, size_t cap)
{
    double now = now_s();
    for (uint32_t s = 0; s < e->batch.n_seq; s++) {
        struct req *r = e->bseq_req[s];
        const ref_seq *q = &e->bseq[s];
        bool prefill = r->computed < r->n_prompt;
        r->computed += q->n;
        if (prefill) {
            uint32_t p = q->n < r->n_prompt - q->start_pos ? q->n : r->n_prompt - q->start_pos;
            r->prefilled += p;
            e->st.prefill_tokens += q->n;
        } else {
            e->st.decode_tokens += q->n;
        }
        if (q->sample) {
            if (r->len == r->n_prompt)
                r->t_first = now;
            r->tok[r->len++] = e->sampled[s];
        }
        if (hash_blocks(e, r))
            return fail(err, cap, "hashing failed: %s", kvt_last_error());
        uint32_t full = r->computed / REF_BT;
        for (; r->cached < full; r->cached++) {
            const uint8_t *h = r->hashes + (size_t)r->cached * KVT_BLOCK_HASH_LEN;
            for (uint32_t g = 0; g < e->ng; g++) {
                uint32_t b = g ? r->sw[r->cached] : r->blocks[r->cached];
                if (b == KVT_NULL_BLOCK)
                    continue;
                if (off_check(kvt_pool_insert(e->gpu, b, h, g, REF_BT), "insert", err, cap))
                    return -1;
                if (e->off && r->cached >= r->verified && kv_check_block(e, r, r->cached, g, false))
                    return fail(err, cap, "out of memory for the KV check");
            }
        }
        drop_behind(e, r);
        if (r->len - r->n_prompt == r->max_new && finish(e, r, err, cap))
            return -1;
    }
    return 0;
}

/* Finished loads (all ranks) and store reports go to the manager. */
static int apply_reports(ref_engine *e, char *err, size_t cap)
{
    for (uint32_t k = 0; k < e->tp; k++) {
        if (e->out[k].rc)
            return fail(err, cap, "%s", e->out[k].err);
        if (e->out[k].invalid)
            return fail(err, cap, "rank %u: %u blocks failed to load", k, e->out[k].invalid);
    }
    kvt_str *done = e->loads_done; /* at most one per loading request: max_running */
    uint32_t n_done = 0;
    for (uint32_t k = 0; k < e->tp; k++)
        for (uint32_t i = 0; i < e->out[k].n_fin; i++) {
            const kvt_str *f = &e->out[k].fin[i];
            for (uint32_t j = 0; j < e->n_q; j++) {
                struct req *r = e->q[j];
                if (r->state != RQ_LOADING || f->len != r->idlen || memcmp(f->ptr, r->id, f->len))
                    continue;
                if (++r->load_reports == e->tp) {
                    done[n_done++] = (kvt_str){r->id, r->idlen};
                    /* every loaded block must hold the KV computed for its hash */
                    uint32_t first = r->computed / REF_BT;
                    r->computed += r->load_tokens;
                    uint32_t end = r->computed / REF_BT;
                    inject_load(e, r, first, end);
                    /* a window group's positions before its window got no load: let go */
                    drop_behind(e, r);
                    for (uint32_t b = first; b < end; b++)
                        for (uint32_t g = 0; g < e->ng; g++)
                            if (kv_check_block(e, r, b, g, true))
                                return fail(err, cap, "out of memory for the KV check");
                    r->verified = end > r->verified ? end : r->verified;
                    e->st.load_seconds += now_s() - r->t_load;
                    e->st.loads++;
                    r->state = RQ_WAITING; /* scheduled again next step, blocks in place */
                }
            }
        }
    kvt_offload_worker_meta_clear(&e->agg);
    if (e->cfg.inject == REF_INJECT_DROP)
        drop_done(e);
    for (uint32_t k = 0; k < e->tp; k++)
        if (off_check(kvt_offload_worker_meta_aggregate(&e->agg, &e->wm[k]), "aggregate", err, cap))
            return -1;
    return off_check(kvt_offload_apply_output(e->off, done, n_done, &e->agg), "apply_output", err,
                     cap);
}

int ref_engine_step(ref_engine *e, char *err, size_t cap)
{
    if (e->cfg.remote_images && drain_images(e, err, cap))
        return -1;
    if (schedule(e, err, cap))
        return -1;
    if (e->pull && e->batch.n_tok == 0) {
        /* nothing to compute: the waiting requests wait for images (or loads); sleep on the
         * shards' events for a moment instead of spinning against the encoder process */
        zmq_pollitem_t it = {e->pull, 0, ZMQ_POLLIN, 0};
        zmq_poll(&it, 1, 2);
    }
    if (e->off && off_check(kvt_offload_build_meta(e->off, e->preempted_this_step, &e->meta),
                            "build_meta", err, cap))
        return -1;
    if (e->off && drop_note(e))
        return fail(err, cap, "out of memory");
    uint32_t before = e->n_fin;
    run_ranks(e);
    e->st.steps++;
    if (e->off && apply_reports(e, err, cap))
        return -1;
    if (apply_outputs(e, err, cap))
        return -1;
    /* drop finished requests from the queue */
    uint32_t w = 0;
    for (uint32_t i = 0; i < e->n_q; i++) {
        if (e->q[i]->state == RQ_DONE)
            req_free(e->q[i]);
        else
            e->q[w++] = e->q[i];
    }
    e->n_q = w;
    if (e->off) {
        kvt_offload_stats os;
        kvt_offload_get_stats(e->off, &os);
        e->st.loaded_bytes = os.bytes_loaded;
        e->st.stored_bytes = os.bytes_stored;
    }
    return (int)(e->n_fin - before);
}

uint32_t ref_engine_take_finished(ref_engine *e, ref_result *out, uint32_t cap)
{
    uint32_t n = e->n_fin < cap ? e->n_fin : cap;
    if (n == 0)
        return 0;
    memcpy(out, e->fin, n * sizeof(*out));
    memmove(e->fin, e->fin + n, (e->n_fin - n) * sizeof(*out));
    e->n_fin -= n;
    return n;
}

uint32_t ref_engine_pending(const ref_engine *e)
{
    return e->n_q + e->n_fin;
}

void ref_engine_get_stats(const ref_engine *e, ref_engine_stats *s)
{
    *s = e->st;
}

void ref_engine_describe(const ref_engine *e, char *buf, size_t cap)
{
    static const char *names[] = {"waiting", "loading", "running", "done"};
    size_t n = (size_t)snprintf(buf, cap, "GPU pool: %u of %u blocks free; %u live requests\n",
                                kvt_pool_num_free(e->gpu), e->cfg.gpu_blocks - 1, e->n_q);
    for (uint32_t i = 0; i < e->n_q && n < cap; i++) {
        const struct req *r = e->q[i];
        uint32_t missing = 0;
        for (uint32_t k = 0; k < r->n_imgs; k++)
            missing += !image_ready((ref_engine *)e, &e->img[r->img_slot[k]]);
        n += (size_t)snprintf(buf + n, cap - n,
                              "  %s: %s, %u of %u tokens computed, %u blocks, %u load reports, "
                              "%u images missing, %u preemptions\n",
                              r->id, names[r->state], r->computed, r->len, r->n_blocks,
                              r->load_reports, missing, r->preemptions);
    }
}

uint32_t ref_engine_ec_port(const ref_engine *e)
{
    return e->srv ? kvt_ec_server_port(e->srv[0]) : 0;
}

void ref_engine_leaks(ref_engine *e, uint32_t *gpu_blocks, uint32_t *host_blocks)
{
    char err[256];
    /* step until the last stores have landed */
    for (int i = 0; e->off && kvt_offload_has_pending(e->off) && i < 1000; i++)
        if (ref_engine_step(e, err, sizeof(err)) < 0)
            break;
    *gpu_blocks = e->cfg.gpu_blocks - 1 - kvt_pool_num_free(e->gpu);
    *host_blocks = 0;
    if (e->off) {
        kvt_offload_stats os;
        kvt_offload_get_stats(e->off, &os);
        *host_blocks = os.host_used_blocks + (kvt_offload_has_pending(e->off) ? 1 : 0);
    }
}

/* ---- create / destroy ---------------------------------------------------------------------- */

static int start_servers(ref_engine *e, char *err, size_t cap)
{
    uint64_t bytes = 64ull << 20;
    e->shard = calloc(e->tp, sizeof(*e->shard));
    e->shard_buf = calloc(e->tp, sizeof(*e->shard_buf));
    e->srv = calloc(e->tp, sizeof(*e->srv));
    if (!e->shard || !e->shard_buf || !e->srv)
        return fail(err, cap, "out of memory");
    for (uint32_t k = 0; k < e->tp; k++) {
        e->shard_buf[k] = aligned_alloc(4096, bytes);
        kvt_ec_shard_config sc;
        kvt_ec_shard_config_init(&sc);
        sc.base = e->shard_buf[k];
        sc.capacity = bytes;
        if (!e->shard_buf[k] || kvt_ec_shard_create(&sc, &e->shard[k]))
            return fail(err, cap, "encoder-cache shard: %s", kvt_last_error());
    }
    kvt_ec_server_config c;
    kvt_ec_server_config_init(&c);
    c.host = "127.0.0.1";
    c.tp_size = e->tp;
    c.poll_ms = 5;
    int rc = -1;
    for (uint32_t port = e->cfg.ec_port; port + e->tp < 65000 && rc; port += 2 * e->tp + 7) {
        c.base_port = port;
        rc = 0;
        for (uint32_t k = 0; k < e->tp && !rc; k++) {
            c.tp_rank = k;
            rc = kvt_ec_server_start(&c, e->shard[k], &e->srv[k]);
        }
        if (rc)
            for (uint32_t k = 0; k < e->tp; k++) {
                kvt_ec_server_stop(e->srv[k]);
                e->srv[k] = NULL;
            }
    }
    if (rc)
        return fail(err, cap, "encoder-cache servers: %s", kvt_last_error());
    e->zctx = zmq_ctx_new();
    e->pull = e->zctx ? zmq_socket(e->zctx, ZMQ_PULL) : NULL;
    if (!e->pull)
        return fail(err, cap, "ZeroMQ: %s", zmq_strerror(zmq_errno()));
    int zero = 0;
    zmq_setsockopt(e->pull, ZMQ_LINGER, &zero, sizeof(zero));
    for (uint32_t k = 0; k < e->tp; k++) {
        const char *ep = kvt_ec_server_event_endpoint(e->srv[k]);
        if (zmq_connect(e->pull, ep) != 0)
            return fail(err, cap, "cannot connect to %s: %s", ep, zmq_strerror(zmq_errno()));
    }
    return 0;
}

int ref_engine_create(const ref_engine_config *cfg, ref_engine **out, char *err, size_t cap)
{
    *out = NULL;
    if (ref_config_check(&cfg->model, err, cap))
        return -1;
    if (cfg->gpu_blocks < 8 || cfg->max_batched_tokens < REF_BT || !cfg->max_running ||
        cfg->max_len < REF_BT || cfg->max_len > 16000)
        return fail(err, cap,
                    "engine: need gpu_blocks >= 8, max_batched_tokens >= %u, "
                    "max_running >= 1 and max_len in %u..16000",
                    REF_BT, REF_BT);
    ref_engine *e = calloc(1, sizeof(*e));
    if (!e)
        return fail(err, cap, "out of memory");
    e->cfg = *cfg;
    e->tp = cfg->model.tp;
    e->max_tok = cfg->max_batched_tokens;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->go, NULL);
    pthread_cond_init(&e->done, NULL);
    kvt_offload_meta_init(&e->meta);
    kvt_offload_worker_meta_init(&e->agg);
    *out = e;
    kvt_pool_config pc;
    kvt_pool_config_init(&pc);
    pc.num_blocks = cfg->gpu_blocks;
    e->ng = cfg->model.window ? 2 : 1;
    if (e->ng == 2) { /* hybrid: the windowed layers' own group */
        pc.n_groups = 2;
        pc.groups[1] = (kvt_group_spec){KVT_GROUP_SLIDING, REF_BT, cfg->model.window};
    }
    if (off_check(kvt_pool_create(&pc, &e->gpu), "GPU pool", err, cap))
        return -1;
    uint32_t T = e->max_tok;
    e->btok = calloc(T + REF_TILE, sizeof(uint32_t));
    e->bemb = calloc(T + REF_TILE, sizeof(float *));
    e->bseq = calloc(T, sizeof(ref_seq));
    e->bseq_req = calloc(T, sizeof(struct req *));
    e->sampled = calloc(T, sizeof(uint32_t));
    e->rank = calloc(e->tp, sizeof(*e->rank));
    e->kv = calloc(e->tp, sizeof(*e->kv));
    e->out = calloc(e->tp, sizeof(*e->out));
    e->loads_done = calloc(cfg->max_running, sizeof(kvt_str));
    e->thr = calloc(e->tp, sizeof(*e->thr));
    e->enc = ref_encoder_create(&cfg->model);
    e->shared = ref_shared_create(&cfg->model, T);
    if (!e->btok || !e->bemb || !e->bseq || !e->bseq_req || !e->sampled || !e->rank || !e->kv ||
        !e->out || !e->loads_done || !e->thr || !e->enc || !e->shared)
        return fail(err, cap, "out of memory");
    for (uint32_t r = 0; r < e->tp; r++)
        if (!(e->out[r].fin = calloc(cfg->max_running, sizeof(kvt_str))))
            return fail(err, cap, "out of memory");
    e->batch.tokens = e->btok;
    e->batch.embeds = e->bemb;
    e->batch.seqs = e->bseq;
    e->batch.sampled = e->sampled;
    for (uint32_t r = 0; r < e->tp; r++) {
        e->rank[r] = ref_rank_create(&cfg->model, r, T, e->shared);
        if (!e->rank[r] || ref_kv_create(&cfg->model, cfg->gpu_blocks, &e->kv[r]))
            return fail(err, cap, "out of memory for rank %u's weights or KV cache", r);
    }
    if (cfg->cpu_bytes) {
        uint64_t block_bytes = ref_kv_bytes_per_token(&cfg->model) * REF_BT * e->tp;
        uint32_t host_blocks;
        if (off_check(kvt_offload_size_host(cfg->cpu_bytes, block_bytes, &host_blocks),
                      "host tier size", err, cap))
            return -1;
        e->layout = calloc(e->tp, sizeof(*e->layout));
        e->mirror = calloc(e->tp, sizeof(*e->mirror));
        e->worker = calloc(e->tp, sizeof(*e->worker));
        e->wm = calloc(e->tp, sizeof(*e->wm));
        if (!e->layout || !e->mirror || !e->worker || !e->wm)
            return fail(err, cap, "out of memory");
        for (uint32_t r = 0; r < e->tp; r++) {
            kvt_offload_worker_meta_init(&e->wm[r]);
            kvt_mirror_config mc;
            kvt_mirror_config_init(&mc);
            mc.host_blocks = host_blocks;
            kvt_worker_config wc;
            kvt_worker_config_init(&wc);
            wc.copy.backend = KVT_BACKEND_CPU;
            wc.copy.threads = 1;
            if (off_check(kvt_layout_create(KVT_HOST_DEVICE, cfg->gpu_blocks, &e->layout[r]),
                          "layout", err, cap))
                return -1;
            for (uint32_t g = 0; g < e->kv[r].n_regions; g++)
                if (off_check(kvt_layout_add_region(e->layout[r],
                                                    (uint64_t)(uintptr_t)e->kv[r].region[g],
                                                    e->kv[r].block_bytes),
                              "layout region", err, cap))
                    return -1;
            if (off_check(kvt_mirror_create(&mc, e->layout[r], &e->mirror[r]), "host mirror", err,
                          cap) ||
                off_check(kvt_worker_create(&wc, e->layout[r], e->mirror[r], &e->worker[r]),
                          "worker", err, cap))
                return -1;
        }
        kvt_offload_config oc;
        kvt_offload_config_init(&oc);
        oc.host_blocks = host_blocks;
        oc.world_size = e->tp;
        oc.lazy = cfg->lazy;
        oc.max_batched_tokens = cfg->max_batched_tokens;
        oc.max_model_len = cfg->max_len;
        oc.block_bytes = block_bytes;
        if (off_check(kvt_offload_create(&oc, e->gpu, &e->off), "offload manager", err, cap))
            return -1;
    }
    if (cfg->remote_images && start_servers(e, err, cap))
        return -1;
    for (uint32_t r = 0; r < e->tp; r++) {
        struct rank_arg *a = malloc(sizeof(*a));
        if (!a)
            return fail(err, cap, "out of memory");
        a->e = e;
        a->r = r;
        if (pthread_create(&e->thr[r], NULL, rank_main, a) != 0) {
            free(a);
            e->tp = r; /* only these are joined */
            return fail(err, cap, "cannot start rank %u's thread", r);
        }
    }
    e->threads_up = true;
    return 0;
}

void ref_engine_destroy(ref_engine *e)
{
    if (!e)
        return;
    uint32_t tp = e->cfg.model.tp;
    if (e->threads_up || e->tp != tp) {
        pthread_mutex_lock(&e->mu);
        e->stop = true;
        pthread_cond_broadcast(&e->go);
        pthread_mutex_unlock(&e->mu);
        for (uint32_t r = 0; r < e->tp; r++)
            pthread_join(e->thr[r], NULL);
    }
    if (e->pull)
        zmq_close(e->pull);
    if (e->zctx)
        zmq_ctx_term(e->zctx);
    for (uint32_t k = 0; e->srv && k < tp; k++)
        kvt_ec_server_stop(e->srv[k]);
    for (uint32_t k = 0; e->shard && k < tp; k++)
        if (e->shard[k] && kvt_ec_shard_destroy(e->shard[k]) == 0)
            free(e->shard_buf[k]); /* a writer still active keeps its buffer */
    free(e->srv);
    free(e->shard);
    free(e->shard_buf);
    kvt_offload_destroy(e->off);
    for (uint32_t i = 0; i < e->sums_cap; i++)
        free(e->sums[i].per_rank);
    free(e->sums);
    for (uint32_t i = 0; i < e->n_drops; i++)
        free(e->drops[i].blocks);
    free(e->drops);
    for (uint32_t r = 0; e->worker && r < tp; r++) {
        kvt_worker_destroy(e->worker[r]);
        kvt_mirror_destroy(e->mirror[r]);
        kvt_layout_destroy(e->layout[r]);
        kvt_offload_worker_meta_release(&e->wm[r]);
    }
    free(e->worker);
    free(e->mirror);
    free(e->layout);
    free(e->wm);
    for (uint32_t r = 0; e->rank && r < tp; r++) {
        ref_rank_destroy(e->rank[r]);
        ref_kv_destroy(&e->kv[r]);
    }
    free(e->rank);
    free(e->kv);
    ref_shared_destroy(e->shared);
    ref_encoder_destroy(e->enc);
    for (uint32_t i = 0; i < e->n_img; i++) {
        free(e->img[i].local);
        for (uint32_t k = 0; e->img[i].rank && k < tp; k++)
            free(e->img[i].rank[k]);
        free(e->img[i].rank);
    }
    free(e->img);
    for (uint32_t i = 0; i < e->n_q; i++)
        req_free(e->q[i]);
    free(e->q);
    for (uint32_t i = 0; i < e->n_fin; i++)
        free(e->fin[i].tokens);
    free(e->fin);
    free(e->btok);
    free(e->bemb);
    free(e->bseq);
    free(e->bseq_req);
    free(e->sampled);
    for (uint32_t r = 0; e->out && r < tp; r++)
        free(e->out[r].fin);
    free(e->out);
    free(e->loads_done);
    free(e->thr);
    kvt_offload_meta_release(&e->meta);
    kvt_offload_worker_meta_release(&e->agg);
    kvt_pool_destroy(e->gpu);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->go);
    pthread_cond_destroy(&e->done);
    free(e);
}
