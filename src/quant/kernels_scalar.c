/* kernels_scalar.c - the reference: dequantization of one value or row,
 * group sums, and the scalar kernels (plain C, every bit width, written to
 * be obviously correct rather than fast).  SIMD variants are tested
 * against these. */
#include <math.h>
#include <stdlib.h>

#include "quant/qint.h"

/* ---- reference dequantization ------------------------------------------ */

float mx_qmat_get(const mx_qmat *m, int64_t r, int64_t c)
{
    int64_t g = r * mx_qmat_groups(m) + c / m->group_size;
    float s = mx_q_scalar_at(m->scales, m->sdtype, g);
    float b = mx_q_scalar_at(m->biases, m->sdtype, g);
    return s * (float)mx_q_value(mx_q_row_ptr(m, r), m->bits, c) + b;
}

void mx_q_dequant_generic(const mx_qmat *m, int64_t r, int64_t k0, int64_t n, float *out)
{
    const uint8_t *row = mx_q_row_ptr(m, r);
    int gs = m->group_size;
    uint8_t q[128];
    for (int64_t k = k0; k < k0 + n; k += gs) {
        int64_t g = r * mx_qmat_groups(m) + k / gs;
        float s = mx_q_scalar_at(m->scales, m->sdtype, g);
        float b = mx_q_scalar_at(m->biases, m->sdtype, g);
        mx_q_unpack(row, m->bits, k, gs, q);
        for (int j = 0; j < gs; j++)
            out[k - k0 + j] = s * (float)q[j] + b;
    }
}

void mx_qmat_row(const mx_qmat *m, int64_t r, float *out)
{
    mx_q_dequant_generic(m, r, 0, m->cols, out);
}

void mx_group_sums(const float *x, int64_t cols, int group_size, float *out)
{
    for (int64_t g = 0; g < cols / group_size; g++) {
        const float *p = x + g * group_size;
        /* four partial sums: same association in every variant's caller */
        float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        for (int j = 0; j < group_size; j += 4) {
            s0 += p[j];
            s1 += p[j + 1];
            s2 += p[j + 2];
            s3 += p[j + 3];
        }
        out[g] = (s0 + s1) + (s2 + s3);
    }
}

size_t mx_q_sums_bytes(int64_t cols, int group_size)
{
    return (size_t)(cols / group_size) * sizeof(float);
}

void mx_q_sums_prep(const float *x, int64_t cols, int group_size, void *buf)
{
    mx_group_sums(x, cols, group_size, buf);
}


/* y[r - r0] = sum_g s_g * sum_{c in g} q[r][c] x[c] + b_g * xsum[g] */
static void matvec_rows_scalar(const mx_qmat *m, const float *x, const void *xp,
                               float *y, int64_t r0, int64_t r1)
{
    const float *xsum = xp;   /* prep: the group sums */
    int gs = m->group_size;
    int64_t ng = mx_qmat_groups(m);
    uint8_t q[128];
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = mx_q_row_ptr(m, r);
        float acc = 0;
        for (int64_t g = 0; g < ng; g++) {
            mx_q_unpack(row, m->bits, g * gs, gs, q);
            const float *xg = x + g * gs;
            float d = 0;
            for (int j = 0; j < gs; j++)
                d += (float)q[j] * xg[j];
            float s = mx_q_scalar_at(m->scales, m->sdtype, r * ng + g);
            float b = mx_q_scalar_at(m->biases, m->sdtype, r * ng + g);
            acc += s * d + b * xsum[g];
        }
        y[r - r0] = acc;
    }
}

/* Direct form: dequantize every weight and multiply (a different formula
 * from matvec on purpose, so the two check each other). */
static void matmul_rows_scalar(const mx_qmat *m, const float *X, int64_t ldx, int64_t T,
                               float *Y, int64_t ldy, int64_t r0, int64_t r1)
{
    int gs = m->group_size;
    int64_t ng = mx_qmat_groups(m);
    float w[128];
    for (int64_t r = r0; r < r1; r++) {
        for (int64_t t = 0; t < T; t++)
            Y[t * ldy + r] = 0;
        for (int64_t g = 0; g < ng; g++) {
            mx_q_dequant_generic(m, r, g * gs, gs, w);
            for (int64_t t = 0; t < T; t++) {
                const float *xg = X + t * ldx + g * gs;
                float d = 0;
                for (int j = 0; j < gs; j++)
                    d += w[j] * xg[j];
                Y[t * ldy + r] += d;
            }
        }
    }
}

