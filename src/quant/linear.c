/* linear.c - y = W x (+ bias) for quantized or plain float weights.
 * Float weights (routers, shared-expert gates) are small, so they use a plain
 * row loop with four partial sums, threaded over rows. */
#include <omp.h>

#include "quant/qint.h"
#include "util/parallel.h"

static float dot_row(const void *w, mx_dtype t, int64_t r, int64_t cols, const float *x)
{
    float a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    int64_t c = 0;
    if (t == MX_F32) {
        const float *p = (const float *)w + r * cols;
        for (; c + 4 <= cols; c += 4) {
            a0 += p[c] * x[c];
            a1 += p[c + 1] * x[c + 1];
            a2 += p[c + 2] * x[c + 2];
            a3 += p[c + 3] * x[c + 3];
        }
        for (; c < cols; c++)
            a0 += p[c] * x[c];
    } else {
        const uint16_t *p = (const uint16_t *)w + r * cols;
        int bf = t == MX_BF16;
#define CV(i) (bf ? mx_bf16_to_f32(p[i]) : mx_f16_to_f32(p[i]))
        for (; c + 4 <= cols; c += 4) {
            a0 += CV(c) * x[c];
            a1 += CV(c + 1) * x[c + 1];
            a2 += CV(c + 2) * x[c + 2];
            a3 += CV(c + 3) * x[c + 3];
        }
        for (; c < cols; c++)
            a0 += CV(c) * x[c];
#undef CV
    }
    return (a0 + a1) + (a2 + a3);
}

/* Y[t*rows + r] for t < T, r in [r0, r1), float weights. */
static void float_rows(const mx_linear *l, const float *X, int64_t T, float *Y,
                       int64_t r0, int64_t r1)
{
    for (int64_t t = 0; t < T; t++)
        for (int64_t r = r0; r < r1; r++)
            Y[t * l->rows + r] = dot_row(l->w, l->wdtype, r, l->cols, X + t * l->cols);
}

static void float_matmul(const mx_linear *l, const float *X, int64_t T, float *Y)
{
    int nth = mx_threads();
    if ((double)l->rows * (double)l->cols * (double)T < 65536 || nth < 2 || l->rows < 2) {
        float_rows(l, X, T, Y, 0, l->rows);
        return;
    }
#pragma omp parallel num_threads(nth)
    {
        long lo, hi;
        mx_split((long)l->rows, omp_get_thread_num(), omp_get_num_threads(), &lo, &hi);
        if (hi > lo)
            float_rows(l, X, T, Y, lo, hi);
    }
}

static void add_bias(const mx_linear *l, int64_t T, float *Y)
{
    if (!l->bias)
        return;
    int64_t rows = l->quantized ? l->q.rows : l->rows;
    for (int64_t t = 0; t < T; t++)
        for (int64_t r = 0; r < rows; r++)
            Y[t * rows + r] += l->bias[r];
}

void mx_linear_matvec(const mx_linear *l, const float *x, float *y)
{
    if (l->quantized)
        mx_qmatvec(&l->q, x, y);
    else
        float_matmul(l, x, 1, y);
    add_bias(l, 1, y);
}

void mx_linear_matmul(const mx_linear *l, const float *X, int64_t T, float *Y)
{
    if (T <= 0)
        return;
    if (l->quantized)
        mx_qmatmul(&l->q, X, T, Y);
    else
        float_matmul(l, X, T, Y);
    add_bias(l, T, Y);
}

/* ---- prepared vectors and row ranges ------------------------------------ */

static size_t al64(size_t n) { return (n + 63) & ~(size_t)63; }

static size_t slot_bytes(const mx_qkernels *k, int64_t cols)
{
    size_t b = 0;
    for (int gs = 32; gs <= 128; gs *= 2)
        if (cols % gs == 0 && al64(k->prep_bytes(cols, gs)) > b)
            b = al64(k->prep_bytes(cols, gs));
    return b;
}

size_t mx_vec_bytes(int64_t cols) { return 3 * slot_bytes(mx_qkernels_active(), cols); }

void mx_vec_init(mx_vec *v, const float *x, int64_t cols, void *buf)
{
    v->x = x;
    v->cols = cols;
    v->buf = buf;
    v->k = mx_qkernels_active();
    v->slot = slot_bytes(v->k, cols);
    v->ready = 0;
}

const void *mx_vec_prep(mx_vec *v, int gs)
{
    const int i = gs == 32 ? 0 : gs == 64 ? 1 : 2;
    unsigned char *p = v->buf + (size_t)i * v->slot;
    if (!(v->ready & (1u << i))) {
        v->k->prep(v->x, v->cols, gs, p);
        v->ready |= 1u << i;
    }
    return p;
}

void mx_linear_rows(const mx_linear *l, mx_vec *x, float *y, int64_t r0, int64_t r1)
{
    if (r1 <= r0)
        return;
    if (l->quantized)
        x->k->matvec_rows(&l->q, x->x, mx_vec_prep(x, l->q.group_size), y + r0, r0, r1);
    else
        for (int64_t r = r0; r < r1; r++)
            y[r] = dot_row(l->w, l->wdtype, r, l->cols, x->x);
    if (l->bias)
        for (int64_t r = r0; r < r1; r++)
            y[r] += l->bias[r];
}

void mx_linear_rows_batch(const mx_linear *l, const mx_batch *b, float *Y, int64_t ldy,
                          int64_t r0, int64_t r1)
{
    if (r1 <= r0)
        return;
    if (l->quantized)
        mx_qmat_rows_batch(&l->q, b, Y, ldy, r0, r1);
    else
        for (int64_t t = 0; t < b->T; t++)
            for (int64_t r = r0; r < r1; r++)
                Y[t * ldy + r] = dot_row(l->w, l->wdtype, r, l->cols, b->X + t * b->ldx);
    if (l->bias)
        for (int64_t t = 0; t < b->T; t++)
            for (int64_t r = r0; r < r1; r++)
                Y[t * ldy + r] += l->bias[r];
}

size_t mx_linear_bytes(const mx_linear *l)
{
    size_t n = l->quantized ? mx_qmat_bytes(&l->q)
                            : (size_t)(l->rows * l->cols) * mx_dtype_size(l->wdtype);
    if (l->bias)
        n += (size_t)(l->quantized ? l->q.rows : l->rows) * sizeof(float);
    return n;
}
