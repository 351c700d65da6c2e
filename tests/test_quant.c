/* test_quant.c - MLX affine quantization: formats, reference dequantization,
 * every kernel variant the CPU supports against the scalar reference, the
 * quantizer, tensor validation, threaded wrappers and float linears.
 * Random data: odd row counts, one-group and multi-group rows, negative
 * scales, every bits x group size x scale dtype. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "quant/quant.h"
#include "test.h"
#include "util/half.h"
#include "util/parallel.h"

/* Workaround for a sanitizer-runtime bug seen with clang 14 + libomp on
 * glibc 2.36: after enough heap churn, LeakSanitizer records a bogus dynamic
 * TLS range for the main thread and its tracer crashes scanning it ("Tracer
 * caught signal 11 ... DTLS 7 at 0xbd-0x20000011bf"), even with the scalar
 * kernels only.  Nothing here keeps heap pointers in TLS, so skipping TLS in
 * the leak scan loses nothing but glibc's dlerror buffer (kept in TLS, filled
 * when libomp probes symbols), which is suppressed.  These hooks are only
 * called when a sanitizer runtime is linked. */
const char *__lsan_default_options(void);
const char *__lsan_default_options(void) { return "use_tls=0"; }
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void)
{
    return "leak:_dlerror_run\nleak:_dl_exception_create_format\n";
}

static unsigned long long g_seed = 0x9e3779b97f4a7c15ULL;

static const int k_bits[] = { 2, 3, 4, 5, 6, 8 };
static const int k_gs[] = { 32, 64, 128 };
static const mx_dtype k_sdt[] = { MX_F16, MX_BF16, MX_F32 };

/* A random quantized matrix with its own storage. */
typedef struct qbuf {
    mx_qmat m;
    uint8_t *w;
    void *s, *b;
} qbuf;

static void put_s(void *p, mx_dtype t, int64_t i, float v)
{
    if (t == MX_F16) ((uint16_t *)p)[i] = mx_f32_to_f16(v);
    else if (t == MX_BF16) ((uint16_t *)p)[i] = mx_f32_to_bf16(v);
    else ((float *)p)[i] = v;
}

static float get_s(const void *p, mx_dtype t, int64_t i)
{
    if (t == MX_F16) return mx_f16_to_f32(((const uint16_t *)p)[i]);
    if (t == MX_BF16) return mx_bf16_to_f32(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

static void qbuf_random(qbuf *q, int64_t rows, int64_t cols, int bits, int gs, mx_dtype sdt)
{
    memset(q, 0, sizeof *q);
    q->m.rows = rows;
    q->m.cols = cols;
    q->m.bits = bits;
    q->m.group_size = gs;
    q->m.sdtype = sdt;
    size_t nb = (size_t)(rows * cols * bits / 8), ng = (size_t)(rows * cols / gs);
    q->w = malloc(nb);
    q->s = malloc(ng * 4);
    q->b = malloc(ng * 4);
    for (size_t i = 0; i < nb; i++)
        q->w[i] = (uint8_t)test_rand_u64(&g_seed);
    for (size_t i = 0; i < ng; i++) {
        /* negative scales on purpose: MLX produces them */
        put_s(q->s, sdt, (int64_t)i, 0.05f * test_randf(&g_seed));
        put_s(q->b, sdt, (int64_t)i, 0.5f * test_randf(&g_seed));
    }
    q->m.w = q->w;
    q->m.scales = q->s;
    q->m.biases = q->b;
}

static void qbuf_free(qbuf *q)
{
    free(q->w);
    free(q->s);
    free(q->b);
}

static void rand_vec(float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = test_randf(&g_seed);
}

/* Reference y = W x in double from the float dequantization, and the scale
 * sum |W||x| (plus the bias term's magnitude) that errors are relative to. */
static void ref_matvec(const mx_qmat *m, const float *x, double *y, double *norm)
{
    int64_t ng = m->cols / m->group_size;
    for (int64_t r = 0; r < m->rows; r++) {
        double acc = 0, n = 0;
        for (int64_t c = 0; c < m->cols; c++) {
            float w = mx_qmat_get(m, r, c);
            acc += (double)w * x[c];
            n += fabs((double)w * x[c]);
        }
        for (int64_t g = 0; g < ng; g++) {
            double bs = 0, s = fabs(get_s(m->scales, m->sdtype, r * ng + g));
            for (int j = 0; j < m->group_size; j++)
                bs += fabs(x[g * m->group_size + j]);
            n += fabs(get_s(m->biases, m->sdtype, r * ng + g)) * bs + s * bs;
        }
        y[r] = acc;
        norm[r] = n + 1e-30;
    }
}

static double max_rel(const float *a, const double *ref, const double *norm, int64_t n,
                      int64_t stride)
{
    double e = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i * stride] - ref[i]) / norm[i];
        if (!(d <= e))
            e = d;   /* NaN propagates as a failure */
    }
    return e;
}

static const mx_qkernels *g_variants[8];
static double g_worst[8];      /* worst matvec error per variant (printed) */
static int g_nvar;

/* Tolerance of a variant's results relative to the row's sum |w||x| (plus
 * the bias term's magnitude).  Float variants only round: 1e-5.  The integer
 * variant quantizes x to 24 bits per group (three int8 levels; |error| <= ~1
 * step = amax/8e6 per value, 1.25e-7 of the group's largest |x|), which is as
 * close as float rounding, so the same 1e-5 holds with a wide margin (the
 * worst seen is printed at the end, ~1e-7).  A wrong value, nibble, scale or
 * level gives >= 1e-3. */
