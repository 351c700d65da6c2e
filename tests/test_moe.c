/* test_moe.c - the MoE block on random data: routing, fused vs gather for
 * every supported quantization combination and thread count, jobs with a
 * shared expert and a dense MLP against a double-precision reference, the
 * dispatch decision and the MLXCEL_FUSED_MOE switch. */
#include "test.h"

#include <stdint.h>

#include "moe/moe.h"
#include "quant/quant.h"
#include "util/parallel.h"

typedef struct qbuf {
    uint8_t *w;
    uint16_t *s, *b;
} qbuf;

static unsigned long long seed = 42;

/* A random [rows, cols] quantized matrix (f16 scales, some negative). */
static void make_qmat(int64_t rows, int64_t cols, int bits, int gs, mx_linear *l, qbuf *buf)
{
    float *w = malloc(sizeof(float) * (size_t)(rows * cols));
    for (int64_t i = 0; i < rows * cols; i++)
        w[i] = test_randf(&seed) * 0.1f;
    buf->w = malloc((size_t)(rows * cols * bits / 8));
    buf->s = malloc(sizeof(uint16_t) * (size_t)(rows * cols / gs));
    buf->b = malloc(sizeof(uint16_t) * (size_t)(rows * cols / gs));
    mx_err e = {0};
    CHECK_OK(mx_quantize(w, rows, cols, bits, gs, MX_F16, buf->w, buf->s, buf->b, &e), &e);
    memset(l, 0, sizeof *l);
    l->quantized = 1;
    l->rows = rows;
    l->cols = cols;
    l->q = (mx_qmat){.w = buf->w, .scales = buf->s, .biases = buf->b, .rows = rows, .cols = cols,
                     .bits = bits, .group_size = gs, .sdtype = MX_F16};
    free(w);
}

static void free_q(qbuf *b) { free(b->w), free(b->s), free(b->b); }

static double rel_rms(const float *a, const float *b, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return sqrt(num / (den + 1e-30));
}

/* A softmax top-k routing rule. */
static mx_router softmax_rule(int k, int norm)
{
    return (mx_router){.kind = MX_ROUTER_SOFTMAX_TOPK, .k = k, .norm_topk = norm};
}

static void route(const float *logits, int n, int k, int norm, mx_route *r)
{
    mx_router rule = softmax_rule(k, norm);
    mx_moe_route(&rule, logits, n, r);
}

/* Why the dispatch would not run one token of these experts fused (NULL
 * when it would). */
static const char *declines(const mx_experts *ex)
{
    mx_route r = {.k = ex->n};
    for (int i = 0; i < ex->n; i++)
        r.idx[i] = i, r.w[i] = 1.0f;
    float x = 0, out = 0;
    mx_moe_job j = {.ex = ex, .routes = &r, .x = &x, .T = 1, .d_model = ex->d_model, .out = &out};
    const char *why = NULL;
    mx_moe_choose(&j, &why);
    return why;
}

static int run_experts(const mx_experts *ex, const mx_route *r, const float *x, int64_t T,
                       float *out, mx_err *e)
{
    mx_moe_job j = {.ex = ex, .routes = r, .x = x, .T = T, .d_model = ex->d_model, .out = out};
    return mx_moe_run(&j, e);
}

static void test_route(void)
{
    float logits[6] = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f, 0.0f};
    mx_route r;
    route(logits, 6, 3, 0, &r);
    /* ties: lower index first, as torch.topk */
    CHECK(r.k == 3 && r.idx[0] == 1 && r.idx[1] == 3 && r.idx[2] == 4);
    double z = 0;
    for (int i = 0; i < 6; i++)
        z += exp(logits[i]);
    CHECK(fabs(r.w[0] - exp(2.0) / z) < 1e-6 && fabs(r.w[2] - exp(1.0) / z) < 1e-6);
    route(logits, 6, 3, 1, &r);
    CHECK(fabs(r.w[0] + r.w[1] + r.w[2] - 1.0) < 1e-6);
    CHECK(fabs(r.w[0] - exp(2.0) / (2 * exp(2.0) + exp(1.0))) < 1e-6);
}

