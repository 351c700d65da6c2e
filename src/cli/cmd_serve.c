/* cmd_serve.c - `mlxcel serve` (not implemented yet). */
#include <stdio.h>

#include "cli/commands.h"

int cmd_serve(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "mlxcel serve: not implemented yet\n");
    return 1;
}
