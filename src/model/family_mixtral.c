/* family_mixtral.c - Mixtral (MixtralForCausalLM): router
 * block_sparse_moe.gate, experts w1 (gate) / w3 (up) / w2 (down), softmax
 * top-2 always renormalised, optional sliding window; the expert count is
 * num_local_experts in its config. */
#include <cjson/cJSON.h>

#include "model/family.h"

static void defaults(mx_config *c)
{
    /* transformers' MixtralConfig defaults */
    mx_default_int(&c->vocab_size, 32000);
    mx_default_int(&c->hidden_size, 4096);
    mx_default_int(&c->intermediate_size, 14336);
    mx_default_int(&c->num_hidden_layers, 32);
    mx_default_int(&c->num_attention_heads, 32);
    mx_default_int(&c->num_key_value_heads, 8);
    mx_default_int(&c->max_position_embeddings, 4096 * 32);
    mx_default_dbl(&c->rms_norm_eps, 1e-5);
    mx_default_dbl(&c->rope_theta, 1e6);
    mx_default_int(&c->tie_word_embeddings, 0);
    mx_default_int(&c->num_experts_per_tok, 2);
    mx_default_int(&c->num_experts, 8);
    /* Mixtral always renormalises the top-k weights. */
    c->norm_topk_prob = 1;
    c->moe_intermediate_size = c->intermediate_size;
    c->shared_expert_intermediate_size = 0;
    mx_default_int(&c->decoder_sparse_step, 1);
    mx_default_int(&c->sliding_window, 0);
}

static void synth_config(const mx_preset *p, cJSON *c)
{
    cJSON_AddNumberToObject(c, "num_local_experts", p->experts);
    cJSON_AddNullToObject(c, "sliding_window");
}

static const mx_config_alias aliases[] = {
    {"num_experts", "num_local_experts"},
    {0},
};

static const mx_preset presets[] = {
    {
        .name = "mixtral-8x7b", .about = "Mixtral-8x7B: 8 experts top-2",
        .vocab = 32000, .hidden = 4096, .intermediate = 14336, .layers = 32, .heads = 32,
        .kv_heads = 8, .head_dim = 128, .experts = 8, .top_k = 2, .moe_intermediate = 14336,
        .shared_intermediate = 0, .rope_theta = 1e6, .rms_eps = 1e-5, .qkv_bias = 0,
        .norm_topk_prob = 1, .tied = 0, .max_position = 32768, .dtype = MX_BF16, .stacked = 0,
        .chatml_specials = 0, .qwen_tokenizer = 0,
    },
    {0},
};

const mx_family mx_family_mixtral = {
    .model_type = "mixtral",
    .architecture = "MixtralForCausalLM",
    .apply_defaults = defaults,
    .aliases = aliases,
    .names = {.moe = "block_sparse_moe", .expert_proj = {"w1", "w3", "w2"}},
    .qk_norm = MX_QK_NORM_NONE,
    .router = MX_ROUTER_SOFTMAX_TOPK,
    .presets = presets,
    .synth_config = synth_config,
};
