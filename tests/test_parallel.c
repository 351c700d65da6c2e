/* test_parallel.c - the pool and its teams (util/parallel.h).
 *
 * Barrier: every thread of a round sees every write made before the
 * barrier by any thread, over many rounds, on the spinning path and on the
 * sleeping one (spin budget 0), with teams of 1 to 6 threads (more threads
 * than this machine has cores: the sleeping path is what lets them all
 * run), and rounds in which one thread is late (it sleeps in the middle of
 * a round while the others wait).
 * Dynamic loops: between two barriers every item is taken exactly once,
 * loop after loop.
 * Pool: fn sees ith 0..nth-1 once each; a run started from inside a run
 * runs inline with one thread; runs started from several threads at once
 * take turns and each completes. */
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "test.h"
#include "util/parallel.h"

enum { ROUNDS = 4000, MAXT = 8, ITEMS = 97 };

typedef struct rounds {
    mx_team team;
    int rounds, late_every;
    long slot[MAXT * 16];            /* one cache line per thread */
    _Atomic int taken[ITEMS];
    _Atomic long bad, twice, seen_ith[MAXT], nth_seen;
} rounds;

/* Round r: thread i writes slot[i] = r; after the barrier every thread
 * checks every slot holds r, then the team shares a dynamic loop whose
 * items must each be taken once; after a second barrier the slots and the
 * counts may change. */
static void rounds_thread(void *arg, int ith, int nth)
{
    rounds *R = arg;
    mx_team_join(&R->team, nth);
    atomic_fetch_add(&R->seen_ith[ith], 1);
    atomic_store(&R->nth_seen, nth);
    for (int r = 0; r < R->rounds; r++) {
        if (R->late_every && r % R->late_every == 0 && ith == r / R->late_every % nth) {
            struct timespec ts = {0, 300000};   /* 0.3 ms: past any spin budget tried */
            nanosleep(&ts, NULL);
        }
        R->slot[ith * 16] = r;
        mx_team_sync(&R->team);
        for (int i = 0; i < nth; i++)
            if (R->slot[i * 16] != r)
                atomic_fetch_add(&R->bad, 1);
        for (long it; (it = mx_team_next(&R->team)) < ITEMS;)
            if (atomic_fetch_add(&R->taken[it], 1) != r)
                atomic_fetch_add(&R->twice, 1);
        mx_team_sync(&R->team);
        if (ith == 0)
            for (int i = 0; i < ITEMS; i++)
                if (atomic_load(&R->taken[i]) != r + 1)
                    atomic_fetch_add(&R->twice, 1);
        mx_team_sync(&R->team);
    }
}

/* Runs the rounds; returns how many checks failed (printed), so threads
 * that are not the test's main thread can call it. */
static int run_rounds(int spin, int nth, int n_rounds, int late_every)
{
    rounds *R = calloc(1, sizeof *R);
    if (!R)
        return 1;
    mx_team_init(&R->team);
    R->rounds = n_rounds;
    R->late_every = late_every;
    mx_pool_run(nth, rounds_thread, R);
    int fails = 0;
    const char *late = late_every ? ", a late thread" : "";
    if (atomic_load(&R->nth_seen) != nth)
        fails++, fprintf(stderr, "pool gave %ld threads, asked %d\n", (long)atomic_load(&R->nth_seen), nth);
    for (int i = 0; i < nth; i++)
        if (atomic_load(&R->seen_ith[i]) != 1)
            fails++, fprintf(stderr, "thread %d ran %ld times\n", i, (long)atomic_load(&R->seen_ith[i]));
    if (atomic_load(&R->bad))
        fails++, fprintf(stderr, "spin %d, %d threads%s: %ld stale reads\n", spin, nth, late,
                         (long)atomic_load(&R->bad));
    if (atomic_load(&R->twice))
        fails++, fprintf(stderr, "spin %d, %d threads%s: %ld items not taken exactly once\n", spin,
                         nth, late, (long)atomic_load(&R->twice));
    free(R);
    return fails;
}

/* a run started inside a run: inline, one thread */
static _Atomic int inner_nth;
static void inner(void *arg, int ith, int nth)
{
    (void)arg;
    (void)ith;
    atomic_store(&inner_nth, nth);
}
static void outer(void *arg, int ith, int nth)
{
    (void)arg;
    (void)nth;
    if (ith == 1)
        mx_pool_run(4, inner, NULL);
}

