/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Room for file descriptors before libzmq or UCX is asked for some: libzmq asserts (aborts
 * the process) when it cannot create its poller or mailbox descriptors, so kvtier looks first
 * and answers KVT_ELIMIT with a message instead.
 */
#include <dirent.h>
#include <sys/resource.h>

#include "base/error.h"
#include "base/fd.h"

int kvi_fd_room(unsigned need, const char *what)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
        return 0;
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return 0; /* no /proc: nothing to go by, libzmq decides */
    unsigned long open_fds = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        open_fds += e->d_name[0] != '.';
    closedir(d);
    if (open_fds > 0)
        open_fds--; /* the directory's own descriptor */
    if (open_fds + need <= (unsigned long)rl.rlim_cur)
        return 0;
    return kvt_fail(KVT_ELIMIT,
                    "%s: needs about %u free file descriptors, %lu of %lu are open (raise "
                    "ulimit -n)",
                    what, need, open_fds, (unsigned long)rl.rlim_cur);
}
