/* SPDX-License-Identifier: Apache-2.0 */
/* kvtier._sched: the scheduler side of kvtier's vLLM connector (kvtier/vllm/kv/scheduler.py) as
 * compiled calls that take vLLM's own objects.
 *
 * Why: through ctypes every hook vLLM calls costs Python frames, a conversion per element
 * (block ids, hashes, request ids) and a release and retake of the GIL per C call; make
 * bench-vllm measured the connector at 170-310 us per step of which the C manager was 20-33.
 * Here one call per hook walks vLLM's lists (SchedulerOutput, the request's block_hashes, its
 * block table) in C, keeps each request's table and hashes in C arrays grown in place, calls
 * the manager and encodes the step's metadata. Same decisions as the ctypes path, which stays
 * as the fallback where this module is not built (no Python headers) and as the reference a
 * test compares it with.
 *
 * The library is not linked: the package hands over the addresses of the functions it loaded
 * with ctypes (the same copy of libkvtier, so the same handles and the same thread's error
 * message), in the order of API_NAMES, and the sizes of the structs both sides share are checked
 * against that copy's kvt_sizeof before anything is called. The engine's GPU block pool
 * callbacks (kvt_gpu_pool_ops) are C functions here calling vLLM's BlockPool; an exception in
 * one is kept and raised when the manager call that ran it returns.
 *
 * Thread rules: vLLM calls the scheduler side from the engine core's thread only. The hooks
 * hold the GIL throughout (the manager's calls are short and the pool callbacks need it); the
 * callbacks take it themselves, for the package's ctypes calls that release it.
 * Python's limited API (3.9) only: one build serves every CPython from 3.9. */
#define Py_LIMITED_API 0x03090000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvtier/kvtier.h"

/* ---- the library's functions, by address -------------------------------------------------- */

#define FS_API(X)                                                                                  \
    X(kvt_sizeof)                                                                                  \
    X(kvt_last_error)                                                                              \
    X(kvt_offload_match_flags)                                                                     \
    X(kvt_offload_after_alloc)                                                                     \
    X(kvt_offload_schedule_many)                                                                   \
    X(kvt_offload_build_meta)                                                                      \
    X(kvt_offload_request_finished_hashed)                                                         \
    X(kvt_offload_apply_output)                                                                    \
    X(kvt_offload_meta_encoded_size)                                                               \
    X(kvt_offload_meta_encode)                                                                     \
    X(kvt_offload_meta_empty)                                                                      \
    X(kvt_offload_worker_meta_decode)                                                              \
    X(kvt_offload_stats_read)

struct fs_api {
#define FS_FIELD(name) __typeof__(name) *name;
    FS_API(FS_FIELD)
#undef FS_FIELD
};

#define FS_NAME(name) #name,
static const char *const api_names[] = {FS_API(FS_NAME)};
#undef FS_NAME
#define N_API (sizeof(api_names) / sizeof(api_names[0]))

/* the structs whose layout this module and the loaded library must agree on */
static const struct {
    const char *name;
    size_t size;
} shared_structs[] = {
    {"kvt_offload_sched_req", sizeof(kvt_offload_sched_req)},
    {"kvt_offload_meta", sizeof(kvt_offload_meta)},
    {"kvt_offload_worker_meta", sizeof(kvt_offload_worker_meta)},
    {"kvt_offload_stats", sizeof(kvt_offload_stats)},
    {"kvt_pool_key", sizeof(kvt_pool_key)},
    {"kvt_str", sizeof(kvt_str)},
};

/* ---- interned attribute names ------------------------------------------------------------ */

#define FS_ATTRS(X)                                                                                \
    X(block_hashes)                                                                                \
    X(request_id)                                                                                  \
    X(num_tokens)                                                                                  \
    X(num_computed_tokens)                                                                         \
    X(num_output_placeholders)                                                                     \
    X(num_prompt_tokens)                                                                           \
    X(__dict__)                                                                                    \
    X(scheduled_new_reqs)                                                                          \
    X(scheduled_cached_reqs)                                                                       \
    X(req_id)                                                                                      \
    X(req_ids)                                                                                     \
    X(block_ids)                                                                                   \
    X(new_block_ids)                                                                               \
    X(resumed_req_ids)                                                                             \
    X(num_scheduled_tokens)                                                                        \
    X(preempted_req_ids)                                                                           \
    X(blocks)                                                                                      \
    X(touch)                                                                                       \
    X(free_blocks)                                                                                 \
    X(free_block_queue)                                                                            \
    X(iter_blocks_after)                                                                           \
    X(block_id)                                                                                    \
    X(block_hash)                                                                                  \
    X(is_null)                                                                                     \
    X(ref_cnt)                                                                                     \
    X(cached_block_hash_to_block)                                                                  \
    X(get_one_block)

static struct {
#define FS_STR(name) PyObject *name;
    FS_ATTRS(FS_STR)
#undef FS_STR
} s_;

/* ---- per-request state ---------------------------------------------------------------------- */

struct fs_link {
    struct fs_link *prev, *next; /* NULL while not linked */
};

/* Steps ahead a check can be placed at; a later one is placed at the last and put back. */
#define FS_WHEEL 64

struct fs_table {
    uint32_t *ids;
    uint32_t n, cap;
};

/* One request the scheduler side knows (from its first match to request_finished): its GPU
 * block table per group and its chained hashes, grown as vLLM reports them, and its entry of
 * kvt_offload_schedule_many, kept across steps. fs_sched.reqs and ptr_map lead to it from its
 * id; it is freed when it is forgotten (request_finished) or with the scheduler side. */
typedef struct fs_req {
    struct fs_link link; /* in the bucket of fs_sched.wheel its check is due in */
    uint64_t due;        /* the step its next check is due in */
    /* when queued for schedule_many, for run_batch's next_check */
    uint32_t computed, placeholders, scheduled;
    bool prefill;
    bool recompute;         /* resumed: recomputing tokens past its prompt */
    uint32_t prompt_tokens; /* num_prompt_tokens */
    PyObject *attrs;        /* the request's instance dict (NULL: it has none) */
    PyObject *request;      /* vLLM's Request */
    PyObject *key;          /* its id (str) as the maps were given it */
    PyObject *rid;          /* its id as UTF-8 bytes */
    uint8_t *hashes;
    uint32_t n_hashes, cap_hashes;
    int64_t ready;   /* confirmed scheduler blocks its last schedule call covered (-1: none) */
    int32_t pending; /* blocks the last call left (no room, no hash yet) */
    bool restart;    /* preempted: stores restart from its first block */
    bool in_batch;   /* queued for this step's kvt_offload_schedule_many */
    uint32_t ng;
    kvt_offload_sched_req item;
    struct fs_table *tables; /* [ng] */
    const uint32_t **ptrs;   /* [ng] */
    uint32_t *counts;        /* [ng] */
} fs_req;

typedef struct fs_stat {
    PyObject *name;
    size_t offset;
} fs_stat;

