/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Encoder-cache metadata (vLLM ECMooncakeConnectorMetadata, ECMooncakeLoadSpec,
 * ECMooncakePushSpec, ECMooncakeWorkerMetadata): objects, validation, aggregation, encoding.
 *
 * Bodies (after the 12-byte header):
 *   load spec   str mm_hash; u64 nbytes; u8 ndim; ndim x u64 shape; str dtype; str transfer_id;
 *               u8 local
 *   push spec   str mm_hash; u64 nbytes; u8 ndim; ndim x u64 shape; str dtype;
 *               str consumer_zmq; str transfer_id; str request_id
 *   metadata    u32 n; n x load spec body; u32 n; n x push spec body; u8 has_freed;
 *               u32 n; n x str freed
 *   worker      set loaded; set failed_loads; set reclaimed; u8 pending_saves; set failed_saves
 *               (set = u32 n; n x str, strictly ascending bytewise, so equal sets encode to
 *               equal bytes and the decoder checks uniqueness in one pass)
 *
 * A spec is valid when its identifiers are non-empty (request_id may be empty), no string holds
 * a NUL byte, the rank is at most KVT_EC_MAX_DIMS, and for a dtype this build knows, nbytes is
 * exactly product(shape) x dtype size. Unknown dtype names pass (a newer engine may use one)
 * but must look like a dtype name: 1..64 characters of [a-z0-9_].
 */
#include <stdlib.h>
#include <string.h>

#include "meta/meta_internal.h"

#define DTYPE_MAX 64u

/* ---- specs ----------------------------------------------------------------------------- */

int kvi_meta_check_dtype(kvt_str d)
{
    if (d.len < 1 || d.len > DTYPE_MAX || !d.ptr)
        return kvt_fail(KVT_EINVAL, "dtype: length %u not in 1..%u", d.len, DTYPE_MAX);
    for (uint32_t i = 0; i < d.len; i++) {
        char c = d.ptr[i];
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_'))
            return kvt_fail(KVT_EINVAL, "dtype: unexpected character 0x%02x", (unsigned char)c);
    }
    return 0;
}

int kvi_meta_check_tensor(uint64_t nbytes, uint32_t ndim, const uint64_t *shape, kvt_str dtype)
{
    int rc = kvi_meta_check_dtype(dtype);
    if (rc)
        return rc;
    if (ndim > KVT_EC_MAX_DIMS)
        return kvt_fail(KVT_ELIMIT, "shape: rank %u exceeds %u", ndim, KVT_EC_MAX_DIMS);
    uint32_t esize = kvt_dtype_size(dtype.ptr, dtype.len);
    if (!esize)
        return 0;
    uint64_t total = esize;
    for (uint32_t i = 0; i < ndim; i++)
        if (__builtin_mul_overflow(total, shape[i], &total))
            return kvt_fail(KVT_EINVAL, "shape: element count overflows 64 bits");
    if (total != nbytes)
        return kvt_fail(KVT_EINVAL, "nbytes %llu does not match shape x %.*s size (%llu bytes)",
                        (unsigned long long)nbytes, (int)dtype.len, dtype.ptr,
                        (unsigned long long)total);
    return 0;
}

int kvt_ec_load_spec_validate(const kvt_ec_load_spec *s)
{
    int rc;
    if (!s)
        return kvt_fail(KVT_EINVAL, "meta: NULL load spec");
    if ((rc = kvi_meta_check_str(s->mm_hash, 1, "load spec mm_hash")) ||
        (rc = kvi_meta_check_str(s->transfer_id, 1, "load spec transfer_id")) ||
        (rc = kvi_meta_check_tensor(s->nbytes, s->ndim, s->shape, s->dtype)))
        return rc;
    return 0;
}

int kvt_ec_push_spec_validate(const kvt_ec_push_spec *s)
{
    int rc;
    if (!s)
        return kvt_fail(KVT_EINVAL, "meta: NULL push spec");
    if ((rc = kvi_meta_check_str(s->mm_hash, 1, "push spec mm_hash")) ||
        (rc = kvi_meta_check_str(s->consumer_zmq, 1, "push spec consumer_zmq")) ||
        (rc = kvi_meta_check_str(s->transfer_id, 1, "push spec transfer_id")) ||
        (rc = kvi_meta_check_str(s->request_id, 0, "push spec request_id")) ||
        (rc = kvi_meta_check_tensor(s->nbytes, s->ndim, s->shape, s->dtype)))
        return rc;
    return 0;
}

