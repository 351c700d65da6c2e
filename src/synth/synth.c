/* synth.c - the tensor plan, the random-but-reproducible weights and the
 * streaming writer of `mlxcel synth`.  The presets and every tensor name
 * come from the family table (model/family.h).
 *
 * Sections: options and plan | weight generation (pure functions of seed,
 * name and row) | expected rows | writing shards with progress. */
#include "synth/synth.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "quant/quant.h"
#include "util/dtype.h"
#include "util/parallel.h"
#include "util/clock.h"

/* ---- options and plan -------------------------------------------------- */

void mx_synth_opts_default(mx_synth_opts *o)
{
    memset(o, 0, sizeof *o);
    o->preset = "tiny";
    o->bits = 4;
    o->group_size = 64;
    o->scale_dtype = -1;
    o->layout = MX_SYNTH_LAYOUT_DEFAULT;
    o->shard_bytes = 5ull << 30;   /* mlx-lm's max_file_size_gb = 5 */
}

/* Routers stay at 8 bits, group 64, through per-module overrides, as mlx-lm's
 * MoE models quantize them. */
#define ROUTER_BITS 8
#define ROUTER_GROUP 64

typedef struct plan_builder {
    mx_synth_plan *plan;
    size_t cap;
    mx_err *e;
} plan_builder;

static mx_synth_tensor *pb_push(plan_builder *b)
{
    mx_synth_plan *p = b->plan;
    if (p->n == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 256;
        mx_synth_tensor *t = realloc(p->t, cap * sizeof *t);
        if (!t)
            return NULL;
        p->t = t;
        b->cap = cap;
    }
    mx_synth_tensor *t = &p->t[p->n++];
    memset(t, 0, sizeof *t);
    return t;
}

/* A quantized linear `module` of nmat stacked [rows, cols] matrices (nmat 0:
 * plain 2-D) gives three tensors. */
static int pb_quant(plan_builder *b, const char *module, int64_t nmat, int64_t rows,
                    int64_t cols, int bits, int gs, float gain)
{
    const mx_synth_plan *p = b->plan;
    if (cols % gs != 0 || (cols * bits) % 32 != 0)
        return mx_fail(b->e, MX_EINVAL, "synth %s: %s: in features %lld not divisible by "
                       "group size %d (or not packable at %d bits)", p->p->name, module,
                       (long long)cols, gs, bits);
    static const char *const suffix[3] = {"weight", "scales", "biases"};
    static const mx_synth_kind kinds[3] = {MX_SYNTH_QWEIGHT, MX_SYNTH_QSCALES, MX_SYNTH_QBIASES};
    for (int k = 0; k < 3; k++) {
        mx_synth_tensor *t = pb_push(b);
        if (!t)
            return mx_fail(b->e, MX_ENOMEM, "synth: out of memory planning tensors");
        snprintf(t->module, sizeof t->module, "%s", module);
        snprintf(t->name, sizeof t->name, "%s.%s", module, suffix[k]);
        t->kind = kinds[k];
        t->nmat = nmat ? nmat : 1;
        t->rows = rows;
        t->cols = cols;
        t->bits = bits;
        t->group_size = gs;
        t->gain = gain;
        int64_t last = k == 0 ? cols * bits / 32 : cols / gs;
        t->dtype = k == 0 ? MX_U32 : p->sdtype;
        t->ndim = nmat ? 3 : 2;
        int d = 0;
        if (nmat)
            t->shape[d++] = nmat;
        t->shape[d++] = rows;
        t->shape[d++] = last;
        t->nbytes = (uint64_t)t->nmat * (uint64_t)rows * (uint64_t)last * 
                    (uint64_t)(k == 0 ? 4 : mx_dtype_size(p->sdtype));
    }
    return MX_OK;
}

/* Formats a tensor name into a MX_SYNTH_NAME_MAX buffer (the family
 * table's names are short; an over-long one is cut). */
__attribute__((format(printf, 2, 3))) static void tname(char *buf, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, MX_SYNTH_NAME_MAX, fmt, ap);
    va_end(ap);
}

/* A float vector of `kind` (a norm weight, a bias) in dtype dt. */
static int pb_vec(plan_builder *b, const char *name, mx_synth_kind kind, mx_dtype dt, int64_t len)
{
    mx_synth_tensor *t = pb_push(b);
    if (!t)
        return mx_fail(b->e, MX_ENOMEM, "synth: out of memory planning tensors");
    snprintf(t->name, sizeof t->name, "%s", name);
    snprintf(t->module, sizeof t->module, "%s", name);
    t->kind = kind;
    t->dtype = dt;
    t->ndim = 1;
    t->shape[0] = len;
    t->nmat = t->rows = 1;
    t->cols = len;
    t->nbytes = (uint64_t)len * mx_dtype_size(t->dtype);
    return MX_OK;
}

/* An unquantized linear `module.weight` [rows, cols] in the model dtype. */
static int pb_fmat(plan_builder *b, const char *module, int64_t rows, int64_t cols, float gain)
{
    mx_synth_tensor *t = pb_push(b);
    if (!t)
        return mx_fail(b->e, MX_ENOMEM, "synth: out of memory planning tensors");
    tname(t->name, "%s.weight", module);
    tname(t->module, "%s", module);
    t->kind = MX_SYNTH_FMAT;
    t->dtype = b->plan->p->dtype;
    t->ndim = 2;
    t->shape[0] = rows;
    t->shape[1] = cols;
    t->nmat = 1;
    t->rows = rows;
    t->cols = cols;
    t->gain = gain;
    t->nbytes = (uint64_t)rows * (uint64_t)cols * mx_dtype_size(t->dtype);
    return MX_OK;
}

/* A depthwise convolution's `name` [channels, kernel, 1] in the model
 * dtype (mlx-lm's Conv1d layout); rows of spread gain/sqrt(kernel). */
