/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvt_remote (kvtier/remote.h): a directory (remote_internal.h) and the ZeroMQ + UCX data
 * channel, composed, with the space's credential turned into keys (auth.h) that never leave
 * the process. This file checks a configuration, makes, starts and ends an instance and reads
 * its counters; the owner's thread is owner.c, publishing and lookups publish.c, reads
 * reader.c (remote_impl.h says who holds what).
 */
#include "remote/remote_impl.h"

static bool name_ok(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > KVT_REMOTE_NAME_MAX)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '.' || c == '-'))
            return false;
    }
    return true;
}

void kvt_remote_config_init(kvt_remote_config *c)
{
    if (!c)
        return;
    memset(c, 0, sizeof(*c));
    c->hash_len = 16;
    c->ttl_ms = 3000;
    c->timeout_ms = 2000;
    c->directory_timeout_ms = 250;
    c->retry_ms = 1000;
    c->owner_checksum = 1;
}

/* The names: directory, space, instance, and rank of ranks (the instance's per-rank name fits). */
static int validate_names(const kvt_remote_config *c)
{
    if (!c->directory || !*c->directory)
        return kvt_fail(KVT_EINVAL, "remote: directory (the Redis server) is required");
    if (!name_ok(c->space) || !name_ok(c->instance))
        return kvt_fail(KVT_EINVAL,
                        "remote: space and instance must be 1..%u bytes of "
                        "[A-Za-z0-9_.-]",
                        KVT_REMOTE_NAME_MAX);
    if (c->ranks > KVT_REMOTE_MAX_RANKS ||
        (c->rank != KVT_REMOTE_NO_RANK && c->rank >= (c->ranks ? c->ranks : 1)))
        return kvt_fail(KVT_EINVAL,
                        "remote: rank %u of %u ranks (ranks 0..%u; rank below ranks, or "
                        "KVT_REMOTE_NO_RANK for lookups only)",
                        c->rank, c->ranks, KVT_REMOTE_MAX_RANKS);
    size_t suffix = c->ranks > 10 ? 3 : 2; /* "#<rank>" of the highest rank */
    if (c->ranks > 1 && c->rank != KVT_REMOTE_NO_RANK &&
        strlen(c->instance) + suffix > KVT_REMOTE_NAME_MAX)
        return kvt_fail(KVT_EINVAL,
                        "remote: instance '%s': a rank's name is \"<instance>#<rank>\", at most "
                        "%u bytes; with %u ranks the instance may have %zu",
                        c->instance, KVT_REMOTE_NAME_MAX, c->ranks, KVT_REMOTE_NAME_MAX - suffix);
    return 0;
}

/* The memory served and read into: one region or several (n_regions), their block bytes
 * (block_bytes 0: theirs) and slots. */
static int validate_regions(const kvt_remote_config *c)
{
    uint64_t bb = c->block_bytes;
    if (c->regions) {
        if (c->region || c->n_regions == 0 || c->n_regions > KVT_MAX_REGIONS)
            return kvt_fail(KVT_EINVAL,
                            "remote: regions: 1..%u of them (n_regions %u), and no "
                            "region beside them",
                            KVT_MAX_REGIONS, c->n_regions);
        uint64_t sum = 0;
        for (uint32_t j = 0; j < c->n_regions; j++) {
            if (c->regions[j].block_bytes == 0 || c->regions[j].block_bytes > (1ull << 32) ||
                (c->n_slots && !c->regions[j].base))
                return kvt_fail(KVT_EINVAL, "remote: region %u: no base or block bytes", j);
            sum += c->regions[j].block_bytes;
        }
        if (bb && bb != sum)
            return kvt_fail(KVT_EINVAL,
                            "remote: block_bytes %" PRIu64 " is not the regions' %" PRIu64
                            " (0: theirs)",
                            bb, sum);
        bb = sum;
    } else if (c->n_regions) {
        return kvt_fail(KVT_EINVAL, "remote: n_regions without regions");
    }
    if (bb == 0 || bb > (1ull << 32))
        return kvt_fail(KVT_EINVAL, "remote: block_bytes must be 1..4 GiB");
    if ((c->region || (c->regions && c->n_slots)) &&
        (c->n_slots == 0 || c->n_slots > (1ull << 40) / bb))
        return kvt_fail(KVT_EINVAL, "remote: a region needs 1.. slots (n_slots %u)", c->n_slots);
    if (!c->region && !c->regions && c->n_slots)
        return kvt_fail(KVT_EINVAL, "remote: n_slots without a region");
    return 0;
}

