/* cmd_inspect.c - `mlxcel inspect`: what a checkpoint holds and what running
 * it costs (weights, KV cache). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli/args.h"
#include "dist/dist.h"
#include "cli/commands.h"
#include "model/family.h"
#include "model/model.h"
#include "wcache/wcache.h"

static void help(FILE *f)
{
    fprintf(f, "usage: mlxcel inspect -m DIR [--ctx N] [--json] [--ranks N [--expert-map FILE]]\n\n"
               "Summarises a checkpoint: family, dimensions, the kind of each layer (dense, MoE, or\n"
               "both in parallel) and its attention (full or sliding window, head size, kv heads,\n"
               "K = V), the router (softmax top-k, sigmoid with choice bias and groups, sparsemixer,\n"
               "scaled input), norms, rotary embedding, expert layout, quantization per tensor\n"
               "class, parameter count, bytes on disk, and the memory needed for the weights and for\n"
               "the KV cache at N tokens (default 4096).  --json prints one JSON object on stdout.\n"
               "--ranks N prints how expert parallelism over N MPI ranks splits the routed experts\n"
               "(balanced by bytes, or as --expert-map FILE says) and each rank's weights\n"
               "(docs/distributed.md).\n");
}

/* ---- what a layer is ---------------------------------------------------- */

static const char *layer_kind(const mx_layer *L)
{
    return !L->is_moe ? "dense" : L->parallel ? "parallel" : "moe";
}

/* Layer l's attention in words: "sliding 1024, head_dim 256, 8 kv heads". */
static void attn_words(const mx_attn *a, char *buf, size_t cap)
{
    char win[32] = "full";
    if (a->window > 0)
        snprintf(win, sizeof win, "sliding %d", a->window);
    snprintf(buf, cap, "%s, head_dim %d, %d kv head%s%s", win, a->head_dim, a->n_kv,
             a->n_kv == 1 ? "" : "s", a->k_eq_v ? ", K = V" : "");
}

/* Layers whose description (by desc()) equals layer l's, as ranges
 * "0-3,5"; *done marks them listed. */
static void layer_ranges(const mx_model *m, int l0, char *done,
                         void (*desc)(const mx_model *, int, char *, size_t), char *buf,
                         size_t cap)
{
    char want[160], got[160];
    desc(m, l0, want, sizeof want);
    size_t o = 0;
    buf[0] = 0;
    for (int l = l0; l < m->n_layers && o < cap; l++) {
        desc(m, l, got, sizeof got);
        if (done[l] || strcmp(got, want))
            continue;
        int r = l;
        while (r + 1 < m->n_layers && !done[r + 1] && (desc(m, r + 1, got, sizeof got), !strcmp(got, want)))
            r++;
        for (int k = l; k <= r; k++)
            done[k] = 1;
        if (r > l)
            o += (size_t)snprintf(buf + o, cap - o, "%s%d-%d", o ? "," : "", l, r);
        else
            o += (size_t)snprintf(buf + o, cap - o, "%s%d", o ? "," : "", l);
        l = r;
    }
}

static void kind_desc(const mx_model *m, int l, char *buf, size_t cap)
{
    const char *k = layer_kind(&m->layers[l]);
    snprintf(buf, cap, "%s", !strcmp(k, "moe") ? "MoE" : !strcmp(k, "parallel")
                                                      ? "dense MLP + MoE in parallel" : "dense");
}

static const char *mixer_name(mx_mixer k)
{
    return k == MX_MIXER_DELTANET ? "deltanet" : k == MX_MIXER_SHORTCONV ? "shortconv" : "attention";
}

/* A layer's token mixer: its attention's geometry, or the recurrent kind. */
static void attn_desc(const mx_model *m, int l, char *buf, size_t cap)
{
    const mx_layer *L = &m->layers[l];
    if (L->mixer == MX_MIXER_ATTENTION)
        attn_words(&L->attn, buf, cap);
    else
        snprintf(buf, cap, "%s", L->mixer == MX_MIXER_DELTANET ? "gated DeltaNet" : "short convolution");
}

/* Prints "label: <desc> (layers a-b,c); <desc> (layers ...)" grouping the
 * layers by desc. */
