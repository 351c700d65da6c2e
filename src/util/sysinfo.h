/* sysinfo.h - facts about this process and this build: peak memory, the
 * version, and how the library was compiled (for --version, logs, reports). */
#ifndef MX_SYSINFO_H
#define MX_SYSINFO_H

/* Peak resident set size of the process in bytes, or 0 when unknown. */
long long mx_peak_rss_bytes(void);

/* The release version, e.g. "0.1.0" (CMakeLists.txt's project VERSION). */
const char *mx_version(void);

/* How the library was built, e.g. "Release, gcc 12.2.0, x86_64, ASan". */
const char *mx_build_info(void);

#endif
