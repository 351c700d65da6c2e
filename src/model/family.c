/* family.c - the table of supported model families. */
#include <string.h>

#include "model/family.h"

extern const struct mx_family mx_family_qwen2_moe, mx_family_qwen3_moe, mx_family_mixtral,
    mx_family_olmoe;

static const struct mx_family *const families[] = {
    &mx_family_qwen2_moe,
    &mx_family_qwen3_moe,
    &mx_family_mixtral,
    &mx_family_olmoe,
};

const struct mx_family *mx_family_find(const char *model_type)
{
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++)
        if (!strcmp(families[i]->model_type, model_type))
            return families[i];
    return NULL;
}

const char *mx_family_list(void) { return "qwen2_moe, qwen3_moe, mixtral, olmoe"; }
