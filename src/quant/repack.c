/* repack.c - the repacked layout of a 4-bit matrix (quant.h describes it):
 * written from the MLX layout once (at load, or into a cache file) so that
 * the VNNI kernels read ready-made 32-row tiles instead of unpacking and
 * transposing rows on every call. */
#include <string.h>

#include "quant/qint.h"

static size_t group_bytes(const mx_qmat *m)
{
    return 16 * (size_t)m->group_size + 64 * mx_dtype_size(m->sdtype);
}

static size_t tile_bytes(const mx_qmat *m) { return (size_t)mx_qmat_groups(m) * group_bytes(m); }

size_t mx_qmat_repack_bytes(const mx_qmat *m)
{
    if (m->bits != 4 || !mx_group_size_ok(m->group_size) || !mx_scale_dtype_ok(m->sdtype) ||
        m->rows <= 0 || m->cols <= 0 || m->cols % m->group_size)
        return 0;
    return (size_t)((m->rows + MX_REPACK_ROWS - 1) / MX_REPACK_ROWS) * tile_bytes(m);
}

/* Two bytes of a 4-bit row (4 values, low nibble first) spread to the low
 * nibbles of four bytes: value j in byte j. */
static inline uint32_t spread4(uint32_t two)
{
    uint32_t x = (two | (two << 8)) & 0x00ff00ffu;
    return (x | (x << 4)) & 0x0f0f0f0fu;
}

/* 8 bytes as a little-endian integer (one load on x86 and arm64). */
static inline uint64_t le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* One group of one tile: the k-steps, then scales and biases.  Each output
 * dword is written once, from its two rows (i and 16+i) read 8 bytes (16
 * values, 4 k-steps) at a time: the repack of a whole checkpoint at load
 * is bound by this loop. */
static void repack_group(const mx_qmat *m, int64_t rt, int nr, int64_t g, uint8_t *dst)
{
    const int gs = m->group_size;
    const int64_t ng = mx_qmat_groups(m), rb = mx_qmat_row_bytes(m);
    const size_t ss = mx_dtype_size(m->sdtype);
    uint32_t *steps = (uint32_t *)(void *)dst;          /* [gs/4][16] */
    for (int i = 0; i < 16; i++) {
        const uint8_t *ra = i < nr ? m->w + (rt + i) * rb + g * gs / 2 : NULL;
        const uint8_t *rbp = 16 + i < nr ? m->w + (rt + 16 + i) * rb + g * gs / 2 : NULL;
        for (int s = 0; s < gs / 4; s += 4) {
            const uint64_t a = ra ? le64(ra + 2 * s) : 0, b = rbp ? le64(rbp + 2 * s) : 0;
            for (int j = 0; j < 4; j++)
                steps[(s + j) * 16 + i] = spread4((uint32_t)(a >> (16 * j)) & 0xffffu) |
                                          spread4((uint32_t)(b >> (16 * j)) & 0xffffu) << 4;
        }
    }
    uint8_t *sc = dst + 16 * (size_t)gs, *bi = sc + 32 * ss;
    for (int i = 0; i < nr; i++) {
        memcpy(sc + (size_t)i * ss, (const uint8_t *)m->scales + (size_t)((rt + i) * ng + g) * ss, ss);
        memcpy(bi + (size_t)i * ss, (const uint8_t *)m->biases + (size_t)((rt + i) * ng + g) * ss, ss);
    }
    if (nr < 32) {   /* the missing rows of the last tile: scale and bias 0 */
        memset(sc + (size_t)nr * ss, 0, (size_t)(32 - nr) * ss);
        memset(bi + (size_t)nr * ss, 0, (size_t)(32 - nr) * ss);
    }
}

void mx_qmat_repack(const mx_qmat *m, void *dst)
{
    if (!mx_qmat_repack_bytes(m))
        return;
    const int64_t ng = mx_qmat_groups(m);
    const size_t gb = group_bytes(m);
    uint8_t *d = dst;
    for (int64_t rt = 0; rt < m->rows; rt += MX_REPACK_ROWS) {
        const int nr = (int)(m->rows - rt < MX_REPACK_ROWS ? m->rows - rt : MX_REPACK_ROWS);
        for (int64_t g = 0; g < ng; g++, d += gb)
            repack_group(m, rt, nr, g, d);
    }
}

float mx_qmat_rp_get(const mx_qmat *m, int64_t r, int64_t c)
{
    const int gs = m->group_size;
    const size_t ss = mx_dtype_size(m->sdtype);
    const int64_t g = c / gs;
    const int i = (int)(r % MX_REPACK_ROWS), s = (int)(c % gs) / 4, j = (int)(c % 4);
    const uint8_t *grp = m->rp + (size_t)(r / MX_REPACK_ROWS) * tile_bytes(m) + (size_t)g * group_bytes(m);
    const uint8_t v = grp[(size_t)s * 64 + (size_t)(i & 15) * 4 + (size_t)j];
    const int q = i < 16 ? v & 15 : v >> 4;
    const float sc = mx_q_scalar_at(grp + 16 * (size_t)gs, m->sdtype, i);
    const float bi = mx_q_scalar_at(grp + 16 * (size_t)gs + 32 * ss, m->sdtype, i);
    return sc * (float)q + bi;
}
