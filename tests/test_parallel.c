/* test_parallel.c - the team barrier (util/parallel.h): every thread of a
 * round sees every write made before the barrier by any thread, over many
 * rounds, on the spinning path and on the sleeping one (spin budget 0),
 * with team sizes 1 to 4 (more threads than this machine has cores: the
 * sleeping path is what lets them all run), and rounds in which one thread
 * is late (it sleeps in the middle of a round while the others wait). */
#include <omp.h>
#include <stdatomic.h>
#include <time.h>

#include "test.h"
#include "util/parallel.h"

enum { ROUNDS = 4000, MAXT = 8 };

/* Round r: thread i writes slot[i] = r; after the barrier every thread
 * checks every slot holds r; after a second barrier the slots may change. */
static long run_rounds(int nth, int rounds, int late_every)
{
    static long slot[MAXT * 16];   /* one cache line per thread */
    mx_barrier bar;
    mx_barrier_init(&bar);
    _Atomic long bad = 0;
#pragma omp parallel num_threads(nth)
    {
        const int ith = omp_get_thread_num(), n = omp_get_num_threads();
        mx_barrier_join(&bar, n);
        for (int r = 0; r < rounds; r++) {
            if (late_every && r % late_every == 0 && ith == r / late_every % n) {
                struct timespec ts = {0, 300000};   /* 0.3 ms: past the spin budget */
                nanosleep(&ts, NULL);
            }
            slot[ith * 16] = r;
            mx_barrier_wait(&bar);
            for (int i = 0; i < n; i++)
                if (slot[i * 16] != r)
                    atomic_fetch_add(&bad, 1);
            mx_barrier_wait(&bar);
        }
    }
    return atomic_load(&bad);
}

int main(void)
{
    for (int spin = 0; spin < 2; spin++) {
        mx_set_spin_us(spin ? 100 : 0);
        for (int nth = 1; nth <= 4; nth++) {
            long bad = run_rounds(nth, ROUNDS / (nth > 2 ? 4 : 1), 0);
            CHECKF(bad == 0, "spin %d, %d threads: %ld stale reads", spin, nth, bad);
            bad = run_rounds(nth, 400, 7);
            CHECKF(bad == 0, "spin %d, %d threads, a late thread: %ld stale reads", spin, nth, bad);
        }
    }
    mx_set_spin_us(-1);
    /* the environment's budget: a number, clamped */
    CHECK(mx_spin_us() >= 0 && mx_spin_us() <= 1000000);
    return test_summary();
}