static double tol_of(const mx_qkernels *k)
{
    (void)k;
    return 1e-5;
}

/* y = W x on rows [r0, r1) through the variant's own prepared x. */
static void kmatvec(const mx_qkernels *k, const mx_qmat *m, const float *x, float *y,
                    int64_t r0, int64_t r1)
{
    size_t nb = (k->prep_bytes(m->cols, m->group_size) + 63) / 64 * 64;
    void *xp = aligned_alloc(64, nb);
    memset(xp, 0xff, nb);   /* NaN bytes: prep must write all that the kernel reads */
    k->prep(x, m->cols, m->group_size, xp);
    k->matvec_rows(m, x, xp, y, r0, r1);
    free(xp);
}

/* The fast precision's variants (one int8 level of x: not as close as
 * float, so held to their own reference, scalar-fast, below). */
static const mx_qkernels *g_fast[4];
static int g_nfast;

static void find_variants(void)
{
    for (const char *const *n = mx_qkernels_names(); *n; n++) {
        const mx_qkernels *k = mx_qkernels_get(*n);
        if (k && k->fast && g_nfast < 4)
            g_fast[g_nfast++] = k;
        else if (k && g_nvar < 8)
            g_variants[g_nvar++] = k;
        printf("variant %-15s %s\n", *n, k ? "tested" : "not supported by this CPU");
    }
}

/* The fast precision: every fast variant against scalar-fast, the
 * reference of the same arithmetic (x quantized to one int8 level per group
 * the same way, integer dots exact; only the float sums' order differs):
 * matvec, several vectors at once, matmul of 1..40 tokens and the batch
 * paths, within 1e-6 of the row's sum |w||x|.  The SIMD matvec of 2, 3, 5
 * and 6 bits stays in float (exact: 1e-5 of the double reference).  And
 * the precision itself: one level is within 1% of the exact result. */
static void check_fast(int bits, int gs, mx_dtype sdt, int64_t rows, int64_t cols)
{
    const mx_qkernels *ref = mx_qkernels_get("scalar-fast");
    qbuf q;
    qbuf_random(&q, rows, cols, bits, gs, sdt);
    const mx_qmat *m = &q.m;
    enum { TMAX = 40 };
    float *x = malloc(sizeof(float) * (size_t)(cols * TMAX));
    float *yr = malloc(sizeof(float) * (size_t)(rows * TMAX)), *y = malloc(sizeof(float) * (size_t)(rows * TMAX));
    double *dref = malloc(sizeof(double) * (size_t)rows), *norm = malloc(sizeof(double) * (size_t)(rows * TMAX));
    rand_vec(x, cols * TMAX);
    for (int64_t c = 0; c < cols * TMAX; c++)
        if ((c / gs) % 3 == 1)
            x[c] *= (c / gs) % 2 ? 1e-3f : 40.0f;
    char what[96];
    snprintf(what, sizeof what, "fast: bits=%d gs=%d %s rows=%lld cols=%lld", bits, gs,
             mx_dtype_name(sdt), (long long)rows, (long long)cols);
    for (int t = 0; t < TMAX; t++) {
        ref_matvec(m, x + t * cols, dref, norm + t * rows);
        kmatvec(ref, m, x + t * cols, yr + t * rows, 0, rows);
        if (t == 0) {
            double e = max_rel(yr, dref, norm, rows, 1);
            CHECKF(e < 1e-2, "%s: scalar-fast vs exact: %.3g", what, e);
        }
    }
    for (int v = 0; v < g_nfast; v++) {
        const mx_qkernels *k = g_fast[v];
        /* matvec, on a sub-range starting at an odd row too */
        kmatvec(k, m, x, y, 0, rows);
        const int integer = bits == 4 || bits == 8 || k == ref;
        if (integer) {
            double w = 0;
            for (int64_t r = 0; r < rows; r++)
                w = fmax(w, fabs((double)y[r] - yr[r]) / norm[r]);
            CHECKF(w < 1e-6, "%s: %s matvec vs scalar-fast %.3g", what, k->name, w);
        }
        /* matmul over T tokens (the prefill tile kernel quantizes x the
         * same way for every bit width) */
        static const int Ts[] = {1, 3, 12, 17, 40};
        for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
            const int T = Ts[ti];
            for (int64_t i = 0; i < rows * T; i++)
                y[i] = -777.0f;
            k->matmul_rows(m, x, cols, T, y, rows, 0, rows);
            double w = 0;
            for (int t = 0; t < T; t++)
                for (int64_t r = 0; r < rows; r++)
                    w = fmax(w, fabs((double)y[t * rows + r] - yr[t * rows + r]) / norm[t * rows + r]);
            CHECKF(w < 1e-6, "%s: %s matmul T=%d vs scalar-fast %.3g", what, k->name, T, w);
        }
        /* several vectors per weight line (batched decode, small experts) */
        if (k->matvec_rows_multi && integer) {
            const int T = 7;
            size_t nb = (k->prep_bytes(cols, gs) + 63) / 64 * 64;
            unsigned char *xp = aligned_alloc(64, nb * T);
            for (int t = 0; t < T; t++)
                k->prep(x + t * cols, cols, gs, xp + nb * (size_t)t);
            k->matvec_rows_multi(m, x, cols, xp, nb, T, y, rows, 0, rows);
            double w = 0;
            for (int t = 0; t < T; t++)
                for (int64_t r = 0; r < rows; r++)
                    w = fmax(w, fabs((double)y[t * rows + r] - yr[t * rows + r]) / norm[t * rows + r]);
            CHECKF(w < 1e-6, "%s: %s matvec of %d vectors vs scalar-fast %.3g", what, k->name, T, w);
            free(xp);
        }
    }
    qbuf_free(&q);
    free(x), free(yr), free(y), free(dref), free(norm);
}

