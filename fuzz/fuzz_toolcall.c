/* fuzz_toolcall.c - libFuzzer entry: a model's reply (the input after its
 * first byte) split into content and tool calls.  The first byte picks the
 * format and how the reply arrives: whole, or in pieces of 1..16 bytes as
 * a stream sees it.  Both ways must give the same content and calls (a
 * stream never shows text that the whole reply does not), and every call
 * has a non-empty name and arguments. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "toolcall/toolcall.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int same_calls(const mx_tool_out *a, const mx_tool_out *b)
{
    if (a->n_calls != b->n_calls)
        return 0;
    for (int i = 0; i < a->n_calls; i++) {
        const mx_tool_call *x = &a->calls[i], *y = &b->calls[i];
        if (strcmp(x->name, y->name) || strcmp(x->arguments, y->arguments) || !x->id != !y->id ||
            (x->id && strcmp(x->id, y->id)) || !*x->name)
            return 0;
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    mx_tool_format f = data[0] & 1 ? MX_TOOLS_MISTRAL : MX_TOOLS_HERMES;
    size_t step = 1 + (data[0] >> 1) % 16;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    mx_tool_parser p;
    mx_tool_out whole = {0}, parts = {0};
    mx_tool_parser_init(&p, f);
    if (mx_tool_parse(&p, text, len, 1, &whole))
        goto out;
    mx_tool_parser_init(&p, f);
    for (size_t k = step; k < len; k += step)
        if (mx_tool_parse(&p, text, k, 0, &parts))
            goto out;
    if (mx_tool_parse(&p, text, len, 1, &parts))
        goto out;
    if (whole.len != parts.len || (whole.len && memcmp(whole.content, parts.content, whole.len)) ||
        !same_calls(&whole, &parts) || whole.len > len)
        abort();
out:
    mx_tool_out_free(&whole);
    mx_tool_out_free(&parts);
    return 0;
}
