/* dtype.c - names and sizes of the element types. */
#include "util/dtype.h"

static const struct {
    const char *name;
    size_t size;
} dtype_info[MX_DTYPE_COUNT] = {
    [MX_F32] = {"F32", 4},  [MX_F16] = {"F16", 2}, [MX_BF16] = {"BF16", 2},
    [MX_U32] = {"U32", 4},  [MX_I32] = {"I32", 4}, [MX_I64] = {"I64", 8},
    [MX_U8] = {"U8", 1},    [MX_I8] = {"I8", 1},   [MX_BOOL] = {"BOOL", 1},
};

const char *mx_dtype_name(mx_dtype t)
{
    return (unsigned)t < MX_DTYPE_COUNT ? dtype_info[t].name : "?";
}

size_t mx_dtype_size(mx_dtype t)
{
    return (unsigned)t < MX_DTYPE_COUNT ? dtype_info[t].size : 0;
}

int mx_dtype_parse(const char *s, mx_dtype *t)
{
    if (!s)
        return -1;
    for (int i = 0; i < MX_DTYPE_COUNT; i++) {
        if (strcmp(s, dtype_info[i].name) == 0) {
            *t = (mx_dtype)i;
            return 0;
        }
    }
    return -1;
}
