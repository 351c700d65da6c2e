/* half.h - f16 / bf16 <-> f32 conversions (scalar, exact, branch-light).
 * The SIMD kernels use F16C / shifts directly; these are the reference. */
#ifndef MX_HALF_H
#define MX_HALF_H

#include <stdint.h>
#include <string.h>

static inline float mx_bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t mx_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static inline float mx_bf16_to_f32(uint16_t h) { return mx_bits_f32((uint32_t)h << 16); }

/* Round to nearest even, NaN kept quiet. */
static inline uint16_t mx_f32_to_bf16(float f)
{
    uint32_t u = mx_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

static inline float mx_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    if (exp == 0) {
        if (man == 0)
            return mx_bits_f32(sign);
        /* subnormal: value = man * 2^-24 */
        float v = (float)man * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    if (exp == 31)
        return mx_bits_f32(sign | 0x7f800000u | (man << 13));
    return mx_bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

static inline uint16_t mx_f32_to_f16(float f)
{
    uint32_t u = mx_f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000;
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00);            /* NaN */
    if (a >= 0x477ff000u)
        return (uint16_t)(sign | 0x7c00);            /* overflow -> inf */
    if (a < 0x38800000u) {                           /* subnormal or zero */
        float v = mx_bits_f32(a) * 16777216.0f;      /* scale to units of 2^-24 */
        uint32_t m = (uint32_t)v;
        float r = v - (float)m;
        if (r > 0.5f || (r == 0.5f && (m & 1)))
            m++;
        return (uint16_t)(sign | m);
    }
    uint32_t e = ((a >> 23) - 112) << 10;
    uint32_t m = (a >> 13) & 0x3ff;
    uint32_t rest = a & 0x1fff;
    uint32_t h = e | m;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1)))
        h++;
    return (uint16_t)(sign | h);
}

#endif
