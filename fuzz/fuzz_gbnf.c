/* fuzz_gbnf.c - libFuzzer entry: GBNF text (a client's `grammar` field)
 * must parse or fail with a message naming the problem; a grammar that
 * parses is then run over the bytes after the first NUL, where the
 * sampling mask must agree with acceptance at every step. */
#include "fuzz_util.h"

#include "fuzz_grammar_util.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *gbnf, *text;
    size_t nt;
    if (fz_split(data, size, &gbnf, &text, &nt))
        return 0;
    mx_grammar *g = NULL;
    mx_err e = {0};
    if (mx_grammar_parse(gbnf, strlen(gbnf), &g, &e) == 0) {
        fzg_walk(g, text, nt);
        mx_grammar_free(g);
    } else if (g || !e.msg[0]) {
        abort();
    }
    free(gbnf);
    free(text);
    return 0;
}
