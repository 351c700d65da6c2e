/* dispatch.c - which path computes an expert sum, the switches that steer
 * it, and the counts of what ran.
 *
 * The decision is made here and nowhere else: the model's forward pass
 * builds a job for every FFN block and asks mx_moe_choose; the fused
 * kernel only answers whether it can take a set of weights
 * (mx_moe_fused_takes). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

#include "moe/moe.h"
#include "util/parallel.h"

/* ---- switches ------------------------------------------------------------ */

static int g_fused = -1;       /* set by mx_moe_set_fused; -1: the environment */
static int g_fused_env = -1;   /* MLXCEL_FUSED_MOE, read once */
static long g_max_dff_env = -1;   /* MLXCEL_FUSED_MOE_MAX_DFF, read once */

/* Default chosen from measurements (build/bench_moe 4096 2 64 15, table in
 * docs/benchmarks.md): the fused path's gain over gather fades to nothing at
 * d_ff 16384 and turns into a loss by 24576; Mixtral's 14336 still gains. */
#define MX_FUSED_MAX_DFF_DEFAULT 16384

/* The one place the environment is read. */
static void read_env(void)
{
    __atomic_store_n(&g_fused_env, mx_env_flag("MLXCEL_FUSED_MOE", 1), __ATOMIC_RELAXED);
    long v = mx_env_long("MLXCEL_FUSED_MOE_MAX_DFF", MX_FUSED_MAX_DFF_DEFAULT);
    __atomic_store_n(&g_max_dff_env, v > 0 ? v : MX_FUSED_MAX_DFF_DEFAULT, __ATOMIC_RELAXED);
}

int mx_moe_fused_enabled(void)
{
    if (g_fused >= 0)
        return g_fused;
    if (__atomic_load_n(&g_fused_env, __ATOMIC_RELAXED) < 0)
        read_env();
    return __atomic_load_n(&g_fused_env, __ATOMIC_RELAXED);
}

void mx_moe_set_fused(int on) { g_fused = on < 0 ? -1 : !!on; }

int64_t mx_moe_fused_max_dff(void)
{
    if (__atomic_load_n(&g_max_dff_env, __ATOMIC_RELAXED) < 0)
        read_env();
    return __atomic_load_n(&g_max_dff_env, __ATOMIC_RELAXED);
}

void mx_moe_env_reload(void)
{
    __atomic_store_n(&g_fused_env, -1, __ATOMIC_RELAXED);
    __atomic_store_n(&g_max_dff_env, -1, __ATOMIC_RELAXED);
}

/* ---- the decision ---------------------------------------------------------- */

static const char *declines_mlp(const mx_linear *g, const mx_linear *u, const mx_linear *d,
                                int64_t max_dff, char *why, size_t cap)
{
    if (g->rows > max_dff) {
        snprintf(why, cap, "expert width %lld exceeds MLXCEL_FUSED_MOE_MAX_DFF=%lld",
                 (long long)g->rows, (long long)max_dff);
        return why;
    }
    return mx_moe_fused_takes(g, u, d);
}

mx_moe_path mx_moe_choose(const mx_moe_job *j, const char **why)
{
    static _Thread_local char buf[128];
    const char *no = NULL;
    if (j->T != 1)
        no = "more than one token";
    else if (!mx_moe_fused_enabled())
        no = "MLXCEL_FUSED_MOE is off";
    const int64_t max_dff = mx_moe_fused_max_dff();
    for (int i = 0; !no && j->ex && i < j->routes[0].k; i++) {
        const int e = j->routes[0].idx[i];
        no = declines_mlp(&j->ex->gate[e], &j->ex->up[e], &j->ex->down[e], max_dff, buf, sizeof buf);
    }
    for (int m = 0; !no && m < j->n_extra; m++)
        no = declines_mlp(&j->extra[m]->gate, &j->extra[m]->up, &j->extra[m]->down, max_dff, buf,
                          sizeof buf);
    if (why)
        *why = no;
    return no ? MX_MOE_GATHER : MX_MOE_FUSED;
}

/* ---- statistics ------------------------------------------------------------ */

static atomic_long g_count[2];

