/* linear.c - y = W x (+ bias) for quantized or plain float weights.
 * Float weights (routers, shared-expert gates) are small, so they use a plain
 * row loop with four partial sums, threaded over rows. */
#include <omp.h>
#include <stdlib.h>

#include "quant/qint.h"
#include "util/parallel.h"
#include "util/scratch.h"

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
        /* F16 / BF16 routers and gates: small, so the plain element read */
        const int64_t base = r * cols;
        for (; c + 4 <= cols; c += 4) {
            a0 += mx_dtype_get(w, t, base + c) * x[c];
            a1 += mx_dtype_get(w, t, base + c + 1) * x[c + 1];
            a2 += mx_dtype_get(w, t, base + c + 2) * x[c + 2];
            a3 += mx_dtype_get(w, t, base + c + 3) * x[c + 3];
        }
        for (; c < cols; c++)
            a0 += mx_dtype_get(w, t, base + c) * x[c];
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


static size_t slot_bytes(const mx_qkernels *k, int64_t cols)
{
    size_t b = 0;
    for (int gs = 32; gs <= 128; gs *= 2)
        if (cols % gs == 0 && mx_align64(k->prep_bytes(cols, gs)) > b)
            b = mx_align64(k->prep_bytes(cols, gs));
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

/* ---- threaded wrappers -------------------------------------------------- */

/* Rows per scheduling unit: SIMD matmul tiles are 16/32 rows, so chunk
 * boundaries on multiples of 32 never split a tile. */
#define MX_ROW_CHUNK 32

static int threads_for(int64_t rows, double work)
{
    int nth = mx_threads();
    int64_t chunks = (rows + MX_ROW_CHUNK - 1) / MX_ROW_CHUNK;
    if (nth > chunks)
        nth = (int)chunks;
    /* A parallel region costs a few microseconds: not worth it for tiny work. */
    if (work < 32768)
        nth = 1;
    return nth < 1 ? 1 : nth;
}

static void chunk_range(int64_t rows, int ith, int nth, int64_t *r0, int64_t *r1)
{
    long chunks = (long)((rows + MX_ROW_CHUNK - 1) / MX_ROW_CHUNK), lo, hi;
    mx_split(chunks, ith, nth, &lo, &hi);
    *r0 = lo * MX_ROW_CHUNK;
    *r1 = hi * MX_ROW_CHUNK < rows ? hi * MX_ROW_CHUNK : rows;
}

/* Slow path for when no prep buffer can be had (out of memory). */
static void matvec_direct(const mx_qmat *m, const float *x, float *y)
{
    for (int64_t r = 0; r < m->rows; r++) {
        float acc = 0;
        for (int64_t c = 0; c < m->cols; c++)
            acc += mx_qmat_get(m, r, c) * x[c];
        y[r] = acc;
    }
}

void mx_qmatvec(const mx_qmat *m, const float *x, float *y)
{
    const mx_qkernels *k = mx_qkernels_active();
    /* x is prepared once, then shared by all threads' row ranges */
    _Alignas(64) unsigned char stackbuf[32768];
    size_t nb = k->prep_bytes(m->cols, m->group_size);
    void *xp = nb <= sizeof stackbuf ? (void *)stackbuf : aligned_alloc(64, (nb + 63) & ~(size_t)63);
    if (!xp) {
        matvec_direct(m, x, y);
        return;
    }
    k->prep(x, m->cols, m->group_size, xp);
    int nth = threads_for(m->rows, (double)m->rows * (double)m->cols);
    if (nth == 1) {
        k->matvec_rows(m, x, xp, y, 0, m->rows);
    } else {
#pragma omp parallel num_threads(nth)
        {
            /* the team may be smaller than asked (nested regions) */
            int64_t r0, r1;
            chunk_range(m->rows, omp_get_thread_num(), omp_get_num_threads(), &r0, &r1);
            if (r1 > r0)
                k->matvec_rows(m, x, xp, y + r0, r0, r1);
        }
    }
    if (xp != (void *)stackbuf)
        free(xp);
}

void mx_qmatmul(const mx_qmat *m, const float *X, int64_t T, float *Y)
{
    if (T <= 0)
        return;
    if (T == 1) {
        mx_qmatvec(m, X, Y);
        return;
    }
    /* the activations are prepared once (a mx_batch), split over the
     * threads by token, then every thread runs its rows against all of
     * them; a small batch (a batched decode step) fits on the stack */
    size_t nb = mx_batch_bytes(T, m->cols, m->group_size);
    _Alignas(64) unsigned char stackbuf[65536];
    unsigned char *buf = nb <= sizeof stackbuf ? stackbuf : aligned_alloc(64, (nb + 63) & ~(size_t)63);
    if (!buf) {
        /* no memory for the batch: the variant's own matmul, one thread */
        mx_qkernels_active()->matmul_rows(m, X, m->cols, T, Y, m->rows, 0, m->rows);
        return;
    }
    mx_batch b;
    mx_batch_init(&b, X, m->cols, T, m->cols, m->group_size, buf);
    int nth = threads_for(m->rows, (double)m->rows * (double)m->cols * (double)T);
#pragma omp parallel num_threads(nth)
    {
        const int ith = omp_get_thread_num(), nt = omp_get_num_threads();
        long t0, t1;
        mx_split((long)T, ith, nt, &t0, &t1);
        mx_batch_prep(&b, t0, t1);
#pragma omp barrier
        int64_t r0, r1;
        chunk_range(m->rows, ith, nt, &r0, &r1);
        mx_qmat_rows_batch(m, &b, Y, m->rows, r0, r1);
    }
    if (buf != stackbuf)
        free(buf);
}
