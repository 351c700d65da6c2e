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

#include <cjson/cJSON.h>

#include "model/family.h"
#include "model/model.h"
#include "wcache/wcache.h"

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

/* Makes the bytes of matrix `index` of t readable (a set opened lazily
 * maps them now; a whole file's mapping has them already): the leading
 * dimensions of a stacked tensor count the matrices, a 2-D or 1-D tensor
 * is one.  An index past the stack is left to the shape checks. */
static int map_matrices(mx_model *m, const mx_tensor *t, int64_t index, int64_t count, mx_err *e)
{
    int64_t nmat = 1;
    for (int i = 0; i + 2 < t->ndim; i++)
        nmat *= t->shape[i];
    if (nmat <= 0 || index < 0 || count <= 0 || index + count > nmat)
        return MX_OK;
    const uint64_t per = (uint64_t)t->nbytes / (uint64_t)nmat;
    return mx_st_map(m->st, t, (uint64_t)index * per, (uint64_t)(index + count) * per, e);
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
    int rc = map_matrices(m, t, 0, 1, e);
    if (rc)
        return rc;
    float *v = own(m, malloc(sizeof *v * (size_t)n));
    if (!v)
        return mx_fail(e, MX_ENOMEM, "out of memory loading '%s'", name);
    for (int64_t i = 0; i < n; i++)
        v[i] = mx_dtype_get(t->data, t->dtype, i);
    *out = v;
    return MX_OK;
}

/* A float tensor of any shape holding exactly n elements (a convolution
 * kernel [C, K, 1], a scalar [1]), converted to f32. */
