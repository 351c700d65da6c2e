/* kernels_vnni.c - AVX-512 VNNI integer kernels ("avx512vnni").
 *
 * vpdpbusd multiplies 64 unsigned bytes by 64 signed bytes and adds each run
 * of four products into a 32-bit lane: 64 multiply-adds per instruction
 * against 16 for a float FMA.  Weights are already small unsigned integers
 * (q = 0..15 for 4 bits, 0..255 for 8), so only x has to become integer.
 *
 * Precision.  Plain int8 x (llama.cpp's Q8) loses ~0.4% per value.  Two
 * int8 levels (16 bits per group) were tried first: the fixture models'
 * logits then differ from the reference by 1.2-2.6e-3 (limit 1e-3; the float
 * kernels: ~1e-5), still 4-17e-4 with the bias term taken from the quantized
 * group sums, and the error scaled exactly with the step.  So x is
 * quantized to 24 bits per group of the weight's group size, as three
 * signed bytes:
 *     x[c] ~= dx_g * x24[c],  x24 = 65536*xh + 256*xm + xl,  |x24| <= 8e6
 *     sum_c q[c] x[c] ~= dx_g * (65536*sum q*xh + 256*sum q*xm + sum q*xl)
 * The error per value is about one step, amax_g/8e6 (~1e-7 of the group's
 * largest |x|): as close as float rounding (logits ~1e-5 off, like the float
 * variants).  Each level is one vpdpbusd; levels are combined with integer
 * shifts where the lane sums fit in 32 bits, otherwise in float.  The bias
 * term b_g * sum(x) uses the exact float group sums, as in the float
 * variants.
 *
 * Fast precision (the "avx512vnni-fast" variant, --precision fast): one
 * level, x ~= dx_g * x8 with |x8| <= 127 (llama.cpp's Q8 activations, per
 * weight group): a third of the integer work, with the bias term still
 * from the exact group sums.  Every kernel below takes the level count LV
 * (3 or 1) as a compile-time constant.
 *
 * matvec (decode): x is prepared once per vector (prep_vnni) into the order
 * that makes the inner loop loads + AND/shift + vpdpbusd:
 *   8 bits: 64-value blocks in natural order (weight byte j = value j);
 *   4 bits: 128-value blocks, even values then odd values (weight byte j
 *           holds value 2j in its low nibble and 2j+1 in its high nibble),
 *           so `v & 15` and `(v >> 4) & 15` pair with the two halves.
 * Either way a 32-bit lane covers 4 (8 bits) or 8 (4 bits) consecutive
 * values, never two groups, so the group scale is a per-lane vector
 * (s_g * dx_g, permuted from the row's scales).  Two rows per pass, from the
 * two halves of the row range, sharing each x load; 4 bits can also take
 * several vectors per pass (matvec_rows_multi).  2, 3, 5 and 6 bits use the
 * float avx512 kernels (prep starts with the group sums they expect).
 *
 * matmul (prefill): each call quantizes its T rows of X the same way
 * (token-interleaved by 4 columns), unpacks a tile of RB rows x KC columns
 * of weights to bytes once,
 * transposed (16x16 dword transposes) so that a 32-bit lane holds 4
 * consecutive values of one row, and reuses it for all tokens: per 4
 * columns, one broadcast of 4 bytes of x and RB/16 vpdpbusd per token
 * accumulate whole output rows (lanes = rows) in registers, with the group
 * scale applied once per group and no horizontal sums.  Every bit width
 * goes through it (other widths unpack with the generic unpacker). */
#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) && \
    defined(__AVX512VNNI__) && defined(__AVX2__)
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>

#include "quant/qint.h"
#include "util/scratch.h"

const int mx_qk_avx512vnni_built = 1;

/* |x24| bound: x24 = 65536*xh + 256*xm + xl with xm, xl in [-128, 127]
 * keeps xh in [-123, 123] (below 2^23, so x * (XQ_MAX / amax) rounds to an
 * integer within 1 of the exact quotient). */
#define XQ_MAX 8000000.0f

/* ---- activation quantization ----------------------------------------- */


/* Quantizes one group of gs values (a multiple of 16) into natural-order
 * high/middle/low bytes; returns dx.  A group that is all zero gets dx = 0;
 * a non-finite one gets dx = amax (Inf/NaN), so the result is not finite
 * either, as with the float kernels. */
static float quant_group(const float *x, int gs, int8_t *h, int8_t *md, int8_t *l)
{
    __m512 mx = _mm512_setzero_ps();
    for (int j = 0; j < gs; j += 16)
        mx = _mm512_max_ps(mx, _mm512_abs_ps(_mm512_loadu_ps(x + j)));
    float amax = _mm512_reduce_max_ps(mx);
    for (int j = 0; j < gs; j += 16)      /* NaN never wins max_ps: look again */
        if (_mm512_cmp_ps_mask(_mm512_loadu_ps(x + j), _mm512_loadu_ps(x + j), _CMP_UNORD_Q))
            amax = NAN;
    int finite = amax < INFINITY;
    float inv = finite && amax > 0 ? XQ_MAX / amax : 0.0f;
    __m512 vi = _mm512_set1_ps(inv);
    const __m512i r128 = _mm512_set1_epi32(128);
    for (int j = 0; j < gs; j += 16) {
        /* round to nearest (the default MXCSR mode), then split off bytes
         * from the bottom: each is the remainder in [-128, 127] */
        __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + j), vi));
        __m512i vu = _mm512_srai_epi32(_mm512_add_epi32(v, r128), 8);
        __m512i vl = _mm512_sub_epi32(v, _mm512_slli_epi32(vu, 8));
        __m512i vh = _mm512_srai_epi32(_mm512_add_epi32(vu, r128), 8);
        __m512i vm = _mm512_sub_epi32(vu, _mm512_slli_epi32(vh, 8));
        _mm_storeu_si128((__m128i *)(h + j), _mm512_cvtepi32_epi8(vh));
        _mm_storeu_si128((__m128i *)(md + j), _mm512_cvtepi32_epi8(vm));
        _mm_storeu_si128((__m128i *)(l + j), _mm512_cvtepi32_epi8(vl));
    }
    return finite ? amax / XQ_MAX : amax;
}

/* One level: x ~= dx * q with q in [-127, 127]; returns dx (0 for an
 * all-zero group, amax when it is not finite). */
static float quant_group1(const float *x, int gs, int8_t *q)
{
    __m512 mx = _mm512_setzero_ps();
    for (int j = 0; j < gs; j += 16)
        mx = _mm512_max_ps(mx, _mm512_abs_ps(_mm512_loadu_ps(x + j)));
    float amax = _mm512_reduce_max_ps(mx);
    for (int j = 0; j < gs; j += 16)
        if (_mm512_cmp_ps_mask(_mm512_loadu_ps(x + j), _mm512_loadu_ps(x + j), _CMP_UNORD_Q))
            amax = NAN;
    int finite = amax < INFINITY;
    __m512 vi = _mm512_set1_ps(finite && amax > 0 ? 127.0f / amax : 0.0f);
    for (int j = 0; j < gs; j += 16) {
        __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + j), vi));
        v = _mm512_max_epi32(_mm512_min_epi32(v, _mm512_set1_epi32(127)), _mm512_set1_epi32(-127));
        _mm_storeu_si128((__m128i *)(q + j), _mm512_cvtepi32_epi8(v));
    }
    return finite ? amax / 127.0f : amax;
}

/* x quantized to LV levels (3: quant_group's high, middle, low; 1:
 * quant_group1's one) into q[level][...]; returns dx. */
static inline float quant_levels(const float *x, int gs, int8_t (*q)[128], const int LV)
{
    return LV == 3 ? quant_group(x, gs, q[0], q[1], q[2]) : quant_group1(x, gs, q[0]);
}

/* The prepared x of matvec:
 *   xsum[ng] f32   group sums (first: the float fallbacks read only these)
 *   dx[ng]   f32   group steps, then 16 zeros (the multi-vector matvec
 *                  loads 16 steps from any group index below ng)
 *   x8       per 64-value block: 64 high, 64 middle, 64 low bytes (natural
 *            order; the high level alone for LV = 1)
 *   x4       per 128-value block: even values' high bytes, odd values' high
 *            bytes, even middle, odd middle, even low, odd low (64 each; the
 *            high pair alone for LV = 1)
 * Blocks past the end are zero-padded. */
typedef struct vlayout {
    float *xsum, *dx;
    int8_t *x8, *x4;
} vlayout;

static void layout(const void *buf, int64_t cols, int gs, vlayout *L, const int LV)
{
    int64_t ng = cols / gs;
    uint8_t *p = (uint8_t *)(uintptr_t)buf;
    L->xsum = (float *)p;
    p += mx_align64((size_t)ng * 4);
    L->dx = (float *)p;
    p += mx_align64((size_t)(ng + 16) * 4);
    L->x8 = (int8_t *)p;
    p += 64 * (size_t)LV * (size_t)((cols + 63) / 64);
    L->x4 = (int8_t *)p;
}

static size_t prep_bytes_lv(int64_t cols, int gs, const int LV)
{
    int64_t ng = cols / gs;
    return mx_align64((size_t)ng * 4) + mx_align64((size_t)(ng + 16) * 4) +
           64 * (size_t)LV * (size_t)((cols + 63) / 64) + 128 * (size_t)LV * (size_t)((cols + 127) / 128);
}

/* 32 bytes of consecutive values -> 16 even-position bytes (low half) and 16
 * odd-position bytes (high half). */
static inline __m256i deinterleave(__m256i v)
{
    const __m256i sh = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
                                        0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    return _mm256_permute4x64_epi64(_mm256_shuffle_epi8(v, sh), 0xd8);
}

