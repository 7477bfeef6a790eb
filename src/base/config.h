/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Defaults and bounds of the public configuration structs, applied from their rows
 * (config_schema.h): *_config_init sets the defaults, *_create checks every row before
 * anything else, and kvt_describe_config hands the same rows to bindings.
 */
#ifndef KVT_BASE_CONFIG_H
#define KVT_BASE_CONFIG_H

#include "base/export.h"

typedef enum kvi_config_id {
    KVI_CONFIG_OFFLOAD, /* kvt_offload_config */
    KVI_CONFIG_COPY,    /* kvt_copy_config */
    KVI_CONFIG_DISK,    /* kvt_disk_config */
    KVI_CONFIG_NODE,    /* kvt_node_config */
} kvi_config_id;

/* Zeroes *cfg and sets each row's default. */
KVI_EXPORT void kvi_config_init(kvi_config_id id, void *cfg);
/* KVT_EINVAL naming the field, its value, its bounds and what it sets when a row is out of
 * bounds (or reserved room is not zero); 0 when every row holds. */
KVI_EXPORT int kvi_config_check(kvi_config_id id, const void *cfg);

#endif