static bool shape_equal(uint32_t na, const uint64_t *a, uint32_t nb, const uint64_t *b)
{
    return na == nb && (na == 0 || memcmp(a, b, na * sizeof(uint64_t)) == 0);
}

bool kvt_ec_load_spec_equal(const kvt_ec_load_spec *a, const kvt_ec_load_spec *b)
{
    return kvi_str_equal(a->mm_hash, b->mm_hash) && a->nbytes == b->nbytes &&
           shape_equal(a->ndim, a->shape, b->ndim, b->shape) && kvi_str_equal(a->dtype, b->dtype) &&
           kvi_str_equal(a->transfer_id, b->transfer_id) && a->local == b->local;
}

bool kvt_ec_push_spec_equal(const kvt_ec_push_spec *a, const kvt_ec_push_spec *b)
{
    return kvi_str_equal(a->mm_hash, b->mm_hash) && a->nbytes == b->nbytes &&
           shape_equal(a->ndim, a->shape, b->ndim, b->shape) && kvi_str_equal(a->dtype, b->dtype) &&
           kvi_str_equal(a->consumer_zmq, b->consumer_zmq) &&
           kvi_str_equal(a->transfer_id, b->transfer_id) &&
           kvi_str_equal(a->request_id, b->request_id);
}

static size_t load_body_size(const kvt_ec_load_spec *s)
{
    return 4 + s->mm_hash.len + 8 + 1 + 8 * (size_t)s->ndim + 4 + s->dtype.len + 4 +
           s->transfer_id.len + 1;
}

static size_t push_body_size(const kvt_ec_push_spec *s)
{
    return 4 + s->mm_hash.len + 8 + 1 + 8 * (size_t)s->ndim + 4 + s->dtype.len + 4 +
           s->consumer_zmq.len + 4 + s->transfer_id.len + 4 + s->request_id.len;
}

size_t kvt_ec_load_spec_encoded_size(const kvt_ec_load_spec *s)
{
    return KVT_META_HEADER_LEN + load_body_size(s);
}

size_t kvt_ec_push_spec_encoded_size(const kvt_ec_push_spec *s)
{
    return KVT_META_HEADER_LEN + push_body_size(s);
}

void kvi_meta_wr_shape(kvi_wr *w, uint32_t ndim, const uint64_t *shape)
{
    wr_u8(w, (uint8_t)ndim);
    for (uint32_t i = 0; i < ndim; i++)
        wr_u64(w, shape[i]);
}

static void wr_load_body(kvi_wr *w, const kvt_ec_load_spec *s)
{
    wr_str(w, s->mm_hash);
    wr_u64(w, s->nbytes);
    kvi_meta_wr_shape(w, s->ndim, s->shape);
    wr_str(w, s->dtype);
    wr_str(w, s->transfer_id);
    wr_u8(w, s->local ? 1 : 0);
}

static void wr_push_body(kvi_wr *w, const kvt_ec_push_spec *s)
{
    wr_str(w, s->mm_hash);
    wr_u64(w, s->nbytes);
    kvi_meta_wr_shape(w, s->ndim, s->shape);
    wr_str(w, s->dtype);
    wr_str(w, s->consumer_zmq);
    wr_str(w, s->transfer_id);
    wr_str(w, s->request_id);
}

int kvt_ec_load_spec_encode(const kvt_ec_load_spec *s, void *buf, size_t cap, size_t *len)
{
    int rc = kvt_ec_load_spec_validate(s);
    if (rc)
        return kvi_fail_wrap(rc, "meta: encode load spec");
    size_t need = kvt_ec_load_spec_encoded_size(s);
    if ((rc = kvi_wire_check_out(buf, cap, need, len)))
        return rc;
    kvi_wr w = {buf};
    kvi_wire_header(&w, KVT_META_EC_LOAD_SPEC, need - KVT_META_HEADER_LEN);
    wr_load_body(&w, s);
    return 0;
}

