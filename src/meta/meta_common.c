/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Shared pieces of the metadata layer: the message header, dtype sizes, string checks and
 * sorted string sets.
 */
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "base/array.h"
#include "meta/meta_internal.h"

static const uint8_t magic[4] = {'K', 'V', 'T', 'M'};

static const char *kind_name(uint32_t kind)
{
    switch (kind) {
    case KVT_META_OFFLOAD:
        return "offload metadata";
    case KVT_META_OFFLOAD_WORKER:
        return "offload worker metadata";
    case KVT_META_EC:
        return "encoder-cache metadata";
    case KVT_META_EC_WORKER:
        return "encoder-cache worker metadata";
    case KVT_META_EC_LOAD_SPEC:
        return "encoder-cache load spec";
    case KVT_META_EC_PUSH_SPEC:
        return "encoder-cache push spec";
    case KVT_META_EC_CTL_REQUEST:
        return "encoder-cache control request";
    case KVT_META_EC_CTL_REPLY:
        return "encoder-cache control reply";
    case KVT_META_EC_CTL_EVENT:
        return "encoder-cache control event";
    default:
        return "unknown message";
    }
}

int kvt_meta_peek(const void *buf, size_t len, uint32_t *kind, uint32_t *version)
{
    if (!buf || !kind || !version)
        return kvt_fail(KVT_EINVAL, "meta: peek: NULL argument");
    if (len < KVT_META_HEADER_LEN)
        return kvt_fail(KVT_EPROTO,
                        "meta: message of %zu bytes is shorter than its %u-byte "
                        "header",
                        len, KVT_META_HEADER_LEN);
    const uint8_t *b = buf;
    if (memcmp(b, magic, 4) != 0)
        return kvt_fail(KVT_EPROTO, "meta: bad magic (not a kvtier message)");
    *version = (uint32_t)b[4] | (uint32_t)b[5] << 8;
    *kind = (uint32_t)b[6] | (uint32_t)b[7] << 8;
    return 0;
}

int kvi_wire_begin(kvi_rd *r, const void *buf, size_t len, uint32_t kind)
{
    uint32_t k, v;
    int rc = kvt_meta_peek(buf, len, &k, &v);
    if (rc)
        return rc;
    if (v != KVT_META_VERSION)
        return kvt_fail(KVT_EVERSION, "meta: %s version %u, this build reads version %u",
                        kind_name(k), v, KVT_META_VERSION);
    if (k != kind)
        return kvt_fail(KVT_EPROTO, "meta: expected %s, got %s (kind %u)", kind_name(kind),
                        kind_name(k), k);
    const uint8_t *b = buf;
    uint32_t body = ld_le32(b + 8);
    if ((uint64_t)body != (uint64_t)(len - KVT_META_HEADER_LEN))
        return kvt_fail(KVT_EPROTO, "meta: header announces a %u-byte body, the message has %zu",
                        body, len - KVT_META_HEADER_LEN);
    r->base = b;
    r->p = b + KVT_META_HEADER_LEN;
    r->end = b + len;
    return 0;
}

int kvi_wire_end(const kvi_rd *r)
{
    if (r->p != r->end)
        return kvt_fail(KVT_EPROTO, "meta: %zu trailing bytes after the body at offset %zu",
                        (size_t)(r->end - r->p), rd_off(r));
    return 0;
}

int kvi_wire_decode(const void *buf, size_t len, uint32_t kind, kvi_body_fn body, void *obj,
                    const char *what)
{
    kvi_rd r;
    int rc = kvi_wire_begin(&r, buf, len, kind);
    if (!rc)
        rc = body(obj, &r);
    if (!rc)
        rc = kvi_wire_end(&r);
    return rc ? kvi_fail_wrap(rc == KVT_EINVAL ? KVT_EPROTO : rc, what) : 0;
}

void kvi_wire_header(kvi_wr *w, uint32_t kind, size_t body_len)
{
    memcpy(w->p, magic, 4);
    w->p += 4;
    wr_u16(w, KVT_META_VERSION);
    wr_u16(w, (uint16_t)kind);
    wr_u32(w, (uint32_t)body_len);
}

