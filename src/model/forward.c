/* forward.c - the forward pass: tokens in, logits out.
 *
 *   x = embed(tokens)
 *   for each layer:  x += attention(rmsnorm(x))     attention_block()
 *                    x += ffn(rmsnorm(x))            ffn_block(): MoE or MLP
 *   logits = lm_head(rmsnorm(x))
 *
 * Every block works on T tokens at once: T = prompt length for prefill,
 * a batched decode step, or a traced single token.  The plain single-token
 * decode step, when the fused MoE path takes the model, runs the same
 * sequence of blocks inside one parallel region instead (decode.c).  The
 * small ops and their numerics are in ops.h. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "model/family.h"
#include "model/model.h"
#include "model/ops.h"
#include "util/half.h"
#include "util/parallel.h"

/* y[T, rows] = W x (+ bias): matvec for one token, matmul for many. */
static void linear(const mx_linear *l, const float *x, int64_t T, float *y)
{
    if (T == 1)
        mx_linear_matvec(l, x, y);
    else
        mx_linear_matmul(l, x, T, y);
}

/* ---- attention ---------------------------------------------------------- */

/* Where each of the T tokens of a forward call goes: its sequence and its
 * position there.  A prompt is one sequence at consecutive positions; a
 * batched decode step is one token of each of several sequences. */
typedef struct token_slots {
    mx_seq *const *seq;
    const int *pos;
    int max_ctx;
    float *rope;            /* [T][head_dim] cos/sin pairs for each token */
} token_slots;

/* out[T, d] = o_proj(softmax(q k^T / sqrt(hd)) v) for the T tokens, after
 * writing their k and v into their sequences' caches. */
static void attention_block(mx_model *m, int l, const token_slots *ts, const float *xn, int64_t T,
                            float *q, float *k, float *v, float *att, float *scores, float *out)
{
    const mx_attn *a = &m->layers[l].attn;
    const int hd = m->head_dim, nh = m->n_heads, nkv = m->n_kv, group = nh / nkv;
    linear(&a->q, xn, T, q);
    linear(&a->k, xn, T, k);
    linear(&a->v, xn, T, v);
    if (m->cfg.clip_qkv > 0) {
        const float c = (float)m->cfg.clip_qkv;
        for (int64_t i = 0; i < T * m->q_dim; i++)
            q[i] = fminf(fmaxf(q[i], -c), c);
        for (int64_t i = 0; i < T * m->kv_dim; i++) {
            k[i] = fminf(fmaxf(k[i], -c), c);
            v[i] = fminf(fmaxf(v[i], -c), c);
        }
    }
    for (int64_t t = 0; t < T; t++) {
        float *qt = q + t * m->q_dim, *kt = k + t * m->kv_dim, *vt = v + t * m->kv_dim;
        const mx_seq *s = ts->seq[t];
        const int pos = ts->pos[t];
        if (m->fam->qk_norm == MX_QK_NORM_FULL) {
            mx_rmsnorm(qt, qt, a->q_norm, m->q_dim, m->eps);
            mx_rmsnorm(kt, kt, a->k_norm, m->kv_dim, m->eps);
        }
        for (int h = 0; h < nh; h++) {
            if (m->fam->qk_norm == MX_QK_NORM_HEAD)
                mx_rmsnorm(qt + h * hd, qt + h * hd, a->q_norm, hd, m->eps);
            mx_rope(qt + h * hd, hd, ts->rope + t * hd);
        }
        for (int h = 0; h < nkv; h++) {
            if (m->fam->qk_norm == MX_QK_NORM_HEAD)
                mx_rmsnorm(kt + h * hd, kt + h * hd, a->k_norm, hd, m->eps);
            mx_rope(kt + h * hd, hd, ts->rope + t * hd);
            memcpy(mx_kv_at(s, s->k, l, h, pos), kt + h * hd, sizeof(float) * (size_t)hd);
            memcpy(mx_kv_at(s, s->v, l, h, pos), vt + h * hd, sizeof(float) * (size_t)hd);
        }
    }

    const float scale = 1.0f / sqrtf((float)hd);
#pragma omp parallel for num_threads(mx_threads()) schedule(dynamic, 1)
    for (int64_t th = 0; th < T * nh; th++) {
        const int64_t t = th / nh;
        const int h = (int)(th % nh), kvh = h / group;
        const mx_seq *s = ts->seq[t];
        const int pos = ts->pos[t];
        float *sc = scores + (size_t)omp_get_thread_num() * (size_t)ts->max_ctx;
        mx_attend_head(q + t * m->q_dim + h * hd, mx_kv_at(s, s->k, l, kvh, 0),
                       mx_kv_at(s, s->v, l, kvh, 0), mx_attn_start(m, pos), pos, hd, scale, sc,
                       att + t * m->q_dim + h * hd);
    }
    linear(&a->o, att, T, out);
}

