/* forward.c - the forward pass: tokens in, logits out.
 *
 *   x = embed(tokens)                                  embed_block
 *   for each layer:
 *       x += attention(rmsnorm(x))                     attention_block
 *       x += ffn(rmsnorm(x))   MoE experts or MLP      ffn_block
 *   logits = lm_head(rmsnorm(x))                       logits_block
 *
 * One function per block, and the same functions for every call: a
 * one-token decode step, a prompt (prefill) and a batched decode step (one
 * token of each of several sequences).  What varies by family (q/k norms,
 * the routing rule, names) comes from the family table (family.h); the
 * small numerics are in ops.h.
 *
 * How the work is shared.  A whole call is ONE OpenMP parallel region:
 * every thread runs every block, takes its share of each step (rows of a
 * matrix, heads, tokens) and meets the others at a barrier only where a
 * step reads what another thread wrote.  Forking once per call instead of
 * once per matrix keeps the cores busy through the serial bits between
 * matrices, which is most of what a decode step is.  For one token (T ==
 * 1) each thread also keeps its own copy of the residual stream, its norm
 * and their prepared forms (the same computation, so the same bits): the
 * residual update, the norms, the router and the routing then need no
 * barrier at all, and a layer costs six.  For T > 1 the stream is shared,
 * split by token.
 *
 * Per layer, T == 1:
 *   A  q, k, v rows split over the threads                     barrier
 *   B  k, v heads into the cache; q heads normed and rotated    barrier
 *   C  attention, q heads split                                 barrier
 *   D  o rows split                                             barrier
 *      x += o; xn = norm(x); router logits and route (every thread)
 *   E  experts: the fused path's two phases (or gather)         2 barriers
 *      x += ffn
 * The expert sum is computed by the path moe/dispatch.c chooses: the fused
 * single-token kernel, or gather (prompts, batches, whatever fused
 * declines). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/family.h"
#include "model/model.h"
#include "model/ops.h"
#include "util/clock.h"
#include "util/parallel.h"

/* ---- the state of a call ---------------------------------------------------- */

/* Where each of the T tokens of a call goes: its sequence and its position
 * there.  A prompt is one sequence at consecutive positions; a batched
 * decode step is one token of each of several sequences. */
typedef struct token_slots {
    mx_seq *const *seq;
    const int *pos;
    int max_ctx;
} token_slots;

/* What the threads share during a call. */
typedef struct pass {
    mx_model *m;
    int64_t T;
    const int32_t *tokens;       /* [T] */
    token_slots ts;
    const float *rope[MX_MAX_ROPES];   /* per rope: [T][dims] cos/sin pairs per token */
    float *x, *xn;               /* [T, d] residual stream and its norm (T > 1) */
    float *q, *k, *v;            /* [T, q_dim], [T, kv_dim], [T, kv_dim] projections */
    float *qr;                   /* [T, q_dim] q heads as attention reads them */
    float *att;                  /* [T, q_dim] attention output */
    float *out;                  /* [T, d] a block's output */
    float *out2, *rin, *xn2;     /* [T, d] parallel layers: the dense branch, the router's and
                                    the experts' inputs (T > 1) */
    /* recurrent layers: the input projections, the convolution's output,
     * the mixed output ([T, widest of each]); runs of consecutive tokens
     * of one sequence (a prompt is one run, a batched step T runs of 1) */
    float *mix_in, *mix_in2, *mix_conv, *mix_out;
    int64_t *run_t0, *run_n;
    int n_runs;
    int64_t *blk_t0;             /* the runs in pieces of up to MX_ATTEND_RUN tokens */
    int *blk_n;
    int64_t n_blk;
    float *router;               /* [T, E] router logits (T > 1) */
    float *gate;                 /* [T] shared-expert weights (T > 1) */
    mx_route *routes;            /* [T] (T > 1) */
    unsigned char *batch_buf;    /* T > 1: the prepared input of the current linears */
    void *fused_buf;             /* T == 1: the fused path's buffers */
    float *logits;               /* [vocab] the last token's, or NULL */
    float *all_logits;           /* [T, vocab] every token's, or NULL */
    const mx_forward_trace *trace;
    int rc;
    mx_err *e;
    mx_team team;                /* the threads' barrier and dynamic loops */
} pass;

/* A thread's own state. */
typedef struct lane {
    int ith, nth;
    float *x, *xn;               /* [d] T == 1: its copy of the stream; else a spare row */
    float *tmp, *xn2, *comb;     /* [d] a block output's norm; T == 1 parallel layers: the experts'
                                    input and the branches' sum */
    mx_vec vec2;                 /* T == 1: xn2 prepared (parallel layers) */
    unsigned char *vec2_buf;
    mx_vec vec;                  /* T == 1: its prepared input of the current linears */
    mx_batch batch;              /* T > 1: its view of the shared prepared input */
    unsigned char *vec_buf;
    float *scores;               /* [max_ctx] attention scores */
    float *router;               /* [E] T == 1: its router logits */
    mx_route route;              /* T == 1: its route */
    float gate;                  /* T == 1: its shared-expert weight */
    int64_t rfull_t;             /* token whose full-width q/k norm factors are cached */
    float *dn_buf;               /* DeltaNet: a run's q, k, v, g, beta and the chunk scratch */
    float rq, rk;
} lane;

/* ---- sharing the work --------------------------------------------------------- */

/* This thread's tokens for per-token work: T == 1 the one token, on every
 * thread (each on its own copy); else its share. */
static void my_tokens(const pass *p, const lane *ln, int64_t *t0, int64_t *t1)
{
    long a = 0, b = 1;
    if (p->T > 1)
        mx_split((long)p->T, ln->ith, ln->nth, &a, &b);
    *t0 = a;
    *t1 = b;
}

/* This thread's rows of a matrix.  Decode splits rows exactly; a batch
 * splits 32-row blocks, the prefill kernel's tile. */
static void my_rows(const pass *p, const lane *ln, int64_t rows, int64_t *r0, int64_t *r1)
{
    long a, b;
    if (p->T == 1) {
        mx_split((long)rows, ln->ith, ln->nth, &a, &b);
        *r0 = a;
        *r1 = b;
        return;
    }
    mx_split((long)((rows + 31) / 32), ln->ith, ln->nth, &a, &b);
    *r0 = a * 32;
    *r1 = b * 32 < rows ? b * 32 : rows;
}

static float *x_at(pass *p, lane *ln, int64_t t) { return p->T == 1 ? ln->x : p->x + t * p->m->d; }
static float *xn_at(pass *p, lane *ln, int64_t t) { return p->T == 1 ? ln->xn : p->xn + t * p->m->d; }

static int gs_of(const mx_linear *l) { return l->quantized ? l->q.group_size : 64; }

/* Makes rows [t0, t1) of X [T, cols] the input of the next linears, for
 * kernels of group size gs (others still work, more slowly).  T == 1: this
 * thread's own vector, prepared on first use; else its token share of the
 * shared batch, then a barrier. */