int kvt_ec_push_spec_encode(const kvt_ec_push_spec *s, void *buf, size_t cap, size_t *len)
{
    int rc = kvt_ec_push_spec_validate(s);
    if (rc)
        return kvi_fail_wrap(rc, "meta: encode push spec");
    size_t need = kvt_ec_push_spec_encoded_size(s);
    if ((rc = kvi_wire_check_out(buf, cap, need, len)))
        return rc;
    kvi_wr w = {buf};
    kvi_wire_header(&w, KVT_META_EC_PUSH_SPEC, need - KVT_META_HEADER_LEN);
    wr_push_body(&w, s);
    return 0;
}

int kvi_meta_rd_str_copy(kvi_rd *r, kvt_bump *b, kvt_str *out, const char *what)
{
    const char *s = NULL;
    uint32_t len;
    int rc = rd_str(r, &s, &len, what);
    if (!rc)
        rc = kvi_meta_copy_str(b, s, len, out);
    return rc;
}

int kvi_meta_rd_shape(kvi_rd *r, uint32_t *ndim, uint64_t *shape)
{
    uint8_t n;
    int rc = rd_u8(r, &n, "shape rank");
    if (rc)
        return rc;
    if (n > KVT_EC_MAX_DIMS)
        return kvt_fail(KVT_ELIMIT, "shape: rank %u exceeds %u", n, KVT_EC_MAX_DIMS);
    memset(shape, 0, KVT_EC_MAX_DIMS * sizeof(uint64_t));
    for (uint32_t i = 0; i < n; i++)
        if ((rc = rd_u64(r, &shape[i], "shape dimension")))
            return rc;
    *ndim = n;
    return 0;
}

static int rd_load_body(kvi_rd *r, kvt_bump *b, kvt_ec_load_spec *s)
{
    int rc;
    memset(s, 0, sizeof(*s));
    if ((rc = kvi_meta_rd_str_copy(r, b, &s->mm_hash, "mm_hash")) ||
        (rc = rd_u64(r, &s->nbytes, "nbytes")) || (rc = kvi_meta_rd_shape(r, &s->ndim, s->shape)) ||
        (rc = kvi_meta_rd_str_copy(r, b, &s->dtype, "dtype")) ||
        (rc = kvi_meta_rd_str_copy(r, b, &s->transfer_id, "transfer_id")) ||
        (rc = rd_bool(r, &s->local, "local")))
        return rc;
    return kvt_ec_load_spec_validate(s);
}

static int rd_push_body(kvi_rd *r, kvt_bump *b, kvt_ec_push_spec *s)
{
    int rc;
    memset(s, 0, sizeof(*s));
    if ((rc = kvi_meta_rd_str_copy(r, b, &s->mm_hash, "mm_hash")) ||
        (rc = rd_u64(r, &s->nbytes, "nbytes")) || (rc = kvi_meta_rd_shape(r, &s->ndim, s->shape)) ||
        (rc = kvi_meta_rd_str_copy(r, b, &s->dtype, "dtype")) ||
        (rc = kvi_meta_rd_str_copy(r, b, &s->consumer_zmq, "consumer_zmq")) ||
        (rc = kvi_meta_rd_str_copy(r, b, &s->transfer_id, "transfer_id")) ||
        (rc = kvi_meta_rd_str_copy(r, b, &s->request_id, "request_id")))
        return rc;
    return kvt_ec_push_spec_validate(s);
}

struct spec_ctx {
    void *spec;
    kvt_bump *strings;
};

static int load_body(void *obj, kvi_rd *r)
{
    struct spec_ctx *c = obj;
    return rd_load_body(r, c->strings, c->spec);
}

static int push_body(void *obj, kvi_rd *r)
{
    struct spec_ctx *c = obj;
    return rd_push_body(r, c->strings, c->spec);
}

int kvt_ec_load_spec_decode(kvt_ec_load_spec *s, kvt_bump *strings, const void *buf, size_t len)
{
    if (!s || !strings)
        return kvt_fail(KVT_EINVAL, "meta: decode load spec: NULL argument");
    struct spec_ctx c = {s, strings};
    int rc =
        kvi_wire_decode(buf, len, KVT_META_EC_LOAD_SPEC, load_body, &c, "meta: decode load spec");
    if (rc)
        memset(s, 0, sizeof(*s));
    return rc;
}

int kvt_ec_push_spec_decode(kvt_ec_push_spec *s, kvt_bump *strings, const void *buf, size_t len)
{
    if (!s || !strings)
        return kvt_fail(KVT_EINVAL, "meta: decode push spec: NULL argument");
    struct spec_ctx c = {s, strings};
    int rc =
        kvi_wire_decode(buf, len, KVT_META_EC_PUSH_SPEC, push_body, &c, "meta: decode push spec");
    if (rc)
        memset(s, 0, sizeof(*s));
    return rc;
}

