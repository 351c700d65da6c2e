/* family_qwen3_vl_moe.c - the text path of Qwen3-VL-MoE
 * (Qwen3VLMoeForConditionalGeneration): the config nests the language
 * model under text_config, mlx-lm wraps qwen3_moe as `language_model`, so
 * every tensor is under language_model.model.* (lm_head under
 * language_model.lm_head); the layers are Qwen3-MoE's.  Text positions make
 * the interleaved MRoPE ordinary RoPE; images are not supported. */
#include <cjson/cJSON.h>

#include "model/family.h"

static void defaults(mx_config *c)
{
    /* transformers' Qwen3VLMoeTextConfig defaults */
    mx_default_int(&c->vocab_size, 151936);
    mx_default_int(&c->hidden_size, 2048);
    mx_default_int(&c->intermediate_size, 5632);
    mx_default_int(&c->num_hidden_layers, 24);
    mx_default_int(&c->num_attention_heads, 16);
    mx_default_int(&c->num_key_value_heads, 16);
    mx_default_int(&c->max_position_embeddings, 128000);
    mx_default_dbl(&c->rms_norm_eps, 1e-6);
    mx_default_dbl(&c->rope_theta, 5000000.0);
    mx_default_int(&c->tie_word_embeddings, 0);
    mx_default_int(&c->decoder_sparse_step, 1);
    mx_default_int(&c->moe_intermediate_size, 1408);
    mx_default_int(&c->num_experts_per_tok, 4);
    mx_default_int(&c->num_experts, 60);
    mx_default_int(&c->use_sliding_window, 0);
    mx_default_int(&c->shared_expert_intermediate_size, 0);
    /* transformers always renormalises the top-k weights here */
    c->norm_topk_prob = 1;
}

/* The real layout: the language model's keys under text_config (synth
 * wrote them at the top level; they move), the top level keeping the
 * architecture and its own tie_word_embeddings.  Images are not supported,
 * so no vision_config. */
static void synth_config(const mx_preset *p, cJSON *c)
{
    static const char *const text_keys[] = {
        "bos_token_id", "eos_token_id", "vocab_size", "hidden_size", "intermediate_size",
        "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
        "rms_norm_eps", "rope_theta", "hidden_act", "max_position_embeddings",
        "num_experts_per_tok",
    };
    cJSON *t = cJSON_AddObjectToObject(c, "text_config");
    for (size_t i = 0; i < sizeof text_keys / sizeof *text_keys; i++) {
        cJSON *v = cJSON_DetachItemFromObjectCaseSensitive(c, text_keys[i]);
        if (v)
            cJSON_AddItemToObject(t, text_keys[i], v);
    }
    cJSON_AddStringToObject(t, "model_type", "qwen3_vl_moe_text");
    cJSON_AddNumberToObject(t, "num_experts", p->experts);
    cJSON_AddNumberToObject(t, "moe_intermediate_size", p->moe_intermediate);
    cJSON_AddNumberToObject(t, "decoder_sparse_step", 1);
    cJSON_AddArrayToObject(t, "mlp_only_layers");
    cJSON_AddBoolToObject(t, "norm_topk_prob", 1);
    cJSON_AddBoolToObject(t, "attention_bias", 0);
    cJSON_AddBoolToObject(t, "tie_word_embeddings", p->tied);
    if (!cJSON_GetObjectItemCaseSensitive(t, "head_dim"))
        cJSON_AddNumberToObject(t, "head_dim", p->head_dim);
    /* interleaved MRoPE: with text positions, ordinary RoPE */
    cJSON *r = cJSON_AddObjectToObject(t, "rope_scaling");
    cJSON_AddStringToObject(r, "rope_type", "default");
    cJSON_AddBoolToObject(r, "mrope_interleaved", 1);
    cJSON *sec = cJSON_AddArrayToObject(r, "mrope_section");
    const int half = p->head_dim / 2;   /* [24, 20, 20] of 64 pairs for head_dim 128 */
    cJSON_AddItemToArray(sec, cJSON_CreateNumber(half - 2 * (half * 5 / 16)));
    cJSON_AddItemToArray(sec, cJSON_CreateNumber(half * 5 / 16));
    cJSON_AddItemToArray(sec, cJSON_CreateNumber(half * 5 / 16));
}

/* Qwen3-VL-30B-A3B-Instruct's text_config (Qwen): the Qwen3-30B-A3B
 * language model; and a miniature of the same layout for tests. */
static const mx_preset presets[] = {
    {
        .name = "qwen3-vl-30b-a3b", .about = "Qwen3-VL-30B-A3B(-Instruct), text path: 128 experts "
                                             "top-8, nested text_config, language_model.* names",
        .vocab = 151936, .hidden = 2048, .intermediate = 6144, .layers = 48, .heads = 32,
        .kv_heads = 4, .head_dim = 128, .experts = 128, .top_k = 8, .moe_intermediate = 768,
        .shared_intermediate = 0, .rope_theta = 5e6, .rms_eps = 1e-6, .qkv_bias = 0,
        .norm_topk_prob = 1, .tied = 0, .max_position = 262144, .dtype = MX_BF16, .stacked = 1,
        .chatml_specials = 1, .qwen_tokenizer = 1,
    },
    {
        .name = "qwen3-vl-moe-tiny", .about = "qwen3_vl_moe miniature: 16 experts top-4 (tests)",
        .vocab = 1024, .hidden = 128, .intermediate = 256, .layers = 3, .heads = 4,
        .kv_heads = 2, .head_dim = 64, .experts = 16, .top_k = 4, .moe_intermediate = 128,
        .shared_intermediate = 0, .rope_theta = 5e6, .rms_eps = 1e-6, .qkv_bias = 0,
        .norm_topk_prob = 1, .tied = 0, .max_position = 8192, .dtype = MX_BF16, .stacked = 1,
        .chatml_specials = 1, .qwen_tokenizer = 1,
    },
    {0},
};

static const mx_config_alias aliases[] = {
    {"num_experts", "num_local_experts"},
    {0},
};

const mx_family mx_family_qwen3_vl_moe = {
    .model_type = "qwen3_vl_moe",
    .architecture = "Qwen3VLMoeForConditionalGeneration",
    .apply_defaults = defaults,
    .aliases = aliases,
    .names = {.model = "language_model.model", .lm_head = "language_model.lm_head"},
    .qk_norm = MX_QK_NORM_HEAD,
    .router = MX_ROUTER_SOFTMAX_TOPK,
    .presets = presets,
    .synth_config = synth_config,
};