static void input_ready(pass *p, lane *ln, const float *X, int64_t cols, int gs, int64_t t0,
                        int64_t t1)
{
    if (p->T == 1) {
        mx_vec_init(&ln->vec, X, cols, ln->vec_buf);
        return;
    }
    mx_batch_init(&ln->batch, X, cols, p->T, cols, gs, p->batch_buf);
    mx_batch_prep(&ln->batch, t0, t1);
    mx_team_sync(&p->team);
}

/* Y[t*ldy + r] = (l x_t)[r] + bias for every token, rows [r0, r1). */
static void linear_rows(lane *ln, const pass *p, const mx_linear *l, float *Y, int64_t ldy,
                        int64_t r0, int64_t r1)
{
    if (p->T == 1)
        mx_linear_rows(l, &ln->vec, Y, r0, r1);
    else
        mx_linear_rows_batch(l, &ln->batch, Y, ldy, r0, r1);
}

/* Rows [r0, r1) of n matrices stacked (q, k and v; a router and a gate),
 * each into its own output. */
static void stacked_rows(lane *ln, const pass *p, int n, const mx_linear *const *l,
                         float *const *Y, int64_t r0, int64_t r1)
{
    int64_t base = 0;
    for (int i = 0; i < n; i++) {
        const int64_t rows = l[i]->rows, a = r0 > base ? r0 - base : 0,
                      b = r1 < base + rows ? r1 - base : rows;
        if (b > a)
            linear_rows(ln, p, l[i], Y[i], rows, a, b);
        base += rows;
    }
}

/* x += dnorm(delta) for token t (delta's row t; dnorm may have no weight:
 * none), on this thread's copy or share. */
static void add_row(pass *p, lane *ln, int64_t t, const float *delta, const mx_norm *dnorm)
{
    const mx_model *m = p->m;
    const int64_t d = m->d;
    const float *dt = delta + t * d;
    if (dnorm && dnorm->w) {
        mx_norm_apply(ln->tmp, dt, dnorm, d, m->eps);
        dt = ln->tmp;
    }
    float *x = x_at(p, ln, t);
    for (int64_t i = 0; i < d; i++)
        x[i] += dt[i];
}

/* x += dnorm(delta) (when delta is not NULL), xn = norm(x), and xn made
 * the linears' input.  Per token, so a thread's share needs no barrier
 * before it. */
static void residual_norm(pass *p, lane *ln, const float *delta, const mx_norm *dnorm,
                          const mx_norm *norm, int gs)
{
    const mx_model *m = p->m;
    const int64_t d = m->d;
    int64_t t0, t1;
    my_tokens(p, ln, &t0, &t1);
    for (int64_t t = t0; t < t1; t++) {
        if (delta)
            add_row(p, ln, t, delta, dnorm);
        mx_norm_apply(xn_at(p, ln, t), x_at(p, ln, t), norm, d, m->eps);
    }
    input_ready(p, ln, p->T == 1 ? ln->xn : p->xn, d, gs, t0, t1);
}

/* The trace's copy of the stream after layer l (0: the embeddings). */
static void trace_hidden(pass *p, lane *ln, int l)
{
    if (!p->trace || !p->trace->hidden || l >= p->m->n_layers)
        return;
    const int64_t d = p->m->d;
    int64_t t0, t1;
    my_tokens(p, ln, &t0, &t1);
    if (p->T == 1 && ln->ith != 0)
        return;
    for (int64_t t = t0; t < t1; t++)
        memcpy(p->trace->hidden + ((size_t)l * (size_t)p->T + (size_t)t) * (size_t)d, x_at(p, ln, t),
               sizeof(float) * (size_t)d);
}

/* ---- embedding ----------------------------------------------------------------- */

static void embed_block(pass *p, lane *ln)
{
    const mx_model *m = p->m;
    int64_t t0, t1;
    my_tokens(p, ln, &t0, &t1);
    for (int64_t t = t0; t < t1; t++) {
        float *x = x_at(p, ln, t);
        mx_embed_row(m, p->tokens[t], x);
        if (m->embed_scale != 1.0f)   /* Gemma: embeddings times sqrt(hidden) */
            for (int64_t i = 0; i < m->d; i++)
                x[i] *= m->embed_scale;
    }
    trace_hidden(p, ln, 0);
}

/* ---- attention ------------------------------------------------------------------- */

/* 1/rms of x[n] with every value clipped to [-c, c] first (c <= 0: none),
 * for the full-width q/k norms. */
static float rms_inv_clipped(const float *x, int64_t n, float c, float eps)
{
    double ss = 0.0;
    for (int64_t i = 0; i < n; i++) {
        float v = c > 0 ? fminf(fmaxf(x[i], -c), c) : x[i];
        ss += (double)v * v;
    }
    return 1.0f / sqrtf((float)(ss / (double)n) + eps);
}

/* One head of token t's q or k projection as attention reads it: clipped
 * (clip_qkv), normed (the family's q/k norm: per head, or with the factor
 * of the whole projection), rotated.  is_k picks k (else q). */
static void head_in(pass *p, lane *ln, int l, int64_t t, int is_k, int head, float *dst)
{
    const mx_model *m = p->m;
    const mx_attn *a = &m->layers[l].attn;
    const int hd = a->head_dim;
    const float c = (float)m->cfg.clip_qkv;
    /* a q row per token is q_proj's rows: per head [q | gate] when the
     * layer gates its output */
    const float *src = is_k ? p->k + t * a->kv_dim + head * hd
                            : p->q + t * a->q.rows + head * (a->out_gate ? 2 * hd : hd);
    const float *norm = is_k ? a->k_norm : a->q_norm;
    for (int i = 0; i < hd; i++)
        dst[i] = c > 0 ? fminf(fmaxf(src[i], -c), c) : src[i];
    if (m->fam->qk_norm == MX_QK_NORM_HEAD) {
        mx_rmsnorm(dst, dst, norm, hd, m->eps);
    } else if (m->fam->qk_norm == MX_QK_NORM_FULL) {
        if (ln->rfull_t != t) {   /* once per token and thread, not per head */
            ln->rq = rms_inv_clipped(p->q + t * a->q.rows, a->q_dim, c, m->eps);
            ln->rk = rms_inv_clipped(p->k + t * a->kv_dim, a->kv_dim, c, m->eps);
            ln->rfull_t = t;
        }
        const float r = is_k ? ln->rk : ln->rq;
        for (int i = 0; i < hd; i++)
            dst[i] = norm[head * hd + i] * (dst[i] * r);
    }
    const int dims = m->ropes[a->rope].dims;
    mx_rope_apply(dst, dims, p->rope[a->rope] + t * dims);
}

/* Qwen3-Next's gated attention: head h of token t's output times
 * sigmoid of its gate (the second half of the head's q_proj rows). */
