/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The consumer's owner key: the secret a cancel without reservation id (the consumer's own
 * scheduler letting go of a transfer) must present, so that no other peer can cancel a
 * transfer or plant a tombstone. A server without a configured key makes one and leaves it
 * where only its user on its host can read it: <XDG_RUNTIME_DIR or /tmp>/kvtier-<uid>/
 * ec-owner-<control port>, a 0600 file in a 0700 directory that must be ours (a directory
 * someone else made, or one others may enter, is refused rather than trusted).
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
#include "net/ec_ctl.h"
#include "kvtier/ec_net.h"

static int key_dir(char *buf, size_t cap)
{
    const char *base = getenv("XDG_RUNTIME_DIR");
    if (!base || base[0] != '/')
        base = "/tmp";
    int n = snprintf(buf, cap, "%s/kvtier-%u", base, (unsigned)getuid());
    if (n < 0 || (size_t)n >= cap)
        return kvt_fail(KVT_EINVAL, "ec owner key: directory name too long");
    return 0;
}

int kvt_ec_owner_key_path(uint32_t port, char *buf, size_t cap)
{
    if (!buf || port < 1 || port > 65535)
        return kvt_fail(KVT_EINVAL, "ec owner key: a port 1..65535 and a buffer are needed");
    char dir[512];
    int rc = key_dir(dir, sizeof(dir));
    if (rc)
        return rc;
    int n = snprintf(buf, cap, "%s/ec-owner-%u", dir, port);
    if (n < 0 || (size_t)n >= cap)
        return kvt_fail(KVT_EINVAL, "ec owner key: path too long");
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

/* The directory exists, is ours and only ours. */
static int private_dir(const char *dir)
{
    if (mkdir(dir, 0700) != 0 && errno != EEXIST)
        return kvt_fail(KVT_ESYS, "ec owner key: mkdir %s: %s", dir, strerror(errno));
    struct stat st;
    if (lstat(dir, &st) != 0)
        return kvt_fail(KVT_ESYS, "ec owner key: %s: %s", dir, strerror(errno));
    if (!S_ISDIR(st.st_mode) || st.st_uid != getuid() || (st.st_mode & 077))
        return kvt_fail(KVT_ESTATE,
                        "ec owner key: %s is not a directory of this user closed to others "
                        "(refusing to keep a secret there)",
                        dir);
    return 0;
}

int kvi_ecc_owner_write(uint32_t port, const char *key)
{
    char dir[512], path[600];
    int rc = key_dir(dir, sizeof(dir));
    if (!rc)
        rc = private_dir(dir);
    if (!rc)
        rc = kvt_ec_owner_key_path(port, path, sizeof(path));
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
