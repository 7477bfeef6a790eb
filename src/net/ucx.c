/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The encoder-cache data plane over UCX tag matching (ucx.h).
 */
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <ucp/api/ucp.h>
#include <ucs/algorithm/crc.h>
#include <ucs/debug/log_def.h>

#include "base/error.h"
#include "base/log.h"
#include "net/spin.h"
#include "net/ucx.h"
#include "kvtier/base.h"

#define MAX_EPS 64

struct kvi_ucx_recv {
    void *req;
    size_t want;
    volatile bool done;
    ucs_status_t status;
    size_t got;
};

typedef struct ep_slot {
    void *addr;
    size_t len;
    ucp_ep_h ep;
    volatile bool failed; /* the error handler ran, or a send failed: the peer is gone */
    bool pinned;          /* used by the batch being resolved: not evicted */
} ep_slot;

/* A sender with nothing completed spins this long (spin.h: not at all while the machine is
 * crowded), then sleeps on the worker's descriptor for at most 1 ms
 * at a time. Measured (docs/benchmarks.md): spinning 20 us before sleeping up to 100 ms gave
 * 16 MiB batches over tcp at 1.8-3.6 GB/s from run to run (the descriptor does not always wake
 * the sender when its socket can take more bytes); 200 us and 1 ms naps give 3.3-3.5, as
 * spinning throughout does, while leaving the CPU to the receiver between items. */
#define SPIN_NS 200000ull
#define NAP_MS  1
/* How long a cancel or a forced close may take to let go of a send, and an endpoint's close to
 * finish, before it is abandoned (UCX 1.13 keeps a rendezvous send whose peer never answered
 * pending past its endpoint's forced close: issue 57, an owner's thread spun there for ever).
 * A second: a link that comes back within it lets the send finish (a cancel cannot stop a
 * rendezvous under way), so the receiver's buffer is not left held by a half-done receive. */
#define LET_GO_NS 1000000000ull

typedef struct inflight inflight;

/* A batch's in-flight states that UCX still holds after its sends were abandoned: their
 * requests' callbacks may still write them, so they are kept until every one completed (a
 * later call reaps them) or the worker is gone. Closed endpoints whose close did not finish
 * wait here too (their error handler's argument). */
typedef struct orphans {
    inflight *fl;
    uint32_t n;
    struct ep_slot *ep;
    struct orphans *next;
} orphans;

struct kvi_ucx {
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_address_t *addr;
    size_t addr_len;
    ucp_mem_h *mem; /* registered buffers (kvi_ucx_map) */
    uint32_t n_mem;
    ep_slot *eps[MAX_EPS]; /* heap slots: the error handler keeps a pointer to its own */
    bool peer_failure;     /* endpoints ask UCX for peer failure detection */
    int efd;               /* the worker's event descriptor, -1 until a sender sleeps on it */
    kvi_spin spin;         /* a sender's spin before it sleeps */
    unsigned addr_version; /* the format version of our own worker address */
    bool addr_parses;      /* our own address parses (ucx_addr.c): peers' are checked in full */
    kvi_ucx_addr_ref ref;  /* our own address's transports, what peers' are checked against */
    uint32_t n_eps, evict;
    orphans *orphans;   /* abandoned sends and closes UCX still holds (reap_orphans) */
    uint64_t abandoned; /* sends abandoned so far (kvi_ucx_abandoned) */
};

static int ufail(ucs_status_t st, const char *what)
{
    return kvt_fail(KVT_EIO, "ucx: %s: %s", what, ucs_status_string(st));
}

/* Set while an endpoint asks for peer failure detection: transports without it (shared memory)
 * make UCX log an error before it answers UNREACHABLE, which endpoint() handles. */
static _Thread_local bool g_quiet_unreachable;

/* UCX prints its log on stdout by default, where it would break a program's own output (the
 * CLI's --json, a pipe to a parent). Unless the user chose a file with UCX_LOG_FILE, kvtier
 * routes UCX's messages to stderr, with the level filter UCX applies itself. */
