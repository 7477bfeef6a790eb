/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The encoder-cache data plane over UCX tag matching (ucx.h).
 */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <ucp/api/ucp.h>
#include <ucs/debug/log_def.h>

#include "base/error.h"
#include "base/log.h"
#include "ec/ucx.h"
#include "kvtier/base.h"

#define MAX_EPS 64

struct kvt_ucx_recv {
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
    volatile bool failed; /* the error handler ran: the peer is gone */
} ep_slot;

struct kvt_ucx {
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_address_t *addr;
    size_t addr_len;
    ucp_mem_h mem;
    ep_slot *eps[MAX_EPS]; /* heap slots: the error handler keeps a pointer to its own */
    uint32_t n_eps, evict;
};

static int ufail(ucs_status_t st, const char *what)
{
    return kvt_fail(KVT_EIO, "ucx: %s: %s", what, ucs_status_string(st));
}

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

int kvt_ucx_create(kvt_ucx **out)
{
    if (!out)
        return kvt_fail(KVT_EINVAL, "ucx: create: NULL out");
    *out = NULL;
    pthread_once(&g_log_once, route_ucx_log);
    kvt_ucx *u = calloc(1, sizeof(*u));
    if (!u)
        return kvt_fail(KVT_ENOMEM, "ucx: out of memory");
    ucp_config_t *cfg;
    ucs_status_t st = ucp_config_read(NULL, NULL, &cfg);
    if (st != UCS_OK) {
        free(u);
        return ufail(st, "reading the configuration");
    }
    ucp_params_t p = {.field_mask = UCP_PARAM_FIELD_FEATURES,
                      .features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP};
    st = ucp_init(&p, cfg, &u->ctx);
    ucp_config_release(cfg);
    if (st != UCS_OK) {
        free(u);
        return ufail(st, "init");
    }
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    st = ucp_worker_create(u->ctx, &wp, &u->worker);
    if (st == UCS_OK)
        st = ucp_worker_get_address(u->worker, &u->addr, &u->addr_len);
    if (st != UCS_OK) {
        int rc = ufail(st, "worker");
        if (u->worker)
            ucp_worker_destroy(u->worker);
        ucp_cleanup(u->ctx);
        free(u);
        return rc;
    }
    *out = u;
    return 0;
}

static void close_ep(kvt_ucx *u, uint32_t i)
{
    ep_slot *s = u->eps[i];
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                             .flags = UCP_EP_CLOSE_FLAG_FORCE};
    void *r = ucp_ep_close_nbx(s->ep, &p);
    if (UCS_PTR_IS_PTR(r)) {
        while (ucp_request_check_status(r) == UCS_INPROGRESS)
            ucp_worker_progress(u->worker);
        ucp_request_free(r);
    }
    free(s->addr);
    free(s);
    u->eps[i] = u->eps[--u->n_eps];
}

void kvt_ucx_destroy(kvt_ucx *u)
{
    if (!u)
        return;
    while (u->n_eps)
        close_ep(u, 0);
    if (u->mem)
        ucp_mem_unmap(u->ctx, u->mem);
    ucp_worker_release_address(u->worker, u->addr);
    ucp_worker_destroy(u->worker);
    ucp_cleanup(u->ctx);
    free(u);
}

int kvt_ucx_address(kvt_ucx *u, const void **addr, size_t *len)
{
    *addr = u->addr;
    *len = u->addr_len;
    return 0;
}

int kvt_ucx_address_check(const kvt_ucx *u, const void *addr, size_t len)
{
    /* UCX unpacks a worker address without bounds on what it trusts (a crafted header byte
     * aborts the process inside ucp_ep_create), so a peer's address must look like the ones
     * this build packs: the same header byte (format version and flags) and room for at least
     * a header and a worker id. */
    const uint8_t *a = addr;
    if (!addr || len < 9 || len > (1u << 16))
        return kvt_fail(KVT_EPROTO, "ucx: a peer's worker address of %zu bytes", len);
    if (a[0] != ((const uint8_t *)u->addr)[0])
        return kvt_fail(KVT_EPROTO,
                        "ucx: a peer's worker address has header 0x%02x, this build's UCX packs "
                        "0x%02x (another UCX version or configuration, or a forged address)",
                        a[0], ((const uint8_t *)u->addr)[0]);
    return 0;
}

int kvt_ucx_map(kvt_ucx *u, void *base, size_t len)
{
    if (u->mem)
        return kvt_fail(KVT_ESTATE, "ucx: a buffer is already registered");
    ucp_mem_map_params_t mp = {.field_mask =
                                   UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH,
                               .address = base,
                               .length = len};
    ucs_status_t st = ucp_mem_map(u->ctx, &mp, &u->mem);
    return st == UCS_OK ? 0 : ufail(st, "registering the receive buffer");
}

