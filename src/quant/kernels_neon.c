/* kernels_neon.c - NEON kernels for aarch64 (always present there).
 *
 * Kept deliberately simple because it cannot be tested on the x86 build
 * machines: values are unpacked to bytes with the generic unpacker, then
 * widened and FMA'd four at a time.  matmul dequantizes KC columns of one row
 * once and reuses them for every token. */
#if defined(__aarch64__)
#include <arm_neon.h>

#include "quant/qint.h"

#define KC 256

static inline float dot_q(const uint8_t *q, const float *x, int n)
{
    float32x4_t a0 = vdupq_n_f32(0), a1 = vdupq_n_f32(0);
    for (int i = 0; i < n; i += 8) {
        uint16x8_t w = vmovl_u8(vld1_u8(q + i));
        a0 = vfmaq_f32(a0, vcvtq_f32_u32(vmovl_u16(vget_low_u16(w))), vld1q_f32(x + i));
        a1 = vfmaq_f32(a1, vcvtq_f32_u32(vmovl_u16(vget_high_u16(w))), vld1q_f32(x + i + 4));
    }
    return vaddvq_f32(vaddq_f32(a0, a1));
}

static inline float dot_f(const float *w, const float *x, int64_t n)
{
    float32x4_t a0 = vdupq_n_f32(0), a1 = vdupq_n_f32(0);
    for (int64_t i = 0; i < n; i += 8) {
        a0 = vfmaq_f32(a0, vld1q_f32(w + i), vld1q_f32(x + i));
        a1 = vfmaq_f32(a1, vld1q_f32(w + i + 4), vld1q_f32(x + i + 4));
    }
    return vaddvq_f32(vaddq_f32(a0, a1));
}

static void matvec_rows_neon(const mx_qmat *m, const float *x, const void *xp,
                             float *y, int64_t r0, int64_t r1)
{
    const float *xsum = xp;   /* prep: the group sums */
    int gs = m->group_size;
    int64_t ng = mx_qmat_groups(m);
    uint8_t q[128];
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = mx_q_row_ptr(m, r);
        float acc = 0;
        for (int64_t g = 0; g < ng; g++) {
            mx_q_unpack(row, m->bits, g * gs, gs, q);
            float s = mx_q_scalar_at(m->scales, m->sdtype, r * ng + g);
            float b = mx_q_scalar_at(m->biases, m->sdtype, r * ng + g);
            acc += s * dot_q(q, x + g * gs, gs) + b * xsum[g];
        }
        y[r - r0] = acc;
    }
}

static void matmul_rows_neon(const mx_qmat *m, const float *X, int64_t ldx, int64_t T,
                             float *Y, int64_t ldy, int64_t r0, int64_t r1)
{
    float buf[KC];
    for (int64_t r = r0; r < r1; r++) {
        for (int64_t k0 = 0; k0 < m->cols; k0 += KC) {
            int64_t kc = m->cols - k0 < KC ? m->cols - k0 : KC;
            mx_q_dequant_generic(m, r, k0, kc, buf);
            for (int64_t t = 0; t < T; t++) {
                float d = dot_f(buf, X + t * ldx + k0, kc);
                Y[t * ldy + r] = k0 == 0 ? d : Y[t * ldy + r] + d;
            }
        }
    }
}

const mx_qkernels mx_qk_neon = {
    .name = "neon",
    .prep_bytes = mx_q_sums_bytes,
    .prep = mx_q_sums_prep,
    .matvec_rows = matvec_rows_neon,
    .matmul_rows = matmul_rows_neon,
};
#else
typedef int mx_kernels_neon_unused;
#endif
