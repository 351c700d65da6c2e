/* test_cuda.c - the CUDA backend against the reference fixtures and
 * against the CPU.
 *
 * Skips (77) with a message when the build has no CUDA backend or no GPU
 * answers.  With one:
 *   - every fixture whose family the GPU path supports, fused MoE on and
 *     off: prompt logits (all positions) within 1e-3 of transformers, the
 *     top-32 at every position, hidden states after each layer within 1e-4
 *     relative, router logits within 1e-3 and the same top-k, greedy ids
 *     equal under the margin rule, decode top-32 within 1e-3, the dispatch
 *     counts (prefill gather only; decode fused or gather as switched),
 *     a two-sequence batched step, and the CUDA graph step equal to the
 *     step without it; batched steps of 2, 3, 8, 9 and 33 sequences at
 *     different context lengths equal to each sequence's own one-token
 *     step, the experts per token and grouped (batch_check);
 *   - every affine format through the matvec and tile kernels, and 4- and
 *     8-bit matrices of 20001 and 5001 x 2432 through the streaming
 *     matvec, against the CPU;
 *   - a layer the GPU does not take (qwen3_next_tiny with a convolution
 *     of 9 taps made up in memory): attach fails naming the feature;
 *   - models/kjv-moe (trained): GPU logits against the CPU's for prompts of
 *     1, 5 (the matvec path) and 600 tokens (tiles, several attention
 *     splits), then 16 greedy steps; its batched steps (batch_check),
 *     fused MoE on and off;
 *   - MLXCEL_CUDA_MODELS=dir,...: those checkpoints the same way (prompts
 *     of 40 and 300 tokens). */
#include "test.h"
#include "fixture_cmp.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda.h"
#include "gen/gen.h"
#include "model/model.h"
#include "moe/moe.h"
#include "quant/quant.h"

static const char *const supported[] = {
    "qwen2_moe_tiny_chat", "qwen2_moe_gqa_mixed", "qwen3_moe_tiny", "mixtral_tiny", "olmoe_tiny",
    "dots1_tiny", "phimoe_tiny", "qwen3_vl_moe_tiny", "minimax_tiny", "gemma4_tiny", "qwen3_next_tiny",
    "lfm2_moe_tiny",
};

static int takes_fused(const mx_moe_block *b)
{
    const mx_experts *ex = &b->experts;
    if (ex->d_ff > mx_moe_fused_max_dff())
        return 0;
    for (int i = 0; i < ex->n; i++)
        if (mx_moe_fused_takes(&ex->gate[i], &ex->up[i], &ex->down[i]))
            return 0;
    if (b->has_shared && mx_moe_fused_takes(&b->shared.gate, &b->shared.up, &b->shared.down))
        return 0;
    return 1;
}

/* The smallest gap, over the MoE layers of one token's router logits rl
 * ([layers][E]), between the k-th largest logit and the next: under
 * 1e-3 (the file's tolerance on router logits) two correct paths may
 * route the token differently. */
static double route_margin(const mx_model *m, const float *rl)
{
    double mg = INFINITY;
    const int E = m->n_experts, k = m->top_k;
    for (int l = 0; l < m->n_layers; l++) {
        if (!m->layers[l].is_moe || k >= E)
            continue;
        float a[MX_MAX_TOPK + 1] = {0};   /* the k + 1 largest, descending */
        int na = 0;
        for (int x = 0; x < E; x++) {
            const float v = rl[(size_t)l * E + x];
            int j;
            if (na < k + 1)
                j = na++;
            else if (v > a[k])
                j = k;
            else
                continue;
            while (j > 0 && a[j - 1] < v) {
                a[j] = a[j - 1];
                j--;
            }
            a[j] = v;
        }
        mg = fmin(mg, (double)a[k - 1] - a[k]);
    }
    return mg;
}

/* A batched decode step of n sequences (mx_forward_batch: the n tokens
 * through each linear together, k_mvt for up to 8 and the tiles above,
 * the experts grouped as for a prompt, the attention per sequence)
 * against each sequence's own one-token step (mx_forward: the streaming
 * kernels): sequence i has a prompt of its own length (1 .. 23 tokens, so
 * different context lengths and positions in one step), a twin sequence
 * B[i] with the same prompt steps alone; for `steps` steps both get B's
 * greedy id, and each step's logits must agree within 1e-3 (the file's
 * GPU tolerance) with the same argmax wherever B's top two are 1e-3 apart
 * or more, except where B's step routed a token at a near tie (a gap
 * under 1e-3 between the k-th router logit and the next in some layer:
 * route_margin), which may go the other way in the batched step, as two
 * correct paths may; such steps are counted and printed.  B's steps run
 * without the CUDA graph so that they can trace the router logits (the
 * fixtures check the graph step equal to the plain one bit for bit).
 * Returns the largest difference. */
static double batch_check(mx_model *m, const char *name, int n, int steps)
{
    const int V = m->vocab, Lmax = 23;
    mx_err e = {0};
    mx_seq **A = calloc((size_t)n, sizeof *A), **B = calloc((size_t)n, sizeof *B);
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)n), *prompt = malloc(sizeof(int32_t) * Lmax);
    float *la = malloc(sizeof(float) * (size_t)n * V), *lb = malloc(sizeof(float) * (size_t)n * V);
    float *rl = malloc(sizeof(float) * (size_t)m->n_layers * (size_t)(m->n_experts > 0 ? m->n_experts : 1));
    unsigned char *tie = calloc((size_t)n, 1);
    double worst = 0;
    int same = 1, ties = 0;
    unsigned long long seed = 0x5eedull + (unsigned long long)n;
    if (!A || !B || !tok || !prompt || !la || !lb || !rl || !tie) {
        CHECKF(0, "%s batch %d: out of memory", name, n);
        goto out;
    }
    for (int i = 0; i < n; i++) {
        const int L = 1 + (i * 7 + n) % Lmax;
        for (int j = 0; j < L; j++)
            prompt[j] = (int32_t)(test_rand_u64(&seed) % (unsigned long long)V);
        CHECK_OK(mx_seq_new(m, Lmax + steps + 2, &A[i], &e), &e);
        CHECK_OK(mx_seq_new(m, Lmax + steps + 2, &B[i], &e), &e);
        if (!A[i] || !B[i])
            goto out;
        CHECK_OK(mx_forward(m, A[i], prompt, L, NULL, NULL, &e), &e);
        CHECK_OK(mx_forward(m, B[i], prompt, L, lb + (size_t)i * V, NULL, &e), &e);
        tok[i] = argmax(lb + (size_t)i * V, V);
    }
    for (int st = 0; st < steps; st++) {
        for (int i = 0; i < n; i++) {
            mx_forward_trace tr = {.router_logits = rl};
            CHECK_OK(mx_forward(m, B[i], &tok[i], 1, lb + (size_t)i * V, m->n_experts > 0 ? &tr : NULL, &e), &e);
            tie[i] = m->n_experts > 0 && route_margin(m, rl) < 1e-3;
            ties += tie[i];
        }
        CHECK_OK(mx_forward_batch(m, A, tok, n, la, &e), &e);
        for (int i = 0; i < n; i++) {
            const float *a = la + (size_t)i * V, *b = lb + (size_t)i * V;
            if (tie[i]) {   /* compared no further; the same ids fed on */
                tok[i] = argmax(b, V);
                continue;
            }
            const double d = max_abs_diff(a, b, (size_t)V);
            worst = d > worst || d != d ? d : worst;
            const int32_t ib = argmax(b, V);
            float second = -INFINITY;
            for (int v = 0; v < V; v++)
                if (v != ib && b[v] > second)
                    second = b[v];
            if (b[ib] - second >= 1e-3f)
                same &= argmax(a, V) == ib;
            tok[i] = ib;
        }
        for (int i = 0; i < n; i++)
            CHECKF(A[i]->pos == B[i]->pos, "%s batch %d: sequence %d at position %d, its twin at %d", name, n, i,
                   A[i]->pos, B[i]->pos);
    }
    CHECKF(worst < 1e-3, "%s fused=%d: a batched step of %d differs from the one-token steps by %g", name,
           mx_moe_fused_enabled(), n, worst);
    CHECKF(same, "%s fused=%d: a batched step of %d changes a greedy id", name, mx_moe_fused_enabled(), n);
    if (ties)
        fprintf(stderr, "%s fused=%d: batch %d: %d sequence steps routed at a near tie (not compared)\n", name,
                mx_moe_fused_enabled(), n, ties);
