/* load.c - binds a checkpoint's tensors to the model's weight structs.
 *
 * Tensor names come from the family's table (family.h).  Quantized linears
 * become mx_qmat views into the mmap (no copy), for both expert layouts:
 * stacked (`{block}.{stacked}.{proj}` with a leading expert dimension,
 * views at an offset) or per expert (`{block}.{per_expert}.{proj}`), names
 * from the family's table.  Only norm weights and biases are converted to
 * f32 (small).  Every missing
 * tensor or shape mismatch is an error naming the tensor. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/family.h"
#include "model/model.h"

#define NAME_MAX_LEN 256

/* Formats a tensor name into a NAME_MAX_LEN buffer (names are short; an
 * over-long one is truncated and then simply not found). */
__attribute__((format(printf, 2, 3))) static void tname(char *buf, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, NAME_MAX_LEN, fmt, ap);
    va_end(ap);
}

static void *own(mx_model *m, void *p)
{
    if (!p)
        return NULL;
    if (m->n_owned == m->cap_owned) {
        int cap = m->cap_owned ? 2 * m->cap_owned : 64;
        void **o = realloc(m->owned, sizeof *o * (size_t)cap);
        if (!o) {
            free(p);
            return NULL;
        }
        m->owned = o;
        m->cap_owned = cap;
    }
    m->owned[m->n_owned++] = p;
    return p;
}

/* A float vector tensor of exactly n elements, converted to f32.  *out stays
 * NULL when the tensor is absent and optional. */
static int load_vector(mx_model *m, const char *name, int64_t n, int optional, float **out,
                       mx_err *e)
{
    *out = NULL;
    const mx_tensor *t = mx_st_find(m->st, name);
    if (!t) {
        if (optional)
            return MX_OK;
        return mx_fail(e, MX_EFORMAT, "%s: tensor '%s' not found", m->dir, name);
    }
    if (!mx_dtype_is_float(t->dtype))
        return mx_fail(e, MX_EFORMAT, "%s: tensor '%s' has dtype %s, expected F32/F16/BF16",
                       t->file, name, mx_dtype_name(t->dtype));
    if (mx_tensor_numel(t) != n || t->ndim != 1)
        return mx_fail(e, MX_EFORMAT, "%s: tensor '%s' has %lld elements in %d dims, expected [%lld]",
                       t->file, name, (long long)mx_tensor_numel(t), t->ndim, (long long)n);
    float *v = own(m, malloc(sizeof *v * (size_t)n));
    if (!v)
        return mx_fail(e, MX_ENOMEM, "out of memory loading '%s'", name);
    for (int64_t i = 0; i < n; i++)
        v[i] = mx_dtype_get(t->data, t->dtype, i);
    *out = v;
    return MX_OK;
}

static const char *shape_str(const mx_tensor *t, char *buf, size_t cap)
{
    size_t o = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < t->ndim && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (o < cap)
        snprintf(buf + o, cap - o, "]");
    return buf;
}

/* Binds `module` (e.g. "model.layers.0.self_attn.q_proj") as a [rows, cols]
 * linear, quantized when `module.scales` exists.  `index` selects a matrix
 * in a stack (stacked experts), else 0.  Adds `module.bias` when present. */
