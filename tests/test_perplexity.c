/* test_perplexity.c - src/eval: the statistics on inputs whose answers are
 * worked out by hand here, the base file round trip and its refusals, and
 * (with the fixtures) the perplexity run against transformers' logits and
 * against a plain token-by-token loop written from the definition. */
#include "test.h"

#include <stdint.h>
#include <unistd.h>

#include "eval/eval.h"
#include "format/safetensors.h"
#include "tokenizer/tokenizer.h"

static int near(double a, double b, double tol)
{
    return fabs(a - b) <= tol;
}

/* ---- one distribution ---- */

static void test_uniform(void)
{
    enum { V = 1000 };
    static float x[V];
    for (int i = 0; i < V; i++)
        x[i] = 3.7f;
    /* softmax of equal logits is 1/V: NLL = ln V whatever the target */
    CHECKF(near(mx_nll(x, V, 17), log((double)V), 1e-12), "%.17g", mx_nll(x, V, 17));
    CHECK(near(mx_logsumexp(x, V), 3.7f + log((double)V), 1e-12));
    mx_mean_acc a = {0};
    for (int i = 0; i < 50; i++)
        mx_mean_add(&a, mx_nll(x, V, i));
    CHECKF(near(mx_ppl(&a), V, 1e-9 * V), "PPL of uniform logits %.17g, want %d", mx_ppl(&a), V);
    CHECK(mx_mean_err(&a) == 0 && mx_ppl_err(&a) == 0);   /* equal values: no spread */
    /* large logits must not overflow: lse shifts by the max */
    for (int i = 0; i < V; i++)
        x[i] = 1e4f;
    CHECK(near(mx_nll(x, V, 0), log((double)V), 1e-9));
}

static void test_two_tokens(void)
{
    /* logits (0, ln 3) -> p = (1/4, 3/4) */
    float x[2] = {0.0f, (float)log(3.0)}, lp[2];
    double lse = mx_log_softmax(x, 2, lp);
    CHECK(near(lse, log(4.0), 1e-7));
    CHECK(near(lp[0], log(0.25), 1e-6) && near(lp[1], log(0.75), 1e-6));
    CHECK(near(mx_nll(x, 2, 0), log(4.0), 1e-7));
    /* in place gives the same */
    float y[2] = {x[0], x[1]};
    mx_log_softmax(y, 2, y);
    CHECK(y[0] == lp[0] && y[1] == lp[1]);

    /* KL(p || q) for p = (1/4, 3/4), q = (1/2, 1/2), by hand:
     * 1/4 ln(1/2) + 3/4 ln(3/2) */
    float z[2] = {0, 0}, lq[2];
    mx_log_softmax(z, 2, lq);
    double want = 0.25 * log(0.5) + 0.75 * log(1.5);
    CHECKF(near(mx_kl_full(lp, lq, 2), want, 1e-6), "KL %.10g want %.10g", mx_kl_full(lp, lq, 2), want);
    /* the other direction: 1/2 ln(2) + 1/2 ln(2/3) */
    CHECK(near(mx_kl_full(lq, lp, 2), 0.5 * log(2.0) + 0.5 * log(2.0 / 3.0), 1e-6));
    CHECK(mx_kl_full(lp, lp, 2) == 0);
}

static void test_topk_select(void)
{
    float x[5] = {1, 3, 3, 2, 3};
    int32_t ids[5];
    mx_top_k(x, 5, 3, ids);
    CHECKF(ids[0] == 1 && ids[1] == 2 && ids[2] == 4, "%d %d %d", ids[0], ids[1], ids[2]);
    mx_top_k(x, 5, 5, ids);
    CHECK(ids[0] == 1 && ids[1] == 2 && ids[2] == 4 && ids[3] == 3 && ids[4] == 0);
    mx_top_k(x, 5, 1, ids);
    CHECK(ids[0] == 1);
    CHECK(mx_argmax(x, 5) == 1);
    /* rest mass of a uniform 4-way distribution outside one id */
    float u[4] = {0, 0, 0, 0}, lu[4];
    mx_log_softmax(u, 4, lu);
    int32_t one = 2;
    CHECK(near(mx_tail_mass(lu, 4, &one, 1), 0.75, 1e-7));
}