static void print_grouped(const mx_model *m, const char *label,
                          void (*desc)(const mx_model *, int, char *, size_t))
{
    char *done = calloc((size_t)m->n_layers, 1);
    char ranges[512], d[160];
    int first = 1;
    printf("%-14s", label);
    for (int l = 0; done && l < m->n_layers; l++) {
        if (done[l])
            continue;
        desc(m, l, d, sizeof d);
        layer_ranges(m, l, done, desc, ranges, sizeof ranges);
        printf("%s%s (layers %s)", first ? "" : ";\n              ", d, ranges);
        first = 0;
    }
    printf("\n");
    free(done);
}

/* ---- router, norms, rope ------------------------------------------------ */

/* The routing rule of the model's MoE layers (the first one's: the rule is
 * the model's), NULL for a dense model. */
static const mx_moe_block *first_moe(const mx_model *m)
{
    for (int l = 0; l < m->n_layers; l++)
        if (m->layers[l].is_moe)
            return &m->layers[l].moe;
    return NULL;
}

static const char *router_kind_name(mx_router_kind k)
{
    return k == MX_ROUTER_SIGMOID ? "sigmoid" : k == MX_ROUTER_SPARSEMIXER ? "sparsemixer"
                                                                          : "softmax_topk";
}

static void router_words(const mx_moe_block *b, int n_experts, char *buf, size_t cap)
{
    const mx_router *r = &b->rule;
    size_t o = 0;
    if (r->kind == MX_ROUTER_SIGMOID)
        o += (size_t)snprintf(buf + o, cap - o, "sigmoid, top-%d of %d", r->k, n_experts);
    else if (r->kind == MX_ROUTER_SPARSEMIXER)
        o += (size_t)snprintf(buf + o, cap - o, "sparsemixer, top-%d of %d (jitter %g)", r->k,
                              n_experts, r->jitter);
    else
        o += (size_t)snprintf(buf + o, cap - o, "softmax, top-%d of %d", r->k, n_experts);
    if (b->router_in_scale && o < cap)
        o += (size_t)snprintf(buf + o, cap - o, ", scaled input rmsnorm(x)*scale/sqrt(d)");
    if (r->bias && o < cap)
        o += (size_t)snprintf(buf + o, cap - o, ", choice bias");
    if (r->kind == MX_ROUTER_SIGMOID && r->n_group > 1 && o < cap)
        o += (size_t)snprintf(buf + o, cap - o, ", %d groups (best %d kept)", r->n_group,
                              r->topk_group);
    if (r->norm_topk && r->kind != MX_ROUTER_SPARSEMIXER && o < cap)
        o += (size_t)snprintf(buf + o, cap - o, ", renormalised");
    if (r->kind == MX_ROUTER_SIGMOID && r->scale != 1.0f && o < cap)
        o += (size_t)snprintf(buf + o, cap - o, ", times %g", r->scale);
    if (r->expert_scale && o < cap)
        snprintf(buf + o, cap - o, ", per-expert scales");
}

static const char *qk_norm_name(mx_qk_norm k)
{
    return k == MX_QK_NORM_HEAD ? "per_head" : k == MX_QK_NORM_FULL ? "full_width" : "none";
}

/* Rope r's parameters in config.json: one entry per layer type when the
 * model has two ropes, else rope_parameters / rope_scaling (NULL: none). */
static const cJSON *rope_params(const mx_model *m, int r)
{
    const cJSON *rp = mx_config_key(&m->cfg, "rope_parameters");
    if (!cJSON_IsObject(rp))
        rp = mx_config_key(&m->cfg, "rope_scaling");
    if (!cJSON_IsObject(rp))
        return NULL;
    if (m->n_ropes > 1)
        return cJSON_GetObjectItemCaseSensitive(rp, r ? "full_attention" : "sliding_attention");
    return rp;
}

typedef struct rope_facts {
    const char *type;        /* default, longrope, proportional */
    double theta;
    int head_dim, dims;      /* dims: the pairs that turn, times 2 */
} rope_facts;

