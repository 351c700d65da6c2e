/* dist_int.h - what the files of src/dist share. */
#ifndef MX_DIST_INT_H
#define MX_DIST_INT_H

#include "util/err.h"

/* Takes --expert-map FILE / --expert-map=FILE out of argv (argv[0], the
 * program, stays); *map gets FILE. */
int mx_dist_take_options(int *argc, char **argv, const char **map, mx_err *e);

#endif