void mx_moe_count(mx_moe_path path, long n) { atomic_fetch_add(&g_count[path], n); }

void mx_moe_stats_get(mx_moe_stats *s)
{
    s->fused = atomic_load(&g_count[MX_MOE_FUSED]);
    s->gather = atomic_load(&g_count[MX_MOE_GATHER]);
}

void mx_moe_stats_reset(void)
{
    atomic_store(&g_count[MX_MOE_FUSED], 0);
    atomic_store(&g_count[MX_MOE_GATHER], 0);
}

/* ---- standalone runs (own parallel region) ---------------------------------- */

/* Buffers of the standalone runs, reused from call to call (benchmarks call
 * them in loops); one run at a time. */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static mx_arena g_arena = MX_ARENA_INIT;
static mx_moe_gather_state *g_state;

/* One standalone run on the pool: the job, the path's buffers, the team. */
typedef struct standalone {
    const mx_moe_job *j;
    mx_moe_plan plan;              /* fused */
    void *buf;
    unsigned char *xbuf;           /* fused: each thread's prepared x */
    size_t xb;
    mx_team team;
    int rc;                        /* gather: thread 0's code (every thread's) */
    mx_err *e;
} standalone;

static void fused_thread(void *arg, int ith, int nth)
{
    standalone *r = arg;
    mx_team_join(&r->team, nth);
    mx_vec xv;
    mx_vec_init(&xv, r->j->x, r->j->d_model, r->xbuf + r->xb * (size_t)ith);
    mx_moe_fused_team(&r->plan, &xv, r->buf, r->j->out, &r->team, ith);
}

static void gather_thread(void *arg, int ith, int nth)
{
    standalone *r = arg;
    mx_team_join(&r->team, nth);
    int rc = mx_moe_gather_team(r->j, g_state, &g_arena, &r->team, ith, r->e);
    if (ith == 0)
        r->rc = rc;
}

static int run_locked(const mx_moe_job *j, mx_moe_path path, mx_err *e)
{
    const int nth = mx_threads();
    standalone r = {.j = j, .e = e};
    mx_team_init(&r.team);
    if (path == MX_MOE_FUSED) {
        mx_moe_plan_of(&r.plan, j);
        r.xb = mx_align64(mx_vec_bytes(j->d_model));
        if (mx_arena_reserve(&g_arena, mx_moe_fused_bytes(&r.plan, nth) + (size_t)nth * r.xb))
            return mx_fail(e, MX_ENOMEM, "moe fused: out of memory");
        r.buf = mx_arena_take(&g_arena, mx_moe_fused_bytes(&r.plan, nth));
        r.xbuf = mx_arena_take(&g_arena, (size_t)nth * r.xb);
        mx_pool_run(nth, fused_thread, &r);
        return MX_OK;
    }
    if (!g_state && !(g_state = mx_moe_gather_state_new()))
        return mx_fail(e, MX_ENOMEM, "moe gather: out of memory");
    mx_pool_run(nth, gather_thread, &r);
    return r.rc;
}

static int run_path(const mx_moe_job *j, mx_moe_path path, mx_err *e)
{
    pthread_mutex_lock(&g_lock);
    int rc = run_locked(j, path, e);
    pthread_mutex_unlock(&g_lock);
    return rc;
}

int mx_moe_run(const mx_moe_job *j, mx_err *e)
{
    mx_moe_path path = mx_moe_choose(j, NULL);
    int rc = run_path(j, path, e);
    if (!rc && j->ex)
        mx_moe_count(path, 1);
    return rc;
}

int mx_moe_fused(const mx_experts *ex, const mx_route *r, const float *x, float *out, mx_err *e)
{
    mx_moe_job j = {.ex = ex, .routes = r, .x = x, .T = 1, .d_model = ex->d_model, .out = out};
    return run_path(&j, MX_MOE_FUSED, e);
}

int mx_moe_gather(const mx_experts *ex, const mx_route *routes, const float *x, int64_t T,
                  float *out, mx_err *e)
{
    mx_moe_job j = {.ex = ex, .routes = routes, .x = x, .T = T, .d_model = ex->d_model, .out = out};
    return run_path(&j, MX_MOE_GATHER, e);
}