static void test_fast(void)
{
    static const int64_t rows_list[] = {1, 7, 33};
    for (size_t bi = 0; bi < 6; bi++)
        for (size_t gi = 0; gi < 3; gi++)
            for (size_t ri = 0; ri < 3; ri++)
                check_fast(k_bits[bi], k_gs[gi], k_sdt[(bi + gi) % 3], rows_list[ri], 3 * k_gs[gi]);
    check_fast(4, 64, MX_F16, 45, 1408);
    check_fast(8, 64, MX_BF16, 45, 1408);
    check_fast(4, 128, MX_F16, 3, 2 * 4096 + 128);
    /* the precision switch picks the fast twins */
    CHECK(mx_precision_set("fast") == 0 && mx_precision_get() == MX_PRECISION_FAST);
    CHECK(mx_qkernels_force("scalar") == 0 && !strcmp(mx_qkernels_active()->name, "scalar-fast"));
    CHECK(mx_precision_set("exact") == 0 && !strcmp(mx_qkernels_active()->name, "scalar"));
    CHECK(mx_precision_set("sloppy") == -1 && mx_precision_get() == MX_PRECISION_EXACT);
    mx_qkernels_force(NULL);
}

/* (a) (b) (c) (d) for one matrix shape. */
static void check_matrix(int bits, int gs, mx_dtype sdt, int64_t rows, int64_t cols, int do_mm)
{
    qbuf q;
    qbuf_random(&q, rows, cols, bits, gs, sdt);
    const mx_qmat *m = &q.m;
    int64_t ng = cols / gs;
    float *x = malloc((size_t)cols * 17 * sizeof *x);
    float *y = malloc((size_t)rows * 17 * sizeof *y), *y2 = malloc((size_t)rows * 17 * sizeof *y2);
    double *ref = malloc((size_t)rows * 17 * sizeof *ref), *norm = malloc((size_t)rows * 17 * sizeof *norm);
    float *row = malloc((size_t)cols * sizeof *row);
    rand_vec(x, cols * 17);
    /* a few groups of very different magnitude: per-group x steps */
    for (int64_t c = 0; c < cols * 17; c++)
        if ((c / gs) % 3 == 1)
            x[c] *= (c / gs) % 2 ? 1e-3f : 40.0f;
    (void)ng;
    char what[96];
    snprintf(what, sizeof what, "bits=%d gs=%d %s rows=%lld cols=%lld", bits, gs,
             mx_dtype_name(sdt), (long long)rows, (long long)cols);

    /* (d) row dequantization agrees with element access */
    for (int64_t r = 0; r < rows; r++) {
        mx_qmat_row(m, r, row);
        int bad = 0;
        for (int64_t c = 0; c < cols; c++)
            if (fabsf(row[c] - mx_qmat_get(m, r, c)) > 1e-6f * (fabsf(row[c]) + 1e-3f))
                bad++;
        CHECKF(bad == 0, "%s: mx_qmat_row differs from mx_qmat_get in %d values of row %lld",
               what, bad, (long long)r);
    }

    /* (a) scalar matvec against the double reference */
    ref_matvec(m, x, ref, norm);
    kmatvec(mx_qkernels_get("scalar"), m, x, y, 0, rows);
    double e = max_rel(y, ref, norm, rows, 1);
    CHECKF(e < 2e-6, "%s: scalar matvec rel err %.3g", what, e);

    /* (b) every variant against the reference, on the full range and a
     * sub-range that starts at an odd row */
    for (int v = 0; v < g_nvar; v++) {
        const mx_qkernels *k = g_variants[v];
        kmatvec(k, m, x, y2, 0, rows);
        e = max_rel(y2, ref, norm, rows, 1);
        CHECKF(e < tol_of(k), "%s: %s matvec rel err %.3g", what, k->name, e);
        if (e > g_worst[v])
            g_worst[v] = e;
        if (rows > 3) {
            y2[rows - 3] = 12345.0f;
            kmatvec(k, m, x, y2, 3, rows - 1);
            e = max_rel(y2, ref + 3, norm + 3, rows - 4, 1);
            CHECKF(e < tol_of(k) && y2[rows - 3] == 12345.0f, "%s: %s matvec sub-range err %.3g",
                   what, k->name, e);
        }
    }

    /* (b2) the multi-vector matvec (a variant's matvec_rows_multi, where it
     * has one) against the reference for 1..9 vectors, on a sub-range,
     * without writing outside it; and bit for bit what matvec_rows gives
     * for each vector alone (the small-batch matmul relies on that) */
    if (do_mm) {
        for (int t = 1; t < 17; t++)
            ref_matvec(m, x + t * cols, ref + t * rows, norm + t * rows);
        for (int v = 0; v < g_nvar; v++) {
            const mx_qkernels *k = g_variants[v];
            if (!k->matvec_rows_multi)
                continue;
            size_t nb = (k->prep_bytes(cols, gs) + 63) / 64 * 64;
            unsigned char *xp = aligned_alloc(64, nb * 9);
            memset(xp, 0xff, nb * 9);   /* NaN bytes: prep must write all that is read */
            for (int t = 0; t < 9; t++)
                k->prep(x + t * cols, cols, gs, xp + nb * t);
            for (int T = 1; T <= 9; T++) {
                int64_t r0 = rows > 3 ? 1 : 0, r1 = rows;
                for (int64_t i = 0; i < rows * T; i++)
                    y[i] = -777.0f;
                k->matvec_rows_multi(m, x, cols, xp, nb, T, y + r0, rows, r0, r1);
                double em = 0;
                int exact = 1, sentinel_ok = 1;
                for (int tt = 0; tt < T; tt++) {
                    double et = max_rel(y + tt * rows + r0, ref + tt * rows + r0,
                                        norm + tt * rows + r0, r1 - r0, 1);
                    if (!(et <= em))
                        em = et;
                    k->matvec_rows(m, x + tt * cols, xp + nb * tt, y2, r0, r1);
                    exact &= !memcmp(y2, y + tt * rows + r0, sizeof *y2 * (size_t)(r1 - r0));
                    if (r0 && y[tt * rows] != -777.0f)
                        sentinel_ok = 0;
                }
                CHECKF(em < tol_of(k), "%s: %s matvec_rows_multi T=%d rel err %.3g", what, k->name,
                       T, em);
                CHECKF(exact, "%s: %s matvec_rows_multi T=%d differs from matvec_rows", what,
                       k->name, T);
                CHECKF(sentinel_ok, "%s: %s matvec_rows_multi T=%d wrote outside its rows", what,
                       k->name, T);
            }
            free(xp);
        }
    }

    /* (c) matmul against repeated reference matvec, every variant incl. scalar */
    if (do_mm) {
        static const int Ts[] = { 1, 2, 5, 8, 17 };
        for (int t = 1; t < 17; t++)
            ref_matvec(m, x + t * cols, ref + t * rows, norm + t * rows);
        for (int v = -1; v < g_nvar; v++) {
            const mx_qkernels *k = v < 0 ? mx_qkernels_get("scalar") : g_variants[v];
            for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
                int T = Ts[ti];
                /* rows [r0, r1) of a Y with row stride rows: untouched rows stay NaN-free sentinels */
                int64_t r0 = rows > 3 ? 1 : 0, r1 = rows;
                for (int64_t i = 0; i < rows * T; i++)
                    y[i] = -777.0f;
                k->matmul_rows(m, x, cols, T, y, rows, r0, r1);
                double em = 0;
                int sentinel_ok = 1;
                for (int tt = 0; tt < T; tt++) {
                    double et = max_rel(y + tt * rows + r0, ref + tt * rows + r0,
                                        norm + tt * rows + r0, r1 - r0, 1);
                    if (!(et <= em))
                        em = et;
                    if (r0 && y[tt * rows] != -777.0f)
                        sentinel_ok = 0;
                }
                CHECKF(em < tol_of(k), "%s: %s matmul T=%d rel err %.3g", what, k->name, T, em);
                /* matmul and matvec of the same variant agree closer than
                 * either does with the reference (also avx512vnni's, whose
                 * matvec uses float for 2/3/5/6 bits, its matmul integers) */
                kmatvec(k, m, x + (T - 1) * cols, y2, 0, rows);
                double ev = 0;
                for (int64_t r = r0; r < r1; r++) {
                    double d = fabs((double)y[(T - 1) * rows + r] - y2[r]) / norm[(T - 1) * rows + r];
                    if (!(d <= ev))
                        ev = d;
                }
                CHECKF(ev < 4e-6, "%s: %s matmul T=%d differs from matvec by %.3g", what,
                       k->name, T, ev);
                CHECKF(sentinel_ok, "%s: %s matmul T=%d wrote outside its rows", what, k->name, T);
            }
        }
    }
    free(x); free(y); free(y2); free(ref); free(norm); free(row);
    qbuf_free(&q);
}