static void out_gate(pass *p, const mx_attn *a, int64_t t, int h)
{
    if (!a->out_gate)
        return;
    const int hd = a->head_dim;
    const float *g = p->q + t * a->q.rows + (int64_t)h * 2 * hd + hd;
    float *o = p->att + t * a->q_dim + (int64_t)h * hd;
    for (int i = 0; i < hd; i++)
        o[i] *= 1.0f / (1.0f + expf(-g[i]));
}

/* p->out[T, d] = o_proj(attention) of the normed stream; k and v of the T
 * tokens are written into their sequences' caches first. */
static void attention_block(pass *p, lane *ln, int l)
{
    mx_model *m = p->m;
    const mx_attn *a = &m->layers[l].attn;
    const int hd = a->head_dim, nh = a->n_heads, nkv = a->n_kv, group = nh / nkv;
    const int64_t T = p->T;
    int64_t r0, r1;
    /* A: q, k, v rows (no v rows on k = v layers) */
    const mx_linear *qkv[3] = {&a->q, &a->k, &a->v};
    float *const out3[3] = {p->q, p->k, p->v};
    const int nmat = a->k_eq_v ? 2 : 3;
    my_rows(p, ln, a->q.rows + a->k.rows + (a->k_eq_v ? 0 : a->v.rows), &r0, &r1);
    stacked_rows(ln, p, nmat, qkv, out3, r0, r1);
    mx_team_sync(&p->team);
    /* B: k heads normed and rotated into the cache, v clipped into it;
     * q heads normed and rotated into qr (q, k, v stay as projected, so
     * the full-width norms can read whole rows) */
    const float c = (float)m->cfg.clip_qkv;
    ln->rfull_t = -1;   /* the cached full-width norm factors are the last layer's */
    long i0, i1;
    mx_split((long)(T * nkv), ln->ith, ln->nth, &i0, &i1);
    for (long i = i0; i < i1; i++) {
        const int64_t t = i / nkv;
        const int g = (int)(i % nkv);
        mx_seq *s = p->ts.seq[t];
        const int pos = p->ts.pos[t];
        head_in(p, ln, l, t, 1, g, mx_kv_at(s, s->k, l, g, pos));
        float *vc = mx_kv_at(s, s->v, l, g, pos);
        /* v: its projection, or (k = v layers) the raw k projection */
        const float *vs = (a->k_eq_v ? p->k : p->v) + t * a->kv_dim + g * hd;
        for (int j = 0; j < hd; j++)
            vc[j] = c > 0 ? fminf(fmaxf(vs[j], -c), c) : vs[j];
        if (a->v_norm) {   /* weightless RMSNorm per head */
            const float r = mx_rms_inv(vc, hd, m->eps);
            for (int j = 0; j < hd; j++)
                vc[j] *= r;
        }
    }
    mx_split((long)(T * nh), ln->ith, ln->nth, &i0, &i1);
    for (long i = i0; i < i1; i++)
        head_in(p, ln, l, i / nh, 0, (int)(i % nh), p->qr + i * hd);
    mx_team_sync(&p->team);
    /* C: attention over the caches.  One token: its heads split evenly
     * (the q heads of one kv head stay together); many: (piece of a run,
     * head) items handed out as they finish, since later positions cost
     * more; a piece's queries read the head's keys and values once
     * (attend_avx512.c) */
    const float scale = a->scale;
    if (T == 1) {
        for (long h = i0; h < i1; h++) {
            mx_seq *s = p->ts.seq[0];
            const int pos = p->ts.pos[0], kvh = (int)h / group;
            mx_attend_head(p->qr + h * hd, mx_kv_at(s, s->k, l, kvh, 0), mx_kv_at(s, s->v, l, kvh, 0),
                           mx_attn_start(a, pos), pos, hd, scale, ln->scores, p->att + h * hd);
            out_gate(p, a, 0, (int)h);
        }
        mx_team_sync(&p->team);
    } else {
        /* (run piece, head) items, the latest pieces (the longest
         * attention) first */
        for (long i; (i = mx_team_next(&p->team)) < (long)(p->n_blk * nh);) {
            const int64_t bk = p->n_blk - 1 - i / nh, t0 = p->blk_t0[bk];
            const int h = (int)(i % nh), kvh = h / group, nq = p->blk_n[bk], pos0 = p->ts.pos[t0];
            mx_seq *s = p->ts.seq[t0];
            int st[MX_ATTEND_RUN];
            for (int b = 0; b < nq; b++)
                st[b] = mx_attn_start(a, pos0 + b);
            const size_t at = ((size_t)t0 * (size_t)nh + (size_t)h) * (size_t)hd, ld = (size_t)nh * (size_t)hd;
            mx_attend_run(p->qr + at, ld, nq, mx_kv_at(s, s->k, l, kvh, 0), mx_kv_at(s, s->v, l, kvh, 0), st,
                          pos0, hd, scale, ln->scores, (size_t)p->ts.max_ctx, p->att + at, ld);
            for (int b = 0; b < nq; b++)
                out_gate(p, a, t0 + b, h);
        }
        mx_team_sync(&p->team);
    }
    /* D: o rows */
    int64_t t0, t1;
    my_tokens(p, ln, &t0, &t1);
    input_ready(p, ln, p->att, a->q_dim, gs_of(&a->o), t0, t1);
    my_rows(p, ln, a->o.rows, &r0, &r1);
    linear_rows(ln, p, &a->o, p->out, m->d, r0, r1);
    mx_team_sync(&p->team);
}

/* ---- recurrent mixers ------------------------------------------------------------ */

