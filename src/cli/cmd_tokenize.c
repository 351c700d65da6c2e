/* cmd_tokenize.c - `mlxcel tokenize` (not implemented yet). */
#include <stdio.h>

#include "cli/commands.h"

int cmd_tokenize(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "mlxcel tokenize: not implemented yet\n");
    return 1;
}
