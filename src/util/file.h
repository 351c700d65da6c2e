/* file.h - reading a whole (small) file: configs, tokenizer.json. */
#ifndef MX_FILE_H
#define MX_FILE_H

#include <stddef.h>

#include "util/err.h"

/* Reads a whole file into a NUL-terminated malloc'ed buffer (*len, when
 * not NULL, gets its length).  Errors name the path. */
int mx_read_file(const char *path, char **out, size_t *len, mx_err *e);

#endif
