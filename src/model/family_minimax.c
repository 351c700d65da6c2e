/* family_minimax.c - MiniMax-M2 (MiniMaxM2ForCausalLM, model_type
 * minimax_m2): q/k RMSNorm over the whole projection before the head split,
 * rotary on the first rotary_dim values of each head, a sigmoid router
 * whose choice adds e_score_correction_bias, the chosen experts' unbiased
 * scores renormalised; experts as wide as intermediate_size. */
#include <cjson/cJSON.h>

#include "model/family.h"

static void defaults(mx_config *c)
{
    /* transformers' MiniMaxM2Config defaults */
    mx_default_int(&c->vocab_size, 200064);
    mx_default_int(&c->hidden_size, 3072);
    mx_default_int(&c->intermediate_size, 1536);
    mx_default_int(&c->num_hidden_layers, 62);
    mx_default_int(&c->num_attention_heads, 48);
    mx_default_int(&c->num_key_value_heads, 8);
    mx_default_int(&c->head_dim, 128);
    mx_default_int(&c->max_position_embeddings, 196608);
    mx_default_dbl(&c->rms_norm_eps, 1e-6);
    mx_default_dbl(&c->rope_theta, 5000000.0);
    mx_default_int(&c->tie_word_embeddings, 0);
    mx_default_int(&c->num_experts_per_tok, 8);
    mx_default_int(&c->num_experts, 256);
    mx_default_int(&c->decoder_sparse_step, 1);
    /* the chosen experts' scores are always renormalised */
    c->norm_topk_prob = 1;
    c->moe_intermediate_size = c->intermediate_size;
    c->shared_expert_intermediate_size = 0;
}

static void synth_config(const mx_preset *p, cJSON *c)
{
    const double partial = p->partial_rotary > 0 ? p->partial_rotary : 1.0;
    cJSON_AddNumberToObject(c, "num_local_experts", p->experts);
    cJSON_AddNumberToObject(c, "rotary_dim", (int)(p->head_dim * partial));
    cJSON_AddNumberToObject(c, "partial_rotary_factor", partial);
    cJSON_AddBoolToObject(c, "use_qk_norm", 1);
    cJSON_AddStringToObject(c, "qk_norm_type", "per_layer");
    cJSON_AddStringToObject(c, "scoring_func", "sigmoid");
    cJSON_AddBoolToObject(c, "use_routing_bias", 1);
    cJSON_AddNumberToObject(c, "shared_intermediate_size", 0);
    cJSON_AddNumberToObject(c, "router_jitter_noise", 0.0);
}

/* MiniMax-M2's config.json (MiniMaxAI): 230B parameters, 10B active; and a
 * miniature of the same layout for tests. */
static const mx_preset presets[] = {
    {
        .name = "minimax-m2", .about = "MiniMax-M2: 256 experts top-8, sigmoid router with "
                                       "correction bias, full-width q/k norm, half rotary",
        .vocab = 200064, .hidden = 3072, .intermediate = 1536, .layers = 62, .heads = 48,
        .kv_heads = 8, .head_dim = 128, .experts = 256, .top_k = 8, .moe_intermediate = 1536,
        .shared_intermediate = 0, .rope_theta = 5e6, .rms_eps = 1e-6, .qkv_bias = 0,
        .norm_topk_prob = 1, .tied = 0, .max_position = 196608, .dtype = MX_BF16, .stacked = 1,
        .chatml_specials = 1, .qwen_tokenizer = 0, .partial_rotary = 0.5,
    },
    {
        .name = "minimax-m2-tiny", .about = "minimax_m2 miniature: 16 experts top-4 (tests)",
        .vocab = 1024, .hidden = 128, .intermediate = 128, .layers = 3, .heads = 4,
        .kv_heads = 2, .head_dim = 64, .experts = 16, .top_k = 4, .moe_intermediate = 128,
        .shared_intermediate = 0, .rope_theta = 5e6, .rms_eps = 1e-6, .qkv_bias = 0,
        .norm_topk_prob = 1, .tied = 0, .max_position = 8192, .dtype = MX_BF16, .stacked = 1,
        .chatml_specials = 1, .qwen_tokenizer = 0, .partial_rotary = 0.5,
    },
    {0},
};

static const mx_config_alias aliases[] = {
    {"num_experts", "num_local_experts"},
    {0},
};

const mx_family mx_family_minimax = {
    .model_type = "minimax_m2",
    .architecture = "MiniMaxM2ForCausalLM",
    .apply_defaults = defaults,
    .aliases = aliases,
    .names = {.moe = "block_sparse_moe", .router_bias = "e_score_correction_bias"},
    .qk_norm = MX_QK_NORM_FULL,
    .router = MX_ROUTER_SIGMOID,
    .presets = presets,
    .synth_config = synth_config,
};