/* ---- scheduler -> worker --------------------------------------------------------------- */

void kvt_ec_meta_init(kvt_ec_meta *m)
{
    memset(m, 0, sizeof(*m));
}

void kvt_ec_meta_clear(kvt_ec_meta *m)
{
    m->n_loads = m->n_pushes = m->n_freed = 0;
    m->has_freed = false;
    kvt_bump_clear(&m->strings);
}

void kvt_ec_meta_release(kvt_ec_meta *m)
{
    free(m->loads);
    free(m->pushes);
    free(m->freed);
    kvt_bump_release(&m->strings);
    kvt_ec_meta_init(m);
}

static int copy_strs(kvt_bump *b, kvt_str *const *dst, const kvt_str *const *src, int n)
{
    for (int i = 0; i < n; i++) {
        int rc = kvi_meta_copy_str(b, src[i]->ptr, src[i]->len, dst[i]);
        if (rc)
            return rc;
    }
    return 0;
}

int kvt_ec_meta_add_load(kvt_ec_meta *m, const kvt_ec_load_spec *s)
{
    int rc = kvt_ec_load_spec_validate(s);
    if (rc)
        return rc;
    if (m->n_loads >= KVT_META_MAX_ITEMS)
        return kvt_fail(KVT_ELIMIT, "meta: more than %u loads", KVT_META_MAX_ITEMS);
    if ((rc = kvi_meta_grow((void **)&m->loads, &m->cap_loads, m->n_loads + 1, sizeof(*s))))
        return rc;
    kvt_ec_load_spec *d = &m->loads[m->n_loads];
    *d = *s;
    kvt_str *const dst[] = {&d->mm_hash, &d->dtype, &d->transfer_id};
    const kvt_str *const src[] = {&s->mm_hash, &s->dtype, &s->transfer_id};
    if ((rc = copy_strs(&m->strings, dst, src, 3)))
        return rc;
    m->n_loads++;
    return 0;
}

int kvt_ec_meta_add_push(kvt_ec_meta *m, const kvt_ec_push_spec *s)
{
    int rc = kvt_ec_push_spec_validate(s);
    if (rc)
        return rc;
    if (m->n_pushes >= KVT_META_MAX_ITEMS)
        return kvt_fail(KVT_ELIMIT, "meta: more than %u pushes", KVT_META_MAX_ITEMS);
    if ((rc = kvi_meta_grow((void **)&m->pushes, &m->cap_pushes, m->n_pushes + 1, sizeof(*s))))
        return rc;
    kvt_ec_push_spec *d = &m->pushes[m->n_pushes];
    *d = *s;
    kvt_str *const dst[] = {&d->mm_hash, &d->dtype, &d->consumer_zmq, &d->transfer_id,
                            &d->request_id};
    const kvt_str *const src[] = {&s->mm_hash, &s->dtype, &s->consumer_zmq, &s->transfer_id,
                                  &s->request_id};
    if ((rc = copy_strs(&m->strings, dst, src, 5)))
        return rc;
    m->n_pushes++;
    return 0;
}

int kvt_ec_meta_add_freed(kvt_ec_meta *m, const char *mm_hash, uint32_t len)
{
    kvt_str s = {mm_hash, len};
    int rc = kvi_meta_check_str(s, 1, "meta: freed mm_hash");
    if (rc)
        return rc;
    if (m->n_freed >= KVT_META_MAX_ITEMS)
        return kvt_fail(KVT_ELIMIT, "meta: more than %u freed hashes", KVT_META_MAX_ITEMS);
    if ((rc = kvi_meta_grow((void **)&m->freed, &m->cap_freed, m->n_freed + 1, sizeof(kvt_str))))
        return rc;
    if ((rc = kvi_meta_copy_str(&m->strings, mm_hash, len, &m->freed[m->n_freed])))
        return rc;
    m->n_freed++;
    m->has_freed = true;
    return 0;
}

