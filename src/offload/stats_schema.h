/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The offload manager's stats structs, and those of the node and remote tiers it may be lent,
 * one row per field in the header's order (a unit test
 * holds the rows to the struct: every field, in order, nothing else). From these rows come
 * the Prometheus families (metrics.c) and the description the bindings build their mirrors
 * from (kvt_describe, src/abi.c). A new field is a row here, a line in the header and its
 * increment.
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

#define KVI_OFFLOAD_STATS(X)                                                                       \
    X(lookups, COUNTER, "lookups_total", "Host-tier searches by match.")                           \
    X(lookup_tokens, COUNTER, "lookup_tokens_total", "Tokens those searches could have hit.")      \
    X(hit_tokens, COUNTER, "hit_tokens_total", "Tokens hit in the host tier.")                     \
    X(hit_blocks, COUNTER, "hit_blocks_total", "Host blocks pinned by hits.")                      \
    X(miss_tokens, COUNTER, "miss_tokens_total", "Searchable tokens the host tier did not have.")  \
    X(miss_blocks, COUNTER, "miss_blocks_total", "Missed scheduler blocks.")                       \
    X(hits_dropped, COUNTER, "hits_dropped_total", "Hits not offered for lack of room.")           \
    X(untracked_requests, COUNTER, "untracked_requests_total",                                     \
      "Eager requests not registered: request table full.")                                        \
    X(load_events, COUNTER, "load_events_total", "Load events issued.")                            \
    X(load_blocks, COUNTER, "load_blocks_total", "Blocks in issued load events.")                  \
    X(loads_completed, COUNTER, "loads_completed_total", "Blocks whose load completed.")           \
    X(store_events, COUNTER, "store_events_total", "Store events issued.")                         \
    X(store_blocks, COUNTER, "store_blocks_total", "Blocks in issued store events.")               \
    X(stores_completed, COUNTER, "stores_completed_total",                                         \
      "Blocks made findable in the host tier.")                                                    \
    X(stores_abandoned, COUNTER, "stores_abandoned_total",                                         \
      "Blocks whose store completed after a reset.")                                               \
    X(stores_failed, COUNTER, "stores_failed_total",                                               \
      "Blocks of store events a worker could not write (not cached).")                             \
    X(store_skipped_cached, COUNTER, "", "Blocks not stored: already in the host tier.")           \
    X(store_skipped_in_flight, COUNTER, "", "Blocks not stored: already being stored.")            \
    X(store_skipped_unhashed, COUNTER, "", "Blocks not stored: no hash (a masked position).")      \
    X(store_skipped_null, COUNTER, "", "Blocks not stored: the null block.")                       \
    X(store_dropped_full, COUNTER, "", "Store selection stopped: no host block free.")             \
    X(restores, COUNTER, "restores_total", "Blocks re-stored after a host-tier eviction.")         \
    X(restores_dropped_hot, COUNTER, "restores_dropped_hot_total",                                 \
      "Re-stores given up because they would have evicted a block in use on the GPU.")             \
    X(host_evictions, COUNTER, "host_evictions_total",                                             \
      "Cached host blocks reused for new stores.")                                                 \
    X(stale_reports, COUNTER, "stale_reports_total",                                               \
      "Store reports for completed or abandoned events.")                                          \
    X(bytes_loaded, COUNTER, "loaded_bytes_total", "Bytes loaded (blocks x block_bytes).")         \
    X(bytes_stored, COUNTER, "stored_bytes_total", "Bytes stored (blocks x block_bytes).")         \
    X(resets, COUNTER, "resets_total", "Successful resets.")                                       \
    X(host_blocks, GAUGE, "host_blocks", "Usable host-tier blocks.")                               \
    X(host_used_blocks, GAUGE, "host_used_blocks", "Host blocks pinned by hits or transfers.")     \
    X(host_cached_blocks, GAUGE, "host_cached_blocks", "Host blocks that can be hit.")             \
    X(requests, GAUGE, "requests", "Requests tracked.")                                            \
    X(load_events_in_flight, GAUGE, "load_events_in_flight", "Load events not yet completed.")     \
    X(store_events_in_flight, GAUGE, "store_events_in_flight", "Store events not yet completed.")  \
    X(pending_store_blocks, GAUGE, "pending_store_blocks",                                         \
      "Blocks queued or in flight to the host tier.")                                              \
    X(disk_hit_tokens, DISK_COUNTER, "disk_hit_tokens_total",                                      \
      "Tokens of hits served from the disk tier.")                                                 \
    X(disk_hit_blocks, DISK_COUNTER, "disk_hit_blocks_total", "Disk slots pinned by hits.")        \
    X(promotions, DISK_COUNTER, "promotions_total", "Blocks promoted from disk to host.")          \
    X(promotions_failed, DISK_COUNTER, "promotions_failed_total",                                  \
      "Blocks whose promotion failed (reported invalid).")                                         \
    X(disk_load_events, DISK_COUNTER, "disk_load_events_total", "Promotion events issued.")        \
    X(disk_store_events, DISK_COUNTER, "disk_store_events_total", "Write-back events issued.")     \
    X(disk_store_blocks, DISK_COUNTER, "disk_store_blocks_total", "Blocks in write-back events.")  \
    X(disk_stores_completed, DISK_COUNTER, "disk_stores_completed_total",                          \
      "Blocks made findable on disk.")                                                             \
    X(disk_stores_failed, DISK_COUNTER, "disk_stores_failed_total",                                \
      "Write-back blocks a worker could not write.")                                               \
    X(disk_stores_abandoned, DISK_COUNTER, "disk_stores_abandoned_total",                          \
      "Write-backs completed after a reset.")                                                      \
    X(disk_store_skipped_cached, DISK_COUNTER, "disk_store_skipped_cached_total",                  \
      "Blocks not written back: already on disk.")                                                 \
    X(disk_store_dropped, DISK_COUNTER, "disk_store_dropped_total",                                \
      "Blocks not written back: no free slot or event room.")                                      \
    X(disk_evictions, DISK_COUNTER, "disk_evictions_total", "Cached disk slots reused.")           \
    X(disk_blocks, DISK_GAUGE, "disk_blocks", "Usable disk-tier slots (0: two tiers).")            \
    X(disk_used_blocks, DISK_GAUGE, "disk_used_blocks", "Disk slots pinned by hits or transfers.") \
    X(disk_cached_blocks, DISK_GAUGE, "disk_cached_blocks", "Disk slots that can be hit.")         \
    X(disk_load_events_in_flight, DISK_GAUGE, "disk_load_events_in_flight",                        \
      "Promotion events not yet completed.")                                                       \
    X(disk_store_events_in_flight, DISK_GAUGE, "disk_store_events_in_flight",                      \
      "Write-back events not yet completed.")                                                      \
    X(lookups_misaligned, COUNTER, "lookups_misaligned_total",                                     \
      "Matches whose GPU hit ended inside a scheduler block (a miss, no lookup).")                 \
    X(lookups_skipped, COUNTER, "lookups_skipped_total",                                           \
      "Matches of requests that reuse no cached prefix (no lookup).")                              \
    X(store_recovered_null, COUNTER, "store_recovered_null_total",                                 \
      "Nulled table entries found in the GPU pool by their hash and stored.")                      \
    X(boundary_states, COUNTER, "boundary_states_total",                                           \
      "Mamba align: handed-over states selected for a store.")                                     \
    X(boundary_dropped_gone, COUNTER, "boundary_dropped_gone_total",                               \
      "Mamba align: handed-over states dropped because their request was gone.")                   \
    X(partial_hits, COUNTER, "partial_hits_total",                                                 \
      "Host-tier hits that end inside a scheduler block.")                                         \
    X(partial_tails, COUNTER, "partial_tails_total",                                               \
      "Partly filled full-attention blocks stored at request finish (partial hash hits).")         \
    X(remote_hit_blocks, COUNTER, "remote_hit_blocks_total",                                       \
      "Blocks read from the remote tier into hits.")                                               \
    X(hit_requests, COUNTER, "hit_requests_total", "Matches that offered a hit (any tier).")       \
    X(remote_lookups_spared, COUNTER, "remote_lookups_spared_total",                               \
      "Remote-tier lookups not sent: the same span missed less than remote_miss_ms ago.")

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