/* fused vs gather for one combination; returns the relative RMS difference */
static void fused_vs_gather(int gu_bits, int down_bits, int gs, int64_t D, int64_t F, int E, int k,
                            int threads)
{
    mx_experts ex = {.n = E, .d_model = D, .d_ff = F};
    ex.gate = calloc((size_t)E, sizeof(mx_linear));
    ex.up = calloc((size_t)E, sizeof(mx_linear));
    ex.down = calloc((size_t)E, sizeof(mx_linear));
    qbuf *bufs = calloc((size_t)E * 3, sizeof(qbuf));
    for (int i = 0; i < E; i++) {
        make_qmat(F, D, gu_bits, gs, &ex.gate[i], &bufs[3 * i]);
        make_qmat(F, D, gu_bits, gs, &ex.up[i], &bufs[3 * i + 1]);
        make_qmat(D, F, down_bits, gs, &ex.down[i], &bufs[3 * i + 2]);
    }
    float *x = malloc(sizeof(float) * (size_t)D), *a = malloc(sizeof(float) * (size_t)D),
          *b = malloc(sizeof(float) * (size_t)D);
    for (int64_t i = 0; i < D; i++)
        x[i] = test_randf(&seed);
    float logits[64];
    for (int i = 0; i < E; i++)
        logits[i] = test_randf(&seed) * 3;
    mx_route r;
    route(logits, E, k, 1, &r);
    mx_set_threads(threads);
    CHECKF(declines(&ex) == NULL, "fused declines %d/%d-bit g%d", gu_bits, down_bits, gs);
    mx_err e = {0};
    CHECK_OK(mx_moe_fused(&ex, &r, x, a, &e), &e);
    CHECK_OK(mx_moe_gather(&ex, &r, x, 1, b, &e), &e);
    double d = rel_rms(a, b, D);
    CHECKF(d < 1e-5, "fused vs gather: gate/up %d-bit, down %d-bit, g%d, D=%lld F=%lld k=%d threads=%d: rel RMS %g",
           gu_bits, down_bits, gs, (long long)D, (long long)F, k, threads, d);
    mx_set_threads(0);
    for (int i = 0; i < 3 * E; i++)
        free_q(&bufs[i]);
    free(bufs), free(ex.gate), free(ex.up), free(ex.down), free(x), free(a), free(b);
}