int kvt_ec_meta_validate(const kvt_ec_meta *m)
{
    int rc;
    if (!m)
        return kvt_fail(KVT_EINVAL, "meta: NULL encoder-cache metadata");
    if (m->n_loads > KVT_META_MAX_ITEMS || m->n_pushes > KVT_META_MAX_ITEMS ||
        m->n_freed > KVT_META_MAX_ITEMS)
        return kvt_fail(KVT_ELIMIT, "meta: more than %u loads, pushes or freed hashes",
                        KVT_META_MAX_ITEMS);
    if ((m->n_loads && !m->loads) || (m->n_pushes && !m->pushes) || (m->n_freed && !m->freed))
        return kvt_fail(KVT_EINVAL, "meta: NULL list");
    if (!m->has_freed && m->n_freed)
        return kvt_fail(KVT_EINVAL, "meta: freed is None but holds %u hashes", m->n_freed);
    for (uint32_t i = 0; i < m->n_loads; i++)
        if ((rc = kvt_ec_load_spec_validate(&m->loads[i])))
            return rc;
    for (uint32_t i = 0; i < m->n_pushes; i++)
        if ((rc = kvt_ec_push_spec_validate(&m->pushes[i])))
            return rc;
    for (uint32_t i = 0; i < m->n_freed; i++)
        if ((rc = kvi_meta_check_str(m->freed[i], 1, "freed mm_hash")))
            return rc;
    return 0;
}

bool kvt_ec_meta_equal(const kvt_ec_meta *a, const kvt_ec_meta *b)
{
    if (a->n_loads != b->n_loads || a->n_pushes != b->n_pushes || a->n_freed != b->n_freed ||
        a->has_freed != b->has_freed)
        return false;
    for (uint32_t i = 0; i < a->n_loads; i++)
        if (!kvt_ec_load_spec_equal(&a->loads[i], &b->loads[i]))
            return false;
    for (uint32_t i = 0; i < a->n_pushes; i++)
        if (!kvt_ec_push_spec_equal(&a->pushes[i], &b->pushes[i]))
            return false;
    for (uint32_t i = 0; i < a->n_freed; i++)
        if (!kvi_str_equal(a->freed[i], b->freed[i]))
            return false;
    return true;
}

size_t kvt_ec_meta_encoded_size(const kvt_ec_meta *m)
{
    size_t n = KVT_META_HEADER_LEN + 4 + 4 + 1 + 4;
    for (uint32_t i = 0; i < m->n_loads; i++)
        n += load_body_size(&m->loads[i]);
    for (uint32_t i = 0; i < m->n_pushes; i++)
        n += push_body_size(&m->pushes[i]);
    for (uint32_t i = 0; i < m->n_freed; i++)
        n += 4 + m->freed[i].len;
    return n;
}

int kvt_ec_meta_encode(const kvt_ec_meta *m, void *buf, size_t cap, size_t *len)
{
    int rc = kvt_ec_meta_validate(m);
    if (rc)
        return kvi_fail_wrap(rc, "meta: encode encoder-cache metadata");
    size_t need = kvt_ec_meta_encoded_size(m);
    if ((rc = kvi_wire_check_out(buf, cap, need, len)))
        return rc;
    kvi_wr w = {buf};
    kvi_wire_header(&w, KVT_META_EC, need - KVT_META_HEADER_LEN);
    wr_u32(&w, m->n_loads);
    for (uint32_t i = 0; i < m->n_loads; i++)
        wr_load_body(&w, &m->loads[i]);
    wr_u32(&w, m->n_pushes);
    for (uint32_t i = 0; i < m->n_pushes; i++)
        wr_push_body(&w, &m->pushes[i]);
    wr_u8(&w, m->has_freed ? 1 : 0);
    wr_u32(&w, m->n_freed);
    for (uint32_t i = 0; i < m->n_freed; i++)
        wr_str(&w, m->freed[i]);
    return 0;
}

/* Smallest encoded spec bodies: three empty strings and the fixed fields. */
#define MIN_LOAD_BODY (4 + 8 + 1 + 4 + 4 + 1)
#define MIN_PUSH_BODY (4 + 8 + 1 + 4 + 4 + 4 + 4)

