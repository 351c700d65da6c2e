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
    cJSON_AddNumberToObject(c, "first_k_dense_replace", 1);
    cJSON_AddNumberToObject(c, "n_group", 1);
    cJSON_AddNumberToObject(c, "topk_group", 1);
    cJSON_AddNumberToObject(c, "routed_scaling_factor", 2.5);
    cJSON_AddBoolToObject(c, "norm_topk_prob", p->norm_topk_prob);
    cJSON_AddStringToObject(c, "scoring_func", "noaux_tc");
}

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
    .synth_config = synth_config,
};