const mx_qkernels mx_qk_scalar = {
    .name = "scalar",
    .prep_bytes = mx_q_sums_bytes,
    .prep = mx_q_sums_prep,
    .matvec_rows = matvec_rows_scalar,
    .matmul_rows = matmul_rows_scalar,
};

/* ---- the fast precision's reference ---------------------------------------- */

/* The prepared x of the fast precision: the exact group sums, each group's
 * step dx = amax / 127 and x as int8 q = round(x / dx) (round to nearest
 * even, as the SIMD conversion), clamped to [-127, 127]. */
static size_t prep_bytes_fast(int64_t cols, int gs)
{
    const size_t ng = (size_t)(cols / gs);
    return 2 * ng * sizeof(float) + (size_t)cols;
}

static void prep_fast(const float *x, int64_t cols, int gs, void *buf)
{
    const int64_t ng = cols / gs;
    float *xsum = buf, *dx = xsum + ng;
    int8_t *q = (int8_t *)(dx + ng);
    mx_group_sums(x, cols, gs, xsum);
    for (int64_t g = 0; g < ng; g++) {
        const float *xg = x + g * gs;
        float amax = 0.0f;
        int nan = 0;
        for (int j = 0; j < gs; j++) {
            amax = fabsf(xg[j]) > amax ? fabsf(xg[j]) : amax;
            nan |= xg[j] != xg[j];
        }
        if (nan)
            amax = NAN;
        const int finite = amax < INFINITY;
        const float inv = finite && amax > 0 ? 127.0f / amax : 0.0f;
        for (int j = 0; j < gs; j++) {
            long v = lrintf(xg[j] * inv);
            q[g * gs + j] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
        }
        dx[g] = finite ? amax / 127.0f : amax;
    }
}

/* y[r - r0] = sum_g s_g dx_g (sum_c q_w[c] q_x[c]) + b_g xsum_g: the
 * integer dot is exact, only the float sum's order differs from SIMD. */
static void matvec_rows_fast(const mx_qmat *m, const float *x, const void *xp, float *y,
                             int64_t r0, int64_t r1)
{
    (void)x;
    const int gs = m->group_size;
    const int64_t ng = mx_qmat_groups(m);
    const float *xsum = xp, *dx = xsum + ng;
    const int8_t *qx = (const int8_t *)(dx + ng);
    uint8_t q[128];
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = mx_q_row_ptr(m, r);
        float acc = 0;
        for (int64_t g = 0; g < ng; g++) {
            mx_q_unpack(row, m->bits, g * gs, gs, q);
            int32_t d = 0;
            for (int j = 0; j < gs; j++)
                d += (int32_t)q[j] * qx[g * gs + j];
            const float s = mx_q_scalar_at(m->scales, m->sdtype, r * ng + g);
            const float b = mx_q_scalar_at(m->biases, m->sdtype, r * ng + g);
            acc += s * dx[g] * (float)d + b * xsum[g];
        }
        y[r - r0] = acc;
    }
}

/* T tokens, each prepared and run through matvec_rows_fast. */
static void matmul_rows_fast(const mx_qmat *m, const float *X, int64_t ldx, int64_t T, float *Y,
                             int64_t ldy, int64_t r0, int64_t r1)
{
    void *xp = malloc(prep_bytes_fast(m->cols, m->group_size));
    float *y = malloc(sizeof(float) * (size_t)(r1 - r0 > 0 ? r1 - r0 : 1));
    for (int64_t t = 0; xp && y && t < T; t++) {
        prep_fast(X + t * ldx, m->cols, m->group_size, xp);
        matvec_rows_fast(m, X + t * ldx, xp, y, r0, r1);
        for (int64_t r = r0; r < r1; r++)
            Y[t * ldy + r] = y[r - r0];
    }
    if (!xp || !y)   /* no memory: the exact reference */
        matmul_rows_scalar(m, X, ldx, T, Y, ldy, r0, r1);
    free(xp);
    free(y);
}

const mx_qkernels mx_qk_scalar_fast = {
    .name = "scalar-fast",
    .fast = 1,
    .prep_bytes = prep_bytes_fast,
    .prep = prep_fast,
    .matvec_rows = matvec_rows_fast,
    .matmul_rows = matmul_rows_fast,
};
