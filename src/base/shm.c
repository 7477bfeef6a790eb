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
#include <sys/random.h>
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

/* ---- the rendezvous: unguessable names, kept where only the sharers can look -------------- */

/* Whether directory st may hold the rendezvous of sharers `share`: ours (or the group's) and
 * closed to everyone else. 0, or the refusal naming what is wrong. */
static int check_dir(const struct stat *st, const char *path, const kvi_shm_share *share)
{
    char u[128], g[128];
    id_name(false, (unsigned)st->st_uid, u, sizeof(u));
    id_name(true, (unsigned)st->st_gid, g, sizeof(g));
    unsigned mode = (unsigned)(st->st_mode & 07777);
    if (!S_ISDIR(st->st_mode))
        return kvt_fail(KVT_ESTATE, "shared memory: %s is not a directory", path);
    if (share->has_group ? (st->st_gid != share->gid || (st->st_mode & 0007))
                         : (st->st_uid != geteuid() || (st->st_mode & 0077)))
        return kvt_fail(KVT_ESTATE,
                        "shared memory: the directory %s (owner %s, group %s, mode %04o) is not "
                        "%s and closed to everyone else (%s)",
                        path, u, g, mode, share->has_group ? "the sharing group's" : "this user's",
                        share->has_group ? "chgrp it, chmod 2770" : "chmod 0700");
    return 0;
}

/* path, made with mode `mode` if absent, then checked */
static int private_dir(const char *path, mode_t mode, const kvi_shm_share *share)
{
    if (mkdir(path, mode) != 0 && errno != EEXIST)
        return kvi_fail_errno(errno, "shared memory: cannot make the directory %s", path);
    struct stat st;
    if (lstat(path, &st) != 0)
        return kvi_fail_errno(errno, "shared memory: cannot stat %s", path);
    return check_dir(&st, path, share);
}

int kvi_shm_dir(const char *dir, const kvi_shm_share *share, char *out, size_t cap)
{
    if (dir && *dir) {
        struct stat st;
        if (snprintf(out, cap, "%s", dir) >= (int)cap)
            return kvt_fail(KVT_EINVAL, "shared memory: the directory name is too long");
        if (stat(dir, &st) != 0)
            return kvi_fail_errno(errno, "shared memory: no directory %s", dir);
        return check_dir(&st, dir, share);
    }
    if (share->has_group)
        return kvt_fail(KVT_EINVAL,
                        "shared memory: replicas of several users (a sharing group) need a "
                        "directory of that group closed to others for their rendezvous (the "
                        "node tier's dir: chgrp GROUP DIR; chmod 2770 DIR)");
    /* this user's: the runtime directory if it is a private one, else one in the home */
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    struct stat st;
    if (xdg && *xdg == '/' && stat(xdg, &st) == 0 && check_dir(&st, xdg, share) == 0 &&
        snprintf(out, cap, "%s/kvtier", xdg) < (int)cap && private_dir(out, 0700, share) == 0)
        return 0;
    const char *home = getenv("HOME");
    char tmp[1024];
    struct passwd pw, *res = NULL;
    if ((!home || *home != '/') && getpwuid_r(geteuid(), &pw, tmp, sizeof(tmp), &res) == 0 && res)
        home = pw.pw_dir;
    if (!home || *home != '/')
        return kvt_fail(KVT_EINVAL, "shared memory: no home directory to keep the rendezvous in "
                                    "(set XDG_RUNTIME_DIR or HOME, or give a directory)");
    if (snprintf(out, cap, "%s/.kvtier", home) >= (int)cap)
        return kvt_fail(KVT_EINVAL, "shared memory: the home directory's name is too long");
    return private_dir(out, 0700, share);
}

#define STEM_HEX 32 /* 128 random bits */
static const char RDV_HEAD[] = "kvtier rendezvous 1 ";

/* The stem in the rendezvous file fd (checked like an object: ours or the group's, closed to
 * others), into stem: "<name>.<32 hex>". */