/* A random distribution's logits. */
static void rand_logits(unsigned long long *s, float *x, int n, float scale)
{
    for (int i = 0; i < n; i++)
        x[i] = scale * test_randf(s);
}

static void test_kl_topk(void)
{
    /* p = (1/2, 1/4, 1/4), q = (1/2, 2/5, 1/10), top-1 of p = {0}: the
     * coarsened distributions are (1/2, 1/2) and (1/2, 1/2), so the top-1 KL
     * is 0, while the full KL is 1/4 ln(5/8) + 1/4 ln(5/2) = 1/4 ln(25/16). */
    float p[3] = {(float)log(0.5), (float)log(0.25), (float)log(0.25)};
    float q[3] = {(float)log(0.5), (float)log(0.4), (float)log(0.1)};
    int32_t id0 = 0;
    double tail = mx_tail_mass(p, 3, &id0, 1);
    CHECK(near(tail, 0.5, 1e-7));
    CHECKF(near(mx_kl_topk(&id0, p, 1, tail, q, 3), 0, 1e-7), "%g", mx_kl_topk(&id0, p, 1, tail, q, 3));
    CHECK(near(mx_kl_full(p, q, 3), 0.25 * log(25.0 / 16.0), 1e-6));

    /* random pairs: 0 <= top-k KL <= full KL; k = n-1 leaves one id in the
     * rest, so nothing is lumped and it equals the full KL; equal inputs
     * give 0 exactly */
    enum { V = 200 };
    float a[V], b[V], la[V], lb[V], lt[V];
    int32_t ids[V];
    unsigned long long s = 42;
    int bound_ok = 1, exact_ok = 1, self_ok = 1;
    for (int r = 0; r < 100; r++) {
        rand_logits(&s, a, V, 4);
        for (int i = 0; i < V; i++)
            b[i] = a[i] + 0.5f * test_randf(&s);
        mx_log_softmax(a, V, la);
        mx_log_softmax(b, V, lb);
        double full = mx_kl_full(la, lb, V);
        for (int k = 1; k < V; k += 37) {
            mx_top_k(la, V, k, ids);
            for (int j = 0; j < k; j++)
                lt[j] = la[ids[j]];
            double t = mx_kl_topk(ids, lt, k, mx_tail_mass(la, V, ids, k), lb, V);
            bound_ok &= t >= -1e-12 && t <= full + 1e-12;
            self_ok &= mx_kl_topk(ids, lt, k, mx_tail_mass(la, V, ids, k), la, V) == 0;
        }
        mx_top_k(la, V, V - 1, ids);
        for (int j = 0; j < V - 1; j++)
            lt[j] = la[ids[j]];
        double t = mx_kl_topk(ids, lt, V - 1, mx_tail_mass(la, V, ids, V - 1), lb, V);
        exact_ok &= near(t, full, 1e-9 * (1 + full));
        self_ok &= mx_kl_full(la, la, V) == 0;
    }
    CHECKF(bound_ok, "top-k KL outside [0, full KL]");
    CHECKF(exact_ok, "top-(V-1) KL differs from the full KL");
    CHECKF(self_ok, "KL of a distribution with itself is not exactly 0");
}

/* ---- means, quantiles, the summary ---- */

static void test_mean_quantile(void)
{
    mx_mean_acc a = {0};
    for (int i = 1; i <= 4; i++)
        mx_mean_add(&a, i);
    /* mean 2.5, population variance 1.25, s = sqrt(1.25 / 3) */
    CHECK(near(a.mean, 2.5, 1e-15));
    CHECK(near(mx_mean_err(&a), sqrt(1.25 / 3), 1e-15));
    CHECK(near(mx_ppl(&a), exp(2.5), 1e-12) && near(mx_ppl_err(&a), exp(2.5) * sqrt(1.25 / 3), 1e-12));
    mx_mean_acc one = {0};
    mx_mean_add(&one, 7);
    CHECK(mx_mean_err(&one) == 0);

    double v5[5] = {1, 2, 3, 4, 5}, v4[4] = {1, 2, 3, 4};
    CHECK(mx_quantile_sorted(v5, 5, 0.5) == 3);
    CHECK(near(mx_quantile_sorted(v5, 5, 0.99), 4.96, 1e-12));   /* rank 3.96 */
    CHECK(mx_quantile_sorted(v5, 5, 1) == 5 && mx_quantile_sorted(v5, 5, 0) == 1);
    CHECK(mx_quantile_sorted(v4, 4, 0.5) == 2.5);
}

