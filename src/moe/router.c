/* router.c - softmax + top-k routing, the fused-path switches and the
 * dispatch statistics. */
#include <math.h>
#include <stdatomic.h>

#include "moe/moe.h"
#include "util/parallel.h"

void mx_moe_route(const float *logits, int n, int k, int norm_topk, mx_route *r)
{
    /* Softmax in float with the max subtracted, like torch's softmax. */
    float mx = logits[0];
    for (int i = 1; i < n; i++)
        if (logits[i] > mx)
            mx = logits[i];
    float p[4096];
    float sum = 0.0f;
    int m = n < 4096 ? n : 4096;
    for (int i = 0; i < m; i++) {
        p[i] = expf(logits[i] - mx);
        sum += p[i];
    }
    if (k > MX_MAX_TOPK)
        k = MX_MAX_TOPK;
    if (k > m)
        k = m;
    /* Top-k by repeated selection: k is small (2..8), E at most a few
     * hundred.  Ties go to the lower index, as torch.topk does on CPU. */
    unsigned char taken[4096] = {0};
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int i = 0; i < m; i++)
            if (!taken[i] && (best < 0 || p[i] > p[best]))
                best = i;
        taken[best] = 1;
        r->idx[j] = best;
        r->w[j] = p[best] / sum;
    }
    r->k = k;
    if (norm_topk) {
        float s = 0.0f;
        for (int j = 0; j < k; j++)
            s += r->w[j];
        for (int j = 0; j < k; j++)
            r->w[j] /= s;
    }
}

static int g_fused = -1;     /* set by mx_moe_set_fused; -1: the environment */
static int g_fused_env = -1; /* MLXCEL_FUSED_MOE, read once (not per layer) */

int mx_moe_fused_enabled(void)
{
    if (g_fused >= 0)
        return g_fused;
    int v = __atomic_load_n(&g_fused_env, __ATOMIC_RELAXED);
    if (v < 0) {
        v = mx_env_flag("MLXCEL_FUSED_MOE", 1);
        __atomic_store_n(&g_fused_env, v, __ATOMIC_RELAXED);
    }
    return v;
}

void mx_moe_set_fused(int on) { g_fused = on < 0 ? -1 : !!on; }

/* Default chosen from measurements (build/bench_moe 4096 2 64 15, table in
 * docs/benchmarks.md): the fused path's gain over gather fades to nothing at
 * d_ff 16384 and turns into a loss by 24576; Mixtral's 14336 still gains. */
#define MX_FUSED_MAX_DFF_DEFAULT 16384

static long g_max_dff_env = -1;   /* MLXCEL_FUSED_MOE_MAX_DFF, read once */

void mx_moe_env_reload(void)
{
    __atomic_store_n(&g_fused_env, -1, __ATOMIC_RELAXED);
    __atomic_store_n(&g_max_dff_env, -1, __ATOMIC_RELAXED);
}

int64_t mx_moe_fused_max_dff(void)
{
    long v = __atomic_load_n(&g_max_dff_env, __ATOMIC_RELAXED);
    if (v < 0) {
        v = mx_env_long("MLXCEL_FUSED_MOE_MAX_DFF", MX_FUSED_MAX_DFF_DEFAULT);
        if (v <= 0)
            v = MX_FUSED_MAX_DFF_DEFAULT;
        __atomic_store_n(&g_max_dff_env, v, __ATOMIC_RELAXED);
    }
    return v;
}

static atomic_long g_fused_count, g_gather_count;

void mx_moe_stats_get(mx_moe_stats *s)
{
    s->fused = atomic_load(&g_fused_count);
    s->gather = atomic_load(&g_gather_count);
}

void mx_moe_count_fused(long n) { atomic_fetch_add(&g_fused_count, n); }

void mx_moe_stats_reset(void)
{
    atomic_store(&g_fused_count, 0);
    atomic_store(&g_gather_count, 0);
}

int mx_moe_experts(const mx_experts *ex, const mx_route *routes, const float *x, int64_t T,
                   float *out, mx_err *e)
{
    if (T == 1 && mx_moe_fused_enabled() && !mx_moe_fused_declines(ex)) {
        mx_moe_fused(ex, routes, x, out);
        atomic_fetch_add(&g_fused_count, 1);
        return MX_OK;
    }
    atomic_fetch_add(&g_gather_count, 1);
    return mx_moe_gather(ex, routes, x, T, out, e);
}