static inline __attribute__((always_inline)) void
prep_lv(const float *x, int64_t cols, int gs, void *buf, const int LV)
{
    vlayout L;
    layout(buf, cols, gs, &L, LV);
    int64_t ng = cols / gs;
    mx_group_sums(x, cols, gs, L.xsum);
    int64_t n8 = (cols + 63) / 64, n4 = (cols + 127) / 128;
    memset(L.x8 + (n8 - 1) * 64 * LV, 0, 64 * (size_t)LV);   /* padding of the last blocks */
    memset(L.x4 + (n4 - 1) * 128 * LV, 0, 128 * (size_t)LV);
    memset(L.dx + ng, 0, 16 * sizeof(float));
    _Alignas(64) int8_t q[3][128];
    for (int64_t g = 0; g < ng; g++) {
        int64_t c0 = g * gs;
        L.dx[g] = quant_levels(x + c0, gs, q, LV);
        for (int j = 0; j < gs; j += 32) {
            int64_t c = c0 + j;
            int8_t *d8 = L.x8 + (c / 64) * 64 * LV + c % 64;
            int8_t *d4 = L.x4 + (c / 128) * 128 * LV + (c % 128) / 2;
            for (int lv = 0; lv < LV; lv++) {
                /* 8-bit layout: natural order inside 64-value blocks */
                memcpy(d8 + 64 * lv, q[lv] + j, 32);
                /* 4-bit layout: 32 values -> 16 even + 16 odd */
                __m256i e = deinterleave(_mm256_loadu_si256((const __m256i *)(q[lv] + j)));
                _mm_storeu_si128((__m128i *)(d4 + 128 * lv), _mm256_castsi256_si128(e));
                _mm_storeu_si128((__m128i *)(d4 + 128 * lv + 64), _mm256_extracti128_si256(e, 1));
            }
        }
    }
}

/* ---- scales ------------------------------------------------------------ */

/* Up to 16 scale (or bias) values starting at element i, as f32; lanes past
 * `gm` are zero. */
static inline __m512 load16_s(const void *p, mx_dtype t, int64_t i, __mmask16 gm)
{
    if (t == MX_F16)
        return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(gm, (const uint16_t *)p + i));
    if (t == MX_BF16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(gm, (const uint16_t *)p + i)), 16));
    return _mm512_maskz_loadu_ps(gm, (const float *)p + i);
}

static inline __mmask16 mask16(int64_t n) /* first min(n, 16) lanes */
{
    return (__mmask16)(n >= 16 ? 0xffff : (1u << n) - 1);
}

/* ---- matvec -------------------------------------------------------------- */

/* Columns per pass: a row's scale vector for at most XCH/32 groups lives on
 * the stack. */
#define XCH 8192

/* Row r's per-lane scales s_g * dx_g for this pass into sc; returns the
 * bias term as a vector to be summed: b_g * sum(x)_g. */
static inline __m512 row_scales(const mx_qmat *m, int64_t r, int64_t c0, int ngc, const float *dx,
                                const float *xs, float *sc)
{
    int64_t g0 = r * mx_qmat_groups(m) + c0 / m->group_size;
    __m512 bacc = _mm512_setzero_ps();
    for (int g = 0; g < ngc; g += 16) {
        __mmask16 gm = mask16(ngc - g);
        __m512 s16 = load16_s(m->scales, m->sdtype, g0 + g, gm);
        __m512 b16 = load16_s(m->biases, m->sdtype, g0 + g, gm);
        _mm512_mask_storeu_ps(sc + g, gm, _mm512_mul_ps(s16, _mm512_maskz_loadu_ps(gm, dx + g)));
        bacc = _mm512_fmadd_ps(b16, _mm512_maskz_loadu_ps(gm, xs + g), bacc);
    }
    return bacc;
}

/* One 64-byte block (64 values) of one 8-bit row against the prepared x
 * levels: 4 values of up to 255 per lane would overflow one integer for
 * the three levels, so the low level is kept apart (accl) and combined in
 * float at the end. */
#define MV8_BLOCK(v, sv, acca, accl)                                                 \
    do {                                                                             \
        __m512i sa = _mm512_dpbusd_epi32(_mm512_setzero_si512(), v, x0);             \
        if (LV == 3) {                                                               \
            __m512i sl = _mm512_dpbusd_epi32(_mm512_setzero_si512(), v, x2);         \
            sa = _mm512_slli_epi32(sa, 8);                                           \
            sa = _mm512_dpbusd_epi32(sa, v, x1);                                     \
            accl = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sl), sv, accl);                \
        }                                                                            \
        acca = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sa), sv, acca);                    \
    } while (0)

/* 8 bits (routers, shared-expert gates, 8-bit attention).  A 64-byte block
 * holds 64 values; 32-bit lane i covers 4 consecutive values, so lanes per
 * group lpg = gs/4 and the lane's group scale (s_g * dx_g, per row) is a
 * broadcast (gs = 64, 128: lpg >= 16) or a permute of the row's scale array.
 * Rows are taken in pairs from the two halves of the range (two weight
 * streams) with x loaded once for both. */
static inline __attribute__((always_inline)) void
mv8(const mx_qmat *m, const vlayout *L, float *y, int64_t r0, int64_t r1, const int LV)
{
    const int gs = m->group_size, lpg = gs / 4;
    const int64_t rb = mx_qmat_row_bytes(m);
    const int lg = lpg >= 16 ? 16 : lpg;
    const __m512i idx = _mm512_set_epi32(15 / lg, 14 / lg, 13 / lg, 12 / lg, 11 / lg, 10 / lg,
                                         9 / lg, 8 / lg, 7 / lg, 6 / lg, 5 / lg, 4 / lg,
                                         3 / lg, 2 / lg, 1 / lg, 0);
    _Alignas(64) float sca[XCH / 32 + 16], scb[XCH / 32 + 16];
    const int64_t half = (r1 - r0) / 2;
    for (int64_t c0 = 0; c0 < m->cols; c0 += XCH) {
        int n = (int)(m->cols - c0 < XCH ? m->cols - c0 : XCH);      /* multiple of gs */
        int ngc = n / gs, nfull = n / 64, nblk = (n + 63) / 64;
        int tailb = n - nfull * 64;                                    /* bytes */
        __mmask64 tm = tailb ? ((__mmask64)1 << tailb) - 1 : 0;
        const int8_t *xc = L->x8 + (c0 / 64) * 64 * LV;
        const float *dx = L->dx + c0 / gs, *xs = L->xsum + c0 / gs;
        for (int g = ngc; g < ngc + 16; g++)
            sca[g] = scb[g] = 0;   /* padding lanes multiply zero sums: keep them finite */
        /* i < half: rows r0+i and r0+half+i; then the odd one out alone */
        for (int64_t i = 0; i < half + ((r1 - r0) & 1); i++) {
            const int two = i < half;
            const int64_t ra = two ? r0 + i : r1 - 1, rbw = r0 + half + i;
            const uint8_t *wa = m->w + ra * rb + c0;
            const uint8_t *wb = m->w + (two ? rbw : ra) * rb + c0;
            __m512 ba = row_scales(m, ra, c0, ngc, dx, xs, sca);
            __m512 bb = two ? row_scales(m, rbw, c0, ngc, dx, xs, scb) : _mm512_setzero_ps();
            __m512 aa = _mm512_setzero_ps(), al = aa, ab = aa, bl = aa;
            for (int b = 0; b < nblk; b++) {
                __m512i va = b < nfull ? _mm512_loadu_si512(wa + 64 * b)
                                       : _mm512_maskz_loadu_epi8(tm, wa + 64 * b);
                const int8_t *xb = xc + b * 64 * LV;
                __m512i x0 = _mm512_loadu_si512(xb);
                __m512i x1 = LV == 3 ? _mm512_loadu_si512(xb + 64) : x0;
                __m512i x2 = LV == 3 ? _mm512_loadu_si512(xb + 128) : x0;
                const int gb = b * 64 / gs;
                __m512 sva = lpg >= 16 ? _mm512_set1_ps(sca[gb])
                                       : _mm512_permutexvar_ps(idx, _mm512_loadu_ps(sca + gb));
                MV8_BLOCK(va, sva, aa, al);
                if (two) {
                    __m512i vb = b < nfull ? _mm512_loadu_si512(wb + 64 * b)
                                           : _mm512_maskz_loadu_epi8(tm, wb + 64 * b);
                    __m512 svb = lpg >= 16 ? _mm512_set1_ps(scb[gb])
                                           : _mm512_permutexvar_ps(idx, _mm512_loadu_ps(scb + gb));
                    MV8_BLOCK(vb, svb, ab, bl);
                }
            }
            /* the high (and middle) level's sum is 256 times the low's */
            const __m512 k256 = _mm512_set1_ps(LV == 3 ? 256.0f : 1.0f);
            float ya = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_fmadd_ps(aa, k256, al), ba));
            y[ra - r0] = c0 == 0 ? ya : y[ra - r0] + ya;
            if (two) {
                float yb = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_fmadd_ps(ab, k256, bl), bb));
                y[rbw - r0] = c0 == 0 ? yb : y[rbw - r0] + yb;
            }
        }
    }
}

/* ---- 4-bit matvec: R rows x TC vectors per pass ------------------------- */

#ifndef MVQ_RT
#define MVQ_RT 2
#endif
#ifndef MVQ_TC
#define MVQ_TC 4
#endif
_Static_assert(MVQ_RT >= 1 && MVQ_RT <= 4 && MVQ_TC >= 1 && MVQ_TC <= 4,
               "mvq4_pass keeps at most 4 x 4 accumulators");

/* GCC and clang both take this: the constant-trip loops over rows and
 * vectors below must be unrolled so their accumulators live in registers. */
#define UNROLL _Pragma("GCC unroll 16")

/* Row r's group scales s_g (no x step) for this pass into sc. */
static inline void row_scales_s(const mx_qmat *m, int64_t r, int64_t c0, int ngc, float *sc)
{
    int64_t g0 = r * mx_qmat_groups(m) + c0 / m->group_size;
    for (int g = 0; g < ngc; g += 16) {
        __mmask16 gm = mask16(ngc - g);
        _mm512_mask_storeu_ps(sc + g, gm, load16_s(m->scales, m->sdtype, g0 + g, gm));
    }
}