static ucs_log_func_rc_t log_to_stderr(const char *file, unsigned line, const char *function,
                                       ucs_log_level_t level,
                                       const ucs_log_component_config_t *comp, const char *fmt,
                                       va_list ap)
{
    (void)function;
    if (level > comp->log_level && level != UCS_LOG_LEVEL_PRINT)
        return UCS_LOG_FUNC_RC_CONTINUE;
    if (g_quiet_unreachable && level == UCS_LOG_LEVEL_ERROR && strstr(fmt, "no peer failure"))
        return UCS_LOG_FUNC_RC_STOP;
    char msg[1024];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    const char *base = strrchr(file, '/');
    fprintf(stderr, "[ucx %s] %s:%u %s\n", ucs_log_level_names[level], base ? base + 1 : file, line,
            msg);
    return UCS_LOG_FUNC_RC_STOP;
}

static pthread_once_t g_log_once = PTHREAD_ONCE_INIT;

static void route_ucx_log(void)
{
    const char *f = getenv("UCX_LOG_FILE");
    if (!f || !*f)
        ucs_log_push_handler(log_to_stderr);
}

bool kvi_ucx_host_rdma(void)
{
    DIR *d = opendir("/sys/class/infiniband");
    if (!d)
        return false;
    bool any = false;
    for (struct dirent *e; !any && (e = readdir(d));)
        any = e->d_name[0] != '.';
    closedir(d);
    return any;
}

const char *kvi_ucx_rndv_thresh(const char *user_env, bool rdma, bool shm)
{
    return (user_env && *user_env) || rdma || shm ? NULL : KVI_UCX_EC_RNDV_THRESH;
}

/* Whether a context's transports (its address's) include a shared-memory one. */
static bool has_shm(const kvi_ucx_addr_ref *ref)
{
    static const char *const shm[] = {"posix", "sysv", "cma", "xpmem", "knem"};
    for (uint32_t i = 0; i < ref->n; i++)
        for (size_t k = 0; k < sizeof(shm) / sizeof(shm[0]); k++)
            if (ref->e[i].csum == ucs_crc16_string(shm[k]))
                return true;
    return false;
}

/* UCX's configuration (its environment) with kvtier's choices where the user made none:
 * rndv_thresh, if not NULL, the rendezvous threshold. */
static ucs_status_t read_config(const char *rndv_thresh, ucp_config_t **cfg)
{
    ucs_status_t st = ucp_config_read(NULL, NULL, cfg);
    if (st != UCS_OK)
        return st;
    /* the classic selection, unless the user chose with UCX_PROTO_ENABLE (ucx.h) */
    const char *pe = getenv("UCX_PROTO_ENABLE");
    if ((!pe || !*pe) && ucp_config_modify(*cfg, "PROTO_ENABLE", "n") != UCS_OK)
        KVT_LOG_D("ucx: this UCX has no PROTO_ENABLE setting; its default protocols are used");
    if (rndv_thresh && ucp_config_modify(*cfg, "RNDV_THRESH", rndv_thresh) != UCS_OK)
        KVT_LOG_D("ucx: this UCX has no RNDV_THRESH setting; its own threshold is used");
    return UCS_OK;
}

static void close_worker(kvi_ucx *u)
{
    if (u->addr)
        ucp_worker_release_address(u->worker, u->addr);
    if (u->worker)
        ucp_worker_destroy(u->worker);
    if (u->ctx)
        ucp_cleanup(u->ctx);
    u->addr = NULL;
    u->worker = NULL;
    u->ctx = NULL;
}

/* u's context, worker and address (parsed into u->ref), rndv_thresh as read_config takes it. */
static int open_worker(kvi_ucx *u, const char *rndv_thresh)
{
    ucp_config_t *cfg;
    ucs_status_t st = read_config(rndv_thresh, &cfg);
    if (st != UCS_OK)
        return ufail(st, "reading the configuration");
    ucp_params_t p = {.field_mask = UCP_PARAM_FIELD_FEATURES,
                      .features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP};
    st = ucp_init(&p, cfg, &u->ctx);
    ucp_config_release(cfg);
    if (st != UCS_OK) {
        u->ctx = NULL;
        return ufail(st, "init");
    }
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    st = ucp_worker_create(u->ctx, &wp, &u->worker);
    if (st != UCS_OK)
        u->worker = NULL;
    else if ((st = ucp_worker_get_address(u->worker, &u->addr, &u->addr_len)) != UCS_OK)
        u->addr = NULL;
    if (st != UCS_OK) {
        int rc = ufail(st, "worker");
        close_worker(u);
        return rc;
    }
    u->addr_version = ((const uint8_t *)u->addr)[0] & 0x0fu;
    u->addr_parses = kvi_ucx_addr_parse(u->addr, u->addr_len, u->addr_version, NULL, &u->ref) == 0;
    /* tcp's device address is an IPv4 or an IPv6 one: both lengths are its own */
    uint16_t tcp = ucs_crc16_string("tcp");
    for (uint32_t i = 0; i < u->ref.n; i++)
        u->ref.e[i].any_dev_len = u->ref.e[i].csum == tcp;
    return 0;
}