out:
    for (int i = 0; i < n; i++) {
        if (A)
            mx_seq_free(A[i]);
        if (B)
            mx_seq_free(B[i]);
    }
    free(A), free(B), free(tok), free(prompt), free(la), free(lb), free(rl), free(tie);
    return worst;
}

/* batch_check for every batch size of the test, the MoE layers token by
 * token (MLXCEL_CUDA_BATCH_MOE=64; the default takes that path up to 16
 * sequences) and grouped by expert (MLXCEL_CUDA_BATCH_MOE=0). */
static void batch_sizes(mx_model *m, const char *name)
{
    static const int ns[] = {2, 3, 8, 9, 33};
    static const char *const how[] = {"per token", "grouped", "all tokens in one launch"};
    for (int mode = 0; mode <= 2; mode++) {
        setenv("MLXCEL_CUDA_BATCH_MOE", mode == 1 ? "0" : "64", 1);
        /* mode 2: the default one-launch path (mxc_moe_stream_tokens);
         * the others a pair of launches per token */
        if (mode < 2)
            setenv("MLXCEL_CUDA_BATCH_FUSE", "0", 1);
        double worst = 0;
        for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
            const double d = batch_check(m, name, ns[i], 4);
            worst = d > worst ? d : worst;
        }
        unsetenv("MLXCEL_CUDA_BATCH_MOE");
        unsetenv("MLXCEL_CUDA_BATCH_FUSE");
        fprintf(stderr, "%s fused=%d: batched steps of 2/3/8/9/33 (MoE %s) vs one-token steps: largest "
                "difference %.2g\n", name, mx_moe_fused_enabled(), how[mode], worst);
    }
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
    CHECK_OK(mx_device_select(m, "cuda", &e), &e);
    if (!m->backend)
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
    const int T = (int)tp->shape[0], V = m->vocab, N = (int)tg->shape[0], L = m->n_layers, D = m->d,
              E = m->n_experts;
    const int32_t *prompt = tp->data, *greedy = tg->data;
    const float *margin = tmargin->data;
    float *hidden = malloc(sizeof(float) * (size_t)(L + 1) * T * D);
    float *router = calloc((size_t)L * T * E, sizeof(float));
    float *all = malloc(sizeof(float) * (size_t)T * V);
    float *logits = malloc(sizeof(float) * (size_t)V);
    float *nograph = malloc(sizeof(float) * (size_t)V);
    mx_seq *s = NULL, *s2 = NULL;
    CHECK_OK(mx_seq_new(m, T + N + 4, &s, &e), &e);
    CHECK_OK(mx_seq_new(m, T + N + 4, &s2, &e), &e);
    mx_forward_trace tr = {.hidden = hidden, .router_logits = router, .all_logits = all};
    mx_moe_stats_reset();
    CHECK_OK(mx_forward(m, s, prompt, T, logits, &tr, &e), &e);
    CHECK_OK(mx_forward(m, s2, prompt, T, NULL, NULL, &e), &e);

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
            dt = d > dt || d != d ? d : dt;
        }
    CHECKF(dt < 1e-3, "%s: top-32 prompt logits differ by %g", name, dt);
    const float *href = thid->data;
    for (int l = 0; l <= L; l++) {
        size_t n = (size_t)T * D, off = (size_t)l * n;
        double rel = max_abs_diff(hidden + off, href + off, n) / (max_abs(href + off, n) + 1e-30);
        CHECKF(rel < 1e-4, "%s: hidden state %d differs by %g relative", name, l, rel);
    }
    int moe_layers = 0;
    for (int l = 0; l < L; l++) {
        char rn[64];
        snprintf(rn, sizeof rn, "router_logits.%d", l);
        const mx_tensor *trl = mx_st_find(r, rn);
        if (!m->layers[l].is_moe || !trl)
            continue;
        moe_layers++;
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
    CHECKF(st.fused == 0 && st.gather == 2L * moe_layers, "%s: prefill dispatch fused=%ld gather=%ld, expected 0/%d",
           name, st.fused, st.gather, 2 * moe_layers);

    /* greedy decode: s through the graph step (where the routes stay on
     * the GPU), s2 without it; the two must agree exactly */
    mx_moe_stats_reset();
    const int32_t *dec_ids = tdec_ids->data;
    const float *dec = tdec->data;
    int steps = 0;
    double graph_diff = 0;
    for (int i = 0; i < N; i++) {
        if (i > 0) {
            CHECK_OK(mx_forward(m, s, &greedy[i - 1], 1, logits, NULL, &e), &e);
            setenv("MLXCEL_CUDA_GRAPH", "0", 1);
            CHECK_OK(mx_forward(m, s2, &greedy[i - 1], 1, nograph, NULL, &e), &e);
            unsetenv("MLXCEL_CUDA_GRAPH");
            double g = max_abs_diff(logits, nograph, (size_t)V);
            graph_diff = g > graph_diff || g != g ? g : graph_diff;
            steps++;
        }
        double dd = 0;
        for (int j = 0; j < 32; j++) {
            double d = fabs(logits[dec_ids[i * 32 + j]] - dec[i * 32 + j]);
            dd = d > dd || d != d ? d : dd;
        }
        CHECKF(dd < 1e-3, "%s fused=%d: decode step %d top-32 logits differ by %g", name, fused, i, dd);
        int32_t got = argmax(logits, V);
        if (got != greedy[i]) {
            CHECKF(margin[i] < 1e-3, "%s fused=%d: greedy step %d: got %d, reference %d (margin %g)", name,
                   fused, i, got, greedy[i], margin[i]);
            break;
        }
        t_pass++;
    }
    CHECKF(graph_diff == 0, "%s fused=%d: the graph step differs from the plain step by %g", name, fused,
           graph_diff);
    mx_moe_stats_get(&st);
    long want_fused = 0;
    if (fused)
        for (int l = 0; l < L; l++)
            if (m->layers[l].is_moe && takes_fused(&m->layers[l].moe))
                want_fused += 2L * steps;
    CHECKF(st.fused == want_fused && st.fused + st.gather == 2L * moe_layers * steps,
           "%s fused=%d: decode dispatch fused=%ld gather=%ld over %d steps", name, fused, st.fused,
           st.gather, steps);
    fprintf(stderr, "%s fused=%d on %s: logits diff %.2g, graph vs plain %.2g, moe-dispatch fused=%ld gather=%ld\n",
            name, fused, mx_device_name(m), dl, graph_diff, st.fused, st.gather);

    /* a batched step: A at the prompt's end fed the greedy ids, B one token
     * behind */
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
                break;
            mx_seq *pair[2] = {A, B};
            int32_t tok[2] = {greedy[j], j == 0 ? prompt[T - 1] : greedy[j - 1]};
            CHECK_OK(mx_forward_batch(m, pair, tok, 2, two, &e), &e);
            for (int w = 0; w < 2; w++) {
                int step = w == 0 ? j + 1 : j;
                for (int q = 0; q < 32; q++) {
                    double d = fabs(two[(size_t)w * V + dec_ids[step * 32 + q]] - dec[step * 32 + q]);
                    worst = d > worst || d != d ? d : worst;
                }
            }
        }
        CHECKF(worst < 1e-3, "%s fused=%d: batched decode differs from the reference by %g", name, fused, worst);
    }
    free(two);
    mx_seq_free(A);
    mx_seq_free(B);
    batch_sizes(m, name);
    mx_seq_free(s);
    mx_seq_free(s2);
    free(hidden), free(router), free(all), free(logits), free(nograph);
