/* attend.c - one head of softmax attention over the KV cache.
 *
 * At a few hundred positions the scores' exponentials cost as much as the
 * two dot-product passes (a libm expf per position does not vectorize), so
 * the exponential here is a polynomial the compiler vectorizes, and the
 * function is built for AVX-512, AVX2 and plain x86-64, picked at run time
 * (the rest of src/model is built for plain x86-64).
 *
 * exp(x) = 2^n * exp(r), n = round(x / ln 2), r = x - n ln 2 split in two
 * constants (n * LN2_HI is exact for the n that occur), exp(r) for
 * |r| <= ln2/2 by its Taylor series to r^7 (truncation 5e-9 relative), the
 * 2^n put into the exponent bits.  Within 2 ulp of expf for x in
 * [-87, 0] (tests/test_attend.c); below that the weights are 0, as their
 * share of the sum is below float resolution anyway. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "model/ops.h"

#if defined(__x86_64__) && (defined(__clang__) || defined(__GNUC__))
#define MX_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define MX_CLONES
#endif

static inline float exp_neg(float x)
{
    const float LOG2E = 1.44269504088896341f, LN2_HI = 0.693359375f, LN2_LO = -2.12194440e-4f;
    float xc = x < -87.0f ? -87.0f : x;           /* keeps 2^n normal */
    /* round to nearest by the 1.5 * 2^23 trick: vectorizes on every ISA
     * (nearbyintf does not before SSE4.1); |xc * LOG2E| < 2^22 */
    const float MAGIC = 12582912.0f;
    float n = (xc * LOG2E + MAGIC) - MAGIC;
    float r = (xc - n * LN2_HI) - n * LN2_LO;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;      /* 2^n, n in [-126, 0] */
    float two_n;
    memcpy(&two_n, &bits, sizeof two_n);
    return x < -87.0f ? 0.0f : p * two_n;
}

float mx_expf_neg(float x) { return exp_neg(x); }

/* Static, with a plain wrapper below: clang 14 does not export a
 * target_clones function under its own name. */
MX_CLONES
static void attend(const float *q, const float *K, const float *V, int start, int pos, int hd,
                   float scale, float *sc, float *out)
{
    float mx = -INFINITY;
    for (int j = start; j <= pos; j++) {
        const float *kj = K + (size_t)j * hd;
        float d = 0.0f;
#pragma omp simd reduction(+ : d)
        for (int i = 0; i < hd; i++)
            d += q[i] * kj[i];
        sc[j] = d * scale;
        if (sc[j] > mx)
            mx = sc[j];
    }
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int j = start; j <= pos; j++) {
        sc[j] = exp_neg(sc[j] - mx);
        sum += sc[j];
    }
    memset(out, 0, sizeof(float) * (size_t)hd);
    for (int j = start; j <= pos; j++) {
        const float p = sc[j] / sum;   /* divided, as torch's softmax does */
        const float *vj = V + (size_t)j * hd;
#pragma omp simd
        for (int i = 0; i < hd; i++)
            out[i] += p * vj[i];
    }
}

void mx_attend_run_avx512(const float *q, size_t ldq, int nq, const float *K, const float *V,
                          const int *start, int pos0, int hd, float scale, float *sc, size_t ldsc,
                          float *out, size_t ldo);

/* Whether attend_avx512.c serves this head width on this CPU: decided
 * once, so that a prompt and a token alone take the same path. */
static int use_avx512(int hd)
{
#if defined(__x86_64__) && (defined(__clang__) || defined(__GNUC__))
    static int has = -1;
    if (has < 0)
        has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma");
    return has && hd % 16 == 0;
#else
    (void)hd;
    return 0;
#endif
}

void mx_attend_run(const float *q, size_t ldq, int nq, const float *K, const float *V,
                   const int *start, int pos0, int hd, float scale, float *sc, size_t ldsc,
                   float *out, size_t ldo)
{
#if defined(__x86_64__) && (defined(__clang__) || defined(__GNUC__))
    if (use_avx512(hd)) {
        mx_attend_run_avx512(q, ldq, nq, K, V, start, pos0, hd, scale, sc, ldsc, out, ldo);
        return;
    }
#endif
    for (int b = 0; b < nq; b++)
        attend(q + (size_t)b * ldq, K, V, start[b], pos0 + b, hd, scale, sc, out + (size_t)b * ldo);
}

void mx_attend_head(const float *q, const float *K, const float *V, int start, int pos, int hd,
                    float scale, float *sc, float *out)
{
    mx_attend_run(q, 0, 1, K, V, &start, pos, hd, scale, sc, 0, out, 0);
}
