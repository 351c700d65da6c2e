/* seq.c - per-sequence state (KV cache + position) and model size facts. */
#include <stdlib.h>
#include <string.h>

#include "model/model.h"

/* Floats of layer l's K (or V) cache for n_ctx positions (0 for layers
 * without attention). */
static size_t layer_kv_floats(const mx_model *m, int l, int n_ctx)
{
    const mx_layer *L = &m->layers[l];
    if (L->mixer != MX_MIXER_ATTENTION)
        return 0;
    return (size_t)L->attn.n_kv * (size_t)n_ctx * (size_t)L->attn.head_dim;
}

/* Floats of layer l's recurrent state: the convolution window (the last
 * K-1 inputs of each channel) and, for DeltaNet, each value head's
 * dk x dv matrix. */
static size_t layer_state_floats(const mx_model *m, int l)
{
    const mx_layer *L = &m->layers[l];
    if (L->mixer == MX_MIXER_DELTANET)
        return (size_t)L->dn.conv_dim * (size_t)(L->dn.K - 1) +
               (size_t)L->dn.nv * (size_t)L->dn.dk * (size_t)L->dn.dv;
    if (L->mixer == MX_MIXER_SHORTCONV)
        return (size_t)m->d * (size_t)(L->sc.L - 1);
    return 0;
}

size_t mx_model_state_floats(const mx_model *m)
{
    size_t n = 0;
    for (int l = 0; l < m->n_layers; l++)
        n += layer_state_floats(m, l);
    return n;
}

int mx_seq_new(const mx_model *m, int n_ctx, mx_seq **out, mx_err *e)
{
    *out = NULL;
    if (n_ctx <= 0)
        return mx_fail(e, MX_EINVAL, "context size must be positive (got %d)", n_ctx);
    mx_seq *s = calloc(1, sizeof *s);
    if (!s)
        return mx_fail(e, MX_ENOMEM, "out of memory");
    s->kv_off = malloc(sizeof *s->kv_off * (size_t)m->n_layers);
    s->state_off = malloc(sizeof *s->state_off * (size_t)(m->n_layers + 1));
    size_t n = 0, ns = 0;
    for (int l = 0; s->kv_off && s->state_off && l < m->n_layers; l++) {
        s->kv_off[l] = n;
        n += layer_kv_floats(m, l, n_ctx);
        s->state_off[l] = ns;
        ns += layer_state_floats(m, l);
    }
    if (s->state_off)
        s->state_off[m->n_layers] = ns;
    s->state = calloc(ns ? ns : 1, sizeof(float));
    /* calloc of a large block maps zero pages lazily, so memory is only
     * committed as the cache fills. */
    s->k = calloc(n ? n : 1, sizeof(float));
    s->v = calloc(n ? n : 1, sizeof(float));
    if (!s->kv_off || !s->state_off || !s->state || !s->k || !s->v) {
        mx_seq_free(s);
        return mx_fail(e, MX_ENOMEM, "out of memory for a KV cache of %d tokens (%.1f MiB)", n_ctx,
                       2.0 * (double)n * sizeof(float) / 1048576.0);
    }
    s->m = m;
    s->n_ctx = n_ctx;
    *out = s;
    return MX_OK;
}

void mx_seq_free(mx_seq *s)
{
    if (!s)
        return;
    if (s->dev && s->m && s->m->backend)
        s->m->backend->seq_free(s->m->backend_ctx, s);
    free(s->k);
    free(s->v);
    free(s->kv_off);
    free(s->state_off);
    free(s->state);
    free(s);
}

void mx_seq_reset(mx_seq *s)
{
    s->pos = 0;
    const size_t ns = s->state_off[s->m->n_layers];
    if (ns)
        memset(s->state, 0, sizeof(float) * ns);
}

int mx_seq_rewind(mx_seq *s, int pos)
{
    if (pos >= s->pos)
        return s->pos;
    if (s->state_off[s->m->n_layers] == 0) {
        s->pos = pos < 0 ? 0 : pos;   /* attention alone: the cache past pos is simply overwritten */
        return s->pos;
    }
    mx_seq_reset(s);
    return 0;
}