int kvi_ucx_create(kvi_ucx **out)
{
    return kvi_ucx_create_as(out, 0);
}

int kvi_ucx_create_as(kvi_ucx **out, unsigned flags)
{
    if (!out)
        return kvt_fail(KVT_EINVAL, "ucx: create: NULL out");
    *out = NULL;
    pthread_once(&g_log_once, route_ucx_log);
    kvi_ucx *u = calloc(1, sizeof(*u));
    if (!u)
        return kvt_fail(KVT_ENOMEM, "ucx: out of memory");
    u->efd = -1;
    kvi_spin_init(&u->spin, SPIN_NS, true);
    int rc = open_worker(u, NULL);
    /* an encoder-cache sender's small items eager (ucx.h): which transports the context has is
     * known once it is made, so one that qualifies is made again with the threshold */
    const char *rt =
        !rc && (flags & KVI_UCX_EC_SENDER) && u->addr_parses
            ? kvi_ucx_rndv_thresh(getenv("UCX_RNDV_THRESH"), kvi_ucx_host_rdma(), has_shm(&u->ref))
            : NULL;
    if (rt) {
        close_worker(u);
        rc = open_worker(u, rt);
    }
    if (rc) {
        free(u);
        return rc;
    }
    if (!u->addr_parses) {
        static _Atomic bool said;
        if (!atomic_exchange(&said, true))
            KVT_LOG_E("ucx: this UCX (%s) packs worker addresses in a layout kvtier does not "
                      "parse (%s): peers' addresses are checked by their header only, and a "
                      "crafted one may abort the process inside UCX",
                      ucp_get_version_string(), kvt_last_error());
    }
    *out = u;
    return 0;
}

static void keep_orphan(kvi_ucx *u, inflight *fl, uint32_t n, ep_slot *ep)
{
    orphans *o = calloc(1, sizeof(*o));
    if (!o) { /* no room to remember them: kept for good rather than freed under UCX */
        KVT_LOG_E("ucx: out of memory: an abandoned send's state is kept for good");
        return;
    }
    *o = (orphans){fl, n, ep, u->orphans};
    u->orphans = o;
}

/* A forced close, waited for within LET_GO_NS: past it the close is left to UCX (its request
 * freed when it completes) and the slot, its error handler's argument, kept until the worker
 * goes. */
static void close_ep(kvi_ucx *u, uint32_t i)
{
    ep_slot *s = u->eps[i];
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                             .flags = UCP_EP_CLOSE_FLAG_FORCE};
    void *r = ucp_ep_close_nbx(s->ep, &p);
    bool done = true;
    if (UCS_PTR_IS_PTR(r)) {
        uint64_t end = kvt_monotonic_ns() + LET_GO_NS;
        while ((done = ucp_request_check_status(r) != UCS_INPROGRESS) == false &&
               kvt_monotonic_ns() < end)
            ucp_worker_progress(u->worker);
        ucp_request_free(r); /* in progress: released by UCX when it completes */
    }
    u->eps[i] = u->eps[--u->n_eps];
    if (!done) {
        KVT_LOG_W("ucx: an endpoint's close did not finish in %llu ms; left to UCX",
                  (unsigned long long)(LET_GO_NS / 1000000u));
        keep_orphan(u, NULL, 0, s);
        return;
    }
    free(s->addr);
    free(s);
}

static void free_orphan(orphans *o)
{
    free(o->fl);
    if (o->ep) {
        free(o->ep->addr);
        free(o->ep);
    }
    free(o);
}

