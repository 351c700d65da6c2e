/* decode.c - one decoded token through the whole model in one parallel
 * region.
 *
 * A decoded token is a few hundred matrix-vector products (per layer q, k,
 * v, o, the router, the routed and shared experts; then lm_head).  Run as
 * separate parallel regions (forward.c), each would fork and join and leave
 * the other cores idle through the serial bits between them.  Here the
 * threads enter once per token and meet only where a step needs another
 * thread's results:
 *
 *   every thread keeps its own copy of the residual stream x, its norm and
 *   the norm's prepared form (the same computation, so the same bits), and
 *   per layer:
 *     A  q, k, v: rows split over the threads                  barrier
 *     B  per kv head: k norm, RoPE, cache write; per q head:
 *        q norm, RoPE (into qr)                                barrier
 *     C  attention, q heads split                              barrier
 *     D  o rows split                                          barrier
 *        x += o; xn = norm(x); router logits (every thread, all rows: a
 *        barrier would cost more than 60 rows); route
 *     E  fused MoE phase 1: gate/up rows of the k experts and the shared
 *        expert (or the dense MLP)                             barrier
 *     F  fused MoE phase 2: output rows split                  barrier
 *        x += moe
 *   final norm; lm_head rows split.
 *
 * The MoE block is the fused kernel's two phases (moe/fused.c), with the
 * shared expert as one more expert weighted by its sigmoid gate.  Used when
 * the fused path is enabled and takes every MoE layer; otherwise decode goes
 * through forward.c, whose MoE block takes the gather path. */
#include <omp.h>
#include <stdlib.h>

#include "model/family.h"
#include "model/ops.h"
#include "util/parallel.h"

int mx_decode_ok(const mx_model *m)
{
    if (!mx_moe_fused_enabled())
        return 0;
    for (int l = 0; l < m->n_layers; l++)
        if (m->layers[l].is_moe && mx_moe_fused_declines(&m->layers[l].moe.experts))
            return 0;
    return 1;
}

static size_t al64(size_t n) { return (n + 63) & ~(size_t)63; }

/* Widest h of one token's MoE block (or dense MLP): sum of expert widths. */
static int64_t max_h(const mx_model *m)
{
    int64_t w = 1;
    for (int l = 0; l < m->n_layers; l++) {
        const mx_layer *L = &m->layers[l];
        int64_t n = L->is_moe ? (int64_t)m->top_k * L->moe.experts.d_ff +
                                    (L->moe.has_shared ? L->moe.shared.gate.rows : 0)
                              : L->mlp.gate.rows;
        if (n > w)
            w = n;
    }
    return w;
}

/* The step's memory: shared buffers, then one block per thread. */
typedef struct dec_mem {
    float *q, *k, *v, *qr, *att, *o, *out, *h, *u;   /* shared */
    unsigned char *thread0;                            /* per-thread blocks */
    size_t per_thread;
} dec_mem;

/* A thread's own block. */
typedef struct dec_thread {
    float *x, *xn, *scores, *rope, *router;
    unsigned char *xv_buf, *att_buf, *p2_buf;
} dec_thread;

/* Largest phase-2 scratch of any layer: the row buffer and one prepared h
 * per expert (as mx_moe_phase2_bytes lays it out). */
static size_t max_p2(const mx_model *m)
{
    size_t w = 0;
    for (int l = 0; l < m->n_layers; l++) {
        const mx_layer *L = &m->layers[l];
        size_t n = al64((size_t)m->d * sizeof(float));
        if (L->is_moe) {
            n += (size_t)m->top_k * al64(mx_vec_bytes(L->moe.experts.d_ff));
            if (L->moe.has_shared)
                n += al64(mx_vec_bytes(L->moe.shared.gate.rows));
        } else {
            n += al64(mx_vec_bytes(L->mlp.gate.rows));
        }
        if (n > w)
            w = n;
    }
    return w;
}

static size_t thread_bytes(const mx_model *m, int n_ctx)
{
    const int64_t d = m->d;
    size_t p2 = max_p2(m);
    return 2 * al64((size_t)d * sizeof(float)) + al64((size_t)n_ctx * sizeof(float)) +
           al64((size_t)m->head_dim * sizeof(float)) +
           al64((size_t)(m->n_experts > 0 ? m->n_experts : 1) * sizeof(float)) +
           al64(mx_vec_bytes(d)) + al64(mx_vec_bytes(m->q_dim)) + p2;
}

static dec_thread thread_mem(const mx_model *m, const dec_mem *dm, int ith, int n_ctx)
{
    unsigned char *p = dm->thread0 + dm->per_thread * (size_t)ith;
    dec_thread t;
#define TAKE(ptr, type, bytes) (ptr = (type)(void *)p, p += al64(bytes))
    TAKE(t.x, float *, (size_t)m->d * sizeof(float));
    TAKE(t.xn, float *, (size_t)m->d * sizeof(float));
    TAKE(t.scores, float *, (size_t)n_ctx * sizeof(float));
    TAKE(t.rope, float *, (size_t)m->head_dim * sizeof(float));
    TAKE(t.router, float *, (size_t)(m->n_experts > 0 ? m->n_experts : 1) * sizeof(float));
    TAKE(t.xv_buf, unsigned char *, mx_vec_bytes(m->d));
    TAKE(t.att_buf, unsigned char *, mx_vec_bytes(m->q_dim));
    t.p2_buf = p;
#undef TAKE
    return t;
}

