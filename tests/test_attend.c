/* test_attend.c - one head of attention (src/model/attend.c): its
 * exponential against expf over the whole range the softmax feeds it, the
 * head's output against a double-precision softmax attention for random
 * heads of several widths, lengths and windows, and a run of queries at
 * consecutive positions (mx_attend_run, a prompt's piece) against each
 * query alone, bit for bit. */
#include "test.h"

#include <stdint.h>
#include <string.h>

#include "model/ops.h"

static unsigned long long seed = 7;

/* distance in ulp between two finite floats of the same sign */
static int64_t ulp_diff(float a, float b)
{
    int32_t ia, ib;
    memcpy(&ia, &a, 4);
    memcpy(&ib, &b, 4);
    int64_t d = (int64_t)ia - ib;
    return d < 0 ? -d : d;
}

static void test_exp(void)
{
    /* every 97th float in [-87, 0], and the edges */
    int64_t worst = 0;
    float at = 0;
    for (float x = 0.0f; x > -87.0f; x = nextafterf(x, -INFINITY)) {
        float ref = expf(x), got = mx_expf_neg(x);
        int64_t d = ulp_diff(got, ref);
        if (d > worst)
            worst = d, at = x;
        for (int s = 0; s < 96 && x > -87.0f; s++)
            x = nextafterf(x, -INFINITY);
    }
    printf("mx_expf_neg: worst %lld ulp (at %g) against expf on [-87, 0]\n", (long long)worst, at);
    CHECKF(worst <= 2, "mx_expf_neg is %lld ulp from expf at %g", (long long)worst, at);
    CHECK(mx_expf_neg(0.0f) == 1.0f);
    CHECK(mx_expf_neg(-88.0f) == 0.0f && mx_expf_neg(-1e30f) == 0.0f && mx_expf_neg(-INFINITY) == 0.0f);
}

static void test_head(int hd, int pos, int start)
{
    float *K = malloc(sizeof(float) * (size_t)(pos + 1) * hd), *V = malloc(sizeof(float) * (size_t)(pos + 1) * hd);
    float *q = malloc(sizeof(float) * hd), *out = malloc(sizeof(float) * hd), *sc = malloc(sizeof(float) * (pos + 1));
    for (int i = 0; i < (pos + 1) * hd; i++) {
        K[i] = test_randf(&seed) * 2;
        V[i] = test_randf(&seed);
    }
    for (int i = 0; i < hd; i++)
        q[i] = test_randf(&seed) * 2;
    const float scale = 1.0f / sqrtf((float)hd);
    mx_attend_head(q, K, V, start, pos, hd, scale, sc, out);
    /* double reference */
    double *s = malloc(sizeof(double) * (pos + 1)), mx = -INFINITY, sum = 0, worst = 0, norm = 0;
    for (int j = start; j <= pos; j++) {
        double d = 0;
        for (int i = 0; i < hd; i++)
            d += (double)q[i] * K[(size_t)j * hd + i];
        s[j] = d * scale;
        if (s[j] > mx)
            mx = s[j];
    }
    for (int j = start; j <= pos; j++)
        sum += (s[j] = exp(s[j] - mx));
    for (int i = 0; i < hd; i++) {
        double o = 0;
        for (int j = start; j <= pos; j++)
            o += s[j] / sum * V[(size_t)j * hd + i];
        if (fabs(o - out[i]) > worst)
            worst = fabs(o - out[i]);
        if (fabs(o) > norm)
            norm = fabs(o);
    }
    /* out is a weighted mean of V rows: float rounding over up to 1000
     * terms stays far below 4e-6 of the largest |V| (0.5), while a wrong
     * exponential, scale or window is off by 1e-3 or more */
    CHECKF(worst <= 2e-6, "attention hd=%d pos=%d start=%d: %g off (max |out| %g)", hd, pos, start,
           worst, norm);
    free(K), free(V), free(q), free(out), free(sc), free(s);
}

/* nq queries at pos0 .. pos0+nq-1 (window w, 0 for none) in one call:
 * every output the same bits as the query alone (mx_attend_head), and
 * within 2e-6 of the double reference through test_head's check. */
static void test_run(int hd, int pos0, int nq, int w)
{
    const int n = pos0 + nq;
    float *K = malloc(sizeof(float) * (size_t)n * hd), *V = malloc(sizeof(float) * (size_t)n * hd);
    float *q = malloc(sizeof(float) * (size_t)nq * hd * 2), *out = malloc(sizeof(float) * (size_t)nq * hd * 3);
    float *one = malloc(sizeof(float) * hd), *sc = malloc(sizeof(float) * (size_t)nq * (n + 3));
    int st[8] = {0};
    for (int i = 0; i < n * hd; i++) {
        K[i] = test_randf(&seed) * 2;
        V[i] = test_randf(&seed);
    }
    for (int i = 0; i < nq * hd * 2; i++)
        q[i] = test_randf(&seed) * 2;
    for (int b = 0; b < nq; b++)
        st[b] = w && pos0 + b - w + 1 > 0 ? pos0 + b - w + 1 : 0;
    /* strided rows, as a prompt's heads: q every 2*hd, out every 3*hd */
    mx_attend_run(q, 2 * (size_t)hd, nq, K, V, st, pos0, hd, 0.125f, sc, (size_t)n + 3, out, 3 * (size_t)hd);
    int differ = 0;
    for (int b = 0; b < nq; b++) {
        mx_attend_head(q + (size_t)b * 2 * hd, K, V, st[b], pos0 + b, hd, 0.125f, sc, one);
        differ += memcmp(one, out + (size_t)b * 3 * hd, sizeof(float) * hd) != 0;
    }
    CHECKF(differ == 0, "run of %d at %d (hd %d, window %d): %d queries differ from alone", nq, pos0, hd, w,
           differ);
    free(K), free(V), free(q), free(out), free(one), free(sc);
}

int main(void)
{
    test_exp();
    static const int hds[] = {32, 40, 64, 96, 128, 256};
    static const int lens[] = {0, 1, 7, 150, 1000};
    for (size_t h = 0; h < sizeof hds / sizeof hds[0]; h++)
        for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++) {
            test_head(hds[h], lens[l], 0);
            if (lens[l] > 4)
                test_head(hds[h], lens[l], lens[l] / 2);   /* a sliding window */
        }
    static const int runs[][3] = {{0, 1, 0},   {0, 8, 0},   {3, 5, 0},   {15, 2, 0},  {16, 8, 0},
                                  {17, 7, 0},  {100, 8, 0}, {100, 8, 5}, {100, 8, 1}, {63, 3, 17},
                                  {500, 8, 0}, {500, 8, 64}};
    for (size_t h = 0; h < sizeof hds / sizeof hds[0]; h++)
        for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++)
            test_run(hds[h], runs[r][0], runs[r][1], runs[r][2]);
    test_run(40, 40, 8, 0);   /* not a multiple of 16: the portable loop */
    test_run(72, 40, 8, 9);
    test_run(80, 40, 8, 9);   /* 5 chunks of 16 */
    return test_summary();
}