/* gather over T tokens equals gather one token at a time */
static void gather_batch(void)
{
    const int E = 6, k = 2, T = 5;
    const int64_t D = 128, F = 64;
    mx_experts ex = {.n = E, .d_model = D, .d_ff = F};
    ex.gate = calloc(E, sizeof(mx_linear));
    ex.up = calloc(E, sizeof(mx_linear));
    ex.down = calloc(E, sizeof(mx_linear));
    qbuf bufs[18];
    for (int i = 0; i < E; i++) {
        make_qmat(F, D, 4, 64, &ex.gate[i], &bufs[3 * i]);
        make_qmat(F, D, 4, 64, &ex.up[i], &bufs[3 * i + 1]);
        make_qmat(D, F, 4, 64, &ex.down[i], &bufs[3 * i + 2]);
    }
    float x[T * 128], all[T * 128], one[128];
    mx_route r[T];
    for (int i = 0; i < T * 128; i++)
        x[i] = test_randf(&seed);
    for (int t = 0; t < T; t++) {
        float lg[6];
        for (int i = 0; i < E; i++)
            lg[i] = test_randf(&seed);
        route(lg, E, k, 0, &r[t]);
    }
    mx_err e = {0};
    CHECK_OK(mx_moe_gather(&ex, r, x, T, all, &e), &e);
    double worst = 0;
    for (int t = 0; t < T; t++) {
        CHECK_OK(mx_moe_gather(&ex, &r[t], x + t * D, 1, one, &e), &e);
        double d = rel_rms(all + t * D, one, D);
        if (d > worst)
            worst = d;
    }
    CHECKF(worst < 1e-5, "gather batch vs single: %g", worst);
    /* dispatch: T > 1 always takes gather */
    mx_moe_stats_reset();
    CHECK_OK(run_experts(&ex, r, x, T, all, &e), &e);
    CHECK_OK(run_experts(&ex, r, x, 1, all, &e), &e);
    mx_moe_stats st;
    mx_moe_stats_get(&st);
    CHECKF(st.gather == 1 && st.fused == 1, "dispatch fused=%ld gather=%ld", st.fused, st.gather);
    /* MLXCEL_FUSED_MOE_MAX_DFF below d_ff makes the fused path decline */
    setenv("MLXCEL_FUSED_MOE_MAX_DFF", "32", 1);
    mx_moe_env_reload();
    CHECK(declines(&ex) != NULL);
    mx_moe_stats_reset();
    CHECK_OK(run_experts(&ex, r, x, 1, all, &e), &e);
    mx_moe_stats_get(&st);
    CHECK(st.gather == 1 && st.fused == 0);
    unsetenv("MLXCEL_FUSED_MOE_MAX_DFF");
    mx_moe_env_reload();
    CHECK(declines(&ex) == NULL);
    /* unquantized experts: declines */
    mx_linear saved = ex.up[3];
    ex.up[3].quantized = 0;
    CHECK(declines(&ex) != NULL);
    ex.up[3] = saved;
    for (int i = 0; i < 18; i++)
        free_q(&bufs[i]);
    free(ex.gate), free(ex.up), free(ex.down);
}

/* W[r][c] of a linear, quantized or float (reference, slow) */
static double lin_at(const mx_linear *l, int64_t r, int64_t c)
{
    if (l->quantized)
        return mx_qmat_get(&l->q, r, c);
    return ((const float *)l->w)[r * l->cols + c];
}

/* The gather path against a double-precision reference on the dequantized
 * (or float) weights: many tokens, so some experts get more than the
 * matvec kernel's 16 (the tile kernel) and others one or none; quantized
 * and unquantized (F32) experts, mixed group sizes (down at 32, gate/up at
 * 64: the batch prepared for another group size), 1 and 2 threads. */