void kvi_ucx_destroy(kvi_ucx *u)
{
    if (!u)
        return;
    while (u->n_eps)
        close_ep(u, 0);
    for (uint32_t i = 0; i < u->n_mem; i++)
        ucp_mem_unmap(u->ctx, u->mem[i]);
    free(u->mem);
    close_worker(u); /* no callback runs once the worker is gone: the orphans' states go */
    while (u->orphans) {
        orphans *o = u->orphans;
        u->orphans = o->next;
        free_orphan(o);
    }
    free(u);
}

int kvi_ucx_address(kvi_ucx *u, const void **addr, size_t *len)
{
    *addr = u->addr;
    *len = u->addr_len;
    return 0;
}

int kvi_ucx_address_check(const kvi_ucx *u, const void *addr, size_t len)
{
    /* UCX unpacks a worker address without bounds on what it trusts (a crafted byte aborts the
     * process inside ucp_ep_create, or makes it read past the end): the whole address is parsed
     * first (ucx_addr.c). Our own address parsed at create, so the format is the one this
     * build's UCX packs; where it did not (another UCX's format), the header byte is all that
     * can be compared, and create said so. */
    if (u->addr_parses)
        return kvi_ucx_addr_parse(addr, len, u->addr_version, &u->ref, NULL);
    const uint8_t *a = addr;
    if (!addr || len < 9 || len > KVI_UCX_ADDR_MAX)
        return kvt_fail(KVT_EPROTO, "ucx: a peer's worker address of %zu bytes", len);
    if (a[0] != ((const uint8_t *)u->addr)[0])
        return kvt_fail(KVT_EPROTO,
                        "ucx: a peer's worker address has header 0x%02x, this build's UCX packs "
                        "0x%02x (another UCX version or configuration, or a forged address)",
                        a[0], ((const uint8_t *)u->addr)[0]);
    return 0;
}

int kvi_ucx_map(kvi_ucx *u, void *base, size_t len)
{
    ucp_mem_h *m = realloc(u->mem, (u->n_mem + 1) * sizeof(*m));
    if (!m)
        return kvt_fail(KVT_ENOMEM, "ucx: out of memory");
    u->mem = m;
    ucp_mem_map_params_t mp = {.field_mask =
                                   UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH,
                               .address = base,
                               .length = len};
    ucs_status_t st = ucp_mem_map(u->ctx, &mp, &u->mem[u->n_mem]);
    if (st != UCS_OK)
        return ufail(st, "registering a buffer");
    u->n_mem++;
    return 0;
}

void kvi_ucx_set_peer_failure(kvi_ucx *u, bool on)
{
    u->peer_failure = on;
}

unsigned kvi_ucx_progress(kvi_ucx *u)
{
    return ucp_worker_progress(u->worker);
}

int kvi_ucx_efd(kvi_ucx *u, int *fd)
{
    ucs_status_t st = ucp_worker_get_efd(u->worker, fd);
    return st == UCS_OK ? 0 : ufail(st, "event descriptor");
}

int kvi_ucx_arm(kvi_ucx *u)
{
    ucs_status_t st = ucp_worker_arm(u->worker);
    if (st == UCS_OK)
        return 0;
    if (st == UCS_ERR_BUSY)
        return 1;
    return ufail(st, "arming the event descriptor");
}

/* ---- receive ------------------------------------------------------------------------------- */

static void recv_cb(void *req, ucs_status_t st, const ucp_tag_recv_info_t *info, void *arg)
{
    (void)req;
    kvi_ucx_recv *r = arg;
    r->status = st;
    r->got = st == UCS_OK && info ? info->length : 0;
    r->done = true;
}

int kvi_ucx_recv_post(kvi_ucx *u, void *buf, size_t len, uint64_t tag, kvi_ucx_recv **out)
{
    kvi_ucx_recv *r = calloc(1, sizeof(*r));
    if (!r)
        return kvt_fail(KVT_ENOMEM, "ucx: out of memory for a receive");
    r->want = len;
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                             UCP_OP_ATTR_FIELD_USER_DATA |
                                             UCP_OP_ATTR_FLAG_NO_IMM_CMPL,
                             .cb.recv = recv_cb,
                             .user_data = r};
    void *q = ucp_tag_recv_nbx(u->worker, buf, len, tag, UINT64_MAX, &p);
    if (UCS_PTR_IS_ERR(q)) {
        free(r);
        return ufail(UCS_PTR_STATUS(q), "posting a receive");
    }
    r->req = q;
    *out = r;
    return 0;
}

