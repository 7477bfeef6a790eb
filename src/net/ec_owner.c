/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The consumer's owner key: the secret a cancel without reservation id (the consumer's own
 * scheduler letting go of a transfer) must present, so that no other peer can cancel a
 * transfer or plant a tombstone. A server without a configured key makes one and leaves it
 * where only its user on its host can read it: ec-owner-<control port>, a 0600 file in a
 * 0700 directory of that user, which the inbox of the same host and user reads.
 *
 * The directory is the first usable one of, in order: $XDG_RUNTIME_DIR/kvtier-<uid>,
 * /run/user/<uid>/kvtier-<uid> (the runtime directory systemd makes, when the variable is not
 * set), ${TMPDIR:-/tmp}/kvtier-<uid>, $HOME/.kvtier-<uid>. Usable: absent under a base that
 * exists (it is made, 0700), or present as a directory of this user closed to others. A name
 * someone else made (another user pre-creating /tmp/kvtier-<uid> to keep the consumer from
 * ever cancelling) or one others may enter is never trusted: it is skipped with a warning
 * naming its owner, and the next candidate serves. The server and the inbox walk the same
 * list, so they meet in the same place; the inbox reads a key only from a usable directory.
 * The same directory holds each server's event socket (a unix socket, ec-events-<port>): only
 * this user's processes can connect to it, so no other local user takes readiness events.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "base/log.h"
#include "base/util.h"
#include "net/ec_ctl.h"
#include "kvtier/ec_net.h"

#define KEY_DIRS 4

/* Candidate i's directory into buf: 0, or 1 when it does not apply here (no such base). */
static int key_dir(int i, char *buf, size_t cap)
{
    unsigned uid = (unsigned)getuid();
    const char *base = NULL;
    char run[64];
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    switch (i) {
    case 0:
        base = xdg && xdg[0] == '/' ? xdg : NULL;
        break;
    case 1:
        snprintf(run, sizeof(run), "/run/user/%u", uid);
        base = (!xdg || strcmp(xdg, run) != 0) && access(run, F_OK) == 0 ? run : NULL;
        break;
    case 2:
        base = getenv("TMPDIR");
        if (!base || base[0] != '/')
            base = "/tmp";
        break;
    default: {
        const char *home = getenv("HOME");
        int n = home && home[0] == '/' ? snprintf(buf, cap, "%s/.kvtier-%u", home, uid) : -1;
        return n > 0 && (size_t)n < cap ? 0 : 1;
    }
    }
    if (!base)
        return 1;
    int n = snprintf(buf, cap, "%s/kvtier-%u", base, uid);
    return n > 0 && (size_t)n < cap ? 0 : 1;
}

/* The directory is ours and only ours (made if absent and `make`); 0, or why not. */
static int private_dir(const char *dir, bool make)
{
    if (make && mkdir(dir, 0700) != 0 && errno != EEXIST)
        return kvt_fail(KVT_ESYS, "ec owner key: mkdir %s: %s", dir, strerror(errno));
    struct stat st;
    if (lstat(dir, &st) != 0)
        return kvt_fail(KVT_ENOENT, "ec owner key: %s: %s", dir, strerror(errno));
    if (!S_ISDIR(st.st_mode) || st.st_uid != getuid() || (st.st_mode & 077))
        return kvt_fail(KVT_ESTATE,
                        "ec owner key: %s is not a directory of this user closed to others "
                        "(owner uid %u, mode %04o); not keeping a secret there",
                        dir, (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777));
    return 0;
}

/* The first usable candidate's directory (made if `make`): 0, or KVT_ESTATE naming them all. */
static int usable_dir(bool make, char *dir, size_t cap)
{
    char why[1024] = "";
    size_t wl = 0;
    for (int i = 0; i < KEY_DIRS; i++) {
        if (key_dir(i, dir, cap))
            continue;
        int rc = private_dir(dir, make);
        if (rc == 0)
            return 0;
        if (rc == KVT_ESTATE)
            KVT_LOG_W("%s; trying the next place", kvt_last_error());
        int n = snprintf(why + wl, sizeof(why) - wl, "%s%s", wl ? "; " : "", kvt_last_error());
        if (n > 0)
            wl = kvi_min_u32((uint32_t)(wl + (size_t)n), (uint32_t)sizeof(why) - 1);
    }
    return kvt_fail(KVT_ESTATE, "ec owner key: no private directory for the key: %s", why);
}

int kvt_ec_owner_key_path(uint32_t port, char *buf, size_t cap)
{
    if (!buf || port < 1 || port > 65535)
        return kvt_fail(KVT_EINVAL, "ec owner key: a port 1..65535 and a buffer are needed");
    char dir[512];
    int rc = usable_dir(true, dir, sizeof(dir));
    if (rc)
        return rc;
    int n = snprintf(buf, cap, "%s/ec-owner-%u", dir, port);
    if (n < 0 || (size_t)n >= cap)
        return kvt_fail(KVT_EINVAL, "ec owner key: path too long");
    return 0;
}