out:
    mx_moe_set_fused(-1);
    mx_st_close(r);
    mx_model_free(m);
}

/* Every fixture's family runs on the GPU; the refusal is checked on a
 * layer made unsupported in memory: qwen3_next_tiny's first DeltaNet
 * convolution given 9 taps (the GPU's convolution keeps at most 8). */
static void run_refused(const char *root)
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/qwen3_next_tiny", root);
    mx_err e = {0};
    mx_model *m = NULL;
    CHECK_OK(mx_model_load(dir, &m, &e), &e);
    if (!m)
        return;
    CHECKF(m->layers[0].mixer == MX_MIXER_DELTANET, "qwen3_next_tiny: layer 0 is not a DeltaNet layer");
    m->layers[0].dn.K = 9;
    CHECK_FAILS(mx_device_select(m, "cuda", &e), &e);
    CHECKF(strstr(e.msg, "more than 8 taps") && strstr(e.msg, "not supported on the GPU") &&
               strstr(e.msg, "layer 0"),
           "qwen3_next_tiny: the error does not name the feature and the layer: %s", e.msg);
    CHECKF(!m->backend, "qwen3_next_tiny: a refused model kept a backend");
    mx_model_free(m);
}

/* Every MLX affine format (bits x group size x scale dtype) through the
 * GPU's matvec (1 and 3 tokens) and tile kernels against the CPU's scalar
 * reference, on random weights and inputs: 40, 77 and 130 tokens (the
 * tensor-core tiles take 64 at a time: one partial tile, two, three), an
 * odd row count, 14 chunks a row for groups of 32 and 64 (a partial stage
 * of 4 chunks), each tile size with MLXCEL_CUDA_MMA on (4 and 8 bits on
 * the tensor cores, the other widths on the fp32 tile kernel; wgmma's N
 * of 16, 32, 48 and 64 tokens: 20, 40, 77 = 64 + 13 tokens), with
 * MLXCEL_CUDA_WGMMA=0 (the warp MMAs) and with MLXCEL_CUDA_MMA=0. */
static void linears(const char *gpu)
{
    /* a Hopper GPU (compute capability 9.0) runs this build's sm_90a code,
     * so there the default must be wgmma, not a silent fallback */
    const int hopper = strstr(gpu, "compute capability 9.0") != NULL;
    static const int bits[] = {2, 3, 4, 5, 6, 8}, gss[] = {32, 64, 128}, Ts[] = {1, 3, 20, 40, 77, 130};
    static const mx_dtype sdt[] = {MX_F16, MX_BF16, MX_F32};
    enum { NT = sizeof Ts / sizeof Ts[0], TMAX = 130 };
    const int64_t rows = 203, cmax = 448;
    unsigned long long seed = 42;
    float *w = malloc(sizeof(float) * rows * cmax), *X = malloc(sizeof(float) * TMAX * cmax);
    float *ref = malloc(sizeof(float) * TMAX * rows), *got = malloc(sizeof(float) * TMAX * rows);
    uint8_t *packed = malloc((size_t)(rows * cmax));
    float *sc = malloc(sizeof(float) * rows * cmax / 32), *bi = malloc(sizeof(float) * rows * cmax / 32);
    mx_qkernels_force("scalar");
    int bad = 0, runs = 0;
    for (size_t ib = 0; ib < 6; ib++)
        for (size_t ig = 0; ig < 3; ig++)
            for (size_t is = 0; is < 3; is++) {
                /* groups of 32: an odd count of chunks (k_mm_prep's last one alone) */
                const int64_t cols = gss[ig] == 128 ? 384 : gss[ig] == 32 ? 416 : cmax;
                for (int64_t i = 0; i < rows * cols; i++)
                    w[i] = test_randf(&seed);
                mx_err e = {0};
                CHECK_OK(mx_quantize(w, rows, cols, bits[ib], gss[ig], sdt[is], packed, sc, bi, &e), &e);
                mx_linear l = {.quantized = 1, .rows = rows, .cols = cols,
                               .q = {.w = packed, .scales = sc, .biases = bi, .rows = rows, .cols = cols,
                                     .bits = bits[ib], .group_size = gss[ig], .sdtype = sdt[is]}};
                for (size_t it = 0; it < NT; it++) {
                    const int T = Ts[it];
                    for (int64_t i = 0; i < T * cols; i++)
                        X[i] = test_randf(&seed);
                    mx_linear_matmul(&l, X, T, ref);
                    /* mma 2: the default (wgmma where the GPU has it), 1: warp MMAs, 0: fp32 tiles */
                    for (int mma = 2; mma >= (T > 8 ? 0 : 2); mma--) {
                        setenv("MLXCEL_CUDA_MMA", mma ? "1" : "0", 1);
                        setenv("MLXCEL_CUDA_WGMMA", mma == 2 ? "1" : "0", 1);
                        int rc = mx_cuda_linear(&l, X, T, got, &e);
                        CHECK_OK(rc, &e);
                        if (mma == 2 && hopper && !mx_cuda_wgmma_active()) {
                            bad++;
                            fprintf(stderr, "linear %d-bit, %d tokens: a Hopper GPU but the tiles are not on wgmma\n",
                                    bits[ib], T);
                        }
                        const double d = max_abs_diff(ref, got, (size_t)(T * rows)) / (max_abs(ref, (size_t)(T * rows)) + 1e-30);
                        runs++;
                        if (rc || d > 1e-5) {
                            bad++;
                            fprintf(stderr, "linear %d-bit group %d sdtype %d, %d tokens, mma %d: relative difference %g\n",
                                    bits[ib], gss[ig], (int)sdt[is], T, mma, d);
                        }
                    }
                }
            }
    unsetenv("MLXCEL_CUDA_MMA");
    unsetenv("MLXCEL_CUDA_WGMMA");
    mx_qkernels_force(NULL);
    CHECKF(bad == 0, "%d of %d GPU linears differ from the CPU reference", bad, runs);
    free(w), free(X), free(ref), free(got), free(packed), free(sc), free(bi);
}

