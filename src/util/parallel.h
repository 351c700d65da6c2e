/* parallel.h - how many threads the kernels use.
 * MLXCEL_THREADS overrides; default is the number of online CPUs.  Kernels use
 * OpenMP parallel regions with num_threads(mx_threads()). */
#ifndef MX_PARALLEL_H
#define MX_PARALLEL_H

int mx_threads(void);
void mx_set_threads(int n);   /* n <= 0 restores the default */

/* Splits [0, n) into nth nearly equal parts; part ith is [*lo, *hi). */
static inline void mx_split(long n, int ith, int nth, long *lo, long *hi)
{
    long base = n / nth, rem = n % nth;
    *lo = ith * base + (ith < rem ? ith : rem);
    *hi = *lo + base + (ith < rem ? 1 : 0);
}

/* True unless the environment variable is 0/false/off/no (any case). */
int mx_env_flag(const char *name, int dflt);
long mx_env_long(const char *name, long dflt);

#endif