typedef struct {
    PyObject_HEAD struct fs_api api;
    kvt_offload *m;
    kvt_offload_meta *meta;         /* the Python OffloadMeta's struct */
    kvt_offload_worker_meta *wmeta; /* the Python WorkerMeta's struct */
    PyObject *error_type;           /* kvtier.KvtierError */
    PyObject *reqs;                 /* dict: request id (str) -> the record's address (int) */
    /* The same map by the id object's address: vLLM hands over the request's own id object
     * every step, and a dict lookup reads the string's cached hash from it (a cache miss per
     * request). Open addressing, linear probing, at most half full (tombstones included); an
     * entry's key is held by its record (fs_req.key), so no other object can take its address
     * while it is in the map. A miss falls back to the dict (an equal id in another object). */
    struct fs_ptr_entry {
        PyObject *key; /* NULL: empty; &ptr_tomb: deleted */
        fs_req *rec;
    } * ptr_map;
    uint32_t ptr_cap, ptr_used; /* ptr_used counts tombstones too */
    PyObject *gpu;              /* vLLM's BlockPool, or NULL before it is bound */
    PyObject *gpu_blocks, *gpu_touch, *gpu_free;
    PyObject *cb_type, *cb_value, *cb_tb; /* the first exception a pool callback raised */
    uint32_t ng, sched_bs, hash_len;
    bool eager;
    uint32_t group_tokens[KVT_MAX_GROUPS]; /* each group's block size (lru_scan's keys) */
    /* When each running request's next check is due. A request's confirmed tokens grow by at
     * most tokens_per_step a step once its prompt is computed (decode: 1 plus the speculative
     * tokens; see next_check for the placeholders of async scheduling), so its next block
     * cannot be confirmed before the step this wheel holds it for: a step
     * checks only the requests due in it, new ones and those given new blocks, never all of
     * them. A request with blocks left over (no room, no hash yet), in prefill, restarting or
     * not scheduled is due in the next step. A check only ever comes early, never late: a
     * late one would delay a store, which request_finished's flush still makes. */
    struct fs_link wheel[FS_WHEEL];
    uint64_t step;
    uint32_t tokens_per_step;
    fs_req **batch;
    kvt_offload_sched_req **items;
    uint32_t n_batch, cap_batch;
    struct fs_table scratch[KVT_MAX_GROUPS]; /* after_alloc's and finished's tables */
    const uint32_t *scratch_ptrs[KVT_MAX_GROUPS];
    uint32_t scratch_counts[KVT_MAX_GROUPS];
    kvt_offload_stats last;
    fs_stat *stats;
    uint32_t n_stats;
} fs_sched;

static void link_del(struct fs_link *l)
{
    if (l->next == NULL)
        return;
    l->prev->next = l->next;
    l->next->prev = l->prev;
    l->prev = l->next = NULL;
}

static void link_add_tail(struct fs_link *head, struct fs_link *l)
{
    l->prev = head->prev;
    l->next = head;
    head->prev->next = l;
    head->prev = l;
}

/* Holds r for a check in step due (at the latest FS_WHEEL - 1 steps ahead, from where it is
 * put back). */
static void wheel_put(fs_sched *s, fs_req *r, uint64_t due)
{
    link_del(&r->link);
    r->due = due > s->step ? due : s->step;
    uint64_t at = r->due - s->step < FS_WHEEL ? r->due : s->step + FS_WHEEL - 1;
    link_add_tail(&s->wheel[at % FS_WHEEL], &r->link);
}

static void req_free(fs_req *r)
{
    link_del(&r->link);
    Py_XDECREF(r->request);
    Py_XDECREF(r->key);
    Py_XDECREF(r->attrs);
    Py_XDECREF(r->rid);
    free(r->hashes);
    for (uint32_t g = 0; g < r->ng; g++)
        free(r->tables[g].ids);
    free(r->tables); /* with ptrs and counts: one allocation */
    free(r);
}

/* ---- small helpers ----------------------------------------------------------------------- */