static int validate_hash_len(const kvt_remote_config *c)
{
    if (c->hash_len == 0 || c->hash_len > KVT_REMOTE_MAX_HASH)
        return kvt_fail(KVT_EINVAL, "remote: hash_len %u (1..%u)", c->hash_len,
                        KVT_REMOTE_MAX_HASH);
    return 0;
}

static int validate(const kvt_remote_config *c)
{
    int rc = kvi_check_reserved(c->reserved, sizeof(c->reserved), "remote config");
    if (rc || (rc = validate_names(c)))
        return rc;
    if (c->rank == KVT_REMOTE_NO_RANK) {
        if (c->region || c->regions || c->n_slots)
            return kvt_fail(KVT_EINVAL, "remote: a lookup-only client (KVT_REMOTE_NO_RANK) "
                                        "serves no region");
        if ((rc = validate_hash_len(c)))
            return rc;
        if (c->directory_timeout_ms == 0)
            return kvt_fail(KVT_EINVAL, "remote: directory_timeout_ms must be set");
        return 0; /* no server, no reads: no listen host, credential or block size */
    }
    if (!c->listen_host || !*c->listen_host || strlen(c->listen_host) > 64 ||
        (c->advertise_host && (!*c->advertise_host || strlen(c->advertise_host) > 64)))
        return kvt_fail(KVT_EINVAL, "remote: listen_host (and advertise_host) must be 1..64 "
                                    "bytes");
    size_t cl = c->credential ? strlen(c->credential) : 0;
    if (cl < 16 || cl > KVI_RCRED_MAX)
        return kvt_fail(KVT_EINVAL,
                        "remote: credential must be 16..%u bytes (the space's "
                        "shared secret)",
                        KVI_RCRED_MAX);
    if ((rc = validate_regions(c)))
        return rc;
    if (c->directory_password &&
        (!*c->directory_password || strlen(c->directory_password) > KVI_RCRED_MAX * 2))
        return kvt_fail(KVT_EINVAL, "remote: directory_password must be 1..%u bytes (or NULL)",
                        KVI_RCRED_MAX * 2);
    if (c->owner_checksum > 1 || c->encrypt > 1)
        return kvt_fail(KVT_EINVAL, "remote: owner_checksum and encrypt are 0 or 1");
    if ((rc = validate_hash_len(c)))
        return rc;
    if (c->ttl_ms < 30 || c->timeout_ms == 0 || c->directory_timeout_ms == 0)
        return kvt_fail(KVT_EINVAL, "remote: ttl_ms (>= 30), timeout_ms and "
                                    "directory_timeout_ms must be set");
    return 0;
}

/* ---- create / destroy ---------------------------------------------------------------------- */

static char *dupcat(char **p, const char *s)
{
    if (!s)
        return NULL;
    size_t n = strlen(s) + 1;
    char *d = *p;
    memcpy(d, s, n);
    *p += n;
    return d;
}

