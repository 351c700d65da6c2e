/* parallel.c - thread count and environment flags. */
#include "util/parallel.h"

#include <omp.h>
#include <stdlib.h>
#include <strings.h>
#include <unistd.h>

static int g_threads;

int mx_threads(void)
{
    if (g_threads > 0)
        return g_threads;
    long n = mx_env_long("MLXCEL_THREADS", 0);
    if (n <= 0)
        n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n <= 0)
        n = 1;
    if (n > 256)
        n = 256;
    g_threads = (int)n;
    return g_threads;
}

void mx_set_threads(int n) { g_threads = n > 0 ? n : 0; }

int mx_env_flag(const char *name, int dflt)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return dflt;
    if (!strcasecmp(v, "0") || !strcasecmp(v, "false") || !strcasecmp(v, "off") ||
        !strcasecmp(v, "no"))
        return 0;
    return 1;
}

long mx_env_long(const char *name, long dflt)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return dflt;
    char *end;
    long n = strtol(v, &end, 10);
    return *end ? dflt : n;
}
