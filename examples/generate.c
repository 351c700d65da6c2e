/* generate.c - greedy generation with libmlxcel.
 *   cc generate.c $(pkg-config --cflags --libs mlxcel) -o generate
 *   ./generate MODEL_DIR "Once upon a time" [MAX_TOKENS] [--ids]
 * prints the generated text (--ids: the token ids) on stdout. */
#include <mlxcel.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int on_token(void *ids_only, int32_t id, const char *text, size_t len)
{
    if (*(int *)ids_only && id >= 0)
        printf("%d\n", (int)id);
    else if (!*(int *)ids_only)
        fwrite(text, 1, len, stdout);
    fflush(stdout);
    return 0;                          /* nonzero would stop the generation */
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL_DIR PROMPT [MAX_TOKENS] [--ids]\n", argv[0]);
        return 2;
    }
    int ids_only = argc > 4 && !strcmp(argv[4], "--ids");
    mlxcel_model *model = NULL;
    mlxcel_context *ctx = NULL;
    int32_t *prompt = NULL;
    size_t n_prompt = 0;
    mlxcel_sampling sampling;
    mlxcel_sampling_init(&sampling);
    sampling.temperature = 0;          /* greedy */
    mlxcel_generate_options opts;
    mlxcel_generate_options_init(&opts);
    opts.max_tokens = argc > 3 ? atoi(argv[3]) : 64;
    int rc = mlxcel_model_load(argv[1], NULL, &model);
    if (!rc)
        rc = mlxcel_tokenize(model, argv[2], strlen(argv[2]), 1, &prompt, &n_prompt);
    if (!rc)
        rc = mlxcel_context_new(model, 0, &ctx);
    if (!rc)
        rc = mlxcel_context_set_sampling(ctx, &sampling);
    if (!rc)
        rc = mlxcel_generate(ctx, prompt, n_prompt, &opts, on_token, &ids_only, NULL);
    if (rc)
        fprintf(stderr, "generate: %s\n", mlxcel_last_error());
    else if (!ids_only)
        putchar('\n');
    mlxcel_free(prompt);
    mlxcel_context_free(ctx);
    mlxcel_model_free(model);
    return rc ? 1 : 0;
}
