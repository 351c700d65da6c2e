/* cmd_inspect.c - `mlxcel inspect`: what a checkpoint holds and what running
 * it costs (weights, KV cache). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "model/family.h"
#include "model/model.h"

static void help(FILE *f)
{
    fprintf(f, "usage: mlxcel inspect -m DIR [--ctx N] [--json]\n\n"
               "Summarises a checkpoint: family, dimensions, expert layout, quantization per tensor\n"
               "class, parameter count, bytes on disk, and the memory needed for the weights and for\n"
               "the KV cache at N tokens (default 4096).  --json prints one JSON object on stdout.\n");
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
    if (mx_model_load(dir, &m, &e)) {
        fprintf(stderr, "mlxcel inspect: %s\n", e.msg);
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
        qadd(&c[C_ATTN], &L->attn.q), qadd(&c[C_ATTN], &L->attn.k);
        qadd(&c[C_ATTN], &L->attn.v), qadd(&c[C_ATTN], &L->attn.o);
        if (!L->is_moe) {
            qadd(&c[C_DENSE], &L->mlp.gate), qadd(&c[C_DENSE], &L->mlp.up), qadd(&c[C_DENSE], &L->mlp.down);
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
            qadd(&c[C_SHARED], &L->moe.shared.down), qadd(&c[C_SHARED_GATE], &L->moe.shared_gate);
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
        char *s = cJSON_Print(o);
        printf("%s\n", s);
        free(s);
        cJSON_Delete(o);
    } else {
        printf("model:        %s (%s)\n", dir, cf->model_type);
        printf("dimensions:   hidden %d, vocab %d, head_dim %d\n", m->d, m->vocab, m->head_dim);
        printf("layers:       %d (%d MoE, %d dense)\n", m->n_layers, n_moe, m->n_layers - n_moe);
        char pattern[MX_MAX_LAYERS + 1];
        printf("mixers:       %s (A attention, D gated DeltaNet, C short convolution)\n",
               layer_pattern(m, pattern));
        printf("attention:    %d heads, %d kv heads%s, rope_theta %g%s\n", m->n_heads, m->n_kv,
               m->n_kv < m->n_heads ? " (GQA)" : "", cf->rope_theta,
               m->fam->qk_norm == MX_QK_NORM_HEAD ? ", per-head q/k norm"
               : m->fam->qk_norm == MX_QK_NORM_FULL ? ", full-width q/k norm" : "");
        if (n_moe)
            printf("experts:      %d, top-%d%s, width %d%s\n", m->n_experts, m->top_k,
                   m->norm_topk ? " renormalised" : "", cf->moe_intermediate_size,
                   cf->shared_expert_intermediate_size > 0 && m->fam->shared_expert ? ", shared expert" : "");
        printf("layout:       %s\n", layout);
        printf("embeddings:   %s\n", m->tied ? "tied (embedding used as lm_head)" : "separate lm_head");
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
    }
    mx_model_free(m);
    return 0;
}