static int grow(void **p, uint32_t *cap, uint32_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    uint32_t c = *cap ? *cap : 16;
    while (c < need) {
        if (c > UINT32_MAX / 2) {
            PyErr_SetString(PyExc_OverflowError, "kvtier: table too large");
            return -1;
        }
        c *= 2;
    }
    void *n = realloc(*p, (size_t)c * elem);
    if (n == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    *p = n;
    *cap = c;
    return 0;
}

/* Raises error_type(rc, what + the library's message); returns -1. */
static int fail_call_in(fs_sched *s, int rc, const char *what)
{
    const char *msg = s->api.kvt_last_error();
    PyObject *args = Py_BuildValue("(iN)", rc, PyUnicode_FromFormat("%s%s", what, msg ? msg : ""));
    if (args != NULL) {
        PyErr_SetObject(s->error_type, args);
        Py_DECREF(args);
    }
    return -1;
}

static int fail_call(fs_sched *s, int rc)
{
    return fail_call_in(s, rc, "");
}

/* After a manager call: the pool callbacks' exception first, then the call's failure. */
static int check(fs_sched *s, int rc)
{
    if (s->cb_type != NULL) {
        PyErr_Restore(s->cb_type, s->cb_value, s->cb_tb);
        s->cb_type = s->cb_value = s->cb_tb = NULL;
        return -1;
    }
    return rc < 0 ? fail_call(s, rc) : 0;
}

static int as_u32(PyObject *o, uint32_t *out, const char *what)
{
    unsigned long v = PyLong_AsUnsignedLong(o);
    if (v == (unsigned long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "kvtier: %s is not an integer in 0..2^32-1", what);
        return -1;
    }
    if (v > UINT32_MAX) {
        PyErr_Format(PyExc_ValueError, "kvtier: %s %lu out of range", what, v);
        return -1;
    }
    *out = (uint32_t)v;
    return 0;
}

#define attr_u32(o, name, out) attr_u32_(o, s_.name, out, #name)
static int attr_u32_(PyObject *o, PyObject *name, uint32_t *out, const char *what)
{
    PyObject *v = PyObject_GetAttr(o, name);
    if (v == NULL)
        return -1;
    int rc = as_u32(v, out, what);
    Py_DECREF(v);
    return rc;
}

/* A plain attribute of a request, read from its instance dict where it is there (a checked
 * step reads a few of each due request: the generic lookup walks the type's MRO first), else
 * looked up as any attribute. New reference. */
static PyObject *req_attr(PyObject *request, PyObject *attrs, PyObject *name)
{
    PyObject *v = attrs ? PyDict_GetItemWithError(attrs, name) : NULL;
    if (v != NULL) {
        Py_INCREF(v);
        return v;
    }
    return PyErr_Occurred() ? NULL : PyObject_GetAttr(request, name);
}

#define req_u32(r, name, out) req_u32_(r, s_.name, out, #name)
static int req_u32_(const struct fs_req *r, PyObject *name, uint32_t *out, const char *what);

/* Appends the ints of seq (a list or tuple of block ids) to t. */
static int table_extend(struct fs_table *t, PyObject *seq)
{
    Py_ssize_t n = PySequence_Size(seq);
    if (n < 0)
        return -1;
    if ((uint64_t)t->n + (uint64_t)n > UINT32_MAX / 2) {
        PyErr_SetString(PyExc_OverflowError, "kvtier: block table too large");
        return -1;
    }
    if (grow((void **)&t->ids, &t->cap, t->n + (uint32_t)n, sizeof(uint32_t)) < 0)
        return -1;
    bool list = PyList_Check(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *o = list ? PyList_GetItem(seq, i) : PySequence_GetItem(seq, i);
        if (o == NULL)
            return -1;
        int rc = as_u32(o, &t->ids[t->n + i], "block id");
        if (!list)
            Py_DECREF(o);
        if (rc < 0)
            return -1;
    }
    t->n += (uint32_t)n;
    return 0;
}

/* tables[0..ng) := groups (a sequence of sequences of block ids; fewer groups leave the rest
 * empty); extend instead of replacing when append is set. */
static int tables_set(fs_sched *s, struct fs_table *tables, PyObject *groups, bool append)
{
    Py_ssize_t ng = PySequence_Size(groups);
    if (ng < 0)
        return -1;
    if ((uint32_t)ng > s->ng) {
        PyErr_Format(PyExc_ValueError, "kvtier: %zd block tables for %u KV cache groups", ng,
                     s->ng);
        return -1;
    }
    for (uint32_t g = 0; g < s->ng; g++) {
        if (!append)
            tables[g].n = 0;
        if ((Py_ssize_t)g >= ng)
            continue;
        PyObject *one = PySequence_GetItem(groups, g);
        if (one == NULL)
            return -1;
        int rc = one == Py_None ? 0 : table_extend(&tables[g], one);
        Py_DECREF(one);
        if (rc < 0)
            return -1;
    }
    return 0;
}

static void tables_point(fs_sched *s, const struct fs_table *tables, const uint32_t **ptrs,
                         uint32_t *counts)
{
    for (uint32_t g = 0; g < s->ng; g++) {
        ptrs[g] = tables[g].ids;
        counts[g] = tables[g].n;
    }
}

/* ---- request records ------------------------------------------------------------------------ */

static char ptr_tomb;

static uint32_t ptr_hash(const PyObject *p, uint32_t cap)
{
    return (uint32_t)(((uintptr_t)p >> 4) * 0x9E3779B97F4A7C15ull >> 32) & (cap - 1);
}

/* The entry of key, or the empty one it would go in. */
static struct fs_ptr_entry *ptr_entry(const fs_sched *s, const PyObject *key)
{
    for (uint32_t i = ptr_hash(key, s->ptr_cap);; i = (i + 1) & (s->ptr_cap - 1))
        if (s->ptr_map[i].key == key || s->ptr_map[i].key == NULL)
            return &s->ptr_map[i];
}

static void ptr_put(struct fs_ptr_entry *map, uint32_t cap, PyObject *key, fs_req *rec)
{
    uint32_t i = ptr_hash(key, cap);
    while (map[i].key != NULL)
        i = (i + 1) & (cap - 1);
    map[i].key = key;
    map[i].rec = rec;
}

/* Adds key -> rec, rebuilding the table (without tombstones, larger if need be) when it
 * would be more than half used. */
static int ptr_add(fs_sched *s, PyObject *key, fs_req *rec)
{
    if (2 * (s->ptr_used + 1) > s->ptr_cap) {
        uint32_t live = 0, cap = 64;
        for (uint32_t i = 0; i < s->ptr_cap; i++)
            live += s->ptr_map[i].key != NULL && s->ptr_map[i].key != (PyObject *)&ptr_tomb;
        while (cap < 4 * (live + 1))
            cap *= 2;
        struct fs_ptr_entry *map = calloc(cap, sizeof(*map));
        if (map == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        for (uint32_t i = 0; i < s->ptr_cap; i++) {
            PyObject *k = s->ptr_map[i].key;
            if (k != NULL && k != (PyObject *)&ptr_tomb)
                ptr_put(map, cap, k, s->ptr_map[i].rec);
        }
        free(s->ptr_map);
        s->ptr_map = map;
        s->ptr_cap = cap;
        s->ptr_used = live;
    }
    ptr_put(s->ptr_map, s->ptr_cap, key, rec);
    s->ptr_used++;
    return 0;
}

static void ptr_del(fs_sched *s, const PyObject *key)
{
    if (s->ptr_cap == 0)
        return;
    struct fs_ptr_entry *e = ptr_entry(s, key);
    if (e->key == key)
        e->key = (PyObject *)&ptr_tomb;
}

/* The record of request id rid, or NULL (an exception set if the lookup failed). */
static fs_req *req_get(fs_sched *s, PyObject *rid)
{
    if (s->ptr_cap != 0) {
        const struct fs_ptr_entry *e = ptr_entry(s, rid);
        if (e->key == rid)
            return e->rec;
    }
    PyObject *o = PyDict_GetItemWithError(s->reqs, rid);
    return o == NULL ? NULL : PyLong_AsVoidPtr(o);
}

/* Forgets the record of rid (none: nothing happens); returns it, still allocated, in *out. */
static int req_forget(fs_sched *s, PyObject *rid, fs_req **out)
{
    fs_req *r = *out = req_get(s, rid);
    if (r == NULL)
        return PyErr_Occurred() ? -1 : 0;
    if (PyDict_DelItem(s->reqs, r->key) < 0) {
        *out = NULL;
        return -1;
    }
    ptr_del(s, r->key);
    return 0;
}

static fs_req *req_state(fs_sched *s, PyObject *request)
{
    PyObject *rid = PyObject_GetAttr(request, s_.request_id);
    if (rid == NULL)
        return NULL;
    fs_req *r = req_get(s, rid);
    if (r != NULL || PyErr_Occurred()) {
        Py_DECREF(rid);
        return r;
    }
    size_t ng = s->ng;
    r = calloc(1, sizeof(*r));
    void *arrays =
        calloc(1, ng * (sizeof(struct fs_table) + sizeof(uint32_t *) + sizeof(uint32_t)));
    if (r == NULL || arrays == NULL) {
        free(r);
        free(arrays);
        Py_DECREF(rid);
        PyErr_NoMemory();
        return NULL;
    }
    r->tables = arrays;
    r->ng = s->ng;
    r->ptrs = (const uint32_t **)(r->tables + ng);
    r->counts = (uint32_t *)(r->ptrs + ng);
    r->ready = -1;
    r->key = rid; /* the reference taken above */
    r->rid = PyUnicode_AsUTF8String(rid);
    Py_INCREF(request);
    r->request = request;
    if (r->rid != NULL && (r->attrs = PyObject_GetAttr(request, s_.__dict__)) == NULL)
        PyErr_Clear(); /* no instance dict: every attribute is looked up */
    if (r->attrs != NULL && !PyDict_Check(r->attrs))
        Py_CLEAR(r->attrs);
    if (r->rid != NULL && req_u32(r, num_prompt_tokens, &r->prompt_tokens) < 0)
        Py_CLEAR(r->rid);
    PyObject *addr = r->rid ? PyLong_FromVoidPtr(r) : NULL;
    if (addr == NULL || ptr_add(s, rid, r) < 0) {
        Py_XDECREF(addr);
        req_free(r);
        return NULL;
    }
    if (PyDict_SetItem(s->reqs, rid, addr) < 0) {
        ptr_del(s, rid);
        Py_DECREF(addr);
        req_free(r);
        return NULL;
    }
    Py_DECREF(addr);
    kvt_offload_sched_req *it = &r->item;
    it->req_id = PyBytes_AsString(r->rid);
    it->req_id_len = (uint32_t)PyBytes_Size(r->rid);
    it->blocks = r->ptrs;
    it->n_blocks = r->counts;
    return r;
}

static int req_u32_(const struct fs_req *r, PyObject *name, uint32_t *out, const char *what)
{
    PyObject *v = req_attr(r->request, r->attrs, name);
    if (v == NULL)
        return -1;
    int rc = as_u32(v, out, what);
    Py_DECREF(v);
    return rc;
}

/* Appends the hashes vLLM computed since the last call (request.block_hashes only grows). */
static int req_sync_hashes(fs_sched *s, fs_req *r)
{
    PyObject *bh = req_attr(r->request, r->attrs, s_.block_hashes);
    if (bh == NULL)
        return -1;
    int rc = -1;
    Py_ssize_t n = PySequence_Size(bh);
    if (n < 0)
        goto out;
    if ((uint64_t)n > UINT32_MAX / 2 / s->hash_len) {
        PyErr_SetString(PyExc_OverflowError, "kvtier: too many block hashes");
        goto out;
    }
    if ((uint32_t)n < r->n_hashes) { /* vLLM never shrinks it; a new list restarts */
        r->n_hashes = 0;
    }
    if ((uint32_t)n > r->n_hashes &&
        grow((void **)&r->hashes, &r->cap_hashes, (uint32_t)n * s->hash_len, 1) < 0)
        goto out;
    for (Py_ssize_t i = r->n_hashes; i < n; i++) {
        PyObject *h = PySequence_GetItem(bh, i);
        if (h == NULL)
            goto out;
        char *p;
        Py_ssize_t len;
        if (PyBytes_AsStringAndSize(h, &p, &len) < 0 || (size_t)len != s->hash_len) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError,
                             "kvtier: block hash %zd of a request is %zd bytes, not %u", i, len,
                             s->hash_len);
            Py_DECREF(h);
            goto out;
        }
        memcpy(r->hashes + (size_t)i * s->hash_len, p, s->hash_len);
        Py_DECREF(h);
    }
    r->n_hashes = (uint32_t)n;
    rc = 0;
out:
    Py_DECREF(bh);
    return rc;
}