static void gather_reference(int quantized, int threads)
{
    const int E = 5, k = 2, T = 40;
    const int64_t D = 128, F = 96;
    mx_experts ex = {.n = E, .d_model = D, .d_ff = F};
    ex.gate = calloc(E, sizeof(mx_linear));
    ex.up = calloc(E, sizeof(mx_linear));
    ex.down = calloc(E, sizeof(mx_linear));
    qbuf bufs[15];
    float *fw[15] = {0};
    for (int i = 0; i < 3 * E; i++) {
        mx_linear *l = i % 3 == 0 ? &ex.gate[i / 3] : i % 3 == 1 ? &ex.up[i / 3] : &ex.down[i / 3];
        int64_t rows = i % 3 == 2 ? D : F, cols = i % 3 == 2 ? F : D;
        if (quantized) {
            make_qmat(rows, cols, i % 3 == 2 ? 8 : 4, i % 3 == 2 ? 32 : 64, l, &bufs[i]);
        } else {
            fw[i] = malloc(sizeof(float) * (size_t)(rows * cols));
            for (int64_t j = 0; j < rows * cols; j++)
                fw[i][j] = test_randf(&seed) * 0.1f;
            *l = (mx_linear){.quantized = 0, .w = fw[i], .wdtype = MX_F32, .rows = rows, .cols = cols};
        }
    }
    float *x = malloc(sizeof(float) * T * D), *out = malloc(sizeof(float) * T * D);
    mx_route r[T];
    for (int64_t i = 0; i < T * D; i++)
        x[i] = test_randf(&seed);
    for (int t = 0; t < T; t++) {
        float lg[5];
        for (int i = 0; i < E; i++)   /* expert 0 wins often: > 16 tokens */
            lg[i] = test_randf(&seed) + (i == 0 ? 2.0f : i == 4 ? -3.0f : 0.0f);
        route(lg, E, k, 1, &r[t]);
    }
    mx_set_threads(threads);
    mx_err e = {0};
    CHECK_OK(mx_moe_gather(&ex, r, x, T, out, &e), &e);
    mx_set_threads(0);
    double worst = 0;
    for (int t = 0; t < T; t++) {
        double ref[128] = {0}, h[96], den = 0, num = 0;
        for (int j = 0; j < r[t].k; j++) {
            const int ei = r[t].idx[j];
            for (int64_t f = 0; f < F; f++) {
                double g = 0, u = 0;
                for (int64_t c = 0; c < D; c++) {
                    g += lin_at(&ex.gate[ei], f, c) * x[t * D + c];
                    u += lin_at(&ex.up[ei], f, c) * x[t * D + c];
                }
                h[f] = g / (1.0 + exp(-g)) * u;
            }
            for (int64_t d = 0; d < D; d++) {
                double y = 0;
                for (int64_t f = 0; f < F; f++)
                    y += lin_at(&ex.down[ei], d, f) * h[f];
                ref[d] += r[t].w[j] * y;
            }
        }
        for (int64_t d = 0; d < D; d++) {
            num += (out[t * D + d] - ref[d]) * (out[t * D + d] - ref[d]);
            den += ref[d] * ref[d];
        }
        double rel = sqrt(num / (den + 1e-30));
        if (!(rel <= worst))
            worst = rel;
    }
    CHECKF(worst < 1e-5, "gather vs reference (%s experts, %d threads): rel RMS %g",
           quantized ? "quantized" : "F32", threads, worst);
    for (int i = 0; i < 3 * E; i++) {
        if (quantized)
            free_q(&bufs[i]);
        free(fw[i]);
    }
    free(ex.gate), free(ex.up), free(ex.down), free(x), free(out);
}

/* out[D] of one token of a job, in double precision on the dequantized
 * weights: the routed experts and the extras, each weighted. */
static void job_reference(const mx_moe_job *j, int64_t t, double *ref)
{
    const int64_t D = j->d_model;
    const float *x = j->x + t * D;
    for (int64_t d = 0; d < D; d++)
        ref[d] = 0;
    const int nr = j->ex ? j->routes[t].k : 0;
    for (int i = 0; i < nr + j->n_extra; i++) {
        const mx_linear *g, *u, *dn;
        double w;
        if (i < nr) {
            const int e = j->routes[t].idx[i];
            g = &j->ex->gate[e], u = &j->ex->up[e], dn = &j->ex->down[e];
            w = j->routes[t].w[i];
        } else {
            const mx_mlp *m = j->extra[i - nr];
            g = &m->gate, u = &m->up, dn = &m->down;
            w = j->extra_w[i - nr] ? j->extra_w[i - nr][t] : 1.0;
        }
        const int64_t F = g->rows;
        double *h = malloc(sizeof(double) * (size_t)F);
        for (int64_t f = 0; f < F; f++) {
            double a = 0, b = 0;
            for (int64_t c = 0; c < D; c++) {
                a += lin_at(g, f, c) * x[c];
                b += lin_at(u, f, c) * x[c];
            }
            h[f] = a / (1.0 + exp(-a)) * b;
        }
        for (int64_t d = 0; d < D; d++) {
            double y = 0;
            for (int64_t f = 0; f < F; f++)
                y += lin_at(dn, d, f) * h[f];
            ref[d] += w * y;
        }
        free(h);
    }
}

