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

/* One group of one tile: the k-steps, then scales and biases. */
static void repack_group(const mx_qmat *m, int64_t rt, int nr, int64_t g, uint8_t *dst)
{
    const int gs = m->group_size;
    const int64_t ng = mx_qmat_groups(m), rb = mx_qmat_row_bytes(m);
    const size_t ss = mx_dtype_size(m->sdtype);
    uint32_t *steps = (uint32_t *)(void *)dst;          /* [gs/4][16] */
    memset(dst, 0, group_bytes(m));
    for (int i = 0; i < nr; i++) {
        const uint8_t *row = m->w + (rt + i) * rb + g * gs / 2;
        const int lane = i & 15, shift = i < 16 ? 0 : 4;
        for (int s = 0; s < gs / 4; s++)
            steps[s * 16 + lane] |= spread4((uint32_t)row[2 * s] | (uint32_t)row[2 * s + 1] << 8)
                                    << shift;
        memcpy(dst + 16 * (size_t)gs + (size_t)i * ss,
               (const uint8_t *)m->scales + (size_t)((rt + i) * ng + g) * ss, ss);
        memcpy(dst + 16 * (size_t)gs + (32 + (size_t)i) * ss,
               (const uint8_t *)m->biases + (size_t)((rt + i) * ng + g) * ss, ss);
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