static void req_restart(fs_sched *s, fs_req *r)
{
    r->restart = true;
    r->recompute = true;
    r->pending = 0;
    r->ready = -1;
    wheel_put(s, r, s->step + 1);
}

/* ---- the GPU pool callbacks (kvt_gpu_pool_ops) ------------------------------------------- */

static void set_ref(PyObject **slot, PyObject *v)
{
    PyObject *old = *slot;
    *slot = v;
    Py_XDECREF(old);
}

static void keep_error(fs_sched *s)
{
    if (s->cb_type == NULL)
        PyErr_Fetch(&s->cb_type, &s->cb_value, &s->cb_tb);
    else
        PyErr_Clear();
}

/* Calls fn([gpu.blocks[id] for id in ids]). */
static void call_with_blocks(fs_sched *s, PyObject *fn, const uint32_t *ids, uint32_t n)
{
    if (fn == NULL) {
        if (s->cb_type == NULL)
            PyErr_SetString(PyExc_RuntimeError, "kvtier: no GPU block pool bound");
        keep_error(s);
        return;
    }
    PyObject *list = PyList_New(n);
    if (list == NULL) {
        keep_error(s);
        return;
    }
    for (uint32_t i = 0; i < n; i++) {
        PyObject *b = PyList_GetItem(s->gpu_blocks, ids[i]);
        if (b == NULL) {
            Py_DECREF(list);
            keep_error(s);
            return;
        }
        Py_INCREF(b);
        PyList_SetItem(list, i, b);
    }
    PyObject *res = PyObject_CallFunctionObjArgs(fn, list, NULL);
    Py_DECREF(list);
    if (res == NULL)
        keep_error(s);
    Py_XDECREF(res);
}

/* The callbacks take the GIL: this module's hooks hold it, but the package's ctypes calls
 * (reset, release of engine blocks) release it around the manager call that runs them. */
static void gpu_touch(void *ctx, const uint32_t *ids, uint32_t n)
{
    fs_sched *s = ctx;
    PyGILState_STATE g = PyGILState_Ensure();
    call_with_blocks(s, s->gpu_touch, ids, n);
    PyGILState_Release(g);
}

static void gpu_free(void *ctx, const uint32_t *ids, uint32_t n)
{
    fs_sched *s = ctx;
    PyGILState_STATE g = PyGILState_Ensure();
    call_with_blocks(s, s->gpu_free, ids, n);
    PyGILState_Release(g);
}

/* vLLM's key of a cached block: the hash, then the group as 4 big-endian bytes. */
static int scan_one(fs_sched *s, PyObject *blk, uint32_t *id, kvt_pool_key *key)
{
    if (attr_u32(blk, block_id, id) < 0)
        return -1;
    key->num_tokens = 0;
    PyObject *h = PyObject_GetAttr(blk, s_.block_hash);
    PyObject *null = h ? PyObject_GetAttr(blk, s_.is_null) : NULL;
    int rc = -1;
    if (null == NULL)
        goto out;
    int is_null = PyObject_IsTrue(null);
    if (is_null < 0)
        goto out;
    rc = 0;
    if (h == Py_None || is_null)
        goto out;
    char *p;
    Py_ssize_t len;
    rc = PyBytes_AsStringAndSize(h, &p, &len);
    if (rc == 0 && (size_t)len != s->hash_len + 4) {
        PyErr_Format(PyExc_ValueError, "kvtier: a cached block's key is %zd bytes, not %u", len,
                     s->hash_len + 4);
        rc = -1;
    }
    if (rc < 0)
        goto out;
    const uint8_t *g = (const uint8_t *)p + s->hash_len;
    uint32_t group = (uint32_t)g[0] << 24 | (uint32_t)g[1] << 16 | (uint32_t)g[2] << 8 | g[3];
    if (group >= s->ng) {
        PyErr_Format(PyExc_ValueError, "kvtier: a cached block's group %u of %u", group, s->ng);
        rc = -1;
        goto out;
    }
    memset(key->hash, 0, sizeof(key->hash));
    memcpy(key->hash, p, s->hash_len);
    key->group = group;
    key->num_tokens = s->group_tokens[group];
out:
    Py_XDECREF(h);
    Py_XDECREF(null);
    return rc;
}

static uint32_t lru_scan(fs_sched *s, uint32_t cap, uint32_t *ids, kvt_pool_key *keys)
{
    uint32_t n = 0;
    PyObject *it = NULL, *q = s->gpu ? PyObject_GetAttr(s->gpu, s_.free_block_queue) : NULL;
    if (q != NULL)
        it = PyObject_CallMethodObjArgs(q, s_.iter_blocks_after, Py_None, NULL);
    Py_XDECREF(q);
    if (it == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "kvtier: no GPU block pool bound");
        keep_error(s);
        return 0;
    }
    PyObject *blk;
    while (n < cap && (blk = PyIter_Next(it)) != NULL) {
        int rc = scan_one(s, blk, &ids[n], &keys[n]);
        Py_DECREF(blk);
        if (rc < 0)
            break;
        n++;
    }
    Py_DECREF(it);
    if (PyErr_Occurred()) {
        keep_error(s);
        return 0;
    }
    return n;
}

static uint32_t lookup(fs_sched *s, const uint8_t *hash, uint32_t group, uint32_t *ref_cnt)
{
    uint8_t key[KVT_HASH_MAX + 4];
    memcpy(key, hash, s->hash_len);
    key[s->hash_len] = (uint8_t)(group >> 24);
    key[s->hash_len + 1] = (uint8_t)(group >> 16);
    key[s->hash_len + 2] = (uint8_t)(group >> 8);
    key[s->hash_len + 3] = (uint8_t)group;
    uint32_t id = KVT_BLOCK_NONE;
    PyObject *k = PyBytes_FromStringAndSize((const char *)key, s->hash_len + 4);
    PyObject *map = k && s->gpu ? PyObject_GetAttr(s->gpu, s_.cached_block_hash_to_block) : NULL;
    PyObject *blk = map ? PyObject_CallMethodObjArgs(map, s_.get_one_block, k, NULL) : NULL;
    if (blk != NULL && blk != Py_None &&
        (attr_u32(blk, ref_cnt, ref_cnt) < 0 || attr_u32(blk, block_id, &id) < 0))
        id = KVT_BLOCK_NONE;
    if (PyErr_Occurred() || (k && !s->gpu)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "kvtier: no GPU block pool bound");
        keep_error(s);
        id = KVT_BLOCK_NONE;
    }
    Py_XDECREF(blk);
    Py_XDECREF(map);
    Py_XDECREF(k);
    return id;
}

static uint32_t gpu_lru_scan(void *ctx, uint32_t cap, uint32_t *ids, kvt_pool_key *keys)
{
    PyGILState_STATE g = PyGILState_Ensure();
    uint32_t n = lru_scan(ctx, cap, ids, keys);
    PyGILState_Release(g);
    return n;
}

static uint32_t gpu_lookup(void *ctx, const uint8_t *hash, uint32_t group, uint32_t *ref_cnt)
{
    PyGILState_STATE g = PyGILState_Ensure();
    uint32_t id = lookup(ctx, hash, group, ref_cnt);
    PyGILState_Release(g);
    return id;
}

/* ---- the object ------------------------------------------------------------------------------ */

