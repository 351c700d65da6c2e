/* fuzz_config.c - libFuzzer entry: config.json text (and the same text as a
 * generation_config.json merged on top) must parse or fail cleanly. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "format/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = 0;
    mx_config c;
    mx_err e;
    if (mx_config_parse(text, "fuzz/config.json", &c, &e) == 0) {
        int bits, gs;
        for (int i = 0; i < c.quant.n_overrides; i++)
            mx_quant_for(&c.quant, c.quant.overrides[i].module, &bits, &gs);
        mx_quant_for(&c.quant, "model.layers.0.mlp.gate", &bits, &gs);
        mx_config_parse_generation(text, "fuzz/generation_config.json", &c, &e);
        if (c.n_eos < 0 || c.n_eos > MX_MAX_EOS)
            abort();
    } else if (c.quant.overrides || c.quant.n_overrides) {
        abort();   /* a failed parse must leave nothing allocated */
    }
    mx_config_free(&c);
    free(text);
    return 0;
}