static void test_kl_summary(void)
{
    /* the base gives the target p = 1/2 everywhere; the new run 1/2, 3/5,
     * 2/5, 1/2: delta p = 0, 1/10, -1/10, 0 */
    const double pn[4] = {0.5, 0.6, 0.4, 0.5};
    const double klv[4] = {0.0, 0.02, 0.01, 0.03};
    const int same[4] = {1, 1, 0, 1};
    mx_kl_pos pos[4];
    for (int i = 0; i < 4; i++)
        pos[i] = (mx_kl_pos){.kl = klv[i], .nll_base = log(2.0), .nll_new = -log(pn[i]), .same_top = same[i]};
    mx_kl_summary s;
    mx_err e = {0};
    CHECK_OK(mx_kl_summarize(pos, 4, &s, &e), &e);
    CHECK(near(s.kl_mean, 0.015, 1e-15) && near(s.kl_median, 0.015, 1e-15));
    CHECK(s.kl_max == 0.03 && s.kl_min == 0);
    CHECK(near(s.kl_p99, 0.02 + 0.97 * 0.01, 1e-15));   /* rank 2.97 of 0, .01, .02, .03 */
    CHECK(near(s.same_top, 0.75, 1e-15) && near(s.same_top_err, sqrt(0.75 * 0.25 / 3), 1e-15));
    CHECK(near(s.ppl_base, 2, 1e-12) && s.ppl_base_err == 0);
    double gm = pow(0.5 * 0.6 * 0.4 * 0.5, 0.25);
    CHECK(near(s.ppl_new, 1 / gm, 1e-12));
    CHECK(near(s.dppl, 1 / gm - 2, 1e-12) && near(s.dppl_rel, 1 / gm / 2 - 1, 1e-12));
    CHECK(near(s.dp_mean, 0, 1e-15));
    CHECK(near(s.dp_rms, sqrt(0.02 / 4), 1e-12));
    /* dp^2 = 0, .01, .01, 0: mean .005, population variance 2.5e-5 */
    CHECK(near(s.dp_rms_err, sqrt(2.5e-5 / 3) / (2 * sqrt(0.005)), 1e-12));
    CHECK_FAILS(mx_kl_summarize(pos, 1, &s, &e), &e);
}

static void test_plan(void)
{
    mx_err e = {0};
    int n = 0;
    CHECK_OK(mx_ppl_plan(1000, 100, 0, &n, &e), &e);
    CHECK(n == 10);
    CHECK_OK(mx_ppl_plan(1000, 100, 3, &n, &e), &e);
    CHECK(n == 3);
    CHECK_OK(mx_ppl_plan(200, 100, 0, &n, &e), &e);
    CHECK(n == 2);
    CHECK_FAILS(mx_ppl_plan(199, 100, 0, &n, &e), &e);
    CHECK(strstr(e.msg, "199 tokens") && strstr(e.msg, "2 x ctx = 200"));
    CHECK_FAILS(mx_ppl_plan(1000, 3, 0, &n, &e), &e);
}

/* ---- the base file ---- */

static void tmp_path(char *buf, size_t cap, const char *what)
{
    const char *d = getenv("TMPDIR");
    snprintf(buf, cap, "%s/mlxcel_test_ppl_%d_%s", d && *d ? d : "/tmp", (int)getpid(), what);
}

/* Writes a base file of random distributions, reads it back and checks
 * every field; the top-k form against a selection done here by sorting. */