static int pb_conv(plan_builder *b, const char *name, int64_t channels, int64_t kernel)
{
    mx_synth_tensor *t = pb_push(b);
    if (!t)
        return mx_fail(b->e, MX_ENOMEM, "synth: out of memory planning tensors");
    tname(t->name, "%s", name);
    tname(t->module, "%s", name);
    t->kind = MX_SYNTH_FMAT;
    t->dtype = b->plan->p->dtype;
    t->ndim = 3;
    t->shape[0] = channels;
    t->shape[1] = kernel;
    t->shape[2] = 1;
    t->nmat = 1;
    t->rows = channels;
    t->cols = kernel;
    t->gain = 1.0f;
    t->nbytes = (uint64_t)channels * (uint64_t)kernel * mx_dtype_size(t->dtype);
    return MX_OK;
}

/* "{model}.{layer i}" */
static void layer_prefix(const mx_names *nm, int i, char *buf)
{
    char layer[MX_SYNTH_NAME_MAX];
    tname(layer, nm->layer, i);
    tname(buf, "%s.%s", nm->model, layer);
}

/* A norm `{prefix}.{name}.weight` of width n, and its bias in LayerNorm
 * families; nothing when the family names no such norm. */
static int plan_norm(plan_builder *b, const char *prefix, const char *name, int64_t n)
{
    char m[MX_SYNTH_NAME_MAX];
    int rc;
    if (!name)
        return MX_OK;
    const mx_dtype dt = b->plan->p->dtype;
    tname(m, "%s%s%s.weight", prefix, *prefix ? "." : "", name);
    if ((rc = pb_vec(b, m, MX_SYNTH_NORM, dt, n)))
        return rc;
    if (b->plan->fam->norm != MX_NORM_LAYER)
        return MX_OK;
    tname(m, "%s%s%s.bias", prefix, *prefix ? "." : "", name);
    return pb_vec(b, m, MX_SYNTH_LBIAS, dt, n);
}

/* A gated MLP `{prefix}.{gate,up,down}` of width ff. */
static int plan_mlp(plan_builder *b, const char *prefix, const char *const *proj, int64_t nmat,
                    int64_t ff, int bits, int gs, float down_gain)
{
    const int64_t H = b->plan->p->hidden;
    char m[MX_SYNTH_NAME_MAX];
    int rc;
    tname(m, "%s.%s", prefix, proj[0]);
    if ((rc = pb_quant(b, m, nmat, ff, H, bits, gs, 1.0f)))
        return rc;
    tname(m, "%s.%s", prefix, proj[1]);
    if ((rc = pb_quant(b, m, nmat, ff, H, bits, gs, 1.0f)))
        return rc;
    tname(m, "%s.%s", prefix, proj[2]);
    return pb_quant(b, m, nmat, H, ff, bits, gs, down_gain);
}

/* Experts of one MoE block: stacked, or one tensor per expert. */
static int plan_experts(plan_builder *b, const char *blk, int64_t ff, int bits, int gs,
                        float down_gain)
{
    const int E = b->plan->cfg->num_experts;
    const mx_names *nm = &b->plan->fam->names;
    char m[MX_SYNTH_NAME_MAX], expert[MX_SYNTH_NAME_MAX];
    int rc;
    if (b->plan->opts.layout == MX_SYNTH_STACKED) {
        tname(m, "%s.%s", blk, nm->stacked);
        return plan_mlp(b, m, nm->stacked_proj, E, ff, bits, gs, down_gain);
    }
    for (int x = 0; x < E; x++) {
        tname(expert, nm->per_expert, x);
        tname(m, "%s.%s", blk, expert);
        if ((rc = plan_mlp(b, m, nm->expert_proj, 0, ff, bits, gs, down_gain)))
            return rc;
    }
    return MX_OK;
}

/* What the loader reads from config.json, read the same way here: the
 * type of layer l ("sliding_attention", "full_attention") or NULL. */
