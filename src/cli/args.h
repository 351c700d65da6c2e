/* args.h - small helpers the subcommands share for parsing their options. */
#ifndef MX_ARGS_H
#define MX_ARGS_H

#include <stdint.h>

/* Parses a whole decimal integer in [lo, hi]; prints an error naming the
 * option and returns -1 on failure. */
int arg_long(const char *opt, const char *s, long lo, long hi, long *out);
int arg_float(const char *opt, const char *s, double lo, double hi, float *out);
/* Parses "1,2,3" or "1 2 3" (commas and/or spaces) into a malloc'ed array. */
int arg_ids(const char *opt, const char *s, int32_t **ids, int *n);
/* The value of option argv[*i] (advancing *i), or NULL after an error. */
const char *arg_value(int argc, char **argv, int *i);

/* Prints peak resident set size (bytes) or 0 when unknown. */
long long peak_rss_bytes(void);

#endif
