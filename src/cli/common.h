/* common.h - options shared by generate, chat and serve: model, context,
 * threads, sampling, stop strings. */
#ifndef MX_CLI_COMMON_H
#define MX_CLI_COMMON_H

#include "gen/gen.h"

#define CLI_MAX_STOPS 16

typedef struct cli_opts {
    const char *model;
    int ctx;                   /* 0: the default (see cli_ctx) */
    int max_tokens;
    int stats;
    mx_gen_opts gen;
    const char *stops[CLI_MAX_STOPS];
} cli_opts;

void cli_opts_init(cli_opts *o, float default_temp);
/* Consumes argv[*i] (and its value) when it is a shared option: returns 1,
 * 0 when it is not one, -1 after printing an error. */
int cli_common_option(int argc, char **argv, int *i, cli_opts *o);
/* Help text for the shared options. */
void cli_common_help(void);
/* Context size: the option, else min(max_position_embeddings, 4096). */
int cli_ctx(const cli_opts *o, const mx_model *m);

#endif
