/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The scheduler <-> worker link over ZeroMQ (see kvtier/link.h for the protocol and
 * link_internal.h for the frames).
 *
 * The scheduler keeps every rank's reply frames until all ranks answered a step, validates
 * all of them, and only then aggregates: a malformed reply fails the step without counting
 * half of it. A request's load is reported once every rank has reported it; ranks may report
 * it in different steps (one rank's copy finished a step later), so the scheduler counts
 * reports per request across steps, as vLLM's KVOutputAggregator does.
 *
 * Replies carry the step number they answer; a reply for an earlier step (left over after a
 * timed-out step) is dropped with a warning.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "base/array.h"
#include "base/bump.h"
#include "base/error.h"
#include "base/fd.h"
#include "base/log.h"
#include "meta/wire.h"
#include "net/link_internal.h"

#define MAX_FRAMES 5u /* identity, header, status, worker meta, ids: the longest message */
#define ID_MAX     32u

typedef struct frames {
    zmq_msg_t *f;
    uint32_t n, cap;
} frames;

typedef struct rank_slot {
    uint8_t id[ID_MAX];
    size_t id_len;
    bool known;
    bool replied;
    frames rep;                 /* this step's reply, kept until the next step */
    kvi_link_status st;         /* its status frame, decoded (points into rep) */
    kvt_offload_worker_meta wm; /* its store report, decoded */
} rank_slot;

typedef struct pend_req {
    char *id;
    uint32_t len, count;
} pend_req;

struct kvt_link_sched {
    void *ctx, *sock;
    char ipc_path[256]; /* the socket file of an ipc:// endpoint, removed at destroy */
    uint32_t world;
    uint64_t step;
    uint8_t *buf;
    size_t buf_cap;
    rank_slot *ranks;
    frames in;
    pend_req *pend;
    uint32_t n_pend, cap_pend;
    kvt_bump strings;
    kvt_str *fin;
    uint32_t n_fin, cap_fin;
    kvt_offload_worker_meta stores;
    uint32_t *invalid;
    uint32_t n_invalid, cap_invalid;
};

struct kvt_link_worker {
    void *ctx, *sock;
    uint32_t rank, world;
    uint64_t step;
    bool have_step;
    frames in;
    uint8_t *buf;
    size_t buf_cap;
};

static int zfail(const char *what)
{
    int e = zmq_errno();
    return kvt_fail(KVT_EIO, "link: %s: %s", what, zmq_strerror(e));
}

static void frames_close(frames *fr)
{
    for (uint32_t i = 0; i < fr->n; i++)
        zmq_msg_close(&fr->f[i]);
    fr->n = 0;
}

static void frames_free(frames *fr)
{
    frames_close(fr);
    free(fr->f);
    fr->f = NULL;
    fr->cap = 0;
}

/* Receives one whole multipart message (the socket must be readable or blocking). */
static int recv_frames(void *sock, frames *fr)
{
    frames_close(fr);
    for (;;) {
        int rc = kvi_array_grow((void **)&fr->f, &fr->cap, fr->n + 1, sizeof(*fr->f));
        if (rc)
            return kvi_fail_wrap(rc, "link");
        zmq_msg_t *m = &fr->f[fr->n];
        zmq_msg_init(m);
        if (zmq_msg_recv(m, sock, 0) < 0) {
            zmq_msg_close(m);
            return zfail("receive");
        }
        fr->n++;
        if (!zmq_msg_more(m))
            return 0;
        if (fr->n >= MAX_FRAMES) {
            /* drain the rest so the socket stays usable, then refuse */
            zmq_msg_t t;
            zmq_msg_init(&t);
            while (zmq_msg_more(&fr->f[fr->n - 1]) && zmq_msg_recv(&t, sock, 0) >= 0 &&
                   zmq_msg_more(&t))
                ;
            zmq_msg_close(&t);
            return kvt_fail(KVT_EPROTO, "link: message of more than %u frames", MAX_FRAMES);
        }
    }
}

/* Waits until sock is readable or the deadline passes. */
static int wait_readable(void *sock, uint64_t deadline_ns, int timeout_ms, const char *what)
{
    for (;;) {
        long ms = -1;
        if (timeout_ms >= 0) {
            uint64_t now = kvt_monotonic_ns();
            if (now >= deadline_ns)
                return kvt_fail(KVT_EIO, "link: timed out after %d ms waiting for %s", timeout_ms,
                                what);
            ms = (long)((deadline_ns - now + 999999) / 1000000);
        }
        zmq_pollitem_t it = {sock, 0, ZMQ_POLLIN, 0};
        int n = zmq_poll(&it, 1, ms);
        if (n < 0 && zmq_errno() != EINTR)
            return zfail("poll");
        if (n > 0)
            return 0;
    }
}

static uint64_t deadline(int timeout_ms)
{
    return kvt_monotonic_ns() + (timeout_ms > 0 ? (uint64_t)timeout_ms * 1000000u : 0);
}

static int send_part(void *sock, const void *p, size_t n, bool more)
{
    if (zmq_send(sock, p, n, more ? ZMQ_SNDMORE : 0) < 0)
        return zfail("send");
    return 0;
}

static int grow_buf(uint8_t **buf, size_t *cap, size_t need)
{
    if (need <= *cap)
        return 0;
    size_t n = *cap ? *cap : 4096;
    while (n < need)
        n *= 2;
    uint8_t *p = realloc(*buf, n);
    if (!p)
        return kvt_fail(KVT_ENOMEM, "link: out of memory");
    *buf = p;
    *cap = n;
    return 0;
}

static int open_socket(int type, void **ctx, void **sock)
{
    int room = kvi_fd_room(16, "link");
    if (room) {
        *ctx = *sock = NULL;
        return room;
    }
    *ctx = zmq_ctx_new();
    if (!*ctx)
        return zfail("context");
    *sock = zmq_socket(*ctx, type);
    if (!*sock) {
        int rc = zfail("socket");
        zmq_ctx_term(*ctx);
        return rc;
    }
    int linger = 0;
    zmq_setsockopt(*sock, ZMQ_LINGER, &linger, sizeof(linger));
    return 0;
}

static void close_socket(void *ctx, void *sock)
{
    if (sock)
        zmq_close(sock);
    if (ctx)
        zmq_ctx_term(ctx);
}

/* ---- scheduler ---------------------------------------------------------------------------- */

int kvt_link_sched_create(const char *endpoint, uint32_t world_size, kvt_link_sched **out)
{
    *out = NULL;
    if (!endpoint || world_size == 0 || world_size > KVT_LINK_MAX_WORLD)
        return kvt_fail(KVT_EINVAL, "link: world size %u out of range 1..%u", world_size,
                        KVT_LINK_MAX_WORLD);
    kvt_link_sched *s = calloc(1, sizeof(*s));
    if (s)
        s->ranks = calloc(world_size, sizeof(*s->ranks));
    if (!s || !s->ranks) {
        free(s);
        return kvt_fail(KVT_ENOMEM, "link: out of memory");
    }
    s->world = world_size;
    kvt_offload_worker_meta_init(&s->stores);
    for (uint32_t r = 0; r < world_size; r++)
        kvt_offload_worker_meta_init(&s->ranks[r].wm);
    int rc = open_socket(ZMQ_ROUTER, &s->ctx, &s->sock);
    if (!rc) {
        int64_t maxmsg = KVT_LINK_MAX_REPLY_PART; /* a peer sending more is disconnected */
        zmq_setsockopt(s->sock, ZMQ_MAXMSGSIZE, &maxmsg, sizeof(maxmsg));
        int mandatory = 1;
        zmq_setsockopt(s->sock, ZMQ_ROUTER_MANDATORY, &mandatory, sizeof(mandatory));
        if (zmq_bind(s->sock, endpoint) != 0)
            rc = kvt_fail(KVT_EIO, "link: cannot bind %s: %s", endpoint, zmq_strerror(zmq_errno()));
        else if (strncmp(endpoint, "ipc://", 6) == 0 && strlen(endpoint + 6) < sizeof(s->ipc_path))
            strcpy(s->ipc_path, endpoint + 6);
    }
    if (rc) {
        kvt_link_sched_destroy(s);
        return rc;
    }
    *out = s;
    return 0;
}

void kvt_link_sched_destroy(kvt_link_sched *s)
{
    if (!s)
        return;
    for (uint32_t r = 0; s->ranks && r < s->world; r++) {
        frames_free(&s->ranks[r].rep);
        kvt_offload_worker_meta_release(&s->ranks[r].wm);
    }
    frames_free(&s->in);
    close_socket(s->ctx, s->sock);
    if (s->ipc_path[0])
        unlink(s->ipc_path); /* ZeroMQ leaves the socket file behind */
    for (uint32_t i = 0; i < s->n_pend; i++)
        free(s->pend[i].id);
    free(s->pend);
    free(s->ranks);
    free(s->buf);
    free(s->fin);
    free(s->invalid);
    kvt_bump_release(&s->strings);
    kvt_offload_worker_meta_release(&s->stores);
    free(s);
}

int kvt_link_sched_accept(kvt_link_sched *s, int timeout_ms, uint32_t *host_blocks)
{
    uint64_t dl = deadline(timeout_ms);
    uint32_t known = 0, min_blocks = UINT32_MAX;
    for (uint32_t r = 0; r < s->world; r++)
        s->ranks[r].known = false;
    while (known < s->world) {
        int rc = wait_readable(s->sock, dl, timeout_ms, "worker hellos");
        if (!rc)
            rc = recv_frames(s->sock, &s->in);
        if (rc)
            return rc;
        uint32_t type, rank, world, blocks;
        uint64_t step;
        if (s->in.n != 3)
            return kvt_fail(KVT_EPROTO, "link: hello of %u frames, expected 3", s->in.n);
        rc =
            kvi_link_hdr_decode(zmq_msg_data(&s->in.f[1]), zmq_msg_size(&s->in.f[1]), &type, &step);
        if (!rc && type != KVT_LINK_HELLO)
            rc = kvt_fail(KVT_EPROTO, "link: expected a hello, got message type %u", type);
        if (!rc)
            rc = kvi_link_hello_decode(zmq_msg_data(&s->in.f[2]), zmq_msg_size(&s->in.f[2]), &rank,
                                       &world, &blocks);
        if (!rc && world != s->world)
            rc = kvt_fail(KVT_EPROTO, "link: rank %u runs with world size %u, scheduler %u", rank,
                          world, s->world);
        if (!rc && s->ranks[rank].known)
            rc = kvt_fail(KVT_EPROTO, "link: rank %u said hello twice", rank);
        size_t id_len = zmq_msg_size(&s->in.f[0]);
        if (!rc && (id_len == 0 || id_len > ID_MAX))
            rc = kvt_fail(KVT_EPROTO, "link: routing id of %zu bytes", id_len);
        if (rc)
            return rc;
        rank_slot *rs = &s->ranks[rank];
        memcpy(rs->id, zmq_msg_data(&s->in.f[0]), id_len);
        rs->id_len = id_len;
        rs->known = true;
        known++;
        if (blocks < min_blocks)
            min_blocks = blocks;
    }
    *host_blocks = min_blocks;
    return 0;
}

static int send_to_all(kvt_link_sched *s, uint32_t type, const void *meta, size_t meta_len,
                       const void *payload, size_t len)
{
    uint8_t hdr[KVT_LINK_HDR_LEN];
    kvi_link_hdr_encode(hdr, type, s->step);
    for (uint32_t r = 0; r < s->world; r++)
        if (!s->ranks[r].known)
            return kvt_fail(KVT_ESTATE, "link: rank %u never said hello (call accept first)", r);
    /* every live rank hears the message even if one is gone (the first error is returned):
     * the ranks that are there run the same steps and all hear a stop */
    int first = 0;
    char msg[512];
    for (uint32_t r = 0; r < s->world; r++) {
        rank_slot *rs = &s->ranks[r];
        bool step = type == KVT_LINK_STEP;
        int rc = send_part(s->sock, rs->id, rs->id_len, true);
        if (!rc)
            rc = send_part(s->sock, hdr, sizeof(hdr), step);
        if (!rc && step)
            rc = send_part(s->sock, meta, meta_len, true);
        if (!rc && step)
            rc = send_part(s->sock, payload, len, false);
        if (rc && !first) {
            char what[64];
            snprintf(what, sizeof(what), "link: sending step %llu to rank %u",
                     (unsigned long long)s->step, r);
            first = kvi_fail_wrap(rc, what);
            snprintf(msg, sizeof(msg), "%s", kvt_last_error());
        }
    }
    return first ? kvt_fail(first, "%s", msg) : 0;
}

/* Receives one reply and files it under its rank. Stale replies are dropped. */
static int collect_one(kvt_link_sched *s, uint32_t *got)
{
    int rc = recv_frames(s->sock, &s->in);
    if (rc)
        return rc;
    if (s->in.n != 5)
        return kvt_fail(KVT_EPROTO, "link: reply of %u frames, expected 5", s->in.n);
    uint32_t type;
    uint64_t step;
    rc = kvi_link_hdr_decode(zmq_msg_data(&s->in.f[1]), zmq_msg_size(&s->in.f[1]), &type, &step);
    if (rc)
        return rc;
    if (type != KVT_LINK_REPLY)
        return kvt_fail(KVT_EPROTO, "link: expected a reply, got message type %u", type);
    if (step < s->step) {
        KVT_LOG_W("link: dropping a reply to step %llu (now at %llu)", (unsigned long long)step,
                  (unsigned long long)s->step);
        return 0;
    }
    if (step != s->step)
        return kvt_fail(KVT_EPROTO, "link: reply to step %llu, which was never sent",
                        (unsigned long long)step);
    kvi_link_status st;
    rc = kvi_link_status_decode(zmq_msg_data(&s->in.f[2]), zmq_msg_size(&s->in.f[2]), &st);
    if (rc)
        return rc;
    if (st.rank >= s->world)
        return kvt_fail(KVT_EPROTO, "link: reply from rank %u of %u", st.rank, s->world);
    rank_slot *rs = &s->ranks[st.rank];
    if (zmq_msg_size(&s->in.f[0]) != rs->id_len ||
        memcmp(zmq_msg_data(&s->in.f[0]), rs->id, rs->id_len) != 0)
        return kvt_fail(KVT_EPROTO, "link: reply claims rank %u from another peer", st.rank);
    if (rs->replied)
        return kvt_fail(KVT_EPROTO, "link: rank %u replied twice to step %llu", st.rank,
                        (unsigned long long)step);
    /* keep the frames: swap the receive buffer with the rank's (the message array moves with
     * it, so st still points into it), then decode the rest */
    frames t = rs->rep;
    rs->rep = s->in;
    s->in = t;
    rs->st = st;
    frames *f = &rs->rep;
    rc = kvt_offload_worker_meta_decode(&rs->wm, zmq_msg_data(&f->f[3]), zmq_msg_size(&f->f[3]));
    uint32_t n_ids;
    if (!rc)
        rc = kvi_link_ids_check(zmq_msg_data(&f->f[4]), zmq_msg_size(&f->f[4]), &n_ids);
    if (rc)
        return kvi_fail_wrap(rc, "link: reply");
    rs->replied = true;
    (*got)++;
    return 0;
}

static int add_invalid(kvt_link_sched *s, const kvi_link_status *st)
{
    int rc = kvi_array_grow((void **)&s->invalid, &s->cap_invalid,
                            s->n_invalid + (uint64_t)st->n_invalid, sizeof(uint32_t));
    if (rc)
        return kvi_fail_wrap(rc, "link");
    for (uint32_t i = 0; i < st->n_invalid; i++) {
        s->invalid[s->n_invalid++] = ld_le32(st->invalid + 4 * i);
    }
    return 0;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* Counts one rank's report of request id; when all ranks reported it, it is finished. */
static int count_finished(kvt_link_sched *s, const char *id, uint32_t len)
{
    uint32_t i = 0;
    for (; i < s->n_pend; i++)
        if (s->pend[i].len == len && memcmp(s->pend[i].id, id, len) == 0)
            break;
    if (i == s->n_pend) {
        int rc = kvi_array_grow((void **)&s->pend, &s->cap_pend, s->n_pend + 1, sizeof(*s->pend));
        if (rc)
            return kvi_fail_wrap(rc, "link");
        char *copy = malloc(len + 1);
        if (!copy)
            return kvt_fail(KVT_ENOMEM, "link: out of memory");
        memcpy(copy, id, len);
        copy[len] = 0;
        s->pend[s->n_pend++] = (pend_req){copy, len, 0};
    }
    if (++s->pend[i].count < s->world)
        return 0;
    int rc = kvi_array_grow((void **)&s->fin, &s->cap_fin, s->n_fin + 1, sizeof(*s->fin));
    if (rc)
        return kvi_fail_wrap(rc, "link");
    char *str = kvi_bump_strdup(&s->strings, id, len);
    if (!str)
        return kvt_fail(KVT_ENOMEM, "link: out of memory");
    s->fin[s->n_fin++] = (kvt_str){str, len};
    free(s->pend[i].id);
    s->pend[i] = s->pend[--s->n_pend];
    return 0;
}

/* All replies are in, each validated and decoded as it arrived: report the first rank that
 * failed, else aggregate. */
static int aggregate(kvt_link_sched *s, kvt_link_result *res)
{
    for (uint32_t r = 0; r < s->world; r++) {
        const kvi_link_status *st = &s->ranks[r].st;
        if (st->status != 0)
            return kvt_fail(st->status, "link: rank %u failed: %.*s", r, (int)st->msg_len, st->msg);
    }
    kvt_offload_worker_meta_clear(&s->stores);
    kvt_bump_clear(&s->strings);
    s->n_fin = s->n_invalid = 0;
    for (uint32_t r = 0; r < s->world; r++) {
        frames *f = &s->ranks[r].rep;
        int rc = kvt_offload_worker_meta_aggregate(&s->stores, &s->ranks[r].wm);
        if (!rc)
            rc = add_invalid(s, &s->ranks[r].st);
        const uint8_t *p = zmq_msg_data(&f->f[4]); /* checked by collect_one */
        uint32_t n_ids = ld_le32(p);
        p += 4;
        for (uint32_t k = 0; !rc && k < n_ids; k++) {
            uint32_t l = ld_le32(p);
            rc = count_finished(s, (const char *)p + 4, l);
            p += 4 + (size_t)l;
        }
        if (rc)
            return rc;
    }
    if (s->n_invalid > 1)
        qsort(s->invalid, s->n_invalid, sizeof(uint32_t), cmp_u32);
    uint32_t k = 0;
    for (uint32_t i = 0; i < s->n_invalid; i++)
        if (k == 0 || s->invalid[k - 1] != s->invalid[i])
            s->invalid[k++] = s->invalid[i];
    s->n_invalid = k;
    res->finished_loads = s->fin;
    res->n_finished = s->n_fin;
    res->stores = &s->stores;
    res->invalid_blocks = s->invalid;
    res->n_invalid = s->n_invalid;
    return 0;
}

/* A step timed out: names the ranks that did not answer (a dead, hung or partitioned
 * worker), so the operator knows which process to look at. */
static int silent_ranks(const kvt_link_sched *s, int timeout_ms)
{
    char list[96];
    size_t n = 0;
    uint32_t silent = 0;
    list[0] = 0;
    for (uint32_t r = 0; r < s->world; r++) {
        if (s->ranks[r].replied)
            continue;
        if (silent++ < 8 && n < sizeof(list)) {
            int k = snprintf(list + n, sizeof(list) - n, "%s%u", n ? ", " : "", r);
            n += k > 0 ? (size_t)k : 0;
        }
    }
    return kvt_fail(KVT_EIO,
                    "link: step %llu timed out after %d ms: %u of %u ranks did not answer "
                    "(%s%s)",
                    (unsigned long long)s->step, timeout_ms, silent, s->world, list,
                    silent > 8 ? ", ..." : "");
}

int kvt_link_sched_step(kvt_link_sched *s, const kvt_offload_meta *meta, const void *payload,
                        size_t len, int timeout_ms, kvt_link_result *res)
{
    memset(res, 0, sizeof(*res));
    size_t need = kvt_offload_meta_encoded_size(meta), meta_len;
    if (need > KVT_LINK_MAX_STEP_PART || len > KVT_LINK_MAX_STEP_PART)
        return kvt_fail(KVT_ELIMIT,
                        "link: a step of %zu metadata and %zu payload bytes (each at most %u: "
                        "the workers refuse more)",
                        need, len, KVT_LINK_MAX_STEP_PART);
    int rc = grow_buf(&s->buf, &s->buf_cap, need);
    if (!rc)
        rc = kvt_offload_meta_encode(meta, s->buf, s->buf_cap, &meta_len);
    if (rc)
        return rc;
    s->step++;
    for (uint32_t r = 0; r < s->world; r++) {
        s->ranks[r].replied = false;
        frames_close(&s->ranks[r].rep);
    }
    rc = send_to_all(s, KVT_LINK_STEP, s->buf, meta_len, payload ? payload : "", len);
    if (rc)
        return rc;
    uint64_t dl = deadline(timeout_ms);
    uint32_t got = 0;
    while (got < s->world) {
        rc = wait_readable(s->sock, dl, timeout_ms, "worker replies");
        if (rc == KVT_EIO)
            return silent_ranks(s, timeout_ms);
        if (!rc)
            rc = collect_one(s, &got);
        if (rc)
            return rc;
    }
    return aggregate(s, res);
}

int kvt_link_sched_stop(kvt_link_sched *s)
{
    s->step++;
    return send_to_all(s, KVT_LINK_STOP, NULL, 0, NULL, 0);
}

/* ---- worker ------------------------------------------------------------------------------- */

int kvt_link_worker_create(const char *endpoint, uint32_t rank, uint32_t world_size,
                           uint32_t host_blocks, kvt_link_worker **out)
{
    *out = NULL;
    if (!endpoint || world_size == 0 || world_size > KVT_LINK_MAX_WORLD || rank >= world_size)
        return kvt_fail(KVT_EINVAL, "link: rank %u of world %u invalid", rank, world_size);
    if (host_blocks < 2)
        return kvt_fail(KVT_EINVAL, "link: %u host blocks (need >= 2)", host_blocks);
    kvt_link_worker *w = calloc(1, sizeof(*w));
    if (!w)
        return kvt_fail(KVT_ENOMEM, "link: out of memory");
    w->rank = rank;
    w->world = world_size;
    int rc = open_socket(ZMQ_DEALER, &w->ctx, &w->sock);
    if (!rc) {
        int64_t maxmsg = KVT_LINK_MAX_STEP_PART;
        zmq_setsockopt(w->sock, ZMQ_MAXMSGSIZE, &maxmsg, sizeof(maxmsg));
        char id[ID_MAX];
        int n = snprintf(id, sizeof(id), "kvt-rank-%u", rank);
        zmq_setsockopt(w->sock, ZMQ_ROUTING_ID, id, (size_t)n);
        if (zmq_connect(w->sock, endpoint) != 0)
            rc = kvt_fail(KVT_EIO, "link: cannot connect to %s: %s", endpoint,
                          zmq_strerror(zmq_errno()));
    }
    uint8_t hdr[KVT_LINK_HDR_LEN], hello[KVT_LINK_HELLO_LEN];
    kvi_link_hdr_encode(hdr, KVT_LINK_HELLO, 0);
    kvi_link_hello_encode(hello, rank, world_size, host_blocks);
    if (!rc)
        rc = send_part(w->sock, hdr, sizeof(hdr), true);
    if (!rc)
        rc = send_part(w->sock, hello, sizeof(hello), false);
    if (rc) {
        kvt_link_worker_destroy(w);
        return rc;
    }
    *out = w;
    return 0;
}

void kvt_link_worker_destroy(kvt_link_worker *w)
{
    if (!w)
        return;
    frames_free(&w->in);
    close_socket(w->ctx, w->sock);
    free(w->buf);
    free(w);
}

int kvt_link_worker_recv(kvt_link_worker *w, int timeout_ms, kvt_offload_meta *meta,
                         const void **payload, size_t *len, bool *stop)
{
    *payload = NULL;
    *len = 0;
    *stop = false;
    kvt_offload_meta_clear(meta);
    int rc = wait_readable(w->sock, deadline(timeout_ms), timeout_ms, "the scheduler");
    if (!rc)
        rc = recv_frames(w->sock, &w->in);
    if (rc)
        return rc;
    uint32_t type;
    uint64_t step;
    rc = kvi_link_hdr_decode(zmq_msg_data(&w->in.f[0]), zmq_msg_size(&w->in.f[0]), &type, &step);
    if (rc)
        return rc;
    if (type == KVT_LINK_STOP && w->in.n == 1) {
        *stop = true;
        return 0;
    }
    if (type != KVT_LINK_STEP || w->in.n != 3)
        return kvt_fail(KVT_EPROTO, "link: expected a step of 3 frames, got type %u with %u", type,
                        w->in.n);
    if (w->have_step && step <= w->step)
        return kvt_fail(KVT_EPROTO, "link: step %llu after step %llu", (unsigned long long)step,
                        (unsigned long long)w->step);
    rc = kvt_offload_meta_decode(meta, zmq_msg_data(&w->in.f[1]), zmq_msg_size(&w->in.f[1]));
    if (rc)
        return rc;
    w->step = step;
    w->have_step = true;
    *payload = zmq_msg_data(&w->in.f[2]);
    *len = zmq_msg_size(&w->in.f[2]);
    return 0;
}

int kvt_link_worker_reply(kvt_link_worker *w, int status, const kvt_str *finished,
                          uint32_t n_finished, const kvt_offload_worker_meta *stores,
                          const uint32_t *invalid, uint32_t n_invalid)
{
    if (!w->have_step)
        return kvt_fail(KVT_ESTATE, "link: no step to answer");
    if (status > 0 || status < KVT_EUNSUPPORTED)
        return kvt_fail(KVT_EINVAL, "link: status %d is not a kvtier code", status);
    if (n_invalid > KVT_LINK_MAX_INVALID)
        return kvt_fail(KVT_ELIMIT, "link: %u invalid blocks", n_invalid);
    const char *msg = status ? kvt_last_error() : "";
    uint32_t msg_len = (uint32_t)strnlen(msg, KVT_META_MAX_STR);
    kvt_offload_worker_meta empty;
    kvt_offload_worker_meta_init(&empty);
    if (!stores)
        stores = &empty;
    size_t st_len = kvi_link_status_size(n_invalid, msg_len);
    size_t wm_len = kvt_offload_worker_meta_encoded_size(stores), got;
    size_t ids_len = kvi_link_ids_size(finished, n_finished);
    if (n_finished > KVT_META_MAX_ITEMS)
        return kvt_fail(KVT_ELIMIT, "link: %u finished requests (at most %u)", n_finished,
                        KVT_META_MAX_ITEMS);
    for (uint32_t i = 0; i < n_finished; i++)
        if (finished[i].len == 0 || finished[i].len > KVT_META_MAX_STR)
            return kvt_fail(KVT_EINVAL, "link: finished request id of %u bytes", finished[i].len);
    if (st_len > KVT_LINK_MAX_REPLY_PART || wm_len > KVT_LINK_MAX_REPLY_PART ||
        ids_len > KVT_LINK_MAX_REPLY_PART)
        return kvt_fail(KVT_ELIMIT, "link: a reply part over %u bytes (the scheduler refuses it)",
                        KVT_LINK_MAX_REPLY_PART);
    int rc = grow_buf(&w->buf, &w->buf_cap, st_len + wm_len + ids_len);
    if (rc)
        return rc;
    kvi_link_status_encode(w->buf, w->rank, status, invalid, n_invalid, msg, msg_len);
    rc = kvt_offload_worker_meta_encode(stores, w->buf + st_len, wm_len, &got);
    if (rc)
        return rc;
    uint8_t hdr[KVT_LINK_HDR_LEN];
    kvi_link_hdr_encode(hdr, KVT_LINK_REPLY, w->step);
    rc = send_part(w->sock, hdr, sizeof(hdr), true);
    if (!rc)
        rc = send_part(w->sock, w->buf, st_len, true);
    if (!rc)
        rc = send_part(w->sock, w->buf + st_len, got, true);
    if (!rc) {
        kvi_link_ids_encode(w->buf + st_len + got, finished, n_finished);
        rc = send_part(w->sock, w->buf + st_len + got, ids_len, false);
    }
    return rc;
}
