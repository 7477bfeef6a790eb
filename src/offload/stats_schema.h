/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The stats structs of the tiers (kvt_tier_stats) and of the node and remote tiers the
 * offload manager may be lent, one row per field in the header's order (a unit test holds the
 * rows to the struct: every field, in order, nothing else); kvt_offload_stats's own rows are
 * public (KVT_OFFLOAD_STATS_ROWS in kvtier/offload.h, which makes the struct from them). From
 * these rows come the Prometheus families (metrics.c) and the description the bindings build
 * their mirrors from (kvt_describe, src/abi.c). A new field of these structs is a row here, a
 * line in the header and its increment.
 *
 *   X(field, kind, family, help)
 *
 * kind: COUNTER or GAUGE, always exposed; DISK_COUNTER or DISK_GAUGE, exposed only with a
 * disk tier; STRING (a name); ROOM (reserved words). family: the Prometheus family after
 * "kvtier_offload_", or "" where the field is exposed in another form (the labelled
 * store_skipped_blocks_total, the tier families) or not at all.
 */
#ifndef KVT_OFFLOAD_STATS_SCHEMA_H
#define KVT_OFFLOAD_STATS_SCHEMA_H

#include "kvtier/kvtier.h" /* KVT_FIELD_* */

/* What a row's kind means, for every expansion of the tables: KVI_STAT_KIND_<kind> its
 * kvt_field kind, KVI_STAT_DISK_<kind> whether it is exposed only with a disk tier. */
#define KVI_STAT_KIND_COUNTER      KVT_FIELD_COUNTER
#define KVI_STAT_KIND_GAUGE        KVT_FIELD_GAUGE
#define KVI_STAT_KIND_DISK_COUNTER KVT_FIELD_COUNTER
#define KVI_STAT_KIND_DISK_GAUGE   KVT_FIELD_GAUGE
#define KVI_STAT_KIND_STRING       KVT_FIELD_STRING
#define KVI_STAT_KIND_ROOM         KVT_FIELD_ROOM
#define KVI_STAT_DISK_COUNTER      0
#define KVI_STAT_DISK_GAUGE        0
#define KVI_STAT_DISK_DISK_COUNTER 1
#define KVI_STAT_DISK_DISK_GAUGE   1
#define KVI_STAT_DISK_STRING       0
#define KVI_STAT_DISK_ROOM         0

/* kvt_offload_stats: its rows are public, KVT_OFFLOAD_STATS_ROWS in kvtier/offload.h (with
 * each field's type first) */

/* kvt_tier_stats: its families are "tier_" + family, one sample per tier labelled tier="name" */
#define KVI_TIER_STATS(X)                                                                          \
    X(name, STRING, "", "The tier's name: host, disk, remote, or a name of add_tier.")             \
    X(hit_blocks, COUNTER, "hit_blocks_total", "Blocks pinned by hits per tier.")                  \
    X(hit_tokens, COUNTER, "hit_tokens_total", "Tokens of hits served by the tier.")               \
    X(load_events, COUNTER, "load_events_total", "Load events out of the tier issued.")            \
    X(store_events, COUNTER, "store_events_total", "Store events into the tier issued.")           \
    X(store_blocks, COUNTER, "store_blocks_total", "Blocks in those store events.")                \
    X(stores_completed, COUNTER, "stores_completed_total", "Blocks made findable in the tier.")    \
    X(stores_failed, COUNTER, "stores_failed_total",                                               \
      "Blocks of store events a worker could not write.")                                          \
    X(stores_abandoned, COUNTER, "stores_abandoned_total",                                         \
      "Blocks whose store completed after a reset.")                                               \
    X(store_skipped_cached, COUNTER, "store_skipped_cached_total",                                 \
      "Blocks not stored: already in the tier.")                                                   \
    X(store_dropped, COUNTER, "store_dropped_total",                                               \
      "Blocks not stored: no free block or event room.")                                           \
    X(evictions, COUNTER, "evictions_total", "Cached blocks reused for new ones per tier.")        \
    X(blocks, GAUGE, "blocks", "Usable blocks per tier.")                                          \
    X(used_blocks, GAUGE, "used_blocks", "Blocks pinned by hits or transfers per tier.")           \
    X(cached_blocks, GAUGE, "cached_blocks", "Blocks that can be hit per tier.")                   \
    X(load_events_in_flight, GAUGE, "load_events_in_flight",                                       \
      "Load events out of the tier not yet completed.")                                            \
    X(store_events_in_flight, GAUGE, "store_events_in_flight",                                     \
      "Store events into the tier not yet completed.")                                             \
    X(loads_failed, COUNTER, "loads_failed_total",                                                 \
      "Blocks a worker could not read out of the tier (their keys dropped).")                      \
    X(lookups_dropped, COUNTER, "lookups_dropped_total",                                           \
      "Remote lookups not offered: the hit before them changed while a node tier's lock was "      \
      "let go.")                                                                                   \
    X(reserved, ROOM, "", "Room for figures to come (zero).")