int kvi_wire_check_out(const void *buf, size_t cap, size_t need, size_t *len)
{
    if (!buf || !len)
        return kvt_fail(KVT_EINVAL, "meta: encode: NULL argument");
    if (need - KVT_META_HEADER_LEN > UINT32_MAX)
        return kvt_fail(KVT_ELIMIT, "meta: encode: body of %zu bytes exceeds 4 GiB", need);
    if (cap < need)
        return kvt_fail(KVT_ENOSPC, "meta: encode: needs %zu bytes, buffer has %zu", need, cap);
    *len = need;
    return 0;
}

int kvi_meta_grow(void **arr, uint32_t *cap, uint32_t need, size_t elem)
{
    int rc = kvi_array_grow(arr, cap, need, elem);
    return rc ? kvi_fail_wrap(rc, "meta") : 0;
}

int kvi_meta_check_str(kvt_str s, uint32_t min_len, const char *what)
{
    if (s.len < min_len || s.len > KVT_META_MAX_STR)
        return kvt_fail(KVT_EINVAL, "%s: length %u not in %u..%u", what, s.len, min_len,
                        KVT_META_MAX_STR);
    if (s.len && !s.ptr)
        return kvt_fail(KVT_EINVAL, "%s: NULL string", what);
    if (s.len && memchr(s.ptr, '\0', s.len))
        return kvt_fail(KVT_EINVAL, "%s: contains a NUL byte", what);
    return 0;
}

int kvi_meta_copy_str(kvt_bump *b, const char *s, uint32_t len, kvt_str *out)
{
    if (len && !s)
        return kvt_fail(KVT_EINVAL, "meta: NULL string");
    char *d = kvi_bump_strdup(b, s, len);
    if (!d)
        return kvt_fail(KVT_ENOMEM, "meta: out of memory copying a %u-byte string", len);
    out->ptr = d;
    out->len = len;
    return 0;
}

int kvi_str_cmp(kvt_str a, kvt_str b)
{
    uint32_t n = a.len < b.len ? a.len : b.len;
    int c = n ? memcmp(a.ptr, b.ptr, n) : 0;
    if (c)
        return c;
    return a.len < b.len ? -1 : a.len > b.len;
}

bool kvi_str_equal(kvt_str a, kvt_str b)
{
    return a.len == b.len && (a.len == 0 || memcmp(a.ptr, b.ptr, a.len) == 0);
}

/* ---- dtypes ---------------------------------------------------------------------------- */

static const struct {
    const char *name;
    uint32_t size;
} dtypes[] = {
    {"bool", 1},
    {"uint8", 1},
    {"int8", 1},
    {"uint16", 2},
    {"int16", 2},
    {"uint32", 4},
    {"int32", 4},
    {"uint64", 8},
    {"int64", 8},
    {"float16", 2},
    {"half", 2},
    {"bfloat16", 2},
    {"float32", 4},
    {"float", 4},
    {"float64", 8},
    {"double", 8},
    {"complex64", 8},
    {"complex128", 16},
    {"float8_e4m3fn", 1},
    {"float8_e5m2", 1},
    {"float8_e4m3fnuz", 1},
    {"float8_e5m2fnuz", 1},
    {"float8_e8m0fnu", 1},
};

uint32_t kvt_dtype_size(const char *name, uint32_t len)
{
    if (!name)
        return 0;
    for (size_t i = 0; i < KVT_ARRAY_LEN(dtypes); i++)
        if (strlen(dtypes[i].name) == len && memcmp(dtypes[i].name, name, len) == 0)
            return dtypes[i].size;
    return 0;
}

/* ---- string sets ----------------------------------------------------------------------- */