static void test_kernels(void)
{
    static const int64_t rows_list[] = { 1, 7, 33, 130 };
    for (size_t bi = 0; bi < 6; bi++)
        for (size_t gi = 0; gi < 3; gi++)
            for (size_t si = 0; si < 3; si++) {
                int bits = k_bits[bi], gs = k_gs[gi];
                int64_t cols_list[] = { gs, 3 * gs, 640 };
                for (size_t ri = 0; ri < 4; ri++)
                    for (size_t ci = 0; ci < 3; ci++) {
                        int64_t cols = cols_list[ci];
                        if (cols % gs)
                            cols = 5 * gs;
                        /* matmul on a subset of shapes keeps the ASan run short */
                        int do_mm = rows_list[ri] != 130 && ci != 2;
                        check_matrix(bits, gs, k_sdt[si], rows_list[ri], cols, do_mm);
                    }
            }
    /* wide rows with many tiles of columns, hot formats only */
    for (size_t gi = 0; gi < 3; gi++) {
        check_matrix(4, k_gs[gi], MX_F16, 45, 1408, 1);
        check_matrix(8, k_gs[gi], MX_BF16, 45, 1408, 1);
    }
    /* more columns than one x pass of the SIMD matvec (4096) */
    for (size_t bi = 0; bi < 6; bi++)
        check_matrix(k_bits[bi], 64, MX_F32, 5, 4096 + 384, 0);
    check_matrix(4, 128, MX_F16, 3, 2 * 4096 + 128, 1);
}

