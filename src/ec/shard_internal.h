/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What the consumer shard offers its network layer (server.c) beyond the public API.
 */
#ifndef KVT_EC_SHARD_INTERNAL_H
#define KVT_EC_SHARD_INTERNAL_H

#include "base/export.h"

#include "kvtier/ec.h"

/* reserve(T, ...) on behalf of a network client that holds `owner` (32 hex digits, a secret of
 * its own). A new record remembers it; an existing record answers (its reservation id with
 * it) only the same owner, anyone else gets KVT_EEXIST and learns nothing. owner NULL: an
 * in-process caller, trusted like kvt_ec_shard_reserve. */
KVI_EXPORT int kvi_ec_shard_reserve_as(kvt_ec_shard *sh, const char *transfer_id, uint32_t len,
                                       const kvt_ec_item *item, const char *owner,
                                       kvt_ec_reply *out);

#endif
