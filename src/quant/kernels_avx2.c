/* kernels_avx2.c - AVX2 + FMA + F16C kernels.
 *
 * Same structure as kernels_avx512.c with 8-float vectors: matvec unpacks 16
 * bytes (32 4-bit values) per step with mask/shift + unpacklo/hi_epi8 so the
 * values come out in natural order, widens 8 at a time and FMAs against x;
 * the group identity s*sum(q x) + b*sum(x) keeps the bias out of the inner
 * loop.  matmul dequantizes RB x KC tiles, transposed, once per tile and
 * reuses them for all tokens, TB tokens per register block. */
#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#include <math.h>

#include "quant/qint.h"

#define RB 16            /* weight rows per matmul tile (2 ymm) */
#define KC 256           /* columns per tile: 16 KB of floats */
#define TB 6             /* tokens per register block: 12 accumulators */

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

static inline float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline __m256 cvt8(__m128i bytes) /* low 8 bytes -> 8 floats */
{
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
}

/* 16 packed bytes -> 32 4-bit values, as four vectors of 8 floats. */
static inline void unpack4(const uint8_t *p, __m256 f[4])
{
    const __m128i m = _mm_set1_epi8(0x0f);
    __m128i v = _mm_loadu_si128((const __m128i *)p);
    __m128i lo = _mm_and_si128(v, m);
    __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), m);
    __m128i a = _mm_unpacklo_epi8(lo, hi), b = _mm_unpackhi_epi8(lo, hi);
    f[0] = cvt8(a);
    f[1] = cvt8(_mm_srli_si128(a, 8));
    f[2] = cvt8(b);
    f[3] = cvt8(_mm_srli_si128(b, 8));
}

static inline __m256 unpack8(const uint8_t *p)
{
    return cvt8(_mm_loadl_epi64((const __m128i *)p));
}

/* ---- matvec -------------------------------------------------------------- */

/* Columns of x handled per pass (x is re-laid out per pass on the stack). */
#define XCH 4096

/* 2/4/8 bits: see kernels_avx512.c.  One ymm load = 8 u32 lanes, lane j
 * holding values vpl*j + k; masking with mask << (k*bits) and converting
 * gives q * 2^(k*bits), so x is laid out once per call pre-scaled by
 * 2^(-k*bits).  AVX2 only converts signed i32, so the top value of each lane
 * (which can set bit 31) is shifted down instead and its x is unscaled. */
