/* test_recurrent.c - the layers that keep state instead of a KV cache.
 *
 * - The gated delta rule in chunks (prefill) against token by token
 *   (decode) and both against a double-precision reference, on random data
 *   of lengths around the chunk size.
 * - The causal convolution against a direct evaluation, fed whole and in
 *   pieces (the rolling window).
 * - With the qwen3_next and lfm2_moe fixtures: a 1100-token prompt of
 *   random ids gives the same last logits through one chunked prefill as
 *   token by token (1e-4 relative); prefill in uneven pieces the same; a
 *   batched decode step of three sequences at different positions equals
 *   each sequence's own step; rewinding clears the state. */
#include "test.h"

#include <math.h>
#include <stdint.h>

#include "model/model.h"
#include "model/ops.h"

static unsigned long long seed = 7;

static double rel_diff(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return sqrt(num / (den + 1e-30));
}

/* The delta rule in double, token by token. */
static void delta_ref(const mx_delta_run *r, double *S, double *out)
{
    const int dk = r->dk, dv = r->dv;
    for (int64_t t = 0; t < r->n; t++) {
        const double decay = exp((double)r->g[t]);
        for (int a = 0; a < dk * dv; a++)
            S[a] *= decay;
        for (int j = 0; j < dv; j++) {
            double kv = 0;
            for (int a = 0; a < dk; a++)
                kv += S[a * dv + j] * r->k[t * dk + a];
            const double delta = (r->v[t * dv + j] - kv) * r->beta[t];
            for (int a = 0; a < dk; a++)
                S[a * dv + j] += r->k[t * dk + a] * delta;
        }
        for (int j = 0; j < dv; j++) {
            double o = 0;
            for (int a = 0; a < dk; a++)
                o += S[a * dv + j] * r->q[t * dk + a];
            out[t * dv + j] = o;
        }
    }
}

static void delta_forms(int64_t n, int dk, int dv)
{
    float *q = malloc(sizeof(float) * (size_t)(n * dk)), *k = malloc(sizeof(float) * (size_t)(n * dk));
    float *v = malloc(sizeof(float) * (size_t)(n * dv)), *g = malloc(sizeof(float) * (size_t)n);
    float *beta = malloc(sizeof(float) * (size_t)n);
    for (int64_t t = 0; t < n; t++) {
        for (int a = 0; a < dk; a++) {
            q[t * dk + a] = test_randf(&seed);
            k[t * dk + a] = test_randf(&seed);
        }
        mx_l2norm(q + t * dk, dk, 1e-6f);
        mx_l2norm(k + t * dk, dk, 1e-6f);
        for (int a = 0; a < dk; a++)
            q[t * dk + a] /= sqrtf((float)dk);
        for (int j = 0; j < dv; j++)
            v[t * dv + j] = test_randf(&seed);
        g[t] = -0.3f * fabsf(test_randf(&seed)) - 0.01f;   /* log decay < 0 */
        beta[t] = 1.0f / (1.0f + expf(-test_randf(&seed)));
    }
    float *o1 = calloc((size_t)(n * dv), sizeof(float)), *o2 = calloc((size_t)(n * dv), sizeof(float));
    float *S1 = calloc((size_t)(dk * dv), sizeof(float)), *S2 = calloc((size_t)(dk * dv), sizeof(float));
    double *Sr = calloc((size_t)(dk * dv), sizeof(double)), *orf = calloc((size_t)(n * dv), sizeof(double));
    float *scr = malloc(sizeof(float) * mx_delta_chunk_floats(dk, dv));
    /* a state carried in from before, as a second prompt piece has */
    for (int a = 0; a < dk * dv; a++)
        S1[a] = S2[a] = (float)(Sr[a] = 0.1 * test_randf(&seed));
    mx_delta_run r = {.n = n, .dk = dk, .dv = dv, .q = q, .k = k, .v = v, .g = g, .beta = beta,
                      .out = o1, .out_stride = dv};
    mx_delta_recurrent(&r, S1);
    r.out = o2;
    mx_delta_chunked(&r, S2, scr);
    delta_ref(&r, Sr, orf);
    float *of = malloc(sizeof(float) * (size_t)(n * dv)), *Sf = malloc(sizeof(float) * (size_t)(dk * dv));
    for (int64_t i = 0; i < n * dv; i++)
        of[i] = (float)orf[i];
    for (int i = 0; i < dk * dv; i++)
        Sf[i] = (float)Sr[i];
    const double e1 = rel_diff(o1, of, (size_t)(n * dv)), e2 = rel_diff(o2, of, (size_t)(n * dv));
    const double s1 = rel_diff(S1, Sf, (size_t)(dk * dv)), s2 = rel_diff(S2, Sf, (size_t)(dk * dv));
    CHECKF(e1 < 1e-5 && s1 < 1e-5, "delta rule token by token, n=%lld dk=%d dv=%d: out %g state %g",
           (long long)n, dk, dv, e1, s1);
    CHECKF(e2 < 1e-5 && s2 < 1e-5, "delta rule chunked, n=%lld dk=%d dv=%d: out %g state %g",
           (long long)n, dk, dv, e2, s2);
    free(q), free(k), free(v), free(g), free(beta), free(o1), free(o2), free(S1), free(S2);
    free(Sr), free(orf), free(scr), free(of), free(Sf);
}

