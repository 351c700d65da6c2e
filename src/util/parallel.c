/* parallel.c - thread count and environment flags. */
#include "util/parallel.h"

#include <limits.h>
#include <linux/futex.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <strings.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "util/clock.h"

static int g_threads;

int mx_threads(void)
{
    if (g_threads > 0)
        return g_threads;
    long n = mx_env_long("MLXCEL_THREADS", 0);
    if (n <= 0)
        n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n <= 0)
        n = 1;
    if (n > 256)
        n = 256;
    g_threads = (int)n;
    return g_threads;
}

void mx_set_threads(int n) { g_threads = n > 0 ? n : 0; }

int mx_env_flag(const char *name, int dflt)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return dflt;
    if (!strcasecmp(v, "0") || !strcasecmp(v, "false") || !strcasecmp(v, "off") ||
        !strcasecmp(v, "no"))
        return 0;
    return 1;
}

long mx_env_long(const char *name, long dflt)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return dflt;
    char *end;
    long n = strtol(v, &end, 10);
    return *end ? dflt : n;
}

/* ---- the spin-then-sleep barrier ------------------------------------------ */

static _Atomic int g_spin_us = -1;

void mx_set_spin_us(int us) { atomic_store_explicit(&g_spin_us, us < 0 ? -1 : us, memory_order_relaxed); }

int mx_spin_us(void)
{
    _Atomic int *cached = &g_spin_us;
    int v = atomic_load_explicit(cached, memory_order_relaxed);
    if (v < 0) {
        long us = mx_env_long("MLXCEL_SPIN_US", 100);
        v = us < 0 ? 0 : us > 1000000 ? 1000000 : (int)us;
        atomic_store_explicit(cached, v, memory_order_relaxed);
    }
    return v;
}

_Static_assert(sizeof(_Atomic unsigned) == sizeof(uint32_t), "the futex word is 32 bits");

void mx_barrier_init(mx_barrier *b)
{
    atomic_init(&b->arrived, 0);
    atomic_init(&b->gen, 0);
    atomic_init(&b->sleepers, 0);
    atomic_init(&b->n, 1);
}

void mx_barrier_join(mx_barrier *b, int n) { atomic_store_explicit(&b->n, n, memory_order_relaxed); }

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

void mx_barrier_wait(mx_barrier *b)
{
    const unsigned n = (unsigned)atomic_load_explicit(&b->n, memory_order_relaxed);
    if (n <= 1)
        return;
    /* the round this thread is in: it cannot end before this thread arrives */
    const unsigned g = atomic_load_explicit(&b->gen, memory_order_acquire);
    if (atomic_fetch_add_explicit(&b->arrived, 1, memory_order_acq_rel) == n - 1) {
        /* the last one: reset for the next round, then release the others
         * (the release publishes the reset and everything written before
         * every thread's arrival, which the acq_rel additions collected) */
        atomic_store_explicit(&b->arrived, 0, memory_order_relaxed);
        atomic_fetch_add(&b->gen, 1);   /* seq_cst: ordered before the sleepers check */
        if (atomic_load(&b->sleepers) > 0)
            syscall(SYS_futex, (uint32_t *)&b->gen, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
        return;
    }
    const int budget = mx_spin_us();
    if (budget > 0) {
        const double deadline = mx_now() + budget * 1e-6;
        for (unsigned i = 1;; i++) {
            if (atomic_load_explicit(&b->gen, memory_order_acquire) != g)
                return;
            cpu_relax();
            if (!(i & 63) && mx_now() > deadline)
                break;
        }
    }
    /* sleep: the waker bumps gen then reads sleepers; this thread counts
     * itself then reads gen (both seq_cst), so one of them sees the other,
     * and the futex itself refuses to sleep on a gen that moved */
    atomic_fetch_add(&b->sleepers, 1);
    while (atomic_load(&b->gen) == g)
        syscall(SYS_futex, (uint32_t *)&b->gen, FUTEX_WAIT_PRIVATE, g, NULL, NULL, 0);
    atomic_fetch_sub(&b->sleepers, 1);
}
