/* test_repack.c - the repacked layout of 4-bit matrices (quant.h): the
 * round trip (every element read back from the repacked form equals the
 * MLX layout's, bit for bit), its size, and every kernel variant's entry
 * points with rp set against the same variant without it and against the
 * double-precision reference. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "quant/quant.h"
#include "test.h"
#include "util/dtype.h"
#include "util/half.h"
#include "util/scratch.h"

static unsigned long long g_seed = 0x2545f4914f6cdd1dULL;

static const int k_gs[] = {32, 64, 128};
static const mx_dtype k_sdt[] = {MX_F16, MX_BF16, MX_F32};

/* A random 4-bit matrix (negative scales too: MLX writes them) with its
 * own storage and its repacked copy. */
typedef struct qbuf {
    mx_qmat m;
    uint8_t *w, *rp;
    void *s, *b;
} qbuf;

static void put_s(void *p, mx_dtype t, int64_t i, float v)
{
    if (t == MX_F16) ((uint16_t *)p)[i] = mx_f32_to_f16(v);
    else if (t == MX_BF16) ((uint16_t *)p)[i] = mx_f32_to_bf16(v);
    else ((float *)p)[i] = v;
}

static void qbuf_random(qbuf *q, int64_t rows, int64_t cols, int bits, int gs, mx_dtype sdt)
{
    memset(q, 0, sizeof *q);
    q->m = (mx_qmat){.rows = rows, .cols = cols, .bits = bits, .group_size = gs, .sdtype = sdt};
    size_t nb = (size_t)(rows * cols * bits / 8), ng = (size_t)(rows * cols / gs);
    q->w = malloc(nb);
    q->s = malloc(ng * 4);
    q->b = malloc(ng * 4);
    for (size_t i = 0; i < nb; i++)
        q->w[i] = (uint8_t)test_rand_u64(&g_seed);
    for (size_t i = 0; i < ng; i++) {
        put_s(q->s, sdt, (int64_t)i, 0.05f * test_randf(&g_seed));
        put_s(q->b, sdt, (int64_t)i, 0.5f * test_randf(&g_seed));
    }
    q->m.w = q->w;
    q->m.scales = q->s;
    q->m.biases = q->b;
    size_t rb = mx_qmat_repack_bytes(&q->m);
    if (rb) {
        q->rp = aligned_alloc(64, rb);
        memset(q->rp, 0xa5, rb);   /* repack must write every byte */
        mx_qmat_repack(&q->m, q->rp);
    }
}

static void qbuf_free(qbuf *q)
{
    free(q->w);
    free(q->s);
    free(q->b);
    free(q->rp);
}

/* The round trip and the size for one shape. */
static void check_round_trip(int gs, mx_dtype sdt, int64_t rows, int64_t cols)
{
    qbuf q;
    qbuf_random(&q, rows, cols, 4, gs, sdt);
    const size_t ss = mx_dtype_size(sdt), tiles = (size_t)((rows + 31) / 32);
    CHECKF(mx_qmat_repack_bytes(&q.m) == tiles * (size_t)(cols / gs) * (16 * (size_t)gs + 64 * ss),
           "gs=%d %s rows=%lld: %zu bytes", gs, mx_dtype_name(sdt), (long long)rows,
           mx_qmat_repack_bytes(&q.m));
    mx_qmat r = q.m;
    r.rp = q.rp;
    int bad = 0;
    for (int64_t i = 0; i < rows; i++)
        for (int64_t c = 0; c < cols; c++) {
            float a = mx_qmat_get(&q.m, i, c), b = mx_qmat_rp_get(&r, i, c);
            bad += memcmp(&a, &b, sizeof a) != 0;
        }
    CHECKF(bad == 0, "gs=%d %s rows=%lld cols=%lld: %d values differ after the round trip", gs,
           mx_dtype_name(sdt), (long long)rows, (long long)cols, bad);
    /* padding rows of the last tile read back as zero (q, scale and bias 0) */
    int64_t padded = (int64_t)tiles * 32;
    int nz = 0;
    for (int64_t i = rows; i < padded; i++)
        for (int64_t c = 0; c < cols; c += 7)
            nz += mx_qmat_rp_get(&r, i, c) != 0.0f;
    CHECKF(nz == 0, "gs=%d rows=%lld: %d padding values not zero", gs, (long long)rows, nz);
    /* deterministic: a second repack gives the same bytes */
    uint8_t *again = aligned_alloc(64, mx_qmat_repack_bytes(&q.m));
    mx_qmat_repack(&q.m, again);
    CHECK(!memcmp(again, q.rp, mx_qmat_repack_bytes(&q.m)));
    free(again);
    qbuf_free(&q);
}