/* (e) quantizer */
static void test_quantize(void)
{
    for (size_t bi = 0; bi < 6; bi++)
        for (size_t gi = 0; gi < 3; gi++)
            for (size_t si = 0; si < 3; si++) {
                int bits = k_bits[bi], gs = k_gs[gi];
                mx_dtype sdt = k_sdt[si];
                int64_t rows = 6, cols = 2 * gs, ng = cols / gs;
                float *w = malloc((size_t)(rows * cols) * sizeof *w);
                float *d = malloc((size_t)cols * sizeof *d);
                uint8_t *pk = malloc((size_t)(rows * cols * bits / 8));
                float s[64], b[64];
                int nbins = (1 << bits) - 1;
                mx_err e;
                /* random data; row 0 all positive, row 1 all negative, row 2 constant */
                for (int64_t i = 0; i < rows * cols; i++)
                    w[i] = test_randf(&g_seed) * (i % 7 == 0 ? 3.0f : 1.0f);
                for (int64_t c = 0; c < cols; c++) {
                    w[c] = fabsf(w[c]) + 0.25f;
                    w[cols + c] = -fabsf(w[cols + c]) - 0.5f;
                    w[2 * cols + c] = 0.375f;
                }
                CHECK_OK(mx_quantize(w, rows, cols, bits, gs, sdt, pk, s, b, &e), &e);
                mx_qmat m = { .w = pk, .scales = s, .biases = b, .rows = rows, .cols = cols,
                              .bits = bits, .group_size = gs, .sdtype = sdt };
                double u = sdt == MX_F16 ? 1.0 / 2048 : sdt == MX_BF16 ? 1.0 / 256 : 1e-7;
                int bad = 0, bad_edge = 0;
                double worst = 0;
                for (int64_t r = 0; r < rows; r++) {
                    mx_qmat_row(&m, r, d);
                    for (int64_t c = 0; c < cols; c++) {
                        float sc = get_s(s, sdt, r * ng + c / gs), bb = get_s(b, sdt, r * ng + c / gs);
                        float v = w[r * cols + c];
                        /* Half a step inside the representable range.  MLX nudges
                         * the step so that 0 is a level; that can pull the far end
                         * in by up to one step, so clipped values may be off by up
                         * to a step.  Plus what rounding scale/bias to sdt adds. */
                        double e0 = bb, e1 = bb + (double)nbins * sc;
                        int inside = v >= fmin(e0, e1) && v <= fmax(e0, e1);
                        double tol = (inside ? 0.5 : 1.0) * fabs(sc) * (1 + 1e-5) +
                                     (nbins * fabs(sc) + fabs(bb)) * u * 1.01 + 1e-6;
                        double err = fabs((double)d[c] - v);
                        if (err > tol)
                            bad++;
                        if (err / (fabs(sc) + 1e-30) > worst)
                            worst = err / (fabs(sc) + 1e-30);
                    }
                    /* the bias is the larger-magnitude extreme of the group (or 0) */
                    for (int64_t g = 0; g < ng; g++) {
                        float lo = w[r * cols + g * gs], hi = lo;
                        for (int j = 1; j < gs; j++) {
                            lo = fminf(lo, w[r * cols + g * gs + j]);
                            hi = fmaxf(hi, w[r * cols + g * gs + j]);
                        }
                        float edge = fabsf(lo) > fabsf(hi) ? lo : hi, want[1];
                        put_s(want, sdt, 0, edge);
                        float bb = get_s(b, sdt, r * ng + g);
                        if (bb != 0 && bb != get_s(want, sdt, 0))
                            bad_edge++;
                    }
                }
                CHECKF(bad == 0, "quantize bits=%d gs=%d %s: %d values off by more than half "
                       "a step (worst %.3f steps)", bits, gs, mx_dtype_name(sdt), bad, worst);
                CHECKF(bad_edge == 0, "quantize bits=%d gs=%d %s: %d biases are not the group edge",
                       bits, gs, mx_dtype_name(sdt), bad_edge);

                /* exactly representable groups: c + step*k with k covering 0..nbins */
                for (int64_t r = 0; r < rows; r++)
                    for (int64_t g = 0; g < ng; g++) {
                        float step = ldexpf(1.0f, -(int)(2 + test_rand_u64(&g_seed) % 5));
                        int j = -(int)(test_rand_u64(&g_seed) % (uint64_t)(nbins + 1));
                        for (int i = 0; i < gs; i++) {
                            int k = i == 0 ? 0 : i == 1 ? nbins
                                             : (int)(test_rand_u64(&g_seed) % (uint64_t)(nbins + 1));
                            w[r * cols + g * gs + i] = (float)(j + k) * step;
                        }
                    }
                CHECK_OK(mx_quantize(w, rows, cols, bits, gs, sdt, pk, s, b, &e), &e);
                bad = 0;
                for (int64_t r = 0; r < rows; r++) {
                    mx_qmat_row(&m, r, d);
                    for (int64_t c = 0; c < cols; c++)
                        bad += d[c] != w[r * cols + c];
                }
                CHECKF(bad == 0, "quantize bits=%d gs=%d %s: %d exactly representable values "
                       "did not round trip", bits, gs, mx_dtype_name(sdt), bad);
                free(w); free(d); free(pk);
            }
    /* the larger-magnitude edge decides the sign of the scale */
    {
        float w[32], s, b;
        uint8_t pk[16];
        mx_err e;
        for (int i = 0; i < 32; i++)
            w[i] = -1.0f + (float)i / 31.0f * 1.5f;   /* min -1, max 0.5 */
        CHECK_OK(mx_quantize(w, 1, 32, 4, 32, MX_F32, pk, &s, &b, &e), &e);
        CHECKF(s > 0 && b == -1.0f, "min edge: scale %g bias %g", s, b);
        for (int i = 0; i < 32; i++)
            w[i] = -w[i];
        CHECK_OK(mx_quantize(w, 1, 32, 4, 32, MX_F32, pk, &s, &b, &e), &e);
        CHECKF(s < 0 && b == 1.0f, "max edge: scale %g bias %g", s, b);
        CHECK_FAILS(mx_quantize(w, 1, 32, 7, 32, MX_F32, pk, &s, &b, &e), &e);
        CHECK_FAILS(mx_quantize(w, 1, 32, 4, 16, MX_F32, pk, &s, &b, &e), &e);
        CHECK_FAILS(mx_quantize(w, 1, 48, 4, 32, MX_F32, pk, &s, &b, &e), &e);
    }
}

