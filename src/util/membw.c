/* membw.c - read-bandwidth probe. */
#include "util/membw.h"

#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "util/err.h"
#include "util/parallel.h"

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double mx_membw_probe(size_t bytes, int reps)
{
    size_t n = (bytes / sizeof(uint64_t)) & ~(size_t)3;
    uint64_t *buf = malloc(n * sizeof *buf);
    if (!buf || reps <= 0)
        return free(buf), -1.0;
    memset(buf, 1, n * sizeof *buf);   /* commit the pages before timing */
    double *gbs = malloc(sizeof *gbs * (size_t)reps);
    volatile uint64_t sink = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = mx_now();
        uint64_t total = 0;
        /* Four independent XOR chains keep the loads in flight; the compiler
         * vectorises this into wide loads, which is what a kernel streaming
         * weights does too. */
#pragma omp parallel for num_threads(mx_threads()) reduction(^ : total) schedule(static)
        for (size_t i = 0; i < n; i += 4)
            total ^= buf[i] ^ buf[i + 1] ^ buf[i + 2] ^ buf[i + 3];
        double dt = mx_now() - t0;
        sink ^= total;
        gbs[r] = (double)(n * sizeof *buf) / dt / 1e9;
    }
    (void)sink;
    qsort(gbs, (size_t)reps, sizeof *gbs, cmp_double);
    double med = gbs[reps / 2];
    free(gbs);
    free(buf);
    return med;
}
