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
    "scalar",
#if defined(__x86_64__) || defined(__i386__)
    "avx2", "avx512", "avx512vnni",
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
    if (!strcmp(name, "avx512vnni"))
        return avx512 && mx_qk_avx512vnni_built && __builtin_cpu_supports("avx512vnni")
                   ? &mx_qk_avx512vnni : NULL;
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

static void choose(void)
{
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
    if (f)
        return f;
    pthread_once(&g_once, choose);
    return g_auto;
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
