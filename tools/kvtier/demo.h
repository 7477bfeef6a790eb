/* `kvtier demo`: the end-to-end demonstration of what kvtier does today. */
#ifndef KVT_TOOLS_DEMO_H
#define KVT_TOOLS_DEMO_H

#include <stdint.h>

/* Runs the demonstration; returns a process exit code (0 when every check passed). */
int kvt_demo_run(uint64_t seed);
/* Part 3, encoder-cache transfer in process; returns 0 when every check passed and, when
 * metrics is not NULL, the components' Prometheus text (malloc'd) in *metrics. */
int kvt_demo_ec(uint64_t seed, char **metrics);
/* Prometheus text of the last host-tier run (NULL before one). */
const char *kvt_demo_metrics(void);
/* Serves text at http://0.0.0.0:port/metrics (port 0: any free port, printed) for seconds
 * (< 0: until SIGINT/SIGTERM). Returns 0 or 1 with a message on stderr. */
int kvt_serve_metrics(unsigned port, const char *text, double seconds);

#endif
