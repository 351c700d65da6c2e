/* batch.c - T activation vectors prepared once for the kernels, then read
 * by any number of threads for any row ranges of any matrices with the same
 * columns and group size.
 *
 * Two forms, chosen by T:
 *   vectors  T <= MX_BATCH_SMALL: each vector prepared for the matvec
 *            kernels; a row range runs matvec_rows_multi, which reads each
 *            weight line once for all T (an expert picked by a few prompt
 *            tokens, a batched decode step)
 *   block    larger T, for a variant with a prefill kernel (mm_prep): the
 *            token-interleaved block that matmul_rows_prepped reads
 *   raw      larger T for the float variants: nothing to prepare up front
 *            (their matmul_rows makes its group sums itself)
 * Preparing is split by token (mx_batch_prep on [t0, t1)), so the threads
 * of a region prepare a batch together before they read it. */
#include <stdlib.h>
#include <string.h>

#include "quant/qint.h"
#include "util/scratch.h"


static int mode_for(const mx_qkernels *k, int64_t T)
{
    return T <= MX_BATCH_SMALL ? MX_BATCH_VECTORS : k->mm_prep ? MX_BATCH_BLOCK : MX_BATCH_RAW;
}

size_t mx_batch_bytes(int64_t T, int64_t cols, int gs)
{
    const mx_qkernels *k = mx_qkernels_active();
    if (T <= 0)
        return 0;
    switch (mode_for(k, T)) {
    case MX_BATCH_VECTORS: return (size_t)T * mx_align64(k->prep_bytes(cols, gs));
    case MX_BATCH_BLOCK: return mx_align64(k->mm_prep_bytes(T, cols, gs));
    default: return 0;
    }
}

void mx_batch_init(mx_batch *b, const float *X, int64_t ldx, int64_t T, int64_t cols, int gs,
                   void *buf)
{
    b->X = X;
    b->ldx = ldx;
    b->T = T;
    b->cols = cols;
    b->gs = gs;
    b->k = mx_qkernels_active();
    b->mode = mode_for(b->k, T);
    b->vstride = b->mode == MX_BATCH_VECTORS ? mx_align64(b->k->prep_bytes(cols, gs)) : 0;
    b->buf = buf;
}

void mx_batch_prep(mx_batch *b, int64_t t0, int64_t t1)
{
    if (b->mode == MX_BATCH_VECTORS)
        for (int64_t t = t0; t < t1; t++)
            b->k->prep(b->X + t * b->ldx, b->cols, b->gs, b->buf + b->vstride * (size_t)t);
    else if (b->mode == MX_BATCH_BLOCK && t1 > t0)
        b->k->mm_prep(b->X, b->ldx, b->T, t0, t1, b->cols, b->gs, b->buf);
}

/* Rows of a quantized matrix whose group size is not the batch's: each
 * vector prepared here, per call (slow, but only for mixed-group-size
 * checkpoints). */
static void rows_other_gs(const mx_qmat *m, const mx_batch *b, float *Y, int64_t ldy, int64_t r0,
                          int64_t r1)
{
    size_t nb = mx_align64(b->k->prep_bytes(m->cols, m->group_size));
    void *xp = aligned_alloc(64, nb);
    for (int64_t t = 0; t < b->T; t++) {
        const float *x = b->X + t * b->ldx;
        if (xp) {
            b->k->prep(x, m->cols, m->group_size, xp);
            b->k->matvec_rows(m, x, xp, Y + t * ldy + r0, r0, r1);
        } else {
            for (int64_t r = r0; r < r1; r++) {   /* no memory: the reference */
                float acc = 0;
                for (int64_t c = 0; c < m->cols; c++)
                    acc += mx_qmat_get(m, r, c) * x[c];
                Y[t * ldy + r] = acc;
            }
        }
    }
    free(xp);
}

void mx_qmat_rows_batch(const mx_qmat *m, const mx_batch *b, float *Y, int64_t ldy, int64_t r0,
                        int64_t r1)
{
    const mx_qkernels *k = b->k;
    if (r1 <= r0 || b->T <= 0)
        return;
    if (b->mode == MX_BATCH_RAW) {
        k->matmul_rows(m, b->X, b->ldx, b->T, Y, ldy, r0, r1);
    } else if (m->group_size != b->gs) {
        rows_other_gs(m, b, Y, ldy, r0, r1);
    } else if (b->mode == MX_BATCH_VECTORS) {
        if (k->matvec_rows_multi) {
            k->matvec_rows_multi(m, b->X, b->ldx, b->buf, b->vstride, b->T, Y + r0, ldy, r0, r1);
        } else {
            /* 32-row blocks, every vector: each block's weights stay in
             * L1 for the other vectors */
            for (int64_t c0 = r0; c0 < r1; c0 += 32) {
                int64_t c1 = c0 + 32 < r1 ? c0 + 32 : r1;
                for (int64_t t = 0; t < b->T; t++)
                    k->matvec_rows(m, b->X + t * b->ldx, b->buf + b->vstride * (size_t)t,
                                   Y + t * ldy + c0, c0, c1);
            }
        }
    } else {
        k->matmul_rows_prepped(m, b->buf, b->T, Y, ldy, r0, r1);
    }
}
