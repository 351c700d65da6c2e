/* family_phimoe.c - Phi-3.5-MoE (PhimoeForCausalLM): LayerNorm with bias,
 * q/k/v/o and lm_head with bias, LongRoPE (short and long factors and
 * scales by sequence length), sparsemixer top-2 routing as transformers
 * computes it at inference (not mlx-lm's softmax over the top 2). */
#include <cjson/cJSON.h>

#include "model/family.h"

static void defaults(mx_config *c)
{
    /* transformers' PhimoeConfig defaults */
    mx_default_int(&c->vocab_size, 32064);
    mx_default_int(&c->hidden_size, 4096);
    mx_default_int(&c->intermediate_size, 6400);
    mx_default_int(&c->num_hidden_layers, 32);
    mx_default_int(&c->num_attention_heads, 32);
    mx_default_int(&c->num_key_value_heads, 8);
    mx_default_int(&c->max_position_embeddings, 4096 * 32);
    mx_default_dbl(&c->rms_norm_eps, 1e-5);
    mx_default_dbl(&c->rope_theta, 1e6);
    mx_default_int(&c->tie_word_embeddings, 0);
    mx_default_int(&c->num_experts_per_tok, 2);
    mx_default_int(&c->num_experts, 16);
    mx_default_int(&c->decoder_sparse_step, 1);
    c->norm_topk_prob = 0;
    c->moe_intermediate_size = c->intermediate_size;
    c->shared_expert_intermediate_size = 0;
}

/* LongRoPE's per-frequency factors: a ramp from 1 (the real model's start
 * 1.0, 1.04, ...) to `top`; the real tables are not reproduced, only their
 * shape (head_dim / 2 numbers) and the path they take. */
static cJSON *factors(int n, double top)
{
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber(1.0 + (top - 1.0) * i / (n > 1 ? n - 1 : 1)));
    return a;
}

static void synth_config(const mx_preset *p, cJSON *c)
{
    enum { ORIG_MAX = 4096 };
    cJSON_AddNumberToObject(c, "num_local_experts", p->experts);
    cJSON_AddNumberToObject(c, "router_jitter_noise", 0.01);
    cJSON_AddNumberToObject(c, "input_jitter_noise", 0.01);
    cJSON_AddBoolToObject(c, "attention_bias", p->o_bias);
    cJSON_AddBoolToObject(c, "lm_head_bias", p->lm_head_bias);
    cJSON_AddNullToObject(c, "sliding_window");
    cJSON_AddNumberToObject(c, "original_max_position_embeddings", ORIG_MAX);
    /* the scales Phi-3.5-MoE's config gives (not transformers' default
     * sqrt(1 + ln(max / orig) / ln(orig)), which would be 1.19) */
    const double mscale = 1.243163121016122;
    cJSON *r = cJSON_AddObjectToObject(c, "rope_scaling");
    cJSON_AddStringToObject(r, "type", "longrope");
    cJSON_AddItemToObject(r, "short_factor", factors(p->head_dim / 2, 1.6));
    cJSON_AddItemToObject(r, "long_factor", factors(p->head_dim / 2, 16.0));
    cJSON_AddNumberToObject(r, "short_mscale", mscale);
    cJSON_AddNumberToObject(r, "long_mscale", mscale);
    cJSON_AddNumberToObject(r, "original_max_position_embeddings", ORIG_MAX);
}

/* Phi-3.5-MoE-instruct's config.json (microsoft): 42B parameters, 6.6B
 * active; and a miniature of the same layout for tests. */
static const mx_preset presets[] = {
    {
        .name = "phi-3.5-moe", .about = "Phi-3.5-MoE(-instruct): 16 experts top-2 (sparsemixer), "
                                        "LayerNorm, biases, LongRoPE",
        .vocab = 32064, .hidden = 4096, .intermediate = 6400, .layers = 32, .heads = 32,
        .kv_heads = 8, .head_dim = 128, .experts = 16, .top_k = 2, .moe_intermediate = 6400,
        .shared_intermediate = 0, .rope_theta = 1e4, .rms_eps = 1e-5, .qkv_bias = 1,
        .o_bias = 1, .lm_head_bias = 1, .norm_topk_prob = 0, .tied = 0, .max_position = 131072,
        .dtype = MX_BF16, .stacked = 1, .chatml_specials = 0, .qwen_tokenizer = 0,
    },
    {
        .name = "phimoe-tiny", .about = "phimoe miniature: 8 experts top-2, LayerNorm, biases, "
                                        "LongRoPE (tests)",
        .vocab = 1024, .hidden = 128, .intermediate = 192, .layers = 3, .heads = 4,
        .kv_heads = 2, .head_dim = 32, .experts = 8, .top_k = 2, .moe_intermediate = 192,
        .shared_intermediate = 0, .rope_theta = 1e4, .rms_eps = 1e-5, .qkv_bias = 1,
        .o_bias = 1, .lm_head_bias = 1, .norm_topk_prob = 0, .tied = 0, .max_position = 131072,
        .dtype = MX_BF16, .stacked = 1, .chatml_specials = 0, .qwen_tokenizer = 0,
    },
    {0},
};

static const mx_config_alias aliases[] = {
    {"num_experts", "num_local_experts"},
    {0},
};

const mx_family mx_family_phimoe = {
    .model_type = "phimoe",
    .architecture = "PhimoeForCausalLM",
    .apply_defaults = defaults,
    .aliases = aliases,
    .names = {.moe = "block_sparse_moe"},
    .norm = MX_NORM_LAYER,
    .router = MX_ROUTER_SPARSEMIXER,
    .router_store = MX_ROUTER_DEFAULT_BITS,
    .presets = presets,
    .synth_config = synth_config,
};
