/* recurrent.c - the math of the layers that carry state instead of a KV
 * cache: a depthwise causal convolution over a rolling window (LFM2's short
 * convolution, the convolution in front of DeltaNet) and the gated delta
 * rule of Qwen3-Next's linear attention, token by token (decode) and in
 * chunks (prefill).  Both forms compute the same thing; the chunked one
 * turns most of the work into small matrix products over a chunk, which is
 * how transformers computes a prompt, and the tests hold the two to each
 * other on long prompts.  Float32 throughout, as transformers does. */
#include <math.h>
#include <string.h>

#include "model/ops.h"

void mx_conv_causal(const float *w, int K, float bias, float *win, const float *x, int64_t sx,
                    int64_t n, float *out, int64_t so)
{
    /* win holds the previous K-1 inputs, oldest first; each new input
     * joins at the end and the oldest drops out */
    for (int64_t i = 0; i < n; i++) {
        const float xi = x[i * sx];
        float acc = bias;
        for (int j = 0; j < K - 1; j++)
            acc += w[j] * win[j];
        acc += w[K - 1] * xi;
        if (K > 1) {
            memmove(win, win + 1, sizeof *win * (size_t)(K - 2));
            win[K - 2] = xi;
        }
        out[i * so] = acc;
    }
}

void mx_l2norm(float *x, int n, float eps)
{
    float ss = 0.0f;
    for (int i = 0; i < n; i++)
        ss += x[i] * x[i];
    const float r = 1.0f / sqrtf(ss + eps);
    for (int i = 0; i < n; i++)
        x[i] *= r;
}

void mx_delta_recurrent(const mx_delta_run *r, float *S)
{
    const int dk = r->dk, dv = r->dv;
    for (int64_t t = 0; t < r->n; t++) {
        const float *q = r->q + t * dk, *k = r->k + t * dk, *v = r->v + t * dv;
        float *o = r->out + t * r->out_stride;
        const float decay = expf(r->g[t]), beta = r->beta[t];
        for (int a = 0; a < dk * dv; a++)
            S[a] *= decay;
        /* delta = beta (v - S^T k);  S += k delta^T;  o = S^T q */
        for (int j = 0; j < dv; j++) {
            float kv = 0.0f;
            for (int a = 0; a < dk; a++)
                kv += S[a * dv + j] * k[a];
            const float delta = (v[j] - kv) * beta;
            float acc = 0.0f;
            for (int a = 0; a < dk; a++) {
                S[a * dv + j] += k[a] * delta;
                acc += S[a * dv + j] * q[a];
            }
            o[j] = acc;
        }
    }
}

size_t mx_delta_chunk_floats(int dk, int dv)
{
    const size_t C = MX_DELTA_CHUNK;
    /* gc, A [C][C], decay-weighted q k^T [C][C], u and v_new [C][dv], w [C][dk] */
    return C + 2 * C * C + 2 * C * (size_t)dv + C * (size_t)dk;
}

/* One chunk of c <= MX_DELTA_CHUNK tokens starting at token t0. */
static void delta_chunk(const mx_delta_run *r, int64_t t0, int c, float *S, float *scr)
{
    const int dk = r->dk, dv = r->dv, C = MX_DELTA_CHUNK;
    float *gc = scr, *A = gc + C, *P = A + C * C, *u = P + C * C, *vn = u + C * dv, *w = vn + C * dv;
    const float *q = r->q + t0 * dk, *k = r->k + t0 * dk, *v = r->v + t0 * dv;
    const float *beta = r->beta + t0;
    /* cumulative log decay within the chunk */
    float acc = 0.0f;
    for (int i = 0; i < c; i++)
        gc[i] = acc += r->g[t0 + i];
    /* A[i][j] = -(beta_i k_i . k_j) exp(gc_i - gc_j) for j < i, then the
     * forward substitution that makes (I + A) the inverse of the chunk's
     * triangular system */
    for (int i = 0; i < c; i++)
        for (int j = 0; j < c; j++) {
            float d = 0.0f;
            if (j < i) {
                for (int a = 0; a < dk; a++)
                    d += k[i * dk + a] * k[j * dk + a];
                d = -(d * beta[i]) * expf(gc[i] - gc[j]);
            }
            A[i * C + j] = d;
        }
    for (int i = 1; i < c; i++)
        for (int j = 0; j < i; j++) {
            float s = 0.0f;
            for (int m = j + 1; m < i; m++)
                s += A[i * C + m] * A[m * C + j];
            A[i * C + j] += s;
        }
    for (int i = 0; i < c; i++)
        A[i * C + i] = 1.0f;
    /* u = T (beta v), w = T (beta k exp(gc)) */
    for (int i = 0; i < c; i++) {
        for (int e = 0; e < dv; e++) {
            float s = 0.0f;
            for (int j = 0; j <= i; j++)
                s += A[i * C + j] * (v[j * dv + e] * beta[j]);
            u[i * dv + e] = s;
        }
        for (int a = 0; a < dk; a++) {
            float s = 0.0f;
            for (int j = 0; j <= i; j++)
                s += A[i * C + j] * (k[j * dk + a] * beta[j] * expf(gc[j]));
            w[i * dk + a] = s;
        }
    }
    /* v_new = u - w S; out_i = exp(gc_i) q_i S + sum_{j<=i} (q_i . k_j)
     * exp(gc_i - gc_j) v_new_j */
    for (int i = 0; i < c; i++)
        for (int e = 0; e < dv; e++) {
            float s = 0.0f;
            for (int a = 0; a < dk; a++)
                s += w[i * dk + a] * S[a * dv + e];
            vn[i * dv + e] = u[i * dv + e] - s;
        }
    for (int i = 0; i < c; i++)
        for (int j = 0; j <= i; j++) {
            float d = 0.0f;
            for (int a = 0; a < dk; a++)
                d += q[i * dk + a] * k[j * dk + a];
            P[i * C + j] = d * expf(gc[i] - gc[j]);
        }
    for (int i = 0; i < c; i++) {
        float *o = r->out + (t0 + i) * r->out_stride;
        const float eg = expf(gc[i]);
        for (int e = 0; e < dv; e++) {
            float s = 0.0f;
            for (int a = 0; a < dk; a++)
                s += (q[i * dk + a] * eg) * S[a * dv + e];
            for (int j = 0; j <= i; j++)
                s += P[i * C + j] * vn[j * dv + e];
            o[e] = s;
        }
    }
    /* S = S exp(gc_last) + sum_j (k_j exp(gc_last - gc_j)) v_new_j^T */
    const float gl = gc[c - 1], el = expf(gl);
    for (int a = 0; a < dk; a++)
        for (int e = 0; e < dv; e++) {
            float s = S[a * dv + e] * el;
            for (int j = 0; j < c; j++)
                s += k[j * dk + a] * expf(gl - gc[j]) * vn[j * dv + e];
            S[a * dv + e] = s;
        }
}

void mx_delta_chunked(const mx_delta_run *r, float *S, float *scratch)
{
    for (int64_t t0 = 0; t0 < r->n; t0 += MX_DELTA_CHUNK) {
        const int c = (int)(r->n - t0 < MX_DELTA_CHUNK ? r->n - t0 : MX_DELTA_CHUNK);
        delta_chunk(r, t0, c, S, scratch);
    }
}