static float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* Gated DeltaNet (Qwen3-Next's linear attention): p->out[T, d].
 *   A  in_proj_qkvz and in_proj_ba rows                        barrier
 *   B  the causal convolution + SiLU, channels split            barrier
 *   C  per value head: L2 norms, decay and beta, the delta rule
 *      (chunked over a prompt, token by token otherwise), the
 *      gated RMSNorm with z                                     barrier
 *   D  out_proj rows                                            barrier */
static void deltanet_block(pass *p, lane *ln, int l)
{
    mx_model *m = p->m;
    const mx_deltanet *dn = &m->layers[l].dn;
    const int64_t T = p->T;
    const int dk = dn->dk, dv = dn->dv, r = dn->nv / dn->nk, K = dn->K;
    const int64_t kd = (int64_t)dn->nk * dk, vd = (int64_t)dn->nv * dv, W = 2 * dk + 2 * (int64_t)r * dv;
    const int64_t qkvz_rows = dn->qkvz.rows, ba_rows = dn->ba.rows;
    int64_t r0, r1;
    /* A */
    const mx_linear *lin[2] = {&dn->qkvz, &dn->ba};
    float *const out2[2] = {p->mix_in, p->mix_in2};
    my_rows(p, ln, qkvz_rows + ba_rows, &r0, &r1);
    stacked_rows(ln, p, 2, lin, out2, r0, r1);
    mx_team_sync(&p->team);
    /* B: conv channel c reads its value from the per-key-head grouping of
     * the projection: [q | k | v] flattened, as transformers reorders it */
    long c0, c1;
    mx_split((long)dn->conv_dim, ln->ith, ln->nth, &c0, &c1);
    for (long c = c0; c < c1; c++) {
        int64_t src;
        if (c < kd)
            src = (c / dk) * W + c % dk;
        else if (c < 2 * kd)
            src = ((c - kd) / dk) * W + dk + (c - kd) % dk;
        else {
            const int64_t vc = c - 2 * kd, h = vc / dv;
            src = (h / r) * W + 2 * dk + (h % r) * dv + vc % dv;
        }
        for (int ri = 0; ri < p->n_runs; ri++) {
            const int64_t t0 = p->run_t0[ri];
            mx_seq *s = p->ts.seq[t0];
            float *win = s->state + s->state_off[l] + (size_t)c * (size_t)(K - 1);
            mx_conv_causal(dn->conv_w + c * K, K, 0.0f, win, p->mix_in + t0 * qkvz_rows + src, qkvz_rows,
                           p->run_n[ri], p->mix_conv + t0 * dn->conv_dim + c, dn->conv_dim);
        }
        for (int64_t t = 0; t < T; t++) {
            float *o = p->mix_conv + t * dn->conv_dim + c;
            *o = mx_silu(*o);
        }
    }
    mx_team_sync(&p->team);
    /* C: (run, value head) items */
    const long items = (long)p->n_runs * dn->nv;
    long i0, i1;
    mx_split(items, ln->ith, ln->nth, &i0, &i1);
    for (long it = i0; it < i1; it++) {
        const int ri = (int)(it / dn->nv), h = (int)(it % dn->nv), hk = h / r;
        const int64_t t0 = p->run_t0[ri], n = p->run_n[ri];
        mx_seq *s = p->ts.seq[t0];
        float *q = ln->dn_buf, *k = q + n * dk, *v = k + n * dk, *g = v + n * dv, *beta = g + n;
        float *scr = beta + n;
        const float qs = 1.0f / sqrtf((float)dk), A = expf(dn->A_log[h]);
        for (int64_t i = 0; i < n; i++) {
            const float *cv = p->mix_conv + (t0 + i) * dn->conv_dim;
            memcpy(q + i * dk, cv + hk * dk, sizeof(float) * (size_t)dk);
            memcpy(k + i * dk, cv + kd + hk * dk, sizeof(float) * (size_t)dk);
            memcpy(v + i * dv, cv + 2 * kd + (int64_t)h * dv, sizeof(float) * (size_t)dv);
            mx_l2norm(q + i * dk, dk, 1e-6f);
            mx_l2norm(k + i * dk, dk, 1e-6f);
            for (int a = 0; a < dk; a++)
                q[i * dk + a] *= qs;
            const float *ba = p->mix_in2 + (t0 + i) * ba_rows + (int64_t)hk * 2 * r;
            beta[i] = 1.0f / (1.0f + expf(-ba[h % r]));
            g[i] = -A * softplus(ba[r + h % r] + dn->dt_bias[h]);
        }
        mx_delta_run run = {.n = n, .dk = dk, .dv = dv, .q = q, .k = k, .v = v, .g = g, .beta = beta,
                            .out = p->mix_out + t0 * vd + (int64_t)h * dv, .out_stride = vd};
        float *S = s->state + s->state_off[l] + (size_t)dn->conv_dim * (size_t)(K - 1) +
                   (size_t)h * (size_t)dk * (size_t)dv;
        if (n > 1)
            mx_delta_chunked(&run, S, scr);
        else
            mx_delta_recurrent(&run, S);
        /* the gated RMSNorm: rmsnorm(o) * w * silu(z) */
        for (int64_t i = 0; i < n; i++) {
            float *o = p->mix_out + (t0 + i) * vd + (int64_t)h * dv;
            const float *z = p->mix_in + (t0 + i) * qkvz_rows + hk * W + 2 * dk + (int64_t)r * dv +
                             (int64_t)(h % r) * dv;
            const float rr = mx_rms_inv(o, dv, m->eps);
            for (int e = 0; e < dv; e++)
                o[e] = dn->norm_w[e] * (o[e] * rr) * mx_silu(z[e]);
        }
    }
    mx_team_sync(&p->team);
    /* D */
    int64_t t0, t1;
    my_tokens(p, ln, &t0, &t1);
    input_ready(p, ln, p->mix_out, vd, gs_of(&dn->out), t0, t1);
    my_rows(p, ln, dn->out.rows, &r0, &r1);
    linear_rows(ln, p, &dn->out, p->out, m->d, r0, r1);
    mx_team_sync(&p->team);
}

/* LFM2's short convolution: p->out = out_proj(C * conv(B * x)).
 *   A  in_proj rows (B, C, x)                                   barrier
 *   B  B * x through the causal convolution, times C, channels
 *      split                                                    barrier
 *   C  out_proj rows                                            barrier */
static void shortconv_block(pass *p, lane *ln, int l)
{
    mx_model *m = p->m;
    const mx_shortconv *sc = &m->layers[l].sc;
    const int64_t T = p->T, d = m->d, rows = sc->in.rows;
    int64_t r0, r1;
    my_rows(p, ln, rows, &r0, &r1);
    linear_rows(ln, p, &sc->in, p->mix_in, rows, r0, r1);
    mx_team_sync(&p->team);
    long c0, c1;
    mx_split((long)d, ln->ith, ln->nth, &c0, &c1);
    for (long c = c0; c < c1; c++) {
        for (int64_t t = 0; t < T; t++)   /* B * x */
            p->mix_conv[t * d + c] = p->mix_in[t * rows + c] * p->mix_in[t * rows + 2 * d + c];
        for (int ri = 0; ri < p->n_runs; ri++) {
            const int64_t t0 = p->run_t0[ri];
            mx_seq *s = p->ts.seq[t0];
            float *win = s->state + s->state_off[l] + (size_t)c * (size_t)(sc->L - 1);
            mx_conv_causal(sc->conv_w + c * sc->L, sc->L, sc->conv_b ? sc->conv_b[c] : 0.0f, win,
                           p->mix_conv + t0 * d + c, d, p->run_n[ri], p->mix_out + t0 * d + c, d);
        }
        for (int64_t t = 0; t < T; t++)   /* times C */
            p->mix_out[t * d + c] *= p->mix_in[t * rows + d + c];
    }
    mx_team_sync(&p->team);
    int64_t t0, t1;
    my_tokens(p, ln, &t0, &t1);
    input_ready(p, ln, p->mix_out, d, gs_of(&sc->out), t0, t1);
    my_rows(p, ln, sc->out.rows, &r0, &r1);
    linear_rows(ln, p, &sc->out, p->out, d, r0, r1);
    mx_team_sync(&p->team);
}

/* ---- feed-forward -------------------------------------------------------------------- */

static float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/* The router logits, each token's route and its shared-expert weight.
 * One token: every thread computes all of it on its own (a barrier would
 * cost more than the few rows); many: rows split, then tokens split. */
static void route_tokens(pass *p, lane *ln, const mx_moe_block *b, int l)
{
    const mx_model *m = p->m;
    const int E = m->n_experts;
    float *trace = p->trace && p->trace->router_logits
                       ? p->trace->router_logits + (size_t)l * (size_t)p->T * (size_t)E : NULL;
    if (p->T == 1) {
        linear_rows(ln, p, &b->router, ln->router, E, 0, b->router.rows);
        mx_moe_route(&b->rule, ln->router, E, &ln->route);
        if (b->shared_gated) {
            linear_rows(ln, p, &b->shared_gate, &ln->gate, 1, 0, 1);
            ln->gate = sigmoid(ln->gate);
        }
        if (trace && ln->ith == 0)
            memcpy(trace, ln->router, sizeof(float) * (size_t)E);
        return;
    }
    const mx_linear *rl[2] = {&b->router, &b->shared_gate};
    float *const out[2] = {p->router, p->gate};
    int64_t r0, r1, t0, t1;
    my_rows(p, ln, b->router.rows + (b->shared_gated ? 1 : 0), &r0, &r1);
    stacked_rows(ln, p, b->shared_gated ? 2 : 1, rl, out, r0, r1);
    mx_team_sync(&p->team);
    my_tokens(p, ln, &t0, &t1);
    for (int64_t t = t0; t < t1; t++) {
        mx_moe_route(&b->rule, p->router + t * E, E, &p->routes[t]);
        if (b->shared_gated)
            p->gate[t] = sigmoid(p->gate[t]);
        if (trace)
            memcpy(trace + t * E, p->router + t * E, sizeof(float) * (size_t)E);
    }
    mx_team_sync(&p->team);
}

/* Runs one expert job through the path the dispatch chooses (the same
 * answer on every thread: a pure function of the job); x is the calling
 * thread's prepared input for the fused path.  MoE blocks are counted. */
static int run_job(pass *p, lane *ln, const mx_moe_job *job, mx_vec *x, void *fused_buf, int count)
{
    mx_model *m = p->m;
    const mx_moe_path path = mx_moe_choose(job, NULL);
    int rc = MX_OK;
    if (m->remote && job->ex) {   /* experts spread over processes (src/dist) */
        rc = m->remote->run(m->remote, job, path, x, fused_buf, &p->team, ln->ith, p->e);
    } else if (path == MX_MOE_FUSED) {
        mx_moe_plan plan;
        mx_moe_plan_of(&plan, job);
        mx_moe_fused_team(&plan, x, fused_buf, job->out, &p->team, ln->ith);
    } else {
        rc = mx_moe_gather_team(job, m->gather, &m->moe_arena, &p->team, ln->ith, p->e);
    }
    if (!rc && count && ln->ith == 0)
        mx_moe_count(path, 1);
    return rc;
}

/* Gemma 4's parallel layer: the dense MLP on the normed stream and the
 * routed experts on their own norm of it, routed by rmsnorm(x) * scale /
 * sqrt(d), each branch normed before the sum: *delta gets
 * mlp_out_norm(mlp) + moe_out_norm(experts). */
static int ffn_parallel(pass *p, lane *ln, int l, const float **delta)
{
    mx_model *m = p->m;
    const mx_layer *L = &m->layers[l];
    const mx_moe_block *b = &L->moe;
    const int64_t d = m->d, T = p->T;
    int64_t t0, t1;
    my_tokens(p, ln, &t0, &t1);
    for (int64_t t = t0; t < t1; t++) {
        const float *x = x_at(p, ln, t);
        float *rin = T == 1 ? ln->tmp : p->rin + t * d, *xn2 = T == 1 ? ln->xn2 : p->xn2 + t * d;
        const float r = mx_rms_inv(x, d, m->eps), k = 1.0f / sqrtf((float)d);
        for (int64_t i = 0; i < d; i++)
            rin[i] = x[i] * r * b->router_in_scale[i] * k;
        mx_norm_apply(xn2, x, &L->moe_in_norm, d, m->eps);
    }
    input_ready(p, ln, T == 1 ? ln->tmp : p->rin, d, gs_of(&b->router), t0, t1);
    route_tokens(p, ln, b, l);
    const mx_moe_job dense = {.n_extra = 1, .extra = {&L->mlp}, .act = m->act,
                              .x = T == 1 ? ln->xn : p->xn, .T = T, .d_model = d, .out = p->out2};
    const mx_moe_job moe = {.ex = &b->experts, .routes = T == 1 ? &ln->route : p->routes,
                            .act = m->act, .x = T == 1 ? ln->xn2 : p->xn2, .T = T, .d_model = d,
                            .out = p->out};
    if (T == 1) {
        mx_vec_init(&ln->vec, ln->xn, d, ln->vec_buf);
        mx_vec_init(&ln->vec2, ln->xn2, d, ln->vec2_buf);
    }
    int rc = run_job(p, ln, &dense, &ln->vec, p->fused_buf, 0);
    if (!rc)
        rc = run_job(p, ln, &moe, &ln->vec2, p->fused_buf, 1);
    if (rc)
        return rc;
    /* the branches summed after their norms: one token on every thread's
     * own row (no barrier), many split by token in place */
    for (int64_t t = t0; t < t1; t++) {
        float *comb = T == 1 ? ln->comb : p->out + t * d;
        mx_norm_apply(ln->tmp, p->out2 + t * d, &L->mlp_out_norm, d, m->eps);
        mx_norm_apply(comb, p->out + t * d, &L->moe_out_norm, d, m->eps);
        for (int64_t i = 0; i < d; i++)
            comb[i] += ln->tmp[i];
    }
    *delta = T == 1 ? ln->comb : p->out;
    return MX_OK;
}

/* The layer's feed-forward of the normed stream: routed experts (+ the
 * shared expert, weighted by its gate when it has one), or the dense MLP,
 * or both in parallel.  *delta gets its output rows ([T, d]; for one token
 * of a parallel layer, this thread's own row). */
static int ffn_block(pass *p, lane *ln, int l, const float **delta)
{
    mx_model *m = p->m;
    const mx_layer *L = &m->layers[l];
    if (L->parallel)
        return ffn_parallel(p, ln, l, delta);
    mx_moe_job job = {.x = p->T == 1 ? ln->xn : p->xn, .T = p->T, .d_model = m->d, .out = p->out,
                      .act = m->act};
    if (L->is_moe) {
        const mx_moe_block *b = &L->moe;
        route_tokens(p, ln, b, l);
        job.ex = &b->experts;
        job.routes = p->T == 1 ? &ln->route : p->routes;
        if (b->has_shared) {
            job.extra[job.n_extra] = &b->shared;
            job.extra_w[job.n_extra++] = !b->shared_gated ? NULL : p->T == 1 ? &ln->gate : p->gate;
        }
    } else {
        job.extra[job.n_extra++] = &L->mlp;
    }
    *delta = p->out;
    return run_job(p, ln, &job, &ln->vec, p->fused_buf, L->is_moe);
}

/* x += ffn_out_norm(delta), times the layer's scalar, and the trace's copy
 * of the stream after layer l. */
static void residual_add(pass *p, lane *ln, int l, const float *delta)
{
    const mx_layer *L = &p->m->layers[l];
    int64_t t0, t1;
    my_tokens(p, ln, &t0, &t1);
    for (int64_t t = t0; t < t1; t++) {
        add_row(p, ln, p->T == 1 ? 0 : t, delta, &L->ffn_out_norm);
        if (L->scalar != 1.0f) {
            float *x = x_at(p, ln, t);
            for (int64_t i = 0; i < p->m->d; i++)
                x[i] *= L->scalar;
        }
    }
    trace_hidden(p, ln, l + 1);
}

/* The group size the mixer's first matrices read x with. */
static int mixer_gs(const mx_layer *L)
{
    return gs_of(L->mixer == MX_MIXER_DELTANET    ? &L->dn.qkvz
                 : L->mixer == MX_MIXER_SHORTCONV ? &L->sc.in
                                                  : &L->attn.q);
}

/* The group size the feed-forward's first matrices read x with. */
static int ffn_gs(const mx_layer *L)
{
    return gs_of(L->is_moe && !L->parallel ? &L->moe.router : &L->mlp.gate);
}

/* ---- logits ------------------------------------------------------------------------ */

/* Gemma's final logit soft cap on logits [r0, r1): tanh(z / cap) * cap. */
static void softcap(const mx_model *m, float *logits, int64_t r0, int64_t r1)
{
    if (m->softcap <= 0)
        return;
    for (int64_t r = r0; r < r1; r++)
        logits[r] = tanhf(logits[r] / m->softcap) * m->softcap;
}

/* The final norm and lm_head: every token's logits (all_logits), or the
 * last token's (logits).  The trace's last hidden state is the normed
 * stream. */
static void logits_block(pass *p, lane *ln)
{
    const mx_model *m = p->m;
    const int64_t d = m->d, T = p->T;
    int64_t r0, r1, t0, t1;
    my_tokens(p, ln, &t0, &t1);
    if (p->all_logits || (p->trace && p->trace->hidden)) {
        for (int64_t t = t0; t < t1; t++) {
            mx_norm_apply(xn_at(p, ln, t), x_at(p, ln, t), &m->final_norm, d, m->eps);
            if (p->trace && p->trace->hidden && (T > 1 || ln->ith == 0))
                memcpy(p->trace->hidden + ((size_t)m->n_layers * (size_t)T + (size_t)t) * (size_t)d,
                       xn_at(p, ln, t), sizeof(float) * (size_t)d);
        }
        if (p->all_logits) {
            input_ready(p, ln, T == 1 ? ln->xn : p->xn, d, gs_of(&m->lm_head), t0, t1);
            my_rows(p, ln, m->vocab, &r0, &r1);
            linear_rows(ln, p, &m->lm_head, p->all_logits, m->vocab, r0, r1);
            for (int64_t t = 0; t < T; t++)
                softcap(m, p->all_logits + t * m->vocab, r0, r1);
        }
    }
    if (p->logits) {
        /* the last token alone, as one vector on every thread */
        if (T > 1)
            mx_team_sync(&p->team);
        const float *x = T == 1 ? ln->x : p->x + (T - 1) * d;
        mx_norm_apply(ln->xn, x, &m->final_norm, d, m->eps);
        mx_vec_init(&ln->vec, ln->xn, d, ln->vec_buf);
        long a, b;
        mx_split((long)m->vocab, ln->ith, ln->nth, &a, &b);
        mx_linear_rows(&m->lm_head, &ln->vec, p->logits, a, b);
        softcap(m, p->logits, a, b);
    }
}

/* ---- the pass ------------------------------------------------------------------------ */

/* Every thread runs this: the whole model for the call's tokens. */
static void forward_pass(pass *p, lane *ln)
{
    const mx_model *m = p->m;
    embed_block(p, ln);
    if (p->T > 1)
        mx_team_sync(&p->team);
    int rc = MX_OK;
    for (int l = 0; l < m->n_layers && !rc; l++) {
        const mx_layer *L = &m->layers[l];
        residual_norm(p, ln, NULL, NULL, &L->attn_norm, mixer_gs(L));
        if (L->mixer == MX_MIXER_DELTANET)
            deltanet_block(p, ln, l);
        else if (L->mixer == MX_MIXER_SHORTCONV)
            shortconv_block(p, ln, l);
        else
            attention_block(p, ln, l);
        residual_norm(p, ln, p->out, &L->attn_out_norm, &L->ffn_norm, ffn_gs(L));
        const float *delta;
        rc = ffn_block(p, ln, l, &delta);
        if (!rc)
            residual_add(p, ln, l, delta);
    }
    if (rc) {
        if (ln->ith == 0)
            p->rc = rc;
        return;
    }
    logits_block(p, ln);
}

/* ---- one call ------------------------------------------------------------------------ */

/* One thread of the pool's run: its lane, the team's size, the pass. */
typedef struct pass_run {
    pass *p;
    lane *lanes;
} pass_run;

static void pass_thread(void *arg, int ith, int nth)
{
    pass_run *run = arg;
    lane *ln = &run->lanes[ith];
    ln->nth = nth;   /* the pool may give fewer threads than asked */
    mx_team_join(&run->p->team, nth);
    forward_pass(run->p, ln);
}

/* Bytes of a buffer carved from the arena: counted when a is NULL (the
 * sizing pass), taken otherwise. */
static void *carve(mx_arena *a, size_t *total, size_t bytes)
{
    if (!a) {
        *total += mx_align64(bytes);
        return NULL;
    }
    return mx_arena_take(a, bytes);
}

/* The largest buffer the fused path needs for any layer's one-token job. */
static size_t fused_bytes(const mx_model *m, int nth)
{
    size_t w = 0;
    for (int l = 0; l < m->n_layers; l++) {
        const mx_layer *L = &m->layers[l];
        int64_t extra[1];
        size_t n;
        if (L->is_moe) {
            extra[0] = L->moe.has_shared ? L->moe.shared.gate.rows : 0;
            n = mx_moe_fused_bytes_max(m->d, m->top_k, L->moe.experts.d_ff, extra,
                                       L->moe.has_shared, nth);
            w = n > w ? n : w;
        }
        if (!L->is_moe || L->parallel) {   /* the dense MLP's own job */
            extra[0] = L->mlp.gate.rows;
            n = mx_moe_fused_bytes_max(m->d, 0, 0, extra, 1, nth);
            w = n > w ? n : w;
        }
    }
    return w;
}

/* Lays out the call's buffers: sizes them when a is NULL, else carves them
 * into p and lanes (which *lanes then points at). */
static size_t layout(pass *p, lane **lanes, int nth, mx_arena *a)
{
    const mx_model *m = p->m;
    const int64_t T = p->T, d = m->d, E = m->n_experts > 0 ? m->n_experts : 1;
    int64_t qd = 1, kvd = 1;   /* the widest q and k/v projections of any layer */
    for (int l = 0; l < m->n_layers; l++) {
        const mx_attn *at = &m->layers[l].attn;
        qd = at->q.rows > qd ? at->q.rows : qd;
        kvd = at->kv_dim > kvd ? at->kv_dim : kvd;
    }
    /* the recurrent mixers' widest buffers */
    int64_t w_in = 0, w_in2 = 0, w_conv = 0, w_out = 0, dn_lane = 0;
    for (int l = 0; l < m->n_layers; l++) {
        const mx_layer *L = &m->layers[l];
        if (L->mixer == MX_MIXER_DELTANET) {
            const mx_deltanet *dn = &L->dn;
            w_in = dn->qkvz.rows > w_in ? dn->qkvz.rows : w_in;
            w_in2 = dn->ba.rows > w_in2 ? dn->ba.rows : w_in2;
            w_conv = dn->conv_dim > w_conv ? dn->conv_dim : w_conv;
            w_out = (int64_t)dn->nv * dn->dv > w_out ? (int64_t)dn->nv * dn->dv : w_out;
            const int64_t lanef = T * (2 * dn->dk + dn->dv + 2) + (int64_t)mx_delta_chunk_floats(dn->dk, dn->dv);
            dn_lane = lanef > dn_lane ? lanef : dn_lane;
        } else if (L->mixer == MX_MIXER_SHORTCONV) {
            w_in = L->sc.in.rows > w_in ? L->sc.in.rows : w_in;
            w_conv = d > w_conv ? d : w_conv;
            w_out = d > w_out ? d : w_out;
        }
    }
    const int64_t wide = qd > d ? qd : d;
    size_t total = 0, batch = 0;
    const int64_t widths[3] = {wide, d, w_out};   /* the columns a prepared input can have */
    for (int gs = 32; T > 1 && gs <= 128; gs *= 2)
        for (int i = 0; i < 3; i++) {
            const size_t b = mx_batch_bytes(T, widths[i], gs);
            if (widths[i] > 0 && widths[i] % gs == 0 && b > batch)
                batch = b;
        }
    const size_t f = sizeof(float);
    p->x = carve(a, &total, T > 1 ? (size_t)(T * d) * f : 0);
    p->xn = carve(a, &total, T > 1 ? (size_t)(T * d) * f : 0);
    p->q = carve(a, &total, (size_t)(T * qd) * f);
    p->k = carve(a, &total, (size_t)(T * kvd) * f);
    p->v = carve(a, &total, (size_t)(T * kvd) * f);
    p->qr = carve(a, &total, (size_t)(T * qd) * f);
    p->att = carve(a, &total, (size_t)(T * qd) * f);
    p->mix_in = carve(a, &total, (size_t)(T * w_in) * f);
    p->mix_in2 = carve(a, &total, (size_t)(T * w_in2) * f);
    p->mix_conv = carve(a, &total, (size_t)(T * w_conv) * f);
    p->mix_out = carve(a, &total, (size_t)(T * w_out) * f);
    p->run_t0 = carve(a, &total, (size_t)T * sizeof(int64_t));
    p->run_n = carve(a, &total, (size_t)T * sizeof(int64_t));
    p->blk_t0 = carve(a, &total, (size_t)T * sizeof(int64_t));
    p->blk_n = carve(a, &total, (size_t)T * sizeof(int));
    p->out = carve(a, &total, (size_t)(T * d) * f);
    p->out2 = carve(a, &total, (size_t)(T * d) * f);
    p->rin = carve(a, &total, T > 1 ? (size_t)(T * d) * f : 0);
    p->xn2 = carve(a, &total, T > 1 ? (size_t)(T * d) * f : 0);
    p->router = carve(a, &total, (size_t)(T * E) * f);
    p->gate = carve(a, &total, (size_t)T * f);
    p->routes = carve(a, &total, (size_t)T * sizeof(mx_route));
    p->batch_buf = carve(a, &total, batch);
    p->fused_buf = carve(a, &total, T == 1 ? fused_bytes(m, nth) : 0);
    lane *ls = carve(a, &total, sizeof(lane) * (size_t)nth);
    if (lanes)
        *lanes = ls;
    const size_t vec = mx_vec_bytes(wide > w_out ? wide : w_out);
    for (int i = 0; i < nth; i++) {
        lane tmp, *ln = ls ? &ls[i] : &tmp;
        memset(ln, 0, sizeof *ln);
        ln->ith = i;
        ln->nth = nth;
        ln->rfull_t = -1;
        ln->x = carve(a, &total, (size_t)d * f);
        ln->xn = carve(a, &total, (size_t)d * f);
        ln->tmp = carve(a, &total, (size_t)d * f);
        ln->xn2 = carve(a, &total, (size_t)d * f);
        ln->comb = carve(a, &total, (size_t)d * f);
        ln->vec_buf = carve(a, &total, vec);
        ln->vec2_buf = carve(a, &total, mx_vec_bytes(d));
        ln->dn_buf = carve(a, &total, (size_t)dn_lane * f);
        ln->scores = carve(a, &total, (size_t)(T > 1 ? MX_ATTEND_RUN : 1) * (size_t)p->ts.max_ctx * f);
        ln->router = carve(a, &total, (size_t)E * f);
    }
    return total;
}

/* Below this many bytes of weights per token a one-token call takes well
 * under a millisecond, and its barriers, not its reads, decide whether a
 * second thread helps (util/parallel.h: mx_tuner).  MLXCEL_AUTO_THREADS=0
 * keeps the whole team. */
#define SMALL_MODEL_BYTES (32u << 20)

static int small_model(mx_model *m)
{
    if (!m->tune_on)
        m->tune_on = mx_env_flag("MLXCEL_AUTO_THREADS", 1) && mx_model_active_bytes(m) < SMALL_MODEL_BYTES
                         ? 1 : -1;
    return m->tune_on > 0;
}

/* The shared body of mx_forward and mx_forward_batch. */
static int forward_tokens(mx_model *m, const token_slots *ts, const int32_t *tokens, int64_t T,
                          float *logits, float *all_logits, const mx_forward_trace *trace, mx_err *e)
{
    int nth = mx_threads();
    const int arm = T == 1 && nth > 1 && small_model(m) ? mx_tuner_pick(&m->tune) : -1;
    if (arm == 1)
        nth = 1;
    pass p = {.m = m, .T = T, .tokens = tokens, .ts = *ts, .logits = logits,
              .all_logits = all_logits, .trace = trace, .e = e};
    size_t rope_bytes[MX_MAX_ROPES], need = layout(&p, NULL, nth, NULL);
    for (int r = 0; r < m->n_ropes; r++) {
        rope_bytes[r] = sizeof(float) * (size_t)(T * m->ropes[r].dims);
        need += mx_align64(rope_bytes[r]);
    }
    if (mx_arena_reserve(&m->arena, need))
        return mx_fail(e, MX_ENOMEM, "forward: out of memory for %lld tokens (%zu bytes of scratch)",
                       (long long)T, need);
    lane *lanes;
    layout(&p, &lanes, nth, &m->arena);
    /* runs: consecutive tokens of one sequence at consecutive positions */
    p.n_runs = 0;
    for (int64_t t = 0; t < T; t++) {
        if (t && ts->seq[t] == ts->seq[t - 1] && ts->pos[t] == ts->pos[t - 1] + 1) {
            p.run_n[p.n_runs - 1]++;
            continue;
        }
        p.run_t0[p.n_runs] = t;
        p.run_n[p.n_runs++] = 1;
    }
    p.n_blk = 0;
    for (int r = 0; r < p.n_runs; r++)
        for (int64_t t = 0; t < p.run_n[r]; t += MX_ATTEND_RUN) {
            p.blk_t0[p.n_blk] = p.run_t0[r] + t;
            p.blk_n[p.n_blk++] = (int)(p.run_n[r] - t < MX_ATTEND_RUN ? p.run_n[r] - t : MX_ATTEND_RUN);
        }
    /* each rope's cos/sin per token; LongRoPE switches to its long factors
     * for a call whose last position is past the original context, as
     * transformers does per forward call */
    int last = 0;
    for (int64_t t = 0; t < T; t++)
        last = ts->pos[t] > last ? ts->pos[t] : last;
    for (int r = 0; r < m->n_ropes; r++) {
        const mx_rope *ro = &m->ropes[r];
        float *cs = mx_arena_take(&m->arena, rope_bytes[r]);
        const int longf = ro->inv_freq_long && last + 1 > ro->orig_max;
        for (int64_t t = 0; t < T; t++)
            mx_rope_table(cs + t * ro->dims, ro, ts->pos[t], longf);
        p.rope[r] = cs;
    }
    mx_team_init(&p.team);
    pass_run run = {&p, lanes};
    const double t0 = arm >= 0 ? mx_now() : 0;
    mx_pool_run(nth, pass_thread, &run);
    if (arm >= 0)
        mx_tuner_record(&m->tune, arm, mx_now() - t0);
    return p.rc;
}

static int check_tokens(const mx_model *m, const int32_t *tokens, int n, mx_err *e)
{
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= m->vocab)
            return mx_fail(e, MX_ERANGE, "token id %d at position %d is outside the vocabulary (0..%d)",
                           tokens[i], i, m->vocab - 1);
    return MX_OK;
}

