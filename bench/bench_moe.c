/* bench_moe.c - fused vs gather single-token MoE decode as a function of the
 * expert width d_ff, to choose MLXCEL_FUSED_MOE_MAX_DFF.
 *
 * usage: bench_moe [d_model] [k] [n_experts] [reps]
 * Use enough experts that 2*k of them per call do not stay in the last-level
 * cache between calls (this machine's L3 is large).
 * Random 4-bit g64 f16 experts (timing does not depend on the values), sized
 * so the active experts do not fit in the caches; each width is measured
 * with the two paths alternating, reporting the median time per call and
 * the ratio gather/fused (> 1: fused is faster). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe/moe.h"
#include "quant/quant.h"
#include "util/err.h"
#include "util/half.h"
#include "util/parallel.h"
#include "util/clock.h"

static uint64_t rng = 0x12345678abcdefull;
static uint64_t next(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
}

static void make(mx_linear *l, int64_t rows, int64_t cols)
{
    const int gs = 64, bits = 4;
    size_t nw = (size_t)(rows * cols * bits / 8), ng = (size_t)(rows * cols / gs);
    uint8_t *w = malloc(nw);
    uint16_t *s = malloc(ng * 2), *b = malloc(ng * 2);
    for (size_t i = 0; i < nw; i += 8) {
        uint64_t r = next();
        memcpy(w + i, &r, nw - i < 8 ? nw - i : 8);
    }
    for (size_t i = 0; i < ng; i++) {
        s[i] = mx_f32_to_f16(0.01f * (float)(next() % 100) / 100.0f);
        b[i] = mx_f32_to_f16(-0.05f);
    }
    memset(l, 0, sizeof *l);
    l->quantized = 1;
    l->rows = rows;
    l->cols = cols;
    l->q = (mx_qmat){.w = w, .scales = s, .biases = b, .rows = rows, .cols = cols, .bits = bits,
                     .group_size = gs, .sdtype = MX_F16};
}

static void unmake(mx_linear *l)
{
    free((void *)l->q.w), free((void *)l->q.scales), free((void *)l->q.biases);
}

static int cmpd(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    const int64_t D = argc > 1 ? atol(argv[1]) : 4096;
    const int k = argc > 2 ? atoi(argv[2]) : 2;
    const int E = argc > 3 ? atoi(argv[3]) : 8;
    const int reps = argc > 4 ? atoi(argv[4]) : 15;
    static const int64_t widths[] = {512, 1024, 1408, 2048, 4096, 8192, 14336, 16384, 24576};
    printf("# d_model %lld, top-%d of %d experts, 4-bit g64 f16, %d threads, kernel %s\n", (long long)D, k, E,
           mx_threads(), mx_qkernels_active()->name);
    printf("%8s %12s %12s %10s %12s\n", "d_ff", "fused_ms", "gather_ms", "ratio", "fused_GB/s");
    for (size_t wi = 0; wi < sizeof widths / sizeof *widths; wi++) {
        const int64_t F = widths[wi];
        /* keep the working set (E experts) around 1-2 GB at most */
        int e = E;
        while (e > k && (double)e * 3 * F * D / 2 > 1.6e9)
            e--;
        mx_experts ex = {.n = e, .d_model = D, .d_ff = F};
        ex.gate = calloc((size_t)e, sizeof(mx_linear));
        ex.up = calloc((size_t)e, sizeof(mx_linear));
        ex.down = calloc((size_t)e, sizeof(mx_linear));
        for (int i = 0; i < e; i++) {
            make(&ex.gate[i], F, D);
            make(&ex.up[i], F, D);
            make(&ex.down[i], D, F);
        }
        float *x = malloc(sizeof(float) * (size_t)D), *y = malloc(sizeof(float) * (size_t)D);
        for (int64_t i = 0; i < D; i++)
            x[i] = (float)((int64_t)(next() % 2001) - 1000) / 1000.0f;
        double tf[64], tg[64];
        mx_err err = {0};
        int n = reps < 64 ? reps : 64;
        for (int r = -2; r < n; r++) {
            /* Fresh experts for every call, like real routing, and different
             * ones for the two paths, so neither finds the other's weights
             * in the (large, shared) last-level cache; the order alternates. */
            mx_route ra = {.k = k}, rb = {.k = k};
            for (int j = 0; j < k; j++) {
                ra.idx[j] = (int)((2 * (r + 2)) * k + j) % e;
                rb.idx[j] = (int)((2 * (r + 2) + 1) * k + j) % e;
                ra.w[j] = rb.w[j] = 1.0f / k;
            }
            double t0 = mx_now(), t1, t2;
            if (r % 2) {
                mx_moe_fused(&ex, &ra, x, y, &err);
                t1 = mx_now();
                mx_moe_gather(&ex, &rb, x, 1, y, &err);
                t2 = mx_now();
            } else {
                mx_moe_gather(&ex, &rb, x, 1, y, &err);
                t1 = mx_now();
                mx_moe_fused(&ex, &ra, x, y, &err);
                t2 = mx_now();
                double tmp = t1 - t0;
                t1 = t0 + (t2 - t1);
                t2 = t1 + tmp;
            }
            if (r >= 0) {
                tf[r] = t1 - t0;
                tg[r] = t2 - t1;
            }
        }
        qsort(tf, (size_t)n, sizeof *tf, cmpd);
        qsort(tg, (size_t)n, sizeof *tg, cmpd);
        double f = tf[n / 2], g = tg[n / 2];
        double bytes = (double)k * 3 * (double)mx_linear_bytes(&ex.gate[0]);
        printf("%8lld %12.3f %12.3f %10.3f %12.1f\n", (long long)F, 1e3 * f, 1e3 * g, g / f, bytes / f / 1e9);
        fflush(stdout);
        for (int i = 0; i < e; i++) {
            unmake(&ex.gate[i]);
            unmake(&ex.up[i]);
            unmake(&ex.down[i]);
        }
        free(ex.gate), free(ex.up), free(ex.down), free(x), free(y);
    }
    return 0;
}