static void rope_get(const mx_model *m, int r, rope_facts *f)
{
    const mx_rope *ro = &m->ropes[r];
    const cJSON *rp = rope_params(m, r);
    const cJSON *tv = rp ? cJSON_GetObjectItemCaseSensitive(rp, "rope_type") : NULL;
    if (!cJSON_IsString(tv) && rp)
        tv = cJSON_GetObjectItemCaseSensitive(rp, "type");
    f->type = cJSON_IsString(tv) ? tv->valuestring : m->cfg.rope_type;
    const cJSON *th = rp ? cJSON_GetObjectItemCaseSensitive(rp, "rope_theta") : NULL;
    f->theta = cJSON_IsNumber(th) ? th->valuedouble : m->cfg.rope_theta;
    f->head_dim = m->head_dim;
    for (int l = 0; l < m->n_layers; l++)
        if (m->layers[l].mixer == MX_MIXER_ATTENTION && m->layers[l].attn.rope == r) {
            f->head_dim = m->layers[l].attn.head_dim;
            break;
        }
    f->dims = 0;
    for (int i = 0; i < ro->dims / 2; i++)
        f->dims += ro->inv_freq[i] != 0.0f ? 2 : 0;
}

static const char *rope_applies(const mx_model *m, int r)
{
    return m->n_ropes == 1 ? "all" : r ? "full_attention" : "sliding_attention";
}

/* The distinct quantizations seen in one class of tensors. */
typedef struct qkind {
    int bits, gs;
    mx_dtype dt;
    int quantized;
} qkind;

typedef struct qclass {
    const char *name;
    int n;
    qkind v[8];
    long count;
} qclass;

static void qadd(qclass *c, const mx_linear *l)
{
    c->count++;
    int bits = l->quantized ? l->q.bits : 0, gs = l->quantized ? l->q.group_size : 0;
    mx_dtype dt = l->quantized ? l->q.sdtype : l->wdtype;
    for (int i = 0; i < c->n; i++)
        if (c->v[i].bits == bits && c->v[i].gs == gs && c->v[i].dt == dt)
            return;
    if (c->n < 8)
        c->v[c->n++] = (qkind){bits, gs, dt, l->quantized};
}

enum { C_EMBED, C_ATTN, C_ROUTER, C_EXP_GATE, C_EXP_UP, C_EXP_DOWN, C_SHARED, C_SHARED_GATE,
       C_DENSE, C_LM_HEAD, C_COUNT };

static void describe(const qclass *c, char *buf, size_t cap)
{
    size_t o = 0;
    buf[0] = 0;
    for (int i = 0; i < c->n && o < cap; i++) {
        if (c->v[i].quantized)
            o += (size_t)snprintf(buf + o, cap - o, "%s%d-bit g%d %s scales", i ? ", " : "",
                                  c->v[i].bits, c->v[i].gs, mx_dtype_name(c->v[i].dt));
        else
            o += (size_t)snprintf(buf + o, cap - o, "%s%s (not quantized)", i ? ", " : "",
                                  mx_dtype_name(c->v[i].dt));
    }
}

/* One letter per layer for what mixes its tokens: A attention, D gated
 * DeltaNet, C short convolution. */
static const char *layer_pattern(const mx_model *m, char *buf)
{
    for (int l = 0; l < m->n_layers; l++)
        buf[l] = m->layers[l].mixer == MX_MIXER_DELTANET    ? 'D'
                 : m->layers[l].mixer == MX_MIXER_SHORTCONV ? 'C'
                                                            : 'A';
    buf[m->n_layers] = 0;
    return buf;
}

