/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Encoder-cache control messages (ctl.h). Bodies, after the 12-byte header (docs/wire.md):
 *
 *   request  u32 op; u32 n; n x item
 *            item: str transfer_id, then by op
 *              status                  -
 *              reserve, reserve_batch  str mm_hash; u64 nbytes; shape; str dtype;
 *                                      str client_key (32 hex: the producer's secret)
 *              complete, complete_batch  str reservation_id
 *              cancel                  str reservation_id; bool abandon; bool refresh;
 *                                      str client_key ("" or 32 hex: the consumer's owner
 *                                      key, which a cancel without reservation id needs)
 *   reply    u32 op; i32 code; str error; then, when code is 0, by op
 *              peers                   u32 n; n x u32 port
 *              event_port              u32 port (0: a unix socket of the server's user)
 *              others                  u32 n; n x result
 *            result: i32 code; str error; then, when its code is 0, by op
 *              status                  bool found; if found: str mm_hash; bool ready;
 *                                      u64 nbytes; shape; str dtype (never an id: a
 *                                      reservation id is a capability, see security.md)
 *              reserve, reserve_batch  str reservation_id; u64 offset; u64 nbytes; u64 tag;
 *                                      bool write; bool ready; bool cached; bool cancelled
 *              complete, complete_batch  bool completed; bool became_ready; bool pending
 *              cancel                  bool cancelled
 *   event    str transfer_id; str mm_hash; str reservation_id; u64 nbytes; shape; str dtype;
 *            bool abandoned; u32 shard
 *
 * shape = u8 rank, rank x u64. Every field is validated on decode (ranges, string lengths,
 * reservation ids of 32 lowercase hex digits, nbytes = prod(shape) x dtype size), and only
 * the fields an op defines are present, so the encoding is canonical.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "net/ec_ctl.h"
#include "kvtier/ec_net.h"
#include "meta/meta_internal.h"

/* ---- shared ------------------------------------------------------------------------------ */

const char *kvi_ecc_op_name(uint32_t op)
{
    static const char *const names[] = {"?",       "peers",         "event_port",  "status",
                                        "reserve", "reserve_batch", "complete",    "complete_batch",
                                        "cancel",  "data_address",  "cancel_batch"};
    return op >= 1 && op <= KVT_ECC_CANCEL_BATCH ? names[op] : "unknown op";
}

static bool op_valid(uint32_t op)
{
    return op >= KVT_ECC_PEERS && op <= KVT_ECC_CANCEL_BATCH;
}

uint64_t kvi_ecc_rid_tag(const char *rid)
{
    uint64_t t = 0;
    for (int i = 0; i < 16 && rid && rid[i]; i++) {
        char c = rid[i];
        t = t << 4 | (uint64_t)(c <= '9' ? c - '0' : c - 'a' + 10);
    }
    return t;
}

static bool op_reserve(uint32_t op)
{
    return op == KVT_ECC_RESERVE || op == KVT_ECC_RESERVE_BATCH;
}

static bool op_complete(uint32_t op)
{
    return op == KVT_ECC_COMPLETE || op == KVT_ECC_COMPLETE_BATCH;
}

static bool op_cancel(uint32_t op)
{
    return op == KVT_ECC_CANCEL || op == KVT_ECC_CANCEL_BATCH;
}

static bool op_batch(uint32_t op)
{
    return op == KVT_ECC_RESERVE_BATCH || op == KVT_ECC_COMPLETE_BATCH ||
           op == KVT_ECC_CANCEL_BATCH;
}

static bool op_items(uint32_t op)
{
    return op != KVT_ECC_PEERS && op != KVT_ECC_EVENT_PORT && op != KVT_ECC_DATA_ADDRESS;
}

static size_t str_size(kvt_str s)
{
    return 4 + (size_t)s.len;
}

static size_t shape_size(uint32_t ndim)
{
    return 1 + 8 * (size_t)ndim;
}

static int check_key(kvt_str s, const char *what)
{
    if (s.len < 1 || s.len > KVT_EC_KEY_MAX)
        return kvt_fail(KVT_EINVAL, "%s: length %u not in 1..%u", what, s.len, KVT_EC_KEY_MAX);
    return kvi_meta_check_str(s, 1, what);
}

/* A reservation id: 32 lowercase hex digits, or "" where any_ok. */
static int check_rid(kvt_str s, bool empty_ok, const char *what)
{
    if (s.len == 0 && empty_ok)
        return 0;
    if (s.len != KVT_EC_RID_LEN || !s.ptr)
        return kvt_fail(KVT_EINVAL, "%s: %u bytes, expected %u hex digits%s", what, s.len,
                        KVT_EC_RID_LEN, empty_ok ? " or none" : "");
    for (uint32_t i = 0; i < s.len; i++) {
        char c = s.ptr[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
            return kvt_fail(KVT_EINVAL, "%s: byte %u is not a lowercase hex digit", what, i);
    }
    return 0;
}

static int check_code(int32_t code, kvt_str error, const char *what)
{
    if (code > 0 || code < KVT_EUNSUPPORTED)
        return kvt_fail(KVT_EINVAL, "%s: code %d is not a kvtier status", what, code);
    if (code == 0 && error.len)
        return kvt_fail(KVT_EINVAL, "%s: a success carries an error message", what);
    return kvi_meta_check_str(error, 0, what);
}

static int check_tensor_item(kvt_str hash, uint64_t nbytes, uint32_t ndim, const uint64_t *shape,
                             kvt_str dtype)
{
    int rc = check_key(hash, "mm_hash");
    if (!rc)
        rc = kvi_meta_check_tensor(nbytes, ndim, shape, dtype);
    if (!rc && nbytes == 0)
        rc = kvt_fail(KVT_EINVAL, "nbytes: an item of 0 bytes");
    return rc;
}

static int rd_code(kvi_rd *r, int32_t *code)
{
    uint32_t u;
    int rc = rd_u32(r, &u, "code");
    if (!rc)
        *code = (int32_t)u;
    return rc;
}

static int copy_str(kvt_bump *b, kvt_str in, kvt_str *out)
{
    return kvi_meta_copy_str(b, in.ptr ? in.ptr : "", in.len, out);
}

/* ---- requests ------------------------------------------------------------------------------ */

void kvi_ecc_request_init(kvi_ecc_request *r)
{
    memset(r, 0, sizeof(*r));
}

void kvi_ecc_request_clear(kvi_ecc_request *r)
{
    r->op = 0;
    r->n = 0;
    kvt_bump_clear(&r->strings);
}

void kvi_ecc_request_release(kvi_ecc_request *r)
{
    free(r->items);
    kvt_bump_release(&r->strings);
    memset(r, 0, sizeof(*r));
}

void kvi_ecc_request_begin(kvi_ecc_request *r, uint32_t op)
{
    kvi_ecc_request_clear(r);
    r->op = op;
}

/* Room for element n of a request's items or a reply's results (arr, cap): at most
 * KVT_ECC_MAX_BATCH in one message. */
static int batch_room(void **arr, uint32_t *cap, uint32_t n, size_t elem, const char *what)
{
    if (n >= KVT_ECC_MAX_BATCH)
        return kvt_fail(KVT_ELIMIT, "ec control: more than %u %s in one message", KVT_ECC_MAX_BATCH,
                        what);
    return kvi_meta_grow(arr, cap, n + 1, elem);
}

int kvi_ecc_request_add(kvi_ecc_request *r, const kvi_ecc_item *it)
{
    if (!it)
        return kvt_fail(KVT_EINVAL, "ec control: NULL item");
    int rc = batch_room((void **)&r->items, &r->cap, r->n, sizeof(*it), "items");
    if (rc)
        return rc;
    r->items[r->n++] = *it;
    return 0;
}

static int check_item(uint32_t op, const kvi_ecc_item *it)
{
    int rc = check_key(it->transfer_id, "transfer_id");
    if (rc)
        return rc;
    if (op_reserve(op)) {
        rc = check_tensor_item(it->mm_hash, it->nbytes, it->ndim, it->shape, it->dtype);
        return rc ? rc : check_rid(it->client_key, false, "client_key");
    }
    if (op_complete(op))
        return check_rid(it->reservation_id, false, "reservation_id");
    if (op_cancel(op)) {
        if ((rc = check_rid(it->reservation_id, true, "reservation_id")) ||
            (rc = check_rid(it->client_key, true, "client_key")))
            return rc;
        if (it->reservation_id.len == 0 && (it->abandon || it->refresh))
            return kvt_fail(KVT_EINVAL, "an abandon or refresh needs the reservation id");
        if (it->reservation_id.len == 0 && it->client_key.len == 0)
            return kvt_fail(KVT_EINVAL,
                            "a cancel without reservation id needs the consumer's owner key");
    }
    return 0;
}

int kvi_ecc_request_validate(const kvi_ecc_request *r)
{
    if (!r)
        return kvt_fail(KVT_EINVAL, "ec control: NULL request");
    if (!op_valid(r->op))
        return kvt_fail(KVT_EINVAL, "ec control: unknown op %u", r->op);
    uint32_t lo = op_items(r->op) ? 1 : 0;
    uint32_t hi = op_batch(r->op) ? KVT_ECC_MAX_BATCH : lo;
    if (r->n < lo || r->n > hi)
        return kvt_fail(r->n > KVT_ECC_MAX_BATCH ? KVT_ELIMIT : KVT_EINVAL,
                        "ec control: %s with %u items (expected %u..%u)", kvi_ecc_op_name(r->op),
                        r->n, lo, hi);
    for (uint32_t i = 0; i < r->n; i++) {
        int rc = check_item(r->op, &r->items[i]);
        if (rc) {
            char what[48];
            snprintf(what, sizeof(what), "ec control: %s item %u", kvi_ecc_op_name(r->op), i);
            return kvi_fail_wrap(rc, what);
        }
    }
    return 0;
}

static size_t item_size(uint32_t op, const kvi_ecc_item *it)
{
    size_t n = str_size(it->transfer_id);
    if (op_reserve(op))
        n += str_size(it->mm_hash) + 8 + shape_size(it->ndim) + str_size(it->dtype) +
             str_size(it->client_key);
    else if (op_complete(op))
        n += str_size(it->reservation_id);
    else if (op_cancel(op))
        n += str_size(it->reservation_id) + 2 + str_size(it->client_key);
    return n;
}

size_t kvi_ecc_request_encoded_size(const kvi_ecc_request *r)
{
    size_t n = KVT_META_HEADER_LEN + 8;
    for (uint32_t i = 0; i < r->n; i++)
        n += item_size(r->op, &r->items[i]);
    return n;
}

int kvi_ecc_request_encode(const kvi_ecc_request *r, void *buf, size_t cap, size_t *len)
{
    int rc = kvi_ecc_request_validate(r);
    size_t need = rc ? 0 : kvi_ecc_request_encoded_size(r);
    if (!rc)
        rc = kvi_wire_check_out(buf, cap, need, len);
    if (rc)
        return rc;
    kvi_wr w = {buf};
    kvi_wire_header(&w, KVT_META_EC_CTL_REQUEST, need - KVT_META_HEADER_LEN);
    wr_u32(&w, r->op);
    wr_u32(&w, r->n);
    for (uint32_t i = 0; i < r->n; i++) {
        const kvi_ecc_item *it = &r->items[i];
        wr_str(&w, it->transfer_id);
        if (op_reserve(r->op)) {
            wr_str(&w, it->mm_hash);
            wr_u64(&w, it->nbytes);
            kvi_meta_wr_shape(&w, it->ndim, it->shape);
            wr_str(&w, it->dtype);
            wr_str(&w, it->client_key);
        } else if (op_complete(r->op)) {
            wr_str(&w, it->reservation_id);
        } else if (op_cancel(r->op)) {
            wr_str(&w, it->reservation_id);
            wr_u8(&w, it->abandon);
            wr_u8(&w, it->refresh);
            wr_str(&w, it->client_key);
        }
    }
    return 0;
}

static int rd_request_body(void *obj, kvi_rd *r)
{
    kvi_ecc_request *q = obj;
    uint32_t op, n;
    int rc = rd_u32(r, &op, "op");
    if (rc)
        return rc;
    if (!op_valid(op))
        return kvt_fail(KVT_EPROTO, "unknown op %u", op);
    /* the smallest item is a transfer id of one byte */
    if ((rc = rd_count(r, &n, KVT_ECC_MAX_BATCH, 5, "items")) ||
        (rc = kvi_meta_grow((void **)&q->items, &q->cap, n ? n : 1, sizeof(*q->items))))
        return rc;
    q->op = op;
    for (uint32_t i = 0; i < n; i++) {
        kvi_ecc_item *it = &q->items[i];
        memset(it, 0, sizeof(*it));
        if ((rc = kvi_meta_rd_str_copy(r, &q->strings, &it->transfer_id, "transfer_id")))
            return rc;
        if (op_reserve(op))
            rc = kvi_meta_rd_str_copy(r, &q->strings, &it->mm_hash, "mm_hash");
        if (!rc && op_reserve(op))
            rc = rd_u64(r, &it->nbytes, "nbytes");
        if (!rc && op_reserve(op))
            rc = kvi_meta_rd_shape(r, &it->ndim, it->shape);
        if (!rc && op_reserve(op))
            rc = kvi_meta_rd_str_copy(r, &q->strings, &it->dtype, "dtype");
        if (!rc && op_reserve(op))
            rc = kvi_meta_rd_str_copy(r, &q->strings, &it->client_key, "client_key");
        if (!rc && (op_complete(op) || op_cancel(op)))
            rc = kvi_meta_rd_str_copy(r, &q->strings, &it->reservation_id, "reservation_id");
        if (!rc && op_cancel(op))
            rc = rd_bool(r, &it->abandon, "abandon");
        if (!rc && op_cancel(op))
            rc = rd_bool(r, &it->refresh, "refresh");
        if (!rc && op_cancel(op))
            rc = kvi_meta_rd_str_copy(r, &q->strings, &it->client_key, "client_key");
        if (rc)
            return rc;
        q->n = i + 1;
    }
    q->n = n;
    return kvi_ecc_request_validate(q);
}

int kvi_ecc_request_decode(kvi_ecc_request *r, const void *buf, size_t len)
{
    kvi_ecc_request_clear(r);
    if (len > KVT_ECC_MAX_MSG)
        return kvt_fail(KVT_ELIMIT, "ec control request: %zu bytes exceed the limit of %u", len,
                        KVT_ECC_MAX_MSG);
    int rc = kvi_wire_decode(buf, len, KVT_META_EC_CTL_REQUEST, rd_request_body, r,
                             "ec control request");
    if (rc)
        kvi_ecc_request_clear(r);
    return rc;
}

/* ---- replies ------------------------------------------------------------------------------- */

void kvi_ecc_reply_init(kvi_ecc_reply *r)
{
    memset(r, 0, sizeof(*r));
}

void kvi_ecc_reply_clear(kvi_ecc_reply *r)
{
    r->op = 0;
    r->code = 0;
    r->error = (kvt_str){"", 0};
    r->n = r->n_ports = r->port = r->data_addr_len = 0;
    r->data_addr = NULL;
    kvt_bump_clear(&r->strings);
}

int kvi_ecc_reply_set_address(kvi_ecc_reply *r, const void *addr, uint32_t len)
{
    if (!addr || len < 1 || len > KVT_ECC_MAX_ADDR)
        return kvt_fail(KVT_EINVAL, "ec control: a data address of %u bytes (1..%u)", len,
                        KVT_ECC_MAX_ADDR);
    uint8_t *b = kvi_bump_alloc(&r->strings, len);
    if (!b)
        return kvt_fail(KVT_ENOMEM, "ec control: out of memory for a data address");
    memcpy(b, addr, len);
    r->data_addr = b;
    r->data_addr_len = len;
    return 0;
}

void kvi_ecc_reply_release(kvi_ecc_reply *r)
{
    free(r->results);
    kvt_bump_release(&r->strings);
    memset(r, 0, sizeof(*r));
}

void kvi_ecc_reply_begin(kvi_ecc_reply *r, uint32_t op)
{
    kvi_ecc_reply_clear(r);
    r->op = op;
}

int kvi_ecc_reply_add(kvi_ecc_reply *r, const kvi_ecc_result *res)
{
    if (!res)
        return kvt_fail(KVT_EINVAL, "ec control: NULL result");
    int rc = batch_room((void **)&r->results, &r->cap, r->n, sizeof(*res), "results");
    if (rc)
        return rc;
    kvi_ecc_result *d = &r->results[r->n];
    *d = *res;
    if ((rc = copy_str(&r->strings, res->error, &d->error)) ||
        (rc = copy_str(&r->strings, res->reservation_id, &d->reservation_id)) ||
        (rc = copy_str(&r->strings, res->mm_hash, &d->mm_hash)) ||
        (rc = copy_str(&r->strings, res->dtype, &d->dtype)))
        return rc;
    r->n++;
    return 0;
}

int kvi_ecc_reply_fail(kvi_ecc_reply *r, int code, const char *msg)
{
    uint32_t op = r->op;
    kvi_ecc_reply_clear(r);
    r->op = op_valid(op) ? op : KVT_ECC_PEERS;
    r->code = code < 0 && code >= KVT_EUNSUPPORTED ? code : KVT_EPROTO;
    size_t len = msg ? strnlen(msg, KVT_META_MAX_STR) : 0;
    if (len == 0)
        msg = "failed", len = 6;
    return kvi_meta_copy_str(&r->strings, msg, (uint32_t)len, &r->error);
}

static int check_result(uint32_t op, const kvi_ecc_result *x)
{
    int rc = check_code(x->code, x->error, "result");
    if (rc || x->code)
        return rc;
    if (op == KVT_ECC_STATUS && x->found) {
        if (x->reservation_id.len)
            return kvt_fail(KVT_EINVAL, "status: a reservation id is never revealed");
        return check_tensor_item(x->mm_hash, x->nbytes, x->ndim, x->shape, x->dtype);
    }
    if (op_complete(op) && x->pending && (!x->completed || x->became_ready))
        return kvt_fail(KVT_EINVAL, "completion: pending means accepted and not yet ready");
    if (op_reserve(op)) {
        /* a cancelled reservation has no id; every other one has */
        if ((rc = check_rid(x->reservation_id, x->cancelled, "reservation_id")))
            return rc;
        if (x->offset > UINT64_MAX - x->nbytes)
            return kvt_fail(KVT_EINVAL, "reservation: offset + nbytes overflows");
        if (x->write && (x->ready || x->cached || x->cancelled))
            return kvt_fail(KVT_EINVAL, "reservation: to be written and ready, cached or "
                                        "cancelled at once");
    }
    return 0;
}

int kvi_ecc_reply_validate(const kvi_ecc_reply *r)
{
    if (!r)
        return kvt_fail(KVT_EINVAL, "ec control: NULL reply");
    if (!op_valid(r->op))
        return kvt_fail(KVT_EINVAL, "ec control reply: unknown op %u", r->op);
    int rc = check_code(r->code, r->error, "ec control reply");
    if (rc || r->code)
        return rc;
    if (r->op == KVT_ECC_PEERS) {
        if (r->n_ports < 1 || r->n_ports > KVT_EC_MAX_SHARDS)
            return kvt_fail(KVT_EINVAL, "peers: %u ports (expected 1..%u)", r->n_ports,
                            KVT_EC_MAX_SHARDS);
        for (uint32_t i = 0; i < r->n_ports; i++)
            if (r->ports[i] < 1 || r->ports[i] > 65535)
                return kvt_fail(KVT_EINVAL, "peers: port %u is not a TCP port", r->ports[i]);
        return 0;
    }
    if (r->op == KVT_ECC_EVENT_PORT) /* 0: a unix socket of the server's user on its host */
        return r->port <= 65535 ? 0
                                : kvt_fail(KVT_EINVAL, "event_port: %u is not a TCP port", r->port);
    if (r->op == KVT_ECC_DATA_ADDRESS)
        return r->data_addr && r->data_addr_len >= 1 && r->data_addr_len <= KVT_ECC_MAX_ADDR
                   ? 0
                   : kvt_fail(KVT_EINVAL, "data_address: %u bytes (1..%u)", r->data_addr_len,
                              KVT_ECC_MAX_ADDR);
    uint32_t hi = op_batch(r->op) ? KVT_ECC_MAX_BATCH : 1;
    if (r->n < 1 || r->n > hi)
        return kvt_fail(KVT_EINVAL, "ec control reply: %s with %u results (expected 1..%u)",
                        kvi_ecc_op_name(r->op), r->n, hi);
    for (uint32_t i = 0; i < r->n; i++)
        if ((rc = check_result(r->op, &r->results[i]))) {
            char what[48];
            snprintf(what, sizeof(what), "ec control reply: %s result %u", kvi_ecc_op_name(r->op),
                     i);
            return kvi_fail_wrap(rc, what);
        }
    return 0;
}

static size_t result_size(uint32_t op, const kvi_ecc_result *x)
{
    size_t n = 4 + str_size(x->error);
    if (x->code)
        return n;
    if (op == KVT_ECC_STATUS)
        return n + 1 +
               (x->found ? str_size(x->mm_hash) + 1 + 8 + shape_size(x->ndim) + str_size(x->dtype)
                         : 0);
    if (op_reserve(op))
        return n + str_size(x->reservation_id) + 24 + 4;
    if (op_complete(op))
        return n + 3;
    return n + 1; /* cancel */
}

size_t kvi_ecc_reply_encoded_size(const kvi_ecc_reply *r)
{
    size_t n = KVT_META_HEADER_LEN + 8 + str_size(r->error);
    if (r->code)
        return n;
    if (r->op == KVT_ECC_PEERS)
        return n + 4 + 4 * (size_t)r->n_ports;
    if (r->op == KVT_ECC_EVENT_PORT)
        return n + 4;
    if (r->op == KVT_ECC_DATA_ADDRESS)
        return n + 4 + r->data_addr_len;
    n += 4;
    for (uint32_t i = 0; i < r->n; i++)
        n += result_size(r->op, &r->results[i]);
    return n;
}

static void wr_result(kvi_wr *w, uint32_t op, const kvi_ecc_result *x)
{
    wr_u32(w, (uint32_t)x->code);
    wr_str(w, x->error);
    if (x->code)
        return;
    if (op == KVT_ECC_STATUS) {
        wr_u8(w, x->found);
        if (!x->found)
            return;
        wr_str(w, x->mm_hash);
        wr_u8(w, x->ready);
        wr_u64(w, x->nbytes);
        kvi_meta_wr_shape(w, x->ndim, x->shape);
        wr_str(w, x->dtype);
    } else if (op_reserve(op)) {
        wr_str(w, x->reservation_id);
        wr_u64(w, x->offset);
        wr_u64(w, x->nbytes);
        wr_u64(w, x->tag);
        wr_u8(w, x->write);
        wr_u8(w, x->ready);
        wr_u8(w, x->cached);
        wr_u8(w, x->cancelled);
    } else if (op_complete(op)) {
        wr_u8(w, x->completed);
        wr_u8(w, x->became_ready);
        wr_u8(w, x->pending);
    } else {
        wr_u8(w, x->cancelled);
    }
}

int kvi_ecc_reply_encode(const kvi_ecc_reply *r, void *buf, size_t cap, size_t *len)
{
    int rc = kvi_ecc_reply_validate(r);
    size_t need = rc ? 0 : kvi_ecc_reply_encoded_size(r);
    if (!rc)
        rc = kvi_wire_check_out(buf, cap, need, len);
    if (rc)
        return rc;
    kvi_wr w = {buf};
    kvi_wire_header(&w, KVT_META_EC_CTL_REPLY, need - KVT_META_HEADER_LEN);
    wr_u32(&w, r->op);
    wr_u32(&w, (uint32_t)r->code);
    wr_str(&w, r->error);
    if (r->code)
        return 0;
    if (r->op == KVT_ECC_PEERS) {
        wr_u32(&w, r->n_ports);
        for (uint32_t i = 0; i < r->n_ports; i++)
            wr_u32(&w, r->ports[i]);
    } else if (r->op == KVT_ECC_EVENT_PORT) {
        wr_u32(&w, r->port);
    } else if (r->op == KVT_ECC_DATA_ADDRESS) {
        wr_u32(&w, r->data_addr_len);
        memcpy(w.p, r->data_addr, r->data_addr_len);
        w.p += r->data_addr_len;
    } else {
        wr_u32(&w, r->n);
        for (uint32_t i = 0; i < r->n; i++)
            wr_result(&w, r->op, &r->results[i]);
    }
    return 0;
}

static int rd_result(kvi_rd *r, kvt_bump *b, uint32_t op, kvi_ecc_result *x)
{
    memset(x, 0, sizeof(*x));
    int rc;
    if ((rc = rd_code(r, &x->code)) || (rc = kvi_meta_rd_str_copy(r, b, &x->error, "error")))
        return rc;
    if (x->code)
        return 0;
    if (op == KVT_ECC_STATUS) {
        if ((rc = rd_bool(r, &x->found, "found")) || !x->found)
            return rc;
        if ((rc = kvi_meta_rd_str_copy(r, b, &x->mm_hash, "mm_hash")) ||
            (rc = rd_bool(r, &x->ready, "ready")) || (rc = rd_u64(r, &x->nbytes, "nbytes")) ||
            (rc = kvi_meta_rd_shape(r, &x->ndim, x->shape)))
            return rc;
        return kvi_meta_rd_str_copy(r, b, &x->dtype, "dtype");
    }
    if (op_reserve(op)) {
        if ((rc = kvi_meta_rd_str_copy(r, b, &x->reservation_id, "reservation_id")) ||
            (rc = rd_u64(r, &x->offset, "offset")) || (rc = rd_u64(r, &x->nbytes, "nbytes")) ||
            (rc = rd_u64(r, &x->tag, "tag")) || (rc = rd_bool(r, &x->write, "write")) ||
            (rc = rd_bool(r, &x->ready, "ready")) || (rc = rd_bool(r, &x->cached, "cached")))
            return rc;
        return rd_bool(r, &x->cancelled, "cancelled");
    }
    if (op_complete(op)) {
        if ((rc = rd_bool(r, &x->completed, "completed")) ||
            (rc = rd_bool(r, &x->became_ready, "became_ready")))
            return rc;
        return rd_bool(r, &x->pending, "pending");
    }
    return rd_bool(r, &x->cancelled, "cancelled");
}

static int rd_reply_body(void *obj, kvi_rd *r)
{
    kvi_ecc_reply *p = obj;
    uint32_t op, n;
    int rc;
    if ((rc = rd_u32(r, &op, "op")))
        return rc;
    if (!op_valid(op))
        return kvt_fail(KVT_EPROTO, "unknown op %u", op);
    p->op = op;
    if ((rc = rd_code(r, &p->code)) ||
        (rc = kvi_meta_rd_str_copy(r, &p->strings, &p->error, "error")))
        return rc;
    if (p->code)
        return kvi_ecc_reply_validate(p);
    if (op == KVT_ECC_PEERS) {
        if ((rc = rd_count(r, &n, KVT_EC_MAX_SHARDS, 4, "ports")))
            return rc;
        for (uint32_t i = 0; i < n; i++)
            if ((rc = rd_u32(r, &p->ports[i], "port")))
                return rc;
        p->n_ports = n;
    } else if (op == KVT_ECC_EVENT_PORT) {
        if ((rc = rd_u32(r, &p->port, "port")))
            return rc;
    } else if (op == KVT_ECC_DATA_ADDRESS) {
        uint32_t len;
        if ((rc = rd_count(r, &len, KVT_ECC_MAX_ADDR, 1, "data address")) ||
            (rc = rd_need(r, len, "data address")))
            return rc;
        if (len && (rc = kvi_ecc_reply_set_address(p, r->p, len)))
            return rc;
        r->p += len;
    } else {
        /* the smallest result is a code and an empty error */
        if ((rc = rd_count(r, &n, KVT_ECC_MAX_BATCH, 8, "results")) ||
            (rc = kvi_meta_grow((void **)&p->results, &p->cap, n ? n : 1, sizeof(*p->results))))
            return rc;
        for (uint32_t i = 0; i < n; i++) {
            if ((rc = rd_result(r, &p->strings, op, &p->results[i])))
                return rc;
            p->n = i + 1;
        }
    }
    return kvi_ecc_reply_validate(p);
}

int kvi_ecc_reply_decode(kvi_ecc_reply *r, const void *buf, size_t len)
{
    kvi_ecc_reply_clear(r);
    if (len > KVT_ECC_MAX_MSG)
        return kvt_fail(KVT_ELIMIT, "ec control reply: %zu bytes exceed the limit of %u", len,
                        KVT_ECC_MAX_MSG);
    int rc = kvi_wire_decode(buf, len, KVT_META_EC_CTL_REPLY, rd_reply_body, r, "ec control reply");
    if (rc)
        kvi_ecc_reply_clear(r);
    return rc;
}

int kvi_ecc_reply_check(const kvi_ecc_reply *rep, const kvi_ecc_request *req)
{
    if (rep->code) /* a whole-request failure (perhaps of a request the server could not read) */
        return 0;
    if (rep->op != req->op)
        return kvt_fail(KVT_EPROTO, "ec control: a %s reply to a %s request",
                        kvi_ecc_op_name(rep->op), kvi_ecc_op_name(req->op));
    if (rep->code == 0 && op_items(req->op) && rep->n != req->n)
        return kvt_fail(KVT_EPROTO, "ec control: %u results for %u items", rep->n, req->n);
    return 0;
}

/* ---- events -------------------------------------------------------------------------------- */

void kvi_ecc_event_init(kvi_ecc_event *e)
{
    memset(e, 0, sizeof(*e));
}

void kvi_ecc_event_release(kvi_ecc_event *e)
{
    kvt_bump_release(&e->strings);
    memset(e, 0, sizeof(*e));
}

int kvi_ecc_event_validate(const kvi_ecc_event *e)
{
    int rc;
    if (!e)
        return kvt_fail(KVT_EINVAL, "ec control: NULL event");
    if ((rc = check_key(e->transfer_id, "event transfer_id")) ||
        (rc = check_rid(e->reservation_id, e->abandoned, "event reservation_id")) ||
        (rc = check_tensor_item(e->mm_hash, e->nbytes, e->ndim, e->shape, e->dtype)))
        return rc;
    if (e->shard >= KVT_EC_MAX_SHARDS)
        return kvt_fail(KVT_EINVAL, "event: shard %u of at most %u", e->shard, KVT_EC_MAX_SHARDS);
    return 0;
}

size_t kvi_ecc_event_encoded_size(const kvi_ecc_event *e)
{
    return KVT_META_HEADER_LEN + str_size(e->transfer_id) + str_size(e->mm_hash) +
           str_size(e->reservation_id) + 8 + shape_size(e->ndim) + str_size(e->dtype) + 1 + 4;
}

int kvi_ecc_event_encode(const kvi_ecc_event *e, void *buf, size_t cap, size_t *len)
{
    int rc = kvi_ecc_event_validate(e);
    size_t need = rc ? 0 : kvi_ecc_event_encoded_size(e);
    if (!rc)
        rc = kvi_wire_check_out(buf, cap, need, len);
    if (rc)
        return rc;
    kvi_wr w = {buf};
    kvi_wire_header(&w, KVT_META_EC_CTL_EVENT, need - KVT_META_HEADER_LEN);
    wr_str(&w, e->transfer_id);
    wr_str(&w, e->mm_hash);
    wr_str(&w, e->reservation_id);
    wr_u64(&w, e->nbytes);
    kvi_meta_wr_shape(&w, e->ndim, e->shape);
    wr_str(&w, e->dtype);
    wr_u8(&w, e->abandoned);
    wr_u32(&w, e->shard);
    return 0;
}

static int rd_event_body(void *obj, kvi_rd *r)
{
    kvi_ecc_event *e = obj;
    kvt_bump *b = &e->strings;
    int rc;
    if ((rc = kvi_meta_rd_str_copy(r, b, &e->transfer_id, "transfer_id")) ||
        (rc = kvi_meta_rd_str_copy(r, b, &e->mm_hash, "mm_hash")) ||
        (rc = kvi_meta_rd_str_copy(r, b, &e->reservation_id, "reservation_id")) ||
        (rc = rd_u64(r, &e->nbytes, "nbytes")) || (rc = kvi_meta_rd_shape(r, &e->ndim, e->shape)) ||
        (rc = kvi_meta_rd_str_copy(r, b, &e->dtype, "dtype")) ||
        (rc = rd_bool(r, &e->abandoned, "abandoned")) || (rc = rd_u32(r, &e->shard, "shard")))
        return rc;
    return kvi_ecc_event_validate(e);
}

int kvi_ecc_event_decode(kvi_ecc_event *e, const void *buf, size_t len)
{
    kvt_bump strings = e->strings;
    kvt_bump_clear(&strings);
    memset(e, 0, sizeof(*e));
    e->strings = strings;
    if (len > KVT_ECC_MAX_MSG)
        return kvt_fail(KVT_ELIMIT, "ec control event: %zu bytes exceed the limit of %u", len,
                        KVT_ECC_MAX_MSG);
    int rc = kvi_wire_decode(buf, len, KVT_META_EC_CTL_EVENT, rd_event_body, e, "ec control event");
    if (rc) {
        strings = e->strings;
        kvt_bump_clear(&strings);
        memset(e, 0, sizeof(*e));
        e->strings = strings;
    }
    return rc;
}

static int event_str(char *dst, size_t cap, kvt_str v, const char *what)
{
    if (v.len >= cap)
        return kvt_fail(KVT_ELIMIT, "ec event: %s of %u bytes exceeds %zu", what, v.len, cap - 1);
    memcpy(dst, v.ptr, v.len);
    dst[v.len] = '\0';
    return 0;
}

int kvt_ec_event_decode(const void *buf, size_t len, kvt_ec_ready_event *out, uint32_t *shard)
{
    if (!buf || !out)
        return kvt_fail(KVT_EINVAL, "ec event: NULL buffer or output");
    kvi_ecc_event e;
    kvi_ecc_event_init(&e);
    int rc = kvi_ecc_event_decode(&e, buf, len);
    kvt_ec_ready_event r;
    memset(&r, 0, sizeof(r));
    if (!rc &&
        !(rc = event_str(r.transfer_id, sizeof(r.transfer_id), e.transfer_id, "transfer_id")) &&
        !(rc = event_str(r.mm_hash, sizeof(r.mm_hash), e.mm_hash, "mm_hash")) &&
        !(rc = event_str(r.reservation_id, sizeof(r.reservation_id), e.reservation_id,
                         "reservation_id")) &&
        !(rc = event_str(r.dtype, sizeof(r.dtype), e.dtype, "dtype"))) {
        r.nbytes = e.nbytes;
        r.ndim = e.ndim;
        memcpy(r.shape, e.shape, sizeof(r.shape));
        r.abandoned = e.abandoned;
        *out = r;
        if (shard)
            *shard = e.shard;
    }
    kvi_ecc_event_release(&e);
    return rc;
}