int mx_forward(mx_model *m, mx_seq *s, const int32_t *tokens, int n, float *logits,
               const mx_forward_trace *trace, mx_err *e)
{
    if (n <= 0)
        return mx_fail(e, MX_EINVAL, "forward: no tokens");
    if (s->m != m)
        return mx_fail(e, MX_EINVAL, "forward: sequence belongs to another model");
    if (s->pos + n > s->n_ctx)
        return mx_fail(e, MX_ERANGE, "context full: %d tokens in the cache + %d new > context size %d",
                       s->pos, n, s->n_ctx);
    int rc = check_tokens(m, tokens, n, e);
    if (rc)
        return rc;
    if (m->backend) {
        rc = m->backend->forward(m->backend_ctx, s, tokens, n, logits, trace, e);
        if (!rc)
            s->pos += n;
        return rc;
    }
    /* small calls use the stack: no allocation per token */
    mx_seq *seq_small[64];
    int pos_small[64];
    mx_seq **seqs = n <= 64 ? seq_small : malloc(sizeof *seqs * (size_t)n);
    int *pos = n <= 64 ? pos_small : malloc(sizeof *pos * (size_t)n);
    if (!seqs || !pos) {
        if (n > 64)
            free(seqs), free(pos);
        return mx_fail(e, MX_ENOMEM, "forward: out of memory for %d tokens", n);
    }
    for (int t = 0; t < n; t++) {
        seqs[t] = s;
        pos[t] = s->pos + t;
    }
    token_slots ts = {seqs, pos, s->n_ctx};
    rc = forward_tokens(m, &ts, tokens, n, logits, trace ? trace->all_logits : NULL, trace, e);
    if (!rc)
        s->pos += n;
    if (n > 64)
        free(seqs), free(pos);
    return rc;
}

