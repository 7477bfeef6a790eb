/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Defaults and bounds of the public configuration structs, applied from their rows
 * (config_schema.h): *_config_init sets the defaults, *_create checks every row before
 * anything else, and kvt_describe_config hands the same rows to bindings.
 */
#ifndef KVT_BASE_CONFIG_H
#define KVT_BASE_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "base/export.h"

typedef enum kvi_config_id {
    KVI_CONFIG_OFFLOAD, /* kvt_offload_config */
    KVI_CONFIG_COPY,    /* kvt_copy_config */
    KVI_CONFIG_DISK,    /* kvt_disk_config */
    KVI_CONFIG_NODE,    /* kvt_node_config */
} kvi_config_id;

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
KVI_EXPORT void kvi_config_init(kvi_config_id id, void *cfg);
/* KVT_EINVAL naming the field, its value, its bounds and what it sets when a row is out of
 * bounds (or reserved room is not zero); 0 when every row holds. */
KVI_EXPORT int kvi_config_check(kvi_config_id id, const void *cfg);

#endif