static void test_round_trip(void)
{
    static const int64_t rows_list[] = {1, 5, 31, 32, 33, 100};
    for (size_t gi = 0; gi < 3; gi++)
        for (size_t si = 0; si < 3; si++)
            for (size_t ri = 0; ri < sizeof rows_list / sizeof rows_list[0]; ri++)
                check_round_trip(k_gs[gi], k_sdt[si], rows_list[ri], 3 * k_gs[gi]);
    /* no repacked layout for the other widths */
    static const int other[] = {2, 3, 5, 6, 8};
    for (size_t i = 0; i < sizeof other / sizeof other[0]; i++) {
        mx_qmat m = {.rows = 64, .cols = 256, .bits = other[i], .group_size = 64, .sdtype = MX_F16};
        CHECKF(mx_qmat_repack_bytes(&m) == 0, "bits=%d has a repacked size", other[i]);
    }
}


static void rand_vec(float *x, int64_t n, int gs)
{
    for (int64_t i = 0; i < n; i++) {
        x[i] = test_randf(&g_seed);
        if ((i / gs) % 3 == 1)   /* groups of very different magnitude */
            x[i] *= (i / gs) % 2 ? 1e-3f : 40.0f;
    }
}

/* Reference y = W x in double and the scale sum |W||x| (plus the bias
 * term's magnitude) that errors are measured against, as in test_quant. */
static void ref_matvec(const mx_qmat *m, const float *x, double *y, double *norm)
{
    const int64_t ng = m->cols / m->group_size;
    for (int64_t r = 0; r < m->rows; r++) {
        double acc = 0, n = 0;
        for (int64_t c = 0; c < m->cols; c++) {
            const double w = mx_qmat_get(m, r, c);
            acc += w * x[c];
            n += fabs(w * x[c]);
        }
        for (int64_t g = 0; g < ng; g++) {
            double bs = 0;
            for (int j = 0; j < m->group_size; j++)
                bs += fabs(x[g * m->group_size + j]);
            n += (fabs(mx_dtype_get(m->biases, m->sdtype, r * ng + g)) +
                  fabs(mx_dtype_get(m->scales, m->sdtype, r * ng + g))) * bs;
        }
        y[r] = acc;
        norm[r] = n + 1e-30;
    }
}

enum { TMAX = 200 };
static const int k_T[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 40, 200};
#define NT ((int)(sizeof k_T / sizeof k_T[0]))

typedef struct worst {
    double vs_plain, vs_ref;
} worst;
static worst g_worst[8];

/* Which of a variant's outputs to compare: the rows [r0, r1) of T tokens,
 * Y rows ldy apart; everything else must still hold the sentinel. */
typedef struct cmp {
    const char *what, *entry;
    const mx_qkernels *k;
    int vi, T;
    int64_t rows, r0, r1;
} cmp;