/* Row r's bias term for one vector: sum_g b_g * sum(x)_g over this pass. */
static inline float row_bias(const mx_qmat *m, int64_t r, int64_t c0, int ngc, const float *xs)
{
    int64_t g0 = r * mx_qmat_groups(m) + c0 / m->group_size;
    __m512 acc = _mm512_setzero_ps();
    for (int g = 0; g < ngc; g += 16) {
        __mmask16 gm = mask16(ngc - g);
        acc = _mm512_fmadd_ps(load16_s(m->biases, m->sdtype, g0 + g, gm),
                              _mm512_maskz_loadu_ps(gm, xs + g), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

/* sum q*x24 per 32-bit lane for one 64-byte block v (128 values, lane = 8
 * consecutive values) against one vector's six prepared x registers
 * (even/odd values of the high, middle and low levels).  One chain: the
 * lane sum stays below 2^30, and on Zen 4 the chain measured as fast as
 * three parallel level sums (which need two more adds). */
static inline __attribute__((always_inline)) __m512i
dot4_levels(__m512i v, const __m512i *x, __m512i nib, const int LV)
{
    __m512i q0 = _mm512_and_si512(v, nib);
    __m512i q1 = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
    __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q0, x[0]);
    s = _mm512_dpbusd_epi32(s, q1, x[1]);
    if (LV == 1)
        return s;
    s = _mm512_slli_epi32(s, 8);
    s = _mm512_dpbusd_epi32(s, q0, x[2]);
    s = _mm512_dpbusd_epi32(s, q1, x[3]);
    s = _mm512_slli_epi32(s, 8);
    s = _mm512_dpbusd_epi32(s, q0, x[4]);
    return _mm512_dpbusd_epi32(s, q1, x[5]);
}

/* One block column b (mask lm: the bytes of a short last block) for R rows
 * and TC vectors.  The weights are loaded once (one load per line: the
 * empty asm keeps GCC from folding the load into both the AND and the
 * shift) and each vector's x once for all R rows. */
static inline __attribute__((always_inline)) void
mvq4_block(const uint8_t *const *w, const vlayout *L, const float *sc, __m512 acc[4][4],
           int b, int gb, int64_t c0, __mmask64 lm, const int R, const int TC, const int gs,
           const int full, const int LV)
{
    const int lpg = gs / 8, lg = lpg >= 16 ? 16 : lpg;   /* 32-bit lanes per group */
    const int scs = XCH / 32 + 16;
    const __m512i nib = _mm512_set1_epi8(0x0f);
    const __m512i idx = _mm512_set_epi32(15 / lg, 14 / lg, 13 / lg, 12 / lg, 11 / lg, 10 / lg,
                                         9 / lg, 8 / lg, 7 / lg, 6 / lg, 5 / lg, 4 / lg,
                                         3 / lg, 2 / lg, 1 / lg, 0);
/* the per-lane group value of a scale array at group gb */
#define LANES(p) (lpg >= 16 ? _mm512_set1_ps(*(p)) : _mm512_permutexvar_ps(idx, _mm512_loadu_ps(p)))
    __m512i v[4];
    __m512 sr[4];
    UNROLL for (int i = 0; i < R; i++) {
        v[i] = full ? _mm512_loadu_si512(w[i] + 64 * b) : _mm512_maskz_loadu_epi8(lm, w[i] + 64 * b);
        __asm__("" : "+v"(v[i]));
        sr[i] = LANES(sc + i * scs + gb);
    }
    UNROLL for (int t = 0; t < TC; t++) {
        const int8_t *xb = L[t].x4 + (c0 / 128 + b) * 128 * LV;
        __m512i x[6];
        UNROLL for (int k = 0; k < 2 * LV; k++) {
            x[k] = _mm512_loadu_si512(xb + 64 * k);
            __asm__("" : "+v"(x[k]));   /* loaded once for all R rows */
        }
        __m512 dxv = TC == 1 ? _mm512_setzero_ps() : LANES(L[t].dx + c0 / gs + gb);
        UNROLL for (int i = 0; i < R; i++) {
            __m512 s = _mm512_cvtepi32_ps(dot4_levels(v[i], x, nib, LV));
            acc[i][t] = _mm512_fmadd_ps(s, TC == 1 ? sr[i] : _mm512_mul_ps(sr[i], dxv), acc[i][t]);
        }
    }
#undef LANES
}

/* R rows rr[] (outputs yr[i][t * ldy] for vector t) times TC prepared
 * vectors L[], columns [c0, c0+n) of a pass.  R, TC and gs are
 * compile-time constants after inlining.  One vector (decode): the row's
 * scale vector already holds s_g * dx_g.  Several: it holds s_g, and each
 * vector's per-lane steps multiply it per block. */
static inline __attribute__((always_inline)) void
mvq4_pass(const mx_qmat *m, const vlayout *L, const int64_t *rr, float *const *yr, int64_t ldy,
          const int R, const int TC, int64_t c0, int n, float *sc, const int gs, const int LV)
{
    const int ngc = n / gs, nfull = n / 128, tailb = (n % 128) / 2;
    const int64_t rb = mx_qmat_row_bytes(m);
    const int scs = XCH / 32 + 16;                        /* stride of the rows' scales */
    /* arrays sized by the largest R and TC: sized by the parameters they
     * would be VLAs, which GCC keeps on the stack */
    float bias[4][4];
    const uint8_t *w[4];
    UNROLL for (int i = 0; i < R; i++) {
        w[i] = m->w + rr[i] * rb + c0 / 2;
        if (TC == 1) {
            bias[i][0] = _mm512_reduce_add_ps(row_scales(m, rr[i], c0, ngc, L[0].dx + c0 / gs,
                                                         L[0].xsum + c0 / gs, sc + i * scs));
        } else {
            row_scales_s(m, rr[i], c0, ngc, sc + i * scs);
            UNROLL for (int t = 0; t < TC; t++)
                bias[i][t] = row_bias(m, rr[i], c0, ngc, L[t].xsum + c0 / gs);
        }
    }
    __m512 acc[4][4];
    UNROLL for (int i = 0; i < R; i++)
        UNROLL for (int t = 0; t < TC; t++)
            acc[i][t] = _mm512_setzero_ps();
    for (int b = 0; b < nfull; b++)
        mvq4_block(w, L, sc, acc, b, b * 128 / gs, c0, 0, R, TC, gs, 1, LV);
    if (tailb)   /* a last block of 32, 64 or 96 values: zero bytes give q = 0 */
        mvq4_block(w, L, sc, acc, nfull, nfull * 128 / gs, c0, ((__mmask64)1 << tailb) - 1, R, TC,
                   gs, 0, LV);
    const int first = c0 == 0;
    UNROLL for (int i = 0; i < R; i++)
        UNROLL for (int t = 0; t < TC; t++) {
            float *o = yr[i] + t * ldy;
            *o = (first ? 0.0f : *o) + _mm512_reduce_add_ps(acc[i][t]) + bias[i][t];
        }
}

/* One vector times R (1 or 2) rows rr[] (outputs *yr[i]), columns
 * [c0, c0+n) of a pass: the decode matvec.  The rows' scales times the
 * vector's steps (s_g * dx_g) are made 16 groups at a time into registers,
 * so the block loop loads only weights and x: with two rows per pass (two
 * weight streams, which is what this memory system streams best) the loads
 * are what limits it, and a scale array on the stack cost one load more per
 * block (~9% on Zen 4).  Bit for bit what mvq4_pass computes for TC = 1:
 * the same products and sums in the same order. */
static inline __attribute__((always_inline)) void
mv1_pass(const mx_qmat *m, const vlayout *L, const int64_t *rr, float *const *yr, const int R,
         int64_t c0, int n, const int gs, const int LV)
{
    const int lg = gs / 8 >= 16 ? 16 : gs / 8;      /* lanes per group within a block */
    const int gpb = 128 / gs;                        /* groups per block: 4, 2 or 1 */
    const int ngc = n / gs, nfull = n / 128, tailb = (n % 128) / 2;
    const int64_t rb = mx_qmat_row_bytes(m), G = mx_qmat_groups(m);
    const __m512i nib = _mm512_set1_epi8(0x0f);
    const __m512i idx0 = _mm512_set_epi32(15 / lg, 14 / lg, 13 / lg, 12 / lg, 11 / lg, 10 / lg,
                                          9 / lg, 8 / lg, 7 / lg, 6 / lg, 5 / lg, 4 / lg,
                                          3 / lg, 2 / lg, 1 / lg, 0);
    const __m512i step = _mm512_set1_epi32(gpb);
    const float *dx = L->dx + c0 / gs, *xs = L->xsum + c0 / gs;
    const int8_t *xc = L->x4 + (c0 / 128) * 128 * LV;
    const uint8_t *w[2];
    __m512 acc[2], bacc[2], sreg[2];
    UNROLL for (int i = 0; i < R; i++) {
        w[i] = m->w + rr[i] * rb + c0 / 2;
        acc[i] = bacc[i] = _mm512_setzero_ps();
    }
    for (int g0 = 0; g0 < ngc; g0 += 16) {
        const __mmask16 gm = mask16(ngc - g0);
        const __m512 dx16 = _mm512_maskz_loadu_ps(gm, dx + g0), xs16 = _mm512_maskz_loadu_ps(gm, xs + g0);
        UNROLL for (int i = 0; i < R; i++) {
            const int64_t gi = rr[i] * G + c0 / gs + g0;
            sreg[i] = _mm512_mul_ps(load16_s(m->scales, m->sdtype, gi, gm), dx16);
            bacc[i] = _mm512_fmadd_ps(load16_s(m->biases, m->sdtype, gi, gm), xs16, bacc[i]);
        }
        const int b0 = g0 / gpb, bend = b0 + 16 / gpb;
        const int b1 = bend < nfull ? bend : nfull;
        __m512i idx = idx0;
        for (int b = b0; b < b1; b++, idx = _mm512_add_epi32(idx, step)) {
            __m512i x[6];
            UNROLL for (int k = 0; k < 2 * LV; k++) {
                x[k] = _mm512_loadu_si512(xc + b * 128 * LV + 64 * k);
                __asm__("" : "+v"(x[k]));   /* loaded once for both rows */
            }
            UNROLL for (int i = 0; i < R; i++) {
                __m512i v = _mm512_loadu_si512(w[i] + 64 * b);
                __asm__("" : "+v"(v));      /* one load, not one per use */
                acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot4_levels(v, x, nib, LV)),
                                         _mm512_permutexvar_ps(idx, sreg[i]), acc[i]);
            }
        }
        if (tailb && nfull >= b0 && nfull < bend) {
            /* a last block of 32, 64 or 96 values: zero bytes give q = 0 */
            const __mmask64 tm = ((__mmask64)1 << tailb) - 1;
            idx = _mm512_add_epi32(idx0, _mm512_set1_epi32(gpb * (nfull - b0)));
            __m512i x[6];
            UNROLL for (int k = 0; k < 2 * LV; k++)
                x[k] = _mm512_loadu_si512(xc + nfull * 128 * LV + 64 * k);
            UNROLL for (int i = 0; i < R; i++) {
                __m512i v = _mm512_maskz_loadu_epi8(tm, w[i] + 64 * nfull);
                acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot4_levels(v, x, nib, LV)),
                                         _mm512_permutexvar_ps(idx, sreg[i]), acc[i]);
            }
        }
    }
    const int first = c0 == 0;
    UNROLL for (int i = 0; i < R; i++)
        *yr[i] = (first ? 0.0f : *yr[i]) + _mm512_reduce_add_ps(acc[i]) + _mm512_reduce_add_ps(bacc[i]);
}