/* (f) building views from tensors */
static mx_tensor fake(const char *name, mx_dtype t, int ndim, const int64_t *shape, const void *data)
{
    mx_tensor x;
    memset(&x, 0, sizeof x);
    x.name = name;
    x.dtype = t;
    x.ndim = ndim;
    size_t n = mx_dtype_size(t);
    for (int i = 0; i < ndim; i++) {
        x.shape[i] = shape[i];
        n *= (size_t)shape[i];
    }
    x.data = data;
    x.nbytes = n;
    return x;
}

static void test_from_tensors(void)
{
    static uint32_t wbuf[3 * 8 * 16];
    static uint16_t sbuf[3 * 8 * 2], bbuf[3 * 8 * 2];
    mx_qmat m;
    mx_err e;
    const char *nm = "model.layers.0.mlp.gate";
    /* 4-bit, group 64, 128 columns: w [8, 16], scales [8, 2] */
    mx_tensor w = fake("w", MX_U32, 2, (int64_t[]){ 8, 16 }, wbuf);
    mx_tensor s = fake("s", MX_F16, 2, (int64_t[]){ 8, 2 }, sbuf);
    mx_tensor b = fake("b", MX_F16, 2, (int64_t[]){ 8, 2 }, bbuf);
    CHECK_OK(mx_qmat_from_tensors(&w, &s, &b, 4, 64, 0, nm, &m, &e), &e);
    CHECK(m.rows == 8 && m.cols == 128 && m.bits == 4 && m.group_size == 64 && m.sdtype == MX_F16);
    CHECK(mx_qmat_bytes(&m) == 8 * 64 + 2 * 8 * 2 * 2);
    CHECK_OK(mx_qmat_from_tensors(&w, &s, &b, 0, 64, 0, nm, &m, &e), &e);
    CHECK(m.bits == 4);
    /* the same shapes read as 8-bit with group 32 */
    CHECK_OK(mx_qmat_from_tensors(&w, &s, &b, 0, 32, 0, nm, &m, &e), &e);
    CHECK(m.bits == 8 && m.cols == 64);
    /* config disagrees with shapes */
    CHECK_FAILS(mx_qmat_from_tensors(&w, &s, &b, 4, 32, 0, nm, &m, &e), &e);
    CHECKF(strstr(e.msg, "model.layers.0.mlp.gate: config says 4 bits but shapes imply 8") != NULL,
           "message: %s", e.msg);
    /* unsupported group size 16, unsupported bits 7 (given or inferred) */
    CHECK_FAILS(mx_qmat_from_tensors(&w, &s, &b, 4, 16, 0, nm, &m, &e), &e);
    CHECK(strstr(e.msg, nm) != NULL);
    mx_tensor w7 = fake("w", MX_U32, 2, (int64_t[]){ 8, 7 }, wbuf);
    mx_tensor s1 = fake("s", MX_F16, 2, (int64_t[]){ 8, 1 }, sbuf);
    mx_tensor b1 = fake("b", MX_F16, 2, (int64_t[]){ 8, 1 }, bbuf);
    CHECK_FAILS(mx_qmat_from_tensors(&w7, &s1, &b1, 7, 32, 0, nm, &m, &e), &e);
    CHECK_FAILS(mx_qmat_from_tensors(&w7, &s1, &b1, 0, 32, 0, nm, &m, &e), &e);
    /* 3-bit inferred: 32 columns * 3 bits = 3 words */
    mx_tensor w3 = fake("w", MX_U32, 2, (int64_t[]){ 8, 3 }, wbuf);
    CHECK_OK(mx_qmat_from_tensors(&w3, &s1, &b1, 0, 32, 0, nm, &m, &e), &e);
    CHECK(m.bits == 3 && m.cols == 32);
    /* wrong dtypes */
    mx_tensor wf = fake("w", MX_F32, 2, (int64_t[]){ 8, 16 }, wbuf);
    CHECK_FAILS(mx_qmat_from_tensors(&wf, &s, &b, 4, 64, 0, nm, &m, &e), &e);
    mx_tensor si = fake("s", MX_I32, 2, (int64_t[]){ 8, 1 }, sbuf);
    CHECK_FAILS(mx_qmat_from_tensors(&w, &si, &si, 4, 64, 0, nm, &m, &e), &e);
    mx_tensor bb = fake("b", MX_BF16, 2, (int64_t[]){ 8, 2 }, bbuf);
    CHECK_FAILS(mx_qmat_from_tensors(&w, &s, &bb, 4, 64, 0, nm, &m, &e), &e);
    /* shape mismatches: rows, scales vs biases, ndim, non-integer bits */
    mx_tensor s7 = fake("s", MX_F16, 2, (int64_t[]){ 7, 2 }, sbuf);
    CHECK_FAILS(mx_qmat_from_tensors(&w, &s7, &b, 4, 64, 0, nm, &m, &e), &e);
    CHECK_FAILS(mx_qmat_from_tensors(&w, &s, &b1, 4, 64, 0, nm, &m, &e), &e);
    mx_tensor w1 = fake("w", MX_U32, 1, (int64_t[]){ 16 }, wbuf);
    CHECK_FAILS(mx_qmat_from_tensors(&w1, &s, &b, 4, 64, 0, nm, &m, &e), &e);
    mx_tensor w5 = fake("w", MX_U32, 2, (int64_t[]){ 8, 5 }, wbuf);
    CHECK_FAILS(mx_qmat_from_tensors(&w5, &s, &b, 0, 64, 0, nm, &m, &e), &e);
    CHECK_FAILS(mx_qmat_from_tensors(NULL, &s, &b, 4, 64, 0, nm, &m, &e), &e);
    /* data smaller than the shape says */
    mx_tensor ws = w;
    ws.nbytes = 100;
    CHECK_FAILS(mx_qmat_from_tensors(&ws, &s, &b, 4, 64, 0, nm, &m, &e), &e);
    /* stacked experts: [3, 8, 16]; index selects a matrix without copying */
    mx_tensor W = fake("w", MX_U32, 3, (int64_t[]){ 3, 8, 16 }, wbuf);
    mx_tensor S = fake("s", MX_F16, 3, (int64_t[]){ 3, 8, 2 }, sbuf);
    mx_tensor B = fake("b", MX_F16, 3, (int64_t[]){ 3, 8, 2 }, bbuf);
    CHECK_OK(mx_qmat_from_tensors(&W, &S, &B, 4, 64, 2, nm, &m, &e), &e);
    CHECK(m.w == (const uint8_t *)wbuf + 2 * 8 * 16 * 4);
    CHECK(m.scales == (const void *)(sbuf + 2 * 8 * 2) && m.biases == (const void *)(bbuf + 2 * 8 * 2));
    CHECK(m.rows == 8 && m.cols == 128);
    CHECK_FAILS(mx_qmat_from_tensors(&W, &S, &B, 4, 64, 3, nm, &m, &e), &e);
    CHECK_FAILS(mx_qmat_from_tensors(&W, &S, &B, 4, 64, -1, nm, &m, &e), &e);
    mx_tensor S2 = fake("s", MX_F16, 3, (int64_t[]){ 2, 8, 2 }, sbuf);
    CHECK_FAILS(mx_qmat_from_tensors(&W, &S2, &B, 4, 64, 0, nm, &m, &e), &e);

    /* traits */
    CHECK(mx_qtraits_for(4) && mx_qtraits_for(4)->values_per_word == 8 && !mx_qtraits_for(4)->straddles);
    CHECK(mx_qtraits_for(3) && mx_qtraits_for(3)->straddles && mx_qtraits_for(3)->mask == 7);
    CHECK(!mx_qtraits_for(7) && !mx_qtraits_for(1) && !mx_qtraits_for(16));
    CHECK(mx_group_size_ok(64) && !mx_group_size_ok(16) && !mx_group_size_ok(256));
    CHECK(mx_scale_dtype_ok(MX_BF16) && !mx_scale_dtype_ok(MX_I32));
}

