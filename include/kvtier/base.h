/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvtier base layer: errors, logging, clocks, hashing and host arenas.
 *
 * Error model (used by every kvtier call): functions return int, 0 on success and a negative
 * KVT_E* code on failure. kvt_strerror() names the code; kvt_last_error() returns a
 * thread-local message that explains the specific failure ("pool: free: block 17 has no
 * references"). The message is only meaningful right after a call failed on the same thread.
 *
 * Thread rules: everything here may be called from any thread. Logging and error messages
 * are thread-safe; a kvt_arena must not be used by two threads at once.
 */
#ifndef KVTIER_BASE_H
#define KVTIER_BASE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define KVT_API __attribute__((visibility("default")))
#else
#define KVT_API
#endif

/* ---- errors ---------------------------------------------------------------------------- */

/* Error codes: X(name, value, text) per code, written once - the enum below and
 * kvt_err_name / kvt_strerror are made from it (as libuv's UV_ERRNO_MAP). Values are part of
 * the ABI and never change. */
#define KVT_ERRNO_MAP(X)                                                                           \
    X(OK, 0, "success")                                                                            \
    X(EINVAL, -1, "invalid argument")                                                              \
    X(ENOMEM, -2, "out of memory")                                                                 \
    X(ENOSPC, -3, "not enough free blocks or capacity")                                            \
    X(ENOENT, -4, "no such item")                                                                  \
    X(EEXIST, -5, "item already exists")                                                           \
    X(ESTATE, -6, "not valid in the object's current state")                                       \
    X(EBUSY, -7, "resource in use, retry later")                                                   \
    X(ERANGE, -8, "id or value out of range")                                                      \
    X(EPROTO, -9, "malformed message")                                                             \
    X(EVERSION, -10, "unsupported message version")                                                \
    X(ELIMIT, -11, "a configured or protocol limit was exceeded")                                  \
    X(EIO, -12, "I/O error")                                                                       \
    X(ESYS, -13, "system call failed (the message carries errno's text)")                          \
    X(EUNSUPPORTED, -14, "not supported by this build or platform")

enum kvt_err {
#define KVT_ERR_ENUM_(name, value, text) KVT_##name = value,
    KVT_ERRNO_MAP(KVT_ERR_ENUM_)
#undef KVT_ERR_ENUM_
};

/* Short description of an error code ("invalid argument"); never NULL. */
KVT_API const char *kvt_strerror(int err);
/* Symbolic name of an error code ("KVT_EINVAL"); never NULL. */
KVT_API const char *kvt_err_name(int err);
/* Detail message of the last failure on this thread; "" when none. The pointer stays valid
 * until the next kvtier call on this thread. */
KVT_API const char *kvt_last_error(void);
/* Sets this thread's detail message (printf-style) and returns err, so a callback an engine
 * gives kvtier (consumer ops, cache ops, pool callbacks) can fail with a message the caller
 * will see: `return kvt_fail(KVT_ENOSPC, "cache full: %u items", n);`. */
KVT_API int kvt_fail(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- logging --------------------------------------------------------------------------- */

enum kvt_log_level {
    KVT_LOG_OFF = 0,
    KVT_LOG_ERROR = 1,
    KVT_LOG_WARN = 2,
    KVT_LOG_INFO = 3,
    KVT_LOG_DEBUG = 4,
    KVT_LOG_TRACE = 5
};

/* Receives one formatted line (no trailing newline). Called on the logging thread. */
typedef void (*kvt_log_fn)(void *ctx, int level, const char *line);

/* The initial level comes from the environment variable KVTIER_LOG (off, error, warn, info,
 * debug, trace; default warn). */
KVT_API void kvt_log_set_level(int level);
KVT_API int kvt_log_get_level(void);
/* Route log lines to fn (NULL restores stderr). Not synchronised with concurrent logging:
 * set it once at start-up. */
KVT_API void kvt_log_set_handler(kvt_log_fn fn, void *ctx);

/* ---- clocks ---------------------------------------------------------------------------- */

/* An injectable monotonic clock. Components that keep deadlines take a kvt_clock so tests
 * can drive time by hand. now_ns must never go backwards. */
typedef struct kvt_clock {
    uint64_t (*now_ns)(void *ctx);
    void *ctx;
} kvt_clock;

/* CLOCK_MONOTONIC in nanoseconds. */
KVT_API uint64_t kvt_monotonic_ns(void);
/* The system monotonic clock as a kvt_clock. */
KVT_API kvt_clock kvt_clock_monotonic(void);
/* Reads a clock; NULL means the system monotonic clock. */
KVT_API uint64_t kvt_clock_now(const kvt_clock *clock);

/* A clock that moves only when told to (tests). Not thread-safe against concurrent advance. */
typedef struct kvt_manual_clock {
    uint64_t now_ns;
} kvt_manual_clock;

KVT_API kvt_clock kvt_clock_manual(kvt_manual_clock *mc, uint64_t start_ns);
KVT_API void kvt_clock_manual_advance(kvt_manual_clock *mc, uint64_t delta_ns);

/* ---- hashing (xxHash) ------------------------------------------------------------------ */

/* XXH3 64-bit hash of len bytes. */
KVT_API uint64_t kvt_hash64(const void *data, size_t len, uint64_t seed);
/* XXH3 128-bit hash written as 16 bytes, canonical (big-endian) order, so the bytes are the
 * same on every host. */
KVT_API void kvt_hash128(const void *data, size_t len, uint64_t seed, uint8_t out[16]);

/* ---- byte storage that never moves ------------------------------------------------------ */

/* Chunked bump storage: what is allocated from it keeps its address until kvt_bump_clear or
 * kvt_bump_release. Clear keeps the chunks for reuse, so storage reused every step stops
 * allocating once it has seen its largest step. A zeroed kvt_bump is empty and valid.
 * Message objects (meta.h) keep their strings in one. */
struct kvt_bump_chunk;
typedef struct kvt_bump {
    struct kvt_bump_chunk *head, *cur;
} kvt_bump;

KVT_API void kvt_bump_clear(kvt_bump *b);
KVT_API void kvt_bump_release(kvt_bump *b);

/* ---- host arenas ----------------------------------------------------------------------- */

enum kvt_arena_flags {
    KVT_ARENA_HUGE_2M = 1u << 0,      /* back with 2 MiB HugeTLB pages (fails if too few) */
    KVT_ARENA_HUGE_1G = 1u << 1,      /* back with 1 GiB HugeTLB pages (fails if too few) */
    KVT_ARENA_POPULATE = 1u << 2,     /* fault every page in at creation (default on) */
    KVT_ARENA_DONTFORK = 1u << 3,     /* MADV_DONTFORK: children never see it (default on) */
    KVT_ARENA_THP = 1u << 4,          /* MADV_HUGEPAGE on normal pages (default on) */
    KVT_ARENA_HUGE_FALLBACK = 1u << 5 /* if HugeTLB pages are short, use normal pages */
};

typedef struct kvt_arena_config {
    size_t size;           /* bytes; rounded up to the page size in use, never to a power of two */
    unsigned flags;        /* kvt_arena_flags; default POPULATE | DONTFORK | THP */
    const char *shm_name;  /* NULL: anonymous memory (default). Else a POSIX shared memory object
                              ("/name"), mapped shared: created at the rounded size if absent,
                              attached if present (its size must be that size). Normal pages
                              only (THP allowed); the object stays until shm_unlink. Created
                              O_EXCL mode 0600; an existing one is attached only if this user
                              owns it and its mode lets nobody else in (KVT_EEXIST / KVT_ESTATE
                              naming its owner otherwise) */
    const char *shm_group; /* with shm_name: NULL (this user only) or the group that shares it
                              (mode 0660; an existing object must have that group and give
                              nobody outside it access) */
    int32_t numa_node;     /* -1 (config_init): no preference, the kernel's default policy.
                              Else the NUMA node whose memory holds every page (mbind
                              MPOL_BIND before the pages are populated; pages of an existing
                              shared object are moved where the kernel can). KVT_EINVAL for a
                              node this machine does not have */
    /* room for fields to come, so the struct keeps its size: zero (as *_config_init
     * leaves it); a create refuses a config whose room is not zero */
    uint64_t reserved[5];
} kvt_arena_config;

typedef struct kvt_arena kvt_arena;

KVT_API void kvt_arena_config_init(kvt_arena_config *cfg);
/* Maps and (by default) populates an anonymous region. Fails closed: if huge pages or memory
 * are short, the call fails with KVT_ENOMEM and a message naming what to change, instead of
 * the process taking SIGBUS on first touch later. */
KVT_API int kvt_arena_create(const kvt_arena_config *cfg, kvt_arena **out);
/* Unmaps the region. The caller guarantees no transfer still reads or writes it. */
KVT_API void kvt_arena_destroy(kvt_arena *arena);
KVT_API void *kvt_arena_base(const kvt_arena *arena);
/* Bytes mapped (the rounded size). */
KVT_API size_t kvt_arena_size(const kvt_arena *arena);
/* Page size backing the arena: 4 KiB, 2 MiB or 1 GiB. */
KVT_API size_t kvt_arena_page_size(const kvt_arena *arena);
/* Bump-allocates size bytes aligned to align (a power of two) from the arena; never freed
 * individually. *out is set to NULL and KVT_ENOSPC returned when the arena is exhausted. */
KVT_API int kvt_arena_alloc(kvt_arena *arena, size_t size, size_t align, void **out);

/* ---- metrics of several objects in one exposition ---------------------------------------- */

/* One object's Prometheus text (what a kvt_*_prometheus function wrote) and the labels that
 * tell it apart from the other objects of the process: `rank="0"`, `shard="1",dp="0"`, or
 * NULL / "" for none. Values must not hold '"', '\\' or a newline. */
typedef struct kvt_metrics_source {
    const char *text;
    size_t len;
    const char *labels;
} kvt_metrics_source;

/* Merges several expositions into one valid one: each family's HELP and TYPE once, then every
 * source's samples of it with that source's labels added (histogram buckets keep their le).
 * Fails with KVT_EINVAL when one family has two types, or two sources would write the same
 * series (give them distinct labels); KVT_ENOSPC, with *len the bytes needed, when buf is
 * too small (cap 0 asks for the size). */
KVT_API int kvt_metrics_merge(const kvt_metrics_source *src, size_t n, char *buf, size_t cap,
                              size_t *len);

/* ---- CUDA driver ------------------------------------------------------------------------ */

/* CUDA helpers for engines and tests (KVT_EUNSUPPORTED without a driver). The engine's
 * compute stream and events are plain CUstream / CUevent handles. */
KVT_API bool kvt_cuda_available(void);
/* Why kvt_cuda_available() is false ("libcuda.so.1: cannot open shared object file"). */
KVT_API const char *kvt_cuda_unavailable_reason(void);
/* The driver's version (cuDriverGetVersion: 13000 for CUDA 13.0), 0 without a driver. */
KVT_API int kvt_cuda_driver_version(void);
/* Device memory through the driver kvtier loaded, for programs with no CUDA runtime of their
 * own (tests, benchmarks, the CLI). Each call makes the device's primary context current in
 * the calling thread. */
KVT_API int kvt_cuda_mem_alloc(int device, uint64_t bytes, uint64_t *dptr);
KVT_API void kvt_cuda_mem_free(int device, uint64_t dptr);
KVT_API int kvt_cuda_mem_fill(int device, uint64_t dptr, uint8_t byte, uint64_t bytes);
/* The driver's own rate for one contiguous copy of bytes between host (pinned, e.g. a mirror
 * region) and dptr: cuMemcpyAsync on lowest-priority streams, after one warm-up round the
 * best of reps rounds, in GB/s: gbps[0] device to host, gbps[1] host to device, gbps[2] both
 * at once (host+bytes and dptr+bytes are the second copy's ends, so both spans are 2 x
 * bytes). The baseline `kvtier bench copy` compares the CUDA backend with. */
KVT_API int kvt_cuda_memcpy_rate(int device, uint64_t host, uint64_t dptr, uint64_t bytes,
                                 uint32_t reps, double gbps[3]);

/* ---- descriptions of the public structs -------------------------------------------------- */

/* sizeof a public struct by its name ("kvt_offload_meta"), 0 if unknown: lets bindings that
 * declare the structs themselves check them against this build. */
KVT_API size_t kvt_sizeof(const char *type_name);

/* One field of a public struct as this library lays it out (kvt_describe). */
typedef struct kvt_field {
    const char *name;   /* the field's name in the header */
    const char *help;   /* one line: what it counts or holds */
    const char *metric; /* its Prometheus family ("kvtier_offload_lookups_total"; a tier
                           struct's: one sample per tier, labelled tier="..."), "" if the
                           field has none of its own */
    uint32_t offset;    /* bytes from the struct's start */
    uint32_t size;      /* bytes of one element: 4 or 8 for a number, a pointer's for a name */
    uint32_t count;     /* elements (1; reserved room: its words) */
    uint32_t kind;      /* KVT_FIELD_* */
} kvt_field;

#define KVT_FIELD_COUNTER 0u /* an unsigned integer that only grows */
#define KVT_FIELD_GAUGE   1u /* an unsigned integer that goes up and down */
#define KVT_FIELD_STRING  2u /* a NUL-terminated name the library owns (const char *) */
#define KVT_FIELD_ROOM    3u /* reserved words, zero */

/* The fields of public struct `type_name` in the header's order (ascending offsets), as this
 * library lays it out: *fields receives a table the library owns, *n its rows. Bindings build
 * their mirrors of the stats structs from it instead of declaring them by hand (a field added
 * to the library then reaches them without a change). KVT_ENOENT for a struct this library
 * does not describe; it describes kvt_offload_stats and kvt_tier_stats. */
KVT_API int kvt_describe(const char *type_name, const kvt_field **fields, uint32_t *n);

/* One field of a public configuration struct as this library lays it out and checks it
 * (kvt_describe_config): its default is what the struct's *_config_init sets, its bounds
 * what the *_create call refuses outside of (KVT_EINVAL naming the field). */
typedef struct kvt_config_field {
    const char *name; /* the field's name in the header */
    const char *help; /* what it sets, with its special values */
    uint32_t offset;  /* bytes from the struct's start */
    uint32_t size;    /* bytes: 1 (bool), 4 or 8 (a number), a pointer's (a string); reserved
                         room: all its bytes */
    uint32_t type;    /* KVT_CONFIG_* */
    uint32_t flags;   /* KVT_CONFIG_REQUIRED: no usable default, the caller sets it */
    uint64_t def;     /* the default; a signed field's in two's complement */
    uint64_t min;     /* the bounds, inclusive, as def (a string and room have none) */
    uint64_t max;
} kvt_config_field;

#define KVT_CONFIG_UINT     0u /* an unsigned integer */
#define KVT_CONFIG_INT      1u /* a signed integer */
#define KVT_CONFIG_BOOL     2u /* a bool (size 1) */
#define KVT_CONFIG_STRING   3u /* a borrowed const char *; default NULL */
#define KVT_CONFIG_ROOM     4u /* reserved words: leave them zero */
#define KVT_CONFIG_BYTES    5u /* an array of `size` bytes; default zero, no bounds */
#define KVT_CONFIG_REQUIRED 1u /* flags: the default refuses to create; set the field */

/* The fields of configuration struct `type_name` in the header's order, with their defaults
 * and bounds: *fields receives a table the library owns, *n its rows. The vLLM connector takes
 * the defaults and bounds of its keys that set these fields from it. KVT_ENOENT for a struct
 * this library does not describe; it describes kvt_offload_config, kvt_copy_config,
 * kvt_disk_config and kvt_node_config. */
KVT_API int kvt_describe_config(const char *type_name, const kvt_config_field **fields,
                                uint32_t *n);

#ifdef __cplusplus
}
#endif

#endif /* KVTIER_BASE_H */