static int decode_ec(void *obj, kvi_rd *r)
{
    kvt_ec_meta *m = obj;
    uint32_t n;
    int rc = rd_count(r, &n, KVT_META_MAX_ITEMS, MIN_LOAD_BODY, "loads");
    if (rc || (rc = kvi_meta_grow((void **)&m->loads, &m->cap_loads, n, sizeof(*m->loads))))
        return rc;
    for (uint32_t i = 0; i < n; i++, m->n_loads++)
        if ((rc = rd_load_body(r, &m->strings, &m->loads[i])))
            return rc;
    if ((rc = rd_count(r, &n, KVT_META_MAX_ITEMS, MIN_PUSH_BODY, "pushes")) ||
        (rc = kvi_meta_grow((void **)&m->pushes, &m->cap_pushes, n, sizeof(*m->pushes))))
        return rc;
    for (uint32_t i = 0; i < n; i++, m->n_pushes++)
        if ((rc = rd_push_body(r, &m->strings, &m->pushes[i])))
            return rc;
    if ((rc = rd_bool(r, &m->has_freed, "has_freed")) ||
        (rc = rd_count(r, &n, KVT_META_MAX_ITEMS, 4, "freed")))
        return rc;
    if (!m->has_freed && n)
        return kvt_fail(KVT_EPROTO, "freed is None but lists %u hashes", n);
    if ((rc = kvi_meta_grow((void **)&m->freed, &m->cap_freed, n, sizeof(kvt_str))))
        return rc;
    for (uint32_t i = 0; i < n; i++, m->n_freed++) {
        if ((rc = kvi_meta_rd_str_copy(r, &m->strings, &m->freed[i], "freed mm_hash")) ||
            (rc = kvi_meta_check_str(m->freed[i], 1, "freed mm_hash")))
            return rc;
    }
    return 0;
}

int kvt_ec_meta_decode(kvt_ec_meta *m, const void *buf, size_t len)
{
    kvt_ec_meta_clear(m);
    int rc =
        kvi_wire_decode(buf, len, KVT_META_EC, decode_ec, m, "meta: decode encoder-cache metadata");
    if (rc)
        kvt_ec_meta_clear(m);
    return rc;
}

/* ---- worker -> scheduler --------------------------------------------------------------- */

static kvt_strset *worker_set(kvt_ec_worker_meta *m, int which)
{
    switch (which) {
    case KVT_EC_LOADED:
        return &m->loaded;
    case KVT_EC_FAILED_LOADS:
        return &m->failed_loads;
    case KVT_EC_RECLAIMED:
        return &m->reclaimed;
    case KVT_EC_FAILED_SAVES:
        return &m->failed_saves;
    default:
        return NULL;
    }
}

static const char *const set_names[] = {"loaded", "failed_loads", "reclaimed", "failed_saves"};

void kvt_ec_worker_meta_init(kvt_ec_worker_meta *m)
{
    memset(m, 0, sizeof(*m));
}

void kvt_ec_worker_meta_clear(kvt_ec_worker_meta *m)
{
    m->loaded.n = m->failed_loads.n = m->reclaimed.n = m->failed_saves.n = 0;
    m->pending_saves = false;
    kvt_bump_clear(&m->strings);
}

void kvt_ec_worker_meta_release(kvt_ec_worker_meta *m)
{
    for (int i = 0; i < 4; i++)
        kvi_strset_release(worker_set(m, i));
    kvt_bump_release(&m->strings);
    kvt_ec_worker_meta_init(m);
}

int kvt_ec_worker_meta_add(kvt_ec_worker_meta *m, int which, const char *s, uint32_t len)
{
    kvt_strset *set = m ? worker_set(m, which) : NULL;
    if (!set)
        return kvt_fail(KVT_EINVAL, "meta: unknown worker metadata set %d", which);
    int rc = kvi_strset_add(set, &m->strings, s, len);
    return rc ? kvi_fail_wrap(rc, set_names[which]) : 0;
}

/* dst ∪= src, with capacity and string storage already reserved (cannot fail). */
static void set_union(kvt_strset *dst, kvt_bump *b, const kvt_strset *src)
{
    uint32_t u = 0, i = 0, j = 0;
    while (i < dst->n || j < src->n) {
        int c = i == dst->n ? 1 : j == src->n ? -1 : kvi_str_cmp(dst->items[i], src->items[j]);
        i += c <= 0;
        j += c >= 0;
        u++;
    }
    int64_t a = (int64_t)dst->n - 1, k = (int64_t)src->n - 1;
    for (int64_t o = (int64_t)u - 1; o >= 0; o--) {
        int c = a < 0 ? -1 : k < 0 ? 1 : kvi_str_cmp(dst->items[a], src->items[k]);
        if (c > 0) {
            dst->items[o] = dst->items[a--];
        } else if (c < 0) {
            kvt_str s = src->items[k--];
            dst->items[o].ptr = kvi_bump_strdup(b, s.ptr, s.len);
            dst->items[o].len = s.len;
        } else {
            dst->items[o] = dst->items[a--];
            k--;
        }
    }
    dst->n = u;
}

