/* quant.c - MLX affine formats: traits table, tensor validation, reference
 * dequantization, run-time kernel selection and the threaded wrappers. */
#include "quant/quant.h"

#include <inttypes.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/qint.h"
#include "util/parallel.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

/* ---- formats ---------------------------------------------------------- */

static const mx_qtraits g_traits[] = {
    { .bits = 2, .values_per_word = 16, .straddles = 0, .mask = 0x3 },
    { .bits = 3, .values_per_word = 0,  .straddles = 1, .mask = 0x7 },
    { .bits = 4, .values_per_word = 8,  .straddles = 0, .mask = 0xf },
    { .bits = 5, .values_per_word = 0,  .straddles = 1, .mask = 0x1f },
    { .bits = 6, .values_per_word = 0,  .straddles = 1, .mask = 0x3f },
    { .bits = 8, .values_per_word = 4,  .straddles = 0, .mask = 0xff },
};

const mx_qtraits *mx_qtraits_for(int bits)
{
    for (size_t i = 0; i < sizeof g_traits / sizeof g_traits[0]; i++)
        if (g_traits[i].bits == bits)
            return &g_traits[i];
    return NULL;
}

int mx_group_size_ok(int group_size)
{
    return group_size == 32 || group_size == 64 || group_size == 128;
}

int mx_scale_dtype_ok(mx_dtype t) { return t == MX_F16 || t == MX_BF16 || t == MX_F32; }

size_t mx_qmat_bytes(const mx_qmat *m)
{
    size_t ss = mx_dtype_size(m->sdtype);
    return (size_t)(m->rows * mx_qmat_row_bytes(m)) +
           2 * (size_t)(m->rows * mx_qmat_groups(m)) * ss;
}

/* ---- building a view from tensors -------------------------------------- */

static void shape_str(const mx_tensor *t, char *buf, size_t n)
{
    size_t k = 0;
    k += (size_t)snprintf(buf + k, n - k, "[");
    for (int i = 0; i < t->ndim && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%" PRId64, i ? ", " : "", t->shape[i]);
    if (k < n)
        snprintf(buf + k, n - k, "]");
}

/* Bytes a tensor must hold for its shape and dtype; -1 on overflow or bad dims. */
static int64_t tensor_need(const mx_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] < 0 || (t->shape[i] && n > INT64_MAX / t->shape[i]))
            return -1;
        n *= t->shape[i];
    }
    int64_t s = (int64_t)mx_dtype_size(t->dtype);
    return n > INT64_MAX / s ? -1 : n * s;
}

int mx_qmat_from_tensors(const mx_tensor *w, const mx_tensor *scales,
                         const mx_tensor *biases, int bits, int group_size,
                         int64_t index, const char *name, mx_qmat *out, mx_err *e)
{
    const char *nm = name ? name : "quantized tensor";
    char sw[96], ss[96], sb[96];
    if (!w || !scales || !biases)
        return mx_fail(e, MX_EFORMAT, "%s: missing %s", nm,
                       !w ? "weight" : !scales ? "scales" : "biases");
    if (w->dtype != MX_U32)
        return mx_fail(e, MX_EFORMAT, "%s.weight: dtype %s, expected U32 (packed quantized weight)",
                       nm, mx_dtype_name(w->dtype));
    if (!mx_scale_dtype_ok(scales->dtype))
        return mx_fail(e, MX_EFORMAT, "%s.scales: dtype %s, expected F16, BF16 or F32", nm,
                       mx_dtype_name(scales->dtype));
    if (biases->dtype != scales->dtype)
        return mx_fail(e, MX_EFORMAT, "%s.biases: dtype %s differs from scales dtype %s", nm,
                       mx_dtype_name(biases->dtype), mx_dtype_name(scales->dtype));
    shape_str(w, sw, sizeof sw);
    shape_str(scales, ss, sizeof ss);
    shape_str(biases, sb, sizeof sb);
    int nd = w->ndim;
    if (nd < 2 || nd > MX_MAX_DIMS || scales->ndim != nd || biases->ndim != nd)
        return mx_fail(e, MX_EFORMAT, "%s: weight %s, scales %s, biases %s: expected the same "
                       "number (>= 2) of dimensions", nm, sw, ss, sb);
    for (int i = 0; i < nd - 1; i++)
        if (scales->shape[i] != w->shape[i] || biases->shape[i] != w->shape[i])
            return mx_fail(e, MX_EFORMAT, "%s: weight %s, scales %s, biases %s: leading "
                           "dimensions differ", nm, sw, ss, sb);
    if (scales->shape[nd - 1] != biases->shape[nd - 1])
        return mx_fail(e, MX_EFORMAT, "%s: scales %s and biases %s differ in shape", nm, ss, sb);
    if (!mx_group_size_ok(group_size))
        return mx_fail(e, MX_EUNSUPPORTED, "%s: group_size %d is not supported (32, 64 or 128)",
                       nm, group_size);
    int64_t wl = w->shape[nd - 1], ng = scales->shape[nd - 1], rows = w->shape[nd - 2];
    if (wl <= 0 || ng <= 0 || rows <= 0 || ng > INT64_MAX / 256 / group_size)
        return mx_fail(e, MX_EFORMAT, "%s: weight %s, scales %s: empty or oversized dimensions",
                       nm, sw, ss);
    int64_t cols = ng * group_size;
    int implied = (32 * wl) % cols == 0 ? (int)((32 * wl) / cols) : 0;
    if (bits > 0) {
        if (!mx_qtraits_for(bits))
            return mx_fail(e, MX_EUNSUPPORTED, "%s: %d-bit quantization is not supported "
                           "(2, 3, 4, 5, 6, 8)", nm, bits);
        if (implied != bits) {
            if (implied)
                return mx_fail(e, MX_EFORMAT, "%s: config says %d bits but shapes imply %d",
                               nm, bits, implied);
            return mx_fail(e, MX_EFORMAT, "%s: config says %d bits but weight %s and scales %s "
                           "do not fit any bit width with group_size %d", nm, bits, sw, ss,
                           group_size);
        }
    } else {
        if (!implied || !mx_qtraits_for(implied))
            return mx_fail(e, implied ? MX_EUNSUPPORTED : MX_EFORMAT,
                           "%s: weight %s and scales %s with group_size %d imply %s bits",
                           nm, sw, ss, group_size, implied ? "unsupported" : "a fractional number of");
        bits = implied;
    }
    int64_t nmat = 1;
    for (int i = 0; i < nd - 2; i++)
        nmat *= w->shape[i];
    if (index < 0 || index >= nmat)
        return mx_fail(e, MX_ERANGE, "%s: matrix index %" PRId64 " outside the stack of %" PRId64,
                       nm, index, nmat);
    int64_t nw = tensor_need(w), nsc = tensor_need(scales), nb = tensor_need(biases);
    if (nw < 0 || nsc < 0 || nb < 0 || (size_t)nw > w->nbytes || (size_t)nsc > scales->nbytes ||
        (size_t)nb > biases->nbytes || !w->data || !scales->data || !biases->data)
        return mx_fail(e, MX_EFORMAT, "%s: tensor data smaller than its shape", nm);
    size_t ssz = mx_dtype_size(scales->dtype);
    memset(out, 0, sizeof *out);
    out->rows = rows;
    out->cols = cols;
    out->bits = bits;
    out->group_size = group_size;
    out->sdtype = scales->dtype;
    out->w = (const uint8_t *)w->data + (size_t)(index * rows * wl * 4);
    out->scales = (const uint8_t *)scales->data + (size_t)(index * rows * ng) * ssz;
    out->biases = (const uint8_t *)biases->data + (size_t)(index * rows * ng) * ssz;
    return MX_OK;
}

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

