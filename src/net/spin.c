/* SPDX-License-Identifier: Apache-2.0 */
/* Spinning before sleeping, adaptive to a crowded machine (spin.h). */
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <unistd.h>

#include "net/spin.h"

#define LOOK_EVERY_NS 1000000ull /* the run queue is read at most once a millisecond per thread */

/* One look: more tasks runnable right now than the machine has cores? (/proc/loadavg's fourth
 * field, "runnable/total", counts the reader.) False when it cannot tell. */
static bool look_loadavg(void)
{
    static _Atomic int fd = -2;
    static _Atomic long cores;
    int f = atomic_load(&fd);
    if (f == -2) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        atomic_store(&cores, n > 0 ? n : 1);
        int mine = open("/proc/loadavg", O_RDONLY | O_CLOEXEC), expect = -2;
        if (!atomic_compare_exchange_strong(&fd, &expect, mine) && mine >= 0)
            close(mine);
        f = atomic_load(&fd);
    }
    char buf[128];
    ssize_t len = f >= 0 ? pread(f, buf, sizeof(buf) - 1, 0) : -1;
    if (len <= 0)
        return false;
    buf[len] = 0;
    long running = 0;
    return sscanf(buf, "%*s %*s %*s %ld/", &running) == 1 && running > atomic_load(&cores);
}

static bool (*look)(void) = look_loadavg;
static __thread uint64_t looked_at;
static __thread unsigned score; /* 0..256: the recent looks' share that were crowded */

void kvi_spin_test_look(bool (*fn)(void))
{
    look = fn ? fn : look_loadavg;
    looked_at = 0;
    score = 0;
}

/* Whether most of this thread's recent looks were crowded: one look is a moment (this
 * process's own threads crowd it briefly), so the answer follows a moving average of about
 * the last eight. */
static bool crowded(uint64_t now)
{
    if (!looked_at || now - looked_at >= LOOK_EVERY_NS) {
        looked_at = now;
        score = score - score / 8 + (look() ? 32 : 0);
    }
    return score > 128;
}

void kvi_spin_init(kvi_spin *s, uint64_t max_ns, bool adaptive)
{
    *s = (kvi_spin){.max_ns = max_ns, .budget_ns = max_ns, .adaptive = adaptive};
}

void kvi_spin_busy(kvi_spin *s)
{
    s->since = 0;
    s->slept = false;
}

bool kvi_spin_idle(kvi_spin *s, uint64_t now)
{
    if (!s->since) {
        s->since = now ? now : 1;
        s->budget_ns = s->adaptive && s->max_ns && crowded(now) ? 0 : s->max_ns;
    }
    if (s->slept || now - s->since >= s->budget_ns) {
        s->slept = true;
        return false;
    }
    return true;
}
