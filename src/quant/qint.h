/* qint.h - internals shared by the quant kernel files (not a public API).
 *
 * Every kernel variant (scalar, avx2, avx512, avx512vnni, neon) is one mx_qkernels table
 * defined in its own file; quant.c picks one at run time.  The helpers here
 * are the scalar definitions of the format that all variants agree with. */
#ifndef MX_QINT_H
#define MX_QINT_H

#include <stdint.h>
#include <string.h>

#include "quant/quant.h"
#include "util/dtype.h"

extern const mx_qkernels mx_qk_scalar, mx_qk_scalar_fast;
#if defined(__x86_64__) || defined(__i386__)
extern const mx_qkernels mx_qk_avx2;
extern const mx_qkernels mx_qk_avx512;
extern const mx_qkernels mx_qk_avx512vnni, mx_qk_avx512vnni_fast;
/* 0 when a variant's file was compiled without its target flags (then the
 * variant is never offered). */
extern const int mx_qk_avx2_built, mx_qk_avx512_built, mx_qk_avx512vnni_built;
#endif
#if defined(__aarch64__)
extern const mx_qkernels mx_qk_neon;
#endif

/* Element i of a scale/bias array, as f32. */
static inline float mx_q_scalar_at(const void *p, mx_dtype t, int64_t i) { return mx_dtype_get(p, t, i); }

/* Packed bytes of row r. */
static inline const uint8_t *mx_q_row_ptr(const mx_qmat *m, int64_t r)
{
    return m->w + r * mx_qmat_row_bytes(m);
}

/* Quantized value k of a packed row: bits [k*bits, (k+1)*bits) of the
 * little-endian bit stream.  Reads a second byte only when the value crosses
 * a byte boundary, so it never reads past the row. */
static inline uint32_t mx_q_value(const uint8_t *row, int bits, int64_t k)
{
    int64_t p = k * bits;
    int off = (int)(p & 7);
    uint32_t v = row[p >> 3] >> off;
    if (off + bits > 8)
        v |= (uint32_t)row[(p >> 3) + 1] << (8 - off);
    return v & ((1u << bits) - 1);
}

/* Unpacks values [k0, k0+n) of a row into q (k0 and n multiples of 8, so each
 * run starts on a byte boundary: 8 values = `bits` whole bytes). */
static inline void mx_q_unpack(const uint8_t *row, int bits, int64_t k0, int n, uint8_t *q)
{
    const uint8_t *p = row + k0 * bits / 8;
    uint32_t mask = (1u << bits) - 1;
    for (int i = 0; i < n; i += 8) {
        uint64_t v = 0;
        for (int b = 0; b < bits; b++)          /* 8 values = bits bytes */
            v |= (uint64_t)p[b] << (8 * b);
        p += bits;
        for (int j = 0; j < 8; j++)
            q[i + j] = (uint8_t)((v >> (j * bits)) & mask);
    }
}

/* The prepared x of the float variants: the group sums (mx_group_sums). */
size_t mx_q_sums_bytes(int64_t cols, int group_size);
void mx_q_sums_prep(const float *x, int64_t cols, int group_size, void *buf);

/* Dequantizes values [k0, k0+n) of row r (k0, n multiples of the group size)
 * with the generic unpacker; used by SIMD variants for uncommon bit widths. */
void mx_q_dequant_generic(const mx_qmat *m, int64_t r, int64_t k0, int64_t n, float *out);

#endif