static void roundtrip(int form, int k)
{
    enum { V = 37, CTX = 8, CH = 3 };
    const int first = CTX / 2, per = CTX - 1 - first, npos = CH * per;
    mx_klbase_info in = {.form = form, .top_k = k, .vocab = V, .ctx = CTX, .n_chunks = CH, .first = first,
                         .params = 123456789012ull};
    snprintf(in.model_type, sizeof in.model_type, "qwen2_moe");
    int32_t tokens[CH * CTX];
    static float lp[CH * CTX][V];
    double nll[CH * CTX];
    unsigned long long s = 7 + (unsigned)form;
    for (int i = 0; i < CH * CTX; i++)
        tokens[i] = (int32_t)(test_rand_u64(&s) % V);
    char path[512];
    tmp_path(path, sizeof path, form == MX_KLBASE_FULL ? "full.kld" : "topk.kld");
    mx_err e = {0};
    mx_klbase *w = NULL;
    CHECK_OK(mx_klbase_create(path, &in, tokens, &w, &e), &e);
    if (!w)
        return;
    CHECK(mx_klbase_positions(&in) == npos);
    for (int p = 0; p < npos; p++) {
        float x[V];
        rand_logits(&s, x, V, 5);
        if (p == 1)
            x[3] = x[4] = 9;     /* a tie at the top: the lower id is the top token */
        nll[p] = mx_log_softmax(x, V, lp[p]) - x[p % V];
        CHECK_OK(mx_klbase_append(w, lp[p], nll[p], &e), &e);
    }
    CHECK_FAILS(mx_klbase_append(w, lp[0], 0, &e), &e);   /* one too many */
    CHECK_OK(mx_klbase_close(w, &e), &e);

    mx_klbase *r = NULL;
    CHECK_OK(mx_klbase_open(path, &r, &e), &e);
    if (!r)
        return;
    const mx_klbase_info *ri = mx_klbase_get_info(r);
    CHECK(ri->form == form && ri->top_k == k && ri->vocab == V && ri->ctx == CTX && ri->n_chunks == CH &&
          ri->first == first && ri->params == in.params && !strcmp(ri->model_type, "qwen2_moe"));
    CHECK(!memcmp(mx_klbase_tokens(r), tokens, sizeof tokens));
    CHECK_OK(mx_klbase_check(r, V, CTX, CH, tokens, &e), &e);
    int ok = 1;
    for (int p = 0; p < npos; p++) {
        mx_klbase_rec rec;
        CHECK_OK(mx_klbase_read(r, &rec, &e), &e);
        ok &= rec.nll == nll[p];
        ok &= rec.top1 == (p == 1 ? 3 : mx_argmax(lp[p], V));
        if (form == MX_KLBASE_FULL) {
            ok &= !memcmp(rec.lp, lp[p], sizeof lp[p]);
            continue;
        }
        /* the K most probable ids, by repeated maximum over what is left */
        int used[V] = {0};
        double tail = 0;
        for (int j = 0; j < k; j++) {
            int b = -1;
            for (int i = 0; i < V; i++)
                if (!used[i] && (b < 0 || lp[p][i] > lp[p][b]))
                    b = i;
            used[b] = 1;
            ok &= rec.ids[j] == b && rec.lp_top[j] == lp[p][b];
        }
        for (int i = 0; i < V; i++)
            if (!used[i])
                tail += exp((double)lp[p][i]);
        ok &= near(rec.tail, tail, 1e-12);
        /* the same distribution read back: KL exactly 0, same top token */
        mx_kl_pos kp;
        mx_kl_compare_pos(ri, &rec, lp[p], nll[p], &kp);
        ok &= kp.kl == 0 && kp.same_top && kp.nll_base == nll[p];
    }
    CHECKF(ok, "form %d: records differ after the round trip", form);
    mx_klbase_rec rec;
    CHECK_FAILS(mx_klbase_read(r, &rec, &e), &e);   /* past the end */
    mx_klbase_close(r, NULL);
    unlink(path);
}

