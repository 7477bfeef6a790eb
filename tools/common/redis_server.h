/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A redis-server of the caller's own, on a unix socket, for the remote tier's tests and its
 * benchmark: no TCP port, no persistence, its log in dir/redis.log, killed with the caller
 * (PR_SET_PDEATHSIG). kvt_redis_start returns its pid once the socket accepts a connection
 * (waiting 60 s at most: a loaded machine starts it slowly), or -1 (no redis-server on PATH, or
 * it exited or did not start); kvt_redis_stop kills it and removes the socket. The socket's file
 * existing is not enough: Redis binds, then changes its mode, then listens, and a client that
 * connects in between is refused (seen beside two busy cores).
 */
#ifndef KVT_TOOLS_REDIS_SERVER_H
#define KVT_TOOLS_REDIS_SERVER_H

#include <signal.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Whether sock takes a connection now (Redis listens on it). */
static inline int kvt_redis_listens(const char *sock)
{
    struct sockaddr_un a;
    memset(&a, 0, sizeof(a));
    a.sun_family = AF_UNIX;
    if (strlen(sock) >= sizeof(a.sun_path))
        return 0;
    strcpy(a.sun_path, sock);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return 0;
    int ok = connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
    close(fd);
    return ok;
}

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
        if (p <= 0)
            break;
        if (kvt_redis_listens(sock))
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