static void compare(const cmp *c, const float *yrp, const float *yplain, const double *ref,
                    const double *norm, int relative)
{
    const double tol = c->k->fast ? 1e-6 : 1e-5;
    double ep = 0, er = 0;
    int sentinel = 1;
    for (int t = 0; t < c->T; t++)
        for (int64_t r = 0; r < c->rows; r++) {
            const int64_t i = (int64_t)t * c->rows + r;
            if (r < c->r0 || r >= c->r1) {
                sentinel &= relative || yrp[i] == -777.0f;
                continue;
            }
            const int64_t o = relative ? (int64_t)t * c->rows + r - c->r0 : i;
            const double dp = fabs((double)yrp[o] - yplain[o]) / norm[i];
            const double dr = fabs((double)yrp[o] - ref[i]) / norm[i];
            ep = dp > ep || dp != dp ? dp : ep;
            er = dr > er || dr != dr ? dr : er;
        }
    if (c->k->fast) {
        CHECKF(ep < tol, "%s: %s %s T=%d [%lld, %lld): %.3g off the MLX layout's", c->what,
               c->k->name, c->entry, c->T, (long long)c->r0, (long long)c->r1, ep);
    } else {
        CHECKF(ep < tol && er < tol, "%s: %s %s T=%d [%lld, %lld): %.3g off the MLX layout's, "
               "%.3g off the reference", c->what, c->k->name, c->entry, c->T, (long long)c->r0,
               (long long)c->r1, ep, er);
    }
    CHECKF(sentinel, "%s: %s %s T=%d wrote outside rows [%lld, %lld)", c->what, c->k->name,
           c->entry, c->T, (long long)c->r0, (long long)c->r1);
    if (ep > g_worst[c->vi].vs_plain)
        g_worst[c->vi].vs_plain = ep;
    if (!c->k->fast && er > g_worst[c->vi].vs_ref)
        g_worst[c->vi].vs_ref = er;
}

/* Every entry point of variant k on matrix q with rp set against the same
 * entry point on the MLX layout (rp NULL) and against the reference. */
static void check_variant(const mx_qkernels *k, int vi, const qbuf *q, const float *X,
                          const double *ref, const double *norm, const char *what)
{
    const mx_qmat *plain = &q->m;
    mx_qmat rp = q->m;
    rp.rp = q->rp;
    const int64_t rows = plain->rows, cols = plain->cols;
    const int gs = plain->group_size;
    const size_t n = (size_t)(rows * TMAX);
    float *ya = malloc(n * sizeof *ya), *yb = malloc(n * sizeof *yb), *y1 = malloc(n * sizeof *y1);
    const size_t vb = mx_align64(k->prep_bytes(cols, gs));
    unsigned char *xp = aligned_alloc(64, vb * TMAX);
    for (int t = 0; t < TMAX; t++)
        k->prep(X + t * cols, cols, gs, xp + vb * (size_t)t);
    int64_t ranges[3][2] = {{0, rows}, {3, rows - 1}, {37, 70}};
    const int nr = rows > 70 ? 3 : rows > 4 ? 2 : 1;
    for (int ri = 0; ri < nr; ri++) {
        const int64_t r0 = ranges[ri][0], r1 = ranges[ri][1];
        cmp c = {.what = what, .k = k, .vi = vi, .rows = rows, .r0 = r0, .r1 = r1};
        /* matvec_rows, one vector at a time (outputs y[r - r0]) */
        c.entry = "matvec_rows";
        c.T = 1;
        k->matvec_rows(&rp, X, xp, ya, r0, r1);
        k->matvec_rows(plain, X, xp, yb, r0, r1);
        compare(&c, ya, yb, ref, norm, 1);
        memcpy(y1, ya, sizeof *ya * (size_t)(r1 - r0));
        for (int ti = 0; ti < NT; ti++) {
            const int T = k_T[ti];
            c.T = T;
            /* matvec_rows_multi (Y[t*ldy + r - r0]) */
            if (k->matvec_rows_multi && T <= 40) {
                c.entry = "matvec_rows_multi";
                for (size_t i = 0; i < n; i++)
                    ya[i] = yb[i] = -777.0f;
                k->matvec_rows_multi(&rp, X, cols, xp, vb, T, ya, rows, r0, r1);
                k->matvec_rows_multi(plain, X, cols, xp, vb, T, yb, rows, r0, r1);
                compare(&c, ya, yb, ref, norm, 1);
                /* one token's result does not depend on how many come with it */
                CHECKF(!memcmp(ya, y1, sizeof *ya * (size_t)(r1 - r0)),
                       "%s: %s matvec_rows_multi T=%d: token 0 differs from matvec_rows", what,
                       k->name, T);
            }
            /* matmul_rows (Y[t*ldy + r]) */
            c.entry = "matmul_rows";
            for (size_t i = 0; i < n; i++)
                ya[i] = yb[i] = -777.0f;
            k->matmul_rows(&rp, X, cols, T, ya, rows, r0, r1);
            k->matmul_rows(plain, X, cols, T, yb, rows, r0, r1);
            compare(&c, ya, yb, ref, norm, 0);
            /* matmul_rows_prepped through mm_prep, prepared in two halves */
            if (k->matmul_rows_prepped) {
                c.entry = "matmul_rows_prepped";
                size_t mb = k->mm_prep_bytes(T, cols, gs);
                void *mp = aligned_alloc(64, mx_align64(mb));
                k->mm_prep(X, cols, T, 0, T / 2, cols, gs, mp);
                k->mm_prep(X, cols, T, T / 2, T, cols, gs, mp);
                for (size_t i = 0; i < n; i++)
                    ya[i] = yb[i] = -777.0f;
                k->matmul_rows_prepped(&rp, mp, T, ya, rows, r0, r1);
                k->matmul_rows_prepped(plain, mp, T, yb, rows, r0, r1);
                compare(&c, ya, yb, ref, norm, 0);
                if (rp.rp && !strncmp(k->name, "avx512vnni", 10))
                    CHECKF(!memcmp(ya + r0, y1, sizeof *ya * (size_t)(r1 - r0)),
                           "%s: %s matmul_rows_prepped T=%d: token 0 differs from matvec_rows",
                           what, k->name, T);
                free(mp);
            }
        }
    }
    free(ya), free(yb), free(y1), free(xp);
}