static int sched_init(PyObject *self, PyObject *args, PyObject *kw)
{
    fs_sched *s = (fs_sched *)self;
    PyObject *addrs, *err, *tokens, *stats;
    unsigned int sched_bs, hash_len;
    int eager;
    unsigned int tokens_per_step;
    static char *kwlist[] = {"functions",  "group_tokens", "sched_block_size", "hash_len", "eager",
                             "error_type", "stats",        "tokens_per_step",  NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOIIpOOI", kwlist, &addrs, &tokens, &sched_bs,
                                     &hash_len, &eager, &err, &stats, &tokens_per_step))
        return -1;
    if (tokens_per_step < 1 || tokens_per_step > (1u << 20)) {
        PyErr_Format(PyExc_ValueError, "kvtier: tokens_per_step %u (1..2^20)", tokens_per_step);
        return -1;
    }
    if (s->reqs != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "kvtier: _sched.Scheduler initialised twice");
        return -1;
    }
    if (PySequence_Size(addrs) != (Py_ssize_t)N_API) {
        PyErr_Format(PyExc_ValueError, "kvtier: %zu function addresses expected (API_NAMES)",
                     N_API);
        return -1;
    }
    void **fns = (void **)&s->api;
    for (size_t i = 0; i < N_API; i++) {
        PyObject *a = PySequence_GetItem(addrs, (Py_ssize_t)i);
        fns[i] = a ? PyLong_AsVoidPtr(a) : NULL;
        Py_XDECREF(a);
        if (fns[i] == NULL) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError, "kvtier: no address for %s", api_names[i]);
            return -1;
        }
    }
    for (size_t i = 0; i < sizeof(shared_structs) / sizeof(shared_structs[0]); i++) {
        size_t lib = s->api.kvt_sizeof(shared_structs[i].name);
        if (lib != shared_structs[i].size) {
            PyErr_Format(PyExc_ImportError,
                         "kvtier: struct %s is %zu bytes in libkvtier but %zu in kvtier._sched "
                         "(built from another version): reinstall kvtier",
                         shared_structs[i].name, lib, shared_structs[i].size);
            return -1;
        }
    }
    Py_ssize_t ng = PySequence_Size(tokens);
    if (ng < 1 || ng > KVT_MAX_GROUPS || hash_len < 1 || hash_len > KVT_HASH_MAX || sched_bs < 1) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError,
                         "kvtier: %zd groups (1..%d), hash length %u (1..%d), scheduler block "
                         "size %u",
                         ng, KVT_MAX_GROUPS, hash_len, KVT_HASH_MAX, sched_bs);
        return -1;
    }
    s->ng = (uint32_t)ng;
    for (Py_ssize_t g = 0; g < ng; g++) {
        PyObject *t = PySequence_GetItem(tokens, g);
        int rc = t ? as_u32(t, &s->group_tokens[g], "group block size") : -1;
        Py_XDECREF(t);
        if (rc < 0)
            return -1;
    }
    Py_ssize_t ns = PySequence_Size(stats);
    if (ns < 0)
        return -1;
    s->stats = calloc((size_t)ns + 1, sizeof(*s->stats));
    if (s->stats == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < ns; i++) { /* (name, offset) of each counter drained per step */
        PyObject *row = PySequence_GetItem(stats, i);
        PyObject *name = NULL;
        Py_ssize_t off = -1;
        if (row != NULL && PyArg_ParseTuple(row, "Un", &name, &off) && off >= 0 &&
            (size_t)off + sizeof(uint64_t) <= sizeof(kvt_offload_stats)) {
            Py_INCREF(name);
            s->stats[s->n_stats].name = name;
            s->stats[s->n_stats++].offset = (size_t)off;
        } else if (!PyErr_Occurred()) {
            PyErr_Format(PyExc_ValueError, "kvtier: stats row %zd: offset %zd out of range", i,
                         off);
        }
        Py_XDECREF(row);
        if (PyErr_Occurred())
            return -1;
    }
    s->sched_bs = sched_bs;
    s->hash_len = hash_len;
    s->eager = eager;
    for (int i = 0; i < FS_WHEEL; i++)
        s->wheel[i].prev = s->wheel[i].next = &s->wheel[i];
    s->tokens_per_step = tokens_per_step;
    Py_INCREF(err);
    s->error_type = err;
    s->reqs = PyDict_New();
    return s->reqs ? 0 : -1;
}

static void drop_all(fs_sched *s)
{
    PyObject *key, *addr;
    for (Py_ssize_t pos = 0; s->reqs != NULL && PyDict_Next(s->reqs, &pos, &key, &addr);)
        req_free(PyLong_AsVoidPtr(addr));
    Py_CLEAR(s->reqs);
    free(s->ptr_map);
    s->ptr_map = NULL;
    s->ptr_cap = s->ptr_used = 0;
}

static void sched_dealloc(PyObject *self)
{
    fs_sched *s = (fs_sched *)self;
    PyTypeObject *tp = Py_TYPE(self);
    drop_all(s);
    Py_CLEAR(s->error_type);
    Py_CLEAR(s->gpu);
    Py_CLEAR(s->gpu_blocks);
    Py_CLEAR(s->gpu_touch);
    Py_CLEAR(s->gpu_free);
    Py_CLEAR(s->cb_type);
    Py_CLEAR(s->cb_value);
    Py_CLEAR(s->cb_tb);
    for (uint32_t i = 0; i < s->n_stats; i++)
        Py_DECREF(s->stats[i].name);
    free(s->stats);
    for (uint32_t g = 0; g < KVT_MAX_GROUPS; g++)
        free(s->scratch[g].ids);
    free(s->batch);
    free(s->items);
    freefunc f = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    f(self);
    Py_DECREF(tp);
}

/* ops() -> (touch, free, lru_scan, lookup, ctx): the addresses of the pool callbacks, for the
 * kvt_gpu_pool_ops given to kvt_offload_create_ext, with this object as their context. */
static PyObject *sched_ops(PyObject *self, PyObject *unused)
{
    (void)unused;
    return Py_BuildValue("(NNNNN)", PyLong_FromVoidPtr((void *)gpu_touch),
                         PyLong_FromVoidPtr((void *)gpu_free),
                         PyLong_FromVoidPtr((void *)gpu_lru_scan),
                         PyLong_FromVoidPtr((void *)gpu_lookup), PyLong_FromVoidPtr(self));
}

/* bind(manager, meta, worker_meta): addresses of the kvt_offload handle and of the two structs
 * (owned by the Python objects, which must outlive this one). */
