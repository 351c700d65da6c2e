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
#include <math.h>

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

/* Columns of x handled per pass; x is re-laid out per pass into a stack
 * buffer of this many floats (16 KB), so no allocation per call. */
#define XCH 4096

/* 2/4/8 bits: one zmm load = 16 u32 lanes, lane j holding values
 * vpl*j + k (k < vpl = 32/bits) at bits [k*bits, (k+1)*bits).  Masking lane
 * bits with mask << (k*bits) and converting gives q * 2^(k*bits) exactly, so
 * x is laid out once per call as xp[blk][k][j] = x[blk*16*vpl + vpl*j + k] *
 * 2^(-k*bits): no shifts and no byte shuffles in the inner loop, one AND, one
 * convert and one FMA per 16 values (the trick MLX's Metal qmv uses).  Group
 * scales become a per-lane vector (lane j belongs to group j / lanes per
 * group) and the bias term is a separate dot of biases with xsum. */
static inline __attribute__((always_inline)) void
mv_pow2(const mx_qmat *m, const float *x, const float *xsum, float *y, int64_t r0, int64_t r1,
        const int bits)
{
    const int vpl = 32 / bits, vpb = 16 * vpl;
    const int gs = m->group_size, lpg = gs / vpl;           /* lanes per group */
    const int64_t ng = mx_qmat_groups(m), rb = mx_qmat_row_bytes(m);
    _Alignas(64) float xp[XCH];
    _Alignas(64) float sc[XCH / 32 + 16];
    const __m512i idx = _mm512_set_epi32(15 / lpg, 14 / lpg, 13 / lpg, 12 / lpg, 11 / lpg, 10 / lpg,
                                         9 / lpg, 8 / lpg, 7 / lpg, 6 / lpg, 5 / lpg, 4 / lpg,
                                         3 / lpg, 2 / lpg, 1 / lpg, 0);
    for (int64_t c0 = 0; c0 < m->cols; c0 += XCH) {
        int n = (int)(m->cols - c0 < XCH ? m->cols - c0 : XCH);      /* multiple of gs */
        int nblk = (n + vpb - 1) / vpb, ngc = n / gs;
        for (int b = 0; b < nblk; b++)
            for (int k = 0; k < vpl; k++) {
                float f = ldexpf(1.0f, -k * bits);
                for (int j = 0; j < 16; j++) {
                    int i = b * vpb + vpl * j + k;
                    xp[b * vpb + k * 16 + j] = i < n ? x[c0 + i] * f : 0.0f;
                }
            }
        for (int g = ngc; g < ngc + 16; g++)
            sc[g] = 0;          /* padding lanes multiply zeros: keep them finite */
        for (int64_t r = r0; r < r1; r++) {
            const uint8_t *wp = m->w + r * rb + c0 * bits / 8;
            const void *sp = m->scales, *bp = m->biases;
            int64_t g0 = r * ng + c0 / gs;
            /* scales of this row's groups -> sc; bias term as a dot product */
            __m512 bacc = _mm512_setzero_ps();
            for (int g = 0; g < ngc; g += 16) {
                __mmask16 gm = (__mmask16)(ngc - g >= 16 ? 0xffff : (1u << (ngc - g)) - 1);
                __m512 s16, b16;
                if (m->sdtype == MX_F16) {
                    s16 = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(gm, (const uint16_t *)sp + g0 + g));
                    b16 = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(gm, (const uint16_t *)bp + g0 + g));
                } else if (m->sdtype == MX_BF16) {
                    s16 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(
                        _mm256_maskz_loadu_epi16(gm, (const uint16_t *)sp + g0 + g)), 16));
                    b16 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(
                        _mm256_maskz_loadu_epi16(gm, (const uint16_t *)bp + g0 + g)), 16));
                } else {
                    s16 = _mm512_maskz_loadu_ps(gm, (const float *)sp + g0 + g);
                    b16 = _mm512_maskz_loadu_ps(gm, (const float *)bp + g0 + g);
                }
                _mm512_mask_storeu_ps(sc + g, gm, s16);
                bacc = _mm512_fmadd_ps(b16, _mm512_maskz_loadu_ps(gm, xsum + c0 / gs + g), bacc);
            }
            __m512 acc = _mm512_setzero_ps();
            for (int b = 0; b < nblk; b++) {
                int lanes = (n - b * vpb) / vpl;
                __mmask16 lm = (__mmask16)(lanes >= 16 ? 0xffff : (1u << lanes) - 1);
                __m512i v = _mm512_maskz_loadu_epi32(lm, wp + b * 64);
                const float *xb = xp + b * vpb;
                __m512 d0 = _mm512_setzero_ps(), d1 = _mm512_setzero_ps();
                for (int k = 0; k < vpl; k += 2) {
                    __m512i q0 = _mm512_and_si512(v, _mm512_set1_epi32((int)((uint32_t)((1u << bits) - 1) << (k * bits))));
                    __m512i q1 = _mm512_and_si512(v, _mm512_set1_epi32((int)((uint32_t)((1u << bits) - 1) << ((k + 1) * bits))));
                    d0 = _mm512_fmadd_ps(_mm512_cvtepu32_ps(q0), _mm512_load_ps(xb + k * 16), d0);
                    d1 = _mm512_fmadd_ps(_mm512_cvtepu32_ps(q1), _mm512_load_ps(xb + (k + 1) * 16), d1);
                }
                __m512 sv = lpg >= 16 ? _mm512_set1_ps(sc[b * 16 / lpg])
                                      : _mm512_permutexvar_ps(idx, _mm512_loadu_ps(sc + b * 16 / lpg));
                acc = _mm512_fmadd_ps(_mm512_add_ps(d0, d1), sv, acc);
            }
            float yr = _mm512_reduce_add_ps(acc) + _mm512_reduce_add_ps(bacc);
            y[r - r0] = c0 == 0 ? yr : y[r - r0] + yr;
        }
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

static void matvec_rows_avx512(const mx_qmat *m, const float *x, const void *xp,
                               float *y, int64_t r0, int64_t r1)
{
    const float *xsum = xp;   /* prep: the group sums */
    if (m->bits == 4)
        mv_pow2(m, x, xsum, y, r0, r1, 4);
    else if (m->bits == 8)
        mv_pow2(m, x, xsum, y, r0, r1, 8);
    else if (m->bits == 2)
        mv_pow2(m, x, xsum, y, r0, r1, 2);
    else
        mv_generic(m, x, xsum, y, r0, r1);
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

const int mx_qk_avx512_built = 1;

const mx_qkernels mx_qk_avx512 = {
    .name = "avx512",
    .prep_bytes = mx_q_sums_bytes,
    .prep = mx_q_sums_prep,
    .matvec_rows = matvec_rows_avx512,
    .matmul_rows = matmul_rows_avx512,
};

#elif defined(__x86_64__)
/* Built without the AVX-512 flags (not through CMake): the variant exists so
 * the table links, but is never offered (mx_qkernels_get checks
 * mx_qk_avx512_built). */
#include "quant/qint.h"
const int mx_qk_avx512_built = 0;
const mx_qkernels mx_qk_avx512 = { .name = "avx512", .prep_bytes = mx_q_sums_bytes,
                                .prep = mx_q_sums_prep, .matvec_rows = NULL, .matmul_rows = NULL };
#else
typedef int mx_kernels_avx512_unused;
#endif
