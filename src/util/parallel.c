/* parallel.c - thread count and environment flags. */
#include "util/parallel.h"

#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
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

/* ---- waiting: spin, then sleep ------------------------------------------- */

static _Atomic int g_spin_us = -1;

void mx_set_spin_us(int us) { atomic_store_explicit(&g_spin_us, us < 0 ? -1 : us, memory_order_relaxed); }

int mx_spin_us(void)
{
    int v = atomic_load_explicit(&g_spin_us, memory_order_relaxed);
    if (v < 0) {
        long us = mx_env_long("MLXCEL_SPIN_US", 20);
        v = us < 0 ? 0 : us > 1000000 ? 1000000 : (int)us;
        atomic_store_explicit(&g_spin_us, v, memory_order_relaxed);
    }
    return v;
}

_Static_assert(sizeof(_Atomic unsigned) == sizeof(uint32_t), "the futex word is 32 bits");

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static void futex_wait(_Atomic unsigned *w, unsigned v)
{
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT_PRIVATE, v, NULL, NULL, 0);
}

static void futex_wake_all(_Atomic unsigned *w)
{
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

/* Returns once *w != v: spins for the budget, then sleeps.  The waker
 * changes *w, then reads *sleepers; this thread counts itself in *sleepers,
 * then reads *w (all seq_cst), so one of them sees the other, and the
 * futex refuses to sleep on a word that moved.  Acquire on return. */
static void wait_while(_Atomic unsigned *w, unsigned v, _Atomic int *sleepers)
{
    if (atomic_load_explicit(w, memory_order_acquire) != v)
        return;
    const int budget = mx_spin_us();
    if (budget > 0) {
        const double deadline = mx_now() + budget * 1e-6;
        for (unsigned i = 1;; i++) {
            if (atomic_load_explicit(w, memory_order_acquire) != v)
                return;
            cpu_relax();
            if (!(i & 63) && mx_now() > deadline)
                break;
        }
    }
    atomic_fetch_add(sleepers, 1);
    while (atomic_load(w) == v)
        futex_wait(w, v);
    atomic_fetch_sub(sleepers, 1);
}

/* After changing *w (seq_cst): wakes its sleepers, if any. */
static void wake(_Atomic unsigned *w, _Atomic int *sleepers)
{
    if (atomic_load(sleepers) > 0)
        futex_wake_all(w);
}

/* ---- the team barrier ------------------------------------------------------ */

void mx_team_init(mx_team *t)
{
    atomic_init(&t->arrived, 0);
    atomic_init(&t->gen, 0);
    atomic_init(&t->sleepers, 0);
    atomic_init(&t->n, 1);
    atomic_init(&t->next, 0);
}

void mx_team_join(mx_team *t, int n) { atomic_store_explicit(&t->n, n, memory_order_relaxed); }

void mx_team_sync(mx_team *t)
{
    const unsigned n = (unsigned)atomic_load_explicit(&t->n, memory_order_relaxed);
    if (n <= 1) {
        atomic_store_explicit(&t->next, 0, memory_order_relaxed);
        return;
    }
    /* the round this thread is in: it cannot end before this thread arrives */
    const unsigned g = atomic_load_explicit(&t->gen, memory_order_acquire);
    if (atomic_fetch_add_explicit(&t->arrived, 1, memory_order_acq_rel) == n - 1) {
        /* the last one: every member has left the loop before this
         * barrier, so its counter restarts; then the release (it publishes
         * the resets and what every member wrote before arriving, which the
         * acq_rel additions collected) */
        atomic_store_explicit(&t->next, 0, memory_order_relaxed);
        atomic_store_explicit(&t->arrived, 0, memory_order_relaxed);
        atomic_fetch_add(&t->gen, 1);
        wake(&t->gen, &t->sleepers);
        return;
    }
    wait_while(&t->gen, g, &t->sleepers);
}

/* ---- the pool -------------------------------------------------------------- */

enum { POOL_MAX = 256 };

/* A worker waits on its own word, so a run wakes only the threads it
 * uses; the run's fields are written before the word is bumped and stay
 * until the worker has counted itself in `done`. */
typedef struct pool_worker {
    pthread_t th;
    int ith;
    _Atomic unsigned job;          /* runs posted to this worker; futex word */
    _Atomic int sleepers;
    mx_pool_fn fn;
    void *arg;
    int nth;
} pool_worker;

/* One run at a time (the lock). */
static struct {
    pthread_mutex_t lock;
    pool_worker *w;                /* workers 1 .. n_workers */
    int n_workers;
    _Atomic unsigned done;         /* workers finished with the current run; futex word */
    _Atomic int done_sleepers;
} g_pool = {.lock = PTHREAD_MUTEX_INITIALIZER};

static _Thread_local int tl_in_run;   /* this thread is inside a run */

static void *pool_main(void *p)
{
    pool_worker *me = p;
    unsigned seen = 0;
    tl_in_run = 1;
    for (;;) {
        wait_while(&me->job, seen, &me->sleepers);
        seen++;   /* one post per run, and the next only after this one is done */
        me->fn(me->arg, me->ith, me->nth);
        atomic_fetch_add(&g_pool.done, 1);
        wake(&g_pool.done, &g_pool.done_sleepers);
    }
    return NULL;
}

/* Grows the pool to n workers (under the lock, between runs); returns how
 * many there are. */
static int pool_grow(int n)
{
    if (n <= g_pool.n_workers)
        return g_pool.n_workers;
    if (!g_pool.w) {
        g_pool.w = calloc(POOL_MAX, sizeof *g_pool.w);
        if (!g_pool.w)
            return 0;
    }
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    while (g_pool.n_workers < n && g_pool.n_workers < POOL_MAX - 1) {
        pool_worker *w = &g_pool.w[g_pool.n_workers + 1];
        w->ith = g_pool.n_workers + 1;
        atomic_init(&w->job, 0);
        atomic_init(&w->sleepers, 0);
        if (pthread_create(&w->th, &at, pool_main, w) != 0)
            break;
        g_pool.n_workers++;
    }
    pthread_attr_destroy(&at);
    return g_pool.n_workers;
}

void mx_pool_run(int nth, mx_pool_fn fn, void *arg)
{
    if (nth <= 1 || tl_in_run) {
        fn(arg, 0, 1);
        return;
    }
    pthread_mutex_lock(&g_pool.lock);
    const int workers = pool_grow(nth - 1);
    if (workers < nth - 1)
        nth = workers + 1;
    atomic_store(&g_pool.done, 0);
    for (int i = 1; i < nth; i++) {
        pool_worker *w = &g_pool.w[i];
        w->fn = fn;
        w->arg = arg;
        w->nth = nth;
        atomic_fetch_add(&w->job, 1);
        wake(&w->job, &w->sleepers);
    }
    tl_in_run = 1;
    fn(arg, 0, nth);
    tl_in_run = 0;
    for (unsigned d; (d = atomic_load_explicit(&g_pool.done, memory_order_acquire)) != (unsigned)(nth - 1);)
        wait_while(&g_pool.done, d, &g_pool.done_sleepers);
    pthread_mutex_unlock(&g_pool.lock);
}

/* Each arm runs a few calls in a row, the first not counted, and the
 * first choice compares their medians.  In a row, not in turns:
 * a core left idle for a call sleeps, and on a virtual machine waking it
 * can take a millisecond, which alternating arms would charge to every
 * call of the team.  For the same reason the arm not chosen is timed with
 * two calls in a row, the faster counted, every `interval` calls, an
 * interval that doubles (64 up to 1024) while the choice stands and starts
 * over when it changes: a wrong arm costs at most two calls in 64, and a
 * change of the machine's state is followed within a few hundred calls.
 * The chosen arm's average moves by a quarter of each timing's difference,
 * a timing counted as at most twice the average (one call in a few
 * hundred takes ten times the others: a page fault, a preemption), so one
 * slow call does not flip the choice while a lasting change shows within a
 * few calls. */
/* timings counted at first: six of the team, whose barriers make it vary;
 * three of one thread, which varies little (and is the slower arm on a
 * quiet machine, where every call on it is a loss) */
enum { TUNE_FIRST = 6, TUNE_FIRST_ONE = 3, TUNE_PROBE_MIN = 64, TUNE_PROBE_MAX = 1024 };
/* calls of the team not counted at first: on a virtual machine the first
 * calls after a core was idle can take several times longer, every barrier
 * waiting for the host to wake the other virtual CPU, until the host's
 * halt polling catches up (seen as 1.5 ms calls instead of 0.25 ms) */
enum { TUNE_SKIP_TEAM = 4 };
enum { TUNE_EXPLORE0, TUNE_EXPLORE1, TUNE_STEADY, TUNE_PROBE };

static int tuner_best(const mx_tuner *u) { return u->mean[1] < u->mean[0]; }

static double median(const double *v, int n)
{
    double a[TUNE_FIRST];
    memcpy(a, v, sizeof a[0] * (size_t)n);
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && a[j - 1] > a[j]; j--) {
            double t = a[j];
            a[j] = a[j - 1];
            a[j - 1] = t;
        }
    return n % 2 ? a[n / 2] : 0.5 * (a[n / 2 - 1] + a[n / 2]);
}

