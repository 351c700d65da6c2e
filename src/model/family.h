/* family.h - model families as data plus small hooks.
 *
 * A family says how its config is defaulted and how its tensors are named;
 * the forward pass is shared.  Adding a family = one family_*.c file with an
 * mx_family definition + one row in the table in family.c. */
#ifndef MX_FAMILY_H
#define MX_FAMILY_H

#include "format/config.h"

typedef enum mx_qk_norm {
    MX_QK_NORM_NONE,
    MX_QK_NORM_HEAD,   /* Qwen3: RMSNorm over each head's head_dim */
    MX_QK_NORM_FULL,   /* OLMoE: RMSNorm over the whole q / k projection */
} mx_qk_norm;

struct mx_family {
    const char *model_type;
    /* Fills the fields config.json left unset with HF transformers' defaults
     * for this family. */
    void (*apply_defaults)(mx_config *c);
    mx_qk_norm qk_norm;
    const char *moe_block;        /* "mlp" or "block_sparse_moe" */
    const char *expert_proj[3];   /* per-expert names: gate, up, down */
    int shared_expert;            /* may have mlp.shared_expert (+ gate) */
};

/* The family for a model_type, or NULL. */
const struct mx_family *mx_family_find(const char *model_type);
/* "qwen2_moe, qwen3_moe, mixtral, olmoe" */
const char *mx_family_list(void);

/* Sets v to d when it is MX_UNSET (helpers for the defaults hooks). */
static inline void mx_default_int(int *v, int d) { if (*v == MX_UNSET) *v = d; }
static inline void mx_default_dbl(double *v, double d) { if (*v < 0) *v = d; }

#endif
