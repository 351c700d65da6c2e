/* bench_matmul.c - the threaded quantized matmul (mx_qmatmul: activations
 * prepared once per call, small T through the matvec kernel) against each
 * thread calling the variant's matmul_rows on its rows (which prepares all T
 * activation rows itself), alternating in one process.
 *
 * usage: bench_matmul ROWS COLS T REPS   (4-bit g64 f16 random weights) */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include "quant/quant.h"
#include "util/err.h"
#include "util/parallel.h"
#include "util/clock.h"

static void per_thread(const mx_qmat *m, const float *X, int64_t T, float *Y)
{
    const mx_qkernels *k = mx_qkernels_active();
#pragma omp parallel num_threads(mx_threads())
    {
        long r0, r1;
        mx_split((long)(m->rows / 32), omp_get_thread_num(), omp_get_num_threads(), &r0, &r1);
        k->matmul_rows(m, X, m->cols, T, Y, m->rows, r0 * 32, r1 * 32);
    }
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: bench_matmul ROWS COLS T REPS\n");
        return 2;
    }
    int64_t rows = atol(argv[1]) / 32 * 32, cols = atol(argv[2]) / 64 * 64, T = atol(argv[3]);
    int reps = atoi(argv[4]);
    if (rows <= 0 || cols <= 0 || T <= 0 || reps <= 0)
        return 2;
    size_t nw = (size_t)(rows * cols / 2), ng = (size_t)(rows * cols / 64);
    uint8_t *w = malloc(nw);
    uint16_t *s = malloc(ng * 2), *b = malloc(ng * 2);
    float *X = malloc(sizeof(float) * (size_t)(T * cols)), *Y = malloc(sizeof(float) * (size_t)(T * rows));
    if (!w || !s || !b || !X || !Y)
        return 1;
    unsigned seed = 1;
    for (size_t i = 0; i < nw; i++)
        w[i] = (uint8_t)rand_r(&seed);
    for (size_t i = 0; i < ng; i++)
        s[i] = 0x2000, b[i] = 0xa000;   /* small f16 scale, negative bias */
    for (int64_t i = 0; i < T * cols; i++)
        X[i] = (float)(rand_r(&seed) % 2001 - 1000) / 1000.0f;
    mx_qmat m = {.w = w, .scales = s, .biases = b, .rows = rows, .cols = cols, .bits = 4,
                 .group_size = 64, .sdtype = MX_F16};
    double a = 0, c = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = mx_now();
        per_thread(&m, X, T, Y);
        double t1 = mx_now();
        mx_qmatmul(&m, X, T, Y);
        c += mx_now() - t1;
        a += t1 - t0;
    }
    printf("%s, %d threads, [%lld x %lld] x T=%lld: per-thread matmul_rows %.3f ms, mx_qmatmul %.3f ms, ratio %.3f, %.1f GMAC/s\n",
           mx_qkernels_active()->name, mx_threads(), (long long)rows, (long long)cols, (long long)T,
           1e3 * a / reps, 1e3 * c / reps, a / c, (double)rows * cols * T / (c / reps) / 1e9);
    free(w), free(s), free(b), free(X), free(Y);
    return 0;
}
