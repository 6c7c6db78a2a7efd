/* base/mapguard.c - the SIGBUS guard of base/mapguard.h. The handler only reads the table with
 * atomic loads and calls mmap (a system call), so it is async-signal-safe in practice on Linux. */
#include "base/mapguard.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef struct range {
    _Atomic uintptr_t lo, hi;   /* [lo, hi): 0, 0 when the slot is free */
    _Atomic uintptr_t fault_at; /* first faulting page + 1 (0: none) */
} range;

static range g_ranges[TM_MAPGUARD_MAX];
static _Atomic int g_n_used; /* slots [0, g_n_used) may be in use */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_installed;

static void on_sigbus(int sig, siginfo_t *si, void *uc) {
    (void)uc;
    uintptr_t a = (uintptr_t)si->si_addr;
    int n = atomic_load(&g_n_used);
    for (int i = 0; i < n; i++) {
        uintptr_t lo = atomic_load(&g_ranges[i].lo), hi = atomic_load(&g_ranges[i].hi);
        if (a < lo || a >= hi)
            continue;
        uintptr_t page = a & ~(uintptr_t)(sysconf(_SC_PAGESIZE) - 1);
        if (page < lo)
            page = lo;
        // Zero pages from here to the end of the range: the read resumes and every later read
        // of the lost part reads zeros instead of faulting again.
        void *p = mmap((void *)page, hi - page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
                       -1, 0);
        if (p == MAP_FAILED)
            break;
        uintptr_t none = 0;
        atomic_compare_exchange_strong(&g_ranges[i].fault_at, &none, page - lo + 1);
        return;
    }
    // Not ours: the default action (the process ends with SIGBUS, as without the guard).
    signal(sig, SIG_DFL);
    raise(sig);
}

tm_rc tm_mapguard_add(const void *addr, size_t len, int *slot, tm_err *err) {
    *slot = -1;
    pthread_mutex_lock(&g_mu);
    if (!g_installed) {
        struct sigaction sa;
        memset(&sa, 0, sizeof(sa));
        sa.sa_sigaction = on_sigbus;
        sa.sa_flags = SA_SIGINFO | SA_RESTART;
        sigemptyset(&sa.sa_mask);
        if (sigaction(SIGBUS, &sa, NULL) != 0) {
            pthread_mutex_unlock(&g_mu);
            return TM_ERR(err, TM_E_INTERNAL, "mapguard: cannot install the SIGBUS handler");
        }
        g_installed = 1;
    }
    int n = atomic_load(&g_n_used);
    for (int i = 0; i < TM_MAPGUARD_MAX && *slot < 0; i++) {
        if (atomic_load(&g_ranges[i].hi) != 0)
            continue;
        atomic_store(&g_ranges[i].fault_at, 0);
        atomic_store(&g_ranges[i].lo, (uintptr_t)addr);
        atomic_store(&g_ranges[i].hi, (uintptr_t)addr + len);
        if (i >= n)
            atomic_store(&g_n_used, i + 1);
        *slot = i;
    }
    pthread_mutex_unlock(&g_mu);
    if (*slot < 0)
        return TM_ERR(err, TM_E_INTERNAL, "mapguard: more than %d mapped files", TM_MAPGUARD_MAX);
    return TM_OK;
}

void tm_mapguard_remove(int slot) {
    if (slot < 0 || slot >= TM_MAPGUARD_MAX)
        return;
    pthread_mutex_lock(&g_mu);
    atomic_store(&g_ranges[slot].hi, 0);
    atomic_store(&g_ranges[slot].lo, 0);
    pthread_mutex_unlock(&g_mu);
}

int tm_mapguard_fault(int slot, size_t *off) {
    if (slot < 0 || slot >= TM_MAPGUARD_MAX)
        return 0;
    uintptr_t f = atomic_load(&g_ranges[slot].fault_at);
    if (!f)
        return 0;
    if (off)
        *off = (size_t)(f - 1);
    return 1;
}
