/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Shared-memory objects owned and checked (base/shm.h). A refusal names the holder by user
 * and group name where the system knows them, and the mode, so that an operator sees at once
 * whether a stale object of their own or someone else's is in the way.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "base/shm.h"

int kvi_shm_share_of(const char *group, kvi_shm_share *out)
{
    *out = (kvi_shm_share){0};
    if (!group)
        return 0;
    if (!*group)
        return kvt_fail(KVT_EINVAL, "shared memory: an empty group name (NULL: this user only)");
    struct group gr, *res = NULL;
    char buf[4096];
    int e = getgrnam_r(group, &gr, buf, sizeof(buf), &res);
    if (e || !res)
        return kvt_fail(KVT_EINVAL, "shared memory: no group named '%s'", group);
    out->has_group = true;
    out->gid = gr.gr_gid;
    return 0;
}

/* "'name' (uid N)", or "uid N" for an id without a name (a group's: gid) */
static void id_name(bool group, unsigned id, char *buf, size_t cap)
{
    char tmp[2048];
    const char *name = NULL;
    if (group) {
        struct group gr, *res = NULL;
        if (getgrgid_r((gid_t)id, &gr, tmp, sizeof(tmp), &res) == 0 && res)
            name = gr.gr_name;
    } else {
        struct passwd pw, *res = NULL;
        if (getpwuid_r((uid_t)id, &pw, tmp, sizeof(tmp), &res) == 0 && res)
            name = pw.pw_name;
    }
    const char *kind = group ? "gid" : "uid";
    if (name)
        snprintf(buf, cap, "'%s' (%s %u)", name, kind, id);
    else
        snprintf(buf, cap, "%s %u", kind, id);
}

static int refuse(const struct stat *st, const char *name, const kvi_shm_share *share,
                  const char *who)
{
    char u[128], g[128];
    id_name(false, (unsigned)st->st_uid, u, sizeof(u));
    id_name(true, (unsigned)st->st_gid, g, sizeof(g));
    unsigned mode = (unsigned)(st->st_mode & 07777);
    if (!S_ISREG(st->st_mode))
        return kvt_fail(KVT_EEXIST, "%s: %s is not a shared-memory object (owner %s)", who, name,
                        u);
    if (st->st_uid != geteuid() && !(share->has_group && st->st_gid == share->gid))
        return kvt_fail(KVT_EEXIST,
                        "%s: %s belongs to user %s, group %s, mode %04o: another user holds "
                        "this name (use another name, or have its owner remove it)",
                        who, name, u, g, mode);
    if (share->has_group && st->st_gid != share->gid)
        return kvt_fail(KVT_ESTATE,
                        "%s: %s (owner %s) is in group %s, not the sharing group; refusing to "
                        "share KV through it (remove it: kvt_node_unlink)",
                        who, name, u, g);
    return kvt_fail(KVT_ESTATE,
                    "%s: %s (owner %s, group %s) has mode %04o, which lets %s in; refusing to "
                    "share KV through it (remove it: kvt_node_unlink)",
                    who, name, u, g, mode,
                    share->has_group ? "users outside its group" : "other users");
}

int kvi_shm_check(int fd, const char *name, const kvi_shm_share *share, const char *who)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return kvi_fail_errno(errno, "%s: cannot stat %s", who, name);
    bool ok = S_ISREG(st.st_mode);
    if (share->has_group)
        /* ours or our group's; the group may write, nobody outside it may do anything */
        ok = ok && st.st_gid == share->gid && !(st.st_mode & 0007);
    else
        /* ours, and nobody else may do anything */
        ok = ok && st.st_uid == geteuid() && !(st.st_mode & 0077);
    return ok ? 0 : refuse(&st, name, share, who);
}

/* The holder of a name we may not even open (EACCES): what stat of /dev/shm says. */
static int refuse_unopened(const char *name, const kvi_shm_share *share, const char *who, int e)
{
    char path[256];
    struct stat st;
    snprintf(path, sizeof(path), "/dev/shm%s", name);
    if (stat(path, &st) == 0)
        return refuse(&st, name, share, who);
    return kvi_fail_errno(e, "%s: cannot open %s", who, name);
}

int kvi_shm_open(const char *name, const kvi_shm_share *share, const char *who, int *fd,
                 bool *created)
{
    mode_t mode = share->has_group ? 0660 : 0600;
    *created = false;
    int f = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (f >= 0) {
        /* the umask may have taken bits away; the group is set explicitly */
        if ((share->has_group && fchown(f, (uid_t)-1, share->gid) != 0) || fchmod(f, mode) != 0) {
            int rc = kvi_fail_errno(errno, "%s: cannot give %s mode %04o%s", who, name,
                                    (unsigned)mode, share->has_group ? " and its group" : "");
            close(f);
            shm_unlink(name);
            return rc;
        }
        *fd = f;
        *created = true;
        return 0;
    }
    if (errno != EEXIST)
        return kvi_fail_errno(errno, "%s: cannot create %s", who, name);
    f = shm_open(name, O_RDWR | O_CLOEXEC, 0);
    if (f < 0)
        return errno == EACCES ? refuse_unopened(name, share, who, errno)
                               : kvi_fail_errno(errno, "%s: cannot open %s", who, name);
    int rc = kvi_shm_check(f, name, share, who);
    if (rc) {
        close(f);
        return rc;
    }
    *fd = f;
    return 0;
}
