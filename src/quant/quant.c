/* quant.c - MLX affine formats: the traits table, quantized-matrix views
 * over checkpoint tensors (validated).  The kernel variants are chosen in
 * variants.c, the reference dequantization is beside the scalar kernels
 * (kernels_scalar.c) and the threaded wrappers are in linear.c. */
#include "quant/quant.h"

#include <inttypes.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/parallel.h"


/* ---- formats ---------------------------------------------------------- */

static const mx_qtraits g_traits[] = {
    { .bits = 2, .values_per_word = 16, .straddles = 0, .mask = 0x3 },
    { .bits = 3, .values_per_word = 0,  .straddles = 1, .mask = 0x7 },
    { .bits = 4, .values_per_word = 8,  .straddles = 0, .mask = 0xf },
    { .bits = 5, .values_per_word = 0,  .straddles = 1, .mask = 0x1f },
    { .bits = 6, .values_per_word = 0,  .straddles = 1, .mask = 0x3f },
    { .bits = 8, .values_per_word = 4,  .straddles = 0, .mask = 0xff },
};

const mx_qtraits *mx_qtraits_for(int bits)
{
    for (size_t i = 0; i < sizeof g_traits / sizeof g_traits[0]; i++)
        if (g_traits[i].bits == bits)
            return &g_traits[i];
    return NULL;
}

int mx_group_size_ok(int group_size)
{
    return group_size == 32 || group_size == 64 || group_size == 128;
}

int mx_scale_dtype_ok(mx_dtype t) { return t == MX_F16 || t == MX_BF16 || t == MX_F32; }

size_t mx_qmat_bytes(const mx_qmat *m)
{
    size_t ss = mx_dtype_size(m->sdtype);
    return (size_t)(m->rows * mx_qmat_row_bytes(m)) +
           2 * (size_t)(m->rows * mx_qmat_groups(m)) * ss;
}

/* ---- building a view from tensors -------------------------------------- */

static void shape_str(const mx_tensor *t, char *buf, size_t n)
{
    size_t k = 0;
    k += (size_t)snprintf(buf + k, n - k, "[");
    for (int i = 0; i < t->ndim && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%" PRId64, i ? ", " : "", t->shape[i]);
    if (k < n)
        snprintf(buf + k, n - k, "]");
}

/* Bytes a tensor must hold for its shape and dtype; -1 on overflow or bad dims. */
static int64_t tensor_need(const mx_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] < 0 || (t->shape[i] && n > INT64_MAX / t->shape[i]))
            return -1;
        n *= t->shape[i];
    }
    int64_t s = (int64_t)mx_dtype_size(t->dtype);
    return n > INT64_MAX / s ? -1 : n * s;
}