int kvi_ecc_event_path(uint32_t port, char *buf, size_t cap)
{
    if (port < 1 || port > 65535)
        return kvt_fail(KVT_EINVAL, "ec events: a port 1..65535 is needed");
    char dir[512];
    int rc = usable_dir(true, dir, sizeof(dir));
    if (rc)
        return rc;
    /* a unix socket's path fits in 107 bytes (sun_path), "ipc://" not counted */
    int n = snprintf(buf, cap, "ipc://%s/ec-events-%u", dir, port);
    if (n < 0 || (size_t)n >= cap || n - 6 > 107)
        return kvt_fail(KVT_EINVAL,
                        "ec events: the socket path %s/ec-events-%u is longer than a unix "
                        "socket's 107 bytes (set XDG_RUNTIME_DIR or TMPDIR shorter)",
                        dir, port);
    return 0;
}

int kvi_ecc_key_check(const char *k)
{
    if (!k || strlen(k) != KVT_EC_RID_LEN)
        return -1;
    for (int i = 0; i < (int)KVT_EC_RID_LEN; i++)
        if (!((k[i] >= '0' && k[i] <= '9') || (k[i] >= 'a' && k[i] <= 'f')))
            return -1;
    return 0;
}

int kvi_ecc_key_random(char out[KVT_EC_RID_LEN + 1])
{
    static const char hex[] = "0123456789abcdef";
    uint8_t b[KVT_EC_RID_LEN / 2];
    if (getrandom(b, sizeof(b), 0) != (ssize_t)sizeof(b))
        return kvt_fail(KVT_ESYS, "ec: getrandom: %s", strerror(errno));
    for (size_t i = 0; i < sizeof(b); i++) {
        out[2 * i] = hex[b[i] >> 4];
        out[2 * i + 1] = hex[b[i] & 15];
    }
    out[KVT_EC_RID_LEN] = 0;
    return 0;
}

bool kvi_ecc_key_equal(const char *a, const char *b)
{
    if (!a || !b)
        return false;
    unsigned diff = 0; /* constant time over the key's length */
    for (size_t i = 0; i < KVT_EC_RID_LEN; i++)
        diff |= (unsigned char)a[i] ^ (unsigned char)b[i];
    return diff == 0 && a[KVT_EC_RID_LEN] == 0 && b[KVT_EC_RID_LEN] == 0;
}

int kvi_ecc_owner_write(uint32_t port, const char *key)
{
    char path[600];
    int rc = kvt_ec_owner_key_path(port, path, sizeof(path));
    if (rc)
        return rc;
    char tmp[640];
    snprintf(tmp, sizeof(tmp), "%s.%d", path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return kvt_fail(KVT_ESYS, "ec owner key: %s: %s", tmp, strerror(errno));
    bool ok = write(fd, key, KVT_EC_RID_LEN) == (ssize_t)KVT_EC_RID_LEN;
    ok = close(fd) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) { /* atomically: a reader sees the old key or the new */
        unlink(tmp);
        return kvt_fail(KVT_ESYS, "ec owner key: writing %s failed", path);
    }
    return 0;
}

int kvi_ecc_owner_read(uint32_t port, char out[KVT_EC_RID_LEN + 1])
{
    char path[600];
    int rc = kvt_ec_owner_key_path(port, path, sizeof(path));
    if (rc)
        return rc;
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return kvt_fail(KVT_ENOENT,
                        "ec owner key: %s: %s (a server on another host or of another user: "
                        "give the server and the inbox the same owner_key)",
                        path, strerror(errno));
    struct stat st;
    ssize_t n = -1;
    if (fstat(fd, &st) == 0 && st.st_uid == getuid() && !(st.st_mode & 077))
        n = read(fd, out, KVT_EC_RID_LEN);
    close(fd);
    out[n == (ssize_t)KVT_EC_RID_LEN ? KVT_EC_RID_LEN : 0] = 0;
    if (n != (ssize_t)KVT_EC_RID_LEN || kvi_ecc_key_check(out))
        return kvt_fail(KVT_EPROTO, "ec owner key: %s is not a private file of 32 hex digits",
                        path);
    return 0;
}

void kvi_ecc_owner_remove(uint32_t port, const char *key)
{
    char cur[KVT_EC_RID_LEN + 1], path[600];
    /* only our own: a server restarted on the port may have written a newer one */
    if (kvi_ecc_owner_read(port, cur) == 0 && kvi_ecc_key_equal(cur, key) &&
        kvt_ec_owner_key_path(port, path, sizeof(path)) == 0)
        unlink(path);
}