/* (g) threaded wrappers equal the row-range kernels */
static void test_threaded(void)
{
    qbuf q;
    int64_t rows = 301, cols = 512;
    qbuf_random(&q, rows, cols, 4, 64, MX_F16);
    /* T = 5 takes the small-batch path (the matvec kernel per token), T = 17
     * the prefill kernel: each must equal its row-range kernel bit for bit */
    enum { TS = 5, TL = 17 };
    float *x = malloc(TL * (size_t)cols * sizeof *x);
    float *y1 = malloc(TL * (size_t)rows * sizeof *y1), *y2 = malloc(TL * (size_t)rows * sizeof *y2);
    rand_vec(x, TL * cols);
    for (int v = 0; v < g_nvar; v++) {
        CHECK(mx_qkernels_force(g_variants[v]->name) == 0);
        CHECK(mx_qkernels_active() == g_variants[v]);
        for (int nth = 1; nth <= 3; nth++) {
            mx_set_threads(nth);
            kmatvec(g_variants[v], &q.m, x, y1, 0, rows);
            mx_qmatvec(&q.m, x, y2);
            CHECKF(!memcmp(y1, y2, (size_t)rows * sizeof *y1), "%s: threaded matvec (%d threads)",
                   g_variants[v]->name, nth);
            for (int t = 0; t < TS; t++)
                kmatvec(g_variants[v], &q.m, x + t * cols, y1 + t * rows, 0, rows);
            mx_qmatmul(&q.m, x, TS, y2);
            CHECKF(!memcmp(y1, y2, TS * (size_t)rows * sizeof *y1), "%s: threaded small matmul (%d threads)",
                   g_variants[v]->name, nth);
            g_variants[v]->matmul_rows(&q.m, x, cols, TL, y1, rows, 0, rows);
            mx_qmatmul(&q.m, x, TL, y2);
            CHECKF(!memcmp(y1, y2, TL * (size_t)rows * sizeof *y1), "%s: threaded matmul (%d threads)",
                   g_variants[v]->name, nth);
        }
    }
    mx_set_threads(0);
    CHECK(mx_qkernels_force("no-such-kernel") == -1);
    CHECK(mx_qkernels_get("no-such-kernel") == NULL);
    CHECK(mx_qkernels_force(NULL) == 0);
    CHECK(mx_qkernels_active() != NULL);
    free(x); free(y1); free(y2);
    qbuf_free(&q);
}

/* (i) the prepared-x interface: one prep serves many row ranges (what the
 * threaded wrappers and the fused MoE kernel do) with results identical to
 * one call; prep_bytes grows with cols; zero x gives exactly zero and a NaN
 * in x reaches every output, in every variant. */