/* mv1_pass instantiated for each row count and group size as a function of
 * its own: inlined into the larger mvq4 body, GCC 12 ran out of registers
 * and spilled two of the six x registers in the block loop. */
#define MV1_FN(R, GS, LV)                                                                    \
    static __attribute__((noinline)) void mv1_r##R##_g##GS##_l##LV(                          \
        const mx_qmat *m, const vlayout *L, const int64_t *rr, float *const *yr, int64_t c0,    \
        int n)                                                                                \
    {                                                                                        \
        mv1_pass(m, L, rr, yr, R, c0, n, GS, LV);                                            \
    }
MV1_FN(1, 32, 3) MV1_FN(2, 32, 3) MV1_FN(1, 64, 3) MV1_FN(2, 64, 3) MV1_FN(1, 128, 3)
MV1_FN(2, 128, 3) MV1_FN(1, 32, 1) MV1_FN(2, 32, 1) MV1_FN(1, 64, 1) MV1_FN(2, 64, 1)
MV1_FN(1, 128, 1) MV1_FN(2, 128, 1)
#undef MV1_FN

static inline __attribute__((always_inline)) void
mv1(const mx_qmat *m, const vlayout *L, const int64_t *rr, float *const *yr, int R, int64_t c0,
    int n, const int gs, const int LV)
{
#define MV1_PICK(LVN)                                                                   \
    if (gs == 64)                                                                       \
        (R == 2 ? mv1_r2_g64_l##LVN : mv1_r1_g64_l##LVN)(m, L, rr, yr, c0, n);          \
    else if (gs == 32)                                                                  \
        (R == 2 ? mv1_r2_g32_l##LVN : mv1_r1_g32_l##LVN)(m, L, rr, yr, c0, n);          \
    else                                                                                \
        (R == 2 ? mv1_r2_g128_l##LVN : mv1_r1_g128_l##LVN)(m, L, rr, yr, c0, n);
    if (LV == 3) {
        MV1_PICK(3)
    } else {
        MV1_PICK(1)
    }
#undef MV1_PICK
}

/* Rows [r0, r1) times T vectors, for one group size: R rows per pass taken
 * from R equal parts of the range (R weight streams in flight, each
 * sequential), TC vectors at a time (the rows' weights stay in L1 for the
 * next TC). */
static inline __attribute__((always_inline)) void
mvq4_gs(const mx_qmat *m, const vlayout *L, int64_t T, float *Y, int64_t ldy, int64_t r0,
        int64_t r1, const int gs, const int LV)
{
    /* rows per pass for one vector / for several; vectors per pass */
    enum { R1 = 2, RT = MVQ_RT, TCM = MVQ_TC, RMAX = R1 > RT ? R1 : RT };
    _Alignas(64) float sc[RMAX * (XCH / 32 + 16)];
    for (int64_t c0 = 0; c0 < m->cols; c0 += XCH) {
        int n = (int)(m->cols - c0 < XCH ? m->cols - c0 : XCH);    /* multiple of gs */
        for (int i = 0; i < RMAX; i++)   /* padding lanes multiply zero sums: keep them finite */
            for (int g = n / gs; g < n / gs + 16; g++)
                sc[i * (XCH / 32 + 16) + g] = 0;
        const int R = T == 1 ? R1 : RT;
        const int64_t q = (r1 - r0) / R;
        int64_t rr[RMAX];
        float *yr[RMAX];
        for (int64_t i = 0; i < (r1 - r0) - q * (R - 1); i++) {
            /* i < q: R rows, one from each part; then the rest one by one */
            const int nr = i < q ? R : 1;
            for (int j = 0; j < nr; j++) {
                rr[j] = i < q ? r0 + i + j * q : r0 + i + (R - 1) * q;
                yr[j] = Y + (rr[j] - r0);
            }
            if (T == 1) {
                mv1(m, L, rr, yr, nr, c0, n, gs, LV);
                continue;
            }
            int64_t t = 0;
            float *yt[RMAX];
            for (; t + TCM <= T; t += TCM) {
                for (int j = 0; j < nr; j++)
                    yt[j] = yr[j] + t * ldy;
                if (nr == RT) mvq4_pass(m, L + t, rr, yt, ldy, RT, TCM, c0, n, sc, gs, LV);
                else mvq4_pass(m, L + t, rr, yt, ldy, 1, TCM, c0, n, sc, gs, LV);
            }
            /* the last T % TCM vectors one at a time, as matvec_rows does
             * them (the results are the same bits either way) */
            for (; t < T; t++)
                for (int j = 0; j < nr; j += 2) {
                    float *y2[2] = { yr[j] + t * ldy, yr[j + (j + 1 < nr)] + t * ldy };
                    mv1(m, L + t, rr + j, y2, j + 1 < nr ? 2 : 1, c0, n, gs, LV);
                }
        }
    }
}

static inline __attribute__((always_inline)) void
mvq4(const mx_qmat *m, const vlayout *L, int64_t T, float *Y, int64_t ldy, int64_t r0, int64_t r1,
     const int LV)
{
    if (m->group_size == 64)
        mvq4_gs(m, L, T, Y, ldy, r0, r1, 64, LV);
    else if (m->group_size == 32)
        mvq4_gs(m, L, T, Y, ldy, r0, r1, 32, LV);
    else
        mvq4_gs(m, L, T, Y, ldy, r0, r1, 128, LV);
}

static inline __attribute__((always_inline)) void
matvec_rows_lv(const mx_qmat *m, const float *x, const void *xp, float *y, int64_t r0, int64_t r1,
               const int LV)
{
    vlayout L;
    layout(xp, m->cols, m->group_size, &L, LV);
    if (m->bits == 4)
        mvq4(m, &L, 1, y, 0, r0, r1, LV);
    else if (m->bits == 8)
        mv8(m, &L, y, r0, r1, LV);
    else
        mx_qk_avx512.matvec_rows(m, x, L.xsum, y, r0, r1);
}

static inline __attribute__((always_inline)) void
matvec_rows_multi_lv(const mx_qmat *m, const float *X, int64_t ldx, const void *xp, size_t xstride,
                     int64_t T, float *Y, int64_t ldy, int64_t r0, int64_t r1, const int LV)
{
    if (m->bits != 4) {
        for (int64_t t = 0; t < T; t++)
            matvec_rows_lv(m, X + t * ldx, (const uint8_t *)xp + t * xstride, Y + t * ldy, r0, r1, LV);
        return;
    }
    enum { CH = 16 };   /* vectors laid out per call */
    vlayout L[CH];
    for (int64_t t0 = 0; t0 < T; t0 += CH) {
        int64_t n = T - t0 < CH ? T - t0 : CH;
        for (int64_t t = 0; t < n; t++)
            layout((const uint8_t *)xp + (t0 + t) * xstride, m->cols, m->group_size, &L[t], LV);
        mvq4(m, L, n, Y + t0 * ldy, ldy, r0, r1, LV);
    }
}

/* ---- matmul -------------------------------------------------------------- */

#define RB 32            /* weight rows per tile: 2 zmm of 16 lanes */
#define KC 512           /* columns per tile: 16 KB of bytes */
#ifndef TB
#define TB 12            /* tokens per register block: 24 int accumulators */
#endif

/* X quantized per token: high/middle/low bytes (the high alone for one
 * level), group steps and exact group sums. */
typedef struct xquant {
    int8_t *h, *m, *l;   /* [T][cols] */
    float *dx, *xs;      /* [T][ng] */
} xquant;

/* Values [k, k+64) of row r as 64 bytes in natural order; values at or past
 * `end` (the chunk's end, a multiple of 32) are zero and not read. */
static inline __m512i row64(const mx_qmat *m, int64_t r, int64_t k, int64_t end)
{
    const uint8_t *row = mx_q_row_ptr(m, r);
    int half = end - k < 64;
    if (m->bits == 4) {
        const __m256i nib = _mm256_set1_epi8(0x0f);
        __m256i v = half ? _mm256_maskz_loadu_epi8(0xffff, row + k / 2)
                         : _mm256_loadu_si256((const __m256i *)(row + k / 2));
        __m256i lo = _mm256_and_si256(v, nib), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
        /* in-lane interleave: 128-bit lanes come out as values 0-15, 32-47 | 16-31, 48-63 */
        __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_unpacklo_epi8(lo, hi)),
                                       _mm256_unpackhi_epi8(lo, hi), 1);
        return _mm512_shuffle_i32x4(z, z, 0xd8);
    }
    if (m->bits == 8)
        return half ? _mm512_maskz_loadu_epi8(0xffffffffull, row + k) : _mm512_loadu_si512(row + k);
    _Alignas(64) uint8_t q[64] = { 0 };
    mx_q_unpack(row, m->bits, k, half ? 32 : 64, q);
    return _mm512_load_si512(q);
}

/* 16 rows x 16 dwords -> 16 vectors o[j] holding dword j of each row. */
static inline void transpose16(const __m512i r[16], __m512i o[16])
{
    __m512i a[16], b[16];
    for (int i = 0; i < 8; i++) {
        a[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        a[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    /* b[4i+d], 128-bit lane L: dword 4L+d of rows 4i..4i+3 */
    for (int i = 0; i < 4; i++) {
        b[4 * i] = _mm512_unpacklo_epi64(a[4 * i], a[4 * i + 2]);
        b[4 * i + 1] = _mm512_unpackhi_epi64(a[4 * i], a[4 * i + 2]);
        b[4 * i + 2] = _mm512_unpacklo_epi64(a[4 * i + 1], a[4 * i + 3]);
        b[4 * i + 3] = _mm512_unpackhi_epi64(a[4 * i + 1], a[4 * i + 3]);
    }
    /* 4x4 transpose of 128-bit lanes: o[4L+d] = lane L of b[d], b[4+d], b[8+d], b[12+d] */
    for (int d = 0; d < 4; d++) {
        __m512i c0 = _mm512_shuffle_i32x4(b[d], b[4 + d], 0x44);
        __m512i c1 = _mm512_shuffle_i32x4(b[d], b[4 + d], 0xee);
        __m512i c2 = _mm512_shuffle_i32x4(b[8 + d], b[12 + d], 0x44);
        __m512i c3 = _mm512_shuffle_i32x4(b[8 + d], b[12 + d], 0xee);
        o[d] = _mm512_shuffle_i32x4(c0, c2, 0x88);
        o[4 + d] = _mm512_shuffle_i32x4(c0, c2, 0xdd);
        o[8 + d] = _mm512_shuffle_i32x4(c1, c3, 0x88);
        o[12 + d] = _mm512_shuffle_i32x4(c1, c3, 0xdd);
    }
}

/* Builds tile[k/4][i] (32-bit lanes: values k..k+3 of row rt+i) for columns
 * [k0, k0+kc), rows past nr zero. */
static void build_tile(const mx_qmat *m, int64_t rt, int nr, int64_t k0, int kc, uint8_t *tile)
{
    __m512i r[16], o[16];
    for (int h = 0; h < RB / 16; h++)
        for (int k = 0; k < kc; k += 64) {
            for (int i = 0; i < 16; i++)
                r[i] = h * 16 + i < nr ? row64(m, rt + h * 16 + i, k0 + k, k0 + kc)
                                       : _mm512_setzero_si512();
            transpose16(r, o);
            int nk4 = kc - k < 64 ? (kc - k) / 4 : 16;
            for (int j = 0; j < nk4; j++)
                _mm512_store_si512(tile + ((size_t)(k / 4 + j) * RB + h * 16) * 4, o[j]);
        }
}

/* acc += dot(u8 w, s8 x) per 32-bit lane.  GCC 12 copies and spills every
 * accumulator around the intrinsic in the 24-accumulator loop below (2x
 * slower than clang); the same instruction as inline asm, with the
 * accumulator tied in place, compiles to the plain sequence. */
#if defined(__GNUC__) && !defined(__clang__)
#define DPBUSD(acc, w, x) __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(w), "v"(x))
#else
#define DPBUSD(acc, w, x) ((acc) = _mm512_dpbusd_epi32((acc), (w), (x)))
#endif

/* The token block of tile_tokens is written out for up to 12 tokens with
 * plain variables (a0_j, a1_j): GCC keeps arrays of vectors in memory here,
 * which made the loop store-bound.  `j < nt` folds at compile time. */
#define REP12(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) M(10) M(11)
#define ACC_ZERO(j) __m512i a0_##j = _mm512_setzero_si512(), a1_##j = a0_##j;
#define ACC_STEP(j)                                                               \
    if (j < nt) {                                                                 \
        __m512i xv = _mm512_set1_epi32(xk[j]);                                    \
        DPBUSD(a0_##j, w0, xv);                                                   \
        DPBUSD(a1_##j, w1, xv);                                                   \
    }
#define ACC_SHIFT(j)                                                              \
    if (j < nt) {                                                                 \
        a0_##j = _mm512_slli_epi32(a0_##j, 8);                                    \
        a1_##j = _mm512_slli_epi32(a1_##j, 8);                                    \
    }
#define ACC_STORE(j)                                                              \
    if (j < nt)                                                                   \
        epilogue(a0_##j, a1_##j, s0, s1, b0, b1, xq, t0 + j, ng, gi, yl + j * RB, part);

/* sum over one group's columns of tile x byte level XL, all nt tokens: per
 * 4 columns one 4-byte broadcast of x and two vpdpbusd (32 rows) per token;
 * the nt tokens' 4 bytes are consecutive (the token-interleaved layout), so
 * a k-step reads one line of x, not one per token. */
#define DOT_LEVEL(XL)                                                             \
    do {                                                                          \
        const int32_t *xl = (const int32_t *)(const void *)(XL);                  \
        for (int k = 0; k < gs; k += 4) {                                         \
            __m512i w0 = _mm512_load_si512(tg + k * RB);                          \
            __m512i w1 = _mm512_load_si512(tg + k * RB + 64);                     \
            const int32_t *xk = xl + ((k0 + g * gs + k) / 4) * T + t0;            \
            REP12(ACC_STEP)                                                       \
        }                                                                         \
    } while (0)

/* Adds one token's group result to its RB outputs yl (the tile's local
 * block): part 0 is a = 256*sum q*xh + sum q*xm (scale 256*s*dx), part 1 is
 * sum q*xl (scale s*dx) plus the bias term b * sum(x). */
static inline __attribute__((always_inline)) void
epilogue(__m512i a0, __m512i a1, __m512 s0, __m512 s1, __m512 b0, __m512 b1, const xquant *xq,
         int64_t t, int64_t ng, int64_t gi, float *yl, int part)
{
    float dxj = xq->dx[t * ng + gi];
    __m512 d = _mm512_set1_ps(part ? dxj : 256.0f * dxj);
    __m512 y0 = _mm512_load_ps(yl), y1 = _mm512_load_ps(yl + 16);
    y0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a0), _mm512_mul_ps(s0, d), y0);
    y1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a1), _mm512_mul_ps(s1, d), y1);
    if (part) {
        __m512 xs = _mm512_set1_ps(xq->xs[t * ng + gi]);
        y0 = _mm512_fmadd_ps(b0, xs, y0);
        y1 = _mm512_fmadd_ps(b1, xs, y1);
    }
    _mm512_store_ps(yl, y0);
    _mm512_store_ps(yl + 16, y1);
}

/* Y[t][rows] (+)= the contribution of one tile's groups for nt <= 12 tokens.
 * tile: [kc/4][RB] 32-bit lanes; ts/tb: [groups][RB] scales and biases.
 * The groups' results are summed in a local block yl[nt][RB] (contiguous:
 * Y's rows are a multiple of 4 KB apart for the usual widths, so its lines
 * for 12 tokens share an L1 set) and added to Y once per tile. */
static inline __attribute__((always_inline)) void
tile_tokens(const uint8_t *tile, const float *ts, const float *tb, int kc, int gs,
            const xquant *xq, int64_t T, int64_t cols, int64_t k0, int64_t t0, float *Y,
            int64_t ldy, __mmask16 m0, __mmask16 m1, int first, const int nt, const int LV)
{
    const int64_t ng = cols / gs;
    _Alignas(64) float yl[12 * RB];
    for (int j = 0; j < nt * RB; j += 16)
        _mm512_store_ps(yl + j, _mm512_setzero_ps());
    for (int g = 0; g < kc / gs; g++) {
        const uint8_t *tg = tile + (size_t)g * gs * RB;      /* gs/4 steps of RB*4 bytes */
        const int64_t gi = (k0 + g * gs) / gs;
        __m512 s0 = _mm512_load_ps(ts + g * RB), s1 = _mm512_load_ps(ts + g * RB + 16);
        __m512 b0 = _mm512_load_ps(tb + g * RB), b1 = _mm512_load_ps(tb + g * RB + 16);
        if (LV == 3) {
            const int part = 0;
            REP12(ACC_ZERO)
            DOT_LEVEL(xq->h);
            REP12(ACC_SHIFT)
            DOT_LEVEL(xq->m);
            REP12(ACC_STORE)
        }
        {
            /* the low level, or the one level: scale s*dx, plus the bias */
            const int part = 1;
            REP12(ACC_ZERO)
            DOT_LEVEL(LV == 3 ? xq->l : xq->h);
            REP12(ACC_STORE)
        }
    }
    for (int j = 0; j < nt; j++) {
        float *yj = Y + (t0 + j) * ldy;
        __m512 y0 = _mm512_load_ps(yl + j * RB), y1 = _mm512_load_ps(yl + j * RB + 16);
        if (!first) {
            y0 = _mm512_add_ps(y0, _mm512_maskz_loadu_ps(m0, yj));
            y1 = _mm512_add_ps(y1, _mm512_maskz_loadu_ps(m1, yj + 16));
        }
        _mm512_mask_storeu_ps(yj, m0, y0);
        _mm512_mask_storeu_ps(yj + 16, m1, y1);
    }
}

/* Layout of the prepared activations of T tokens: dx, xs [T][ng] floats,
 * then the three int8 levels h, m, l, each token-interleaved by 4 columns:
 * [cols/4][T][4] (the 4 bytes a k-step broadcasts, for consecutive tokens
 * side by side). */
static xquant mm_layout(void *buf, int64_t T, int64_t cols, int gs, const int LV)
{
    const size_t nx = (size_t)(T * cols), ns = (size_t)(T * (cols / gs));
    uint8_t *mem = buf;
    xquant xq = {.dx = (float *)mem, .xs = (float *)mem + ns};
    xq.h = (int8_t *)(mem + 2 * ns * sizeof(float));
    xq.m = LV == 3 ? xq.h + nx : NULL;
    xq.l = LV == 3 ? xq.m + nx : NULL;
    return xq;
}

static size_t mm_prep_bytes_lv(int64_t T, int64_t cols, int gs, const int LV)
{
    return (size_t)LV * (size_t)(T * cols) + 2 * (size_t)(T * (cols / gs)) * sizeof(float) + 64;
}

static inline __attribute__((always_inline)) void
mm_prep_lv(const float *X, int64_t ldx, int64_t T, int64_t t0, int64_t t1, int64_t cols, int gs,
           void *buf, const int LV)
{
    /* 16 tokens at a time, group by group, so that each k-step's 4-byte
     * pieces of the 16 are written as one 64-byte run: token by token the
     * writes are T*4 bytes apart (4 KB at T = 1024) and each one touches a
     * line of its own */
    enum { TB16 = 16 };
    const int64_t ng = cols / gs;
    xquant xq = mm_layout(buf, T, cols, gs, LV);
    _Alignas(64) int8_t q[TB16][3][128];
    int8_t *lv[3] = {xq.h, xq.m, xq.l};
    for (int64_t t = t0; t < t1; t++)
        mx_group_sums(X + t * ldx, cols, gs, xq.xs + t * ng);
    for (int64_t tb = t0; tb < t1; tb += TB16) {
        const int nt = (int)(t1 - tb < TB16 ? t1 - tb : TB16);
        for (int64_t g = 0; g < ng; g++) {
            for (int j = 0; j < nt; j++)
                xq.dx[(tb + j) * ng + g] = quant_levels(X + (tb + j) * ldx + g * gs, gs, q[j], LV);
            for (int l = 0; l < LV; l++)
                for (int c = 0; c < gs; c += 4) {
                    int8_t *dst = lv[l] + ((g * gs + c) / 4 * T + tb) * 4;   /* [col/4][t][4] */
                    for (int j = 0; j < nt; j++)
                        memcpy(dst + 4 * j, q[j][l] + c, 4);
                }
        }
    }
}

/* Tokens per pass over the rows: a k-chunk of x for this many tokens (3
 * levels x 192 x 512 bytes) stays in L2 while every row tile of the range
 * runs over it; with all tokens of a long prompt at once, x came from L3
 * for every row tile.  Tiles are built again per pass (a few % of the
 * work). */
#define TPASS 192

static inline __attribute__((always_inline)) void
matmul_rows_prepped_lv(const mx_qmat *m, const void *xp, int64_t T, float *Y, int64_t ldy,
                       int64_t r0, int64_t r1, const int LV)
{
    const int64_t cols = m->cols, ng = mx_qmat_groups(m);
    const int gs = m->group_size;
    xquant xq = mm_layout((void *)xp, T, cols, gs, LV);

    _Alignas(64) uint8_t tile[KC * RB];
    _Alignas(64) float ts[KC / 32 * RB], tb[KC / 32 * RB];
    for (int64_t tp = 0; tp < T; tp += TPASS) {
        const int64_t te = tp + TPASS < T ? tp + TPASS : T;
        for (int64_t rt = r0; rt < r1; rt += RB) {
            int nr = (int)(r1 - rt < RB ? r1 - rt : RB);
            __mmask16 m0 = mask16(nr), m1 = mask16(nr > 16 ? nr - 16 : 0);
            for (int64_t k0 = 0; k0 < cols; k0 += KC) {
                int kc = (int)(cols - k0 < KC ? cols - k0 : KC);   /* multiple of gs */
                int ngt = kc / gs;
                build_tile(m, rt, nr, k0, kc, tile);
                for (int i = 0; i < RB; i++)
                    for (int g = 0; g < ngt; g++) {
                        int64_t gi = (rt + i) * ng + k0 / gs + g;
                        ts[g * RB + i] = i < nr ? mx_q_scalar_at(m->scales, m->sdtype, gi) : 0.0f;
                        tb[g * RB + i] = i < nr ? mx_q_scalar_at(m->biases, m->sdtype, gi) : 0.0f;
                    }
                int first = k0 == 0;
                float *Yt = Y + rt;
                int64_t t = tp;
                for (; t + TB <= te; t += TB)
                    tile_tokens(tile, ts, tb, kc, gs, &xq, T, cols, k0, t, Yt, ldy, m0, m1, first, TB, LV);
                for (; t + 8 <= te; t += 8)
                    tile_tokens(tile, ts, tb, kc, gs, &xq, T, cols, k0, t, Yt, ldy, m0, m1, first, 8, LV);
                for (; t + 4 <= te; t += 4)
                    tile_tokens(tile, ts, tb, kc, gs, &xq, T, cols, k0, t, Yt, ldy, m0, m1, first, 4, LV);
                for (; t < te; t++)
                    tile_tokens(tile, ts, tb, kc, gs, &xq, T, cols, k0, t, Yt, ldy, m0, m1, first, 1, LV);
            }
        }
    }
}


/* ---- the repacked layout (quant.h): 32-row tiles read as they are ------- *
 *
 * The same arithmetic as tile_tokens (x quantized the same way, the same
 * integer group sums, the same float epilogue per group), but the weights
 * come from mx_qmat.rp: a k-step is one 64-byte load, `v & 15` and
 * `(v >> 4) & 15` are the two 16-row vpdpbusd operands, and the group's
 * scales and biases follow its k-steps in the same stream.  Nothing is
 * unpacked into a tile first, so the kernel also serves the few-token and
 * one-token calls: every entry point takes it when rp is set.  x comes
 * either from the prefill's block (token-interleaved, [cols/4][T][4]) or
 * from the matvec's prepared vectors (vlayout x8: natural order, 64 values
 * per level per block); the bytes and steps are the same (quant_levels),
 * so one token's result does not depend on the path or the token count. */

enum { XS_BLOCK, XS_VECS };

typedef struct rpsrc {
    const xquant *xq;    /* XS_BLOCK: the prepared block of T tokens */
    int64_t T;
    const vlayout *L;    /* XS_VECS: one prepared vector per token */
} rpsrc;

/* One token's group result into its 32 local outputs yl: part 0 is
 * 256*sum q*xh + sum q*xm (scale 256*s*dx), part 1 sum q*xl or the one
 * level (scale s*dx) plus the bias term b * sum(x). */
static inline __attribute__((always_inline)) void
rp_epilogue(__m512i a0, __m512i a1, __m512 s0, __m512 s1, __m512 b0, __m512 b1, float dxj,
            float xsj, float *yl, int part)
{
    __m512 d = _mm512_set1_ps(part ? dxj : 256.0f * dxj);
    __m512 y0 = _mm512_load_ps(yl), y1 = _mm512_load_ps(yl + 16);
    y0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a0), _mm512_mul_ps(s0, d), y0);
    y1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a1), _mm512_mul_ps(s1, d), y1);
    if (part) {
        __m512 xs = _mm512_set1_ps(xsj);
        y0 = _mm512_fmadd_ps(b0, xs, y0);
        y1 = _mm512_fmadd_ps(b1, xs, y1);
    }
    _mm512_store_ps(yl, y0);
    _mm512_store_ps(yl + 16, y1);
}