uint64_t mx_model_kv_bytes(const mx_model *m, int n_ctx)
{
    uint64_t n = 0;
    for (int l = 0; l < m->n_layers; l++)
        n += layer_kv_floats(m, l, n_ctx);
    return 2ull * n * sizeof(float);
}

static uint64_t mlp_bytes(const mx_mlp *p)
{
    return mx_linear_bytes(&p->gate) + mx_linear_bytes(&p->up) + mx_linear_bytes(&p->down);
}

static uint64_t attn_bytes(const mx_attn *a)
{
    return mx_linear_bytes(&a->q) + mx_linear_bytes(&a->k) + mx_linear_bytes(&a->v) +
           mx_linear_bytes(&a->o);
}

/* Bytes of what mixes a layer's tokens: attention, DeltaNet or the short
 * convolution's projections. */
static uint64_t mixer_bytes(const mx_layer *L)
{
    if (L->mixer == MX_MIXER_DELTANET)
        return mx_linear_bytes(&L->dn.qkvz) + mx_linear_bytes(&L->dn.ba) + mx_linear_bytes(&L->dn.out);
    if (L->mixer == MX_MIXER_SHORTCONV)
        return mx_linear_bytes(&L->sc.in) + mx_linear_bytes(&L->sc.out);
    return attn_bytes(&L->attn);
}

uint64_t mx_model_active_bytes(const mx_model *m)
{
    /* one embedding row + lm_head */
    uint64_t b = mx_linear_bytes(&m->embed) / (uint64_t)m->vocab + mx_linear_bytes(&m->lm_head);
    for (int l = 0; l < m->n_layers; l++) {
        const mx_layer *L = &m->layers[l];
        b += mixer_bytes(L);
        if (!L->is_moe || L->parallel)
            b += mlp_bytes(&L->mlp);
        if (!L->is_moe)
            continue;
        b += mx_linear_bytes(&L->moe.router);
        /* experts are the same size; count top_k of it */
        b += (uint64_t)m->top_k * L->moe.expert_bytes;
        if (L->moe.has_shared)
            b += mlp_bytes(&L->moe.shared) + mx_linear_bytes(&L->moe.shared_gate);
    }
    return b;
}

uint64_t mx_model_weight_bytes(const mx_model *m)
{
    /* every tensor of the checkpoint is mapped: quantized weights, scales,
     * biases, norms */
    uint64_t b = 0;
    for (size_t i = 0; i < mx_st_count(m->st); i++)
        b += mx_st_at(m->st, i)->nbytes;
    return b;
}

static uint64_t lin_params(const mx_linear *l) { return (uint64_t)(l->rows * l->cols); }

uint64_t mx_model_param_count(const mx_model *m)
{
    uint64_t p = lin_params(&m->embed) + (m->tied ? 0 : lin_params(&m->lm_head)) + (uint64_t)m->d;
    for (int l = 0; l < m->n_layers; l++) {
        const mx_layer *L = &m->layers[l];
        p += 2ull * (uint64_t)m->d;
        p += lin_params(&L->attn.q) + lin_params(&L->attn.k) + lin_params(&L->attn.v) +
             lin_params(&L->attn.o);
        p += lin_params(&L->dn.qkvz) + lin_params(&L->dn.ba) + lin_params(&L->dn.out) +
             lin_params(&L->sc.in) + lin_params(&L->sc.out);
        if (!L->is_moe || L->parallel)
            p += lin_params(&L->mlp.gate) + lin_params(&L->mlp.up) + lin_params(&L->mlp.down);
        if (!L->is_moe)
            continue;
        const mx_experts *ex = &L->moe.experts;
        p += lin_params(&L->moe.router) + (uint64_t)ex->n * 3ull * (uint64_t)(ex->d_ff * ex->d_model);
        if (L->moe.has_shared)
            p += lin_params(&L->moe.shared.gate) + lin_params(&L->moe.shared.up) +
                 lin_params(&L->moe.shared.down) + lin_params(&L->moe.shared_gate);
    }
    return p;
}