/* One token through wide, tall 4- and 8-bit matrices: rows enough that
 * each warp of the streaming kernel walks several row groups (its blocks
 * stay resident), rows long enough for several steps per group, the last
 * one partial.  rows sets how many rows a warp takes at a time (20001:
 * 4 on an H200, 5001: 2; the small linears above: 1). */
static void wide_linears(int64_t rows)
{
    static const int bits[] = {4, 8}, gss[] = {32, 64, 128};
    static const mx_dtype sdt[] = {MX_F16, MX_BF16, MX_F32};
    const int64_t cols = 2432;
    unsigned long long seed = 7;
    float *w = malloc(sizeof(float) * rows * cols), *X = malloc(sizeof(float) * cols);
    float *ref = malloc(sizeof(float) * rows), *got = malloc(sizeof(float) * rows);
    uint8_t *packed = malloc((size_t)(rows * cols));
    float *sc = malloc(sizeof(float) * rows * cols / 32), *bi = malloc(sizeof(float) * rows * cols / 32);
    for (int64_t i = 0; i < rows * cols; i++)
        w[i] = test_randf(&seed);
    mx_qkernels_force("scalar");
    int bad = 0, runs = 0;
    for (size_t ib = 0; ib < 2; ib++)
        for (size_t ig = 0; ig < 3; ig++)
            for (size_t is = 0; is < 3; is++) {
                mx_err e = {0};
                CHECK_OK(mx_quantize(w, rows, cols, bits[ib], gss[ig], sdt[is], packed, sc, bi, &e), &e);
                mx_linear l = {.quantized = 1, .rows = rows, .cols = cols,
                               .q = {.w = packed, .scales = sc, .biases = bi, .rows = rows, .cols = cols,
                                     .bits = bits[ib], .group_size = gss[ig], .sdtype = sdt[is]}};
                /* wide: values over 2^-30 .. 2^10 within a chunk, a
                 * chunk of zeros, a chunk with one value, a chunk of
                 * values under 2^-110 (the integer kernels' digits of x
                 * are relative to each chunk's largest value) */
                for (int wide = 0; wide < 2; wide++) {
                    for (int64_t i = 0; i < cols; i++) {
                        X[i] = test_randf(&seed);
                        if (wide)
                            X[i] = ldexpf(X[i], (int)(test_randf(&seed) * 20.0f) - 10);
                    }
                    if (wide) {
                        for (int i = 0; i < 32; i++)
                            X[64 + i] = 0.0f, X[96 + i] = i == 5 ? 3.0f : 0.0f, X[128 + i] = ldexpf(X[128 + i], -110);
                        X[200] = 1024.0f, X[201] = ldexpf(1.0f, -30);
                    }
                    mx_linear_matmul(&l, X, 1, ref);
                    /* 2: integer kernels, weights through the shared-memory
                     * ring; 1: integer kernels, weights in registers; 0:
                     * the float kernels */
                    for (int mode = 2; mode >= 0; mode--) {
                        const int idot = mode > 0;
                        setenv("MLXCEL_CUDA_IDOT", idot ? "1" : "0", 1);
                        setenv("MLXCEL_CUDA_RING", mode == 2 ? "1" : "0", 1);
                        int rc = mx_cuda_linear(&l, X, 1, got, &e);
                        CHECK_OK(rc, &e);
                        const double d = max_abs_diff(ref, got, (size_t)rows) / (max_abs(ref, (size_t)rows) + 1e-30);
                        runs++;
                        if (rc || d > 1e-5) {
                            bad++;
                            fprintf(stderr, "wide linear %lld rows %d-bit group %d sdtype %d, x %s, mode %d: relative difference %g\n",
                                    (long long)rows, bits[ib], gss[ig], (int)sdt[is], wide ? "wide" : "uniform", mode, d);
                        }
                    }
                }
            }
    unsetenv("MLXCEL_CUDA_IDOT");
    unsetenv("MLXCEL_CUDA_RING");
    mx_qkernels_force(NULL);
    CHECKF(bad == 0, "%d of %d wide GPU linears of %lld rows differ from the CPU reference", bad, runs, (long long)rows);
    free(w), free(X), free(ref), free(got), free(packed), free(sc), free(bi);
}

/* The checkpoint in dir loaded twice (to compare two devices or two
 * settings); 0 when either load failed (counted as a failure). */
static int load_two(const char *dir, mx_model **a, mx_model **b)
{
    mx_err e = {0};
    CHECK_OK(mx_model_load(dir, a, &e), &e);
    CHECK_OK(mx_model_load(dir, b, &e), &e);
    return *a && *b;
}

/* GPU vs CPU on the trained demo model: prompts of n tokens, then steps
 * greedy tokens, logits within 1e-3 and the same greedy ids. */
/* The checkpoint in dir (named name in messages) on the GPU against the
 * CPU: an n-token random prompt's logits at every position, then `steps`
 * greedy steps, within 1e-3 and the same ids. */
/* a on the GPU with var=1, b with var=0 (the switch read when the
 * device is selected) */
static void cuda_pair_v(mx_model *a, mx_model *b, const char *var, const char *on, const char *off, mx_err *e)
{
    setenv(var, on, 1);
    CHECK_OK(mx_device_select(a, "cuda", e), e);
    setenv(var, off, 1);
    CHECK_OK(mx_device_select(b, "cuda", e), e);
    unsetenv(var);
}

static void cuda_pair(mx_model *a, mx_model *b, const char *var, mx_err *e) { cuda_pair_v(a, b, var, "1", "0", e); }