static int load_linear_at(mx_model *m, const char *module, int64_t index, int64_t rows,
                          int64_t cols, mx_linear *l, mx_err *e)
{
    char nw[NAME_MAX_LEN], ns[NAME_MAX_LEN], nb[NAME_MAX_LEN], sh[96];
    tname(nw, "%s.weight", module);
    tname(ns, "%s.scales", module);
    tname(nb, "%s.biases", module);
    memset(l, 0, sizeof *l);
    const mx_tensor *w = mx_st_find(m->st, nw);
    if (!w)
        return mx_fail(e, MX_EFORMAT, "%s: tensor '%s' not found", m->dir, nw);
    const mx_tensor *s = mx_st_find(m->st, ns);
    if (s) {
        const mx_tensor *b = mx_st_find(m->st, nb);
        if (!b)
            return mx_fail(e, MX_EFORMAT, "%s: tensor '%s' not found (quantized '%s' needs scales and biases)",
                           m->dir, nb, module);
        int bits = 0, gs = 0;
        if (!mx_quant_for(&m->cfg.quant, module, &bits, &gs)) {
            /* The config says "not quantized" but scales are present: trust
             * the tensors and infer the bits. */
            bits = 0;
            gs = m->cfg.quant.group_size > 0 ? m->cfg.quant.group_size : 64;
        }
        if (!m->cfg.quant.present)
            bits = 0, gs = 64;
        int rc = mx_qmat_from_tensors(w, s, b, bits, gs, index, module, &l->q, e);
        if (rc)
            return rc;
        if (l->q.rows != rows || l->q.cols != cols)
            return mx_fail(e, MX_EFORMAT, "%s: '%s' is [%lld, %lld] after dequantization, expected [%lld, %lld]",
                           w->file, module, (long long)l->q.rows, (long long)l->q.cols,
                           (long long)rows, (long long)cols);
        l->quantized = 1;
    } else {
        if (!mx_dtype_is_float(w->dtype))
            return mx_fail(e, MX_EFORMAT, "%s: '%s' has dtype %s but no '%s': neither quantized nor float",
                           w->file, nw, mx_dtype_name(w->dtype), ns);
        int lead = w->ndim - 2;
        int64_t nmat = 1;
        for (int i = 0; i < lead; i++)
            nmat *= w->shape[i];
        if (w->ndim < 2 || w->shape[w->ndim - 2] != rows || w->shape[w->ndim - 1] != cols ||
            index >= nmat)
            return mx_fail(e, MX_EFORMAT, "%s: tensor '%s' has shape %s, expected [%lld, %lld]%s",
                           w->file, nw, shape_str(w, sh, sizeof sh), (long long)rows, (long long)cols,
                           lead ? " per stacked matrix" : "");
        l->w = (const char *)w->data + (size_t)index * (size_t)(rows * cols) * mx_dtype_size(w->dtype);
        l->wdtype = w->dtype;
    }
    l->rows = rows;
    l->cols = cols;
    char nbias[NAME_MAX_LEN];
    tname(nbias, "%s.bias", module);
    if (index == 0) {   /* stacked experts carry no bias */
        float *bias;
        int rc = load_vector(m, nbias, rows, 1, &bias, e);
        if (rc)
            return rc;
        l->bias = bias;
    }
    return MX_OK;
}

static int load_linear(mx_model *m, const char *module, int64_t rows, int64_t cols, mx_linear *l,
                       mx_err *e)
{
    return load_linear_at(m, module, 0, rows, cols, l, e);
}

/* A SwiGLU MLP `{prefix}.{gate,up,down}` of width ff. */
static int load_mlp(mx_model *m, const char *prefix, int64_t ff, mx_mlp *p, mx_err *e)
{
    const char *const *proj = m->fam->names.mlp_proj;
    char n[NAME_MAX_LEN];
    int rc;
    tname(n, "%s.%s", prefix, proj[0]);
    if ((rc = load_linear(m, n, ff, m->d, &p->gate, e)))
        return rc;
    tname(n, "%s.%s", prefix, proj[1]);
    if ((rc = load_linear(m, n, ff, m->d, &p->up, e)))
        return rc;
    tname(n, "%s.%s", prefix, proj[2]);
    return load_linear(m, n, m->d, ff, &p->down, e);
}

/* The routed experts of block `blk`: stacked `{blk}.{stacked}.{proj}`
 * when present, else per expert `{blk}.{per_expert}.{proj}`. */