static const char *cfg_layer_type(const mx_config *c, int l)
{
    const cJSON *t = cJSON_GetArrayItem(mx_config_key(c, "layer_types"), l);
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

/* Whether layer l has routed experts: not in mlp_only_layers, past the
 * first_k_dense_replace dense layers, on the decoder_sparse_step grid. */
static int cfg_layer_is_moe(const mx_config *c, int l)
{
    for (int i = 0; i < c->n_mlp_only_layers; i++)
        if (c->mlp_only_layers[i] == l)
            return 0;
    if (l < (int)mx_config_number(c, "first_k_dense_replace", 0) ||
        l < (int)mx_config_number(c, "num_dense_layers", 0))
        return 0;
    return c->num_experts > 0 && c->decoder_sparse_step > 0 && (l + 1) % c->decoder_sparse_step == 0;
}

/* Layer l's attention: q/k/v/o (no v on a K = V full-attention layer),
 * their biases, q/k norms, at the layer's head size and kv heads. */
static int plan_attention(plan_builder *b, const char *pre, int l, float out_gain)
{
    const mx_preset *P = b->plan->p;
    const mx_config *c = b->plan->cfg;
    const mx_family *F = b->plan->fam;
    const mx_names *nm = &F->names;
    const int bits = b->plan->opts.bits, gs = b->plan->opts.group_size;
    const mx_dtype dt = P->dtype;
    int64_t hd = c->head_dim, nkv = c->num_key_value_heads;
    int k_eq_v = 0;
    const char *type = cfg_layer_type(c, l);
    if (type && !strcmp(type, "full_attention") && mx_config_number(c, "global_head_dim", 0) > 0) {
        hd = (int64_t)mx_config_number(c, "global_head_dim", 0);
        k_eq_v = cJSON_IsTrue(mx_config_key(c, "attention_k_eq_v"));
        if (k_eq_v)
            nkv = (int64_t)mx_config_number(c, "num_global_key_value_heads", (double)nkv);
    }
    const int64_t H = P->hidden, qw = (int64_t)c->num_attention_heads * hd, kvw = nkv * hd;
    char m[MX_SYNTH_NAME_MAX];
    int rc;
    for (int k = 0; k < 4; k++) {
        if (k == 2 && k_eq_v)
            continue;
        /* a gated output (Qwen3-Next): q_proj gives each head's q and gate */
        int64_t rows = k == 0 ? qw * (F->attn_out_gate ? 2 : 1) : k == 3 ? H : kvw;
        int64_t cols = k == 3 ? qw : H;
        tname(m, "%s.%s.%s", pre, nm->attn, nm->attn_proj[k]);
        if ((rc = pb_quant(b, m, 0, rows, cols, bits, gs, k == 3 ? out_gain : 1.0f)))
            return rc;
        if (k == 3 ? P->o_bias : P->qkv_bias) {
            tname(m, "%s.%s.%s.bias", pre, nm->attn, nm->attn_proj[k]);
            if ((rc = pb_vec(b, m, MX_SYNTH_LBIAS, dt, rows)))
                return rc;
        }
    }
    if (F->qk_norm != MX_QK_NORM_NONE) {
        int full = F->qk_norm == MX_QK_NORM_FULL;
        tname(m, "%s.%s.%s.weight", pre, nm->attn, nm->qk_norm[0]);
        if ((rc = pb_vec(b, m, MX_SYNTH_NORM, dt, full ? qw : hd)))
            return rc;
        tname(m, "%s.%s.%s.weight", pre, nm->attn, nm->qk_norm[1]);
        if ((rc = pb_vec(b, m, MX_SYNTH_NORM, dt, full ? kvw : hd)))
            return rc;
    }
    return MX_OK;
}

/* A gated DeltaNet block (Qwen3-Next's linear_attn): the q/k/v/z and b/a
 * input projections, the causal convolution over q, k and v, the decay's
 * A_log and dt_bias, the gated output norm, out_proj. */
static int plan_deltanet(plan_builder *b, const char *pre, float out_gain)
{
    const mx_synth_plan *pl = b->plan;
    const mx_names *nm = &pl->fam->names;
    const mx_preset *P = pl->p;
    const int bits = pl->opts.bits, gs = pl->opts.group_size;
    const int64_t H = P->hidden, nv = P->linear_v_heads;
    const int64_t kd = (int64_t)P->linear_k_heads * P->linear_head_dim, vd = nv * P->linear_head_dim;
    char blk[MX_SYNTH_NAME_MAX], m[MX_SYNTH_NAME_MAX];
    int rc;
    tname(blk, "%s.%s", pre, nm->deltanet);
    tname(m, "%s.%s", blk, nm->dn_qkvz);
    if ((rc = pb_quant(b, m, 0, 2 * kd + 2 * vd, H, bits, gs, 1.0f)))
        return rc;
    tname(m, "%s.%s", blk, nm->dn_ba);
    if ((rc = pb_quant(b, m, 0, 2 * nv, H, bits, gs, 1.0f)))
        return rc;
    tname(m, "%s.%s.weight", blk, nm->dn_conv);
    if ((rc = pb_conv(b, m, 2 * kd + vd, P->conv_kernel)))
        return rc;
    /* A_log near 1 (a decay rate of about e), dt_bias small */
    tname(m, "%s.%s", blk, nm->dn_a_log);
    if ((rc = pb_vec(b, m, MX_SYNTH_NORM, P->dtype, nv)))
        return rc;
    tname(m, "%s.%s", blk, nm->dn_dt_bias);
    if ((rc = pb_vec(b, m, MX_SYNTH_LBIAS, P->dtype, nv)))
        return rc;
    tname(m, "%s.%s.weight", blk, nm->dn_norm);
    if ((rc = pb_vec(b, m, MX_SYNTH_NORM, P->dtype, P->linear_head_dim)))
        return rc;
    tname(m, "%s.%s", blk, nm->dn_out);
    return pb_quant(b, m, 0, H, vd, bits, gs, out_gain);
}

/* A short-convolution block (LFM2's conv): in_proj to B, C and x, the
 * depthwise convolution, out_proj. */
static int plan_shortconv(plan_builder *b, const char *pre, float out_gain)
{
    const mx_synth_plan *pl = b->plan;
    const mx_names *nm = &pl->fam->names;
    const int bits = pl->opts.bits, gs = pl->opts.group_size;
    const int64_t H = pl->p->hidden;
    char blk[MX_SYNTH_NAME_MAX], m[MX_SYNTH_NAME_MAX];
    int rc;
    tname(blk, "%s.%s", pre, nm->shortconv);
    tname(m, "%s.%s", blk, nm->sc_in);
    if ((rc = pb_quant(b, m, 0, 3 * H, H, bits, gs, 1.0f)))
        return rc;
    tname(m, "%s.%s.weight", blk, nm->sc_conv);
    if ((rc = pb_conv(b, m, H, pl->p->conv_kernel)))
        return rc;
    tname(m, "%s.%s", blk, nm->sc_out);
    return pb_quant(b, m, 0, H, H, bits, gs, out_gain);
}

/* An MoE layer's block at blk: the router (8-bit, or unquantized where the
 * family keeps it so) with its choice bias, input scale and per-expert
 * scales, the routed experts, the shared experts. */
static int plan_moe(plan_builder *b, const char *blk, float out_gain)
{
    const mx_preset *P = b->plan->p;
    const mx_config *c = b->plan->cfg;
    const mx_family *F = b->plan->fam;
    const mx_names *nm = &F->names;
    const int bits = b->plan->opts.bits, gs = b->plan->opts.group_size;
    const int rb = b->plan->router_bits, rg = b->plan->router_group;
    const int64_t H = P->hidden, E = c->num_experts;
    char m[MX_SYNTH_NAME_MAX];
    int rc;
    tname(m, "%s.%s", blk, nm->router);
    if (F->router_store == MX_ROUTER_FLOAT)
        rc = pb_fmat(b, m, E, H, 1.0f);
    else if (F->router_store == MX_ROUTER_DEFAULT_BITS)
        rc = pb_quant(b, m, 0, E, H, bits, gs, 1.0f);
    else
        rc = pb_quant(b, m, 0, E, H, rb, rg, 1.0f);
    if (rc)
        return rc;
    if (nm->router_bias) {   /* F32, as mlx-lm keeps it */
        tname(m, "%s.%s", blk, nm->router_bias);
        if ((rc = pb_vec(b, m, MX_SYNTH_LBIAS, MX_F32, E)))
            return rc;
    }
    if (nm->router_scale) {
        tname(m, "%s.%s", blk, nm->router_scale);
        if ((rc = pb_vec(b, m, MX_SYNTH_NORM, P->dtype, H)))
            return rc;
    }
    if (nm->expert_scale) {
        tname(m, "%s.%s", blk, nm->expert_scale);
        if ((rc = pb_vec(b, m, MX_SYNTH_NORM, P->dtype, E)))
            return rc;
    }
    if ((rc = plan_experts(b, blk, c->moe_intermediate_size, bits, gs, out_gain)))
        return rc;
    int64_t shared = 0;
    if (F->shared_expert == MX_SHARED_GATED && c->shared_expert_intermediate_size > 0)
        shared = c->shared_expert_intermediate_size;
    else if (F->shared_expert == MX_SHARED_PLAIN)
        shared = (int64_t)c->moe_intermediate_size *
                 (int64_t)mx_config_number(c, "n_shared_experts", 0);
    if (shared <= 0)
        return MX_OK;
    tname(m, "%s.%s", blk, nm->shared);
    if ((rc = plan_mlp(b, m, nm->mlp_proj, 0, shared, bits, gs, out_gain)))
        return rc;
    if (F->shared_expert != MX_SHARED_GATED)
        return MX_OK;
    tname(m, "%s.%s", blk, nm->shared_gate);
    return pb_quant(b, m, 0, 1, H, rb, rg, 1.0f);
}

/* One layer, as the loader binds it from the same config.json. */
static int plan_layer(plan_builder *b, int i)
{
    const mx_preset *P = b->plan->p;
    const mx_config *c = b->plan->cfg;
    const mx_family *F = b->plan->fam;
    const mx_names *nm = &F->names;
    const int bits = b->plan->opts.bits, gs = b->plan->opts.group_size;
    /* Residual branches scaled down so 2*layers additions keep the residual
     * stream O(1) (as GPT-2 style initialisation does). */
    const float out_gain = 1.0f / sqrtf(2.0f * (float)P->layers);
    const int64_t H = P->hidden;
    char pre[MX_SYNTH_NAME_MAX], m[MX_SYNTH_NAME_MAX];
    int rc;
    layer_prefix(nm, i, pre);

    if ((rc = plan_norm(b, pre, nm->attn_norm, H)) || (rc = plan_norm(b, pre, nm->ffn_norm, H)) ||
        (rc = plan_norm(b, pre, nm->attn_out_norm, H)) || (rc = plan_norm(b, pre, nm->ffn_out_norm, H)))
        return rc;
    const char mixer = mx_preset_mixer(P, i);
    rc = mixer == 'D'   ? plan_deltanet(b, pre, out_gain)
         : mixer == 'C' ? plan_shortconv(b, pre, out_gain)
                        : plan_attention(b, pre, i, out_gain);
    if (rc)
        return rc;
    if (nm->layer_scalar) {
        tname(m, "%s.%s", pre, nm->layer_scalar);
        if ((rc = pb_vec(b, m, MX_SYNTH_NORM, P->dtype, 1)))
            return rc;
    }
    const int moe = cfg_layer_is_moe(c, i), parallel = moe && F->parallel_dense;
    if (!moe || parallel) {
        tname(m, "%s.%s", pre, nm->mlp);
        if ((rc = plan_mlp(b, m, nm->mlp_proj, 0, c->intermediate_size, bits, gs, out_gain)))
            return rc;
    }
    if (!moe)
        return MX_OK;
    if (parallel && ((rc = plan_norm(b, pre, nm->mlp_out_norm, H)) ||
                     (rc = plan_norm(b, pre, nm->moe_in_norm, H)) ||
                     (rc = plan_norm(b, pre, nm->moe_out_norm, H))))
        return rc;
    char blk[MX_SYNTH_NAME_MAX];
    if (nm->moe[0])
        tname(blk, "%s.%s", pre, nm->moe);
    else
        tname(blk, "%s", pre);
    return plan_moe(b, blk, out_gain);
}

static int cmp_tensor(const void *a, const void *b)
{
    return strcmp(((const mx_synth_tensor *)a)->name, ((const mx_synth_tensor *)b)->name);
}

/* mlx-lm's make_shards: walk the (sorted) tensors and start a new shard when
 * the next tensor would push the current one past the limit. */
static void plan_shards(mx_synth_plan *p)
{
    uint64_t cur = 0;
    int k = 0;
    for (size_t i = 0; i < p->n; i++) {
        if (cur > 0 && cur + p->t[i].nbytes > p->opts.shard_bytes) {
            k++;
            cur = 0;
        }
        p->t[i].shard = k;
        cur += p->t[i].nbytes;
    }
    p->nshards = p->n ? k + 1 : 0;
}

/* The config.json synth writes, parsed as the loader parses it: the
 * family's aliases and defaults applied. */
static int plan_config(mx_synth_plan *plan, mx_err *e)
{
    cJSON *j = mx_synth_config_json(plan);
    char *text = j ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    plan->cfg = calloc(1, sizeof *plan->cfg);
    if (!text || !plan->cfg) {
        free(text);
        return mx_fail(e, MX_ENOMEM, "synth: out of memory building config.json");
    }
    int rc = mx_config_parse(text, "config.json", plan->cfg, e);
    free(text);
    if (!rc)
        rc = mx_config_apply_aliases(plan->cfg, plan->fam->aliases, e);
    if (rc)
        return rc;
    mx_config *c = plan->cfg;
    plan->fam->apply_defaults(c);
    if (c->head_dim == MX_UNSET && c->num_attention_heads > 0)
        c->head_dim = c->hidden_size / c->num_attention_heads;
    if (c->num_experts <= 0 || c->head_dim <= 0 || c->intermediate_size <= 0 ||
        c->moe_intermediate_size <= 0)
        return mx_fail(e, MX_EINVAL, "synth %s: the preset's config has no experts, head size or "
                       "MLP widths", plan->p->name);
    return MX_OK;
}

int mx_synth_plan_build(const mx_synth_opts *o, mx_synth_plan *plan, mx_err *e)
{
    memset(plan, 0, sizeof *plan);
    plan->opts = *o;
    const mx_preset *found = mx_preset_find(o->preset, &plan->fam);
    if (!found)
        return mx_fail(e, MX_EINVAL, "synth: unknown preset '%s'", o->preset ? o->preset : "(null)");
    if (!mx_qtraits_for(o->bits))
        return mx_fail(e, MX_EINVAL, "synth: --bits %d is not supported (2, 3, 4, 5, 6, 8)", o->bits);
    if (!mx_group_size_ok(o->group_size))
        return mx_fail(e, MX_EINVAL, "synth: --group-size %d is not supported (32, 64, 128)",
                       o->group_size);
    if (o->layers < 0 || o->layers > MX_MAX_LAYERS)
        return mx_fail(e, MX_EINVAL, "synth: --layers %d is out of range (1..%d)", o->layers,
                       MX_MAX_LAYERS);
    mx_preset *own = malloc(sizeof *own);
    if (!own)
        return mx_fail(e, MX_ENOMEM, "synth: out of memory");
    *own = *found;
    if (o->layers > 0)
        own->layers = o->layers;
    plan->p = own;
    plan->sdtype = o->scale_dtype < 0 ? plan->p->dtype : (mx_dtype)o->scale_dtype;
    int rc;
    if (plan->sdtype != MX_F16 && plan->sdtype != MX_BF16 && plan->sdtype != MX_F32) {
        rc = mx_fail(e, MX_EINVAL, "synth: scale dtype must be f16, bf16 or f32");
        goto fail;
    }
    if (plan->opts.layout == MX_SYNTH_LAYOUT_DEFAULT)
        plan->opts.layout = plan->p->stacked ? MX_SYNTH_STACKED : MX_SYNTH_PER_EXPERT;
    if (plan->opts.shard_bytes == 0)
        plan->opts.shard_bytes = 5ull << 30;
    plan->router_bits = ROUTER_BITS;
    plan->router_group = ROUTER_GROUP;
    if ((rc = plan_config(plan, e)))
        goto fail;

    const mx_preset *P = plan->p;
    const mx_names *nm = &plan->fam->names;
    plan_builder b = {plan, 0, e};
    char name[MX_SYNTH_NAME_MAX];
    int bits = o->bits, gs = o->group_size;
    /* Embedding rows of unit spread; the output head a little sharper so
     * greedy decoding has clear margins. */
    tname(name, "%s.%s", nm->model, nm->embed);
    if ((rc = pb_quant(&b, name, 0, P->vocab, P->hidden, bits, gs, sqrtf((float)P->hidden))))
        goto fail;
    for (int i = 0; i < P->layers; i++)
        if ((rc = plan_layer(&b, i)))
            goto fail;
    if ((rc = plan_norm(&b, nm->model, nm->final_norm, P->hidden)))
        goto fail;
    if (plan->cfg->tie_word_embeddings != 1) {
        if ((rc = pb_quant(&b, nm->lm_head, 0, P->vocab, P->hidden, bits, gs, 2.0f)))
            goto fail;
        tname(name, "%s.bias", nm->lm_head);
        if (P->lm_head_bias && (rc = pb_vec(&b, name, MX_SYNTH_LBIAS, P->dtype, P->vocab)))
            goto fail;
    }

    qsort(plan->t, plan->n, sizeof *plan->t, cmp_tensor);
    for (size_t i = 0; i < plan->n; i++)
        plan->total_bytes += plan->t[i].nbytes;
    plan_shards(plan);
    return MX_OK;
fail:
    mx_synth_plan_free(plan);
    return rc;
}

void mx_synth_plan_free(mx_synth_plan *plan)
{
    if (!plan)
        return;
    free(plan->t);
    plan->t = NULL;
    plan->n = 0;
    free((void *)plan->p);
    plan->p = NULL;
    if (plan->cfg)
        mx_config_free(plan->cfg);
    free(plan->cfg);
    plan->cfg = NULL;
}

const mx_synth_tensor *mx_synth_plan_find(const mx_synth_plan *plan, const char *name)
{
    mx_synth_tensor key;
    size_t len = strlen(name);
    if (len >= sizeof key.name)
        return NULL;
    memcpy(key.name, name, len + 1);
    return bsearch(&key, plan->t, plan->n, sizeof *plan->t, cmp_tensor);
}

void mx_synth_shard_name(const mx_synth_plan *plan, int k, char *buf, size_t cap)
{
    if (plan->nshards <= 1)
        snprintf(buf, cap, "model.safetensors");
    else
        snprintf(buf, cap, "model-%05d-of-%05d.safetensors", k + 1, plan->nshards);
}

/* ---- weight generation ------------------------------------------------- */

/* splitmix64's finaliser: a strong 64-bit mixer. */
static inline uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t hash_name(uint64_t seed, const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;   /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return mix64(h ^ mix64(seed + 0x9e3779b97f4a7c15ull));
}

/* Independent streams per (module, purpose, matrix, row). */
enum { STREAM_CODES = 1, STREAM_GROUPS = 2, STREAM_VEC = 3 };

static inline uint64_t row_state(uint64_t base, int stream, int64_t mat, int64_t row)
{
    return mix64(base ^ mix64(((uint64_t)mat << 40) ^ (uint64_t)row ^ ((uint64_t)stream << 60)));
}

static inline uint64_t next64(uint64_t *s)
{
    *s += 0x9e3779b97f4a7c15ull;
    return mix64(*s);
}

static inline float unitf(uint64_t u)   /* [0, 1) */
{
    return (float)(u >> 40) * (1.0f / 16777216.0f);
}

static inline float round_dtype(float v, mx_dtype t) { return mx_dtype_round(v, t); }

static inline void store_dtype(void *dst, size_t i, float v, mx_dtype t)
{
    mx_dtype_put(dst, t, (int64_t)i, v);
}

/* Packed codes of one row: uniform random codes are uniform random bits, so
 * the row is just random bytes, whatever the bit width. */
static void gen_codes_row(uint64_t base, int64_t mat, int64_t row, uint8_t *dst, size_t nbytes)
{
    uint64_t s = row_state(base, STREAM_CODES, mat, row);
    size_t i = 0;
    for (; i + 8 <= nbytes; i += 8) {
        uint64_t u = next64(&s);
        memcpy(dst + i, &u, 8);   /* little-endian hosts: byte order of the stream */
    }
    if (i < nbytes) {
        uint64_t u = next64(&s);
        memcpy(dst + i, &u, nbytes - i);
    }
}

/* Scale and bias of each group of one row, rounded to the scale dtype.
 * Codes are uniform on [0, 2^bits), mean m and std sq; with w = s*q + b,
 * |s| = sigma/sq gives the row spread sigma and b = -s*m (plus a small
 * offset) centres it.  A quarter of the scales are negative, as MLX produces
 * when a group's larger-magnitude extreme is negative. */
static void gen_groups_row(const mx_synth_tensor *t, uint64_t base, mx_dtype sdt, int64_t mat,
                           int64_t row, float *scales, float *biases)
{
    uint64_t s = row_state(base, STREAM_GROUPS, mat, row);
    double levels = (double)((1u << t->bits) - 1);
    float mid = (float)(levels / 2.0);
    float sq = (float)sqrt(levels * (levels + 2.0) / 12.0);
    float sigma = t->gain / sqrtf((float)t->cols);
    float unit_scale = sigma / sq;
    int64_t ng = t->cols / t->group_size;
    for (int64_t g = 0; g < ng; g++) {
        /* one draw per group: bits 0-1 sign, 8-31 magnitude, 40-63 offset */
        uint64_t u = next64(&s);
        float sign = (u & 3) == 0 ? -1.0f : 1.0f;
        float mag = 0.75f + 0.5f * (float)((u >> 8) & 0xffffff) * (1.0f / 16777216.0f);
        float sc = round_dtype(sign * mag * unit_scale, sdt);
        float off = 0.2f * sigma * (2.0f * unitf(u) - 1.0f);
        scales[g] = sc;
        biases[g] = round_dtype(-sc * mid + off, sdt);
    }
}

/* A norm weight (near 1), a small bias, or an unquantized matrix's
 * element (uniform with the spread gain / sqrt(cols)), before dtype
 * rounding. */
static float gen_vec_value(const mx_synth_tensor *t, uint64_t *s)
{
    float u = 2.0f * unitf(next64(s)) - 1.0f;
    if (t->kind == MX_SYNTH_FMAT)
        return u * sqrtf(3.0f) * t->gain / sqrtf((float)t->cols);
    return t->kind == MX_SYNTH_NORM ? 1.0f + 0.1f * u : 0.1f * u;
}

/* Bytes of one "row" of a tensor as written: matrix rows for quantized
 * tensors; a float vector is one row. */
static size_t tensor_row_bytes(const mx_synth_tensor *t)
{
    switch (t->kind) {
    case MX_SYNTH_QWEIGHT: return (size_t)(t->cols * t->bits / 8);
    case MX_SYNTH_QSCALES:
    case MX_SYNTH_QBIASES: return (size_t)(t->cols / t->group_size) * mx_dtype_size(t->dtype);
    default: return (size_t)t->cols * mx_dtype_size(t->dtype);
    }
}

/* Fills global row gr (matrix gr / rows, row gr % rows) of tensor t. */
static void gen_row(const mx_synth_tensor *t, uint64_t base, int64_t gr, uint8_t *dst,
                    float *tmp /* 2 * groups floats */)
{
    int64_t mat = gr / t->rows, row = gr % t->rows;
    switch (t->kind) {
    case MX_SYNTH_QWEIGHT:
        gen_codes_row(base, mat, row, dst, tensor_row_bytes(t));
        break;
    case MX_SYNTH_QSCALES:
    case MX_SYNTH_QBIASES: {
        int64_t ng = t->cols / t->group_size;
        gen_groups_row(t, base, t->dtype, mat, row, tmp, tmp + ng);
        const float *src = t->kind == MX_SYNTH_QSCALES ? tmp : tmp + ng;
        for (int64_t g = 0; g < ng; g++)
            store_dtype(dst, (size_t)g, src[g], t->dtype);
        break;
    }
    default: {
        uint64_t s = row_state(base, STREAM_VEC, mat, row);
        for (int64_t c = 0; c < t->cols; c++)
            store_dtype(dst, (size_t)c, gen_vec_value(t, &s), t->dtype);
        break;
    }
    }
}

/* ---- expected rows ----------------------------------------------------- */

/* Element k of a little-endian bit stream of `bits`-bit codes. */
static uint32_t unpack_code(const uint8_t *row, int64_t k, int bits)
{
    uint64_t bit = (uint64_t)k * (uint64_t)bits;
    uint32_t v = 0;
    for (int j = 0; j < bits; j++, bit++)
        v |= (uint32_t)((row[bit >> 3] >> (bit & 7)) & 1u) << j;
    return v;
}

int mx_synth_expected_row(const mx_synth_plan *plan, const char *name, int64_t index,
                          int64_t row, float *out, mx_err *e)
{
    const mx_synth_tensor *t = mx_synth_plan_find(plan, name);
    char buf[MX_SYNTH_NAME_MAX + 8];
    if (!t) {   /* a module path: its .weight */
        snprintf(buf, sizeof buf, "%s.weight", name);
        t = mx_synth_plan_find(plan, buf);
        if (t && t->kind != MX_SYNTH_QWEIGHT && t->kind != MX_SYNTH_FMAT)
            t = NULL;
    }
    if (!t)
        return mx_fail(e, MX_EINVAL, "synth: no tensor or module '%s' in the plan", name);
    if (index < 0 || index >= t->nmat || row < 0 || row >= t->rows)
        return mx_fail(e, MX_ERANGE, "synth: %s: matrix %lld row %lld out of range",
                       t->name, (long long)index, (long long)row);
    uint64_t base = hash_name(plan->opts.seed, t->module);
    if (t->kind == MX_SYNTH_NORM || t->kind == MX_SYNTH_LBIAS || t->kind == MX_SYNTH_FMAT) {
        uint64_t s = row_state(base, STREAM_VEC, index, row);
        for (int64_t c = 0; c < t->cols; c++)
            out[c] = round_dtype(gen_vec_value(t, &s), t->dtype);
        return MX_OK;
    }
    int64_t ng = t->cols / t->group_size;
    size_t rb = (size_t)(t->cols * t->bits / 8);
    uint8_t *codes = malloc(rb);
    float *gs = malloc(2 * (size_t)ng * sizeof *gs);
    if (!codes || !gs) {
        free(codes);
        free(gs);
        return mx_fail(e, MX_ENOMEM, "synth: out of memory");
    }
    gen_codes_row(base, index, row, codes, rb);
    gen_groups_row(t, base, plan->sdtype, index, row, gs, gs + ng);
    for (int64_t c = 0; c < t->cols; c++) {
        int64_t g = c / t->group_size;
        out[c] = gs[g] * (float)unpack_code(codes, c, t->bits) + gs[ng + g];
    }
    free(codes);
    free(gs);
    return MX_OK;
}

/* ---- writing ----------------------------------------------------------- */

typedef struct progress {
    int on, tty;
    uint64_t total, done;
    double t0, last;
    int last_pct;
} progress;

static void progress_show(progress *pg, int final)
{
    if (!pg->on)
        return;
    double now = mx_now();
    int pct = pg->total ? (int)(100.0 * (double)pg->done / (double)pg->total) : 100;
    /* On a terminal redraw twice a second; into a log, a line per 10%. */
    if (!final && (pct >= 100 || (pg->tty ? now - pg->last < 0.5 : pct / 10 == pg->last_pct / 10)))
        return;
    pg->last = now;
    pg->last_pct = pct;
    double el = now - pg->t0;
    double mbs = el > 0 ? (double)pg->done / 1e6 / el : 0.0;
    int gb = pg->total >= 1000000000ull;
    double unit = gb ? 1e9 : 1e6;
    fprintf(stderr, "%ssynth: %3d%%  %.2f / %.2f %s  %.0f MB/s%s", pg->tty ? "\r" : "", pct,
            (double)pg->done / unit, (double)pg->total / unit, gb ? "GB" : "MB", mbs,
            pg->tty && !final ? "" : "\n");
    fflush(stderr);
}

/* The data of a shard is generated in chunks of about 32 MB that may span
 * many tensors (per-expert checkpoints have thousands of small ones), cut
 * into work items of about 256 KB that the threads share; one parallel
 * region and one write per chunk. */
#define CHUNK_BYTES (32u << 20)
#define ITEM_BYTES (256u << 10)

typedef struct work_item {
    const mx_synth_tensor *t;
    uint64_t base;            /* hash of the tensor's module */
    int64_t r0, r1;           /* global rows (matrix * rows + row) */
    size_t off;               /* into the chunk buffer */
} work_item;

typedef struct chunker {
    work_item *items;
    size_t n, cap;
    size_t fill;              /* bytes of the chunk planned so far */
    size_t chunk_cap;         /* buffer size */
} chunker;

static int chunk_push(chunker *c, const mx_synth_tensor *t, uint64_t base, int64_t r0,
                      int64_t r1, size_t rb)
{
    if (c->n == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 1024;
        work_item *it = realloc(c->items, cap * sizeof *it);
        if (!it)
            return -1;
        c->items = it;
        c->cap = cap;
    }
    c->items[c->n++] = (work_item){t, base, r0, r1, c->fill};
    c->fill += (size_t)(r1 - r0) * rb;
    return 0;
}

/* Generates the planned items into buf and writes them; resets the chunk. */
static int chunk_flush(chunker *c, mx_st_writer *w, uint8_t *buf, progress *pg, mx_err *e)
{
    if (c->fill == 0)
        return MX_OK;
    int fail = 0;
    long n = (long)c->n;
    /* Small chunks stay on one thread: waking a team costs more. */
    int nth = c->fill >= (1u << 20) ? mx_threads() : 1;
#pragma omp parallel num_threads(nth) reduction(| : fail)
    {
        float *tmp = NULL;
        size_t tcap = 0;
#pragma omp for schedule(dynamic, 1)
        for (long i = 0; i < n; i++) {
            const work_item *it = &c->items[i];
            const mx_synth_tensor *t = it->t;
            size_t need = 2 * (size_t)(t->group_size ? t->cols / t->group_size : 1);
            if (need > tcap) {
                free(tmp);
                tmp = malloc(need * sizeof *tmp);
                tcap = tmp ? need : 0;
            }
            if (!tmp) {
                fail = 1;
                continue;
            }
            size_t rb = tensor_row_bytes(t);
            for (int64_t r = it->r0; r < it->r1; r++)
                gen_row(t, it->base, r, buf + it->off + (size_t)(r - it->r0) * rb, tmp);
        }
        free(tmp);
    }
    if (fail)
        return mx_fail(e, MX_ENOMEM, "synth: out of memory generating weights");
    int rc = mx_st_writer_write(w, buf, c->fill, e);
    if (rc)
        return rc;
    pg->done += c->fill;
    progress_show(pg, 0);
    c->n = 0;
    c->fill = 0;
    return MX_OK;
}

/* Plans tensor t into chunks, flushing full ones. */
static int write_tensor(chunker *c, mx_st_writer *w, const mx_synth_tensor *t, uint64_t seed,
                        uint8_t *buf, progress *pg, mx_err *e)
{
    uint64_t base = hash_name(seed, t->module);
    size_t rb = tensor_row_bytes(t);
    int64_t nrows = t->nmat * t->rows;
    int64_t per_item = (int64_t)(ITEM_BYTES / rb);
    if (per_item < 1)
        per_item = 1;
    for (int64_t r0 = 0; r0 < nrows;) {
        if (c->fill + rb > c->chunk_cap) {
            int rc = chunk_flush(c, w, buf, pg, e);
            if (rc)
                return rc;
        }
        int64_t room = (int64_t)((c->chunk_cap - c->fill) / rb);
        int64_t r1 = r0 + (per_item < room ? per_item : room);
        if (r1 > nrows)
            r1 = nrows;
        if (chunk_push(c, t, base, r0, r1, rb))
            return mx_fail(e, MX_ENOMEM, "synth: out of memory");
        r0 = r1;
    }
    return MX_OK;
}

static int write_shard(const mx_synth_plan *plan, int k, const char *dir, uint8_t *buf,
                       size_t buf_cap, progress *pg, mx_err *e)
{
    size_t n = 0;
    for (size_t i = 0; i < plan->n; i++)
        n += plan->t[i].shard == k;
    mx_st_decl *decls = calloc(n ? n : 1, sizeof *decls);
    const mx_synth_tensor **ts = calloc(n ? n : 1, sizeof *ts);
    if (!decls || !ts) {
        free(decls);
        free(ts);
        return mx_fail(e, MX_ENOMEM, "synth: out of memory");
    }
    size_t j = 0;
    for (size_t i = 0; i < plan->n; i++) {
        const mx_synth_tensor *t = &plan->t[i];
        if (t->shard != k)
            continue;
        ts[j] = t;
        decls[j].name = t->name;
        decls[j].dtype = t->dtype;
        decls[j].ndim = t->ndim;
        for (int d = 0; d < t->ndim; d++)
            decls[j].shape[d] = t->shape[d];
        j++;
    }
    char fname[64], path[4096];
    mx_synth_shard_name(plan, k, fname, sizeof fname);
    snprintf(path, sizeof path, "%s/%s", dir, fname);
    mx_st_writer *w = NULL;
    int rc = mx_st_writer_open(path, decls, n, &w, e);
    chunker c = {.chunk_cap = buf_cap};
    for (size_t i = 0; rc == MX_OK && i < n; i++)
        rc = write_tensor(&c, w, ts[i], plan->opts.seed, buf, pg, e);
    if (rc == MX_OK)
        rc = chunk_flush(&c, w, buf, pg, e);
    free(c.items);
    if (w) {
        mx_err e2;
        int rc2 = mx_st_writer_close(w, rc ? &e2 : e);
        if (!rc)
            rc = rc2;
    }
    free(decls);
    free(ts);
    return rc;
}

static int write_index(const mx_synth_plan *plan, const char *dir, mx_err *e)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(root, "metadata");
    cJSON_AddNumberToObject(meta, "total_size", (double)plan->total_bytes);
    cJSON *map = cJSON_AddObjectToObject(root, "weight_map");
    char fname[64];
    for (size_t i = 0; i < plan->n; i++) {
        mx_synth_shard_name(plan, plan->t[i].shard, fname, sizeof fname);
        cJSON_AddStringToObject(map, plan->t[i].name, fname);
    }
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (!text)
        return mx_fail(e, MX_ENOMEM, "synth: out of memory writing the index");
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    FILE *f = fopen(path, "wb");
    int ok = f && fputs(text, f) >= 0 && fputc('\n', f) != EOF;
    if (f && fclose(f) != 0)
        ok = 0;
    free(text);
    if (!ok)
        return mx_fail(e, MX_EIO, "%s: cannot write: %s", path, strerror(errno));
    return MX_OK;
}