static void gpu_vs_cpu(const char *dir, const char *name, int n, int steps, int window, int ctx)
{
    mx_err e = {0};
    mx_model *cpu = NULL, *gpu = NULL;
    if (!load_two(dir, &cpu, &gpu))
        goto out;
    /* window > 0: every layer attends to its last `window` positions (the
     * one-token attention's splits then start inside the window, or are
     * empty) */
    for (int l = 0; window > 0 && l < cpu->n_layers; l++)
        cpu->layers[l].attn.window = gpu->layers[l].attn.window = window;
    CHECK_OK(mx_device_select(gpu, "cuda", &e), &e);
    const int V = cpu->vocab;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n);
    float *a = malloc(sizeof(float) * (size_t)n * V), *b = malloc(sizeof(float) * (size_t)n * V);
    mx_seq *sc = NULL, *sg = NULL;
    /* ctx > 0: a context larger than the run (a captured step's attention
     * holds splits for all of it, most of them empty) */
    const int nctx = ctx > n + steps + 1 ? ctx : n + steps + 1;
    CHECK_OK(mx_seq_new(cpu, nctx, &sc, &e), &e);
    CHECK_OK(mx_seq_new(gpu, nctx, &sg, &e), &e);
    unsigned long long seed = 0x1234567ull + (unsigned long long)n;
    for (int i = 0; i < n; i++)
        ids[i] = (int32_t)(test_rand_u64(&seed) % (unsigned long long)V);
    mx_forward_trace ta = {.all_logits = a}, tb = {.all_logits = b};
    CHECK_OK(mx_forward(cpu, sc, ids, n, NULL, &ta, &e), &e);
    CHECK_OK(mx_forward(gpu, sg, ids, n, NULL, &tb, &e), &e);
    double d = max_abs_diff(a, b, (size_t)n * V);
    CHECKF(d < 1e-3, "%s: a %d-token prompt's logits differ between CPU and GPU by %g", name, n, d);
    int32_t next = argmax(a + (size_t)(n - 1) * V, V);
    double worst = 0;
    int same = 1;
    for (int i = 0; i < steps; i++) {
        CHECK_OK(mx_forward(cpu, sc, &next, 1, a, NULL, &e), &e);
        CHECK_OK(mx_forward(gpu, sg, &next, 1, b, NULL, &e), &e);
        double di = max_abs_diff(a, b, (size_t)V);
        worst = di > worst || di != di ? di : worst;
        same &= argmax(a, V) == argmax(b, V);
        next = argmax(a, V);
    }
    CHECKF(worst < 1e-3, "%s: decode logits after %d prompt tokens differ by %g", name, n, worst);
    CHECKF(same, "%s: greedy ids differ between CPU and GPU after %d prompt tokens", name, n);
    fprintf(stderr, "%s prompt %d, window %d, context %d: GPU vs CPU prompt logits %.2g, decode %.2g\n", name, n,
            window, nctx, d, worst);
    mx_seq_free(sc);
    mx_seq_free(sg);
    free(ids), free(a), free(b);
out:
    mx_model_free(cpu);
    mx_model_free(gpu);
}

/* The router inside phase 1's launch (MLXCEL_CUDA_MOE_ROUTER=1)
 * against the router's own launch on the demo model (a shared expert, so
 * phase 1 goes through its rows while the routes are made): the same
 * arithmetic in the same order, so the same logits bit for bit over a
 * prompt and greedy steps, graph and plain; and it did run. */
static void kjv_router(const char *dir)
{
    mx_err e = {0};
    mx_model *a = NULL, *b = NULL;
    if (!load_two(dir, &a, &b))
        goto out;
    setenv("MLXCEL_CUDA_ROUTER_IN_O", "0", 1);   /* against the router's own launch */
    cuda_pair(a, b, "MLXCEL_CUDA_MOE_ROUTER", &e);
    unsetenv("MLXCEL_CUDA_ROUTER_IN_O");
    if (!a->backend || !b->backend)
        goto out;
    const int V = a->vocab, n = 5, steps = 12;
    mx_seq *sa = NULL, *sb = NULL, *sc = NULL;
    CHECK_OK(mx_seq_new(a, n + 2 * steps + 1, &sa, &e), &e);
    CHECK_OK(mx_seq_new(b, n + 2 * steps + 1, &sb, &e), &e);
    CHECK_OK(mx_seq_new(a, n + 2 * steps + 1, &sc, &e), &e);
    float *la = malloc(sizeof(float) * (size_t)V), *lb = malloc(sizeof(float) * (size_t)V),
          *lc = malloc(sizeof(float) * (size_t)V);
    int32_t ids[5] = {11, 220, 3001, 17, 42};
    for (int i = 0; i < n; i++)
        ids[i] %= V;
    const long before = mx_cuda_routed_launches();
    CHECK_OK(mx_forward(a, sa, ids, n, la, NULL, &e), &e);
    CHECK_OK(mx_forward(b, sb, ids, n, lb, NULL, &e), &e);
    CHECK_OK(mx_forward(a, sc, ids, n, lc, NULL, &e), &e);
    int32_t next = argmax(la, V);
    double worst = 0;
    for (int i = 0; i < steps; i++) {
        CHECK_OK(mx_forward(a, sa, &next, 1, la, NULL, &e), &e);
        CHECK_OK(mx_forward(b, sb, &next, 1, lb, NULL, &e), &e);
        setenv("MLXCEL_CUDA_GRAPH", "0", 1);
        CHECK_OK(mx_forward(a, sc, &next, 1, lc, NULL, &e), &e);
        unsetenv("MLXCEL_CUDA_GRAPH");
        const double d = max_abs_diff(la, lb, (size_t)V), d2 = max_abs_diff(lc, lb, (size_t)V);
        worst = d > worst || d != d ? d : worst;
        worst = d2 > worst || d2 != d2 ? d2 : worst;
        next = argmax(lb, V);
    }
    CHECKF(worst == 0, "kjv-moe: the router inside phase 1's launch changes the logits by %g", worst);
    CHECKF(mx_cuda_routed_launches() > before, "kjv-moe: the router never ran inside phase 1's launch");
    fprintf(stderr, "kjv-moe: router inside phase 1's launch vs its own launch: %d steps, difference %g, %ld launches\n",
            steps, worst, mx_cuda_routed_launches() - before);
    mx_seq_free(sa);
    mx_seq_free(sb);
    mx_seq_free(sc);
    free(la), free(lb), free(lc);
out:
    mx_model_free(a);
    mx_model_free(b);
}

/* The router folded into o_proj's launch (MLXCEL_CUDA_ROUTER_IN_O, the
 * default) against the router's own launch on the demo model: the logits
 * are 1 / rms times sums against w * (x + y) added block by block instead
 * of sums against the staged norm, so they agree to rounding, not bit for
 * bit; the greedy ids agree; and it did run, graph and plain. */