static double job_error(const mx_moe_job *j)
{
    double worst = 0, ref[256];
    for (int64_t t = 0; t < j->T; t++) {
        job_reference(j, t, ref);
        double num = 0, den = 0;
        for (int64_t d = 0; d < j->d_model; d++) {
            const double diff = j->out[t * j->d_model + d] - ref[d];
            num += diff * diff;
            den += ref[d] * ref[d];
        }
        const double rel = sqrt(num / (den + 1e-30));
        if (!(rel <= worst))
            worst = rel;
    }
    return worst;
}

/* The block forms the forward pass builds: routed experts + a gated shared
 * expert of another width, and a dense MLP alone; fused (one token) and
 * gather (one and several tokens) against the double reference, and the
 * dispatch decision and its counts. */
static void jobs_with_extras(int threads)
{
    const int E = 6, k = 2, T = 7;
    const int64_t D = 192, F = 64, S = 160, M = 96;   /* expert, shared, dense widths */
    mx_experts ex = {.n = E, .d_model = D, .d_ff = F};
    ex.gate = calloc(E, sizeof(mx_linear));
    ex.up = calloc(E, sizeof(mx_linear));
    ex.down = calloc(E, sizeof(mx_linear));
    qbuf bufs[3 * 6 + 6];
    for (int i = 0; i < E; i++) {
        make_qmat(F, D, 4, 64, &ex.gate[i], &bufs[3 * i]);
        make_qmat(F, D, 4, 64, &ex.up[i], &bufs[3 * i + 1]);
        make_qmat(D, F, 6, 32, &ex.down[i], &bufs[3 * i + 2]);
    }
    mx_mlp shared, dense;
    make_qmat(S, D, 4, 64, &shared.gate, &bufs[18]);
    make_qmat(S, D, 4, 64, &shared.up, &bufs[19]);
    make_qmat(D, S, 8, 32, &shared.down, &bufs[20]);
    make_qmat(M, D, 8, 64, &dense.gate, &bufs[21]);
    make_qmat(M, D, 8, 64, &dense.up, &bufs[22]);
    make_qmat(D, M, 4, 32, &dense.down, &bufs[23]);
    float x[T * 192], out[T * 192], gate[T];
    mx_route r[T];
    for (int i = 0; i < T * D; i++)
        x[i] = test_randf(&seed);
    for (int t = 0; t < T; t++) {
        float lg[6];
        for (int i = 0; i < E; i++)
            lg[i] = test_randf(&seed) * 2;
        route(lg, E, k, 0, &r[t]);
        gate[t] = 1.0f / (1.0f + expf(-test_randf(&seed)));
    }
    mx_set_threads(threads);
    mx_err e = {0};
    /* routed + shared: one token fused, then all tokens (gather) */
    mx_moe_job j = {.ex = &ex, .routes = r, .n_extra = 1, .extra = {&shared}, .extra_w = {gate},
                    .x = x, .T = 1, .d_model = D, .out = out};
    CHECK(mx_moe_choose(&j, NULL) == MX_MOE_FUSED);
    mx_moe_stats_reset();
    CHECK_OK(mx_moe_run(&j, &e), &e);
    double err = job_error(&j);
    CHECKF(err < 1e-5, "fused, routed + shared expert, %d threads: rel RMS %g", threads, err);
    j.T = T;
    CHECK(mx_moe_choose(&j, NULL) == MX_MOE_GATHER);
    CHECK_OK(mx_moe_run(&j, &e), &e);
    err = job_error(&j);
    CHECKF(err < 1e-5, "gather, routed + shared expert, T=%d, %d threads: rel RMS %g", T, threads, err);
    mx_moe_stats st;
    mx_moe_stats_get(&st);
    CHECKF(st.fused == 1 && st.gather == 1, "dispatch counts fused=%ld gather=%ld", st.fused, st.gather);
    /* a dense layer: the MLP alone, weight 1; not counted as an MoE block */
    mx_moe_job dj = {.n_extra = 1, .extra = {&dense}, .x = x, .T = 1, .d_model = D, .out = out};
    mx_moe_stats_reset();
    CHECK(mx_moe_choose(&dj, NULL) == MX_MOE_FUSED);
    CHECK_OK(mx_moe_run(&dj, &e), &e);
    err = job_error(&dj);
    CHECKF(err < 1e-5, "fused, dense MLP, %d threads: rel RMS %g", threads, err);
    dj.T = T;
    CHECK_OK(mx_moe_run(&dj, &e), &e);
    err = job_error(&dj);
    CHECKF(err < 1e-5, "gather, dense MLP, T=%d, %d threads: rel RMS %g", T, threads, err);
    mx_moe_stats_get(&st);
    CHECK(st.fused == 0 && st.gather == 0);
    /* the decision: off switch and width limit send one token to gather,
     * which still computes the same */
    j.T = 1;
    mx_moe_set_fused(0);
    const char *why = NULL;
    CHECK(mx_moe_choose(&j, &why) == MX_MOE_GATHER && why && strstr(why, "MLXCEL_FUSED_MOE"));
    CHECK_OK(mx_moe_run(&j, &e), &e);
    CHECK(job_error(&j) < 1e-5);
    mx_moe_set_fused(-1);
    setenv("MLXCEL_FUSED_MOE_MAX_DFF", "128", 1);   /* experts fit, the shared expert does not */
    mx_moe_env_reload();
    CHECK(mx_moe_choose(&j, &why) == MX_MOE_GATHER && why && strstr(why, "MAX_DFF"));
    unsetenv("MLXCEL_FUSED_MOE_MAX_DFF");
    mx_moe_env_reload();
    mx_set_threads(0);
    for (int i = 0; i < 24; i++)
        free_q(&bufs[i]);
    free(ex.gate), free(ex.up), free(ex.down);
}

