/* test_model_fixtures.c - end to end against the reference fixtures.
 *
 * For every fixture checkpoint, with the fused MoE path on and off, and for
 * every kernel variant the CPU runs: prompt logits within 1e-3 of what
 * transformers computed (all positions where stored, else the last plus the
 * top-32 at every position), hidden states after each layer within 1e-4
 * relative, the router's top-k equal, greedy ids equal under the margin
 * rule, and the dispatch counts proving which MoE path ran. */
#include "test.h"
#include "fixture_cmp.h"

#include <stdint.h>

#include "model/model.h"
#include "moe/moe.h"
#include "quant/quant.h"
#include "util/parallel.h"

static const char *const fixtures[] = {
    "qwen2_moe_tiny_chat", "qwen2_moe_gqa_mixed", "qwen3_moe_tiny", "mixtral_tiny", "olmoe_tiny",
    "dots1_tiny", "phimoe_tiny", "qwen3_vl_moe_tiny", "minimax_tiny", "gemma4_tiny",
    "qwen3_next_tiny", "lfm2_moe_tiny",
};

/* Whether the dispatch takes this block's one-token steps fused: every
 * expert quantized and within the width limit (the fixtures qualify). */
static int takes_fused(const mx_moe_block *b)
{
    const mx_experts *ex = &b->experts;
    if (ex->d_ff > mx_moe_fused_max_dff())
        return 0;
    for (int i = 0; i < ex->n; i++)
        if (mx_moe_fused_takes(&ex->gate[i], &ex->up[i], &ex->down[i]))
            return 0;
    return 1;
}

