/* bench_quant.c - decode (matvec) bandwidth and prefill (matmul) throughput
 * of the quantized kernels.
 *
 * usage: bench_quant [experts [repeats [variants [parts]]]]
 *   variants  comma-separated kernel names (default: every one the CPU runs
 *             but scalar)
 *   parts     any of "mv" (matvec), "mm" (matmul), "probe" (memory read
 *             probes), "streams" (reads of 1, 2 and 4 streams per thread),
 *             "rp" (the repacked layout against the MLX layout, T = 1, 4,
 *             8, 16, 128, the avx512vnni variants),
 *             comma-separated (default: all)
 *
 * matvec: a set of `experts` pairs of 4-bit, group-64, f16-scale matrices
 * shaped like an MoE expert's projections (2048x1408 and 1408x2048), sized
 * to exceed the last-level cache, is swept once per repeat with every
 * variant the CPU supports and thread counts 1..ncpu.  Reported: GB/s of
 * weight+scale+bias bytes streamed (min and median time over repeats),
 * beside a plain multi-threaded memory read over a buffer of the same size.
 * matmul: T=128 tokens through one 2048x1408 matrix, tokens/s; and T=8
 * tokens through every expert pair of the set (the MoE gather path's shape),
 * ms per pair.  The scalar reference is left out (0.2 GB/s: minutes). */
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/quant.h"
#include "util/err.h"
#include "util/membw.h"
#include "util/parallel.h"
#include "util/clock.h"

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static const char *g_variants, *g_parts;

/* Is `name` in the comma-separated list (NULL = everything)? */
static int listed(const char *list, const char *name)
{
    if (!list)
        return 1;
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        const char *q = strchr(p, ',');
        size_t len = q ? (size_t)(q - p) : strlen(p);
        if (len == n && !strncmp(p, name, n))
            return 1;
        if (!q)
            break;
        p = q + 1;
    }
    return 0;
}

static int run_variant(const char *name)
{
    if (!listed(g_variants, name) || (!g_variants && !strcmp(name, "scalar")))
        return 0;
    return mx_qkernels_force(name) == 0;
}

static void stats(double *t, int n, double *mn, double *med)
{
    qsort(t, (size_t)n, sizeof *t, cmp_d);
    *mn = t[0];
    *med = t[n / 2];
}

static void fill(void *p, size_t n, uint64_t seed)
{
    uint64_t *q = p;
    for (size_t i = 0; i < n / 8; i++) {
        seed ^= seed << 13; seed ^= seed >> 7; seed ^= seed << 17;
        q[i] = seed;
    }
}

/* f16 scales in a sane range: random bytes would give NaN/Inf. */
static void fill_f16(uint16_t *p, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++) {
        seed ^= seed << 13; seed ^= seed >> 7; seed ^= seed << 17;
        p[i] = (uint16_t)(0x2000 | (seed & 0x83ff));   /* |v| ~ 2^-7, either sign */
    }
}

typedef struct mat {
    mx_qmat m;
    uint8_t *w;
    uint16_t *s, *b;
} mat;

static void mat_init(mat *a, int64_t rows, int64_t cols, uint64_t seed)
{
    a->m = (mx_qmat){ .rows = rows, .cols = cols, .bits = 4, .group_size = 64, .sdtype = MX_F16 };
    size_t nw = (size_t)(rows * cols / 2), ng = (size_t)(rows * cols / 64);
    a->w = aligned_alloc(64, nw);
    a->s = malloc(ng * 2);
    a->b = malloc(ng * 2);
    fill(a->w, nw, seed);
    fill_f16(a->s, ng, seed + 1);
    fill_f16(a->b, ng, seed + 2);
    a->m.w = a->w;
    a->m.scales = a->s;
    a->m.biases = a->b;
}

static double read_probe(const uint64_t *buf, size_t n, int nth)
{
    uint64_t sum = 0;
    double t0 = mx_now();
#pragma omp parallel for num_threads(nth) reduction(+ : sum) schedule(static)
    for (size_t i = 0; i < n; i++)
        sum += buf[i];
    double t = mx_now() - t0;
    if (sum == 42)
        puts("");   /* keep the sum alive */
    return t;
}

/* All nth threads read buf, each its share as `ns` sequential streams side
 * by side (one 64-byte line of each in turn), as a matvec over ns rows at a
 * time reads its weights.  On the VMs this was written on, one stream per
 * thread sometimes read twice as fast as two, and the weight kernels (two
 * streams) never saw that speed; this shows which state the machine is in. */
static double read_streams(const uint64_t *buf, size_t n, int nth, int ns)
{
    uint64_t sum = 0;
    const long lines = (long)(n / 8);
    double t0 = mx_now();
#pragma omp parallel num_threads(nth) reduction(+ : sum)
    {
        long lo, hi;
        mx_split(lines, omp_get_thread_num(), omp_get_num_threads(), &lo, &hi);
        const long per = (hi - lo) / ns;
        for (long l = 0; l < per; l++)
            for (int k = 0; k < ns; k++) {
                const uint64_t *p = buf + (size_t)(lo + k * per + l) * 8;
                sum += p[0] + p[1] + p[2] + p[3] + p[4] + p[5] + p[6] + p[7];
            }
    }
    double t = mx_now() - t0;
    if (sum == 42)
        puts("");
    return t;
}

