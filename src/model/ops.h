/* ops.h - the small per-token operations of the forward pass (forward.c):
 * RMSNorm, RoPE, the KV cache layout, one head of attention, an embedding
 * row.  Internal to src/model.
 *
 * Numerics follow transformers in float32: RMSNorm with the mean of squares
 * and LayerNorm with mean and variance (accumulated in double here, which
 * only rounds closer), rotate-half RoPE with float inverse frequencies,
 * softmax attention scaled by head_dim^-0.5. */
#ifndef MX_MODEL_OPS_H
#define MX_MODEL_OPS_H

#include <math.h>
#include <string.h>

#include "model/model.h"
#include "util/dtype.h"

/* 1 / rms(x), the factor RMSNorm applies before its weight. */
static inline float mx_rms_inv(const float *x, int64_t n, float eps)
{
    double ss = 0.0;
    for (int64_t i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    return 1.0f / sqrtf((float)(ss / (double)n) + eps);
}

/* out = w * (x / rms(x)); out may be x. */
static inline void mx_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps)
{
    const float r = mx_rms_inv(x, n, eps);
    for (int64_t i = 0; i < n; i++)
        out[i] = w[i] * (x[i] * r);
}

/* LayerNorm (Phi-3.5-MoE): out = w * (x - mean) / sqrt(var + eps) + b,
 * the biased variance as torch computes it (statistics in double). */
static inline void mx_layernorm(float *out, const float *x, const float *w, const float *b,
                                int64_t n, float eps)
{
    double sum = 0.0, ss = 0.0;
    for (int64_t i = 0; i < n; i++)
        sum += x[i];
    const float mean = (float)(sum / (double)n);
    for (int64_t i = 0; i < n; i++)
        ss += ((double)x[i] - mean) * ((double)x[i] - mean);
    const float r = 1.0f / sqrtf((float)(ss / (double)n) + eps);
    for (int64_t i = 0; i < n; i++)
        out[i] = w[i] * ((x[i] - mean) * r) + b[i];
}

/* The family's norm of the residual stream (out may be x). */
static inline void mx_norm_apply(float *out, const float *x, const mx_norm *nm, int64_t n, float eps)
{
    if (nm->b)
        mx_layernorm(out, x, nm->w, nm->b, n, eps);
    else
        mx_rmsnorm(out, x, nm->w, n, eps);
}

/* cos and sin of position pos times each inverse frequency of the rope,
 * scaled by its mscale, in float as transformers computes them:
 * cs[2i], cs[2i+1] for i < dims/2.  longf picks LongRoPE's long set. */
static inline void mx_rope_table(float *cs, const mx_rope *r, int pos, int longf)
{
    const float *f = longf && r->inv_freq_long ? r->inv_freq_long : r->inv_freq;
    const float sc = longf && r->inv_freq_long ? r->mscale_long : r->mscale;
    for (int i = 0; i < r->dims / 2; i++) {
        float a = (float)pos * f[i];
        cs[2 * i] = cosf(a) * sc;
        cs[2 * i + 1] = sinf(a) * sc;
    }
}

/* Rotate-half RoPE on the first `dims` values of one head vector (the rest,
 * under a partial rotary factor, pass through). */
static inline void mx_rope_apply(float *v, int dims, const float *cs)
{
    const int half = dims / 2;
    for (int i = 0; i < half; i++) {
        float c = cs[2 * i], s = cs[2 * i + 1];
        float a = v[i], b = v[i + half];
        v[i] = a * c - b * s;
        v[i + half] = b * c + a * s;
    }
}

/* Row `pos` of kv head `kvh` of layer `layer`: each layer's cache is laid
 * out [n_kv][n_ctx][head_dim] of its own geometry, at s->kv_off[layer]. */
static inline float *mx_kv_at(const mx_seq *s, float *base, int layer, int kvh, int pos)
{
    const mx_attn *a = &s->m->layers[layer].attn;
    return base + s->kv_off[layer] + ((size_t)kvh * (size_t)s->n_ctx + (size_t)pos) * (size_t)a->head_dim;
}

/* out[hd] = softmax(scale * q . K[j]) weighted sum of V[j] over positions
 * j in [start, pos]; K, V point at position 0 of the head's cache rows;
 * sc holds pos + 1 floats of scratch (attend.c). */
void mx_attend_head(const float *q, const float *K, const float *V, int start, int pos, int hd,
                    float scale, float *sc, float *out);

/* The same for nq queries of one head at consecutive positions pos0 ..
 * pos0+nq-1 of one sequence (a prompt's run): query b is q[b * ldq], sees
 * [start[b], pos0 + b] (start ascending) and writes out[b * ldo]; sc holds
 * nq rows of ldsc >= pos0 + nq floats.  A query's result is the same bits
 * whatever nq (the keys and values are read once for the run). */
void mx_attend_run(const float *q, size_t ldq, int nq, const float *K, const float *V,
                   const int *start, int pos0, int hd, float scale, float *sc, size_t ldsc,
                   float *out, size_t ldo);
#define MX_ATTEND_RUN 8   /* queries per call in a prompt */

/* e^x for x <= 0 (the softmax's shifted scores) within 2 ulp of expf in
 * the normal range, 0 below it; for tests. */
float mx_expf_neg(float x);

/* ---- recurrent layers (recurrent.c) ---------------------------------------- */

/* Depthwise causal convolution of one channel over n new inputs x[i * sx]
 * with kernel w[K] (oldest tap first) and bias: out[i * so].  win holds the
 * channel's previous K-1 inputs (oldest first) and is updated. */
void mx_conv_causal(const float *w, int K, float bias, float *win, const float *x, int64_t sx,
                    int64_t n, float *out, int64_t so);

/* x[n] /= sqrt(sum x^2 + eps), as transformers' l2norm. */
void mx_l2norm(float *x, int n, float eps);

/* n tokens of one value head through the gated delta rule: q and k [n][dk]
 * (L2-normalised, q scaled by 1/sqrt(dk)), v [n][dv], the log decay g[n]
 * and beta[n]; out[t * out_stride + e]. */
typedef struct mx_delta_run {
    int64_t n;
    int dk, dv;
    const float *q, *k, *v, *g, *beta;
    float *out;
    int64_t out_stride;
} mx_delta_run;

#define MX_DELTA_CHUNK 64

/* Token by token (decode): S [dk][dv] is the head's state, updated. */
void mx_delta_recurrent(const mx_delta_run *r, float *S);
/* The same in chunks of MX_DELTA_CHUNK tokens (prefill), with
 * mx_delta_chunk_floats(dk, dv) floats of scratch. */
void mx_delta_chunked(const mx_delta_run *r, float *S, float *scratch);
size_t mx_delta_chunk_floats(int dk, int dv);

/* First position a token at pos attends to (sliding-window layers). */
static inline int mx_attn_start(const mx_attn *a, int pos)
{
    return a->window && pos - a->window + 1 > 0 ? pos - a->window + 1 : 0;
}

/* Row `id` of the embedding table as f32. */
static inline void mx_embed_row(const mx_model *m, int32_t id, float *out)
{
    const mx_linear *E = &m->embed;
    if (E->quantized) {
        mx_qmat_row(&E->q, id, out);
        return;
    }
    const int64_t off = (int64_t)id * m->d;
    for (int i = 0; i < m->d; i++)
        out[i] = mx_dtype_get(E->w, E->wdtype, off + i);
}

#endif
