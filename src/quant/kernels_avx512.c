/* kernels_avx512.c - AVX-512 (F/BW/VL/DQ) kernels.
 *
 * matvec (decode) streams each weight byte once, so it is bound by memory
 * bandwidth: the inner loop only has to unpack fast enough to keep up.  A
 * 4-bit unit is 16 bytes = 32 values: low and high nibbles are masked out and
 * interleaved back into natural order with unpacklo/hi_epi8, widened to 16
 * x i32, converted and FMA'd against x.  Per group, s * sum(q x) goes into a
 * vector accumulator and b * xsum[g] into a scalar one (see quant.h).
 *
 * matmul (prefill) dequantizes a tile of RB rows x KC columns once into a
 * transposed float buffer tile[k][r] and reuses it for every token: for each
 * k, RB/16 vectors of weights are multiplied by a broadcast x[t][k] for TB
 * tokens at a time, so the accumulators are whole output rows Y[t][r..r+RB)
 * and no horizontal sums are needed. */
#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>

#include "quant/qint.h"

#define RB 32            /* weight rows per matmul tile (2 zmm) */
#define KC 256           /* columns per tile: 32 KB of floats, L1-sized */
#define TB 12            /* tokens per register block: 24 accumulators */

static inline float load_s(const void *p, mx_dtype t, int64_t i)
{
    if (t == MX_F16)
        return _cvtsh_ss(((const uint16_t *)p)[i]);
    if (t == MX_BF16) {
        uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    return ((const float *)p)[i];
}

/* 16 packed bytes -> 32 4-bit values as two vectors of 16 floats. */
static inline void unpack4(const uint8_t *p, __m512 *a, __m512 *b)
{
    const __m128i m = _mm_set1_epi8(0x0f);
    __m128i v = _mm_loadu_si128((const __m128i *)p);
    __m128i lo = _mm_and_si128(v, m);
    __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), m);
    *a = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi)));
    *b = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpackhi_epi8(lo, hi)));
}

static inline __m512 unpack8(const uint8_t *p)
{
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)));
}

/* ---- matvec -------------------------------------------------------------- */

static inline __attribute__((always_inline)) void
mv4(const mx_qmat *m, const float *x, const float *xsum, float *y, int64_t r0, int64_t r1,
    const int gs)
{
    int64_t ng = mx_qmat_groups(m), rb = mx_qmat_row_bytes(m);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *p = m->w + r * rb;
        __m512 acc = _mm512_setzero_ps();
        float bacc = 0;
        for (int64_t g = 0; g < ng; g++) {
            const float *xg = x + g * gs;
            __m512 d0 = _mm512_setzero_ps(), d1 = _mm512_setzero_ps();
            for (int u = 0; u < gs; u += 32) {
                __m512 a, b;
                unpack4(p + u / 2, &a, &b);
                d0 = _mm512_fmadd_ps(a, _mm512_loadu_ps(xg + u), d0);
                d1 = _mm512_fmadd_ps(b, _mm512_loadu_ps(xg + u + 16), d1);
            }
            p += gs / 2;
            float s = load_s(m->scales, m->sdtype, r * ng + g);
            float bi = load_s(m->biases, m->sdtype, r * ng + g);
            acc = _mm512_fmadd_ps(_mm512_add_ps(d0, d1), _mm512_set1_ps(s), acc);
            bacc += bi * xsum[g];
        }
        y[r - r0] = _mm512_reduce_add_ps(acc) + bacc;
    }
}

static inline __attribute__((always_inline)) void
mv8(const mx_qmat *m, const float *x, const float *xsum, float *y, int64_t r0, int64_t r1,
    const int gs)
{
    int64_t ng = mx_qmat_groups(m), rb = mx_qmat_row_bytes(m);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *p = m->w + r * rb;
        __m512 acc = _mm512_setzero_ps();
        float bacc = 0;
        for (int64_t g = 0; g < ng; g++) {
            const float *xg = x + g * gs;
            __m512 d0 = _mm512_setzero_ps(), d1 = _mm512_setzero_ps();
            for (int u = 0; u < gs; u += 32) {
                d0 = _mm512_fmadd_ps(unpack8(p + u), _mm512_loadu_ps(xg + u), d0);
                d1 = _mm512_fmadd_ps(unpack8(p + u + 16), _mm512_loadu_ps(xg + u + 16), d1);
            }
            p += gs;
            float s = load_s(m->scales, m->sdtype, r * ng + g);
            float bi = load_s(m->biases, m->sdtype, r * ng + g);
            acc = _mm512_fmadd_ps(_mm512_add_ps(d0, d1), _mm512_set1_ps(s), acc);
            bacc += bi * xsum[g];
        }
        y[r - r0] = _mm512_reduce_add_ps(acc) + bacc;
    }
}