static int dec_alloc(mx_model *m, int n_ctx, int nth, dec_mem *dm, mx_err *e)
{
    const int64_t hmax = max_h(m);
    const size_t qb = al64((size_t)m->q_dim * sizeof(float)),
                 kb = al64((size_t)m->kv_dim * sizeof(float)),
                 db = al64((size_t)m->d * sizeof(float)), hb = al64((size_t)hmax * sizeof(float));
    const size_t shared = 3 * qb + 2 * kb + 2 * db + 2 * hb;
    dm->per_thread = al64(thread_bytes(m, n_ctx));
    const size_t need = shared + dm->per_thread * (size_t)nth;
    if (need > m->dec_cap) {
        free(m->dec_buf);
        m->dec_buf = aligned_alloc(64, al64(need));
        m->dec_cap = m->dec_buf ? need : 0;
        if (!m->dec_buf)
            return mx_fail(e, MX_ENOMEM, "decode: out of memory for %zu bytes of scratch", need);
    }
    unsigned char *p = m->dec_buf;
    dm->q = (float *)(void *)p, p += qb;
    dm->qr = (float *)(void *)p, p += qb;
    dm->att = (float *)(void *)p, p += qb;
    dm->k = (float *)(void *)p, p += kb;
    dm->v = (float *)(void *)p, p += kb;
    dm->o = (float *)(void *)p, p += db;
    dm->out = (float *)(void *)p, p += db;
    dm->h = (float *)(void *)p, p += hb;
    dm->u = (float *)(void *)p, p += hb;
    dm->thread0 = p;
    return MX_OK;
}

/* Rows [lo, hi) of the rows of a, b, c stacked (q, k and v). */
static void rows3(const mx_linear *a, const mx_linear *b, const mx_linear *c, mx_vec *x,
                  float *ya, float *yb, float *yc, long lo, long hi)
{
    const mx_linear *l[3] = {a, b, c};
    float *y[3] = {ya, yb, yc};
    long base = 0;
    for (int i = 0; i < 3; i++) {
        const long n = (long)l[i]->rows, r0 = lo > base ? lo - base : 0,
                   r1 = hi < base + n ? hi - base : n;
        if (r1 > r0)
            mx_linear_rows(l[i], x, y[i], r0, r1);
        base += n;
    }
}

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

/* One head vector of the q or k projection as attention uses it: clipped,
 * normed (per head, or with the full-width factor rfull), rotated. */
static void head_in(const mx_model *m, const float *src, const float *norm, int head, float rfull,
                    const float *rope, float *dst)
{
    const int hd = m->head_dim;
    const float c = (float)m->cfg.clip_qkv;
    for (int i = 0; i < hd; i++)
        dst[i] = c > 0 ? fminf(fmaxf(src[i], -c), c) : src[i];
    if (m->fam->qk_norm == MX_QK_NORM_HEAD)
        mx_rmsnorm(dst, dst, norm, hd, m->eps);
    else if (m->fam->qk_norm == MX_QK_NORM_FULL)
        for (int i = 0; i < hd; i++)
            dst[i] = norm[head * hd + i] * (dst[i] * rfull);
    mx_rope(dst, hd, rope);
}

/* Steps A-D: out (shared, d) = o_proj(attention(xn)) for the token at pos. */
static void attention_step(mx_model *m, int l, mx_seq *s, int pos, const dec_mem *dm,
                           const dec_thread *t, mx_vec *xv, int ith, int nth)
{
    const mx_attn *a = &m->layers[l].attn;
    const int hd = m->head_dim, nh = m->n_heads, nkv = m->n_kv, group = nh / nkv;
    long lo, hi;
    /* A: q, k, v rows.  Static even splits: handing out row chunks
     * dynamically measured 8% slower (shorter weight streams, the two cores
     * interleaved over the same rows). */
    mx_split((long)(a->q.rows + a->k.rows + a->v.rows), ith, nth, &lo, &hi);
    rows3(&a->q, &a->k, &a->v, xv, dm->q, dm->k, dm->v, lo, hi);
#pragma omp barrier
    /* B: the heads as attention reads them; q, k, v stay untouched so the
     * full-width norms can read all of them */
    const float c = (float)m->cfg.clip_qkv;
    float rq = 1.0f, rk = 1.0f;
    if (m->fam->qk_norm == MX_QK_NORM_FULL) {
        rq = rms_inv_clipped(dm->q, m->q_dim, c, m->eps);
        rk = rms_inv_clipped(dm->k, m->kv_dim, c, m->eps);
    }
    mx_split((long)nkv, ith, nth, &lo, &hi);
    for (long g = lo; g < hi; g++) {
        head_in(m, dm->k + g * hd, a->k_norm, (int)g, rk, t->rope, mx_kv_at(s, s->k, l, (int)g, pos));
        float *vc = mx_kv_at(s, s->v, l, (int)g, pos);
        const float *vs = dm->v + g * hd;
        for (int i = 0; i < hd; i++)
            vc[i] = c > 0 ? fminf(fmaxf(vs[i], -c), c) : vs[i];
    }
    mx_split((long)nh, ith, nth, &lo, &hi);
    for (long h = lo; h < hi; h++)
        head_in(m, dm->q + h * hd, a->q_norm, (int)h, rq, t->rope, dm->qr + h * hd);
#pragma omp barrier
    /* C: attention over the cache, q heads split */
    const float scale = 1.0f / sqrtf((float)hd);
    for (long h = lo; h < hi; h++) {
        const int kvh = (int)h / group;
        mx_attend_head(dm->qr + h * hd, mx_kv_at(s, s->k, l, kvh, 0), mx_kv_at(s, s->v, l, kvh, 0),
                       mx_attn_start(m, pos), pos, hd, scale, t->scores, dm->att + h * hd);
    }
#pragma omp barrier
    /* D: o rows */
    mx_vec av;
    mx_vec_init(&av, dm->att, m->q_dim, t->att_buf);
    mx_split((long)a->o.rows, ith, nth, &lo, &hi);
    mx_linear_rows(&a->o, &av, dm->o, lo, hi);
#pragma omp barrier
}

