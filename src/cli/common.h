/* common.h - options shared by generate, chat and serve: model, context,
 * threads, sampling, stop strings. */
#ifndef MX_CLI_COMMON_H
#define MX_CLI_COMMON_H

#include <stdio.h>

#include "gen/gen.h"

#define CLI_MAX_STOPS 16

typedef struct cli_opts {
    const char *model;
    int ctx;                   /* 0: the default (see cli_ctx) */
    int max_tokens;            /* -1: until end of sequence (see cli_max_tokens) */
    int stats;
    mx_gen_opts gen;
    const char *stops[CLI_MAX_STOPS];
} cli_opts;

void cli_opts_init(cli_opts *o, float default_temp);
/* Consumes argv[*i] (and its value) when it is a shared option: returns 1,
 * 0 when it is not one, -1 after printing an error. */
int cli_common_option(int argc, char **argv, int *i, cli_opts *o);
/* --precision exact|fast: sets the kernels' precision; 0, or -1 after
 * printing an error naming the option. */
int cli_precision(const char *opt, const char *v);
/* --repack off|auto|rebuild|mem: the weight cache's mode (src/wcache); 0,
 * or -1 after printing an error naming the option. */
int cli_repack(const char *opt, const char *v);
/* One line on stderr: whether the weight cache was used, its path, size. */
void cli_wcache_stats(const mx_model *m);
/* Help text for the shared options. */
void cli_common_help(FILE *f);
/* Context size: the option (with a warning on stderr when it is above the
 * model's max_position_embeddings), else min(max_position_embeddings, 4096). */
int cli_ctx(const cli_opts *o, const mx_model *m);
/* --lookup with a model whose recurrent state cannot be rewound, or on a
 * backend device: a note on stderr, and lookup off. */
void cli_lookup_check(cli_opts *o, const mx_model *m);
/* Tokens to generate: -n, where -1 (llama.cpp's "until end of sequence")
 * becomes the whole context, which generation never runs past. */
int cli_max_tokens(const cli_opts *o, int n_ctx);

#endif