static PyObject *sched_bind(PyObject *self, PyObject *args)
{
    fs_sched *s = (fs_sched *)self;
    PyObject *h, *meta, *wmeta;
    if (!PyArg_ParseTuple(args, "OOO", &h, &meta, &wmeta))
        return NULL;
    s->m = PyLong_AsVoidPtr(h);
    s->meta = PyLong_AsVoidPtr(meta);
    s->wmeta = PyLong_AsVoidPtr(wmeta);
    if (PyErr_Occurred())
        return NULL;
    if (s->m == NULL || s->meta == NULL || s->wmeta == NULL) {
        s->m = NULL;
        PyErr_SetString(PyExc_ValueError, "kvtier: bind: a NULL address");
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *sched_unbind(PyObject *self, PyObject *unused)
{
    (void)unused;
    ((fs_sched *)self)->m = NULL;
    Py_RETURN_NONE;
}

static PyObject *sched_set_gpu(PyObject *self, PyObject *pool)
{
    fs_sched *s = (fs_sched *)self;
    PyObject *blocks = PyObject_GetAttr(pool, s_.blocks);
    PyObject *touch = blocks ? PyObject_GetAttr(pool, s_.touch) : NULL;
    PyObject *fr = touch ? PyObject_GetAttr(pool, s_.free_blocks) : NULL;
    if (fr == NULL || !PyList_Check(blocks)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "kvtier: the block pool's blocks is not a list");
        Py_XDECREF(blocks);
        Py_XDECREF(touch);
        Py_XDECREF(fr);
        return NULL;
    }
    Py_INCREF(pool);
    set_ref(&s->gpu, pool);
    set_ref(&s->gpu_blocks, blocks);
    set_ref(&s->gpu_touch, touch);
    set_ref(&s->gpu_free, fr);
    Py_RETURN_NONE;
}

static int bound(fs_sched *s)
{
    if (s->m != NULL)
        return 0;
    PyErr_SetString(PyExc_RuntimeError, "kvtier: the scheduler side is closed");
    return -1;
}

/* match(request, num_computed, flags) -> hit tokens (get_num_new_matched_tokens). */
static PyObject *sched_match(PyObject *self, PyObject *args)
{
    fs_sched *s = (fs_sched *)self;
    PyObject *request;
    unsigned int computed, flags;
    if (!PyArg_ParseTuple(args, "OII", &request, &computed, &flags) || bound(s) < 0)
        return NULL;
    fs_req *r = req_state(s, request);
    if (r == NULL || req_sync_hashes(s, r) < 0)
        return NULL;
    if (r->n_hashes == 0)
        return PyLong_FromLong(0);
    uint32_t ntok, hit = 0;
    if (attr_u32(request, num_tokens, &ntok) < 0)
        return NULL;
    int rc = s->api.kvt_offload_match_flags(s->m, r->item.req_id, r->item.req_id_len, r->hashes,
                                            r->n_hashes, ntok, computed, flags, &hit);
    if (check(s, rc) < 0)
        return NULL;
    return PyLong_FromUnsignedLong(hit);
}

/* after_alloc(request, block_ids, num_external): block_ids is KVCacheBlocks.get_block_ids(). */
static PyObject *sched_after_alloc(PyObject *self, PyObject *args)
{
    fs_sched *s = (fs_sched *)self;
    PyObject *request, *ids;
    unsigned int ext;
    if (!PyArg_ParseTuple(args, "OOI", &request, &ids, &ext) || bound(s) < 0)
        return NULL;
    fs_req *r = req_state(s, request);
    if (r == NULL || tables_set(s, s->scratch, ids, false) < 0)
        return NULL;
    tables_point(s, s->scratch, s->scratch_ptrs, s->scratch_counts);
    int rc = s->api.kvt_offload_after_alloc(s->m, r->item.req_id, r->item.req_id_len,
                                            s->scratch_ptrs, s->scratch_counts, ext);
    if (check(s, rc) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* The step r's next check is due in: before this step r computed `computed` of its
 * num_tokens tokens, `placeholders` of them not yet confirmed; this step computes `scheduled`
 * more; its last schedule call covered r->ready scheduler blocks. A request with known
 * tokens left after this step is in a prefill (a first one, or the recomputation of a resumed
 * request) and may compute any number in the next step: due then. Otherwise it decodes: by
 * the step k steps from now its confirmed tokens grow by at most placeholders + scheduled +
 * (k - 1) * tokens_per_step (confirmation catches up at most the placeholders outstanding
 * now, this step computes `scheduled`, each later one at most tokens_per_step), so its next
 * block cannot be confirmed sooner. */
static uint64_t next_check(const fs_sched *s, const fs_req *r, uint32_t computed,
                           uint32_t placeholders, uint32_t scheduled, bool prefill)
{
    if (r->pending || r->restart || prefill)
        return s->step + 1;
    uint64_t confirmed = computed >= placeholders ? computed - placeholders : 0;
    int64_t ready = r->ready < 0 ? 0 : r->ready;
    uint64_t boundary = (uint64_t)(ready + 1) * s->sched_bs;
    uint64_t reach = confirmed + placeholders + scheduled; /* the most by the next step */
    if (boundary <= reach)
        return s->step + 1;
    return s->step + 1 + (boundary - reach + s->tokens_per_step - 1) / s->tokens_per_step;
}

/* Whether r, scheduled for `scheduled` tokens this step, still has known tokens to compute
 * after it (a prefill, which may compute any number in the next step): a chunk larger than a
 * decode step, a prompt not yet computed, or a resumed request recomputing its output (the
 * only case that reads num_tokens, a property). */
static int is_prefill(const fs_sched *s, fs_req *r, uint32_t computed, uint32_t scheduled,
                      bool *prefill)
{
    *prefill = scheduled > s->tokens_per_step || computed < r->prompt_tokens;
    if (*prefill || !r->recompute)
        return 0;
    uint32_t n;
    if (attr_u32(r->request, num_tokens, &n) < 0)
        return -1;
    *prefill = (uint64_t)computed + scheduled < n;
    r->recompute = *prefill;
    return 0;
}

/* Queues r for this step's kvt_offload_schedule_many if a block of it may be newly confirmed
 * (or some were left over); otherwise holds it for its next check. */
static int schedule_one(fs_sched *s, fs_req *r, PyObject *nsched, PyObject *rid)
{
    if (r->in_batch)
        return 0;
    PyObject *o = PyDict_GetItemWithError(nsched, rid);
    uint32_t scheduled = 0, computed, placeholders;
    if (o == NULL && PyErr_Occurred())
        return -1;
    if (o != NULL && as_u32(o, &scheduled, "num_scheduled_tokens") < 0)
        return -1;
    if (scheduled == 0) { /* not running this step: look again in the next */
        wheel_put(s, r, s->step + 1);
        return 0;
    }
    if (req_u32(r, num_computed_tokens, &computed) < 0 ||
        req_u32(r, num_output_placeholders, &placeholders) < 0)
        return -1;
    bool prefill;
    if (is_prefill(s, r, computed, scheduled, &prefill) < 0)
        return -1;
    uint32_t confirmed = computed >= placeholders ? computed - placeholders : 0;
    int64_t ready = confirmed / s->sched_bs;
    if (ready <= r->ready && !r->pending && !r->restart) {
        wheel_put(s, r, next_check(s, r, computed, placeholders, scheduled, prefill));
        return 0;
    }
    r->ready = ready;
    if (req_sync_hashes(s, r) < 0)
        return -1;
    if (s->n_batch == s->cap_batch) {
        uint32_t cap = s->cap_batch, c2 = cap;
        if (grow((void **)&s->batch, &cap, s->n_batch + 1, sizeof(*s->batch)) < 0 ||
            grow((void **)&s->items, &c2, s->n_batch + 1, sizeof(*s->items)) < 0)
            return -1;
        s->cap_batch = cap < c2 ? cap : c2;
    }
    kvt_offload_sched_req *it = &r->item;
    it->hashes = r->hashes;
    it->n_hashes = r->n_hashes;
    tables_point(s, r->tables, r->ptrs, r->counts);
    it->num_confirmed = confirmed;
    it->num_scheduled = scheduled;
    it->resumed = r->restart;
    r->restart = false;
    r->in_batch = true;
    r->computed = computed;
    r->placeholders = placeholders;
    r->scheduled = scheduled;
    r->prefill = prefill;
    s->batch[s->n_batch] = r;
    s->items[s->n_batch++] = it;
    return 0;
}

static int select_new(fs_sched *s, PyObject *so, PyObject *nsched)
{
    PyObject *news = PyObject_GetAttr(so, s_.scheduled_new_reqs);
    if (news == NULL)
        return -1;
    int rc = 0;
    Py_ssize_t n = PySequence_Size(news);
    for (Py_ssize_t i = 0; rc == 0 && i < n; i++) {
        PyObject *nr = PySequence_GetItem(news, i);
        PyObject *rid = nr ? PyObject_GetAttr(nr, s_.req_id) : NULL;
        PyObject *ids = rid ? PyObject_GetAttr(nr, s_.block_ids) : NULL;
        fs_req *r = ids ? req_get(s, rid) : NULL;
        rc = ids == NULL || PyErr_Occurred() ? -1 : 0;
        if (r != NULL) { /* a (re)started request: its whole table */
            rc = tables_set(s, r->tables, ids, false);
            if (rc == 0 && s->eager)
                rc = schedule_one(s, r, nsched, rid);
        }
        Py_XDECREF(ids);
        Py_XDECREF(rid);
        Py_XDECREF(nr);
    }
    Py_DECREF(news);
    return n < 0 ? -1 : rc;
}

/* Item i of a list or tuple (borrowed). */
static PyObject *item(PyObject *seq, bool list, Py_ssize_t i)
{
    return list ? PyList_GetItem(seq, i) : PyTuple_GetItem(seq, i);
}

/* Running request rid's new blocks nw (resumed: they replace its table); a request given a
 * new block is checked in this step. */
static int cached_one(fs_sched *s, PyObject *rid, PyObject *nw, PyObject *resumed)
{
    fs_req *r = req_get(s, rid);
    if (r == NULL)
        return PyErr_Occurred() ? -1 : 0;
    int res = resumed != NULL ? PySequence_Contains(resumed, rid) : 0;
    if (res > 0) {
        for (uint32_t g = 0; g < s->ng; g++)
            r->tables[g].n = 0;
        req_restart(s, r);
    }
    if (res < 0 || tables_set(s, r->tables, nw, true) < 0)
        return -1;
    wheel_put(s, r, s->step);
    return 0;
}

/* The checks due in this step. */
static int run_due(fs_sched *s, PyObject *nsched)
{
    struct fs_link due, *head = &s->wheel[s->step % FS_WHEEL];
    if (head->next == head)
        return 0;
    due.prev = head->prev; /* the bucket moves to a list of its own: checks put back go in */
    due.next = head->next; /* buckets of their own */
    due.prev->next = due.next->prev = &due;
    head->prev = head->next = head;
    int rc = 0;
    while (due.next != &due) {
        fs_req *r = (fs_req *)due.next; /* link is the first member */
        link_del(&r->link);
        if (rc < 0) {
            wheel_put(s, r, s->step + 1);
            continue;
        }
        if (r->due > s->step)
            wheel_put(s, r, r->due);
        else
            rc = schedule_one(s, r, nsched, r->key);
    }
    return rc;
}

/* The scheduled running requests (CachedRequestData), then those the last calls left blocks
 * of. */
static int select_cached(fs_sched *s, PyObject *so, PyObject *nsched)
{
    PyObject *c = PyObject_GetAttr(so, s_.scheduled_cached_reqs), *resumed = NULL;
    PyObject *seq[2] = {NULL, NULL}; /* req_ids, new_block_ids */
    PyObject *const names[2] = {s_.req_ids, s_.new_block_ids};
    bool list[2];
    int rc = -1;
    if (c == NULL)
        return -1;
    for (int k = 0; k < 2; k++) {
        PyObject *o = PyObject_GetAttr(c, names[k]);
        seq[k] = o ? PySequence_Fast(o, "kvtier: CachedRequestData holds a non-sequence") : NULL;
        Py_XDECREF(o);
        if (seq[k] == NULL)
            goto out;
        list[k] = PyList_Check(seq[k]);
    }
    resumed = PyObject_GetAttr(c, s_.resumed_req_ids);
    if (resumed == Py_None)
        Py_CLEAR(resumed);
    Py_ssize_t n = PyObject_Length(seq[0]);
    Py_ssize_t nr = resumed ? PyObject_Length(resumed) : PyErr_Occurred() ? -1 : 0;
    if (nr < 0 || PyObject_Length(seq[1]) != n) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "kvtier: CachedRequestData's lists differ in length");
        goto out;
    }
    if (nr == 0)
        Py_CLEAR(resumed);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *nw = item(seq[1], list[1], i);
        if (nw != Py_None && cached_one(s, item(seq[0], list[0], i), nw, resumed) < 0)
            goto out;
    }
    rc = run_due(s, nsched);
out:
    Py_XDECREF(resumed);
    for (int k = 0; k < 2; k++)
        Py_XDECREF(seq[k]);
    Py_DECREF(c);
    return rc;
}

