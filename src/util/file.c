/* file.c - see file.h. */
#include "util/file.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int mx_read_file(const char *path, char **out, size_t *len, mx_err *e)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return mx_fail(e, MX_EIO, "%s: cannot open: %s", path, strerror(errno));
    if (fseek(f, 0, SEEK_END) != 0) {
        fclose(f);
        return mx_fail(e, MX_EIO, "%s: cannot seek", path);
    }
    long n = ftell(f);
    if (n < 0) {
        fclose(f);
        return mx_fail(e, MX_EIO, "%s: cannot size", path);
    }
    rewind(f);
    char *buf = malloc((size_t)n + 1);
    if (!buf) {
        fclose(f);
        return mx_fail(e, MX_ENOMEM, "%s: out of memory (%ld bytes)", path, n);
    }
    if (n > 0 && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        fclose(f);
        return mx_fail(e, MX_EIO, "%s: short read", path);
    }
    fclose(f);
    buf[n] = 0;
    *out = buf;
    if (len)
        *len = (size_t)n;
    return MX_OK;
}
