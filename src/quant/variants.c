/* variants.c - the kernel variants compiled in, and the run-time choice of
 * the best one the CPU runs (or the one MLXCEL_KERNEL names). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/qint.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

/* ---- run-time kernel selection ----------------------------------------- */

static const char *const g_names[] = {
    "scalar", "scalar-fast",
#if defined(__x86_64__) || defined(__i386__)
    "avx2", "avx512", "avx512vnni", "avx512vnni-fast",
#endif
#if defined(__aarch64__)
    "neon",
#endif
    NULL,
};

const char *const *mx_qkernels_names(void) { return g_names; }

#if defined(__x86_64__) || defined(__i386__)
static int cpu_f16c(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return 0;
    return (c & bit_F16C) != 0;
}
#endif

const mx_qkernels *mx_qkernels_get(const char *name)
{
    if (!name)
        return NULL;
    if (!strcmp(name, "scalar"))
        return &mx_qk_scalar;
    if (!strcmp(name, "scalar-fast"))
        return &mx_qk_scalar_fast;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    int avx2 = mx_qk_avx2_built && __builtin_cpu_supports("avx2") &&
               __builtin_cpu_supports("fma") && cpu_f16c();
    if (!strcmp(name, "avx2"))
        return avx2 ? &mx_qk_avx2 : NULL;
    int avx512 = avx2 && mx_qk_avx512_built && __builtin_cpu_supports("avx512f") &&
                 __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    if (!strcmp(name, "avx512"))
        return avx512 ? &mx_qk_avx512 : NULL;
    const int vnni = avx512 && mx_qk_avx512vnni_built && __builtin_cpu_supports("avx512vnni");
    if (!strcmp(name, "avx512vnni"))
        return vnni ? &mx_qk_avx512vnni : NULL;
    if (!strcmp(name, "avx512vnni-fast"))
        return vnni ? &mx_qk_avx512vnni_fast : NULL;
#endif
#if defined(__aarch64__)
    if (!strcmp(name, "neon"))
        return &mx_qk_neon;
#endif
    return NULL;
}

static const mx_qkernels *best(void)
{
    const mx_qkernels *k = NULL;
#if defined(__x86_64__) || defined(__i386__)
    if (!(k = mx_qkernels_get("avx512vnni")) && !(k = mx_qkernels_get("avx512")))
        k = mx_qkernels_get("avx2");
#elif defined(__aarch64__)
    k = mx_qkernels_get("neon");
#endif
    return k ? k : &mx_qk_scalar;
}

static const mx_qkernels *g_auto;
static const mx_qkernels *g_forced;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_precision = -1;   /* mx_precision_set's choice; -1: MLXCEL_PRECISION */
static void choose(void);
static int g_precision_env = MX_PRECISION_EXACT;

/* A variant in the fast precision: its fast twin, or itself when it has
 * none (the float variants compute in float whatever the precision). */
static const mx_qkernels *fast_twin(const mx_qkernels *k)
{
    if (k == &mx_qk_scalar)
        return &mx_qk_scalar_fast;
#if defined(__x86_64__) || defined(__i386__)
    if (k == &mx_qk_avx512vnni)
        return &mx_qk_avx512vnni_fast;
#endif
    return k;
}

const char *mx_precision_name(mx_precision p) { return p == MX_PRECISION_FAST ? "fast" : "exact"; }

static int precision_parse(const char *name)
{
    return !strcmp(name, "exact") ? MX_PRECISION_EXACT : !strcmp(name, "fast") ? MX_PRECISION_FAST : -1;
}

mx_precision mx_precision_get(void)
{
    const int p = __atomic_load_n(&g_precision, __ATOMIC_ACQUIRE);
    if (p >= 0)
        return (mx_precision)p;
    pthread_once(&g_once, choose);
    return (mx_precision)g_precision_env;
}

int mx_precision_set(const char *name)
{
    const int p = name ? precision_parse(name) : -1;
    if (p < 0)
        return -1;
    __atomic_store_n(&g_precision, p, __ATOMIC_RELEASE);
    return 0;
}

static void choose(void)
{
    const char *pe = getenv("MLXCEL_PRECISION");
    if (pe && *pe) {
        const int p = precision_parse(pe);
        if (p < 0)
            fprintf(stderr, "mlxcel: MLXCEL_PRECISION=%s is unknown (exact, fast); using exact\n", pe);
        g_precision_env = p < 0 ? MX_PRECISION_EXACT : p;
    }
    const char *env = getenv("MLXCEL_KERNEL");
    const mx_qkernels *k = NULL;
    if (env && *env) {
        k = mx_qkernels_get(env);
        if (!k)
            fprintf(stderr, "mlxcel: MLXCEL_KERNEL=%s is unknown or not supported by this CPU; "
                            "using %s\n", env, best()->name);
    }
    g_auto = k ? k : best();
}

const mx_qkernels *mx_qkernels_active(void)
{
    const mx_qkernels *f = __atomic_load_n(&g_forced, __ATOMIC_ACQUIRE);
    pthread_once(&g_once, choose);
    const mx_qkernels *k = f ? f : g_auto;
    return mx_precision_get() == MX_PRECISION_FAST ? fast_twin(k) : k;
}

int mx_qkernels_force(const char *name)
{
    if (!name) {
        __atomic_store_n(&g_forced, NULL, __ATOMIC_RELEASE);
        return 0;
    }
    const mx_qkernels *k = mx_qkernels_get(name);
    if (!k)
        return -1;
    __atomic_store_n(&g_forced, k, __ATOMIC_RELEASE);
    return 0;
}
