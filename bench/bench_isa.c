/* bench_isa.c - what the core does per cycle with the instructions the
 * integer kernels are made of, and what the decode matvec achieves from
 * cache, so that a kernel's speed can be set against the core's limit.
 *
 * usage: bench_isa
 *
 * 1. The clock, from a chain of dependent scalar adds (one per cycle).
 * 2. Throughput (per cycle) of each instruction alone, 12 independent
 *    chains, and of pairs with vpdpbusd: a pair that takes 2 cycles shares
 *    vpdpbusd's execution pipes, one that takes 1 cycle does not.
 * 3. The avx512vnni matvec on 64 rows of 4-bit group-64 weights (L1/L2
 *    resident) for several row lengths: cycles per 64-byte block of one row.
 *    Its block loop issues 6 vpdpbusd + 1 FMA on the FMA pipes, so 7 cycles
 *    per block is the bound; memory is not involved.
 * Each chain is written with plain variables and an empty asm that pins it
 * in a register: with an array of vectors GCC keeps them in memory and the
 * loop measures store forwarding instead. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "quant/quant.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512VNNI__) && \
    defined(__AVX512BW__)
#include <immintrin.h>

#define PIN(v) __asm__ volatile("" : "+v"(v))
#define R12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
enum { N_ITER = 20000000 };

static double g_ghz;

static double clock_ghz(void)
{
    uint64_t x = 1;
    const long n = 400000000;
    double t0 = now();
    for (long i = 0; i < n; i++)
        __asm__ volatile("add $1, %0" : "+r"(x));
    return (double)n / (now() - t0) / 1e9;
}

/* 12 independent chains of one instruction: prints instructions per cycle. */
#define ALONE(NAME, INIT, STEP)                                               \
    do {                                                                         \
        R12(INIT)                                                                \
        double t0 = now();                                                       \
        for (long i = 0; i < N_ITER; i++) {                                      \
            R12(STEP)                                                            \
        }                                                                        \
        double c = (now() - t0) * g_ghz * 1e9;                                   \
        printf("  %-24s %5.2f per cycle\n", NAME, 12.0 * N_ITER / c);         \
    } while (0)

/* 6 chains of vpdpbusd beside 6 chains of another instruction: cycles per
 * (vpdpbusd + other) pair. */
#define PAIRED(NAME, OTHER)                                                      \
    do {                                                                         \
        __m512i a0 = one, a1 = one, a2 = one, a3 = one, a4 = one, a5 = one;     \
        __m512i b0 = one, b1 = one, b2 = one, b3 = one, b4 = one, b5 = one;     \
        __m512 f0 = fone, f1 = fone, f2 = fone, f3 = fone, f4 = fone, f5 = fone; \
        double t0 = now();                                                       \
        for (long i = 0; i < N_ITER; i++) {                                      \
            DP(0) DP(1) DP(2) DP(3) DP(4) DP(5)                                  \
            OTHER(0) OTHER(1) OTHER(2) OTHER(3) OTHER(4) OTHER(5)                \
        }                                                                        \
        double c = (now() - t0) * g_ghz * 1e9;                                   \
        sink ^= (unsigned)_mm512_cvtsi512_si32(_mm512_add_epi32(a0, b5)) ^       \
                (unsigned)_mm512_cvtsi512_si32(_mm512_castps_si512(_mm512_add_ps(f0, f5))); \
        (void)a1; (void)a2; (void)a3; (void)a4; (void)a5; (void)b0; (void)b1;   \
        (void)b2; (void)b3; (void)b4; (void)f1; (void)f2; (void)f3; (void)f4;   \
        printf("  vpdpbusd + %-13s %5.2f cycles per pair\n", NAME,               \
               c / (6.0 * N_ITER));                                              \
    } while (0)
#define DP(k) a##k = _mm512_dpbusd_epi32(a##k, bw, bx); PIN(a##k);
#define O_FMA(k) f##k = _mm512_fmadd_ps(f##k, fone, fone); PIN(f##k);
#define O_SLL(k) b##k = _mm512_slli_epi32(b##k, 1); PIN(b##k);
#define O_CVT(k) f##k = _mm512_cvtepi32_ps(b##k); PIN(f##k);
#define O_AND(k) b##k = _mm512_and_si512(b##k, bw); PIN(b##k);
#define O_PERM(k) f##k = _mm512_permutexvar_ps(bw, f##k); PIN(f##k);
#define O_ADD(k) b##k = _mm512_add_epi32(b##k, bw); PIN(b##k);