int mx_qmat_from_tensors(const mx_tensor *w, const mx_tensor *scales,
                         const mx_tensor *biases, int bits, int group_size,
                         int64_t index, const char *name, mx_qmat *out, mx_err *e)
{
    const char *nm = name ? name : "quantized tensor";
    char sw[96], ss[96], sb[96];
    if (!w || !scales || !biases)
        return mx_fail(e, MX_EFORMAT, "%s: missing %s", nm,
                       !w ? "weight" : !scales ? "scales" : "biases");
    if (w->dtype != MX_U32)
        return mx_fail(e, MX_EFORMAT, "%s.weight: dtype %s, expected U32 (packed quantized weight)",
                       nm, mx_dtype_name(w->dtype));
    if (!mx_scale_dtype_ok(scales->dtype))
        return mx_fail(e, MX_EFORMAT, "%s.scales: dtype %s, expected F16, BF16 or F32", nm,
                       mx_dtype_name(scales->dtype));
    if (biases->dtype != scales->dtype)
        return mx_fail(e, MX_EFORMAT, "%s.biases: dtype %s differs from scales dtype %s", nm,
                       mx_dtype_name(biases->dtype), mx_dtype_name(scales->dtype));
    shape_str(w, sw, sizeof sw);
    shape_str(scales, ss, sizeof ss);
    shape_str(biases, sb, sizeof sb);
    int nd = w->ndim;
    if (nd < 2 || nd > MX_MAX_DIMS || scales->ndim != nd || biases->ndim != nd)
        return mx_fail(e, MX_EFORMAT, "%s: weight %s, scales %s, biases %s: expected the same "
                       "number (>= 2) of dimensions", nm, sw, ss, sb);
    for (int i = 0; i < nd - 1; i++)
        if (scales->shape[i] != w->shape[i] || biases->shape[i] != w->shape[i])
            return mx_fail(e, MX_EFORMAT, "%s: weight %s, scales %s, biases %s: leading "
                           "dimensions differ", nm, sw, ss, sb);
    if (scales->shape[nd - 1] != biases->shape[nd - 1])
        return mx_fail(e, MX_EFORMAT, "%s: scales %s and biases %s differ in shape", nm, ss, sb);
    if (!mx_group_size_ok(group_size))
        return mx_fail(e, MX_EUNSUPPORTED, "%s: group_size %d is not supported (32, 64 or 128)",
                       nm, group_size);
    int64_t wl = w->shape[nd - 1], ng = scales->shape[nd - 1], rows = w->shape[nd - 2];
    if (wl <= 0 || ng <= 0 || rows <= 0 || ng > INT64_MAX / 256 / group_size)
        return mx_fail(e, MX_EFORMAT, "%s: weight %s, scales %s: empty or oversized dimensions",
                       nm, sw, ss);
    int64_t cols = ng * group_size;
    int implied = (32 * wl) % cols == 0 ? (int)((32 * wl) / cols) : 0;
    if (bits > 0) {
        if (!mx_qtraits_for(bits))
            return mx_fail(e, MX_EUNSUPPORTED, "%s: %d-bit quantization is not supported "
                           "(2, 3, 4, 5, 6, 8)", nm, bits);
        if (implied != bits) {
            if (implied)
                return mx_fail(e, MX_EFORMAT, "%s: config says %d bits but shapes imply %d",
                               nm, bits, implied);
            return mx_fail(e, MX_EFORMAT, "%s: config says %d bits but weight %s and scales %s "
                           "do not fit any bit width with group_size %d", nm, bits, sw, ss,
                           group_size);
        }
    } else {
        if (!implied || !mx_qtraits_for(implied))
            return mx_fail(e, implied ? MX_EUNSUPPORTED : MX_EFORMAT,
                           "%s: weight %s and scales %s with group_size %d imply %s bits",
                           nm, sw, ss, group_size, implied ? "unsupported" : "a fractional number of");
        bits = implied;
    }
    int64_t nmat = 1;
    for (int i = 0; i < nd - 2; i++)
        nmat *= w->shape[i];
    if (index < 0 || index >= nmat)
        return mx_fail(e, MX_ERANGE, "%s: matrix index %" PRId64 " outside the stack of %" PRId64,
                       nm, index, nmat);
    int64_t nw = tensor_need(w), nsc = tensor_need(scales), nb = tensor_need(biases);
    if (nw < 0 || nsc < 0 || nb < 0 || (size_t)nw > w->nbytes || (size_t)nsc > scales->nbytes ||
        (size_t)nb > biases->nbytes || !w->data || !scales->data || !biases->data)
        return mx_fail(e, MX_EFORMAT, "%s: tensor data smaller than its shape", nm);
    size_t ssz = mx_dtype_size(scales->dtype);
    memset(out, 0, sizeof *out);
    out->rows = rows;
    out->cols = cols;
    out->bits = bits;
    out->group_size = group_size;
    out->sdtype = scales->dtype;
    out->w = (const uint8_t *)w->data + (size_t)(index * rows * wl * 4);
    out->scales = (const uint8_t *)scales->data + (size_t)(index * rows * ng) * ssz;
    out->biases = (const uint8_t *)biases->data + (size_t)(index * rows * ng) * ssz;
    return MX_OK;
}