static void conv_window(void)
{
    const int K = 4;
    const int64_t n = 37;
    float w[4], x[37], whole[37], pieces[37], win1[3] = {0}, win2[3] = {0};
    for (int j = 0; j < K; j++)
        w[j] = test_randf(&seed);
    for (int64_t i = 0; i < n; i++)
        x[i] = test_randf(&seed);
    mx_conv_causal(w, K, 0.25f, win1, x, 1, n, whole, 1);
    int64_t at = 0;
    for (int64_t len = 1; at < n; len = len * 2 + 1) {   /* pieces of 1, 3, 7, 15, ... */
        const int64_t m = at + len > n ? n - at : len;
        mx_conv_causal(w, K, 0.25f, win2, x + at, 1, m, pieces + at, 1);
        at += m;
    }
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double ref = 0.25;
        for (int j = 0; j < K; j++) {
            const int64_t src = i - (K - 1) + j;
            if (src >= 0)
                ref += (double)w[j] * x[src];
        }
        worst = fmax(worst, fabs(whole[i] - ref));
        worst = fmax(worst, fabs(pieces[i] - ref));
    }
    CHECKF(worst < 1e-5, "causal conv against direct evaluation, whole and in pieces: %g", worst);
}

/* Last logits of a prompt through one forward call vs in pieces of
 * `piece` tokens (1: token by token, the recurrent decode path). */
static void prompt_forms(mx_model *m, const int32_t *ids, int n, int piece, float *out, mx_err *e)
{
    mx_seq *s = NULL;
    CHECK_OK(mx_seq_new(m, n + 4, &s, e), e);
    if (!s)
        return;
    for (int at = 0; at < n;) {
        const int len = at + piece > n ? n - at : piece;
        CHECK_OK(mx_forward(m, s, ids + at, len, out, NULL, e), e);
        at += len;
    }
    mx_seq_free(s);
}

static void long_prompt(const char *root, const char *name)
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", root, name);
    mx_err e = {0};
    mx_model *m = NULL;
    CHECK_OK(mx_model_load(dir, &m, &e), &e);
    if (!m)
        return;
    CHECKF(mx_model_state_floats(m) > 0, "%s keeps a recurrent state", name);
    const int n = 1100, V = m->vocab;
    int32_t *ids = malloc(sizeof *ids * (size_t)n);
    for (int i = 0; i < n; i++)
        ids[i] = (int32_t)(test_rand_u64(&seed) % (uint64_t)V);
    float *whole = malloc(sizeof(float) * (size_t)V), *steps = malloc(sizeof(float) * (size_t)V),
          *pieces = malloc(sizeof(float) * (size_t)V);
    prompt_forms(m, ids, n, n, whole, &e);
    prompt_forms(m, ids, n, 1, steps, &e);
    prompt_forms(m, ids, n, 157, pieces, &e);
    const double d1 = rel_diff(whole, steps, (size_t)V), d2 = rel_diff(pieces, steps, (size_t)V);
    CHECKF(d1 < 1e-4, "%s: %d-token prompt, chunked prefill vs token by token: %g relative", name, n, d1);
    CHECKF(d2 < 1e-4, "%s: %d-token prompt in pieces of 157 vs token by token: %g relative", name, n, d2);
    fprintf(stderr, "%s: %d tokens: chunked vs recurrent %.2g, pieces vs recurrent %.2g\n", name, n, d1, d2);

    /* a batched step of three sequences at different positions equals each
     * one's own step; rewinding to 0 clears the state */
    mx_seq *a[3], *b[3];
    const int lens[3] = {5, 17, 70};
    float *batched = malloc(sizeof(float) * (size_t)(3 * V)), *single = malloc(sizeof(float) * (size_t)V);
    int32_t next[3];
    for (int i = 0; i < 3; i++) {
        CHECK_OK(mx_seq_new(m, 128, &a[i], &e), &e);
        CHECK_OK(mx_seq_new(m, 128, &b[i], &e), &e);
        CHECK_OK(mx_forward(m, a[i], ids + 100 * i, lens[i], single, NULL, &e), &e);
        CHECK_OK(mx_forward(m, b[i], ids + 100 * i, lens[i], single, NULL, &e), &e);
        next[i] = ids[900 + i];
    }
    CHECK_OK(mx_forward_batch(m, a, next, 3, batched, &e), &e);
    double worst = 0;
    for (int i = 0; i < 3; i++) {
        CHECK_OK(mx_forward(m, b[i], &next[i], 1, single, NULL, &e), &e);
        worst = fmax(worst, rel_diff(batched + (size_t)i * V, single, (size_t)V));
    }
    CHECKF(worst < 1e-5, "%s: batched step of 3 sequences vs single steps: %g relative", name, worst);
    CHECK(mx_seq_rewind(b[2], b[2]->pos) == b[2]->pos);   /* nothing to undo */
    CHECK(mx_seq_rewind(b[2], 10) == 0 && b[2]->pos == 0);
    CHECK_OK(mx_forward(m, b[2], ids + 200, lens[2], single, NULL, &e), &e);
    CHECK_OK(mx_forward(m, b[2], &next[2], 1, single, NULL, &e), &e);
    const double rw = rel_diff(batched + (size_t)2 * V, single, (size_t)V);
    CHECKF(rw < 1e-5, "%s: after a rewind the state is as new: %g", name, rw);
    for (int i = 0; i < 3; i++)
        mx_seq_free(a[i]), mx_seq_free(b[i]);
    free(ids), free(whole), free(steps), free(pieces), free(batched), free(single);
    mx_model_free(m);
}

int main(void)
{
    static const int64_t lens[] = {1, 2, 63, 64, 65, 130, 200};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++)
        delta_forms(lens[i], 16, 8);
    delta_forms(70, 32, 32);
    conv_window();
    const char *root = test_fixtures();
    if (!root) {   /* the unit tests above still count */
        test_summary();
        return t_fail ? 1 : TEST_SKIP;
    }
    long_prompt(root, "qwen3_next_tiny");
    long_prompt(root, "lfm2_moe_tiny");
    return test_summary();
}