static void kjv_router_in_o(const char *dir)
{
    mx_err e = {0};
    mx_model *a = NULL, *b = NULL;
    if (!load_two(dir, &a, &b))
        goto out;
    cuda_pair(a, b, "MLXCEL_CUDA_ROUTER_IN_O", &e);
    if (!a->backend || !b->backend)
        goto out;
    const int V = a->vocab, n = 7, steps = 40;
    mx_seq *sa = NULL, *sb = NULL, *sc = NULL;
    CHECK_OK(mx_seq_new(a, n + steps + 1, &sa, &e), &e);
    CHECK_OK(mx_seq_new(b, n + steps + 1, &sb, &e), &e);
    CHECK_OK(mx_seq_new(a, n + steps + 1, &sc, &e), &e);
    float *la = malloc(sizeof(float) * (size_t)V), *lb = malloc(sizeof(float) * (size_t)V),
          *lc = malloc(sizeof(float) * (size_t)V);
    int32_t ids[7] = {11, 220, 3001, 17, 42, 5, 900};
    for (int i = 0; i < n; i++)
        ids[i] %= V;
    const long before = mx_cuda_rp_launches();
    CHECK_OK(mx_forward(a, sa, ids, n, la, NULL, &e), &e);
    CHECK_OK(mx_forward(b, sb, ids, n, lb, NULL, &e), &e);
    CHECK_OK(mx_forward(a, sc, ids, n, lc, NULL, &e), &e);
    int32_t next = argmax(lb, V);
    double worst = 0, worst_plain = 0;
    int same = 1;
    for (int i = 0; i < steps; i++) {
        CHECK_OK(mx_forward(a, sa, &next, 1, la, NULL, &e), &e);
        CHECK_OK(mx_forward(b, sb, &next, 1, lb, NULL, &e), &e);
        setenv("MLXCEL_CUDA_GRAPH", "0", 1);
        CHECK_OK(mx_forward(a, sc, &next, 1, lc, NULL, &e), &e);
        unsetenv("MLXCEL_CUDA_GRAPH");
        const double d = max_abs_diff(la, lb, (size_t)V), d2 = max_abs_diff(lc, la, (size_t)V);
        worst = d > worst || d != d ? d : worst;
        worst_plain = d2 > worst_plain || d2 != d2 ? d2 : worst_plain;
        same &= argmax(la, V) == argmax(lb, V);
        next = argmax(lb, V);
    }
    CHECKF(worst < 1e-3, "kjv-moe: the router in o_proj's launch changes the logits by %g", worst);
    CHECKF(worst_plain == 0, "kjv-moe: the router in o_proj's launch: graph and plain steps differ by %g",
           worst_plain);
    CHECKF(same, "kjv-moe: the router in o_proj's launch changes the greedy ids");
    CHECKF(mx_cuda_rp_launches() > before, "kjv-moe: o_proj's launch never routed");
    fprintf(stderr, "kjv-moe: router in o_proj's launch vs its own launch: %d steps, difference %g, %ld launches\n",
            steps, worst, mx_cuda_rp_launches() - before);
    mx_seq_free(sa);
    mx_seq_free(sb);
    mx_seq_free(sc);
    free(la), free(lb), free(lc);
out:
    mx_model_free(a);
    mx_model_free(b);
}

/* A switch that changes only the order work is done in (var=on against
 * var=off; kjv_same_bits: 1 against 0): the same logits bit for bit over
 * a prompt and captured steps.  (Each model's switches are put in place
 * at each of its calls, so the two run side by side.) */
/* n: the prompt's tokens (its ids repeat 6 of them) */
static void kjv_same_bits_nv(const char *dir, const char *var, const char *on, const char *off, const char *what,
                             int n)
{
    mx_err e = {0};
    mx_model *a = NULL, *b = NULL;
    if (!load_two(dir, &a, &b))
        goto out;
    cuda_pair_v(a, b, var, on, off, &e);
    if (!a->backend || !b->backend)
        goto out;
    const int V = a->vocab, steps = 16;
    mx_seq *sa = NULL, *sb = NULL;
    CHECK_OK(mx_seq_new(a, n + steps + 1, &sa, &e), &e);
    CHECK_OK(mx_seq_new(b, n + steps + 1, &sb, &e), &e);
    float *la = malloc(sizeof(float) * (size_t)V), *lb = malloc(sizeof(float) * (size_t)V);
    const int32_t six[6] = {13, 404, 2001, 7, 99, 1234};
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n);
    for (int i = 0; i < n; i++)
        ids[i] = six[i % 6] % V;
    CHECK_OK(mx_forward(a, sa, ids, n, la, NULL, &e), &e);
    CHECK_OK(mx_forward(b, sb, ids, n, lb, NULL, &e), &e);
    double worst = max_abs_diff(la, lb, (size_t)V);
    int32_t next = argmax(lb, V);
    for (int i = 0; i < steps; i++) {
        CHECK_OK(mx_forward(a, sa, &next, 1, la, NULL, &e), &e);
        CHECK_OK(mx_forward(b, sb, &next, 1, lb, NULL, &e), &e);
        const double d = max_abs_diff(la, lb, (size_t)V);
        worst = d > worst || d != d ? d : worst;
        next = argmax(lb, V);
    }
    CHECKF(worst == 0, "kjv-moe: %s (%s) changes the logits by %g", what, var, worst);
    fprintf(stderr, "kjv-moe: %s on and off: %d-token prompt, %d steps, difference %g\n", what, n, steps, worst);
    mx_seq_free(sa);
    mx_seq_free(sb);
    free(la), free(lb), free(ids);
out:
    mx_model_free(a);
    mx_model_free(b);
}

static void kjv_same_bits_v(const char *dir, const char *var, const char *on, const char *off, const char *what)
{
    kjv_same_bits_nv(dir, var, on, off, what, 6);
}

static void kjv_same_bits(const char *dir, const char *var, const char *what)
{
    kjv_same_bits_v(dir, var, "1", "0", what);
}

/* The batched steps on the trained demo model, fused MoE on and off. */
static void kjv_batch(const char *dir)
{
    mx_err e = {0};
    mx_model *m = NULL;
    CHECK_OK(mx_model_load(dir, &m, &e), &e);
    if (!m)
        return;
    CHECK_OK(mx_device_select(m, "cuda", &e), &e);
    if (m->backend)
        for (int fused = 1; fused >= 0; fused--) {
            mx_moe_set_fused(fused);
            batch_sizes(m, "kjv-moe");
        }
    mx_moe_set_fused(-1);
    mx_model_free(m);
}

/* The greedy step's argmax on the GPU against mx_argmax (whose definition
 * test_sample checks) on ties, NaNs, infinities, signed zeros and a
 * vocabulary's worth of values with the maximum repeated across blocks. */
static void argmax_edges(void)
{
    const float inf = INFINITY, nan = NAN;
    const float c[][4] = {{1, 3, 3, 2}, {nan, 5, 7, 1}, {1, nan, 0.5f, 0}, {1, nan, 2, nan}, {-inf, -inf, -inf, -inf},
                          {-inf, nan, -inf, nan}, {-0.0f, 0.0f, -0.0f, 0.0f}, {-1, 0.0f, -0.0f, -2},
                          {1, inf, inf, 0}, {nan, nan, nan, nan}, {-inf, nan, -5, nan}};
    mx_err e = {0};
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++)
        for (int n = 1; n <= 4; n++) {
            int32_t got = -1;
            CHECK_OK(mx_cuda_argmax(c[i], n, &got, &e), &e);
            CHECKF(got == mx_argmax(c[i], n), "argmax case %zu of %d values: GPU %d, mx_argmax %d", i, n, (int)got,
                   (int)mx_argmax(c[i], n));
        }
    const int V = 151936;
    float *x = malloc(sizeof(float) * V);
    unsigned long long seed = 99;
    for (int r = 0; r < 6; r++) {
        for (int i = 0; i < V; i++)
            x[i] = r == 5 ? 1.0f : test_randf(&seed);
        if (r >= 1 && r < 5) {   /* the maximum at several places, in different blocks' strides */
            const int at[] = {V - 1, 70000, 256 * 37 + 3, 12345};
            for (int k = r - 1; k < 4; k++)
                x[at[k]] = 7.0f;
        }
        if (r == 3)
            x[0] = nan;
        if (r == 4)
            for (int i = 1; i < V; i += 3)
                x[i] = nan;
        int32_t got = -1;
        CHECK_OK(mx_cuda_argmax(x, V, &got, &e), &e);
        CHECKF(got == mx_argmax(x, V), "argmax of %d values, round %d: GPU %d, mx_argmax %d", V, r, (int)got,
               (int)mx_argmax(x, V));
    }
    free(x);
}

