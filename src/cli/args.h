/* args.h - small helpers the subcommands share for parsing their options:
 * numbers, token-id lists, option values, prompt text from a file or stdin,
 * and the "unknown option (did you mean ...?)" error. */
#ifndef MX_ARGS_H
#define MX_ARGS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Parses a whole decimal integer in [lo, hi]; prints an error naming the
 * option and returns -1 on failure. */
int arg_long(const char *opt, const char *s, long lo, long hi, long *out);
int arg_float(const char *opt, const char *s, double lo, double hi, float *out);
/* Parses "1,2,3" or "1 2 3" (commas and/or spaces) into a malloc'ed array. */
int arg_ids(const char *opt, const char *s, int32_t **ids, int *n);
/* The value of option argv[*i] (advancing *i), or NULL after an error. */
const char *arg_value(int argc, char **argv, int *i);

/* Reads the whole of `path` ("-" = stdin) into a malloc'ed, NUL-terminated
 * string, dropping one trailing newline (editors and echo add one).  Prints
 * an error naming `opt` and the file and returns NULL on failure, including
 * a file with a NUL byte in it. */
char *arg_read_text(const char *opt, const char *path);

/* The candidate closest to `word` (edit distance, transpositions counting
 * one) when it is close enough to be a likely typo, else NULL. */
const char *arg_closest(const char *word, const char *const *cands, size_t n);

/* Reports an argument that command `cmd` does not take, as one line on
 * stderr, suggesting the closest option that `help` prints (the help text is
 * the list of options, so a new option is suggested as soon as it is
 * documented).  Returns 2, the usage-error exit status. */
int arg_unknown(const char *cmd, const char *arg, void (*help)(FILE *));

#endif
