/* fuzz_util.h - what the fuzz targets share: finding the reference fixtures
 * and the repository's own files (the bundled demo model) at start-up, and
 * splitting an input in two at its first NUL byte. */
#ifndef MX_FUZZ_UTIL_H
#define MX_FUZZ_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* MX_SOURCE_DIR is the repository root, set by CMakeLists.txt. */
#ifndef MX_SOURCE_DIR
#define MX_SOURCE_DIR "."
#endif

static inline int fz_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* "$MLXCEL_FIXTURES/rel" (else ../shared/fixtures beside the repository)
 * when it exists, copied into buf; NULL otherwise. */
static inline const char *fz_fixture(const char *rel, char *buf, size_t cap)
{
    const char *d = getenv("MLXCEL_FIXTURES");
    if (d && *d)
        snprintf(buf, cap, "%s/%s", d, rel);
    else
        snprintf(buf, cap, "%s/../shared/fixtures/%s", MX_SOURCE_DIR, rel);
    return fz_exists(buf) ? buf : NULL;
}

/* "MX_SOURCE_DIR/rel" in buf. */
static inline const char *fz_source(const char *rel, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s/%s", MX_SOURCE_DIR, rel);
    return buf;
}

/* The input up to its first NUL as a NUL-terminated string (*a), and what
 * follows the NUL (*b, *nb bytes, also NUL-terminated; empty when there is
 * no NUL).  Both malloc'ed; 0, or -1 when out of memory. */
static inline int fz_split(const uint8_t *data, size_t size, char **a, char **b, size_t *nb)
{
    const uint8_t *z = memchr(data, 0, size);
    size_t na = z ? (size_t)(z - data) : size;
    *nb = z ? size - na - 1 : 0;
    *a = malloc(na + 1);
    *b = malloc(*nb + 1);
    if (!*a || !*b) {
        free(*a);
        free(*b);
        return -1;
    }
    memcpy(*a, data, na);
    (*a)[na] = 0;
    if (*nb)
        memcpy(*b, z + 1, *nb);
    (*b)[*nb] = 0;
    return 0;
}

#endif