/* A file another run made is refused with a message naming what differs. */
static void test_refusals(void)
{
    enum { V = 11, CTX = 6, CH = 2 };
    mx_klbase_info in = {.form = MX_KLBASE_TOPK, .top_k = 4, .vocab = V, .ctx = CTX, .n_chunks = CH,
                         .first = CTX / 2};
    int32_t tokens[CH * CTX];
    for (int i = 0; i < CH * CTX; i++)
        tokens[i] = i % V;
    char path[512];
    tmp_path(path, sizeof path, "refuse.kld");
    mx_err e = {0};
    mx_klbase *w = NULL;
    CHECK_OK(mx_klbase_create(path, &in, tokens, &w, &e), &e);
    if (!w)
        return;
    float lp[V];
    float x[V] = {0};
    mx_log_softmax(x, V, lp);
    /* an incomplete file is an error at close, and removed */
    CHECK_FAILS(mx_klbase_close(w, &e), &e);
    CHECK(strstr(e.msg, "only 0 of 4 positions"));
    CHECK(access(path, F_OK) != 0);

    CHECK_OK(mx_klbase_create(path, &in, tokens, &w, &e), &e);
    for (long p = 0; p < mx_klbase_positions(&in); p++)
        CHECK_OK(mx_klbase_append(w, lp, 1.0, &e), &e);
    CHECK_OK(mx_klbase_close(w, &e), &e);

    mx_klbase *r = NULL;
    CHECK_OK(mx_klbase_open(path, &r, &e), &e);
    if (r) {
        CHECK_FAILS(mx_klbase_check(r, V + 1, CTX, CH, tokens, &e), &e);
        CHECK(strstr(e.msg, "vocabulary of 11") != NULL);
        CHECK_FAILS(mx_klbase_check(r, V, CTX + 2, CH, tokens, &e), &e);
        CHECK(strstr(e.msg, "--ctx 6") != NULL);
        CHECK_FAILS(mx_klbase_check(r, V, CTX, CH - 1, tokens, &e), &e);
        CHECK(strstr(e.msg, "2 chunks") != NULL);
        int32_t other[CH * CTX];
        memcpy(other, tokens, sizeof other);
        other[7] = 0;
        CHECK_FAILS(mx_klbase_check(r, V, CTX, CH, other, &e), &e);
        CHECK(strstr(e.msg, "token 7 differs") != NULL);
        mx_klbase_close(r, NULL);
    }

    /* damaged files: truncated, wrong magic, a future version */
    FILE *f = fopen(path, "r+b");
    long size = 0;
    if (f) {
        fseek(f, 0, SEEK_END);
        size = ftell(f);
        fclose(f);
    }
    CHECK(truncate(path, size - 1) == 0);
    CHECK_FAILS(mx_klbase_open(path, &r, &e), &e);
    CHECK(strstr(e.msg, "truncated") != NULL);
    f = fopen(path, "r+b");
    if (f) {
        fputs("NOTKLBAS", f);
        fclose(f);
    }
    CHECK_FAILS(mx_klbase_open(path, &r, &e), &e);
    CHECK(strstr(e.msg, "not a base file") != NULL);
    f = fopen(path, "r+b");
    if (f) {
        unsigned char v2[4] = {2, 0, 0, 0};
        fputs("MXKLBASE", f);
        fwrite(v2, 1, 4, f);
        fclose(f);
    }
    CHECK_FAILS(mx_klbase_open(path, &r, &e), &e);
    CHECK(strstr(e.msg, "version 2") != NULL);
    unlink(path);
    CHECK_FAILS(mx_klbase_open(path, &r, &e), &e);

    /* a header that does not describe a run */
    mx_klbase_info bad = in;
    bad.first = 1;
    CHECK_FAILS(mx_klbase_create(path, &bad, tokens, &w, &e), &e);
    bad = in, bad.top_k = V + 1;
    CHECK_FAILS(mx_klbase_create(path, &bad, tokens, &w, &e), &e);
    bad = in, bad.form = MX_KLBASE_FULL;   /* full with a K */
    CHECK_FAILS(mx_klbase_create(path, &bad, tokens, &w, &e), &e);
}

/* ---- with the fixtures: the run against transformers and a plain loop ---- */

/* Records of a run of tokens[n_chunks * ctx], saved in full form. */
static int run_saved(mx_model *m, const int32_t *tokens, int ctx, int n_chunks, int batch, const char *path,
                     mx_ppl_run *r, mx_err *e)
{
    mx_klbase_info in = {.form = MX_KLBASE_FULL, .vocab = m->vocab, .ctx = ctx, .n_chunks = n_chunks,
                         .first = ctx / 2};
    mx_klbase *w = NULL;
    int rc = mx_klbase_create(path, &in, tokens, &w, e);
    if (rc)
        return rc;
    *r = (mx_ppl_run){.m = m, .tokens = tokens, .ctx = ctx, .n_chunks = n_chunks, .batch = batch, .save = w};
    rc = mx_ppl_begin(r, e);
    for (int i = 0; i < n_chunks && !rc; i++)
        rc = mx_ppl_chunk(r, i, e);
    int rc2 = mx_klbase_close(w, rc ? NULL : e);
    return rc ? rc : rc2;
}

