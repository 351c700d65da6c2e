/* api_int.h - what the files of the public API (include/mlxcel.h) share:
 * the handles behind the opaque types, their checks, the thread's error
 * message and the lock around forward passes.
 *
 * The API is a thin layer over src/gen: a model is an mx_engine plus the
 * options it was loaded with; a context is an mx_session (sequence + the ids
 * in its cache) plus its logits and sampler. */
#ifndef MX_API_INT_H
#define MX_API_INT_H

#include <stdint.h>

#include "gen/gen.h"
#include "mlxcel.h"

/* Tags that tell a model handle from a context handle (and from most stray
 * pointers): a wrong or NULL handle is an error, not a crash. */
#define API_MODEL_TAG 0x6d6c786dU    /* "mlxm" */
#define API_CONTEXT_TAG 0x6d6c7863U  /* "mlxc" */

struct mlxcel_model {
    uint32_t tag;
    mx_engine *g;
    int threads;                 /* 0: the process default */
    int fused;                   /* -1: the environment decides */
    int precision;               /* an mx_precision, or -1: the environment's */
    int n_ctx;                   /* default context of new contexts */
};

struct mlxcel_context {
    uint32_t tag;
    mlxcel_model *m;
    mx_session *s;               /* its KV cache and the ids in it */
    float *logits;               /* [vocab] of the last token run */
    int has_logits;
    float *work;                 /* [vocab] the sampler's copy of the logits */
    mx_sample_params sp;
    mx_sampler *smp;
};

/* Records "fn: message" as this thread's last error and returns code. */
int api_fail(int code, const char *fn, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The same for an error an internal module reported. */
int api_fail_err(const char *fn, const mx_err *e);

/* The handle as the type it must be, or NULL with the error recorded. */
mlxcel_model *api_model(const mlxcel_model *m, const char *fn);
mlxcel_context *api_context(const mlxcel_context *c, const char *fn);

/* Brackets every forward pass: one at a time in the process (the model's
 * scratch arenas, the thread count, the fused switch and the precision are
 * shared state), with this model's settings in force. */
void api_forward_begin(const mlxcel_model *m);
void api_forward_end(void);

/* Copies a caller's versioned struct (first member `size`) over defaults
 * already in dst (ours is `ours` bytes): members past the caller's size
 * keep their defaults.  A size below one member or above ours (a newer
 * header than this library) is an error. */
int api_read_versioned(void *dst, size_t ours, const void *src, const char *what, const char *fn);

#endif
