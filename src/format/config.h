/* config.h - config.json / generation_config.json of an MLX checkpoint.
 *
 * Parsing is generic: every field the supported families read is parsed here;
 * a field absent from the file is left at MX_UNSET, and the family's defaults
 * hook (src/model/family_*.c) fills in what HF transformers would use. */
#ifndef MX_CONFIG_H
#define MX_CONFIG_H

#include <stdint.h>

#include "util/err.h"

#define MX_UNSET (-1)
#define MX_MAX_LAYERS 256
#define MX_MAX_EOS 8

typedef struct mx_quant_override {
    char *module;              /* e.g. "model.layers.0.mlp.gate" */
    int bits, group_size;      /* bits 0 => module is not quantized ("false") */
} mx_quant_override;

typedef struct mx_quant_config {
    int present;               /* a quantization block was found */
    int bits, group_size;      /* defaults */
    mx_quant_override *overrides;
    int n_overrides;
} mx_quant_config;

typedef struct mx_config {
    char model_type[64];
    /* dimensions; MX_UNSET (-1) when absent from the file */
    int vocab_size, hidden_size, intermediate_size, num_hidden_layers;
    int num_attention_heads, num_key_value_heads, head_dim;
    int max_position_embeddings;
    double rms_norm_eps;       /* < 0 when absent */
    double rope_theta;         /* < 0 when absent; read from top level,
                                  rope_parameters or rope_scaling */
    char rope_type[32];        /* "default" when absent */
    int tie_word_embeddings;   /* MX_UNSET, 0 or 1 */
    int attention_bias;        /* MX_UNSET, 0 or 1 */
    double clip_qkv;           /* < 0 when absent or null */
    char hidden_act[32];       /* "" when absent */
    /* sliding window: -1 absent, 0 null/disabled, else size */
    int sliding_window, use_sliding_window, max_window_layers;
    /* MoE */
    int num_experts;           /* num_experts (a family may alias it) */
    int num_experts_per_tok, moe_intermediate_size;
    int shared_expert_intermediate_size;
    int decoder_sparse_step, norm_topk_prob;
    int n_mlp_only_layers;     /* MX_UNSET when absent */
    int mlp_only_layers[MX_MAX_LAYERS];
    /* token ids; eos from config.json and generation_config.json (merged) */
    int bos_token_id, pad_token_id;
    int n_eos;
    int eos_token_ids[MX_MAX_EOS];
    mx_quant_config quant;
    /* the parsed config.json, for the keys a family reads itself
     * (mx_config_apply_aliases); owned, freed by mx_config_free */
    struct cJSON *json;
    char path[256];
} mx_config;

/* Parses a config.json text.  `path` is used in messages. */
int mx_config_parse(const char *json, const char *path, mx_config *c, mx_err *e);
/* Reads DIR/config.json and, when present, DIR/generation_config.json. */
int mx_config_load(const char *dir, mx_config *c, mx_err *e);
/* Merges generation_config.json text (eos ids, bos) into c. */
int mx_config_parse_generation(const char *json, const char *path, mx_config *c, mx_err *e);
void mx_config_free(mx_config *c);

/* The value of a key a family reads itself (its own routing or rope
 * parameters), from text_config when the config nests one, else from the
 * top level; NULL when absent. */
const struct cJSON *mx_config_key(const mx_config *c, const char *key);
/* A number key's value, or dflt when absent, null or not a number. */
double mx_config_number(const mx_config *c, const char *key, double dflt);

/* A config key that a family's config.json spells differently. */
typedef struct mx_config_alias {
    const char *key, *alias;   /* e.g. {"num_experts", "num_local_experts"} */
} mx_config_alias;

/* For each alias (a list ended by {NULL, NULL}; NULL for none): when the
 * field of `key` was left unset and config.json has `alias`, reads it from
 * there with the checks `key` gets.  Only the integer and boolean fields
 * can be aliased (an unknown key is a programming error: MX_EINVAL). */
int mx_config_apply_aliases(mx_config *c, const mx_config_alias *aliases, mx_err *e);

/* The quantization for a module path ("model.layers.3.mlp.gate"):
 * the override when one names it, else the defaults.  Returns 1 if the module
 * is quantized (bits/group set), 0 if the config says it is not (a `false`
 * override, or no quantization block at all: bits and group are then 0).
 * Matching is exact (no prefix matching); overrides are kept sorted by
 * module for a binary search. */
int mx_quant_for(const mx_quant_config *q, const char *module, int *bits, int *group_size);

#endif