static int bind_server(kvt_remote *r)
{
    r->router = zmq_socket(r->zctx, ZMQ_ROUTER);
    if (!r->router)
        return zfail("socket");
    int zero = 0, hwm = 1024;
    int64_t max = MAX_REQ_BYTES;
    zmq_setsockopt(r->router, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(r->router, ZMQ_MAXMSGSIZE, &max, sizeof(max));
    zmq_setsockopt(r->router, ZMQ_RCVHWM, &hwm, sizeof(hwm));
    char ep[128];
    snprintf(ep, sizeof(ep), "tcp://%s:%u", r->cfg.listen_host, r->cfg.listen_port);
    if (zmq_bind(r->router, ep) != 0)
        return kvt_fail(KVT_EIO, "remote: cannot bind %s: %s", ep, zmq_strerror(zmq_errno()));
    char last[128];
    size_t ll = sizeof(last);
    if (zmq_getsockopt(r->router, ZMQ_LAST_ENDPOINT, last, &ll) != 0)
        return zfail("endpoint");
    const char *colon = strrchr(last, ':');
    r->port = colon ? (uint16_t)atoi(colon + 1) : 0;
    const char *host = r->cfg.advertise_host ? r->cfg.advertise_host : r->cfg.listen_host;
    snprintf(r->endpoint, sizeof(r->endpoint), "%s:%u", host, r->port);
    return 0;
}

/* Registers the served arrays with a UCX worker (nothing when this instance serves none). */
int kvi_remote_map_pieces(kvt_remote *r, kvi_ucx *u)
{
    int rc = 0;
    for (uint32_t j = 0; r->serves && j < r->n_pieces && !rc; j++)
        rc = kvi_ucx_map(u, piece_at(r, j, 0), r->cfg.n_slots * r->piece[j].block_bytes);
    return rc;
}

static void remote_free(kvt_remote *r);

/* The manager let go (port/remote_port.h). */
static void unlend(kvt_remote *r)
{
    r->rport.lent = false;
    if (r->rport.orphaned && !r->rport.staged)
        remote_free(r);
}

/* The worker's stage let go (remote_xfer.c). */
void kvi_remote_unstage(kvt_remote *r)
{
    r->rport.staged = false;
    if (r->rport.orphaned && !r->rport.lent)
        remote_free(r);
}

/* The remote's copies of the configuration's strings, in one allocation (r->strs): the
 * credential and the directory's password are not kept (turned into keys; the directories
 * keep their own). A rank of several has the instance name "<instance>#<rank>". */
static void copy_strings(kvt_remote *r, const kvt_remote_config *c)
{
    char *p = r->strs;
    r->cfg.directory = dupcat(&p, c->directory);
    r->cfg.space = dupcat(&p, c->space);
    r->base = dupcat(&p, c->instance);
    r->cfg.instance = r->base;
    if (r->parts > 1 && !r->lookup_only) { /* validated: fits KVT_REMOTE_NAME_MAX */
        r->cfg.instance = p;
        p += (size_t)sprintf(p, "%s#%u", c->instance, c->rank) + 1;
    }
    r->cfg.listen_host = dupcat(&p, c->listen_host);
    r->cfg.credential = NULL;
    r->cfg.advertise_host = dupcat(&p, c->advertise_host);
    r->cfg.directory_password = NULL;
}

/* The pieces of a block (one region, or the configured regions) and the port the offload
 * manager and the workers reach this remote through. */
static void set_pieces_and_port(kvt_remote *r, const kvt_remote_config *c)
{
    uint32_t np = r->n_pieces;
    if (c->regions) {
        memcpy(r->piece, c->regions, np * sizeof(*r->piece));
        r->cfg.block_bytes = 0;
        for (uint32_t j = 0; j < np; j++)
            r->cfg.block_bytes += r->piece[j].block_bytes;
    } else {
        r->piece[0] =
            (kvt_region){.base = (uint64_t)(uintptr_t)c->region, .block_bytes = c->block_bytes};
    }
    r->cfg.regions = r->piece;
    r->rport = (kvi_remote_port){.lookup = kvt_remote_lookup,
                                 .lookup_peer = kvt_remote_lookup_peer,
                                 .unlend = unlend,
                                 .stage_open = kvi_remote_stage_open,
                                 .stats = kvt_remote_get_stats,
                                 .regions = r->piece,
                                 .n_regions = np,
                                 .n_slots = c->n_slots,
                                 .hash_len = c->hash_len,
                                 .block_bytes = r->cfg.block_bytes,
                                 .parts = r->parts,
                                 .rank = c->rank,
                                 .lookup_only = r->lookup_only};
}

/* The object with its copies of the configuration; nothing started yet. */
static int remote_alloc(const kvt_remote_config *c, kvt_remote **out)
{
    kvt_remote *r = calloc(1, sizeof(*r));
    size_t sl = strlen(c->directory) + strlen(c->space) + 2 * strlen(c->instance) + 8 +
                (c->listen_host ? strlen(c->listen_host) : 0) +
                (c->advertise_host ? strlen(c->advertise_host) : 0) + 6;
    uint32_t np = c->regions ? c->n_regions : 1, parts = c->ranks ? c->ranks : 1;
    if (!r || !(r->strs = malloc(sl)) ||
        !(r->hits = malloc((size_t)KVT_REMOTE_MAX_READ * parts * sizeof(*r->hits))) ||
        !(r->piece = malloc(np * sizeof(*r->piece))) ||
        (c->n_slots && (!(r->slots = calloc(c->n_slots, sizeof(*r->slots))) ||
                        !(r->sc_hashes = malloc((size_t)KVT_REMOTE_MAX_READ * c->hash_len)) ||
                        !(r->sc_slots = malloc(KVT_REMOTE_MAX_READ * sizeof(uint32_t))) ||
                        !(r->sc_gens = malloc(KVT_REMOTE_MAX_READ * sizeof(uint64_t)))))) {
        if (r) {
            free(r->strs);
            free(r->hits);
            free(r->piece);
            free(r->slots);
            free(r->sc_hashes);
            free(r->sc_slots);
            free(r->sc_gens);
        }
        free(r);
        return kvt_fail(KVT_ENOMEM, "remote: out of memory");
    }
    r->cfg = *c;
    r->n_pieces = np;
    r->serves = c->n_slots > 0;
    r->parts = parts;
    r->lookup_only = c->rank == KVT_REMOTE_NO_RANK;
    set_pieces_and_port(r, c);
    copy_strings(r, c);
    pthread_mutex_init(&r->mu, NULL);
    pthread_mutex_init(&r->rd_mu, NULL);
    r->next_req = ((uint64_t)getpid() << 32) ^ kvt_monotonic_ns();
    *out = r;
    return 0;
}

/* The space's keys, the directory connections, the server's socket, UCX, the registration and
 * the server thread; on failure kvt_remote_destroy undoes what was done. */
static int remote_start(kvt_remote *r, const kvt_remote_config *c)
{
    r->self = (kvi_rdir_self){.space = r->cfg.space,
                              .instance = r->cfg.instance,
                              .base = r->base,
                              .endpoint = r->endpoint,
                              .hash_seed = c->hash_seed,
                              .signature = r->cfg.signature,
                              .hash_len = c->hash_len,
                              .ttl_ms = c->ttl_ms,
                              .ranks = r->parts,
                              .rank = c->rank};
    if (r->lookup_only) /* the directory, for lookups: nothing to serve, read or register */
        return kvi_rdir_redis_open(c->directory, c->directory_password, c->directory_timeout_ms,
                                   c->retry_ms, &r->dir);
    int rc;
    /* the space's keys; the credential itself is not kept */
    if ((rc = kvi_rauth_keys(c->credential, strlen(c->credential), c->space, &r->keys)) ||
        (rc = kvi_rauth_random(r->boot, sizeof(r->boot))) ||
        (rc = kvi_rauth_block_key(&r->keys, r->cfg.instance, r->boot, r->block_key)) ||
        (rc = kvi_rgcm_new(&r->gcm)) || (rc = kvi_rgcm_new(&r->gcm_rd)))
        return rc;
    if (!(r->sess = calloc(MAX_SESSIONS, sizeof(*r->sess))))
        return kvt_fail(KVT_ENOMEM, "remote: out of memory");
    if ((rc = kvi_rdir_redis_open(c->directory, c->directory_password, c->directory_timeout_ms,
                                  c->retry_ms, &r->dir)) ||
        (rc = kvi_rdir_redis_open(c->directory, c->directory_password, c->directory_timeout_ms,
                                  c->retry_ms, &r->dir_pub)) ||
        (rc = kvi_rdir_redis_open(c->directory, c->directory_password, c->directory_timeout_ms,
                                  c->retry_ms, &r->dir_srv)))
        return rc;
    if (!(r->zctx = zmq_ctx_new()))
        return zfail("context");
    if ((rc = bind_server(r)) || (rc = kvi_ucx_create(&r->ucx_srv)) ||
        (rc = kvi_ucx_create(&r->ucx_cli)))
        return rc;
    if ((rc = kvi_remote_map_pieces(r, r->ucx_srv)) || (rc = kvi_remote_map_pieces(r, r->ucx_cli)))
        return rc;
    rc = kvi_remote_enter(r, &r->dir);
    if (rc == KVT_EINVAL)
        return rc;
    if (rc)
        KVT_LOG_W("remote: %s starts unregistered (%s); it registers when it can", c->instance,
                  kvt_last_error());
    if (pthread_create(&r->thr, NULL, kvi_remote_server_main, r) != 0)
        return kvt_fail(KVT_ESYS, "remote: cannot start the server thread");
    r->thr_started = true;
    return 0;
}

int kvt_remote_create(const kvt_remote_config *c, kvt_remote **out)
{
    if (!c || !out)
        return kvt_fail(KVT_EINVAL, "remote: create: NULL argument");
    *out = NULL;
    kvt_remote *r = NULL;
    int rc = validate(c);
    if (rc || (rc = remote_alloc(c, &r)))
        return rc;
    if ((rc = remote_start(r, c))) {
        char msg[512];
        snprintf(msg, sizeof(msg), "%s", kvt_last_error());
        kvt_remote_destroy(r);
        return kvt_fail(rc, "%s", msg);
    }
    *out = r;
    return 0;
}

void kvt_remote_destroy(kvt_remote *r)
{
    if (!r)
        return;
    if (r->rport.lent || r->rport.staged) { /* the last borrower finishes it (any order) */
        r->rport.orphaned = true;
        return;
    }
    remote_free(r);
}

static void remote_free(kvt_remote *r)
{
    if (r->thr_started) {
        atomic_store(&r->stop, true);
        pthread_join(r->thr, NULL);
    }
    uint64_t ep = atomic_load(&r->epoch);
    if (ep && r->dir.ops)
        (void)r->dir.ops->leave(r->dir.d, &r->self, ep);
    kvi_remote_bury(r, true);
    for (uint32_t i = 0; i < r->n_peers; i++)
        close_peer(&r->peers[i]);
    if (r->router)
        zmq_close(r->router);
    if (r->zctx)
        zmq_ctx_term(r->zctx);
    if (r->ucx_srv)
        kvi_ucx_destroy(r->ucx_srv);
    if (r->ucx_cli)
        kvi_ucx_destroy(r->ucx_cli);
    if (r->dir.ops)
        r->dir.ops->close(r->dir.d);
    if (r->dir_pub.ops)
        r->dir_pub.ops->close(r->dir_pub.d);
    if (r->dir_srv.ops)
        r->dir_srv.ops->close(r->dir_srv.d);
    pthread_mutex_destroy(&r->mu);
    pthread_mutex_destroy(&r->rd_mu);
    kvi_rgcm_free(r->gcm);
    kvi_rgcm_free(r->gcm_rd);
    free(r->sess);
    OPENSSL_cleanse(&r->keys, sizeof(r->keys));
    OPENSSL_cleanse(r->block_key, sizeof(r->block_key));
    for (uint32_t i = 0; i < r->n_peers; i++)
        OPENSSL_cleanse(&r->peers[i], sizeof(r->peers[i]));
    free(r->slots);
    free(r->sc_hashes);
    free(r->sc_slots);
    free(r->sc_gens);
    free(r->piece);
    free(r->hits);
    free(r->strs);
    free(r);
}

uint16_t kvt_remote_port(const kvt_remote *r)
{
    return r ? r->port : 0;
}

void kvt_remote_get_stats(kvt_remote *r, kvt_remote_stats *out)
{
    if (!r || !out)
        return;
    *out = r->st;
    out->epoch = atomic_load(&r->epoch);
    out->published = atomic_load(&r->a_published);
    out->withdrawn = atomic_load(&r->a_withdrawn);
    out->publish_dropped = atomic_load(&r->a_pub_dropped);
    out->directory_errors += atomic_load(&r->a_pub_dir_errors);
    out->reads = atomic_load(&r->a_reads);
    out->read_blocks = atomic_load(&r->a_read_blocks);
    out->read_ok = atomic_load(&r->a_read_ok);
    out->read_stale = atomic_load(&r->a_read_stale);
    out->read_failed = atomic_load(&r->a_read_failed);
    out->read_bytes = atomic_load(&r->a_read_bytes);
    out->registrations = atomic_load(&r->a_registrations);
    out->served_blocks = atomic_load(&r->a_served);
    out->served_stale = atomic_load(&r->a_served_stale);
    out->served_bytes = atomic_load(&r->a_served_bytes);
    out->refused_requests = atomic_load(&r->a_refused);
    out->handshakes = r->st.handshakes + atomic_load(&r->a_handshakes);
    out->auth_failures = r->st.auth_failures + atomic_load(&r->a_auth_failures);
}
