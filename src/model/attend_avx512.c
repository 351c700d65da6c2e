/* attend_avx512.c - softmax attention of a run of queries of one head,
 * AVX-512 (attend.c picks it at run time; built with -mavx512f -mfma).
 *
 * A prompt's queries of one head at consecutive positions read the same K
 * and V rows, so they are taken together: a chunk of 16 keys (8 KB at
 * head_dim 128) is loaded into L1 once for all the queries of the run,
 * and V rows once for two queries at a time, with the outputs in registers.
 * One query at a time (decode) runs the same code with a run of one.
 *
 * The arithmetic of one query does not depend on the other queries of its
 * run, so a token's result is the same bits whether it came alone or in a
 * prompt (tests/test_lookup.c checks that on whole models, test_attend.c
 * here):
 *   - the score of key j: lane i of a vector sums q[c*16+i] * k_j[c*16+i]
 *     over c in order (a multiply, then FMAs), then the 16 lanes of 16 keys
 *     are summed by one fixed transpose-and-add tree; key chunks start at
 *     multiples of 16 of the position, so key j always sits in slot j % 16;
 *   - the sum of the exponentials: lane i sums the keys j = i mod 16 of the
 *     query's own range in order, then the 16 lanes in a fixed order;
 *   - the output: out[d] = sum over j in order of p_j * v_j[d] by FMA. */
#if defined(__x86_64__) && defined(__AVX512F__) && defined(__FMA__)
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "model/ops.h"

/* e^x for x <= 0, lane-wise: attend.c's exp_neg (same constants and
 * Taylor series), by FMA. */
static inline __m512 exp_neg16(__m512 x)
{
    const __m512 lo = _mm512_set1_ps(-87.0f);
    const __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    const __m512 xc = _mm512_max_ps(x, lo);
    const __m512 magic = _mm512_set1_ps(12582912.0f);
    const __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(xc, _mm512_set1_ps(1.44269504088896341f), magic), magic);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mul_ps((__mmask16)~under, p, _mm512_castsi512_ps(bits));
}

/* Lanes of keys [j0, j0+16) that lie in [lo, hi]. */
static inline __mmask16 key_mask(int j0, int lo, int hi)
{
    uint32_t m = 0xffffu;
    if (lo > j0)
        m &= 0xffffu << (lo - j0);
    if (hi < j0 + 15)
        m &= 0xffffu >> (15 - (hi - j0));
    return (__mmask16)m;
}

/* a[k] holds the 16 lane partials of key k of a chunk: the 16 sums, key k
 * in lane k.  Every key's lanes meet in the same order: (i, i+2) within
 * each quarter, then the quarter's pairs, then quarters 0+1 and 2+3, then
 * the two halves. */
