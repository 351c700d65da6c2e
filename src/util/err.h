/* err.h - error reporting shared by every module.
 *
 * Functions that can fail on bad input return an int status (MX_OK == 0 on
 * success) and fill a caller-supplied mx_err with a one-line message that
 * names the file, tensor or field at fault.  Nothing in the library calls
 * exit() or asserts on user input; asserts are for programmer bugs only. */
#ifndef MX_ERR_H
#define MX_ERR_H

#include <stddef.h>

enum {
    MX_OK = 0,
    MX_EIO = 1,          /* open/read/mmap/write failed */
    MX_EFORMAT = 2,      /* malformed file: safetensors header, JSON, ... */
    MX_ECONFIG = 3,      /* config.json field missing/wrong */
    MX_EUNSUPPORTED = 4, /* valid but not supported (bits, model_type, ...) */
    MX_ENOMEM = 5,
    MX_EINVAL = 6,       /* bad argument (CLI, API) */
    MX_ERANGE = 7,       /* value out of range (token id, context, ...) */
};

typedef struct mx_err {
    int code;
    char msg[512];
} mx_err;

/* Sets e (which may be NULL) and returns code, so callers can write
 * `return mx_fail(e, MX_EFORMAT, "%s: ...", path);`. */
int mx_fail(mx_err *e, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prefixes an existing message: "ctx: old message". Returns e->code. */
int mx_err_prefix(mx_err *e, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

void mx_err_clear(mx_err *e);

#endif
