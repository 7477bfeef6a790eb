/* SPDX-License-Identifier: Apache-2.0 */
/* Room for file descriptors before libzmq or UCX needs some (fd.c). */
#ifndef KVT_BASE_FD_H
#define KVT_BASE_FD_H

#include "base/export.h"

/* 0 when at least `need` more descriptors may be opened under RLIMIT_NOFILE (or nothing can
 * tell); KVT_ELIMIT with a message naming `what` otherwise. */
KVI_EXPORT int kvi_fd_room(unsigned need, const char *what);

#endif
