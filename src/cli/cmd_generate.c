/* cmd_generate.c - `mlxcel generate` (not implemented yet). */
#include <stdio.h>

#include "cli/commands.h"

int cmd_generate(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "mlxcel generate: not implemented yet\n");
    return 1;
}
