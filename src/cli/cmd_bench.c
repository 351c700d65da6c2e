/* cmd_bench.c - `mlxcel bench` (not implemented yet). */
#include <stdio.h>

#include "cli/commands.h"

int cmd_bench(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "mlxcel bench: not implemented yet\n");
    return 1;
}