/* mkdir -p */
static int make_dirs(const char *dir, mx_err *e)
{
    char p[4096];
    if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p)
        return mx_fail(e, MX_EINVAL, "synth: output path too long");
    for (char *c = p + 1; ; c++) {
        if (*c == '/' || *c == 0) {
            char save = *c;
            *c = 0;
            if (mkdir(p, 0777) != 0 && errno != EEXIST)
                return mx_fail(e, MX_EIO, "%s: cannot create directory: %s", p, strerror(errno));
            *c = save;
            if (!save)
                break;
        }
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return mx_fail(e, MX_EIO, "%s: not a directory", dir);
    return MX_OK;
}

static int ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

/* Refuses a non-empty dir without force; with force removes the weight files
 * a previous checkpoint left (stale shards would otherwise be loaded when no
 * index names them). */
static int prepare_dir(const char *dir, int force, mx_err *e)
{
    int rc = make_dirs(dir, e);
    if (rc)
        return rc;
    DIR *d = opendir(dir);
    if (!d)
        return mx_fail(e, MX_EIO, "%s: cannot open: %s", dir, strerror(errno));
    int nonempty = 0;
    struct dirent *de;
    char path[4096];
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        nonempty = 1;
        if (!force)
            break;
        if (ends_with(de->d_name, ".safetensors") ||
            !strcmp(de->d_name, "model.safetensors.index.json")) {
            snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
            if (unlink(path) != 0) {
                closedir(d);
                return mx_fail(e, MX_EIO, "%s: cannot remove: %s", path, strerror(errno));
            }
        }
    }
    closedir(d);
    if (nonempty && !force)
        return mx_fail(e, MX_EINVAL, "%s: directory is not empty (use --force to replace "
                       "the checkpoint in it)", dir);
    return MX_OK;
}

