/* SPDX-License-Identifier: Apache-2.0 */
/*
 * POSIX shared-memory objects that only their rightful sharers can touch (the node tier's
 * metadata and data, src/node and the arena's shm_name).
 *
 * The name space /dev/shm is shared by every user of the host, so a name this process wants
 * may already be held by someone else: another user who pre-created it with a mode of their
 * choosing, to read the blocks, write them, or keep us from starting. An object is therefore
 * either created here (O_CREAT | O_EXCL, mode 0600, or 0660 and the sharing group) or opened
 * only if fstat says it is a regular object owned by this user (or, with a sharing group, of
 * that group) and its mode grants nobody outside write, nor anyone outside the group
 * anything. Anything else is refused with a message naming the holder; nothing is mapped.
 */
#ifndef KVT_BASE_SHM_H
#define KVT_BASE_SHM_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* Who may share an object: this user only (has_group false), or the members of group gid. */
typedef struct kvi_shm_share {
    bool has_group;
    gid_t gid;
} kvi_shm_share;

/* Resolves a group name (NULL: this user only) into *out; KVT_EINVAL naming it if unknown. */
int kvi_shm_share_of(const char *group, kvi_shm_share *out);

/* Creates object `name` ("/..."), or opens the existing one if it passes kvi_shm_check.
 * *fd is the descriptor (O_RDWR, close-on-exec); *created says which. KVT_EEXIST when the name
 * is held by another user, KVT_ESTATE when its mode lets others in, KVT_ESYS otherwise; `who`
 * prefixes every message ("node t1"). */
int kvi_shm_open(const char *name, const kvi_shm_share *share, const char *who, int *fd,
                 bool *created);

/* Whether open object fd (named `name`) may be shared under `share`: 0, or the refusal. */
int kvi_shm_check(int fd, const char *name, const kvi_shm_share *share, const char *who);

#endif