/* dst ∩= src, in place. */
static void set_intersect(kvt_strset *dst, const kvt_strset *src)
{
    uint32_t o = 0;
    for (uint32_t i = 0; i < dst->n; i++)
        if (kvt_strset_contains(src, dst->items[i].ptr, dst->items[i].len))
            dst->items[o++] = dst->items[i];
    dst->n = o;
}

/* Reserves what uniting src's sets (those in `unite`) into dst may need. */
static int reserve_union(kvt_ec_worker_meta *dst, const kvt_ec_worker_meta *src, const int *unite,
                         int n_unite)
{
    size_t bytes = 0;
    for (int u = 0; u < n_unite; u++) {
        kvt_strset *d = worker_set(dst, unite[u]);
        const kvt_strset *s = worker_set((kvt_ec_worker_meta *)src, unite[u]);
        if ((uint64_t)d->n + s->n > KVT_META_MAX_ITEMS)
            return kvt_fail(KVT_ELIMIT, "meta: aggregate: %s would exceed %u members",
                            set_names[unite[u]], KVT_META_MAX_ITEMS);
        int rc = kvi_meta_grow((void **)&d->items, &d->cap, d->n + s->n, sizeof(kvt_str));
        if (rc)
            return rc;
        for (uint32_t i = 0; i < s->n; i++)
            bytes += (size_t)s->items[i].len + 8;
    }
    return bytes ? kvi_bump_reserve(&dst->strings, bytes) : 0;
}

int kvt_ec_worker_meta_aggregate(kvt_ec_worker_meta *dst, const kvt_ec_worker_meta *src)
{
    if (!dst || !src)
        return kvt_fail(KVT_EINVAL, "meta: aggregate: NULL argument");
    static const int unite[] = {KVT_EC_FAILED_LOADS, KVT_EC_RECLAIMED, KVT_EC_FAILED_SAVES};
    int rc = reserve_union(dst, src, unite, 3);
    if (rc)
        return rc;
    for (int u = 0; u < 3; u++)
        set_union(worker_set(dst, unite[u]), &dst->strings,
                  worker_set((kvt_ec_worker_meta *)src, unite[u]));
    set_intersect(&dst->loaded, &src->loaded);
    dst->pending_saves = dst->pending_saves || src->pending_saves;
    return 0;
}

int kvt_ec_worker_meta_aggregate_ranks(kvt_ec_worker_meta *dst,
                                       const kvt_ec_worker_meta *const *ranks, uint32_t n,
                                       uint32_t *n_contrib)
{
    if (!dst || (n && !ranks))
        return kvt_fail(KVT_EINVAL, "meta: aggregate_ranks: NULL argument");
    kvt_ec_worker_meta_clear(dst);
    uint32_t c = 0;
    for (uint32_t i = 0; i < n; i++) {
        const kvt_ec_worker_meta *r = ranks[i];
        if (!r)
            continue;
        int rc;
        if (c == 0) {
            /* The first report is copied: uniting every set into the empty dst. */
            static const int all[] = {KVT_EC_LOADED, KVT_EC_FAILED_LOADS, KVT_EC_RECLAIMED,
                                      KVT_EC_FAILED_SAVES};
            rc = reserve_union(dst, r, all, 4);
            if (!rc) {
                for (int u = 0; u < 4; u++)
                    set_union(worker_set(dst, all[u]), &dst->strings,
                              worker_set((kvt_ec_worker_meta *)r, all[u]));
                dst->pending_saves = r->pending_saves;
            }
        } else {
            rc = kvt_ec_worker_meta_aggregate(dst, r);
        }
        if (rc) {
            kvt_ec_worker_meta_clear(dst);
            return rc;
        }
        c++;
    }
    if (n_contrib)
        *n_contrib = c;
    return 0;
}

