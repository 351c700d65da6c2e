/* family.c - the table of supported model families and the default
 * tensor names. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "model/family.h"

extern const mx_family mx_family_qwen2_moe, mx_family_qwen3_moe, mx_family_mixtral,
    mx_family_olmoe, mx_family_dots1, mx_family_phimoe, mx_family_qwen3_vl_moe,
    mx_family_minimax, mx_family_gemma4_text, mx_family_gemma4, mx_family_qwen3_next,
    mx_family_lfm2_moe;

/* The table: one row per family. */
static const mx_family *const table[] = {
    &mx_family_qwen2_moe,
    &mx_family_qwen3_moe,
    &mx_family_mixtral,
    &mx_family_olmoe,
    &mx_family_dots1,
    &mx_family_phimoe,
    &mx_family_qwen3_vl_moe,
    &mx_family_minimax,
    &mx_family_gemma4_text,
    &mx_family_gemma4,
    &mx_family_qwen3_next,
    &mx_family_lfm2_moe,
};
#define N_FAMILIES (int)(sizeof table / sizeof table[0])

/* The names of transformers' Llama-style models, which every family starts
 * from. */
static const mx_names default_names = {
    .model = "model",
    .embed = "embed_tokens",
    .final_norm = "norm",
    .lm_head = "lm_head",
    .layer = "layers.%d",
    .attn_norm = "input_layernorm",
    .ffn_norm = "post_attention_layernorm",
    .attn = "self_attn",
    .attn_proj = {"q_proj", "k_proj", "v_proj", "o_proj"},
    .qk_norm = {"q_norm", "k_norm"},
    .mlp = "mlp",
    .moe = "mlp",
    .router = "gate",
    .stacked = "switch_mlp",
    .stacked_proj = {"gate_proj", "up_proj", "down_proj"},
    .per_expert = "experts.%d",
    .expert_proj = {"gate_proj", "up_proj", "down_proj"},
    .mlp_proj = {"gate_proj", "up_proj", "down_proj"},
    .shared = "shared_expert",
    .shared_gate = "shared_expert_gate",
    .deltanet = "linear_attn",
    .dn_qkvz = "in_proj_qkvz",
    .dn_ba = "in_proj_ba",
    .dn_conv = "conv1d",
    .dn_a_log = "A_log",
    .dn_dt_bias = "dt_bias",
    .dn_norm = "norm",
    .dn_out = "out_proj",
    .shortconv = "conv",
    .sc_in = "in_proj",
    .sc_conv = "conv",
    .sc_out = "out_proj",
};

/* The table's rows with every NULL name replaced by its default, made once. */
static mx_family resolved[N_FAMILIES];
static pthread_once_t resolve_once = PTHREAD_ONCE_INIT;

static void resolve(void)
{
    /* mx_names is nothing but string pointers: walk it as an array */
    _Static_assert(sizeof(mx_names) % sizeof(const char *) == 0, "mx_names holds only strings");
    const size_t n = sizeof(mx_names) / sizeof(const char *);
    for (int i = 0; i < N_FAMILIES; i++) {
        resolved[i] = *table[i];
        const char **dst = (const char **)(void *)&resolved[i].names;
        const char *const *dflt = (const char *const *)(const void *)&default_names;
        for (size_t k = 0; k < n; k++)
            if (!dst[k])
                dst[k] = dflt[k];
    }
}

const mx_family *mx_family_at(int i)
{
    pthread_once(&resolve_once, resolve);
    return i >= 0 && i < N_FAMILIES ? &resolved[i] : NULL;
}

const mx_family *mx_family_find(const char *model_type)
{
    for (int i = 0; model_type && i < N_FAMILIES; i++)
        if (!strcmp(table[i]->model_type, model_type))
            return mx_family_at(i);
    return NULL;
}

static char type_list[256];
static pthread_once_t list_once = PTHREAD_ONCE_INIT;

static void make_list(void)
{
    size_t o = 0;
    for (int i = 0; i < N_FAMILIES && o < sizeof type_list; i++)
        o += (size_t)snprintf(type_list + o, sizeof type_list - o, "%s%s", i ? ", " : "",
                              table[i]->model_type);
}

const char *mx_family_list(void)
{
    pthread_once(&list_once, make_list);
    return type_list;
}

const mx_preset *mx_preset_find(const char *name, const mx_family **fam)
{
    for (int i = 0; name && i < N_FAMILIES; i++)
        for (const mx_preset *p = table[i]->presets; p && p->name; p++)
            if (!strcmp(p->name, name)) {
                if (fam)
                    *fam = mx_family_at(i);
                return p;
            }
    return NULL;
}
