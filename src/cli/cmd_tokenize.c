/* cmd_tokenize.c - `mlxcel tokenize` and `mlxcel detokenize`: the
 * checkpoint's tokenizer.json on the command line.  Special tokens are left
 * as they are in both directions. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "tokenizer/tokenizer.h"

static int load(const char *dir, mx_tokenizer **t)
{
    mx_err e = {0};
    if (mx_tok_load_dir(dir, t, &e)) {
        fprintf(stderr, "mlxcel: %s\n", e.msg);
        return 1;
    }
    return 0;
}

static void tokenize_help(FILE *f)
{
    fprintf(f, "usage: mlxcel tokenize -m DIR (-p TEXT | -f FILE)\n\n"
               "Prints the token ids of TEXT on one line, space separated.  Special tokens\n"
               "written in the text (e.g. <|im_start|>) are recognised; no BOS/EOS is added.\n\n"
               "  -m, --model DIR     checkpoint folder with tokenizer.json\n"
               "  -p, --prompt TEXT   the text (-p - reads it from stdin)\n"
               "  -f, --file FILE     the text from FILE (one trailing newline dropped)\n");
}

static void detokenize_help(FILE *f)
{
    fprintf(f, "usage: mlxcel detokenize -m DIR --ids IDS\n\n"
               "Prints the text of the token ids (comma or space separated) exactly, with no\n"
               "newline added; special tokens are printed as they are.\n\n"
               "  -m, --model DIR     checkpoint folder with tokenizer.json\n"
               "      --ids IDS       token ids, comma or space separated\n");
}

int cmd_tokenize(int argc, char **argv)
{
    const char *dir = NULL, *text = NULL, *file = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            tokenize_help(stdout);
            return 0;
        } else if (!strcmp(argv[i], "-m") || !strcmp(argv[i], "--model")) {
            if (!(dir = arg_value(argc, argv, &i)))
                return 2;
        } else if (!strcmp(argv[i], "-p") || !strcmp(argv[i], "--prompt")) {
            if (!(text = arg_value(argc, argv, &i)))
                return 2;
        } else if (!strcmp(argv[i], "-f") || !strcmp(argv[i], "--file")) {
            if (!(file = arg_value(argc, argv, &i)))
                return 2;
        } else {
            return arg_unknown("tokenize", argv[i], tokenize_help);
        }
    }
    if (!dir || !!text + !!file != 1) {
        fprintf(stderr, "mlxcel tokenize: -m DIR and one of -p TEXT, -f FILE are required (see --help)\n");
        return 2;
    }
    char *read_text = NULL;
    if (file || !strcmp(text, "-")) {
        if (!(read_text = arg_read_text(file ? "-f" : "-p", file ? file : "-")))
            return 2;
        text = read_text;
    }
    mx_tokenizer *t = NULL;
    if (load(dir, &t)) {
        free(read_text);
        return 1;
    }
    mx_err e = {0};
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = mx_tok_encode(t, text, strlen(text), 1, &ids, &n, &e);
    if (rc) {
        fprintf(stderr, "mlxcel tokenize: %s\n", e.msg);
    } else {
        for (size_t i = 0; i < n; i++)
            printf(i ? " %d" : "%d", ids[i]);
        printf("\n");
    }
    free(ids);
    free(read_text);
    mx_tok_free(t);
    return rc ? 1 : 0;
}

int cmd_detokenize(int argc, char **argv)
{
    const char *dir = NULL, *list = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            detokenize_help(stdout);
            return 0;
        } else if (!strcmp(argv[i], "-m") || !strcmp(argv[i], "--model")) {
            if (!(dir = arg_value(argc, argv, &i)))
                return 2;
        } else if (!strcmp(argv[i], "--ids")) {
            if (!(list = arg_value(argc, argv, &i)))
                return 2;
        } else {
            return arg_unknown("detokenize", argv[i], detokenize_help);
        }
    }
    if (!dir || !list) {
        fprintf(stderr, "mlxcel detokenize: -m DIR and --ids IDS are required (see --help)\n");
        return 2;
    }
    int32_t *ids = NULL;
    int n = 0;
    if (arg_ids("--ids", list, &ids, &n))
        return 2;
    mx_tokenizer *t = NULL;
    if (load(dir, &t)) {
        free(ids);
        return 1;
    }
    mx_err e = {0};
    char *text = NULL;
    size_t len = 0;
    int rc = mx_tok_decode(t, ids, (size_t)n, 0, &text, &len, &e);
    if (rc)
        fprintf(stderr, "mlxcel detokenize: %s\n", e.msg);
    else
        fwrite(text, 1, len, stdout);
    free(text);
    free(ids);
    mx_tok_free(t);
    return rc ? 1 : 0;
}