static int load_experts(mx_model *m, const char *blk, int64_t ff, mx_experts *ex, mx_err *e)
{
    const mx_names *nm = &m->fam->names;
    const int E = m->n_experts;
    char n[NAME_MAX_LEN], nw[NAME_MAX_LEN], expert[64];
    ex->n = E;
    ex->d_model = m->d;
    ex->d_ff = ff;
    ex->gate = own(m, calloc((size_t)E, sizeof *ex->gate));
    ex->up = own(m, calloc((size_t)E, sizeof *ex->up));
    ex->down = own(m, calloc((size_t)E, sizeof *ex->down));
    if (!ex->gate || !ex->up || !ex->down)
        return mx_fail(e, MX_ENOMEM, "out of memory for %d experts", E);
    tname(nw, "%s.%s.%s.weight", blk, nm->stacked, nm->stacked_proj[0]);
    ex->stacked = mx_st_find(m->st, nw) != NULL;
    mx_linear *dst[3] = {ex->gate, ex->up, ex->down};
    for (int p = 0; p < 3; p++) {
        int64_t rows = p == 2 ? m->d : ff, cols = p == 2 ? ff : m->d;
        if (ex->stacked) {
            /* the stack must hold exactly E matrices */
            tname(n, "%s.%s.%s", blk, nm->stacked, nm->stacked_proj[p]);
            tname(nw, "%s.weight", n);
            const mx_tensor *w = mx_st_find(m->st, nw);
            if (!w)
                return mx_fail(e, MX_EFORMAT, "%s: tensor '%s' not found", m->dir, nw);
            if (w->ndim != 3 || w->shape[0] != E)
                return mx_fail(e, MX_EFORMAT, "%s: stacked experts '%s' must be [%d, out, in], has %d dims, first %lld",
                               w->file, nw, E, w->ndim, (long long)w->shape[0]);
        }
        for (int x = 0; x < E; x++) {
            int rc;
            if (ex->stacked) {
                rc = load_linear_at(m, n, x, rows, cols, &dst[p][x], e);
            } else {
                snprintf(expert, sizeof expert, nm->per_expert, x);
                tname(n, "%s.%s.%s", blk, expert, nm->expert_proj[p]);
                rc = load_linear(m, n, rows, cols, &dst[p][x], e);
            }
            if (rc)
                return rc;
        }
    }
    return MX_OK;
}

static int layer_is_moe(const mx_config *c, int l)
{
    for (int i = 0; i < c->n_mlp_only_layers; i++)
        if (c->mlp_only_layers[i] == l)
            return 0;
    return c->num_experts > 0 && c->decoder_sparse_step > 0 && (l + 1) % c->decoder_sparse_step == 0;
}