static void fused_flag(void)
{
    static const char *off[] = {"0", "false", "FALSE", "off", "Off", "no", "NO"};
    static const char *on[] = {"1", "true", "yes", "on", "anything"};
    mx_moe_set_fused(-1);
    unsetenv("MLXCEL_FUSED_MOE");
    mx_moe_env_reload();
    CHECK(mx_moe_fused_enabled() == 1);
    for (size_t i = 0; i < sizeof off / sizeof *off; i++) {
        setenv("MLXCEL_FUSED_MOE", off[i], 1);
        mx_moe_env_reload();
        CHECKF(mx_moe_fused_enabled() == 0, "MLXCEL_FUSED_MOE=%s should disable", off[i]);
    }
    for (size_t i = 0; i < sizeof on / sizeof *on; i++) {
        setenv("MLXCEL_FUSED_MOE", on[i], 1);
        mx_moe_env_reload();
        CHECKF(mx_moe_fused_enabled() == 1, "MLXCEL_FUSED_MOE=%s should enable", on[i]);
    }
    unsetenv("MLXCEL_FUSED_MOE");
    mx_moe_env_reload();
}

int main(void)
{
    test_route();
    for (int q = 0; q <= 1; q++)
        for (int th = 1; th <= 2; th++)
            gather_reference(q, th);
    static const int gu[] = {4, 8}, dn[] = {4, 6, 8}, gss[] = {32, 64, 128};
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 3; b++)
            for (int c = 0; c < 3; c++)
                fused_vs_gather(gu[a], dn[b], gss[c], 256, 384, 8, 4, 2);
    /* odd thread counts and shapes whose rows do not split evenly */
    for (int th = 1; th <= 3; th++)
        fused_vs_gather(4, 4, 64, 384, 192, 6, 3, th);
    fused_vs_gather(4, 6, 32, 128, 96, 16, 8, 2);
    fused_vs_gather(8, 8, 128, 128, 128, 4, 1, 3);
    gather_batch();
    for (int th = 1; th <= 3; th++)
        jobs_with_extras(th);
    fused_flag();
    return test_summary();
}