static inline __m512 sum16(const __m512 a[16])
{
    __m512 t[8], u[4];
    for (int i = 0; i < 8; i++)
        t[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]),
                             _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
    for (int i = 0; i < 4; i++)
        u[i] = _mm512_add_ps(_mm512_shuffle_ps(t[2 * i], t[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(t[2 * i], t[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    const __m512 x01 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                     _mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512 x23 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                     _mm512_shuffle_f32x4(u[2], u[3], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(x01, x23, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(x01, x23, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* Scores of keys [j0, j0+16) ∩ [lo, hi] for one query (hd a multiple of
 * 16) into sc[j] (scaled); keys outside count as zero vectors (not read).
 * FULL: the whole chunk is in range (no per-key test). */
static inline __attribute__((always_inline)) void
scores16(const float *q, const float *K, int j0, int lo, int hi, int hd, float scale, float *sc,
         const int FULL, const int HD)
{
    if (HD)
        hd = HD;   /* a constant: the 16 key rows at fixed offsets from one pointer */
    __m512 a[16];
    const __mmask16 m = FULL ? (__mmask16)0xffff : key_mask(j0, lo, hi);
    const float *kj = K + (size_t)j0 * hd;
    {
        const __m512 qc = _mm512_loadu_ps(q);
#pragma GCC unroll 16
        for (int k = 0; k < 16; k++)
            a[k] = FULL || (m >> k & 1) ? _mm512_mul_ps(qc, _mm512_loadu_ps(kj + (size_t)k * hd))
                                        : _mm512_setzero_ps();
    }
    for (int c = 16; c < hd; c += 16) {
        const __m512 qc = _mm512_loadu_ps(q + c);
#pragma GCC unroll 16
        for (int k = 0; k < 16; k++)
            if (FULL || (m >> k & 1))
                a[k] = _mm512_fmadd_ps(qc, _mm512_loadu_ps(kj + (size_t)k * hd + c), a[k]);
    }
    const __m512 s = _mm512_mul_ps(sum16(a), _mm512_set1_ps(scale));
    if (FULL)
        _mm512_storeu_ps(sc + j0, s);
    else
        _mm512_mask_storeu_ps(sc + j0, m, s);
}

/* sc[start..pos]: scores in, softmax weights out (divided by the sum, as
 * torch's softmax). */
static inline void softmax_row(float *sc, int start, int pos)
{
    const int a0 = start & ~15;
    __m512 vmx = _mm512_set1_ps(-INFINITY);
    for (int j0 = a0; j0 <= pos; j0 += 16)
        vmx = _mm512_mask_max_ps(vmx, key_mask(j0, start, pos), vmx, _mm512_maskz_loadu_ps(key_mask(j0, start, pos), sc + j0));
    const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(vmx));
    __m512 vs = _mm512_setzero_ps();
    for (int j0 = a0; j0 <= pos; j0 += 16) {
        const __mmask16 m = key_mask(j0, start, pos);
        const __m512 e = exp_neg16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, sc + j0), mx));
        vs = _mm512_mask_add_ps(vs, m, vs, e);
        _mm512_mask_storeu_ps(sc + j0, m, e);
    }
    /* the 16 lanes in a fixed order: halves, quarters, pairs */
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(vs), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(vs), 1)));
    __m128 f = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    f = _mm_add_ps(f, _mm_movehl_ps(f, f));
    f = _mm_add_ss(f, _mm_movehdup_ps(f));
    const __m512 sum = _mm512_set1_ps(_mm_cvtss_f32(f));
    for (int j0 = a0; j0 <= pos; j0 += 16) {
        const __mmask16 m = key_mask(j0, start, pos);
        _mm512_mask_storeu_ps(sc + j0, m, _mm512_div_ps(_mm512_maskz_loadu_ps(m, sc + j0), sum));
    }
}

/* out_b[d0 .. d0 + 16*NC) for NQ (1 or 2) queries: sum over their keys in
 * order of p_j * v_j, FMA by FMA.  Query b's keys are [st[b], ps[b]]; the
 * ranges of a run are ordered (st and ps ascending). */
static inline __attribute__((always_inline)) void
pv_block(const float *V, int hd, int d0, const float *const *p, const int *st, const int *ps,
         float *const *out, const int NQ, const int NC)
{
    __m512 acc[2][8];
#pragma GCC unroll 2
    for (int b = 0; b < NQ; b++)
#pragma GCC unroll 8
        for (int c = 0; c < NC; c++)
            acc[b][c] = _mm512_setzero_ps();
    /* [st0, st1): query 0 only; [st1, ps0]: both; (ps0, ps1]: query 1 only
     * (st1 <= ps0 + 1: a window holds at least one key) */
    const int both0 = NQ == 2 ? (st[1] < ps[0] + 1 ? st[1] : ps[0] + 1) : st[0];
    const int both1 = ps[0];
    for (int j = st[0]; j < both0; j++) {
        const __m512 w = _mm512_set1_ps(p[0][j]);
#pragma GCC unroll 8
        for (int c = 0; c < NC; c++)
            acc[0][c] = _mm512_fmadd_ps(w, _mm512_loadu_ps(V + (size_t)j * hd + d0 + 16 * c), acc[0][c]);
    }
    for (int j = both0; j <= both1; j++) {
        const __m512 w0 = _mm512_set1_ps(p[0][j]);
        const __m512 w1 = NQ == 2 ? _mm512_set1_ps(p[1][j]) : w0;
#pragma GCC unroll 8
        for (int c = 0; c < NC; c++) {
            const __m512 v = _mm512_loadu_ps(V + (size_t)j * hd + d0 + 16 * c);
            acc[0][c] = _mm512_fmadd_ps(w0, v, acc[0][c]);
            if (NQ == 2)
                acc[1][c] = _mm512_fmadd_ps(w1, v, acc[1][c]);
        }
    }
    if (NQ == 2)
        for (int j = both1 + 1 > st[1] ? both1 + 1 : st[1]; j <= ps[1]; j++) {
            const __m512 w = _mm512_set1_ps(p[1][j]);
#pragma GCC unroll 8
            for (int c = 0; c < NC; c++)
                acc[1][c] = _mm512_fmadd_ps(w, _mm512_loadu_ps(V + (size_t)j * hd + d0 + 16 * c), acc[1][c]);
        }
#pragma GCC unroll 2
    for (int b = 0; b < NQ; b++)
#pragma GCC unroll 8
        for (int c = 0; c < NC; c++)
            _mm512_storeu_ps(out[b] + d0 + 16 * c, acc[b][c]);
}

static inline __attribute__((always_inline)) void
pv(const float *V, int hd, const float *const *p, const int *st, const int *ps, float *const *out,
   const int NQ)
{
    int d0 = 0;
    for (; d0 + 128 <= hd; d0 += 128)
        pv_block(V, hd, d0, p, st, ps, out, NQ, 8);
    for (; d0 + 64 <= hd; d0 += 64)
        pv_block(V, hd, d0, p, st, ps, out, NQ, 4);
    for (; d0 < hd; d0 += 16)
        pv_block(V, hd, d0, p, st, ps, out, NQ, 1);
}

static inline __attribute__((always_inline)) void
attend_run(const float *q, size_t ldq, int nq, const float *K, const float *V, const int *start, int pos0,
           int hd, float scale, float *sc, size_t ldsc, float *out, size_t ldo, const int HD)
{
    /* scores: each 16-key chunk once into L1 for every query that sees it */
    const int lo = start[0], hi = pos0 + nq - 1;
    for (int j0 = lo & ~15; j0 <= hi; j0 += 16)
        for (int b = 0; b < nq; b++)
            if (j0 >= start[b] && j0 + 15 <= pos0 + b)
                scores16(q + (size_t)b * ldq, K, j0, 0, 0, hd, scale, sc + (size_t)b * ldsc, 1, HD);
            else if (j0 + 15 >= start[b] && j0 <= pos0 + b)
                scores16(q + (size_t)b * ldq, K, j0, start[b], pos0 + b, hd, scale,
                         sc + (size_t)b * ldsc, 0, HD);
    for (int b = 0; b < nq; b++)
        softmax_row(sc + (size_t)b * ldsc, start[b], pos0 + b);
    /* weighted sums of V rows, two queries at a time */
    int b = 0;
    for (; b + 2 <= nq; b += 2) {
        const float *p[2] = {sc + (size_t)b * ldsc, sc + (size_t)(b + 1) * ldsc};
        const int st[2] = {start[b], start[b + 1]}, ps[2] = {pos0 + b, pos0 + b + 1};
        float *o[2] = {out + (size_t)b * ldo, out + (size_t)(b + 1) * ldo};
        pv(V, hd, p, st, ps, o, 2);
    }
    if (b < nq) {
        const float *p[2] = {sc + (size_t)b * ldsc, NULL};
        const int st[2] = {start[b], 0}, ps[2] = {pos0 + b, 0};
        float *o[2] = {out + (size_t)b * ldo, NULL};
        pv(V, hd, p, st, ps, o, 1);
    }
}

/* The usual head widths as constants (row offsets in the instructions),
 * others at run time; the same arithmetic either way. */
void mx_attend_run_avx512(const float *q, size_t ldq, int nq, const float *K, const float *V,
                          const int *start, int pos0, int hd, float scale, float *sc, size_t ldsc,
                          float *out, size_t ldo)
{
    if (hd == 128)
        attend_run(q, ldq, nq, K, V, start, pos0, hd, scale, sc, ldsc, out, ldo, 128);
    else if (hd == 64)
        attend_run(q, ldq, nq, K, V, start, pos0, hd, scale, sc, ldsc, out, ldo, 64);
    else if (hd == 256)
        attend_run(q, ldq, nq, K, V, start, pos0, hd, scale, sc, ldsc, out, ldo, 256);
    else
        attend_run(q, ldq, nq, K, V, start, pos0, hd, scale, sc, ldsc, out, ldo, 0);
}
#else
typedef int mx_attend_avx512_unused;
#endif