static void progress_until(kvi_ucx *u, volatile bool *flag, int wait_ms)
{
    uint64_t end = kvt_monotonic_ns() + (uint64_t)(wait_ms > 0 ? wait_ms : 0) * 1000000ull;
    do {
        while (ucp_worker_progress(u->worker))
            ;
    } while (!*flag && kvt_monotonic_ns() < end);
}

int kvi_ucx_recv_wait(kvi_ucx *u, kvi_ucx_recv *r, int wait_ms)
{
    if (!r->done)
        progress_until(u, &r->done, wait_ms);
    if (!r->done)
        return 0;
    if (r->status != UCS_OK)
        return ufail(r->status, "receive");
    if (r->got != r->want)
        return kvt_fail(KVT_EIO, "ucx: receive: %zu of %zu bytes arrived", r->got, r->want);
    return 1;
}

int kvi_ucx_recv_end(kvi_ucx *u, kvi_ucx_recv *r, int wait_ms)
{
    if (!r)
        return 0;
    if (!r->done) {
        ucp_request_cancel(u->worker, r->req);
        progress_until(u, &r->done, wait_ms);
        if (!r->done)
            return kvt_fail(KVT_EBUSY, "ucx: a receive is still under way; its memory is kept");
    }
    bool full = r->status == UCS_OK && r->got == r->want;
    ucp_request_free(r->req);
    free(r);
    return full ? 1 : 0;
}

void kvi_ucx_recv_forget(kvi_ucx_recv *r)
{
    free(r);
}

/* ---- send ---------------------------------------------------------------------------------- */

static void ep_err_cb(void *arg, ucp_ep_h ep, ucs_status_t st)
{
    (void)ep;
    ep_slot *s = arg;
    s->failed = true;
    KVT_LOG_W("ucx: a peer endpoint failed: %s", ucs_status_string(st));
}

static int endpoint(kvi_ucx *u, const void *addr, size_t len, uint32_t *slot)
{
    for (uint32_t i = 0; i < u->n_eps; i++)
        if (u->eps[i]->len == len && memcmp(u->eps[i]->addr, addr, len) == 0) {
            if (!u->eps[i]->failed) {
                *slot = i;
                return 0;
            }
            close_ep(u, i); /* the peer went away: a fresh endpoint may reach its successor */
            break;
        }
    if (u->n_eps == MAX_EPS) { /* an endpoint of another batch makes room (at most half pinned) */
        uint32_t e = u->evict++ % MAX_EPS;
        while (u->eps[e]->pinned)
            e = u->evict++ % MAX_EPS;
        close_ep(u, e);
    }
    ep_slot *s = calloc(1, sizeof(*s));
    if (s)
        s->addr = malloc(len);
    if (!s || !s->addr) {
        free(s);
        return kvt_fail(KVT_ENOMEM, "ucx: out of memory for an endpoint");
    }
    memcpy(s->addr, addr, len);
    s->len = len;
    ucp_ep_params_t ep = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER,
        .address = s->addr,
        .err_mode = u->peer_failure ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE,
        .err_handler = {ep_err_cb, s}};
    g_quiet_unreachable = u->peer_failure;
    ucs_status_t st = ucp_ep_create(u->worker, &ep, &s->ep);
    g_quiet_unreachable = false;
    if (st == UCS_ERR_UNREACHABLE && u->peer_failure) {
        /* shared memory and cma have no peer failure detection: connect without it (a dead
         * consumer then shows as a send that times out, and the endpoint is forced closed) */
        ep.err_mode = UCP_ERR_HANDLING_MODE_NONE;
        st = ucp_ep_create(u->worker, &ep, &s->ep);
    }
    if (st != UCS_OK) {
        free(s->addr);
        free(s);
        return ufail(st, "connecting to a consumer shard");
    }
    u->eps[u->n_eps] = s;
    *slot = u->n_eps++;
    return 0;
}

typedef struct send_state {
    volatile bool done;
    ucs_status_t status;
} send_state;

static void send_cb(void *req, ucs_status_t st, void *arg)
{
    (void)req;
    send_state *s = arg;
    s->status = st;
    s->done = true;
}

