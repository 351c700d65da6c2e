/* sysinfo.h - facts about this process and this build: peak memory, the
 * version, and how the library was compiled (for --version, logs, reports). */
#ifndef MX_SYSINFO_H
#define MX_SYSINFO_H

/* Peak resident set size of the process in bytes, or 0 when unknown. */
long long mx_peak_rss_bytes(void);

#include <stdint.h>

/* Bytes this process can still take without swapping or the OOM killer:
 * /proc/meminfo's MemAvailable, lowered to the room left under the memory
 * limit of the process's cgroup when there is one (v2 memory.max, v1
 * memory.limit_in_bytes; room = limit - (usage - inactive file pages)).
 * MLXCEL_MEM_AVAILABLE=BYTES (K, M, G, T suffixes: powers of 1024) overrides both, for
 * tests and for machines that report wrong numbers.  *source (may be NULL)
 * names where the number came from.  0 when nothing is known. */
uint64_t mx_mem_available(const char **source);

/* The release version, e.g. "0.1.0" (CMakeLists.txt's project VERSION). */
const char *mx_version(void);

/* How the library was built, e.g. "Release, gcc 12.2.0, x86_64, ASan". */
const char *mx_build_info(void);

#endif
