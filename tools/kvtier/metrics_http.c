/* SPDX-License-Identifier: Apache-2.0 */
/*
 * `kvtier demo --metrics-port N`: serves the run's Prometheus text at /metrics with
 * libmicrohttpd (Debian's libmicrohttpd-dev), from its own polling thread. Any other path is
 * 404. Runs for a given time or until SIGINT/SIGTERM.
 */
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/socket.h>
#include <netdb.h>
#include <stdarg.h>
#include <microhttpd.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "demo.h"

static volatile sig_atomic_t g_stop;

static void on_signal(int sig)
{
    (void)sig;
    g_stop = 1;
}

static enum MHD_Result answer(void *cls, struct MHD_Connection *conn, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_size, void **state)
{
    (void)version;
    (void)upload;
    (void)upload_size;
    (void)state;
    const char *text = cls;
    bool ok = strcmp(method, "GET") == 0 && strcmp(url, "/metrics") == 0;
    const char *body = ok ? text : "not found: try /metrics\n";
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_PERSISTENT);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, "Content-Type", ok ? "text/plain; version=0.0.4" : "text/plain");
    enum MHD_Result ret = MHD_queue_response(conn, ok ? MHD_HTTP_OK : MHD_HTTP_NOT_FOUND, r);
    MHD_destroy_response(r);
    return ret;
}

int kvt_serve_metrics(const char *host, unsigned port, const char *text, double seconds)
{
    if (port > 65535) {
        fprintf(stderr, "kvtier: metrics port %u out of range\n", port);
        return 1;
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    char ps[8];
    snprintf(ps, sizeof(ps), "%u", port);
    int gai = getaddrinfo(host, ps, &hints, &ai);
    if (gai != 0 || !ai) {
        fprintf(stderr, "kvtier: --metrics-host %s: %s\n", host, gai_strerror(gai));
        return 1;
    }
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD;
    if (ai->ai_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    struct MHD_Daemon *d = MHD_start_daemon(flags, (uint16_t)port, NULL, NULL, answer, (void *)text,
                                            MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!d) {
        fprintf(stderr, "kvtier: cannot serve metrics on %s port %u (in use?)\n", host, port);
        return 1;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    printf(strchr(host, ':') ? "serving metrics on http://[%s]:%u/metrics"
                             : "serving metrics on http://%s:%u/metrics",
           host, info ? info->port : port);
    if (seconds >= 0)
        printf(" for %.0f s\n", seconds);
    else
        printf(" until interrupted\n");
    fflush(stdout);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (!g_stop) {
        usleep(50 * 1000);
        clock_gettime(CLOCK_MONOTONIC, &now);
        double dt = (double)(now.tv_sec - t0.tv_sec) + (double)(now.tv_nsec - t0.tv_nsec) / 1e9;
        if (seconds >= 0 && dt >= seconds)
            break;
    }
    MHD_stop_daemon(d);
    return 0;
}
