/* parallel.h - how many threads the kernels use.
 * MLXCEL_THREADS overrides; default is the number of online CPUs.  Kernels use
 * OpenMP parallel regions with num_threads(mx_threads()). */
#ifndef MX_PARALLEL_H
#define MX_PARALLEL_H

#include <stdatomic.h>

int mx_threads(void);
void mx_set_threads(int n);   /* n <= 0 restores the default */

/* Splits [0, n) into nth nearly equal parts; part ith is [*lo, *hi). */
static inline void mx_split(long n, int ith, int nth, long *lo, long *hi)
{
    long base = n / nth, rem = n % nth;
    *lo = ith * base + (ith < rem ? ith : rem);
    *hi = *lo + base + (ith < rem ? 1 : 0);
}

/* A barrier for the threads of one parallel region that spins briefly, then
 * sleeps.  OpenMP's own barrier (libgomp) spins for ~300000 pause
 * instructions (milliseconds) before sleeping, and its policy is fixed when
 * the program starts: on a machine where another process wants the same
 * cores, the thread that arrived first burns the CPU its late partner needs
 * to get there, which made decode several times slower.  This one spins for
 * MLXCEL_SPIN_US microseconds (default 100: longer than the waits of a
 * balanced pass, shorter than a scheduler time slice), then waits on a
 * futex, so the CPU goes to whoever can use it.
 *
 * The team size is set by every member before its first wait (all write
 * the same number); the barrier is reusable without reinitialisation. */
typedef struct mx_barrier {
    _Atomic unsigned arrived;      /* threads in the current round */
    _Atomic unsigned gen;          /* rounds completed; futex word */
    _Atomic int sleepers;          /* threads waiting on the futex */
    _Atomic int n;                 /* team size */
} mx_barrier;

void mx_barrier_init(mx_barrier *b);
/* Called by each member with the team size before its first wait. */
void mx_barrier_join(mx_barrier *b, int n);
void mx_barrier_wait(mx_barrier *b);
/* The spin budget in microseconds (MLXCEL_SPIN_US, read once); the setter
 * overrides it (us < 0: back to the environment's). */
int mx_spin_us(void);
void mx_set_spin_us(int us);

/* True unless the environment variable is 0/false/off/no (any case). */
int mx_env_flag(const char *name, int dflt);
long mx_env_long(const char *name, long dflt);

#endif