int mx_forward_batch(mx_model *m, mx_seq *const *seqs, const int32_t *tokens, int n, float *logits,
                     mx_err *e)
{
    if (n <= 0)
        return mx_fail(e, MX_EINVAL, "forward: no sequences");
    int max_ctx = 0;
    for (int i = 0; i < n; i++) {
        if (seqs[i]->m != m)
            return mx_fail(e, MX_EINVAL, "forward: sequence %d belongs to another model", i);
        if (seqs[i]->pos + 1 > seqs[i]->n_ctx)
            return mx_fail(e, MX_ERANGE, "context full in sequence %d (%d tokens)", i, seqs[i]->n_ctx);
        for (int j = 0; j < i; j++)
            if (seqs[j] == seqs[i])
                return mx_fail(e, MX_EINVAL, "forward: sequence %d appears twice in a batch", i);
        if (seqs[i]->n_ctx > max_ctx)
            max_ctx = seqs[i]->n_ctx;
    }
    int rc = check_tokens(m, tokens, n, e);
    if (rc)
        return rc;
    if (m->backend && m->backend->forward_batch && n > 1) {   /* one step for all of them */
        if (!(rc = m->backend->forward_batch(m->backend_ctx, seqs, tokens, n, logits, e)))
            for (int i = 0; i < n; i++)
                seqs[i]->pos++;
        return rc;
    }
    if (m->backend) {   /* one sequence at a time on a backend without a batched step */
        for (int i = 0; i < n && !rc; i++)
            if (!(rc = m->backend->forward(m->backend_ctx, seqs[i], &tokens[i], 1,
                                           logits + (size_t)i * (size_t)m->vocab, NULL, e)))
                seqs[i]->pos++;
        return rc;
    }
    int pos_small[64];
    int *pos = n <= 64 ? pos_small : malloc(sizeof *pos * (size_t)n);
    if (!pos)
        return mx_fail(e, MX_ENOMEM, "forward: out of memory");
    for (int i = 0; i < n; i++)
        pos[i] = seqs[i]->pos;
    token_slots ts = {seqs, pos, max_ctx};
    rc = forward_tokens(m, &ts, tokens, n, NULL, logits, NULL, e);
    if (!rc)
        for (int i = 0; i < n; i++)
            seqs[i]->pos++;
    if (n > 64)
        free(pos);
    return rc;
}
