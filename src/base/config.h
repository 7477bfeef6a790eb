/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The one interpreter of the public configuration structs' rows. Each component keeps the rows
 * of its struct beside it (offload/offload_config.h, copy/copy_config.h, disk/disk_config.h,
 * node/node_config.h), one per field in the header's order:
 *
 *   X(field, type, default, min, max, help)
 *
 * type: UINT, INT (signed), BOOL, STRING (a borrowed const char *; default NULL, no bounds),
 * BYTES (an array of bytes; zero, no bounds), ROOM (reserved words, zero), REQUIRED (an unsigned
 * field without a usable default: the caller sets it; default 0, which the bounds refuse). Bounds
 * are inclusive. A check that no row can say (a power of two, one field against another) stays in
 * the create function.
 *
 * A component turns its rows into a table (KVI_CONFIG_TABLE); from the table come what its
 * *_config_init sets (kvi_config_init), the bounds its *_create checks before anything else
 * (kvi_config_check), the description bindings read (kvt_describe_config, src/abi.c: the vLLM
 * connector's defaults and bounds for the keys that set these fields) and the tables of
 * docs/configuration.md (scripts/gen-config-doc, which reads the rows headers).
 * test_describe holds the rows to the struct: every field, in order, nothing else.
 */
#ifndef KVT_BASE_CONFIG_H
#define KVT_BASE_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "base/export.h"
#include "kvtier/base.h" /* kvt_config_field, KVT_CONFIG_* */

/* A configuration struct's rows: the struct's name, the module its messages name. */
typedef struct kvi_config_table {
    const char *name;
    const char *module;
    const kvt_config_field *rows;
    uint32_t n;
} kvi_config_table;

#define KVI_CFG_TYPE_UINT      KVT_CONFIG_UINT
#define KVI_CFG_TYPE_INT       KVT_CONFIG_INT
#define KVI_CFG_TYPE_BOOL      KVT_CONFIG_BOOL
#define KVI_CFG_TYPE_STRING    KVT_CONFIG_STRING
#define KVI_CFG_TYPE_ROOM      KVT_CONFIG_ROOM
#define KVI_CFG_TYPE_BYTES     KVT_CONFIG_BYTES
#define KVI_CFG_TYPE_REQUIRED  KVT_CONFIG_UINT
#define KVI_CFG_FLAGS_UINT     0u
#define KVI_CFG_FLAGS_INT      0u
#define KVI_CFG_FLAGS_BOOL     0u
#define KVI_CFG_FLAGS_STRING   0u
#define KVI_CFG_FLAGS_ROOM     0u
#define KVI_CFG_FLAGS_BYTES    0u
#define KVI_CFG_FLAGS_REQUIRED KVT_CONFIG_REQUIRED

#define KVI_U32_MAX UINT32_MAX
#define KVI_U64_MAX UINT64_MAX

/* One row of struct T as a kvt_config_field (each rows header binds its T: KVI_DISK_CONFIG_ROW
 * is KVI_CONFIG_ROW(kvt_disk_config, ...)). */
#define KVI_CONFIG_ROW(T, f, type, def, min, max, help)                                            \
    {#f,                                                                                           \
     help,                                                                                         \
     (uint32_t)offsetof(T, f),                                                                     \
     (uint32_t)sizeof(((T *)0)->f),                                                                \
     KVI_CFG_TYPE_##type,                                                                          \
     KVI_CFG_FLAGS_##type,                                                                         \
     (uint64_t)(def),                                                                              \
     (uint64_t)(min),                                                                              \
     (uint64_t)(max)},

/* The initializer of a kvi_config_table for struct T whose messages name module, from its rows
 * expanded by the caller (ROWS(ROW)). */
#define KVI_CONFIG_TABLE(T, module, ...)                                                           \
    {                                                                                              \
#T, module,                                                                                \
            (const kvt_config_field[]){                                                            \
                __VA_ARGS__ }, (uint32_t)(sizeof((const kvt_config_field[]){__VA_ARGS__}) /        \
                                          sizeof(kvt_config_field))                                \
    }

/* A struct the library describes: its name and its rows (kvt_field or kvt_config_field). */
typedef struct kvi_described {
    const char *name;
    const void *rows;
    uint32_t n;
} kvi_described;

/* The lookup behind kvt_describe and kvt_describe_config (fn names the call in messages):
 * *rows and *n of the entry of table named type_name; KVT_ENOENT (NULL, 0) for none. */
int kvi_describe_find(const kvi_described *table, size_t count, const char *fn,
                      const char *type_name, const void **rows, uint32_t *n);

/* Defines the public describer `name` (kvt_describe, kvt_describe_config) over `table`: fn
 * names it in messages. */
#define KVI_DESCRIBER(name, row_type, table, fn)                                                   \
    int name(const char *type_name, const row_type **fields, uint32_t *n)                          \
    {                                                                                              \
        const void *rows = NULL;                                                                   \
        int rc = kvi_describe_find(table, sizeof(table) / sizeof(table[0]), fn, type_name,         \
                                   fields ? &rows : NULL, n);                                      \
        if (fields)                                                                                \
            *fields = rows;                                                                        \
        return rc;                                                                                 \
    }

/* Zeroes *cfg and sets each row's default. */
KVI_EXPORT void kvi_config_init(const kvi_config_table *table, void *cfg);
/* KVT_EINVAL naming the field, its value, its bounds and what it sets when a row is out of
 * bounds (or reserved room is not zero); 0 when every row holds. */
KVI_EXPORT int kvi_config_check(const kvi_config_table *table, const void *cfg);

#endif