int kvt_ec_worker_meta_validate(const kvt_ec_worker_meta *m)
{
    if (!m)
        return kvt_fail(KVT_EINVAL, "meta: NULL encoder-cache worker metadata");
    for (int i = 0; i < 4; i++) {
        int rc = kvi_strset_validate(worker_set((kvt_ec_worker_meta *)m, i), set_names[i]);
        if (rc)
            return rc;
    }
    return 0;
}

bool kvt_ec_worker_meta_equal(const kvt_ec_worker_meta *a, const kvt_ec_worker_meta *b)
{
    for (int i = 0; i < 4; i++)
        if (!kvi_strset_equal(worker_set((kvt_ec_worker_meta *)a, i),
                              worker_set((kvt_ec_worker_meta *)b, i)))
            return false;
    return a->pending_saves == b->pending_saves;
}

static size_t set_size(const kvt_strset *s)
{
    size_t n = 4;
    for (uint32_t i = 0; i < s->n; i++)
        n += 4 + s->items[i].len;
    return n;
}

size_t kvt_ec_worker_meta_encoded_size(const kvt_ec_worker_meta *m)
{
    return KVT_META_HEADER_LEN + set_size(&m->loaded) + set_size(&m->failed_loads) +
           set_size(&m->reclaimed) + 1 + set_size(&m->failed_saves);
}

static void wr_set(kvi_wr *w, const kvt_strset *s)
{
    wr_u32(w, s->n);
    for (uint32_t i = 0; i < s->n; i++)
        wr_str(w, s->items[i]);
}

int kvt_ec_worker_meta_encode(const kvt_ec_worker_meta *m, void *buf, size_t cap, size_t *len)
{
    int rc = kvt_ec_worker_meta_validate(m);
    if (rc)
        return kvi_fail_wrap(rc, "meta: encode encoder-cache worker metadata");
    size_t need = kvt_ec_worker_meta_encoded_size(m);
    if ((rc = kvi_wire_check_out(buf, cap, need, len)))
        return rc;
    kvi_wr w = {buf};
    kvi_wire_header(&w, KVT_META_EC_WORKER, need - KVT_META_HEADER_LEN);
    wr_set(&w, &m->loaded);
    wr_set(&w, &m->failed_loads);
    wr_set(&w, &m->reclaimed);
    wr_u8(&w, m->pending_saves ? 1 : 0);
    wr_set(&w, &m->failed_saves);
    return 0;
}

static int rd_set(kvi_rd *r, kvt_bump *b, kvt_strset *set, const char *what)
{
    uint32_t n;
    int rc = rd_count(r, &n, KVT_META_MAX_ITEMS, 4, what);
    if (rc || (rc = kvi_meta_grow((void **)&set->items, &set->cap, n, sizeof(kvt_str))))
        return rc;
    for (uint32_t i = 0; i < n; i++) {
        kvt_str s = {NULL, 0};
        if ((rc = rd_str(r, &s.ptr, &s.len, what)) || (rc = kvi_meta_check_str(s, 1, what)))
            return rc;
        if (i && kvi_str_cmp(set->items[i - 1], s) >= 0)
            return kvt_fail(KVT_EPROTO,
                            "%s: member %u is not greater than the previous one "
                            "(sets are sorted and unique)",
                            what, i);
        if ((rc = kvi_meta_copy_str(b, s.ptr, s.len, &set->items[i])))
            return rc;
        set->n = i + 1;
    }
    return 0;
}

static int decode_ec_worker(void *obj, kvi_rd *r)
{
    kvt_ec_worker_meta *m = obj;
    int rc;
    if ((rc = rd_set(r, &m->strings, &m->loaded, "loaded")) ||
        (rc = rd_set(r, &m->strings, &m->failed_loads, "failed_loads")) ||
        (rc = rd_set(r, &m->strings, &m->reclaimed, "reclaimed")) ||
        (rc = rd_bool(r, &m->pending_saves, "pending_saves")) ||
        (rc = rd_set(r, &m->strings, &m->failed_saves, "failed_saves")))
        return rc;
    return 0;
}

int kvt_ec_worker_meta_decode(kvt_ec_worker_meta *m, const void *buf, size_t len)
{
    kvt_ec_worker_meta_clear(m);
    int rc = kvi_wire_decode(buf, len, KVT_META_EC_WORKER, decode_ec_worker, m,
                             "meta: decode encoder-cache worker metadata");
    if (rc)
        kvt_ec_worker_meta_clear(m);
    return rc;
}
