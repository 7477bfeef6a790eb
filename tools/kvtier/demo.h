/* `kvtier demo`: the end-to-end demonstration of what kvtier does today. */
#ifndef KVT_TOOLS_DEMO_H
#define KVT_TOOLS_DEMO_H

#include <stdint.h>

/* Runs the demonstration; returns a process exit code (0 when every check passed). */
int kvt_demo_run(uint64_t seed);

#endif
