/* cmd_detokenize.c - `mlxcel detokenize` (not implemented yet). */
#include <stdio.h>

#include "cli/commands.h"

int cmd_detokenize(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "mlxcel detokenize: not implemented yet\n");
    return 1;
}
