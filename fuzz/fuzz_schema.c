/* fuzz_schema.c - libFuzzer entry: a JSON Schema (response_format,
 * --json-schema, a tool's parameters) compiled to GBNF.  Any JSON must
 * compile or fail with a message; what compiles must be GBNF the parser
 * takes (the compiler's output is never an error), and the bytes after the
 * first NUL are run through the grammar with the mask checked at every
 * step.  Two schemas in one grammar (as forced tool calls build) too. */
#include "fuzz_util.h"

#include <cjson/cJSON.h>

#include "fuzz_grammar_util.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    return 0;
}

static void compiled(char *gbnf, const char *text, size_t nt)
{
    mx_grammar *g = NULL;
    mx_err e = {0};
    if (mx_grammar_parse(gbnf, strlen(gbnf), &g, &e)) {
        fprintf(stderr, "compiled schema does not parse: %s\n%s\n", e.msg, gbnf);
        abort();
    }
    fzg_walk(g, text, nt);
    mx_grammar_free(g);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *json, *text;
    size_t nt;
    if (fz_split(data, size, &json, &text, &nt))
        return 0;
    cJSON *schema = cJSON_Parse(json);
    if (schema) {
        char *gbnf = NULL;
        mx_err e = {0};
        if (mx_grammar_from_schema(schema, &gbnf, &e) == 0)
            compiled(gbnf, text, nt);
        else if (gbnf || !e.msg[0])
            abort();
        free(gbnf);
        /* the same schema twice under names, as a forced tool call's */
        const cJSON *two[2] = {schema, schema};
        const char *names[2] = {"call-a", "call-b"};
        gbnf = NULL;
        if (mx_grammar_from_schemas("root ::= call-a | call-b", 2, two, names, &gbnf, &e) == 0)
            compiled(gbnf, text, nt);
        free(gbnf);
        cJSON_Delete(schema);
    }
    free(json);
    free(text);
    return 0;
}
