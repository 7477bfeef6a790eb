/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Error codes and the thread-local detail message.
 *
 * Each thread owns one fixed buffer, so recording an error never allocates and never fails;
 * a message longer than the buffer is truncated. The buffer is overwritten by the next
 * failure on the same thread, which is why kvt_last_error() is documented as valid only right
 * after the failing call.
 */
#include "base/error.h"
#include "kvtier/version.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define KVT_ERRMSG_MAX 512

static _Thread_local char tls_msg[KVT_ERRMSG_MAX];

struct err_desc {
    int code;
    const char *name;
    const char *text;
};

static const struct err_desc err_table[] = {
#define ERR_ROW_(name, value, text) {KVT_##name, "KVT_" #name, text},
    KVT_ERRNO_MAP(ERR_ROW_)
#undef ERR_ROW_
};

static const struct err_desc *find_err(int err)
{
    for (size_t i = 0; i < sizeof(err_table) / sizeof(err_table[0]); i++)
        if (err_table[i].code == err)
            return &err_table[i];
    return NULL;
}

const char *kvt_strerror(int err)
{
    const struct err_desc *d = find_err(err);
    return d ? d->text : "unknown error";
}

const char *kvt_err_name(int err)
{
    const struct err_desc *d = find_err(err);
    return d ? d->name : "KVT_E?";
}

const char *kvt_last_error(void)
{
    return tls_msg;
}

void kvi_clear_error(void)
{
    tls_msg[0] = '\0';
}

/* Formats into a copy first: the arguments may include kvt_last_error() itself (a message that
 * quotes the one it replaces), which vsnprintf must not read while it writes it. */
static void vformat(const char *fmt, va_list ap)
{
    char tmp[sizeof(tls_msg)];
    vsnprintf(tmp, sizeof(tmp), fmt, ap);
    memcpy(tls_msg, tmp, sizeof(tls_msg));
}

int kvt_fail(int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vformat(fmt, ap);
    va_end(ap);
    return err;
}

int kvi_fail_errno(int errno_value, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vformat(fmt, ap);
    va_end(ap);
    size_t n = strlen(tls_msg);
    char buf[128];
    /* strerror_r (XSI or GNU) is awkward to call portably; strerror with a copy is fine since
     * glibc's strerror is thread-safe for known codes. */
    snprintf(buf, sizeof(buf), ": %s", strerror(errno_value));
    if (n < sizeof(tls_msg) - 1)
        snprintf(tls_msg + n, sizeof(tls_msg) - n, "%s", buf);
    return KVT_ESYS;
}

int kvi_fail_wrap(int err, const char *prefix)
{
    char tmp[KVT_ERRMSG_MAX];
    size_t n = strlen(prefix);
    if (n > sizeof(tmp) - 3)
        n = sizeof(tmp) - 3;
    memcpy(tmp, prefix, n);
    tmp[n] = ':';
    tmp[n + 1] = ' ';
    size_t room = sizeof(tmp) - n - 2;
    size_t m = strnlen(tls_msg, room - 1);
    memcpy(tmp + n + 2, tls_msg, m);
    tmp[n + 2 + m] = '\0';
    memcpy(tls_msg, tmp, sizeof(tls_msg));
    return err;
}

int kvi_check_reserved(const uint64_t *room, size_t bytes, const char *what)
{
    for (size_t i = 0; i < bytes / sizeof(uint64_t); i++)
        if (room[i])
            return kvt_fail(KVT_EINVAL,
                            "%s: reserved word %zu is set (a field of a newer kvtier than this "
                            "library, %s?); leave the room zero, as the _config_init call does",
                            what, i, kvt_version());
    return 0;
}