static int load_layer(mx_model *m, int l, mx_layer *L, mx_err *e)
{
    const mx_names *nm = &m->fam->names;
    char p[NAME_MAX_LEN], n[NAME_MAX_LEN], layer[64];
    int rc;
    snprintf(layer, sizeof layer, nm->layer, l);
    tname(p, "%s.%s", nm->model, layer);
    tname(n, "%s.%s.weight", p, nm->attn_norm);
    if ((rc = load_vector(m, n, m->d, 0, &L->attn_norm, e)))
        return rc;
    tname(n, "%s.%s.weight", p, nm->ffn_norm);
    if ((rc = load_vector(m, n, m->d, 0, &L->ffn_norm, e)))
        return rc;

    mx_attn *a = &L->attn;
    mx_linear *proj[4] = {&a->q, &a->k, &a->v, &a->o};
    const int64_t rows[4] = {m->q_dim, m->kv_dim, m->kv_dim, m->d};
    const int64_t cols[4] = {m->d, m->d, m->d, m->q_dim};
    for (int i = 0; i < 4; i++) {
        tname(n, "%s.%s.%s", p, nm->attn, nm->attn_proj[i]);
        if ((rc = load_linear(m, n, rows[i], cols[i], proj[i], e)))
            return rc;
    }
    if (m->fam->qk_norm != MX_QK_NORM_NONE) {
        int full = m->fam->qk_norm == MX_QK_NORM_FULL;
        tname(n, "%s.%s.%s.weight", p, nm->attn, nm->qk_norm[0]);
        if ((rc = load_vector(m, n, full ? m->q_dim : m->head_dim, 0, &a->q_norm, e)))
            return rc;
        tname(n, "%s.%s.%s.weight", p, nm->attn, nm->qk_norm[1]);
        if ((rc = load_vector(m, n, full ? m->kv_dim : m->head_dim, 0, &a->k_norm, e)))
            return rc;
    }

    L->is_moe = layer_is_moe(&m->cfg, l);
    if (!L->is_moe) {
        tname(n, "%s.%s", p, nm->mlp);
        return load_mlp(m, n, m->cfg.intermediate_size, &L->mlp, e);
    }
    mx_moe_block *b = &L->moe;
    char blk[NAME_MAX_LEN];
    tname(blk, "%s.%s", p, nm->moe);
    tname(n, "%s.%s", blk, nm->router);
    if ((rc = load_linear(m, n, m->n_experts, m->d, &b->router, e)))
        return rc;
    b->rule = (mx_router){.kind = m->fam->router, .k = m->top_k, .norm_topk = m->norm_topk};
    if ((rc = load_experts(m, blk, m->cfg.moe_intermediate_size, &b->experts, e)))
        return rc;
    if (m->fam->shared_expert && m->cfg.shared_expert_intermediate_size > 0) {
        b->has_shared = 1;
        tname(n, "%s.%s", blk, nm->shared);
        if ((rc = load_mlp(m, n, m->cfg.shared_expert_intermediate_size, &b->shared, e)))
            return rc;
        tname(n, "%s.%s", blk, nm->shared_gate);
        if ((rc = load_linear(m, n, 1, m->d, &b->shared_gate, e)))
            return rc;
    }
    return MX_OK;
}

/* Applies the family defaults and checks the dimensions are usable. */
static int resolve_config(mx_model *m, mx_err *e)
{
    mx_config *c = &m->cfg;
    if (!c->model_type[0])
        return mx_fail(e, MX_ECONFIG, "%s/config.json: model_type is missing (supported: %s)",
                       m->dir, mx_family_list());
    m->fam = mx_family_find(c->model_type);
    if (!m->fam)
        return mx_fail(e, MX_EUNSUPPORTED, "%s/config.json: model_type '%s' is not supported (supported: %s)",
                       m->dir, c->model_type, mx_family_list());
    int rc = mx_config_apply_aliases(c, m->fam->aliases, e);
    if (rc)
        return rc;
    m->fam->apply_defaults(c);
    if (c->head_dim == MX_UNSET && c->num_attention_heads > 0)
        c->head_dim = c->hidden_size / c->num_attention_heads;
    if (c->hidden_act[0] && strcmp(c->hidden_act, "silu"))
        return mx_fail(e, MX_EUNSUPPORTED, "%s/config.json: hidden_act '%s' is not supported (only silu)",
                       m->dir, c->hidden_act);
    if (c->rope_type[0] && strcmp(c->rope_type, "default"))
        return mx_fail(e, MX_EUNSUPPORTED, "%s/config.json: rope_type '%s' is not supported (only default)",
                       m->dir, c->rope_type);
#define NEED(cond, field)                                                                        \
    if (!(cond))                                                                                 \
        return mx_fail(e, MX_ECONFIG, "%s/config.json: %s has an invalid value", m->dir, field)
    NEED(c->hidden_size > 0, "hidden_size");
    NEED(c->num_hidden_layers > 0 && c->num_hidden_layers <= MX_MAX_LAYERS, "num_hidden_layers");
    NEED(c->num_attention_heads > 0, "num_attention_heads");
    NEED(c->num_key_value_heads > 0 && c->num_attention_heads % c->num_key_value_heads == 0,
         "num_key_value_heads");
    NEED(c->head_dim > 0 && c->head_dim % 2 == 0, "head_dim");
    NEED(c->vocab_size > 0, "vocab_size");
    NEED(c->rms_norm_eps > 0, "rms_norm_eps");
    NEED(c->rope_theta > 0, "rope_theta");
    NEED(c->num_experts >= 0 && c->num_experts <= 4096, "num_experts");
    NEED(c->num_experts == 0 || (c->num_experts_per_tok > 0 && c->num_experts_per_tok <= c->num_experts &&
                                 c->num_experts_per_tok <= MX_MAX_TOPK), "num_experts_per_tok");
    NEED(c->num_experts == 0 || c->moe_intermediate_size > 0, "moe_intermediate_size");
#undef NEED
    m->d = c->hidden_size;
    m->n_layers = c->num_hidden_layers;
    m->n_heads = c->num_attention_heads;
    m->n_kv = c->num_key_value_heads;
    m->head_dim = c->head_dim;
    m->vocab = c->vocab_size;
    m->q_dim = m->n_heads * m->head_dim;
    m->kv_dim = m->n_kv * m->head_dim;
    m->n_experts = c->num_experts;
    m->top_k = c->num_experts_per_tok;
    m->norm_topk = c->norm_topk_prob == 1;
    m->eps = (float)c->rms_norm_eps;
    return MX_OK;
}