/* ---- run-time kernel selection ----------------------------------------- */

static const char *const g_names[] = {
    "scalar",
#if defined(__x86_64__) || defined(__i386__)
    "avx2", "avx512", "avx512vnni",
#endif
#if defined(__aarch64__)
    "neon",
#endif
    NULL,
};

const char *const *mx_qkernels_names(void) { return g_names; }

#if defined(__x86_64__) || defined(__i386__)
static int cpu_f16c(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return 0;
    return (c & bit_F16C) != 0;
}
#endif

const mx_qkernels *mx_qkernels_get(const char *name)
{
    if (!name)
        return NULL;
    if (!strcmp(name, "scalar"))
        return &mx_qk_scalar;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    int avx2 = mx_qk_avx2_built && __builtin_cpu_supports("avx2") &&
               __builtin_cpu_supports("fma") && cpu_f16c();
    if (!strcmp(name, "avx2"))
        return avx2 ? &mx_qk_avx2 : NULL;
    int avx512 = avx2 && mx_qk_avx512_built && __builtin_cpu_supports("avx512f") &&
                 __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    if (!strcmp(name, "avx512"))
        return avx512 ? &mx_qk_avx512 : NULL;
    if (!strcmp(name, "avx512vnni"))
        return avx512 && mx_qk_avx512vnni_built && __builtin_cpu_supports("avx512vnni")
                   ? &mx_qk_avx512vnni : NULL;
#endif
#if defined(__aarch64__)
    if (!strcmp(name, "neon"))
        return &mx_qk_neon;
#endif
    return NULL;
}

static const mx_qkernels *best(void)
{
    const mx_qkernels *k = NULL;
#if defined(__x86_64__) || defined(__i386__)
    if (!(k = mx_qkernels_get("avx512vnni")) && !(k = mx_qkernels_get("avx512")))
        k = mx_qkernels_get("avx2");
#elif defined(__aarch64__)
    k = mx_qkernels_get("neon");
#endif
    return k ? k : &mx_qk_scalar;
}

static const mx_qkernels *g_auto;
static const mx_qkernels *g_forced;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void choose(void)
{
    const char *env = getenv("MLXCEL_KERNEL");
    const mx_qkernels *k = NULL;
    if (env && *env) {
        k = mx_qkernels_get(env);
        if (!k)
            fprintf(stderr, "mlxcel: MLXCEL_KERNEL=%s is unknown or not supported by this CPU; "
                            "using %s\n", env, best()->name);
    }
    g_auto = k ? k : best();
}

const mx_qkernels *mx_qkernels_active(void)
{
    const mx_qkernels *f = __atomic_load_n(&g_forced, __ATOMIC_ACQUIRE);
    if (f)
        return f;
    pthread_once(&g_once, choose);
    return g_auto;
}

int mx_qkernels_force(const char *name)
{
    if (!name) {
        __atomic_store_n(&g_forced, NULL, __ATOMIC_RELEASE);
        return 0;
    }
    const mx_qkernels *k = mx_qkernels_get(name);
    if (!k)
        return -1;
    __atomic_store_n(&g_forced, k, __ATOMIC_RELEASE);
    return 0;
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