#define RP_STEP(j)                                                                \
    if (j < nt) {                                                                 \
        __m512i xv = _mm512_set1_epi32(XS == XS_BLOCK ? xl[kx + j] : xt[j][kx]);  \
        DPBUSD(a0_##j, w0, xv);                                                   \
        DPBUSD(a1_##j, w1, xv);                                                   \
    }
#define RP_STORE(j)                                                               \
    if (j < nt) {                                                                 \
        const int64_t t = t0 + j;                                                 \
        rp_epilogue(a0_##j, a1_##j, s0, s1, b0, b1,                               \
                    XS == XS_BLOCK ? X->xq->dx[t * ng + g] : X->L[t].dx[g],       \
                    XS == XS_BLOCK ? X->xq->xs[t * ng + g] : X->L[t].xsum[g],     \
                    yl + j * 32, part);                                           \
    }

/* Sum over group g's k-steps of one x level LVL for the nt tokens.  A
 * 64-column block of x is one run of 16 dwords in either source. */
#define RP_DOT(LVL)                                                                        \
    do {                                                                                   \
        const int32_t *xl = NULL, *xt[12];                                                 \
        if (XS == XS_BLOCK) {                                                              \
            const int8_t *lvp = (LVL) == 0 ? X->xq->h : (LVL) == 1 ? X->xq->m : X->xq->l;  \
            xl = (const int32_t *)(const void *)lvp;                                       \
        } else {                                                                           \
            for (int j = 0; j < nt; j++)                                                   \
                xt[j] = (const int32_t *)(const void *)(X->L[t0 + j].x8 + 64 * (LVL));     \
        }                                                                                  \
        for (int sb = 0; sb < gs; sb += 64) {                                              \
            const int64_t cb = g * gs + sb;                                                \
            const int64_t kb = XS == XS_BLOCK ? (cb / 4) * X->T + t0                       \
                                              : (cb / 64) * 16 * LV + (cb % 64) / 4;       \
            for (int k = 0; k < (gs < 64 ? gs / 4 : 16); k++) {                            \
                __m512i v = _mm512_load_si512(grp + (sb / 4 + k) * 64);                    \
                __m512i w0 = _mm512_and_si512(v, nib);                                     \
                __m512i w1 = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);               \
                const int64_t kx = XS == XS_BLOCK ? kb + k * X->T : kb + k;                \
                REP12(RP_STEP)                                                             \
            }                                                                              \
        }                                                                                  \
    } while (0)

/* The three levels in one pass over a group's k-steps, for up to 4 tokens
 * (6 accumulators each): a few tokens (decode) then unpack each k-step
 * once instead of once per level.  The integer sums are those of the
 * three passes ((h << 8) + m is exact), so the results are the same bits. */
#define REP4(M) M(0) M(1) M(2) M(3)
#define RP3_ZERO(j)                                                                        \
    __m512i h0_##j = _mm512_setzero_si512(), h1_##j = h0_##j, m0_##j = h0_##j,             \
            m1_##j = h0_##j, l0_##j = h0_##j, l1_##j = h0_##j;
#define RP3_STEP(j)                                                                        \
    if (j < nt) {                                                                          \
        __m512i xv = _mm512_set1_epi32(XS == XS_BLOCK ? xh[kx + j] : xt[j][kx]);           \
        DPBUSD(h0_##j, w0, xv);                                                            \
        DPBUSD(h1_##j, w1, xv);                                                            \
        xv = _mm512_set1_epi32(XS == XS_BLOCK ? xm[kx + j] : xt[j][kx + 16]);              \
        DPBUSD(m0_##j, w0, xv);                                                            \
        DPBUSD(m1_##j, w1, xv);                                                            \
        xv = _mm512_set1_epi32(XS == XS_BLOCK ? xo[kx + j] : xt[j][kx + 32]);              \
        DPBUSD(l0_##j, w0, xv);                                                            \
        DPBUSD(l1_##j, w1, xv);                                                            \
    }
#define RP3_STORE(j)                                                                       \
    if (j < nt) {                                                                          \
        const int64_t t = t0 + j;                                                          \
        const float dxj = XS == XS_BLOCK ? X->xq->dx[t * ng + g] : X->L[t].dx[g];          \
        const float xsj = XS == XS_BLOCK ? X->xq->xs[t * ng + g] : X->L[t].xsum[g];        \
        rp_epilogue(_mm512_add_epi32(_mm512_slli_epi32(h0_##j, 8), m0_##j),                \
                    _mm512_add_epi32(_mm512_slli_epi32(h1_##j, 8), m1_##j), s0, s1, b0, b1, \
                    dxj, xsj, yl + j * 32, 0);                                             \
        rp_epilogue(l0_##j, l1_##j, s0, s1, b0, b1, dxj, xsj, yl + j * 32, 1);             \
    }

static inline __attribute__((always_inline)) void
rp_group3(const uint8_t *grp, int64_t g, int64_t ng, const rpsrc *X, int64_t t0, float *yl,
          __m512 s0, __m512 s1, __m512 b0, __m512 b1, const int nt, const int gs, const int XS)
{
    const int LV = 3;
    const __m512i nib = _mm512_set1_epi8(0x0f);
    const int32_t *xh = NULL, *xm = NULL, *xo = NULL, *xt[4];
    if (XS == XS_BLOCK) {
        xh = (const int32_t *)(const void *)X->xq->h;
        xm = (const int32_t *)(const void *)X->xq->m;
        xo = (const int32_t *)(const void *)X->xq->l;
    } else {
        for (int j = 0; j < nt; j++)
            xt[j] = (const int32_t *)(const void *)X->L[t0 + j].x8;
    }
    REP4(RP3_ZERO)
    for (int sb = 0; sb < gs; sb += 64) {
        const int64_t cb = g * gs + sb;
        const int64_t kb = XS == XS_BLOCK ? (cb / 4) * X->T + t0 : (cb / 64) * 16 * LV + (cb % 64) / 4;
        for (int k = 0; k < (gs < 64 ? gs / 4 : 16); k++) {
            __m512i v = _mm512_load_si512(grp + (sb / 4 + k) * 64);
            __m512i w0 = _mm512_and_si512(v, nib);
            __m512i w1 = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
            const int64_t kx = XS == XS_BLOCK ? kb + k * X->T : kb + k;
            REP4(RP3_STEP)
        }
    }
    REP4(RP3_STORE)
}

/* Bytes ahead of the group being read that each group prefetches (its own
 * size in lines): the tile stream is sequential, yet without it the loads
 * of the weights and scales stalled (perf: most of the kernel's samples on
 * them) and the kernel ran at half speed from DRAM for 8-16 tokens
 * (bench_quant rp: 0.107 vs 0.206 ms per expert pair at T = 8, fast). */
#define RP_PF 4096
/* Groups [g0, g1) of one tile for tokens t0 .. t0+nt-1, added to the local
 * outputs yl[nt][32]. */
static inline __attribute__((always_inline)) void
rp_groups(const uint8_t *tile, mx_dtype sdt, int64_t g0, int64_t g1, int64_t ng, const rpsrc *X,
          int64_t t0, float *yl, const int nt, const int gs, const int LV, const int XS)
{
    const size_t ss = mx_dtype_size(sdt), gb = 16 * (size_t)gs + 64 * ss;
    const __m512i nib = _mm512_set1_epi8(0x0f);
    for (int64_t g = g0; g < g1; g++) {
        const uint8_t *grp = tile + (size_t)g * gb;
        const uint8_t *sp = grp + 16 * (size_t)gs, *bp = sp + 32 * ss;
        for (size_t o = 0; o < gb; o += 64)
            _mm_prefetch((const char *)grp + RP_PF + o, _MM_HINT_T0);
        const __m512 s0 = load16_s(sp, sdt, 0, 0xffff), s1 = load16_s(sp, sdt, 16, 0xffff);
        const __m512 b0 = load16_s(bp, sdt, 0, 0xffff), b1 = load16_s(bp, sdt, 16, 0xffff);
        if (LV == 3 && nt <= 4) {
            rp_group3(grp, g, ng, X, t0, yl, s0, s1, b0, b1, nt <= 4 ? nt : 4, gs, XS);
            continue;
        }
        if (LV == 3) {
            const int part = 0;
            REP12(ACC_ZERO)
            RP_DOT(0);
            REP12(ACC_SHIFT)
            RP_DOT(1);
            REP12(RP_STORE)
        }
        {
            const int part = 1;
            REP12(ACC_ZERO)
            RP_DOT(LV == 3 ? 2 : 0);
            REP12(RP_STORE)
        }
    }
}

/* Tokens t0 .. t0+nt-1 of one tile, groups [g0, g1): the tile's rows
 * rt+lo .. rt+hi-1 go to Y[t*ldy + r - ybase], set when `first`, else
 * added to. */
static inline __attribute__((always_inline)) void
rp_block(const mx_qmat *m, const uint8_t *tile, int64_t g0, int64_t g1, const rpsrc *X, int64_t t0,
         float *Y, int64_t ldy, int64_t ybase, int64_t rt, int lo, int hi, int first, const int nt,
         const int gs, const int LV, const int XS)
{
    _Alignas(64) float yl[12 * 32];
    for (int j = 0; j < nt * 32; j += 16)
        _mm512_store_ps(yl + j, _mm512_setzero_ps());
    rp_groups(tile, m->sdtype, g0, g1, mx_qmat_groups(m), X, t0, yl, nt, gs, LV, XS);
    for (int j = 0; j < nt; j++) {
        float *yj = Y + (t0 + j) * ldy + (rt - ybase);
        if (lo == 0) {   /* the usual case: a whole tile, or its first rows */
            const __mmask16 m0 = mask16(hi), m1 = mask16(hi > 16 ? hi - 16 : 0);
            __m512 y0 = _mm512_load_ps(yl + j * 32), y1 = _mm512_load_ps(yl + j * 32 + 16);
            if (!first) {
                y0 = _mm512_add_ps(y0, _mm512_maskz_loadu_ps(m0, yj));
                y1 = _mm512_add_ps(y1, _mm512_maskz_loadu_ps(m1, yj + 16));
            }
            _mm512_mask_storeu_ps(yj, m0, y0);
            _mm512_mask_storeu_ps(yj + 16, m1, y1);
        } else {         /* a range that starts inside the tile */
            for (int i = lo; i < hi; i++)
                yj[i] = (first ? 0.0f : yj[i]) + yl[j * 32 + i];
        }
    }
}

/* Rows [r0, r1) times T tokens from the repacked layout: Y[t*ldy + r - ybase].
 * KC columns at a time (for the prefill block, TPASS tokens at a time, as
 * matmul_rows_prepped: that chunk of x stays in L2 while every tile of the
 * range runs over it), added to Y per chunk whatever the source, so that
 * one token's result is the same bits on every path. */
/* Three levels from the prepared vectors (T <= 16) in blocks of at most 4
 * tokens, each in one pass (rp_group3); the prefill block in blocks of 12,
 * a level at a time, as the tile kernel. */
#define RP3_ONLY4 (LV == 3 && XS == XS_VECS)
static inline __attribute__((always_inline)) void
rp_rows_gs(const mx_qmat *m, const rpsrc *X, int64_t T, float *Y, int64_t ldy, int64_t ybase,
           int64_t r0, int64_t r1, const int gs, const int LV, const int XS)
{
    const int64_t ng = mx_qmat_groups(m);
    const size_t tbytes = (size_t)ng * (16 * (size_t)gs + 64 * mx_dtype_size(m->sdtype));
    const int64_t kg = KC / gs;   /* the same chunks for both sources: the same sums */
    const int64_t tpass = XS == XS_BLOCK ? TPASS : T;
    for (int64_t tp = 0; tp < T; tp += tpass) {
        const int64_t te = tp + tpass < T ? tp + tpass : T;
        for (int64_t rt = r0 - r0 % 32; rt < r1; rt += 32) {
            const int lo = (int)(r0 > rt ? r0 - rt : 0);
            const int hi = (int)(r1 - rt < 32 ? r1 - rt : 32);
            const uint8_t *tile = m->rp + (size_t)(rt / 32) * tbytes;
            for (int64_t g0 = 0; g0 < ng; g0 += kg) {
                const int64_t g1 = g0 + kg < ng ? g0 + kg : ng;
                const int first = g0 == 0;
                int64_t t = tp;
                for (; !RP3_ONLY4 && t + TB <= te; t += TB)
                    rp_block(m, tile, g0, g1, X, t, Y, ldy, ybase, rt, lo, hi, first, TB, gs, LV, XS);
                for (; !RP3_ONLY4 && t + 8 <= te; t += 8)
                    rp_block(m, tile, g0, g1, X, t, Y, ldy, ybase, rt, lo, hi, first, 8, gs, LV, XS);
                for (; t + 4 <= te; t += 4)
                    rp_block(m, tile, g0, g1, X, t, Y, ldy, ybase, rt, lo, hi, first, 4, gs, LV, XS);
                for (; t + 2 <= te; t += 2)
                    rp_block(m, tile, g0, g1, X, t, Y, ldy, ybase, rt, lo, hi, first, 2, gs, LV, XS);
                for (; t < te; t++)
                    rp_block(m, tile, g0, g1, X, t, Y, ldy, ybase, rt, lo, hi, first, 1, gs, LV, XS);
            }
        }
    }
}

/* One function per group size, level count and x source (inlined into one
 * body, GCC ran short of registers in the block loops: see mv1). */
#define RP_FN(GS, LV, XS)                                                                    \
    static __attribute__((noinline)) void rp_rows_g##GS##_l##LV##_##XS(                      \
        const mx_qmat *m, const rpsrc *X, int64_t T, float *Y, int64_t ldy, int64_t ybase,    \
        int64_t r0, int64_t r1)                                                               \
    {                                                                                        \
        rp_rows_gs(m, X, T, Y, ldy, ybase, r0, r1, GS, LV, XS);                              \
    }
#define RP_FNS(LV, XS) RP_FN(32, LV, XS) RP_FN(64, LV, XS) RP_FN(128, LV, XS)
RP_FNS(3, XS_BLOCK) RP_FNS(1, XS_BLOCK) RP_FNS(3, XS_VECS) RP_FNS(1, XS_VECS)
#undef RP_FNS
#undef RP_FN

static inline __attribute__((always_inline)) void
rp_rows(const mx_qmat *m, const rpsrc *X, int64_t T, float *Y, int64_t ldy, int64_t ybase,
        int64_t r0, int64_t r1, const int LV, const int XS)
{
#define RP_PICK(LVN, XSN)                                                                      \
    (m->group_size == 64 ? rp_rows_g64_l##LVN##_##XSN                                          \
     : m->group_size == 32 ? rp_rows_g32_l##LVN##_##XSN : rp_rows_g128_l##LVN##_##XSN)(       \
        m, X, T, Y, ldy, ybase, r0, r1)
    if (LV == 3 && XS == XS_BLOCK)
        RP_PICK(3, XS_BLOCK);
    else if (LV == 3)
        RP_PICK(3, XS_VECS);
    else if (XS == XS_BLOCK)
        RP_PICK(1, XS_BLOCK);
    else
        RP_PICK(1, XS_VECS);
#undef RP_PICK
}

/* Whether the kernels read m's repacked layout. */
static inline int rp_on(const mx_qmat *m) { return m->rp != NULL && m->bits == 4; }

/* The entry points: the repacked layout when the matrix has one, else the
 * MLX layout's kernels above. */
static inline __attribute__((always_inline)) void
matvec_rows_any_lv(const mx_qmat *m, const float *x, const void *xp, float *y, int64_t r0,
                   int64_t r1, const int LV)
{
    if (rp_on(m)) {
        vlayout L;
        layout(xp, m->cols, m->group_size, &L, LV);
        const rpsrc X = {.L = &L, .T = 1};
        rp_rows(m, &X, 1, y, 0, r0, r0, r1, LV, XS_VECS);
        return;
    }
    matvec_rows_lv(m, x, xp, y, r0, r1, LV);
}

static inline __attribute__((always_inline)) void
matvec_rows_multi_any_lv(const mx_qmat *m, const float *X, int64_t ldx, const void *xp,
                         size_t xstride, int64_t T, float *Y, int64_t ldy, int64_t r0, int64_t r1,
                         const int LV)
{
    if (rp_on(m)) {
        enum { CH = 16 };
        vlayout L[CH];
        for (int64_t t0 = 0; t0 < T; t0 += CH) {
            const int64_t n = T - t0 < CH ? T - t0 : CH;
            for (int64_t t = 0; t < n; t++)
                layout((const uint8_t *)xp + (t0 + t) * xstride, m->cols, m->group_size, &L[t], LV);
            const rpsrc S = {.L = L, .T = n};
            rp_rows(m, &S, n, Y + t0 * ldy, ldy, r0, r0, r1, LV, XS_VECS);
        }
        return;
    }
    matvec_rows_multi_lv(m, X, ldx, xp, xstride, T, Y, ldy, r0, r1, LV);
}

static inline __attribute__((always_inline)) void
matmul_rows_prepped_any_lv(const mx_qmat *m, const void *xp, int64_t T, float *Y, int64_t ldy,
                           int64_t r0, int64_t r1, const int LV)
{
    if (rp_on(m)) {
        const xquant xq = mm_layout((void *)xp, T, m->cols, m->group_size, LV);
        const rpsrc X = {.xq = &xq, .T = T};
        rp_rows(m, &X, T, Y, ldy, 0, r0, r1, LV, XS_BLOCK);
        return;
    }
    matmul_rows_prepped_lv(m, xp, T, Y, ldy, r0, r1, LV);
}

static inline __attribute__((always_inline)) void
matmul_rows_lv(const mx_qmat *m, const float *X, int64_t ldx, int64_t T, float *Y, int64_t ldy,
               int64_t r0, int64_t r1, const int LV)
{
    /* T rows of X, quantized once per call */
    void *mem = malloc(mm_prep_bytes_lv(T, m->cols, m->group_size, LV));
    if (!mem) {
        mx_qk_avx512.matmul_rows(m, X, ldx, T, Y, ldy, r0, r1);   /* no memory: float path */
        return;
    }
    mm_prep_lv(X, ldx, T, 0, T, m->cols, m->group_size, mem, LV);
    matmul_rows_prepped_any_lv(m, mem, T, Y, ldy, r0, r1, LV);
    free(mem);
}

/* The two variants: each entry point fixes the level count. */
#define VNNI_VARIANT(SUF, LVN)                                                                   \
    static size_t prep_bytes##SUF(int64_t cols, int gs) { return prep_bytes_lv(cols, gs, LVN); } \
    static void prep##SUF(const float *x, int64_t cols, int gs, void *buf)                      \
    {                                                                                           \
        prep_lv(x, cols, gs, buf, LVN);                                                         \
    }                                                                                           \
    static void matvec_rows##SUF(const mx_qmat *m, const float *x, const void *xp, float *y,    \
                                 int64_t r0, int64_t r1)                                        \
    {                                                                                           \
        matvec_rows_any_lv(m, x, xp, y, r0, r1, LVN);                                               \
    }                                                                                           \
    static void matvec_rows_multi##SUF(const mx_qmat *m, const float *X, int64_t ldx,           \
                                       const void *xp, size_t xstride, int64_t T, float *Y,     \
                                       int64_t ldy, int64_t r0, int64_t r1)                     \
    {                                                                                           \
        matvec_rows_multi_any_lv(m, X, ldx, xp, xstride, T, Y, ldy, r0, r1, LVN);                   \
    }                                                                                           \
    static void matmul_rows##SUF(const mx_qmat *m, const float *X, int64_t ldx, int64_t T,      \
                                 float *Y, int64_t ldy, int64_t r0, int64_t r1)                 \
    {                                                                                           \
        matmul_rows_lv(m, X, ldx, T, Y, ldy, r0, r1, LVN);                                      \
    }                                                                                           \
    static size_t mm_prep_bytes##SUF(int64_t T, int64_t cols, int gs)                           \
    {                                                                                           \
        return mm_prep_bytes_lv(T, cols, gs, LVN);                                              \
    }                                                                                           \
    static void mm_prep##SUF(const float *X, int64_t ldx, int64_t T, int64_t t0, int64_t t1,    \
                             int64_t cols, int gs, void *buf)                                   \
    {                                                                                           \
        mm_prep_lv(X, ldx, T, t0, t1, cols, gs, buf, LVN);                                      \
    }                                                                                           \
    static void matmul_rows_prepped##SUF(const mx_qmat *m, const void *xp, int64_t T, float *Y, \
                                         int64_t ldy, int64_t r0, int64_t r1)                   \
    {                                                                                           \
        matmul_rows_prepped_any_lv(m, xp, T, Y, ldy, r0, r1, LVN);                                  \
    }
VNNI_VARIANT(_vnni, 3)
VNNI_VARIANT(_vnni_fast, 1)
#undef VNNI_VARIANT

const mx_qkernels mx_qk_avx512vnni = {
    .name = "avx512vnni",
    .reads_rp = 1,
    .prep_bytes = prep_bytes_vnni,
    .prep = prep_vnni,
    .matvec_rows = matvec_rows_vnni,
    .matvec_rows_multi = matvec_rows_multi_vnni,
    .matmul_rows = matmul_rows_vnni,
    .mm_prep_bytes = mm_prep_bytes_vnni,
    .mm_prep = mm_prep_vnni,
    .matmul_rows_prepped = matmul_rows_prepped_vnni,
};

/* Fast precision: one int8 level of x per group. */
const mx_qkernels mx_qk_avx512vnni_fast = {
    .name = "avx512vnni-fast",
    .fast = 1,
    .reads_rp = 1,
    .prep_bytes = prep_bytes_vnni_fast,
    .prep = prep_vnni_fast,
    .matvec_rows = matvec_rows_vnni_fast,
    .matvec_rows_multi = matvec_rows_multi_vnni_fast,
    .matmul_rows = matmul_rows_vnni_fast,
    .mm_prep_bytes = mm_prep_bytes_vnni_fast,
    .mm_prep = mm_prep_vnni_fast,
    .matmul_rows_prepped = matmul_rows_prepped_vnni_fast,
};

#elif defined(__x86_64__)
/* Built without the VNNI flags (not through CMake, or an older CMakeLists):
 * the variant exists but is never offered (mx_qkernels_get checks
 * mx_qk_avx512vnni_built). */
#include "quant/qint.h"
const int mx_qk_avx512vnni_built = 0;
const mx_qkernels mx_qk_avx512vnni = { .name = "avx512vnni", .prep_bytes = mx_q_sums_bytes,
                                       .prep = mx_q_sums_prep,
                                       .matvec_rows = NULL, .matmul_rows = NULL };
const mx_qkernels mx_qk_avx512vnni_fast = { .name = "avx512vnni-fast", .fast = 1,
                                            .prep_bytes = mx_q_sums_bytes, .prep = mx_q_sums_prep,
                                            .matvec_rows = NULL, .matmul_rows = NULL };
#else
typedef int mx_kernels_vnni_unused;
#endif
