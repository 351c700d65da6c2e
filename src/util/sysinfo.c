/* sysinfo.c - peak memory from getrusage; version and build description from
 * what the build system and the compiler define. */
#include "util/sysinfo.h"

#include <sys/resource.h>

#ifndef MX_VERSION
#define MX_VERSION "unknown"
#endif
#ifndef MX_BUILD_TYPE
#define MX_BUILD_TYPE "unknown build type"
#endif

#if defined(__clang__)
#define MX_COMPILER "clang " __clang_version__
#elif defined(__GNUC__)
#define MX_COMPILER "gcc " __VERSION__
#else
#define MX_COMPILER "unknown compiler"
#endif

#if defined(__x86_64__)
#define MX_ARCH "x86_64"
#elif defined(__aarch64__)
#define MX_ARCH "aarch64"
#else
#define MX_ARCH "other architecture"
#endif

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MX_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(MX_ASAN)
#define MX_SANITIZERS ", ASan"
#else
#define MX_SANITIZERS ""
#endif

long long mx_peak_rss_bytes(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return 0;
    return (long long)ru.ru_maxrss * 1024;   /* Linux reports KiB */
}

const char *mx_version(void) { return MX_VERSION; }

const char *mx_build_info(void) { return MX_BUILD_TYPE ", " MX_COMPILER ", " MX_ARCH MX_SANITIZERS; }
