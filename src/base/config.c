/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The configuration structs' tables (base/config.h) read: defaults and bounds. A field is read
 * and written through its offset and size, so one loop serves every struct; the tables
 * themselves lie beside their components.
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "base/config.h"
#include "base/error.h"

/* strings, bytes and room are not numbers: no default but zero, no bounds */
static bool is_number(const kvt_config_field *f)
{
    return f->type <= KVT_CONFIG_BOOL;
}

/* a number field's value, a signed one sign-extended */
static uint64_t get(const void *cfg, const kvt_config_field *f)
{
    const char *p = (const char *)cfg + f->offset;
    if (f->size == 1) {
        uint8_t v;
        memcpy(&v, p, 1);
        return v;
    }
    if (f->size == 4) {
        uint32_t v;
        memcpy(&v, p, 4);
        return f->type == KVT_CONFIG_INT ? (uint64_t)(int64_t)(int32_t)v : v;
    }
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static void put(void *cfg, const kvt_config_field *f, uint64_t v)
{
    char *p = (char *)cfg + f->offset;
    if (f->size == 1) {
        bool b = v != 0;
        memcpy(p, &b, 1);
    } else if (f->size == 4) {
        uint32_t w = (uint32_t)v;
        memcpy(p, &w, 4);
    } else {
        memcpy(p, &v, 8);
    }
}

void kvi_config_init(const kvi_config_table *table, void *cfg)
{
    const kvt_config_field *rows = table->rows;
    const uint32_t n = table->n;
    memset(cfg, 0, rows[n - 1].offset + rows[n - 1].size);
    for (uint32_t i = 0; i < n; i++)
        if (is_number(&rows[i]))
            put(cfg, &rows[i], rows[i].def);
}

static int out_of_range(const char *who, const kvt_config_field *f, uint64_t v)
{
    if ((f->flags & KVT_CONFIG_REQUIRED) && v == 0)
        return kvt_fail(KVT_EINVAL, "%s: %s is not set; it has no default (%s)", who, f->name,
                        f->help);
    if (f->type == KVT_CONFIG_INT)
        return kvt_fail(KVT_EINVAL,
                        "%s: %s %" PRId64 " is out of range %" PRId64 "..%" PRId64 " (%s)", who,
                        f->name, (int64_t)v, (int64_t)f->min, (int64_t)f->max, f->help);
    return kvt_fail(KVT_EINVAL, "%s: %s %" PRIu64 " is out of range %" PRIu64 "..%" PRIu64 " (%s)",
                    who, f->name, v, f->min, f->max, f->help);
}

int kvi_config_check(const kvi_config_table *table, const void *cfg)
{
    const kvt_config_field *rows = table->rows;
    for (uint32_t i = 0; i < table->n; i++) {
        const kvt_config_field *f = &rows[i];
        if (f->type == KVT_CONFIG_STRING || f->type == KVT_CONFIG_BYTES)
            continue;
        if (f->type == KVT_CONFIG_ROOM) {
            char what[48];
            snprintf(what, sizeof(what), "%s config", table->module);
            if (kvi_check_reserved((const uint64_t *)(const void *)((const char *)cfg + f->offset),
                                   f->size, what))
                return KVT_EINVAL;
            continue;
        }
        uint64_t v = get(cfg, f);
        bool bad = f->type == KVT_CONFIG_INT
                       ? (int64_t)v < (int64_t)f->min || (int64_t)v > (int64_t)f->max
                       : v < f->min || v > f->max;
        if (bad)
            return out_of_range(table->module, f, v);
    }
    return 0;
}

int kvi_describe_find(const kvi_described *table, size_t count, const char *fn,
                      const char *type_name, const void **rows, uint32_t *n)
{
    if (!type_name || !rows || !n)
        return kvt_fail(KVT_EINVAL, "%s: NULL argument", fn);
    for (size_t i = 0; i < count; i++)
        if (strcmp(table[i].name, type_name) == 0) {
            *rows = table[i].rows;
            *n = table[i].n;
            return 0;
        }
    *rows = NULL;
    *n = 0;
    return kvt_fail(KVT_ENOENT, "%s: this library does not describe \"%s\"", fn, type_name);
}