int mx_tuner_pick(mx_tuner *u)
{
    switch (u->phase) {
    case TUNE_EXPLORE0:
        return 0;
    case TUNE_EXPLORE1:
        return 1;
    case TUNE_PROBE:
        return !tuner_best(u);
    default:
        if (u->interval < TUNE_PROBE_MIN)
            u->interval = TUNE_PROBE_MIN;
        if (++u->since >= u->interval) {
            u->since = 0;
            u->phase = TUNE_PROBE;
            u->n = 0;
            return !tuner_best(u);
        }
        return tuner_best(u);
    }
}

void mx_tuner_record(mx_tuner *u, int arm, double seconds)
{
    arm = arm ? 1 : 0;
    const int n = u->n++;
    switch (u->phase) {
    case TUNE_EXPLORE0:
    case TUNE_EXPLORE1: {
        const int skip = u->phase == TUNE_EXPLORE0 ? TUNE_SKIP_TEAM : 1;
        const int count = u->phase == TUNE_EXPLORE0 ? TUNE_FIRST : TUNE_FIRST_ONE;
        if (n >= skip)
            u->first[n - skip] = seconds;
        if (n == skip + count - 1) {
            u->mean[u->phase] = median(u->first, count);
            u->phase++;
            u->n = 0;
        }
        return;
    }
    case TUNE_PROBE:
        if (n == 0) {
            u->first[0] = seconds;
            return;
        }
        {
            /* the other arm's recent timings replace its average: the
             * faster of the two, since the first may have paid for waking
             * a core that the other arm left idle */
            const int before = !arm;   /* the arm that was chosen */
            u->mean[arm] = seconds < u->first[0] ? seconds : u->first[0];
            if (tuner_best(u) == before)
                u->interval = u->interval * 2 > TUNE_PROBE_MAX ? TUNE_PROBE_MAX : u->interval * 2;
            else
                u->interval = TUNE_PROBE_MIN;
            u->phase = TUNE_STEADY;
        }
        return;
    default: {
        const double s = seconds < 2 * u->mean[arm] ? seconds : 2 * u->mean[arm];
        u->mean[arm] += 0.25 * (s - u->mean[arm]);
    }
    }
}
