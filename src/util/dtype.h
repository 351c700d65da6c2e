/* dtype.h - element types of tensors and the one place that reads or
 * writes a float element of any of them.
 *
 * Checkpoints store norms, biases, scales and unquantized weights as F32,
 * F16 or BF16; every module that needs such a value as f32 (loading a norm,
 * the embedding row, a scale in the reference kernel, synth's rounding)
 * goes through mx_dtype_get / mx_dtype_put instead of its own switch. */
#ifndef MX_DTYPE_H
#define MX_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "util/half.h"

typedef enum mx_dtype {
    MX_F32, MX_F16, MX_BF16, MX_U32, MX_I32, MX_I64, MX_U8, MX_I8, MX_BOOL,
    MX_DTYPE_COUNT
} mx_dtype;

const char *mx_dtype_name(mx_dtype t);   /* "F32", "BF16", ... */
size_t mx_dtype_size(mx_dtype t);        /* bytes per element */
/* Parses a safetensors dtype string; returns 0 and sets *t, or -1. */
int mx_dtype_parse(const char *s, mx_dtype *t);

static inline int mx_dtype_is_float(mx_dtype t) { return t == MX_F32 || t == MX_F16 || t == MX_BF16; }

/* Element i of a float array of type t (F32, F16 or BF16) as f32.  The
 * array need not be aligned (scales inside a packed file). */
static inline float mx_dtype_get(const void *base, mx_dtype t, int64_t i)
{
    const unsigned char *p = base;
    if (t == MX_F32) {
        float f;
        memcpy(&f, p + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    return t == MX_BF16 ? mx_bf16_to_f32(h) : mx_f16_to_f32(h);
}

/* Stores v as element i of a float array of type t (rounded to nearest). */
static inline void mx_dtype_put(void *base, mx_dtype t, int64_t i, float v)
{
    unsigned char *p = base;
    if (t == MX_F32) {
        memcpy(p + 4 * i, &v, 4);
        return;
    }
    uint16_t h = t == MX_BF16 ? mx_f32_to_bf16(v) : mx_f32_to_f16(v);
    memcpy(p + 2 * i, &h, 2);
}

/* v rounded to what type t can hold (v itself for F32). */
static inline float mx_dtype_round(float v, mx_dtype t)
{
    unsigned char b[4];
    mx_dtype_put(b, t, 0, v);
    return mx_dtype_get(b, t, 0);
}

#endif
