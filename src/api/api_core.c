/* api_core.c - the public API's plumbing: version, the per-thread error
 * message, handle checks, the forward-pass lock, versioned structs. */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api_int.h"
#include "moe/moe.h"
#include "quant/quant.h"
#include "util/parallel.h"

/* The public codes are the internal ones (util/err.h). */
#define SAME_CODE(a, b) _Static_assert((int)(a) == (int)(b), #a " must equal " #b)
SAME_CODE(MLXCEL_EIO, MX_EIO);
SAME_CODE(MLXCEL_EFORMAT, MX_EFORMAT);
SAME_CODE(MLXCEL_ECONFIG, MX_ECONFIG);
SAME_CODE(MLXCEL_EUNSUPPORTED, MX_EUNSUPPORTED);
SAME_CODE(MLXCEL_ENOMEM, MX_ENOMEM);
SAME_CODE(MLXCEL_EINVAL, MX_EINVAL);
SAME_CODE(MLXCEL_ERANGE, MX_ERANGE);

const char *mlxcel_version(void) { return MLXCEL_VERSION_STRING; }
int mlxcel_version_number(void) { return MLXCEL_VERSION_NUMBER; }

/* ---- errors ----------------------------------------------------------------- */

/* Per thread, like errno: a library shared by threads cannot have one
 * message, and a model handle cannot hold the message of its own failed
 * load. */
static _Thread_local char g_msg[640];

const char *mlxcel_last_error(void) { return g_msg; }

const char *mlxcel_strerror(int status)
{
    switch (status) {
    case MLXCEL_OK: return "success";
    case MLXCEL_EIO: return "I/O error";
    case MLXCEL_EFORMAT: return "malformed file";
    case MLXCEL_ECONFIG: return "bad model configuration";
    case MLXCEL_EUNSUPPORTED: return "not supported";
    case MLXCEL_ENOMEM: return "out of memory";
    case MLXCEL_EINVAL: return "invalid argument";
    case MLXCEL_ERANGE: return "value out of range";
    default: return "unknown status";
    }
}

void mlxcel_free(void *p) { free(p); }

int api_fail(int code, const char *fn, const char *fmt, ...)
{
    int n = snprintf(g_msg, sizeof g_msg, "%s: ", fn);
    if (n < 0 || (size_t)n >= sizeof g_msg)
        n = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_msg + n, sizeof g_msg - (size_t)n, fmt, ap);
    va_end(ap);
    return code;
}

int api_fail_err(const char *fn, const mx_err *e)
{
    int code = e->code ? e->code : MX_EINVAL;
    return api_fail(code, fn, "%s", e->msg);
}

/* ---- handles ----------------------------------------------------------------- */

mlxcel_model *api_model(const mlxcel_model *m, const char *fn)
{
    if (!m) {
        api_fail(MLXCEL_EINVAL, fn, "the model is NULL");
        return NULL;
    }
    if (m->tag != API_MODEL_TAG) {
        api_fail(MLXCEL_EINVAL, fn, "not a model handle (freed, or another kind of handle)");
        return NULL;
    }
    return (mlxcel_model *)m;
}

mlxcel_context *api_context(const mlxcel_context *c, const char *fn)
{
    if (!c) {
        api_fail(MLXCEL_EINVAL, fn, "the context is NULL");
        return NULL;
    }
    if (c->tag != API_CONTEXT_TAG) {
        api_fail(MLXCEL_EINVAL, fn, "not a context handle (freed, or another kind of handle)");
        return NULL;
    }
    return (mlxcel_context *)c;
}

/* ---- forward passes ------------------------------------------------------------ */

/* One lock for the process, not one per model: besides the model's own
 * scratch, the thread count (util/parallel.h), the fused switch (moe/moe.h)
 * and the precision (quant/quant.h) are process-wide, and each model may
 * want its own. */
static pthread_mutex_t g_forward = PTHREAD_MUTEX_INITIALIZER;

/* The precision MLXCEL_PRECISION chose, read before the API first sets
 * one (mx_precision_set has no "back to the environment"). */
static int g_env_precision = -1;

void api_forward_begin(const mlxcel_model *m)
{
    pthread_mutex_lock(&g_forward);
    mx_set_threads(m->threads);
    mx_moe_set_fused(m->fused);
    if (g_env_precision < 0)
        g_env_precision = (int)mx_precision_get();
    mx_precision_set(mx_precision_name((mx_precision)(m->precision >= 0 ? m->precision
                                                                         : g_env_precision)));
}

void api_forward_end(void) { pthread_mutex_unlock(&g_forward); }

/* ---- versioned structs ---------------------------------------------------------- */

int api_read_versioned(void *dst, size_t ours, const void *src, const char *what, const char *fn)
{
    size_t theirs = *(const size_t *)src;
    if (theirs < sizeof(size_t) + sizeof(int))
        return api_fail(MLXCEL_EINVAL, fn, "%s.size is %zu: call %s_init() first", what, theirs, what);
    if (theirs > ours)
        return api_fail(MLXCEL_EUNSUPPORTED, fn,
                        "%s.size is %zu but this libmlxcel %s knows %zu bytes of it (a newer mlxcel.h "
                        "than the library)", what, theirs, MLXCEL_VERSION_STRING, ours);
    memcpy((char *)dst + sizeof(size_t), (const char *)src + sizeof(size_t), theirs - sizeof(size_t));
    return MLXCEL_OK;
}
