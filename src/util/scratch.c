/* scratch.c - see scratch.h. */
#include "util/scratch.h"

#include <stdlib.h>

void *mx_scratch_take(mx_scratch *s, size_t n, size_t *cap)
{
    void *p = NULL;
    pthread_mutex_lock(&s->lock);
    if (s->buf && s->cap >= n) {
        p = s->buf;
        *cap = s->cap;
        s->buf = NULL;
        s->cap = 0;
    }
    pthread_mutex_unlock(&s->lock);
    if (p)
        return p;
    size_t m = (n + 63) & ~(size_t)63;
    p = aligned_alloc(64, m ? m : 64);
    *cap = p ? m : 0;
    return p;
}

void mx_scratch_give(mx_scratch *s, void *p, size_t cap)
{
    if (!p)
        return;
    pthread_mutex_lock(&s->lock);
    if (cap > s->cap) {
        void *old = s->buf;
        s->buf = p;
        s->cap = cap;
        p = old;
    }
    pthread_mutex_unlock(&s->lock);
    free(p);
}