/* runs from several threads at once */
static _Atomic int caller_fails;
static void *caller(void *arg)
{
    (void)arg;
    for (int k = 0; k < 20; k++)
        atomic_fetch_add(&caller_fails, run_rounds(1, 2 + k % 3, 50, 0));
    return NULL;
}

/* The tuner on synthetic timings: calls on the team take `team` seconds,
 * on one thread `one`; returns the calls in [from, to) that ran on one
 * thread. */
static int run_tuner(mx_tuner *u, int from, int to, double team, double one, int outlier_at)
{
    int ones = 0;
    for (int i = from; i < to; i++) {
        int arm = mx_tuner_pick(u);
        CHECK(arm == 0 || arm == 1);
        double t = arm ? one : team;
        if (i == outlier_at)
            t *= 20;   /* a page fault or a preemption */
        mx_tuner_record(u, arm, t);
        ones += arm;
    }
    return ones;
}

static void test_tuner(void)
{
    /* a quiet machine: the team is faster; after the first calls (10 on
     * the team, then 4 on one thread) the other arm is timed twice per 64 calls at most, less
     * and less often */
    mx_tuner u = {0};
    CHECK(run_tuner(&u, 0, 14, 2e-4, 3.5e-4, -1) == 4);
    int ones = run_tuner(&u, 14, 2014, 2e-4, 3.5e-4, -1);
    CHECK(ones > 0 && ones <= 2 * 2000 / 64);
    CHECKF(ones <= 16, "%d calls on one thread in 2000 once the team is known to be faster", ones);
    /* one slow call of the team does not send the next calls to one thread */
    ones = run_tuner(&u, 2014, 2030, 2e-4, 3.5e-4, 2015);
    CHECKF(ones <= 2, "%d calls on one thread after one slow call", ones);
    /* the machine gets busy: the team's calls take 4x; the choice follows
     * within a few calls of the next timing of the other arm (<= 1024 calls) */
    ones = run_tuner(&u, 2030, 4030, 8e-4, 3.5e-4, -1);
    CHECKF(ones >= 2000 - 1024 - 8, "%d of 2000 calls on one thread on a busy machine", ones);
    /* and quiet again: back to the team */
    ones = run_tuner(&u, 4030, 6030, 2e-4, 3.5e-4, -1);
    CHECKF(ones <= 1024 + 8 + 16, "%d of 2000 calls on one thread once quiet again", ones);
    int last = run_tuner(&u, 6030, 6094, 2e-4, 3.5e-4, -1);
    CHECKF(last <= 2, "%d of the last 64 calls on one thread", last);

    /* a busy machine from the start: one thread after the first calls */
    mx_tuner b = {0};
    run_tuner(&b, 0, 14, 8e-4, 3.5e-4, -1);
    ones = run_tuner(&b, 14, 1014, 8e-4, 3.5e-4, -1);
    CHECKF(ones >= 1000 - 2 * 1000 / 64, "%d of 1000 calls on one thread", ones);
    /* an outlier among the first timings does not decide (medians) */
    mx_tuner c = {0};
    run_tuner(&c, 0, 14, 2e-4, 3.5e-4, 5);
    CHECK(mx_tuner_pick(&c) == 0);
}

int main(void)
{
    test_tuner();
    for (int spin = 0; spin < 2; spin++) {
        mx_set_spin_us(spin ? 100 : 0);
        for (int nth = 1; nth <= 6; nth++) {
            CHECK(run_rounds(spin, nth, ROUNDS / (nth > 2 ? 8 : 2), 0) == 0);
            CHECK(run_rounds(spin, nth, 200, 7) == 0);
        }
    }
    mx_set_spin_us(-1);
    mx_pool_run(3, outer, NULL);
    CHECK(atomic_load(&inner_nth) == 1);
    pthread_t th[3];
    for (int i = 0; i < 3; i++)
        CHECK(pthread_create(&th[i], NULL, caller, NULL) == 0);
    for (int i = 0; i < 3; i++)
        pthread_join(th[i], NULL);
    CHECK(atomic_load(&caller_fails) == 0);
    /* the environment's budget: a number, clamped */
    CHECK(mx_spin_us() >= 0 && mx_spin_us() <= 1000000);
    return test_summary();
}
