/* err.c - error messages and a few tiny OS helpers used everywhere. */
#include "util/err.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int mx_fail(mx_err *e, int code, const char *fmt, ...)
{
    if (e) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->msg, sizeof e->msg, fmt, ap);
        va_end(ap);
        e->code = code;
    }
    return code;
}

int mx_err_prefix(mx_err *e, const char *fmt, ...)
{
    if (!e)
        return 0;
    char pre[256], old[sizeof e->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pre, sizeof pre, fmt, ap);
    va_end(ap);
    memcpy(old, e->msg, sizeof old);
    /* Truncation of an over-long message is acceptable. */
    size_t n = strlen(pre);
    if (n > sizeof e->msg - 3)
        n = sizeof e->msg - 3;
    memcpy(e->msg, pre, n);
    memcpy(e->msg + n, ": ", 2);
    size_t room = sizeof e->msg - n - 3, m = strlen(old);
    if (m > room)
        m = room;
    memcpy(e->msg + n + 2, old, m);
    e->msg[n + 2 + m] = 0;
    return e->code;
}

void mx_err_clear(mx_err *e)
{
    if (e) {
        e->code = MX_OK;
        e->msg[0] = 0;
    }
}

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

double mx_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