/* Steps E-F: dm->out (shared, d) = the MoE block (or dense MLP) of xn. */
static void ffn_step(const mx_model *m, int l, const dec_mem *dm, const dec_thread *t, mx_vec *xv,
                     int ith, int nth)
{
    const mx_layer *L = &m->layers[l];
    mx_moe_plan plan;
    if (L->is_moe) {
        const mx_moe_block *b = &L->moe;
        mx_linear_rows(&b->router, xv, t->router, 0, b->router.rows);
        mx_route r;
        mx_moe_route(t->router, m->n_experts, m->top_k, m->norm_topk, &r);
        mx_moe_plan_init(&plan, &b->experts, &r);
        if (b->has_shared) {
            float g;
            mx_linear_rows(&b->shared_gate, xv, &g, 0, 1);
            mx_moe_plan_add(&plan, &b->shared.gate, &b->shared.up, &b->shared.down,
                            1.0f / (1.0f + expf(-g)));
        }
    } else {
        plan.n = 0;
        plan.off[0] = 0;
        mx_moe_plan_add(&plan, &L->mlp.gate, &L->mlp.up, &L->mlp.down, 1.0f);
    }
    long lo, hi;
    mx_split((long)plan.off[plan.n], ith, nth, &lo, &hi);
    mx_moe_phase1(&plan, xv, dm->h, dm->u, lo, hi);
#pragma omp barrier
    mx_moe_hvecs hv;
    mx_moe_phase2_init(&plan, dm->h, t->p2_buf, &hv);
    mx_split((long)plan.d_model, ith, nth, &lo, &hi);
    mx_moe_phase2(&plan, &hv, dm->out, lo, hi);
#pragma omp barrier
}

int mx_decode_token(mx_model *m, mx_seq *s, int32_t token, float *logits, mx_err *e)
{
    const int nth = mx_threads(), pos = s->pos, d = m->d;
    dec_mem dm;
    int rc = dec_alloc(m, s->n_ctx, nth, &dm, e);
    if (rc)
        return rc;
    long moe_layers = 0;
    for (int l = 0; l < m->n_layers; l++)
        moe_layers += m->layers[l].is_moe;
#pragma omp parallel num_threads(nth)
    {
        const int ith = omp_get_thread_num(), nt = omp_get_num_threads();
        const dec_thread t = thread_mem(m, &dm, ith, s->n_ctx);
        mx_embed_row(m, token, t.x);
        mx_rope_table(t.rope, m->head_dim, pos, m->rope_inv_freq);
        mx_vec xv;
        for (int l = 0; l < m->n_layers; l++) {
            const mx_layer *L = &m->layers[l];
            mx_rmsnorm(t.xn, t.x, L->attn_norm, d, m->eps);
            mx_vec_init(&xv, t.xn, d, t.xv_buf);
            attention_step(m, l, s, pos, &dm, &t, &xv, ith, nt);
            for (int i = 0; i < d; i++)
                t.x[i] += dm.o[i];
            mx_rmsnorm(t.xn, t.x, L->ffn_norm, d, m->eps);
            mx_vec_init(&xv, t.xn, d, t.xv_buf);
            ffn_step(m, l, &dm, &t, &xv, ith, nt);
            for (int i = 0; i < d; i++)
                t.x[i] += dm.out[i];
        }
        if (logits) {
            mx_rmsnorm(t.xn, t.x, m->final_norm, d, m->eps);
            mx_vec_init(&xv, t.xn, d, t.xv_buf);
            long lo, hi;
            mx_split((long)m->lm_head.rows, ith, nt, &lo, &hi);
            mx_linear_rows(&m->lm_head, &xv, logits, lo, hi);
        }
    }
    mx_moe_count_fused(moe_layers);
    return MX_OK;
}