/* A send in flight: its item and its request. */
struct inflight {
    send_state ss;
    void *q;
    uint32_t item;
    ep_slot *ep;
};

/* Frees the requests of abandoned sends that completed since, and the states no request
 * holds any more. */
static void reap_orphans(kvi_ucx *u)
{
    for (orphans **pp = &u->orphans; *pp;) {
        orphans *o = *pp;
        bool held = false;
        for (uint32_t j = 0; j < o->n; j++) {
            if (o->fl[j].q && o->fl[j].ss.done) {
                ucp_request_free(o->fl[j].q);
                o->fl[j].q = NULL;
            }
            held |= o->fl[j].q != NULL;
        }
        if (held || o->ep) { /* an unfinished close's slot stays until the worker goes */
            pp = &o->next;
            continue;
        }
        *pp = o->next;
        free_orphan(o);
    }
}

uint64_t kvi_ucx_abandoned(const kvi_ucx *u)
{
    return u ? u->abandoned : 0;
}

/* Ends a completed send: its item's outcome, its request freed, a failed endpoint closed. */
static void send_done(kvi_ucx_send_item *it, inflight *f)
{
    ucp_request_free(f->q);
    f->q = NULL;
    if (f->ss.status == UCS_OK && !f->ep->failed) {
        it->rc = 0;
        return;
    }
    f->ep->failed = true;
    it->rc = ufail(f->ss.status != UCS_OK ? f->ss.status : UCS_ERR_ENDPOINT_TIMEOUT, "send");
}

/* Progresses until no send of fl is in flight, or the deadline: whether none is. */
static bool let_go(kvi_ucx *u, const inflight *fl, uint32_t nfl, uint64_t end)
{
    for (;;) {
        ucp_worker_progress(u->worker);
        bool busy = false;
        for (uint32_t j = 0; j < nfl; j++)
            busy |= fl[j].q && !fl[j].ss.done;
        if (!busy)
            return true;
        if (kvt_monotonic_ns() >= end)
            return false;
    }
}

/* Cancels what is still in flight and waits, within LET_GO_NS, until UCX lets go of every
 * source; the endpoints that still hold sends are forced closed (which completes what is
 * outstanding) and waited for within LET_GO_NS again. A send UCX holds even then is
 * abandoned: its item fails, its state stays with the request (the caller keeps fl, see
 * kvi_ucx_send_many_prep). Its endpoint is closed: no more bytes move for it, so its source
 * is not read again. Returns whether any send was abandoned. */
static bool send_abort(kvi_ucx *u, kvi_ucx_send_item *v, inflight *fl, uint32_t nfl, int timeout_ms)
{
    for (uint32_t j = 0; j < nfl; j++)
        if (fl[j].q && !fl[j].ss.done)
            ucp_request_cancel(u->worker, fl[j].q);
    (void)let_go(u, fl, nfl, kvt_monotonic_ns() + LET_GO_NS);
    for (uint32_t j = 0; j < nfl; j++) {
        if (!fl[j].q || fl[j].ss.done)
            continue;
        ep_slot *ep = fl[j].ep;
        for (uint32_t k = 0; k < nfl; k++) /* no pointer to it survives the close */
            if (fl[k].ep == ep)
                fl[k].ep = NULL;
        for (uint32_t e = 0; e < u->n_eps; e++)
            if (u->eps[e] == ep) {
                close_ep(u, e);
                break;
            }
    }
    (void)let_go(u, fl, nfl, kvt_monotonic_ns() + LET_GO_NS);
    bool kept = false;
    for (uint32_t j = 0; j < nfl; j++) {
        if (!fl[j].q)
            continue;
        if (fl[j].ep)
            fl[j].ep->failed = true; /* cancelled sends leave the stream in doubt: reconnect */
        v[fl[j].item].rc = kvt_fail(KVT_EIO, "ucx: send of %zu bytes made no progress in %d ms",
                                    v[fl[j].item].len, timeout_ms);
        if (!fl[j].ss.done) { /* abandoned: the request and its state stay with UCX */
            kept = true;
            u->abandoned++;
            continue;
        }
        ucp_request_free(fl[j].q);
        fl[j].q = NULL;
    }
    if (kept)
        KVT_LOG_W("ucx: sends that made no progress in %d ms were abandoned (their peer never "
                  "took them; %llu so far)",
                  timeout_ms, (unsigned long long)u->abandoned);
    return kept;
}

