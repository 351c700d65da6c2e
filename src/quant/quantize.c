/* quantize.c - the MLX affine quantizer (reference; used by `mlxcel synth`
 * and the tests).
 *
 * Per group of group_size values, in f32 like MLX's CPU backend:
 *   step  = max((max - min) / (2^bits - 1), 1e-7)
 *   edge  = the extreme of larger magnitude (min when |min| > |max|, else
 *           max); the step is negated when edge is max, so q still runs
 *           0..2^bits-1 from the edge inwards and the edge is exact;
 *   q0    = rint(edge / step); when q0 != 0 the step is nudged to edge / q0
 *           so that zero falls exactly on a level, and bias = edge
 *           (otherwise bias = 0);
 *   q     = clamp(rint((w - bias) / step), 0, 2^bits - 1).
 * Scale and bias are then rounded to the storage dtype; q was computed with
 * the unrounded f32 step (as MLX does).  Values are packed LSB-first into one
 * little-endian bit stream per row. */
#include <math.h>
#include <string.h>

#include "quant/qint.h"

static void store_s(void *p, mx_dtype t, int64_t i, float v)
{
    if (t == MX_F16) {
        uint16_t h = mx_f32_to_f16(v);
        memcpy((uint8_t *)p + 2 * i, &h, 2);
    } else if (t == MX_BF16) {
        uint16_t h = mx_f32_to_bf16(v);
        memcpy((uint8_t *)p + 2 * i, &h, 2);
    } else {
        memcpy((uint8_t *)p + 4 * i, &v, 4);
    }
}

/* One group: computes scale/bias and the q values. */
static void quantize_group(const float *w, int gs, int bits, uint8_t *q, float *scale,
                           float *bias)
{
    float n_bins = (float)((1 << bits) - 1);
    float lo = w[0], hi = w[0];
    for (int j = 1; j < gs; j++) {
        lo = w[j] < lo ? w[j] : lo;
        hi = w[j] > hi ? w[j] : hi;
    }
    int min_edge = fabsf(lo) > fabsf(hi);
    float s = (hi - lo) / n_bins;
    if (!(s > 1e-7f))
        s = 1e-7f;
    if (!min_edge)
        s = -s;
    float edge = min_edge ? lo : hi;
    float q0 = rintf(edge / s), b = 0;
    if (q0 != 0) {
        s = edge / q0;
        b = edge;
    }
    for (int j = 0; j < gs; j++) {
        float v = rintf((w[j] - b) / s);
        v = v < 0 ? 0 : v > n_bins ? n_bins : v;
        q[j] = (uint8_t)v;
    }
    *scale = s;
    *bias = b;
}

int mx_quantize(const float *w, int64_t rows, int64_t cols, int bits, int group_size,
                mx_dtype sdtype, uint8_t *packed, void *scales, void *biases, mx_err *e)
{
    if (!mx_qtraits_for(bits))
        return mx_fail(e, MX_EUNSUPPORTED, "quantize: %d bits not supported (2, 3, 4, 5, 6, 8)",
                       bits);
    if (!mx_group_size_ok(group_size))
        return mx_fail(e, MX_EUNSUPPORTED, "quantize: group_size %d not supported (32, 64, 128)",
                       group_size);
    if (!mx_scale_dtype_ok(sdtype))
        return mx_fail(e, MX_EUNSUPPORTED, "quantize: scale dtype %s not supported",
                       mx_dtype_name(sdtype));
    if (rows < 0 || cols <= 0 || cols % group_size)
        return mx_fail(e, MX_EINVAL, "quantize: %lld columns is not a positive multiple of "
                       "group_size %d", (long long)cols, group_size);
    int64_t ng = cols / group_size, rb = cols * bits / 8;
    uint8_t q[128];
    memset(packed, 0, (size_t)(rows * rb));
    for (int64_t r = 0; r < rows; r++) {
        uint8_t *row = packed + r * rb;
        for (int64_t g = 0; g < ng; g++) {
            float s, b;
            quantize_group(w + r * cols + g * group_size, group_size, bits, q, &s, &b);
            store_s(scales, sdtype, r * ng + g, s);
            store_s(biases, sdtype, r * ng + g, b);
            for (int j = 0; j < group_size; j++) {
                int64_t p = (g * group_size + j) * bits;     /* bit position */
                uint32_t v = (uint32_t)q[j] << (p & 7);      /* <= 15 bits */
                row[p >> 3] |= (uint8_t)v;
                if ((p & 7) + bits > 8)
                    row[(p >> 3) + 1] |= (uint8_t)(v >> 8);
            }
        }
    }
    return MX_OK;
}
