/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Internal side of the error model: set the thread-local detail message and return the code
 * in one expression, so every failure path reads `return kvt_fail(KVT_EINVAL, "...", ...);`.
 */
#ifndef KVT_BASE_ERROR_H
#define KVT_BASE_ERROR_H

#include "base/export.h"

#include "kvtier/base.h"

/* kvt_fail (public, kvtier/base.h) formats the detail message for this thread and returns err. */
/* Like kvt_fail with KVT_ESYS, appending ": strerror(errno_value)". */
KVI_EXPORT int kvi_fail_errno(int errno_value, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Prefixes the current detail message with "prefix: " (adds context on the way up). */
KVI_EXPORT int kvi_fail_wrap(int err, const char *prefix);
/* A config's reserved room (uint64_t reserved[n], n x 8 bytes) must be zero: a set word is a
 * field this build does not know. KVT_EINVAL naming `what` otherwise. */
KVI_EXPORT int kvi_check_reserved(const uint64_t *room, size_t bytes, const char *what);
/* Clears the detail message (successful public calls need not call it). */
void kvi_clear_error(void);

#endif
