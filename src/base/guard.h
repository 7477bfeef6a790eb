/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Mappings of shared objects that another process may shrink under us (the node tier's
 * metadata and data objects: any replica of the same user, or a member of the sharing group,
 * can ftruncate them). Touching a page past an object's new end raises SIGBUS, which would
 * kill the process (every replica at once). Inside a guarded mapping, the handler instead maps
 * private zero pages over the whole mapping (MAP_FIXED) and marks it poisoned: the access that
 * faulted goes on, reading zeros, and every later one too. Whoever owns the mapping asks
 * kvi_guard_poisoned after each use of it and treats what it read as lost (misses, failed
 * loads). A SIGBUS anywhere else goes to the handler that was installed before the first
 * guard (UCX's, Python's), or takes the default action.
 */
#ifndef KVT_BASE_GUARD_H
#define KVT_BASE_GUARD_H

#include <stdbool.h>
#include <stddef.h>

#define KVI_GUARDS 64 /* mappings guarded at once, per process */

/* Guards [base, base + len) (page aligned, a mapping of its own); *id names it. KVT_ELIMIT
 * when KVI_GUARDS are in use, KVT_ESYS when the handler cannot be installed. */
int kvi_guard_add(void *base, size_t len, int *id);
/* Stops guarding mapping id (before it is unmapped); -1 is ignored. */
void kvi_guard_remove(int id);
/* Whether mapping id was shrunk under us (its pages are zeros now); false for -1. */
bool kvi_guard_poisoned(int id);
/* Times any guarded mapping was found shrunk in this process. */
unsigned long kvi_guard_trips(void);

/* The guard of an arena over a shared object (kvt_arena_config.shm_name), else -1. */
struct kvt_arena;
int kvi_arena_guard(const struct kvt_arena *a);

#endif