/* Sleeps until the worker has events, or a nap passed. */
static void wait_events(kvi_ucx *u)
{
    if (u->efd < 0 && kvi_ucx_efd(u, &u->efd) != 0) {
        u->efd = -1;
        return; /* no descriptor: keep spinning */
    }
    if (kvi_ucx_arm(u) != 0)
        return; /* events already pending: progress again */
    struct pollfd pf = {u->efd, POLLIN, 0};
    (void)poll(&pf, 1, NAP_MS);
}

int kvi_ucx_send_many(kvi_ucx *u, kvi_ucx_send_item *v, uint32_t n, uint32_t window, int timeout_ms)
{
    return kvi_ucx_send_many_prep(u, v, n, window, timeout_ms, NULL, NULL);
}

/* Every distinct peer's endpoint of the batch, first (none is evicted while the batch uses
 * it): ep_of[i] for item i, NULL with v[i].rc set where there is none. Returns the first
 * failure's code, 0 if none. */
static int batch_endpoints(kvi_ucx *u, kvi_ucx_send_item *v, uint32_t n, ep_slot **ep_of)
{
    ep_slot *peers[MAX_EPS / 2];
    uint32_t np = 0;
    int first = 0;
    for (uint32_t i = 0; i < n; i++) {
        v[i].rc = 0;
        ep_of[i] = NULL;
        for (uint32_t j = 0; j < np && !ep_of[i]; j++)
            if (peers[j]->len == v[i].addr_len &&
                memcmp(peers[j]->addr, v[i].addr, v[i].addr_len) == 0)
                ep_of[i] = peers[j];
        if (ep_of[i])
            continue;
        uint32_t slot = 0;
        if (np == MAX_EPS / 2)
            v[i].rc = kvt_fail(KVT_ELIMIT, "ucx: more than %u peers in one batch", MAX_EPS / 2);
        else if (!(v[i].rc = endpoint(u, v[i].addr, v[i].addr_len, &slot))) {
            ep_of[i] = peers[np++] = u->eps[slot];
            u->eps[slot]->pinned = true; /* not evicted for a later peer of this batch */
        }
        if (v[i].rc && !first)
            first = v[i].rc;
    }
    for (uint32_t j = 0; j < np; j++)
        peers[j]->pinned = false;
    return first;
}

/* A batch's state between its calls below. */
typedef struct send_batch {
    kvi_ucx_send_item *v;
    uint32_t n, window, next, live; /* next: the first item not posted; live: sends in flight */
    ep_slot **ep_of;
    inflight *fl;
    int (*prep)(void *arg, uint32_t i, uint32_t w);
    void *arg;
} send_batch;

/* Posts items into the free window slots (an item without an endpoint, or that prep refused,
 * is passed over: its rc says why). */
static void post_window(send_batch *B)
{
    kvi_ucx_send_item *v = B->v;
    for (uint32_t j = 0; j < B->window && B->next < B->n; j++) {
        if (B->fl[j].q)
            continue;
        while (B->next < B->n &&
               (!B->ep_of[B->next] || (B->prep && (v[B->next].rc = B->prep(B->arg, B->next, j)))))
            B->next++;
        if (B->next == B->n)
            break;
        inflight *f = &B->fl[j];
        f->ss = (send_state){false, UCS_OK};
        f->item = B->next;
        f->ep = B->ep_of[B->next];
        ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                                 UCP_OP_ATTR_FIELD_USER_DATA |
                                                 UCP_OP_ATTR_FLAG_NO_IMM_CMPL,
                                 .cb.send = send_cb,
                                 .user_data = &f->ss};
        kvi_ucx_send_item *it = &v[B->next];
        void *q = ucp_tag_send_nbx(f->ep->ep, it->buf, it->len, it->tag, &p);
        if (UCS_PTR_IS_ERR(q)) {
            it->rc = ufail(UCS_PTR_STATUS(q), "send");
            f->ep->failed = true;
        } else {
            f->q = q;
            B->live++;
        }
        B->next++;
    }
}

