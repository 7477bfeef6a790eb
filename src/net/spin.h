/* SPDX-License-Identifier: Apache-2.0 */
/*
 * How long a polling thread spins before it sleeps on its descriptor (spin.c).
 *
 * Spinning wins while a core is free: the peer's reply arrives within microseconds and a
 * sleep would add a wake-up. It loses when more tasks are runnable than there are cores: the
 * spinner then holds a core that the peer needs to produce that reply (measured: a 64 KiB push
 * waited 1.3 ms at the median over tcp beside one busy core, 0.3-0.4 ms once the sender
 * stopped spinning there; docs/benchmarks.md). An adaptive spinner reads the run queue's
 * length (/proc/loadavg) at most once a millisecond per thread and spins only while, in most
 * recent looks, no task was left waiting for a core; otherwise it sleeps at once.
 */
#ifndef KVT_NET_SPIN_H
#define KVT_NET_SPIN_H

#include <stdbool.h>
#include <stdint.h>

typedef struct kvi_spin {
    uint64_t max_ns;    /* the spin before a sleep */
    uint64_t budget_ns; /* this stretch's: max_ns, or 0 on a crowded machine (adaptive) */
    uint64_t since;     /* when the current idle stretch began (0: not idle) */
    bool adaptive;      /* spin only while the machine is not crowded */
    bool slept;         /* this stretch went to sleep */
} kvi_spin;

void kvi_spin_init(kvi_spin *s, uint64_t max_ns, bool adaptive);
/* Work was found: ends an idle stretch. */
void kvi_spin_busy(kvi_spin *s);
/* Nothing was found at now (monotonic ns): true while the caller should poll again without
 * sleeping, false once it should sleep. */
bool kvi_spin_idle(kvi_spin *s, uint64_t now);
/* Tests: fn answers "crowded now?" instead of /proc/loadavg (NULL: back to it); resets this
 * thread's average. Not thread-safe: call before threads spin. */
void kvi_spin_test_look(bool (*fn)(void));

#endif