unsigned kvt_ucx_progress(kvt_ucx *u)
{
    return ucp_worker_progress(u->worker);
}

int kvt_ucx_efd(kvt_ucx *u, int *fd)
{
    ucs_status_t st = ucp_worker_get_efd(u->worker, fd);
    return st == UCS_OK ? 0 : ufail(st, "event descriptor");
}

int kvt_ucx_arm(kvt_ucx *u)
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
    kvt_ucx_recv *r = arg;
    r->status = st;
    r->got = st == UCS_OK && info ? info->length : 0;
    r->done = true;
}

int kvt_ucx_recv_post(kvt_ucx *u, void *buf, size_t len, uint64_t tag, kvt_ucx_recv **out)
{
    kvt_ucx_recv *r = calloc(1, sizeof(*r));
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

static void progress_until(kvt_ucx *u, volatile bool *flag, int wait_ms)
{
    uint64_t end = kvt_monotonic_ns() + (uint64_t)(wait_ms > 0 ? wait_ms : 0) * 1000000ull;
    do {
        while (ucp_worker_progress(u->worker))
            ;
    } while (!*flag && kvt_monotonic_ns() < end);
}

int kvt_ucx_recv_wait(kvt_ucx *u, kvt_ucx_recv *r, int wait_ms)
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

int kvt_ucx_recv_end(kvt_ucx *u, kvt_ucx_recv *r, int wait_ms)
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

/* ---- send ---------------------------------------------------------------------------------- */

static void ep_err_cb(void *arg, ucp_ep_h ep, ucs_status_t st)
{
    (void)ep;
    ep_slot *s = arg;
    s->failed = true;
    KVT_LOG_W("ucx: a peer endpoint failed: %s", ucs_status_string(st));
}

static int endpoint(kvt_ucx *u, const void *addr, size_t len, uint32_t *slot)
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
    if (u->n_eps == MAX_EPS)
        close_ep(u, u->evict++ % MAX_EPS);
    ep_slot *s = calloc(1, sizeof(*s));
    if (s)
        s->addr = malloc(len);
    if (!s || !s->addr) {
        free(s);
        return kvt_fail(KVT_ENOMEM, "ucx: out of memory for an endpoint");
    }
    memcpy(s->addr, addr, len);
    s->len = len;
    ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                                        UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                                        UCP_EP_PARAM_FIELD_ERR_HANDLER,
                          .address = s->addr,
                          .err_mode = UCP_ERR_HANDLING_MODE_PEER,
                          .err_handler = {ep_err_cb, s}};
    ucs_status_t st = ucp_ep_create(u->worker, &ep, &s->ep);
    if (st == UCS_ERR_UNREACHABLE) {
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

int kvt_ucx_send(kvt_ucx *u, const void *addr, size_t addr_len, const void *buf, size_t len,
                 uint64_t tag, int timeout_ms)
{
    uint32_t slot = 0;
    int rc = endpoint(u, addr, addr_len, &slot);
    if (rc)
        return rc;
    send_state ss = {false, UCS_OK};
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                             UCP_OP_ATTR_FIELD_USER_DATA |
                                             UCP_OP_ATTR_FLAG_NO_IMM_CMPL,
                             .cb.send = send_cb,
                             .user_data = &ss};
    void *q = ucp_tag_send_nbx(u->eps[slot]->ep, buf, len, tag, &p);
    if (UCS_PTR_IS_ERR(q)) {
        close_ep(u, slot);
        return ufail(UCS_PTR_STATUS(q), "send");
    }
    progress_until(u, &ss.done, timeout_ms);
    if (!ss.done) { /* cancel, and wait until UCX has let go of the source */
        ucp_request_cancel(u->worker, q);
        progress_until(u, &ss.done, 1000);
        close_ep(u, slot); /* forced: completes a send that is still outstanding */
        while (!ss.done)
            ucp_worker_progress(u->worker);
        ucp_request_free(q);
        return kvt_fail(KVT_EIO, "ucx: send of %zu bytes timed out after %d ms", len, timeout_ms);
    }
    ucp_request_free(q);
    if (ss.status != UCS_OK || u->eps[slot]->failed) {
        int e = ufail(ss.status != UCS_OK ? ss.status : UCS_ERR_ENDPOINT_TIMEOUT, "send");
        close_ep(u, slot);
        return e;
    }
    return 0;
}
