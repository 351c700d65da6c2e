/* sysinfo.c - peak memory from getrusage; available memory from /proc and
 * the cgroup; version and build description from what the build system and
 * the compiler define. */
#include "util/sysinfo.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

/* A number with an optional K/M/G/T suffix (also KB, KiB, ...; powers of
 * 1024); 0 when s is not one. */
static uint64_t parse_bytes(const char *s)
{
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s)
        return 0;
    int shift = 0;
    switch (*end) {
    case 'k': case 'K': shift = 10; end++; break;
    case 'm': case 'M': shift = 20; end++; break;
    case 'g': case 'G': shift = 30; end++; break;
    case 't': case 'T': shift = 40; end++; break;
    default: break;
    }
    if (shift && *end == 'i')   /* KiB, MiB, ... */
        end++;
    if (shift && (*end == 'b' || *end == 'B'))
        end++;
    if (*end || v > (UINT64_MAX >> shift))
        return 0;
    return (uint64_t)v << shift;
}

/* The first number in a file (0 when unreadable, "max" or not a number). */
static uint64_t file_number(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    unsigned long long v = 0;
    if (fscanf(f, "%llu", &v) != 1)
        v = 0;
    fclose(f);
    return v;
}

/* The value of `key` in a "key value" file such as memory.stat. */
static uint64_t stat_value(const char *path, const char *key)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    char k[128];
    unsigned long long v, r = 0;
    while (fscanf(f, "%127s %llu", k, &v) == 2)
        if (!strcmp(k, key)) {
            r = v;
            break;
        }
    fclose(f);
    return r;
}

static uint64_t meminfo_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f)
        return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
            break;
    fclose(f);
    return (uint64_t)kb * 1024;
}

/* Room under the memory limit of the cgroup folder dir (v2 when v2 is set,
 * else v1); UINT64_MAX when it has no limit or cannot be read. */
static uint64_t cgroup_room(const char *dir, int v2)
{
    char p[8192 + 64];
    snprintf(p, sizeof p, "%s/%s", dir, v2 ? "memory.max" : "memory.limit_in_bytes");
    uint64_t limit = file_number(p);
    /* "max" reads as 0; v1 says "no limit" with a number near 2^63 */
    if (!limit || limit >= (1ull << 60))
        return UINT64_MAX;
    snprintf(p, sizeof p, "%s/%s", dir, v2 ? "memory.current" : "memory.usage_in_bytes");
    uint64_t usage = file_number(p);
    /* page cache that would be dropped before the OOM killer runs */
    snprintf(p, sizeof p, "%s/memory.stat", dir);
    uint64_t inactive = stat_value(p, v2 ? "inactive_file" : "total_inactive_file");
    if (inactive < usage)
        usage -= inactive;
    return usage < limit ? limit - usage : 0;
}

/* The tightest room under this process's cgroup and its ancestors.  A
 * container sees its own cgroup at the mount's root, so that is tried
 * too. */
static uint64_t cgroup_available(void)
{
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (!f)
        return UINT64_MAX;
    char line[4096], v1path[4096] = "", v2path[4096] = "";
    int have_v1 = 0, have_v2 = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char *a = strchr(line, ':'), *b = a ? strchr(a + 1, ':') : NULL;
        if (!b)
            continue;
        *b = 0;
        if (!strcmp(line, "0") && a[1] == 0) {
            snprintf(v2path, sizeof v2path, "%s", b + 1);
            have_v2 = 1;
        } else if (strstr(a + 1, "memory")) {
            snprintf(v1path, sizeof v1path, "%s", b + 1);
            have_v1 = 1;
        }
    }
    fclose(f);
    const char *mount = have_v1 ? "/sys/fs/cgroup/memory" : "/sys/fs/cgroup";
    const char *rel = have_v1 ? v1path : v2path;
    if (!have_v1 && !have_v2)
        return UINT64_MAX;
    uint64_t best = UINT64_MAX;
    char dir[8192];
    /* the process's folder and each ancestor up to the mount */
    char path[4096];
    snprintf(path, sizeof path, "%s", rel);
    for (;;) {
        snprintf(dir, sizeof dir, "%s%s", mount, path);
        uint64_t r = cgroup_room(dir, !have_v1);
        if (r < best)
            best = r;
        char *slash = strrchr(path, '/');
        if (!slash || slash == path) {
            if (path[0] && strcmp(path, "/")) {
                path[0] = 0;
                continue;
            }
            break;
        }
        *slash = 0;
    }
    return best;
}

uint64_t mx_mem_available(const char **source)
{
    const char *src = "MemAvailable";
    const char *env = getenv("MLXCEL_MEM_AVAILABLE");
    uint64_t avail;
    if (env && *env && (avail = parse_bytes(env))) {
        src = "MLXCEL_MEM_AVAILABLE";
    } else {
        avail = meminfo_available();
        uint64_t cg = cgroup_available();
        if (cg < avail || (!avail && cg != UINT64_MAX)) {
            avail = cg;
            src = "the cgroup's memory limit";
        }
    }
    if (source)
        *source = src;
    return avail;
}