static int read_stem(int fd, const char *path, const char *name, const kvi_shm_share *share,
                     char *stem, size_t cap)
{
    int rc = kvi_shm_check(fd, path, share, "shared memory");
    if (rc)
        return rc;
    char buf[sizeof(RDV_HEAD) + STEM_HEX + 2];
    ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
    const size_t want = sizeof(RDV_HEAD) - 1 + STEM_HEX + 1;
    if (n < 0)
        return kvi_fail_errno(errno, "shared memory: cannot read %s", path);
    buf[n] = 0;
    bool ok = (size_t)n == want && memcmp(buf, RDV_HEAD, sizeof(RDV_HEAD) - 1) == 0 &&
              buf[want - 1] == '\n';
    for (size_t i = sizeof(RDV_HEAD) - 1; ok && i < want - 1; i++)
        ok = (buf[i] >= '0' && buf[i] <= '9') || (buf[i] >= 'a' && buf[i] <= 'f');
    if (!ok)
        return kvt_fail(KVT_EPROTO, "shared memory: %s is not a rendezvous file (remove it)", path);
    buf[want - 1] = 0;
    if (snprintf(stem, cap, "%s.%s", name, buf + sizeof(RDV_HEAD) - 1) >= (int)cap)
        return kvt_fail(KVT_EINVAL, "shared memory: the name %s is too long", name);
    return 0;
}

/* A new rendezvous file: written in full under a temporary name, then linked in place (a
 * caller racing us links its own and one of the two loses with EEXIST). 0, or -EEXIST. */
static int make_stem(const char *dir, const char *path, const kvi_shm_share *share)
{
    uint8_t rnd[STEM_HEX / 2];
    char tmp[1100], text[sizeof(RDV_HEAD) + STEM_HEX + 2];
    if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd))
        return kvi_fail_errno(errno, "shared memory: no random bytes for a rendezvous");
    int n = snprintf(text, sizeof(text), "%s", RDV_HEAD);
    for (size_t i = 0; i < sizeof(rnd); i++)
        n += snprintf(text + n, sizeof(text) - (size_t)n, "%02x", rnd[i]);
    text[n++] = '\n';
    snprintf(tmp, sizeof(tmp), "%s/.rendezvous-XXXXXX", dir);
    int fd = mkstemp(tmp);
    if (fd < 0)
        return kvi_fail_errno(errno, "shared memory: cannot write in %s", dir);
    mode_t mode = share->has_group ? 0640 : 0600;
    int rc = 0;
    if ((share->has_group && fchown(fd, (uid_t)-1, share->gid) != 0) || fchmod(fd, mode) != 0 ||
        write(fd, text, (size_t)n) != n || fsync(fd) != 0)
        rc = kvi_fail_errno(errno, "shared memory: cannot write the rendezvous %s", tmp);
    close(fd);
    if (!rc && link(tmp, path) != 0)
        rc = errno == EEXIST ? -EEXIST
                             : kvi_fail_errno(errno, "shared memory: cannot make %s", path);
    unlink(tmp);
    return rc;
}

int kvi_shm_stem(const char *dir, const char *name, const kvi_shm_share *share, bool create,
                 char *stem, size_t cap)
{
    char path[1100];
    if (snprintf(path, sizeof(path), "%s/%s.rendezvous", dir, name) >= (int)sizeof(path))
        return kvt_fail(KVT_EINVAL, "shared memory: the directory name is too long");
    for (int attempt = 0; attempt < 2; attempt++) {
        int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd >= 0) {
            int rc = read_stem(fd, path, name, share, stem, cap);
            close(fd);
            return rc;
        }
        if (errno != ENOENT)
            return kvi_fail_errno(errno, "shared memory: cannot open %s", path);
        if (!create)
            return kvt_fail(KVT_ENOENT, "shared memory: no rendezvous %s", path);
        int rc = make_stem(dir, path, share);
        if (rc && rc != -EEXIST)
            return rc;
    }
    return kvt_fail(KVT_ESTATE, "shared memory: %s keeps changing", path);
}

int kvi_shm_forget(const char *dir, const char *name)
{
    char path[1100];
    snprintf(path, sizeof(path), "%s/%s.rendezvous", dir, name);
    if (unlink(path) != 0 && errno != ENOENT)
        return kvi_fail_errno(errno, "shared memory: cannot remove %s", path);
    return 0;
}
