/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The SIGBUS guard (guard.h). The table is read by the signal handler without a lock: an
 * entry's length is written before its base (release), and the handler reads the base first
 * (acquire); an entry is cleared (base 0) before its mapping goes.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#include "base/error.h"
#include "base/guard.h"

typedef struct guard {
    _Atomic uintptr_t base; /* 0: free */
    size_t len;
    atomic_bool poisoned;
} guard;

static guard g_guard[KVI_GUARDS];
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static struct sigaction g_old;
static atomic_ulong g_trips;

static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
    uintptr_t a = (uintptr_t)si->si_addr;
    for (int i = 0; i < KVI_GUARDS; i++) {
        uintptr_t b = atomic_load_explicit(&g_guard[i].base, memory_order_acquire);
        if (!b || a < b || a - b >= g_guard[i].len)
            continue;
        /* the object was shrunk under this mapping: zero pages in its place, for good */
        int saved = errno;
        void *p = mmap((void *)b, g_guard[i].len, PROT_READ | PROT_WRITE,
                       MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        errno = saved;
        if (p != MAP_FAILED) {
            atomic_store(&g_guard[i].poisoned, true);
            atomic_fetch_add(&g_trips, 1);
            return; /* the faulting access runs again, on zeros */
        }
        break; /* cannot repair: the default action below */
    }
    if (g_old.sa_flags & SA_SIGINFO) {
        if (g_old.sa_sigaction) {
            g_old.sa_sigaction(sig, si, uc);
            return;
        }
    } else if (g_old.sa_handler != SIG_DFL && g_old.sa_handler != SIG_IGN) {
        g_old.sa_handler(sig);
        return;
    }
    /* the default action: restored, then the access faults again and takes it */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof(dfl));
    dfl.sa_handler = SIG_DFL;
    sigaction(SIGBUS, &dfl, NULL);
}

int kvi_guard_add(void *base, size_t len, int *id)
{
    *id = -1;
    pthread_mutex_lock(&g_mu);
    /* ours, unless someone installed another since (a test harness does, per test): then ours
     * again, in front of theirs */
    struct sigaction cur;
    if (sigaction(SIGBUS, NULL, &cur) == 0 &&
        !((cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == on_sigbus)) {
        struct sigaction sa;
        memset(&sa, 0, sizeof(sa));
        sa.sa_sigaction = on_sigbus;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
        sigemptyset(&sa.sa_mask);
        if (sigaction(SIGBUS, &sa, &g_old) != 0) {
            pthread_mutex_unlock(&g_mu);
            return kvi_fail_errno(errno, "guard: cannot install a SIGBUS handler");
        }
    }
    for (int i = 0; i < KVI_GUARDS; i++)
        if (!atomic_load(&g_guard[i].base)) {
            g_guard[i].len = len;
            atomic_store(&g_guard[i].poisoned, false);
            atomic_store_explicit(&g_guard[i].base, (uintptr_t)base, memory_order_release);
            *id = i;
            pthread_mutex_unlock(&g_mu);
            return 0;
        }
    pthread_mutex_unlock(&g_mu);
    return kvt_fail(KVT_ELIMIT, "guard: more than %d shared mappings guarded", KVI_GUARDS);
}

void kvi_guard_remove(int id)
{
    if (id < 0 || id >= KVI_GUARDS)
        return;
    pthread_mutex_lock(&g_mu);
    atomic_store_explicit(&g_guard[id].base, 0, memory_order_release);
    pthread_mutex_unlock(&g_mu);
}

bool kvi_guard_poisoned(int id)
{
    return id >= 0 && id < KVI_GUARDS && atomic_load(&g_guard[id].poisoned);
}

unsigned long kvi_guard_trips(void)
{
    return atomic_load(&g_trips);
}