/* mx_decode_greedy on the GPU (the argmax there, steps back to back)
 * against the CPU's greedy steps: the same ids, twice in a row (the second
 * call from where the first stopped), then the host's argmax on the GPU
 * (MLXCEL_CUDA_GREEDY=0) and the gather path; the sequence then goes on
 * at the right position (a plain step's logits match the CPU's). */
static void greedy_vs_cpu(const char *dir)
{
    mx_err e = {0};
    mx_model *cpu = NULL, *gpu = NULL;
    if (!load_two(dir, &cpu, &gpu))
        goto out;
    CHECK_OK(mx_device_select(gpu, "cuda", &e), &e);
    /* N: the steps of each half, past position 64 (a second split, so the
     * captured attention's blocks a head change between launches);
     * CTX: a context whose splits are mostly empty */
    enum { NP = 5, N = 40, CTX = 2048 };
    const int V = cpu->vocab;
    const int32_t prompt[NP] = {11, 200, 3000, 45, 7};
    int32_t want[4 * N], got[N];
    float *a = malloc(sizeof(float) * V), *b = malloc(sizeof(float) * V);
    for (int mode = 0; mode < 3; mode++) {
        if (mode == 1)
            setenv("MLXCEL_CUDA_GREEDY", "0", 1);
        if (mode == 2)
            setenv("MLXCEL_FUSED_MOE", "0", 1);
        mx_seq *sc = NULL, *sg = NULL;
        CHECK_OK(mx_seq_new(cpu, CTX, &sc, &e), &e);
        CHECK_OK(mx_seq_new(gpu, CTX, &sg, &e), &e);
        CHECK_OK(mx_forward(cpu, sc, prompt, NP - 1, NULL, NULL, &e), &e);
        CHECK_OK(mx_forward(gpu, sg, prompt, NP - 1, NULL, NULL, &e), &e);
        int32_t id = prompt[NP - 1];
        for (int i = 0; i < 2 * N; i++) {
            CHECK_OK(mx_forward(cpu, sc, &id, 1, a, NULL, &e), &e);
            id = want[i] = mx_argmax(a, V);
        }
        int same = 1;
        for (int half = 0; half < 2; half++) {
            CHECK_OK(mx_decode_greedy(gpu, sg, half ? got[N - 1] : prompt[NP - 1], N, got, &e), &e);
            for (int i = 0; i < N; i++)
                same &= got[i] == want[half * N + i];
        }
        CHECKF(same, "kjv-moe: greedy ids on the GPU (mode %d) differ from the CPU's", mode);
        CHECKF(sg->pos == sc->pos, "kjv-moe: greedy on the GPU left position %d, the CPU %d", sg->pos, sc->pos);
        id = want[2 * N - 1];
        CHECK_OK(mx_forward(cpu, sc, &id, 1, a, NULL, &e), &e);
        CHECK_OK(mx_forward(gpu, sg, &id, 1, b, NULL, &e), &e);
        const double d = max_abs_diff(a, b, (size_t)V);
        CHECKF(d < 1e-3, "kjv-moe: the step after greedy steps (mode %d) differs by %g", mode, d);
        mx_seq_free(sc);
        mx_seq_free(sg);
    }
    unsetenv("MLXCEL_CUDA_GREEDY");
    unsetenv("MLXCEL_FUSED_MOE");
    /* past the ring of ids the host copies back every 1 024 steps: 1 100
     * steps against the host's argmax of the same GPU logits (the same
     * graph's kernels, so the same ids exactly, near ties or not) */
    {
        enum { L = 1100 };
        int32_t *g1 = malloc(sizeof(int32_t) * L), *g2 = malloc(sizeof(int32_t) * L);
        mx_seq *s1 = NULL, *s2 = NULL;
        CHECK_OK(mx_seq_new(gpu, NP + L + 2, &s1, &e), &e);
        CHECK_OK(mx_seq_new(gpu, NP + L + 2, &s2, &e), &e);
        if (g1 && g2 && s1 && s2) {
            CHECK_OK(mx_forward(gpu, s1, prompt, NP - 1, NULL, NULL, &e), &e);
            CHECK_OK(mx_forward(gpu, s2, prompt, NP - 1, NULL, NULL, &e), &e);
            CHECK_OK(mx_decode_greedy(gpu, s1, prompt[NP - 1], L, g1, &e), &e);
            setenv("MLXCEL_CUDA_GREEDY", "0", 1);
            CHECK_OK(mx_decode_greedy(gpu, s2, prompt[NP - 1], L, g2, &e), &e);
            unsetenv("MLXCEL_CUDA_GREEDY");
            int same = 0;
            while (same < L && g1[same] == g2[same])
                same++;
            CHECKF(same == L && s1->pos == s2->pos, "kjv-moe: %d greedy steps: id %d differs between the GPU's "
                   "argmax and the host's (positions %d, %d)", L, same, s1->pos, s2->pos);
        }
        mx_seq_free(s1);
        mx_seq_free(s2);
        free(g1), free(g2);
    }
    free(a), free(b);
out:
    mx_model_free(cpu);
    mx_model_free(gpu);
}

