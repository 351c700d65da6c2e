/* scratch.h - one reusable scratch buffer per call site.
 *
 * Hot paths that need a large temporary buffer (the MoE kernels) call
 * mx_scratch_take() and mx_scratch_give() around their work.  The buffer of
 * the previous call is handed out again when it is large enough, so the
 * same sizes layer after layer allocate (and fault in pages) once.  Two
 * threads that call at the same time simply get two buffers; the larger is
 * kept, the other freed.  The kept buffer is reachable from the cache, so
 * it is not a leak. */
#ifndef MX_SCRATCH_H
#define MX_SCRATCH_H

#include <pthread.h>
#include <stddef.h>

typedef struct mx_scratch {
    pthread_mutex_t lock;
    unsigned char *buf;
    size_t cap;
} mx_scratch;

#define MX_SCRATCH_INIT { PTHREAD_MUTEX_INITIALIZER, NULL, 0 }

/* A 64-byte-aligned buffer of at least n bytes (*cap gets its size), or
 * NULL when out of memory. */
void *mx_scratch_take(mx_scratch *s, size_t n, size_t *cap);
/* Returns a buffer from mx_scratch_take (cap as it reported). */
void mx_scratch_give(mx_scratch *s, void *p, size_t cap);

#endif