static void test_prep(void)
{
    static const int bits_list[] = { 4, 8, 3 };
    for (int bi = 0; bi < 3; bi++) {
        qbuf q;
        int64_t rows = 70, cols = 640;
        qbuf_random(&q, rows, cols, bits_list[bi], 32, MX_F16);
        float *x = malloc((size_t)cols * sizeof *x), y1[70], y2[70];
        rand_vec(x, cols);
        for (int v = 0; v < g_nvar; v++) {
            const mx_qkernels *k = g_variants[v];
            CHECK(k->prep_bytes(cols, 32) >= (size_t)(cols / 32) * sizeof(float));
            CHECK(k->prep_bytes(2 * cols, 32) > k->prep_bytes(cols, 32));
            void *xp = aligned_alloc(64, (k->prep_bytes(cols, 32) + 63) / 64 * 64);
            k->prep(x, cols, 32, xp);
            k->matvec_rows(&q.m, x, xp, y1, 0, rows);
            static const int64_t cuts[] = { 0, 1, 17, 32, 33, 64, 69, 70 };
            for (int c = 0; c + 1 < 8; c++)
                k->matvec_rows(&q.m, x, xp, y2 + cuts[c], cuts[c], cuts[c + 1]);
            CHECKF(!memcmp(y1, y2, sizeof y1), "%s bits=%d: row ranges sharing one prep differ",
                   k->name, bits_list[bi]);
            float *z = calloc((size_t)cols, sizeof *z);
            k->prep(z, cols, 32, xp);
            k->matvec_rows(&q.m, z, xp, y1, 0, rows);
            int nz = 0;
            for (int r = 0; r < rows; r++)
                nz += y1[r] != 0.0f;
            CHECKF(nz == 0, "%s bits=%d: zero x gives %d non-zero outputs", k->name,
                   bits_list[bi], nz);
            z[77] = NAN;
            k->prep(z, cols, 32, xp);
            k->matvec_rows(&q.m, z, xp, y1, 0, rows);
            int fin = 0;
            for (int r = 0; r < rows; r++)
                fin += !isnan(y1[r]);
            CHECKF(fin == 0, "%s bits=%d: NaN in x, %d finite outputs", k->name, bits_list[bi], fin);
            free(z);
            free(xp);
        }
        free(x);
        qbuf_free(&q);
    }
}

/* (h) linear layers: float weights in three dtypes, optional bias, and a
 * quantized one with a bias */
static void test_linear(void)
{
    int64_t rows = 37, cols = 101, T = 3;
    float *wf = malloc((size_t)(rows * cols) * sizeof *wf);
    uint16_t *wh = malloc((size_t)(rows * cols) * 2);
    float *x = malloc((size_t)(T * cols) * sizeof *x), bias[37];
    float *y = malloc((size_t)(T * rows) * sizeof *y);
    rand_vec(x, T * cols);
    rand_vec(bias, rows);
    for (int di = 0; di < 3; di++) {
        mx_dtype dt = k_sdt[di];
        for (int64_t i = 0; i < rows * cols; i++) {
            float v = test_randf(&g_seed);
            put_s(dt == MX_F32 ? (void *)wf : (void *)wh, dt, i, v);
        }
        for (int with_bias = 0; with_bias < 2; with_bias++) {
            mx_linear l = { .quantized = 0, .w = dt == MX_F32 ? (void *)wf : (void *)wh,
                            .wdtype = dt, .rows = rows, .cols = cols,
                            .bias = with_bias ? bias : NULL };
            for (int nth = 1; nth <= 2; nth++) {
                mx_set_threads(nth);
                mx_linear_matmul(&l, x, T, y);
                double worst = 0;
                for (int64_t t = 0; t < T; t++)
                    for (int64_t r = 0; r < rows; r++) {
                        double ref = with_bias ? bias[r] : 0, n = fabs(ref);
                        for (int64_t c = 0; c < cols; c++) {
                            double p = (double)get_s(l.w, dt, r * cols + c) * x[t * cols + c];
                            ref += p;
                            n += fabs(p);
                        }
                        double err = fabs(y[t * rows + r] - ref) / n;
                        worst = err > worst ? err : worst;
                        if (t == 0 && r == 0) {
                            float yv[37];
                            mx_linear_matvec(&l, x, yv);
                            CHECK(fabs(yv[0] - ref) / n < 1e-6);
                        }
                    }
                CHECKF(worst < 1e-6, "linear %s bias=%d: rel err %.3g", mx_dtype_name(dt),
                       with_bias, worst);
            }
            CHECK(mx_linear_bytes(&l) == (size_t)(rows * cols) * mx_dtype_size(dt) +
                                         (with_bias ? (size_t)rows * 4 : 0));
        }
    }
    mx_set_threads(0);
    /* quantized + bias */
    qbuf q;
    qbuf_random(&q, rows, 128, 4, 64, MX_BF16);
    mx_linear l = { .quantized = 1, .q = q.m, .rows = rows, .cols = 128, .bias = bias };
    float y0[37], y1[37];
    kmatvec(mx_qkernels_get("scalar"), &q.m, x, y0, 0, rows);
    mx_linear_matvec(&l, x, y1);
    int bad = 0;
    for (int64_t r = 0; r < rows; r++)
        bad += fabsf(y1[r] - (y0[r] + bias[r])) > 1e-4f;
    CHECK(bad == 0);
    CHECK(mx_linear_bytes(&l) == mx_qmat_bytes(&q.m) + (size_t)rows * 4);
    qbuf_free(&q);
    free(wf); free(wh); free(x); free(y);
}

int main(void)
{
    find_variants();
    test_from_tensors();
    test_quantize();
    test_kernels();
    test_threaded();
    test_prep();
    test_linear();
    test_fast();
    for (int v = 0; v < g_nvar; v++)
        printf("%-10s worst matvec error %.3g (relative to sum |w||x|)\n", g_variants[v]->name,
               g_worst[v]);
    return test_summary();
}