/* Index of the first member >= key. */
static uint32_t lower_bound(const kvt_strset *set, kvt_str key)
{
    uint32_t lo = 0, hi = set->n;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (kvi_str_cmp(set->items[mid], key) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

bool kvt_strset_contains(const kvt_strset *set, const char *s, uint32_t len)
{
    if (!set || (len && !s))
        return false;
    kvt_str key = {s, len};
    uint32_t i = lower_bound(set, key);
    return i < set->n && kvi_str_equal(set->items[i], key);
}

int kvi_strset_add(kvt_strset *set, kvt_bump *b, const char *s, uint32_t len)
{
    kvt_str key = {s, len};
    int rc = kvi_meta_check_str(key, 1, "set member");
    if (rc)
        return rc;
    uint32_t i = lower_bound(set, key);
    if (i < set->n && kvi_str_equal(set->items[i], key))
        return 0;
    if (set->n >= KVT_META_MAX_ITEMS)
        return kvt_fail(KVT_ELIMIT, "meta: set exceeds %u members", KVT_META_MAX_ITEMS);
    rc = kvi_meta_grow((void **)&set->items, &set->cap, set->n + 1, sizeof(kvt_str));
    if (rc)
        return rc;
    kvt_str copy;
    rc = kvi_meta_copy_str(b, s, len, &copy);
    if (rc)
        return rc;
    memmove(&set->items[i + 1], &set->items[i], (size_t)(set->n - i) * sizeof(kvt_str));
    set->items[i] = copy;
    set->n++;
    return 0;
}

void kvi_strset_release(kvt_strset *set)
{
    free(set->items);
    memset(set, 0, sizeof(*set));
}

int kvi_strset_validate(const kvt_strset *set, const char *what)
{
    if (set->n > KVT_META_MAX_ITEMS)
        return kvt_fail(KVT_ELIMIT, "%s: %u members exceed the limit of %u", what, set->n,
                        KVT_META_MAX_ITEMS);
    if (set->n && !set->items)
        return kvt_fail(KVT_EINVAL, "%s: items is NULL", what);
    for (uint32_t i = 0; i < set->n; i++) {
        int rc = kvi_meta_check_str(set->items[i], 1, what);
        if (rc)
            return rc;
        if (i && kvi_str_cmp(set->items[i - 1], set->items[i]) >= 0)
            return kvt_fail(KVT_EINVAL, "%s: members not sorted and unique at index %u", what, i);
    }
    return 0;
}

bool kvi_strset_equal(const kvt_strset *a, const kvt_strset *b)
{
    if (a->n != b->n)
        return false;
    for (uint32_t i = 0; i < a->n; i++)
        if (!kvi_str_equal(a->items[i], b->items[i]))
            return false;
    return true;
}

/* ---- block lists and tier sections of the offload messages (both directions) ------------ */

bool kvi_meta_blocks_equal(const uint32_t *a, const uint32_t *b, uint32_t n)
{
    return n == 0 || memcmp(a, b, (size_t)n * sizeof(uint32_t)) == 0;
}

void kvi_meta_wr_blocks(kvi_wr *w, const uint32_t *ids, uint32_t n)
{
    wr_u32(w, n);
    for (uint32_t i = 0; i < n; i++)
        wr_u32(w, ids[i]);
}

int kvi_meta_rd_blocks(kvi_rd *r, uint32_t **a, uint32_t *cap, uint32_t *n, const char *what)
{
    uint32_t k;
    int rc = rd_count(r, &k, KVT_META_MAX_BLOCKS, 4, what);
    if (rc || (k && (rc = kvi_meta_grow((void **)a, cap, k, sizeof(uint32_t)))))
        return rc;
    for (uint32_t i = 0; i < k; i++)
        (*a)[i] = ld_le32(r->p + 4 * (size_t)i);
    r->p += (size_t)k * 4;
    *n = k;
    return 0;
}

int kvi_meta_rd_tier_count(kvi_rd *r, uint8_t *n)
{
    int rc = rd_u8(r, n, "tier sections");
    if (!rc && *n > KVT_MAX_TIERS - 1)
        rc = kvt_fail(KVT_EPROTO, "%u tier sections, this build has tiers 1 .. %u", *n,
                      KVT_MAX_TIERS - 1);
    return rc;
}

/* Section i's tier into *tier, which holds the previous section's (0 before the first). */
int kvi_meta_rd_tier(kvi_rd *r, uint32_t i, uint8_t *tier)
{
    uint8_t last = *tier;
    int rc = rd_u8(r, tier, "tier");
    if (!rc && (*tier <= last || *tier >= KVT_MAX_TIERS))
        rc = kvt_fail(KVT_EPROTO,
                      "tier section %u names tier %u (after tier %u; tiers are 1 .. %u, "
                      "ascending)",
                      i, *tier, last, KVT_MAX_TIERS - 1);
    return rc;
}