/* kvt_node_stats (a replica's view of its node tier): families "kvtier_node_" + family */
#define KVI_NODE_STATS(X)                                                                          \
    X(ranks_attached, GAUGE, "ranks_attached", "Replicas attached to the node tier now.")          \
    X(published, GAUGE, "published_slots", "This replica's slots that carry keys.")                \
    X(peer_pinned, GAUGE, "peer_pinned_slots", "This replica's slots that peers pin now.")         \
    X(pinned_of_peers, GAUGE, "pinned_peer_slots", "Peers' slots this replica pins now.")          \
    X(epoch, GAUGE, "epoch", "This attachment's number (attaches of the tier so far).")            \
    X(full_rescans, COUNTER, "full_rescans_total", "Times this replica re-read every slot.")       \
    X(reaped, COUNTER, "reaped_total", "Dead peers this replica reaped.")                          \
    X(lock_recoveries, COUNTER, "lock_recoveries_total",                                           \
      "Times this replica found the lock's holder dead.")                                          \
    X(reserved, ROOM, "", "Room for figures to come (zero).")

/* kvt_remote_stats (this instance of the remote tier): families "kvtier_remote_" + family */
#define KVI_REMOTE_STATS(X)                                                                        \
    X(epoch, GAUGE, "epoch", "This instance's epoch in the directory (0: not registered).")        \
    X(registrations, COUNTER, "registrations_total",                                               \
      "Times it registered and published again what it holds.")                                    \
    X(published, COUNTER, "published_total", "Directory entries written.")                         \
    X(withdrawn, COUNTER, "withdrawn_total", "Directory entries removed.")                         \
    X(publish_dropped, COUNTER, "publish_dropped_total",                                           \
      "Publications lost to an unreachable directory.")                                            \
    X(lookups, COUNTER, "lookups_total", "Directory lookups.")                                     \
    X(lookup_blocks, COUNTER, "lookup_blocks_total", "Blocks asked of the directory.")             \
    X(hit_blocks, COUNTER, "hit_blocks_total", "Blocks the directory named an owner for.")         \
    X(directory_errors, COUNTER, "directory_errors_total",                                         \
      "Directory round trips that failed or timed out.")                                           \
    X(reads, COUNTER, "reads_total", "Reads asked of peers.")                                      \
    X(read_blocks, COUNTER, "read_blocks_total", "Blocks asked of peers.")                         \
    X(read_ok, COUNTER, "read_ok_total", "Blocks read and checked.")                               \
    X(read_stale, COUNTER, "read_stale_total", "Blocks the owner no longer held as published.")    \
    X(read_failed, COUNTER, "read_failed_total", "Blocks whose read failed.")                      \
    X(read_bytes, COUNTER, "read_bytes_total", "Bytes read from peers.")                           \
    X(served_blocks, COUNTER, "served_blocks_total", "Blocks this instance served as owner.")      \
    X(served_stale, COUNTER, "served_stale_total", "Requests for blocks it no longer held.")       \
    X(served_bytes, COUNTER, "served_bytes_total", "Bytes this instance served as owner.")         \
    X(refused_requests, COUNTER, "refused_requests_total",                                         \
      "Requests refused: authentication, epoch or malformed.")                                     \
    X(handshakes, COUNTER, "handshakes_total", "Sessions established, as reader and as owner.")    \
    X(auth_failures, COUNTER, "auth_failures_total",                                               \
      "Proofs, MACs or block tags that did not check.")                                            \
    X(reserved, ROOM, "", "Room for figures to come (zero).")

#endif