int main(int argc, char **argv)
{
    int nexp = argc > 1 ? atoi(argv[1]) : 192;
    int reps = argc > 2 ? atoi(argv[2]) : 5;
    g_variants = argc > 3 ? argv[3] : NULL;
    g_parts = argc > 4 ? argv[4] : NULL;
    if (nexp < 1) nexp = 1;
    if (reps < 1) reps = 1;
    int ncpu = mx_threads();
    mat *up = calloc((size_t)nexp, sizeof *up), *down = calloc((size_t)nexp, sizeof *down);
    size_t bytes = 0;
    for (int e = 0; e < nexp; e++) {
        mat_init(&up[e], 1408, 2048, 1000 + (uint64_t)e * 7);
        mat_init(&down[e], 2048, 1408, 5000 + (uint64_t)e * 7);
        bytes += mx_qmat_bytes(&up[e].m) + mx_qmat_bytes(&down[e].m);
    }
    float *x = malloc(2048 * 128 * sizeof *x), *y = malloc(2048 * 128 * sizeof *y);
    for (int i = 0; i < 2048 * 128; i++)
        x[i] = (float)((i * 2654435761u) % 1000) / 500.0f - 1.0f;
    printf("matvec: %d x (1408x2048 + 2048x1408) 4-bit g64 f16 = %.1f MB per sweep, %d repeats\n",
           nexp, bytes / 1e6, reps);

    /* memory read probes over a buffer of the same size: a plain loop, and
     * the probe `mlxcel bench` uses (AVX-512 loads, median of reps) */
    size_t nprobe = bytes / 8;
    uint64_t *probe = aligned_alloc(64, nprobe * 8);
    fill(probe, nprobe * 8, 99);
    double *t = malloc((size_t)reps * sizeof *t), mn, med;
    for (int nth = 1; nth <= ncpu && listed(g_parts, "probe"); nth++) {
        read_probe(probe, nprobe, nth);
        for (int r = 0; r < reps; r++)
            t[r] = read_probe(probe, nprobe, nth);
        stats(t, reps, &mn, &med);
        mx_set_threads(nth);
        printf("  %-10s threads=%d  best %6.2f GB/s  median %6.2f GB/s  (mx_membw_probe %.2f GB/s)\n",
               "memread", nth, bytes / mn / 1e9, bytes / med / 1e9, mx_membw_probe(bytes, reps));
    }
    if (listed(g_parts, "streams")) {
        /* 1, 2 and 4 streams per thread, alternating within each repeat */
        static const int nss[3] = {1, 2, 4};
        double *ts = malloc(3 * (size_t)reps * sizeof *ts);
        for (int r = 0; r < reps; r++)
            for (int j = 0; j < 3; j++)
                ts[j * reps + r] = read_streams(probe, nprobe, ncpu, nss[j]);
        for (int j = 0; j < 3; j++) {
            stats(ts + j * reps, reps, &mn, &med);
            printf("  %-10s threads=%d  %d stream%s per thread: best %6.2f GB/s  median %6.2f GB/s\n",
                   "streams", ncpu, nss[j], nss[j] > 1 ? "s" : " ", bytes / mn / 1e9,
                   bytes / med / 1e9);
        }
        free(ts);
    }
    free(probe);

    for (const char *const *nm = mx_qkernels_names(); *nm; nm++) {
        if (!listed(g_parts, "mv") || !run_variant(*nm))
            continue;
        for (int nth = 1; nth <= ncpu; nth++) {
            mx_set_threads(nth);
            for (int r = -1; r < reps; r++) {      /* r = -1: warm-up */
                double t0 = mx_now();
                for (int e = 0; e < nexp; e++) {
                    mx_qmatvec(&up[e].m, x, y);
                    mx_qmatvec(&down[e].m, y, x + 2048);
                }
                if (r >= 0)
                    t[r] = mx_now() - t0;
            }
            stats(t, reps, &mn, &med);
            printf("  %-10s threads=%d  best %6.2f GB/s  median %6.2f GB/s  (%.2f ms/sweep)\n",
                   *nm, nth, bytes / mn / 1e9, bytes / med / 1e9, med * 1e3);
        }
    }

    /* prefill: T=128 through one matrix (attention/shared expert), and T=8
     * through every expert pair of the set (what the MoE gather path does
     * with ~8 tokens per expert, weights streamed from memory) */
    printf("matmul: T=128 tokens x 2048x1408 (rows x cols) 4-bit g64 f16\n");
    mat mm;
    mat_init(&mm, 2048, 1408, 77);
    for (const char *const *nm = mx_qkernels_names(); *nm; nm++) {
        if (!listed(g_parts, "mm") || !run_variant(*nm))
            continue;
        for (int nth = 1; nth <= ncpu; nth++) {
            mx_set_threads(nth);
            for (int r = -1; r < reps; r++) {
                double t0 = mx_now();
                mx_qmatmul(&mm.m, x, 128, y);
                if (r >= 0)
                    t[r] = mx_now() - t0;
            }
            stats(t, reps, &mn, &med);
            double flops = 2.0 * 128 * 2048 * 1408;
            printf("  %-10s threads=%d  best %8.0f tok/s  median %8.0f tok/s  (%.1f GFLOP/s)\n",
                   *nm, nth, 128 / mn, 128 / med, flops / mn / 1e9);
        }
    }
    printf("matmul: T=8 tokens x every expert pair of the set (%d x 2 matrices)\n", nexp);
    for (const char *const *nm = mx_qkernels_names(); *nm; nm++) {
        if (!listed(g_parts, "mm") || !run_variant(*nm))
            continue;
        for (int nth = 1; nth <= ncpu; nth++) {
            mx_set_threads(nth);
            for (int r = -1; r < reps; r++) {
                double t0 = mx_now();
                for (int e = 0; e < nexp; e++) {
                    mx_qmatmul(&up[e].m, x, 8, y);
                    mx_qmatmul(&down[e].m, y, 8, x + 8 * 2048);
                }
                if (r >= 0)
                    t[r] = mx_now() - t0;
            }
            stats(t, reps, &mn, &med);
            double flops = 2.0 * 8 * 2 * 2048 * 1408 * nexp;
            printf("  %-10s threads=%d  best %6.3f ms/pair  median %6.3f ms/pair  (%.1f GFLOP/s)\n",
                   *nm, nth, mn / nexp * 1e3, med / nexp * 1e3, flops / mn / 1e9);
        }
    }
    /* the repacked layout (quant.h) against the MLX layout: T tokens through
     * every expert pair of the set (from DRAM; 16 pairs for T = 128), the
     * two layouts alternating within each repeat */
    if (listed(g_parts, "rp")) {
        mat *rup = calloc((size_t)nexp, sizeof *rup), *rdown = calloc((size_t)nexp, sizeof *rdown);
        double trp = 0;
        for (int e = 0; e < nexp; e++) {
            rup[e] = up[e];
            rdown[e] = down[e];
            uint8_t *a = aligned_alloc(64, mx_qmat_repack_bytes(&up[e].m));
            uint8_t *b = aligned_alloc(64, mx_qmat_repack_bytes(&down[e].m));
            memset(a, 0, mx_qmat_repack_bytes(&up[e].m));   /* fault the pages in first */
            memset(b, 0, mx_qmat_repack_bytes(&down[e].m));
            double t0 = mx_now();
            mx_qmat_repack(&up[e].m, a);
            mx_qmat_repack(&down[e].m, b);
            trp += mx_now() - t0;
            rup[e].m.rp = a;
            rdown[e].m.rp = b;
        }
        static const int Ts[] = {1, 4, 8, 16, 128};
        double *tr = malloc(2 * (size_t)reps * sizeof *tr);
        float *yy = malloc(2048 * 128 * sizeof *yy);
        printf("mx_qmat_repack: %.2f GB/s on one thread (pages already faulted in)\n",
               bytes / trp / 1e9);
        printf("repacked vs MLX layout: T tokens x expert pairs, threads=%d\n", ncpu);
        mx_set_threads(ncpu);
        for (const char *const *nm = mx_qkernels_names(); *nm; nm++) {
            if (strncmp(*nm, "avx512vnni", 10) || !run_variant(*nm))
                continue;
            for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
                const int T = Ts[ti], np = T >= 64 && nexp > 16 ? 16 : nexp;
                for (int r = -1; r < reps; r++)
                    for (int v = 0; v < 2; v++) {
                        const mat *U = v ? rup : up, *D = v ? rdown : down;
                        double t0 = mx_now();
                        for (int e = 0; e < np; e++) {
                            mx_qmatmul(&U[e].m, x, T, yy);
                            mx_qmatmul(&D[e].m, yy, T, y);
                        }
                        if (r >= 0)
                            tr[v * reps + r] = mx_now() - t0;
                    }
                double mn2, med2;
                stats(tr, reps, &mn, &med);
                stats(tr + reps, reps, &mn2, &med2);
                printf("  %-16s T=%-3d  MLX best %7.3f median %7.3f ms/pair   repacked best %7.3f "
                       "median %7.3f ms/pair   MLX/repacked %.2f (medians)\n",
                       *nm, T, mn / np * 1e3, med / np * 1e3, mn2 / np * 1e3, med2 / np * 1e3,
                       med / med2);
            }
        }
        for (int e = 0; e < nexp; e++) {
            free((void *)rup[e].m.rp);
            free((void *)rdown[e].m.rp);
        }
        free(rup), free(rdown), free(tr), free(yy);
    }
    mx_qkernels_force(NULL);
    mx_set_threads(0);
    return 0;
}
