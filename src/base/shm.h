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

/* Names another user cannot take first (issue 57: an empty object of another user under a
 * predictable name stopped a replica from attaching, and it could not remove it). Shared
 * objects are named "<name>.<32 random hex digits>" (the stem), and the stem is kept in a
 * rendezvous file, <dir>/<name>.rendezvous, in a directory only the sharers can enter: nobody
 * else can read the stem, so nobody else can create its objects first.
 *
 * The directory: `dir` when given (with a sharing group it must be given: that group's, closed
 * to others, e.g. chmod 2770), else $XDG_RUNTIME_DIR/kvtier when the runtime directory is this
 * user's and closed to others, else $HOME/.kvtier (made 0700 when absent); in every case it
 * must be the sharers' and closed to everyone else (KVT_ESTATE naming what is wrong). */
int kvi_shm_dir(const char *dir, const kvi_shm_share *share, char *out, size_t cap);
/* The stem of `name` from the rendezvous in dir: read, or (create) made by the first caller
 * (written in full under a temporary name, then linked in place: a racing caller reads the
 * winner's). The file must be the sharers' and closed to others, like an object (kvi_shm_check).
 * KVT_ENOENT without one (create false). */
int kvi_shm_stem(const char *dir, const char *name, const kvi_shm_share *share, bool create,
                 char *stem, size_t cap);
/* Removes the rendezvous of `name` (0 also when there is none). */
int kvi_shm_forget(const char *dir, const char *name);

#endif