/* The fixture's prompt followed by its greedy continuation, ctx 50: the
 * scored positions 25..48 are exactly those where transformers' logits are
 * stored (in full at 25, the top 32 at every one of them).  The fixtures
 * agree with transformers to about 1e-5 (fixtures README; 2e-5 measured here
 * with every kernel variant): 2e-4 leaves room for that and nothing else. */
static void test_against_transformers(const char *fx)
{
    char dir[1024], refpath[1100], path[512];
    snprintf(dir, sizeof dir, "%s/qwen2_moe_tiny_chat", fx);
    snprintf(refpath, sizeof refpath, "%s/reference.safetensors", dir);
    tmp_path(path, sizeof path, "hf.kld");
    mx_err e = {0};
    mx_model *m = NULL;
    mx_st_set *ref = NULL;
    CHECK_OK(mx_model_load(dir, &m, &e), &e);
    CHECK_OK(mx_st_open_file(refpath, &ref, &e), &e);
    const mx_tensor *tp = ref ? mx_st_find(ref, "prompt_ids") : NULL, *tg = ref ? mx_st_find(ref, "greedy_ids") : NULL,
                    *tl = ref ? mx_st_find(ref, "prefill_last_logits") : NULL,
                    *ti = ref ? mx_st_find(ref, "decode_top32_ids") : NULL,
                    *tv = ref ? mx_st_find(ref, "decode_top32_logits") : NULL;
    CHECK(tp && tg && tl && ti && tv);
    if (!m || !tp || !tg || !tl || !ti || !tv || tp->shape[0] != 26 || tg->shape[0] != 24) {
        CHECKF(0, "fixture qwen2_moe_tiny_chat is not the expected 26-token prompt + 24 greedy ids");
        goto out;
    }
    int32_t tokens[50];
    memcpy(tokens, tp->data, 26 * sizeof(int32_t));
    memcpy(tokens + 26, tg->data, 24 * sizeof(int32_t));
    const int V = m->vocab;
    mx_ppl_run r;
    CHECK_OK(run_saved(m, tokens, 50, 1, 0, path, &r, &e), &e);
    CHECK(r.nll.n == 24);
    mx_ppl_end(&r);
    mx_klbase *b = NULL;
    CHECK_OK(mx_klbase_open(path, &b, &e), &e);
    if (!b)
        goto out;
    const float *hf_last = tl->data, *hf_top = tv->data;
    const int32_t *hf_ids = ti->data;
    double worst_shape = 0;
    int top_ok = 1;
    for (int p = 0; p < 24; p++) {
        mx_klbase_rec rec;
        CHECK_OK(mx_klbase_read(b, &rec, &e), &e);
        if (e.code)
            break;
        if (p == 0) {
            /* position 25 in full: the NLL of greedy[0] and every log-prob */
            float *hf_lp = malloc(sizeof(float) * (size_t)V);
            double nll = mx_log_softmax(hf_last, V, hf_lp) - hf_last[tokens[26]];
            CHECKF(near(rec.nll, nll, 2e-4), "NLL at position 25: %.6f, transformers %.6f", rec.nll, nll);
            double mx = 0;
            for (int i = 0; i < V; i++)
                mx = fmax(mx, fabs((double)rec.lp[i] - hf_lp[i]));
            CHECKF(mx <= 2e-4, "log-probs at position 25 differ from transformers' by %g", mx);
            fprintf(stderr, "position 25: NLL %.6f (transformers %.6f), log-probs within %.2g\n", rec.nll, nll, mx);
            free(hf_lp);
        }
        /* log-prob differences among the top 32 are logit differences */
        const int32_t *ids = hf_ids + p * 32;
        const float *lg = hf_top + p * 32;
        for (int j = 1; j < 32; j++) {
            double ours = (double)rec.lp[ids[j]] - rec.lp[ids[0]], theirs = (double)lg[j] - lg[0];
            worst_shape = fmax(worst_shape, fabs(ours - theirs));
        }
        top_ok &= rec.top1 == ids[0];
    }
    fprintf(stderr, "positions 25..48: top-32 log-prob differences within %.2g of transformers'\n", worst_shape);
    CHECKF(worst_shape <= 2e-4, "top-32 log-prob differences off by %g from transformers' logits", worst_shape);
    CHECKF(top_ok, "the most probable token differs from transformers' at some position");
    mx_klbase_close(b, NULL);
out:
    unlink(path);
    mx_st_close(ref);
    mx_model_free(m);
}

