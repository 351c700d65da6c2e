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

/* Teams of threads for the forward pass.
 *
 * The pass runs on a pool of persistent threads with its own barrier, not on
 * OpenMP's: libgomp's threads spin for ~300000 pause instructions
 * (milliseconds) before they sleep, at every barrier and between parallel
 * regions, and its policy is fixed when the program starts.  On a machine
 * where another process wants the same cores, the thread that waits burns
 * the CPU its late partner or the thread with work needs; decode was
 * measured 5.6x slower on 2 cores beside one busy process (and the demo
 * model over 100x).  Here every wait spins for MLXCEL_SPIN_US microseconds,
 * then sleeps on a futex, so the CPU goes to whoever can use it.  The
 * default, 20, keeps a quiet machine's speed (the waits of a balanced pass
 * are shorter) while a preempted partner costs little; 100 made the
 * demo model 9.6x slower beside a busy process, 20 2.7x, 0 1.4x but 1.4x
 * slower alone (docs/benchmarks.md).  Other code keeps using OpenMP (its
 * regions are not on the decode path). */

/* What the threads of one run share: a barrier (reusable; the team size is
 * set by each member with mx_team_join before its first sync) and the item
 * counter of a dynamic loop, reset by every barrier. */
typedef struct mx_team {
    _Atomic unsigned arrived;      /* threads in the current round */
    _Atomic unsigned gen;          /* rounds completed; futex word */
    _Atomic int sleepers;          /* threads waiting on the futex */
    _Atomic int n;                 /* team size */
    _Atomic long next;             /* the dynamic loop's next item */
} mx_team;

void mx_team_init(mx_team *t);
/* Called by each member with the team size before its first sync. */
void mx_team_join(mx_team *t, int n);
/* The barrier: returns when every member has called it this round;
 * everything written before by any member is then visible. */
void mx_team_sync(mx_team *t);
/* A dynamic loop's next item (0, 1, 2, ...): the members share the items of
 * the loop that starts after one sync and ends before the next (at most
 * one such loop between two syncs). */
static inline long mx_team_next(mx_team *t)
{
    return atomic_fetch_add_explicit(&t->next, 1, memory_order_relaxed);
}

/* Runs fn(arg, ith, nth) for ith = 0 .. nth-1 on the pool's threads (the
 * caller is thread 0) and returns when all have returned.  nth may come
 * out smaller than asked (threads that could not be created; a call from
 * inside a run gets 1); fn is told the real count.  Runs from several
 * threads take turns. */
typedef void (*mx_pool_fn)(void *arg, int ith, int nth);
void mx_pool_run(int nth, mx_pool_fn fn, void *arg);

/* Choosing between the whole team and one thread by measurement.  A model
 * so small that a token takes a fraction of a millisecond crosses dozens of
 * barriers per token: alone on the machine two threads beat one, but when
 * another process takes the second core's time slices every barrier waits
 * for the preempted thread and one thread is several times faster.  No
 * fixed rule is right for both states, so the caller times its calls on
 * each arm and keeps the faster, timing the other one now and then
 * (results do not depend on the team size: every output is computed by one
 * thread in a fixed order).  Not thread-safe: one tuner per caller that
 * serializes its calls. */
typedef struct mx_tuner {
    double mean[2];   /* a call's seconds, moving average: [0] the team, [1] one thread */
    double first[6];  /* the first timings of the arm being explored */
    int phase;        /* 0, 1: exploring that arm; 2: steady; 3: timing the other arm */
    int n;            /* calls of the current phase */
    int since;        /* calls since the other arm was last timed */
    int interval;     /* calls between two timings of the other arm */
} mx_tuner;

/* The arm for the next call: 0 = the whole team, 1 = one thread. */
int mx_tuner_pick(mx_tuner *u);
/* The call on `arm` took `seconds`. */
void mx_tuner_record(mx_tuner *u, int arm, double seconds);

/* The spin budget in microseconds (MLXCEL_SPIN_US, read once); the setter
 * overrides it (us < 0: back to the environment's). */
int mx_spin_us(void);
void mx_set_spin_us(int us);

/* True unless the environment variable is 0/false/off/no (any case). */
int mx_env_flag(const char *name, int dflt);
long mx_env_long(const char *name, long dflt);

#endif