static void instructions(void)
{
    const __m512i bw = _mm512_set1_epi8(1), bx = _mm512_set1_epi8(2), one = _mm512_set1_epi32(1);
    const __m256i yw = _mm256_set1_epi8(1), yx = _mm256_set1_epi8(2);
    const __m512 fone = _mm512_set1_ps(1.0f);
    unsigned sink = 0;
    printf("instructions alone (12 independent chains):\n");
#define I_INIT(k) __m512i a##k = _mm512_set1_epi32(k);
#define Y_INIT(k) __m256i a##k = _mm256_set1_epi32(k);
#define F_INIT(k) __m512 a##k = _mm512_set1_ps((float)k);
#define S_DP(k) a##k = _mm512_dpbusd_epi32(a##k, bw, bx); PIN(a##k);
#define S_DPY(k) a##k = _mm256_dpbusd_epi32(a##k, yw, yx); PIN(a##k);
#define S_FMA(k) a##k = _mm512_fmadd_ps(a##k, fone, fone); PIN(a##k);
#define S_SLL(k) a##k = _mm512_slli_epi32(a##k, 1); PIN(a##k);
#define S_CVT(k) a##k = _mm512_cvtepi32_ps(_mm512_castps_si512(a##k)); PIN(a##k);
#define S_AND(k) a##k = _mm512_and_si512(a##k, bw); PIN(a##k);
#define S_PERM(k) a##k = _mm512_permutexvar_ps(bw, a##k); PIN(a##k);
    ALONE("vpdpbusd zmm", I_INIT, S_DP);
    ALONE("vpdpbusd ymm", Y_INIT, S_DPY);
    ALONE("vfmadd231ps zmm", F_INIT, S_FMA);
    ALONE("vpslld zmm", I_INIT, S_SLL);
    ALONE("vcvtdq2ps zmm", F_INIT, S_CVT);
    ALONE("vpandd zmm", I_INIT, S_AND);
    ALONE("vpermps zmm", F_INIT, S_PERM);
    printf("paired with vpdpbusd zmm (1 = separate pipes, 2 = shared):\n");
    PAIRED("vfmadd231ps", O_FMA);
    PAIRED("vpslld", O_SLL);
    PAIRED("vcvtdq2ps", O_CVT);
    PAIRED("vpandd", O_AND);
    PAIRED("vpaddd", O_ADD);
    PAIRED("vpermps", O_PERM);
    if (sink == 12345)
        printf(" \n");
}

/* The production matvec from cache: cycles per 64-byte block of a row. */
static void matvec_from_cache(void)
{
    const mx_qkernels *k = mx_qkernels_get("avx512vnni");
    if (!k) {
        printf("matvec: avx512vnni kernels not available on this CPU\n");
        return;
    }
    printf("avx512vnni matvec, 64 rows of 4-bit g64 f16 weights (from L1/L2), 1 thread:\n");
    const int64_t lens[] = {1408, 2048, 4096, 8192};
    for (int li = 0; li < 4; li++) {
        const int64_t rows = 64, cols = lens[li];
        const size_t nw = (size_t)(rows * cols / 2), ng = (size_t)(rows * cols / 64);
        uint8_t *w = malloc(nw);
        uint16_t *sb = malloc(2 * ng * sizeof *sb);
        float *x = malloc(sizeof *x * (size_t)cols), *y = malloc(sizeof *y * (size_t)rows);
        void *xp = aligned_alloc(64, (k->prep_bytes(cols, 64) + 63) / 64 * 64);
        if (!w || !sb || !x || !y || !xp) {
            fprintf(stderr, "bench_isa: out of memory\n");
            exit(1);
        }
        srand(7);
        for (size_t i = 0; i < nw; i++)
            w[i] = (uint8_t)rand();
        for (size_t i = 0; i < 2 * ng; i++)
            sb[i] = i < ng ? 0x2000 : 0xa000;   /* f16 scales ~0.008, biases ~-0.008 */
        for (int64_t i = 0; i < cols; i++)
            x[i] = (float)(rand() % 2001 - 1000) / 300.0f;
        mx_qmat m = {.w = w, .scales = sb, .biases = sb + ng, .rows = rows, .cols = cols,
                     .bits = 4, .group_size = 64, .sdtype = MX_F16};
        k->prep(x, cols, 64, xp);
        const long reps = 400000000 / (long)nw;
        double best = 1e30;
        for (int r = 0; r < 5; r++) {
            double t0 = now();
            for (long i = 0; i < reps; i++)
                k->matvec_rows(&m, x, xp, y, 0, rows);
            double t = now() - t0;
            if (t < best)
                best = t;
        }
        const double blocks = (double)nw / 64.0 * (double)reps;
        printf("  row of %5lld values: %5.2f cycles per 64-byte block (bound 7), %5.1f GB/s\n",
               (long long)cols, best * g_ghz * 1e9 / blocks,
               ((double)nw + 4.0 * (double)ng) * (double)reps / best / 1e9);
        free(w), free(sb), free(x), free(y), free(xp);
    }
}

int main(void)
{
    if (!__builtin_cpu_supports("avx512vnni") || !__builtin_cpu_supports("avx512bw")) {
        printf("bench_isa: this CPU has no AVX-512 VNNI; nothing to measure\n");
        return 0;
    }
    g_ghz = clock_ghz();
    printf("clock: %.2f GHz (dependent scalar adds)\n", g_ghz);
    instructions();
    matvec_from_cache();
    return 0;
}
#else
int main(void)
{
    printf("bench_isa: built without AVX-512 VNNI (not x86-64, or not through CMake)\n");
    return 0;
}
#endif