/* The definition written out as a plain loop, one decode step per token,
 * against mx_ppl_chunk with whole-chunk forwards and with batches of 5. */
static void test_against_plain_loop(const char *fx)
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/qwen2_moe_tiny_chat", fx);
    mx_err e = {0};
    mx_model *m = NULL;
    mx_tokenizer *t = NULL;
    CHECK_OK(mx_model_load(dir, &m, &e), &e);
    CHECK_OK(mx_tok_load_dir(dir, &t, &e), &e);
    if (!m || !t)
        goto out;
    const char *text = "Rain fell on the harbour all night, and in the morning the fishing boats stayed "
                       "tied to the quay. The children ran along the wall counting gulls, while their "
                       "grandmother mended nets in the doorway and told them which clouds meant wind.";
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK_OK(mx_tok_encode(t, text, strlen(text), 1, &ids, &n, &e), &e);
    const int ctx = 16;
    int chunks = 0;
    CHECK_OK(mx_ppl_plan((long)n, ctx, 3, &chunks, &e), &e);
    CHECK(chunks == 3);

    /* plain: for each chunk, feed tokens one by one from an empty cache and
     * take -log softmax of the next token where the position is scored */
    mx_mean_acc plain = {0};
    float *logits = malloc(sizeof(float) * (size_t)m->vocab);
    mx_seq *s = NULL;
    CHECK_OK(mx_seq_new(m, ctx, &s, &e), &e);
    for (int c = 0; c < chunks && s && logits; c++) {
        const int32_t *tk = ids + c * ctx;
        mx_seq_reset(s);
        for (int j = 0; j < ctx - 1; j++) {
            CHECK_OK(mx_forward(m, s, &tk[j], 1, logits, NULL, &e), &e);
            if (j >= ctx / 2)
                mx_mean_add(&plain, mx_nll(logits, m->vocab, tk[j + 1]));
        }
    }
    CHECK(plain.n == chunks * (ctx - 1 - ctx / 2));
    const int batches[3] = {0, 5, 1};
    for (int bi = 0; bi < 3; bi++) {
        mx_ppl_run r = {.m = m, .tokens = ids, .ctx = ctx, .n_chunks = chunks, .batch = batches[bi]};
        CHECK_OK(mx_ppl_begin(&r, &e), &e);
        for (int c = 0; c < chunks && !e.code; c++)
            CHECK_OK(mx_ppl_chunk(&r, c, &e), &e);
        CHECK(r.nll.n == plain.n);
        /* whole-chunk prefill vs decode steps: float rounding only */
        CHECKF(near(r.nll.mean, plain.mean, 1e-4 * plain.mean), "batch %d: mean NLL %.8f, plain loop %.8f",
               batches[bi], r.nll.mean, plain.mean);
        if (batches[bi] == 1)   /* the same decode path: bit for bit */
            CHECKF(r.nll.mean == plain.mean && r.nll.m2 == plain.m2, "batch 1: %.17g vs %.17g", r.nll.mean,
                   plain.mean);
        mx_ppl_end(&r);
    }
    mx_seq_free(s);
    free(logits);
    free(ids);
out:
    mx_tok_free(t);
    mx_model_free(m);
}

int main(void)
{
    test_uniform();
    test_two_tokens();
    test_topk_select();
    test_kl_topk();
    test_mean_quantile();
    test_kl_summary();
    test_plan();
    roundtrip(MX_KLBASE_FULL, 0);
    roundtrip(MX_KLBASE_TOPK, 5);
    roundtrip(MX_KLBASE_TOPK, 37);
    test_refusals();
    const char *fx = getenv("MLXCEL_FIXTURES");
    if (fx && *fx && test_fixtures()) {
        test_against_transformers(fx);
        test_against_plain_loop(fx);
    } else {
        fprintf(stderr, "note: MLXCEL_FIXTURES is not set; the checks against transformers' logits are skipped\n");
    }
    return test_summary();
}