/* ---- feed-forward -------------------------------------------------------- */

/* out = down(silu(gate x) * up x) for T tokens; g and u hold T * ff. */
static void mlp_block(const mx_mlp *p, const float *xn, int64_t T, float *g, float *u, float *out)
{
    linear(&p->gate, xn, T, g);
    linear(&p->up, xn, T, u);
    const int64_t n = T * p->gate.rows;
    for (int64_t i = 0; i < n; i++)
        g[i] = mx_silu(g[i]) * u[i];
    linear(&p->down, g, T, out);
}

typedef struct ffn_scratch {
    float *router_logits;   /* [T, E] */
    mx_route *routes;       /* [T] */
    float *g, *u;           /* [T, max ff] */
    float *shared_out;      /* [T, d] */
    float *shared_gate;     /* [T] */
} ffn_scratch;

/* out[T, d] = routed experts (+ gated shared expert), or the dense MLP. */
static int ffn_block(mx_model *m, int l, const float *xn, int64_t T, ffn_scratch *fs, float *out,
                     float *trace_router, mx_err *e)
{
    const mx_layer *L = &m->layers[l];
    if (!L->is_moe) {
        mlp_block(&L->mlp, xn, T, fs->g, fs->u, out);
        return MX_OK;
    }
    const mx_moe_block *b = &L->moe;
    const int E = m->n_experts;
    linear(&b->router, xn, T, fs->router_logits);
    if (trace_router)
        memcpy(trace_router, fs->router_logits, sizeof(float) * (size_t)(T * E));
    for (int64_t t = 0; t < T; t++)
        mx_moe_route(fs->router_logits + t * E, E, m->top_k, m->norm_topk, &fs->routes[t]);
    int rc = mx_moe_experts(&b->experts, fs->routes, xn, T, out, e);
    if (rc)
        return rc;
    if (b->has_shared) {
        mlp_block(&b->shared, xn, T, fs->g, fs->u, fs->shared_out);
        linear(&b->shared_gate, xn, T, fs->shared_gate);
        for (int64_t t = 0; t < T; t++) {
            const float gate = 1.0f / (1.0f + expf(-fs->shared_gate[t]));
            for (int i = 0; i < m->d; i++)
                out[t * m->d + i] += gate * fs->shared_out[t * m->d + i];
        }
    }
    return MX_OK;
}

/* ---- embedding and the whole pass --------------------------------------- */

static int64_t max_ff(const mx_model *m)
{
    int64_t f = 1;
    for (int l = 0; l < m->n_layers; l++) {
        const mx_layer *L = &m->layers[l];
        int64_t w = L->is_moe ? (L->moe.has_shared ? L->moe.shared.gate.rows : 0) : L->mlp.gate.rows;
        if (w > f)
            f = w;
    }
    return f;
}

static float *grow_scratch(mx_model *m, size_t n)
{
    if (n > m->scratch_cap) {
        free(m->scratch);
        m->scratch = malloc(n * sizeof(float));
        m->scratch_cap = m->scratch ? n : 0;
    }
    return m->scratch;
}

/* The shared body of mx_forward and mx_forward_batch.  When all_logits is
 * set every token's logits are written ([T, vocab]); else only the last
 * token's, to logits (when not NULL). */
