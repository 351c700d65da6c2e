/* cmd_inspect.c - `mlxcel inspect` (not implemented yet). */
#include <stdio.h>

#include "cli/commands.h"

int cmd_inspect(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "mlxcel inspect: not implemented yet\n");
    return 1;
}
