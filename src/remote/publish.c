/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Slot records, publish, withdraw and lookup of the remote tier (remote_impl.h): what this
 * instance publishes (each block's tag under its block key, the directory entries) and what
 * the lookup side finds (the owners the directory names, in a table of peers).
 */
#include "remote/remote_impl.h"

/* The tag of a block (its pieces at piece(j)) published as (slot, gen) with hash: GMAC under
 * key (auth.h). 0, or libcrypto's failure. Nothing orders an owner's read of its slot's bytes
 * after a write into the slot by another agent (a worker, a buggy store): comparing with the
 * tag recorded at publish is what catches that (tests/tsan.supp names this function). */
__attribute__((noinline)) int kvi_remote_block_tag(const kvt_remote *r, kvi_rgcm *g,
                                                   const uint8_t *key, uint32_t slot, uint64_t gen,
                                                   const uint8_t *hash, uint8_t *const *piece,
                                                   uint8_t tag[KVI_RTAG])
{
    uint8_t nonce[12];
    kvi_rauth_block_nonce(slot, gen, nonce);
    int rc = kvi_rgcm_begin(g, key, nonce, 0);
    for (uint32_t j = 0; !rc && j < r->n_pieces; j++)
        rc = kvi_rgcm_piece(g, piece[j], NULL, r->piece[j].block_bytes);
    if (!rc)
        rc = kvi_rgcm_aad(g, hash, r->cfg.hash_len);
    return rc ? rc : kvi_rgcm_tag(g, tag);
}

/* ---- publish / withdraw --------------------------------------------------------------------- */

static int check_slots(const kvt_remote *r, const uint32_t *slots, uint32_t n)
{
    if (!r->serves)
        return kvt_fail(KVT_ESTATE, "remote: this instance serves no region");
    if (!slots || n > KVT_REMOTE_MAX_READ)
        return kvt_fail(KVT_EINVAL, "remote: %u slots (at most %u per call)", n,
                        KVT_REMOTE_MAX_READ);
    for (uint32_t i = 0; i < n; i++)
        if (slots[i] >= r->cfg.n_slots)
            return kvt_fail(KVT_ERANGE, "remote: slot %u out of range (%u slots)", slots[i],
                            r->cfg.n_slots);
    return 0;
}

void kvi_remote_slot_gens(kvt_remote *r, const uint32_t *slots, uint32_t n, uint64_t *gens)
{
    pthread_mutex_lock(&r->mu);
    for (uint32_t i = 0; i < n; i++)
        gens[i] = slots[i] < r->cfg.n_slots ? r->slots[slots[i]].gen : 0;
    pthread_mutex_unlock(&r->mu);
}

int kvt_remote_publish(kvt_remote *r, const uint32_t *slots, const uint8_t *hashes, uint32_t n)
{
    return kvi_remote_publish_at(r, slots, hashes, NULL, n);
}

int kvi_remote_publish_at(kvt_remote *r, const uint32_t *slots, const uint8_t *hashes,
                          const uint64_t *expect, uint32_t n)
{
    if (!r || (n && !hashes))
        return kvt_fail(KVT_EINVAL, "remote: publish: NULL argument");
    int rc = check_slots(r, slots, n);
    if (rc || n == 0)
        return rc;
    uint64_t *gens = r->sc_gens;
    uint32_t *ok_slots = r->sc_slots;
    uint8_t *ok_hashes = r->sc_hashes;
    const uint32_t hl = r->cfg.hash_len;
    uint32_t m = 0;
    for (uint32_t i = 0; i < n; i++) {
        /* a new generation first (nothing is served from the slot meanwhile), then its tag over
         * the bytes as they are now, then it is servable */
        const uint8_t *h = hashes + (size_t)i * hl;
        pthread_mutex_lock(&r->mu);
        slotrec *s = &r->slots[slots[i]];
        if (expect && s->gen != expect[i]) { /* withdrawn since it was asked for: its bytes */
            pthread_mutex_unlock(&r->mu);    /* may be another block's already */
            continue;
        }
        uint64_t gen = ++s->gen;
        s->published = false;
        pthread_mutex_unlock(&r->mu);
        uint8_t tag[KVI_RTAG], *pc[KVT_MAX_REGIONS];
        slot_pieces(r, slots[i], pc);
        if (kvi_remote_block_tag(r, r->gcm, r->block_key, slots[i], gen, h, pc, tag)) {
            KVT_LOG_E("remote: slot %u not published: %s", slots[i], kvt_last_error());
            add(&r->a_pub_dropped, 1);
            continue;
        }
        pthread_mutex_lock(&r->mu);
        bool still = s->gen == gen; /* not withdrawn while the tag was computed */
        if (still) {
            memcpy(s->tag, tag, KVI_RTAG);
            memcpy(s->hash, h, hl);
            s->published = true;
        }
        pthread_mutex_unlock(&r->mu);
        if (!still)
            continue;
        ok_slots[m] = slots[i], gens[m] = gen;
        memcpy(ok_hashes + (size_t)m * hl, h, hl);
        m++;
    }
    slots = ok_slots, hashes = ok_hashes, n = m;
    if (n == 0)
        return 0;
    /* Not registered at this moment (the directory lost the key and the server thread is
     * entering again, or it has not entered yet): nothing is lost, the slots are marked
     * published above and the entry republishes every published slot after it set the epoch
     * (enter), so they are written then, under the new epoch. */
    uint64_t ep = atomic_load(&r->epoch);
    if (!ep)
        return 0;
    if (r->dir_pub.ops->publish(r->dir_pub.d, &r->self, ep, hashes, slots, gens, n)) {
        add(&r->a_pub_dropped, n);
        add(&r->a_pub_dir_errors, 1);
    } else {
        add(&r->a_published, n);
    }
    return 0;
}

uint32_t kvi_remote_unpublish(kvt_remote *r, const uint32_t *slots, uint32_t n, uint8_t *hashes,
                              uint32_t *ws, uint64_t *gens)
{
    const uint32_t hl = r->cfg.hash_len;
    uint32_t m = 0;
    pthread_mutex_lock(&r->mu);
    for (uint32_t i = 0; i < (slots ? n : r->cfg.n_slots); i++) {
        uint32_t k = slots ? slots[i] : i;
        slotrec *s = &r->slots[k];
        s->gen++; /* a send under way now reports stale; a publication asked for before, not
                     yet made, is not made */
        if (!s->published)
            continue;
        memcpy(hashes + (size_t)m * hl, s->hash, hl);
        ws[m] = k, gens[m] = s->gen - 1, m++;
        s->published = false;
    }
    pthread_mutex_unlock(&r->mu);
    return m;
}

void kvi_remote_dir_withdraw(kvt_remote *r, const uint8_t *hashes, const uint32_t *slots,
                             const uint64_t *gens, uint32_t n)
{
    uint64_t ep = atomic_load(&r->epoch);
    for (uint32_t i = 0; ep && i < n; i += KVT_REMOTE_MAX_READ) {
        uint32_t k = n - i < KVT_REMOTE_MAX_READ ? n - i : KVT_REMOTE_MAX_READ;
        if (r->dir_pub.ops->withdraw(r->dir_pub.d, &r->self, ep,
                                     hashes + (size_t)i * r->cfg.hash_len, slots + i, gens + i, k))
            add(&r->a_pub_dir_errors, 1);
        else
            add(&r->a_withdrawn, k);
    }
}

int kvt_remote_withdraw(kvt_remote *r, const uint32_t *slots, uint32_t n)
{
    if (!r)
        return kvt_fail(KVT_EINVAL, "remote: withdraw: NULL argument");
    int rc = check_slots(r, slots, n);
    if (rc || n == 0)
        return rc;
    uint32_t m = kvi_remote_unpublish(r, slots, n, r->sc_hashes, r->sc_slots, r->sc_gens);
    kvi_remote_dir_withdraw(r, r->sc_hashes, r->sc_slots, r->sc_gens, m);
    return 0;
}

/* ---- lookup --------------------------------------------------------------------------------- */

static peer_key *key_at(void *table, size_t stride, uint32_t i)
{
    return (peer_key *)(void *)((char *)table + (size_t)i * stride);
}

/* The entry of owner id in a table of *n entries `stride` bytes apart, each starting with its
 * peer_key: the same instance at the same endpoint (its epoch and use updated: *kind PEER_SAME
 * or PEER_EPOCH), else a new entry or the least recently used one not named at seq (*kind
 * PEER_NEW: the caller resets what it holds, then peer_key_set). UINT32_MAX when every entry
 * was named at seq. */
uint32_t kvi_remote_peer_slot(void *table, size_t stride, uint32_t *n, const kvt_remote_peer *id,
                              uint64_t seq, int *kind)
{
    uint32_t victim = UINT32_MAX;
    for (uint32_t i = 0; i < *n; i++) {
        peer_key *k = key_at(table, stride, i);
        if (strcmp(k->id.instance, id->instance) == 0 &&
            strcmp(k->id.endpoint, id->endpoint) == 0) {
            *kind = k->id.epoch == id->epoch ? PEER_SAME : PEER_EPOCH;
            k->id.epoch = id->epoch;
            k->used = seq;
            return i;
        }
        if (k->used != seq &&
            (victim == UINT32_MAX || k->used < key_at(table, stride, victim)->used))
            victim = i;
    }
    *kind = PEER_NEW;
    return *n < KVT_REMOTE_MAX_PEERS ? (*n)++ : victim;
}

void kvi_remote_peer_key_set(peer_key *k, const kvt_remote_peer *id, uint64_t seq)
{
    k->id = *id;
    snprintf(k->name, sizeof(k->name), "%s@%s", id->instance, id->endpoint);
    k->used = seq;
}

/* The lookup-side index of the owner a hit names; UINT32_MAX when every entry was named by
 * this lookup. */
static uint32_t peer_for(kvt_remote *r, const kvi_rdir_hit *h)
{
    kvt_remote_peer id = {.epoch = h->epoch};
    snprintf(id.instance, sizeof(id.instance), "%s", h->instance);
    snprintf(id.endpoint, sizeof(id.endpoint), "%s", h->endpoint);
    int kind;
    uint32_t i =
        kvi_remote_peer_slot(r->lk, sizeof(r->lk[0]), &r->n_lk, &id, r->lookups_seq, &kind);
    if (i != UINT32_MAX && kind == PEER_NEW)
        kvi_remote_peer_key_set(&r->lk[i], &id, r->lookups_seq);
    return i;
}

int kvt_remote_lookup(kvt_remote *r, const uint8_t *hashes, uint32_t n, kvt_remote_loc *out,
                      uint32_t *n_hit)
{
    if (!r || !n_hit || (n && (!hashes || !out)))
        return kvt_fail(KVT_EINVAL, "remote: lookup: NULL argument");
    *n_hit = 0;
    if (n > KVT_REMOTE_MAX_READ)
        return kvt_fail(KVT_ELIMIT, "remote: lookup of %u blocks (at most %u)", n,
                        KVT_REMOTE_MAX_READ);
    if (n == 0)
        return 0;
    r->st.lookups++;
    r->st.lookup_blocks += n;
    r->lookups_seq++;
    uint32_t m = 0, np = r->parts;
    n = kvi_min_u32(n, KVT_REMOTE_MAX_READ / np); /* entries of one round trip */
    if (r->dir.ops->lookup(r->dir.d, &r->self, hashes, n, r->hits, &m)) {
        r->st.directory_errors++;
        return 0; /* Redis down: misses */
    }
    for (uint32_t i = 0; i < m; i++) {
        uint32_t k = 0;
        for (; k < np; k++) { /* a block counts with all its parts */
            const kvi_rdir_hit *h = &r->hits[(size_t)i * np + k];
            uint32_t pi = peer_for(r, h);
            if (pi == UINT32_MAX)
                break;
            out[(size_t)i * np + k] =
                (kvt_remote_loc){.peer = pi, .slot = h->slot, .generation = h->generation};
        }
        if (k < np)
            break;
        (*n_hit)++;
    }
    r->st.hit_blocks += *n_hit;
    return 0;
}

const char *kvt_remote_peer_name(const kvt_remote *r, uint32_t index)
{
    return r && index < r->n_lk ? r->lk[index].name : NULL;
}

int kvt_remote_lookup_peer(const kvt_remote *r, uint32_t index, kvt_remote_peer *out)
{
    if (!r || !out)
        return kvt_fail(KVT_EINVAL, "remote: lookup_peer: NULL argument");
    if (index >= r->n_lk)
        return kvt_fail(KVT_ERANGE, "remote: lookup_peer: peer %u (the lookups named %u)", index,
                        r->n_lk);
    *out = r->lk[index].id;
    return 0;
}