int cmd_inspect(int argc, char **argv)
{
    const char *dir = NULL;
    long ctx = 4096;
    int json = 0;
    long ranks = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            help(stdout);
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (!(dir = arg_value(argc, argv, &i)))
                return 2;
        } else if (!strcmp(a, "--ctx") || !strcmp(a, "--ctx-size")) {
            if (!(v = arg_value(argc, argv, &i)) || arg_long(a, v, 1, 1 << 24, &ctx))
                return 2;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "--ranks")) {
            if (!(v = arg_value(argc, argv, &i)) || arg_long(a, v, 1, 4096, &ranks))
                return 2;
        } else {
            return arg_unknown("inspect", a, help);
        }
    }
    if (!dir) {
        fprintf(stderr, "mlxcel inspect: -m DIR is required (see --help)\n");
        return 2;
    }
    mx_err e = {0};
    mx_model *m = NULL;
    /* inspect reports on the weight cache but never builds it */
    const mx_repack_mode repack = mx_repack_mode_get();
    mx_repack_mode_set("off");
    mx_wcache_info wc;
    if (mx_model_load(dir, &m, &e) || mx_model_wcache_probe(m, &wc, &e)) {
        fprintf(stderr, "mlxcel inspect: %s\n", e.msg);
        mx_model_free(m);
        return 1;
    }
    wc.mode = repack;
    /* --ranks N: the experts' split over N ranks (docs/distributed.md) */
    mx_dist_plan plan = {0};
    if (ranks && mx_dist_plan_make(m, (int)ranks, mx_dist_expert_map(), &plan, &e)) {
        fprintf(stderr, "mlxcel inspect: %s\n", e.msg);
        mx_model_free(m);
        return 1;
    }

    static const char *const names[C_COUNT] = {"embedding", "attention", "router", "experts.gate",
                                               "experts.up", "experts.down", "shared_expert",
                                               "shared_expert_gate", "dense_mlp", "lm_head"};
    qclass c[C_COUNT];
    memset(c, 0, sizeof c);
    for (int i = 0; i < C_COUNT; i++)
        c[i].name = names[i];
    qadd(&c[C_EMBED], &m->embed);
    if (!m->tied)
        qadd(&c[C_LM_HEAD], &m->lm_head);
    int n_moe = 0, stacked = -1;
    for (int l = 0; l < m->n_layers; l++) {
        const mx_layer *L = &m->layers[l];
        if (L->mixer == MX_MIXER_ATTENTION) {
            qadd(&c[C_ATTN], &L->attn.q), qadd(&c[C_ATTN], &L->attn.k);
            if (!L->attn.k_eq_v)   /* no v projection: v is the k projection */
                qadd(&c[C_ATTN], &L->attn.v);
            qadd(&c[C_ATTN], &L->attn.o);
        }
        if (!L->is_moe || L->parallel) {
            qadd(&c[C_DENSE], &L->mlp.gate), qadd(&c[C_DENSE], &L->mlp.up), qadd(&c[C_DENSE], &L->mlp.down);
            if (!L->is_moe)
                continue;
        }
        n_moe++;
        stacked = L->moe.experts.stacked;
        qadd(&c[C_ROUTER], &L->moe.router);
        for (int x = 0; x < L->moe.experts.n; x++) {
            qadd(&c[C_EXP_GATE], &L->moe.experts.gate[x]);
            qadd(&c[C_EXP_UP], &L->moe.experts.up[x]);
            qadd(&c[C_EXP_DOWN], &L->moe.experts.down[x]);
        }
        if (L->moe.has_shared) {
            qadd(&c[C_SHARED], &L->moe.shared.gate), qadd(&c[C_SHARED], &L->moe.shared.up);
            qadd(&c[C_SHARED], &L->moe.shared.down);
            if (L->moe.shared_gated)
                qadd(&c[C_SHARED_GATE], &L->moe.shared_gate);
        }
    }
    char layout[96];
    if (stacked < 0)
        snprintf(layout, sizeof layout, "none (dense)");
    else if (stacked)
        snprintf(layout, sizeof layout, "stacked (%s)", m->fam->names.stacked);
    else
        snprintf(layout, sizeof layout, "per-expert (%s)", m->fam->names.per_expert);
    uint64_t params = mx_model_param_count(m), wbytes = mx_model_weight_bytes(m),
             disk = mx_st_file_bytes(m->st), active = mx_model_active_bytes(m),
             kv = mx_model_kv_bytes(m, (int)ctx);
    const mx_config *cf = &m->cfg;

    if (json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "model_type", cf->model_type);
        cJSON_AddStringToObject(o, "family", m->fam->model_type);
        cJSON_AddStringToObject(o, "architecture", m->fam->architecture);
        cJSON_AddNumberToObject(o, "vocab_size", m->vocab);
        cJSON_AddNumberToObject(o, "hidden_size", m->d);
        cJSON_AddNumberToObject(o, "num_hidden_layers", m->n_layers);
        cJSON_AddNumberToObject(o, "num_attention_heads", m->n_heads);
        cJSON_AddNumberToObject(o, "num_key_value_heads", m->n_kv);
        cJSON_AddNumberToObject(o, "head_dim", m->head_dim);
        cJSON_AddNumberToObject(o, "num_experts", m->n_experts);
        cJSON_AddNumberToObject(o, "num_experts_per_tok", m->top_k);
        cJSON_AddNumberToObject(o, "moe_intermediate_size", cf->moe_intermediate_size);
        cJSON_AddNumberToObject(o, "shared_expert_intermediate_size",
                                cf->shared_expert_intermediate_size > 0 ? cf->shared_expert_intermediate_size : 0);
        cJSON_AddNumberToObject(o, "moe_layers", n_moe);
        char pattern[MX_MAX_LAYERS + 1];
        cJSON_AddStringToObject(o, "layer_mixers", layer_pattern(m, pattern));
        cJSON_AddNumberToObject(o, "recurrent_state_bytes", (double)(mx_model_state_floats(m) * sizeof(float)));
        cJSON_AddStringToObject(o, "expert_layout", stacked < 0 ? "none" : stacked ? "stacked" : "per-expert");
        cJSON_AddBoolToObject(o, "tie_word_embeddings", m->tied);
        cJSON_AddNumberToObject(o, "rope_theta", cf->rope_theta);
        cJSON_AddNumberToObject(o, "tensors", (double)mx_st_count(m->st));
        cJSON_AddNumberToObject(o, "files", (double)mx_st_nfiles(m->st));
        cJSON_AddNumberToObject(o, "parameters", (double)params);
        cJSON_AddNumberToObject(o, "bytes_on_disk", (double)disk);
        cJSON_AddNumberToObject(o, "weight_bytes", (double)wbytes);
        cJSON_AddNumberToObject(o, "active_weight_bytes_per_token", (double)active);
        cJSON_AddNumberToObject(o, "kv_cache_ctx", (double)ctx);
        cJSON_AddNumberToObject(o, "kv_cache_bytes", (double)kv);
        cJSON_AddBoolToObject(o, "qkv_bias", m->layers[0].attn.q.bias != NULL);
        cJSON_AddBoolToObject(o, "o_bias", m->layers[0].attn.o.bias != NULL);
        cJSON_AddBoolToObject(o, "lm_head_bias", !m->tied && m->lm_head.bias != NULL);
        cJSON_AddStringToObject(o, "norm", m->fam->norm == MX_NORM_LAYER ? "layernorm" : "rmsnorm");
        cJSON_AddStringToObject(o, "qk_norm", qk_norm_name(m->fam->qk_norm));
        cJSON_AddBoolToObject(o, "v_norm", m->fam->v_norm);
        cJSON_AddStringToObject(o, "activation", m->act == MX_ACT_GELU_TANH ? "gelu_tanh" : "silu");
        cJSON_AddNumberToObject(o, "embedding_scale", m->embed_scale);
        cJSON_AddNumberToObject(o, "final_logit_softcap", m->softcap);
        cJSON *ropes = cJSON_AddArrayToObject(o, "rope");
        for (int r = 0; r < m->n_ropes; r++) {
            rope_facts f;
            rope_get(m, r, &f);
            cJSON *x = cJSON_CreateObject();
            cJSON_AddStringToObject(x, "layers", rope_applies(m, r));
            cJSON_AddStringToObject(x, "type", f.type);
            cJSON_AddNumberToObject(x, "theta", f.theta);
            cJSON_AddNumberToObject(x, "head_dim", f.head_dim);
            cJSON_AddNumberToObject(x, "rotated_dims", f.dims);
            if (m->ropes[r].inv_freq_long) {
                cJSON_AddNumberToObject(x, "original_max_position_embeddings", m->ropes[r].orig_max);
                cJSON_AddNumberToObject(x, "short_mscale", m->ropes[r].mscale);
                cJSON_AddNumberToObject(x, "long_mscale", m->ropes[r].mscale_long);
            }
            cJSON_AddItemToArray(ropes, x);
        }
        const mx_moe_block *mb = first_moe(m);
        if (mb) {
            const mx_router *r = &mb->rule;
            cJSON *x = cJSON_AddObjectToObject(o, "router");
            cJSON_AddStringToObject(x, "kind", router_kind_name(r->kind));
            cJSON_AddNumberToObject(x, "top_k", r->k);
            cJSON_AddBoolToObject(x, "renormalize", r->norm_topk);
            cJSON_AddBoolToObject(x, "choice_bias", r->bias != NULL);
            cJSON_AddNumberToObject(x, "n_group", r->n_group);
            cJSON_AddNumberToObject(x, "topk_group", r->topk_group);
            cJSON_AddNumberToObject(x, "scaling_factor", r->kind == MX_ROUTER_SIGMOID ? r->scale : 1.0);
            if (r->kind == MX_ROUTER_SPARSEMIXER)
                cJSON_AddNumberToObject(x, "jitter", r->jitter);
            cJSON_AddBoolToObject(x, "input_scale", mb->router_in_scale != NULL);
            cJSON_AddBoolToObject(x, "expert_scale", r->expert_scale != NULL);
            cJSON_AddBoolToObject(x, "quantized", mb->router.quantized);
        }
        cJSON *layers = cJSON_AddArrayToObject(o, "layers");
        for (int l = 0; l < m->n_layers; l++) {
            const mx_attn *a = &m->layers[l].attn;
            cJSON *x = cJSON_CreateObject();
            cJSON_AddStringToObject(x, "kind", layer_kind(&m->layers[l]));
            cJSON_AddStringToObject(x, "mixer", mixer_name(m->layers[l].mixer));
            cJSON_AddItemToArray(layers, x);
            if (m->layers[l].mixer != MX_MIXER_ATTENTION)
                continue;
            cJSON_AddStringToObject(x, "attention", a->window > 0 ? "sliding" : "full");
            cJSON_AddNumberToObject(x, "window", a->window);
            cJSON_AddNumberToObject(x, "heads", a->n_heads);
            cJSON_AddNumberToObject(x, "kv_heads", a->n_kv);
            cJSON_AddNumberToObject(x, "head_dim", a->head_dim);
            cJSON_AddBoolToObject(x, "k_eq_v", a->k_eq_v);
            cJSON_AddNumberToObject(x, "rope", a->rope);
        }
        cJSON *q = cJSON_AddObjectToObject(o, "quantization");
        for (int i = 0; i < C_COUNT; i++) {
            if (!c[i].count)
                continue;
            cJSON *arr = cJSON_AddArrayToObject(q, c[i].name);
            for (int j = 0; j < c[i].n; j++) {
                cJSON *x = cJSON_CreateObject();
                cJSON_AddNumberToObject(x, "bits", c[i].v[j].bits);
                cJSON_AddNumberToObject(x, "group_size", c[i].v[j].gs);
                cJSON_AddStringToObject(x, "dtype", mx_dtype_name(c[i].v[j].dt));
                cJSON_AddItemToArray(arr, x);
            }
        }
        cJSON *wj = cJSON_AddObjectToObject(o, "weight_cache");
        cJSON_AddStringToObject(wj, "mode", mx_repack_mode_name(wc.mode));
        cJSON_AddStringToObject(wj, "path", wc.path);
        cJSON_AddBoolToObject(wj, "valid", wc.state == MX_WCACHE_VALID);
        cJSON_AddNumberToObject(wj, "bytes", (double)wc.file_bytes);
        cJSON_AddNumberToObject(wj, "matrices", (double)wc.n_mats);
        cJSON_AddStringToObject(wj, "reason", wc.state == MX_WCACHE_VALID ? "" : wc.reason);
        if (ranks) {
            cJSON *ep = cJSON_AddObjectToObject(o, "expert_parallelism");
            cJSON_AddNumberToObject(ep, "ranks", (double)ranks);
            cJSON_AddStringToObject(ep, "plan", plan.source);
            cJSON *rb = cJSON_AddArrayToObject(ep, "rank_weight_bytes");
            for (int r = 0; r < plan.n_ranks; r++)
                cJSON_AddItemToArray(rb, cJSON_CreateNumber((double)plan.bytes[r]));
            cJSON_AddNumberToObject(ep, "rank0_kv_bytes", (double)kv);
        }
        char *s = cJSON_Print(o);
        printf("%s\n", s);
        free(s);
        cJSON_Delete(o);
    } else {
        printf("model:        %s (%s)\n", dir, cf->model_type);
        printf("family:       %s (%s)\n", m->fam->model_type, m->fam->architecture);
        printf("dimensions:   hidden %d, vocab %d, head_dim %d\n", m->d, m->vocab, m->head_dim);
        printf("layers:       %d (%d MoE, %d dense)\n", m->n_layers, n_moe, m->n_layers - n_moe);
        char pattern[MX_MAX_LAYERS + 1];
        printf("mixers:       %s (A attention, D gated DeltaNet, C short convolution)\n",
               layer_pattern(m, pattern));
        print_grouped(m, "layer kinds:", kind_desc);
        printf("attention:    %d heads, %d kv heads%s%s%s%s%s%s\n", m->n_heads, m->n_kv,
               m->n_kv < m->n_heads ? " (GQA)" : "", m->layers[0].attn.q.bias ? ", q/k/v bias" : "",
               m->layers[0].attn.o.bias ? ", o bias" : "",
               m->fam->qk_norm == MX_QK_NORM_HEAD ? ", per-head q/k norm"
               : m->fam->qk_norm == MX_QK_NORM_FULL ? ", full-width q/k norm" : "",
               m->fam->v_norm ? ", v norm" : "", m->fam->attn_scale > 0 ? ", score scale 1" : "");
        print_grouped(m, "  mixers:", attn_desc);
        for (int r = 0; r < m->n_ropes; r++) {
            rope_facts f;
            rope_get(m, r, &f);
            printf("%-14s%s%s%s, theta %g, %d of %d dims rotated", r ? "" : "rope:",
                   m->n_ropes > 1 ? rope_applies(m, r) : "", m->n_ropes > 1 ? ": " : "", f.type,
                   f.theta, f.dims, f.head_dim);
            if (m->ropes[r].inv_freq_long)
                printf(", long factors past %d positions, mscale %g/%g", m->ropes[r].orig_max,
                       m->ropes[r].mscale, m->ropes[r].mscale_long);
            printf("\n");
        }
        printf("norm:         %s%s, %s gating%s\n",
               m->fam->norm == MX_NORM_LAYER ? "LayerNorm (weight and bias)" : "RMSNorm",
               m->fam->names.attn_out_norm ? ", block outputs normed" : "",
               m->act == MX_ACT_GELU_TANH ? "GELU-tanh" : "SiLU", m->embed_scale != 1.0f
               ? ", embeddings times sqrt(hidden)" : "");
        if (m->softcap > 0)
            printf("logits:       soft cap %g\n", m->softcap);
        if (n_moe) {
            char rw[256];
            router_words(first_moe(m), m->n_experts, rw, sizeof rw);
            printf("router:       %s%s\n", rw, first_moe(m)->router.quantized ? "" : " (not quantized)");
            printf("experts:      %d, top-%d%s, width %d%s\n", m->n_experts, m->top_k,
                   m->norm_topk ? " renormalised" : "", cf->moe_intermediate_size,
                   first_moe(m)->has_shared ? (first_moe(m)->shared_gated ? ", gated shared expert"
                                                                          : ", shared experts")
                                            : "");
        }
        printf("layout:       %s\n", layout);
        printf("embeddings:   %s%s\n", m->tied ? "tied (embedding used as lm_head)" : "separate lm_head",
               !m->tied && m->lm_head.bias ? " with bias" : "");
        printf("quantization:\n");
        for (int i = 0; i < C_COUNT; i++) {
            if (!c[i].count)
                continue;
            char buf[512];
            describe(&c[i], buf, sizeof buf);
            printf("  %-19s %s\n", c[i].name, buf);
        }
        printf("parameters:   %.3f M\n", (double)params / 1e6);
        printf("on disk:      %.1f MiB in %zu file(s), %zu tensors\n", (double)disk / 1048576.0,
               mx_st_nfiles(m->st), mx_st_count(m->st));
        printf("weights:      %.1f MiB (mmap'ed, not copied)\n", (double)wbytes / 1048576.0);
        printf("per token:    %.1f MiB of weights read by one decode step\n", (double)active / 1048576.0);
        printf("KV cache:     %.1f MiB at %ld tokens (f32)\n", (double)kv / 1048576.0, ctx);
        printf("total memory: %.1f MiB (weights + KV cache)\n", (double)(wbytes + kv) / 1048576.0);
        if (wc.state == MX_WCACHE_VALID)
            printf("weight cache: %s (%.1f MiB, %zu repacked matrices; --repack %s: %s)\n", wc.path,
                   (double)wc.file_bytes / 1048576.0, wc.n_mats, mx_repack_mode_name(wc.mode),
                   wc.mode == MX_REPACK_AUTO ? "used" : wc.mode == MX_REPACK_REBUILD ? "rebuilt" : "not used");
        else
            printf("weight cache: %s%s%s (--repack %s)\n", wc.path[0] ? wc.path : "none",
                   wc.reason[0] ? ": " : "", wc.reason, mx_repack_mode_name(wc.mode));
        if (ranks) {
            mx_dist_plan_print(&plan, stdout);
            printf("  rank 0 also holds the KV cache: %.1f MiB at %ld tokens\n", (double)kv / 1048576.0,
                   ctx);
        }
    }
    mx_dist_plan_free(&plan);
    mx_model_free(m);
    return 0;
}