static int load_floats(mx_model *m, const char *name, int64_t n, float **out, mx_err *e)
{
    *out = NULL;
    const mx_tensor *t = mx_st_find(m->st, name);
    if (!t)
        return mx_fail(e, MX_EFORMAT, "%s: tensor '%s' not found", m->dir, name);
    if (!mx_dtype_is_float(t->dtype) || mx_tensor_numel(t) != n)
        return mx_fail(e, MX_EFORMAT, "%s: tensor '%s' must hold %lld F32/F16/BF16 values (has %lld %s)",
                       t->file, name, (long long)n, (long long)mx_tensor_numel(t),
                       mx_dtype_name(t->dtype));
    int rc = map_matrices(m, t, 0, 1, e);
    if (rc)
        return rc;
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
    int rc = map_matrices(m, w, index, 1, e);
    if (rc)
        return rc;
    if (s) {
        const mx_tensor *b = mx_st_find(m->st, nb);
        if (!b)
            return mx_fail(e, MX_EFORMAT, "%s: tensor '%s' not found (quantized '%s' needs scales and biases)",
                           m->dir, nb, module);
        if ((rc = map_matrices(m, s, index, 1, e)) || (rc = map_matrices(m, b, index, 1, e)))
            return rc;
        int bits = 0, gs = 0;
        if (!mx_quant_for(&m->cfg.quant, module, &bits, &gs)) {
            /* The config says "not quantized" but scales are present: trust
             * the tensors and infer the bits. */
            bits = 0;
            gs = m->cfg.quant.group_size > 0 ? m->cfg.quant.group_size : 64;
        }
        if (!m->cfg.quant.present)
            bits = 0, gs = 64;
        rc = mx_qmat_from_tensors(w, s, b, bits, gs, index, module, &l->q, e);
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
        rc = load_vector(m, nbias, rows, 1, &bias, e);
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

/* Sizes the routed experts of block `blk` without binding them: stacked
 * `{blk}.{stacked}.{proj}` when present (the stacks must hold exactly E
 * matrices), else per expert `{blk}.{per_expert}.{proj}`; *bytes gets one
 * expert's bytes (its three matrices with scales and biases). */
static int size_experts(mx_model *m, const char *blk, int64_t ff, mx_experts *ex, uint64_t *bytes,
                        mx_err *e)
{
    const mx_names *nm = &m->fam->names;
    const int E = m->n_experts;
    static const char *const part[3] = {"weight", "scales", "biases"};
    char n[NAME_MAX_LEN], expert[64];
    ex->n = E;
    ex->d_model = m->d;
    ex->d_ff = ff;
    ex->gate = own(m, calloc((size_t)E, sizeof *ex->gate));
    ex->up = own(m, calloc((size_t)E, sizeof *ex->up));
    ex->down = own(m, calloc((size_t)E, sizeof *ex->down));
    if (!ex->gate || !ex->up || !ex->down)
        return mx_fail(e, MX_ENOMEM, "out of memory for %d experts", E);
    tname(n, "%s.%s.%s.weight", blk, nm->stacked, nm->stacked_proj[0]);
    ex->stacked = mx_st_find(m->st, n) != NULL;
    *bytes = 0;
    snprintf(expert, sizeof expert, nm->per_expert, 0);
    for (int p = 0; p < 3; p++)
        for (int k = 0; k < 3; k++) {
            if (ex->stacked)
                tname(n, "%s.%s.%s.%s", blk, nm->stacked, nm->stacked_proj[p], part[k]);
            else
                tname(n, "%s.%s.%s.%s", blk, expert, nm->expert_proj[p], part[k]);
            const mx_tensor *t = mx_st_find(m->st, n);
            if (!t && k == 0)
                return mx_fail(e, MX_EFORMAT, "%s: tensor '%s' not found", m->dir, n);
            if (!t)
                continue;   /* not quantized: binding says whether that is right */
            if (ex->stacked && k == 0 && (t->ndim != 3 || t->shape[0] != E))
                return mx_fail(e, MX_EFORMAT, "%s: stacked experts '%s' must be [%d, out, in], has %d dims, first %lld",
                               t->file, n, E, t->ndim, (long long)t->shape[0]);
            *bytes += ex->stacked ? (uint64_t)t->nbytes / (uint64_t)E : (uint64_t)t->nbytes;
        }
    return MX_OK;
}

/* Binds the routed experts of block `blk` that `bound` marks (NULL: all),
 * sized by size_experts.  The stacked tensors of a lazily opened set are
 * mapped once over the span from the first to the last expert bound.  The
 * others get their shape and format without data (the dispatch chooses a
 * path from them): a bound one's view with no weights, or expert 0's when
 * none is bound. */
static int bind_experts(mx_model *m, const char *blk, const unsigned char *bound, mx_experts *ex,
                        mx_err *e)
{
    const mx_names *nm = &m->fam->names;
    static const char *const part[3] = {"weight", "scales", "biases"};
    char n[NAME_MAX_LEN], nt[NAME_MAX_LEN], expert[64];
    int lo = ex->n, hi = -1, rc;
    for (int x = 0; x < ex->n; x++)
        if (!bound || bound[x])
            lo = x < lo ? x : lo, hi = x;
    const int none = hi < 0;
    if (none)
        lo = hi = 0;
    mx_linear *dst[3] = {ex->gate, ex->up, ex->down};
    for (int p = 0; p < 3 && hi >= 0; p++) {
        int64_t rows = p == 2 ? m->d : ex->d_ff, cols = p == 2 ? ex->d_ff : m->d;
        if (ex->stacked) {
            tname(n, "%s.%s.%s", blk, nm->stacked, nm->stacked_proj[p]);
            for (int k = 0; k < 3; k++) {
                tname(nt, "%s.%s", n, part[k]);
                const mx_tensor *t = mx_st_find(m->st, nt);
                if (t && (rc = map_matrices(m, t, lo, hi - lo + 1, e)))
                    return rc;
            }
        }
        for (int x = lo; x <= hi; x++) {
            if (bound && !bound[x] && !none)
                continue;
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
        for (int x = 0; bound && x < ex->n; x++)
            if (!bound[x]) {
                dst[p][x] = dst[p][lo];
                dst[p][x].q.w = NULL;
                dst[p][x].q.scales = dst[p][x].q.biases = NULL;
                dst[p][x].w = NULL;
            }
    }
    return MX_OK;
}

/* Whether layer l has routed experts: not in mlp_only_layers, past the
 * first_k_dense_replace dense layers (DeepSeek-style), on the
 * decoder_sparse_step grid. */
static int layer_is_moe(const mx_config *c, int l)
{
    for (int i = 0; i < c->n_mlp_only_layers; i++)
        if (c->mlp_only_layers[i] == l)
            return 0;
    if (l < (int)mx_config_number(c, "first_k_dense_replace", 0) ||
        l < (int)mx_config_number(c, "num_dense_layers", 0))
        return 0;
    return c->num_experts > 0 && c->decoder_sparse_step > 0 && (l + 1) % c->decoder_sparse_step == 0;
}

/* A norm `{prefix}.weight` (and, for LayerNorm families, `.bias`). */
static int load_norm(mx_model *m, const char *prefix, mx_norm *out, mx_err *e)
{
    char n[NAME_MAX_LEN];
    float *w, *b = NULL;
    tname(n, "%s.weight", prefix);
    int rc = load_vector(m, n, m->d, 0, &w, e);
    if (!rc && m->fam->norm == MX_NORM_LAYER) {
        tname(n, "%s.bias", prefix);
        rc = load_vector(m, n, m->d, 0, &b, e);
    }
    out->w = w;
    out->b = b;
    return rc;
}

static const char *layer_type(const mx_config *c, int l);

/* An optional norm `{p}.{name}` (none when the family names none). */
static int load_norm_opt(mx_model *m, const char *p, const char *name, mx_norm *out, mx_err *e)
{
    if (!name) {
        out->w = out->b = NULL;
        return MX_OK;
    }
    char n[NAME_MAX_LEN];
    tname(n, "%s.%s", p, name);
    return load_norm(m, n, out, e);
}

/* The sliding window of layer l: with a layer_types list, only its
 * "sliding_attention" layers; else every layer when the config enables
 * one (use_sliding_window unset or true). */
static int layer_window(const mx_config *c, int l)
{
    if (c->sliding_window <= 0)
        return 0;
    if (cJSON_IsArray(mx_config_key(c, "layer_types"))) {
        const char *t = layer_type(c, l);
        return t && !strcmp(t, "sliding_attention") ? c->sliding_window : 0;
    }
    return c->use_sliding_window != 0 ? c->sliding_window : 0;
}

/* Layer l's attention: its geometry (a "full_attention" layer of a config
 * with global_head_dim has its own head size, and with attention_k_eq_v no
 * v projection and num_global_key_value_heads), its rope, window, norms. */
static int load_attention(mx_model *m, const char *p, int l, mx_attn *a, mx_err *e)
{
    const mx_config *c = &m->cfg;
    const mx_names *nm = &m->fam->names;
    char n[NAME_MAX_LEN];
    int rc;
    const char *type = layer_type(c, l);
    const int full = type && !strcmp(type, "full_attention");
    a->n_heads = m->n_heads;
    a->n_kv = m->n_kv;
    a->head_dim = m->head_dim;
    a->rope = 0;
    if (full && mx_config_number(c, "global_head_dim", 0) > 0) {
        a->head_dim = (int)mx_config_number(c, "global_head_dim", 0);
        const cJSON *kv = mx_config_key(c, "attention_k_eq_v");
        a->k_eq_v = cJSON_IsTrue(kv);
        if (a->k_eq_v)
            a->n_kv = (int)mx_config_number(c, "num_global_key_value_heads", m->n_kv);
    }
    if (full && m->n_ropes > 1)
        a->rope = 1;
    if (a->n_kv <= 0 || a->n_heads % a->n_kv || a->head_dim <= 0 || a->head_dim % 2 ||
        m->ropes[a->rope].dims > a->head_dim)
        return mx_fail(e, MX_ECONFIG, "%s/config.json: layer %d: %d heads of %d over %d kv heads do not fit",
                       m->dir, l, a->n_heads, a->head_dim, a->n_kv);
    a->q_dim = a->n_heads * a->head_dim;
    a->kv_dim = a->n_kv * a->head_dim;
    a->window = layer_window(c, l);
    a->v_norm = m->fam->v_norm;
    a->out_gate = m->fam->attn_out_gate;
    a->scale = m->fam->attn_scale > 0 ? m->fam->attn_scale : 1.0f / sqrtf((float)a->head_dim);
    mx_linear *proj[4] = {&a->q, &a->k, &a->v, &a->o};
    const int64_t rows[4] = {(a->out_gate ? 2 : 1) * (int64_t)a->q_dim, a->kv_dim, a->kv_dim, m->d};
    const int64_t cols[4] = {m->d, m->d, m->d, a->q_dim};
    for (int i = 0; i < 4; i++) {
        if (i == 2 && a->k_eq_v)
            continue;   /* v is the k projection */
        tname(n, "%s.%s.%s", p, nm->attn, nm->attn_proj[i]);
        if ((rc = load_linear(m, n, rows[i], cols[i], proj[i], e)))
            return rc;
    }
    if (m->fam->qk_norm != MX_QK_NORM_NONE) {
        int fw = m->fam->qk_norm == MX_QK_NORM_FULL;
        tname(n, "%s.%s.%s.weight", p, nm->attn, nm->qk_norm[0]);
        if ((rc = load_vector(m, n, fw ? a->q_dim : a->head_dim, 0, &a->q_norm, e)))
            return rc;
        tname(n, "%s.%s.%s.weight", p, nm->attn, nm->qk_norm[1]);
        if ((rc = load_vector(m, n, fw ? a->kv_dim : a->head_dim, 0, &a->k_norm, e)))
            return rc;
    }
    return MX_OK;
}

/* The vector `{prefix}.{name}` of n floats when the family names one
 * (else *out = NULL). */
static int load_named_vector(mx_model *m, const char *prefix, const char *name, int64_t n,
                             float **out, mx_err *e)
{
    *out = NULL;
    if (!name)
        return MX_OK;
    char full[NAME_MAX_LEN];
    tname(full, "%s.%s", prefix, name);
    return load_vector(m, full, n, 0, out, e);
}

/* The routing rule of a MoE block: the family's kind with the config's
 * parameters, and the choice bias tensor when the family names one. */
static int load_router_rule(mx_model *m, const char *blk, mx_router *r, mx_err *e)
{
    const mx_config *c = &m->cfg;
    *r = (mx_router){.kind = m->fam->router, .k = m->top_k, .norm_topk = m->norm_topk};
    r->n_group = (int)mx_config_number(c, "n_group", 1);
    r->topk_group = (int)mx_config_number(c, "topk_group", r->n_group);
    r->scale = (float)mx_config_number(c, "routed_scaling_factor", 1.0);
    r->jitter = (float)mx_config_number(c, "router_jitter_noise", 0.01);
    r->norm_eps = m->fam->router_norm_eps;
    if (r->n_group < 1 || r->topk_group < 1 || r->topk_group > r->n_group ||
        (r->n_group > 1 && m->n_experts % r->n_group != 0) || r->n_group > 256)
        return mx_fail(e, MX_ECONFIG, "%s/config.json: n_group %d / topk_group %d do not divide %d experts",
                       m->dir, r->n_group, r->topk_group, m->n_experts);
    if (r->kind == MX_ROUTER_SPARSEMIXER && m->top_k != 2)
        return mx_fail(e, MX_EUNSUPPORTED, "%s/config.json: sparsemixer routing takes 2 experts, not %d",
                       m->dir, m->top_k);
    float *sc = NULL, *bias = NULL;
    int rc = load_named_vector(m, blk, m->fam->names.expert_scale, m->n_experts, &sc, e);
    if (!rc)
        rc = load_named_vector(m, blk, m->fam->names.router_bias, m->n_experts, &bias, e);
    r->expert_scale = sc;
    r->bias = bias;
    return rc;
}

/* What mixes the tokens in layer l: layer_types' "linear_attention"
 * (gated DeltaNet) or "conv" (short convolution), or, without a
 * layer_types list, DeltaNet except every full_attention_interval-th layer
 * when the config sets an interval; attention otherwise. */
static mx_mixer layer_mixer(const mx_config *c, int l)
{
    const char *t = layer_type(c, l);
    if (t)
        return !strcmp(t, "linear_attention") ? MX_MIXER_DELTANET
               : !strcmp(t, "conv")           ? MX_MIXER_SHORTCONV
                                              : MX_MIXER_ATTENTION;
    const int every = (int)mx_config_number(c, "full_attention_interval", 0);
    if (every > 0)
        return (l + 1) % every ? MX_MIXER_DELTANET : MX_MIXER_ATTENTION;
    return MX_MIXER_ATTENTION;
}

static int load_deltanet(mx_model *m, const char *p, mx_deltanet *dn, mx_err *e)
{
    const mx_config *c = &m->cfg;
    const mx_names *nm = &m->fam->names;
    dn->nk = (int)mx_config_number(c, "linear_num_key_heads", 0);
    dn->nv = (int)mx_config_number(c, "linear_num_value_heads", 0);
    dn->dk = (int)mx_config_number(c, "linear_key_head_dim", 0);
    dn->dv = (int)mx_config_number(c, "linear_value_head_dim", 0);
    dn->K = (int)mx_config_number(c, "linear_conv_kernel_dim", 4);
    if (dn->nk <= 0 || dn->nv <= 0 || dn->nv % dn->nk || dn->dk <= 0 || dn->dv <= 0 ||
        dn->K < 1 || dn->K > 64)
        return mx_fail(e, MX_ECONFIG, "%s/config.json: linear attention needs linear_num_key_heads, "
                       "linear_num_value_heads (a multiple), linear_key_head_dim, linear_value_head_dim "
                       "and linear_conv_kernel_dim (1..64)", m->dir);
    const int64_t kd = (int64_t)dn->nk * dn->dk, vd = (int64_t)dn->nv * dn->dv;
    dn->conv_dim = (int)(2 * kd + vd);
    char b[NAME_MAX_LEN], n[NAME_MAX_LEN];
    int rc;
    tname(b, "%s.%s", p, nm->deltanet);
    tname(n, "%s.%s", b, nm->dn_qkvz);
    if ((rc = load_linear(m, n, 2 * kd + 2 * vd, m->d, &dn->qkvz, e)))
        return rc;
    tname(n, "%s.%s", b, nm->dn_ba);
    if ((rc = load_linear(m, n, 2 * dn->nv, m->d, &dn->ba, e)))
        return rc;
    tname(n, "%s.%s", b, nm->dn_out);
    if ((rc = load_linear(m, n, m->d, vd, &dn->out, e)))
        return rc;
    tname(n, "%s.%s.weight", b, nm->dn_conv);
    if ((rc = load_floats(m, n, (int64_t)dn->conv_dim * dn->K, &dn->conv_w, e)))
        return rc;
    tname(n, "%s.%s", b, nm->dn_a_log);
    if ((rc = load_floats(m, n, dn->nv, &dn->A_log, e)))
        return rc;
    tname(n, "%s.%s", b, nm->dn_dt_bias);
    if ((rc = load_floats(m, n, dn->nv, &dn->dt_bias, e)))
        return rc;
    tname(n, "%s.%s.weight", b, nm->dn_norm);
    return load_floats(m, n, dn->dv, &dn->norm_w, e);
}

static int load_shortconv(mx_model *m, const char *p, mx_shortconv *sc, mx_err *e)
{
    const mx_names *nm = &m->fam->names;
    sc->L = (int)mx_config_number(&m->cfg, "conv_L_cache", 3);
    if (sc->L < 1 || sc->L > 64)
        return mx_fail(e, MX_ECONFIG, "%s/config.json: conv_L_cache %d is not in 1..64", m->dir, sc->L);
    char b[NAME_MAX_LEN], n[NAME_MAX_LEN];
    int rc;
    tname(b, "%s.%s", p, nm->shortconv);
    tname(n, "%s.%s", b, nm->sc_in);
    if ((rc = load_linear(m, n, 3 * (int64_t)m->d, m->d, &sc->in, e)))
        return rc;
    tname(n, "%s.%s", b, nm->sc_out);
    if ((rc = load_linear(m, n, m->d, m->d, &sc->out, e)))
        return rc;
    tname(n, "%s.%s.weight", b, nm->sc_conv);
    if ((rc = load_floats(m, n, (int64_t)m->d * sc->L, &sc->conv_w, e)))
        return rc;
    tname(n, "%s.%s.bias", b, nm->sc_conv);
    if (mx_st_find(m->st, n) && (rc = load_floats(m, n, m->d, &sc->conv_b, e)))
        return rc;
    return MX_OK;
}

/* Layer l's name prefix p ("model.layers.3") and its MoE block's blk. */
static void layer_names(const mx_model *m, int l, char *p, char *blk)
{
    const mx_names *nm = &m->fam->names;
    char layer[64];
    snprintf(layer, sizeof layer, nm->layer, l);
    tname(p, "%s.%s", nm->model, layer);
    if (nm->moe[0])
        tname(blk, "%s.%s", p, nm->moe);
    else
        tname(blk, "%s", p);
}

/* Layer l: everything but the routed experts, which are sized here and
 * bound once the whole model is (mx_model_load_ex).  A model of experts
 * alone skips the rest. */
static int load_layer(mx_model *m, int l, mx_layer *L, mx_err *e)
{
    const mx_names *nm = &m->fam->names;
    char p[NAME_MAX_LEN], n[NAME_MAX_LEN], blk[NAME_MAX_LEN];
    int rc;
    layer_names(m, l, p, blk);
    L->is_moe = layer_is_moe(&m->cfg, l);
    L->parallel = L->is_moe && m->fam->parallel_dense;
    L->scalar = 1.0f;
    mx_moe_block *b = &L->moe;
    if (m->experts_only)
        return L->is_moe ? size_experts(m, blk, m->cfg.moe_intermediate_size, &b->experts,
                                        &b->expert_bytes, e)
                         : MX_OK;
    if ((rc = load_norm_opt(m, p, nm->attn_norm, &L->attn_norm, e)) ||
        (rc = load_norm_opt(m, p, nm->ffn_norm, &L->ffn_norm, e)) ||
        (rc = load_norm_opt(m, p, nm->attn_out_norm, &L->attn_out_norm, e)) ||
        (rc = load_norm_opt(m, p, nm->ffn_out_norm, &L->ffn_out_norm, e)))
        return rc;
    L->mixer = layer_mixer(&m->cfg, l);
    if (L->mixer == MX_MIXER_DELTANET)
        rc = load_deltanet(m, p, &L->dn, e);
    else if (L->mixer == MX_MIXER_SHORTCONV)
        rc = load_shortconv(m, p, &L->sc, e);
    else
        rc = load_attention(m, p, l, &L->attn, e);
    if (rc)
        return rc;
    if (nm->layer_scalar) {
        float *sc;
        tname(n, "%s.%s", p, nm->layer_scalar);
        if ((rc = load_vector(m, n, 1, 0, &sc, e)))
            return rc;
        L->scalar = sc[0];
    }

    if (!L->is_moe || L->parallel) {
        tname(n, "%s.%s", p, nm->mlp);
        if ((rc = load_mlp(m, n, m->cfg.intermediate_size, &L->mlp, e)))
            return rc;
        if (!L->is_moe)
            return MX_OK;
        if ((rc = load_norm_opt(m, p, nm->mlp_out_norm, &L->mlp_out_norm, e)) ||
            (rc = load_norm_opt(m, p, nm->moe_in_norm, &L->moe_in_norm, e)) ||
            (rc = load_norm_opt(m, p, nm->moe_out_norm, &L->moe_out_norm, e)))
            return rc;
    }
    tname(n, "%s.%s", blk, nm->router);
    if ((rc = load_linear(m, n, m->n_experts, m->d, &b->router, e)))
        return rc;
    if ((rc = load_router_rule(m, blk, &b->rule, e)))
        return rc;
    if ((rc = load_named_vector(m, blk, nm->router_scale, m->d, &b->router_in_scale, e)))
        return rc;
    if ((rc = size_experts(m, blk, m->cfg.moe_intermediate_size, &b->experts, &b->expert_bytes, e)))
        return rc;
    int64_t shared_ff = 0;
    if (m->fam->shared_expert == MX_SHARED_GATED)
        shared_ff = m->cfg.shared_expert_intermediate_size;
    else if (m->fam->shared_expert == MX_SHARED_PLAIN)
        shared_ff = (int64_t)m->cfg.moe_intermediate_size *
                    (int64_t)mx_config_number(&m->cfg, "n_shared_experts", 0);
    if (shared_ff > 0) {
        b->has_shared = 1;
        tname(n, "%s.%s", blk, nm->shared);
        if ((rc = load_mlp(m, n, shared_ff, &b->shared, e)))
            return rc;
        if (m->fam->shared_expert == MX_SHARED_GATED) {
            b->shared_gated = 1;
            tname(n, "%s.%s", blk, nm->shared_gate);
            if ((rc = load_linear(m, n, 1, m->d, &b->shared_gate, e)))
                return rc;
        }
    }
    return MX_OK;
}

/* Binds the routed experts of every MoE layer: all of them, or the share
 * o->slice leaves this process (recorded in each block's `bound`). */
static int load_all_experts(mx_model *m, const mx_model_load_opts *o, mx_err *e)
{
    const int E = m->n_experts;
    unsigned char *owned = NULL;
    int rc;
    if (o && o->slice) {
        owned = own(m, malloc((size_t)m->n_layers * (size_t)(E > 0 ? E : 1)));
        if (!owned)
            return mx_fail(e, MX_ENOMEM, "out of memory");
        memset(owned, 1, (size_t)m->n_layers * (size_t)(E > 0 ? E : 1));
        if ((rc = o->slice(o->ctx, m, owned, e)))
            return rc;
    }
    for (int l = 0; l < m->n_layers; l++) {
        mx_layer *L = &m->layers[l];
        if (!L->is_moe)
            continue;
        char p[NAME_MAX_LEN], blk[NAME_MAX_LEN];
        layer_names(m, l, p, blk);
        L->moe.bound = owned ? owned + (size_t)l * (size_t)E : NULL;
        if ((rc = bind_experts(m, blk, L->moe.bound, &L->moe.experts, e)))
            return rc;
    }
    return MX_OK;
}

/* A JSON array of exactly n numbers into out. */
static int read_factors(const cJSON *a, int n, float *out)
{
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != n)
        return -1;
    int i = 0;
    for (const cJSON *v = a->child; v; v = v->next, i++) {
        if (!cJSON_IsNumber(v))
            return -1;
        out[i] = (float)v->valuedouble;
    }
    return 0;
}

/* The type of layer l from config.json's layer_types ("sliding_attention",
 * "full_attention", ...), or NULL when the config has none. */
static const char *layer_type(const mx_config *c, int l)
{
    const cJSON *t = cJSON_GetArrayItem(mx_config_key(c, "layer_types"), l);
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

static double obj_number(const cJSON *o, const char *key, double dflt)
{
    const cJSON *v = o ? cJSON_GetObjectItemCaseSensitive(o, key) : NULL;
    return cJSON_IsNumber(v) ? v->valuedouble : dflt;
}

/* One rope from its parameters rp (rope_parameters, or one layer type's
 * entry of it; may be NULL) for heads of head_dim: the rotated share
 * (partial rotary), the frequencies computed in float as transformers
 * does, LongRoPE's two sets and scales, and proportional RoPE (Gemma 4:
 * the first share of the frequencies theta^(-2i/head_dim), the rest 0). */
static int build_rope(mx_model *m, const cJSON *rp, int head_dim, mx_rope *r, mx_err *e)
{
    const mx_config *c = &m->cfg;
    const cJSON *tv = rp ? cJSON_GetObjectItemCaseSensitive(rp, "rope_type") : NULL;
    const char *type = cJSON_IsString(tv) ? tv->valuestring : c->rope_type;
    const int longrope = !strcmp(type, "longrope"), proportional = !strcmp(type, "proportional");
    if (strcmp(type, "default") && !longrope && !proportional)
        return mx_fail(e, MX_EUNSUPPORTED, "%s/config.json: rope_type '%s' is not supported "
                       "(default, longrope, proportional)", m->dir, type);
    const double theta = obj_number(rp, "rope_theta", c->rope_theta);
    double partial = obj_number(rp, "partial_rotary_factor",
                                mx_config_number(c, "partial_rotary_factor", -1.0));
    int dims = head_dim;
    if (proportional)
        dims = head_dim;   /* every pair turns, the unrotated ones at frequency 0 */
    else if (partial > 0 && partial <= 1)
        dims = (int)(head_dim * partial);
    else if (mx_config_number(c, "rotary_dim", 0) > 0)
        dims = (int)mx_config_number(c, "rotary_dim", 0);
    if (theta <= 0 || dims < 2 || dims > head_dim || dims % 2)
        return mx_fail(e, MX_ECONFIG, "%s/config.json: rope theta %g / rotary dimensions %d do not fit "
                       "head_dim %d", m->dir, theta, dims, head_dim);
    r->dims = dims;
    r->mscale = 1.0f;
    r->inv_freq = own(m, malloc(sizeof(float) * (size_t)(dims / 2)));
    if (!r->inv_freq)
        return mx_fail(e, MX_ENOMEM, "out of memory");
    float *sf = NULL;
    if (longrope) {
        r->inv_freq_long = own(m, malloc(sizeof(float) * (size_t)(dims / 2)));
        sf = own(m, malloc(sizeof(float) * (size_t)dims));
        if (!r->inv_freq_long || !sf)
            return mx_fail(e, MX_ENOMEM, "out of memory");
        if (!rp || read_factors(cJSON_GetObjectItemCaseSensitive(rp, "short_factor"), dims / 2, sf) ||
            read_factors(cJSON_GetObjectItemCaseSensitive(rp, "long_factor"), dims / 2, sf + dims / 2))
            return mx_fail(e, MX_ECONFIG, "%s/config.json: longrope needs short_factor and long_factor "
                                          "of %d numbers each", m->dir, dims / 2);
        r->orig_max = (int)obj_number(rp, "original_max_position_embeddings",
                                      mx_config_number(c, "original_max_position_embeddings", 0));
        if (r->orig_max <= 0)
            return mx_fail(e, MX_ECONFIG, "%s/config.json: longrope needs original_max_position_embeddings",
                           m->dir);
        /* the scales the config gives, else transformers' default
         * sqrt(1 + ln(factor) / ln(original max)) */
        const double factor = (double)c->max_position_embeddings / r->orig_max;
        const double dflt = factor <= 1.0 ? 1.0 : sqrt(1.0 + log(factor) / log((double)r->orig_max));
        r->mscale = (float)obj_number(rp, "short_mscale", dflt);
        r->mscale_long = (float)obj_number(rp, "long_mscale", dflt);
    }
    const int angles = proportional ? (int)(((partial > 0 ? partial : 1.0) * head_dim) / 2) : dims / 2;
    for (int i = 0; i < dims / 2; i++) {
        const float base = powf((float)theta, (float)(2 * i) / (float)dims);
        r->inv_freq[i] = i >= angles ? 0.0f : 1.0f / (longrope ? sf[i] * base : base);
        if (longrope)
            r->inv_freq_long[i] = 1.0f / (sf[dims / 2 + i] * base);
    }
    return MX_OK;
}

/* The model's ropes: one, or (when rope_parameters holds one entry per
 * layer type, as Gemma 4's does) one for sliding and one for full layers. */
static int setup_ropes(mx_model *m, mx_err *e)
{
    const mx_config *c = &m->cfg;
    const cJSON *rp = mx_config_key(c, "rope_parameters");
    if (!cJSON_IsObject(rp))
        rp = mx_config_key(c, "rope_scaling");
    if (!cJSON_IsObject(rp))
        rp = NULL;
    const cJSON *sl = rp ? cJSON_GetObjectItemCaseSensitive(rp, "sliding_attention") : NULL;
    const cJSON *fu = rp ? cJSON_GetObjectItemCaseSensitive(rp, "full_attention") : NULL;
    if (cJSON_IsObject(sl) && cJSON_IsObject(fu)) {
        m->n_ropes = 2;
        int rc = build_rope(m, sl, m->head_dim, &m->ropes[0], e);
        return rc ? rc : build_rope(m, fu, (int)mx_config_number(c, "global_head_dim", m->head_dim),
                                    &m->ropes[1], e);
    }
    m->n_ropes = 1;
    return build_rope(m, rp, m->head_dim, &m->ropes[0], e);
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
    m->act = MX_ACT_SILU;
    if (!strcmp(c->hidden_act, "gelu_pytorch_tanh") || !strcmp(c->hidden_act, "gelu_tanh"))
        m->act = MX_ACT_GELU_TANH;
    else if (c->hidden_act[0] && strcmp(c->hidden_act, "silu") && strcmp(c->hidden_act, "swish"))
        return mx_fail(e, MX_EUNSUPPORTED, "%s/config.json: hidden_act '%s' is not supported "
                       "(silu, gelu_pytorch_tanh)", m->dir, c->hidden_act);
    m->embed_scale = m->fam->embed_scale ? sqrtf((float)c->hidden_size) : 1.0f;
    m->softcap = (float)mx_config_number(c, "final_logit_softcapping", 0.0);
    if (mx_config_number(c, "num_kv_shared_layers", 0) > 0 ||
        mx_config_number(c, "hidden_size_per_layer_input", 0) > 0)
        return mx_fail(e, MX_EUNSUPPORTED, "%s/config.json: shared KV layers and per-layer inputs "
                       "(Gemma 4's small models) are not supported", m->dir);
    if (c->rope_type[0] && strcmp(c->rope_type, "default") && strcmp(c->rope_type, "longrope") &&
        strcmp(c->rope_type, "proportional"))
        return mx_fail(e, MX_EUNSUPPORTED, "%s/config.json: rope_type '%s' is not supported "
                       "(default, longrope, proportional)", m->dir, c->rope_type);
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

/* Appends l's matrix to the list (mx_model_each_qlinear's callback):
 * every quantized matrix the forward pass reads whole, in an order fixed by
 * the model's shape, which the weight cache's matrix table follows. */
typedef struct qmat_list {
    mx_qmat **q;   /* NULL: count only */
    size_t n;
} qmat_list;

static void list_qmat(mx_linear *l, void *ctx)
{
    qmat_list *c = ctx;
    if (c->q)
        c->q[c->n] = &l->q;
    c->n++;
}

/* The weight cache's view of m: its folder, weight files and matrices
 * (src->mats malloc'ed: free it). */
static int wcache_src(mx_model *m, mx_wcache_src *src, const char ***files, mx_err *e)
{
    qmat_list c = {0};
    mx_model_each_qlinear(m, list_qmat, &c);
    const size_t nf = mx_st_nfiles(m->st), nm = c.n;
    mx_qmat **mats = malloc(sizeof *mats * (nm ? nm : 1));
    *files = malloc(sizeof **files * (nf ? nf : 1));
    if (!mats || !*files) {
        free(mats);
        free(*files);
        return mx_fail(e, MX_ENOMEM, "out of memory");
    }
    c = (qmat_list){.q = mats};
    mx_model_each_qlinear(m, list_qmat, &c);
    for (size_t i = 0; i < nf; i++)
        (*files)[i] = mx_st_file_path(m->st, i);
    *src = (mx_wcache_src){.dir = m->dir, .files = *files, .n_files = nf, .mats = mats, .n_mats = nm};
    return MX_OK;
}

/* Gives the model's matrices their repacked forms as MLXCEL_REPACK /
 * --repack say (src/wcache).  A share of a model (expert parallelism, a
 * lazy map) keeps the checkpoint's layout: its matrices are not the
 * model's. */
static int attach_wcache(mx_model *m, const mx_model_load_opts *o, mx_err *e)
{
    mx_repack_mode mode = mx_repack_mode_get();
    if (o && (o->slice || o->experts_only || o->lazy))
        mode = MX_REPACK_OFF;
    const char **files = NULL;
    mx_wcache_src src = {0};
    int rc = mode == MX_REPACK_OFF ? MX_OK : wcache_src(m, &src, &files, e);
    if (!rc)
        rc = mx_wcache_attach(&src, mode, &m->wcache, e);
    free((void *)src.mats);
    free(files);
    return rc;
}

int mx_model_wcache_probe(mx_model *m, mx_wcache_info *info, mx_err *e)
{
    const char **files = NULL;
    mx_wcache_src src = {0};
    int rc = wcache_src(m, &src, &files, e);
    if (!rc)
        rc = mx_wcache_probe(&src, info, e);
    free((void *)src.mats);
    free(files);
    return rc;
}

static mx_model_loader g_loader;   /* set by mx_model_set_loader: the ranks' loader */

void mx_model_set_loader(mx_model_loader fn) { g_loader = fn; }

int mx_model_load(const char *dir, mx_model **out, mx_err *e)
{
    return g_loader ? g_loader(dir, out, e) : mx_model_load_ex(dir, NULL, out, e);
}

int mx_model_load_ex(const char *dir, const mx_model_load_opts *o, mx_model **out, mx_err *e)
{
    *out = NULL;
    mx_model *m = calloc(1, sizeof *m);
    if (!m)
        return mx_fail(e, MX_ENOMEM, "out of memory");
    m->dir = strdup(dir);
    m->experts_only = o && o->experts_only;
    int rc = mx_config_load(dir, &m->cfg, e);
    if (!rc)
        rc = resolve_config(m, e);
    if (!rc)
        rc = o && o->lazy ? mx_st_open_dir_lazy(dir, &m->st, e) : mx_st_open_dir(dir, &m->st, e);
    if (rc)
        goto fail;

    m->layers = own(m, calloc((size_t)m->n_layers, sizeof *m->layers));
    if (!m->layers) {
        rc = mx_fail(e, MX_ENOMEM, "out of memory");
        goto fail;
    }
    if ((rc = setup_ropes(m, e)))
        goto fail;

    const mx_names *nm = &m->fam->names;
    char n[NAME_MAX_LEN];
    tname(n, "%s.%s", nm->model, nm->embed);
    if (!m->experts_only && (rc = load_linear(m, n, m->vocab, m->d, &m->embed, e)))
        goto fail;
    for (int l = 0; l < m->n_layers; l++)
        if ((rc = load_layer(m, l, &m->layers[l], e)))
            goto fail;
    if ((rc = load_all_experts(m, o, e)))
        goto fail;
    if (!m->experts_only) {
        tname(n, "%s.%s", nm->model, nm->final_norm);
        if ((rc = load_norm(m, n, &m->final_norm, e)))
            goto fail;
        tname(n, "%s.weight", nm->lm_head);
        m->tied = m->cfg.tie_word_embeddings == 1 && !mx_st_find(m->st, n);
        if (m->tied)
            m->lm_head = m->embed;
        else if ((rc = load_linear(m, nm->lm_head, m->vocab, m->d, &m->lm_head, e)))
            goto fail;
    }
    if ((rc = attach_wcache(m, o, e)))
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

void mx_model_set_backend(mx_model *m, const mx_backend *b, void *ctx)
{
    if (m->backend && m->backend->free)
        m->backend->free(m->backend_ctx);
    m->backend = b;
    m->backend_ctx = ctx;
}

void mx_model_free(mx_model *m)
{
    if (!m)
        return;
    mx_model_set_backend(m, NULL, NULL);
    if (m->remote)
        m->remote->release(m->remote);
    for (int i = 0; i < m->n_owned; i++)
        free(m->owned[i]);
    free(m->owned);
    mx_arena_free(&m->arena);
    mx_arena_free(&m->moe_arena);
    mx_moe_gather_state_free(m->gather);
    mx_wcache_free(m->wcache);
    mx_st_close(m->st);
    mx_config_free(&m->cfg);
    free(m->dir);
    free(m);
}