int main(void)
{
    char info[256];
    if (!mx_cuda_built() || !mx_cuda_probe(info, sizeof info)) {
        if (mx_cuda_built())
            fprintf(stderr, "SKIP: %s\n", info);
        else
            fprintf(stderr, "SKIP: this build has no CUDA backend (cmake -DMLXCEL_CUDA=ON)\n");
        return TEST_SKIP;
    }
    fprintf(stderr, "GPU: %s\n", info);
    linears(info);
    wide_linears(20001);
    wide_linears(5001);
    wide_linears(1001);   /* one row a warp */
    argmax_edges();
    const char *src = getenv("MLXCEL_SRC");
    if (src) {
        char dir[1024];
        snprintf(dir, sizeof dir, "%s/models/kjv-moe", src);
        gpu_vs_cpu(dir, "kjv-moe", 1, 8, 0, 0);
        gpu_vs_cpu(dir, "kjv-moe", 5, 8, 0, 0);
        gpu_vs_cpu(dir, "kjv-moe", 600, 16, 0, 0);
        gpu_vs_cpu(dir, "kjv-moe", 600, 16, 100, 0);
        setenv("MLXCEL_CUDA_RING", "0", 1);   /* the streaming kernels' weights in registers */
        gpu_vs_cpu(dir, "kjv-moe", 5, 8, 0, 0);
        unsetenv("MLXCEL_CUDA_RING");
        /* the input norms of q/k/v, lm_head and phase 1 staged by
         * clusters of 2 blocks, each reading half (distributed shared
         * memory), and by every block whole; with and without the routes
         * in phase 1's flag (phase 1's four kernels) */
        for (int i = 0; i < 4; i++) {
            setenv("MLXCEL_CUDA_CLUSTER", i & 1 ? "2" : "0", 1);
            setenv("MLXCEL_CUDA_CLUSTER_MOE", i & 1 ? "2" : "0", 1);
            setenv("MLXCEL_CUDA_RPACK", i & 2 ? "1" : "0", 1);
            gpu_vs_cpu(dir, "kjv-moe", 5, 16, 0, 0);
            greedy_vs_cpu(dir);
        }
        unsetenv("MLXCEL_CUDA_CLUSTER");
        unsetenv("MLXCEL_CUDA_CLUSTER_MOE");
        unsetenv("MLXCEL_CUDA_RPACK");
        greedy_vs_cpu(dir);
        /* a context of 2048 (32 splits of 64, 10 of them holding
         * positions): blocks for all of them, and 3 blocks a head, each
         * looping over its share of the splits (with a window too, so
         * that the first ones are empty) */
        gpu_vs_cpu(dir, "kjv-moe", 600, 16, 0, 2048);
        setenv("MLXCEL_CUDA_ATT_BLOCKS", "3", 1);
        gpu_vs_cpu(dir, "kjv-moe", 600, 16, 0, 2048);
        gpu_vs_cpu(dir, "kjv-moe", 600, 16, 100, 2048);
        unsetenv("MLXCEL_CUDA_ATT_BLOCKS");
        /* one token's splits of 128 and 256 positions (the first 64 rows
         * still copied ahead), a short context in one split */
        /* 2 blocks a head: the captured steps' splits grow from 64 to 128
         * positions at position 128 (mxc_att's span_auto: one a block),
         * with and without a window */
        setenv("MLXCEL_CUDA_ATT_BLOCKS", "2", 1);
        gpu_vs_cpu(dir, "kjv-moe", 100, 80, 0, 2048);
        gpu_vs_cpu(dir, "kjv-moe", 100, 80, 90, 2048);
        gpu_vs_cpu(dir, "kjv-moe", 600, 16, 0, 2048);
        unsetenv("MLXCEL_CUDA_ATT_BLOCKS");
        setenv("MLXCEL_CUDA_ATT_SPAN", "128", 1);
        gpu_vs_cpu(dir, "kjv-moe", 600, 16, 0, 2048);
        gpu_vs_cpu(dir, "kjv-moe", 100, 40, 0, 0);
        setenv("MLXCEL_CUDA_ATT_SPAN", "256", 1);
        gpu_vs_cpu(dir, "kjv-moe", 600, 16, 100, 2048);
        gpu_vs_cpu(dir, "kjv-moe", 200, 80, 0, 2048);
        unsetenv("MLXCEL_CUDA_ATT_SPAN");
        /* captured steps across splits' ends (positions 120 .. 200: the
         * blocks a head follow the position, mxc_att_fit_pos), with and
         * without a window */
        gpu_vs_cpu(dir, "kjv-moe", 120, 80, 0, 2048);
        gpu_vs_cpu(dir, "kjv-moe", 120, 80, 100, 2048);
        kjv_batch(dir);
        kjv_router(dir);
        kjv_router_in_o(dir);
        kjv_same_bits(dir, "MLXCEL_CUDA_EXTRAS_FIRST", "phase 1's extra slots first");
        {   /* kjv-moe's experts are slices of stacked tensors: the step's
             * expert matrices made from one stride, against the table */
            const long before = mx_cuda_estride_launches();
            kjv_same_bits(dir, "MLXCEL_CUDA_ESTRIDE", "the experts' matrices from one stride");
            CHECKF(mx_cuda_estride_launches() > before, "kjv-moe: no expert sum took its matrices from one stride");
        }
        kjv_same_bits(dir, "MLXCEL_CUDA_QKV_EARLY", "q/k/v letting the attention launch after its wait");
        kjv_same_bits(dir, "MLXCEL_CUDA_ATT_KV", "the attention asking for its kv head's rows beside its q head's");
        kjv_same_bits(dir, "MLXCEL_CUDA_ATT_COMB1", "the attention combining its splits in one round trip");
        kjv_same_bits(dir, "MLXCEL_CUDA_ATT_EARLY", "the attention letting o_proj launch once its heads are made");
        kjv_same_bits(dir, "MLXCEL_CUDA_MOE2_EARLY", "phase 2 letting q/k/v launch after its wait");
        kjv_same_bits(dir, "MLXCEL_CUDA_SHARED_EARLY", "phase 1 starting on o_proj's flags");
        kjv_same_bits(dir, "MLXCEL_CUDA_RPACK", "the routes inside o_proj's flag");
        kjv_same_bits(dir, "MLXCEL_CUDA_MOE1_GO", "phase 1 letting phase 2 launch at its start");
        kjv_same_bits(dir, "MLXCEL_CUDA_ROUTE_RANK", "o_proj's last block routing by ranks");
        kjv_same_bits(dir, "MLXCEL_CUDA_Y_TAGGED", "phase 1 staging its norm from o_proj's tagged rows");
        /* past position 64: 2 and 3 splits (ATT_BLOCKS 3: a block each) */
        setenv("MLXCEL_CUDA_ATT_BLOCKS", "3", 1);
        kjv_same_bits_nv(dir, "MLXCEL_CUDA_ATT_TAGGED", "1", "0", "the attention's splits combined from tagged partials",
                         100);
        unsetenv("MLXCEL_CUDA_ATT_BLOCKS");
    } else {
        fprintf(stderr, "note: MLXCEL_SRC unset, the kjv-moe comparison is skipped\n");
    }
    /* MLXCEL_CUDA_MODELS=dir,dir,...: other checkpoints (a synth preset's
     * layers at full width, say) on the GPU against the CPU */
    const char *more = getenv("MLXCEL_CUDA_MODELS");
    if (more && *more) {
        char *list = strdup(more);
        for (char *sv = NULL, *d = strtok_r(list, ",", &sv); d; d = strtok_r(NULL, ",", &sv)) {
            gpu_vs_cpu(d, d, 40, 8, 0, 0);
            gpu_vs_cpu(d, d, 300, 4, 0, 0);
        }
        free(list);
    }
    const char *root = test_fixtures();
    if (root) {
        /* MLXCEL_CUDA_FIXTURES=a,b,... runs only those (a device lease
         * that cannot carry every folder) */
        const char *only = getenv("MLXCEL_CUDA_FIXTURES");
        for (size_t i = 0; i < sizeof supported / sizeof supported[0]; i++)
            for (int fused = 1; fused >= 0; fused--)
                if (!only || strstr(only, supported[i]))
                    run_fixture(root, supported[i], fused);
        if (!only || strstr(only, "qwen3_next_tiny"))
            run_refused(root);
        if (only)
            fprintf(stderr, "note: MLXCEL_CUDA_FIXTURES=%s: the other fixtures were not run\n", only);
    }
    return test_summary();
}
