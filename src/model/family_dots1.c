/* family_dots1.c - dots.llm1 (Dots1ForCausalLM): DeepSeek-V3-style routing
 * (sigmoid scores, e_score_correction_bias for the choice only,
 * group-limited top-k, renormalised, times routed_scaling_factor), an
 * unquantized router, the first first_k_dense_replace layers dense,
 * ungated shared experts, per-head q/k norms.  mlx-lm stacks the routed
 * experts under `mlp.experts.*` (its SwitchGLU is called experts here). */
#include <cjson/cJSON.h>

#include "model/family.h"

static void defaults(mx_config *c)
{
    /* transformers' Dots1Config defaults */
    mx_default_int(&c->vocab_size, 152064);
    mx_default_int(&c->hidden_size, 4608);
    mx_default_int(&c->intermediate_size, 10944);
    mx_default_int(&c->moe_intermediate_size, 1408);
    mx_default_int(&c->num_hidden_layers, 62);
    mx_default_int(&c->num_attention_heads, 32);
    mx_default_int(&c->num_key_value_heads, 32);
    mx_default_int(&c->max_position_embeddings, 2048);
    mx_default_dbl(&c->rms_norm_eps, 1e-6);
    mx_default_dbl(&c->rope_theta, 10000.0);
    mx_default_int(&c->tie_word_embeddings, 0);
    mx_default_int(&c->norm_topk_prob, 0);
    mx_default_int(&c->decoder_sparse_step, 1);
    /* its layers are full attention unless layer_types says otherwise */
    mx_default_int(&c->use_sliding_window, 0);
}

static void synth_config(const mx_preset *p, cJSON *c)
{
    cJSON_AddNumberToObject(c, "n_routed_experts", p->experts);
    cJSON_AddNumberToObject(c, "moe_intermediate_size", p->moe_intermediate);
    cJSON_AddNumberToObject(c, "n_shared_experts",
                            p->moe_intermediate ? p->shared_intermediate / p->moe_intermediate : 0);
    cJSON_AddNumberToObject(c, "first_k_dense_replace", p->first_dense);
    cJSON_AddNumberToObject(c, "moe_layer_freq", 1);
    cJSON_AddNumberToObject(c, "n_group", p->n_group > 0 ? p->n_group : 1);
    cJSON_AddNumberToObject(c, "topk_group", p->topk_group > 0 ? p->topk_group : 1);
    cJSON_AddNumberToObject(c, "routed_scaling_factor", p->routed_scale > 0 ? p->routed_scale : 1.0);
    cJSON_AddBoolToObject(c, "norm_topk_prob", p->norm_topk_prob);
    cJSON_AddStringToObject(c, "scoring_func", "noaux_tc");
    cJSON_AddBoolToObject(c, "attention_bias", 0);
    cJSON_AddNullToObject(c, "sliding_window");
}

/* dots.llm1.inst's config.json (rednote-hilab): 142B parameters, 14B
 * active; and a miniature of the same layout for tests. */
static const mx_preset presets[] = {
    {
        .name = "dots.llm1", .about = "dots.llm1(.inst): 128 experts top-6 + 2 shared, sigmoid "
                                      "router with correction bias, dense layer 0",
        .vocab = 152064, .hidden = 4096, .intermediate = 10944, .layers = 62, .heads = 32,
        .kv_heads = 32, .head_dim = 128, .experts = 128, .top_k = 6, .moe_intermediate = 1408,
        .shared_intermediate = 2 * 1408, .rope_theta = 1e7, .rms_eps = 1e-5, .qkv_bias = 0,
        .norm_topk_prob = 1, .tied = 0, .max_position = 32768, .dtype = MX_BF16, .stacked = 1,
        .chatml_specials = 1, .qwen_tokenizer = 1, .first_dense = 1, .n_group = 1,
        .topk_group = 1, .routed_scale = 2.5,
    },
    {
        .name = "dots1-tiny", .about = "dots1 miniature: 16 experts in 4 groups (2 kept) top-4 + "
                                       "shared, dense layer 0 (tests)",
        .vocab = 1024, .hidden = 128, .intermediate = 256, .layers = 3, .heads = 4,
        .kv_heads = 2, .head_dim = 32, .experts = 16, .top_k = 4, .moe_intermediate = 64,
        .shared_intermediate = 64, .rope_theta = 1e4, .rms_eps = 1e-6, .qkv_bias = 0,
        .norm_topk_prob = 1, .tied = 0, .max_position = 4096, .dtype = MX_BF16, .stacked = 1,
        .chatml_specials = 1, .qwen_tokenizer = 1, .first_dense = 1, .n_group = 4,
        .topk_group = 2, .routed_scale = 2.5,
    },
    {0},
};

static const mx_config_alias aliases[] = {
    {"num_experts", "n_routed_experts"},
    {0},
};

const mx_family mx_family_dots1 = {
    .model_type = "dots1",
    .architecture = "Dots1ForCausalLM",
    .apply_defaults = defaults,
    .aliases = aliases,
    .names = {.stacked = "experts", .router_bias = "gate.e_score_correction_bias",
              .shared = "shared_experts"},
    .qk_norm = MX_QK_NORM_HEAD,
    .router = MX_ROUTER_SIGMOID,
    .router_norm_eps = 1e-20f,
    .shared_expert = MX_SHARED_PLAIN,
    .router_store = MX_ROUTER_FLOAT,
    .presets = presets,
    .synth_config = synth_config,
};
