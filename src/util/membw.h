/* membw.h - a memory bandwidth probe: what a plain multi-threaded read of a
 * large array achieves on this machine right now (it varies run to run on
 * shared machines, so benchmarks measure it beside their result). */
#ifndef MX_MEMBW_H
#define MX_MEMBW_H

#include <stddef.h>

/* Reads a `bytes` buffer `reps` times with mx_threads() threads; returns the
 * best pass's GB/s (1e9 bytes/s), or a negative value when allocation fails. */
double mx_membw_probe(size_t bytes, int reps);

#endif