int mx_synth_write(const mx_synth_opts *o, const char *dir, mx_err *e)
{
    mx_synth_plan plan;
    int rc = mx_synth_plan_build(o, &plan, e);
    if (rc)
        return rc;
    uint8_t *buf = NULL;
    if ((rc = prepare_dir(dir, o->force, e)))
        goto done;
    /* Buffer for one chunk: 32 MB, or one row when a row is larger. */
    size_t cap = CHUNK_BYTES;
    for (size_t i = 0; i < plan.n; i++) {
        size_t rb = tensor_row_bytes(&plan.t[i]);
        if (rb > cap)
            cap = rb;
    }
    buf = malloc(cap);
    if (!buf) {
        rc = mx_fail(e, MX_ENOMEM, "synth: out of memory (%zu byte buffer)", cap);
        goto done;
    }
    progress pg = {.on = o->progress, .tty = isatty(2), .total = plan.total_bytes,
                   .t0 = mx_now(), .last_pct = 0};
    if (pg.on)
        fprintf(stderr, "synth: %s -> %s: %zu tensors, %.3f GB in %d file%s\n",
                plan.p->name, dir, plan.n, (double)plan.total_bytes / 1e9, plan.nshards,
                plan.nshards == 1 ? "" : "s");
    if ((rc = mx_synth_write_config(&plan, dir, e)) || (rc = mx_synth_write_tokenizer(&plan, dir, e)))
        goto done;
    for (int k = 0; k < plan.nshards && rc == MX_OK; k++)
        rc = write_shard(&plan, k, dir, buf, cap, &pg, e);
    if (rc == MX_OK && plan.nshards > 1)
        rc = write_index(&plan, dir, e);
    if (rc == MX_OK && pg.on) {
        progress_show(&pg, 1);
        fprintf(stderr, "synth: wrote %s in %.1f s\n", dir, mx_now() - pg.t0);
    }
done:
    free(buf);
    mx_synth_plan_free(&plan);
    return rc;
}