/* Progresses the worker and finishes the sends that completed: how many things moved. */
static unsigned reap_window(kvi_ucx *u, send_batch *B)
{
    unsigned got = 0;
    while (ucp_worker_progress(u->worker))
        got++;
    for (uint32_t j = 0; j < B->window; j++)
        if (B->fl[j].q && B->fl[j].ss.done) {
            send_done(&B->v[B->fl[j].item], &B->fl[j]);
            B->live--;
            got++;
        }
    return got;
}

/* A batch's end: failed peers' endpoints go (a fresh one may reach a restarted successor), and
 * the in-flight states go too unless some sends were abandoned (kept: they stay until UCX lets
 * go of them). */
static void batch_end(kvi_ucx *u, send_batch *B, bool kept)
{
    for (uint32_t e = 0; e < u->n_eps;) {
        if (u->eps[e]->failed)
            close_ep(u, e);
        else
            e++;
    }
    free(B->ep_of);
    if (kept)
        keep_orphan(u, B->fl, B->window, NULL);
    else
        free(B->fl);
}

int kvi_ucx_send_many_prep(kvi_ucx *u, kvi_ucx_send_item *v, uint32_t n, uint32_t window,
                           int timeout_ms, int (*prep)(void *arg, uint32_t i, uint32_t w),
                           void *arg)
{
    if (n == 0)
        return 0;
    if (!v || window == 0)
        return kvt_fail(KVT_EINVAL, "ucx: send_many: no items or a window of 0");
    if (window > n)
        window = n;
    send_batch B = {.v = v,
                    .n = n,
                    .window = window,
                    .ep_of = malloc(n * sizeof(ep_slot *)),
                    .fl = calloc(window, sizeof(inflight)),
                    .prep = prep,
                    .arg = arg};
    if (!B.ep_of || !B.fl) {
        free(B.ep_of);
        free(B.fl);
        return kvt_fail(KVT_ENOMEM, "ucx: out of memory for a batch of %u sends", n);
    }
    reap_orphans(u);
    int first = batch_endpoints(u, v, n, B.ep_of);
    uint64_t quiet_until = kvt_monotonic_ns() + (uint64_t)timeout_ms * 1000000ull;
    bool kept = false;
    for (;;) {
        post_window(&B);
        if (!B.live && B.next == n)
            break;
        unsigned got = reap_window(u, &B);
        uint64_t now = kvt_monotonic_ns();
        if (got) {
            quiet_until = now + (uint64_t)timeout_ms * 1000000ull;
            kvi_spin_busy(&u->spin);
        } else if (now < quiet_until) {
            /* nothing moved: spin a little, then sleep on the worker's descriptor, leaving
             * the CPU to the receiver (on a small machine it is this process's peer) */
            if (!kvi_spin_idle(&u->spin, now))
                wait_events(u);
        } else {
            kept = send_abort(u, v, B.fl, window, timeout_ms);
            for (; B.next < n; B.next++) /* never posted */
                if (!v[B.next].rc)
                    v[B.next].rc = kvt_fail(KVT_EIO, "ucx: send not attempted: the batch stalled");
            break;
        }
    }
    for (uint32_t i = 0; i < n && !first; i++)
        first = v[i].rc;
    batch_end(u, &B, kept);
    return first; /* kvt_last_error(): the last failure's message */
}

int kvi_ucx_send(kvi_ucx *u, const void *addr, size_t addr_len, const void *buf, size_t len,
                 uint64_t tag, int timeout_ms)
{
    kvi_ucx_send_item it = {addr, addr_len, buf, len, tag, 0};
    return kvi_ucx_send_many(u, &it, 1, 1, timeout_ms);
}

int kvi_ucx_ep_info(kvi_ucx *u, const void *addr, size_t len, char *buf, size_t cap)
{
    if (!buf || cap == 0)
        return kvt_fail(KVT_EINVAL, "ucx: endpoint info: no room");
    buf[0] = '\0';
    uint32_t slot;
    int rc = kvi_ucx_address_check(u, addr, len);
    if (rc || (rc = endpoint(u, addr, len, &slot)))
        return rc;
    char *text = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&text, &n);
    if (!f)
        return kvt_fail(KVT_ENOMEM, "ucx: endpoint info: out of memory");
    ucp_ep_print_info(u->eps[slot]->ep, f);
    fclose(f);
    snprintf(buf, cap, "%s", text ? text : "");
    free(text);
    return 0;
}