static int run_batch(fs_sched *s)
{
    uint32_t n = s->n_batch;
    if (n == 0)
        return 0;
    s->n_batch = 0;
    int rc = s->api.kvt_offload_schedule_many(s->m, s->items, n, NULL);
    for (uint32_t i = 0; i < n; i++) {
        fs_req *r = s->batch[i];
        r->in_batch = false;
        if (rc < 0) {
            wheel_put(s, r, s->step + 1);
            continue;
        }
        r->pending = r->item.left;
        wheel_put(s, r, next_check(s, r, r->computed, r->placeholders, r->scheduled, r->prefill));
    }
    return check(s, rc);
}

/* build_meta(scheduler_output) -> the step's encoded metadata, or None when it carries nothing
 * (and nobody was preempted). */
static PyObject *sched_build_meta(PyObject *self, PyObject *so)
{
    fs_sched *s = (fs_sched *)self;
    if (bound(s) < 0)
        return NULL;
    PyObject *pre = PyObject_GetAttr(so, s_.preempted_req_ids);
    PyObject *nsched = pre ? PyObject_GetAttr(so, s_.num_scheduled_tokens) : NULL;
    PyObject *out = NULL;
    if (nsched == NULL)
        goto done;
    if (!PyDict_Check(nsched)) {
        PyErr_SetString(PyExc_TypeError, "kvtier: num_scheduled_tokens is not a dict");
        goto done;
    }
    int preempted = PyObject_IsTrue(pre);
    if (preempted < 0)
        goto done;
    if (preempted) { /* its blocks were freed: stores restart from block 0 */
        PyObject *it = PyObject_GetIter(pre), *rid;
        if (it == NULL)
            goto done;
        while ((rid = PyIter_Next(it)) != NULL) {
            fs_req *r = req_get(s, rid);
            if (r != NULL) {
                for (uint32_t g = 0; g < s->ng; g++)
                    r->tables[g].n = 0;
                req_restart(s, r);
            }
            Py_DECREF(rid);
        }
        Py_DECREF(it);
        if (PyErr_Occurred())
            goto done;
    }
    if (select_new(s, so, nsched) < 0 || (s->eager && select_cached(s, so, nsched) < 0)) {
        for (uint32_t i = 0; i < s->n_batch; i++) { /* checked again in the next step */
            s->batch[i]->in_batch = false;
            wheel_put(s, s->batch[i], s->step + 1);
        }
        s->n_batch = 0;
        goto done;
    }
    int rc = run_batch(s);
    s->step++;
    if (rc < 0)
        goto done;
    rc = s->api.kvt_offload_build_meta(s->m, preempted, s->meta);
    if (check(s, rc) < 0)
        goto done;
    if (!preempted && s->api.kvt_offload_meta_empty(s->meta)) {
        out = Py_None;
        Py_INCREF(out);
        goto done;
    }
    size_t cap = s->api.kvt_offload_meta_encoded_size(s->meta), len = 0;
    out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)cap);
    if (out == NULL)
        goto done;
    rc = s->api.kvt_offload_meta_encode(s->meta, PyBytes_AsString(out), cap, &len);
    if (rc < 0 || len != cap) {
        Py_CLEAR(out);
        fail_call(s, rc < 0 ? rc : KVT_EINVAL);
    }
done:
    Py_XDECREF(nsched);
    Py_XDECREF(pre);
    return out;
}

