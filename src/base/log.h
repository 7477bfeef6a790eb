/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Levelled logging. KVT_LOG_* macros test the level before formatting, so disabled log lines
 * cost one relaxed atomic load.
 */
#ifndef KVT_BASE_LOG_H
#define KVT_BASE_LOG_H

#include "base/export.h"

#include "kvtier/base.h"

KVI_EXPORT void kvi_log_write(int level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
KVI_EXPORT int kvi_log_level_cached(void);

#define KVT_LOG(level, ...)                                                                        \
    do {                                                                                           \
        if ((level) <= kvi_log_level_cached())                                                     \
            kvi_log_write((level), __FILE__, __LINE__, __VA_ARGS__);                               \
    } while (0)

#define KVT_LOG_E(...) KVT_LOG(KVT_LOG_ERROR, __VA_ARGS__)
#define KVT_LOG_W(...) KVT_LOG(KVT_LOG_WARN, __VA_ARGS__)
#define KVT_LOG_I(...) KVT_LOG(KVT_LOG_INFO, __VA_ARGS__)
#define KVT_LOG_D(...) KVT_LOG(KVT_LOG_DEBUG, __VA_ARGS__)
#define KVT_LOG_T(...) KVT_LOG(KVT_LOG_TRACE, __VA_ARGS__)

#endif
