/* scratch.h - the one scheme for temporary buffers of the hot paths.
 *
 * An arena is a 64-byte-aligned buffer that grows to the largest size asked
 * of it and is then reused: the forward pass asks for the same sizes layer
 * after layer and token after token, and fresh large allocations would
 * fault their pages in every time.  A user reserves the bytes of one piece
 * of work up front (mx_arena_reserve, which may move the buffer) and then
 * carves it with mx_arena_take; pointers taken stay valid until the next
 * reserve.  An arena belongs to one piece of work at a time (the model owns
 * its arenas, and a model runs one forward call at a time). */
#ifndef MX_SCRATCH_H
#define MX_SCRATCH_H

#include <stddef.h>

/* n rounded up to a multiple of 64 (a cache line; the SIMD kernels' and the
 * prepared vectors' alignment). */
static inline size_t mx_align64(size_t n) { return (n + 63) & ~(size_t)63; }

typedef struct mx_arena {
    unsigned char *buf;
    size_t cap, used;
} mx_arena;

#define MX_ARENA_INIT {NULL, 0, 0}

/* Makes room for `bytes` (as the sum of the mx_align64'ed takes that will
 * follow) and starts carving from the beginning.  Returns 0, or -1 when out
 * of memory (the arena is then empty). */
int mx_arena_reserve(mx_arena *a, size_t bytes);
/* The next mx_align64(bytes) of the reserved space; NULL if the reserve was
 * too small (a bug of the caller's size computation). */
void *mx_arena_take(mx_arena *a, size_t bytes);
void mx_arena_free(mx_arena *a);

#endif
