/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A redis-server of the caller's own, on a unix socket, for the remote tier's tests and its
 * benchmark: no TCP port, no persistence, its log in dir/redis.log, killed with the caller
 * (PR_SET_PDEATHSIG). kvt_redis_start returns its pid once the socket exists (waiting 60 s at
 * most: a loaded machine starts it slowly), or -1 (no redis-server on PATH, or it exited or did
 * not start); kvt_redis_stop kills it and removes the socket.
 */
#ifndef KVT_TOOLS_REDIS_SERVER_H
#define KVT_TOOLS_REDIS_SERVER_H

#include <signal.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* password: requirepass, or NULL for none */
static inline pid_t kvt_redis_start(const char *dir, const char *sock, const char *password)
{
    pid_t p = fork();
    if (p == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        char log[512];
        snprintf(log, sizeof(log), "%s/redis.log", dir);
        execlp("redis-server", "redis-server", "--port", "0", "--unixsocket", sock,
               "--unixsocketperm", "700", "--save", "", "--appendonly", "no", "--logfile", log,
               "--dir", dir, "--requirepass", password ? password : "", (char *)NULL);
        _exit(127);
    }
    struct timespec now, end;
    clock_gettime(CLOCK_MONOTONIC, &end);
    end.tv_sec += 60;
    for (;;) {
        struct stat st;
        if (p <= 0)
            break;
        if (stat(sock, &st) == 0)
            return p;
        if (waitpid(p, NULL, WNOHANG) == p)
            return -1;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec > end.tv_sec || (now.tv_sec == end.tv_sec && now.tv_nsec > end.tv_nsec))
            break;
        struct timespec ts = {0, 5000000};
        nanosleep(&ts, NULL);
    }
    if (p > 0) {
        kill(p, SIGKILL);
        waitpid(p, NULL, 0);
    }
    return -1;
}

static inline void kvt_redis_stop(pid_t pid, const char *sock)
{
    if (pid <= 0)
        return;
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    unlink(sock);
}

#endif