static inline __attribute__((always_inline)) void
mv_pow2(const mx_qmat *m, const float *x, const float *xsum, float *y, int64_t r0, int64_t r1,
        const int bits)
{
    const int vpl = 32 / bits, vpb = 8 * vpl;
    const int gs = m->group_size, lpg = gs / vpl;           /* lanes per group */
    const int64_t ng = mx_qmat_groups(m), rb = mx_qmat_row_bytes(m);
    _Alignas(32) float xp[XCH];
    float sc[XCH / 32 + 8];
    const __m256i idx = _mm256_set_epi32(7 / lpg, 6 / lpg, 5 / lpg, 4 / lpg, 3 / lpg, 2 / lpg,
                                         1 / lpg, 0);
    for (int64_t c0 = 0; c0 < m->cols; c0 += XCH) {
        int n = (int)(m->cols - c0 < XCH ? m->cols - c0 : XCH);      /* multiple of gs */
        int nblk = (n + vpb - 1) / vpb, ngc = n / gs;
        for (int b = 0; b < nblk; b++)
            for (int k = 0; k < vpl; k++) {
                float f = k == vpl - 1 ? 1.0f : ldexpf(1.0f, -k * bits);
                for (int j = 0; j < 8; j++) {
                    int i = b * vpb + vpl * j + k;
                    xp[b * vpb + k * 8 + j] = i < n ? x[c0 + i] * f : 0.0f;
                }
            }
        for (int g = ngc; g < ngc + 8; g++)
            sc[g] = 0;          /* padding lanes multiply zeros: keep them finite */
        for (int64_t r = r0; r < r1; r++) {
            const uint8_t *wp = m->w + r * rb + c0 * bits / 8;
            int64_t g0 = r * ng + c0 / gs;
            float bacc = 0;
            for (int g = 0; g < ngc; g++) {
                sc[g] = load_s(m->scales, m->sdtype, g0 + g);
                bacc += load_s(m->biases, m->sdtype, g0 + g) * xsum[c0 / gs + g];
            }
            __m256 acc = _mm256_setzero_ps();
            for (int b = 0; b < nblk; b++) {
                int lanes = (n - b * vpb) / vpl;
                __m256i v;
                if (lanes >= 8) {
                    v = _mm256_loadu_si256((const __m256i *)(wp + b * 32));
                } else {
                    __m256i lm = _mm256_cmpgt_epi32(_mm256_set1_epi32(lanes),
                                                    _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
                    v = _mm256_maskload_epi32((const int *)(wp + b * 32), lm);
                }
                const float *xb = xp + b * vpb;
                __m256 d0 = _mm256_setzero_ps(), d1 = _mm256_setzero_ps();
                for (int k = 0; k < vpl - 2; k += 2) {
                    __m256i q0 = _mm256_and_si256(v, _mm256_set1_epi32((int)((uint32_t)((1u << bits) - 1) << (k * bits))));
                    __m256i q1 = _mm256_and_si256(v, _mm256_set1_epi32((int)((uint32_t)((1u << bits) - 1) << ((k + 1) * bits))));
                    d0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q0), _mm256_load_ps(xb + k * 8), d0);
                    d1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q1), _mm256_load_ps(xb + (k + 1) * 8), d1);
                }
                {
                    int k = vpl - 2;
                    __m256i q0 = _mm256_and_si256(v, _mm256_set1_epi32((int)((uint32_t)((1u << bits) - 1) << (k * bits))));
                    __m256i q1 = _mm256_srli_epi32(v, 32 - bits);
                    d0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q0), _mm256_load_ps(xb + k * 8), d0);
                    d1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q1), _mm256_load_ps(xb + (k + 1) * 8), d1);
                }
                __m256 sv = lpg >= 8 ? _mm256_set1_ps(sc[b * 8 / lpg])
                                     : _mm256_permutevar8x32_ps(_mm256_loadu_ps(sc + b * 8 / lpg), idx);
                acc = _mm256_fmadd_ps(_mm256_add_ps(d0, d1), sv, acc);
            }
            float yr = hsum8(acc) + bacc;
            y[r - r0] = c0 == 0 ? yr : y[r - r0] + yr;
        }
    }
}

/* 8-bit values, or bytes from the generic unpacker (q != NULL). */
static inline __attribute__((always_inline)) void
mv8(const mx_qmat *m, const float *x, const float *xsum, float *y, int64_t r0, int64_t r1,
    const int gs, int generic)
{
    int64_t ng = mx_qmat_groups(m), rb = mx_qmat_row_bytes(m);
    uint8_t q[128];
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = m->w + r * rb;
        __m256 acc = _mm256_setzero_ps();
        float bacc = 0;
        for (int64_t g = 0; g < ng; g++) {
            const float *xg = x + g * gs;
            const uint8_t *p = row + g * gs;
            if (generic) {
                mx_q_unpack(row, m->bits, g * gs, gs, q);
                p = q;
            }
            __m256 d0 = _mm256_setzero_ps(), d1 = _mm256_setzero_ps();
            for (int u = 0; u < gs; u += 16) {
                d0 = _mm256_fmadd_ps(unpack8(p + u), _mm256_loadu_ps(xg + u), d0);
                d1 = _mm256_fmadd_ps(unpack8(p + u + 8), _mm256_loadu_ps(xg + u + 8), d1);
            }
            float s = load_s(m->scales, m->sdtype, r * ng + g);
            float bi = load_s(m->biases, m->sdtype, r * ng + g);
            acc = _mm256_fmadd_ps(_mm256_add_ps(d0, d1), _mm256_set1_ps(s), acc);
            bacc += bi * xsum[g];
        }
        y[r - r0] = hsum8(acc) + bacc;
    }
}

static void matvec_rows_avx2(const mx_qmat *m, const float *x, const void *xp,
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
        mv8(m, x, xsum, y, r0, r1, m->group_size, 1);
}

/* ---- matmul -------------------------------------------------------------- */

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
        __m256 s = _mm256_set1_ps(load_s(m->scales, m->sdtype, r * ng + k / gs));
        __m256 b = _mm256_set1_ps(load_s(m->biases, m->sdtype, r * ng + k / gs));
        float *o = out + (k - k0);
        for (int u = 0; u < gs; u += 32) {
            __m256 f[4];
            if (bits == 4) {
                unpack4(row + (k + u) / 2, f);
            } else {
                for (int i = 0; i < 4; i++)
                    f[i] = unpack8(row + k + u + 8 * i);
            }
            for (int i = 0; i < 4; i++)
                _mm256_storeu_ps(o + u + 8 * i, _mm256_fmadd_ps(f[i], s, b));
        }
    }
}

