/* test.h - a tiny test harness: CHECK macros, a summary line that CI reads
 * ("N passed, N failed"), and access to the reference fixtures.
 *
 * Fixtures live outside the repo; MLXCEL_FIXTURES points at them.  When it is
 * unset the test skips (exit 77, counted as skipped by ctest) with a message;
 * when it is set but the folder is missing, that is a failure. */
#ifndef MX_TEST_H
#define MX_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int t_pass, t_fail;

#define CHECK(cond) do { if (cond) t_pass++; else { t_fail++; \
    fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); } } while (0)
#define CHECKF(cond, ...) do { if (cond) t_pass++; else { t_fail++; \
    fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
    fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)
#define CHECK_OK(expr, err) do { int rc_ = (expr); if (rc_ == 0) t_pass++; else { t_fail++; \
    fprintf(stderr, "%s:%d: %s failed (%d): %s\n", __FILE__, __LINE__, #expr, rc_, (err)->msg); } } while (0)
#define CHECK_FAILS(expr, err) do { int rc_ = (expr); if (rc_ != 0) { t_pass++; \
    fprintf(stderr, "  expected error: %s\n", (err)->msg); } else { t_fail++; \
    fprintf(stderr, "%s:%d: %s unexpectedly succeeded\n", __FILE__, __LINE__, #expr); } } while (0)

static inline int test_summary(void)
{
    printf("%d passed, %d failed\n", t_pass, t_fail);
    return t_fail ? 1 : 0;
}

/* Path of the fixtures folder, or NULL after printing why the test skips.
 * Exits 1 when MLXCEL_FIXTURES is set but not a directory. */
static inline const char *test_fixtures(void)
{
    const char *d = getenv("MLXCEL_FIXTURES");
    if (!d || !*d) {
        fprintf(stderr, "SKIP: MLXCEL_FIXTURES is not set; the reference fixtures "
                        "(../shared/fixtures) are needed for this test\n");
        return NULL;
    }
    struct stat st;
    if (stat(d, &st) != 0 || !S_ISDIR(st.st_mode)) {
        fprintf(stderr, "FAIL: MLXCEL_FIXTURES=%s is not a directory\n", d);
        exit(1);
    }
    return d;
}
#define TEST_SKIP 77

/* Deterministic PRNG for random test data (xorshift64*). */
static inline unsigned long long test_rand_u64(unsigned long long *s)
{
    *s ^= *s >> 12; *s ^= *s << 25; *s ^= *s >> 27;
    return *s * 2685821657736338717ULL;
}
static inline float test_randf(unsigned long long *s)   /* [-1, 1) */
{
    return (float)((test_rand_u64(s) >> 40) * (1.0 / 8388608.0)) - 1.0f;
}

#endif
