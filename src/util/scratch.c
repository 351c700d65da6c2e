/* scratch.c - see scratch.h. */
#include "util/scratch.h"

#include <stdlib.h>

int mx_arena_reserve(mx_arena *a, size_t bytes)
{
    a->used = 0;
    if (bytes <= a->cap)
        return 0;
    free(a->buf);
    size_t n = mx_align64(bytes ? bytes : 64);
    a->buf = aligned_alloc(64, n);
    a->cap = a->buf ? n : 0;
    return a->buf ? 0 : -1;
}

void *mx_arena_take(mx_arena *a, size_t bytes)
{
    size_t n = mx_align64(bytes);
    if (!a->buf || n > a->cap - a->used)
        return NULL;
    void *p = a->buf + a->used;
    a->used += n;
    return p;
}

void mx_arena_free(mx_arena *a)
{
    free(a->buf);
    a->buf = NULL;
    a->cap = a->used = 0;
}