/* Y[t][0..RB) (+)= sum_k tile[k][0..RB) * X[t][k] for nt tokens; Y here is a
 * full-width scratch block (partial tiles are copied in and out by the caller). */
static inline __attribute__((always_inline)) void
tile_mul(const float *tile, int64_t kc, const float *X, int64_t ldx, float *Y, int64_t ldy,
         int first, const int nt)
{
    __m256 c0[TB], c1[TB];
    for (int j = 0; j < nt; j++) {
        c0[j] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(Y + j * ldy);
        c1[j] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(Y + j * ldy + 8);
    }
    for (int64_t k = 0; k < kc; k++) {
        __m256 w0 = _mm256_load_ps(tile + k * RB);
        __m256 w1 = _mm256_load_ps(tile + k * RB + 8);
        for (int j = 0; j < nt; j++) {
            __m256 xb = _mm256_broadcast_ss(X + j * ldx + k);
            c0[j] = _mm256_fmadd_ps(w0, xb, c0[j]);
            c1[j] = _mm256_fmadd_ps(w1, xb, c1[j]);
        }
    }
    for (int j = 0; j < nt; j++) {
        _mm256_storeu_ps(Y + j * ldy, c0[j]);
        _mm256_storeu_ps(Y + j * ldy + 8, c1[j]);
    }
}

static void tile_tokens(const float *tile, int64_t kc, const float *X, int64_t ldx, int64_t T,
                        float *Y, int64_t ldy, int first)
{
    int64_t t = 0;
    for (; t + TB <= T; t += TB)
        tile_mul(tile, kc, X + t * ldx, ldx, Y + t * ldy, ldy, first, TB);
    for (; t + 2 <= T; t += 2)
        tile_mul(tile, kc, X + t * ldx, ldx, Y + t * ldy, ldy, first, 2);
    for (; t < T; t++)
        tile_mul(tile, kc, X + t * ldx, ldx, Y + t * ldy, ldy, first, 1);
}

static void matmul_rows_avx2(const mx_qmat *m, const float *X, int64_t ldx, int64_t T,
                             float *Y, int64_t ldy, int64_t r0, int64_t r1)
{
    _Alignas(32) float tile[KC * RB];
    _Alignas(32) float rowbuf[KC];
    float part[TB * RB];             /* scratch for a partial tile's outputs */
    for (int64_t rt = r0; rt < r1; rt += RB) {
        int nr = (int)(r1 - rt < RB ? r1 - rt : RB);
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
            if (nr == RB) {
                tile_tokens(tile, kc, X + k0, ldx, T, Y + rt, ldy, first);
                continue;
            }
            /* partial tile: go through a full-width scratch block */
            for (int64_t t0 = 0; t0 < T; t0 += TB) {
                int64_t nt = T - t0 < TB ? T - t0 : TB;
                for (int64_t j = 0; j < nt; j++)
                    for (int i = 0; i < RB; i++)
                        part[j * RB + i] = first || i >= nr ? 0 : Y[(t0 + j) * ldy + rt + i];
                tile_tokens(tile, kc, X + t0 * ldx + k0, ldx, nt, part, RB, first);
                for (int64_t j = 0; j < nt; j++)
                    for (int i = 0; i < nr; i++)
                        Y[(t0 + j) * ldy + rt + i] = part[j * RB + i];
            }
        }
    }
}

const int mx_qk_avx2_built = 1;

const mx_qkernels mx_qk_avx2 = {
    .name = "avx2",
    .prep_bytes = mx_q_sums_bytes,
    .prep = mx_q_sums_prep,
    .matvec_rows = matvec_rows_avx2,
    .matmul_rows = matmul_rows_avx2,
};

#elif defined(__x86_64__)
/* Built without the AVX2 flags (not through CMake): the variant exists so
 * the table links, but is never offered (mx_qkernels_get checks
 * mx_qk_avx2_built). */
#include "quant/qint.h"
const int mx_qk_avx2_built = 0;
const mx_qkernels mx_qk_avx2 = { .name = "avx2", .prep_bytes = mx_q_sums_bytes,
                                .prep = mx_q_sums_prep, .matvec_rows = NULL, .matmul_rows = NULL };
#else
typedef int mx_kernels_avx2_unused;
#endif
