/* fixture_cmp.h - what the tests that check a model against the reference
 * fixtures share: a reference tensor by name, the largest difference, the
 * top-k and argmax of a logit row. */
#ifndef MX_TEST_FIXTURE_CMP_H
#define MX_TEST_FIXTURE_CMP_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "format/safetensors.h"
#include "test.h"

/* A tensor of the reference file; a missing one is a failed check. */
static inline const mx_tensor *ref(const mx_st_set *r, const char *name)
{
    const mx_tensor *t = mx_st_find(r, name);
    CHECKF(t != NULL, "reference tensor %s missing", name);
    return t;
}

/* max |a - b|; infinite when either holds a NaN */
static inline double max_abs_diff(const float *a, const float *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d > m || d != d)
            m = d != d ? INFINITY : d;
    }
    return m;
}

static inline double max_abs(const float *a, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++)
        if (fabs(a[i]) > m)
            m = fabs(a[i]);
    return m;
}

/* top-k ids of x[n] (descending, lower index on ties) */
static inline void topk(const float *x, int n, int k, int *out)
{
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int i = 0; i < n; i++) {
            int used = 0;
            for (int q = 0; q < j; q++)
                used |= out[q] == i;
            if (!used && (best < 0 || x[i] > x[best]))
                best = i;
        }
        out[j] = best;
    }
}

/* the first id of the largest value */
static inline int32_t argmax(const float *x, int n)
{
    int32_t b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b])
            b = i;
    return b;
}

#endif