static int forward_tokens(mx_model *m, const token_slots *ts, const int32_t *tokens, int64_t T,
                          float *logits, float *all_logits, const mx_forward_trace *trace, mx_err *e)
{
    const int64_t d = m->d, E = m->n_experts > 0 ? m->n_experts : 1, ff = max_ff(m);
    const int nth = mx_threads();
    const size_t route_floats = (sizeof(mx_route) + sizeof(float) - 1) / sizeof(float);
    size_t need = (size_t)(T * (4 * d + 2 * m->q_dim + 2 * m->kv_dim + E + 2 * ff + 1 + m->head_dim)) +
                  (size_t)nth * (size_t)ts->max_ctx + (size_t)T * route_floats + (size_t)d;
    float *p = grow_scratch(m, need);
    if (!p)
        return mx_fail(e, MX_ENOMEM, "forward: out of memory for %lld tokens", (long long)T);
    float *x = p; p += T * d;
    float *xn = p; p += T * d;
    float *tmp = p; p += T * d;
    float *q = p; p += T * m->q_dim;
    float *att = p; p += T * m->q_dim;
    float *k = p; p += T * m->kv_dim;
    float *v = p; p += T * m->kv_dim;
    float *scores = p; p += (size_t)nth * (size_t)ts->max_ctx;
    ffn_scratch fs;
    fs.router_logits = p; p += T * E;
    fs.g = p; p += T * ff;
    fs.u = p; p += T * ff;
    fs.shared_out = p; p += T * d;
    fs.shared_gate = p; p += T;
    fs.routes = (mx_route *)p; p += T * route_floats;
    float *last = p; p += d;
    float *rope_cs = p;

    for (int64_t t = 0; t < T; t++) {
        mx_embed_row(m, tokens[t], x + t * d);
        mx_rope_table(rope_cs + t * m->head_dim, m->head_dim, ts->pos[t], m->rope_inv_freq);
    }
    token_slots slots = *ts;
    slots.rope = rope_cs;
    ts = &slots;
    if (trace && trace->hidden)
        memcpy(trace->hidden, x, sizeof(float) * (size_t)(T * d));

    for (int l = 0; l < m->n_layers; l++) {
        const mx_layer *L = &m->layers[l];
        for (int64_t t = 0; t < T; t++)
            mx_rmsnorm(xn + t * d, x + t * d, L->attn_norm, d, m->eps);
        attention_block(m, l, ts, xn, T, q, k, v, att, scores, tmp);
        for (int64_t i = 0; i < T * d; i++)
            x[i] += tmp[i];
        for (int64_t t = 0; t < T; t++)
            mx_rmsnorm(xn + t * d, x + t * d, L->ffn_norm, d, m->eps);
        float *tr = trace && trace->router_logits ? trace->router_logits + (size_t)l * T * E : NULL;
        int rc = ffn_block(m, l, xn, T, &fs, tmp, tr, e);
        if (rc)
            return rc;
        for (int64_t i = 0; i < T * d; i++)
            x[i] += tmp[i];
        if (trace && trace->hidden && l + 1 < m->n_layers)
            memcpy(trace->hidden + (size_t)(l + 1) * T * d, x, sizeof(float) * (size_t)(T * d));
    }

    if (all_logits || (trace && trace->hidden)) {
        for (int64_t t = 0; t < T; t++)
            mx_rmsnorm(xn + t * d, x + t * d, m->final_norm, d, m->eps);
        if (trace && trace->hidden)
            memcpy(trace->hidden + (size_t)m->n_layers * T * d, xn, sizeof(float) * (size_t)(T * d));
        if (all_logits)
            linear(&m->lm_head, xn, T, all_logits);
    }
    if (logits) {
        mx_rmsnorm(last, x + (T - 1) * d, m->final_norm, d, m->eps);
        mx_linear_matvec(&m->lm_head, last, logits);
    }
    return MX_OK;
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
    if (n == 1 && !trace && mx_decode_ok(m)) {
        rc = mx_decode_token(m, s, tokens[0], logits, e);
        if (!rc)
            s->pos++;
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
    token_slots ts = {seqs, pos, s->n_ctx, NULL};
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
    int pos_small[64];
    int *pos = n <= 64 ? pos_small : malloc(sizeof *pos * (size_t)n);
    if (!pos)
        return mx_fail(e, MX_ENOMEM, "forward: out of memory");
    for (int i = 0; i < n; i++)
        pos[i] = seqs[i]->pos;
    token_slots ts = {seqs, pos, max_ctx, NULL};
    rc = forward_tokens(m, &ts, tokens, n, NULL, logits, NULL, e);
    if (!rc)
        for (int i = 0; i < n; i++)
            seqs[i]->pos++;
    if (n > 64)
        free(pos);
    return rc;
}