/* Other widths: unpack a group to bytes with the generic unpacker. */
static void mv_generic(const mx_qmat *m, const float *x, const float *xsum, float *y,
                       int64_t r0, int64_t r1)
{
    int gs = m->group_size;
    int64_t ng = mx_qmat_groups(m);
    uint8_t q[128];
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = mx_q_row_ptr(m, r);
        __m512 acc = _mm512_setzero_ps();
        float bacc = 0;
        for (int64_t g = 0; g < ng; g++) {
            const float *xg = x + g * gs;
            mx_q_unpack(row, m->bits, g * gs, gs, q);
            __m512 d0 = _mm512_setzero_ps(), d1 = _mm512_setzero_ps();
            for (int u = 0; u < gs; u += 32) {
                d0 = _mm512_fmadd_ps(unpack8(q + u), _mm512_loadu_ps(xg + u), d0);
                d1 = _mm512_fmadd_ps(unpack8(q + u + 16), _mm512_loadu_ps(xg + u + 16), d1);
            }
            float s = load_s(m->scales, m->sdtype, r * ng + g);
            float bi = load_s(m->biases, m->sdtype, r * ng + g);
            acc = _mm512_fmadd_ps(_mm512_add_ps(d0, d1), _mm512_set1_ps(s), acc);
            bacc += bi * xsum[g];
        }
        y[r - r0] = _mm512_reduce_add_ps(acc) + bacc;
    }
}

static void matvec_rows_avx512(const mx_qmat *m, const float *x, const float *xsum,
                               float *y, int64_t r0, int64_t r1)
{
    int gs = m->group_size;
    if (m->bits == 4) {
        if (gs == 64) mv4(m, x, xsum, y, r0, r1, 64);
        else if (gs == 32) mv4(m, x, xsum, y, r0, r1, 32);
        else mv4(m, x, xsum, y, r0, r1, 128);
    } else if (m->bits == 8) {
        if (gs == 64) mv8(m, x, xsum, y, r0, r1, 64);
        else if (gs == 32) mv8(m, x, xsum, y, r0, r1, 32);
        else mv8(m, x, xsum, y, r0, r1, 128);
    } else {
        mv_generic(m, x, xsum, y, r0, r1);
    }
}

/* ---- matmul -------------------------------------------------------------- */

/* Dequantizes columns [k0, k0+n) of row r into out (k0, n multiples of gs). */
static void dequant_range(const mx_qmat *m, int64_t r, int64_t k0, int64_t n, float *out)
{
    int gs = m->group_size, bits = m->bits;
    if (bits != 4 && bits != 8) {
        mx_q_dequant_generic(m, r, k0, n, out);
        return;
    }
    int64_t ng = mx_qmat_groups(m);
    const uint8_t *row = mx_q_row_ptr(m, r);
    for (int64_t k = k0; k < k0 + n; k += gs) {
        __m512 s = _mm512_set1_ps(load_s(m->scales, m->sdtype, r * ng + k / gs));
        __m512 b = _mm512_set1_ps(load_s(m->biases, m->sdtype, r * ng + k / gs));
        float *o = out + (k - k0);
        for (int u = 0; u < gs; u += 32) {
            __m512 qa, qb;
            if (bits == 4) {
                unpack4(row + (k + u) / 2, &qa, &qb);
            } else {
                qa = unpack8(row + k + u);
                qb = unpack8(row + k + u + 16);
            }
            _mm512_storeu_ps(o + u, _mm512_fmadd_ps(qa, s, b));
            _mm512_storeu_ps(o + u + 16, _mm512_fmadd_ps(qb, s, b));
        }
    }
}

