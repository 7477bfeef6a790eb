/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvtier: KV-cache offload and encoder-cache transfer for LLM inference engines.
 * Including this header includes every public module.
 */
#ifndef KVTIER_H
#define KVTIER_H

#include "kvtier/base.h"
#include "kvtier/copy.h"
#include "kvtier/layout.h"
#include "kvtier/disk.h"
#include "kvtier/ec.h"
#include "kvtier/ec_net.h"
#include "kvtier/link.h"
#include "kvtier/meta.h"
#include "kvtier/node.h"
#include "kvtier/offload.h"
#include "kvtier/pool.h"
#include "kvtier/remote.h"
#include "kvtier/worker.h"
#include "kvtier/version.h"

#ifdef __cplusplus
extern "C" {
#endif

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

#endif