static void run_fixture(const char *root, const char *name, int fused)
{
    char dir[1024], refpath[1100];
    snprintf(dir, sizeof dir, "%s/%s", root, name);
    snprintf(refpath, sizeof refpath, "%s/reference.safetensors", dir);
    mx_err e = {0};
    mx_model *m = NULL;
    mx_st_set *r = NULL;
    CHECK_OK(mx_model_load(dir, &m, &e), &e);
    CHECK_OK(mx_st_open_file(refpath, &r, &e), &e);
    if (!m || !r)
        goto out;
    mx_moe_set_fused(fused);

    const mx_tensor *tp = ref(r, "prompt_ids"), *tg = ref(r, "greedy_ids"),
                    *tmargin = ref(r, "greedy_margin"), *tlast = ref(r, "prefill_last_logits"),
                    *ttop_ids = ref(r, "prefill_top32_ids"), *ttop = ref(r, "prefill_top32_logits"),
                    *thid = ref(r, "hidden_states"), *tdec_ids = ref(r, "decode_top32_ids"),
                    *tdec = ref(r, "decode_top32_logits");
    if (!tp || !tg || !tmargin || !tlast || !ttop_ids || !ttop || !thid || !tdec_ids || !tdec)
        goto out;
    const mx_tensor *tall = mx_st_find(r, "prefill_logits");
    const int T = (int)tp->shape[0], V = m->vocab, N = (int)tg->shape[0], L = m->n_layers,
              D = m->d, E = m->n_experts;
    const int32_t *prompt = tp->data, *greedy = tg->data;
    const float *margin = tmargin->data;

    float *hidden = malloc(sizeof(float) * (size_t)(L + 1) * T * D);
    float *router = calloc((size_t)L * T * E, sizeof(float));
    float *all = malloc(sizeof(float) * (size_t)T * V);
    float *logits = malloc(sizeof(float) * (size_t)V);
    mx_seq *s = NULL;
    CHECK_OK(mx_seq_new(m, T + N + 4, &s, &e), &e);
    mx_forward_trace tr = {.hidden = hidden, .router_logits = router, .all_logits = all};
    mx_moe_stats_reset();
    CHECK_OK(mx_forward(m, s, prompt, T, logits, &tr, &e), &e);

    /* logits */
    double dl = max_abs_diff(logits, tlast->data, (size_t)V);
    CHECKF(dl < 1e-3, "%s fused=%d: last prompt logits differ by %g", name, fused, dl);
    if (tall) {
        double da = max_abs_diff(all, tall->data, (size_t)T * V);
        CHECKF(da < 1e-3, "%s: prompt logits (all positions) differ by %g", name, da);
    }
    const int32_t *top_ids = ttop_ids->data;
    const float *top = ttop->data;
    double dt = 0;
    for (int t = 0; t < T; t++)
        for (int j = 0; j < 32; j++) {
            double d = fabs(all[(size_t)t * V + top_ids[t * 32 + j]] - top[t * 32 + j]);
            if (d > dt)
                dt = d;
        }
    CHECKF(dt < 1e-3, "%s: top-32 prompt logits differ by %g", name, dt);

    /* hidden states, relative to the largest magnitude of each layer */
    const float *href = thid->data;
    for (int l = 0; l <= L; l++) {
        size_t n = (size_t)T * D, off = (size_t)l * n;
        double rel = max_abs_diff(hidden + off, href + off, n) / (max_abs(href + off, n) + 1e-30);
        CHECKF(rel < 1e-4, "%s: hidden state %d differs by %g relative", name, l, rel);
    }

    /* routers: logits close and the same top-k */
    int moe_layers = 0;
    for (int l = 0; l < L; l++) {
        char rn[64];
        snprintf(rn, sizeof rn, "router_logits.%d", l);
        const mx_tensor *trl = mx_st_find(r, rn);
        if (!m->layers[l].is_moe) {
            CHECKF(trl == NULL, "%s: reference has router logits for dense layer %d", name, l);
            continue;
        }
        moe_layers++;
        if (!trl) {
            CHECKF(0, "%s: reference router_logits.%d missing", name, l);
            continue;
        }
        const float *rl = trl->data, *ours = router + (size_t)l * T * E;
        double dr = max_abs_diff(ours, rl, (size_t)T * E);
        CHECKF(dr < 1e-3, "%s: router logits of layer %d differ by %g", name, l, dr);
        int same = 1;
        for (int t = 0; t < T; t++) {
            int a[MX_MAX_TOPK], b[MX_MAX_TOPK];
            topk(ours + (size_t)t * E, E, m->top_k, a);
            topk(rl + (size_t)t * E, E, m->top_k, b);
            for (int j = 0; j < m->top_k; j++) {
                int found = 0;
                for (int q = 0; q < m->top_k; q++)
                    found |= a[j] == b[q];
                same &= found;
            }
        }
        CHECKF(same, "%s: router top-%d differs in layer %d", name, m->top_k, l);
    }
    mx_moe_stats st;
    mx_moe_stats_get(&st);
    CHECKF(st.fused == 0 && st.gather == moe_layers, "%s: prefill dispatch fused=%ld gather=%ld, expected 0/%d",
           name, st.fused, st.gather, moe_layers);

    /* greedy decode through the KV cache */
    mx_moe_stats_reset();
    const int32_t *dec_ids = tdec_ids->data;
    const float *dec = tdec->data;
    int steps = 0;
    for (int i = 0; i < N; i++) {
        if (i > 0) {
            CHECK_OK(mx_forward(m, s, &greedy[i - 1], 1, logits, NULL, &e), &e);
            steps++;
        }
        double dd = 0;
        for (int j = 0; j < 32; j++) {
            double d = fabs(logits[dec_ids[i * 32 + j]] - dec[i * 32 + j]);
            if (d > dd)
                dd = d;
        }
        CHECKF(dd < 1e-3, "%s fused=%d: decode step %d top-32 logits differ by %g", name, fused, i, dd);
        int32_t got = argmax(logits, V);
        if (got != greedy[i]) {
            CHECKF(margin[i] < 1e-3, "%s fused=%d: greedy step %d: got %d, reference %d (margin %g)",
                   name, fused, i, got, greedy[i], margin[i]);
            break;   /* the rest is no longer comparable */
        }
        t_pass++;
    }
    mx_moe_stats_get(&st);
    long want_fused = 0;
    if (fused)
        for (int l = 0; l < L; l++)
            if (m->layers[l].is_moe && takes_fused(&m->layers[l].moe))
                want_fused += steps;
    CHECKF(st.fused == want_fused && st.fused + st.gather == (long)moe_layers * steps,
           "%s fused=%d: decode dispatch fused=%ld gather=%ld over %d steps", name, fused, st.fused,
           st.gather, steps);
    fprintf(stderr, "%s fused=%d kernel=%s: logits diff %.2g, moe-dispatch fused=%ld gather=%ld\n",
            name, fused, mx_qkernels_active()->name, dl, st.fused, st.gather);

    /* Batched decode: two sequences at different positions in one step.
     * A holds the prompt and is fed the greedy ids; B lags one token behind
     * (its first batched token is the prompt's last), so at every step each
     * must reproduce the reference at its own position. */
    mx_seq *A = NULL, *B = NULL;
    CHECK_OK(mx_seq_new(m, T + N + 4, &A, &e), &e);
    CHECK_OK(mx_seq_new(m, T + N + 4, &B, &e), &e);
    float *two = malloc(sizeof(float) * 2 * (size_t)V);
    if (A && B && two && T > 1) {
        CHECK_OK(mx_forward(m, A, prompt, T, NULL, NULL, &e), &e);
        CHECK_OK(mx_forward(m, B, prompt, T - 1, NULL, NULL, &e), &e);
        double worst = 0;
        for (int j = 0; j + 1 < N; j++) {
            if (margin[j] < 1e-3 || margin[j + 1] < 1e-3)
                break;   /* past a near-tie the reference path is not comparable */
            mx_seq *pair[2] = {A, B};
            int32_t tok[2] = {greedy[j], j == 0 ? prompt[T - 1] : greedy[j - 1]};
            CHECK_OK(mx_forward_batch(m, pair, tok, 2, two, &e), &e);
            for (int w = 0; w < 2; w++) {
                int step = w == 0 ? j + 1 : j;
                for (int q = 0; q < 32; q++) {
                    double d = fabs(two[(size_t)w * V + dec_ids[step * 32 + q]] - dec[step * 32 + q]);
                    if (d > worst)
                        worst = d;
                }
            }
        }
        CHECKF(worst < 1e-3, "%s fused=%d: batched decode differs from the reference by %g", name, fused, worst);
    }
    free(two);
    mx_seq_free(A);
    mx_seq_free(B);

    mx_seq_free(s);
    free(hidden), free(router), free(all), free(logits);
out:
    mx_moe_set_fused(-1);
    mx_st_close(r);
    mx_model_free(m);
}