/* Y[t][0..nr) (+)= sum_k tile[k][0..nr) * X[t][k] for nt tokens. */
static inline __attribute__((always_inline)) void
tile_mul(const float *tile, int64_t kc, const float *X, int64_t ldx, float *Y, int64_t ldy,
         __mmask16 m0, __mmask16 m1, int first, const int nt)
{
    __m512 c0[TB], c1[TB];
    for (int j = 0; j < nt; j++) {
        if (first) {
            c0[j] = _mm512_setzero_ps();
            c1[j] = _mm512_setzero_ps();
        } else {
            c0[j] = _mm512_maskz_loadu_ps(m0, Y + j * ldy);
            c1[j] = _mm512_maskz_loadu_ps(m1, Y + j * ldy + 16);
        }
    }
    for (int64_t k = 0; k < kc; k++) {
        __m512 w0 = _mm512_load_ps(tile + k * RB);
        __m512 w1 = _mm512_load_ps(tile + k * RB + 16);
        for (int j = 0; j < nt; j++) {
            __m512 xb = _mm512_set1_ps(X[j * ldx + k]);
            c0[j] = _mm512_fmadd_ps(w0, xb, c0[j]);
            c1[j] = _mm512_fmadd_ps(w1, xb, c1[j]);
        }
    }
    for (int j = 0; j < nt; j++) {
        _mm512_mask_storeu_ps(Y + j * ldy, m0, c0[j]);
        _mm512_mask_storeu_ps(Y + j * ldy + 16, m1, c1[j]);
    }
}

static void matmul_rows_avx512(const mx_qmat *m, const float *X, int64_t ldx, int64_t T,
                               float *Y, int64_t ldy, int64_t r0, int64_t r1)
{
    _Alignas(64) float tile[KC * RB];
    _Alignas(64) float rowbuf[KC];
    for (int64_t rt = r0; rt < r1; rt += RB) {
        int nr = (int)(r1 - rt < RB ? r1 - rt : RB);
        __mmask16 m0 = (__mmask16)(nr >= 16 ? 0xffff : (1u << nr) - 1);
        __mmask16 m1 = (__mmask16)(nr >= 32 ? 0xffff : nr > 16 ? (1u << (nr - 16)) - 1 : 0);
        for (int64_t k0 = 0; k0 < m->cols; k0 += KC) {
            int64_t kc = m->cols - k0 < KC ? m->cols - k0 : KC;
            for (int i = 0; i < RB; i++) {
                if (i < nr)
                    dequant_range(m, rt + i, k0, kc, rowbuf);
                else
                    memset(rowbuf, 0, (size_t)kc * sizeof *rowbuf);
                for (int64_t k = 0; k < kc; k++)
                    tile[k * RB + i] = rowbuf[k];
            }
            int first = k0 == 0;
            int64_t t = 0;
            for (; t + TB <= T; t += TB)
                tile_mul(tile, kc, X + t * ldx + k0, ldx, Y + t * ldy + rt, ldy, m0, m1, first, TB);
            for (; t + 4 <= T; t += 4)
                tile_mul(tile, kc, X + t * ldx + k0, ldx, Y + t * ldy + rt, ldy, m0, m1, first, 4);
            for (; t < T; t++)
                tile_mul(tile, kc, X + t * ldx + k0, ldx, Y + t * ldy + rt, ldy, m0, m1, first, 1);
        }
    }
}

const mx_qkernels mx_qk_avx512 = {
    .name = "avx512",
    .matvec_rows = matvec_rows_avx512,
    .matmul_rows = matmul_rows_avx512,
};

#elif defined(__x86_64__)
/* Built without the AVX-512 flags (not through CMake): keep the symbol so the
 * table links, and run the reference code. */
#include "quant/qint.h"
static void mv_ref(const mx_qmat *m, const float *x, const float *xs, float *y, int64_t a, int64_t b)
{
    mx_qk_scalar.matvec_rows(m, x, xs, y, a, b);
}
static void mm_ref(const mx_qmat *m, const float *X, int64_t ldx, int64_t T, float *Y,
                   int64_t ldy, int64_t a, int64_t b)
{
    mx_qk_scalar.matmul_rows(m, X, ldx, T, Y, ldy, a, b);
}
const mx_qkernels mx_qk_avx512 = { .name = "avx512", .matvec_rows = mv_ref, .matmul_rows = mm_ref };
#else
typedef int mx_kernels_avx512_unused;
#endif
