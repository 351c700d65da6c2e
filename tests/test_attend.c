/* test_attend.c - one head of attention (src/model/attend.c): its
 * exponential against expf over the whole range the softmax feeds it, and
 * the head's output against a double-precision softmax attention for
 * random heads of several widths, lengths and windows. */
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

int main(void)
{
    test_exp();
    static const int hds[] = {32, 64, 96, 128, 256};
    static const int lens[] = {0, 1, 7, 150, 1000};
    for (size_t h = 0; h < sizeof hds / sizeof hds[0]; h++)
        for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++) {
            test_head(hds[h], lens[l], 0);
            if (lens[l] > 4)
                test_head(hds[h], lens[l], lens[l] / 2);   /* a sliding window */
        }
    return test_summary();
}