static void check_kernels(int gs, mx_dtype sdt, int64_t rows, int64_t cols)
{
    qbuf q;
    qbuf_random(&q, rows, cols, 4, gs, sdt);
    float *X = malloc(sizeof *X * (size_t)(cols * TMAX));
    double *ref = malloc(sizeof *ref * (size_t)(rows * TMAX));
    double *norm = malloc(sizeof *norm * (size_t)(rows * TMAX));
    rand_vec(X, cols * TMAX, gs);
    for (int t = 0; t < TMAX; t++)
        ref_matvec(&q.m, X + t * cols, ref + t * rows, norm + t * rows);
    char what[96];
    snprintf(what, sizeof what, "gs=%d %s rows=%lld cols=%lld", gs, mx_dtype_name(sdt),
             (long long)rows, (long long)cols);
    int vi = 0;
    for (const char *const *nm = mx_qkernels_names(); *nm; nm++) {
        const mx_qkernels *k = mx_qkernels_get(*nm);
        if (k)
            check_variant(k, vi, &q, X, ref, norm, what);
        vi++;
    }
    free(X), free(ref), free(norm);
    qbuf_free(&q);
}

static void test_kernels(void)
{
    static const int64_t rows_list[] = {1, 5, 31, 33, 100};
    for (size_t gi = 0; gi < 3; gi++)
        for (size_t ri = 0; ri < sizeof rows_list / sizeof rows_list[0]; ri++)
            check_kernels(k_gs[gi], k_sdt[(gi + ri) % 3], rows_list[ri], 3 * k_gs[gi]);
    /* wider rows: several KC chunks of the prefill kernel, every dtype */
    for (size_t si = 0; si < 3; si++)
        check_kernels(64, k_sdt[si], 45, 1408);
    check_kernels(128, MX_F16, 40, 1408 + 128);
    check_kernels(32, MX_BF16, 33, 1024 + 32);
    int vi = 0;
    for (const char *const *nm = mx_qkernels_names(); *nm; nm++, vi++)
        if (mx_qkernels_get(*nm))
            printf("%-16s with rp: worst %.3g off the MLX layout's, %.3g off the reference "
                   "(relative to sum |w||x|)\n", *nm, g_worst[vi].vs_plain, g_worst[vi].vs_ref);
}

int main(void)
{
    test_round_trip();
    test_kernels();
    return test_summary();
}