/* apply_output(finished_recving, worker_meta_bytes): update_connector_output. */
static PyObject *sched_apply_output(PyObject *self, PyObject *args)
{
    fs_sched *s = (fs_sched *)self;
    PyObject *fin, *data;
    if (!PyArg_ParseTuple(args, "OO", &fin, &data) || bound(s) < 0)
        return NULL;
    Py_ssize_t n = fin == Py_None ? 0 : PySequence_Size(fin);
    if (n < 0)
        return NULL;
    const kvt_offload_worker_meta *w = NULL;
    if (data != Py_None && PyBytes_Size(data) > 0) {
        int rc = s->api.kvt_offload_worker_meta_decode(s->wmeta, PyBytes_AsString(data),
                                                       (size_t)PyBytes_Size(data));
        if (rc < 0) {
            fail_call_in(s, rc, "worker report: ");
            return NULL;
        }
        w = s->wmeta;
    } else if (PyErr_Occurred()) {
        return NULL;
    }
    if (n == 0 && w == NULL)
        Py_RETURN_NONE;
    kvt_str *names = n ? calloc((size_t)n, sizeof(*names)) : NULL;
    PyObject *keep = n ? PyList_New(0) : NULL;
    PyObject *result = NULL;
    if (n && (names == NULL || keep == NULL)) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        goto out;
    }
    PyObject *it = n ? PyObject_GetIter(fin) : NULL, *rid;
    Py_ssize_t k = 0;
    while (it != NULL && k < n && (rid = PyIter_Next(it)) != NULL) {
        PyObject *b = PyUnicode_AsUTF8String(rid);
        Py_DECREF(rid);
        if (b == NULL || PyList_Append(keep, b) < 0) {
            Py_XDECREF(b);
            break;
        }
        Py_DECREF(b);
        names[k].ptr = PyBytes_AsString(b); /* kept alive by keep */
        names[k++].len = (uint32_t)PyBytes_Size(b);
    }
    Py_XDECREF(it);
    if (PyErr_Occurred())
        goto out;
    if (check(s, s->api.kvt_offload_apply_output(s->m, names, (uint32_t)k, w)) == 0) {
        result = Py_None;
        Py_INCREF(result);
    }
out:
    Py_XDECREF(keep);
    free(names);
    return result;
}

/* finished(request, block_ids): request_finished(_all_groups); forgets the request. */
static PyObject *sched_finished(PyObject *self, PyObject *args)
{
    fs_sched *s = (fs_sched *)self;
    PyObject *request, *ids;
    if (!PyArg_ParseTuple(args, "OO", &request, &ids) || bound(s) < 0)
        return NULL;
    PyObject *rid = PyObject_GetAttr(request, s_.request_id);
    if (rid == NULL)
        return NULL;
    fs_req *r;
    int forgot = req_forget(s, rid, &r); /* r lives until the call returned */
    Py_DECREF(rid);
    if (r == NULL) {
        if (forgot < 0)
            return NULL;
        Py_RETURN_NONE;
    }
    PyObject *result = NULL;
    uint32_t computed, placeholders;
    if (req_sync_hashes(s, r) < 0 || tables_set(s, s->scratch, ids, false) < 0 ||
        req_u32(r, num_computed_tokens, &computed) < 0 ||
        req_u32(r, num_output_placeholders, &placeholders) < 0)
        goto out;
    tables_point(s, s->scratch, s->scratch_ptrs, s->scratch_counts);
    int rc = s->api.kvt_offload_request_finished_hashed(
        s->m, r->item.req_id, r->item.req_id_len, s->scratch_ptrs, s->scratch_counts, r->hashes,
        r->n_hashes, computed >= placeholders ? computed - placeholders : 0);
    if (check(s, rc) == 0) {
        result = Py_None;
        Py_INCREF(result);
    }
out:
    req_free(r);
    return result;
}

/* interval_stats() -> {counter: delta since the last call}, or None when none moved. */
static PyObject *sched_interval_stats(PyObject *self, PyObject *unused)
{
    (void)unused;
    fs_sched *s = (fs_sched *)self;
    if (bound(s) < 0)
        return NULL;
    kvt_offload_stats now;
    (void)s->api.kvt_offload_stats_read(s->m, &now, sizeof(now));
    PyObject *d = NULL;
    for (uint32_t i = 0; i < s->n_stats; i++) {
        uint64_t v, was;
        memcpy(&v, (const char *)&now + s->stats[i].offset, sizeof(v));
        memcpy(&was, (const char *)&s->last + s->stats[i].offset, sizeof(was));
        if (d == NULL && v != was && (d = PyDict_New()) == NULL)
            return NULL;
        if (d == NULL)
            continue;
        PyObject *x = PyLong_FromUnsignedLongLong(v - was);
        if (x == NULL || PyDict_SetItem(d, s->stats[i].name, x) < 0) {
            Py_XDECREF(x);
            Py_DECREF(d);
            return NULL;
        }
        Py_DECREF(x);
    }
    s->last = now;
    if (d == NULL)
        Py_RETURN_NONE;
    return d;
}

/* raise_kept(): raises the exception a pool callback raised during a manager call made
 * outside this module (the package's ctypes calls: reset, release of engine blocks). */
static PyObject *sched_raise_kept(PyObject *self, PyObject *unused)
{
    (void)unused;
    if (check((fs_sched *)self, 0) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *sched_len(PyObject *self, PyObject *unused)
{
    (void)unused;
    return PyLong_FromSsize_t(PyDict_Size(((fs_sched *)self)->reqs));
}

static PyMethodDef sched_methods[] = {
    {"ops", sched_ops, METH_NOARGS, "(touch, free, lru_scan, lookup, ctx) addresses"},
    {"bind", sched_bind, METH_VARARGS, "bind(manager, meta, worker_meta) addresses"},
    {"unbind", sched_unbind, METH_NOARGS, "forget the manager (it is being destroyed)"},
    {"set_gpu", sched_set_gpu, METH_O, "set_gpu(block_pool)"},
    {"match", sched_match, METH_VARARGS, "match(request, num_computed, flags) -> hit tokens"},
    {"after_alloc", sched_after_alloc, METH_VARARGS, "after_alloc(request, ids, external)"},
    {"build_meta", sched_build_meta, METH_O, "build_meta(so) -> bytes or None"},
    {"apply_output", sched_apply_output, METH_VARARGS, "apply_output(fin, data)"},
    {"finished", sched_finished, METH_VARARGS, "finished(request, block_ids)"},
    {"interval_stats", sched_interval_stats, METH_NOARGS, "counter deltas, or None"},
    {"requests", sched_len, METH_NOARGS, "requests with a record"},
    {"raise_kept", sched_raise_kept, METH_NOARGS, "raises a pool callback's kept exception"},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot sched_slots[] = {
    {Py_tp_init, sched_init},
    {Py_tp_dealloc, sched_dealloc},
    {Py_tp_methods, sched_methods},
    {Py_tp_doc, "kvtier's vLLM scheduler side, compiled (see kvtier/vllm/kv/scheduler.py)"},
    {0, NULL},
};

static PyType_Spec sched_spec = {
    "kvtier._sched.Scheduler", sizeof(fs_sched), 0, Py_TPFLAGS_DEFAULT, sched_slots,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "_sched",
    "kvtier's vLLM scheduler side, compiled",
    -1,
    NULL,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__sched(void)
{
#define FS_INTERN(name)                                                                            \
    if (s_.name == NULL && (s_.name = PyUnicode_InternFromString(#name)) == NULL)                  \
        return NULL;
    FS_ATTRS(FS_INTERN)
#undef FS_INTERN
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    PyObject *tp = PyType_FromSpec(&sched_spec);
    PyObject *names = PyTuple_New((Py_ssize_t)N_API);
    for (size_t i = 0; names != NULL && i < N_API; i++)
        PyTuple_SetItem(names, (Py_ssize_t)i, PyUnicode_FromString(api_names[i]));
    if (tp == NULL || names == NULL || PyModule_AddObject(m, "Scheduler", tp) < 0) {
        Py_XDECREF(tp);
        Py_XDECREF(names);
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddObject(m, "API_NAMES", names) < 0) {
        Py_DECREF(names);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