int mx_model_load(const char *dir, mx_model **out, mx_err *e)
{
    *out = NULL;
    mx_model *m = calloc(1, sizeof *m);
    if (!m)
        return mx_fail(e, MX_ENOMEM, "out of memory");
    m->dir = strdup(dir);
    int rc = mx_config_load(dir, &m->cfg, e);
    if (!rc)
        rc = resolve_config(m, e);
    if (!rc)
        rc = mx_st_open_dir(dir, &m->st, e);
    if (rc)
        goto fail;

    /* RoPE inverse frequencies, computed in float as transformers does. */
    m->rope_inv_freq = own(m, malloc(sizeof(float) * (size_t)(m->head_dim / 2)));
    m->layers = own(m, calloc((size_t)m->n_layers, sizeof *m->layers));
    if (!m->rope_inv_freq || !m->layers) {
        rc = mx_fail(e, MX_ENOMEM, "out of memory");
        goto fail;
    }
    for (int i = 0; i < m->head_dim / 2; i++)
        m->rope_inv_freq[i] =
            1.0f / powf((float)m->cfg.rope_theta, (float)(2 * i) / (float)m->head_dim);

    const mx_names *nm = &m->fam->names;
    char n[NAME_MAX_LEN];
    tname(n, "%s.%s", nm->model, nm->embed);
    if ((rc = load_linear(m, n, m->vocab, m->d, &m->embed, e)))
        goto fail;
    for (int l = 0; l < m->n_layers; l++)
        if ((rc = load_layer(m, l, &m->layers[l], e)))
            goto fail;
    tname(n, "%s.%s.weight", nm->model, nm->final_norm);
    if ((rc = load_vector(m, n, m->d, 0, &m->final_norm, e)))
        goto fail;
    tname(n, "%s.weight", nm->lm_head);
    m->tied = m->cfg.tie_word_embeddings == 1 && !mx_st_find(m->st, n);
    if (m->tied)
        m->lm_head = m->embed;
    else if ((rc = load_linear(m, nm->lm_head, m->vocab, m->d, &m->lm_head, e)))
        goto fail;
    if (!(m->gather = mx_moe_gather_state_new())) {
        rc = mx_fail(e, MX_ENOMEM, "out of memory");
        goto fail;
    }
    *out = m;
    return MX_OK;
fail:
    mx_model_free(m);
    return rc;
}

void mx_model_free(mx_model *m)
{
    if (!m)
        return;
    for (int i = 0; i < m->n_owned; i++)
        free(m->owned[i]);
    free(m->owned);
    mx_arena_free(&m->arena);
    mx_arena_free(&m->moe_arena);
    mx_moe_gather_state_free(m->gather);
    mx_st_close(m->st);
    mx_config_free(&m->cfg);
    free(m->dir);
    free(m);
}
