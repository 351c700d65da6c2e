/* err.c - error codes and messages. */
#include "util/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

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