int main(void)
{
    const char *root = test_fixtures();
    if (!root)
        return TEST_SKIP;
    /* Every kernel variant the CPU runs; under the sanitizers (slow) only
     * the scalar reference and the automatic choice. */
    const char *const *names = mx_qkernels_names();
    const int sanitized = getenv("MLXCEL_SANITIZED") != NULL;
    const char *automatic = mx_qkernels_active()->name;
    for (int v = 0; names[v]; v++) {
        if (sanitized && strcmp(names[v], "scalar") && strcmp(names[v], automatic))
            continue;
        const mx_qkernels *kv = mx_qkernels_get(names[v]);
        if (kv && kv->fast)
            continue;   /* the fast precision is held to its own tests (test_quant, test_precision) */
        if (mx_qkernels_force(names[v]) != 0)
            continue;   /* the CPU cannot run this variant */
        for (size_t i = 0; i < sizeof fixtures / sizeof fixtures[0]; i++)
            for (int fused = 1; fused >= 0; fused--)
                run_fixture(root, fixtures[i], fused);
    }
    mx_qkernels_force(NULL);
    /* The single-token decode step splits rows and heads over the threads:
     * one thread, and three (more threads than the 2 kv heads of the GQA
     * fixture; uneven row splits), with the automatic kernel. */
    static const char *const split_fixtures[] = {"qwen2_moe_gqa_mixed", "olmoe_tiny", "qwen3_moe_tiny"};
    for (int nth = 1; nth <= 3; nth += 2) {
        mx_set_threads(nth);
        for (size_t i = 0; i < sizeof split_fixtures / sizeof split_fixtures[0]; i++)
            run_fixture(root, split_fixtures[i], 1);
    }
    mx_set_threads(0);
    return test_summary();
}
